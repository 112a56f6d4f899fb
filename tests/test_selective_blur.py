"""selective_blur against an oracle built from SciPy, and its documented semantics.

Oracle (conftest.sp_selective_blur):
  blend:      where(m, correlate(x, w), x)
  normalized: where(m & den > 0, correlate(m*x, w, cval=0) / den, x),  den = correlate(m, w, cval=0)

The variant x size x mode grid runs as a core grid on every engine (every pair of values of
two axes in some case) and as sampled cases of the whole grid; ``make test-full`` runs it all.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf
from conftest import (
    BASE_MODES,
    CVAL,
    MODES,
    SIZES,
    assert_close,
    border_band,
    engines,
    examples,
    grid,
    modes,
    pattern_mask,
    rand,
    size_id,
    sizes,
    sp_selective_blur,
)

LEAD = (2, 3)


def _variant(name, hw):
    H, W = hw
    big = rand(2 * H + 3, 2 * W + 1, seed=21, low=0.0, high=1.0)  # radius larger than the image
    return {
        "blend": dict(),
        "normalized": dict(normalized=True),
        "blend-keep_border": dict(keep_border=True),
        "normalized-keep_border-threshold": dict(normalized=True, keep_border=True, threshold=0.3),
        "mask": dict(mask=pattern_mask(H, W)),
        "mask-normalized-keep_border": dict(mask=pattern_mask(H, W), normalized=True, keep_border=True),
        "sigma": dict(sigma=1.0),
        "sigma-aniso-normalized-keep_border": dict(sigma=(0.5, 1.2), normalized=True, keep_border=True),
        "sigma-truncate": dict(sigma=(2.0, 0.0), truncate=1.0, threshold=-0.2),
        "weights-even": dict(weights=rand(2, 4, seed=22), keep_border=True),
        "weights-big": dict(weights=big),
        "weights-big-normalized": dict(weights=big, normalized=True),
    }[name]


VARIANTS = (
    "blend", "normalized", "blend-keep_border", "normalized-keep_border-threshold", "mask",
    "mask-normalized-keep_border", "sigma", "sigma-aniso-normalized-keep_border", "sigma-truncate",
    "weights-even", "weights-big", "weights-big-normalized",
)


@grid("variant, hw, mode", VARIANTS, SIZES, MODES)
def test_selective_blur_matches_scipy_oracle(engine, variant, hw, mode):
    x = rand(*LEAD, *hw, seed=20)
    kw = _variant(variant, hw)
    threshold = kw.pop("threshold", 0.0)
    y = tf.selective_blur(x, threshold, mode=mode, cval=CVAL, backend=engine, **kw)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close(y, sp_selective_blur(x, threshold, mode=mode, cval=CVAL, **kw))


@examples(25)
@given(engine=engines, variant=st.sampled_from(VARIANTS), hw=sizes, mode=modes)
def test_selective_blur_matches_scipy_oracle_sampled(engine, variant, hw, mode):
    test_selective_blur_matches_scipy_oracle(engine, variant, hw, mode)


def test_default_kernel_is_the_3x3_binomial(engine):
    x = rand(2, 6, 7, seed=23)
    w = torch.outer(torch.tensor([1.0, 2, 1]), torch.tensor([1.0, 2, 1])) / 16
    for mode in BASE_MODES:
        for normalized in (False, True):
            a = tf.selective_blur(x, 0.1, mode=mode, cval=CVAL, normalized=normalized, backend=engine)
            b = tf.selective_blur(x, 0.1, weights=w, mode=mode, cval=CVAL, normalized=normalized, backend=engine)
            assert_close(a, b, rtol=1e-15)


def test_blend_reads_original_neighbours(engine):
    """Docstring example: the -1 pixel is not blurred but leaks into its neighbours' blur."""
    x = torch.tensor([[-1.0, 2.0, 2.0], [2.0, 2.0, 2.0], [2.0, 2.0, 2.0]])
    y = tf.selective_blur(x, 0.0, backend=engine)
    assert float(y[0, 0]) == -1.0
    assert float(y[1, 1]) == 1.8125  # (15 * 2 - 1 * 1 ... ) / 16: 2 - 3/16
    # a chain of selected pixels: every output reads the input, not earlier outputs
    r = torch.tensor([[0.0, 16.0, 0.0, 0.0, 16.0]], dtype=torch.float64)
    y = tf.selective_blur(r, 0.0, weights=[[1.0, 2.0, 1.0]], mode="constant", backend=engine)
    assert y.tolist() == [[16.0, 32.0, 16.0, 16.0, 32.0]]


