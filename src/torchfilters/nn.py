"""``torch.nn.Module`` wrappers of the functional ops (no parameters; weights are constants).

Each module checks its arguments when it is built and passes them to its function on every
``forward``; the argument paragraphs are the functions' own (:mod:`torchfilters._docs`).
Every module is built from one table (:data:`_MODULES`): the function, its positional
arguments and its keywords with their defaults.

    >>> import torch, torchfilters
    >>> m = torchfilters.nn.GradientMagnitude(operator="sobel")
    >>> m(torch.rand(2, 3, 16, 16)).shape
    torch.Size([2, 3, 16, 16])
    >>> torchfilters.nn.Laplace(axes=(-3, -2, -1))(torch.rand(1, 4, 5, 6)).shape
    torch.Size([1, 4, 5, 6])
"""

from __future__ import annotations

import inspect
from numbers import Integral
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from . import functional as F
from ._docs import fill
from ._validate import axes_tuple, tensor_values
from .functional._core import weights_tuple
from .functional.canny import _CANNY_INPUT, _CANNY_MASK
from .functional.rank import _footprint_tuple

__all__ = [
    "GradientMagnitude",
    "Gradient",
    "Sobel",
    "Laplace",
    "GaussianFilter",
    "GaussianFilter1d",
    "GaussianGradientMagnitude",
    "GaussianLaplace",
    "UniformFilter",
    "SelectiveBlur",
    "MedianFilter",
    "MinimumFilter",
    "MaximumFilter",
    "PercentileFilter",
    "UnsharpMask",
    "DifferenceOfGaussians",
    "Canny",
]

_SENTINEL = object()


class _FilterModule(torch.nn.Module):
    """A filter op as a module: ``forward(input)`` calls ``_fn(input, *args, **kwargs)``."""

    _fn = None
    _params: tuple = ()  # (name, default) in signature order; default _SENTINEL: required

    def __init__(self, *args, **kwargs):
        super().__init__()
        names = [n for n, _ in self._params]
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes at most {len(names)} positional arguments")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"{type(self).__name__} got an unexpected keyword argument {k!r}")
            if k in values:
                raise TypeError(f"{type(self).__name__} got multiple values for argument {k!r}")
            values[k] = v
        if values.get("footprint") is not None and "size" not in values:
            values["size"] = None  # a footprint replaces the default size
        for n, d in self._params:
            if n not in values:
                if d is _SENTINEL:
                    raise TypeError(f"{type(self).__name__} missing required argument {n!r}")
                values[n] = d
        if values.get("axes") is not None and not isinstance(values["axes"], Integral):
            values["axes"] = axes_tuple(values["axes"])  # (a list, range, array: a tuple of ints)
        if "weights" in values and values["weights"] is not None:
            # nested tuples of floats: constants for torch.compile(fullgraph=True), no state to save
            axes = values.get("axes")
            k = 2 if axes is None else (len(axes) if isinstance(axes, (list, tuple)) else 1)
            values["weights"] = weights_tuple(values["weights"], k)
        if values.get("footprint") is not None:
            axes = values.get("axes")
            k = 2 if axes is None else (len(axes) if isinstance(axes, (list, tuple)) else 1)
            values["footprint"] = _footprint_tuple(values["footprint"], k)
        for n in names:
            v = values[n]
            # a sigma, a cval: Python numbers, constants for torch.compile (which traces NumPy
            # values as tensors too -- found by review)
            if n not in ("weights", "footprint"):
                if isinstance(v, Tensor) and v.dtype != torch.bool:
                    v = tensor_values(v, n)
                elif isinstance(v, (np.ndarray, np.generic)):
                    v = v.tolist()
            setattr(self, n, v)
        # validate the arguments now, not at the first batch: on the reference engine, whatever the
        # default backend (``TORCHFILTERS_BACKEND=triton`` runs no CPU tensor: found by review)
        self._validate()

    def _validate(self):
        """Call the op on probes of ``1`` s: of the fewest dimensions its axes need, up to as many
        as keep every negative axis clear of every non-negative one (``axes=(1, -1)`` names two
        axes of a 3-D or larger input, found by review); the first probe's error where none
        takes the arguments."""
        axes = getattr(self, "axes", None)
        named = [] if axes is None else list(axes) if isinstance(axes, tuple) else [axes]
        axis = getattr(self, "axis", None)
        if isinstance(axis, Integral):
            named.append(axis)
        lo = max([2] + [a + 1 for a in named if a >= 0] + [-a for a in named if a < 0])
        hi = max(lo, max([a + 1 for a in named if a >= 0], default=0) + max([-a for a in named if a < 0], default=0))
        first = None
        for ndim in range(lo, hi + 1):
            try:
                type(self)._fn(torch.zeros((1,) * ndim), **self._call_args(), backend="reference")
                return
            except (TypeError, ValueError) as e:
                first = first or e
        raise first

    def _call_args(self):
        return {n: getattr(self, n) for n, _ in self._params}

    def extra_repr(self) -> str:
        return ", ".join(f"{n}={getattr(self, n)!r}" for n, _ in self._params)


