"""Fused CPU engine: numba kernels, one pass forward and one pass backward.

One stencil engine runs every spec (``_spec``): operators are data.  A spec
is compiled (in Python, once per spec, image size and blocking, then cached)
into two small arrays -- ``P`` (int64: sizes, fold tables, tap offsets,
stencil descriptors, border-column lists) and ``F`` (float64: ``cval``, tap
weights, constant-mode corrections) -- that a handful of generic kernels
interpret.

Modules: ``prims`` (numba primitives), ``tables`` (plan array layout), ``plan``
(spec to plan tables, call layouts), ``forward`` (tiled forward engine), ``adjoint``
(tiled backward engine), ``direct`` (the direct 3x3 path), ``separable`` (symmetric
separable specs: register-blocked fused passes), ``simd`` (explicit vectors for it),
``buffers`` (the output cache), ``threads`` (the thread pool), ``cache`` (where compiled
kernels are cached), ``volume`` / ``volume_plan`` / ``volume_kernels`` (the volume engine: specs
of three axes, or two with per-axis modes, that no plane engine maps; ``_planar.adapt`` hands
them over).
"""

from __future__ import annotations


import numpy as np
import torch

from ..._spec import BlurSpec, FilterSpec
from types import SimpleNamespace

from .. import reference
from .._lowering import lower
from .._planar import adapt
from . import cache

cache.install()  # before the kernel modules: their decorators pick the cache locator

from .adjoint import _K_FILTER_BWD, _k_blur_bwd
from .buffers import _alloc, empty_cache
from .direct import _STREAM_BYTES, _STREAM_MIN_W, _d3_plan
from .forward import _K_FILTER_FWD, _k_blur_fwd
from .plan import _blocking, _info, _plan, _prepare, _small
from .prims import _CARRIER, _DTYPES
from .separable import _k_sep, inplace_ok, sep_info, sep_plan
from .tables import R_O, R_X
from .threads import _launch, _threads

__all__ = ["NAME", "UNAVAILABLE_HINT", "available", "blur_backward", "blur_forward", "empty_cache", "filter_backward",
           "rank_forward", "rank_backward",
           "filter_forward"]

NAME = "cpu"
UNAVAILABLE_HINT = " (the numba engine runs CPU tensors of float16, bfloat16, float32 and float64)"

def available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype in _DTYPES



# ----------------------------------------------------------------------------
# engine entry points


