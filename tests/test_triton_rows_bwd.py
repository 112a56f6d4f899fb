"""The fused row-streaming backward (backends/triton/rows_bwd.py), run through Triton's interpreter.

Oracle: the reference engine's backward (itself tested against finite differences and SciPy's
forward), and ``torch.autograd.gradcheck`` here too.  Every test asserts which kernel ran
(``T.LAUNCHES["rows_bwd"]``, or ``"bwd"`` for the general backward where a case must fall back
to it) and that nothing fell back to the reference, then the values: within 1e-12 (float64) or
2e-6 (float32) of the reference's largest gradient, NaN exactly where the reference has NaN.

Covered: every op the kernel takes in every mode (``constant`` with a non-zero cval), on planes
whose chunks and strips touch every border (one chunk that is both borders, the smallest planes
it takes, heights cut into strips, packed planes with a partial last group), the border ring of
reflect / mirror / nearest, wrap's folded upstream term, NaN / inf, the magnitude's overflow /
underflow rescue, bfloat16 / float16 (bit-identical to torch's rounding of the kernel's float32
result), layouts that must fall back, and the allocation-free launch path.
"""

from __future__ import annotations

import contextlib
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
KERNELS = ("rows_bwd", "bwd", "rows", "fwd")


@pytest.fixture(scope="module")
def T():
    with interpreted_triton() as mod:
        yield mod


@contextlib.contextmanager
def ran(T, kernel="rows_bwd"):
    """Assert that the block's backward ran ``kernel`` ("rows_bwd" or the general "bwd") once
    and fell back to the reference nowhere."""
    before = dict(T.LAUNCHES)
    fell = sum(T.FALLBACKS.values())
    yield
    d = {k: T.LAUNCHES[k] - before.get(k, 0) for k in ("rows_bwd", "bwd")}
    want = {"rows_bwd": 0, "bwd": 0}
    want[kernel] = 1
    assert d == want, f"backward launches {d}, expected {want}"
    assert sum(T.FALLBACKS.values()) == fell, f"fell back to the reference: {dict(T.FALLBACKS)}"


def check(a, b, tol, what=""):
    """Within ``tol * max(1, max|b|)``, NaN exactly where ``b`` has NaN, infinities equal."""
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN positions differ"
    fin = b.isfinite()
    assert torch.equal(a[~fin & ~b.isnan()], b[~fin & ~b.isnan()]), f"{what}: infinities differ"
    a, b = a[fin].double(), b[fin].double()
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = (a - b).abs()
    assert not bool((err > tol * scale).any()), f"{what}: max err {float(err.max()):.3g} (tol {tol * scale:.3g})"


K5 = (0.5, -1.0, 2.0, 0.25, 1.0)  # reach 3 (origin -1)
K4 = (1.0, -2.0, 0.5, 3.0)

#: every op and epilogue the kernel takes: stacked pairs, magnitude, direction, single passes
#: either way, horizontal- and vertical-first pairs (y recomputed by the forward's code), blends
OPS = {
    "gradient-central": lambda x, **k: tf.gradient(x, **k),
    "gradient-sobel": lambda x, **k: tf.gradient(x, operator="sobel", **k),
    "gradient_magnitude-central": lambda x, **k: tf.gradient_magnitude(x, **k),
    "gradient_magnitude-sobel": lambda x, **k: tf.gradient_magnitude(x, operator="sobel", **k),
    "gradient_magnitude-scharr-normalized": lambda x, **k: tf.gradient_magnitude(
        x, operator="scharr", normalized=True, **k),
    "gradient_direction-central": lambda x, **k: tf.gradient_direction(x, **k),
    "gradient_direction-prewitt": lambda x, **k: tf.gradient_direction(x, operator="prewitt", **k),
    "sobel-y": lambda x, **k: tf.sobel(x, -2, **k),
    "derivative-central-x": lambda x, **k: tf.derivative(x, -1, **k),
    "gaussian_filter": lambda x, **k: tf.gaussian_filter(x, 0.6, **k),
    "gaussian_filter-order": lambda x, **k: tf.gaussian_filter(x, 0.5, order=(1, 2), radius=(1, 2), **k),
    "gaussian_gradient_magnitude": lambda x, **k: tf.gaussian_gradient_magnitude(x, 0.45, **k),
    "correlate1d-x": lambda x, **k: tf.correlate1d(x, K5, -1, origin=-1, **k),
    "convolve1d-y": lambda x, **k: tf.convolve1d(x, K4, -2, **k),
    "uniform_filter": lambda x, **k: tf.uniform_filter(x, (2, 3), origin=(0, 1), **k),
    "selective_blur": lambda x, **k: tf.selective_blur(x, 0.1, **k),
    "selective_blur-sigma-keep_border": lambda x, **k: tf.selective_blur(
        x, -0.2, sigma=(0.5, 0.45), keep_border=True, **k),
    "selective_blur-mask": lambda x, **k: tf.selective_blur(x, mask=pattern_mask(*x.shape[-2:]), **k),
}
#: (float32, vector width 4) the pairs left to the general backward: the magnitude / direction
#: of vertical-first pairs in constant mode (the recomputed first pass pads with cval per column)
GENERAL = {(n, "constant") for n in ("gradient_magnitude-sobel", "gradient_magnitude-scharr-normalized",
                                      "gradient_direction-prewitt", "gaussian_gradient_magnitude")}
