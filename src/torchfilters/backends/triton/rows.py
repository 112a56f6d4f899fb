"""Row-streaming kernel for separable stencils: every row loaded once, as aligned vectors.

The kernel of the common filters (``sobel``/``prewitt``/``scharr``/central gradients and
their magnitude or direction, Gaussian blur and its derivatives, selective blur with a
separable blur) when the input's rows are contiguous and their starts aligned:

* **Tiles.**  The planes are stacked into one tall image and cut into *strips* of ``BH`` rows
  (a plane of up to 64 rows is one strip; taller ones are cut evenly into strips of at most 32
  rows).  A program
  owns ``BP`` strips (several small planes at once: full lanes) and ``NQ`` chunks of ``VEC``
  columns.  ``VEC`` is the widest vector (up to 16 bytes) that the row starts are aligned to, so
  each chunk is one ``LDG.128`` / ``LDG.64``; the host checks the alignment and passes the
  strides in units of ``VEC`` so that Triton can prove it.
* **Streaming.**  A program walks its strips' rows from the top halo to the bottom halo.  Each
  row is loaded once: its chunk, plus the ``LX``/``HX`` columns left and right of the chunk
  (folded columns: they are computed once per program).  The horizontal pass runs on the
  thread's registers (``tl.split``/``tl.join`` of the in-thread vector cost nothing); the
  vertical pass on a window of the last ``LY + HY + 1`` rows, which slides down the strip in
  registers (a runtime loop: the kernel's size does not grow with the strip).  Row folding is
  per strip, not per element.
* **Constants.**  Taps, offsets, the summation order, modes and the epilogue are constexprs
  (the spec is already a constant): no weight table is loaded, no parameter table is uploaded
  per call, so a launch allocates nothing but its output (safe under CUDA-graph capture).
* **Numerics.**  Each pass is summed in SciPy's order (:func:`.._lowering.pass_entries`); in
  float64 every product is rounded before its sum (``enable_fp_fusion=False``: SciPy's bits), in
  float32 each term is added by an explicit ``tl.fma`` (the interpreter's is exact too, so the
  bits agree with the GPU's); in ``constant`` mode the
  second pass reads ``cval`` outside the image, as SciPy's sequential 1-D passes do.  Float32
  to bfloat16 is rounded to nearest even by integer arithmetic (:func:`_to_out`), the same
  bits in the interpreter and on the GPU.

The host side (:func:`plan`) turns a spec into these constexprs, or returns None where the
general footprint kernel (:mod:`.footprint`) must run: dense stencils, more than two stencils,
normalized selective blur, large radii, unaligned or strided rows.
"""

from __future__ import annotations

import math
import struct
import threading
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..._spec import BlurSpec, FilterSpec, zero_signs
from .._lowering import lower, pass_entries
from .plan import _MODES, _np2, single_fold
from .prims import _any, _atan2, _fold, _item, _mag_bad, _mag_scaled, _sqrt

#: the largest reach of a pass along the columns / rows handled here
_MAX_REACH = 8
#: rows a strip has at most: a whole plane up to _MAX_BH rows, else strips of _MAX_BH_TALL, or up
#: to 4x that for long vertical passes (a tall strip keeps the halo rows' share small; more strips
#: keep a large image's programs many): :func:`strip_rows`
_MAX_BH = 64
_MAX_BH_TALL = 32
#: windows of up to this many rows advance that many rows a loop step (the window turns over
#: without register copies); longer ones a row or two a step (:func:`_unroll`: their unrolled
#: bodies compile slowly)
_UNROLL_ROWS = 3

# epilogues (as the footprint kernels': stack, magnitude, direction, selective-blur blend)
_STACK, _MAG, _DIR, _BLEND = 0, 1, 2, 3


# ============================================================================ device code


@triton.jit
def _split(c, VEC: tl.constexpr):
    """``[BP, NQ, VEC]`` -> the ``VEC`` columns, each ``[BP, NQ]`` (in-thread: no data moves)."""
    BP: tl.constexpr = c.shape[0]
    NQ: tl.constexpr = c.shape[1]
    if VEC == 1:
        return (tl.reshape(c, (BP, NQ)),)
    elif VEC == 2:
        a, b = tl.split(c)
        return (a, b)
    elif VEC == 4:
        a, b = tl.split(tl.reshape(c, (BP, NQ, 2, 2)))
        a0, a1 = tl.split(a)
        b0, b1 = tl.split(b)
        return (a0, b0, a1, b1)
    else:
        a, b = tl.split(tl.reshape(c, (BP, NQ, 4, 2)))
        a, c_ = tl.split(tl.reshape(a, (BP, NQ, 2, 2)))
        a0, a1 = tl.split(a)
        a2, a3 = tl.split(c_)
        b, d = tl.split(tl.reshape(b, (BP, NQ, 2, 2)))
        b0, b1 = tl.split(b)
        b2, b3 = tl.split(d)
        return (a0, b0, a2, b2, a1, b1, a3, b3)


