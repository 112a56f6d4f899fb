"""Operator weights: derivative operators and Gaussian kernels.

Everything here is plain data (tuples of Python floats, exact in float64).
The weights are *correlation* weights: ``y[i] = sum_j w[j] * x[i + j - r]``.

Sources:
    * ``central``: ``[-1, 0, 1]`` (``numpy.gradient``'s stencil, unhalved).
    * ``sobel``: ``scipy.ndimage.sobel`` -- ``[-1, 0, 1]`` along the axis,
      ``[1, 2, 1]`` across it.
    * ``prewitt``: ``scipy.ndimage.prewitt`` -- smoothing ``[1, 1, 1]``.
    * ``scharr``: Scharr (2000), smoothing ``[3, 10, 3]``.
    * Gaussian: ``scipy.ndimage._filters._gaussian_kernel1d`` (same formula,
      same truncation ``radius = int(truncate * sigma + 0.5)``).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "OPERATORS",
    "derivative_weights",
    "gaussian_kernel1d",
    "gaussian_radius",
]

_DERIV = (-1.0, 0.0, 1.0)

#: operator name -> (derivative taps along the axis, smoothing taps across it)
OPERATORS = {
    "central": (_DERIV, (1.0,)),
    "sobel": (_DERIV, (1.0, 2.0, 1.0)),
    "scharr": (_DERIV, (3.0, 10.0, 3.0)),
    "prewitt": (_DERIV, (1.0, 1.0, 1.0)),
}

def check_operator(operator: str) -> str:
    if not isinstance(operator, str):
        raise TypeError(f"operator must be a str, one of {sorted(OPERATORS)}; got {type(operator).__name__}")
    if operator not in OPERATORS:
        raise ValueError(f"unknown operator={operator!r}; accepted: {', '.join(map(repr, OPERATORS))}")
    return operator


def derivative_weights(operator: str):
    """Return the unnormalised ``(deriv, smooth)`` correlation taps of ``operator``.

    ``normalized=True`` in :mod:`torchfilters.functional` divides the result
    by ``sum(|deriv|) * sum(smooth)`` (its ``_derivative_stencil`` scales the
    last pass, so that ``mode='constant'``'s ``cval`` padding is divided too).
    """
    return OPERATORS[check_operator(operator)]


def gaussian_radius(sigma: float, truncate: float) -> int:
    """SciPy's radius: ``int(truncate * sigma + 0.5)``."""
    return int(truncate * float(sigma) + 0.5)


def gaussian_kernel1d(sigma: float, order: int, radius: int):
    """Correlation taps of a 1-D Gaussian (derivative of ``order``), length ``2*radius+1``.

    Identical to the weights ``scipy.ndimage.gaussian_filter1d`` correlates
    with (``_gaussian_kernel1d(sigma, order, radius)[::-1]``); order 0 sums to 1.
    """
    if order < 0:
        raise ValueError(f"order must be 0, 1 or 2; got {order}")
    sigma2 = float(sigma) * float(sigma)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    phi = np.exp(-0.5 / sigma2 * x**2)
    phi = phi / phi.sum()
    if order == 0:
        k = phi
    else:
        exponent_range = np.arange(order + 1)
        q = np.zeros(order + 1)
        q[0] = 1
        D = np.diag(exponent_range[1:], 1)  # D @ q(x) = q'(x)
        P = np.diag(np.ones(order) / -sigma2, -1)  # P @ q(x) = q(x) * p'(x)
        Q = D + P
        for _ in range(order):
            q = Q.dot(q)
        q = (x[:, None] ** exponent_range).dot(q)
        k = q * phi
    k = k[::-1]  # SciPy correlates with the reversed kernel
    return tuple(k.tolist())
