"""``torchfilters.dask``: equal to ``torchfilters.ndimage`` on the whole array, on any chunking,
on a real ``dask.distributed.LocalCluster`` (two worker processes), and out of core."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import torchfilters.dask as tfd  # noqa: E402
import torchfilters.ndimage as tfn  # noqa: E402
from conftest import examples  # noqa: E402

RNG = np.random.default_rng(0)
W = RNG.random((3, 4))
W7 = RNG.standard_normal((7, 7))

#: (name, call on a module and an array): every case is bit-identical on every chunking (each
#: engine sums a value's terms in one order wherever it lies in the block it computes)
EXACT = {
    "gaussian_filter nearest": lambda m, x: m.gaussian_filter(x, 1.5, mode="nearest"),
    "gaussian_filter constant cval": lambda m, x: m.gaussian_filter(x, (1.0, 2.0), mode="constant", cval=0.7),
    "gaussian_filter1d order 1": lambda m, x: m.gaussian_filter1d(x, 1.1, 0, 1, mode="mirror"),
    "sobel constant": lambda m, x: m.sobel(x, 0, mode="constant", cval=1.0),
    "prewitt": lambda m, x: m.prewitt(x, 1),
    "laplace mirror": lambda m, x: m.laplace(x, mode="mirror"),
    "uniform_filter origin": lambda m, x: m.uniform_filter(x, (4, 3), origin=(1, -1)),
    "uniform_filter float sizes": lambda m, x: m.uniform_filter(x, (3.0, np.float64(5.0))),  # (SciPy's int(size))
    "gaussian_gradient_magnitude": lambda m, x: m.gaussian_gradient_magnitude(x, 1.0),
    "gaussian_laplace wrap": lambda m, x: m.gaussian_laplace(x, 1.0, mode="wrap"),
    "convolve1d": lambda m, x: m.convolve1d(x, [1.0, 2.0, 3.0, 4.0], axis=1, mode="nearest"),
    "uniform_filter1d": lambda m, x: m.uniform_filter1d(x, 5, 1, mode="wrap"),
    # dense kernels (taps summed in SciPy's order, border columns too)
    "correlate wrap": lambda m, x: m.correlate(x, W, origin=(0, 1), mode="wrap"),
    "convolve reflect": lambda m, x: m.convolve(x, W, mode="reflect"),
    "correlate constant 7x7": lambda m, x: m.correlate(x, W7, mode="constant", cval=-0.3),
    # per-axis mode mixes (the volume engine: every row of a symmetric pass in one order)
    "gaussian_filter wrap/reflect": lambda m, x: m.gaussian_filter(x, 1.2, mode=("wrap", "reflect")),
    "uniform_filter nearest/constant": lambda m, x: m.uniform_filter(x, 5, mode=("nearest", "constant"), cval=2.0),
    # selections: exact whatever the chunking
    "median_filter": lambda m, x: m.median_filter(x, 5, mode="mirror"),
    "rank_filter footprint origin": lambda m, x: m.rank_filter(x, 2, footprint=[[1, 0, 1], [0, 1, 1]], origin=(0, 1)),
    "percentile_filter constant": lambda m, x: m.percentile_filter(x, 30, (3, 6), mode="constant", cval=0.5),
    "minimum_filter wrap/nearest": lambda m, x: m.minimum_filter(x, (7, 2), mode=("wrap", "nearest")),
    "maximum_filter1d": lambda m, x: m.maximum_filter1d(x, 6, 0, origin=-2),
}
CHUNKINGS = [(10, 9), (4, 3), (37, 29), (13, (5, 7, 17)), ((1, 36), 29)]
#: volumes (the volume engine's blocks of rows and chunks of planes differ from a chunk's)
EXACT3 = {
    "gaussian_filter reflect": lambda m, x: m.gaussian_filter(x, 1.3),
    "gaussian_filter constant": lambda m, x: m.gaussian_filter(x, (1.0, 0.8, 1.5), mode="constant", cval=0.4),
    "gaussian_filter mix": lambda m, x: m.gaussian_filter(x, 1.1, mode=("wrap", "nearest", "mirror")),
    "gaussian_filter order": lambda m, x: m.gaussian_filter(x, 1.1, order=(0, 1, 0), mode="constant", cval=-1.0),
    "gaussian_gradient_magnitude": lambda m, x: m.gaussian_gradient_magnitude(x, 1.0, mode="nearest"),
    "gaussian_laplace": lambda m, x: m.gaussian_laplace(x, 1.0),
    "sobel constant": lambda m, x: m.sobel(x, 1, mode="constant", cval=0.5),
    "uniform_filter wrap": lambda m, x: m.uniform_filter(x, 5, mode="wrap"),
    "laplace mirror": lambda m, x: m.laplace(x, mode="mirror"),
}
CHUNKINGS3 = [(8, 7, 9), (23, 20, 18), ((5, 18), 10, (3, 15)), (12, 20, 6)]


@pytest.mark.parametrize("chunks", CHUNKINGS, ids=str)
def test_equal_to_the_whole_array_on_any_chunking(chunks):
    a = RNG.random((37, 29))
    x = da.from_array(a, chunks=chunks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tfd.ChunksTooSmallWarning)
        for name, f in EXACT.items():
            y = f(tfd, x)
            assert isinstance(y, da.Array)
            assert np.array_equal(y.compute(), f(tfn, a)), name


@pytest.mark.parametrize("chunks", CHUNKINGS3, ids=str)
def test_volumes_equal_to_the_whole_array_on_any_chunking(chunks):
    a = RNG.random((23, 20, 18))
    x = da.from_array(a, chunks=chunks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tfd.ChunksTooSmallWarning)
        for name, f in EXACT3.items():
            assert np.array_equal(f(tfd, x).compute(), f(tfn, a)), name


def _chunks(draw, n):
    """An uneven chunking of an axis of length ``n``: cuts at random places (chunks of 1 too)."""
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(6, n - 1))))
    return tuple(b - a for a, b in zip([0] + cuts, cuts + [n]))


@st.composite
def _case(draw, cases, shape):
    name = draw(st.sampled_from(sorted(cases)))
    return name, tuple(_chunks(draw, n) for n in shape)


@examples(12)
@given(case=_case(EXACT, (37, 29)))
def test_sampled_uneven_chunkings_are_exact(case):
    """Random cuts, chunks thinner than the reach among them (merged first)."""
    name, chunks = case
    a = np.random.default_rng(len(name)).random((37, 29))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tfd.ChunksTooSmallWarning)
        y = EXACT[name](tfd, da.from_array(a, chunks=chunks)).compute()
    assert np.array_equal(y, EXACT[name](tfn, a)), (name, chunks)


@examples(6)
@given(case=_case(EXACT3, (23, 20, 18)))
def test_sampled_uneven_volume_chunkings_are_exact(case):
    name, chunks = case
    a = np.random.default_rng(len(name)).random((23, 20, 18))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tfd.ChunksTooSmallWarning)
        y = EXACT3[name](tfd, da.from_array(a, chunks=chunks)).compute()
    assert np.array_equal(y, EXACT3[name](tfn, a)), (name, chunks)


@pytest.mark.parametrize("name", ["gaussian_laplace", "gaussian_gradient_magnitude"])
def test_mixed_wrap_modes_of_the_one_mode_per_derivative_filters(name):
    """Found by review: these run each derivative with one mode on every axis (SciPy's rule), so
    a mix of wrap and other modes needs a periodic and a plain overlap along every axis: the
    filtered axes are computed whole, with a warning (before: wrong values, up to 0.42)."""
    a = np.random.default_rng(7).standard_normal((3, 16, 17))
    for mode, axes in ((("wrap", "reflect"), (1, 2)), (("reflect", "wrap", "nearest"), None)):
        with pytest.warns(UserWarning, match="mixes wrap"):
            y = getattr(tfd, name)(da.from_array(a, chunks=(1, 8, 6)), 1.0, mode=mode, axes=axes)
        assert np.array_equal(y.compute(), getattr(tfn, name)(a, 1.0, mode=mode, axes=axes)), mode


@pytest.mark.parametrize("name", ["gaussian_laplace", "gaussian_gradient_magnitude"])
def test_per_axis_sigma_and_radius_of_the_derivative_filters_follow_scipys_reading(name):
    """SciPy reads these filters' sigma in axis order where ``axes`` names every axis, and their
    radius always in axis order: the overlap follows (found by review: ``axes=(1, 0)`` with two
    sigmas was 0.69 off)."""
    a = np.random.default_rng(8).standard_normal((16, 16))
    for kw in (dict(sigma=(2.0, 0.5), axes=(1, 0)), dict(sigma=1.0, radius=(6, 1), axes=(1, 0)),
               dict(sigma=(0.5, 2.0), axes=(0, 1))):
        y = getattr(tfd, name)(da.from_array(a, chunks=8), **kw).compute()
        assert np.array_equal(y, getattr(tfn, name)(a, **kw)), kw


def test_thin_chunks_are_merged_with_a_warning():
    a = RNG.random((40, 40))
    x = da.from_array(a, chunks=(3, 40))
    with pytest.warns(tfd.ChunksTooSmallWarning, match="reach"):
        y = tfd.gaussian_filter(x, 2.0)  # radius 8 > 3
    assert np.array_equal(y.compute(), tfn.gaussian_filter(a, 2.0))


def test_volume_and_integer_dtype():
    v = (RNG.random((20, 18, 16)) * 200).astype(np.uint8)
    x = da.from_array(v, chunks=(7, 9, 8))
    y = tfd.gaussian_filter(x, 1.0)
    assert y.dtype == np.uint8
    assert np.array_equal(y.compute(), tfn.gaussian_filter(v, 1.0))


@pytest.mark.parametrize("dt", [">f8", ">i2"])
def test_big_endian_input_declares_the_native_dtype_it_computes(dt):
    a = (RNG.random((12, 10)) * 100).astype(dt)
    for f in (lambda m, x: m.gaussian_filter(x, 1.0), lambda m, x: m.median_filter(x, 3),
              lambda m, x: m.sobel(x, 0)):
        y = f(tfd, da.from_array(a, chunks=(6, 5)))
        want = f(tfn, a)
        assert want.dtype.isnative and y.dtype == want.dtype
        got = y.compute()
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_local_cluster_with_two_worker_processes(tmp_path):
    a = RNG.random((256, 200)).astype(np.float32)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  local_directory=str(tmp_path)) as cluster, distributed.Client(cluster) as client:
        x = da.from_array(a, chunks=(64, 50))
        y = tfd.gaussian_filter(x, 2.0)
        got = client.compute(y).result()
        assert len(client.scheduler_info()["workers"]) == 2
    assert np.array_equal(got, tfn.gaussian_filter(a, 2.0))


def test_out_of_core_zarr(tmp_path):
    """1 GiB on disk through one worker process of 700 MiB (~400 MiB of it torch and the kernels
    loaded): filtered and written back chunk by chunk, the worker never killed.  (Two workers
    share a job in ``test_local_cluster_with_two_worker_processes``.)"""
    zarr = pytest.importorskip("zarr")
    shape, chunks = (8192, 32768), (1024, 2048)  # float32: 1 GiB, 8 MiB chunks
    src = zarr.create_array(str(tmp_path / "in.zarr"), shape=shape, chunks=chunks, dtype="f4", compressors=None)
    row = np.random.default_rng(1).random((chunks[0], shape[1]), dtype=np.float32)
    for i in range(0, shape[0], chunks[0]):
        src[i:i + chunks[0]] = np.roll(row, i, axis=1)
    tfn.uniform_filter(np.zeros((64, 64), np.float32), 5)  # the kernels on disk: workers load, not compile
    # a worker that outgrows its limit is killed (the test fails), never paused (a hang)
    import dask

    with dask.config.set({"distributed.worker.memory.pause": False}), \
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                     memory_limit="700MiB", local_directory=str(tmp_path)) as cluster, \
            distributed.Client(cluster) as client:
        workers = set(client.scheduler_info()["workers"])
        x = da.from_zarr(str(tmp_path / "in.zarr"))
        y = tfd.uniform_filter(x, 5)
        da.to_zarr(y, str(tmp_path / "out.zarr"), overwrite=True, compute=True)
        assert set(client.scheduler_info()["workers"]) == workers  # never killed (a restart has a new address)
    out = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    sl = (slice(1000, 1600), slice(2000, 2600))  # across chunk seams on both axes
    ref = tfn.uniform_filter(np.asarray(src[990:1610, 1990:2610]), 5)[10:-10, 10:-10]
    assert np.array_equal(np.asarray(out[sl]), ref)
    edge = tfn.uniform_filter(np.asarray(src[-40:, -40:]), 5)[-20:, -20:]  # the array's corner: mode applied
    assert np.array_equal(np.asarray(out[-20:, -20:]), edge)


@pytest.mark.parametrize("mode", ["mirror", "reflect", "nearest", "wrap", "constant"])
def test_one_sided_reach_and_reach_beyond_the_axis(mode):
    """Found by review: an edge chunk's boundary fold reads the far side's reach (mirror), and
    a reach longer than the whole axis is dask's error unless that axis is one chunk."""
    x = np.arange(8.0) ** 2
    for chunks in (1, 2, 3, 5):
        for w, o in (([1.0, 2.0], -1), ([1.0, 2.0], 0), ([1.0, 2.0, 3.0], 1)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", tfd.ChunksTooSmallWarning)
                y = tfd.correlate1d(da.from_array(x, chunks=chunks), w, mode=mode, origin=o).compute()
            assert np.array_equal(y, tfn.correlate1d(x, w, mode=mode, origin=o)), (chunks, w, o)
    y = tfd.gaussian_filter(da.from_array(np.arange(5.0), chunks=2), 3.0, mode=mode).compute()
    assert np.array_equal(y, tfn.gaussian_filter(np.arange(5.0), 3.0, mode=mode))
