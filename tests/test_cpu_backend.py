"""The fused numba engine (backends/cpu.py) against the reference engine.

The reference engine is the oracle: every op, mode, operator and odd size,
forward and backward, in float64 with a tight tolerance; then the code paths
only the fused engine has -- row blocks and the parallel launch, the
float16/bfloat16 converters, strided / channels_last / stride-0 layouts,
``out=``, NaN/inf footprints, and the fall-backs to the reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torchfilters as tf
from torchfilters import _spec, backends
from torchfilters._spec import BlurSpec, FilterSpec

cpu = backends.get("cpu")
pytestmark = pytest.mark.skipif(cpu is None, reason="numba is not installed")

from conftest import BASE_MODES, LOW_DTYPES, MODES, OPS, examples, float_bits, grid, op_out_shape, pattern_mask, rand  # noqa: E402

MODES5 = BASE_MODES
SHAPES = ((2, 1, 7, 5), (1, 1, 1, 1), (3, 1, 6), (2, 5, 1), (1, 2, 3), (1, 11, 4))


@pytest.fixture(autouse=True)
def _planned_afresh(no_replays):
    """(Tests here patch the CPU engine's planning and spy on its launches: no replays.)"""


def _run(name, x, engine, mode, **kw):
    return OPS[name](x, mode=mode, cval=0.75, backend=engine, **kw)


def _fwd_bwd(name, x, engine, mode, seed=1):
    xx = x.detach().clone().requires_grad_(True)
    y = _run(name, xx, engine, mode)
    g = rand(*y.shape, seed=seed, dtype=y.dtype)
    (gx,) = torch.autograd.grad(y, xx, g)
    return y.detach(), gx


def _close(a, b, tol, what=""):
    a64, b64 = a.detach().double(), b.detach().double()
    scale = max(1.0, float(b64.abs().max())) if b.numel() else 1.0
    err = (a64 - b64).abs()
    assert bool(((err <= tol * scale) | (a64.isnan() & b64.isnan())).all()), (
        f"{what}: max err {float(err.nan_to_num(0).max()):.3g} (tol {tol * scale:.3g})"
    )


# ---------------------------------------------------------------- vs reference


@pytest.mark.parametrize("mode", MODES5)
@pytest.mark.parametrize("name", sorted(OPS))
def test_matches_reference_forward_and_backward(name, mode):
    for i, shape in enumerate(SHAPES):
        x = rand(*shape, seed=i)
        if name.startswith("selective_blur"):
            x = x + 0.05 * torch.sign(x)  # masks away from the threshold
        y_r, g_r = _fwd_bwd(name, x, "reference", mode)
        y_c, g_c = _fwd_bwd(name, x, "cpu", mode)
        assert y_c.shape == y_r.shape and y_c.dtype == y_r.dtype
        _close(y_c, y_r, 1e-12, f"{name} {shape} forward")
        _close(g_c, g_r, 1e-12, f"{name} {shape} backward")


@pytest.fixture(params=("flat", "padded", "padded-strips"))
def row_blocks(monkeypatch, request):
    """Force row blocks of a few rows, the parallel launch, and each tile layout on tiny images."""
    monkeypatch.setattr(cpu.plan, "_WHOLE", 0)
    monkeypatch.setattr(cpu.plan, "_TILE", 1)
    monkeypatch.setattr(cpu.direct, "_D3_TILE", 1)
    monkeypatch.setattr(cpu.direct, "_d3_cache", {})  # (direct-path plans made under the patched sizes stay here)
    monkeypatch.setattr(cpu.plan, "_SERIAL", 0)
    if request.param != "flat":
        monkeypatch.setattr(cpu.plan, "_FLAT_MAX_W", 0)
    if request.param == "padded-strips":
        monkeypatch.setattr(cpu.plan, "_STRIP", 2)
    return request.param


@pytest.mark.parametrize("mode", MODES5)
def test_row_blocks_and_parallel_launch(row_blocks, mode):
    for name in sorted(OPS):
        for i, shape in enumerate(((1, 9, 6), (2, 1, 13, 3), (1, 2, 7))):
            x = rand(*shape, seed=10 + i) + 0.0
            if name.startswith("selective_blur"):
                x = x + 0.05 * torch.sign(x)
            y_r, g_r = _fwd_bwd(name, x, "reference", mode)
            y_c, g_c = _fwd_bwd(name, x, "cpu", mode)
            _close(y_c, y_r, 1e-12, f"{name} {shape} forward")
            _close(g_c, g_r, 1e-12, f"{name} {shape} backward")


@pytest.mark.parametrize("mode", MODES5)
def test_many_small_planes_stacked_in_tiles(mode):
    """Many planes: several are stacked into one tile (flat layout), an odd number left over."""
    for name in sorted(OPS):
        x = rand(2, 37, 7, 9, seed=31)
        if name.startswith("selective_blur"):
            x = x + 0.05 * torch.sign(x)
        y_r, g_r = _fwd_bwd(name, x, "reference", mode)
        y_c, g_c = _fwd_bwd(name, x, "cpu", mode)
        _close(y_c, y_r, 1e-12, f"{name} forward")
        _close(g_c, g_r, 1e-12, f"{name} backward")


@pytest.mark.parametrize("mode", ("reflect", "wrap", "constant"))
def test_large_planes_in_row_blocks(mode):
    """Real blocking: few large planes are split into row blocks across threads."""
    x = rand(1, 130, 300, seed=3)
    for fn in (
        lambda t, b: tf.gaussian_filter(t, 2.0, mode=mode, cval=0.5, backend=b),
        lambda t, b: tf.gradient_magnitude(t, operator="sobel", mode=mode, cval=0.5, backend=b),
        lambda t, b: tf.selective_blur(t, 0.1, normalized=True, mode=mode, backend=b),
    ):
        xr = x.clone().requires_grad_(True)
        xc = x.clone().requires_grad_(True)
        yr, yc = fn(xr, "reference"), fn(xc, "cpu")
        _close(yc, yr, 1e-12, "forward")
        yr.square().sum().backward()
        yc.square().sum().backward()
        _close(xc.grad, xr.grad, 1e-11, "backward")


def test_radius_larger_than_image_every_mode():
    for mode in MODES5:
        for shape in ((1, 1), (2, 3), (3, 1)):
            x = rand(2, *shape, seed=5)
            w = rand(9, 7, seed=6)
            for fn in (
                lambda t, b: tf.correlate(t, w, mode=mode, cval=-0.5, backend=b),
                lambda t, b: tf.gaussian_filter(t, 3.0, mode=mode, cval=-0.5, backend=b),
                lambda t, b: tf.selective_blur(t, -0.2, sigma=(2.0, 3.0), normalized=True, mode=mode, backend=b),
            ):
                xr = x.clone().requires_grad_(True)
                xc = x.clone().requires_grad_(True)
                yr, yc = fn(xr, "reference"), fn(xc, "cpu")
                _close(yc, yr, 1e-12, f"{mode} {shape}")
                g = rand(*yr.shape, seed=7)
                (gr,) = torch.autograd.grad(yr, xr, g)
                (gc,) = torch.autograd.grad(yc, xc, g)
                _close(gc, gr, 1e-12, f"{mode} {shape} backward")


def test_matches_scipy_directly():
    sp = pytest.importorskip("scipy.ndimage")
    x = rand(9, 11, seed=8)
    xn = x.numpy()
    for mode in MODES5:
        assert torch.allclose(tf.sobel(x, -1, mode=mode, cval=1.5, backend="cpu"),
                              torch.from_numpy(sp.sobel(xn, -1, mode=mode, cval=1.5)), atol=1e-12)
        assert torch.allclose(tf.gaussian_filter(x, 1.3, mode=mode, cval=1.5, backend="cpu"),
                              torch.from_numpy(sp.gaussian_filter(xn, 1.3, mode=mode, cval=1.5)), atol=1e-12)
        w = rand(4, 3, seed=9).numpy()
        assert torch.allclose(tf.convolve(x, w, mode=mode, cval=1.5, backend="cpu"),
                              torch.from_numpy(sp.convolve(xn, w, mode=mode, cval=1.5)), atol=1e-12)
        mag = np.hypot(sp.sobel(xn, 0, mode=mode), sp.sobel(xn, 1, mode=mode))
        assert torch.allclose(tf.gradient_magnitude(x, operator="sobel", mode=mode, backend="cpu"),
                              torch.from_numpy(mag), atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_dense_kernels_give_scipys_float64_bits(mode):
    """A dense stencil's taps are summed as SciPy's ``NI_Correlate`` sums them (from +0.0, in
    footprint order), at the border columns too: SciPy's bits, signs of zero included, on the
    flat layout, the padded one (wide rows), a kernel larger than the image, and a batch."""
    sp = pytest.importorskip("scipy.ndimage")
    for shape, ks in (((37, 29), (3, 4)), ((5, 3), (7, 2)), ((3, 1100), (5, 5)), ((2, 3, 20, 21), (6, 1))):
        x = rand(*shape, seed=11)
        w = rand(*ks, seed=12)
        w[0, 0] = 0.0  # left out of the footprint, as SciPy does
        xn, wn = x.numpy(), w.numpy()[(None,) * (x.dim() - 2)]
        for fn in ("correlate", "convolve"):
            got = getattr(tf, fn)(x, w, mode=mode, cval=0.6, backend="cpu").numpy()
            ref = getattr(sp, fn)(xn, wn, mode=mode, cval=0.6)
            assert np.array_equal(got, ref), (fn, mode, shape, np.abs(got - ref).max())
    z = torch.full((6, 7), -0.0, dtype=torch.float64)  # every product -0: SciPy's sum is +0
    got = tf.correlate(z, torch.ones(3, 3, dtype=torch.float64), mode=mode, cval=-0.0, backend="cpu")
    assert not torch.signbit(got).any()


def test_engine_functions_directly():
    """The four entry points, called as the custom ops call them."""
    x = rand(2, 3, 8, 7, seed=11)
    spec = FilterSpec("mirror", 0.0, "magnitude",
                      (_spec.sep((-2, -1, (-1.0, 0.0, 1.0)), (-1, -1, (1.0, 2.0, 1.0))),
                       _spec.sep((-1, -1, (-1.0, 0.0, 1.0)), (-2, -1, (1.0, 2.0, 1.0)))))
    ref = backends.get("reference")
    _close(cpu.filter_forward(x, spec), ref.filter_forward(x, spec), 1e-13)
    g = rand(2, 3, 8, 7, seed=12)
    _close(cpu.filter_backward(g, x, spec), ref.filter_backward(g, x, spec), 1e-13)
    bspec = BlurSpec("nearest", 0.0, True, False, _spec.dense([[1.0, 2.0], [3.0, 4.0]], (0, -1)))
    mask = (rand(8, 7, seed=13) > 0).expand(2, 3, 8, 7)
    _close(cpu.blur_forward(x, mask, bspec, 0.0), ref.blur_forward(x, mask, bspec, 0.0), 1e-13)
    _close(cpu.blur_backward(g, x, mask, bspec, 0.0), ref.blur_backward(g, x, mask, bspec, 0.0), 1e-13)
    _close(cpu.blur_backward(g, x, None, bspec, 0.2), ref.blur_backward(g, x, None, bspec, 0.2), 1e-13)


# ------------------------------------------------------------------- fall-backs


def test_unusual_specs_fall_back_to_the_reference():
    ref = backends.get("reference")
    x = rand(2, 6, 5, seed=14)
    same_axis = FilterSpec("reflect", 0.0, "stack", (_spec.sep((-1, -1, (1.0, 2.0, 1.0)), (-1, 0, (1.0, -1.0))),))
    inf_cval = FilterSpec("constant", math.inf, "stack", (_spec.sep((-2, -1, (1.0, 2.0, 1.0)),),))
    for spec in (same_axis, inf_cval):
        assert cpu._info(spec) is None
        assert torch.equal(cpu.filter_forward(x, spec), ref.filter_forward(x, spec))
        assert torch.equal(cpu.filter_backward(x, x, spec), ref.filter_backward(x, x, spec))


def test_empty_tensors():
    x = torch.empty(0, 3, 4)
    assert tf.gradient_magnitude(x, backend="cpu").shape == (0, 3, 4)
    assert tf.selective_blur(torch.empty(2, 0, 4), backend="cpu").shape == (2, 0, 4)


# ----------------------------------------------------------------------- dtypes


def test_half_conversions_are_exact():
    from numba import njit

    @njit
    def h2f(src, dst):
        for i in range(src.size):
            dst[i] = cpu.prims._h2f(src[i])

    @njit
    def f2h(src, dst):
        for i in range(src.size):
            dst[i] = cpu.prims._f2h(src[i])

    bits = np.arange(65536, dtype=np.uint16)
    got = np.empty(65536, np.float32)
    h2f(bits, got)
    assert np.array_equal(got, torch.from_numpy(bits.view(np.float16)).float().numpy(), equal_nan=True)
    g = torch.Generator().manual_seed(0)
    f = torch.randint(-(2**31), 2**31 - 1, (1_000_000,), generator=g, dtype=torch.int32).view(torch.float32)
    f = torch.cat([f, torch.linspace(-7e4, 7e4, 200_001), torch.linspace(-1e-4, 1e-4, 200_001),
                   torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, 2.98e-8, 2.9802322e-08, math.inf, -math.inf])])
    out = np.empty(f.numel(), np.uint16)
    f2h(f.numpy(), out)
    want = f.half().view(torch.int16).numpy().view(np.uint16)
    ok = ~np.isnan(f.numpy())
    assert np.array_equal(out[ok], want[ok])
    assert np.isnan(out[~ok].view(np.float16)).all()


