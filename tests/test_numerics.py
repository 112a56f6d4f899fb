"""Numerics every engine shares (issue 11): SciPy's order of summation, signs of zero, the
magnitude's over/underflow, exact zeros on constant images.

* **Order of summation.**  ``scipy.ndimage.correlate1d`` (``NI_Correlate1D``) sums a
  symmetric pass as ``x[c]*w[c] + (x[c-j] + x[c+j])*w[c-j]`` (pairs from the outermost in),
  an antisymmetric one with ``x[c-j] - x[c+j]``, any other one as the last tap, then the rest
  in order; symmetry is decided with a ``DBL_EPSILON`` tolerance.  Every engine sums so
  (``_lowering.pass_kind`` / ``pass_entries``), the passes in the spec's order: float64
  results are SciPy's bit for bit, signs of zero included, which is what
  ``gradient_direction`` needs (``atan2(+-0, x < 0)`` is ``+-pi``).
* **Magnitude.**  Where ``sum y_k**2`` overflows, or underflows while a component is not 0,
  the magnitude is rescaled (``m * sqrt(sum (y_k/m)**2)``, ``m = max |y_k|``) and its
  gradient stays finite.
* **Constant images.**  The Gaussian derivative kernels are exactly antisymmetric, so
  ``(c - c) * w`` makes ``gaussian_gradient_magnitude`` of a constant image exactly 0, and its
  gradient too.

Engines: ``reference``, ``cpu`` (its direct 3x3 path where it applies), ``cpu-tiled`` (the cpu
engine with the direct path turned off: its tiled engine) and ``triton`` (interpreted).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch

import torchfilters as tf
from torchfilters import kernels
from torchfilters.backends import _lowering
from torchfilters.backends._lowering import ANTI, GENERAL, SYM, pass_entries, pass_kind
from torchfilters._spec import Pass

ENGINES = ("reference", "cpu", "cpu-tiled", "triton")
MODES = ("reflect", "nearest", "mirror", "wrap", "constant")
from conftest import _NoReplays, interpreted_triton  # noqa: E402


@pytest.fixture(scope="module")
def triton_engine():
    """The Triton engine with interpreted kernels, installed as backend "triton" (as in
    test_triton.py: ``TRITON_INTERPRET`` must be set before its kernels are decorated)."""
    pytest.importorskip("triton")
    with interpreted_triton() as mod:
        yield mod


@pytest.fixture(params=ENGINES)
def backend(request, monkeypatch):
    """The ``backend=`` name of an engine; ``cpu-tiled`` runs the cpu engine without its direct
    3x3 path; ``triton`` checks that its kernels ran (no fallback)."""
    name = request.param
    if name == "triton":
        T = request.getfixturevalue("triton_engine")
        before, fell = T.LAUNCHES["fwd"] + T.LAUNCHES["rows"], sum(T.FALLBACKS.values())
        yield "triton"
        assert T.LAUNCHES["fwd"] + T.LAUNCHES["rows"] > before, "the Triton kernels did not run"
        assert sum(T.FALLBACKS.values()) == fell, f"fell back to the reference: {dict(T.FALLBACKS)}"
        return
    if name == "cpu-tiled":
        cpu = pytest.importorskip("torchfilters.backends.cpu")
        monkeypatch.setattr(cpu, "_d3_plan", lambda *a, **k: None)
        monkeypatch.setattr(cpu, "_replays", _NoReplays())
        name = "cpu"
    yield name


def same_bits(a, b) -> bool:
    """Equal values, NaNs and signs of zero included."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))))


def mismatch(a, b) -> str:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    bad = ~(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b)))
    idx = np.argwhere(bad)[:4]
    return f"{int(bad.sum())} differ, e.g. at {idx.tolist()}: {a[bad][:4].tolist()} vs SciPy {b[bad][:4].tolist()}"


def assert_sqrt_bits(got, expected, backend):
    """SciPy's bits where the engine's square root is IEEE's (cpu, triton); the reference's
    ``torch.sqrt`` (a vectorised approximation on CPU) is within an ulp of it."""
    if backend == "reference":
        np.testing.assert_array_max_ulp(got, expected, maxulp=1)
        assert np.array_equal(np.signbit(got), np.signbit(expected))
    else:
        assert same_bits(got, expected), mismatch(got, expected)


