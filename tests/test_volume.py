"""The CPU engine's volume path (``backends/cpu/volume.py``): ``sep`` specs over three axes, and
two-axis specs with per-axis modes, fused forward and backward.

SciPy in float64 is the oracle (per 3-D slice of ``(..., D, H, W)``); the public API is called
with ``axes=(-3, -2, -1)`` and ``backend="cpu"``.  ``no_reference`` makes sure the volume engine,
not the reference fallback, ran.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf
from torchfilters._spec import FilterSpec, sep
from torchfilters.backends import reference
from torchfilters.backends.cpu import volume

AX = (-3, -2, -1)
MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
MIX = ("wrap", "constant", "mirror")  # one mode per axis
CVAL = 0.7


@pytest.fixture
def no_reference(monkeypatch):
    """The reference engine raises: a test using this runs on the volume engine alone."""

    def boom(*args, **kwargs):
        raise AssertionError("the reference engine ran")

    for name in ("filter_forward", "filter_backward", "filter_compute", "filter_vjp", "blur_forward", "blur_backward",
                 "blur_compute", "blur_vjp", "apply_stencil", "apply_stencil_adjoint"):
        monkeypatch.setattr(reference, name, boom)


def slices(fn, a):
    """``fn`` applied to every 3-D slice of ``a`` (float64)."""
    a = np.asarray(a, np.float64)
    flat = a.reshape((-1,) + a.shape[-3:])
    return np.stack([fn(v) for v in flat]).reshape(a.shape[:-3] + fn(flat[0]).shape)


def _sobel_mag(v, mode, cval):
    return np.sqrt(sum(ndi.sobel(v, axis=q, mode=mode, cval=cval) ** 2 for q in range(3)))


# (name, ours(x, mode, cval), scipy(v, mode, cval)) -- SciPy's modes may be a sequence
OPS = {
    "gaussian": (lambda x, m, c: tf.gaussian_filter(x, (1.0, 1.5, 0.8), axes=AX, mode=m, cval=c, backend="cpu"),
                 lambda v, m, c: ndi.gaussian_filter(v, (1.0, 1.5, 0.8), mode=m, cval=c)),
    # radius 12 on axes of size 1 .. 7: the folds wrap many times
    "gaussian_wide": (lambda x, m, c: tf.gaussian_filter(x, 3.0, axes=AX, mode=m, cval=c, backend="cpu"),
                      lambda v, m, c: ndi.gaussian_filter(v, 3.0, mode=m, cval=c)),
    "sobel_magnitude": (lambda x, m, c: tf.gradient_magnitude(x, operator="sobel", axes=AX, mode=m, cval=c,
                                                              backend="cpu"),
                        _sobel_mag),
    "laplace": (lambda x, m, c: tf.laplace(x, axes=AX, mode=m, cval=c, backend="cpu"),
                lambda v, m, c: ndi.laplace(v, mode=m, cval=c)),
    "uniform": (lambda x, m, c: tf.uniform_filter(x, size=(3, 4, 5), axes=AX, mode=m, cval=c, backend="cpu"),
                lambda v, m, c: ndi.uniform_filter(v, size=(3, 4, 5), mode=m, cval=c)),
    "gaussian_laplace": (lambda x, m, c: tf.gaussian_laplace(x, 1.2, axes=AX, mode=m, cval=c, backend="cpu"),
                         lambda v, m, c: ndi.gaussian_laplace(v, 1.2, mode=m, cval=c)),
    "gaussian_gradient_magnitude": (
        lambda x, m, c: tf.gaussian_gradient_magnitude(x, 1.1, axes=AX, mode=m, cval=c, backend="cpu"),
        lambda v, m, c: ndi.gaussian_gradient_magnitude(v, 1.1, mode=m, cval=c)),
}

#: SciPy's generic_gradient_magnitude / generic_laplace hand the derivative along axis ``i`` the one
#: mode ``modes[i]`` for every axis; torchfilters gives every pass its own axis's mode
_ONE_MODE_PER_TERM = ("gaussian_laplace", "gaussian_gradient_magnitude")

SHAPES = [(2, 5, 6, 7), (1, 1, 1, 1), (2, 2, 1, 3), (1, 3, 2, 9), (7, 2, 1), (1, 19, 12, 10), (1, 26, 27, 40)]


def _check(name, x, mode, cval, rtol=1e-10, atol=1e-10):
    ours, ref = OPS[name]
    y = ours(x, mode, cval)
    want = slices(lambda v: ref(v, mode, cval), x.double().numpy())
    np.testing.assert_allclose(y.double().numpy(), want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("mode", MODES + (MIX,), ids=str)
@pytest.mark.parametrize("name", sorted(OPS))
def test_forward_matches_scipy(name, mode, no_reference):
    if isinstance(mode, tuple) and name in _ONE_MODE_PER_TERM:
        pytest.skip("SciPy runs each axis's term of this op with that axis's mode on every axis")
    torch.manual_seed(0)
    for shape in SHAPES:
        x = torch.randn(shape, dtype=torch.float64)
        _check(name, x, mode, CVAL)


def _deriv_oracle(v, q, smooth, mode, cval):
    """SciPy's ``sobel`` order for any smoothing: the derivative along ``q`` first, then the
    smoothing along the other axes in order, each pass padding its own input."""
    m = mode if isinstance(mode, tuple) else (mode,) * 3
    out = ndi.correlate1d(v, [-1.0, 0.0, 1.0], axis=q, mode=m[q], cval=cval)
    for a in range(3):
        if a != q:
            out = ndi.correlate1d(out, smooth, axis=a, mode=m[a], cval=cval)
    return out


@pytest.mark.parametrize("operator,smooth", [("sobel", [1.0, 2.0, 1.0]), ("scharr", [3.0, 10.0, 3.0])])
def test_gradient_components(operator, smooth, no_reference):
    torch.manual_seed(1)
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    for mode in MODES + (MIX,):
        g = tf.gradient(x, operator=operator, axes=AX, mode=mode, cval=CVAL, backend="cpu")
        assert g.shape == (2, 3, 4, 5, 6)
        for q in range(3):
            want = slices(lambda v: _deriv_oracle(v, q, smooth, mode, CVAL), x.numpy())
            np.testing.assert_allclose(g[:, q].numpy(), want, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("modes", [("wrap", "nearest"), ("constant", "reflect"), ("mirror", "constant")])
def test_two_axes_per_axis_modes(modes, no_reference):
    """A 2-D spec whose axes have different modes runs as volumes of depth 1."""
    torch.manual_seed(2)
    x = torch.randn(3, 2, 7, 9, dtype=torch.float64)
    y = tf.gaussian_filter(x, (1.3, 2.5), mode=modes, cval=CVAL, backend="cpu")
    want = ndi.gaussian_filter(x.numpy(), (1.3, 2.5), mode=modes, cval=CVAL, axes=(-2, -1))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-10, atol=1e-10)
    m = tf.gradient_magnitude(x, operator="sobel", mode=modes, cval=CVAL, backend="cpu")
    flat = x.numpy().reshape(-1, 7, 9)
    want = np.stack([np.sqrt(sum(ndi.sobel(v, axis=a, mode=modes, cval=CVAL) ** 2 for a in (0, 1))) for v in flat])
    want = want.reshape(x.shape)
    np.testing.assert_allclose(m.numpy(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", MODES + (MIX, ("wrap", "reflect", "nearest")))
def test_paired_passes_give_scipys_bits(mode, no_reference):
    """Every row of a symmetric or antisymmetric pass -- in a register-blocked run or not, at a
    border or not -- is summed in SciPy's order: float64 Gaussians (and their derivatives),
    a Sobel derivative along the first axis and Laplacians of volumes (and of two axes with
    per-axis modes) are SciPy's bits (``constant``: with ``cval = 0``; a non-zero ``cval`` is a correction added after the
    sum, to rounding)."""
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((2, 19, 18, 21)))
    x[1, :4] = -1.0  # equal pairs: a derivative's zero keeps SciPy's sign
    xn = x.numpy()

    def bits(got, ref):
        return np.array_equal(got, ref) and np.array_equal(np.signbit(got), np.signbit(ref))

    for sigma, order in ((1.0, 0), ((2.0, 0.7, 1.4), 0), (1.2, (0, 1, 0)), ((0.8, 1.5, 1.1), (1, 0, 2))):
        got = tf.gaussian_filter(x, sigma, order=order, mode=mode, axes=AX, backend="cpu").numpy()
        ref = np.stack([ndi.gaussian_filter(v, sigma, order=order, mode=mode) for v in xn])
        assert bits(got, ref), (sigma, order, np.abs(got - ref).max())
    # the engine runs the passes in axis order, SciPy's sobel the derivative first: the same
    # order (and so the same bits) for the derivative along the first axis
    got = tf.sobel(x, axis=-3, mode=mode, axes=AX, backend="cpu").numpy()
    assert bits(got, np.stack([ndi.sobel(v, 0, mode=mode) for v in xn]))
    got = tf.laplace(x, mode=mode, axes=AX, backend="cpu").numpy()
    assert np.array_equal(got, np.stack([ndi.laplace(v, mode=mode) for v in xn]))
    if isinstance(mode, str):  # two of three axes (SciPy's axes= call smooths the others too): per slice
        got = tf.gaussian_laplace(x, (1.1, 0.8), mode=mode, axes=(-3, -1), backend="cpu").numpy()
        ref = np.stack([np.stack([ndi.gaussian_laplace(xn[b, :, j, :], (1.1, 0.8), mode=mode) for j in range(18)], 1)
                        for b in range(2)])
        assert np.array_equal(got, ref)


def _count_launches(monkeypatch, kernel):
    """``{"launches": n}``, counting the calls of the volume module's ``kernel`` from now on."""
    n = {"launches": 0}
    real = getattr(volume, kernel)

    def counted(*args):
        n["launches"] += 1
        return real(*args)

    monkeypatch.setattr(volume, kernel, counted)
    return n