# each op in one of the dtypes, the dtypes in turn (each kernel family meets each dtype); the
# sampled test below and TORCHFILTERS_FULL_GRID=1 add the other pairs
@grid("dtype, name", LOW_DTYPES, sorted(OPS), strength=1)
def test_low_precision_matches_reference(dtype, name):
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-6}[dtype]
    for shape in ((2, 9, 8), (1, 1, 3, 1)):
        x = rand(*shape, seed=15, dtype=dtype)
        if name.startswith("selective_blur"):
            x = (x.double() + 0.1 * torch.sign(x.double())).to(dtype)
        y_r, g_r = _fwd_bwd(name, x, "reference", "reflect")
        y_c, g_c = _fwd_bwd(name, x, "cpu", "reflect")
        assert y_c.dtype == dtype and g_c.dtype == dtype
        if name.startswith("gradient_direction"):  # angles of near-zero gradients are unstable
            continue
        _close(y_c, y_r, tol, f"{name} {dtype} forward")
        _close(g_c, g_r, tol * 4, f"{name} {dtype} backward")


def test_bfloat16_rounding_matches_torch():
    """The output conversion rounds to nearest even like torch (checked on an identity pass)."""
    x = rand(3, 50, 40, seed=16, dtype=torch.float32) * 1000
    xb = x.to(torch.bfloat16)
    y = tf.correlate(xb, [[1.0]], backend="cpu")
    assert torch.equal(y, xb)
    y = tf.correlate(x.to(torch.float16), [[1.0]], backend="cpu")
    assert torch.equal(y, x.to(torch.float16))


