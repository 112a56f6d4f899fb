"""Compile every kernel variant of the CPU engine into numba's disk cache, ahead of use.

A kernel is compiled the first time a call needs it (1-3 s each) and then loaded from the
disk cache in later processes.  ``warmup`` runs one small call of every op, operator, mode
class, epilogue and direction (forward and backward) per dtype, so that container images,
CI runners and cluster nodes never compile at run time.  ``torchfilters warmup`` is its
command line.

The calls are independent, so ``jobs`` worker processes can run them side by side: the cache's
file locks compile each kernel once between them (a process that finds a kernel being compiled
waits and loads it).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Iterable, Iterator, NamedTuple, Optional

import torch

from .. import _tiered
from . import cache, direct, separable_stack

#: dtypes the engine runs
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_OPERATORS = ("central", "sobel", "scharr", "prewitt")
#: one mode per column class of the direct path (EDGE, MIRR, FAR) and the tiled engine's constant
_MODES = ("reflect", "mirror", "wrap", "constant")


class WarmupReport(NamedTuple):
    """What :func:`warmup` did: ``calls`` op calls, which ``compiled`` kernels (and their
    helper functions) and ``loaded`` others from the disk cache, in ``seconds``; kernels are
    cached in ``cache_dir``."""

    calls: int
    compiled: int
    loaded: int
    seconds: float
    cache_dir: Optional[str]


def _calls(dtype: torch.dtype) -> Iterator[tuple[str, Callable[[], object]]]:
    """(label, call) for every kernel variant of one dtype."""
    import torchfilters as tf

    small = torch.rand(2, 7, 9).to(dtype)  # several planes: the stacked tiled layout
    wide = torch.rand(3, 260).to(dtype)  # a plane >= 256 wide: the streaming variant (forced)

    def fwd_bwd(fn):
        def run():
            x = small.detach().requires_grad_(True)
            fn(x).sum().backward()

        return run

    def streamed(fn):
        def run():
            with _streaming():
                fn(wide)

        return run

    for mode in _MODES:
        for op in _OPERATORS:
            for nz in (False, True):
                kw = dict(operator=op, mode=mode, normalized=nz)
                for axis in (-1, -2):
                    yield f"derivative {op} {mode} axis={axis}", fwd_bwd(
                        lambda t, a=axis, kw=kw: tf.derivative(t, a, **kw))
                    if mode != "constant":
                        yield f"derivative {op} {mode} axis={axis} (streaming)", streamed(
                            lambda t, a=axis, kw=kw: tf.derivative(t, a, **kw))
                yield f"gradient {op} {mode}", fwd_bwd(lambda t, kw=kw: tf.gradient(t, **kw))
                for name in ("gradient_magnitude",) + (() if nz else ("gradient_direction",)):
                    fn = getattr(tf, name)
                    kw1 = kw if name == "gradient_magnitude" else dict(operator=op, mode=mode)
                    yield f"{name} {op} {mode}", fwd_bwd(lambda t, fn=fn, kw=kw1: fn(t, **kw))
                    if mode != "constant":
                        yield f"{name} {op} {mode} (streaming)", streamed(lambda t, fn=fn, kw=kw1: fn(t, **kw))
        yield f"correlate {mode}", fwd_bwd(lambda t, m=mode: tf.correlate(t, [[1.0, 2.0], [3.0, 4.0]], mode=m))
        # the direct path's other forms: a sum of two stencils, and one 3-tap pass of each kind
        yield f"laplace {mode}", fwd_bwd(lambda t, m=mode: tf.laplace(t, mode=m))
        if mode != "constant":
            yield f"laplace {mode} (streaming)", streamed(lambda t, m=mode: tf.laplace(t, mode=m))
        for taps in ((1.0, -2.0, 0.5), (1.0, 2.0, 1.0), (1.0, 0.0, -1.0)):  # general, symmetric, antisymmetric
            for axis in (-1, -2):
                yield f"correlate1d {taps} axis={axis} {mode}", fwd_bwd(
                    lambda t, w=taps, a=axis, m=mode: tf.correlate1d(t, w, axis=a, mode=m))
        yield f"gaussian_filter {mode}", fwd_bwd(lambda t, m=mode: tf.gaussian_filter(t, 1.0, mode=m))
        for nz in (False, True):
            yield f"selective_blur {mode} normalized={nz}", fwd_bwd(
                lambda t, m=mode, nz=nz: tf.selective_blur(t, 0.5, mode=m, normalized=nz))
        # every other public linear op has calls of its own, so that ``only`` takes any op's name
        # (most share their kernels with the calls above: then they only load them)
        for name in ("sobel", "prewitt", "scharr"):
            for axis in (-1, -2):
                yield f"{name} {mode} axis={axis}", fwd_bwd(
                    lambda t, fn=getattr(tf, name), a=axis, m=mode: fn(t, a, mode=m))
        yield f"convolve {mode}", fwd_bwd(lambda t, m=mode: tf.convolve(t, [[1.0, 2.0], [3.0, 4.0]], mode=m))
        for axis in (-1, -2):
            yield f"convolve1d axis={axis} {mode}", fwd_bwd(
                lambda t, a=axis, m=mode: tf.convolve1d(t, (1.0, -2.0, 0.5), axis=a, mode=m))
            yield f"gaussian_filter1d axis={axis} {mode}", fwd_bwd(
                lambda t, a=axis, m=mode: tf.gaussian_filter1d(t, 1.0, axis=a, mode=m))
            yield f"uniform_filter1d axis={axis} {mode}", fwd_bwd(
                lambda t, a=axis, m=mode: tf.uniform_filter1d(t, 3, axis=a, mode=m))
        yield f"uniform_filter {mode}", fwd_bwd(lambda t, m=mode: tf.uniform_filter(t, 3, mode=m))
        yield f"gaussian_laplace {mode}", fwd_bwd(lambda t, m=mode: tf.gaussian_laplace(t, 1.0, mode=m))
        yield f"gaussian_gradient_magnitude {mode}", fwd_bwd(
            lambda t, m=mode: tf.gaussian_gradient_magnitude(t, 1.0, mode=m))
    # the volume engine (``volume.py``): one kernel per dtype runs every 3-axis spec, plus the blend
    # variant's masked-gradient kernel
    yield "gradient_magnitude sobel axes=(-3, -2, -1)", fwd_bwd(
        lambda t: tf.gradient_magnitude(t.unsqueeze(0), operator="sobel", axes=(-3, -2, -1)))
    yield "selective_blur axes=(-3, -2, -1)", fwd_bwd(lambda t: tf.selective_blur(t, 0.5, axes=(-3, -2, -1)))
    yield "correlate 3-D (dense)", fwd_bwd(lambda t: tf.correlate(t.unsqueeze(0), [[[1.0, 2.0]], [[3.0, 4.0]]],
                                                                  axes=(-3, -2, -1)))
    if dtype in separable_stack.DTYPES:  # many planes a few samples wide: a plane a lane
        yield "gaussian_filter (stacks of small planes)", lambda: tf.gaussian_filter(torch.rand(16, 8, 8).to(dtype), 1.0)
    # sums of two Gaussians (unsharp mask, difference of Gaussians)
    yield "unsharp_mask", fwd_bwd(lambda t: tf.unsharp_mask(t, 1.0, 0.5))
    yield "difference_of_gaussians", fwd_bwd(lambda t: tf.difference_of_gaussians(t, 0.8))
    # rank filters (``rank.py``): each algorithm path, forward and backward
    big = torch.rand(1, 12, 12).to(dtype)
    for label, fn in (
        ("maximum_filter (van Herk)", lambda t: tf.maximum_filter(t, 3)),
        ("minimum_filter 3-D (van Herk)", lambda t: tf.minimum_filter(t, 2, axes=(-3, -2, -1))),
        ("median_filter 3x3 (network)", lambda t: tf.median_filter(t, 3)),
        ("median_filter 5x5 (network)", lambda t: tf.median_filter(t, 5)),
        ("rank_filter 2x3 (network)", lambda t: tf.rank_filter(t, 2, (2, 3))),
        ("median_filter footprint (selection)", lambda t: tf.median_filter(t, footprint=[[1, 0, 1], [0, 1, 1]])),
        ("maximum_filter1d", lambda t: tf.maximum_filter1d(t, 4)),
        ("minimum_filter1d", lambda t: tf.minimum_filter1d(t, 4)),
        ("percentile_filter 3x3", lambda t: tf.percentile_filter(t, 30, 3)),
    ):
        yield label, fwd_bwd(fn)
    yield "median_filter 9x9 (histogram)", lambda: tf.median_filter(big.requires_grad_(True), 9).sum().backward()
    plane = torch.rand(1, 300, 300).to(dtype)  # split in row bands: the backward's band merge
    yield "median_filter backward in row bands", lambda: tf.median_filter(
        plane.requires_grad_(True), 3).sum().backward()
    if dtype in (torch.float32, torch.float64):  # canny runs float32 or float64
        yield "canny", lambda: tf.canny(torch.rand(2, 16, 16).to(dtype))
        # one slice of 64 rows or more is cut into row bands when there are threads to share
        # (the bands' seams have a kernel of their own): two threads at least, even where the
        # warmup runs on one (a container build with OMP_NUM_THREADS=1)
        yield "canny of one image (row bands)", lambda: _with_threads(
            2, lambda: tf.canny(torch.rand(1, 96, 40).to(dtype)))
        yield "canny use_quantiles", lambda: tf.canny(torch.rand(2, 16, 16).to(dtype), use_quantiles=True,
                                                      low_threshold=0.5, high_threshold=0.8)
        # while its fused kernel loads, canny smooths a float32 image as SciPy does, in float64
        # 1-D Gaussian passes (``functional.canny._gaussian``): the float64 separable kernel
        yield "canny smoothing while its kernel loads (float64 1-D Gaussians)", lambda: [
            tf.gaussian_filter1d(torch.rand(2, 16, 16, dtype=torch.float64), 1.0, axis=a, mode="constant",
                                 truncate=4.0) for a in (-2, -1)]
    if dtype == torch.float32:  # integer images, canny's usual input, run in float64 (scikit-image's rule)
        yield "canny of a uint8 image (float64)", lambda: tf.canny(
            torch.randint(0, 256, (1, 96, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)))


def _with_threads(n, call):
    """``call()`` with at least ``n`` threads (``torch.set_num_threads``), the count restored."""
    old = torch.get_num_threads()
    torch.set_num_threads(max(n, old))
    try:
        return call()
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def _streaming():
    """Make the direct path pick its streaming-store variant for any output size (and record no
    replay of those calls: a later call of the same size would replay the forced variant)."""
    import sys

    replays = sys.modules[__package__]._replays
    saved = direct._STREAM_BYTES, direct._STREAM_MIN_W, direct._d3_cache.copy(), replays.copy()
    direct._STREAM_BYTES = direct._STREAM_MIN_W = 0
    direct._d3_cache.clear()
    replays.clear()
    try:
        yield
    finally:
        direct._STREAM_BYTES, direct._STREAM_MIN_W = saved[:2]
        direct._d3_cache.clear()
        direct._d3_cache.update(saved[2])
        replays.clear()
        replays.update(saved[3])


def _kernels():
    """The engine's kernel dispatchers (the functions a call launches), built so far."""
    import sys

    from numba.core.dispatcher import Dispatcher

    from . import adjoint, forward

    found = {id(k): k for k in list(direct._d3_kernels.values()) + list(forward._K_FILTER_FWD.values())
             + list(adjoint._K_FILTER_BWD.values())}
    for name, mod in list(sys.modules.items()):
        if name.startswith(__package__ + "."):
            found.update((id(v), v) for v in vars(mod).values() if isinstance(v, Dispatcher))
    return list(found.values())


