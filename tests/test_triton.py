"""The fused Triton engine (backends/triton/), run on CPU through Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before the engine's kernels are decorated,
so the module fixture sets it, (re)imports ``torchfilters.backends.triton``
(fresh kernels, interpreted) and installs it as the ``"triton"`` backend; on
teardown it puts the environment and the backend registry back, so the other
test modules in the same process see the ordinary (GPU-only) engine.

Oracle: the reference engine (forward and backward), and SciPy for a few.
Every test checks that kernels were launched and nothing fell back to the
reference (``LAUNCHES`` / ``FALLBACKS``).  The interpreter costs about a
millisecond per Triton op, so shapes are tiny and the grid is a covering
design rather than a full cross product: every op in every mode (float64,
tight tolerance), every dtype on a subset, plus the special paths (tiles,
border bands, runtime loops, u buffers, layouts, NaN, out=).

``make test`` runs a core of each list of cases (every op once, the modes in
turn; every dtype twice; each special path on a subset of its ops) and a few
sampled cases of the op x mode grid; ``make test-full`` runs every case.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf
from torchfilters import _spec, backends
from torchfilters._spec import FilterSpec

pytest.importorskip("triton")

from conftest import (  # noqa: E402
    BASE_MODES,
    FULL_GRID,
    assert_angles_close,
    cases,
    examples,
    interpreted_triton,
    pattern_mask,
    rand,
    sp_gaussian_filter,
    sp_gradient_magnitude,
    sp_selective_blur,
)

pytestmark = pytest.mark.triton

_NAME = "torchfilters.backends.triton"


@pytest.fixture(scope="module")
def T():
    """The Triton engine with interpreted kernels, installed as backend "triton"."""
    with interpreted_triton() as mod:
        yield mod


@contextlib.contextmanager
def launched(T, fwd=1, bwd=0):
    """Assert that the block launched at least ``fwd``/``bwd`` kernels and fell back nowhere."""
    before = dict(T.LAUNCHES)
    fell = sum(T.FALLBACKS.values())
    yield
    ran = sum(T.LAUNCHES[k] - before.get(k, 0) for k in ("fwd", "rows"))  # rows: the separable kernel
    assert ran >= fwd, "the forward Triton kernel did not run"
    ran_bwd = sum(T.LAUNCHES[k] - before.get(k, 0) for k in ("bwd", "rows_bwd"))  # rows_bwd: the fused one
    assert ran_bwd >= bwd, "the backward Triton kernel did not run"
    assert sum(T.FALLBACKS.values()) == fell, f"fell back to the reference: {dict(T.FALLBACKS)}"


# ------------------------------------------------------------------ op table
#
# Every public op, every operator, both variants of each option; kernels of
# radius >= 2 where the op allows (radius 1 hides reflect/nearest mix-ups).

K5x3 = ((0.5, -1.0, 2.0), (1.0, 0.0, -0.5), (0.75, 2.0, 1.0), (0.1, 0.2, 0.3), (-0.3, 0.6, 0.9))  # a zero tap
K1 = (0.5, -1.0, 2.0, 0.25, 1.0)
BLUR_W = ((1.0, 2.0, 0.0, 2.0, 1.0), (0.5, 1.0, 3.0, 1.0, 0.5))

CASES = {
    "correlate": lambda x, **k: tf.correlate(x, K5x3, origin=(1, -1), **k),
    "convolve": lambda x, **k: tf.convolve(x, K5x3[:4], **k),
    "correlate1d-x": lambda x, **k: tf.correlate1d(x, K1, -1, origin=-1, **k),
    "convolve1d-y": lambda x, **k: tf.convolve1d(x, K1[:4], -2, **k),
    "derivative-central-x": lambda x, **k: tf.derivative(x, -1, **k),
    "derivative-sobel-y-normalized": lambda x, **k: tf.derivative(x, -2, operator="sobel", normalized=True, **k),
    "prewitt-y": lambda x, **k: tf.prewitt(x, -2, **k),
    "scharr-x": lambda x, **k: tf.scharr(x, -1, **k),
    "gradient-prewitt": lambda x, **k: tf.gradient(x, operator="prewitt", **k),
    "gradient_magnitude-central": lambda x, **k: tf.gradient_magnitude(x, **k),
    "gradient_magnitude-sobel": lambda x, **k: tf.gradient_magnitude(x, operator="sobel", **k),
    "gradient_magnitude-scharr-normalized": lambda x, **k: tf.gradient_magnitude(
        x, operator="scharr", normalized=True, **k
    ),
    "gradient_direction-central": lambda x, **k: tf.gradient_direction(x, **k),
    "gaussian_filter": lambda x, **k: tf.gaussian_filter(x, (0.6, 0.45), **k),
    "gaussian_filter-order": lambda x, **k: tf.gaussian_filter(x, 0.5, order=(2, 1), radius=(1, 2), **k),
    "gaussian_gradient_magnitude": lambda x, **k: tf.gaussian_gradient_magnitude(x, 0.45, **k),
    "laplace": lambda x, **k: tf.laplace(x, **k),
    "gaussian_laplace": lambda x, **k: tf.gaussian_laplace(x, (0.5, 0.7), **k),
    "uniform_filter": lambda x, **k: tf.uniform_filter(x, (2, 3), origin=(0, 1), **k),
    "uniform_filter1d-y": lambda x, **k: tf.uniform_filter1d(x, 4, -2, **k),
    "gaussian_filter1d-x": lambda x, **k: tf.gaussian_filter1d(x, 0.6, -1, order=1, **k),
    "signal-gaussian": lambda x, **k: tf.gaussian_filter(x, 0.8, axes=-1, **k),
    "selective_blur": lambda x, **k: tf.selective_blur(x, 0.1, **k),
    "selective_blur-normalized": lambda x, **k: tf.selective_blur(x, 0.1, normalized=True, **k),
    "selective_blur-weights-keep_border": lambda x, **k: tf.selective_blur(
        x, -0.2, weights=BLUR_W, keep_border=True, **k
    ),
    "selective_blur-sigma-normalized-keep_border": lambda x, **k: tf.selective_blur(
        x, 0.0, sigma=0.5, normalized=True, keep_border=True, **k
    ),
    "selective_blur-mask": lambda x, **k: tf.selective_blur(x, mask=pattern_mask(*x.shape[-2:]), weights=BLUR_W, **k),
    "selective_blur-mask-normalized": lambda x, **k: tf.selective_blur(
        x, mask=pattern_mask(*x.shape[-2:]), weights=BLUR_W, normalized=True, **k
    ),
}
ANGLES = {"gradient_direction-central"}
#: small odd shapes, 1x1 and 1-wide images, several planes; kernels often reach past the image
SHAPES = ((2, 5, 6), (1, 1, 4, 3), (1, 1), (3, 2, 7), (1, 6, 1), (2, 1, 3, 5))
CVAL = 0.75


def run(name, x, engine, mode="reflect", **kw):
    return CASES[name](x, mode=mode, cval=CVAL, backend=engine, **kw)


def fwd_bwd(name, x, engine, mode, seed=7):
    xx = x.detach().requires_grad_(True)  # same strides as x
    y = run(name, xx, engine, mode)
    g = rand(*y.shape, seed=seed, dtype=y.dtype)
    (gx,) = torch.autograd.grad(y, xx, g)
    return y.detach(), gx


def close(a, b, tol, what="", angles=False):
    """``|a - b| <= tol * max(1, max|b|)``; NaN where the other is NaN."""
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    a64, b64 = a.double(), b.double()
    nan = a64.isnan() & b64.isnan()
    assert torch.equal(a64.isnan(), b64.isnan()), f"{what}: NaN positions differ"
    if angles:  # atan2 of a signed zero: +-pi are the same angle
        assert_angles_close(a64.nan_to_num(0.0), b64.nan_to_num(0.0), atol=tol * math.pi)
        return
    scale = max(1.0, float(b64[~nan].abs().max())) if (~nan).any() else 1.0
    err = (a64 - b64).abs()
    bad = ~((err <= tol * scale) | nan)
    assert not bool(bad.any()), (
        f"{what}: {int(bad.sum())}/{bad.numel()} differ, max err {float(err[~nan].max()):.3g} "
        f"(tol {tol * scale:.3g})"
    )


def check_against_reference(T, name, x, mode, tol):
    with launched(T, 1, 1):
        y, gx = fwd_bwd(name, x, "triton", mode)
    yr, gr = fwd_bwd(name, x, "reference", mode)
    close(y, yr, tol, f"{name} {mode} forward", angles=name in ANGLES)
    close(gx, gr, tol, f"{name} {mode} backward")


# --------------------------------------------------------------- the grid
#
# Every op in every mode, except the per-neighbour-recompute backwards (gradient
# magnitude of 3x3 operators, normalized blur): those cost NT^2 taps per band in the
# interpreter, so each runs in some modes and the modes rotate across them (their mode
# handling is the same fold / slot code the cheap ops run in every mode).

RECOMPUTE_MODES = {
    "gradient_magnitude-sobel": ("reflect",),
    "gradient_magnitude-scharr-normalized": ("constant",),
    "selective_blur-normalized": ("nearest",),
    "selective_blur-mask-normalized": ("constant",),
}
GRID = [(n, m) for n in CASES for m in RECOMPUTE_MODES.get(n, BASE_MODES)]
#: the two costliest recompute backwards (about 10 s each here); their kernels are the ones
#: gradient_magnitude-scharr-normalized (3x3 operator magnitude) and
#: selective_blur-mask-normalized / -sigma-normalized-keep_border (normalized blur) run
HEAVY = ("gradient_magnitude-sobel", "selective_blur-normalized")
#: every other op once, the modes in turn (each mode four or five times, every shape)
CORE = [(n, RECOMPUTE_MODES.get(n, BASE_MODES)[k % len(RECOMPUTE_MODES.get(n, BASE_MODES))])
        for k, n in enumerate(CASES) if n not in HEAVY]


@cases("name, mode", GRID, CORE)
def test_every_op_every_mode_float64(T, name, mode):
    i = list(CASES).index(name) + BASE_MODES.index(mode)
    shape = SHAPES[i % len(SHAPES)]
    x = rand(*shape, seed=i)
    check_against_reference(T, name, x, mode, 1e-12)


@examples(3)
@given(case=st.sampled_from(GRID))
def test_every_op_every_mode_float64_sampled(T, case):
    test_every_op_every_mode_float64(T, *case)


DTYPE_GRID = [
    ("gradient_magnitude-central", "reflect"),
    ("gradient-prewitt", "constant"),
    ("selective_blur", "wrap"),
]
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DTYPE_EXTRA = {
    torch.float16: [("gradient_direction-central", "mirror"), ("correlate", "nearest")],
    torch.bfloat16: [("selective_blur-sigma-normalized-keep_border", "nearest"), ("gaussian_filter", "mirror")],
    torch.float32: [("selective_blur-mask", "mirror"), ("convolve1d-y", "wrap")],
}
DTYPE_CASES = [(dt, n, m) for dt in DTYPES for n, m in DTYPE_GRID + DTYPE_EXTRA[dt]]
#: each dtype: one of DTYPE_GRID (in turn) and its first extra case
DTYPE_CORE = [(dt, *DTYPE_GRID[k]) for k, dt in enumerate(DTYPES)] + [(dt, *DTYPE_EXTRA[dt][0]) for dt in DTYPES]


@cases("dtype, name, mode", DTYPE_CASES, DTYPE_CORE)
def test_low_precision_dtypes(T, dtype, name, mode):
    """float32 arithmetic for every dtype: one rounding to the output dtype away from the
    reference (which also computes in float32)."""
    tol = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    k = (DTYPE_GRID + DTYPE_EXTRA[dtype]).index((name, mode))
    x = rand(2, 5, 6, seed=k, dtype=dtype)
    check_against_reference(T, name, x, mode, tol)


@examples(2)
@given(case=st.sampled_from(DTYPE_CASES))
def test_low_precision_dtypes_sampled(T, case):
    test_low_precision_dtypes(T, *case)


# ----------------------------------------------------------- special paths


@pytest.fixture
def small_tiles(T):
    """4x4 tiles, four planes per program (one group, not full): several tiles per image,
    bands cut by tiles."""
    old = T.set_tile_limits(max_bw=4, max_elems=64, max_bp=4, bwd_elems=64)
    yield
    T.set_tile_limits(**old)


MULTI_TILE = [
    ("gaussian_filter", "reflect"),
    ("gaussian_gradient_magnitude", "mirror"),
    ("gradient_magnitude-central", "wrap"),
    ("selective_blur-sigma-normalized-keep_border", "nearest"),
    ("selective_blur-weights-keep_border", "constant"),
    ("correlate", "nearest"),
    ("gradient-prewitt", "mirror"),
]


#: separable passes and the magnitude epilogue (gaussian_gradient_magnitude), a blur, a dense
#: kernel, a stacked gradient
@cases("name, mode", MULTI_TILE, [MULTI_TILE[i] for i in (1, 4, 5, 6)])
def test_multi_tile(T, small_tiles, name, mode):
    x = rand(3, 5, 7, seed=3)
    check_against_reference(T, name, x, mode, 1e-12)


@pytest.fixture
def runtime_loops(T, monkeypatch):
    """Tap loops as runtime loops (the path of large kernels)."""
    monkeypatch.setattr(T.plan, "_UNROLL_MAX", 0)
    T._PLANS.clear()
    yield
    T._PLANS.clear()


RUNTIME_LOOPS = [
    ("gradient_magnitude-central", "reflect"),
    ("gradient_direction-central", "nearest"),
    ("selective_blur", "mirror"),
    ("gradient-prewitt", "constant"),
    ("correlate", "wrap"),
]


#: (the direction recomputes its stencils in the backward as the magnitude does)
@cases("name, mode", RUNTIME_LOOPS, RUNTIME_LOOPS[1:])
def test_runtime_tap_loops(T, runtime_loops, name, mode):
    check_against_reference(T, name, rand(2, 4, 5, seed=5), mode, 1e-12)


RECOMPUTE = [
    ("gradient_magnitude-central", "mirror"),
    ("gradient_direction-central", "reflect"),
    ("selective_blur-mask-normalized", "constant"),
]
RECOMPUTE_CASES = [(path, n, m) for n, m in RECOMPUTE for path in ("u-buffer", "recompute")]


#: the u buffer for each, the recompute (the default for these small footprints, which the
#: op grid runs) for one
@cases("path, name, mode", RECOMPUTE_CASES, [("u-buffer", n, m) for n, m in RECOMPUTE] + [("recompute", *RECOMPUTE[0])])
def test_recompute_or_u_buffer(T, monkeypatch, path, name, mode):
    """Magnitude / direction / normalized backward: per-neighbour recompute (fused, small
    footprints) and the u buffer (large footprints) give the same gradient."""
    recompute_max = {"u-buffer": 0, "recompute": 10_000}[path]
    monkeypatch.setattr(T.plan, "_RECOMPUTE_MAX", recompute_max)
    T._PLANS.clear()
    try:
        before = T.LAUNCHES["fwd"] + T.LAUNCHES["rows"]
        check_against_reference(T, name, rand(1, 2, 4, 5, seed=9), mode, 1e-12)
        fwd_launches = T.LAUNCHES["fwd"] + T.LAUNCHES["rows"] - before
        assert fwd_launches == (2 if recompute_max == 0 else 1)  # + the u kernel
    finally:
        T._PLANS.clear()


def test_big_radius_tiny_images(T):
    """Radius far past the image: many preimages per pixel in every mode (and 1x1 images)."""
    for k, mode in enumerate(BASE_MODES):
        for shape in ((1, 1), (2, 3), (3, 1)):
            x = rand(*shape, seed=k)
            with launched(T, 1, 1):
                y, g = fwd_bwd("correlate1d-x", x, "triton", mode)
            yr, gr = fwd_bwd("correlate1d-x", x, "reference", mode)
            close(y, yr, 1e-12, f"{mode} {shape}")
            close(g, gr, 1e-12, f"{mode} {shape}")
    x = rand(2, 3, seed=1)
    for mode in BASE_MODES:
        kw = dict(mode=mode, cval=CVAL, radius=3)
        with launched(T):
            y = tf.gaussian_filter(x, 1.0, backend="triton", **kw)
        close(y, torch.from_numpy(sp_gaussian_filter(x, 1.0, **kw)), 1e-12, f"gaussian {mode} vs scipy")


def test_scipy_parity(T):
    x = rand(2, 6, 5, seed=4)
    for mode in BASE_MODES:
        with launched(T, 3):
            gm = tf.gradient_magnitude(x, operator="sobel", mode=mode, cval=CVAL, backend="triton")
            gf = tf.gaussian_filter(x, 0.8, mode=mode, cval=CVAL, backend="triton")
            sb = tf.selective_blur(x, 0.1, normalized=True, keep_border=True, mode=mode, backend="triton")
        close(gm, torch.from_numpy(sp_gradient_magnitude(x, "sobel", mode, CVAL)), 1e-12, mode)
        close(gf, torch.from_numpy(sp_gaussian_filter(x, 0.8, mode=mode, cval=CVAL)), 1e-12, mode)
        want = sp_selective_blur(x, 0.1, normalized=True, keep_border=True, mode=mode)
        close(sb, torch.from_numpy(want), 1e-12, mode)


def test_nan_inputs(T):
    """NaN reaches exactly the outputs (and gradients) the reference's NaN reaches: zero taps
    of a dense kernel propagate it (0 * NaN), skipped zero taps of a separable one do not."""
    x = rand(2, 6, 7, seed=2)
    x[0, 2, 3] = float("nan")
    x[1, 0, 6] = float("nan")
    names = ("correlate", "derivative-central-x", "gradient_magnitude-central", "selective_blur",
             "selective_blur-normalized", "gradient_direction-central")
    for k, name in enumerate(names):
        mode = BASE_MODES[k % 5]
        with launched(T, 1, 1):
            y, g = fwd_bwd(name, x, "triton", mode)
        yr, gr = fwd_bwd(name, x, "reference", mode)
        assert y.isnan().any(), name
        close(y, yr, 1e-12, f"{name} {mode} forward", angles=name in ANGLES)
        close(g, gr, 1e-12, f"{name} {mode} backward")


@pytest.mark.filterwarnings("ignore:invalid value encountered in add:RuntimeWarning")  # (inf - inf: the point)
def test_sums_of_stencils_and_empty_footprints_keep_scipys_infinities(T):
    """A sum of stencils (``laplace``, ``gaussian_laplace``, DoG, unsharp mask) runs each term on
    its own and adds them in order, as SciPy does: float64 is SciPy's bits, and an infinite
    sample gives NaN where two terms meet it with opposite signs (``inf - inf``), not the
    ``inf`` of weights added per offset.  A dense kernel of zero weights sums nothing: 0 under
    an infinite sample (or ``cval``), with a zero gradient."""
    import numpy as np
    import scipy.ndimage as ndi

    x = rand(2, 7, 9, seed=3)
    x[0, 3, 4] = math.inf
    x[1, 5, 1] = -math.inf
    x[1, 1, 6] = math.nan
    xn = x.numpy()
    per = lambda f: np.stack([f(p) for p in xn])  # noqa: E731
    for k, mode in enumerate(BASE_MODES):
        with launched(T, 4):
            lap = tf.laplace(x, mode=mode, cval=CVAL, backend="triton")
            log = tf.gaussian_laplace(x, (0.8, 0.6), mode=mode, cval=CVAL, backend="triton")
            dog = tf.difference_of_gaussians(x, 0.6, mode=mode, cval=CVAL, backend="triton")
            usm = tf.unsharp_mask(x, 0.7, amount=0.5, mode=mode, cval=CVAL, backend="triton")
        assert np.array_equal(lap.numpy(), per(lambda p: ndi.laplace(p, mode=mode, cval=CVAL)), equal_nan=True), mode
        want = per(lambda p: ndi.gaussian_laplace(p, (0.8, 0.6), mode=mode, cval=CVAL))
        assert np.array_equal(log.numpy(), want, equal_nan=True), mode
        assert lap.isnan().sum() > 3 and log.isnan().sum() > 3, mode  # the inf - inf pixels
        for got, name in ((dog, "difference_of_gaussians"), (usm, "unsharp_mask")):
            ref = {"difference_of_gaussians": lambda t: tf.difference_of_gaussians(t, 0.6, mode=mode, cval=CVAL),
                   "unsharp_mask": lambda t: tf.unsharp_mask(t, 0.7, amount=0.5, mode=mode, cval=CVAL)}[name]
            want = ref(x)
            for cls in (torch.isnan, torch.isposinf, torch.isneginf):
                assert torch.equal(cls(got), cls(want)), (name, mode, cls.__name__)
            close(got.nan_to_num(0.0, 0.0, 0.0), want.nan_to_num(0.0, 0.0, 0.0), 1e-12, f"{name} {mode}")
    zeros = torch.zeros(3, 3, dtype=torch.float64)
    for mode in BASE_MODES:
        xg = x.clone().requires_grad_(True)
        with launched(T, 1, 1):
            y = tf.correlate(xg, zeros, mode=mode, cval=math.inf, backend="triton")
            (g,) = torch.autograd.grad(y, xg, torch.ones_like(y))
        assert torch.equal(y, torch.zeros_like(x)) and not y.signbit().any(), mode
        assert torch.equal(g, torch.zeros_like(x)), mode


def test_flat_regions_have_zero_gradient(T):
    for op, dtype, mode in (("central", torch.bfloat16, "constant"), ("sobel", torch.float32, "reflect")):
        x = torch.full((1, 2, 5, 4), 0.5, dtype=dtype, requires_grad=True)
        with launched(T, 1, 1):
            y = tf.gradient_magnitude(x, operator=op, mode=mode, cval=0.5, backend="triton")
            y.sum().backward()  # an expanded (stride 0) gradient
        assert float(y.detach().abs().max()) == 0.0
        assert torch.equal(x.grad, torch.zeros_like(x))


def test_layouts_and_out(T):
    base = rand(2, 3, 6, 5, seed=6, dtype=torch.float32)
    layouts = {
        "transposed": base.transpose(-1, -2),
        "channels_last": base.contiguous(memory_format=torch.channels_last),
        "leading-stride": base[:, ::2],
        "three-leading-dims": rand(3, 3, 3, 6, 5, seed=1, dtype=torch.float32)[::2, ::2, ::2],
        "expanded-planes": rand(1, 6, 5, seed=2, dtype=torch.float32).expand(4, 6, 5),
    }
    names = ("gradient-prewitt", "gradient_magnitude-central", "selective_blur")
    for k, (what, x) in enumerate(layouts.items()):
        for name in names[k % 3:k % 3 + 1] + (("gradient-prewitt",) if what == "expanded-planes" else ()):
            with launched(T, 1, 1):
                y, g = fwd_bwd(name, x, "triton", "reflect")
            yr, gr = fwd_bwd(name, x.contiguous(), "reference", "reflect")
            close(y, yr, 2e-6, f"{what} {name}")
            close(g, gr, 2e-6, f"{what} {name}")
    # a mask broadcast over channels, out= into a transposed buffer
    x = base
    mask = rand(2, 1, 6, 5, seed=8) > 0
    out = torch.empty(2, 3, 5, 6).transpose(-1, -2)
    with launched(T):
        res = tf.selective_blur(x, mask=mask, sigma=0.6, normalized=True, out=out, backend="triton")
    assert res is out
    close(out, tf.selective_blur(x, mask=mask, sigma=0.6, normalized=True, backend="reference"), 2e-6)
    # engine level: out may not alias an input; grad of the wrong shape is broadcast
    spec = _spec.decode(_spec.encode(FilterSpec("reflect", 0.0, "magnitude", _sobel_pair())))
    with pytest.raises(ValueError, match="share memory"):
        T.filter_forward(x, spec, out=x)
    with launched(T, 0, 1):
        gin = T.filter_backward(torch.ones(()).expand(x.shape), x, spec)
    close(gin, backends.get("reference").filter_backward(torch.ones_like(x), x, spec), 2e-6)


def _sobel_pair():
    from torchfilters.functional._core import derivative_stencil as _derivative_stencil

    return (_derivative_stencil("sobel", -2, False), _derivative_stencil("sobel", -1, False))


def test_empty_and_unsupported_specs(T):
    x = torch.empty(0, 3, 4)
    assert tf.sobel(x, backend="triton").shape == x.shape
    # specs functional.py never builds: handed to the reference, and counted
    a, b = _sobel_pair()
    three = FilterSpec("reflect", 0.0, "stack", (a, b, a))
    same_axis = FilterSpec("wrap", 0.0, "stack", (_spec.sep((-1, -1, (1.0, 2.0, 1.0)), (-1, -1, (1.0, 0.0, -1.0))),))
    x = rand(2, 4, 5, seed=1)
    ref = backends.get("reference")
    for spec in (three, same_axis):
        before = sum(T.FALLBACKS.values())
        close(T.filter_forward(x, spec), ref.filter_forward(x, spec), 1e-12)
        assert sum(T.FALLBACKS.values()) == before + 1


def test_dispatch(T, monkeypatch):
    assert T.available(torch.device("cpu"), torch.float32)
    assert not T.available(torch.device("cpu"), torch.int32)
    assert not T.available(torch.device("meta"), torch.float32)
    x = rand(1, 4, 4, seed=0)
    monkeypatch.setenv("TORCHFILTERS_BACKEND", "triton")
    with launched(T):
        tf.sobel(x)


def test_slots_enumerate_every_preimage(T):
    """Host side of the adjoint: the slot tables list each padded position folding onto a
    pixel exactly once (brute force against the reference's fold_indices)."""
    fold = backends.get("reference").fold_indices
    for mode in BASE_MODES:
        for n in range(1, 7):
            for lo in (-11, -5, -2, -1, 0):
                for hi in (0, 1, 3, 6, 12):
                    L, U = min(lo, 0), n - 1 + max(hi, 0)
                    f = fold(n, L, U - L + 1, mode).tolist()
                    want = sorted((p, j) for j, p in zip(range(L, U + 1), f) if p != j and p < n)
                    got = []
                    for A, B, a, b, P in T._slots(n, lo, hi, mode):
                        got += [(p, A * p + B) for p in range(a, b + 1)] if P < 0 else [(P, j) for j in range(a, b + 1)]
                    assert sorted(got) == want, (mode, n, lo, hi)


@pytest.mark.skipif(os.environ.get("TORCHFILTERS_TRITON_AOT") != "1", reason="set TORCHFILTERS_TRITON_AOT=1")
def test_kernels_compile_for_sm90():
    """Opt-in: compile every kernel family of ``benchmarks/gpu_check.py`` for sm_90 with Triton's
    own compiler (no GPU needed; about 20 minutes here).  The interpreter accepts code the
    compiler rejects (Triton 3.6 refused a pass taken out of a stencil tuple), so run this after
    changing the kernels, and with each Triton the package supports."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_check.py")
    res = subprocess.run([sys.executable, script, "--compile-only", "--quick"], env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")  # (the interpreter squares in numpy: what the rescaling is for)
def test_3x3x3_gradient_runs_fused(T):
    """The 3-D Sobel / Prewitt / Scharr gradient runs on the fused 3x3x3 kernel (``triton/volume``,
    the host rule shared with the CPU's direct path): float64 components are the CPU path's bits
    -- SciPy's, signs of zero included -- in every mode, per-axis modes and axes in any order;
    the magnitude is the same and rescales where its squares overflow; float32 and bfloat16 are
    the CPU engine's values; ``out=`` is written."""
    import numpy as np
    import scipy.ndimage as ndi

    ax = (-3, -2, -1)
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((2, 5, 6, 7)))
    x[0, :1] = -1.0  # equal pairs: signed zeros
    for mode, op, axes, norm in [("reflect", "sobel", ax, False), ("constant", "prewitt", ax, False),
                                 ("wrap", "scharr", (-1, -3, -2), True), (("mirror", "nearest", "constant"), "sobel", ax, False),
                                 ("nearest", "sobel", (1, 2, 3), True)]:
        kw = dict(operator=op, axes=axes, mode=mode, normalized=norm)
        before, fell = T.LAUNCHES["grad3"], sum(T.FALLBACKS.values())
        g = tf.gradient(x, backend="triton", **kw)
        gc = tf.gradient(x, backend="cpu", **kw)
        assert torch.equal(g, gc) and torch.equal(g.signbit(), gc.signbit()), (mode, op, axes)
        if mode in ("reflect", "wrap"):  # (the magnitude's epilogue: plain and normalized)
            m = tf.gradient_magnitude(x, backend="triton", **kw)
            assert torch.equal(m, tf.gradient_magnitude(x, backend="cpu", **kw))
        assert T.LAUNCHES["grad3"] == before + 1 + (mode in ("reflect", "wrap")), (mode, op)
        assert sum(T.FALLBACKS.values()) == fell, (mode, op)
        if op == "sobel" and axes == ax and isinstance(mode, str):
            for q in range(3):
                assert np.array_equal(g[:, q].numpy(), np.stack([ndi.sobel(v, q, mode=mode) for v in x.numpy()]))
    # a program streams a column of tiles over ZC planes: a depth over two (uneven) chunks,
    # and depths of 1 and 2 (every plane's neighbours folded)
    V = sys.modules[T.__name__ + ".volume"]
    for shape in [(1, V.ZC + 3, 4, 3), (3, 1, 4, V.BX + 3), (1, 2, V.BY + 1, 6)]:
        xd = torch.from_numpy(np.random.default_rng(5).standard_normal(shape))
        for mode in ("reflect", "constant", "wrap"):
            g = tf.gradient(xd, operator="sobel", axes=ax, mode=mode, backend="triton")
            want = np.stack([np.stack([ndi.sobel(v, a, mode=mode) for a in range(3)]) for v in xd.numpy()])
            assert np.array_equal(g.numpy(), want), (shape, mode)
    xf = x.float()
    for dt in (torch.float32, torch.bfloat16):
        y = tf.gradient_magnitude(xf.to(dt), operator="sobel", axes=ax, backend="triton")
        assert y.dtype == dt and torch.equal(y, tf.gradient_magnitude(xf.to(dt), operator="sobel", axes=ax, backend="cpu"))
    big = xf * 2.0**100
    y = tf.gradient_magnitude(big, operator="sobel", axes=ax, backend="triton")
    assert torch.isfinite(y).all()
    close(y.double(), tf.gradient_magnitude(big.double(), operator="sobel", axes=ax, backend="reference"), 1e-6, "rescaled")
    out = torch.full_like(xf, float("nan"))
    assert tf.gradient_magnitude(xf, operator="sobel", axes=ax, out=out, backend="triton") is out
    assert torch.equal(out, tf.gradient_magnitude(xf, operator="sobel", axes=ax, backend="cpu"))
    # the backward: chains of plane launches (``triton/chain``), not the reference
    for mode in (("mirror", "nearest", "constant"),):
        xr = x[:1].clone().requires_grad_()
        before, fell = T.LAUNCHES["chain_bwd"], sum(T.FALLBACKS.values())
        (g,) = torch.autograd.grad(tf.gradient_magnitude(xr, operator="sobel", axes=ax, mode=mode, backend="triton").sum(), xr)
        assert T.LAUNCHES["chain_bwd"] > before and sum(T.FALLBACKS.values()) == fell, dict(T.FALLBACKS)
        xq = x[:1].clone().requires_grad_()
        (gr,) = torch.autograd.grad(tf.gradient_magnitude(xq, operator="sobel", axes=ax, mode=mode, backend="reference").sum(), xq)
        close(g, gr, 1e-12, f"3x3x3 backward {mode}")


def test_volumes_and_per_axis_modes_run_as_chains_of_plane_launches(T):
    """Separable specs of three axes, and 2-D specs whose axes read with different modes, run as
    chains of plane launches (``triton/chain``): a depth pass on the ``(..., D, H * W)`` view, the
    ``H``/``W`` passes of one mode in one launch.  float64 results are SciPy's bits in every mode
    (``constant`` with ``cval``: each launch pads its input, as SciPy's sequential passes do),
    axes in any order and per-axis modes included; multi-stencil specs share the reference's
    epilogues (selective blur: its selection and blend or masked mean); the backward is the chain
    of adjoints.  A dense 3-D stencil is the sum of its slices' 2-D launches."""
    import numpy as np
    import scipy.ndimage as ndi

    x = rand(2, 5, 6, 7, seed=3)
    xn = x.numpy()
    ax = (-3, -2, -1)

    def per_volume(f):
        return np.stack([f(v) for v in xn])

    def chained(call):
        before, fell = T.LAUNCHES["chain"], sum(T.FALLBACKS.values())
        y = call()
        assert T.LAUNCHES["chain"] > before and sum(T.FALLBACKS.values()) == fell, dict(T.FALLBACKS)
        return y

    for i, mode in enumerate(BASE_MODES + (("wrap", "reflect", "constant"),)):
        y = chained(lambda: tf.gaussian_filter(x, (0.8, 0.5, 0.6), axes=ax, mode=mode, cval=0.5, backend="triton"))
        assert np.array_equal(y.numpy(), per_volume(lambda v: ndi.gaussian_filter(v, (0.8, 0.5, 0.6), mode=mode, cval=0.5))), mode
        if not FULL_GRID and i % 2:
            continue  # (make test: uniform_filter in every other mode)
        y = chained(lambda: tf.uniform_filter(x, (2, 3, 4), origin=(0, 1, -1), axes=ax, mode=mode, backend="triton"))
        # (SciPy's running sums are not a sum of taps: an ulp or two apart)
        want = per_volume(lambda v: ndi.uniform_filter(v, (2, 3, 4), origin=(0, 1, -1), mode=mode))
        assert np.abs(y.numpy() - want).max() < 1e-15, mode
    # axes in any order and positive; a 3-axis derivative component
    y = chained(lambda: tf.gaussian_filter(x, (0.8, 0.5, 0.6), order=(0, 1, 2), axes=(3, 1, 2), mode="mirror",
                                           backend="triton"))
    want = ndi.gaussian_filter(xn, (0.8, 0.5, 0.6), order=(0, 1, 2), axes=(3, 1, 2), mode="mirror")
    assert np.array_equal(y.numpy(), want)
    # one depth axis followed by H and W: a vertical pass of the (..., D, H * W) view, one plane launch
    before, fell = T.LAUNCHES["chain"], sum(T.FALLBACKS.values())
    y = tf.gaussian_filter1d(x, 0.7, axis=-3, order=1, mode="wrap", backend="triton")
    assert T.LAUNCHES["chain"] == before and sum(T.FALLBACKS.values()) == fell, dict(T.FALLBACKS)
    assert np.array_equal(y.numpy(), ndi.gaussian_filter1d(xn, 0.7, axis=-3, order=1, mode="wrap"))
    y = chained(lambda: tf.sobel(x, -3, axes=ax, mode="nearest", backend="triton"))
    assert np.array_equal(y.numpy(), per_volume(lambda v: ndi.sobel(v, 0, mode="nearest")))
    # per-axis modes of a 2-D spec (a launch per axis)
    y = chained(lambda: tf.laplace(x, mode=("wrap", "reflect"), backend="triton"))
    assert np.array_equal(y.numpy(), ndi.laplace(xn, mode=("wrap", "reflect"), axes=(-2, -1)))
    # multi-stencil specs, and every backward, against the reference
    calls = [lambda t, b: tf.laplace(t, axes=ax, mode="constant", cval=1.5, backend=b),
             lambda t, b: tf.gaussian_laplace(t, 0.6, axes=ax, mode="wrap", backend=b),
             lambda t, b: tf.gaussian_gradient_magnitude(t, 0.6, axes=ax, mode=("nearest", "mirror", "reflect"), backend=b),
             lambda t, b: tf.gradient(t, axes=ax, mode="reflect", backend=b),
             lambda t, b: tf.gradient_direction(t, mode=("wrap", "constant"), backend=b),
             lambda t, b: tf.gaussian_filter(t, (0.7, 0.5, 0.6), axes=(-1, -3, -2), mode="mirror", backend=b)]
    for i, call in enumerate(calls):
        xr = x.clone().requires_grad_()
        before, fell = T.LAUNCHES["chain_bwd"], sum(T.FALLBACKS.values())
        y = chained(lambda: call(xr, "triton"))
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(i), dtype=y.dtype)
        (g,) = torch.autograd.grad((y * w).sum(), xr)
        assert T.LAUNCHES["chain_bwd"] > before and sum(T.FALLBACKS.values()) == fell, (i, dict(T.FALLBACKS))
        xq = x.clone().requires_grad_()
        yr = call(xq, "reference")
        (gr,) = torch.autograd.grad((yr * w).sum(), xq)
        close(y.detach(), yr.detach(), 1e-13, f"chain forward {i}", angles=i == 4)
        close(g, gr, 1e-12, f"chain backward {i}")
    # dtypes, layouts, out=, empty
    xf = x.float()
    for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        y = chained(lambda: tf.gaussian_filter(xf.to(dt), 0.8, axes=ax, backend="triton"))
        close(y, tf.gaussian_filter(xf.to(dt), 0.8, axes=ax, backend="reference"), tol, str(dt))
    x5 = rand(2, 3, 4, 5, 6, seed=5).float()
    cl = x5.to(memory_format=torch.channels_last_3d)
    y = chained(lambda: tf.uniform_filter(cl, 3, axes=ax, mode="wrap", backend="triton"))
    close(y, tf.uniform_filter(x5, 3, axes=ax, mode="wrap", backend="reference"), 1e-6, "channels_last_3d")
    out = torch.full((2, 3, 6, 5, 4), float("nan")).transpose(-1, -3)  # H and W do not collapse
    assert tf.gaussian_filter(x5, 0.6, axes=ax, out=out, backend="triton") is out
    close(out, tf.gaussian_filter(x5, 0.6, axes=ax, backend="reference"), 1e-6, "strided out")
    assert tf.gaussian_filter(torch.empty(0, 3, 4, 5), 1.0, axes=ax, backend="triton").shape == (0, 3, 4, 5)
    # selective blur of volumes: the reference's selection and blend around chained blurs
    mask = rand(5, 6, 7, seed=9) > 0
    blurs = [lambda t, b: tf.selective_blur(t, 0.2, sigma=0.6, axes=ax, mode="constant", cval=2.0, backend=b),
             lambda t, b: tf.selective_blur(t, mask=mask, axes=ax, normalized=True, mode="wrap", backend=b),
             lambda t, b: tf.selective_blur(t, -0.1, axes=ax, keep_border=True, mode=("reflect", "nearest", "mirror"),
                                            backend=b)]
    for i, call in enumerate(blurs):
        xr = x.clone().requires_grad_()
        y = chained(lambda: call(xr, "triton"))
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(i), dtype=y.dtype)
        (g,) = torch.autograd.grad((y * w).sum(), xr)
        xq = x.clone().requires_grad_()
        yr = call(xq, "reference")
        (gr,) = torch.autograd.grad((yr * w).sum(), xq)
        close(y.detach(), yr.detach(), 1e-13, f"chained blur {i}")
        close(g, gr, 1e-12, f"chained blur backward {i}")
    # dense stencils of three axes: the sum over the first axis's taps of 2-D launches (and of
    # 1-D ones where the other axes' modes differ), forward and backward
    k3 = (torch.arange(27.0).reshape(3, 3, 3) - 13).tolist()
    k3[0][1][2] = 0.0
    for i, (mode, origin) in enumerate([("reflect", 0), ("constant", (1, 0, -1)), (("wrap", "mirror", "nearest"), 0)]):
        call = lambda t, b: tf.correlate(t, k3, axes=ax, mode=mode, cval=0.5, origin=origin, backend=b)  # noqa: E731
        xr = x.clone().requires_grad_()
        before = T.LAUNCHES["chain_bwd"]
        y = chained(lambda: call(xr, "triton"))
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(i), dtype=y.dtype)
        (g,) = torch.autograd.grad((y * w).sum(), xr)
        assert T.LAUNCHES["chain_bwd"] > before
        if isinstance(mode, str):
            want = per_volume(lambda v: ndi.correlate(v, np.asarray(k3), mode=mode, cval=0.5, origin=origin))
            assert np.abs(y.detach().numpy() - want).max() < 1e-12 * np.abs(want).max(), mode
        xq = x.clone().requires_grad_()
        yr = call(xq, "reference")
        (gr,) = torch.autograd.grad((yr * w).sum(), xq)
        close(y.detach(), yr.detach(), 1e-13, f"dense chain {mode}")
        close(g, gr, 1e-12, f"dense chain backward {mode}")
    y = chained(lambda: tf.selective_blur(x, 0.2, weights=k3, axes=ax, backend="triton"))
    close(y, tf.selective_blur(x, 0.2, weights=k3, axes=ax, backend="reference"), 1e-13, "dense selective blur")
    with launched(T, 1, 0):  # one axis: a plane of one row, on the Triton kernels
        y = tf.uniform_filter1d(x, 3, -1, mode="wrap", backend="triton")
    close(y, tf.uniform_filter1d(x, 3, -1, mode="wrap", backend="reference"), 1e-12, "one axis")


