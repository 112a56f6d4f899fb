"""Tensors between ``PROT_NONE`` guard pages (Linux, libc ``mmap`` / ``mprotect``): a kernel that
reads or writes one element before or after such a tensor crashes the process.  Tests that use
them run in a subprocess, so that a crash fails the test instead of killing pytest."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import sys

import torch

_PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS = 3, 0x22


@contextlib.contextmanager
def guarded(nbytes: int):
    """A ``uint8`` tensor of ``nbytes`` (a multiple of the page size) with a guard page flush
    against each end."""
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pg = mmap.PAGESIZE
    assert nbytes % pg == 0, nbytes
    base = libc.mmap(None, nbytes + 2 * pg, _PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    try:
        assert libc.mprotect(base, pg, 0) == 0 and libc.mprotect(base + pg + nbytes, pg, 0) == 0
        yield torch.frombuffer((ctypes.c_char * nbytes).from_address(base + pg), dtype=torch.uint8)
    finally:
        libc.munmap(base, nbytes + 2 * pg)


def run_in_subprocess(module: str, function: str) -> None:
    """Run ``module.function()`` (a module of ``tests/``) in a fresh interpreter; assert that it
    printed "ok" and exited cleanly (a fault shows as a negative return code)."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [here, os.path.join(here, "..", "src")]
    code = f"import sys\nsys.path[:0] = {paths!r}\nimport {module}\n{module}.{function}()\nprint('ok')\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.returncode, run.stderr[-2000:])