def _counts() -> tuple[int, int]:
    """(compiled, loaded from the disk cache): signatures of the engine's kernels so far."""
    ks = _kernels()
    return sum(sum(k._cache_misses.values()) for k in ks), sum(sum(k._cache_hits.values()) for k in ks)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _named(dtype: torch.dtype, label: str) -> str:
    """A call's label for ``progress``: its dtype first."""
    return f"{_dtype_name(dtype)} {label}"


def _label_op(label: str) -> str:
    """The op a call's label names (its first word)."""
    return label.split(" ", 1)[0]


#: this process's calls per dtype, built on first use (their closures hold the inputs)
_CALLS: dict = {}


def _run_call(dtype: torch.dtype, index: int) -> tuple[int, int]:
    """Run call ``index`` of ``dtype``'s warmup in this process (compiling its kernels here, not in
    the background); returns the kernels it compiled and loaded."""
    calls = _CALLS.get(dtype)
    if calls is None:
        calls = _CALLS[dtype] = [c for _, c in _calls(dtype)]
    before = _counts()
    with _tiered.waiting():
        calls[index]()
    after = _counts()
    return after[0] - before[0], after[1] - before[1]


#: a worker's program: the parent's ``sys.path`` (so that it imports the same torchfilters, and
#: nothing from its working directory), then its answers on a copy of fd 1 while fd 1 itself goes
#: to stderr (so that nothing printed, by C code either, is read as an answer)
_WORKER = """
import json, os, sys
sys.path[:] = json.loads(os.environ.pop("TORCHFILTERS_WARMUP_PATH"))
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
from torchfilters.backends.cpu import warmup
warmup._serve(answers)
"""


