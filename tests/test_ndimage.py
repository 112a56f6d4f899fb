"""``torchfilters.ndimage``: SciPy's dtype rules and errors, beyond SciPy's own tests
(``test_scipy_suite.py``), with SciPy itself as the oracle."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi

import torchfilters.ndimage as tfn

RNG = np.random.default_rng(0)
NAMES_1D = ("correlate1d", "convolve1d", "gaussian_filter1d", "uniform_filter1d")


def _call(mod, name, a, **kw):
    f = getattr(mod, name)
    if name in ("correlate", "convolve"):
        return f(a, np.arange(1.0, 1 + 3 ** a.ndim).reshape((3,) * a.ndim) / 10, **kw)
    if name in ("correlate1d", "convolve1d"):
        return f(a, [1.0, -2.0, 0.5, 3.0], **kw)
    if name in ("gaussian_filter", "gaussian_filter1d", "gaussian_gradient_magnitude", "gaussian_laplace"):
        return f(a, 1.3, **kw)
    if name == "uniform_filter1d":
        return f(a, 4, **kw)
    return f(a, **kw)


@pytest.mark.parametrize("name", tfn.__all__[:4] + ["sobel", "prewitt", "laplace", "gaussian_filter",
                                                    "gaussian_filter1d", "gaussian_gradient_magnitude",
                                                    "gaussian_laplace", "uniform_filter", "uniform_filter1d"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int64, np.float32, np.float64])
def test_dtype_rules_match_scipy(name, dtype):
    a = (RNG.random((5, 6, 7)) * 100 - (0 if np.dtype(dtype).kind == "u" else 50)).astype(dtype)
    mode = "nearest"
    ours = _call(tfn, name, a, mode=mode)
    ref = _call(ndi, name, a, mode=mode)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    if np.dtype(dtype).kind in "iu":
        # integer results: truncated after every pass as SciPy does (a float64 sum may land on the
        # other side of an integer by one ulp: allow 1 where SciPy's own arithmetic order differs)
        assert np.abs(ours.astype(np.int64) - ref.astype(np.int64)).max() <= 1
        assert np.mean(ours == ref) > 0.99
    else:
        tol = 2e-6 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_output_argument_dtype_and_array():
    a = RNG.random((8, 9))
    out = np.empty((8, 9), np.float32)
    r = tfn.gaussian_filter(a, 1.0, output=out)
    assert r is out
    np.testing.assert_allclose(out, ndi.gaussian_filter(a, 1.0, output=np.float32), rtol=1e-6)
    assert tfn.sobel(a, output=np.int32).dtype == np.int32
    with pytest.raises(RuntimeError, match="output shape"):
        tfn.sobel(a, output=np.empty((3, 3)))


@pytest.mark.parametrize("bad, exc", [
    ({"mode": "bogus"}, RuntimeError),
    ({"sigma": (1.0, 2.0, 3.0)}, RuntimeError),
    ({"axes": (0, 0)}, ValueError),
    ({"axes": (5,)}, ValueError),
    ({"axes": (1.5,)}, TypeError),
])
def test_errors_are_scipys(bad, exc):
    a = RNG.random((6, 7))
    kw = {"sigma": 1.0, **bad}
    with pytest.raises(exc):
        ndi.gaussian_filter(a, **kw)
    with pytest.raises(exc):
        tfn.gaussian_filter(a, **kw)


def test_float16_raises_like_scipy():
    a = np.zeros((4, 4), np.float16)
    with pytest.raises(RuntimeError):
        ndi.sobel(a)
    with pytest.raises(RuntimeError, match="array type not supported"):
        tfn.sobel(a)


def test_volumes_and_more_than_three_axes():
    v = RNG.random((2, 3, 4, 5))
    np.testing.assert_allclose(tfn.gaussian_filter(v, 1.0), ndi.gaussian_filter(v, 1.0), rtol=1e-12)
    np.testing.assert_allclose(tfn.sobel(v, 2), ndi.sobel(v, 2), rtol=1e-12)
    np.testing.assert_allclose(tfn.laplace(v), ndi.laplace(v), rtol=1e-12)
    np.testing.assert_allclose(tfn.uniform_filter(v, 3), ndi.uniform_filter(v, 3), rtol=1e-12)
    w = np.ones((2, 2, 2, 2))
    with pytest.raises(NotImplementedError, match="up to 3 axes"):
        tfn.correlate(v, w)
    w = np.ones((1, 2, 2, 2))  # reaches along 3 axes only: fine
    np.testing.assert_allclose(tfn.correlate(v, w), ndi.correlate(v, w), rtol=1e-12)


def test_float32_in_float32_out_without_conversions():
    a = RNG.random((3, 16, 17)).astype(np.float32)
    y = tfn.gaussian_filter(a, 2.0, axes=(-2, -1))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ndi.gaussian_filter(a, 2.0, axes=(-2, -1)), rtol=2e-6, atol=1e-6)
    b = a[:, ::2, ::-1]  # negative strides: a copy, same values
    np.testing.assert_allclose(tfn.uniform_filter(b, 5), ndi.uniform_filter(b, 5), rtol=2e-6, atol=1e-6)


def test_review_findings_follow_scipy():
    """Found by review: bool outputs truncate (0.9 is False), grid-* modes over more than three
    axes, SciPy's exception types."""
    xb = np.array([True, False, False, False, True, False])
    assert np.array_equal(tfn.gaussian_filter(xb, 1.0), ndi.gaussian_filter(xb, 1.0))
    assert np.array_equal(tfn.correlate1d(xb, [0.2, 0.3, 0.1]), ndi.correlate1d(xb, [0.2, 0.3, 0.1]))
    x = RNG.random((2, 3, 1, 5))
    np.testing.assert_allclose(tfn.sobel(x, 0, mode="grid-wrap"), ndi.sobel(x, 0, mode="grid-wrap"), rtol=1e-12)
    for call, exc in [
        (lambda m: m.gaussian_filter(np.array([1 + 1j, 2, 3, 4]), 1, output=np.float64), RuntimeError),
        (lambda m: m.correlate1d(np.arange(5.0), [1, 2], cval=1j), TypeError),
        (lambda m: m.correlate1d(np.arange(5.0), [1, 2, 3], origin=0.5), TypeError),
        (lambda m: m.gaussian_filter(np.arange(5.0), 1.0, truncate=-3), ValueError),
    ]:
        with pytest.raises(exc):
            call(ndi)
        with pytest.raises(exc):
            call(tfn)
    np.testing.assert_array_equal(tfn.gaussian_filter(np.arange(5.0), 1.0, truncate=-1),
                                  ndi.gaussian_filter(np.arange(5.0), 1.0, truncate=-1))
