"""Gaussian enhancement filters: unsharp masking and the difference of Gaussians.

Both are linear, so each is one spec of two Gaussian stencils under the ``sum`` epilogue (the
second stencil's last pass scaled), run in one fused pass forward and one backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Union

from torch import Tensor

from .._docs import docfiller
from .._validate import check_real
from ._core import copy_result, prep, run
from .gaussian import check_sigma, gaussian_radii, increasing

__all__ = ["difference_of_gaussians", "unsharp_mask"]

Number = Union[int, float]


@docfiller(scipy="``x + amount * (x - scipy.ndimage.gaussian_filter(x, sigma, mode=mode,\ncval=cval, truncate=truncate, axes=axes))``")
def unsharp_mask(
    input: Tensor,
    sigma: Number | Sequence[Number] = 1.0,
    amount: float = 1.0,
    *,
    mode: str = "reflect",
    cval: float = 0.0,
    truncate: float = 4.0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Sharpen: ``x + amount * (x - gaussian_filter(x, sigma))``, in one fused pass.

    Computed as ``(1 + amount) * x - amount * gaussian_filter(x, sigma)``, which equals the
    definition up to rounding for finite samples (at an infinite one, with ``-1 < amount < 0``,
    this form gives the infinity where the definition's ``inf - inf`` gives NaN).  scikit-image's ``unsharp_mask(x, radius=sigma, amount=amount,
    preserve_range=True)`` on float input (which does not clip either); its ``mode='reflect'`` is
    fixed in its code, here it is the default of ``mode``.  Integer input is promoted to float32
    (as everywhere in torchfilters), not rescaled to ``[0, 1]`` as scikit-image does without
    ``preserve_range``.  The Gaussian's passes run in increasing axis order whatever the order
    of ``axes`` (scikit-image's ``gaussian`` filters every axis).  Differentiable.

    Args:
        %(input)s
        %(sigma)s
        %(amount)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: ``sigma``, ``amount`` or ``truncate`` not a real number.
        ValueError: bad ``sigma`` or ``truncate`` (as :func:`gaussian_filter`); ``amount``
            not finite.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
        >>> y = tf.unsharp_mask(x, 1.0, amount=1.0, axes=-1)
        >>> bool(y[0, 1] < 0 < 1 < y[0, 2])   # overshoot on both sides of the edge
        True
    """
    x, lay, modes, cval = prep(input, mode, cval, axes)
    k = len(lay.axes)
    sigmas = check_sigma(sigma, k)
    amount = check_real(amount, "amount", allow_inf=False)
    if not math.isfinite(amount):
        raise ValueError(f"amount must be finite; got {amount}")
    radii = gaussian_radii(sigmas, truncate, None)
    if amount == 0.0 or all(s <= 1e-15 for s in sigmas):
        return copy_result(x, out, backend)
    a, sigmas, radii = increasing(lay, sigmas, radii)
    recipes = (("sep", ((a[0], 0, (1.0 + amount,)),)), ("gauss_scaled", sigmas, radii, a, -amount))
    return run(x, lay, modes, cval, "sum", recipes, out, backend)


@docfiller(
    scipy=(
        "``skimage.filters.difference_of_gaussians(x, low_sigma, high_sigma,\n"
        "mode=mode, cval=cval, truncate=truncate)`` for float ``x``"
    )
)
def difference_of_gaussians(
    input: Tensor,
    low_sigma: Number | Sequence[Number],
    high_sigma: None | Number | Sequence[Number] = None,
    *,
    mode: str = "nearest",
    cval: float = 0.0,
    truncate: float = 4.0,
    axes=None,
    out: Tensor | None = None,
    backend: str | None = None,
) -> Tensor:
    """Band-pass: ``gaussian_filter(x, low_sigma) - gaussian_filter(x, high_sigma)``, fused.

    scikit-image's definition and defaults: ``high_sigma = 1.6 * low_sigma`` when not given
    (about a Laplacian of Gaussian), ``mode='nearest'``, and ``high_sigma`` must not be below
    ``low_sigma`` on any axis.  Integer input is promoted to float32, not rescaled to
    ``[0, 1]`` as scikit-image's ``img_as_float`` does.  Differentiable.

    Args:
        %(input)s
        %(low_sigma)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(axes)s
        %(out)s
        %(backend)s

    Returns:
        %(returns)s

    Raises:
        TypeError: a sigma or ``truncate`` not a real number.
        ValueError: bad sigmas or ``truncate`` (as :func:`gaussian_filter`); ``high_sigma``
            below ``low_sigma`` on some axis.
        %(raises)s

    %(matches)s

    Example:
        >>> import torch, torchfilters as tf
        >>> x = torch.zeros(9, 9); x[4, 4] = 1.0
        >>> bool(tf.difference_of_gaussians(x, 1.0)[4, 4] > 0)   # a bright blob's centre
        True
    """
    x, lay, modes, cval = prep(input, mode, cval, axes)
    k = len(lay.axes)
    low = check_sigma(low_sigma, k)
    high = tuple(1.6 * s for s in low) if high_sigma is None else check_sigma(high_sigma, k)
    if any(lo > hi for lo, hi in zip(low, high)):
        raise ValueError(f"high_sigma must be >= low_sigma on every axis; got low_sigma={low}, high_sigma={high}")
    a, low, rlow = increasing(lay, low, gaussian_radii(low, truncate, None))
    _, high, rhigh = increasing(lay, high, gaussian_radii(high, truncate, None))
    recipes = (("gauss_scaled", low, rlow, a, 1.0), ("gauss_scaled", high, rhigh, a, -1.0))
    return run(x, lay, modes, cval, "sum", recipes, out, backend)
