"""Correlation and convolution with the caller's weights, and the uniform (box) filter."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from numbers import Integral

import torch
from torch import Tensor

from .. import _spec
from .._docs import docfiller
from .._validate import check_axis, check_input, per_axis, type_name
from ._core import check_origin, copy_result, dense_recipe, prep, run, weights_tuple

__all__ = ["convolve", "convolve1d", "correlate", "correlate1d", "uniform_filter", "uniform_filter1d"]


def _correlate(input, weights, mode, cval, origin, axes, out, backend, flip: bool):
    x, lay, modes, cval = prep(input, mode, cval, axes)
    k = len(lay.axes)
    w = weights_tuple(weights, k)
    shape = _spec.dense_shape(w)
    order = sorted(range(k), key=lambda i: lay.axes[i])  # weights' dims follow the sorted axes (SciPy)
    origins = list(per_axis(origin, k, "origin"))  # ... and origins the caller's order
    for i in range(k):  # a kernel dim's origin: the dim of the i-th smallest axis
        if isinstance(origins[i], bool) or not isinstance(origins[i], Integral):
            raise TypeError(f"origin must be an int or a sequence of ints; got {type_name(origins[i])}")
    sorted_origins = [int(origins[i]) for i in order]
    for o, n in zip(sorted_origins, shape):
        check_origin(o, n)
    if flip:  # scipy.ndimage.convolve: flip the kernel, mirror the origin
        def rev(t, depth):
            return t[::-1] if depth == 1 else tuple(rev(r, depth - 1) for r in t[::-1])

        w = rev(w, k)
        sorted_origins = [-o - (0 if n & 1 else 1) for o, n in zip(sorted_origins, shape)]
        for o, n in zip(sorted_origins, shape):
            check_origin(o, n)
    return run(x, lay, modes, cval, "stack", (dense_recipe(w, lay, sorted_origins),), out, backend)


@docfiller(scipy="``scipy.ndimage.correlate(x, weights, mode=mode, cval=cval,\norigin=origin, axes=axes)``")
def correlate(
    input: Tensor,
    weights,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int | Sequence[int] = 0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Correlate with a kernel over ``axes`` (the kernel is not flipped).

    In 2-D, ``y[i, j] = sum_{a, b} weights[a, b] * x[i + a - kh//2 - oy, j + b - kw//2 - ox]``
    with out-of-image samples given by ``mode``; likewise over 1 or 3 axes.
    The kernel's dimensions follow the chosen axes in increasing order
    (whatever order ``axes`` lists them in), ``origin`` the order of
    ``axes``: SciPy's rules.

    Args:
        %(input)s
        %(weights_nd)s
        %(mode)s
        %(cval)s
        %(origin)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``weights`` not a tensor, NumPy array or nested sequence
            of real numbers (a bool or complex dtype too), or sparse;
            ``origin`` not an int.
        ValueError: ``weights`` of other than ``len(axes)`` dimensions,
            empty, ragged, requiring grad or a meta tensor; ``origin`` out
            of range or of the wrong length.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.arange(5.0).view(1, 5)
        >>> tf.correlate(x, [[1.0, 2.0, 3.0]], mode="constant")
        tensor([[ 3.,  8., 14., 20., 11.]])
        >>> tf.correlate(torch.arange(5.0), [1.0, 2.0, 3.0], mode="constant", axes=-1)
        tensor([ 3.,  8., 14., 20., 11.])
    """
    return _correlate(input, weights, mode, cval, origin, axes, out, backend, flip=False)


