"""The tiled adjoint (backward) engine.

Backward passes are the adjoint, fused the same way: for a linear stencil
with folded boundaries it is ``Pad^T S^T g``.  ``S^T g`` is a correlation of
the zero-padded incoming gradient with the flipped taps (the same vectorised
loops, over the padded coordinates of the item), and ``Pad^T`` sums each
padded position back onto the sample it folds to -- gathered per output row
(padded rows owned by another work item are recomputed, never written: no
atomics).  For ``gradient_magnitude``/``gradient_direction`` and selective
blur the stencils are recomputed from ``x`` in the tile, so a backward reads
``x`` and ``grad`` and writes ``grad_in`` once.

NaN/inf follow the reference (SciPy's rules): 1-D passes multiply every tap,
zeros included (a NaN under the 0 of ``[-1, 0, 1]`` is NaN), dense kernels
leave zero weights out; zero taps are skipped when a tile is all finite.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .forward import _engine, _fill, _load_row, _mask_at, _pass, _written
from .prims import _JIT, _cvt, _expo, _expo_all, _hyp2_vjp, _ld, _mag_flag, _ptr, _st
from .tables import (
    EPI_DIR, EPI_MAG, EPI_NORM, EPI_STACK, EPI_SUM, F_ONE, F_TAPS, F_THR, F_ZERO, I_BI0, I_BI1, I_BJ0, I_BJ1, I_BR, I_BX,
    I_EPI, I_EXHI, I_EXLO, I_EYHI, I_EYLO, I_FH, I_FW, I_H, I_K, I_KEEPB, I_NB, I_NBX, I_NPM, I_PAD, I_ST,
    I_TAPI, I_W, R_G, R_M, R_O, R_X, ST_LEN, _poff,
)

# =============================================================================
# backward (full-width rows: flat layout with border fix-ups, or padded layout)


@njit(**_JIT)
def _bwd_layout(P, K, BR):
    W = P[I_W]
    ey = P[I_EYHI] - P[I_EYLO]
    g = P[I_EXHI] - P[I_EXLO]
    Ws = W + g if P[I_PAD] != 0 else W
    npm = P[I_NPM]
    ZL = (npm + ey) * Ws + 2 * g
    RL = (npm + ey) * Ws
    Z0 = np.int64(0)
    S0 = Z0 + K * ZL
    V0 = S0 + (npm + 2 * ey) * Ws + 2 * g
    # the recomputed forward's intermediate: a horizontal-first pass covers every tile row (the
    # block's rows, its halo, and the second pass's halo: npm + 2 ey)
    R0 = V0 + (npm + 2 * ey) * Ws + 2 * g
    U0 = R0 + K * RL
    G0 = U0 + npm * Ws + 2 * g
    E0 = G0 + npm * Ws
    A0 = E0 + npm * P[I_NBX]
    total = A0 + BR * W
    return Ws, ZL, RL, Z0, S0, V0, R0, U0, G0, E0, A0, total


@njit(**_JIT)
def _zclear(Z, Z0, ZL, K, nz, lo, hi, Ws, P, zero):
    """Zero the guards, the rows outside the image and the gap columns of the K gradient tiles."""
    W = P[I_W]
    g = P[I_EXHI] - P[I_EXLO]
    for k in range(K):
        zk = Z0 + k * ZL
        _fill(Z, zk, g, zero)
        _fill(Z, zk + g + nz * Ws, g, zero)
        for r in range(nz):
            if r < lo or r >= hi:
                _fill(Z, zk + g + r * Ws, Ws, zero)
            elif Ws > W:
                _fill(Z, zk + g + r * Ws + W, Ws - W, zero)


@njit(**_JIT)
def _adjoint(B, G0, Z0, ZL, U0, E0, npr, Ws, P, Fc):
    """``G = sum_k S_k^T Z_k`` on padded rows ``pa .. pa+npr``: image columns (flat layout,
    the column fold summed in at the border columns) or all padded columns (padded layout)."""
    W = P[I_W]
    EYhi = P[I_EYHI]
    EXlo = P[I_EXLO]
    g = P[I_EXHI] - EXlo
    cx = g + EXlo if P[I_PAD] != 0 else g
    n = npr * Ws
    ti = P[I_TAPI]
    nfix = P[I_NBX]
    zero = Fc[F_ZERO]
    ONE, ZERO, NO = np.int64(1), np.int64(0), np.bool_(False)
    for k in range(P[I_K]):
        d = P[I_ST] + ST_LEN * k
        zk = Z0 + k * ZL
        two = P[d] > 0 and P[d + 2] > 0
        if two:
            _pass(B, U0, B, zk, n + 2 * g, P, Fc, P[d + 1], P[d + 10], -ONE, EYhi, ZERO, ZERO, Ws, NO)
            _pass(B, G0, B, U0, n, P, Fc, P[d + 3], P[d + 11], ZERO, ZERO, -ONE, cx, Ws, k > 0)
            t0 = P[d + 3]
            nt = P[d + 11]
        else:
            _pass(B, G0, B, zk, n, P, Fc, P[d + 5], P[d + 12], -ONE, EYhi, -ONE, cx, Ws, k > 0)
            t0 = P[d + 5]
            nt = P[d + 12]
        # flat layout: border columns, the exact sum over every padded column folding onto them
        e = P[I_BX]
        for f in range(nfix):
            nq = P[e + 1]
            eb = E0 + f * npr
            if k == 0:
                _fill(B, eb, npr, zero)
            for qi in range(nq):
                qq = P[e + 2 + qi]
                for t in range(nt):
                    kk = t0 + t
                    cc = qq - P[ti + 2 * kk + 1]
                    if cc < 0 or cc >= W:
                        continue
                    w = Fc[F_TAPS + kk]
                    if two:
                        base = U0 + g + cc
                    else:
                        base = zk + g + (EYhi - P[ti + 2 * kk]) * W + cc
                    for r in range(npr):
                        B[eb + r] += w * B[base + r * W]
            e += 2 + nq
    e = P[I_BX]
    for f in range(nfix):
        v = P[e]
        eb = E0 + f * npr
        for r in range(npr):
            B[G0 + r * W + v] = B[eb + r]
        e += 2 + P[e + 1]


@njit(**_JIT)
def _unpad(B, A0, u0, u1, G0, pa, npr, Ws, P):
    """Sum padded rows ``pa .. pa+npr`` of G onto the rows ``u0 .. u1`` they fold to (and, in the
    padded layout, the padded columns onto the columns they fold to)."""
    W = P[I_W]
    EXlo = P[I_EXLO]
    fh = P[I_FH] - P[I_EYLO]
    fw = P[I_FW]
    if P[I_PAD] == 0:
        a = max(pa, u0)
        b = min(pa + npr, u1)
        if b > a:
            d0 = A0 + (a - u0) * W
            s0 = G0 + (a - pa) * W
            for q in range((b - a) * W):
                B[d0 + q] += B[s0 + q]
        for r in range(npr):
            p = pa + r
            if p >= a and p < b:
                continue
            t = P[fh + p]
            if t < u0 or t >= u1:
                continue
            d0 = A0 + (t - u0) * W
            s0 = G0 + r * W
            for j in range(W):
                B[d0 + j] += B[s0 + j]
        return
    for r in range(npr):
        t = P[fh + pa + r]
        if t < u0 or t >= u1:
            continue
        d0 = A0 + (t - u0) * W
        s0 = G0 + r * Ws
        for j in range(W):
            B[d0 + j] += B[s0 - EXlo + j]
        for c in range(Ws):
            if c >= -EXlo and c < W - EXlo:
                continue
            jt = P[fw + c]
            if jt >= 0:
                B[d0 + jt] += B[s0 + c]


@njit(**_JIT)
def _segment(P, NB, H, u0, u1, sgi):
    """The sgi-th padded row range a work item must gather: (pa, pb), or pb <= pa to skip."""
    EYlo = P[I_EYLO]
    EYhi = P[I_EYHI]
    if NB == 1:
        return EYlo, H + EYhi
    if sgi == 0:
        return u0, u1
    pa = EYlo + sgi - 1  # a padded row outside the image ...
    if pa >= 0:
        pa += H
    t = P[P[I_FH] - EYlo + pa]
    if t < u0 or t >= u1:  # ... that folds into this block
        return np.int64(0), np.int64(0)
    return pa, pa + 1


@njit(**_JIT)
def _filter_z(B, Ws, ZL, RL, Z0, S0, V0, R0, x, L, p, xsH, xsW, gp, gb, gsK, gsH, gsW, pa, pb, epi, P, Fc):
    """Incoming gradient of each stencil (zero outside the image) on rows ``pa-EYhi .. pb-EYlo``."""
    I0, I1, NO = np.int64(0), np.int64(1), np.bool_(False)
    H = P[I_H]
    W = P[I_W]
    K = P[I_K]
    g = P[I_EXHI] - P[I_EXLO]
    za = pa - P[I_EYHI]
    zb = pb - P[I_EYLO]
    ia = max(za, 0)
    ib = min(zb, H)
    zero = Fc[F_ZERO]
    _zclear(B, Z0, ZL, K, zb - za, ia - za, ib - za, Ws, P, zero)
    if ib <= ia:
        return
    if epi != EPI_STACK and epi != EPI_SUM:
        _engine(B, R0, RL, B, S0, B, V0, x, L, p, I1, xsH, xsW, x, NO, I0, I0, zero, I0, ia, ib, I0, W, Ws, K, P, Fc)
    flat = Ws == W and gsH == W * gsW
    nr = ib - ia
    nseg = 1 if flat else nr
    sl = nr * W if flat else W
    for sg in range(nseg):
        zr = Z0 + g + (ia - za + sg) * Ws
        grow = gb + (ia + sg) * gsH
        if epi == EPI_STACK:
            for k in range(K):
                _load_row(B, zr + k * ZL, gp, grow + k * gsK, gsW, sl)
            continue
        if epi == EPI_SUM:  # every stencil gets the same gradient
            for k in range(K):
                _load_row(B, zr + k * ZL, gp, grow, gsW, sl)
            continue
        q = R0 + sg * Ws
        if epi == EPI_MAG:
            fl = _expo(zero)
            if K == 2:
                for j in range(sl):
                    a = B[q + j]
                    b = B[q + RL + j]
                    s = a * a + b * b
                    mg = math.sqrt(s)
                    sc = _ld(gp, grow + j * gsW) / mg if mg != zero else zero
                    B[zr + j] = sc * a
                    B[zr + ZL + j] = sc * b
                    fl = max(fl, _mag_flag(s, (a != 0) | (b != 0)))
            else:
                for j in range(sl):
                    a = B[q + j]
                    s = a * a
                    nz = a != 0
                    for k in range(1, K):
                        b = B[q + k * RL + j]
                        s += b * b
                        nz |= b != 0
                    mg = math.sqrt(s)
                    sc = _ld(gp, grow + j * gsW) / mg if mg != zero else zero
                    for k in range(K):
                        B[zr + k * ZL + j] = sc * B[q + k * RL + j]
                    fl = max(fl, _mag_flag(s, nz))
            if fl == _expo_all(zero):  # (rare) sums of squares that over/underflowed: rescaled
                _mag_vjp_fix(B, q, RL, B, zr, ZL, K, sl, gp, grow, gsW)
        else:  # direction: d atan2(a, b) = (b da - a db) / (a^2 + b^2)
            for j in range(sl):
                a = B[q + j]
                b = B[q + RL + j]
                rr = a * a + b * b
                sc = _ld(gp, grow + j * gsW) / rr if rr != zero else zero
                B[zr + j] = sc * b
                B[zr + ZL + j] = -sc * a


@njit(**_JIT)
def _mag_vjp_fix(B, q, RL, O, zr, ZL, K, sl, gp, grow, gsW):
    """``O[zr + k*ZL + j] = g * y_k / |y|`` again where the sum of squares of ``y_k = B[q + k*RL + j]``
    over/underflowed, with the rescaled magnitude (``reference._magnitude_vjp``):
    ``g * (y_k/m) / sqrt(sum (y_j/m)**2)``; other pixels are left alone."""
    for j in range(sl):
        a = B[q + j]
        s = a * a
        nz = a != 0
        m = abs(a)
        for k in range(1, K):
            b = B[q + k * RL + j]
            s += b * b
            nz |= b != 0
            m = max(m, abs(b))
        if _mag_flag(s, nz) != _expo_all(s) or s != s or m == np.inf:
            continue  # (an infinite component: g / inf * y_k as computed, the reference's value)
        g = _ld(gp, grow + j * gsW)
        if K == 2:
            ua, ub = _hyp2_vjp(g, a, B[q + RL + j])
            O[zr + j] = ua
            O[zr + ZL + j] = ub
            continue
        t = a / m
        r = t * t
        for k in range(1, K):
            t = B[q + k * RL + j] / m
            r += t * t
        sc = g / math.sqrt(r)
        for k in range(K):
            O[zr + k * ZL + j] = sc * (B[q + k * RL + j] / m)


@njit(**_JIT)
def _store_rows(o, ob, osH, osW, B, A0, u0, u1, W):
    flat = osH == W * osW
    nseg = 1 if flat else u1 - u0
    sl = (u1 - u0) * W if flat else W
    for sg in range(nseg):
        a0 = A0 + sg * W
        orow = ob + (u0 + sg) * osH
        if osW == 1:
            for j in range(sl):
                _st(o, orow + j, B[a0 + j])
        else:
            for j in range(sl):
                _st(o, orow + j * osW, B[a0 + j])


def _make_filter_bwd(EPI):
    """The backward kernel for one epilogue."""

    @njit(**_JIT)
    def _k_filter_bwd(ga, xa, oa, carrier, Pa, Fa, La, it0, it1):
        gp = _ptr(ga, carrier)
        x = _ptr(xa, carrier)
        o = _ptr(oa, carrier)
        Fa32 = _cvt(carrier, Fa)
        Fc = _ptr(Fa32.ctypes.data, Fa32[0])
        P = _ptr(Pa.ctypes.data, Pa[0])
        L = _ptr(La.ctypes.data, La[0])
        H = P[I_H]
        W = P[I_W]
        K = P[I_K]
        BR = P[I_BR]
        NB = P[I_NB]
        Ws, ZL, RL, Z0, S0, V0, R0, U0, G0, E0, A0, total = _bwd_layout(P, K, BR)
        buf = np.empty(total, Fa32.dtype)
        B = _ptr(buf.ctypes.data, Fc[0])
        xsH, xsW = L[R_X + 4], L[R_X + 5]
        gsK, gsH, gsW = L[R_G + 3], L[R_G + 4], L[R_G + 5]
        osH, osW = L[R_O + 4], L[R_O + 5]
        nseg = 1 if NB == 1 else 1 + P[I_EYHI] - P[I_EYLO]
        for it in range(it0, it1):
            p = it // NB
            u0 = (it % NB) * BR
            u1 = min(H, u0 + BR)
            gb = _poff(L, np.int64(R_G), p)
            ob = _poff(L, np.int64(R_O), p)
            _fill(B, A0, (u1 - u0) * W, Fc[F_ZERO])
            for sgi in range(nseg):
                pa, pb = _segment(P, NB, H, u0, u1, sgi)
                if pb <= pa:
                    continue
                _filter_z(B, Ws, ZL, RL, Z0, S0, V0, R0, x, L, p, xsH, xsW, gp, gb, gsK, gsH, gsW, pa, pb, EPI, P, Fc)
                _adjoint(B, G0, Z0, ZL, U0, E0, pb - pa, Ws, P, Fc)
                _unpad(B, A0, u0, u1, G0, pa, pb - pa, Ws, P)
            _store_rows(o, ob, osH, osW, B, A0, u0, u1, W)
        return buf.size + Fa32.size + Pa.size + La.size

    return _k_filter_bwd


_K_FILTER_BWD = {e: _make_filter_bwd(e) for e in (EPI_STACK, EPI_MAG, EPI_DIR, EPI_SUM)}


@njit(**_JIT)
def _blur_z(B, Ws, ZL, RL, Z0, S0, V0, R0, x, L, p, xb, xsH, xsW, m, mb, msH, msW, hasm, thr, gp, gb, gsH, gsW,
            pa, pb, P, Fc):
    I0, I1 = np.int64(0), np.int64(1)
    H = P[I_H]
    W = P[I_W]
    norm = P[I_EPI] == EPI_NORM
    keepb = P[I_KEEPB] != 0
    bj0, bj1 = P[I_BJ0], P[I_BJ1]
    g = P[I_EXHI] - P[I_EXLO]
    za = pa - P[I_EYHI]
    zb = pb - P[I_EYLO]
    ia = max(za, 0)
    ib = min(zb, H)
    zero = Fc[F_ZERO]
    _zclear(B, Z0, ZL, I1, zb - za, ia - za, ib - za, Ws, P, zero)
    if ib <= ia:
        return
    if norm:
        _engine(B, R0, RL, B, S0, B, V0, x, L, p, I1, xsH, xsW, m, hasm, msH, msW, thr, I1, ia, ib, I0, W, Ws, I1, P,
                Fc)
    flat = Ws == W and gsH == W * gsW and xsH == W * xsW and (not hasm or msH == W * msW) and not keepb
    nr = ib - ia
    nseg = 1 if flat else nr
    sl = nr * W if flat else W
    for sg in range(nseg):
        i = ia + sg
        zr = Z0 + g + (i - za) * Ws
        grow = gb + i * gsH
        xrow = xb + i * xsH
        mrow = mb + i * msH
        rowin = i >= P[I_BI0] and i < P[I_BI1]
        q = R0 + sg * Ws
        for j in range(sl):
            mm = _written(_mask_at(_ld(x, xrow + j * xsW), m, mrow + j * msW, hasm, thr), keepb, rowin, j, bj0, bj1)
            gv = _ld(gp, grow + j * gsW)
            if norm:
                den = B[q + j]
                B[zr + j] = gv / den if (mm and den > zero) else zero
            else:
                B[zr + j] = gv if mm else zero


@njit(**_JIT)
def _k_blur_bwd(ga, xa, ma, oa, carrier, Pa, Fa, La, thr, it0, it1):
    I0, I1 = np.int64(0), np.int64(1)
    gp = _ptr(ga, carrier)
    x = _ptr(xa, carrier)
    o = _ptr(oa, carrier)
    m = _ptr(ma, np.uint8(0))
    hasm = ma != 0
    Fa32 = _cvt(carrier, Fa)
    Fc = _ptr(Fa32.ctypes.data, Fa32[0])
    P = _ptr(Pa.ctypes.data, Pa[0])
    L = _ptr(La.ctypes.data, La[0])
    Fc[F_THR] = thr
    thr_c = Fc[F_THR]
    H = P[I_H]
    W = P[I_W]
    norm = P[I_EPI] == EPI_NORM
    keepb = P[I_KEEPB] != 0
    bj0, bj1 = P[I_BJ0], P[I_BJ1]
    EYhi = P[I_EYHI]
    BR = P[I_BR]
    NB = P[I_NB]
    Ws, ZL, RL, Z0, S0, V0, R0, U0, G0, E0, A0, total = _bwd_layout(P, I1, BR)
    buf = np.empty(total, Fa32.dtype)
    B = _ptr(buf.ctypes.data, Fc[0])
    xsH, xsW = L[R_X + 4], L[R_X + 5]
    gsH, gsW = L[R_G + 4], L[R_G + 5]
    osH, osW = L[R_O + 4], L[R_O + 5]
    msH, msW = L[R_M + 4], L[R_M + 5]
    zero = Fc[F_ZERO]
    one = Fc[F_ONE]
    nseg = 1 if NB == 1 else 1 + EYhi - P[I_EYLO]
    flat = (Ws == W and osH == W * osW and gsH == W * gsW and xsH == W * xsW and (not hasm or msH == W * msW)
            and not keepb)
    for it in range(it0, it1):
        p = it // NB
        u0 = (it % NB) * BR
        u1 = min(H, u0 + BR)
        xb = _poff(L, np.int64(R_X), p)
        gb = _poff(L, np.int64(R_G), p)
        ob = _poff(L, np.int64(R_O), p)
        mb = _poff(L, np.int64(R_M), p) if hasm else I0
        _fill(B, A0, (u1 - u0) * W, zero)
        ia_main = I0
        for sgi in range(nseg - 1, -1, -1):  # the main range last: its den stays in R
            pa, pb = _segment(P, NB, H, u0, u1, sgi)
            if pb <= pa:
                continue
            ia_main = max(pa - EYhi, 0)
            _blur_z(B, Ws, ZL, RL, Z0, S0, V0, R0, x, L, p, xb, xsH, xsW, m, mb, msH, msW, hasm, thr_c, gp, gb, gsH,
                    gsW, pa, pb, P, Fc)
            _adjoint(B, G0, Z0, ZL, U0, E0, pb - pa, Ws, P, Fc)
            _unpad(B, A0, u0, u1, G0, pa, pb - pa, Ws, P)
        nr = u1 - u0
        nsg = 1 if flat else nr
        sl = nr * W if flat else W
        for sg in range(nsg):
            u = u0 + sg
            a0 = A0 + sg * W
            orow = ob + u * osH
            grow = gb + u * gsH
            xrow = xb + u * xsH
            mrow = mb + u * msH
            rowin = u >= P[I_BI0] and u < P[I_BI1]
            q = R0 + (u - ia_main) * Ws
            for j in range(sl):
                ms = _mask_at(_ld(x, xrow + j * xsW), m, mrow + j * msW, hasm, thr_c)
                mm = _written(ms, keepb, rowin, j, bj0, bj1)
                gv = _ld(gp, grow + j * gsW)
                if norm:
                    use = mm and B[q + j] > zero
                    v = (one if ms else zero) * B[a0 + j] + (zero if use else gv)
                else:
                    v = B[a0 + j] + (zero if mm else gv)
                _st(o, orow + j * osW, v)
    return buf.size + Fa32.size + Pa.size + La.size