_DOC = """Module form of :func:`torchfilters.%(fname)s`: ``(..., H, W)`` -> ``%(shape)s`` by default.

``forward(input%(mask_arg)s)`` returns ``torchfilters.%(fname)s(input, ...)`` with this
module's arguments (the default engine, no ``out=``)%(mask_note)s.

Args:
%(args)s

Example:
    >>> import torch, torchfilters as tf
    >>> m = tf.nn.%(cls)s(%(example)s)
    >>> m(torch.rand(2, 1, 8, 8)).shape
    torch.Size([2, 1, %(ex_shape)s8, 8])
"""


_FORWARD = """``input`` filtered with this module's arguments.

Args:
    %(args)s

Returns:
    %(returns)s
"""


def _module(cls_name, fn, params, docs, example="", mask=False, forward_docs=None):
    """A module class running ``fn``; ``forward_docs``: paragraphs of ``forward``'s docstring that
    differ from the common ones (``input``, ``mask``, ``returns``)."""
    stacked = cls_name == "Gradient"  # (its components stacked along a new axis -3)
    forward_docs = dict(forward_docs or {})
    if stacked:
        forward_docs.setdefault("out_shape", "A ``(..., 2, H, W)``")
    if mask:
        def forward(self, input: Tensor, mask: Optional[Tensor] = None) -> Tensor:
            return type(self)._fn(input, mask=mask, **self._call_args())

        forward.__doc__ = fill(_FORWARD, args="%(input)s\n%(mask)s", out_note="", **forward_docs)
    else:
        def forward(self, input: Tensor) -> Tensor:
            return type(self)._fn(input, **self._call_args())

        forward.__doc__ = fill(_FORWARD, args="%(input)s", out_note="", **forward_docs)
    cls = type(cls_name, (_FilterModule,), {"_fn": staticmethod(fn), "_params": tuple(params), "forward": forward})
    cls.__module__ = __name__
    cls.__qualname__ = cls_name
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    cls.__signature__ = inspect.Signature(
        [inspect.Parameter(n, kind, **({} if d is _SENTINEL else {"default": d})) for n, d in params])
    cls.__doc__ = fill(
        _DOC,
        fname=fn.__name__,
        shape="(..., 2, H, W)" if stacked else "(..., H, W)",
        cls=cls_name,
        example=example,
        ex_shape="2, " if stacked else "",
        args="\n".join(f"    %({d})s" for d in docs),
        mask_arg=", mask=None" if mask else "",
        mask_note=("; ``mask`` is the function's (a bool tensor broadcastable to ``input``, "
                   "overriding ``threshold``)") if mask else "",
    )
    return cls


_R = _SENTINEL
_COMMON = (("mode", "reflect"), ("cval", 0.0), ("axes", None))
_GAUSS = (("mode", "reflect"), ("cval", 0.0), ("truncate", 4.0), ("radius", None), ("axes", None))

GradientMagnitude = _module(
    "GradientMagnitude", F.gradient_magnitude,
    (("operator", "central"),) + _COMMON[:2] + (("normalized", False), ("axes", None)),
    ("operator", "mode", "cval", "normalized", "axes"), 'operator="sobel"')
Gradient = _module(
    "Gradient", F.gradient, (("operator", "central"),) + _COMMON[:2] + (("normalized", False), ("axes", None)),
    ("operator", "mode", "cval", "normalized", "axes"), 'operator="sobel"')
Sobel = _module("Sobel", F.sobel, (("axis", -1),) + _COMMON, ("axis", "mode", "cval", "axes"), "axis=-2")
Laplace = _module("Laplace", F.laplace, _COMMON, ("mode", "cval", "axes"))
GaussianFilter = _module("GaussianFilter", F.gaussian_filter, (("sigma", _R), ("order", 0)) + _GAUSS,
                         ("sigma", "order", "mode", "cval", "truncate", "radius", "axes"), "1.5")
