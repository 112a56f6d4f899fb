"""Fused Triton engine: one forward kernel and one backward kernel run every spec.

CUDA tensors of float16 / bfloat16 / float32 / float64 (and CPU tensors under
``TRITON_INTERPRET=1``, which is how CI tests this file).  Same interface as
:mod:`.reference`, which is the oracle (its NaN, zero-tap, threshold and
keep-border rules included).

Design
------
*Operators are data.*  A spec (:mod:`torchfilters._spec`) is lowered on the
host, once per ``(spec, H, W, dtype, device[, threshold])``, to small device
tables plus constexprs:

* a **forward footprint**: the union of the (at most two) stencils' taps as
  offsets ``(dy, dx)`` with one weight per stencil, ordered *stencil 0 only*,
  *both*, *stencil 1 only* (a tap never multiplies a NaN into a stencil it is
  not part of).  A ``sep`` stencil is the outer product of its passes, zero
  taps kept (SciPy's 1-D passes multiply every tap); a ``dense`` one drops its
  zero taps (SciPy's 2-D correlate);
* an **adjoint footprint**: the same without zero weights (the reference's
  adjoint skips them);
* **constant-mode corrections** for two-pass ``sep`` stencils: SciPy pads the
  *outer* pass with ``cval``, not with the inner pass of ``cval`` rows; the
  outer product gives ``wB * cval * sum(wA)`` for a tap whose outer coordinate
  is outside where SciPy has ``wB * cval``, so a 1-D term
  ``cval * (1 - sum(wA)) * wB`` is added along the outer axis;
* **preimage slots** (:func:`_slots`) for the backward: per axis, the padded
  positions ``j`` outside the image and the pixel ``p = fold(j)`` they copy,
  as bands ``j = A p + B`` over a ``p`` interval, or (nearest mode) runs of
  ``j`` all folding onto one edge pixel.

The forward kernel evaluates the footprint on a ``[planes, rows, cols]`` tile,
folding 1-D row and column index vectors per tap (reflect / mirror / nearest /
wrap / constant, any radius, 1x1 images) -- no padding copies, no
temporaries -- and applies the epilogue (``stack``, ``magnitude``,
``direction``, selective-blur ``blend`` / ``normalized``).  Small planes
(28x28) put several planes in one program; large images use 2-D tiles whose
halo reads hit L1/L2.  Unrolled taps (up to 32) have constant offsets.

The backward kernel is the adjoint, gathered (no atomics, one store): for an
input pixel ``p`` it sums ``w_t * u(q)`` over taps ``t`` and every ``q`` with
``fold(q + d_t) = p``.  The main term is ``q = p - d_t`` (the correlation of
``u`` with the flipped footprint); border pixels add the other preimages,
evaluated on bands of a few rows / columns and placed into the register tile
with ``tl.gather``.  ``u`` is each stencil's upstream gradient: ``grad`` for
``stack``, ``g y_k / |y|`` (0 where ``|y| = 0``) for ``magnitude``,
``g (y1, -y0) / |y|^2`` for ``direction``, ``w g`` for ``blend`` and
``use g / blur(m)`` for ``normalized``, recomputed from ``x`` at each
neighbour.  Past ``_RECOMPUTE_MAX`` taps that recompute would cost ``NT**2``,
so the forward kernel first writes ``u`` to a float32 buffer and the backward
reads it (two launches, linear cost).

Sep stencils of filter specs are evaluated pass by pass in SciPy's order of summation
(``_sep_stencil``; ``_lowering.pass_entries``), each product rounded before its sum
(``enable_fp_fusion=False``): float64 results are SciPy's bits, signs of zero included.

Arithmetic is float32 for 16/32-bit inputs and float64 for float64, with
``sqrt_rn`` / ``div_rn`` and an own ``atan2`` (Cephes polynomials; the
interpreter has no libdevice).  Device code uses Triton builtins only (no
``triton.language`` ``@jit`` helpers such as ``tl.zeros``/``tl.sum``), so the
module can be re-imported in interpreter mode after ``triton`` was imported.
``benchmarks/gpu.py --compile-only`` compiles every variant for sm_90 without
a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
from typing import NamedTuple

import torch

import triton
import triton.language as tl

from .._spec import BlurSpec, FilterSpec, Stencil
from ._lowering import lower, pass_entries
from .._validate import compute_dtype
from . import reference as _ref
from ._layout import collapse_planes
from ._planar import adapt as _adapt
from types import SimpleNamespace

NAME = "triton"
UNAVAILABLE_HINT = (
    " (the Triton engine runs CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 is set "
    "before triton is first imported)"
)

#: kernel launches by kernel name (tests assert on it: a silent fallback proves nothing)
LAUNCHES: collections.Counter = collections.Counter()
#: specs this engine handed to the reference (none that ``functional`` builds)
FALLBACKS: collections.Counter = collections.Counter()

_MODES = {"reflect": 0, "mirror": 1, "nearest": 2, "wrap": 3, "constant": 4}
# epilogues
_STACK, _MAG, _DIR, _BLEND, _NORM = 0, 1, 2, 3, 4
_U_MAG, _U_DIR, _U_NORM = 5, 6, 7  # forward variants that write u for the two-kernel backward
_EPILOGUES = {"stack": _STACK, "magnitude": _MAG, "direction": _DIR, "sum": _STACK}  # sum: merged into one stencil

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: taps up to which loops are unrolled
_UNROLL_MAX = 32
#: footprints above which magnitude/direction/normalized backward go through a u buffer
_RECOMPUTE_MAX = 12

# tile limits (tests shrink them to exercise multi-tile paths)
# (the backward's tiles are larger: its border bands cost per program, so more planes / rows
# per program amortise them)
_TILE = {"max_bw": 64, "max_elems": 1024, "max_bp": 8, "bwd_elems": 2048}


def set_tile_limits(max_bw=None, max_elems=None, max_bp=None, bwd_elems=None):
    """Override tile limits (powers of two); returns the previous ones.  For tests."""
    old = dict(_TILE)
    for k, v in (("max_bw", max_bw), ("max_elems", max_elems), ("max_bp", max_bp), ("bwd_elems", bwd_elems)):
        if v is not None:
            _TILE[k] = int(v)
    _PLANS.clear()
    return old


def interpreted() -> bool:
    """Whether this module's kernels were built for Triton's CPU interpreter."""
    return type(_fwd_kernel).__name__ == "InterpretedFunction"


def available(device: torch.device, dtype: torch.dtype) -> bool:
    if dtype not in _FLOATS:
        return False
    device = torch.device(device)
    if device.type == "cuda":
        return not interpreted() and torch.cuda.is_available()
    if device.type == "cpu":
        return interpreted() and os.environ.get("TRITON_INTERPRET") == "1"
    return False


# =============================================================================
# device code


# Only Triton *builtins* below (no triton.language @jit helpers such as tl.zeros / tl.sum):
# those are decorated when triton is imported, so a test that turns TRITON_INTERPRET on after
# triton was imported would mix interpreted and compiled functions.


@triton.jit
def _inside(j, n):
    return (j >= 0) & (j < n)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _fold(j, n, MODE: tl.constexpr, SINGLE: tl.constexpr):
    """scipy.ndimage boundary folding of integer positions ``j`` into ``[0, n)``.

    ``SINGLE``: every ``j`` is within one reflection of the image (cheap
    compare/select form).  Constant mode leaves ``j`` (the caller masks with cval).
    No clamping: every access is masked, and unclamped ``arange``-based indices keep
    Triton's contiguity analysis (vector loads/stores where alignment allows).
    """
    if MODE == 0:  # reflect: d c b a | a b c d | d c b a
        if SINGLE:
            j = tl.where(j < 0, -1 - j, j)
            j = tl.where(j >= n, 2 * n - 1 - j, j)
        else:
            p = 2 * n
            j = j % p
            j = tl.where(j < 0, j + p, j)  # C and Python remainders agree after this
            j = tl.where(j >= n, p - 1 - j, j)
    elif MODE == 1:  # mirror: d c b | a b c d | c b a
        if SINGLE:
            j = tl.where(j < 0, -j, j)
            j = tl.where(j >= n, 2 * n - 2 - j, j)
        else:
            p = tl.maximum(2 * n - 2, 1)  # n == 1: everything folds onto 0
            j = j % p
            j = tl.where(j < 0, j + p, j)
            j = tl.where(j >= n, p - j, j)
    elif MODE == 2:  # nearest
        j = tl.minimum(tl.maximum(j, 0), n - 1)
    elif MODE == 3:  # wrap
        if SINGLE:
            j = tl.where(j < 0, j + n, j)
            j = tl.where(j >= n, j - n, j)
        else:
            j = j % n
            j = tl.where(j < 0, j + n, j)
    return j


@triton.jit
def _plane_off(pl, n_inner, s_outer, s_inner):
    """Element offset of planes ``pl`` (int64, shaped ``[BP, 1, 1]``)."""
    pl = pl.to(tl.int64)
    return ((pl // n_inner) * s_outer + (pl % n_inner) * s_inner)[:, None, None]


@triton.jit
def _div(a, b, F64: tl.constexpr):
    if F64:
        return a / b
    else:
        return tl.div_rn(a, b)


@triton.jit
def _sqrt(a, F64: tl.constexpr):
    if F64:
        return tl.sqrt(a)
    else:
        return tl.sqrt_rn(a)


@triton.jit
def _signbit(v, F64: tl.constexpr):
    if F64:
        return v.to(tl.int64, bitcast=True) < 0
    else:
        return v.to(tl.int32, bitcast=True) < 0


@triton.jit
def _atan_unit(r, F64: tl.constexpr):
    """atan(r) for r in [0, 1] (Cephes atan / atanf, about 1 ulp)."""
    if F64:
        big = r > 0.66
        x = tl.where(big, (r - 1.0) / (r + 1.0), r)
        z = x * x
        p = (((-8.750608600031904122785e-1 * z - 1.615753718733365076637e1) * z - 7.500855792314704667340e1) * z
             - 1.228866684490136173410e2) * z - 6.485021904942025371773e1
        q = ((((z + 2.485846490142306297962e1) * z + 1.650270098316988542046e2) * z + 4.328810604912902668951e2) * z
             + 4.853903996359136964868e2) * z + 1.945506571482613964425e2
        z = x * (z * p / q) + x
        return tl.where(big, 0.78539816339744830962 + (z + 3.061616997868382943065e-17), z)
    else:
        big = r > 0.41421356237309503
        x = tl.where(big, tl.div_rn(r - 1.0, r + 1.0), r)
        z = x * x
        p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * x + x
        return tl.where(big, 0.78539816339744830962 + p, p)


@triton.jit
def _atan2(y, x, F64: tl.constexpr):
    """C ``atan2`` (signed zeros, infinities, NaN), as torch.atan2."""
    ay = tl.abs(y)
    ax = tl.abs(x)
    swap = ay > ax
    mn = tl.where(swap, ax, ay)
    mx = tl.where(swap, ay, ax)
    both_inf = (ay == float("inf")) & (ax == float("inf"))
    r = tl.where(mx == 0, 0.0, _div(mn, tl.where(mx == 0, 1.0, mx), F64))
    r = tl.where(both_inf, 1.0, r)
    t = _atan_unit(r, F64)
    t = tl.where(swap, 1.57079632679489661923 - t, t)
    t = tl.where(_signbit(x, F64), 3.14159265358979323846 - t, t)
    t = tl.where(_signbit(y, F64), -t, t)
    return tl.where((y != y) | (x != x), y + x, t)


@triton.jit
def _sel(xv, fr, fc, ok, env, cfg: tl.constexpr, BORDER: tl.constexpr):
    """Selective-blur mask at in-image positions ``(fr, fc)``: the selected pixels ``m``, or
    with ``BORDER`` the written ones ``w`` (``m`` minus a kept border band)."""
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    HAS_MASK: tl.constexpr = cfg[9]
    KEEP_BORDER: tl.constexpr = cfg[10]
    if HAS_MASK:
        m = tl.load(mp + fr[None, :, None] * m_sh + fc[None, None, :] * m_sw, mask=ok, other=0) != 0
    else:
        m = xv >= thr
    if KEEP_BORDER and BORDER:
        rin = (fr + by0 >= 0) & (fr + by1 <= H - 1)
        cin = (fc + bx0 >= 0) & (fc + bx1 <= W - 1)
        m = m & rin[None, :, None] & cin[None, None, :]
    return m & ok


@triton.jit
def _tap(t, acc0, acc1, rows, cols, valid, env, cfg: tl.constexpr, DO0: tl.constexpr, DO1: tl.constexpr):
    """Accumulate footprint tap ``t`` at positions ``rows x cols`` into the stencils."""
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    MODE: tl.constexpr = cfg[0]
    SINGLE: tl.constexpr = cfg[1]
    NT: tl.constexpr = cfg[2]
    CH: tl.constexpr = cfg[8]
    ACC: tl.constexpr = cfg[11]
    if cfg[12]:  # unrolled: offsets are constants, a zero offset needs no folding
        DY: tl.constexpr = cfg[16]
        DX: tl.constexpr = cfg[17]
        dy: tl.constexpr = DY[t]
        dx: tl.constexpr = DX[t]
        ZY: tl.constexpr = dy == 0
        ZX: tl.constexpr = dx == 0
    else:
        dy = tl.load(ip + t)
        dx = tl.load(ip + NT + t)
        ZY: tl.constexpr = False
        ZX: tl.constexpr = False
    ok = valid
    if ZY:
        fr = rows
    else:
        r = rows + dy
        fr = _fold(r, H, MODE, SINGLE)
        if MODE == 4:
            ok = ok & ((r >= 0) & (r < H))[None, :, None]
    if ZX:
        fc = cols
    else:
        c = cols + dx
        fc = _fold(c, W, MODE, SINGLE)
        if MODE == 4:
            ok = ok & ((c >= 0) & (c < W))[None, None, :]
    v = tl.load(xp + fr[None, :, None] * x_sh + fc[None, None, :] * x_sw, mask=ok, other=0.0).to(ACC)
    if MODE == 4:
        v = tl.where(ok, v, cval)  # cval in the compute dtype, not rounded to x's
    if CH == 1:  # normalized blur: channels (m ? x : 0, m); nothing outside the image is masked
        m = _sel(v, fr, fc, ok, env, cfg, False)  # a kept border still counts
        v0 = tl.where(m, v, 0.0)  # an unselected NaN never enters the mean
        v1 = m.to(ACC)
    else:
        v0 = v
        v1 = v
    if DO0:
        acc0 += tl.load(fp + t) * v0
    if DO1:
        acc1 += tl.load(fp + NT + t) * v1
    return acc0, acc1


@triton.jit
def _stencils(rows, cols, valid, env, cfg: tl.constexpr, DO0: tl.constexpr, DO1: tl.constexpr):
    """The (up to two) stencils evaluated at ``rows x cols`` (1-D in-image index vectors)."""
    if cfg[24]:  # sep stencils of a FilterSpec: pass by pass, in SciPy's order
        return _sep_stencils(rows, cols, valid, env, cfg, DO0, DO1)
    else:
        return _footprint(rows, cols, valid, env, cfg, DO0, DO1)


@triton.jit
def _sep_stencils(rows, cols, valid, env, cfg: tl.constexpr, DO0: tl.constexpr, DO1: tl.constexpr):
    ACC: tl.constexpr = cfg[11]
    if DO0:
        a0 = _sep_stencil(rows, cols, valid, env, cfg, cfg[25])
    else:
        a0 = tl.full(valid.shape, 0.0, ACC)
    if DO1:
        a1 = _sep_stencil(rows, cols, valid, env, cfg, cfg[26])
    else:
        a1 = a0
    return a0, a1


@triton.jit
def _footprint(rows, cols, valid, env, cfg: tl.constexpr, DO0: tl.constexpr, DO1: tl.constexpr):
    """The stencils as one footprint (dense stencils, selective blur)."""
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    NT: tl.constexpr = cfg[2]
    NA: tl.constexpr = cfg[3]
    NB: tl.constexpr = cfg[4]
    NCY: tl.constexpr = cfg[6]
    NCX: tl.constexpr = cfg[7]
    ACC: tl.constexpr = cfg[11]
    UNROLL: tl.constexpr = cfg[12]
    acc0 = tl.full(valid.shape, -0.0, ACC)  # -0.0: the sum of the terms, signed zeros included
    acc1 = tl.full(valid.shape, -0.0, ACC)
    if UNROLL:
        if DO0:
            for t in tl.static_range(0, NA):
                acc0, acc1 = _tap(t, acc0, acc1, rows, cols, valid, env, cfg, True, False)
        for t in tl.static_range(NA, NA + NB):
            acc0, acc1 = _tap(t, acc0, acc1, rows, cols, valid, env, cfg, DO0, DO1)
        if DO1:
            for t in tl.static_range(NA + NB, NT):
                acc0, acc1 = _tap(t, acc0, acc1, rows, cols, valid, env, cfg, False, True)
    else:
        if DO0:
            for t in range(0, NA):
                acc0, acc1 = _tap(t, acc0, acc1, rows, cols, valid, env, cfg, True, False)
        for t in range(NA, NA + NB):
            acc0, acc1 = _tap(t, acc0, acc1, rows, cols, valid, env, cfg, DO0, DO1)
        if DO1:
            for t in range(NA + NB, NT):
                acc0, acc1 = _tap(t, acc0, acc1, rows, cols, valid, env, cfg, False, True)
    if NCY + NCX > 0:  # constant mode, two-pass sep: the outer pass pads with cval
        cy0 = tl.full(rows.shape, 0.0, ACC)
        cy1 = tl.full(rows.shape, 0.0, ACC)
        cx0 = tl.full(cols.shape, 0.0, ACC)
        cx1 = tl.full(cols.shape, 0.0, ACC)
        for e in range(NCY):
            outside = ~_inside(rows + tl.load(ip + 2 * NT + e), H)
            cy0 += tl.where(outside, tl.load(fp + 2 * NT + e), 0.0)
            cy1 += tl.where(outside, tl.load(fp + 2 * NT + NCY + e), 0.0)
        for e in range(NCX):
            outside = ~_inside(cols + tl.load(ip + 2 * NT + NCY + e), W)
            cx0 += tl.where(outside, tl.load(fp + 2 * NT + 2 * NCY + e), 0.0)
            cx1 += tl.where(outside, tl.load(fp + 2 * NT + 2 * NCY + NCX + e), 0.0)
        if DO0:
            acc0 += cy0[None, :, None] + cx0[None, None, :]
        if DO1:
            acc1 += cy1[None, :, None] + cx1[None, None, :]
    return acc0, acc1


# ---------------------------------------------------------------- sep stencils in SciPy's order
#
# A ``sep`` stencil of a FilterSpec (``SEPF``) is evaluated pass by pass, in the spec's order,
# each pass summed in SciPy's order (``_lowering.pass_entries``): the first pass is recomputed
# at every entry of the second (the same loads as the footprint), and in constant mode the
# second pass reads ``cval`` outside the image (SciPy pads the first pass's result: exact, no
# correction term).  ``SP`` describes one stencil: (passes, axis, kind, entries, weight index in
# fp, offset index in ip) of the first pass, then the same of the second; ``SOFF`` holds every
# offset as constants when ``SUN`` (unrolled).


@triton.jit
def _maxi(a, b):
    return tl.maximum(a, b)


@triton.jit
def _axis_idx(idx, d, n, MODE: tl.constexpr, SINGLE: tl.constexpr):
    """Folded positions ``idx + d`` along an axis of size ``n``, and whether they are inside
    (constant mode; elsewhere all true)."""
    j = idx + d
    f = _fold(j, n, MODE, SINGLE)
    if MODE == 4:
        ok = _inside(j, n)
    else:
        ok = j == j
    return f, ok


@triton.jit
def _sep_x(fr, fc, okr, okc, valid, env, cfg: tl.constexpr):
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    MODE: tl.constexpr = cfg[0]
    ACC: tl.constexpr = cfg[11]
    ok = valid & okr[None, :, None] & okc[None, None, :]
    v = tl.load(xp + fr[None, :, None] * x_sh + fc[None, None, :] * x_sw, mask=ok, other=0.0).to(ACC)
    if MODE == 4:
        v = tl.where(ok, v, cval)  # cval in the compute dtype
    return v


@triton.jit
def _sep_v1(t, rows, cols, fB, okB, valid, env, cfg: tl.constexpr, SP: tl.constexpr):
    """The sample of entry ``t`` of the first pass (the other axis already folded: ``fB``)."""
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    MODE: tl.constexpr = cfg[0]
    SINGLE: tl.constexpr = cfg[1]
    AX: tl.constexpr = SP[1]
    OI: tl.constexpr = SP[5]
    if cfg[28]:
        SOFF: tl.constexpr = cfg[27]
        d: tl.constexpr = SOFF[OI + t]
    else:
        d = tl.load(ip + OI + t)
    if AX == -2:
        fr, okr = _axis_idx(rows, d, H, MODE, SINGLE)
        return _sep_x(fr, fB, okr, okB, valid, env, cfg)
    else:
        fc, okc = _axis_idx(cols, d, W, MODE, SINGLE)
        return _sep_x(fB, fc, okB, okc, valid, env, cfg)


@triton.jit
def _sep_t1(t, acc, rows, cols, fB, okB, valid, env, cfg: tl.constexpr, SP: tl.constexpr):
    """``acc`` plus term ``t`` of the first pass: ``w x`` (general) or ``(x_l +- x_r) w_l``."""
    fp = env[7]
    KIND: tl.constexpr = SP[2]
    WI: tl.constexpr = SP[4]
    w = tl.load(fp + WI + t)
    if KIND == 0:
        acc = acc + w * _sep_v1(t, rows, cols, fB, okB, valid, env, cfg, SP)
    else:
        a = _sep_v1(t, rows, cols, fB, okB, valid, env, cfg, SP)
        b = _sep_v1(t + 1, rows, cols, fB, okB, valid, env, cfg, SP)
        if KIND == 1:
            acc = acc + (a + b) * w
        else:
            acc = acc + (a - b) * w
    return acc


@triton.jit
def _sep_p1(rows, cols, fB, okB, valid, env, cfg: tl.constexpr, SP: tl.constexpr):
    """The first pass, in SciPy's order."""
    fp = env[7]
    KIND: tl.constexpr = SP[2]
    N: tl.constexpr = SP[3]
    WI: tl.constexpr = SP[4]
    acc = tl.load(fp + WI) * _sep_v1(0, rows, cols, fB, okB, valid, env, cfg, SP)
    if cfg[28]:
        if KIND == 0:
            for t in tl.static_range(1, N):
                acc = _sep_t1(t, acc, rows, cols, fB, okB, valid, env, cfg, SP)
        else:
            for t in tl.static_range(1, N, 2):
                acc = _sep_t1(t, acc, rows, cols, fB, okB, valid, env, cfg, SP)
    else:
        if KIND == 0:
            for t in range(1, N):
                acc = _sep_t1(t, acc, rows, cols, fB, okB, valid, env, cfg, SP)
        else:
            for t in range(1, N, 2):
                acc = _sep_t1(t, acc, rows, cols, fB, okB, valid, env, cfg, SP)
    return acc


