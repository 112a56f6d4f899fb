"""The one loop every filtering sub-command (``edges``, ``blur``, ``filter OP``) runs: read each
input, filter it, write its output all or nothing, one error line per bad file, a progress bar,
and a summary that counts complete files only."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import inputs as _inputs
from .common import PROG, DiskFull, InputError, Terminated, describe, error, progress_bar
from .ops import given_options, name_option
from .outputs import encode, output_names, signals_raise, write_atomic


@dataclass
class Job:
    """What a filtering sub-command asks of :func:`run_files`."""

    command: str  # for messages: "edges", "filter gaussian_filter"
    fn: Callable[..., Any]  # the op
    kwargs: dict  # its keyword arguments
    suffix: str  # output name suffix: "edges", "blur", the op's name
    ranks: tuple[int, int] | None  # allowed array ranks, None: any (the op checks)
    magnitude: bool  # PNG: divide by the maximum (see outputs.png_scaling)
    param_names: list  # the op's parameters offered as options (to name them in errors)


#: the fused CPU engine loads (in the background) once the reference engine's estimated time for
#: a file, times the files left after the next one, reaches this (seconds).  Loading it (numba's
#: import and the kernels' cache, about a second) costs more than a smaller job's filtering, slows
#: the calls meanwhile (the GIL) and holds up the exit (a load in hand is finished); the next file
#: runs on the reference engine while it loads, so it pays only from the file after that on
_SMALL_JOB_S = 1.0


def _device(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    import torch

    try:
        device = torch.device(args.device)
        torch.empty(0, device=device)
    except Exception as exc:
        parser.error(f"argument --device: {args.device!r} is not usable ({describe(exc)})")
    return device


def _probe(job: Job, device: Any, parser: argparse.ArgumentParser) -> None:
    """Call the op on tiny tensors so that a value it refuses is one usage error naming the
    option, not the same error for every input.  Options are refused only when every rank
    from 2 to 5 refuses them (``--axis 0`` is fine for a 2-D image, not for a batch)."""
    import torch
    from torchfilters.backends import _tiered

    kwargs = {k: v for k, v in job.kwargs.items() if k != "mask"}  # a mask fits the inputs, not the probe
    first = None
    for shape in ((4, 5), (3, 4, 5), (2, 3, 4, 5), (2, 2, 3, 4, 5)):
        try:
            with torch.no_grad(), _tiered.deferred_loading():  # (tiny: never worth loading the engine)
                job.fn(torch.zeros(shape, device=device), **kwargs)
            return
        except Exception as exc:
            first = first or exc
    parser.error(name_option(describe(first, 400), job.param_names, given_options(parser, job.kwargs)))


def run_files(args: argparse.Namespace, parser: argparse.ArgumentParser, job: Job) -> int:
    """Filter every INPUT of ``args`` with ``job``; the exit status."""
    import torch
    from torchfilters.backends import _tiered

    device = _device(args, parser)
    job.kwargs = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in job.kwargs.items()}
    _probe(job, device, parser)

    sources, errors = _inputs.expand_inputs(args.inputs, _inputs.SAMPLE_IMAGES,
                                            (Path(args.out), f"_{job.suffix}.{args.format}"))
    for line in errors:
        error(line)
    failed = len(errors)
    names = output_names(sources, job.suffix, args.format)
    out_dir = Path(args.out)
    if sources:
        try:
            if out_dir.exists() and not out_dir.is_dir():
                error(f"{args.out}: the output folder is a file")
                return 1
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # (exists() too raises some: a name too long)
            error(f"{args.out}: cannot create output folder ({describe(exc).lower()})")
            return 1

    bar = progress_bar(len(sources), f"{PROG} {job.command}", "file", not args.quiet and len(sources) > 1,
                       leave=True)
    written = [0]  # (incremented by write_atomic with each rename)
    status = None
    small = True  # until a file's estimated time says the job is large (_SMALL_JOB_S)
    try:
        with signals_raise():
            for i, (source, name) in enumerate(zip(sources, names)):
                if bar is not None:
                    bar.set_postfix_str(source.stem, refresh=False)
                try:
                    loaded = _inputs.load(source, job.ranks)
                    # (``spent``: the reference engine's estimated nanoseconds of the calls it ran)
                    with torch.no_grad(), _tiered.deferred_loading() if small else contextlib.nullcontext() as spent:
                        try:
                            y = job.fn(loaded.tensor.to(device), **job.kwargs)
                        except Exception as exc:
                            raise InputError(f"the filter refused this input ({describe(exc)})") from None
                    if spent is not None and sum(spent) * 1e-9 * (len(sources) - i - 2) >= _SMALL_JOB_S:
                        small = False
                        _tiered.load_in_background()  # (before this file is encoded and written)
                    write = encode(y.detach().cpu(), args.format, loaded.from_image, job.magnitude)
                    write_atomic(out_dir / name, write, written)
                except DiskFull as exc:
                    error(f"{source.label}: {exc}", bar)
                    failed += 1
                    left = len(sources) - i - 1
                    if left:
                        error(f"{args.out}: the disk is full; stopped, {left} input(s) not processed", bar)
                        failed += left
                    break
                except InputError as exc:
                    error(f"{source.label}: {exc}", bar)
                    failed += 1
                if bar is not None:
                    bar.update(1)
    except KeyboardInterrupt:
        status = ("interrupted", 130)
    except Terminated:
        status = ("terminated (SIGTERM)", 128 + signal.SIGTERM)
    finally:
        if bar is not None:
            bar.close()
    where = f" to {out_dir}" if written[0] else ""  # (no file: the folder may not exist)
    if status is not None:
        print(f"{PROG}: {status[0]}: wrote {written[0]} complete file(s){where}, no partial file left",
              file=sys.stderr)
        return status[1]
    if not args.quiet:
        print(f"{PROG}: wrote {written[0]} file(s){where}" + (f", {failed} input(s) failed" if failed else ""),
              file=sys.stderr)
    return 1 if failed else 0
