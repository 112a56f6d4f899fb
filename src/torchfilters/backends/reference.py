"""Pure-PyTorch reference engine: any device, any dtype; the oracle for the fused backends.

Boundary modes are built by folding indices (:func:`fold_indices`) and
gathering, never with ``F.pad`` (which refuses a radius larger than the image
and names the modes differently).  Gradients come from autograd through the
same code, with the magnitude/direction epilogues written so that their
gradient is 0 -- not NaN -- where the gradient vector vanishes.
"""

from __future__ import annotations

import itertools
import math

import torch

from .._spec import BlurSpec, FilterSpec, RankSpec, Stencil, axis_mode, dense_shape
from .._validate import compute_dtype
from ._lowering import GENERAL, SYM, lower, pass_kind

NAME = "reference"


def fold_indices(n: int, start: int, length: int, mode: str, device=None) -> torch.Tensor:
    """Indices into an axis of size ``n`` for positions ``start .. start+length-1``.

    Positions outside ``[0, n)`` are folded back as ``scipy.ndimage`` does
    (formulas as in CuPy's ``cupyx.scipy.ndimage._util``).  In ``constant``
    mode they map to ``n``: the caller appends one ``cval`` slot there.
    """
    i = torch.arange(start, start + length, device=device)
    if mode == "reflect":  # d c b a | a b c d | d c b a
        p = 2 * n
        i = i % p
        return torch.where(i >= n, p - 1 - i, i)
    if mode == "mirror":  # d c b | a b c d | c b a
        if n == 1:
            return torch.zeros_like(i)
        p = 2 * n - 2
        i = i % p
        return torch.where(i >= n, p - i, i)
    if mode == "nearest":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return i % n
    if mode == "constant":
        return torch.where((i < 0) | (i >= n), n, i)
    raise ValueError(f"unknown mode {mode!r}")


def _pad(x: torch.Tensor, dim: int, lo: int, hi: int, mode: str, cval: float) -> torch.Tensor:
    """Extend ``x`` along ``dim`` by ``-lo`` before and ``hi`` after (offsets may be any sign)."""
    n = x.shape[dim]
    idx = fold_indices(n, lo, n + hi - lo, mode, device=x.device)
    if mode == "constant":
        shape = list(x.shape)
        shape[dim] = 1
        # (the cval rounded to x's dtype as a cast rounds it: past its range, inf -- ``new_full``
        # raises on a Python float it cannot hold; found by review)
        fill = torch.tensor(cval, dtype=torch.float64).to(x.dtype).item() if x.dtype != torch.float64 else cval
        x = torch.cat([x, x.new_full(shape, fill)], dim)
    return x.index_select(dim, idx)


def _pass1d(x: torch.Tensor, dim: int, lo: int, taps, mode: str, cval: float) -> torch.Tensor:
    n = x.shape[dim]
    k = len(taps)
    if k == 0:
        return torch.zeros_like(x)
    xp = _pad(x, dim, lo, lo + k - 1, mode, cval)
    # every tap, zeros too (a NaN under a 0 tap is NaN), in SciPy's order (_lowering.pass_kind)
    kind = pass_kind(taps)
    if kind == GENERAL:
        out = xp.narrow(dim, k - 1, n) * taps[k - 1]
        for j in range(k - 1):
            out = out + xp.narrow(dim, j, n) * taps[j]
        return out
    c = k // 2
    out = xp.narrow(dim, c, n) * taps[c]
    for j in range(c):  # outermost pair first, times the left weight
        a, b = xp.narrow(dim, j, n), xp.narrow(dim, k - 1 - j, n)
        out = out + (a + b if kind == SYM else a - b) * taps[j]
    return out


def _dense_terms(taps, shape):
    """``(index, weight)`` of every non-zero dense tap (zero taps are outside the footprint,
    as in SciPy's N-D ``correlate``, which drops ``|w| <= DBL_EPSILON``; the spec builder
    already zeroed those)."""
    for idx in itertools.product(*(range(k) for k in shape)):
        w = taps
        for i in idx:
            w = w[i]
        if w != 0.0:
            yield idx, w


