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
from .._layout import collapse_planes, extent
from .._lowering import lower
from . import LAUNCHES, _device  # (imported once the package defines them)
from .plan import _MODES, single_fold
from .prims import _fold, _inside, _magnitude

__all__ = ["filter_forward"]

#: a program's tile: rows x columns of a plane, streamed over ``ZC`` planes
BY, BX, ZC = 4, 64, 15


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
    p = x_ptr + base  # (the plane's offset on the scalar pointer; the tile's offsets in ys' type)
    rm = _fold(ys - 1, H, MY, SY) * sH
    r0 = ys * sH
    rp = _fold(ys + 1, H, MY, SY) * sH
    cm = _fold(xs - 1, W, MX, SX) * sW
    c0 = xs * sW
    cp = _fold(xs + 1, W, MX, SX) * sW
    am = _ok(tile, ys - 1, H, MY)
    ap = _ok(tile, ys + 1, H, MY)
    return (tl.load(p + (rm + cm), mask=_ok(am, xs - 1, W, MX), other=0.0), tl.load(p + (rm + c0), mask=am, other=0.0),
            tl.load(p + (rm + cp), mask=_ok(am, xs + 1, W, MX), other=0.0),
            tl.load(p + (r0 + cm), mask=_ok(tile, xs - 1, W, MX), other=0.0),
            tl.load(p + (r0 + c0), mask=tile, other=0.0),
            tl.load(p + (r0 + cp), mask=_ok(tile, xs + 1, W, MX), other=0.0),
            tl.load(p + (rp + cm), mask=_ok(ap, xs - 1, W, MX), other=0.0), tl.load(p + (rp + c0), mask=ap, other=0.0),
            tl.load(p + (rp + cp), mask=_ok(ap, xs + 1, W, MX), other=0.0))


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
def _parts(r, WC: tl.constexpr, WL: tl.constexpr):
    """A plane's share of the passes from its 3 x 3 neighbours ``r`` (rows m, o, p of columns m,
    o, p): the x-derivative of each row and the y-derivative of each column."""
    mm, mo, mp, om, oo, op, pm, po, pp = r
    return (_anti(mm, mo, mp, WC, WL), _anti(om, oo, op, WC, WL), _anti(pm, po, pp, WC, WL),
            _anti(mm, om, pm, WC, WL), _anti(mo, oo, po, WC, WL), _anti(mp, op, pp, WC, WL))


@triton.jit
def _plane(x_ptr, o_ptr, base, ob0, z, zt, rm, ro, qm, qo, D, H, W, sD, sH, sW, oK, oD, oH, oW, ys, xs, tile,
           WC: tl.constexpr, WL: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, T0: tl.constexpr,
           T1: tl.constexpr, MZ: tl.constexpr, MY: tl.constexpr, MX: tl.constexpr, P0: tl.constexpr,
           P1: tl.constexpr, P2: tl.constexpr, MAG: tl.constexpr, F64: tl.constexpr, SZ: tl.constexpr,
           SY: tl.constexpr, SX: tl.constexpr):
    """Output plane ``z`` from the carried planes ``z - 1`` (``rm``: its 9 neighbours, ``qm``: its
    partial passes) and ``z`` (``ro``, ``qo``); loads plane ``z + 1`` and returns its two."""
    live = tile & (zt < D)
    zp = _fold(z + 1, D, MZ, SZ)
    rp = _row9(x_ptr, base + zp * sD, ys, xs, H, W, sH, sW, _ok(live, zt + 1, D, MZ), MY, MX, SY, SX)
    qp = _parts(rp, WC, WL)
    # gx = sy(sz(dx)): sz over the planes of each row's dx, then sy over the rows
    gx = _sym(_sym(qm[0], qo[0], qp[0], S0, S1), _sym(qm[1], qo[1], qp[1], S0, S1),
              _sym(qm[2], qo[2], qp[2], S0, S1), T0, T1)
    # gy = sx(sz(dy)): sz over the planes of each column's dy, then sx over the columns
    gy = _sym(_sym(qm[3], qo[3], qp[3], S0, S1), _sym(qm[4], qo[4], qp[4], S0, S1),
              _sym(qm[5], qo[5], qp[5], S0, S1), T0, T1)
    # gz = sx(sy(dz)): dz of each of the 9 positions, sy over each column's three, then sx
    gz = _sym(_sym(_anti(rm[0], ro[0], rp[0], WC, WL), _anti(rm[3], ro[3], rp[3], WC, WL),
                   _anti(rm[6], ro[6], rp[6], WC, WL), S0, S1),
              _sym(_anti(rm[1], ro[1], rp[1], WC, WL), _anti(rm[4], ro[4], rp[4], WC, WL),
                   _anti(rm[7], ro[7], rp[7], WC, WL), S0, S1),
              _sym(_anti(rm[2], ro[2], rp[2], WC, WL), _anti(rm[5], ro[5], rp[5], WC, WL),
                   _anti(rm[8], ro[8], rp[8], WC, WL), S0, S1), T0, T1)
    a0 = _pick(gz, gy, gx, P0)
    a1 = _pick(gz, gy, gx, P1)
    a2 = _pick(gz, gy, gx, P2)
    op = o_ptr + (ob0 + z * oD)
    ot = ys * oH + xs * oW
    if MAG:
        tl.store(op + ot, _magnitude(a0, a1, a2, 3, F64), mask=live)
    else:
        tl.store(op + ot, a0, mask=live)
        tl.store(op + oK + ot, a1, mask=live)
        tl.store(op + 2 * oK + ot, a2, mask=live)
    return rp, qp


