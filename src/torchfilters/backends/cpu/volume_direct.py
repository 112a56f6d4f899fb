"""The direct 3x3x3 path of the volume engine: the 3-D Sobel, Prewitt and Scharr gradient (its
magnitude, its three components, or the magnitude's backward scale) in one streaming pass.

**Runs here**: what ``backends._direct3.direct_plan`` accepts (the rule is shared with the
Triton engine): the gradient of a 3-tap smoothing and a 3-tap derivative over three axes in any
order (``sobel`` / ``prewitt`` / ``scharr``), epilogues ``magnitude`` and ``stack``, and one
component alone (``sobel(x, axis, axes=...)``: the three are formed, one stored), every mode
per axis, ``constant`` with ``cval = +0``; float32 and float64 (16-bit inputs are computed in
float32).  The rest of the volume engine runs everything else.

**Order.**  Each component's passes run in the spec's (SciPy's) order: the derivative first,
then the smoothing along the earlier, then the later axis, each pass as SciPy's
``NI_Correlate1D`` sums a symmetric or antisymmetric 3-tap pass (``x0 * w0 + (xl +- xr) * wl``,
products rounded, no fused multiply-add): float64 results are SciPy's bits, and no smoothing
runs before a derivative that cancels (float32 rows alternating +-3e38 give SciPy's 0, not
``inf - inf``).  The magnitude is the reference's ``sqrt(gz**2 + gy**2 + gx**2)``, rescaled
as ``hypot`` where the sum of squares over- or underflows (``forward._mag_fix``).

**Streaming.**  A work item is ``(volume, block of BY rows, chunk of planes)``.  Walking the
planes of its chunk plus one halo plane each side, it keeps ``dx`` (the x-derivative) of each
input row of the block and its halo rows in a ring of three planes.  Per output plane, a walk
down each vector's column of the block keeps the three planes' input rows and the windows of
``dz`` and ``sz(dx)`` in registers (each plane's ``dy`` is formed there from the rows it holds)
and stores per output row ``gx = sy(sz(dx))`` and the rows ``sz(dy)`` and ``sy(dz)``; a pass
along each output row forms their x-passes (``sx``) and the epilogue, and stores once.  Every
x-pass runs on whole vectors, each lane's neighbours shuffled in from the vectors before and
after (no unaligned loads).  Input rows are read in place; ``constant`` mode reads a zero row
outside.  Every buffer is per thread and a few dozen rows long: it stays in the first-level
cache.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ..._spec import zero_signs
from .._direct3 import direct_plan, modes3
from .adjoint import _mag_vjp_fix
from .forward import _mag_fix
from .prims import _JIT, _ptr
from .separable import _VL, _fold1
from .simd import (_vadd, _vfma, _vld, _vldm, _vleft, _vmagbad, _vmagodd, _vmaxabs, _vmul, _vright, _vsplat, _vst,
                   _vstm, _vsub)
from .volume_kernels import R_AUX, R_OUT, R_SRC, _voff, _vscale, _vselge, _vsqrt

__all__ = ["DirectPlan", "direct", "_k_grad3"]

#: epilogues: the magnitude; the three components (``out[k]``); ``g * y_k / |y|`` (``out[k]``,
#: the magnitude's backward scale, ``aux`` the gradient)
EPI_D_MAG, EPI_D_STACK, EPI_D_MAGSCALE, EPI_D_ONE = 0, 1, 2, 3
#: rows of a work item's block
BY = 8
# M (int64): D, H, W, BY, blocks, planes per chunk, chunks, epilogue, forms (_anti, the middle
# _sym), the axis (0 z, 1 y, 2 x) of stencil 0's, 1's and 2's derivative, the last _sym's form;
# then the fold tables (:func:`direct`)
M_FOLDS = 14


def _form(s0, s1):
    """:func:`_sym`'s form for the taps ``(s1, s0, s1)``."""
    return (1 if s0 == 1.0 else 2 if s0 == 2.0 else 0) if s1 == 1.0 else 0


class DirectPlan(NamedTuple):
    """A launch of :func:`_k_grad3`: weights per compute dtype, ``M``, work items."""

    w64: np.ndarray
    w32: np.ndarray
    M: np.ndarray
    nitems: int


