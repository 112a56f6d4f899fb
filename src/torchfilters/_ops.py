"""``torch.library`` custom ops: the single entry point from Python into the engines.

These ops carry every public function (specs are strings; see ``_spec``):

* ``torchfilters::filter(x, spec, backend) -> y`` and its backward
  ``torchfilters::filter_backward(grad, x, spec, backend) -> grad_x``;
* ``torchfilters::selective_blur(x, mask?, spec, threshold, backend) -> y``
  and ``torchfilters::selective_blur_backward(...)``;

* ``torchfilters::rank_filter(x, spec, backend) -> y`` and its backward
  ``torchfilters::rank_filter_backward(grad, x, y, spec, backend) -> grad_x`` (the forward's
  result ``y`` tells the backward which window element each output selected);

plus ``*_out`` variants that write into a caller's tensor (``out=``).  Each op
has a fake (meta) implementation, and the forward ops have autograd
registrations, so ``torch.compile(fullgraph=True)`` traces through them
forward and backward.  The device kernel runs the engine that
:func:`torchfilters.backends.resolve` picks for the tensor's device and
dtype (numba on CPU, Triton on CUDA, the pure-torch reference otherwise).
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from . import _spec
from .backends import resolve
from .backends._layout import extent

_LIB = "torchfilters"


def _engine(backend: str, x: Tensor):
    return resolve(backend, x.device, x.dtype)


def _span(t: Tensor):
    """Bytes ``[first, last)`` that ``t``'s elements occupy (torch strides are never negative)."""
    first = t.data_ptr()
    return first, first + extent(t.shape, t.stride()) * t.element_size()


def _may_alias(a: Tensor, b: Tensor) -> bool:
    """Do ``a`` and ``b`` share memory?  Also across storages (two ``torch.from_numpy`` views
    of one array, ``torch.frombuffer``): their byte ranges on one device overlap."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
        return True
    if a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _write(out: Tensor, inputs, compute):
    """Run ``compute(out)``; through a temporary when ``out`` shares memory with an input."""
    if any(t is not None and _may_alias(out, t) for t in inputs):
        out.copy_(compute(None))
    else:
        compute(out)


def _own(t: Tensor) -> Tensor:
    """``t``, or where it is a view (of an engine's buffer: a reshaped or permuted result, a cached
    output buffer) a tensor on the same storage that is none: autograd forbids in-place changes
    to a custom op's output that is a view, which a user's ``y.clamp_()`` makes (found by
    review).  No copy; the storage keeps the engine's buffer alive."""
    if not t._is_view():
        return t
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


# --------------------------------------------------------------------- filter


@torch.library.custom_op(f"{_LIB}::filter", mutates_args=())
def filter_op(x: Tensor, spec: str, backend: str) -> Tensor:
    return _own(_engine(backend, x).filter_forward(x, _spec.decode(spec)))


@filter_op.register_fake
def _(x, spec, backend):
    return x.new_empty(_spec.decode(spec).out_shape(x.shape))


@torch.library.custom_op(f"{_LIB}::filter_backward", mutates_args=())
def filter_backward_op(grad: Tensor, x: Tensor, spec: str, backend: str) -> Tensor:
    return _engine(backend, x).filter_backward(grad, x, _spec.decode(spec))


