"""Public filters on tensors, over 1, 2 or 3 of their axes (``axes=``; by default the last two).

With the default ``axes=(-2, -1)`` every function filters ``H`` (axis -2, y, rows) and ``W``
(axis -1, x, columns) and treats leading axes as independent images; ``axes`` names any 1,
2 or 3 distinct axes instead (volumes ``(B, C, D, H, W)``, video ``(B, T, C, H, W)`` over
``T, H, W``, signals ``(..., L)``).  Semantics are ``scipy.ndimage``'s, applied to each slice
of the chosen axes: the same mode names and meanings (one per axis if wished), any kernel
radius on any size (a radius larger than the axis and axes of size 1 included).

Gradients with respect to the input are exact (``gradcheck`` in float64)
and finite everywhere; filter weights are constants.

Each argument is described once, in :mod:`torchfilters._docs`, and filled
into every docstring that takes it (SciPy's ``docfiller``).  The ones every
op shares:

Args:
    %(input)s
    %(mode)s
    %(cval)s
    %(axes)s
    %(out)s
    %(backend)s

Modules: ``_core`` (axes, spec strings, the call into the engines), ``correlate``
(correlate, convolve and their 1-D forms, the uniform filter), ``derivatives`` (derivatives,
gradients, the Laplacian), ``gaussian`` (the Gaussian family), ``blur`` (selective blur), ``enhance`` (unsharp mask, difference of Gaussians), ``rank`` (minimum, maximum, median, rank and percentile filters).
"""

from __future__ import annotations

from .. import _docs
from ._core import _blur_text, _filter_text  # noqa: F401  (spec strings, for tests and tools)
from .blur import selective_blur
from .canny import canny
from .correlate import (
    convolve,
    convolve1d,
    correlate,
    correlate1d,
    uniform_filter,
    uniform_filter1d,
)
from .derivatives import (
    derivative,
    gradient,
    gradient_direction,
    gradient_magnitude,
    laplace,
    prewitt,
    scharr,
    sobel,
)
from .enhance import difference_of_gaussians, unsharp_mask
from .gaussian import (
    gaussian_filter,
    gaussian_filter1d,
    gaussian_gradient_magnitude,
    gaussian_laplace,
)
from .rank import (
    maximum_filter,
    maximum_filter1d,
    median_filter,
    minimum_filter,
    minimum_filter1d,
    percentile_filter,
    rank_filter,
)

__doc__ = _docs.fill(__doc__)

__all__ = [
    "convolve",
    "convolve1d",
    "correlate",
    "correlate1d",
    "derivative",
    "difference_of_gaussians",
    "gaussian_filter",
    "gaussian_filter1d",
    "gaussian_gradient_magnitude",
    "gaussian_laplace",
    "gradient",
    "gradient_direction",
    "gradient_magnitude",
    "laplace",
    "maximum_filter",
    "maximum_filter1d",
    "median_filter",
    "minimum_filter",
    "minimum_filter1d",
    "percentile_filter",
    "prewitt",
    "rank_filter",
    "scharr",
    "selective_blur",
    "sobel",
    "uniform_filter",
    "uniform_filter1d",
    "unsharp_mask",
    "canny",
]
