"""The ``torchfilters`` argument parser and :func:`main`.

``torchfilters --help``, ``edges --help`` and the like import no engine (and not even the
ops): the ``filter`` sub-command's per-op parsers, made from the ops' signatures, are built
only when the command line names ``filter``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any, Sequence

from . import ops as _ops
from .common import DEFAULT_OUT, FORMATS, PROG, Parser, MissingDependency, Terminated, error, stdout_failed
from .inputs import SAMPLE_IMAGES

WARMUP_DTYPES = ("float32", "float64", "float16", "bfloat16")
#: ``warmup``'s default ``--jobs`` is the CPUs available up to this (each worker holds numba and
#: LLVM: a few hundred MiB)
WARMUP_MAX_JOBS = 4

_DESCRIPTION = """\
Exact scipy.ndimage-style filters on files, computed with PyTorch.

Each INPUT (an image, a .npy/.pt array, or a folder of them) gives one output
file in --out, written all or nothing. With no INPUT the scikit-image sample
images are used. 'edges' and 'blur' are short forms; 'filter OP' runs any op
of torchfilters.functional; 'bench' times an op against the alternatives.
"""

_EPILOG = """\
examples:
  torchfilters edges                          # edge maps of the sample images
  torchfilters edges photos/ --operator scharr --out edges
  torchfilters blur img.png --sigma 2 --threshold 0.5 --format npy
  torchfilters filter gaussian_filter --sigma 2 --mode nearest scan.tif
  torchfilters filter --help                  # the list of ops
  torchfilters bench --shape 64,3,128,128 --plot bench.png

exit status: 0 when every input was written, 1 when some input failed (one
line on stderr per failure, the others are still written), 2 for bad options,
130 on Ctrl-C and 143 on SIGTERM (no partial file is ever left).
"""

_EDGES_DESCRIPTION = """\
Edge maps: torchfilters.gradient_magnitude(x, operator=OP, mode=MODE, cval=CVAL)
of every channel of every INPUT, i.e. sqrt(gx² + gy²) of the x- and
y-derivatives (Sobel by default). One output file <stem>_edges.<fmt> per input
in --out. PNG output is divided by the map's maximum, so the strongest edge is
white. The same as 'torchfilters filter gradient_magnitude --operator sobel'.
"""

_BLUR_DESCRIPTION = """\
Selective blur: torchfilters.selective_blur(x, THRESHOLD, sigma=S, ...) of
every channel of every INPUT. Pixels with value >= THRESHOLD are replaced by a
blur of their neighbourhood (the 3x3 binomial kernel [1,2,1]^T[1,2,1]/16, or a
Gaussian with --sigma); the other pixels are kept. Image files are read into
[0, 1], so the default threshold 0 blurs every pixel of an image. One output
file <stem>_blur.<fmt> per input in --out.
"""

_FILTER_DESCRIPTION = """\
Run any op of torchfilters.functional on files: 'torchfilters filter OP
[INPUT ...] [--param value ...]'. The options of each op are its parameters
(keep_border is --keep-border), typed from its signature; sequences are
comma-separated, one value per axis (--sigma 1,2 --axes -3,-2,-1 --mode
wrap,reflect); kernels (--weights) are a .npy/.pt file or inline numbers
(1,2,1 or 1,2,1;2,4,2;1,2,1). 'torchfilters filter OP --help' lists them.
Arrays are passed as they are stored (any rank the op accepts); images as
(H, W) or (C, H, W). The output of INPUT <stem>.<ext> is <stem>_<OP>.<fmt>.
"""

_WARMUP_DESCRIPTION = """\
Compile every kernel of the CPU engine (each op, operator, boundary-mode class,
forward and backward) for the given dtypes into numba's disk cache, so that no
later process compiles at run time: run it once when building a container image,
a CI runner or a cluster node.  The cache lives in NUMBA_CACHE_DIR if set, else in
the package's __pycache__ folders, else (a read-only install) in the per-user
cache folder; the summary line names it.  A later process loads each kernel from
there on first use (0.5-1.2 s for numba's import and the cache, in the background under the
default TORCHFILTERS_COMPILE=background) instead of compiling it (1-3 s each).
The calls run in --jobs worker processes side by side (the cache's locks compile each
kernel once between them); --only limits them to the kernels of the ops named.
"""

_INPUT_HELP = f"""\
image file (.png .jpg .jpeg .tif .tiff), .npy array, .pt/.pth tensor, or a
folder of them (its files with these extensions, sorted, not recursive); a
file named here is recognised by its content, whatever its name. Images
become (H, W) or (C, H, W) float32 tensors, unsigned integers scaled to
[0, 1], alpha dropped; bool arrays are refused, as the API does. Default:
scikit-image's bundled sample images ({", ".join(SAMPLE_IMAGES)})."""

