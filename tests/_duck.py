"""A stand-in for a GPU array library (CuPy) on a machine without one.

``Duck`` wraps a NumPy array and behaves as CuPy's arrays do towards NumPy code: NumPy's
functions and ufuncs dispatch to it (``__array_function__``, ``__array_ufunc__``, creation with
``like=``), it exports DLPack, and it refuses implicit conversion (``np.asarray(duck)`` raises
``TypeError``, as ``np.asarray(cupy_array)`` does).  Code that silently round-trips a device
array through the host fails on it; code that stays on the array's library passes.  Its DLPack
device is the CPU, so the tensors seen by the engines are CPU tensors."""

from __future__ import annotations

import types

import numpy as np


def _unwrap(x):
    if isinstance(x, Duck):
        return x._a
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x):
    if isinstance(x, np.ndarray):
        return Duck(x)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


class Duck(np.lib.mixins.NDArrayOperatorsMixin):
    exported = 0  # how many times any Duck exported DLPack (a test's proof of the zero-copy path)

    def __init__(self, a):
        self._a = a if isinstance(a, np.ndarray) else np.asarray(a)

    # --- what NumPy code reads
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    real = property(lambda self: Duck(self._a.real), lambda self, v: setattr(self._a, "real", _unwrap(v)))
    imag = property(lambda self: Duck(self._a.imag), lambda self, v: setattr(self._a, "imag", _unwrap(v)))
    T = property(lambda self: Duck(self._a.T))

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Duck arrays do not convert to NumPy implicitly (as CuPy's); use .get()")

    def get(self):
        return self._a.copy()

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"Duck({self._a!r})"

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key)] = _unwrap(value)

    def astype(self, dtype, **kw):
        return Duck(self._a.astype(dtype, **kw))

    def reshape(self, *shape, **kw):
        return Duck(self._a.reshape(*shape, **kw))

    def ravel(self, *a, **kw):
        return Duck(self._a.ravel(*a, **kw))

    def copy(self, *a, **kw):
        return Duck(self._a.copy(*a, **kw))

    def __getattr__(self, name):  # reductions and the rest: NumPy's, wrapped
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if callable(attr):
            return lambda *a, **kw: _wrap(attr(*_unwrap(a), **_unwrap(kw)))
        return _wrap(attr)

    # --- NumPy's dispatch protocols
    def __array_function__(self, func, types_, args, kwargs):
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        res = getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(res)

    # --- DLPack
    def __dlpack__(self, **kw):
        Duck.exported += 1
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()

    def __array_namespace__(self, api_version=None):
        return namespace


namespace = types.SimpleNamespace(from_dlpack=lambda t: Duck(np.from_dlpack(t)),
                                  asarray=lambda a: Duck(np.asarray(a)))
