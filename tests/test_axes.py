"""``axes=``: 1, 2 and 3 filtered axes, per-axis modes and parameters, and the ops that came with them.

The oracle is SciPy in float64: its own ``axes=`` call where SciPy has one, else SciPy's
function on each slice of the chosen axes (``sobel``/``prewitt`` and friends have no
``axes``; ``gaussian_gradient_magnitude``/``gaussian_laplace`` smooth unchosen axes too and
take one mode per derivative, so per-axis modes there are checked against their definition
from ``gaussian_filter`` calls).  Grids are sampled (hypothesis; fixed seeds under CI).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf
from conftest import BASE_MODES, CVAL, ENGINES, assert_close, engines, examples, rand, to_np
from _public import PUBLIC

SMOOTH = {"central": None, "sobel": [1.0, 2.0, 1.0], "scharr": [3.0, 10.0, 3.0], "prewitt": [1.0, 1.0, 1.0]}


def raises(exc, *words):
    pattern = "".join(f"(?=.*{re.escape(w)})" for w in words)
    return pytest.raises(exc, match=re.compile(pattern, re.IGNORECASE | re.DOTALL))


# ------------------------------------------------------------------ the oracle


def _norm(axes, dim):
    return tuple(a % dim for a in (axes if isinstance(axes, (tuple, list)) else (axes,)))


def per_slice(x: np.ndarray, axes, fn):
    """``fn`` on each slice of the chosen axes (their sub-array in increasing axis order)."""
    ax = sorted(_norm(axes, x.ndim))
    k = len(ax)
    xm = np.moveaxis(x, ax, range(x.ndim - k, x.ndim))
    lead = xm.shape[:-k]
    flat = xm.reshape((-1,) + xm.shape[-k:])
    out = np.stack([fn(s) for s in flat]) if len(flat) else np.zeros(flat.shape)
    return np.moveaxis(out.reshape(lead + out.shape[1:]), range(x.ndim - k, x.ndim), ax)


def sorted_params(axes, dim, values):
    """Per-axis ``values`` (in ``axes`` order) in increasing axis order."""
    ax = _norm(axes, dim)
    return [values[i] for i in sorted(range(len(ax)), key=lambda i: ax[i])]


def derivative_oracle(x, axis, axes, operator, modes, cval):
    ax = _norm(axes, x.ndim)
    srt = sorted(ax)
    i = srt.index(axis % x.ndim)
    m = sorted_params(axes, x.ndim, modes)

    def fn(s):
        y = ndi.correlate1d(s, [-1.0, 0.0, 1.0], i, mode=m[i], cval=cval)
        if SMOOTH[operator] is not None:
            for j in range(len(srt)):
                if j != i:
                    y = ndi.correlate1d(y, SMOOTH[operator], j, mode=m[j], cval=cval)
        return y

    return per_slice(x, axes, fn)


def gaussian_oracle(x, sigmas, orders, axes, modes, cval, truncate=4.0):
    """``gaussian_filter`` with per-axis modes, one pass per axis in ``axes`` order."""
    y = x
    for a, s, o, m in zip(_norm(axes, x.ndim), sigmas, orders, modes):
        if s > 1e-15:
            y = ndi.gaussian_filter1d(y, s, a, order=o, mode=m, cval=cval, truncate=truncate)
    return y


# ------------------------------------------------------------------ strategies

#: (shape, axes) with 1, 2 or 3 chosen axes, sizes 1, 2 and odd, negative or positive, any order
@st.composite
def shape_axes(draw, max_axes=3):
    k = draw(st.integers(1, max_axes))
    dim = draw(st.integers(k, 4))
    shape = tuple(draw(st.sampled_from((1, 2, 3, 5, 6, 7))) for _ in range(dim))
    ax = draw(st.permutations(range(dim)))[:k]
    ax = tuple(a - dim if draw(st.booleans()) else a for a in ax)
    return shape, ax


per_axis_modes = st.lists(st.sampled_from(BASE_MODES), min_size=3, max_size=3)


def _modes(drawn, k, uniform):
    return drawn[0] if uniform else tuple(drawn[:k])


# ------------------------------------------------------------------ parity: SciPy's axes= call


@examples(25)
@given(sa=shape_axes(), modes=per_axis_modes, uniform=st.booleans(), engine=engines,
       sig=st.lists(st.sampled_from((0.0, 0.6, 1.0, 2.5)), min_size=3, max_size=3),
       orders=st.lists(st.integers(0, 2), min_size=3, max_size=3))
def test_gaussian_filter_matches_scipy_axes(sa, modes, uniform, engine, sig, orders):
    shape, axes = sa
    k = len(axes)
    x = rand(*shape, seed=1)
    mode = _modes(modes, k, uniform)
    y = tf.gaussian_filter(x, tuple(sig[:k]), order=tuple(orders[:k]), mode=mode, cval=CVAL, axes=axes,
                           backend=engine)
    ref = ndi.gaussian_filter(to_np(x), sig[:k], order=orders[:k], mode=mode, cval=CVAL, axes=axes)
    assert y.shape == x.shape
    assert_close(y, ref, rtol=1e-10, msg=f"{shape} {axes} {mode}")


@pytest.mark.parametrize("axes", ((3, 1), (1, 3, 2), (3, 2, 1), (2, 1), (-1, -2), (2, 0, 3)))
def test_axes_out_of_order_keep_scipys_pass_order(axes, engine):
    """SciPy runs a Gaussian's passes in the order ``axes`` lists them, and each term of
    ``gaussian_laplace`` / ``gaussian_gradient_magnitude`` over its axes in increasing order:
    float64 results are SciPy's bits on every engine, volumes included (the CPU engine's volume
    path runs its passes in increasing axis order: a Gaussian's axes given out of order reach it
    as a permuted view, ``functional._core``'s *Pass order*)."""
    x = rand(2, 9, 8, 7, seed=5)
    xn = to_np(x)
    sig = (1.1, 0.7, 1.3)[: len(axes)]
    y = tf.gaussian_filter(x, sig, axes=axes, backend=engine)
    assert np.array_equal(y.numpy(), ndi.gaussian_filter(xn, sig, axes=axes))
    # per-axis modes: two axes of two modes run on a volume engine
    modes = ("wrap", "reflect", "nearest")[: len(axes)]
    out = torch.full_like(x, 7.0)
    y = tf.gaussian_filter(x, sig, mode=modes, axes=axes, out=out, backend=engine)
    assert y is out and np.array_equal(y.numpy(), ndi.gaussian_filter(xn, sig, mode=modes, axes=axes))
    for order in ((1, 0, 0), (0, 2, 1)):
        y = tf.gaussian_filter(x, sig, order=order[: len(axes)], mode="mirror", axes=axes, backend=engine).numpy()
        assert np.array_equal(y, ndi.gaussian_filter(xn, sig, order=order[: len(axes)], mode="mirror", axes=axes))
    ax = _norm(axes, 4)
    srt = sorted(ax)
    on_slice = [srt.index(a) for a in ax]  # the caller's axes on a slice
    # (on a slice that ``axes`` covers, SciPy reads per-axis sigmas in axis order)
    lap = tf.gaussian_laplace(x, sig, axes=axes, backend=engine).numpy()
    want = per_slice(xn, axes, lambda v: ndi.gaussian_laplace(v, sorted_params(axes, 4, sig), axes=on_slice))
    assert np.array_equal(lap, want)
    # the order is in the values too where the padding is not 0
    lap = tf.gaussian_laplace(x, sig, mode="constant", cval=0.6, axes=axes, backend=engine)
    assert_close(lap, per_slice(xn, axes, lambda v: ndi.gaussian_laplace(v, sorted_params(axes, 4, sig), mode="constant",
                                                                        cval=0.6, axes=on_slice)), rtol=1e-12)


