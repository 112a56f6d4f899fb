"""Rank filters (median, minimum, maximum, rank, percentile and the 1-D forms), unsharp masking
and the difference of Gaussians: the public ops on every engine.

Oracles: SciPy in float64 per slice of the chosen axes (bit for bit: a selection does no
arithmetic), ``scipy.ndimage.generic_filter`` with ``numpy.sort(kind="stable")`` for the NaN
rule (SciPy's own rank filters are algorithm-dependent there), and hand-worked tie cases for
where the gradient goes.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf
from conftest import BASE_MODES, MODES, assert_close, engines, examples, to_np

OPS = ("median", "minimum", "maximum", "rank", "percentile")


def _tf(op, x, size=None, footprint=None, rank=0, percentile=0.0, **kw):
    if op == "rank":
        return tf.rank_filter(x, rank, size, footprint, **kw)
    if op == "percentile":
        return tf.percentile_filter(x, percentile, size, footprint, **kw)
    return getattr(tf, f"{op}_filter")(x, size, footprint, **kw)


def _sp(op, a, size=None, footprint=None, rank=0, percentile=0.0, **kw):
    if op == "rank":
        return ndi.rank_filter(a, rank, size, footprint, **kw)
    if op == "percentile":
        return ndi.percentile_filter(a, percentile, size, footprint, **kw)
    return getattr(ndi, f"{op}_filter")(a, size, footprint, **kw)


def _slices(fn, a, k=2):
    lead = a.shape[:-k]
    flat = a.reshape((-1,) + a.shape[-k:])
    return np.stack([fn(s) for s in flat]).reshape(lead + a.shape[-k:])


def _same(y: torch.Tensor, expected: np.ndarray):
    got = to_np(y)
    assert got.shape == expected.shape
    both_nan = np.isnan(got) & np.isnan(expected)
    bad = ~both_nan & (got != expected)
    assert not bad.any(), f"{bad.sum()} of {bad.size} differ; first at {np.argwhere(bad)[0]}"


def _ints(shape, seed, levels=6):
    """float64 with many ties (a few levels)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, levels, shape, generator=g).to(torch.float64) - levels / 2


