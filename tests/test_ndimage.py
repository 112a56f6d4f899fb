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
    # (found by review) a min / max box over 4 axes is SciPy's separable passes, in any dtype
    for a in (v, (v * 100).astype(np.int16)):
        for f in ("minimum_filter", "maximum_filter"):
            for kw in (dict(size=3), dict(size=(2, 3, 1, 2), origin=(-1, 1, 0, 0)), dict(footprint=np.ones((2,) * 4))):
                assert np.array_equal(getattr(tfn, f)(a, **kw), getattr(ndi, f)(a, **kw)), (f, kw)
    # a 0-d array: the one product (correlate raised IndexError)
    for f in ("correlate", "convolve"):
        for a, out in ((np.array(2.0), None), (np.array(7, np.uint8), None), (np.array(2.0), np.float32)):
            got, want = getattr(tfn, f)(a, np.array(3.5), output=out), getattr(ndi, f)(a, np.array(3.5), output=out)
            assert got.shape == () and got.dtype == want.dtype and got == want


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


# ----------------------------------------------------------------- rank filters


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64, np.float32,
                                   np.float64, np.bool_])
def test_rank_filters_exact_in_every_dtype(dtype):
    import scipy.ndimage as ndi

    rng = np.random.default_rng(3)
    if dtype == np.bool_:
        a = rng.random((9, 8)) > 0.5
    elif np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(max(info.min, -(2**52)), min(info.max, 2**52), (9, 8), dtype=dtype, endpoint=True)
    else:
        a = rng.standard_normal((9, 8)).astype(dtype)
    fp = [[1, 0, 1], [1, 1, 0]]
    for name, args, kw in [("median_filter", (3,), {}), ("rank_filter", (2,), dict(footprint=fp)),
                           ("percentile_filter", (40, (2, 3)), dict(mode="constant", cval=1)),
                           ("minimum_filter", ((3, 2),), dict(mode="wrap")), ("maximum_filter", (), dict(footprint=fp)),
                           ("minimum_filter1d", (4,), dict(mode="mirror")), ("maximum_filter1d", (3, 0), {})]:
        got = getattr(tfn, name)(a, *args, **kw)
        want = getattr(ndi, name)(a, *args, **kw)
        assert got.dtype == want.dtype and np.array_equal(got, want), (name, dtype)


def test_rank_filters_exact_for_64_bit_integers_beyond_2_53():
    """SciPy's rank filters go through float64 and round such values (an oracle that does not:
    ``numpy.sort`` over the windows of the ``np.pad(mode="symmetric")`` = SciPy ``reflect``)."""
    rng = np.random.default_rng(1)
    a = rng.integers(-(2**62), 2**62, (6, 7), dtype=np.int64)
    a[2, 3] = a[2, 4] + 1
    win = np.lib.stride_tricks.sliding_window_view(np.pad(a, 1, mode="symmetric"), (3, 3))
    want = np.sort(win.reshape(6, 7, 9), axis=-1, kind="stable")[..., 4]
    assert np.array_equal(tfn.median_filter(a, 3), want)
    u = a.astype(np.uint64) + np.uint64(2**63)
    assert np.array_equal(tfn.maximum_filter(u, 3), (np.sort(win.reshape(6, 7, 9), axis=-1)[..., 8]).astype(np.uint64)
                          + np.uint64(2**63))


