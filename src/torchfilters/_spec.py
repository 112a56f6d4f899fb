"""Stencil specifications: the data every backend executes.

Every op in torchfilters is "a few small linear stencils on 1, 2 or 3 spatial
axes, combined pointwise, maybe masked".  A spec describes that as data; the
backends (reference, numba CPU, Triton) each implement one engine that runs
any spec.  Specs travel through ``torch.library`` custom ops as strings (so
``torch.compile`` sees them as constants) and are decoded once and cached.

A :class:`Stencil` is either

* ``sep``: a sequence of 1-D passes ``(axis, lo, taps)`` applied one after
  another, each padding by the boundary mode -- SciPy's semantics for
  ``sobel``/``gaussian_filter`` (which matter in ``constant`` mode with a
  non-zero ``cval``), or
* ``dense``: one kernel over the spatial axes, ``taps[a][b]`` at offsets
  ``(lo_y + a, lo_x + b)`` (nested one level per spatial axis: ``ndim`` levels).

**Spatial axes.**  A spec acts on the last ``ndim`` axes of the tensor an engine gets
(1, 2 or 3; the public functions move the caller's ``axes`` there, see
``functional._axes``); the others are independent images.  ``Pass.axis`` counts from the
end: ``-1`` (x, W), ``-2`` (y, H), ``-3`` (z, D).  ``mode`` is one boundary mode for every
axis, or a tuple of ``ndim`` modes, ``mode[i]`` for axis ``i - ndim`` (SciPy's per-axis
modes; :func:`axis_mode` reads it).  A tuple whose modes are all equal is always stored as
the one string (:func:`canonical_modes`), so engines see per-axis tuples only where they
matter.

Offsets follow ``scipy.ndimage.correlate``: output ``[i]`` reads
``input[i + lo + j]`` for tap ``j``, with ``lo = -(k // 2) - origin``.
"""

from __future__ import annotations

import ast
import functools
import operator
import math
import sys
from typing import NamedTuple

import numpy as np
import torch

Taps = tuple[float, ...]


class Pass(NamedTuple):
    axis: int  # -1 (W, x), -2 (H, y) or -3 (D, z): counted from the end
    lo: int  # offset of the first tap
    taps: Taps


class Stencil(NamedTuple):
    kind: str  # "sep" or "dense"
    passes: tuple[Pass, ...] = ()  # sep
    lo: tuple[int, ...] = (0, 0)  # dense: first offset per spatial axis, (lo_y, lo_x) in 2-D
    taps: tuple = ()  # dense: nested, one level per spatial axis (kh rows of kw taps in 2-D)

    def extent(self, axis: int) -> tuple[int, int]:
        """(lo, hi) offsets this stencil reads along ``axis`` (inclusive)."""
        if self.kind == "dense":
            d = len(self.lo)
            if axis < -d:
                return 0, 0
            return self.lo[axis], self.lo[axis] + dense_shape(self.taps)[axis] - 1
        lo = hi = 0
        for p in self.passes:
            if p.axis == axis:
                lo += p.lo
                hi += p.lo + len(p.taps) - 1
        return lo, hi

    def is_identity(self) -> bool:
        return self.kind == "sep" and len(self.passes) == 0


class FilterSpec(NamedTuple):
    """``epilogue`` combines the stencils' results pointwise:

    * ``stack``: one stencil -> ``(..., *spatial)``; several -> ``(..., K, *spatial)``
    * ``sum``: ``sum_k y_k`` (Laplacians: SciPy's ``generic_laplace`` adds one result per axis)
    * ``magnitude``: ``sqrt(sum_k y_k**2)``, gradient 0 where it is 0
    * ``direction``: ``atan2(y_0, y_1)``, gradient 0 where both are 0
    """

    mode: str | tuple[str, ...]
    cval: float
    epilogue: str
    stencils: tuple[Stencil, ...]
    ndim: int = 2

    def out_shape(self, shape):
        shape = tuple(shape)
        if self.epilogue == "stack" and len(self.stencils) > 1:
            d = self.ndim
            return shape[:-d] + (len(self.stencils),) + shape[-d:]
        return shape

    @property
    def linear(self) -> bool:
        return self.epilogue == "stack"


class BlurSpec(NamedTuple):
    """Selective blur: blur where the mask holds (``blend``) or masked mean (``normalized``)."""

    mode: str | tuple[str, ...]
    cval: float
    normalized: bool
    keep_border: bool
    stencil: Stencil
    ndim: int = 2


