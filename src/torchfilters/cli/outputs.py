"""Outputs: their names, their 8-bit PNG scaling, and all-or-nothing writes.

Every output is written to a temporary file in the target folder (``.<name>.<random>.tmp``),
flushed, fsynced, and renamed onto its final name (``os.replace``, atomic on POSIX).  Any
exception, a full disk, ``SIGINT`` or ``SIGTERM`` (see :func:`signals_raise`) removes the
temporary: a final name only ever holds a complete file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import signal
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .common import DiskFull, InputError, Terminated, describe, require

#: bytes per write() call: a signal is acted on between chunks, not after a whole large array
CHUNK = 8 << 20
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}


def output_names(sources: Sequence[Any], suffix: str, fmt: str) -> list[str]:
    """The output file name of each source, in order (the rule the README states):

    1. ``<stem>_<suffix>.<fmt>`` when no other input of the run has the same stem;
    2. ``<stem>_<ext>_<suffix>.<fmt>`` for every input whose stem another input shares
       (``rgb.jpeg`` and ``rgb.tiff`` give ``rgb_jpeg_edges.png`` and ``rgb_tiff_edges.png``);
    3. a name still taken (the same file name in two folders, or a stem like ``rgb_png``)
       gets ``_2``, ``_3``, ... before the suffix, in input order.
    """
    stems = Counter(s.stem for s in sources)
    used: set[str] = set()
    names = []
    for s in sources:
        base = f"{s.stem}_{s.ext}" if stems[s.stem] > 1 and s.ext else s.stem
        name, n = f"{base}_{suffix}.{fmt}", 2
        while name in used:
            name, n = f"{base}_{n}_{suffix}.{fmt}", n + 1
        used.add(name)
        names.append(name)
    return names


# ------------------------------------------------------------------ PNG scaling


def _to_uint8(t: Any, lo: float, hi: float) -> Any:
    """Map ``[lo, hi]`` linearly to 0..255 (clipped, NaN -> 0) as uint8."""
    import torch

    t = t.float()
    span = hi - lo
    scaled = torch.zeros_like(t) if not span > 0 else (t - lo) * (255.0 / span)
    scaled = torch.nan_to_num(scaled, nan=0.0, posinf=255.0, neginf=0.0)
    return scaled.clamp_(0, 255).round_().to(torch.uint8)


def _finite_range(t: Any) -> tuple[float, float]:
    import torch

    finite = t[torch.isfinite(t)]
    if finite.numel() == 0:
        return 0.0, 0.0
    return float(finite.min()), float(finite.max())


def png_scaling(result: Any, from_image: bool, magnitude: bool) -> str:
    """How a result becomes 8 bits: ``max`` (0 black, the largest value white: magnitudes),
    ``signed`` (0 mid-gray, -m black, +m white for m the largest |value|: results with negative
    values), ``brightness`` (image inputs: [0, 1] to 0..255, clipped) or ``minmax``."""
    lo, _ = _finite_range(result)
    if magnitude:
        return "max"
    if lo < 0:
        return "signed"
    return "brightness" if from_image else "minmax"


def png_array(result: Any, from_image: bool, magnitude: bool) -> Any:
    """The 8-bit ``H×W`` or ``H×W×3`` array written as PNG for an ``(H, W)`` or
    ``(C, H, W)`` result (C = 1 or 3)."""
    if not (result.dim() == 2 or (result.dim() == 3 and result.shape[0] in (1, 3))):
        raise InputError(f"cannot write a PNG of a result of shape {tuple(result.shape)} "
                         "(H×W or 1 or 3 channels needed); use --format npy or --format pt")
    if result.numel() == 0:
        raise InputError(f"cannot write a PNG of an empty result (shape {tuple(result.shape)}); "
                         "use --format npy or --format pt")
    lo, hi = _finite_range(result)
    how = png_scaling(result, from_image, magnitude)
    if how == "max":
        u8 = _to_uint8(result, 0.0, hi)
    elif how == "signed":
        m = max(abs(lo), abs(hi))
        u8 = _to_uint8(result, -m, m)
    elif how == "brightness":
        u8 = _to_uint8(result, 0.0, 1.0)
    else:
        u8 = _to_uint8(result, lo, hi)
    arr = u8.numpy()
    if arr.ndim == 3:
        arr = arr[0] if arr.shape[0] == 1 else arr.transpose(1, 2, 0).copy()
    return arr


def encode(result: Any, fmt: str, from_image: bool = False, magnitude: bool = False) -> Callable[[Any], None]:
    """A function writing ``result`` (a CPU tensor) as ``fmt`` to a binary file object."""
    import numpy as np
    import torch

    if fmt == "png":
        iio = require("imageio.v3", "imageio")
        data = iio.imwrite("<bytes>", png_array(result, from_image, magnitude), extension=".png")
        return lambda f: _write_chunked(f, memoryview(data))
    if fmt == "npy":
        raw = result.float() if result.dtype == torch.bfloat16 else result  # .npy has no bfloat16
        arr = raw.numpy()
        arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)

        return lambda f: _write_npy(f, arr, np)
    if fmt == "pt":
        return lambda f: torch.save(result.clone(), f)
    raise ValueError(fmt)


def _write_npy(f: Any, arr: Any, np: Any) -> None:
    fmt = np.lib.format
    d = fmt.header_data_from_array_1_0(arr)
    try:
        fmt.write_array_header_1_0(f, d)
    except ValueError:  # a header over 64 KiB (a very long shape): format 2.0
        fmt.write_array_header_2_0(f, d)
    _write_chunked(f, memoryview(arr.reshape(-1)).cast("B") if arr.size else memoryview(b""))


def _write_chunked(f: Any, data: memoryview) -> None:
    for start in range(0, len(data), CHUNK):
        f.write(data[start:start + CHUNK])


# ------------------------------------------------------------------ atomic writes

_BLOCK = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back for a few system calls (they are delivered afterwards)."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCK)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_atomic(path: Path, write: Callable[[Any], None], count: list | None = None) -> int:
    """Write a file all or nothing: ``write(f)`` fills a temporary in ``path``'s folder, which is
    flushed, fsynced and renamed onto ``path``; on any exception (a signal included) the
    temporary is removed and ``path`` is untouched.  ``count[0]`` (a count of the files written)
    is incremented with the rename, signals held off across both, in the same frame (no call: a
    signal already pending is acted on at a call's start), so it is never one short.  Returns
    the file's size.

    Raises :class:`DiskFull` when the file system is full, :class:`InputError` for other
    failures to write; anything else (KeyboardInterrupt, :class:`Terminated`) propagates.
    """
    folder = path.parent
    tmp = folder / f".{path.name}.{secrets.token_hex(4)}.tmp"
    fd = -1
    try:
        with _signals_blocked():  # the temporary exists only if the finally below will see it
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with os.fdopen(fd, "wb", buffering=CHUNK) as f:
            fd = -2  # owned by f now
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        with _signals_blocked():
            os.replace(tmp, path)
            tmp = None  # type: ignore[assignment]
            if count is not None:
                count[0] += 1
        _fsync_dir(folder)
        return size
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise DiskFull(f"cannot write {path.name}: no space left on device") from None
        raise InputError(f"cannot write {path.name} ({describe(exc).lower()})") from None
    finally:
        with _signals_blocked():  # a signal now must not skip the clean-up
            if fd >= 0:
                os.close(fd)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While active, SIGTERM raises :class:`Terminated` (SIGINT raises KeyboardInterrupt, as
    always), so that every ``finally`` runs and no temporary is left behind."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
