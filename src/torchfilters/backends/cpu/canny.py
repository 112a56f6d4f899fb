"""Canny edges on the CPU: fused numba kernels, smoothing included (``torchfilters.canny``).

Per ``(H, W)`` slice of the images ``(N, H, W)`` (float32 or float64, zeroed outside the mask):

1. **Gaussian -> Sobel -> magnitude -> NMS, fused** (:func:`_k_fused`): a work item is a band
   of rows of one slice.  It computes the smoothed rows of its band plus two halo rows above and
   below, one at a time, into a ring of five rows (``canny_smooth._smooth_row``: SciPy's two
   float64 passes, each rounded to the dtype, and the bleed-over division), the gradient and
   magnitude of each into rings of three (:func:`_grad_row`), and classifies each pixel (0:
   suppressed, 1: low, 2: seed, ``>= high``) from them (:func:`_nms_row`, without branches).
   Nothing but the classes is stored; halo rows are recomputed at band seams.  The bleed-over
   without a mask (the Gaussian of ones plus epsilon) is computed once per ``(H, W, sigma, mode,
   cval, dtype)`` and kept (:func:`_bleed_ones`); a mask's is computed per call (once when the
   mask is broadcast over the batch).  With ``use_quantiles`` the thresholds need the whole
   magnitude first: :func:`_k_smooth` and :func:`_k_mag` write it, the order statistics are
   taken per slice by a radix selection (:func:`_k_select`, no sort) and interpolated as
   ``numpy.percentile`` (``reference_canny.thresholds``), and :func:`_k_nms` classifies.
2. **Hysteresis** (``canny_hyst``): a stack-based flood fill from every seed through the low
   pixels (8-connected), in place; inside the fused work item when it is a whole slice, else per
   (slice, band), then from the reached pixels at every seam (``_k_seams``), then the bool map.

The arithmetic is ``reference_canny``'s (SciPy's Gaussian and Sobel rounding, NumPy's float32
magnitude, the C promotions of scikit-image's NMS), so the classes are the reference's bit for
bit.  The row loops read views at fixed offsets (never clamped indices), so LLVM vectorises
them.  Work items run on the package's thread pool (``threads._launch``): parallel over slices,
and over row bands of each slice when there are fewer slices than threads.  The classes, the
edge map and the quantile path's temporaries come from the buffer cache (no page faults).
Kernels are cached on disk like the others (``cache.install()``); one compilation per dtype.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from .. import reference_canny as _ref
from . import cache

cache.install()

from .buffers import _alloc
from .canny_hyst import _hyst_band, _k_hyst, _k_reached, _k_seams, _reached
from .canny_smooth import _as, _k_smooth, _smooth_row, smooth_plan
from .prims import _JIT
from .threads import _launch, _threads

__all__ = ["available", "canny_edges", "canny_fused"]

NAME = "cpu"


def available(device, dtype) -> bool:
    return torch.device(device).type == "cpu" and dtype in (torch.float32, torch.float64)


@njit(inline="always", **_JIT)
def _grad(r0l, r0c, r0r, r1l, r1r, r2l, r2c, r2r, c):
    """SciPy's ``(sobel(s, 0), sobel(s, 1))`` at a pixel from its eight neighbours (``r0*`` the
    row above, ``r2*`` below; ``l``/``c``/``r`` left, centre, right; edges already folded):
    differences in the dtype, the cross pass in float64, rounded once."""
    d0c = r2c - r0c
    d0l = r2l - r0l
    d0r = r2r - r0r
    gi = _as(np.float64(d0c) * 2.0 + (np.float64(d0l) + np.float64(d0r)), c)
    d1c = r1r - r1l
    d1u = r0r - r0l
    d1d = r2r - r2l
    gj = _as(np.float64(d1c) * 2.0 + (np.float64(d1u) + np.float64(d1d)), c)
    return gi, gj


@njit(**_JIT)
def _grad_row(r0, r1, r2, W, gi, gj, mag):
    """The gradient ``(gi, gj)`` and magnitude ``sqrt(gi * gi + gj * gj)`` (all in the dtype) of
    the smoothed row ``r1`` (``r0`` above, ``r2`` below, edges already folded); mode
    ``'reflect'`` at the row's ends.  The interior loop reads views at fixed offsets (no
    clamping), so it vectorises."""
    c = r1[0]
    for j in (0, W - 1):
        jl = max(j - 1, 0)
        jr = min(j + 1, W - 1)
        a, b = _grad(r0[jl], r0[j], r0[jr], r1[jl], r1[jr], r2[jl], r2[j], r2[jr], c)
        gi[j] = a
        gj[j] = b
        mag[j] = np.sqrt(a * a + b * b)
    if W < 3:
        return
    n = W - 2
    r0l, r0c, r0r = r0[0:n], r0[1 : n + 1], r0[2 : n + 2]
    r1l, r1r = r1[0:n], r1[2 : n + 2]
    r2l, r2c, r2r = r2[0:n], r2[1 : n + 1], r2[2 : n + 2]
    gic, gjc, mc = gi[1 : n + 1], gj[1 : n + 1], mag[1 : n + 1]
    for j in range(n):
        a, b = _grad(r0l[j], r0c[j], r0r[j], r1l[j], r1r[j], r2l[j], r2c[j], r2r[j], c)
        gic[j] = a
        gjc[j] = b
        mc[j] = np.sqrt(a * a + b * b)


@njit(inline="always", **_JIT)
def _lerp_le(n2, n1, w, m64):
    """``n2 * w + n1 * (1.0 - w) <= m`` with C's promotions (``n2 * w`` in the dtype)."""
    return np.float64(n2 * w) + np.float64(n1) * (1.0 - np.float64(w)) <= m64


