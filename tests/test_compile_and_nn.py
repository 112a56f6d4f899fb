"""torch.compile(fullgraph=True) through the custom ops, and the nn.Module wrappers.

Compiling is slow (about 10 s for the inductor compile below on 2 cores), so
there is one inductor compile (forward and backward) and one cheap
``aot_eager`` compile with dynamic shapes.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

import torchfilters as tf
from conftest import assert_close, rand

# Inductor's FX passes import torch.utils.mkldnn, whose classes torch itself still defines with
# the deprecated ``@torch.jit.script_method`` (14 DeprecationWarnings from torch's own code, at
# import).  Nothing here uses TorchScript; import that module once, quietly, so that the
# warning still shows for any other use.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"`torch\.jit\.script_method` is deprecated", DeprecationWarning)
    import torch.utils.mkldnn


def _model(x, mask):
    g = tf.gradient_magnitude(x, operator="sobel", mode="reflect")
    b = tf.selective_blur(x, 0.0, normalized=True, keep_border=True, mode="mirror")
    c = tf.selective_blur(g, mask=mask)  # the GAN case's blend, with a given mask
    return torch.tanh(g) * 2 + b + c


def _eager(x, mask):
    xe = x.detach().clone().requires_grad_(True)
    y = _model(xe, mask)
    y.backward(torch.ones_like(y))
    return y.detach(), xe.grad


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compile_fullgraph_inductor_forward_and_backward():
    x = torch.randn(2, 3, 16, 17, generator=torch.Generator().manual_seed(0))
    x[0, 0, :6, :6] = 0.25  # a flat patch: gradient_magnitude's zero-gradient branch
    mask = torch.rand(16, 17, generator=torch.Generator().manual_seed(1)) > 0.5
    compiled = torch.compile(_model, fullgraph=True)  # raises on any graph break
    xc = x.clone().requires_grad_(True)
    y = compiled(xc, mask)
    y.backward(torch.ones_like(y))
    y_ref, g_ref = _eager(x, mask)
    torch.testing.assert_close(y.detach(), y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xc.grad, g_ref, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(xc.grad).all()


def test_compile_fullgraph_new_shapes_and_no_grad():
    """A second shape recompiles with symbolic sizes (automatic dynamic shapes), so the fake
    (meta) registrations see SymInts; no_grad calls work too."""
    compiled = torch.compile(_model, fullgraph=True, backend="aot_eager")
    for shape in [(1, 2, 9, 11), (3, 1, 12, 7), (2, 2, 5, 6)]:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64)
        mask = torch.rand(shape[-2:], generator=torch.Generator().manual_seed(2)) > 0.3
        xc = x.clone().requires_grad_(True)
        y = compiled(xc, mask)
        y.backward(torch.ones_like(y))
        y_ref, g_ref = _eager(x, mask)
        assert_close(y, y_ref, rtol=1e-12)
        assert_close(xc.grad, g_ref, rtol=1e-12)
        with torch.no_grad():
            assert_close(compiled(x, mask), y_ref, rtol=1e-12)


def test_compile_fullgraph_with_out():
    """Found by review: ``out=`` ended a fullgraph trace (its overlap check called a private
    torch function Dynamo cannot trace).  Into a caller's tensor and into a fresh one; an
    expanded (stride-0) ``out`` is still refused, eagerly and compiled."""

    def into(x, y):
        return tf.gaussian_filter(x, 1.0, out=y), tf.sobel(x, axis=-1, out=torch.empty_like(x)) * 2

    x = torch.randn(2, 9, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.full_like(x, float("nan"))
    a, b = torch.compile(into, fullgraph=True, backend="aot_eager")(x, y)
    assert torch.equal(y, tf.gaussian_filter(x, 1.0)) and torch.equal(a, y)
    assert torch.equal(b, tf.sobel(x, axis=-1) * 2)
    z = torch.zeros(1, 1, 10, dtype=torch.float64).expand(2, 9, 10)
    with pytest.raises(ValueError, match="overlapping memory"):
        tf.gaussian_filter(x, 1.0, out=z)
    e = torch.empty(0, 1, 1, 6).expand(0, 1, 6, 6)  # no element: nothing overlaps (review)
    assert tf.gaussian_filter(torch.rand(0, 1, 6, 6), 1.0, out=e) is e
    with pytest.raises(Exception, match="overlapping memory"):
        torch.compile(into, fullgraph=True, backend="aot_eager")(x, z)


def test_compile_fullgraph_recompiles_for_new_shapes():
    """fullgraph=True keeps holding when shapes change (Dynamo's automatic dynamic shapes)."""
    compiled = torch.compile(_model, fullgraph=True, backend="aot_eager")
    for shape in [(1, 2, 8, 9), (2, 1, 11, 7), (1, 1, 5, 6)]:
        x = rand(*shape, seed=8)
        mask = x[0, 0] > 0
        assert_close(compiled(x, mask), _model(x, mask), rtol=1e-12)


def test_compile_dynamic_true_matches_eager():
    """dynamic=True works, fullgraph too: it makes Python floats such as cval symbolic, and the
    specs that select a kernel specialise on them."""
    x = rand(1, 2, 8, 9, seed=8)
    mask = x[0, 0] > 0
    y = torch.compile(_model, backend="aot_eager", dynamic=True, fullgraph=True)(x, mask)
    assert_close(y, _model(x, mask), rtol=1e-12)


@pytest.mark.parametrize(
    "name",
    ["gaussian_filter", "correlate-list-weights", "selective_blur-sigma", "nn.GaussianFilter",
     "selective_blur-weights", "nn.SelectiveBlur-weights", "nn.GaussianFilter-tensor-sigma"],
)
def test_compile_fullgraph_other_ops(name):
    """Every op should trace without a graph break (cheap aot_eager backend); selective_blur's
    weights were checked through a tensor (found by review: no fullgraph trace)."""
    w3 = [[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]
    fn = {
        "gaussian_filter": lambda t: tf.gaussian_filter(t, 1.0, order=(0, 1)),
        "correlate-list-weights": lambda t: tf.correlate(t, [[1.0, 2.0], [0.5, -1.0]]),
        "selective_blur-sigma": lambda t: tf.selective_blur(t, 0.0, sigma=0.8),
        "nn.GaussianFilter": tf.nn.GaussianFilter(1.5),
        "selective_blur-weights": lambda t: tf.selective_blur(t, 0.0, weights=w3, normalized=True),
        "nn.SelectiveBlur-weights": tf.nn.SelectiveBlur(0.0, weights=w3),
        "nn.GaussianFilter-tensor-sigma": tf.nn.GaussianFilter(torch.tensor([1.5, 0.7])),  # (held as numbers)
    }[name]
    x = rand(1, 2, 8, 9, seed=3)
    xc = x.clone().requires_grad_(True)
    y = torch.compile(fn, fullgraph=True, backend="aot_eager")(xc)
    y.sum().backward()
    xe = x.clone().requires_grad_(True)
    ye = fn(xe)
    ye.sum().backward()
    assert_close(y, ye, rtol=1e-12)
    assert_close(xc.grad, xe.grad, rtol=1e-12)


# ---------------------------------------------------------------------- nn


@pytest.mark.parametrize("mode", ["reflect", "constant", "grid-wrap"])
def test_nn_gradient_magnitude(engine, mode):
    x = rand(2, 3, 7, 8, seed=4)
    for kw in (dict(), dict(operator="scharr", normalized=True), dict(operator="prewitt", cval=2.0)):
        m = tf.nn.GradientMagnitude(mode=mode, **kw)
        ref = tf.gradient_magnitude(x, mode=mode, backend=engine, **kw)
        assert_close(m(x), ref, rtol=1e-14)
    assert "operator='sobel'" in repr(tf.nn.GradientMagnitude("sobel"))


@pytest.mark.parametrize("mode", ["reflect", "constant", "mirror"])
def test_nn_gaussian_filter(engine, mode):
    x = rand(2, 3, 7, 8, seed=5)
    for kw in (dict(sigma=1.0), dict(sigma=(0.5, 2.0), order=(1, 0), truncate=2.0), dict(sigma=3.0, radius=(1, 2), cval=-1.0)):
        m = tf.nn.GaussianFilter(mode=mode, **kw)
        sigma = kw.pop("sigma")
        assert_close(m(x), tf.gaussian_filter(x, sigma, mode=mode, backend=engine, **kw), rtol=1e-14)
    assert "sigma=1.0" in repr(tf.nn.GaussianFilter(1.0))


def test_nn_selective_blur(engine):
    x = rand(2, 3, 7, 8, seed=6)
    m = tf.nn.SelectiveBlur(0.2, normalized=True, keep_border=True)
    assert_close(m(x), tf.selective_blur(x, 0.2, normalized=True, keep_border=True, backend=engine), rtol=1e-14)
    mask = x < 0
    m = tf.nn.SelectiveBlur(sigma=(0.7, 1.1), mode="nearest")
    assert_close(m(x, mask), tf.selective_blur(x, mask=mask, sigma=(0.7, 1.1), mode="nearest", backend=engine), rtol=1e-14)
    assert "normalized=False" in repr(m)


def test_nn_modules_are_parameter_free_and_composable():
    net = torch.nn.Sequential(
        tf.nn.GaussianFilter(1.0),
        tf.nn.GradientMagnitude(operator="sobel"),
        tf.nn.SelectiveBlur(0.1),
    )
    assert list(net.parameters()) == [] and list(net.buffers()) == []
    assert net.state_dict() == {}
    x = rand(2, 1, 9, 9, seed=7).float().requires_grad_(True)
    y = net(x)
    ref = tf.selective_blur(tf.gradient_magnitude(tf.gaussian_filter(x, 1.0), operator="sobel"), 0.1)
    assert torch.equal(y, ref)
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    net2 = copy.deepcopy(net).double()
    assert_close(net2(x.detach().double()), ref.detach().double(), rtol=1e-5)
    net.eval()
    with torch.no_grad():
        assert torch.equal(net(x), ref)


def test_compile_fullgraph_when_a_float_argument_changes():
    """Found by review: with the default ``dynamic=None`` Dynamo makes a float argument symbolic
    once it changes between calls, and the argument checks failed to trace it (sigma of a second
    module, a new cval).  Each value is specialised, and each result is eager's."""
    x = rand(1, 2, 8, 9, seed=5)
    f = torch.compile(lambda t, c, s: tf.gaussian_filter(t, s, mode="constant", cval=c), fullgraph=True,
                      backend="eager")
    for c, s in ((0.0, 1.0), (1.0, 1.0), (2.5, 1.7), (-1.0, 0.6)):
        assert torch.equal(f(x, c, s), tf.gaussian_filter(x, s, mode="constant", cval=c)), (c, s)
    for s in (1.0, 2.0):
        m = tf.nn.GaussianFilter(s)
        assert torch.equal(torch.compile(m, fullgraph=True, backend="eager")(x), m(x))


def test_modules_construct_whatever_the_default_backend(monkeypatch):
    """Found by review: a module checked its arguments by running on the default backend, so
    ``TORCHFILTERS_BACKEND=triton`` (CUDA tensors only) made every module raise at construction."""
    monkeypatch.setenv("TORCHFILTERS_BACKEND", "triton")
    for m in (tf.nn.GaussianFilter(1.0), tf.nn.MedianFilter(3), tf.nn.GradientMagnitude(axes=(0, 1, 2))):
        assert isinstance(m, torch.nn.Module)
    with pytest.raises(ValueError):  # (the arguments are still checked)
        tf.nn.GaussianFilter(-1.0)


def test_a_tensor_sigma_under_fullgraph_is_named():
    """A tensor's values are data to Dynamo: under ``fullgraph`` the error names the argument
    (it named only ``Tensor.tolist``; found by a README walk); without it the call still works."""
    x = rand(1, 2, 8, 9, seed=6)
    f = lambda t: tf.gaussian_filter(t, torch.tensor([1.0, 2.0]))  # noqa: E731
    with pytest.raises(Exception, match="sigma must be Python numbers under torch.compile"):
        torch.compile(f, fullgraph=True, backend="eager")(x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, backend="eager")(x), tf.gaussian_filter(x, (1.0, 2.0)))


def test_modules_take_every_axes_form_the_functions_take():
    """Mixed signs (valid on inputs with enough dimensions), a list, a range, a NumPy array, a
    tensor: found by review, the modules refused them ("axes must be distinct", raw errors)."""
    x = torch.rand(2, 3, 5, 6, dtype=torch.float64)
    for cls, fn, args, axes in [(tf.nn.Laplace, tf.laplace, (), (1, -1)),
                                (tf.nn.GaussianFilter, tf.gaussian_filter, (1.0,), (1, -1, 2)),
                                (tf.nn.Laplace, tf.laplace, (), [2, 3]),
                                (tf.nn.Laplace, tf.laplace, (), range(1, 3)),
                                (tf.nn.UniformFilter, tf.uniform_filter, (3,), np.array([0, -1])),
                                (tf.nn.GradientMagnitude, tf.gradient_magnitude, (), torch.tensor([-3, 2]))]:
        m = cls(*args, axes=axes)
        assert torch.equal(m(x), fn(x, *args, axes=axes)), (cls, axes)
    assert torch.equal(tf.nn.Sobel(axis=-1, axes=(0, 1, 2))(x[0]), tf.sobel(x[0], -1, axes=(0, 1, 2)))
    for bad, exc in [((1, 1), ValueError), ((0, 1, 2, 3), ValueError), ((1.5,), TypeError), ("ab", TypeError),
                     ((-1, 3, 4, 5), ValueError)]:
        with pytest.raises(exc, match="axes"):
            tf.nn.Laplace(axes=bad)
    with pytest.raises(ValueError, match="axis"):
        tf.nn.Sobel(axis=5, axes=(0, 1))


_INT_ARGS = {
    "origin": (lambda t, v: tf.uniform_filter(t, 3, origin=v), (0, 1, -1)),
    "size": (lambda t, v: tf.uniform_filter(t, v), (3, 5, 2)),
    "axes": (lambda t, v: tf.gaussian_filter(t, 1.0, axes=(v, -1)), (-2, 1, 0)),
    "order": (lambda t, v: tf.gaussian_filter(t, 1.0, order=v), (0, 1, 2)),
    "radius": (lambda t, v: tf.gaussian_filter(t, 1.0, radius=v), (2, 3, 5)),
    "axis": (lambda t, v: tf.gaussian_filter1d(t, 1.0, axis=v), (-1, 2, 1)),
    "rank": (lambda t, v: tf.rank_filter(t, v, 3), (1, 4, -1)),
    "percentile": (lambda t, v: tf.percentile_filter(t, v, 3), (50, 20, 90)),
    "int sigma": (lambda t, v: tf.difference_of_gaussians(t, 1.0, v), (2, 3, 4)),
}


@pytest.mark.parametrize("dynamic", (None, True))
@pytest.mark.parametrize("name", sorted(_INT_ARGS))
def test_compile_fullgraph_when_an_int_argument_changes(name, dynamic):
    """Found by review: Dynamo makes an int argument symbolic once it changes between calls (at
    once with ``dynamic=True``), and the spec builders could not take it (``assume_constant_result
    argument conversion failed``; ``axes``: "sort with non-constant keys").  Each value is
    specialised, and each result is eager's."""
    fn, values = _INT_ARGS[name]
    x = rand(2, 3, 9, 10, seed=7)
    f = torch.compile(fn, fullgraph=True, backend="eager", dynamic=dynamic)
    for v in values:
        assert torch.equal(f(x, v), fn(x, v)), v


def test_numpy_arguments_of_modules_become_python_numbers():
    """Found by review: modules kept NumPy ``sigma`` as given (``sigma=np.float32(1.5)``), which
    Dynamo traces as a tensor (no fullgraph trace); a NumPy value passed to a function under
    ``fullgraph`` is refused by name."""
    x = rand(1, 2, 8, 9, seed=8)
    for m, want in ((tf.nn.GaussianFilter(np.float32(1.5)), tf.gaussian_filter(x, 1.5)),
                    (tf.nn.GaussianFilter(np.array([1.5, 1.0])), tf.gaussian_filter(x, (1.5, 1.0))),
                    (tf.nn.UniformFilter(np.int64(3), origin=np.array([0, 1])), tf.uniform_filter(x, 3, origin=(0, 1)))):
        assert "np." not in repr(m) and "array" not in repr(m), repr(m)
        assert torch.equal(torch.compile(m, fullgraph=True, backend="eager")(x), want)
        torch._dynamo.reset()
    with pytest.raises(Exception, match="sigma must be Python numbers under torch.compile"):
        torch.compile(lambda t: tf.gaussian_filter(t, np.float64(1.5)), fullgraph=True, backend="eager")(x)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.trace(_method)?` is deprecated:DeprecationWarning")
def test_jit_trace_records_each_op_as_its_custom_op():
    """Found by review: ``torch.jit.trace`` failed on the fused CPU engine (traced sizes reached
    numba: ``TypingError``), and in the background compile mode its check pass ran another
    engine ("Graphs differed across invocations").  A trace records the custom op, which runs on
    other shapes."""
    x = rand(1, 2, 8, 9, seed=9)
    y = rand(2, 3, 10, 7, seed=10)
    for f in (lambda t: tf.gradient_magnitude(t), lambda t: tf.gaussian_filter(t, 1.5),
              lambda t: tf.median_filter(t, 3), lambda t: tf.selective_blur(t, 0.5),
              lambda t: tf.gradient_magnitude(t, operator="sobel", axes=(-3, -2, -1)), tf.nn.Laplace()):
        traced = torch.jit.trace(f, (x,))
        assert "torchfilters::" in str(traced.graph)
        assert torch.equal(traced(y), f(y))
