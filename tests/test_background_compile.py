"""Background compilation (``backends._tiered``): with ``backend="auto"``, a call on a CPU tensor
never compiles or loads a numba kernel in the calling thread.

The suite runs with ``TORCHFILTERS_COMPILE=wait`` (``conftest``); the cases here set the default,
``background``, and most run in a fresh interpreter with an empty kernel cache: what they check
happens only before the first kernel of a process is ready.
"""

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torchfilters as tf
from torchfilters import backends
from torchfilters.backends import _tiered

pytest.importorskip("numba")


def _run(code: str, tmp_path, timeout=600):
    env = dict(os.environ, TORCHFILTERS_COMPILE="background", NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       timeout=timeout)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    return r.stdout


def test_auto_calls_run_on_the_reference_engine_until_the_fused_kernels_are_ready(tmp_path):
    out = _run("""
        import threading
        import torch
        from numba.core import event  # (imported here only to watch where kernels compile)

        compiled_in = []

        class Watch(event.Listener):
            def on_start(self, ev):
                compiled_in.append(threading.current_thread().name)

            def on_end(self, ev):
                pass

        event.register("numba:compile", Watch())

        import torchfilters as tf
        from torchfilters.backends import reference

        ran = {"reference": 0}
        for name in ("filter_forward", "filter_backward", "blur_forward", "blur_backward"):
            def counted(*a, _f=getattr(reference, name), **k):
                ran["reference"] += 1
                return _f(*a, **k)
            setattr(reference, name, counted)

        x = torch.rand(2, 3, 40, 40, dtype=torch.float64)
        ops = [lambda t, **k: tf.gradient_magnitude(t, operator="sobel", **k),
               lambda t, **k: tf.gaussian_filter(t, 1.5, mode="wrap", **k)]
        first = [op(x) for op in ops]
        assert ran["reference"] == 2, ran  # nothing was ready: both ran on the reference engine

        def fwd_bwd():
            xg = x.clone().requires_grad_(True)
            y = tf.selective_blur(xg, 0.5, sigma=1.0)
            y.sum().backward()
            return y.detach(), xg.grad

        y1, g1 = fwd_bwd()
        # launches split over the pool's threads (which must not compile either)
        big = torch.rand(4, 300, 300, dtype=torch.float64)
        big_first = [op(big) for op in ops]
        # calls from other threads meanwhile: every one returns a right result
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ops[i % 2](x))) for i in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]

        assert tf.backends.synchronize(timeout=600)
        from torchfilters.backends.cpu import plan
        assert not plan._small(4, 300, 300)  # (those launches were parallel where threads > 1)
        n = ran["reference"]
        again = [op(x) for op in ops]
        y2, g2 = fwd_bwd()
        assert ran["reference"] == n, ran  # every kernel is ready: the fused engine ran
        assert compiled_in and set(compiled_in) == {"torchfilters-compile"}, compiled_in

        for a, b in zip(first, again):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        for op, a in zip(ops, big_first):
            torch.testing.assert_close(a, op(big), rtol=1e-12, atol=1e-12)
        for i, r in results.items():
            torch.testing.assert_close(r, again[i % 2], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)
        # and what the fused engine gives, bit for bit
        for op, b in zip(ops, again):
            assert torch.equal(b, op(x, backend="cpu"))
        print("ok", len(compiled_in))
    """, tmp_path)
    assert out.startswith("ok"), out


def test_a_fork_while_a_kernel_compiles_leaves_the_child_working(tmp_path):
    # numba's compiler lock held by the background thread at the fork would hang the child's
    # first compile: a fork waits for the kernel in hand
    out = _run("""
        import multiprocessing as mp
        import torch
        import torchfilters as tf

        x = torch.rand(3, 30, 30, dtype=torch.float64)
        want = tf.gaussian_filter(x, 1.0, backend="reference")
        tf.gradient_magnitude(x)  # queues the engine's import and a kernel

        def child(q):
            q.put(bool(torch.allclose(tf.gaussian_filter(x, 1.0), want))
                  and bool(torch.allclose(tf.gaussian_filter(x, 1.0, backend="cpu"), want)))

        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        ok = q.get(timeout=300)
        p.join(300)
        assert ok and p.exitcode == 0, (ok, p.exitcode)
        print("ok")
    """, tmp_path)
    assert "ok" in out