def test_out_of_order_axes_run_float64_gaussians_as_runs_of_increasing_axes(monkeypatch):
    """Where a volume engine would run a float64 Gaussian's passes given out of order, they run
    as calls of increasing axes, each on the last one's result (``gaussian._pass_runs``: SciPy's
    bits); float32 and planes of one mode (whose passes follow the stencil) run in one call."""
    from torchfilters.functional import gaussian as G

    calls = []
    real = G.run
    monkeypatch.setattr(G, "run", lambda x, lay, *a: calls.append(lay.axes) or real(x, lay, *a))
    x = rand(2, 3, 4, 5, seed=1)

    def runs(t, axes, mode="reflect", sigma=1.0):
        calls.clear()
        tf.gaussian_filter(t, sigma, mode=mode, axes=axes)
        return calls[:]

    assert runs(x, (3, 1, 2)) == [(3,), (1, 2)]
    assert runs(x, (-1, -2, -3)) == [(3,), (2,), (1,)]
    assert runs(x, (2, 0, 3)) == [(2,), (0, 3)]
    assert runs(x, (3, 1)) == [(3,), (1,)]  # a gap: a volume
    assert runs(x, (-1, -2)) == [(3, 2)]  # a plane of one mode
    assert runs(x, (-1, -2), mode=("reflect", "wrap")) == [(3,), (2,)]
    assert runs(x, (3, 1, 2), sigma=(1.0, 0.0, 1.0)) == [(3,), (2,)]  # (sigma 0: no pass)
    assert runs(x, (1, 2, 3)) == [(1, 2, 3)]
    assert runs(x.float(), (3, 1, 2)) == [(3, 1, 2)]
    xg = rand(1, 3, 4, 5, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: tf.gaussian_filter(t, (0.8, 0.6, 0.7), mode=("wrap", "constant", "mirror"),
                                                                 cval=0.5, axes=(3, 1, 2)), (xg,))


@examples(25)
@given(sa=shape_axes(), modes=per_axis_modes, uniform=st.booleans(), engine=engines,
       sizes=st.lists(st.integers(1, 6), min_size=3, max_size=3), data=st.data())
