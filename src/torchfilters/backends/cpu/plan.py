"""Spec to plan: the Python side that lowers a spec, an image size and a blocking into
the ``P``/``F`` tables (cached), and a call's tensors into the layout ``L``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..._spec import FilterSpec, by_identity, zero_signs
from .. import reference
from .._lowering import pass_entries
from .._layout import collapse_planes
from .tables import (
    EPI_BLEND, EPI_DIR, EPI_MAG, EPI_NORM, EPI_STACK, EPI_SUM, F_TAPS, I_BI0, I_BI1, I_BJ0, I_BJ1, I_BR, I_BX, I_CONST,
    I_CW, I_EPI, I_EXHI, I_EXLO, I_EYHI, I_EYLO, I_FH, I_FW, I_H, I_HDR, I_K, I_KEEPB, I_MP, I_NB, I_NBX, I_NC,
    I_NPM, I_PAD, I_ST, I_TAPI, I_W, ST_LEN,
)

# =============================================================================
# Python side: plans (cached), layouts, allocation, dispatch


_EPI = {"stack": EPI_STACK, "magnitude": EPI_MAG, "direction": EPI_DIR, "sum": EPI_SUM}

#: target elements of a tile row block (a few buffers of this size stay in L2)
_TILE = 1 << 15
#: planes up to this many elements (padded) are processed whole, one work item each
_WHOLE = 1 << 15
#: calls with at most this many output elements run serially in the calling thread
_SERIAL = 1 << 14
#: widest image the flat layout handles (wider: padded rows and column strips)
_FLAT_MAX_W = 1024
#: column strip width of the forward pass on wide images
_STRIP = 512
#: small planes are stacked into tiles of about this many elements
_STACK = 1 << 12


class Norm(NamedTuple):
    """A stencil as tap lists ``(dy, dx, w)``: ``vt`` then ``ht`` (a two-phase separable
    stencil), or ``dt`` alone (one phase); ``passes`` are its 1-D passes (``sep``)."""

    vt: list
    ht: list
    dt: list
    passes: tuple


class Info(NamedTuple):
    """What a spec's plans share, whatever the image size (``_info``)."""

    norm: list  # one Norm per stencil
    epi: int  # EPI_*
    mode: str
    cval: float
    extent: tuple  # (eylo, eyhi, exlo, exhi): the offsets every stencil reads, 0 included
    keep_border: bool
    blur_extent: tuple  # ((lo, hi) along H, (lo, hi) along W) of a blur's stencil, else None


class Plan(NamedTuple):
    """A spec's plan for one image size and blocking: the kernel tables and the work split."""

    P: np.ndarray  # int64 table (tables.py)
    F: np.ndarray  # float64 table
    per: int  # work items per group of planes
    mp: int  # planes per group


_info_cache: dict = {}
_plan_cache: dict = {}
_lay_cache: dict = {}


def _norm_stencil(st):
    """Stencil -> (vt, ht, dt, passes): tap lists of (dy, dx, w) for a two-phase
    separable stencil (vt then ht) or a one-phase one (dt); None if unsupported.
    Dense kernels leave zero weights out of the footprint (SciPy's 2-D correlate)."""
    if st.kind == "dense":
        ly, lx = st.lo
        dt = [(ly + a, lx + b, float(w)) for a, row in enumerate(st.taps) for b, w in enumerate(row) if w != 0.0]
        return Norm([], [], dt, ())
    passes = st.passes
    if not passes:
        return Norm([], [], [(0, 0, 1.0)], ())
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
        return Norm([], [], taps(passes[0]), passes)
    vp, hp = (passes[0], passes[1]) if passes[0].axis == -2 else (passes[1], passes[0])
    vt, ht = taps(vp), taps(hp)
    if vt == [(0, 0, 1.0)]:
        return Norm([], [], ht, passes)
    if ht == [(0, 0, 1.0)]:
        return Norm([], [], vt, passes)
    return Norm(vt, ht, [], passes)


def _fwd_passes(passes):
    """The forward's 1-D passes of a ``sep`` stencil, in the spec's order (unit passes left out:
    ``x * 1.0`` is ``x``): ``(axis, kind, taps)``, the taps ``(dy, dx, w)`` in SciPy's order of
    summation (``_lowering.pass_entries``, ``tables.ST_LEN``)."""
    out = []
    for p in passes:
        if p.taps == (1.0,):
            continue
        kind, ent = pass_entries(p)
        out.append((p.axis, kind, [(o, 0, w) if p.axis == -2 else (0, o, w) for o, w in ent]))
    return out


@by_identity(1024)
def _info(spec):
    """Per-spec data that does not depend on the image size (cached by identity, then by
    value)."""
    # -0.0 == 0.0, but SciPy keeps the sign (of cval, and of zero taps: ``zero_signs``)
    key = (spec, math.copysign(1.0, spec.cval), zero_signs(spec))
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
            info = Info(norm, epi, spec.mode, float(spec.cval), (eylo, eyhi, exlo, exhi), keep, bext)
    if len(_info_cache) > 4096:
        _info_cache.clear()
    _info_cache[key] = info
    return info


def _fold(n, lo, length, mode):
    """int64 ``(length,)``: the index read at positions ``lo .. lo + length - 1`` of an axis of
    size ``n`` (``reference.fold_indices``, SciPy's folding), ``-1`` for ``cval``.  The one host
    fold table of the CPU engine's plans (made on the CPU whatever the default device)."""
    idx = reference.fold_indices(n, lo, length, mode, device="cpu").numpy().astype(np.int64)
    if mode == "constant":
        idx[idx == n] = -1
    return idx


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
    return float(torch.tensor(threshold, dtype=dt, device="cpu"))


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
    # where nothing is corrected (the rows or columns whose taps all fall inside), -0.0: the
    # one value whose sum leaves every result as it is, its sign of zero included (a +0.0 made
    # SciPy's -0.0 results +0.0 inside the image)
    corr = np.where(corr == 0.0, -0.0, corr)
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
    eylo, eyhi, exlo, exhi = info.extent
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
    fwd = [_fwd_passes(passes) for _vt, _ht, _dt, passes in norm]
    ntaps = sum(len(vt) + len(ht) + len(dt) for vt, ht, dt, _ in norm) + sum(len(t) for ph in fwd for *_h, t in ph)
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
        phases = fwd[len(st) // ST_LEN]
        d += [len(phases)]
        for axis, kind, lst in phases:
            d += [axis, kind, len(lst), len(taps_w)]
            for dy, dx, w in lst:
                taps_i += [dy, dx]
                taps_w.append(w)
        d += [0, 0, 0, 0] * (2 - len(phases))
        assert len(d) == ST_LEN
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
    plan = Plan(P, F, NB * NC, MP)
    if len(_plan_cache) > 1024:
        _plan_cache.clear()
    _plan_cache[key] = (info, plan)
    return plan




def _lead(sizes, strides):
    """Leading dims -> (n1, s0, s1) with plane p at (p // n1)*s0 + (p % n1)*s1, or None."""
    return collapse_planes(sizes, strides)


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
        o = torch.empty(o.shape, dtype=o.dtype, device="cpu")
    return x, o, g, m, _layout(x, o, ok, g, gk, m), tmp




def _small(N, H, W):
    return N * H * W <= _SERIAL
