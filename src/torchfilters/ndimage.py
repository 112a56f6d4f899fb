"""A drop-in for ``scipy.ndimage``'s filters on NumPy arrays, computed by torchfilters' engines.

``import torchfilters.ndimage as ndimage`` in place of ``from scipy import ndimage``: the same
function names, positional order and keywords (``output=``, ``mode=``, ``cval=``, ``origin=``,
``axes=``, ``truncate=``, ``radius=``), the same results and the same exception types, for
the filters torchfilters implements (:data:`__all__`).

**SciPy's dtype rules, not the torch API's.**  The result has the input's dtype unless
``output=`` names one (a dtype, or an array to fill); integer results are cast as SciPy casts
them (truncated toward zero), and filters that SciPy runs as a sequence of 1-D passes store
every intermediate in the output dtype as SciPy does (an integer Gaussian rounds after each
axis).  float16 raises ``RuntimeError`` as in SciPy; complex input or weights work for the
linear filters (real and imaginary parts).  The torch functions (``torchfilters.gaussian_filter``
...) differ on purpose: they promote integers to float32 and never wrap around, and filter
the last two axes by default where these filter every axis, as SciPy does.

**How it runs.**  Arrays go to torch without a copy where their layout allows
(``torch.from_numpy``); a float32 result stays float32 and comes back without a copy.
Multi-pass filters of float results over at most three axes run as one fused call; integer
results, and more than three axes, run SciPy's sequence of passes, each a fused 1-D call.
Every value is computed in float64, except float32 in and out (float32 arithmetic, as the
torch API does: equal to SciPy's float64-then-round to a few float32 ulps).

**GPU arrays.**  An array of another library that dispatches NumPy's API and exports DLPack --
a CuPy array -- stays in its library and on its device: it crosses to torch by DLPack without a
copy, the filter runs on the tensor's device (a CUDA tensor on the Triton engine), and the result
is an array of the input's library (:mod:`torchfilters._arrays`).  ``output=`` may be one such
array; weights and footprints are copied to the host, as SciPy reads them.

**Compiling.**  Every call here runs the fused engine, from the first call of a process on: a
kernel that is not compiled or loaded yet is compiled (or loaded) in the call, as under
``TORCHFILTERS_COMPILE=wait``, never replaced by the reference engine meanwhile as the torch API's
``auto`` calls are -- so results are SciPy's from the first call, and ``torchfilters.dask`` gives
the same bits on every chunk.

Rank filters (``median_filter``, ``rank_filter``, ...) are exact selections for every dtype SciPy
takes (64-bit integers beyond 2**53 are filtered as their ranks).  Where a window holds NaN,
SciPy's result depends on which of its algorithms runs; these follow ``numpy.sort``'s order (NaN
last), as the torch functions do.

Known differences (each tested against an independent oracle): ``uniform_filter`` sums each
window afresh where SciPy keeps a running sum, so a NaN or inf spreads over its window only
(SciPy's spreads to the end of the line) and rounding differs in the last bits.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import warnings

import numpy as np
import torch

from . import _arrays, _docs, _spec
from . import functional as F
from . import kernels
from ._ndimage_args import (
    _SUPPORTED,
    _check_axes,
    _check_mode,
    _check_origin_type,
    _expand_origins,
    _expand_window,
    _get_output,
    _input,
    _invalid_origin,
    _normalize_axis,
    _normalize_sequence,
    _pass_origin,
    _real_cval,
)
from ._validate import canonical_mode
from .backends import waiting

__all__ = [
    "correlate",
    "convolve",
    "correlate1d",
    "convolve1d",
    "sobel",
    "prewitt",
    "laplace",
    "generic_laplace",
    "generic_gradient_magnitude",
    "gaussian_filter",
    "gaussian_filter1d",
    "gaussian_gradient_magnitude",
    "gaussian_laplace",
    "uniform_filter",
    "uniform_filter1d",
    "rank_filter",
    "median_filter",
    "percentile_filter",
    "minimum_filter",
    "maximum_filter",
    "minimum_filter1d",
    "maximum_filter1d",
]



# ----------------------------------------------------------------- the bridge to torch


def _fast32(a, out):
    return a.dtype == np.float32 and out.dtype == np.float32


def _tensor(a, fast32: bool) -> torch.Tensor:
    """``a`` as a torch tensor in the compute dtype (float32 when ``fast32``, else float64) on
    ``a``'s device, without a copy where the layout and dtype allow."""
    return _arrays.to_torch(a, np.float32 if fast32 else np.float64)


def _store(out, v):
    """Write the array ``v`` into ``out`` with SciPy's cast (C's: toward zero; a bool output is
    the truncated value's truth, so 0.9 is False)."""
    if out.dtype == np.bool_:
        v = np.trunc(v) != 0
    elif out.dtype == np.uint32 and v.dtype.kind == "f":
        # SciPy's C cast to uint32 goes through a 64-bit integer on x86-64 (its values wrap
        # modulo 2**32: a multi-pass filter's negative intermediate, then its sum); NumPy's
        # gives 0 past 2**32 (found by review: sobel of uint32 gave 0 where SciPy gives 17)
        with np.errstate(invalid="ignore"):
            v = np.trunc(v).astype(np.int64).astype(np.uint32)
    np.copyto(out, v, casting="unsafe")
    return out


