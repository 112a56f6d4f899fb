"""The direct 3x3x3 gradient: which specs the CPU and Triton engines run on their direct
gradient kernels (``cpu/volume_direct``, ``triton/volume``), and with which weights.

The rule, lowered once here for both: a ``FilterSpec`` of three axes whose three stencils are
the gradient of 3-tap smoothings (symmetric; the last may differ from the middle one:
``normalized``) and a 3-tap derivative ``(wl, wc, -wl)`` (SciPy's antisymmetric form): stencil
``k`` the derivative along one axis, then the smoothing along the other two in axis order -- SciPy's ``sobel`` order, what ``functional`` builds for
``sobel`` / ``prewitt`` / ``scharr`` on three ``axes`` in any order; epilogues ``magnitude``
and ``stack`` (and the magnitude's backward scale; on the CPU also one component alone); every
mode per axis, ``constant`` only with
``cval = +0`` (then SciPy's sequential padding is the zero padding of the input).
"""

from __future__ import annotations

import math

import numpy as np

from .._spec import FilterSpec, axis_mode
from ._lowering import ANTI, SYM, pass_kind

__all__ = ["direct_plan", "modes3"]


def modes3(spec):
    """The boundary mode of each of the three volume axes."""
    return tuple(axis_mode(spec.mode, a, spec.ndim) for a in (-3, -2, -1))


def direct_plan(spec, epilogue: str | None = None, one: bool = False):
    """``(weights, order)`` of ``spec`` (already ``lower``-ed) when the direct path runs it
    (``epilogue`` overrides the spec's: ``"magscale"``), else None: the weights
    ``[wc, wl, s0, s1, 0, t0, t1]`` (float64: the derivative's centre and left tap, the middle
    smoothing's, a zero, the last smoothing's -- ``normalized`` scales the last pass alone), and
    per stencil the axis (0, 1, 2: z, y, x) of its derivative (``axes`` in any order: the
    components come in the spec's order).  ``one``: also a single component (``sobel(x, axis,
    axes=...)``, epilogue ``stack``), its axis repeated three times."""
    n = len(spec.stencils) if isinstance(spec, FilterSpec) else 0
    if not isinstance(spec, FilterSpec) or spec.ndim != 3 or n not in ((1, 3) if one else (3,)):
        return None
    epi = epilogue or spec.epilogue
    if epi not in ("magnitude", "stack", "magscale") or (n == 1 and epi != "stack"):
        return None
    modes = modes3(spec)
    if "constant" in modes and (spec.cval != 0.0 or math.copysign(1.0, spec.cval) < 0):
        return None
    taps = None
    order = []
    for st in spec.stencils:
        if st.kind != "sep" or len(st.passes) != 3:
            return None
        axes = [p.axis for p in st.passes]
        want = [axes[0]] + [a for a in (-3, -2, -1) if a != axes[0]]  # SciPy's: the others in order
        order.append(axes[0] + 3)
        if axes != want or any(p.lo != -1 or len(p.taps) != 3 for p in st.passes):
            return None
        d, s1, s2 = (tuple(float(w) for w in p.taps) for p in st.passes)
        if pass_kind(d) != ANTI or pass_kind(s1) != SYM or pass_kind(s2) != SYM:
            return None
        if taps is None:
            taps = (d, s1, s2)
        elif (d, s1, s2) != taps:
            return None
    d, s1, s2 = taps
    w = (d[1], d[0], s1[1], s1[0], 0.0, s2[1], s2[0])
    if not all(math.isfinite(v) for v in w) or (n == 3 and sorted(order) != [0, 1, 2]):
        return None
    return np.asarray(w, np.float64), tuple(order * (3 // n))
