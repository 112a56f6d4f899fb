"""Argument checks shared by every public op: boundary modes, dtypes, shapes.

Every check raises the exception a user would expect (``TypeError`` for a
wrong type or dtype, ``ValueError`` for a wrong value) with a message that
names the argument and lists what is accepted.
"""

from __future__ import annotations

import math
import operator
from numbers import Integral, Real

import numpy as np
import torch

from ._spec import specialised

__all__ = [
    "MODES",
    "canonical_mode",
    "check_bool",
    "check_dense",
    "check_has_values",
    "check_input",
    "compute_dtype",
    "tensor_values",
    "type_name",
]

#: SciPy mode names (and SciPy's ``grid-*`` aliases) -> canonical name.
#: For filters SciPy treats ``grid-mirror`` as ``reflect``, ``grid-wrap`` as
#: ``wrap`` and ``grid-constant`` as ``constant``.
MODES = {
    "reflect": "reflect",
    "grid-mirror": "reflect",
    "mirror": "mirror",
    "nearest": "nearest",
    "wrap": "wrap",
    "grid-wrap": "wrap",
    "constant": "constant",
    "grid-constant": "constant",
}

# Names used by torch.nn.functional.pad, NumPy's np.pad and OpenCV, mapped to
# the SciPy mode with the same meaning.  ("reflect" is absent on purpose: it is
# a SciPy name, and in SciPy it repeats the edge sample, unlike torch's.)
_FOREIGN_MODES = {
    "replicate": ("nearest", "torch.nn.functional.pad"),
    "circular": ("wrap", "torch.nn.functional.pad"),
    "zeros": ("constant", "torch"),
    "border": ("nearest", "torch.nn.functional.grid_sample"),
    "reflection": ("mirror", "torch.nn.functional.grid_sample"),
    "edge": ("nearest", "numpy.pad"),
    "symmetric": ("reflect", "numpy.pad"),
    "border_reflect": ("reflect", "OpenCV"),
    "border_reflect_101": ("mirror", "OpenCV"),
    "border_reflect101": ("mirror", "OpenCV"),
    "reflect_101": ("mirror", "OpenCV"),
    "reflect101": ("mirror", "OpenCV"),
    "border_default": ("mirror", "OpenCV"),
    "border_replicate": ("nearest", "OpenCV"),
    "border_wrap": ("wrap", "OpenCV"),
    "border_constant": ("constant", "OpenCV"),
}

_ACCEPTED = ", ".join(repr(m) for m in MODES)


def type_name(value) -> str:
    """``type(value).__name__``, with the package for non-builtins (``numpy.bool``, not ``bool``)."""
    t = type(value)
    package = t.__module__.partition(".")[0]
    return t.__name__ if package == "builtins" else f"{package}.{t.__name__}"


def check_dense(t: torch.Tensor, name: str, fix: str = "") -> None:
    """Refuse the tensors no engine can read: sparse, mkldnn and nested ones (``TypeError``)."""
    if t.is_nested:
        raise TypeError(
            f"{name} is a nested tensor, which torchfilters does not filter: filter each of "
            f"{name}.unbind(), or pad them into one dense tensor (torch.nested.to_padded_tensor)"
        )
    if t.layout != torch.strided:
        kind = "an mkldnn" if t.layout == torch._mkldnn else "a sparse"
        raise TypeError(
            f"{name} is {kind} tensor (layout {t.layout}); torchfilters takes dense (strided) tensors "
            f"only: {fix or f'call {name}.to_dense() first'}"
        )


def check_has_values(t: torch.Tensor, name: str) -> None:
    """A tensor whose values are read on the host must be dense and hold values.

    Raises:
        TypeError: a sparse, mkldnn or nested tensor.
        ValueError: a meta tensor (it has a shape but no values).
    """
    check_dense(t, name)
    if t.is_meta:
        raise ValueError(
            f"{name} is a meta tensor, which has a shape and a dtype but no values; {name} must hold "
            f"values (a tensor on a real device such as 'cpu', or plain numbers)"
        )


def check_constant(t: torch.Tensor, name: str) -> None:
    """A parameter given as a tensor (``cval``, ``sigma``, ...) is read as numbers: one that
    requires grad would have its gradient silently never computed, so it is a ``ValueError``
    (found by review)."""
    if t.requires_grad:
        raise ValueError(f"{name} requires grad, but torchfilters treats {name} as a constant (gradients flow "
                         f"to the input only); pass {name}.detach() or numbers")


