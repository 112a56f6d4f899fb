"""torchfilters: fast, exact, differentiable image filters for batched PyTorch tensors.

Every op acts on 1, 2 or 3 axes of a tensor (``axes=``; by default the last two of
``(..., H, W)``) with ``scipy.ndimage``'s semantics (mode names and meanings, any radius on any
size), exact finite gradients, and fused CPU (numba) / GPU (Triton) engines.

    >>> import torch, torchfilters as tf
    >>> x = torch.rand(8, 3, 32, 32)
    >>> tf.gradient_magnitude(x, operator="sobel").shape
    torch.Size([8, 3, 32, 32])
"""

import importlib.metadata as _metadata

from . import backends, kernels, nn
from .backends import BackendUnavailableError, empty_cache
from .functional import (
    canny,
    convolve,
    convolve1d,
    correlate,
    correlate1d,
    derivative,
    difference_of_gaussians,
    gaussian_filter,
    gaussian_filter1d,
    gaussian_gradient_magnitude,
    gaussian_laplace,
    gradient,
    gradient_direction,
    gradient_magnitude,
    laplace,
    maximum_filter,
    maximum_filter1d,
    median_filter,
    minimum_filter,
    minimum_filter1d,
    percentile_filter,
    prewitt,
    rank_filter,
    scharr,
    selective_blur,
    sobel,
    uniform_filter,
    uniform_filter1d,
    unsharp_mask,
)

try:
    __version__ = _metadata.version("torchfilters")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "BackendUnavailableError",
    "backends",
    "canny",
    "convolve",
    "convolve1d",
    "correlate",
    "correlate1d",
    "derivative",
    "difference_of_gaussians",
    "empty_cache",
    "gaussian_filter",
    "gaussian_filter1d",
    "gaussian_gradient_magnitude",
    "gaussian_laplace",
    "gradient",
    "gradient_direction",
    "gradient_magnitude",
    "kernels",
    "laplace",
    "maximum_filter",
    "maximum_filter1d",
    "median_filter",
    "minimum_filter",
    "minimum_filter1d",
    "nn",
    "percentile_filter",
    "prewitt",
    "rank_filter",
    "scharr",
    "selective_blur",
    "sobel",
    "uniform_filter",
    "uniform_filter1d",
    "unsharp_mask",
]