def apply_stencil(x: torch.Tensor, st: Stencil, mode, cval: float, ndim: int = 2) -> torch.Tensor:
    """Evaluate one stencil on ``x`` shaped ``(..., *spatial)`` (``ndim`` spatial axes, already
    in compute dtype); ``mode`` is one mode or one per spatial axis."""
    if st.kind == "sep":
        for p in st.passes:
            x = _pass1d(x, p.axis, p.lo, p.taps, axis_mode(mode, p.axis, ndim), cval)
        return x
    shape = dense_shape(st.taps)
    d = len(shape)
    sizes = x.shape[-d:]
    xp = x
    for a in range(-d, 0):
        xp = _pad(xp, a, st.lo[a], st.lo[a] + shape[a] - 1, axis_mode(mode, a, ndim), cval)
    # no conv: it would multiply NaNs by zero taps and follow torch.autocast into low precision
    y = None
    for idx, w in _dense_terms(st.taps, shape):
        sl = (Ellipsis,) + tuple(slice(i, i + n) for i, n in zip(idx, sizes))
        term = xp[sl] * w
        y = term if y is None else y + term
    # SciPy's N-D ``correlate`` starts its sum at +0.0: ``((0 + t0) + t1) + ...``, which is
    # ``(t0 + t1 + ...) + 0``: only a sum of -0.0 terms changes (to +0.0)
    return y + 0.0 if y is not None else torch.zeros_like(x)


def _magnitude(ys):
    """``sqrt(sum y_k**2)``, rescaled as ``hypot`` where the sum of squares over- or underflows:
    ``m * sqrt(sum (y_k/m)**2)``, ``m = max |y_k|`` (:func:`_scaled`); gradient 0 (not NaN)
    where it is 0."""
    s = ys[0] * ys[0]
    for y in ys[1:]:
        s = s + y * y
    bad = _rescale(s, ys)
    if _some(bad):
        s = torch.where(bad, s.detach(), s)  # (no gradient through the overflowed sum)
        r = torch.where(bad, _scaled(ys, bad), _magnitude_of(s))
        return r
    return _magnitude_of(s)


def _some(bad) -> bool:
    """Whether any pixel is marked; True on a meta tensor (no values: the rescaling form then
    carries the shapes)."""
    return bad.is_meta or bool(bad.any())


def _magnitude_of(s):
    zero = s == 0
    # double where: exact sqrt forward, gradient 0 (not NaN) where s == 0
    return torch.where(zero, torch.zeros_like(s), torch.sqrt(torch.where(zero, torch.ones_like(s), s)))


def _rescale(s, ys):
    """Where ``s`` (the sum of squares) overflowed to inf, or underflowed to 0 or a subnormal
    while a component is not 0 (NaN: never)."""
    nz = ys[0] != 0
    for y in ys[1:]:
        nz = nz | (y != 0)
    return (s == float("inf")) | ((s < torch.finfo(s.dtype).tiny) & nz)


def _scaled(ys, bad):
    """``m * sqrt(sum (y_k/m)**2)`` with ``m = max |y_k|`` (inf where ``m`` is), the engines'
    formula for the rare rescaled pixels; ``bad`` marks them (elsewhere ``m`` is 1)."""
    m = ys[0].abs()
    for y in ys[1:]:
        m = torch.maximum(m, y.abs())
    one = torch.ones_like(m)
    mm = torch.where(bad & (m != float("inf")) & (m > 0), m, one)
    t = ys[0] / mm
    s = t * t
    for y in ys[1:]:
        t = y / mm
        s = s + t * t
    return torch.where(m == float("inf"), m, mm * torch.sqrt(s))


def _direction(y0, y1):
    zero = (y0 == 0) & (y1 == 0)
    safe = torch.atan2(torch.where(zero, torch.zeros_like(y0), y0), torch.where(zero, torch.ones_like(y1), y1))
    return torch.where(zero, torch.atan2(y0.detach(), y1.detach()), safe)


def filter_compute(x: torch.Tensor, spec: FilterSpec, apply=apply_stencil) -> torch.Tensor:
    """Differentiable evaluation in ``x``'s dtype (the compute dtype).

    ``apply(x, stencil, mode, cval, ndim)`` evaluates one stencil (default: :func:`apply_stencil`);
    another engine passes its own and shares the epilogues (Triton's chains of plane launches)."""
    spec = lower(spec, x.shape)
    ys = [apply(x, st, spec.mode, spec.cval, spec.ndim) for st in spec.stencils]
    if spec.epilogue == "magnitude":
        return _magnitude(ys)
    if spec.epilogue == "direction":
        return _direction(ys[0], ys[1])
    if spec.epilogue == "sum":
        out = ys[0]
        for y in ys[1:]:
            out = out + y
        return out
    if len(ys) == 1:
        return ys[0]
    return torch.stack(ys, dim=-1 - spec.ndim)