GaussianFilter1d = _module(
    "GaussianFilter1d", F.gaussian_filter1d,
    (("sigma", _R), ("axis", -1), ("order", 0), ("mode", "reflect"), ("cval", 0.0), ("truncate", 4.0),
     ("radius", None)),
    ("sigma1d", "axis1d", "order1d", "mode", "cval", "truncate", "radius1d"), "1.5")
GaussianGradientMagnitude = _module("GaussianGradientMagnitude", F.gaussian_gradient_magnitude,
                                    (("sigma", _R),) + _GAUSS,
                                    ("sigma", "mode", "cval", "truncate", "radius", "axes"), "1.0")
GaussianLaplace = _module("GaussianLaplace", F.gaussian_laplace, (("sigma", _R),) + _GAUSS,
                          ("sigma", "mode", "cval", "truncate", "radius", "axes"), "1.0")
UniformFilter = _module("UniformFilter", F.uniform_filter, (("size", 3),) + _COMMON[:2] + (("origin", 0),
                                                                                           ("axes", None)),
                        ("size", "mode", "cval", "origin", "axes"), "size=5")
SelectiveBlur = _module(
    "SelectiveBlur", F.selective_blur,
    (("threshold", 0.0), ("sigma", None), ("weights", None), ("normalized", False), ("keep_border", False),
     ("mode", "reflect"), ("cval", 0.0), ("truncate", 4.0), ("axes", None)),
    ("threshold", "sigma", "blur_weights", "blur_normalized", "keep_border", "mode", "cval", "truncate", "axes"),
    "0.5", mask=True)
_RANK = (("footprint", None), ("mode", "reflect"), ("cval", 0.0), ("origin", 0), ("axes", None))
_RANK_DOCS = ("size_foot", "mode", "cval", "origin", "axes")
MedianFilter = _module("MedianFilter", F.median_filter, (("size", 3),) + _RANK, _RANK_DOCS, "size=3")
MinimumFilter = _module("MinimumFilter", F.minimum_filter, (("size", 3),) + _RANK, _RANK_DOCS, "size=3")
MaximumFilter = _module("MaximumFilter", F.maximum_filter, (("size", 3),) + _RANK, _RANK_DOCS, "size=3")
PercentileFilter = _module("PercentileFilter", F.percentile_filter, (("percentile", _R), ("size", 3)) + _RANK,
                           ("percentile",) + _RANK_DOCS, "25, size=3")
UnsharpMask = _module("UnsharpMask", F.unsharp_mask,
                      (("sigma", 1.0), ("amount", 1.0), ("mode", "reflect"), ("cval", 0.0), ("truncate", 4.0),
                       ("axes", None)), ("sigma", "amount", "mode", "cval", "truncate", "axes"), "1.0, amount=0.5")
DifferenceOfGaussians = _module(
    "DifferenceOfGaussians", F.difference_of_gaussians,
    (("low_sigma", _R), ("high_sigma", None), ("mode", "nearest"), ("cval", 0.0), ("truncate", 4.0),
     ("axes", None)), ("low_sigma", "mode", "cval", "truncate", "axes"), "1.0")

# issue 12: Canny edges (not differentiable: a bool map)
Canny = _module(
    "Canny", F.canny,
    (("sigma", 1.0), ("low_threshold", None), ("high_threshold", None), ("use_quantiles", False),
     ("mode", "constant"), ("cval", 0.0)),
    ("sigma", "mode", "cval"), "sigma=2.0", mask=True,
    forward_docs=dict(input=_CANNY_INPUT, mask=_CANNY_MASK,
                      returns="A bool tensor shaped ``(..., H, W)`` on ``input``'s device: True on edges."))
Canny.__doc__ = fill("""Module form of :func:`torchfilters.canny`: ``(..., H, W)`` -> bool ``(..., H, W)``.

``forward(input, mask=None)`` returns ``torchfilters.canny(input, ..., mask=mask)`` with this
module's arguments (the default engine).  No parameters and no gradient: edges are a bool map.

Args:
    sigma: the Gaussian's standard deviation in pixels (a number or ``(sigma_y, sigma_x)``).
        Default 1.0.
    low_threshold: the hysteresis' low bound, in the input's own range (0..255 for a ``uint8``
        image), or a quantile; None: 0.1 of the converted ``[0, 1]`` range.
    high_threshold: the high bound, likewise; None: 0.2.
    use_quantiles: thresholds as per-slice quantiles of the gradient magnitude.  Default False.
    %(mode)s
        Default ``'constant'``.
    %(cval)s

Example:
    >>> import torch, torchfilters as tf
    >>> m = tf.nn.Canny(sigma=2.0)
    >>> m(torch.rand(2, 1, 8, 8)).dtype
    torch.bool
""")