def _filter_forward_planes(x, spec: FilterSpec, out=None):
    spec = lower(spec, x.shape)
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.filter_forward(x, spec, out)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    o = _alloc(spec.out_shape(x.shape), x.dtype) if out is None else out
    ok = o.dim() == x.dim() + 1
    x, o2, _, _, L, tmp = _prepare(x, o, ok)
    d3 = _d3_plan(info, H, W, N, nt, x.element_size(), o2.data_ptr() % x.element_size() == 0)
    args = (x.data_ptr(), o2.data_ptr(), _CARRIER[x.dtype])
    sinfo = None
    if d3 is not None and L[R_X + 4] == W and L[R_X + 5] == 1 and L[R_O + 4] == W and L[R_O + 5] == 1:
        kernel, D, F, T, nitems = d3  # rows contiguous in and out: the direct 3x3 path
        _launch(kernel, args + (D, F, T, L), nitems, nt, _small(N, H, W))
    elif (sinfo := sep_info(spec)) is not None:  # symmetric 1-D passes: the separable path
        _sep_launch(x, o2, L, sinfo, H, W, N, nt)
    else:
        P, F, per, mp = _plan(info, H, W, _blocking(info, H, W, N, nt))
        _launch(_K_FILTER_FWD[info.epi], args + (P, F, L), -(-N // mp) * per, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o


def _sep_launch(x, o2, L, sinfo, H, W, N, nt):
    """The symmetric separable path (``separable``) on prepared tensors."""
    isz = x.element_size()
    native = x.dtype in (torch.float32, torch.float64)
    inplace = native and x.data_ptr() % isz == 0 and inplace_ok(x, isz, sinfo)
    direct = native and (o2.stride(-1) == 1 or W == 1) and o2.data_ptr() % isz == 0
    # outputs larger than the last-level cache, of wide rows whose vectors are whole lines:
    # non-temporal stores (no read for ownership: a third less memory traffic)
    stream = (direct and o2.numel() * isz >= _STREAM_BYTES and W >= _STREAM_MIN_W and o2.data_ptr() % 64 == 0
              and all(s * isz % 64 == 0 for s in o2.stride()[:-1]))
    P, F, nitems = sep_plan(sinfo, H, W, N, nt, isz)
    _launch(_k_sep, (x.data_ptr(), o2.data_ptr(), _CARRIER[x.dtype], P, F, L, inplace, direct, stream), nitems,
            nt, _small(N, H, W))


def _filter_backward_planes(grad, x, spec: FilterSpec, out=None):
    spec = lower(spec, x.shape)
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.filter_backward(grad, x, spec, out)
    if grad.dtype != x.dtype:
        grad = grad.to(x.dtype)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    P, F, per, _ = _plan(info, H, W, _blocking(info, H, W, N, nt, True))
    nitems = N * per
    o = _alloc(x.shape, x.dtype) if out is None else out
    gk = grad.dim() == x.dim() + 1
    x, o2, grad, _, L, tmp = _prepare(x, o, False, grad, gk)
    _launch(_K_FILTER_BWD[info.epi], (grad.data_ptr(), x.data_ptr(), o2.data_ptr(), _CARRIER[x.dtype], P, F, L),
            nitems, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o


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
    return float(torch.tensor(threshold, dtype=dt))


def _blur_forward_planes(x, mask, spec: BlurSpec, threshold: float, out=None):
    spec = lower(spec, x.shape)
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.blur_forward(x, mask, spec, threshold, out)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    P, F, per, mp = _plan(info, H, W, _blocking(info, H, W, N, nt))
    nitems = -(-N // mp) * per
    o = _alloc(x.shape, x.dtype) if out is None else out
    if mask is not None and mask.shape != x.shape:
        mask = mask.expand(x.shape)
    x, o2, _, mask, L, tmp = _prepare(x, o, False, None, False, mask)
    ma = 0 if mask is None else mask.data_ptr()
    _launch(_k_blur_fwd, (x.data_ptr(), ma, o2.data_ptr(), _CARRIER[x.dtype], P, F, L, _threshold(x, threshold)),
            nitems, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o


def _blur_backward_planes(grad, x, mask, spec: BlurSpec, threshold: float, out=None):
    spec = lower(spec, x.shape)
    info = _info(spec)
    if info is None or x.numel() == 0:
        return reference.blur_backward(grad, x, mask, spec, threshold, out)
    if grad.dtype != x.dtype:
        grad = grad.to(x.dtype)
    H, W = x.shape[-2], x.shape[-1]
    N = x.numel() // (H * W)
    nt = _threads()
    P, F, per, _ = _plan(info, H, W, _blocking(info, H, W, N, nt, True))
    nitems = N * per
    o = _alloc(x.shape, x.dtype) if out is None else out
    if mask is not None and mask.shape != x.shape:
        mask = mask.expand(x.shape)
    if grad.shape != x.shape:
        grad = grad.expand(x.shape)
    x, o2, grad, mask, L, tmp = _prepare(x, o, False, grad, False, mask)
    ma = 0 if mask is None else mask.data_ptr()
    _launch(_k_blur_bwd, (grad.data_ptr(), x.data_ptr(), ma, o2.data_ptr(), _CARRIER[x.dtype], P, F, L, _threshold(x, threshold)),
            nitems, nt, _small(N, H, W))
    if tmp:
        o.copy_(o2)
    return o


# specs of 1 or 3 axes, or per-axis modes (``_planar``): planes of one row, or the volume
# engine where no plane engine fits (it hands what it does not run to the reference engine)
from . import volume  # noqa: E402

filter_forward, filter_backward, blur_forward, blur_backward = adapt(
    SimpleNamespace(filter_forward=_filter_forward_planes, filter_backward=_filter_backward_planes,
                    blur_forward=_blur_forward_planes, blur_backward=_blur_backward_planes),
    volume,
)

from .rank import rank_backward, rank_forward  # noqa: E402,F401  (rank filters: min, max, median, percentile)
