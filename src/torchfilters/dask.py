"""torchfilters' filters on ``dask.array`` arrays: lazy, chunk by chunk, exact at chunk seams.

The same functions as :mod:`torchfilters.ndimage` (SciPy's names, arguments and dtype rules;
no ``output=``), returning lazy dask arrays.  Each runs ``map_overlap`` with a depth equal to
the filter's exact reach along each axis -- the kernel radius shifted by the origin, summed
over the passes SciPy applies along that axis -- so every output sample sees exactly the
input it would see in one in-memory call:

* at the array's outer edges nothing is padded (``boundary="none"``): the filter applies its
  own ``mode`` there, as on the whole array; along an axis of ``mode="wrap"`` the overlap is
  periodic;
* chunks thinner than the depth are merged first (a warning says so) instead of dask's error;
* the result equals ``torchfilters.ndimage`` on the computed whole array, bit for bit (every
  engine computes a value the same way wherever it falls in the block it computes).

NumPy chunks run on the fused CPU kernels, which release the GIL: the threaded scheduler and
``dask.distributed`` workers scale.  CuPy chunks (``da.from_array(cupy_array, asarray=False)``)
stay CuPy arrays: each crosses to torch by DLPack and runs on the GPU's engine (Triton), and the
result's chunks (and its ``_meta``) are CuPy arrays.  Needs the ``dask`` extra (``pip install
'torchfilters[dask]'``).

    >>> import dask.array as da, numpy as np, torchfilters.dask as tfd, torchfilters.ndimage as tfn
    >>> x = da.from_array(np.random.default_rng(0).random((64, 48)), chunks=(16, 16))
    >>> y = tfd.gaussian_filter(x, 2.0)
    >>> bool(np.array_equal(y.compute(), tfn.gaussian_filter(x.compute(), 2.0)))
    True
"""

from __future__ import annotations

import warnings

import numpy as np

from . import _docs
from . import ndimage as _nd

try:
    import dask.array as _da
    from dask.array.utils import meta_from_array as _meta_from_array
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("torchfilters.dask needs dask: pip install 'torchfilters[dask]'") from e

