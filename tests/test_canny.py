"""torchfilters.canny against skimage.feature.canny (0.26), per (H, W) slice.

The oracle is scikit-image itself.  Every engine gives identical edge maps: float64 (and integer)
images follow SciPy's and skimage's arithmetic to the bit, and float32 images too (the Gaussian
of a float32 image is computed as SciPy does, each 1-D pass in float64 rounded to float32; the
Sobel and the NMS with SciPy's and C's promotions), so no test needs a tolerance.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest
import torch

import torchfilters as tf
from torchfilters.backends import reference_canny

skimage = pytest.importorskip("skimage")
from skimage import data as skdata
from skimage.feature import canny as sk_canny

ENGINES = ("reference", "cpu")
SETTINGS = {
    "default": {},
    "sigma2": {"sigma": 2.0},
    "thresholds": {"sigma": 1.5, "low_threshold": 0.05, "high_threshold": 0.3},
    "quantiles": {"sigma": 1.0, "low_threshold": 0.1, "high_threshold": 0.7, "use_quantiles": True},
    "reflect": {"sigma": 3.0, "mode": "reflect"},
}


@pytest.fixture(scope="module")
def images():
    return {name: getattr(skdata, name)() for name in ("camera", "coins", "checkerboard", "text")}


def _check(ours, ref):
    ours = ours.numpy() if isinstance(ours, torch.Tensor) else ours
    assert ours.shape == ref.shape and ours.dtype == np.bool_
    diff = int((ours != ref).sum())
    assert diff == 0, f"{diff} pixels differ of {ref.size} ({ref.sum()} edges)"


#: the reference's iterated dilation is slow on 512x512: two settings suffice for it
_SAMPLE_CASES = [(e, st) for e in ENGINES for st in SETTINGS if e != "reference" or st in ("default", "quantiles")]


@pytest.mark.parametrize("engine, setting", _SAMPLE_CASES)
@pytest.mark.parametrize("name", ["camera", "coins", "checkerboard", "text"])
def test_sample_images_float64(images, name, setting, engine):
    im = images[name].astype(np.float64) / 255.0
    kw = SETTINGS[setting]
    _check(tf.canny(torch.from_numpy(im), backend=engine, **kw), sk_canny(im, **kw))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["camera", "coins"])
def test_sample_images_uint8_float32(images, name, engine):
    im = images[name]
    kw = {"sigma": 1.2, "low_threshold": 20, "high_threshold": 50}  # uint8 units
    _check(tf.canny(torch.from_numpy(im), backend=engine, **kw), sk_canny(im, **kw))
    f = im.astype(np.float32) / 255
    _check(tf.canny(torch.from_numpy(f), backend=engine, sigma=2.0), sk_canny(f, sigma=2.0))
    _check(tf.canny(torch.from_numpy(f), backend=engine, **SETTINGS["quantiles"]), sk_canny(f, **SETTINGS["quantiles"]))


@pytest.mark.parametrize("engine", ENGINES)
def test_mask(images, engine):
    im = images["coins"].astype(np.float64) / 255
    yy, xx = np.mgrid[: im.shape[0], : im.shape[1]]
    mask = (yy - 150) ** 2 + (xx - 190) ** 2 < 120**2
    for kw in ({}, {"mode": "nearest", "sigma": 2.0}, {"use_quantiles": True, "low_threshold": 0.5,
                                                          "high_threshold": 0.9}):
        ref = sk_canny(im, mask=mask, **kw)
        _check(tf.canny(torch.from_numpy(im), mask=torch.from_numpy(mask), backend=engine, **kw), ref)


def _synthetic():
    n = 64
    yy, xx = np.mgrid[:n, :n].astype(np.float64)
    step = (xx >= 30).astype(np.float64)
    ramp = np.clip((xx - 20) / 20, 0, 1)
    circle = ((yy - 31.5) ** 2 + (xx - 30.2) ** 2 < 18**2).astype(np.float64)
    square = np.zeros((n, n))
    square[16:-16, 16:-16] = 1
    square += 0.2 * np.random.default_rng(0).random(square.shape)
    return {"step": step, "ramp": ramp, "circle": circle, "noisy_square": square}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["step", "ramp", "circle", "noisy_square"])
def test_synthetic(name, engine):
    im = _synthetic()[name]
    for kw in ({}, {"sigma": 3.0}, {"sigma": 0.7, "low_threshold": 0.02, "high_threshold": 0.05},
               {"mode": "wrap", "sigma": 1.5}, {"mode": "constant", "cval": 0.5}):
        ref = sk_canny(im, **kw)
        if name in ("step", "circle", "noisy_square") and kw == {}:
            assert ref.sum() > 0  # a test that sees edges
        _check(tf.canny(torch.from_numpy(im), backend=engine, **kw), ref)
        f = im.astype(np.float32)
        _check(tf.canny(torch.from_numpy(f), backend=engine, **kw), sk_canny(f, **kw))


@pytest.mark.parametrize("engine", ENGINES)
def test_quantiles_of_a_slice_holding_nan(engine):
    """``numpy.percentile`` of a magnitude holding NaN is NaN, so scikit-image finds no edge in
    that slice (found by review: the selection skipped NaN and found 76); the other slices of
    the batch keep theirs."""
    x = np.zeros((3, 40, 40))
    x[:, :, 20:] = 1.0
    x[0, 5, 5] = np.nan
    x[1, 5, 5] = np.inf
    for dt in (np.float64, np.float32):
        ours = tf.canny(torch.from_numpy(x.astype(dt)), 1.0, 0.5, 0.9, use_quantiles=True, backend=engine).numpy()
        for k in range(3):
            want = sk_canny(x[k].astype(dt), 1.0, 0.5, 0.9, use_quantiles=True)
            assert (want.sum() > 0) == (k == 2)
            _check(ours[k], want)


@pytest.mark.parametrize("engine", ENGINES)
def test_batched_per_slice(engine):
    g = np.random.default_rng(1)
    x = g.random((2, 3, 40, 37))
    x[..., 10:30, 8:25] += 1.0
    for kw in ({"sigma": 1.0}, {"use_quantiles": True, "low_threshold": 0.6, "high_threshold": 0.8}):
        ours = tf.canny(torch.from_numpy(x), backend=engine, **kw).numpy()
        assert ours.shape == x.shape
        for b in range(2):
            for c in range(3):
                _check(ours[b, c], sk_canny(x[b, c], **kw))
    # a mask broadcast over the batch
    m = np.zeros((40, 37), bool)
    m[5:35, 3:30] = True
    ours = tf.canny(torch.from_numpy(x), mask=torch.from_numpy(m), backend=engine).numpy()
    for b in range(2):
        for c in range(3):
            _check(ours[b, c], sk_canny(x[b, c], mask=m))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(dtype, engine):
    x = torch.from_numpy(_synthetic()["noisy_square"]).to(dtype)
    ours = tf.canny(x, backend=engine)
    assert ours.dtype == torch.bool and ours.shape == x.shape
    # skimage computes float16 in float32; bfloat16 values are float32 values
    _check(ours, sk_canny(x.float().numpy()))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint16, torch.int32])
def test_integer_dtypes(dtype):
    g = torch.Generator().manual_seed(3)
    hi = min(torch.iinfo(dtype).max, 30000)
    x = torch.randint(0, hi, (33, 29), generator=g).to(dtype)
    x[8:20, 5:20] = hi // 2
    npx = x.numpy()
    _check(tf.canny(x), sk_canny(npx))
    kw = {"low_threshold": hi * 0.05, "high_threshold": hi * 0.1, "sigma": 2.0}
    _check(tf.canny(x, **kw), sk_canny(npx, **kw))


@pytest.mark.parametrize("engine", ENGINES)
def test_empty_and_tiny(engine):
    for shape in ((0, 5, 5), (3, 0, 4), (2, 4, 0)):
        e = tf.canny(torch.zeros(shape), backend=engine)
        assert e.shape == shape and e.dtype == torch.bool
    for shape in ((1, 1), (2, 5), (3, 3), (5, 2), (4, 4)):
        x = np.random.default_rng(4).random(shape)
        _check(tf.canny(torch.from_numpy(x), backend=engine, sigma=0.5, low_threshold=0.0, high_threshold=0.01),
               sk_canny(x, sigma=0.5, low_threshold=0.0, high_threshold=0.01))


@pytest.mark.parametrize("engine", ENGINES)
def test_layouts(engine):
    x = torch.from_numpy(np.random.default_rng(5).random((2, 3, 24, 31)))
    want = tf.canny(x, backend=engine, sigma=0.8)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert torch.equal(tf.canny(cl, backend=engine, sigma=0.8), want)
    big = torch.from_numpy(np.random.default_rng(5).random((2, 3, 48, 62)))
    big[:, :, ::2, ::2] = x
    assert torch.equal(tf.canny(big[:, :, ::2, ::2], backend=engine, sigma=0.8), want)
    t = x.transpose(-1, -2)
    assert torch.equal(tf.canny(t, backend=engine, sigma=0.8),
                       tf.canny(t.contiguous(), backend=engine, sigma=0.8))



@pytest.mark.parametrize("engine", ENGINES)
def test_out(engine):
    x = torch.from_numpy(np.random.default_rng(8).random((2, 3, 24, 31)))
    want = tf.canny(x, backend=engine, sigma=0.8)
    assert want.any() and not want.all()
    out = torch.ones(2, 3, 31, 24, dtype=torch.bool).transpose(-1, -2)  # any strides
    assert tf.canny(x, backend=engine, sigma=0.8, out=out) is out
    assert torch.equal(out, want)
    # out may be the mask it reads (the edges are found first)
    mask = torch.rand(2, 3, 24, 31, generator=torch.Generator().manual_seed(1)) > 0.2
    want = tf.canny(x, backend=engine, sigma=0.8, mask=mask.clone())
    assert tf.canny(x, backend=engine, sigma=0.8, mask=mask, out=mask) is mask
    assert torch.equal(mask, want)
    empty = torch.ones(0, 5, 5, dtype=torch.bool)
    assert tf.canny(torch.zeros(0, 5, 5), backend=engine, out=empty) is empty
    with pytest.raises(TypeError, match="out has dtype"):
        tf.canny(x, backend=engine, out=torch.zeros(x.shape))
    with pytest.raises(ValueError, match="out has shape"):
        tf.canny(x, backend=engine, out=torch.zeros(2, 3, 24, 30, dtype=torch.bool))
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        tf.canny(x, backend=engine, out=np.zeros(x.shape, dtype=bool))
    with pytest.raises(ValueError, match="overlapping"):
        tf.canny(x, backend=engine, out=torch.zeros(1, 3, 24, 31, dtype=torch.bool).expand(2, 3, 24, 31))

def test_engines_agree():
    g = np.random.default_rng(6)
    x = torch.from_numpy(g.random((3, 2, 50, 45)))
    for dt in (torch.float64, torch.float32):
        for kw in ({"sigma": 0.6}, {"sigma": 1.3, "low_threshold": 0.0, "high_threshold": 0.05},
                   {"use_quantiles": True, "low_threshold": 0.3, "high_threshold": 0.95},
                   {"low_threshold": -1.0, "high_threshold": 0.1}):
            ref = tf.canny(x.to(dt), backend="reference", **kw)
            assert torch.equal(tf.canny(x.to(dt), backend="cpu", **kw), ref)
    # the op on smoothed images (the engines' common entry): the CPU engine's identity Gaussian
    from torchfilters import _ops_canny

    s = x.reshape(6, 50, 45).contiguous()
    for uq, lo, hi in ((False, 0.1, 0.2), (True, 0.3, 0.9)):
        assert torch.equal(_ops_canny.canny_edges_op(s, None, lo, hi, uq, "cpu"),
                           _ops_canny.canny_edges_op(s, None, lo, hi, uq, "reference"))


def test_one_big_slice_bands():
    """A slice split into row bands across threads gives the same map as one band."""
    x = torch.from_numpy(np.random.default_rng(7).random((1, 300, 97))).float()
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        banded = tf.canny(x, backend="cpu", sigma=1.0)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(banded, tf.canny(x, backend="reference", sigma=1.0))
    # one long weak edge through every band, seeded only in the first: the seams pass it on
    rows = np.arange(300)[:, None]
    y = np.where(np.arange(40)[None] >= 20, 0.3 + 0.7 * np.clip((40 - rows) / 30, 0, 1), 0.0)
    kw = {"sigma": 1.0, "low_threshold": 0.1, "high_threshold": 2.0}  # seeds in rows < 20 only
    assert not sk_canny(y, sigma=1.0, low_threshold=2.0, high_threshold=2.0)[20:].any()
    try:
        torch.set_num_threads(4)
        banded = tf.canny(torch.from_numpy(y)[None], backend="cpu", **kw)[0].numpy()
    finally:
        torch.set_num_threads(old)
    ref = sk_canny(y, **kw)
    assert ref[250:].any()  # reached from the top
    _check(banded, ref)


def test_errors():
    x = torch.rand(8, 8)
    with pytest.raises(TypeError):
        tf.canny(x > 0.5)
    with pytest.raises(TypeError):
        tf.canny(x.to(torch.complex64))
    with pytest.raises(TypeError):
        tf.canny(x.numpy())
    with pytest.raises(ValueError, match="64-bit integer"):
        tf.canny(torch.zeros(8, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="at least 2"):
        tf.canny(torch.rand(8))
    with pytest.raises(ValueError, match="Quantile thresholds"):
        tf.canny(x, low_threshold=1.5, high_threshold=2.0, use_quantiles=True)
    with pytest.raises(ValueError, match="Quantile thresholds"):
        tf.canny(x, low_threshold=0.1, high_threshold=-0.5, use_quantiles=True)
    with pytest.raises(ValueError, match="lower then high"):
        tf.canny(x, low_threshold=0.3, high_threshold=0.2)
    with pytest.raises(TypeError):
        tf.canny(x, use_quantiles=1)
    with pytest.raises(TypeError):
        tf.canny(x, low_threshold="0.1")
    with pytest.raises(ValueError):
        tf.canny(x, sigma=-1.0)
    with pytest.raises(ValueError):
        tf.canny(x, mode="replicate")
    with pytest.raises(ValueError):
        tf.canny(x, backend="gpu")
    with pytest.raises(ValueError, match="broadcast"):
        tf.canny(x, mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError):
        tf.canny(x, mask=np.ones((8, 8), bool))


def test_low_threshold_is_a_c_float():
    """skimage passes the low threshold as a C float: a magnitude between the double and its
    float32 rounding is kept or dropped as in skimage."""
    assert reference_canny.low_value(0.1) == float(np.float32(0.1))
    assert reference_canny.low_value(1e-60) == float(np.float32(1e-14))


def test_magnitude_sqrt_correctly_rounded():
    """torch's CPU sqrt is a vectorised approximation; the magnitude must be NumPy's (IEEE)."""
    g = torch.Generator().manual_seed(9)
    for dt in (torch.float32, torch.float64):
        i, j = torch.randn(2, 3, 64, 64, generator=g, dtype=torch.float64).to(dt).unbind(0)
        m = reference_canny.magnitude(i, j).numpy()
        assert np.array_equal(m, np.sqrt(i.numpy() * i.numpy() + j.numpy() * j.numpy()))


def test_nn_module_and_compile():
    x = torch.from_numpy(_synthetic()["circle"]).float()[None, None]
    m = tf.nn.Canny(sigma=1.5)
    assert torch.equal(m(x), tf.canny(x, sigma=1.5))
    assert "sigma=1.5" in repr(m)
    f = torch.compile(lambda t: tf.canny(t, sigma=1.5), fullgraph=True, backend="eager")
    assert torch.equal(f(x), tf.canny(x, sigma=1.5))


# ---------------------------------------------------------------- Triton, interpreted


@contextlib.contextmanager
def _interpreted_canny():
    """Triton's interpreter for the Triton engine and its Canny module (``triton.canny``)."""
    from conftest import interpreted_triton

    name = "torchfilters.backends.triton.canny"
    old = sys.modules.pop(name, None)
    try:
        with interpreted_triton() as T:
            import torchfilters.backends.triton.canny as TC

            yield T, TC
    finally:
        sys.modules.pop(name, None)
        if old is not None:
            sys.modules[name] = old


