"""Which test compiles which kernel: a log of numba's top-level compiles, one JSON line each.

Set ``TORCHFILTERS_COMPILE_LOG=FILE`` (an absolute path) for a test run; every pytest process
(each xdist worker) appends to ``FILE`` a line per *top-level* compile -- a kernel that was not
in the cache, with every nested function it compiled -- in the thread that ran it::

    {"test": nodeid, "kernel": "module.qualname", "closure": [...], "args": "...", "s": seconds,
     "pid": pid}

``closure`` holds the kernel's closure values where they are plain numbers or tuples of them
(the direct kernels' forms and epilogue).  Cache hits are not logged (numba fires its
``numba:compile`` event only around a compile).  Kernels compiled in subprocesses that tests
start are not logged either: they have their own compilers.  ``benchmarks/compile_log.py FILE``
summarises the log (by kernel family, by test file, and the kernels only one test asks for).
"""

from __future__ import annotations

import json
import os
import threading
import time

_state = {"test": "<collection>"}
_local = threading.local()
_lock = threading.Lock()


def set_test(nodeid: str) -> None:
    """Name the test that compiles from now on (``pytest_runtest_setup``)."""
    _state["test"] = nodeid


def _closure(fn):
    vals = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, (bool, int, float, str)) or (isinstance(v, tuple) and all(
                isinstance(e, (bool, int, float, str)) for e in v)):
            vals.append(v)
    return vals


def install(path: str) -> None:
    """Listen to numba's compile events and append each top-level compile to ``path``."""
    from numba.core import event

    class _Listener(event.Listener):
        def on_start(self, ev):
            depth = getattr(_local, "depth", 0)
            _local.depth = depth + 1
            if depth == 0:
                _local.t0 = time.perf_counter()
                _local.test = _state["test"]

        def on_end(self, ev):
            _local.depth -= 1
            if _local.depth:
                return
            fn = ev.data["dispatcher"].py_func
            rec = {"test": _local.test, "kernel": f"{fn.__module__}.{fn.__qualname__}", "closure": _closure(fn),
                   "args": str(ev.data["args"]), "s": round(time.perf_counter() - _local.t0, 3),
                   "pid": os.getpid()}
            with _lock, open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")

    event.register("numba:compile", _Listener())
