"""**Symmetric separable path.**  A ``sep`` stencil whose 1-D passes are symmetric about their
centre (``w[-k] == w[k]``: Gaussian, odd uniform/box filters, any even-order smoothing) runs
here instead of the tiled engine: one vertical pass then one horizontal pass, fused per block
of rows so that the intermediate stays in L1.  Chosen at plan time from the spec's taps
(:func:`sep_info`); sizes and taps are run-time values (one kernel per storage dtype).

Per work item (a few whole planes, or a block of rows of one column strip of a large plane):

* **Vertical pass, register-blocked.**  Eight output rows at a time (two blocks of four),
  per vector of columns, with the taps folded (``w_k * (x[i-k] + x[i+k])``: half the
  multiplies) and the eight input rows a block reads kept in registers as they slide (two
  loads per tap for four outputs; eight rows at once spilled accumulators to the stack).
  Input rows come straight from the input (float32/float64 rows of unit stride) or from
  a small ring tile that converts float16/bfloat16 and gathers strided rows.  Boundary modes
  fold whole rows through a table (``constant``: a row of ``cval``).
* **Pads.**  The intermediate rows get ``r`` columns on each side, folded from the row itself
  (or computed, in ``wrap`` mode on strips) -- or ``cval`` in ``constant`` mode: SciPy pads
  the first pass's *result* with ``cval``, so its sequential semantics come out exactly.
* **Horizontal pass.**  Two output vectors at a time, taps folded likewise; the left windows
  are shuffles of aligned vectors held in registers, the right ones unaligned loads
  (``simd._vtaps2``).  The result goes straight to the output (or through a row buffer that
  converts the dtype or scatters a strided row).

NaN and inf follow SciPy's 1-D passes: every tap multiplies (a zero tap too), each pass pads
its own input.  Each pass sums in SciPy's order (``NI_Correlate1D``: ``x[i]*w[0]``, then
``(x[i-k] + x[i+k]) * w[k]`` for ``k = r .. 1``, each product rounded before its sum: no fused
multiply-add), the vertical pass first (the spec's first pass: :func:`sep_info`), so float64
results are SciPy's bit for bit (taps folded onto a small image's period aside).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit
from numba.extending import overload

from ..._spec import FilterSpec, by_identity, zero_signs
from .plan import _small
from .prims import _JIT, _OVL, _cvt, _fence, _ld, _line, _prefetch_r, _ptr, _st
from .simd import VBYTES, _vadd, _vld, _vldm, _vmul, _vnz, _vrev, _vsplat, _vst, _vstm, _vstnt, _vsub, _vtaps2, _vwts
from .tables import L_N, R_O, R_X, _poff

# =============================================================================
# plan layout (int64 array P; float64 array F = [cval, wv[0..rv], wh[0..rh]])

S_H, S_W, S_RV, S_RH, S_CONST, S_BR, S_NB, S_NC, S_MP = range(9)
S_VS, S_G, S_TS, S_FOLD, S_STRIP, S_E, S_NRING, S_MODE, S_VPAD = range(9, 18)
S_HDR = 18
ST_LEN = 6  # per strip: c0, cw, nseg, seg offset, npad, pad offset
F_CVAL = 0

#: output rows per vertical block (two register blocks of four: 4 accumulators + 8 window rows each)
R = 8
#: widest image processed in one strip; wider ones are cut into strips of about _STRIP_W
_FULL_W = 8192
_STRIP_W = 4096
#: in place: the vertical window (``R + 2r`` rows) may span at most this many bytes (None: any
#: window, the default: in place ran faster than the ring tile in every case measured,
#: benchmarks/RESULTS-cpu.md, seventh session).  The tests set 0 to run the ring tile on
#: float32 / float64.
_INPLACE_SPAN = None
#: target rows per work item on large planes
_BLOCK_ROWS = 64

_info_cache: dict = {}
_plan_cache: dict = {}


def _half(p):
    """The taps ``w[0..r]`` of a centred symmetric pass, or None."""
    k = len(p.taps)
    if k % 2 == 0 or p.lo != -(k // 2):
        return None
    t = p.taps
    if any(t[i] != t[k - 1 - i] for i in range(k // 2)) or not all(math.isfinite(v) for v in t):
        return None
    return tuple(t[k // 2:])


@by_identity(1024)
def sep_info(spec):
    """``(wv, wh, mode, cval)`` when ``spec`` runs on this path (else None): one ``sep``
    stencil, ``stack`` epilogue, at most one pass per axis, each symmetric and centred.  An
    absent pass is the identity ``(1.0,)``.  (Cached by identity, then by value.)"""
    key = (spec, math.copysign(1.0, spec.cval) if isinstance(spec, FilterSpec) else 0.0, zero_signs(spec))
    hit = _info_cache.get(key, False)
    if hit is not False:
        return hit
    info = None
    if (isinstance(spec, FilterSpec) and spec.epilogue == "stack" and len(spec.stencils) == 1
            and spec.stencils[0].kind == "sep" and math.isfinite(spec.cval)):
        passes = spec.stencils[0].passes
        axes = [p.axis for p in passes]
        if 1 <= len(passes) <= 2 and len(set(axes)) == len(axes) and set(axes) <= {-2, -1}:
            # the vertical pass runs first: it must be the spec's first (SciPy's order of the
            # passes: rounding, and in constant mode the sequential padding)
            ordered = axes[0] == -2 or len(axes) == 1
            half = {p.axis: _half(p) for p in passes}
            if ordered and all(h is not None for h in half.values()):
                info = (half.get(-2, (1.0,)), half.get(-1, (1.0,)), spec.mode, float(spec.cval))
    if len(_info_cache) > 4096:
        _info_cache.clear()
    _info_cache[key] = info
    return info


def sep_sum_info(spec, dtype):
    """The two :func:`sep_info` of a ``sum`` of two stencils that each run on this path (a 2-D
    ``gaussian_laplace``: ``G''_y G_x + G_y G''_x``), else None.  The second stencil's result is
    added to the first's, per block of rows in one launch (``_k_sep``'s ``Fb``) or by a second
    launch (``accumulate``): one rounding per term and one for the sum, as the tiled engine's
    ``sum`` epilogue, so only for float32 / float64 (a 16-bit output would round the first term
    before the sum)."""
    if (not isinstance(spec, FilterSpec) or spec.epilogue != "sum" or len(spec.stencils) != 2
            or dtype not in (torch.float32, torch.float64)):
        return None
    key = ("sum", spec, math.copysign(1.0, spec.cval), zero_signs(spec))  # (sep_info's cache: one lookup a call)
    hit = _info_cache.get(key, False)
    if hit is False:
        infos = tuple(sep_info(spec._replace(stencils=(st,), epilogue="stack")) for st in spec.stencils)
        hit = None if None in infos else infos
        if len(_info_cache) > 4096:
            _info_cache.clear()
        _info_cache[key] = hit
    return hit

def _lanes(itemsize):
    return VBYTES // (8 if itemsize == 8 else 4)


def _fold1(n, i, mode):
    """Fold index ``i`` onto ``[0, n)`` (``constant``: -1)."""
    if 0 <= i < n:
        return i
    if mode == "constant":
        return -1
    if mode == "nearest":
        return 0 if i < 0 else n - 1
    if mode == "wrap":
        return i % n
    if mode == "mirror":
        if n == 1:
            return 0
        p = 2 * n - 2
        i %= p
        return p - i if i >= n else i
    p = 2 * n  # reflect
    i %= p
    return p - 1 - i if i >= n else i


_MODES = {"reflect": 0, "mirror": 1, "nearest": 2, "wrap": 3, "constant": 4}


def _vector_pads(mode, W, rh, NC, lanes):
    """Can the intermediate rows' pads be one vector per side (a shuffle of the row's first or
    last vector: ``_pad_rows``)?  Only where each pad folds once onto the row."""
    if rh > lanes:
        return False
    if mode == "reflect":
        return rh <= W
    if mode == "mirror":
        return rh <= W - 1
    if mode == "wrap":
        return rh <= W and NC == 1
    return True


def _blocking(H, W, N, nthreads, lanes):
    """(rows per item, row blocks per plane, strips, strip width, planes per item)."""
    if W > _FULL_W:
        NC = -(-W // _STRIP_W)
        CW = -(-(-(-W // NC)) // (2 * lanes)) * 2 * lanes
        NC = -(-W // CW)
    else:
        NC, CW = 1, W
    per_plane = H * W
    if N >= 2 * nthreads and per_plane <= (1 << 16) or _small(N, H, W):
        MP = max(1, min((1 << 14) // max(per_plane, 1), N // (8 * nthreads)))
        return H, 1, NC, CW, MP
    # large planes: blocks of rows, enough work items for the threads
    want = max(1, (8 * nthreads) // max(N * NC, 1))
    BR = max(R, min(_BLOCK_ROWS, -(-H // want)))
    BR = -(-BR // R) * R
    NB = -(-H // BR)
    return BR, NB, NC, CW, 1


def sep_plan(info, H, W, N, nthreads, itemsize):
    """The ``P``/``F`` tables (cached) and the number of work items."""
    lanes = _lanes(itemsize)
    blocking = _blocking(H, W, N, nthreads, lanes)
    key = (id(info), H, W, itemsize, blocking)
    BR, NB, NC, CW, MP = blocking
    nitems = -(-N // MP) * NB * NC  # not cached: the same blocking serves other plane counts
    hit = _plan_cache.get(key)
    if hit is not None and hit[0] is info:
        return hit[1] + (nitems,)
    wv, wh, mode, cval = info
    rv, rh = len(wv) - 1, len(wh) - 1
    E = max(rv, 1)
    # row fold table, image rows -E .. NB*BR + R + E (a block computes R rows: the last block's
    # extra ones are discarded)
    lo_row = -E
    hi_row = NB * BR + R + E
    fold = [_fold1(H, i, mode) for i in range(lo_row, hi_row + 1)]
    nbk = max(1, -(-rh // lanes))  # blocks of horizontal taps
    G = nbk * lanes  # V-buffer column of strip column 0 (room for the left windows)
    npair = -(-(-(-CW // lanes)) // 2)
    VS = G + 2 * lanes * npair + rh + 2 * lanes
    VS = -(-VS // lanes) * lanes + lanes  # not a multiple of 4 KiB apart: +1 vector
    strips, segs, pads = [], [], []
    tcols = 0
    for s in range(NC):
        c0 = s * CW
        cw = min(CW, W - c0)
        a, b = max(c0 - rh, 0), min(c0 + cw + rh, W)
        sg = [(a, G + a - c0, b - a)]  # (image column, V-buffer column, count)
        pd = []
        extra = []
        for j in list(range(c0 - rh, a)) + list(range(b, c0 + cw + rh)):
            if 0 <= j < W:
                continue
            src = _fold1(W, j, mode)
            dst = G + j - c0
            if src < 0:
                pd.append((dst, -1))
            elif a <= src < b:
                pd.append((dst, G + src - c0))
            else:
                extra.append((src, dst))
        # columns the pads fold onto outside this strip (wrap mode): computed, runs of them
        i = 0
        while i < len(extra):
            k = i + 1
            while k < len(extra) and extra[k][0] == extra[k - 1][0] + 1 and extra[k][1] == extra[k - 1][1] + 1:
                k += 1
            sg.append((extra[i][0], extra[i][1], k - i))
            i = k
        tw = sum(-(-n // lanes) * lanes for _, _, n in sg) + lanes
        tcols = max(tcols, tw)
        strips.append((c0, cw, len(sg), len(segs), len(pd), len(pads)))
        segs += sg
        pads += pd
    TS = -(-tcols // lanes) * lanes + lanes
    NRING = R + 2 * E  # the ring tile: the rows one vertical block reads
    hdr = np.zeros(S_HDR, np.int64)
    hdr[[S_H, S_W, S_RV, S_RH, S_CONST, S_BR, S_NB, S_NC, S_MP]] = [H, W, rv, rh, mode == "constant", BR, NB, NC, MP]
    hdr[[S_VS, S_G, S_TS, S_E, S_NRING]] = [VS, G, TS, E, NRING]
    hdr[S_MODE] = _MODES[mode]
    hdr[S_VPAD] = _vector_pads(mode, W, rh, NC, lanes)
    hdr[S_FOLD] = S_HDR - lo_row  # P[P[S_FOLD] + i] = fold of row i
    hdr[S_STRIP] = S_HDR + len(fold)
    seg0 = hdr[S_STRIP] + ST_LEN * NC
    pad0 = seg0 + 3 * len(segs)
    st = []
    for c0, cw, ns, so, npd, po in strips:
        st += [c0, cw, ns, seg0 + 3 * so, npd, pad0 + 2 * po]
    P = np.concatenate([hdr, np.asarray(fold, np.int64), np.asarray(st, np.int64),
                        np.asarray([v for t in segs for v in t], np.int64),
                        np.asarray([v for t in pads for v in t], np.int64)]).astype(np.int64)
    F = np.asarray([cval] + list(wv) + list(wh) + [0.0] * lanes, np.float64)  # (zeros: _vwts reads a block)
    plan = (P, F)
    if len(_plan_cache) > 1024:
        _plan_cache.clear()
    _plan_cache[key] = (info, plan)
    return plan + (nitems,)


def inplace_ok(x, itemsize, info):
    """May the vertical pass read ``x``'s rows in place?  (Unit column stride, and a window of
    rows within ``_INPLACE_SPAN``; the caller checks that the storage is float32/float64.)"""
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        return False
    rv = len(info[0]) - 1
    return _INPLACE_SPAN is None or (R + 2 * max(rv, 1)) * x.stride(-2) * itemsize <= _INPLACE_SPAN


# =============================================================================
# kernels


def _VL(fz):  # pragma: no cover - overload below
    raise NotImplementedError


@overload(_VL, jit_options=_OVL)
def _ol_vl(fz):
    n = VBYTES // (fz.bitwidth // 8)
    return lambda fz: n


# The small helpers are ``forceinline`` (LLVM's ``alwaysinline``: typed once per signature, then
# inlined by LLVM) rather than numba's ``inline="always"`` (their IR copied and typed again at
# every call site): 20-32% less compile time for the separable, volume and rank kernels, the same
# speed (benchmarks/RESULTS-cpu.md, eleventh session).  ``half`` and ``_hpair`` stay
# numba-inlined: inlined by LLVM instead, the 28x28 batch Gaussian ran 4-5% slower.
@njit(forceinline=True, **_JIT)
def _ldv(p, i, n, L):
    if n >= L:
        return _vld(p, i)
    return _vldm(p, i, n)


@njit(forceinline=True, **_JIT)
def _stv(p, i, v, n, L):
    if n >= L:
        _vst(p, i, v)
    else:
        _vstm(p, i, v, n)


@njit(forceinline=True, **_JIT)
def _st8(p, i, stride, a0, a1, a2, a3, a4, a5, a6, a7, n, L):
    """Store eight register-blocked rows, ``n`` columns each: row ``t`` at ``p[i + t*stride]``."""
    _stv(p, i, a0, n, L)
    _stv(p, i + stride, a1, n, L)
    _stv(p, i + 2 * stride, a2, n, L)
    _stv(p, i + 3 * stride, a3, n, L)
    _stv(p, i + 4 * stride, a4, n, L)
    _stv(p, i + 5 * stride, a5, n, L)
    _stv(p, i + 6 * stride, a6, n, L)
    _stv(p, i + 7 * stride, a7, n, L)


@njit(forceinline=True, **_JIT)
def _psym(lo, hi):
    """A symmetric pass's pair: ``x[-k] + x[k]`` (times ``w[k]``, :func:`_wsym`)."""
    return _vadd(lo, hi)


