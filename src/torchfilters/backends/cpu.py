"""Fused CPU engine: numba kernels, one pass forward and one pass backward.

One stencil engine runs every spec (``_spec``): operators are data.  A spec
is compiled (in Python, once per spec, image size and blocking, then cached)
into two small arrays -- ``P`` (int64: sizes, fold tables, tap offsets,
stencil descriptors, border-column lists) and ``F`` (float64: ``cval``, tap
weights, constant-mode corrections) -- that a handful of generic kernels
interpret.

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
  tile) otherwise.  ``sep`` stencils run as a vertical then a horizontal
  phase; SciPy's sequential ``constant``-mode semantics (the second pass pads
  the first pass's result with ``cval``) are restored exactly by a
  precomputed per-row/per-column correction.  ``dense`` stencils run as one
  phase.
* **Epilogue.**  ``stack`` / ``magnitude`` / ``direction`` / selective-blur
  ``blend`` / ``normalized`` combine the stencil results pointwise and store
  the output (converted back to the input dtype) once.

**Direct 3x3 path.**  Gradient-type specs -- every operator's stencils are 1-D
passes of three taps at offsets -1, 0, 1 -- in the modes that fold onto samples
(all but ``constant``) skip the tile: with contiguous rows in and out, a kernel
specialised per (stencil forms, epilogue) reads the input in place, one long
flat loop over a plane's interior rows (taps at constant flat offsets: loads,
taps, epilogue and store in one vectorised pass; columns 0 and W-1 read across
row ends there and are recomputed, or, on planes up to 64 wide in the modes
whose fold is a neighbour in the row, take the folded value per lane by a
select), the first/last rows through the row fold, the two border columns
through the column fold.  The run leaves the zero centre taps out (the
derivative taps of every operator) when an integer max over the exponent bits
of the samples it read shows them all finite, and redoes itself with them
otherwise (``x * 0`` only matters for inf and NaN); it asks for its input and
output lines a few KiB ahead, the output for writing.  It sums the taps in
the general engine's order, so both paths give the same values (signs of zero
aside; and where a Sobel-type column sum overflows next to a NaN elsewhere in
the tile, the direct path keeps SciPy's finite values where the general engine
gives NaN).  This is what brings a batch of 28x28 planes and a 4096x4096 image
near the memory floor.

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

Parallelism: the kernels release the GIL; a call is split into chunks that
``torch.get_num_threads()`` threads (the caller and a small pool) pull from a
shared counter.  (numba's ``parallel=True`` was measured: its parfor wrapper
re-optimises the whole inlined kernel and tripled the first compile.)  Tiny
calls run in the calling thread.  Each item prefetches the next one's input.
Fresh outputs of at least 1 MiB come from a small cache of NumPy buffers
(``empty_cache``): a buffer no tensor uses any more is handed to the next output
it fits, its pages already mapped (faulting in 400 MB costs ~80 ms here, more
than the filter); new ones are NumPy allocations, which advise transparent huge
pages.  They are wrapped with ``torch.from_numpy``.

Compiled code is cached on disk (``cache=True``; numba uses a user-wide cache
directory when the package directory is read-only, or ``NUMBA_CACHE_DIR``).
Kernels: filter forward/backward per epilogue (stack, magnitude, direction),
blur forward/backward, and the direct kernels per (stencil forms, epilogue),
each compiled lazily once per storage dtype.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .._spec import BlurSpec, FilterSpec
from . import reference

NAME = "cpu"
UNAVAILABLE_HINT = " (the numba engine runs CPU tensors of float16, bfloat16, float32 and float64)"

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# storage carriers: the type of the scalar selects the compiled specialisation
# (float16 is read as uint16 bits, bfloat16 as int16 bits)
_CARRIER = {
    torch.float32: np.float32(0),
    torch.float64: np.float64(0),
    torch.float16: np.uint16(0),
    torch.bfloat16: np.int16(0),
}
_NP_STORAGE = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.bfloat16: np.int16}

_JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype in _DTYPES


# =============================================================================
# numba primitives: raw pointers, dtype conversion


@intrinsic
def _ptr(typingctx, addr, carrier):
    """``int`` address -> ``CPointer(typeof(carrier))`` (no bounds or wraparound checks)."""
    ptype = types.CPointer(carrier)
    sig = ptype(types.int64, carrier)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptype))

    return sig, codegen


@intrinsic
def _bits2f(typingctx, v):
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _f2bits(typingctx, v):
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


def _exponent_mask(v):
    """(LLVM integer type, numba unsigned type, exponent mask) of float32/float64 ``v``."""
    w = v.bitwidth
    return ir.IntType(w), (types.uint32 if w == 32 else types.uint64), (0x7F800000 if w == 32 else 0x7FF0000000000000)


@intrinsic
def _expo(typingctx, v):
    """The exponent bits of a float32/float64 ``v`` as an unsigned integer of its width: equal to
    ``_expo_all(v)`` exactly when ``v`` is inf or NaN (integer max-reductions vectorise)."""
    it, ut, mask = _exponent_mask(v)

    def codegen(context, builder, signature, args):
        return builder.and_(builder.bitcast(args[0], it), ir.Constant(it, mask))

    return ut(v), codegen


@intrinsic
def _expo_all(typingctx, v):
    """The all-ones exponent of ``v``'s float type (``_expo`` of inf and NaN)."""
    it, ut, mask = _exponent_mask(v)

    def codegen(context, builder, signature, args):
        return ir.Constant(it, mask)

    return ut(v), codegen


@intrinsic
def _sel(typingctx, c, a, b):
    """``a if c else b`` as one LLVM ``select`` (no branch: it vectorises)."""
    sig = a(types.boolean, a, a)

    def codegen(context, builder, signature, args):
        cond = context.cast(builder, args[0], signature.args[0], types.boolean)
        return builder.select(cond, args[1], args[2])

    return sig, codegen


@njit(**_JIT)
def _h2f(h):
    """float16 bits -> float32, exact (integer arithmetic: no LLVM half type, whose
    conversions can lower to compiler-rt calls the JIT cannot resolve)."""
    u = np.uint32(h)
    o = (u & np.uint32(0x7FFF)) << np.uint32(13)
    e = o & np.uint32(0x0F800000)
    o += np.uint32(112 << 23)
    if e == np.uint32(0x0F800000):  # inf / nan
        o += np.uint32(112 << 23)
    elif e == np.uint32(0):  # zero / subnormal: renormalise through the FPU
        o = _f2bits(_bits2f(o + np.uint32(1 << 23)) - _bits2f(np.uint32(113 << 23)))
    return _bits2f(o | ((u & np.uint32(0x8000)) << np.uint32(16)))