@triton.jit
def _join(t, VEC: tl.constexpr):
    """The inverse of :func:`_split`."""
    BP: tl.constexpr = t[0].shape[0]
    NQ: tl.constexpr = t[0].shape[1]
    if VEC == 1:
        return tl.reshape(t[0], (BP, NQ, 1))
    elif VEC == 2:
        return tl.join(t[0], t[1])
    elif VEC == 4:
        return tl.reshape(tl.join(tl.join(t[0], t[2]), tl.join(t[1], t[3])), (BP, NQ, 4))
    else:
        ev = tl.reshape(tl.join(tl.join(t[0], t[4]), tl.join(t[2], t[6])), (BP, NQ, 4))
        od = tl.reshape(tl.join(tl.join(t[1], t[5]), tl.join(t[3], t[7])), (BP, NQ, 4))
        return tl.reshape(tl.join(ev, od), (BP, NQ, 8))


@triton.jit
def _pass(vals, base: tl.constexpr, P: tl.constexpr, ACC: tl.constexpr):
    """One 1-D pass at one sample: ``vals[base + offset]`` summed in SciPy's order.

    ``P = (axis, kind, offsets, weights, n)`` (:func:`_pass_entries`): general passes are
    ``w_0 v_0 + w_1 v_1 + ...``; (anti)symmetric ones ``w_c v_c + (v_l +- v_r) w_l + ...``.
    Float64 rounds each product (SciPy's bits); float32 adds each term with a fused multiply-add
    (a third fewer instructions, one rounding less per term).
    """
    KIND: tl.constexpr = P[1]
    OFF: tl.constexpr = P[2]
    WS: tl.constexpr = P[3]
    N: tl.constexpr = P[4]
    acc = vals[base + OFF[0]] * tl.full((), WS[0], ACC)
    for t in tl.static_range(1, N, 1 if KIND == 0 else 2):
        if KIND == 0:
            v = vals[base + OFF[t]]
        elif KIND == 1:
            v = vals[base + OFF[t]] + vals[base + OFF[t + 1]]
        else:
            v = vals[base + OFF[t]] - vals[base + OFF[t + 1]]
        if ACC == tl.float64:  # SciPy's bits: every product rounded before its sum
            acc = acc + v * tl.full((), WS[t], ACC)
        else:  # one rounding per term (tl.fma: the same bits in the interpreter and on the GPU)
            acc = tl.fma(v, tl.full((), WS[t], ACC), acc)
    return acc


@triton.jit
def _mid(row, LX: tl.constexpr, VEC: tl.constexpr):
    """The chunk's own ``VEC`` columns of a loaded row."""
    out = ()
    for k in tl.static_range(VEC):
        out = out + (row[LX + k],)
    return out


@triton.jit
def _column(hist, i: tl.constexpr, j: tl.constexpr):
    """Column ``j`` of the rows ``hist[i:]`` (a tuple, for :func:`_pass` along the rows)."""
    out = ()
    for k in tl.static_range(i, len(hist)):
        out = out + (hist[k][j],)
    return out


@triton.jit
def _stencil_row(hist, hh, o: tl.constexpr, ST: tl.constexpr, LX: tl.constexpr, HX: tl.constexpr,
                 LY: tl.constexpr, VEC: tl.constexpr, okx, cval, MODE: tl.constexpr, ACC: tl.constexpr):
    """Output row ``o`` of one stencil, a tuple of ``VEC`` columns.

    ``hist``: the loaded rows (each ``LX + VEC + HX`` columns); ``hh``: per row, the first
    (horizontal) pass for stencils of order 3.  ``ST = (order, pass 1, pass 2)``: order 0 the
    identity, 1 horizontal, 2 vertical, 3 horizontal then vertical, 4 vertical then horizontal
    (whose ``ST[3:5]`` are the first and last columns of ``hist`` that the second pass reads).
    """
    ORDER: tl.constexpr = ST[0]
    out = ()
    if ORDER == 0:
        for k in tl.static_range(VEC):
            out = out + (hist[o + LY][LX + k],)
    elif ORDER == 1:
        for k in tl.static_range(VEC):
            out = out + (_pass(hist[o + LY], LX + k, _item(ST, 1), ACC),)
    elif ORDER == 2:
        for k in tl.static_range(VEC):
            out = out + (_pass(_column(hist, o, LX + k), LY, _item(ST, 1), ACC),)
    elif ORDER == 3:
        for k in tl.static_range(VEC):
            out = out + (_pass(_column(hh, o, k), LY, _item(ST, 2), ACC),)
    else:  # vertical at every column the horizontal pass reads, then horizontal
        P2: tl.constexpr = _item(ST, 2)
        JLO: tl.constexpr = ST[3]
        JHI: tl.constexpr = ST[4]
        v = ()
        for j in tl.static_range(LX + VEC + HX):
            if (j >= JLO) and (j <= JHI):
                s = _pass(_column(hist, o, j), LY, _item(ST, 1), ACC)
                if MODE == 4:  # SciPy pads the first pass's result with cval
                    if j < LX:
                        s = tl.where(okx[LX - 1 - j], s, cval)
                    elif j >= LX + VEC:
                        s = tl.where(okx[j - VEC], s, cval)
            else:
                s = hist[0][0]  # (never read)
            v = v + (s,)
        for k in tl.static_range(VEC):
            out = out + (_pass(v, LX + k, P2, ACC),)
    return out


