"""The CPU engine's symmetric separable path (``backends/cpu/separable.py``) and the host-side
folding of taps onto the image's period (``backends/_lowering.py``).

The fast path runs every ``sep`` spec whose 1-D passes are symmetric and centred (Gaussians,
odd box filters): it must match SciPy in float64 for every mode, size, radius, dtype, layout
and non-finite input, and step aside for everything else.  Folding must keep SciPy's values
and its NaN rule for a radius far beyond the image (``radius=2**20`` on an 8x8 image), in
every engine and in the gradient.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch

import torchfilters as tf
from torchfilters import _spec
from torchfilters._spec import FilterSpec, Pass
from torchfilters.backends import _lowering

cpu = pytest.importorskip("torchfilters.backends.cpu")
separable = cpu.separable

from conftest import BASE_MODES, CVAL, MODES, assert_close, float_bits, rand, sp_gaussian_filter, sp_selective_blur  # noqa: E402

SHAPES = ((1, 1), (1, 2), (2, 1), (2, 2), (1, 9), (9, 1), (1, 40), (40, 1), (3, 5), (7, 9), (16, 16), (17, 33),
          (28, 28), (40, 3), (5, 70))
SIGMAS = (0.7, 2.0, (1.0, 3.0), (2.5, 0.6), (0, 1.5), (1.2, 0))


@pytest.fixture(autouse=True)
def _planned_afresh(no_replays):
    """(Tests here patch the CPU engine's planning and spy on its launches: no replays.)"""


@pytest.fixture
def launches(monkeypatch):
    """The kernels each call launched."""
    seen = []
    launch = cpu._launch

    def spy(fn, args, nitems, nthreads, serial, runs=None):
        seen.append(fn)
        return launch(fn, args, nitems, nthreads, serial, runs)

    monkeypatch.setattr(cpu, "_launch", spy)
    return seen


def _fast(launches):
    return bool(launches) and all(fn in (separable._k_sep, cpu._k_stack) for fn in launches)


# ------------------------------------------------------------------ the fast path


@pytest.mark.parametrize("mode", MODES)
def test_matches_scipy_float64_every_mode_and_size(mode, launches):
    for h, w in SHAPES:
        x = rand(2, h, w, seed=h * 37 + w)
        for sigma in SIGMAS:
            y = tf.gaussian_filter(x, sigma, mode=mode, cval=CVAL, backend="cpu")
            assert_close(y, sp_gaussian_filter(x, sigma, mode=mode, cval=CVAL), rtol=1e-12, msg=f"{h}x{w} {sigma}")
    assert _fast(launches)


@pytest.mark.parametrize("mode", BASE_MODES)
def test_radius_larger_than_the_image(mode, launches):
    """Radii up to about twice the image stay unfolded: the fast path folds every row and column
    through its tables (several reflections deep)."""
    for h, w in ((1, 1), (2, 3), (3, 2), (5, 4), (6, 13)):
        x = rand(3, h, w, seed=h + 10 * w)
        for radius in ((h + 2, w + 3), (2 * h + 5, 2 * w + 7), (1, 2 * w + 10)):
            y = tf.gaussian_filter(x, (1.3, 2.1), radius=radius, mode=mode, cval=-0.5, backend="cpu")
            want = sp_gaussian_filter(x, (1.3, 2.1), radius=radius, mode=mode, cval=-0.5)
            assert_close(y, want, rtol=1e-12, msg=f"{h}x{w} radius {radius}")
    assert _fast(launches)


@pytest.mark.parametrize("span", (None, 0))
def test_large_planes_strips_and_blocks(launches, monkeypatch, span):
    """Row blocks across threads, column strips (wider than ``_FULL_W``, wrap's pads computed
    from the far strip), float32 and float64 rows read in place (``span`` None) or through the
    ring tile (0), which is the same arithmetic: the same bits."""
    monkeypatch.setattr(separable, "_INPLACE_SPAN", span)
    old = separable._FULL_W, separable._STRIP_W
    seen = []
    inplace_ok = separable.inplace_ok
    monkeypatch.setattr(cpu, "inplace_ok", lambda *a: seen.append(inplace_ok(*a)) or seen[-1])
    try:
        separable._FULL_W, separable._STRIP_W = 96, 64
        x = rand(1, 90, 250, seed=3)
        for mode in BASE_MODES:
            for sigma in (2.0, (0.8, 5.0)):
                y = tf.gaussian_filter(x, sigma, mode=mode, cval=0.25, backend="cpu")
                assert_close(y, sp_gaussian_filter(x, sigma, mode=mode, cval=0.25), rtol=1e-12, msg=mode)
                yf = tf.gaussian_filter(x.float(), sigma, mode=mode, cval=0.25, backend="cpu")
                assert_close(yf, sp_gaussian_filter(x, sigma, mode=mode, cval=0.25), rtol=2e-6, msg=mode)
                if span == 0:  # the ring's bits are the in-place path's
                    monkeypatch.setattr(separable, "_INPLACE_SPAN", None)
                    assert torch.equal(yf, tf.gaussian_filter(x.float(), sigma, mode=mode, cval=0.25, backend="cpu"))
                    assert torch.equal(y, tf.gaussian_filter(x, sigma, mode=mode, cval=0.25, backend="cpu"))
                    monkeypatch.setattr(separable, "_INPLACE_SPAN", 0)
    finally:
        separable._FULL_W, separable._STRIP_W = old
        separable._plan_cache.clear()
    assert _fast(launches)
    assert set(seen) == ({True} if span is None else {False, True})  # (0: the ring; None: in place)


def test_float32_sizes_around_the_vector_width(launches):
    for w in (1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100):
        x = rand(2, 11, w, seed=w, dtype=torch.float32)
        for mode in BASE_MODES:
            y = tf.gaussian_filter(x, 1.7, mode=mode, cval=CVAL, backend="cpu")
            assert_close(y, sp_gaussian_filter(x, 1.7, mode=mode, cval=CVAL), rtol=2e-6, msg=f"w={w} {mode}")
    assert _fast(launches)


@pytest.mark.parametrize("dtype,tol", ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)))
def test_half_precision_within_rounding(dtype, tol, launches):
    """float16/bfloat16 are computed in float32: the result is SciPy's rounded to the dtype
    (within one unit of it)."""
    x = rand(3, 19, 23, seed=11, dtype=dtype)
    for mode in BASE_MODES:
        y = tf.gaussian_filter(x, (1.5, 2.5), mode=mode, cval=0.5, backend="cpu")
        assert y.dtype == dtype
        want = sp_gaussian_filter(x, (1.5, 2.5), mode=mode, cval=0.5)
        assert_close(y, want, rtol=tol, msg=mode)
        # and exactly the float32 result rounded to the dtype
        y32 = tf.gaussian_filter(x.float(), (1.5, 2.5), mode=mode, cval=0.5, backend="cpu")
        assert torch.equal(y, y32.to(dtype))
    assert _fast(launches)


