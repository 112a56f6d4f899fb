"""``torchfilters bench``: time one op on the user's own shape, in one process, against the
one-pass floor and every installed alternative, each checked for agreement first.

Rows: the floor (``torch.neg(x, out=y)``: one read and one write of the input, the least any
op moves; with ``--backward``, ``neg(x).backward(g)``), torchfilters (a plain call, and with
``out=``), then each alternative of :mod:`.alternatives` that is installed and can compute the
call.  An alternative whose result differs from torchfilters' beyond the dtype's tolerance is
reported as disagreeing, not timed.  Times are medians of ``torch.utils.benchmark``'s
``blocked_autorange`` with every thread of the process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .common import (
    PROG, InputError, MissingDependency, Parser, describe, error, int_list, positive_float, progress_bar, require, stdout_failed,
)

DTYPES = ("float32", "float64", "float16", "bfloat16")

#: values ``bench`` gives parameters that have no default (and the default kernels)
#: the most threads per core that --threads takes
_MAX_THREADS_PER_CORE = 4
BENCH_DEFAULTS = {"sigma": 2.0, "size": 5, "weights": None, "rank": 0, "percentile": 50.0}

_DESCRIPTION = """\
Time one op of torchfilters on your own shape, in this process, against the
one-pass floor torch.neg(x, out=y) and every installed alternative: SciPy
(its own function, per (H, W) slice where its N-D semantics differ, else
correlate1d passes), OpenCV per sample, Kornia, plain torch (index padding +
grouped F.conv2d) and torchvision where it applies. Each alternative's result is
checked against torchfilters' before timing: one that disagrees, or cannot
compute the call (another boundary mode, no autograd), is reported, not timed.

The table gives the median time, GB/s (bytes of one read of the input and one
write of the output, twice that with --backward, over the time), the ratio to
the floor and torchfilters' speed-up over each row. The op's own options
follow --op (those of 'torchfilters filter OP --help'), e.g.
  torchfilters bench --op gaussian_filter --sigma 3 --mode nearest
Parameters without a default get sigma=2, size=5 (also for the rank filters
when neither --size nor --footprint is given), rank=0, percentile=50 and a 3x3
binomial kernel.

The default shape (400 MB of float32) takes minutes on a small machine: the
slowest alternatives need seconds per call. --quick or a smaller --shape is
faster; a progress bar shows the row being timed.
"""

_EPILOG = """\
examples:
  torchfilters bench                                   # gradient_magnitude, (1000, 128, 28, 28)
  torchfilters bench --shape 64,3,256,256 --op sobel --plot bench.png --json bench.json
  torchfilters bench --op selective_blur --backward --shape 64,64,64,64