def test_rank_filters_scipy_quirks():
    import scipy.ndimage as ndi

    a = np.arange(20.0).reshape(4, 5)
    with pytest.warns(UserWarning, match="ignoring size"):
        tfn.median_filter(a, 3, footprint=[[1, 1]])
    with pytest.raises(RuntimeError, match="sequence of modes"):
        tfn.median_filter(a, 3, mode=["reflect", "wrap"])
    assert np.array_equal(tfn.rank_filter(a, 0, 3, mode=["reflect", "wrap"]),
                          ndi.rank_filter(a, 0, 3, mode=["reflect", "wrap"]))
    with pytest.raises(RuntimeError, match="array type"):
        tfn.median_filter(a.astype(np.float16), 3)
    h = np.arange(7, dtype=np.float16)  # SciPy's 1-D rank filters take float16
    assert np.array_equal(tfn.median_filter(h, 3), ndi.median_filter(h, 3))
    out = np.zeros((4, 5), np.int8)
    assert tfn.median_filter(a * 1.7, 3, output=out) is out
    assert np.array_equal(out, ndi.median_filter(a * 1.7, 3, output=np.int8))
    with pytest.raises(TypeError):
        tfn.median_filter(a + 1j, 3)
    # a window over 4 axes: NumPy's selection over the mode-extended windows (it raised)
    v4 = np.random.default_rng(2).standard_normal((3, 4, 5, 6))
    v4[0, 1, 2, 3] = v4[1, 1, 2, 3]  # (ties)
    fp = np.random.default_rng(3).random((2, 3, 2, 3)) > 0.4
    for kw in (dict(size=2), dict(size=(3, 1, 2, 4), mode="wrap", origin=(1, 0, 0, -1)),
               dict(footprint=fp, mode="mirror"), dict(size=3, mode="constant", cval=0.25),
               dict(size=(2, 3, 3, 2), mode="nearest"), dict(size=9, mode="reflect")):
        assert np.array_equal(tfn.median_filter(v4, **kw), ndi.median_filter(v4, **kw)), kw
        assert np.array_equal(tfn.rank_filter(v4, 1, **kw), ndi.rank_filter(v4, 1, **kw)), kw
        assert np.array_equal(tfn.percentile_filter(v4, 70, **kw), ndi.percentile_filter(v4, 70, **kw)), kw
    i4 = (v4 * 40).astype(np.int16)
    assert np.array_equal(tfn.median_filter(i4, 3, mode="constant", cval=300.5),
                          ndi.median_filter(i4, 3, mode="constant", cval=300.5))
    assert np.array_equal(tfn.median_filter(v4[::2, :, ::-1], 2, output=np.float32),
                          ndi.median_filter(v4[::2, :, ::-1], 2, output=np.float32))


def test_min_max_size_origins_follow_axes_order():
    """Found by review: with ``size=`` (SciPy's separable path) each origin goes with its axis
    in ``axes``' order; the drop-in applied them in plain axis order when ``axes`` named every
    axis (a silently wrong result, or 'invalid origin' for a valid one).  A full footprint takes
    the same path; a partial one keeps SciPy's other rule (its dims in increasing axis order)."""
    rng = np.random.default_rng(7)
    x2 = np.arange(56.0)[::-1].reshape(7, 8) % 11
    x3 = rng.standard_normal((5, 6, 7))
    cases = [(x2, (3, 4), (-1, 1), (1, 0), "reflect"), (x2, (3, 4), (1, -2), (1, 0), "reflect"),
             (x2, (2, 3), (0, 1), (-1, -2), ("wrap", "constant")), (x3, (2, 3, 4), (0, -1, 1), (2, 0, 1), "nearest"),
             (x3, (4, 1, 3), (-2, 0, 1), (1, 2, 0), ("mirror", "wrap", "reflect")), (x3, (3, 2), (1, -1), (2, 0), "wrap")]
    for x, size, origin, axes, mode in cases:
        for name in ("maximum_filter", "minimum_filter"):
            kw = dict(origin=origin, axes=axes, mode=mode)
            assert np.array_equal(getattr(tfn, name)(x, size=size, **kw), getattr(ndi, name)(x, size=size, **kw)), \
                (name, size, kw)
            fp = np.ones(size, bool)
            assert np.array_equal(getattr(tfn, name)(x, footprint=fp, **kw), getattr(ndi, name)(x, footprint=fp, **kw))
    for kw in (dict(size=0), dict(size=True), dict(size=(0, 3)), dict(size=2.5), dict(size=(1, 3), origin=(5, 1)),
               dict(size=(2.5, 3.7), origin=(0, 1))):  # SciPy's passes: sizes > 1, int()-ed
        assert np.array_equal(tfn.maximum_filter(x2, **kw), ndi.maximum_filter(x2, **kw)), kw
    fp = np.array([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]], bool)  # partial: dims in axis order
    for origin in ((-1, 1), (1, 0)):
        kw = dict(footprint=fp, origin=origin, axes=(1, 0))
        assert np.array_equal(tfn.maximum_filter(x2, **kw), ndi.maximum_filter(x2, **kw)), origin


