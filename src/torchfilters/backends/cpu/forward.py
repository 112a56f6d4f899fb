"""The tiled forward engine: one generic kernel per epilogue runs every spec.

Per work item (a few small planes stacked, one plane, or a block of rows --
and, for wide images, a column strip -- of a plane):

* **Tile.**  The input rows the item needs (its rows plus the stencils'
  halo) are gathered into a thread-local, cache-resident tile in the compute
  dtype (float32, or float64 for float64), the boundary mode applied by
  *index folding* through precomputed per-axis tables
  (``reference.fold_indices``; ``constant`` fills ``cval``).  This is where
  float16 / bfloat16 are converted, a tile at a time (integer bit
  conversions, exact): never a full-size copy.  Strided inputs (slices,
  channels_last, stride-0 expanded tensors) are read in place; only leading
  dimensions that do not collapse to two strides are copied (once).
* **Stencils.**  The tile is flat, so a tap at offset ``(dy, dx)`` is a
  constant flat offset and every stencil is a few long, branch-free,
  vectorised ``dst[q] += w * src[q + o]`` loops (up to four taps per loop)
  over the whole tile: no folding in the compute loops.  Two layouts: *flat*
  (row stride W; the few border columns whose taps cross the left/right edge
  are recomputed through the fold table) for kernels narrow against the
  image, and *padded* (row stride W + kernel width, columns folded into the
  tile) otherwise.  ``sep`` stencils run their passes in the spec's order,
  each summed in SciPy's order (:func:`_spass`: the centre tap, then the
  pairs ``(x[-j] +- x[j]) * w`` of an (anti)symmetric pass from the outermost
  in; ``_lowering.pass_kind``), so that float64 results are SciPy's bits,
  signs of zero included; SciPy's sequential ``constant``-mode semantics (the second pass pads
  the first pass's result with ``cval``) are restored exactly by a
  precomputed per-row/per-column correction.  ``dense`` stencils run as one
  phase.
* **Epilogue.**  ``stack`` / ``magnitude`` / ``direction`` / selective-blur
  ``blend`` / ``normalized`` combine the stencil results pointwise and store
  the output (converted back to the input dtype) once.  The magnitude is
  rescaled where its sum of squares over- or underflows (a flag reduced in the
  vectorised loop; :func:`_mag_fix` redoes the segment, rare).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .prims import _JIT, _cvt, _expo, _expo_all, _hyp2, _ld, _line, _mag_flag, _prefetch_r, _prefetch_w, _ptr, _st
from .tables import (
    EPI_DIR, EPI_MAG, EPI_NORM, EPI_STACK, EPI_SUM, F_CVAL, F_ONE, F_TAPS, F_THR, F_ZERO, I_BI0, I_BI1, I_BJ0, I_BJ1,
    I_BR, I_CW, I_EPI, I_EXHI, I_EXLO, I_EYHI, I_EYLO, I_FH, I_FW, I_H, I_K, I_KEEPB, I_MP, I_NB, I_NC, I_PAD,
    I_ST, I_TAPI, I_W, L_N, R_M, R_O, R_X, ST_LEN, ST_NPH, _poff,
)

# =============================================================================
# the vector primitive: dst[d0 + q] (+)= sum_t w_t * src[s0 + q + o_t], q < n


@njit(**_JIT)
def _pass(d, d0, s, s0, n, P, Fc, t0, nt, sy, cy, sx, cx, W, acc):
    """Taps ``t0 .. t0+nt`` at flat offsets ``o = (sy*dy + cy)*W + sx*dx + cx``, four per loop,
    summed one after another in tap order (SciPy's ``NI_Correlate``: ``0.0 + w_0 x_0 + w_1 x_1
    + ...``, so a dense stencil's float64 result is SciPy's, and the same at every position:
    :func:`_fixcol` sums the border columns in that order too); the first loop assigns unless
    ``acc``."""
    if nt == 0:
        if not acc:
            z = Fc[F_ZERO]
            for q in range(n):
                d[d0 + q] = z
        return
    ti = P[I_TAPI]
    z = Fc[F_ZERO]  # SciPy's sum starts at +0.0 (only a zero's sign can differ from w0 * x)
    t = 0
    while t < nt:
        g = nt - t
        if g > 4:
            g = 4
        k = t0 + t
        a0 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
        w0 = Fc[F_TAPS + k]
        if g == 1:
            for q in range(n):
                d[d0 + q] = (d[d0 + q] if acc else z) + w0 * s[a0 + q]
        else:
            k += 1
            a1 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
            w1 = Fc[F_TAPS + k]
            if g == 2:
                for q in range(n):
                    d[d0 + q] = ((d[d0 + q] if acc else z) + w0 * s[a0 + q]) + w1 * s[a1 + q]
            else:
                k += 1
                a2 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
                w2 = Fc[F_TAPS + k]
                if g == 3:
                    for q in range(n):
                        d[d0 + q] = (((d[d0 + q] if acc else z) + w0 * s[a0 + q]) + w1 * s[a1 + q]) + w2 * s[a2 + q]
                else:
                    k += 1
                    a3 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
                    w3 = Fc[F_TAPS + k]
                    for q in range(n):
                        u = (((d[d0 + q] if acc else z) + w0 * s[a0 + q]) + w1 * s[a1 + q]) + w2 * s[a2 + q]
                        d[d0 + q] = u + w3 * s[a3 + q]
        acc = True
        t += g


@njit(**_JIT)
def _spass(d, d0, s, s0, n, P, Fc, t0, nt, kind, sy, cy, sx, cx, W):
    """``d[d0 + q] = `` one 1-D pass of a ``sep`` stencil at ``s[s0 + q + o]`` (``o`` as in
    :func:`_pass`), summed in SciPy's order (``NI_Correlate1D``): ``kind`` 0 (general): the
    last tap, then the others in order; 1 / -1 ((anti)symmetric): the centre tap, then
    ``(x[left] +- x[right]) * w[left]`` for each pair from the outermost in (``tables.ST_LEN``
    orders the taps so).  Every tap multiplies, zeros too; two terms per loop, added one after
    the other (``a - b`` is ``a + -1*b``: the same bits)."""
    ti = P[I_TAPI]
    a0 = s0 + (sy * P[ti + 2 * t0] + cy) * W + sx * P[ti + 2 * t0 + 1] + cx
    w0 = Fc[F_TAPS + t0]
    sg = Fc[F_ONE] if kind >= 0 else -Fc[F_ONE]
    step = 1 if kind == 0 else 2
    nitem = (nt - 1) // step
    if nitem == 0:
        for q in range(n):
            d[d0 + q] = w0 * s[a0 + q]
        return
    i = 0
    while i < nitem:
        g = min(2, nitem - i)
        k = t0 + 1 + i * step
        a1 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
        w1 = Fc[F_TAPS + k]
        b1 = a1
        if step == 2:
            b1 = s0 + (sy * P[ti + 2 * k + 2] + cy) * W + sx * P[ti + 2 * k + 3] + cx
        a2 = a1
        b2 = a1
        w2 = w1
        if g == 2:
            k += step
            a2 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
            w2 = Fc[F_TAPS + k]
            b2 = a2
            if step == 2:
                b2 = s0 + (sy * P[ti + 2 * k + 2] + cy) * W + sx * P[ti + 2 * k + 3] + cx
        first = i == 0
        if step == 1:
            if g == 1:
                if first:
                    for q in range(n):
                        d[d0 + q] = w0 * s[a0 + q] + w1 * s[a1 + q]
                else:
                    for q in range(n):
                        d[d0 + q] = d[d0 + q] + w1 * s[a1 + q]
            else:
                if first:
                    for q in range(n):
                        d[d0 + q] = (w0 * s[a0 + q] + w1 * s[a1 + q]) + w2 * s[a2 + q]
                else:
                    for q in range(n):
                        d[d0 + q] = (d[d0 + q] + w1 * s[a1 + q]) + w2 * s[a2 + q]
        else:
            if g == 1:
                if first:
                    for q in range(n):
                        d[d0 + q] = w0 * s[a0 + q] + (s[a1 + q] + sg * s[b1 + q]) * w1
                else:
                    for q in range(n):
                        d[d0 + q] = d[d0 + q] + (s[a1 + q] + sg * s[b1 + q]) * w1
            else:
                if first:
                    for q in range(n):
                        d[d0 + q] = (w0 * s[a0 + q] + (s[a1 + q] + sg * s[b1 + q]) * w1) + (
                            s[a2 + q] + sg * s[b2 + q]) * w2
                else:
                    for q in range(n):
                        d[d0 + q] = (d[d0 + q] + (s[a1 + q] + sg * s[b1 + q]) * w1) + (s[a2 + q] + sg * s[b2 + q]) * w2
        i += g


@njit(**_JIT)
def _sconst(v, t0, nt, kind, P, Fc):
    """:func:`_spass` on samples all equal to ``v`` (a column outside the image)."""
    sg = Fc[F_ONE] if kind >= 0 else -Fc[F_ONE]
    acc = Fc[F_TAPS + t0] * v
    if kind == 0:
        for t in range(1, nt):
            acc = acc + Fc[F_TAPS + t0 + t] * v
    else:
        for t in range(1, nt, 2):
            acc = acc + (v + sg * v) * Fc[F_TAPS + t0 + t]
    return acc


@njit(**_JIT)
def _hfix(dst, dst0, src, src0, nrows, j, t0, nt, kind, fx, P, Fc):
    """Column ``j`` of a horizontal pass (entries ``t0 ..``, :func:`_spass`'s order) on ``nrows``
    rows of a flat buffer (row stride W): ``dst[dst0 + r*W + j]`` from
    ``src[src0 + r*W + fold(j + dx)]``, ``fx`` where the fold leaves the image (constant mode)."""
    W = P[I_W]
    fw = P[I_FW] - P[I_EXLO] + j
    ti = P[I_TAPI] + 2 * t0 + 1
    sg = Fc[F_ONE] if kind >= 0 else -Fc[F_ONE]
    w0 = Fc[F_TAPS + t0]
    c0 = P[fw + P[ti]]
    for r in range(nrows):
        b = src0 + r * W
        acc = w0 * (src[b + c0] if c0 >= 0 else fx)
        if kind == 0:
            for t in range(1, nt):
                c = P[fw + P[ti + 2 * t]]
                acc = acc + Fc[F_TAPS + t0 + t] * (src[b + c] if c >= 0 else fx)
        else:
            for t in range(1, nt, 2):
                c = P[fw + P[ti + 2 * t]]
                e = P[fw + P[ti + 2 * t + 2]]
                acc = acc + ((src[b + c] if c >= 0 else fx) + sg * (src[b + e] if e >= 0 else fx)) * Fc[F_TAPS + t0 + t]
        dst[dst0 + r * W + j] = acc


# =============================================================================
# tiles


@njit(**_JIT)
def _load_chk(d, d0, x, s0, sW, n):
    """``_load_row`` that also returns 0 when every value is finite, else 1 (an integer OR
    reduction: it vectorises, a floating-point sum would not without fastmath)."""
    bad = np.int32(0)
    if sW == 1:
        for j in range(n):
            v = _ld(x, s0 + j)
            d[d0 + j] = v
            bad |= np.int32(v - v != 0)
    else:
        for j in range(n):
            v = _ld(x, s0 + j * sW)
            d[d0 + j] = v
            bad |= np.int32(v - v != 0)
    return bad


@njit(**_JIT)
def _load_row(d, d0, x, s0, sW, n):
    if sW == 1:
        for j in range(n):
            d[d0 + j] = _ld(x, s0 + j)
    else:
        for j in range(n):
            d[d0 + j] = _ld(x, s0 + j * sW)


@njit(**_JIT)
def _prefetch_block(p, base, sH, sW, nrows, ncols, W, write):
    """Prefetch ``nrows`` rows of ``ncols`` elements (contiguous rows only; a hint per cache line):
    the next work item's input and output, so that DRAM traffic overlaps this item's compute."""
    if sW != 1 or nrows <= 0 or ncols <= 0:
        return
    if sH == W and ncols == W:  # whole rows of a contiguous plane: one run
        ncols = nrows * W
        nrows = 1
    step = _line(p)
    for r in range(nrows):
        a = base + r * sH
        for j in range(0, ncols + step - 1, step):
            if write:
                _prefetch_w(p, a + min(j, ncols - 1))
            else:
                _prefetch_r(p, a + min(j, ncols - 1))


@njit(**_JIT)
def _prefetch_item(x, o, L, P, it, it1):
    """Prefetch the input rows of forward work item ``it`` (if it exists)."""
    if it >= it1:
        return
    H = P[I_H]
    W = P[I_W]
    p0, mp, ra, rb, c0, cw = _item(P, L, it)
    a = max(ra + P[I_EYLO], 0)
    b = min(rb + P[I_EYHI], H)
    ja = max(c0 + P[I_EXLO], 0)
    jb = min(c0 + cw + P[I_EXHI], W)
    xsH, xsW = L[R_X + 4], L[R_X + 5]
    for i in range(mp):  # (prefetching the output for writing measured no gain)
        xb = _poff(L, np.int64(R_X), p0 + i)
        _prefetch_block(x, xb + a * xsH + ja * xsW, xsH, xsW, b - a, jb - ja, W, False)


@njit(**_JIT)
def _fill(d, d0, n, v):
    for j in range(n):
        d[d0 + j] = v


@njit(**_JIT)
def _mask_at(xv, m, ma, hasm, thr):
    """Selected?  ``ma``: the mask element's address (a given mask), else ``x >= threshold``."""
    if hasm:
        return m[ma] != 0
    return xv >= thr


@njit(**_JIT)
def _written(mm, keepb, rowin, j, bj0, bj1):
    """Selected and not in the kept border band (``rowin``: the row is inside it).

    (Scalars only: an array argument in a per-element call costs atomic refcounts.)"""
    if keepb:
        return mm and rowin and j >= bj0 and j < bj1
    return mm


@njit(**_JIT)
def _src_seg(S, d0, x, xa, sW, m, ma, msW, hasm, thr, srcmode, n, Fc):
    """n samples from x (srcmode 0), of the mask (1) or where(mask, x, 0) (2); returns 0 when
    they are all finite (else 1)."""
    if srcmode == 0:
        return _load_chk(S, d0, x, xa, sW, n)
    zero = Fc[F_ZERO]
    one = Fc[F_ONE]
    bad = np.int32(0)
    for j in range(n):
        xv = _ld(x, xa + j * sW)
        mm = _mask_at(xv, m, ma + j * msW, hasm, thr)
        if srcmode == 1:
            S[d0 + j] = one if mm else zero
        else:
            v = xv if mm else zero
            S[d0 + j] = v
            bad |= np.int32(v - v != 0)
    return bad


@njit(**_JIT)
def _tile(S, S0, Ws, c0, cw, pad, x, xb, sH, sW, m, mb, msH, msW, hasm, thr, srcmode, fill, p0, nrows, gfront, gback,
          P, Fc):
    """Rows ``p0 .. p0+nrows`` (row coordinates, folded by the mode) into ``S`` (row stride ``Ws``).

    Flat layout (full width, ``Ws == W``): image column j at ``S[S0 + g + t*W + j]``.
    Padded layout: tile column c holds image column ``c0 + EXlo + c`` (folded) for
    ``c < cw + ex``: the columns the strip ``c0 .. c0+cw`` reads.  Returns 0 when every sample
    is finite (else 1): zero taps can then be skipped."""
    H = P[I_H]
    W = P[I_W]
    EXlo = P[I_EXLO]
    g = P[I_EXHI] - EXlo
    fh = P[I_FH] - P[I_EYLO]
    fw = P[I_FW] - EXlo
    if gfront:
        _fill(S, S0, g, fill)
    if gback:
        _fill(S, S0 + g + nrows * Ws, g, fill)
    a = max(p0, 0)
    b = min(p0 + nrows, H)
    flat = not pad and sH == W * sW and (srcmode == 0 or not hasm or msH == W * msW)
    z = np.int32(fill - fill != 0)  # 0, or 1 once a non-finite sample is seen
    if flat and b > a:  # the rows inside the image, in one run
        z |= _src_seg(S, S0 + g + (a - p0) * W, x, xb + a * sH, sW, m, mb + a * msH, msW, hasm, thr, srcmode,
                 (b - a) * W, Fc)
    j0 = c0 + EXlo  # padded layout: image column of tile column 0
    ja = max(j0, 0)
    jb = min(j0 + cw + g, W)
    wrow = cw + g if pad else W
    for t in range(nrows):
        p = p0 + t
        if flat and p >= a and p < b:
            continue
        d0 = S0 + g + t * Ws
        i = P[fh + p]
        if i < 0:
            _fill(S, d0, wrow, fill)
            continue
        if i != p and i >= a and i < b:
            continue  # a halo row that repeats a row of this tile: copied below
        xrow = xb + i * sH
        mrow = mb + i * msH
        if not pad:
            z |= _src_seg(S, d0, x, xrow, sW, m, mrow, msW, hasm, thr, srcmode, W, Fc)
            continue
        if jb > ja:
            z |= _src_seg(S, d0 + ja - j0, x, xrow + ja * sW, sW, m, mrow + ja * msW, msW, hasm, thr, srcmode,
                          jb - ja, Fc)
        for side in range(2):  # the columns outside the image, folded
            ca, cb = (np.int64(0), ja - j0) if side == 0 else (jb - j0, cw + g)
            for c in range(ca, cb):
                jf = P[fw + j0 + c]
                if jf < 0:
                    S[d0 + c] = fill
                elif jf >= ja and jf < jb:  # already in this row of the tile
                    S[d0 + c] = S[d0 + jf - j0]
                else:
                    z |= _src_seg(S, d0 + c, x, xrow + jf * sW, sW, m, mrow + jf * msW, msW, hasm, thr, srcmode, 1,
                                  Fc)
    for t in range(nrows):  # halo rows: copies of tile rows
        p = p0 + t
        i = P[fh + p]
        if i >= 0 and i != p and i >= a and i < b:
            d0 = S0 + g + t * Ws
            s0 = S0 + g + (i - p0) * Ws
            for c in range(wrow):
                S[d0 + c] = S[s0 + c]
    return z


@njit(**_JIT)
def _engine(R, R0, RL, S, S0, V, V0, x, L, p0, mp, sH, sW, m, hasm, msH, msW, thr, srcmode, ra, rb, c0, cw, Ws,
            ktop, P, Fc):
    """The tile, and stencils ``0 .. ktop`` of the plan on rows ``ra .. rb`` and columns ``c0 .. c0+cw``
    of the ``mp`` planes from ``p0`` (stacked: plane i's rows start at row ``i*(rb - ra + ey)``):
    stencil k -> ``R[R0 + k*RL + r*Ws + (j - c0)]``."""
    W = P[I_W]
    EYlo = P[I_EYLO]
    EXlo = P[I_EXLO]
    ey = P[I_EYHI] - EYlo
    g = P[I_EXHI] - EXlo
    pad = P[I_PAD] != 0
    cx = g - EXlo if pad else g
    nr = rb - ra
    bh = nr + ey  # rows per plane in the stacked tile
    ntot = (mp - 1) * bh + nr  # output rows, counting the halo rows between planes
    n = ntot * Ws
    fill = Fc[F_CVAL] if srcmode == 0 else Fc[F_ZERO]
    ONE, ZERO, NO = np.int64(1), np.int64(0), np.bool_(False)  # not literals: one specialisation of _pass
    z = np.int32(0)
    for i in range(mp):
        xb = _poff(L, np.int64(R_X), p0 + i)
        mb = _poff(L, np.int64(R_M), p0 + i) if hasm else ZERO
        z += _tile(S, S0 + i * bh * Ws, Ws, c0, cw, pad, x, xb, sH, sW, m, mb, msH, msW, hasm, thr, srcmode, fill,
                   ra + EYlo, bh, i == 0, i == mp - 1, P, Fc)
    # all samples finite: a zero tap adds exactly 0, skip it (it only matters to spread NaN/inf)
    fin = z == 0
    for k in range(ktop):
        d = P[I_ST] + ST_LEN * k
        nV = P[d]
        nH = P[d + 2]
        rk = R0 + k * RL
        nph = P[d + ST_NPH]
        if nph > 0:  # sep: the passes in the spec's order, each in SciPy's order
            ax1, kd1, nt1, t1 = P[d + ST_NPH + 1], P[d + ST_NPH + 2], P[d + ST_NPH + 3], P[d + ST_NPH + 4]
            nfix = P[d + 8]
            if nph == 1:  # (offsets as the one-phase taps': rows from -EYlo, columns from cx)
                _spass(R, rk, S, S0, n, P, Fc, t1, nt1, kd1, ONE, -EYlo, ONE, cx, Ws)
                if ax1 == -1:
                    for f in range(nfix):
                        _hfix(R, rk, S, S0 + g - EYlo * W, ntot, P[P[d + 9] + f], t1, nt1, kd1, fill, P, Fc)
            else:
                kd2, nt2, t2 = P[d + ST_NPH + 6], P[d + ST_NPH + 7], P[d + ST_NPH + 8]
                if ax1 == -2:  # vertical first (on the columns the horizontal pass reads)
                    _spass(V, V0, S, S0, n + 2 * g, P, Fc, t1, nt1, kd1, ONE, -EYlo, ZERO, ZERO, Ws)
                    _spass(R, rk, V, V0, n, P, Fc, t2, nt2, kd2, ZERO, ZERO, ONE, cx, Ws)
                    if nfix > 0:
                        fx = _sconst(fill, t1, nt1, kd1, P, Fc)  # a column outside, vertical pass
                        for f in range(nfix):
                            _hfix(R, rk, V, V0 + g, ntot, P[P[d + 9] + f], t2, nt2, kd2, fx, P, Fc)
                else:  # horizontal first (on every tile row), then vertical
                    _spass(V, V0, S, S0, (ntot + ey) * Ws, P, Fc, t1, nt1, kd1, ZERO, ZERO, ONE, cx, Ws)
                    for f in range(nfix):
                        _hfix(V, V0, S, S0 + g, ntot + ey, P[P[d + 9] + f], t1, nt1, kd1, fill, P, Fc)
                    _spass(R, rk, V, V0, n, P, Fc, t2, nt2, kd2, ONE, -EYlo, ZERO, ZERO, Ws)
        elif nV > 0 and nH > 0:
            _pass(V, V0, S, S0, n + 2 * g, P, Fc, P[d + 1], P[d + 10] if fin else nV, ONE, -EYlo, ZERO, ZERO, Ws, NO)
            _pass(R, rk, V, V0, n, P, Fc, P[d + 3], P[d + 11] if fin else nH, ZERO, ZERO, ONE, cx, Ws, NO)
        else:
            _pass(R, rk, S, S0, n, P, Fc, P[d + 5], P[d + 12] if fin else P[d + 4], ONE, -EYlo, ONE, cx, Ws, NO)
        if nph == 0:
            _fixcols(R, rk, S, S0, V, V0, d, ntot, fill, fin, P, Fc)
        ck = P[d + 6]
        if ck != 0 and srcmode == 0:
            c0f = P[d + 7]
            for i in range(mp):
                for r in range(nr):
                    q = rk + (i * bh + r) * Ws
                    if ck == 1:
                        for j in range(cw):
                            R[q + j] += Fc[c0f + c0 + j]
                    else:
                        cr = Fc[c0f + ra + r]
                        for j in range(cw):
                            R[q + j] += cr


@njit(**_JIT)
def _fixcols(R, rk, S, S0, V, V0, d, ntot, fill, fin, P, Fc):
    """Flat layout: the border columns of stencil ``d`` (their flat taps read a neighbouring row)."""
    for f in range(P[d + 8]):
        _fixcol(R, rk, S, S0, V, V0, d, P[P[d + 9] + f], ntot, fill, fin, P, Fc)


@njit(**_JIT)
def _fixcol(R, rk, S, S0, V, V0, d, j, ntot, fill, fin, P, Fc):
    """Column j of stencil ``d`` on rows ``0 .. ntot`` (flat layout), exactly: taps through the
    column fold table."""
    W = P[I_W]
    EYlo = P[I_EYLO]
    EXlo = P[I_EXLO]
    g = P[I_EXHI] - EXlo
    fw = P[I_FW] - EXlo
    ti = P[I_TAPI]
    nV = P[d]
    two = nV > 0 and P[d + 2] > 0
    if two:
        t0 = P[d + 3]
        nt = P[d + 11] if fin else P[d + 2]
        fx = Fc[F_ZERO]  # a padded column of the vertical pass: fill * sum(vertical taps)
        for t in range(P[d + 10] if fin else nV):
            fx += Fc[F_TAPS + P[d + 1] + t] * fill
    else:
        t0 = P[d + 5]
        nt = P[d + 12] if fin else P[d + 4]
        fx = fill
    if nt == 0:
        for r in range(ntot):
            R[rk + r * W + j] = Fc[F_ZERO]
    for t in range(nt):
        kk = t0 + t
        dx = P[ti + 2 * kk + 1]
        w = Fc[F_TAPS + kk]
        jj = P[fw + j + dx]
        if two:
            src = V
            base = V0 + g + jj
        else:
            src = S
            base = S0 + g + (P[ti + 2 * kk] - EYlo) * W + jj
        if t == 0:  # the sum starts at +0.0, taps in order (as :func:`_pass`)
            for r in range(ntot):
                R[rk + r * W + j] = Fc[F_ZERO]
        if jj >= 0:
            for r in range(ntot):
                R[rk + r * W + j] += w * src[base + r * W]
        else:
            wf = w * fx
            for r in range(ntot):
                R[rk + r * W + j] += wf


@njit(**_JIT)
def _atan(t):
    """atan(t) for t >= 0 (or NaN), float64 (Cephes' rational approximation, ~1e-16)."""
    big = t > 2.41421356237309504880
    mid = t > 0.66
    u = -1.0 / t if big else ((t - 1.0) / (t + 1.0) if mid else t)
    y0 = 1.57079632679489661923 if big else (0.78539816339744830962 if mid else 0.0)
    corr = 6.123233995736765886130e-17 if big else (0.5 * 6.123233995736765886130e-17 if mid else 0.0)
    z = u * u
    pz = ((((-8.750608600031904122785e-1 * z - 1.615753718733365076637e1) * z - 7.500855792314704667340e1) * z
           - 1.228866684490136173410e2) * z - 6.485021904942025371773e1)
    qz = (((((z + 2.485846490142306297962e1) * z + 1.650270098316988542046e2) * z + 4.328810604912902668951e2) * z
           + 4.853903996359136964868e2) * z + 1.945506571482613964425e2)
    return y0 + ((u * (z * pz / qz) + u) + corr)


@njit(**_JIT)
def _atan2(y, x):
    """atan2 in float64 (branch-free, vectorisable), IEEE special cases included."""
    yd = np.float64(y)
    xd = np.float64(x)
    ax = abs(xd)
    ay = abs(yd)
    both0 = ax == 0.0 and ay == 0.0
    bothinf = ax == np.inf and ay == np.inf
    t = 1.0 if bothinf else (0.0 if both0 else ay / ax)
    r = _atan(t)
    r = 3.14159265358979323846 - r if math.copysign(1.0, xd) < 0.0 else r
    return math.copysign(r, yd)


# =============================================================================
# forward kernels


@njit(**_JIT)
def _fwd_layout(P, K, BR):
    W = P[I_W]
    ey = P[I_EYHI] - P[I_EYLO]
    g = P[I_EXHI] - P[I_EXLO]
    Ws = P[I_CW] + g if P[I_PAD] != 0 else W
    rows = P[I_MP] * (BR + ey)
    S0 = np.int64(0)
    V0 = S0 + rows * Ws + 2 * g
    R0 = V0 + rows * Ws + 2 * g
    RL = rows * Ws
    return Ws, S0, V0, R0, RL, R0 + K * RL


@njit(**_JIT)
def _item(P, L, it):
    """Forward work item -> (first plane, planes, first row, last row, first column, columns)."""
    H = P[I_H]
    W = P[I_W]
    BR = P[I_BR]
    NB = P[I_NB]
    NC = P[I_NC]
    CW = P[I_CW]
    MP = P[I_MP]
    per = NB * NC
    p = (it // per) * MP
    rem = it % per
    ra = (rem // NC) * BR
    c0 = (rem % NC) * CW
    return p, min(MP, L[L_N] - p), ra, min(H, ra + BR), c0, min(W - c0, CW)


@njit(**_JIT)
def _mag_fix(o, orow, osW, B, q, RL, K, sl):
    """The magnitudes of a segment again, rescaled where the sum of squares over/underflowed
    (``reference._scaled``'s formula: ``m * sqrt(sum (y_k/m)**2)``, ``m = max |y_k|``)."""
    for j in range(sl):
        a = B[q + j]
        if K == 2:
            _st(o, orow + j * osW, _hyp2(a, B[q + RL + j]))
            continue
        s = a * a
        nz = a != 0
        m = abs(a)
        for k in range(1, K):
            b = B[q + k * RL + j]
            s += b * b
            nz |= b != 0
            m = max(m, abs(b))
        if _mag_flag(s, nz) != _expo_all(s) or (s != s):
            continue
        if m == np.inf:
            _st(o, orow + j * osW, m)
            continue
        t = a / m
        r = t * t
        for k in range(1, K):
            t = B[q + k * RL + j] / m
            r += t * t
        _st(o, orow + j * osW, m * math.sqrt(r))


def _make_filter_fwd(EPI):
    """The forward kernel for one epilogue (a constant: the first call compiles only its code)."""

    @njit(**_JIT)
    def _k_filter_fwd(xa, oa, carrier, Pa, Fa, La, it0, it1):
        I0, NO = np.int64(0), np.bool_(False)
        x = _ptr(xa, carrier)
        o = _ptr(oa, carrier)
        # raw pointers: array arguments would cost atomic refcount updates in every helper call,
        # contended between threads
        Fa32 = _cvt(carrier, Fa)
        Fc = _ptr(Fa32.ctypes.data, Fa32[0])
        P = _ptr(Pa.ctypes.data, Pa[0])
        L = _ptr(La.ctypes.data, La[0])
        W = P[I_W]
        K = P[I_K]
        epi = EPI
        fl_ref = Fc[F_ZERO]
        Ws, S0, V0, R0, RL, total = _fwd_layout(P, K, P[I_BR])
        buf = np.empty(total, Fa32.dtype)
        B = _ptr(buf.ctypes.data, Fc[0])
        xsH, xsW = L[R_X + 4], L[R_X + 5]
        osK, osH, osW = L[R_O + 3], L[R_O + 4], L[R_O + 5]
        ey = P[I_EYHI] - P[I_EYLO]
        for it in range(it0, it1):
            p0, mp, ra, rb, c0, cw = _item(P, L, it)
            _prefetch_item(x, o, L, P, it + 1, it1)
            _engine(B, R0, RL, B, S0, B, V0, x, L, p0, mp, xsH, xsW, x, NO, I0, I0, Fc[F_ZERO], I0, ra, rb, c0, cw, Ws,
                    K, P, Fc)
            nr = rb - ra
            flat = Ws == W and cw == W and osH == W * osW
            nseg = 1 if flat else nr
            sl = nr * W if flat else cw
            for sgp in range(mp * nseg):
                pi = sgp // nseg
                sg = sgp % nseg
                q = R0 + (pi * (nr + ey) + sg) * Ws
                orow = _poff(L, np.int64(R_O), p0 + pi) + c0 * osW + (ra + sg) * osH
                if epi == EPI_STACK:
                    for k in range(K):
                        qk = q + k * RL
                        ok = orow + k * osK
                        if osW == 1:
                            for j in range(sl):
                                _st(o, ok + j, B[qk + j])
                        else:
                            for j in range(sl):
                                _st(o, ok + j * osW, B[qk + j])
                elif epi == EPI_SUM:
                    for j in range(sl):
                        s = B[q + j]
                        for k in range(1, K):
                            s += B[q + k * RL + j]
                        _st(o, orow + j * osW, s)
                elif epi == EPI_MAG:
                    fl = _expo(Fc[F_ZERO])
                    if K == 2 and osW == 1:
                        for j in range(sl):
                            a = B[q + j]
                            b = B[q + RL + j]
                            s = a * a + b * b
                            _st(o, orow + j, math.sqrt(s))
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
                            _st(o, orow + j * osW, math.sqrt(s))
                            fl = max(fl, _mag_flag(s, nz))
                    if fl == _expo_all(fl_ref):  # (rare) sums of squares that over/underflowed
                        _mag_fix(o, orow, osW, B, q, RL, K, sl)
                else:  # direction: atan2(y0, y1)
                    for j in range(sl):
                        _st(o, orow + j * osW, _atan2(B[q + j], B[q + RL + j]))
        return buf.size + Fa32.size + Pa.size + La.size

    return _k_filter_fwd


_K_FILTER_FWD = {e: _make_filter_fwd(e) for e in (EPI_STACK, EPI_MAG, EPI_DIR, EPI_SUM)}




@njit(**_JIT)
def _k_blur_fwd(xa, ma, oa, carrier, Pa, Fa, La, thr, it0, it1):
    I0, I1, I2 = np.int64(0), np.int64(1), np.int64(2)
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
    W = P[I_W]
    norm = P[I_EPI] == EPI_NORM
    keepb = P[I_KEEPB] != 0
    bj0, bj1 = P[I_BJ0], P[I_BJ1]
    EYlo = P[I_EYLO]
    g = P[I_EXHI] - P[I_EXLO]
    xofs = -P[I_EXLO] if P[I_PAD] != 0 else np.int64(0)  # tile column of the first output column
    Ws, S0, V0, R0, RL, total = _fwd_layout(P, I2, P[I_BR])
    buf = np.empty(total, Fa32.dtype)
    B = _ptr(buf.ctypes.data, Fc[0])
    xsH, xsW = L[R_X + 4], L[R_X + 5]
    osH, osW = L[R_O + 4], L[R_O + 5]
    msH, msW = L[R_M + 4], L[R_M + 5]
    zero = Fc[F_ZERO]
    ey = P[I_EYHI] - EYlo
    for it in range(it0, it1):
        p0, mp, ra, rb, c0, cw = _item(P, L, it)
        _prefetch_item(x, o, L, P, it + 1, it1)
        if norm:
            _engine(B, R0, RL, B, S0, B, V0, x, L, p0, mp, xsH, xsW, m, hasm, msH, msW, thr_c, I2, ra, rb, c0, cw, Ws,
                    I1, P, Fc)
            _engine(B, R0 + RL, RL, B, S0, B, V0, x, L, p0, mp, xsH, xsW, m, hasm, msH, msW, thr_c, I1, ra, rb, c0, cw,
                    Ws, I1, P, Fc)
        else:
            _engine(B, R0, RL, B, S0, B, V0, x, L, p0, mp, xsH, xsW, m, hasm, msH, msW, thr_c, I0, ra, rb, c0, cw, Ws,
                    I1, P, Fc)
        nr = rb - ra
        flat = (Ws == W and cw == W and osH == W * osW and xsH == W * xsW and (not hasm or msH == W * msW)
                and not keepb)
        nseg = 1 if flat else nr
        sl = nr * W if flat else cw
        for sgp in range(mp * nseg):
            pi = sgp // nseg
            sg = sgp % nseg
            i = ra + sg
            q = R0 + (pi * (nr + ey) + sg) * Ws
            rowin = i >= P[I_BI0] and i < P[I_BI1]
            mb = _poff(L, np.int64(R_M), p0 + pi) if hasm else I0
            mrow = mb + i * msH + c0 * msW
            xrow = _poff(L, np.int64(R_X), p0 + pi) + i * xsH + c0 * xsW
            orow = _poff(L, np.int64(R_O), p0 + pi) + i * osH + c0 * osW
            if norm:
                for j in range(sl):
                    xv = _ld(x, xrow + j * xsW)
                    mm = _written(_mask_at(xv, m, mrow + j * msW, hasm, thr_c), keepb, rowin, c0 + j, bj0, bj1)
                    den = B[q + RL + j]
                    _st(o, orow + j * osW, B[q + j] / den if (mm and den > zero) else xv)
            else:
                tq = S0 + g + (pi * (nr + ey) + sg - EYlo) * Ws + xofs  # x, from the tile
                for j in range(sl):
                    xv = B[tq + j]
                    mm = _written(_mask_at(xv, m, mrow + j * msW, hasm, thr_c), keepb, rowin, c0 + j, bj0, bj1)
                    _st(o, orow + j * osW, B[q + j] if mm else xv)
    return buf.size + Fa32.size + Pa.size + La.size
