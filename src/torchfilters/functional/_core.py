"""What every public op shares: axes, spec strings, the call into the engines.

**Axes.**  The engines act on the *last* ``spec.ndim`` axes of the tensor they get (1 to 3).
:class:`Layout` maps the caller's ``axes`` there without copying:

* when the chosen axes lie within the last three (``(-3, -1)``, ``(-2, -1)``, ``-2`` ...),
  the spec spans the trailing axes from the first chosen one; an unchosen axis inside that
  window is filtered by nothing (no pass, no tap) -- the tensor is passed as it is;
* when two or more axes follow the last chosen one and they merge into one (a view:
  ``correlate1d`` along axis 0 of a contiguous ``(N, C, H, W)``, or along ``D`` of a
  ``(D, H, W)`` volume), they do, and the same window rule applies;
* otherwise (video ``(B, T, C, H, W)`` over ``T, H, W``) the chosen axes are moved behind the
  others, in their order, as a permuted view, and the result is permuted back.

Per-axis arguments follow ``axes`` order (SciPy's rule); stencils list their passes in the
order SciPy applies them.  A result with a component axis (``gradient``) has it just before
the first chosen axis.
"""

from __future__ import annotations

import functools
import math
from numbers import Integral, Real
from typing import NamedTuple

import torch
import torch.autograd.forward_ad as _fwad
from torch import Tensor

from .. import _ops, _spec, kernels
from .._spec import BlurSpec, FilterSpec
from .._validate import (
    canonical_mode,
    check_axes,
    check_cval,
    check_has_values,
    check_input,
    check_modes,
    check_out,
    type_name,
)
from ..backends import check_backend, resolve

Number = "int | float"


# ----------------------------------------------------------------------- axes


class Layout(NamedTuple):
    """Where the caller's ``axes`` land for the engines (see the module docstring)."""

    dim: int  # the input's dimensions
    axes: tuple[int, ...]  # the caller's axes, non-negative, in the caller's order
    ndim: int  # the spec's spatial axes
    perm: tuple[int, ...] | None  # input permutation (None: as it is)
    merge: int = 0  # > 0: the axes from this one on are merged into one (a view)

    @property
    def spec_axes(self) -> tuple[int, ...]:
        """The spec axis (negative) of each of the caller's axes, in the caller's order."""
        if self.merge:
            return tuple(a - self.merge - 1 for a in self.axes)
        if self.perm is None:
            return tuple(a - self.dim for a in self.axes)
        return tuple(self.perm.index(a) - self.dim for a in self.axes)

    def modes(self, modes) -> str | tuple:
        """The spec's ``mode``: the caller's per-axis modes (``axes`` order) on the spec's axes;
        an axis no stencil reads takes the first chosen axis's mode."""
        per = [modes[0]] * self.ndim
        for m, a in zip(modes, self.spec_axes):
            per[a] = m
        return _spec.canonical_modes(per)

    def to_engine(self, x: Tensor) -> Tensor:
        if self.merge:  # a view for the input (checked); a mask that does not merge is copied
            return x.reshape(_merged(x.shape, self.merge))
        return x if self.perm is None else x.permute(self.perm)

    def _k_perm(self):
        """(engine-layout -> caller-layout) permutation of a result with a component axis."""
        k = len(self.axes)
        labels = list(self.perm[:-k]) + ["K"] + list(self.perm[-k:])
        first = min(self.axes)
        want = list(range(first)) + ["K"] + list(range(first, self.dim))
        return [labels.index(w) for w in want], [want.index(lab) for lab in labels]

    def from_engine(self, y: Tensor, components: bool, shape=None) -> Tensor:
        if self.merge:
            return y.view(y.shape[:-1] + tuple(shape[self.merge:]))
        if self.perm is None:
            return y
        if components:
            return y.permute(self._k_perm()[0])
        inv = [0] * self.dim
        for i, p in enumerate(self.perm):
            inv[p] = i
        return y.permute(inv)

    def out_to_engine(self, out: Tensor | None, components: bool) -> Tensor | None:
        if self.merge and out is not None:
            return out.view(_merged(out.shape, self.merge + bool(components)))
        if out is None or self.perm is None:
            return out
        return out.permute(self._k_perm()[1]) if components else out.permute(self.perm)

    def out_shape(self, shape, components: int):
        """The caller's result shape (``components``: the size of the component axis, or 0)."""
        shape = tuple(shape)
        if not components:
            return shape
        first = min(self.axes)
        return shape[:first] + (components,) + shape[first:]