def _serve(answers) -> None:
    """A warmup worker process: runs the call named by each ``"dtype index"`` line of stdin and
    answers ``"compiled loaded"`` on ``answers``."""
    import sys

    for line in sys.stdin:
        name, index = line.split()
        print(*_run_call(getattr(torch, name), int(index)), file=answers, flush=True)


def _in_workers(todo, jobs, progress) -> tuple[int, int]:
    """Run the calls ``todo`` in ``jobs`` worker processes (plain ``python -c`` interpreters, so
    a caller's script is never imported again, main guard or not), each fed the next call when
    it finishes one; returns the kernels they compiled and loaded."""
    import queue
    import subprocess
    import json
    import sys
    import tempfile
    import threading

    tasks = queue.SimpleQueue()
    for t in todo:
        tasks.put(t)
    done = queue.SimpleQueue()
    stop = threading.Event()
    procs, logs = [], []

    def drive(proc):
        while not stop.is_set():
            try:
                dtype, i, label = tasks.get_nowait()
            except queue.Empty:
                return
            try:
                proc.stdin.write(f"{_dtype_name(dtype)} {i}\n")
                proc.stdin.flush()
                answer = proc.stdout.readline().split()
            except (OSError, ValueError):  # (a worker that died, or the run stopped: pipes closed)
                answer = []
            done.put((_named(dtype, label), proc, answer))
            if len(answer) != 2:
                return

    compiled = loaded = 0
    finished = False
    try:
        for _ in range(min(jobs, len(todo))):
            logs.append(tempfile.TemporaryFile("w+"))
            procs.append(subprocess.Popen(
                [sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[-1],
                text=True, bufsize=1, env={**os.environ, "TORCHFILTERS_WARMUP_PATH": json.dumps(sys.path)}))
            threading.Thread(target=drive, args=(procs[-1],), daemon=True, name="torchfilters-warmup").start()
        for _ in todo:
            label, proc, answer = done.get()
            if len(answer) != 2:
                log = logs[procs.index(proc)]
                log.seek(0)
                code = proc.wait()
                how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                raise RuntimeError(f"a warmup worker failed in {label!r} ({how}):\n{log.read()[-3000:]}".rstrip())
            compiled += int(answer[0])
            loaded += int(answer[1])
            if progress is not None:
                progress(label)
        finished = True
    finally:
        stop.set()
        for p in procs:
            with contextlib.suppress(OSError):
                p.stdin.close()  # (end of input: a worker returns when its call is done)
            if not finished:  # (an error, Ctrl-C: now; the compile lock goes with the process)
                p.kill()
        for p in procs:
            p.wait()
        for log in logs:
            log.close()
    return compiled, loaded


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (macOS, Windows)
        return os.cpu_count() or 1


def _plan(dtypes: Iterable[torch.dtype], jobs: int, only: Optional[Iterable[str]]) -> list:
    """:func:`warmup`'s arguments checked (its ``Raises``, but RuntimeError), and its calls:
    ``(dtype, index, label)``."""
    import operator

    dtypes = list(dtypes)
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(map(str, DTYPES))}; got {dtype}")
    try:
        if isinstance(jobs, bool):
            raise TypeError
        jobs = operator.index(jobs)
    except TypeError:
        raise TypeError(f"jobs must be an int; got {type(jobs).__name__}") from None
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1; got {jobs}")
    # every call's (dtype, index, label); ``only`` keeps those of the ops named
    todo = [(dtype, i, label) for dtype in dtypes for i, (label, _) in enumerate(_calls(dtype))]
    if only is not None:
        wanted = {only} if isinstance(only, (str, bytes)) else set(only)
        ops = {_label_op(label) for _, _, label in todo}
        unknown = sorted(map(repr, wanted - ops))
        if unknown:
            raise ValueError(f"only: {', '.join(unknown)} {'is not an op' if len(unknown) == 1 else 'are not ops'} "
                             f"of the warmup; its ops: {', '.join(sorted(ops))}")
        todo = [t for t in todo if _label_op(t[2]) in wanted]
    return todo