# -------------------------------------------------------------- layouts and out=


def _ref_and_cpu(fn, x):
    return fn(x, "reference"), fn(x, "cpu")


LAYOUT_OPS = {
    "magnitude": lambda t, b: tf.gradient_magnitude(t, operator="sobel", mode="wrap", backend=b),
    "gradient": lambda t, b: tf.gradient(t, operator="scharr", mode="mirror", backend=b),
    "blur-mask": lambda t, b: tf.selective_blur(t, mask=(t[..., :1, :, :] > 0), normalized=True, backend=b),
    "gauss": lambda t, b: tf.gaussian_filter(t, (1.0, 2.0), mode="constant", cval=2.0, backend=b),
}


@pytest.mark.parametrize("layout", ("slice", "channels_last", "transposed_hw", "expanded", "lead3"))
@pytest.mark.parametrize("op", sorted(LAYOUT_OPS))
def test_layouts(layout, op):
    base = rand(3, 4, 9, 10, seed=17)
    x = {
        "slice": base[:, 1:3, 1:8, ::2],
        "channels_last": base.contiguous(memory_format=torch.channels_last),
        "transposed_hw": base.transpose(-1, -2),
        "expanded": base[:1, :1].expand(3, 4, 9, 10),
        "lead3": base.unsqueeze(2).expand(3, 4, 2, 9, 10).transpose(0, 1)[:, :, :, 1:],
    }[layout]
    fn = LAYOUT_OPS[op]
    xr = x.detach().requires_grad_(True)
    xc = x.detach().requires_grad_(True)
    assert xc.stride() == x.stride()
    yr, yc = fn(xr, "reference"), fn(xc, "cpu")
    assert yc.is_contiguous()
    _close(yc, yr, 1e-12, f"{layout} forward")
    # a non-contiguous incoming gradient, and the stride-0 one of .sum().backward()
    g = rand(*yr.shape[:-2], yr.shape[-1], yr.shape[-2], seed=18).transpose(-1, -2)
    (gr,) = torch.autograd.grad(yr, xr, g)
    (gc,) = torch.autograd.grad(yc, xc, g)
    _close(gc, gr, 1e-12, f"{layout} backward")
    (gr,) = torch.autograd.grad(fn(xr, "reference").sum(), xr)
    (gc,) = torch.autograd.grad(fn(xc, "cpu").sum(), xc)
    _close(gc, gr, 1e-12, f"{layout} backward of sum")


