"""The volume engine: ``sep`` specs over three axes (or two or one, with per-axis modes) fused in
one pass per call, forward and backward.  The planar engine hands it what ``_planar`` cannot
map to planes (``cpu/__init__``).

**Runs here.**  :class:`~torchfilters._spec.FilterSpec` whose stencils are ``sep`` with at most
one pass per axis and finite taps, epilogues ``stack`` (``K >= 1`` components), ``sum`` and
``magnitude``; every mode, per-axis modes, any radius on any size (``_lowering.lower`` first),
``constant`` mode with any finite ``cval`` (SciPy's sequential padding reproduced exactly:
``volume_plan``).  Backward: the transposed passes; for ``magnitude`` two phases (the forward
passes write ``g * y_k / |y|``, 0 where ``|y| = 0``, into ``K`` temporaries; then the
transposed passes sum them).

Selective blur (:class:`~torchfilters._spec.BlurSpec` with such a stencil): the blur and its
transpose run here, the masks, selects and the normalised mean's division are torch
elementwise ops in the compute dtype (the reference engine's formulas; not fused yet).

**Falls back to** ``reference``: dense stencils, the ``direction`` epilogue, two passes along
one axis, non-finite taps, ``constant`` mode with a non-finite ``cval``.

**Kernel.**  One kernel per compute dtype (float32, float64) runs every plan (``volume_plan``
describes the tables).  Work items are ``(volume, block of rows, chunk of planes)``; per output
plane: the z-passes of the rows the block reads (input rows read in place) into per-thread row
slots, then per output row the y-passes into padded rows (pads folded), the x-passes, the
epilogue and one store.  Every pass is one routine (:func:`_comb`: a row as a weighted sum of
rows, four vectors of accumulators in registers).  float16/bfloat16 inputs, rows of non-unit
stride and leading dimensions that do not collapse are copied to a contiguous float32 tensor
first; outputs that the kernel cannot write in place go through a temporary.
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import njit
from numba.core import cgutils
from numba.extending import intrinsic

from ..._spec import BlurSpec, FilterSpec
from .. import reference
from .._layout import collapse_planes
from .._lowering import lower
from .buffers import _alloc
from .plan import _small
from .prims import _JIT, _cvt, _ptr
from .separable import _VL, _hpair, _ldv, _stv, _vblock
from .simd import _vadd, _vfma, _vld, _vldm, _vmul, _vnz, _vsplat, _vst, _vstm, _vwts
from .threads import _launch, _threads
from .volume_plan import (
    EPI_ADDREST, EPI_BLEND, EPI_MAG, EPI_MAGSCALE, EPI_STACK, EPI_SUM, ST_LEN, V_BOX, V_BY, V_CORR, V_D, V_EPI, V_EPOS, V_FCORR, V_FENT, V_G, V_H,
    V_K, V_MAXE, V_NBY, V_NYN, V_NZC, V_NZN, V_PADL, V_PADR, V_PADT, V_RS, V_SLOT, V_SMAX, V_W, V_XN, V_XS, V_YN,
    V_ZC, V_ZN, V_ZP, V_ZS, V_RMAX, NODE_LEN, R, plan, supported,
)

__all__ = ["filter_forward", "filter_backward", "blur_forward", "blur_backward", "runs"]

# per-call layout L: per role [n1, s0, s1, sK, sD, sH] (elements), then the number of volumes;
# roles: the source the passes read, the output, an auxiliary tensor read at the output point
# (the gradient, or the input), the selection's tensor M (``sel = M >= thr``)
R_SRC, R_OUT, R_AUX, R_MSK = 0, 6, 12, 18
L_NV = 24


@intrinsic
def _vsqrt(typingctx, a):
    """Lane-wise ``sqrt`` (``llvm.sqrt``: exact, IEEE)."""

    def codegen(context, builder, sig, args):
        vt = args[0].type
        sfx = f"v{vt.count}{'f32' if isinstance(vt.element, ir.FloatType) else 'f64'}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt]), f"llvm.sqrt.{sfx}")
        return builder.call(fn, [args[0]])

    return a(a), codegen


@intrinsic
def _vscale(typingctx, g, m):
    """Lane-wise ``g / m``, 0 where ``m == 0`` (the magnitude's gradient scale)."""

    def codegen(context, builder, sig, args):
        gv, mv = args
        zero = ir.Constant(mv.type, None)
        return builder.select(builder.fcmp_ordered("==", mv, zero), zero, builder.fdiv(gv, mv))

    return g(g, m), codegen


@intrinsic
def _vselge(typingctx, v, t, a, b):
    """Lane-wise ``a if v >= t else b`` (ordered: a NaN ``v`` selects ``b``)."""

    def codegen(context, builder, sig, args):
        vv, tv, av, bv = args
        return builder.select(builder.fcmp_ordered(">=", vv, tv), av, bv)

    return a(v, t, a, b), codegen


@njit(**_JIT)
def _voff(Lp, r, v):
    n1 = Lp[r]
    return (v // n1) * Lp[r + 1] + (v % n1) * Lp[r + 2]


@njit(**_JIT)
def _comb(dst, d0, src, offs, w, w0, ne, n, L):
    """``dst[d0 + j] = sum_e w[w0 + e] * src[offs[e] + j]`` for ``j < n`` (tails masked: nothing
    past ``n`` is read or written).  Eight (then four, then one) vectors of accumulators per step:
    enough independent chains to keep both FMA pipes busy."""
    j = 0
    if ne == 0:
        zv = _vmul(_vnz(dst), _vnz(dst))
        while j + L <= n:
            _vst(dst, d0 + j, zv)
            j += L
        if j < n:
            _vstm(dst, d0 + j, zv, n - j)
        return
    while j + 8 * L <= n:
        wv = _vsplat(w, w0)
        o = offs[0] + j
        a0 = _vmul(wv, _vld(src, o))
        a1 = _vmul(wv, _vld(src, o + L))
        a2 = _vmul(wv, _vld(src, o + 2 * L))
        a3 = _vmul(wv, _vld(src, o + 3 * L))
        a4 = _vmul(wv, _vld(src, o + 4 * L))
        a5 = _vmul(wv, _vld(src, o + 5 * L))
        a6 = _vmul(wv, _vld(src, o + 6 * L))
        a7 = _vmul(wv, _vld(src, o + 7 * L))
        for e in range(1, ne):
            wv = _vsplat(w, w0 + e)
            o = offs[e] + j
            a0 = _vfma(wv, _vld(src, o), a0)
            a1 = _vfma(wv, _vld(src, o + L), a1)
            a2 = _vfma(wv, _vld(src, o + 2 * L), a2)
            a3 = _vfma(wv, _vld(src, o + 3 * L), a3)
            a4 = _vfma(wv, _vld(src, o + 4 * L), a4)
            a5 = _vfma(wv, _vld(src, o + 5 * L), a5)
            a6 = _vfma(wv, _vld(src, o + 6 * L), a6)
            a7 = _vfma(wv, _vld(src, o + 7 * L), a7)
        q = d0 + j
        _vst(dst, q, a0)
        _vst(dst, q + L, a1)
        _vst(dst, q + 2 * L, a2)
        _vst(dst, q + 3 * L, a3)
        _vst(dst, q + 4 * L, a4)
        _vst(dst, q + 5 * L, a5)
        _vst(dst, q + 6 * L, a6)
        _vst(dst, q + 7 * L, a7)
        j += 8 * L
    if j + 4 * L <= n:
        wv = _vsplat(w, w0)
        o = offs[0] + j
        a0 = _vmul(wv, _vld(src, o))
        a1 = _vmul(wv, _vld(src, o + L))
        a2 = _vmul(wv, _vld(src, o + 2 * L))
        a3 = _vmul(wv, _vld(src, o + 3 * L))
        for e in range(1, ne):
            wv = _vsplat(w, w0 + e)
            o = offs[e] + j
            a0 = _vfma(wv, _vld(src, o), a0)
            a1 = _vfma(wv, _vld(src, o + L), a1)
            a2 = _vfma(wv, _vld(src, o + 2 * L), a2)
            a3 = _vfma(wv, _vld(src, o + 3 * L), a3)
        _vst(dst, d0 + j, a0)
        _vst(dst, d0 + j + L, a1)
        _vst(dst, d0 + j + 2 * L, a2)
        _vst(dst, d0 + j + 3 * L, a3)
        j += 4 * L
    while j + L <= n:
        a0 = _vmul(_vsplat(w, w0), _vld(src, offs[0] + j))
        for e in range(1, ne):
            a0 = _vfma(_vsplat(w, w0 + e), _vld(src, offs[e] + j), a0)
        _vst(dst, d0 + j, a0)
        j += L
    if j < n:
        m = n - j
        a0 = _vmul(_vsplat(w, w0), _vldm(src, offs[0] + j, m))
        for e in range(1, ne):
            a0 = _vfma(_vsplat(w, w0 + e), _vldm(src, offs[e] + j, m), a0)
        _vstm(dst, d0 + j, a0, m)


@njit(**_JIT)
def _comb8(dst, d0, dstride, src, s0, sstride, w, w0, ne, n, L):
    """``R = 8`` regular rows at once: ``dst[d0 + r*dstride + j] = sum_e w[w0 + e] *
    src[s0 + (r + e)*sstride + j]`` for ``r < 8``, ``j < n``.  The eight source rows a tap reads
    slide through registers: one load per tap for eight outputs."""
    for j in range(0, n, L):
        m = min(L, n - j)
        o = s0 + j
        x0 = _ldv(src, o, m, L)
        x1 = _ldv(src, o + sstride, m, L)
        x2 = _ldv(src, o + 2 * sstride, m, L)
        x3 = _ldv(src, o + 3 * sstride, m, L)
        x4 = _ldv(src, o + 4 * sstride, m, L)
        x5 = _ldv(src, o + 5 * sstride, m, L)
        x6 = _ldv(src, o + 6 * sstride, m, L)
        x7 = _ldv(src, o + 7 * sstride, m, L)
        wv = _vsplat(w, w0)
        a0 = _vmul(wv, x0)
        a1 = _vmul(wv, x1)
        a2 = _vmul(wv, x2)
        a3 = _vmul(wv, x3)
        a4 = _vmul(wv, x4)
        a5 = _vmul(wv, x5)
        a6 = _vmul(wv, x6)
        a7 = _vmul(wv, x7)
        for e in range(1, ne):
            x0, x1, x2, x3, x4, x5, x6 = x1, x2, x3, x4, x5, x6, x7
            x7 = _ldv(src, o + (e + 7) * sstride, m, L)
            wv = _vsplat(w, w0 + e)
            a0 = _vfma(wv, x0, a0)
            a1 = _vfma(wv, x1, a1)
            a2 = _vfma(wv, x2, a2)
            a3 = _vfma(wv, x3, a3)
            a4 = _vfma(wv, x4, a4)
            a5 = _vfma(wv, x5, a5)
            a6 = _vfma(wv, x6, a6)
            a7 = _vfma(wv, x7, a7)
        q = d0 + j
        _stv(dst, q, a0, m, L)
        _stv(dst, q + dstride, a1, m, L)
        _stv(dst, q + 2 * dstride, a2, m, L)
        _stv(dst, q + 3 * dstride, a3, m, L)
        _stv(dst, q + 4 * dstride, a4, m, L)
        _stv(dst, q + 5 * dstride, a5, m, L)
        _stv(dst, q + 6 * dstride, a6, m, L)
        _stv(dst, q + 7 * dstride, a7, m, L)


@njit(**_JIT)
def _xsym(dst, d0, V, q0, n, w, r, L):
    """A symmetric x-pass of radius ``r >= 1``: ``dst[d0 + j] = w[0]*V[q0 + j] + sum_k w[k] *
    (V[q0 + j - k] + V[q0 + j + k])``, ``j < n`` (``separable._hpair``: the left windows are
    shuffles of aligned vectors, no cache-line-splitting loads)."""
    w0 = _vsplat(w, 0)
    nz = _vnz(w)
    WT = _vwts(w, 0)
    hoisted = r <= L
    for j in range(0, n, 2 * L):
        _hpair(dst, d0 + j, V, q0 + j, min(n - j, 2 * L), w0, nz, WT, w, r, L, hoisted, False)


@njit(**_JIT)
def _seg(kind, out, o0, X, aux, a0, M, m0, tv, j0, j1, L):
    """Columns ``j0 .. j1`` of a selective-blur output row: ``kind`` 0: ``x``; 1: ``sel ? X : x``;
    2: ``X + g``; 3: ``X + (sel ? 0 : g)`` (``aux``: ``x`` or ``g``; ``sel = M >= tv``)."""
    j = j0
    while j < j1:
        n = min(L, j1 - j)
        av = _ldv(aux, a0 + j, n, L)
        if kind == 0:
            v = av
        elif kind == 1:
            v = _vselge(_ldv(M, m0 + j, n, L), tv, _vld(X, j), av)
        elif kind == 2:
            v = _vadd(_vld(X, j), av)
        else:
            z = _vmul(_vnz(X), _vnz(X))
            v = _vadd(_vld(X, j), _vselge(_ldv(M, m0 + j, n, L), tv, z, av))
        _stv(out, o0 + j, v, n, L)
        j += L


@njit(**_JIT)
def _select_row(epi, inrow, bx0, bx1, out, o0, X, aux, a0, M, m0, tv, W, L):
    """One output row of the ``blend`` / ``addrest`` epilogues; the selection holds in columns
    ``bx0 .. bx1`` of rows inside the box (``inrow``) only."""
    out_k = 0 if epi == EPI_BLEND else 2
    in_k = 1 if epi == EPI_BLEND else 3
    if not inrow or bx0 >= bx1:
        _seg(out_k, out, o0, X, aux, a0, M, m0, tv, 0, W, L)
        return
    if bx0 > 0:
        _seg(out_k, out, o0, X, aux, a0, M, m0, tv, 0, bx0, L)
    _seg(in_k, out, o0, X, aux, a0, M, m0, tv, bx0, bx1, L)
    if bx1 < W:
        _seg(out_k, out, o0, X, aux, a0, M, m0, tv, bx1, W, L)


@njit(**_JIT)
def _epilogue(epi, out, o0, oK, X, XS, aux, a0, K, W, F, L):
    """Combine the ``K`` stencil rows ``X[k*XS ..]`` of one output row (``sum``, ``magnitude``,
    ``magscale``: ``out[k] = g * X[k] / |X|``, 0 where ``|X| = 0``)."""
    j = 0
    if epi == EPI_MAGSCALE:
        while j < W:
            n = min(L, W - j)
            a = _vld(X, j)
            s = _vmul(a, a)
            for k in range(1, K):
                b = _vld(X, k * XS + j)
                s = _vfma(b, b, s)
            sc = _vscale(_ldv(aux, a0 + j, n, L), _vsqrt(s))
            for k in range(K):
                _stv(out, o0 + k * oK + j, _vmul(sc, _vld(X, k * XS + j)), n, L)
            j += L
        return
    while j < W:
        n = min(L, W - j)
        a = _vld(X, j)
        if epi == EPI_MAG:
            a = _vmul(a, a)
            for k in range(1, K):
                b = _vld(X, k * XS + j)
                a = _vfma(b, b, a)
            a = _vsqrt(a)
        else:
            for k in range(1, K):
                a = _vadd(a, _vld(X, k * XS + j))
        if n == L:
            _vst(out, o0 + j, a)
        else:
            _vstm(out, o0 + j, a, n)
        j += L


@njit(**_JIT)
def _k_vol(sa, oa, aa, ma, Ta, fz, Pa, Fa, La, it0, it1):
    """Work items ``it0 .. it1`` of a volume plan (``volume_plan``): source ``sa``, output ``oa``,
    auxiliary ``aa`` (the gradient for ``magscale``/``addrest``, the input for ``blend``), the
    selection's tensor ``ma`` and its threshold ``Ta[0]``, all of the compute dtype of ``fz``."""
    Fc = _cvt(fz, Fa)
    F = _ptr(Fc.ctypes.data, fz)
    P = _ptr(Pa.ctypes.data, Pa[0])
    Lp = _ptr(La.ctypes.data, La[0])
    src = _ptr(sa, fz)
    out = _ptr(oa, fz)
    aux = _ptr(aa, fz)
    msk = _ptr(ma, fz)
    tv = _vsplat(_ptr(Ta.ctypes.data, fz), 0)
    bz0, bz1, by0, by1, bx0, bx1 = P[V_BOX], P[V_BOX + 1], P[V_BOX + 2], P[V_BOX + 3], P[V_BOX + 4], P[V_BOX + 5]
    D = P[V_D]
    H = P[V_H]
    W = P[V_W]
    K = P[V_K]
    epi = P[V_EPI]
    NZN = P[V_NZN]
    NYN = P[V_NYN]
    BY = P[V_BY]
    NBY = P[V_NBY]
    ZC = P[V_ZC]
    NZC = P[V_NZC]
    G = P[V_G]
    RS = P[V_RS]
    ZS = P[V_ZS]
    SMAX = P[V_SMAX]
    corr = P[V_CORR] != 0
    padl = P[V_PADL]
    padr = P[V_PADR]
    padt = P[V_PADT]
    zn = P[V_ZN]
    yn = P[V_YN]
    xn = P[V_XN]
    slot = P[V_SLOT]
    XS = P[V_XS]
    epos = P[V_EPOS]
    fent = P[V_FENT]
    fcorr = P[V_FCORR]
    L = _VL(fz)
    cval = F[0]
    zero = F[1]
    ZP = P[V_ZP]  # one plane's slots
    isz = Fc.itemsize
    Fa0 = Fc.ctypes.data
    zbuf = np.empty(R * ZP + 2 * L, Fc.dtype)
    Za = (zbuf.ctypes.data + 63) // 64 * 64
    Z = _ptr(Za, fz)
    ybuf = np.zeros(NYN * R * RS + 2 * L, Fc.dtype)
    Y = _ptr((ybuf.ctypes.data + 63) // 64 * 64, fz)
    rbuf = np.empty(R + 2 * P[V_RMAX] + 2, np.int64)
    RW = _ptr(rbuf.ctypes.data, rbuf[0])
    xbuf = np.zeros(K * XS + L, Fc.dtype)
    X = _ptr(xbuf.ctypes.data, fz)
    obuf = np.empty(P[V_MAXE] + 1, np.int64)
    OF = _ptr(obuf.ctypes.data, obuf[0])
    sK, sD, sH = Lp[R_SRC + 3], Lp[R_SRC + 4], Lp[R_SRC + 5]
    oK, oD, oH = Lp[R_OUT + 3], Lp[R_OUT + 4], Lp[R_OUT + 5]
    aD, aH = Lp[R_AUX + 4], Lp[R_AUX + 5]
    mD, mH = Lp[R_MSK + 4], Lp[R_MSK + 5]
    per = NBY * NZC
    for it in range(it0, it1):
        v = it // per
        rem = it % per
        b = rem // NZC
        zc = rem % NZC
        y0 = b * BY
        y1 = min(H, y0 + BY)
        z0 = zc * ZC
        z1 = min(D, z0 + ZC)
        sb = _voff(Lp, R_SRC, v)
        ob = _voff(Lp, R_OUT, v)
        ab = _voff(Lp, R_AUX, v)
        mb = _voff(Lp, R_MSK, v)
        sp = P[slot + b]
        ns = P[sp]
        z = z0
        while z < z1:
            # eight planes at once where a node has a regular run from z (else one plane)
            nz = 1
            if z + R <= z1:
                for a in range(NZN):
                    if P[P[zn + NODE_LEN * a + 2] + z] != 0:
                        nz = R
                        break
            # z-passes of the rows this block reads, into the slots of planes z .. z+nz-1
            for a in range(NZN):
                comp = P[zn + NODE_LEN * a]
                ip = P[zn + NODE_LEN * a + 1]
                flag = P[P[zn + NODE_LEN * a + 2] + z] if nz == R else 0
                if flag != 0:
                    e0 = P[ip + z]
                    ne = P[ip + z + 1] - e0
                    rr = flag - 2
                    wp = _ptr(Fa0 + (fent + e0 + rr) * isz, fz)
                    for s in range(ns):
                        base = sb + comp * sK + P[sp + 1 + s] * sH + P[epos + e0] * sD
                        if rr >= 1:  # symmetric: folded taps, 8 planes per step
                            for m in range(R + 2 * rr):
                                RW[m] = sa + (base + m * sD) * isz
                            zd = (a * SMAX + s) * ZS
                            for j in range(0, W, L):
                                _vblock(Z, zd + j, ZP, RW, rr, j, min(L, W - j), wp, rr, L, fz)
                        else:
                            _comb8(Z, (a * SMAX + s) * ZS, ZP, src, base, sD, F, fent + e0, ne, W, L)
                    continue
                for r in range(nz):
                    e0 = P[ip + z + r]
                    ne = P[ip + z + r + 1] - e0
                    for s in range(ns):
                        base = sb + comp * sK + P[sp + 1 + s] * sH
                        for e in range(ne):
                            OF[e] = base + P[epos + e0 + e] * sD
                        _comb(Z, r * ZP + (a * SMAX + s) * ZS, src, OF, F, fent + e0, ne, W, L)
            for r in range(nz):
                zz = z + r
                i = y0
                while i < y1:
                    ni = 1
                    if i + R <= y1:
                        for c in range(NYN):
                            if P[P[yn + NODE_LEN * c + 2] + i] != 0:
                                ni = R
                                break
                    # y-passes into padded rows
                    for c in range(NYN):
                        par = P[yn + NODE_LEN * c]
                        ip = P[yn + NODE_LEN * c + 1]
                        zb = r * ZP + par * SMAX * ZS
                        yb = c * R * RS + G
                        flag = P[P[yn + NODE_LEN * c + 2] + i] if ni == R else 0
                        if flag >= 3:  # symmetric
                            e0 = P[ip + i]
                            rr = flag - 2
                            wp = _ptr(Fa0 + (fent + e0 + rr) * isz, fz)
                            zr = zb + P[epos + e0] * ZS
                            for m in range(R + 2 * rr):
                                RW[m] = Za + (zr + m * ZS) * isz
                            for j in range(0, W, L):
                                _vblock(Y, yb + j, RS, RW, rr, j, min(L, W - j), wp, rr, L, fz)
                        elif flag != 0:
                            e0 = P[ip + i]
                            ne = P[ip + i + 1] - e0
                            _comb8(Y, yb, RS, Z, zb + P[epos + e0] * ZS, ZS, F, fent + e0, ne, W, L)
                        else:
                            for t in range(ni):
                                e0 = P[ip + i + t]
                                ne = P[ip + i + t + 1] - e0
                                for e in range(ne):
                                    OF[e] = zb + P[epos + e0 + e] * ZS
                                _comb(Y, yb + t * RS, Z, OF, F, fent + e0, ne, W, L)
                        for t in range(ni):
                            yr = yb + t * RS
                            for q in range(padl):
                                u = P[padt + q]
                                Y[yr - padl + q] = Y[yr + u] if u >= 0 else zero
                            for q in range(padr):
                                u = P[padt + padl + q]
                                Y[yr + W + q] = Y[yr + u] if u >= 0 else zero
                    for t in range(ni):
                        row = i + t
                        # x-passes, fix-ups, constant-mode corrections
                        orow = ob + zz * oD + row * oH
                        for k in range(K):
                            d = xn + ST_LEN * k
                            yb = (P[d] * R + t) * RS + G
                            x0 = P[d + 1]
                            nx = P[d + 2]
                            for e in range(nx):
                                OF[e] = yb + P[epos + x0 + e]
                            if epi == EPI_STACK:
                                dst = out
                                d0 = orow + k * oK
                            else:
                                dst = X
                                d0 = k * XS
                            xr = P[d + 7]
                            if xr >= 1:
                                _xsym(dst, d0, Y, yb + P[d + 8], W, _ptr(Fa0 + (fent + x0 + xr) * isz, fz), xr, L)
                            else:
                                _comb(dst, d0, Y, OF, F, fent + x0, nx, W, L)
                            fp = P[d + 4]
                            for f in range(P[d + 3]):
                                col = P[fp + 3 * f]
                                fe0 = P[fp + 3 * f + 1]
                                acc = zero
                                for e in range(P[fp + 3 * f + 2]):
                                    acc += F[fent + fe0 + e] * Y[yb + P[epos + fe0 + e]]
                                dst[d0 + col] = acc
                            if corr:
                                cp = P[d + 6]
                                for m in range(P[d + 5]):
                                    cz = cval * F[fcorr + P[cp + 3 * m] + zz] * F[fcorr + P[cp + 3 * m + 1] + row]
                                    tx = fcorr + P[cp + 3 * m + 2]
                                    for j in range(W):
                                        dst[d0 + j] += cz * F[tx + j]
                        if epi >= EPI_BLEND:
                            inrow = bz0 <= zz < bz1 and by0 <= row < by1
                            _select_row(epi, inrow, bx0, bx1, out, orow, X, aux, ab + zz * aD + row * aH, msk,
                                        mb + zz * mD + row * mH, tv, W, L)
                        elif epi != EPI_STACK:
                            _epilogue(epi, out, orow, oK, X, XS, aux, ab + zz * aD + row * aH, K, W, F, L)
                    i += ni
            z += nz
    # (numba frees an array after its last use: every buffer read through a raw pointer is
    # used here, the compute-dtype weights ``Fc`` included)
    return zbuf.size + ybuf.size + xbuf.size + obuf.size + rbuf.size + Fc.size + Ta.size


@njit(**_JIT)
def _k_gsel(ga, ma, oa, Ta, fz, Ba, La, it0, it1):
    """``out = g`` where ``sel`` (``M >= Ta[0]`` inside the box ``Ba[3:9]``), else 0: the masked
    gradient of the blend variant's backward.  Work items: planes ``(volume, z)``; ``Ba[:3]`` is
    ``(D, H, W)``.  Roles in ``La``: ``R_SRC`` (g), ``R_OUT``, ``R_MSK``."""
    g = _ptr(ga, fz)
    M = _ptr(ma, fz)
    out = _ptr(oa, fz)
    Lp = _ptr(La.ctypes.data, La[0])
    tv = _vsplat(_ptr(Ta.ctypes.data, fz), 0)
    L = _VL(fz)
    D, H, W = Ba[0], Ba[1], Ba[2]
    sD, sH = Lp[R_SRC + 4], Lp[R_SRC + 5]
    oD, oH = Lp[R_OUT + 4], Lp[R_OUT + 5]
    mD, mH = Lp[R_MSK + 4], Lp[R_MSK + 5]
    zv = _vmul(_vnz(g), _vnz(g))
    zero = _ptr(Ta.ctypes.data, fz)[1]
    for it in range(it0, it1):
        v = it // D
        z = it % D
        gb = _voff(Lp, R_SRC, v) + z * sD
        ob = _voff(Lp, R_OUT, v) + z * oD
        mb = _voff(Lp, R_MSK, v) + z * mD
        for i in range(H):
            inrow = Ba[3] <= z < Ba[4] and Ba[5] <= i < Ba[6]
            x0 = Ba[7] if inrow else W  # the selection may hold in columns x0 .. x1
            x1 = Ba[8] if inrow else W
            orow = ob + i * oH
            grow = gb + i * sH
            mrow = mb + i * mH
            j = 0
            while j < W:
                n = min(L, W - j)
                if j + n <= x0 or j >= x1:
                    _stv(out, orow + j, zv, n, L)
                else:
                    _stv(out, orow + j, _vselge(_ldv(M, mrow + j, n, L), tv, _ldv(g, grow + j, n, L), zv), n, L)
                    if j < x0 or j + n > x1:  # a vector across the box's edge
                        for q in range(j, j + n):
                            if q < x0 or q >= x1:
                                out[orow + q] = zero
                j += L
    return Ta.size + Ba.size


# ----------------------------------------------------------------------------
# host side

def _cd(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _vol(t, ndim, k=False):
    """``t`` (``(..., [K,] *spatial)``, ``ndim`` spatial axes) as ``(..., [K,] D, H, W)``."""
    for _ in range(3 - ndim):
        t = t.unsqueeze(-ndim - 1)
    return t


def _role(t, k):
    """``[n1, s0, s1, sK, sD, sH]`` of a volume tensor ``(..., [K,] D, H, W)`` with rows of unit
    stride, or None."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return None
    nd = 4 if k else 3
    lead = collapse_planes(t.shape[:-nd], t.stride()[:-nd])
    if lead is None:
        return None
    st = t.stride()
    return [lead[0], lead[1], lead[2], st[-4] if k else 0, st[-3], st[-2]]


def _source(t, cd, k=False):
    """``t`` as the kernel reads it: compute dtype, unit-stride rows, collapsible lead dims."""
    if t.dtype != cd:
        t = t.to(cd)
    r = _role(t, k)
    if r is None:
        t = t.contiguous()
        r = _role(t, k)
    return t, r


def _target(out, shape, cd, k):
    """(tensor the kernel writes, its role, whether it is a temporary to copy into ``out``)."""
    if out is not None and out.dtype == cd:
        r = _role(out, k)
        if r is not None:
            return out, r, False
    o = _alloc(shape, cd) if out is None else torch.empty(shape, dtype=cd)
    return o, _role(o, k), out is not None


_NONE = [1, 0, 0, 0, 0, 0]


def _thr(thr, cd):
    return np.asarray([thr, 0.0], np.float64 if cd == torch.float64 else np.float32)


def _run(vp, nv, s, rs, o, ro, a=None, ra=None, m=None, rm=None, thr=0.0):
    L = np.asarray(rs + ro + (ra or _NONE) + (rm or _NONE) + [nv], np.int64)
    carrier = np.float64(0) if s.dtype == torch.float64 else np.float32(0)
    D, H, W = s.shape[-3:]
    _launch(_k_vol, (s.data_ptr(), o.data_ptr(), 0 if a is None else a.data_ptr(), 0 if m is None else m.data_ptr(),
                     _thr(thr, s.dtype), carrier, vp.P, vp.F, L),
            vp.nitems, _threads(), _small(nv * D, H, W))


def runs(spec) -> bool:
    """Does this engine run ``spec`` (the others go to ``reference``)?"""
    return supported(spec)


def _nvol(shape, k=False):
    return int(np.prod(shape[:-4 if k else -3])) if len(shape) > (4 if k else 3) else 1


def filter_forward(x, spec: FilterSpec, out=None):
    if not isinstance(spec, FilterSpec) or x.numel() == 0:
        return reference.filter_forward(x, spec, out)
    spec = lower(spec, x.shape)
    if not supported(spec):
        return reference.filter_forward(x, spec, out)
    cd = _cd(x.dtype)
    nd = spec.ndim
    K = len(spec.stencils)
    comps = spec.epilogue == "stack" and K > 1
    oshape = spec.out_shape(x.shape)
    s, rs = _source(_vol(x, nd), cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    vp = plan(spec, sizes, False, nv, _threads(), 8 if cd == torch.float64 else 4)
    o3shape = s.shape[:-3] + ((K,) if comps else ()) + sizes
    if out is None and x.dtype != cd:
        tmp = torch.empty(o3shape, dtype=cd)
        _run(vp, nv, s, rs, tmp, _role(tmp, comps))
        return tmp.to(x.dtype).view(oshape)
    o, ro, copy = _target(None if out is None else _vol(out, nd), o3shape, cd, comps)
    _run(vp, nv, s, rs, o, ro)
    if out is None:
        return o.view(oshape)
    if copy:
        _vol(out, nd).copy_(o)
    return out


def filter_backward(grad, x, spec: FilterSpec, out=None):
    if not isinstance(spec, FilterSpec) or x.numel() == 0:
        return reference.filter_backward(grad, x, spec, out)
    spec = lower(spec, x.shape)
    if not supported(spec):
        return reference.filter_backward(grad, x, spec, out)
    cd = _cd(x.dtype)
    nd = spec.ndim
    K = len(spec.stencils)
    isz = 8 if cd == torch.float64 else 4
    nt = _threads()
    x3 = _vol(x, nd)
    sizes = tuple(x3.shape[-3:])
    lead = x3.shape[:-3]
    nv = _nvol(x3.shape)
    comps = spec.epilogue == "stack" and K > 1
    if spec.epilogue == "magnitude":
        # phase 1: g * y_k / |y| into K temporaries (forward passes); phase 2: their transposes
        s, rs = _source(x3, cd)
        g, rg = _source(_vol(grad.expand(spec.out_shape(x.shape)), nd), cd)
        tmp = _alloc(lead + (K,) + sizes, cd)  # (the output cache: no page faults once warm)
        vp = plan(spec, sizes, False, nv, nt, isz, magscale=True)
        _run(vp, nv, s, rs, tmp, _role(tmp, True), g, rg)
        src, rsrc = tmp, _role(tmp, True)
        bspec = spec._replace(epilogue="stack")  # each stencil reads its own component
    else:
        src, rsrc = _source(_vol(grad.expand(spec.out_shape(x.shape)), nd), cd, comps)
        bspec = spec
    vb = plan(bspec, sizes, True, nv, nt, isz)
    if out is None and x.dtype != cd:
        o = torch.empty(lead + sizes, dtype=cd)
        _run(vb, nv, src, rsrc, o, _role(o, False))
        return o.to(x.dtype).view(x.shape)
    o, ro, copy = _target(None if out is None else _vol(out, nd), lead + sizes, cd, False)
    _run(vb, nv, src, rsrc, o, ro)
    if out is None:
        return o.view(x.shape)
    if copy:
        _vol(out, nd).copy_(o)
    return out


def _blur_linear(spec):
    """The linear part of a :class:`BlurSpec` as a one-stencil :class:`FilterSpec` (its ``cval``;
    ``normalized`` blurs use 0: outside the image nothing is masked), or None where this engine
    does not run it."""
    fs = FilterSpec(spec.mode, 0.0 if spec.normalized else spec.cval, "stack", (spec.stencil,), spec.ndim)
    return fs if supported(fs) else None


def _finish(y, dtype, out):
    if out is None:
        return y.to(dtype)
    out.copy_(y)
    return out


def _threshold(x, threshold):
    """``x >= threshold`` as torch compares a tensor with a Python float: the threshold rounded to
    the input's dtype (then exact in the kernel's compute dtype)."""
    dt = x.dtype
    if dt == torch.float64:
        return float(threshold)
    return float(torch.tensor(threshold, dtype=dt))


def _selection(x, s, rs, mask, threshold, nd, cd):
    """``(M, role, thr)`` with ``sel = M >= thr``: the input itself (``s``), or the mask as 0/1."""
    if mask is None:
        return s, rs, _threshold(x, threshold)
    m = mask.to(device=x.device, dtype=torch.bool).expand(x.shape).to(cd)
    m, rm = _source(_vol(m, nd), cd)
    return m, rm, 0.5


def _box(spec, sizes):
    """Where a selective blur may write: everywhere, or (``keep_border``) where the stencil's
    footprint stays inside the volume (``reference.border_mask``)."""
    if not spec.keep_border:
        return None
    nd = spec.ndim
    box = []
    for a, n in zip((-3, -2, -1), sizes):
        lo, hi = spec.stencil.extent(a) if a >= -nd else (0, 0)
        box += [min(n, max(0, -lo)), max(0, min(n, n - hi))]
    return tuple(box)


def _blend_forward(x, mask, spec, fs, threshold, out):
    cd = _cd(x.dtype)
    nd = spec.ndim
    x3 = _vol(x, nd)
    s, rs = _source(x3, cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    M, rm, thr = _selection(x, s, rs, mask, threshold, nd, cd)
    vp = plan(fs, sizes, False, nv, _threads(), 8 if cd == torch.float64 else 4, epi=EPI_BLEND, box=_box(spec, sizes))
    if out is None and x.dtype != cd:
        tmp = torch.empty(s.shape, dtype=cd)
        _run(vp, nv, s, rs, tmp, _role(tmp, False), s, rs, M, rm, thr)
        return tmp.to(x.dtype).view(x.shape)
    o, ro, copy = _target(None if out is None else _vol(out, nd), s.shape, cd, False)
    _run(vp, nv, s, rs, o, ro, s, rs, M, rm, thr)
    if out is None:
        return o.view(x.shape)
    if copy:
        _vol(out, nd).copy_(o)
    return out


def _blend_backward(grad, x, mask, spec, fs, threshold, out):
    """``blurT(w * g) + (1 - w) * g``: the masked gradient (``_k_gsel``), then the transposed
    passes with the ``addrest`` epilogue."""
    cd = _cd(x.dtype)
    nd = spec.ndim
    isz = 8 if cd == torch.float64 else 4
    x3 = _vol(x, nd)
    s, rs = _source(x3, cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    M, rm, thr = _selection(x, s, rs, mask, threshold, nd, cd)
    g, rg = _source(_vol(grad.expand(x.shape), nd), cd)
    box = _box(spec, sizes)
    gm = _alloc(s.shape, cd)
    rgm = _role(gm, False)
    D, H, W = sizes
    Ba = np.asarray((D, H, W) + (box or (0, D, 0, H, 0, W)), np.int64)
    carrier = np.float64(0) if cd == torch.float64 else np.float32(0)
    L = np.asarray(rg + rgm + _NONE + rm + [nv], np.int64)
    _launch(_k_gsel, (g.data_ptr(), M.data_ptr(), gm.data_ptr(), _thr(thr, cd), carrier, Ba, L), nv * D, _threads(),
            _small(nv * D, H, W))
    vb = plan(fs, sizes, True, nv, _threads(), isz, epi=EPI_ADDREST, box=box)
    if out is None and x.dtype != cd:
        o = torch.empty(s.shape, dtype=cd)
        _run(vb, nv, gm, rgm, o, _role(o, False), g, rg, M, rm, thr)
        return o.to(x.dtype).view(x.shape)
    o, ro, copy = _target(None if out is None else _vol(out, nd), s.shape, cd, False)
    _run(vb, nv, gm, rgm, o, ro, g, rg, M, rm, thr)
    if out is None:
        return o.view(x.shape)
    if copy:
        _vol(out, nd).copy_(o)
    return out


def blur_forward(x, mask, spec, threshold, out=None):
    """Selective blur.  The blend variant runs fused (one pass: blur, select, store); the
    normalized one runs its two blurs here and the masked mean in torch (the reference engine's
    formulas)."""
    if not isinstance(spec, BlurSpec) or x.numel() == 0:
        return reference.blur_forward(x, mask, spec, threshold, out)
    spec = lower(spec, x.shape)
    fs = _blur_linear(spec)
    if fs is None:
        return reference.blur_forward(x, mask, spec, threshold, out)
    if not spec.normalized:
        return _blend_forward(x, mask, spec, fs, threshold, out)
    m, w = reference.blur_masks(x, reference._selected(x, mask, threshold), spec, threshold)
    xc = x.to(_cd(x.dtype))
    mf = m.to(xc.dtype).expand(x.shape)
    num = filter_forward(torch.where(m, xc, torch.zeros((), dtype=xc.dtype)), fs)
    den = filter_forward(mf, fs)
    use = w & (den > 0)
    return _finish(torch.where(use, num / torch.where(use, den, torch.ones_like(den)), xc), x.dtype, out)


def blur_backward(grad, x, mask, spec, threshold, out=None):
    if not isinstance(spec, BlurSpec) or x.numel() == 0:
        return reference.blur_backward(grad, x, mask, spec, threshold, out)
    spec = lower(spec, x.shape)
    fs = _blur_linear(spec)
    if fs is None:
        return reference.blur_backward(grad, x, mask, spec, threshold, out)
    if not spec.normalized:
        return _blend_backward(grad, x, mask, spec, fs, threshold, out)
    m, w = reference.blur_masks(x, reference._selected(x, mask, threshold), spec, threshold)
    cd = _cd(x.dtype)
    xc = x.to(cd)
    g = grad.to(cd).expand(x.shape)
    zero = torch.zeros((), dtype=cd)
    mf = m.to(cd).expand(x.shape)
    den = filter_forward(mf, fs)
    use = w & (den > 0)
    gd = torch.where(use, g / torch.where(use, den, torch.ones_like(den)), zero)
    return _finish(mf * filter_backward(gd, xc, fs) + torch.where(use, zero, g), x.dtype, out)
