"""The row-streaming Triton kernel (backends/triton/rows.py), run through Triton's interpreter.

Oracle: the reference engine (itself tested against SciPy).  Every test asserts which kernel
ran (``T.LAUNCHES["rows"]`` for this one, ``"fwd"`` for the general footprint kernel where a
case must fall back to it) and that nothing fell back to the reference, then the values:
float64 exactly where the kernel keeps SciPy's summation order (stacked / single / blended
stencils), within 1e-12 elsewhere (the magnitude's sqrt, atan2, and vertical-first stencils of
horizontal reach > 2 in float32, whose passes ``rows._stencil_const`` swaps).

Covered: every op the kernel takes in every mode (``constant`` with a non-zero cval) on odd and
tiny planes (1xN, Nx1, 1x1, H=2, heights cut into strips, vector widths 1/2/4/8), packed planes
with a partial last group of strips, expanded / sliced leading dimensions, radii past the image,
NaN / inf / signed zeros, bfloat16 / float16 rounding (bit-identical to torch's rounding of the
float32 result, ties and overflow included), the magnitude's overflow / underflow rescue,
layouts that must fall back, ``out=`` (stacked gradient included), selective blur with
thresholds, masks and kept borders, empty tensors.

``make test`` runs the core cases and a few sampled ones; ``make test-full`` every case.
"""

from __future__ import annotations

import contextlib
import functools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf

pytest.importorskip("triton")

from conftest import (ALLOCATING, BASE_MODES, AtenLog, cases, examples, interpreted_triton,  # noqa: E402
                      pattern_mask, rand)

pytestmark = pytest.mark.triton

CVAL = 0.7
INF, NAN = float("inf"), float("nan")


@pytest.fixture(scope="module")
def T():
    """The Triton engine with interpreted kernels, installed as backend "triton"."""
    with interpreted_triton() as mod:
        yield mod


@pytest.fixture
def plans(T, monkeypatch):
    """The launch plans of the rows kernel in the test: ``(plan, NP)`` per launch."""
    got = []
    launch = T._rows.launch

    def spy(kp, x, mask, out, NP, *args, **kw):
        got.append((kp, NP))
        return launch(kp, x, mask, out, NP, *args, **kw)

    monkeypatch.setattr(T._rows, "launch", spy)
    return got


@contextlib.contextmanager
def ran(T, kernel="rows", n=1):
    """Assert that the block launched ``kernel`` (``"rows"``: only that forward kernel;
    ``"fwd"``: the general one and not the rows one; None: nothing) ``n`` times, and fell back
    to the reference nowhere."""
    before = dict(T.LAUNCHES)
    fell = sum(T.FALLBACKS.values())
    yield
    d = {k: T.LAUNCHES[k] - before.get(k, 0) for k in ("rows", "fwd", "bwd")}
    want = {"rows": 0, "fwd": 0, "bwd": 0}
    if kernel is not None:
        want[kernel] = n
    assert d == want, f"launches {d}, expected {want}"
    assert sum(T.FALLBACKS.values()) == fell, f"fell back to the reference: {dict(T.FALLBACKS)}"


def check(a, b, tol, what="", angles=False):
    """``a`` equals ``b`` (``tol == 0``: exactly, signed zeros included) or within
    ``tol * max(1, max|b|)``; NaN exactly where ``b`` has NaN, infinities equal."""
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN positions differ"
    fin = b.isfinite()
    assert torch.equal(a[~fin & ~b.isnan()], b[~fin & ~b.isnan()]), f"{what}: infinities differ"
    a, b = a[fin].double(), b[fin].double()
    if angles:  # atan2 of a signed zero: +-pi are the same angle
        d = ((a - b + math.pi) % (2 * math.pi) - math.pi).abs()
        assert not bool((d > max(tol, 1e-300) * math.pi).any()), f"{what}: max angle error {float(d.max()):.3g}"
        return
    if tol == 0:
        assert torch.equal(a, b), f"{what}: {int((a != b).sum())} differ, max {float((a - b).abs().max()):.3g}"
        zero = b == 0
        assert torch.equal(a[zero].signbit(), b[zero].signbit()), f"{what}: signs of zeros differ"
        return
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = (a - b).abs()
    assert not bool((err > tol * scale).any()), f"{what}: max err {float(err.max()):.3g} (tol {tol * scale:.3g})"


# ------------------------------------------------------------------ op table
#
# name -> (op, float64 tolerance: 0 is exact; "angles" for directions).  Every op, operator and
# epilogue the kernel takes: stacked pairs, magnitude, direction, single passes along either
# axis, horizontal-first and vertical-first separable pairs (the latter of horizontal reach <= 2
# kept in order, > 2 swapped), the selective-blur blend with threshold, sigma, mask, kept border.

