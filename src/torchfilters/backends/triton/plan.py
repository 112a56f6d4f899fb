"""Host side of the general footprint kernels: specs lowered to footprints, constant-mode
corrections, preimage slots, tiles and the cached launch plan (see :mod:`.footprint`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton.language as tl

from ..._spec import BlurSpec, Stencil, zero_signs
from ..._validate import compute_dtype
from .._lowering import lower, pass_entries

_MODES = {"reflect": 0, "mirror": 1, "nearest": 2, "wrap": 3, "constant": 4}
# epilogues
_STACK, _MAG, _DIR, _BLEND, _NORM = 0, 1, 2, 3, 4
_U_MAG, _U_DIR, _U_NORM = 5, 6, 7  # forward variants that write u for the two-kernel backward
_SUM = 8  # the two stencils' results added, each summed on its own (SciPy's terms, in order)
_EPILOGUES = {"stack": _STACK, "magnitude": _MAG, "direction": _DIR, "sum": _SUM}


#: taps up to which loops are unrolled
_UNROLL_MAX = 32
#: footprints above which magnitude/direction/normalized backward go through a u buffer
_RECOMPUTE_MAX = 12

# tile limits (tests shrink them to exercise multi-tile paths)
# (the backward's tiles are larger: its border bands cost per program, so more planes / rows
# per program amortise them)
_TILE = {"max_bw": 64, "max_elems": 1024, "max_bp": 8, "bwd_elems": 2048}


def set_tile_limits(max_bw=None, max_elems=None, max_bp=None, bwd_elems=None):
    """Override tile limits (powers of two); returns the previous ones.  For tests."""
    old = dict(_TILE)
    for k, v in (("max_bw", max_bw), ("max_elems", max_elems), ("max_bp", max_bp), ("bwd_elems", bwd_elems)):
        if v is not None:
            _TILE[k] = int(v)
    _PLANS.clear()
    return old

def single_fold(n, before, after, mode) -> bool:
    """Whether every position up to ``before`` samples before an axis of ``n`` and ``after``
    past it is within one reflection of it (``_fold``'s cheap ``SINGLE`` form applies)."""
    if mode in ("nearest", "constant"):
        return True
    if mode == "mirror":
        return n >= 2 and before <= n - 1 and after <= n - 1
    return before <= n and after <= n


def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()

def _stencil_taps(st: Stencil, mode: str, cval: float):
    """``({(dy, dx): w}, [(axis, d, coeff)])`` for one stencil, or None if not supported.

    The forward footprint: a ``sep`` stencil keeps its zero taps (SciPy's 1-D passes
    multiply every tap, so a NaN under a zero tap is NaN), a ``dense`` one drops them.
    """
    if st.kind == "dense":  # zero taps are outside the footprint (SciPy's 2-D correlate)
        taps = {}
        for a, row in enumerate(st.taps):
            for b, w in enumerate(row):
                if w != 0.0:
                    taps[(st.lo[0] + a, st.lo[1] + b)] = float(w)
        return taps, []
    passes = st.passes
    if not passes:
        return {(0, 0): 1.0}, []
    if len(passes) == 1:
        p = passes[0]
        taps = {}
        for i, w in enumerate(p.taps):
            d = p.lo + i
            taps[(d, 0) if p.axis == -2 else (0, d)] = float(w)
        return taps, []
    if len(passes) == 2 and passes[0].axis != passes[1].axis:
        inner, outer = passes
        ti = [(inner.lo + i, float(w)) for i, w in enumerate(inner.taps)]
        to = [(outer.lo + i, float(w)) for i, w in enumerate(outer.taps)]
        taps = {}
        for di, wi in ti:
            for do, wo in to:
                taps[(di, do) if inner.axis == -2 else (do, di)] = wi * wo
        corr = []
        if mode == "constant" and cval != 0.0:
            k = 1.0 - math.fsum(w for _, w in ti)
            if k != 0.0:
                corr = [(outer.axis, do, cval * k * wo) for do, wo in to]
        return taps, corr
    return None

def _slots(n: int, lo: int, hi: int, mode: str):
    """Extra preimages along one axis, as slots ``(A, B, lo, hi, P)``.

    ``P < 0``: for every ``p`` in ``[lo, hi]``, ``j = A p + B != p`` lies in the padded range
    ``[min(lo, 0), n - 1 + max(hi, 0)]`` and folds onto ``p``.  ``P >= 0`` (nearest mode):
    every ``j`` in ``[lo, hi]`` folds onto ``P`` (``A, B = 1, 0``).  Every ``(p, j)`` with
    ``j != p`` and ``fold(j) = p`` appears exactly once.
    """
    L, U = min(lo, 0), n - 1 + max(hi, 0)
    out = []

    def add(alpha, beta, a, b):
        a, b = max(a, 0), min(b, n - 1)
        if a <= b:
            out.append((alpha, beta, a, b, -1))

    if mode == "constant":
        return out
    if mode == "nearest" or (mode == "mirror" and n == 1):
        if L <= -1:
            out.append((1, 0, L, -1, 0))
        if U >= n:
            out.append((1, 0, n, U, n - 1))
        return out
    P = {"reflect": 2 * n, "mirror": 2 * n - 2, "wrap": n}[mode]
    mlo, mhi = (L - n) // P - 1, -((-(U + n)) // P) + 1
    for m in range(mlo, mhi + 1):
        if m != 0:  # family A: j = p + P m
            add(1, P * m, L - P * m, U - P * m)
        if mode == "reflect":  # family B: j = 2n - 1 - p + P m
            beta = P - 1 + P * m
            add(-1, beta, beta - U, beta - L)
        elif mode == "mirror":  # j = P m - p; at p = 0 and p = n - 1 that is family A again
            beta = P * m
            add(-1, beta, max(beta - U, 1), min(beta - L, n - 2))
    return out

def _table(t0: dict, t1: dict, shared: bool):
    """Footprint table ``(dys, dxs, w0, w1, NA, NB)`` of two stencils' taps, ordered
    *stencil 0 only* (NA), *both* (NB), *stencil 1 only*.  ``shared``: one stencil read
    by two channels (normalized blur): every tap is in both."""
    if shared:
        a, b, c = [], sorted(t0), []
        t1 = t0
    else:
        a = sorted(k for k in t0 if k not in t1)
        b = sorted(k for k in t0 if k in t1)
        c = sorted(k for k in t1 if k not in t0)
    offs = a + b + c  # (none at all: an empty footprint sums to +0.0, as SciPy's, whatever the samples)
    return ([o[0] for o in offs], [o[1] for o in offs], [t0.get(o, 0.0) for o in offs],
            [t1.get(o, 0.0) for o in offs], len(a), len(b))

def _sep_tables(stencils, base: int, floats: list):
    """``([SP per stencil], offsets, unrolled?)`` for ``_sep_stencil``: per stencil its passes in
    the spec's order (unit passes left out: ``x * 1.0`` is ``x``), each as
    ``_lowering.pass_entries``; the offsets go to ``ip`` at ``base`` (before the slot tables:
    their place does not depend on the image's size), the weights are appended to ``floats``."""
    sps, offs = [], []
    sun = True
    for st in stencils:
        sp = []
        phases = [p for p in st.passes if p.taps != (1.0,)]
        for p in phases:
            kind, ent = pass_entries(p)
            sp += [p.axis, kind, len(ent), len(floats), base + len(offs)]
            floats += [w for _, w in ent]
            offs += [o for o, _ in ent]
        sp += [0] * (10 - len(sp))
        sps.append(tuple([len(phases)] + sp))
        n = 1
        for p in phases:
            n *= len(p.taps)
        sun = sun and n <= _UNROLL_MAX
    return sps, offs, sun

class _Plan(NamedTuple):
    ip: torch.Tensor
    fp: torch.Tensor
    ce: dict  # constexprs shared by both kernels
    NT: int
    ext: tuple  # (by0, by1, bx0, bx1) keep-border extents
    SY: int
    SX: int
    BBY: int
    BBX: int
    fwd: tuple  # (BP, BH, BW, n_th, n_tw, warps) of the forward kernel
    bwd: tuple  # ... of the backward kernel
    recompute: bool

def _tiling(H, W, NP, elems):
    """``(BP, BH, BW, n_th, n_tw, warps)``: tiles of about ``elems`` elements, 4 per thread."""
    BW = min(_np2(W), _TILE["max_bw"])
    BH = min(_np2(H), max(1, elems // BW))
    BP = max(1, min(_TILE["max_bp"], elems // (BH * BW), _np2(NP)))
    warps = max(1, min(8, BP * BH * BW // 128))
    return BP, BH, BW, -(-H // BH), -(-W // BW), warps

_PLANS: dict = {}
#: the device tables of evicted plans, kept alive: a CUDA graph captured with a plan's launch
#: still reads them (a few hundred bytes each; the row kernel has no tables at all)
_RETIRED: list = []

def _gather_bands() -> bool:
    """Whether the backward places its border bands of several rows (columns) with a gather
    (the package's ``GATHER_BANDS``, read per plan); else one row (column) a step."""
    from . import GATHER_BANDS

    return GATHER_BANDS


def _lower(spec, H, W, NP, dtype, device, threshold):
    """Build (and cache) the launch plan of ``spec`` on ``NP`` planes of ``H x W``."""
    spec = lower(spec, (H, W))  # taps folded onto the image's period (a huge radius on a small image)
    # cval's sign is part of the key (-0.0 == 0.0 but pads differently signed zeros)
    gather = _gather_bands()
    key = (spec, math.copysign(1.0, spec.cval), H, W, min(NP, 64), dtype, device, threshold, tuple(_TILE.values()),
           zero_signs(spec), gather)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    acc = compute_dtype(dtype)
    if isinstance(spec, BlurSpec):
        mode, cval = spec.mode, (0.0 if spec.normalized else spec.cval)
        lowered = _stencil_taps(spec.stencil, mode, cval)
        if lowered is None:
            return None
        taps, corr = lowered
        if spec.normalized:  # two channels (m x, m) through the same stencil
            stencils = [(taps, corr), (taps, corr)]
            K, CH = 1, 1
        else:
            stencils = [(taps, corr)]
            K, CH = 1, 0
        sepf = z0 = False
        (ly, hy), (lx, hx) = spec.stencil.extent(-2), spec.stencil.extent(-1)
        ext = (ly, hy, lx, hx)
    else:
        if len(spec.stencils) > 2 or (spec.epilogue == "direction" and len(spec.stencils) != 2):
            return None
        mode, cval = spec.mode, spec.cval
        stencils = []
        # sep stencils run pass by pass in SciPy's order (``_sep_stencil``; constant mode exact
        # there: no correction terms); the footprint stays their adjoint's
        # (a sum's terms too: each is its own stencil, added in the epilogue as SciPy adds them)
        sepf = all(st.kind == "sep" for st in spec.stencils)
        # dense stencils (N-D correlate / convolve) sum from +0.0, as SciPy's ``correlate``
        z0 = all(st.kind == "dense" for st in spec.stencils)
        for st in spec.stencils:
            lowered = _stencil_taps(st, mode, cval)
            if lowered is None:
                return None
            stencils.append((lowered[0], []) if sepf else lowered)
        K, CH = len(stencils), 0
        ext = (0, 0, 0, 0)
    t0 = stencils[0][0]
    t1 = stencils[1][0] if len(stencils) == 2 else {}
    # forward footprint (NaN reaches through every tap of it) and adjoint footprint (only
    # non-zero weights: the reference's adjoint skips zero taps), each grouped
    # "stencil 0 only", "both", "stencil 1 only"
    fwd = _table(t0, t1, CH == 1)
    adj = _table({k: w for k, w in t0.items() if w != 0.0}, {k: w for k, w in t1.items() if w != 0.0}, CH == 1)
    (dys, dxs, w0, w1, NA, NB), (dys2, dxs2, w0b, w1b, NA2, NB2) = fwd, adj
    NT, NT2 = len(dys), len(dys2)
    corr_y, corr_x = [], []
    for k, (_, corr) in enumerate(stencils[:2] if CH == 0 else stencils[:1]):
        for axis, d, c in corr:
            (corr_y if axis == -2 else corr_x).append((k, d, c))
    cy = sorted({d for _, d, _ in corr_y})
    cx = sorted({d for _, d, _ in corr_x})
    cy0 = [sum(c for k, d, c in corr_y if k == 0 and d == e) for e in cy]
    cy1 = [sum(c for k, d, c in corr_y if k == 1 and d == e) for e in cy]
    cx0 = [sum(c for k, d, c in corr_x if k == 0 and d == e) for e in cx]
    cx1 = [sum(c for k, d, c in corr_x if k == 1 and d == e) for e in cx]

    lo_y, hi_y, lo_x, hi_x = min(dys, default=0), max(dys, default=0), min(dxs, default=0), max(dxs, default=0)

    SINGLE = single_fold(H, -lo_y, hi_y, mode) and single_fold(W, -lo_x, hi_x, mode)
    sy = _slots(H, min(dys2, default=0), max(dys2, default=0), mode)  # preimages of the adjoint footprint
    sx = _slots(W, min(dxs2, default=0), max(dxs2, default=0), mode)

    fwd_tiles = _tiling(H, W, NP, _TILE["max_elems"])
    # (large unrolled adjoint footprints keep the forward's tile: registers)
    bwd_tiles = _tiling(H, W, NP, _TILE["bwd_elems"] if NT2 <= 12 else _TILE["max_elems"])
    BH2, BW2 = bwd_tiles[1], bwd_tiles[2]
    BBY = min(_np2(max([b - a + 1 for _, _, a, b, _ in sy], default=1)), BH2) if gather else 1
    BBX = min(_np2(max([b - a + 1 for _, _, a, b, _ in sx], default=1)), BW2) if gather else 1

    # ip: dy, dx, corr. rows, corr. cols, dy2, dx2, [sep offsets,] row slots, col slots
    # fp: w0, w1, corr. rows (2 x), corr. cols (2 x), cval, threshold, w0b, w1b
    # (and with sep stencils: their passes' offsets before the slots, weights at the end of fp)
    thr = threshold if threshold is not None else 0.0
    floats = w0 + w1 + cy0 + cy1 + cx0 + cx1 + [cval, thr] + w0b + w1b
    sps, soff, sun = [(0,) * 11, (0,) * 11], [], False
    if sepf:
        sps, soff, sun = _sep_tables(spec.stencils, 2 * NT + len(cy) + len(cx) + 2 * NT2, floats)
    ints = dys + dxs + cy + cx + dys2 + dxs2 + soff + [v for s in sy for v in s] + [v for s in sx for v in s]
    ip = torch.tensor(ints, dtype=torch.int32).to(device)
    fp = torch.tensor(floats, dtype=acc).to(device)
    unroll, unroll2 = NT <= _UNROLL_MAX, NT2 <= _UNROLL_MAX
    ce = dict(
        MODE=_MODES[mode], SINGLE=SINGLE, NT=NT, NA=NA, NB=NB, K=K,
        NCY=len(cy), NCX=len(cx), CH=CH, ACC=tl.float64 if acc == torch.float64 else tl.float32,
        UNROLL=unroll, F64=acc == torch.float64,
        DY=tuple(dys) if unroll else (), DX=tuple(dxs) if unroll else (),
        NT2=NT2, NA2=NA2, NB2=NB2, UNROLL2=unroll2,
        DY2=tuple(dys2) if unroll2 else (), DX2=tuple(dxs2) if unroll2 else (),
        SEPF=sepf, SP0=sps[0], SP1=sps[-1], SOFF=tuple([0] * (2 * NT + len(cy) + len(cx) + 2 * NT2) + soff) if sun else (),
        SUN=sun, NSO=len(soff), Z0=z0,
    )
    plan = _Plan(ip, fp, ce, NT, ext, len(sy), len(sx), BBY, BBX, fwd_tiles, bwd_tiles,
                 recompute=NT <= _RECOMPUTE_MAX)
    _PLANS[key] = plan
    if len(_PLANS) > 512:
        old = _PLANS.pop(next(iter(_PLANS)))
        _RETIRED.append((old.ip, old.fp))
    return plan
