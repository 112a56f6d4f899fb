"""The volume engine: ``sep`` specs over three axes (or two or one, with per-axis modes) fused in
one pass per call, forward and backward.  The planar engine hands it what ``_planar`` cannot
map to planes (``cpu/__init__``).

**Runs here.**  :class:`~torchfilters._spec.FilterSpec` whose stencils are ``sep`` with at most
one pass per axis and finite taps, epilogues ``stack`` (``K >= 1`` components), ``sum`` and
``magnitude``; every mode, per-axis modes, any radius on any size (``_lowering.lower`` first),
``constant`` mode with any finite ``cval`` (SciPy's sequential padding reproduced exactly:
``volume_plan``).  Backward: the transposed passes; for ``magnitude`` two phases (the forward
passes write ``g * y_k / |y|``, 0 where ``|y| = 0``, into ``K`` temporaries; then the
transposed passes sum them).

Selective blur (:class:`~torchfilters._spec.BlurSpec` with such a stencil), the reference
engine's formulas, fused: *blend* forward is one pass (blur, select ``x >= threshold`` or the
mask, store); backward the masked gradient (``volume_kernels._k_gsel``) then the transposed
passes with the rest ``(1 - w) g`` added in their epilogue.  *normalized* forward: ``[m x, m]``
(``_k_gsel``), then both blurs and the masked mean in one pass; backward: the mask as 0/1, one
blur writing ``[use ? g / den : 0, use ? 0 : g]``, the transposed blur adding the rest.
``keep_border`` is a box the selection holds in.  (Temporaries come from the output cache.)

**Falls back to** ``reference``: several dense stencils, the ``direction`` epilogue, two passes
along one axis, non-finite taps, ``constant`` mode with a non-finite ``cval``, empty tensors.

**Dense stencils** (``volume_dense``): one dense stencil of 2 or 3 axes (``correlate`` with a
3-D kernel; 2-D with per-axis modes), each output's taps summed in SciPy's order; the backward
is one launch of the same kernel (flipped taps, the border folded back per output).

**The direct 3x3x3 path** (``volume_direct``): the 3-D Sobel / Prewitt / Scharr gradient, its
magnitude and the magnitude's backward scale, in one streaming pass with every component in
SciPy's pass order (float64: SciPy's bits; the magnitude rescaled where its squares over- or
underflow).

**Kernels** (``volume_kernels``): one kernel per compute dtype (float32, float64) runs every
plan (``volume_plan`` describes the tables).  Work items are ``(volume, block of rows, chunk of
planes)``; per step of eight output planes: the z-passes of the rows the block reads (input rows
read in place) into per-thread row slots, then per eight output rows the y-passes into padded
rows (pads folded), the x-passes, the epilogue and one store.  float16/bfloat16 inputs, rows of
non-unit stride and leading dimensions that do not collapse are copied to a contiguous float32
tensor first; outputs that the kernel cannot write in place go through a temporary.
"""

from __future__ import annotations

import numpy as np
import torch

from ..._spec import BlurSpec, FilterSpec
from .. import reference
from .._layout import collapse_planes
from .._lowering import lower
from .buffers import _alloc
from .plan import _small, _threshold
from .threads import _launch, _threads
from .volume_dense import DensePlan, _k_dense3, dense, dense_adjoint
from .volume_dense import takes as dense_takes
from .volume_direct import DirectPlan, _k_grad3, direct
from .volume_kernels import _k_gsel, _k_vol
from .volume_plan import EPI_ADDREST, EPI_BLEND, EPI_GDIV, EPI_NORM, EPI_NORMT, plan, supported

__all__ = ["filter_forward", "filter_backward", "blur_forward", "blur_backward", "runs"]


# ----------------------------------------------------------------------------
# host side