class RankSpec(NamedTuple):
    """Rank filter: each output is the value of rank ``rank`` (0-based) among its window.

    The window is ``footprint`` -- nested tuples of 0/1, one level per spatial axis (as
    dense taps) -- at first offsets ``lo`` per axis: output ``[i]`` reads ``input[i + lo + j]``
    for every ``j`` where ``footprint[j]`` is 1 (SciPy's offsets, ``lo = -(k // 2) - origin``).
    The values are ordered as ``numpy.sort`` orders them (NaN after ``+inf``) and ties are
    kept in the footprint's C order (a stable sort): the output is element ``rank`` of that
    order, and the gradient flows to that window element (the input element it reads, folded
    by the mode; nothing in ``constant`` mode's padding).  ``rank = 0`` is the minimum,
    ``count - 1`` the maximum.
    """

    mode: str | tuple[str, ...]
    cval: float
    footprint: tuple
    lo: tuple[int, ...]
    rank: int
    ndim: int = 2

    def out_shape(self, shape):
        return tuple(shape)

    @property
    def linear(self) -> bool:
        return False

    @property
    def shape(self) -> tuple[int, ...]:
        return dense_shape(self.footprint)

    @property
    def offsets(self) -> tuple[tuple[int, ...], ...]:
        """The window's offsets, in the footprint's C order (the tie order)."""
        return _offsets(self.footprint, self.lo)

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def box(self) -> bool:
        """Is the footprint a full box (every element 1)?"""
        return self.count == math.prod(self.shape)

    def extent(self, axis: int) -> tuple[int, int]:
        """(lo, hi) offsets the window reads along ``axis`` (inclusive)."""
        d = len(self.lo)
        if axis < -d:
            return 0, 0
        return self.lo[axis], self.lo[axis] + self.shape[axis] - 1


@functools.lru_cache(maxsize=256)
def _offsets(footprint, lo):
    import itertools

    shape = dense_shape(footprint)
    out = []
    for idx in itertools.product(*(range(k) for k in shape)):
        v = footprint
        for i in idx:
            v = v[i]
        if v:
            out.append(tuple(int(a + b) for a, b in zip(lo, idx)))
    return tuple(out)


def axis_mode(mode, axis: int, ndim: int) -> str:
    """The boundary mode of spatial axis ``axis`` (negative) in a spec of ``ndim`` axes."""
    return mode if isinstance(mode, str) else mode[ndim + axis]


def canonical_modes(modes) -> str | tuple[str, ...]:
    """A tuple of per-axis modes, as one string when they are all equal."""
    modes = tuple(modes)
    return modes[0] if all(m == modes[0] for m in modes) else modes


def dense_shape(taps) -> tuple[int, ...]:
    """The shape of a nested tuple of dense taps."""
    shape = []
    while isinstance(taps, tuple):
        shape.append(len(taps))
        taps = taps[0]
    return tuple(shape)


def cached(fn):
    """Memoise a pure spec builder, and let ``torch.compile`` treat its result as a constant.

    Builders take only hashable constants (names, ints, floats, tuples) and
    return specs or spec strings, so Dynamo calls them at trace time instead
    of tracing their NumPy/float arithmetic.
    """
    memo = functools.lru_cache(maxsize=4096)(fn)

    @functools.wraps(fn)
    def call(*args):
        return memo(*args)

    # on a plain function: Dynamo inlines lru_cache objects whatever their marks
    marked = _assume_constant_result(call)

    @functools.wraps(fn)
    def entry(*args):
        if torch.compiler.is_compiling():
            # Dynamo makes an int or float argument of a compiled function symbolic once it
            # changes between calls ("automatic dynamic", or at once with ``dynamic=True``), and
            # a constant's arguments must be values: specialise them here (a guard, and a
            # recompile per value, as with ``dynamic=False``) -- found by review
            args = specialised(args)
        return marked(*args)

    return entry


def specialised(v):
    """``v`` (nested tuples of ints, floats, strings, ...) with every int and float a constant
    while Dynamo traces: ``operator.index`` of a symbolic int and the hex text of a symbolic
    float are what Dynamo specialises on (``int()`` / ``float()`` keep them symbolic)."""
    if isinstance(v, tuple):
        return v if hasattr(v, "_fields") else tuple([specialised(e) for e in v])  # (named: as given)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    if isinstance(v, int):
        return operator.index(v)
    return float.fromhex(v.hex())


