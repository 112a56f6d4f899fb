"""Public filters on tensors shaped ``(..., H, W)``.

Every function filters the last two axes -- ``H`` (axis -2, y, rows) and
``W`` (axis -1, x, columns) -- and treats leading axes as independent images.
Semantics are ``scipy.ndimage``'s, applied to each ``(H, W)`` slice: the same
mode names and meanings, any kernel radius on any image size (a radius larger
than the image and 1x1 images included).

Gradients with respect to the input are exact (``gradcheck`` in float64)
and finite everywhere; filter weights are constants.

Each argument is described once, in :mod:`torchfilters._docs`, and filled
into every docstring that takes it (SciPy's ``docfiller``).  The ones every
op shares:

Args:
    %(input)s
    %(mode)s
    %(cval)s
    %(out)s
    %(backend)s
"""

from __future__ import annotations

import functools
import math
from numbers import Integral, Real
from typing import Optional, Sequence, Union

import torch
import torch.autograd.forward_ad as _fwad
from torch import Tensor

from . import _docs, _ops, _spec, kernels
from ._docs import docfiller
from ._spec import BlurSpec, FilterSpec
from ._validate import (
    canonical_mode,
    check_axis,
    check_bool,
    check_cval,
    check_dense,
    check_has_values,
    check_input,
    check_out,
    check_real,
    pair,
    type_name,
)
from .backends import check_backend, resolve

__doc__ = _docs.fill(__doc__)

__all__ = [
    "correlate",
    "convolve",
    "correlate1d",
    "convolve1d",
    "derivative",
    "gradient",
    "gradient_magnitude",
    "gradient_direction",
    "sobel",
    "prewitt",
    "scharr",
    "gaussian_filter",
    "gaussian_gradient_magnitude",
    "selective_blur",
]

Number = Union[int, float]


# --------------------------------------------------------------------- helpers


def _eager_engine(x: Tensor, backend: str):
    """The engine to call directly, or None when the call must go through the custom op.

    A ``torch.library`` custom op costs ~7 us per call on top of the kernel
    (about 5x a small ``torch.add``).  When nothing needs the dispatcher --
    no autograd graph to record, no ``torch.compile`` tracing, no tensor
    subclass or dispatch mode (FakeTensor, functorch) -- the eager call goes
    straight to the same engine the op's device kernel would run.
    """
    if (
        (x.requires_grad and torch.is_grad_enabled())
        or _fwad._current_level >= 0
        or torch.compiler.is_compiling()
        or type(x) is not Tensor
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._functorch.is_functorch_wrapped_tensor(x)
    ):
        return None
    return resolve(backend, x.device, x.dtype)


@_spec.cached
def _filter_text(mode: str, cval: float, epilogue: str, recipes: tuple, cval_negative: bool = False) -> str:
    """The spec string of a filter; a constant for ``torch.compile`` (no float tracing)."""
    return _spec.encode(FilterSpec(mode, cval, epilogue, tuple(_stencil(r) for r in recipes)))


@_spec.cached
def _blur_text(mode, cval, normalized, keep_border, recipe, cval_negative=False) -> str:
    return _spec.encode(BlurSpec(mode, cval, normalized, keep_border, _stencil(recipe)))


def _signbit(v: float) -> bool:
    # -0.0 == 0.0 and both hash alike: the cache keys carry the sign (SciPy keeps it)
    return math.copysign(1.0, v) < 0


def _stencil(recipe: tuple):
    """Build a stencil from a hashable recipe: ``(kind, *params)``."""
    kind = recipe[0]
    if kind == "deriv":
        return _derivative_stencil(*recipe[1:])
    if kind == "gauss":
        return _gaussian_stencil(*recipe[1:])
    if kind == "dense":
        return _spec.dense(*recipe[1:])
    if kind == "sep1":
        return _spec.sep(recipe[1:])
    if kind == "binomial":
        return _BINOMIAL
    raise AssertionError(recipe)


def _refuse_forward_ad(x: Tensor) -> None:
    """Forward-mode AD has no rule here: fail loudly instead of returning a zero tangent."""
    dual = _fwad._current_level >= 0 and _fwad.unpack_dual(x).tangent is not None
    if not dual and torch._C._functorch.is_functorch_wrapped_tensor(x):
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        dual = any(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())
    if dual:
        raise NotImplementedError(
            "torchfilters ops support reverse-mode autograd (Tensor.backward, torch.autograd.grad) "
            "but not forward-mode AD (forward_ad dual tensors, torch.func.jvp/jacfwd)"
        )


def _filter(x: Tensor, mode: str, cval: float, epilogue: str, recipes: tuple, out, backend) -> Tensor:
    """Run the filter that ``recipes`` + ``epilogue`` describe (the spec text is built once, cached)."""
    return _run_filter(x, _filter_text(mode, cval, epilogue, recipes, _signbit(cval)), out, backend)


