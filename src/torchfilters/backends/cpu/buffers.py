"""The output-buffer cache: large fresh CPU outputs come from reusable NumPy buffers.

Parallelism: the kernels release the GIL; a call is split into chunks that
``torch.get_num_threads()`` threads (the caller and a small pool) pull from a
shared counter.  (numba's ``parallel=True`` was measured: its parfor wrapper
re-optimises the whole inlined kernel and tripled the first compile.)  Tiny
calls run in the calling thread.  Each item prefetches the next one's input.
Fresh outputs of at least 1 MiB come from a small cache of NumPy buffers
(``empty_cache``): a buffer no tensor uses any more is handed to the next output
it fits, its pages already mapped (faulting in 400 MB costs ~80 ms here, more
than the filter); new ones are NumPy allocations, which advise transparent huge
pages.  They are wrapped with ``torch.from_numpy``.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import weakref

import numpy as np
import torch

from .prims import _NP_STORAGE

#: fresh outputs of at least this many bytes are allocated by NumPy (huge pages)
#: the device of every output made here (not the default device: ``torch.set_default_device``)
_CPU = torch.device("cpu")
_NP_ALLOC = 1 << 20


@functools.lru_cache(maxsize=None)
def _memory_bytes():
    """Physical memory, or the cgroup's limit when lower (containers)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        total = 4 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                total = min(total, int(f.read().strip()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    return total


def _cache_limit():
    """Bytes the output cache may hold, buffers in use included: ``TORCHFILTERS_CPU_CACHE_MB``
    (unset or empty: a quarter of the memory, at most 2 GiB; ``inf``: no limit)."""
    env = os.environ.get("TORCHFILTERS_CPU_CACHE_MB", "").strip()
    if not env:
        return min(_memory_bytes() // 4, 2 << 30)
    try:
        mb = float(env)
    except ValueError:
        mb = math.nan
    if math.isnan(mb):
        raise ValueError(f"TORCHFILTERS_CPU_CACHE_MB must be a number of megabytes (0 turns the output cache off); "
                         f"got {env!r}")
    if mb <= 0:
        return 0
    return sys.maxsize if mb == math.inf else int(min(mb, 2.0**43) * (1 << 20))


# The output cache.  Buffers handed out are tracked by a finalizer on the NumPy array the
# output tensor wraps: when the tensor (and every view of it) is gone, the buffer comes back
# to ``_free_bufs`` (most recently released last) for the next output it fits.
_free_bufs: list = []
_in_use = 0  # bytes of the cached buffers that outputs still use
_limit = 0  # the limit of the latest allocation (releases trim to it)
#: free buffers kept at most (varying sizes must not pile up dead buffers)
_MAX_FREE = 4
_cache_lock = threading.RLock()  # re-entrant: a finalizer may run inside an allocation
#: ``busy``: this thread is choosing a buffer.  A call re-entering then -- a finalizer run by the
#: garbage collector, a signal handler's op, between two bytecodes -- leaves the free list alone
#: (it could take the buffer being chosen: found by review)
_tls = threading.local()


def _after_fork():  # pragma: no cover - runs in a forked child
    global _cache_lock
    _cache_lock = threading.RLock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def empty_cache() -> int:
    """Release the CPU output cache's free buffers; returns the bytes released.

    Fresh CPU outputs of at least 1 MiB come from a cache of reusable buffers, as PyTorch's
    caching allocator does on CUDA: when an output tensor and all its views are gone, its
    buffer is kept and handed to the next output it fits (between half its size and its
    size), whose pages are then already mapped instead of page-faulting a new allocation.  Per
    process the cache holds at most ``TORCHFILTERS_CPU_CACHE_MB`` megabytes, buffers in use
    included (default: a quarter of the memory -- the cgroup's limit in a container -- and at
    most 2 GiB; ``0`` turns it off), and at most four free buffers.  Buffers in use are not
    affected.  GPU memory is torch's business (``torch.cuda.empty_cache``).
    """
    with _cache_lock:
        return _trim(0)


def _trim(limit):
    """Drop free buffers, least recently released first, while more than ``_MAX_FREE`` are free
    or the cache holds more than ``limit`` bytes; returns the bytes dropped."""
    dropped = 0
    while _free_bufs and (len(_free_bufs) > _MAX_FREE or _in_use + sum(b.nbytes for b in _free_bufs) > limit):
        dropped += _free_bufs.pop(0).nbytes
    return dropped


def _release(buf):
    """Finalizer of an output's NumPy array: its buffer is free again."""
    global _in_use
    with _cache_lock:
        _in_use -= buf.nbytes
        if getattr(_tls, "busy", False):
            return  # (re-entered: the buffer is dropped, not listed)
        _free_bufs.append(buf)
        if len(_free_bufs) > _MAX_FREE or _limit == 0:
            _trim(_limit)


def _cached_buffer(nbytes):
    """(uint8 buffer of at least ``nbytes`` bytes, owned by the cache?): a free cached buffer,
    else a new one (cached if the limit allows)."""
    limit = _cache_limit()
    with _cache_lock:
        if getattr(_tls, "busy", False):
            return np.empty(nbytes, np.uint8), False  # (re-entered: not from the cache)
        _tls.busy = True
        try:
            return _choose(nbytes, limit)
        finally:
            _tls.busy = False


def _choose(nbytes, limit):
    """:func:`_cached_buffer`'s choice, under the lock."""
    global _in_use, _limit
    _limit = limit
    _trim(limit)  # the limit may have been lowered since the buffers were cached
    best = None
    for b in reversed(_free_bufs):  # the smallest free buffer that fits without wasting half
        if nbytes <= b.nbytes <= 2 * nbytes and (best is None or b.nbytes < best.nbytes):
            best = b  # of itself; of equal ones, the most recently released (warmest)
    if best is not None:
        del _free_bufs[next(k for k, b in enumerate(_free_bufs) if b is best)]
    else:
        _trim(limit - nbytes)  # make room
        if _in_use + sum(b.nbytes for b in _free_bufs) + nbytes > limit:
            return np.empty(nbytes, np.uint8), False
        best = np.empty(nbytes, np.uint8)  # >= 4 MiB: NumPy advises transparent huge pages
    _in_use += best.nbytes
    return best, True


def _alloc(shape, dtype):
    """A fresh output.  Large ones come from the buffer cache (``empty_cache``), wrapped by
    ``torch.from_numpy`` (so ``resize_`` cannot grow them); small ones from torch."""
    n = math.prod(shape)
    itemsize = dtype.itemsize
    if n * itemsize >= _NP_ALLOC:
        buf, cached = _cached_buffer(n * itemsize)
        arr = buf[: n * itemsize].view(_NP_STORAGE[dtype])
        if cached:
            # not at exit: weakref.finalize would run it then for outputs still alive, and an
            # output made later (an atexit handler) would be handed their buffer
            weakref.finalize(arr, _release, buf).atexit = False
        t = torch.from_numpy(arr)
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.view(shape)
    # (sizes unpacked: torch parses them in about half the time of a torch.Size)
    return torch.empty(*shape, dtype=dtype, device=_CPU) if len(shape) else torch.empty((), dtype=dtype, device=_CPU)