@pytest.fixture
def direct_runs(monkeypatch):
    """Counts the launches of the direct 3x3x3 gradient kernel (``volume_direct``)."""
    return _count_launches(monkeypatch, "_k_grad3")


@pytest.mark.parametrize("mode", MODES + (MIX, ("nearest", "reflect", "wrap")), ids=str)
def test_3x3x3_gradients_give_scipys_bits(mode, direct_runs, no_reference):
    """The direct path runs every component's passes in SciPy's order (the derivative first):
    float64 ``sobel`` / ``prewitt`` components of volumes are SciPy's bits along every axis, in
    every mode (``constant`` with ``cval = 0``), on sizes 1, 2 and odd, signs of zero included;
    the magnitude is the correctly rounded ``sqrt`` of their sum of squares."""
    rng = np.random.default_rng(8)

    def bits(got, ref):
        return np.array_equal(got, ref) and np.array_equal(np.signbit(got), np.signbit(ref))

    for shape in ((2, 11, 19, 21), (1, 1, 3, 2), (3, 2, 1, 5), (1, 9, 12, 40)):
        x = torch.from_numpy(rng.standard_normal(shape))
        x[0, :1] = -1.0  # equal pairs
        xn = x.numpy()
        for op in ("sobel", "prewitt"):
            g = tf.gradient(x, operator=op, axes=AX, mode=mode, backend="cpu").numpy()
            for q in range(3):
                ref = np.stack([getattr(ndi, op)(v, q, mode=mode) for v in xn])
                assert bits(g[:, q], ref), (shape, op, q, np.abs(g[:, q] - ref).max())
            m = tf.gradient_magnitude(x, operator=op, axes=AX, mode=mode, backend="cpu").numpy()
            assert np.array_equal(m, np.sqrt(g[:, 0] * g[:, 0] + g[:, 1] * g[:, 1] + g[:, 2] * g[:, 2]))
        # axes in other orders: the components follow them (mode: per axis of ``axes``), and the
        # magnitude sums their squares in that order (the last term: the y-, then the z-component)
        for perm in ((-1, -3, -2), (-2, -1, -3)):
            g = tf.gradient(x, operator="sobel", axes=perm, mode=mode, backend="cpu").numpy()
            md = mode if isinstance(mode, str) else tuple(mode[perm.index(a)] for a in AX)
            for k, a in enumerate(perm):
                assert bits(g[:, k], np.stack([ndi.sobel(v, a + 3, mode=md) for v in xn])), (shape, perm, k)
            m = tf.gradient_magnitude(x, operator="sobel", axes=perm, mode=mode, backend="cpu").numpy()
            assert np.array_equal(m, np.sqrt(g[:, 0] * g[:, 0] + g[:, 1] * g[:, 1] + g[:, 2] * g[:, 2]))
    assert direct_runs["launches"] >= 24


