"""Argument checks shared by every public op: boundary modes, dtypes, shapes.

Every check raises the exception a user would expect (``TypeError`` for a
wrong type or dtype, ``ValueError`` for a wrong value) with a message that
names the argument and lists what is accepted.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np
import torch

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


def tensor_values(t: torch.Tensor, name: str):
    """The values of a parameter given as a tensor, as Python numbers (``tolist``), or a clear
    error (see :func:`check_has_values`)."""
    check_has_values(t, name)
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
    """Validate an image tensor shaped ``(..., H, W)``; promote integers to float32.

    Raises:
        TypeError: not a tensor, a sparse/mkldnn/nested tensor, or a
            bool/complex/unsupported dtype.
        ValueError: fewer than 2 dimensions.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor shaped (..., H, W); got {type_name(input)}")
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
    if input.dim() < 2:
        raise ValueError(
            f"{name} must have at least 2 dimensions (..., H, W); got shape {tuple(input.shape)}"
        )
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
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Real):
        what = f"a tensor of dtype {given.dtype}" if isinstance(given, torch.Tensor) else type_name(given)
        raise TypeError(f"{name} must be a real number; got {what}")
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
    """A scalar or a length-2 sequence (a tensor or NumPy array too) -> tuple (for y/H, x/W)."""
    if isinstance(value, torch.Tensor):
        value = tensor_values(value, name)
    elif isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"{name} must be a scalar or a pair (y, x) for axes (-2, -1); got {value!r}")
        return tuple(value)
    return (value, value)


def check_axis(axis) -> int:
    if isinstance(axis, bool) or not isinstance(axis, Integral):
        raise TypeError(f"axis must be an int, -1 (x, W) or -2 (y, H); got {type_name(axis)}")
    axis = int(axis)
    if axis not in (-1, -2):
        raise ValueError(
            f"axis must be -1 (x, W) or -2 (y, H); got {axis}. Filters act on the last two "
            "axes; use negative indices so leading batch axes do not matter"
        )
    return axis


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
    if torch._debug_has_internal_overlap(out) == 1:
        raise ValueError(
            f"{name} has overlapping memory (e.g. an expanded, stride-0 tensor); "
            "it cannot hold one result per element: pass a contiguous tensor"
        )
    if out.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{name} requires grad; out= does not support automatic differentiation")
