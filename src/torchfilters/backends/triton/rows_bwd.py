"""Fused row-streaming backward of separable stencils: one launch, every row loaded once.

The adjoint of the :mod:`.rows` forward, on the same strips, chunks and aligned vector rows.
For an input-gradient row ``p`` of a strip, the kernel:

1. **Upstream term, once per padded tile.**  It computes the upstream gradient ``u_k`` of each
   stencil on row ``q = p + LY`` at the chunk's ``VEC`` columns and the ``HX``/``LX`` columns
   either side that the flipped horizontal pass reads: ``g`` for stacked stencils, ``w g`` for
   the selective-blur blend, and ``g y_k / |y|`` (magnitude) or ``g (y1, -y0) / |y|^2``
   (direction), where the stencil values ``y`` are recomputed from ``x`` by the forward's own
   code (:func:`.rows._stencil_row`) on a window of ``x`` rows that slides down the strip.
   Outside the image ``u`` is 0 (``wrap``: ``u`` at the wrapped position, whose adjoint is the
   flipped correlation itself).
2. **Flipped passes.**  The horizontal adjoint pass runs in the thread's registers on that row
   (``sum_b w_b u[c - b]``, zero taps skipped as the reference's adjoint skips them); the
   vertical one on a window of the last ``LY + HY + 1`` such rows.
3. **Border ring.**  Padded positions outside the image copy an edge pixel (reflect, mirror,
   nearest), so their adjoint adds onto that pixel.  These terms are constants of the mode: the
   host lists, per target column of a border chunk and per target row of a border strip, the
   slots and weights that add onto it (:func:`_ring`), and the kernel adds them with a select on
   "this chunk starts / ends the row" and "this is row ``t`` of the plane".  No band kernels,
   no replicated calls, no recompute that grows with the tap count.

The magnitude's root takes the forward's branch-free fast path (:func:`.rows._root`); a
block-uniform flag records where the sum of squares left its range, and a second, rare sweep of
the program then recomputes its rows with the exact rescaled formula (:func:`.footprint._u_from_y`).

The host side (:func:`plan`) returns None where the general backward kernel
(:mod:`.footprint`) must run: reach above 3, horizontal reach not below the vector width, axes
shorter than ``2 * reach + 2``, the magnitude / direction of vertical-first pairs in
``constant`` mode, normalized blur, and what :func:`.rows.plan` refuses.
"""

from __future__ import annotations

import math
import threading

import torch
import triton
import triton.language as tl

from .footprint import _u_from_y
from .plan import _MODES, single_fold
from .prims import _any, _div, _fold, _item
from ..._spec import zero_signs
from .rows import (_DIR, _MAG, RowsPlan, _bits, _drop, _fits, _from_bits, _h_first, _join, _load_row,
                   _off_root, _plane, _reach, _root, _side_columns, _stencil_const, _stencil_row, _strided, _tile,
                   _to_out, _vec, _with_columns, epilogue_of, lanes, needs_i64, strip_rows)

#: the largest reach of a pass the fused backward takes (it must also be below the vector width)
_MAX_REACH = 3


# ============================================================================ device code


@triton.jit
def _ring_sum(u, TM: tl.constexpr, ACC: tl.constexpr):
    """``sum w * u[slot]`` over the ``((slot, w), ...)`` of one ring target (``u`` a tuple)."""
    z = u[TM[0][0]] * tl.full((), TM[0][1], ACC)
    for i in tl.static_range(1, len(TM)):
        z = z + u[TM[i][0]] * tl.full((), TM[i][1], ACC)
    return z


@triton.jit
def _ring_at(acc, u, RING: tl.constexpr, k: tl.constexpr, where, ACC: tl.constexpr):
    """``acc`` plus, where ``where``, the terms of ``RING`` that target column ``k``."""
    for e in tl.static_range(len(RING)):
        if _item(RING, e, 0) == k:
            acc = acc + tl.where(where, _ring_sum(u, _item(RING, e, 1), ACC), 0.0)
    return acc


