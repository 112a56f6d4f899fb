"""Backend dispatch: device, dtype -> engine.

Engines (each a module with ``filter_forward``, ``filter_backward``,
``blur_forward``, ``blur_backward`` and ``available``):

* ``reference`` -- pure PyTorch, any device and dtype; the oracle.
* ``cpu`` -- fused numba kernels for CPU tensors.
* ``triton`` -- fused Triton kernels for CUDA tensors (and CPU tensors under
  ``TRITON_INTERPRET=1``).

``backend="auto"`` (the default) picks the fastest engine available for the
tensor; on CPU tensors it never waits for numba to compile or load a kernel
(``_tiered``: the call runs on the reference engine meanwhile, and
:func:`synchronize` waits for the background compilation).
``TORCHFILTERS_BACKEND=reference|cpu|triton`` in the environment, or the
``backend=`` keyword of every op, forces one; a forced engine that cannot run
raises :class:`BackendUnavailableError`.
"""

from __future__ import annotations

import importlib
import os

import torch

from . import _tiered
from ._tiered import synchronize, waiting

__all__ = ["BACKENDS", "BackendUnavailableError", "resolve", "get", "synchronize", "waiting"]

BACKENDS = ("auto", "reference", "cpu", "triton")

_MODULES = {"reference": ".reference", "cpu": ".cpu", "triton": ".triton"}
#: each engine's Canny module (its ``canny_edges``)
CANNY_MODULES = {"reference": ".reference_canny", "cpu": ".cpu.canny", "triton": ".triton.canny"}
_loaded: dict = {}
_import_errors: dict = {}


class BackendUnavailableError(RuntimeError):
    """A backend was asked for (keyword or ``TORCHFILTERS_BACKEND``) but cannot run."""


def check_backend(backend) -> str:
    if backend is None:
        return "auto"
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    return backend


def get(name: str):
    """Import (once) and return a backend module, or None when it cannot be imported."""
    if name in _loaded:
        return _loaded[name]
    try:
        mod = importlib.import_module(_MODULES[name], __name__)
    except (ImportError, OSError) as e:  # numba / triton missing, NUMBA_DISABLE_JIT, a shared library
        _import_errors[name] = e
        mod = None
    _loaded[name] = mod
    return mod


def _env_backend() -> str:
    value = os.environ.get("TORCHFILTERS_BACKEND", "auto") or "auto"
    if value not in BACKENDS:
        raise ValueError(
            f"TORCHFILTERS_BACKEND={value!r} is not a backend; use one of {', '.join(map(repr, BACKENDS))}"
        )
    return value


def resolve(backend: str, device: torch.device, dtype: torch.dtype):
    """Return the backend module that runs a tensor of ``device``/``dtype``."""
    name = backend if backend != "auto" else _env_backend()
    if name == "auto":
        if device.type == "cpu":
            if dtype in _tiered.CPU_DTYPES and _tiered.background() and _loaded.get("cpu", True):
                return _tiered.ENGINE  # the fused engine where its kernels are ready
            order = ("cpu", "reference")
        elif device.type == "cuda":
            order = ("triton", "reference")
        else:
            order = ("reference",)
        for cand in order:
            mod = get(cand)
            if mod is not None and mod.available(device, dtype):
                return mod
        return get("reference")
    mod = get(name)
    if mod is None:
        err = _import_errors.get(name)
        fix = getattr(err, "fix", None) or "install its dependency (numba for 'cpu', triton for 'triton')"
        raise BackendUnavailableError(f"backend {name!r} cannot be imported ({err}); {fix} or use backend='reference'")
    if not mod.available(device, dtype):
        hint = getattr(mod, "UNAVAILABLE_HINT", "")
        raise BackendUnavailableError(
            f"backend {name!r} cannot run a {dtype} tensor on {device}{hint}; use backend='auto' or 'reference'"
        )
    return mod


def empty_cache() -> int:
    """Release the CPU engine's cached output buffers that no tensor uses any more.

    Fresh CPU outputs of at least 1 MiB come from a small cache of reusable
    buffers (as PyTorch's caching allocator does on CUDA), so that a loop of
    ``y = op(x)`` does not page-fault a new output on every call.  The cache
    holds at most ``TORCHFILTERS_CPU_CACHE_MB`` megabytes (default: a quarter
    of the memory -- the cgroup's limit in a container -- at most 2 GiB;
    ``0`` or a negative value turns it off, ``inf`` lifts the limit; any
    other non-number makes large CPU allocations raise ``ValueError``).

    Returns:
        The number of bytes released (0 when the CPU engine was never used).

    Example:
        >>> import torchfilters as tf
        >>> tf.empty_cache() >= 0
        True
    """
    mod = _loaded.get("cpu")
    return mod.empty_cache() if mod is not None else 0
