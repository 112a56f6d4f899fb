"""Rank filters (median, minimum, maximum, percentile) on the Triton engine.

Placeholder: runs the reference engine until the fused kernels land.
"""

from __future__ import annotations

from . import reference

__all__ = ["rank_forward", "rank_backward"]


def rank_forward(x, spec, out=None):
    return reference.rank_forward(x, spec, out)


def rank_backward(grad, x, y, spec, out=None):
    return reference.rank_backward(grad, x, y, spec, out)
