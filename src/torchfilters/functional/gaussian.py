"""Gaussian filters: smoothing, derivatives of the Gaussian, gradient magnitude, Laplacian of Gaussian."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from numbers import Integral
from typing import Union

import torch
from torch import Tensor

from .. import kernels
from .._docs import docfiller
from .._validate import check_real, per_axis
from ..backends import check_backend
from ._core import check_out, copy_result, layout, no_grad_out, prep, run
from .correlate import one_axis

__all__ = ["gaussian_filter", "gaussian_filter1d", "gaussian_gradient_magnitude", "gaussian_laplace"]

Number = Union[int, float]


def check_sigma(sigma, k: int = 2):
    out = []
    for s in per_axis(sigma, k, "sigma"):
        s = check_real(s, "sigma")
        if not (s >= 0 and math.isfinite(s)):
            raise ValueError(f"sigma must be finite and >= 0 (in pixels); got {s}")
        out.append(s)
    return tuple(out)


def _check_order(order, k: int):
    out = []
    for o in per_axis(order, k, "order"):
        if isinstance(o, bool) or not isinstance(o, Integral):
            raise TypeError(f"order must be an int >= 0 or a sequence of them; got {o!r}")
        if o < 0:
            raise ValueError(f"order must be >= 0 (0: smooth, 1: first derivative, 2: second); got {o}")
        out.append(int(o))
    return tuple(out)


_MAX_RADIUS = 1 << 20


def gaussian_radii(sigmas, truncate, radius):
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
    for r in per_axis(radius, len(sigmas), "radius"):
        if isinstance(r, bool) or not isinstance(r, Integral):
            raise TypeError(f"radius must be a non-negative int or a sequence of them; got {r!r}")
        if r < 0:
            raise ValueError(f"radius must be a non-negative int or a sequence of them; got {r!r}")
        if r > _MAX_RADIUS:
            raise ValueError(f"radius={r} is larger than the largest supported, {_MAX_RADIUS}")
        radii.append(int(r))
    return tuple(radii)


@docfiller(
    scipy=(
        "``scipy.ndimage.gaussian_filter(x, sigma, order=order, mode=mode,\n"
        "cval=cval, truncate=truncate, radius=radius, axes=axes)``"
    ),
)
def gaussian_filter(
    input: Tensor,
    sigma: Number | Sequence[Number],
    *,
    order: int | Sequence[int] = 0,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    radius: None | int | Sequence[int] = None,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Gaussian filter: one 1-D pass per axis of ``axes``, in that order (H then W by default).

    The kernel is SciPy's, normalised to sum 1 (order 0), of ``2 * radius +
    1`` taps per axis; ``sigma``, ``order``, ``radius`` and ``mode`` may be
    given per axis, in ``axes`` order.

    Args:
        %(input)s
        %(sigma)s
            ``sigma=0`` on every axis returns a copy of the input.
        %(order)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(radius)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``sigma`` or ``truncate`` not a real number (a bool
            too); ``radius`` not an int.
        ValueError: negative, NaN or infinite ``sigma``; ``sigma``,
            ``radius`` or ``order`` neither a scalar nor one per axis;
            negative ``radius``; negative, NaN or infinite ``truncate``; a
            kernel radius beyond 2**20; negative ``order``.
        TypeError: ``order`` not an int or a sequence of ints.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.gaussian_filter(torch.tensor([[1.0, 2.0, 3.0]]), 2.0)
        tensor([[1.8884, 2.0000, 2.1116]])
    """
    x, lay, modes, cval = prep(input, mode, cval, axes)
    return _gaussian(x, lay, modes, cval, sigma, order, truncate, radius, out, backend)


def _taps_args(sigma, order, truncate, radius, k: int):
    """``(sigmas, orders, radii)``, checked."""
    sigmas = check_sigma(sigma, k)
    return sigmas, _check_order(order, k), gaussian_radii(sigmas, truncate, radius)


#: the same, memoised for the common call (plain Python numbers, no radius): a few microseconds
#: of every small call
_taps_args_scalar = functools.lru_cache(maxsize=1024)(_taps_args)