@triton.jit
def _hadj(u, TP: tl.constexpr, HX: tl.constexpr, VEC: tl.constexpr, left, right, ACC: tl.constexpr):
    """The horizontal adjoint pass at the chunk's ``VEC`` columns of one ``u`` row (``u[i]`` is
    column ``c0 - HX + i``).  ``TP = (has, offsets, weights, left ring, right ring)``; a ring is
    ``((target, ((index, weight), ...)), ...)``, added where the chunk starts (ends) the row."""
    OFF: tl.constexpr = TP[1]
    WS: tl.constexpr = TP[2]
    LR: tl.constexpr = _item(TP, 3)
    RR: tl.constexpr = _item(TP, 4)
    out = ()
    for k in tl.static_range(VEC):
        if TP[0]:
            acc = u[HX + k - OFF[0]] * tl.full((), WS[0], ACC)
            for t in tl.static_range(1, len(OFF)):
                acc = acc + u[HX + k - OFF[t]] * tl.full((), WS[t], ACC)
            acc = _ring_at(acc, u, LR, k, left, ACC)
            acc = _ring_at(acc, u, RR, k, right, ACC)
        else:
            acc = u[HX + k]
        out = out + (acc,)
    return out


@triton.jit
def _column_of(rows, k: tl.constexpr):
    out = ()
    for s in tl.static_range(len(rows)):
        out = out + (rows[s][k],)
    return out


@triton.jit
def _vadj(rows, TP: tl.constexpr, HY: tl.constexpr, VEC: tl.constexpr, ro, H, ACC: tl.constexpr):
    """The vertical adjoint pass at row ``ro`` (``rows[HY]``; ``rows[s]`` is row ``ro - HY + s``),
    a ``VEC``-tuple.  ``TP = (has, offsets, weights, top ring, bottom ring)``: rings as in
    :func:`_hadj`, their targets rows ``t`` (top) and ``H - 1 - t`` (bottom) of the plane."""
    OFF: tl.constexpr = TP[1]
    WS: tl.constexpr = TP[2]
    TR: tl.constexpr = _item(TP, 3)
    BR: tl.constexpr = _item(TP, 4)
    out = ()
    for k in tl.static_range(VEC):
        if TP[0]:
            col = _column_of(rows, k)
            acc = col[HY - OFF[0]] * tl.full((), WS[0], ACC)
            for t in tl.static_range(1, len(OFF)):
                acc = acc + col[HY - OFF[t]] * tl.full((), WS[t], ACC)
            for e in tl.static_range(len(TR)):
                acc = acc + tl.where(ro == _item(TR, e, 0), _ring_sum(col, _item(TR, e, 1), ACC), 0.0)
            for e in tl.static_range(len(BR)):
                acc = acc + tl.where(ro == H - 1 - _item(BR, e, 0), _ring_sum(col, _item(BR, e, 1), ACC), 0.0)
        else:
            acc = rows[HY][k]
        out = out + (acc,)
    return out


@triton.jit
def _first_adj(u, T: tl.constexpr, HX: tl.constexpr, VEC: tl.constexpr, left, right, ACC: tl.constexpr):
    """What the window keeps of a ``u`` row: the row itself where the vertical adjoint pass comes
    first (``T[2]``: the forward ran the horizontal pass first; the reference's adjoint runs
    the passes in reverse, and so, here, do overflows), else its horizontal adjoint pass."""
    if T[2]:
        return u
    else:
        return _hadj(u, _item(T, 0), HX, VEC, left, right, ACC)


@triton.jit
def _second_adj(rows, T: tl.constexpr, HX: tl.constexpr, HY: tl.constexpr, VEC: tl.constexpr, ro, H, left,
                right, ACC: tl.constexpr):
    """One stencil's input-gradient row from the window (see :func:`_first_adj`)."""
    if T[2]:
        return _hadj(_vadj(rows, _item(T, 1), HY, len(rows[0]), ro, H, ACC), _item(T, 0), HX, VEC, left, right, ACC)
    else:
        return _vadj(rows, _item(T, 1), HY, VEC, ro, H, ACC)