#: each op's reach ``(along x, along y)`` where not ``(1, 1)``; the kernel takes reach below the
#: vector width along x, on axes of at least ``2 * reach + 2`` (those it reads along)
REACH = {"derivative-central-x": (1, 0), "gaussian_filter": (2, 2), "gaussian_filter-order": (2, 1),
         "gaussian_gradient_magnitude": (2, 2), "correlate1d-x": (3, 0), "convolve1d-y": (0, 2),
         "uniform_filter": (2, 1), "selective_blur-sigma-keep_border": (2, 2)}


def kernel_of(name, mode, dtype, shape):
    rx, ry = REACH.get(name, (1, 1))
    H, W = shape[-2:]
    vec = 16 // dtype.itemsize
    while W % vec:
        vec //= 2
    if rx >= vec or (ry and H < 2 * ry + 2) or (rx and W < 2 * rx + 2) or (name, mode) in GENERAL:
        return "bwd"
    return "rows_bwd"


def grads(name, x, engine, mode, g=None, seed=5):
    xx = x.detach().requires_grad_(True)
    y = OPS[name](xx, mode=mode, cval=CVAL, backend=engine)
    if g is None:
        g = rand(*y.shape, seed=seed, dtype=y.dtype)
    (gx,) = torch.autograd.grad(y, xx, g)
    return gx


def check_op(T, name, x, mode, kernel=None, tol=None, g=None):
    kernel = kernel or kernel_of(name, mode, x.dtype, x.shape)
    with ran(T, kernel):
        gx = grads(name, x, "triton", mode, g)
    want = grads(name, x, "reference", mode, g)
    if tol is None:
        tol = 1e-12 if x.dtype == torch.float64 else 2e-6
    check(gx, want, tol, f"{name} {mode} {tuple(x.shape)} {x.dtype}")
    return gx


#: float32: 9 x 12 (three chunks of 4: left border, interior, right border), 8 x 8, two strips
#: of a tall plane (70 rows), 8 x 4 (one chunk that is both borders)
F32_SHAPES = ((2, 9, 12), (1, 8, 8), (70, 8), (3, 8, 4))
GRID = [(n, m, s) for n in OPS for m in BASE_MODES for s in F32_SHAPES]
#: every op in two modes, every mode for each op in turn, the shapes rotating
CORE = [(n, BASE_MODES[(i + j) % 5], F32_SHAPES[(i + 3 * j) % len(F32_SHAPES)])
        for i, n in enumerate(OPS) for j in (0, 2)]


@cases("name, mode, shape", GRID, CORE)
def test_every_op_every_mode_float32(T, name, mode, shape):
    check_op(T, name, rand(*shape, seed=len(name), dtype=torch.float32), mode)


@cases("name, mode", [(n, m) for n in OPS for m in BASE_MODES],
       [(n, BASE_MODES[i % 5]) for i, n in enumerate(OPS)])