@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")  # (the same lanes)
@pytest.mark.triton
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0/0 in unused lanes
def test_triton_interpreted():
    pytest.importorskip("triton")
    g = np.random.default_rng(8)
    x = g.random((2, 24, 31))
    x[:, 6:18, 5:20] += 0.8
    x = torch.from_numpy(x)
    m = torch.ones(24, 31, dtype=torch.bool)
    m[:, :3] = False
    cases = [(torch.float64, {}), (torch.float32, {"sigma": 0.8, "low_threshold": 0.01, "high_threshold": 0.2}),
             (torch.float64, {"use_quantiles": True, "low_threshold": 0.5, "high_threshold": 0.9}),
             (torch.float32, {"mask": m})]
    want = [tf.canny(x.to(dt), backend="cpu", **kw) for dt, kw in cases]
    with _interpreted_canny() as (_, TC):
        TC.LAUNCHES.clear()
        for (dt, kw), w in zip(cases, want):
            got = tf.canny(x.to(dt), backend="triton", **kw)
            assert torch.equal(got, w), (dt, kw)
        assert TC.LAUNCHES["nms"] >= len(cases) and TC.LAUNCHES["hysteresis"] >= len(cases)
        # a long edge crosses tiles: propagation over several launches
        y = torch.zeros(1, 40, 70, dtype=torch.float64)
        y[..., 20:, :] = 1.0
        y[..., 20:, 35:] = 0.3  # a weak stretch, linked to the strong one only along the edge
        kw = {"sigma": 1.0, "low_threshold": 0.05, "high_threshold": 0.5}
        assert torch.equal(tf.canny(y, backend="triton", **kw), tf.canny(y, backend="cpu", **kw))


