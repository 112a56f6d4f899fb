"""The 3-D Sobel / Prewitt / Scharr gradient (its magnitude or its three components) fused on
Triton: the direct path of the CPU volume engine (``cpu/volume_direct``) on the GPU.  Which specs
run here, and their weights, is the host rule both share (``backends._direct3``); other specs of
three axes (and two-axis specs with per-axis modes) go to the reference engine.

One program per tile of ``BY x BX`` outputs of one plane of one volume: the 27 neighbours are
loaded once (folded along each axis; ``constant`` mode: masked, 0), and every component's passes
run in SciPy's order on them -- the derivative first, each 3-tap pass formed as SciPy's
``NI_Correlate1D`` forms it (``x0 * w0 + (xl +- xr) * wl``).  Launched without fused
multiply-adds (``enable_fp_fusion=False``): every product is rounded, in the interpreter and on
the GPU alike, so float64 components are SciPy's bits there too.  The magnitude is the
reference's ``sqrt(sum y_k**2)``, rescaled as ``hypot`` where the sum over- or underflows.
float16 / bfloat16 inputs run in float32 (as the reference computes them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._spec import FilterSpec
from .._direct3 import direct_plan, modes3
from .._layout import collapse_planes
from .._lowering import lower
from . import LAUNCHES, _device  # (imported once the package defines them)
from .plan import _MODES, single_fold
from .prims import _fold, _inside, _magnitude

__all__ = ["filter_forward"]

#: a program's tile: rows x columns of one plane
BY, BX = 8, 64


@triton.jit
def _ok(mask, j, n, MODE: tl.constexpr):
    """``mask`` where position ``j`` reads the image (``constant``: inside it; else everywhere)."""
    if MODE == 4:
        return mask & _inside(j, n)
    else:
        return mask


@triton.jit
def _row9(x_ptr, base, ys, xs, H, W, sH, sW, tile, MY: tl.constexpr, MX: tl.constexpr, SY: tl.constexpr,
          SX: tl.constexpr):
    """The 3 x 3 neighbours (rows y-1, y, y+1; columns x-1, x, x+1) of the tile in one plane
    (``tile``: where it reads; constant mode: 0 outside)."""
    rm = base + _fold(ys - 1, H, MY, SY) * sH
    r0 = base + ys * sH
    rp = base + _fold(ys + 1, H, MY, SY) * sH
    cm = _fold(xs - 1, W, MX, SX) * sW
    c0 = xs * sW
    cp = _fold(xs + 1, W, MX, SX) * sW
    am = _ok(tile, ys - 1, H, MY)
    ap = _ok(tile, ys + 1, H, MY)
    return (tl.load(x_ptr + rm + cm, mask=_ok(am, xs - 1, W, MX), other=0.0), tl.load(x_ptr + rm + c0, mask=am, other=0.0),
            tl.load(x_ptr + rm + cp, mask=_ok(am, xs + 1, W, MX), other=0.0),
            tl.load(x_ptr + r0 + cm, mask=_ok(tile, xs - 1, W, MX), other=0.0),
            tl.load(x_ptr + r0 + c0, mask=tile, other=0.0),
            tl.load(x_ptr + r0 + cp, mask=_ok(tile, xs + 1, W, MX), other=0.0),
            tl.load(x_ptr + rp + cm, mask=_ok(ap, xs - 1, W, MX), other=0.0), tl.load(x_ptr + rp + c0, mask=ap, other=0.0),
            tl.load(x_ptr + rp + cp, mask=_ok(ap, xs + 1, W, MX), other=0.0))


@triton.jit
def _anti(a, c, b, WC: tl.constexpr, WL: tl.constexpr):
    return c * WC + (a - b) * WL


@triton.jit
def _sym(a, c, b, S0: tl.constexpr, S1: tl.constexpr):
    return c * S0 + (a + b) * S1


@triton.jit
def _mid(a, b, c, d, e, f, g, h, i, WC: tl.constexpr, WL: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr):
    """The symmetric pass over three derivatives (``(a, b, c)``, ``(d, e, f)``, ``(g, h, i)``: each
    the -1, 0, +1 samples along the derivative's axis)."""
    return _sym(_anti(a, b, c, WC, WL), _anti(d, e, f, WC, WL), _anti(g, h, i, WC, WL), S0, S1)


@triton.jit
def _pick(gz, gy, gx, P: tl.constexpr):
    if P == 0:
        return gz
    elif P == 1:
        return gy
    else:
        return gx


@triton.jit
def _grad3_kernel(x_ptr, o_ptr, D, H, W, n1, s0, s1, sD, sH, sW, on1, os0, os1, oK, oD, oH, oW, nty, ntx,
                  WC: tl.constexpr, WL: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr,
                  T0: tl.constexpr, T1: tl.constexpr,
                  MZ: tl.constexpr, MY: tl.constexpr, MX: tl.constexpr,
                  P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, MAG: tl.constexpr, F64: tl.constexpr,
                  SZ: tl.constexpr, SY: tl.constexpr, SX: tl.constexpr, BY: tl.constexpr, BX: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    tx = pid % ntx
    r = pid // ntx
    ty = r % nty
    r = r // nty
    z = r % D
    v = r // D
    base = (v // n1) * s0 + (v % n1) * s1
    ys = (ty * BY + tl.arange(0, BY)).to(tl.int64)[None, :, None]
    xs = (tx * BX + tl.arange(0, BX)).to(tl.int64)[None, None, :]
    tile = (ys < H) & (xs < W)
    zm = _fold(z - 1, D, MZ, SZ)
    zp = _fold(z + 1, D, MZ, SZ)
    # a{z}{y}{x}: z, y, x in m (-1), o (0), p (+1)
    zt = ys * 0 + z  # (the plane as a tensor: the interpreter mistypes a scalar mask)
    ammm, ammo, ammp, amom, amoo, amop, ampm, ampo, ampp = _row9(
        x_ptr, base + zm * sD, ys, xs, H, W, sH, sW, _ok(tile, zt - 1, D, MZ), MY, MX, SY, SX)
    aomm, aomo, aomp, aoom, aooo, aoop, aopm, aopo, aopp = _row9(
        x_ptr, base + z * sD, ys, xs, H, W, sH, sW, tile, MY, MX, SY, SX)
    apmm, apmo, apmp, apom, apoo, apop, appm, appo, appp = _row9(
        x_ptr, base + zp * sD, ys, xs, H, W, sH, sW, _ok(tile, zt + 1, D, MZ), MY, MX, SY, SX)
    # gz = sx(sy(dz)), gy = sx(sz(dy)), gx = sy(sz(dx)): each the last pass (taps T) over three
    # columns (or rows) of the middle pass (taps S) over three derivatives
    gz = _sym(_mid(ammm, aomm, apmm, amom, aoom, apom, ampm, aopm, appm, WC, WL, S0, S1),
              _mid(ammo, aomo, apmo, amoo, aooo, apoo, ampo, aopo, appo, WC, WL, S0, S1),
              _mid(ammp, aomp, apmp, amop, aoop, apop, ampp, aopp, appp, WC, WL, S0, S1), T0, T1)
    gy = _sym(_mid(ammm, amom, ampm, aomm, aoom, aopm, apmm, apom, appm, WC, WL, S0, S1),
              _mid(ammo, amoo, ampo, aomo, aooo, aopo, apmo, apoo, appo, WC, WL, S0, S1),
              _mid(ammp, amop, ampp, aomp, aoop, aopp, apmp, apop, appp, WC, WL, S0, S1), T0, T1)
    gx = _sym(_mid(ammm, ammo, ammp, aomm, aomo, aomp, apmm, apmo, apmp, WC, WL, S0, S1),
              _mid(amom, amoo, amop, aoom, aooo, aoop, apom, apoo, apop, WC, WL, S0, S1),
              _mid(ampm, ampo, ampp, aopm, aopo, aopp, appm, appo, appp, WC, WL, S0, S1), T0, T1)
    a0 = _pick(gz, gy, gx, P0)
    a1 = _pick(gz, gy, gx, P1)
    a2 = _pick(gz, gy, gx, P2)
    ob = (v // on1) * os0 + (v % on1) * os1 + z * oD + ys * oH + xs * oW
    if MAG:
        tl.store(o_ptr + ob, _magnitude(a0, a1, a2, 3, F64), mask=tile)
    else:
        tl.store(o_ptr + ob, a0, mask=tile)
        tl.store(o_ptr + ob + oK, a1, mask=tile)
        tl.store(o_ptr + ob + 2 * oK, a2, mask=tile)


def _lead(t, nd):
    """``(n1, s0, s1)`` of ``t``'s leading ``t.dim() - nd`` dims collapsed, or None."""
    return collapse_planes(t.shape[:-nd], t.stride()[:-nd])


def filter_forward(x, spec, out=None):
    """``spec`` on ``x`` through the fused gradient kernel, or None where it does not run
    (the caller falls back)."""
    if not isinstance(spec, FilterSpec) or x.numel() == 0 or spec.epilogue not in ("magnitude", "stack"):
        return None
    spec = lower(spec, x.shape)
    hit = direct_plan(spec)
    if hit is None:
        return None
    (wc, wl, s0, s1, _, t0, t1), order = hit
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x if x.dtype == cd else x.to(cd)
    if _lead(xs, 3) is None:
        xs = xs.contiguous()
    mag = spec.epilogue == "magnitude"
    oshape = spec.out_shape(x.shape)
    nd = 3 if mag else 4
    o = out if out is not None and out.dtype == cd and _lead(out, nd) is not None else None
    if o is None:
        o = torch.empty(oshape, dtype=cd, device=x.device)
    n1, a0, a1 = _lead(xs, 3)
    on1, b0, b1 = _lead(o, nd)
    D, H, W = xs.shape[-3:]
    nv = xs.numel() // (D * H * W)
    nty, ntx = -(-H // BY), -(-W // BX)
    modes = modes3(spec)
    mz, my, mx = (_MODES[m] for m in modes)
    oK = 0 if mag else o.stride(-4)
    with _device(x):
        _grad3_kernel[(nv * D * nty * ntx,)](
            xs, o, D, H, W, n1, a0, a1, *xs.stride()[-3:], on1, b0, b1, oK, *o.stride()[-3:], nty, ntx,
            WC=wc, WL=wl, S0=s0, S1=s1, T0=t0, T1=t1, MZ=mz, MY=my, MX=mx, P0=order[0], P1=order[1], P2=order[2], MAG=mag,
            F64=cd == torch.float64, SZ=single_fold(D, 1, 1, modes[0]), SY=single_fold(H, 1, 1, modes[1]),
            SX=single_fold(W, 1, 1, modes[2]), BY=BY, BX=BX, enable_fp_fusion=False)
    LAUNCHES["grad3"] += 1
    if out is None:
        return o if o.dtype == x.dtype else o.to(x.dtype)
    if o is not out:
        out.copy_(o)
    return out

