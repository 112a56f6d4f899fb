"""The CPU engine's direct 3x3 path and its output-buffer cache.

Gradient-type specs (every operator: 1-D passes of three taps) in the modes
that fold onto samples run a dedicated kernel that reads the input in place
(``backends/cpu.py``, "direct 3x3 path").  It must give the general engine's
bits (up to the sign of zero), cover every plane size, blocking and dtype, and
step aside where it does not apply.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch

import torchfilters as tf

cpu = pytest.importorskip("torchfilters.backends.cpu")

from conftest import FULL_GRID, OPERATORS, SMOOTH, cases, grid, rand  # noqa: E402

FOLDING = ("reflect", "mirror", "nearest", "wrap", "grid-mirror", "grid-wrap")
SHAPES = ((1, 1), (1, 2), (2, 1), (1, 9), (9, 1), (2, 2), (3, 3), (5, 17), (28, 28), (40, 3))


def _ops(op):
    return {
        "magnitude": lambda x, **k: tf.gradient_magnitude(x, operator=op, **k),
        "gradient": lambda x, **k: tf.gradient(x, operator=op, **k),
        "direction": lambda x, **k: tf.gradient_direction(x, operator=op, **k),
        "derivative-x": lambda x, **k: tf.derivative(x, -1, operator=op, **k),
        "derivative-y-normalized": lambda x, **k: tf.derivative(x, -2, operator=op, normalized=True, **k),
    }


@pytest.fixture(autouse=True)
def _planned_afresh(no_replays):
    """(Tests here patch the CPU engine's planning and spy on its launches: no replays.)"""


@pytest.fixture
def launches(monkeypatch):
    """The kernels each call launched."""
    seen = []
    launch = cpu._launch

    def spy(fn, args, nitems, nthreads, serial, runs=None):
        seen.append(fn)
        return launch(fn, args, nitems, nthreads, serial, runs)

    monkeypatch.setattr(cpu, "_launch", spy)
    return seen


def _general(monkeypatch):
    """Switch the direct path off (the general engine runs every spec; the symmetric separable
    path, which would take the smoothing-only specs, too)."""
    monkeypatch.setattr(cpu, "_d3_plan", lambda *a: None)
    monkeypatch.setattr(cpu, "sep_info", lambda spec: None)


def _direct(fn):
    return fn in cpu.direct._d3_kernels.values()


#: every operator and every mode, each operator in one way of folding its border columns --
#: EDGE (reflect, nearest), MIRR (mirror), FAR (wrap) -- and the grid-* aliases beside their
#: mode (the same kernels): about 105 compiled kernels instead of 246 on a cold numba cache
#: (the SciPy parity grids run every operator in every mode on this engine in float64)
SAME_BITS_CORE = [
    ("central", "reflect"), ("central", "grid-mirror"), ("sobel", "mirror"), ("scharr", "nearest"),
    ("prewitt", "wrap"), ("prewitt", "grid-wrap"),
]


#: per core case, its 16-bit input's dtype and the parity of the ops that input takes: the
#: dtypes alternate (the kernels compute both in float32 and differ only in their loads and
#: stores, so one per operator and way of folding covers them: 43 of the test's 67 cold compiles
#: were 16-bit), and the ops are halved so that each 16-bit dtype meets every op and every way
#: of folding (EDGE, MIRR, MIRR, EDGE, FAR, FAR) meets every op in 16 bits
_HALF_PLAN = ((torch.float16, 0), (torch.bfloat16, 0), (torch.float16, 1), (torch.bfloat16, 1),
              (torch.float16, 0), (torch.bfloat16, 1))


def _halves(op, mode):
    """The 16-bit dtypes a case runs in: one per core case (``_HALF_PLAN``); both in the full grid."""
    if FULL_GRID or (op, mode) not in SAME_BITS_CORE:
        return (torch.float16, torch.bfloat16)
    return (_HALF_PLAN[SAME_BITS_CORE.index((op, mode))][0],)


def _runs(name, x, op, mode):
    """Whether a case runs the op ``name`` on ``x``: a core case's 16-bit input takes every other
    op (``_HALF_PLAN``); every op in the full grid."""
    if FULL_GRID or x.dtype not in (torch.float16, torch.bfloat16) or (op, mode) not in SAME_BITS_CORE:
        return True
    return list(_ops(op)).index(name) % 2 == _HALF_PLAN[SAME_BITS_CORE.index((op, mode))][1]


@cases("op, mode", [(op, mode) for op in OPERATORS for mode in FOLDING], SAME_BITS_CORE)
def test_same_bits_as_the_general_engine(op, mode, monkeypatch, launches):
    xs = [rand(3, h, w, seed=h * 31 + w) for h, w in SHAPES]
    xs.append(rand(2, 28, 28, seed=5, dtype=torch.float32))
    xs += [rand(1, 7, 6, seed=6, dtype=dt) if dt == torch.float16 else rand(2, 6, 7, seed=7, dtype=dt)
           for dt in _halves(op, mode)]
    got = {(name, i): f(x, mode=mode, cval=2.5) for name, f in _ops(op).items() for i, x in enumerate(xs)
           if _runs(name, x, op, mode)}
    assert launches and all(_direct(fn) for fn in launches)
    _general(monkeypatch)
    launches.clear()
    for (name, i), y in got.items():
        want = _ops(op)[name](xs[i], mode=mode, cval=2.5)
        assert y.dtype == want.dtype and y.shape == want.shape
        assert torch.equal(y, want), (name, tuple(xs[i].shape), xs[i].dtype)
    assert launches and not any(_direct(fn) for fn in launches)


@pytest.mark.parametrize("mode", ("reflect", "wrap"))
def test_blockings(mode, monkeypatch):
    """Many small planes stacked per work item (an odd count left over), and large planes split
    into row blocks over threads, including blocks of one row."""
    x1 = rand(2, 37, 7, 9, seed=1)
    x2 = rand(1, 67, 45, seed=2)
    got = [tf.gradient_magnitude(x, operator="sobel", mode=mode) for x in (x1, x2)]
    monkeypatch.setattr(cpu.direct, "_d3_cache", {})  # plans made under the patched sizes stay here
    monkeypatch.setattr(cpu.plan, "_WHOLE", 0)
    monkeypatch.setattr(cpu.plan, "_SERIAL", 0)
    rows = []
    for tile in (1, 2 * 45, 3 * 45):  # row blocks of 1, 2 and 3 rows (67 = 22 * 3 + 1)
        monkeypatch.setattr(cpu.plan, "_TILE", tile)
        monkeypatch.setattr(cpu.direct, "_D3_TILE", tile)
        cpu.direct._d3_cache.clear()
        rows.append(tf.gradient_magnitude(x2, operator="sobel", mode=mode))
    _general(monkeypatch)
    for x, a in zip((x1, x2), got):
        assert torch.equal(a, tf.gradient_magnitude(x, operator="sobel", mode=mode))
    want = tf.gradient_magnitude(x2, operator="sobel", mode=mode)
    assert all(torch.equal(b, want) for b in rows)


def test_planes_per_item_and_uncollapsed_leading_dims(monkeypatch, launches):
    """Several planes per work item (two threads' worth of items), leading dims that do not
    collapse (a slice of the second dim), and a stacked gradient into a permuted out=."""
    monkeypatch.setattr(cpu, "_threads", lambda: 2)
    monkeypatch.setattr(cpu.direct, "_d3_cache", {})
    base = rand(3, 50, 9, 11, seed=8)
    x = base[:, 5:45]
    out = torch.empty(2, 3, 40, 9, 11, dtype=x.dtype).permute(1, 2, 0, 3, 4)
    got = [tf.gradient_magnitude(x, operator=op) for op in OPERATORS]
    tf.gradient(x, operator="scharr", out=out)
    assert launches and all(_direct(fn) for fn in launches)
    _general(monkeypatch)
    for op, y in zip(OPERATORS, got):
        assert torch.equal(y, tf.gradient_magnitude(x, operator=op))
    assert torch.equal(out, tf.gradient(x, operator="scharr"))


@pytest.mark.parametrize("mode", ("reflect", "wrap"))
def test_three_tap_correlations_and_non_finite_patterns(mode, monkeypatch, launches):
    """3-tap correlate1d / convolve1d / 1x3 and 3x1 correlate take the direct path; NaN and inf
    land where the general engine puts them, for every operator."""
    x = rand(2, 9, 10, seed=12)
    ops = [
        lambda t: tf.correlate1d(t, [0.5, -2.0, 3.0], -1, mode=mode),
        lambda t: tf.convolve1d(t, [1.0, 2.0, 1.0], -2, mode=mode),
        lambda t: tf.correlate(t, [[1.0, -1.0, 2.0]], mode=mode),
        lambda t: tf.correlate(t, [[1.0], [4.0], [1.0]], mode=mode),
    ]
    bad = x.clone()
    bad[0, 4, 5] = math.nan
    bad[0, 0, 9] = math.inf
    bad[1, 8, 0] = -math.inf
    for op in OPERATORS:
        ops += [lambda t, op=op: tf.gradient_magnitude(t, operator=op, mode=mode),
                lambda t, op=op: tf.derivative(t, -1, operator=op, mode=mode),
                lambda t, op=op: tf.derivative(t, -2, operator=op, mode=mode)]
    got = [f(t) for f in ops for t in (x, bad)]
    assert launches and all(_direct(fn) for fn in launches)
    _general(monkeypatch)
    want = [f(t) for f in ops for t in (x, bad)]
    for a, b in zip(got, want):
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@grid("bad, dtype, mode", (math.nan, math.inf, -math.inf), (torch.float64, torch.float32, torch.float16),
      ("mirror", "nearest", "wrap"), strength=1)
def test_non_finite_anywhere_in_a_row_block(dtype, bad, mode, monkeypatch):
    """The interior run leaves zero centre taps out only when every sample it reads is finite.
    One non-finite sample per plane, at every position of a 9x6 plane cut into row blocks of 3
    rows (block edges, halo rows, corners, and the footprint centre, which only a zero tap
    sees): the general engine's NaN/inf pattern and values, for every operator; border columns
    selected in the run (mirror, nearest) or fixed up after it (wrap)."""
    H, W = 9, 6
    x = rand(1, H, W, seed=21, dtype=dtype).repeat(H * W, 1, 1)
    x.view(H * W, H * W)[range(H * W), range(H * W)] = bad
    monkeypatch.setattr(cpu.direct, "_d3_cache", {})
    monkeypatch.setattr(cpu.plan, "_WHOLE", 0)
    monkeypatch.setattr(cpu.plan, "_TILE", 3 * W)
    monkeypatch.setattr(cpu.direct, "_D3_TILE", 3 * W)
    ops = [f for op in OPERATORS for name, f in _ops(op).items() if name != "direction"]
    got = [f(x, mode=mode) for f in ops]
    _general(monkeypatch)
    for a, f in zip(got, ops):
        b = f(x, mode=mode)
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        assert a.isnan().any() or a.isinf().any()


def _stream(fn):
    return any(fn is k and key[3] == cpu.direct.STREAM for key, k in cpu.direct._d3_kernels.items())


@grid("dtype, mode", (torch.float64, torch.float32, torch.float16), ("reflect", "wrap"), strength=1)
def test_streaming_stores_give_the_same_bits(dtype, mode, monkeypatch, launches):
    """Outputs larger than the cache take non-temporal stores of whole output lines through a
    line buffer (``STREAM``); forced here on small outputs.  Every misalignment of ``out=``
    (the partial lines at a run's ends are stored directly), planes narrower than a line and
    wider than a chunk (16 lines), row blocks, border columns selected in the run from the
    samples read (reflect) or from one loaded at an offset (wrap), a NaN (the rerun), and a
    stacked gradient (two outputs: not streamed): the bits of the regular stores."""
    xs = [rand(3, 5, 4, seed=1, dtype=dtype), rand(2, 28, 28, seed=2, dtype=dtype), rand(1, 9, 70, seed=3, dtype=dtype),
          rand(1, 41, 300, seed=4, dtype=dtype)]
    bad = rand(1, 41, 300, seed=5, dtype=dtype)
    bad[0, 20, 150] = math.nan
    xs.append(bad)
    names = (("magnitude", "sobel"), ("direction", "central"), ("derivative-x", "central"), ("gradient", "sobel"))
    cases = [(name, op, i, off) for name, op in names for i in range(len(xs)) for off in (0, 1, 7)]
    monkeypatch.setattr(cpu.direct, "_d3_cache", {})
    monkeypatch.setattr(cpu.direct, "_D3_TILE", 6 * 300)  # row blocks of the 300-wide planes

    def run():
        got = []
        for name, op, i, off in cases:
            x = xs[i]
            shape = x.shape if name != "gradient" else x.shape[:-2] + (2,) + x.shape[-2:]
            out = torch.full((math.prod(shape) + off,), 7.0, dtype=dtype)[off:].view(shape)
            got.append(_ops(op)[name](x, mode=mode, out=out))
        return got

    want = run()
    assert launches and not any(_stream(fn) for fn in launches)
    launches.clear()
    cpu.direct._d3_cache.clear()
    monkeypatch.setattr(cpu.direct, "_STREAM_BYTES", 0)
    monkeypatch.setattr(cpu.direct, "_STREAM_MIN_W", 0)
    got = run()
    streamed = [(c[0], _stream(fn)) for c, fn in zip(cases, launches)]
    assert streamed and all(s == (name != "gradient") for name, s in streamed)
    for c, a, b in zip(cases, got, want):
        assert torch.equal(a.isnan(), b.isnan()), c
        assert torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)), c
    assert got[-1].isnan().any()
    # an output whose address is not a multiple of its element size: regular stores (its lines
    # cannot be aligned; the non-temporal stores would fault)
    raw = np.zeros(4 * 41 * 300 + 1, np.uint8)
    odd = torch.from_numpy(np.frombuffer(raw.data, np.float32, 41 * 300, offset=1)).view(1, 41, 300)
    launches.clear()
    x = xs[3].float()
    tf.gradient_magnitude(x, operator="sobel", mode=mode, out=odd)
    assert len(launches) == 1 and _direct(launches[0]) and not _stream(launches[0])
    assert torch.equal(odd, tf.gradient_magnitude(x, operator="sobel", mode=mode))


