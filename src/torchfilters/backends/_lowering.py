"""Host-side rules every engine applies to a spec before planning it, once per ``(spec, shape)``.

**Folding taps onto the image's period.**  A 1-D pass of a length-``n`` axis computes
``out[i] = sum_j w_j x[fold(i + lo + j)]``.  Taps whose offsets always read the same sample
can be merged, so a pass never needs more taps than the axis has distinct readings:

* ``reflect`` (period ``2n``), ``mirror`` (``2n - 2``, ``n > 1``), ``wrap`` (``n``): offsets
  congruent modulo the period read the same sample for every ``i``;
* ``nearest``: every offset ``<= -(n-1)`` reads ``x[0]`` and every offset ``>= n-1`` reads
  ``x[n-1]``, whatever ``i``;
* ``constant``: every offset ``<= -n`` or ``>= n`` reads ``cval``;
* an axis of size 1 (any mode but ``constant``): every offset reads ``x[0]``.

A Gaussian of ``radius=2**20`` on an 8x8 image thus becomes a pass of at most ``6n`` taps:
the engines' tiles, halos and loops are bounded by the image, not by the radius.  Only a
pass that reaches more than ``2n + 16`` samples away is folded; shorter ones are bounded by
the image already and stay as they are.

**SciPy's NaN rule survives.**  SciPy's 1-D passes multiply every tap, so a sample reached
by a zero tap turns an inf into NaN, and one reached by taps of both signs turns an inf into
``inf - inf``.  Merging keeps that: per class of offsets, the positive taps, the negative taps
and the zero taps are three separate groups (their sums: exact classes, float64 sums), each
its own tap.  A pass is contiguous (one weight per offset), so in the periodic modes every
class gets as many taps as the class with the most groups, the extra ones made by halving a
group (``S/2 + S/2 == S`` exactly, same sign).  Nothing is ever added that SciPy does not
multiply.  The sequential ``constant`` correction (``cpu.plan._correction``) is computed
from the folded passes, which are exactly the original ones as functions of the padded input.

**SciPy's accumulation order.**  ``scipy.ndimage.correlate1d`` (``NI_Correlate1D``) tests
an odd-length pass for symmetry (``|w[c+j] - w[c-j]| <= DBL_EPSILON`` for every ``j``) and
then antisymmetry (``|w[c+j] + w[c-j]| <= DBL_EPSILON``) and sums

* symmetric: ``y = x[c]*w[c]``, then ``y += (x[c-j] + x[c+j]) * w[c-j]`` for ``j = r .. 1``;
* antisymmetric: the same with ``x[c-j] - x[c+j]``;
* otherwise: ``y = x[k-1]*w[k-1]``, then ``y += x[j]*w[j]`` for ``j = 0 .. k-2``.

Every engine evaluates a ``sep`` pass in that order (:func:`pass_kind` says which, once, for
all of them).  This is what makes ``gradient_direction`` keep SciPy's signs of zero (``x*0``
then ``(a - a)*-1`` is ``-0`` exactly when the centre sample is negative) and the Gaussian
derivative of a constant image exactly 0 (``(c - c)*w == 0``).  :func:`lower` also makes the
right half of a (anti)symmetric pass the exact mirror of its left half (SciPy pairs with the
left weights only), so that the linear map every engine and adjoint sees is the one summed.

Not folded: ``dense`` stencils (zero weights are outside their footprint, they are the
user's own arrays), and selective-blur specs with ``keep_border`` (the border band is
derived from the stencil's reach, which folding would shorten).
"""

from __future__ import annotations

import numpy as np

from .._spec import BlurSpec, FilterSpec, Pass, Stencil, axis_mode

__all__ = ["lower", "fold_pass", "pass_kind", "pass_entries", "SYM", "ANTI", "GENERAL"]

#: :func:`pass_kind`'s answers (SciPy's ``symmetric`` flag in ``NI_Correlate1D``)
SYM, ANTI, GENERAL = 1, -1, 0

_DBL_EPSILON = 2.220446049250313e-16

_cache: dict = {}
_CACHE_MAX = 256


