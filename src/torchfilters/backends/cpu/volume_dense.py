"""Dense stencils of three axes on the volume engine (``correlate`` / ``convolve`` with a 3-D
kernel, Kornia's ``filter3d``), and dense 2-D stencils whose axes have different modes.

**Runs here**: a spec of one dense stencil (epilogue ``stack``) over 2 or 3 axes, every mode per
axis, any finite ``cval``; float32 and float64 (16-bit inputs are computed in float32); forward
and backward (:func:`dense_adjoint`: the same kernel).

**Order.**  Each output sums its taps one after another from ``+0.0``, in the footprint's C
order (the first axis slowest), products rounded and no fused multiply-add -- SciPy's
``NI_Correlate``, and the 2-D dense kernels' order: float64 results are SciPy's bits.  Zero
taps are outside the footprint (a NaN under one does not propagate), as in SciPy.

**Streaming.**  A work item is ``(volume, plane, block of BY rows)``.  Per output row the
input rows of its ``(kz, ky)`` taps, at the folded plane and row, are extended along ``x`` by
its mode into padded rows (the interior copied by vectors, the few halo samples through the
host's fold table; ``constant``: ``cval``); then each output vector sums its taps in registers,
four vectors at a time (independent chains of sums).  The fold tables are built on the host
(``separable._fold1``), once per plan.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import njit

from ..._spec import FilterSpec
from .prims import _JIT, _ptr, _st
from .separable import _VL, _fold1, _ldv, _stv
from .simd import _vadd, _vld, _vmul, _vsplat, _vst
from .volume_kernels import R_OUT, R_SRC, _voff
from .volume_plan import modes3

__all__ = ["DensePlan", "takes", "dense", "dense_adjoint", "_k_dense3"]

#: rows of a work item's block
BY = 4
# M (int64): D, H, W (the output's), kd, kh, kw, blocks per plane, the padded row's interior
# start and end and its source start, the accumulator's length, the output row's offset in it,
# the number of folded-back accumulator samples, the most padded rows an output row reads; then
# the offsets (in M) of the tables: the read folds of z, y, x, the preimages of each output plane
# (CSR: starts, then virtual planes), of each output row (the same), and the accumulator samples
# folded back (pairs: from, to)
M_HEAD = 14
M_FOLDS = M_HEAD + 8


class DensePlan(NamedTuple):
    w64: np.ndarray  # the taps in footprint order, then cval (float64)
    w32: np.ndarray  # the same in float32
    M: np.ndarray
    nitems: int


def takes(spec) -> bool:
    """Whether this kernel runs ``spec`` (lowered), forward and backward: one dense stencil of
    2 or 3 axes (epilogue ``stack``) with finite taps, and a finite ``cval`` if ``constant`` mode
    reads it.  No plan is built (:func:`dense` builds one per size)."""
    if not isinstance(spec, FilterSpec) or spec.epilogue != "stack" or len(spec.stencils) != 1:
        return False
    if spec.stencils[0].kind != "dense" or spec.ndim not in (2, 3):
        return False
    if not np.isfinite(_taps3(spec)[0]).all():
        return False
    return math.isfinite(spec.cval) or "constant" not in modes3(spec)


def dense(spec, sizes, nv):
    """The forward plan of ``spec`` (one :func:`takes` accepts) on ``nv`` volumes of
    ``sizes = (D, H, W)``."""
    return _dense(spec, math.copysign(1.0, spec.cval), tuple(sizes), nv, False)


def dense_adjoint(spec, sizes, nv):
    """The plan of ``A^T g`` for :func:`dense`'s ``spec`` (same arguments; ``sizes`` of ``x``)."""
    return _dense(spec, math.copysign(1.0, spec.cval), tuple(sizes), nv, True)


def _taps3(spec):
    st = spec.stencils[0]
    taps = np.asarray(st.taps, np.float64)
    lo = list(st.lo)
    if spec.ndim == 2:
        taps = taps[None]
        lo = [0] + lo
    return taps, lo


