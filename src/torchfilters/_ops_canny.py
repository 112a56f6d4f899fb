"""``torchfilters::canny_edges``: the ``torch.library`` custom op behind :func:`torchfilters.canny`.

``canny_edges(smoothed, eroded_mask?, low, high, use_quantiles, backend) -> edges`` takes the
smoothed images ``(N, H, W)`` (contiguous, float32 or float64) and the eroded mask (bool,
``(N, H, W)``, or None for "all but a one-pixel border") and returns the bool edge map
``(N, H, W)``: Sobel, magnitude, thresholds, non-maximum suppression and hysteresis, on the
engine :func:`engine` picks.  The op has a fake implementation, so ``torch.compile`` traces
it; it has no gradient (edges are a boolean map).
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
from torch import Tensor

from ._ops import defer_dynamo
from .backends import CANNY_MODULES, resolve

_LIB = "torchfilters"


def engine(backend: str, device: torch.device, dtype: torch.dtype):
    """The module whose ``canny_edges`` runs a ``device``/``dtype`` tensor for ``backend``: the
    engine :func:`torchfilters.backends.resolve` picks (``cpu``, ``triton``, ``reference``)."""
    mod = resolve(backend, device, dtype)
    fn = getattr(mod, "canny_edges", None)
    if fn is not None:
        return mod
    name = getattr(mod, "NAME", "reference")
    return importlib.import_module(CANNY_MODULES.get(name, ".reference_canny"), "torchfilters.backends")


@torch.library.custom_op(f"{_LIB}::canny_edges", mutates_args=())
def canny_edges_op(smoothed: Tensor, eroded_mask: Optional[Tensor], low: float, high: float,  # noqa: UP045
                   use_quantiles: bool, backend: str) -> Tensor:
    eng = engine(backend, smoothed.device, smoothed.dtype)
    return eng.canny_edges(smoothed, eroded_mask, low, high, use_quantiles)


@canny_edges_op.register_fake
def _(smoothed, eroded_mask, low, high, use_quantiles, backend):
    return smoothed.new_empty(smoothed.shape, dtype=torch.bool)


@torch.library.custom_op(f"{_LIB}::canny", mutates_args=())
def canny_op(image: Tensor, mask: Optional[Tensor], eroded_mask: Optional[Tensor],  # noqa: UP045
             sigma_y: float, sigma_x: float, mode: str, cval: float, bleed_over: bool,
             low: float, high: float, use_quantiles: bool, backend: str) -> Tensor:
    """The edges of the converted (and masked) images ``(N, H, W)``, smoothing included.
    ``mask``/``eroded_mask``: bool ``(1 or N, H, W)``.  An engine with ``canny_fused`` (the CPU
    one) smooths inside its fused kernel; the others get the Gaussian of
    :func:`torchfilters.functional.canny.smooth` and run ``canny_edges``."""
    eng = engine(backend, image.device, image.dtype)
    sigma = (sigma_y, sigma_x)
    fused = getattr(eng, "canny_fused", None)
    if fused is not None:
        out = fused(image, mask, eroded_mask, sigma, mode, cval, bleed_over, low, high, use_quantiles)
        if out is not None:
            return out
    from .functional.canny import smooth

    s = smooth(image, mask, sigma, mode, cval, bleed_over, backend)
    em = None if eroded_mask is None else eroded_mask.expand(image.shape).contiguous()
    return eng.canny_edges(s, em, low, high, use_quantiles)


@canny_op.register_fake
def _(image, mask, eroded_mask, sigma_y, sigma_x, mode, cval, bleed_over, low, high, use_quantiles, backend):
    return image.new_empty(image.shape, dtype=torch.bool)


defer_dynamo(canny_edges_op, canny_op)
