"""The kernel cache in a hostile environment (found by a review): unreadable cache files are
misses, a save that fails is a warning, nowhere writable still runs, a read-only package folder
filled by ``warmup`` is read, a fork never inherits numba's compiler lock held, and the exit
never waits on another process's compile.

Cheap on purpose: one rank kernel (``maximum_filter1d``'s, a second or two to compile) where a
compile is needed, unit checks of ``cache._Locked`` elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

pytest.importorskip("numba")

from torchfilters.backends.cpu import cache  # noqa: E402

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

#: one cheap kernel, its result checked against the reference engine; then what was compiled and
#: loaded from the cache (``warmup._counts``) and the warnings' first words
_PROBE = """
import warnings
warnings.simplefilter("always")
import torch, torchfilters as tf
from torchfilters.backends.cpu import cache, warmup
x = torch.rand(2, 9, 11)
with warnings.catch_warnings(record=True) as seen:
    y = tf.maximum_filter1d(x, 3, backend="cpu")
assert torch.equal(y, tf.maximum_filter1d(x, 3, backend="reference"))
print("counts", *warmup._counts())
print("dir", cache.cache_dir())
for w in seen:
    print("warning", str(w.message)[:60])
"""


def _python(code: str, env: dict, timeout=600) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env={**os.environ, "TORCHFILTERS_COMPILE": "wait", **env}, timeout=timeout)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    return r.stdout


def _counts(out: str) -> tuple[int, int]:
    line = next(s for s in out.splitlines() if s.startswith("counts "))
    compiled, loaded = map(int, line.split()[1:])
    return compiled, loaded


def test_unreadable_cache_files_are_misses_and_are_written_anew(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "c")}
    first = _python(_PROBE, env)
    assert _counts(first)[0] > 0
    files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "c") for f in fs]
    index = [f for f in files if f.endswith(".nbi")]
    data = [f for f in files if f.endswith(".nbc")]
    assert index and data
    for i, f in enumerate(index):  # empty, garbage, truncated
        with open(f, "r+b") as h:
            h.truncate([0, 40, 7][i % 3]) if i % 3 != 1 else h.write(os.urandom(64))
    for f in data:
        with open(f, "r+b") as h:
            h.truncate(10)
    second = _python(_PROBE, env)  # (before: EOFError / UnpicklingError from every call)
    assert _counts(second)[0] > 0 and "warning torchfilters: ignoring an unreadable kernel cache" in second
    third = _python(_PROBE, env)
    assert _counts(third)[0] == 0 and _counts(third)[1] > 0 and "warning" not in third  # written anew


def test_a_save_that_fails_is_a_warning_not_an_error(tmp_path):
    """A full disk (ENOSPC from the data file's write): the call returns its result."""
    code = textwrap.dedent("""
        import errno
        from torchfilters.backends.cpu import cache
        def full(self, name, data):
            raise OSError(errno.ENOSPC, "No space left on device")
        cache._Locked._save_data = full
    """) + _PROBE
    out = _python(code, {"NUMBA_CACHE_DIR": str(tmp_path / "c")})
    assert _counts(out)[0] > 0
    assert "warning torchfilters: could not save a compiled kernel in" in out, out


def test_no_writable_folder_still_runs(tmp_path):
    """Nowhere to cache (a copy of the package whose ``__pycache__`` folders cannot be made --
    plain files there, which binds root too -- and the per-user folder below a plain file): the
    engine compiles what it needs in each process, and reports no cache folder."""
    site = tmp_path / "site"
    shutil.copytree(os.path.join(SRC, "torchfilters"), site / "torchfilters",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for d, _, _ in os.walk(site):
        open(os.path.join(d, "__pycache__"), "w").close()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE")}
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(blocked), HOME=str(blocked), TORCHFILTERS_COMPILE="wait")
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]  # (before: "cannot cache function ...: no locator available")
    assert "dir None" in r.stdout and _counts(r.stdout)[0] > 0, r.stdout


def test_a_read_only_package_folder_is_read(tmp_path, monkeypatch):
    """Kernels ``warmup`` saved in the package's own folder (an image built by another user, now
    read-only) load in a process that caches elsewhere."""
    tree, elsewhere = tmp_path / "tree", tmp_path / "elsewhere"
    tree.mkdir()
    elsewhere.mkdir()
    stamp = cache.source_stamp()
    cache._Locked(str(tree), "rank_kernels._k_vh-1.py311", stamp).save("key", ("the", "kernel"))
    monkeypatch.setattr(cache, "_IN_TREE", str(tree))
    monkeypatch.setattr(cache.config, "CACHE_DIR", "")  # (the per-user folder, not NUMBA_CACHE_DIR)
    here = cache._Locked(str(elsewhere), "rank_kernels._k_vh-1.py311", stamp)
    assert here.load("key") == ("the", "kernel")
    assert getattr(cache._held, "f", None) is None  # (a hit: no compile lock taken)
    assert cache._Locked(str(elsewhere), "rank_kernels._k_vh-1.py311", "another stamp").load("key") is None
    got = here.load("other key")  # a miss in both: this thread compiles it
    assert got is None and cache._held.f is not None
    cache._release_compile_lock()