def test_normalized_excludes_outliers(engine):
    x = torch.full((1, 1, 7, 7), 3.0, dtype=torch.float64)
    x[..., 3, 3] = -1e6  # excluded (below threshold)
    x[..., 1, 5] = 5.0
    y = tf.selective_blur(x, 0.0, normalized=True, backend=engine)
    assert float(y[..., 3, 3]) == -1e6  # kept
    m = x >= 0
    assert float(y[m].min()) >= 3.0 and float(y[m].max()) <= 5.0  # means of masked values only
    yb = tf.selective_blur(x, 0.0, backend=engine)  # the blend leaks the outlier in
    assert float(yb[..., 2, 3]) < -1e5


def test_normalized_keeps_pixels_without_masked_neighbours(engine):
    """A kernel with a zero centre: an isolated masked pixel has blur(m) = 0 and is kept."""
    w = [[1.0, 0.0, 1.0]]
    x = torch.tensor([[[-5.0, 7.0, -5.0, 1.0, 3.0]]], dtype=torch.float64, requires_grad=True)
    y = tf.selective_blur(x, 0.0, weights=w, normalized=True, mode="constant", backend=engine)
    # pixel 1: masked, neighbours 0 and 2 unmasked -> kept; pixel 3: neighbours 2 (no), 4 (yes) -> 3.0;
    # pixel 4: neighbours 3 (yes) and outside (never masked) -> 1.0
    assert y.tolist() == [[[-5.0, 7.0, -5.0, 3.0, 1.0]]]
    y.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad.tolist() == [[[1.0, 1.0, 1.0, 1.0, 1.0]]]


@pytest.mark.parametrize("mode", BASE_MODES)
def test_normalized_ignores_cval(engine, mode):
    x = rand(2, 5, 6, seed=24)
    a = tf.selective_blur(x, 0.0, normalized=True, mode=mode, cval=0.0, backend=engine)
    b = tf.selective_blur(x, 0.0, normalized=True, mode=mode, cval=123.0, backend=engine)
    assert torch.equal(a, b)


def test_blend_uses_cval_in_constant_mode(engine):
    x = torch.ones(1, 3, 3, dtype=torch.float64)
    y = tf.selective_blur(x, 0.0, mode="constant", cval=5.0, backend=engine)
    # corner: 9 of 16 weight units inside (1.0), 7 outside (cval 5.0)
    assert float(y[0, 0, 0]) == (9 * 1.0 + 7 * 5.0) / 16
    assert float(y[0, 1, 1]) == 1.0


def test_mask_overrides_threshold_and_broadcasts(engine):
    x = rand(2, 3, 5, 6, seed=25)
    mask = torch.zeros(1, 3, 1, 6, dtype=torch.bool)
    mask[0, 1, 0, 2:5] = True
    y = tf.selective_blur(x, 100.0, mask=mask, backend=engine)  # threshold is ignored
    assert_close(y, sp_selective_blur(x, mask=mask.expand(2, 3, 5, 6)))
    keep = ~mask.expand_as(x)
    assert torch.equal(y[keep], x[keep])
    assert not torch.equal(y[~keep], x[~keep])
    # a mask with the input's full shape, and a 2-D one
    full = x > 0.2
    assert_close(tf.selective_blur(x, mask=full, backend=engine), sp_selective_blur(x, mask=full))
    m2 = pattern_mask(5, 6)
    assert_close(tf.selective_blur(x, mask=m2, normalized=True, backend=engine), sp_selective_blur(x, mask=m2, normalized=True))


def test_threshold_is_inclusive_and_nan_is_never_selected(engine):
    x = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, float("nan")]]])
    y = tf.selective_blur(x, 5.0, weights=[[1.0]] * 1, backend=engine)  # 1x1 kernel: blur(x) = x
    assert torch.equal(y[..., :2, :], x[..., :2, :])
    y = tf.selective_blur(x, 5.0, weights=[[2.0]], backend=engine)  # selected pixels doubled
    assert y[0, 1].tolist() == [4.0, 10.0, 12.0]  # 5 >= 5 is selected
    assert y[0, 0].tolist() == [1.0, 2.0, 3.0]
    assert math.isnan(float(y[0, 2, 2]))  # NaN stays, not selected
    assert y[0, 2, :2].tolist() == [14.0, 16.0]
    t = tf.selective_blur(x, torch.tensor(5.0), weights=[[2.0]], backend=engine)  # 0-d tensor threshold
    assert torch.equal(t.nan_to_num(), y.nan_to_num())