def border_mask(shape, st: Stencil, device) -> torch.Tensor:
    """True where the stencil's footprint stays inside the image (``shape``: the spatial sizes)."""
    d = len(shape)
    out = torch.ones((), dtype=torch.bool, device=device)
    for a, n in zip(range(-d, 0), shape):
        lo, hi = st.extent(a)
        r = torch.arange(n, device=device)
        inside = (r + lo >= 0) & (r + hi <= n - 1)
        out = out.unsqueeze(-1) & inside.view((1,) * (out.dim()) + (n,))
    return out


def blur_masks(x: torch.Tensor, mask, spec: BlurSpec, threshold: float):
    """``(m, w)``: the selected pixels, and those written (``m`` minus the kept border).

    A kept border pixel is not written but still counts as a neighbour."""
    m = (x >= threshold) if mask is None else mask.to(device=x.device, dtype=torch.bool)
    w = m & border_mask(x.shape[-spec.ndim:], spec.stencil, x.device) if spec.keep_border else m
    return m, w


def blur_compute(x: torch.Tensor, mask, spec: BlurSpec, threshold: float, apply=apply_stencil) -> torch.Tensor:
    """Selective blur in ``x``'s dtype; ``apply`` as in :func:`filter_compute`."""
    spec = lower(spec, x.shape)
    m, w = blur_masks(x, mask, spec, threshold)
    if not spec.normalized:
        b = apply(x, spec.stencil, spec.mode, spec.cval, spec.ndim)
        return torch.where(w, b, x)
    mf = m.to(x.dtype)
    # outside the image nothing is masked: in constant mode cval never enters the mean
    num = apply(torch.where(m, x, torch.zeros_like(x)), spec.stencil, spec.mode, 0.0, spec.ndim)
    den = apply(mf.expand(x.shape), spec.stencil, spec.mode, 0.0, spec.ndim)
    use = w & (den > 0)
    return torch.where(use, num / torch.where(use, den, torch.ones_like(den)), x)


# ----------------------------------------------------------------------------
# adjoints (explicit: the engines run below autograd, so the backward is code too)


def _pass1d_adjoint(g: torch.Tensor, dim: int, lo: int, taps, mode: str) -> torch.Tensor:
    n = g.shape[dim]
    k = len(taps)
    shape = list(g.shape)
    shape[dim] = n + k - 1
    gp = g.new_zeros(shape)
    for j, w in enumerate(taps):
        if w != 0.0:
            gp.narrow(dim, j, n).add_(g, alpha=w)
    return _unpad(gp, dim, n, lo, lo + k - 1, mode)


def _unpad(gp: torch.Tensor, dim: int, n: int, lo: int, hi: int, mode: str) -> torch.Tensor:
    """Adjoint of :func:`_pad`: sum every padded position back onto the sample it copies."""
    idx = fold_indices(n, lo, n + hi - lo, mode, device=gp.device)
    shape = list(gp.shape)
    shape[dim] = n + 1 if mode == "constant" else n
    gx = gp.new_zeros(shape).index_add_(dim, idx, gp)
    return gx.narrow(dim, 0, n).contiguous() if mode == "constant" else gx


def apply_stencil_adjoint(g: torch.Tensor, st: Stencil, mode, ndim: int = 2) -> torch.Tensor:
    """``A^T g`` for the linear part of :func:`apply_stencil` (``cval`` adds a constant only)."""
    if st.kind == "sep":
        for p in reversed(st.passes):
            g = _pass1d_adjoint(g, p.axis, p.lo, p.taps, axis_mode(mode, p.axis, ndim))
        return g
    shape = dense_shape(st.taps)
    d = len(shape)
    sizes = g.shape[-d:]
    gp = g.new_zeros(g.shape[:-d] + tuple(n + k - 1 for n, k in zip(sizes, shape)))
    for idx, w in _dense_terms(st.taps, shape):
        sl = (Ellipsis,) + tuple(slice(i, i + n) for i, n in zip(idx, sizes))
        gp[sl].add_(g, alpha=w)
    for a in range(-1, -d - 1, -1):
        gp = _unpad(gp, a, sizes[a], st.lo[a], st.lo[a] + shape[a] - 1, axis_mode(mode, a, ndim))
    return gp


