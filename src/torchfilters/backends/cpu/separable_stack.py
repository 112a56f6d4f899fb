"""**Stacks of small planes** on the symmetric separable path (``separable``): ``lanes`` planes
at once, each vector lane a plane.

On planes narrower than a vector or two (patches of 8x8 or 16x16) the row-wise kernel spends
more of its time on per-row work -- the masked tail vector, the pads, a horizontal pass of two
output vectors whose sums are one chain each -- than on the taps.  Here
a work item takes ``lanes`` planes (16 in float32) and transposes each ``lanes x lanes`` block of
their rows in registers (``_vtload``), so that the element ``(row, column)`` of all the planes is
one vector.  Both passes are then the vertical pass of ``separable._vblock`` -- eight outputs
at a time, four independent sums each half, the taps folded, no shuffles and no masked lanes --
the horizontal one on the columns of each row.  The result goes back through the transpose
(``_vtstore``).  Boundary modes are tables of row / column sources (``constant``: a vector of
``cval``; SciPy pads each pass's input, the intermediate too).

The arithmetic of each output is the row-wise kernel's, in SciPy's order (``x[i]*w[0]``, then
``(x[i-k] + x[i+k]) * w[k]`` for ``k = r .. 1``, the vertical pass first, no fused multiply-add):
the two paths give the same bits (the tests compare them, and the kernel's float64 results with
SciPy's), but for the sign of a NaN: which of two NaNs an x86 add passes on follows the operand
order LLVM chose, which no engine fixes.  Float32 only (:data:`DTYPES`).
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .prims import _JIT, _cvt, _ptr
from .separable import R, _VL, _fold1, _lanes, _vblock
from .simd import (CHEAP_MASKS, VBYTES, Vec, _check_ptr, _esize, _lane_mask, _load_masked, _store_masked, _vld, _vptr, _vsplat,
                   _vst)
from .tables import L_N, R_O, R_X, _poff

__all__ = ["stack_ok", "stack_plan", "_k_stack"]

#: the widest planes taken with AVX-512 (``CHEAP_MASKS``): from rows of 24 samples on, the
#: row-wise kernel is as fast (float32, sigma 2, one thread, per 784 samples: 8 wide 3.7 -> 1.5 us,
#: 12: 2.6 -> 1.3, 16: 1.6 -> 1.1, 20: 1.7 -> 1.3, 24: 1.4 both, 28: 1.2 -> 1.3; RESULTS-cpu.md)
_MAX_W = 20
#: without AVX-512, the row-wise kernel ends each row of a width that is not a multiple of the
#: float32 lanes in a masked vector (``vmaskmov``) in both passes; there planes up to this wide are
#: taken unless their width is such a multiple past one vector (float32, sigma 2, 2 threads, a Zen 1
#: host, stacked / row-wise time: 4 wide 0.35, 8: 0.77, 12: 0.70, 16: 1.12, 20: 0.77, 24: 1.03,
#: 28: 0.84, 32: 1.06-1.14, 40: 1.04, 44: 0.89, 50: 0.88, 57: 0.92, 63: 0.97, 64: 1.15)
_MAX_W_MASKED = 60
#: a work item's two buffers (the transposed planes, the padded intermediate) in bytes at most:
#: past the L2 cache the gain is gone (64 planes of 256 x 20: 1 MiB, 0.97-0.99 of the row-wise time)
_MAX_BYTES = 768 << 10
_MAX_R = 64
#: the dtypes taken: float64 (8 lanes) ran within 10% of the row-wise kernel either way
DTYPES = (torch.float32,)

# plan layout (int64 P): header, then the row sources (nblk*R + 2*rv entries: source row or -1)
# and the column sources of a padded intermediate row (W + 2*rh + R entries)
K_H, K_W, K_RV, K_RH, K_NBLK, K_ROWT, K_COLT = range(7)
K_HDR = 7


def _width_ok(W):
    """Whether planes ``W`` wide pay stacked (:data:`_MAX_W`, :data:`_MAX_W_MASKED`)."""
    if CHEAP_MASKS:
        return 1 <= W <= _MAX_W
    f32 = VBYTES // 4
    return 1 <= W <= f32 or (W % f32 != 0 and W <= _MAX_W_MASKED)


def stack_ok(info, H, W, N, dtype):
    """Whether ``N`` planes of ``H x W`` of ``dtype`` run here with ``sep_info``'s ``info``: narrow
    planes, radii of at most ``_MAX_R``, buffers of at most ``_MAX_BYTES``, and groups of planes
    at least four-fifths full (a last group of one plane costs a whole group)."""
    if dtype not in DTYPES or not _width_ok(W) or len(info[0]) > _MAX_R + 1 or len(info[1]) > _MAX_R + 1:
        return False
    lanes = _lanes(dtype.itemsize)
    rh = len(info[1]) - 1
    return H * (2 * W + 2 * rh + R) * VBYTES <= _MAX_BYTES and 4 * -(-N // lanes) * lanes <= 5 * N


_plan_cache: dict = {}


def stack_plan(info, H, W):
    """``(P, F)`` of ``sep_info``'s ``info`` on ``H x W`` planes (cached by identity)."""
    key = (id(info), H, W)
    hit = _plan_cache.get(key)
    if hit is not None and hit[0] is info:
        return hit[1]
    wv, wh, mode, cval = info
    rv, rh = len(wv) - 1, len(wh) - 1
    nblk = -(-H // R)
    rows = [_fold1(H, m - rv, mode) for m in range(nblk * R + 2 * rv)]
    cols = [_fold1(W, m - rh, mode) for m in range(W + 2 * rh + R)]
    hdr = [H, W, rv, rh, nblk, K_HDR, K_HDR + len(rows)]
    P = np.asarray(hdr + rows + cols, np.int64)
    F = np.asarray([cval] + list(wv) + list(wh), np.float64)
    if len(_plan_cache) > 1024:
        _plan_cache.clear()
    _plan_cache[key] = (info, (P, F))
    return P, F


# =============================================================================
# transposes


def _transpose(builder, vecs):
    """``vecs[i][l] -> out[l][i]`` for ``n`` vectors of ``n`` lanes: log2(n) stages of two-input
    constant shuffles (butterflies of blocks of 1, 2, 4, ... lanes)."""
    n = len(vecs)
    i32v = ir.VectorType(ir.IntType(32), n)
    b = 1
    while b < n:
        lo = ir.Constant(i32v, [lane if not lane & b else n + lane - b for lane in range(n)])
        hi = ir.Constant(i32v, [lane + b if not lane & b else n + lane for lane in range(n)])
        new = list(vecs)
        for i in range(n):
            if i & b:
                continue
            j = i | b
            new[i] = builder.shuffle_vector(vecs[i], vecs[j], lo)
            new[j] = builder.shuffle_vector(vecs[i], vecs[j], hi)
        vecs = new
        b <<= 1
    return vecs


def _plane_mask(builder, lanes_mask, p, npl):
    """``lanes_mask`` where plane ``p < npl``, else no lane."""
    ok = builder.icmp_signed("<", ir.Constant(npl.type, p), npl)
    return builder.select(ok, lanes_mask, ir.Constant(lanes_mask.type, None))


def _vtype(context, ptr_type):
    """The vector type of a float32 / float64 pointer's elements (``simd.Vec``)."""
    return context.get_value_type(Vec(ptr_type.dtype))


def _plane_io(builder, vt, base, offs, d, p, lm, npl):
    """Plane ``p``'s vector pointer ``base + offs[p] + d`` and its lane mask (``lm`` where
    ``p < npl``)."""
    off = builder.load(builder.gep(offs, [ir.Constant(ir.IntType(64), p)]))
    return _vptr(builder, base, builder.add(off, d), vt), _plane_mask(builder, lm, p, npl)


def _make_transpose(to_planes):
    """The transpose of ``lanes`` vectors between the planes and a buffer of vectors, either way:
    ``f(dst, d0, src, s0, offs, npl, n)``.

    * into the buffer (``to_planes`` false, :data:`_vtload`): vector ``c`` at
      ``dst[d0 + c*lanes]`` (``c < lanes``) holds column ``c`` of ``src[offs[p] + s0 .. + n)`` in
      lane ``p`` (planes ``p >= npl`` and columns ``>= n`` read as 0; their memory is not touched);
    * back to the planes (:data:`_vtstore`): ``dst[offs[p] + d0 .. + n)`` (planes ``p < npl``)
      gets lane ``p`` of the vectors at ``src[s0 + c*lanes]``, ``c < n`` (nothing else is written).
    """

    @intrinsic
    def transpose(typingctx, dst, d0, src, s0, offs, npl, n):
        _check_ptr(dst)
        _check_ptr(src)

        def codegen(context, builder, sig, args):
            dp, dd0, sp, ss0, op, np_, nn = args
            vt = _vtype(context, sig.args[0])
            k = vt.count
            lm = _lane_mask(builder, nn, k)

            def vec(base, i, c):  # the buffer's vector c
                return _vptr(builder, base, builder.add(i, ir.Constant(i.type, c * k)), vt)

            # (a plane whose every lane is wanted takes a plain access where masks are slow)
            whole = builder.icmp_signed(">=", nn, ir.Constant(nn.type, k))

            def plain(p):  # plane p wants every lane
                return lambda: builder.and_(whole, builder.icmp_signed("<", ir.Constant(np_.type, p), np_))

            if to_planes:
                vecs = [builder.load(vec(sp, ss0, c), align=_esize(vt)) for c in range(k)]
            else:
                vecs = []
                for p in range(k):
                    ptr, m = _plane_io(builder, vt, sp, op, ss0, p, lm, np_)
                    vecs.append(_load_masked(builder, ptr, vt, m, plain(p)))
            vecs = _transpose(builder, vecs)
            if to_planes:
                for p, v in enumerate(vecs):
                    ptr, m = _plane_io(builder, vt, dp, op, dd0, p, lm, np_)
                    _store_masked(builder, v, ptr, m, plain(p))
            else:
                for c, v in enumerate(vecs):
                    builder.store(v, vec(dp, dd0, c), align=_esize(vt))
            return context.get_dummy_value()

        return types.void(dst, d0, src, s0, offs, npl, n), codegen

    return transpose


_vtload = _make_transpose(False)
_vtstore = _make_transpose(True)


# =============================================================================
# the kernel


@njit(**_JIT)
def _k_stack(xa, oa, carrier, Pa, Fa, La, it0, it1):
    """Work items ``it0 .. it1``: item ``g`` filters planes ``g*lanes .. (g+1)*lanes`` (fewer in the
    last) with the stack plan ``Pa`` / ``Fa`` (:func:`stack_plan`); unit column strides."""
    x = _ptr(xa, carrier)
    o = _ptr(oa, carrier)
    Fc = _cvt(carrier, Fa)
    fz = Fc[0]
    P = _ptr(Pa.ctypes.data, Pa[0])
    Lp = _ptr(La.ctypes.data, La[0])
    isz = Fc.itemsize
    H = P[K_H]
    W = P[K_W]
    rv = P[K_RV]
    rh = P[K_RH]
    nblk = P[K_NBLK]
    rowt = P[K_ROWT]
    colt = P[K_COLT]
    L = _VL(fz)
    wv = _ptr(Fc.ctypes.data + isz, fz)
    wh = _ptr(Fc.ctypes.data + (rv + 2) * isz, fz)
    cv = _vsplat(_ptr(Fc.ctypes.data, fz), 0)
    xsH = La[R_X + 4]
    osH = La[R_O + 4]
    WP = W + 2 * rh + R  # a padded intermediate row, in vectors (R: a last block's overrun)
    BS = WP * L
    # A: the transposed input (H rows of W vectors), then the output of the horizontal pass;
    # B: the vertical pass's result, padded rows; C: a row of cval vectors (constant mode)
    abuf = np.empty((H * W + R + L) * L, Fc.dtype)
    A = _ptr(abuf.ctypes.data, fz)
    bbuf = np.zeros((nblk * R + 1) * BS, Fc.dtype)  # (zeros: a last block's overrun reads the tail)
    B = _ptr(bbuf.ctypes.data, fz)
    cbuf = np.empty((W + L) * L, Fc.dtype)
    C = _ptr(cbuf.ctypes.data, fz)
    for j in range(W + L):
        _vst(C, j * L, cv)
    nrow = nblk * R + 2 * rv
    rbuf = np.empty(nrow, np.int64)  # the vertical pass's source rows (addresses)
    for m in range(nrow):
        src = P[rowt + m]
        rbuf[m] = cbuf.ctypes.data if src < 0 else abuf.ctypes.data + src * W * L * isz
    RV = _ptr(rbuf.ctypes.data, rbuf[0])
    hbuf = np.empty(WP, np.int64)  # the horizontal pass's source columns, padded (row 0)
    for m in range(WP):
        hbuf[m] = bbuf.ctypes.data + m * L * isz
    RH = _ptr(hbuf.ctypes.data, hbuf[0])
    xo = np.empty(L, np.int64)
    oo = np.empty(L, np.int64)
    XO = _ptr(xo.ctypes.data, xo[0])
    OO = _ptr(oo.ctypes.data, oo[0])
    N = Lp[L_N]
    for g in range(it0, it1):
        p0 = g * L
        npl = min(L, N - p0)
        for p in range(L):
            q = p0 + min(p, npl - 1)
            xo[p] = _poff(Lp, np.int64(R_X), q)
            oo[p] = _poff(Lp, np.int64(R_O), q)
        for r in range(H):
            for c in range(0, W, L):
                _vtload(A, (r * W + c) * L, x, r * xsH + c, XO, npl, min(L, W - c))
        # vertical pass: B row t, padded column rh + c <- A's rows (folded) at column c
        for b in range(nblk):
            nr = min(R, H - b * R)
            for c in range(W):
                _vblock(B, b * R * BS + (rh + c) * L, BS, RV, b * R + rv, c * L, L, wv, rv, L, fz, nr)
        # the pads of the intermediate rows: folded columns, or cval
        for r in range(H):
            rb = r * BS
            for m in range(rh):
                src = P[colt + m]
                _vst(B, rb + m * L, cv if src < 0 else _vld(B, rb + (rh + src) * L))
            for m in range(rh + W, 2 * rh + W):
                src = P[colt + m]
                _vst(B, rb + m * L, cv if src < 0 else _vld(B, rb + (rh + src) * L))
        # horizontal pass: A row r, column c <- B row r's padded columns (eight at a time)
        for r in range(H):
            for c in range(0, W, R):
                _vblock(A, (r * W + c) * L, L, RH, c + rh, r * BS, L, wh, rh, L, fz, min(R, W - c))
        for r in range(H):
            for c in range(0, W, L):
                _vtstore(o, r * osH + c, A, (r * W + c) * L, OO, npl, min(L, W - c))
    # (numba frees an array after its last use: every buffer read through a raw pointer is used)
    return abuf.size + bbuf.size + cbuf.size + rbuf.size + hbuf.size + xo.size + oo.size + Fc.size + Pa.size
