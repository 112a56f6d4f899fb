"""**Direct 3x3 path.**  Gradient-type specs -- every operator's stencils are 1-D
passes of three taps at offsets -1, 0, 1 -- in the modes that fold onto samples
(all but ``constant``) skip the tile: with contiguous rows in and out, a kernel
specialised per (stencil forms, epilogue) reads the input in place, one long
flat loop over a plane's interior rows (taps at constant flat offsets: loads,
taps, epilogue and store in one vectorised pass; the lanes of columns 0 and
W-1 take their folded neighbour by a select: a sample they read anyway where
the fold is a neighbour in the row (reflect, nearest, mirror), else one loaded
at a run-time offset (wrap)), the first/last rows through the row fold (their
border columns through the column fold).
It runs the passes in the spec's order, each summed in SciPy's order
(``_lowering.pass_kind``: ``w1*b + (a -+ c)*w0`` for the derivative and
smoothing taps), as the general engine and the reference do:
the same bits, signs of zero included.  For the magnitude (which squares the
signs of zero away) the run leaves the zero centre taps of the first pass out
when an integer max over the exponent bits of the samples it read shows them
all finite, and over those of its sums of squares shows none over- or
underflowed; otherwise it redoes itself with them, rescaling those sums
(``SAFE``).  It asks for its input and output lines a few KiB ahead, the
output for writing.  This is what brings a batch of 28x28 planes and a
4096x4096 image near the memory floor.

Kernels are specialised on the stencil forms (the kind and order of each pass, not its
weights: Sobel, Prewitt and Scharr share them), the epilogue and the mode's column class,
never on the image size, with one exception: outputs larger than
the last-level cache, of planes at least 256 wide, use a streaming-store variant
(``STREAM``), which ``torchfilters warmup`` compiles ahead.
"""

from __future__ import annotations

import math
from typing import NamedTuple
import os

import numpy as np
from numba import njit, types
from numba.extending import overload

from .forward import _atan2
from .plan import _fold, _stack, _whole_planes
from .._lowering import ANTI, SYM, pass_kind
from .prims import (
    _JIT, _OVL_LITERAL, _cvt, _expo, _expo_all, _fence, _hyp2, _ld, _line, _mag_flag, _prefetch_r, _prefetch_w, _ptr,
    _sel, _st, _stream_line,
)
from .tables import EPI_DIR, EPI_MAG, EPI_STACK, EPI_SUM, L_N, R_O, R_X, _poff

# =============================================================================
# direct 3x3 path: gradient-type specs read the input in place (no tile)
#
# Every gradient operator (central, Sobel, Scharr, Prewitt) is a pair of
# stencils whose 1-D passes have three taps at offsets -1, 0, 1.  For those,
# in the boundary modes that fold onto image samples (all but ``constant``),
# the output is computed straight from the input: one long flat loop over the
# interior rows of a plane (the taps are constant flat offsets, so it
# vectorises; the lanes of columns 0 and W-1 select their outer neighbour from
# the column fold: ``EDGE`` / ``MIRR`` / ``FAR``), the first and
# last rows through the row fold (their border columns through the column
# fold).
# No tile copy, no intermediate pass buffers: about a third of the work of the
# general engine, which is what makes a batch of 28x28 planes run near the
# memory floor.  Outputs larger than the last-level cache, of wide planes, are
# written with non-temporal stores through a line buffer (``STREAM``).

D_H, D_W, D_BR, D_NB, D_MP, D_FY0, D_FY1, D_FX0, D_FX1 = range(9)
FORM_H, FORM_V, FORM_VH, ZV, ZH = 1, 2, 3, 4, 8
#: form flag: leave the zero centre taps out (``x * 0`` is +-0 for finite ``x``, so on finite
#: samples the sum changes only in the sign of a zero; run only after a finiteness check)
SKIPZ = 1 << 16
#: form flags of the interior run, over whole rows: the lanes of column 0 / W-1 (classes 1 / 2)
#: take their outer neighbour from the column fold, selects instead of scalar fix-ups of the
#: border columns: ``EDGE`` the column itself (reflect, nearest) and ``MIRR`` the column on the
#: other side (mirror), both samples the lane reads anyway; ``FAR`` a sample loaded at a
#: run-time offset from the column (wrap: the row's other end).  (One kernel for all three, the
#: offsets at run time, cost 10-45% in cache: more registers than the loop has, or two more
#: loads per row and side)
EDGE, MIRR, FAR = 1 << 17, 1 << 18, 1 << 27
FOLDS = EDGE | MIRR | FAR
#: form flag for a run into an output larger than the cache: whole output lines go through a
#: line buffer and non-temporal stores (``_stream_line``), the partial lines at its ends directly
STREAM = 1 << 19
#: form flags: the two-pass form sums its horizontal pass first (the spec's order: SciPy's, which
#: the signs of zero and the rounding follow); the kind of the vertical / horizontal pass
#: (``_lowering.pass_kind``: KSYM symmetric, KANTI antisymmetric, else general) at bits
#: ``KV_SHIFT`` / ``KH_SHIFT``; ``SAFE``: the magnitude rescaled where its sum of squares
#: over/underflows (``prims._hyp2``; the rerun of a run or row that flagged one)
HFIRST = 1 << 20
KV_SHIFT, KH_SHIFT = 21, 23
KSYM, KANTI, KDENSE = 1, 2, 3  # (KDENSE: a dense 1x3 / 3x1 stencil, its taps in order)
SAFE = 1 << 25
#: form flag (with SKIPZ, the magnitude): the run checks its sums of squares only, not its
#: samples -- a non-finite sample makes the sum of squares of a neighbour in the run non-finite
#: (a stencil reads the horizontal neighbours with non-zero weights: ``_d3_plan``), and the
#: run's first and last centre samples are checked after it
SQONLY = 1 << 26
_d3_kernels: dict = {}
#: the flags of a form that a stencil (``_d3_st``) reads (not SAFE, STREAM, SQONLY: the
#: epilogue's and the run's)
_ST_BITS = ~(SAFE | STREAM | SQONLY)
#: the flags a position (``_d3_pixel``) reads: its stencils' and SAFE
_PX_BITS = ~(STREAM | SQONLY)