@njit(**_JIT)
def _f2h(f):
    """float32 -> float16 bits, round to nearest even (F. Giesen's float_to_half_fast3_rtne)."""
    x = _f2bits(f)
    sign = x & np.uint32(0x80000000)
    x ^= sign
    if x >= np.uint32(143 << 23):  # inf, nan, or too large
        o = np.uint32(0x7E00) if x > np.uint32(0x7F800000) else np.uint32(0x7C00)
    elif x < np.uint32(113 << 23):  # subnormal or zero
        o = _f2bits(_bits2f(x) + _bits2f(np.uint32(126 << 23))) - np.uint32(126 << 23)
    else:
        o = (x + np.uint32(((15 - 127) << 23) + 0xFFF) + ((x >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
    return np.uint16(o | (sign >> np.uint32(16)))


def _prefetcher(rw):
    @intrinsic
    def prefetch(typingctx, ptr, idx):
        """Hint the cache to fetch ``ptr[idx]`` (``llvm.prefetch``; rw=1: for writing)."""
        sig = types.void(ptr, types.int64)

        def codegen(context, builder, signature, args):
            p, i = args
            addr = builder.bitcast(builder.gep(p, [i]), ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [addr, ir.Constant(i32, rw), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return sig, codegen

    return prefetch


_prefetch_r = _prefetcher(0)
_prefetch_w = _prefetcher(1)


@intrinsic
def _stream_line(typingctx, dst, di, src, si):
    """Copy the 64 bytes at ``src + si`` to ``dst + di`` (elements of the pointers' type; both
    64-byte aligned) with a non-temporal store: the line goes to memory without being read
    for ownership first and without evicting the cache's contents (``_fence`` orders it)."""
    sig = types.void(dst, types.int64, src, types.int64)

    def codegen(context, builder, signature, args):
        d, di, s, si = args
        vt = ir.VectorType(ir.IntType(64), 8)
        v = builder.load(builder.bitcast(builder.gep(s, [si]), vt.as_pointer()), align=64)
        st = builder.store(v, builder.bitcast(builder.gep(d, [di]), vt.as_pointer()), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _fence(typingctx):
    """A full memory fence (``mfence`` on x86): orders the non-temporal stores before it."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


def _ld(p, i):  # pragma: no cover - numba overload below
    raise NotImplementedError


def _st(p, i, v):  # pragma: no cover
    raise NotImplementedError


def _line(p):  # pragma: no cover
    raise NotImplementedError


@overload(_line, jit_options=dict(cache=True))
def _ol_line(p):
    """Elements of ``p``'s type in a 64-byte cache line."""
    n = 64 // p.dtype.bitwidth * 8
    return lambda p: n


def _cvt(carrier, F):  # pragma: no cover
    raise NotImplementedError


@overload(_ld, jit_options=dict(cache=True))
def _ol_ld(p, i):
    dt = p.dtype
    if dt in (types.float32, types.float64):
        return lambda p, i: p[i]
    if dt == types.uint16:  # float16 bits
        return lambda p, i: _h2f(p[i])
    if dt == types.int16:  # bfloat16 bits
        return lambda p, i: _bits2f(np.uint32(np.uint16(p[i])) << np.uint32(16))
    return None


@overload(_st, jit_options=dict(cache=True))
def _ol_st(p, i, v):
    dt = p.dtype
    if dt == types.float32:

        def st32(p, i, v):
            p[i] = np.float32(v)

        return st32
    if dt == types.float64:

        def st64(p, i, v):
            p[i] = v

        return st64
    if dt == types.uint16:

        def sth(p, i, v):
            p[i] = _f2h(np.float32(v))

        return sth
    if dt == types.int16:

        def stb(p, i, v):
            u = _f2bits(np.float32(v))
            if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                p[i] = np.int16(0x7FC0)  # quiet NaN
            else:  # round to nearest even, as torch
                p[i] = np.int16(np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)))

        return stb
    return None


@overload(_cvt, jit_options=dict(cache=True))
def _ol_cvt(carrier, F):
    """Compute-dtype copy of ``F``: float64 for float64 storage, else float32."""
    if carrier == types.float64:
        return lambda carrier, F: F.copy()
    return lambda carrier, F: F.astype(np.float32)


# =============================================================================
# plan layout (int64 array P; float64 array F)

I_H, I_W, I_K, I_EPI, I_CONST = 0, 1, 2, 3, 4
I_EYLO, I_EYHI, I_EXLO, I_EXHI = 5, 6, 7, 8
I_FH, I_FW, I_ST, I_TAPI = 9, 10, 11, 12
I_KEEPB, I_BI0, I_BI1, I_BJ0, I_BJ1 = 13, 14, 15, 16, 17
I_BR, I_NB, I_NPM, I_NBX, I_BX = 18, 19, 20, 21, 22
I_PAD, I_CW, I_NC, I_MP = 23, 24, 25, 26
I_HDR = 32
# per stencil: nV, v0, nH, h0 (two-phase: vertical then horizontal taps), nD, d0
# (one-phase taps), corr kind (0 / 1 per column / 2 per row), corr offset in F,
# number and offset of the forward border columns, and the number of non-zero
# taps of each list (they come first; the adjoint uses only those)
ST_LEN = 13

# F: [cval, 0, 1, threshold (set per call), taps..., corrections...]
F_CVAL, F_ZERO, F_ONE, F_THR, F_TAPS = 0, 1, 2, 3, 4

EPI_STACK, EPI_MAG, EPI_DIR, EPI_BLEND, EPI_NORM = 0, 1, 2, 3, 4

# L (per-call layout): per role [n1, s0, s1, sK, sH, sW]; plane p starts at
# (p // n1) * s0 + (p % n1) * s1 elements from the tensor's data pointer
R_X, R_O, R_G, R_M = 0, 6, 12, 18
L_N = 24  # number of planes
L_LEN = 25

# Buffers are flat with row stride W (no column padding), so every loop runs
# over whole blocks of rows; taps that reach across the left/right edge read a
# neighbouring row there, and those few border columns are recomputed with the
# fold table ("fix-up" columns).  A guard of ex = EXhi - EXlo elements on each
# side keeps every flat read in bounds.


@njit(**_JIT)
def _poff(L, r, p):
    n1 = L[r]
    return (p // n1) * L[r + 1] + (p % n1) * L[r + 2]


# =============================================================================
# the vector primitive: dst[d0 + q] (+)= sum_t w_t * src[s0 + q + o_t], q < n


@njit(**_JIT)
def _pass(d, d0, s, s0, n, P, Fc, t0, nt, sy, cy, sx, cx, W, acc):
    """Taps ``t0 .. t0+nt`` at flat offsets ``o = (sy*dy + cy)*W + sx*dx + cx``, four per loop;
    the first loop assigns unless ``acc``."""
    if nt == 0:
        if not acc:
            z = Fc[F_ZERO]
            for q in range(n):
                d[d0 + q] = z
        return
    ti = P[I_TAPI]
    t = 0
    while t < nt:
        g = nt - t
        if g > 4:
            g = 4
        k = t0 + t
        a0 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
        w0 = Fc[F_TAPS + k]
        if g == 1:
            if acc:
                for q in range(n):
                    d[d0 + q] += w0 * s[a0 + q]
            else:
                for q in range(n):
                    d[d0 + q] = w0 * s[a0 + q]
        else:
            k += 1
            a1 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
            w1 = Fc[F_TAPS + k]
            if g == 2:
                if acc:
                    for q in range(n):
                        d[d0 + q] += w0 * s[a0 + q] + w1 * s[a1 + q]
                else:
                    for q in range(n):
                        d[d0 + q] = w0 * s[a0 + q] + w1 * s[a1 + q]
            else:
                k += 1
                a2 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
                w2 = Fc[F_TAPS + k]
                if g == 3:
                    if acc:
                        for q in range(n):
                            d[d0 + q] += (w0 * s[a0 + q] + w1 * s[a1 + q]) + w2 * s[a2 + q]
                    else:
                        for q in range(n):
                            d[d0 + q] = (w0 * s[a0 + q] + w1 * s[a1 + q]) + w2 * s[a2 + q]
                else:
                    k += 1
                    a3 = s0 + (sy * P[ti + 2 * k] + cy) * W + sx * P[ti + 2 * k + 1] + cx
                    w3 = Fc[F_TAPS + k]
                    if acc:
                        for q in range(n):
                            d[d0 + q] += (w0 * s[a0 + q] + w1 * s[a1 + q]) + (w2 * s[a2 + q] + w3 * s[a3 + q])
                    else:
                        for q in range(n):
                            d[d0 + q] = (w0 * s[a0 + q] + w1 * s[a1 + q]) + (w2 * s[a2 + q] + w3 * s[a3 + q])
        acc = True
        t += g


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
        if nV > 0 and nH > 0:
            _pass(V, V0, S, S0, n + 2 * g, P, Fc, P[d + 1], P[d + 10] if fin else nV, ONE, -EYlo, ZERO, ZERO, Ws, NO)
            _pass(R, rk, V, V0, n, P, Fc, P[d + 3], P[d + 11] if fin else nH, ZERO, ZERO, ONE, cx, Ws, NO)
        else:
            _pass(R, rk, S, S0, n, P, Fc, P[d + 5], P[d + 12] if fin else P[d + 4], ONE, -EYlo, ONE, cx, Ws, NO)
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
        if jj >= 0:
            if t == 0:
                for r in range(ntot):
                    R[rk + r * W + j] = w * src[base + r * W]
            else:
                for r in range(ntot):
                    R[rk + r * W + j] += w * src[base + r * W]
        else:
            wf = w * fx
            if t == 0:
                for r in range(ntot):
                    R[rk + r * W + j] = wf
            else:
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
                elif epi == EPI_MAG:
                    if K == 2 and osW == 1:
                        for j in range(sl):
                            a = B[q + j]
                            b = B[q + RL + j]
                            _st(o, orow + j, math.sqrt(a * a + b * b))
                    else:
                        for j in range(sl):
                            a = B[q + j]
                            s = a * a
                            for k in range(1, K):
                                b = B[q + k * RL + j]
                                s += b * b
                            _st(o, orow + j * osW, math.sqrt(s))
                else:  # direction: atan2(y0, y1)
                    for j in range(sl):
                        _st(o, orow + j * osW, _atan2(B[q + j], B[q + RL + j]))
        return buf.size + Fa32.size + Pa.size + La.size

    return _k_filter_fwd


_K_FILTER_FWD = {e: _make_filter_fwd(e) for e in (EPI_STACK, EPI_MAG, EPI_DIR)}


# =============================================================================
# direct 3x3 path: gradient-type specs read the input in place (no tile)
#
# Every gradient operator (central, Sobel, Scharr, Prewitt) is a pair of
# stencils whose 1-D passes have three taps at offsets -1, 0, 1.  For those,
# in the boundary modes that fold onto image samples (all but ``constant``),
# the output is computed straight from the input: one long flat loop over the
# interior rows of a plane (the taps are constant flat offsets, so it
# vectorises; columns 0 and W-1 read across row ends there and are recomputed,
# or on narrow planes selected per lane: EDGE / MIRR), the first and last rows
# through the row fold, and the two border columns through the column fold.
# No tile copy, no intermediate pass buffers: about a third of the work of the
# general engine, which is what makes a batch of 28x28 planes run near the
# memory floor.  Outputs larger than the last-level cache, of wide planes, are
# written with non-temporal stores through a line buffer (``STREAM``).

D_H, D_W, D_BR, D_NB, D_MP, D_FY0, D_FY1, D_FX0, D_FX1 = range(9)
FORM_H, FORM_V, FORM_VH, ZV, ZH = 1, 2, 3, 4, 8
#: form flag: leave the zero centre taps out (``x * 0`` is +-0 for finite ``x``, so on finite
#: samples the sum changes only in the sign of a zero; run only after a finiteness check)
SKIPZ = 1 << 16
#: form flags for a run over whole rows: the lanes of column 0 / W-1 (``t`` = 1 / 2) take their
#: outer neighbour from the fold, ``EDGE`` the column itself (reflect, nearest), ``MIRR`` the
#: column on the other side (mirror): selects instead of scalar fix-ups of the border columns
EDGE, MIRR = 1 << 17, 1 << 18
#: form flag for a run into an output larger than the cache: whole output lines go through a
#: line buffer and non-temporal stores (``_stream_line``), the partial lines at its ends directly
STREAM = 1 << 19
_d3_kernels: dict = {}


@njit(inline="always", **_JIT)
def _sum3(a, b, c):
    return (a + b) + c


@njit(inline="always", **_JIT)
def _sum3_zc(a, b, c):
    """``_sum3`` with a zero centre tap ``b``: the general engine sums non-zero taps first, and
    so does the direct path (both give the same bits, up to the sign of zero)."""
    return (a + c) + b


@njit(inline="always", **_JIT)
def _sum3_skip(a, b, c):
    """``_sum3_zc`` without the zero centre term (the compiler drops its loads and products)."""
    return a + c


# The direct kernels are closures over integers only (form and epilogue codes: numba's disk
# cache keys on the closure's values, and jitted functions in it would differ per process).
# The helpers below are overloads that specialise on those integers as literals, so each
# kernel compiles only its own stencils and epilogue.


def _d3_st(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):  # pragma: no cover - overload below
    raise NotImplementedError


def _d3_lr(FORM, x, p, l, r, t):  # pragma: no cover
    raise NotImplementedError


def _d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2):  # pragma: no cover
    raise NotImplementedError


def _d3_out(EPI, K, o, oq, osK, a, b):  # pragma: no cover
    raise NotImplementedError


def _d3_pixel(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):  # pragma: no cover
    raise NotImplementedError


def _d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, a, b, T, tq, w, e):  # pragma: no cover
    raise NotImplementedError


def _d3_run(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):  # pragma: no cover
    raise NotImplementedError


def _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1):  # pragma: no cover
    raise NotImplementedError


def _literal(*codes):
    return all(isinstance(c, types.IntegerLiteral) for c in codes)


@njit(inline="always", **_JIT)
def _w_any(w, v):
    return w * v


@njit(inline="always", **_JIT)
def _w_one(w, v):
    return v


@njit(inline="always", **_JIT)
def _w_minus_one(w, v):
    return -v


@njit(inline="always", **_JIT)
def _w_two(w, v):
    return v + v


#: ``w * v`` for a tap of weight class 0 (any weight), 1 (+1), 2 (-1), 3 (+2): the classes
#: give the same bits as the product (NaN, inf and signed zeros included) without a multiply
_W_CLASS = (_w_any, _w_one, _w_minus_one, _w_two)


def _summer(f, zero_flag):
    """The 3-tap sum of one pass of form ``f``: zero centre (``zero_flag`` = ZV / ZH set) or not,
    its zero term left out under SKIPZ."""
    if not f & zero_flag:
        return _sum3
    return _sum3_skip if f & SKIPZ else _sum3_zc


def _w_class(w):
    return {1.0: 1, -1.0: 2, 2.0: 3}.get(float(w), 0)


@overload(_d3_lr)
def _ol_d3_lr(FORM, x, p, l, r, t):
    """(left, right) neighbours of flat position ``p``: ``x[p + l]``, ``x[p + r]``, or under
    ``EDGE`` / ``MIRR`` the fold's values for lanes in column 0 (``t == 1``) or W-1 (``t == 2``)."""
    if not _literal(FORM):
        return None
    f = FORM.literal_value
    if f & EDGE:

        def edge(FORM, x, p, l, r, t):
            c = _ld(x, p)
            a = _ld(x, p + l)
            b = _ld(x, p + r)
            return _sel(t == 1, c, a), _sel(t == 2, c, b)

        return edge
    if f & MIRR:

        def mirr(FORM, x, p, l, r, t):
            a = _ld(x, p + l)
            b = _ld(x, p + r)
            return _sel(t == 1, b, a), _sel(t == 2, a, b)

        return mirr
    return lambda FORM, x, p, l, r, t: (_ld(x, p + l), _ld(x, p + r))


@overload(_d3_ac)
def _ol_d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2):
    """The vertical pass on the left and right neighbour columns of ``mid`` (FORM_VH)."""
    if not _literal(FORM):
        return None
    f = FORM.literal_value
    sv = _summer(f, ZV)
    mv0, mv1, mv2 = (_W_CLASS[(f >> (4 + 2 * t)) & 3] for t in range(3))

    def ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2):
        ul, ur = _d3_lr(FORM, x, up, l, r, t)
        ml, mr = _d3_lr(FORM, x, mid, l, r, t)
        dl, dr = _d3_lr(FORM, x, dn, l, r, t)
        return sv(mv0(v0, ul), mv1(v1, ml), mv2(v2, dl)), sv(mv0(v0, ur), mv1(v1, mr), mv2(v2, dr))

    return ac