@triton.jit
def _u_row(x_ptr, xb, x_sh, g_ptr, gb, g_sh, g_sk, m_ptr, mb, m_sh, sok, q, cols, cok, fl, fr, okx, gl, gr, okg,
           ucol, uin, nob, H, W, cval, thr, by0, by1, bx0, bx1, xwin, hw0, hw1,
           MODE: tl.constexpr, SY: tl.constexpr, ACC: tl.constexpr, F64: tl.constexpr, EPI: tl.constexpr,
           K: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, HAS_MASK: tl.constexpr,
           KEEP_BORDER: tl.constexpr, LX: tl.constexpr, HX: tl.constexpr, LY: tl.constexpr, HY: tl.constexpr,
           VEC: tl.constexpr, INTERP: tl.constexpr, RESCUE: tl.constexpr):
    """The upstream gradients of row ``q`` at the ``VU = VEC + HX + LX`` columns the horizontal
    adjoint reads: ``(u0, u1, centre, xwin, hw0, hw1, edge)``.  ``centre``: the blend's
    ``(1 - w) g`` at the chunk's columns; ``edge``: where the magnitude's fast root is out of
    range (the caller then reruns with ``RESCUE``)."""
    VU: tl.constexpr = VEC + HX + LX
    A: tl.constexpr = LX + HX
    gv, qin = _load_row(g_ptr, gb, g_sh, q, sok, cols, cok, gl, gr, okg, H, cval, MODE, SY, ACC, HX, LX, VEC)
    if K == 2 and EPI == 0:
        gv1, _q = _load_row(g_ptr + g_sk.to(gb.dtype) * VEC, gb, g_sh, q, sok, cols, cok, gl, gr, okg, H, cval,
                            MODE, SY, ACC, HX, LX, VEC)
    else:
        gv1 = gv
    edge = nob  # (all false)
    centre = ()
    if EPI == 1 or EPI == 2:  # y recomputed on the window of x rows q - LY .. q + HY
        row, rin = _load_row(x_ptr, xb, x_sh, q + HY, sok, cols, cok, fl, fr, okx, H, cval, MODE, SY, ACC, A, A,
                             VEC)
        full = xwin + (row,)
        h0 = hw0 + (_h_first(row, rin, S0, LX, VU, cval, MODE, ACC),)
        y0 = _stencil_row(full, h0, 0, S0, LX, HX, LY, VU, okx, cval, MODE, ACC)
        if K == 2:
            h1 = hw1 + (_h_first(row, rin, S1, LX, VU, cval, MODE, ACC),)
            y1 = _stencil_row(full, h1, 0, S1, LX, HX, LY, VU, okx, cval, MODE, ACC)
            hw1 = _drop(h1)
        else:
            y1 = y0
        xwin = _drop(full)
        hw0 = _drop(h0)
        u0 = ()
        u1 = ()
        for i in tl.static_range(VU):
            a = y0[i]
            b = y1[i]
            if EPI == 2 or RESCUE:
                v0, v1 = _u_from_y(a, b, gv[i], EPI, K, F64)
            else:  # magnitude, fast: g y / sqrt(s), exact where s is in the root's range
                s = a * a
                if K == 2:
                    s += b * b
                zero = s == 0
                sc = tl.where(zero, 0.0, _div(gv[i], tl.where(zero, 1.0, _root(s, F64, INTERP)), F64))
                v0 = sc * a
                v1 = sc * b
                edge = edge | _off_root(s, a, b, F64)
            ok = uin[i] & qin
            if MODE != 3:
                v0 = tl.where(ok, v0, 0.0)
                v1 = tl.where(ok, v1, 0.0)
            u0 = u0 + (v0,)
            u1 = u1 + (v1,)
    elif EPI == 3:  # blend: u = w g; centre (1 - w) g
        xv, _r = _load_row(x_ptr, xb, x_sh, q, sok, cols, cok, gl, gr, okg, H, cval, MODE, SY, ACC, HX, LX, VEC)
        if HAS_MASK:
            mv, _r = _load_row(m_ptr, mb, m_sh, q, sok, cols, cok, gl, gr, okg, H, cval, MODE, SY, ACC, HX, LX,
                               VEC)
        qf = _fold(q, H, MODE, SY)
        u0 = ()
        for i in tl.static_range(VU):
            if HAS_MASK:
                w = mv[i] != 0
            else:
                w = xv[i] >= thr
            if KEEP_BORDER:
                rk = (qf + by0 >= 0) & (qf + by1 <= H - 1)
                ck = (ucol[i] + bx0 >= 0) & (ucol[i] + bx1 <= W - 1)
                w = w & rk & ck
            v = tl.where(w, gv[i], 0.0)
            if MODE != 3:
                v = tl.where(uin[i] & qin, v, 0.0)
            u0 = u0 + (v,)
            if i >= HX and i < HX + VEC:
                centre = centre + (tl.where(w, 0.0, gv[i]),)
        u1 = u0
    else:  # stacked: u = g (each stencil's own plane)
        u0 = ()
        u1 = ()
        for i in tl.static_range(VU):
            ok = uin[i] & qin
            if MODE != 3:
                u0 = u0 + (tl.where(ok, gv[i], 0.0),)
                u1 = u1 + (tl.where(ok, gv1[i], 0.0),)
            else:
                u0 = u0 + (gv[i],)
                u1 = u1 + (gv1[i],)
    return u0, u1, centre, xwin, hw0, hw1, edge