def layout(x: Tensor, axes, default=(-2, -1)) -> Layout:
    """The :class:`Layout` of ``axes`` (validated) on ``x``."""
    dim = x.dim()
    # axes of plain ints: the layouts that strides cannot change are memoised (exact types:
    # ``True`` or ``1.0`` equal 1 as keys, and must still be refused; not while torch.compile
    # traces: it takes a constant's named tuple as opaque)
    if ((axes is None or type(axes) is int or (type(axes) is tuple and all(type(a) is int for a in axes)))
            and not torch.compiler.is_compiling()):
        lay = _static_layout(axes, dim, default)
        if lay is not None:
            return lay
    return _layout(x, axes, dim, default)


@functools.lru_cache(maxsize=1024)
def _static_layout(axes, dim: int, default) -> Layout | None:
    """:func:`layout` where the axes after the last chosen one are too few to merge (its result
    then depends on ``axes`` and ``dim`` alone: memoised, a few microseconds of every call),
    else None."""
    ax = check_axes(axes, dim, default) if axes is not None or dim >= len(default) else None
    if ax is None or dim - max(ax) >= 3:
        return None
    return _layout(None, axes, dim, default)


def _layout(x: Tensor | None, axes, dim: int, default) -> Layout:
    if axes is None and dim < len(default):
        raise ValueError(
            f"input must have at least {len(default)} dimensions (..., H, W) for the default "
            f"axes={tuple(default)}; got shape {tuple(x.shape)} (pass axes= to filter fewer axes)"
        )
    ax = check_axes(axes, dim, default)
    first, last = min(ax), max(ax)
    # two or more unchosen axes after the last chosen one merge into one where they can: the
    # spec then has fewer axes (a pass along D of (D, H, W) is a vertical pass of (D, H*W),
    # which the planar engines run, instead of a pass of three axes)
    merges = dim - last >= 3 and _mergeable(x, last + 1)
    if dim - first <= 3 and not merges:
        return Layout(dim, ax, dim - first, None)
    if last + 2 - first <= 3 and (merges or _mergeable(x, last + 1)):
        return Layout(dim, ax, last + 2 - first, None, last + 1)
    chosen = sorted(ax)
    perm = tuple(a for a in range(dim) if a not in chosen) + tuple(chosen)
    return Layout(dim, ax, len(ax), perm)


def _merged(shape, start: int) -> tuple:
    """``shape`` with the axes ``start..`` as one (their product: ``-1`` cannot tell the size
    of an empty tensor's merged axis)."""
    return tuple(shape[:start]) + (math.prod(shape[start:]),)


def _mergeable(x: Tensor, start: int) -> bool:
    """Do the axes ``start..`` of ``x`` merge into one axis without a copy (``view``)?  (Axes
    of length 1 take no part: their neighbours must merge across them.)"""
    dims = [(n, s) for n, s in zip(x.shape[start:], x.stride()[start:]) if n != 1]
    return all(s == dims[i + 1][1] * dims[i + 1][0] for i, (_, s) in enumerate(dims[:-1]))


# --------------------------------------------------------------------- engines


def _eager_engine(x: Tensor, backend: str):
    """The engine to call directly, or None when the call must go through the custom op.

    A ``torch.library`` custom op costs ~7 us per call on top of the kernel
    (about 5x a small ``torch.add``).  When nothing needs the dispatcher --
    no autograd graph to record, no ``torch.compile`` or ``torch.jit.trace`` tracing, no tensor
    subclass or dispatch mode (FakeTensor, functorch) -- the eager call goes
    straight to the same engine the op's device kernel would run.
    """
    if (
        (x.requires_grad and torch.is_grad_enabled())
        or _fwad._current_level >= 0
        or torch.compiler.is_compiling()
        or torch._C._is_tracing()  # (torch.jit.trace: records the custom op)
        or type(x) is not Tensor
        or torch._C._len_torch_dispatch_stack() > 0
        or torch._C._functorch.is_functorch_wrapped_tensor(x)
    ):
        return None
    return resolve(backend, x.device, x.dtype)