@triton.jit
def _h_first(row, rin, ST: tl.constexpr, LX: tl.constexpr, VEC: tl.constexpr, cval, MODE: tl.constexpr,
             ACC: tl.constexpr):
    """The horizontal first pass of an order-3 stencil on one row (``cval`` on rows outside,
    constant mode)."""
    out = ()
    if ST[0] == 3:
        for k in tl.static_range(VEC):
            h = _pass(row, LX + k, _item(ST, 1), ACC)
            if MODE == 4:
                h = tl.where(rin, h, cval)
            out = out + (h,)
    return out


@triton.jit
def _to_out(y, OT: tl.constexpr, INTERP: tl.constexpr):
    """``y`` (the compute dtype) in the output dtype, float32 to bfloat16 rounded to nearest even
    as torch rounds: the GPU's ``cvt.rn``; in the interpreter (whose cast truncates) integer
    arithmetic, NaN as a quiet NaN (the payload bits are not torch's: NaN is NaN)."""
    if OT == tl.bfloat16 and y.dtype == tl.float32 and INTERP:
        b = y.to(tl.uint32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)
        return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(OT)


@triton.jit
def _root(sq, F64: tl.constexpr, INTERP: tl.constexpr):
    """``sqrt(sq)`` correctly rounded, for ``sq`` outside ``(0, 2**-100)`` and finite (others are
    rescued: :func:`_sweep`).  On the GPU the float32 root is the branch-free fast path of
    ``sqrt.rn.f32`` (an ``rsqrt`` estimate and one FMA correction, exact on that range); the
    interpreter, which does not fuse FMAs, takes ``sqrt_rn`` itself."""
    if F64:
        return tl.sqrt(sq)
    elif INTERP:
        return tl.sqrt_rn(sq)
    else:
        r = tl.math.rsqrt(tl.maximum(sq, 7.888609052210118e-31))  # (2**-100: 0 gives 0 below)
        y = sq * r
        e = tl.fma(-y, y, sq)
        return tl.fma(e, r * 0.5, y)


@triton.jit
def _from_bits(b, ACC: tl.constexpr):
    """The float64 whose bits are the integer ``b``, in ``ACC`` (rounded to nearest)."""
    return b.to(tl.int64).to(tl.float64, bitcast=True).to(ACC)


@triton.jit
def _off_root(sq, y0, y1, F64: tl.constexpr):
    """Where the sum of squares ``sq`` of ``y0``, ``y1`` is outside :func:`_root`'s range: overflow
    (inf), or below 2**-100 while a component is not 0 (an exact 0 stays on the fast path)."""
    if F64:
        low = 1.0020841800044864e-292  # (2**-970: any bound at or above DBL_MIN is exact)
    else:
        low = 7.888609052210118e-31
    return (sq == float("inf")) | ((sq < low) & ((tl.abs(y0) + tl.abs(y1)) > 0))


@triton.jit
def _drop(t):
    """``t`` without its first element (the window's oldest row)."""
    out = ()
    for k in tl.static_range(1, len(t)):
        out = out + (t[k],)
    return out