def test_nan_and_inf_as_scipy(launches):
    """Every tap multiplies: a NaN spreads over the kernel's reach, an inf too (and meets
    another of the other sign as NaN); a zero tap still turns an inf into NaN."""
    x = rand(1, 30, 41, seed=4)
    x[0, 3, 5] = float("nan")
    x[0, 20, 30] = float("inf")
    x[0, 22, 35] = float("-inf")
    x[0, 29, 0] = float("inf")
    for mode in BASE_MODES:
        for kw in (dict(sigma=1.5), dict(sigma=(2.0, 1.0), radius=(3, 9)), dict(sigma=0.3, radius=6)):
            y = tf.gaussian_filter(x, mode=mode, cval=CVAL, backend="cpu", **kw).numpy()
            want = sp_gaussian_filter(x, mode=mode, cval=CVAL, **kw)
            assert np.array_equal(np.isnan(y), np.isnan(want)), (mode, kw)
            assert np.array_equal(np.isposinf(y), np.isposinf(want)), (mode, kw)
            assert np.array_equal(np.isneginf(y), np.isneginf(want)), (mode, kw)
            fin = np.isfinite(want)
            assert np.allclose(y[fin], want[fin], atol=1e-12, rtol=0), (mode, kw)
    # sigma 0.3 with radius 6: the outer taps underflow to exactly 0.0 -- and still multiply
    assert kw["radius"] == 6 and tf.gaussian_filter(x, 0.3, radius=6, backend="cpu")[0, 3, 11].isnan()
    assert _fast(launches)


def test_strided_channels_last_and_expanded_inputs(launches):
    base = rand(2, 13, 17, 3, seed=8)
    views = {
        "channels_last": base.permute(0, 3, 1, 2),
        "sliced": rand(2, 3, 30, 40, seed=9)[:, :, 5:25:2, 1:39:3],
        "transposed": rand(2, 3, 17, 13, seed=10).transpose(-1, -2),
        "expanded": rand(1, 1, 12, 14, seed=12).expand(2, 3, 12, 14),
        "float32 channels_last": rand(2, 3, 15, 21, seed=13, dtype=torch.float32).contiguous(
            memory_format=torch.channels_last),
    }
    for name, x in views.items():
        for mode in ("reflect", "wrap", "constant"):
            y = tf.gaussian_filter(x, (1.1, 2.3), mode=mode, cval=CVAL, backend="cpu")
            tol = 2e-6 if x.dtype == torch.float32 else 1e-12
            assert_close(y, sp_gaussian_filter(x, (1.1, 2.3), mode=mode, cval=CVAL), rtol=tol, msg=name)
    assert _fast(launches)