def _magnitude_vjp(g, ys):
    """``g * y_k / |y|`` per stencil, 0 where ``|y| == 0``, with the rescaled magnitude where the
    sum of squares over/underflows (``g * (y_k/m) / sqrt(sum (y_j/m)**2)`` there: finite
    wherever the forward is)."""
    s = ys[0] * ys[0]
    for y in ys[1:]:
        s = s + y * y
    m = _magnitude_of(s)
    zero = m == 0
    scale = torch.where(zero, torch.zeros_like(m), g / torch.where(zero, torch.ones_like(m), m))
    gs = [scale * y for y in ys]
    bad = _rescale(s, ys)
    if _some(bad):
        mx = ys[0].abs()
        for y in ys[1:]:
            mx = torch.maximum(mx, y.abs())
        mm = torch.where(bad & (mx > 0) & (mx != float("inf")), mx, torch.ones_like(mx))
        ts = [y / mm for y in ys]
        r = ts[0] * ts[0]
        for t in ts[1:]:
            r = r + t * t
        r = torch.sqrt(r)
        sc = g / torch.where(bad, r, torch.ones_like(r))
        gs = [torch.where(bad, sc * t, gk) for t, gk in zip(ts, gs)]
    return gs


def filter_vjp(g: torch.Tensor, x: torch.Tensor, spec: FilterSpec, apply=apply_stencil,
               adjoint=apply_stencil_adjoint) -> torch.Tensor:
    """Gradient with respect to ``x`` of :func:`filter_compute` (both in compute dtype);
    ``apply`` / ``adjoint(g, stencil, mode, ndim)`` as in :func:`filter_compute`."""
    spec = lower(spec, x.shape)
    sts = spec.stencils
    nd = spec.ndim
    if spec.epilogue == "stack":
        gs = [g] if len(sts) == 1 else list(g.unbind(-1 - nd))
    elif spec.epilogue == "sum":
        gs = [g] * len(sts)
    else:
        ys = [apply(x, st, spec.mode, spec.cval, nd) for st in sts]
        if spec.epilogue == "magnitude":
            gs = _magnitude_vjp(g, ys)
        else:  # direction: d atan2(a, b) = (b da - a db) / (a^2 + b^2)
            a, b = ys
            r = a * a + b * b
            zero = r == 0
            scale = torch.where(zero, torch.zeros_like(r), g / torch.where(zero, torch.ones_like(r), r))
            gs = [scale * b, -scale * a]
    out = None
    for gk, st in zip(gs, sts):
        t = adjoint(gk, st, spec.mode, nd)
        out = t if out is None else out + t
    return out


def blur_vjp(g: torch.Tensor, x: torch.Tensor, mask, spec: BlurSpec, threshold: float, apply=apply_stencil,
             adjoint=apply_stencil_adjoint) -> torch.Tensor:
    """Gradient of :func:`blur_compute`; ``apply`` / ``adjoint`` as in :func:`filter_vjp`."""
    spec = lower(spec, x.shape)
    nd = spec.ndim
    m, w = blur_masks(x, mask, spec, threshold)
    zero = torch.zeros_like(g)
    if not spec.normalized:
        return adjoint(torch.where(w, g, zero), spec.stencil, spec.mode, nd) + torch.where(w, zero, g)
    mf = m.to(x.dtype)
    den = apply(mf.expand(x.shape), spec.stencil, spec.mode, 0.0, nd)
    use = w & (den > 0)
    gd = torch.where(use, g / torch.where(use, den, torch.ones_like(den)), zero)
    return mf * adjoint(gd, spec.stencil, spec.mode, nd) + torch.where(use, zero, g)


# ----------------------------------------------------------------------------
# rank filters: every window element as one slice of the padded input, a stable sort

#: window elements times input elements above which the reference engine works in chunks
_RANK_CHUNK = 1 << 25


def _rank_padded(x: torch.Tensor, spec: RankSpec):
    """``x`` extended by the mode on every spatial axis, and each window offset's slice."""
    nd = spec.ndim
    sizes = x.shape[-nd:]
    xp = x
    for a in range(-nd, 0):
        lo, hi = spec.extent(a)
        xp = _pad(xp, a, lo, hi, axis_mode(spec.mode, a, nd), spec.cval)
    lo = [spec.extent(a)[0] for a in range(-nd, 0)]
    slices = [
        (Ellipsis,) + tuple(slice(o - l, o - l + n) for o, l, n in zip(off, lo, sizes)) for off in spec.offsets
    ]
    return xp, slices