@triton.jit
def _sep_v2(e, rows, cols, valid, env, cfg: tl.constexpr, SP: tl.constexpr):
    """The first pass at entry ``e`` of the second one (``cval`` outside, constant mode)."""
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    MODE: tl.constexpr = cfg[0]
    SINGLE: tl.constexpr = cfg[1]
    AX2: tl.constexpr = SP[6]
    OI2: tl.constexpr = SP[10]
    if cfg[28]:
        SOFF: tl.constexpr = cfg[27]
        d: tl.constexpr = SOFF[OI2 + e]
    else:
        d = tl.load(ip + OI2 + e)
    if AX2 == -1:
        fB, okB = _axis_idx(cols, d, W, MODE, SINGLE)
        a = _sep_p1(rows, cols, fB, okB, valid, env, cfg, SP)
        if MODE == 4:
            a = tl.where(okB[None, None, :], a, cval)
    else:
        fB, okB = _axis_idx(rows, d, H, MODE, SINGLE)
        a = _sep_p1(rows, cols, fB, okB, valid, env, cfg, SP)
        if MODE == 4:
            a = tl.where(okB[None, :, None], a, cval)
    return a


@triton.jit
def _sep_t2(e, acc, rows, cols, valid, env, cfg: tl.constexpr, SP: tl.constexpr):
    fp = env[7]
    KIND2: tl.constexpr = SP[7]
    WI2: tl.constexpr = SP[9]
    w = tl.load(fp + WI2 + e)
    if KIND2 == 0:
        acc = acc + w * _sep_v2(e, rows, cols, valid, env, cfg, SP)
    else:
        a = _sep_v2(e, rows, cols, valid, env, cfg, SP)
        b = _sep_v2(e + 1, rows, cols, valid, env, cfg, SP)
        if KIND2 == 1:
            acc = acc + (a + b) * w
        else:
            acc = acc + (a - b) * w
    return acc


