"""The hysteresis of ``torchfilters.canny`` on the CPU (numba): flood fills on the classes.

The classes (``(N, H * W)`` uint8: 0 suppressed, 1 low, 2 seed; 0 on the border) are changed in
place: a pixel 8-connected through class 1 and 2 pixels to a seed becomes class 3, and the bool
map is ``cls == 3``.  With one band a slice the fused kernel (``canny._k_fused``) runs
:func:`_hyst_band` and :func:`_reached` on its slice right after classifying it; with several,
:func:`_k_hyst` fills each band on its own (in parallel), :func:`_k_seams` continues from the
reached pixels of the two rows at every seam through the whole slice, and :func:`_k_reached`
writes the map.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import cache

cache.install()

from .prims import _JIT

__all__ = ["_hyst_band", "_k_hyst", "_k_reached", "_k_seams", "_reached"]


@njit(inline="always", **_JIT)
def _fill(c, stack, top, W, p0, p1):
    """Pop the stack until empty, reaching the class 1 and 2 neighbours (8-connected) of each
    pixel (class 3) within ``[p0, p1)``: a reached pixel becomes class 3 and is pushed.  The
    tests do not branch: each neighbour (or, outside ``[p0, p1)``, the pixel itself, class 3)
    is written to the top of the stack, which grows by one where it was class 1 or 2.  Classes
    are 0 on the border, so the neighbours of a class pixel are in range."""
    one = np.uint8(1)
    three = np.uint8(3)
    while top > 0:
        top -= 1
        q = stack[top]
        for d in (-W - 1, -W, -W + 1, -1, 1, W - 1, W, W + 1):
            r = q + d
            r = r if (r >= p0) & (r < p1) else q
            v = c[r]
            f = np.uint8(v - one) < 2
            stack[top] = r
            top += f
            c[r] = three if f else v


@njit(inline="always", **_JIT)
def _hyst_band(c, stack, W, p0, p1):
    """The flood fill from every seed of ``c[p0:p1]`` within it (``c`` one slice, flat)."""
    for p in range(p0, p1):
        if c[p] == 2:  # (seeds pushed without a branch, then one fill, measured the same)
            c[p] = 3
            stack[0] = p
            _fill(c, stack, 1, W, p0, p1)


@njit(inline="always", **_JIT)
def _reached(c, o):
    """``o = c == 3`` (views of equal length: the loop vectorises)."""
    for p in range(c.shape[0]):
        o[p] = c[p] == 3


@njit(**_JIT)
def _k_hyst(cls, W, nb, it0, it1):
    """Hysteresis, in place, per work item ``(slice, band)``: a flood fill from every seed
    (class 2) of the band through the low pixels (class 1) of the band; reached pixels become
    class 3.  ``cls`` is ``(N, H * W)``.  Paths that cross a band seam are followed by
    :func:`_k_seams`."""
    _N, HW = cls.shape
    H = HW // W
    stack = np.empty((H // nb + 2) * W + 1, np.int64)
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        p0 = (b * H // nb) * W
        p1 = ((b + 1) * H // nb) * W
        _hyst_band(cls[n], stack, W, p0, p1)


@njit(**_JIT)
def _k_seams(cls, W, nb, it0, it1):
    """After :func:`_k_hyst` with ``nb`` bands a slice: from every reached pixel (class 3) of
    the two rows at each seam, the flood fill through the whole slice, per slice.  A path from
    a seed first leaves its band from a pixel of one of those rows, which the band's fill
    reached; so every pixel connected to a seed is reached."""
    _N, HW = cls.shape
    H = HW // W
    stack = np.empty(HW + 1, np.int64)
    for n in range(it0, it1):
        c = cls[n]
        top = 0
        for b in range(1, nb):
            i = b * H // nb
            for p in range((i - 1) * W, (i + 1) * W):
                stack[top] = p
                top += c[p] == 3
        _fill(c, stack, top, W, 0, HW)


@njit(**_JIT)
def _k_reached(cls, out, nb, it0, it1):
    """``out = cls == 3`` per work item ``(slice, band)`` (``(N, H * W)`` both)."""
    _N, HW = cls.shape
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        p0 = b * HW // nb
        p1 = (b + 1) * HW // nb
        _reached(cls[n, p0:p1], out[n, p0:p1])
