"""Arrays of other array libraries (CuPy's, on a GPU) through ``torchfilters.ndimage`` and
``torchfilters.dask``: in and out through DLPack, never through the host, and the input's
library back.  ``_duck.Duck`` stands in for CuPy (it refuses implicit conversion to NumPy, as
CuPy does); its DLPack device is the CPU, so the engines see CPU tensors here, and a forced
``triton`` backend runs the interpreted Triton engine on them, as a CUDA tensor would."""

from __future__ import annotations

import contextlib
import sys
import warnings

import numpy as np
import pytest
import torch

import torchfilters.ndimage as tfn
from _duck import Duck
from conftest import interpreted_triton
from torchfilters import functional as F

da = pytest.importorskip("dask.array")

from test_dask import EXACT, EXACT3  # noqa: E402

import torchfilters.dask as tfd  # noqa: E402

RNG = np.random.default_rng(3)
A = RNG.random((37, 29)) * 50 - 10
V = RNG.random((9, 8, 10)) * 50 - 10


_BRIDGES = {"torchfilters.ndimage", "torchfilters._arrays", "torchfilters.dask"}


@pytest.fixture
def no_numpy_bridge(monkeypatch):
    """A context in which torch's NumPy bridge raises when the drop-in calls it: a device array
    must not cross the host.  (The CPU engine's own use of it on CPU tensors is its business.)"""
    def refusing(fn):
        def call(*a, **k):
            if sys._getframe(1).f_globals.get("__name__") in _BRIDGES:
                raise AssertionError(f"a device array went through the host ({fn.__name__})")
            return fn(*a, **k)
        return call

    @contextlib.contextmanager
    def block():
        with monkeypatch.context() as m:
            m.setattr(torch, "from_numpy", refusing(torch.from_numpy))
            m.setattr(torch.Tensor, "numpy", refusing(torch.Tensor.numpy))
            yield
    return block


def _same(got, want):
    assert isinstance(got, Duck), type(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.get(), want, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint8, np.bool_, np.complex64], ids=str)
@pytest.mark.parametrize("name", sorted(EXACT))
def test_ndimage_takes_and_returns_device_arrays(name, dtype, no_numpy_bridge):
    f = EXACT[name]
    a = A.astype(dtype)
    try:
        want = f(tfn, a)
    except Exception as e:  # noqa: BLE001 - then the device array raises the same
        with pytest.raises(type(e)):
            f(tfn, Duck(a))
        return
    exported = Duck.exported
    with no_numpy_bridge():
        got = f(tfn, Duck(a))
    _same(got, want)
    assert Duck.exported > exported  # the input crossed by DLPack


@pytest.mark.parametrize("name", sorted(EXACT3))
def test_ndimage_volumes_of_device_arrays(name, no_numpy_bridge):
    f = EXACT3[name]
    for dtype in (np.float32, np.float64):
        a = V.astype(dtype)
        want = f(tfn, a)
        with no_numpy_bridge():
            got = f(tfn, Duck(a))
        _same(got, want)


def test_outputs_weights_footprints_and_views_of_device_arrays(no_numpy_bridge):
    a = A.astype(np.float32)
    w = RNG.random((3, 5))
    want_corr = tfn.correlate(a, w, mode="nearest")
    want_out = tfn.gaussian_filter(a, 1.5, output=np.int32)
    want_view = tfn.sobel(a[::-2, 1::3], 0)
    want_fp = tfn.median_filter(a, footprint=[[1, 0, 1], [1, 1, 0]])
    want_cplx = tfn.correlate1d(a, [1 + 2j, 0.5, -1j], 0)
    with no_numpy_bridge():
        out = Duck(np.full(a.shape, -1.0))
        r = tfn.uniform_filter(Duck(a), 5, out)  # an output array is filled in place
        got_out = tfn.gaussian_filter(Duck(a), 1.5, output=np.int32)
        got_view = tfn.sobel(Duck(a)[::-2, 1::3], 0)  # a reversed view: copied, not refused
        got_cplx = tfn.correlate1d(Duck(a), [1 + 2j, 0.5, -1j], 0)
    # weights and footprints on the device too (small: copied to the host, as SciPy's are read)
    got_corr = tfn.correlate(Duck(a), Duck(w), mode="nearest")
    got_fp = tfn.median_filter(Duck(a), footprint=Duck(np.array([[1, 0, 1], [1, 1, 0]], bool)))
    assert r is out
    _same(out, tfn.uniform_filter(a, 5, np.zeros(a.shape)))
    _same(got_corr, want_corr)
    _same(got_out, want_out)
    _same(got_view, want_view)
    _same(got_fp, want_fp)
    _same(got_cplx, want_cplx)
    with pytest.raises(RuntimeError, match="output shape"):  # SciPy's errors, as for NumPy arrays
        tfn.sobel(Duck(a), output=Duck(np.zeros((2, 2))))


def test_64_bit_integers_beyond_2_53_on_device_arrays():
    a = (np.arange(40, dtype=np.int64) * 3 + 2**60).reshape(5, 8)[:, ::-1].copy()
    _same(tfn.median_filter(Duck(a), 3), tfn.median_filter(a, 3))


@pytest.mark.parametrize("chunks", [(10, 9), ((5, 32), (3, 26))], ids=str)
def test_dask_chunks_of_device_arrays_stay_device_arrays(chunks):
    meta = Duck(np.empty((0, 0)))
    x = da.from_array(Duck(A), chunks=chunks, asarray=False, meta=meta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tfd.ChunksTooSmallWarning)
        for name, f in EXACT.items():
            y = f(tfd, x)
            assert isinstance(y._meta, Duck), name
            got = y.compute(scheduler="threads")
            _same(got, f(tfn, A))


def test_device_arrays_run_on_their_devices_engine(monkeypatch):
    """A CUDA tensor's engine is Triton: forced here (the interpreter on CPU tensors), a device
    array's filter runs in Triton's kernels, in memory and chunk by chunk."""
    a = RNG.random((20, 18)).astype(np.float32)
    with interpreted_triton() as T:
        monkeypatch.setenv("TORCHFILTERS_BACKEND", "triton")
        want = F.gaussian_filter(torch.from_numpy(a), 1.2, mode="mirror", backend="triton").numpy()
        before = sum(T.LAUNCHES.values())
        got = tfn.gaussian_filter(Duck(a), 1.2, mode="mirror")
        assert sum(T.LAUNCHES.values()) > before
        _same(got, want)
        x = da.from_array(Duck(a), chunks=(10, 9), asarray=False, meta=Duck(np.empty((0, 0), np.float32)))
        before = sum(T.LAUNCHES.values())
        got = tfd.gaussian_filter(x, 1.2, mode="mirror").compute(scheduler="sync")
        assert sum(T.LAUNCHES.values()) > before
        _same(got, want)
