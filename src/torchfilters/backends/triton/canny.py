"""Canny edges on the GPU: Triton kernels after the smoothing (``torchfilters.canny``).

CUDA tensors (and CPU tensors under ``TRITON_INTERPRET=1``, which is how the tests run it) of
the compute dtypes float32 / float64.  The arithmetic is ``reference_canny``'s, bit for bit:
SciPy's Sobel rounding (differences in the dtype, the cross pass in float64 rounded once),
``sqrt_rn`` / ``div_rn`` in float32, and C's promotions in the NMS; kernels are launched with
``enable_fp_fusion=False`` (no FMA contraction), as the rest of the Triton engine does.

Kernels, over 2-D tiles of every slice (grid: column tiles, row tiles, slices):

* ``_mag_kernel``: Sobel and magnitude of every pixel (to a buffer; the thresholds may be
  quantiles of it, taken per slice with torch ops on the device);
* ``_nms_kernel``: the gradient recomputed at each interior pixel, the non-maximum suppression
  against the stored magnitude, classes 0 / 1 (low) / 2 (seed, ``>= high``) into a uint8 map;
* ``_hyst_kernel``: hysteresis.  Each program propagates class 2 into the class-1 pixels of its
  tile (8-connected, reading its one-pixel halo from global memory) to a *local fixed point*
  (at most ``inner`` steps, a block barrier between steps) and, if it changed any pixel, raises
  a device flag (``atomic_max``).  Programs of one launch may read a neighbour's pixels before
  or after that neighbour updates them: harmless, since classes only grow from 1 to 2, and a
  launch in which no program changes anything has read a constant map, so it is a global fixed
  point.  **The host reads the flag only every** ``CHECK_EVERY`` **launches** (one device to host
  copy per group, none per iteration): the flag is cleared, ``CHECK_EVERY`` launches run, and
  the loop ends when none of them changed a pixel.

The result is ``classes == 2``.  Only Triton builtins are used in device code (no
``triton.language`` ``@jit`` helpers), so the module can be re-imported in interpreter mode.
"""

from __future__ import annotations

import collections
import os

import torch
import triton
import triton.language as tl

from .. import reference_canny as _ref

__all__ = ["CHECK_EVERY", "LAUNCHES", "available", "canny_edges", "interpreted"]

NAME = "triton"

#: kernel launches by name (tests assert on it)
LAUNCHES: collections.Counter = collections.Counter()
#: hysteresis launches between two reads of the device flag
CHECK_EVERY = 4
_TILE = {"BH": 16, "BW": 32, "HB": 32, "HW": 32, "inner": 64}


@triton.jit
def _maxi(a, b):
    return tl.maximum(a, b)


@triton.jit
def _ld(p, r, c, W, ok):
    return tl.load(p + r[:, None] * W + c[None, :], mask=ok, other=0.0)


@triton.jit
def _grad(p, rows, cols, H, W, ok):
    """SciPy's ``sobel(s, 0)``, ``sobel(s, 1)`` (mode reflect: clamped indices) on a tile."""
    ru = tl.maximum(rows - 1, 0)
    rd = tl.minimum(rows + 1, H - 1)
    cl = tl.maximum(cols - 1, 0)
    cr = tl.minimum(cols + 1, W - 1)
    ul = _ld(p, ru, cl, W, ok)
    u = _ld(p, ru, cols, W, ok)
    ur = _ld(p, ru, cr, W, ok)
    lf = _ld(p, rows, cl, W, ok)
    rt = _ld(p, rows, cr, W, ok)
    dl = _ld(p, rd, cl, W, ok)
    d = _ld(p, rd, cols, W, ok)
    dr = _ld(p, rd, cr, W, ok)
    T = p.dtype.element_ty
    d0c = (d - u).to(tl.float64)
    d0l = (dl - ul).to(tl.float64)
    d0r = (dr - ur).to(tl.float64)
    gi = (d0c * 2.0 + (d0l + d0r)).to(T)
    d1c = (rt - lf).to(tl.float64)
    d1u = (ur - ul).to(tl.float64)
    d1d = (dr - dl).to(tl.float64)
    gj = (d1c * 2.0 + (d1u + d1d)).to(T)
    return gi, gj