@triton.jit
def _sep_stencil(rows, cols, valid, env, cfg: tl.constexpr, SP: tl.constexpr):
    """One ``sep`` stencil at ``rows x cols``, its passes in the spec's order, each in SciPy's."""
    NPH: tl.constexpr = SP[0]
    if NPH == 0:  # the identity
        return _sep_x(rows, cols, rows == rows, cols == cols, valid, env, cfg)
    elif NPH == 1:
        if SP[1] == -2:
            return _sep_p1(rows, cols, cols, cols == cols, valid, env, cfg, SP)
        else:
            return _sep_p1(rows, cols, rows, rows == rows, valid, env, cfg, SP)
    else:
        return _sep_two(rows, cols, valid, env, cfg, SP)


@triton.jit
def _sep_two(rows, cols, valid, env, cfg: tl.constexpr, SP: tl.constexpr):
    """A two-pass stencil: the second pass over the first, both in SciPy's order."""
    fp = env[7]
    KIND2: tl.constexpr = SP[7]
    N2: tl.constexpr = SP[8]
    WI2: tl.constexpr = SP[9]
    acc = tl.load(fp + WI2) * _sep_v2(0, rows, cols, valid, env, cfg, SP)
    if cfg[28]:
        if KIND2 == 0:
            for e in tl.static_range(1, N2):
                acc = _sep_t2(e, acc, rows, cols, valid, env, cfg, SP)
        else:
            for e in tl.static_range(1, N2, 2):
                acc = _sep_t2(e, acc, rows, cols, valid, env, cfg, SP)
    else:
        if KIND2 == 0:
            for e in range(1, N2):
                acc = _sep_t2(e, acc, rows, cols, valid, env, cfg, SP)
        else:
            for e in range(1, N2, 2):
                acc = _sep_t2(e, acc, rows, cols, valid, env, cfg, SP)
    return acc


@triton.jit
def _any(b):
    """Whether any element of the 3-D boolean ``b`` is set (a block-uniform scalar)."""
    return tl.reduce(tl.reduce(tl.reduce(b.to(tl.int32), 2, _maxi), 1, _maxi), 0, _maxi) > 0


@triton.jit
def _mag_bad(s, y0, y1, K: tl.constexpr, F64: tl.constexpr):
    """Where the sum of squares ``s`` overflowed, or underflowed to 0 / a subnormal while a
    component is not 0 (``reference._rescale``)."""
    nz = y0 != 0
    if K == 2:
        nz = nz | (y1 != 0)
    if F64:
        tiny = 2.2250738585072014e-308
    else:
        tiny = 1.1754943508222875e-38
    return (s == float("inf")) | ((s < tiny) & nz)