K5 = (0.5, -1.0, 2.0, 0.25, 1.0)
K4 = (1.0, -2.0, 0.5, 3.0)

OPS = {
    "gradient-central": (lambda x, **k: tf.gradient(x, **k), 0),
    "gradient-sobel": (lambda x, **k: tf.gradient(x, operator="sobel", **k), 0),
    "gradient-scharr-normalized": (lambda x, **k: tf.gradient(x, operator="scharr", normalized=True, **k), 0),
    "gradient_magnitude-central": (lambda x, **k: tf.gradient_magnitude(x, **k), 1e-12),
    "gradient_magnitude-prewitt": (lambda x, **k: tf.gradient_magnitude(x, operator="prewitt", **k), 1e-12),
    "gradient_magnitude-scharr": (lambda x, **k: tf.gradient_magnitude(x, operator="scharr", **k), 1e-12),
    "gradient_direction-central": (lambda x, **k: tf.gradient_direction(x, **k), "angles"),
    "gradient_direction-sobel": (lambda x, **k: tf.gradient_direction(x, operator="sobel", **k), "angles"),
    "gradient_direction-scharr": (lambda x, **k: tf.gradient_direction(x, operator="scharr", **k), "angles"),
    "sobel-y": (lambda x, **k: tf.sobel(x, -2, **k), 0),
    "prewitt-x": (lambda x, **k: tf.prewitt(x, -1, **k), 0),
    "derivative-central-y": (lambda x, **k: tf.derivative(x, -2, **k), 0),
    "gaussian_filter": (lambda x, **k: tf.gaussian_filter(x, 0.45, **k), 0),
    "gaussian_filter-order": (lambda x, **k: tf.gaussian_filter(x, 0.5, order=(1, 2), **k), 0),
    "gaussian_gradient_magnitude": (lambda x, **k: tf.gaussian_gradient_magnitude(x, 0.45, **k), 1e-12),
    "gaussian_filter1d-y": (lambda x, **k: tf.gaussian_filter1d(x, 0.9, -2, order=1, **k), 0),
    "correlate1d-x": (lambda x, **k: tf.correlate1d(x, K5, -1, origin=-1, **k), 0),
    "convolve1d-y": (lambda x, **k: tf.convolve1d(x, K4, -2, **k), 0),
    "uniform_filter": (lambda x, **k: tf.uniform_filter(x, (2, 3), origin=(0, 1), **k), 0),
    "selective_blur": (lambda x, **k: tf.selective_blur(x, 0.1, **k), 0),
    "selective_blur-sigma-keep_border": (
        lambda x, **k: tf.selective_blur(x, -0.2, sigma=(0.5, 0.45), keep_border=True, **k), 0),
    "selective_blur-mask": (lambda x, **k: tf.selective_blur(x, mask=pattern_mask(*x.shape[-2:]), **k), 0),
    # vertical first, horizontal reach 3: swapped passes (float32, ~1 ulp); float64 and constant mode: the general kernel
    "gaussian_filter-wide-x": (lambda x, **k: tf.gaussian_filter(x, (0.45, 0.8), **k), 1e-12),
}
#: the only op x mode pairs the rows kernel leaves to the general one (float32, 16-bit)
GENERAL = {("gaussian_filter-wide-x", "constant")}
#: ... and in float64, which keeps SciPy's order of passes (and so its bits)
GENERAL_F64 = {("gaussian_filter-wide-x", m) for m in BASE_MODES}


def kernel_of(name, mode, dtype=torch.float64):
    """The kernel that runs ``name`` in ``mode``: "rows", or "fwd" (the general one)."""
    general = GENERAL_F64 if dtype == torch.float64 else GENERAL
    return "fwd" if (name, mode) in general else "rows"
#: 1xN, Nx1, 1x1, H=2, a height cut into two strips (28 = 2 x 14) and into three (33 = 3 x 11),
#: widths 4 and 8 (the widest float64 vector), odd widths (vector width 1), several planes
SHAPES = ((1, 12), (7, 1), (1, 1), (2, 9), (28, 5), (2, 33, 4), (2, 3, 6, 8), (3, 2, 7))


def run(name, x, engine, mode="reflect", **kw):
    return OPS[name][0](x, mode=mode, cval=CVAL, backend=engine, **kw)


def tol_of(name, default=None):
    t = OPS[name][1]
    if t == "angles":
        return 1e-12 if default is None else default, True
    return (t if default is None else (0 if t == 0 else default)), False


def check_op(T, name, x, mode, kernel="rows", tol=None):
    with ran(T, kernel):
        y = run(name, x, "triton", mode)
    yr = run(name, x, "reference", mode)
    t, angles = tol_of(name, tol)
    check(y, yr, t, f"{name} {mode} {tuple(x.shape)}", angles=angles)
    return y