def test_every_op_float64(T, name, mode):
    """Float64 rows are 2-vectors: reach 1 runs here, wider stencils on the general backward."""
    check_op(T, name, rand(2, 6, 8, seed=3), mode)


@examples(5)
@given(name=st.sampled_from(list(OPS)), mode=st.sampled_from(BASE_MODES),
       shape=st.tuples(st.integers(1, 2), st.integers(1, 19), st.sampled_from((1, 3, 4, 8, 12, 20))),
       seed=st.integers(0, 99))
def test_sampled_shapes(T, name, mode, shape, seed):
    """Any shape: the fused kernel where it takes it, the general one elsewhere, the same values."""
    x = rand(*shape, seed=seed, dtype=torch.float32)
    before = T.LAUNCHES["rows_bwd"] + T.LAUNCHES["bwd"]
    fell = sum(T.FALLBACKS.values())
    gx = grads(name, x, "triton", mode)
    assert T.LAUNCHES["rows_bwd"] + T.LAUNCHES["bwd"] == before + 1
    assert sum(T.FALLBACKS.values()) == fell
    check(gx, grads(name, x, "reference", mode), 2e-6, f"{name} {mode} {shape}")


def test_smallest_planes_taken(T):
    """Planes of ``2 * reach + 2`` rows and columns run here; one row or column less does not."""
    for k, mode in enumerate(BASE_MODES):
        check_op(T, "gradient_magnitude-sobel" if mode != "constant" else "gradient-sobel",
                 rand(2, 4, 4, seed=k, dtype=torch.float32), mode)
        check_op(T, "correlate1d-x", rand(8, 8, seed=k, dtype=torch.float32), mode)  # reach 3: 8 columns
        check_op(T, "gradient-sobel", rand(3, 4, seed=k, dtype=torch.float32), mode, kernel="bwd")
        check_op(T, "correlate1d-x", rand(8, 4, seed=k, dtype=torch.float32), mode, kernel="bwd")


def test_gradcheck_float64(T):
    """The adjoint against finite differences (not the reference): every border ring and wrap."""
    for k, mode in enumerate(BASE_MODES):
        for name in ("gradient_magnitude-sobel", "gradient_direction-central", "selective_blur")[k % 3:][:2]:
            x = rand(1, 5, 6, seed=k).requires_grad_(True)
            if name == "selective_blur":  # (away from the threshold: a stable selection)
                x = (x.detach() + torch.where(x.detach() >= 0.1, 0.05, -0.05)).requires_grad_(True)
            if name == "gradient_magnitude-sobel" and mode == "constant":
                name = "gradient-sobel"
            with ran(T):
                torch.autograd.grad(OPS[name](x, mode=mode, cval=CVAL, backend="triton"), x,
                                    torch.ones_like(OPS[name](x, mode=mode, cval=CVAL, backend="reference")))
            assert torch.autograd.gradcheck(lambda t: OPS[name](t, mode=mode, cval=CVAL, backend="triton"), (x,),
                                            eps=1e-6, atol=1e-8, fast_mode=True), f"{name} {mode}"


def test_fused_and_general_backward_agree(T):
    x = rand(1, 8, 8, seed=4, dtype=torch.float32)
    for k, name in enumerate(("gradient_magnitude-scharr-normalized", "selective_blur-sigma-keep_border",
                              "gradient_direction-prewitt")):
        mode = ("mirror", "wrap", "reflect")[k]
        with ran(T):
            a = grads(name, x, "triton", mode)
        T.ROWS = False
        try:
            with ran(T, "bwd"):
                b = grads(name, x, "triton", mode)
        finally:
            T.ROWS = True
        check(a, b, 2e-6, name)