def checked_taps_args(sigma, order, truncate, radius, k: int):
    """``(sigmas, orders, radii)`` of ``k`` axes, checked (memoised for plain Python numbers)."""
    if (radius is None and type(sigma) in (float, int) and type(order) is int and type(truncate) in (float, int)
            and not torch.compiler.is_compiling()):
        return _taps_args_scalar(sigma, order, truncate, radius, k)
    return _taps_args(sigma, order, truncate, radius, k)


def _gaussian(x, lay, modes, cval, sigma, order, truncate, radius, out, backend):
    sigmas, orders, radii = checked_taps_args(sigma, order, truncate, radius, len(lay.axes))
    if all(s <= 1e-15 for s in sigmas):  # SciPy filters no axis: a copy
        return copy_result(x, out, backend)
    runs = _pass_runs(x, lay, modes, sigmas)
    if runs is not None:
        check_backend(backend)
        if out is not None:  # (the checks of the last call, before the first one's work)
            check_out(out, x.shape, x.dtype, x.device)
            no_grad_out(x)
        for j, r in enumerate(runs):
            x = _gaussian(x, layout(x, tuple(lay.axes[i] for i in r)), tuple(modes[i] for i in r), cval,
                          tuple(sigmas[i] for i in r), tuple(orders[i] for i in r), truncate,
                          tuple(radii[i] for i in r), out if j == len(runs) - 1 else None, backend)
        return x
    recipe = ("gauss", sigmas, orders, radii, lay.spec_axes)
    return run(x, lay, modes, cval, "stack", (recipe,), out, backend)


def _pass_runs(x, lay, modes, sigmas):
    """SciPy runs a Gaussian's passes in the order ``axes`` lists them; a plane engine runs them
    in the stencil's order, the CPU engine's volume path (three axes, or two of different modes)
    in increasing axis order, which rounds differently.  For a float64 input there (SciPy's
    bits are the promise; other dtypes round within their precision either way): the passes as
    runs of increasing axes (their indices in ``axes`` order), one call each -- each call's input
    is stored as SciPy stores each pass's, so the bits are SciPy's.  Else None."""
    if x.dtype != torch.float64:
        return None
    live = [i for i, s in enumerate(sigmas) if s > 1e-15]  # (SciPy skips sigma ~ 0)
    ax = [lay.axes[i] for i in live]
    if ax == sorted(ax) or (lay.ndim < 3 and len({modes[i] for i in live}) == 1):
        return None
    runs = [[live[0]]]
    for i in live[1:]:
        if lay.axes[i] > lay.axes[runs[-1][-1]]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def increasing(lay, *per_axis):
    """``(spec axes, *per_axis)`` in increasing axis order: the order of a Gaussian over every
    axis (SciPy's terms of ``gaussian_laplace``, scikit-image's ``gaussian``), whatever the
    order of ``axes``."""
    up = sorted(range(len(lay.axes)), key=lambda j: lay.spec_axes[j])
    return (tuple(lay.spec_axes[j] for j in up),) + tuple(tuple(v[j] for j in up) for v in per_axis)