# ------------------------------------------------------------------ the commands


class _VersionAction(argparse.Action):
    """``--version``: like argparse's, but looks the version up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        try:
            print(f"{parser.prog} {_version()}", flush=True)
        except OSError as exc:  # a closed pipe, a full disk
            parser.exit(stdout_failed(exc))
        parser.exit()


def _version() -> str:
    from _torchfilters_cli import version

    found = version()
    if found is None:  # running from a source tree, not installed
        import torchfilters

        found = str(getattr(torchfilters, "__version__", "unknown"))
    return found


def _file_options(parser: argparse.ArgumentParser) -> None:
    """INPUT, --out, --format, --device, --quiet: every filtering sub-command has them."""
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help=_INPUT_HELP)
    parser.add_argument("--out", "-o", default=DEFAULT_OUT, metavar="DIR",
                        help="output folder, created if needed; an existing file of the same name is "
                             "replaced (default: %(default)s)")
    parser.add_argument("--format", "-f", default="png", choices=FORMATS,
                        help="png (8-bit image, scaled for viewing), npy or pt (the raw result, same "
                             "shape and dtype as the op returns) (default: %(default)s)")
    parser.add_argument("--device", default="cpu",
                        help="torch device to compute on, e.g. cpu, cuda, cuda:1 (default: %(default)s)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress bar and no summary line (errors are still printed)")


def _sub(sub: Any, name: str, help: str, description: str, epilog: str | None = _EPILOG) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


# The short forms: an op, the parameters offered, their defaults, flags and help.
EDGES = dict(op="gradient_magnitude", only=("operator", "mode", "cval", "normalized"),
             defaults={"operator": "sobel"}, short={},
             helps={"operator": "derivative operator: central [-1,0,1]; sobel, scharr, prewitt ([-1,0,1] "
                                "times the smoothing [1,2,1], [3,10,3], [1,1,1])",
                    "normalized": "normalise the derivative so that a unit ramp has slope 1"})
BLUR = dict(op="selective_blur", only=("threshold", "sigma", "normalized", "keep_border", "mode", "cval"),
            defaults={}, short={"threshold": "-t", "sigma": "-s"},
            helps={"threshold": "blur the pixels with value >= THRESHOLD",
                   "sigma": "Gaussian blur with this sigma in pixels (one, or one per axis; truncated at 4 "
                            "sigma) instead of the 3x3 binomial kernel",
                   "normalized": "weighted mean over the selected neighbours only, blur(m*x)/blur(m), so "
                                 "unselected pixels never leak in (without it: blend, where(m, blur(x), x))",
                   "keep_border": "leave a border band of the kernel radius untouched"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of the ``torchfilters`` command.

    The options made from the ops' signatures (``edges``, ``blur``, ``filter OP``, ``bench``)
    import the ops, so :func:`main` asks only for those of the ``command`` its command line
    names (``""``: none, for ``torchfilters --help`` and ``--version``); ``None`` builds all.
    """
    def wanted(name: str) -> bool:
        return command is None or command == name

    parser = Parser(prog=PROG, description=_DESCRIPTION, epilog=_EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction, help="print the version of torchfilters and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for name, spec, help, desc in (
        ("edges", EDGES, "gradient magnitude sqrt(gx² + gy²) (torchfilters.gradient_magnitude)", _EDGES_DESCRIPTION),
        ("blur", BLUR, "blur only the pixels >= THRESHOLD (torchfilters.selective_blur)", _BLUR_DESCRIPTION),
    ):
        p = _sub(sub, name, help, desc)
        if wanted(name):
            _file_options(p)
            spec = dict(spec)
            _short_form_options(p, spec)
            p.set_defaults(spec=spec, subparser=p)

    filt = _sub(sub, "filter", "any op of torchfilters.functional: torchfilters filter OP --help",
                _FILTER_DESCRIPTION)
    filt.set_defaults(subparser=filt)
    if wanted("filter"):
        ops_sub = filt.add_subparsers(dest="op", metavar="OP", required=True)
        for op_name, fn in _ops.op_table().items():
            summary = (fn.__doc__ or op_name).strip().splitlines()[0].replace("``", "")
            p = ops_sub.add_parser(op_name, help=summary.replace("%", "%%"),
                                   description=f"torchfilters.{op_name}: {summary}".replace("%", "%%"),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
            _file_options(p)
            names = _ops.add_op_options(p, fn)
            p.set_defaults(spec=dict(op=op_name, names=names), subparser=p)
    else:
        filt.add_argument("op", metavar="OP", help="the op; 'torchfilters filter --help' lists them")

    from . import bench as _bench

    _bench.add_parser(sub, _sub, build=wanted("bench"))

    warm = _sub(sub, "warmup", "compile every CPU kernel into the disk cache (for container images, CI, clusters)",
                _WARMUP_DESCRIPTION, epilog=None)
    warm.add_argument("--dtype", action="append", choices=WARMUP_DTYPES + ("all",), metavar="DTYPE",
                      help="dtype to compile for, repeatable: %(choices)s (default: float32)")
    warm.add_argument("--only", action="append", metavar="OP",
                      help="compile only the kernels of the warmup's calls of this op (any op of torchfilters.functional: "
                           "gaussian_filter, sobel, median_filter, ...), repeatable (default: every op)")
    warm.add_argument("--jobs", "-j", type=int, metavar="N",
                      help=f"processes to compile in (default: the CPUs available, at most {WARMUP_MAX_JOBS}); "
                           "1 compiles in this process")
    warm.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary line")
    warm.set_defaults(subparser=warm)
    return parser


def _short_form_options(p: argparse.ArgumentParser, spec: dict) -> None:
    """The options of ``edges``/``blur``: the listed parameters of their op, with fixed
    names, so that building them needs the op's signature only (imported lazily)."""
    from torchfilters import functional

    fn = getattr(functional, spec["op"])
    spec["names"] = _ops.add_op_options(p, fn, only=spec["only"], defaults=spec["defaults"],
                                        short=spec["short"], helps=spec["helps"])


# ------------------------------------------------------------------ running


#: ``warmup()``'s parameters and the options that give them
_WARMUP_OPTIONS = {"only": "--only", "jobs": "--jobs/-j"}


def _warmup_option_error(message: str) -> str:
    """A ``warmup()`` argument error naming the option, in the words of argparse's errors:
    ``only: 'x' is not an op ...`` -> ``argument --only: 'x' is not an op ...``, ``jobs must be at
    least 1; got 0`` -> ``argument --jobs/-j: must be at least 1; got 0``."""
    for name, option in _WARMUP_OPTIONS.items():
        for sep in (": ", " "):
            if message.startswith(name + sep):
                return f"argument {option}: {message[len(name) + len(sep):]}"
    return message


def _warmup(args: argparse.Namespace) -> int:
    import torch

    from torchfilters import backends

    try:
        backends._tiered._mode()  # (a bad TORCHFILTERS_COMPILE: one line, as the other commands give)
    except ValueError as exc:
        error(str(exc))
        return 1
    if backends.get("cpu") is None:
        err = backends._import_errors.get("cpu")
        error(f"the CPU engine cannot be imported ({err or 'is numba installed?'}); nothing to compile")
        return 1
    from torchfilters.backends.cpu import warmup as wu

    from .common import progress_bar
    from .outputs import signals_raise

    names = args.dtype or ["float32"]
    names = list(WARMUP_DTYPES) if "all" in names else list(dict.fromkeys(names))
    dtypes = [getattr(torch, n) for n in names]
    jobs = args.jobs if args.jobs is not None else min(WARMUP_MAX_JOBS, wu.available_cpus())
    try:
        wu._plan(dtypes, jobs, args.only)  # (bad options: a usage error, before anything runs)
    except ValueError as exc:
        error(_warmup_option_error(str(exc)))
        return 2
    bar = progress_bar(None, f"{PROG} warmup", " calls", not args.quiet)

    def progress(label: str) -> None:
        if bar is not None:
            bar.set_description(label)
            bar.update()

    try:
        with signals_raise():  # (SIGTERM unwinds too: the worker processes are ended)
            report = wu.warmup(dtypes, progress, jobs=jobs, only=args.only)
    except RuntimeError as exc:  # (a worker process failed: one line, then the end of its stderr)
        first, _, rest = str(exc).partition("\n")
        error(first, bar)
        if rest:
            print(rest, file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
    if not args.quiet:
        print(f"{PROG}: warmup: {report.compiled} kernel(s) compiled, {report.loaded} loaded from the cache, "
              f"{report.calls} calls, {report.seconds:.1f} s ({', '.join(names)}; {jobs} process"
              f"{'es' if jobs > 1 else ''}); "
              f"cache: {report.cache_dir or 'none (no writable folder)'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "warmup":
        return _warmup(args)
    if args.command == "bench":
        from . import bench as _bench

        return _bench.run(args, getattr(args, "extra", []))
    from .run import Job, run_files

    spec = args.spec
    fn = _ops.op_table()[spec["op"]]
    names = spec["names"]
    kwargs = _ops.op_kwargs(args, names)
    if args.command == "edges":
        job = Job("edges", fn, kwargs, "edges", (2, 3), True, names)
    elif args.command == "blur":
        job = Job("blur", fn, kwargs, "blur", (2, 3), False, names)
    else:
        job = Job(f"filter {spec['op']}", fn, kwargs, spec["op"], None, spec["op"].endswith("magnitude"), names)
    return run_files(args, args.subparser, job)


def _command(argv: Sequence[str]) -> str:
    """The sub-command the command line names: its first word that is not an option."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return ""


def _leaf(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The innermost subparser ``args`` came through (``filter OP``'s, ``edges``' ...)."""
    for attr in ("command", "op"):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, attr, None)
        if not subs or name not in subs[0].choices:
            break
        parser = subs[0].choices[name]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``torchfilters`` command with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status: 0 when every input was written, 1 when some input failed or a
    dependency is missing, 130 after Ctrl-C and 143 after SIGTERM.  Usage errors (bad options,
    ``--help``, ``--version``) raise :class:`SystemExit` as argparse does (status 2 for errors,
    0 for help and version).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        command = _command(argv)
        parser = build_parser(command)
        if command == "bench":  # the op's own options follow --op: bench parses them with the op's parser
            args, args.extra = parser.parse_known_args(argv)
        else:
            args, extra = parser.parse_known_args(argv)
            if extra:  # the usage of the (sub)command the user typed, not the top level's
                _leaf(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        return _run(args)
    except MissingDependency as exc:
        error(str(exc))
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Terminated:  # (raised only where a command asked for it: ``outputs.signals_raise``)
        print(f"{PROG}: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError as exc:  # the reader of stdout went away (``| head``)
        return stdout_failed(exc)