def test_out_writes_and_returns_out():
    x = rand(2, 3, 12, 11, seed=19, dtype=torch.float32)
    for name in sorted(OPS):
        want = _run(name, x, "cpu", "nearest")
        out = torch.full(op_out_shape(name, x.shape), math.nan)
        assert _run(name, x, "cpu", "nearest", out=out) is out
        assert torch.equal(out, want), name
        # a strided out (every other column of a wider buffer)
        wide = torch.full(op_out_shape(name, x.shape)[:-1] + (2 * x.shape[-1],), math.nan)
        out = wide[..., ::2]
        _run(name, x, "cpu", "nearest", out=out)
        assert torch.equal(out, want), name
        assert wide[..., 1::2].isnan().all()


def test_out_for_the_stacked_gradient_and_uncollapsible_out():
    x = rand(2, 3, 6, 5, seed=20)
    want = tf.gradient(x, operator="sobel", backend="cpu")
    out = torch.empty(2, 2, 3, 6, 5, dtype=x.dtype).permute(0, 2, 1, 3, 4)  # (2, 3, 2, 6, 5), K outermost
    tf.gradient(x, operator="sobel", out=out, backend="cpu")
    assert torch.equal(out, want)
    out = torch.empty(3, 5, 2, 2, 6, dtype=x.dtype).permute(3, 0, 2, 4, 1)  # leading dims that do not collapse
    tf.gradient(x, operator="sobel", out=out, backend="cpu")
    assert torch.equal(out, want)


