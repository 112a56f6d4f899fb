"""Background compilation: with ``backend="auto"``, no call on a CPU tensor waits for numba.

The fused CPU engine's kernels are compiled by numba on first use (1-3 s each) or loaded from its
disk cache (numba's import and registries, about half a second in a new process).  Under
``backend="auto"`` (the default) a call on a CPU tensor does neither in the calling thread:

* while the engine is not imported yet, the call runs on the ``reference`` engine (pure torch: the
  same semantics, within rounding) and one background thread imports numba and the engine, then
  runs each kind of call made meanwhile (its function, its tensors' dtypes, sizes and strides,
  its other arguments) once more there, on copies of its tensors with their strides (the result
  dropped; not for calls of more than 4M elements), so that their kernels compile too;
* when the engine's kernel for the call is not compiled yet, the engine stops before launching it
  (:class:`KernelNotReady`), the call runs on the reference engine, and the background thread
  compiles that kernel, or loads it from the disk cache, then runs the call once more on copies
  (once per missing kernel: the call's later kernels, as in Canny's chain, compile too; its
  launches run serially there, so that no pool thread waits on the compiler);
* every later call whose kernels are ready runs on the fused engine;
* a call the reference engine would take more than about a second over (a large rank filter, a
  wide Gaussian on a large batch: :func:`_reference_ns`) compiles its kernels in the call instead.

So the first call of a process returns in milliseconds, and a new environment never stalls on a
cold cache; the fused speed arrives within seconds.  ``TORCHFILTERS_COMPILE=wait`` turns this off:
every call then runs the fused engine, compiling in the calling thread when it must (benchmarks,
bit-for-bit comparisons between calls), as does ``torch.use_deterministic_algorithms(True)``.
:func:`synchronize` waits for the background work.  An explicit ``backend="cpu"`` always
compiles in the calling thread.  Under :func:`deferred_loading` (the command line's small jobs)
calls that find the engine not imported yet run on the reference engine without loading it.

The background thread is a single non-daemon thread.  At interpreter exit it finishes the job in
hand (a kernel, the engine's import or a rerun) and takes no more; a fork waits for the
job in hand too, so that a child never inherits numba's compiler lock held.  Where no thread
can be started (an ``atexit`` handler, a thread still running after the main thread returned),
calls compile in the calling thread, as with ``wait``.

This module imports neither numba nor the engine: it is what a first call touches.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import sys
import threading

import torch

from .._spec import BlurSpec, FilterSpec, RankSpec
from ._layout import extent

__all__ = ["COMPILE_MODES", "KernelNotReady", "synchronize", "waiting"]

#: values of ``TORCHFILTERS_COMPILE``
COMPILE_MODES = ("background", "wait")
#: the dtypes of CPU tensors the fused engine runs (its ``available`` reads this too)
CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class KernelNotReady(Exception):
    """Raised inside the CPU engine, in a call made through :data:`ENGINE`, where a kernel is not
    compiled yet: the call runs on the reference engine instead (never seen by users).
    ``kernel``: the missing kernel's key (dispatcher, signature)."""

    def __init__(self, name, kernel=None):
        super().__init__(name)
        self.kernel = kernel


#: set while a call made through ``ENGINE`` runs the fused engine in the calling thread: a kernel
#: that is not compiled raises ``KernelNotReady`` there (``guard_compile``) instead of compiling
_FOREGROUND = contextvars.ContextVar("torchfilters_foreground", default=False)
#: set by :func:`waiting` (``warmup``): compile in the calling thread
_WAIT = contextvars.ContextVar("torchfilters_wait", default=False)
#: set by :func:`deferred_loading` (to its list of estimates): calls do not ask the background
#: thread to import the engine
_DEFER = contextvars.ContextVar("torchfilters_defer", default=None)

_cond = threading.Condition()
_pending: list = []  # jobs: (key, a function of no arguments)
_keys: set = set()  # the pending jobs' keys
_failed: set = set()  # keys whose background compile raised: the caller compiles (and raises)
_thread = None
_stopping = False
#: held by the worker while it imports or compiles; a fork takes it first (``_before_fork``)
_busy = threading.Lock()


def _mode() -> str:
    global _last_mode
    raw = os.environ.get("TORCHFILTERS_COMPILE", "")
    last = _last_mode
    if raw == last[0]:  # (read on every auto call: parsed once per value)
        return last[1]
    value = raw.strip().lower() or "background"
    if value not in COMPILE_MODES:
        raise ValueError(
            f"TORCHFILTERS_COMPILE={value!r} is not a compile mode; use one of {', '.join(map(repr, COMPILE_MODES))}"
        )
    _last_mode = (raw, value)
    return value