def _fresh(output) -> bool:
    """The caller asked for a new array (no ``output``, or a dtype): the engine's result can be
    returned as it is when its dtype is the one wanted (no copy)."""
    return output is None or isinstance(output, (type, np.dtype, str))


def _run(out, fn, a, fast32, fresh=False):
    y = fn(_tensor(a, fast32))
    v = _arrays.from_torch(y, out)
    if fresh and v.dtype == out.dtype and y.is_contiguous():
        return v  # the zero-filled ``out`` was never touched: nothing to copy
    return _store(out, v)


def _complex_via_real_components(func, input, weights, output, cval, **kwargs):
    """Complex filtering as real filterings of the real and imaginary parts (SciPy's rule)."""
    complex_input = input.dtype.kind == "c"
    complex_weights = weights.dtype.kind == "c"
    if complex_input and complex_weights:
        func(input.real, weights.real, output=output.real, cval=np.real(cval), **kwargs)
        output.real -= func(input.imag, weights.imag, output=None, cval=np.imag(cval), **kwargs)
        func(input.real, weights.imag, output=output.imag, cval=np.real(cval), **kwargs)
        output.imag += func(input.imag, weights.real, output=None, cval=np.imag(cval), **kwargs)
    elif complex_input:
        func(input.real, weights, output=output.real, cval=np.real(cval), **kwargs)
        func(input.imag, weights, output=output.imag, cval=np.imag(cval), **kwargs)
    else:
        if np.iscomplexobj(cval):
            raise ValueError("Cannot provide a complex-valued cval when the input is real.")
        func(input, weights.real, output=output.real, cval=cval, **kwargs)
        func(input, weights.imag, output=output.imag, cval=cval, **kwargs)
    return output


# ----------------------------------------------------------------- correlation