def check_f32(T, name, x, mode, kernel="rows"):
    """As :func:`check_op`, within 2e-6 for every op: float32 passes add each term by a fused
    multiply-add (one rounding per term), the reference rounds each product first."""
    with ran(T, kernel):
        y = run(name, x, "triton", mode)
    check(y, run(name, x, "reference", mode), 2e-6, f"{name} {mode} {tuple(x.shape)}", angles=tol_of(name)[1])
    return y


GRID = [(n, m, s) for n in OPS for m in BASE_MODES for s in SHAPES]
#: every op in every mode, the shapes in turn
CORE = [(n, m, SHAPES[(i * 3 + j) % len(SHAPES)]) for i, n in enumerate(OPS) for j, m in enumerate(BASE_MODES)]


@cases("name, mode, shape", GRID, CORE)
def test_every_op_every_mode_float64(T, name, mode, shape):
    x = rand(*shape, seed=len(name) + BASE_MODES.index(mode))
    check_op(T, name, x, mode, kernel_of(name, mode))


@examples(4)
@given(name=st.sampled_from(list(OPS)), mode=st.sampled_from(BASE_MODES),
       shape=st.tuples(st.integers(1, 2), st.integers(1, 20), st.integers(1, 17)), seed=st.integers(0, 99))
def test_every_op_every_mode_float64_sampled(T, name, mode, shape, seed):
    check_op(T, name, rand(*shape, seed=seed), mode, kernel_of(name, mode))


#: float32: vector widths 4 (widths 8, 12, 16) and 1; every op once, the modes in turn
F32_SHAPES = ((2, 5, 8), (1, 12), (3, 9, 16), (2, 6, 7))


# masked-off lanes hold whatever memory was there, and the interpreter computes every lane: its
# numpy overflow warnings there (in a multiply or, now and then, an add) are not the kernel's
@pytest.mark.filterwarnings("ignore:overflow encountered in:RuntimeWarning")
@cases("name", list(OPS), list(OPS))
def test_every_op_float32_vectors(T, plans, name):
    i = list(OPS).index(name)
    mode = BASE_MODES[i % 5]
    shape = F32_SHAPES[i % len(F32_SHAPES)]
    x = rand(*shape, seed=i, dtype=torch.float32)
    # (float32 passes add each term by a fused multiply-add: within rounding of the reference,
    # whose products are rounded; float64 keeps SciPy's bits, tested exactly above)
    y = check_f32(T, name, x, mode, kernel_of(name, mode, torch.float32))
    if plans:
        assert plans[0][0].ce["VEC"] == (1 if shape[-1] % 2 else 4)
    assert y.dtype == torch.float32


def test_rows_and_general_kernels_agree(T):
    """The same ops with the rows kernel turned off (``T.ROWS = False``): the general kernel."""
    x = rand(2, 9, 10, seed=4)
    for k, name in enumerate(("gradient-sobel", "gradient_magnitude-prewitt", "gaussian_filter-order",
                              "selective_blur-sigma-keep_border")):
        mode = BASE_MODES[k + 1]
        with ran(T, "rows"):
            y = run(name, x, "triton", mode)
        T.ROWS = False
        try:
            with ran(T, "fwd"):
                yg = run(name, x, "triton", mode)
        finally:
            T.ROWS = True
        check(y, yg, 1e-12, name, angles=False)


# ------------------------------------------------------------ strips, planes


def test_packed_planes_partial_last_group(T, plans):
    """Several small planes per program: the number of strips not a multiple of ``BP``, one
    program (5 strips in 8 slots) and several (the last one partly empty)."""
    got = []
    for shape, mode, name in (((5, 6, 8), "reflect", "gradient-sobel"),
                              ((5, 6, 64), "wrap", "gradient_magnitude-central"),
                              ((3, 33, 64), "constant", "selective_blur"),
                              ((5, 6, 8), "mirror", "gaussian_filter")):
        plans.clear()
        x = rand(*shape, seed=shape[-1])
        check_op(T, name, x, mode)
        got += plans
        (kp, NP), = plans
        assert NP == math.prod(shape[:-2])
        H = shape[-2]
        assert kp.BH <= T._rows._MAX_BH and H <= kp.BH * kp.n_strips < H + kp.n_strips
        if NP == 5:  # 5 planes of 6 rows: 5 strips, BP a power of two >= 4
            assert kp.n_strips == 1 and 5 % kp.BP != 0, kp
    # one program holding all five planes (in 8 slots); several programs, the last one partial
    assert got[0][0].BP > 5 and got[0][0].n_tq == 1
    assert 1 < got[1][0].BP < 5
    # float32 planes of 6 x 8: two chunks of four, 8 strips per program
    plans.clear()
    check_op(T, "gradient_direction-sobel", rand(5, 6, 8, seed=1, dtype=torch.float32), "nearest", tol=2e-6)
    assert plans[0][0].ce["VEC"] == 4


