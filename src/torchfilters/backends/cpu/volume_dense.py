"""Dense stencils of three axes on the volume engine (``correlate`` / ``convolve`` with a 3-D
kernel, Kornia's ``filter3d``), and dense 2-D stencils whose axes have different modes.

**Runs here**: a spec of one dense stencil (epilogue ``stack``) over 2 or 3 axes, every mode per
axis, any ``cval``; float32 and float64 (16-bit inputs are computed in float32).  The backward
runs on the reference engine.

**Order.**  Each output sums its taps one after another from ``+0.0``, in the footprint's C
order (the first axis slowest), products rounded and no fused multiply-add -- SciPy's
``NI_Correlate``, and the 2-D dense kernels' order: float64 results are SciPy's bits.  Zero
taps are outside the footprint (a NaN under one does not propagate), as in SciPy.

**Streaming.**  A work item is ``(volume, plane, block of BY rows)``.  Per output row an
accumulator row (in the first-level cache) takes, for each ``(kz, ky)`` of the footprint, the
input row at the folded plane and row, extended along ``x`` by its mode into a padded row (the
interior copied by vectors, the few halo samples through the host's fold table; ``constant``:
``cval``), and then one vector multiply and add per ``kx`` tap.  The fold tables are built on
the host (``separable._fold1``), once per plan.
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
from .simd import _vadd, _vmul, _vsplat
from .volume_kernels import R_OUT, R_SRC, _voff
from .volume_plan import modes3

__all__ = ["DensePlan", "dense", "_k_dense3"]

#: rows of a work item's block
BY = 4
# M (int64): D, H, W, kd, kh, kw, blocks per plane, the padded row's interior start and end and
# its source start; then the fold tables of z (D + kd - 1), y (H + kh - 1), x (W + kw - 1)
M_FOLDS = 10


class DensePlan(NamedTuple):
    w64: np.ndarray  # the taps in footprint order, then cval (float64)
    w32: np.ndarray  # the same in float32
    M: np.ndarray
    nitems: int


def dense(spec, sizes, nv):
    """The plan of ``spec`` on ``nv`` volumes of ``sizes = (D, H, W)``, or None where the
    spec is not one dense stencil (or has non-finite taps, or a non-finite ``cval`` that
    ``constant`` mode would read)."""
    if not isinstance(spec, FilterSpec) or spec.epilogue != "stack" or len(spec.stencils) != 1:
        return None
    st = spec.stencils[0]
    if st.kind != "dense" or spec.ndim not in (2, 3):
        return None
    return _dense(spec, math.copysign(1.0, spec.cval), tuple(sizes), nv)


@functools.lru_cache(maxsize=128)
def _dense(spec, sign, sizes, nv):
    st = spec.stencils[0]
    taps = np.asarray(st.taps, np.float64)
    lo = list(st.lo)
    if spec.ndim == 2:
        taps = taps[None]
        lo = [0] + lo
    if taps.ndim != 3 or not np.isfinite(taps).all():
        return None
    modes = modes3(spec)
    if "constant" in modes and not math.isfinite(spec.cval):
        return None
    D, H, W = sizes
    kd, kh, kw = taps.shape
    tables = [[_fold1(n, i + lo[a], modes[a]) for i in range(n + k - 1)]
              for a, (n, k) in enumerate(((D, kd), (H, kh), (W, kw)))]
    i0 = min(max(0, -lo[2]), W + kw - 1)  # the padded row's positions that read the row in place
    i1 = max(i0, min(W + kw - 1, W - lo[2]))
    nyb = -(-H // BY)
    M = np.asarray([D, H, W, kd, kh, kw, nyb, i0, i1, i0 + lo[2]] + tables[0] + tables[1] + tables[2], np.int64)
    w = np.append(taps.ravel(), spec.cval)
    return DensePlan(w, w.astype(np.float32), M, nv * D * nyb)


@njit(**_JIT)
def _k_dense3(sa, oa, Wt, Ma, La, it0, it1):
    """Work items ``it0 .. it1`` (module docstring): source ``sa``, output ``oa`` (addresses),
    ``Wt`` the taps then ``cval`` (compute dtype), ``Ma`` the plan's ``M``, ``La`` the layout
    (``volume_kernels``' roles)."""
    fz = Wt[0]
    L = _VL(fz)
    isz = Wt.itemsize
    WP = _ptr(Wt.ctypes.data, fz)
    D, H, W = Ma[0], Ma[1], Ma[2]
    kd, kh, kw = Ma[3], Ma[4], Ma[5]
    nyb, i0, i1, s0 = Ma[6], Ma[7], Ma[8], Ma[9]
    zf = Ma[M_FOLDS:M_FOLDS + D + kd - 1]  # (views of M: the host's fold tables)
    yf = Ma[M_FOLDS + D + kd - 1:M_FOLDS + D + kd + H + kh - 2]
    xf = Ma[M_FOLDS + D + kd + H + kh - 2:M_FOLDS + D + kd + H + kh + W + kw - 3]
    nt = kd * kh * kw
    cval = Wt[nt]
    cv = _vsplat(WP, nt)
    sD, sH = La[R_SRC + 4], La[R_SRC + 5]
    oD, oH = La[R_OUT + 4], La[R_OUT + 5]
    NP = W + kw - 1
    RP = (NP + L - 1) // L * L + L  # the padded row's pitch (whole vectors)
    RA = (W + L - 1) // L * L + L  # the accumulator's
    buf = np.zeros(RP + RA + 2 * L + 64 // isz, Wt.dtype)
    ba = (buf.ctypes.data + 63) // 64 * 64
    P = _ptr(ba, fz)  # the padded row
    A = _ptr(ba + RP * isz, fz)  # the accumulator row
    zv = _vsplat(_ptr(ba + (RP + RA) * isz, fz), 0)  # (never written: +0.0)
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
            j = 0
            while j < W:  # SciPy's sum starts at +0.0
                _stv(A, j, zv, min(L, W - j), L)
                j += L
            for kz in range(kd):
                zz = zf[z + kz]
                for ky in range(kh):
                    yy = yf[y + ky]
                    t0 = (kz * kh + ky) * kw
                    if zz < 0 or yy < 0:  # (constant mode) a whole row of cval
                        j = 0
                        while j < NP:
                            _stv(P, j, cv, min(L, NP - j), L)
                            j += L
                    else:
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
                    for kx in range(kw):
                        if Wt[t0 + kx] == 0.0:
                            continue  # (outside the footprint, as in SciPy)
                        w = _vsplat(WP, t0 + kx)
                        j = 0
                        while j < W:
                            n = min(L, W - j)
                            _stv(A, j, _vadd(_ldv(A, j, n, L), _vmul(_ldv(P, kx + j, n, L), w)), n, L)
                            j += L
            orow = ob + z * oD + y * oH
            j = 0
            while j < W:
                n = min(L, W - j)
                _stv(out, orow + j, _ldv(A, j, n, L), n, L)
                j += L
    # (numba frees an array after its last use: the buffers read through raw pointers live to here)
    return buf.size + Wt.size + Ma.size + La.size