def signed_zero_image() -> np.ndarray:
    """Integers in -2..2 (zeros as -0.0 and +0.0), with constant regions of +1, -3, -0.0 and +0.0
    and ramps along x, rising and falling, of negative and of positive values: derivatives
    that are exactly zero with either sign next to negative and positive ones (SciPy's
    ``atan2`` there: -pi, -0, +0, pi and +-pi/2)."""
    rng = np.random.default_rng(11)
    x = rng.integers(-2, 3, (16, 18)).astype(np.float64)
    x[(x == 0) & (rng.random(x.shape) < 0.5)] = -0.0
    x[2:6, 3:8] = 1.0
    x[12:, :4] = -0.0
    x[0:3, 12:] = -3.0
    x[13:, 13:] = 0.0
    x[7:11, 0:6] = np.arange(-7.0, -1.0)  # rising, negative: gy = -0, gx > 0
    x[7:11, 6:12] = np.arange(1.0, 7.0)  # rising, positive: +0
    x[12:16, 5:11] = np.arange(-1.0, -7.0, -1.0)  # falling, negative: -pi
    x[3:7, 12:18] = np.arange(7.0, 1.0, -1.0)  # falling, positive: pi
    return x


def sp_deriv(x, axis, operator, mode, cval=0.0):
    """SciPy's derivative: ``sobel``/``prewitt`` themselves, the [-1, 0, 1] then smoothing
    recipe for the others."""
    if operator in ("sobel", "prewitt"):
        return getattr(ndi, operator)(x, axis, mode=mode, cval=cval)
    y = ndi.correlate1d(x, [-1.0, 0.0, 1.0], axis, mode=mode, cval=cval)
    smooth = {"scharr": [3.0, 10.0, 3.0], "central": None}[operator]
    return y if smooth is None else ndi.correlate1d(y, smooth, 1 - axis, mode=mode, cval=cval)


# ------------------------------------------------------------ order of summation, signs of zero


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("operator", ["sobel", "prewitt"])
def test_direction_keeps_scipys_signed_zeros(backend, operator, mode):
    x = signed_zero_image()
    gy, gx = sp_deriv(x, 0, operator, mode), sp_deriv(x, 1, operator, mode)
    expected = np.arctan2(gy, gx)
    got = tf.gradient_direction(torch.from_numpy(x), operator=operator, mode=mode, backend=backend).numpy()
    # every quadrant's zero case is in the image: -pi, -0, +0, pi (and +-pi/2)
    zero = (gy == 0) | (gx == 0)
    special = {float(v) for v in expected[zero]}
    assert {math.pi, -math.pi, math.pi / 2, -math.pi / 2} <= special
    assert np.signbit(expected[zero & (expected == 0)]).any() and (~np.signbit(expected[zero & (expected == 0)])).any()
    assert same_bits(got[zero], expected[zero]), mismatch(got[zero], expected[zero])
    # elsewhere the engines' own atan2 (torch's, or a Cephes polynomial): to an ulp or two
    np.testing.assert_allclose(got, expected, rtol=1e-15, atol=0)
    assert np.array_equal(np.signbit(got), np.signbit(expected))