@triton.jit
def _mag_scaled(y0, y1, bad, K: tl.constexpr, F64: tl.constexpr):
    """``(m', t0, t1, r)``: ``m' = max |y_k|`` where ``bad`` (finite, > 0; else 1), ``t_k = y_k / m'``,
    ``r = sqrt(sum t_k**2)`` (``reference._scaled``)."""
    m = tl.abs(y0)
    if K == 2:
        m = tl.maximum(m, tl.abs(y1))
    mm = tl.where(bad & (m > 0) & (m != float("inf")), m, 1.0)
    t0 = _div(y0, mm, F64)
    r = t0 * t0
    t1 = t0
    if K == 2:
        t1 = _div(y1, mm, F64)
        r += t1 * t1
    return m, mm, t0, t1, _sqrt(r, F64)


@triton.jit
def _magnitude(y0, y1, K: tl.constexpr, F64: tl.constexpr):
    """``sqrt(sum y_k**2)``, rescaled where that sum over/underflows (a rare, block-uniform
    branch)."""
    s = y0 * y0
    if K == 2:
        s += y1 * y1
    r = _sqrt(s, F64)
    bad = _mag_bad(s, y0, y1, K, F64)
    if _any(bad):
        m, mm, t0, t1, q = _mag_scaled(y0, y1, bad, K, F64)
        r = tl.where(bad, tl.where(m == float("inf"), m, mm * q), r)
    return r


@triton.jit
def _u_from_y(y0, y1, g, EPI: tl.constexpr, K: tl.constexpr, F64: tl.constexpr):
    """Upstream gradient of each stencil from the stencil values and the output gradient."""
    if EPI == 1:  # magnitude: g * y_k / |y|, 0 where |y| == 0 (rescaled |y|: _magnitude)
        # branch-free: t_k = y_k / m (m = 1, t_k = y_k exactly, but where the sum of squares
        # over/underflows; there a reciprocal), u_k = g t_k / sqrt(sum t_k**2)
        s = y0 * y0
        if K == 2:
            s += y1 * y1
        bad = _mag_bad(s, y0, y1, K, F64)
        m = tl.abs(y0)
        if K == 2:
            m = tl.maximum(m, tl.abs(y1))
        inv = _div(1.0, tl.where(bad & (m > 0) & (m != float("inf")), m, 1.0), F64)
        t0 = y0 * inv
        t1 = y1 * inv
        q = t0 * t0
        if K == 2:
            q += t1 * t1
        zero = q == 0
        scale = tl.where(zero, 0.0, _div(g, tl.where(zero, 1.0, _sqrt(q, F64)), F64))
        return scale * t0, scale * t1
    else:  # direction: d atan2(a, b) = (b da - a db) / (a^2 + b^2)
        r = y0 * y0 + y1 * y1
        zero = r == 0
        scale = tl.where(zero, 0.0, _div(g, tl.where(zero, 1.0, r), F64))
        return scale * y1, -(scale * y0)


@triton.jit
def _u_at(qr, qc, vq, env, genv, cfg: tl.constexpr, NEED0: tl.constexpr, NEED1: tl.constexpr):
    """Upstream gradients ``(u0, u1)`` at positions ``qr x qc`` (0 where not ``vq``)."""
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    gp, g_sh, g_sw, up, u_sh, u_sw, u_sk = genv
    K: tl.constexpr = cfg[5]
    ACC: tl.constexpr = cfg[11]
    EPI: tl.constexpr = cfg[13]
    USRC: tl.constexpr = cfg[14]
    F64: tl.constexpr = cfg[15]
    if USRC == 1 or EPI == 0:  # read u (the grad planes for stack, else the u buffer)
        uptr = up + qr[None, :, None] * u_sh + qc[None, None, :] * u_sw
        if NEED0:
            u0 = tl.load(uptr, mask=vq, other=0.0).to(ACC)
        else:
            u0 = tl.full(vq.shape, 0.0, ACC)
        if NEED1:
            u1 = tl.load(uptr + u_sk, mask=vq, other=0.0).to(ACC)
        else:
            u1 = u0
    elif EPI == 1 or EPI == 2:
        y0, y1 = _stencils(qr, qc, vq, env, cfg, True, K == 2)
        g = tl.load(gp + qr[None, :, None] * g_sh + qc[None, None, :] * g_sw, mask=vq, other=0.0).to(ACC)
        u0, u1 = _u_from_y(y0, y1, g, EPI, K, F64)
        u0 = tl.where(vq, u0, 0.0)
        u1 = tl.where(vq, u1, 0.0)
    elif EPI == 3:  # blend: m * g
        xv = tl.load(xp + qr[None, :, None] * x_sh + qc[None, None, :] * x_sw, mask=vq, other=0.0).to(ACC)
        m = _sel(xv, qr, qc, vq, env, cfg, True)
        g = tl.load(gp + qr[None, :, None] * g_sh + qc[None, None, :] * g_sw, mask=vq, other=0.0).to(ACC)
        u0 = tl.where(m, g, 0.0)
        u1 = u0
    else:  # normalized: m * g / blur(m)  (0 where blur(m) == 0)
        _d, den = _stencils(qr, qc, vq, env, cfg, False, True)
        xv = tl.load(xp + qr[None, :, None] * x_sh + qc[None, None, :] * x_sw, mask=vq, other=0.0).to(ACC)
        use = _sel(xv, qr, qc, vq, env, cfg, True) & (den > 0)
        g = tl.load(gp + qr[None, :, None] * g_sh + qc[None, None, :] * g_sw, mask=vq, other=0.0).to(ACC)
        u0 = tl.where(use, _div(g, tl.where(use, den, 1.0), F64), 0.0)
        u1 = u0
    return u0, u1


@triton.jit
def _adj_tap(t, adj, jr, jc, valid, env, genv, cfg: tl.constexpr, NEED0: tl.constexpr, NEED1: tl.constexpr):
    xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1 = env
    NT: tl.constexpr = cfg[2]
    NT2: tl.constexpr = cfg[18]
    IP2: tl.constexpr = 2 * NT + cfg[6] + cfg[7]  # adjoint table in ip / fp
    FP2: tl.constexpr = 2 * NT + 2 * cfg[6] + 2 * cfg[7] + 2
    if cfg[21] and (cfg[13] == 0 or cfg[14] == 1):  # unrolled (see _adjoint): constant offsets
        DY: tl.constexpr = cfg[22]
        DX: tl.constexpr = cfg[23]
        dy: tl.constexpr = DY[t]
        dx: tl.constexpr = DX[t]
    else:
        dy = tl.load(ip + IP2 + t)
        dx = tl.load(ip + IP2 + NT2 + t)
    qr = jr - dy
    qc = jc - dx
    vq = valid & ((qr >= 0) & (qr < H))[None, :, None] & ((qc >= 0) & (qc < W))[None, None, :]
    u0, u1 = _u_at(qr, qc, vq, env, genv, cfg, NEED0, NEED1)
    if NEED0:
        adj += tl.load(fp + FP2 + t) * u0
    if NEED1:
        adj += tl.load(fp + FP2 + NT2 + t) * u1
    return adj


@triton.jit
def _adjoint(pv, jr, vr, jc, vc, env, genv, cfg: tl.constexpr):
    """``sum_t w_t u(j - d_t)`` over the adjoint footprint at padded positions ``jr x jc``
    (valid where ``pv x vr x vc``)."""
    NT: tl.constexpr = cfg[18]
    NA: tl.constexpr = cfg[19]
    NB: tl.constexpr = cfg[20]
    K: tl.constexpr = cfg[5]
    ACC: tl.constexpr = cfg[11]
    EPI: tl.constexpr = cfg[13]
    # unrolled only when u is one load (a recomputing u unrolls its own stencil loop)
    UNROLL: tl.constexpr = cfg[21] and (EPI == 0 or cfg[14] == 1)
    TWO: tl.constexpr = K == 2 and (EPI == 0 or EPI == 1 or EPI == 2)  # two upstream gradients
    valid = pv[:, None, None] & vr[None, :, None] & vc[None, None, :]
    adj = tl.full(valid.shape, 0.0, ACC)
    if UNROLL:
        for t in tl.static_range(0, NA):
            adj = _adj_tap(t, adj, jr, jc, valid, env, genv, cfg, True, False)
        for t in tl.static_range(NA, NA + NB):
            adj = _adj_tap(t, adj, jr, jc, valid, env, genv, cfg, True, TWO)
        for t in tl.static_range(NA + NB, NT):
            adj = _adj_tap(t, adj, jr, jc, valid, env, genv, cfg, False, True)
    else:
        for t in range(0, NA):
            adj = _adj_tap(t, adj, jr, jc, valid, env, genv, cfg, True, False)
        for t in range(NA, NA + NB):
            adj = _adj_tap(t, adj, jr, jc, valid, env, genv, cfg, True, TWO)
        for t in range(NA + NB, NT):
            adj = _adj_tap(t, adj, jr, jc, valid, env, genv, cfg, False, True)
    return adj


