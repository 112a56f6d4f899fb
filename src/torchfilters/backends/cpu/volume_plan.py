"""Host side of the volume engine (``volume``): a ``sep`` spec on a volume ``(D, H, W)`` as the
plan tables its one kernel interprets.

**Operators per axis.**  Every stencil is at most one 1-D pass per axis.  Along ``z`` (D) and
``y`` (H) a pass is a small sparse matrix, one row per output position: the list of
``(source index, weight)`` it sums (CSR).  Folding (every mode, any radius on any size) is in
those lists: forward rows are ``fold(i + lo + t)`` with tap ``t`` (``constant``: taps that land
outside are left out, the image is zero-padded; see the correction below); backward rows are
the rows of the transpose, ``{(i, w_t) : fold(i + lo + t) = s}`` -- border rows have extra
entries.  Along ``x`` (W) a pass is a vector correlation over a padded row: forward, the row's
pads are folded copies of the row; backward, the pads are zeros (the reversed taps on the
zero-padded gradient row) and the *border columns* whose transposed row folds (those that a
tap reaches across the edge) are recomputed from their exact CSR rows ("fix-ups").

**Sharing.**  Stencils that start with the same ``z`` pass (on the same source component)
share its result (a *z-node*); those that then share the ``y`` pass share a *y-node*: the
3-D Sobel magnitude's three stencils need two z-passes and three y-passes.

**Sequential constant mode.**  SciPy pads each pass's *input* with ``cval``.  The kernel
zero-pads and adds ``cval * C(z, y, x)`` per stencil, with ``C`` a sum of at most three
products of 1-D tables: the pass ``m`` (in the spec's order) contributes the sum of its taps
that land outside (``out_m``, along its axis) times, for every later pass ``l``, the sum of
its taps that land inside (``in_l``, along that axis: the later pass applied to a function
constant along it).  Any pass order is exact that way.

**Blocking.**  Work items are ``(volume, block of rows, chunk of planes)``; per output plane the
kernel runs the z-passes of the rows a block reads into per-thread row slots, then per output
row the y-passes into padded rows, then the x-passes and the epilogue, and stores once.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..._spec import FilterSpec, axis_mode, zero_signs
from .._lowering import ANTI, SYM, pass_kind
from .plan import _fold
from .simd import VBYTES

# header of P (int64)
(V_D, V_H, V_W, V_K, V_EPI, V_NZN, V_NYN, V_BY, V_NBY, V_ZC, V_NZC, V_G, V_RS, V_ZS, V_SMAX, V_CORR,
 V_PADL, V_PADR, V_PADT, V_ZN, V_YN, V_XN, V_SLOT, V_MAXE, V_XS, V_RMAX, V_ZP,
 V_BOX) = range(28)  # V_BOX .. V_BOX+5: the box [z0, z1) x [y0, y1) x [x0, x1) a selection may hold in
V_HDR = 48
# per stencil: y-node, x entries start, count, fix-ups count, offset, corr terms, offset, pair
# radius (``_pair_radius``: r symmetric, -r antisymmetric, 0 neither), offset of the centre tap
ST_LEN = 9
#: z-/y-node table entries: source component (z) or parent z-node (y), indptr, run flags, and
#: ``_pair_radius`` of a forward pass (``r``: symmetric taps, ``-r``: antisymmetric, 0: neither).
#: Such a pass is summed in SciPy's order on every row, the register-blocked runs and the single
#: rows alike (the border rows read their ``2r + 1`` folded source rows, and a zero row for a
#: ``constant`` tap that lands outside): a value is then the same whatever the blocking, which
#: makes a dask chunking exact
NODE_LEN = 4
#: zeros after the weights (the symmetric x-pass reads a block of weights past the last)
F_TAIL = 16

# F (float64): [cval, entry weights..., correction tables...]
EPI_STACK, EPI_SUM, EPI_MAG, EPI_MAGSCALE = 0, 1, 2, 3
#: selective blur: ``blend`` (forward: ``sel ? blur : x``), ``addrest`` (backward: ``blurT + (sel ? 0 : g)``);
#: ``sel`` is ``M >= thr`` inside the plan's box (``M``: the input, or the mask as 0/1)
EPI_BLEND, EPI_ADDREST = 4, 5
#: normalized selective blur: forward ``norm`` (``(w & den > 0) ? num / den : x``, the two blurs read
#: components 0 and 1), backward ``gdiv`` (writes ``[gd, rest]``: ``use ? g / den : 0``, ``use ? 0 : g``)
#: then ``normt`` (``m * blurT(gd) + rest``)
EPI_NORM, EPI_GDIV, EPI_NORMT = 6, 7, 8
_EPI = {"stack": EPI_STACK, "sum": EPI_SUM, "magnitude": EPI_MAG}

#: output rows (planes) one register-blocked step of the z- and y-passes computes
R = 8
#: bytes of z-pass row slots a work item keeps (``R`` planes of them, per thread)
_SLOT_BYTES = 1536 << 10
#: smallest block of rows on large planes
_MIN_BY = 16


def _skew(n, lanes, isz):
    """The smallest stride ``>= n`` elements, whole vectors, that is an odd number of cache lines
    modulo 4 KiB: the rows a register-blocked step stores (and the rows it then loads) never
    share an address modulo 4 KiB (false store-to-load dependencies)."""
    n = -(-n // lanes) * lanes
    while ((n * isz) // 64) % 2 == 0 or (n * isz) % 64:
        n += lanes
    return n


def passes_by_axis(st):
    """``{axis: Pass}`` of a ``sep`` stencil with at most one pass per axis, else None."""
    if st.kind != "sep":
        return None
    d = {}
    for p in st.passes:
        if p.axis in d or p.axis not in (-3, -2, -1):
            return None
        d[p.axis] = p
    return d


def supported(spec) -> bool:
    """Does the volume engine run ``spec`` (else the reference engine does)?"""
    if not isinstance(spec, FilterSpec) or spec.epilogue not in _EPI or not spec.stencils:
        return False
    if not 1 <= spec.ndim <= 3:
        return False
    for st in spec.stencils:
        d = passes_by_axis(st)
        if d is None:
            return False
        if not all(math.isfinite(w) for p in d.values() for w in p.taps):
            return False
    return math.isfinite(spec.cval) or "constant" not in modes3(spec)


def modes3(spec):
    """The boundary mode of each of the three volume axes (a spec of fewer axes runs on a
    volume with leading axes of size 1: their mode never matters)."""
    nd = spec.ndim
    return tuple(axis_mode(spec.mode, a, nd) if a >= -nd else "reflect" for a in (-3, -2, -1))


def _csr_forward(p, n, mode):
    """Rows ``i``: ``[(fold(i + lo + t), w_t)]`` (every tap: a zero tap multiplies a NaN too).
    ``constant``: a tap that lands outside is left out, or, for (anti)symmetric taps
    (``_pair_radius``), kept with source -1 (the kernel reads a zero row there: every row has the
    ``2r + 1`` taps)."""
    if p is None:
        return [[(i, 1.0)] for i in range(n)]
    k = len(p.taps)
    f = _fold(n, p.lo, n + k - 1, mode)
    keep = _pair_radius(p.taps) != 0
    return [[(int(f[i + t]), w) for t, w in enumerate(p.taps) if keep or f[i + t] >= 0] for i in range(n)]


def _csr_backward(p, n, mode):
    """Rows ``s`` of the transpose: ``[(i, w_t)]`` with ``fold(i + lo + t) = s`` (non-zero taps
    only, as the reference adjoint)."""
    if p is None:
        return [[(i, 1.0)] for i in range(n)]
    k = len(p.taps)
    f = _fold(n, p.lo, n + k - 1, mode)
    rows = [[] for _ in range(n)]
    for i in range(n):
        for t, w in enumerate(p.taps):
            s = f[i + t]
            if s >= 0 and w != 0.0:
                rows[s].append((i, w))
    return rows


def _pair_radius(wts):
    """``r`` for the symmetric taps of radius ``r``, ``-r`` for antisymmetric ones (SciPy's pair
    sums), else 0: SciPy's classification, ``_lowering.pass_kind`` (lowered taps are exact
    mirrors, ``_lowering.canonical_pass``)."""
    k = len(wts)
    if k < 3:
        return 0
    kind = pass_kind(tuple(wts))
    return k // 2 if kind == SYM else (-(k // 2) if kind == ANTI else 0)


def _sym(wts):
    """The radius of symmetric taps, else 0."""
    return max(0, _pair_radius(wts))


def _node_radius(p, backward):
    """The node table's radius: :func:`_pair_radius` of a forward pass, else 0."""
    return 0 if backward or p is None else _pair_radius(p.taps)