def test_out_and_out_aliasing_the_input(launches):
    x = rand(2, 3, 20, 26, seed=14)
    want = sp_gaussian_filter(x, 2.0, mode="mirror")
    out = torch.empty_like(x)
    assert tf.gaussian_filter(x, 2.0, mode="mirror", out=out, backend="cpu") is out
    assert_close(out, want, rtol=1e-12)
    # out= strided (a transposed view) and out= aliasing the input (computed through a temporary)
    outT = torch.empty(2, 3, 26, 20, dtype=x.dtype).transpose(-1, -2)
    tf.gaussian_filter(x, 2.0, mode="mirror", out=outT, backend="cpu")
    assert_close(outT, want, rtol=1e-12)
    y = x.clone()
    tf.gaussian_filter(y, 2.0, mode="mirror", out=y, backend="cpu")
    assert_close(y, want, rtol=1e-12)
    z = x.clone()
    tf.gaussian_filter(z[:, :, :, :20], 2.0, mode="mirror", out=z[:, :, :, 6:], backend="cpu")  # overlapping
    assert_close(z[:, :, :, 6:], sp_gaussian_filter(x[:, :, :, :20], 2.0, mode="mirror"), rtol=1e-12)
    assert _fast(launches)


# ------------------------------------------------------- stacks of narrow planes, a plane a lane


def _bits(t):
    return float_bits(t, nan_sign=False)