__all__ = [
    "correlate",
    "convolve",
    "correlate1d",
    "convolve1d",
    "sobel",
    "prewitt",
    "laplace",
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


class ChunksTooSmallWarning(UserWarning):
    """Chunks thinner than a filter's reach were merged before filtering."""


def _axes(axes, ndim):
    return _nd._check_axes(axes, ndim)


def _modes(mode, axes, ndim):
    """The mode of every axis of the array (an unfiltered axis: ``'reflect'``, unused)."""
    per = _nd._normalize_sequence(mode, len(axes))
    out = ["reflect"] * ndim
    for m, a in zip(per, axes):
        out[a] = _nd._check_mode(m)
    return out


def _overlap(image, reach, modes, fn, dtype=None):
    """``fn`` on every chunk of ``image`` with ``reach[a] = (before, after)`` samples of
    overlap along axis ``a``; ``boundary="none"`` (periodic for ``wrap``).

    The overlap is the larger reach on both sides: at the array's edges a boundary mode folds
    the far side's reach back inside (``mirror`` reads ``x[n-2]`` for ``x[n]``), so an edge
    chunk needs it on its inner side too.  An axis shorter than the overlap is one chunk."""
    image = _da.asarray(image)
    depth, boundary, rechunk = {}, {}, {}
    for a in range(image.ndim):
        d = max(0, *(int(v) for v in reach[a]))
        n = image.shape[a]
        if d and n <= d:  # the whole axis in one chunk: the filter's own mode does the rest
            rechunk[a], d = n, 0
        elif d and any(c < d for c in image.chunks[a]):
            rechunk[a] = max(d, min(n, max(image.chunks[a])))
        depth[a] = d
        boundary[a] = "periodic" if modes[a] in ("wrap", "grid-wrap") else "none"
    if rechunk:
        thin = {a: rechunk[a] for a in rechunk if depth[a]}
        if thin:
            reach = {a: depth[a] for a in thin}
            warnings.warn(f"chunks along axes {sorted(thin)} are thinner than the filter's reach {reach} (elements "
                          f"per axis): rechunked to chunks of {thin} elements", ChunksTooSmallWarning, stacklevel=3)
        image = image.rechunk(rechunk)
        for a in rechunk:  # a last chunk may still be thin: merge it into its neighbour
            c = list(image.chunks[a])
            if len(c) > 1 and c[-1] < depth[a]:
                c[-2:] = [c[-2] + c[-1]]
                image = image.rechunk({a: tuple(c)})
    dtype = np.dtype(dtype or image.dtype).newbyteorder("=")  # (results are in native byte order, as SciPy's)
    meta = _meta_from_array(image, ndim=image.ndim, dtype=dtype)  # a CuPy array's chunks stay CuPy's
    if all(d == 0 for d in depth.values()):
        return image.map_blocks(fn, dtype=dtype, meta=meta)
    return image.map_overlap(fn, depth=depth, boundary=boundary, dtype=dtype, meta=meta)


def _reach1d(k, origin):
    lo = -(k // 2) - origin
    return (-lo, lo + k - 1)


def _no_reach(ndim):
    return [(0, 0)] * ndim


# ----------------------------------------------------------------- the filters


def correlate1d(image, weights, axis=-1, mode="reflect", cval=0.0, origin=0):
    """``torchfilters.ndimage.correlate1d`` on a dask array."""
    image = _da.asarray(image)
    w = np.asarray(weights)
    axis = _nd._normalize_axis(axis, image.ndim)
    reach = _no_reach(image.ndim)
    reach[axis] = _reach1d(len(w), origin)
    modes = _modes(mode, (axis,), image.ndim)
    return _overlap(image, reach, modes, lambda b: _nd.correlate1d(b, w, axis, None, mode, cval, origin),
                    _out_dtype(image, w))


def convolve1d(image, weights, axis=-1, mode="reflect", cval=0.0, origin=0):
    """``torchfilters.ndimage.convolve1d`` on a dask array."""
    w = np.asarray(weights)[::-1]
    o = -origin - (0 if len(w) & 1 else 1)
    if w.dtype.kind == "c":
        w = w.conj()
    return correlate1d(image, w, axis, mode, cval, o)


def _out_dtype(image, weights=None):
    if image.dtype.kind == "c" or (weights is not None and np.asarray(weights).dtype.kind == "c"):
        return np.promote_types(image.dtype, np.complex64)
    return image.dtype


def _nd_reach(image, weights, origin, axes, convolution):
    ax = _axes(axes, image.ndim)
    w = np.asarray(weights)
    shape = list(w.shape)
    if len(ax) < image.ndim:
        full = [1] * image.ndim
        for n, a in zip(shape, sorted(ax)):
            full[a] = n
        shape = full
    origins = _nd._normalize_sequence(origin, len(ax))
    if len(ax) < image.ndim:
        o = [0] * image.ndim
        for v, a in zip(origins, ax):
            o[a] = v
        origins = o
    if convolution:
        origins = [-o - (0 if n & 1 else 1) for o, n in zip(origins, shape)]
    return [_reach1d(n, o) for n, o in zip(shape, origins)]


def correlate(image, weights, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``torchfilters.ndimage.correlate`` on a dask array."""
    image = _da.asarray(image)
    reach = _nd_reach(image, weights, origin, axes, False)
    return _overlap(image, reach, [_nd._check_mode(mode)] * image.ndim,
                    lambda b: _nd.correlate(b, weights, None, mode, cval, origin, axes=axes), _out_dtype(image, weights))


def convolve(image, weights, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``torchfilters.ndimage.convolve`` on a dask array."""
    image = _da.asarray(image)
    reach = _nd_reach(image, weights, origin, axes, True)
    return _overlap(image, reach, [_nd._check_mode(mode)] * image.ndim,
                    lambda b: _nd.convolve(b, weights, None, mode, cval, origin, axes=axes), _out_dtype(image, weights))


def _every_axis(image, r):
    return [(r, r)] * image.ndim


def sobel(image, axis=-1, mode="reflect", cval=0.0):
    """``torchfilters.ndimage.sobel`` on a dask array."""
    image = _da.asarray(image)
    modes = [_nd._check_mode(m) for m in _nd._normalize_sequence(mode, image.ndim)]
    return _overlap(image, _every_axis(image, 1), modes, lambda b: _nd.sobel(b, axis, None, mode, cval))


def prewitt(image, axis=-1, mode="reflect", cval=0.0):
    """``torchfilters.ndimage.prewitt`` on a dask array."""
    image = _da.asarray(image)
    modes = [_nd._check_mode(m) for m in _nd._normalize_sequence(mode, image.ndim)]
    return _overlap(image, _every_axis(image, 1), modes, lambda b: _nd.prewitt(b, axis, None, mode, cval))


def laplace(image, mode="reflect", cval=0.0, *, axes=None):
    """``torchfilters.ndimage.laplace`` on a dask array."""
    image = _da.asarray(image)
    ax = _axes(axes, image.ndim)
    reach = _no_reach(image.ndim)
    for a in ax:
        reach[a] = (1, 1)
    return _overlap(image, reach, _modes(mode, ax, image.ndim),
                    lambda b: _nd.laplace(b, None, mode, cval, axes=axes))


def _gauss_reach(image, sigma, truncate, radius, axes):
    ax = _axes(axes, image.ndim)
    sig = _nd._normalize_sequence(sigma, len(ax))
    rad = _nd._normalize_sequence(radius, len(ax))
    reach = _no_reach(image.ndim)
    for a, s, r in zip(ax, sig, rad):
        if s > 1e-15:
            lw = _nd._radius(truncate, s, r)
            reach[a] = (lw, lw)
    return ax, reach


def gaussian_filter(image, sigma, order=0, mode="reflect", cval=0.0, truncate=4.0, *, radius=None, axes=None):
    """``torchfilters.ndimage.gaussian_filter`` on a dask array."""
    image = _da.asarray(image)
    ax, reach = _gauss_reach(image, sigma, truncate, radius, axes)
    return _overlap(image, reach, _modes(mode, ax, image.ndim),
                    lambda b: _nd.gaussian_filter(b, sigma, order, None, mode, cval, truncate, radius=radius,
                                                  axes=axes), _out_dtype(image))


def gaussian_filter1d(image, sigma, axis=-1, order=0, mode="reflect", cval=0.0, truncate=4.0, *, radius=None):
    """``torchfilters.ndimage.gaussian_filter1d`` on a dask array."""
    image = _da.asarray(image)
    axis = _nd._normalize_axis(axis, image.ndim)
    lw = _nd._radius(truncate, float(sigma), radius)
    reach = _no_reach(image.ndim)
    reach[axis] = (lw, lw)
    return _overlap(image, reach, _modes(mode, (axis,), image.ndim),
                    lambda b: _nd.gaussian_filter1d(b, sigma, axis, order, None, mode, cval, truncate, radius=radius),
                    _out_dtype(image))


def _derivatives_reach(image, sigma, truncate, radius, axes):
    """The reach of ``gaussian_laplace``/``gaussian_gradient_magnitude`` as SciPy (and
    ``torchfilters.ndimage``) read their arguments: ``sigma`` per chosen axis, but in axis order
    where ``axes`` names every axis (in any order); ``radius`` always in axis order (it goes to
    ``gaussian_filter`` over every axis).  (Found by review: ``axes=(1, 0)`` with two sigmas
    overlapped by the other axis's radius.)"""
    ax = _axes(axes, image.ndim)
    sig = _nd._normalize_sequence(sigma, len(ax))
    if len(ax) < image.ndim:
        full = [0.0] * image.ndim
        for s, a in zip(sig, ax):
            full[a] = s
        sig = full
    rad = _nd._normalize_sequence(radius, image.ndim)
    reach = _no_reach(image.ndim)
    for a, (s, r) in enumerate(zip(sig, rad)):
        if s > 1e-15:
            lw = _nd._radius(truncate, s, r)
            reach[a] = (lw, lw)
    return reach


def _sum_of_gaussians(fn, image, sigma, mode, cval, axes, kwargs):
    image = _da.asarray(image)
    reach = _derivatives_reach(image, sigma, kwargs.get("truncate", 4.0), kwargs.get("radius"), axes)
    # each derivative runs with one mode on every axis (SciPy's rule): wrap modes overlap
    # periodically, the others not; a mix of the two needs both along every filtered axis, so
    # those axes are taken whole (one chunk each)
    ax = _axes(axes, image.ndim)
    wraps = {m in ("wrap", "grid-wrap") for m in _nd._normalize_sequence(mode, len(ax))}
    wrap = True in wraps
    if len(wraps) == 2:
        if any(len(image.chunks[a]) > 1 for a in ax):
            warnings.warn(f"mode={mode!r} mixes wrap with other modes, each of which this filter applies on "
                          f"every axis: axes {sorted(ax)} are computed whole (one chunk each)", UserWarning,
                          stacklevel=3)
        reach = [(image.shape[a], image.shape[a]) if a in ax else r for a, r in enumerate(reach)]
    return _overlap(image, reach, ["wrap" if wrap else "reflect"] * image.ndim,
                    lambda b: fn(b, sigma, None, mode, cval, axes=axes, **kwargs))


def gaussian_gradient_magnitude(image, sigma, mode="reflect", cval=0.0, *, axes=None, **kwargs):
    """``torchfilters.ndimage.gaussian_gradient_magnitude`` on a dask array."""
    return _sum_of_gaussians(_nd.gaussian_gradient_magnitude, image, sigma, mode, cval, axes, kwargs)


def gaussian_laplace(image, sigma, mode="reflect", cval=0.0, *, axes=None, **kwargs):
    """``torchfilters.ndimage.gaussian_laplace`` on a dask array."""
    return _sum_of_gaussians(_nd.gaussian_laplace, image, sigma, mode, cval, axes, kwargs)


def uniform_filter1d(image, size, axis=-1, mode="reflect", cval=0.0, origin=0):
    """``torchfilters.ndimage.uniform_filter1d`` on a dask array."""
    image = _da.asarray(image)
    axis = _nd._normalize_axis(axis, image.ndim)
    reach = _no_reach(image.ndim)
    reach[axis] = _reach1d(int(size), origin)
    return _overlap(image, reach, _modes(mode, (axis,), image.ndim),
                    lambda b: _nd.uniform_filter1d(b, size, axis, None, mode, cval, origin), _out_dtype(image))


def uniform_filter(image, size=3, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``torchfilters.ndimage.uniform_filter`` on a dask array."""
    image = _da.asarray(image)
    ax = _axes(axes, image.ndim)
    sizes = _nd._normalize_sequence(size, len(ax))
    origins = _nd._normalize_sequence(origin, len(ax))
    reach = _no_reach(image.ndim)
    for a, n, o in zip(ax, sizes, origins):
        try:  # SciPy's passes: ``size > 1`` filters, with ``int(size)`` samples (3.0 is 3)
            if n > 1:
                reach[a] = _reach1d(int(n), o)
        except (TypeError, ValueError):  # (the chunks' call raises SciPy's error)
            pass
    return _overlap(image, reach, _modes(mode, ax, image.ndim),
                    lambda b: _nd.uniform_filter(b, size, None, mode, cval, origin, axes=axes), _out_dtype(image))


# ----------------------------------------------------------------- rank filters


def _rank_reach(image, size, footprint, origin, axes):
    ax = _axes(axes, image.ndim)
    if footprint is not None:
        shape = list(np.asarray(footprint).shape)
        ordered = sorted(ax)  # a footprint's dims follow increasing axis order (SciPy)
    elif size is not None:
        shape = _nd._normalize_sequence(size, len(ax))
        ordered = list(ax)
    else:
        raise RuntimeError("no footprint or filter size provided")
    reach = _no_reach(image.ndim)
    origins = dict(zip(ax, _nd._normalize_sequence(origin, len(ax))))
    if len(shape) == len(ordered):
        for a, n in zip(ordered, shape):
            reach[a] = _reach1d(int(n), int(origins[a]))
    return ax, reach


def _rank_like(fn, image, size, footprint, mode, cval, origin, axes, *lead):
    image = _da.asarray(image)
    ax, reach = _rank_reach(image, size, footprint, origin, axes)
    modes = _modes(mode, ax, image.ndim)
    return _overlap(image, reach, modes,
                    lambda b: fn(b, *lead, size, footprint, None, mode, cval, origin, axes=axes), image.dtype)


def rank_filter(image, rank, size=None, footprint=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``torchfilters.ndimage.rank_filter`` on a dask array."""
    return _rank_like(_nd.rank_filter, image, size, footprint, mode, cval, origin, axes, rank)


def percentile_filter(image, percentile, size=None, footprint=None, mode="reflect", cval=0.0, origin=0, *,
                      axes=None):
    """``torchfilters.ndimage.percentile_filter`` on a dask array."""
    return _rank_like(_nd.percentile_filter, image, size, footprint, mode, cval, origin, axes, percentile)


def median_filter(image, size=None, footprint=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``torchfilters.ndimage.median_filter`` on a dask array."""
    return _rank_like(_nd.median_filter, image, size, footprint, mode, cval, origin, axes)


def minimum_filter(image, size=None, footprint=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``torchfilters.ndimage.minimum_filter`` on a dask array."""
    return _rank_like(_nd.minimum_filter, image, size, footprint, mode, cval, origin, axes)


def maximum_filter(image, size=None, footprint=None, mode="reflect", cval=0.0, origin=0, *, axes=None):
    """``torchfilters.ndimage.maximum_filter`` on a dask array."""
    return _rank_like(_nd.maximum_filter, image, size, footprint, mode, cval, origin, axes)


def _minmax1d(fn, image, size, axis, mode, cval, origin):
    image = _da.asarray(image)
    axis = _nd._normalize_axis(axis, image.ndim)
    reach = _no_reach(image.ndim)
    reach[axis] = _reach1d(int(size), origin)
    return _overlap(image, reach, _modes(mode, (axis,), image.ndim),
                    lambda b: fn(b, size, axis, None, mode, cval, origin), image.dtype)


def minimum_filter1d(image, size, axis=-1, mode="reflect", cval=0.0, origin=0):
    """``torchfilters.ndimage.minimum_filter1d`` on a dask array."""
    return _minmax1d(_nd.minimum_filter1d, image, size, axis, mode, cval, origin)


def maximum_filter1d(image, size, axis=-1, mode="reflect", cval=0.0, origin=0):
    """``torchfilters.ndimage.maximum_filter1d`` on a dask array."""
    return _minmax1d(_nd.maximum_filter1d, image, size, axis, mode, cval, origin)


_docs.fill_ndimage(globals(), __all__, dask=True)