def _runs(rows, block=None):
    """Per row ``i``: non-zero where rows ``i .. i+R-1`` are *regular* -- the same weights on
    consecutive sources, shifted by one per row (and, with ``block``, in one block of rows): the
    register-blocked step computes them together, one load per tap for ``R`` rows (the node's
    radius says how: ``NODE_LEN``)."""
    n = len(rows)
    sig = []
    for row in rows:
        ok = bool(row) and row[0][0] >= 0 and all(row[e + 1][0] == row[e][0] + 1 for e in range(len(row) - 1))
        sig.append((tuple(w for _, w in row), row[0][0]) if ok else None)
    out = [0] * n
    for i in range(n - R + 1):
        s0 = sig[i]
        if s0 is None or (block and i // block != (i + R - 1) // block):
            continue
        if all(sig[i + r] is not None and sig[i + r][0] == s0[0] and sig[i + r][1] == s0[1] + r for r in range(1, R)):
            out[i] = 1
    return out


def _inside(p, n, mode):
    """Per position: (sum of the taps that read inside, sum of those that fall outside); a
    non-constant axis reads inside everywhere."""
    if p is None:
        return np.ones(n), np.zeros(n)
    k = len(p.taps)
    w = np.asarray(p.taps, np.float64)
    if mode != "constant":
        return np.full(n, math.fsum(p.taps)), np.zeros(n)
    pos = np.arange(n)[:, None] + p.lo + np.arange(k)[None, :]
    inside = (pos >= 0) & (pos < n)
    return (inside * w).sum(1), (~inside * w).sum(1)


class VolPlan(NamedTuple):
    P: np.ndarray
    F: np.ndarray
    nitems: int
    K: int  # stencils
    aux_k: int  # components the source has (backward of stack: K)


_plan_cache: dict = {}


def plan(spec, sizes, backward, nvol, nthreads, isz, magscale=False, epi=None, box=None, multi=False):
    """The tables for ``spec`` (lowered, :func:`supported`) on volumes of ``sizes = (D, H, W)``.

    ``backward``: the transposed operators (and the epilogue ``sum`` over the stencils, each
    reading its own source component when the forward epilogue is ``stack``);
    ``magscale``: forward passes with the epilogue that scales ``g`` by ``y_k / |y|``; ``epi``: another
    epilogue (``EPI_*``); ``box``: ``(z0, z1, y0, y1, x0, x1)`` where a selection may hold (default:
    the volume); ``multi``: forward, stencil ``k`` reads source component ``k``."""
    key = (spec, tuple(sizes), backward, nvol, nthreads, isz, magscale, epi, box, multi, math.copysign(1.0, spec.cval),
           zero_signs(spec))
    hit = _plan_cache.get(key)
    if hit is not None:
        return hit
    out = _build(spec, tuple(sizes), backward, nvol, nthreads, isz, magscale, epi, box, multi)
    if len(_plan_cache) > 256:
        _plan_cache.clear()
    _plan_cache[key] = out
    return out


def _build(spec, sizes, backward, nvol, nthreads, isz, magscale, epi_override=None, box=None, multi=False):
    D, H, W = sizes
    mz, my, mx = modes3(spec)
    sts = [passes_by_axis(st) for st in spec.stencils]
    K = len(sts)
    lanes = VBYTES // isz
    if backward:
        epi = EPI_SUM
        comps = spec.epilogue == "stack" and K > 1
    else:
        epi = EPI_MAGSCALE if magscale else _EPI[spec.epilogue]
        comps = multi
    csr = _csr_backward if backward else _csr_forward

    F = [spec.cval, 0.0]  # float64

    # ---- z-nodes and y-nodes (dedupe by (component, pass) and (z-node, pass))
    znodes, ynodes, st_y = {}, {}, []
    for k, d in enumerate(sts):
        zk = (k if comps else 0, d.get(-3))
        if zk not in znodes:
            znodes[zk] = len(znodes)
        yk = (znodes[zk], d.get(-2))
        if yk not in ynodes:
            ynodes[yk] = len(ynodes)
        st_y.append(ynodes[yk])
    NZN, NYN = len(znodes), len(ynodes)

    # ---- y: rows per block, slots
    ycsr = {c: csr(p, H, my) for (a, p), c in ynodes.items()}
    ext = [i - s for rows in ycsr.values() for i, row in enumerate(rows) for s, _ in row if s >= 0]
    ey = (max(ext) - min(ext)) if ext else 0
    Wr = -(-W // lanes) * lanes
    ZS = _skew(Wr, lanes, isz)
    rows_fit = _SLOT_BYTES // max(1, R * NZN * ZS * isz)
    BY = H if H + ey <= rows_fit else min(H, max(_MIN_BY, rows_fit - ey))
    NBY = -(-H // BY)
    slots_of = []
    for b in range(NBY):
        need = sorted({s for rows in ycsr.values() for i in range(b * BY, min(H, b * BY + BY)) for s, _ in rows[i]
                       if s >= 0})
        slots_of.append(need)
    SMAX = max(1, max(len(s) for s in slots_of))

    # ---- z
    ez_ext = 0
    zn_tab = []
    zcsr = {}
    for (comp, p), a in sorted(znodes.items(), key=lambda kv: kv[1]):
        rows = csr(p, D, mz)
        zcsr[a] = rows
        zn_tab.append((comp, rows, p))
        for i, row in enumerate(rows):
            for s, _ in row:
                if s >= 0:
                    ez_ext = max(ez_ext, abs(s - i))

    # ---- x: taps, pads, fix-ups per stencil
    xs = []
    padl = padr = 0
    for k, d in enumerate(sts):
        p = d.get(-1)
        if p is None:
            offs, wts, fix = [0], [1.0], []
        elif not backward:
            offs = [p.lo + t for t in range(len(p.taps))]
            wts = list(p.taps)
            fix = []
        else:
            offs = [-(p.lo + t) for t, w in enumerate(p.taps) if w != 0.0]
            wts = [w for w in p.taps if w != 0.0]
            rows = _csr_backward(p, W, mx)
            f = _fold(W, p.lo, W + len(p.taps) - 1, mx)
            cols = set()
            for i in range(W):
                for t, w in enumerate(p.taps):
                    q = i + p.lo + t
                    if w != 0.0 and not 0 <= q < W and f[i + t] >= 0:
                        cols.add(int(f[i + t]))
            fix = [(c, rows[c]) for c in sorted(cols)]
        if offs:
            padl = max(padl, -min(offs))
            padr = max(padr, max(offs))
        xs.append((offs, wts, fix))
    # Y rows: a vector of slack left of the pads and three right of them (the symmetric x-pass
    # reads whole vector pairs), whole vectors apart
    G = -(-padl // lanes) * lanes + lanes
    RS = _skew(G + Wr + padr + 3 * lanes, lanes, isz)
    if backward:
        padt = [-1] * (padl + padr)
    else:
        fl = _fold(W, -padl, padl, mx) if padl else []
        fr = _fold(W, W, padr, mx) if padr else []
        padt = [int(v) for v in fl] + [int(v) for v in fr]

    # ---- corrections (forward, constant mode, cval != 0)
    corr = not backward and spec.cval != 0.0 and "constant" in (mz, my, mx)
    # ---- lay out P
    hdr = np.zeros(V_HDR, np.int64)
    # global entries: P region E (sources), F region (weights) share ids
    ent_src, ent_w = [], []

    def add_rows(rows):
        """Append CSR rows; returns the indptr list (global entry ids)."""
        ptr = [len(ent_src)]
        for row in rows:
            for s, w in row:
                ent_src.append(s)
                ent_w.append(w)
            ptr.append(len(ent_src))
        return ptr

    tail = []  # int64 tables after the header, positions absolute

    def put(vals):
        pos = V_HDR + len(tail)
        tail.extend(int(v) for v in vals)
        return pos

    maxe = 1
    rmax = 0
    # z-node table: comp, indptr position
    zn = []
    for comp, rows, p in zn_tab:
        runs = _runs(rows)
        rad = _node_radius(p, backward)
        rmax = max(rmax, abs(rad))
        zn += [comp, put(add_rows(rows)), put(runs), rad]
        maxe = max(maxe, max((len(r) for r in rows), default=0))
    # y-node table: parent, indptr position (entries: slot of the row's block)
    yn = []
    for (a, p), c in sorted(ynodes.items(), key=lambda kv: kv[1]):
        rows = ycsr[c]
        srows = []
        for i, row in enumerate(rows):
            sl = slots_of[i // BY]
            pos = {r: j for j, r in enumerate(sl)}
            srows.append([(pos[s] if s >= 0 else -1, w) for s, w in row])
        runs = _runs(srows, BY)
        rad = _node_radius(p, backward)
        rmax = max(rmax, abs(rad))
        yn += [a, put(add_rows(srows)), put(runs), rad]
        maxe = max(maxe, max((len(r) for r in rows), default=0))
    # stencils
    stt = []
    corr_tabs = []
    for k, d in enumerate(sts):
        offs, wts, fix = xs[k]
        x0 = len(ent_src)
        ent_src.extend(offs)
        ent_w.extend(wts)
        maxe = max(maxe, len(offs))
        ftab = []
        for c, row in fix:
            e0 = len(ent_src)
            for s, w in row:
                ent_src.append(s)
                ent_w.append(w)
            ftab += [c, e0, len(row)]
        fpos = put(ftab) if ftab else 0
        terms = []
        if corr:
            order = [p for p in spec.stencils[k].passes]
            tabs = {a: (_inside(d.get(a), n, m)) for a, n, m in ((-3, D, mz), (-2, H, my), (-1, W, mx))}
            for mi, pm in enumerate(order):
                fac = {-3: np.ones(D), -2: np.ones(H), -1: np.ones(W)}
                fac[pm.axis] = tabs[pm.axis][1]
                for pl in order[mi + 1:]:
                    fac[pl.axis] = fac[pl.axis] * tabs[pl.axis][0]
                if np.any(fac[pm.axis] != 0.0):
                    terms.append(fac)
        cterm = []
        for fac in terms:
            offs3 = []
            for a in (-3, -2, -1):
                offs3.append(len(corr_tabs))
                corr_tabs.extend(fac[a].tolist())
            cterm += offs3
        cpos = put(cterm) if cterm else 0
        step = offs[1] - offs[0] if len(offs) > 1 else 1
        contiguous = step in (1, -1) and all(offs[e + 1] == offs[e] + step for e in range(len(offs) - 1))
        xr = (_pair_radius(wts) if not backward else _sym(wts)) if contiguous else 0
        rmax = max(rmax, abs(xr))  # (the antisymmetric x-pass reads 2r + 1 addresses)
        stt += [st_y[k], x0, len(offs), len(fix), fpos, len(terms), cpos, xr, offs[abs(xr)] if xr else 0]
    # block slots: per block position of [n, rows...]
    spos = []
    for sl in slots_of:
        spos.append(put([len(sl)] + sl))
    slot_pos = put(spos)
    zn_pos = put(zn)
    yn_pos = put(yn)
    xn_pos = put(stt)
    padt_pos = put(padt) if padt else 0
    e_pos = V_HDR + len(tail)  # entries' sources
    f_ent = len(F)
    F.extend(ent_w)
    f_corr = len(F)
    F.extend(corr_tabs)
    F.extend([0.0] * F_TAIL)
    # relocate: indptr values are global entry ids; the kernel reads P[e_pos + id], F[f_ent + id];
    # correction offsets are relative to f_corr
    hdr[[V_D, V_H, V_W, V_K, V_EPI, V_NZN, V_NYN]] = [D, H, W, K, epi, NZN, NYN]
    # z-chunks: enough work items for the threads, chunks long enough to reuse their halo
    nzc = max(1, -(-4 * nthreads // max(1, nvol * NBY))) if nvol * NBY < 4 * nthreads else 1
    nzc = min(nzc, max(1, D // max(8, 2 * ez_ext)))
    ZC = -(-D // nzc)
    NZC = -(-D // ZC)
    hdr[[V_BY, V_NBY, V_ZC, V_NZC, V_G, V_RS, V_ZS, V_SMAX, V_CORR]] = [BY, NBY, ZC, NZC, G, RS, ZS, SMAX, corr]
    hdr[[V_PADL, V_PADR, V_PADT, V_ZN, V_YN, V_XN, V_SLOT, V_MAXE, V_XS]] = [
        padl, padr, padt_pos, zn_pos, yn_pos, xn_pos, slot_pos, maxe, Wr]
    hdr[V_RMAX] = rmax
    hdr[V_BOX:V_BOX + 6] = box if box is not None else (0, D, 0, H, 0, W)
    if epi_override is not None:
        hdr[V_EPI] = epi_override
    hdr[V_ZP] = _skew(NZN * SMAX * ZS, lanes, isz)
    hdr[V_HDR - 3] = e_pos
    hdr[V_HDR - 2] = f_ent
    hdr[V_HDR - 1] = f_corr
    Pa = np.concatenate([hdr, np.asarray(tail, np.int64), np.asarray(ent_src, np.int64)]).astype(np.int64)
    Fa = np.asarray(F, np.float64)
    return VolPlan(Pa, Fa, nvol * NBY * NZC, K, K if comps else 1)


V_EPOS, V_FENT, V_FCORR = V_HDR - 3, V_HDR - 2, V_HDR - 1