def lower(spec, shape):
    """``spec`` with every ``sep`` pass folded onto the image's period (see the module
    docstring); the very same object when nothing folds.  ``shape`` is the input's shape (its
    last ``spec.ndim`` sizes are the spatial ones).  Cached by identity: decoded specs are
    cached by text, and a huge spec is never hashed here."""
    sizes = tuple(shape[-spec.ndim:])
    key = (id(spec), sizes)
    hit = _cache.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    out = _lower(spec, sizes)
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = (spec, out)
    return out


def _lower(spec, sizes):
    if isinstance(spec, FilterSpec):
        sts = tuple(_lower_stencil(st, spec.mode, sizes) for st in spec.stencils)
        if all(a is b for a, b in zip(sts, spec.stencils)):
            return spec
        return spec._replace(stencils=sts)
    if isinstance(spec, BlurSpec) and not spec.keep_border:
        st = _lower_stencil(spec.stencil, spec.mode, sizes)
        if st is spec.stencil:
            return spec
        return spec._replace(stencil=st)
    return spec


def _lower_stencil(st: Stencil, mode, sizes) -> Stencil:
    if st.kind != "sep":
        return st
    d = len(sizes)
    passes = tuple(canonical_pass(fold_pass(p, sizes[p.axis], axis_mode(mode, p.axis, d))) for p in st.passes)
    if all(a is b for a, b in zip(passes, st.passes)):
        return st
    return Stencil("sep", passes, st.lo, st.taps)


def pass_kind(taps) -> int:
    """SciPy's classification of a 1-D pass (``NI_Correlate1D``): :data:`SYM`, :data:`ANTI`
    or :data:`GENERAL` (even lengths are general; a NaN weight compares as symmetric, as in
    SciPy's ``fabs(a - b) > DBL_EPSILON`` test).  It decides the engines' accumulation order
    (module docstring)."""
    k = len(taps)
    if k % 2 == 0:
        return GENERAL
    c = k // 2
    if c == 0:
        return SYM
    if k <= 64:
        if not any(abs(taps[c + j] - taps[c - j]) > _DBL_EPSILON for j in range(1, c + 1)):
            return SYM
        if not any(abs(taps[c + j] + taps[c - j]) > _DBL_EPSILON for j in range(1, c + 1)):
            return ANTI
        return GENERAL
    w = np.asarray(taps, np.float64)
    left, right = w[c - 1 :: -1], w[c + 1 :]
    with np.errstate(invalid="ignore", over="ignore"):
        if not np.any(np.abs(right - left) > _DBL_EPSILON):
            return SYM
        if not np.any(np.abs(right + left) > _DBL_EPSILON):
            return ANTI
    return GENERAL


def pass_entries(p: Pass):
    """``(kind, [(offset, weight), ...])``: the 1-D pass ``p`` as SciPy sums it, one entry per
    term in order.  (Anti)symmetric: the centre tap, then per pair from the outermost in the
    left tap and the right tap, both with the left weight (the pair is
    ``(x[left] +- x[right]) * w[left]``); general: the last tap, then the others in order.
    Offsets are along ``p.axis``, relative to the output sample."""
    kind = pass_kind(p.taps)
    k = len(p.taps)
    t = [float(w) for w in p.taps]
    if kind == GENERAL:
        return kind, [(p.lo + k - 1, t[k - 1])] + [(p.lo + i, t[i]) for i in range(k - 1)]
    c = k // 2
    out = [(p.lo + c, t[c])]
    for i in range(c):
        out += [(p.lo + i, t[i]), (p.lo + k - 1 - i, t[i])]
    return kind, out


def canonical_pass(p: Pass) -> Pass:
    """``p`` with the right half of an (anti)symmetric pass made the exact mirror (negated
    mirror) of its left half: SciPy multiplies each pair by the left weight; ``p`` itself when
    that changes nothing."""
    kind = pass_kind(p.taps)
    k = len(p.taps)
    if kind == GENERAL or k < 3:
        return p
    c = k // 2
    t = p.taps
    right = tuple(t[c - j] if kind == SYM else -t[c - j] for j in range(1, c + 1))
    if right == t[c + 1 :]:  # (equal up to the sign of a zero weight: nothing to change)
        return p
    return Pass(p.axis, p.lo, t[: c + 1] + right)