def correlate1d(input, weights, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """``scipy.ndimage.correlate1d``: one-dimensional correlation along ``axis``."""
    input = _input(input)
    weights = _arrays.host(weights)
    if input.dtype.kind == "c" or weights.dtype.kind == "c":
        if weights.dtype.kind == "c":
            weights = weights.conj().astype(np.complex128, copy=False)
        output = _get_output(output, input, complex_output=True)
        return _complex_via_real_components(correlate1d, input, weights, output, cval, axis=axis, mode=mode,
                                            origin=origin)
    fresh = _fresh(output)
    output = _get_output(output, input)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1 or weights.shape[0] < 1:
        raise RuntimeError("no filter weights given")
    axis = _normalize_axis(axis, input.ndim)
    _check_origin_type(origin, bool_ok=True)
    if _invalid_origin(origin, len(weights)):
        raise ValueError("Invalid origin; origin must satisfy -(len(weights) // 2) <= origin <= "
                         "(len(weights)-1) // 2")
    mode = _check_mode(mode)
    cval = _real_cval(cval)
    if input.size == 0:
        return output
    w = weights.tolist()
    return _run(output, lambda t: F.correlate1d(t, w, axis, mode=mode, cval=cval, origin=int(origin)), input,
                _fast32(input, output), fresh)


def convolve1d(input, weights, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """``scipy.ndimage.convolve1d``: one-dimensional convolution along ``axis``."""
    weights = _arrays.host(weights)
    weights = weights[::-1]
    origin = -origin
    if not weights.shape[0] & 1:
        origin -= 1
    if weights.dtype.kind == "c":
        weights = weights.conj()  # correlate1d conjugates complex weights back
    return correlate1d(input, weights, axis, output, mode, cval, origin)


def _correlate_or_convolve(input, weights, output, mode, cval, origin, convolution, axes):
    input = _input(input)
    weights = _arrays.host(weights)
    if input.dtype.kind == "c" or weights.dtype.kind == "c":
        if weights.dtype.kind == "c" and not convolution:
            weights = weights.conj()  # as np.correlate: conjugate the weights
        output = _get_output(output, input, complex_output=True)
        return _complex_via_real_components(
            lambda i, w, output=None, cval=0.0, **kw: _correlate_or_convolve(i, w, output, cval=cval, **kw),
            input, weights, output, cval, mode=mode, origin=origin, convolution=convolution, axes=axes)
    given = axes is not None
    axes = _check_axes(axes, input.ndim)
    weights = _expand_window(np.asarray(weights, dtype=np.float64), input.ndim, axes, "weights", given)
    origins = _expand_origins(origin, input.ndim, axes)
    wshape = [n for n in weights.shape if n > 0]
    if len(wshape) != input.ndim:
        raise RuntimeError("filter weights array has incorrect shape.")
    if convolution:
        weights = weights[tuple([slice(None, None, -1)] * weights.ndim)]
        origins = [-o - (0 if weights.shape[i] & 1 else 1) for i, o in enumerate(origins)]
    for o, n in zip(origins, wshape):
        if _invalid_origin(o, n):
            raise ValueError("Invalid origin; origin must satisfy -(weights.shape[k] // 2) <= origin[k] <= "
                             "(weights.shape[k]-1) // 2")
    fresh = _fresh(output)
    output = _get_output(output, input)
    mode = _check_mode(mode)
    cval = _real_cval(cval)
    if input.size == 0:
        return output
    if input.ndim == 0:  # (SciPy's: no axis to extend, the one product)
        return _store(output, np.asarray(input, np.float64) * weights[()])
    # axes the kernel does not reach along (one tap at offset 0) are batch axes
    keep = [i for i in range(input.ndim) if weights.shape[i] != 1 or origins[i] != 0]
    if not keep:
        keep = [input.ndim - 1]
    if len(keep) > 3:
        raise NotImplementedError(
            f"torchfilters.ndimage.correlate filters up to 3 axes; these weights reach along {len(keep)}")
    w = weights.reshape([weights.shape[i] for i in keep]).tolist()
    org = [int(origins[i]) for i in keep]
    return _run(output, lambda t: F.correlate(t, w, mode=mode, cval=cval, origin=org, axes=tuple(keep)), input,
                _fast32(input, output), fresh)


def correlate(input, weights, output=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``scipy.ndimage.correlate``: multidimensional correlation (the kernel is not flipped)."""
    return _correlate_or_convolve(input, weights, output, mode, cval, origin, False, axes)


def convolve(input, weights, output=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``scipy.ndimage.convolve``: multidimensional convolution (the kernel is flipped)."""
    return _correlate_or_convolve(input, weights, output, mode, cval, origin, True, axes)


# ----------------------------------------------------------------- derivatives


def _fusable(input, output, n_axes, modes=None):
    """One fused call computes what SciPy's passes compute, to rounding: a real float result
    (SciPy rounds each pass to it; no integer truncation in between), at most 3 axes."""
    return (input.dtype.kind in "fiub?" and output.dtype.kind == "f" and n_axes <= 3 and input.size > 0)


def _derivative_filter(input, axis, output, mode, cval, operator):
    input = _input(input)
    axis = _normalize_axis(axis, input.ndim)
    fresh = _fresh(output)
    output = _get_output(output, input)
    modes = [_check_mode(m) for m in _normalize_sequence(mode, input.ndim)]
    if not np.iscomplexobj(input):  # (a complex input takes correlate1d's passes, any cval)
        cval = _real_cval(cval)
    if _fusable(input, output, input.ndim):
        axes = tuple(range(input.ndim))
        return _run(output, lambda t: F.derivative(t, axis, operator=operator, mode=tuple(modes), cval=cval,
                                                   axes=axes), input, _fast32(input, output), fresh)
    smooth = {"sobel": [1, 2, 1], "prewitt": [1, 1, 1]}[operator]
    if _fusable(input, output, 3) and (cval == 0.0 or not any(m in ("constant", "grid-constant") for m in modes)):
        # linear passes, one per axis, commute (constant mode with cval != 0 aside): fused
        # calls of three axes each, the trailing ones first
        passes = {a: (-1, (-1.0, 0.0, 1.0) if a == axis else tuple(map(float, smooth))) for a in range(input.ndim)}
        return _run(output, lambda t: _sep_groups(t, passes, modes, cval), input, _fast32(input, output), fresh)
    correlate1d(input, [-1, 0, 1], axis, output, modes[axis], cval, 0)
    for ii in (a for a in range(input.ndim) if a != axis):
        correlate1d(output, smooth, ii, output, modes[ii], cval, 0)
    return output


def _sep_groups(t, passes, modes, cval):
    """``t`` filtered by one 1-D pass per axis (``passes[axis] = (lo, taps)``), as fused calls of
    up to three axes each, from the last axes on."""
    from .functional import _core

    axes = sorted(passes)
    while axes:
        group, axes = tuple(axes[-3:]), axes[:-3]
        lay = _core.layout(t, group)
        sa = dict(zip(group, lay.spec_axes))
        recipe = ("sep", tuple((sa[a], passes[a][0], passes[a][1]) for a in group),
                  tuple(_spec.neg_zeros(passes[a][1]) for a in group))
        t = _core.run(t, lay, tuple(canonical_mode(_check_mode(modes[a])) for a in group), cval, "stack", (recipe,),
                      None, None)
    return t


def sobel(input, axis=-1, output=None, mode="reflect", cval=0.0):
    """``scipy.ndimage.sobel``: the Sobel derivative along ``axis``, smoothing every other axis."""
    return _derivative_filter(input, axis, output, mode, cval, "sobel")


def prewitt(input, axis=-1, output=None, mode="reflect", cval=0.0):
    """``scipy.ndimage.prewitt``: the Prewitt derivative along ``axis``, smoothing every other axis."""
    return _derivative_filter(input, axis, output, mode, cval, "prewitt")


def generic_laplace(input, derivative2, output=None, mode="reflect", cval=0.0, extra_arguments=(),
                    extra_keywords=None, *, axes=None):
    """``scipy.ndimage.generic_laplace``: the sum over ``axes`` of ``derivative2`` along each."""
    if extra_keywords is None:
        extra_keywords = {}
    input = _arrays.as_array(input)
    output = _get_output(output, input)
    axes = _check_axes(axes, input.ndim)
    if len(axes) > 0:
        modes = _normalize_sequence(mode, len(axes))
        derivative2(input, axes[0], output, modes[0], cval, *extra_arguments, **extra_keywords)
        for ii in range(1, len(axes)):
            tmp = derivative2(input, axes[ii], output.dtype, modes[ii], cval, *extra_arguments, **extra_keywords)
            output += tmp
    else:
        output[...] = input[...]
    return output


def laplace(input, output=None, mode="reflect", cval=0.0, *, axes=None):
    """``scipy.ndimage.laplace``: the sum over ``axes`` of ``[1, -2, 1]`` along each."""
    a = _input(input)
    fresh = _fresh(output)
    out = _get_output(output, a) if a.dtype.kind != "c" else None
    ax = _check_axes(axes, a.ndim)
    # (an output sharing the input's memory: SciPy's passes, which read what the first one wrote,
    # as ``gaussian_laplace`` and the generic functions do -- found by review)
    aliased = isinstance(out, np.ndarray) and isinstance(a, np.ndarray) and np.may_share_memory(a, out)
    if out is not None and 0 < len(ax) and _fusable(a, out, len(ax)) and not aliased:
        modes = tuple(_check_mode(m) for m in _normalize_sequence(mode, len(ax)))
        cv = _real_cval(cval)
        return _run(out, lambda t: F.laplace(t, mode=modes, cval=cv, axes=ax), a, _fast32(a, out), fresh)

    def derivative2(input, axis, output, mode, cval):
        return correlate1d(input, [1, -2, 1], axis, output, mode, cval, 0)

    return generic_laplace(a, derivative2, out if out is not None else output, mode, cval, axes=axes)


def generic_gradient_magnitude(input, derivative, output=None, mode="reflect", cval=0.0, extra_arguments=(),
                               extra_keywords=None, *, axes=None):
    """``scipy.ndimage.generic_gradient_magnitude``: ``sqrt`` of the sum of squared derivatives."""
    if extra_keywords is None:
        extra_keywords = {}
    input = _arrays.as_array(input)
    output = _get_output(output, input)
    axes = _check_axes(axes, input.ndim)
    if len(axes) > 0:
        modes = _normalize_sequence(mode, len(axes))
        derivative(input, axes[0], output, modes[0], cval, *extra_arguments, **extra_keywords)
        np.multiply(output, output, output)
        for ii in range(1, len(axes)):
            tmp = derivative(input, axes[ii], output.dtype, modes[ii], cval, *extra_arguments, **extra_keywords)
            np.multiply(tmp, tmp, tmp)
            output += tmp
        np.sqrt(output, output, casting="unsafe")
    else:
        output[...] = input[...]
    return output


# ----------------------------------------------------------------- Gaussian


def _radius(truncate, sigma, radius):
    lw = int(truncate * float(sigma) + 0.5)
    if radius is not None:
        lw = radius
    if not isinstance(lw, numbers.Integral) or lw < 0:
        raise ValueError("Radius must be a nonnegative integer.")
    return int(lw)


def gaussian_filter1d(input, sigma, axis=-1, order=0, output=None, mode="reflect", cval=0.0, truncate=4.0, *,
                      radius=None):
    """``scipy.ndimage.gaussian_filter1d``: a 1-D Gaussian (or its derivative) along ``axis``."""
    sd = float(sigma)
    lw = _radius(truncate, sd, radius)
    if order < 0:
        raise ValueError("order must be non-negative")
    # SciPy's kernel takes an order of 0 as it is and any other through numpy.zeros(order + 1):
    # 0.0 is 0, 1.0 its TypeError
    order = 0 if order == 0 else operator.index(order)
    # correlation with the reversed kernel (SciPy's): kernels.gaussian_kernel1d is SciPy's, reversed
    weights = np.asarray(kernels.gaussian_kernel1d(sd, order, lw), np.float64)
    return correlate1d(input, weights, axis, output, mode, cval, 0)


def gaussian_filter(input, sigma, order=0, output=None, mode="reflect", cval=0.0, truncate=4.0, *, radius=None,
                    axes=None):
    """``scipy.ndimage.gaussian_filter``: one 1-D Gaussian per axis, in ``axes`` order."""
    input = _input(input)
    fresh = _fresh(output)
    output = _get_output(output, input)  # (a real output for a complex input: correlate1d refuses it)
    axes = _check_axes(axes, input.ndim)
    n = len(axes)
    orders = _normalize_sequence(order, n)
    sigmas = _normalize_sequence(sigma, n)
    modes = _normalize_sequence(mode, n)
    radii = _normalize_sequence(radius, n)
    todo = [(axes[i], sigmas[i], orders[i], modes[i], radii[i]) for i in range(n) if sigmas[i] > 1e-15]
    if not todo:
        output[...] = input[...]
        return output
    if (_fusable(input, output, len(todo)) and all(isinstance(o, numbers.Integral) and o >= 0 for _, _, o, _, _ in todo)
            and (all(r is None for *_, r in todo) or all(r is not None for *_, r in todo))):
        ax = tuple(a for a, *_ in todo)
        sg = tuple(float(s) for _, s, *_ in todo)
        od = tuple(int(o) for _, _, o, _, _ in todo)
        md = tuple(_check_mode(m) for *_, m, _ in todo)
        rd = tuple(_radius(truncate, s, r) for _, s, _, _, r in todo)  # SciPy's rule (and check)
        cv = _real_cval(cval)
        return _run(output, lambda t: F.gaussian_filter(t, sg, order=od, mode=md, cval=cv, radius=rd, axes=ax),
                    input, _fast32(input, output), fresh)
    src = input
    for axis, s, o, m, r in todo:
        gaussian_filter1d(src, s, axis, o, output, m, cval, truncate, radius=r)
        src = output
    return output


def _gaussian_derivatives(combine, order, input, sigma, output, mode, cval, axes, kwargs):
    """SciPy's ``gaussian_laplace``/``gaussian_gradient_magnitude``: ``combine`` (the generic
    function) of one ``gaussian_filter`` per axis, ``order`` along it, with ``sigma`` spread on
    the input's axes (0 on the unchosen ones, as SciPy does)."""
    input = _arrays.as_array(input)

    def derivative(input, axis, output, mode, cval, sigma, **kwargs):
        orders = [0] * input.ndim
        orders[axis] = order
        return gaussian_filter(input, sigma, orders, output, mode, cval, **kwargs)

    axes = _check_axes(axes, input.ndim)
    sigma = _normalize_sequence(sigma, len(axes))
    if len(axes) < input.ndim:
        full = [0] * input.ndim
        for s, ax in zip(sigma, axes):
            full[ax] = s
        sigma = full
    return combine(input, derivative, output, mode, cval, extra_arguments=(sigma,), extra_keywords=kwargs, axes=axes)


def gaussian_laplace(input, sigma, output=None, mode="reflect", cval=0.0, *, axes=None, **kwargs):
    """``scipy.ndimage.gaussian_laplace``: the sum over ``axes`` of second Gaussian derivatives."""
    return _gaussian_derivatives(generic_laplace, 2, input, sigma, output, mode, cval, axes, kwargs)


def gaussian_gradient_magnitude(input, sigma, output=None, mode="reflect", cval=0.0, *, axes=None, **kwargs):
    """``scipy.ndimage.gaussian_gradient_magnitude``: the gradient magnitude of Gaussian derivatives."""
    return _gaussian_derivatives(generic_gradient_magnitude, 1, input, sigma, output, mode, cval, axes, kwargs)


# ----------------------------------------------------------------- uniform


def uniform_filter1d(input, size, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """``scipy.ndimage.uniform_filter1d``: the mean over ``size`` samples along ``axis``."""
    input = _input(input)
    axis = _normalize_axis(axis, input.ndim)
    if size < 1:
        raise RuntimeError("incorrect filter size")
    size = operator.index(size)  # (SciPy's C function takes an integer: 2.5 is a TypeError)
    complex_output = input.dtype.kind == "c"
    fresh = _fresh(output)
    output = _get_output(output, input, complex_output=complex_output)
    origin = _pass_origin(size, origin)
    mode = _check_mode(mode)
    if complex_output:
        uniform_filter1d(input.real, size, axis, output.real, mode, np.real(cval), origin)
        uniform_filter1d(input.imag, size, axis, output.imag, mode, np.imag(cval), origin)
        return output
    cv = _real_cval(cval)
    if input.size == 0:
        return output
    if _fast32(input, output):
        return _run(output, lambda t: F.uniform_filter1d(t, int(size), axis, mode=mode, cval=cv, origin=int(origin)),
                    input, True, fresh)
    # the window's sum, then one division (SciPy's: an integer mean is exact where SciPy's is)
    ones = [1.0] * int(size)
    return _run(output, lambda t: F.correlate1d(t, ones, axis, mode=mode, cval=cv, origin=int(origin)) / size,
                input, False, fresh)


def uniform_filter(input, size=3, output=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``scipy.ndimage.uniform_filter``: the mean over ``size`` samples per axis."""
    input = _input(input)
    fresh = _fresh(output)
    output = _get_output(output, input, complex_output=input.dtype.kind == "c")
    axes = _check_axes(axes, input.ndim)
    n = len(axes)
    sizes = _normalize_sequence(size, n)
    origins = _normalize_sequence(origin, n)
    modes = _normalize_sequence(mode, n)
    todo = [(axes[i], sizes[i], origins[i], modes[i]) for i in range(n) if sizes[i] > 1]
    if not todo:
        output[...] = input[...]
        return output
    if _fusable(input, output, len(todo)) and all(isinstance(s, numbers.Integral) for _, s, _, _ in todo):
        org = tuple(_pass_origin(s, o) for _, s, o, _ in todo)  # (a float origin: SciPy's TypeError)
        ax = tuple(a for a, *_ in todo)
        md = tuple(_check_mode(m) for *_, m in todo)
        cv = _real_cval(cval)
        return _run(output, lambda t: F.uniform_filter(t, tuple(int(s) for _, s, _, _ in todo), mode=md, cval=cv,
                                                       origin=org, axes=ax),
                    input, _fast32(input, output), fresh)
    src = input
    for axis, s, o, m in todo:
        uniform_filter1d(src, int(s), axis, output, m, cval, o)
        src = output
    return output


# ----------------------------------------------------------------- rank filters


def _order_preserving(a, cval, cast_cval=None, wide=False):
    """``(t, back, cval)``: ``a`` as a float tensor whose order is ``a``'s, exactly: floats as
    they are, integers up to 32 bits (and bools) as float64; 64-bit integers as float64 too when
    they fit in 53 bits, else as their ranks among ``a``'s values and ``cval`` (``back`` maps
    selected ranks back; None where ``t`` holds the values).  ``cast_cval``: None compares the
    cval as a double (SciPy's min/max filters), else it is cast to the input's type or to
    ``"int64"`` first (SciPy's rank paths); ``wide``: the output's type differs from the
    input's, so an uncast cval is selected as the double it is (float inputs then filtered
    in float64).  Rank filters only compare, so every result is exact."""
    _real_cval(cval)
    if cast_cval is None and wide and a.dtype in (np.float16, np.float32):
        return _arrays.to_torch(a, np.float64), None, float(cval)
    if a.dtype in (np.float32, np.float64, np.float16):  # rounding cval is monotonic: the same
        with np.errstate(over="ignore"):  # selections (1e300 is inf in float32, as SciPy's cast)
            cv = float(np.asarray(cval).astype(a.dtype))
        if a.dtype == np.float16:
            return _arrays.to_torch(a, np.float32), None, cv
        return _tensor(a, a.dtype == np.float32), None, cv
    if cast_cval is None and a.dtype.itemsize < 8:
        return _tensor(a, False), None, float(cval)  # compared uncast, as SciPy's double line buffers
    if cast_cval is None:  # 64-bit integers, compared with the uncast cval (found by review)
        cvd = float(np.float64(cval))
        if a.size == 0 or int(np.abs(a.astype(np.float64)).max()) < 2**53:
            return _tensor(a, False), None, cvd  # (exact as doubles)
        return _uncast_ranks(a, cvd)
    # SciPy's N-D rank and footprint paths cast cval to the input's type, its 1-D rank path to int64
    cv = np.trunc(np.asarray(cval, np.float64))  # C's cast: toward zero (a bool too: 0.5 is False)
    cv = cv.astype(np.int64 if cast_cval == "int64" else a.dtype)
    if a.dtype.itemsize < 8 or a.size == 0 or (int(np.abs(a.astype(np.float64)).max()) < 2**53
                                               and abs(int(cv)) < 2**53):
        return _tensor(a, False), None, float(cv)
    table, inv = np.unique(np.append(a.ravel(), cv), return_inverse=True)
    ranks = inv.astype(np.float64)
    return (_arrays.to_torch(ranks[:-1].reshape(a.shape), np.float64), lambda v: table[v.astype(np.int64)],
            float(ranks[-1]))


def _uncast_ranks(a, cvd):
    """:func:`_order_preserving` for 64-bit integers past 2**53 and a cval compared as the
    double it is (min/max filters): ``a``'s values as their ranks ``0 .. n-1`` among its
    distinct values (exact), the cval between them (a half rank; NaN last), and the function
    that maps selected ranks back: the value, or the cval (a float64 result then, cast into the
    output as SciPy casts its double)."""
    vals = np.unique(a.ravel())
    if cvd != cvd:
        pos = len(vals) + 1  # (NaN orders last)
    else:  # the first value >= cval, compared exactly (Python's int / float comparisons are)
        lo, hi = 0, len(vals)
        while lo < hi:
            mid = (lo + hi) // 2
            if int(vals[mid]) < cvd:
                lo = mid + 1
            else:
                hi = mid
        pos = lo
    rank = float(pos) if pos < len(vals) and int(vals[pos]) == cvd else pos - 0.5
    inv = np.searchsorted(vals, a.ravel())

    def back(v):
        half = v != np.floor(v)
        if not half.any():
            return vals[v.astype(np.int64)]
        out = vals[np.clip(np.floor(v), 0, len(vals) - 1).astype(np.int64)].astype(np.float64)
        out[half] = cvd
        return out

    return _arrays.to_torch(inv.astype(np.float64).reshape(a.shape), np.float64), back, rank


def _select_nd(t, footprint, rank, modes, cv, origins):
    """Rank ``rank`` of ``footprint`` (over every axis of ``t``, a CPU tensor of the order-preserving
    values) for a window that reaches along more than three axes: ``numpy.partition`` of the
    windows of ``t`` extended as the engines extend it (``reference._pad``: SciPy's folds;
    ``modes``: axis -> mode of each axis the window reaches along) -- exact, NaN last as
    ``numpy.sort`` and the engines order it -- in blocks of the first axis that keep the window
    copies near 64 MiB."""
    from .backends.reference import _pad

    x = t.cpu()
    for i, n in enumerate(footprint.shape):
        before = n // 2 + origins[i]  # (SciPy's window of output j starts at j - n // 2 - origin)
        if i in modes:
            x = _pad(x, i, -before, n - 1 - before, canonical_mode(modes[i]), cv)
    windows = np.lib.stride_tricks.sliding_window_view(x.numpy(), footprint.shape)
    count = int(footprint.sum())
    step = max(1, (64 << 20) // max(1, x.element_size() * count * math.prod(t.shape[1:])))
    out = np.empty(tuple(t.shape), windows.dtype)
    for a in range(0, t.shape[0], step):
        out[a:a + step] = np.partition(windows[a:a + step][..., footprint], rank, axis=-1)[..., rank]
    return torch.from_numpy(out)


def _rank_window(input, size, footprint, axes, origin):
    """SciPy's window rules: ``(footprint over every axis, origins over every axis)``."""
    if footprint is None:
        if size is None:
            raise RuntimeError("no footprint or filter size provided")
        footprint = np.ones(_normalize_sequence(size, len(axes)), dtype=bool)
    else:
        footprint = _arrays.host(footprint, dtype=bool)
    footprint = _expand_window(footprint, input.ndim, axes, "footprint")
    origins = _expand_origins(origin, input.ndim, axes)
    fshape = [n for n in footprint.shape if n > 0]
    if len(fshape) != input.ndim:
        raise RuntimeError(f"footprint.ndim ({footprint.ndim}) must match len(axes) ({len(axes)})")
    for o, n in zip(origins, fshape):
        if (n // 2 + o < 0) or (n // 2 + o >= n):
            raise ValueError("invalid origin")
    return footprint, [int(o) for o in origins]


def _rank_run(input, footprint, origins, rank, output, modes, cval, fresh, cast_cval=None):
    """Select rank ``rank`` of ``footprint`` (over every axis) with torchfilters; ``modes`` one
    per axis.  Axes the window does not reach along are batch axes."""
    keep = [i for i in range(input.ndim) if footprint.shape[i] != 1 or origins[i] != 0]
    if not keep:
        keep = [input.ndim - 1]
    md = tuple(_check_mode(modes[i]) for i in keep)
    if input.size == 0:
        return output
    t, back, cv = _order_preserving(input, cval, cast_cval, output.dtype != input.dtype)
    if len(keep) > 3:  # (the engines filter up to three axes)
        y = _select_nd(t, footprint, rank, dict(zip(keep, md)), cv, origins)
    else:
        fp = footprint.reshape([footprint.shape[i] for i in keep]).tolist()
        y = F.rank_filter(t, rank, footprint=fp, mode=md, cval=cv, origin=[origins[i] for i in keep],
                          axes=tuple(keep))
    v = _arrays.from_torch(y, output)
    if back is not None:
        v = back(v)
    if fresh and v.dtype == output.dtype and (back is not None or y.is_contiguous()):
        return v
    return _store(output, v)


def _rank_filter(input, rank, size, footprint, output, mode, cval, origin, operation, axes):
    if size is not None and footprint is not None:
        warnings.warn("ignoring size because footprint is set", UserWarning, stacklevel=3)
    input = _arrays.as_array(input)
    if np.iscomplexobj(input):
        raise TypeError("Complex type not supported")
    axes = _check_axes(axes, input.ndim)
    footprint, origins = _rank_window(input, size, footprint, axes, origin)
    count = int(footprint.sum())
    if operation == "median":
        rank = count // 2
    elif operation == "percentile":
        p = float(rank)
        if p < 0.0:
            p += 100.0
        if p < 0 or p > 100:
            raise RuntimeError("invalid percentile")
        rank = count - 1 if p == 100.0 else int(float(count) * p / 100.0)
    rank = operator.index(rank)
    if rank < 0:
        rank += count
    if rank < 0 or rank >= count:
        raise RuntimeError("rank not within filter footprint size")
    per_axis_modes = not isinstance(mode, str) and np.iterable(mode)
    if per_axis_modes:
        m = _normalize_sequence(mode, len(axes))
        modes = ["constant"] * input.ndim
        for mm, ax in zip(m, axes):
            modes[ax] = mm
    else:
        modes = [mode] * input.ndim
    if rank in (0, count - 1):
        return _min_or_max(input, footprint, output, modes, cval, origins, rank == 0, per_axis_modes)
    if input.dtype == np.float16 and input.ndim != 1:
        raise RuntimeError("array type not supported")
    if input.dtype.char not in _SUPPORTED and input.dtype != np.float16:
        raise RuntimeError("array type not supported")
    if per_axis_modes:
        raise RuntimeError("A sequence of modes is not supported by non-separable rank filters")
    fresh = _fresh(output)
    output = _get_output_rank(output, input)
    _check_mode(mode)
    # how SciPy's path treats cval: its 1-D rank path casts it to int64, the N-D one to the input's type
    lim2 = input.size - ((footprint.size - 1) // 2 - origins[0])
    one_d = input.ndim == 1 and (lim2 >= 0 or input.size == 1)
    return _rank_run(input, footprint, origins, rank, output, modes, cval, fresh, "int64" if one_d else "input")


def _get_output_rank(output, input):
    if input.dtype == np.float16 and (output is None or isinstance(output, (type, np.dtype, str))):
        return _arrays.zeros(input.shape, np.float16 if output is None else np.dtype(output), input)
    return _get_output(output, input)


def _min_or_max(input, footprint, output, modes, cval, origins, minimum, per_axis_modes):
    if not footprint.any():
        raise ValueError("All-zero footprint is not supported.")
    if input.dtype.char not in _SUPPORTED:
        raise RuntimeError(f"array type {input.dtype!r} not supported")
    fresh = _fresh(output)
    output = _get_output(output, input)
    separable = bool(footprint.all())
    if not separable and per_axis_modes:
        raise RuntimeError("A sequence of modes is not supported for non-separable footprints")
    if separable:  # SciPy: one 1-D pass per axis of size > 1; the others keep no mode
        for i, n in enumerate(footprint.shape):
            if n > 1:
                _check_mode(modes[i])
        if all(n == 1 for n in footprint.shape):
            output[...] = input[...]
            return output
        passes = [i for i, n in enumerate(footprint.shape) if n > 1]
        if len(passes) > 1 and (output.dtype != input.dtype or len(passes) > 3):
            # SciPy stores each 1-D pass in the output's dtype (a narrower one wraps between
            # passes); in the input's dtype, one fused box is the same, over up to 3 axes (more:
            # the passes, as SciPy's)
            src = input
            for i in passes:
                _min_or_max_1d(src, footprint.shape[i], i, output, modes[i], cval, origins[i], minimum)
                src = output
            return output
    else:
        _check_mode(modes[0])
    count = int(footprint.sum())
    # SciPy's separable passes compare cval uncast; its footprint path casts it to the input's type
    return _rank_run(input, footprint, origins, 0 if minimum else count - 1, output, modes, cval, fresh,
                     None if separable else "input")


def rank_filter(input, rank, size=None, footprint=None, output=None, mode="reflect", cval=0.0, origin=0, *,
                axes=None):
    """``scipy.ndimage.rank_filter``: the value of rank ``rank`` in each window."""
    return _rank_filter(input, rank, size, footprint, output, mode, cval, origin, "rank", axes)


def median_filter(input, size=None, footprint=None, output=None, mode="reflect", cval=0.0, origin=0, *,
                  axes=None):
    """``scipy.ndimage.median_filter``: the median (rank ``count // 2``) of each window."""
    return _rank_filter(input, 0, size, footprint, output, mode, cval, origin, "median", axes)


def percentile_filter(input, percentile, size=None, footprint=None, output=None, mode="reflect", cval=0.0,
                      origin=0, *, axes=None):
    """``scipy.ndimage.percentile_filter``: rank ``int(count * percentile / 100)`` of each window."""
    return _rank_filter(input, percentile, size, footprint, output, mode, cval, origin, "percentile", axes)


def _min_or_max_filter(input, size, footprint, output, mode, cval, origin, minimum, axes):
    if size is not None and footprint is not None:
        warnings.warn("ignoring size because footprint is set", UserWarning, stacklevel=3)
    if footprint is None:
        if size is None:
            raise RuntimeError("no footprint provided")
    else:
        footprint = _arrays.host(footprint, dtype=bool)
        if not footprint.any():
            raise ValueError("All-zero footprint is not supported.")
        size = None
        if footprint.all():  # SciPy: a full footprint is its size (separable)
            size, footprint = footprint.shape, None
    input = _arrays.as_array(input)
    if np.iscomplexobj(input):
        raise TypeError("Complex type not supported")
    axes = _check_axes(axes, input.ndim)
    wax = axes
    if footprint is None and size is not None:
        # SciPy runs a size as 1-D passes, size[i] and origin[i] along axes[i] (axes' order, as
        # mode); _rank_window lays a window's dims out in increasing axis order, so the window
        # goes there with its axes sorted (found by review: origins stayed in axes' order)
        sizes = _normalize_sequence(size, len(axes))
        origins = _normalize_sequence(origin, len(axes))
        # an axis of size <= 1 is no pass of SciPy's (its origin unchecked); the others' sizes are
        # int()-ed, as SciPy's passes take them (size=0: a copy; 2.5: 2), and their origins
        # checked as its 1-D filters check them: an invalid one is a ValueError, then one that is
        # no integer a TypeError
        origins = [o if n > 1 else 0 for n, o in zip(sizes, origins)]
        sizes = [int(n) if n > 1 else 1 for n in sizes]
        origins = [_pass_origin(n, o) for n, o in zip(sizes, origins)]
        order = sorted(range(len(axes)), key=axes.__getitem__)
        size = [sizes[i] for i in order]
        origin = [origins[i] for i in order]
        wax = tuple(axes[i] for i in order)
    footprint, origins = _rank_window(input, size, footprint, wax, origin)
    per_axis_modes = not isinstance(mode, str) and np.iterable(mode)
    if per_axis_modes:
        m = _normalize_sequence(mode, len(axes))
        modes = ["constant"] * input.ndim
        for mm, ax in zip(m, axes):
            modes[ax] = mm
    else:
        modes = [mode] * input.ndim
    return _min_or_max(input, footprint, output, modes, cval, origins, minimum, per_axis_modes)


def minimum_filter(input, size=None, footprint=None, output=None, mode="reflect", cval=0.0, origin=0, *,
                   axes=None):
    """``scipy.ndimage.minimum_filter``: the minimum of each window."""
    return _min_or_max_filter(input, size, footprint, output, mode, cval, origin, True, axes)


def maximum_filter(input, size=None, footprint=None, output=None, mode="reflect", cval=0.0, origin=0, *,
                   axes=None):
    """``scipy.ndimage.maximum_filter``: the maximum of each window."""
    return _min_or_max_filter(input, size, footprint, output, mode, cval, origin, False, axes)


def _min_or_max_1d(input, size, axis, output, mode, cval, origin, minimum):
    input = _arrays.as_array(input)
    if np.iscomplexobj(input):
        raise TypeError("Complex type not supported")
    axis = _normalize_axis(axis, input.ndim)
    if size < 1:
        raise RuntimeError("incorrect filter size")
    size = operator.index(size)  # (SciPy's C function takes an integer: 2.5 is a TypeError)
    if input.dtype.char not in _SUPPORTED:
        raise RuntimeError(f"array type {input.dtype!r} not supported")
    fresh = _fresh(output)
    output = _get_output(output, input)
    origin = _pass_origin(size, origin)
    _check_mode(mode)
    shape = [1] * input.ndim
    shape[axis] = int(size)
    origins = [0] * input.ndim
    origins[axis] = int(origin)
    fp = np.ones(shape, dtype=bool)
    return _rank_run(input, fp, origins, 0 if minimum else int(size) - 1, output, [mode] * input.ndim, cval,
                     fresh)


def minimum_filter1d(input, size, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """``scipy.ndimage.minimum_filter1d``: the minimum over ``size`` samples along ``axis``."""
    return _min_or_max_1d(input, size, axis, output, mode, cval, origin, True)


def maximum_filter1d(input, size, axis=-1, output=None, mode="reflect", cval=0.0, origin=0):
    """``scipy.ndimage.maximum_filter1d``: the maximum over ``size`` samples along ``axis``."""
    return _min_or_max_1d(input, size, axis, output, mode, cval, origin, False)


_docs.fill_ndimage(globals(), __all__)


def _fused(fn):
    """``fn`` with its calls on the fused engine from the first on (module docstring: *Compiling*)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with waiting():
            return fn(*args, **kwargs)

    return call


for _name in __all__:
    globals()[_name] = _fused(globals()[_name])
del _name
