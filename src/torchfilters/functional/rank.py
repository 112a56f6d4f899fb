"""Rank filters: minimum, maximum, median, any rank or percentile of a window.

One spec (:class:`torchfilters._spec.RankSpec`: a footprint, its offsets and a rank) runs every
one of them; the public functions only turn SciPy's arguments (``size`` or ``footprint``,
``origin``, ``rank`` / ``percentile``) into it.  The order, tie and NaN rules live on the spec
and are the same on every engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Optional, Union

import torch
from torch import Tensor

from .. import _ops, _spec
from .. import _docs
from .._docs import docfiller
from .._validate import check_out, per_axis, type_name
from ..backends import check_backend
from ._core import (
    Layout,
    _eager_engine,
    _flat,
    _mergeable,
    copy_result,
    no_grad_out,
    prep,
    refuse_forward_ad,
)
from .correlate import _check_size, one_axis

__all__ = [
    "maximum_filter",
    "maximum_filter1d",
    "median_filter",
    "minimum_filter",
    "minimum_filter1d",
    "percentile_filter",
    "rank_filter",
]

Size = Union[int, Sequence[int], None]


# ------------------------------------------------------------------ arguments


def _footprint_tuple(footprint, k: int):
    """A footprint (tensor, array or nested sequence; truthy = in the window) as nested 0/1
    tuples of ``k`` levels."""
    if isinstance(footprint, Tensor):
        if footprint.is_meta:
            raise ValueError("footprint is a meta tensor, which holds no values")
        if footprint.dtype.is_complex:
            raise TypeError(f"footprint must be boolean or real; got dtype {footprint.dtype}")
        footprint = footprint.detach().to("cpu").tolist()
    elif hasattr(footprint, "__array__") and not isinstance(footprint, (list, tuple)):
        footprint = footprint.__array__().tolist()
    if isinstance(footprint, (str, bytes)) or not isinstance(footprint, (list, tuple)):
        raise TypeError(
            f"footprint must be a boolean tensor, array or nested sequence; got {type_name(footprint)}"
        )

    def conv(t, depth):
        if depth == 0:
            if isinstance(t, (list, tuple)):
                raise ValueError(f"footprint must be {k}-D (one dimension per axis of axes)")
            if not isinstance(t, (bool, Real)):
                raise TypeError(f"footprint must hold booleans; got {type_name(t)}")
            return 1 if t else 0
        if not isinstance(t, (list, tuple)):
            raise ValueError(f"footprint must be {k}-D (one dimension per axis of axes)")
        if len(t) == 0:
            raise ValueError("footprint must not be empty")
        return tuple(conv(v, depth - 1) for v in t)

    fp = conv(footprint, k)

    def check(t, depth):
        if depth > 1:
            shapes = {_spec.dense_shape(r) for r in t}
            if len(shapes) > 1:
                raise ValueError("footprint must be rectangular")
            for r in t:
                check(r, depth - 1)

    check(fp, k)
    return fp


def _window(size, footprint, k: int):
    """The footprint over the chosen axes (dims in increasing axis order, as SciPy's) from
    ``size`` (per axis, ``axes`` order) or ``footprint``; ``(footprint, sizes_in_axes_order)``."""
    if footprint is not None and size is not None:
        raise ValueError("give one of size and footprint, not both (SciPy ignores size then, with a warning)")
    if footprint is None:
        if size is None:
            raise ValueError("give size (the window length per axis) or footprint (a boolean window)")
        sizes = tuple(_check_size(s) for s in per_axis(size, k, "size"))
        return None, sizes
    fp = _footprint_tuple(footprint, k)
    if not any(_flat(fp)):
        raise ValueError("footprint has no True element: the window would be empty")
    return fp, None


def _ones(shape):
    if not shape:
        return 1
    return tuple(_ones(shape[1:]) for _ in range(shape[0]))


def _spec_window(lay: Layout, fp, sizes, origins):
    """``(footprint, lo)`` over every spec axis: the caller's window on the chosen axes, length 1
    on the others.  ``sizes`` follow ``axes`` order; ``fp`` increasing axis order (SciPy)."""
    spec_axes = lay.spec_axes
    if fp is None:
        shape = [1] * lay.ndim
        for a, n in zip(spec_axes, sizes):
            shape[a] = n
        full = _ones(tuple(shape))
        return _crop(full, lay, origins)
    chosen = sorted(spec_axes)

    def expand(t, rest):
        if not rest:
            return t
        if rest[0] in chosen:
            return tuple(expand(r, rest[1:]) for r in t)
        return (expand(t, rest[1:]),)

    return _crop(expand(fp, list(range(-lay.ndim, 0))), lay, origins)


def _crop(fp, lay: Layout, origins):
    """``lo`` per spec axis from ``origins`` (``axes`` order), checked as SciPy checks them."""
    shape = _spec.dense_shape(fp)
    lo = [_spec.centered_lo(n, 0) for n in shape]
    for a, o in zip(lay.spec_axes, origins):
        n = shape[a]
        if isinstance(o, bool) or not isinstance(o, Integral):
            raise TypeError(f"origin must be an int or a sequence of them; got {type_name(o)}")
        o = int(o)
        if n // 2 + o < 0 or n // 2 + o >= n:
            raise ValueError(
                f"invalid origin={o} for a window of size {n}: it must satisfy "
                f"-(size // 2) <= origin <= (size - 1) // 2, i.e. {-(n // 2)} .. {(n - 1) // 2}"
            )
        lo[a] = _spec.centered_lo(n, o)
    return fp, tuple(lo)


def _check_rank(rank, count: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, Integral):
        raise TypeError(f"rank must be an int; got {type_name(rank)}")
    r = int(rank)
    if r < 0:
        r += count
    if not 0 <= r < count:
        raise ValueError(f"rank={rank} is not within the window's {count} elements (-{count} .. {count - 1})")
    return r


def percentile_rank(percentile, count: int) -> int:
    """SciPy's rank of ``percentile`` in a window of ``count`` elements (no interpolation):
    ``int(count * percentile / 100)``, ``count - 1`` at 100; a negative percentile counts
    from 100."""
    if isinstance(percentile, bool) or not isinstance(percentile, Real):
        raise TypeError(f"percentile must be a real number; got {type_name(percentile)}")
    p = float(percentile)
    if p < 0.0:
        p += 100.0
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within [-100, 100]; got {percentile}")
    if p == 100.0:
        return count - 1
    return int(float(count) * p / 100.0)


# ---------------------------------------------------------------------- running


@_spec.cached
def _rank_text(mode, cval: float, fp, lo, rank: int, cval_negative: bool, ndim: int) -> str:
    return _spec.encode(_spec.RankSpec(mode, cval, fp, lo, rank, ndim))


def run_rank(x: Tensor, text: str, out: Tensor | None, backend) -> Tensor:
    """Run a rank spec on ``x`` (already in engine layout)."""
    backend = check_backend(backend)
    if out is not None:
        check_out(out, x.shape, x.dtype, x.device)
        no_grad_out(x)
    eng = _eager_engine(x, backend)
    if eng is not None:
        spec = _spec.decode(text)
        if out is None:
            return eng.rank_forward(x, spec)
        _ops._write(out, (x,), lambda o: eng.rank_forward(x, spec, out=o))
        return out
    if not torch.compiler.is_compiling():
        refuse_forward_ad(x)
    if out is None:
        return _ops.rank_op(x, text, backend)
    _ops.rank_out_op(x, text, backend, out)
    return out


def _rank(input, size, footprint, mode, cval, origin, axes, out, backend, rank=None, percentile=None, which=None):
    x, lay, modes, cval = prep(input, mode, cval, axes)
    k = len(lay.axes)
    fp, sizes = _window(size, footprint, k)
    origins = per_axis(origin, k, "origin")
    fp, lo = _spec_window(lay, fp, sizes, origins)
    count = sum(_flat(fp))
    if which == "median":
        r = count // 2
    elif which == "min":
        r = 0
    elif which == "max":
        r = count - 1
    elif percentile is not None:
        r = percentile_rank(percentile, count)
    else:
        r = _check_rank(rank, count)
    return _run(x, lay, modes, cval, fp, lo, r, count, out, backend)


def _run(x, lay, modes, cval, fp, lo, r, count, out, backend):
    if count == 1 and _spec._offsets(fp, lo) == ((0,) * len(lo),):
        return copy_result(x, out, backend)  # a window of its own sample only: the identity
    text = _rank_text(lay.modes(modes), cval, fp, lo, r, math.copysign(1.0, cval) < 0, lay.ndim)
    if out is not None:
        check_out(out, x.shape, x.dtype, x.device)
        if lay.merge and not _mergeable(out, lay.merge):
            with torch.no_grad():
                out.copy_(_run(x, lay, modes, cval, fp, lo, r, count, None, backend))
            return out
    y = run_rank(lay.to_engine(x), text, lay.out_to_engine(out, False), backend)
    return out if out is not None else lay.from_engine(y, False, x.shape)


# ----------------------------------------------------------------------- public

_EXAMPLE_X = "torch.tensor([[1.0, 7.0, 3.0, 9.0, 5.0]])"


@docfiller(scipy="``scipy.ndimage.rank_filter(x, rank, size, footprint, mode=mode,\ncval=cval, origin=origin, axes=axes)``")
def rank_filter(
    input: Tensor,
    rank: int,
    size: Size = None,
    footprint=None,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int | Sequence[int] = 0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """The value of rank ``rank`` (0-based, ascending) in each window.

    %(rank_rule)s

    Args:
        %(input)s
        rank: the 0-based position in the window's ascending order; a negative rank counts from
            the largest (``-1`` is the maximum), as in SciPy.
        %(size_foot)s
        %(mode)s
        %(cval)s
        %(origin)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``rank``, ``size`` or ``origin`` not an int; ``footprint`` not a boolean
            tensor, array or nested sequence.
        ValueError: neither or both of ``size`` and ``footprint``; ``size`` below 1;
            ``footprint`` of other than ``len(axes)`` dimensions, ragged or all False;
            ``rank`` outside the window; ``origin`` out of range.
        %(raises)s

    %(rank_matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.rank_filter(torch.tensor([[1.0, 7.0, 3.0, 9.0, 5.0]]), 1, size=3, axes=-1)
        tensor([[1., 3., 7., 5., 5.]])
    """
    return _rank(input, size, footprint, mode, cval, origin, axes, out, backend, rank=rank)


@docfiller(
    scipy="``scipy.ndimage.percentile_filter(x, percentile, size, footprint,\nmode=mode, cval=cval, origin=origin, axes=axes)``"
)
def percentile_filter(
    input: Tensor,
    percentile: float,
    size: Size = None,
    footprint=None,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    origin: int | Sequence[int] = 0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """The ``percentile``-th percentile of each window, as SciPy defines it: no interpolation.

    The window's ``count`` values are ranked and the one of rank ``int(count * percentile / 100)``
    is returned (``count - 1`` at 100; a negative ``percentile`` counts from 100), so the
    result is always a value of the window and its gradient flows to that one element, as for
    every rank filter.  %(rank_rule)s

    Args:
        %(input)s
        %(percentile)s
        %(size_foot)s
        %(mode)s
        %(cval)s
        %(origin)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``percentile`` not a real number; ``size`` or ``origin`` not an int;
            ``footprint`` not a boolean tensor, array or nested sequence.
        ValueError: ``percentile`` outside ``[-100, 100]``; neither or both of ``size`` and
            ``footprint``; ``size`` below 1; ``footprint`` of other than ``len(axes)``
            dimensions, ragged or all False; ``origin`` out of range.
        %(raises)s

    %(rank_matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> tf.percentile_filter(torch.tensor([[1.0, 7.0, 3.0, 9.0, 5.0]]), 75, size=3, axes=-1)
        tensor([[7., 7., 9., 9., 9.]])
    """
    return _rank(input, size, footprint, mode, cval, origin, axes, out, backend, percentile=percentile)


_WINDOW = """%(summary)s

%(detail)s%(rank_rule)s%(nan_note)s

Args:
    %(input)s
    %(size_foot)s
    %(mode)s
    %(cval)s
    %(origin)s
    %(axes)s
    %(out)s
    %(backend)s

Returns:
    %(returns)s

Raises:
    TypeError: ``size`` or ``origin`` not an int; ``footprint`` not a boolean tensor,
        array or nested sequence.
    ValueError: neither or both of ``size`` and ``footprint``; ``size`` below 1;
        ``footprint`` of other than ``len(axes)`` dimensions, ragged or all False;
        ``origin`` out of range.
    %(raises)s

%(rank_matches)s

Example:
    >>> import torch, torchfilters as tf
%(example)s
"""


def _window_op(name: str, which: str, summary: str, detail: str, nan_note: str, example: str):
    """``median_filter``, ``minimum_filter``, ``maximum_filter``: one signature, one template."""

    def fn(
        input: Tensor,
        size: Size = None,
        footprint=None,
        *,
        mode: str = "reflect",
        cval: float = 0.0,
        origin: Union[int, Sequence[int]] = 0,
        axes=None,
        out: Optional[Tensor] = None,
        backend: Optional[str] = None,
    ) -> Tensor:
        return _rank(input, size, footprint, mode, cval, origin, axes, out, backend, which=which)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = _docs.fill(
        _WINDOW, summary=summary, detail=detail, nan_note=nan_note, example=example,
        scipy=f"``scipy.ndimage.{name}(x, size, footprint, mode=mode,\ncval=cval, origin=origin, axes=axes)``")
    return fn


median_filter = _window_op(
    "median_filter", "median", "The median of each window: rank ``count // 2`` of its ``count`` elements.",
    "For an even ``count`` this is the upper of the two middle values (no averaging), as\n"
    "SciPy's ``median_filter``.  ", "",
    "    >>> x = torch.tensor([[0.0, 0.0, 9.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])\n"
    "    >>> tf.median_filter(x, size=3, axes=-1)  # the lone 9 is removed\n"
    "    tensor([[0., 0., 0., 0., 0.],\n"
    "            [0., 1., 2., 3., 4.]])")
minimum_filter = _window_op(
    "minimum_filter", "min", "The minimum of each window (grey erosion with a flat structuring element).", "",
    "  So the minimum ignores NaN unless the whole window is NaN.",
    "    >>> tf.minimum_filter(torch.tensor([[1.0, 7.0, 3.0, 9.0, 5.0]]), size=3, axes=-1)\n"
    "    tensor([[1., 1., 3., 3., 5.]])")
maximum_filter = _window_op(
    "maximum_filter", "max", "The maximum of each window (grey dilation with a flat structuring element).", "",
    "  So the maximum of a window holding a NaN is NaN.",
    "    >>> tf.maximum_filter(torch.tensor([[1.0, 7.0, 3.0, 9.0, 5.0]]), size=3, axes=-1)\n"
    "    tensor([[7., 7., 9., 9., 9.]])")


def _minmax1d(input, size, axis, mode, cval, origin, out, backend, which):
    x, lay, modes, cval = one_axis(input, axis, mode, cval)
    n = _check_size(size)
    fp, lo = _spec_window(lay, None, (n,), (origin,))
    return _run(x, lay, modes, cval, fp, lo, 0 if which == "min" else n - 1, n, out, backend)


_ONE_AXIS = """The %(what)s over ``size`` samples along one axis.

%(rank_rule)s

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

%(rank_matches)s

Example:
    >>> import torch, torchfilters as tf
    >>> tf.%(name)s(torch.tensor([2.0, 8.0, 0.0, 4.0, 1.0, 9.0, 9.0, 0.0]), 3)
    tensor([%(example)s])
"""


def _one_axis_op(name: str, which: str, what: str, example: str):
    def fn(
        input: Tensor,
        size: int,
        axis: int = -1,
        *,
        mode: str = "reflect",
        cval: float = 0.0,
        origin: int = 0,
        out: Optional[Tensor] = None,
        backend: Optional[str] = None,
    ) -> Tensor:
        return _minmax1d(input, size, axis, mode, cval, origin, out, backend, which)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = _docs.fill(
        _ONE_AXIS, name=name, what=what, example=example,
        scipy=f"``scipy.ndimage.{name}(x, size, axis, mode=mode,\ncval=cval, origin=origin)``")
    return fn


minimum_filter1d = _one_axis_op("minimum_filter1d", "min", "minimum", "2., 0., 0., 0., 1., 1., 0., 0.")
maximum_filter1d = _one_axis_op("maximum_filter1d", "max", "maximum", "8., 8., 8., 4., 9., 9., 9., 9.")
