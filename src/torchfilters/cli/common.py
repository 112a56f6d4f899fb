"""What every sub-command shares: constants, exceptions, lazy imports, argparse types and the
one-line error format."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from _torchfilters_cli import stdout_failed  # noqa: F401  (outside the package: no torch import)

PROG = "torchfilters"

#: Derivative operators accepted by ``--operator``.
OPERATORS = ("central", "sobel", "scharr", "prewitt")

#: Boundary modes accepted by ``--mode`` (SciPy's names and meanings).
MODES = ("reflect", "mirror", "nearest", "wrap", "constant", "grid-mirror", "grid-constant", "grid-wrap")

#: Output formats accepted by ``--format``.
FORMATS = ("png", "npy", "pt")

DEFAULT_OUT = "torchfilters-out"

INSTALL_HINT = ("install the command-line dependencies with: pip install 'torchfilters[cli]' "
                "(from a source checkout: pip install '.[cli]')")


class InputError(Exception):
    """One input could not be read, filtered or written; the message says why, in words."""


class DiskFull(InputError):
    """An output could not be written because its file system is full: the run stops."""


class MissingDependency(Exception):
    """An optional dependency of the command line is not installed."""


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like KeyboardInterrupt, so that temporaries are removed."""


def require(module: str, package: str, extra: str = "cli") -> Any:
    """Import ``module`` or raise :class:`MissingDependency` naming ``package``."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(
            f"this needs the '{package}' package, which is not installed; "
            f"pip install 'torchfilters[{extra}]' (or pip install {package})"
        ) from None


def describe(exc: BaseException, limit: int = 200) -> str:
    """A short description of an exception for a message: its first line, shortened; the
    ``strerror`` of an OSError ("No space left on device")."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    if "WeightsUnpickler error:" in text:  # torch.load(weights_only=True): keep the reason
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
    lines = [" ".join(line.split()) for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    if len(first) > limit:
        first = first[: limit - 3].rstrip() + "..."
    return first


def error(message: str, bar: Any = None) -> None:
    """Print ``torchfilters: error: MESSAGE`` on one line of stderr (through the progress bar
    when there is one, so that the bar is redrawn below it)."""
    line = f"{PROG}: error: " + " ".join(str(message).split())
    if bar is not None:
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


def progress_bar(total: int | None, desc: str, unit: str, show: bool, leave: bool = False) -> Any:
    """A tqdm bar on stderr, or None when ``show`` is false or stderr is not a terminal
    (``leave``: keep the finished bar on screen)."""
    if not show or not sys.stderr.isatty():
        return None
    tqdm = require("tqdm", "tqdm").tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=leave, dynamic_ncols=True)


# ------------------------------------------------------------------ argparse

_NUMBER = r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?"


class Parser(argparse.ArgumentParser):
    """argparse's parser, which also takes comma-separated negative numbers as values
    (``--axes -3,-2,-1``, ``--origin -1,0``), not as unknown options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import re

        self._negative_number_matcher = re.compile(rf"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?(,{_NUMBER})*$")



def finite_float(text: str) -> float:
    """argparse type: a finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def sigma_float(text: str) -> float:
    """argparse type: a finite float >= 0."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def mode_name(text: str) -> str:
    """argparse type: a SciPy mode name; a torch/NumPy/OpenCV name (``replicate``, ...) gets the
    SciPy name to use in its usage error."""
    if text in MODES:
        return text
    from torchfilters._validate import canonical_mode

    try:
        return canonical_mode(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated ints, e.g. ``-3,-2,-1``."""
    try:
        values = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values