@pytest.mark.parametrize("hw", [(7, 9), (3, 3), (2, 5)], ids=size_id)
def test_keep_border_band(engine, hw):
    """keep_border leaves every pixel whose kernel footprint leaves the image untouched."""
    x = rand(1, 2, *hw, seed=26, low=0.0, high=1.0)  # all selected
    for kw in (dict(), dict(sigma=(0.4, 0.6)), dict(weights=rand(2, 5, seed=27)), dict(weights=rand(1, 3, seed=28))):
        band = torch.from_numpy(border_band(*hw, weights=kw.get("weights"), sigma=kw.get("sigma")))
        for normalized in (False, True):
            if normalized and "weights" in kw:
                kw = dict(weights=kw["weights"].abs())
            y = tf.selective_blur(x, 0.0, keep_border=True, normalized=normalized, backend=engine, **kw)
            assert torch.equal(y[..., ~band], x[..., ~band]), kw
            ref = tf.selective_blur(x, 0.0, normalized=normalized, backend=engine, **kw)
            assert torch.equal(y[..., band], ref[..., band])


def test_sigma_zero_and_unit_kernel_are_identity(engine):
    x = rand(2, 5, 6, seed=29)
    assert torch.equal(tf.selective_blur(x, 0.0, sigma=0.0, backend=engine), x)
    assert torch.equal(tf.selective_blur(x, 0.0, weights=[[1.0]], normalized=True, backend=engine), x)


def test_mask_gets_no_gradient_and_threshold_mask_is_piecewise_constant(engine):
    x = rand(1, 1, 5, 6, seed=30).requires_grad_(True)
    mask = x.detach() > 0.0
    y = tf.selective_blur(x, mask=mask, normalized=True, backend=engine)
    y.sum().backward()
    assert mask.grad is None and not mask.requires_grad
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("keep_border", [False, True])
def test_gradient_normalized_formula(engine, keep_border):
    """normalized: dL/dx = m * blur^T(use * g / den) + (1 - use) * g (wrap mode: blur^T = convolve),
    use = written & den > 0; with keep_border the border is not written but still counts in den."""
    x = rand(1, 1, 6, 7, seed=31)
    x[x.abs() < 0.05] = 0.5
    xg = x.clone().requires_grad_(True)
    w = rand(3, 3, seed=32, low=0.0, high=1.0)
    w[1, 1] = 0.0  # some pixels end with no masked neighbour
    y = tf.selective_blur(xg, 0.0, weights=w, normalized=True, keep_border=keep_border, mode="wrap", backend=engine)
    g = rand(*y.shape, seed=33)
    (gx,) = torch.autograd.grad(y, xg, g)
    m = (x >= 0).double()
    den = tf.correlate(m, w, mode="wrap")
    write = m > 0
    if keep_border:
        write = write & torch.from_numpy(border_band(6, 7))
    use = write & (den > 0)
    gd = torch.where(use, g / torch.where(use, den, torch.ones_like(den)), torch.zeros_like(g))
    expected = m * tf.convolve(gd, w, mode="wrap") + torch.where(use, torch.zeros_like(g), g)
    torch.testing.assert_close(gx, expected, rtol=1e-12, atol=1e-12)


def test_nn_selective_blur_module_matches_functional(engine):
    x = rand(2, 3, 6, 7, seed=34)
    m = tf.nn.SelectiveBlur(0.1, sigma=0.8, normalized=True, keep_border=True, mode="mirror")
    assert torch.equal(m(x), tf.selective_blur(x, 0.1, sigma=0.8, normalized=True, keep_border=True, mode="mirror"))
    w = np.array([[1.0, 2.0], [3.0, 4.0]])
    m = tf.nn.SelectiveBlur(weights=w, mode="constant", cval=2.0)
    mask = x > 0.5
    assert torch.equal(m(x, mask), tf.selective_blur(x, mask=mask, weights=w, mode="constant", cval=2.0))