def _rank_chunks(x: torch.Tensor, spec: RankSpec):
    """Views of ``x`` along its first batch axis small enough to stack every window element."""
    nd = spec.ndim
    if x.dim() == nd or x.numel() * spec.count <= _RANK_CHUNK:
        return [x]
    x2 = x.reshape((-1,) + tuple(x.shape[-nd:]))
    step = max(1, _RANK_CHUNK // max(1, spec.count * math.prod(x.shape[-nd:])))
    return list(x2.split(step, 0))


def rank_select(x: torch.Tensor, spec: RankSpec):
    """``(values, positions)``: each output's value and the index, in ``spec.offsets``, of the
    window element it is (:class:`RankSpec`'s order: NaN last, ties in footprint order)."""
    vals, poss = [], []
    for c in _rank_chunks(x, spec):
        xp, slices = _rank_padded(c, spec)
        stack = torch.stack([xp[sl] for sl in slices], 0)
        srt, idx = torch.sort(stack, dim=0, stable=True)
        vals.append(srt[spec.rank])
        poss.append(idx[spec.rank])
    if len(vals) == 1:
        return vals[0], poss[0]
    return torch.cat(vals, 0).view(x.shape), torch.cat(poss, 0).view(x.shape)


def rank_compute(x: torch.Tensor, spec: RankSpec) -> torch.Tensor:
    return rank_select(x, spec)[0]


def rank_vjp(g: torch.Tensor, x: torch.Tensor, spec: RankSpec) -> torch.Tensor:
    """Each output's gradient onto the input element it selected (linear in ``g``, so autograd
    through it gives the double backward)."""
    nd = spec.ndim
    sizes = x.shape[-nd:]
    _, pos = rank_select(x.detach(), spec)
    lo = [spec.extent(a)[0] for a in range(-nd, 0)]
    hi = [spec.extent(a)[1] for a in range(-nd, 0)]
    gp = g.new_zeros(g.shape[:-nd] + tuple(n + h - l for n, l, h in zip(sizes, lo, hi)))
    zero = torch.zeros((), dtype=g.dtype, device=g.device)
    for j, off in enumerate(spec.offsets):
        sl = (Ellipsis,) + tuple(slice(o - l, o - l + n) for o, l, n in zip(off, lo, sizes))
        gp[sl] = gp[sl] + torch.where(pos == j, g, zero)
    for a in range(-1, -nd - 1, -1):
        gp = _unpad(gp, a, sizes[a], lo[a], hi[a], axis_mode(spec.mode, a, nd))
    return gp


# ----------------------------------------------------------------------------
# backend entry points (called from the custom ops, below autograd)


def _run(fn, out, x, *args):
    """Run ``fn`` on ``x`` (and friends) in the compute dtype; cast back or write ``out``."""
    dtype = x.dtype
    cd = compute_dtype(dtype)
    y = fn(x.to(cd), *args)
    if out is None:
        return y.to(dtype)
    out.copy_(y)
    return out


def _empty(x, shape, out):
    return x.new_zeros(shape) if out is None else out


def filter_forward(x, spec: FilterSpec, out=None):
    if x.numel() == 0:
        return _empty(x, spec.out_shape(x.shape), out)
    return _run(filter_compute, out, x, spec)


def filter_backward(grad, x, spec: FilterSpec, out=None):
    if x.numel() == 0:
        return _empty(x, x.shape, out)
    cd = compute_dtype(x.dtype)
    return _run(lambda g, xx: filter_vjp(g, xx, spec), out, grad.to(cd), x.to(cd)).to(x.dtype)


def rank_forward(x, spec: RankSpec, out=None):
    if x.numel() == 0:
        return _empty(x, x.shape, out)
    # a selection is exact in any dtype: no compute dtype
    y = rank_compute(x, spec)
    if out is None:
        return y
    out.copy_(y)
    return out


def rank_backward(grad, x, y, spec: RankSpec, out=None):
    """``y`` (the forward's result) is not needed here; the fused engines use it."""
    if x.numel() == 0:
        return _empty(x, x.shape, out)
    g = rank_vjp(grad.to(compute_dtype(x.dtype)), x, spec).to(x.dtype)
    if out is None:
        return g
    out.copy_(g)
    return out


def _selected(x, mask, threshold):
    """``input >= threshold`` compared in the input's own dtype, as torch compares."""
    return x >= threshold if mask is None else mask


def blur_forward(x, mask, spec: BlurSpec, threshold: float, out=None):
    if x.numel() == 0:
        return _empty(x, x.shape, out)
    mask = _selected(x, mask, threshold)
    return _run(blur_compute, out, x, mask, spec, threshold)


def blur_backward(grad, x, mask, spec: BlurSpec, threshold: float, out=None):
    if x.numel() == 0:
        return _empty(x, x.shape, out)
    mask = _selected(x, mask, threshold)
    cd = compute_dtype(x.dtype)
    return _run(lambda g, xx: blur_vjp(g, xx, mask, spec, threshold), out, grad.to(cd), x.to(cd)).to(x.dtype)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    return True