def test_fresh_outputs_are_contiguous_and_large_ones_from_numpy():
    x = rand(4, 64, 64, 64, seed=21, dtype=torch.float32)
    y = tf.gradient_magnitude(x, backend="cpu")
    assert y.is_contiguous() and y.dtype == torch.float32
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        assert cpu._alloc((3, 700, 700), dt).dtype == dt
    y = tf.selective_blur(x.to(torch.bfloat16), backend="cpu")
    assert y.dtype == torch.bfloat16 and y.shape == x.shape


def test_inputs_are_not_modified():
    x = rand(2, 7, 8, seed=22)
    x0 = x.clone()
    g = rand(2, 7, 8, seed=23)
    g0 = g.clone()
    for name in sorted(OPS):
        if name == "gradient-sobel":
            continue
        xx = x.clone().requires_grad_(True)
        _run(name, xx, "cpu", "reflect").backward(g)
    assert torch.equal(x, x0) and torch.equal(g, g0)


# ----------------------------------------------------------------- NaN and inf


def _footprint(x_bad, dense_abs_kernels, mode):
    """Where a non-finite input may land: correlation of its indicator with |kernel| (folded by mode)."""
    ind = x_bad.double()
    reach = torch.zeros_like(ind)
    for k in dense_abs_kernels:
        reach = reach + tf.correlate(ind, k, mode=mode, backend="reference")
    return reach > 0


@pytest.mark.parametrize("mode", MODES5)
@pytest.mark.parametrize("bad", (math.nan, math.inf, -math.inf))
def test_non_finite_inputs_contaminate_only_the_footprint(mode, bad):
    x = rand(2, 11, 13, seed=24, dtype=torch.float32)
    x[0, 5, 6] = bad
    x[1, 0, 12] = bad  # at a corner: the footprint folds
    ind = ~torch.isfinite(x)
    # 1-D passes multiply every tap, zeros too (SciPy's correlate1d): their footprint is the
    # whole support; a dense kernel's zero weights are outside it (SciPy's correlate)
    cases = [
        (tf.gradient_magnitude(x, operator="sobel", mode=mode, backend="cpu"), [np.ones((3, 3))]),
        (tf.derivative(x, -1, mode=mode, backend="cpu"), [[[1.0, 1.0, 1.0]]]),
        (tf.correlate(x, [[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]], mode=mode, backend="cpu"),
         [[[0.0, 1.0], [2.0, 0.0], [0.0, 3.0]]]),
        (tf.gaussian_filter(x, 1.0, mode=mode, backend="cpu"), [np.ones((9, 9))]),
        (tf.selective_blur(x, -10.0, mode=mode, backend="cpu"), [np.ones((3, 3))]),
    ]
    for y, kernels in cases:
        fp = _footprint(ind, kernels, mode)
        assert torch.isfinite(y[~fp]).all()
        assert (~torch.isfinite(y[fp])).any()