def test_direction_quadrants(backend):
    """One pixel per case of ``atan2(+-0, x)``: the sign of ``gy``'s zero is the centre sample's
    (SciPy sums ``x[c]*0 + (a - a)*-1``), a -0.0 sample's included; ``gx`` says the half-plane."""
    row = [-9.0, -8.0, -7.0, 1.0, 2.0, 3.0, -1.0, -2.0, -3.0, 9.0, 8.0, 7.0, -1.0, -0.0, -0.0, 5.0, 3.0, 0.0, -3.0]
    x = np.array([row] * 5)
    gy, gx = ndi.sobel(x, 0), ndi.sobel(x, 1)
    expected = np.arctan2(gy, gx)
    want = {1: -0.0, 4: 0.0, 7: -math.pi, 10: math.pi, 13: -0.0, 17: math.pi}
    for j, v in want.items():  # (the oracle itself: the cases are what they say)
        assert same_bits(expected[2, j], v), (j, expected[2, j])
    got = tf.gradient_direction(torch.from_numpy(x), operator="sobel", backend=backend).numpy()
    assert same_bits(got, expected), mismatch(got, expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("operator", ["sobel", "scharr", "central"])
def test_derivatives_are_scipys_bits(backend, operator, mode, dtype):
    """Integer images (exact sums in either precision): SciPy's values and signs of zero."""
    x = signed_zero_image()
    got = tf.gradient(torch.from_numpy(x).to(dtype), operator=operator, mode=mode, backend=backend).double().numpy()
    for k, axis in enumerate((0, 1)):
        e = sp_deriv(x, axis, operator, mode)
        assert same_bits(got[k], e), mismatch(got[k], e)


@pytest.mark.parametrize("mode", ["reflect", "wrap", "constant"])
def test_float64_gradient_magnitude_is_scipys_bits(backend, mode):
    """Random float64 images: the same sums in the same order as SciPy's (the derivatives
    bit for bit on every engine)."""
    x = np.random.default_rng(3).standard_normal((2, 9, 11))
    got = tf.gradient_magnitude(torch.from_numpy(x), operator="sobel", mode=mode, backend=backend).numpy()
    for i in range(2):
        e = ndi.generic_gradient_magnitude(x[i], ndi.sobel, mode=mode)
        assert_sqrt_bits(got[i], e, backend)
        gs = tf.gradient(torch.from_numpy(x[i]), operator="sobel", mode=mode, backend=backend).numpy()
        assert same_bits(gs[0], ndi.sobel(x[i], 0, mode=mode)) and same_bits(gs[1], ndi.sobel(x[i], 1, mode=mode))
    gd = tf.gradient(torch.from_numpy(x), operator="prewitt", mode=mode, backend=backend).numpy()
    assert same_bits(gd[1, 0], ndi.prewitt(x[1], 0, mode=mode))
    assert same_bits(gd[1, 1], ndi.prewitt(x[1], 1, mode=mode))


GAUSS_BITS_CASES = [(m, s) for m in MODES for s in ((9, 21), (6, 70))]  # the tiled engine's padded and flat layouts


@pytest.mark.parametrize(
    "backend, mode, shape",
    [(e, *c) for e in ENGINES for c in (GAUSS_BITS_CASES[::3] if e == "triton" else GAUSS_BITS_CASES)],
    indirect=["backend"],
)
def test_float64_gaussian_gradient_magnitude_is_scipys_bits(backend, mode, shape):
    x = np.random.default_rng(4).standard_normal(shape)
    sigma = 1.9412622623564277
    got = tf.gaussian_gradient_magnitude(torch.from_numpy(x), sigma, mode=mode, backend=backend).numpy()
    e = ndi.gaussian_gradient_magnitude(x, sigma, mode=mode)
    assert_sqrt_bits(got, e, backend)


@pytest.mark.parametrize(
    "weights, kind",
    [
        ((1.0, 2.0, 4.0), GENERAL),  # SciPy: x[2]*4 first, then x[0]*1, x[1]*2
        ((0.5, -1.0, 2.0, 0.25), GENERAL),  # even length: never paired
        ((1e-17, 0.0, 3e-17), SYM),  # within DBL_EPSILON: SciPy pairs, with the left weight
        ((-0.3, 0.7, 0.3), ANTI),
        ((0.2, 0.5, 0.1, 0.5, 0.2), SYM),
    ],
)
def test_correlate1d_follows_scipys_classification(backend, weights, kind):
    assert pass_kind(weights) == kind
    x = np.random.default_rng(5).standard_normal((6, 11))
    got = tf.correlate1d(torch.from_numpy(x), weights, -1, mode="reflect", backend=backend).numpy()
    e = ndi.correlate1d(x, weights, -1, mode="reflect")
    assert same_bits(got, e), mismatch(got, e)
    if weights == (1e-17, 0.0, 3e-17):  # pairing with the left weight is not the plain sum
        plain = 1e-17 * x[:, 0:9] + 3e-17 * x[:, 2:11]
        assert not np.allclose(e[:, 1:10], plain, rtol=1e-3, atol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weights", [[[1.0, 1.0, 1.0]], [[1.0], [2.0], [1.0]], [[1.0, 2.0]],
                                     [[0.0, 1.0, 0.0], [1.0, -1.0, 1.0], [0.0, 1.0, 0.0]]])
