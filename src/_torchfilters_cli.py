"""The ``torchfilters`` console script (and ``python -m torchfilters``): :func:`torchfilters.cli.main`,
with Ctrl-C handled from its first instruction.

It lives outside the ``torchfilters`` package because importing anything in the package imports
the library, and with it torch (1-2 s): a Ctrl-C then would end in a traceback.  (``python -m
torchfilters`` imports the package before this module, so there a Ctrl-C in that second still
does.)  An interrupted run (status 130 or 143) ends at once, not after a kernel that a background
thread is compiling (seconds): its outputs are written all or nothing, the kernel cache writes
each file whole and a kernel's data before the index that names it (``backends.cpu.cache``), and
its locks are ``flock`` locks, which the operating system releases.

``--version`` and the top level's help and usage (``torchfilters``, ``--help``) are answered
without importing torch: 0.1 s instead of 2-3.
"""

from __future__ import annotations

import os
import signal
import sys

_INTERRUPTED = (130, 143)


def stdout_failed(exc: OSError) -> int:
    """The exit status after writing to stdout raised ``exc``, with stdout pointed at the null
    device (so that the interpreter's last flush raises nothing): a closed pipe (``| head``) ends
    quietly with SIGPIPE's status, as ``cat`` does; another failure (a full disk) is an error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # (stdout replaced by an object without a descriptor)
        pass
    if isinstance(exc, BrokenPipeError):
        return 128 + getattr(signal, "SIGPIPE", 13)
    print(f"torchfilters: error: stdout: {exc.strerror or exc}", file=sys.stderr, flush=True)
    return 1


def version() -> str | None:
    """The installed distribution's version, read without importing the library (None: running
    from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("torchfilters")
    except PackageNotFoundError:
        return None


def _print_version(v: str) -> int:
    try:
        print(f"torchfilters {v}")
    except OSError as exc:  # a closed pipe, a full disk (an OSError of the command itself is not this)
        return stdout_failed(exc)
    return 0


def _import_app():
    """``torchfilters.cli.app.main``, imported with SIGINT held off: torch imports NumPy from C and
    swallows an exception raised there, so a Ctrl-C at that moment left NumPy half imported (the
    run went on, or failed in strange ways).  Held off, it arrives whole once the import is done."""
    hold = getattr(signal, "pthread_sigmask", None)  # (POSIX)
    old = hold(signal.SIG_BLOCK, {signal.SIGINT}) if hold is not None else None
    try:
        from torchfilters.cli.app import main as run
    finally:
        if hold is not None:
            hold(signal.SIG_SETMASK, old)  # (a Ctrl-C held off is raised here)
    return run


#: command lines that only print the top level's help or usage: answered without the library
_TOP_LEVEL_ONLY = ([], ["--help"], ["-h"])


def _bare_package() -> bool:
    """Register the ``torchfilters`` package without running its ``__init__`` (which imports
    torch: 2-3 s), so that ``torchfilters.cli.app`` imports alone; True if it did.  Only for a
    command line that prints the top level's help or usage (``_TOP_LEVEL_ONLY``): its parser
    names the sub-commands and builds none of the ops' options, so nothing else of the package
    is needed.  :func:`main` takes the bare package out again (:func:`_forget_bare_package`)."""
    if "torchfilters" in sys.modules:  # (``python -m torchfilters``: the library is imported)
        return False
    from importlib.util import find_spec, module_from_spec

    spec = find_spec("torchfilters")  # (finds the package; executes nothing)
    if spec is None or spec.submodule_search_locations is None:
        return False
    sys.modules["torchfilters"] = module_from_spec(spec)
    return True


def _forget_bare_package() -> None:
    """Take the bare package and the modules imported under it out of ``sys.modules``: a caller
    that runs :func:`main` in its own process (a notebook's ``%run``, a test) and then imports
    ``torchfilters`` gets the whole library, not the bare package (found by a review)."""
    for name in [n for n in sys.modules if n == "torchfilters" or n.startswith("torchfilters.")]:
        del sys.modules[name]


def main() -> int | str | None:
    """Run the command; returns its exit status for ``sys.exit``."""
    try:
        v = version() if sys.argv[1:] == ["--version"] else None
        bare = sys.argv[1:] in _TOP_LEVEL_ONLY and _bare_package()
        try:
            status = _print_version(v) if v is not None else _import_app()()  # (--version: no torch, at once)
        finally:
            if bare:
                _forget_bare_package()
    except KeyboardInterrupt:  # (during the imports: main handles its own)
        print("torchfilters: interrupted", file=sys.stderr)
        status = 130
    except SystemExit as exc:  # argparse: --help, --version, a usage error
        status = exc.code
    if sys.stdout is not None:  # (None: started with stdout closed)
        try:
            sys.stdout.flush()  # (here, not at the interpreter's exit: a closed pipe is handled)
        except OSError as exc:
            status = stdout_failed(exc)
    if status in _INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