@triton.jit
def _sweep_bwd(x_ptr, xb, x_sh, g_ptr, gb, g_sh, g_sk, m_ptr, mb, m_sh, o_ptr, ob, o_sh, sok, r0, BH, cols, cok,
               fl, fr, okx, gl, gr, okg, ucol, uin, nob, left, right, H, W, cval, thr, by0, by1, bx0, bx1,
               MODE: tl.constexpr, SY: tl.constexpr, ACC: tl.constexpr, F64: tl.constexpr, EPI: tl.constexpr,
               K: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr,
               HAS_MASK: tl.constexpr, KEEP_BORDER: tl.constexpr, LX: tl.constexpr, HX: tl.constexpr,
               LY: tl.constexpr, HY: tl.constexpr, VEC: tl.constexpr, INTERP: tl.constexpr, RESCUE: tl.constexpr):
    """The strip's ``BH`` input-gradient rows (see the module docstring); returns where the fast
    root was out of range."""
    OT: tl.constexpr = o_ptr.dtype.element_ty
    VU: tl.constexpr = VEC + HX + LX
    A: tl.constexpr = LX + HX
    xwin = ()
    hw0 = ()
    hw1 = ()
    if EPI == 1 or EPI == 2:  # x rows r0 - HY - LY .. r0 - 1 (the first u row's window, less its last)
        for i in tl.static_range(LY + HY):
            row, rin = _load_row(x_ptr, xb, x_sh, r0 - HY - LY + i, sok, cols, cok, fl, fr, okx, H, cval, MODE, SY,
                                 ACC, A, A, VEC)
            xwin = xwin + (row,)
            hw0 = hw0 + (_h_first(row, rin, S0, LX, VU, cval, MODE, ACC),)
            if K == 2:
                hw1 = hw1 + (_h_first(row, rin, S1, LX, VU, cval, MODE, ACC),)
    bad = nob
    k0 = ()  # adjoint-horizontal rows r0 - HY .. r0 + LY - 1
    k1 = ()
    cw = ()  # the blend's centre terms of rows r0 .. r0 + LY - 1
    for i in tl.static_range(LY + HY):
        u0, u1, c, xwin, hw0, hw1, e = _u_row(
            x_ptr, xb, x_sh, g_ptr, gb, g_sh, g_sk, m_ptr, mb, m_sh, sok, r0 - HY + i, cols, cok, fl, fr, okx, gl,
            gr, okg, ucol, uin, nob, H, W, cval, thr, by0, by1, bx0, bx1, xwin, hw0, hw1, MODE, SY, ACC, F64, EPI, K,
            S0, S1, HAS_MASK, KEEP_BORDER, LX, HX, LY, HY, VEC, INTERP, RESCUE)
        bad = bad | e
        k0 = k0 + (_first_adj(u0, T0, HX, VEC, left, right, ACC),)
        if K == 2:
            k1 = k1 + (_first_adj(u1, T1, HX, VEC, left, right, ACC),)
        if EPI == 3 and i >= HY:
            cw = cw + (c,)
    for o in range(0, BH):
        ro = r0 + o
        u0, u1, c, xwin, hw0, hw1, e = _u_row(
            x_ptr, xb, x_sh, g_ptr, gb, g_sh, g_sk, m_ptr, mb, m_sh, sok, ro + LY, cols, cok, fl, fr, okx, gl, gr,
            okg, ucol, uin, nob, H, W, cval, thr, by0, by1, bx0, bx1, xwin, hw0, hw1, MODE, SY, ACC, F64, EPI, K, S0,
            S1, HAS_MASK, KEEP_BORDER, LX, HX, LY, HY, VEC, INTERP, RESCUE)
        bad = bad | e
        f0 = k0 + (_first_adj(u0, T0, HX, VEC, left, right, ACC),)  # rows ro - HY .. ro + LY
        gin = _second_adj(f0, T0, HX, HY, VEC, ro, H, left, right, ACC)
        k0 = _drop(f0)
        if K == 2:
            f1 = k1 + (_first_adj(u1, T1, HX, VEC, left, right, ACC),)
            g1 = _second_adj(f1, T1, HX, HY, VEC, ro, H, left, right, ACC)
            k1 = _drop(f1)
            s = ()
            for j in tl.static_range(VEC):
                s = s + (gin[j] + g1[j],)
            gin = s
        if EPI == 3:
            cf = cw + (c,)
            s = ()
            for j in tl.static_range(VEC):
                s = s + (gin[j] + cf[0][j],)
            gin = s
            cw = _drop(cf)
        smask = (sok & cok & (ro < H) & (ro < r0 + BH))[:, :, None]
        optr = o_ptr + (ob + ro.to(ob.dtype) * (o_sh * VEC))[:, :, None] + cols
        # (+ 0.0: the reference sums onto zeros, so a zero gradient is +0.0)
        tl.store(optr, _to_out(_join(gin, VEC) + 0.0, OT, INTERP), mask=smask)
    return bad