@pytest.mark.parametrize("mode", ("reflect", MIX))
def test_3x3x3_normalized_gradients(mode, direct_runs):
    """``normalized=True`` scales the last smoothing pass alone: the direct path runs it too, in
    SciPy's order (``correlate1d``: the derivative, then the smoothings, the last scaled)."""
    x = torch.from_numpy(np.random.default_rng(10).standard_normal((2, 6, 7, 9)))
    m = mode if isinstance(mode, tuple) else (mode,) * 3
    for op, smooth in (("sobel", [1.0, 2.0, 1.0]), ("scharr", [3.0, 10.0, 3.0])):
        last = [w / (2 * sum(smooth) ** 2) for w in smooth]
        before = direct_runs["launches"]
        g = tf.gradient(x, operator=op, axes=AX, mode=mode, normalized=True, backend="cpu").numpy()
        assert direct_runs["launches"] == before + 1
        for q in range(3):
            a, b = (a for a in range(3) if a != q)
            want = []
            for v in x.numpy():
                t = ndi.correlate1d(v, [-1.0, 0.0, 1.0], q, mode=m[q])
                want.append(ndi.correlate1d(ndi.correlate1d(t, smooth, a, mode=m[a]), last, b, mode=m[b]))
            assert np.array_equal(g[:, q], np.stack(want)), (op, q)


def test_3x3x3_constant_mode_with_negative_zero_cval(direct_runs):
    """``cval = -0.0`` pads with -0.0, not the zero padding the direct path runs: the general
    engine does, whichever of ``+0.0`` and ``-0.0`` ran first (a spec with ``-0.0`` equals one with
    ``+0.0``: the plan cache keys on the sign too)."""
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((5, 6, 7)))
    want = np.stack([ndi.sobel(x.numpy(), q, mode="constant") for q in range(3)])
    for cval in (-0.0, 0.0, -0.0):
        before = direct_runs["launches"]
        g = tf.gradient(x, operator="sobel", axes=AX, mode="constant", cval=cval, backend="cpu")
        assert (direct_runs["launches"] > before) == (cval == 0.0 and math.copysign(1.0, cval) > 0)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["central 3 axes", "sobel 3 axes", "sobel per-axis modes", "central planar"])
def test_magnitude_backward_with_an_infinite_component(case):
    """Where a component is infinite the magnitude is inf and its gradient ``g * y_k / |y|`` is 0
    for the finite components and NaN (``0 * inf``) for the infinite one, as in the reference --
    not NaN for all (the rescaled formula divides by ``max |y_k| = inf``)."""
    op, kind = case.split(" ", 1)
    x = torch.zeros(7, 7, 7, dtype=torch.float64)
    x[3, 3, 3] = float("inf")
    kw = {"3 axes": dict(axes=AX), "per-axis modes": dict(mode=("wrap", "reflect")), "planar": {}}[kind]
    grads = []
    for backend in ("cpu", "reference"):
        xg = x.clone().requires_grad_()
        y = tf.gradient_magnitude(xg, operator=op, backend=backend, **kw)
        (g,) = torch.autograd.grad(y, xg, torch.ones_like(y))
        grads.append(g)
    assert torch.equal(grads[0].isnan(), grads[1].isnan()), int(grads[0].isnan().sum())
    ok = ~grads[1].isnan()
    torch.testing.assert_close(grads[0][ok], grads[1][ok], rtol=1e-12, atol=1e-12)


def test_magnitude_at_the_float32_overflow_edge():
    """Components whose float32 sum of squares is just finite when each square is rounded (the
    reference's sum), but inf with fused multiply-adds: the volume engine sums as the reference
    does, so the rescaling test and the rescaled formula agree (was: inf, gradient 0)."""
    a, b, c = 1.3127755e19, 1.0397376e19, 7.7355651e18
    e = torch.zeros(3, 3, 3)
    e[1, 1, 2] = 1.0
    w = float(tf.gradient(e, operator="central", axes=AX)[2, 1, 1, 1])
    x = torch.zeros(5, 5, 5)
    x[3, 2, 2], x[2, 3, 2], x[2, 2, 3] = a / w, b / w, c / w
    m = torch.zeros(5, 5, 5)
    m[2, 2, 2] = 1.0
    out = []
    for backend in ("cpu", "reference"):
        xg = x.clone().requires_grad_()
        y = tf.gradient_magnitude(xg, operator="central", axes=AX, backend=backend)
        (g,) = torch.autograd.grad(y, xg, m)
        out.append((y[2, 2, 2].detach(), g[3, 2, 2]))
    assert math.isfinite(out[0][0]) and torch.equal(out[0][0], out[1][0])
    torch.testing.assert_close(out[0][1], out[1][1], rtol=1e-6, atol=0)


