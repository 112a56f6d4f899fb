"""Rank filters (median, minimum, maximum, any rank / percentile) on the Triton engine.

Same interface and results as :func:`.reference.rank_forward` / :func:`.reference.rank_backward`
(the oracle): values ordered as ``numpy.sort`` orders them (NaN after ``+inf``), ties in the
footprint's C order; exact in every dtype (a selection does no arithmetic; only the sign of a
tied zero may differ).  Specs of 1, 2 or 3 spatial axes, per-axis modes included, run on one
layout: the input as ``(N, D, H, W)`` (a 2-D spec has ``D = 1``, a 1-D one ``D = H = 1``),
tiles of ``[planes, rows, cols]`` outputs, each axis folded by its own mode (the same
``_fold`` as the stencil engine: 1-D index vectors per tap, no padding copies).

Kernels
-------
* **Selection network** (``count <= _NET_MAX`` window elements, any footprint):
  one kernel *generated per spec* (source text, compiled once and cached; CuPy's
  one-template-per-shape idea) with every tap's offsets constant and the window held in
  registers.  The network is the smaller of Batcher's odd-even merge sort and a known
  median network (Paeth/Devillard's 19-exchange median of 9) after pruning: only the
  ``min`` / ``max`` halves whose results reach output wire ``rank`` are emitted.  NaN is
  replaced by ``+inf`` on load and counted: the output is NaN where ``rank >= count - nans``.
* **Median of a 3x3 box** (any mode and origin): its own kernel (``_med3x3``), four outputs
  per lane along W.  A lane reads the 3 x 6 inputs of its four outputs as 4-column vectors
  (split in registers; tiles inside the image read three aligned vectors per row without
  folding, tiles at the border two folded ones), sorts each of the 6 columns once (shared
  by up to three outputs) and takes ``med3(max of lows, med3 of mids, min of highs)``
  (Paeth) with the pairwise max/min shared between neighbours.  sm_90 SASS, float32,
  interior tile: 62 instructions per output, 20 of them ``FMNMX`` (the generated median-of-9
  network: 30 ``FMNMX``, 132 instructions), 2.25 load instructions (128-bit where used),
  128-bit stores.
* **Minimum / maximum of full boxes of any size**: separable 1-D passes, one kernel per axis
  that reads anything (``x -> tmp -> out``; the intermediate holds exact elements in the
  input's dtype).  Along H and W, windows of ``_GW_MIN`` (21) or more run **van Herk /
  Gil-Werman** (``_gw_pass``): a program loads its outputs' span plus ``k - 1`` positions
  (folded), cuts it into segments of ``k``, and takes ``op(suffix[o], prefix[o + k - 1])``
  from two segmented ``tl.associative_scan`` s and two ``tl.gather`` s -- work per output
  independent of ``k``.  Shorter windows, the depth axis and spans past ``_GW_MAX_L`` run
  a direct loop (``_minmax_pass``).  NaN is ordered last by ``where`` forms, so ``min`` /
  ``max`` never see one (the interpreter and the GPU differ there).
* Other windows above ``_NET_MAX`` elements: the reference engine, counted in
  ``triton.FALLBACKS["rank_forward"]``.
* **Backward** (every spec, no fallback): one kernel per output tile scans the window in
  footprint order: ``less`` = elements ordered before ``y`` (the forward's result, NaN
  last), then the ``(rank - less)``-th element equal to ``y`` (NaN equals NaN) is the
  selected one; its folded source (nothing for constant-mode padding) receives the
  output's gradient by ``tl.atomic_add`` into a zeroed float32 buffer (float64 for
  float64), cast to the input's dtype at the end.  The order of the atomic additions is
  not fixed, so the backward is non-deterministic only in the rounding of the sums where
  several outputs select one input element.  Offsets are constants up to ``_UNROLL_MAX``
  taps, else read from a small int32 table cached per spec and device.

Device code uses Triton builtins only (see :mod:`.triton`).  The generated kernels are
decorated in the mode of the module (``TRITON_INTERPRET``); ``triton.py`` re-imports this
module whenever it is itself re-imported.
"""

from __future__ import annotations

import functools
import linecache
import math

import torch
import triton
import triton.language as tl

from ..._spec import RankSpec, axis_mode
from ..._validate import compute_dtype
from .. import reference as _ref
from . import FALLBACKS, LAUNCHES, _check_out, _device
from .plan import _MODES, _np2
from .prims import _fold

__all__ = ["rank_backward", "rank_forward"]

#: windows up to this many elements run the selection network
_NET_MAX = 49
#: taps up to which the backward's loops are unrolled with constant offsets
_UNROLL_MAX = 64
#: tile elements (the network kernel shrinks them for large windows: registers)
_TILE = {"max_bw": 64, "elems": 1024}


def set_tile_limits(max_bw=None, elems=None):
    """Override tile limits (powers of two); returns the previous ones.  For tests."""
    old = dict(_TILE)
    if max_bw is not None:
        _TILE["max_bw"] = int(max_bw)
    if elems is not None:
        _TILE["elems"] = int(elems)
    return old


# =============================================================================
# networks (host side)


def _batcher(n: int):
    """Batcher's odd-even merge sort on ``n`` wires (as on ``np2(n)`` wires whose last ones
    hold ``+inf``: comparators touching those are no-ops and are dropped)."""
    p = _np2(n)
    out = []
    k = 1
    while k < p:
        j = k
        while j >= 1:
            for i in range(j % k, p - j, 2 * j):
                for m in range(min(j, p - i - j)):
                    a, b = i + m, i + m + j
                    if a // (2 * k) == b // (2 * k) and b < n:
                        out.append((a, b))
            j //= 2
        k *= 2
    return out


#: Paeth / Devillard ``opt_med9``: the median of 9 in 19 compare-exchanges
_MED9 = [(1, 2), (4, 5), (7, 8), (0, 1), (3, 4), (6, 7), (1, 2), (4, 5), (7, 8), (0, 3),
         (5, 8), (4, 7), (3, 6), (1, 4), (2, 5), (4, 7), (4, 2), (6, 4), (4, 2)]