def _stacked_and_row_wise(fn, x, launches, out=None):
    """``fn(x)`` on the stacked path (it must run there alone) and on the row-wise kernel."""
    launches.clear()
    y = fn(x) if out is None else fn(x, out=out)
    assert launches and all(k is cpu._k_stack for k in launches), [getattr(k, "__name__", k) for k in launches]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cpu, "_stack_launch", lambda *a: False)
        launches.clear()
        z = fn(x)
        assert launches and all(k is separable._k_sep for k in launches)
    return y, z


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize("mode", MODES)
def test_stacked_small_planes_give_the_row_wise_bits(mode, dtype, launches, monkeypatch):
    """Narrow planes (``separable_stack._width_ok``) run a vector's lanes of planes at a time
    (a last group of fewer): the row-wise kernel's bits, NaN, infinities and signs of zero
    included, and SciPy's bits in float64 (a dtype the dispatch leaves to the row-wise kernel:
    taken here to check the kernel's arithmetic); radii past the image fold through the tables."""
    monkeypatch.setattr(cpu.separable_stack, "DTYPES", (torch.float32, torch.float64))
    cases = {
        "gaussian": lambda t, **k: tf.gaussian_filter(t, 1.5, mode=mode, cval=-0.5, backend="cpu", **k),
        "per-axis sigma": lambda t, **k: tf.gaussian_filter(t, (0.8, 2.5), mode=mode, cval=-0.5, backend="cpu", **k),
        "radius past the image": lambda t, **k: tf.gaussian_filter(
            t, (2.0, 1.0), radius=(2 * t.shape[-2] + 1, 2 * t.shape[-1] + 3), mode=mode, cval=-0.5, backend="cpu", **k),
        "box": lambda t, **k: tf.uniform_filter(t, (3, 5), mode=mode, cval=-0.5, backend="cpu", **k),
        "along W": lambda t, **k: tf.gaussian_filter1d(t, 1.2, axis=-1, mode=mode, cval=-0.5, backend="cpu", **k),
    }
    for N, h, w in ((16, 8, 8), (45, 5, 3), (16, 1, 20), (32, 13, 1), (45, 30, 7), (16, 6, 29)):
        x = rand(N, h, w, seed=N + h + w, dtype=dtype)
        x[0, 0, 0] = float("nan")
        x[1, 0, 0] = float("inf")
        x[1, -1, -1] = float("-inf")
        x[-1, -1, -1] = float("inf")
        x[N // 2] = 0.0
        x[N // 2, :, : w // 2] = -0.0
        for name, fn in cases.items():
            y, z = _stacked_and_row_wise(fn, x, launches)
            assert torch.equal(_bits(y), _bits(z)), (name, N, h, w)
            if dtype == torch.float64 and name != "box" and name != "along W":
                kw = {"gaussian": dict(sigma=1.5), "per-axis sigma": dict(sigma=(0.8, 2.5)),
                      "radius past the image": dict(sigma=(2.0, 1.0), radius=(2 * h + 1, 2 * w + 3))}[name]
                want = sp_gaussian_filter(x, mode=mode, cval=-0.5, **kw)
                assert torch.equal(_bits(y), _bits(torch.from_numpy(want))), (name, N, h, w)


def test_stacked_small_planes_layouts_out_and_threads(launches):
    """Plane offsets of strided and expanded leading dims, ``out=`` views, outputs aliasing the
    input, and a launch split over the threads: the row-wise kernel's bits."""
    base = rand(8, 4, 9, 12, seed=41, dtype=torch.float32)

    def g(t, **k):
        return tf.gaussian_filter(t, (1.1, 1.7), mode="mirror", backend="cpu", **k)

    for x in (base[::2], base.expand(2, 8, 4, 9, 12)[:, ::2], rand(700, 9, 12, seed=42, dtype=torch.float32)):
        y, z = _stacked_and_row_wise(g, x, launches)
        assert torch.equal(_bits(y), _bits(z))
    out = torch.full((8, 8, 9, 12), float("nan"))[:, ::2]
    y, z = _stacked_and_row_wise(g, base, launches, out=out)
    assert y is out and torch.equal(_bits(out), _bits(z))
    a = base.clone()
    want = g(base)
    g(a, out=a)  # aliasing: through a temporary
    assert torch.equal(_bits(a), _bits(want))


def test_stacked_small_planes_only_where_they_pay(launches):
    """Float32 only, narrow planes, groups of planes at least four-fifths full, buffers within
    ``_MAX_BYTES``: the rest runs row by row.  (The buffers scale with the vector width: planes
    of 1024 x 20 are past the budget with AVX2's 32-byte vectors as with AVX-512's 64.)  Widths:
    up to ``_MAX_W`` with AVX-512; without it, up to ``_MAX_W_MASKED`` but for multiples of the
    lanes past one vector (whose rows end in no masked vector)."""
    from torchfilters.backends.cpu import simd

    ss = cpu.separable_stack
    f32 = simd.VBYTES // 4
    not_taken = [ss._MAX_W + 1, 2 * f32 + 16] if simd.CHEAP_MASKS else [2 * f32, 3 * f32, ss._MAX_W_MASKED + 1]
    taken = [1, ss._MAX_W] if simd.CHEAP_MASKS else [1, f32, f32 + 3, 3 * f32 + 1, ss._MAX_W_MASKED - 1]
    for x in ([rand(16, 8, 8), rand(17, 8, 8, dtype=torch.float32), rand(64, 1024, 20, dtype=torch.float32),
               rand(16, 8, 8, dtype=torch.float16)] + [rand(16, 8, w, dtype=torch.float32) for w in not_taken]):
        launches.clear()
        tf.gaussian_filter(x, 1.0, backend="cpu")
        assert launches and cpu._k_stack not in launches, (x.dtype, x.shape)
    for x in [rand(30, 8, 8, dtype=torch.float32)] + [rand(16, 8, w, dtype=torch.float32) for w in taken]:
        launches.clear()  # (30 planes: of 32 lanes, 30 used)
        tf.gaussian_filter(x, 1.0, backend="cpu")
        assert launches == [cpu._k_stack], x.shape


def test_empty_tensors():
    for shape in ((0, 5, 5), (2, 0, 4), (2, 4, 0)):
        x = torch.zeros(shape)
        y = tf.gaussian_filter(x, 2.0, backend="cpu")
        assert y.shape == x.shape


def test_any_symmetric_1d_pass_takes_the_fast_path(launches):
    """Not only Gaussians: an odd box or binomial ``correlate1d`` along either axis (the other
    pass is the identity)."""
    x = rand(2, 21, 18, seed=15)
    # (3-tap passes in the modes but constant take the direct 3x3 path, which comes first)
    for w in ([0.2] * 5, [1.0, 4.0, 6.0, 4.0, 1.0], [-1.0, 2.0, 3.0, 2.0, -1.0]):
        for axis in (-1, -2):
            for mode in BASE_MODES:
                y = tf.correlate1d(x, w, axis, mode=mode, cval=CVAL, backend="cpu")
                want = ndi.correlate1d(x.numpy(), np.array(w), axis=axis, mode=mode, cval=CVAL)
                assert_close(y, want, rtol=1e-12, msg=f"{w} {axis} {mode}")
    assert _fast(launches)


def test_not_symmetric_or_not_stack_steps_aside(launches):
    x = rand(2, 12, 15, seed=16)
    tf.gaussian_filter(x, 1.5, order=(0, 1), backend="cpu")  # a derivative pass: antisymmetric
    tf.gaussian_gradient_magnitude(x, 1.5, backend="cpu")  # magnitude epilogue
    assert launches and not any(fn is separable._k_sep for fn in launches)
    spec = FilterSpec("reflect", 0.0, "stack", (_spec.sep((-1, -2, (1.0, 2.0, 1.0))),))  # not centred
    assert separable.sep_info(spec) is None
    spec = FilterSpec("constant", 1.0, "stack", (_spec.sep((-1, -1, (1.0, 2.0, 1.0)), (-2, -1, (1.0, 2.0, 1.0))),))
    assert separable.sep_info(spec) is None  # sequential constant mode with the horizontal pass first
    spec = FilterSpec("reflect", 0.0, "stack", (_spec.sep((-1, -1, (1.0, 2.0, 1.0)), (-2, -1, (1.0, 2.0, 1.0))),))
    assert separable.sep_info(spec) is None  # the horizontal pass first in any mode: SciPy's order of the passes
    spec = FilterSpec("reflect", 0.0, "stack", (_spec.sep((-2, -1, (1.0, 2.0, 1.0)), (-1, -1, (1.0, 2.0, 1.0))),))
    assert separable.sep_info(spec) == ((2.0, 1.0), (2.0, 1.0), "reflect", 0.0)


def test_gradients_through_the_fast_path():
    x = rand(1, 2, 9, 11, seed=17).requires_grad_(True)
    for mode in BASE_MODES:
        assert torch.autograd.gradcheck(lambda t: tf.gaussian_filter(t, (1.0, 1.6), mode=mode, cval=0.3,
                                                                     backend="cpu"), (x,))


# -------------------------------------------------------------- folding the taps


BIG_SHAPES = ((8, 8), (1, 8), (8, 1), (1, 1))


@functools.lru_cache(maxsize=None)
def _huge_radius_oracle(mode, radius, h, w, sigma):
    """SciPy's result for :func:`test_huge_radius_matches_scipy` (0.3 s a slice at radius 2**20:
    computed once for both engines)."""
    want = sp_gaussian_filter(rand(2, h, w, seed=h * 9 + w), sigma, radius=radius, mode=mode, cval=CVAL)
    want.flags.writeable = False
    return want


@pytest.mark.parametrize("radius", (4000, 2**20))
@pytest.mark.parametrize("mode", BASE_MODES)
def test_huge_radius_matches_scipy(mode, radius, engine):
    for h, w in BIG_SHAPES:
        x = rand(2, h, w, seed=h * 9 + w)
        for sigma in (2.0, (0.8, 3000.0)):
            t0 = time.perf_counter()
            y = tf.gaussian_filter(x, sigma, radius=radius, mode=mode, cval=CVAL, backend=engine)
            assert time.perf_counter() - t0 < 30  # (seconds; 2**20 takes 11 s and 1 GiB per axis unfolded)
            assert_close(y, _huge_radius_oracle(mode, radius, h, w, sigma), rtol=1e-12, msg=f"{h}x{w} sigma {sigma}")


@pytest.mark.parametrize("mode", BASE_MODES)
def test_huge_radius_nan_rule(mode, engine):
    """Folded taps keep SciPy's NaN rule: the zero taps far out (exp underflows) still multiply,
    so an inf anywhere makes NaN everywhere its folded reach covers -- and a derivative's
    taps of both signs folded onto one sample (summing to exactly 0.0 for the antisymmetric
    order-1 kernel on wrap) still give inf - inf."""
    x = rand(1, 8, 8, seed=18)
    x[0, 2, 3] = float("inf")
    x[0, 6, 1] = float("nan")
    for kw in (dict(sigma=1.0), dict(sigma=2.0, order=(0, 1)), dict(sigma=3.0, order=(2, 0))):
        for radius in (40, 4000):
            y = tf.gaussian_filter(x, radius=radius, mode=mode, cval=CVAL, backend=engine, **kw).numpy()
            want = sp_gaussian_filter(x, radius=radius, mode=mode, cval=CVAL, **kw)
            assert np.array_equal(np.isnan(y), np.isnan(want)), (kw, radius)
            assert np.array_equal(np.isinf(y), np.isinf(want)), (kw, radius)
            fin = np.isfinite(want)
            assert np.allclose(y[fin], want[fin], atol=1e-12, rtol=0), (kw, radius)
    xf = rand(1, 8, 8, seed=19)
    for radius in (40, 4000):  # finite input: the folded derivative is SciPy's
        y = tf.gaussian_filter(xf, 2.0, order=(1, 1), radius=radius, mode=mode, cval=CVAL, backend=engine)
        assert_close(y, sp_gaussian_filter(xf, 2.0, order=(1, 1), radius=radius, mode=mode, cval=CVAL), rtol=1e-12)


def test_huge_radius_gradcheck(engine):
    x = rand(1, 4, 5, seed=20).requires_grad_(True)
    for mode in BASE_MODES:
        for radius in (60, 2**20):
            assert torch.autograd.gradcheck(
                lambda t: tf.gaussian_filter(t, (1.5, 2.5), radius=radius, mode=mode, cval=0.3, backend=engine), (x,),
                fast_mode=True)  # (a random projection of the Jacobian: 2M taps a call, 2 calls instead of 40)


def test_huge_radius_float32_and_spec_size():
    x = rand(3, 8, 8, seed=21, dtype=torch.float32)
    y = tf.gaussian_filter(x, 2.0, radius=2**20, mode="reflect", backend="cpu")
    assert_close(y, sp_gaussian_filter(x, 2.0, radius=2**20), rtol=2e-6)
    from torchfilters import functional

    text = functional._filter_text("reflect", 0.0, "stack", (("gauss", (2.0, 2.0), (0, 0), (2**20, 2**20)),), False)
    assert len(text) < 20_000  # 2 x 2M taps, almost all exactly 0.0: packed
    spec = _spec.decode(text)
    assert len(spec.stencils[0].passes[0].taps) == 2 * 2**20 + 1
    low = _lowering.lower(spec, (8, 8))
    assert all(len(p.taps) <= 6 * 8 + 1 for p in low.stencils[0].passes)
    assert _lowering.lower(spec, (8, 8)) is low  # cached
    assert _lowering.lower(spec, (4096, 4096)).stencils[0].passes[0].taps[:3] == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("mode", BASE_MODES)
def test_huge_blur_kernel_on_a_small_image(mode, engine):
    """selective_blur with a Gaussian reaching far past the image (sigma 12: radius 48 on 6x7):
    its passes are folded too (keep_border specs are not: their band comes from the reach)."""
    x = rand(2, 6, 7, seed=22)
    for normalized in (False, True):
        for keep in (False, True):
            kw = dict(sigma=12.0, normalized=normalized, keep_border=keep, mode=mode, cval=CVAL)
            y = tf.selective_blur(x, 0.1, backend=engine, **kw)
            assert_close(y, sp_selective_blur(x, 0.1, **kw), rtol=1e-12, msg=str(kw))
            xg = x.clone().requires_grad_(True)
            tf.selective_blur(xg, 0.1, backend=engine, **kw).square().sum().backward()
            assert torch.isfinite(xg.grad).all()
    spec = _spec.decode(tf.functional._blur_text(mode, CVAL, False, False, ("gauss", (12.0, 12.0), (0, 0), (48, 48))))
    assert _lowering.lower(spec, (6, 7)) is not spec
    kept = _spec.decode(tf.functional._blur_text(mode, CVAL, False, True, ("gauss", (12.0, 12.0), (0, 0), (48, 48))))
    assert _lowering.lower(kept, (6, 7)) is kept


def _correlate1d(x, lo, taps, mode, cval):
    """The definition: ``out[i] = sum_j taps[j] * x[fold(i + lo + j)]``, summed in order."""
    n = len(x)
    out = np.zeros(n)
    with np.errstate(invalid="ignore"):
        for i in range(n):
            s = 0.0
            for j, w in enumerate(taps):
                f = separable._fold1(n, i + lo + j, mode)
                s += w * (cval if f < 0 else x[f])
            out[i] = s
    return out


@pytest.mark.parametrize("mode", BASE_MODES)
def test_fold_pass_is_the_same_pass(mode):
    """Folded passes against the definition, with taps of both signs, exact zeros, inf and NaN
    samples, origins far to one side, and every axis size from 1."""
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 8):
        for k, lo in ((121, -60), (90, -100), (70, 30), (201, -100), (80, -5), (300, -150)):
            for kind in ("positive", "mixed", "zeros"):
                taps = rng.random(k)
                if kind == "mixed":
                    taps -= 0.5
                if kind == "zeros":
                    taps[rng.random(k) < 0.5] = 0.0
                p = Pass(-1, lo, tuple(float(t) for t in taps))
                q = _lowering.fold_pass(p, n, mode)
                assert q is not p and len(q.taps) <= 6 * n + 3, (n, k, lo, len(q.taps))
                for trial in range(4):
                    x = rng.standard_normal(n)
                    if trial >= 1:
                        x[rng.integers(n)] = np.inf
                    if trial >= 2:
                        x[rng.integers(n)] = -np.inf
                    if trial == 3:
                        x[rng.integers(n)] = np.nan
                    a = _correlate1d(x, p.lo, p.taps, mode, 0.7)
                    b = _correlate1d(x, q.lo, q.taps, mode, 0.7)
                    assert np.array_equal(np.isnan(a), np.isnan(b)), (n, k, lo, kind, x)
                    assert np.array_equal(np.isinf(a), np.isinf(b)) and np.array_equal(a[np.isinf(a)], b[np.isinf(b)])
                    fin = np.isfinite(a)
                    assert np.allclose(a[fin], b[fin], atol=1e-12, rtol=0), (n, k, lo, kind)


def test_short_passes_are_not_folded():
    p = Pass(-2, -8, tuple(float(v) for v in range(17)))
    for mode in BASE_MODES:
        for n in (1, 4, 28):
            assert _lowering.fold_pass(p, n, mode) is p  # reach 8 <= 2n + 16
    spec = FilterSpec("reflect", 0.0, "stack", (_spec.sep((-2, -8, p.taps), (-1, -8, p.taps)),))
    assert _lowering.lower(spec, (1, 1)) is spec


def test_packed_taps_round_trip():
    """Long tap tuples travel in the spec string as runs of bitwise-equal values (hex of their
    float64 bytes and run lengths): -0.0, NaN, infinities and subnormals come back as they were;
    the earlier text form (``repr`` of each value, ``value*count`` runs), which exported programs
    may hold, still decodes."""
    taps = (0.25,) * 70 + (-0.0, 0.0, float("nan"), float("inf"), float("-inf"), 1e-300, 5e-324) + (0.0,) * 100
    spec = FilterSpec("wrap", -0.0, "stack", (_spec.sep((-2, -3, taps), (-1, -1, (1.0, 2.0, 1.0))),))
    text = _spec.encode(spec)
    packed = _spec._pack(taps)
    assert packed in text and packed.startswith("<f8:") and len(packed) < 8 * 16 * 3 + 10  # 8 runs
    old = "<taps:0.25*70 -0.0 0.0 nan inf -inf 1e-300 5e-324 0.0*100>"
    for t in (text, text.replace(packed, old)):
        back = _spec.decode(t)
        got = back.stencils[0].passes[0].taps
        assert len(got) == len(taps) and all(type(v) is float for v in got)
        assert all((a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)
                   for a, b in zip(got, taps))
        assert back.stencils[0].passes[1] == spec.stencils[0].passes[1] and math.copysign(1, back.cval) < 0
    big = tuple(np.random.default_rng(3).standard_normal(5000).tolist()) + (0.0,) * 100000
    assert _spec._unpack(_spec._pack(big)) == big
    # malformed strings are one ValueError each (found by review: raw NumPy errors, a
    # MemoryError, and silent empty tuples for counts <= 0)
    ok = _spec._pack(taps)
    for bad in ("<f8:>", "<f8:abc:00>", ok[:-1], ok[:-1] + "x", ok[:4] + "3fe0000000000000:" + "ff" * 8 + ">",
                "<f8:3fe0000000000000:" + "00" * 8 + ">", "<taps:1.0*99999999999>", "<taps:1.0*-5>", "<taps:1.0*0>",
                "<taps:abc>"):
        with pytest.raises(ValueError, match="malformed spec string"):
            _spec.decode(text.replace(packed, bad))


def _sp_laplace(x, sigma, **kw):
    a = x.double().numpy()
    return np.stack([ndi.gaussian_laplace(p, sigma, **kw) for p in a.reshape(-1, *a.shape[-2:])]).reshape(a.shape)


@pytest.mark.parametrize("mode", MODES)
def test_gaussian_laplace_runs_as_one_separable_launch(mode, launches, monkeypatch):
    """A 2-D ``gaussian_laplace`` (``G''_y G_x + G_y G''_x``, a ``sum`` of two stencils) is one
    launch of the fast path, the second stencil added to the first per block of rows (two
    launches, the second adding to the first, where the output is not written directly; the
    same bits): SciPy's float64 bits in every mode (its sequential constant modes too, which the
    tiled engine gets within an ulp), and in the other modes the tiled engine's bits in float32
    and float64."""
    one = cpu._sep_launch

    def two(*args, second=None, **kw):  # the two-launch route
        return False if second is not None else one(*args, **kw)

    shapes = ((1, 1), (2, 1), (1, 9), (7, 9), (17, 33), (28, 28), (5, 70))
    for h, w in shapes:
        for sigma in (2.0, (0.7, 1.5), (1.2, 0)):
            x = rand(2, h, w, seed=h * 31 + w)
            launches.clear()
            y = tf.gaussian_laplace(x, sigma, mode=mode, cval=CVAL, backend="cpu")
            assert len(launches) == 1 and _fast(launches), (h, w, sigma)
            want = _sp_laplace(x, sigma, mode=mode, cval=CVAL)
            assert np.array_equal(y.numpy(), want), (h, w, sigma, np.abs(y.numpy() - want).max())
            xf = x.float()
            yf = tf.gaussian_laplace(xf, sigma, mode=mode, cval=CVAL, backend="cpu")
            assert_close(yf, want, rtol=2e-6, msg=f"float32 {h}x{w} {sigma}")
            with monkeypatch.context() as m:
                m.setattr(cpu, "_sep_launch", two)
                launches.clear()
                for t, r in ((x, y), (xf, yf)):
                    assert torch.equal(tf.gaussian_laplace(t, sigma, mode=mode, cval=CVAL, backend="cpu"), r)
                assert len(launches) == 4 and _fast(launches)
            if mode not in ("constant", "grid-constant"):  # (the tiled engine's correction terms)
                with monkeypatch.context() as m:
                    m.setattr(cpu, "sep_sum_info", lambda *a: None)
                    for t, r in ((x, y), (xf, yf)):
                        assert torch.equal(tf.gaussian_laplace(t, sigma, mode=mode, cval=CVAL, backend="cpu"), r)


def test_gaussian_laplace_layouts_out_and_low_precision(launches):
    x = rand(2, 3, 20, 26, seed=21)
    want = _sp_laplace(x, 1.7, mode="mirror")
    outs = {
        "contiguous": torch.empty_like(x),
        "transposed (strided rows)": torch.empty(2, 3, 26, 20, dtype=x.dtype).transpose(-1, -2),
    }
    for name, out in outs.items():
        out.fill_(float("nan"))
        assert tf.gaussian_laplace(x, 1.7, mode="mirror", out=out, backend="cpu") is out
        assert np.array_equal(out.numpy(), want), name
    y = x.clone()  # out= the input: through a temporary (the second launch reads the input again)
    tf.gaussian_laplace(y, 1.7, mode="mirror", out=y, backend="cpu")
    assert np.array_equal(y.numpy(), want)
    assert np.array_equal(tf.gaussian_laplace(x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2), 1.7,
                                              mode="mirror", backend="cpu").numpy(), want)
    assert _fast(launches)
    # 16-bit: the tiled engine (two launches would round the first term before the sum)
    launches.clear()
    for dt in (torch.float16, torch.bfloat16):
        yh = tf.gaussian_laplace(x.to(dt), 1.7, mode="mirror", backend="cpu")
        assert yh.dtype == dt
        assert_close(yh, _sp_laplace(x.to(dt), 1.7, mode="mirror"), rtol=1e-2)
    assert launches and not any(fn is separable._k_sep for fn in launches)