"""


def add_parser(sub: Any, make: Callable, build: bool = True) -> argparse.ArgumentParser:
    p = make(sub, "bench", "time an op against the one-pass floor and the installed alternatives",
             _DESCRIPTION, _EPILOG)
    p.set_defaults(subparser=p)
    if not build:
        return p
    p.add_argument("--op", default="gradient_magnitude", metavar="OP",
                   help="the op of torchfilters.functional to time (default: %(default)s)")
    p.add_argument("--shape", type=int_list, default=(1000, 128, 28, 28), metavar="N,N,...",
                   help="the input's shape, comma-separated (default: 1000,128,28,28)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="(default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: %(default)s)")
    p.add_argument("--backward", action="store_true", help="time forward + backward (autograd rows only)")
    timing = p.add_mutually_exclusive_group()
    timing.add_argument("--min-time", type=positive_float, default=1.0, metavar="S",
                        help="seconds of measurement per row, at least one call (default: %(default)s)")
    timing.add_argument("--quick", action="store_true",
                        help="--min-time 0.1: rougher figures, sooner (the slowest rows still run a few calls)")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart (needs matplotlib)")
    p.add_argument("--json", metavar="FILE.json", help="write the results as JSON")
    p.add_argument("--threads", type=int, metavar="N",
                   help=f"torch.set_num_threads(N) for every row, 1 to {_MAX_THREADS_PER_CORE} per core "
                   "(default: torch's, one per core)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random input, 0 to 2**64-1 (default: %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    return p


@dataclass
class Row:
    name: str
    kind: str  # floor, torchfilters, alternative
    status: str = "ok"  # ok, n/a, disagrees, error
    seconds: float | None = None
    gbps: float | None = None
    ratio_floor: float | None = None
    speedup: float | None = None  # this row's time over torchfilters' plain call
    max_rel_error: float | None = None
    note: str = ""


def _format_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= f or unit == "µs":
            return f"{s / f:.3g} {unit}" if s / f < 100 else f"{s / f:.0f} {unit}"
    return f"{s:.3g} s"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch

    text = f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    try:
        text += f", load average {os.getloadavg()[0]:.2f} at the start"
    except OSError:  # pragma: no cover - no load average on this platform
        pass
    return text


def versions(modules: list) -> dict:
    import numpy
    import torch

    import torchfilters

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "torchfilters": getattr(torchfilters, "__version__", "?"), "numpy": numpy.__version__}
    for name, mod in modules:
        out[name] = getattr(mod, "__version__", "?")
    if "numba" in sys.modules:
        out["numba"] = sys.modules["numba"].__version__
    return out


def _timer(fn: Callable[[], Any], min_time: float) -> float:
    import torch
    from torch.utils import benchmark

    t = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return float(t.blocked_autorange(min_run_time=min_time).median)


def _import(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except Exception:  # not installed, or installed but broken (a torchvision built for another torch)
        return None


def _kwargs_text(kwargs: dict) -> str:
    import numpy as np

    parts = []
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray):
            v = v.tolist()
        parts.append(f"{k}={v!r}")
    return ", ".join(parts)


def run(args: argparse.Namespace, extra: list | None = None) -> int:
    import numpy as np
    import torch

    from . import alternatives as alt
    from . import ops as _ops

    # time the fused engine: auto calls compile their kernels before the timed runs, never in
    # the background (``backends._tiered``)
    os.environ.setdefault("TORCHFILTERS_COMPILE", "wait")
    parser = args.subparser
    table = _ops.op_table()
    if args.op not in table:
        parser.error(f"argument --op: unknown op {args.op!r}; choose from {', '.join(table)}")
    fn = table[args.op]
    opp = Parser(prog=f"{PROG} bench --op {args.op}", description=f"options of {args.op}")
    import inspect

    sig = inspect.signature(fn).parameters
    defaults = {k: v for k, v in BENCH_DEFAULTS.items() if v is not None}
    defaults["weights"] = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]) / 16 if args.op in ("correlate", "convolve") \
        else np.array([1.0, 2.0, 1.0]) / 4
    defaults = {k: v for k, v in defaults.items() if k in sig and sig[k].default is inspect.Parameter.empty}
    names = _ops.add_op_options(opp, fn, defaults=defaults, required=False)
    opts = opp.parse_args(extra or [])
    kwargs = _ops.op_kwargs(opts, names)
    if "footprint" in sig and "size" in sig and sig["size"].default is None and kwargs.get("size") is None \
            and kwargs.get("footprint") is None:
        kwargs["size"] = BENCH_DEFAULTS["size"]  # (the rank filters: a window is required)
    kwargs = {k: v for k, v in kwargs.items() if not (k in sig and sig[k].default is not inspect.Parameter.empty
                                                      and _same(v, sig[k].default))}
    if args.quick:
        args.min_time = 0.1
    if args.plot:  # before minutes of timing, not after
        try:
            require("matplotlib", "matplotlib", extra="bench")
        except MissingDependency as exc:
            error(f"--plot: {exc}")
            return 1
    if args.threads is not None:
        most = _MAX_THREADS_PER_CORE * (os.cpu_count() or 1)
        if not 1 <= args.threads <= most:  # (thousands of threads crash torch's thread pools)
            parser.error(f"argument --threads: must be 1 to {most} ({_MAX_THREADS_PER_CORE} per core), "
                         f"got {args.threads}")
        torch.set_num_threads(args.threads)
    if not 0 <= args.seed < 2**64:
        parser.error(f"argument --seed: must be 0 to 2**64-1, got {args.seed}")
    dtype = getattr(torch, args.dtype)
    try:
        device = torch.device(args.device)
        torch.empty(0, device=device)
    except Exception as exc:
        parser.error(f"argument --device: {args.device!r} is not usable ({describe(exc)})")
    if any(not 0 < n < 2**63 for n in args.shape):
        parser.error(f"argument --shape: every size must be 1 to 2**63-1, got {args.shape}")
    info = machine()  # before the runs: its load average is the one at the start
    gen = torch.Generator().manual_seed(args.seed)
    try:
        x = torch.randn(args.shape, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)
    except (RuntimeError, MemoryError, OverflowError) as exc:  # (too large: torch's allocator or its int64 sizes)
        parser.error(f"argument --shape: cannot make an input of shape {args.shape} ({describe(exc)})")
    call_kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    try:
        with torch.no_grad():
            y_ref = fn(x, **call_kw)
    except Exception as exc:
        parser.error(_ops.name_option(describe(exc, 400), names, set(kwargs)))  # (kwargs: the options given)
    xr = x.detach().requires_grad_(True) if args.backward else None
    g = torch.randn(y_ref.shape, generator=gen, dtype=torch.float32).to(dtype=y_ref.dtype, device=device) \
        if args.backward else None
    grad_ref = None
    if args.backward:  # torch.autograd.grad everywhere: nothing accumulates in xr.grad
        try:
            (grad_ref,) = torch.autograd.grad(fn(xr, **call_kw), xr, g)
        except Exception as exc:
            parser.error(f"--backward: {args.op} has no backward here ({describe(exc)})")

    nbytes = (x.numel() * x.element_size() + y_ref.numel() * y_ref.element_size()) * (2 if args.backward else 1)
    rows: list[Row] = []
    work: list[tuple[Row, Callable[[], Any] | None]] = []

    y_buf = torch.empty_like(x)
    if args.backward:
        g_floor = torch.ones_like(x)
        floor_fn = lambda: torch.autograd.grad(torch.neg(xr), xr, g_floor)  # noqa: E731
        floor_name = "floor: torch.neg(x).backward(g)"
    else:
        floor_fn = lambda: torch.neg(x, out=y_buf)  # noqa: E731
        floor_name = "floor: torch.neg(x, out=y)"
    work.append((Row(floor_name, "floor"), floor_fn))
    if args.backward:
        work.append((Row("torchfilters", "torchfilters"), lambda: torch.autograd.grad(fn(xr, **call_kw), xr, g)))
    else:
        work.append((Row("torchfilters", "torchfilters"), lambda: fn(x, **call_kw)))
        if "out" in sig:
            out_buf = torch.empty_like(y_ref)
            work.append((Row("torchfilters (out=)", "torchfilters"), lambda: fn(x, **call_kw, out=out_buf)))

    try:
        rec = alt.recipe(args.op, kwargs, x.dim())
        rec_error = None
    except alt.Unsupported as exc:
        rec, rec_error = None, str(exc)
    missing, used = [], []
    for a in alt.ALTERNATIVES:
        mod = _import(a.module)
        name = alt.scipy_label(rec) if a.name == "SciPy" else a.name
        if mod is None:
            missing.append(alt.PIP_NAMES.get(a.module, a.module))
            continue
        used.append((a.module.split(".")[0].replace("cv2", "opencv"), sys.modules[a.module.split(".")[0]]))
        if device.type != "cpu" and not a.autograd:
            name += " (on the CPU, from a NumPy copy)"
        row = Row(name, "alternative")
        if rec is None:
            row.status, row.note = "n/a", f"no plain equivalent of this call: {rec_error}"
            work.append((row, None))
            continue
        work.append((row, _checked(a, rec, x, xr, g, y_ref, grad_ref, args.backward, row)))

    bar = progress_bar(len(work), f"{PROG} bench", "row", not args.quiet)
    try:
        for row, f in work:
            if bar is not None:
                bar.set_postfix_str(row.name[:30], refresh=True)
            if f is not None:
                try:
                    if row.kind == "alternative":
                        f = f()  # the agreement check: returns the function to time, or None
                    if f is not None:
                        f()  # warm-up
                        row.seconds = _timer(f, args.min_time)
                except alt.Unsupported as exc:
                    row.status, row.note = "n/a", str(exc)
                except Exception as exc:  # a library that fails on this input: say so, keep going
                    row.status, row.note = "error", f"{type(exc).__name__}: {describe(exc)}"
            rows.append(row)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    floor = rows[0].seconds
    tf_time = rows[1].seconds
    for r in rows:
        if r.seconds:
            r.gbps = nbytes / r.seconds / 1e9
            r.ratio_floor = r.seconds / floor if floor else None
            r.speedup = r.seconds / tf_time if tf_time and r.kind == "alternative" else None

    call = ", ".join(["x", _kwargs_text(kwargs)]) if kwargs else "x"
    title = (f"{args.op}({call}) on {tuple(args.shape)} {args.dtype}, "
             f"{device}, {'forward + backward' if args.backward else 'forward'}")
    result = dict(op=args.op, kwargs={k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in kwargs.items()
                                      if not isinstance(v, torch.Tensor)},
                  shape=list(args.shape), dtype=args.dtype, device=str(device), backward=args.backward,
                  bytes=nbytes, title=title, machine=info,
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                  versions=versions(used), not_installed=missing, rows=[asdict(r) for r in rows])
    status = 0
    try:
        print(render_table(result), flush=True)
    except OSError as exc:  # stdout closed (``| head``) or full: the files are written all the same
        status = stdout_failed(exc)
    if args.json:
        status = _write(Path(args.json), lambda f: f.write(json.dumps(result, indent=2, default=str).encode() + b"\n")) \
            or status
    if args.plot:
        from .plot import figure_writer

        try:
            status = _write(Path(args.plot), figure_writer(result)) or status
        except MissingDependency as exc:
            error(f"--plot: {exc}")
            status = 1
    return status


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


def _write(path: Path, write: Callable[[Any], None]) -> int:
    from .outputs import signals_raise, write_atomic

    try:
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        with signals_raise():
            write_atomic(path, write)
    except (InputError, OSError) as exc:
        error(f"{path}: {exc if isinstance(exc, InputError) else describe(exc)}")
        return 1
    print(f"{PROG}: wrote {path}", file=sys.stderr)
    return 0


def _checked(a: Any, rec: Any, x: Any, xr: Any, g: Any, y_ref: Any, grad_ref: Any, backward: bool,
             row: Row) -> Callable[[], Callable[[], Any] | None]:
    """A step that builds alternative ``a``, checks its result against torchfilters' and
    returns the function to time (None, with ``row`` marked, when it disagrees)."""
    from . import alternatives as alt

    def step() -> Callable[[], Any] | None:
        if backward and not a.autograd:
            raise alt.Unsupported("no autograd")
        f = a.build(rec, x, backward)
        torch_based = a.autograd
        tol = alt.tolerance(x.dtype)
        if backward:
            import torch

            out = f(xr)
            (grad,) = torch.autograd.grad(out, xr, g)
            err = max(alt.max_rel_error(out, y_ref), alt.max_rel_error(grad, grad_ref))
        else:
            out = f(x) if torch_based else f()
            err = alt.max_rel_error(out, y_ref)
        row.max_rel_error = err
        if not err <= tol:
            row.status = "disagrees"
            row.note = (f"max |difference| {err:.3g} of the largest value (tolerance {tol:g})"
                        if math.isfinite(err) else "a different shape, or NaN where torchfilters has none")
            return None
        if backward:
            import torch

            return lambda: torch.autograd.grad(f(xr), xr, g)
        return (lambda: f(x)) if torch_based else f

    return step


def render_table(result: dict) -> str:
    """The results as a text table."""
    rows = result["rows"]
    head = ("case", "median", "GB/s", "× floor", "tf speed-up")
    lines = [f"{PROG} bench: {result['title']}", f"machine: {result['machine']}"
             + (f", {result['gpu']}" if result.get("gpu") else ""),
             "versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()), ""]
    width = max(len(head[0]), *(len(r["name"]) for r in rows))
    lines.append(f"{head[0]:<{width}}  {head[1]:>10}  {head[2]:>7}  {head[3]:>8}  {head[4]:>11}")
    for r in rows:
        if r["seconds"] is None:
            lines.append(f"{r['name']:<{width}}  {r['status']}: {r['note']}")
            continue
        sp = f"{r['speedup']:.2f}×" if r["speedup"] else ""
        lines.append(f"{r['name']:<{width}}  {_format_time(r['seconds']):>10}  {r['gbps']:7.2f}  "
                     f"{r['ratio_floor']:8.2f}  {sp:>11}")
    if result["not_installed"]:
        lines.append("not installed: " + ", ".join(result["not_installed"])
                     + " (pip install 'torchfilters[bench]')")
    lines.append("GB/s: one read of the input and one write of the output"
                 + (" (and of the gradients)" if result["backward"] else "") + " over the median time; "
                 "tf speed-up: the row's time over torchfilters'.")
    return "\n".join(lines)