#: passes reaching at most this far past twice the axis are left alone (see ``_needs_fold``)
_REACH = 16


def _needs_fold(lo: int, k: int, n: int, mode: str) -> bool:
    """Fold only a pass that reaches well past the image (more than ``2n + 16`` samples from
    the output): one that does not is bounded by the image already, and keeping it as it
    is keeps a symmetric pass symmetric (the separable fast path) and every engine's result
    the same bits as before."""
    return max(-lo, lo + k - 1) > 2 * n + _REACH


def _period(n: int, mode: str) -> int:
    return {"reflect": 2 * n, "mirror": 2 * n - 2, "wrap": n}[mode]


def _groups(cls: np.ndarray, w: np.ndarray, ncls: int):
    """Per class: (sum of positive taps, sum of negative taps, has a zero tap), as arrays."""
    pos = np.bincount(cls, weights=np.where(w > 0, w, 0.0), minlength=ncls)
    neg = np.bincount(cls, weights=np.where(w < 0, w, 0.0), minlength=ncls)
    npos = np.bincount(cls, weights=(w > 0).astype(np.float64), minlength=ncls)
    nneg = np.bincount(cls, weights=(w < 0).astype(np.float64), minlength=ncls)
    nzero = np.bincount(cls, weights=(w == 0).astype(np.float64), minlength=ncls)
    out = []
    for c in range(ncls):
        g = []
        if npos[c]:
            g.append(float(pos[c]))
        if nneg[c]:
            g.append(float(neg[c]))
        if nzero[c]:
            g.append(0.0)
        out.append(g)
    return out


def _spread(g, m):
    """``g`` (a class's group taps) made ``m`` taps long by halving its first tap (exact, same
    sign); None if a half would underflow."""
    g = list(g)
    while len(g) < m:
        h = g[0] * 0.5
        if g[0] != 0.0 and (h == 0.0 or h * 2.0 != g[0]):
            return None
        g[0:1] = [h, g[0] - h]
    return g


def fold_pass(p: Pass, n: int, mode: str) -> Pass:
    """``p`` (a 1-D pass along an axis of size ``n``) with its taps folded onto the axis's
    period (see the module docstring); ``p`` itself when nothing folds."""
    k = len(p.taps)
    if k == 0 or n <= 0 or not _needs_fold(p.lo, k, n, mode):
        return p
    w = np.asarray(p.taps, np.float64)
    if not np.isfinite(w).all():
        return p  # (a NaN tap belongs to no sign group)
    off = np.arange(p.lo, p.lo + k, dtype=np.int64)
    if mode != "constant" and (n == 1 or mode in ("reflect", "mirror", "wrap")):
        if n == 1:
            P, a = 1, 0
        else:
            P = _period(n, mode)
            a = -(P // 2)
        if k <= P:  # nothing to merge: shift the pass by whole periods next to the image
            return Pass(p.axis, p.lo - P * ((p.lo + k // 2) // P), p.taps)
        cls = (off - a) % P
        groups = _groups(cls, w, P)
        m = max(len(g) for g in groups)
        slots = [_spread(g, m) for g in groups]
        if any(s is None for s in slots):
            return p
        taps = [0.0] * (m * P)
        for c, s in enumerate(slots):
            for j, v in enumerate(s):
                taps[c + j * P] = v
        return Pass(p.axis, a, tuple(taps))
    # nearest / constant: the offsets that always read the edge (cval) are the two outer
    # classes; each offset in between is its own
    edge = n - 1 if mode == "nearest" else n
    low = off <= -edge
    high = off >= edge
    mid = ~(low | high)
    parts_lo = _groups(np.zeros(int(low.sum()), np.int64), w[low], 1)[0] if low.any() else []
    parts_hi = _groups(np.zeros(int(high.sum()), np.int64), w[high], 1)[0] if high.any() else []
    taps = list(reversed(parts_lo)) + [float(v) for v in w[mid]] + parts_hi
    if parts_lo:
        lo = -edge - (len(parts_lo) - 1)
    else:
        lo = int(off[mid][0]) if mid.any() else edge
    # contiguity: low slots end at -edge, mid runs on from -edge + 1, high slots start at edge
    return Pass(p.axis, lo, tuple(taps))