@pytest.mark.parametrize("engine", ["reference", "cpu", "cpu-tiled"])
def test_dense_correlate_sums_from_positive_zero(engine, weights, mode, monkeypatch):
    """SciPy's N-D ``correlate`` starts its sum at +0.0: a window of -0.0 samples gives +0.0 (a
    1-D pass, ``correlate1d``, gives -0.0 there).  Found by review: the reference engine and the
    direct path's 1x3 / 3x1 stencils gave -0.0.  (The Triton engine's dense sums are not SciPy's
    bits -- its slices add in another order: its signs of zero, which no order changes, are
    checked below.)"""
    backend = engine
    if engine == "cpu-tiled":
        cpu = pytest.importorskip("torchfilters.backends.cpu")
        monkeypatch.setattr(cpu, "_d3_plan", lambda *a, **k: None)
        monkeypatch.setattr(cpu, "_replays", _NoReplays())
        backend = "cpu"
    rng = np.random.default_rng(7)
    x = np.where(rng.random((2, 6, 9)) < 0.7, -0.0, 0.0)  # mostly -0.0, some +0.0
    x[0, 2, 3] = 1.5  # and a window that is not zero
    w = np.array(weights)
    got = tf.correlate(torch.from_numpy(x), torch.from_numpy(w), mode=mode, cval=-0.0, backend=backend).numpy()
    for b in range(2):
        e = ndi.correlate(x[b], w, mode=mode, cval=-0.0)
        assert (e == 0).any() and not np.signbit(e[e == 0]).any()  # (SciPy's zeros are +0.0)
        assert same_bits(got[b], e), mismatch(got[b], e)
    v = np.full((1, 3, 4, 5), -0.0)
    w3 = np.ones((1, 1, 3))
    got = tf.correlate(torch.from_numpy(v), torch.from_numpy(w3), axes=(-3, -2, -1), mode=mode, backend=backend).numpy()
    e = ndi.correlate(v[0], w3, mode=mode)
    assert same_bits(got[0], e), mismatch(got[0], e)


@pytest.mark.parametrize("engine", ["reference", "cpu", "cpu-tiled"])
def test_dense_correlate_with_an_infinite_weight(engine, monkeypatch):
    """A dense 1x3 / 3x1 stencil with an infinite weight gives SciPy's infs, not NaN (found by
    review: the direct path's +0.0 start, ``w1 - w1``, is NaN for an infinite centre weight;
    such stencils now run on the general engine)."""
    backend = engine
    if engine == "cpu-tiled":
        cpu = pytest.importorskip("torchfilters.backends.cpu")
        monkeypatch.setattr(cpu, "_d3_plan", lambda *a, **k: None)
        monkeypatch.setattr(cpu, "_replays", _NoReplays())
        backend = "cpu"
    x = np.random.default_rng(3).random((2, 5, 6)) + 0.5
    for w in ([[1.0, np.inf, 1.0]], [[1.0], [-np.inf], [2.0]], [[np.inf, 1.0, 2.0]]):
        w = np.array(w)
        got = tf.correlate(torch.from_numpy(x), torch.from_numpy(w), mode="reflect", backend=backend).numpy()
        for b in range(2):
            e = ndi.correlate(x[b], w, mode="reflect")
            assert np.isinf(e).all() and same_bits(got[b], e), (w, mismatch(got[b], e))