# ---------------------------------------------------------------- the CPU engine's fused Gaussian


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", ["reflect", "mirror", "nearest", "wrap", "constant", "grid-constant", "grid-wrap"])
def test_modes_and_sigmas(mode, engine):
    """Every boundary mode (``'constant'`` divides by the bleed-over, ``'grid-constant'`` does not,
    as in skimage), per-axis, zero and large sigmas (a radius beyond the image), float64 and
    float32 (each pass rounded as SciPy stores it)."""
    g = np.random.default_rng(10)
    im = g.random((23, 19))
    im[5:17, 4:12] += 1.0
    for kw in ({"sigma": (0.7, 2.5)}, {"sigma": 0.0, "low_threshold": 0.2, "high_threshold": 0.6},
               {"sigma": 6.0, "low_threshold": 0.005, "high_threshold": 0.01}, {"sigma": 1.2, "cval": 0.4}):
        for f in (im, im.astype(np.float32)):
            _check(tf.canny(torch.from_numpy(f), backend=engine, mode=mode, **kw), sk_canny(f, mode=mode, **kw))


@pytest.mark.parametrize("engine", ENGINES)
def test_per_slice_masks(engine):
    """A different mask per slice (its own bleed-over), with and without quantiles."""
    g = np.random.default_rng(11)
    x = g.random((3, 30, 28))
    x[:, 8:22, 6:20] += 1.0
    m = g.random((3, 30, 28)) > 0.2
    m[1, :, :10] = False
    for kw in ({"sigma": 1.0}, {"mode": "reflect", "sigma": 1.5},
               {"use_quantiles": True, "low_threshold": 0.5, "high_threshold": 0.8}):
        for f in (x, x.astype(np.float32)):
            ours = tf.canny(torch.from_numpy(f), mask=torch.from_numpy(m), backend=engine, **kw).numpy()
            for b in range(3):
                _check(ours[b], sk_canny(f[b], mask=m[b], **kw))