def test_3x3x3_gradient_magnitude_cancels_before_it_smooths(direct_runs):
    """Rows alternating +-3e38 in float32 (wrap: no border breaks the pattern): each derivative
    cancels before any smoothing (SciPy's order), so the magnitude is SciPy's 0, with gradient 0
    -- not ``inf - inf``.  Large finite components do not overflow the sum of squares."""
    x = torch.zeros(2, 6, 8, 4)  # (even sizes: wrap keeps the pattern)
    x[..., ::2, :] = 3e38
    x[..., 1::2, :] = -3e38
    for axis in (-3, -1):
        xt = x.transpose(-2, axis).contiguous().requires_grad_()
        y = tf.gradient_magnitude(xt, operator="sobel", axes=AX, mode="wrap", backend="cpu")
        assert torch.equal(y, torch.zeros_like(y))
        (g,) = torch.autograd.grad(y, xt, torch.ones_like(y))
        assert torch.equal(g, torch.zeros_like(g))
    x = torch.from_numpy(np.random.default_rng(9).standard_normal((2, 5, 6, 7))).float()
    y = tf.gradient_magnitude(x * 2.0**100, operator="scharr", axes=AX, backend="cpu")
    want = tf.gradient_magnitude(x.double(), operator="scharr", axes=AX, backend="reference") * 2.0**100
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=0)
    assert direct_runs["launches"] >= 3


def test_per_axis_mode_gaussian_laplace_is_the_references_bits():
    """SciPy runs each term of ``gaussian_laplace`` with one axis's mode on every axis; the
    reference engine (which sums as SciPy does) is the oracle for per-axis modes."""
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((2, 15, 17)))
    for mode in (("reflect", "wrap"), ("constant", "mirror")):
        got = tf.gaussian_laplace(x, 1.1, mode=mode, backend="cpu")
        assert torch.equal(got, tf.gaussian_laplace(x, 1.1, mode=mode, backend="reference")), mode


def test_two_of_three_axes(no_reference):
    """``axes=(-3, -1)``: a 3-axis spec that reads nothing along -2, with per-axis modes."""
    torch.manual_seed(3)
    x = torch.randn(2, 5, 4, 6, dtype=torch.float64)
    y = tf.gaussian_filter(x, (1.0, 2.0), axes=(-3, -1), mode=("nearest", "wrap"), backend="cpu")
    want = ndi.gaussian_filter(x.numpy(), (1.0, 2.0), axes=(-3, -1), mode=("nearest", "wrap"))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-10, atol=1e-10)


@given(d=st.integers(1, 6), h=st.integers(1, 6), w=st.integers(1, 20), sigma=st.floats(0.3, 4.0),
       mode=st.sampled_from(MODES) | st.tuples(*[st.sampled_from(MODES)] * 3),
       op=st.sampled_from(sorted(OPS)))
def test_sampled(d, h, w, sigma, mode, op):
    torch.manual_seed(d * 100 + h * 10 + w)
    x = torch.randn(2, d, h, w, dtype=torch.float64)
    y = tf.gaussian_filter(x, sigma, axes=AX, mode=mode, cval=CVAL, backend="cpu")
    want = slices(lambda v: ndi.gaussian_filter(v, sigma, mode=mode, cval=CVAL), x.numpy())
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-10, atol=1e-10)
    if not (isinstance(mode, tuple) and op in _ONE_MODE_PER_TERM):
        _check(op, x, mode, CVAL)


# ----------------------------------------------------------------- dtypes, layouts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["gaussian", "sobel_magnitude", "laplace", "gaussian_gradient_magnitude"])
def test_low_precision(name, dtype, no_reference):
    torch.manual_seed(4)
    x = torch.rand(2, 5, 6, 17).to(dtype)
    ours, ref = OPS[name]
    y = ours(x, "reflect", 0.0)
    assert y.dtype == dtype
    want = slices(lambda v: ref(v, "reflect", 0.0), x.double().numpy())
    eps = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    scale = np.abs(want).max()
    np.testing.assert_allclose(y.double().numpy(), want, rtol=2 * eps, atol=4 * eps * scale)


def test_layouts_and_out(no_reference):
    torch.manual_seed(5)
    base = torch.randn(2, 3, 6, 7, 10, dtype=torch.float64)
    want = tf.gaussian_filter(base.contiguous(), 1.2, axes=AX, backend="cpu")
    views = {
        "channels_last_3d": base.contiguous(memory_format=torch.channels_last_3d),
        "sliced": torch.randn(2, 3, 8, 9, 10, dtype=torch.float64)[:, :, 1:7, 2:9],
        "transposed": base.transpose(0, 1).contiguous().transpose(0, 1),
        "strided_rows": torch.randn(2, 3, 6, 7, 20, dtype=torch.float64)[..., ::2],
        "permuted_spatial": base.permute(0, 1, 2, 4, 3).contiguous().permute(0, 1, 2, 4, 3),
    }
    views["sliced"][...] = base
    views["strided_rows"][...] = base
    for name, v in views.items():
        y = tf.gaussian_filter(v, 1.2, axes=AX, backend="cpu")
        torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12, msg=name)
    # out=: contiguous (in place), non-contiguous (through a temporary)
    out = torch.empty_like(base)
    r = tf.gaussian_filter(base, 1.2, axes=AX, backend="cpu", out=out)
    assert r is out
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    out = torch.empty(2, 3, 6, 10, 7, dtype=torch.float64).transpose(-1, -2)
    tf.gaussian_filter(base, 1.2, axes=AX, backend="cpu", out=out)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    g = tf.gradient(base, operator="sobel", axes=AX, backend="cpu")
    out = torch.empty(3, 2, 3, 6, 7, 10, dtype=torch.float64).permute(1, 2, 0, 3, 4, 5)
    tf.gradient(base, operator="sobel", axes=AX, backend="cpu", out=out)
    torch.testing.assert_close(out, g, rtol=1e-12, atol=1e-12)
    # float32 out of a float32 input, written in place
    x32 = base.float()
    o32 = torch.empty_like(x32)
    tf.gradient_magnitude(x32, operator="sobel", axes=AX, backend="cpu", out=o32)
    torch.testing.assert_close(o32, tf.gradient_magnitude(base, operator="sobel", axes=AX).float(), rtol=1e-5,
                               atol=1e-5)