def tensor_values(t: torch.Tensor, name: str):
    """The values of a parameter given as a tensor, as Python numbers (``tolist``), or a clear
    error (see :func:`check_has_values`, :func:`check_constant`)."""
    check_has_values(t, name)
    check_constant(t, name)
    if t.is_floating_point() and torch.compiler.is_compiling():  # (Dynamo's error named only Tensor.tolist)
        raise TypeError(f"{name} must be Python numbers under torch.compile (a tensor's values are data); got a "
                        f"tensor: pass {name}.tolist() outside the compiled function")
    return t.detach().cpu().tolist()


def check_bool(value, name: str) -> bool:
    """A flag: a Python bool or a NumPy bool (as torch accepts); never an int."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False); got {type_name(value)}")
    return bool(value)


def canonical_mode(mode: str) -> str:
    """Return the canonical SciPy mode for ``mode`` or raise.

    Raises:
        TypeError: ``mode`` is not a string.
        ValueError: ``mode`` is unknown; a torch/NumPy/OpenCV name gets the
            SciPy equivalent suggested.
    """
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a str, one of {_ACCEPTED}; got {type(mode).__name__}")
    try:
        return MODES[mode]
    except KeyError:
        pass
    key = mode.lower().replace("cv2.", "").replace("-", "_")
    if key in _FOREIGN_MODES:
        scipy_name, origin = _FOREIGN_MODES[key]
        raise ValueError(
            f"mode={mode!r} is {'an' if origin[0] in 'AEIOU' else 'a'} {origin} name; torchfilters uses scipy.ndimage mode names: "
            f"use mode={scipy_name!r} for the same boundary (accepted: {_ACCEPTED})"
        )
    raise ValueError(f"unknown mode={mode!r}; accepted: {_ACCEPTED}")


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_input(input, name: str = "input") -> torch.Tensor:
    """Validate an image tensor (``axes`` say which of its axes are filtered); promote
    integers to float32.

    Raises:
        TypeError: not a tensor, a sparse/mkldnn/nested tensor, or a
            bool/complex/unsupported dtype.
    """
    if not isinstance(input, torch.Tensor):
        hint = " (for NumPy arrays use torchfilters.ndimage, SciPy's API)" if hasattr(input, "__array__") else ""
        raise TypeError(f"{name} must be a torch.Tensor shaped (..., H, W); got {type_name(input)}{hint}")
    check_dense(input, name)
    dtype = input.dtype
    if dtype not in _FLOATS:
        if dtype == torch.bool or dtype.is_complex:
            raise TypeError(
                f"{name} has dtype {dtype}, which torchfilters does not filter; "
                "convert it to a floating dtype (float16, bfloat16, float32 or float64) first"
            )
        if dtype.is_floating_point:  # float8 and friends
            raise TypeError(
                f"{name} has dtype {dtype}; supported are float16, bfloat16, float32, float64 and integers"
            )
        # integers (uint8, int16, ...): promote, never wrap around
        input = input.to(torch.float32)
    return input


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _real(value, name: str) -> float:
    """A real number (NumPy floating and integer scalars too) or a one-element real tensor;
    never a bool (Python's or NumPy's, or a bool tensor)."""
    given = value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        check_has_values(value, name)
        check_constant(value, name)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        what = f"a tensor of dtype {given.dtype}" if isinstance(given, torch.Tensor) else type_name(given)
        raise TypeError(f"{name} must be a real number; got {what}")
    if torch.compiler.is_compiling():
        # Dynamo makes a number argument symbolic once it changes between calls ("automatic
        # dynamic"), and a spec needs its value: a constant (a guard, a recompile per value as
        # with dynamic=False) -- found by review
        value = specialised(value)
    return float(value)


def check_cval(cval) -> float:
    """Any real number (NaN and inf too, as in SciPy), or a 1-element real tensor."""
    return _real(cval, "cval")


def check_real(value, name: str, *, allow_inf: bool = True) -> float:
    value = _real(value, name)
    if math.isnan(value) or (not allow_inf and math.isinf(value)):
        raise ValueError(f"{name} must be a finite number; got {value}")
    return value


def pair(value, name: str):
    """A scalar or a length-2 sequence -> tuple (for y/H, x/W): :func:`per_axis` of 2."""
    return per_axis(value, 2, name)


def per_axis(value, k: int, name: str):
    """A scalar or a sequence of ``k`` values (a tensor or NumPy array too) -> tuple of ``k``,
    one per filtered axis, in ``axes`` order (SciPy's rule for ``sigma``, ``order``, ...).

    Raises:
        ValueError: a sequence whose length is not ``k``.
    """
    if isinstance(value, torch.Tensor):
        value = tensor_values(value, name)
    elif isinstance(value, np.ndarray):
        if torch.compiler.is_compiling():  # (Dynamo traces NumPy values, scalars too, as tensors)
            raise TypeError(f"{name} must be Python numbers under torch.compile (Dynamo traces NumPy values as "
                            f"tensors); pass {name}.tolist() (or float({name})) outside the compiled function")
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) != k:
            raise ValueError(
                f"{name} must be a scalar or a sequence of {k} (one per axis in axes); got {value!r}"
            )
        return tuple(value)
    return (value,) * k


def axes_tuple(axes) -> tuple[int, ...]:
    """``axes`` (an int or a sequence of 1 to 3 ints: a tuple, list, range, NumPy array or
    tensor, NumPy integers too) as a tuple of Python ints, not yet checked against an input.

    Raises:
        TypeError: an axis that is not an int.
        ValueError: none or more than 3.
    """
    given = axes
    if isinstance(axes, torch.Tensor):
        axes = tensor_values(axes, "axes")
    elif isinstance(axes, np.ndarray):
        axes = axes.tolist()
    if isinstance(axes, (bool, np.bool_)) or isinstance(axes, (str, bytes)):
        raise TypeError(f"axes must be an int or a sequence of ints; got {type_name(axes)}")
    if isinstance(axes, Integral):
        axes = (axes,)
    try:
        axes = tuple(axes)
    except TypeError:
        raise TypeError(f"axes must be an int or a sequence of ints; got {type_name(axes)}") from None
    for a in axes:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, Integral):
            raise TypeError(f"axes must hold ints; got {type_name(a)} in axes={given!r}")
    if not 1 <= len(axes) <= 3:
        raise ValueError(f"axes must name 1, 2 or 3 axes; got axes={given!r}")
    # (``operator.index``, not ``int``: it makes Dynamo specialise a symbolic int -- found by review)
    return tuple([operator.index(a) for a in axes])


def check_axes(axes, ndim: int, default=(-2, -1)):
    """``axes`` (None for ``default``; an int or a sequence of 1 to 3 distinct ints, NumPy
    integers too, negative or not) -> tuple of non-negative axes of an ``ndim``-D input, in
    the caller's order.

    Raises:
        TypeError: an axis that is not an int.
        ValueError: duplicates, an axis out of range, none or more than 3.
    """
    given = axes
    axes = axes_tuple(default if axes is None else axes)
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < ndim:
            if given is None:
                raise ValueError(
                    f"input must have at least {len(axes)} dimensions for the default axes={tuple(default)} "
                    f"(..., H, W); got {ndim} (pass axes= to filter fewer axes)"
                )
            raise ValueError(f"axes={given!r} is out of range for an input of {ndim} dimensions")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axes must be distinct; got axes={given!r}")
    return tuple(out)


def check_modes(mode, k: int):
    """``mode``: one mode name for every axis, or a sequence of ``k`` (in ``axes`` order) ->
    tuple of ``k`` canonical names."""
    if isinstance(mode, str):
        return (canonical_mode(mode),) * k
    if isinstance(mode, (list, tuple)):
        if len(mode) != k:
            raise ValueError(
                f"mode must be a str or a sequence of {k} (one per axis in axes); got {mode!r}"
            )
        return tuple(canonical_mode(m) for m in mode)
    return (canonical_mode(mode),) * k  # the TypeError


def check_axis(axis, ndim: int, name: str = "axis") -> int:
    """An axis of an ``ndim``-D input (an int, NumPy integers too, negative or not) -> its
    non-negative index."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, Integral):
        raise TypeError(f"{name} must be an int (-1: x, along W; -2: y, along H); got {type_name(axis)}")
    axis = operator.index(axis)  # (a constant while Dynamo traces: see axes_tuple)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for an input of {ndim} dimensions")
    return axis % ndim


def check_out(out, shape, dtype, device, name: str = "out") -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None; got {type_name(out)}")
    check_dense(out, name, "pass a dense tensor (e.g. torch.empty_like(input))")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(out.shape)}; expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{name} has dtype {out.dtype}; expected {dtype}")
    if out.device != device:
        raise ValueError(f"{name} is on {out.device}; expected {device}")
    # (ATen's internal-overlap rule for a definite overlap, a dim of size > 1 and stride 0, in
    # shapes and strides: torch.compile traces it, where ``torch._debug_has_internal_overlap``
    # ended a fullgraph trace -- found by review)
    if out.numel() and any(n > 1 and st == 0 for n, st in zip(out.shape, out.stride())):  # (none: empty)
        raise ValueError(
            f"{name} has overlapping memory (e.g. an expanded, stride-0 tensor); "
            "it cannot hold one result per element: pass a contiguous tensor"
        )
    if out.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{name} requires grad; out= does not support automatic differentiation")
