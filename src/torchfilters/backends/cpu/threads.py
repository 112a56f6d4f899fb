"""The thread pool: a call's work items run on the calling thread plus a small pool.
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from .. import _tiered


_pool = None
_pool_pid = None
_pool_lock = threading.Lock()
#: ``busy``: this thread is inside a parallel launch (its pool's locks may be held)
_local = threading.local()


def _threads():
    """Worker threads for a call: ``torch.get_num_threads()``."""
    n = torch.get_num_threads()
    return n if n > 1 else 1


def _get_pool(n):
    global _pool, _pool_pid
    pid = os.getpid()
    pool = _pool
    if pool is None or _pool_pid != pid or pool._max_workers < n - 1:
        with _pool_lock:
            if _pool is None or _pool_pid != pid or _pool._max_workers < n - 1:
                # a fresh pool after fork (threads do not survive it) or a larger thread count
                _pool = ThreadPoolExecutor(max(n - 1, 1), thread_name_prefix="torchfilters-cpu")
                _pool_pid = pid
            pool = _pool
    return pool




def _launch(fn, args, nitems, nthreads, serial, runs=None):
    """Run ``fn(*args, it0, it1)`` over the work items.  ``runs``: a list to which a launch in
    the calling thread alone appends ``(fn, args[2:], nitems)`` (a replay's record: the first
    two arguments are the input's and the output's addresses).

    The kernels release the GIL (``nogil``), so a call is split into chunks run
    by ``nthreads`` threads -- the caller plus a small pool -- pulling chunks
    from a shared counter (a core busy elsewhere slows its thread, not the call).
    This replaces numba's ``parallel=True``: its parfor wrapper re-optimises the
    whole inlined kernel and tripled the first-call compile time."""
    if serial or nthreads == 1 or nitems == 1 or _tiered.in_background():
        fn(*args, 0, nitems)
        if runs is not None:
            runs.append((fn, args[2:], nitems))
        return
    if _tiered.in_foreground():  # an auto call, which must not compile (``_tiered``)
        _tiered.check_ready(fn, args + (0, 0))
    if getattr(_local, "busy", False):
        # a call made inside this thread's own launch -- a signal handler or a finalizer run
        # between two of its bytecodes, maybe inside the pool's ``submit`` with its lock held:
        # it runs in this thread alone (it waited for that lock forever: found by review)
        fn(*args, 0, nitems)
        return
    _local.busy = True
    try:
        _launch_parallel(fn, args, nitems, nthreads)
    finally:
        _local.busy = False


def _launch_parallel(fn, args, nitems, nthreads):
    nchunks = min(nitems, 4 * nthreads)
    counter = itertools.count()

    def work():
        c = next(counter)
        while c < nchunks:
            fn(*args, c * nitems // nchunks, (c + 1) * nitems // nchunks)
            c = next(counter)

    futures = []
    try:
        pool = _get_pool(nthreads)
        for _ in range(min(nthreads, nchunks) - 1):
            futures.append(pool.submit(work))
    except RuntimeError:
        # interpreter shutdown (an atexit handler, a non-daemon thread after the main thread
        # returned): the pool takes no new work; the calling thread does what is left
        pass
    try:
        work()
    finally:
        for f in futures:
            f.result()
