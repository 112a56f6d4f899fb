"""Kernels of the volume engine (``volume``): one kernel runs every volume plan
(``volume_plan``), one more makes the blend variant's masked gradient.

Every pass is one routine over whole rows: :func:`_comb` (a row as a weighted sum of rows, eight
vectors of accumulators), :func:`_comb8` (eight regular rows at once, their source rows sliding
through registers), and for symmetric and antisymmetric taps, in SciPy's order (the centre
tap, then the pairs from the outermost in, no fused multiply-add) on every row:
``separable._vblock`` / ``_vblock_anti`` (eight rows), :func:`_vrow` (one row, either kind:
the border rows, on their folded row addresses, and the rows outside a run of eight),
:func:`_xsym` (``separable._hpair``: the x-pass with the left windows as shuffles; an
antisymmetric x-pass is :func:`_vrow` on shifted addresses).  A value is then the same
whatever the blocking (a dask chunk's block, too).  Epilogues:
``stack`` (stored straight from the x-pass), ``sum``, ``magnitude``, ``magscale`` (the
magnitude's backward scale ``g / |y|``, 0 where ``|y| = 0``), ``blend`` and ``addrest``
(selective blur forward / backward).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils
from numba.extending import intrinsic

from .adjoint import _mag_vjp_fix
from .forward import _mag_fix
from .prims import _JIT, _cvt, _ptr
from .separable import _VL, _hpair, _ldv, _st8, _stv, _vblock, _vblock_anti
from .simd import _vadd, _vfma, _vld, _vldm, _vmagbad, _vmagodd, _vmaxabs, _vmul, _vnz, _vsplat, _vst, _vstm, _vwts
from .volume_plan import (
    EPI_BLEND, EPI_MAG, EPI_MAGSCALE, EPI_NORM, EPI_NORMT, EPI_STACK, ST_LEN, V_BOX, V_BY, V_CORR, V_D, V_EPI, V_EPOS, V_FCORR, V_FENT, V_G, V_H,
    V_K, V_MAXE, V_NBY, V_NYN, V_NZC, V_NZN, V_PADL, V_PADR, V_PADT, V_RS, V_SLOT, V_SMAX, V_W, V_XN, V_XS, V_YN,
    V_ZC, V_ZN, V_ZP, V_ZS, V_RMAX, NODE_LEN, R,
)

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


@intrinsic
def _vselgegt(typingctx, v, t, d, u, a, b):
    """Lane-wise ``a if (v >= t and d > u) else b`` (ordered: NaNs select ``b``)."""

    def codegen(context, builder, sig, args):
        vv, tv, dv, uv, av, bv = args
        c = builder.and_(builder.fcmp_ordered(">=", vv, tv), builder.fcmp_ordered(">", dv, uv))
        return builder.select(c, av, bv)

    return a(v, t, d, u, a, b), codegen


@intrinsic
def _vdiv(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fdiv(args[0], args[1])

    return a(a, b), codegen


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
        _st8(dst, d0 + j, dstride, a0, a1, a2, a3, a4, a5, a6, a7, m, L)


@njit(**_JIT)
def _vrow(V, v0, rows, m0, n, w, r, L, fz, sg):
    """One output row of an (anti)symmetric pass, ``n`` columns, in ``separable._vblock``'s
    arithmetic (SciPy's order, no fused multiply-add): ``V[v0 + j] = w[0]*x[m0] + sum_k
    pair(x[m0 - k], x[m0 + k]) * w[k]``, ``k = r .. 1``, ``x[m]`` column ``j`` of the row at
    address ``rows[m]``; the pair is ``(x[m0 - k] + x[m0 + k] * sg) * (w[k] * sg)``, ``sg`` a
    vector of -1 (antisymmetric) or 1: ``separable._panti`` / ``_psym`` bit for bit, signs of
    zero included (a product by +-1 is exact).  For the rows outside a run of eight (the border
    rows, the tails), so that a value does not depend on the blocking; also the antisymmetric
    x-pass (``rows[m]``: the row's address shifted by ``m - m0`` elements).  Four vectors per
    step, then one."""
    w0 = _vsplat(w, 0)
    j = 0
    while j + 4 * L <= n:
        c = _ptr(rows[m0], fz)
        a0 = _vmul(w0, _vld(c, j))
        a1 = _vmul(w0, _vld(c, j + L))
        a2 = _vmul(w0, _vld(c, j + 2 * L))
        a3 = _vmul(w0, _vld(c, j + 3 * L))
        for k in range(r, 0, -1):
            lo = _ptr(rows[m0 - k], fz)
            hi = _ptr(rows[m0 + k], fz)
            wk = _vmul(_vsplat(w, k), sg)
            a0 = _vadd(a0, _vmul(_vadd(_vld(lo, j), _vmul(_vld(hi, j), sg)), wk))
            a1 = _vadd(a1, _vmul(_vadd(_vld(lo, j + L), _vmul(_vld(hi, j + L), sg)), wk))
            a2 = _vadd(a2, _vmul(_vadd(_vld(lo, j + 2 * L), _vmul(_vld(hi, j + 2 * L), sg)), wk))
            a3 = _vadd(a3, _vmul(_vadd(_vld(lo, j + 3 * L), _vmul(_vld(hi, j + 3 * L), sg)), wk))
        _vst(V, v0 + j, a0)
        _vst(V, v0 + j + L, a1)
        _vst(V, v0 + j + 2 * L, a2)
        _vst(V, v0 + j + 3 * L, a3)
        j += 4 * L
    while j < n:
        m = min(L, n - j)
        a = _vmul(w0, _ldv(_ptr(rows[m0], fz), j, m, L))
        for k in range(r, 0, -1):
            lo = _ldv(_ptr(rows[m0 - k], fz), j, m, L)
            hi = _ldv(_ptr(rows[m0 + k], fz), j, m, L)
            a = _vadd(a, _vmul(_vadd(lo, _vmul(hi, sg)), _vmul(_vsplat(w, k), sg)))
        _stv(V, v0 + j, a, m, L)
        j += L


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
def _pair_row(V, v0, RW, P, ep, ne, rad, a0, step, zra, wa, SG, W, L, fz):
    """A border (or single) row of an (anti)symmetric pass (``rad``: ``volume_plan._pair_radius``):
    the addresses ``RW`` of its ``ne = 2r + 1`` source rows (entry ``e``: row ``P[ep + e]`` at
    ``a0 + row*step`` bytes, or the zero row ``zra`` for source -1), then :func:`_vrow` with the
    weights at address ``wa`` (the centre tap)."""
    for e in range(ne):
        q = P[ep + e]
        RW[e] = a0 + q * step if q >= 0 else zra
    r = abs(rad)
    _vrow(V, v0, RW, r, W, _ptr(wa, fz), r, L, fz, _vsplat(SG, 1 if rad < 0 else 0))


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
def _nseg(epi, inside, out, o0, oK, X, XS, aux, a0, M, m0, tv, ov, j0, j1, L):
    """Columns ``j0 .. j1`` of a normalized-blur row (``inside``: in the box, where ``w`` may
    hold; ``X``: the blurs; ``aux``: ``x`` (``norm``), ``g`` (``gdiv``), ``rest`` (``normt``))."""
    z = _vmul(_vnz(X), _vnz(X))
    j = j0
    while j < j1:
        n = min(L, j1 - j)
        av = _ldv(aux, a0 + j, n, L)
        if epi == EPI_NORMT:  # m * blurT(gd) + rest (m: no box)
            mf = _vselge(_ldv(M, m0 + j, n, L), tv, ov, z)
            _stv(out, o0 + j, _vadd(_vmul(mf, _vld(X, j)), av), n, L)
        elif epi == EPI_NORM:
            if inside:
                num = _vld(X, j)
                den = _vld(X, XS + j)
                v = _vselgegt(_ldv(M, m0 + j, n, L), tv, den, z, _vdiv(num, den), av)
            else:
                v = av
            _stv(out, o0 + j, v, n, L)
        else:  # gdiv: [use ? g / den : 0, use ? 0 : g]
            den = _vld(X, j)
            if inside:
                mv = _ldv(M, m0 + j, n, L)
                _stv(out, o0 + j, _vselgegt(mv, tv, den, z, _vdiv(av, den), z), n, L)
                _stv(out, o0 + oK + j, _vselgegt(mv, tv, den, z, z, av), n, L)
            else:
                _stv(out, o0 + j, z, n, L)
                _stv(out, o0 + oK + j, av, n, L)
        j += L


@njit(**_JIT)
def _norm_row(epi, inrow, bx0, bx1, out, o0, oK, X, XS, aux, a0, M, m0, tv, ov, W, L):
    """One output row of the normalized blur's epilogues (the box: as ``_select_row``)."""
    if epi == EPI_NORMT or (inrow and bx0 == 0 and bx1 == W):
        _nseg(epi, True, out, o0, oK, X, XS, aux, a0, M, m0, tv, ov, 0, W, L)
        return
    if not inrow or bx0 >= bx1:
        _nseg(epi, False, out, o0, oK, X, XS, aux, a0, M, m0, tv, ov, 0, W, L)
        return
    if bx0 > 0:
        _nseg(epi, False, out, o0, oK, X, XS, aux, a0, M, m0, tv, ov, 0, bx0, L)
    _nseg(epi, True, out, o0, oK, X, XS, aux, a0, M, m0, tv, ov, bx0, bx1, L)
    if bx1 < W:
        _nseg(epi, False, out, o0, oK, X, XS, aux, a0, M, m0, tv, ov, bx1, W, L)


@njit(inline="always", **_JIT)
def _kbad(X, XS, K, j, s):
    """Whether a lane of the sum of squares ``s`` of the ``K`` rows ``X[k*XS + j ..]`` needs the
    rescaled magnitude (``simd._vmagbad``; the cheap ``_vmagodd`` test first)."""
    if not _vmagodd(s):
        return False
    m = _vnz(X)
    for k in range(K):
        m = _vmaxabs(m, _vld(X, k * XS + j))
    return _vmagbad(s, m)


@njit(**_JIT)
def _epilogue(epi, out, o0, oK, X, XS, aux, a0, K, W, F, L):
    """Combine the ``K`` stencil rows ``X[k*XS ..]`` of one output row (``sum``, ``magnitude``,
    ``magscale``: ``out[k] = g * X[k] / |X|``, 0 where ``|X| = 0``).  The magnitude and its scale
    are rescaled as ``hypot`` where the sum of squares over- or underflows (the rare lanes again,
    one by one: ``forward._mag_fix``, ``adjoint._mag_vjp_fix``)."""
    j = 0
    if epi == EPI_MAGSCALE:
        while j < W:
            n = min(L, W - j)
            a = _vld(X, j)
            s = _vmul(a, a)
            for k in range(1, K):  # (no fused multiply-add: the rescaling test sees this sum)
                b = _vld(X, k * XS + j)
                s = _vadd(s, _vmul(b, b))
            sc = _vscale(_ldv(aux, a0 + j, n, L), _vsqrt(s))
            for k in range(K):
                _stv(out, o0 + k * oK + j, _vmul(sc, _vld(X, k * XS + j)), n, L)
            if _kbad(X, XS, K, j, s):
                _mag_vjp_fix(X, j, XS, out, o0 + j, oK, K, n, aux, a0 + j, 1)
            j += L
        return
    while j < W:
        n = min(L, W - j)
        a = _vld(X, j)
        if epi == EPI_MAG:
            s = _vmul(a, a)
            for k in range(1, K):  # (the reference's sum, as the rescaling test recomputes it)
                b = _vld(X, k * XS + j)
                s = _vadd(s, _vmul(b, b))
            a = _vsqrt(s)
        else:
            for k in range(1, K):
                a = _vadd(a, _vld(X, k * XS + j))
        if n == L:
            _vst(out, o0 + j, a)
        else:
            _vstm(out, o0 + j, a, n)
        if epi == EPI_MAG and _kbad(X, XS, K, j, s):
            _mag_fix(out, o0 + j, 1, X, j, XS, K, n)
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
    ov = _vsplat(_ptr(Ta.ctypes.data, fz), 2)
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
    Ya = (ybuf.ctypes.data + 63) // 64 * 64
    Y = _ptr(Ya, fz)
    rbuf = np.empty(R + 2 * P[V_RMAX] + 2, np.int64)
    RW = _ptr(rbuf.ctypes.data, rbuf[0])
    xbuf = np.zeros(K * XS + L, Fc.dtype)
    X = _ptr(xbuf.ctypes.data, fz)
    obuf = np.empty(P[V_MAXE] + 1, np.int64)
    zrow = np.zeros(W + 2 * L, Fc.dtype)  # what a symmetric pass reads for a constant-mode tap outside
    zra = zrow.ctypes.data
    sgn = np.array([1.0, -1.0], Fc.dtype)  # a border row's pair sign (_vrow)
    SG = _ptr(sgn.ctypes.data, fz)
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
                    rad = P[zn + NODE_LEN * a + 3]
                    rr = abs(rad)
                    wp = _ptr(Fa0 + (fent + e0 + rr) * isz, fz)
                    for s in range(ns):
                        base = sb + comp * sK + P[sp + 1 + s] * sH + P[epos + e0] * sD
                        if rr >= 1:  # (anti)symmetric: folded taps, 8 planes per step
                            for m in range(R + 2 * rr):
                                RW[m] = sa + (base + m * sD) * isz
                            zd = (a * SMAX + s) * ZS
                            for j in range(0, W, L):
                                if rad > 0:
                                    _vblock(Z, zd + j, ZP, RW, rr, j, min(L, W - j), wp, rr, L, fz, R)
                                else:
                                    _vblock_anti(Z, zd + j, ZP, RW, rr, j, min(L, W - j), wp, rr, L, fz, R)
                        else:
                            _comb8(Z, (a * SMAX + s) * ZS, ZP, src, base, sD, F, fent + e0, ne, W, L)
                    continue
                rad = P[zn + NODE_LEN * a + 3]
                for r in range(nz):
                    e0 = P[ip + z + r]
                    ne = P[ip + z + r + 1] - e0
                    for s in range(ns):
                        base = sb + comp * sK + P[sp + 1 + s] * sH
                        zd = r * ZP + (a * SMAX + s) * ZS
                        if rad != 0:  # (anti)symmetric: as the runs sum it, on the folded rows
                            _pair_row(Z, zd, RW, P, epos + e0, ne, rad, sa + base * isz, sD * isz, zra,
                                      Fa0 + (fent + e0 + abs(rad)) * isz, SG, W, L, fz)
                            continue
                        for e in range(ne):
                            OF[e] = base + P[epos + e0 + e] * sD
                        _comb(Z, zd, src, OF, F, fent + e0, ne, W, L)
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
                        rad = P[yn + NODE_LEN * c + 3]
                        if flag != 0 and rad != 0:  # (anti)symmetric
                            e0 = P[ip + i]
                            rr = abs(rad)
                            wp = _ptr(Fa0 + (fent + e0 + rr) * isz, fz)
                            zr = zb + P[epos + e0] * ZS
                            for m in range(R + 2 * rr):
                                RW[m] = Za + (zr + m * ZS) * isz
                            for j in range(0, W, L):
                                if rad > 0:
                                    _vblock(Y, yb + j, RS, RW, rr, j, min(L, W - j), wp, rr, L, fz, R)
                                else:
                                    _vblock_anti(Y, yb + j, RS, RW, rr, j, min(L, W - j), wp, rr, L, fz, R)
                        elif flag != 0:
                            e0 = P[ip + i]
                            ne = P[ip + i + 1] - e0
                            _comb8(Y, yb, RS, Z, zb + P[epos + e0] * ZS, ZS, F, fent + e0, ne, W, L)
                        else:
                            for t in range(ni):
                                e0 = P[ip + i + t]
                                ne = P[ip + i + t + 1] - e0
                                if rad != 0:  # (anti)symmetric: as the runs sum it, on the folded rows
                                    _pair_row(Y, yb + t * RS, RW, P, epos + e0, ne, rad, Za + zb * isz, ZS * isz, zra,
                                              Fa0 + (fent + e0 + abs(rad)) * isz, SG, W, L, fz)
                                    continue
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
                            elif xr <= -1:  # antisymmetric: _vrow on the addresses of the shifted row
                                for m in range(1 - 2 * xr):
                                    RW[m] = Ya + (yb + P[d + 8] + xr + m) * isz
                                _vrow(dst, d0, RW, -xr, W, _ptr(Fa0 + (fent + x0 - xr) * isz, fz), -xr, L, fz,
                                      _vsplat(SG, 1))
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
                        if epi >= EPI_NORM:
                            inrow = bz0 <= zz < bz1 and by0 <= row < by1
                            _norm_row(epi, inrow, bx0, bx1, out, orow, oK, X, XS, aux, ab + zz * aD + row * aH, msk,
                                      mb + zz * mD + row * mH, tv, ov, W, L)
                        elif epi >= EPI_BLEND:
                            inrow = bz0 <= zz < bz1 and by0 <= row < by1
                            _select_row(epi, inrow, bx0, bx1, out, orow, X, aux, ab + zz * aD + row * aH, msk,
                                        mb + zz * mD + row * mH, tv, W, L)
                        elif epi != EPI_STACK:
                            _epilogue(epi, out, orow, oK, X, XS, aux, ab + zz * aD + row * aH, K, W, F, L)
                    i += ni
            z += nz
    # (numba frees an array after its last use: every buffer read through a raw pointer is
    # used here, the compute-dtype weights ``Fc`` included)
    return zbuf.size + ybuf.size + xbuf.size + obuf.size + rbuf.size + zrow.size + sgn.size + Fc.size + Ta.size


@njit(**_JIT)
def _k_gsel(ga, ma, oa, Ta, fz, Ba, La, it0, it1):
    """``out = g`` where ``sel`` (``M >= Ta[0]`` inside the box ``Ba[3:9]``), else 0: the masked
    gradient of the blend variant's backward (``Ba[9]``: 1 instead of ``g``, the mask as 0/1).  Work items: planes ``(volume, z)``; ``Ba[:3]`` is
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
    ov = _vsplat(_ptr(Ta.ctypes.data, fz), 2)
    ones = Ba[9] != 0  # out = sel ? 1 : 0 (the mask as 0/1) instead of sel ? g : 0
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
                    gv = ov if ones else _ldv(g, grow + j, n, L)
                    _stv(out, orow + j, _vselge(_ldv(M, mrow + j, n, L), tv, gv, zv), n, L)
                    if j < x0 or j + n > x1:  # a vector across the box's edge
                        for q in range(j, j + n):
                            if q < x0 or q >= x1:
                                out[orow + q] = zero
                j += L
    return Ta.size + Ba.size