@pytest.mark.parametrize("engine", ["reference", "cpu"])
def test_dense_correlate_leaves_nan_weights_out(engine):
    """SciPy keeps a dense weight only where ``|w| > DBL_EPSILON``: a NaN weight is left out of
    the footprint (found by review: every output was NaN), over 1, 2 and 3 axes, and so does
    ``torchfilters.ndimage``."""
    import torchfilters.ndimage as tfn

    x = np.random.default_rng(4).standard_normal((3, 4, 5))
    for w, axes in (([1.0, np.nan, 2.0], (-1,)), ([[1.0, 2.0, 1.0], [np.nan, 1.0, 3.0]], (-2, -1)),
                    (np.where(np.arange(12).reshape(2, 2, 3) == 4, np.nan, np.arange(12.0).reshape(2, 2, 3) - 5),
                     (0, 1, 2))):
        w = np.asarray(w)
        for fn in ("correlate", "convolve"):
            got = getattr(tf, fn)(torch.from_numpy(x), w, axes=axes, mode="nearest", backend=engine).numpy()
            want = getattr(ndi, fn)(x, w, mode="nearest", axes=axes)
            assert np.isfinite(want).all() and np.allclose(got, want, rtol=1e-13, atol=1e-13), (fn, axes)
            assert np.array_equal(getattr(tfn, fn)(x, w, mode="nearest", axes=axes), got)


@pytest.mark.parametrize("cval", [2.5, -1.0])
def test_constant_mode_correction_keeps_signs_of_zero(backend, cval):
    """SciPy pads a two-pass stencil's first pass with ``cval`` in constant mode; the tiled CPU
    engine folds both passes onto a ``cval`` tile and corrects the border rows or columns.
    Found by review: its correction added +0.0 inside the image, where SciPy's -0.0 results
    (an image of -0.0 samples) became +0.0."""
    x = np.full((2, 7, 8), -0.0)
    x[1, 3, 4] = 1.5
    for op in ("sobel", "prewitt"):
        for axis in (-2, -1):
            got = getattr(tf, op)(torch.from_numpy(x), axis=axis, mode="constant", cval=cval, backend=backend).numpy()
            for b in range(2):
                e = getattr(ndi, op)(x[b], axis=axis + 2, mode="constant", cval=cval)
                assert np.signbit(e[e == 0]).sum() > 10
                assert same_bits(got[b], e), (op, axis, b, mismatch(got[b], e))