@overload(_d3_st)
def _ol_d3_st(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
    """One stencil at flat position ``mid`` (rows above/below at ``up``/``dn``, columns at
    offsets ``l``/``r``): FORM_H ``h . x[row, l/c/r]``, FORM_V ``v . x[up/mid/dn, c]``, FORM_VH
    ``h . (v . x)`` (vertical pass first, as the general engine); ``| ZV`` / ``| ZH``: the
    vertical / horizontal centre tap is 0; bits 4.. : the weight class of each tap (``_W_CLASS``).
    Every tap is multiplied, zeros too (SciPy's 1-D passes: a NaN under a 0 tap is NaN)."""
    if not _literal(FORM):
        return None
    f = FORM.literal_value
    sv, sh = _summer(f, ZV), _summer(f, ZH)
    mv0, mv1, mv2, mh0, mh1, mh2 = (_W_CLASS[(f >> (4 + 2 * t)) & 3] for t in range(6))
    if f & 3 == FORM_H:

        def h(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
            ml, mr = _d3_lr(FORM, x, mid, l, r, t)
            return sh(mh0(h0, ml), mh1(h1, _ld(x, mid)), mh2(h2, mr))

        return h
    if f & 3 == FORM_V:
        return lambda FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2: sv(
            mv0(v0, _ld(x, up)), mv1(v1, _ld(x, mid)), mv2(v2, _ld(x, dn)))

    if f & ZH and f & SKIPZ:

        def vh_skip(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
            a, c = _d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2)
            return mh0(h0, a) + mh2(h2, c)

        return vh_skip

    if f & ZH:

        def vh_zc(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
            # The zero centre tap times the centre column's vertical sum would be NaN where that
            # sum overflows; the general engine (all samples finite: zero taps skipped) and SciPy
            # (horizontal pass first) stay finite there.  Multiplying the samples instead gives
            # +-0 for finite ones and NaN for a NaN/inf: the general engine's bits on finite tiles.
            a, c = _d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2)
            b = (h1 * _ld(x, up) + h1 * _ld(x, mid)) + h1 * _ld(x, dn)
            return (mh0(h0, a) + mh2(h2, c)) + b

        return vh_zc

    def vh(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
        a, c = _d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2)
        b = sv(mv0(v0, _ld(x, up)), mv1(v1, _ld(x, mid)), mv2(v2, _ld(x, dn)))
        return sh(mh0(h0, a), mh1(h1, b), mh2(h2, c))

    return vh


@overload(_d3_out)
def _ol_d3_out(EPI, K, o, oq, osK, a, b):
    """The epilogue and the store (``b``: the second stencil, unused when ``K == 1``)."""
    if not _literal(EPI, K):
        return None
    epi, k = EPI.literal_value, K.literal_value
    if k == 1 and epi == EPI_MAG:
        return lambda EPI, K, o, oq, osK, a, b: _st(o, oq, math.sqrt(a * a))
    if k == 1:
        return lambda EPI, K, o, oq, osK, a, b: _st(o, oq, a)
    if epi == EPI_MAG:
        return lambda EPI, K, o, oq, osK, a, b: _st(o, oq, math.sqrt(a * a + b * b))
    if epi == EPI_DIR:
        return lambda EPI, K, o, oq, osK, a, b: _st(o, oq, _atan2(a, b))

    def stack(EPI, K, o, oq, osK, a, b):
        _st(o, oq, a)
        _st(o, oq + osK, b)

    return stack


@overload(_d3_pixel)
def _ol_d3_pixel(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):
    """Stencil ``F0`` (and ``F1`` if ``K == 2``) at one position, the epilogue, the store."""
    if not _literal(F0, F1, EPI, K):
        return None
    if K.literal_value == 1:

        def one(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):
            a = _d3_st(F0, x, up, mid, dn, l, r, t, w[0], w[1], w[2], w[3], w[4], w[5])
            _d3_out(EPI, K, o, oq, osK, a, a)

        return one

    def two(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):
        a = _d3_st(F0, x, up, mid, dn, l, r, t, w[0], w[1], w[2], w[3], w[4], w[5])
        b = _d3_st(F1, x, up, mid, dn, l, r, t, w[6], w[7], w[8], w[9], w[10], w[11])
        _d3_out(EPI, K, o, oq, osK, a, b)

    return two


@overload(_d3_span)
def _ol_d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, a, b, T, tq, w, e):
    """Positions ``a .. b-1`` of a run (left/right neighbours at -1/+1), stored at ``o[oq + q]``:
    the vectorised loop.  With ``SKIPZ`` in ``F0`` it returns the max of ``e`` and ``_expo``
    over the centre samples it read; with ``EDGE`` or ``MIRR``, ``T[tq + q]`` is the column
    class of position ``q`` (``_d3_lr``)."""
    if not _literal(F0, F1, EPI, K):
        return None
    check = F0.literal_value & SKIPZ
    folds = F0.literal_value & (EDGE | MIRR)

    def span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, a, b, T, tq, w, e):
        for q in range(a, b):
            t = T[tq + q] if folds else 0
            _d3_pixel(F0, F1, EPI, K, o, oq + q, osK, x, up + q, mid + q, dn + q, -1, 1, t, w)
            if check:
                e = max(e, _expo(_ld(x, mid + q)))
        return e

    return span