def _assume_constant_result(fn):
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo``.

    The public call imports Dynamo (about 1.5 s) just to set the mark it reads at trace time;
    setting the same attribute (what ``torch._dynamo.assume_constant_result`` does in every
    torch since 2.4) keeps ``import torchfilters`` light.  Once Dynamo is loaded anyway, the
    public call is used.
    """
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


_NONFINITE = {"<inf>": float("inf"), "<-inf>": float("-inf"), "<nan>": float("nan")}

#: tap tuples at least this long travel as one ``"<f8:...>"`` string (see :func:`_pack`)
_PACK_MIN = 64
#: tuples of 0/1 ints (footprint rows) at least this long travel as one ``"<bits:...>"`` string
_BITS_MIN = 8


def _pack(t) -> str:
    """A long tuple of floats as one string literal ``"<f8:VALUES:COUNTS>"``: its runs of bitwise
    equal values (-0.0 and 0.0 differ, a NaN keeps its bits), each run's value as the hex of its
    big-endian float64 bytes and its length as the hex of a big-endian int64.  A Gaussian of
    ``radius=2**20`` has 2M taps, almost all exactly 0.0 (a few kilobytes packed instead of 20 MB)
    and, for ``sigma=3000``, 230k distinct ones: packing and unpacking are a few vectorised passes
    (1 ms) where ``repr`` and ``float`` of each value took 0.7 s, and ``ast.literal_eval`` of two
    million literals 30 s."""
    a = np.asarray(t, np.float64)
    bits = a.view(np.int64)
    starts = np.flatnonzero(np.concatenate(([True], bits[1:] != bits[:-1])))
    counts = np.diff(np.append(starts, len(a)))
    return f"<f8:{a[starts].astype('>f8').tobytes().hex()}:{counts.astype('>i8').tobytes().hex()}>"


#: the most taps one packed string may unpack to (a radius of 2**20 is 2M per pass): a larger
#: count is a malformed string, not a request for gigabytes
_UNPACK_MAX = 1 << 27


def _unpack(text: str):
    """The tuple :func:`_pack` packed; also the earlier ``"<taps:...>"`` form (``repr`` of each
    value, a run as ``value*count``), which exported programs may hold.  ValueError for a
    malformed one (a run count that is not positive, values and counts that do not pair up,
    more than ``_UNPACK_MAX`` taps)."""
    try:
        if not text.endswith(">"):
            raise ValueError
        if text.startswith("<f8:"):
            values, counts = text[4:-1].split(":")
            v = np.frombuffer(bytes.fromhex(values), ">f8")
            n = np.frombuffer(bytes.fromhex(counts), ">i8")
            if len(v) != len(n) or (n <= 0).any() or int(n.sum()) > _UNPACK_MAX:
                raise ValueError
            return tuple(np.repeat(v, n).tolist())
        out = []
        for part in text[6:-1].split(" "):
            v, _, n = part.partition("*")
            f = float(v)
            k = int(n) if n else 1
            if k <= 0 or len(out) + k > _UNPACK_MAX:
                raise ValueError
            out.extend((f,) * k)
        return tuple(out)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"malformed spec string: bad packed taps {text[:40]!r}") from None


def _plain(obj):
    """Nested tuples of literals; non-finite floats become marker strings, long tuples of floats
    one packed string."""
    if isinstance(obj, tuple):
        if len(obj) >= _PACK_MIN and set(map(type, obj)) == {float}:
            return _pack(obj)
        if len(obj) >= _BITS_MIN and set(map(type, obj)) == {int} and set(obj) <= {0, 1}:
            return "<bits:" + "".join(map(str, obj)) + ">"  # a footprint's row: one string
        return tuple(_plain(o) for o in obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return "<nan>" if obj != obj else ("<inf>" if obj > 0 else "<-inf>")
    return obj


def _unplain(obj):
    if isinstance(obj, tuple):
        return tuple(_unplain(o) for o in obj)
    if isinstance(obj, str):
        if obj in _NONFINITE:
            return _NONFINITE[obj]
        if obj.startswith(("<f8:", "<taps:")):
            return _unpack(obj)
        if obj.startswith("<bits:"):
            return tuple(1 if c == "1" else 0 for c in obj[6:-1])
    return obj


def encode(spec) -> str:
    # not memoised: specs that differ only in the sign of a zero compare equal
    return type(spec).__name__ + repr(_plain(spec))


def _stencil(t) -> Stencil:
    kind, passes, lo, taps = t
    return Stencil(kind, tuple(Pass(*p) for p in passes), tuple(lo), taps)


@cached
def decode(text: str):
    name, _, body = text.partition("(")
    # literals only: spec strings also live in exported programs, never evaluate code
    t = _unplain(ast.literal_eval("(" + body))
    if name == "FilterSpec":
        mode, cval, epilogue, stencils, *nd = t
        return FilterSpec(mode, float(cval), epilogue, tuple(_stencil(s) for s in stencils), *nd)
    if name == "BlurSpec":
        mode, cval, normalized, keep_border, stencil, *nd = t
        return BlurSpec(mode, float(cval), bool(normalized), bool(keep_border), _stencil(stencil), *nd)
    if name == "RankSpec":
        mode, cval, footprint, lo, rank, *nd = t
        return RankSpec(mode, float(cval), footprint, tuple(lo), int(rank), *nd)
    raise ValueError(f"not a torchfilters spec: {text[:60]!r}")


def by_identity(maxsize: int):
    """Memoise a function of one spec by the spec object's identity (the entry keeps the spec
    alive, so its ``id`` is not reused while cached).  Decoded specs are cached by text, so a
    call finds its spec's object again without hashing its taps; for a value-keyed cache behind
    it, see :func:`zero_signs`.  At most ``maxsize`` entries (then it starts afresh)."""

    def wrap(fn):
        memo: dict = {}

        @functools.wraps(fn)
        def call(spec):
            hit = memo.get(id(spec))
            if hit is not None and hit[0] is spec:
                return hit[1]
            out = fn(spec)
            if len(memo) > maxsize:
                memo.clear()
            memo[id(spec)] = (spec, out)
            return out

        return call

    return wrap


def neg_zeros(taps) -> tuple:
    """Where ``taps`` (a flat sequence of floats) are ``-0.0``, usually ``()``.  A recipe of a
    caller's taps carries it, so that a memoised spec text keeps their signs."""
    return tuple(k for k, t in enumerate(taps) if t == 0.0 and math.copysign(1.0, t) < 0)