@pytest.mark.parametrize("mode", ["reflect", "constant"])
def test_triton_dense_correlate_sums_from_positive_zero(triton_engine, mode):
    """The Triton engine's dense stencils (its footprint kernel) give SciPy's signs of zero: a
    window of -0.0 samples sums to +0.0, as SciPy's N-D ``correlate`` starts at +0.0 (found by
    review: the kernel started at -0.0), in 2-D and 3-D.  Its other values within rounding (its
    terms add in another order).  A sum of 1-D passes merged into one footprint (``laplace``) and
    a selective blur's sums keep the sum of their terms: SciPy's signs and the reference's."""
    rng = np.random.default_rng(7)
    x = np.where(rng.random((2, 6, 9)) < 0.7, -0.0, 0.0)
    x[0, 2, 3] = 1.5
    before = triton_engine.LAUNCHES["fwd"]
    cases = (([[1.0, 2.0], [3.0, 4.0]], (-2, -1), x), ([[[1.0], [2.0]], [[0.5], [3.0]]], (-3, -2, -1), x[None]))
    for w, axes, xs in cases:
        w = np.array(w)
        got = tf.correlate(torch.from_numpy(xs), torch.from_numpy(w), mode=mode, cval=-0.0, axes=axes,
                           backend="triton").numpy()
        for b in range(xs.shape[0]):
            e = ndi.correlate(xs[b], w, mode=mode, cval=-0.0)
            assert (e == 0).sum() > 10 and not np.signbit(e[e == 0]).any()
            assert np.array_equal(np.signbit(got[b]), np.signbit(e))
            np.testing.assert_allclose(got[b], e, rtol=1e-15, atol=0)
    assert triton_engine.LAUNCHES["fwd"] > before  # (the footprint kernel ran)
    xl = np.where(rng.random((2, 6, 9)) < 0.85, -0.0, 0.0)  # (-0.0 where the centre is +0.0 and
    got = tf.laplace(torch.from_numpy(xl), mode=mode, backend="triton").numpy()  # the rest -0.0)
    e = np.stack([ndi.laplace(v, mode=mode) for v in xl])
    assert np.signbit(e).sum() >= 2 and (~np.signbit(e)).sum() >= 2
    assert np.array_equal(np.signbit(got), np.signbit(e))
    s = torch.full((1, 5, 6), -0.0, dtype=torch.float64)
    for nz in (False, True):
        got = tf.selective_blur(s, -1.0, mode=mode, normalized=nz, backend="triton")
        want = tf.selective_blur(s, -1.0, mode=mode, normalized=nz, backend="reference")
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_pass_kind_and_entries():
    assert pass_kind((1.0,)) == SYM
    assert pass_kind((1.0, 1.0)) == GENERAL
    assert pass_kind((-1.0, 0.0, 1.0)) == ANTI
    assert pass_kind((1.0, 2.0, 1.0)) == SYM
    assert pass_kind((1.0, 2.0, 1.0 + 2e-16)) == SYM
    assert pass_kind((1.0, 2.0, 1.0 + 4.5e-16)) == GENERAL  # two ulps: beyond DBL_EPSILON
    assert pass_kind((float("nan"), 1.0, 2.0)) == SYM  # SciPy: fabs(nan) > eps is false
    assert pass_kind(tuple(np.linspace(-1, 1, 101))) == ANTI  # the vectorised test of long passes
    assert pass_entries(Pass(-1, -1, (-1.0, 0.0, 1.0))) == (ANTI, [(0, 0.0), (-1, -1.0), (1, -1.0)])
    assert pass_entries(Pass(-2, -2, (1.0, 2.0, 4.0, 8.0))) == (GENERAL, [(1, 8.0), (-2, 1.0), (-1, 2.0), (0, 4.0)])
    assert pass_entries(Pass(-1, -2, (1.0, 2.0, 3.0, 2.0, 1.0))) == (
        SYM, [(0, 3.0), (-2, 1.0), (2, 1.0), (-1, 2.0), (1, 2.0)])
    # the lowering mirrors the left half of a pass SciPy pairs (the map every engine sees)
    p = Pass(-1, -1, (1e-17, 0.0, 3e-17))
    assert _lowering.canonical_pass(p).taps == (1e-17, 0.0, 1e-17)
    q = Pass(-1, -1, (-0.5, 0.0, 0.5))
    assert _lowering.canonical_pass(q) is q


# ------------------------------------------------------------------ exact zeros on constant images


@pytest.mark.parametrize("sigma", [0.5, 1.0, 1.9412622623564277, 3.3])
def test_gaussian_kernels_are_exactly_symmetric(sigma):
    r = kernels.gaussian_radius(sigma, 4.0)
    for order, sign in ((0, 1.0), (1, -1.0), (2, 1.0)):
        w = np.asarray(kernels.gaussian_kernel1d(sigma, order, r))
        assert same_bits(w[::-1][: r], sign * w[: r])  # bitwise: w[-j] == +-w[j]
    assert kernels.gaussian_kernel1d(sigma, 1, r)[r] == 0.0


CONSTANT_CASES = [(s, m, d) for s in (0.5, 1.9412622623564277, (3.3, 1.2)) for m in ("reflect", "nearest", "mirror", "wrap")
                  for d in (torch.float64, torch.float32)]
#: the interpreted Triton engine runs a 17x17 footprint's backward in Python: fewer, smaller cases
TRITON_CONSTANT_CASES = [(0.5, "reflect", torch.float64), (0.5, "wrap", torch.float32), (1.0, "mirror", torch.float32)]