@docfiller(
    scipy=(
        "``scipy.ndimage.gaussian_filter1d(x, sigma, axis, order=order,\n"
        "mode=mode, cval=cval, truncate=truncate, radius=radius)``"
    ),
)
def gaussian_filter1d(
    input: Tensor,
    sigma: Number,
    axis: int = -1,
    order: int = 0,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    radius: int | None = None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Gaussian filter along one axis: :func:`gaussian_filter` with ``axes=axis``.

    Args:
        %(input)s
        %(sigma1d)s
        %(axis1d)s
        %(order1d)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(radius1d)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``sigma`` or ``truncate`` not a real number; ``axis``,
            ``order`` or ``radius`` not an int.
        ValueError: bad ``sigma``, ``truncate``, ``order`` or ``radius`` (as
            :func:`gaussian_filter`); ``axis`` out of range.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.gaussian_filter1d(torch.tensor([1.0, 2.0, 3.0]), 2.0)
        tensor([1.8884, 2.0000, 2.1116])
    """
    if isinstance(sigma, (list, tuple)):
        raise TypeError(f"sigma must be a real number for gaussian_filter1d; got {sigma!r}")
    x, lay, modes, cval = one_axis(input, axis, mode, cval)
    return _gaussian(x, lay, modes, cval, sigma, order, truncate, radius, out, backend)


@docfiller(
    scipy=(
        "``scipy.ndimage.gaussian_gradient_magnitude(x, sigma, mode=mode,\n"
        "cval=cval, truncate=truncate, radius=radius, axes=axes)`` when ``axes``\n"
        "are all of ``x``'s axes (see above otherwise)"
    ),
)
def gaussian_gradient_magnitude(
    input: Tensor,
    sigma: Number | Sequence[Number],
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    radius: None | int | Sequence[int] = None,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Gradient magnitude with Gaussian derivatives, in one fused pass.

    ``sqrt(gaussian_filter(x, sigma, order=(1, 0))**2 + gaussian_filter(x,
    sigma, order=(0, 1))**2)`` in 2-D, over every axis of ``axes`` in
    general; its gradient is 0 where the magnitude is 0 (never NaN).

    Defined per slice of the chosen axes, each axis extended by its own
    mode, the terms summed in ``axes`` order and each term's passes run
    in increasing axis order: equal to SciPy's function on each slice for
    one mode.  SciPy's own ``axes=`` call differs there: each of its terms
    extends every axis by that term's mode, and it reads per-axis
    ``sigma`` in axis order when ``axes`` names every axis.

    Args:
        %(input)s
        %(sigma)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(radius)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``sigma`` or ``truncate`` not a real number (a bool
            too); ``radius`` not an int.
        ValueError: negative, NaN or infinite ``sigma``; ``sigma`` or
            ``radius`` neither a scalar nor one per axis; negative
            ``radius``; negative, NaN or infinite ``truncate``; a kernel
            radius beyond 2**20.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.arange(9.0).repeat(9, 1)
        >>> round(float(tf.gaussian_gradient_magnitude(x, 1.0)[4, 4]), 4)   # 1 up to truncation
        0.9999
    """
    return _gaussian_sum(input, sigma, 1, "magnitude", mode, cval, truncate, radius, axes, out, backend)


def _gaussian_sum(input, sigma, order, epilogue, mode, cval, truncate, radius, axes, out, backend):
    """One Gaussian per axis of ``axes``, of ``order`` along it (0 along the others), combined."""
    x, lay, modes, cval = prep(input, mode, cval, axes)
    k = len(lay.axes)
    sigmas = check_sigma(sigma, k)
    radii = gaussian_radii(sigmas, truncate, radius)
    # the terms in ``axes`` order, each one's passes in increasing axis order (SciPy's: each term
    # is a ``gaussian_filter`` over every axis)

    def term(i):
        a, s, o, r = increasing(lay, sigmas, tuple(order if j == i else 0 for j in range(k)), radii)
        return ("gauss", s, o, r, a)

    return run(x, lay, modes, cval, epilogue, tuple(term(i) for i in range(k)), out, backend)


@docfiller(
    scipy=(
        "``scipy.ndimage.gaussian_laplace(x, sigma, mode=mode, cval=cval,\n"
        "truncate=truncate, radius=radius, axes=axes)`` when ``axes`` are all\n"
        "of ``x``'s axes (see above otherwise)"
    ),
)
def gaussian_laplace(
    input: Tensor,
    sigma: Number | Sequence[Number],
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    radius: None | int | Sequence[int] = None,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Laplacian of Gaussian: the sum over ``axes`` of the Gaussian's second derivative along each.

    Per axis ``i``, :func:`gaussian_filter` with ``order`` 2 along
    ``axes[i]`` and 0 along the others; the results summed, in one fused
    pass (SciPy's ``generic_laplace``).  Negative at a bright blob's centre.

    Defined per slice of the chosen axes, each axis extended by its own
    mode, the terms summed in ``axes`` order and each term's passes run
    in increasing axis order: equal to SciPy's function on each slice for
    one mode.  SciPy's own ``axes=`` call differs there: each of its terms
    extends every axis by that term's mode, and it reads per-axis
    ``sigma`` in axis order when ``axes`` names every axis.

    Args:
        %(input)s
        %(sigma)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(radius)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``sigma`` or ``truncate`` not a real number (a bool
            too); ``radius`` not an int.
        ValueError: bad ``sigma``, ``truncate`` or ``radius`` (as
            :func:`gaussian_filter`).
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.zeros(9, 9); x[4, 4] = 1.0
        >>> bool(tf.gaussian_laplace(x, 1.0)[4, 4] < 0)
        True
    """
    return _gaussian_sum(input, sigma, 2, "sum", mode, cval, truncate, radius, axes, out, backend)