def warmup(dtypes: Iterable[torch.dtype] = (torch.float32,), progress: Optional[Callable[[str], None]] = None, *,
           jobs: int = 1, only: Optional[Iterable[str]] = None) -> WarmupReport:
    """Compile every CPU kernel for ``dtypes`` into the disk cache (loaded, not compiled, later).

    Args:
        dtypes: the storage dtypes to compile for (float32, float64, float16, bfloat16).
        progress: called with each call's label (a progress bar's ``set_description``): before
            the call with ``jobs=1``, as it finishes otherwise.
        jobs: processes to compile in.  ``1`` compiles in this process; more start that many
            worker processes (fresh interpreters, up to about 0.8 GiB each), each given the next
            call when it finishes one; the cache's locks compile each kernel once between
            them.  The float32 warmup on a 2-core machine: 309 s with ``jobs=1``, 205 s with 2.
        only: names of ops of :mod:`torchfilters.functional` (``"gaussian_filter"``, ``"sobel"``,
            ...) to compile for, instead of every op: the kernels those ops' calls use, in every
            mode class and direction.

    Returns:
        A :class:`WarmupReport`: the number of calls, of kernels compiled and of kernels
        loaded from the cache (in every process: with ``jobs > 1``, a kernel one worker compiled
        and another then loaded counts in both), the time taken and the cache folder.

    Raises:
        ValueError: a dtype the engine does not run, ``jobs`` below 1, or a name in ``only``
            that is not an op of the warmup (checked before any call).
        TypeError: ``jobs`` not an integer.
        RuntimeError: a worker process failed (``jobs > 1``): the call, its exit status and
            the end of its stderr.
    """
    t0 = time.perf_counter()
    todo = _plan(dtypes, jobs, only)
    if jobs == 1:
        compiled = loaded = 0
        try:
            for dtype, i, label in todo:
                if progress is not None:
                    progress(_named(dtype, label))
                c, l = _run_call(dtype, i)
                compiled += c
                loaded += l
        finally:
            _CALLS.clear()  # (their inputs)
    else:
        compiled, loaded = _in_workers(todo, jobs, progress)
    return WarmupReport(len(todo), compiled, loaded, time.perf_counter() - t0, cache.cache_dir())
