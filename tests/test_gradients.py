"""Gradients: gradcheck in float64 for every op and every mode; finite on flat and step images.

Gradients go through the ``torch.library`` custom ops (the input requires grad),
whose backward runs the engine's explicit adjoint: ``gradcheck`` compares it
with finite differences of the forward.

gradcheck is the expensive check (a Jacobian by finite differences), so the
engine is one more axis of each core grid: every (op, mode) pair is checked on
one engine, and each engine sees every op and every mode (test_cpu_backend
pins the fused engine's backward to the reference's at 1e-12 on every op and
mode); sampled cases add other sizes and the grid-* aliases.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.autograd import gradcheck

import torchfilters as tf
from conftest import (
    BASE_MODES,
    CVAL,
    ENGINES,
    OPERATORS,
    OPS,
    THRESHOLDED,
    away_from,
    base_modes,
    engines,
    examples,
    grid,
    modes,
    rand,
)

OP_NAMES = sorted(OPS)


def _input(shape, name, seed=0):
    x = rand(*shape, seed=seed)
    if name in THRESHOLDED:
        x = away_from(x, 0.0)  # the mask must not flip under finite differences
    return x.requires_grad_(True)


def _check(fn, x):
    assert gradcheck(fn, (x,), eps=1e-6, atol=1e-7, rtol=1e-5, raise_exception=True)


@grid("engine, name, mode", ENGINES, OP_NAMES, BASE_MODES)
def test_gradcheck_every_op_every_mode(engine, name, mode):
    x = _input((2, 1, 5, 6), name)
    _check(lambda t: OPS[name](t, mode=mode, cval=CVAL, backend=engine), x)


@examples(10)
@given(engine=engines, name=st.sampled_from(OP_NAMES), mode=modes, lead=st.integers(1, 2), H=st.integers(1, 6),
       W=st.integers(1, 6), seed=st.integers(0, 100))
def test_gradcheck_sampled(engine, name, mode, lead, H, W, seed):
    # |g| and atan2 have a kink where g = 0, and on images narrower than 3 pixels some modes
    # make g cancel to rounding level, where finite differences mean nothing
    assume(min(H, W) >= 3 or not ("magnitude" in name or "direction" in name))
    x = _input((lead, H, W), name, seed=seed)
    _check(lambda t: OPS[name](t, mode=mode, cval=CVAL, backend=engine), x)


@grid("engine, name, mode", ENGINES, ["correlate", "gradient_magnitude-central", "gaussian_filter",
                                      "selective_blur-normalized"], ["grid-mirror", "grid-constant", "grid-wrap"])
def test_gradcheck_grid_aliases(engine, name, mode):
    x = _input((1, 2, 4, 5), name, seed=1)
    _check(lambda t: OPS[name](t, mode=mode, cval=CVAL, backend=engine), x)


def _big_kernel_ops(H, W):
    """Kernels with a radius larger than the image on both axes."""
    kh, kw = 2 * H + 3, 2 * W + 3
    w = rand(kh, kw, seed=7)
    w1 = rand(2 * W + 4, seed=8)
    wpos = rand(kh, kw, seed=9, low=0.1, high=1.0)
    return {
        "correlate": lambda t, **k: tf.correlate(t, w, **k),
        "convolve": lambda t, **k: tf.convolve(t, w, origin=(1, -1), **k),
        "correlate1d": lambda t, **k: tf.correlate1d(t, w1, -1, **k),
        "gaussian_filter": lambda t, **k: tf.gaussian_filter(t, 2.0, radius=(H + 1, W + 2), **k),
        "gaussian_filter-order": lambda t, **k: tf.gaussian_filter(t, 1.5, order=(2, 1), radius=(H + 2, W + 1), **k),
        "sobel": lambda t, **k: tf.sobel(t, **k),
        "gradient": lambda t, **k: tf.gradient(t, operator="scharr", **k),
        "gradient_magnitude": lambda t, **k: tf.gradient_magnitude(t, operator="prewitt", **k),
        "gaussian_gradient_magnitude": lambda t, **k: tf.gaussian_gradient_magnitude(t, 1.0, radius=(H + 1, W + 1), **k),
        "selective_blur": lambda t, **k: tf.selective_blur(t, 0.0, weights=w, **k),
        "selective_blur-normalized": lambda t, **k: tf.selective_blur(t, 0.0, weights=wpos, normalized=True, **k),
    }


BIG_NAMES = sorted(_big_kernel_ops(1, 1))
ODD_SIZES = ((1, 1), (1, 5), (5, 1), (2, 3))


def _kink(name, hw, mode):
    return name.endswith("magnitude") and hw == (1, 1) and mode != "constant"


@grid("engine, name, hw, mode", ENGINES, BIG_NAMES, ODD_SIZES, BASE_MODES)
def test_gradcheck_odd_sizes_radius_larger_than_image(engine, name, hw, mode):
    if _kink(name, hw, mode):
        pytest.skip("a 1x1 image has zero gradient (a kink of |g|); covered by test_magnitude_gradient_zero_*")
    fn = _big_kernel_ops(*hw)[name]
    x = away_from(rand(2, *hw, seed=3)) if name.startswith("selective") else rand(2, *hw, seed=3)
    x.requires_grad_(True)
    _check(lambda t: fn(t, mode=mode, cval=CVAL, backend=engine), x)


@examples(10)
@given(engine=engines, name=st.sampled_from(BIG_NAMES), hw=st.sampled_from(ODD_SIZES), mode=base_modes)
def test_gradcheck_odd_sizes_radius_larger_than_image_sampled(engine, name, hw, mode):
    assume(not _kink(name, hw, mode))
    test_gradcheck_odd_sizes_radius_larger_than_image(engine, name, hw, mode)


# -------------------------------------------------------- finite everywhere


def _flat(shape, value=0.5):
    return torch.full(shape, value, dtype=torch.float64)


def _step(shape):
    x = torch.zeros(shape, dtype=torch.float64)
    x[..., shape[-1] // 2:] = 1.0
    x[..., shape[-2] // 2:, :] += 0.5
    return x


IMAGES = ("flat", "step", "flat-at-threshold")


@grid("engine, name, mode, image", ENGINES, OP_NAMES, BASE_MODES, IMAGES)
def test_gradients_finite_on_flat_and_step_images(engine, name, mode, image):
    shape = (2, 1, 6, 6)
    x = {"flat": _flat(shape), "step": _step(shape), "flat-at-threshold": _flat(shape, 0.0)}[image]
    for dtype in (torch.float64, torch.float32):
        xx = x.detach().clone().to(dtype).requires_grad_(True)
        y = OPS[name](xx, mode=mode, cval=CVAL, backend=engine)
        assert torch.isfinite(y).all()
        (y * rand(*y.shape, seed=4, dtype=dtype)).sum().backward()
        assert xx.grad.dtype == dtype and xx.grad.shape == xx.shape
        assert torch.isfinite(xx.grad).all(), f"{name} {mode} {image} {dtype}"


@examples(10)
@given(engine=engines, name=st.sampled_from(OP_NAMES), mode=modes, image=st.sampled_from(IMAGES))
def test_gradients_finite_on_flat_and_step_images_sampled(engine, name, mode, image):
    test_gradients_finite_on_flat_and_step_images(engine, name, mode, image)


@pytest.mark.parametrize("mode", BASE_MODES)
@pytest.mark.parametrize("operator", OPERATORS)
def test_magnitude_gradient_zero_on_flat_image(engine, operator, mode):
    """|g| = 0 everywhere (cval equal to the image in constant mode): forward and gradient exactly 0."""
    if mode == "constant" and operator != "central":
        # SciPy's order: the smoothing pass pads the (zero) derivative with cval,
        # so the border is not flat in constant mode (see test_reported_values)
        pytest.skip("not flat: the smoothing pass pads the derivative with cval")
    x = torch.full((2, 3, 5, 5), 0.5, dtype=torch.float64, requires_grad=True)
    y = tf.gradient_magnitude(x, operator=operator, mode=mode, cval=0.5, backend=engine)
    assert torch.equal(y, torch.zeros_like(y))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    if mode == "constant":
        return  # gaussian_gradient_magnitude: same SciPy pass order as above
    for t in (x, x.detach()[:, :, :1, :1].clone().requires_grad_(True)):  # also a 1x1 image
        t.grad = None
        y = tf.gaussian_gradient_magnitude(t, 1.0, mode=mode, cval=0.5, backend=engine)
        assert float(y.detach().abs().max()) < 1e-15
        y.sum().backward()
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("mode", ["reflect", "nearest", "mirror"])
@pytest.mark.parametrize("operator", OPERATORS)
def test_magnitude_gradient_exactly_zero_on_flat_regions(engine, operator, mode):
    """On a 12x12 image with a step at column 8 the outputs with |g| > 0 read columns 6..9 only,
    so the gradient on columns 0..5 is exactly 0 (not NaN, not tiny)."""
    x = torch.zeros(1, 2, 12, 12, dtype=torch.float64)
    x[..., 8:] = 1.0
    x.requires_grad_(True)
    y = tf.gradient_magnitude(x, operator=operator, mode=mode, backend=engine)
    assert torch.equal(y[..., :7], torch.zeros_like(y[..., :7]))
    assert (y[..., 7:9] > 0).all()
    y.sum().backward()
    g = x.grad
    assert torch.isfinite(g).all()
    assert torch.equal(g[..., :6], torch.zeros_like(g[..., :6]))
    assert torch.equal(g[..., 10:], torch.zeros_like(g[..., 10:]))
    assert (g[..., 7:9].abs() > 0).all()


def test_direction_gradient_zero_where_gradient_vanishes(engine):
    x = torch.full((1, 1, 6, 6), 2.0, dtype=torch.float64, requires_grad=True)
    for mode in ("reflect", "wrap"):
        y = tf.gradient_direction(x, operator="sobel", mode=mode, backend=engine)
        assert torch.equal(y.abs() % torch.pi, torch.zeros_like(y))  # atan2(+-0, +-0)
        y.sum().backward()
        assert torch.equal(x.grad, torch.zeros_like(x))
        x.grad = None


def test_gradient_matches_autograd_of_float64_scipy_formula(engine):
    """The magnitude's gradient is g/|g| pushed back through the stencils: compare with
    autograd through plain torch correlations of the unit-stencil formula."""
    x = rand(2, 2, 6, 7, seed=11).requires_grad_(True)
    y = tf.gradient_magnitude(x, operator="sobel", mode="wrap", backend=engine)
    gout = rand(*y.shape, seed=12)
    (gx,) = torch.autograd.grad(y, x, gout)
    x2 = x.detach().clone().requires_grad_(True)
    p = torch.cat([x2[..., -1:, :], x2, x2[..., :1, :]], -2)  # wrap by one on both axes
    p = torch.cat([p[..., -1:], p, p[..., :1]], -1)
    c = lambda a, b: p[..., 1 + a: 1 + a + 6, 1 + b: 1 + b + 7]  # noqa: E731
    dx = (c(-1, 1) - c(-1, -1)) + 2 * (c(0, 1) - c(0, -1)) + (c(1, 1) - c(1, -1))
    dy = (c(1, -1) - c(-1, -1)) + 2 * (c(1, 0) - c(-1, 0)) + (c(1, 1) - c(-1, 1))
    ref = torch.sqrt(dx * dx + dy * dy)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    (gref,) = torch.autograd.grad(ref, x2, gout)
    torch.testing.assert_close(gx, gref, rtol=1e-10, atol=1e-12)


def test_selective_blur_gradient_formula(engine):
    """blend: dL/dx = blur^T(m * g) + (1 - m) * g, with blur^T = correlate with the flipped kernel
    on a wrap-around image (wrap makes the adjoint exact); the mask carries no gradient."""
    x = away_from(rand(1, 1, 6, 7, seed=13)).requires_grad_(True)
    w = rand(3, 3, seed=14)
    y = tf.selective_blur(x, 0.0, weights=w, mode="wrap", backend=engine)
    g = rand(*y.shape, seed=15)
    (gx,) = torch.autograd.grad(y, x, g)
    m = (x.detach() >= 0).double()
    expected = tf.convolve(m * g, w, mode="wrap") + (1 - m) * g  # correlate^T = convolve (wrap, odd kernel)
    torch.testing.assert_close(gx, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name", ["correlate", "gradient_magnitude-central", "gaussian_filter-order", "selective_blur-normalized"]
)
def test_gradgradcheck(engine, name):
    x = _input((1, 1, 4, 5), name, seed=16)
    fn = lambda t: OPS[name](t, mode="mirror", cval=CVAL, backend=engine)  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (x,), eps=1e-6, atol=1e-6, rtol=1e-4)



@pytest.mark.parametrize("name, call, shape", [
    ("3-axis magnitude", lambda t, **k: tf.gradient_magnitude(t, axes=(0, 1, 2), **k), (4, 5, 6)),
    ("axes (0, 2)", lambda t, **k: tf.gaussian_filter(t, 1.0, axes=(0, 2), **k), (4, 5, 6)),
    ("per-axis modes", lambda t, **k: tf.gaussian_filter(t, 1.0, mode=("wrap", "reflect"), **k), (4, 5, 6)),
    ("cached buffer", lambda t, **k: tf.sobel(t, **k), (600, 600)),  # (>= 1 MiB: the CPU's output cache)
    ("selective blur", lambda t, **k: tf.selective_blur(t, 0.5, axes=(0, 1, 2), **k), (4, 5, 6)),
])
def test_results_can_be_modified_in_place(engine, name, call, shape):
    """Found by review: a result that was a view of an engine's buffer (volumes, permuted axes,
    per-axis modes, cached output buffers) could not be modified in place under autograd.  Now
    ``y.clamp_()`` works, and its gradient is the out-of-place one."""
    x = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = call(xa, backend=engine)
    assert not ya._is_view()
    ya.clamp_(0.1, 0.6).sum().backward()
    call(xb, backend=engine).clamp(0.1, 0.6).sum().backward()
    assert torch.equal(xa.grad, xb.grad), name
