"""The fused CPU rank-filter engine (``backends/cpu/rank``) against the reference engine and SciPy.

Every algorithm path (``vh``: box min/max; ``net``: comparator programs; ``sel``: quickselect;
``hist``: the sliding bit histogram) is run on a fixed-seed sample of cases -- 1-3 axes, every
mode and per-axis modes, footprints with holes, origins, windows larger than the image, size-1
axes, NaN/inf -- by forcing the path (``rank._FORCE``) as well as by the engine's own choice.
Forward results must equal the reference's exactly (``==`` and NaN positions); backward results
too, on integer-valued gradients (exact in any summation order) and inputs with ties.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from conftest import examples
from hypothesis import given
from hypothesis import strategies as st

import torchfilters as tf
from torchfilters.backends.cpu import rank as R

MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
PATHS = (None, "vh", "net", "sel", "hist")


def same(a, b):
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.fixture
def force():
    def set_(algo):
        R._FORCE = algo
        R._plan.cache_clear()

    yield set_
    set_(None)


def _images(rng, nd, ties=False):
    shape = {1: (2, 13), 2: (2, 9, 12), 3: (2, 5, 6, 7)}[nd]
    if rng.random() < 0.2:  # a size-1 axis
        shape = shape[:-1] + (1,) if rng.random() < 0.5 else shape[:-nd] + (1,) + shape[-nd + 1:]
    x = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    if ties:
        x = torch.from_numpy(rng.integers(-2, 3, shape).astype(np.float32))
    if rng.random() < 0.4:
        flat = x.view(-1)
        for v in (float("nan"), float("inf"), -float("inf")):
            flat[int(rng.integers(flat.numel()))] = v
    return x


def _case(rng, nd, box=None, extreme=False):
    shape = tuple(int(rng.integers(1, 6)) for _ in range(nd))
    if rng.random() < 0.15:
        shape = tuple(s + 9 for s in shape)  # larger than the image
    fp = np.ones(shape, bool)
    if not (box if box is not None else rng.random() < 0.5):
        fp = rng.random(shape) < 0.6
        fp.flat[int(rng.integers(fp.size))] = True
    count = int(fp.sum())
    mode = MODES[rng.integers(5)] if rng.random() < 0.6 else [MODES[rng.integers(5)] for _ in range(nd)]
    origin = [int(rng.integers(-(s // 2), (s - 1) // 2 + 1)) for s in shape]
    rank = int(rng.integers(count))
    if extreme or rng.random() < 0.25:
        rank = 0 if rng.random() < 0.5 else count - 1
    kw = {"footprint": torch.from_numpy(fp), "mode": mode, "cval": float(rng.choice([0.0, 0.5, -1.5, np.inf])),
          "origin": origin, "axes": tuple(range(-nd, 0))}
    return rank, kw


@pytest.mark.parametrize("path", PATHS)
def test_forward_backward_match_reference(path, force):
    force(path)
    rng = np.random.default_rng(PATHS.index(path))
    for i in range(24):
        nd = 1 + i % 3
        rank, kw = _case(rng, nd, box=True if path in ("vh", "net") else None, extreme=path == "vh")
        x = _images(rng, nd, ties=i % 2 == 1)
        a = tf.rank_filter(x, rank, **kw, backend="cpu")
        b = tf.rank_filter(x, rank, **kw, backend="reference")
        assert same(a, b), (path, i, rank, kw)
        g = torch.from_numpy(rng.integers(-3, 4, x.shape).astype(np.float32))
        xr = x.clone().requires_grad_()
        ga, = torch.autograd.grad(tf.rank_filter(xr, rank, **kw, backend="cpu"), xr, g)
        gb, = torch.autograd.grad(tf.rank_filter(xr, rank, **kw, backend="reference"), xr, g)
        assert same(ga, gb), ("backward", path, i, rank, kw)


@given(seed=st.integers(0, 2**31), nd=st.sampled_from([1, 2, 3]), path=st.sampled_from(PATHS))
@examples(20)
def test_sampled_forward(seed, nd, path):
    rng = np.random.default_rng(seed)
    R._FORCE = path
    R._plan.cache_clear()
    try:
        rank, kw = _case(rng, nd, box=True if path in ("vh", "net") else None, extreme=path == "vh")
        x = _images(rng, nd, ties=seed % 2 == 0)
        assert same(tf.rank_filter(x, rank, **kw, backend="cpu"), tf.rank_filter(x, rank, **kw, backend="reference"))
    finally:
        R._FORCE = None
        R._plan.cache_clear()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,size", [("median_filter", 3), ("median_filter", 5), ("minimum_filter", (4, 7)),
                                     ("maximum_filter", 15), ("median_filter", 9), ("percentile", (3, 6))])
def test_scipy_parity(op, size, mode):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 20, 24))
    xt = torch.from_numpy(x.astype(np.float32))
    if op == "percentile":
        got = tf.percentile_filter(xt, 30, size=size, mode=mode, cval=0.25, backend="cpu")
        ref = [ndi.percentile_filter(s, 30, size=size, mode=mode, cval=0.25) for s in x.reshape(-1, 20, 24)]
    else:
        got = getattr(tf, op)(xt, size=size, mode=mode, cval=0.25, backend="cpu")
        ref = [getattr(ndi, op)(s, size=size, mode=mode, cval=0.25) for s in x.reshape(-1, 20, 24)]
    ref = np.stack(ref).reshape(x.shape).astype(np.float32)
    np.testing.assert_array_equal(got.numpy(), ref)


def test_scipy_parity_float64_3d_footprint():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 7, 8))
    fp = rng.random((3, 2, 3)) < 0.7
    fp[1, 1, 1] = True
    got = tf.rank_filter(torch.from_numpy(x), 2, footprint=torch.from_numpy(fp), axes=(-3, -2, -1), mode="mirror",
                         backend="cpu")
    ref = np.stack([ndi.rank_filter(s, 2, footprint=fp, mode="mirror") for s in x])
    np.testing.assert_array_equal(got.numpy(), ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op,size", [("median_filter", 3), ("maximum_filter", 5), ("median_filter", 9),
                                     ("minimum_filter", (2, 3))])
def test_dtypes(dtype, op, size):
    x = torch.randn(2, 3, 17, 19).to(dtype)
    x[0, 0, 2, 2] = float("nan")
    a = getattr(tf, op)(x, size=size, mode="constant", cval=0.3, backend="cpu")
    b = getattr(tf, op)(x, size=size, mode="constant", cval=0.3, backend="reference")
    assert a.dtype == dtype and same(a, b)
    xr = x.clone().requires_grad_()
    g = torch.randint(-2, 3, x.shape).to(dtype)
    ga, = torch.autograd.grad(getattr(tf, op)(xr, size=size, backend="cpu"), xr, g)
    gb, = torch.autograd.grad(getattr(tf, op)(xr, size=size, backend="reference"), xr, g)
    assert ga.dtype == dtype and same(ga, gb)


@pytest.mark.parametrize("size", [3, 5, 15])
def test_layouts_and_out(size):
    x = torch.randn(2, 4, 21, 23)
    ref = tf.median_filter(x, size=size, backend="reference")
    cl = x.to(memory_format=torch.channels_last)
    assert same(tf.median_filter(cl, size=size, backend="cpu"), ref)
    t = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # non-contiguous rows
    assert same(tf.median_filter(t, size=size, backend="cpu"), ref)
    out = torch.empty_like(x)
    assert tf.median_filter(x, size=size, out=out, backend="cpu") is out and same(out, ref)
    out = torch.empty(2, 4, 23, 21).transpose(-1, -2)
    tf.median_filter(x, size=size, out=out, backend="cpu")
    assert same(out, ref)
    big = torch.randn(1, 1, 64, 700)  # several strips / chunks / bands
    for op in ("maximum_filter", "minimum_filter", "median_filter"):
        assert same(getattr(tf, op)(big, size=size, backend="cpu"), getattr(tf, op)(big, size=size, backend="reference"))


@pytest.mark.parametrize("path", PATHS)
def test_gradcheck(path, force):
    force(path)
    x = (torch.randperm(6 * 7).reshape(1, 6, 7).double() / 7).requires_grad_()  # no ties
    for size, rank in [((3, 3), 4), ((3, 2), 0), ((2, 3), 5)]:
        if path == "vh" and rank not in (0, size[0] * size[1] - 1):
            rank = 0
        def f(t, rank=rank, size=size):
            return tf.rank_filter(t, rank, size=size, mode="mirror", backend="cpu")

        assert torch.autograd.gradcheck(f, (x,))


def test_filters1d_and_large_windows():
    x = torch.randn(3, 40, 50)
    for fn in ("minimum_filter1d", "maximum_filter1d"):
        for axis in (-1, -2):
            assert same(getattr(tf, fn)(x, 7, axis=axis, backend="cpu"), getattr(tf, fn)(x, 7, axis=axis, backend="reference"))
    fp = torch.ones(15, 15, dtype=torch.bool)
    fp[::3, 1::4] = False
    for kw in ({"size": 15}, {"footprint": fp}, {"size": (17, 5)}):
        assert same(tf.median_filter(x, **kw, mode="wrap", backend="cpu"), tf.median_filter(x, **kw, mode="wrap", backend="reference"))


def test_networks_sort():
    """The comparator programs select the right rank on every 0/1 input of small boxes."""
    rng = np.random.default_rng(0)
    for m, kx in [(3, 3), (5, 5), (1, 4), (4, 1), (2, 3), (3, 7)]:
        for rank in range(m * kx):
            prog, n1, nrows, rr, rs = R._network(m, kx, rank)
            for _ in range(40):
                v = rng.random((m, 8 + kx - 1))
                B = np.zeros((nrows, v.shape[1]))
                B[:m] = v
                for p, (op, d, a, sa, b, sb) in enumerate(prog):
                    w = v.shape[1] if p < n1 else 8
                    f = np.minimum if op == 0 else np.maximum
                    B[d, :w] = f(B[a, sa:sa + w], B[b, sb:sb + w])
                want = np.sort(np.stack([v[:, c:c + 8] for c in range(kx)], 0).reshape(-1, 8), axis=0)[rank]
                np.testing.assert_array_equal(B[rr, rs:rs + 8], want)


def test_generated_networks_are_current(tmp_path):
    """``rank_nets.py`` is generated from ``rank._network``: it must be what the generator writes now."""
    from pathlib import Path

    from torchfilters.backends.cpu import rank

    path = tmp_path / "rank_nets.py"
    rank._emit_module(str(path))
    assert path.read_text() == (Path(rank.__file__).parent / "rank_nets.py").read_text(), (
        "run torchfilters.backends.cpu.rank._emit_module on rank_nets.py")