@triton.jit
def _expand(band, off, N: tl.constexpr, AXIS: tl.constexpr):
    """Place ``band`` (``BB`` rows or columns: ``AXIS`` 1 or 2) at offset ``off`` of an
    ``N``-long axis, 0 elsewhere (exact: no arithmetic on the values)."""
    BB: tl.constexpr = band.shape[AXIS]
    i = tl.arange(0, N) - off
    inb = (i >= 0) & (i < BB)
    idx = tl.minimum(tl.maximum(i, 0), BB - 1)
    if AXIS == 1:
        if BB == 1:
            return tl.where(inb[None, :, None], band, 0.0)
        idx = tl.broadcast_to(idx[None, :, None], (band.shape[0], N, band.shape[2]))
        return tl.where(inb[None, :, None], tl.gather(band, idx, 1), 0.0)
    else:
        if BB == 1:
            return tl.where(inb[None, None, :], band, 0.0)
        idx = tl.broadcast_to(idx[None, None, :], (band.shape[0], band.shape[1], N))
        return tl.where(inb[None, None, :], tl.gather(band, idx, 2), 0.0)


@triton.jit
def _fwd_kernel(
    x_ptr, x_ni, x_so, x_si, x_sh, x_sw,
    m_ptr, m_ni, m_so, m_si, m_sh, m_sw,
    g_ptr, g_ni, g_so, g_si, g_sh, g_sw,
    o_ptr, o_ni, o_so, o_si, o_sh, o_sw, o_sk,
    ip, fp, NP, H, W, n_th, n_tw, by0, by1, bx0, bx1,
    MODE: tl.constexpr, SINGLE: tl.constexpr, NT: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr,
    K: tl.constexpr, NCY: tl.constexpr, NCX: tl.constexpr, CH: tl.constexpr, HAS_MASK: tl.constexpr,
    KEEP_BORDER: tl.constexpr, ACC: tl.constexpr, UNROLL: tl.constexpr, EPI: tl.constexpr, F64: tl.constexpr,
    DY: tl.constexpr, DX: tl.constexpr, NT2: tl.constexpr, NA2: tl.constexpr, NB2: tl.constexpr,
    UNROLL2: tl.constexpr, DY2: tl.constexpr, DX2: tl.constexpr, SEPF: tl.constexpr, SP0: tl.constexpr,
    SP1: tl.constexpr, SOFF: tl.constexpr, SUN: tl.constexpr, NSO: tl.constexpr, BP: tl.constexpr, BH: tl.constexpr,
    BW: tl.constexpr,
):
    """Stencils + epilogue on a ``[BP planes, BH rows, BW cols]`` tile."""
    cfg: tl.constexpr = (MODE, SINGLE, NT, NA, NB, K, NCY, NCX, CH, HAS_MASK, KEEP_BORDER, ACC, UNROLL, EPI, 0, F64,
                         DY, DX, NT2, NA2, NB2, UNROLL2, DY2, DX2, SEPF, SP0, SP1, SOFF, SUN)
    pid = tl.program_id(0)
    tw = pid % n_tw
    rest = pid // n_tw
    th = rest % n_th
    pg = rest // n_th
    pl = pg * BP + tl.arange(0, BP)
    rows = th * BH + tl.arange(0, BH)
    cols = tw * BW + tl.arange(0, BW)
    valid = (pl < NP)[:, None, None] & (rows < H)[None, :, None] & (cols < W)[None, None, :]
    pl = tl.minimum(pl, NP - 1)
    rs = rows  # (unclamped: every access below is masked)
    cs = cols
    cval = tl.load(fp + 2 * NT + 2 * NCY + 2 * NCX)
    thr = tl.load(fp + 2 * NT + 2 * NCY + 2 * NCX + 1)
    xp = x_ptr + _plane_off(pl, x_ni, x_so, x_si)
    mp = m_ptr + _plane_off(pl, m_ni, m_so, m_si)
    env = (xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1)
    if EPI == 7:
        _d, acc1 = _stencils(rs, cs, valid, env, cfg, False, True)
        acc0 = acc1
    else:
        acc0, acc1 = _stencils(rs, cs, valid, env, cfg, True, K == 2 or CH == 1)
    optr = o_ptr + _plane_off(pl, o_ni, o_so, o_si) + rs[None, :, None] * o_sh + cs[None, None, :] * o_sw
    OT = o_ptr.dtype.element_ty
    if EPI == 0:
        tl.store(optr, acc0.to(OT), mask=valid)
        if K == 2:
            tl.store(optr + o_sk, acc1.to(OT), mask=valid)
    elif EPI == 1:
        tl.store(optr, _magnitude(acc0, acc1, K, F64).to(OT), mask=valid)
    elif EPI == 2:
        tl.store(optr, _atan2(acc0, acc1, F64).to(OT), mask=valid)
    elif EPI == 3 or EPI == 4 or EPI == 7:
        xv = tl.load(xp + rs[None, :, None] * x_sh + cs[None, None, :] * x_sw, mask=valid, other=0.0).to(ACC)
        w = _sel(xv, rs, cs, valid, env, cfg, True)
        if EPI == 3:
            y = tl.where(w, acc0, xv)
        else:
            use = w & (acc1 > 0)
            if EPI == 4:
                y = tl.where(use, _div(acc0, tl.where(use, acc1, 1.0), F64), xv)
            else:  # u for the two-kernel normalized backward
                gp = g_ptr + _plane_off(pl, g_ni, g_so, g_si)
                g = tl.load(gp + rs[None, :, None] * g_sh + cs[None, None, :] * g_sw, mask=valid, other=0.0).to(ACC)
                y = tl.where(use, _div(g, tl.where(use, acc1, 1.0), F64), 0.0)
        tl.store(optr, y.to(OT), mask=valid)
    else:  # 5, 6: u of magnitude / direction for the two-kernel backward
        gp = g_ptr + _plane_off(pl, g_ni, g_so, g_si)
        g = tl.load(gp + rs[None, :, None] * g_sh + cs[None, None, :] * g_sw, mask=valid, other=0.0).to(ACC)
        u0, u1 = _u_from_y(acc0, acc1, g, EPI - 4, K, F64)
        tl.store(optr, u0.to(OT), mask=valid)
        if K == 2:
            tl.store(optr + o_sk, u1.to(OT), mask=valid)


