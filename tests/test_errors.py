"""Every bad argument: its exact exception type, and the argument named in the message."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import torchfilters as tf
from torchfilters import BackendUnavailableError
from conftest import OPS, op_out_shape

X = torch.rand(2, 1, 5, 6)
OP_NAMES = sorted(OPS)

# one call per public function taking (input, mode=..., cval=...)
from _public import PUBLIC, TWO_AXES  # noqa: E402
PUBLIC_NAMES = sorted(PUBLIC)


def raises(exc, *words):
    """``pytest.raises(exc)`` whose message contains every one of ``words`` (case-insensitive)."""
    pattern = "".join(f"(?=.*{re.escape(w)})" for w in words)
    return pytest.raises(exc, match=re.compile(pattern, re.IGNORECASE | re.DOTALL))


# ---------------------------------------------------------------------- input


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_input_not_a_tensor(name):
    with raises(TypeError, "input", "ndarray", "torchfilters.ndimage"):  # the NumPy API is named
        PUBLIC[name](np.zeros((5, 5)))
    with raises(TypeError, "input", "list"):
        PUBLIC[name]([[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_bool_and_complex_input_name_the_dtype(name, dtype):
    x = torch.zeros(4, 4, dtype=dtype)
    with raises(TypeError, "input", str(dtype)):
        PUBLIC[name](x)


def test_float8_input_is_refused():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8 in this torch")
    with raises(TypeError, "input", "float8"):
        tf.sobel(torch.zeros(4, 4).to(torch.float8_e4m3fn))


@pytest.mark.parametrize("shape", [(), (5,), (0,)], ids=str)
@pytest.mark.parametrize("name", TWO_AXES)
def test_input_with_fewer_than_2_dims(name, shape):
    with raises(ValueError, "input", "2 dimensions", str(tuple(shape))):
        PUBLIC[name](torch.zeros(shape))


# ----------------------------------------------------------------------- mode


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_unknown_mode(name):
    with raises(ValueError, "mode", "'bogus'", "'reflect'", "'mirror'", "'nearest'", "'wrap'", "'constant'"):
        PUBLIC[name](X, mode="bogus")


FOREIGN = {
    "replicate": "nearest",  # torch F.pad
    "circular": "wrap",  # torch F.pad
    "zeros": "constant",  # torch padding_mode
    "border": "nearest",  # grid_sample
    "reflection": "mirror",  # grid_sample
    "edge": "nearest",  # numpy.pad
    "symmetric": "reflect",  # numpy.pad
    "BORDER_REFLECT_101": "mirror",  # OpenCV
    "BORDER_REFLECT": "reflect",
    "BORDER_REPLICATE": "nearest",
    "BORDER_WRAP": "wrap",
    "BORDER_CONSTANT": "constant",
    "cv2.BORDER_DEFAULT": "mirror",
}


@pytest.mark.parametrize("foreign", sorted(FOREIGN))
def test_torch_and_opencv_mode_names_suggest_scipy_name(foreign):
    with raises(ValueError, "mode", repr(foreign), f"mode={FOREIGN[foreign]!r}"):
        tf.gradient_magnitude(X, mode=foreign)


@pytest.mark.parametrize("name", ["correlate", "gaussian_filter", "selective_blur", "gradient"])
def test_replicate_and_circular_everywhere(name):
    with raises(ValueError, "mode", "'nearest'"):
        PUBLIC[name](X, mode="replicate")
    with raises(ValueError, "mode", "'wrap'"):
        PUBLIC[name](X, mode="circular")


@pytest.mark.parametrize("bad", [0, None, ("reflect", 3)], ids=repr)
def test_mode_not_a_string(bad):
    with raises(TypeError, "mode"):
        tf.sobel(X, mode=bad)


def test_mode_names_are_case_sensitive_like_scipy():
    with raises(ValueError, "mode", "'Reflect'"):
        tf.sobel(X, mode="Reflect")


@pytest.mark.parametrize("bad", ["1", None, True, 1j], ids=repr)
@pytest.mark.parametrize("name", ["correlate", "sobel", "gaussian_filter", "selective_blur", "gradient_magnitude"])
def test_bad_cval(name, bad):
    with raises(TypeError, "cval"):
        PUBLIC[name](X, mode="constant", cval=bad)


# ------------------------------------------------------- operator, axis, flags


@pytest.mark.parametrize("name", ["derivative", "gradient", "gradient_magnitude", "gradient_direction"])
def test_unknown_operator(name):
    with raises(ValueError, "operator", "'laplace'", "'central'", "'sobel'", "'scharr'", "'prewitt'"):
        PUBLIC[name](X, operator="laplace")
    with raises(ValueError, "operator"):
        PUBLIC[name](X, operator="Sobel")
    with raises(TypeError, "operator"):
        PUBLIC[name](X, operator=None)


AXIS_FUNCS = {
    "derivative": lambda x, axis: tf.derivative(x, axis),
    "sobel": lambda x, axis: tf.sobel(x, axis),
    "prewitt": lambda x, axis: tf.prewitt(x, axis=axis),
    "scharr": lambda x, axis: tf.scharr(x, axis),
    "correlate1d": lambda x, axis: tf.correlate1d(x, [1.0, 2.0, 3.0], axis),
    "convolve1d": lambda x, axis: tf.convolve1d(x, [1.0, 2.0, 3.0], axis=axis),
}


@pytest.mark.parametrize("axis", [4, -5, 100])
@pytest.mark.parametrize("name", sorted(AXIS_FUNCS))
def test_axis_out_of_range(name, axis):
    with raises(ValueError, "axis", str(axis), "out of range"):
        AXIS_FUNCS[name](X, axis)


@pytest.mark.parametrize("axis", [0, 1, -3])
@pytest.mark.parametrize("name", ["derivative", "sobel", "prewitt", "scharr"])
def test_derivative_axis_outside_axes(name, axis):
    with raises(ValueError, "axis", str(axis), "axes"):
        AXIS_FUNCS[name](X, axis)


@pytest.mark.parametrize("axis", [-1.0, True, "x", None], ids=repr)
@pytest.mark.parametrize("name", sorted(AXIS_FUNCS))
def test_bad_axis_type(name, axis):
    with raises(TypeError, "axis"):
        AXIS_FUNCS[name](X, axis)


@pytest.mark.parametrize("name", ["derivative", "gradient", "gradient_magnitude"])
def test_normalized_must_be_bool(name):
    with raises(TypeError, "normalized"):
        PUBLIC[name](X, normalized=1)
    with raises(TypeError, "normalized"):
        PUBLIC[name](X, normalized="yes")


# --------------------------------------------------------------------- sigma


SIGMA_FUNCS = {
    "gaussian_filter": lambda s, **k: tf.gaussian_filter(X, s, **k),
    "gaussian_gradient_magnitude": lambda s, **k: tf.gaussian_gradient_magnitude(X, s, **k),
    "selective_blur": lambda s, **k: tf.selective_blur(X, sigma=s, **k),
}


@pytest.mark.parametrize(
    "sigma", [-1.0, -1e-9, float("nan"), float("inf"), (1.0, -0.5), (float("nan"), 1.0)], ids=repr
)
@pytest.mark.parametrize("name", sorted(SIGMA_FUNCS))
def test_bad_sigma_value(name, sigma):
    with raises(ValueError, "sigma"):
        SIGMA_FUNCS[name](sigma)


@pytest.mark.parametrize("sigma", [(1.0, 2.0, 3.0), (1.0,), []], ids=repr)
@pytest.mark.parametrize("name", sorted(SIGMA_FUNCS))
def test_sigma_wrong_length(name, sigma):
    with raises(ValueError, "sigma", "one per axis"):
        SIGMA_FUNCS[name](sigma)


@pytest.mark.parametrize("sigma", ["1", None, 1j], ids=repr)
def test_sigma_wrong_type(sigma):
    with raises(TypeError, "sigma"):
        tf.gaussian_filter(X, sigma)


def test_sigma_as_tensor_is_accepted():
    ref = tf.gaussian_filter(X, (1.0, 2.0))
    assert torch.equal(tf.gaussian_filter(X, torch.tensor([1.0, 2.0])), ref)
    assert torch.equal(tf.gaussian_filter(X, torch.tensor(1.5)), tf.gaussian_filter(X, 1.5))


@pytest.mark.parametrize("order", [-1, (0, -2)], ids=repr)
def test_negative_order(order):
    with raises(ValueError, "order"):
        tf.gaussian_filter(X, 1.0, order=order)


@pytest.mark.parametrize("order", [1.5, "1", (1, 0.5), True], ids=repr)
def test_order_wrong_type(order):
    with raises(TypeError, "order"):
        tf.gaussian_filter(X, 1.0, order=order)


def test_order_wrong_length():
    with raises(ValueError, "order"):
        tf.gaussian_filter(X, 1.0, order=(1, 0, 0))


@pytest.mark.parametrize("truncate", [-1.0, float("nan"), float("inf")], ids=repr)
@pytest.mark.parametrize("name", sorted(SIGMA_FUNCS))
def test_bad_truncate(name, truncate):
    with raises(ValueError, "truncate"):
        SIGMA_FUNCS[name](1.0, truncate=truncate)


@pytest.mark.parametrize("radius", [-1, (2, -1)], ids=repr)
@pytest.mark.parametrize("name", ["gaussian_filter", "gaussian_gradient_magnitude"])
def test_negative_radius(name, radius):
    with raises(ValueError, "radius"):
        SIGMA_FUNCS[name](1.0, radius=radius)


@pytest.mark.parametrize("radius", [1.5, "2", (1, 2.0)], ids=repr)
def test_radius_wrong_type(radius):
    """Like ``order`` and ``origin``: a non-int radius is a TypeError."""
    with raises(TypeError, "radius"):
        tf.gaussian_filter(X, 1.0, radius=radius)


def test_radius_wrong_length():
    with raises(ValueError, "radius"):
        tf.gaussian_filter(X, 1.0, radius=(1, 2, 3))


# ----------------------------------------------------------- weights, origin


@pytest.mark.parametrize("fn", [tf.correlate, tf.convolve], ids=lambda f: f.__name__)
def test_weights_2d_shape(fn):
    with raises(ValueError, "weights", "2-D"):
        fn(X, [1.0, 2.0, 3.0])
    with raises(ValueError, "weights", "2-D"):
        fn(X, torch.ones(1, 3, 3))
    with raises(ValueError, "weights", "empty"):
        fn(X, torch.ones(0, 3))


@pytest.mark.parametrize("fn", [tf.correlate1d, tf.convolve1d], ids=lambda f: f.__name__)
def test_weights_1d_shape(fn):
    with raises(ValueError, "weights", "1-D"):
        fn(X, [[1.0, 2.0]])
    with raises(ValueError, "weights", "1-D"):
        fn(X, 2.0)
    with raises(ValueError, "weights", "empty"):
        fn(X, [])


@pytest.mark.parametrize("fn", [tf.correlate, tf.convolve, tf.selective_blur], ids=lambda f: f.__name__)
def test_weights_bad_type_or_dtype(fn):
    call = (lambda w: fn(X, weights=w)) if fn is tf.selective_blur else (lambda w: fn(X, w))
    with raises(TypeError, "weights"):
        call(torch.ones(3, 3, dtype=torch.bool))
    with raises(TypeError, "weights"):
        call(torch.ones(3, 3, dtype=torch.complex64))
    with raises(TypeError, "weights"):
        call("abc")
    with raises(ValueError, "weights", "requires grad"):
        call(torch.ones(3, 3, requires_grad=True))


def test_weights_requires_grad_1d():
    with raises(ValueError, "weights", "detach"):
        tf.correlate1d(X, torch.ones(3, requires_grad=True))


def test_scalar_arguments_that_require_grad():
    """Found by review: a cval (amount, threshold, sigma) tensor that requires grad was read with
    ``.item()``, its gradient silently never computed; like weights, it raises."""
    g = lambda: torch.tensor(0.5, dtype=torch.float64, requires_grad=True)  # noqa: E731
    for name, call in [("cval", lambda v: tf.gaussian_filter(X, 1.0, mode="constant", cval=v)),
                       ("amount", lambda v: tf.unsharp_mask(X, 1.0, v)),
                       ("threshold", lambda v: tf.selective_blur(X, v)),
                       ("sigma", lambda v: tf.gaussian_filter(X, v)),
                       ("sigma", lambda v: tf.gaussian_filter(X, torch.stack([v, v])))]:
        with raises(ValueError, name, "requires grad"):
            call(g())
        call(g().detach())


@pytest.mark.parametrize("fn", [tf.correlate, tf.convolve], ids=lambda f: f.__name__)
def test_invalid_origin_2d(fn):
    w = torch.ones(3, 4)
    for origin in [(2, 0), (0, 2), (-2, 0), (0, -3), 2, -2]:
        with raises(ValueError, "origin"):
            fn(X, w, origin=origin)
    with raises(ValueError, "origin"):
        fn(X, w, origin=(0, 0, 0))
    with raises(TypeError, "origin"):
        fn(X, w, origin=0.5)
    with raises(TypeError, "origin"):
        fn(X, w, origin=(0, True))
    # the extremes are fine
    fn(X, w, origin=(-1, -2))
    fn(X, w, origin=(1, 1))


@pytest.mark.parametrize("fn", [tf.correlate1d, tf.convolve1d], ids=lambda f: f.__name__)
def test_invalid_origin_1d(fn):
    for origin in (2, -3):
        with raises(ValueError, "origin"):
            fn(X, [1.0, 2.0, 3.0, 4.0], origin=origin)
    for origin in (0.0, "1", (0, 0), True):
        with raises(TypeError, "origin"):
            fn(X, [1.0, 2.0, 3.0], origin=origin)


# ------------------------------------------------------------ selective blur


def test_sigma_and_weights_both_given():
    with raises(ValueError, "sigma", "weights"):
        tf.selective_blur(X, sigma=1.0, weights=torch.ones(3, 3))


@pytest.mark.parametrize("shape", [(3, 6), (5, 5), (2, 2, 5, 6), (3, 1, 5, 6), (1, 2, 1, 5, 6)], ids=str)
def test_mask_that_does_not_broadcast(shape):
    with raises(ValueError, "mask", str(tuple(shape)), str(tuple(X.shape))):
        tf.selective_blur(X, mask=torch.ones(shape, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.int64], ids=str)
def test_mask_must_be_bool(dtype):
    with raises(TypeError, "mask", str(dtype)):
        tf.selective_blur(X, mask=torch.ones(5, 6, dtype=dtype))


def test_mask_must_be_a_tensor():
    with raises(TypeError, "mask"):
        tf.selective_blur(X, mask=np.ones((5, 6), dtype=bool))


@pytest.mark.parametrize("bad", [float("nan")], ids=repr)
def test_threshold_nan(bad):
    with raises(ValueError, "threshold"):
        tf.selective_blur(X, bad)


@pytest.mark.parametrize("bad", ["0", None, 1j], ids=repr)
def test_threshold_wrong_type(bad):
    with raises(TypeError, "threshold"):
        tf.selective_blur(X, bad)


def test_normalized_needs_nonnegative_weights():
    w = torch.ones(3, 3)
    w[0, 0] = -1
    with raises(ValueError, "weights", "normalized"):
        tf.selective_blur(X, weights=w, normalized=True)
    tf.selective_blur(X, weights=w)  # fine for the blend variant


@pytest.mark.parametrize("flag", ["normalized", "keep_border"])
def test_blur_flags_must_be_bool(flag):
    with raises(TypeError, flag):
        tf.selective_blur(X, **{flag: 1})


# ------------------------------------------------------------------------ out


@pytest.mark.parametrize("name", OP_NAMES)
def test_out_wrong_shape_dtype_type(name):
    shape = op_out_shape(name, X.shape)
    with raises(ValueError, "out", "shape"):
        OPS[name](X, out=torch.empty(shape[:-1] + (shape[-1] + 1,)))
    with raises(ValueError, "out", "shape"):
        OPS[name](X, out=torch.empty(2, 5, 6))
    with raises(TypeError, "out", "dtype", "torch.float64"):
        OPS[name](X, out=torch.empty(shape, dtype=torch.float64))
    with raises(TypeError, "out"):
        OPS[name](X, out=np.empty(shape, dtype=np.float32))


@pytest.mark.parametrize("name", OP_NAMES)
def test_out_with_requires_grad_input(name):
    x = X.clone().requires_grad_(True)
    out = torch.empty(op_out_shape(name, X.shape))
    with raises(RuntimeError, "out=", "grad"):
        OPS[name](x, out=out)
    with torch.no_grad():  # allowed when no graph is recorded
        assert OPS[name](x, out=out) is out


def test_gaussian_sigma0_out_checks():
    with raises(ValueError, "out"):
        tf.gaussian_filter(X, 0.0, out=torch.empty(3, 3))
    with raises(RuntimeError, "out="):
        tf.gaussian_filter(X.clone().requires_grad_(True), 0.0, out=torch.empty_like(X))


# -------------------------------------------------------------------- backend


@pytest.mark.parametrize("bad", ["numba", "gpu", "", 1])
def test_unknown_backend(bad):
    with raises(ValueError, "backend", "'reference'"):
        tf.sobel(X, backend=bad)


def test_triton_backend_on_cpu_tensor():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 lets Triton run CPU tensors")
    with pytest.raises(BackendUnavailableError, match="triton"):
        tf.sobel(X, backend="triton")
    assert issubclass(BackendUnavailableError, RuntimeError)


def test_bad_backend_environment_variable(monkeypatch):
    monkeypatch.setenv("TORCHFILTERS_BACKEND", "fast")
    with raises(ValueError, "TORCHFILTERS_BACKEND", "'fast'"):
        tf.sobel(X)
    monkeypatch.setenv("TORCHFILTERS_BACKEND", "reference")
    assert torch.equal(tf.sobel(X), tf.sobel(X, backend="reference"))


# ------------------------------------------------------------------ nn modules


def test_nn_modules_validate_at_construction():
    with raises(ValueError, "mode", "'nearest'"):
        tf.nn.GradientMagnitude(mode="replicate")
    with raises(ValueError, "operator"):
        tf.nn.GradientMagnitude(operator="roberts")
    with raises(ValueError, "sigma"):
        tf.nn.GaussianFilter(sigma=-1.0)
    with raises(ValueError, "sigma", "weights"):
        tf.nn.SelectiveBlur(sigma=1.0, weights=[[1.0]])
    with raises(ValueError, "mode"):
        tf.nn.SelectiveBlur(mode="circular")
    m = tf.nn.SelectiveBlur()
    with raises(ValueError, "mask"):
        m(X, mask=torch.ones(4, 4, dtype=torch.bool))
