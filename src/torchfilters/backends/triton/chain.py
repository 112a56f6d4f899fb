"""Separable stencils over any axes, and per-axis modes, as a chain of plane launches.

The plane kernels (:mod:`.rows`, :mod:`.footprint`) filter planes ``(..., H, W)`` with one
boundary mode.  A separable stencil of a volume spec -- SciPy's sequence of 1-D passes, one per
axis -- runs here as a short chain of those launches, each on a view of the same memory:

* a pass along the depth ``D`` is a vertical pass on the planes ``(..., D, H * W)`` (each
  "row" a whole ``H x W`` plane, contiguous: the row kernel streams it as it streams rows);
* consecutive passes along ``H`` and ``W`` that share a mode are one launch of the 2-D kernel
  (both passes on chip), as a 2-D filter runs; passes of different modes are launches of their
  own.

So a 3-D Gaussian is two launches and one intermediate (in the compute dtype), and SciPy's
order of passes is kept: each launch reads the previous one's result, padded by
its own axis's mode (``constant``: ``cval``, as SciPy's sequential passes pad).  Specs of
several stencils, and selective blur, share the reference engine's epilogues
(:func:`..reference.filter_compute`, :func:`..reference.filter_vjp`, :func:`..reference.blur_compute`,
:func:`..reference.blur_vjp`: sum, magnitude rescaled as ``hypot``, stacking, the selection and
its blend or masked mean), which run as torch operations on the device; the backward is the
chain of the launches' adjoints, in reverse order.

A dense stencil (of 2 or 3 axes) is the sum over its first axis's taps of its slices, each a
stencil of the other axes run by the engine on the planes that tap reads (folded by the first
axis's mode), added in order; its adjoint sums the slices' adjoints back onto those planes.
"""

from __future__ import annotations

import torch

from ... import _spec
from ..._spec import FilterSpec, Pass, Stencil, axis_mode
from ..._validate import compute_dtype
from .. import reference as _ref
from .._lowering import lower
from . import LAUNCHES, _filter_backward_planes, _filter_forward_planes  # (defined before this import)

__all__ = ["runs", "filter_forward", "filter_backward", "blur_forward", "blur_backward"]


def runs(spec) -> bool:
    """Whether ``spec`` (a lowered filter spec the plane engine cannot map) runs as chains."""
    return isinstance(spec, FilterSpec) and all(_takes(st, spec.ndim) for st in spec.stencils)


def _takes(st, ndim):
    return st.kind == "sep" or ndim >= 2


#: the engine's entry points for specs of any axes (:func:`bind`): a dense stencil's slices run
#: through them
_TOP = {}


def bind(filter_forward, filter_backward):
    """Give this module the engine's adapted entry points (the package calls it once)."""
    _TOP.update(filter_forward=filter_forward, filter_backward=filter_backward)


def _slices(st, mode, ndim):
    """A dense stencil as its slices along its first axis: ``(mode0, lo0, [(t, spec of the other
    axes)])``, all-zero slices left out (their taps are outside the footprint)."""
    m0 = axis_mode(mode, -ndim, ndim)
    rest = tuple(axis_mode(mode, a, ndim) for a in range(-ndim + 1, 0))
    sub_mode = rest[0] if len(set(rest)) == 1 else rest
    out = []
    for t, taps in enumerate(st.taps):
        if any(True for _ in _ref._dense_terms(taps, _spec.dense_shape(taps))):  # (non-zero taps)
            out.append((t, Stencil("dense", lo=tuple(st.lo[1:]), taps=taps), sub_mode))
    return m0, st.lo[0], out


