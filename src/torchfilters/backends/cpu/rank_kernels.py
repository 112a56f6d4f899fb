"""numba kernels of the rank-filter engine (``rank``): one kernel per algorithm, compiled once per
compute dtype (float32, float64; float16/bfloat16 run as float32, a selection is exact).

Every kernel reads a contiguous ``(N, D, H, W)`` volume ``X`` (flat) through fold tables: ``tz``,
``ty``, ``tx`` map a *padded* coordinate ``p`` (output ``i`` reads ``p = i + j`` for window offset
``j = 0 .. k-1`` along the axis) to a source index, ``-1`` for ``constant`` mode's padding (the
value ``cval``).  Order: ``numpy.sort``'s (NaN after ``+inf``).

* :func:`_k_vh` -- ``minimum``/``maximum`` of a box along two axes of a ``(planes, rows, row)``
  view, per strip of columns: van Herk/Gil-Werman down the rows (constant work, vector ops over
  the strip), then the row pass by doubling (``ceil(log2 k)`` vector ops) in cache.  A z-pass
  is the same kernel on ``(N, D, H*W)`` with a row pass of 1.
* :func:`_k_net` -- small boxes, any rank: a comparator program (``rank._network``) on integer
  keys (``_key``: min/max are single vector instructions) over a block of rows: the sorted
  columns once per padded column, then per output the rows sorted, the elements the order
  rules out dropped, the rest merged -- every instruction one vector op over the block; the 3x3
  and 5x5 medians run that second stage as generated straight-line code (``rank_nets``).
* :func:`_k_sel` -- any footprint: gather the window, NaN counted apart, quickselect.
* :func:`_k_hist` -- large windows: per band of rows the band's values ranked once (a sort),
  then per output row a sliding window of ranks in a three-level bit histogram (add/remove the
  footprint's run ends per step, the rank-th set bit by counts).
* :func:`_k_bwd` / :func:`_k_merge` -- the backward: per output, scan its window (footprint order,
  run by run of consecutive columns) for the element the stable order puts at ``rank`` given
  the forward value ``y``; scatter the gradient per plane, or per band into private buffers
  merged per plane (no two threads write one element).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .prims import _JIT, _sel
from .rank_nets import _g1, _g2

# ----------------------------------------------------------------------------- primitives


@intrinsic
def _popc(typingctx, v):
    """Set bits of a uint64."""

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64]), "llvm.ctpop.i64")
        return builder.call(fn, [args[0]])

    return types.uint64(types.uint64), codegen


@intrinsic
def _cttz(typingctx, v):
    """Trailing zeros of a non-zero uint64."""

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]),
                                            "llvm.cttz.i64")
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])

    return types.uint64(types.uint64), codegen


@njit(forceinline=True, **_JIT)
def _lt(a, b):
    """``a < b`` in NaN-last order."""
    return (a < b) or (math.isnan(b) and not math.isnan(a))


@njit(forceinline=True, **_JIT)
def _eq(a, b):
    """``a == b`` with NaN equal to NaN."""
    return (a == b) or (math.isnan(a) and math.isnan(b))


# ----------------------------------------------------------------------------- van Herk


@njit(forceinline=True, **_JIT)
def _runs(tx, x0, pw, RU):
    """Split padded columns ``x0 .. x0+pw`` into runs ``(t0, t1, c0)`` of consecutive source
    columns from ``c0`` (``c0 = -1``: padding); returns their number."""
    nr = 0
    t = 0
    while t < pw:
        c = tx[x0 + t]
        e = t + 1
        if c >= 0:
            while e < pw and tx[x0 + e] == c + e - t:
                e += 1
        else:
            while e < pw and tx[x0 + e] < 0:
                e += 1
        RU[nr, 0] = t
        RU[nr, 1] = e
        RU[nr, 2] = c
        nr += 1
        t = e
    return nr


@njit(forceinline=True, **_JIT)
def _load(X, R, src, base, RU, nr, cval):
    """The padded columns described by ``RU`` (``_runs``) of source row ``src`` (offset
    ``base``; ``src < 0``: padding) into ``R``; each run one vector copy."""
    for i in range(nr):
        t0 = RU[i, 0]
        n = RU[i, 1] - t0
        c0 = RU[i, 2]
        Rs = R[t0:t0 + n]
        if src < 0 or c0 < 0:
            for t in range(n):
                Rs[t] = cval
        else:
            Xs = X[base + c0:base + c0 + n]  # (views indexed by the loop counter: vectors)
            for t in range(n):
                Rs[t] = Xs[t]


@njit(forceinline=True, **_JIT)
def _row(X, R, src, base, RU, nr, cval, pw):
    """Source row ``src``'s padded columns: a view of ``X`` when they are one run, else
    loaded into ``R`` (``_load``)."""
    if src >= 0 and nr == 1 and RU[0, 2] >= 0:
        b = base + RU[0, 2]
        return X[b:b + pw]
    _load(X, R, src, base, RU, nr, cval)
    return R


@njit(forceinline=True, **_JIT)
def _comb(A, B, C, n, ismax):
    """``C = op(A, B)`` over ``n`` elements."""
    if ismax:
        for t in range(n):
            a = A[t]
            b = B[t]
            C[t] = _sel((a > b) | math.isnan(a), a, b)
    else:
        for t in range(n):
            a = A[t]
            b = B[t]
            C[t] = _sel((a < b) | math.isnan(b), a, b)


@njit(forceinline=True, **_JIT)
def _combs(A, s, C, n, ismax):
    """``C[t] = op(A[t], A[t + s])``."""
    _comb(A, A[s:], C, n, ismax)


@njit(**_JIT)
def _k_vh(X, O, G, ty, tx, cval, ismax, it0, it1):
    """Box min/max over (rows, row) of ``(planes, NR, RL)``; items ``(plane, strip)``.

    ``G = [NR, RL, HO, WO, ky, kx, CW, nstrips]``: ``HO`` output rows of ``WO`` elements."""
    NR, RL, HO, WO, ky, kx, CW, ns = G[0], G[1], G[2], G[3], G[4], G[5], G[6], G[7]
    pwmax = min(CW, WO) + kx - 1
    RU = np.empty((pwmax, 3), np.int64)
    S = np.empty((max(ky, 1), pwmax), X.dtype)
    P = np.empty(pwmax, X.dtype)
    R = np.empty(pwmax, X.dtype)
    V = np.empty(pwmax, X.dtype)
    T = np.empty(pwmax, X.dtype)
    for it in range(it0, it1):
        n = it // ns
        x0 = (it % ns) * CW
        cw = min(WO, x0 + CW) - x0
        pw = cw + kx - 1
        nr = _runs(tx, x0, pw, RU)
        pb = n * NR * RL
        ob = n * HO * WO + x0
        npad = HO + ky - 1
        # suffix maxima of block 0 (rows ky-1 .. 0)
        if ky > 1:
            top = min(ky, npad) - 1
            for q in range(top, -1, -1):
                src = ty[q]
                if q == top:
                    _load(X, S[q], src, pb + src * RL, RU, nr, cval)
                else:
                    _comb(_row(X, R, src, pb + src * RL, RU, nr, cval, pw), S[q + 1], S[q], pw, ismax)
        for y in range(HO):
            j = y % ky
            if ky == 1:
                src = ty[y]
                _load(X, V, src, pb + src * RL, RU, nr, cval)
            else:
                q = y + ky - 1
                src = ty[q]
                if j == 0:
                    _load(X, P, src, pb + src * RL, RU, nr, cval)
                else:
                    _comb(P, _row(X, R, src, pb + src * RL, RU, nr, cval, pw), P, pw, ismax)
                _comb(S[j], P, V, pw, ismax)
            # the row pass: doubling
            o = ob + y * WO
            Os = O[o:o + cw]
            if kx == 1:
                for t in range(cw):
                    Os[t] = V[t]
            else:  # (no swapped array variables: they cost the loops their vectors)
                w = 1
                cur = 0
                while 2 * w <= kx:
                    if cur == 0:
                        _combs(V, w, T, pw - 2 * w + 1, ismax)
                    else:
                        _combs(T, w, V, pw - 2 * w + 1, ismax)
                    cur ^= 1
                    w *= 2
                if cur == 0:
                    _combs(V, kx - w, Os, cw, ismax)
                else:
                    _combs(T, kx - w, Os, cw, ismax)
            if ky > 1 and j == ky - 1 and y + 1 < HO:
                # suffix maxima of the next block: rows just read (cache), bottom up
                b0 = y + 1
                top = min(b0 + ky, npad) - 1
                for q in range(top, b0 - 1, -1):
                    src = ty[q]
                    if q == top:
                        _load(X, S[q - b0], src, pb + src * RL, RU, nr, cval)
                    else:
                        _comb(_row(X, R, src, pb + src * RL, RU, nr, cval, pw), S[q - b0 + 1], S[q - b0], pw, ismax)


# ----------------------------------------------------------------------------- networks


@njit(forceinline=True, **_JIT)
def _key(b, sh, mask, kinf, knan):
    """Float bits (as a signed integer) -> an integer that orders as the float, NaN last (one
    NaN: ``knan``); ``K = [sh, mask, kinf, knan]``: width - 1, sign-less mask, key of -inf."""
    k = b ^ ((b >> sh) & mask)
    return knan if k < kinf else k


@njit(forceinline=True, **_JIT)
def _unkey(k, sh, mask):
    return k ^ ((k >> sh) & mask)


@njit(**_JIT)
def _k_net(X, O, G, tz, ty, tx, prog, K, cbits, gen, it0, it1):
    """A small box, any rank, by a comparator program on integer keys (``_key``: min and max
    are single vector instructions); items are blocks of ``RB`` output rows of one plane.

    ``X``/``O`` are the float data viewed as signed integers of their width, ``cbits`` is ``cval``'s bits.
    ``G = [N, D, H, W, kz, ky, kx, nrows, CH, nstage1, res_row, res_shift, RB]``; ``prog`` rows
    ``(op, dst, a, sa, b, sb)`` (op 0: min, 1: max), the first ``nstage1`` over the padded
    rows, the rest over the outputs; the block's rows lie side by side in each program row.
    ``gen > 0``: stage 2 is the generated function ``rank_nets._g<gen>`` (values in registers)."""
    D, H, W, kz, ky, kx = G[1], G[2], G[3], G[4], G[5], G[6]
    nrows, CH, ns1, rr, rs, RB = G[7], G[8], G[9], G[10], G[11], G[12]
    nby = -(-H // RB)
    sh, mask, kinf, knan = K[0], K[1], K[2], K[3]  # (scalars: loads in the loops would alias)
    B = np.empty((nrows, RB * (CH + kx - 1)), X.dtype)
    RU = np.empty((CH + kx - 1, 3), np.int64)
    nops = prog.shape[0]
    for it in range(it0, it1):
        n = it // (D * nby)
        z = (it // nby) % D
        y0 = (it % nby) * RB
        rb = min(H, y0 + RB) - y0
        for x0 in range(0, W, CH):
            cw = min(W, x0 + CH) - x0
            pw = cw + kx - 1
            nr = _runs(tx, x0, pw, RU)
            for r in range(rb):
                for jz in range(kz):
                    sz = tz[z + jz]
                    for jy in range(ky):
                        sy = ty[y0 + r + jy]
                        src = -1 if sz < 0 or sy < 0 else 0
                        base = ((n * D + sz) * H + sy) * W
                        Bs = B[jz * ky + jy, r * pw:(r + 1) * pw]
                        for i in range(nr):
                            t0 = RU[i, 0]
                            m = RU[i, 1] - t0
                            c0 = RU[i, 2]
                            Rs = Bs[t0:t0 + m]
                            if src < 0 or c0 < 0:
                                kc = _key(cbits, sh, mask, kinf, knan)
                                for t in range(m):
                                    Rs[t] = kc
                            else:
                                Xs = X[base + c0:base + c0 + m]
                                for t in range(m):
                                    Rs[t] = _key(Xs[t], sh, mask, kinf, knan)
            w1 = rb * pw
            w2 = w1 - kx + 1
            for p in range(nops if gen == 0 else ns1):
                op = prog[p, 0]
                rd = B[prog[p, 1]]
                ra = B[prog[p, 2], prog[p, 3]:]
                rbv = B[prog[p, 4], prog[p, 5]:]
                w = w1 if p < ns1 else w2
                if op == 0:
                    for t in range(w):
                        a = ra[t]
                        b = rbv[t]
                        rd[t] = _sel(a < b, a, b)
                else:
                    for t in range(w):
                        a = ra[t]
                        b = rbv[t]
                        rd[t] = _sel(a < b, b, a)
            if gen == 1:
                _g1(B, w2)
            elif gen == 2:
                _g2(B, w2)
            for r in range(rb):
                res = B[rr, r * pw + rs:]
                ob = ((n * D + z) * H + y0 + r) * W + x0
                Os = O[ob:ob + cw]
                for t in range(cw):
                    Os[t] = _unkey(res[t], sh, mask)


# ----------------------------------------------------------------------------- selection


@njit(forceinline=True, **_JIT)
def _qsel(a, n, k):
    """The ``k``-th smallest of ``a[:n]`` (no NaN), reordering ``a``."""
    lo = 0
    hi = n - 1
    while hi > lo:
        pv = a[(lo + hi) >> 1]
        i = lo
        j = hi
        while i <= j:
            while a[i] < pv:
                i += 1
            while pv < a[j]:
                j -= 1
            if i <= j:
                t = a[i]
                a[i] = a[j]
                a[j] = t
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return a[k]


@njit(forceinline=True, **_JIT)
def _rowbases(RB, offs, tz, ty, n, z, y, D, H, W):
    for t in range(offs.shape[0]):
        sz = tz[z + offs[t, 0]]
        sy = ty[y + offs[t, 1]]
        RB[t] = -1 if sz < 0 or sy < 0 else ((n * D + sz) * H + sy) * W


@njit(**_JIT)
def _k_sel(X, O, G, tz, ty, tx, offs, cval, it0, it1):
    """Any footprint, any rank; items are output rows.  ``G = [N, D, H, W, count, rank]``."""
    D, H, W, count, rank = G[1], G[2], G[3], G[4], G[5]
    RB = np.empty(count, np.int64)
    buf = np.empty(count, X.dtype)
    nan = np.nan
    for it in range(it0, it1):
        n = it // (D * H)
        z = (it // H) % D
        y = it % H
        _rowbases(RB, offs, tz, ty, n, z, y, D, H, W)
        ob = it * W
        for x in range(W):
            nn = 0
            for t in range(count):
                c = tx[x + offs[t, 2]]
                rb = RB[t]
                v = cval if rb < 0 or c < 0 else X[rb + c]
                if not math.isnan(v):
                    buf[nn] = v
                    nn += 1
            if rank >= nn:
                O[ob + x] = nan
            else:
                O[ob + x] = _qsel(buf, nn, rank)


# ----------------------------------------------------------------------------- histogram


@njit(forceinline=True, **_JIT)
def _hadd(r, Wd, G1, G2):
    Wd[r >> 6] |= np.uint64(1) << np.uint64(r & 63)
    G1[r >> 9] += 1
    G2[r >> 12] += 1


@njit(forceinline=True, **_JIT)
def _hdel(r, Wd, G1, G2):
    Wd[r >> 6] &= ~(np.uint64(1) << np.uint64(r & 63))
    G1[r >> 9] -= 1
    G2[r >> 12] -= 1


@njit(forceinline=True, **_JIT)
def _hsel(k, Wd, G1, G2):
    """The position of the ``k``-th (0-based) set bit."""
    s = 0
    i = 0
    while s + G2[i] <= k:
        s += G2[i]
        i += 1
    i *= 8
    while s + G1[i] <= k:
        s += G1[i]
        i += 1
    i *= 8
    while True:
        c = np.int64(_popc(Wd[i]))
        if s + c > k:
            break
        s += c
        i += 1
    w = Wd[i]
    for _ in range(k - s):
        w &= w - np.uint64(1)
    return i * 64 + np.int64(_cttz(w))


@njit(**_JIT)
def _k_hist(X, O, G, tz, ty, tx, offs, rm, ad, cval, it0, it1):
    """Any footprint, any rank, by ranks in a sliding bit histogram; items ``(n, z, band)``.

    ``G = [N, D, H, W, kz, ky, kx, rank, BH, nbands]``; ``offs`` the footprint (``(jz, jy, jx)``),
    ``rm`` / ``ad`` its elements that leave / enter when the window steps right."""
    D, H, W, kz, ky, kx, rank, BH, nb = G[1], G[2], G[3], G[4], G[5], G[6], G[7], G[8], G[9]
    PW = W + kx - 1
    RH = BH + ky - 1
    M = kz * RH * PW
    vals = np.empty(M, X.dtype)
    keep = np.empty(M, np.int64)
    rnk = np.empty(M, np.int64)
    srt = np.empty(M, X.dtype)
    nw = (M + 4095) // 4096 * 64 + 64
    Wd = np.zeros(nw, np.uint64)
    G1 = np.zeros(nw // 8 + 8, np.int32)
    G2 = np.zeros(nw // 64 + 8, np.int32)
    RU = np.empty((PW, 3), np.int64)
    nr = _runs(tx, 0, PW, RU)
    for it in range(it0, it1):
        n = it // (D * nb)
        z = (it // nb) % D
        y0 = (it % nb) * BH
        bh = min(H, y0 + BH) - y0
        rh = bh + ky - 1
        m = kz * rh * PW
        # the band's values, padded, then their ranks (NaN last)
        for jz in range(kz):
            sz = tz[z + jz]
            for py in range(rh):
                sy = ty[y0 + py]
                src = -1 if sz < 0 or sy < 0 else 0
                r0 = (jz * rh + py) * PW
                _load(X, vals[r0:r0 + PW], src, ((n * D + sz) * H + sy) * W, RU, nr, cval)
        nn = 0
        for i in range(m):
            if not math.isnan(vals[i]):
                keep[nn] = i
                nn += 1
        order = np.argsort(vals[keep[:nn]])
        for i in range(nn):
            e = keep[order[i]]
            rnk[e] = i
            srt[i] = vals[e]
        k = nn
        for i in range(m):
            if math.isnan(vals[i]):
                rnk[i] = k
                srt[k] = vals[i]
                k += 1
        for i in range(bh):
            Wd[:] = 0
            G1[:] = 0
            G2[:] = 0
            for t in range(offs.shape[0]):
                _hadd(rnk[(offs[t, 0] * rh + i + offs[t, 1]) * PW + offs[t, 2]], Wd, G1, G2)
            ob = ((n * D + z) * H + y0 + i) * W
            for x in range(W):
                O[ob + x] = srt[_hsel(rank, Wd, G1, G2)]
                if x + 1 < W:
                    for t in range(rm.shape[0]):
                        _hdel(rnk[(rm[t, 0] * rh + i + rm[t, 1]) * PW + x + rm[t, 2]], Wd, G1, G2)
                    for t in range(ad.shape[0]):
                        _hadd(rnk[(ad[t, 0] * rh + i + ad[t, 1]) * PW + x + 1 + ad[t, 2]], Wd, G1, G2)


# ----------------------------------------------------------------------------- backward


@njit(**_JIT)
def _k_bwd(X, Y, Gr, A, G, tz, ty, tx, runs, cval, it0, it1):
    """Scatter each output's gradient to its selected window element.

    ``G = [N, D, H, W, count, rank, BH, nbands, banded, RH]``; ``runs`` the footprint as runs
    ``(jz, jy, jx0, jx1)`` in its C order.  Items ``(n, band)`` of ``BH`` output rows (all z).
    ``banded``: into ``A`` = private buffers ``(items, D, RH, W)`` in padded rows (``_k_merge``
    folds them), else straight into ``A`` (``(N, D, H, W)``; one item per plane).  Per output:
    count the window's elements below ``y`` and equal to it, run by run (a run of consecutive
    source columns is one vector reduction), then find the ``(rank - below)``-th equal one."""
    D, H, W, rank, BH, nb, banded, RH = G[1], G[2], G[3], G[5], G[6], G[7], G[8], G[9]
    nr = runs.shape[0]
    RB = np.empty(nr, np.int64)
    AB = np.empty(nr, np.int64)
    CE = np.empty(nr, np.int64)
    for it in range(it0, it1):
        n = it // nb
        y0 = (it % nb) * BH
        y1 = min(H, y0 + BH)
        for z in range(D):
            for y in range(y0, y1):
                for r in range(nr):
                    sz = tz[z + runs[r, 0]]
                    sy = ty[y + runs[r, 1]]
                    RB[r] = -1 if sz < 0 or sy < 0 else ((n * D + sz) * H + sy) * W
                    if banded:
                        AB[r] = -1 if RB[r] < 0 else ((it * D + sz) * RH + y - y0 + runs[r, 1]) * W
                    else:
                        AB[r] = RB[r]
                o = ((n * D + z) * H + y) * W
                for x in range(W):
                    g = Gr[o + x]
                    if g == 0:
                        continue
                    yv = Y[o + x]
                    ynan = math.isnan(yv)
                    cl = 0
                    for r in range(nr):
                        a = x + runs[r, 2]
                        L = runs[r, 3] - runs[r, 2]
                        rb = RB[r]
                        c0 = tx[a]
                        ce = 0
                        if L >= 8 and rb >= 0 and c0 >= 0 and tx[a + L - 1] - c0 == L - 1:
                            Xs = X[rb + c0:rb + c0 + L]
                            for u in range(L):
                                v = Xs[u]
                                vn = math.isnan(v)
                                cl += (v < yv) | (ynan & (not vn))
                                ce += (v == yv) | (ynan & vn)
                        else:
                            for u in range(L):
                                c = tx[a + u]
                                v = cval if rb < 0 or c < 0 else X[rb + c]
                                cl += _lt(v, yv)
                                ce += _eq(v, yv)
                        CE[r] = ce
                    j = rank - cl
                    if j < 0:
                        continue
                    for r in range(nr):
                        if j < CE[r]:
                            a = x + runs[r, 2]
                            rb = RB[r]
                            for u in range(runs[r, 3] - runs[r, 2]):
                                c = tx[a + u]
                                v = cval if rb < 0 or c < 0 else X[rb + c]
                                if _eq(v, yv):
                                    if j == 0:
                                        if AB[r] >= 0 and c >= 0:
                                            A[AB[r] + c] += g
                                        break
                                    j -= 1
                            break
                        j -= CE[r]


@njit(**_JIT)
def _k_merge(A, Bf, G, ty, it0, it1):
    """Fold the banded backward's private buffers into ``A``; items are planes."""
    D, H, W, BH, nb, RH = G[1], G[2], G[3], G[6], G[7], G[9]
    for n in range(it0, it1):
        for b in range(nb):
            it = n * nb + b
            y0 = b * BH
            rh = min(H, y0 + BH) - y0 + RH - BH
            for z in range(D):
                for py in range(rh):
                    sy = ty[y0 + py]
                    if sy < 0:
                        continue
                    s = ((it * D + z) * RH + py) * W
                    d = ((n * D + z) * H + sy) * W
                    for x in range(W):
                        A[d + x] += Bf[s + x]