def test_sobel_and_prewitt_take_a_complex_cval_for_a_complex_input():
    """Found by review: refused with 'a complex cval needs a complex input' for a complex input."""
    r = np.random.default_rng(0).standard_normal((4, 5, 3))
    c = r * (1 + 1j) + 0.5j
    for name in ("sobel", "prewitt"):
        for axis in (0, 2):
            for mode in ("constant", ("wrap", "constant", "nearest")):
                want = getattr(ndi, name)(c, axis, mode=mode, cval=1 - 2j)
                np.testing.assert_allclose(getattr(tfn, name)(c, axis, mode=mode, cval=1 - 2j), want, rtol=1e-13,
                                           atol=1e-13 * np.abs(want).max())
        with pytest.raises(TypeError):  # a real input: SciPy's TypeError too
            getattr(tfn, name)(r, mode="constant", cval=1 - 2j)


def test_second_review_argument_rules_are_scipys():
    """Found by review: a cval that is not a real number (None, a string, a complex number for
    a real rank filter) is SciPy's TypeError; a 1-D filter's size must be an integer; a new
    output is in native byte order; ``laplace`` into its own input gives SciPy's result (its
    second pass reads what the first wrote)."""
    x = np.random.default_rng(0).standard_normal((5, 6))
    with pytest.warns(np.exceptions.ComplexWarning):  # a NumPy complex scalar: its real part, as SciPy
        y = tfn.median_filter(x, 3, mode="constant", cval=np.complex128(2 + 1j))
    assert np.array_equal(y, ndi.median_filter(x, 3, mode="constant", cval=2.0))
    assert np.array_equal(tfn.gaussian_filter(x, 1.0, mode="constant", cval=np.array(2.0)),
                          ndi.gaussian_filter(x, 1.0, mode="constant", cval=2.0))
    for cval in (None, "1", 1j, np.array(1 + 1j), np.datetime64(1, "s"), np.array([2.0])):
        for call in (lambda: tfn.median_filter(x, 3, mode="constant", cval=cval),
                     lambda: tfn.maximum_filter1d(x, 3, mode="constant", cval=cval),
                     lambda: tfn.gaussian_filter(x, 1.0, mode="constant", cval=cval)):
            with pytest.raises(TypeError):
                call()
    a3 = np.random.default_rng(1).random((4, 5, 6))
    assert np.array_equal(tfn.minimum_filter(x, size=1, origin=1.0), x)  # (no pass: its origin unread)
    with pytest.raises(ValueError, match="invalid origin"):  # (SciPy's check comes first)
        tfn.minimum_filter(a3, size=2, origin=(1.0,) * 3)
    assert np.array_equal(tfn.minimum_filter1d(x, 3, origin=True), ndi.minimum_filter1d(x, 3, origin=True))
    with pytest.raises(TypeError):  # (the fused path truncated it)
        tfn.uniform_filter(x, 3, origin=1.0)
    # (found by review) correlate1d parses a Python bool origin as an int, the N-D filters do not;
    # a Gaussian order of 0.0 is 0, 1.0 SciPy's TypeError (numpy.zeros(order + 1))
    w4 = [1.0, 2.0, 3.0, 4.0]
    assert np.array_equal(tfn.correlate1d(x, w4, origin=True), ndi.correlate1d(x, w4, origin=True))
    for call in (lambda m: m.correlate(x, np.ones((3, 3)), origin=True),
                 lambda m: m.correlate1d(x, w4, origin=np.True_),
                 lambda m: m.gaussian_filter1d(x, 1.0, order=1.0),
                 lambda m: m.gaussian_filter(x, 1.0, order=(0, 1.0))):
        for m in (ndi, tfn):
            with pytest.raises(TypeError):
                call(m)
    assert np.array_equal(tfn.gaussian_filter(x, 1.0, order=0.0), ndi.gaussian_filter(x, 1.0, order=0.0))
    for name in ("uniform_filter1d", "minimum_filter1d", "maximum_filter1d"):
        with pytest.raises(TypeError):
            getattr(tfn, name)(x, 3, origin=1.0)
        with pytest.raises(TypeError):
            getattr(tfn, name)(x, 2.5)
        with pytest.raises(RuntimeError):
            getattr(tfn, name)(x, 0.5)
    for name, args in (("gaussian_filter", (1.0,)), ("median_filter", (3,)), ("sobel", ())):
        y = getattr(tfn, name)(x.astype(">f8"), *args)
        assert y.dtype == np.dtype("float64") and y.dtype.isnative
        assert np.array_equal(y, getattr(ndi, name)(x.astype(">f8"), *args))
    for name, args in (("gaussian_filter", (1.0,)), ("sobel", ()), ("correlate1d", ([1.0, 2.0],))):
        with pytest.raises(RuntimeError):  # a real filtering into a complex output, as SciPy
            getattr(tfn, name)(x, *args, output=np.complex128)
        y = getattr(tfn, name)(x + 1j, *args, output=np.complex128)  # a complex input: fine
        assert np.allclose(y, getattr(ndi, name)(x + 1j, *args, output=np.complex128))
    u = (np.arange(30).reshape(5, 6)[::-1] * 7 % 11).astype(np.uint32)  # negative passes wrap (review)
    for name, args in (("sobel", (1,)), ("prewitt", (0,)), ("laplace", ()), ("correlate1d", ([1, -3, 1],))):
        assert np.array_equal(getattr(tfn, name)(u, *args), getattr(ndi, name)(u, *args)), name
    a, b = x.copy(), x.copy()
    assert tfn.laplace(a, output=a) is a
    ndi.laplace(b, output=b)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.bool_, np.int64, np.uint64])