def _dense_apply(x, st, mode, cval, ndim):
    """A dense stencil as the sum over its first axis's taps ``t`` of the other axes' stencil
    (the engine's kernels, a spec of ``ndim - 1`` axes) on the planes ``fold(i + lo + t)``
    (``constant``: a plane of ``cval``); each slice's taps summed in footprint order, the slices
    added in order (within an ulp or two of SciPy's one running sum)."""
    m0, lo, parts = _slices(st, mode, ndim)
    d = x.dim() - ndim
    n = x.shape[d]
    idx = _ref.fold_indices(n, lo, n + len(st.taps) - 1, m0, device=x.device)
    if m0 == "constant":
        x = torch.cat([x, x.new_full(x.shape[:d] + (1,) + x.shape[d + 1:], cval)], d)
    y = None
    for t, sub, sub_mode in parts:
        spec2 = FilterSpec(mode=sub_mode, cval=cval, epilogue="stack", stencils=(sub,), ndim=ndim - 1)
        yt = _TOP["filter_forward"](x.index_select(d, idx[t:t + n]), spec2)
        LAUNCHES["chain"] += 1
        y = yt if y is None else y.add_(yt)
    return y if y is not None else torch.zeros(x.shape[:d] + (n,) + x.shape[d + 1:], dtype=x.dtype, device=x.device)


def _dense_adjoint(g, st, mode, ndim):
    """``A^T g`` of :func:`_dense_apply`: each slice's adjoint (the engine's backward), summed
    back onto the planes it read (``constant``: the ``cval`` plane dropped)."""
    m0, lo, parts = _slices(st, mode, ndim)
    d = g.dim() - ndim
    n = g.shape[d]
    idx = _ref.fold_indices(n, lo, n + len(st.taps) - 1, m0, device=g.device)
    gx = g.new_zeros(g.shape[:d] + (n + 1,) + g.shape[d + 1:])
    for t, sub, sub_mode in parts:
        spec2 = FilterSpec(mode=sub_mode, cval=0.0, epilogue="stack", stencils=(sub,), ndim=ndim - 1)
        gx.index_add_(d, idx[t:t + n], _TOP["filter_backward"](g, g, spec2))
        LAUNCHES["chain_bwd"] += 1
    return gx.narrow(d, 0, n)


def _groups(st: Stencil, mode, ndim: int):
    """The launches of a separable stencil, in its pass order: ``(depth, mode, passes)``, where
    ``depth`` marks a pass along axis -3 (on the ``(..., D, H * W)`` view) and the others are
    one or two passes along -2 / -1 (distinct axes, one mode).  Identity passes are dropped."""
    out = []
    for p in st.passes:
        if p.lo == 0 and p.taps == (1.0,):
            continue  # (x * 1.0 is x, bit for bit)
        m = axis_mode(mode, p.axis, ndim)
        last = out[-1] if out else None
        if (p.axis != -3 and last is not None and not last[0] and last[1] == m and len(last[2]) == 1
                and last[2][0].axis != p.axis):
            last[2].append(p)
        else:
            out.append((p.axis == -3, m, [p]))
    return out


def _spec2(depth, mode, cval, passes):
    """The 2-D spec of one launch (a depth pass becomes a vertical one)."""
    ps = tuple(Pass(-2, p.lo, p.taps) if depth else p for p in passes)
    return FilterSpec(mode=mode, cval=cval, epilogue="stack", stencils=(Stencil("sep", ps),), ndim=2)


def _view(t, depth, copy=True):
    """``t`` (``(..., D, H, W)``) as the planes a launch filters: ``(..., D, H * W)`` for a depth
    pass, else ``t``; where ``H`` and ``W`` do not collapse, a contiguous copy (``copy``: an
    input) or None (an output, which must be written in place)."""
    if not depth:
        return t
    shape = t.shape[:-2] + (t.shape[-2] * t.shape[-1],)
    if copy:
        return t.reshape(shape)
    try:
        return t.view(shape)
    except RuntimeError:
        return None


def _chain(t, st, mode, cval, ndim, out=None):
    """``st`` on ``t`` (compute dtype) by its launches; the last writes ``out`` when given (same
    shape and dtype)."""
    groups = _groups(st, mode, ndim)
    if not groups:
        return t.clone() if out is None else out.copy_(t)
    for i, (depth, m, passes) in enumerate(groups):
        dst = out if i == len(groups) - 1 else None
        dv = None if dst is None else _view(dst, depth, copy=False)
        y = _filter_forward_planes(_view(t, depth), _spec2(depth, m, cval, passes), dv)
        LAUNCHES["chain"] += 1
        if dst is None:
            t = y.view(t.shape)
        elif dv is None:  # (``out`` has no depth view: written through a temporary)
            t = dst.copy_(y.view(t.shape))
        else:
            t = dst
    return t


