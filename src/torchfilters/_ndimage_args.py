"""SciPy's argument rules for :mod:`torchfilters.ndimage`: mode names, per-axis sequences, axes,
origins, ``cval``, the input and ``output=`` arrays -- checked as ``scipy.ndimage`` checks them,
with its exception types and messages."""

from __future__ import annotations

import numbers
import operator
import warnings

import numpy as np

from . import _arrays

_MODES = {"nearest", "wrap", "reflect", "grid-mirror", "mirror", "constant", "grid-wrap", "grid-constant"}
_SUPPORTED = set("?bBhHiIlLqQfdgFDG") - {"g", "G"}  # bool, integers, float32/64, complex64/128


def _check_mode(mode):
    if not isinstance(mode, str) or mode not in _MODES:
        raise RuntimeError("boundary mode not supported")
    return mode


def _normalize_sequence(value, rank):
    if not isinstance(value, str) and np.iterable(value):
        out = list(value)
        if len(out) != rank:
            raise RuntimeError("sequence argument must have length equal to input rank")
        return out
    return [value] * rank


def _check_axes(axes, ndim):
    if axes is None:
        return tuple(range(ndim))
    if np.isscalar(axes):
        axes = (int(np.asarray(axes).item()) if isinstance(axes, np.generic) else axes,)
    out = []
    for ax in axes:
        ax = operator.index(ax)  # SciPy's TypeError: "... cannot be interpreted as an integer"
        if ax < -ndim or ax > ndim - 1:
            raise ValueError(f"specified axis: {ax} is out of range")
        out.append(ax % ndim)
    if len(set(out)) != len(out):
        raise ValueError("axes must be unique")
    return tuple(out)


def _normalize_axis(axis, ndim):
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an integer; got {axis!r}")
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim


def _invalid_origin(origin, lenw):
    return (origin < -(lenw // 2)) or (origin > (lenw - 1) // 2)


def _input(input):
    a = _arrays.as_array(input)
    if a.dtype.char not in _SUPPORTED:
        raise RuntimeError("array type not supported")
    return a


def _get_output(output, input, shape=None, complex_output=False):
    shape = input.shape if shape is None else shape
    if output is None:  # (in native byte order, as SciPy's: a big-endian input gives a native result)
        dt = np.promote_types(input.dtype, np.complex64) if complex_output else input.dtype.newbyteorder("=")
        out = _arrays.zeros(shape, dt, input)
    elif isinstance(output, (type, np.dtype)):
        dt = np.dtype(output)
        if complex_output and dt.kind != "c":
            warnings.warn("promoting specified output dtype to complex", stacklevel=3)
            dt = np.promote_types(dt, np.complex64)
        out = _arrays.zeros(shape, dt, input)
    elif isinstance(output, str):
        dt = np.dtype(output)
        if complex_output and dt.kind != "c":
            raise RuntimeError("output must have complex dtype")
        if not issubclass(dt.type, np.number):
            raise RuntimeError("output must have numeric dtype")
        out = _arrays.zeros(shape, dt, input)
    else:
        out = _arrays.as_array(output)
        if out.shape != tuple(shape):
            raise RuntimeError("output shape not correct")
        if complex_output and out.dtype.kind != "c":
            raise RuntimeError("output must have complex dtype")
    if out.dtype.char not in _SUPPORTED:
        raise RuntimeError("array type not supported")
    if out.dtype.kind == "c" and not complex_output and input.dtype.kind != "c":
        # (SciPy's C filters write real results into real arrays only -- found by review)
        raise RuntimeError(f"array type {out.dtype!r} not supported")
    return out


def _expand_window(w, ndim, axes, name, given=False):
    """A window over ``axes`` (its dims in increasing axis order) as one over every axis."""
    if len(axes) < ndim or given:
        if w.ndim != len(axes):
            raise RuntimeError(f"{name}.ndim ({w.ndim}) must match len(axes) ({len(axes)})")
        w = np.expand_dims(w, tuple(ax for ax in range(ndim) if ax not in axes))
    return w


def _expand_origins(origin, ndim, axes):
    """Origins given per axis of ``axes`` (or one for all) as one per axis (0 elsewhere)."""
    _check_origin_type(origin)
    origins = _normalize_sequence(origin, len(axes))
    if len(axes) < ndim:
        full = [0] * ndim
        for o, ax in zip(origins, axes):
            full[ax] = o
        origins = full
    return origins


def _real_cval(cval):
    """``cval`` as the double SciPy's C functions read (``PyFloat_AsDouble``): a real number, a
    NumPy scalar (a complex one's real part, with NumPy's ComplexWarning) or a 0-d array of
    one; TypeError for None, a string, a Python complex, a complex or longer array."""
    if isinstance(cval, (str, bytes, bytearray)) or not hasattr(type(cval), "__float__"):
        raise TypeError(f"must be real number, not {type(cval).__name__}")
    try:
        return float(cval)
    except TypeError:
        raise TypeError(f"must be real number, not {type(cval).__name__}") from None


def _pass_origin(size, origin):
    """The origin of one SciPy 1-D pass of ``size``, as its filters check it: ValueError where it
    falls outside the window, then TypeError where it is no integer (its C function's)."""
    if (size // 2 + origin < 0) or (size // 2 + origin >= size):
        raise ValueError("invalid origin")
    return operator.index(origin)


def _check_origin_type(origin, bool_ok=False):
    """SciPy's C argument rules: integers; a Python bool only where it parses one int (``bool_ok``:
    the 1-D filters), not in the N-D filters' sequence of them."""
    bad = np.bool_ if bool_ok else (bool, np.bool_)
    for o in (origin if np.iterable(origin) else (origin,)):
        if isinstance(o, bad) or not isinstance(o, numbers.Integral):
            raise TypeError(f"origin must be an integer or a sequence of integers; got {o!r}")