def test_outputs_whose_batch_dims_do_not_collapse(T):
    """An ``out=`` whose leading dims do not collapse to one plane index (``channels_last_3d``,
    permuted batch dims) is written through a temporary, by the plane entry points (2-D specs on
    5-D tensors) and by the chains (3-D specs): before, the kernel wrote a contiguous copy of it
    and the caller's tensor stayed unwritten."""
    x = rand(2, 3, 4, 5, 6, seed=7)
    calls = [lambda b, o: tf.gaussian_filter(x, 0.7, out=o, backend=b),
             lambda b, o: tf.gaussian_filter(x, 0.7, axes=(-3, -2, -1), out=o, backend=b),
             lambda b, o: tf.uniform_filter(x, 3, axes=(-3, -2, -1), out=o, backend=b),
             lambda b, o: tf.selective_blur(x, 0.0, sigma=0.7, out=o, backend=b),
             lambda b, o: tf.laplace(x, out=o, backend=b)]
    for i, call in enumerate(calls):
        for out in (torch.full_like(x, float("nan")).to(memory_format=torch.channels_last_3d),
                    torch.full((4, 3, 2, 5, 6), float("nan"), dtype=x.dtype).permute(2, 1, 0, 3, 4)):
            assert call("triton", out) is out
            close(out, call("reference", None), 1e-12, f"call {i}")
    spec = FilterSpec("reflect", 0.0, "stack", (_spec.sep((-1, -1, (1.0, 2.0, 1.0))),))
    g = rand(2, 3, 4, 5, 6, seed=8)
    out = torch.full_like(x, float("nan")).to(memory_format=torch.channels_last_3d)
    assert T.filter_backward(g, x, spec, out) is out
    close(out, backends.get("reference").filter_backward(g, x, spec), 1e-12, "backward")