@triton.jit(do_not_specialize=["cval_b", "thr_b", "g_sk"])
def _rows_bwd_kernel(
    x_ptr, x_ni, x_so, x_si, x_sh,
    m_ptr, m_ni, m_so, m_si, m_sh,
    g_ptr, g_ni, g_so, g_si, g_sh, g_sk,
    o_ptr, o_ni, o_so, o_si, o_sh,
    NS, n_strips, n_tq, BH, H, W, cval_b, thr_b, by0, by1, bx0, bx1,
    MODE: tl.constexpr, SY: tl.constexpr, SX: tl.constexpr, ACC: tl.constexpr, F64: tl.constexpr,
    EPI: tl.constexpr, K: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, T0: tl.constexpr, T1: tl.constexpr,
    HAS_MASK: tl.constexpr, KEEP_BORDER: tl.constexpr, LX: tl.constexpr, HX: tl.constexpr, LY: tl.constexpr,
    HY: tl.constexpr, BP: tl.constexpr, NQ: tl.constexpr, NC: tl.constexpr, SPP: tl.constexpr,
    VEC: tl.constexpr, INTERP: tl.constexpr, I64: tl.constexpr,
):
    """Lanes as :func:`.rows._rows_kernel`'s: chunk ``l % NC`` of strip ``l // NC``."""
    cval = _from_bits(cval_b, ACC)  # (float64 bits: a float argument would be float32)
    thr = _from_bits(thr_b, ACC)
    sok, pl, r0, c0, cok, cols = _tile(NS, n_strips, n_tq, BH, W, BP, NQ, NC, SPP, VEC)
    xb = _plane(pl, x_ni, x_so, x_si, VEC, I64)
    mb = _plane(pl, m_ni, m_so, m_si, VEC, I64)
    gb = _plane(pl, g_ni, g_so, g_si, VEC, I64)
    ob = _plane(pl, o_ni, o_so, o_si, VEC, I64)
    A: tl.constexpr = LX + HX
    # x columns: A either side of the chunk (the stencils at the u columns); u columns: HX left,
    # LX right (the flipped horizontal pass, the nearest of the x ones); both folded once
    fl, fr, okx = _side_columns(c0, W, MODE, SX, A, A, VEC)
    gl = ()
    gr = ()
    okg = ()
    for k in tl.static_range(1, HX + 1):
        gl = gl + (fl[k - 1],)
        okg = okg + (okx[k - 1],)
    for k in tl.static_range(1, LX + 1):
        gr = gr + (fr[k - 1],)
        okg = okg + (okx[A + k - 1],)
    ucol = ()  # u column i: c0 - HX + i, folded; uin: inside the image
    uin = ()
    for i in tl.static_range(VEC + HX + LX):
        if i < HX:
            ucol = ucol + (gl[HX - 1 - i],)
        elif i < HX + VEC:
            ucol = ucol + (c0 + (i - HX),)
        else:
            ucol = ucol + (gr[i - HX - VEC],)
        uin = uin + ((c0 - HX + i >= 0) & (c0 - HX + i < W),)
    left = c0 == 0
    right = c0 + VEC == W
    nob = (c0 < 0) & sok  # all false, a row's shape [BP, NQ]
    bad = _sweep_bwd(x_ptr, xb, x_sh, g_ptr, gb, g_sh, g_sk, m_ptr, mb, m_sh, o_ptr, ob, o_sh, sok, r0, BH, cols,
                     cok, fl, fr, okx, gl, gr, okg, ucol, uin, nob, left, right, H, W, cval, thr, by0, by1, bx0, bx1,
                     MODE, SY, ACC, F64, EPI, K, S0, S1, T0, T1, HAS_MASK, KEEP_BORDER, LX, HX, LY, HY, VEC, INTERP,
                     False)
    if EPI == 1:
        if _any(bad[:, :, None]):  # the fast root left its range somewhere: the exact formula
            _sweep_bwd(x_ptr, xb, x_sh, g_ptr, gb, g_sh, g_sk, m_ptr, mb, m_sh, o_ptr, ob, o_sh, sok, r0, BH, cols,
                       cok, fl, fr, okx, gl, gr, okg, ucol, uin, nob, left, right, H, W, cval, thr, by0, by1, bx0, bx1,
                       MODE, SY, ACC, F64, EPI, K, S0, S1, T0, T1, HAS_MASK, KEEP_BORDER, LX, HX, LY, HY, VEC,
                       INTERP, True)