def test_a_relative_numba_cache_dir_is_resolved_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cache.config, "CACHE_DIR", "relcache-for-this-test")
    probe = os.path.join(cache._PKG_DIR, "prims.py")

    def f():  # pragma: no cover - a stand-in from the package
        pass

    f.__code__ = f.__code__.replace(co_filename=probe)
    a = cache.UserProvidedLocator.from_function(f, probe).get_cache_path()
    os.makedirs(tmp_path / "sub")
    monkeypatch.chdir(tmp_path / "sub")
    b = cache.UserProvidedLocator.from_function(f, probe).get_cache_path()
    assert a == b and os.path.isabs(a) and a.startswith(str(tmp_path / "relcache-for-this-test"))


def test_a_fork_waits_for_another_threads_compile():
    """A thread inside a numba compile (it holds numba's compiler lock) while another forks: the
    child's first compile used to wait for that lock forever."""
    code = """
        import os, threading, time
        import torchfilters  # (its fork hooks)
        import numba
        from numba.core.compiler_lock import global_compiler_lock
        held = threading.Event()

        def compiling():
            with global_compiler_lock:
                held.set()
                time.sleep(1.0)

        t = threading.Thread(target=compiling)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if numba.njit(lambda v: v + 1)(1) == 2 else 3)
        for _ in range(600):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, 9)
            raise SystemExit("the child hung")
        t.join()
        print("child", os.waitstatus_to_exitcode(status))
    """
    assert "child 0" in _python(code, {})


