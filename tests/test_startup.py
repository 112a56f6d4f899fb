"""Start-up: a light import, kernels that do not depend on the image size, a disk cache that
works for read-only installs, and worker processes that load kernels instead of compiling.

Most cases run in a fresh interpreter: what they check is what a new process does.
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch

import torchfilters as tf

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def _python(code: str, env=None, timeout=900):
    e = dict(os.environ if env is None else env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                       timeout=timeout)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    return r.stdout


def test_import_is_light():
    # torch._dynamo (about 1.5 s), numba, SciPy and the engines load when first needed
    out = _python("""
        import sys
        import torchfilters
        heavy = [m for m in ("torch._dynamo", "numba", "scipy", "triton", "torchfilters.backends.cpu")
                 if m in sys.modules]
        print("heavy:", heavy)
    """)
    assert "heavy: []" in out, out


def test_first_calls_do_not_import_dynamo():
    """``torch.library`` wraps custom-op kernels in a dynamo guard that imports ``torch._dynamo``
    (1-2 s) on their first call; the ops defer it (``_ops.defer_dynamo``) until something else
    imports dynamo.  Every op family, forward, backward and ``out=``, on the reference engine and
    the CPU engine; then ``torch.compile`` of the same op in the same process still traces it."""
    out = _python("""
        import sys, time
        import torch
        import torchfilters as tf
        t0 = time.perf_counter()
        x = torch.rand(2, 9, 11, dtype=torch.float64, requires_grad=True)
        for backend in ("reference", "cpu"):
            ys = [tf.gradient_magnitude(x, backend=backend), tf.median_filter(x, 3, backend=backend),
                  tf.selective_blur(x, 0.5, sigma=1.0, backend=backend)]
            torch.autograd.grad(sum(y.sum() for y in ys), x, create_graph=True)[0].sum().backward()
            tf.gaussian_filter(x.detach(), 1.0, out=torch.empty_like(x), backend=backend)
            tf.canny(x.detach()[0].float(), backend=backend)
        print("dynamo:", "torch._dynamo" in sys.modules)
        import torch._dynamo
        f = torch.compile(lambda t: tf.gradient_magnitude(t, backend="reference"), backend="eager", fullgraph=True)
        z = x.detach()
        assert torch.equal(f(z), tf.gradient_magnitude(z, backend="reference"))
        print("compiled: ok")
    """)
    assert "dynamo: False" in out and "compiled: ok" in out, out


def test_deferred_dynamo_guard_hands_over_to_torch():
    """Once ``torch._dynamo`` is imported the stand-in removes itself and torch's own guard
    (``torch._dynamo.disable``) wraps the kernel again."""
    out = _python("""
        import sys
        import torch
        from torchfilters import _ops
        kernels = [w.__wrapped__ for w in _ops.filter_op._backend_fns.values()]
        assert kernels and all(getattr(k, "__dynamo_disable") is not None for k in kernels)
        x = torch.rand(5, 5, dtype=torch.float64, requires_grad=True)  # (through the custom op)
        import torchfilters as tf
        tf.gradient_magnitude(x)
        stand_in = [getattr(k, "__dynamo_disable") for k in kernels]
        import torch._dynamo
        tf.gradient_magnitude(x)
        after = [getattr(k, "__dynamo_disable", None) for k in kernels]
        print("replaced:", all(a is not None and a is not s for a, s in zip(after, stand_in)))
    """)
    assert "replaced: True" in out, out


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["edges", "--help"], ["warmup", "--help"]])
def test_version_and_help_load_no_engine(argv):
    pytest.importorskip("imageio")
    out = _python(f"""
        import sys
        from torchfilters import cli
        try:
            cli.main({argv!r})
        except SystemExit as e:
            assert e.code == 0, e.code
        print("heavy:", [m for m in ("numba", "scipy", "skimage", "imageio", "torch._dynamo") if m in sys.modules])
    """)
    assert "heavy: []" in out, out


def test_a_small_command_line_job_loads_no_engine(tmp_path):
    """A job the reference engine does in well under a second (by its estimate of each file) never
    loads the fused engine: numba's import and the kernels' load would cost more, slow the calls
    (the GIL) and hold up the exit.  Nor does a job with no file left after the next one, which
    would run on the reference engine while the engine loads.  A larger one starts loading it in
    the background after its first file."""
    import numpy as np

    for k in range(3):
        np.save(tmp_path / f"in{k}.npy", np.random.default_rng(k).random((2, 30, 40), dtype=np.float32))
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHFILTERS_COMPILE", "TORCHFILTERS_BACKEND")}
    out = _python(f"""
        import sys
        import numpy as np, torch
        import torchfilters as tf
        from torchfilters import cli
        from torchfilters.cli import run
        d = {str(tmp_path)!r}
        ins = [d + f"/in{{k}}.npy" for k in range(3)]
        def job(out, files):
            assert cli.main(["edges", *files, "--out", d + out, "--format", "npy", "--quiet"]) == 0
            tf.backends.synchronize()
            return "numba" in sys.modules, "torchfilters.backends.cpu" in sys.modules
        print("small:", *job("/a", ins))
        for k in range(3):
            x = torch.from_numpy(np.load(ins[k]))
            y = torch.from_numpy(np.load(d + f"/a/in{{k}}_edges.npy"))
            assert torch.equal(y, tf.gradient_magnitude(x, operator="sobel", backend="reference")), k
        run._SMALL_JOB_S = 1e-12  # (any file is worth loading the engine for ...)
        print("nothing after the next:", *job("/b", ins[:2]))  # (... with a file left after the next)
        print("larger:", *job("/c", ins))
        for k in range(3):
            x = torch.from_numpy(np.load(ins[k]))
            y = torch.from_numpy(np.load(d + f"/c/in{{k}}_edges.npy"))
            torch.testing.assert_close(y, tf.gradient_magnitude(x, operator="sobel", backend="reference"))
    """, env)
    assert "small: False False" in out and "nothing after the next: False False" in out, out
    assert "larger: True True" in out, out


def _signatures():
    from torchfilters.backends.cpu import direct, warmup

    return len(direct._d3_kernels), sum(len(k.overloads) for k in warmup._kernels())


def test_no_kernel_variant_per_image_size():
    pytest.importorskip("numba")
    shapes = [(4, 28, 28), (2, 100, 100), (1, 300, 7), (3, 2, 2), (1, 1, 5), (2, 65, 3), (1, 7, 1)]
    calls = [
        lambda x: tf.gradient_magnitude(x, operator="sobel"),
        lambda x: tf.gradient_magnitude(x, mode="mirror"),
        lambda x: tf.derivative(x, -2, operator="scharr", mode="nearest"),
        lambda x: tf.gradient(x, mode="wrap"),
        lambda x: tf.gaussian_filter(x, 1.5, mode="constant", cval=2.0),
        lambda x: tf.selective_blur(x, 0.5),
    ]
    # rank filters: a plane large enough to be split in row bands needs the backward's band merge
    # (a second kernel, chosen at run time and built by ``warmup``): warm both
    rank_calls = [
        lambda x: tf.median_filter(x, 3),
        lambda x: tf.maximum_filter(x, (2, 5), mode="constant"),
        lambda x: tf.percentile_filter(x, 20, footprint=[[1, 0, 1], [0, 1, 1]]),
        lambda x: tf.median_filter(x, 9),
    ]
    for call in calls + rank_calls:
        for shape in shapes[:1] + ([(1, 300, 300)] if call in rank_calls else []):
            x = torch.rand(*shape, requires_grad=True)
            call(x).sum().backward()
        before = _signatures()
        for shape in shapes[1:]:
            x = torch.rand(*shape, requires_grad=True)
            call(x).sum().backward()
            assert _signatures() == before, f"a new kernel variant for {shape}"


def test_read_only_install_caches_per_user():
    """A package folder the process cannot write to (system site-packages, an image built by
    another user): kernels are cached in the per-user cache folder, and a second process loads
    them.  Root writes through file modes, so each ``__pycache__`` of the copy is a plain file
    as well: no cache folder can be made there, by anyone."""
    pytest.importorskip("numba")
    root = tempfile.mkdtemp(prefix="tf-readonly-")
    try:
        pkg = os.path.join(root, "site")
        shutil.copytree(os.path.join(SRC, "torchfilters"), os.path.join(pkg, "torchfilters"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        home = os.path.join(root, "home")
        os.makedirs(home)
        for d, _, files in os.walk(pkg):
            with open(os.path.join(d, "__pycache__"), "w"):
                pass
            for f in files + ["__pycache__"]:
                os.chmod(os.path.join(d, f), 0o444)
        for d, _, _ in os.walk(pkg):
            os.chmod(d, 0o555)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE")}
        env.update(PYTHONPATH=pkg, HOME=home, XDG_CACHE_HOME=os.path.join(home, ".cache"))
        code = """
            import torch, torchfilters as tf
            from torchfilters.backends.cpu import cache, warmup
            assert tf.__file__.startswith({pkg!r}), tf.__file__
            x = torch.rand(2, 9, 11)
            torch.testing.assert_close(tf.gradient_magnitude(x), tf.gradient_magnitude(x, backend="reference"))
            print("dir", cache.cache_dir())
            print("counts", *warmup._counts())
        """.format(pkg=pkg)
        first = _python(code, env=env)
        assert f"dir {home}" in first, first  # the per-user folder, not the package's
        assert "counts 0 " not in first, first  # compiled ...
        second = _python(code, env=env)
        assert "counts 0 " in second and "counts 0 0" not in second, second  # ... then loaded
        cached = [f for _, _, fs in os.walk(home) for f in fs if f.endswith(".nbi")]
        assert cached, "no cache index in the per-user folder"
    finally:
        for d, _, _ in os.walk(root):
            os.chmod(d, 0o755)
        shutil.rmtree(root, ignore_errors=True)


_SPAWN = """
import torch
import torchfilters as tf
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        from torchfilters.backends.cpu import warmup

        y = tf.gradient_magnitude(torch.rand(3, 28, 28), operator="sobel")
        return y, torch.tensor(warmup._counts()[0])  # kernels this worker compiled