def _apply(x, st, mode, cval, ndim):
    if st.kind == "dense":
        return _dense_apply(x, st, mode, cval, ndim)
    return _chain(x, st, mode, cval, ndim)


def _adjoint(g, st, mode, ndim):
    """``A^T g``: the launches' adjoints in reverse order (each a plane backward)."""
    if st.kind == "dense":
        return _dense_adjoint(g, st, mode, ndim)
    for depth, m, passes in reversed(_groups(st, mode, ndim)):
        gv = _view(g, depth)
        y = _filter_backward_planes(gv, gv, _spec2(depth, m, 0.0, passes))
        LAUNCHES["chain_bwd"] += 1
        g = y.view(g.shape)
    return g


def _result(y, x, out):
    """``y`` (compute dtype) in ``x``'s dtype, or written into ``out``."""
    if out is None:
        return y if y.dtype == x.dtype else y.to(x.dtype)
    return out.copy_(y)


def filter_forward(x, spec, out=None):
    """``spec`` on ``x`` as chains of plane launches, or None where it does not run here."""
    spec = lower(spec, x.shape)
    if not runs(spec):
        return None
    cd = compute_dtype(x.dtype)
    xs = x.to(cd)
    shape = spec.out_shape(x.shape)
    if x.numel() == 0:
        return x.new_zeros(shape) if out is None else out
    if spec.epilogue == "stack" and len(spec.stencils) == 1 and spec.stencils[0].kind == "sep":
        direct = out if out is not None and out.dtype == cd else None
        y = _chain(xs, spec.stencils[0], spec.mode, spec.cval, spec.ndim, direct)
        if direct is not None:
            return out
    else:
        y = _ref.filter_compute(xs, spec, apply=_apply)
    return _result(y, x, out)


def filter_backward(grad, x, spec, out=None):
    """The gradient of :func:`filter_forward` with respect to ``x``, or None where it does not
    run here."""
    spec = lower(spec, x.shape)
    if not runs(spec):
        return None
    if x.numel() == 0:
        return x.new_zeros(x.shape) if out is None else out
    cd = compute_dtype(x.dtype)
    g = grad.expand(spec.out_shape(x.shape)).to(cd)
    gx = _ref.filter_vjp(g, x.to(cd), spec, apply=_apply, adjoint=_adjoint)
    return _result(gx, x, out)


def blur_forward(x, mask, spec, threshold, out=None):
    """Selective blur of ``spec`` (a separable blur) as chains of plane launches, with the
    reference's selection and blend, or None where it does not run here."""
    spec = lower(spec, x.shape)
    if not _takes(spec.stencil, spec.ndim):
        return None
    if x.numel() == 0:
        return x.new_zeros(x.shape) if out is None else out
    m = _ref._selected(x, mask, threshold)  # (the threshold compared in x's dtype)
    y = _ref.blur_compute(x.to(compute_dtype(x.dtype)), m, spec, threshold, apply=_apply)
    return _result(y, x, out)


def blur_backward(grad, x, mask, spec, threshold, out=None):
    """The gradient of :func:`blur_forward` with respect to ``x``, or None."""
    spec = lower(spec, x.shape)
    if not _takes(spec.stencil, spec.ndim):
        return None
    if x.numel() == 0:
        return x.new_zeros(x.shape) if out is None else out
    cd = compute_dtype(x.dtype)
    m = _ref._selected(x, mask, threshold)
    gx = _ref.blur_vjp(grad.expand(x.shape).to(cd), x.to(cd), m, spec, threshold, apply=_apply, adjoint=_adjoint)
    return _result(gx, x, out)