# ============================================================================ host side


def _target(j, n, mode):
    """Where padded position ``j`` (outside ``[0, n)``, within one reflection) folds to
    (``reference.fold_indices``' rule, in plain ints: planning allocates no tensor)."""
    if mode == "reflect":
        return -1 - j if j < 0 else 2 * n - 1 - j
    if mode == "mirror":
        return -j if j < 0 else 2 * n - 2 - j
    return 0 if j < 0 else n - 1  # nearest


def _ring(ent, mode, n, index):
    """The adjoint of one pass's padded positions, as ``(low ring, high ring)``.

    ``ent``: ``[(offset, weight)]`` (non-zero weights); ``n``: a stand-in axis length (the terms
    are the same for every long axis); ``index(pos, target)``: the register slot of sample
    ``pos`` when producing ``target``.
    Each ring is ``((target key, ((slot, weight), ...)), ...)``."""
    if mode not in ("reflect", "mirror", "nearest"):
        return (), ()
    lo = max(0, -min(o for o, _ in ent))
    hi = max(0, max(o for o, _ in ent))
    rings = []
    for js in (range(-lo, 0), range(n, n + hi)):
        by = {}
        for j in js:
            t = _target(j, n, mode)
            for o, w in ent:
                src = j - o  # the output sample whose tap o reads j
                if 0 <= src < n:
                    by.setdefault(t, []).append((index(src, t), w))
        rings.append(tuple((key, tuple(v)) for key, v in sorted(by.items())))
    return rings[0], rings[1]


def _adjoint_const(st, mode, vec, lx, hx, ly, hy):
    """``(horizontal, vertical, vertical first)`` adjoint-pass descriptors of one stencil (see
    :func:`_hadj`, :func:`_vadj`, :func:`_first_adj`), or None."""
    passes = [p for p in st.passes if p.taps != (1.0,)]
    out = {-1: (False, (), (), (), ()), -2: (False, (), (), (), ())}
    n = 64  # a stand-in length: ring terms only depend on the distance to the edge
    for p in passes:
        ent = [(p.lo + i, float(w)) for i, w in enumerate(p.taps) if w != 0.0]
        if not ent:
            return None
        off, ws = tuple(o for o, _ in ent), tuple(w for _, w in ent)
        if p.axis == -1:  # u index of column c (chunk at 0, or ending at n): c - c0 + hx
            low, high = _ring(ent, mode, n, lambda src, t: src + hx)
            high = tuple(((t - (n - vec)), tuple((i - (n - vec), w) for i, w in terms)) for t, terms in high)
            if any(not 0 <= t < vec for t, _ in low + high):
                return None
            out[-1] = (True, off, ws, low, high)
        else:  # window slot of row r when producing row t: r - t + hy
            low, high = _ring(ent, mode, n, lambda src, t: src - t + hy)
            high = tuple((n - 1 - t, terms) for t, terms in high)
            if any(not 0 <= s <= ly + hy for _, terms in low + high for s, _ in terms):
                return None
            out[-2] = (True, off, ws, low, high)
    return out[-1], out[-2], len(passes) == 2 and passes[0].axis == -1


_CACHE: dict = {}
_LOCK = threading.Lock()