def test_normalized_blur_excludes_non_finite_outliers():
    x = torch.ones(1, 7, 7)
    x[0, 3, 3] = -math.inf  # below the threshold: excluded, must not leak
    y = tf.selective_blur(x, 0.0, normalized=True, backend="cpu")
    assert torch.isfinite(y[x > 0]).all() and (y[x > 0] == 1).all()


# --------------------------------------------------------------------- threads


def test_threads_follow_torch(monkeypatch):
    seen = []
    launch = cpu._launch

    def spy(fn, args, nitems, nthreads, serial, runs=None):
        seen.append((nthreads, serial))
        return launch(fn, args, nitems, nthreads, serial, runs)

    monkeypatch.setattr(cpu, "_launch", spy)
    before = torch.get_num_threads()
    x = rand(1, 300, 200, seed=25)
    want = tf.gaussian_filter(x, 1.0, backend="reference")
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            xx = x.clone().requires_grad_(True)
            y = tf.gaussian_filter(xx, 1.0, backend="cpu")
            y.sum().backward()
            _close(y, want, 1e-12)
            assert seen[-2:] == [(n, False), (n, False)]
        torch.set_num_threads(2)
        tf.gaussian_filter(x[:, :5, :5], 1.0, backend="cpu")  # tiny: serial, in the calling thread
        assert seen[-1] == (2, True)
    finally:
        torch.set_num_threads(before)


def test_an_op_reentering_a_launch_runs_in_its_thread(monkeypatch):
    """Found by review: an op run by a signal handler while this thread was inside the pool's
    ``submit`` (its lock held) waited for that lock forever.  Here the pool's ``submit`` holds a
    lock and runs such an op: it runs in the calling thread, and both results are right."""
    import threading

    from torchfilters.backends.cpu import threads

    x = rand(2, 300, 200, seed=26)
    inner = []
    lock = threading.Lock()
    pool = threads._get_pool(2)

    class Pool:
        def submit(self, fn):
            if not lock.acquire(timeout=10):  # (before the fix: the re-entering op waited here)
                raise AssertionError("the re-entering op waited for the pool's lock")
            try:
                if not inner:
                    inner.append(tf.gaussian_filter(x, 2.0, backend="cpu"))  # (a signal handler's op)
                return pool.submit(fn)
            finally:
                lock.release()

    monkeypatch.setattr(threads, "_get_pool", lambda n: Pool())
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        y = tf.gaussian_filter(x, 1.0, backend="cpu")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(y, tf.gaussian_filter(x, 1.0, backend="reference"))
    assert torch.equal(inner[0], tf.gaussian_filter(x, 2.0, backend="reference"))


def test_an_allocation_reentering_the_buffer_choice_leaves_the_free_list_alone(monkeypatch):
    """Found by review: a call re-entering the output cache while it chose a buffer (a signal
    handler's op, a finalizer) could take that buffer, and the choice then raised StopIteration.
    A profile hook runs an op at the choice's ``next`` call: it gets a buffer of its own."""
    import sys

    from torchfilters.backends.cpu import buffers

    tf.gaussian_filter(torch.rand(600, 600), 1.0, backend="cpu")  # one free buffer of 1.4 MB
    assert buffers._free_bufs
    x = torch.rand(600, 600)
    inner = []

    def hook(frame, event, arg):
        if event == "c_call" and arg is next and frame.f_code.co_name == "_choose" and not inner:
            inner.append(tf.gaussian_filter(torch.full((600, 600), 3.0), 1.0, backend="cpu"))

    sys.setprofile(hook)
    try:
        y = tf.gaussian_filter(x, 1.0, backend="cpu")
    finally:
        sys.setprofile(None)
    assert inner and torch.equal(inner[0], tf.gaussian_filter(torch.full((600, 600), 3.0), 1.0, backend="reference"))
    assert inner[0].untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    assert torch.equal(y, tf.gaussian_filter(x, 1.0, backend="reference"))