@triton.jit
def _load_row(x_ptr, xb, x_sh, r, sok, cols, cok, fl, fr, okx, H, cval, MODE: tl.constexpr, SY: tl.constexpr,
              ACC: tl.constexpr, LX: tl.constexpr, HX: tl.constexpr, VEC: tl.constexpr):
    """Row ``r`` of every strip (folded): the ``LX`` columns left of each chunk, its ``VEC``
    columns (one vector load), the ``HX`` right of it; ``cval`` outside (constant mode)."""
    rf = _fold(r, H, MODE, SY)
    rin = (r >= 0) & (r < H)
    ok = sok & rin if MODE == 4 else sok
    rb = xb + rf.to(xb.dtype) * (x_sh * VEC)  # (int32 offsets unless a tensor needs int64: I64)
    v = tl.load(x_ptr + rb[:, :, None] + cols, mask=(ok & cok)[:, :, None],
                other=0.0).to(ACC)
    if MODE == 4:
        v = tl.where(rin[:, :, None], v, cval)
    mid = _split(v, VEC)
    left = ()
    for k in tl.static_range(LX):
        e = tl.load(x_ptr + rb + fl[LX - 1 - k], mask=ok & cok,
                    other=0.0).to(ACC)
        if MODE == 4:
            e = tl.where(rin & okx[LX - 1 - k], e, cval)
        left = left + (e,)
    right = ()
    for k in tl.static_range(HX):
        e = tl.load(x_ptr + rb + fr[k], mask=ok & cok, other=0.0).to(ACC)
        if MODE == 4:
            e = tl.where(rin & okx[LX + k], e, cval)
        right = right + (e,)
    return left + mid + right, rin


@triton.jit
def _sweep(x_ptr, xb, m_ptr, mb, o_ptr, ob, o_sk, x_sh, m_sh, o_sh, sok, r0, BH, c0, cok, cols, fl, fr, okx,
           H, W, cval, thr, by0, by1, bx0, bx1,
           MODE: tl.constexpr, SY: tl.constexpr, ACC: tl.constexpr, F64: tl.constexpr, EPI: tl.constexpr,
           K: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, HAS_MASK: tl.constexpr,
           KEEP_BORDER: tl.constexpr, LX: tl.constexpr, HX: tl.constexpr, LY: tl.constexpr, HY: tl.constexpr,
           VEC: tl.constexpr, UNR: tl.constexpr, INTERP: tl.constexpr, RESCUE: tl.constexpr,
           WHOLE: tl.constexpr):
    """The strips' ``BH`` rows: a window of the last ``LY + HY + 1`` rows slides down (a loop
    with the window in registers; the halo above is loaded first), and each output row is
    stored as soon as its rows are in.  Returns where the magnitude's sum of squares left the
    root's range; with ``RESCUE`` (a second sweep, rare) stores the exact magnitude there."""
    OT: tl.constexpr = o_ptr.dtype.element_ty
    win = ()
    hw0 = ()
    hw1 = ()
    for i in tl.static_range(-LY, HY):
        row, rin = _load_row(x_ptr, xb, x_sh, r0 + i, sok, cols, cok, fl, fr, okx, H, cval, MODE, SY, ACC, LX,
                             HX, VEC)
        win = win + (row,)
        hw0 = hw0 + (_h_first(row, rin, S0, LX, VEC, cval, MODE, ACC),)
        if K == 2:
            hw1 = hw1 + (_h_first(row, rin, S1, LX, VEC, cval, MODE, ACC),)
    bad_any = (cols < 0) & sok[:, :, None]  # all false, the tile's shape
    for o0 in range(0, BH, UNR):  # UNR rows a step: the window turns over without copies
        for u in tl.static_range(UNR):
            o = o0 + u
            row, rin = _load_row(x_ptr, xb, x_sh, r0 + o + HY, sok, cols, cok, fl, fr, okx, H, cval, MODE, SY, ACC,
                                 LX, HX, VEC)
            full = win + (row,)  # rows o - LY .. o + HY
            h0 = hw0 + (_h_first(row, rin, S0, LX, VEC, cval, MODE, ACC),)
            y0 = _join(_stencil_row(full, h0, 0, S0, LX, HX, LY, VEC, okx, cval, MODE, ACC), VEC)
            if K == 2:
                h1 = hw1 + (_h_first(row, rin, S1, LX, VEC, cval, MODE, ACC),)
                y1 = _join(_stencil_row(full, h1, 0, S1, LX, HX, LY, VEC, okx, cval, MODE, ACC), VEC)
                hw1 = _drop(h1)
            else:
                y1 = y0
            ro = r0 + o
            if WHOLE:  # (one strip a plane: BH == H, r0 == 0)
                smask = (sok & cok & (ro < BH))[:, :, None]
            else:
                smask = (sok & cok & (ro < H) & (ro < r0 + BH))[:, :, None]
            optr = o_ptr + (ob + ro.to(ob.dtype) * (o_sh * VEC))[:, :, None] + cols
            if EPI == 0:
                tl.store(optr, _to_out(y0, OT, INTERP), mask=smask)
                if K == 2:
                    tl.store(optr + o_sk.to(ob.dtype) * VEC, _to_out(y1, OT, INTERP), mask=smask)
            elif EPI == 1:
                sq = y0 * y0
                if K == 2:
                    sq += y1 * y1
                edge = _off_root(sq, y0, y1, F64)
                if RESCUE:  # SciPy's rescaling where the sum is inf or subnormal, else the root
                    bad = _mag_bad(sq, y0, y1, y1, K, F64)
                    m, mm, t0, t1, q = _mag_scaled(y0, y1, y1, bad, K, F64)
                    r = tl.where(bad, tl.where(m == float("inf"), m, mm * q), _sqrt(sq, F64))
                    tl.store(optr, _to_out(r, OT, INTERP), mask=smask & edge)
                else:
                    tl.store(optr, _to_out(_root(sq, F64, INTERP), OT, INTERP), mask=smask)
                    bad_any = bad_any | edge
            elif EPI == 2:
                tl.store(optr, _to_out(_atan2(y0, y1, F64), OT, INTERP), mask=smask)
            else:  # selective blur: blur where selected (and outside a kept border), else x
                xv = _join(_mid(full[LY], LX, VEC), VEC)
                if HAS_MASK:
                    mptr = m_ptr + (mb + ro.to(mb.dtype) * (m_sh * VEC))[:, :, None] + cols
                    w = tl.load(mptr, mask=smask, other=0) != 0
                else:
                    w = xv >= thr
                if KEEP_BORDER:
                    rk = (ro + by0 >= 0) & (ro + by1 <= H - 1)
                    ck = (cols + bx0 >= 0) & (cols + bx1 <= W - 1)
                    w = w & rk[:, :, None] & ck
                tl.store(optr, _to_out(tl.where(w, y0, xv), OT, INTERP), mask=smask)
            win = _drop(full)
            hw0 = _drop(h0)
    return bad_any