@pytest.mark.parametrize(
    "backend, sigma, mode, dtype",
    [(e, *c) for e in ENGINES for c in (TRITON_CONSTANT_CASES if e == "triton" else CONSTANT_CASES)],
    indirect=["backend"],
)
def test_gaussian_gradient_magnitude_of_a_constant_is_zero(backend, sigma, mode, dtype):
    shapes = ((5.0, (6, 7)),) if backend == "triton" else ((5.0, (16, 16)), (-0.3, (3, 7, 9)))
    for value, shape in shapes:
        x = torch.full(shape, value, dtype=dtype, requires_grad=True)
        y = tf.gaussian_gradient_magnitude(x, sigma, mode=mode, backend=backend)
        assert torch.equal(y, torch.zeros_like(y)), float(y.abs().max())
        (g,) = torch.autograd.grad(y, x, torch.linspace(-1, 2, y.numel(), dtype=dtype).reshape(y.shape))
        assert torch.equal(g, torch.zeros_like(g)), float(g.abs().max())
    e = ndi.gaussian_gradient_magnitude(np.full((16, 16), 5.0), sigma, mode=mode)
    assert not e.any()  # SciPy's exact 0 too


# ----------------------------------------------------------------------- magnitude over/underflow


def _grad(fn, x, g):
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    (gx,) = torch.autograd.grad(y, x, g)
    return y.detach(), gx


SCALES = {"f32-over": (torch.float32, 2.0**120), "f32-under": (torch.float32, 2.0**-100),
          "f64-over": (torch.float64, 2.0**1000), "f64-under": (torch.float64, 2.0**-600)}
RESCALE_CASES = [(op, sc) for op in ("sobel", "central", "gauss") for sc in SCALES]
#: (the interpreted Triton engine: a few)
TRITON_RESCALE_CASES = [("sobel", "f32-over"), ("central", "f64-under"), ("gauss", "f32-under"), ("gauss", "f64-over")]


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")  # (the interpreter squares in numpy: what the rescaling is for)
@pytest.mark.parametrize(
    "backend, op, scale_id",
    [(e, *c) for e in ENGINES for c in (TRITON_RESCALE_CASES if e == "triton" else RESCALE_CASES)],
    indirect=["backend"],
)
def test_magnitude_rescales_where_the_squares_over_or_underflow(backend, op, scale_id):
    """The magnitude is homogeneous: ``|D(c x)| = c |D x|`` exactly for a power of two ``c``, and
    its gradient does not change.  Squares of ``c * D x`` over/underflow; the results must not.
    (The interpreted Triton engine is compared with the CPU engine's unscaled results: one
    interpreted forward and backward, not two.)"""
    dtype, scale = SCALES[scale_id]
    if op == "gauss":
        def fn(t, engine=backend):
            return tf.gaussian_gradient_magnitude(t, 1.2, mode="nearest", backend=engine)
    else:
        def fn(t, engine=backend):
            return tf.gradient_magnitude(t, operator=op, backend=engine)
    x = torch.from_numpy(np.random.default_rng(6).uniform(-1.5, 1.5, (2, 7, 9))).to(dtype)
    x[0, 2:5, 3:6] = 0.25  # a flat patch: magnitude 0, gradient 0 there
    g = torch.from_numpy(np.random.default_rng(7).uniform(0.5, 1.5, x.shape)).to(dtype)
    y1, g1 = _grad(functools.partial(fn, engine="cpu" if backend == "triton" else backend), x, g)
    ys, gs = _grad(fn, x * scale, g)
    sq = torch.square(y1 * scale)
    assert (~torch.isfinite(sq)).any() or (sq[y1 != 0] < torch.finfo(dtype).tiny).any()  # the squares do
    assert torch.isfinite(ys).all() and torch.isfinite(gs).all()
    rtol = 1e-6 if dtype == torch.float32 else 1e-14
    # (across engines, float32 sums differ in their last bits: a cancelled magnitude to rtol of
    # its largest value)
    atol = rtol * float(y1.abs().max()) * scale if backend == "triton" else 0
    torch.testing.assert_close(ys, y1 * scale, rtol=rtol, atol=atol)
    torch.testing.assert_close(gs, g1, rtol=rtol, atol=rtol * float(g1.abs().max()))
    assert torch.equal(ys == 0, y1 == 0)