def _prune(net, n: int, r: int):
    """The ops of ``net`` (compare-exchanges ``(a, b)``: ``a`` gets the min, ``b`` the max;
    ``(4, 2)`` style pairs are as written) that reach wire ``r``: ``[(a, b, need_min,
    need_max)]``, in order."""
    need = {r}
    kept = []
    for a, b in reversed(net):
        nmin, nmax = a in need, b in need
        if nmin or nmax:
            kept.append((a, b, nmin, nmax))
            need.add(a)
            need.add(b)
    kept.reverse()
    return kept


@functools.lru_cache(maxsize=256)
def network(n: int, r: int):
    """The cheapest known selection network for rank ``r`` of ``n`` (pruned ops)."""
    cands = [_prune(_batcher(n), n, r)]
    if n == 9 and r == 4:
        cands.append(_prune(_MED9, n, r))
    return min(cands, key=lambda ops: sum(mn + mx for _, _, mn, mx in ops))


def net_cost(n: int, r: int) -> int:
    """``min``/``max`` operations per output of :func:`network`."""
    return sum(mn + mx for _, _, mn, mx in network(n, r))


# =============================================================================
# device code: the generated selection kernel


@triton.jit
def _tile_ids(n_th, n_tw, BP: tl.constexpr):
    """``(th, tw, planes)``: a program's tile row, tile column and its ``BP`` plane indices
    (int64; the last tile's may pass ``NP``).  Programs are numbered columns fastest."""
    pid = tl.program_id(0)
    tw = pid % n_tw
    rest = pid // n_tw
    th = rest % n_th
    pg = (rest // n_th).to(tl.int64)
    return th, tw, pg * BP + tl.arange(0, BP)


_SRC_HEAD = '''
@triton.jit
def {name}(x_ptr, o_ptr, NP, D, H, W, xs0, xs1, xs2, xs3, os0, os1, os2, os3, n_th, n_tw,
           BP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr):
    ACC = {acc}
    th, tw, pl = _tile_ids(n_th, n_tw, BP)
    rows = th * BH + tl.arange(0, BH)
    cols = tw * BW + tl.arange(0, BW)
    pv = pl < NP
    valid = pv[:, None, None] & (rows < H)[None, :, None] & (cols < W)[None, None, :]
    pl = tl.minimum(pl, NP - 1)
    pn = pl // D
    pd = pl % D
    nbase = pn * xs0
    nn = tl.full((BP, BH, BW), 0, tl.int32)
'''


def _fmt(v: float) -> str:
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(float(v))


def _single(n: int, lo: int, hi: int, mode: str) -> bool:
    """Every position ``lo .. n - 1 + hi`` within one reflection (the cheap fold)?"""
    if mode in ("nearest", "constant"):
        return True
    if mode == "mirror":
        return n >= 2 and -lo <= n - 1 and hi <= n - 1
    return -lo <= n and hi <= n


def _axis_code(lines, name, idx, n, d, mode, single, mask_shape):
    """Fold ``idx + d`` along one axis into variable ``f{name}``; constant mode: ``k{name}``."""
    m = _MODES[mode]
    if d == 0:
        lines.append(f"    f{name} = {idx}")
        return None
    lines.append(f"    j{name} = {idx} + {d}")
    lines.append(f"    f{name} = _fold(j{name}, {n}, {m}, {single})")
    if mode == "constant":
        lines.append(f"    k{name} = ((j{name} >= 0) & (j{name} < {n})){mask_shape}")
        return f"k{name}"
    return None


def _gen_source(name, offsets, modes, singles, cval, rank, acc):
    """Source of the selection kernel (``offsets`` as ``(dz, dy, dx)``)."""
    n = len(offsets)
    L = [_SRC_HEAD.format(name=name, acc=acc)]
    mz, my, mx = modes
    sz, sy, sx = singles
    zs = sorted({o[0] for o in offsets})
    ys = sorted({o[1] for o in offsets})
    xs = sorted({o[2] for o in offsets})
    zid = {d: i for i, d in enumerate(zs)}
    yid = {d: i for i, d in enumerate(ys)}
    xid = {d: i for i, d in enumerate(xs)}
    zk, yk, xk = {}, {}, {}
    for d in zs:
        zk[d] = _axis_code(L, f"z{zid[d]}", "pd", "D", d, mz, sz, "[:, None, None]")
        L.append(f"    zb{zid[d]} = (nbase + fz{zid[d]} * xs1)[:, None, None]")
    for d in ys:
        yk[d] = _axis_code(L, f"y{yid[d]}", "rows", "H", d, my, sy, "[None, :, None]")
        L.append(f"    yb{yid[d]} = (fy{yid[d]} * xs2)[None, :, None]")
    for d in xs:
        xk[d] = _axis_code(L, f"x{xid[d]}", "cols", "W", d, mx, sx, "[None, None, :]")
        L.append(f"    xb{xid[d]} = (fx{xid[d]} * xs3)[None, None, :]")
    const = "constant" in modes
    if const:
        L.append(f"    cv = tl.full((BP, BH, BW), {_fmt(cval)}, ACC)")
    for t, (dz, dy, dx) in enumerate(offsets):
        ks = [k for k in (zk[dz], yk[dy], xk[dx]) if k is not None]
        ok = " & ".join(["valid"] + ks)
        L.append(f"    v = tl.load(x_ptr + zb{zid[dz]} + yb{yid[dy]} + xb{xid[dx]}, mask={ok}, other=0.0).to(ACC)")
        if ks:
            L.append(f"    v = tl.where({' & '.join(ks)}, v, cv)")
        L.append("    isn = v != v")
        L.append("    nn += isn.to(tl.int32)")
        L.append(f"    w{t} = tl.where(isn, float('inf'), v)")
    # the network, in SSA form
    cur = {i: f"w{i}" for i in range(n)}
    c = 0
    for a, b, nmin, nmax in network(n, rank):
        va, vb = cur[a], cur[b]
        if nmin:
            L.append(f"    s{c} = tl.minimum({va}, {vb})")
            cur[a] = f"s{c}"
            c += 1
        if nmax:
            L.append(f"    s{c} = tl.maximum({va}, {vb})")
            cur[b] = f"s{c}"
            c += 1
    L.append(f"    res = tl.where(nn > {n - 1 - rank}, float('nan'), {cur[rank]})")
    L.append("    optr = o_ptr + (pn * os0 + pd * os1)[:, None, None] + (rows * os2)[None, :, None]"
             " + (cols * os3)[None, None, :]")
    L.append("    tl.store(optr, res.to(o_ptr.dtype.element_ty), mask=valid)")
    return "\n".join(L) + "\n"


_KERNELS: dict = {}
_counter = [0]


def _compile_source(src: str, name: str):
    """Exec generated kernel source (registered in ``linecache`` so that Triton reads it)."""
    _counter[0] += 1
    fname = f"<torchfilters-rank-{_counter[0]}>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    ns = {"triton": triton, "tl": tl, "_fold": _fold, "_tile_ids": _tile_ids}
    exec(compile(src, fname, "exec"), ns)  # noqa: S102  (our own generated source)
    return ns[name]


def _net_kernel(offsets, modes, singles, cval, rank, acc):
    key = (offsets, modes, singles, cval if not math.isnan(cval) else "nan", math.copysign(1.0, cval), rank, acc)
    k = _KERNELS.get(key)
    if k is None:
        name = f"_rank_net_{len(_KERNELS)}"
        src = _gen_source(name, offsets, modes, singles, cval, rank, acc)
        k = _compile_source(src, name)
        k.source_text = src
        _KERNELS[key] = k
    return k


# =============================================================================
# device code: separable min/max passes and the backward


@triton.jit
def _minmax_pass(x_ptr, o_ptr, NP, D, H, W, xs0, xs1, xs2, xs3, os0, os1, os2, os3, n_th, n_tw,
                 LO, K, CVAL: tl.constexpr, AXIS: tl.constexpr, MODE: tl.constexpr, SINGLE: tl.constexpr,
                 MAX: tl.constexpr, ACC: tl.constexpr, BP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr):
    """``out[i] = min/max_{t < K} x[fold(i + LO + t)]`` along ``AXIS`` (0: D, 1: H, 2: W); NaN
    ordered last (the min is NaN only where every element is, the max where any is)."""
    th, tw, pl = _tile_ids(n_th, n_tw, BP)
    rows = th * BH + tl.arange(0, BH)
    cols = tw * BW + tl.arange(0, BW)
    valid = (pl < NP)[:, None, None] & (rows < H)[None, :, None] & (cols < W)[None, None, :]
    pl = tl.minimum(pl, NP - 1)
    pn = pl // D
    pd = pl % D
    if MAX:
        r = tl.full((BP, BH, BW), float("-inf"), ACC)
    else:
        r = tl.full((BP, BH, BW), float("inf"), ACC)
    flag = valid & False  # max: any NaN; min: any number
    for t in range(K):
        ok = valid
        if AXIS == 0:
            j = pd + LO + t
            fz = _fold(j, D, MODE, SINGLE)
            if MODE == 4:
                ok = ok & ((j >= 0) & (j < D))[:, None, None]
            off = (pn * xs0 + fz * xs1)[:, None, None] + (rows * xs2)[None, :, None] + (cols * xs3)[None, None, :]
        elif AXIS == 1:
            j = rows + LO + t
            fy = _fold(j, H, MODE, SINGLE)
            if MODE == 4:
                ok = ok & ((j >= 0) & (j < H))[None, :, None]
            off = (pn * xs0 + pd * xs1)[:, None, None] + (fy * xs2)[None, :, None] + (cols * xs3)[None, None, :]
        else:
            j = cols + LO + t
            fx = _fold(j, W, MODE, SINGLE)
            if MODE == 4:
                ok = ok & ((j >= 0) & (j < W))[None, None, :]
            off = (pn * xs0 + pd * xs1)[:, None, None] + (rows * xs2)[None, :, None] + (fx * xs3)[None, None, :]
        v = tl.load(x_ptr + off, mask=ok, other=0.0).to(ACC)
        if MODE == 4:
            v = tl.where(ok, v, tl.full((BP, BH, BW), CVAL, ACC))
        isn = v != v  # noqa: PLR0124
        if MAX:
            flag = flag | isn
            r = tl.maximum(r, tl.where(isn, float("-inf"), v))
        else:
            flag = flag | ~isn
            r = tl.minimum(r, tl.where(isn, float("inf"), v))
    if MAX:
        r = tl.where(flag, float("nan"), r)
    else:
        r = tl.where(flag, r, float("nan"))
    optr = o_ptr + (pn * os0 + pd * os1)[:, None, None] + (rows * os2)[None, :, None] + (cols * os3)[None, None, :]
    tl.store(optr, r.to(o_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _key(v, F64: tl.constexpr):
    """Order-preserving integer key of ``v`` with every NaN above ``+inf`` (``-0 < +0``):
    integer ``min`` / ``max`` (one instruction, no NaN rules) order values as the spec does."""
    if F64:
        i = v.to(tl.int64, bitcast=True)
        k = i ^ ((i >> 63) & 0x7FFFFFFFFFFFFFFF)
        return tl.where(v != v, 0x7FFFFFFFFFFFFFFF, k)  # noqa: PLR0124
    else:
        i = v.to(tl.int32, bitcast=True)
        k = i ^ ((i >> 31) & 0x7FFFFFFF)
        return tl.where(v != v, 0x7FFFFFFF, k)  # noqa: PLR0124


@triton.jit
def _unkey(k, F64: tl.constexpr):
    if F64:
        return (k ^ ((k >> 63) & 0x7FFFFFFFFFFFFFFF)).to(tl.float64, bitcast=True)
    else:
        return (k ^ ((k >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _seg_min(a, fa, b, fb):
    return tl.where(fb, b, tl.minimum(a, b)), fa | fb


@triton.jit
def _seg_max(a, fa, b, fb):
    return tl.where(fb, b, tl.maximum(a, b)), fa | fb


@triton.jit
def _gw_pass(x_ptr, o_ptr, NP, D, H, W, xs0, xs1, xs2, xs3, os0, os1, os2, os3, n_th, n_tw, LO,
             K: tl.constexpr, CVAL: tl.constexpr, AXIS: tl.constexpr, MODE: tl.constexpr, SINGLE: tl.constexpr,
             MAX: tl.constexpr, ACC: tl.constexpr, BP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
             L: tl.constexpr):
    """van Herk / Gil-Werman min or max of ``K`` along ``AXIS`` (1: H, 2: W), constant work per output.

    A program loads ``L`` consecutive padded positions along the axis (``BH`` resp. ``BW``
    outputs plus ``K - 1``), cut into segments of ``K`` lanes: a segmented prefix scan ``P``
    and suffix scan ``S`` (``tl.associative_scan``); output ``o`` is ``op(S[o], P[o + K - 1])``
    (``tl.gather``), on integer keys (``_key``: NaN ordered last by the integers themselves)."""
    th, tw, pl = _tile_ids(n_th, n_tw, BP)
    pv = pl < NP
    pl = tl.minimum(pl, NP - 1)
    poff = (pl // D) * xs0 + (pl % D) * xs1
    t = tl.arange(0, L)
    if AXIS == 2:
        rows = th * BH + tl.arange(0, BH)
        cols = tw * BW + tl.arange(0, BW)
        j = tw * BW + LO + t
        jc = tl.minimum(j, W - 1 + LO + K - 1)  # lanes past every valid output's window
        f = _fold(jc, W, MODE, SINGLE)
        ok = pv[:, None, None] & (rows < H)[None, :, None]
        if MODE == 4:
            ok = ok & ((j >= 0) & (j < W))[None, None, :]
        off = poff[:, None, None] + (rows * xs2)[None, :, None] + (f * xs3)[None, None, :]
        seg = (t % K == 0)[None, None, :]
        end = (t % K == K - 1)[None, None, :]
        shape: tl.constexpr = (BP, BH, BW)
        idx = tl.broadcast_to((tl.arange(0, BW) + K - 1)[None, None, :], shape)
        idx0 = tl.broadcast_to(tl.arange(0, BW)[None, None, :], shape)
    else:
        rows = th * BH + tl.arange(0, BH)
        cols = tw * BW + tl.arange(0, BW)
        j = th * BH + LO + t
        jc = tl.minimum(j, H - 1 + LO + K - 1)
        f = _fold(jc, H, MODE, SINGLE)
        ok = pv[:, None, None] & (cols < W)[None, None, :]
        if MODE == 4:
            ok = ok & ((j >= 0) & (j < H))[None, :, None]
        off = poff[:, None, None] + (f * xs2)[None, :, None] + (cols * xs3)[None, None, :]
        seg = (t % K == 0)[None, :, None]
        end = (t % K == K - 1)[None, :, None]
        shape: tl.constexpr = (BP, BH, BW)
        idx = tl.broadcast_to((tl.arange(0, BH) + K - 1)[None, :, None], shape)
        idx0 = tl.broadcast_to(tl.arange(0, BH)[None, :, None], shape)
    v = tl.load(x_ptr + off, mask=ok, other=0.0).to(ACC)
    if MODE == 4:
        v = tl.where(ok, v, tl.full(v.shape, CVAL, ACC))
    seg = tl.broadcast_to(seg, v.shape)
    end = tl.broadcast_to(end, v.shape)
    F64: tl.constexpr = ACC == tl.float64
    v = _key(v, F64)
    if MAX:
        pre, _f = tl.associative_scan((v, seg), AXIS, _seg_max)
        suf, _g = tl.associative_scan((v, end), AXIS, _seg_max, reverse=True)
        r = tl.maximum(tl.gather(suf, idx0, AXIS), tl.gather(pre, idx, AXIS))
    else:
        pre, _f = tl.associative_scan((v, seg), AXIS, _seg_min)
        suf, _g = tl.associative_scan((v, end), AXIS, _seg_min, reverse=True)
        r = tl.minimum(tl.gather(suf, idx0, AXIS), tl.gather(pre, idx, AXIS))
    r = _unkey(r, F64)
    valid = pv[:, None, None] & (rows < H)[None, :, None] & (cols < W)[None, None, :]
    optr = o_ptr + ((pl // D) * os0 + (pl % D) * os1)[:, None, None] + (rows * os2)[None, :, None]
    optr = optr + (cols * os3)[None, None, :]
    tl.store(optr, r.to(o_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _sort3(a, b, c):
    lo1 = tl.minimum(a, b)
    hi1 = tl.maximum(a, b)
    lo = tl.minimum(lo1, c)
    t = tl.maximum(lo1, c)
    return lo, tl.minimum(hi1, t), tl.maximum(hi1, t)


@triton.jit
def _med3(a, b, c):
    return tl.maximum(tl.minimum(a, b), tl.minimum(tl.maximum(a, b), c))


@triton.jit
def _split4(v, BP: tl.constexpr, BH: tl.constexpr, BG: tl.constexpr):
    """``[.., 4 BG]`` -> the four ``[.., BG]`` of columns ``4 g + e``."""
    s0, s1 = tl.split(tl.reshape(v, (BP, BH, BG, 2, 2)))
    e0, e2 = tl.split(s0)
    e1, e3 = tl.split(s1)
    return e0, e1, e2, e3


@triton.jit
def _colsort(a, b, c):
    """A column of three inputs: NaN -> +inf, sorted, and its NaN count."""
    na = a != a  # noqa: PLR0124
    nb = b != b  # noqa: PLR0124
    nc = c != c  # noqa: PLR0124
    cnt = na.to(tl.int32) + nb.to(tl.int32) + nc.to(tl.int32)
    lo, mid, hi = _sort3(tl.where(na, float("inf"), a), tl.where(nb, float("inf"), b), tl.where(nc, float("inf"), c))
    return lo, mid, hi, cnt


@triton.jit
def _row6_fold(x_ptr, poff, fr, okr, fa, oka, fb, okb, CVAL: tl.constexpr, CONST: tl.constexpr,
               ACC: tl.constexpr, BP: tl.constexpr, BH: tl.constexpr, BG: tl.constexpr):
    """The 6 input columns of one row of a lane's 4 outputs, from folded indices."""
    offa = poff + (fr[None, :, None] + fa[None, None, :])
    offb = poff + (fr[None, :, None] + fb[None, None, :])
    if CONST:
        ok = okr[None, :, None] & oka[None, None, :]
        va = tl.load(x_ptr + offa, mask=ok, other=0.0).to(ACC)
        va = tl.where(ok, va, tl.full(va.shape, CVAL, ACC))
        ok = okr[None, :, None] & okb[None, None, :]
        vb = tl.load(x_ptr + offb, mask=ok, other=0.0).to(ACC)
        vb = tl.where(ok, vb, tl.full(vb.shape, CVAL, ACC))
    else:
        va = tl.load(x_ptr + offa).to(ACC)  # folded rows and columns are inside: no mask
        vb = tl.load(x_ptr + offb).to(ACC)
    e0, e1, e2, e3 = _split4(va, BP, BH, BG)
    e4, e5, _e6, _e7 = _split4(vb, BP, BH, BG)
    return e0, e1, e2, e3, e4, e5


@triton.jit
def _pick(e: tl.constexpr, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3):
    if e == -4:
        v = p0
    elif e == -3:
        v = p1
    elif e == -2:
        v = p2
    elif e == -1:
        v = p3
    elif e == 0:
        v = q0
    elif e == 1:
        v = q1
    elif e == 2:
        v = q2
    elif e == 3:
        v = q3
    elif e == 4:
        v = r0
    elif e == 5:
        v = r1
    elif e == 6:
        v = r2
    else:
        v = r3
    return v


@triton.jit
def _row6_fast(x_ptr, poff, rowoff, c0, LX: tl.constexpr, ACC: tl.constexpr, BP: tl.constexpr,
               BH: tl.constexpr, BG: tl.constexpr):
    """The same inside the image: three aligned 4-column vectors (128-bit loads), split."""
    base = x_ptr + poff + rowoff[None, :, None] + c0
    ar = tl.arange(0, 4 * BG)[None, None, :]
    p0, p1, p2, p3 = _split4(tl.load(base - 4 + ar).to(ACC), BP, BH, BG)
    q0, q1, q2, q3 = _split4(tl.load(base + ar).to(ACC), BP, BH, BG)
    r0, r1, r2, r3 = _split4(tl.load(base + 4 + ar).to(ACC), BP, BH, BG)
    return (_pick(LX, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3),
            _pick(LX + 1, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3),
            _pick(LX + 2, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3),
            _pick(LX + 3, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3),
            _pick(LX + 4, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3),
            _pick(LX + 5, p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3))


@triton.jit
def _med3x3(x_ptr, o_ptr, NP, D, H, W, xs0, xs1, xs2, xs3, os0, os1, os2, os3, n_th, n_tw,
            LY: tl.constexpr, LX: tl.constexpr, MY: tl.constexpr, MX: tl.constexpr, SY: tl.constexpr,
            SX: tl.constexpr, CVAL: tl.constexpr, FAST: tl.constexpr, ACC: tl.constexpr,
            BP: tl.constexpr, BH: tl.constexpr, BG: tl.constexpr):
    """Median of every 3x3 box (at offsets ``LY, LX``), four outputs per lane along W.

    Each lane loads the 3 x 6 inputs of its 4 outputs (4-column vectors per row, split in
    registers; inside the image three aligned vectors per row, no folding), sorts the 6
    columns once (3 compare-exchanges each, shared by up to 3 outputs) and takes
    ``med3(max of lows, med3 of mids, min of highs)`` per output (Paeth), with the pairwise
    max/min shared between neighbours.  NaN: +inf and counted."""
    th, tw, pl = _tile_ids(n_th, n_tw, BP)
    r0_ = th * BH
    rows = r0_ + tl.arange(0, BH)
    c0 = tw * (4 * BG)
    ocols = c0 + tl.arange(0, 4 * BG)
    valid = (pl < NP)[:, None, None] & (rows < H)[None, :, None] & (ocols < W)[None, None, :]
    pl = tl.minimum(pl, NP - 1)
    poff = ((pl // D) * xs0 + (pl % D) * xs1)[:, None, None]
    inner = (c0 >= 4) & (c0 + 4 * BG + 4 <= W) & (r0_ + LY >= 0) & (r0_ + BH + LY + 1 <= H - 1)
    if FAST and inner:
        ja = rows + LY
        a0, a1, a2, a3, a4, a5 = _row6_fast(x_ptr, poff, ja * xs2, c0, LX, ACC, BP, BH, BG)
        b0, b1, b2, b3, b4, b5 = _row6_fast(x_ptr, poff, (ja + 1) * xs2, c0, LX, ACC, BP, BH, BG)
        d0, d1, d2, d3, d4, d5 = _row6_fast(x_ptr, poff, (ja + 2) * xs2, c0, LX, ACC, BP, BH, BG)
    else:
        rc = tl.minimum(rows, H - 1)
        # input columns c0 + LX + i (clamped past the last one any output reads)
        ca = tl.minimum(c0 + LX + tl.arange(0, 4 * BG), W + LX + 1)
        cb = tl.minimum(c0 + LX + 4 + tl.arange(0, 4 * BG), W + LX + 1)
        fa = _fold(ca, W, MX, SX) * xs3
        fb = _fold(cb, W, MX, SX) * xs3
        oka = (ca >= 0) & (ca < W)
        okb = (cb >= 0) & (cb < W)
        CONST: tl.constexpr = MY == 4 or MX == 4
        ja = rc + LY
        fr = _fold(ja, H, MY, SY) * xs2
        ok = (ja >= 0) & (ja < H)
        a0, a1, a2, a3, a4, a5 = _row6_fold(x_ptr, poff, fr, ok, fa, oka, fb, okb, CVAL, CONST, ACC, BP, BH, BG)
        fr = _fold(ja + 1, H, MY, SY) * xs2
        ok = (ja + 1 >= 0) & (ja + 1 < H)
        b0, b1, b2, b3, b4, b5 = _row6_fold(x_ptr, poff, fr, ok, fa, oka, fb, okb, CVAL, CONST, ACC, BP, BH, BG)
        fr = _fold(ja + 2, H, MY, SY) * xs2
        ok = (ja + 2 >= 0) & (ja + 2 < H)
        d0, d1, d2, d3, d4, d5 = _row6_fold(x_ptr, poff, fr, ok, fa, oka, fb, okb, CVAL, CONST, ACC, BP, BH, BG)
    l0, m_0, h0, c_0 = _colsort(a0, b0, d0)
    l1, m_1, h1, c_1 = _colsort(a1, b1, d1)
    l2, m_2, h2, c_2 = _colsort(a2, b2, d2)
    l3, m_3, h3, c_3 = _colsort(a3, b3, d3)
    l4, m_4, h4, c_4 = _colsort(a4, b4, d4)
    l5, m_5, h5, c_5 = _colsort(a5, b5, d5)
    pl1 = tl.maximum(l1, l2)
    pl3 = tl.maximum(l3, l4)
    ph1 = tl.minimum(h1, h2)
    ph3 = tl.minimum(h3, h4)
    pc1 = c_1 + c_2
    pc3 = c_3 + c_4
    r0 = _med3(tl.maximum(l0, pl1), _med3(m_0, m_1, m_2), tl.minimum(h0, ph1))
    r1 = _med3(tl.maximum(pl1, l3), _med3(m_1, m_2, m_3), tl.minimum(ph1, h3))
    r2 = _med3(tl.maximum(l2, pl3), _med3(m_2, m_3, m_4), tl.minimum(h2, ph3))
    r3 = _med3(tl.maximum(pl3, l5), _med3(m_3, m_4, m_5), tl.minimum(ph3, h5))
    r0 = tl.where(c_0 + pc1 > 4, float("nan"), r0)
    r1 = tl.where(pc1 + c_3 > 4, float("nan"), r1)
    r2 = tl.where(c_2 + pc3 > 4, float("nan"), r2)
    r3 = tl.where(pc3 + c_5 > 4, float("nan"), r3)
    res = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BP, BH, 4 * BG))
    optr = o_ptr + ((pl // D) * os0 + (pl % D) * os1)[:, None, None] + (rows * os2)[None, :, None]
    optr = optr + (ocols * os3)[None, None, :]
    tl.store(optr, res.to(o_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _bwd_tap(t, ip, pn, pd, rows, cols, valid, x_ptr, D, H, W, CVAL: tl.constexpr, NT: tl.constexpr,
             MZ: tl.constexpr, MY: tl.constexpr, MX: tl.constexpr, SZ: tl.constexpr, SY: tl.constexpr,
             SX: tl.constexpr, UNROLL: tl.constexpr, DZ: tl.constexpr, DY: tl.constexpr, DX: tl.constexpr,
             ACC: tl.constexpr):
    """Window element ``t`` at every output of the tile: ``(value, offset, inside)`` (``x``
    contiguous ``(N, D, H, W)``; ``inside`` is false on constant-mode padding)."""
    if UNROLL:
        dz = DZ[t]
        dy = DY[t]
        dx = DX[t]
    else:
        dz = tl.load(ip + t)
        dy = tl.load(ip + NT + t)
        dx = tl.load(ip + 2 * NT + t)
    jz = pd + dz
    jy = rows + dy
    jx = cols + dx
    fz = _fold(jz, D, MZ, SZ)
    fy = _fold(jy, H, MY, SY)
    fx = _fold(jx, W, MX, SX)
    ok = valid
    if MZ == 4:
        ok = ok & ((jz >= 0) & (jz < D))[:, None, None]
    if MY == 4:
        ok = ok & ((jy >= 0) & (jy < H))[None, :, None]
    if MX == 4:
        ok = ok & ((jx >= 0) & (jx < W))[None, None, :]
    off = ((pn * D + fz) * H)[:, None, None] + fy[None, :, None]
    off = off * W + fx[None, None, :]
    v = tl.load(x_ptr + off, mask=ok, other=0.0).to(ACC)
    if MZ == 4 or MY == 4 or MX == 4:
        v = tl.where(ok | ~valid, v, tl.full(v.shape, CVAL, ACC))
    return v, off, ok


@triton.jit
def _rank_bwd(x_ptr, y_ptr, g_ptr, o_ptr, ip, NP, D, H, W, n_th, n_tw, CVAL: tl.constexpr, RANK: tl.constexpr,
              NT: tl.constexpr, MZ: tl.constexpr, MY: tl.constexpr, MX: tl.constexpr, SZ: tl.constexpr,
              SY: tl.constexpr, SX: tl.constexpr, UNROLL: tl.constexpr, DZ: tl.constexpr, DY: tl.constexpr,
              DX: tl.constexpr, ACC: tl.constexpr, BP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr):
    """Each output's gradient onto the window element it selected (atomic adds into ``o``)."""
    th, tw, pl = _tile_ids(n_th, n_tw, BP)
    rows = th * BH + tl.arange(0, BH)
    cols = tw * BW + tl.arange(0, BW)
    valid = (pl < NP)[:, None, None] & (rows < H)[None, :, None] & (cols < W)[None, None, :]
    pl = tl.minimum(pl, NP - 1)
    pn = pl // D
    pd = pl % D
    own = (pl * H)[:, None, None] + rows[None, :, None]
    own = own * W + cols[None, None, :]
    y = tl.load(y_ptr + own, mask=valid, other=0.0).to(ACC)
    g = tl.load(g_ptr + own, mask=valid, other=0.0).to(ACC)
    ynan = y != y  # noqa: PLR0124
    less = tl.full((BP, BH, BW), 0, tl.int32)
    if UNROLL:
        for t in tl.static_range(NT):
            v, off, ok = _bwd_tap(t, ip, pn, pd, rows, cols, valid, x_ptr, D, H, W, CVAL, NT, MZ, MY, MX,
                                  SZ, SY, SX, UNROLL, DZ, DY, DX, ACC)
            less += ((v < y) | ((v == v) & ynan)).to(tl.int32)  # noqa: PLR0124
    else:
        for t in range(NT):
            v, off, ok = _bwd_tap(t, ip, pn, pd, rows, cols, valid, x_ptr, D, H, W, CVAL, NT, MZ, MY, MX,
                                  SZ, SY, SX, UNROLL, DZ, DY, DX, ACC)
            less += ((v < y) | ((v == v) & ynan)).to(tl.int32)  # noqa: PLR0124
    want = RANK - less  # the want-th element equal to y, counting from 0
    seen = tl.full((BP, BH, BW), 0, tl.int32)
    soff = own * 0
    sok = valid & False
    if UNROLL:
        for t in tl.static_range(NT):
            v, off, ok = _bwd_tap(t, ip, pn, pd, rows, cols, valid, x_ptr, D, H, W, CVAL, NT, MZ, MY, MX,
                                  SZ, SY, SX, UNROLL, DZ, DY, DX, ACC)
            eq = (v == y) | ((v != v) & ynan)  # noqa: PLR0124
            hit = eq & (seen == want)
            soff = tl.where(hit, off, soff)
            sok = tl.where(hit, ok, sok)
            seen += eq.to(tl.int32)
    else:
        for t in range(NT):
            v, off, ok = _bwd_tap(t, ip, pn, pd, rows, cols, valid, x_ptr, D, H, W, CVAL, NT, MZ, MY, MX,
                                  SZ, SY, SX, UNROLL, DZ, DY, DX, ACC)
            eq = (v == y) | ((v != v) & ynan)  # noqa: PLR0124
            hit = eq & (seen == want)
            soff = tl.where(hit, off, soff)
            sok = tl.where(hit, ok, sok)
            seen += eq.to(tl.int32)
    tl.atomic_add(o_ptr + soff, g, mask=sok & valid)


# =============================================================================
# host side


def _as4(t: torch.Tensor, nd: int):
    """``t`` as ``(N, D, H, W)`` (a view where the strides allow)."""
    sp = tuple(t.shape[t.dim() - nd:])
    sp = (1,) * (3 - nd) + sp
    return t.reshape((-1,) + sp)


def _tiles(NP, D, H, W, elems):
    BW = min(_np2(W), _TILE["max_bw"])
    BH = min(_np2(H), max(1, elems // BW))
    BP = max(1, min(_np2(NP), elems // (BH * BW)))
    warps = max(1, min(4, BP * BH * BW // 128))
    return BP, BH, BW, -(-H // BH), -(-W // BW), warps


def _modes3(spec: RankSpec):
    nd = spec.ndim
    return tuple(axis_mode(spec.mode, a, nd) if a >= -nd else "nearest" for a in (-3, -2, -1))


def _offsets3(spec: RankSpec):
    nd = spec.ndim
    return tuple((0,) * (3 - nd) + tuple(o) for o in spec.offsets)


def _singles(offsets, sizes, modes):
    out = []
    for a in range(3):
        ds = [o[a] for o in offsets]
        out.append(_single(sizes[a], min(ds), max(ds), modes[a]))
    return tuple(out)


def _cval(spec: RankSpec, dtype) -> float:
    """``cval`` as the reference pads: rounded to the input's dtype."""
    return float(torch.tensor(spec.cval, dtype=torch.float64).to(dtype))


def _acc(dtype):
    return "tl.float64" if dtype == torch.float64 else "tl.float32"


def _minmax_passes(spec: RankSpec):
    """``[(axis 0..2, lo, k)]`` of a full box's min/max, or None."""
    if not spec.box or spec.rank not in (0, spec.count - 1):
        return None
    nd = spec.ndim
    out = []
    for i, a in enumerate(range(-nd, 0)):
        k = spec.shape[i]
        lo = spec.lo[i]
        if k > 1 or lo != 0:
            out.append((3 + a, lo, k))
    return out


def _is_med3x3(spec: RankSpec) -> bool:
    """A 3x3 box median (of the last two axes: nothing read along a third)?"""
    if spec.count != 9 or not spec.box or spec.rank != 4 or spec.ndim < 2 or spec.shape[-2:] != (3, 3):
        return False
    return spec.ndim == 2 or (spec.shape[0] == 1 and spec.lo[0] == 0)


def _fwd_med3x3(x4, y4, spec, cval):
    N, D, H, W = x4.shape
    NP = N * D
    modes = _modes3(spec)
    ly, lx = spec.lo[-2:]
    BG = min(_np2(-(-W // 4)), max(1, _TILE["max_bw"] // 4))
    lanes = max(1, _TILE["elems"] // 4)
    BH = min(_np2(H), max(1, lanes // BG))
    BP = max(1, min(_np2(NP), lanes // (BH * BG)))
    warps = max(1, min(4, BP * BH * BG // 64))
    n_th, n_tw = -(-H // BH), -(-W // (4 * BG))
    grid = (-(-NP // BP) * n_th * n_tw,)
    with _device(x4):
        _med3x3[grid](x4, y4, NP, D, H, W, *x4.stride(), *y4.stride(), n_th, n_tw, LY=ly, LX=lx,
                      FAST=-4 <= lx <= 2 and x4.stride(-1) == 1, MY=_MODES[modes[1]], MX=_MODES[modes[2]], SY=_single(H, ly, ly + 2, modes[1]),
                      SX=_single(W, lx, lx + 2, modes[2]), CVAL=cval, ACC=_ACC[_acc(x4.dtype)],
                      BP=BP, BH=BH, BG=BG, num_warps=warps, enable_fp_fusion=False)
    LAUNCHES["rank_med3x3"] += 1


_ACC = {"tl.float32": tl.float32, "tl.float64": tl.float64}


def _fwd_net(x4, y4, spec, cval):
    if _is_med3x3(spec):
        return _fwd_med3x3(x4, y4, spec, cval)
    N, D, H, W = x4.shape
    NP = N * D
    offs = _offsets3(spec)
    modes = _modes3(spec)
    singles = _singles(offs, (D, H, W), modes)
    kern = _net_kernel(offs, modes, singles, cval, spec.rank, _acc(x4.dtype))
    n = len(offs)
    elems = _TILE["elems"] if n <= 9 else max(128, _TILE["elems"] // (4 if n <= 25 else 8))
    BP, BH, BW, n_th, n_tw, warps = _tiles(NP, D, H, W, elems)
    grid = (-(-NP // BP) * n_th * n_tw,)
    with _device(x4):
        kern[grid](x4, y4, NP, D, H, W, *x4.stride(), *y4.stride(), n_th, n_tw,
                   BP=BP, BH=BH, BW=BW, num_warps=warps, enable_fp_fusion=False)
    LAUNCHES["rank_net"] += 1


def _fwd_minmax(x4, y4, spec, passes, cval):
    N, D, H, W = x4.shape
    NP = N * D
    modes = _modes3(spec)
    BP, BH, BW, n_th, n_tw, warps = _tiles(NP, D, H, W, _TILE["elems"])
    grid = (-(-NP // BP) * n_th * n_tw,)
    src = x4
    ACC = tl.float64 if x4.dtype == torch.float64 else tl.float32
    for i, (axis, lo, k) in enumerate(passes):
        dst = y4 if i == len(passes) - 1 else torch.empty_like(x4, memory_format=torch.contiguous_format)
        n = (D, H, W)[axis]
        single = _single(n, lo, lo + k - 1, modes[axis])
        gw = _gw_tiles(NP, D, H, W, axis, k)
        if gw is not None:
            gBP, gBH, gBW, L, g_th, g_tw, gwarps = gw
            with _device(x4):
                _gw_pass[(-(-NP // gBP) * g_th * g_tw,)](
                    src, dst, NP, D, H, W, *src.stride(), *dst.stride(), g_th, g_tw, lo, K=k, CVAL=cval,
                    AXIS=axis, MODE=_MODES[modes[axis]], SINGLE=single, MAX=spec.rank != 0, ACC=ACC,
                    BP=gBP, BH=gBH, BW=gBW, L=L, num_warps=gwarps, enable_fp_fusion=False)
            LAUNCHES["rank_gw"] += 1
            src = dst
            continue
        with _device(x4):
            _minmax_pass[grid](src, dst, NP, D, H, W, *src.stride(), *dst.stride(), n_th, n_tw,
                               lo, k, CVAL=cval, AXIS=axis, MODE=_MODES[modes[axis]], SINGLE=single,
                               MAX=spec.rank != 0, ACC=ACC, BP=BP, BH=BH, BW=BW, num_warps=warps,
                               enable_fp_fusion=False)
        LAUNCHES["rank_minmax"] += 1
        src = dst


#: window lengths from which a min/max pass runs van Herk / Gil-Werman (below: a direct loop).
#: From the sm_90 SASS: the direct loop costs about 11 instructions per output and tap along W
#: (8 along H, vector loads), the van Herk pass 220-260 per output whatever ``k``.
_GW_MIN = 21
#: the longest tile (outputs plus K - 1) of a van Herk pass along the axis
_GW_MAX_L = 1024


def _gw_tiles(NP, D, H, W, axis, k):
    """``(BP, BH, BW, L, n_th, n_tw, warps)`` of a van Herk pass, or None (a direct loop)."""
    if axis == 0 or k < _GW_MIN:
        return None
    n = (D, H, W)[axis]
    want = min(_TILE["max_bw"], _np2(n))
    L = _np2(want + k - 1)
    if L > _GW_MAX_L:
        return None
    S = 1 << ((L - k + 1).bit_length() - 1)  # the largest power of two <= L - k + 1
    elems = max(_TILE["elems"], L)
    if axis == 2:
        BW = S
        BH = max(1, min(_np2(H), elems // L))
        BP = max(1, min(_np2(NP), elems // (BH * L)))
        lanes = BP * BH * L
    else:
        BH = S
        BW = max(1, min(_np2(W), _TILE["max_bw"], elems // L))
        BP = max(1, min(_np2(NP), elems // (BW * L)))
        lanes = BP * BW * L
    warps = max(1, min(4, lanes // 128))
    return BP, BH, BW, L, -(-H // BH), -(-W // BW), warps


def _out4(out, nd):
    """A ``(N, D, H, W)`` view of ``out`` for the kernels to write, or None (then a temporary)."""
    if out is None:
        return None
    try:
        return out.view((-1,) + (1,) * (3 - nd) + tuple(out.shape[out.dim() - nd:]))
    except RuntimeError:
        return None


def rank_forward(x, spec: RankSpec, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x,))
    if x.numel() == 0:
        return out if out is not None else torch.empty_like(x)
    passes = _minmax_passes(spec)
    if passes is None and spec.count > _NET_MAX:
        FALLBACKS["rank_forward"] += 1
        return _ref.rank_forward(x, spec, out)
    nd = spec.ndim
    x4 = _as4(x, nd)
    o4 = _out4(out, nd)
    y4 = o4 if o4 is not None else torch.empty(x4.shape, dtype=x.dtype, device=x.device)
    cval = _cval(spec, x.dtype)
    if passes is not None:
        if not passes:
            y4.copy_(x4)
        else:
            _fwd_minmax(x4, y4, spec, passes, cval)
    else:
        _fwd_net(x4, y4, spec, cval)
    if out is None:
        return y4.view(x.shape)
    if o4 is None:
        out.copy_(y4.view(x.shape))
    return out


_TABLES: dict = {}


def _table(offs, device):
    key = (offs, device)
    t = _TABLES.get(key)
    if t is None:
        t = torch.tensor([o[a] for a in range(3) for o in offs], dtype=torch.int32, device=device)
        _TABLES[key] = t
        if len(_TABLES) > 256:
            _TABLES.pop(next(iter(_TABLES)))
    return t


def rank_backward(grad, x, y, spec: RankSpec, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x, grad, y))
    if x.numel() == 0:
        return out if out is not None else torch.empty_like(x)
    nd = spec.ndim
    x4 = _as4(x, nd).contiguous()
    N, D, H, W = x4.shape
    y4 = _as4(y.expand(x.shape), nd).contiguous()
    g4 = _as4(grad.expand(x.shape), nd).contiguous()
    acc = compute_dtype(x.dtype)
    buf = torch.zeros(x4.shape, dtype=acc, device=x.device)
    offs = _offsets3(spec)
    modes = _modes3(spec)
    singles = _singles(offs, (D, H, W), modes)
    NT = len(offs)
    unroll = NT <= _UNROLL_MAX
    ip = buf if unroll else _table(offs, x.device)
    NP = N * D
    BP, BH, BW, n_th, n_tw, warps = _tiles(NP, D, H, W, _TILE["elems"])
    grid = (-(-NP // BP) * n_th * n_tw,)
    with _device(x):
        _rank_bwd[grid](
            x4, y4, g4, buf, ip, NP, D, H, W, n_th, n_tw, CVAL=_cval(spec, x.dtype), RANK=spec.rank, NT=NT,
            MZ=_MODES[modes[0]], MY=_MODES[modes[1]], MX=_MODES[modes[2]], SZ=singles[0], SY=singles[1],
            SX=singles[2], UNROLL=unroll,
            DZ=tuple(o[0] for o in offs) if unroll else (), DY=tuple(o[1] for o in offs) if unroll else (),
            DX=tuple(o[2] for o in offs) if unroll else (),
            ACC=tl.float64 if acc == torch.float64 else tl.float32, BP=BP, BH=BH, BW=BW, num_warps=warps,
            enable_fp_fusion=False,
        )
    LAUNCHES["rank_bwd"] += 1
    res = buf.view(x.shape)
    if out is None:
        return res if res.dtype == x.dtype else res.to(x.dtype)
    out.copy_(res)
    return out
