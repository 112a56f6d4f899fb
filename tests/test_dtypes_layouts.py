"""Dtypes (fp16, bf16, fp32, integers) and memory layouts (non-contiguous, channels_last,
expanded), ``out=``, and inputs never being modified.

The op x dtype x mode grids run as covering arrays with the engine as one more axis (every
op in every dtype, on one engine; every engine with every op and every dtype) and as sampled
cases; ``make test-full`` runs the cross products on every engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import torchfilters as tf
from conftest import (
    CVAL,
    ENGINES,
    LOW_DTYPES,
    OPS,
    THRESHOLDED,
    assert_angles_close,
    assert_close,
    away_from,
    engines,
    examples,
    grid,
    modes,
    op_out_shape,
    rand,
    require_dtype,
    runs,
)

OP_NAMES = sorted(OPS)
SHAPE = (2, 3, 7, 9)


def _run(name, x, engine, **kw):
    return OPS[name](x, mode=kw.pop("mode", "reflect"), cval=kw.pop("cval", CVAL), backend=engine, **kw)


def _base(name, shape=SHAPE, seed=0, dtype=torch.float64):
    x = rand(*shape, seed=seed)
    if name in THRESHOLDED:
        x = away_from(x, 0.0)
    return x.to(dtype)


# ---------------------------------------------------------------------- dtypes

# relative to max |expected|: output rounding of the dtype, with the arithmetic in float32
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2, torch.float32: 2e-6}


@grid("engine, name, mode, dtype", ENGINES, OP_NAMES, ("reflect", "constant"), LOW_DTYPES)
def test_low_precision_forward_within_rounding_of_float64(engine, name, mode, dtype):
    require_dtype(engine, dtype)
    x = _base(name, seed=1).to(dtype)
    y = _run(name, x, engine, mode=mode)
    assert y.dtype == dtype and y.shape == op_out_shape(name, x.shape)
    ref = _run(name, x.double(), engine, mode=mode)  # the float64 result of the same (rounded) input
    if name.startswith("gradient_direction"):
        assert_angles_close(y, ref, atol=TOL[dtype] * math.pi * 2)
    else:
        assert_close(y, ref, rtol=TOL[dtype])


@examples(10)
@given(engine=engines, name=st.sampled_from(OP_NAMES), mode=modes, dtype=st.sampled_from(LOW_DTYPES))
def test_low_precision_forward_sampled(engine, name, mode, dtype):
    assume(runs(engine, dtype))
    test_low_precision_forward_within_rounding_of_float64(engine, name, mode, dtype)


#: 1/|g|^2 amplifies rounding where |g| is small; float32/float64 gradcheck covers it
BACKWARD_NAMES = [n for n in OP_NAMES if not n.startswith("gradient_direction")]


@grid("engine, name, dtype", ENGINES, BACKWARD_NAMES, LOW_DTYPES)
def test_low_precision_backward_within_rounding_of_float64(engine, name, dtype):
    require_dtype(engine, dtype)
    x = _base(name, seed=2).to(dtype).requires_grad_(True)
    y = _run(name, x, engine, mode="wrap")
    g = rand(*y.shape, seed=3).to(dtype)
    (gx,) = torch.autograd.grad(y, x, g)
    assert gx.dtype == dtype and gx.shape == x.shape
    x64 = x.detach().double().requires_grad_(True)
    (gref,) = torch.autograd.grad(_run(name, x64, engine, mode="wrap"), x64, g.double())
    # the incoming gradient is rounded once more on the way in; allow two roundings
    assert_close(gx, gref, rtol=2 * TOL[dtype])


@examples(10)
@given(engine=engines, name=st.sampled_from(BACKWARD_NAMES), dtype=st.sampled_from(LOW_DTYPES))
def test_low_precision_backward_sampled(engine, name, dtype):
    assume(runs(engine, dtype))
    test_low_precision_backward_within_rounding_of_float64(engine, name, dtype)


@grid("engine, name, dtype", ENGINES, OP_NAMES, (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64))
def test_integer_inputs_promote_to_float32_without_wraparound(engine, name, dtype):
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -30000), min(info.max, 30000)
    g = torch.Generator().manual_seed(4)
    x = torch.randint(lo, hi + 1, SHAPE, generator=g, dtype=torch.int64)
    x[..., :, 4:] = hi  # a big step: sums far outside the integer range
    x = x.to(dtype)
    x_before = x.clone()
    y = _run(name, x, engine)
    assert y.dtype == torch.float32
    ref = _run(name, x.double(), engine)
    if name.startswith("gradient_direction"):
        assert_angles_close(y, ref, atol=1e-5)
    else:
        assert_close(y, ref, rtol=2e-6)
    assert x.dtype == dtype and torch.equal(x, x_before)  # untouched


def test_large_int64_values_are_not_truncated(engine):
    x = torch.zeros(5, 5, dtype=torch.int64)
    x[:, 3:] = 2**40
    y = tf.sobel(x, backend=engine)
    assert y.dtype == torch.float32
    assert float(y[2, 2]) == 4.0 * 2**40


# --------------------------------------------------------------------- layouts


def _layouts(x):
    """(name, tensor) pairs with the values of ``x`` (a contiguous (2, 3, H, W) tensor)."""
    H, W = x.shape[-2:]
    yield "transposed", x.transpose(-1, -2).contiguous().transpose(-1, -2)
    yield "channels_last", x.contiguous(memory_format=torch.channels_last)
    big = torch.zeros(x.shape[0], x.shape[1] + 1, 2 * H + 1, 3 * W, dtype=x.dtype)
    big[:, 1:, 1::2, ::3] = x
    yield "sliced_with_step", big[:, 1:, 1::2, ::3]
    yield "batch_permuted", x.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)


@pytest.mark.parametrize("name", OP_NAMES)
def test_noncontiguous_layouts_match_contiguous(engine, name):
    x = _base(name, seed=5)
    ref = _run(name, x, engine)
    g = rand(*ref.shape, seed=6)
    xr = x.clone().requires_grad_(True)
    (gref,) = torch.autograd.grad(_run(name, xr, engine), xr, g)
    for label, xl in _layouts(x):
        assert torch.equal(xl, x)
        if label != "channels_last":
            assert not xl.is_contiguous(), label
        before = xl.clone()
        y = _run(name, xl, engine)
        assert_close(y, ref, rtol=1e-13, msg=label)
        assert torch.equal(xl, before), label
        xg = xl.detach().requires_grad_(True)
        (gx,) = torch.autograd.grad(_run(name, xg, engine), xg, g)
        assert_close(gx, gref, rtol=1e-13, msg=f"backward {label}")
        assert torch.equal(xl, before), label


@pytest.mark.parametrize("name", OP_NAMES)
def test_expanded_stride0_inputs(engine, name):
    """Expanded (stride-0) inputs along the batch axes and along W."""
    x1 = _base(name, shape=(1, 1, 7, 9), seed=7)
    xe = x1.expand(2, 3, 7, 9)
    y = _run(name, xe, engine)
    assert_close(y, _run(name, xe.contiguous(), engine), rtol=1e-13)
    col = _base(name, shape=(2, 1, 7, 1), seed=8)
    xw = col.expand(2, 3, 7, 9)  # stride 0 along W and C
    assert xw.stride()[-1] == 0
    assert_close(_run(name, xw, engine), _run(name, xw.contiguous(), engine), rtol=1e-13)
    # backward through an expanded leaf: gradients of the copies are summed
    x1g = x1.clone().requires_grad_(True)
    g = rand(*y.shape, seed=9)
    (g1,) = torch.autograd.grad(_run(name, x1g.expand(2, 3, 7, 9), engine), x1g, g)
    xc = xe.contiguous().requires_grad_(True)
    (gc,) = torch.autograd.grad(_run(name, xc, engine), xc, g)
    assert_close(g1, gc.sum(dim=(0, 1), keepdim=True), rtol=1e-12)


@pytest.mark.parametrize("name", OP_NAMES)
def test_inputs_are_never_modified(engine, name):
    x = _base(name, seed=10)
    x_before = x.clone()
    xg = x.clone().requires_grad_(True)
    y = _run(name, xg, engine, mode="constant")
    g = torch.ones_like(y)
    g_before = g.clone()
    y.backward(g)
    assert torch.equal(xg.detach(), x_before)
    assert torch.equal(g, g_before)
    out = torch.empty(op_out_shape(name, x.shape), dtype=x.dtype)
    _run(name, x, engine, out=out)
    assert torch.equal(x, x_before)
    if name == "selective_blur-mask":
        m = torch.zeros(7, 9, dtype=torch.bool)
        m[::2] = True
        m_before = m.clone()
        tf.selective_blur(x, mask=m, backend=engine)
        assert torch.equal(m, m_before)


# ------------------------------------------------------------------------- out=


@grid("engine, name, dtype", ENGINES, OP_NAMES, (torch.float32, torch.float64))
def test_out_writes_and_returns_out(engine, name, dtype):
    x = _base(name, seed=11).to(dtype)
    ref = _run(name, x, engine, mode="mirror")
    out = torch.full(op_out_shape(name, x.shape), float("nan"), dtype=dtype)
    res = _run(name, x, engine, mode="mirror", out=out)
    assert res is out
    assert torch.equal(out, ref)
    # a non-contiguous out (transposed storage) works too
    shape = op_out_shape(name, x.shape)
    out_t = torch.full(shape[:-2] + shape[-2:][::-1], float("nan"), dtype=dtype).transpose(-1, -2)
    assert _run(name, x, engine, mode="mirror", out=out_t) is out_t
    assert torch.equal(out_t, ref)


@pytest.mark.parametrize("name", [n for n in OP_NAMES if not n.startswith("gradient-")])
def test_out_may_alias_the_input(engine, name):
    """out=x filters in place, as if the input had been copied first."""
    x = _base(name, seed=12)
    ref = _run(name, x, engine)
    res = _run(name, x, engine, out=x)
    assert res is x
    assert_close(x, ref, rtol=0.0)


@pytest.mark.parametrize("shift", (-7, -1, 1, 7, 40, 60))
def test_out_overlapping_the_input_from_another_storage(engine, shift):
    """Two ``from_numpy`` views of one array are different torch storages: an ``out=`` whose
    memory overlaps the input's is still detected (the result is the out-of-place one), and a
    disjoint one is written directly."""
    buf = np.random.RandomState(3).randn(3 * 56 + 80)
    x = torch.from_numpy(buf[40 : 40 + 56]).view(8, 7)
    out = torch.from_numpy(buf[40 + shift : 40 + shift + 56]).view(8, 7)
    want = tf.derivative(x.clone(), -1, operator="sobel", backend=engine)
    assert tf.derivative(x, -1, operator="sobel", out=out, backend=engine) is out
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_out_low_precision(engine, dtype):
    require_dtype(engine, dtype)
    x = _base("gradient_magnitude-central", seed=13).to(dtype)
    out = torch.empty_like(x)
    assert tf.gradient_magnitude(x, operator="sobel", out=out, backend=engine) is out
    assert torch.equal(out, tf.gradient_magnitude(x, operator="sobel", backend=engine))
    with pytest.raises(TypeError, match="out"):
        tf.gradient_magnitude(x, out=torch.empty(x.shape), backend=engine)


def test_integer_input_out_must_be_float32(engine):
    x = torch.randint(0, 255, (2, 5, 6), dtype=torch.uint8)
    out = torch.empty(2, 5, 6)
    assert tf.sobel(x, out=out, backend=engine) is out
    assert torch.equal(out, tf.sobel(x, backend=engine))
    with pytest.raises(TypeError, match="out"):
        tf.sobel(x, out=torch.empty(2, 5, 6, dtype=torch.uint8), backend=engine)