@pytest.mark.parametrize("layout", ["volume", "per-axis modes"])
@pytest.mark.parametrize("op, scale_id", RESCALE_CASES)
def test_volume_magnitude_rescales_where_the_squares_over_or_underflow(op, scale_id, layout):
    """The CPU volume engine (three axes: the direct 3x3x3 path for ``sobel``, the general one
    for ``central`` and Gaussians; two axes with per-axis modes) rescales as the planar one does."""
    dtype, scale = SCALES[scale_id]
    kw = dict(axes=(-3, -2, -1)) if layout == "volume" else dict(mode=("wrap", "nearest"))
    if op == "gauss":
        kw.setdefault("mode", "nearest")

        def fn(t):
            return tf.gaussian_gradient_magnitude(t, 1.2, backend="cpu", **kw)
    else:
        def fn(t):
            return tf.gradient_magnitude(t, operator=op, backend="cpu", **kw)
    x = torch.from_numpy(np.random.default_rng(6).uniform(-1.5, 1.5, (2, 5, 7, 9))).to(dtype)
    x[0, 1:4, 2:5, 3:6] = 0.25
    g = torch.from_numpy(np.random.default_rng(7).uniform(0.5, 1.5, x.shape)).to(dtype)
    y1, g1 = _grad(fn, x, g)
    ys, gs = _grad(fn, x * scale, g)
    sq = torch.square(y1 * scale)
    assert (~torch.isfinite(sq)).any() or (sq[y1 != 0] < torch.finfo(dtype).tiny).any()
    assert torch.isfinite(ys).all() and torch.isfinite(gs).all()
    rtol = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(ys, y1 * scale, rtol=rtol, atol=0)
    torch.testing.assert_close(gs, g1, rtol=rtol, atol=rtol * float(g1.abs().max()))
    assert torch.equal(ys == 0, y1 == 0)


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")  # (the interpreter squares in numpy: what the rescaling is for)
def test_magnitude_of_an_alternating_column_is_finite(backend):
    """The issue's case: a column alternating +-1.5e38 along y, float32: finite derivatives of
    3e38, whose squares overflow."""
    col = torch.tensor([1.5e38, -1.5e38] * 4, dtype=torch.float32)[:, None].repeat(1, 3)
    x = col.clone().requires_grad_(True)
    y = tf.gradient_magnitude(x, operator="central", backend=backend)
    d = ndi.correlate1d(col.double().numpy(), [-1.0, 0.0, 1.0], 0, mode="reflect")
    np.testing.assert_allclose(y.detach().double().numpy(), np.abs(d), rtol=1e-6)
    assert torch.isfinite(y).all() and float(y.detach().max()) > 2.9e38
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    # d|gy|/dx: sign(gy) at x[i+1], -sign(gy) at x[i-1] (and the reflect folds): the float64 oracle
    xd = col.double().clone().requires_grad_(True)
    tf.gradient_magnitude(xd, operator="central", backend="reference").sum().backward()
    torch.testing.assert_close(x.grad.double(), xd.grad)


@pytest.mark.parametrize("backend", ["reference", "cpu", "ndimage"])
def test_signed_zero_taps_keep_their_sign_whatever_came_before(backend):
    """``-0.0 == 0.0`` and both hash alike: the memoised spec texts and every engine's plan
    caches carry the signs of zero taps (``_spec.zero_signs``), so weights ``[-0.0]`` after
    ``[0.0]`` (and the reverse, in one process) give SciPy's signs of zero, as on their own."""
    from torchfilters import ndimage as tnd

    rng = np.random.default_rng(0)
    weights = ([0.0], [-0.0], [-1.0, 0.0, 1.0], [-1.0, -0.0, 1.0], [1.0, -0.0, 1.0], [-0.0, -0.0, -0.0])
    for w in weights + weights[::-1]:
        for shape, axis in (((1, 4), -1), ((3, 5), 0), ((2, 3, 4), -1), ((2, 2, 3, 4), 1)):
            for mode in ("reflect", "constant", "wrap"):
                x = rng.choice([0.0, -0.0, 1.0, -1.0], size=shape)
                want = ndi.correlate1d(x, w, axis=axis, mode=mode)
                if backend == "ndimage":
                    got = tnd.correlate1d(x, w, axis=axis, mode=mode)
                else:
                    got = tf.correlate1d(torch.from_numpy(x), w, axis=axis, mode=mode, backend=backend).numpy()
                assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)), \
                    (w, shape, axis, mode)
