"""The Gaussian of ``torchfilters.canny`` on the CPU, one smoothed row at a time (numba).

scikit-image smooths with ``scipy.ndimage.gaussian_filter``: a 1-D pass along H, then one along
W, each computed in float64 and stored in the image's dtype (float32 rounds after each pass),
then, with ``mode == 'constant'`` or a mask, divides by the same Gaussian of the mask plus the
dtype's epsilon (``bleed-over``).  :func:`_smooth_row` computes smoothed row ``k`` of a slice
from the input rows it reads, nothing else: the H pass over the ``2 r + 1`` input rows (folded
by the mode) into a float64 line, rounded to the dtype, the line extended by the mode, the W pass,
rounded, and divided by the bleed-over row.  The fused Canny kernel (``canny._k_fused``) calls it
row by row into a ring of five rows, so no smoothed image (nor any float64 temporary) is ever
stored.

The arithmetic is SciPy's ``NI_Correlate1D`` for a symmetric kernel (``_lowering.pass_kind``:
every Gaussian of order 0 is symmetric), the order every engine uses: ``x[0] * w[0]``, then per
pair from the outermost in, ``+= (x[-p] + x[+p]) * w[-p]``, all in float64 (the input widened;
``cval`` a double, as SciPy's line buffer), no fused multiply-add.  The loops run pair by pair
over a whole row, so each pixel's sum keeps that order and the row loop vectorises.  Float64
results are SciPy's bits; float32 ones too (each pass rounded as SciPy stores it).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from .._lowering import SYM, pass_kind
from . import cache

cache.install()

from .plan import _fold
from .prims import _JIT, _OVL_LITERAL

__all__ = ["_k_smooth", "_smooth_row", "fold_map", "pair_weights", "smooth_plan"]


def _as(v, c):  # pragma: no cover - replaced by the overload in compiled code
    return v


@overload(_as, jit_options=dict(_OVL_LITERAL, inline="always"))
def _as_ov(v, c):
    """``v`` rounded to the dtype of the carrier ``c`` (float32 or float64)."""
    if c == types.float32:
        return lambda v, c: np.float32(v)
    return lambda v, c: np.float64(v)


def pair_weights(sigma: float, truncate: float = 4.0):
    """float64 ``(r + 1,)``: the centre weight, then the left weight at distance ``p`` (the pair
    ``(x[-p] + x[+p])`` is multiplied by it, as SciPy does); ``None`` if the kernel is not
    symmetric by SciPy's test (never for order 0).  ``sigma <= 1e-15``: SciPy skips the axis,
    the same as the single tap 1.0 (``x * 1.0`` is exact)."""
    from ...kernels import gaussian_kernel1d, gaussian_radius

    if sigma <= 1e-15:
        return np.ones(1, np.float64)
    r = gaussian_radius(sigma, truncate)
    taps = gaussian_kernel1d(sigma, 0, r)
    if pass_kind(taps) != SYM:  # pragma: no cover - a Gaussian is symmetric
        return None
    c = len(taps) // 2
    return np.array([taps[c]] + [taps[c - p] for p in range(1, c + 1)], np.float64)


def fold_map(n: int, r: int, mode: str) -> np.ndarray:
    """int64 ``(n + 2 r,)``: the index read at positions ``-r .. n + r - 1`` of an axis of size
    ``n`` (``reference.fold_indices``, SciPy's folding), ``-1`` for ``cval``."""
    return _fold(n, -r, n + 2 * r, mode)


def smooth_plan(H: int, W: int, sigma, mode: str):
    """``(wy, iy, wx, ix)`` for :func:`_smooth_row`, or None where the kernel is not symmetric."""
    wy, wx = pair_weights(sigma[0]), pair_weights(sigma[1])
    if wy is None or wx is None:  # pragma: no cover
        return None
    return wy, fold_map(H, len(wy) - 1, mode), wx, fold_map(W, len(wx) - 1, mode)


@njit(**_JIT)
def _smooth_row(x, n, k, wy, iy, wx, ix, cval, bleed, hasb, ext, acc, out):
    """Smoothed row ``k`` of slice ``n`` of ``x`` into ``out`` (``W``, the dtype).  ``ext``
    (float64, ``W + 2 rx``) and ``acc`` (float64, ``W``) are scratch lines."""
    W = x.shape[2]
    ry = wy.shape[0] - 1
    rx = wx.shape[0] - 1
    c = x[n, 0, 0]
    xr = x[n, k]
    e = ext[rx : rx + W]  # views: indices the loops can prove in range, so they vectorise
    w0 = wy[0]
    # the H pass: centre, then the pairs from the outermost in
    for j in range(W):
        e[j] = np.float64(xr[j]) * w0
    for p in range(ry, 0, -1):
        a = iy[ry + k - p]
        b = iy[ry + k + p]
        w = wy[p]
        if a >= 0 and b >= 0:
            xa = x[n, a]
            xb = x[n, b]
            for j in range(W):
                e[j] += (np.float64(xa[j]) + np.float64(xb[j])) * w
        elif a >= 0 or b >= 0:
            xa = x[n, a if a >= 0 else b]
            for j in range(W):
                e[j] += (np.float64(xa[j]) + cval) * w
        else:
            v = (cval + cval) * w
            for j in range(W):
                e[j] += v
    # stored in the dtype, as SciPy's first pass
    for j in range(W):
        e[j] = np.float64(_as(e[j], c))
    for q in range(rx):
        a = ix[q]
        ext[q] = ext[rx + a] if a >= 0 else cval
        b = ix[rx + W + q]
        ext[rx + W + q] = ext[rx + b] if b >= 0 else cval
    # the W pass
    w0 = wx[0]
    for j in range(W):
        acc[j] = e[j] * w0
    for p in range(rx, 0, -1):
        w = wx[p]
        el = ext[rx - p : rx - p + W]
        er = ext[rx + p : rx + p + W]
        for j in range(W):
            acc[j] += (el[j] + er[j]) * w
    if hasb:
        br = bleed[n if bleed.shape[0] > 1 else 0, k]
        for j in range(W):
            out[j] = _as(acc[j], c) / br[j]
    else:
        for j in range(W):
            out[j] = _as(acc[j], c)


@njit(**_JIT)
def _k_smooth(x, wy, iy, wx, ix, cval, bleed, hasb, s, nb, it0, it1):
    """The smoothed images into ``s`` (the quantile path and the bleed-over of a mask), work
    items ``(slice, band)``."""
    _N, H, W = x.shape
    ext = np.empty(W + 2 * (wx.shape[0] - 1), np.float64)
    acc = np.empty(W, np.float64)
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        for k in range(b * H // nb, (b + 1) * H // nb):
            _smooth_row(x, n, k, wy, iy, wx, ix, cval, bleed, hasb, ext, acc, s[n, k])