def test_empty():
    for shape in [(0, 4, 5, 6), (2, 0, 5, 6), (2, 3, 5, 0)]:
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        y = tf.gradient_magnitude(x, operator="sobel", axes=AX, backend="cpu")
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape
        g = tf.gradient(x.detach(), operator="sobel", axes=AX, backend="cpu")
        assert g.shape == shape[:-3] + (3,) + shape[-3:]


# ----------------------------------------------------------------------- gradients


GRAD_OPS = {
    "gaussian": lambda x, m, b: tf.gaussian_filter(x, (0.8, 1.4, 1.0), axes=AX, mode=m, cval=CVAL, backend=b),
    "gaussian_wide": lambda x, m, b: tf.gaussian_filter(x, 2.0, axes=AX, mode=m, backend=b),
    "gradient": lambda x, m, b: tf.gradient(x, operator="sobel", axes=AX, mode=m, cval=CVAL, backend=b),
    "sobel_magnitude": lambda x, m, b: tf.gradient_magnitude(x, operator="sobel", axes=AX, mode=m, backend=b),
    "gaussian_gradient_magnitude": lambda x, m, b: tf.gaussian_gradient_magnitude(x, 0.9, axes=AX, mode=m,
                                                                                 backend=b),
    "laplace": lambda x, m, b: tf.laplace(x, axes=AX, mode=m, cval=CVAL, backend=b),
    "uniform": lambda x, m, b: tf.uniform_filter(x, size=(2, 3, 4), axes=AX, mode=m, backend=b),
}


