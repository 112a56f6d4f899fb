"""Canny edges on the CPU: fused numba kernels after the smoothing (``torchfilters.canny``).

Two passes over each ``(H, W)`` slice of the smoothed images ``(N, H, W)``:

1. **Sobel -> magnitude -> NMS, fused** (:func:`_k_edges`): a work item is a band of rows of
   one slice; it computes the magnitude of its rows plus one halo row above and below into a
   thread-local buffer (rows are recomputed at band seams, never stored), then classifies each
   pixel (0: suppressed, 1: low, 2: seed, ``>= high``) with the gradient recomputed at the pixel.
   With ``use_quantiles`` the thresholds need the whole magnitude first: :func:`_k_mag` writes
   it, the thresholds are taken per slice (``reference_canny.thresholds``), and
   :func:`_k_nms` classifies from it.
2. **Hysteresis** (:func:`_k_hyst`): a stack-based flood fill from every seed through the low
   pixels (8-connected), O(pixels), one work item per slice.

The arithmetic is ``reference_canny``'s (SciPy's Sobel rounding, NumPy's float32 magnitude, the
C promotions of scikit-image's NMS), so the classes are the reference's bit for bit.  Work items
run on the package's thread pool (``threads._launch``): parallel over slices, and over row bands
of each slice when there are fewer slices than threads.  Kernels are cached on disk like the
others (``cache.install()``).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, types
from numba.extending import overload

from .. import reference_canny as _ref
from . import cache

cache.install()

from .prims import _JIT
from .threads import _launch, _threads

__all__ = ["available", "canny_edges"]

NAME = "cpu"


def available(device, dtype) -> bool:
    return torch.device(device).type == "cpu" and dtype in (torch.float32, torch.float64)


def _as(v, c):  # pragma: no cover - replaced by the overload in compiled code
    return v


@overload(_as, jit_options={"inline": "always"})
def _as_ov(v, c):
    """``v`` rounded to the dtype of the carrier ``c`` (float32 or float64)."""
    if c == types.float32:
        return lambda v, c: np.float32(v)
    return lambda v, c: np.float64(v)


@njit(inline="always", **_JIT)
def _grad(r0, r1, r2, j, jl, jr, c):
    """SciPy's ``(sobel(s, 0), sobel(s, 1))`` at column ``j`` of row ``r1`` (``r0``/``r2`` the rows
    above/below, ``jl``/``jr`` the columns left/right, edges already folded): differences in the
    dtype, the cross pass in float64, rounded once."""
    d0c = r2[j] - r0[j]
    d0l = r2[jl] - r0[jl]
    d0r = r2[jr] - r0[jr]
    gi = _as(np.float64(d0c) * 2.0 + (np.float64(d0l) + np.float64(d0r)), c)
    d1c = r1[jr] - r1[jl]
    d1u = r0[jr] - r0[jl]
    d1d = r2[jr] - r2[jl]
    gj = _as(np.float64(d1c) * 2.0 + (np.float64(d1u) + np.float64(d1d)), c)
    return gi, gj


@njit(**_JIT)
def _mag_row(s, n, i, H, W, out):
    """The magnitude of row ``i`` of slice ``n`` into ``out`` (``W``), in the dtype."""
    c = s[n, 0, 0]
    r0 = s[n, max(i - 1, 0)]
    r1 = s[n, i]
    r2 = s[n, min(i + 1, H - 1)]
    for j in range(W):
        gi, gj = _grad(r0, r1, r2, j, max(j - 1, 0), min(j + 1, W - 1), c)
        out[j] = np.sqrt(gi * gi + gj * gj)


@njit(inline="always", **_JIT)
def _lerp_le(n2, n1, w, m64):
    """``n2 * w + n1 * (1.0 - w) <= m`` with C's promotions (``n2 * w`` in the dtype)."""
    return np.float64(n2 * w) + np.float64(n1) * (1.0 - np.float64(w)) <= m64


@njit(**_JIT)
def _nms_row(s, n, i, W, mu, mc, md, em, hasm, lo, hi, out):
    """Classes of row ``i`` (``1 <= i <= H - 2``) from the magnitude rows above (``mu``), at
    (``mc``) and below (``md``): skimage's ``_nonmaximum_suppression_bilinear``, case by case."""
    c = s[n, 0, 0]
    r0 = s[n, i - 1]
    r1 = s[n, i]
    r2 = s[n, i + 1]
    out[0] = 0
    out[W - 1] = 0
    for y in range(1, W - 1):
        out[y] = 0
        m = mc[y]
        m64 = np.float64(m)
        if hasm and not em[n, i, y]:
            continue
        if not (m64 >= lo):
            continue
        gi, gj = _grad(r0, r1, r2, y, y - 1, y + 1, c)
        up = gi >= 0
        down = gi <= 0
        left = gj <= 0
        right = gj >= 0
        cond1 = (up and right) or (down and left)
        cond2 = (down and right) or (up and left)
        if not cond1 and not cond2:
            continue
        ai = abs(gi)
        aj = abs(gj)
        if cond1:
            if ai > aj:
                w = aj / ai
                n11, n12, n21, n22 = md[y], md[y + 1], mu[y], mu[y - 1]
            else:
                w = ai / aj
                n11, n12, n21, n22 = mc[y + 1], md[y + 1], mc[y - 1], mu[y - 1]
        else:
            if ai < aj:
                w = ai / aj
                n11, n12, n21, n22 = mc[y + 1], mu[y + 1], mc[y - 1], md[y - 1]
            else:
                w = aj / ai
                n11, n12, n21, n22 = mu[y], mu[y + 1], md[y], md[y - 1]
        if _lerp_le(n12, n11, w, m64) and _lerp_le(n22, n21, w, m64) and m > 0:
            out[y] = 2 if m64 >= hi else 1