@njit(**_JIT)
def _nms_row(gi, gj, W, mu, mc, md, em, lo, hi, out):
    """Classes of an interior row from its gradient (``gi``, ``gj``), the magnitude rows above
    (``mu``), at (``mc``) and below (``md``) and its eroded-mask row ``em``: skimage's
    ``_nonmaximum_suppression_bilinear`` without branches.  Its four cases: ``s1`` (``gi`` and
    ``gj`` of one sign, zeros included: ``cond1``) or not (``cond2``); ``h`` the case that divides
    ``|gi| / |gj|`` (``cond1`` and ``not |gi| > |gj|``, or ``cond2`` and ``|gi| < |gj|``).  A NaN
    gradient has a NaN magnitude, which fails ``>= lo`` as skimage's tests fail."""
    out[0] = 0
    out[W - 1] = 0
    n = W - 2
    gic, gjc, emc = gi[1 : n + 1], gj[1 : n + 1], em[1 : n + 1]
    mul, muc, mur = mu[0:n], mu[1 : n + 1], mu[2 : n + 2]
    mcl, mcc, mcr = mc[0:n], mc[1 : n + 1], mc[2 : n + 2]
    mdl, mdc, mdr = md[0:n], md[1 : n + 1], md[2 : n + 2]
    oc = out[1 : n + 1]
    for t in range(n):
        a = gic[t]
        b = gjc[t]
        m = mcc[t]
        m64 = np.float64(m)
        s1 = ((a >= 0) & (b >= 0)) | ((a <= 0) & (b <= 0))
        ai = abs(a)
        aj = abs(b)
        h = (ai <= aj) if s1 else (ai < aj)
        w = (ai if h else aj) / (aj if h else ai)
        # every case's two comparisons, then the case's: a select between loads from different
        # rows would become gathers
        u0, u1, u2 = mul[t], muc[t], mur[t]
        c0, c2 = mcl[t], mcr[t]
        d0, d1, d2 = mdl[t], mdc[t], mdr[t]
        ok_a = _lerp_le(d2, d1, w, m64) & _lerp_le(u0, u1, w, m64)
        ok_b = _lerp_le(d2, c2, w, m64) & _lerp_le(u0, c0, w, m64)
        ok_c = _lerp_le(u2, c2, w, m64) & _lerp_le(d0, c0, w, m64)
        ok_d = _lerp_le(u2, u1, w, m64) & _lerp_le(d0, d1, w, m64)
        ok = (ok_b if h else ok_a) if s1 else (ok_c if h else ok_d)
        keep = emc[t] & (m64 >= lo) & (m > 0) & ok
        oc[t] = np.uint8(keep) + np.uint8(keep & (m64 >= hi))


