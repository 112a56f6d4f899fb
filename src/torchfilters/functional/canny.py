"""Canny edges with scikit-image's semantics (``skimage.feature.canny``) per ``(H, W)`` slice."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _ops_canny, backends
from .._docs import docfiller
from .._validate import (
    canonical_mode,
    check_bool,
    check_cval,
    check_dense,
    check_input,
    check_out,
    check_real,
    type_name,
)
from ..backends import check_backend
from .gaussian import check_sigma, gaussian_filter, gaussian_filter1d

__all__ = ["canny"]

_CANNY_INPUT = """\
input: the images, a tensor shaped ``(..., H, W)`` (at least 2-D); every
    ``(H, W)`` slice is an independent image.  Any device, any strides.
    Converted as scikit-image's ``img_as_float`` does: integer dtypes
    are divided by their maximum (``x * (1 / max)``; signed ones clipped
    at -1) and computed in float64, float64 in float64, float32 in
    float32, float16 and bfloat16 in float32.  bool, complex and float8
    dtypes raise ``TypeError`` (as every op), int64 and uint64
    ``ValueError`` (as scikit-image).  Never modified."""

_CANNY_MASK = """\
mask: optional tensor broadcastable to ``input`` (bool, or non-zero
    means True), on its device: only these pixels are used.  The image is
    zeroed outside it before smoothing, the smoothing is divided by the
    smoothed mask, and edges are kept only on the mask eroded by a 3x3
    square (with the image border).  Default None: every pixel."""


def _dtype_max(dtype: torch.dtype) -> float:
    return float(torch.iinfo(dtype).max) if not dtype.is_floating_point else 1.0


def _to_float(x: Tensor) -> Tensor:
    """``img_as_float``: integers times ``1 / max`` in float64 (signed: clipped at -1)."""
    dt = x.dtype
    if dt == torch.float64 or dt == torch.float32:
        return x
    if dt.is_floating_point:
        return x.to(torch.float32)
    y = x.to(torch.float64) * (1.0 / _dtype_max(dt))
    return y.clamp_min(-1.0) if torch.iinfo(dt).min < 0 else y


def _threshold(value, name, default, use_quantiles, dmax):
    if value is None:
        return default
    v = check_real(value, name)
    if use_quantiles:
        if not (0.0 <= v <= 1.0):
            raise ValueError("Quantile thresholds must be between 0 and 1.")
        return v
    return v / dmax


def _gaussian(x: Tensor, sigma, gkw) -> Tensor:
    """SciPy's ``gaussian_filter`` in ``x``'s dtype: float64 directly; float32 as SciPy computes
    it, each 1-D pass in float64 and rounded to float32 (its bits: the edge maps then equal
    scikit-image's, whose ties a float32 pass rounds differently)."""
    if x.dtype == torch.float64:
        return gaussian_filter(x, sigma, **gkw)
    sy, sx = sigma
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        y = gaussian_filter1d(x.double(), sy, -2, **gkw).float()
        return gaussian_filter1d(y.double(), sx, -1, **gkw).float()
    # CPU: the float64 temporaries from the engine's buffer cache (fresh 8-byte copies of a
    # large batch cost more in page faults than the two passes)
    a, b, t = _empty(x.shape, torch.float64), _empty(x.shape, torch.float64), _empty(x.shape, torch.float32)
    a.copy_(x)
    gaussian_filter1d(a, sy, -2, out=b, **gkw)
    t.copy_(b)  # rounded to float32, as SciPy stores its first pass
    a.copy_(t)
    gaussian_filter1d(a, sx, -1, out=b, **gkw)
    return t.copy_(b)


def _empty(shape, dtype):
    if not backends._loaded.get("cpu"):  # no numba, or not loaded yet (an auto call never waits)
        return torch.empty(shape, dtype=dtype)
    from ..backends.cpu.buffers import _alloc

    return _alloc(tuple(shape), dtype)


def _erode(mask: Tensor) -> Tensor:
    """``scipy.ndimage.binary_erosion(mask, ones((3, 3)), border_value=0)`` per slice."""
    outside = (~mask).unsqueeze(1).to(torch.float32)
    hit = F.max_pool2d(F.pad(outside, (1, 1, 1, 1), value=1.0), 3, stride=1)
    return (hit == 0).squeeze(1)


@docfiller(input=_CANNY_INPUT, mask=_CANNY_MASK)
def canny(
    input: Tensor,
    sigma=1.0,
    low_threshold: float | None = None,
    high_threshold: float | None = None,
    *,
    mask: Tensor | None = None,
    use_quantiles: bool = False,
    mode: str = "constant",
    cval: float = 0.0,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Canny edge detector: a bool edge map per ``(H, W)`` slice, as ``skimage.feature.canny``.

    The steps of scikit-image's ``feature.canny`` (0.26), with its arithmetic:

    1. smoothing: ``scipy.ndimage.gaussian_filter(x, sigma, mode=mode, cval=cval,
       truncate=4)`` of the (masked) image; with ``mode='constant'`` (that exact
       string, as scikit-image tests it) or a ``mask``, divided by the same
       Gaussian of the mask (of ones without one) plus the dtype's epsilon;
    2. ``isobel = sobel(s, axis=0)``, ``jsobel = sobel(s, axis=1)`` (SciPy's,
       mode ``'reflect'``) and ``magnitude = sqrt(isobel**2 + jsobel**2)``;
    3. non-maximum suppression along the gradient with bilinear interpolation
       between the two nearest neighbours on each side (pixels of the eroded mask
       with ``magnitude >= low_threshold``; a one-pixel border never has edges);
    4. hysteresis: the 8-connected components of the kept pixels (``magnitude > 0``)
       that contain a pixel ``>= high_threshold``.

    Thresholds given explicitly are in the input's own range: an integer image is
    converted as ``img_as_float`` converts it (divided by its dtype's maximum) and
    so are its thresholds, so a ``uint8`` image takes thresholds in 0..255.  The
    defaults (0.1 and 0.2) are in the converted ``[0, 1]`` units whatever the dtype
    (scikit-image's rule: ``low_threshold=0.1`` on ``uint8`` is not the default).
    With ``use_quantiles=True`` both are quantiles of each slice's magnitude
    (``numpy.percentile``, linear, per slice).  The low threshold is rounded to float32 (a C ``float`` in scikit-image), 0 meaning
    ``1e-14``.  Edge maps are not differentiable.

    Args:
        %(input)s
        sigma: the Gaussian's standard deviation in pixels, a number or
            ``(sigma_y, sigma_x)``; finite and ``>= 0``.  Default 1.0.
        low_threshold: the hysteresis' low bound (linking edges); None: 0.1
            (a quantile of 0.1 with ``use_quantiles``).
        high_threshold: the high bound (seeds); None: 0.2.  Must be
            ``>= low_threshold``.
        %(mask)s
        use_quantiles: treat both thresholds as quantiles in ``[0, 1]`` of
            each slice's gradient magnitude.  A bool.  Default False.
        mode: how the Gaussian extends the image past its edges, one of SciPy's
            names (``'reflect'``, ``'mirror'``, ``'nearest'``, ``'wrap'``,
            ``'constant'`` and the ``grid-`` aliases; see
            :func:`torchfilters.gaussian_filter`), one for both axes.  Default
            ``'constant'`` (scikit-image's), which also divides by the Gaussian of ones.
        %(cval)s
        out: optional bool tensor of ``input``'s shape, on its device (any
            strides, dense, without overlapping itself) to write the edge map
            into, and return; it may be ``mask`` itself (the edges are found
            first).  ``input`` is never modified.  Default None (a fresh tensor).
        %(backend)s

    Returns:
        A bool tensor shaped ``(..., H, W)`` on ``input``'s device: True on edges
        (``out`` when given).

    Raises:
        TypeError: ``input`` not a tensor, of dtype bool, complex or float8, or
            not dense; a threshold, ``sigma`` or ``cval`` not a real number;
            ``use_quantiles`` not a bool; ``mode`` not a str; ``mask`` not a
            tensor; ``out`` not a tensor, not dense, or not of dtype bool.
        ValueError: ``input`` of fewer than 2 dimensions or of dtype int64 or
            uint64; quantile thresholds outside ``[0, 1]``; ``high_threshold <
            low_threshold``; a bad ``sigma``; an unknown ``mode`` or ``backend``;
            a ``mask`` that does not broadcast to ``input`` or on another device;
            ``out`` of another shape or device, or overlapping itself.
        BackendUnavailableError: the engine ``backend`` forces cannot run the call.

    scikit-image: on each ``(H, W)`` slice ``x``, the same as
    ``skimage.feature.canny(x, sigma, low_threshold, high_threshold, mask,
    use_quantiles, mode=mode, cval=cval)``: identical edge maps for float64, float32
    and integer images (a float32 image's Gaussian is computed as SciPy computes it,
    each 1-D pass in float64 rounded to float32; the CPU engine does so inside its
    fused kernel, one row at a time).

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.zeros(1, 1, 9, 9, dtype=torch.float64)
        >>> x[..., :, 4:] = 1.0                               # a vertical step
        >>> e = tf.canny(x, sigma=1.0)
        >>> e.shape, e.dtype
        (torch.Size([1, 1, 9, 9]), torch.bool)
        >>> e[0, 0].any(dim=0).nonzero().flatten().tolist()  # the columns with edges
        [4]
    """
    check_input(input)  # the type/dtype errors every op raises
    x = input
    if x.dim() < 2:
        raise ValueError(f"input must have at least 2 dimensions (..., H, W); got shape {tuple(x.shape)}")
    if x.dtype in (torch.int64, torch.uint64):
        raise ValueError("64-bit integer images are not supported")
    uq = check_bool(use_quantiles, "use_quantiles")
    dmax = _dtype_max(x.dtype)
    low = _threshold(low_threshold, "low_threshold", 0.1, uq, dmax)
    high = _threshold(high_threshold, "high_threshold", 0.2, uq, dmax)
    if high < low:
        raise ValueError("low_threshold should be lower then high_threshold")
    sigma = check_sigma(sigma, 2)
    canonical_mode(mode)
    cval = check_cval(cval)
    backend = check_backend(backend)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a tensor broadcastable to input; got {type_name(mask)}")
        check_dense(mask, "mask")
        if mask.device != x.device:
            raise ValueError(f"mask is on {mask.device} but input on {x.device}")
        try:
            mask = torch.broadcast_to(mask if mask.dtype == torch.bool else mask != 0, x.shape)
        except RuntimeError:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to input's "
                             f"{tuple(x.shape)}") from None
    shape = x.shape
    check_out(out, shape, torch.bool, x.device)
    edges = _edges(x, mask, sigma, low, high, uq, mode, cval, backend)
    return edges if out is None else out.copy_(edges)


def _edges(x, mask, sigma, low, high, uq, mode, cval, backend):
    shape = x.shape
    H, W = shape[-2], shape[-1]
    xf = _to_float(x)
    if x.numel() == 0:
        return torch.zeros(shape, dtype=torch.bool, device=x.device)
    N = math.prod(shape[:-2])
    m3 = emask = None
    if mask is not None:
        xf = torch.where(mask, xf, torch.zeros((), dtype=xf.dtype, device=xf.device))
        # one mask slice when it is broadcast over the batch (its Gaussian computed once)
        m3 = mask[(0,) * (mask.dim() - 2)][None] if not any(mask.stride()[:-2]) else mask.reshape(N, H, W)
        emask = _erode(m3)
    image = xf.reshape(N, H, W).contiguous()
    bleed_over = mode == "constant" or mask is not None  # scikit-image's test, that exact string
    edges = _ops_canny.canny_op(image, m3, emask, sigma[0], sigma[1], mode, cval, bleed_over,
                                low, high, uq, backend)
    return edges.reshape(shape)


def smooth(image: Tensor, mask: Tensor | None, sigma, mode: str, cval: float, bleed_over: bool,
           backend: str) -> Tensor:
    """The smoothed images ``(N, H, W)`` of the engines without a fused Gaussian: SciPy's
    ``gaussian_filter`` of ``image`` (:func:`_gaussian`), divided with ``bleed_over`` by the same
    Gaussian of ``mask`` (``(1 or N, H, W)``; of ones without one) plus the dtype's epsilon."""
    gkw = {"mode": mode, "cval": cval, "truncate": 4.0, "backend": backend}
    s = _gaussian(image, sigma, gkw)
    if bleed_over:
        H, W = image.shape[-2:]
        ones = mask.to(image.dtype) if mask is not None else torch.ones((H, W), dtype=image.dtype,
                                                                        device=image.device)
        s = s / (_gaussian(ones, sigma, gkw) + torch.finfo(image.dtype).eps)
    return s.contiguous()