@njit(**_JIT)
def _k_edges(s, em, hasm, lo, hi, cls, nb, it0, it1):
    """Fused Sobel -> magnitude -> NMS over work items ``(slice, band)``; classes into ``cls``."""
    _N, H, W = s.shape
    buf = np.empty((3, W), s.dtype)
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        i0 = b * H // nb
        i1 = (b + 1) * H // nb
        cls[n, i0:i1, :] = 0
        a = max(i0, 1)
        e = min(i1, H - 1)
        if a >= e or W < 3:
            continue
        _mag_row(s, n, a - 1, H, W, buf[(a - 1) % 3])
        _mag_row(s, n, a, H, W, buf[a % 3])
        for i in range(a, e):
            _mag_row(s, n, i + 1, H, W, buf[(i + 1) % 3])
            _nms_row(s, n, i, W, buf[(i - 1) % 3], buf[i % 3], buf[(i + 1) % 3], em, hasm, lo[n], hi[n], cls[n, i])


@njit(**_JIT)
def _k_mag(s, mag, nb, it0, it1):
    """The magnitude of every pixel (the quantile path), work items ``(slice, band)``."""
    _N, H, W = s.shape
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        for i in range(b * H // nb, (b + 1) * H // nb):
            _mag_row(s, n, i, H, W, mag[n, i])


@njit(**_JIT)
def _k_nms(s, mag, em, hasm, lo, hi, cls, nb, it0, it1):
    """NMS from a stored magnitude (the quantile path)."""
    _N, H, W = s.shape
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        i0 = b * H // nb
        i1 = (b + 1) * H // nb
        cls[n, i0:i1, :] = 0
        if W < 3:
            continue
        for i in range(max(i0, 1), min(i1, H - 1)):
            _nms_row(s, n, i, W, mag[n, i - 1], mag[n, i], mag[n, i + 1], em, hasm, lo[n], hi[n], cls[n, i])


@njit(**_JIT)
def _k_hyst(cls, out, W, it0, it1):
    """Flood fill from every seed (class 2) through the low pixels (class >= 1), 8-connected.
    ``cls``/``out`` are ``(N, H * W)``; classes are 0 on the border, so the neighbours of a class
    pixel are in range."""
    HW = cls.shape[1]
    stack = np.empty(HW, np.int64)
    for n in range(it0, it1):
        c = cls[n]
        o = out[n]
        for p in range(HW):
            if c[p] != 2 or o[p]:
                continue
            o[p] = True
            top = 0
            stack[top] = p
            top += 1
            while top > 0:
                top -= 1
                q = stack[top]
                for d in (-W - 1, -W, -W + 1, -1, 1, W - 1, W, W + 1):
                    r = q + d
                    if c[r] != 0 and not o[r]:
                        o[r] = True
                        stack[top] = r
                        top += 1


def _bands(N: int, H: int, nt: int) -> int:
    """Row bands per slice: enough work items for the threads, bands of at least 32 rows."""
    if nt <= 1 or N >= 2 * nt:
        return 1
    return max(1, min(-(-4 * nt // N), H // 32))


def canny_edges(smoothed, emask, low, high, use_quantiles):
    """Bool ``(N, H, W)`` edges of the smoothed images (``reference_canny.canny_edges``)."""
    s = smoothed.contiguous()
    N, H, W = s.shape
    out = torch.zeros((N, H, W), dtype=torch.bool)
    if s.numel() == 0:
        return out
    nt = _threads()
    nb = _bands(N, H, nt)
    sn = s.numpy()
    hasm = emask is not None
    em = emask.contiguous().numpy() if hasm else np.zeros((1, 1, 1), np.bool_)
    cls = np.empty((N, H, W), np.uint8)
    serial = N * H * W < 65536
    if use_quantiles:
        mag = torch.empty_like(s)
        _launch(_k_mag, (sn, mag.numpy(), nb), N * nb, nt, serial)
        lo, hi = _ref.thresholds(mag, low, high, True)
        _launch(_k_nms, (sn, mag.numpy(), em, hasm, lo.numpy(), hi.numpy(), cls, nb), N * nb, nt, serial)
    else:
        lo, hi = _ref.thresholds(s[:, :0, :0], low, high, False)
        _launch(_k_edges, (sn, em, hasm, lo.numpy(), hi.numpy(), cls, nb), N * nb, nt, serial)
    _launch(_k_hyst, (cls.reshape(N, H * W), out.numpy().reshape(N, H * W), W), N, nt, serial)
    return out
