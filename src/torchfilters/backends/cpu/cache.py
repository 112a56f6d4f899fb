"""Where the engine's compiled kernels are cached on disk, and when a cached kernel is stale.

numba caches a ``cache=True`` function per source file (``*.nbi`` index, ``*.nbc`` code) and
keeps an entry while *that file* is unchanged.  The engine's kernels inline functions from the
other modules of this package (``prims``, ``forward``, ...), so a kernel cached from
``direct.py`` would outlive a change of ``prims.py``.  Here every module of the package shares
one stamp, a hash of all their sources: any change to the engine recompiles every kernel once.

Locations, first that works (numba's own order, for this package's files only):

1. ``NUMBA_CACHE_DIR`` when set;
2. the package's ``__pycache__`` folders (a writable install);
3. the per-user cache folder (``~/.cache/numba`` on Linux, ``XDG_CACHE_HOME`` if set), for a
   read-only install (system site-packages, a container image built by another user).

``torchfilters warmup`` compiles every kernel into that location and prints it.

Processes that share the cache (DataLoader workers, dask workers, pytest-xdist workers) compile
each kernel once between them: a process that misses the cache takes that kernel's
``<index>.<key>.compiling`` lock before compiling it, and one that misses while another holds
it waits, then loads what the other saved (``_Locked.load``).  A thread holds one such lock at
a time (the kernels a compile pulls in are not locked: no lock is awaited while one is held),
releases it when the compile call that took it returns or raises (after numba's save), and
``flock`` releases it if the process dies.

They save and load under a file lock too (``_Locked``).  numba's own index update is a
read-modify-write of one file per function, which every closure of a kernel factory (the direct
kernels) shares: two processes saving at once lost one entry (that kernel compiled again in the
next process), and a process loading between another's index and data writes could read a stale
data file of an older source under the new key.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import itertools
import os
import pickle
import threading
import time
import warnings

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: numba's unlocked index
    fcntl = None

from numba.core import caching, config
from numba.core.dispatcher import Dispatcher

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def _numba(name):
    """A class of ``numba.core.caching`` (public names since numba 0.61, underscored before)."""
    return getattr(caching, name, None) or getattr(caching, "_" + name)


@functools.lru_cache(maxsize=None)
def source_stamp() -> str:
    """A hash of every module of the engine (their contents, not their times)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(_PKG_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(_PKG_DIR, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def _ours(py_file) -> bool:
    return os.path.dirname(os.path.abspath(py_file)) == _PKG_DIR


class _PackageStamp:
    """Locator mixin: the package-wide stamp instead of the one file's; a folder found writable
    when the locator was chosen that fails later (a full disk) fails only the save (a warning:
    ``_Locked.save``), not the call that compiled."""

    def get_source_stamp(self):
        return source_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _ours(py_file):
            return None
        loc = super().from_function(py_func, py_file)
        if loc is not None:
            loc._chosen = True
        return loc

    def ensure_cache_path(self):
        try:
            super().ensure_cache_path()
        except OSError:
            if not getattr(self, "_chosen", False):  # (the writability check of ``from_function``)
                raise


@functools.lru_cache(maxsize=None)
def _absolute(path: str) -> str:
    """``path`` made absolute against the working directory of its first use (numba joins a
    relative ``NUMBA_CACHE_DIR`` to the working directory of each kernel's first use)."""
    return os.path.abspath(path)


class UserProvidedLocator(_PackageStamp, _numba("UserProvidedCacheLocator")):
    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        self._cache_path = os.path.join(_absolute(config.CACHE_DIR), self.get_suitable_cache_subpath(py_file))


class InTreeLocator(_PackageStamp, _numba("InTreeCacheLocator")):
    pass


class UserWideLocator(_PackageStamp, _numba("UserWideCacheLocator")):
    pass


class NowhereLocator(UserWideLocator):
    """The last resort, where no folder is writable (a read-only file system and home): the
    per-user path, which need not exist.  Loads find nothing there (but what ``torchfilters
    warmup`` left in the package's own folder: ``_Locked``) and saves fail without a warning, so the engine
    runs, compiling what it misses in every process; :func:`cache_dir` is None."""

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _ours(py_file):
            return None
        loc = cls(py_func, py_file)
        loc._chosen = True
        return loc


_LOCATORS = (UserProvidedLocator, InTreeLocator, UserWideLocator, NowhereLocator)
#: the package's own cache folder: where ``torchfilters warmup`` at an image's build puts the
#: kernels; read from when the process caches elsewhere (the folder is read-only now)
_IN_TREE = os.path.join(_PKG_DIR, "__pycache__")
#: what a cache file that cannot be read raises (truncated, garbage, from another numba)
_UNREADABLE = (EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError, KeyError,
               ImportError, OSError)
_warned: set = set()


def _warn_once(what: str, message: str) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"torchfilters: {message}", RuntimeWarning, stacklevel=3)


class _Locked(caching.IndexDataCacheFile):
    """numba's index and data files, saved under an exclusive and loaded under a shared
    ``flock`` of ``<index>.lock`` -- for this package's kernels (its stamp) only."""

    @contextlib.contextmanager
    def _lock(self, kind):
        if fcntl is None or self._source_stamp != source_stamp():
            yield
            return
        try:
            f = open(self._index_path + ".lock", "a+b")
        except OSError:  # a read-only cache folder: numba's own rules apply
            yield
            return
        with f:
            fcntl.flock(f, kind)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def save(self, key, data):
        """numba's save with the data file written before the index that names it (numba writes
        the index first: a process ended between the two -- killed, or a CLI run ended at once
        after Ctrl-C -- left an index naming a data file of an older source, as data names start
        again at 1 under a new stamp, and every later process loaded that wrong kernel).  Each
        file is written whole (numba's temporary and rename).  A save that fails (a full disk, a
        folder made read-only) is a warning (none where no folder is writable at all), and the
        kernel is compiled again in the next process."""
        try:
            with self._lock(fcntl.LOCK_EX if fcntl else 0):
                overloads = self._load_index()
                name = overloads.get(key)
                if name is None:
                    taken = set(overloads.values())
                    name = next(n for n in map(self._data_name, itertools.count(1)) if n not in taken)
                self._save_data(name, data)
                overloads[key] = name
                self._save_index(overloads)
        except OSError as exc:
            folder = os.path.dirname(self._index_path)
            if not _nowhere():
                _warn_once(folder, f"could not save a compiled kernel in {folder} ({exc.strerror or exc}); "
                                   "later processes compile it again")

    def _load_index(self):
        """numba's index; one that cannot be read is empty (a miss: the kernel is compiled and the
        index written anew), with a warning."""
        try:
            return super()._load_index()
        except _UNREADABLE as exc:
            _warn_once(self._index_path, f"ignoring an unreadable kernel cache index {self._index_path} "
                                         f"({type(exc).__name__}): its kernels are compiled again")
            return {}

    def _load_data(self, name):
        """numba's data file; one that cannot be read is a miss (None), with a warning (one that is
        gone, removed while the index named it: numba's own miss, without one)."""
        try:
            return super()._load_data(name)
        except FileNotFoundError:
            raise
        except _UNREADABLE as exc:
            path = self._data_path(name)
            _warn_once(path, f"ignoring an unreadable kernel cache file {path} ({type(exc).__name__}): "
                             "its kernel is compiled again")
            return None

    def _in_tree(self, key):
        """``key`` from the package's own cache folder, when this process caches in the per-user
        folder because that one is read-only (an install that ``torchfilters warmup`` filled when
        it was built), else None; never under ``NUMBA_CACHE_DIR`` (the cache asked for)."""
        here = os.path.dirname(self._index_path)
        if config.CACHE_DIR or os.path.abspath(here) == _IN_TREE or not os.path.isdir(_IN_TREE):
            return None
        other = copy.copy(self)
        other._cache_path = _IN_TREE
        other._index_path = os.path.join(_IN_TREE, self._index_name)
        return super(_Locked, other).load(key)  # (numba's load: no lock, no compile lock)

    def load(self, key):
        with self._lock(fcntl.LOCK_SH if fcntl else 0):
            data = super().load(key)
        if data is None and self._source_stamp == source_stamp():
            data = self._in_tree(key)
        if data is not None or fcntl is None or self._source_stamp != source_stamp():
            return data
        if getattr(_held, "f", None) is not None:  # (inside this thread's compile of another kernel)
            return None
        name = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
        try:
            f = open(f"{self._index_path}.{name}.compiling", "a+b")
        except OSError:  # a read-only cache folder: compile here
            return None
        try:
            if not _wait_for(f):  # another process stuck in its compile: compile here too
                f.close()
                return None
            with self._lock(fcntl.LOCK_SH):
                data = super().load(key)
        except BaseException:  # (an interrupt while waiting or re-reading: nothing held)
            f.close()
            raise
        if data is not None:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
            return data
        _held.f = f  # this thread compiles it: released when the compile call that took it
        return None  # returns or raises (``_compile``)


#: the compile lock a thread holds (``_Locked.load``)
_held = threading.local()
#: the longest a process waits for another's compile of a kernel before compiling it itself
#: (a kernel compiles in 1-20 s on a quiet machine, several times that under load)
COMPILE_WAIT = 180.0


def _wait_for(f) -> bool:
    """Take ``f``'s exclusive lock (another process compiling that kernel: wait for its save),
    giving up after :data:`COMPILE_WAIT` seconds (a process stopped in its compile: Ctrl-Z, a
    debugger), or at once once the main thread has ended (the interpreter's exit waits for the
    background compile: it compiles here rather than wait on another process)."""
    deadline = time.monotonic() + COMPILE_WAIT
    main = threading.main_thread()
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline or not main.is_alive():
                return False
            time.sleep(0.02)


def _release_compile_lock():
    f = getattr(_held, "f", None)
    if f is not None:
        _held.f = None
        try:
            fcntl.flock(f, fcntl.LOCK_UN)
        finally:
            f.close()


def _compile(self, sig, _numba_compile=Dispatcher.compile):
    """numba's ``Dispatcher.compile`` (which loads, or compiles and saves, one kernel), then the
    release of the compile lock that its cache miss took, however it ends: saved, declined by
    numba's cache (``check_cachable``: no ``save``), failed, or interrupted.  A compile nested
    in another's (a kernel it calls) leaves the outer one's lock alone."""
    outer = getattr(_held, "f", None) is not None
    try:
        return _numba_compile(self, sig)
    finally:
        if not outer:
            _release_compile_lock()


def install() -> None:
    """Put the package's locators first in numba's list (they decline every other file)."""
    classes = _numba("CacheImpl")._locator_classes
    if classes[: len(_LOCATORS)] != list(_LOCATORS):
        classes[:0] = [c for c in _LOCATORS if c not in classes]
    # (numba's Cache builds its IndexDataCacheFile by this module-level name; _Locked behaves as
    # numba's class for every other function)
    if not issubclass(caching.IndexDataCacheFile, _Locked):
        caching.IndexDataCacheFile = _Locked
        Dispatcher.compile = _compile


@functools.lru_cache(maxsize=None)
def _nowhere() -> bool:
    """No folder is writable (:class:`NowhereLocator`): saves fail, without a warning each."""
    return cache_dir() is None


def cache_dir() -> str | None:
    """The folder this process caches the engine's kernels in (``None``: nowhere writable)."""
    probe = os.path.join(_PKG_DIR, "prims.py")

    def f():  # pragma: no cover - never called, a stand-in from this package
        pass

    f.__code__ = f.__code__.replace(co_filename=probe)
    for cls in _LOCATORS[:-1]:  # (not the last resort: nowhere)
        loc = cls.from_function(f, probe)
        if loc is not None:
            return loc.get_cache_path()
    return None