@triton.jit
def _bwd_kernel(
    x_ptr, x_ni, x_so, x_si, x_sh, x_sw,
    m_ptr, m_ni, m_so, m_si, m_sh, m_sw,
    g_ptr, g_ni, g_so, g_si, g_sh, g_sw,
    u_ptr, u_ni, u_so, u_si, u_sh, u_sw, u_sk,
    o_ptr, o_ni, o_so, o_si, o_sh, o_sw,
    ip, fp, NP, H, W, n_th, n_tw, by0, by1, bx0, bx1, SY, SX,
    MODE: tl.constexpr, SINGLE: tl.constexpr, NT: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr,
    K: tl.constexpr, NCY: tl.constexpr, NCX: tl.constexpr, CH: tl.constexpr, HAS_MASK: tl.constexpr,
    KEEP_BORDER: tl.constexpr, ACC: tl.constexpr, UNROLL: tl.constexpr, EPI: tl.constexpr, USRC: tl.constexpr,
    F64: tl.constexpr, DY: tl.constexpr, DX: tl.constexpr, NT2: tl.constexpr, NA2: tl.constexpr,
    NB2: tl.constexpr, UNROLL2: tl.constexpr, DY2: tl.constexpr, DX2: tl.constexpr, SEPF: tl.constexpr,
    SP0: tl.constexpr, SP1: tl.constexpr, SOFF: tl.constexpr, SUN: tl.constexpr, NSO: tl.constexpr,
    BP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, BBY: tl.constexpr, BBX: tl.constexpr,
    EXTRAS: tl.constexpr,
):
    """Adjoint on a ``[BP, BH, BW]`` tile of the input gradient: main term, border bands, epilogue."""
    cfg: tl.constexpr = (MODE, SINGLE, NT, NA, NB, K, NCY, NCX, CH, HAS_MASK, KEEP_BORDER, ACC, UNROLL, EPI, USRC, F64,
                         DY, DX, NT2, NA2, NB2, UNROLL2, DY2, DX2, SEPF, SP0, SP1, SOFF, SUN)
    SL: tl.constexpr = 2 * NT + NCY + NCX + 2 * NT2 + NSO  # slot tables in ip: SY rows, then SX columns, 5 ints each
    pid = tl.program_id(0)
    tw = pid % n_tw
    rest = pid // n_tw
    th = rest % n_th
    pg = rest // n_th
    r0 = th * BH
    c0 = tw * BW
    pl = pg * BP + tl.arange(0, BP)
    rows = r0 + tl.arange(0, BH)
    cols = c0 + tl.arange(0, BW)
    pv = pl < NP
    rv = rows < H
    cv = cols < W
    pl = tl.minimum(pl, NP - 1)
    rs = rows  # (unclamped: every access below is masked)
    cs = cols
    cval = tl.load(fp + 2 * NT + 2 * NCY + 2 * NCX)
    thr = tl.load(fp + 2 * NT + 2 * NCY + 2 * NCX + 1)
    xp = x_ptr + _plane_off(pl, x_ni, x_so, x_si)
    mp = m_ptr + _plane_off(pl, m_ni, m_so, m_si)
    gp = g_ptr + _plane_off(pl, g_ni, g_so, g_si)
    up = u_ptr + _plane_off(pl, u_ni, u_so, u_si)
    env = (xp, x_sh, x_sw, mp, m_sh, m_sw, ip, fp, H, W, cval, thr, by0, by1, bx0, bx1)
    genv = (gp, g_sh, g_sw, up, u_sh, u_sw, u_sk)
    # main term: the preimage j = p itself
    adj = _adjoint(pv, rows, rv, cols, cv, env, genv, cfg)
    if EXTRAS:
        # Border pixels: the padded positions j != p that fold onto p.  A slot (A, B, lo, hi, P)
        # is either a band over p in [lo, hi] with j = A p + B (P < 0), or, for P >= 0, every
        # j in [lo, hi] folding onto the single pixel P (nearest mode), summed.  Row slots run
        # on bands of BBY rows at full tile width (the columns themselves, then each column
        # slot: the corners), column slots on bands of BBX columns: three _adjoint call sites.
        rlast = tl.minimum(r0 + BH, H) - 1
        clast = tl.minimum(c0 + BW, W) - 1
        for s in range(SY):
            sp = ip + SL + 5 * s
            ay = tl.load(sp)
            by_ = tl.load(sp + 1)
            P = tl.load(sp + 4)
            lo = tl.load(sp + 2)
            hi = tl.load(sp + 3)
            if P < 0:
                lo = tl.maximum(lo, r0)
                hi = tl.minimum(hi, rlast)
            elif (P < r0) | (P > rlast):
                hi = lo - 1
            for b0 in range(lo, hi + 1, BBY):
                idx = b0 + tl.arange(0, BBY)
                jr = ay * idx + by_
                vr = idx <= hi
                band = tl.full((BP, BBY, BW), 0.0, ACC)
                for sx in range(0, SX + 1):  # 0: the columns themselves; k > 0: column slot k - 1
                    spx = ip + SL + 5 * SY + 5 * (sx - 1)
                    slot = sx > 0
                    ax = tl.load(spx, mask=slot, other=1)
                    bx_ = tl.load(spx + 1, mask=slot, other=0)
                    lox = tl.load(spx + 2, mask=slot, other=0)
                    hix = tl.load(spx + 3, mask=slot, other=W - 1)
                    Px = tl.load(spx + 4, mask=slot, other=-1)
                    if Px < 0:
                        lox = tl.maximum(lox, c0)
                        hix = tl.minimum(hix, clast)
                        n_chunks = (hix >= lox).to(tl.int32)
                        first = c0
                    else:
                        n_chunks = tl.where((Px >= c0) & (Px <= clast), (hix - lox + BW) // BW, 0)
                        first = lox
                    for ci in range(n_chunks):
                        lane = first + ci * BW + tl.arange(0, BW)
                        corner = _adjoint(pv, jr, vr, ax * lane + bx_, (lane >= lox) & (lane <= hix), env, genv, cfg)
                        if Px < 0:
                            band += corner
                        else:
                            band += tl.where((cols == Px)[None, None, :], tl.reduce(corner, 2, _add)[:, :, None], 0.0)
                if P < 0:
                    adj += _expand(band, b0 - r0, BH, 1)
                else:
                    adj += tl.where((rows == P)[None, :, None], tl.reduce(band, 1, _add)[:, None, :], 0.0)
        for sx in range(SX):
            spx = ip + SL + 5 * SY + 5 * sx
            ax = tl.load(spx)
            bx_ = tl.load(spx + 1)
            P = tl.load(spx + 4)
            lox = tl.load(spx + 2)
            hix = tl.load(spx + 3)
            if P < 0:
                lox = tl.maximum(lox, c0)
                hix = tl.minimum(hix, clast)
            elif (P < c0) | (P > clast):
                hix = lox - 1
            for d0 in range(lox, hix + 1, BBX):
                idx = d0 + tl.arange(0, BBX)
                band = _adjoint(pv, rows, rv, ax * idx + bx_, idx <= hix, env, genv, cfg)
                if P < 0:
                    adj += _expand(band, d0 - c0, BW, 2)
                else:
                    adj += tl.where((cols == P)[None, None, :], tl.reduce(band, 2, _add)[:, :, None], 0.0)
    valid = pv[:, None, None] & rv[None, :, None] & cv[None, None, :]
    if EPI == 3 or EPI == 4:
        xv = tl.load(xp + rs[None, :, None] * x_sh + cs[None, None, :] * x_sw, mask=valid, other=0.0).to(ACC)
        w = _sel(xv, rs, cs, valid, env, cfg, True)
        g = tl.load(gp + rs[None, :, None] * g_sh + cs[None, None, :] * g_sw, mask=valid, other=0.0).to(ACC)
        if EPI == 3:  # blur^T(w g) + (1 - w) g
            gin = adj + tl.where(w, 0.0, g)
        else:  # m blur^T(g use / blur(m)) + (1 - use) g
            _n, den = _stencils(rs, cs, valid, env, cfg, False, True)
            use = w & (den > 0)
            m = _sel(xv, rs, cs, valid, env, cfg, False)
            gin = m.to(ACC) * adj + tl.where(use, 0.0, g)
    else:
        gin = adj
    optr = o_ptr + _plane_off(pl, o_ni, o_so, o_si) + rs[None, :, None] * o_sh + cs[None, None, :] * o_sw
    tl.store(optr, gin.to(o_ptr.dtype.element_ty), mask=valid)


# =============================================================================
# host side: lowering specs to footprints, tiles and slots


def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _stencil_taps(st: Stencil, mode: str, cval: float):
    """``({(dy, dx): w}, [(axis, d, coeff)])`` for one stencil, or None if not supported.

    The forward footprint: a ``sep`` stencil keeps its zero taps (SciPy's 1-D passes
    multiply every tap, so a NaN under a zero tap is NaN), a ``dense`` one drops them.
    """
    if st.kind == "dense":  # zero taps are outside the footprint (SciPy's 2-D correlate)
        taps = {}
        for a, row in enumerate(st.taps):
            for b, w in enumerate(row):
                if w != 0.0:
                    taps[(st.lo[0] + a, st.lo[1] + b)] = float(w)
        return taps, []
    passes = st.passes
    if not passes:
        return {(0, 0): 1.0}, []
    if len(passes) == 1:
        p = passes[0]
        taps = {}
        for i, w in enumerate(p.taps):
            d = p.lo + i
            taps[(d, 0) if p.axis == -2 else (0, d)] = float(w)
        return taps, []
    if len(passes) == 2 and passes[0].axis != passes[1].axis:
        inner, outer = passes
        ti = [(inner.lo + i, float(w)) for i, w in enumerate(inner.taps)]
        to = [(outer.lo + i, float(w)) for i, w in enumerate(outer.taps)]
        taps = {}
        for di, wi in ti:
            for do, wo in to:
                taps[(di, do) if inner.axis == -2 else (do, di)] = wi * wo
        corr = []
        if mode == "constant" and cval != 0.0:
            k = 1.0 - math.fsum(w for _, w in ti)
            if k != 0.0:
                corr = [(outer.axis, do, cval * k * wo) for do, wo in to]
        return taps, corr
    return None


def _merge_taps(stencils):
    """The one stencil ``sum_k stencil_k``: weights added per offset (an offset every stencil
    gives 0 stays in the footprint, as a NaN under it spreads in each), corrections listed."""
    taps, corr = {}, []
    for t, c in stencils:
        for k, w in t.items():
            taps[k] = taps.get(k, 0.0) + w
        corr += c
    return taps, corr


def _slots(n: int, lo: int, hi: int, mode: str):
    """Extra preimages along one axis, as slots ``(A, B, lo, hi, P)``.

    ``P < 0``: for every ``p`` in ``[lo, hi]``, ``j = A p + B != p`` lies in the padded range
    ``[min(lo, 0), n - 1 + max(hi, 0)]`` and folds onto ``p``.  ``P >= 0`` (nearest mode):
    every ``j`` in ``[lo, hi]`` folds onto ``P`` (``A, B = 1, 0``).  Every ``(p, j)`` with
    ``j != p`` and ``fold(j) = p`` appears exactly once.
    """
    L, U = min(lo, 0), n - 1 + max(hi, 0)
    out = []

    def add(alpha, beta, a, b):
        a, b = max(a, 0), min(b, n - 1)
        if a <= b:
            out.append((alpha, beta, a, b, -1))

    if mode == "constant":
        return out
    if mode == "nearest" or (mode == "mirror" and n == 1):
        if L <= -1:
            out.append((1, 0, L, -1, 0))
        if U >= n:
            out.append((1, 0, n, U, n - 1))
        return out
    P = {"reflect": 2 * n, "mirror": 2 * n - 2, "wrap": n}[mode]
    mlo, mhi = (L - n) // P - 1, -((-(U + n)) // P) + 1
    for m in range(mlo, mhi + 1):
        if m != 0:  # family A: j = p + P m
            add(1, P * m, L - P * m, U - P * m)
        if mode == "reflect":  # family B: j = 2n - 1 - p + P m
            beta = P - 1 + P * m
            add(-1, beta, beta - U, beta - L)
        elif mode == "mirror":  # j = P m - p; at p = 0 and p = n - 1 that is family A again
            beta = P * m
            add(-1, beta, max(beta - U, 1), min(beta - L, n - 2))
    return out


def _table(t0: dict, t1: dict, shared: bool):
    """Footprint table ``(dys, dxs, w0, w1, NA, NB)`` of two stencils' taps, ordered
    *stencil 0 only* (NA), *both* (NB), *stencil 1 only*.  ``shared``: one stencil read
    by two channels (normalized blur): every tap is in both."""
    if shared:
        a, b, c = [], sorted(t0), []
        t1 = t0
    else:
        a = sorted(k for k in t0 if k not in t1)
        b = sorted(k for k in t0 if k in t1)
        c = sorted(k for k in t1 if k not in t0)
    offs = a + b + c
    if not offs:  # no taps at all: one zero-weight tap keeps the kernels uniform
        offs, a, t0 = [(0, 0)], [(0, 0)], {(0, 0): 0.0}
    return ([o[0] for o in offs], [o[1] for o in offs], [t0.get(o, 0.0) for o in offs],
            [t1.get(o, 0.0) for o in offs], len(a), len(b))


def _sep_tables(stencils, base: int, floats: list):
    """``([SP per stencil], offsets, unrolled?)`` for ``_sep_stencil``: per stencil its passes in
    the spec's order (unit passes left out: ``x * 1.0`` is ``x``), each as
    ``_lowering.pass_entries``; the offsets go to ``ip`` at ``base`` (before the slot tables:
    their place does not depend on the image's size), the weights are appended to ``floats``."""
    sps, offs = [], []
    sun = True
    for st in stencils:
        sp = []
        phases = [p for p in st.passes if p.taps != (1.0,)]
        for p in phases:
            kind, ent = pass_entries(p)
            sp += [p.axis, kind, len(ent), len(floats), base + len(offs)]
            floats += [w for _, w in ent]
            offs += [o for o, _ in ent]
        sp += [0] * (10 - len(sp))
        sps.append(tuple([len(phases)] + sp))
        n = 1
        for p in phases:
            n *= len(p.taps)
        sun = sun and n <= _UNROLL_MAX
    return sps, offs, sun


class _Plan(NamedTuple):
    ip: torch.Tensor
    fp: torch.Tensor
    ce: dict  # constexprs shared by both kernels
    NT: int
    ext: tuple  # (by0, by1, bx0, bx1) keep-border extents
    SY: int
    SX: int
    BBY: int
    BBX: int
    fwd: tuple  # (BP, BH, BW, n_th, n_tw, warps) of the forward kernel
    bwd: tuple  # ... of the backward kernel
    recompute: bool


def _tiling(H, W, NP, elems):
    """``(BP, BH, BW, n_th, n_tw, warps)``: tiles of about ``elems`` elements, 4 per thread."""
    BW = min(_np2(W), _TILE["max_bw"])
    BH = min(_np2(H), max(1, elems // BW))
    BP = max(1, min(_TILE["max_bp"], elems // (BH * BW), _np2(NP)))
    warps = max(1, min(8, BP * BH * BW // 128))
    return BP, BH, BW, -(-H // BH), -(-W // BW), warps


_PLANS: dict = {}


def _lower(spec, H, W, NP, dtype, device, threshold):
    """Build (and cache) the launch plan of ``spec`` on ``NP`` planes of ``H x W``."""
    spec = lower(spec, (H, W))  # taps folded onto the image's period (a huge radius on a small image)
    # cval's sign is part of the key (-0.0 == 0.0 but pads differently signed zeros)
    key = (spec, math.copysign(1.0, spec.cval), H, W, min(NP, 64), dtype, device, threshold, tuple(_TILE.values()))
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    acc = compute_dtype(dtype)
    if isinstance(spec, BlurSpec):
        mode, cval = spec.mode, (0.0 if spec.normalized else spec.cval)
        lowered = _stencil_taps(spec.stencil, mode, cval)
        if lowered is None:
            return None
        taps, corr = lowered
        if spec.normalized:  # two channels (m x, m) through the same stencil
            stencils = [(taps, corr), (taps, corr)]
            K, CH = 1, 1
            epi = _NORM
        else:
            stencils = [(taps, corr)]
            K, CH = 1, 0
            epi = _BLEND
        sepf = False
        (ly, hy), (lx, hx) = spec.stencil.extent(-2), spec.stencil.extent(-1)
        ext = (ly, hy, lx, hx)
        has_mask_possible = True
    else:
        summed = spec.epilogue == "sum"
        if (len(spec.stencils) > 2 and not summed) or (spec.epilogue == "direction" and len(spec.stencils) != 2):
            return None
        mode, cval = spec.mode, spec.cval
        stencils = []
        # sep stencils run pass by pass in SciPy's order (``_sep_stencil``; constant mode exact
        # there: no correction terms); the footprint stays their adjoint's
        sepf = all(st.kind == "sep" for st in spec.stencils) and not summed
        for st in spec.stencils:
            lowered = _stencil_taps(st, mode, cval)
            if lowered is None:
                return None
            stencils.append((lowered[0], []) if sepf else lowered)
        if summed:  # a sum of linear stencils is one stencil: merged taps and corrections
            stencils = [_merge_taps(stencils)]
        K, CH = len(stencils), 0
        epi = _STACK if summed else _EPILOGUES[spec.epilogue]
        ext = (0, 0, 0, 0)
        has_mask_possible = False
    del has_mask_possible
    t0 = stencils[0][0]
    t1 = stencils[1][0] if len(stencils) == 2 else {}
    # forward footprint (NaN reaches through every tap of it) and adjoint footprint (only
    # non-zero weights: the reference's adjoint skips zero taps), each grouped
    # "stencil 0 only", "both", "stencil 1 only"
    fwd = _table(t0, t1, CH == 1)
    adj = _table({k: w for k, w in t0.items() if w != 0.0}, {k: w for k, w in t1.items() if w != 0.0}, CH == 1)
    (dys, dxs, w0, w1, NA, NB), (dys2, dxs2, w0b, w1b, NA2, NB2) = fwd, adj
    NT, NT2 = len(dys), len(dys2)
    corr_y, corr_x = [], []
    for k, (_, corr) in enumerate(stencils[:2] if CH == 0 else stencils[:1]):
        for axis, d, c in corr:
            (corr_y if axis == -2 else corr_x).append((k, d, c))
    cy = sorted({d for _, d, _ in corr_y})
    cx = sorted({d for _, d, _ in corr_x})
    cy0 = [sum(c for k, d, c in corr_y if k == 0 and d == e) for e in cy]
    cy1 = [sum(c for k, d, c in corr_y if k == 1 and d == e) for e in cy]
    cx0 = [sum(c for k, d, c in corr_x if k == 0 and d == e) for e in cx]
    cx1 = [sum(c for k, d, c in corr_x if k == 1 and d == e) for e in cx]

    lo_y, hi_y, lo_x, hi_x = min(dys), max(dys), min(dxs), max(dxs)

    def single(n, lo, hi):
        if mode in ("nearest", "constant"):
            return True
        if mode == "mirror":
            return n >= 2 and -lo <= n - 1 and hi <= n - 1
        return -lo <= n and hi <= n

    SINGLE = single(H, lo_y, hi_y) and single(W, lo_x, hi_x)
    sy = _slots(H, min(dys2), max(dys2), mode)  # preimages of the adjoint footprint
    sx = _slots(W, min(dxs2), max(dxs2), mode)

    fwd_tiles = _tiling(H, W, NP, _TILE["max_elems"])
    # (large unrolled adjoint footprints keep the forward's tile: registers)
    bwd_tiles = _tiling(H, W, NP, _TILE["bwd_elems"] if NT2 <= 12 else _TILE["max_elems"])
    BH2, BW2 = bwd_tiles[1], bwd_tiles[2]
    BBY = min(_np2(max([b - a + 1 for _, _, a, b, _ in sy], default=1)), BH2)
    BBX = min(_np2(max([b - a + 1 for _, _, a, b, _ in sx], default=1)), BW2)

    # ip: dy, dx, corr. rows, corr. cols, dy2, dx2, [sep offsets,] row slots, col slots
    # fp: w0, w1, corr. rows (2 x), corr. cols (2 x), cval, threshold, w0b, w1b
    # (and with sep stencils: their passes' offsets before the slots, weights at the end of fp)
    thr = threshold if threshold is not None else 0.0
    floats = w0 + w1 + cy0 + cy1 + cx0 + cx1 + [cval, thr] + w0b + w1b
    sps, soff, sun = [(0,) * 11, (0,) * 11], [], False
    if sepf:
        sps, soff, sun = _sep_tables(spec.stencils, 2 * NT + len(cy) + len(cx) + 2 * NT2, floats)
    ints = dys + dxs + cy + cx + dys2 + dxs2 + soff + [v for s in sy for v in s] + [v for s in sx for v in s]
    ip = torch.tensor(ints, dtype=torch.int32).to(device)
    fp = torch.tensor(floats, dtype=acc).to(device)
    unroll, unroll2 = NT <= _UNROLL_MAX, NT2 <= _UNROLL_MAX
    ce = dict(
        MODE=_MODES[mode], SINGLE=SINGLE, NT=NT, NA=NA, NB=NB, K=K,
        NCY=len(cy), NCX=len(cx), CH=CH, ACC=tl.float64 if acc == torch.float64 else tl.float32,
        UNROLL=unroll, F64=acc == torch.float64,
        DY=tuple(dys) if unroll else (), DX=tuple(dxs) if unroll else (),
        NT2=NT2, NA2=NA2, NB2=NB2, UNROLL2=unroll2,
        DY2=tuple(dys2) if unroll2 else (), DX2=tuple(dxs2) if unroll2 else (),
        SEPF=sepf, SP0=sps[0], SP1=sps[-1], SOFF=tuple([0] * (2 * NT + len(cy) + len(cx) + 2 * NT2) + soff) if sun else (),
        SUN=sun, NSO=len(soff),
    )
    plan = _Plan(ip, fp, ce, NT, ext, len(sy), len(sx), BBY, BBX, fwd_tiles, bwd_tiles,
                 recompute=NT <= _RECOMPUTE_MAX)
    _PLANS[key] = plan
    if len(_PLANS) > 512:
        _PLANS.pop(next(iter(_PLANS)))
    return plan


def _planes(t: torch.Tensor):
    """``(t, n_inner, s_outer, s_inner, s_h, s_w)``: plane ``i`` of ``t`` (leading dims
    flattened) starts at ``(i // n_inner) * s_outer + (i % n_inner) * s_inner``."""
    lead = collapse_planes(t.shape[:-2], t.stride()[:-2])
    if lead is None:
        t = t.contiguous()
        lead = collapse_planes(t.shape[:-2], t.stride()[:-2])
    n1, s0, s1 = lead
    return t, n1, s0, s1, t.stride(-2), t.stride(-1)


def _check_out(out, shape, dtype, device, inputs):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor; got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"out must have shape {tuple(shape)}, dtype {dtype} and device {device}; "
            f"got {tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    for t in inputs:
        if t is not None and t.numel() and out.numel():
            if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                raise ValueError("out must not share memory with the inputs")


def _fallback(name, *args, **kw):
    FALLBACKS[name] += 1
    return getattr(_ref, name)(*args, **kw)


def _safe_offsets(*ts):
    for t in ts:
        if t is not None and t.numel():
            span = sum((n - 1) * abs(s) for n, s in zip(t.shape[-2:], t.stride()[-2:]))
            if span >= 2**31:
                return False
    return True


def _launch_fwd(plan, x, mask, grad, out, epi, keep_border, NP, H, W):
    x3 = _planes(x)
    m3 = _planes(mask.view(torch.uint8)) if mask is not None else x3
    g3 = _planes(grad) if grad is not None else x3
    if epi in (_STACK, _U_MAG, _U_DIR) and plan.ce["K"] == 2:
        o_sk = out.stride(-3)
        o3 = _planes(out.select(-3, 0))
    else:
        o_sk = 0
        o3 = _planes(out)
    BP, BH, BW, n_th, n_tw, warps = plan.fwd
    grid = (-(-NP // BP) * n_th * n_tw,)
    by0, by1, bx0, bx1 = plan.ext
    with _device(x):
        _fwd_kernel[grid](
            *x3, *m3, *g3, *o3, o_sk, plan.ip, plan.fp, NP, H, W, n_th, n_tw, by0, by1, bx0, bx1,
            **plan.ce, HAS_MASK=mask is not None, KEEP_BORDER=keep_border, EPI=epi,
            BP=BP, BH=BH, BW=BW, num_warps=warps, enable_fp_fusion=False,
        )
    LAUNCHES["fwd"] += 1


def _launch_bwd(plan, x, mask, grad, u, out, epi, keep_border, NP, H, W):
    x3 = _planes(x)
    m3 = _planes(mask.view(torch.uint8)) if mask is not None else x3
    if u is not None:  # (NP, K, H, W) buffer written by the forward kernel
        usrc = 1
        u_sk = u.stride(1)
        u3 = _planes(u.select(1, 0))
        g3 = _planes(grad)
    elif epi == _STACK:
        usrc = 0
        if plan.ce["K"] == 2:
            u_sk = grad.stride(-3)
            u3 = _planes(grad.select(-3, 0))
        else:
            u_sk = 0
            u3 = _planes(grad)
        g3 = u3
    else:
        usrc = 0
        g3 = _planes(grad)
        u3, u_sk = g3, 0
    o3 = _planes(out)
    BP, BH, BW, n_th, n_tw, warps = plan.bwd
    grid = (-(-NP // BP) * n_th * n_tw,)
    by0, by1, bx0, bx1 = plan.ext
    with _device(x):
        _bwd_kernel[grid](
            *x3, *m3, *g3, *u3, u_sk, *o3, plan.ip, plan.fp, NP, H, W, n_th, n_tw,
            by0, by1, bx0, bx1, plan.SY, plan.SX,
            **plan.ce, HAS_MASK=mask is not None, KEEP_BORDER=keep_border, EPI=epi, USRC=usrc,
            BP=BP, BH=BH, BW=BW, BBY=plan.BBY, BBX=plan.BBX, EXTRAS=plan.SY + plan.SX > 0,
            num_warps=warps, enable_fp_fusion=False,
        )
    LAUNCHES["bwd"] += 1


def _device(x):
    """Launch on ``x``'s GPU (Triton launches on the current device and its current stream)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _result(out, shape, x):
    if out is None:
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    return out


# =============================================================================
# engine interface (as reference.py)


def _filter_forward_planes(x, spec: FilterSpec, out=None):
    shape = spec.out_shape(x.shape)
    if out is not None:
        _check_out(out, shape, x.dtype, x.device, (x,))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    plan = _lower(spec, H, W, NP, x.dtype, x.device, None) if x.numel() else None
    if x.numel() == 0:
        return _result(out, shape, x)
    if plan is None or not _safe_offsets(x, out):
        return _fallback("filter_forward", x, spec, out=out)
    y = _result(out, shape, x)
    _launch_fwd(plan, x, None, None, y, _EPILOGUES[spec.epilogue], False, NP, H, W)
    return y


def _filter_backward_planes(grad, x, spec: FilterSpec, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x, grad))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    if x.numel() == 0:
        return _result(out, x.shape, x)
    plan = _lower(spec, H, W, NP, x.dtype, x.device, None)
    if plan is None or not _safe_offsets(x, grad, out):
        return _fallback("filter_backward", grad, x, spec, out=out)
    if grad.shape != spec.out_shape(x.shape):
        grad = grad.expand(spec.out_shape(x.shape))
    gin = _result(out, x.shape, x)
    epi = _EPILOGUES[spec.epilogue]
    u = None
    if epi != _STACK and not plan.recompute:
        K = plan.ce["K"]
        u = torch.empty((NP, K, H, W), dtype=compute_dtype(x.dtype), device=x.device)
        _launch_fwd(plan, x, None, grad, u, _U_MAG if epi == _MAG else _U_DIR, False, NP, H, W)
    _launch_bwd(plan, x, None, grad, u, gin, epi, False, NP, H, W)
    return gin


def _blur_forward_planes(x, mask, spec: BlurSpec, threshold: float, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x, mask))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    if x.numel() == 0:
        return _result(out, x.shape, x)
    plan = _lower(spec, H, W, NP, x.dtype, x.device, _threshold(threshold, mask, x.dtype))
    if plan is None or not _safe_offsets(x, mask, out):
        return _fallback("blur_forward", x, mask, spec, threshold, out=out)
    mask = _mask(mask, x)
    y = _result(out, x.shape, x)
    _launch_fwd(plan, x, mask, None, y, _NORM if spec.normalized else _BLEND, spec.keep_border, NP, H, W)
    return y


def _blur_backward_planes(grad, x, mask, spec: BlurSpec, threshold: float, out=None):
    if out is not None:
        _check_out(out, x.shape, x.dtype, x.device, (x, grad, mask))
    H, W = x.shape[-2:]
    NP = x.numel() // max(1, H * W)
    if x.numel() == 0:
        return _result(out, x.shape, x)
    plan = _lower(spec, H, W, NP, x.dtype, x.device, _threshold(threshold, mask, x.dtype))
    if plan is None or not _safe_offsets(x, grad, mask, out):
        return _fallback("blur_backward", grad, x, mask, spec, threshold, out=out)
    mask = _mask(mask, x)
    grad = grad.expand(x.shape)
    gin = _result(out, x.shape, x)
    u = None
    if spec.normalized and not plan.recompute:
        u = torch.empty((NP, 1, H, W), dtype=compute_dtype(x.dtype), device=x.device)
        _launch_fwd(plan, x, mask, grad, u, _U_NORM, spec.keep_border, NP, H, W)
    _launch_bwd(plan, x, mask, grad, u, gin, _NORM if spec.normalized else _BLEND, spec.keep_border, NP, H, W)
    return gin


@functools.lru_cache(maxsize=256)
def _rounded(threshold: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(threshold, dtype=dtype))


def _threshold(threshold, mask, dtype) -> float:
    """``x >= threshold`` as torch compares it: in x's dtype, the threshold rounded to it
    (exact in the compute dtype).  Unused with an explicit mask."""
    return 0.0 if mask is not None else _rounded(float(threshold), dtype)


def _mask(mask, x):
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        mask = mask != 0
    if mask.device != x.device:
        mask = mask.to(x.device)
    return mask.expand(x.shape)


# specs of 1 or 3 axes, or per-axis modes (``_planar``): planes of one row, or the reference
# engine where no plane engine fits
filter_forward, filter_backward, blur_forward, blur_backward = _adapt(
    SimpleNamespace(filter_forward=_filter_forward_planes, filter_backward=_filter_backward_planes,
                    blur_forward=_blur_forward_planes, blur_backward=_blur_backward_planes),
    SimpleNamespace(**{n: functools.partial(_fallback, n)
                       for n in ("filter_forward", "filter_backward", "blur_forward", "blur_backward")}),
)

__import__("sys").modules.pop(__name__ + "_rank", None)  # its kernels follow this module's mode
from .triton_rank import rank_backward, rank_forward  # noqa: E402,F401  (rank filters)