#: the last value of ``TORCHFILTERS_COMPILE`` read, and its mode
_last_mode = (None, None)


def background() -> bool:
    """Do ``auto`` calls on CPU tensors leave compiling to the background thread?"""
    return not _WAIT.get() and _mode() == "background" and not torch.are_deterministic_algorithms_enabled()


@contextlib.contextmanager
def waiting():
    """Within this block, ``auto`` calls on CPU tensors run the fused engine, compiling (or
    loading) its kernels in the calling thread where they are not ready, as under
    ``TORCHFILTERS_COMPILE=wait``: for timings, and results bit-identical from the first call on.

    Example:
        >>> import torch, torchfilters as tf
        >>> with tf.backends.waiting():
        ...     y = tf.gaussian_filter(torch.rand(2, 16, 16), 1.0)  # the fused engine's result
        >>> y.shape
        torch.Size([2, 16, 16])
    """
    token = _WAIT.set(True)
    try:
        yield
    finally:
        _WAIT.reset(token)


@contextlib.contextmanager
def deferred_loading():
    """Within this block, ``auto`` calls on CPU tensors made while the fused engine is not
    imported run on the reference engine and do not ask the background thread to import it (a
    call the reference engine would take more than about a second over still imports it and runs
    fused).  For a process that makes a few small calls and exits, as the command line does on a
    small job: the engine's import and its kernels' load (numba, about a second) cost more than
    those calls, contend with them for the GIL, and the exit waits for a load in hand.  Once the
    engine is imported, calls run as outside the block.

    Yields the list of the reference engine's estimated times (nanoseconds,
    :func:`_reference_ns`) of the calls the block ran there instead of asking for the engine:
    what the caller weighs against loading it (:func:`load_in_background`)."""
    spent: list = []
    token = _DEFER.set(spent)
    try:
        yield spent
    finally:
        _DEFER.reset(token)


def load_in_background() -> None:
    """Ask the background thread to import the CPU engine now, ahead of the calls that will use
    it (the command line, once a job proves large enough to pay for it).  Nothing happens where
    the engine is imported or queued already, outside the default compile mode (``wait`` loads
    it in the first call), or where no thread can start (then the next call imports it)."""
    if _loaded_cpu() is None and background():
        _submit_new("engine", _load_engine)  # (a no-op where the engine's job is queued already)


def in_foreground() -> bool:
    """Is this thread running a call made through :data:`ENGINE` (so it must not compile)?"""
    return _FOREGROUND.get()


def in_background() -> bool:
    """Is this the background thread?  Its reruns launch serially: a chunk handed to the pool
    would hold a pool thread in numba's compiler lock while the next kernel compiles, and a
    foreground call with ready kernels would wait behind it."""
    return threading.current_thread() is _thread


#: (dispatcher, argument classes) whose kernel is compiled (``check_ready``)
_ready: set = set()


def check_ready(dispatcher, args) -> None:
    """Before a launch split over threads (which do not see :func:`in_foreground`), in a call made
    through :data:`ENGINE`: raise :class:`KernelNotReady` (the compile queued) unless
    ``dispatcher`` has a kernel for ``args``; a quick lookup once it has."""
    key = (id(dispatcher),) + tuple(getattr(a, "dtype", None) or type(a) for a in args)
    if key in _ready:
        return
    sig = tuple(dispatcher.typeof_pyval(a) for a in args)
    if sig not in dispatcher.overloads:
        if _submit((id(dispatcher), sig), lambda: dispatcher.compile(sig)):
            raise KernelNotReady(getattr(dispatcher, "__qualname__", repr(dispatcher)), (id(dispatcher), sig))
        return  # (its background compile failed: the pool's threads compile it, and raise)
    _ready.add(key)


def _worker() -> None:
    global _thread
    while True:
        with _cond:
            while not _pending and not _stopping:
                _cond.wait()
            if _stopping:
                _thread = None
                _cond.notify_all()
                return
            key, job = _pending[0]
        try:
            with _busy:
                try:
                    job()
                except Exception:  # noqa: BLE001 -- the calling thread does it itself and sees the error
                    _failed.add(key)
        finally:
            with _cond:
                _pending.pop(0)
                _keys.discard(key)
                _cond.notify_all()