def test_exit_while_a_kernel_compiles(tmp_path):
    # the background thread finishes the kernel in hand and takes no more; nothing is printed
    # to stderr (no traceback from a thread torn down mid-compile)
    env = dict(os.environ, TORCHFILTERS_COMPILE="background", NUMBA_CACHE_DIR=str(tmp_path / "c"))
    code = "import torch, torchfilters as tf; tf.gradient_magnitude(torch.rand(2, 9, 9)); print('done')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "done", (r.stdout, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "Exception" not in r.stderr, r.stderr[-3000:]


def test_the_compile_mode_is_checked(monkeypatch):
    monkeypatch.setenv("TORCHFILTERS_COMPILE", "later")
    with pytest.raises(ValueError, match="TORCHFILTERS_COMPILE"):
        tf.gaussian_filter(torch.rand(5, 5), 1.0)


def test_which_engine_auto_hands_out(monkeypatch):
    cpu = backends.get("cpu")
    monkeypatch.setenv("TORCHFILTERS_COMPILE", "background")
    assert backends.resolve("auto", torch.device("cpu"), torch.float32) is _tiered.ENGINE
    assert backends.resolve("cpu", torch.device("cpu"), torch.float32) is cpu  # a forced engine waits
    with _tiered.waiting():
        assert backends.resolve("auto", torch.device("cpu"), torch.float32) is cpu
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:  # deterministic algorithms: every call on the same engine
        assert backends.resolve("auto", torch.device("cpu"), torch.float32) is cpu
    finally:
        torch.use_deterministic_algorithms(before)
    monkeypatch.setenv("TORCHFILTERS_COMPILE", "wait")
    assert backends.resolve("auto", torch.device("cpu"), torch.float32) is cpu
    assert set(_tiered.CPU_DTYPES) == {d for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
                                       if cpu.available(torch.device("cpu"), d)}


def test_synchronize_returns_at_once_with_nothing_queued():
    assert tf.backends.synchronize(timeout=0) is True


def test_ndimage_calls_never_take_the_reference_engine_meanwhile(monkeypatch):
    # NumPy users get SciPy's bits from the first call, and dask the same bits on every chunk:
    # torchfilters.ndimage compiles in the call (the torch API's auto calls would not)
    np = pytest.importorskip("numpy")
    import torchfilters.ndimage as tfn

    monkeypatch.setenv("TORCHFILTERS_COMPILE", "background")

    def refuse(*a, **k):
        raise AssertionError("an ndimage call went through the background-compile engine")

    monkeypatch.setattr(_tiered._Tiered, "_run", staticmethod(refuse))
    with pytest.raises(AssertionError):  # (the stand-in does refuse the torch API's auto calls)
        tf.gaussian_filter(torch.rand(6, 6), 1.0)
    a = np.random.default_rng(0).random((9, 11))
    for y in (tfn.gaussian_filter(a, 1.5), tfn.sobel(a, 0), tfn.uniform_filter(a, 3), tfn.median_filter(a, 3),
              tfn.correlate(a, np.ones((2, 3))), tfn.gaussian_gradient_magnitude(a, 1.0)):
        assert y.shape == a.shape


def test_a_returned_call_never_touches_the_callers_tensors_again(tmp_path):
    # found by review: the first call's background rerun read the caller's tensors after the
    # call had returned (a storage freed meanwhile: a segfault); it now runs on copies
    out = _run("""
        import torch
        import torchfilters as tf

        x = torch.rand(2, 300, 300)
        y = tf.gaussian_filter(x, 2.0)
        x.untyped_storage().resize_(0)  # the caller is done with x
        assert tf.backends.synchronize(timeout=600)
        z = torch.rand(2, 300, 300)
        torch.testing.assert_close(tf.gaussian_filter(z, 2.0), tf.gaussian_filter(z, 2.0, backend="reference"))
        print("ok")
    """, tmp_path)
    assert "ok" in out