def test_rank_filters_cval_as_scipy_treats_it(dtype):
    """SciPy casts ``cval`` to the input's type in its N-D rank and footprint min/max paths, to
    int64 in its 1-D rank path, and not at all in its separable min/max passes."""
    import scipy.ndimage as ndi

    a = (np.arange(42) + 150).astype(dtype).reshape(6, 7)
    cases = [("median_filter", dict(size=3), dict(size=3)), ("rank_filter", dict(rank=7, size=3), dict(rank=1, size=3)),
             ("minimum_filter", dict(size=3), dict(size=3)),
             ("maximum_filter", dict(footprint=[[1, 0, 1]]), dict(footprint=[1, 0, 1])),
             ("minimum_filter1d", dict(size=4), dict(size=4))]
    if a.dtype.itemsize == 8 and a.dtype.kind in "iu":  # (SciPy's 1-D rank path misreads these)
        cases = [c for c in cases if c[0].startswith(("min", "max"))]
    for cv in (300.5, -3.7, 151.9, 0.5, -1):
        if dtype == np.uint64 and cv < 0:
            continue  # (a negative double cast to uint64: undefined in C, SciPy's results vary)
        for name, kw, kw1 in cases:
            with np.errstate(all="ignore"):
                for arr, k in ((a, kw), (a[0], kw1)):
                    # min/max into float64 too: a cval selected is the double SciPy compared (64-bit
                    # and float32 inputs rounded it to their type: found by review).  (Not SciPy's
                    # rank paths nor bool inputs there: they read uninitialised memory, or cval
                    # cast to uint8)
                    wide = name.startswith(("min", "max")) and dtype != np.bool_
                    for output in (None, np.float64) if wide else (None,):
                        got = getattr(tfn, name)(arr, mode="constant", cval=cv, output=output, **k)
                        want = getattr(ndi, name)(arr, mode="constant", cval=cv, output=output, **k)
                        assert got.dtype == want.dtype and np.array_equal(got, want), (name, cv, output)