def test_bands_need_no_gather_where_triton_cannot_compile_it(T, monkeypatch):
    """Triton 3.6-3.8 abort compiling the general backward's gather of border bands of several
    rows (``footprint._expand``); there (``GATHER_BANDS`` false) the plans place bands one row
    and column a step, without a gather, and the backward still runs on the kernel with the
    reference's values."""
    x = rand(1, 2, 12, 13, seed=3)
    w = rand(5, 4, seed=4)
    gy = rand(1, 2, 12, 13, seed=5)

    def grad(backend):
        xx = x.clone().requires_grad_(True)
        y = tf.correlate(xx, w, origin=(1, -1), mode="reflect", backend=backend)
        return torch.autograd.grad(y, xx, gy)[0]

    want = grad("reference")
    bands = {}
    for gather in (True, False):
        monkeypatch.setattr(T, "GATHER_BANDS", gather)
        launched, fell = T.LAUNCHES["bwd"], sum(T.FALLBACKS.values())
        got = grad("triton")
        assert (T.LAUNCHES["bwd"] - launched, sum(T.FALLBACKS.values()) - fell) == (1, 0)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        bands[gather] = [(p.BBY, p.BBX) for k, p in T._PLANS.items() if k[-1] is gather and k[2:4] == (12, 13)]
    assert any(max(b) > 1 for b in bands[True]), bands  # (the case has bands of several rows)
    assert bands[False] and all(b == (1, 1) for b in bands[False]), bands