@pytest.mark.parametrize("mode", MODES + (MIX,), ids=str)
@pytest.mark.parametrize("name", sorted(GRAD_OPS))
def test_gradcheck(name, mode, no_reference):
    torch.manual_seed(6)
    for shape in [(1, 3, 4, 5), (2, 1, 2, 3)]:
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda t: GRAD_OPS[name](t, mode, "cpu"), (x,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", sorted(GRAD_OPS))
def test_backward_matches_reference(name):
    torch.manual_seed(7)
    x = torch.randn(1, 26, 27, 21, dtype=torch.float64, requires_grad=True)
    for mode in MODES + (MIX,):
        yc = GRAD_OPS[name](x, mode, "cpu")
        g = torch.randn_like(yc)
        (gc,) = torch.autograd.grad(yc, x, g)
        (gr,) = torch.autograd.grad(GRAD_OPS[name](x, mode, "reference"), x, g)
        torch.testing.assert_close(gc, gr, rtol=1e-10, atol=1e-10)


def test_magnitude_gradient_zero_on_flat(no_reference):
    x = torch.ones(1, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    y = tf.gradient_magnitude(x, operator="sobel", axes=AX, mode="nearest", backend="cpu")
    assert (y == 0).all()
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad == 0).all()
    x = torch.ones(1, 4, 5, 6, requires_grad=True)  # float32, through the same kernel
    tf.gradient_magnitude(x, operator="sobel", axes=AX, mode="reflect", backend="cpu").sum().backward()
    assert (x.grad == 0).all()


def test_low_precision_backward(no_reference):
    torch.manual_seed(8)
    x64 = torch.randn(2, 4, 5, 9, dtype=torch.float64)
    g64 = torch.randn(2, 4, 5, 9, dtype=torch.float64)
    ref = None
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        x = x64.to(dtype).detach().clone().requires_grad_()
        y = tf.gaussian_filter(x, 1.0, axes=AX, mode="mirror", backend="cpu")
        y.backward(g64.to(dtype))
        assert x.grad.dtype == dtype
        if ref is None:
            ref = x.grad
        else:
            tol = 1e-5 if dtype == torch.float32 else 3e-2
            torch.testing.assert_close(x.grad.double(), ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------------- fallbacks


@pytest.mark.parametrize("kw", [{}, {"normalized": True}, {"keep_border": True}, {"normalized": True, "keep_border": True},
                                {"sigma": (0.8, 1.6, 0.5)}], ids=str)
@pytest.mark.parametrize("mode", ["reflect", "constant", MIX], ids=str)
def test_selective_blur(kw, mode):
    """3-D selective blur: the blur and its transpose on the volume engine; values and gradients
    equal the reference engine's."""
    torch.manual_seed(10)
    kw = {"sigma": 1.0, **kw}
    for shape in [(2, 5, 6, 7), (1, 10, 9, 11), (1, 1, 2, 3)]:
        x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
        for mask in (None, torch.rand(shape[-3:]) > 0.3):
            args = dict(mask=mask, axes=AX, mode=mode, cval=CVAL, **kw)
            with pytest.MonkeyPatch.context() as mp:
                for name in ("blur_compute", "blur_vjp", "filter_compute", "filter_vjp"):
                    mp.setattr(reference, name, _boom)
                yc = tf.selective_blur(x, 0.1, backend="cpu", **args)
                g = torch.randn_like(yc)
                (gc,) = torch.autograd.grad(yc, x, g)
            yr = tf.selective_blur(x, 0.1, backend="reference", **args)
            (gr,) = torch.autograd.grad(yr, x, g)
            torch.testing.assert_close(yc, yr, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(gc, gr, rtol=1e-12, atol=1e-12)


def _boom(*args, **kwargs):
    raise AssertionError("the reference engine ran")


def test_what_falls_back():
    """Dense 3-D stencils go to the reference engine (and are right)."""
    torch.manual_seed(9)
    x = torch.randn(1, 4, 5, 6, dtype=torch.float64)
    w = np.random.default_rng(0).standard_normal((3, 2, 3))
    y = tf.correlate(x, w.tolist(), axes=AX, mode="wrap", backend="cpu")
    np.testing.assert_allclose(y.numpy()[0], ndi.correlate(x.numpy()[0], w, mode="wrap"), rtol=1e-10, atol=1e-10)
    st = sep((-3, -1, (1.0, 0.0, -1.0)))
    assert volume.runs(FilterSpec("reflect", 0.0, "magnitude", (st, st), 3))
    assert not volume.runs(FilterSpec("reflect", 0.0, "direction", (st, st), 3))
    assert not volume.runs(FilterSpec("constant", float("nan"), "stack", (st,), 3))
    assert not volume.runs(FilterSpec("reflect", 0.0, "stack", (sep((-1, -1, (1.0, 1.0)), (-1, -1, (1.0, 1.0))),), 3))


def test_no_reference_fixture_catches_a_fallback(no_reference):
    x = torch.randn(1, 3, 3, 3, dtype=torch.float64)
    with pytest.raises(AssertionError, match="reference engine ran"):
        # (constant mode with a NaN cval: the volume kernels leave it to the reference)
        tf.correlate(x, np.ones((2, 2, 2)).tolist(), axes=AX, mode="constant", cval=float("nan"), backend="cpu")


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_selective_blur_dtypes_layouts(dtype, normalized):
    """Both variants: low precision (the threshold compared in the input's dtype), non-contiguous
    inputs, ``out=``, a broadcast mask, and a 2-D spec with per-axis modes (volumes of depth 1)."""
    torch.manual_seed(11)
    base = torch.randn(2, 3, 6, 7, 20)
    x = base[..., ::2].to(dtype)  # rows of stride 2
    ref = tf.selective_blur(x.double(), 0.25, sigma=1.0, axes=AX, mode="mirror", normalized=normalized, backend="reference")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("blur_compute", "blur_vjp"):
            mp.setattr(reference, name, _boom)
        y = tf.selective_blur(x, 0.25, sigma=1.0, axes=AX, mode="mirror", normalized=normalized, backend="cpu")
        out = torch.empty(2, 3, 6, 10, 7, dtype=dtype).transpose(-1, -2)
        tf.selective_blur(x, 0.25, sigma=1.0, axes=AX, mode="mirror", normalized=normalized, backend="cpu", out=out)
        mask = torch.rand(6, 7, 10) > 0.5
        ym = tf.selective_blur(x, mask=mask, sigma=1.0, axes=AX, keep_border=True, normalized=normalized, backend="cpu")
        x2 = x.float().requires_grad_()
        y2 = tf.selective_blur(x2, 0.0, sigma=(1.0, 2.0), mode=("wrap", "nearest"), normalized=normalized, backend="cpu")
        g = torch.randn_like(y2)
        (g2,) = torch.autograd.grad(y2, x2, g)
    tol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    assert y.dtype == dtype
    # the threshold is rounded to the dtype, as torch compares; values within its rounding of SciPy's
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * 4)
    torch.testing.assert_close(out, y, rtol=0, atol=0)
    rm = tf.selective_blur(x.double(), mask=mask, sigma=1.0, axes=AX, keep_border=True, normalized=normalized, backend="reference")
    torch.testing.assert_close(ym.double(), rm, rtol=tol, atol=tol * 4)
    xr = x.double().requires_grad_()
    yr = tf.selective_blur(xr, 0.0, sigma=(1.0, 2.0), mode=("wrap", "nearest"), normalized=normalized, backend="reference")
    (gr,) = torch.autograd.grad(yr, xr, g.double())
    torch.testing.assert_close(y2.double(), yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g2.double(), gr, rtol=1e-5, atol=1e-5)


def test_no_kernel_variant_per_shape_or_spec():
    """One compiled signature per compute dtype, whatever the shape, spec, mode or epilogue."""
    from torchfilters.backends.cpu.warmup import _kernels

    def count():
        return sum(len(k.overloads) for k in _kernels())

    calls = [
        lambda x: tf.gradient_magnitude(x, operator="sobel", axes=AX),
        lambda x: tf.gaussian_filter(x, (1.0, 2.0, 0.5), axes=AX, mode=("wrap", "constant", "nearest"), cval=1.0),
        lambda x: tf.gradient(x, axes=AX, mode="mirror"),
        lambda x: tf.laplace(x, axes=AX),
        lambda x: tf.selective_blur(x, 0.2, sigma=1.0, axes=AX, keep_border=True),
    ]
    for dtype in (torch.float32, torch.float64):
        for call in calls:  # every kernel of this dtype compiled (or loaded) once
            x = torch.rand(1, 9, 10, 11, dtype=dtype, requires_grad=True)
            call(x).sum().backward()
        before = count()
        for shape in [(2, 3, 4, 5), (1, 17, 2, 33), (3, 1, 1, 1), (1, 2, 40, 3)]:
            for call in calls:
                x = torch.rand(shape, dtype=dtype, requires_grad=True)
                call(x).sum().backward()
        assert count() == before


@pytest.fixture
def dense_runs(monkeypatch):
    """Counts the launches of the dense volume kernel (``volume_dense``)."""
    return _count_launches(monkeypatch, "_k_dense3")


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_dense_3d_stencils_give_scipys_bits(mode, dense_runs, no_reference):
    """``correlate`` / ``convolve`` with a 3-D kernel run on the dense volume kernel: each
    output's taps summed from +0.0 in footprint order (SciPy's ``NI_Correlate``), so float64 is
    SciPy's bits, signs of zero included, on sizes 1, 2 and odd, kernels larger than the axis,
    origins, ``cval``; a NaN under a zero tap stays outside the footprint, as in SciPy."""
    rng = np.random.default_rng(11)
    cases = [((2, 5, 6, 7), (3, 3, 3), 0), ((1, 4, 1, 9), (2, 3, 4), (0, 1, -1)), ((1, 3, 2, 1), (5, 1, 3), 0),
             ((1, 2, 8, 19), (3, 2, 5), (1, 0, 1)), ((1, 2, 3, 75), (2, 3, 3), 0)]  # (75: blocks of 4 vectors)
    for shape, k, origin in cases:
        x = rng.standard_normal(shape)
        x[0, 0, 0, :2] = -0.0
        w = rng.standard_normal(k)
        w.flat[1] = 0.0
        for op in ("correlate", "convolve"):
            got = getattr(tf, op)(torch.from_numpy(x), w.tolist(), axes=AX, mode=mode, cval=CVAL, origin=origin,
                                  backend="cpu").numpy()
            want = np.stack([getattr(ndi, op)(v, w, mode=mode, cval=CVAL, origin=origin) for v in x])
            assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)), (op, shape, k)
    # a NaN read only by the zero tap (offset (-1, -1, 0) of the centre): SciPy skips that tap
    x = np.zeros((1, 3, 3, 3))
    x[0, 0, 0, 1] = np.nan
    w = np.ones((3, 3, 3))
    w[0, 0, 1] = 0.0
    got = tf.correlate(torch.from_numpy(x), w.tolist(), axes=AX, mode=mode, backend="cpu").numpy()
    want = ndi.correlate(x[0], w, mode=mode)[None]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert dense_runs["launches"] == 2 * len(cases) + 1
    # the backward is one launch of the same kernel: A^T g against the matrix of SciPy's
    # correlate (its columns: the responses to unit impulses), on small volumes
    for shape, k, origin in [((4, 3, 5), (3, 3, 3), 0), ((2, 1, 6), (2, 3, 4), (0, 1, -1)), ((5, 2, 1), (3, 2, 5), (1, 0, 2)),
                             ((2, 2, 71), (2, 2, 3), 0)]:
        w = rng.standard_normal(k)
        w.flat[2] = 0.0
        n = math.prod(shape)
        cols = [ndi.correlate(np.eye(n)[i].reshape(shape), w, mode=mode, cval=0.0, origin=origin).ravel() for i in range(n)]
        A = np.stack(cols, axis=1)
        g = rng.standard_normal(shape)
        xr = torch.from_numpy(rng.standard_normal((1,) + shape)).requires_grad_()
        y = tf.correlate(xr, w.tolist(), axes=AX, mode=mode, cval=CVAL, origin=origin, backend="cpu")
        (got,) = torch.autograd.grad(y, xr, torch.from_numpy(g[None]))
        assert np.allclose(got.numpy().ravel(), A.T @ g.ravel(), rtol=1e-13, atol=1e-13), (shape, k, origin)
    assert dense_runs["launches"] == 2 * len(cases) + 1 + 8