def test_uniform_filter_matches_scipy_axes(sa, modes, uniform, engine, sizes, data):
    shape, axes = sa
    k = len(axes)
    sizes = sizes[:k]
    origins = tuple(data.draw(st.integers(-(n // 2), (n - 1) // 2)) for n in sizes)
    x = rand(*shape, seed=2)
    mode = _modes(modes, k, uniform)
    y = tf.uniform_filter(x, tuple(sizes), mode=mode, cval=CVAL, origin=origins, axes=axes, backend=engine)
    ref = ndi.uniform_filter(to_np(x), sizes, mode=mode, cval=CVAL, origin=origins, axes=axes)
    assert_close(y, ref, rtol=1e-10, msg=f"{shape} {axes} {mode} {sizes} {origins}")


@examples(20)
@given(sa=shape_axes(), modes=per_axis_modes, uniform=st.booleans(), engine=engines)
def test_laplace_matches_scipy_axes(sa, modes, uniform, engine):
    shape, axes = sa
    x = rand(*shape, seed=3)
    mode = _modes(modes, len(axes), uniform)
    y = tf.laplace(x, mode=mode, cval=CVAL, axes=axes, backend=engine)
    assert_close(y, ndi.laplace(to_np(x), mode=mode, cval=CVAL, axes=axes), rtol=1e-10, msg=f"{shape} {axes}")


@examples(25)
@given(sa=shape_axes(), mode=st.sampled_from(BASE_MODES), engine=engines, flip=st.booleans(), data=st.data())
def test_correlate_and_convolve_match_scipy_axes(sa, mode, engine, flip, data):
    shape, axes = sa
    k = len(axes)
    wshape = tuple(data.draw(st.integers(1, 4)) for _ in range(k))
    origins = tuple(data.draw(st.integers(-(n // 2), (n - 1) // 2)) for n in wshape)  # per kernel dim
    # origins follow axes order, kernel dims the sorted axes: draw them per sorted axis, then reorder
    ax = _norm(axes, len(shape))
    order = sorted(range(k), key=lambda i: ax[i])
    user_origins = [0] * k
    for j, i in enumerate(order):
        user_origins[i] = origins[j]
    w = rand(*wshape, seed=4)
    x = rand(*shape, seed=5)
    f, g = (tf.convolve, ndi.convolve) if flip else (tf.correlate, ndi.correlate)
    # SciPy reads origins in axes order, except when axes name every axis: then in axis order
    # (a quirk); the oracle is SciPy's call with the axes sorted there
    sp_axes, sp_origins = axes, user_origins
    if len(ax) == len(shape):
        sp_axes, sp_origins = tuple(sorted(ax)), list(origins)
    try:
        ref = g(to_np(x), to_np(w), mode=mode, cval=CVAL, origin=sp_origins, axes=sp_axes)
    except ValueError:  # SciPy refuses the mirrored origin of an even kernel: so do we
        with pytest.raises(ValueError, match="origin"):
            f(x, w, mode=mode, cval=CVAL, origin=user_origins, axes=axes, backend=engine)
        return
    y = f(x, w, mode=mode, cval=CVAL, origin=user_origins, axes=axes, backend=engine)
    assert_close(y, ref, rtol=1e-10, msg=f"{shape} {axes} {wshape} {user_origins}")


@examples(20)
@given(sa=shape_axes(max_axes=1), mode=st.sampled_from(BASE_MODES), engine=engines,
       n=st.integers(1, 9), which=st.sampled_from(("correlate1d", "convolve1d", "uniform_filter1d",
                                                   "gaussian_filter1d")), data=st.data())
def test_one_axis_ops_match_scipy(sa, mode, engine, n, which, data):
    shape, (axis,) = sa
    x = rand(*shape, seed=6)
    xn = to_np(x)
    if which in ("correlate1d", "convolve1d"):
        w = rand(n, seed=7)
        y = getattr(tf, which)(x, w, axis, mode=mode, cval=CVAL, backend=engine)
        ref = getattr(ndi, which)(xn, to_np(w), axis, mode=mode, cval=CVAL)
    elif which == "uniform_filter1d":
        o = data.draw(st.integers(-(n // 2), (n - 1) // 2))
        y = tf.uniform_filter1d(x, n, axis, mode=mode, cval=CVAL, origin=o, backend=engine)
        ref = ndi.uniform_filter1d(xn, n, axis, mode=mode, cval=CVAL, origin=o)
    else:
        order = data.draw(st.integers(0, 2))
        y = tf.gaussian_filter1d(x, n / 3, axis, order, mode=mode, cval=CVAL, backend=engine)
        ref = ndi.gaussian_filter1d(xn, n / 3, axis, order=order, mode=mode, cval=CVAL)
    assert_close(y, ref, rtol=1e-10, msg=f"{which} {shape} {axis}")


# ------------------------------------------------------------------ parity: per slice


@examples(25)
@given(sa=shape_axes(), modes=per_axis_modes, uniform=st.booleans(), engine=engines,
       operator=st.sampled_from(tuple(SMOOTH)), data=st.data())
def test_derivatives_per_slice(sa, modes, uniform, engine, operator, data):
    shape, axes = sa
    k = len(axes)
    x = rand(*shape, seed=8)
    xn = to_np(x)
    mode = _modes(modes, k, uniform)
    mlist = [mode] * k if isinstance(mode, str) else list(mode)
    axis = data.draw(st.sampled_from(axes))
    d = tf.derivative(x, axis, operator=operator, mode=mode, cval=CVAL, axes=axes, backend=engine)
    assert_close(d, derivative_oracle(xn, axis, axes, operator, mlist, CVAL), rtol=1e-10)
    comps = [derivative_oracle(xn, a, axes, operator, mlist, CVAL) for a in axes]
    g = tf.gradient(x, operator=operator, mode=mode, cval=CVAL, axes=axes, backend=engine)
    first = min(_norm(axes, len(shape)))
    assert g.shape == shape[:first] + (k,) + shape[first:]
    assert_close(g, np.stack(comps, axis=first), rtol=1e-10)
    m = tf.gradient_magnitude(x, operator=operator, mode=mode, cval=CVAL, axes=axes, backend=engine)
    assert_close(m, np.sqrt(sum(c * c for c in comps)), rtol=1e-10)
    if k == 2:
        a = to_np(tf.gradient_direction(x, operator=operator, mode=mode, cval=CVAL, axes=axes, backend=engine))
        # +-pi are one angle, and a signed zero's atan2 is tests/test_numerics.py's business
        nz = (comps[0] != 0) | (comps[1] != 0)
        d = np.angle(np.exp(1j * (a - np.arctan2(comps[0], comps[1]))))
        assert np.abs(d[nz]).max(initial=0.0) <= 1e-9


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", BASE_MODES)
def test_sobel_3d_equals_scipy_on_each_volume(engine, mode):
    x = rand(2, 5, 6, 7, seed=9)
    for axis in (-3, -2, -1):
        y = tf.sobel(x, axis, mode=mode, cval=CVAL, axes=(-3, -2, -1), backend=engine)
        ref = np.stack([ndi.sobel(v, axis, mode=mode, cval=CVAL) for v in to_np(x)])
        assert_close(y, ref, rtol=1e-10)
    m = tf.gradient_magnitude(x, operator="sobel", mode=mode, cval=CVAL, axes=(-3, -2, -1), backend=engine)
    ref = np.stack([ndi.generic_gradient_magnitude(v, ndi.sobel, mode=mode, cval=CVAL) for v in to_np(x)])
    assert_close(m, ref, rtol=1e-10)


@examples(20)
@given(sa=shape_axes(), modes=per_axis_modes, uniform=st.booleans(), engine=engines,
       sig=st.lists(st.sampled_from((0.0, 0.7, 1.3)), min_size=3, max_size=3))
def test_gaussian_magnitude_and_laplace_per_slice(sa, modes, uniform, engine, sig):
    shape, axes = sa
    k = len(axes)
    x = rand(*shape, seed=10)
    xn = to_np(x)
    mode = _modes(modes, k, uniform)
    mlist = [mode] * k if isinstance(mode, str) else list(mode)
    sig = tuple(sig[:k])

    ax = _norm(axes, len(shape))
    up = sorted(range(k), key=lambda i: ax[i])  # each term's passes in increasing axis order

    def comp(order_axis, order):
        return gaussian_oracle(xn, [sig[i] for i in up], [order if i == order_axis else 0 for i in up],
                               [ax[i] for i in up], [mlist[i] for i in up], CVAL)

    m = tf.gaussian_gradient_magnitude(x, sig, mode=mode, cval=CVAL, axes=axes, backend=engine)
    assert_close(m, np.sqrt(sum(comp(i, 1) ** 2 for i in range(k))), rtol=1e-10)
    lap = tf.gaussian_laplace(x, sig, mode=mode, cval=CVAL, axes=axes, backend=engine)
    assert_close(lap, sum(comp(i, 2) for i in range(k)), rtol=1e-10)
    if uniform:  # one mode: SciPy's functions on each slice, the caller's axes on it
        srt = sorted(ax)
        sub, srt_sig = [srt.index(a) for a in ax], sorted_params(axes, len(shape), sig)
        for fn, got in ((ndi.gaussian_gradient_magnitude, m), (ndi.gaussian_laplace, lap)):
            assert_close(got, per_slice(xn, axes, lambda v: fn(v, srt_sig, mode=mode, cval=CVAL, axes=sub)), rtol=1e-10)
    # the whole array, axes in increasing order: SciPy's own functions (given in another order,
    # SciPy applies the per-axis sigmas in axis order, not in the order of axes)
    if uniform and len(shape) == k and list(ax) == sorted(ax):
        assert_close(m, ndi.gaussian_gradient_magnitude(xn, sig, mode=mode, cval=CVAL, axes=axes), rtol=1e-10)
        assert_close(lap, ndi.gaussian_laplace(xn, sig, mode=mode, cval=CVAL, axes=axes), rtol=1e-10)


@pytest.mark.parametrize("engine", ENGINES)
def test_selective_blur_over_three_axes(engine):
    x = rand(2, 4, 5, 6, seed=11)
    xn = to_np(x)
    y = tf.selective_blur(x, 0.1, axes=(-3, -2, -1), mode="nearest", backend=engine)
    b = xn
    for a in (1, 2, 3):
        b = ndi.correlate1d(b, [0.25, 0.5, 0.25], a, mode="nearest")
    assert_close(y, np.where(xn >= 0.1, b, xn), rtol=1e-10)
    w = rand(3, 2, 3, seed=12, low=0.0)
    y = tf.selective_blur(x, 0.1, weights=w, normalized=True, axes=(1, 2, 3), backend=engine)
    m = (xn >= 0.1).astype(np.float64)
    wn = to_np(w)
    num = ndi.correlate(xn * m, wn[None], mode="reflect")
    den = ndi.correlate(m, wn[None], mode="reflect")
    ref = np.where((m > 0) & (den > 0), num / np.where(den > 0, den, 1), xn)
    assert_close(y, ref, rtol=1e-10)


def test_radius_larger_than_the_axis_and_video_axes():
    x = rand(2, 4, 3, 5, 6, seed=13)  # (B, T, C, H, W) over T, H, W: a permuted view
    xn = to_np(x)
    for engine in ENGINES:
        y = tf.gaussian_filter(x, 1.0, radius=(9, 2, 11), axes=(1, 3, 4), mode="mirror", backend=engine)
        assert_close(y, ndi.gaussian_filter(xn, 1.0, radius=(9, 2, 11), axes=(1, 3, 4), mode="mirror"), rtol=1e-10)
        g = tf.gradient(x, axes=(1, 3, 4), backend=engine)
        assert g.shape == (2, 3, 4, 3, 5, 6)  # components just before the first chosen axis
        ref = derivative_oracle(xn, 3, (1, 3, 4), "central", ["reflect"] * 3, 0.0)
        assert_close(g[:, 1], ref, rtol=1e-10)
        out = torch.full_like(g, float("nan"))
        assert tf.gradient(x, axes=(1, 3, 4), out=out, backend=engine) is out
        assert torch.equal(out, g)


# ------------------------------------------------------------------ layouts, dtypes, empty


@pytest.mark.parametrize("engine", ENGINES)
def test_non_contiguous_and_channels_last_3d(engine):
    base = rand(2, 3, 6, 7, 8, seed=14)
    for x in (base.to(memory_format=torch.channels_last_3d), base.transpose(-1, -3), base[:, :, ::2, 1:, 1::2]):
        ref = per_slice(to_np(x), (-3, -2, -1), lambda v: ndi.generic_gradient_magnitude(v, ndi.sobel))
        y = tf.gradient_magnitude(x, operator="sobel", axes=(-3, -2, -1), backend=engine)
        assert_close(y, ref, rtol=1e-10)
        y = tf.laplace(x, axes=(2, 3, 4), backend=engine)
        assert_close(y, ndi.laplace(to_np(x), axes=(2, 3, 4)), rtol=1e-10)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_volumes(engine, dtype):
    x = rand(1, 6, 7, 8, seed=15).to(dtype)
    xn = to_np(x)
    eps = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 2**-23}[dtype]
    for f, ref in [
        (lambda t: tf.gaussian_filter(t, 1.2, axes=(1, 2, 3), backend=engine), ndi.gaussian_filter(xn, 1.2, axes=(1, 2, 3))),
        (lambda t: tf.laplace(t, axes=(1, 2, 3), backend=engine), ndi.laplace(xn, axes=(1, 2, 3))),
        (lambda t: tf.uniform_filter(t, 3, axes=(1, 2, 3), backend=engine), ndi.uniform_filter(xn, 3, axes=(1, 2, 3))),
    ]:
        y = f(x)
        assert y.dtype == dtype
        # computed in float32, rounded once to the dtype: half an ulp of the largest value (plus float32 noise)
        assert_close(y, ref, rtol=eps * 8)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_empty_volumes(engine, name):
    x = torch.zeros(0, 3, 4, 5)
    y = PUBLIC[name](x, backend=engine)
    assert y.numel() == 0


# ------------------------------------------------------------------ gradients


def _gradcheck(fn, x):
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-7, rtol=1e-5)


GRAD_OPS = {
    "laplace": lambda x, e: tf.laplace(x, mode=("wrap", "constant", "reflect"), cval=0.5, axes=(1, 2, 3), backend=e),
    "gaussian_laplace": lambda x, e: tf.gaussian_laplace(x, (0.8, 1.0, 0.6), axes=(-3, -2, -1), backend=e),
    "uniform_filter": lambda x, e: tf.uniform_filter(x, (2, 3, 4), mode="mirror", axes=(-1, -3, -2), backend=e),
    "uniform_filter1d": lambda x, e: tf.uniform_filter1d(x, 4, 1, origin=1, mode="nearest", backend=e),
    "gaussian_filter1d": lambda x, e: tf.gaussian_filter1d(x, 0.9, 2, order=1, mode="constant", cval=1.0, backend=e),
    "gaussian_filter": lambda x, e: tf.gaussian_filter(x, 0.8, axes=(1, 2, 3), mode=("reflect", "wrap", "nearest"),
                                                       backend=e),
    "gradient_magnitude": lambda x, e: tf.gradient_magnitude(x, operator="sobel", axes=(1, 2, 3), backend=e),
    "gradient": lambda x, e: tf.gradient(x, operator="prewitt", axes=(3, 1, 2), backend=e),
    "gaussian_gradient_magnitude": lambda x, e: tf.gaussian_gradient_magnitude(x, 0.7, axes=(1, 2, 3), backend=e),
    "correlate": lambda x, e: tf.correlate(x, rand(2, 3, 2, seed=3), axes=(1, 2, 3), mode="wrap", backend=e),
    "selective_blur": lambda x, e: tf.selective_blur(x, 0.0, axes=(1, 2, 3), normalized=True, backend=e),
    "signal": lambda x, e: tf.gaussian_filter(x.flatten(), 1.1, axes=0, backend=e),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(GRAD_OPS))
def test_gradcheck_three_axes(engine, name):
    x = rand(1, 3, 4, 5, seed=16)
    if name == "selective_blur":
        x = torch.where(x.abs() < 0.05, x + 0.1, x)  # stable mask under finite differences
    x.requires_grad_(True)
    _gradcheck(lambda t: GRAD_OPS[name](t, engine), x)


# ------------------------------------------------------------------ bad axes


@pytest.mark.parametrize("name", sorted(n for n in PUBLIC if not n.endswith("1d")))  # those take axis=
@pytest.mark.parametrize("axes, words", [
    ((-1, -1), ("axes", "distinct")),
    ((0, 5), ("axes", "out of range")),
    ((-6,), ("axes", "out of range")),
    ((0, 1, 2, 3), ("axes", "1, 2 or 3")),
    ((), ("axes", "1, 2 or 3")),
])
def test_bad_axes_raise_value_error_naming_axes(name, axes, words):
    with raises(ValueError, *words):
        PUBLIC[name](torch.zeros(2, 3, 4, 5), axes=axes)


@pytest.mark.parametrize("axes", [(0.5,), ("x",), (True, 1), 1.0], ids=repr)
def test_axes_of_the_wrong_type(axes):
    with raises(TypeError, "axes"):
        tf.gaussian_filter(torch.zeros(3, 4), 1.0, axes=axes)


@pytest.mark.parametrize("good, bad", [((0, 1), (False, 1)), ((0, 1), (0.0, 1)), (1, 1.0), (1, True)], ids=repr)
def test_axes_of_the_wrong_type_after_equal_ints(good, bad):
    """Layouts are memoised by ``axes``; ``False``/``0.0`` equal ``0`` as keys, yet a call with
    them after the ints' call must still be refused."""
    x = torch.zeros(3, 4)
    tf.gaussian_filter(x, 1.0, axes=good, backend="reference")
    with raises(TypeError, "axes"):
        tf.gaussian_filter(x, 1.0, axes=bad, backend="reference")
    tf.gradient_magnitude(x, axes=good, backend="reference")
    with raises(TypeError, "axes"):
        tf.gradient_magnitude(x, axes=bad, backend="reference")


@pytest.mark.parametrize("kw, exc, word", [
    ({"sigma": True}, TypeError, "sigma"),
    ({"sigma": 1, "order": False}, TypeError, "order"),
    ({"sigma": float("nan")}, ValueError, "sigma"),
    ({"sigma": 1.0, "truncate": float("inf")}, ValueError, "truncate"),
], ids=repr)
def test_gaussian_arguments_of_the_wrong_type_after_equal_ones(kw, exc, word):
    """The Gaussian's checked arguments are memoised for plain Python numbers; ``True`` and
    ``False`` equal 1 and 0 as keys, yet must still be refused (and bad values every time)."""
    x = torch.zeros(3, 4)
    for _ in range(2):
        tf.gaussian_filter(x, 1, order=0, truncate=4.0, backend="reference")
        tf.gaussian_filter(x, 1.0, order=0, truncate=4, backend="reference")
        with raises(exc, word):
            tf.gaussian_filter(x, **kw, backend="reference")


@pytest.mark.parametrize("kw, word", [
    ({"sigma": (1.0, 2.0)}, "sigma"),
    ({"sigma": 1.0, "mode": ("reflect", "wrap")}, "mode"),
    ({"sigma": 1.0, "radius": (1, 2)}, "radius"),
    ({"sigma": 1.0, "order": (0, 1, 0, 1)}, "order"),
])
def test_per_axis_sequence_of_the_wrong_length(kw, word):
    with raises(ValueError, word, "3"):
        tf.gaussian_filter(torch.zeros(3, 4, 5), axes=(0, 1, 2), **kw)


def test_other_bad_axis_arguments():
    x = torch.zeros(3, 4, 5)
    with raises(ValueError, "size", "3"):
        tf.uniform_filter(x, (3, 3), axes=(0, 1, 2))
    with raises(ValueError, "weights", "3-D"):
        tf.correlate(x, [[1.0]], axes=(0, 1, 2))
    with raises(ValueError, "axis", "axes"):
        tf.sobel(x, 0)  # axis 0 is not among the default axes
    with raises(ValueError, "gradient_direction", "2 axes"):
        tf.gradient_direction(x, axes=(0, 1, 2))
    with raises(ValueError, "size", ">= 1"):
        tf.uniform_filter(x, 0)
    with raises(TypeError, "size"):
        tf.uniform_filter(x, 2.5)
    with raises(ValueError, "origin"):
        tf.uniform_filter1d(x, 3, origin=2)
    with raises(TypeError, "sigma"):
        tf.gaussian_filter1d(x, (1.0, 2.0))


# ------------------------------------------------------------------ modules


def test_nn_modules_take_axes():
    x = rand(2, 5, 6, 7, seed=17)
    xn = to_np(x)
    assert_close(tf.nn.GaussianFilter(1.0, axes=(1, 2, 3))(x), ndi.gaussian_filter(xn, 1.0, axes=(1, 2, 3)))
    assert_close(tf.nn.Laplace(axes=(-3, -2, -1))(x), ndi.laplace(xn, axes=(1, 2, 3)))
    assert_close(tf.nn.UniformFilter(size=3, axes=-1)(x), ndi.uniform_filter1d(xn, 3, -1))
    assert_close(tf.nn.GaussianFilter1d(1.5, axis=0)(x), ndi.gaussian_filter1d(xn, 1.5, 0))
    assert_close(tf.nn.GaussianLaplace(1.0)(x), per_slice(xn, (-2, -1), lambda v: ndi.gaussian_laplace(v, 1.0)))
    m = tf.nn.GradientMagnitude(operator="sobel", axes=(1, 2, 3))
    assert "axes=(1, 2, 3)" in repr(m)
    assert_close(m(x), np.stack([ndi.generic_gradient_magnitude(v, ndi.sobel) for v in xn]))
    with raises(ValueError, "axes"):
        tf.nn.Laplace(axes=(0, 0))


def test_torch_compile_fullgraph_with_axes():
    x = rand(2, 4, 5, 6, seed=18).requires_grad_(True)

    def f(t):
        return (tf.gaussian_filter(t, (1.0, 0.5), axes=(1, 3), mode=("wrap", "reflect")).square().sum()
                + tf.gradient(t, axes=(1, 2, 3)).square().sum() + tf.laplace(t, axes=-1).square().sum())

    y = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    (g,) = torch.autograd.grad(y, x)
    y2 = f(x)
    (g2,) = torch.autograd.grad(y2, x)
    assert torch.allclose(y, y2, rtol=1e-12) and torch.allclose(g, g2, rtol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("k", [5, 7, 9])
def test_symmetric_kernels_along_one_axis_on_many_rows(engine, k):
    """A found bug: the CPU separable path gave wrong values for a horizontal-only symmetric
    pass (vertical identity) on images of more than one row, and on planes of one row."""
    rng = np.random.default_rng(k)
    for shape in [(1, 2, 5), (1, 8, 13), (3, 1, 7), (2, 9, 33), (16, 13)]:
        b = rng.random(shape)
        for axis in (-1, -2):
            y = tf.correlate1d(torch.from_numpy(b), [1.0] * k, axis, mode="reflect", backend=engine)
            assert_close(y, ndi.correlate1d(b, [1.0] * k, axis, mode="reflect"), rtol=1e-12, msg=f"{shape} {axis}")
            y = tf.uniform_filter1d(torch.from_numpy(b), k, axis, mode="wrap", backend=engine)
            assert_close(y, ndi.uniform_filter1d(b, k, axis, mode="wrap"), rtol=1e-12, msg=f"{shape} {axis}")


def test_one_axis_filters_run_on_planes_of_the_inputs_rows(monkeypatch, no_replays):
    """A 1-D filter along the last axis of a batch runs on the planar engine as planes of the
    input's own rows (a 2-D spec that reads nothing along -2), not as one plane per row: each
    row is still filtered alone, in every mode (``constant``'s cval rows are never read),
    forward and backward.  A 1-D input still runs as a plane of one row."""
    from torchfilters.backends import cpu

    seen = []  # (H, W) of the planes each CPU launch of the separable (row-wise or stacked) or tiled path ran on
    sep, stack, plan = cpu._sep_launch, cpu._stack_launch, cpu._plan
    monkeypatch.setattr(cpu, "_sep_launch", lambda x, o2, L, si, H, W, *a, **k: seen.append((H, W)) or sep(x, o2, L, si, H, W, *a, **k))
    monkeypatch.setattr(cpu, "_stack_launch", lambda x, o2, L, si, H, W, *a: stack(x, o2, L, si, H, W, *a) and (
        seen.append((H, W)) or True))
    monkeypatch.setattr(cpu, "_plan", lambda info, H, W, *a: seen.append((H, W)) or plan(info, H, W, *a))
    x = rand(2, 3, 6, 9, seed=11)
    xn = to_np(x)
    k = ndi._filters._gaussian_kernel1d(1.3, 0, int(4 * 1.3 + 0.5))
    for mode in BASE_MODES:
        seen.clear()
        xg = x.clone().requires_grad_(True)
        y = tf.gaussian_filter1d(xg, 1.3, -1, mode=mode, cval=7.5, backend="cpu")
        assert_close(y.detach(), ndi.gaussian_filter1d(xn, 1.3, -1, mode=mode, cval=7.5), rtol=1e-12, msg=mode)
        g = rand(*y.shape, seed=12)
        (gx,) = torch.autograd.grad(y, xg, g)
        if mode == "constant":  # the adjoint of a constant-mode pass: the flipped pass with zeros outside
            assert_close(gx, ndi.correlate1d(to_np(g), k[::-1], -1, mode="constant", cval=0.0), rtol=1e-12)
        assert seen == [(6, 9), (6, 9)], (mode, seen)  # forward and backward on planes of the input's rows
        assert_close(tf.uniform_filter1d(x, 4, -1, mode=mode, cval=7.5, origin=1, backend="cpu"),
                     ndi.uniform_filter1d(xn, 4, -1, mode=mode, cval=7.5, origin=1), rtol=1e-12)
        assert_close(tf.correlate1d(x, [0.5, -2.0, 1.0, 3.0], -1, mode=mode, cval=7.5, backend="cpu"),
                     ndi.correlate1d(xn, [0.5, -2.0, 1.0, 3.0], -1, mode=mode, cval=7.5), rtol=1e-12)
        assert all(h == 6 for h, _ in seen), (mode, seen)
    seen.clear()
    sig = rand(17, seed=13)
    assert_close(tf.gaussian_filter1d(sig, 1.3, mode="constant", cval=7.5, backend="cpu"),
                 ndi.gaussian_filter1d(to_np(sig), 1.3, mode="constant", cval=7.5), rtol=1e-12)
    assert seen == [(1, 17)], seen  # a 1-D input: a plane of one row


def test_a_depth_pass_is_a_vertical_pass_of_the_merged_planes(monkeypatch, no_replays):
    """Two or more unchosen axes after the last chosen one merge into one (a view): a 1-D
    filter along D of a ``(B, D, H, W)`` batch is a vertical pass of ``(B, D, H * W)`` planes on
    the planar engine, SciPy's values in every mode; a layout that does not merge keeps the
    volume engine; ``out=`` that does not merge is filled through a temporary."""
    from torchfilters.backends import cpu
    from torchfilters.functional._core import layout

    seen = []
    sep = cpu._sep_launch
    monkeypatch.setattr(cpu, "_sep_launch", lambda x, o2, L, si, H, W, *a, **k: seen.append((H, W)) or sep(x, o2, L, si, H, W, *a, **k))
    x = rand(2, 7, 5, 6, seed=21)
    xn = to_np(x)
    assert layout(x, (1,)).merge == 2 and layout(x, (1,)).ndim == 2
    assert layout(x, (1, 2)).merge == 0  # one unchosen axis after the last chosen one: as it is
    for mode in BASE_MODES:
        seen.clear()
        y = tf.gaussian_filter1d(x, 1.1, 1, mode=mode, cval=2.5, backend="cpu")
        assert_close(y, ndi.gaussian_filter1d(xn, 1.1, 1, mode=mode, cval=2.5), rtol=1e-12, msg=mode)
        assert seen == [(7, 30)], seen
    xt = x.transpose(2, 3)  # H and W do not merge: the volume engine, the same values
    assert layout(xt, (1,)).ndim == 3
    assert_close(tf.gaussian_filter1d(xt, 1.1, 1, mode="wrap", backend="cpu"),
                 ndi.gaussian_filter1d(to_np(xt), 1.1, 1, mode="wrap"), rtol=1e-12)
    out = torch.empty(2, 7, 6, 5, dtype=x.dtype).transpose(2, 3)
    assert tf.gaussian_filter1d(x, 1.1, 1, mode="mirror", out=out, backend="cpu") is out
    assert_close(out, ndi.gaussian_filter1d(xn, 1.1, 1, mode="mirror"), rtol=1e-12)


def test_one_axis_blur_empty_merges_and_outs_across_unit_axes():
    """Found by review of the two layout changes: a one-axis ``selective_blur`` raised
    ``AttributeError`` (a blur spec has no ``out_shape``); an empty tensor whose trailing axes
    merge raised from ``reshape(..., -1)``; an ``out=`` whose axes merge only by skipping a
    length-1 axis was taken as mergeable and raised from ``view``."""
    x = rand(4, 6, seed=31)
    xg = x.clone().requires_grad_(True)
    for be in ("cpu", None):
        y = tf.selective_blur(xg, 0.3, sigma=1.0, axes=(-1,), backend=be) if be else tf.selective_blur(xg, 0.3, sigma=1.0, axes=(-1,))
        yr = tf.selective_blur(x, 0.3, sigma=1.0, axes=(-1,), backend="reference")
        assert_close(y.detach(), yr, rtol=1e-12)
        (g,) = torch.autograd.grad(y.sum(), xg)
        xr = x.clone().requires_grad_(True)
        (gr,) = torch.autograd.grad(tf.selective_blur(xr, 0.3, sigma=1.0, axes=(-1,), backend="reference").sum(), xr)
        assert_close(g, gr, rtol=1e-12)
    m = torch.rand(4, 6) > 0.5
    assert_close(tf.selective_blur(x, mask=m, sigma=1.0, axes=(0,), backend="cpu"),
                 tf.selective_blur(x, mask=m, sigma=1.0, axes=(0,), backend="reference"), rtol=1e-12)
    for shape, axis in (((2, 0, 4, 5), 1), ((0, 3, 4, 5), 0), ((0, 3, 4, 5), 1), ((0, 4, 5), 0)):
        for be in ENGINES:
            e = tf.gaussian_filter1d(torch.randn(shape, dtype=torch.float64), 1.0, axis, backend=be)
            assert e.shape == shape
            assert tf.median_filter(torch.randn(shape, dtype=torch.float64), 3, axes=(axis,), backend=be).shape == shape
    x = rand(2, 6, 1, 3, seed=32)
    for axis in (0, 1):
        for out in (torch.zeros(2, 6, 2, 3, dtype=x.dtype)[..., 1:, :],
                    torch.zeros(2, 6, 1, 3, dtype=x.dtype).contiguous(memory_format=torch.channels_last)):
            assert tf.gaussian_filter1d(x, 1.2, axis, out=out, backend="cpu") is out
            assert_close(out, ndi.gaussian_filter1d(to_np(x), 1.2, axis), rtol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_plans_cached_for_one_batch_size_serve_another(engine):
    """A found bug: the separable path cached its number of work items with its plan, so a
    later call with more planes (same plane size) left the extra planes unwritten."""
    rng = np.random.default_rng(3)
    for n in (1, 3, 2, 7):
        b = rng.random((n, 6, 11))
        y = tf.gaussian_filter(torch.from_numpy(b), 1.5, backend=engine)
        assert_close(y, ndi.gaussian_filter(b, 1.5, axes=(1, 2)), rtol=1e-12, msg=str(n))
        y = tf.uniform_filter1d(torch.from_numpy(b), 5, -1, backend=engine)
        assert_close(y, ndi.uniform_filter1d(b, 5, -1), rtol=1e-12, msg=str(n))