def plan(spec, H, W, NP, dtype, strides):
    """The launch plan of the backward of ``spec`` on ``NP`` planes of ``H x W``, or None.

    ``strides``: every element stride and data pointer (in elements) the launch uses."""
    taken = epilogue_of(spec, H, W, dtype)
    if taken is None:
        return None
    spec, stencils, epi = taken
    vec = _vec(dtype.itemsize, W, *strides)
    key = (spec, math.copysign(1.0, spec.cval), zero_signs(spec), H, W, min(NP, 4096), dtype, vec)
    hit = _CACHE.get(key, False)
    if hit is not False:
        return hit if hit is None else _fits(hit, NP)
    p = _make(spec, stencils, epi, H, W, NP, dtype, vec)
    with _LOCK:  # (threads plan concurrently)
        if len(_CACHE) > 512:
            _CACHE.pop(next(iter(_CACHE)), None)
        _CACHE[key] = p
    return p if p is None else _fits(p, NP)


def _make(spec, stencils, epi, H, W, NP, dtype, vec):
    f64 = dtype == torch.float64
    consts = [_stencil_const(st, spec.mode, f64) for st in stencils]
    if any(c is None for c in consts):
        return None
    if spec.mode == "constant" and epi in (_MAG, _DIR) and any(c[0] == 4 for c in consts):
        return None  # (the recomputed vertical-first pass pads with cval at other columns here)
    lx, hx, ly, hy = _reach(consts)
    rx, ry = max(lx, hx), max(ly, hy)
    if max(rx, ry) > _MAX_REACH or rx >= vec or (rx and W < 2 * rx + 2) or (ry and H < 2 * ry + 2):
        return None
    adj = [_adjoint_const(st, spec.mode, vec, lx, hx, ly, hy) for st in stencils]
    if any(a is None for a in adj):  # (uneven reach: a folded term outside the window) symmetric
        lx = hx = rx
        ly = hy = ry
        adj = [_adjoint_const(st, spec.mode, vec, lx, hx, ly, hy) for st in stencils]
        if any(a is None for a in adj):
            return None
    vu = vec + lx + hx
    consts = [_with_columns(c, lx, vu) for c in consts]
    n_strips = -(-H // strip_rows(H, max(ly, hy)))
    BH = -(-H // n_strips)
    BP, NQ, NC, SPP, n_tq, warps = lanes(-(-W // vec), NP * n_strips)
    a = lx + hx
    ce = dict(
        MODE=_MODES[spec.mode],
        SY=single_fold(H, ly + hy, ly + hy, spec.mode), SX=single_fold(W, a, a, spec.mode),
        ACC=tl.float64 if f64 else tl.float32, F64=f64,
        EPI=epi, K=len(consts), S0=consts[0], S1=consts[-1], T0=adj[0], T1=adj[-1],
        LX=lx, HX=hx, LY=ly, HY=hy, BP=BP, NQ=NQ, NC=NC, SPP=SPP, VEC=vec,
    )
    return RowsPlan(ce, SPP, BH, NC, n_strips, n_tq, warps)


def launch(kernel_plan, x, mask, grad, out, NP, H, W, cval, thr, ext, keep_border, g_k_stride=0):
    """Launch :func:`_rows_bwd_kernel`; strides given in units of the vector width."""
    ce = kernel_plan.ce
    vec = ce["VEC"]

    def div(part):
        return (part[0],) + tuple(int(v) // vec for v in part[1:])
    xs = _strided(x)
    ms = _strided(mask) if mask is not None else xs
    gs = _strided(grad)
    os_ = _strided(out)
    grid = (-(-NP * kernel_plan.n_strips // kernel_plan.BP) * kernel_plan.n_tq,)
    by0, by1, bx0, bx1 = ext
    _rows_bwd_kernel[grid](
        x, *div(xs), mask if mask is not None else x, *div(ms), grad, *div(gs), int(g_k_stride) // vec,
        out, *div(os_),
        NP * kernel_plan.n_strips, kernel_plan.n_strips, kernel_plan.n_tq, kernel_plan.BH, H, W, _bits(cval),
        _bits(thr), by0, by1, bx0, bx1, **ce, HAS_MASK=mask is not None, KEEP_BORDER=keep_border,
        INTERP=type(_rows_bwd_kernel).__name__ == "InterpretedFunction",
        I64=needs_i64(x, mask, grad, out, k_stride=g_k_stride),
        num_warps=kernel_plan.warps, enable_fp_fusion=False,
    )