def test_rows_wider_than_one_tile_are_cut_evenly(T, plans):
    """Rows of more than 32 chunks are cut into the fewest tiles of at most 32 chunks, evenly
    (48 chunks: two of 24, not 32 and 16), the last chunk of a row partial; the values do not
    depend on the cut."""
    for W, mode, tiles in ((96, "reflect", (2, 24)), (66, "wrap", (2, 17)), (65, "constant", (3, 22))):
        plans.clear()  # (float64: vectors of 2, or 1 on odd rows)
        check_op(T, "gaussian_filter", rand(2, 3, W, seed=W), mode)
        kp = plans[0][0]
        assert (kp.n_tq, kp.NQ) == tiles and kp.ce["NC"] == tiles[1], kp


def test_strips_of_a_tall_plane(T, plans, monkeypatch):
    """Planes of up to ``rows._MAX_BH`` rows are one strip; taller ones are cut into strips of
    equal height (the last one shorter), at most ``rows.strip_rows(H)`` rows; the vertical halo
    crosses strip boundaries.  (The limits are shrunk here so that small planes have strips.)"""
    monkeypatch.setattr(T._rows, "_MAX_BH", 16)
    monkeypatch.setattr(T._rows, "_MAX_BH_TALL", 8)
    T._rows._CACHE.clear()
    for H, mode in ((28, "reflect"), (33, "constant"), (17, "mirror"), (40, "wrap"), (70, "nearest"), (9, "wrap")):
        for name in ("gaussian_filter1d-y", "gradient-sobel"):
            plans.clear()
            x = rand(2, H, 6, seed=H)
            check_op(T, name, x, mode)
            kp = plans[0][0]
            n = -(-H // T._rows.strip_rows(H, 4 if name == "gaussian_filter1d-y" else 1))
            assert kp.n_strips == n and kp.BH == -(-H // n), kp
            assert (n > 1) == (H > 16)
    T._rows._CACHE.clear()


def test_broadcast_and_sliced_leading_dims(T):
    base = rand(2, 4, 6, 8, seed=1)
    layouts = {
        "expanded (stride 0)": (rand(1, 6, 8, seed=2).expand(4, 6, 8), "rows"),
        "expanded middle dim": (rand(2, 1, 6, 8, seed=3).expand(2, 3, 6, 8), "rows"),
        "sliced batch": (base[:, ::2], "rows"),
        "sliced batch, offset": (base[1:, 1::2], "rows"),
        "three leading strides": (rand(3, 3, 3, 6, 8, seed=1)[::2, ::2, ::2], "fwd"),  # copied, general kernel
    }
    for k, (what, (x, kernel)) in enumerate(layouts.items()):
        for name in ("gradient-sobel", "gradient_magnitude-scharr", "selective_blur")[k % 3:][:2]:
            mode = BASE_MODES[k]
            with ran(T, kernel):
                y = run(name, x, "triton", mode)
            tol = tol_of(name)[0] if kernel == "rows" else 1e-12
            check(y, run(name, x.contiguous(), "reference", mode), tol, f"{what} {name}")


# ------------------------------------------------------------ radius vs image


def test_radius_past_the_image(T, plans):
    """Passes reaching past the image (several folds per row / column), up to the kernel's
    largest reach (8); reach 9 is the general kernel's.  Vertical-first Gaussians of reach > 2
    along x run on the general kernel in float64 (SciPy's order of passes) and in constant
    mode, swapped elsewhere (within rounding)."""
    x = rand(2, 8, seed=1)
    for mode in BASE_MODES:
        kernel = "fwd"
        with ran(T, kernel):
            y = tf.gaussian_filter(x, 1.0, radius=3, mode=mode, cval=CVAL, backend="triton")
        check(y, tf.gaussian_filter(x, 1.0, radius=3, mode=mode, cval=CVAL, backend="reference"), 1e-12, mode)
        for shape, radius, kernel in (((2, 3), 8, "rows"), ((1, 1), 8, "rows"), ((3, 2), 9, "fwd")):
            x2 = rand(*shape, seed=radius)
            w = rand(2 * radius + 1, seed=3).tolist()
            for op, args in ((tf.gaussian_filter1d, (1.0, -2)), (tf.correlate1d, (w, -1))):
                kw = {"radius": radius} if op is tf.gaussian_filter1d else {}
                with ran(T, kernel):
                    y = op(x2, *args, mode=mode, cval=CVAL, backend="triton", **kw)
                yr = op(x2, *args, mode=mode, cval=CVAL, backend="reference", **kw)
                check(y, yr, 0 if kernel == "rows" else 1e-12, f"{op.__name__} {mode} {shape} radius {radius}")
    # horizontal first (no swap): exact, in every mode, on a 2 x 8 image
    for mode in BASE_MODES:
        with ran(T):
            y = tf.sobel(x, -1, mode=mode, cval=CVAL, backend="triton")
        check(y, tf.sobel(x, -1, mode=mode, cval=CVAL, backend="reference"), 0, mode)


# ------------------------------------------------------------ NaN, inf, zeros


def _special(shape, seed):
    x = rand(*shape, seed=seed)
    x[..., 2, 3] = NAN
    x[..., 0, 6] = INF
    x[..., 4, 0] = -INF
    x[..., 5, 5] = NAN
    return x


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (numpy, in the interpreter: inf - inf)
@pytest.mark.parametrize("name", list(OPS))
def test_nan_and_inf_inputs(T, name):
    """NaN reaches exactly the outputs the reference's NaN reaches (inf - inf too), infinities
    land where the reference's do."""
    i = list(OPS).index(name)
    mode = BASE_MODES[i % 5]
    x = _special((1, 7, 9), seed=i)
    kernel = kernel_of(name, mode, x.dtype)
    with ran(T, kernel):
        y = run(name, x, "triton", mode)
    yr = run(name, x, "reference", mode)
    assert yr.isnan().any() and y.isnan().any()
    t, angles = tol_of(name)
    if not angles:
        torch.testing.assert_close(y, yr, rtol=t, atol=t, equal_nan=True)
    check(y, yr, t, name, angles=angles)


def test_signed_zeros_float64(T):
    """Zero outputs carry the reference's sign (-0.0 inputs, -0.0 cval, zero products)."""
    z = torch.tensor([0.0, -0.0, -0.0, -0.0, 0.0, 1.0, -0.0, -0.0], dtype=torch.float64).repeat(3, 1)
    z[1] = -0.0
    z[2, ::2] = 0.0
    names = ("gradient-central", "gradient-sobel", "correlate1d-x", "convolve1d-y", "gaussian_filter",
             "gaussian_filter-order", "selective_blur", "gradient_magnitude-central", "sobel-y")
    for k, name in enumerate(names):
        for mode in (BASE_MODES[k % 5], "constant"):
            with ran(T):
                y = OPS[name][0](z, mode=mode, cval=-0.0, backend="triton")
            yr = OPS[name][0](z, mode=mode, cval=-0.0, backend="reference")
            check(y, yr, 1e-12 if OPS[name][1] else 0, f"{name} {mode}")
            zero = yr == 0
            assert torch.equal(y[zero].signbit(), yr[zero].signbit()), f"{name} {mode}: signs of zeros"
    # (the inputs do make negative zeros)
    assert OPS["gradient-central"][0](z, backend="reference").signbit().any()


# ------------------------------------------------------------ low precision


def _bits_equal(y, want, what=""):
    """Bit-identical, except that NaN payloads may differ (torch writes 0xFFFF, the kernel a
    quiet NaN): NaN exactly where ``want`` has NaN."""
    assert y.dtype == want.dtype and y.shape == want.shape
    assert torch.equal(y.isnan(), want.isnan()), f"{what}: NaN positions differ"
    keep = ~want.isnan()
    a, b = y.view(torch.int16)[keep], want.view(torch.int16)[keep]
    assert torch.equal(a, b), f"{what}: {int((a != b).sum())}/{a.numel()} differ in bits"


LOW = (torch.bfloat16, torch.float16)


def _tie_inputs(dtype, shape, seed):
    """Values of one binade whose sums with 2**-(mantissa bits + 1) of a neighbour sit exactly
    half-way between two ``dtype`` numbers (in float32: low 16 bits 0x8000 for bfloat16)."""
    m = 7 if dtype == torch.bfloat16 else 10
    u = 2.0**-m
    vals = torch.tensor([1.0, 1.0 + u, 1.0 + 2 * u, 1.0 + 3 * u, 1.5, -1.0, -(1.0 + u), 2.0, -2.0 - 4 * u])
    g = torch.Generator().manual_seed(seed)
    return vals[torch.randint(0, len(vals), shape, generator=g)].to(dtype), (1.0, 2.0 ** -(m + 1))


def _corr(t, b, w, mode):
    return tf.correlate1d(t, w, -1, mode=mode, cval=1.0, backend=b)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_ties_round_to_nearest_even(T, plans, dtype):
    """``x + y / 2**(m+1)``: exact in float32, about a third of the outputs on ties; the kernel's
    rounding must equal torch's float32 -> dtype rounding bit for bit (truncation would not)."""
    for k, mode in enumerate(("reflect", "constant", "wrap")):
        x, w = _tie_inputs(dtype, (2, 5, 16), seed=k)
        f = functools.partial(_corr, w=w, mode=mode)
        plans.clear()
        with ran(T):
            y = f(x, "triton")
        assert plans[0][0].ce["VEC"] == 8
        with ran(T):
            y32 = f(x.float(), "triton")
        assert y32.dtype == torch.float32
        if dtype == torch.bfloat16:
            low = y32.view(torch.int32) & 0xFFFF
            assert int((low == 0x8000).sum()) > 20  # ties, both rounding up and down
            assert not torch.equal(y.view(torch.int16), (y32.view(torch.int32) >> 16).to(torch.int16))
        else:
            low = y32.view(torch.int32) & 0x1FFF
            assert int((low == 0x1000).sum()) > 20
        _bits_equal(y, y32.to(dtype), f"{dtype} {mode}")
        check(y32, f(x.float(), "reference"), 0, "float32 vs reference")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_specials_and_overflow(T, dtype):
    """NaN, +-inf, inf - inf, and finite float32 sums that round to inf (a tie at the largest
    finite value rounds to even: inf) or to the largest finite value."""
    fmax = torch.finfo(dtype).max
    m = 7 if dtype == torch.bfloat16 else 10
    e = math.frexp(fmax)[1] - 1  # fmax = (2 - 2**-m) * 2**e
    half_ulp = 2.0 ** (e - m - 1)
    row = [fmax, half_ulp * 2 ** (m + 1), NAN, -NAN, INF, -INF, 1.0, INF, -INF, fmax, fmax, -fmax, -fmax,
           1.0, 2.0, half_ulp * 2 ** m]
    x = torch.tensor([row, row[::-1]], dtype=dtype)
    assert torch.isfinite(x[:, :2]).all()
    for w in ((1.0, 2.0 ** -(m + 1)), (1.0, -1.0), (1.0, 1.0), (0.5, 0.25, 0.5)):
        for mode in ("reflect", "nearest"):
            with ran(T, n=2):
                y = tf.correlate1d(x, w, -1, mode=mode, backend="triton")
                y32 = tf.correlate1d(x.float(), w, -1, mode=mode, backend="triton")
            _bits_equal(y, y32.to(dtype), f"{w} {mode}")
    # the first output of the first weights: fmax + half an ulp, a tie, rounds to inf
    y32 = tf.correlate1d(x.float(), (1.0, 2.0 ** -(m + 1)), -1, backend="triton")
    y = tf.correlate1d(x, (1.0, 2.0 ** -(m + 1)), -1, backend="triton")
    assert torch.isfinite(y32).any() and (y.isinf() & y32.isfinite()).any()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_every_epilogue_bitwise(T, dtype):
    """Each epilogue (stack, magnitude with its rescue, direction, blend) on ``dtype`` input is
    the float32 computation rounded by torch."""
    x = rand(2, 7, 16, seed=3, dtype=dtype)
    x[0, 2, 5] = NAN
    x[1, 3, 3] = INF
    big = x.clone()  # bfloat16: squares overflow float32 (the rescue); float16: results overflow float16
    v = 1.0e37 if dtype == torch.bfloat16 else 6.0e4  # (bfloat16: the stencils stay finite)
    big[1] = torch.where(big[1] > 0, v, -v)
    for k, name in enumerate(("gradient-sobel", "gradient_magnitude-scharr", "gradient_direction-central",
                              "selective_blur-sigma-keep_border", "gaussian_filter-order",
                              "gaussian_gradient_magnitude", "selective_blur-mask")):
        mode = BASE_MODES[k % 5]
        for inp in (x, big):
            with ran(T, n=2):
                y = run(name, inp, "triton", mode)
                y32 = run(name, inp.float(), "triton", mode)
            _bits_equal(y, y32.to(dtype), f"{dtype} {name} {mode}")
            # and float32 compute is the reference's
            check(y32, run(name, inp.float(), "reference", mode), 2e-6, name, angles=OPS[name][1] == "angles")


# ------------------------------------------------------------ magnitude rescue


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_magnitude_overflow_and_underflow_rescue(T, dtype):
    """Sums of squares that overflow (rows alternating +-5e37 in float32, +-1e300 in float64:
    components stay finite, prewitt's 6 * 5e37 too)
    or underflow (1e-30 / 1e-160): the magnitude is rescaled like hypot, finite and not 0."""
    big, tiny, small = (5e37, 1e-30, 1e-17) if dtype == torch.float32 else (1e300, 1e-160, 1e-150)
    H, W = 6, 8
    sign = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(H // 2)[:, None].expand(H, W)
    cols = torch.tensor([1.0, -1.0, 1.0, 1.0], dtype=torch.float64).repeat(W // 4)
    for k, (what, x) in enumerate((
        ("rows alternating", (big * sign).to(dtype)),
        ("checkerboard", (big * sign * cols).to(dtype)),
        ("mixed", torch.where(torch.arange(W) < 4, big * sign, rand(H, W, seed=1)).to(dtype)),
        ("tiny", (tiny * sign * cols * rand(H, W, seed=2, low=0.5, high=1.5)).to(dtype)),
        # squares normal but small (float32 1e-34, float64 1e-300): no rescue needed, either way exact
        ("small", (small * sign * cols * rand(H, W, seed=3, low=0.5, high=1.5)).to(dtype)),
    )):
        for name, operator in (("gradient_magnitude-central", "central"), ("gradient_magnitude-prewitt", "prewitt"),
                               ("gaussian_gradient_magnitude", None)):
            mode = BASE_MODES[k]
            with ran(T):
                y = run(name, x, "triton", mode)
            yr = run(name, x, "reference", mode)
            g = None
            if operator is not None:  # the components, rounded in dtype
                g = tf.gradient(x, operator=operator, mode=mode, cval=CVAL, backend="reference").double()
            assert torch.isfinite(yr).all(), f"{what} {name} {mode}: the reference overflowed"
            check(y, yr, 1e-12 if dtype == torch.float64 else 2e-6, f"{what} {name} {mode}")
            assert torch.isfinite(y).all(), f"{what} {name}: overflowed"
            assert torch.equal(y == 0, yr == 0), f"{what} {name}: underflowed to 0"
            if g is not None:  # against the float64 hypot of the components (rounded in dtype)
                g2 = g.to(dtype) ** 2
                naive = g2[..., 0, :, :] + g2[..., 1, :, :]
                rescued = (naive == INF) | ((naive < torch.finfo(dtype).tiny) & (y != 0))
                assert bool(rescued.any()) == (what != "small"), what
                want = torch.hypot(g[..., 0, :, :], g[..., 1, :, :])
                check(y.double(), want, 4e-7 if dtype == torch.float32 else 1e-13, f"{what} {name} hypot")
            if what == "tiny":
                assert bool((y > 0).any())


# ------------------------------------------------------------------- layouts


def test_layouts(T, plans):
    """channels_last (rows of stride C: the general kernel; C = 1: the rows kernel), a transposed
    plane (strided rows: the general kernel), odd widths and offset views (vector width 1)."""
    base = rand(2, 3, 6, 8, seed=6, dtype=torch.float32)
    layouts = {
        "channels_last": (base.contiguous(memory_format=torch.channels_last), "fwd", None),
        "channels_last C=1": (base[:, :1].contiguous(memory_format=torch.channels_last), "rows", 4),
        "transposed": (base.transpose(-1, -2), "fwd", None),
        "odd width": (rand(2, 6, 7, seed=1, dtype=torch.float32), "rows", 1),
        "offset view": (rand(6, 12, seed=1, dtype=torch.float32)[:, 1:9], "rows", 4),
        "row stride 9": (rand(2, 6, 9, seed=2, dtype=torch.float32)[..., :8], "rows", 1),
        "row stride 10": (rand(2, 6, 10, seed=3, dtype=torch.float32)[..., :8], "rows", 2),
    }
    for k, (what, (x, kernel, vec)) in enumerate(layouts.items()):
        for name in ("gradient-sobel", "gradient_magnitude-central", "selective_blur", "gaussian_filter-order"):
            mode = BASE_MODES[k % 5]
            plans.clear()
            with ran(T, kernel):
                y = run(name, x, "triton", mode)
            check(y, run(name, x.contiguous(), "reference", mode), 2e-6, f"{what} {name}")
            if vec is not None:
                assert plans[0][0].ce["VEC"] == vec, what


def test_out(T, plans):
    x = rand(3, 6, 8, seed=2)
    # a stacked gradient: out (..., 2, H, W) contiguous, its components strided apart, rows strided
    outs = {
        "contiguous": (torch.empty(3, 2, 6, 8, dtype=torch.float64), "rows"),
        "component axis first": (torch.empty(2, 3, 6, 8, dtype=torch.float64).transpose(0, 1), "rows"),
        "row stride 9": (torch.empty(3, 2, 6, 9, dtype=torch.float64)[..., :8], "rows"),
        "transposed planes": (torch.empty(3, 2, 8, 6, dtype=torch.float64).transpose(-1, -2), "fwd"),
    }
    want = tf.gradient(x, operator="prewitt", mode="wrap", backend="reference")
    for what, (out, kernel) in outs.items():
        out.fill_(NAN)
        with ran(T, kernel):
            res = tf.gradient(x, operator="prewitt", mode="wrap", out=out, backend="triton")
        assert res is out
        check(out, want, 0, what)
    # single-output ops
    for name in ("gradient_magnitude-scharr", "selective_blur", "gaussian_filter1d-y", "gradient_direction-sobel"):
        out = torch.full((3, 6, 8), NAN, dtype=torch.float64)
        with ran(T):
            res = run(name, x, "triton", "mirror", out=out)
        assert res is out
        t, angles = tol_of(name)
        check(out, run(name, x, "reference", "mirror"), t, name, angles=angles)
    # bfloat16 out, float32 out in a wider buffer
    xb = x.to(torch.bfloat16)
    out = torch.empty(3, 2, 6, 8, dtype=torch.bfloat16)
    with ran(T):
        assert tf.gradient(xb, out=out, backend="triton") is out
    _bits_equal(out, tf.gradient(xb.float(), backend="triton").to(torch.bfloat16))


# ------------------------------------------------------------- selective blur


def test_selective_blur_threshold_mask_keep_border(T):
    x = rand(2, 3, 7, 8, seed=5)
    H, W = x.shape[-2:]
    masks = {
        "bool": rand(2, 3, H, W, seed=1) > 0,
        "broadcast (H, W)": pattern_mask(H, W),
        "broadcast over channels": rand(2, 1, H, W, seed=2) > 0,
        "expanded batch": (rand(1, 3, H, W, seed=3) > 0).expand(2, 3, H, W),
        "all false": torch.zeros(H, W, dtype=torch.bool),
    }
    calls = []
    for k, (what, m) in enumerate(masks.items()):
        calls.append((what, {"mask": m, "keep_border": k % 2 == 1, "sigma": (None, 0.5, (0.45, 0.6))[k % 3]}, "rows"))
    for thr in (-0.3, 0.0, 0.5, 2.0):
        calls.append((f"threshold {thr}", {"threshold": thr, "keep_border": thr > 0}, "rows"))
    calls.append(("threshold, sigma, keep_border", {"threshold": 0.2, "sigma": 0.4, "keep_border": True}, "rows"))
    calls.append(("transposed mask", {"mask": (rand(2, 3, W, H, seed=4) > 0).transpose(-1, -2)}, "fwd"))
    calls.append(("weights (dense)", {"threshold": 0.0, "weights": ((1.0, 2.0, 1.0), (2.0, 4.0, 2.0))}, "fwd"))
    calls.append(("normalized", {"threshold": 0.0, "normalized": True}, "fwd"))
    for k, (what, kw, kernel) in enumerate(calls):
        mode = BASE_MODES[k % 5]
        with ran(T, kernel):
            y = tf.selective_blur(x, mode=mode, cval=CVAL, backend="triton", **kw)
        yr = tf.selective_blur(x, mode=mode, cval=CVAL, backend="reference", **kw)
        check(y, yr, 0 if kernel == "rows" else 1e-12, f"{what} {mode}")
    # keep_border: the border pixels are x itself
    y = tf.selective_blur(x, -5.0, sigma=0.45, keep_border=True, backend="triton")
    assert torch.equal(y[..., :2, :], x[..., :2, :]) and torch.equal(y[..., :, -2:], x[..., :, -2:])
    assert not torch.equal(y[..., 2:-2, 2:-2], x[..., 2:-2, 2:-2])


# --------------------------------------------------------------------- empty


@pytest.mark.parametrize("shape", ((0, 3, 4), (2, 0, 5), (3, 4, 0), (0, 0)), ids=str)
def test_empty_tensors(T, shape):
    for name in OPS:
        x = torch.empty(shape, dtype=torch.float64)
        with ran(T, None):
            y = run(name, x, "triton")
        yr = run(name, x, "reference")
        assert y.shape == yr.shape and y.dtype == yr.dtype, name


# ------------------------------------------------------------ CUDA-graph safety


def test_launch_path_allocates_nothing_but_the_output(T, monkeypatch):
    """With ``out=``, the rows kernel's host path runs no allocating aten op (no table upload, no
    temporary): safe to capture in a CUDA graph.  The kernel itself is stubbed out (the
    interpreter copies tensors of its own)."""
    launches = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *a, **k: launches.append(grid)

    monkeypatch.setattr(T._rows, "_rows_kernel", Stub())
    logs = {}
    for name in ("filter_forward", "blur_forward"):
        orig = getattr(T, name)

        def logged(*a, _orig=orig, _name=name, **k):
            with AtenLog() as log:
                r = _orig(*a, **k)
            logs.setdefault(_name, []).append(log.ops)
            return r

        monkeypatch.setattr(T, name, logged)
    x = rand(2, 3, 8, 12, seed=1, dtype=torch.float32)
    y = torch.empty_like(x)
    g = torch.empty(2, 3, 2, 8, 12)
    for _ in range(2):  # (the second call: nothing cached on the first)
        tf.gradient_magnitude(x, out=y, backend="triton")
        tf.gradient(x, operator="sobel", out=g, backend="triton")
        tf.gaussian_filter(x, 1.5, out=y, backend="triton")
        tf.selective_blur(x, 0.25, out=y, backend="triton")
    assert len(launches) == 8 and set(logs) == {"filter_forward", "blur_forward"}
    for name, runs in logs.items():
        for ops in runs[len(runs) // 2:]:
            bad = [op for op in ops if op.startswith(ALLOCATING)]
            assert not bad, f"{name}: {bad}"