def _cd(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _vol(t, ndim, k=False):
    """``t`` (``(..., [K,] *spatial)``, ``ndim`` spatial axes) as ``(..., [K,] D, H, W)``."""
    for _ in range(3 - ndim):
        t = t.unsqueeze(-ndim - 1)
    return t


def _role(t, k):
    """``[n1, s0, s1, sK, sD, sH]`` of a volume tensor ``(..., [K,] D, H, W)`` with rows of unit
    stride, or None."""
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        return None
    nd = 4 if k else 3
    lead = collapse_planes(t.shape[:-nd], t.stride()[:-nd])
    if lead is None:
        return None
    st = t.stride()
    return [lead[0], lead[1], lead[2], st[-4] if k else 0, st[-3], st[-2]]


def _source(t, cd, k=False):
    """``t`` as the kernel reads it: compute dtype, unit-stride rows, collapsible lead dims."""
    if t.dtype != cd:
        t = t.to(cd)
    r = _role(t, k)
    if r is None:
        t = t.contiguous()
        r = _role(t, k)
    return t, r


def _target(out, shape, cd, k):
    """(tensor the kernel writes, its role, whether it is a temporary to copy into ``out``)."""
    if out is not None and out.dtype == cd:
        r = _role(out, k)
        if r is not None:
            return out, r, False
    o = _alloc(shape, cd) if out is None else torch.empty(shape, dtype=cd, device="cpu")
    return o, _role(o, k), out is not None


_NONE = [1, 0, 0, 0, 0, 0]


def _thr(thr, cd):
    return np.asarray([thr, 0.0, 1.0], np.float64 if cd == torch.float64 else np.float32)


def _run(vp, nv, s, rs, o, ro, a=None, ra=None, m=None, rm=None, thr=0.0):
    L = np.asarray(rs + ro + (ra or _NONE) + (rm or _NONE) + [nv], np.int64)
    if isinstance(vp, DirectPlan):  # the direct 3x3x3 gradient path (``volume_direct``)
        wt = vp.w64 if s.dtype == torch.float64 else vp.w32
        _launch(_k_grad3, (s.data_ptr(), o.data_ptr(), 0 if a is None else a.data_ptr(), wt, vp.M, L),
                vp.nitems, _threads(), _small(nv * s.shape[-3], s.shape[-2], s.shape[-1]))
        return
    if isinstance(vp, DensePlan):  # a dense stencil (``volume_dense``)
        wt = vp.w64 if s.dtype == torch.float64 else vp.w32
        _launch(_k_dense3, (s.data_ptr(), o.data_ptr(), wt, vp.M, L), vp.nitems, _threads(),
                _small(nv * s.shape[-3], s.shape[-2], s.shape[-1]))
        return
    carrier = np.float64(0) if s.dtype == torch.float64 else np.float32(0)
    D, H, W = s.shape[-3:]
    _launch(_k_vol, (s.data_ptr(), o.data_ptr(), 0 if a is None else a.data_ptr(), 0 if m is None else m.data_ptr(),
                     _thr(thr, s.dtype), carrier, vp.P, vp.F, L),
            vp.nitems, _threads(), _small(nv * D, H, W))


def runs(spec) -> bool:
    """Does this engine run ``spec`` (the others go to ``reference``)?"""
    return supported(spec)


def _nvol(shape, k=False):
    return int(np.prod(shape[:-4 if k else -3])) if len(shape) > (4 if k else 3) else 1


def filter_forward(x, spec: FilterSpec, out=None):
    if not isinstance(spec, FilterSpec) or x.numel() == 0:
        return reference.filter_forward(x, spec, out)
    spec = lower(spec, x.shape)
    sep = supported(spec)
    if not sep and not dense_takes(spec):
        return reference.filter_forward(x, spec, out)
    cd = _cd(x.dtype)
    nd = spec.ndim
    K = len(spec.stencils)
    comps = spec.epilogue == "stack" and K > 1
    oshape = spec.out_shape(x.shape)
    s, rs = _source(_vol(x, nd), cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    if not sep:  # one dense stencil (``volume_dense``)
        vp = dense(spec, sizes, nv)
    else:
        vp = direct(spec, sizes, nv, _threads()) or plan(spec, sizes, False, nv, _threads(), 8 if cd == torch.float64 else 4)
    o3shape = s.shape[:-3] + ((K,) if comps else ()) + sizes
    return _deliver(vp, nv, s, rs, x, o3shape, out, nd, cd, comps=comps, oshape=oshape)


def filter_backward(grad, x, spec: FilterSpec, out=None):
    if not isinstance(spec, FilterSpec) or x.numel() == 0:
        return reference.filter_backward(grad, x, spec, out)
    spec = lower(spec, x.shape)
    if not supported(spec):
        if dense_takes(spec):
            return _dense_backward(grad, x, spec, out)
        return reference.filter_backward(grad, x, spec, out)
    cd = _cd(x.dtype)
    nd = spec.ndim
    K = len(spec.stencils)
    isz = 8 if cd == torch.float64 else 4
    nt = _threads()
    x3 = _vol(x, nd)
    sizes = tuple(x3.shape[-3:])
    lead = x3.shape[:-3]
    nv = _nvol(x3.shape)
    comps = spec.epilogue == "stack" and K > 1
    if spec.epilogue == "magnitude":
        # phase 1: g * y_k / |y| into K temporaries (forward passes); phase 2: their transposes
        s, rs = _source(x3, cd)
        g, rg = _source(_vol(grad.expand(spec.out_shape(x.shape)), nd), cd)
        tmp = _alloc(lead + (K,) + sizes, cd)  # (the output cache: no page faults once warm)
        vp = direct(spec, sizes, nv, nt, "magscale") or plan(spec, sizes, False, nv, nt, isz, magscale=True)
        _run(vp, nv, s, rs, tmp, _role(tmp, True), g, rg)
        src, rsrc = tmp, _role(tmp, True)
        bspec = spec._replace(epilogue="stack")  # each stencil reads its own component
    else:
        src, rsrc = _source(_vol(grad.expand(spec.out_shape(x.shape)), nd), cd, comps)
        bspec = spec
    vb = plan(bspec, sizes, True, nv, nt, isz)
    return _deliver(vb, nv, src, rsrc, x, lead + sizes, out, nd, cd)


def _dense_backward(grad, x, spec, out):
    """``A^T g`` of one dense stencil in one launch of the dense kernel (``volume_dense``: the
    full correlation with the flipped taps, each output summing the positions the forward's
    padding copies from it)."""
    cd = _cd(x.dtype)
    nd = spec.ndim
    src, rsrc = _source(_vol(grad.expand(x.shape), nd), cd)
    sizes = tuple(src.shape[-3:])
    nv = _nvol(src.shape)
    return _deliver(dense_adjoint(spec, sizes, nv), nv, src, rsrc, x, src.shape, out, nd, cd)


def _blur_linear(spec):
    """The linear part of a :class:`BlurSpec` as a one-stencil :class:`FilterSpec` (its ``cval``;
    ``normalized`` blurs use 0: outside the image nothing is masked), or None where this engine
    does not run it."""
    fs = FilterSpec(spec.mode, 0.0 if spec.normalized else spec.cval, "stack", (spec.stencil,), spec.ndim)
    return fs if supported(fs) else None


def _blur_parts(spec, shape):
    """``(spec, linear part)`` of a blur spec on ``shape``: the linear part folded onto the image
    (``lower``) even with ``keep_border``, whose band ``_box`` takes from the unfolded stencil."""
    spec = lower(spec, shape)
    fs = _blur_linear(spec)
    return spec, (None if fs is None else lower(fs, shape))


def _selection(x, s, rs, mask, threshold, nd, cd):
    """``(M, role, thr)`` with ``sel = M >= thr``: the input itself (``s``), or the mask as 0/1."""
    if mask is None:
        return s, rs, _threshold(x, threshold)
    m = mask.to(device=x.device, dtype=torch.bool).expand(x.shape).to(cd)
    m, rm = _source(_vol(m, nd), cd)
    return m, rm, 0.5


def _box(spec, sizes):
    """Where a selective blur may write: everywhere, or (``keep_border``) where the stencil's
    footprint stays inside the volume (``reference.border_mask``)."""
    if not spec.keep_border:
        return None
    nd = spec.ndim
    box = []
    for a, n in zip((-3, -2, -1), sizes):
        lo, hi = spec.stencil.extent(a) if a >= -nd else (0, 0)
        box += [min(n, max(0, -lo)), max(0, min(n, n - hi))]
    return tuple(box)


def _blend_forward(x, mask, spec, fs, threshold, out):
    cd = _cd(x.dtype)
    nd = spec.ndim
    x3 = _vol(x, nd)
    s, rs = _source(x3, cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    M, rm, thr = _selection(x, s, rs, mask, threshold, nd, cd)
    vp = plan(fs, sizes, False, nv, _threads(), 8 if cd == torch.float64 else 4, epi=EPI_BLEND, box=_box(spec, sizes))
    return _deliver(vp, nv, s, rs, x, s.shape, out, nd, cd, s, rs, M, rm, thr)


def _gsel(g, rg, M, rm, o, ro, thr, box, ones, nv):
    """``o = sel ? g : 0`` (``ones``: ``sel ? 1 : 0``), ``sel = M >= thr`` inside ``box``."""
    D, H, W = o.shape[-3:]
    Ba = np.asarray((D, H, W) + (box or (0, D, 0, H, 0, W)) + (int(ones),), np.int64)
    carrier = np.float64(0) if o.dtype == torch.float64 else np.float32(0)
    L = np.asarray(rg + ro + _NONE + rm + [nv], np.int64)
    _launch(_k_gsel, (g.data_ptr(), M.data_ptr(), o.data_ptr(), _thr(thr, o.dtype), carrier, Ba, L), nv * D, _threads(),
            _small(nv * D, H, W))


def _deliver(vp, nv, src, rsrc, x, shape3, out, nd, cd, *extra, comps=False, oshape=None):
    """Run ``vp`` into a fresh output, ``out`` or a temporary copied there; the result, shaped
    ``oshape`` (default ``x``'s; ``comps``: the output has a component axis)."""
    oshape = x.shape if oshape is None else oshape
    if out is None and x.dtype != cd:
        o = torch.empty(shape3, dtype=cd, device="cpu")
        _run(vp, nv, src, rsrc, o, _role(o, comps), *extra)
        return o.to(x.dtype).view(oshape)
    o, ro, copy = _target(None if out is None else _vol(out, nd, comps), shape3, cd, comps)
    _run(vp, nv, src, rsrc, o, ro, *extra)
    if out is None:
        return o.view(oshape)
    if copy:
        _vol(out, nd, comps).copy_(o)
    return out


def _norm_forward(x, mask, spec, fs, threshold, out):
    """``(w & den > 0) ? blur(m x) / blur(m) : x``: ``[m x, m]`` (``_k_gsel``), then both blurs and
    the division in one pass (``norm``)."""
    cd = _cd(x.dtype)
    nd = spec.ndim
    x3 = _vol(x, nd)
    s, rs = _source(x3, cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    M, rm, thr = _selection(x, s, rs, mask, threshold, nd, cd)
    src = _alloc(s.shape[:-3] + (2,) + sizes, cd)
    for k in range(2):
        c = src.select(-4, k)
        _gsel(s, rs, M, rm, c, _role(c, False), thr, None, k == 1, nv)
    fs2 = fs._replace(stencils=fs.stencils * 2)
    vp = plan(fs2, sizes, False, nv, _threads(), 8 if cd == torch.float64 else 4, epi=EPI_NORM,
              box=_box(spec, sizes), multi=True)
    return _deliver(vp, nv, src, _role(src, True), x, s.shape, out, nd, cd, s, rs, M, rm, thr)


def _norm_backward(grad, x, mask, spec, fs, threshold, out):
    """``m * blurT(gd) + rest`` with ``gd = use ? g / den : 0``, ``rest = use ? 0 : g``,
    ``den = blur(m)``, ``use = w & den > 0``: the mask as 0/1, one blur writing ``[gd, rest]``
    (``gdiv``), the transposed blur adding ``rest`` (``normt``)."""
    cd = _cd(x.dtype)
    nd = spec.ndim
    isz = 8 if cd == torch.float64 else 4
    x3 = _vol(x, nd)
    s, rs = _source(x3, cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    M, rm, thr = _selection(x, s, rs, mask, threshold, nd, cd)
    g, rg = _source(_vol(grad.expand(x.shape), nd), cd)
    mf = _alloc(s.shape, cd)
    rmf = _role(mf, False)
    _gsel(s, rs, M, rm, mf, rmf, thr, None, True, nv)
    t2 = _alloc(s.shape[:-3] + (2,) + sizes, cd)
    vp = plan(fs, sizes, False, nv, _threads(), isz, epi=EPI_GDIV, box=_box(spec, sizes))
    _run(vp, nv, mf, rmf, t2, _role(t2, True), g, rg, M, rm, thr)
    gd, rest = t2.select(-4, 0), t2.select(-4, 1)
    vb = plan(fs, sizes, True, nv, _threads(), isz, epi=EPI_NORMT)
    return _deliver(vb, nv, gd, _role(gd, False), x, s.shape, out, nd, cd, rest, _role(rest, False), M, rm, thr)


def _blend_backward(grad, x, mask, spec, fs, threshold, out):
    """``blurT(w * g) + (1 - w) * g``: the masked gradient (``_k_gsel``), then the transposed
    passes with the ``addrest`` epilogue."""
    cd = _cd(x.dtype)
    nd = spec.ndim
    isz = 8 if cd == torch.float64 else 4
    x3 = _vol(x, nd)
    s, rs = _source(x3, cd)
    sizes = tuple(s.shape[-3:])
    nv = _nvol(s.shape)
    M, rm, thr = _selection(x, s, rs, mask, threshold, nd, cd)
    g, rg = _source(_vol(grad.expand(x.shape), nd), cd)
    box = _box(spec, sizes)
    gm = _alloc(s.shape, cd)
    rgm = _role(gm, False)
    _gsel(g, rg, M, rm, gm, rgm, thr, box, False, nv)
    vb = plan(fs, sizes, True, nv, _threads(), isz, epi=EPI_ADDREST, box=box)
    return _deliver(vb, nv, gm, rgm, x, s.shape, out, nd, cd, g, rg, M, rm, thr)


def blur_forward(x, mask, spec, threshold, out=None):
    """Selective blur.  The blend variant runs fused (one pass: blur, select, store); the
    normalized one runs its two blurs here and the masked mean in torch (the reference engine's
    formulas)."""
    if not isinstance(spec, BlurSpec) or x.numel() == 0:
        return reference.blur_forward(x, mask, spec, threshold, out)
    spec, fs = _blur_parts(spec, x.shape)
    if fs is None:
        return reference.blur_forward(x, mask, spec, threshold, out)
    if not spec.normalized:
        return _blend_forward(x, mask, spec, fs, threshold, out)
    return _norm_forward(x, mask, spec, fs, threshold, out)


def blur_backward(grad, x, mask, spec, threshold, out=None):
    if not isinstance(spec, BlurSpec) or x.numel() == 0:
        return reference.blur_backward(grad, x, mask, spec, threshold, out)
    spec, fs = _blur_parts(spec, x.shape)
    if fs is None:
        return reference.blur_backward(grad, x, mask, spec, threshold, out)
    if not spec.normalized:
        return _blend_backward(grad, x, mask, spec, fs, threshold, out)
    return _norm_backward(grad, x, mask, spec, fs, threshold, out)