@triton.jit
def _grad3_kernel(x_ptr, o_ptr, D, H, W, n1, s0, s1, sD, sH, sW, on1, os0, os1, oK, oD, oH, oW, nty, ntx, nzc,
                  ZC, WC: tl.constexpr, WL: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr,
                  T0: tl.constexpr, T1: tl.constexpr,
                  MZ: tl.constexpr, MY: tl.constexpr, MX: tl.constexpr,
                  P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, MAG: tl.constexpr, F64: tl.constexpr,
                  SZ: tl.constexpr, SY: tl.constexpr, SX: tl.constexpr, BY: tl.constexpr, BX: tl.constexpr,
                  I64: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    tx = pid % ntx
    r = pid // ntx
    ty = r % nty
    r = r // nty
    zc = r % nzc
    v = r // nzc
    base = (v // n1) * s0 + (v % n1) * s1
    ob0 = (v // on1) * os0 + (v % on1) * os1
    # a plane's offsets in int32 unless one plane of the input or output spans 2**31 elements
    ys = (ty.to(tl.int32) * BY + tl.arange(0, BY))[None, :, None]
    xs = (tx.to(tl.int32) * BX + tl.arange(0, BX))[None, None, :]
    if I64:
        ys = ys.to(tl.int64)
        xs = xs.to(tl.int64)
    tile = (ys < H) & (xs < W)
    z0 = zc * ZC
    zt = ys * 0 + z0  # (the plane as a tensor: the interpreter mistypes a scalar mask)
    # the column of tiles is streamed along z: two planes' neighbours and partial passes are
    # carried (raw samples for the z-derivative; x- and y-derivatives for gx and gy), and each
    # step loads the next plane's 9 neighbours once -- 9 loads an output where 27 were
    zm = _fold(z0 - 1, D, MZ, SZ)
    rm = _row9(x_ptr, base + zm * sD, ys, xs, H, W, sH, sW, _ok(tile, zt - 1, D, MZ), MY, MX, SY, SX)
    ro = _row9(x_ptr, base + z0 * sD, ys, xs, H, W, sH, sW, tile, MY, MX, SY, SX)
    qm = _parts(rm, WC, WL)
    qo = _parts(ro, WC, WL)
    # three planes a trip, the carried planes' roles renamed instead of moved
    for dz in range(0, ZC, 3):  # (the last chunk's planes past D: masked off)
        rp, qp = _plane(x_ptr, o_ptr, base, ob0, z0 + dz, zt + dz, rm, ro, qm, qo, D, H, W, sD, sH, sW, oK, oD, oH, oW,
                        ys, xs, tile, WC, WL, S0, S1, T0, T1, MZ, MY, MX, P0, P1, P2, MAG, F64, SZ, SY, SX)
        rm, qm = _plane(x_ptr, o_ptr, base, ob0, z0 + dz + 1, zt + dz + 1, ro, rp, qo, qp, D, H, W, sD, sH, sW, oK,
                        oD, oH, oW, ys, xs, tile, WC, WL, S0, S1, T0, T1, MZ, MY, MX, P0, P1, P2, MAG, F64, SZ, SY, SX)
        ro, qo = _plane(x_ptr, o_ptr, base, ob0, z0 + dz + 2, zt + dz + 2, rp, rm, qp, qm, D, H, W, sD, sH, sW, oK,
                        oD, oH, oW, ys, xs, tile, WC, WL, S0, S1, T0, T1, MZ, MY, MX, P0, P1, P2, MAG, F64, SZ, SY, SX)


def _plane_span(t):
    """The largest element offset within one plane of ``t`` (its last two dims), plus one."""
    return extent(t.shape[-2:], t.stride()[-2:])


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
    nzc = -(-D // ZC)
    zc = -(-D // (3 * nzc)) * 3  # even chunks of whole trips (3 planes): few masked planes
    modes = modes3(spec)
    mz, my, mx = (_MODES[m] for m in modes)
    oK = 0 if mag else o.stride(-4)
    with _device(x):
        _grad3_kernel[(nv * nzc * nty * ntx,)](
            xs, o, D, H, W, n1, a0, a1, *xs.stride()[-3:], on1, b0, b1, oK, *o.stride()[-3:], nty, ntx, nzc, zc,
            WC=wc, WL=wl, S0=s0, S1=s1, T0=t0, T1=t1, MZ=mz, MY=my, MX=mx, P0=order[0], P1=order[1], P2=order[2], MAG=mag,
            F64=cd == torch.float64, SZ=single_fold(D, 1, 1, modes[0]), SY=single_fold(H, 1, 1, modes[1]),
            SX=single_fold(W, 1, 1, modes[2]), BY=BY, BX=BX, I64=_plane_span(xs) >= 2**31 or _plane_span(o) >= 2**31,
            enable_fp_fusion=False)
    LAUNCHES["grad3"] += 1
    if out is None:
        return o if o.dtype == x.dtype else o.to(x.dtype)
    if o is not out:
        out.copy_(o)
    return out