@triton.jit
def _mag_kernel(s_ptr, m_ptr, H, W, BH: tl.constexpr, BW: tl.constexpr, F64: tl.constexpr):
    rows = tl.program_id(1) * BH + tl.arange(0, BH)
    cols = tl.program_id(0) * BW + tl.arange(0, BW)
    base = tl.program_id(2).to(tl.int64) * H * W
    ok = (rows[:, None] < H) & (cols[None, :] < W)
    gi, gj = _grad(s_ptr + base, rows, cols, H, W, ok)
    sq = gi * gi + gj * gj
    if F64:
        m = tl.sqrt(sq)
    else:
        m = tl.sqrt_rn(sq)
    tl.store(m_ptr + base + rows[:, None] * W + cols[None, :], m, mask=ok)


@triton.jit
def _lerp_le(n2, n1, w, m64):
    """``n2 * w + n1 * (1.0 - w) <= m`` with C's promotions (``n2 * w`` in the dtype)."""
    return (n2 * w).to(tl.float64) + n1.to(tl.float64) * (1.0 - w.to(tl.float64)) <= m64


@triton.jit
def _nms_kernel(s_ptr, m_ptr, e_ptr, lo_ptr, hi_ptr, c_ptr, H, W, HASM: tl.constexpr, BH: tl.constexpr,
                BW: tl.constexpr, F64: tl.constexpr):
    rows = tl.program_id(1) * BH + tl.arange(0, BH)
    cols = tl.program_id(0) * BW + tl.arange(0, BW)
    n = tl.program_id(2)
    base = n.to(tl.int64) * H * W
    ok = (rows[:, None] < H) & (cols[None, :] < W)
    inner = ok & (rows[:, None] >= 1) & (rows[:, None] < H - 1) & (cols[None, :] >= 1) & (cols[None, :] < W - 1)
    offs = base + rows[:, None] * W + cols[None, :]
    if HASM:
        inner = inner & (tl.load(e_ptr + offs, mask=inner, other=0) != 0)
    mp = m_ptr + offs
    m = tl.load(mp, mask=inner, other=0.0)
    gi, gj = _grad(s_ptr + base, rows, cols, H, W, inner)
    m64 = m.to(tl.float64)
    lo = tl.load(lo_ptr + n)
    hi = tl.load(hi_ptr + n)
    ai = tl.abs(gi)
    aj = tl.abs(gj)
    up = gi >= 0
    down = gi <= 0
    left = gj <= 0
    right = gj >= 0
    cond1 = (up & right) | (down & left)
    cond2 = ((down & right) | (up & left)) & (~cond1)
    gt = ai > aj
    lt = ai < aj
    A = cond1 & gt
    B = cond1 & (~gt)
    C = cond2 & lt
    if F64:
        r1 = aj / ai
        r2 = ai / aj
    else:
        r1 = tl.div_rn(aj, ai)
        r2 = tl.div_rn(ai, aj)
    w = tl.where(A | (cond2 & (~lt)), r1, r2)
    # neighbours (dy, dx) per case A / B / C / D, as the Cython code picks them
    n11 = tl.where(A, tl.load(mp + W, mask=inner, other=0.0),
                   tl.where(B | C, tl.load(mp + 1, mask=inner, other=0.0), tl.load(mp - W, mask=inner, other=0.0)))
    n12 = tl.where(A | B, tl.load(mp + W + 1, mask=inner, other=0.0), tl.load(mp - W + 1, mask=inner, other=0.0))
    n21 = tl.where(A, tl.load(mp - W, mask=inner, other=0.0),
                   tl.where(B | C, tl.load(mp - 1, mask=inner, other=0.0), tl.load(mp + W, mask=inner, other=0.0)))
    n22 = tl.where(A | B, tl.load(mp - W - 1, mask=inner, other=0.0), tl.load(mp + W - 1, mask=inner, other=0.0))
    keep = inner & (m64 >= lo) & (cond1 | cond2) & (m > 0)
    keep = keep & _lerp_le(n12, n11, w, m64) & _lerp_le(n22, n21, w, m64)
    cls = tl.where(keep, tl.where(m64 >= hi, 2, 1), 0).to(tl.uint8)
    tl.store(c_ptr + offs, cls, mask=ok)