@overload(_d3_run)
def _ol_d3_run(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):
    """``n`` consecutive positions in chunks of a few cache lines, each first asking for the
    input and output lines further on (prefetching the output for writing overlaps its
    read-for-ownership with the work).  Returns ``_d3_span``'s ``e``.  Under ``STREAM`` each
    whole output line of the run is computed into ``bp`` (64-byte aligned, one chunk) and
    stored non-temporally; ``omis`` is ``o``'s misalignment in elements."""
    if not _literal(F0, F1, EPI, K):
        return None
    k2 = K.literal_value == 2 and EPI.literal_value == EPI_STACK
    stream = F0.literal_value & STREAM
    check = F0.literal_value & SKIPZ
    folds = F0.literal_value & (EDGE | MIRR)

    def run_stream(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):
        line = _line(x)
        ahead = _D3_AHEAD * line
        ch = _D3_STREAM_CHUNK * line
        a = min(n, (line - (omis + oq) % line) % line)  # up to the first whole line
        b = a + (n - a) // line * line  # the last whole line's end
        e = _d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, 0, a, T, tq, w, _expo(_ld(x, mid)))
        for c in range(a, b, ch):
            cb = min(c + ch, b)
            for k in range(c + ahead, c + ahead + ch, line):
                _prefetch_r(x, dn + k)
            e = _d3_span(F0, F1, EPI, K, bp, -c, osK, x, up, mid, dn, c, cb, T, tq, w, e)
            for j in range(0, cb - c, line):
                _stream_line(o, oq + c + j, bp, j)
        return _d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, b, n, T, tq, w, e)

    def run(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):
        line = _line(x)
        ahead = _D3_AHEAD * line
        ch = _D3_CHUNK * line
        e = _expo(_ld(x, mid))
        for c in range(0, n, ch):
            for k in range(c + ahead, c + ahead + ch, line):
                _prefetch_r(x, dn + k)
                _prefetch_w(o, oq + k)
                if k2:
                    _prefetch_w(o, oq + osK + k)
            # (_d3_span's loop, written out: one function less to compile per kernel, 0.4 s of
            # the first gradient_magnitude call)
            for q in range(c, min(c + ch, n)):
                t = T[tq + q] if folds else 0
                _d3_pixel(F0, F1, EPI, K, o, oq + q, osK, x, up + q, mid + q, dn + q, -1, 1, t, w)
                if check:
                    e = max(e, _expo(_ld(x, mid + q)))
        return e

    return run_stream if stream else run


@overload(_d3_row)
def _ol_d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1):
    """Row ``i`` outside the interior run: the whole row if it is the first or last (the row
    fold), and its column 0 / W-1 if ``c0`` / ``c1`` (the column fold)."""
    if not _literal(F0, F1, EPI, K):
        return None

    def row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1):
        up = xb + (i - 1 if i > 0 else fy0) * W
        dn = xb + (i + 1 if i < H - 1 else fy1) * W
        mid = xb + i * W
        oi = ob + i * W
        if (i == 0 or i == H - 1) and W > 2:
            _d3_run(F0, F1, EPI, K, o, oi + 1, osK, x, up + 1, mid + 1, dn + 1, W - 2, T, 0, w, 0, o)
        if c0:
            _d3_pixel(F0, F1, EPI, K, o, oi, osK, x, up, mid, dn, dl0, np.int64(1) if W > 1 else dr1, 0, w)
        if c1 and W > 1:
            e = W - 1
            _d3_pixel(F0, F1, EPI, K, o, oi + e, osK, x, up + e, mid + e, dn + e, np.int64(-1), dr1, 0, w)

    return row


@njit(inline="always", **_JIT)
def _expo_max(x, a, n):
    """max of ``_expo`` over ``x[a : a + n]`` (n >= 1): ``_expo_all`` iff one is inf or NaN."""
    e = _expo(_ld(x, a))
    for q in range(1, n):
        e = max(e, _expo(_ld(x, a + q)))
    return e


#: the direct run's chunk and prefetch distance, in cache lines (measured on (a2): 4 and 128
#: beat 8/16 and 32/64/256 by 5-10%; without prefetching the run took 1.3x as long)
_D3_CHUNK, _D3_AHEAD = 4, 128
#: the chunk (line buffer) of a ``STREAM`` run, in cache lines
_D3_STREAM_CHUNK = 16
#: elements per row block of a large plane on the direct path
_D3_TILE = 1 << 17
#: planes up to this wide take their border columns in the interior run (``EDGE`` / ``MIRR``;
#: 28x28 planes: 240 -> 215 ns each in cache; wide planes have too few border pixels to gain)
_D3_FOLD_W = 64