def test_matches_scipy():
    ndi = pytest.importorskip("scipy.ndimage")
    x = rand(2, 3, 13, 10, seed=3)
    for mode in ("reflect", "mirror", "nearest", "wrap"):
        y = tf.gradient_magnitude(x, operator="sobel", mode=mode).numpy()
        xn = x.numpy()
        gy = np.stack([[ndi.sobel(p, axis=0, mode=mode) for p in b] for b in xn])
        gx = np.stack([[ndi.sobel(p, axis=1, mode=mode) for p in b] for b in xn])
        np.testing.assert_allclose(y, np.hypot(gx, gy), rtol=1e-13, atol=1e-13)


def test_where_it_steps_aside(launches):
    x = rand(2, 9, 8, seed=4)
    tf.gradient_magnitude(x, mode="constant", cval=1.0)  # SciPy's sequential constant padding
    tf.gaussian_gradient_magnitude(x, 1.0)  # wider than 3x3
    tf.correlate(x, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])  # dense
    wide = torch.empty(2, 9, 16, dtype=x.dtype)[..., ::2]
    tf.gradient_magnitude(x, out=wide)  # strided rows out
    tf.gradient_magnitude(x.transpose(-1, -2))  # strided rows in
    assert launches and not any(_direct(fn) for fn in launches)
    launches.clear()
    y = tf.gradient(x[:, 1:, :])  # planes apart, rows still contiguous: direct
    assert len(launches) == 1 and _direct(launches[0])
    torch.testing.assert_close(y, tf.gradient(x[:, 1:, :].contiguous(), backend="reference"), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("bad", (math.nan, math.inf))
def test_non_finite_inputs_follow_scipy(bad):
    """Zero taps are multiplied (SciPy's correlate1d): a NaN/inf under the centre of [-1, 0, 1]
    makes that pixel NaN; at a corner the footprint folds."""
    x = torch.zeros(1, 6, 7)
    x[0, 2, 3] = bad
    x[0, 5, 6] = bad
    y = tf.derivative(x, -1, mode="reflect")
    ndi = pytest.importorskip("scipy.ndimage")
    want = ndi.correlate1d(x[0].numpy(), [-0.5, 0.0, 0.5], axis=1, mode="reflect")
    np.testing.assert_array_equal(y[0].isnan().numpy(), np.isnan(want))
    np.testing.assert_array_equal(y[0].nan_to_num(0, 1, -1).numpy(), np.nan_to_num(want, nan=0, posinf=1, neginf=-1))


# ------------------------------------------------------------------ output cache


def _big(seed=0):
    return rand(8, 128, 256, seed=seed, dtype=torch.float32)  # 1 MiB: outputs come from the cache


def test_cache_reuses_a_freed_buffer_only():
    x = _big()
    y = tf.gradient_magnitude(x)
    p = y.data_ptr()
    want = y.clone()
    del y
    gc.collect()
    y = tf.gradient_magnitude(x)
    assert y.data_ptr() == p and torch.equal(y, want)
    z = tf.gradient_magnitude(x)  # y is alive: another buffer
    assert z.data_ptr() != y.data_ptr()
    v = z[3]  # a view keeps z's buffer in use
    del z
    w = tf.gradient_magnitude(x)
    assert w.data_ptr() not in (y.data_ptr(), v.data_ptr() - 3 * 128 * 256 * 4)
    assert torch.equal(w, want) and torch.equal(v, want[3])


def test_cache_serves_every_dtype_and_backward(monkeypatch):
    calls = []
    take = cpu.buffers._cached_buffer

    def spy(nbytes):
        buf, cached = take(nbytes)
        calls.append((buf.ctypes.data, cached))
        return buf, cached

    monkeypatch.setattr(cpu.buffers, "_cached_buffer", spy)
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = rand(8, 256, 256, seed=1, dtype=dt)  # >= 1 MiB in every dtype
        gc.collect()  # (autograd graphs of the previous dtype)
        cpu.empty_cache()
        y = tf.gradient_magnitude(x)
        p = y.data_ptr()
        want = y.clone()
        del y
        y = tf.gradient_magnitude(x)  # the freed buffer again
        assert y.data_ptr() == p and y.dtype == dt and torch.equal(y, want)
        xx = x.clone().requires_grad_(True)
        tf.gradient_magnitude(xx).sum().backward()  # the backward output comes from the cache too
        assert calls[-1] == (xx.grad.data_ptr(), True)
        want_grad = x.clone().requires_grad_(True)
        tf.gradient_magnitude(want_grad, backend="reference").sum().backward()
        torch.testing.assert_close(xx.grad.double(), want_grad.grad.double(), rtol=2e-2, atol=2e-2)
    assert all(cached for _, cached in calls)


def test_empty_cache_and_limit(monkeypatch):
    x = _big()
    cpu.empty_cache()
    y = tf.gradient_magnitude(x)
    tf.gradient_magnitude(x)  # freed at once: its buffer is free in the cache
    assert len(cpu.buffers._free_bufs) == 1
    assert cpu.empty_cache() >= x.numel() * 4
    assert cpu.empty_cache() == 0 and cpu.buffers._free_bufs == []  # y's buffer is in use: kept
    p = y.data_ptr()
    del y
    assert [b.ctypes.data for b in cpu.buffers._free_bufs] == [p]
    assert cpu.empty_cache() >= x.numel() * 4
    monkeypatch.setenv("TORCHFILTERS_CPU_CACHE_MB", "0")
    in_use = cpu.buffers._in_use
    a = tf.gradient_magnitude(x)
    assert cpu.buffers._in_use == in_use  # not a cached buffer
    del a
    assert cpu.buffers._free_bufs == []


def test_cache_keeps_few_free_buffers():
    """Varying sizes must not pile up dead buffers: at most ``_MAX_FREE`` free ones stay."""
    cpu.empty_cache()
    for i in range(8):
        tf.gradient_magnitude(rand(1, 300 + 150 * i, 400, seed=i, dtype=torch.float32))
    assert len(cpu.buffers._free_bufs) <= cpu.buffers._MAX_FREE
    sizes = [b.nbytes for b in cpu.buffers._free_bufs]
    assert sizes == sorted(sizes)  # the most recently released (largest here) are kept
    cpu.empty_cache()


def test_top_level_empty_cache():
    x = _big(2)
    tf.gradient_magnitude(x)  # freed at once: its buffer is cached
    assert tf.empty_cache() >= x.numel() * 4
    assert tf.empty_cache() == 0


@pytest.mark.skipif(__import__("sys").platform != "linux", reason="guard pages via libc mmap/mprotect")
def test_no_reads_outside_the_input():
    """Input planes between PROT_NONE pages: a read one element before or after the tensor
    crashes the process (a regression: the flat run once read x[-1] and x[H*W]; a wrap-mode run
    loaded its fold neighbours up to two rows outside, which faults on AVX2 hosts).  Runs in a
    subprocess, so that a crash fails this test instead of killing pytest."""
    from _guard import run_in_subprocess

    run_in_subprocess("test_cpu_direct", "_reads_inside_the_input")


def _reads_inside_the_input():
    import mmap

    from _guard import guarded

    n = 2 * mmap.PAGESIZE  # two pages of data between two guard pages
    with guarded(n) as data:
        for dt in (torch.float32, torch.float64):
            flat = data.view(dt)
            m = flat.numel()
            flat.copy_(rand(m, seed=9, dtype=dt))
            for shape in ((2, 32, m // 64), (1, 1, m), (1, m, 1), (m // 2, 2), (2, m // 2)):
                x = flat.view(shape)
                for op in OPERATORS:
                    for mode in ("reflect", "wrap", "constant"):
                        y = tf.gradient_magnitude(x, operator=op, mode=mode)
                        want = tf.gradient_magnitude(x, operator=op, mode=mode, backend="reference")
                        torch.testing.assert_close(y, want)
                        tf.derivative(x, -1, operator=op, mode=mode)
                        tf.derivative(x, -2, operator=op, mode=mode)


def test_large_finite_values_do_not_become_nan():
    """The x-derivative of the smoothed operators: the vertical sum of the centre column can
    overflow; its zero tap must not turn that into NaN (SciPy and the general engine stay finite)."""
    ndi = pytest.importorskip("scipy.ndimage")
    for dt, big in ((torch.float32, 1e38), (torch.float64, 1e308)):
        x = torch.zeros(4, 6, dtype=dt)
        x[:, 1] = big
        x[:, 2] = 1.0
        for op in ("sobel", "scharr", "prewitt"):
            y = tf.derivative(x, -1, operator=op)
            assert not y.isnan().any(), (op, dt)
            d = ndi.correlate1d(x.numpy(), [-1.0, 0.0, 1.0], axis=-1, mode="reflect")  # SciPy's order
            want = ndi.correlate1d(d, SMOOTH[op], axis=-2, mode="reflect").astype(np.float64)
            finite = np.isfinite(want) & np.isfinite(y.double().numpy())
            np.testing.assert_allclose(y.double().numpy()[finite], want[finite], rtol=1e-6)
            g = tf.gradient_magnitude(x, operator=op)
            assert not g.isnan().any(), (op, dt)


def test_cache_limit_from_the_environment(monkeypatch):
    x = _big(3)
    for bad in ("lots", "nan"):
        monkeypatch.setenv("TORCHFILTERS_CPU_CACHE_MB", bad)
        with pytest.raises(ValueError, match="TORCHFILTERS_CPU_CACHE_MB"):
            tf.gradient_magnitude(x)
    for ok in ("", " ", "inf", "1e30", "64", "-5", "-inf"):
        monkeypatch.setenv("TORCHFILTERS_CPU_CACHE_MB", ok)
        assert tf.gradient_magnitude(x).shape == x.shape
    monkeypatch.setenv("TORCHFILTERS_CPU_CACHE_MB", "64")
    tf.gradient_magnitude(x)  # a free buffer in the cache
    assert cpu.buffers._free_bufs
    monkeypatch.setenv("TORCHFILTERS_CPU_CACHE_MB", "0")  # lowered later: the next output drops it
    y = tf.gradient_magnitude(x)
    assert cpu.buffers._free_bufs == [] and y.shape == x.shape
    monkeypatch.delenv("TORCHFILTERS_CPU_CACHE_MB")
    assert cpu.buffers._cache_limit() <= 2 << 30