class D3Plan(NamedTuple):
    """The direct path's plan: the kernel and its tables (``D`` sizes and folds, ``F`` weights,
    ``T`` lane classes) and the number of work items."""

    kernel: object
    D: np.ndarray
    F: np.ndarray
    T: np.ndarray
    nitems: int


_d3_cache: dict = {}


# The direct kernels are closures over integers only (form and epilogue codes: numba's disk
# cache keys on the closure's values, and jitted functions in it would differ per process).
# The helpers below are overloads that specialise on those integers as literals, so each
# kernel compiles only its own stencils and epilogue.


def _d3_st(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):  # pragma: no cover - overload below
    raise NotImplementedError


def _d3_lr(FORM, x, p, l, r, t):  # pragma: no cover
    raise NotImplementedError


def _d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2):  # pragma: no cover
    raise NotImplementedError


def _d3_out(FORM, EPI, K, o, oq, osK, a, b):  # pragma: no cover
    raise NotImplementedError


def _d3_pixel(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):  # pragma: no cover
    raise NotImplementedError


def _d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, a, b, T, tq, w, e):  # pragma: no cover
    raise NotImplementedError


def _d3_run(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):  # pragma: no cover
    raise NotImplementedError


def _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1, whole):  # pragma: no cover
    raise NotImplementedError


def _literal(*codes):
    return all(isinstance(c, types.IntegerLiteral) for c in codes)


def _p3(CODE, w0, w1, w2, a, b, c):  # pragma: no cover - overload below
    raise NotImplementedError


def _pass3(f, zero_flag, kshift, first):
    """The literal code of one 3-tap pass of form ``f`` for :func:`_p3`: its kind (bits
    ``kshift``) and whether its zero centre tap is left out (SKIPZ, ``zero_flag`` set, and the
    ``first`` pass: it multiplies a sample, finite there, and ``x * 0`` is +-0; a second pass
    keeps it, as an overflowed intermediate times 0 is NaN in SciPy too).  The weights are
    run-time values: one kernel serves every operator of a form (Sobel, Prewitt, Scharr,
    ``normalized`` or not)."""
    skip = bool(first and f & SKIPZ and f & zero_flag)
    return ((f >> kshift) & 3) | (skip << 2)


@overload(_p3, jit_options=_OVL_LITERAL)
def _ol_p3(CODE, w0, w1, w2, a, b, c):
    """One 3-tap pass on samples ``a, b, c`` (offsets -1, 0, 1) in SciPy's order
    (``NI_Correlate1D``): (anti)symmetric ``w1*b + (a +- c)*w0`` (the pair times the left
    weight), general ``(w2*c + w0*a) + w1*b``."""
    if not _literal(CODE):
        return None
    code = CODE.literal_value
    kind, skip = code & 3, code & 4
    if kind == KSYM:
        if skip:
            return lambda CODE, w0, w1, w2, a, b, c: w0 * (a + c)
        return lambda CODE, w0, w1, w2, a, b, c: w1 * b + w0 * (a + c)
    if kind == KANTI:
        if skip:
            return lambda CODE, w0, w1, w2, a, b, c: w0 * (a - c)
        return lambda CODE, w0, w1, w2, a, b, c: w1 * b + w0 * (a - c)
    if kind == KDENSE:  # a dense stencil's taps in order, from +0.0, as SciPy's N-D correlate and
        # the general engine sum them (``((0 + t0) + t1) + t2`` is ``((t0 + t1) + t2) + 0``: only a
        # sum of -0.0 terms changes; ``w1 - w1`` is +0.0, the weights being finite)
        return lambda CODE, w0, w1, w2, a, b, c: ((w0 * a + w1 * b) + w2 * c) + (w1 - w1)
    if skip:
        return lambda CODE, w0, w1, w2, a, b, c: w2 * c + w0 * a
    return lambda CODE, w0, w1, w2, a, b, c: (w2 * c + w0 * a) + w1 * b