def _distinct(shape, seed):
    """float64 without ties (a permutation), far apart: tie-free for gradcheck."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape))
    return (torch.randperm(n, generator=g).to(torch.float64) * 0.37).view(shape)


@st.composite
def windows(draw, k=2):
    """``(size, footprint, origin)`` over ``k`` axes: a box or a footprint with holes."""
    shape = tuple(draw(st.integers(1, 6)) for _ in range(k))
    origin = tuple(draw(st.integers(-(n // 2), (n - 1) // 2)) for n in shape)
    if draw(st.booleans()):
        return shape, None, origin
    cells = int(np.prod(shape))
    bits = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    fp = np.array(bits, bool).reshape(shape)
    if not fp.any():
        fp.flat[draw(st.integers(0, cells - 1))] = True
    return None, fp, origin


# ------------------------------------------------------------------ SciPy parity


@examples(40)
@given(op=st.sampled_from(OPS), mode=st.sampled_from(MODES), win=windows(), engine=engines,
       hw=st.tuples(st.integers(1, 9), st.integers(1, 9)), frac=st.floats(0.0, 1.0), seed=st.integers(0, 99))
def test_matches_scipy_per_slice(op, mode, win, engine, hw, frac, seed):
    size, fp, origin = win
    count = int(np.prod(size)) if fp is None else int(fp.sum())
    rank = min(count - 1, int(frac * count))
    x = _ints((2, 1) + hw, seed)
    kw = dict(size=size, footprint=fp, rank=rank, percentile=100.0 * frac, mode=mode, cval=1.5, origin=origin)
    y = _tf(op, x, backend=engine, **kw)
    expected = _slices(lambda s: _sp(op, s, **kw), x.numpy())
    _same(y, expected)


@pytest.mark.parametrize("mode", BASE_MODES)
def test_window_larger_than_the_image(mode, engine):
    x = _ints((3, 2), 1) + 0.25
    for op in OPS:
        kw = dict(size=(9, 7), rank=20, percentile=60.0, mode=mode, cval=-0.5)
        _same(_tf(op, x, backend=engine, **kw), _sp(op, x.numpy(), **kw))


def test_axes_and_volumes(engine):
    x = _ints((2, 5, 6, 7), 3)
    a = x.numpy()
    y = tf.median_filter(x, (3, 2, 3), axes=(-3, -2, -1), mode="mirror", backend=engine)
    _same(y, np.stack([ndi.median_filter(s, (3, 2, 3), mode="mirror") for s in a]))
    # axes in any order, per-axis sizes and origins follow them (SciPy's rule)
    y = tf.maximum_filter(x, (4, 2), axes=(3, 1), origin=(1, 0), mode="wrap", backend=engine)
    _same(y, ndi.maximum_filter(a, (4, 2), axes=(3, 1), origin=(1, 0), mode="wrap"))
    fp = np.array([[[1, 0], [0, 1]], [[0, 1], [1, 1]]], bool)
    y = tf.rank_filter(x, 2, footprint=fp, axes=(0, 1, 3), mode="nearest", backend=engine)
    _same(y, ndi.rank_filter(a, 2, footprint=fp, axes=(0, 1, 3), mode="nearest"))
    # per-axis modes: SciPy takes them for separable minimum/maximum
    y = tf.minimum_filter(x, (3, 5), mode=("wrap", "constant"), cval=-9.0, backend=engine)
    _same(y, ndi.minimum_filter(a, (3, 5), mode=("wrap", "constant"), cval=-9.0, axes=(-2, -1)))


@pytest.mark.parametrize("which", ["minimum", "maximum"])
def test_1d_forms(which, engine):
    x = _ints((3, 4, 11), 5)
    for mode in BASE_MODES:
        for size, origin in ((1, 0), (3, 1), (4, -2), (13, 0)):
            y = getattr(tf, f"{which}_filter1d")(x, size, 1, mode=mode, cval=2.5, origin=origin, backend=engine)
            _same(y, getattr(ndi, f"{which}_filter1d")(x.numpy(), size, 1, mode=mode, cval=2.5, origin=origin))


def test_percentile_ranks_as_scipy():
    x = _distinct((1, 1, 6, 7), 2)
    for p in (0, 10, 33.3, 50, 99.9, 100, -25, -100):
        _same(tf.percentile_filter(x, p, (3, 4)), _slices(lambda s: ndi.percentile_filter(s, p, (3, 4)), x.numpy()))


# ------------------------------------------------------------------ NaN, ties, gradients


@pytest.mark.parametrize("mode", ["reflect", "constant"])
def test_nan_sorts_last(mode, engine):
    """The documented order: ``numpy.sort``'s (NaN after +inf); SciPy's own rank filters are
    not NaN-ordered, so the oracle is ``generic_filter`` over that sort."""
    x = _ints((7, 8), 4)
    x[1, 2] = x[5, 5] = x[5, 6] = float("nan")
    x[3, 3], x[0, 7] = float("inf"), float("-inf")
    fp = np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]], bool)
    for rank in range(int(fp.sum())):
        y = tf.rank_filter(x, rank, footprint=fp, mode=mode, cval=float("nan"), backend=engine)
        want = ndi.generic_filter(x.numpy(), lambda v: np.sort(v, kind="stable")[rank], footprint=fp, mode=mode,
                                  cval=float("nan"))
        _same(y, want)
    assert torch.isnan(tf.maximum_filter(x, 3, backend=engine)[0, 1])
    assert not torch.isnan(tf.minimum_filter(x, 3, backend=engine)).any()


def test_ties_send_the_gradient_to_the_documented_element(engine):
    """Equal values: the minimum takes the first window element in footprint order, the maximum
    the last; ``cval`` samples take no gradient."""
    x = torch.zeros(1, 5, dtype=torch.float64, requires_grad=True)
    tf.minimum_filter1d(x, 3, mode="constant", cval=1.0, backend=engine).sum().backward()
    assert x.grad.tolist() == [[2.0, 1.0, 1.0, 1.0, 0.0]]
    x.grad = None
    tf.maximum_filter1d(x, 3, mode="constant", cval=-1.0, backend=engine).sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 1.0, 1.0, 2.0]]
    x.grad = None
    tf.median_filter(x, 3, axes=-1, mode="reflect", backend=engine).sum().backward()
    # windows (x[-1]=x0 reflected, x0, x1) ... rank 1 of equal values: the middle element
    assert x.grad.tolist() == [[1.0, 1.0, 1.0, 1.0, 1.0]]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, e: tf.median_filter(x, 3, mode="reflect", backend=e),
        lambda x, e: tf.minimum_filter(x, (2, 4), mode="mirror", backend=e),
        lambda x, e: tf.maximum_filter(x, footprint=[[1, 0, 1], [1, 1, 0]], mode="wrap", backend=e),
        lambda x, e: tf.percentile_filter(x, 70, (5, 3), mode="constant", cval=0.1, backend=e),
        lambda x, e: tf.rank_filter(x, 1, 3, axes=(0, 1, 2), mode="nearest", backend=e),
        lambda x, e: tf.maximum_filter1d(x, 7, 1, mode="reflect", backend=e),
    ],
    ids=["median", "minimum", "maximum-footprint", "percentile-constant", "rank-3d", "maximum1d-long"],
)
def test_gradcheck(fn, engine):
    x = _distinct((2, 4, 5), 7).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: fn(t, engine), (x,))


def test_double_backward():
    x = _distinct((4, 5), 3).requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda t: tf.median_filter(t, 3), (x,))


def test_backward_on_ties_agrees_between_engines():
    x = _ints((2, 9, 10), 11).requires_grad_(True)
    fp = [[1, 1, 1], [1, 0, 1]]
    g = torch.randint(-8, 9, (2, 9, 10)).to(torch.float64)  # integers: sums exact in any order
    grads = []
    for e in ("reference", "cpu"):
        x.grad = None
        tf.rank_filter(x, 2, footprint=fp, mode="mirror", backend=e).backward(g)
        grads.append(x.grad.clone())
    assert torch.equal(grads[0], grads[1])


# ------------------------------------------------------------------ dtypes, layouts, out=


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_is_exact(dtype, engine):
    x = torch.randn(2, 3, 10, 11).to(dtype)
    for op in OPS:
        kw = dict(size=(3, 4), rank=5, percentile=40.0, mode="reflect")
        y = _tf(op, x, backend=engine, **kw)
        assert y.dtype == dtype
        assert torch.equal(y, _tf(op, x.double(), backend="reference", **kw).to(dtype))


def test_integer_input_is_promoted():
    x = torch.arange(30, dtype=torch.int16).view(5, 6)
    y = tf.median_filter(x, 3)
    assert y.dtype == torch.float32
    _same(y, ndi.median_filter(x.numpy(), 3).astype(np.float32))


def test_layouts(engine):
    base = torch.randn(2, 3, 12, 10, dtype=torch.float64)
    want = tf.median_filter(base, 5, backend="reference")
    strided = torch.zeros(2, 3, 24, 10, dtype=torch.float64)[:, :, ::2]
    strided.copy_(base)
    for x in (base.transpose(-1, -2).contiguous().transpose(-1, -2), base.to(memory_format=torch.channels_last),
              strided):
        assert not x.is_contiguous() and torch.equal(x, base)
        assert torch.equal(tf.median_filter(x, 5, backend=engine), want)


def test_empty(engine):
    for shape in ((0, 3, 4, 5), (2, 3, 0, 5), (3, 0)):
        x = torch.zeros(shape)
        assert tf.median_filter(x, 3, backend=engine).shape == shape
        assert tf.maximum_filter1d(x, 3, backend=engine).shape == shape


def test_out(engine):
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    want = tf.maximum_filter(x, 3, backend=engine)
    out = torch.empty(2, 8, 7, dtype=torch.float64).transpose(-1, -2)
    assert tf.maximum_filter(x, 3, out=out, backend=engine) is out
    assert torch.equal(out, want)
    y = x.clone()
    tf.maximum_filter(y, 3, out=y, backend=engine)  # out aliasing the input
    assert torch.equal(y, want)
    with pytest.raises(RuntimeError):
        tf.maximum_filter(x.clone().requires_grad_(True), 3, out=torch.empty_like(x))


def test_out_on_leading_axes(engine):
    """Axes at the front of a 4-D input: ``out=`` whose batch dimensions do not merge goes
    through a temporary (found by review: a ``NameError`` there)."""
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    calls = [lambda **k: tf.minimum_filter1d(x, 3, axis=0, backend=engine, **k),
             lambda **k: tf.median_filter(x, 3, axes=(0, 1), backend=engine, **k),
             lambda **k: tf.rank_filter(x, 1, size=2, axes=(0,), backend=engine, **k)]
    for call in calls:
        want = call()
        for out in (torch.empty_like(x), torch.empty(5, 4, 3, 2, dtype=x.dtype).permute(3, 2, 1, 0)):
            assert call(out=out) is out
            assert torch.equal(out, want)


def test_the_input_is_never_modified(engine):
    x = torch.randn(3, 9, 9)
    keep = x.clone()
    tf.median_filter(x, 3, backend=engine)
    tf.minimum_filter1d(x, 4, backend=engine)
    assert torch.equal(x, keep)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda x: tf.median_filter(x), ValueError),
        (lambda x: tf.median_filter(x, 3, [[1]]), ValueError),
        (lambda x: tf.median_filter(x, 0), ValueError),
        (lambda x: tf.median_filter(x, 2.5), TypeError),
        (lambda x: tf.median_filter(x, (3, 3, 3)), ValueError),
        (lambda x: tf.median_filter(x, footprint=[[0, 0]]), ValueError),
        (lambda x: tf.median_filter(x, footprint=[1, 1]), ValueError),
        (lambda x: tf.median_filter(x, footprint=[[1, 1], [1]]), ValueError),
        (lambda x: tf.median_filter(x, footprint="ab"), TypeError),
        (lambda x: tf.median_filter(x, footprint=torch.ones(2, 2, dtype=torch.complex64)), TypeError),
        (lambda x: tf.rank_filter(x, 9, 3), ValueError),
        (lambda x: tf.rank_filter(x, -10, 3), ValueError),
        (lambda x: tf.rank_filter(x, 1.0, 3), TypeError),
        (lambda x: tf.percentile_filter(x, 100.5, 3), ValueError),
        (lambda x: tf.percentile_filter(x, "50", 3), TypeError),
        (lambda x: tf.median_filter(x, 3, origin=2), ValueError),
        (lambda x: tf.median_filter(x, 3, origin=0.5), TypeError),
        (lambda x: tf.median_filter(x, 3, mode="replicate"), ValueError),
        (lambda x: tf.minimum_filter1d(x, 0), ValueError),
        (lambda x: tf.minimum_filter1d(x, 3, axis=4), ValueError),
        (lambda x: tf.median_filter(x.bool(), 3), TypeError),
        (lambda x: tf.unsharp_mask(x, 1.0, float("inf")), ValueError),
        (lambda x: tf.unsharp_mask(x, 1.0, "a"), TypeError),
        (lambda x: tf.difference_of_gaussians(x, 2.0, 1.0), ValueError),
        (lambda x: tf.difference_of_gaussians(x, -1.0), ValueError),
    ],
)
def test_bad_arguments(call, exc):
    with pytest.raises(exc):
        call(torch.zeros(4, 5))


# ------------------------------------------------------------------ unsharp mask, DoG


@pytest.mark.parametrize("mode", BASE_MODES)
def test_unsharp_mask_and_dog(mode, engine):
    import skimage.filters

    x = torch.rand(2, 9, 11, dtype=torch.float64)
    a = x.numpy()
    y = tf.unsharp_mask(x, (1.5, 0.7), 0.8, mode=mode, cval=0.3, backend=engine)
    g = np.stack([ndi.gaussian_filter(s, (1.5, 0.7), mode=mode, cval=0.3) for s in a])
    assert_close(y, a + 0.8 * (a - g), rtol=1e-12)
    y = tf.difference_of_gaussians(x, 1.0, mode=mode, cval=0.3, backend=engine)
    want = np.stack([skimage.filters.difference_of_gaussians(s, 1.0, mode=mode, cval=0.3) for s in a])
    assert_close(y, want, rtol=1e-12)
    assert torch.equal(tf.unsharp_mask(x, 1.0, 0.0), x)


def test_unsharp_and_dog_gradients(engine):
    x = torch.rand(2, 6, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: tf.unsharp_mask(t, 1.0, 2.0, mode="reflect", backend=engine), (x,))
    assert torch.autograd.gradcheck(lambda t: tf.difference_of_gaussians(t, 0.8, 1.5, backend=engine), (x,))


# ------------------------------------------------------------------ modules, compile


def test_modules():
    x = torch.rand(2, 1, 8, 9)
    assert torch.equal(tf.nn.MedianFilter(5)(x), tf.median_filter(x, 5))
    fp = [[0, 1, 0], [1, 1, 1], [0, 1, 0]]
    assert torch.equal(tf.nn.MaximumFilter(footprint=fp)(x), tf.maximum_filter(x, footprint=fp))
    assert torch.equal(tf.nn.MinimumFilter(3, mode="constant", cval=-1.0)(x),
                       tf.minimum_filter(x, 3, mode="constant", cval=-1.0))
    assert torch.equal(tf.nn.PercentileFilter(25, size=(3, 5))(x), tf.percentile_filter(x, 25, (3, 5)))
    assert torch.equal(tf.nn.UnsharpMask(2.0, 0.5)(x), tf.unsharp_mask(x, 2.0, 0.5))
    assert torch.equal(tf.nn.DifferenceOfGaussians(1.0, 2.0)(x), tf.difference_of_gaussians(x, 1.0, 2.0))
    with pytest.raises(ValueError):
        tf.nn.MedianFilter(0)


def test_compile_fullgraph():
    f = torch.compile(lambda t: tf.median_filter(t, 3).sum(), fullgraph=True, backend="eager")
    x = _distinct((1, 6, 7), 0).requires_grad_(True)
    f(x).backward()
    y = x.detach().clone().requires_grad_(True)
    tf.median_filter(y, 3).sum().backward()
    assert torch.equal(x.grad, y.grad)


def test_one_element_windows_shift(engine):
    """A window of one element off its centre is a shift (found by the sampled parity test)."""
    x = _distinct((3, 5, 6), 9)
    for fp, origin in (([[0, 0, 1]], (0, -1)), ([[1], [0]], 0), ([[1]], 0)):
        for mode in BASE_MODES:
            want = _slices(lambda s: ndi.median_filter(s, footprint=fp, origin=origin, mode=mode, cval=2.0), x.numpy())
            _same(tf.median_filter(x, footprint=fp, origin=origin, mode=mode, cval=2.0, backend=engine), want)