def _gradient_pair(input, operator, mode, cval, normalized, epilogue, out, backend) -> Tensor:
    """Both derivatives (d/dy, d/dx) of ``operator``, combined by ``epilogue``."""
    x, mode, cval = _prep(input, mode, cval)
    op = kernels.check_operator(operator)
    n = check_bool(normalized, "normalized")
    return _filter(x, mode, cval, epilogue, (("deriv", op, -2, n), ("deriv", op, -1, n)), out, backend)


def _run_filter(x: Tensor, text: str, out: Optional[Tensor], backend) -> Tensor:
    backend = check_backend(backend)
    spec = _spec.decode(text)
    if out is not None:
        check_out(out, spec.out_shape(x.shape), x.dtype, x.device)
        _no_grad_out(x)
    eng = _eager_engine(x, backend)
    if eng is not None:
        if out is None:
            return eng.filter_forward(x, spec)
        _ops._write(out, (x,), lambda o: eng.filter_forward(x, spec, out=o))
        return out
    if not torch.compiler.is_compiling():
        _refuse_forward_ad(x)
    if out is None:
        return _ops.filter_op(x, text, backend)
    _ops.filter_out_op(x, text, backend, out)
    return out


def _no_grad_out(*tensors):
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(
            "out= does not support automatic differentiation: the input requires grad; "
            "call without out= (or under torch.no_grad())"
        )


def _nested_floats(obj, depth: int, name: str):
    """Nested sequences -> nested tuples of floats, ``depth`` levels deep (plain Python,
    so ``torch.compile`` traces it as constants)."""
    if depth == 0:
        if hasattr(obj, "__len__") and not isinstance(obj, (str, bytes)):
            raise ValueError(f"{name} has more dimensions than expected")
        if isinstance(obj, bool) or not isinstance(obj, Real):
            raise TypeError(f"{name} must hold real numbers; got {type_name(obj)}")
        return float(obj)
    if isinstance(obj, (str, bytes)) or not hasattr(obj, "__len__"):
        raise ValueError(f"{name} must be {depth}-D more than it is; got {type_name(obj)}")
    return tuple(_nested_floats(o, depth - 1, name) for o in obj)


def _weights_tuple(weights, ndim: int, name: str = "weights"):
    """Validate filter weights; return nested tuples of floats (``ndim`` levels)."""
    if isinstance(weights, Tensor):
        check_has_values(weights, name)  # before anything reads its values
        if weights.requires_grad:
            raise ValueError(
                f"{name} requires grad, but torchfilters treats filter weights as constants "
                f"(gradients flow to the input only); pass {name}.detach()"
            )
        if weights.dtype == torch.bool or weights.dtype.is_complex:
            raise TypeError(f"{name} must be real; got dtype {weights.dtype}")
        if weights.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D; got shape {tuple(weights.shape)}")
        weights = weights.detach().to("cpu", torch.float64).tolist()
    elif hasattr(weights, "__array__") and not isinstance(weights, (list, tuple)):
        weights = weights.__array__().tolist()  # NumPy arrays and friends
    if isinstance(weights, Real) and not isinstance(weights, bool):
        raise ValueError(f"{name} must be {ndim}-D; got the scalar {weights!r}")
    if not isinstance(weights, (list, tuple)):
        raise TypeError(f"{name} must be a tensor or a nested sequence of numbers; got {type_name(weights)}")
    try:
        w = _nested_floats(weights, ndim, name)
    except ValueError:
        raise ValueError(f"{name} must be {ndim}-D; got {weights!r:.80}") from None
    if len(w) == 0 or (ndim == 2 and any(len(r) == 0 for r in w)):
        raise ValueError(f"{name} must not be empty")
    if ndim == 2 and any(len(r) != len(w[0]) for r in w):
        raise ValueError(f"{name} must be rectangular; got rows of lengths {[len(r) for r in w]}")
    return w


