"""Every op x every mode x every size against SciPy in float64, per (H, W) slice.

Sizes 1x1, 1x5, 5x1, 2x3, 7x9 and 28x28; kernel radii from 0 to larger than
the image.  Mode tests use kernels of radius >= 2 (at radius 1 ``reflect``
and ``nearest`` coincide).  ``cval`` is non-zero everywhere: it must matter
in ``constant`` mode and be ignored by the others.

Each grid (mode x size x kernel / operator / config) runs as a core grid on
every engine -- every pair of values of any two axes in some case, so every
mode meets every size and every kernel, the radius larger than the image
included -- and as ``*_sampled`` cases of the whole grid (other sizes too),
the engine one more sampled axis.  ``make test-full`` runs the cross products.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf
from conftest import (
    BASE_MODES,
    CVAL,
    DIVISORS,
    MODES,
    OPERATORS,
    SIZES,
    SMALL_SIZES,
    assert_angles_close,
    assert_close,
    base_modes,
    engines,
    examples,
    grid,
    modes,
    operators,
    per_slice,
    rand,
    sizes,
    small_sizes,
    sp_convolve,
    sp_convolve1d,
    sp_correlate,
    sp_correlate1d,
    sp_derivative,
    sp_gaussian_filter,
    sp_gaussian_gradient_magnitude,
    sp_gradient,
    sp_gradient_direction,
    sp_gradient_magnitude,
)

LEAD = (2, 3)  # two leading axes: every (H, W) slice is an independent image


def _x(hw, seed=0):
    return rand(*LEAD, *hw, seed=seed)


# ------------------------------------------------------------------ 2-D kernels


def _kernel_shape(kind, hw):
    H, W = hw
    return {
        "r0": (1, 1),  # radius 0: identity up to the weight
        "5x5": (5, 5),  # radius 2
        "4x2": (4, 2),  # even sizes
        "3x7": (3, 7),  # anisotropic, radius 3 along W
        "big": (2 * H + 3, 2 * W + 5),  # radius larger than the image on both axes
    }[kind]


KERNELS = ("r0", "5x5", "4x2", "3x7", "big")


@grid("mode, hw, kind", MODES, SIZES, KERNELS)
def test_correlate_and_convolve(engine, mode, hw, kind):
    x = _x(hw)
    w = rand(*_kernel_shape(kind, hw), seed=1)
    y = tf.correlate(x, w, mode=mode, cval=CVAL, backend=engine)
    assert y.dtype == torch.float64 and y.shape == x.shape
    assert_close(y, sp_correlate(x, w, mode, CVAL))
    y = tf.convolve(x, w, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, sp_convolve(x, w, mode, CVAL))


@examples(20)
@given(engine=engines, mode=modes, hw=sizes, kind=st.sampled_from(KERNELS))
def test_correlate_and_convolve_sampled(engine, mode, hw, kind):
    test_correlate_and_convolve(engine, mode, hw, kind)


def _valid_origins(k):
    return sorted({-(k // 2), 0, (k - 1) // 2} - {0})


ORIGIN_SIZES = ((1, 5), (2, 3), (7, 9))
ORIGIN_KSHAPES = ((4, 2), (2, 5), (5, 4), (6, 6))


@grid("mode, hw, kshape", BASE_MODES, ORIGIN_SIZES, ORIGIN_KSHAPES)
def test_correlate_convolve_origins(engine, mode, hw, kshape):
    """Even-sized weights and every extreme non-zero origin, also a mixed (oy, ox) pair."""
    x = _x(hw, seed=2)
    w = rand(*kshape, seed=3)
    kh, kw = kshape
    origins = [(oy, 0) for oy in _valid_origins(kh)] + [(0, ox) for ox in _valid_origins(kw)]
    origins.append((_valid_origins(kh)[0], _valid_origins(kw)[-1]))
    for origin in origins:
        for fn, ref in ((tf.correlate, sp_correlate), (tf.convolve, sp_convolve)):
            y = fn(x, w, mode=mode, cval=CVAL, origin=origin, backend=engine)
            assert_close(y, ref(x, w, mode, CVAL, origin), msg=f"{fn.__name__} origin={origin}")
    # a scalar origin applies to both axes
    o = min(_valid_origins(kh)[-1], _valid_origins(kw)[-1], key=abs)
    if all(-(k // 2) <= o <= (k - 1) // 2 for k in kshape):
        assert_close(tf.correlate(x, w, mode=mode, cval=CVAL, origin=o, backend=engine), sp_correlate(x, w, mode, CVAL, o))


@examples(10)
@given(engine=engines, mode=base_modes, hw=small_sizes,
       kshape=st.sampled_from(ORIGIN_KSHAPES) | st.tuples(st.integers(2, 7), st.integers(2, 7)))
def test_correlate_convolve_origins_sampled(engine, mode, hw, kshape):
    test_correlate_convolve_origins(engine, mode, hw, kshape)


def test_correlate_weights_as_nested_list(engine):
    x = _x((7, 9))
    w = [[0.0, 1.0, 0.5], [2.0, -1.0, 0.25]]
    assert_close(tf.correlate(x, w, backend=engine), sp_correlate(x, w))


# ------------------------------------------------------------------ 1-D kernels


KERNELS_1D = ("r0", "even4", "5", "big")


def _kernel_1d(kind, n):
    return {"r0": 1, "even4": 4, "5": 5, "big": 2 * n + 3}[kind]


@grid("mode, hw, axis, kind", MODES, SIZES, (-1, -2), KERNELS_1D)
def test_correlate1d_and_convolve1d(engine, mode, hw, axis, kind):
    x = _x(hw)
    w = rand(_kernel_1d(kind, hw[axis]), seed=4)
    y = tf.correlate1d(x, w, axis, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, sp_correlate1d(x, w, axis, mode, CVAL))
    y = tf.convolve1d(x, w, axis=axis, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, sp_convolve1d(x, w, axis, mode, CVAL))


@examples(20)
@given(engine=engines, mode=modes, hw=sizes, axis=st.sampled_from((-1, -2)), kind=st.sampled_from(KERNELS_1D))
def test_correlate1d_and_convolve1d_sampled(engine, mode, hw, axis, kind):
    test_correlate1d_and_convolve1d(engine, mode, hw, axis, kind)


@pytest.mark.parametrize("mode", BASE_MODES)
@pytest.mark.parametrize("k", [2, 4, 5])
def test_correlate1d_origins(engine, mode, k):
    x = _x((5, 7), seed=5)
    w = rand(k, seed=6)
    for axis in (-1, -2):
        for origin in range(-(k // 2), (k - 1) // 2 + 1):
            y = tf.correlate1d(x, w, axis, mode=mode, cval=CVAL, origin=origin, backend=engine)
            assert_close(y, sp_correlate1d(x, w, axis, mode, CVAL, origin), msg=f"axis={axis} origin={origin}")
            y = tf.convolve1d(x, w, axis, mode=mode, cval=CVAL, origin=origin, backend=engine)
            assert_close(y, sp_convolve1d(x, w, axis, mode, CVAL, origin), msg=f"conv axis={axis} origin={origin}")


# ----------------------------------------------------------------- derivatives


@grid("mode, hw, operator, axis", MODES, SIZES, OPERATORS, (-1, -2))
def test_derivative(engine, mode, hw, operator, axis):
    x = _x(hw)
    y = tf.derivative(x, axis, operator=operator, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, sp_derivative(x, axis, operator, mode, CVAL))


@examples(20)
@given(engine=engines, mode=modes, hw=sizes, operator=operators, axis=st.sampled_from((-1, -2)))
def test_derivative_sampled(engine, mode, hw, operator, axis):
    test_derivative(engine, mode, hw, operator, axis)


@grid("mode, hw, operator", MODES, SMALL_SIZES, OPERATORS)
def test_derivative_normalized(engine, mode, hw, operator):
    """normalized=True is the unnormalised result divided by the documented divisor
    (2 / 8 / 32 / 6) -- in every mode, constant with a non-zero cval included."""
    x = _x(hw, seed=7)
    div = DIVISORS[operator]
    kw = dict(operator=operator, mode=mode, cval=CVAL, normalized=True, backend=engine)
    for axis in (-1, -2):
        y = tf.derivative(x, axis, **kw)
        assert_close(y, sp_derivative(x, axis, operator, mode, CVAL) / div, msg=f"axis={axis}")
    assert_close(tf.gradient(x, **kw), sp_gradient(x, operator, mode, CVAL) / div, msg="gradient")
    assert_close(tf.gradient_magnitude(x, **kw), sp_gradient_magnitude(x, operator, mode, CVAL) / div, msg="magnitude")


@examples(10)
@given(engine=engines, mode=modes, hw=small_sizes, operator=operators)
def test_derivative_normalized_sampled(engine, mode, hw, operator):
    test_derivative_normalized(engine, mode, hw, operator)


@pytest.mark.parametrize("operator", OPERATORS)
def test_derivative_normalized_unit_ramp(engine, operator):
    ramp = torch.arange(7.0, dtype=torch.float64).repeat(6, 1)  # f[i, j] = j
    for mode in ("reflect", "mirror", "nearest", "wrap", "constant"):
        gx = tf.derivative(ramp, -1, operator=operator, mode=mode, normalized=True, backend=engine)
        gy = tf.derivative(ramp.T, -2, operator=operator, mode=mode, normalized=True, backend=engine)
        # exact for the power-of-two divisors; prewitt's 1/6 rounds
        torch.testing.assert_close(gx[1:-1, 1:-1], torch.ones(4, 5, dtype=torch.float64), rtol=1e-15, atol=1e-15)
        torch.testing.assert_close(gy[1:-1, 1:-1], torch.ones(5, 4, dtype=torch.float64), rtol=1e-15, atol=1e-15)


@grid("mode, hw, axis", MODES, SIZES, (-1, -2))
def test_sobel_prewitt_scharr(engine, mode, hw, axis):
    """sobel/prewitt equal scipy.ndimage.sobel/prewitt on each slice; scharr is [-1,0,1] x [3,10,3]."""
    x = _x(hw)
    y = tf.sobel(x, axis, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, per_slice(ndi.sobel, x, axis=axis, mode=mode, cval=CVAL))
    y = tf.prewitt(x, axis=axis, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, per_slice(ndi.prewitt, x, axis=axis, mode=mode, cval=CVAL))
    y = tf.scharr(x, axis, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, sp_derivative(x, axis, "scharr", mode, CVAL))


@examples(10)
@given(engine=engines, mode=modes, hw=sizes, axis=st.sampled_from((-1, -2)))
def test_sobel_prewitt_scharr_sampled(engine, mode, hw, axis):
    test_sobel_prewitt_scharr(engine, mode, hw, axis)


@grid("mode, hw, operator", MODES, SIZES, OPERATORS)
def test_gradient_family(engine, mode, hw, operator):
    """gradient (index 0 = d/dy, 1 = d/dx), gradient_magnitude and gradient_direction."""
    x = _x(hw, seed=8)
    kw = dict(operator=operator, mode=mode, cval=CVAL, backend=engine)
    g = tf.gradient(x, **kw)
    assert g.shape == LEAD + (2,) + hw
    assert_close(g, sp_gradient(x, operator, mode, CVAL))
    m = tf.gradient_magnitude(x, **kw)
    assert_close(m, sp_gradient_magnitude(x, operator, mode, CVAL))
    d = tf.gradient_direction(x, **kw)
    assert d.shape == x.shape
    ref = sp_gradient(x, operator, mode, CVAL)
    # where the gradient is 0 (up to rounding) the angle is arbitrary
    tiny = np.hypot(ref[..., 0, :, :], ref[..., 1, :, :]) < 1e-9
    assert_angles_close(d, sp_gradient_direction(x, operator, mode, CVAL), ignore=tiny)
    assert float(d.abs().max()) <= np.pi


@examples(20)
@given(engine=engines, mode=modes, hw=sizes, operator=operators)
def test_gradient_family_sampled(engine, mode, hw, operator):
    test_gradient_family(engine, mode, hw, operator)


def test_gradient_direction_conventions(engine):
    """y points down: a ramp growing with the row index has direction +pi/2; along x it is 0."""
    r = torch.arange(6.0, dtype=torch.float64)
    down = r[:, None].expand(6, 6)
    right = r[None, :].expand(6, 6)
    for op in OPERATORS:
        d = tf.gradient_direction(down, operator=op, backend=engine)
        assert torch.allclose(d[1:-1, 1:-1], torch.full((4, 4), np.pi / 2, dtype=torch.float64), atol=1e-15)
        d = tf.gradient_direction(right, operator=op, backend=engine)
        assert torch.equal(d[1:-1, 1:-1], torch.zeros(4, 4, dtype=torch.float64))
        d = tf.gradient_direction(-right, operator=op, backend=engine)
        assert torch.allclose(d[1:-1, 1:-1].abs(), torch.full((4, 4), np.pi, dtype=torch.float64))


# -------------------------------------------------------------------- Gaussian


def _gauss_cfg(name, hw):
    H, W = hw
    return {
        "s1": dict(sigma=1.0),  # radius 4: larger than most test images
        "aniso": dict(sigma=(0.7, 2.5)),
        "radius0": dict(sigma=1.5, radius=0),  # a 1-tap kernel: the identity
        "radius2": dict(sigma=(2.0, 0.8), radius=(2, 3)),
        "radius_big": dict(sigma=3.0, radius=(H + 2, W + 3)),
        "truncate": dict(sigma=1.2, truncate=1.5),
        "sy0": dict(sigma=(0.0, 2.0)),  # only W filtered
        "order10": dict(sigma=1.3, order=(1, 0)),
        "order02": dict(sigma=(1.1, 0.9), order=(0, 2)),
        "order21": dict(sigma=1.0, order=(2, 1), radius=3),
        "order1": dict(sigma=0.8, order=1),
    }[name]


GAUSS_CFGS = (
    "s1", "aniso", "radius0", "radius2", "radius_big", "truncate", "sy0",
    "order10", "order02", "order21", "order1",
)


@grid("mode, hw, cfg", MODES, SIZES, GAUSS_CFGS)
def test_gaussian_filter(engine, mode, hw, cfg):
    x = _x(hw, seed=9)
    kw = _gauss_cfg(cfg, hw)
    sigma = kw.pop("sigma")
    y = tf.gaussian_filter(x, sigma, mode=mode, cval=CVAL, backend=engine, **kw)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, sp_gaussian_filter(x, sigma, mode=mode, cval=CVAL, **kw))


@examples(20)
@given(engine=engines, mode=modes, hw=sizes, cfg=st.sampled_from(GAUSS_CFGS))
def test_gaussian_filter_sampled(engine, mode, hw, cfg):
    test_gaussian_filter(engine, mode, hw, cfg)


@pytest.mark.parametrize("mode", BASE_MODES)
def test_gaussian_filter_sigma0_is_a_copy(engine, mode):
    x = _x((5, 6), seed=10)
    y = tf.gaussian_filter(x, 0.0, mode=mode, cval=CVAL, backend=engine)
    assert torch.equal(y, x)
    assert y.data_ptr() != x.data_ptr()
    y = tf.gaussian_filter(x, (0, 0), order=1, mode=mode, cval=CVAL, backend=engine)
    assert_close(y, sp_gaussian_filter(x, (0, 0), order=1, mode=mode, cval=CVAL))


GGM_CFGS = ("s1", "aniso_radius", "radius_big")


@grid("mode, hw, cfg", MODES, SIZES, GGM_CFGS)
def test_gaussian_gradient_magnitude(engine, mode, hw, cfg):
    H, W = hw
    kw = {
        "s1": dict(sigma=1.0),
        "aniso_radius": dict(sigma=(0.6, 1.7), radius=(1, 2)),
        "radius_big": dict(sigma=2.0, radius=(H + 1, W + 2)),
    }[cfg]
    x = _x(hw, seed=11)
    sigma = kw.pop("sigma")
    y = tf.gaussian_gradient_magnitude(x, sigma, mode=mode, cval=CVAL, backend=engine, **kw)
    assert_close(y, sp_gaussian_gradient_magnitude(x, sigma, mode=mode, cval=CVAL, **kw))


@examples(10)
@given(engine=engines, mode=modes, hw=sizes, cfg=st.sampled_from(GGM_CFGS))
def test_gaussian_gradient_magnitude_sampled(engine, mode, hw, cfg):
    test_gaussian_gradient_magnitude(engine, mode, hw, cfg)


# --------------------------------------------------- independence of the slices


def test_leading_axes_are_independent(engine):
    """Any number of leading axes; each (H, W) slice equals the op on that slice alone."""
    x = rand(2, 1, 3, 6, 7, seed=12)
    w = rand(3, 4, seed=13)
    y = tf.correlate(x, w, mode="wrap", backend=engine)
    g = tf.gradient(x, operator="sobel", mode="mirror", backend=engine)
    for idx in np.ndindex(*x.shape[:-2]):
        assert torch.equal(y[idx], tf.correlate(x[idx], w, mode="wrap", backend=engine))
        assert torch.equal(g[idx], tf.gradient(x[idx], operator="sobel", mode="mirror", backend=engine))
    y2 = tf.gaussian_filter(x[0, 0, 0], 1.3, backend=engine)  # plain 2-D input
    assert_close(y2, sp_gaussian_filter(x[0, 0, 0], 1.3))


def test_forward_with_and_without_autograd_agree(engine):
    """The eager path and the custom-op (autograd) path run the same engine."""
    x = rand(2, 3, 7, 9, seed=14)
    xg = x.clone().requires_grad_(True)
    w = rand(3, 5, seed=15)
    for f in (
        lambda t: tf.correlate(t, w, mode="nearest", backend=engine),
        lambda t: tf.gradient(t, operator="scharr", mode="wrap", backend=engine),
        lambda t: tf.gradient_magnitude(t, operator="sobel", mode="constant", cval=CVAL, backend=engine),
        lambda t: tf.gradient_direction(t, operator="prewitt", mode="mirror", backend=engine),
        lambda t: tf.gaussian_filter(t, 1.4, order=(0, 1), mode="reflect", backend=engine),
        lambda t: tf.gaussian_gradient_magnitude(t, 0.9, mode="nearest", backend=engine),
        lambda t: tf.selective_blur(t, 0.1, normalized=True, backend=engine),
    ):
        assert torch.equal(f(x), f(xg).detach())


# ------------------------------------------------------------ property tests


@examples(30)
@given(
    engine=engines,
    H=st.integers(1, 12),
    W=st.integers(1, 12),
    kh=st.integers(1, 30),
    kw=st.integers(1, 30),
    mode=modes,
    cval=st.floats(-3, 3),
    flip=st.booleans(),
    data=st.data(),
)
def test_property_correlate_any_shape_any_radius(engine, H, W, kh, kw, mode, cval, flip, data):
    oy = data.draw(st.integers(-(kh // 2), (kh - 1) // 2))
    ox = data.draw(st.integers(-(kw // 2), (kw - 1) // 2))
    seed = data.draw(st.integers(0, 2**16))
    x = rand(2, H, W, seed=seed)
    w = rand(kh, kw, seed=seed + 1)
    fn, ref = (tf.convolve, sp_convolve) if flip else (tf.correlate, sp_correlate)
    y = fn(x, w, mode=mode, cval=cval, origin=(oy, ox), backend=engine)
    assert_close(y, ref(x, w, mode, cval, (oy, ox)))


#: 0, or at least 0.1: a derivative kernel of sigma s has weights ~ s**-order, and those
#: multiply the other pass's rounding (a 1x1 image, sigma (3, 1.2e-7), order (1, 2): the
#: order-1 pass sums to ~1e-17 instead of 0, times 7e13 is 2e-4 where SciPy gives 0)
sigmas = st.just(0.0) | st.floats(0.1, 6.0)


@examples(30)
@given(
    engine=engines,
    H=st.integers(1, 12),
    W=st.integers(1, 12),
    sy=sigmas,
    sx=sigmas,
    oy=st.integers(0, 2),
    ox=st.integers(0, 2),
    mode=modes,
    truncate=st.floats(0.5, 5.0),
)
def test_property_gaussian_filter(engine, H, W, sy, sx, oy, ox, mode, truncate):
    x = rand(2, H, W, seed=H * 31 + W)
    y = tf.gaussian_filter(x, (sy, sx), order=(oy, ox), mode=mode, cval=-0.5, truncate=truncate, backend=engine)
    assert_close(y, sp_gaussian_filter(x, (sy, sx), order=(oy, ox), mode=mode, cval=-0.5, truncate=truncate))