def _llc_bytes():
    """The last-level cache's size (Linux sysfs: the largest of cpu0's caches), else 32 MiB."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = []
    try:
        for d in os.listdir(base):
            if d.startswith("index"):
                with open(os.path.join(base, d, "size")) as f:
                    t = f.read().strip()
                sizes.append(int(t[:-1]) << {"K": 10, "M": 20, "G": 30}[t[-1]] if t[-1] in "KMG" else int(t))
    except (OSError, ValueError):
        pass
    return max(sizes, default=32 << 20)


#: outputs of at least this many bytes (the last-level cache) of planes at least this wide take
#: non-temporal stores on the direct path (``STREAM``): writing a line without reading it first
#: saves a third of the memory traffic of a one-pass op (4096x4096 float32, 2 threads: 3.4 ->
#: 2.5 ms for a copy; Sobel magnitude 5.5-7.8 -> 4.1-7.1 ms on a Zen 4 host).  Batches of
#: small planes did not gain (28x28: the line buffer's extra pass costs what the stores save)
_STREAM_BYTES = _llc_bytes()
_STREAM_MIN_W = 256


def _d3_kernel(FORMS, EPI, FOLD, STRM):
    """The direct kernel for one or two stencils of the given forms and one epilogue, built
    (and compiled) on first use.  Its closure holds only integers (the disk cache keys on
    them); every constant is known to the compiler, so the interior loop is one fused,
    vectorised pass (loads, taps, epilogue, store).  ``FOLD``: 0, or ``EDGE`` / ``MIRR`` when
    the interior run also covers the border columns of the rows in between (``_d3_lr``).
    ``STRM``: 0, or ``STREAM`` for non-temporal stores of the runs' whole output lines (one
    output, larger than the cache: ``_d3_plan``)."""
    key = (FORMS, EPI, FOLD, STRM)
    k = _d3_kernels.get(key)
    if k is not None:
        return k
    K = len(FORMS)
    F0 = FORMS[0]
    F1 = FORMS[-1]
    # zero centre taps are left out of the interior run when its samples are all finite (the
    # check: one integer max-reduction over the rows it reads); not for the direction, whose
    # atan2 tells the signs of zero apart
    SKIP = EPI != EPI_DIR and any(f & (ZV | ZH) for f in FORMS)
    S0 = F0 | SKIPZ | FOLD | STRM
    S1 = F1 | SKIPZ | FOLD
    R0 = F0 | FOLD | STRM
    R1 = F1 | FOLD
    CHB = _D3_STREAM_CHUNK * 64 + 64 if STRM else 0

    @njit(**_JIT)
    def kernel(xa, oa, carrier, Da, Fa, Ta, La, it0, it1):
        x = _ptr(xa, carrier)
        o = _ptr(oa, carrier)
        F = _cvt(carrier, Fa)
        w = (F[0], F[1], F[2], F[3], F[4], F[5], F[6], F[7], F[8], F[9], F[10], F[11])
        H, W = Da[D_H], Da[D_W]
        BR, NB, MP = Da[D_BR], Da[D_NB], Da[D_MP]
        fy0, fy1 = Da[D_FY0], Da[D_FY1]
        dl0 = Da[D_FX0]  # column 0's left neighbour (an offset from column 0)
        dr1 = Da[D_FX1] - (W - 1)  # column W-1's right neighbour
        N = La[L_N]
        xn1, xs1, on1, os1, osK = La[R_X], La[R_X + 2], La[R_O], La[R_O + 2], La[R_O + 3]
        L = _ptr(La.ctypes.data, La[0])
        T = _ptr(Ta.ctypes.data, Ta[0])
        line = _line(o)
        omis = (oa // (64 // line)) % line
        buf = np.empty(CHB, np.uint8)  # STREAM: the line buffer, from its first 64-byte boundary
        bp = _ptr((buf.ctypes.data + 63) // 64 * 64, carrier)
        for it in range(it0, it1):
            p0 = (it // NB) * MP
            ra = (it % NB) * BR
            rb = min(H, ra + BR)
            ia = max(ra, 1)  # interior rows ia .. ib
            ib = min(rb, H - 1)
            xb = _poff(L, np.int64(R_X), p0)
            ob = _poff(L, np.int64(R_O), p0)
            xr = p0 % xn1
            orr = p0 % on1
            for p in range(p0, min(p0 + MP, N)):
                if p > p0:  # the next plane, without an integer division per plane
                    xr += 1
                    orr += 1
                    if xr == xn1:
                        xr = 0
                        xb = _poff(L, np.int64(R_X), p)
                    else:
                        xb += xs1
                    if orr == on1:
                        orr = 0
                        ob = _poff(L, np.int64(R_O), p)
                    else:
                        ob += os1
                # interior rows, one flat run from column 1 of row ia to column W-2 of row ib-1
                # (so that no tap reads outside the plane); columns 0 and W-1 of the rows in
                # between read across row ends there: redone below, or under FOLD selected in
                # the run from the column classes (T: 1 / 2 at columns 0 / W-1, from row ra)
                run = ib > ia and W > 2
                if run:
                    q0 = ia * W + 1
                    n = (ib - ia) * W - 2
                    tq = q0 - ra * W
                    if SKIP:
                        e = _d3_run(S0, S1, EPI, K, o, ob + q0, osK, x, xb + q0 - W, xb + q0, xb + q0 + W, n, T,
                                    tq, w, omis, bp)
                        e = max(e, _expo_max(x, xb + (ia - 1) * W, W), _expo_max(x, xb + ib * W, W),
                                _expo(_ld(x, xb + q0 - 1)), _expo(_ld(x, xb + q0 + n)))
                    if not SKIP or e == _expo_all(w[0]):
                        if STRM and SKIP:
                            _fence()  # (the rerun stores over the first run's)
                        _d3_run(R0, R1, EPI, K, o, ob + q0, osK, x, xb + q0 - W, xb + q0, xb + q0 + W, n, T, tq, w,
                                omis, bp)
                # the first / last row (the row fold), and the border columns (the column fold;
                # under FOLD only where the run did not go: its first and last position)
                if FOLD != 0 and run:
                    for i in range(ra, ia):
                        _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, True, True)
                    for i in range(ib, rb):
                        _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, True, True)
                    _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, ia, H, W, fy0, fy1, dl0, dr1, T, w, True, False)
                    _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, ib - 1, H, W, fy0, fy1, dl0, dr1, T, w, False, True)
                else:
                    if STRM and run:
                        _fence()  # (the border columns are stored over the run's)
                    for i in range(ra, rb):
                        _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, True, True)
        if STRM:
            _fence()  # the non-temporal stores are visible to the thread that returns the output
        return F.size + Da.size + La.size + Ta.size + buf.size

    return _d3_kernels.setdefault(key, kernel)  # (a concurrent first call may have built one)


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
    R0 = V0 + (npm + ey) * Ws + 2 * g
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
    if epi != EPI_STACK:
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
        q = R0 + sg * Ws
        if epi == EPI_MAG:
            if K == 2:
                for j in range(sl):
                    a = B[q + j]
                    b = B[q + RL + j]
                    mg = math.sqrt(a * a + b * b)
                    sc = _ld(gp, grow + j * gsW) / mg if mg != zero else zero
                    B[zr + j] = sc * a
                    B[zr + ZL + j] = sc * b
            else:
                for j in range(sl):
                    a = B[q + j]
                    s = a * a
                    for k in range(1, K):
                        b = B[q + k * RL + j]
                        s += b * b
                    mg = math.sqrt(s)
                    sc = _ld(gp, grow + j * gsW) / mg if mg != zero else zero
                    for k in range(K):
                        B[zr + k * ZL + j] = sc * B[q + k * RL + j]
        else:  # direction: d atan2(a, b) = (b da - a db) / (a^2 + b^2)
            for j in range(sl):
                a = B[q + j]
                b = B[q + RL + j]
                rr = a * a + b * b
                sc = _ld(gp, grow + j * gsW) / rr if rr != zero else zero
                B[zr + j] = sc * b
                B[zr + ZL + j] = -sc * a


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
            xb = _poff(L, np.int64(R_X), p)
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


_K_FILTER_BWD = {e: _make_filter_bwd(e) for e in (EPI_STACK, EPI_MAG, EPI_DIR)}


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


# =============================================================================
# Python side: plans (cached), layouts, allocation, dispatch

_EPI = {"stack": EPI_STACK, "magnitude": EPI_MAG, "direction": EPI_DIR}

#: target elements of a tile row block (a few buffers of this size stay in L2)
_TILE = 1 << 15
#: planes up to this many elements (padded) are processed whole, one work item each
_WHOLE = 1 << 15
#: calls with at most this many output elements run serially in the calling thread
_SERIAL = 1 << 14
#: fresh outputs of at least this many bytes are allocated by NumPy (huge pages)
_NP_ALLOC = 1 << 20
#: widest image the flat layout handles (wider: padded rows and column strips)
_FLAT_MAX_W = 1024
#: column strip width of the forward pass on wide images
_STRIP = 512
#: small planes are stacked into tiles of about this many elements
_STACK = 1 << 12

_info_cache: dict = {}
_plan_cache: dict = {}
_lay_cache: dict = {}
_d3_cache: dict = {}


def _norm_stencil(st):
    """Stencil -> (vt, ht, dt, passes): tap lists of (dy, dx, w) for a two-phase
    separable stencil (vt then ht) or a one-phase one (dt); None if unsupported.
    Dense kernels leave zero weights out of the footprint (SciPy's 2-D correlate)."""
    if st.kind == "dense":
        ly, lx = st.lo
        dt = [(ly + a, lx + b, float(w)) for a, row in enumerate(st.taps) for b, w in enumerate(row) if w != 0.0]
        return [], [], dt, ()
    passes = st.passes
    if not passes:
        return [], [], [(0, 0, 1.0)], ()
    if any(p.axis not in (-2, -1) for p in passes):
        return None
    if len(passes) > 2 or (len(passes) == 2 and passes[0].axis == passes[1].axis):
        return None  # not produced by the builders: the reference engine runs it

    def taps(p):
        # 1-D passes multiply every tap, zeros too (a NaN under a 0 tap is NaN, as in SciPy's
        # correlate1d); the zero taps go last: the adjoint skips them (as the reference does)
        t = [(p.lo + i, 0, float(w)) if p.axis == -2 else (0, p.lo + i, float(w)) for i, w in enumerate(p.taps)]
        return [u for u in t if u[2] != 0.0] + [u for u in t if u[2] == 0.0]

    if len(passes) == 1:
        return [], [], taps(passes[0]), passes
    vp, hp = (passes[0], passes[1]) if passes[0].axis == -2 else (passes[1], passes[0])
    vt, ht = taps(vp), taps(hp)
    if vt == [(0, 0, 1.0)]:
        return [], [], ht, passes
    if ht == [(0, 0, 1.0)]:
        return [], [], vt, passes
    return vt, ht, [], passes


def _info(spec):
    """Per-spec data that does not depend on the image size (cached by value: the
    eager path builds a fresh, equal spec on every call)."""
    key = (spec, math.copysign(1.0, spec.cval))  # -0.0 == 0.0, but SciPy keeps the sign
    try:
        return _info_cache[key]
    except KeyError:
        pass
    if isinstance(spec, FilterSpec):
        sts = spec.stencils
        epi = _EPI[spec.epilogue]
        keep, bext = False, None
    else:
        sts = (spec.stencil,)
        epi = EPI_NORM if spec.normalized else EPI_BLEND
        keep = spec.keep_border
        bext = (spec.stencil.extent(-2), spec.stencil.extent(-1))
    info = None
    if not (spec.mode == "constant" and not math.isfinite(spec.cval)):
        norm = [_norm_stencil(st) for st in sts]
        if all(n is not None for n in norm) and len(sts) >= 1 and (epi != EPI_DIR or len(sts) == 2):
            offs = [(dy, dx) for vt, ht, dt, _ in norm for dy, dx, _w in vt + ht + dt]
            eylo = min([0] + [d[0] for d in offs])
            eyhi = max([0] + [d[0] for d in offs])
            exlo = min([0] + [d[1] for d in offs])
            exhi = max([0] + [d[1] for d in offs])
            info = (norm, epi, spec.mode, float(spec.cval), (eylo, eyhi, exlo, exhi), keep, bext)
    if len(_info_cache) > 4096:
        _info_cache.clear()
    _info_cache[key] = info
    return info


def _fold(n, lo, length, mode):
    idx = reference.fold_indices(n, lo, length, mode).numpy().astype(np.int64)
    if mode == "constant":
        idx[idx == n] = -1
    return idx


def _correction(passes, mode, cval, H, W):
    """SciPy's sequential constant mode: the second pass pads the first pass's result
    with ``cval`` (not with the first pass of a ``cval`` row).  Relative to folding
    both passes onto a ``cval``-padded tile that adds ``cval*(1 - sum(first))*c[t]``,
    ``c[t]`` = the second pass's taps that fall outside the image at position t."""
    if mode != "constant" or cval == 0.0 or len(passes) != 2:
        return 0, None
    first, second = passes
    n = H if second.axis == -2 else W
    c = np.zeros(n)
    pos = np.arange(n)
    for b, w in enumerate(second.taps):
        q = pos + second.lo + b
        c += np.where((q < 0) | (q >= n), w, 0.0)
    corr = cval * (1.0 - math.fsum(first.taps)) * c
    if not np.any(corr != 0.0):
        return 0, None
    return (1 if second.axis == -1 else 2), corr


def _whole_planes(plane, N, H, W, nthreads):
    """Do whole planes (``plane`` tile elements each) make the work items?  Yes when they fit a
    tile and there are enough of them for the threads (or the call is tiny)."""
    return plane <= _WHOLE and (N >= 2 * nthreads or _small(N, H, W))


def _stack(tile, N, nthreads):
    """Planes stacked per work item: tiles of ``tile`` elements up to ``_STACK`` (longer loops,
    fewer calls), keeping at least 8 items per thread."""
    return max(1, min(_STACK // tile, N // (8 * nthreads)))


def _blocking(info, H, W, N, nthreads, backward=False):
    """(rows per work item, strip width, padded layout?).

    Flat layout (row stride W, border columns fixed up) when the kernel is narrow
    against the image; otherwise padded rows (stride W + ex), and for wide images
    the forward pass works on column strips so that its tiles stay in cache."""
    eylo, eyhi, exlo, exhi = info[4]
    ey, ex = eyhi - eylo, exhi - exlo
    pad = W > _FLAT_MAX_W or 4 * ex > W
    CW = W
    if pad and not backward and W > _STRIP:
        nc = -(-W // _STRIP)
        CW = -(-W // nc)
    Ws = CW + ex if pad else W
    if _whole_planes(H * Ws, N, H, W, nthreads):
        return H, CW, pad, 1 if backward or pad else _stack((H + ey) * W, N, nthreads)
    return min(H, max(1, _TILE // Ws, min(2 * ey, 64))), CW, pad, 1


def _plan(info, H, W, blocking):
    key = (id(info), H, W, blocking)
    hit = _plan_cache.get(key)
    if hit is not None and hit[0] is info:
        return hit[1]
    norm, epi, mode, cval, (eylo, eyhi, exlo, exhi), keep, bext = info
    BR, CW, pad, MP = blocking
    ey = eyhi - eylo
    Wp = W + exhi - exlo
    K = len(norm)
    NB = -(-H // BR)
    NC = -(-W // CW)
    fh = _fold(H, eylo, H + ey, mode)
    fw = _fold(W, exlo, Wp, mode)
    taps_i, taps_w, corr_f, st, fix = [], [], [], [], []
    ntaps = sum(len(vt) + len(ht) + len(dt) for vt, ht, dt, _ in norm)
    f_corr0 = F_TAPS + ntaps
    p_fix0 = I_HDR + len(fh) + len(fw) + ST_LEN * K + 2 * ntaps
    bcols = set()
    for vt, ht, dt, passes in norm:
        d = []
        for lst in (vt, ht, dt):
            d += [len(lst), len(taps_w)]
            for dy, dx, w in lst:
                taps_i += [dy, dx]
                taps_w.append(w)
        ck, corr = _correction(passes, mode, cval, H, W)
        d += [ck, f_corr0 + len(corr_f) if ck else 0]
        if ck:
            corr_f += list(corr)
        # border columns: a horizontal tap reaches outside the image
        dxs = [t[1] for t in (ht if vt and ht else dt)]
        lo, hi = (min(dxs), max(dxs)) if dxs else (0, 0)
        cols = [] if pad else [j for j in range(W) if j + lo < 0 or j + hi > W - 1]
        d += [len(cols), p_fix0 + len(fix)]
        d += [sum(1 for t in lst if t[2] != 0.0) for lst in (vt, ht, dt)]
        fix += cols
        bcols.update(j for j in range(W) if j - hi < 0 or j - lo > W - 1)
        st += d
    # backward border columns: those whose adjoint reads outside the image, and
    # every target of a padded column; each with the padded columns folding onto it
    if pad:
        bcols = set()
    inv = {}
    for c, j in enumerate(fw):
        if j >= 0:
            inv.setdefault(int(j), []).append(c + exlo)
            if not 0 <= c + exlo < W and not pad:
                bcols.add(int(j))
    bx = []
    for v in sorted(bcols):
        bx += [v, len(inv[v])] + inv[v]
    hdr = np.zeros(I_HDR, np.int64)
    hdr[[I_H, I_W, I_K, I_EPI, I_CONST]] = [H, W, K, epi, mode == "constant"]
    hdr[[I_EYLO, I_EYHI, I_EXLO, I_EXHI]] = [eylo, eyhi, exlo, exhi]
    hdr[I_FH] = I_HDR
    hdr[I_FW] = I_HDR + len(fh)
    hdr[I_ST] = hdr[I_FW] + len(fw)
    hdr[I_TAPI] = hdr[I_ST] + len(st)
    assert hdr[I_TAPI] + len(taps_i) == p_fix0
    if keep:
        (ly, hy), (lx, hx) = bext
        hdr[[I_KEEPB, I_BI0, I_BI1, I_BJ0, I_BJ1]] = [1, -ly, H - hy, -lx, W - hx]
    else:
        hdr[[I_KEEPB, I_BI0, I_BI1, I_BJ0, I_BJ1]] = [0, 0, H, 0, W]
    hdr[[I_BR, I_NB, I_NPM]] = [BR, NB, H + ey if NB == 1 else BR]
    hdr[[I_NBX, I_BX]] = [len(bcols), p_fix0 + len(fix)]
    hdr[[I_PAD, I_CW, I_NC, I_MP]] = [pad, CW, NC, MP]
    P = np.concatenate([hdr, fh, fw, np.asarray(st + taps_i + fix + bx, np.int64)]).astype(np.int64)
    F = np.concatenate([np.array([cval, 0.0, 1.0, 0.0]), np.asarray(taps_w, np.float64), np.asarray(corr_f, np.float64)])
    plan = (P, F, NB * NC, MP)
    if len(_plan_cache) > 1024:
        _plan_cache.clear()
    _plan_cache[key] = (info, plan)
    return plan


def _d3_form(vt, ht, dt):
    """(form, [v0, v1, v2, h0, h1, h2]) of a normalised stencil the direct path runs, else None:
    1-D passes of three taps at offsets -1, 0, 1, none zero or only the centre one (the general
    engine sums non-zero taps first; the direct path keeps that order)."""

    def three(taps, axis):
        w = {t[axis]: t[2] for t in taps}
        if len(taps) != 3 or sorted(w) != [-1, 0, 1] or any(t[1 - axis] != 0 for t in taps):
            return None
        if w[-1] == 0.0 or w[1] == 0.0:
            return None
        return [w[-1], w[0], w[1]]

    def code(base, w):
        c = base | (ZV if w[1] == 0.0 else 0) | (ZH if w[4] == 0.0 else 0)
        return c | sum(_w_class(wt) << (4 + 2 * t) for t, wt in enumerate(w)), w

    if vt and ht:
        v, h = three(vt, 0), three(ht, 1)
        return None if v is None or h is None else code(FORM_VH, v + h)
    v, h = three(dt, 0), three(dt, 1)
    if h is not None:
        return code(FORM_H, [0.0, 1.0, 0.0] + h)  # unused vertical taps (a non-zero centre: no ZV)
    if v is not None:
        return code(FORM_V, v + [0.0, 1.0, 0.0])
    return None


def _d3_plan(info, H, W, N, nthreads, itemsize, aligned):
    """(kernel, D, F, T, work items) for the direct 3x3 path, or None when the spec is not of
    that kind.  ``aligned``: the output's address is a multiple of ``itemsize`` (its lines can
    be streamed)."""
    key = (id(info), H, W, N, nthreads, itemsize, aligned)
    hit = _d3_cache.get(key)
    if hit is not None and hit[0] is info:
        return hit[1]
    norm, epi, mode = info[0], info[1], info[2]
    forms = [_d3_form(vt, ht, dt) for vt, ht, dt, _ in norm]
    plan = None
    if epi in (EPI_STACK, EPI_MAG, EPI_DIR) and mode != "constant" and len(forms) in (1, 2) and all(forms):
        fy = _fold(H, -1, H + 2, mode)
        fx = _fold(W, -1, W + 2, mode)
        if fy.min() >= 0 and fx.min() >= 0:  # a guard: every mode but constant folds onto samples
            if _whole_planes(H * W, N, H, W, nthreads):
                BR, NB, MP = H, 1, _stack(H * W, N, nthreads)
            else:
                # row blocks of about _D3_TILE elements (fewer halo rows than the general
                # engine's tiles: 4096x4096 Sobel 2.6 -> 2.2 ms), at least 4 per thread
                BR, MP = max(1, min(H, _D3_TILE // W, -(-H // (4 * nthreads)))), 1
                NB = -(-H // BR)
            D = np.array([H, W, BR, NB, MP, fy[0], fy[-1], fx[0], fx[-1]], np.int64)
            F = np.array([w for f in forms for w in f[1]] + [0.0] * 6 * (2 - len(forms)), np.float64)
            # narrow planes: the run selects the border columns' folded neighbours per lane
            fold = 0
            if 2 < W <= _D3_FOLD_W:
                fold = {(0, W - 1): EDGE, (1, W - 2): MIRR}.get((int(fx[0]), int(fx[-1])), 0)
            T = np.zeros(BR * W if fold else 1, np.uint8)
            if fold:
                T[0::W] = 1
                T[W - 1 :: W] = 2
            # non-temporal stores for one output larger than the cache (two would need the
            # same alignment), of wide planes (long runs; a fence per row block orders them
            # before the border columns are redone)
            strm = 0
            if (N * H * W * itemsize >= _STREAM_BYTES and (len(forms) == 1 or epi != EPI_STACK) and W >= _STREAM_MIN_W
                    and aligned and H > 2):
                strm = STREAM
            plan = (_d3_kernel(tuple(f[0] for f in forms), epi, fold, strm), D, F, T, -(-N // MP) * NB)
    if len(_d3_cache) > 1024:
        _d3_cache.clear()
    _d3_cache[key] = (info, plan)
    return plan


def _lead(sizes, strides):
    """Leading dims -> (n1, s0, s1) with plane p at (p // n1)*s0 + (p % n1)*s1, or None."""
    dims = []
    for s, st in zip(sizes, strides):
        if s == 1:
            continue
        if dims and dims[-1][1] == st * s:
            dims[-1] = (dims[-1][0] * s, st)
        else:
            dims.append((s, st))
    if not dims:
        return 1, 0, 0
    if len(dims) == 1:
        return dims[0][0], 0, dims[0][1]
    if len(dims) == 2:
        return dims[1][0], dims[0][1], dims[1][1]
    return None


def _role(t, k: bool):
    """[n1, s0, s1, sK, sH, sW] of a tensor shaped (..., [K,] H, W), or None."""
    st = t.stride()
    nd = 3 if k else 2
    lead = _lead(t.shape[:-nd], st[:-nd])
    if lead is None:
        return None
    return [lead[0], lead[1], lead[2], st[-3] if k else 0, st[-2], st[-1]]


def _layout(x, o, ok, g=None, gk=False, m=None):
    """Per-call layout array L (cached by shapes and strides); None where a tensor needs a copy."""
    key = (x.shape, x.stride(), o.shape, o.stride(), ok, None if g is None else (g.shape, g.stride(), gk),
           None if m is None else m.stride())
    L = _lay_cache.get(key)
    if L is not None:
        return L
    roles = [_role(x, False), _role(o, ok), [1, 0, 0, 0, 0, 0] if g is None else _role(g, gk),
             [1, 0, 0, 0, 0, 0] if m is None else _role(m, False)]
    if any(r is None for r in roles):
        return roles  # a list: the caller copies what is None
    L = np.asarray(sum(roles, []) + [x.numel() // (x.shape[-2] * x.shape[-1])], np.int64)
    if len(_lay_cache) > 1024:
        _lay_cache.clear()
    _lay_cache[key] = L
    return L


@functools.lru_cache(maxsize=None)
def _memory_bytes():
    """Physical memory, or the cgroup's limit when lower (containers)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        total = 4 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                total = min(total, int(f.read().strip()))
        except (OSError, ValueError):  # absent, or "max"
            pass
    return total


def _cache_limit():
    """Bytes the output cache may hold, buffers in use included: ``TORCHFILTERS_CPU_CACHE_MB``
    (unset or empty: a quarter of the memory, at most 2 GiB; ``inf``: no limit)."""
    env = os.environ.get("TORCHFILTERS_CPU_CACHE_MB", "").strip()
    if not env:
        return min(_memory_bytes() // 4, 2 << 30)
    try:
        mb = float(env)
    except ValueError:
        mb = math.nan
    if math.isnan(mb):
        raise ValueError(f"TORCHFILTERS_CPU_CACHE_MB must be a number of megabytes (0 turns the output cache off); "
                         f"got {env!r}")
    if mb <= 0:
        return 0
    return sys.maxsize if mb == math.inf else int(min(mb, 2.0**43) * (1 << 20))


# The output cache.  Buffers handed out are tracked by a finalizer on the NumPy array the
# output tensor wraps: when the tensor (and every view of it) is gone, the buffer comes back
# to ``_free_bufs`` (most recently released last) for the next output it fits.
_free_bufs: list = []
_in_use = 0  # bytes of the cached buffers that outputs still use
_limit = 0  # the limit of the latest allocation (releases trim to it)
#: free buffers kept at most (varying sizes must not pile up dead buffers)
_MAX_FREE = 4
_cache_lock = threading.RLock()  # re-entrant: a finalizer may run inside an allocation


def _after_fork():  # pragma: no cover - runs in a forked child
    global _cache_lock
    _cache_lock = threading.RLock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def empty_cache() -> int:
    """Release the CPU output cache's free buffers; returns the bytes released.

    Fresh CPU outputs of at least 1 MiB come from a cache of reusable buffers, as PyTorch's
    caching allocator does on CUDA: when an output tensor and all its views are gone, its
    buffer is kept and handed to the next output it fits (between half its size and its
    size), whose pages are then already mapped instead of page-faulting a new allocation.  Per
    process the cache holds at most ``TORCHFILTERS_CPU_CACHE_MB`` megabytes, buffers in use
    included (default: a quarter of the memory -- the cgroup's limit in a container -- and at
    most 2 GiB; ``0`` turns it off), and at most four free buffers.  Buffers in use are not
    affected.  GPU memory is torch's business (``torch.cuda.empty_cache``).
    """
    with _cache_lock:
        return _trim(0)


def _trim(limit):
    """Drop free buffers, least recently released first, while more than ``_MAX_FREE`` are free
    or the cache holds more than ``limit`` bytes; returns the bytes dropped."""
    dropped = 0
    while _free_bufs and (len(_free_bufs) > _MAX_FREE or _in_use + sum(b.nbytes for b in _free_bufs) > limit):
        dropped += _free_bufs.pop(0).nbytes
    return dropped


def _release(buf):
    """Finalizer of an output's NumPy array: its buffer is free again."""
    global _in_use
    with _cache_lock:
        _in_use -= buf.nbytes
        _free_bufs.append(buf)
        if len(_free_bufs) > _MAX_FREE or _limit == 0:
            _trim(_limit)


def _cached_buffer(nbytes):
    """(uint8 buffer of at least ``nbytes`` bytes, owned by the cache?): a free cached buffer,
    else a new one (cached if the limit allows)."""
    global _in_use, _limit
    limit = _cache_limit()
    with _cache_lock:
        _limit = limit
        _trim(limit)  # the limit may have been lowered since the buffers were cached
        best = None
        for b in reversed(_free_bufs):  # the smallest free buffer that fits without wasting half
            if nbytes <= b.nbytes <= 2 * nbytes and (best is None or b.nbytes < best.nbytes):
                best = b  # of itself; of equal ones, the most recently released (warmest)
        if best is not None:
            del _free_bufs[next(k for k, b in enumerate(_free_bufs) if b is best)]
        else:
            _trim(limit - nbytes)  # make room
            if _in_use + sum(b.nbytes for b in _free_bufs) + nbytes > limit:
                return np.empty(nbytes, np.uint8), False
            best = np.empty(nbytes, np.uint8)  # >= 4 MiB: NumPy advises transparent huge pages
        _in_use += best.nbytes
        return best, True


def _alloc(shape, dtype):
    """A fresh output.  Large ones come from the buffer cache (``empty_cache``), wrapped by
    ``torch.from_numpy`` (so ``resize_`` cannot grow them); small ones from torch."""
    n = math.prod(shape)
    itemsize = dtype.itemsize
    if n * itemsize >= _NP_ALLOC:
        buf, cached = _cached_buffer(n * itemsize)
        arr = buf[: n * itemsize].view(_NP_STORAGE[dtype])
        if cached:
            weakref.finalize(arr, _release, buf)
        t = torch.from_numpy(arr)
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.view(shape)
    return torch.empty(shape, dtype=dtype)


_pool = None
_pool_pid = None
_pool_lock = threading.Lock()


def _threads():
    """Worker threads for a call: ``torch.get_num_threads()``."""
    n = torch.get_num_threads()
    return n if n > 1 else 1


def _get_pool(n):
    global _pool, _pool_pid
    pid = os.getpid()
    pool = _pool
    if pool is None or _pool_pid != pid or pool._max_workers < n - 1:
        with _pool_lock:
            if _pool is None or _pool_pid != pid or _pool._max_workers < n - 1:
                # a fresh pool after fork (threads do not survive it) or a larger thread count
                _pool = ThreadPoolExecutor(max(n - 1, 1), thread_name_prefix="torchfilters-cpu")
                _pool_pid = pid
            pool = _pool
    return pool


def _prepare(x, o, ok, g=None, gk=False, m=None):
    """Resolve the layout; copy the (rare) tensors whose leading dims do not collapse to 2."""
    L = _layout(x, o, ok, g, gk, m)
    if isinstance(L, np.ndarray):
        return x, o, g, m, L, False
    roles = L
    if roles[0] is None:
        x = x.contiguous()
    if roles[2] is None:
        g = g.contiguous()
    if roles[3] is None:
        m = m.contiguous()
    tmp = roles[1] is None
    if tmp:
        o = torch.empty(o.shape, dtype=o.dtype)
    return x, o, g, m, _layout(x, o, ok, g, gk, m), tmp


def _launch(fn, args, nitems, nthreads, serial):
    """Run ``fn(*args, it0, it1)`` over the work items.

    The kernels release the GIL (``nogil``), so a call is split into chunks run
    by ``nthreads`` threads -- the caller plus a small pool -- pulling chunks
    from a shared counter (a core busy elsewhere slows its thread, not the call).
    This replaces numba's ``parallel=True``: its parfor wrapper re-optimises the
    whole inlined kernel and tripled the first-call compile time."""
    if serial or nthreads == 1 or nitems == 1:
        fn(*args, 0, nitems)
        return
    nchunks = min(nitems, 4 * nthreads)
    counter = itertools.count()

    def work():
        c = next(counter)
        while c < nchunks:
            fn(*args, c * nitems // nchunks, (c + 1) * nitems // nchunks)
            c = next(counter)

    pool = _get_pool(nthreads)
    futures = [pool.submit(work) for _ in range(min(nthreads, nchunks) - 1)]
    try:
        work()
    finally:
        for f in futures:
            f.result()


def _small(N, H, W):
    return N * H * W <= _SERIAL


# ----------------------------------------------------------------------------
# engine entry points


def filter_forward(x, spec: FilterSpec, out=None):
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.filter_forward(x, spec, out)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    o = _alloc(spec.out_shape(x.shape), x.dtype) if out is None else out
    ok = o.dim() == x.dim() + 1
    x, o2, _, _, L, tmp = _prepare(x, o, ok)
    d3 = _d3_plan(info, H, W, N, nt, x.element_size(), o2.data_ptr() % x.element_size() == 0)
    args = (x.data_ptr(), o2.data_ptr(), _CARRIER[x.dtype])
    if d3 is not None and L[R_X + 4] == W and L[R_X + 5] == 1 and L[R_O + 4] == W and L[R_O + 5] == 1:
        kernel, D, F, T, nitems = d3  # rows contiguous in and out: the direct 3x3 path
        _launch(kernel, args + (D, F, T, L), nitems, nt, _small(N, H, W))
    else:
        P, F, per, mp = _plan(info, H, W, _blocking(info, H, W, N, nt))
        _launch(_K_FILTER_FWD[info[1]], args + (P, F, L), -(-N // mp) * per, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o


def filter_backward(grad, x, spec: FilterSpec, out=None):
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.filter_backward(grad, x, spec, out)
    if grad.dtype != x.dtype:
        grad = grad.to(x.dtype)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    P, F, per, _ = _plan(info, H, W, _blocking(info, H, W, N, nt, True))
    nitems = N * per
    o = _alloc(x.shape, x.dtype) if out is None else out
    gk = grad.dim() == x.dim() + 1
    x, o2, grad, _, L, tmp = _prepare(x, o, False, grad, gk)
    _launch(_K_FILTER_BWD[info[1]], (grad.data_ptr(), x.data_ptr(), o2.data_ptr(), _CARRIER[x.dtype], P, F, L),
            nitems, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o


def _threshold(x, threshold):
    """``x >= threshold`` as torch compares a tensor with a Python float: in the input's own
    dtype (the threshold rounded to it); exact in float64, where the kernel compares."""
    dt = x.dtype
    if dt == torch.float64:
        return float(threshold)
    if dt == torch.float32:
        return float(np.float32(threshold))
    if dt == torch.float16:
        return float(np.float16(threshold))
    return float(torch.tensor(threshold, dtype=dt))


def blur_forward(x, mask, spec: BlurSpec, threshold: float, out=None):
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.blur_forward(x, mask, spec, threshold, out)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    P, F, per, mp = _plan(info, H, W, _blocking(info, H, W, N, nt))
    nitems = -(-N // mp) * per
    o = _alloc(x.shape, x.dtype) if out is None else out
    if mask is not None and mask.shape != x.shape:
        mask = mask.expand(x.shape)
    x, o2, _, mask, L, tmp = _prepare(x, o, False, None, False, mask)
    ma = 0 if mask is None else mask.data_ptr()
    _launch(_k_blur_fwd, (x.data_ptr(), ma, o2.data_ptr(), _CARRIER[x.dtype], P, F, L, _threshold(x, threshold)),
            nitems, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o


def blur_backward(grad, x, mask, spec: BlurSpec, threshold: float, out=None):
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.blur_backward(grad, x, mask, spec, threshold, out)
    if grad.dtype != x.dtype:
        grad = grad.to(x.dtype)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    P, F, per, _ = _plan(info, H, W, _blocking(info, H, W, N, nt, True))
    nitems = N * per
    o = _alloc(x.shape, x.dtype) if out is None else out
    if mask is not None and mask.shape != x.shape:
        mask = mask.expand(x.shape)
    if grad.shape != x.shape:
        grad = grad.expand(x.shape)
    x, o2, grad, mask, L, tmp = _prepare(x, o, False, grad, False, mask)
    ma = 0 if mask is None else mask.data_ptr()
    _launch(_k_blur_bwd, (grad.data_ptr(), x.data_ptr(), ma, o2.data_ptr(), _CARRIER[x.dtype], P, F, L, _threshold(x, threshold)),
            nitems, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o