@overload(_d3_lr, jit_options=_OVL_LITERAL)
def _ol_d3_lr(FORM, x, p, l, r, t):
    """(left, right) neighbours of flat position ``p``: ``x[p + l]``, ``x[p + r]``; in the
    interior run (``l, r = -1, 1``; ``t`` is ``(class, fl, fr)``) the lanes of column 0 (class
    1) take the column fold's neighbour instead: under ``EDGE`` the column itself, under
    ``MIRR`` its right neighbour, under ``FAR`` ``x[p + fl]``; those of column W-1 (class 2)
    likewise (``fr``)."""
    if not _literal(FORM):
        return None
    f = FORM.literal_value
    if f & EDGE:

        def edge(FORM, x, p, l, r, t):
            c = _ld(x, p)
            a = _ld(x, p + l)
            b = _ld(x, p + r)
            return _sel(t[0] == 1, c, a), _sel(t[0] == 2, c, b)

        return edge
    if f & MIRR:

        def mirr(FORM, x, p, l, r, t):
            a = _ld(x, p + l)
            b = _ld(x, p + r)
            return _sel(t[0] == 1, b, a), _sel(t[0] == 2, a, b)

        return mirr
    if f & FAR:

        def far(FORM, x, p, l, r, t):
            c, fl, fr = t
            return _sel(c == 1, _ld(x, p + fl), _ld(x, p + l)), _sel(c == 2, _ld(x, p + fr), _ld(x, p + r))

        return far
    return lambda FORM, x, p, l, r, t: (_ld(x, p + l), _ld(x, p + r))


@overload(_d3_ac, jit_options=_OVL_LITERAL)
def _ol_d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2):
    """The vertical pass (the first one) on the left and right neighbour columns of ``mid``
    (FORM_VH)."""
    if not _literal(FORM):
        return None
    f = FORM.literal_value
    PV = _pass3(f, ZV, KV_SHIFT, True)
    LR = f & FOLDS

    def ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2):
        ul, ur = _d3_lr(LR, x, up, l, r, t)
        ml, mr = _d3_lr(LR, x, mid, l, r, t)
        dl, dr = _d3_lr(LR, x, dn, l, r, t)
        return _p3(PV, v0, v1, v2, ul, ml, dl), _p3(PV, v0, v1, v2, ur, mr, dr)

    return ac


