"""Device helpers every Triton kernel of the engine shares: boundary folding, plane offsets,
correctly rounded division and square root, ``atan2`` and the overflow-safe magnitude.

Arithmetic is float32 for 16/32-bit inputs and float64 for float64, with
``sqrt_rn`` / ``div_rn`` and an own ``atan2`` (Cephes polynomials; the
interpreter has no libdevice).  Device code uses Triton builtins only (no
``triton.language`` ``@jit`` helpers such as ``tl.zeros``/``tl.sum``), so the
module can be re-imported in interpreter mode after ``triton`` was imported.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.constexpr_function
def _item(t, *index):
    """``t[i][j]...`` of a constexpr tuple, as a constexpr.  Triton 3.6 turns a plain subscript that
    yields a tuple holding tuples into a ``tl.tuple``, which it cannot build (``'tuple' object has
    no attribute 'type'``), so a pass taken out of a stencil description goes through here."""
    for i in index:
        t = t[i]
    return t


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
def _maxi(a, b):
    return tl.maximum(a, b)

@triton.jit
def _any(b):
    """Whether any element of the 3-D boolean ``b`` is set (a block-uniform scalar)."""
    return tl.reduce(tl.reduce(tl.reduce(b.to(tl.int32), 2, _maxi), 1, _maxi), 0, _maxi) > 0

@triton.jit
def _mag_bad(s, y0, y1, y2, K: tl.constexpr, F64: tl.constexpr):
    """Where the sum of squares ``s`` of the ``K`` (1 to 3) components ``y0, y1, y2`` overflowed,
    or underflowed to 0 / a subnormal while a component is not 0 (``reference._rescale``)."""
    nz = y0 != 0
    if K >= 2:
        nz = nz | (y1 != 0)
    if K == 3:
        nz = nz | (y2 != 0)
    if F64:
        tiny = 2.2250738585072014e-308
    else:
        tiny = 1.1754943508222875e-38
    return (s == float("inf")) | ((s < tiny) & nz)

@triton.jit
def _mag_scaled(y0, y1, y2, bad, K: tl.constexpr, F64: tl.constexpr):
    """``(m, m', t0, t1, r)``: ``m = max |y_k|``, ``m' = m`` where ``bad`` (finite, > 0; else 1),
    ``t_k = y_k / m'``, ``r = sqrt(sum t_k**2)`` (``reference._scaled``), for ``K`` (1 to 3)
    components."""
    m = tl.abs(y0)
    if K >= 2:
        m = tl.maximum(m, tl.abs(y1))
    if K == 3:
        m = tl.maximum(m, tl.abs(y2))
    mm = tl.where(bad & (m > 0) & (m != float("inf")), m, 1.0)
    t0 = _div(y0, mm, F64)
    r = t0 * t0
    t1 = t0
    if K >= 2:
        t1 = _div(y1, mm, F64)
        r += t1 * t1
    if K == 3:
        t2 = _div(y2, mm, F64)
        r += t2 * t2
    return m, mm, t0, t1, _sqrt(r, F64)

@triton.jit
def _magnitude(y0, y1, y2, K: tl.constexpr, F64: tl.constexpr):
    """``sqrt(sum y_k**2)`` of ``K`` (1 to 3) components, rescaled where that sum over/underflows
    (a rare, block-uniform branch)."""
    s = y0 * y0
    if K >= 2:
        s += y1 * y1
    if K == 3:
        s += y2 * y2
    r = _sqrt(s, F64)
    bad = _mag_bad(s, y0, y1, y2, K, F64)
    if _any(bad):
        m, mm, t0, t1, q = _mag_scaled(y0, y1, y2, bad, K, F64)
        r = tl.where(bad, tl.where(m == float("inf"), m, mm * q), r)
    return r