def test_strips_and_packed_planes(T, monkeypatch):
    """Strips of a tall plane (the halo and the border ring across strip boundaries; limits shrunk
    so that small planes have strips) and packed planes with a partial last group."""
    monkeypatch.setattr(T._rows, "_MAX_BH", 16)
    monkeypatch.setattr(T._rows, "_MAX_BH_TALL", 8)
    T._rows_bwd._CACHE.clear()
    seen = []
    launch = T._rows_bwd.launch

    def spy(kp, *a, **k):
        seen.append(kp)
        return launch(kp, *a, **k)

    monkeypatch.setattr(T._rows_bwd, "launch", spy)
    for H, mode in ((28, "reflect"), (33, "constant"), (17, "mirror"), (40, "wrap"), (19, "nearest")):
        for name in ("convolve1d-y", "gradient_magnitude-central", "selective_blur"):
            seen.clear()
            check_op(T, name, rand(2, H, 8, seed=H, dtype=torch.float32), mode)
            assert seen[0].n_strips == -(-H // 8) > 1
    for shape in ((5, 6, 8), (3, 6, 64)):
        seen.clear()
        check_op(T, "gradient-sobel", rand(*shape, seed=1, dtype=torch.float32), "reflect")
        assert shape[0] % seen[0].BP != 0 or seen[0].BP > shape[0], seen[0]
    T._rows_bwd._CACHE.clear()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", ["gradient_magnitude-sobel", "gradient_direction-central", "gradient-sobel",
                                  "selective_blur", "gaussian_filter"])
def test_nan_and_inf(T, name):
    """NaN / inf in the input (the recomputed stencils, the selection) and in the upstream
    gradient: NaN reaches exactly the pixels the reference's NaN reaches."""
    x = rand(1, 8, 12, seed=2, dtype=torch.float32)
    x[0, 2, 3] = NAN
    x[0, 0, 6] = INF
    x[0, 7, 0] = -INF
    g = rand(*OPS[name](x, backend="reference").shape, seed=1, dtype=torch.float32)
    g[..., 5, 11] = NAN
    g[..., 4, 0] = INF
    for mode in ("reflect", "wrap", "nearest"):
        gx = check_op(T, name, x, mode, g=g)
        assert gx.isnan().any() and not gx.isnan().all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_magnitude_rescue(T, dtype):
    """Sums of squares that overflow or underflow: the second, exact sweep (finite gradients)."""
    big, tiny = (1e37, 1e-30) if dtype == torch.float32 else (1e300, 1e-160)
    sign = torch.tensor([1.0, -1.0]).repeat(4)[:, None].expand(8, 8).double()
    for k, (what, x) in enumerate((("big", big * sign), ("tiny", tiny * sign * rand(8, 8, seed=1, low=0.5)),
                                   ("mixed", torch.where(torch.arange(8) < 4, big * sign, rand(8, 8, seed=2))))):
        x = x.to(dtype)
        for name in ("gradient_magnitude-central", "gradient_magnitude-sobel"):
            gx = check_op(T, name, x, BASE_MODES[k], tol=1e-12 if dtype == torch.float64 else 2e-6)
            assert torch.isfinite(gx).all(), f"{what} {name}"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_low_precision_bitwise(T, dtype):
    """16-bit gradients: the kernel's float32 result on the same (exactly widened) inputs,
    rounded by torch -- bit for bit."""
    for k, name in enumerate(("gradient_magnitude-sobel", "selective_blur", "gradient-sobel", "gaussian_filter")):
        mode = BASE_MODES[k]
        x = rand(2, 6, 16, seed=k, dtype=dtype)
        y = OPS[name](x, backend="reference")
        g = rand(*y.shape, seed=k + 1, dtype=dtype)
        with ran(T):
            a = grads(name, x, "triton", mode, g)
        with ran(T):
            b = grads(name, x.float(), "triton", mode, g.float())
        assert a.dtype == dtype
        assert torch.equal(a.view(torch.int16), b.to(dtype).view(torch.int16)), name


def test_layouts_that_fall_back(T):
    """Rows that are not contiguous (channels_last, an expanded upstream gradient such as
    ``y.sum()``'s) run on the general backward; sliced leading dimensions stay here."""
    x = rand(2, 3, 8, 12, seed=1, dtype=torch.float32)
    cl = x.to(memory_format=torch.channels_last)
    check_op(T, "gradient_magnitude-central", cl, "reflect", kernel="bwd")
    ones = torch.ones(()).expand(2, 3, 8, 12)
    check_op(T, "selective_blur", x, "mirror", kernel="bwd", g=ones)
    check_op(T, "gradient-sobel", rand(4, 3, 8, 12, seed=2, dtype=torch.float32)[::2, 1:], "wrap")