def _check_origin(origin, k: int, name: str = "origin") -> int:
    if isinstance(origin, bool) or not isinstance(origin, Integral):
        raise TypeError(f"{name} must be an int; got {type_name(origin)}")
    origin = int(origin)
    if origin < -(k // 2) or origin > (k - 1) // 2:
        raise ValueError(
            f"invalid {name}={origin} for a kernel of size {k}: it must satisfy "
            f"-(size // 2) <= {name} <= (size - 1) // 2, i.e. {-(k // 2)} .. {(k - 1) // 2}"
        )
    return origin


def _prep(input, mode, cval):
    return check_input(input), canonical_mode(mode), check_cval(cval)


# ------------------------------------------------------------ correlate family


def _correlate2d(input, weights, mode, cval, origin, out, backend, flip: bool):
    x, mode, cval = _prep(input, mode, cval)
    w = _weights_tuple(weights, 2)
    # check the caller's origin (type and range: the same for both) before flipping
    kh, kw = len(w), len(w[0])
    origins = [_check_origin(o, k) for o, k in zip(pair(origin, "origin"), (kh, kw))]
    if flip:  # scipy.ndimage.convolve: flip the kernel, mirror the origin
        w = tuple(row[::-1] for row in w[::-1])
        for i, k in enumerate((kh, kw)):
            origins[i] = -origins[i]
            if not k & 1:
                origins[i] -= 1
    oy = _check_origin(origins[0], kh)
    ox = _check_origin(origins[1], kw)
    recipe = ("dense", w, (_spec.centered_lo(kh, oy), _spec.centered_lo(kw, ox)))
    return _filter(x, mode, cval, "stack", (recipe,), out, backend)


@docfiller(scipy="``scipy.ndimage.correlate(x, weights, mode=mode, cval=cval,\norigin=origin)``")
def correlate(
    input: Tensor,
    weights,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: Union[int, Sequence[int]] = 0,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Correlate each ``(H, W)`` slice with a 2-D kernel (the kernel is not flipped).

    ``y[i, j] = sum_{a, b} weights[a, b] * x[i + a - kh//2 - oy, j + b - kw//2 - ox]``
    with out-of-image samples given by ``mode``.

    Args:
        %(input)s
        %(weights2d)s
        %(mode)s
        %(cval)s
        %(origin)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``weights`` not a tensor, NumPy array or nested sequence
            of real numbers (a bool or complex dtype too), or sparse;
            ``origin`` not an int.
        ValueError: ``weights`` not 2-D, empty, ragged, requiring grad or a
            meta tensor; ``origin`` out of range or not an int or pair.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.arange(5.0).view(1, 5)
        >>> tf.correlate(x, [[1.0, 2.0, 3.0]], mode="constant")
        tensor([[ 3.,  8., 14., 20., 11.]])
    """
    return _correlate2d(input, weights, mode, cval, origin, out, backend, flip=False)


@docfiller(scipy="``scipy.ndimage.convolve(x, weights, mode=mode, cval=cval,\norigin=origin)``")
def convolve(
    input: Tensor,
    weights,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: Union[int, Sequence[int]] = 0,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Convolve each ``(H, W)`` slice with a 2-D kernel (the kernel is flipped).

    SciPy's definition: the kernel is flipped on both axes and ``origin``
    mirrored (even sizes shifted by one, as SciPy does), then correlated as
    in :func:`correlate`.

    Args:
        %(input)s
        %(weights2d)s
        %(mode)s
        %(cval)s
        %(origin)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``weights`` not a tensor, NumPy array or nested sequence
            of real numbers (a bool or complex dtype too), or sparse;
            ``origin`` not an int.
        ValueError: ``weights`` not 2-D, empty, ragged, requiring grad or a
            meta tensor; ``origin`` out of range or not an int or pair.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]])
        >>> tf.convolve(x, [[1.0, 2.0, 3.0]], mode="constant")
        tensor([[0., 1., 2., 3., 0.]])
    """
    return _correlate2d(input, weights, mode, cval, origin, out, backend, flip=True)


def _correlate1d(input, weights, axis, mode, cval, origin, out, backend, flip: bool):
    x, mode, cval = _prep(input, mode, cval)
    axis = check_axis(axis)
    w = _weights_tuple(weights, 1)
    if isinstance(origin, bool) or not isinstance(origin, Integral):
        raise TypeError(f"origin must be an int; got {type_name(origin)}")
    origin = int(origin)
    if flip:  # scipy.ndimage.convolve1d
        w = w[::-1]
        origin = -origin
        if not len(w) & 1:
            origin -= 1
    k = len(w)
    origin = _check_origin(origin, k)
    recipe = ("sep1", axis, _spec.centered_lo(k, origin), w)
    return _filter(x, mode, cval, "stack", (recipe,), out, backend)


@docfiller(scipy="``scipy.ndimage.correlate1d(x, weights, axis, mode=mode,\ncval=cval, origin=origin)``")
def correlate1d(
    input: Tensor,
    weights,
    axis: int = -1,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int = 0,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Correlate along one axis (``-1``: x/W, ``-2``: y/H) with 1-D ``weights``.

    ``y[..., i] = sum_a weights[a] * x[..., i + a - k//2 - origin]`` along
    ``axis``, with out-of-image samples given by ``mode``.

    Args:
        %(input)s
        %(weights1d)s
        %(axis)s
        %(mode)s
        %(cval)s
        %(origin1d)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``weights`` not a tensor, NumPy array or sequence of real
            numbers, or sparse; ``axis`` or ``origin`` not an int.
        ValueError: ``axis`` other than -1/-2; ``weights`` not 1-D, empty,
            requiring grad or a meta tensor; ``origin`` out of range.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]])
        >>> tf.correlate1d(x, [1.0, 2.0, 3.0], mode="constant")
        tensor([[0., 3., 2., 1., 0.]])
    """
    return _correlate1d(input, weights, axis, mode, cval, origin, out, backend, flip=False)


@docfiller(scipy="``scipy.ndimage.convolve1d(x, weights, axis, mode=mode,\ncval=cval, origin=origin)``")
def convolve1d(
    input: Tensor,
    weights,
    axis: int = -1,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int = 0,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Convolve along one axis with 1-D ``weights`` (flipped).

    SciPy's definition: ``weights`` reversed and ``origin`` mirrored (even
    lengths shifted by one), then correlated as in :func:`correlate1d`.

    Args:
        %(input)s
        %(weights1d)s
        %(axis)s
        %(mode)s
        %(cval)s
        %(origin1d)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``weights`` not a tensor, NumPy array or sequence of real
            numbers, or sparse; ``axis`` or ``origin`` not an int.
        ValueError: ``axis`` other than -1/-2; ``weights`` not 1-D, empty,
            requiring grad or a meta tensor; ``origin`` out of range.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]])
        >>> tf.convolve1d(x, [1.0, 2.0, 3.0], mode="constant")
        tensor([[0., 1., 2., 3., 0.]])
    """
    return _correlate1d(input, weights, axis, mode, cval, origin, out, backend, flip=True)


# ----------------------------------------------------------------- derivatives


def _derivative_stencil(operator: str, axis: int, normalized: bool):
    deriv, smooth = kernels.derivative_weights(operator)
    passes = [[axis, -(len(deriv) // 2), deriv]]
    if smooth != (1.0,):  # a 1-tap unit pass is the identity in every mode
        passes.append([-1 - (axis + 2), -(len(smooth) // 2), smooth])  # the other axis
    if normalized:
        # divide the *result*: scale the last pass, so that in constant mode the
        # cval padding of the intermediate is divided too (normalized == plain / div)
        div = sum(abs(d) for d in deriv) * sum(smooth)
        passes[-1][2] = tuple(w / div for w in passes[-1][2])
    return _spec.sep(*passes)


@docfiller(
    scipy=(
        "``scipy.ndimage.sobel(x, axis, mode=mode, cval=cval)`` for\n"
        "``operator='sobel'`` (``prewitt`` likewise) and, for every operator,\n"
        "``correlate1d(correlate1d(x, [-1, 0, 1], axis, mode=mode, cval=cval),\n"
        "smooth, other_axis, mode=mode, cval=cval)`` (divided by the divisor\n"
        "with ``normalized=True``)"
    ),
)
def derivative(
    input: Tensor,
    axis: int = -1,
    *,
    operator: str = "central",
    mode: str = "reflect",
    cval: float = 0.0,
    normalized: bool = False,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """First derivative along ``axis`` (``-1``: d/dx along W; ``-2``: d/dy along H).

    Positive where intensity grows along the axis; the derivative is taken
    first, then the smoothing (SciPy's order, which matters only for
    ``mode='constant'`` with ``cval != 0``).  Unnormalised by default (equals
    ``scipy.ndimage.sobel``/``prewitt``); ``normalized=True`` divides by
    ``sum|deriv| * sum(smooth)`` -- 2 (central), 8 (sobel), 32 (scharr),
    6 (prewitt) -- so a unit ramp has slope 1.

    Args:
        %(input)s
        %(axis)s
        %(operator)s
        %(mode)s
        %(cval)s
        %(normalized)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``operator`` not a str; ``axis`` not an int; ``normalized``
            not a bool.
        ValueError: unknown ``operator``; ``axis`` other than -1/-2.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[1, 2, 3, 4, 4, 3, 2, 1]], dtype=torch.uint8)
        >>> tf.derivative(x)
        tensor([[ 1.,  2.,  2.,  1., -1., -2., -2., -1.]])
    """
    x, mode, cval = _prep(input, mode, cval)
    recipe = ("deriv", kernels.check_operator(operator), check_axis(axis), check_bool(normalized, "normalized"))
    return _filter(x, mode, cval, "stack", (recipe,), out, backend)


@docfiller(
    out_shape="``(..., 2, H, W)`` (index 0: d/dy, 1: d/dx)",
    scipy=(
        "``numpy.stack([scipy.ndimage.sobel(x, 0, mode=mode, cval=cval),\n"
        "scipy.ndimage.sobel(x, 1, mode=mode, cval=cval)])`` for\n"
        "``operator='sobel'`` (the two derivatives of :func:`derivative` for\n"
        "every operator)"
    ),
)
def gradient(
    input: Tensor,
    *,
    operator: str = "central",
    mode: str = "reflect",
    cval: float = 0.0,
    normalized: bool = False,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Both derivatives, stacked: returns ``(..., 2, H, W)`` with index 0 = d/dy, 1 = d/dx.

    The two derivatives of :func:`derivative` (``axis=-2`` and ``axis=-1``)
    in one fused pass.

    Args:
        %(input)s
        %(operator)s
        %(mode)s
        %(cval)s
        %(normalized)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``operator`` not a str; ``normalized`` not a bool.
        ValueError: unknown ``operator``.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.arange(5.0).repeat(5, 1)       # f[i, j] = j
        >>> tf.gradient(x, operator="sobel", normalized=True)[..., 1, 2, 2]
        tensor(1.)
    """
    return _gradient_pair(input, operator, mode, cval, normalized, "stack", out, backend)


@docfiller(
    scipy=(
        "``scipy.ndimage.generic_gradient_magnitude(x, scipy.ndimage.sobel,\n"
        "mode=mode, cval=cval)`` for ``operator='sobel'`` (``prewitt``\n"
        "likewise; ``numpy.hypot`` of the two derivatives of :func:`derivative`\n"
        "for every operator)"
    ),
)
def gradient_magnitude(
    input: Tensor,
    *,
    operator: str = "central",
    mode: str = "reflect",
    cval: float = 0.0,
    normalized: bool = False,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Gradient magnitude ``sqrt((d/dy)^2 + (d/dx)^2)`` in one fused pass.

    The forward is the exact square root (no epsilon).  Its gradient is
    ``g / |g|`` pushed back through the derivative stencils where ``|g| > 0``
    and **0 where** ``|g| = 0`` (plain autograd of ``sqrt`` gives NaN on flat
    regions).

    Args:
        %(input)s
        %(operator)s
        %(mode)s
        %(cval)s
        %(normalized)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``operator`` not a str; ``normalized`` not a bool.
        ValueError: unknown ``operator``.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.full((1, 1, 5, 5), 0.5, requires_grad=True)
        >>> y = tf.gradient_magnitude(x, operator="sobel")
        >>> y.sum().backward()
        >>> float(y.abs().max()), float(x.grad.abs().max())
        (0.0, 0.0)
    """
    return _gradient_pair(input, operator, mode, cval, normalized, "magnitude", out, backend)


@docfiller(
    scipy=(
        "``numpy.arctan2(scipy.ndimage.sobel(x, 0, mode=mode, cval=cval),\n"
        "scipy.ndimage.sobel(x, 1, mode=mode, cval=cval))`` for\n"
        "``operator='sobel'`` (the two derivatives of :func:`derivative` for\n"
        "every operator)"
    ),
)
def gradient_direction(
    input: Tensor,
    *,
    operator: str = "central",
    mode: str = "reflect",
    cval: float = 0.0,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Gradient direction ``atan2(d/dy, d/dx)`` in radians, in ``[-pi, pi]``.

    The y axis points down (rows grow downwards), so a ramp increasing with
    the row index gives ``+pi/2``.  Where both derivatives are 0 the value is
    ``atan2(0, 0)`` (0, or +-pi for signed zeros, as :func:`torch.atan2`) and
    the gradient is 0.  There is no ``normalized``: the divisor cancels.

    Args:
        %(input)s
        %(operator)s
        %(mode)s
        %(cval)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``operator`` not a str.
        ValueError: unknown ``operator``.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.arange(5.0).repeat(5, 1).T      # grows along y
        >>> float(tf.gradient_direction(x, operator="sobel")[2, 2])
        1.5707963705062866
    """
    return _gradient_pair(input, operator, mode, cval, False, "direction", out, backend)


def _named_operator(operator: str):
    def fn(
        input: Tensor,
        axis: int = -1,
        *,
        mode: str = "reflect",
        cval: float = 0.0,
        out: Optional[Tensor] = None,
        backend: Optional[str] = None,
    ) -> Tensor:
        return derivative(input, axis, operator=operator, mode=mode, cval=cval, out=out, backend=backend)

    fn.__name__ = fn.__qualname__ = operator
    return fn


sobel = _named_operator("sobel")
sobel.__doc__ = _docs.fill(
    """Sobel derivative along ``axis``: ``[-1, 0, 1]`` along it, ``[1, 2, 1]`` across.

    :func:`derivative` with ``operator='sobel'``, unnormalised (pass
    ``normalized=True`` there to divide by 8).

    Args:
        %(input)s
        %(axis)s
        %(mode)s
        %(cval)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``axis`` not an int.
        ValueError: ``axis`` other than -1/-2.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.sobel(torch.arange(5.0).repeat(5, 1))[0]
        tensor([4., 8., 8., 8., 4.])
    """,
    scipy="``scipy.ndimage.sobel(x, axis=axis, mode=mode, cval=cval)``",
)
prewitt = _named_operator("prewitt")
prewitt.__doc__ = _docs.fill(
    """Prewitt derivative along ``axis``: ``[-1, 0, 1]`` along it, ``[1, 1, 1]`` across.

    :func:`derivative` with ``operator='prewitt'``, unnormalised (pass
    ``normalized=True`` there to divide by 6).

    Args:
        %(input)s
        %(axis)s
        %(mode)s
        %(cval)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``axis`` not an int.
        ValueError: ``axis`` other than -1/-2.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.prewitt(torch.arange(5.0).repeat(5, 1))[0]
        tensor([3., 6., 6., 6., 3.])
    """,
    scipy="``scipy.ndimage.prewitt(x, axis=axis, mode=mode, cval=cval)``",
)
scharr = _named_operator("scharr")
scharr.__doc__ = _docs.fill(
    """Scharr derivative along ``axis``: ``[-1, 0, 1]`` along it, ``[3, 10, 3]`` across.

    The unnormalised Scharr operator (Scharr 2000; as OpenCV's ``Scharr``, but
    with SciPy's boundary modes): :func:`derivative` with
    ``operator='scharr'`` (pass ``normalized=True`` there to divide by 32).

    Args:
        %(input)s
        %(axis)s
        %(mode)s
        %(cval)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``axis`` not an int.
        ValueError: ``axis`` other than -1/-2.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.scharr(torch.arange(5.0).repeat(5, 1))[0]
        tensor([16., 32., 32., 32., 16.])
    """,
    scipy=(
        "``scipy.ndimage.correlate1d(scipy.ndimage.correlate1d(x, [-1, 0, 1],\n"
        "axis, mode=mode, cval=cval), [3, 10, 3], other_axis, mode=mode,\n"
        "cval=cval)`` (SciPy has no ``scharr``)"
    ),
)


# -------------------------------------------------------------------- Gaussian


def _check_sigma(sigma):
    out = []
    for s in pair(sigma, "sigma"):
        s = check_real(s, "sigma")
        if not (s >= 0 and math.isfinite(s)):
            raise ValueError(f"sigma must be finite and >= 0 (in pixels); got {s}")
        out.append(s)
    return tuple(out)


def _check_order(order):
    out = []
    for o in pair(order, "order"):
        if isinstance(o, bool) or not isinstance(o, Integral):
            raise TypeError(f"order must be an int >= 0 or a pair of them; got {o!r}")
        if o < 0:
            raise ValueError(f"order must be >= 0 (0: smooth, 1: first derivative, 2: second); got {o}")
        out.append(int(o))
    return tuple(out)


_MAX_RADIUS = 1 << 20


def _gaussian_radii(sigmas, truncate, radius):
    truncate = check_real(truncate, "truncate", allow_inf=False)
    if truncate < 0:
        raise ValueError(f"truncate must be >= 0; got {truncate}")
    if radius is None:
        radii = tuple(kernels.gaussian_radius(s, truncate) for s in sigmas)
        if max(radii) > _MAX_RADIUS:
            raise ValueError(
                f"sigma={sigmas} with truncate={truncate} gives a kernel radius of {max(radii):.3g}; "
                f"the largest supported is {_MAX_RADIUS} (lower sigma or truncate, or pass radius=)"
            )
        return radii
    radii = []
    for r in pair(radius, "radius"):
        if isinstance(r, bool) or not isinstance(r, Integral):
            raise TypeError(f"radius must be a non-negative int or a pair of them; got {r!r}")
        if r < 0:
            raise ValueError(f"radius must be a non-negative int or a pair of them; got {r!r}")
        if r > _MAX_RADIUS:
            raise ValueError(f"radius={r} is larger than the largest supported, {_MAX_RADIUS}")
        radii.append(int(r))
    return tuple(radii)


def _gaussian_stencil(sigmas, orders, radii):
    passes = []
    taps = {}  # both axes alike: one kernel (radius=2**20: 2M taps each)
    for axis, s, o, r in zip((-2, -1), sigmas, orders, radii):
        if s > 1e-15:  # SciPy skips axes with sigma ~ 0
            if (s, o, r) not in taps:
                taps[s, o, r] = kernels.gaussian_kernel1d(s, o, r)
            passes.append((axis, -r, taps[s, o, r]))
    return _spec.sep(*passes)


@docfiller(
    scipy=(
        "``scipy.ndimage.gaussian_filter(x, sigma, order=order, mode=mode,\n"
        "cval=cval, truncate=truncate, radius=radius)``; on the whole\n"
        "``(..., H, W)`` array, ``axes=(-2, -1)``"
    ),
)
def gaussian_filter(
    input: Tensor,
    sigma: Union[Number, Sequence[Number]],
    *,
    order: Union[int, Sequence[int]] = 0,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    radius: Union[None, int, Sequence[int]] = None,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Gaussian filter of each ``(H, W)`` slice: two 1-D passes, along H then W.

    The kernel is SciPy's, normalised to sum 1 (order 0), of ``2 * radius +
    1`` taps per axis.

    Args:
        %(input)s
        %(sigma)s
            ``sigma=0`` on both axes returns a copy of the input.
        %(order)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(radius)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``sigma`` or ``truncate`` not a real number (a bool
            too); ``radius`` not an int.
        ValueError: negative, NaN or infinite ``sigma``; ``sigma`` or
            ``radius`` neither a scalar nor a pair; negative ``radius``;
            negative, NaN or infinite ``truncate``; a kernel radius beyond
            2**20.
        TypeError: ``order`` not an int or a pair of ints.
        ValueError: negative ``order``, or neither a scalar nor a pair.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.gaussian_filter(torch.tensor([[1.0, 2.0, 3.0]]), 2.0)
        tensor([[1.8884, 2.0000, 2.1116]])
    """
    x, mode, cval = _prep(input, mode, cval)
    sigmas = _check_sigma(sigma)
    orders = _check_order(order)
    radii = _gaussian_radii(sigmas, truncate, radius)
    if all(s <= 1e-15 for s in sigmas):  # SciPy filters no axis: a copy
        check_backend(backend)
        if out is None:
            return x.clone(memory_format=torch.contiguous_format)
        check_out(out, x.shape, x.dtype, x.device)
        _no_grad_out(x)
        _ops._write(out, (x,), lambda o: x.clone() if o is None else o.copy_(x))
        return out
    recipe = ("gauss", sigmas, orders, radii)
    return _filter(x, mode, cval, "stack", (recipe,), out, backend)


@docfiller(
    scipy=(
        "``scipy.ndimage.gaussian_gradient_magnitude(x, sigma, mode=mode,\n"
        "cval=cval, truncate=truncate, radius=radius)``"
    ),
)
def gaussian_gradient_magnitude(
    input: Tensor,
    sigma: Union[Number, Sequence[Number]],
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    radius: Union[None, int, Sequence[int]] = None,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Gradient magnitude with Gaussian derivatives, in one fused pass.

    ``sqrt(gaussian_filter(x, sigma, order=(1, 0))**2 + gaussian_filter(x,
    sigma, order=(0, 1))**2)``; its gradient is 0 where the magnitude is 0
    (never NaN).

    Args:
        %(input)s
        %(sigma)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(radius)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``sigma`` or ``truncate`` not a real number (a bool
            too); ``radius`` not an int.
        ValueError: negative, NaN or infinite ``sigma``; ``sigma`` or
            ``radius`` neither a scalar nor a pair; negative ``radius``;
            negative, NaN or infinite ``truncate``; a kernel radius beyond
            2**20.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.arange(9.0).repeat(9, 1)
        >>> round(float(tf.gaussian_gradient_magnitude(x, 1.0)[4, 4]), 4)   # 1 up to truncation
        0.9999
    """
    x, mode, cval = _prep(input, mode, cval)
    sigmas = _check_sigma(sigma)
    radii = _gaussian_radii(sigmas, truncate, radius)
    recipes = (("gauss", sigmas, (1, 0), radii), ("gauss", sigmas, (0, 1), radii))
    return _filter(x, mode, cval, "magnitude", recipes, out, backend)


# -------------------------------------------------------------- selective blur


@docfiller(
    scipy=(
        "``numpy.where(m, blur(x), x)`` (blend) or\n"
        "``numpy.where(m & (den > 0), blur(m * x) / den, x)`` with ``den = blur(m)``,\n"
        "both blurred with ``cval=0`` (normalized), where ``blur`` is\n"
        "``scipy.ndimage.correlate(., weights, mode=mode, cval=cval)`` (the\n"
        "binomial by default) or ``scipy.ndimage.gaussian_filter(., sigma,\n"
        "mode=mode, cval=cval, truncate=truncate)``; with ``keep_border`` only\n"
        "the pixels inside the band are written"
    ),
)
def selective_blur(
    input: Tensor,
    threshold: float = 0.0,
    *,
    mask: Optional[Tensor] = None,
    sigma: Union[None, Number, Sequence[Number]] = None,
    weights=None,
    normalized: bool = False,
    keep_border: bool = False,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    out: Optional[Tensor] = None,
    backend: Optional[str] = None,
) -> Tensor:
    """Blur only the pixels that pass a test, in one fused pass (and one backward).

    The selected pixels are ``m = input >= threshold`` or, when given, the
    boolean ``mask`` (broadcastable to ``input``; ``threshold`` is then
    ignored).  The blur kernel is ``weights`` (2-D, centred), a Gaussian of
    ``sigma`` (with ``truncate``), or by default the 3x3 binomial
    ``[1, 2, 1]^T [1, 2, 1] / 16``.

    * ``normalized=False`` (blend): ``y = where(m, blur(x), x)``.  The blur
      reads every neighbour's original value.  Gradient:
      ``dL/dx = blur^T(m * g) + (1 - m) * g``.
    * ``normalized=True``: inside the mask, the weighted mean over the *masked*
      neighbours only, ``blur(m * x) / blur(m)``, so excluded outliers never
      leak in; pixels with no masked neighbour (``blur(m) = 0``) are kept.
      The image and the mask are both extended by ``mode``; in ``constant``
      mode nothing outside the image counts as masked, so ``cval`` is unused.
      Weights must be non-negative.  Gradients are finite everywhere.

    The mask carries no gradient.  ``keep_border=True`` leaves untouched every
    pixel whose kernel footprint leaves the image (a band of the kernel
    radius).

    Args:
        %(input)s
        %(threshold)s
        %(mask)s
        %(sigma)s
            Default None (the kernel is ``weights``, or the binomial);
            ``sigma=0`` keeps every pixel.
        %(blur_weights)s
        %(blur_normalized)s
        %(keep_border)s
        %(mode)s
            With ``normalized=True`` the mask is extended by ``mode`` too,
            and ``'constant'`` counts nothing outside the image as masked.
        %(cval)s
        %(truncate)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``mask`` not a bool tensor, or sparse; ``threshold`` or
            ``sigma`` not a real number; ``weights`` of a bad type;
            ``normalized``/``keep_border`` not a bool.
        ValueError: both ``sigma`` and ``weights``; ``mask`` not broadcastable
            to ``input``, on another device or a meta tensor; NaN
            ``threshold``; negative ``weights`` with ``normalized=True``; bad
            ``sigma``/``truncate`` (as :func:`gaussian_filter`) or ``weights``
            (as :func:`correlate`).
        %(raises)s

    %(matches)s

    Example (the GAN case):
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[-1.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]])
        >>> tf.selective_blur(x, 0.0)[1, 1]   # the -1 leaks into its neighbours
        tensor(1.8125)
        >>> tf.selective_blur(x, 0.0, normalized=True)[1, 1]   # ... but not here
        tensor(2.)
    """
    x, mode, cval = _prep(input, mode, cval)
    threshold = check_real(threshold, "threshold")
    normalized = check_bool(normalized, "normalized")
    keep_border = check_bool(keep_border, "keep_border")
    if sigma is not None and weights is not None:
        raise ValueError("give at most one of sigma and weights")
    if weights is not None:
        w = _weights_tuple(weights, 2)
        if normalized and any(v < 0 for row in w for v in row):
            raise ValueError("normalized=True needs non-negative weights (a weighted mean)")
        kh, kw = len(w), len(w[0])
        recipe = ("dense", w, (_spec.centered_lo(kh), _spec.centered_lo(kw)))
    elif sigma is not None:
        sigmas = _check_sigma(sigma)
        recipe = ("gauss", sigmas, (0, 0), _gaussian_radii(sigmas, truncate, None))
    else:
        recipe = ("binomial",)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a bool torch.Tensor; got {type_name(mask)}")
        check_dense(mask, "mask")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must have dtype torch.bool; got {mask.dtype} (use mask.bool() or mask != 0)")
        try:
            shape = torch.broadcast_shapes(mask.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to input of shape {tuple(x.shape)}"
            )
        if mask.device != x.device:
            if mask.is_meta:
                check_has_values(mask, "mask")  # the ValueError: no values
            raise ValueError(f"mask is on {mask.device} but input is on {x.device}")
        mask = mask.expand(x.shape)
    text = _blur_text(mode, cval, normalized, keep_border, recipe, _signbit(cval))
    spec = _spec.decode(text)
    backend = check_backend(backend)
    if out is not None:
        check_out(out, x.shape, x.dtype, x.device)
        _no_grad_out(x)
    eng = _eager_engine(x, backend)
    if eng is not None:
        if out is None:
            return eng.blur_forward(x, mask, spec, threshold)
        _ops._write(out, (x, mask), lambda o: eng.blur_forward(x, mask, spec, threshold, out=o))
        return out
    if not torch.compiler.is_compiling():
        _refuse_forward_ad(x)
    if out is None:
        return _ops.blur_op(x, mask, text, threshold, backend)
    _ops.blur_out_op(x, mask, text, threshold, backend, out)
    return out


_BINOMIAL = _spec.sep((-2, -1, (0.25, 0.5, 0.25)), (-1, -1, (0.25, 0.5, 0.25)))