def test_costly_calls_compile_instead_of_running_on_the_reference_engine(monkeypatch):
    # found by review: a large rank filter ran on the reference engine for far longer (and in
    # far more memory) than compiling its kernel takes
    from torchfilters.backends import reference

    monkeypatch.setenv("TORCHFILTERS_COMPILE", "background")
    monkeypatch.setattr(_tiered, "_loaded_cpu", lambda: None)  # as if nothing were ready yet ...
    monkeypatch.setattr(_tiered, "_submit", lambda key, job: True)  # ... and all queued
    ran = []
    for name in ("rank_forward", "filter_forward"):
        monkeypatch.setattr(reference, name, lambda *a, _f=getattr(reference, name), **k: ran.append(1) or _f(*a, **k))
    small = torch.rand(16, 16)
    tf.median_filter(small, 3)
    tf.gaussian_filter(small, 1.0)
    assert len(ran) == 2  # cheap: the reference engine meanwhile
    # a wide Gaussian on a small image: its 8001-tap passes fold onto the image's period (512
    # taps), 0.05 s on the reference engine; counted unfolded it was estimated at 1.6 s and
    # compiled in the call
    wide = torch.rand(256, 256)
    tf.gaussian_filter(wide, 1000.0)
    assert len(ran) == 3
    big = torch.rand(1024, 1024)
    assert _tiered._reference_ns((big, _tiered_rank_spec(big, 9))) > _tiered._FALLBACK_NS
    # float64 takes the reference engine 1.4-2x as long as float32 (16-bit: as float32): a 3x3
    # median of 3x1024x1024 is 0.75-0.8 s in float32, 1.1 s in float64 (Zen 1)
    x32, x64 = torch.empty(3, 1024, 1024), torch.empty(3, 1024, 1024, dtype=torch.float64)
    spec = _tiered_rank_spec(x32, 3)
    assert _tiered._reference_ns((x32, spec)) < _tiered._FALLBACK_NS < _tiered._reference_ns((x64, spec))
    y = tf.median_filter(big, 9)
    assert len(ran) == 3  # costly: the fused engine, compiled in the call
    assert torch.equal(y, tf.median_filter(big, 9, backend="cpu"))
    # a gradient magnitude of a large image: 1.2 s on the reference engine (Zen 1), which the
    # model before estimated at 0.23 s (1.5 ns a tap, no passes)
    large = torch.rand(3, 2048, 2048)
    y = tf.gradient_magnitude(large, operator="sobel")
    assert len(ran) == 3
    assert torch.equal(y, tf.gradient_magnitude(large, operator="sobel", backend="cpu"))


