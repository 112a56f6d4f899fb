"""Derivatives: central differences, Sobel, Prewitt, Scharr; gradients; the Laplacian."""

from __future__ import annotations

from torch import Tensor

from .. import _docs, _spec, kernels
from .._docs import docfiller
from .._validate import check_axis, check_bool, check_out
from ._core import prep, run

__all__ = [
    "derivative",
    "gradient",
    "gradient_direction",
    "gradient_magnitude",
    "laplace",
    "prewitt",
    "scharr",
    "sobel",
]


@_spec.cached
def _recipes(op: str, normalized: bool, sa: tuple) -> tuple:
    """The derivative along each spec axis of ``sa``, smoothed along the others."""
    return tuple(("deriv", op, a, normalized, tuple(sorted(b for b in sa if b != a))) for a in sa)


def _gradients(input, operator, mode, cval, normalized, epilogue, axes, out, backend) -> Tensor:
    """The derivative along each of ``axes`` (their order), combined by ``epilogue``."""
    x, lay, modes, cval = prep(input, mode, cval, axes)
    if epilogue == "direction" and len(lay.axes) != 2:
        raise ValueError(f"gradient_direction needs exactly 2 axes (an angle in a plane); got axes={axes!r}")
    op = kernels.check_operator(operator)
    n = check_bool(normalized, "normalized")
    recipes = _recipes(op, n, lay.spec_axes)
    if epilogue == "stack" and len(recipes) == 1:  # one axis: still a component axis, of 1
        pos = lay.axes[0]
        if out is None:
            return run(x, lay, modes, cval, epilogue, recipes, None, backend).unsqueeze(pos)
        check_out(out, lay.out_shape(x.shape, 1), x.dtype, x.device)
        run(x, lay, modes, cval, epilogue, recipes, out.select(pos, 0), backend)
        return out
    return run(x, lay, modes, cval, epilogue, recipes, out, backend)


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
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """First derivative along ``axis`` (``-1``: d/dx along W; ``-2``: d/dy along H).

    Positive where intensity grows along the axis; the derivative is taken
    first, then the smoothing along every other axis of ``axes``, in
    increasing order (SciPy's order, which matters only for
    ``mode='constant'`` with ``cval != 0``).  SciPy's ``sobel`` has no
    ``axes``: it smooths along every axis of its input, so the result
    equals SciPy's on the sub-array of the chosen axes.  Unnormalised by default (equals
    ``scipy.ndimage.sobel``/``prewitt``); ``normalized=True`` divides by
    ``sum|deriv| * sum(smooth)`` -- 2 (central), 8 (sobel), 32 (scharr),
    6 (prewitt) -- so a unit ramp has slope 1.  It scales the smoothing weights (Prewitt's
    become ``1/6`` rounded, so a result can differ from the unnormalised one divided by 6 in
    the last bit; the powers of two are exact).

    Args:
        %(input)s
        %(axis)s
        %(operator)s
        %(mode)s
        %(cval)s
        %(normalized)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``operator`` not a str; ``axis`` not an int; ``normalized``
            not a bool.
        ValueError: unknown ``operator``; ``axis`` not one of ``axes``.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[1, 2, 3, 4, 4, 3, 2, 1]], dtype=torch.uint8)
        >>> tf.derivative(x)
        tensor([[ 1.,  2.,  2.,  1., -1., -2., -2., -1.]])
    """
    x, lay, modes, cval = prep(input, mode, cval, axes)
    a = check_axis(axis, x.dim())
    if a not in lay.axes:
        raise ValueError(f"axis={axis} is not one of the filtered axes {lay.axes} (pass axes= to include it)")
    op = kernels.check_operator(operator)
    n = check_bool(normalized, "normalized")
    sa = lay.spec_axes
    d = sa[lay.axes.index(a)]
    recipe = ("deriv", op, d, n, tuple(sorted(b for b in sa if b != d)))
    return run(x, lay, modes, cval, "stack", (recipe,), out, backend)


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
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """The derivatives along each axis, stacked: ``(..., 2, H, W)`` with index 0 = d/dy, 1 = d/dx.

    The derivatives of :func:`derivative` along each of ``axes`` (component
    ``i`` along ``axes[i]``), in one fused pass.  Over ``k`` axes the result
    has a component axis of ``k`` just before the first filtered axis:
    ``(..., k, *spatial)``.

    Args:
        %(input)s
        %(operator)s
        %(mode)s
        %(cval)s
        %(normalized)s
        %(axes)s
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
    return _gradients(input, operator, mode, cval, normalized, "stack", axes, out, backend)


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
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Gradient magnitude ``sqrt((d/dy)^2 + (d/dx)^2)`` in one fused pass.

    Over every axis of ``axes`` (``sqrt`` of the sum of the squared
    derivatives of :func:`derivative`).

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
        %(axes)s
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
        >>> float(y.detach().abs().max()), float(x.grad.abs().max())
        (0.0, 0.0)
    """
    return _gradients(input, operator, mode, cval, normalized, "magnitude", axes, out, backend)


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
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Gradient direction ``atan2(d/dy, d/dx)`` in radians, in ``[-pi, pi]``.

    The y axis points down (rows grow downwards), so a ramp increasing with
    the row index gives ``+pi/2``.  Where both derivatives are 0 the value is
    ``atan2(0, 0)`` (0, or +-pi for signed zeros, as :func:`torch.atan2`) and
    the gradient is 0.  There is no ``normalized``: the divisor cancels.
    ``axes`` names the plane: ``atan2(d/d axes[0], d/d axes[1])``.

    Args:
        %(input)s
        %(operator)s
        %(mode)s
        %(cval)s
        %(axes2)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``operator`` not a str.
        ValueError: unknown ``operator``; ``axes`` of other than 2 axes.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.arange(5.0).repeat(5, 1).T      # grows along y
        >>> float(tf.gradient_direction(x, operator="sobel")[2, 2])
        1.5707963705062866
    """
    return _gradients(input, operator, mode, cval, False, "direction", axes, out, backend)




_NAMED = """%(title)s derivative along ``axis``: ``[-1, 0, 1]`` along it, ``%(smooth)s`` across.