@njit(**_JIT)
def _k_fused(x, wy, iy, wx, ix, cval, bleed, hasb, em, hasm, lo, hi, cls, flat, out, nb, it0, it1):
    """Smoothing -> Sobel -> magnitude -> NMS over work items ``(slice, band)``; classes into
    ``cls``.  The smoothed rows of the band and two halo rows on each side go to a ring of five
    rows (:func:`canny_smooth._smooth_row`), the gradient and magnitude to rings of three:
    nothing but the classes leaves the cache; halo rows are recomputed at band seams.  With one
    band a slice (``nb == 1``) the item then runs the slice's hysteresis while its classes are in
    cache (``flat``: ``cls`` as ``(N, H * W)``; ``out`` the bool map, likewise)."""
    _N, H, W = x.shape
    ext = np.empty(W + 2 * (wx.shape[0] - 1), np.float64)
    acc = np.empty(W, np.float64)
    S = np.empty((5, W), x.dtype)
    GI = np.empty((3, W), x.dtype)
    GJ = np.empty((3, W), x.dtype)
    M = np.empty((3, W), x.dtype)
    ones = np.ones(W, np.bool_)
    ne = em.shape[0]
    stack = np.empty(H * W + 1 if nb == 1 else 1, np.int64)
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        i0 = b * H // nb
        i1 = (b + 1) * H // nb
        cls[n, i0:i1, :] = 0
        a = max(i0, 1)
        e = min(i1, H - 1)
        if a >= e or W < 3:
            if nb == 1:
                out[n] = False
            continue
        en = n if ne > 1 else 0
        nxt = max(a - 2, 0)
        for m in range(a - 1, e + 1):  # magnitude rows a - 1 .. e
            last = min(m + 1, H - 1)
            while nxt <= last:
                _smooth_row(x, n, nxt, wy, iy, wx, ix, cval, bleed, hasb, ext, acc, S[nxt % 5])
                nxt += 1
            _grad_row(S[max(m - 1, 0) % 5], S[m % 5], S[last % 5], W, GI[m % 3], GJ[m % 3], M[m % 3])
            i = m - 1
            if i >= a:
                _nms_row(GI[i % 3], GJ[i % 3], W, M[(i - 1) % 3], M[i % 3], M[(i + 1) % 3],
                         em[en, i] if hasm else ones, lo[n], hi[n], cls[n, i])
        if nb == 1:
            _hyst_band(flat[n], stack, W, 0, H * W)
            _reached(flat[n], out[n])