def test_empty(T):
    for shape in ((0, 8, 8), (2, 0, 8)):
        x = torch.zeros(shape, requires_grad=True)
        y = tf.gradient_magnitude(x, backend="triton")
        (gx,) = torch.autograd.grad(y, x, torch.zeros_like(y))
        assert gx.shape == x.shape


def test_backward_allocates_nothing_but_the_result(T, monkeypatch):
    """With ``out=``, the fused backward's host path runs no allocating aten op (no u buffer, no
    table upload): safe under CUDA-graph capture.  The kernel is stubbed out."""
    launches = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *a, **k: launches.append(grid)

    monkeypatch.setattr(T._rows_bwd, "_rows_bwd_kernel", Stub())
    from torchfilters import _spec
    from torchfilters._spec import FilterSpec

    x = rand(2, 3, 8, 12, seed=1, dtype=torch.float32)
    g = rand(2, 3, 8, 12, seed=2, dtype=torch.float32)
    out = torch.empty_like(x)
    dx = _spec.sep((-1, -1, (-1.0, 0.0, 1.0)), (-2, -1, (1.0, 2.0, 1.0)))
    dy = _spec.sep((-2, -1, (-1.0, 0.0, 1.0)), (-1, -1, (1.0, 2.0, 1.0)))
    specs = [(FilterSpec("reflect", 0.0, "magnitude", (dx, dy)), g),
             (FilterSpec("wrap", 0.0, "stack", (dx, dy)), rand(2, 3, 2, 8, 12, seed=3, dtype=torch.float32))]
    for _ in range(2):
        for spec, grad in specs:
            with AtenLog() as log:
                T.filter_backward(grad, x, spec, out=out)
            bad = [op for op in log.ops if op.startswith(ALLOCATING)]
            assert not bad, bad
    assert len(launches) == 4
    assert math.prod(launches[0]) >= 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_subnormal_stencil_values(T, dtype):
    """Stencil values all subnormal (the rescue's scale m is subnormal: divided by, not inverted
    to inf): the reference's finite gradients, fused and general backward alike."""
    tiny = 1e-39 if dtype == torch.float32 else 1e-310
    x = torch.zeros(1, 8, 8, dtype=dtype)
    x[0, 3, 4] = tiny
    x2 = (rand(1, 8, 12, seed=1) * tiny).to(dtype)
    for xx in (x, x2):
        gx = check_op(T, "gradient_magnitude-central", xx, "reflect", tol=1e-12 if dtype == torch.float64 else 2e-6)
        assert torch.isfinite(gx).all()
        T.ROWS = False
        try:
            assert torch.isfinite(grads("gradient_magnitude-central", xx, "triton", "reflect")).all()
        finally:
            T.ROWS = True


def test_zero_gradients_are_positive_zeros(T):
    """The reference sums onto zeros: a zero gradient is +0.0, here too."""
    x = rand(2, 8, 12, seed=1, dtype=torch.float64)
    for name in ("correlate1d-x", "gradient-sobel", "selective_blur"):
        g = torch.zeros_like(OPS[name](x, backend="reference")).neg()
        gx = check_op(T, name, x.float(), "reflect", g=g.float())
        assert not gx.signbit().any(), name


def test_float64_cval_and_threshold_reach_the_kernel_unrounded(T, monkeypatch):
    """Float kernel arguments are float32 on a GPU, so ``cval`` and the threshold go in as the
    float64's bits (the interpreter would not show the rounding: this checks the arguments)."""
    got = []

    class Stub:
        def __getitem__(self, grid):
            return lambda *a, **k: got.append(a)

    for mod, kern in ((T._rows, "_rows_kernel"), (T._rows_bwd, "_rows_bwd_kernel")):
        monkeypatch.setattr(mod, kern, Stub())
    x = rand(1, 8, 8, seed=1).requires_grad_(True)
    y = tf.selective_blur(x, 0.1, backend="triton")
    torch.autograd.grad(y, x, torch.ones_like(y).contiguous())
    y = tf.gradient_magnitude(x, mode="constant", cval=0.7, backend="triton")
    torch.autograd.grad(y, x, rand(1, 8, 8, seed=2))
    import struct

    want = {struct.unpack("<q", struct.pack("<d", v))[0] for v in (0.1, 0.7)}
    ints = {a for args in got for a in args if isinstance(a, int) and not isinstance(a, bool)}
    assert len(got) == 4 and want <= ints
    assert not any(isinstance(a, float) for args in got for a in args)