def test_backend_selection():
    assert backends.resolve("auto", torch.device("cpu"), torch.float32) is cpu
    assert backends.resolve("auto", torch.device("cpu"), torch.bfloat16) is cpu
    assert not cpu.available(torch.device("meta"), torch.float32)


# ------------------------------------------------------------------ properties

hyp = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@examples(20)
@given(
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    lead=st.integers(1, 3),
    kh=st.integers(1, 9),
    kw=st.integers(1, 9),
    mode=st.sampled_from(MODES5),
    dtype=st.sampled_from((torch.float64, torch.float32, torch.float16, torch.bfloat16)),
    kind=st.sampled_from(("dense", "sep", "blur", "blur-normalized", "magnitude")),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(h, w, lead, kh, kw, mode, dtype, kind, seed):
    x = rand(lead, h, w, seed=seed, dtype=dtype)
    wts = rand(kh, kw, seed=seed + 1)
    if kind == "dense":
        fn = lambda t, b: tf.correlate(t, wts, mode=mode, cval=0.3, backend=b)  # noqa: E731
    elif kind == "sep":
        sig = (0.0 if kh == 1 else kh / 4, kw / 4)
        fn = lambda t, b: tf.gaussian_filter(t, sig, order=(kh % 2, 0), mode=mode, cval=0.3, backend=b)  # noqa: E731
    elif kind == "magnitude":
        fn = lambda t, b: tf.gaussian_gradient_magnitude(t, kw / 3, mode=mode, cval=0.3, backend=b)  # noqa: E731
    else:
        fn = lambda t, b: tf.selective_blur(  # noqa: E731
            t, 0.0, weights=wts.abs() + 0.1, normalized=kind == "blur-normalized", mode=mode, cval=0.3, backend=b
        )
    tol = {torch.float64: 1e-11, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    xr = x.clone().requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    yr, yc = fn(xr, "reference"), fn(xc, "cpu")
    _close(yc, yr, tol, "forward")
    g = rand(*yr.shape, seed=seed + 2, dtype=dtype)
    (gr,) = torch.autograd.grad(yr, xr, g)
    (gc,) = torch.autograd.grad(yc, xc, g)
    _close(gc, gr, tol * (8 if kind == "magnitude" else 2), "backward")


@examples(4)
@given(dtype=st.sampled_from(LOW_DTYPES), name=st.sampled_from(sorted(OPS)))
def test_low_precision_matches_reference_sampled(dtype, name):
    test_low_precision_matches_reference(dtype, name)


# ------------------------------------------------------------------ buffers behind raw pointers


def _own_nodes(fn):
    """The AST nodes of ``fn``'s body, not descending into nested functions."""
    import ast

    todo = list(fn.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def test_kernels_keep_raw_pointer_buffers_alive():
    """numba frees a local array right after its last use (a later allocation then reuses the
    memory), so a kernel that reads an array it made through a raw pointer (``.ctypes.data``)
    must use the array again at its very end (each kernel returns a sum of their sizes).  A
    missing one is a use-after-free that shows only under load (the direct 3x3x3 path had one:
    a crash in a worker thread; the separable path's weights another)."""
    import ast
    import pathlib

    import torchfilters.backends.cpu as cpu

    made = {"empty", "zeros", "array", "full", "_cvt", "empty_like", "zeros_like", "copy", "astype"}
    checked = 0
    for path in sorted(pathlib.Path(cpu.__file__).parent.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef):
                continue
            local, raw = set(), set()
            for node in _own_nodes(fn):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    f = node.value.func
                    if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) in made:
                        local |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                if (isinstance(node, ast.Attribute) and node.attr == "data" and isinstance(node.value, ast.Attribute)
                        and node.value.attr == "ctypes" and isinstance(node.value.value, ast.Name)):
                    raw.add(node.value.value.id)
            need = raw & local
            if not need:
                continue
            checked += 1
            last = fn.body[-1]
            used = {n.id for n in ast.walk(last) if isinstance(n, ast.Name)} if isinstance(last, ast.Return) else set()
            assert need <= used, f"{path.name}:{fn.name} does not keep {sorted(need - used)} alive to its end"
    assert checked >= 8  # the tiled, separable, direct and volume kernels


# ------------------------------------------------------------ replayed small calls


class _CountingReplays(dict):
    hits = 0

    def get(self, key, default=None):
        rec = super().get(key, default)
        self.hits += rec is not None
        return rec


#: each launch kind (direct 3x3, separable, tiled, selective blur) in the 32- and 16-bit dtypes
#: (every op in float64: the kernels the other tests compile)
_REPLAY_SUBSET = ("gradient_magnitude-central", "derivative-sobel-y", "gaussian_filter", "correlate",
                  "selective_blur-mask", "selective_blur-threshold")


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32, torch.bfloat16))
def test_replayed_small_calls_give_the_bits_of_calls_planned_afresh(dtype, monkeypatch):
    """A small forward call's plan is recorded and replayed (``cpu._replays``): calls that
    follow, on other data, another mask and threshold, views of other layouts and sizes, give
    the bits of the same call planned afresh."""
    import torchfilters.backends.cpu as cpu_engine

    replays = _CountingReplays()
    monkeypatch.setattr(cpu_engine, "_replays", replays)
    base = rand(3, 2, 9, 11, seed=5, dtype=dtype)
    inputs = [base, rand(3, 2, 9, 11, seed=6, dtype=dtype) * 3, base.transpose(-1, -2), base[..., 1:, 2:],
              base.contiguous(memory_format=torch.channels_last), rand(1, 1, 1, 7, seed=2, dtype=dtype)]
    masks = [pattern_mask(9, 11), ~pattern_mask(9, 11)]
    cases = {name: op for name, op in OPS.items() if name != "selective_blur-mask"}
    cases["selective_blur-mask"] = lambda x, **k: tf.selective_blur(
        x, mask=masks[int(x.sum() > 0)].expand(x.shape) if x.shape[-2:] == (9, 11) else None, **k)
    cases["selective_blur-threshold"] = lambda x, **k: tf.selective_blur(x, float(x.flatten()[0]), **k)
    if dtype != torch.float64:
        cases = {name: cases[name] for name in _REPLAY_SUBSET}

    for name, op in cases.items():
        for mode in ("reflect", "wrap"):
            replays.clear()
            hits = replays.hits
            for x in inputs + inputs[::-1]:
                y = op(x, mode=mode, backend="cpu")
                saved = dict(replays)
                replays.clear()  # the same call, planned afresh
                fresh = op(x, mode=mode, backend="cpu")
                replays.clear()
                replays.update(saved)
                assert torch.equal(float_bits(y), float_bits(fresh)), (name, mode, x.shape, x.stride())
            assert replays.hits - hits >= len(inputs), (name, mode, replays.hits - hits)  # replays did run



