"""The general footprint kernels: one forward kernel and one backward kernel run any spec.

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

Device code uses Triton builtins only (no ``triton.language`` ``@jit`` helpers such as
``tl.zeros``/``tl.sum``): those are decorated when triton is imported, so a test that turns
TRITON_INTERPRET on after triton was imported would mix interpreted and compiled functions.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .prims import _add, _any, _atan2, _div, _fold, _inside, _mag_bad, _mag_scaled, _magnitude, _maxi, _plane_off, _sqrt  # noqa: F401


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
    Z0: tl.constexpr = cfg[29]
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
    if Z0:  # dense stencils from +0.0, as SciPy's N-D correlate sums them (the same bits as adding
        # +0.0 last: only a sum of -0.0 terms changes; an empty one is +0.0); a selective
        # blur's sums keep the terms' sum
        acc0 = acc0 + 0.0
        acc1 = acc1 + 0.0
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
def _u_from_y(y0, y1, g, EPI: tl.constexpr, K: tl.constexpr, F64: tl.constexpr):
    """Upstream gradient of each stencil from the stencil values and the output gradient."""
    if EPI == 1:  # magnitude: g * y_k / |y|, 0 where |y| == 0 (rescaled |y|: _magnitude)
        # branch-free: t_k = y_k / m (m = 1, t_k = y_k exactly, but where the sum of squares
        # over/underflows), u_k = g t_k / sqrt(sum t_k**2)
        s = y0 * y0
        if K == 2:
            s += y1 * y1
        bad = _mag_bad(s, y0, y1, y1, K, F64)
        m = tl.abs(y0)
        if K == 2:
            m = tl.maximum(m, tl.abs(y1))
        mm = tl.where(bad & (m > 0) & (m != float("inf")), m, 1.0)
        t0 = _div(y0, mm, F64)  # (divided, not times 1 / m: that is inf for a subnormal m)
        t1 = _div(y1, mm, F64)
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
    SP1: tl.constexpr, SOFF: tl.constexpr, SUN: tl.constexpr, NSO: tl.constexpr, Z0: tl.constexpr, BP: tl.constexpr,
    BH: tl.constexpr, BW: tl.constexpr,
):
    """Stencils + epilogue on a ``[BP planes, BH rows, BW cols]`` tile."""
    cfg: tl.constexpr = (MODE, SINGLE, NT, NA, NB, K, NCY, NCX, CH, HAS_MASK, KEEP_BORDER, ACC, UNROLL, EPI, 0, F64,
                         DY, DX, NT2, NA2, NB2, UNROLL2, DY2, DX2, SEPF, SP0, SP1, SOFF, SUN, Z0)
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
        tl.store(optr, _magnitude(acc0, acc1, acc1, K, F64).to(OT), mask=valid)
    elif EPI == 2:
        tl.store(optr, _atan2(acc0, acc1, F64).to(OT), mask=valid)
    elif EPI == 8:  # sum: the terms added in order, each summed on its own (SciPy's ``output +=``)
        if K == 2:
            acc0 = acc0 + acc1
        tl.store(optr, acc0.to(OT), mask=valid)
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
    Z0: tl.constexpr, BP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr, BBY: tl.constexpr, BBX: tl.constexpr,
    EXTRAS: tl.constexpr,
):
    """Adjoint on a ``[BP, BH, BW]`` tile of the input gradient: main term, border bands, epilogue."""
    cfg: tl.constexpr = (MODE, SINGLE, NT, NA, NB, K, NCY, NCX, CH, HAS_MASK, KEEP_BORDER, ACC, UNROLL, EPI, USRC, F64,
                         DY, DX, NT2, NA2, NB2, UNROLL2, DY2, DX2, SEPF, SP0, SP1, SOFF, SUN, Z0)
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
