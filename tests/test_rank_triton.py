"""Rank filters on the Triton engine (backends/triton/rank.py), run through Triton's interpreter.

Oracle: the reference engine, compared EXACTLY (``==`` with NaN in the same places; a
selection does no arithmetic, so every dtype, bf16 included, must agree bit for bit up to
the sign of a tied zero).  Each case checks which kernels ran (``LAUNCHES``) and that nothing
fell back (``FALLBACKS``), except the cases that test the counted fallback.  Shapes are tiny:
the interpreter runs every op of a network on every tile.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

import torchfilters as tf

pytest.importorskip("triton")

from conftest import interpreted_triton, rand

pytestmark = pytest.mark.triton

MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
SHAPE = (2, 3, 9, 13)


@pytest.fixture(scope="module")
def T():
    with interpreted_triton() as mod:
        yield mod


@pytest.fixture(scope="module")
def TR(T):
    import torchfilters.backends.triton.rank as mod

    return mod


def special(shape, seed=0, dtype=torch.float32, ties=False):
    """Random values with NaN, +-inf and (``ties``) many repeated values, signed zeros included."""
    x = rand(*shape, seed=seed)
    if ties:
        x = (x * 3).round() / 2
    g = torch.Generator().manual_seed(seed + 1)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)
    k = max(1, flat.numel() // 30)
    flat[idx[:k]] = float("nan")
    flat[idx[k : 2 * k]] = float("inf")
    flat[idx[2 * k : 3 * k]] = float("-inf")
    flat[idx[3 * k : 4 * k]] = -0.0
    return x.to(dtype)


def same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    na, nb = a.isnan(), b.isnan()
    assert torch.equal(na, nb), "NaN positions differ"
    assert torch.equal(a[~na], b[~nb]), f"values differ at {(a != b).logical_and(~na).nonzero()[:5].tolist()}"


class launched:
    def __init__(self, T, *kernels, fallback=0):
        self.T, self.kernels, self.fallback = T, kernels, fallback

    def __enter__(self):
        self.before = dict(self.T.LAUNCHES)
        self.fell = sum(self.T.FALLBACKS.values())

    def __exit__(self, *exc):
        if exc[0] is None:
            for k in self.kernels:  # "a|b": either
                ran = [self.T.LAUNCHES[n] > self.before.get(n, 0) for n in k.split("|")]
                assert any(ran), f"{k} did not run"
            assert sum(self.T.FALLBACKS.values()) - self.fell == self.fallback, dict(self.T.FALLBACKS)


def both(fn, x, **kw):
    return fn(x, backend="triton", **kw), fn(x, backend="reference", **kw)


# ---------------------------------------------------------------- networks (host side, no kernels)


@pytest.mark.parametrize("n", range(2, 13))
def test_networks_select_every_rank(TR, n):
    """0-1 principle: a comparator network selects rank r on every input iff on every 0/1 input."""
    for r in range(n):
        ops = TR.network(n, r)
        for bits in itertools.product((0, 1), repeat=n):
            w = list(bits)
            for a, b, _mn, _mx in ops:
                w[a], w[b] = min(w[a], w[b]), max(w[a], w[b])
            assert w[r] == sorted(bits)[r]


@pytest.mark.parametrize("n", [25, 27, 49])
def test_networks_large(TR, n):
    rng = random.Random(n)
    for r in (0, n // 2, n - 1, n // 3):
        ops = TR.network(n, r)
        for _ in range(30):
            v = [rng.random() for _ in range(n)]
            w = list(v)
            for a, b, _mn, _mx in ops:
                w[a], w[b] = min(w[a], w[b]), max(w[a], w[b])
            assert w[r] == sorted(v)[r]


def test_median9_is_cheap(TR):
    assert TR.net_cost(9, 4) <= 30


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("mode", MODES)
def test_median3x3_every_mode(T, mode):
    """The 3x3 median's own kernel (four outputs per lane): origins, tiny and 1-wide images."""
    x = special(SHAPE, seed=1, ties=mode == "wrap")
    with launched(T, "rank_med3x3"):
        same(*both(tf.median_filter, x, size=3, mode=mode, cval=0.5))
        same(*both(tf.median_filter, x[..., :6], size=3, mode=mode, cval=0.5, origin=(1, -1)))
        same(*both(tf.median_filter, special((2, 1, 5), seed=2), size=3, mode=mode, cval=0.5))
        same(*both(tf.median_filter, special((1, 6, 1), seed=3), size=3, mode=mode, cval=0.5, origin=(-1, 1)))