@overload(_d3_st, jit_options=_OVL_LITERAL)
def _ol_d3_st(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
    """One stencil at flat position ``mid`` (rows above/below at ``up``/``dn``, columns at
    offsets ``l``/``r``): FORM_H ``h . x[row, l/c/r]``, FORM_V ``v . x[up/mid/dn, c]``, FORM_VH
    ``h . (v . x)`` (vertical pass first), or with HFIRST ``v . (h . x)``: the spec's order;
    each pass in SciPy's order (:func:`_p3`); ``| ZV`` / ``| ZH``: the vertical / horizontal
    centre tap is 0.  Every tap is
    multiplied, zeros too (SciPy's 1-D passes: a NaN under a 0 tap is NaN), but under SKIPZ."""
    if not _literal(FORM):
        return None
    f = FORM.literal_value
    LR = f & FOLDS
    if f & 3 == FORM_H:
        PH = _pass3(f, ZH, KH_SHIFT, True)

        def h(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
            ml, mr = _d3_lr(LR, x, mid, l, r, t)
            return _p3(PH, h0, h1, h2, ml, _ld(x, mid), mr)

        return h
    if f & 3 == FORM_V:
        PV = _pass3(f, ZV, KV_SHIFT, True)
        return lambda FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2: _p3(
            PV, v0, v1, v2, _ld(x, up), _ld(x, mid), _ld(x, dn))
    if f & HFIRST:
        PH = _pass3(f, ZH, KH_SHIFT, True)
        PV = _pass3(f, ZV, KV_SHIFT, False)

        def hv(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
            ul, ur = _d3_lr(LR, x, up, l, r, t)
            ml, mr = _d3_lr(LR, x, mid, l, r, t)
            dl, dr = _d3_lr(LR, x, dn, l, r, t)
            hu = _p3(PH, h0, h1, h2, ul, _ld(x, up), ur)
            hm = _p3(PH, h0, h1, h2, ml, _ld(x, mid), mr)
            hd = _p3(PH, h0, h1, h2, dl, _ld(x, dn), dr)
            return _p3(PV, v0, v1, v2, hu, hm, hd)

        return hv
    PV = _pass3(f, ZV, KV_SHIFT, True)
    PH = _pass3(f, ZH, KH_SHIFT, False)

    def vh(FORM, x, up, mid, dn, l, r, t, v0, v1, v2, h0, h1, h2):
        a, c = _d3_ac(FORM, x, up, mid, dn, l, r, t, v0, v1, v2)
        b = _p3(PV, v0, v1, v2, _ld(x, up), _ld(x, mid), _ld(x, dn))
        return _p3(PH, h0, h1, h2, a, b, c)

    return vh


@njit(**_JIT)
def _hyp1(a):
    """``sqrt(a*a)``, and ``|a|`` where ``a*a`` over/underflows (``prims._hyp2`` for one stencil)."""
    s = a * a
    if _mag_flag(s, a != 0) == _expo_all(s) and s == s:
        return abs(a)
    return math.sqrt(s)


@overload(_d3_out, jit_options=_OVL_LITERAL)
def _ol_d3_out(FORM, EPI, K, o, oq, osK, a, b):
    """The epilogue and the store (``b``: the second stencil, unused when ``K == 1``).  Returns
    the magnitude's flag (``prims._mag_flag``: ``_expo_all`` where its sum of squares over- or
    underflowed; under ``SAFE`` those are rescaled), ``a``'s exponent bits otherwise (unused)."""
    if not _literal(FORM, EPI, K):
        return None
    epi, k = EPI.literal_value, K.literal_value
    safe = FORM.literal_value & SAFE
    if k == 1 and epi == EPI_MAG:

        def mag1(FORM, EPI, K, o, oq, osK, a, b):
            s = a * a
            _st(o, oq, _hyp1(a) if safe else math.sqrt(s))
            return _mag_flag(s, a != 0)

        return mag1
    if epi == EPI_MAG:

        def mag2(FORM, EPI, K, o, oq, osK, a, b):
            s = a * a + b * b
            _st(o, oq, _hyp2(a, b) if safe else math.sqrt(s))
            return _mag_flag(s, (a != 0) | (b != 0))

        return mag2
    if k == 1:

        def one(FORM, EPI, K, o, oq, osK, a, b):
            _st(o, oq, a)
            return _expo(a)

        return one
    if epi == EPI_DIR:

        def dirn(FORM, EPI, K, o, oq, osK, a, b):
            _st(o, oq, _atan2(a, b))
            return _expo(a)

        return dirn
    if epi == EPI_SUM:

        def add(FORM, EPI, K, o, oq, osK, a, b):
            s = a + b
            _st(o, oq, s)
            return _expo(s)

        return add

    def stack(FORM, EPI, K, o, oq, osK, a, b):
        _st(o, oq, a)
        _st(o, oq + osK, b)
        return _expo(a)

    return stack


@overload(_d3_pixel, jit_options=_OVL_LITERAL)
def _ol_d3_pixel(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):
    """Stencil ``F0`` (and ``F1`` if ``K == 2``) at one position, the epilogue, the store;
    returns ``_d3_out``'s flag."""
    if not _literal(F0, F1, EPI, K):
        return None
    # (each helper gets only the flags it reads: its specialisations are shared between kernels)
    A, B = F0.literal_value & _ST_BITS, F1.literal_value & _ST_BITS
    OF = F0.literal_value & SAFE
    if K.literal_value == 1:

        def one(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):
            a = _d3_st(A, x, up, mid, dn, l, r, t, w[0], w[1], w[2], w[3], w[4], w[5])
            return _d3_out(OF, EPI, K, o, oq, osK, a, a)

        return one

    def two(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, l, r, t, w):
        a = _d3_st(A, x, up, mid, dn, l, r, t, w[0], w[1], w[2], w[3], w[4], w[5])
        b = _d3_st(B, x, up, mid, dn, l, r, t, w[6], w[7], w[8], w[9], w[10], w[11])
        return _d3_out(OF, EPI, K, o, oq, osK, a, b)

    return two


@overload(_d3_span, jit_options=_OVL_LITERAL)
def _ol_d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, a, b, T, tq, w, e):
    """Positions ``a .. b-1`` of a run (left/right neighbours at -1/+1), stored at ``o[oq + q]``:
    the vectorised loop.  With ``SKIPZ`` in ``F0`` it returns the max of ``e`` and ``_expo``
    over the centre samples it read, and for the magnitude of its flags too (``_d3_out``).  With
    ``EDGE`` / ``MIRR`` / ``FAR``, ``tq`` is ``(i, fl, fr)``: ``T[i + q]`` is the column class of
    position ``q``, ``fl`` / ``fr`` the offsets of the fold's neighbours (``_d3_lr``)."""
    if not _literal(F0, F1, EPI, K):
        return None
    check = F0.literal_value & SKIPZ and not F0.literal_value & SQONLY
    folds = F0.literal_value & FOLDS
    magc = EPI.literal_value == EPI_MAG
    P0, P1 = F0.literal_value & _PX_BITS, F1.literal_value & _PX_BITS

    def span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, a, b, T, tq, w, e):
        for q in range(a, b):
            t = (T[tq[0] + q], tq[1], tq[2]) if folds else 0
            fl = _d3_pixel(P0, P1, EPI, K, o, oq + q, osK, x, up + q, mid + q, dn + q, -1, 1, t, w)
            if magc:
                e = max(e, fl)
            if check:
                e = max(e, _expo(_ld(x, mid + q)))
        return e

    return span


@overload(_d3_run, jit_options=_OVL_LITERAL)
def _ol_d3_run(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):
    """``n`` consecutive positions in chunks of a few cache lines, each first asking for the
    input and output lines further on (prefetching the output for writing overlaps its
    read-for-ownership with the work).  Returns ``_d3_span``'s ``e``.  Under ``STREAM`` each
    whole output line of the run is computed into ``bp`` (64-byte aligned, one chunk) and
    stored non-temporally; ``omis`` is ``o``'s misalignment in elements."""
    if not _literal(F0, F1, EPI, K):
        return None
    k2 = K.literal_value == 2 and EPI.literal_value == EPI_STACK
    stream = F0.literal_value & STREAM
    check = F0.literal_value & SKIPZ and not F0.literal_value & SQONLY
    folds = F0.literal_value & FOLDS
    magc = EPI.literal_value == EPI_MAG
    P0, P1 = F0.literal_value & _PX_BITS, F1.literal_value & _PX_BITS

    def run_stream(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):
        line = _line(x)
        ahead = _D3_AHEAD * line
        ch = _D3_STREAM_CHUNK * line
        a = min(n, (line - (omis + oq) % line) % line)  # up to the first whole line
        b = a + (n - a) // line * line  # the last whole line's end
        e = _d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, 0, a, T, tq, w, _expo(_ld(x, mid)))
        for c in range(a, b, ch):
            cb = min(c + ch, b)
            for k in range(c + ahead, c + ahead + ch, line):
                _prefetch_r(x, dn + k)
            e = _d3_span(F0, F1, EPI, K, bp, -c, osK, x, up, mid, dn, c, cb, T, tq, w, e)
            for j in range(0, cb - c, line):
                _stream_line(o, oq + c + j, bp, j)
        return _d3_span(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, b, n, T, tq, w, e)

    def run(F0, F1, EPI, K, o, oq, osK, x, up, mid, dn, n, T, tq, w, omis, bp):
        line = _line(x)
        ahead = _D3_AHEAD * line
        ch = _D3_CHUNK * line
        e = _expo(_ld(x, mid))
        for c in range(0, n, ch):
            for k in range(c + ahead, c + ahead + ch, line):
                _prefetch_r(x, dn + k)
                _prefetch_w(o, oq + k)
                if k2:
                    _prefetch_w(o, oq + osK + k)
            # (_d3_span's loop, written out: one function less to compile per kernel, 0.4 s of
            # the first gradient_magnitude call)
            for q in range(c, min(c + ch, n)):
                t = (T[tq[0] + q], tq[1], tq[2]) if folds else 0
                fl = _d3_pixel(P0, P1, EPI, K, o, oq + q, osK, x, up + q, mid + q, dn + q, -1, 1, t, w)
                if magc:
                    e = max(e, fl)
                if check:
                    e = max(e, _expo(_ld(x, mid + q)))
        return e

    return run_stream if stream else run