@njit(forceinline=True, **_JIT)
def _wsym(w, k):
    return _vsplat(w, k)


@njit(forceinline=True, **_JIT)
def _panti(lo, hi):
    """An antisymmetric pass's pair as SciPy forms it: ``x[-k] - x[k]``, times the left weight
    ``w[-k] = -w[k]`` (:func:`_wanti`; the lowered taps are exact negated mirrors,
    ``_lowering.canonical_pass``), so that even a zero pair has SciPy's sign."""
    return _vsub(lo, hi)


@njit(forceinline=True, **_JIT)
def _wanti(w, k):
    return _vsub(_vnz(w), _vsplat(w, k))  # -w[k], exactly (-0.0 - v)


def _make_vblock(pair, weight):
    """The vertical pass of 8 output rows for pairs ``pair`` times ``weight(w, k)``
    (:func:`_psym` / :func:`_wsym`, :func:`_panti` / :func:`_wanti`: a kernel of its own per
    kind, no run-time branch)."""

    @njit(inline="always", **_JIT)
    def half(V, v0, VS, rows, m0, s0, n, w, r, L, fz):
        """Four output rows from padded row ``m0``: their accumulators and the eight rows a tap
        step reads stay in registers (eight rows at once would spill accumulators to the stack,
        whose 64-byte reloads wait on the split stores before them)."""
        w0 = _vsplat(w, 0)
        a0 = _vmul(w0, _ldv(_ptr(rows[m0], fz), s0, n, L))
        a1 = _vmul(w0, _ldv(_ptr(rows[m0 + 1], fz), s0, n, L))
        a2 = _vmul(w0, _ldv(_ptr(rows[m0 + 2], fz), s0, n, L))
        a3 = _vmul(w0, _ldv(_ptr(rows[m0 + 3], fz), s0, n, L))
        if r > 0:
            # SciPy's order: the pairs from the outermost in (k = r .. 1), each added after its
            # product (no fused multiply-add).  l_t = x[m0 + t - k], u_t = x[m0 + t + k]
            # (each step loads its two new rows first: no branch in the loop, whose rotation
            # then stays in registers)
            l0 = _ldv(_ptr(rows[m0 - r], fz), s0, n, L)
            l1 = _ldv(_ptr(rows[m0 + 1 - r], fz), s0, n, L)
            l2 = _ldv(_ptr(rows[m0 + 2 - r], fz), s0, n, L)
            u1 = _ldv(_ptr(rows[m0 + 1 + r], fz), s0, n, L)
            u2 = _ldv(_ptr(rows[m0 + 2 + r], fz), s0, n, L)
            u3 = _ldv(_ptr(rows[m0 + 3 + r], fz), s0, n, L)
            for k in range(r, 0, -1):
                l3 = _ldv(_ptr(rows[m0 + 3 - k], fz), s0, n, L)
                u0 = _ldv(_ptr(rows[m0 + k], fz), s0, n, L)
                wk = weight(w, k)
                a0 = _vadd(a0, _vmul(pair(l0, u0), wk))
                a1 = _vadd(a1, _vmul(pair(l1, u1), wk))
                a2 = _vadd(a2, _vmul(pair(l2, u2), wk))
                a3 = _vadd(a3, _vmul(pair(l3, u3), wk))
                l0, l1, l2 = l1, l2, l3
                u3, u2, u1 = u2, u1, u0
        _stv(V, v0, a0, n, L)
        _stv(V, v0 + VS, a1, n, L)
        _stv(V, v0 + 2 * VS, a2, n, L)
        _stv(V, v0 + 3 * VS, a3, n, L)

    @njit(**_JIT)
    def vblock(V, v0, VS, rows, m0, s0, n, w, r, L, fz, nr):
        """The vertical pass of 8 output rows, ``n <= L`` columns: ``V[v0 + t*VS + j]`` for output
        row t (padded rows ``m0 + t``; ``rows[m]`` is the address of padded row m, whose column
        ``s0 + j`` is read), as two blocks of four rows; the second only where the block has
        more than four (``nr``) rows the caller uses."""
        half(V, v0, VS, rows, m0, s0, n, w, r, L, fz)
        if nr > 4:
            half(V, v0 + 4 * VS, VS, rows, m0 + 4, s0, n, w, r, L, fz)

    return vblock