def test_a_default_device_does_not_move_cpu_outputs():
    """``torch.set_default_device`` / ``with torch.device(...)`` make factory calls without a
    device land there: the engine's outputs, temporaries and replays are made on the CPU (a
    ``meta`` default device crashed the process, and host-side plan tables were made there:
    found by review)."""
    x = rand(2, 3, 19, 23, seed=3)  # (sizes no other test uses: plans are made under the device)
    small = rand(1, 1, 5, 29, seed=4)
    calls = [lambda t: tf.gradient_magnitude(t, backend="cpu"),
             lambda t: tf.gaussian_filter(t, 1.2, backend="cpu"),
             lambda t: tf.selective_blur(t, 0.5, backend="cpu"),
             lambda t: tf.median_filter(t, 3, backend="cpu"),
             lambda t: tf.canny(t[0, 0], backend="cpu"),
             lambda t: tf.gaussian_filter(t, 1.0, axes=(-3, -2, -1), backend="cpu"),
             lambda t: tf.gaussian_filter(t.transpose(-1, -2), 1.0, backend="cpu",  # (a copy of the input)
                                          out=torch.empty_like(t, device="cpu").transpose(-1, -2))]
    for t in (x, small):
        got = []
        for _ in range(2):  # planned, then replayed
            with torch.device("meta"):
                got.append([f(t) for f in calls])
        want = [f(t) for f in calls]
        for a, b in zip(got[0] + got[1], want + want):
            assert a.device.type == "cpu" and torch.equal(a, b)