def test_tiles(T, TR, monkeypatch):
    x = special((3, 11, 21), seed=4)
    old = TR.set_tile_limits(max_bw=8, elems=32)  # several tiles along every axis
    monkeypatch.setattr(TR, "_GW_MIN", 3)
    try:
        with launched(T, "rank_med3x3", "rank_net", "rank_gw"):
            same(*both(tf.median_filter, x, size=3))  # a tile inside the image: the aligned path
            same(*both(tf.median_filter, x, size=3, origin=(1, -1), mode="constant", cval=9.0))
            same(*both(tf.median_filter, x.transpose(-1, -2), size=3, mode="wrap"))
            same(*both(tf.median_filter, x, size=(3, 4), mode="wrap"))
            same(*both(tf.maximum_filter, x, size=(3, 4), mode="constant"))
            same(*both(tf.minimum_filter, x, size=(5, 7), mode="reflect", origin=(-1, 2)))
    finally:
        TR.set_tile_limits(**old)


FOOT = torch.tensor([[0, 1, 0, 0, 1], [1, 1, 0, 1, 0], [0, 0, 1, 0, 1]], dtype=torch.bool)  # holes


@pytest.mark.parametrize("mode", MODES)
def test_footprint_holes_origin_rank(T, mode):
    x = special(SHAPE, seed=2, ties=True)
    with launched(T, "rank_net"):
        same(*both(tf.rank_filter, x, rank=5, footprint=FOOT, mode=mode, cval=-1.5, origin=(1, -2)))


def test_per_axis_modes_and_percentile(T):
    x = special(SHAPE, seed=3)
    with launched(T, "rank_net"):
        same(*both(tf.percentile_filter, x, percentile=30, size=(3, 5), mode=("wrap", "constant"), cval=2.5))
        same(*both(tf.median_filter, x, size=(5, 3), mode=("mirror", "reflect"), origin=(0, 1)))


@pytest.mark.parametrize("mode", ["reflect", "mirror", "wrap", "constant"])
def test_window_larger_than_image(T, mode):
    x = special((1, 2, 3, 4), seed=4)
    with launched(T, "rank_net"):
        same(*both(tf.median_filter, x, size=7, mode=mode, cval=0.25))
    with launched(T, "rank_minmax", "rank_gw"):
        same(*both(tf.maximum_filter, x, size=(11, 9), mode=mode, cval=0.25, origin=(2, -1)))
        same(*both(tf.maximum_filter, x, size=(23, 1), mode=mode, cval=0.25, origin=(-3, 0)))
    one = special((2, 1, 1), seed=5)
    with launched(T, "rank_med3x3"):
        same(*both(tf.median_filter, one, size=3, mode=mode))


@pytest.mark.parametrize("mode", MODES)
def test_min_max_separable(T, mode):
    x = special(SHAPE, seed=6, ties=True)
    with launched(T, "rank_minmax", "rank_gw"):  # k = 4 and 5: a direct loop; 21 and 22: van Herk
        same(*both(tf.minimum_filter, x, size=(4, 22), mode=mode, cval=-0.5, origin=(1, 3)))
        same(*both(tf.maximum_filter, x, size=(21, 5), mode=mode, cval=float("nan"), origin=(2, 0)))


def test_all_nan_windows(T):
    x = torch.full((1, 5, 6), float("nan"))
    x[0, 0, 0] = 1.0
    with launched(T, "rank_minmax|rank_gw", "rank_med3x3"):
        same(*both(tf.minimum_filter, x, size=3))
        same(*both(tf.maximum_filter, x, size=3))
        same(*both(tf.median_filter, x, size=3))


def test_one_d(T):
    x = special((3, 17), seed=7, ties=True)
    with launched(T, "rank_net", "rank_minmax|rank_gw"):
        same(*both(tf.median_filter, x, size=5, axes=-1, mode="mirror"))
        same(*both(tf.rank_filter, x, rank=1, footprint=[1, 0, 1, 1], axes=-1, mode="constant", cval=0.3))
        same(*both(tf.minimum_filter1d, x, size=6, axis=-1, mode="wrap", origin=1))
        same(*both(tf.maximum_filter1d, x, size=9, axis=0, mode="reflect"))


def test_three_d(T):
    x = special((2, 4, 5, 6), seed=8, ties=True)
    ax = (-3, -2, -1)
    with launched(T, "rank_net", "rank_minmax|rank_gw"):
        same(*both(tf.median_filter, x, size=3, axes=ax, mode=("constant", "wrap", "reflect"), cval=0.5))
        same(*both(tf.median_filter, x, size=(1, 3, 3), axes=ax, mode=("constant", "wrap", "reflect")))
        same(*both(tf.maximum_filter, x, size=(3, 1, 5), axes=ax, mode="mirror", origin=(1, 0, 0)))
        same(*both(tf.minimum_filter, x, size=(5, 2, 3), axes=ax, mode=("wrap", "constant", "nearest")))