_vblock = _make_vblock(_psym, _wsym)
_vblock_anti = _make_vblock(_panti, _wanti)


@njit(forceinline=True, **_JIT)
def _stv_out(p, i, v, n, L, nt):
    """Store an output vector: ``nt`` 0 plainly, 1 non-temporally (whole vectors), 2 added to
    what the output holds (``accumulate``: the second stencil of a ``sum``)."""
    if nt == 1 and n >= L:
        _vstnt(p, i, v)
    elif nt == 2:
        _stv(p, i, _vadd(_ldv(p, i, n, L), v), n, L)
    else:
        _stv(p, i, v, n, L)


@njit(inline="always", **_JIT)
def _hpair(O, oq, V, q, n, w0, nz, WT, w, r, L, hoisted, nt):
    """Two output vectors of the horizontal pass: ``O[oq .. oq + n)`` from ``V[q - r .. q + n + r)``."""
    a0 = _vmul(w0, _vld(V, q))
    b0 = _vmul(w0, _vld(V, q + L))
    a1 = nz
    b1 = nz
    if hoisted:
        a0, a1, b0, b1 = _vtaps2(a0, a1, b0, b1, _vld(V, q - L), _vld(V, q), _vld(V, q + L), V, q, WT, 0, r)
    else:  # the chunks of taps from the outermost in (SciPy's order)
        k0 = (r - 1) // L * L
        while k0 >= 0:
            a0, a1, b0, b1 = _vtaps2(a0, a1, b0, b1, _vld(V, q - k0 - L), _vld(V, q - k0), _vld(V, q - k0 + L),
                                     V, q, _vwts(w, k0), k0, r)
            k0 -= L
    _stv_out(O, oq, _vadd(a0, a1), n, L, nt)
    if n > L:
        _stv_out(O, oq + L, _vadd(b0, b1), n - L, L, nt)