#: a call made while the engine loads is run again in the background, on copies of its tensors,
#: only if they hold at most this many elements (a larger call's kernels are asked for by its
#: next call)
_REPLAY_MAX = 1 << 22


def _leaves_numel(args, kwargs) -> int:
    """Elements the copies of a call's tensor arguments take (``out``'s stand-in included)."""
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    return sum(extent(t.shape, t.stride()) for t in tensors)


def _copy_view(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its sizes and strides (gaps, expanded dims and all): the storage span
    the view reaches, copied, and the same view of it -- so that the rerun takes the kernels of
    the call's own layout."""
    t = t.detach()
    n = extent(t.shape, t.stride())
    if n == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    flat = t.as_strided((n,), (1,), t.storage_offset()).clone()
    return flat.as_strided(t.shape, t.stride(), 0)


def _replay_args(args, kwargs):
    """Copies of a call's arguments for the background thread (a returned call never touches the
    caller's tensors again: their storage may be gone); ``out`` becomes a new tensor of its
    layout (an output's layout picks kernels too)."""
    out = kwargs.get("out")
    kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    with torch.no_grad():
        copy = {id(t): _copy_view(t) for t in tensors}
    kwargs = {k: copy.get(id(v), v) for k, v in kwargs.items()}
    if out is not None:
        kwargs["out"] = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
    return tuple(copy.get(id(a), a) for a in args), kwargs


def _load_engine() -> None:
    """The first job: import the engine."""
    from . import get

    get("cpu")


#: calls rerun in the background (``_call_key``), at most this many kinds per process, and at most
#: ``_REPLAY_BUDGET`` elements of copies queued at once
_replayed: set = set()
_REPLAY_KINDS = 256
_REPLAY_BUDGET = 4 * _REPLAY_MAX
_queued = [0]  # elements of the copies the queued reruns hold


def _call_key(name, args, kwargs):
    """What decides which kernels a call compiles: its engine function, the dtype, sizes and
    strides of its tensors (layouts and sizes choose kernel variants: row layouts, Canny's bands,
    stencils folded onto a small plane), and its other arguments (specs are strings)."""

    def one(a):
        if isinstance(a, torch.Tensor):
            return (a.dtype, tuple(a.shape), a.stride())
        try:
            hash(a)
        except TypeError:
            return type(a).__name__
        return a

    return (name, tuple(one(a) for a in args), tuple((k, one(v)) for k, v in sorted(kwargs.items())))


def _replay_job(name, args, kwargs, kernel=None):
    """``(key, job)``: a rerun of a call on copies of its arguments (the result dropped), so that
    its kernels compile once the engine is imported -- one per kind of call (:func:`_call_key`;
    at most 256 kinds), or with ``kernel`` (the key of the kernel that stopped a call) one per
    such kernel; none for calls of more than 4M elements nor while the copies queued hold 16M
    (their next call asks for their kernels): else None."""
    try:
        key = ("rerun", kernel) if kernel is not None else ("replay",) + _call_key(name, args, kwargs)
        if key in _replayed:
            return None
        size = _leaves_numel(args, kwargs)
    except Exception:  # noqa: BLE001 -- an odd argument: its next call asks for its kernels
        return None
    with _cond:
        if (key in _replayed or (kernel is None and len(_replayed) >= _REPLAY_KINDS) or size > _REPLAY_MAX
                or _queued[0] + size > _REPLAY_BUDGET):
            return None
        _queued[0] += size
        _replayed.add(key)
    try:
        replay = [_replay_args(args, kwargs)]
    except Exception:  # noqa: BLE001 -- (an argument that cannot be copied: its next call asks)
        replay = []
    ran = []

    def job():
        if ran:
            return
        ran.append(True)
        try:
            if replay and _loaded_cpu():
                cpu_args, cpu_kwargs = replay.pop()
                with torch.no_grad():
                    _function("cpu", name)(*cpu_args, **cpu_kwargs)
        finally:
            replay.clear()
            with _cond:
                _queued[0] -= size

    return key, job


def _queue(rerun) -> None:
    """Queue a :func:`_replay_job` (None: nothing); where no thread can run, release its copies."""
    if rerun is not None and _submit_new(*rerun) is None:
        rerun[1]()  # (nothing runs: the engine is not loaded, or the job already ran)


def _submit_rerun(name, args, kwargs, kernel) -> None:
    """Queue a rerun of a call that ``kernel`` stopped (:func:`_replay_job`), where none is queued
    for that kernel yet."""
    _queue(_replay_job(name, args, kwargs, kernel))


def _submit_loading(name, args, kwargs) -> bool:
    """A call while the engine is not imported: queue the import, with this call's rerun in the
    same job when it is the first (so that at interpreter exit, which finishes the job in hand,
    the first call's kernels are compiled and cached), else this call's rerun as a job of its
    own.  False where no background thread can run (the caller imports the engine itself)."""
    rerun = _replay_job(name, args, kwargs)
    with _cond:
        queued = "engine" in _keys
    if not queued:

        def load():
            _load_engine()
            if rerun is not None:
                rerun[1]()

        added = _submit_new("engine", load)
        if added is None:
            if rerun is not None:
                rerun[1]()  # (releases its copies: ``_loaded_cpu`` is not set, nothing runs)
            return False
        if added or rerun is None:
            return True
    _queue(rerun)
    return True


def _stop() -> None:
    """Interpreter exit (``threading``'s exit hooks run before non-daemon threads are joined):
    finish the job in hand, take no more."""
    global _stopping
    with _cond:
        _stopping = True
        _pending[1:] = []
        _cond.notify_all()


_hooked = False


def _submit(key, job) -> bool:
    """Queue a job for the background thread (started on first use); False where none can run
    (interpreter shutdown, or the job failed there before): the caller does it itself."""
    return _submit_new(key, job) is not None


def _submit_new(key, job):
    """:func:`_submit`: True when ``job`` was queued, False when a job of ``key`` was pending
    already, None where no thread can run."""
    global _thread, _hooked
    with _cond:
        if _stopping or key in _failed:
            return None
        if key in _keys:
            return False
        if _thread is None:
            try:
                if not _hooked:
                    threading._register_atexit(_stop)  # (what concurrent.futures uses)
                    _hooked = True
                t = threading.Thread(target=_worker, name="torchfilters-compile", daemon=False)
                t.start()
            except RuntimeError:  # shutting down: no new threads
                return None
            _thread = t
        _keys.add(key)
        _pending.append((key, job))
        _cond.notify_all()
    return True


def synchronize(timeout: float | None = None) -> bool:
    """Wait until the CPU engine's background compilation has nothing left to do.

    Under ``backend="auto"`` a call whose fused CPU kernel is not compiled yet runs on the
    reference engine while a background thread compiles (or loads) the kernel; this waits until
    that thread has done what the calls so far asked for, so that calls like them run on the
    fused engine.  (Each kind of call made while the engine is still being imported, and each
    call stopped by a kernel that is not ready, has the thread run it again afterwards on copies,
    so that all its kernels compile -- except calls whose tensors span more than 4M elements,
    calls made while the queued copies span 16M, and kinds past the 256th of the loading
    window: the next such call asks for its kernels.)  With nothing queued it returns at once.

    Args:
        timeout: seconds to wait at most; ``None`` waits as long as it takes.

    Returns:
        True when nothing is left to compile, False when ``timeout`` passed first.

    Example:
        >>> import torch, torchfilters as tf
        >>> y = tf.gradient_magnitude(torch.rand(2, 16, 16))
        >>> tf.backends.synchronize()
        True
    """
    with _cond:
        return _cond.wait_for(lambda: not _pending or _stopping, timeout)


# ----------------------------------------------------------------- the engine seen by dispatch


def _loaded_cpu():
    """The CPU engine if it is imported, None while it is not (the worker is then asked to import
    it), False where it cannot be (no numba)."""
    loaded = sys.modules[__package__]._loaded  # (not an import statement: on every call)
    if "cpu" in loaded:
        return loaded["cpu"] or False
    return None


#: the engine functions dispatch calls, and whether the reference engine has its own (False:
#: the caller has its own fallback)
_FUNCTIONS = {"filter_forward": True, "filter_backward": True, "blur_forward": True, "blur_backward": True,
              "rank_forward": True, "rank_backward": True, "canny_edges": True, "canny_fused": False}


_modules: dict = {}


def _function(engine: str, name: str):
    """Engine function ``name`` of ``engine`` (``cpu`` or ``reference``; Canny's from the
    engine's Canny module, ``backends.CANNY_MODULES``)."""
    key = (engine, name.startswith("canny_"))
    mod = _modules.get(key)
    if mod is None:
        from . import CANNY_MODULES, get

        mod = _modules[key] = importlib.import_module(CANNY_MODULES[engine], __package__) if key[1] else get(engine)
    return getattr(mod, name)


class _Tiered:
    """The engine ``resolve`` returns for ``auto`` calls on CPU tensors: the fused engine where
    its kernels are ready, else the reference engine (and the kernel compiles in the background).
    Its functions are those of :data:`_FUNCTIONS`."""

    NAME = "cpu"
    UNAVAILABLE_HINT = ""

    @staticmethod
    def available(device: torch.device, dtype: torch.dtype) -> bool:
        return device.type == "cpu" and dtype in CPU_DTYPES

    @staticmethod
    def _run(name, args, kwargs):
        cpu = _loaded_cpu()
        ns = None  # (the reference engine's estimate: computed once, where needed)
        if cpu is None:
            from . import get

            ns = _reference_ns(args)
            deferred = _DEFER.get()
            if ns > _FALLBACK_NS:  # slower than compiling: import it here
                cpu = get("cpu")
            elif deferred is not None:
                deferred.append(ns)
            elif not _submit_loading(name, args, kwargs):
                cpu = get("cpu")  # no background thread: import it here
        if cpu:
            fn = _function("cpu", name)
            token = _FOREGROUND.set(True)
            missing = None
            try:
                return fn(*args, **kwargs)
            except KernelNotReady as e:
                missing = e.kernel
            finally:
                _FOREGROUND.reset(token)
            if ns is None:
                ns = _reference_ns(args)
            if ns > _FALLBACK_NS:  # the reference engine would take longer than compiling: compile
                return fn(*args, **kwargs)  # in the call (``wait``)
            # the kernel that stopped the call is queued; a rerun of the whole call after it
            # compiles the call's later kernels too (a chain such as Canny's)
            _submit_rerun(name, args, kwargs, missing)
        return _function("reference", name)(*args, **kwargs) if _FUNCTIONS[name] else None


def _method(name):
    def call(self, *args, **kwargs):
        return _Tiered._run(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


for _name in _FUNCTIONS:
    setattr(_Tiered, _name, _method(_name))
del _name


#: a call runs on the reference engine meanwhile only if that takes at most about this long
#: (nanoseconds, by :func:`_reference_ns`); a costlier call compiles its kernels in the call:
#: a large rank filter on the reference engine took longer than compiling, and gigabytes
_FALLBACK_NS = 1e9


def _taps(st) -> int:
    if st.kind == "sep":
        return sum(len(p.taps) for p in st.passes)
    return _leaves(st.taps)


def _leaves(t) -> int:
    return sum(_leaves(u) for u in t) if isinstance(t, tuple) else 1


#: tensors of more bytes than this (past the last-level cache) take the reference engine about
#: 1.7 times as long per element (:func:`_reference_ns`)
_LARGE_BYTES = 16 << 20


#: float64 calls take the reference engine this many times as long as float32 ones (linear
#: filters 1.4-2.4x, rank filters 1.4x; 16-bit ones about as long as float32: Zen 1, 2026-12-08)
_F64_LINEAR, _F64_RANK = 1.8, 1.4


def _stencil_ns(st) -> float:
    """Nanoseconds per element of one stencil on the reference engine: a pass of a separable
    stencil 8 + 0.8 per tap, a dense stencil 8 + 1.6 per tap, and 5 for the stencil's sum."""
    if st.kind == "sep":
        return 5.0 + sum(8.0 + 0.8 * len(p.taps) for p in st.passes)
    return 5.0 + 8.0 + 1.6 * _leaves(st.taps)


def _reference_ns(args) -> float:
    """About how long the reference engine takes for a call with these arguments (nanoseconds):
    the larger of two models, so that no call is estimated lower than by the first.

    * The first counted 1.5 per element and tap of a linear filter, 3.0 of a selective blur and
      30 per element and window element of a rank filter.  It holds for wide stencils and
      misses the passes of short ones.
    * The second, measured on a 2-core AMD Zen 1 host at 2.0 GHz (2026-12-07; 2-D, float32, 65K to
      12.6M elements, within about 30% there): :func:`_stencil_ns` per element, times 1.7 past
      ``_LARGE_BYTES`` (a gradient magnitude of a large image: 8x the first model); selective
      blur 2.2 per tap, the same factor; rank filters 28 per window element, times
      ``sqrt(window / 49)`` past 49 (15x15: about 120 measured); float64 times ``_F64_LINEAR``
      (rank filters ``_F64_RANK``).

    On the quiet host 3-D stencils and backward calls took at most their estimate (a 96^3 3-D
    Gaussian 31-43 ms against 45-68 ms; a backward at most its forward's time); a review under
    heavy load measured them at 5-10x.  Anything else (Canny's edge stage): 400 per element.
    Taps are counted after folding (a pass that reaches far past the image is folded onto its
    period, as every engine runs it): ``gaussian_filter`` of sigma 1000 on 256x256 runs 8001-tap
    passes as 512-tap ones, 0.05 s on the reference engine, which the unfolded count put at
    1.6 s (over ``_FALLBACK_NS``: a needless compile in the call)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    big = max(tensors, key=lambda t: t.numel(), default=None)
    n = 0 if big is None else big.numel()
    size = big.element_size() if big is not None else 0
    large = 1.7 if n * size > _LARGE_BYTES else 1.0
    wide = size == 8  # float64: _F64_LINEAR / _F64_RANK times as long
    f = _F64_LINEAR if wide else 1.0
    for a in args:
        if isinstance(a, (FilterSpec, BlurSpec)) and n and big.dim() >= a.ndim:
            # the taps the engines run: a pass reaching far past the image is folded onto its
            # period first (``_lowering.lower``, cached: the engine's own call finds it done)
            from ._lowering import lower

            a = lower(a, big.shape)
        if isinstance(a, FilterSpec):
            return n * max(1.5 * sum(_taps(st) for st in a.stencils),
                           f * large * sum(_stencil_ns(st) for st in a.stencils))
        if isinstance(a, BlurSpec):
            return n * _taps(a.stencil) * max(3.0, f * large * 2.2)
        if isinstance(a, RankSpec):
            w = _leaves(a.footprint)
            return n * w * (_F64_RANK if wide else 1.0) * max(30.0, 28.0 * (w / 49.0) ** 0.5)
    return n * 400.0


#: the engine ``resolve`` hands out for ``auto`` calls on CPU tensors in ``background`` mode
ENGINE = _Tiered()


# ------------------------------------------------------------------------- hooks into numba


def guard_compile(dispatcher_class) -> None:
    """Make numba's dispatchers raise :class:`KernelNotReady` instead of compiling while a call
    made through :data:`ENGINE` runs (``in_foreground``), the compile queued for the background
    thread.  Outside such calls (every other thread, every other numba function) nothing changes."""
    original = dispatcher_class._compile_for_args
    if getattr(original, "_torchfilters_guard", False):
        return

    def _compile_for_args(self, *args, **kws):
        if _FOREGROUND.get():
            sig = tuple(self.typeof_pyval(a) for a in args)
            if _submit((id(self), sig), lambda: self.compile(sig)):
                raise KernelNotReady(getattr(self, "__qualname__", repr(self)), (id(self), sig))
        return original(self, *args, **kws)

    _compile_for_args._torchfilters_guard = True
    dispatcher_class._compile_for_args = _compile_for_args


def _numba_lock():
    """numba's compiler lock (re-entrant) when numba is loaded, else None."""
    mod = sys.modules.get("numba.core.compiler_lock")
    return getattr(mod, "global_compiler_lock", None)


#: whether this thread's fork took ``_busy`` (``_before_fork``)
_forking = threading.local()


def _before_fork() -> None:
    """A fork waits for the background job in hand (``_busy``) and for any other thread's numba
    compile (its compiler lock): a child that inherited the lock held would hang at its first
    compile.  A thread that holds numba's lock itself (a fork from a signal handler or a
    finalizer run inside a compile) does not wait for the job: the job cannot be compiling, and it
    may be waiting for this very thread's lock."""
    lock = _numba_lock()
    _forking.busy = lock is None or not lock.is_locked()
    if _forking.busy:
        _busy.acquire()
    if lock is not None:
        lock.acquire()


def _release_numba_lock() -> None:
    lock = _numba_lock()
    if lock is not None and lock.is_locked():
        lock.release()


def _after_fork_parent() -> None:
    _release_numba_lock()
    if getattr(_forking, "busy", True):
        _busy.release()


def _after_fork_child() -> None:
    """A child has no background thread: start afresh (its ``_busy`` was taken before the fork,
    numba's compiler lock too, by this thread: released)."""
    global _cond, _busy, _thread, _stopping, _hooked
    _release_numba_lock()
    _cond = threading.Condition()
    _busy = threading.Lock()
    _pending.clear()
    _keys.clear()
    _replayed.clear()
    _queued[0] = 0
    _thread = None
    _stopping = False
    _hooked = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)