@overload(_d3_row, jit_options=_OVL_LITERAL)
def _ol_d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1, whole):
    """Row ``i`` outside the interior run: the whole row if it is the first or last (the row
    fold) or ``whole`` (an interior row redone, or one a ``FAR`` run leaves), and its column 0 /
    W-1 if ``c0`` / ``c1`` (the column fold).  Returns the max of the magnitude's flags (``_d3_out``; and of exponents:
    ``_expo_all`` only where one is inf/NaN)."""
    if not _literal(F0, F1, EPI, K):
        return None
    P0, P1 = F0.literal_value & _PX_BITS, F1.literal_value & _PX_BITS

    def row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1, whole):
        up = xb + (i - 1 if i > 0 else fy0) * W
        dn = xb + (i + 1 if i < H - 1 else fy1) * W
        mid = xb + i * W
        oi = ob + i * W
        e = _expo(_ld(x, mid))
        if (whole or i == 0 or i == H - 1) and W > 2:
            e = _d3_run(F0, F1, EPI, K, o, oi + 1, osK, x, up + 1, mid + 1, dn + 1, W - 2, T, 0, w, 0, o)
        if c0:
            e = max(e, _d3_pixel(P0, P1, EPI, K, o, oi, osK, x, up, mid, dn, dl0, np.int64(1) if W > 1 else dr1, 0,
                                 w))
        if c1 and W > 1:
            j = W - 1
            e = max(e, _d3_pixel(P0, P1, EPI, K, o, oi + j, osK, x, up + j, mid + j, dn + j, np.int64(-1), dr1, 0,
                                 w))
        return e

    return row


@njit(inline="always", **_JIT)
def _expo_max(x, a, n):
    """max of ``_expo`` over ``x[a : a + n]`` (n >= 1): ``_expo_all`` iff one is inf or NaN."""
    e = _expo(_ld(x, a))
    for q in range(1, n):
        e = max(e, _expo(_ld(x, a + q)))
    return e


#: the direct run's chunk and prefetch distance, in cache lines (measured on (a2): 4 and 128
#: beat 8/16 and 32/64/256 by 5-10%; without prefetching the run took 1.3x as long)
_D3_CHUNK, _D3_AHEAD = 4, 128
#: the chunk (line buffer) of a ``STREAM`` run, in cache lines
_D3_STREAM_CHUNK = 16
#: elements per row block of a large plane on the direct path
_D3_TILE = 1 << 17
#: the interior run takes the border columns of its rows (``FOLDS``: 28x28 planes 240 -> 215 ns
#: each in cache against recomputing them, wrap 0.99 -> 0.75 ms for 1024 of them; on wide planes
#: the selects cost within noise: 2048x2048 Sobel, one thread, 2.7-3.1 ms with or without), in
#: the modes whose fold is a neighbour in the row from the samples it reads (``EDGE``, ``MIRR``),
#: in the others (wrap) by a load (``FAR``)
_D3_FOLD = {"reflect": EDGE, "nearest": EDGE, "mirror": MIRR}