def test_plan_caches_under_threads(T):
    """Planning from several threads while the caches evict (past 512 entries): no KeyError,
    every plan made."""
    import sys
    import threading

    from torchfilters import _spec
    from torchfilters._spec import FilterSpec

    dx = _spec.sep((-1, -1, (-1.0, 0.0, 1.0)), (-2, -1, (1.0, 2.0, 1.0)))
    dy = _spec.sep((-2, -1, (-1.0, 0.0, 1.0)), (-1, -1, (1.0, 2.0, 1.0)))
    spec = FilterSpec("reflect", 0.0, "magnitude", (dx, dy))
    for mod in (T._rows, T._rows_bwd):
        mod._CACHE.clear()
    errors = []

    def work(k):
        try:
            for H in range(8 + k, 8 + 1100, 4):
                assert T._rows_bwd.plan(spec, H, 16, 1, torch.float32, [16]) is not None
                assert T._rows.plan(spec, H, 16, 1, torch.float32, [16], 0.0) is not None
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    assert 400 < len(T._rows_bwd._CACHE) <= 513 and 400 < len(T._rows._CACHE) <= 513


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_overflowing_upstream_gradient(T):
    """An upstream gradient of 3e38 overflows float32 inside the adjoint passes: the passes run in
    the reference's order (the forward's, reversed), so inf and NaN land where the reference's do."""
    x = rand(1, 8, 12, seed=1, dtype=torch.float32)
    for k, mode in enumerate(("wrap", "reflect", "constant")):
        for name in ("sobel-y", "gradient-sobel", "correlate1d-x"):
            y = OPS[name](x, backend="reference")
            g = torch.full(y.shape, 3e38)
            gx = check_op(T, name, x, mode, g=g)
            assert not torch.isfinite(gx).all(), f"{name} {mode}: nothing overflowed"


def test_int64_offsets_give_the_int32_bits(T, monkeypatch):
    """Offsets are int32 unless a tensor of the launch spans 2**31 elements (``needs_i64``): the
    int64 variant of both kernels gives the same bits (stacked pair, mask, magnitude backward)."""
    x = rand(2, 9, 12, seed=3, dtype=torch.float32)
    mask = pattern_mask(9, 12)
    cases = {
        "gradient": lambda t: tf.gradient(t, operator="sobel", mode="wrap", backend="triton"),
        "selective_blur-mask": lambda t: tf.selective_blur(t, mask=mask, mode="nearest", backend="triton"),
        "gradient_magnitude": lambda t: tf.gradient_magnitude(t, mode="constant", cval=CVAL, backend="triton"),
    }

    def run_all():
        out = {}
        for name, f in cases.items():
            xx = x.detach().requires_grad_(True)
            y = f(xx)
            (gx,) = torch.autograd.grad(y, xx, rand(*y.shape, seed=4, dtype=y.dtype))
            out[name] = (y, gx)
        return out

    needs = T._rows.needs_i64
    launched = T.LAUNCHES["rows"] + T.LAUNCHES["rows_bwd"]
    narrow = run_all()
    assert T.LAUNCHES["rows"] + T.LAUNCHES["rows_bwd"] == launched + 6
    for mod in (T._rows, T._rows_bwd):
        monkeypatch.setattr(mod, "needs_i64", lambda *t, k_stride=0: True)
    wide = run_all()
    for name in cases:
        for a, b in zip(narrow[name], wide[name]):
            assert torch.equal(a, b) and torch.equal(a.signbit(), b.signbit()), name
    # the rule: spans (meta tensors: no memory) of 2**31 elements or more, rows past the plane included
    assert not needs(torch.empty(3, 8, 8), None)
    assert needs(torch.empty(3, 2**30, device="meta"))
    assert needs(torch.empty(2**31 - 4, 1, device="meta"))  # the reach past the last row
    assert not needs(torch.empty(2**20, 2**10, device="meta"))
    assert needs(torch.empty(4, 8), k_stride=2**31)