def test_the_exit_does_not_wait_on_another_process_compile(tmp_path):
    """The background thread waits for another process's compile of a kernel (a lock that
    process holds, stopped); once the main thread has returned it gives up at once."""
    lock = tmp_path / "k.compiling"
    with open(lock, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code = f"""
            import threading
            from torchfilters.backends.cpu import cache
            def wait():
                with open({str(lock)!r}, "a+b") as f:
                    print("waited", cache._wait_for(f), flush=True)
            threading.Thread(target=wait).start()
        """
        t0 = time.monotonic()
        out = _python(code, {})
        assert "waited False" in out and time.monotonic() - t0 < 60  # (before: cache.COMPILE_WAIT)


def test_the_cpu_engine_is_unavailable_without_numba_s_compiler():
    code = """
        import torch, torchfilters as tf
        x = torch.rand(5, 6)
        assert torch.equal(tf.gaussian_filter(x, 1.0), tf.gaussian_filter(x, 1.0, backend="reference"))
        try:
            tf.gaussian_filter(x, 1.0, backend="cpu")
        except tf.BackendUnavailableError as e:
            print("unavailable:", "unset NUMBA_DISABLE_JIT" in str(e))
    """
    assert "unavailable: True" in _python(code, {"NUMBA_DISABLE_JIT": "1", "TORCHFILTERS_COMPILE": "background"})


def test_warmup_with_a_bad_compile_mode_is_one_line():
    r = subprocess.run([sys.executable, "-m", "torchfilters", "warmup"], capture_output=True, text=True,
                       env={**os.environ, "TORCHFILTERS_COMPILE": "sometimes"}, timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("torchfilters: error: TORCHFILTERS_COMPILE='sometimes'"), r.stderr
    assert "Traceback" not in r.stderr


def test_warmup_in_worker_processes_compiles_only_the_ops_named(tmp_path):
    """``torchfilters warmup --only OP --jobs 2``: two worker processes compile those ops' kernels
    into the cache, between them, and nothing else; a later process loads, compiling nothing."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "c"), "TORCHFILTERS_COMPILE": "wait"}
    r = subprocess.run([sys.executable, "-m", "torchfilters", "warmup", "--only", "maximum_filter1d", "--jobs", "2"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = r.stdout.strip().splitlines()[-1]
    assert "kernel(s) compiled, 0 loaded from the cache, 1 calls" in summary and "2 processes" in summary, summary
    assert int(summary.split("warmup: ")[1].split()[0]) > 0
    index = [f for _, _, fs in os.walk(tmp_path / "c") for f in fs if f.endswith(".nbi")]
    assert index and all(f.startswith(("rank_kernels.", "prims.")) for f in index), index  # (that op's only)
    assert _counts(_python(_PROBE, {"NUMBA_CACHE_DIR": str(tmp_path / "c")}))[0] == 0


def test_a_failed_warmup_worker_is_a_clear_error():
    """A worker whose call raises ends the run with a RuntimeError naming the call, the worker's
    exit status and the end of its stderr (here an index past the calls)."""
    import torch

    from torchfilters.backends.cpu import warmup as wu

    with pytest.raises(RuntimeError, match=r"(?s)a warmup worker failed in 'float32 no such call' "
                                           r"\(exit status 1\):.*IndexError"):
        wu._in_workers([(torch.float32, 10**6, "no such call")], 2, None)


def test_warmup_arguments():
    import torch

    from torchfilters.backends.cpu import warmup as wu

    with pytest.raises(ValueError, match="jobs must be at least 1; got 0"):
        wu.warmup(jobs=0)
    with pytest.raises(TypeError, match="jobs must be an int; got float"):
        wu.warmup(jobs=2.0)
    with pytest.raises(TypeError, match="jobs must be an int; got bool"):
        wu.warmup(jobs=True)
    with pytest.raises(ValueError, match=r"only: 'blur' is not an op of the warmup; its ops: canny, .*gaussian_filter"):
        wu.warmup(only=["gaussian_filter", "blur"])
    with pytest.raises(ValueError, match="dtype must be one of"):
        wu.warmup([torch.int32])
    from torchfilters import functional

    for dtype in wu.DTYPES:  # every public op has calls of its own (canny: float32 / float64 only)
        named = {wu._label_op(label) for _, _, label in wu._plan([dtype], 1, None)}
        assert named >= set(functional.__all__) - ({"canny"} if dtype in (torch.float16, torch.bfloat16) else set())
    r = subprocess.run([sys.executable, "-m", "torchfilters", "warmup", "--jobs", "0"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr == "torchfilters: error: argument --jobs/-j: must be at least 1; got 0\n", \
        r.stderr
    r = subprocess.run([sys.executable, "-m", "torchfilters", "warmup", "--only", "blur"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith(
        "torchfilters: error: argument --only: 'blur' is not an op of the warmup; its ops: canny, "), r.stderr


def test_a_save_cut_short_never_leaves_an_index_naming_an_older_kernel(tmp_path, monkeypatch):
    """A kernel's data file is written before the index that names it: a process ended between
    the two (killed; a CLI run ended at once after Ctrl-C) left, in numba's order, a new index
    naming the data file of an older source (data names start again at 1 under a new stamp), and
    every later process loaded that wrong kernel."""
    old = cache._Locked(str(tmp_path), "direct.kernel-1.py311", "old stamp")
    old.save("old key", "the old kernel")
    assert old.load("old key") == "the old kernel"
    new = cache._Locked(str(tmp_path), "direct.kernel-1.py311", "new stamp")

    def killed(self, name, data):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(cache._Locked, "_save_data", killed)
        with pytest.raises(KeyboardInterrupt):
            new.save("new key", "the new kernel")
    assert cache.caching.IndexDataCacheFile.load(new, "new key") is None  # (numba's order: the old kernel)
    new.save("new key", "the new kernel")
    assert cache.caching.IndexDataCacheFile.load(new, "new key") == "the new kernel"


def test_an_engine_that_fails_to_import_for_a_bug_says_so(monkeypatch):
    """Only a missing dependency (ImportError, OSError) makes an engine quietly unavailable; any
    other error of its import is raised, not hidden behind the reference engine."""
    from torchfilters import backends

    monkeypatch.delitem(backends._loaded, "triton", raising=False)

    def broken(name, package=None):
        raise RuntimeError("a bug in the engine")

    monkeypatch.setattr(backends.importlib, "import_module", broken)
    with pytest.raises(RuntimeError, match="a bug in the engine"):
        backends.get("triton")
    assert "triton" not in backends._loaded


def test_a_fork_inside_a_compile_does_not_wait_for_the_background_job():
    """A fork from a signal handler that interrupted this thread's numba compile, while the
    background job waits for that compile's lock: the fork waited for the job, which waited for
    the forking thread -- forever."""
    code = """
        import os, threading, time
        import torchfilters
        import numba
        from numba.core.compiler_lock import global_compiler_lock
        from torchfilters.backends import _tiered
        waiting = threading.Event()

        def job():  # the background thread: holds _busy, waits for numba's lock
            with _tiered._busy:
                waiting.set()
                with global_compiler_lock:
                    pass

        with global_compiler_lock:  # this thread, inside a compile
            t = threading.Thread(target=job)
            t.start()
            waiting.wait()
            time.sleep(0.2)
            pid = os.fork()  # (as from a signal handler)
            if pid == 0:
                os._exit(0)
            _, status = os.waitpid(pid, 0)
        t.join()
        print("forked", os.waitstatus_to_exitcode(status))
    """
    assert "forked 0" in _python(code, {}, timeout=60)


def test_a_data_file_removed_under_its_index_is_a_quiet_miss(tmp_path):
    files = cache._Locked(str(tmp_path), "direct.kernel-1.py311", "a stamp")
    files.save("key", "the kernel")
    (data,) = tmp_path.glob("*.nbc")
    data.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.caching.IndexDataCacheFile.load(files, "key") is None
