"""The bridge between array libraries and torch, for :mod:`torchfilters.ndimage` and :mod:`torchfilters.dask`.

NumPy arrays (and anything ``np.asarray`` takes) cross with ``torch.from_numpy`` and
``Tensor.numpy()``.  Other array libraries' arrays -- CuPy's on a GPU above all -- cross through
DLPack, without a copy and without leaving their device: a *device array* here is any non-NumPy
array that implements NumPy's dispatch protocols (``__array_function__``, NEP 18; creation with
``like=``, NEP 35) and exports DLPack (``__dlpack__``).  On one, ``torchfilters.ndimage`` runs
SciPy's argument and dtype logic through NumPy's API (which dispatches to the array's library),
the filter on the tensor's device (a CUDA tensor runs on the Triton engine), and returns an array
of the input's library.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

__all__ = ["is_device_array", "as_array", "host", "zeros", "to_torch", "from_torch"]


def is_device_array(x) -> bool:
    """``x`` is a non-NumPy array that dispatches NumPy's API and exports DLPack (a CuPy array)."""
    return (not isinstance(x, np.ndarray) and hasattr(type(x), "__array_function__")
            and hasattr(x, "__dlpack__") and hasattr(x, "dtype") and hasattr(x, "shape"))


def as_array(x):
    """``x`` as it is when a device array, else ``np.asarray(x)``."""
    return x if is_device_array(x) else np.asarray(x)


def host(x, dtype=None) -> np.ndarray:
    """A NumPy copy of a small argument (weights, a footprint) wherever it lives."""
    if is_device_array(x):
        x = torch.from_dlpack(_exportable(x)).cpu().numpy()
    return np.asarray(x, dtype=dtype)


def zeros(shape, dtype, like=None):
    """Zeros of ``shape``/``dtype`` in ``like``'s library (NumPy when ``like`` is a NumPy array or None)."""
    if like is not None and is_device_array(like):
        return np.zeros(shape, dtype=dtype, like=like)
    return np.zeros(shape, dtype=dtype)


def _exportable(a):
    # DLPack carries no negative strides (torch refuses them): a reversed view is copied first
    if any(s < 0 for s in a.strides):
        a = a.copy(order="C")  # (the array's own copy: NumPy's would read it through the host)
    return a


_TORCH_FLOAT = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}


def to_torch(a, dtype: np.dtype) -> torch.Tensor:
    """``a`` as a tensor of ``dtype`` (float32 or float64) on ``a``'s device, without a copy where the layout and dtype allow."""
    dtype = np.dtype(dtype)
    if is_device_array(a):
        t = torch.from_dlpack(_exportable(a))
        want = _TORCH_FLOAT[dtype]
        return t if t.dtype == want else t.to(want)
    if a.dtype != dtype or not a.dtype.isnative or any(s < 0 for s in a.strides):
        a = np.ascontiguousarray(a, dtype=dtype)
    return torch.from_numpy(a)


def _namespace(like):
    ns = getattr(like, "__array_namespace__", None)
    if ns is not None:
        return ns()
    return sys.modules[type(like).__module__.partition(".")[0]]


def from_torch(t: torch.Tensor, like):
    """``t`` as an array of ``like``'s library on ``t``'s device, without a copy."""
    if like is not None and is_device_array(like):
        return _namespace(like).from_dlpack(t.detach())
    return t.detach().numpy()