@njit(**_JIT)
def _hrows(O, o0, ostride, V, VS, G, nr, cw, w, r, L, nt):
    """The horizontal pass of ``nr`` padded rows (row t: ``V[t*VS + G - r .. t*VS + G + cw + r)``)
    into ``O[o0 + t*ostride .. + cw)``, two output vectors at a time.  With at most one vector
    of taps (``r <= lanes``) their broadcast weights stay in registers for all the rows.
    ``nt``: whole output vectors are non-temporal line stores (their addresses 64-byte aligned)."""
    w0 = _vsplat(w, 0)
    nz = _vnz(w)
    WT = _vwts(w, 0)
    if r <= L:
        for t in range(nr):
            for j in range(0, cw, 2 * L):
                _hpair(O, o0 + t * ostride + j, V, t * VS + G + j, min(cw - j, 2 * L), w0, nz, WT, w, r, L, True, nt)
    else:
        for t in range(nr):
            for j in range(0, cw, 2 * L):
                _hpair(O, o0 + t * ostride + j, V, t * VS + G + j, min(cw - j, 2 * L), w0, nz, WT, w, r, L, False, nt)


@njit(**_JIT)
def _pad_rows(V, VS, G, nr, W, c0, cw, mode, C, L):
    """The pads of ``nr`` intermediate rows, one vector per side: the row's first (last) vector
    reversed (``reflect``; ``mirror`` one column in), its edge value (``nearest``), its other
    end (``wrap``) or ``cval`` (``C[0]``, ``constant``)."""
    for t in range(nr):
        v = t * VS + G - c0  # V index of image column 0
        if c0 == 0:
            if mode == 0:
                p = _vrev(_vld(V, v))
            elif mode == 1:
                p = _vrev(_vld(V, v + 1))
            elif mode == 2:
                p = _vsplat(V, v)
            elif mode == 3:
                p = _vld(V, v + W - L)
            else:
                p = _vsplat(C, 0)
            _vst(V, v - L, p)
        if c0 + cw == W:
            e = v + W
            if mode == 0:
                p = _vrev(_vld(V, e - L))
            elif mode == 1:
                p = _vrev(_vld(V, e - 1 - L))
            elif mode == 2:
                p = _vsplat(V, e - 1)
            elif mode == 3:
                p = _vld(V, v)
            else:
                p = _vsplat(C, 0)
            _vst(V, e, p)