_OTHER_WINDOWS = """
import sys
import torch
import torchfilters as tf
from torchfilters.backends.cpu import simd

simd.SPLIT_HALVES = not simd.SPLIT_HALVES  # before the first compile: the host's other choice
torch.save(_cases(tf)[0], sys.argv[1])
"""


def _left_window_cases(tf):
    g = torch.Generator().manual_seed(5)
    xs, out = [], []
    for dtype, sigma in ((torch.float32, 3.5), (torch.float64, 2.0)):  # radii 14 / 8: several tap blocks
        for shape in ((3, 37, 53), (2, 9, 21)):
            x = torch.randn(shape, generator=g).to(dtype)
            for mode in ("reflect", "wrap", "constant"):
                xs.append((x, sigma, mode))
                out.append(tf.gaussian_filter(x, sigma, mode=mode, cval=0.25, backend="cpu"))
    for shape, dtype in (((1, 6, 5, 27), torch.float32), ((2, 3, 4, 8), torch.float32), ((1, 4, 3, 13), torch.float64)):
        x = torch.randn(shape, generator=g).to(dtype)  # the 3-D Sobel's x-passes: ``_vleft`` / ``_vright``
        for mode in ("reflect", "wrap"):
            out.append(tf.gradient(x, operator="sobel", axes=(-3, -2, -1), mode=mode, backend="cpu"))
            out.append(tf.gradient_magnitude(x, operator="sobel", axes=(-3, -2, -1), mode=mode, backend="cpu"))
    return out, xs