def test_too_old_triton_is_a_clear_unavailable_engine():
    """A Triton older than the kernels need (3.6: 3.5's compiler aborts on several) leaves the
    engine unavailable with a message naming both versions, not an AttributeError in a call."""
    import subprocess

    code = (
        "import triton; triton.__version__ = '3.4.0'\n"
        "import torch, torchfilters as tf\n"
        "from torchfilters import backends\n"
        "assert backends.get('triton') is None\n"
        "try:\n"
        "    tf.gradient_magnitude(torch.rand(1, 1, 8, 8), backend='triton')\n"
        "except backends.BackendUnavailableError as e:\n"
        "    print(e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "needs triton >= 3.6; found 3.4.0); upgrade it (pip install 'triton>=3.6')" in res.stdout


# (canny's non-maximum suppression divides |gi| by |gj| in numpy here: 0 / 0 where both are 0, a lane of zero
# magnitude, never an edge; as in test_canny)
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
def test_index_arithmetic_passes_the_overflow_sanitizer(T, monkeypatch):
    """The suite runs Triton's interpreter without its int32 overflow sanitizer (inert without
    ``debug``, half its time: ``conftest._lean_interpreter``); here each kernel family launches
    with it and ``debug`` on, forward and backward -- and a kernel whose int32 sum overflows is
    caught."""
    import dataclasses

    import triton
    import triton.language as tl
    from triton.runtime import interpreter as interp

    b = interp.interpreter_builder
    monkeypatch.setattr(b, "options", dataclasses.replace(b.options, sanitize_overflow=True, debug=True))

    @triton.jit
    def past_int32(p, n):
        tl.store(p, tl.program_id(0) + n)  # (int32 + int32)

    out = torch.zeros(1, dtype=torch.int32)
    past_int32[(1,)](out, 2**31 - 1)  # program 0: in range
    from triton.runtime.errors import InterpreterError

    with pytest.raises(InterpreterError, match="int32 overflow"):
        past_int32[(2,)](out, 2**31 - 1)

    x = rand(2, 9, 11, seed=3, dtype=torch.float32).requires_grad_(True)
    v = rand(1, 4, 5, 6, seed=4, dtype=torch.float32).requires_grad_(True)
    ops = [
        (x, lambda t: tf.gradient_magnitude(t, operator="sobel", mode="wrap", backend="triton")),
        (x, lambda t: tf.gaussian_filter(t, 1.2, mode="reflect", backend="triton")),
        (x, lambda t: tf.correlate(t, [[1.0, -2.0, 0.5], [0.25, 3.0, 1.0]], mode="constant", cval=0.5,
                                   backend="triton")),
        (x, lambda t: tf.selective_blur(t, 0.4, sigma=1.0, backend="triton")),
        (x, lambda t: tf.median_filter(t, 3, mode="mirror", backend="triton")),
        (v, lambda t: tf.gradient_magnitude(t, operator="sobel", axes=(-3, -2, -1), backend="triton")),
    ]
    for t, f in ops:
        y = f(t)
        (g,) = torch.autograd.grad(y, t, torch.ones_like(y))
        assert torch.isfinite(y).all() and torch.isfinite(g).all()
    assert tf.canny(x.detach(), backend="triton").dtype == torch.bool