def _llc_bytes():
    """The last-level cache's size (Linux sysfs: the largest of cpu0's caches), else 32 MiB."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    sizes = []
    try:
        for d in os.listdir(base):
            if d.startswith("index"):
                with open(os.path.join(base, d, "size")) as f:
                    t = f.read().strip()
                sizes.append(int(t[:-1]) << {"K": 10, "M": 20, "G": 30}[t[-1]] if t[-1] in "KMG" else int(t))
    except (OSError, ValueError):
        pass
    return max(sizes, default=32 << 20)


#: outputs of at least this many bytes (the last-level cache) of planes at least this wide take
#: non-temporal stores on the direct path (``STREAM``): writing a line without reading it first
#: saves a third of the memory traffic of a one-pass op (4096x4096 float32, 2 threads: 3.4 ->
#: 2.5 ms for a copy; Sobel magnitude 5.5-7.8 -> 4.1-7.1 ms on a Zen 4 host).  Batches of
#: small planes did not gain (28x28: the line buffer's extra pass costs what the stores save)
_STREAM_BYTES = _llc_bytes()
_STREAM_MIN_W = 256


def _sq_only(forms):
    """Whether a stencil of ``forms`` reads both horizontal neighbours with non-zero weights (then
    a magnitude run may check its sums of squares instead of its samples: ``SQONLY``)."""
    for f in forms:
        if f & 3 == FORM_H or (f & 3 == FORM_VH and not f & ZV):
            return True
    return False


def _d3_kernel(FORMS, EPI, FK, STRM):
    """The direct kernel for one or two stencils of the given forms and one epilogue, built
    (and compiled) on first use.  Its closure holds only integers (the disk cache keys on
    them); every constant is known to the compiler, so the interior loop is one fused,
    vectorised pass (loads, taps, epilogue, store).  ``FK``: how its interior run takes the border
    columns' neighbours, ``EDGE``, ``MIRR`` or ``FAR`` (:func:`_d3_lr`).
    ``STRM``: 0, or ``STREAM`` for non-temporal stores of the runs' whole output lines (one
    output, larger than the cache: ``_d3_plan``)."""
    key = (FORMS, EPI, FK, STRM)
    k = _d3_kernels.get(key)
    if k is not None:
        return k
    K = len(FORMS)
    F0 = FORMS[0]
    F1 = FORMS[-1]
    # zero centre taps are left out of the interior run when its samples are all finite (the
    # check: one integer max-reduction over the rows it reads); not for the direction, whose
    # atan2 tells the signs of zero apart
    # (and only for the magnitude, which squares away the signs of zero that the zero centre
    # taps decide: the derivatives and the direction keep SciPy's; the magnitude's run always
    # checks, its sums of squares too: a rerun rescales them, ``SAFE``)
    SKIP = EPI == EPI_MAG
    MAGK = EPI == EPI_MAG
    SF = SAFE if MAGK else 0
    SQ = SQONLY if MAGK and _sq_only(FORMS) else 0
    S0 = F0 | SKIPZ | FK | STRM | SQ
    S1 = F1 | SKIPZ | FK
    R0 = F0 | FK | STRM  # (the run of the other epilogues)
    R1 = F1 | FK
    G0 = F0 | SF  # the rows again, where their magnitude flagged a pixel
    G1 = F1 | SF
    CHB = _D3_STREAM_CHUNK * 64 + 64 if STRM else 0
    FAR_K = FK == FAR

    @njit(**_JIT)
    def kernel(xa, oa, carrier, Da, Fa, Ta, La, it0, it1):
        x = _ptr(xa, carrier)
        o = _ptr(oa, carrier)
        F = _cvt(carrier, Fa)
        w = (F[0], F[1], F[2], F[3], F[4], F[5], F[6], F[7], F[8], F[9], F[10], F[11])
        H, W = Da[D_H], Da[D_W]
        BR, NB, MP = Da[D_BR], Da[D_NB], Da[D_MP]
        fy0, fy1 = Da[D_FY0], Da[D_FY1]
        dl0 = Da[D_FX0]  # column 0's left neighbour (an offset from column 0)
        dr1 = Da[D_FX1] - (W - 1)  # column W-1's right neighbour
        # a FAR run loads every lane's fold neighbours (``x[p + dl0]``, ``x[p + dr1]``: in wrap mode
        # W-1 columns away in its three rows, so up to two rows away) before selecting: then its
        # rows are 2 .. H-3, and rows 1 and H-2 go whole through the row code (else the loads of a
        # plane's first and last run reach before / past the tensor: a fault where no masked loads
        # hide them, as on AVX2)
        FR = 1 if FAR_K and (dl0 > 1 or dr1 < -1) else 0
        N = La[L_N]
        xn1, xs1, on1, os1, osK = La[R_X], La[R_X + 2], La[R_O], La[R_O + 2], La[R_O + 3]
        L = _ptr(La.ctypes.data, La[0])
        T = _ptr(Ta.ctypes.data, Ta[0])
        line = _line(o)
        eall = _expo_all(w[0])
        omis = (oa // (64 // line)) % line
        buf = np.empty(CHB, np.uint8)  # STREAM: the line buffer, from its first 64-byte boundary
        bp = _ptr((buf.ctypes.data + 63) // 64 * 64, carrier)
        for it in range(it0, it1):
            p0 = (it // NB) * MP
            ra = (it % NB) * BR
            rb = min(H, ra + BR)
            ia = max(ra, 1 + FR)  # interior rows ia .. ib
            ib = min(rb, H - 1 - FR)
            xb = _poff(L, np.int64(R_X), p0)
            ob = _poff(L, np.int64(R_O), p0)
            xr = p0 % xn1
            orr = p0 % on1
            for p in range(p0, min(p0 + MP, N)):
                if p > p0:  # the next plane, without an integer division per plane
                    xr += 1
                    orr += 1
                    if xr == xn1:
                        xr = 0
                        xb = _poff(L, np.int64(R_X), p)
                    else:
                        xb += xs1
                    if orr == on1:
                        orr = 0
                        ob = _poff(L, np.int64(R_O), p)
                    else:
                        ob += os1
                # interior rows ia .. ib-1, one flat run over whole rows; the lanes of columns 0
                # and W-1 select their outer neighbours from the column fold by their classes (T:
                # 1 / 2 at columns 0 / W-1, from row ra; offsets dl0 / dr1: FK).  Its taps read
                # rows ia-1 .. ib, and a vector reads the left / right neighbours of all its lanes
                # (before the select): the plane's first run starts at column 1 of row 1 and its
                # last ends at column W-2 of row H-2 (else they would read x[-1] / x[H*W]); those
                # two pixels go through the row code, in every row blocking (so every pixel's
                # code, and a NaN's sign where two meet, is the same whatever the threads)
                run = ib > ia and W > 2
                redo = False
                s0 = ia == 1
                s1 = ib == H - 1
                if run:
                    q0 = ia * W + s0
                    n = (ib - ia) * W - s0 - s1
                    tq = q0 - ra * W
                    if SKIP:
                        e = _d3_run(S0, S1, EPI, K, o, ob + q0, osK, x, xb + q0 - W, xb + q0, xb + q0 + W, n, T,
                                    (tq, dl0, dr1), w, omis, bp)
                        e = max(e, _expo_max(x, xb + (ia - 1) * W, W), _expo_max(x, xb + ib * W, W),
                                _expo(_ld(x, xb + q0 - 1)), _expo(_ld(x, xb + q0 + n)), _expo(_ld(x, xb + q0)),
                                _expo(_ld(x, xb + q0 + n - 1)))
                        redo = e == eall
                    if not SKIP:
                        _d3_run(R0, R1, EPI, K, o, ob + q0, osK, x, xb + q0 - W, xb + q0, xb + q0 + W, n, T,
                                (tq, dl0, dr1), w, omis, bp)
                # (the magnitude's run flagged a sample or a sum of squares: its rows ia .. ib-1 are
                # redone whole, row by row, by the rescaling row code below -- rare, and one run
                # variant less to compile)
                n_re = ib - ia if redo else 0
                # what the run did not take: the first / last row (the row fold), every row of a
                # block without a run, the run's first / last pixel where it leaves them (the
                # column fold), and the rows a magnitude redoes; one loop over (row, column 0?,
                # column W-1?) tasks, so that each row variant has one call site (each site is a
                # copy of the row's code: compile time)
                if STRM and n_re > 0:
                    _fence()  # (the rows redone are stored over the run's)
                n_top = ia - ra if run else rb - ra
                n_bot = rb - ib if run else 0
                e0 = run and s0
                e1 = run and s1
                for k in range(n_re + n_top + n_bot + e0 + e1):
                    c0 = c1 = True
                    whole = k < n_re
                    kt = k - n_re
                    if whole:
                        i = ia + k
                    elif kt < n_top:
                        i = ra + kt
                    elif kt < n_top + n_bot:
                        i = ib + (kt - n_top)
                    elif kt == n_top + n_bot and e0:
                        i, c1 = ia, False
                    else:
                        i, c0 = ib - 1, False
                    full = whole or (FR == 1 and (i == 1 or i == H - 2))  # (rows a FAR run leaves)
                    # (only the magnitude redoes rows: the other kernels have one row variant, and
                    # the branch on the closure constant is pruned before typing -- compile time)
                    if not MAGK:
                        _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1, full)
                    elif whole or _d3_row(F0, F1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0,
                                          c1, full) == eall:
                        _d3_row(G0, G1, EPI, K, o, ob, osK, x, xb, i, H, W, fy0, fy1, dl0, dr1, T, w, c0, c1, full)
        if STRM:
            _fence()  # the non-temporal stores are visible to the thread that returns the output
        return F.size + Da.size + La.size + Ta.size + buf.size

    return _d3_kernels.setdefault(key, kernel)  # (a concurrent first call may have built one)


def _d3_form(vt, ht, dt, passes=()):
    """(form, [v0, v1, v2, h0, h1, h2]) of a normalised stencil the direct path runs, else None:
    1-D passes of three taps at offsets -1, 0, 1, none zero or only the centre one; the form
    carries each pass's kind (``_lowering.pass_kind``: its order of summation) and, for two
    passes, which one the spec runs first (``HFIRST``).  A dense stencil's weights must be
    finite (its sum starts at +0.0 as ``w1 - w1``: ``_p3``); others go to the general engine."""

    def three(taps, axis):
        w = {t[axis]: t[2] for t in taps}
        if len(taps) != 3 or sorted(w) != [-1, 0, 1] or any(t[1 - axis] != 0 for t in taps):
            return None
        if w[-1] == 0.0 or w[1] == 0.0 or (not passes and not all(math.isfinite(v) for v in w.values())):
            return None
        return [w[-1], w[0], w[1]]

    def kcode(w):
        if not passes:  # dense (no zero taps): the taps in order
            return KDENSE
        k = pass_kind(tuple(w))
        return KSYM if k == SYM else (KANTI if k == ANTI else 0)

    def code(base, w):
        c = base | (ZV if w[1] == 0.0 else 0) | (ZH if w[4] == 0.0 else 0)
        c |= (kcode(w[:3]) << KV_SHIFT) | (kcode(w[3:]) << KH_SHIFT)
        return c, w

    if vt and ht:
        v, h = three(vt, 0), three(ht, 1)
        hfirst = HFIRST if passes and passes[0].axis == -1 else 0
        return None if v is None or h is None else code(FORM_VH | hfirst, v + h)
    v, h = three(dt, 0), three(dt, 1)
    if h is not None:
        return code(FORM_H, [0.0, 1.0, 0.0] + h)  # unused vertical taps (a non-zero centre: no ZV)
    if v is not None:
        return code(FORM_V, v + [0.0, 1.0, 0.0])
    return None


def _d3_plan(info, H, W, N, nthreads, itemsize, aligned):
    """(kernel, D, F, T, work items) for the direct 3x3 path, or None when the spec is not of
    that kind.  ``aligned``: the output's address is a multiple of ``itemsize`` (its lines can
    be streamed)."""
    key = (id(info), H, W, N, nthreads, itemsize, aligned)
    hit = _d3_cache.get(key)
    if hit is not None and hit[0] is info:
        return hit[1]
    norm, epi, mode = info.norm, info.epi, info.mode
    forms = [_d3_form(vt, ht, dt, passes) for vt, ht, dt, passes in norm]
    plan = None
    if epi in (EPI_STACK, EPI_MAG, EPI_DIR, EPI_SUM) and mode != "constant" and len(forms) in (1, 2) and all(forms):
        fy = _fold(H, -1, H + 2, mode)
        fx = _fold(W, -1, W + 2, mode)
        if fy.min() >= 0 and fx.min() >= 0:  # a guard: every mode but constant folds onto samples
            if _whole_planes(H * W, N, H, W, nthreads):
                BR, NB, MP = H, 1, _stack(H * W, N, nthreads)
            else:
                # row blocks of about _D3_TILE elements (fewer halo rows than the general
                # engine's tiles: 4096x4096 Sobel 2.6 -> 2.2 ms), at least 4 per thread
                BR, MP = max(1, min(H, _D3_TILE // W, -(-H // (4 * nthreads)))), 1
                NB = -(-H // BR)
            D = np.array([H, W, BR, NB, MP, fy[0], fy[-1], fx[0], fx[-1]], np.int64)
            F = np.array([w for f in forms for w in f[1]] + [0.0] * 6 * (2 - len(forms)), np.float64)
            # the run selects the border columns' folded neighbours per lane, ``x[p + fx[0]]`` in
            # column 0 and ``x[p + fx[-1] - (W-1)]`` in column W-1 (rows of at least three
            # columns have a run; narrower ones go through the row fold alone)
            T = np.zeros(BR * W if W > 2 else 1, np.uint8)
            if W > 2:
                T[0::W] = 1
                T[W - 1 :: W] = 2
            fk = _D3_FOLD.get(mode, FAR)
            if fk != FAR and W > 2:  # (the run's EDGE / MIRR lanes assume these folds)
                assert (int(fx[0]), int(fx[-1])) == ((0, W - 1) if fk == EDGE else (1, W - 2)), (mode, fx)
            # non-temporal stores for one output larger than the cache (two would need the
            # same alignment), of wide planes (long runs; a fence orders them before the rows
            # of a run that a magnitude redoes)
            strm = 0
            if (N * H * W * itemsize >= _STREAM_BYTES and (len(forms) == 1 or epi != EPI_STACK) and W >= _STREAM_MIN_W
                    and aligned and H > 2):
                strm = STREAM
            plan = D3Plan(_d3_kernel(tuple(f[0] for f in forms), epi, fk, strm), D, F, T, -(-N // MP) * NB)
    if len(_d3_cache) > 1024:
        _d3_cache.clear()
    _d3_cache[key] = (info, plan)
    return plan