def test_the_hosts_other_shuffle_choice_gives_the_same_bits(tmp_path):
    # ``simd.SPLIT_HALVES`` (from the host) picks how ``_vtaps2`` takes the left windows of the
    # horizontal pass and how ``_vleft`` / ``_vright`` shift lanes; the other choice, compiled in a
    # fresh process with an empty cache, sums the same samples in the same order
    import inspect
    import os
    import subprocess
    import sys

    code = inspect.getsource(_left_window_cases).replace("_left_window_cases", "_cases") + _OTHER_WINDOWS
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), TORCHFILTERS_COMPILE="wait")
    path = tmp_path / "other.pt"
    r = subprocess.run([sys.executable, "-c", "import torch\n" + code, str(path)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    other = torch.load(path)
    mine, xs = _left_window_cases(tf)
    assert len(other) == len(mine) == 24
    for a, b in zip(mine[12:], other[12:]):
        assert torch.equal(float_bits(a), float_bits(b))
    for a, b, (x, sigma, mode) in zip(mine, other, xs):
        assert torch.equal(float_bits(a), float_bits(b)), (x.dtype, x.shape, mode)
        if x.dtype == torch.float64:  # and both are SciPy's
            assert torch.equal(float_bits(a), float_bits(torch.from_numpy(sp_gaussian_filter(x, sigma, mode=mode,
                                                                                             cval=0.25))))


_V2 = """
import sys
import torch
import torchfilters as tf
from torchfilters.backends.cpu import simd

assert simd.VBYTES == 16 and not simd.SPLIT_HALVES, (simd._CPU, simd.VBYTES)
x = torch.load(sys.argv[1])
torch.save([tf.gradient_magnitude(x, operator="sobel", axes=(-3, -2, -1), mode="wrap", backend="cpu"),
            tf.gaussian_filter(x, 2.0, backend="cpu")], sys.argv[2])
"""


def test_kernels_follow_numbas_target_cpu_not_the_host(tmp_path):
    # a cache built for other machines (``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``): no
    # instruction the target lacks -- the lane shifts' AVX2 assembly ended the process with an
    # LLVM error on an SSE-only target, and would have been a SIGILL on an AVX-only one
    import os
    import subprocess
    import sys

    x = torch.randn(1, 6, 5, 19, generator=torch.Generator().manual_seed(2))
    torch.save(x, tmp_path / "x.pt")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), TORCHFILTERS_COMPILE="wait",
               NUMBA_CPU_NAME="x86-64-v2",
               NUMBA_CPU_FEATURES="+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+sahf,-avx,-avx2,-fma")
    r = subprocess.run([sys.executable, "-c", _V2, str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    # the flags in LLVM's order: a later ``-avx`` turns AVX2 off too; numba's NUMBA_ENABLE_AVX=0
    probe = "from torchfilters.backends.cpu import simd; print(simd.VBYTES, simd.SPLIT_HALVES)"
    for extra in ({"NUMBA_CPU_NAME": "znver1", "NUMBA_CPU_FEATURES": "+avx2,+fma,-avx"}, {"NUMBA_ENABLE_AVX": "0"}):
        e = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")} | extra
        p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=e, timeout=300)
        assert p.returncode == 0 and p.stdout.split() == ["16", "False"], (extra, p.stdout, p.stderr[-2000:])
    mag, gauss = torch.load(tmp_path / "y.pt")
    assert_close(mag, tf.gradient_magnitude(x.double(), operator="sobel", axes=(-3, -2, -1), mode="wrap",
                                            backend="reference"), rtol=1e-5)
    assert_close(gauss, sp_gaussian_filter(x.double(), 2.0), rtol=1e-5)
