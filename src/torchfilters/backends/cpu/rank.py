"""Rank filters (median, minimum, maximum, percentile) on the CPU engine: the host side.

A :class:`~torchfilters._spec.RankSpec` on a ``(..., *spatial)`` tensor is run on a contiguous
``(N, D, H, W)`` volume of the compute dtype (float64 for float64, else float32: a selection is
exact, so float16/bfloat16 go through float32 and back unchanged), through per-axis fold tables
(``reference.fold_indices``; ``-1`` is ``constant`` mode's padding, the value ``cval`` rounded to
the input's dtype as the reference pads).  One algorithm per call (:func:`_plan`):

* ``vh``: ``minimum``/``maximum`` of a full box -- van Herk/Gil-Werman along z and y, doubling
  along x, the y- and x-passes fused per strip of columns (one pass over memory in 2-D);
* ``net``: other ranks of small boxes (at most :data:`NET_MAX` elements) -- a comparator
  program over rows (:func:`_network`: sorted columns, merged, pruned to the one rank);
* ``hist``: windows of at least :data:`HIST_MIN` elements -- ranks in a sliding bit histogram;
* ``sel``: the rest -- gather and quickselect.

The backward (any spec): each output's gradient goes to the element at ``rank`` of the stable
NaN-last sort of its window, found from the forward's value ``y`` (count the elements below
``y``, then take the ``(rank - below)``-th equal one in footprint order); accumulated in the
compute dtype, per plane, or per band of rows into private buffers folded per plane afterwards.
Kernels: ``rank_kernels``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..._spec import axis_mode
from .. import reference
from .buffers import _alloc
from .plan import _fold as plan_fold
from .plan import _small
from .rank_kernels import _k_bwd, _k_hist, _k_merge, _k_net, _k_sel, _k_vh
from .threads import _launch, _threads

__all__ = ["rank_backward", "rank_forward"]

#: boxes of at most this many elements (and rows of at most 7) run as comparator programs
NET_MAX = 25
#: windows of at least this many elements run in the sliding histogram
HIST_MIN = 64
#: tests force an algorithm (``"vh"`` only for box min/max, ``"net"`` only for boxes)
_FORCE = None


def _cd(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


@functools.lru_cache(maxsize=512)
def _fold(n: int, lo: int, k: int, mode: str) -> np.ndarray:
    """Source index of padded positions ``0 .. n+k-2`` (offset ``lo``); ``-1``: padding."""
    return plan_fold(n, lo, n + k - 1, mode)


class _Plan:
    pass


@functools.lru_cache(maxsize=128)
def _plan(spec, sizes):
    """Everything a call needs that depends on the spec and the spatial sizes only."""
    nd = spec.ndim
    pre = 3 - nd
    shape = (1,) * pre + tuple(spec.shape)
    lo = (0,) * pre + tuple(spec.lo)
    modes = ("constant",) * pre + tuple(axis_mode(spec.mode, a, nd) for a in range(-nd, 0))
    p = _Plan()
    p.k = shape
    p.tabs = tuple(_fold(n, l, k, m) for n, l, k, m in zip(sizes, lo, shape, modes))
    offs = [(0,) * pre + tuple(o - l for o, l in zip(off, spec.lo)) for off in spec.offsets]
    p.offs = np.asarray(offs, np.int64).reshape(-1, 3)
    p.count = len(offs)
    p.rank = spec.rank
    fp = set(offs)
    kx = shape[2]
    p.rm = np.asarray([o for o in offs if (o[0], o[1], o[2] - 1) not in fp], np.int64).reshape(-1, 3)
    p.ad = np.asarray([o for o in offs if (o[0], o[1], o[2] + 1) not in fp], np.int64).reshape(-1, 3)
    runs = []
    for o in offs:  # (C order: a run's elements are consecutive)
        if runs and runs[-1][:2] == [o[0], o[1]] and runs[-1][3] == o[2]:
            runs[-1][3] += 1
        else:
            runs.append([o[0], o[1], o[2], o[2] + 1])
    p.runs = np.asarray(runs, np.int64).reshape(-1, 4)
    box = p.count == math.prod(shape)
    algo = _FORCE
    if algo is None or (algo == "vh" and not (box and spec.rank in (0, p.count - 1))) or (algo == "net" and not box):
        if box and spec.rank in (0, p.count - 1):
            algo = "vh"
        elif box and p.count <= NET_MAX and kx <= 7:
            algo = "net"
        elif p.count >= HIST_MIN:
            algo = "hist"
        else:
            algo = "sel"
    p.algo = algo
    if algo == "net":
        p.net = _network(shape[0] * shape[1], kx, spec.rank)
    return p


# ----------------------------------------------------------------------------- networks


@functools.lru_cache(maxsize=64)
def _network(m: int, kx: int, rank: int):
    """A comparator program for element ``rank`` of a box of ``m`` rows by ``kx`` columns.

    Stage 1 sorts each padded column (its ``m`` rows; Batcher's odd-even merge sort); stage 2
    sorts the rows of each output's ``kx`` sorted columns (column ``c`` is stage 1's rows read
    ``c`` elements further on), drops the elements that order places below or above ``rank``,
    merges the rest (sorted runs, one per row), and keeps only what element ``rank`` depends on.  Returns ``(prog, nstage1,
    nrows, res_row, res_shift)``: ``prog`` rows ``(op, dst, a, shift_a, b, shift_b)``."""
    ops = []
    state = {"next": m, "stage": 1}

    def cmp(a, b):
        lo = (state["next"], 0)
        hi = (state["next"] + 1, 0)
        state["next"] += 2
        ops.append((0, lo[0], a, b, state["stage"]))
        ops.append((1, hi[0], a, b, state["stage"]))
        return lo, hi

    def merge(a, b):
        if not a:
            return list(b)
        if not b:
            return list(a)
        if len(a) == 1 and len(b) == 1:
            return list(cmp(a[0], b[0]))
        v = merge(a[0::2], b[0::2])
        w = merge(a[1::2], b[1::2])
        out = [v[0]]
        i = 0
        while i < len(w) and i + 1 < len(v):
            out += cmp(w[i], v[i + 1])
            i += 1
        return out + w[i:] + v[i + 1:]

    def sort(v):
        if len(v) <= 1:
            return list(v)
        h = len(v) // 2
        return merge(sort(v[:h]), sort(v[h:]))

    cols = sort([(i, 0) for i in range(m)])
    state["stage"] = 2
    # sort each row of the column-sorted window (the columns stay sorted): element (j, c) is then
    # >= (j+1)(c+1) - 1 others and <= (m-j)(kx-c) - 1 others; those below / above rank for sure
    # are dropped, the rest are sorted and element ``rank - below`` taken
    n = m * kx
    runs, below = [], 0
    for j in range(m):
        rowv = sort([(cols[j][0], c) for c in range(kx)])
        run = []
        for c, v in enumerate(rowv):
            if (j + 1) * (c + 1) - 1 > rank:
                continue  # above
            if (m - j) * (kx - c) - 1 > n - 1 - rank:
                below += 1
                continue
            run.append(v)
        if run:
            runs.append(run)  # a sorted run
    while len(runs) > 1:
        runs.sort(key=len)  # the shortest two first
        runs = [merge(runs[0], runs[1])] + runs[2:]
    res = runs[0][rank - below]
    live = {res[0]}
    kept = []
    for op in reversed(ops):
        if op[1] in live:
            kept.append(op)
            live.add(op[2][0])
            live.add(op[3][0])
    kept.reverse()
    last = {res[0]: len(kept)}
    for p, op in enumerate(kept):
        last[op[2][0]] = p
        last[op[3][0]] = p
    row = {i: i for i in range(m)}
    free = [i for i in range(m) if i not in last]
    nrows = m
    prog = []
    for p, (op, d, a, b, _) in enumerate(kept):
        if free:
            r = free.pop()
        else:
            r = nrows
            nrows += 1
        row[d] = r
        prog.append((op, r, row[a[0]], a[1], row[b[0]], b[1]))
        for v in {a[0], b[0]}:
            if last[v] == p:
                free.append(row[v])
    n1 = sum(1 for op in kept if op[4] == 1)
    return np.asarray(prog, np.int64).reshape(-1, 6), n1, nrows, row[res[0]], res[1]


# ----------------------------------------------------------------------------- host


def _scalar(v, dtype, cd):
    """``cval`` as the reference pads (rounded to the input's dtype), as a compute-dtype scalar."""
    if dtype not in (torch.float32, torch.float64):
        v = float(torch.tensor(v, dtype=dtype, device="cpu"))
    return np.float64(v) if cd == torch.float64 else np.float32(v)


def _volume(t, nd, cd):
    """``t`` as a contiguous compute-dtype tensor and its ``(N, D, H, W)``."""
    sizes = (1,) * (3 - nd) + tuple(t.shape[t.dim() - nd:])
    N = t.numel() // math.prod(sizes)
    return t.detach().to(cd).contiguous(), (N,) + sizes


def _target(x, out, cd):
    """(contiguous compute-dtype tensor the kernel writes, is it ``out`` or a fresh result?)"""
    if out is not None and out.dtype == cd and out.is_contiguous():
        return out, True
    if out is None and x.dtype == cd:
        return _alloc(x.shape, cd), True
    return torch.empty(x.shape, dtype=cd, device="cpu"), False


def _deliver(o, direct, x, out):
    if direct:
        return o
    if out is None:
        return o.to(x.dtype)
    out.copy_(o)
    return out


def _flat(t):
    return t.view(-1).numpy()


def rank_forward(x, spec, out=None):
    if x.numel() == 0:
        return reference.rank_forward(x, spec, out)
    cd = _cd(x.dtype)
    xs, (N, D, H, W) = _volume(x, spec.ndim, cd)
    p = _plan(spec, (D, H, W))
    cval = _scalar(spec.cval, x.dtype, cd)
    o, direct = _target(x, out, cd)
    X, O = _flat(xs), _flat(o)
    tz, ty, tx = p.tabs
    kz, ky, kx = p.k
    nt = _threads()
    serial = _small(N * D, H, W)
    if p.algo == "vh":
        ismax = p.rank == p.count - 1
        src = X
        if kz > 1:
            dst = O if ky == 1 and kx == 1 else np.empty_like(X)
            _vh(src, dst, N, D, H * W, D, H * W, kz, 1, tz, np.arange(H * W, dtype=np.int64), cval, ismax, nt, serial)
            src = dst
        if ky > 1 or kx > 1 or kz == 1:
            _vh(src, O, N * D, H, W, H, W, ky, kx, ty, tx, cval, ismax, nt, serial)
    elif p.algo == "net":
        prog, n1, nrows, rr, rs = p.net
        gen = 0
        key = (kz * ky, kx, p.rank)
        if key in GENERATED:
            gen = GENERATED.index(key) + 1
            rr, rs, nrows = nrows, 0, nrows + 1
        CH = min(W, 256)
        RB = max(1, min(H, (40 << 10) // (nrows * (CH + kx - 1) * X.itemsize)))
        G = np.asarray([N, D, H, W, kz, ky, kx, nrows, CH, n1, rr, rs, RB], np.int64)
        it, K = _KEYS[X.dtype.type]
        cbits = np.asarray(cval).view(it)[()]
        _launch(_k_net, (X.view(it), O.view(it), G, tz, ty, tx, prog, K, cbits, gen), N * D * -(-H // RB), nt, serial)
    elif p.algo == "hist":
        BH = min(H, max(16, 2 * ky))
        nb = -(-H // BH)
        G = np.asarray([N, D, H, W, kz, ky, kx, p.rank, BH, nb], np.int64)
        _launch(_k_hist, (X, O, G, tz, ty, tx, p.offs, p.rm, p.ad, cval), N * D * nb, nt, serial)
    else:
        G = np.asarray([N, D, H, W, p.count, p.rank], np.int64)
        _launch(_k_sel, (X, O, G, tz, ty, tx, p.offs, cval), N * D * H, nt, serial)
    return _deliver(o, direct, x, out)


#: integer view and key constants (``rank_kernels._key``) per compute dtype
_KEYS = {
    np.float32: (np.int32, np.asarray([31, 0x7FFFFFFF, -0x7F800000 - 1, 0x7FFFFFFF], np.int64)),
    np.float64: (np.int64, np.asarray([63, 0x7FFFFFFFFFFFFFFF, -0x7FF0000000000000 - 1, 0x7FFFFFFFFFFFFFFF], np.int64)),
}


def _vh(X, O, planes, NR, RL, HO, WO, ky, kx, ty, tx, cval, ismax, nt, serial):
    CW = min(WO, 512 if X.dtype == np.float32 else 256)
    ns = -(-WO // CW)
    G = np.asarray([NR, RL, HO, WO, ky, kx, CW, ns], np.int64)
    _launch(_k_vh, (X, O, G, ty, tx, cval, ismax), planes * ns, nt, serial)


def rank_backward(grad, x, y, spec, out=None):
    if x.numel() == 0:
        return reference.rank_backward(grad, x, y, spec, out)
    if y is None:
        y = rank_forward(x, spec)
    cd = _cd(x.dtype)
    nd = spec.ndim
    xs, (N, D, H, W) = _volume(x, nd, cd)
    ys, _ = _volume(y, nd, cd)
    gs, _ = _volume(grad.expand(x.shape), nd, cd)
    p = _plan(spec, (D, H, W))
    cval = _scalar(spec.cval, x.dtype, cd)
    tz, ty, tx = p.tabs
    ky = p.k[1]
    nt = _threads()
    serial = _small(N * D, H, W)
    if out is not None and out.dtype == cd and out.is_contiguous():
        A = out.zero_()
        direct = True
    else:
        A = torch.zeros(x.shape, dtype=cd, device="cpu")
        direct = out is None and x.dtype == cd
    banded = not serial and N < 2 * nt and H >= 32
    if banded:
        BH = max(16, -(-H // (4 * nt)))
        nb = -(-H // BH)
    else:
        BH, nb = H, 1
    RH = BH + ky - 1
    G = np.asarray([N, D, H, W, p.count, p.rank, BH, nb, int(banded), RH], np.int64)
    args = (_flat(xs), _flat(ys), _flat(gs))
    if banded:
        Bf = np.zeros(N * nb * D * RH * W, xs.numpy().dtype)
        _launch(_k_bwd, args + (Bf, G, tz, ty, tx, p.runs, cval), N * nb, nt, False)
        _launch(_k_merge, (_flat(A), Bf, G, ty), N, nt, serial)
    else:
        _launch(_k_bwd, args + (_flat(A), G, tz, ty, tx, p.runs, cval), N, nt, serial)
    return _deliver(A, direct, x, out)


# ----------------------------------------------------------------------------- generated code

#: boxes whose stage 2 runs as generated straight-line code (``rank_nets``): ``(m, kx, rank)``
GENERATED = ((3, 3, 4), (5, 5, 12))


def _emit(m, kx, rank, name):
    """Stage 2 of ``_network(m, kx, rank)`` as a numba function ``name(B, w)`` that keeps every
    value in registers and writes the result to row ``nrows`` of ``B``."""
    prog, n1, nrows, rr, rs = _network(m, kx, rank)
    views, cur, body = {}, {}, []

    def ref(r, s):
        if r in cur:
            return cur[r]
        views[(r, s)] = f"r{r}_{s}"
        return f"r{r}_{s}[t]"

    for i, (op, d, a, sa, b, sb) in enumerate(prog[n1:].tolist()):
        ea, eb = ref(a, sa), ref(b, sb)
        body.append(f"        v{i} = _sel({ea} < {eb}, {ea if op == 0 else eb}, {eb if op == 0 else ea})")
        cur[d] = f"v{i}"
    final = cur[rr] if rr in cur else ref(rr, rs)
    head = ["@njit(inline=\"always\", **_JIT)", f"def {name}(B, w):",
            f"    \"\"\"Stage 2 of the {m}x{kx} box's rank {rank} (``rank._emit``).\"\"\"",
            f"    ro = B[{nrows}]"]
    head += [f"    {v} = B[{r}, {s}:]" for (r, s), v in sorted(views.items())]
    return "\n".join(head + ["    for t in range(w):"] + body + [f"        ro[t] = {final}"]) + "\n"


def _emit_module(path):
    """Write ``rank_nets.py`` (run after changing ``_network``)."""
    parts = ['"""Generated by ``rank._emit_module``: stage 2 of the comparator programs of ``rank.GENERATED``',
             'as straight-line code (values in registers).  Do not edit."""', "",
             "from numba import njit", "", "from .prims import _JIT, _sel", ""]
    for i, (m, kx, r) in enumerate(GENERATED):
        parts += ["", _emit(m, kx, r, f"_g{i + 1}")]
    with open(path, "w") as f:
        f.write("\n".join(parts))