@by_identity(4096)
def zero_signs(spec) -> tuple:
    """Where ``spec``'s ``sep`` taps are ``-0.0``: ``((stencil, pass, tap), ...)``, usually ``()``.

    ``-0.0 == 0.0`` and both hash alike, so a cache keyed by a spec's value would serve a spec
    with ``-0.0`` taps the plan of one with ``0.0`` taps; SciPy multiplies by every tap, so the
    sign of a zero tap reaches the signs of zero of the result.  Caches keyed by value add this
    to their key.  (Dense taps of ``|w| <= DBL_EPSILON`` are ``+0.0`` already: :func:`dense`.)
    Memoised by identity (:func:`by_identity`)."""
    if isinstance(spec, FilterSpec):
        stencils = spec.stencils
    elif isinstance(spec, BlurSpec):
        stencils = (spec.stencil,)
    else:
        stencils = ()
    return tuple((i, j, k) for i, st in enumerate(stencils) if st.kind == "sep"
                for j, p in enumerate(st.passes) for k in neg_zeros(p.taps))


def sep(*passes) -> Stencil:
    return Stencil("sep", tuple(Pass(a, int(lo), tuple(map(float, taps))) for a, lo, taps in passes))


#: SciPy's N-D ``correlate`` keeps a weight only where ``|w| > DBL_EPSILON``: smaller ones and
#: NaN weights are left out of the footprint (a NaN under such a tap does not spread); engines
#: skip zero dense taps.
DBL_EPSILON = 2.220446049250313e-16


def dense(taps, lo) -> Stencil:
    """A dense stencil: ``taps`` nested ``len(lo)`` levels deep, first offsets ``lo``."""

    def clean(t, depth):
        if depth == 0:
            t = float(t)
            return t if abs(t) > DBL_EPSILON else 0.0  # (NaN too: found by review)
        return tuple(clean(v, depth - 1) for v in t)

    return Stencil("dense", (), tuple(int(v) for v in lo), clean(taps, len(lo)))


def centered_lo(k: int, origin: int = 0) -> int:
    """SciPy's first-tap offset for a kernel of length ``k`` at ``origin``."""
    return -(k // 2) - origin