@njit(**_JIT)
def _k_mag(s, mag, nb, it0, it1):
    """The magnitude of every pixel of the smoothed ``s`` (the quantile path), work items
    ``(slice, band)``."""
    _N, H, W = s.shape
    gi = np.empty(W, s.dtype)
    gj = np.empty(W, s.dtype)
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        for i in range(b * H // nb, (b + 1) * H // nb):
            _grad_row(s[n, max(i - 1, 0)], s[n, i], s[n, min(i + 1, H - 1)], W, gi, gj, mag[n, i])


@njit(**_JIT)
def _k_nms(s, mag, em, hasm, lo, hi, cls, nb, it0, it1):
    """NMS from a stored magnitude (the quantile path; the gradient recomputed)."""
    _N, H, W = s.shape
    gi = np.empty(W, s.dtype)
    gj = np.empty(W, s.dtype)
    mr = np.empty(W, s.dtype)
    ones = np.ones(W, np.bool_)
    ne = em.shape[0]
    for it in range(it0, it1):
        n = it // nb
        b = it % nb
        i0 = b * H // nb
        i1 = (b + 1) * H // nb
        cls[n, i0:i1, :] = 0
        if W < 3:
            continue
        en = n if ne > 1 else 0
        for i in range(max(i0, 1), min(i1, H - 1)):
            _grad_row(s[n, i - 1], s[n, i], s[n, i + 1], W, gi, gj, mr)
            _nms_row(gi, gj, W, mag[n, i - 1], mag[n, i], mag[n, i + 1], em[en, i] if hasm else ones,
                     lo[n], hi[n], cls[n, i])


@njit(**_JIT)
def _k_select(bits, ks, nlev, res, it0, it1):
    """``res[s, t]``: the ``ks[t]``-th smallest (0-based) of ``bits[s]``, compared as unsigned
    integers (the bits of non-negative floats, NaN above ``inf``: the order of a sort), per slice
    ``s``: a radix selection over ``nlev`` 16-bit digits from the top, each a counting pass over
    the slice (the first shared by every target, the others counting only the elements whose
    higher digits are the target's)."""
    _N, n = bits.shape
    K = ks.shape[0]
    hist = np.zeros((K, 65536), np.int32)  # (the caller keeps n < 2**31)
    pref = np.zeros(K, np.uint64)
    rank = np.zeros(K, np.int64)
    upref = np.zeros(K, np.uint64)
    slot = np.zeros(K, np.int64)
    mask = np.uint64(0xFFFF)
    for s in range(it0, it1):
        b = bits[s]
        for lev in range(nlev):
            shift = np.uint64(16 * (nlev - 1 - lev))
            if lev == 0:
                h = hist[0]
                h[:] = 0
                for i in range(n):
                    h[(np.uint64(b[i]) >> shift) & mask] += 1
            else:
                nu = 0  # the distinct prefixes: one histogram each
                for t in range(K):
                    u = 0
                    while u < nu and upref[u] != pref[t]:
                        u += 1
                    if u == nu:
                        upref[nu] = pref[t]
                        hist[nu] = 0
                        nu += 1
                    slot[t] = u
                up = shift + np.uint64(16)
                for i in range(n):
                    v = np.uint64(b[i])
                    hv = v >> up
                    for u in range(nu):
                        if hv == upref[u]:
                            hist[u, (v >> shift) & mask] += 1
                            break
            for t in range(K):
                h = hist[slot[t] if lev else 0]
                r = ks[t] if lev == 0 else rank[t]
                d = 0
                while r >= h[d]:
                    r -= h[d]
                    d += 1
                rank[t] = r
                pref[t] = (pref[t] << np.uint64(16)) | np.uint64(d) if lev else np.uint64(d)
        for t in range(K):
            res[s, t] = pref[t]


def _select(flat, idx):
    """``reference_canny.sorted_select`` by :func:`_k_select` (``flat`` a CPU float tensor)."""
    N, n = flat.shape
    if n >= 1 << 31:  # pragma: no cover - int32 counts
        return _ref.sorted_select(flat, idx)
    f = flat.contiguous().numpy()
    u = np.uint32 if f.dtype == np.float32 else np.uint64
    res = np.empty((N, idx.numel()), np.uint64)
    _launch(_k_select, (f.view(u), idx.numpy().astype(np.int64), 2 if u is np.uint32 else 4, res), N, _threads(),
            n < 65536)
    return torch.from_numpy(res.astype(u).view(f.dtype))


def _bands(N: int, H: int, nt: int) -> int:
    """Row bands per slice: enough work items for the threads, bands of at least 32 rows."""
    if nt <= 1 or N >= 2 * nt:
        return 1
    return max(1, min(-(-4 * nt // N), H // 32))


_IDENTITY = (np.ones(1), np.zeros(1, np.int64))
_BLEED: dict = {}


def _np(t):
    return t.contiguous().numpy()


def _bleed_ones(H, W, sigma, mode, cval, dtype, plan):
    """The Gaussian of an image of ones plus the dtype's epsilon ``(1, H, W)``: scikit-image's
    bleed-over without a mask, computed once per ``(H, W, sigma, mode, cval, dtype)``."""
    key = (H, W, sigma, mode, cval, dtype)
    b = _BLEED.get(key)
    if b is None:
        ones = np.ones((1, H, W), _np_dtype(dtype))
        b = _smooth(ones, plan, cval, None) + np.finfo(ones.dtype).eps
        if b.nbytes <= 1 << 26:  # (kept up to 64 MiB each, 8 at most)
            if len(_BLEED) >= 8:
                _BLEED.clear()
            _BLEED[key] = b
    return b


def _np_dtype(dtype):
    return np.float32 if dtype == torch.float32 else np.float64


def _smooth(x, plan, cval, bleed):
    """The smoothed images of ``x`` (NumPy ``(N, H, W)``), divided by ``bleed`` if given."""
    N, H, W = x.shape
    s = np.empty_like(x)
    nt = _threads()
    nb = _bands(N, H, nt)
    hasb = bleed is not None
    _launch(_k_smooth, (x, *plan, float(cval), bleed if hasb else x[:1, :1, :1], hasb, s, nb), N * nb, nt,
            N * H * W < 65536)
    return s


def canny_fused(image, mask, emask, sigma, mode, cval, bleed_over, low, high, use_quantiles):
    """Bool ``(N, H, W)`` Canny edges of the images ``(N, H, W)`` (float32 or float64, zero
    outside ``mask``), smoothing included: ``torchfilters.canny`` from the Gaussian on.
    ``mask``/``emask``: bool ``(1 or N, H, W)`` or None; ``bleed_over``: divide by the Gaussian
    of the mask (of ones without one) plus epsilon.  None where the kernel is not SciPy-symmetric
    (the caller smooths generically)."""
    _N, H, W = image.shape
    plan = smooth_plan(H, W, sigma, canonical(mode))
    if plan is None:  # pragma: no cover
        return None
    x = _np(image)
    bleed = None
    if bleed_over:
        if mask is None:
            bleed = _bleed_ones(H, W, tuple(sigma), canonical(mode), float(cval), image.dtype, plan)
        else:
            bleed = _smooth(_np(mask).astype(x.dtype), plan, cval, None) + np.finfo(x.dtype).eps
    return _edges(x, plan, cval, bleed, emask, low, high, use_quantiles)


def canonical(mode):
    from ..._validate import canonical_mode

    return canonical_mode(mode)


def _edges(x, plan, cval, bleed, emask, low, high, use_quantiles):
    N, H, W = x.shape
    out = _alloc((N, H, W), torch.bool)  # (large ones from the buffer cache: no page faults)
    if x.size == 0:
        return out
    nt = _threads()
    nb = _bands(N, H, nt)
    hasm = emask is not None
    em = _np(emask) if hasm else np.zeros((1, 1, 1), np.bool_)
    hasb = bleed is not None
    bl = bleed if hasb else x[:1, :1, :1]
    cls = _alloc((N, H, W), torch.uint8).numpy()
    c2 = cls.reshape(N, H * W)
    o2 = out.numpy().reshape(N, H * W)
    serial = N * H * W < 65536
    if use_quantiles:
        dt = torch.float32 if x.dtype == np.float32 else torch.float64
        s = _alloc(x.shape, dt).numpy()
        _launch(_k_smooth, (x, *plan, float(cval), bl, hasb, s, nb), N * nb, nt, serial)
        mag = _alloc(x.shape, dt).numpy()
        _launch(_k_mag, (s, mag, nb), N * nb, nt, serial)
        lo, hi = _ref.thresholds(torch.from_numpy(mag), low, high, True, _select)
        _launch(_k_nms, (s, mag, em, hasm, lo.numpy(), hi.numpy(), cls, nb), N * nb, nt, serial)
    else:
        lo, hi = _ref.thresholds(torch.from_numpy(x[:, :0, :0]), low, high, False)
        _launch(_k_fused, (x, *plan, float(cval), bl, hasb, em, hasm, lo.numpy(), hi.numpy(), cls, c2, o2, nb),
                N * nb, nt, serial)
        if nb == 1:  # the hysteresis ran in the fused items
            return out
    _launch(_k_hyst, (c2, W, nb), N * nb, nt, serial)
    if nb > 1:
        _launch(_k_seams, (c2, W, nb), N, nt, serial)
    _launch(_k_reached, (c2, o2, nb), N * nb, nt, serial)
    return out


def canny_edges(smoothed, emask, low, high, use_quantiles):
    """Bool ``(N, H, W)`` edges of the smoothed images (``reference_canny.canny_edges``): the
    fused kernel with the identity for the Gaussian (``x * 1.0`` is exact)."""
    plan = (*_IDENTITY, *_IDENTITY)
    return _edges(_np(smoothed), plan, 0.0, None, emask, low, high, use_quantiles)
