"""Issue 2, "Behaviour from real reports" and "The two cases that started the project".

Each reported case is its own test, with exactly the reported values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch

import torchfilters as tf
from conftest import MODES, OPS, op_out_shape


def _t(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


# ------------------------------------------------------------ reported cases


def test_flat_image_gradient_magnitude_is_zero_with_zero_gradient(engine):
    x = torch.full((5, 5), 0.5, requires_grad=True)
    y = tf.gradient_magnitude(x, operator="sobel", backend=engine)
    assert torch.equal(y, torch.zeros(5, 5))
    y.sum().backward()
    assert not torch.isnan(x.grad).any()
    assert torch.equal(x.grad, torch.zeros(5, 5))


def test_step_image_gradients_are_finite(engine):
    x = torch.zeros(6, 6)
    x[:, 3:] = 1.0
    x.requires_grad_(True)
    for op in ("central", "sobel", "scharr", "prewitt"):
        y = tf.gradient_magnitude(x, operator=op, backend=engine)
        assert torch.equal(y[:, :2], torch.zeros(6, 2))  # flat region
        y.sum().backward()
        assert torch.isfinite(x.grad).all()
        assert torch.equal(x.grad[:, :1], torch.zeros(6, 1))
        x.grad = None


def test_uint8_row_central_derivative(engine):
    x = torch.tensor([[1, 2, 3, 4, 4, 3, 2, 1]], dtype=torch.uint8)
    y = tf.derivative(x, operator="central", backend=engine)
    assert y.dtype == torch.float32
    assert torch.equal(y, torch.tensor([[1.0, 2, 2, 1, -1, -2, -2, -1]]))


def test_uint8_sobel_does_not_wrap_around(engine):
    x = torch.zeros(5, 5, dtype=torch.uint8)
    x[:, 3:5] = 200
    y = tf.sobel(x, axis=-1, backend=engine)
    assert y.dtype == torch.float32
    assert torch.equal(y[2], torch.tensor([0.0, 0, 800, 800, 0]))
    # SciPy's own uint8 output wraps around (800 % 256 = 32); ours does not
    assert ndi.sobel(x.numpy(), axis=-1)[2, 2] == 32


def test_ramp_sobel(engine):
    ramp = torch.arange(5.0).repeat(5, 1)  # f[i, j] = j
    gx = tf.sobel(ramp, axis=-1, backend=engine)
    assert torch.equal(gx, torch.tensor([[4.0, 8, 8, 8, 4]]).expand(5, 5))
    assert torch.equal(tf.sobel(ramp, axis=-2, backend=engine), torch.zeros(5, 5))
    gn = tf.derivative(ramp, -1, operator="sobel", normalized=True, backend=engine)
    assert torch.equal(gn[1:-1, 1:-1], torch.ones(3, 3))


def test_impulse_convolve1d_and_correlate1d(engine):
    x = torch.tensor([[0.0, 0, 1, 0, 0]])
    w = [1.0, 2.0, 3.0]
    assert torch.equal(tf.convolve1d(x, w, mode="constant", backend=engine), torch.tensor([[0.0, 1, 2, 3, 0]]))
    assert torch.equal(tf.correlate1d(x, w, mode="constant", backend=engine), torch.tensor([[0.0, 3, 2, 1, 0]]))


# The table for sigma=2 on the 1x3 image [1, 2, 3] lists, for constant
# mode, [0.914509, 1.103092, 1.071483].  That is SciPy's result for
# sigma=(0, 2), i.e. filtering along W only.  With sigma=2 on both axes SciPy
# also filters the single row along H with zero padding and gives
# [0.182421, 0.220039, 0.213734]; in the other modes filtering a single row
# along H changes nothing, so those rows of the table hold for both.  Our
# contract is SciPy: the table is tested with sigma=(0, 2) in every mode, and
# sigma=2 against SciPy's own values.
GAUSS_TABLE = {
    "reflect": [1.888427, 2, 2.111573],
    "mirror": [1.992807, 2, 2.007193],
    "nearest": [1.62449, 2, 2.37551],
    "wrap": [1.99986, 2, 2.00014],
    "constant": [0.914509, 1.103092, 1.071483],
}
GAUSS_BOTH_AXES = dict(GAUSS_TABLE, constant=[0.182421, 0.220039, 0.213734])


@pytest.mark.parametrize("mode", list(GAUSS_TABLE))
def test_gaussian_sigma2_on_1x3_table_is_sigma_0_2(engine, mode):
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    y = tf.gaussian_filter(x, (0, 2), mode=mode, backend=engine)
    torch.testing.assert_close(y, _t([GAUSS_TABLE[mode]]), atol=1.5e-6, rtol=0)
    y_scipy = ndi.gaussian_filter(x.numpy(), (0, 2), mode=mode)
    torch.testing.assert_close(y, torch.from_numpy(y_scipy), atol=1e-14, rtol=0)


@pytest.mark.parametrize("mode", list(GAUSS_TABLE))
def test_gaussian_sigma2_on_1x3_both_axes(engine, mode):
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    y = tf.gaussian_filter(x, 2, mode=mode, backend=engine)  # radius int(4 * 2 + 0.5) = 8
    torch.testing.assert_close(y, _t([GAUSS_BOTH_AXES[mode]]), atol=1.5e-6, rtol=0)
    torch.testing.assert_close(y, torch.from_numpy(ndi.gaussian_filter(x.numpy(), 2, mode=mode)), atol=1e-14, rtol=0)
    assert torch.equal(tf.gaussian_filter(x, 2, mode=mode, radius=8, backend=engine), y)
    yf = tf.gaussian_filter(x.float(), 2.0, mode=mode, backend=engine)  # float32 too
    torch.testing.assert_close(yf, y.float(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_gaussian_1x1_image(engine, mode):
    x = torch.tensor([[5.0]], dtype=torch.float64)
    y = tf.gaussian_filter(x, 1, mode=mode, backend=engine)
    expected = 0.795779 if mode in ("constant", "grid-constant") else 5.0
    assert abs(float(y) - expected) < 1e-6
    if expected == 5.0:
        assert abs(float(y) - 5.0) < 1e-14


SOBEL_ROW = {
    "reflect": [4, 8, 8, 8, 4],
    "mirror": [0, 8, 8, 8, 0],
    "wrap": [-12, 8, 8, 8, -12],
    "constant": [2, 4, 4, 4, -6],
}


@pytest.mark.parametrize("mode", list(SOBEL_ROW))
def test_one_row_sobel(engine, mode):
    x = torch.tensor([[0.0, 1, 2, 3, 4]])
    y = tf.sobel(x, axis=-1, mode=mode, backend=engine)
    assert torch.equal(y, torch.tensor([SOBEL_ROW[mode]], dtype=torch.float32))


@pytest.mark.parametrize("mode", ["reflect", "mirror", "nearest", "wrap"])
def test_constant_image_sobel_is_zero(engine, mode):
    x = torch.full((4, 4), 3.0)
    assert torch.equal(tf.sobel(x, axis=-1, mode=mode, cval=7.0, backend=engine), torch.zeros(4, 4))


def test_constant_image_sobel_constant_mode_cval0(engine):
    x = torch.full((4, 4), 3.0)
    y = tf.sobel(x, axis=-1, mode="constant", cval=0.0, backend=engine)
    expected = torch.tensor([[9.0, 0, 0, -9], [12, 0, 0, -12], [12, 0, 0, -12], [9, 0, 0, -9]])
    assert torch.equal(y, expected)
    assert torch.equal(tf.sobel(x, axis=-1, mode="constant", backend=engine), expected)  # cval defaults to 0


@pytest.mark.parametrize("name", sorted(OPS))
def test_channels_are_independent(engine, name):
    """A 1x3x5x5 input where only channel 1 is nonzero: channels 0 and 2 come out exactly 0."""
    x = torch.zeros(1, 3, 5, 5, dtype=torch.float64)
    x[0, 1] = torch.rand(5, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5
    for mode in ("reflect", "wrap", "constant"):
        y = OPS[name](x, mode=mode, backend=engine)  # cval = 0
        for c in (0, 2):
            z = y[0, c]
            if name.startswith("gradient_direction"):
                z = z.abs() % math.pi  # atan2 of signed zeros may be +-pi (documented)
            assert torch.equal(z, torch.zeros_like(z)), f"{name} {mode} channel {c}"
        assert y[0, 1].abs().max() > 0


EMPTY_SHAPES = [(0, 3, 5, 5), (2, 0, 5, 5), (2, 3, 0, 5), (2, 3, 5, 0), (0, 0), (4, 0), (0, 4)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(OPS))
def test_empty_inputs(engine, name, shape):
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    for mode in ("reflect", "constant"):
        y = OPS[name](x, mode=mode, cval=1.0, backend=engine)
        assert y.shape == op_out_shape(name, shape) and y.dtype == x.dtype
        (y * 2).sum().backward()
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype
        x.grad = None
        with torch.no_grad():
            assert OPS[name](x, mode=mode, backend=engine).shape == op_out_shape(name, shape)


def test_reported_errors_name_the_argument():
    x = torch.rand(1, 1, 5, 5)
    with pytest.raises(ValueError, match="sigma"):
        tf.gaussian_filter(x, -1.0)
    with pytest.raises(ValueError, match="sigma"):
        tf.gaussian_filter(x, float("nan"))
    with pytest.raises(ValueError, match="mode"):
        tf.sobel(x, mode="replicate")
    with pytest.raises(ValueError, match="operator"):
        tf.derivative(x, operator="laplace")
    with pytest.raises(ValueError, match="mask"):
        tf.selective_blur(x, mask=torch.ones(3, 5, dtype=torch.bool))


# ------------------------------------------------ the cases that started it


def test_case1_gradient_magnitude_equals_two_scipy_convolves(engine):
    """gradient_magnitude(x, 'central', 'reflect') == sqrt(a^2 + b^2) with
    a = ndi.convolve(x, k), k = [[0,0,0],[1,0,-1],[0,0,0]] shaped (1,1,3,3), b with k^T."""
    x = torch.randn(6, 4, 28, 28, generator=torch.Generator().manual_seed(1))  # float32
    x_np = x.numpy()
    k = np.array([[0, 0, 0], [1, 0, -1], [0, 0, 0]], dtype=np.float32).reshape(1, 1, 3, 3)
    a = ndi.convolve(x_np, k)  # default mode='reflect'
    b = ndi.convolve(x_np, k.transpose(0, 1, 3, 2))
    expected = np.sqrt(a.astype(np.float64) ** 2 + b.astype(np.float64) ** 2)
    y = tf.gradient_magnitude(x, operator="central", mode="reflect", backend=engine)
    assert y.dtype == torch.float32 and y.shape == x.shape
    np.testing.assert_allclose(y.numpy(), expected, rtol=2e-6, atol=2e-6 * float(np.abs(expected).max()))
    # the kernel's sign convention: a is d/dx (x[j+1] - x[j-1]), b is d/dy
    g = tf.gradient(x, operator="central", backend=engine)
    np.testing.assert_allclose(g[..., 1, :, :].numpy(), a, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(g[..., 0, :, :].numpy(), b, rtol=1e-6, atol=1e-5)


def _gan_loop(x: torch.Tensor) -> torch.Tensor:
    """The plain per-pixel reference loop of the GAN case (differentiable: torch scalars)."""
    k = [[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]
    *lead, H, W = x.shape
    flat = x.reshape(-1, H, W)
    planes = []
    for p in range(flat.shape[0]):
        rows = []
        for i in range(H):
            row = []
            for j in range(W):
                v = flat[p, i, j]
                if 1 <= i < H - 1 and 1 <= j < W - 1 and float(v.detach()) >= 0.0:
                    acc = 0.0
                    for a in range(3):
                        for b in range(3):
                            acc = acc + k[a][b] * flat[p, i + a - 1, j + b - 1]  # original values
                    v = acc / 16.0
                row.append(v)
            rows.append(torch.stack(row))
        planes.append(torch.stack(rows))
    return torch.stack(planes).reshape(x.shape)


@pytest.mark.parametrize("shape", [(2, 2, 6, 7), (1, 1, 3, 3), (1, 1, 2, 5)], ids=str)
def test_case2_selective_blur_keep_border_equals_python_loop(engine, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x[..., 0, 0] = 0.0  # exactly at the threshold: selected (x >= 0)
    ref = _gan_loop(x)
    y = tf.selective_blur(x, 0.0, keep_border=True, backend=engine)
    torch.testing.assert_close(y, ref, rtol=1e-14, atol=1e-14)
    # the loop left the border and the negative pixels alone
    neg = x < 0
    assert torch.equal(y[neg], x[neg])
    assert torch.equal(y[..., 0, :], x[..., 0, :]) and torch.equal(y[..., :, -1], x[..., :, -1])
    # float32 as in the GAN
    y32 = tf.selective_blur(x.float(), 0.0, keep_border=True, backend=engine)
    torch.testing.assert_close(y32, ref.float(), rtol=1e-6, atol=1e-6)


def test_case2_selective_blur_backward_equals_python_loop_backward(engine):
    x = torch.randn(1, 2, 5, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x1 = x.clone().requires_grad_(True)
    (tf.selective_blur(x1, 0.0, keep_border=True, backend=engine) * g).sum().backward()
    x2 = x.clone().requires_grad_(True)
    (_gan_loop(x2) * g).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-14, atol=1e-14)