def test_dense_stencils_layouts_dtypes_out_and_backward(dense_runs):
    """The dense volume kernel on strided and channels_last_3d inputs, float32 and bfloat16,
    ``out=``, a 2-D kernel with per-axis modes (a volume of one plane), forward and backward
    (against the reference; gradcheck)."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((3, 2, 3)).tolist()
    x = torch.from_numpy(rng.standard_normal((2, 3, 6, 7, 8)))
    for t in (x.transpose(-1, -3)[..., ::2, :, :], x.to(memory_format=torch.channels_last_3d)):
        got = tf.correlate(t, w, axes=AX, mode="mirror", backend="cpu")
        assert torch.equal(got, tf.correlate(t.contiguous(), w, axes=AX, mode="mirror", backend="cpu"))
        assert torch.allclose(got, tf.correlate(t, w, axes=AX, mode="mirror", backend="reference"), rtol=0, atol=1e-14)
    xw = torch.from_numpy(rng.standard_normal((1, 2, 3, 4, 70)))  # float32: blocks of 4 vectors
    for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        got = tf.correlate(xw.to(dt), w, axes=AX, mode="reflect", backend="cpu")
        ref = tf.correlate(xw.to(dt), w, axes=AX, mode="reflect", backend="reference")
        assert got.dtype == dt and torch.allclose(got.double(), ref.double(), rtol=tol, atol=tol)
        got = tf.correlate(x.to(dt), w, axes=AX, mode="wrap", backend="cpu")
        ref = tf.correlate(x.to(dt), w, axes=AX, mode="wrap", backend="reference")
        assert got.dtype == dt and torch.allclose(got.double(), ref.double(), rtol=tol, atol=tol)
    out = torch.full((2, 3, 8, 7, 6), float("nan"), dtype=torch.float64).transpose(-1, -3)
    assert tf.correlate(x, w, axes=AX, mode="nearest", out=out, backend="cpu") is out
    assert torch.equal(out, tf.correlate(x, w, axes=AX, mode="nearest", backend="cpu"))
    w2 = rng.standard_normal((3, 4)).tolist()
    x2 = x[0, 0]
    got = tf.correlate(x2, w2, mode=("wrap", "constant"), cval=-2.0, backend="cpu")
    ref = tf.correlate(x2, w2, mode=("wrap", "constant"), cval=-2.0, backend="reference")
    assert torch.allclose(got, ref, rtol=0, atol=1e-14)
    for b in (x2, x.to(memory_format=torch.channels_last_3d)):
        grads = []
        for backend in ("cpu", "reference"):
            t = b.clone().requires_grad_()
            kw = dict(mode=("wrap", "nearest")) if b.dim() == 2 else dict(axes=AX, mode="mirror")
            y = tf.correlate(t, w2 if b.dim() == 2 else w, backend=backend, **kw)
            (gr,) = torch.autograd.grad(y, t, torch.ones_like(y).cumsum(-1))
            grads.append(gr)
        assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-12)
        grads = []
        for backend in ("cpu", "reference"):
            t = b.float().clone().requires_grad_()
            y = tf.correlate(t, w2 if b.dim() == 2 else w, backend=backend, **kw)
            (gr,) = torch.autograd.grad(y.sum(), t)
            grads.append(gr)
        assert grads[0].dtype == torch.float32 and torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-5)
    n = dense_runs["launches"]
    assert n >= 11
    xs = torch.from_numpy(rng.standard_normal((1, 3, 4, 3))).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: tf.correlate(t, w, axes=AX, mode="reflect", cval=0.5, backend="cpu"),
                                    (xs,), fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dense_backward_stays_inside_its_rows(dtype, dense_runs):
    """The adjoint's accumulator row is ``kw - 1`` longer than the gradient's; with nothing to
    fold back along x (``constant`` mode, first offset 0) the kernel stores the row's ``W``
    samples only: wider stores wrote into the next row (another thread's) and past the tensor
    (found by review: heap corruption).  Rows whose end falls short of a block of four vectors."""
    rng = np.random.default_rng(13)
    L = 64 // dtype.itemsize  # (lanes of an AVX-512 vector; shorter vectors are covered too)
    for W in (4 * L - 2, 4 * L - 1, 8 * L - 1, 30):
        x = torch.from_numpy(rng.standard_normal((3, 2, 3, W))).to(dtype)
        for call in (lambda t, b: tf.correlate(t, rng2.tolist(), axes=AX, mode="constant", origin=(0, 0, -1), backend=b),
                     lambda t, b: tf.convolve(t, rng2[:, :, :2].tolist(), axes=AX, mode="constant", backend=b)):
            rng2 = np.random.default_rng(W).standard_normal((2, 1, 3))
            g = torch.from_numpy(rng.standard_normal((3, 2, 3, W))).to(dtype)
            grads = []
            for b in ("cpu", "reference"):
                t = x.clone().requires_grad_()
                (gr,) = torch.autograd.grad(call(t, b), t, g)
                grads.append(gr)
            assert torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-5), W
    # nothing past an ``out`` view of the gradient is written (rows of a wider buffer)
    W = 4 * L - 2
    x = torch.from_numpy(rng.standard_normal((1, 2, 2, W))).to(dtype)
    seen = []
    real = volume.filter_backward

    def spy(grad, xx, spec, out=None):
        seen.append(spec)
        return real(grad, xx, spec, out)

    volume.filter_backward = spy
    try:
        t = x.clone().requires_grad_()
        y = tf.correlate(t, np.ones((2, 1, 3)).tolist(), axes=AX, mode="constant", origin=(0, 0, -1), backend="cpu")
        (want,) = torch.autograd.grad(y, t, torch.ones_like(y))
    finally:
        volume.filter_backward = real
    big = torch.full((1, 2, 2, W + 8), float("nan"), dtype=dtype)
    assert real(torch.ones_like(x), x, seen[-1], big[..., :W]) is not None
    assert torch.equal(big[..., :W], want) and bool(big[..., W:].isnan().all())
    assert dense_runs["launches"] >= 17  # (every forward and backward above)


@pytest.mark.parametrize("mode", MODES + (MIX,), ids=str)
def test_one_3x3x3_component_runs_the_direct_path(mode, direct_runs, no_reference):
    """``sobel`` / ``prewitt`` / ``derivative(operator=...)`` of one axis over three axes run on
    the direct kernel (its three components formed in SciPy's order, the one asked for stored):
    float64 is SciPy's bits along every axis (the volume engine's z-first order was an ulp off
    along -2 and -1), and a constant float32 volume of 3e38 gives 0, not NaN (its smoothing
    overflowed before the derivative cancelled)."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 5, 6, 7))
    x[0, :, :2] = -1.0  # equal pairs: signed zeros
    for op in ("sobel", "prewitt"):
        for axis in (-3, -2, -1):
            got = getattr(tf, op)(torch.from_numpy(x), axis, axes=AX, mode=mode, backend="cpu").numpy()
            if isinstance(mode, str):
                want = np.stack([getattr(ndi, op)(v, axis + 3, mode=mode) for v in x])
                assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want)), (op, axis)
            comp = tf.gradient(torch.from_numpy(x), operator=op, axes=AX, mode=mode, backend="cpu").numpy()[:, axis + 3]
            assert np.array_equal(got, comp) and np.array_equal(np.signbit(got), np.signbit(comp)), (op, axis)
    c = torch.full((1, 4, 5, 6), 3e38)
    for axis in (-3, -2, -1):
        for call in (lambda: tf.sobel(c, axis, axes=AX, mode=mode, backend="cpu"),
                     lambda: tf.derivative(c, axis, operator="scharr", axes=AX, mode=mode, backend="cpu")):
            y = call()
            if mode != "constant" and "constant" not in mode:
                assert torch.equal(y, torch.zeros_like(y)), axis
            else:
                assert not bool(y.isnan().any()), axis
    assert direct_runs["launches"] >= 2 * 3 * 2 + 6
