"""Fused Triton engine.

CUDA tensors of float16 / bfloat16 / float32 / float64 (and CPU tensors under
``TRITON_INTERPRET=1``, which is how CI tests this package).  Same interface as
:mod:`..reference`, which is the oracle (its NaN, zero-tap, threshold and
keep-border rules included).

Modules:

* :mod:`.prims`: device helpers (folding, rounding, ``atan2``, magnitude);
* :mod:`.rows`: the row-streaming forward kernel of separable stencils (aligned vector
  rows, constexpr taps), tried first;
* :mod:`.footprint`: the general forward and backward kernels (any spec);
* :mod:`.plan`: their host-side lowering and launch plans;
* :mod:`.volume`: the fused 3x3x3 gradient (3-D Sobel, Prewitt, Scharr);
* :mod:`.chain`: stencils of three axes (and per-axis modes) as chains of plane launches;
* :mod:`.rank`, :mod:`.canny`: rank filters and Canny.

``benchmarks/gpu_check.py --compile-only`` compiles every kernel family for sm_90 without a GPU;
``benchmarks/gpu_check.py`` checks them on a GPU against the reference engine.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
from types import SimpleNamespace

import torch
import triton


def _triton_version():
    m = re.match(r"(\d+)\.(\d+)", str(getattr(triton, "__version__", "")))
    return (int(m[1]), int(m[2])) if m else (99, 0)  # (no version: a development build, taken as recent)


#: the oldest Triton the kernels compile with (3.5's compiler aborts on several of them; 3.4 has no
#: ``triton.constexpr_function``)
MIN_TRITON = (3, 6)
if _triton_version() < MIN_TRITON:
    _min = ".".join(map(str, MIN_TRITON))
    _too_old = ImportError(f"the Triton engine needs triton >= {_min}; found {getattr(triton, '__version__', '?')}")
    _too_old.fix = f"upgrade it (pip install 'triton>={_min}')"
    raise _too_old

from ..._spec import BlurSpec, FilterSpec
from ..._validate import compute_dtype
from .. import reference as _ref
from .._layout import collapse_planes
from .._planar import adapt as _adapt
from . import rows as _rows
from . import rows_bwd as _rows_bwd
from .footprint import _bwd_kernel, _fwd_kernel
from .plan import (_BLEND, _DIR, _EPILOGUES, _MAG, _NORM, _PLANS, _STACK, _SUM, _TILE, _U_DIR, _U_MAG,  # noqa: F401
                   _U_NORM, _lower, _np2, _slots, set_tile_limits)

NAME = "triton"
UNAVAILABLE_HINT = (
    " (the Triton engine runs CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 is set "
    "before triton is first imported)"
)

#: kernel launches by kernel name (tests assert on it: a silent fallback proves nothing)
LAUNCHES: collections.Counter = collections.Counter()
#: specs this engine handed to the reference, by entry point: the specs no kernel plans (more
#: than two stencils over two axes, two passes along one axis, and the like)
FALLBACKS: collections.Counter = collections.Counter()

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def interpreted() -> bool:
    """Whether this module's kernels were built for Triton's CPU interpreter."""
    return type(_fwd_kernel).__name__ == "InterpretedFunction"

def available(device: torch.device, dtype: torch.dtype) -> bool:
    if dtype not in _FLOATS:
        return False
    device = torch.device(device)
    if device.type == "cuda":
        return not interpreted() and torch.cuda.is_available()
    if device.type == "cpu":
        return interpreted() and os.environ.get("TRITON_INTERPRET") == "1"
    return False

def _planes(t: torch.Tensor):
    """``(t, n_inner, s_outer, s_inner, s_h, s_w)``: plane ``i`` of ``t`` (leading dims
    flattened) starts at ``(i // n_inner) * s_outer + (i % n_inner) * s_inner``."""
    lead = collapse_planes(t.shape[:-2], t.stride()[:-2])
    if lead is None:
        t = t.contiguous()
        lead = collapse_planes(t.shape[:-2], t.stride()[:-2])
    n1, s0, s1 = lead
    return t, n1, s0, s1, t.stride(-2), t.stride(-1)

def _unwritable(out):
    """Whether the kernels cannot write ``out`` in place: its leading dims (with a stacked
    component axis, or without it) do not collapse to a plane index (``_planes`` would copy it,
    and the kernel write the copy): the plane entry points then write through a temporary."""
    if out is None:
        return False
    if collapse_planes(out.shape[:-2], out.stride()[:-2]) is None:
        return True
    return out.dim() >= 3 and collapse_planes(out.shape[:-3], out.stride()[:-3]) is None


def _check_out(out, shape, dtype, device, inputs):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor; got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"out must have shape {tuple(shape)}, dtype {dtype} and device {device}; "
            f"got {tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    for t in inputs:
        if t is not None and t.numel() and out.numel():
            if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                raise ValueError("out must not share memory with the inputs")

def _fallback(name, *args, **kw):
    FALLBACKS[name] += 1
    return getattr(_ref, name)(*args, **kw)

#: Triton 3.6-3.8 abort on the general backward kernel's border bands of several rows or columns
#: (``footprint._expand``'s ``tl.gather``): their ``TritonGPUOptimizeThreadLocality`` pass asserts
#: that the gather is warp-local.  There, the plans place bands one row (column) a step
#: (``plan._gather_bands``), which needs no gather.
GATHER_BANDS = _triton_version() >= (3, 9)


def _safe_offsets(*ts):
    for t in ts:
        if t is not None and t.numel():
            span = sum((n - 1) * abs(s) for n, s in zip(t.shape[-2:], t.stride()[-2:]))
            if span >= 2**31:
                return False
    return True

def _launch_fwd(plan, x, mask, grad, out, epi, keep_border, NP, H, W):
    x3 = _planes(x)
    m3 = _planes(mask.view(torch.uint8)) if mask is not None else x3
    g3 = _planes(grad) if grad is not None else x3
    if epi in (_STACK, _U_MAG, _U_DIR) and plan.ce["K"] == 2:
        o_sk = out.stride(-3)
        o3 = _planes(out.select(-3, 0))
    else:
        o_sk = 0
        o3 = _planes(out)
    BP, BH, BW, n_th, n_tw, warps = plan.fwd
    grid = (-(-NP // BP) * n_th * n_tw,)
    by0, by1, bx0, bx1 = plan.ext
    with _device(x):
        _fwd_kernel[grid](
            *x3, *m3, *g3, *o3, o_sk, plan.ip, plan.fp, NP, H, W, n_th, n_tw, by0, by1, bx0, bx1,
            **plan.ce, HAS_MASK=mask is not None, KEEP_BORDER=keep_border, EPI=epi,
            BP=BP, BH=BH, BW=BW, num_warps=warps, enable_fp_fusion=False,
        )
    LAUNCHES["fwd"] += 1

def _launch_bwd(plan, x, mask, grad, u, out, epi, keep_border, NP, H, W):
    x3 = _planes(x)
    m3 = _planes(mask.view(torch.uint8)) if mask is not None else x3
    if u is not None:  # (NP, K, H, W) buffer written by the forward kernel
        usrc = 1
        u_sk = u.stride(1)
        u3 = _planes(u.select(1, 0))
        g3 = _planes(grad)
    elif epi == _SUM:  # each stencil's adjoint of the one gradient plane (stack's, stride 0)
        usrc, u_sk, epi = 0, 0, _STACK
        u3 = g3 = _planes(grad)
    elif epi == _STACK:
        usrc = 0
        if plan.ce["K"] == 2:
            u_sk = grad.stride(-3)
            u3 = _planes(grad.select(-3, 0))
        else:
            u_sk = 0
            u3 = _planes(grad)
        g3 = u3
    else:
        usrc = 0
        g3 = _planes(grad)
        u3, u_sk = g3, 0
    o3 = _planes(out)
    BP, BH, BW, n_th, n_tw, warps = plan.bwd
    grid = (-(-NP // BP) * n_th * n_tw,)
    by0, by1, bx0, bx1 = plan.ext
    with _device(x):
        _bwd_kernel[grid](
            *x3, *m3, *g3, *u3, u_sk, *o3, plan.ip, plan.fp, NP, H, W, n_th, n_tw,
            by0, by1, bx0, bx1, plan.SY, plan.SX,
            **plan.ce, HAS_MASK=mask is not None, KEEP_BORDER=keep_border, EPI=epi, USRC=usrc,
            BP=BP, BH=BH, BW=BW, BBY=plan.BBY, BBX=plan.BBX, EXTRAS=plan.SY + plan.SX > 0,
            num_warps=warps, enable_fp_fusion=False,
        )
    LAUNCHES["bwd"] += 1

#: whether the row-streaming kernel is tried first (tests turn it off to run the general one)
ROWS = True


def _rows_forward(x, mask, y, spec, NP, H, W, cval, thr, ext, keep_border) -> bool:
    """Run ``spec`` forward with :mod:`.rows` if it fits (contiguous, aligned rows; a separable
    spec of small reach); False when the general footprint kernel must run instead."""
    if not ROWS:
        return False
    k_stride, yp = _stacked(spec, y)
    m8 = mask.view(torch.uint8) if mask is not None else None
    strides = _row_strides(x, yp, m8)
    kp = _rows.plan(spec, H, W, NP, x.dtype, strides + [k_stride], thr) if strides is not None else None
    if kp is None:
        return False
    with _device(x):
        _rows.launch(kp, x, m8, yp, NP, H, W, cval, thr, ext, keep_border, k_stride)
    LAUNCHES["rows"] += 1
    return True


def _rows_backward(grad, x, mask, gin, spec, NP, H, W, cval, thr, ext, keep_border) -> bool:
    """The fused backward of :mod:`.rows_bwd` if it fits (as :func:`_rows_forward`, and reach
    at most 3 on planes of at least ``2 * reach + 2``); False when the general one must run."""
    if not ROWS:
        return False
    k_stride, gp = _stacked(spec, grad)
    m8 = mask.view(torch.uint8) if mask is not None else None
    strides = _row_strides(x, gp, gin, m8)
    kp = _rows_bwd.plan(spec, H, W, NP, x.dtype, strides + [k_stride]) if strides is not None else None
    if kp is None:
        return False
    with _device(x):
        _rows_bwd.launch(kp, x, m8, gp, gin, NP, H, W, cval, thr, ext, keep_border, k_stride)
    LAUNCHES["rows_bwd"] += 1
    return True


def _stacked(spec, t):
    """``(stride, plane 0)`` of the stacked stencil axis of a two-stencil gradient, else ``(0, t)``."""
    if isinstance(spec, FilterSpec) and spec.epilogue == "stack" and len(spec.stencils) == 2:
        return t.stride(-3), t.select(-3, 0)
    return 0, t


def _row_strides(*ts):
    """Every plane stride and row stride of ``ts`` (None entries skipped), or None when one has
    rows that are not contiguous."""
    out = []
    for t in ts:
        if t is None:
            continue
        part = _rows._strided(t)
        if part is None:
            return None
        out += list(part[1:])
    return out


def _device(x):
    """Launch on ``x``'s GPU (Triton launches on the current device and its current stream)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()

def _result(out, shape, x):
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    return out

def _filter_forward_planes(x, spec: FilterSpec, out=None):
    shape = spec.out_shape(x.shape)
    if out is not None:
        _check_out(out, shape, x.dtype, x.device, (x,))
        if _unwritable(out):
            return out.copy_(_filter_forward_planes(x, spec))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    if x.numel() == 0:
        return _result(out, shape, x)
    if not _safe_offsets(x, out):
        return _fallback("filter_forward", x, spec, out=out)
    y = _result(out, shape, x)
    if _rows_forward(x, None, y, spec, NP, H, W, spec.cval, 0.0, (0, 0, 0, 0), False):
        return y  # (no device table, nothing but the output allocated)
    plan = _lower(spec, H, W, NP, x.dtype, x.device, None)
    if plan is None:
        return _fallback("filter_forward", x, spec, out=out)
    _launch_fwd(plan, x, None, None, y, _EPILOGUES[spec.epilogue], False, NP, H, W)
    return y

def _filter_backward_planes(grad, x, spec: FilterSpec, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x, grad))
        if _unwritable(out):
            return out.copy_(_filter_backward_planes(grad, x, spec))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    if x.numel() == 0:
        return _result(out, x.shape, x)
    if not _safe_offsets(x, grad, out):
        return _fallback("filter_backward", grad, x, spec, out=out)
    if grad.shape != spec.out_shape(x.shape):
        grad = grad.expand(spec.out_shape(x.shape))
    gin = _result(out, x.shape, x)
    if _rows_backward(grad, x, None, gin, spec, NP, H, W, spec.cval, 0.0, (0, 0, 0, 0), False):
        return gin  # (no device table, nothing but the result allocated)
    plan = _lower(spec, H, W, NP, x.dtype, x.device, None)
    if plan is None:
        return _fallback("filter_backward", grad, x, spec, out=out)
    epi = _EPILOGUES[spec.epilogue]
    u = None
    if epi in (_MAG, _DIR) and not plan.recompute:
        K = plan.ce["K"]
        u = torch.empty((NP, K, H, W), dtype=compute_dtype(x.dtype), device=x.device)
        _launch_fwd(plan, x, None, grad, u, _U_MAG if epi == _MAG else _U_DIR, False, NP, H, W)
    _launch_bwd(plan, x, None, grad, u, gin, epi, False, NP, H, W)
    return gin

def _blur_forward_planes(x, mask, spec: BlurSpec, threshold: float, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x, mask))
        if _unwritable(out):
            return out.copy_(_blur_forward_planes(x, mask, spec, threshold))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    if x.numel() == 0:
        return _result(out, x.shape, x)
    if not _safe_offsets(x, mask, out):
        return _fallback("blur_forward", x, mask, spec, threshold, out=out)
    thr = _threshold(threshold, mask, x.dtype)
    m = _mask(mask, x)
    y = _result(out, x.shape, x)
    ext = spec.stencil.extent(-2) + spec.stencil.extent(-1)  # the kept border's (as the plan's)
    if not spec.normalized and _rows_forward(x, m, y, spec, NP, H, W, spec.cval, thr, ext, spec.keep_border):
        return y
    plan = _lower(spec, H, W, NP, x.dtype, x.device, thr)
    if plan is None:
        return _fallback("blur_forward", x, mask, spec, threshold, out=out)
    _launch_fwd(plan, x, m, None, y, _NORM if spec.normalized else _BLEND, spec.keep_border, NP, H, W)
    return y

def _blur_backward_planes(grad, x, mask, spec: BlurSpec, threshold: float, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x, grad, mask))
        if _unwritable(out):
            return out.copy_(_blur_backward_planes(grad, x, mask, spec, threshold))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    if x.numel() == 0:
        return _result(out, x.shape, x)
    if not _safe_offsets(x, grad, mask, out):
        return _fallback("blur_backward", grad, x, mask, spec, threshold, out=out)
    thr = _threshold(threshold, mask, x.dtype)
    m = _mask(mask, x)
    grad = grad.expand(x.shape)
    gin = _result(out, x.shape, x)
    ext = spec.stencil.extent(-2) + spec.stencil.extent(-1)
    if not spec.normalized and _rows_backward(grad, x, m, gin, spec, NP, H, W, spec.cval, thr, ext,
                                              spec.keep_border):
        return gin
    plan = _lower(spec, H, W, NP, x.dtype, x.device, thr)
    if plan is None:
        return _fallback("blur_backward", grad, x, mask, spec, threshold, out=out)
    mask = m
    u = None
    if spec.normalized and not plan.recompute:
        u = torch.empty((NP, 1, H, W), dtype=compute_dtype(x.dtype), device=x.device)
        _launch_fwd(plan, x, mask, grad, u, _U_NORM, spec.keep_border, NP, H, W)
    _launch_bwd(plan, x, mask, grad, u, gin, _NORM if spec.normalized else _BLEND, spec.keep_border, NP, H, W)
    return gin


@functools.lru_cache(maxsize=256)
def _rounded(threshold: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(threshold, dtype=dtype))

def _threshold(threshold, mask, dtype) -> float:
    """``x >= threshold`` as torch compares it: in x's dtype, the threshold rounded to it
    (exact in the compute dtype).  Unused with an explicit mask."""
    return 0.0 if mask is not None else _rounded(float(threshold), dtype)

def _mask(mask, x):
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        mask = mask != 0
    if mask.device != x.device:
        mask = mask.to(x.device)
    return mask.expand(x.shape)


from . import chain as _chain  # noqa: E402  (they take _device, LAUNCHES and the plane entry
from . import volume as _volume  # noqa: E402   points from here)


def _volume_forward(x, spec, out=None):
    """A spec no plane engine maps: the fused 3x3x3 gradient (``volume``), else chains of plane
    launches (``chain``: separable stencils), else the reference."""
    y = _volume.filter_forward(x, spec, out)
    if y is None:
        y = _chain.filter_forward(x, spec, out)
    return y if y is not None else _fallback("filter_forward", x, spec, out=out)


def _chained(name, *args, **kw):
    """``chain``'s entry point ``name``, else the reference's (counted)."""
    y = getattr(_chain, name)(*args, **kw)
    return y if y is not None else _fallback(name, *args, **kw)


# specs of 1 or 3 axes, or per-axis modes (``_planar``): planes of the input's rows (or of one
# row), the fused 3x3x3 gradient, chains of plane launches, or the reference engine where no
# Triton kernel fits
filter_forward, filter_backward, blur_forward, blur_backward = _adapt(
    SimpleNamespace(filter_forward=_filter_forward_planes, filter_backward=_filter_backward_planes,
                    blur_forward=_blur_forward_planes, blur_backward=_blur_backward_planes),
    SimpleNamespace(filter_forward=_volume_forward, filter_backward=functools.partial(_chained, "filter_backward"),
                    blur_forward=functools.partial(_chained, "blur_forward"),
                    blur_backward=functools.partial(_chained, "blur_backward")),
)

_chain.bind(filter_forward, filter_backward)

from .rank import rank_backward, rank_forward  # noqa: E402,F401  (rank filters)