@triton.jit
def _hyst_kernel(c_ptr, flag_ptr, H, W, BH: tl.constexpr, BW: tl.constexpr, INNER: tl.constexpr):
    rows = tl.program_id(1) * BH + tl.arange(0, BH)
    cols = tl.program_id(0) * BW + tl.arange(0, BW)
    base = tl.program_id(2).to(tl.int64) * H * W
    ok = (rows[:, None] < H) & (cols[None, :] < W)
    p = c_ptr + base + rows[:, None] * W + cols[None, :]
    cand = tl.load(p, mask=ok, other=0) == 1  # class-1 pixels are interior: neighbours in range
    changed = tl.reduce(tl.reduce(cand.to(tl.int32), 1, _maxi), 0, _maxi)
    any_change = changed * 0
    it = 0
    while (changed > 0) & (it < INNER):
        nb = tl.load(p - W - 1, mask=cand, other=0, volatile=True)
        nb = tl.maximum(nb, tl.load(p - W, mask=cand, other=0, volatile=True))
        nb = tl.maximum(nb, tl.load(p - W + 1, mask=cand, other=0, volatile=True))
        nb = tl.maximum(nb, tl.load(p - 1, mask=cand, other=0, volatile=True))
        nb = tl.maximum(nb, tl.load(p + 1, mask=cand, other=0, volatile=True))
        nb = tl.maximum(nb, tl.load(p + W - 1, mask=cand, other=0, volatile=True))
        nb = tl.maximum(nb, tl.load(p + W, mask=cand, other=0, volatile=True))
        nb = tl.maximum(nb, tl.load(p + W + 1, mask=cand, other=0, volatile=True))
        grow = cand & (nb == 2)
        tl.store(p, tl.full((BH, BW), 2, tl.uint8), mask=grow)
        cand = cand & (~grow)
        changed = tl.reduce(tl.reduce(grow.to(tl.int32), 1, _maxi), 0, _maxi)
        any_change = tl.maximum(any_change, changed)
        tl.debug_barrier()  # this step's stores are visible to the whole block before the next
        it += 1
    tl.atomic_max(flag_ptr, any_change)


def interpreted() -> bool:
    return type(_nms_kernel).__name__ == "InterpretedFunction"


def available(device, dtype) -> bool:
    if dtype not in (torch.float32, torch.float64):
        return False
    device = torch.device(device)
    if device.type == "cuda":
        return not interpreted() and torch.cuda.is_available()
    return device.type == "cpu" and interpreted() and os.environ.get("TRITON_INTERPRET") == "1"


def canny_edges(smoothed, emask, low, high, use_quantiles):
    """Bool ``(N, H, W)`` edges of the smoothed images (``reference_canny.canny_edges``)."""
    s = smoothed.contiguous()
    N, H, W = s.shape
    if s.numel() == 0 or H < 3 or W < 3:
        return torch.zeros((N, H, W), dtype=torch.bool, device=s.device)
    f64 = s.dtype == torch.float64
    BH, BW = _TILE["BH"], _TILE["BW"]
    grid = (triton.cdiv(W, BW), triton.cdiv(H, BH), N)
    mag = torch.empty_like(s)
    _mag_kernel[grid](s, mag, H, W, BH=BH, BW=BW, F64=f64, enable_fp_fusion=False)
    LAUNCHES["mag"] += 1
    lo, hi = _ref.thresholds(mag, low, high, use_quantiles)
    cls = torch.empty((N, H, W), dtype=torch.uint8, device=s.device)
    em = emask.contiguous().view(torch.uint8) if emask is not None else cls
    _nms_kernel[grid](s, mag, em, lo, hi, cls, H, W, HASM=emask is not None, BH=BH, BW=BW, F64=f64,
                      enable_fp_fusion=False)
    LAUNCHES["nms"] += 1
    HB, HW = _TILE["HB"], _TILE["HW"]
    hgrid = (triton.cdiv(W, HW), triton.cdiv(H, HB), N)
    flag = torch.zeros(1, dtype=torch.int32, device=s.device)
    while True:
        flag.zero_()
        for _ in range(CHECK_EVERY):
            _hyst_kernel[hgrid](cls, flag, H, W, BH=HB, BW=HW, INNER=_TILE["inner"], enable_fp_fusion=False)
            LAUNCHES["hysteresis"] += 1
        if int(flag.item()) == 0:  # the only host read: once per CHECK_EVERY launches
            break
    return cls == 2
