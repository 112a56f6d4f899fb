"""Canny edges after the smoothing, in pure torch (any device): the oracle of the fused engines.

:func:`canny_edges` takes the smoothed images ``(N, H, W)`` (float32 or float64, the compute
dtype) and runs scikit-image's ``feature.canny`` from the Sobel gradients on, with its exact
arithmetic:

* ``isobel``/``jsobel`` are ``scipy.ndimage.sobel(s, axis)`` (mode ``'reflect'``): the
  difference ``s[+1] - s[-1]`` rounded to the dtype, then ``2 d + (d[-1] + d[+1])`` across,
  computed in float64 and rounded once (SciPy's 1-D passes compute in double and store in the
  array's dtype; float64 results are SciPy's bits);
* ``magnitude = sqrt(isobel * isobel + jsobel * jsobel)`` in the dtype (NumPy's arithmetic);
* the thresholds of :func:`thresholds` (``use_quantiles``: ``numpy.percentile`` per slice);
* the non-maximum suppression of skimage's Cython ``_nonmaximum_suppression_bilinear``,
  vectorised, with C's promotions (:func:`nms_classes`);
* hysteresis: 8-connected components of the kept pixels with ``magnitude > 0`` that hold a
  pixel ``>= high``, by iterated 3x3 dilation restricted to them, to a fixed point (checked
  every few steps; on the input's device).

The fused engines (``cpu.canny``, ``triton.canny``) compute the same classes bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "available",
    "canny_edges",
    "hysteresis",
    "low_value",
    "magnitude",
    "nms_classes",
    "sobel_pair",
    "sorted_select",
    "thresholds",
]

NAME = "reference"


def available(device, dtype) -> bool:
    return True


def _round(v: Tensor, dtype: torch.dtype) -> Tensor:
    return v if v.dtype == dtype else v.to(dtype)


def sobel_pair(s: Tensor):
    """``(isobel, jsobel)``: SciPy's ``sobel(s, 0)`` and ``sobel(s, 1)`` per ``(H, W)`` slice, mode
    ``'reflect'`` (at radius 1 the edge sample repeats: index clamping)."""
    H, W = s.shape[-2], s.shape[-1]
    r = torch.arange(H, device=s.device)
    c = torch.arange(W, device=s.device)
    up, dn = (r - 1).clamp(min=0), (r + 1).clamp(max=H - 1)
    lf, rt = (c - 1).clamp(min=0), (c + 1).clamp(max=W - 1)
    d0 = (s[..., dn, :] - s[..., up, :]).double()  # rounded to the dtype, then exact in double
    d1 = (s[..., :, rt] - s[..., :, lf]).double()
    i = _round(d0 * 2.0 + (d0[..., :, lf] + d0[..., :, rt]), s.dtype)
    j = _round(d1 * 2.0 + (d1[..., up, :] + d1[..., dn, :]), s.dtype)
    return i, j


def magnitude(i: Tensor, j: Tensor) -> Tensor:
    """``sqrt(i * i + j * j)``, the square root correctly rounded (NumPy's): torch's CPU ``sqrt``
    is a vectorised approximation (about 1% of float64 results 1 ulp off), so CPU tensors go
    through NumPy; CUDA's ``sqrt`` rounds correctly."""
    sq = i * i + j * j
    if sq.device.type == "cpu":
        return torch.from_numpy(np.sqrt(sq.numpy()))
    return torch.sqrt(sq)


def low_value(low: float) -> float:
    """The low threshold as the Cython NMS sees it: a C ``float`` parameter (rounded to float32),
    ``1e-14`` (as a float) where it is 0."""
    v = float(torch.tensor(low, dtype=torch.float32))
    if v == 0:
        v = float(torch.tensor(1e-14, dtype=torch.float32))
    return v


def sorted_select(flat: Tensor, idx: Tensor) -> Tensor:
    """The order statistics ``idx`` (0-based ranks, int64 ``(K,)``) of each row of ``flat``
    ``(N, n)``, ``(N, K)``: a full sort (NaN last)."""
    return torch.sort(flat, dim=1).values[:, idx.to(flat.device)]


def thresholds(mag: Tensor, low: float, high: float, use_quantiles: bool, select=sorted_select):
    """Per-slice ``(lo, hi)`` float64 tensors ``(N,)``, compared with ``float64(magnitude)``.

    ``use_quantiles``: ``numpy.percentile(magnitude, [100 low, 100 high])`` of each slice (method
    ``'linear'``: index ``(n - 1) * q`` with ``q = (100 low) / 100``, ``a + (b - a) t`` for ``t < 0.5``
    and ``b - (b - a)(1 - t)`` otherwise, ``b - a`` in the magnitude's dtype and the rest in
    float64, as NumPy computes it; NaN for a slice that holds NaN); ``a`` and ``b`` are the
    order statistics that ``select`` (:func:`sorted_select`; the CPU engine's is a radix
    selection) takes of each slice.  Otherwise
    the numbers given; ``high`` rounded to the magnitude's dtype (NumPy compares a float32 array
    with a Python float in float32).  ``lo`` is then rounded as :func:`low_value` says."""
    N = mag.shape[0]
    dev = mag.device
    if use_quantiles and mag.numel():
        flat = mag.reshape(N, -1)
        n = flat.shape[1]
        qs = torch.tensor([100.0 * low, 100.0 * high], dtype=torch.float64) / 100.0
        vi = (n - 1) * qs
        prev = torch.floor(vi)
        t = vi - prev
        pi = prev.to(torch.int64)
        ni = pi + 1
        above = vi >= n - 1
        pi[above] = n - 1
        ni[above] = n - 1
        ab = select(flat, torch.cat([pi, ni]))
        a = ab[:, :2]
        b = ab[:, 2:]
        diff = (b - a).double()
        t = t.to(dev)
        val = torch.where(t >= 0.5, b.double() - diff * (1 - t), a.double() + diff * t)
        # NumPy's percentile of a slice holding NaN is NaN: no pixel passes (found by review)
        val = torch.where(torch.isnan(flat).any(dim=1, keepdim=True), float("nan"), val)
        lo64 = val[:, 0].contiguous()
        hi = val[:, 1].contiguous()
        lo = lo64.float().double()
        lo = torch.where(lo == 0, torch.tensor(low_value(0.0), dtype=torch.float64, device=dev), lo)
        return lo, hi
    hi_v = float(torch.tensor(high, dtype=mag.dtype)) if mag.dtype != torch.float64 else float(high)
    lo = torch.full((N,), low_value(low), dtype=torch.float64, device=dev)
    return lo, torch.full((N,), hi_v, dtype=torch.float64, device=dev)


def _interp(n2: Tensor, n1: Tensor, w: Tensor) -> Tensor:
    """``n2 * w + n1 * (1.0 - w)`` as C computes it: ``n2 * w`` in the dtype (a float product in
    float32), the rest in double (``1.0`` is a double)."""
    w64 = w.double()
    return (n2 * w).double() + n1.double() * (1.0 - w64)


def nms_classes(i: Tensor, j: Tensor, mag: Tensor, emask: Tensor | None, lo: Tensor, hi: Tensor) -> Tensor:
    """uint8 ``(N, H, W)``: 0 suppressed (or ``magnitude == 0``), 1 kept (a low pixel), 2 kept and
    ``>= hi`` (a seed).  The NMS of skimage's ``_nonmaximum_suppression_bilinear``: pixels of the
    eroded mask (``None``: all but a one-pixel border) with ``magnitude >= lo`` whose magnitude is
    at least the bilinear interpolation of the magnitude on both sides along the gradient."""
    N, H, W = mag.shape
    out = torch.zeros(mag.shape, dtype=torch.uint8, device=mag.device)
    if H < 3 or W < 3 or N == 0:
        return out
    c = (slice(None), slice(1, -1), slice(1, -1))

    def at(dy, dx):
        return mag[:, 1 + dy: H - 1 + dy, 1 + dx: W - 1 + dx]

    I, J, m = i[c], j[c], mag[c]
    m64 = m.double()
    ai, aj = I.abs(), J.abs()
    up, down, left, right = I >= 0, I <= 0, J <= 0, J >= 0
    cond1 = (up & right) | (down & left)
    cond2 = ((down & right) | (up & left)) & ~cond1
    A = cond1 & (ai > aj)  # the four cases of the Cython code, in its order
    B = cond1 & ~(ai > aj)
    C = cond2 & (ai < aj)
    D = cond2 & ~(ai < aj)
    w = torch.where(A | D, aj / ai, ai / aj)

    def pick(a, b, cc, d):
        return torch.where(A, at(*a), torch.where(B, at(*b), torch.where(C, at(*cc), at(*d))))

    n11 = pick((1, 0), (0, 1), (0, 1), (-1, 0))
    n12 = pick((1, 1), (1, 1), (-1, 1), (-1, 1))
    n21 = pick((-1, 0), (0, -1), (0, -1), (1, 0))
    n22 = pick((-1, -1), (-1, -1), (1, -1), (1, -1))
    keep = (m64 >= lo[:, None, None]) & (cond1 | cond2)
    keep &= (_interp(n12, n11, w) <= m64) & (_interp(n22, n21, w) <= m64)
    if emask is not None:
        keep &= emask[c]
    low = keep & (m > 0)
    high = low & (m64 >= hi[:, None, None])
    out[c] = low.to(torch.uint8) + high.to(torch.uint8)
    return out


def hysteresis(cls: Tensor, check_every: int = 8) -> Tensor:
    """Bool ``(N, H, W)``: the pixels of class >= 1 8-connected (through class >= 1) to a class-2
    pixel; iterated dilation restricted to the low pixels, the fixed point tested every
    ``check_every`` steps."""
    low = (cls >= 1).unsqueeze(1)
    edges = (cls == 2).unsqueeze(1)
    if cls.numel() == 0:
        return edges.squeeze(1)
    lowf = low.to(torch.float32)
    e = edges.to(torch.float32)
    while True:
        prev = e
        for _ in range(check_every):
            e = F.max_pool2d(e, 3, stride=1, padding=1) * lowf
        if torch.equal(e, prev):
            break
    return (e > 0).squeeze(1)


def canny_edges(smoothed: Tensor, emask: Tensor | None, low: float, high: float, use_quantiles: bool) -> Tensor:
    """Bool ``(N, H, W)`` edges of the smoothed images ``(N, H, W)`` (see the module)."""
    i, j = sobel_pair(smoothed)
    mag = magnitude(i, j)
    lo, hi = thresholds(mag, low, high, use_quantiles)
    return hysteresis(nms_classes(i, j, mag, emask, lo, hi))