@triton.jit
def _tile(NS, n_strips, n_tq, BH, W, BP: tl.constexpr, NQ: tl.constexpr, NC: tl.constexpr, SPP: tl.constexpr,
          VEC: tl.constexpr):
    """The program's ``[BP, NQ]`` lanes: ``(sok, plane, r0, c0, cok, cols)``, lane ``l`` chunk
    ``l % NC`` of strip ``l // NC`` (ids in int32: the host checks that they fit)."""
    pid = tl.program_id(0)
    tq = pid % n_tq
    lane = tl.arange(0, BP)[:, None] * NQ + tl.arange(0, NQ)[None, :]
    sid = (pid // n_tq) * SPP + lane // NC
    sok = (sid < NS) & (lane < SPP * NC)
    sid = tl.minimum(sid, NS - 1)
    pl = sid // n_strips
    r0 = (sid - pl * n_strips) * BH
    c0 = (tq * NC + lane % NC) * VEC
    return sok, pl, r0, c0, c0 < W, c0[:, :, None] + tl.arange(0, VEC)[None, None, :]


@triton.jit
def _plane(pl, n_inner, s_outer, s_inner, VEC: tl.constexpr, I64: tl.constexpr):
    """Element offset of planes ``pl``, strides given in units of ``VEC``: int64 where a tensor of
    the launch spans ``2**31`` elements or more (``I64``), else int32, and so every offset computed
    from it (an int64 row offset costs five instructions a row, int32 one)."""
    if I64:
        return ((pl // n_inner).to(tl.int64) * s_outer + (pl % n_inner).to(tl.int64) * s_inner) * VEC
    else:
        return ((pl // n_inner) * s_outer + (pl % n_inner) * s_inner) * VEC


@triton.jit
def _side_columns(c0, W, MODE: tl.constexpr, SX: tl.constexpr, L: tl.constexpr, R: tl.constexpr,
                  VEC: tl.constexpr):
    """``(left, right, inside)``: the ``L`` columns left and ``R`` right of each chunk, folded
    (nearest first); ``inside`` (constant mode) the left ones' flags, then the right ones'."""
    fl = ()
    okx = ()
    for k in tl.static_range(1, L + 1):
        fl = fl + (_fold(c0 - k, W, MODE, SX),)
        okx = okx + (c0 - k >= 0,)
    fr = ()
    for k in tl.static_range(1, R + 1):
        fr = fr + (_fold(c0 + VEC - 1 + k, W, MODE, SX),)
        okx = okx + (c0 + VEC - 1 + k < W,)
    return fl, fr, okx


@triton.jit(do_not_specialize=["cval_b", "thr_b", "o_sk"])
def _rows_kernel(
    x_ptr, x_ni, x_so, x_si, x_sh,
    m_ptr, m_ni, m_so, m_si, m_sh,
    o_ptr, o_ni, o_so, o_si, o_sh, o_sk,
    NS, n_strips, n_tq, BH, H, W, cval_b, thr_b, by0, by1, bx0, bx1,
    MODE: tl.constexpr, SY: tl.constexpr, SX: tl.constexpr, ACC: tl.constexpr, F64: tl.constexpr,
    EPI: tl.constexpr, K: tl.constexpr, S0: tl.constexpr, S1: tl.constexpr, HAS_MASK: tl.constexpr,
    KEEP_BORDER: tl.constexpr, LX: tl.constexpr, HX: tl.constexpr, LY: tl.constexpr, HY: tl.constexpr,
    BP: tl.constexpr, NQ: tl.constexpr, NC: tl.constexpr, SPP: tl.constexpr, VEC: tl.constexpr,
    UNR: tl.constexpr, INTERP: tl.constexpr, WHOLE: tl.constexpr, I64: tl.constexpr,
):
    """A ``[BP, NQ]`` tile of lanes, each one chunk of ``VEC`` columns of a strip of ``BH`` rows
    (strides in ``VEC`` units): lane ``l`` is chunk ``l % NC`` of strip ``l // NC``, ``SPP`` strips
    a program (``NC`` need not be a power of two: 7 chunks of a 28-wide row fill 7 lanes, not 8)."""
    cval = _from_bits(cval_b, ACC)  # (float64 bits: a float argument would be float32)
    thr = _from_bits(thr_b, ACC)
    sok, pl, r0, c0, cok, cols = _tile(NS, n_strips, n_tq, BH, W, BP, NQ, NC, SPP, VEC)
    xb = _plane(pl, x_ni, x_so, x_si, VEC, I64)
    mb = _plane(pl, m_ni, m_so, m_si, VEC, I64)
    ob = _plane(pl, o_ni, o_so, o_si, VEC, I64)
    fl, fr, okx = _side_columns(c0, W, MODE, SX, LX, HX, VEC)
    bad = _sweep(x_ptr, xb, m_ptr, mb, o_ptr, ob, o_sk, x_sh, m_sh, o_sh, sok, r0, BH, c0, cok, cols, fl, fr,
                 okx, H, W, cval, thr, by0, by1, bx0, bx1, MODE, SY, ACC, F64, EPI, K, S0, S1, HAS_MASK,
                 KEEP_BORDER, LX, HX, LY, HY, VEC, UNR, INTERP, False, WHOLE)
    if EPI == 1:
        if _any(bad):  # the magnitude over/underflowed somewhere in the tile: rescale there
            _sweep(x_ptr, xb, m_ptr, mb, o_ptr, ob, o_sk, x_sh, m_sh, o_sh, sok, r0, BH, c0, cok, cols, fl, fr,
                   okx, H, W, cval, thr, by0, by1, bx0, bx1, MODE, SY, ACC, F64, EPI, K, S0, S1, HAS_MASK,
                   KEEP_BORDER, LX, HX, LY, HY, VEC, UNR, INTERP, True, WHOLE)


# ============================================================================ host side


class RowsPlan(NamedTuple):
    ce: dict  # constexprs (BP x NQ: the lane tile)
    BP: int  # strips a program holds
    BH: int  # rows a strip has
    NQ: int  # chunks of a strip's row a program holds
    n_strips: int  # strips a plane is cut into
    n_tq: int  # programs across a row
    warps: int


def lanes(n_chunks, n_strips, threads=128):
    """``(BP, NQ, NC, SPP, n_tq, warps)``: a ``[BP, NQ]`` tile of lanes (powers of two, at most
    ``threads``) holding ``SPP`` strips of ``NC`` chunks each, any ``NC`` up to 32 (a row of 7
    chunks: 18 strips in 128 lanes, two idle, where a power-of-two row would idle 16); wider rows
    are cut into the fewest ``n_tq`` tiles of at most 32 chunks, evenly (48 chunks: two tiles of
    24, and five strips a program, where tiles of 32 and 16 idled a quarter of the lanes)."""
    n_tq = -(-n_chunks // 32)
    NC = -(-n_chunks // n_tq)
    L = max(_np2(NC), min(threads, _np2(n_strips * NC)))
    NQ = min(L, 32)
    return L // NQ, NQ, NC, L // NC, n_tq, max(1, min(4, L // 32))


def _pass_const(p):
    """``(axis, kind, offsets, weights)`` of a pass as :func:`_pass` reads it."""
    kind, ent = pass_entries(p)
    return (p.axis, kind, tuple(o for o, _ in ent), tuple(w for _, w in ent), len(ent))


def _stencil_const(st, mode, f64):
    """``(order, pass 1, pass 2[, first, last])`` (see :func:`_stencil_row`; the columns are
    relative to the chunk, :func:`_with_columns` makes them indices), or None."""
    if st.kind != "sep":
        return None
    passes = [p for p in st.passes if p.taps != (1.0,)]
    if len(passes) > 2 or (len(passes) == 2 and passes[0].axis == passes[1].axis):
        return None
    if any(p.axis not in (-1, -2) for p in passes):
        return None
    if not passes:
        return (0, (), ())
    if len(passes) == 1:
        return (1 if passes[0].axis == -1 else 2, _pass_const(passes[0]), ())
    a, b = passes
    if a.axis == -2:  # vertical first: its rows are kept at every column the second pass reads
        reach = max(abs(b.lo), abs(b.lo + len(b.taps) - 1))
        if reach > 2 and (mode == "constant" or f64):
            return None  # (float64 keeps SciPy's order of passes, and so its bits)
        if reach > 2:  # (register pressure) the same sum with the passes swapped: ~1 ulp apart
            a, b = b, a
            return (3, _pass_const(a), _pass_const(b))
        pb = _pass_const(b)
        return (4, _pass_const(a), pb, min(pb[2]), max(pb[2]))
    return (3, _pass_const(a), _pass_const(b))


def _with_columns(c, lx, vec):
    """An order-4 stencil's column range as indices into a loaded row."""
    if c[0] != 4:
        return c
    return c[:3] + (lx + c[3], lx + vec - 1 + c[4])


def _reach(consts):
    """``(LX, HX, LY, HY)``: the columns left/right and rows above/below any pass reads."""
    lx = hx = ly = hy = 0
    for c in consts:
        for p in c[1:3]:
            if p:
                lo, hi = min(p[2]), max(p[2])
                if p[0] == -1:
                    lx, hx = max(lx, -lo), max(hx, hi)
                else:
                    ly, hy = max(ly, -lo), max(hy, hi)
    return lx, hx, ly, hy


def strip_rows(H, reach=0):
    """The most rows a strip of a plane of ``H`` rows has (the strips are then made even): long
    vertical passes get taller strips (the ``2 * reach`` halo rows a strip loads and passes
    horizontally stay a small share: a quarter at most, up to reach 8)."""
    if H <= _MAX_BH:
        return H
    return _MAX_BH_TALL * min(4, max(1, reach // 2))


def _unroll(window, n_strips, BH):
    """Rows a loop step advances: the whole window if it is short (no register copies), else one,
    or two on whole small planes of even height (a long window's copies are half the loop's
    instructions there: a 28-row plane's Gaussian of sigma 2 goes from 65% to 74% of the copy
    bandwidth, its compile from 10 to 19 s; tall images keep one row a step, 78%)."""
    if window <= _UNROLL_ROWS:  # any step of at least the carried rows turns them all over: of
        # 3 to 4 rows, the one that wastes fewest rows past the strip (28 rows: 4, not 3)
        if window == 1:
            return 1
        return min(range(max(window - 1, 3), 5), key=lambda u: (-BH % u, u))
    return 2 if n_strips == 1 and BH % 2 == 0 else 1


def _bits(v) -> int:
    """A float's float64 bits as a signed integer: kernel arguments that are floats are float32
    (``cval``, ``thr`` of float64 data must not be rounded on the way in)."""
    return struct.unpack("<q", struct.pack("<d", float(v)))[0]


def _vec(elsize, *values):
    """The widest vector (elements, at most 16 bytes) that every value is a multiple of."""
    v = 16 // elsize
    while v > 1 and any(int(x) % v for x in values):
        v //= 2
    return v


_CACHE: dict = {}
_LOCK = threading.Lock()


def epilogue_of(spec, H, W, dtype, normalized=False):
    """``(lowered spec, stencils, epilogue)`` of a spec these kernels take (forward and
    :mod:`.rows_bwd`), or None: float dtypes, one mode, up to two stencils, no normalized blur."""
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return None
    spec = lower(spec, (H, W))
    if isinstance(spec, BlurSpec):
        if spec.normalized or normalized:
            return None
        stencils, epi = [spec.stencil], _BLEND
    elif isinstance(spec, FilterSpec):
        if spec.epilogue == "sum" or len(spec.stencils) > 2:
            return None
        if spec.epilogue == "direction" and len(spec.stencils) != 2:
            return None
        stencils, epi = list(spec.stencils), {"stack": _STACK, "magnitude": _MAG, "direction": _DIR}[spec.epilogue]
    else:
        return None
    if not isinstance(spec.mode, str):
        return None
    return spec, stencils, epi


def plan(spec, H, W, NP, dtype, strides, threshold, normalized=False):
    """The launch plan of ``spec`` on ``NP`` planes of ``H x W``, or None.

    ``strides``: every element stride and data pointer (in elements) the launch uses, which
    must all be multiples of the vector width."""
    taken = epilogue_of(spec, H, W, dtype, normalized)
    if taken is None:
        return None
    spec, stencils, epi = taken
    key = (spec, math.copysign(1.0, spec.cval), zero_signs(spec), H, W, min(NP, 4096), dtype)
    vec = _vec(dtype.itemsize, W, *strides)
    hit = _CACHE.get((key, vec))
    if hit is not None:
        return _fits(hit, NP)
    consts = [_stencil_const(st, spec.mode, dtype == torch.float64) for st in stencils]
    if any(c is None for c in consts):
        return None
    lx, hx, ly, hy = _reach(consts)
    if max(lx, hx, ly, hy) > _MAX_REACH:
        return None
    consts = [_with_columns(c, lx, vec) for c in consts]
    # rows per strip: the plane height split evenly into strips of at most strip_rows()
    n_strips = -(-H // strip_rows(H, max(ly, hy)))
    BH = -(-H // n_strips)
    BP, NQ, NC, SPP, n_tq, warps = lanes(-(-W // vec), NP * n_strips)
    acc = tl.float64 if dtype == torch.float64 else tl.float32
    ce = dict(
        MODE=_MODES[spec.mode],
        SY=single_fold(H, ly, hy, spec.mode), SX=single_fold(W, lx, hx, spec.mode),
        ACC=acc, F64=dtype == torch.float64,
        EPI=epi, K=len(consts), S0=consts[0], S1=consts[-1], LX=lx, HX=hx, LY=ly, HY=hy,
        BP=BP, NQ=NQ, NC=NC, SPP=SPP, VEC=vec, UNR=_unroll(ly + hy + 1, n_strips, BH), WHOLE=n_strips == 1,
    )
    p = RowsPlan(ce, SPP, BH, NC, n_strips, n_tq, warps)
    with _LOCK:  # (threads plan concurrently)
        if len(_CACHE) > 512:
            _CACHE.pop(next(iter(_CACHE)), None)
        _CACHE[(key, vec)] = p
    return _fits(p, NP)


def _fits(p, NP):
    """``p``, or None where strip or program ids would not fit the kernel's int32 (its offsets
    are int64 where a tensor needs it: :func:`needs_i64`)."""
    if NP * p.n_strips >= 2**31 or -(-NP * p.n_strips // p.BP) * p.n_tq >= 2**31:
        return None
    return p


def needs_i64(*tensors, k_stride=0):
    """Whether a launch on ``tensors`` needs int64 element offsets: one of them spans ``2**31``
    elements or more, counting the rows a stencil reads past the plane (constant mode computes
    their offsets before masking them) and the second output component (``k_stride``)."""
    for t in tensors:
        if t is None or t.numel() == 0:
            continue
        span = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        span += (_MAX_REACH + 1) * abs(t.stride(-2)) + abs(int(k_stride)) + t.shape[-1]
        if span >= 2**31:
            return True
    return False


def _strided(t):
    """``(n_inner, s_outer, s_inner, s_h)`` of ``t``'s planes, or None when its rows are not
    contiguous (the general kernel then runs)."""
    from .._layout import collapse_planes

    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return None
    lead = collapse_planes(t.shape[:-2], t.stride()[:-2])
    if lead is None:
        return None
    return lead + (t.stride(-2),)


def launch(kernel_plan, x, mask, out, NP, H, W, cval, thr, ext, keep_border, k_stride=0):
    """Launch :func:`_rows_kernel`; strides given in units of the vector width."""
    ce = kernel_plan.ce
    vec = ce["VEC"]
    xs = _strided(x)
    ms = _strided(mask) if mask is not None else xs
    os_ = _strided(out)

    def div(part):  # (n_inner, strides in vector units)
        return (part[0],) + tuple(int(v) // vec for v in part[1:])
    grid = (-(-NP * kernel_plan.n_strips // kernel_plan.BP) * kernel_plan.n_tq,)
    by0, by1, bx0, bx1 = ext
    _rows_kernel[grid](
        x, *div(xs), mask if mask is not None else x, *div(ms), out, *div(os_), int(k_stride) // vec,
        NP * kernel_plan.n_strips, kernel_plan.n_strips, kernel_plan.n_tq, kernel_plan.BH, H, W, _bits(cval),
        _bits(thr),
        by0, by1, bx0, bx1, **ce, HAS_MASK=mask is not None, KEEP_BORDER=keep_border,
        INTERP=type(_rows_kernel).__name__ == "InterpretedFunction", I64=needs_i64(x, mask, out, k_stride=k_stride),
        num_warps=kernel_plan.warps, enable_fp_fusion=False,
    )