@njit(**_JIT)
def _prefetch_rows(x, P, fold, i0, n, xb, sH, sW, sgo, nsg):
    """Prefetch the segments of image rows ``i0 .. i0+n`` (folded; contiguous rows only)."""
    if sW != 1:
        return
    step = _line(x)
    for i in range(i0, i0 + n):
        fi = P[fold + i]
        if fi < 0:
            continue
        for sg in range(nsg):
            e = sgo + 3 * sg
            a = xb + fi * sH + P[e]
            for j in range(0, P[e + 2], step):
                _prefetch_r(x, a + j)


@njit(**_JIT)
def _copy_row(T, t0, x, xa, sW, n):
    """``n`` samples of the input (any storage dtype, stride ``sW``) into the tile (compute dtype)."""
    if sW == 1:
        for j in range(n):
            T[t0 + j] = _ld(x, xa + j)
    else:
        for j in range(n):
            T[t0 + j] = _ld(x, xa + j * sW)


@njit(**_JIT)
def _k_sep(xa, oa, carrier, Pa, Fa, Fb, La, inplace, direct, stream, accumulate, it0, it1):
    """Work items ``it0 .. it1`` of the separable path (``inplace``: read the input rows in
    place; ``direct``: store the output vectors straight into the output; ``stream``: with
    non-temporal stores; ``accumulate``: add the result to the output's values, for the second
    stencil of a ``sum``).  ``Fb``, when it has more than one element, is a second stencil's
    weights (the same radii and plan): per block of rows its result is added to the first's
    while both are in cache (a ``sum`` of two stencils in one pass; ``direct`` only)."""
    x = _ptr(xa, carrier)
    o = _ptr(oa, carrier)
    Fa32 = _cvt(carrier, Fa)
    Fc = _ptr(Fa32.ctypes.data, Fa32[0])
    fz = Fa32[0]
    P = _ptr(Pa.ctypes.data, Pa[0])
    Lp = _ptr(La.ctypes.data, La[0])
    isz = Fa32.itemsize
    H = P[S_H]
    W = P[S_W]
    rv = P[S_RV]
    rh = P[S_RH]
    BR = P[S_BR]
    NB = P[S_NB]
    NC = P[S_NC]
    MP = P[S_MP]
    VS = P[S_VS]
    G = P[S_G]
    TS = P[S_TS]
    E = P[S_E]
    NRING = P[S_NRING]
    fold = P[S_FOLD]
    mode = P[S_MODE]
    vpad = P[S_VPAD] != 0
    wv = _ptr(Fa32.ctypes.data + isz, fz)
    wh = _ptr(Fa32.ctypes.data + (rv + 2) * isz, fz)
    Fb32 = _cvt(carrier, Fb)
    two = Fb32.size > 1 and direct
    wv2 = _ptr(Fb32.ctypes.data + isz, fz)
    wh2 = _ptr(Fb32.ctypes.data + (rv + 2) * isz, fz)
    L = _VL(fz)
    xsH, xsW = Lp[R_X + 4], Lp[R_X + 5]
    osH, osW = Lp[R_O + 4], Lp[R_O + 5]
    cval = Fc[F_CVAL]
    # buffers: R intermediate rows, the ring tile, a row of cval, the row addresses, R output rows
    vbuf = np.zeros(R * VS + L, Fa32.dtype)
    V = _ptr(vbuf.ctypes.data, fz)
    tbuf = np.zeros(1 if inplace else NRING * TS + L, Fa32.dtype)
    T = _ptr(tbuf.ctypes.data, fz)
    cbuf = np.empty(W + 2 * L, Fa32.dtype)
    for j in range(cbuf.size):
        cbuf[j] = cval
    crow = cbuf.ctypes.data
    rows = np.empty(-(-BR // R) * R + 2 * E + 1, np.int64)
    rp = _ptr(rows.ctypes.data, rows[0])
    obuf = np.empty(1 if direct else R * VS, Fa32.dtype)
    OB = _ptr(obuf.ctypes.data, fz)
    O = _ptr(oa, fz)
    per = NB * NC
    for it in range(it0, it1):
        g0 = (it // per) * MP
        rem = it % per
        s = rem // NB  # strip-major: consecutive items share halo rows
        ra = (rem % NB) * BR
        rb = min(H, ra + BR)
        sd = P[S_STRIP] + ST_LEN * s
        c0 = P[sd]
        cw = P[sd + 1]
        nsg = P[sd + 2]
        sgo = P[sd + 3]
        npd = P[sd + 4]
        pdo = P[sd + 5]
        nblk = -(-(rb - ra) // R)
        for pl in range(g0, min(g0 + MP, Lp[L_N])):
            xb = _poff(Lp, np.int64(R_X), pl)
            ob = _poff(Lp, np.int64(R_O), pl)
            if inplace:  # padded row m <-> image row ra - E + m
                for m in range(nblk * R + 2 * E):
                    fi = P[fold + ra - E + m]
                    rows[m] = crow if fi < 0 else xa + (xb + fi * xsH) * isz
            for blk in range(nblk):
                if not inplace:  # the rows this block reads that the ring does not hold yet
                    for m in range(0 if blk == 0 else blk * R + 2 * E, blk * R + R + 2 * E):
                        slot = (m % NRING) * TS
                        rows[m] = tbuf.ctypes.data + slot * isz
                        fi = P[fold + ra - E + m]
                        tcol = 0
                        for sg in range(nsg):
                            e = sgo + 3 * sg
                            n = P[e + 2]
                            if fi < 0:
                                for j in range(n):
                                    T[slot + tcol + j] = cval
                            else:
                                _copy_row(T, slot + tcol, x, xb + fi * xsH + P[e] * xsW, xsW, n)
                            tcol += -(-n // L) * L
                    # ask for the rows the next block copies (the next item's first ones after the
                    # last block): their DRAM traffic overlaps this block's passes
                    if blk + 1 < nblk:
                        _prefetch_rows(x, P, fold, ra - E + blk * R + R + 2 * E, R, xb, xsH, xsW, sgo, nsg)
                    elif it + 1 < it1 and (it + 1) % NB != 0:
                        _prefetch_rows(x, P, fold, rb + E, R, xb, xsH, xsW, sgo, nsg)
                i0 = ra + blk * R
                nr = min(R, rb - ra - blk * R)
                for k in range(2 if two else 1):  # (two: the second stencil added to the first)
                    # vertical pass of every segment: intermediate row t <-> output row ra + blk*R + t
                    wvk = wv2 if k == 1 else wv
                    tcol = 0
                    for sg in range(nsg):
                        e = sgo + 3 * sg
                        n = P[e + 2]
                        s0 = P[e] if inplace else tcol
                        for j in range(0, n, L):
                            _vblock(V, P[e + 1] + j, VS, rp, blk * R + E, s0 + j, min(L, n - j), wvk, rv, L, fz, nr)
                        tcol += -(-n // L) * L
                    if vpad:
                        _pad_rows(V, VS, G, nr, W, c0, cw, mode, Fc, L)
                    else:
                        for t in range(nr):
                            for f in range(npd):
                                dst = P[pdo + 2 * f]
                                src = P[pdo + 2 * f + 1]
                                V[t * VS + dst] = cval if src < 0 else V[t * VS + src]
                    if direct:
                        dst, d0, dstride = O, ob + i0 * osH + c0, osH
                        nt = 2 if accumulate or k == 1 else (1 if stream and not two else 0)
                    else:  # (one call site: one compiled _hrows)
                        dst, d0, dstride, nt = OB, np.int64(0), VS, 0
                    _hrows(dst, d0, dstride, V, VS, G, nr, cw, wh2 if k == 1 else wh, rh, L, nt)
                if not direct:
                    for t in range(nr):
                        orow = ob + (i0 + t) * osH + c0 * osW
                        for j in range(cw):
                            q = orow + j * osW
                            _st(o, q, _ld(o, q) + OB[t * VS + j] if accumulate else OB[t * VS + j])
    if stream:
        _fence()
    # (numba frees an array after its last use: every array read through a raw pointer -- the
    # compute-dtype weights ``Fa32`` too -- is used here)
    return vbuf.size + tbuf.size + cbuf.size + rows.size + obuf.size + Fa32.size + Fb32.size + Pa.size + La.size
