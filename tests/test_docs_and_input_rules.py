"""Docstrings filled from torchfilters._docs, and the input rules an adversarial review found.

* every public op's ``help()`` documents each argument it takes, the mode
  table, shapes, dtypes, ``out``, ``backend``, errors, the SciPy call and an
  example; so do the ``nn`` modules;
* sparse / mkldnn / nested tensors are a ``TypeError`` naming the argument
  (not an engine's ``RuntimeError``), meta tensors where values are needed a
  ``ValueError`` naming it;
* NumPy scalars are accepted where torch accepts them (``np.bool_`` flags,
  NumPy integers for int arguments, NumPy floats for real ones), with the
  same refusals as their Python counterparts (a bool is not a number, a
  float is not an int).
"""

from __future__ import annotations

import doctest
import inspect
import re
import warnings

import numpy as np
import pytest
import torch

import torchfilters as tf
from torchfilters import _docs, kernels

# (float64: the kernels the parity tests compile anyway; these tests are about arguments)
X = torch.rand(2, 1, 5, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def raises(exc, *words):
    """``pytest.raises(exc)`` whose message contains every one of ``words`` (case-insensitive)."""
    pattern = "".join(f"(?=.*{re.escape(w)})" for w in words)
    return pytest.raises(exc, match=re.compile(pattern, re.IGNORECASE | re.DOTALL))


from _public import PUBLIC  # noqa: E402
NAMES = sorted(PUBLIC)


#: public ops that are not filters of an image into an image of its dtype, each with its own tests:
#: ``canny`` is a detector (a bool map per (H, W) slice, no ``axes``, a bool ``out``; tests/test_canny.py)
NOT_FILTERS = {"canny"}


def test_the_table_covers_every_public_op():
    assert set(PUBLIC) | NOT_FILTERS == set(tf.functional.__all__)


# ------------------------------------------------------------------ docstrings


def _args_section(doc: str) -> list:
    """The argument names of a Google-style ``Args:`` section (after ``inspect.cleandoc``)."""
    m = re.search(r"^Args:\n(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    assert m, "no Args: section"
    return re.findall(r"^    (\w+)(?: \(.*?\))?:", m.group(1), re.M)


@pytest.mark.parametrize("name", NAMES)
def test_help_documents_every_argument(name):
    fn = getattr(tf, name)
    doc = inspect.getdoc(fn)
    documented = _args_section(doc)
    params = list(inspect.signature(fn).parameters)
    assert documented == params, f"{name}: Args {documented} vs signature {params}"


@pytest.mark.parametrize("name", NAMES)
def test_help_shows_the_shared_paragraphs(name):
    doc = inspect.getdoc(getattr(tf, name))
    assert "%(" not in doc, "an unfilled placeholder"
    flat = " ".join(doc.split())  # the needles do not depend on where lines break
    for needle in [
        "(..., H, W)",  # shapes
        "float16, bfloat16",  # dtypes
        "promoted",  # integer promotion
        "d c b a | a b c d | d c b a",  # the mode table
        "'grid-mirror'",
        "'replicate'",  # the torch names raise ValueError
        "cval",
        "out:",
        "may alias",
        "TORCHFILTERS_BACKEND",
        "BackendUnavailableError",
        "Returns:",
        "Raises:",
        "TypeError:",
        "ValueError:",
        "SciPy: on each slice ``x`` of ``input`` along the chosen axes",
        ">>> ",
    ]:
        assert needle in flat, f"{name}'s docstring lacks {needle!r}"


@pytest.mark.parametrize(
    "name, scipy_call",
    [
        ("correlate", "scipy.ndimage.correlate("),
        ("convolve", "scipy.ndimage.convolve("),
        ("correlate1d", "scipy.ndimage.correlate1d("),
        ("convolve1d", "scipy.ndimage.convolve1d("),
        ("sobel", "scipy.ndimage.sobel("),
        ("prewitt", "scipy.ndimage.prewitt("),
        ("gaussian_filter", "scipy.ndimage.gaussian_filter("),
        ("gaussian_gradient_magnitude", "scipy.ndimage.gaussian_gradient_magnitude("),
    ],
)
def test_help_names_the_scipy_call(name, scipy_call):
    assert f"the same as\n``{scipy_call}" in inspect.getdoc(getattr(tf, name))


def test_gaussian_filter_documents_mode_cval_out_backend():
    assert {"mode", "cval", "out", "backend"} <= set(_args_section(inspect.getdoc(tf.gaussian_filter)))


def test_each_paragraph_is_written_once():
    """The mode table lives in _docs only: functional.py's source holds it nowhere."""
    src = inspect.getsource(tf.functional)
    assert "d c b a | a b c d | d c b a" not in src
    assert "%(mode)s" in src


@pytest.mark.parametrize("cls", [tf.nn.GradientMagnitude, tf.nn.GaussianFilter, tf.nn.SelectiveBlur])
def test_nn_modules_fill_from_the_same_source(cls):
    doc = inspect.getdoc(cls)
    assert "%(" not in doc
    assert _args_section(doc) == [p for p in inspect.signature(cls).parameters]
    assert "d c b a | a b c d | d c b a" in doc
    assert "(..., H, W)" in doc
    assert "forward" in doc
    fwd = inspect.getdoc(cls.forward)
    assert _args_section(fwd) == [p for p in inspect.signature(cls.forward).parameters if p != "self"]
    assert "float16, bfloat16" in " ".join(fwd.split()) and "Returns:" in fwd and "``out``" not in fwd.split("Returns:")[1]


def test_nn_forward_docs_say_what_each_module_returns_and_takes():
    """The forward of every module shares one template; Gradient's and Canny's say their own
    shape, dtype, input rules and mask (found by a review: Canny's said float, axes and a blur mask)."""
    grad = " ".join(inspect.getdoc(tf.nn.Gradient.forward).split("Returns:")[1].split())
    assert grad.startswith("A ``(..., 2, H, W)`` tensor")
    canny = inspect.getdoc(tf.nn.Canny.forward)
    ret = " ".join(canny.split("Returns:")[1].split())
    assert ret.startswith("A bool tensor") and "dtype" not in ret
    args = " ".join(canny.split("Returns:")[0].split())
    assert "img_as_float" in args and "int64 and uint64 ``ValueError``" in args and "axes" not in args
    assert "non-zero" in args and "to blur" not in args
    assert "in the input's own range" in " ".join(inspect.getdoc(tf.nn.Canny).split())
    blur = " ".join(inspect.getdoc(tf.selective_blur).split())
    assert "one dimension per axis of ``axes``" in blur and "2-D and centred" not in blur


def test_fill_indents_like_the_placeholder_and_refuses_unknown_names():
    doc = "Summary.\n\n    Args:\n        %(cval)s\n        x: y.\n\n    %(matches)s\n"
    out = _docs.fill(doc, scipy="scipy.ndimage.f(x)")
    lines = out.split("\n")
    i = lines.index("        " + _docs.DOCS["cval"].split("\n")[0])
    assert lines[i + 1].startswith("            ") and not lines[i + 1].startswith("             ")
    assert ("    SciPy: on each slice ``x`` of ``input`` along the chosen axes (``(H, W)``\n"
            "    by default), the same as\n    scipy.ndimage.f(x)\n") in out
    assert "%(" not in out
    with pytest.raises(KeyError, match="nope"):
        _docs.fill("%(nope)s")
    assert _docs.fill(None) is None


def test_docs_module_examples_run():
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner()
    for t in finder.find(_docs, "torchfilters._docs"):
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


# ------------------------------------------------------------------ dead code


def test_kernels_exports_exist_and_dead_code_is_gone():
    for name in kernels.__all__:
        assert hasattr(kernels, name), name
    assert not hasattr(kernels, "BINOMIAL_3x3")
    assert not hasattr(kernels, "is_finite_positive")
    assert list(inspect.signature(kernels.derivative_weights).parameters) == ["operator"]
    assert kernels.derivative_weights("sobel") == ((-1.0, 0.0, 1.0), (1.0, 2.0, 1.0))


# ------------------------------------------------------------- layouts: input


def _layouts():
    a = torch.rand(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        out = _sparse(a)
    try:
        out["mkldnn"] = a.to_mkldnn()
    except (RuntimeError, AttributeError):  # a torch built without mkldnn
        pass
    return out


def _sparse(a):
    return {
        "sparse_coo": a.to_sparse(),
        "sparse_csr": a.to_sparse_csr(),
        "sparse_csc": a.to_sparse_csc(),
        "sparse_bsr": a.to_sparse_bsr((2, 2)),
        "sparse_coo_4d": torch.rand(2, 1, 4, 6).to_sparse(),
    }


LAYOUTS = _layouts()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", NAMES)
def test_non_strided_input_is_a_type_error(name, layout):
    with raises(TypeError, "input", "to_dense()", "dense"):
        PUBLIC[name](LAYOUTS[layout])


@pytest.mark.parametrize("backend", ["reference", "cpu", "auto"])
@pytest.mark.parametrize("name", ["gradient_magnitude", "gaussian_filter", "selective_blur", "correlate"])
def test_sparse_input_is_refused_before_any_engine(name, backend):
    with raises(TypeError, "input", "sparse", "to_dense()"):
        PUBLIC[name](torch.rand(4, 4).to_sparse(), backend=backend)


def test_sparse_input_requiring_grad_is_refused_too():
    x = torch.rand(4, 4).to_sparse().requires_grad_(True)
    with raises(TypeError, "input", "sparse"):
        tf.gradient_magnitude(x)


@pytest.mark.filterwarnings("ignore::UserWarning")  # "nested tensors are in prototype stage"
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=str)
def test_nested_input_is_a_type_error(layout):
    kw = {} if layout == torch.strided else {"layout": torch.jagged}
    x = torch.nested.nested_tensor([torch.rand(3, 4, 5), torch.rand(3, 2, 5)], **kw)
    for name in ("sobel", "gaussian_filter", "selective_blur"):
        with raises(TypeError, "input", "nested", "unbind"):
            PUBLIC[name](x)


def test_meta_input_still_propagates_shapes():
    """A meta input is a shape-only call (the reference engine runs it), not an error."""
    y = tf.gradient(torch.empty(2, 3, 5, 6, device="meta"))
    assert y.is_meta and y.shape == (2, 3, 2, 5, 6)
    # the magnitudes too (found by review: their rescaling check read the meta values)
    for y in (tf.gradient_magnitude(torch.empty(4, 5, device="meta")),
              tf.gaussian_gradient_magnitude(torch.empty(2, 3, 4, 5, device="meta"), 1.0, axes=(1, 2, 3))):
        assert y.is_meta and y.shape == ((4, 5) if y.dim() == 2 else (2, 3, 4, 5))
    x = torch.empty(3, 4, 5, device="meta", requires_grad=True)
    (g,) = torch.autograd.grad(tf.gradient_magnitude(x).sum(), x)
    assert g.is_meta and g.shape == x.shape


# --------------------------------------------------- layouts: other tensors


@pytest.mark.parametrize("fn", [tf.correlate, tf.convolve, tf.selective_blur], ids=lambda f: f.__name__)
def test_sparse_weights_2d(fn):
    call = (lambda w: fn(X, weights=w)) if fn is tf.selective_blur else (lambda w: fn(X, w))
    with raises(TypeError, "weights", "sparse", "to_dense()"):
        call(torch.ones(3, 3).to_sparse())


@pytest.mark.parametrize("fn", [tf.correlate1d, tf.convolve1d], ids=lambda f: f.__name__)
def test_sparse_weights_1d(fn):
    with raises(TypeError, "weights", "sparse"):
        fn(X, torch.ones(3).to_sparse())


def test_sparse_mask():
    with raises(TypeError, "mask", "sparse", "to_dense()"):
        tf.selective_blur(X, mask=torch.ones(5, 6, dtype=torch.bool).to_sparse())


@pytest.mark.parametrize("name", NAMES)
def test_sparse_out(name):
    ref = PUBLIC[name](X)
    with raises(TypeError, "out", "sparse", "dense"):
        PUBLIC[name](X, out=torch.zeros(ref.shape).to_sparse())


# ------------------------------------------------------------- meta tensors


@pytest.mark.parametrize("fn", [tf.correlate, tf.convolve], ids=lambda f: f.__name__)
def test_meta_weights_2d(fn):
    with raises(ValueError, "weights", "meta", "values"):
        fn(X, torch.ones(3, 3, device="meta"))


@pytest.mark.parametrize("fn", [tf.correlate1d, tf.convolve1d], ids=lambda f: f.__name__)
def test_meta_weights_1d(fn):
    with raises(ValueError, "weights", "meta", "values"):
        fn(X, torch.ones(3, device="meta"))


def test_meta_weights_selective_blur_and_nn():
    with raises(ValueError, "weights", "meta"):
        tf.selective_blur(X, weights=torch.ones(3, 3, device="meta"))
    with raises(ValueError, "weights", "meta"):
        tf.nn.SelectiveBlur(weights=torch.ones(3, 3, device="meta"))


META_SCALAR = torch.tensor(1.0, device="meta")
META_PAIR = torch.ones(2, dtype=torch.long, device="meta")
META_ARGS = {  # case -> (call, meta value)
    "sigma": (lambda v: tf.gaussian_filter(X, v), META_SCALAR),
    "sigma-pair": (lambda v: tf.gaussian_filter(X, v), META_PAIR.double()),
    "sigma-blur": (lambda v: tf.selective_blur(X, sigma=v), META_SCALAR),
    "sigma-ggm": (lambda v: tf.gaussian_gradient_magnitude(X, v), META_SCALAR),
    "cval": (lambda v: tf.sobel(X, mode="constant", cval=v), META_SCALAR),
    "cval-correlate": (lambda v: tf.correlate(X, [[1.0]], mode="constant", cval=v), META_SCALAR),
    "threshold": (lambda v: tf.selective_blur(X, v), META_SCALAR),
    "truncate": (lambda v: tf.gaussian_filter(X, 1.0, truncate=v), META_SCALAR),
    "origin": (lambda v: tf.correlate(X, [[1.0, 2.0, 3.0]], origin=v), META_PAIR),
    "order": (lambda v: tf.gaussian_filter(X, 1.0, order=v), META_PAIR),
    "radius": (lambda v: tf.gaussian_filter(X, 1.0, radius=v), META_PAIR),
}


@pytest.mark.parametrize("case", sorted(META_ARGS))
def test_meta_tensor_where_a_number_is_needed(case):
    call, value = META_ARGS[case]
    with raises(ValueError, case.split("-")[0], "meta", "values"):
        call(value)


def test_meta_mask_with_a_real_input():
    with raises(ValueError, "mask", "meta"):
        tf.selective_blur(X, mask=torch.ones(5, 6, dtype=torch.bool, device="meta"))


def test_tensor_values_still_work():
    """The checks refuse meta/sparse only: tensors with values keep working."""
    ref = tf.gaussian_filter(X, (1.0, 2.0), mode="constant", cval=0.5)
    got = tf.gaussian_filter(X, torch.tensor([1.0, 2.0]), mode="constant", cval=torch.tensor(0.5))
    assert torch.equal(got, ref)
    assert torch.equal(tf.correlate(X, torch.tensor([[1.0, 2.0]])), tf.correlate(X, [[1.0, 2.0]]))
    assert torch.equal(tf.selective_blur(X, torch.tensor(0.5)), tf.selective_blur(X, 0.5))


# -------------------------------------------------------------- NumPy scalars


@pytest.mark.parametrize("name", ["derivative", "gradient", "gradient_magnitude"])
def test_numpy_bool_flags(name):
    for v in (True, False):
        assert torch.equal(PUBLIC[name](X, normalized=np.bool_(v)), PUBLIC[name](X, normalized=v))


@pytest.mark.parametrize("flag", ["normalized", "keep_border"])
def test_numpy_bool_blur_flags(flag):
    got = tf.selective_blur(X, 0.3, **{flag: np.bool_(True)})
    assert torch.equal(got, tf.selective_blur(X, 0.3, **{flag: True}))
    m = tf.nn.SelectiveBlur(0.3, **{flag: np.bool_(True)})
    assert torch.equal(m(X), got)


def test_numpy_bool_normalized_in_nn_module():
    m = tf.nn.GradientMagnitude(operator="sobel", normalized=np.bool_(True))
    assert torch.equal(m(X), tf.gradient_magnitude(X, operator="sobel", normalized=True))


@pytest.mark.parametrize("bad", [np.int64(1), 1, np.float64(1.0), "True"], ids=repr)
def test_numbers_are_not_flags(bad):
    with raises(TypeError, "normalized", "bool"):
        tf.derivative(X, normalized=bad)
    with raises(TypeError, "keep_border", "bool"):
        tf.selective_blur(X, keep_border=bad)


@pytest.mark.parametrize("t", [np.int8, np.int16, np.int32, np.int64, np.uint8], ids=lambda t: t.__name__)
def test_numpy_integers_for_int_arguments(t):
    if np.issubdtype(t, np.signedinteger):
        assert torch.equal(tf.derivative(X, t(-2)), tf.derivative(X, -2))
        assert torch.equal(tf.sobel(X, axis=t(-2)), tf.sobel(X, axis=-2))
        assert torch.equal(tf.correlate1d(X, [1.0, 2.0, 3.0], t(-2)), tf.correlate1d(X, [1.0, 2.0, 3.0], -2))
    assert torch.equal(tf.gaussian_filter(X, 1.0, order=t(1)), tf.gaussian_filter(X, 1.0, order=1))
    assert torch.equal(tf.gaussian_filter(X, 1.0, order=(t(1), t(0))), tf.gaussian_filter(X, 1.0, order=(1, 0)))
    assert torch.equal(tf.gaussian_filter(X, 1.0, radius=t(2)), tf.gaussian_filter(X, 1.0, radius=2))
    assert torch.equal(tf.correlate1d(X, [1.0, 2.0, 3.0], origin=t(1)), tf.correlate1d(X, [1.0, 2.0, 3.0], origin=1))
    w = [[1.0, 2.0, 3.0]] * 3
    assert torch.equal(tf.correlate(X, w, origin=(t(1), t(0))), tf.correlate(X, w, origin=(1, 0)))
    assert torch.equal(tf.convolve(X, w, origin=t(1)), tf.convolve(X, w, origin=1))


@pytest.mark.parametrize("t", [np.float16, np.float32, np.float64], ids=lambda t: t.__name__)
def test_numpy_floats_for_real_arguments(t):
    x = X.double()
    s = float(t(1.5))  # the value the NumPy scalar holds
    assert torch.equal(tf.gaussian_filter(x, t(1.5)), tf.gaussian_filter(x, s))
    assert torch.equal(tf.gaussian_filter(x, (t(1.5), t(0.5))), tf.gaussian_filter(x, (s, float(t(0.5)))))
    assert torch.equal(tf.gaussian_filter(x, 1.0, truncate=t(3.0)), tf.gaussian_filter(x, 1.0, truncate=3.0))
    assert torch.equal(tf.sobel(x, mode="constant", cval=t(0.5)), tf.sobel(x, mode="constant", cval=0.5))
    assert torch.equal(tf.selective_blur(x, t(0.5)), tf.selective_blur(x, 0.5))
    assert torch.equal(tf.selective_blur(x, sigma=t(1.5)), tf.selective_blur(x, sigma=s))
    assert torch.equal(tf.correlate(x, [[t(1.0), t(2.0)]]), tf.correlate(x, [[1.0, 2.0]]))


def test_numpy_array_sigma_like_a_tensor():
    assert torch.equal(tf.gaussian_filter(X, np.array([1.0, 2.0])), tf.gaussian_filter(X, (1.0, 2.0)))
    assert torch.equal(tf.gaussian_filter(X, np.array(1.5)), tf.gaussian_filter(X, 1.5))
    with raises(ValueError, "sigma", "one per axis"):
        tf.gaussian_filter(X, np.array([1.0, 2.0, 3.0]))


REAL_ARGS = {
    "sigma": lambda v: tf.gaussian_filter(X, v),
    "sigma-pair": lambda v: tf.gaussian_filter(X, (1.0, v)),
    "cval": lambda v: tf.sobel(X, mode="constant", cval=v),
    "threshold": lambda v: tf.selective_blur(X, v),
    "truncate": lambda v: tf.gaussian_filter(X, 1.0, truncate=v),
}


@pytest.mark.parametrize("bad", [True, np.bool_(True), torch.tensor(True)], ids=["bool", "np.bool_", "bool-tensor"])
@pytest.mark.parametrize("case", sorted(REAL_ARGS))
def test_bools_are_not_real_numbers(case, bad):
    with raises(TypeError, case.split("-")[0], "real number"):
        REAL_ARGS[case](bad)


INT_ARGS = {
    "axis": lambda v: tf.derivative(X, v),
    "axis-sobel": lambda v: tf.sobel(X, axis=v),
    "order": lambda v: tf.gaussian_filter(X, 1.0, order=v),
    "radius": lambda v: tf.gaussian_filter(X, 1.0, radius=v),
    "origin": lambda v: tf.correlate1d(X, [1.0, 2.0, 3.0], origin=v),
    "origin-2d": lambda v: tf.correlate(X, [[1.0, 2.0, 3.0]], origin=(0, v)),
}


@pytest.mark.parametrize(
    "bad", [True, np.bool_(True), -1.0, np.float64(-1.0), np.float32(0.0)], ids=["bool", "np.bool_", "float", "np.float64", "np.float32"]
)
@pytest.mark.parametrize("case", sorted(INT_ARGS))
def test_floats_and_bools_are_not_ints(case, bad):
    with raises(TypeError, case.split("-")[0]):
        INT_ARGS[case](bad)


def test_type_names_in_messages_say_numpy():
    """NumPy 2 names its bool ``bool``: the message says ``numpy.bool``, not a puzzling 'got bool'."""
    with raises(TypeError, "sigma", "numpy.bool"):
        tf.gaussian_filter(X, np.bool_(True))
    with raises(TypeError, "normalized", "numpy.int64"):
        tf.derivative(X, normalized=np.int64(1))