if __name__ == "__main__":
    tf.gradient_magnitude(torch.rand(3, 28, 28), operator="sobel")  # compiled (or loaded) once here
    loader = DataLoader(Samples(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    compiled = [int(c.max()) for _, c in loader]
    print("compiled in workers:", max(compiled))
"""


def test_spawned_workers_load_kernels_instead_of_compiling(tmp_path):
    pytest.importorskip("numba")
    script = tmp_path / "spawn_loader.py"
    script.write_text(_SPAWN)
    # a cache folder of its own: other test processes saving kernels of the same source file
    # rewrite its index concurrently (numba's cache is safe for that, but an entry can be lost
    # and compiled again)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "compiled in workers: 0" in r.stdout, r.stdout


@pytest.mark.parametrize("locked", [True, False])
def test_processes_saving_kernels_at_once_keep_every_entry(tmp_path, locked):
    # numba's index is a read-modify-write of one file per function (every direct kernel's
    # closure shares it): two writers that both read it before either wrote lost an entry.
    # Two threads stand in for two processes (each opens the lock file: flock excludes them);
    # the first pauses between reading the index and writing it.  Unlocked (numba's class, the
    # control) one entry is lost; locked, both stay.
    import threading

    from numba.core import caching

    from torchfilters.backends.cpu import cache

    base = cache._Locked.__mro__[1]  # numba's own IndexDataCacheFile
    cls = cache._Locked if locked else base
    loaded = threading.Event()

    class Slow(cls):
        def _load_index(self):
            overloads = super()._load_index()
            if self.pause:
                loaded.set()
                threading.Event().wait(0.3)
            return overloads

    def writer(key, pause):
        f = Slow(str(tmp_path), "direct.kernel-1.py311", cache.source_stamp())
        f.pause = pause
        f.save(key, ("data", key))

    a = threading.Thread(target=writer, args=("a", True))
    a.start()
    assert loaded.wait(10)
    b = threading.Thread(target=writer, args=("b", False))
    b.start()
    a.join()
    b.join()
    index = base(str(tmp_path), "direct.kernel-1.py311", cache.source_stamp())._load_index()
    if locked:
        assert sorted(index) == ["a", "b"], index
        assert [base(str(tmp_path), "direct.kernel-1.py311", cache.source_stamp()).load(k) for k in "ab"] == [
            ("data", "a"), ("data", "b")]
    else:
        assert len(index) == 1, index  # the race the lock closes (if numba fixes it, drop this case)
    assert caching.IndexDataCacheFile is cache._Locked


_TWIN = r"""
import os, sys, time
import numba.core.event as ev
import torch, torchfilters as tf
from torchfilters import backends

backends.get("cpu")
depth, compiled = [0], set()

class Top(ev.Listener):  # the compiles this process starts itself (depth 0)
    def on_start(self, e):
        if depth[0] == 0:
            f = e.data["dispatcher"].py_func
            cells = tuple(c.cell_contents for c in f.__closure__ or ())
            compiled.add(f"{f.__module__}.{f.__qualname__}{cells}{tuple(e.data['args'])}")
        depth[0] += 1

    def on_end(self, e):
        depth[0] -= 1

ev.register("numba:compile", Top())
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
tf.gradient_magnitude(torch.rand(2, 9, 9), operator="sobel", backend="cpu")
for k in sorted(compiled):
    print("compiled", k)
"""


def test_processes_compile_each_kernel_once_between_them(tmp_path):
    """Two processes that miss an empty cache at the same moment compile each kernel once
    between them: the second waits for the first's save and loads it (``cache._Locked``),
    instead of both compiling (DataLoader / dask / xdist workers started together)."""
    pytest.importorskip("numba")
    script = tmp_path / "twin.py"
    script.write_text(_TWIN)
    go = tmp_path / "go"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), TORCHFILTERS_COMPILE="wait")
    procs = [subprocess.Popen([sys.executable, str(script), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.write_text("")
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-3000:] for _, e in outs]
    sets = [{line for line in o.splitlines() if line.startswith("compiled")} for o, _ in outs]
    assert sets[0] | sets[1], "nothing was compiled: the cache was not empty"
    assert not sets[0] & sets[1], sorted(sets[0] & sets[1])


@pytest.mark.parametrize("ending", ["saved", "declined", "failed", "interrupted"])
def test_compile_lock_is_released_however_the_compile_ends(tmp_path, ending):
    """The compile lock a cache miss takes (``cache._Locked.load``) is held through the compile
    call that missed (numba's ``Dispatcher.compile``, wrapped by ``cache._compile``), nested
    compiles included, and released when that call returns or raises: after numba saved the
    kernel, where numba declines to cache it (no ``save``), when the compile fails, and on an
    interrupt.  Another process is never left waiting for it."""
    import fcntl
    import glob

    from torchfilters.backends.cpu import cache

    files = cache._Locked(str(tmp_path), "direct.kernel-1.py311", cache.source_stamp())

    def free():
        (lock,) = glob.glob(str(tmp_path / "*.compiling"))
        with open(lock, "a+b") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    def inner(self, sig):  # a kernel the outer one calls: its miss takes no lock (one is held)
        assert files.load("inner") is None
        assert not free()
        return "inner"

    def outer(self, sig):
        assert files.load("k") is None  # the miss: this thread now compiles "k"
        assert not free()
        assert cache._compile(None, "sig", _numba_compile=inner) == "inner"
        assert not free()  # (still held: the outer compile has not returned)
        if ending == "saved":
            files.save("k", "code")
        elif ending == "failed":
            raise ValueError("the compile failed")
        elif ending == "interrupted":
            raise KeyboardInterrupt
        return "kernel"

    if ending in ("saved", "declined"):
        assert cache._compile(None, "sig", _numba_compile=outer) == "kernel"
    else:
        with pytest.raises(ValueError if ending == "failed" else KeyboardInterrupt):
            cache._compile(None, "sig", _numba_compile=outer)
    assert free()
    assert getattr(cache._held, "f", None) is None
    assert (files.load("k") == "code") if ending == "saved" else free()


def test_a_stuck_compile_is_waited_for_only_so_long(tmp_path, monkeypatch):
    """A process that holds a kernel's compile lock and never finishes (stopped, say) delays
    another process's miss of that kernel by at most ``cache.COMPILE_WAIT``: then it compiles."""
    import fcntl
    import time

    from torchfilters.backends.cpu import cache

    files = cache._Locked(str(tmp_path), "direct.kernel-1.py311", cache.source_stamp())
    assert files.load("k") is None  # this thread holds "k"
    held = cache._held.f
    cache._held.f = None  # another thread, as far as the lock goes
    try:
        monkeypatch.setattr(cache, "COMPILE_WAIT", 0.3)
        t0 = time.monotonic()
        assert files.load("k") is None  # gave up waiting: compiles, holding nothing
        assert 0.3 <= time.monotonic() - t0 < 5
        assert getattr(cache._held, "f", None) is None
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        held.close()