def test_large_windows_fall_back_counted(T):
    x = special((1, 6, 7), seed=9)
    with launched(T, fallback=2):
        same(*both(tf.median_filter, x, size=(7, 9)))  # 63 elements: not a min/max
        same(*both(tf.median_filter, special((1, 3, 4, 4), seed=9), size=4, axes=(-3, -2, -1)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes(T, dtype):
    x = special(SHAPE, seed=10, dtype=dtype, ties=True)
    with launched(T, "rank_net", "rank_minmax|rank_gw"):
        same(*both(tf.median_filter, x, size=3, mode="constant", cval=0.1))  # cval rounded to the dtype
        same(*both(tf.rank_filter, x, rank=-2, footprint=FOOT, mode="nearest"))
        same(*both(tf.minimum_filter, x, size=(3, 4), mode="constant", cval=1 / 3))


def test_layouts_and_out(T):
    x = special((3, 2, 13, 9), seed=11).transpose(-1, -2)  # non-contiguous input
    ref = tf.median_filter(x, size=(3, 5), backend="reference")
    out = torch.empty(x.shape[::-1]).permute(3, 2, 1, 0)  # non-contiguous out
    with launched(T, "rank_net", "rank_minmax|rank_gw"):
        r = tf.median_filter(x, size=(3, 5), out=out, backend="triton")
        assert r is out
        same(out, ref)
        out2 = torch.empty_like(x)
        tf.maximum_filter(x, size=4, out=out2, backend="triton")
        same(out2, tf.maximum_filter(x, size=4, backend="reference"))


# ---------------------------------------------------------------- backward


def grads(fn, x, g, backend, **kw):
    xx = x.detach().clone().requires_grad_(True)
    y = fn(xx, backend=backend, **kw)
    (gx,) = torch.autograd.grad(y, xx, g)
    return y.detach(), gx


BWD = {
    "median3-reflect": (tf.median_filter, {"size": 3, "mode": "reflect"}),
    "holes-constant": (tf.rank_filter, {"rank": 2, "footprint": FOOT, "mode": "constant", "cval": 0.5, "origin": (0, 1)}),
    "min-wrap": (tf.minimum_filter, {"size": (3, 4), "mode": "wrap"}),
    "max-mirror-big": (tf.maximum_filter, {"size": 9, "mode": "mirror"}),  # 81 taps: runtime loop
    "percentile-axes-nearest": (tf.percentile_filter, {"percentile": 70, "size": (2, 5), "mode": ("nearest", "constant")}),
}


@pytest.mark.parametrize("name", list(BWD))
def test_backward_equals_reference(T, name):
    fn, kw = BWD[name]
    x = special((2, 7, 9), seed=12, ties=True)
    # small-integer gradients: every sum is exact, so atomic order cannot change a bit
    g = torch.randint(-8, 9, x.shape, generator=torch.Generator().manual_seed(3)).float()
    with launched(T, "rank_bwd"):
        yt, gt = grads(fn, x, g, "triton", **kw)
    yr, gr = grads(fn, x, g, "reference", **kw)
    same(yt, yr)
    same(gt, gr)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_backward_dtypes_1d_3d(T, dtype):
    x = special((2, 3, 4, 5), seed=13, dtype=dtype, ties=True)
    g = torch.randint(-4, 5, x.shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    for fn, kw in ((tf.median_filter, {"size": 3, "axes": (-3, -2, -1), "mode": "constant", "cval": -0.5}),
                   (tf.median_filter, {"size": 4, "axes": -1, "mode": "wrap"})):
        with launched(T, "rank_bwd"):
            _, gt = grads(fn, x, g, "triton", **kw)
        _, gr = grads(fn, x, g, "reference", **kw)
        same(gt, gr)


def test_gradcheck_tie_free(T):
    x = (torch.randperm(4 * 6, generator=torch.Generator().manual_seed(5)).double() / 7).view(1, 4, 6)
    x.requires_grad_(True)
    for fn, kw in ((tf.median_filter, {"size": 3, "mode": "reflect"}),
                   (tf.minimum_filter, {"size": (2, 3), "mode": "constant", "cval": 100.0})):
        assert torch.autograd.gradcheck(lambda t, fn=fn, kw=kw: fn(t, backend="triton", **kw), (x,), eps=1e-3,
                                        fast_mode=True)  # (a random projection: interpreted launches are slow)


@pytest.mark.parametrize("mode", ["nearest", "constant"])
def test_unsharp_mask_and_dog_on_triton(T, mode):
    """The other new ops of issue 12 are linear specs (a sum of two Gaussians): the Triton stencil
    engine runs them, forward and backward, to rounding of the reference."""
    x = rand(2, 9, 11, seed=3).requires_grad_(True)
    before = sum(T.FALLBACKS.values())
    for fn in (lambda t, e: tf.unsharp_mask(t, 1.2, 0.7, mode=mode, cval=0.5, backend=e),
               lambda t, e: tf.difference_of_gaussians(t, 0.8, mode=mode, cval=0.5, backend=e)):
        g = torch.rand(2, 9, 11, dtype=x.dtype)
        ys, gs = [], []
        for e in ("triton", "reference"):
            x.grad = None
            y = fn(x, e)
            y.backward(g)
            ys.append(y.detach())
            gs.append(x.grad.clone())
        torch.testing.assert_close(ys[0], ys[1], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gs[0], gs[1], rtol=1e-12, atol=1e-12)
    assert sum(T.FALLBACKS.values()) == before, T.FALLBACKS  # the Triton kernels ran