@_spec.cached
def _filter_text(mode, cval: float, epilogue: str, recipes: tuple, cval_negative: bool = False,
                 ndim: int = 2) -> str:
    """The spec string of a filter; a constant for ``torch.compile`` (no float tracing)."""
    return _spec.encode(FilterSpec(mode, cval, epilogue, tuple(_stencil(r) for r in recipes), ndim))


@_spec.cached
def _run_text(lay: tuple, modes, cval: float, epilogue: str, recipes: tuple, cval_negative: bool) -> str:
    """:func:`_filter_text` of a call laid out by ``Layout(*lay)`` (memoised as a whole: the
    per-axis modes on the spec's axes are not worked out again on every call; a plain tuple:
    ``torch.compile`` takes no named tuple as a constant's argument)."""
    lay = Layout(*lay)
    return _filter_text(lay.modes(modes), cval, epilogue, recipes, cval_negative, lay.ndim)


@_spec.cached
def _blur_run_text(lay: tuple, modes, cval, normalized, keep_border, recipe, cval_negative) -> str:
    """:func:`_blur_text` of a call laid out by ``Layout(*lay)`` (as :func:`_run_text`)."""
    lay = Layout(*lay)
    return _blur_text(lay.modes(modes), cval, normalized, keep_border, recipe, cval_negative, lay.ndim)


@_spec.cached
def _blur_text(mode, cval, normalized, keep_border, recipe, cval_negative=False, ndim: int = 2) -> str:
    return _spec.encode(BlurSpec(mode, cval, normalized, keep_border, _stencil(recipe), ndim))


def _signbit(v: float) -> bool:
    # -0.0 == 0.0 and both hash alike: the cache keys carry the sign (SciPy keeps it)
    return math.copysign(1.0, v) < 0


_BINOMIAL = (0.25, 0.5, 0.25)


def _stencil(recipe: tuple):
    """Build a stencil from a hashable recipe: ``(kind, *params)``."""
    kind = recipe[0]
    if kind == "deriv":  # (operator, axis, normalized[, smoothed axes]): 2-D by default
        return derivative_stencil(*recipe[1:])
    if kind == "gauss":  # (sigmas, orders, radii[, axes]): axes (-2, -1) by default
        return gaussian_stencil(*recipe[1:])
    if kind == "gauss_scaled":  # (sigmas, radii, axes, scale): a Gaussian times scale (last pass)
        return scaled_gaussian_stencil(*recipe[1:])
    if kind == "dense":
        return _spec.dense(*recipe[1:])
    if kind == "sep1":  # (axis, lo, taps[, _spec.neg_zeros(taps)]: -0.0 == 0.0 as a memo key)
        return _spec.sep(recipe[1:4])
    if kind == "sep":  # ((axis, lo, taps), ...)[, signs]
        return _spec.sep(*recipe[1])
    if kind == "binomial":  # [(axes)]: the 3-tap binomial along each
        axes = recipe[1] if len(recipe) > 1 else (-2, -1)
        return _spec.sep(*((a, -1, _BINOMIAL) for a in axes))
    raise AssertionError(recipe)