def test_min_max_of_64_bit_integers_beyond_2_53_compare_the_uncast_cval():
    """Values past 2**53 are filtered as their ranks; a min/max filter's cval takes its place
    among them as the double it is (between two values, or equal to one), and where it is
    selected the output is that double, cast as SciPy casts it.  Oracle: Python's exact
    int / float comparisons over the windows."""
    base = 2**62

    def oracle(a, c, pick):
        p = np.pad(a.astype(object), 1, mode="constant", constant_values=c)
        return [[pick(p[i:i + 3, j:j + 3].ravel().tolist()) for j in range(a.shape[1])] for i in range(a.shape[0])]

    a = np.array([[base + 1, base + 3, 5, -7, 8], [base + 9, 3, base + 1, 9, 2**62 + 2], [7, 8, 9, 2**62, 1]], np.int64)
    u = (a.astype(np.float64) >= 0) * a.astype(np.uint64) + np.uint64(2**63)
    for arr, cvals in ((a, (2.5, -1.0, -8.5, 1e300, -1e300, float(base), float(base + 4), 2.0**63)),
                       (u, (-1.0, 2.5, 2.0**63, 2.0**63 + 2.0**12, 1e300))):
        for name, pick in (("minimum_filter", min), ("maximum_filter", max)):
            for cv in cvals:
                want = oracle(arr, cv, pick)
                got = getattr(tfn, name)(arr, 3, mode="constant", cval=cv, output=np.float64)
                assert np.array_equal(got, np.array(want, np.float64)), (name, cv)
                if all(isinstance(v, int) for row in want for v in row):
                    got = getattr(tfn, name)(arr, 3, mode="constant", cval=cv)
                    assert got.dtype == arr.dtype and got.tolist() == want, (name, cv)



@pytest.mark.parametrize("mode, pad", [("reflect", "symmetric"), ("grid-mirror", "symmetric"), ("mirror", "reflect"),
                                       ("wrap", "wrap")])
def test_weights_far_beyond_a_tiny_image_follow_the_np_pad_oracle(mode, pad):
    """Where SciPy is wrong: its N-D ``correlate`` with weights more than twice the axis long
    reads the wrong samples in ``reflect`` / ``grid-mirror`` mode (off by up to ~8 here).  An
    independent oracle -- ``np.pad`` by the weights' reach, then a valid correlation -- agrees
    with torchfilters in every periodic mode, and so does SciPy's own ``correlate1d`` chain for
    a separable kernel."""
    a = np.random.default_rng(0).random((2, 3))
    w = np.random.default_rng(1).random((20, 21))
    ours = tfn.correlate(a, w, mode=mode)
    p = np.pad(a, ((10, 9), (10, 10)), mode=pad)
    oracle = (np.lib.stride_tricks.sliding_window_view(p, w.shape) * w).sum((-1, -2))
    np.testing.assert_allclose(ours, oracle, rtol=1e-13, atol=1e-13)
    u, v = w[:, 0], w[0]  # separable: SciPy's correlate1d chain is right where its correlate is not
    sep = ndi.correlate1d(ndi.correlate1d(a, u, 0, mode=mode), v, 1, mode=mode)
    np.testing.assert_allclose(tfn.correlate(a, np.outer(u, v), mode=mode), sep, rtol=1e-13, atol=1e-13)
    if mode == "reflect":
        # SciPy's N-D correlate is off (it reads memory it never wrote: sometimes NaN, which the
        # comparison must count as off too)
        assert not np.allclose(ndi.correlate(a, w, mode=mode), oracle, rtol=0, atol=1e-3)


def test_a_cval_past_float32s_range_is_its_infinity_without_a_warning():
    """SciPy casts such a cval to the float32 input's infinity, silently (found by review: a
    NumPy overflow RuntimeWarning here)."""
    import warnings

    import scipy.ndimage as ndi

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("minimum_filter", "maximum_filter", "median_filter"):
            for cv in (1e300, -1e300):
                got = getattr(tfn, name)(a, 3, mode="constant", cval=cv)
                assert np.array_equal(got, getattr(ndi, name)(a, 3, mode="constant", cval=cv)), (name, cv)