@functools.lru_cache(maxsize=128)
def _dense(spec, sign, sizes, nv, adjoint):
    """Forward: output sample ``i`` reads the input at ``fold(i + lo + t)``; each output has one
    preimage (itself).  Adjoint: the full correlation with the flipped taps (``gp[p] = sum_t w_t
    g[p - t]``, ``p < n + k - 1``, constant 0 outside ``g``), and each output ``j`` sums the
    positions ``p`` of ``gp`` that the forward's padding copies from ``j`` (``fold(p + lo) == j``:
    ``reference._unpad``) -- along ``z`` and ``y`` as lists of rows, along ``x`` in the row."""
    taps, lo = _taps3(spec)
    modes = modes3(spec)
    k = taps.shape
    reads, pre, xpairs = [], [], []
    for a in range(3):
        n = sizes[a]
        if not adjoint:
            reads.append([_fold1(n, i + lo[a], modes[a]) for i in range(n + k[a] - 1)])
            pre.append([[i] for i in range(n)])
            width, xo = n, 0
        else:
            P = n + k[a] - 1
            reads.append([_fold1(n, i - (k[a] - 1), "constant") for i in range(P + k[a] - 1)])
            idx = [_fold1(n, p + lo[a], modes[a]) for p in range(P)]
            pre.append([[p for p in range(P) if idx[p] == j] for j in range(n)])
            width, xo = P, -lo[a]
            if a == 2:
                xpairs = [(p, idx[p] + xo) for p in range(P) if idx[p] >= 0 and not 0 <= p - xo < n]
    if adjoint:
        taps = taps[::-1, ::-1, ::-1]
        lr = -(k[2] - 1)
    else:
        lr = lo[2]
    D, H, W = sizes
    NP = width + k[2] - 1
    i0 = min(max(0, -lr), NP)  # the padded row's positions that read the row in place
    i1 = max(i0, min(NP, W - lr))
    nyb = -(-H // BY)
    tables = [reads[0], reads[1], reads[2]]
    for a in (0, 1):
        starts = np.cumsum([0] + [len(q) for q in pre[a]]).tolist()
        tables += [starts, [p for q in pre[a] for p in q]]
    tables.append([v for pr in xpairs for v in pr])
    offs, o = [], M_FOLDS
    for t in tables:
        offs.append(o)
        o += len(t)
    rows = max(len(q) for q in pre[0]) * max(len(q) for q in pre[1]) * k[0] * k[1]
    head = [D, H, W, k[0], k[1], k[2], nyb, i0, i1, i0 + lr, width, xo, len(xpairs), rows]
    M = np.asarray(head + offs + [v for t in tables for v in t], np.int64)
    w = np.append(np.ascontiguousarray(taps).ravel(), 0.0 if adjoint else spec.cval)
    return DensePlan(w, w.astype(np.float32), M, nv * D * nyb)


@njit(**_JIT)
def _k_dense3(sa, oa, Wt, Ma, La, it0, it1):
    """Work items ``it0 .. it1`` (module docstring): source ``sa``, output ``oa`` (addresses),
    ``Wt`` the taps then ``cval`` (compute dtype), ``Ma`` the plan's ``M`` (:func:`_dense`),
    ``La`` the layout (``volume_kernels``' roles)."""
    fz = Wt[0]
    L = _VL(fz)
    isz = Wt.itemsize
    WP = _ptr(Wt.ctypes.data, fz)
    D, H, W = Ma[0], Ma[1], Ma[2]
    kd, kh, kw = Ma[3], Ma[4], Ma[5]
    nyb, i0, i1, s0 = Ma[6], Ma[7], Ma[8], Ma[9]
    WA, xo, nxp = Ma[10], Ma[11], Ma[12]
    zf, yf, xf = Ma[Ma[M_HEAD]:], Ma[Ma[M_HEAD + 1]:], Ma[Ma[M_HEAD + 2]:]  # (views of M)
    zc, zp, yc, yp = Ma[Ma[M_HEAD + 3]:], Ma[Ma[M_HEAD + 4]:], Ma[Ma[M_HEAD + 5]:], Ma[Ma[M_HEAD + 6]:]
    xp = Ma[Ma[M_HEAD + 7]:]
    nt = kd * kh * kw
    cval = Wt[nt]
    cv = _vsplat(WP, nt)
    sD, sH = La[R_SRC + 4], La[R_SRC + 5]
    oD, oH = La[R_OUT + 4], La[R_OUT + 5]
    NP = WA + kw - 1
    KK = kd * kh
    RP = (NP + L - 1) // L * L + L  # a padded row's pitch (whole vectors)
    RA = (WA + L - 1) // L * L + L  # the accumulator's
    buf = np.zeros(Ma[13] * RP + RA + 2 * L + 64 // isz, Wt.dtype)
    ba = (buf.ctypes.data + 63) // 64 * 64
    A = _ptr(ba + Ma[13] * RP * isz, fz)  # the accumulator row (adjoint: folded back in it)
    zv = _vsplat(_ptr(ba + (Ma[13] * RP + RA) * isz, fz), 0)  # (never written: +0.0)
    src = _ptr(sa, fz)
    out = _ptr(oa, fz)
    per = D * nyb
    for it in range(it0, it1):
        v = it // per
        rem = it % per
        z = rem // nyb
        y0 = (rem % nyb) * BY
        y1 = min(H, y0 + BY)
        sb = _voff(La, R_SRC, v)
        ob = _voff(La, R_OUT, v)
        for y in range(y0, y1):
            nr = 0  # the padded rows the output row reads: per preimage (pz, py), per (kz, ky)
            for qz in range(zc[z], zc[z + 1]):
                for qy in range(yc[y], yc[y + 1]):
                    for kz in range(kd):
                        zz = zf[zp[qz] + kz]
                        for ky in range(kh):
                            yy = yf[yp[qy] + ky]
                            P = _ptr(ba + nr * RP * isz, fz)
                            nr += 1
                            if zz < 0 or yy < 0:  # (constant mode) a whole row of cval
                                j = 0
                                while j < NP:
                                    _stv(P, j, cv, min(L, NP - j), L)
                                    j += L
                                continue
                            rb = sb + zz * sD + yy * sH
                            for i in range(i0):
                                f = xf[i]
                                _st(P, i, cval if f < 0 else src[rb + f])
                            j = i0
                            while j < i1:
                                n = min(L, i1 - j)
                                _stv(P, j, _ldv(src, rb + s0 + (j - i0), n, L), n, L)
                                j += L
                            for i in range(i1, NP):
                                f = xf[i]
                                _st(P, i, cval if f < 0 else src[rb + f])
            orow = ob + z * oD + y * oH
            # the forward (and an adjoint with nothing to fold back): stored as summed, the W
            # samples of the row only (an adjoint's samples past them are dropped: constant mode)
            direct = nxp == 0 and xo == 0
            WE = W if direct else WA
            j = 0
            while j + 4 * L <= WE:  # four vectors at a time: four independent chains of sums
                a0 = zv
                a1 = zv
                a2 = zv
                a3 = zv
                for r in range(nr):
                    P = _ptr(ba + r * RP * isz, fz)
                    t0 = (r % KK) * kw
                    for kx in range(kw):
                        if Wt[t0 + kx] != 0.0:
                            w = _vsplat(WP, t0 + kx)
                            a0 = _vadd(a0, _vmul(_vld(P, kx + j), w))
                            a1 = _vadd(a1, _vmul(_vld(P, kx + j + L), w))
                            a2 = _vadd(a2, _vmul(_vld(P, kx + j + 2 * L), w))
                            a3 = _vadd(a3, _vmul(_vld(P, kx + j + 3 * L), w))
                D0 = out if direct else A
                d0 = orow + j if direct else j
                _vst(D0, d0, a0)
                _vst(D0, d0 + L, a1)
                _vst(D0, d0 + 2 * L, a2)
                _vst(D0, d0 + 3 * L, a3)
                j += 4 * L
            while j < WE:  # each vector's taps summed in registers, from +0.0 (SciPy's order)
                n = min(L, WE - j)
                acc = zv
                for r in range(nr):
                    P = _ptr(ba + r * RP * isz, fz)
                    t0 = (r % KK) * kw
                    for kx in range(kw):
                        if Wt[t0 + kx] != 0.0:  # (zero taps are outside the footprint, as in SciPy)
                            acc = _vadd(acc, _vmul(_ldv(P, kx + j, n, L), _vsplat(WP, t0 + kx)))
                if direct:
                    _stv(out, orow + j, acc, n, L)
                else:
                    _stv(A, j, acc, n, L)
                j += L
            if not direct:
                for q in range(nxp):  # (adjoint) the row's border folded back onto its samples
                    _st(A, xp[2 * q + 1], A[xp[2 * q + 1]] + A[xp[2 * q]])
                j = 0
                while j < W:
                    n = min(L, W - j)
                    _stv(out, orow + j, _ldv(A, xo + j, n, L), n, L)
                    j += L
    # (numba frees an array after its last use: the buffers read through raw pointers live to here)
    return buf.size + Wt.size + Ma.size + La.size