def test_radix_select():
    """The CPU engine's order statistics equal a sort's: ties, zeros, inf and NaN (last)."""
    from torchfilters.backends.cpu import canny as cpu_canny

    g = torch.Generator().manual_seed(12)
    for dt in (torch.float32, torch.float64):
        cases = [torch.rand(5, 1000, generator=g, dtype=dt), torch.zeros(3, 77, dtype=dt),
                 (torch.rand(4, 5000, generator=g) * 4).round().to(dt),
                 torch.tensor([[float("nan"), 1.0, float("inf"), 0.0, 2.0, float("nan")]], dtype=dt),
                 torch.rand(2, 70000, generator=g, dtype=dt) * 1e-30]
        for flat in cases:
            n = flat.shape[1]
            idx = torch.tensor(sorted({0, n // 3, n // 2, min(n - 1, n // 2 + 1), n - 1}))
            want = reference_canny.sorted_select(flat, idx)
            got = cpu_canny._select(flat, idx)
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_one_big_slice_bands_quantiles_mask():
    """Row bands across threads with quantiles and a mask: the reference's map."""
    g = np.random.default_rng(13)
    x = torch.from_numpy(g.random((1, 300, 97)))
    m = torch.from_numpy(g.random((300, 97)) > 0.1)
    kw = {"sigma": 1.5, "use_quantiles": True, "low_threshold": 0.6, "high_threshold": 0.9, "mask": m}
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        banded = tf.canny(x, backend="cpu", **kw)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(banded, tf.canny(x, backend="reference", **kw))