def _tiered_rank_spec(x, size):
    from torchfilters._spec import RankSpec

    fp = tuple(tuple(1 for _ in range(size)) for _ in range(size))
    return RankSpec(mode="reflect", cval=0.0, rank=size * size // 2, footprint=fp, lo=(-(size // 2),) * 2)


def test_canny_reaches_the_fused_cpu_kernel(monkeypatch):
    # found by review: the auto engine had no ``canny_fused``, so Canny smoothed generically
    cpu_canny = pytest.importorskip("torchfilters.backends.cpu.canny")
    monkeypatch.setenv("TORCHFILTERS_COMPILE", "background")
    x = torch.rand(2, 40, 50)
    want = tf.canny(x, backend="cpu")
    calls = []
    monkeypatch.setattr(cpu_canny, "canny_fused", lambda *a, _f=cpu_canny.canny_fused: calls.append(1) or _f(*a))
    assert torch.equal(tf.canny(x), want)
    assert calls


def test_canny_runs_on_the_reference_engine_while_its_kernels_compile(monkeypatch):
    # found by review: the fallback looked Canny's reference module up among the engines
    monkeypatch.setenv("TORCHFILTERS_COMPILE", "background")
    monkeypatch.setattr(_tiered, "_loaded_cpu", lambda: None)  # as if nothing were ready yet ...
    monkeypatch.setattr(_tiered, "_submit", lambda key, job: True)  # ... and all queued
    x = torch.rand(2, 40, 50, dtype=torch.float64)
    m = torch.rand(40, 50) > 0.2
    for kw in ({}, {"mask": m}, {"use_quantiles": True, "low_threshold": 0.2, "high_threshold": 0.8}):
        assert torch.equal(tf.canny(x, **kw), tf.canny(x, backend="reference", **kw))


def test_calls_made_while_the_engine_loads_are_rerun_once_per_kind(monkeypatch):
    """The first call queues the engine's import with its own rerun on copies in the same job
    (so that exit, which finishes the job in hand, leaves its kernels cached); each other kind of
    call made while the engine loads queues one rerun of its own (its kernels then compile before
    ``synchronize`` returns): not twice for the same kind, not for a call of more than 4M
    elements, and not beyond the copies' budget."""
    jobs = []
    keys = set()

    def submit(key, job):
        if key in keys:
            return False
        keys.add(key)
        jobs.append((key, job))
        return True

    monkeypatch.setattr(_tiered, "_submit_new", submit)
    monkeypatch.setattr(_tiered, "_keys", keys)
    monkeypatch.setattr(_tiered, "_replayed", set())
    monkeypatch.setattr(_tiered, "_queued", [0])
    monkeypatch.setattr(_tiered, "_REPLAY_MAX", 1000)
    monkeypatch.setattr(_tiered, "_REPLAY_BUDGET", 2200)
    seen = []
    monkeypatch.setattr(_tiered, "_load_engine", lambda: seen.append("import"))
    monkeypatch.setattr(_tiered, "_loaded_cpu", lambda: True)
    monkeypatch.setattr(_tiered, "_function", lambda engine, name: lambda *a, **k: seen.append((engine, a, k)))
    x = torch.rand(3, 10, 10)
    assert _tiered._submit_loading("filter_forward", (x, "spec-a"), {})
    assert [k for k, _ in jobs] == ["engine"] and _tiered._queued[0] == 300
    assert _tiered._submit_loading("filter_forward", (x.clone(), "spec-a"), {})  # the same kind
    assert len(jobs) == 1
    for t in (x.double(), x.transpose(1, 2)):  # another dtype, another layout (the same sizes)
        _tiered._submit_loading("filter_forward", (t, "spec-a"), {})
    _tiered._submit_loading("filter_forward", (x, "spec-b"), {})  # another spec
    assert len(jobs) == 4 and _tiered._queued[0] == 1200
    _tiered._submit_loading("filter_forward", (torch.rand(1001), "spec-c"), {})  # too large
    for spec in "defg":  # the last over the budget: 2100 + 300
        _tiered._submit_loading("filter_forward", (x, "spec-" + spec), {})
    assert len(jobs) == 7 and _tiered._queued[0] == 2100
    # the engine's job: the import, then the first call's rerun, on copies
    x.zero_()
    jobs[0][1]()
    assert seen[0] == "import" and seen[1][0] == "cpu" and seen[1][1][1] == "spec-a"
    assert seen[1][1][0].abs().sum() > 0 and _tiered._queued[0] == 1800  # (a copy: x is zero now)
    # an unhashable argument keys by its type; ``out`` by its layout, and the rerun writes into a
    # new tensor of that layout
    y = torch.ones(2, 4, 4)
    out = torch.empty(2, 4, 8)[..., ::2]
    _tiered._submit_loading("filter_forward", (y, [1, 2]), {"out": out})
    key, job = jobs[-1]
    t = torch.float32
    assert key == ("replay", "filter_forward", ((t, (2, 4, 4), (16, 4, 1)), "list"), (("out", (t, (2, 4, 4), (32, 8, 2))),))
    y.zero_()
    seen.clear()
    job()
    job()  # (once)
    (engine, (copy, arg), kwargs), = seen
    assert engine == "cpu" and arg == [1, 2] and torch.equal(copy, torch.ones(2, 4, 4))
    assert list(kwargs) == ["out"] and kwargs["out"] is not out and kwargs["out"].stride() == out.stride()
    assert _tiered._queued[0] == 1800  # its copies released


def test_a_script_that_exits_after_its_first_call_leaves_its_kernels_cached(tmp_path):
    """Exit finishes the job in hand: the engine's import with the first call's rerun, so a
    short script run again finds that call's forward kernels in the cache."""
    code = """
        import torch
        import torchfilters as tf
        x = torch.rand(2, 20, 20, requires_grad=True)
        tf.gradient_magnitude(x, operator="prewitt", mode="wrap").sum().backward()
    """
    _run(code, tmp_path)
    cache = tmp_path / "numba-cache"
    assert any(p.suffix == ".nbc" for p in cache.rglob("*")), sorted(p.name for p in cache.rglob("*"))


def test_reruns_keep_the_callers_layout_and_size():
    """A rerun works on a copy with the call's own sizes and strides (a view with gaps, an
    expanded one, an offset one), so it compiles the kernels of that layout; calls differing only
    in sizes or strides are kinds of their own (sizes choose kernels too: Canny's bands, stencils
    folded onto small planes)."""
    base = torch.arange(2 * 12 * 10, dtype=torch.float64).view(2, 12, 10)
    views = [base[:, ::3, 1::2], base[:1].expand(4, 12, 10), base[1], base.transpose(1, 2), base[:, 2:, 3:]]
    for v in views:
        (c,), _ = _tiered._replay_args((v,), {})
        assert c.shape == v.shape and c.stride() == v.stride() and torch.equal(c, v)
        assert c.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
    keys = {_tiered._call_key("f", (v, "s"), {}) for v in views + [base[:, :6], base[:, :6].contiguous()]}
    assert len(keys) == len(views) + 2
    empty = torch.empty(0, 5)
    (c,), _ = _tiered._replay_args((empty,), {})
    assert c.shape == (0, 5) and _tiered.extent(empty.shape, empty.stride()) == 0


def test_concurrent_equal_calls_queue_one_rerun_and_keep_the_budget(monkeypatch):
    jobs = []
    monkeypatch.setattr(_tiered, "_submit_new", lambda key, job: jobs.append((key, job)) or True)
    monkeypatch.setattr(_tiered, "_replayed", set())
    monkeypatch.setattr(_tiered, "_queued", [0])
    x = torch.rand(64, 64)
    go = threading.Barrier(8)

    def call():
        go.wait()
        _tiered._submit_rerun("filter_forward", (x, "spec"), {}, ("kernel", 1))

    threads = [threading.Thread(target=call) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(jobs) == 1 and _tiered._queued[0] == 64 * 64
    monkeypatch.setattr(_tiered, "_loaded_cpu", lambda: False)
    jobs[0][1]()
    assert _tiered._queued[0] == 0


def test_one_synchronize_readies_a_call_that_chains_kernels(tmp_path):
    """A call that runs several kernels one after another (Canny: smoothing, gradients, the
    edge pass) stops at the first that is not ready; its rerun then compiles the rest, so one
    ``synchronize`` readies the whole call."""
    out = _run("""
        import torch
        import torchfilters as tf
        from torchfilters.backends import reference_canny
        tf.gradient_magnitude(torch.rand(8, 8))  # (the engine loads with this call's rerun)
        assert tf.backends.synchronize(timeout=600)
        ran = []
        edges = reference_canny.canny_edges
        reference_canny.canny_edges = lambda *a, **k: ran.append(1) or edges(*a, **k)
        x = torch.rand(96, 96)
        first = tf.canny(x, sigma=1.5)
        assert tf.backends.synchronize(timeout=600)
        ran.clear()
        again = tf.canny(x, sigma=1.5)
        print("reference after one synchronize:", bool(ran), "same edges:", torch.equal(first, again))
    """, tmp_path)
    assert "reference after one synchronize: False" in out, out


def test_reruns_after_loading_go_by_the_missing_kernel(monkeypatch):
    """After the engine is loaded, a call stopped by a kernel that is not ready queues one rerun
    per such kernel, whatever its sizes (calls of many sizes do not use up the kinds), and past
    the 256 kinds of the loading window."""
    jobs = []
    monkeypatch.setattr(_tiered, "_submit_new", lambda key, job: jobs.append((key, job)) or True)
    monkeypatch.setattr(_tiered, "_replayed", {("kind", i) for i in range(_tiered._REPLAY_KINDS)})
    monkeypatch.setattr(_tiered, "_queued", [0])
    for n in range(5, 40):
        _tiered._submit_rerun("rank_forward", (torch.rand(n, n), "spec"), {}, ("median", 1))
    _tiered._submit_rerun("canny_fused", (torch.rand(9, 9),), {}, ("nms", 2))
    assert [k for k, _ in jobs] == [("rerun", ("median", 1)), ("rerun", ("nms", 2))]


def test_background_reruns_launch_serially(monkeypatch):
    """In the background thread a launch runs every chunk there (a pool thread blocked in numba's
    compiler lock would hold up foreground calls whose kernels are ready)."""
    from torchfilters.backends.cpu import threads

    calls = []
    monkeypatch.setattr(_tiered, "_thread", threading.current_thread())
    threads._launch(lambda it0, it1: calls.append((threading.current_thread().name, it0, it1)), (), 64, 2, False)
    assert calls == [(threading.current_thread().name, 0, 64)]
    monkeypatch.setattr(_tiered, "_thread", None)
    calls.clear()
    threads._launch(lambda it0, it1: calls.append((threading.current_thread().name, it0, it1)), (), 64, 2, False)
    assert len(calls) > 1 and sum(b - a for _, a, b in calls) == 64
