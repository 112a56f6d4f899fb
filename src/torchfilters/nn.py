"""``torch.nn.Module`` wrappers of the functional ops (no parameters; weights are constants).

Each module checks its arguments when it is built and passes them to its
function on every ``forward``; the argument paragraphs are the functions'
own (:mod:`torchfilters._docs`).

    >>> import torch, torchfilters
    >>> m = torchfilters.nn.GradientMagnitude(operator="sobel")
    >>> m(torch.rand(2, 3, 16, 16)).shape
    torch.Size([2, 3, 16, 16])
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import functional as F
from ._docs import docfiller

__all__ = ["GradientMagnitude", "GaussianFilter", "SelectiveBlur"]


@docfiller
class GradientMagnitude(torch.nn.Module):
    """Module form of :func:`torchfilters.gradient_magnitude`: ``(..., H, W)`` -> ``(..., H, W)``.

    ``forward(input)`` returns
    ``torchfilters.gradient_magnitude(input, operator=..., mode=..., cval=..., normalized=...)``
    with this module's arguments (the default engine, no ``out=``).

    Args:
        %(operator)s
        %(mode)s
        %(cval)s
        %(normalized)s

    Example:
        >>> import torch, torchfilters as tf
        >>> m = tf.nn.GradientMagnitude(operator="sobel", mode="nearest")
        >>> m
        GradientMagnitude(operator='sobel', mode='nearest', cval=0.0, normalized=False)
        >>> m(torch.arange(5.0).repeat(5, 1))[2]
        tensor([4., 8., 8., 8., 4.])
    """

    def __init__(self, operator: str = "central", mode: str = "reflect", cval: float = 0.0, normalized: bool = False):
        super().__init__()
        self.operator, self.mode, self.cval, self.normalized = operator, mode, cval, normalized
        F.gradient_magnitude(torch.zeros(1, 1), operator=operator, mode=mode, cval=cval, normalized=normalized)

    @docfiller(out_note="")
    def forward(self, input: Tensor) -> Tensor:
        """The gradient magnitude of ``input`` with this module's arguments.

        Args:
            %(input)s

        Returns:
            %(returns)s
        """
        return F.gradient_magnitude(
            input, operator=self.operator, mode=self.mode, cval=self.cval, normalized=self.normalized
        )

    def extra_repr(self) -> str:
        return f"operator={self.operator!r}, mode={self.mode!r}, cval={self.cval}, normalized={self.normalized}"


@docfiller
class GaussianFilter(torch.nn.Module):
    """Module form of :func:`torchfilters.gaussian_filter`: ``(..., H, W)`` -> ``(..., H, W)``.

    ``forward(input)`` returns
    ``torchfilters.gaussian_filter(input, sigma, order=..., mode=..., cval=..., truncate=..., radius=...)``
    with this module's arguments (the default engine, no ``out=``).

    Args:
        %(sigma)s
        %(order)s
        %(mode)s
        %(cval)s
        %(truncate)s
        %(radius)s
    """

    def __init__(self, sigma, order=0, mode: str = "reflect", cval: float = 0.0, truncate: float = 4.0, radius=None):
        super().__init__()
        self.sigma, self.order, self.mode, self.cval = sigma, order, mode, cval
        self.truncate, self.radius = truncate, radius
        self(torch.zeros(1, 1))  # validate arguments now, not at the first batch

    @docfiller(out_note="")
    def forward(self, input: Tensor) -> Tensor:
        """``input`` filtered with this module's Gaussian.

        Args:
            %(input)s

        Returns:
            %(returns)s
        """
        return F.gaussian_filter(
            input, self.sigma, order=self.order, mode=self.mode, cval=self.cval,
            truncate=self.truncate, radius=self.radius,
        )

    def extra_repr(self) -> str:
        return (f"sigma={self.sigma!r}, order={self.order!r}, mode={self.mode!r}, cval={self.cval}, "
                f"truncate={self.truncate}, radius={self.radius!r}")


@docfiller
class SelectiveBlur(torch.nn.Module):
    """Module form of :func:`torchfilters.selective_blur`: ``(..., H, W)`` -> ``(..., H, W)``.

    ``forward(input, mask=None)`` returns
    ``torchfilters.selective_blur(input, threshold, mask=mask, sigma=..., weights=..., ...)``
    with this module's arguments (the default engine, ``truncate=4.0``, no
    ``out=``); ``mask`` is the function's (a bool tensor broadcastable to
    ``input``, overriding ``threshold``).  ``weights`` are kept as nested
    tuples of floats (constants for ``torch.compile``).

    Args:
        %(threshold)s
        %(sigma)s
            Default None (the kernel is ``weights``, or the binomial).
        %(blur_weights)s
        %(blur_normalized)s
        %(keep_border)s
        %(mode)s
        %(cval)s
    """

    def __init__(
        self,
        threshold: float = 0.0,
        *,
        sigma=None,
        weights=None,
        normalized: bool = False,
        keep_border: bool = False,
        mode: str = "reflect",
        cval: float = 0.0,
    ):
        super().__init__()
        self.threshold, self.sigma, self.normalized = threshold, sigma, normalized
        self.keep_border, self.mode, self.cval = keep_border, mode, cval
        # nested tuples of floats: constants for torch.compile(fullgraph=True), no state to save
        self.weights = None if weights is None else F._weights_tuple(weights, 2)
        self(torch.zeros(1, 1))

    @docfiller(out_note="")
    def forward(self, input: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """``input`` blurred where it passes the test, with this module's arguments.

        Args:
            %(input)s
            %(mask)s

        Returns:
            %(returns)s
        """
        return F.selective_blur(
            input, self.threshold, mask=mask, sigma=self.sigma, weights=self.weights,
            normalized=self.normalized, keep_border=self.keep_border, mode=self.mode, cval=self.cval,
        )

    def extra_repr(self) -> str:
        kernel = f"weights={self.weights!r}" if self.weights is not None else f"sigma={self.sigma!r}"
        return (f"threshold={self.threshold}, {kernel}, normalized={self.normalized}, "
                f"keep_border={self.keep_border}, mode={self.mode!r}, cval={self.cval}")
