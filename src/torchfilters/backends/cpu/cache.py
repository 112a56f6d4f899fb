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
"""

from __future__ import annotations

import functools
import hashlib
import os

from numba.core import caching

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
    """Locator mixin: the package-wide stamp instead of the one file's."""

    def get_source_stamp(self):
        return source_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _ours(py_file):
            return None
        return super().from_function(py_func, py_file)


class UserProvidedLocator(_PackageStamp, _numba("UserProvidedCacheLocator")):
    pass


class InTreeLocator(_PackageStamp, _numba("InTreeCacheLocator")):
    pass


class UserWideLocator(_PackageStamp, _numba("UserWideCacheLocator")):
    pass


_LOCATORS = (UserProvidedLocator, InTreeLocator, UserWideLocator)


def install() -> None:
    """Put the package's locators first in numba's list (they decline every other file)."""
    classes = _numba("CacheImpl")._locator_classes
    if classes[: len(_LOCATORS)] != list(_LOCATORS):
        classes[:0] = [c for c in _LOCATORS if c not in classes]


def cache_dir() -> str | None:
    """The folder this process caches the engine's kernels in (``None``: nowhere writable)."""
    probe = os.path.join(_PKG_DIR, "prims.py")

    def f():  # pragma: no cover - never called, a stand-in from this package
        pass

    f.__code__ = f.__code__.replace(co_filename=probe)
    for cls in _LOCATORS:
        loc = cls.from_function(f, probe)
        if loc is not None:
            return loc.get_cache_path()
    return None