def direct(spec, sizes, nv, nthreads, epilogue=None):
    """The :class:`DirectPlan` of ``spec`` (``lower``-ed) on ``nv`` volumes of ``sizes``, or None
    where the direct path does not run it (:func:`direct_plan`)."""
    return _direct(spec, math.copysign(1.0, spec.cval), zero_signs(spec), sizes, nv, nthreads, epilogue)


@functools.lru_cache(maxsize=256)
def _direct(spec, sign, zsigns, sizes, nv, nthreads, epilogue):
    # (``sign``: -0.0 == 0.0 in the spec's key, but only +0 is the zero padding this path runs;
    # ``zsigns``: likewise for its taps, ``zero_signs``)
    hit = direct_plan(spec, epilogue, one=True)
    if hit is None:
        return None
    w, order = hit
    D, H, W = sizes
    nyb = -(-H // BY)
    nzc = 1
    while nv * nyb * nzc < 4 * nthreads and D // (nzc * 2) >= 8:
        nzc *= 2  # too few items for the threads: chunks of planes (two halo planes each)
    zc = -(-D // nzc)
    nzc = -(-D // zc)
    epi = {"magnitude": EPI_D_MAG, "stack": EPI_D_STACK, "magscale": EPI_D_MAGSCALE}[epilogue or spec.epilogue]
    if len(spec.stencils) == 1:
        epi = EPI_D_ONE  # (one component: the three are formed, the spec's one stored)
    mz, my, mx = modes3(spec)
    af = 1 if abs(w[1]) == 1.0 else 0
    # the fold tables (``separable._fold1``, once per plan): planes -1 .. D, rows -1 .. H, and the
    # end columns' neighbours fold(-1), fold(1), fold(W-2), fold(W); -1: outside (constant)
    folds = ([_fold1(D, i, mz) for i in range(-1, D + 1)] + [_fold1(H, i, my) for i in range(-1, H + 1)]
             + [_fold1(W, i, mx) for i in (-1, 1, W - 2, W)])
    M = np.asarray([D, H, W, BY, nyb, zc, nzc, epi, af, _form(w[2], w[3]), *order, _form(w[5], w[6])] + folds,
                   np.int64)
    # the magnitude's sum of squares is (a0**2 + a1**2) + a2**2 in the spec's order; only which
    # component comes last changes its bits (a sum of two is the same either way round): the
    # kernel picks the three terms by lane selects on these masks (1 where the last component is
    # gz, gx, gy; then 0.5, the select's threshold), no branch or table per vector
    p2 = order[2]
    w = np.concatenate([w, [float(p2 == 0), float(p2 == 2), float(p2 == 1), 0.5]])
    return DirectPlan(w, w.astype(np.float32), M, nv * nyb * nzc)


# ----------------------------------------------------------------------------
# device code


@njit(forceinline=True, **_JIT)
def _sym(a, c, b, s0, s1, sf):
    """A symmetric 3-tap pass at one vector, SciPy's ``c * s0 + (a + b) * s1``; for ``s1 = 1`` and
    ``s0`` 1 or 2 (``sf`` 1, 2) without the multiplies (the same bits: ``c + c`` is ``2 * c``,
    overflow included)."""
    pr = _vadd(a, b)
    if sf == 1:
        return _vadd(c, pr)
    if sf == 2:
        return _vadd(_vadd(c, c), pr)
    return _vadd(_vmul(c, s0), _vmul(pr, s1))


@njit(forceinline=True, **_JIT)
def _anti(a, c, b, w0, wl, af):
    """An antisymmetric 3-tap pass at one vector, SciPy's ``c * w0 + (a - b) * wl``; for
    ``wl = +-1`` (``af`` 1) one fused multiply-add (exact: ``(a - b) * wl`` is)."""
    if af == 1:
        return _vfma(_vsub(a, b), wl, _vmul(c, w0))
    return _vadd(_vmul(c, w0), _vmul(_vsub(a, b), wl))


@njit(**_JIT)
def _dx_row(dst, src, W, w0, wl, af, w0s, wls, zs, xe, L):
    """The x-derivative of an input row (read in place): ``src[x] * wc + (src[x-1] - src[x+1]) * wl``,
    the end columns from the folded columns ``xe`` (``[fold(-1), fold(1), fold(W-2), fold(W)]``,
    -1: a zero)."""
    # whole vectors from column 0, each lane's neighbours shuffled in from the vectors before and
    # after (no unaligned loads; nothing past the row is read: the next vector's lanes past W are
    # masked off); columns 0 and W-1 are redone below from their folded neighbours
    c = _vldm(src, 0, W)
    u = c
    j = 0
    while j < W:
        nx = _vldm(src, j + L, W - j - L)
        _vstm(dst, j, _anti(_vleft(u, c), c, _vright(c, nx), w0, wl, af), W - j)
        u = c
        c = nx
        j += L
    for e in range(2 if W > 1 else 1):
        x = e * (W - 1)
        f0 = xe[2 * e]
        f1 = xe[2 * e + 1]
        lo = src[f0] if f0 >= 0 else zs
        hi = src[f1] if f1 >= 0 else zs
        dst[x] = src[x] * w0s + (lo - hi) * wls


@njit(forceinline=True, **_JIT)
def _pads(T, W, xe, zs, L):
    """The pads ``T[L - 1]``, ``T[L + W]`` of a padded row ``T[L .. L + W)`` (folded, 0 in
    constant mode)."""
    f0 = xe[0]
    f1 = xe[3]
    T[L - 1] = T[L + f0] if f0 >= 0 else zs
    T[L + W] = T[L + f1] if f1 >= 0 else zs


@njit(**_JIT)
def _k_grad3(sa, oa, ga, Wt, Ma, La, it0, it1):
    """Work items ``it0 .. it1`` (module docstring): source ``sa``, output ``oa``, the gradient
    ``ga`` (``magscale``), weights ``Wt = [wc, wl, s0, s1, 0, t0, t1]`` and the magnitude's term masks
    (:func:`_direct`) of the compute dtype, ``M``, the
    layout ``La`` (``volume_kernels``' roles)."""
    fz = Wt[0]
    L = _VL(fz)
    isz = Wt.itemsize
    WP = _ptr(Wt.ctypes.data, fz)
    w0 = _vsplat(WP, 0)
    wl = _vsplat(WP, 1)
    s0 = _vsplat(WP, 2)
    s1 = _vsplat(WP, 3)
    t0 = _vsplat(WP, 5)  # the last pass's (``normalized``: scaled)
    t1 = _vsplat(WP, 6)
    w0s, wls, zs = Wt[0], Wt[1], Wt[4]
    zv = _vsplat(WP, 4)
    D, H, W = Ma[0], Ma[1], Ma[2]
    by, nyb, zc, nzc, epi = Ma[3], Ma[4], Ma[5], Ma[6], Ma[7]
    af, sf, tf = Ma[8], Ma[9], Ma[13]
    p0, p1, p2 = Ma[10], Ma[11], Ma[12]
    zf = Ma[M_FOLDS:M_FOLDS + D + 2]  # (views of M: the host's fold tables)
    yf = Ma[M_FOLDS + D + 2:M_FOLDS + D + H + 4]
    xe = Ma[M_FOLDS + D + H + 4:M_FOLDS + D + H + 8]
    sD, sH = La[R_SRC + 4], La[R_SRC + 5]
    oK, oD, oH = La[R_OUT + 3], La[R_OUT + 4], La[R_OUT + 5]
    gD, gH = La[R_AUX + 4], La[R_AUX + 5]
    mz, mx, my, half = _vsplat(WP, 7), _vsplat(WP, 8), _vsplat(WP, 9), _vsplat(WP, 10)  # (:func:`_direct`)
    RQ = (W + L - 1) // L * L + L  # a row's pitch: whole vectors, and one more (an odd number of
    RP = RQ + L  # vectors, mostly: rows do not share cache sets); a padded row's: its data at offset L
    NR = by + 2
    oDX = 0  # ring of 3 planes x NR rows: dx
    oT = 3 * NR * RQ  # by padded rows: sz(dy); by more: sy(dz)
    oG = oT + 2 * by * RP  # by rows: gx
    oC = oG + by * RQ  # 3 rows of L: the components of a vector to rescale
    o0 = oC + 3 * L  # the zero row
    buf = np.zeros(o0 + RP + L, Wt.dtype)
    ba = (buf.ctypes.data + 63) // 64 * 64  # rows of whole, aligned vectors
    B = _ptr(ba, fz)
    za = ba + o0 * isz
    out = _ptr(oa, fz)
    gp = _ptr(ga, fz)
    ra = np.empty(3 * NR, np.int64)  # ring of 3 planes: the addresses of rows y0-1 .. y1
    RA = _ptr(ra.ctypes.data, ra[0])
    # the passes a component needs (one component: its own alone)
    need_x = epi != EPI_D_ONE or p0 == 2
    need_y = epi != EPI_D_ONE or p0 == 1
    need_z = epi != EPI_D_ONE or p0 == 0
    per = nyb * nzc
    for it in range(it0, it1):
        v = it // per
        rem = it % per
        y0 = (rem // nzc) * by
        y1 = min(H, y0 + by)
        ny = y1 - y0
        z0 = (rem % nzc) * zc
        z1 = min(D, z0 + zc)
        sb = _voff(La, R_SRC, v)
        ob = _voff(La, R_OUT, v)
        gb = _voff(La, R_AUX, v)
        for zi in range(z0 - 1, z1 + 1):
            sl = (zi - z0 + 1) % 3
            zz = zf[zi + 1]
            for q in range(ny + 2):
                yy = yf[y0 + q]
                ra[sl * NR + q] = za if zz < 0 or yy < 0 else sa + (sb + zz * sD + yy * sH) * isz
            for q in range(ny + 2 if need_x else 0):  # dx of the rows y0-1 .. y1 of plane zi
                _dx_row(_ptr(ba + (oDX + (sl * NR + q) * RQ) * isz, fz), _ptr(ra[sl * NR + q], fz), W, w0, wl, af,
                        w0s, wls, zs, xe, L)
            if zi < z0 + 1:
                continue
            z = zi - 1
            sm = (sl + 1) % 3  # the ring slots of planes z-1, z, z+1
            sc = (sl + 2) % 3
            # a walk down each vector's column of the block: the three planes' input rows and the
            # windows of dz and sz(dx) slide through registers; per output row it stores sz(dy)
            # (each plane's dy formed from the rows it holds), sy(dz) and gx
            XM = ba + (oDX + sm * NR * RQ) * isz
            XC = ba + (oDX + sc * NR * RQ) * isz
            XP = ba + (oDX + sl * NR * RQ) * isz
            j = 0
            while j < W:
                n = W - j
                a0 = _vldm(_ptr(RA[sm * NR], fz), j, n)  # rows y0-1 (a0, b0, c0) and y0 of planes z-1, z, z+1
                b0 = _vldm(_ptr(RA[sc * NR], fz), j, n)
                c0 = _vldm(_ptr(RA[sl * NR], fz), j, n)
                a1 = _vldm(_ptr(RA[sm * NR + 1], fz), j, n)
                b1 = _vldm(_ptr(RA[sc * NR + 1], fz), j, n)
                c1 = _vldm(_ptr(RA[sl * NR + 1], fz), j, n)
                d0 = _anti(a0, b0, c0, w0, wl, af)  # dz
                d1 = _anti(a1, b1, c1, w0, wl, af)
                e0 = d0  # sz(dx)
                e1 = d0
                if need_x:
                    e0 = _sym(_vldm(_ptr(XM, fz), j, n), _vldm(_ptr(XC, fz), j, n), _vldm(_ptr(XP, fz), j, n),
                              s0, s1, sf)
                    e1 = _sym(_vldm(_ptr(XM + RQ * isz, fz), j, n), _vldm(_ptr(XC + RQ * isz, fz), j, n),
                              _vldm(_ptr(XP + RQ * isz, fz), j, n), s0, s1, sf)
                for q in range(ny):
                    a2 = _vldm(_ptr(RA[sm * NR + q + 2], fz), j, n)
                    b2 = _vldm(_ptr(RA[sc * NR + q + 2], fz), j, n)
                    c2 = _vldm(_ptr(RA[sl * NR + q + 2], fz), j, n)
                    if need_y:
                        _vstm(_ptr(ba + (oT + q * RP + L) * isz, fz), j,
                              _sym(_anti(a0, a1, a2, w0, wl, af), _anti(b0, b1, b2, w0, wl, af),
                                   _anti(c0, c1, c2, w0, wl, af), s0, s1, sf), n)
                    if need_z:
                        d2 = _anti(a2, b2, c2, w0, wl, af)
                        _vstm(_ptr(ba + (oT + (by + q) * RP + L) * isz, fz), j, _sym(d0, d1, d2, s0, s1, sf), n)
                        d0 = d1
                        d1 = d2
                    if need_x:
                        o = (q + 2) * RQ * isz
                        e2 = _sym(_vldm(_ptr(XM + o, fz), j, n), _vldm(_ptr(XC + o, fz), j, n),
                                  _vldm(_ptr(XP + o, fz), j, n), s0, s1, sf)
                        _vstm(_ptr(ba + (oG + q * RQ) * isz, fz), j, _sym(e0, e1, e2, t0, t1, tf), n)
                        e0 = e1
                        e1 = e2
                    a0, b0, c0, a1, b1, c1 = a1, b1, c1, a2, b2, c2
                j += L
            # per output row, the x-passes of sz(dy) and sy(dz) over their padded rows (whole
            # vectors, each lane's neighbours shuffled in from the vectors before and after: the
            # pads are lanes of those), then the epilogue, stored once
            for q in range(ny):
                T1 = _ptr(ba + (oT + q * RP) * isz, fz)
                T2 = _ptr(ba + (oT + (by + q) * RP) * isz, fz)
                GX = _ptr(ba + (oG + q * RQ) * isz, fz)
                if need_y:
                    _pads(T1, W, xe, zs, L)
                if need_z:
                    _pads(T2, W, xe, zs, L)
                orow = ob + z * oD + (y0 + q) * oH
                grow = gb + z * gD + (y0 + q) * gH
                u1 = _vld(T1, 0)
                c1 = _vld(T1, L)
                u2 = _vld(T2, 0)
                c2 = _vld(T2, L)
                j = 0
                while j < W:
                    n = W - j
                    n1 = _vld(T1, 2 * L + j)
                    n2 = _vld(T2, 2 * L + j)
                    gx = _vldm(GX, j, n)
                    gy = _sym(_vleft(u1, c1), c1, _vright(c1, n1), t0, t1, tf)
                    gz = _sym(_vleft(u2, c2), c2, _vright(c2, n2), t0, t1, tf)
                    u1, c1, u2, c2 = c1, n1, c2, n2
                    if epi == EPI_D_MAG:
                        a0 = _vselge(mz, half, gy, gz)  # the first two in either order, and the last
                        a1 = _vselge(mx, half, gy, gx)
                        a2 = _vselge(mz, half, gz, _vselge(my, half, gy, gx))
                    else:
                        g3 = (gz, gy, gx)
                        a0, a1, a2 = g3[p0], g3[p1], g3[p2]  # the components in the spec's order
                    if epi == EPI_D_ONE:  # the one component alone
                        _vstm(out, orow + j, a0, n)
                    elif epi == EPI_D_STACK:
                        _vstm(out, orow + j, a0, n)
                        _vstm(out, orow + oK + j, a1, n)
                        _vstm(out, orow + 2 * oK + j, a2, n)
                    else:
                        s = _vadd(_vadd(_vmul(a0, a0), _vmul(a1, a1)), _vmul(a2, a2))
                        if epi == EPI_D_MAG:
                            _vstm(out, orow + j, _vsqrt(s), n)
                        else:
                            f = _vscale(_vldm(gp, grow + j, n), _vsqrt(s))
                            _vstm(out, orow + j, _vmul(f, a0), n)
                            _vstm(out, orow + oK + j, _vmul(f, a1), n)
                            _vstm(out, orow + 2 * oK + j, _vmul(f, a2), n)
                        if _vmagodd(s) and _vmagbad(s, _vmaxabs(_vmaxabs(_vmaxabs(zv, a0), a1), a2)):
                            C = _ptr(ba + oC * isz, fz)  # (rare) the rescaled formula, lane by lane
                            _vst(C, 0, a0)
                            _vst(C, L, a1)
                            _vst(C, 2 * L, a2)
                            if epi == EPI_D_MAG:
                                _mag_fix(out, orow + j, 1, B, oC, L, 3, min(n, L))
                            else:
                                _mag_vjp_fix(B, oC, L, out, orow + j, oK, 3, min(n, L), gp, grow + j, 1)
                    j += L
    # (numba frees an array after its last use: the buffers read through raw pointers live to here)
    return buf.size + ra.size + Wt.size + Ma.size + La.size
