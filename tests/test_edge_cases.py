"""Edge cases found by trying to break the library (each was a real defect once)."""

from __future__ import annotations

import math
import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
import torch.autograd.forward_ad as fwAD

import torchfilters as tf
from torchfilters import _ops, _spec


def test_normalized_blur_never_reads_excluded_nan_or_inf(engine):
    for bad in (float("nan"), float("-inf"), float("inf")):
        x = torch.ones(5, 5)
        x[2, 2] = bad
        y = tf.selective_blur(x, 0.0, mask=x.isfinite(), normalized=True, backend=engine)
        expect = torch.ones(5, 5)
        expect[2, 2] = bad
        torch.testing.assert_close(y, expect, equal_nan=True)


def test_nan_under_a_zero_tap_follows_scipy(engine):
    """1-D passes multiply every tap (scipy's correlate1d), so a NaN under the
    0 centre of [-1, 0, 1] is NaN; a 2-D kernel leaves zero weights out of the
    footprint (scipy's correlate)."""
    x = np.arange(25.0).reshape(5, 5)
    x[2, 2] = np.nan
    t = torch.from_numpy(x)
    for axis in (-1, -2):
        got = tf.sobel(t, axis, backend=engine).numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ndi.sobel(x, axis=axis)))
    got = tf.correlate1d(t, [-1.0, 0.0, 1.0], backend=engine).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ndi.correlate1d(x, [-1.0, 0.0, 1.0])))
    w = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    got = tf.correlate(t, w, backend=engine).numpy()
    ref = ndi.correlate(x, w)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    assert not np.isnan(got[2, 2])  # the NaN pixel sits under the zero centre
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_reference_backward_is_contiguous_in_constant_mode():
    x = torch.rand(2, 3, 6, 7, dtype=torch.float64)
    g = torch.rand(2, 3, 6, 7, dtype=torch.float64)
    text = _spec.encode(_spec.FilterSpec("constant", 1.5, "stack", (_spec.sep((-1, -1, (-1.0, 0.0, 1.0))),)))
    gx = _ops.filter_backward_op(g, x, text, "reference")
    assert gx.is_contiguous()


def test_forward_mode_ad_is_refused_not_silently_zero(monkeypatch):
    # ``fwAD.make_dual`` (also under ``torch.func.jvp``) first imports
    # ``torch._decomp.decompositions_for_jvp`` unless TorchScript is off (``PYTORCH_JIT=0``,
    # read at that call); that module compiles its decompositions with the deprecated
    # ``torch.jit.script`` (18 DeprecationWarnings).  They are TorchScript formulas for a few
    # aten ops; ours have no forward-mode formula at all, which is what this test checks.
    monkeypatch.setenv("PYTORCH_JIT", "0")
    x = torch.randn(4, 4, dtype=torch.float64)
    v = torch.randn(4, 4, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="forward-mode"):
        torch.func.jvp(tf.sobel, (x,), (v,))
    with fwAD.dual_level():
        with pytest.raises(NotImplementedError, match="forward-mode"):
            tf.gradient_magnitude(fwAD.make_dual(x, v))


def test_autocast_does_not_lower_precision(engine):
    x = torch.rand(2, 3, 9, 10)
    w = torch.rand(5, 5)
    ref = tf.correlate(x, w, backend=engine)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = tf.correlate(x, w, backend=engine)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_threshold_compares_in_the_input_dtype(engine):
    x = torch.full((3, 3), 0.1, dtype=torch.float16)
    x[1, 1] = 0.5
    assert torch.equal(tf.selective_blur(x, 0.1, backend=engine), tf.selective_blur(x, mask=x >= 0.1, backend=engine))


def test_out_with_overlapping_memory_or_requiring_grad_is_refused():
    x = torch.rand(2, 3, 6, 7)
    with pytest.raises(ValueError, match="out"):
        tf.sobel(x, out=torch.zeros(1, 1, 6, 7).expand(2, 3, 6, 7))
    with pytest.raises(RuntimeError, match="out"):
        tf.sobel(x, out=torch.zeros(2, 3, 6, 7, requires_grad=True))


def test_negative_zero_cval_is_not_confused_with_zero(engine):
    x = torch.full((1, 4), -0.0, dtype=torch.float64)
    tf.correlate1d(x, [1.0, 1.0, 1.0], mode="constant", cval=0.0, backend=engine)
    y = tf.correlate1d(x, [1.0, 1.0, 1.0], mode="constant", cval=-0.0, backend=engine)
    ref = ndi.correlate1d(x.numpy(), [1.0, 1.0, 1.0], mode="constant", cval=-0.0)
    assert torch.signbit(y).tolist() == np.signbit(ref).tolist()


def test_spec_strings_are_literals_only():
    with pytest.raises(ValueError):
        _spec.decode("FilterSpec(().__class__.__base__.__subclasses__().__len__())")
    spec = _spec.FilterSpec("constant", float("-inf"), "stack", (_spec.sep((-1, -1, (1.0, float("nan"), 2.0))),))
    back = _spec.decode(_spec.encode(spec))
    assert back.cval == float("-inf") and np.isnan(back.stencils[0].passes[0].taps[1])


def test_argument_edge_cases():
    x = torch.rand(2, 6, 7)
    with pytest.raises(ValueError, match="backend"):
        tf.gaussian_filter(x, 0, backend="bogus")
    with pytest.raises(ValueError, match="sigma"):
        tf.gaussian_filter(x, 1e300)
    torch.testing.assert_close(tf.sobel(x, axis=np.int64(-2)), tf.sobel(x, axis=-2))
    torch.testing.assert_close(tf.sobel(x, mode="constant", cval=torch.tensor(2.0)), tf.sobel(x, mode="constant", cval=2.0))
    y = x.clone()
    tf.gaussian_filter(y, 0, out=y)  # sigma 0 and out aliasing the input: a copy onto itself
    assert torch.equal(y, x)


@pytest.mark.parametrize("dtype, cval, op", [(torch.float16, 7e4, lambda x, **k: tf.median_filter(x, 3, **k)),
                                             (torch.float32, 1e39, lambda x, **k: tf.gaussian_filter(x, 1.0, **k)),
                                             (torch.bfloat16, -1e39, lambda x, **k: tf.uniform_filter(x, 3, **k))])
def test_a_cval_past_the_dtypes_range_pads_with_inf_on_every_engine(dtype, cval, op):
    """Found by review: the reference engine raised ``RuntimeError: value cannot be converted to
    type ... without overflow`` where the CPU and Triton engines pad with the cval cast (inf)."""
    x = torch.rand(1, 2, 4, 5, generator=torch.Generator().manual_seed(3)).to(dtype)
    ref = op(x, mode="constant", cval=cval, backend="reference")
    assert ref[0, 0, 0, 0].item() == math.copysign(math.inf, cval)
    assert torch.equal(ref, op(x, mode="constant", cval=cval, backend="cpu"))