:func:`derivative` with ``operator='%(op)s'``, unnormalised (pass
``normalized=True`` there to divide by %(div)s).%(note)s

Args:
    %(input)s
    %(axis)s
    %(mode)s
    %(cval)s
    %(axes)s
    %(out)s
    %(backend)s

Returns:
    %(returns)s

Raises:
    TypeError: ``axis`` not an int.
    ValueError: ``axis`` not one of ``axes``.
    %(raises)s

%(matches)s

Example:
    >>> import torch, torchfilters as tf
    >>> tf.%(op)s(torch.arange(5.0).repeat(5, 1))[0]
    tensor([%(example)s])
"""


def _named_operator(operator: str, smooth: str, div: int, example: str, scipy: str, note: str = ""):
    def fn(
        input: Tensor,
        axis: int = -1,
        *,
        mode: str = "reflect",
        cval: float = 0.0,
        axes=None,
        out: Tensor | None = None,
        backend: str | None = None,
    ) -> Tensor:
        return derivative(input, axis, operator=operator, mode=mode, cval=cval, axes=axes, out=out, backend=backend)

    fn.__name__ = fn.__qualname__ = operator
    fn.__doc__ = _docs.fill(_NAMED, title=operator.capitalize(), smooth=smooth, op=operator, div=str(div),
                            example=example, scipy=scipy, note=note)
    return fn


sobel = _named_operator("sobel", "[1, 2, 1]", 8, "4., 8., 8., 8., 4.",
                        "``scipy.ndimage.sobel(x, axis=axis, mode=mode, cval=cval)``")
prewitt = _named_operator("prewitt", "[1, 1, 1]", 6, "3., 6., 6., 6., 3.",
                          "``scipy.ndimage.prewitt(x, axis=axis, mode=mode, cval=cval)``")
scharr = _named_operator(
    "scharr", "[3, 10, 3]", 32, "16., 32., 32., 32., 16.",
    "``scipy.ndimage.correlate1d(scipy.ndimage.correlate1d(x, [-1, 0, 1],\n"
    "axis, mode=mode, cval=cval), [3, 10, 3], other_axis, mode=mode,\n"
    "cval=cval)`` (SciPy has no ``scharr``)",
    "\n\nThe Scharr operator of Scharr (2000), as OpenCV's ``Scharr`` but with\nSciPy's boundary modes.",
)


# ------------------------------------------------------------------ Laplacian


@docfiller(scipy="``scipy.ndimage.laplace(x, mode=mode, cval=cval, axes=axes)``")
def laplace(
    input: Tensor,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Laplacian by second differences: the sum over ``axes`` of ``[1, -2, 1]`` along each.

    SciPy's ``laplace`` (``generic_laplace`` with ``correlate1d(x, [1, -2, 1],
    axis)``), each axis extended by its own mode, summed in one fused pass.
    Its gradient is the same stencil's adjoint.

    Args:
        %(input)s
        %(mode)s
        %(cval)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.zeros(5, 5); x[2, 2] = 1.0
        >>> tf.laplace(x)[1:4, 1:4]
        tensor([[ 0.,  1.,  0.],
                [ 1., -4.,  1.],
                [ 0.,  1.,  0.]])
    """
    x, lay, modes, cval = prep(input, mode, cval, axes)
    recipes = tuple(("sep1", a, -1, (1.0, -2.0, 1.0)) for a in lay.spec_axes)
    return run(x, lay, modes, cval, "sum", recipes, out, backend)
