"""Stencil specifications: the data every backend executes.

Every op in torchfilters is "a few small linear stencils on the last two
axes, combined pointwise, maybe masked".  A spec describes that as data; the
backends (reference, numba CPU, Triton) each implement one engine that runs
any spec.  Specs travel through ``torch.library`` custom ops as strings (so
``torch.compile`` sees them as constants) and are decoded once and cached.

A :class:`Stencil` is either

* ``sep``: a sequence of 1-D passes ``(axis, lo, taps)`` applied one after
  another, each padding by the boundary mode -- SciPy's semantics for
  ``sobel``/``gaussian_filter`` (which matter in ``constant`` mode with a
  non-zero ``cval``), or
* ``dense``: one 2-D kernel ``taps[a][b]`` at offsets ``(lo_y + a, lo_x + b)``.

Offsets follow ``scipy.ndimage.correlate``: output ``[i]`` reads
``input[i + lo + j]`` for tap ``j``, with ``lo = -(k // 2) - origin``.
"""

from __future__ import annotations

import ast
import functools
import math
import sys
from typing import NamedTuple, Tuple

import numpy as np
import torch

Taps = Tuple[float, ...]


class Pass(NamedTuple):
    axis: int  # -2 (H, y) or -1 (W, x)
    lo: int  # offset of the first tap
    taps: Taps


class Stencil(NamedTuple):
    kind: str  # "sep" or "dense"
    passes: Tuple[Pass, ...] = ()  # sep
    lo: Tuple[int, int] = (0, 0)  # dense: (lo_y, lo_x)
    taps: Tuple[Taps, ...] = ()  # dense: kh rows of kw taps

    def extent(self, axis: int) -> Tuple[int, int]:
        """(lo, hi) offsets this stencil reads along ``axis`` (inclusive)."""
        if self.kind == "dense":
            if axis == -2:
                return self.lo[0], self.lo[0] + len(self.taps) - 1
            return self.lo[1], self.lo[1] + len(self.taps[0]) - 1
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

    * ``stack``: one stencil -> ``(..., H, W)``; several -> ``(..., K, H, W)``
    * ``magnitude``: ``sqrt(sum_k y_k**2)``, gradient 0 where it is 0
    * ``direction``: ``atan2(y_0, y_1)``, gradient 0 where both are 0
    """

    mode: str
    cval: float
    epilogue: str
    stencils: Tuple[Stencil, ...]

    def out_shape(self, shape):
        shape = tuple(shape)
        if self.epilogue == "stack" and len(self.stencils) > 1:
            return shape[:-2] + (len(self.stencils),) + shape[-2:]
        return shape

    @property
    def linear(self) -> bool:
        return self.epilogue == "stack"


class BlurSpec(NamedTuple):
    """Selective blur: blur where the mask holds (``blend``) or masked mean (``normalized``)."""

    mode: str
    cval: float
    normalized: bool
    keep_border: bool
    stencil: Stencil


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
    return _assume_constant_result(call)


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

#: tap tuples at least this long travel as one ``"<taps:...>"`` string (see :func:`_pack`)
_PACK_MIN = 64


def _pack(t) -> str:
    """A long tuple of floats as one string literal: ``repr`` of each value, a run of equal
    values as ``value*count``.  A Gaussian of ``radius=2**20`` has 2M taps, almost all of them
    exactly 0.0: packed it is a few kilobytes instead of 20 MB, and reading it back is a split
    instead of ``ast.literal_eval`` of two million literals (30 s)."""
    a = np.asarray(t, np.float64)
    # runs of bitwise-equal values (-0.0 and 0.0 differ, NaNs of one bit pattern are equal)
    bits = a.view(np.int64)
    starts = np.flatnonzero(np.concatenate(([True], bits[1:] != bits[:-1])))
    ends = np.append(starts[1:], len(a))
    parts = []
    for i, j in zip(starts.tolist(), ends.tolist()):
        v = repr(float(a[i]))
        parts.append(v if j - i == 1 else f"{v}*{j - i}")
    return "<taps:" + " ".join(parts) + ">"


def _unpack(text: str):
    out = []
    for part in text[6:-1].split(" "):
        v, _, n = part.partition("*")
        f = float(v)
        if n:
            out.extend((f,) * int(n))
        else:
            out.append(f)
    return tuple(out)


def _plain(obj):
    """Nested tuples of literals; non-finite floats become marker strings, long tuples of floats
    one packed string."""
    if isinstance(obj, tuple):
        if len(obj) >= _PACK_MIN and set(map(type, obj)) == {float}:
            return _pack(obj)
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
        if obj.startswith("<taps:"):
            return _unpack(obj)
    return obj


def encode(spec) -> str:
    # not memoised: specs that differ only in the sign of a zero compare equal
    return type(spec).__name__ + repr(_plain(spec))


def _stencil(t) -> Stencil:
    kind, passes, lo, taps = t
    return Stencil(kind, tuple(Pass(*p) for p in passes), tuple(lo), tuple(tuple(r) for r in taps))


@cached
def decode(text: str):
    name, _, body = text.partition("(")
    # literals only: spec strings also live in exported programs, never evaluate code
    t = _unplain(ast.literal_eval("(" + body))
    if name == "FilterSpec":
        mode, cval, epilogue, stencils = t
        return FilterSpec(mode, float(cval), epilogue, tuple(_stencil(s) for s in stencils))
    if name == "BlurSpec":
        mode, cval, normalized, keep_border, stencil = t
        return BlurSpec(mode, float(cval), bool(normalized), bool(keep_border), _stencil(stencil))
    raise ValueError(f"not a torchfilters spec: {text[:60]!r}")


def sep(*passes) -> Stencil:
    return Stencil("sep", tuple(Pass(a, int(lo), tuple(map(float, taps))) for a, lo, taps in passes))


#: SciPy's 2-D ``correlate`` leaves weights with ``|w| <= DBL_EPSILON`` out of the
#: footprint (a NaN under such a tap does not spread); engines skip zero dense taps.
DBL_EPSILON = 2.220446049250313e-16


def dense(taps, lo) -> Stencil:
    rows = tuple(tuple(0.0 if abs(float(w)) <= DBL_EPSILON else float(w) for w in row) for row in taps)
    return Stencil("dense", (), (int(lo[0]), int(lo[1])), rows)


def centered_lo(k: int, origin: int = 0) -> int:
    """SciPy's first-tap offset for a kernel of length ``k`` at ``origin``."""
    return -(k // 2) - origin