@docfiller(scipy="``scipy.ndimage.convolve(x, weights, mode=mode, cval=cval,\norigin=origin, axes=axes)``")
def convolve(
    input: Tensor,
    weights,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int | Sequence[int] = 0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Convolve with a kernel over ``axes`` (the kernel is flipped).

    SciPy's definition: the kernel is flipped on every axis and ``origin``
    mirrored (even sizes shifted by one, as SciPy does), then correlated as
    in :func:`correlate` (whose axis rules apply).

    Args:
        %(input)s
        %(weights_nd)s
        %(mode)s
        %(cval)s
        %(origin)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``weights`` not a tensor, NumPy array or nested sequence
            of real numbers (a bool or complex dtype too), or sparse;
            ``origin`` not an int.
        ValueError: ``weights`` of other than ``len(axes)`` dimensions,
            empty, ragged, requiring grad or a meta tensor; ``origin`` out
            of range or of the wrong length.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0]])
        >>> tf.convolve(x, [[1.0, 2.0, 3.0]], mode="constant")
        tensor([[0., 1., 2., 3., 0.]])
    """
    return _correlate(input, weights, mode, cval, origin, axes, out, backend, flip=True)


def one_axis(input, axis, mode, cval):
    """:func:`prep` for the 1-D ops: ``axis`` is the one axis filtered."""
    x = check_input(input)
    return prep(x, mode, cval, (check_axis(axis, x.dim()),))


def _correlate1d(input, weights, axis, mode, cval, origin, out, backend, flip: bool):
    x, lay, modes, cval = one_axis(input, axis, mode, cval)
    w = weights_tuple(weights, 1)
    if isinstance(origin, bool) or not isinstance(origin, Integral):
        raise TypeError(f"origin must be an int; got {type_name(origin)}")
    origin = int(origin)
    if flip:  # scipy.ndimage.convolve1d
        w = w[::-1]
        origin = -origin
        if not len(w) & 1:
            origin -= 1
    k = len(w)
    origin = check_origin(origin, k)
    recipe = ("sep1", lay.spec_axes[0], _spec.centered_lo(k, origin), w, _spec.neg_zeros(w))
    return run(x, lay, modes, cval, "stack", (recipe,), out, backend)


@docfiller(scipy="``scipy.ndimage.correlate1d(x, weights, axis, mode=mode,\ncval=cval, origin=origin)``")
def correlate1d(
    input: Tensor,
    weights,
    axis: int = -1,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int = 0,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Correlate along one axis with 1-D ``weights``.

    ``y[..., i] = sum_a weights[a] * x[..., i + a - k//2 - origin]`` along
    ``axis``, with out-of-image samples given by ``mode``; every other axis
    is a batch axis.

    Args:
        %(input)s
        %(weights1d)s
        %(axis1d)s
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
        ValueError: ``axis`` out of range; ``weights`` not 1-D, empty,
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
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Convolve along one axis with 1-D ``weights`` (flipped).

    SciPy's definition: ``weights`` reversed and ``origin`` mirrored (even
    lengths shifted by one), then correlated as in :func:`correlate1d`.

    Args:
        %(input)s
        %(weights1d)s
        %(axis1d)s
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
        ValueError: ``axis`` out of range; ``weights`` not 1-D, empty,
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


# -------------------------------------------------------------------- uniform


def _check_size(size):
    if isinstance(size, bool) or not isinstance(size, Integral):
        raise TypeError(f"size must be a positive int or a sequence of them; got {type_name(size)}")
    if size < 1:
        raise ValueError(f"size must be >= 1; got {size}")
    return int(size)


def _uniform_passes(spec_axes, sizes, origins) -> tuple:
    """The box passes (checked origins; SciPy skips axes of size 1)."""
    passes = []
    for a, n, o in zip(spec_axes, sizes, origins):
        if isinstance(o, bool) or not isinstance(o, Integral):
            raise TypeError(f"origin must be an int or a sequence of ints; got {type_name(o)}")
        o = check_origin(int(o), n)
        if n > 1:
            passes.append((a, _spec.centered_lo(n, o), (1.0 / n,) * n))
    return tuple(passes)


#: the same, memoised for plain-int origins (a few microseconds of every small call)
_uniform_passes_ints = functools.lru_cache(maxsize=1024)(_uniform_passes)


def _uniform(x, lay, modes, cval, sizes, origins, out, backend):
    if all(type(o) is int for o in origins) and not torch.compiler.is_compiling():
        passes = _uniform_passes_ints(lay.spec_axes, sizes, tuple(origins))
    else:
        passes = _uniform_passes(lay.spec_axes, sizes, origins)
    if not passes:
        return copy_result(x, out, backend)
    return run(x, lay, modes, cval, "stack", (("sep", passes),), out, backend)


@docfiller(
    scipy="``scipy.ndimage.uniform_filter(x, size, mode=mode, cval=cval,\norigin=origin, axes=axes)``",
)
def uniform_filter(
    input: Tensor,
    size: int | Sequence[int] = 3,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int | Sequence[int] = 0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Uniform (box) filter: the mean over a window of ``size`` samples per axis.

    One 1-D pass of ``size`` taps ``1 / size`` per chosen axis, in ``axes``
    order, each extended by its axis's mode (SciPy's sequence of
    ``uniform_filter1d``; an axis of size 1 is not filtered).  SciPy sums
    a running window; this sums each window afresh, so the values agree to
    rounding, and a NaN spreads over its window only, where SciPy's running
    sum carries it to the end of the line.

    Args:
        %(input)s
        %(size)s
        %(mode)s
        %(cval)s
        %(origin)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``size`` or ``origin`` not an int.
        ValueError: ``size`` below 1; ``origin`` out of range; a per-axis
            sequence of the wrong length.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.uniform_filter(torch.tensor([[0.0, 3.0, 6.0, 9.0]]), size=3, axes=-1)
        tensor([[1., 3., 6., 8.]])
    """
    x, lay, modes, cval = prep(input, mode, cval, axes)
    k = len(lay.axes)
    sizes = tuple(_check_size(s) for s in per_axis(size, k, "size"))
    return _uniform(x, lay, modes, cval, sizes, per_axis(origin, k, "origin"), out, backend)


@docfiller(
    scipy="``scipy.ndimage.uniform_filter1d(x, size, axis, mode=mode, cval=cval,\norigin=origin)``",
)
def uniform_filter1d(
    input: Tensor,
    size: int,
    axis: int = -1,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int = 0,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Uniform (box) filter along one axis: the mean over ``size`` samples.

    :func:`uniform_filter` with ``axes=axis`` (see there for how it differs
    from SciPy's running sum).

    Args:
        %(input)s
        size: the window length, an int ``>= 1``.
        %(axis1d)s
        %(mode)s
        %(cval)s
        %(origin1d)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``size``, ``axis`` or ``origin`` not an int.
        ValueError: ``size`` below 1; ``axis`` or ``origin`` out of range.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.uniform_filter1d(torch.tensor([0.0, 3.0, 6.0, 9.0]), 3)
        tensor([1., 3., 6., 8.])
    """
    x, lay, modes, cval = one_axis(input, axis, mode, cval)
    return _uniform(x, lay, modes, cval, (_check_size(size),), (origin,), out, backend)