def derivative_stencil(operator: str, axis: int, normalized: bool, others=None):
    """``[-1, 0, 1]`` along ``axis``, then the operator's smoothing along each of ``others``
    (default: the other of axes -2/-1), in that order (SciPy's ``sobel``)."""
    deriv, smooth = kernels.derivative_weights(operator)
    if others is None:
        others = (-1 - (axis + 2),)
    passes = [[axis, -(len(deriv) // 2), deriv]]
    if smooth != (1.0,):  # a 1-tap unit pass is the identity in every mode
        passes += [[a, -(len(smooth) // 2), smooth] for a in others]
    if normalized:
        # divide the *result*: scale the last pass, so that in constant mode the
        # cval padding of the intermediate is divided too (normalized == plain / div)
        div = sum(abs(d) for d in deriv) * sum(smooth) ** len(others)
        passes[-1][2] = tuple(w / div for w in passes[-1][2])
    return _spec.sep(*passes)


def scaled_gaussian_stencil(sigmas, radii, axes, scale: float):
    """A Gaussian over ``axes`` times ``scale``: the last pass scaled, so that ``constant`` mode's
    ``cval`` padding of the earlier passes is scaled too; every sigma 0: ``scale`` times the
    identity."""
    st = gaussian_stencil(sigmas, (0,) * len(sigmas), radii, axes)
    passes = [(p.axis, p.lo, p.taps) for p in st.passes]
    if not passes:
        return _spec.sep((axes[0], 0, (scale,)))
    a, lo, taps = passes[-1]
    passes[-1] = (a, lo, tuple(scale * t for t in taps))
    return _spec.sep(*passes)


def gaussian_stencil(sigmas, orders, radii, axes=(-2, -1)):
    passes = []
    taps = {}  # equal axes alike: one kernel (radius=2**20: 2M taps each)
    for axis, s, o, r in zip(axes, sigmas, orders, radii):
        if s > 1e-15:  # SciPy skips axes with sigma ~ 0
            if (s, o, r) not in taps:
                taps[s, o, r] = kernels.gaussian_kernel1d(s, o, r)
            passes.append((axis, -r, taps[s, o, r]))
    return _spec.sep(*passes)


def refuse_forward_ad(x: Tensor) -> None:
    """Forward-mode AD has no rule here: fail loudly instead of returning a zero tangent."""
    dual = _fwad._current_level >= 0 and _fwad.unpack_dual(x).tangent is not None
    if not dual and torch._C._functorch.is_functorch_wrapped_tensor(x):
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        dual = any(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())
    if dual:
        raise NotImplementedError(
            "torchfilters ops support reverse-mode autograd (Tensor.backward, torch.autograd.grad) "
            "but not forward-mode AD (forward_ad dual tensors, torch.func.jvp/jacfwd)"
        )


def run(x: Tensor, lay: Layout, modes, cval: float, epilogue: str, recipes: tuple, out, backend) -> Tensor:
    """Run the filter that ``recipes`` (on spec axes) + ``epilogue`` describe on ``x`` laid out
    by ``lay`` (the spec text is built once, cached); ``out`` in the caller's layout."""
    components = len(recipes) if epilogue == "stack" and len(recipes) > 1 else 0
    if out is not None:
        check_out(out, lay.out_shape(x.shape, components), x.dtype, x.device)
    text = _run_text(tuple(lay), modes, cval, epilogue, recipes, _signbit(cval))
    eng_out = None
    if out is not None:
        if lay.merge and not _mergeable(out, lay.merge + bool(components)):
            with torch.no_grad():  # an out= that does not merge: through a temporary
                out.copy_(run(x, lay, modes, cval, epilogue, recipes, None, backend))
            return out
        eng_out = lay.out_to_engine(out, bool(components))
    y = run_filter(lay.to_engine(x), text, eng_out, backend)
    return out if out is not None else lay.from_engine(y, bool(components), x.shape)


def run_filter(x: Tensor, text: str, out: Tensor | None, backend) -> Tensor:
    backend = check_backend(backend)
    spec = _spec.decode(text)
    if out is not None:
        check_out(out, spec.out_shape(x.shape), x.dtype, x.device)
        no_grad_out(x)
    eng = _eager_engine(x, backend)
    if eng is not None:
        if out is None:
            return eng.filter_forward(x, spec)
        _ops._write(out, (x,), lambda o: eng.filter_forward(x, spec, out=o))
        return out
    if not torch.compiler.is_compiling():
        refuse_forward_ad(x)
    if out is None:
        return _ops.filter_op(x, text, backend)
    _ops.filter_out_op(x, text, backend, out)
    return out


def copy_result(x: Tensor, out, backend) -> Tensor:
    """A filter that filters no axis (every sigma 0, every size 1): a copy, as SciPy returns."""
    check_backend(backend)
    if out is None:
        return x.clone(memory_format=torch.contiguous_format)
    check_out(out, x.shape, x.dtype, x.device)
    no_grad_out(x)
    _ops._write(out, (x,), lambda o: x.clone() if o is None else o.copy_(x))
    return out


def no_grad_out(*tensors):
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(
            "out= does not support automatic differentiation: the input requires grad; "
            "call without out= (or under torch.no_grad())"
        )


# ------------------------------------------------------------------ arguments


def prep(input, mode, cval, axes, default=(-2, -1)):
    """``(x, layout, modes, cval)``: the checked input, its :class:`Layout`, one canonical mode
    per chosen axis (``axes`` order) and ``cval``."""
    x = check_input(input)
    if isinstance(mode, str):
        canonical_mode(mode)  # an unknown mode before a shape error, as before axes existed
    lay = layout(x, axes, default)
    return x, lay, check_modes(mode, len(lay.axes)), check_cval(cval)


def _nested_floats(obj, depth: int, name: str):
    """Nested sequences -> nested tuples of floats, ``depth`` levels deep (plain Python,
    so ``torch.compile`` traces it as constants)."""
    if depth == 0:
        if hasattr(obj, "__len__") and not isinstance(obj, (str, bytes)):
            raise ValueError(f"{name} has more dimensions than expected")
        if isinstance(obj, bool) or not isinstance(obj, Real):
            raise TypeError(f"{name} must hold real numbers; got {type_name(obj)}")
        return float(obj)
    if isinstance(obj, (str, bytes)) or not hasattr(obj, "__len__"):
        raise ValueError(f"{name} must be {depth}-D more than it is; got {type_name(obj)}")
    return tuple(_nested_floats(o, depth - 1, name) for o in obj)


#: what a kernel's number of dimensions is: one per filtered axis
_AXES_HINT = " (one dimension per filtered axis: axes= chooses them)"


def _flat(t):
    """The numbers of nested tuples (weights, footprints), in order."""
    if isinstance(t, tuple):
        for v in t:
            yield from _flat(v)
    else:
        yield t


def weights_tuple(weights, ndim: int, name: str = "weights"):
    """Validate filter weights; return nested tuples of floats (``ndim`` levels)."""
    if isinstance(weights, Tensor):
        check_has_values(weights, name)  # before anything reads its values
        if weights.requires_grad:
            raise ValueError(
                f"{name} requires grad, but torchfilters treats filter weights as constants "
                f"(gradients flow to the input only); pass {name}.detach()"
            )
        if weights.dtype == torch.bool or weights.dtype.is_complex:
            raise TypeError(f"{name} must be real; got dtype {weights.dtype}")
        if weights.dim() != ndim:
            raise ValueError(f"{name} must be {ndim}-D{_AXES_HINT}; got shape {tuple(weights.shape)}")
        weights = weights.detach().to("cpu", torch.float64).tolist()
    elif hasattr(weights, "__array__") and not isinstance(weights, (list, tuple)):
        weights = weights.__array__().tolist()  # NumPy arrays and friends
    if isinstance(weights, Real) and not isinstance(weights, bool):
        raise ValueError(f"{name} must be {ndim}-D; got the scalar {weights!r}")
    if not isinstance(weights, (list, tuple)):
        raise TypeError(f"{name} must be a tensor or a nested sequence of numbers; got {type_name(weights)}")
    try:
        w = _nested_floats(weights, ndim, name)
    except ValueError:
        raise ValueError(f"{name} must be {ndim}-D{_AXES_HINT}; got {weights!r:.80}") from None

    def check(t, depth):
        if len(t) == 0:
            raise ValueError(f"{name} must not be empty")
        if depth > 1:
            for r in t:
                check(r, depth - 1)
            if any(_spec.dense_shape(r) != _spec.dense_shape(t[0]) for r in t):
                raise ValueError(f"{name} must be rectangular; got {weights!r:.80}")

    check(w, ndim)
    return w


def dense_recipe(w, lay: Layout, origins=None):
    """The recipe of a dense kernel ``w`` over the chosen axes (its dims in increasing axis
    order, SciPy's rule; ``origins`` likewise, default 0) as a kernel over every spatial axis
    of the spec (length-1 dims on the unchosen ones)."""
    shape = _spec.dense_shape(w)
    chosen = sorted(lay.spec_axes)
    origins = origins or [0] * len(shape)
    lo = [0] * lay.ndim
    for a, n, o in zip(chosen, shape, origins):
        lo[a] = _spec.centered_lo(n, o)

    def expand(t, rest):
        if not rest:
            return t
        if rest[0] in chosen:
            return tuple(expand(r, rest[1:]) for r in t)
        return (expand(t, rest[1:]),)

    return ("dense", expand(w, list(range(-lay.ndim, 0))), tuple(lo))


def check_origin(origin, k: int, name: str = "origin") -> int:
    if isinstance(origin, bool) or not isinstance(origin, Integral):
        raise TypeError(f"{name} must be an int; got {type_name(origin)}")
    origin = int(origin)
    if origin < -(k // 2) or origin > (k - 1) // 2:
        raise ValueError(
            f"invalid {name}={origin} for a kernel of size {k}: it must satisfy "
            f"-(size // 2) <= {name} <= (size - 1) // 2, i.e. {-(k // 2)} .. {(k - 1) // 2}"
        )
    return origin