@filter_backward_op.register_fake
def _(grad, x, spec, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::filter_out", mutates_args=("out",))
def filter_out_op(x: Tensor, spec: str, backend: str, out: Tensor) -> None:
    eng = _engine(backend, x)
    s = _spec.decode(spec)
    _write(out, (x,), lambda o: eng.filter_forward(x, s, out=o))


@filter_out_op.register_fake
def _(x, spec, backend, out):
    return None


def _filter_setup(ctx, inputs, output):
    x, spec, backend = inputs
    ctx.save_for_backward(x)
    ctx.spec = spec
    ctx.backend = backend


def _filter_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return filter_backward_op(grad, x, ctx.spec, ctx.backend), None, None


filter_op.register_autograd(_filter_grad, setup_context=_filter_setup)


def _double_backward(vjp, ctx, ggx, *extra):
    """Second-order gradients: autograd through the reference engine's explicit VJP.

    Runs at the autograd level (not below it), so plain torch autograd works;
    double backward is rare (gradient penalties), and exactness matters more
    than speed there.
    """
    from .backends.reference import compute_dtype

    grad, x = ctx.saved_tensors[:2]
    cd = compute_dtype(x.dtype)
    with torch.enable_grad():
        g_ = grad.detach().to(cd).requires_grad_(True)
        x_ = x.detach().to(cd).requires_grad_(True)
        gx = vjp(g_, x_, *extra)
        dg, dx = torch.autograd.grad(gx, (g_, x_), ggx.to(cd), allow_unused=True)
    dg = torch.zeros_like(grad) if dg is None else dg.to(grad.dtype)
    dx = torch.zeros_like(x) if dx is None else dx.to(x.dtype)
    return dg, dx


def _filter_bwd_setup(ctx, inputs, output):
    grad, x, spec, backend = inputs
    ctx.save_for_backward(grad, x)
    ctx.spec = spec


def _filter_bwd_grad(ctx, ggx):
    from .backends.reference import filter_vjp

    dg, dx = _double_backward(filter_vjp, ctx, ggx, _spec.decode(ctx.spec))
    return dg, dx, None, None


filter_backward_op.register_autograd(_filter_bwd_grad, setup_context=_filter_bwd_setup)


# --------------------------------------------------------------- rank filters


@torch.library.custom_op(f"{_LIB}::rank_filter", mutates_args=())
def rank_op(x: Tensor, spec: str, backend: str) -> Tensor:
    return _own(_engine(backend, x).rank_forward(x, _spec.decode(spec)))


@rank_op.register_fake
def _(x, spec, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::rank_filter_backward", mutates_args=())
def rank_backward_op(grad: Tensor, x: Tensor, y: Tensor, spec: str, backend: str) -> Tensor:
    return _engine(backend, x).rank_backward(grad, x, y, _spec.decode(spec))


@rank_backward_op.register_fake
def _(grad, x, y, spec, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::rank_filter_out", mutates_args=("out",))
def rank_out_op(x: Tensor, spec: str, backend: str, out: Tensor) -> None:
    eng = _engine(backend, x)
    s = _spec.decode(spec)
    _write(out, (x,), lambda o: eng.rank_forward(x, s, out=o))


@rank_out_op.register_fake
def _(x, spec, backend, out):
    return None


def _rank_setup(ctx, inputs, output):
    x, spec, backend = inputs
    ctx.save_for_backward(x, output)
    ctx.spec = spec
    ctx.backend = backend


def _rank_grad(ctx, grad):
    x, y = ctx.saved_tensors
    return rank_backward_op(grad, x, y, ctx.spec, ctx.backend), None, None


rank_op.register_autograd(_rank_grad, setup_context=_rank_setup)


def _rank_bwd_setup(ctx, inputs, output):
    grad, x, y, spec, backend = inputs
    ctx.save_for_backward(grad, x)
    ctx.spec = spec


def _rank_bwd_grad(ctx, ggx):
    from .backends.reference import rank_vjp

    dg, dx = _double_backward(rank_vjp, ctx, ggx, _spec.decode(ctx.spec))
    return dg, dx, None, None, None


rank_backward_op.register_autograd(_rank_bwd_grad, setup_context=_rank_bwd_setup)


# ------------------------------------------------------------- selective blur


@torch.library.custom_op(f"{_LIB}::selective_blur", mutates_args=())
def blur_op(x: Tensor, mask: Tensor | None, spec: str, threshold: float, backend: str) -> Tensor:
    return _own(_engine(backend, x).blur_forward(x, mask, _spec.decode(spec), threshold))


@blur_op.register_fake
def _(x, mask, spec, threshold, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::selective_blur_backward", mutates_args=())
def blur_backward_op(
    grad: Tensor, x: Tensor, mask: Tensor | None, spec: str, threshold: float, backend: str
) -> Tensor:
    return _engine(backend, x).blur_backward(grad, x, mask, _spec.decode(spec), threshold)


@blur_backward_op.register_fake
def _(grad, x, mask, spec, threshold, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op(f"{_LIB}::selective_blur_out", mutates_args=("out",))
def blur_out_op(
    x: Tensor, mask: Tensor | None, spec: str, threshold: float, backend: str, out: Tensor
) -> None:
    eng = _engine(backend, x)
    s = _spec.decode(spec)
    _write(out, (x, mask), lambda o: eng.blur_forward(x, mask, s, threshold, out=o))


@blur_out_op.register_fake
def _(x, mask, spec, threshold, backend, out):
    return None


def _blur_setup(ctx, inputs, output):
    x, mask, spec, threshold, backend = inputs
    ctx.save_for_backward(x, mask)
    ctx.args = (spec, threshold, backend)


def _blur_grad(ctx, grad):
    x, mask = ctx.saved_tensors
    return blur_backward_op(grad, x, mask, *ctx.args), None, None, None, None


blur_op.register_autograd(_blur_grad, setup_context=_blur_setup)


def _blur_bwd_setup(ctx, inputs, output):
    grad, x, mask, spec, threshold, backend = inputs
    ctx.save_for_backward(grad, x, mask)
    ctx.args = (spec, threshold)


def _blur_bwd_grad(ctx, ggx):
    from .backends.reference import blur_vjp

    spec, threshold = ctx.args
    mask = ctx.saved_tensors[2]
    dg, dx = _double_backward(blur_vjp, ctx, ggx, mask, _spec.decode(spec), threshold)
    return dg, dx, None, None, None, None


blur_backward_op.register_autograd(_blur_bwd_grad, setup_context=_blur_bwd_setup)


# -------------------------------------------------------------- no torch._dynamo at first call

_DYNAMO_CACHE = "__dynamo_disable"


def defer_dynamo(*ops) -> None:
    """Let the kernels of custom ``ops`` run without importing ``torch._dynamo``.

    ``torch.library.custom_op`` wraps each op's kernel in ``torch._disable_dynamo``, which imports
    ``torch._dynamo`` on the kernel's first call: 1-2 s that every process's first filter call
    paid.  That wrapper caches the disabled kernel in the kernel's ``__dynamo_disable``
    attribute; this puts a stand-in there that calls the kernel directly while
    ``torch._dynamo`` is not imported (nothing can be tracing it then) and, once it is,
    removes itself so that torch's wrapper builds its own.  Where torch's internals differ,
    the stand-in is never read and torch's behaviour is unchanged."""
    for op in ops:
        for wrapper in list(getattr(op, "_backend_fns", {}).values()):
            kernel = getattr(wrapper, "__wrapped__", None)
            if kernel is not None and getattr(kernel, _DYNAMO_CACHE, None) is None:
                setattr(kernel, _DYNAMO_CACHE, _direct(kernel, wrapper))


def _direct(kernel, wrapper):
    def direct(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return kernel(*args, **kwargs)
        if getattr(kernel, _DYNAMO_CACHE, None) is direct:
            try:
                delattr(kernel, _DYNAMO_CACHE)
            except AttributeError:  # pragma: no cover - another thread removed it first
                pass
        return wrapper(*args, **kwargs)

    return direct


defer_dynamo(filter_op, filter_backward_op, filter_out_op, rank_op, rank_backward_op, rank_out_op, blur_op,
             blur_backward_op, blur_out_op)
