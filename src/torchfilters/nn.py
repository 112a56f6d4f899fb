"""``torch.nn.Module`` wrappers of the functional ops (no parameters; weights are constants).

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

__all__ = ["GradientMagnitude", "GaussianFilter", "SelectiveBlur"]


class GradientMagnitude(torch.nn.Module):
    """Module form of :func:`torchfilters.gradient_magnitude`: ``(..., H, W)`` -> ``(..., H, W)``."""

    def __init__(self, operator: str = "central", mode: str = "reflect", cval: float = 0.0, normalized: bool = False):
        super().__init__()
        self.operator, self.mode, self.cval, self.normalized = operator, mode, cval, normalized
        F.gradient_magnitude(torch.zeros(1, 1), operator=operator, mode=mode, cval=cval, normalized=normalized)

    def forward(self, input: Tensor) -> Tensor:
        return F.gradient_magnitude(
            input, operator=self.operator, mode=self.mode, cval=self.cval, normalized=self.normalized
        )

    def extra_repr(self) -> str:
        return f"operator={self.operator!r}, mode={self.mode!r}, cval={self.cval}, normalized={self.normalized}"


class GaussianFilter(torch.nn.Module):
    """Module form of :func:`torchfilters.gaussian_filter`: ``(..., H, W)`` -> ``(..., H, W)``."""

    def __init__(self, sigma, order=0, mode: str = "reflect", cval: float = 0.0, truncate: float = 4.0, radius=None):
        super().__init__()
        self.sigma, self.order, self.mode, self.cval = sigma, order, mode, cval
        self.truncate, self.radius = truncate, radius
        self(torch.zeros(1, 1))  # validate arguments now, not at the first batch

    def forward(self, input: Tensor) -> Tensor:
        return F.gaussian_filter(
            input, self.sigma, order=self.order, mode=self.mode, cval=self.cval,
            truncate=self.truncate, radius=self.radius,
        )

    def extra_repr(self) -> str:
        return (f"sigma={self.sigma!r}, order={self.order!r}, mode={self.mode!r}, cval={self.cval}, "
                f"truncate={self.truncate}, radius={self.radius!r}")


class SelectiveBlur(torch.nn.Module):
    """Module form of :func:`torchfilters.selective_blur`.

    ``forward(input, mask=None)``: ``(..., H, W)`` -> ``(..., H, W)``.
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

    def forward(self, input: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return F.selective_blur(
            input, self.threshold, mask=mask, sigma=self.sigma, weights=self.weights,
            normalized=self.normalized, keep_border=self.keep_border, mode=self.mode, cval=self.cval,
        )

    def extra_repr(self) -> str:
        kernel = f"weights={self.weights!r}" if self.weights is not None else f"sigma={self.sigma!r}"
        return (f"threshold={self.threshold}, {kernel}, normalized={self.normalized}, "
                f"keep_border={self.keep_border}, mode={self.mode!r}, cval={self.cval}")
