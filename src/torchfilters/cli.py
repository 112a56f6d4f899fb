"""The ``torchfilters`` command line: edge maps and selective blur of files.

Two filtering sub-commands, one result file per input, and ``warmup``::

    torchfilters edges [INPUT ...] [--operator sobel] [--mode reflect] [--cval 0]
                       [--normalized] [--out DIR] [--format png|npy|pt]
    torchfilters blur  [INPUT ...] [--threshold 0.0] [--sigma S] [--normalized]
                       [--keep-border] [--mode reflect] [--cval 0]
                       [--out DIR] [--format png|npy|pt]
    torchfilters warmup [--dtype float32|float64|float16|bfloat16|all ...]

``edges`` computes :func:`torchfilters.gradient_magnitude` and ``blur``
computes :func:`torchfilters.selective_blur` (see their docstrings for the
exact semantics).

Inputs
------
An INPUT is

* an image file (``.png``, ``.jpg``/``.jpeg``, ``.tif``/``.tiff``), read with
  ``imageio.v3``.  A gray ``H×W`` image becomes a ``(1, H, W)`` tensor, a colour
  ``H×W×C`` image a ``(C, H, W)`` tensor and every channel is filtered on its
  own.  An alpha channel (2- or 4-channel images) is dropped: the edge map of
  the transparency is rarely wanted and would make the output PNG invisible.
  Unsigned integer images are scaled to ``[0, 1]`` (``uint8`` divided by 255,
  ``uint16`` by 65535, ...), boolean images become 0/1, float images are used
  as they are; everything is computed in float32.
* a ``.npy`` array (``numpy.load``, no pickles) or a ``.pt``/``.pth`` tensor
  (``torch.load(..., weights_only=True)``) of shape ``(H, W)`` or
  ``(C, H, W)``.  Values are used as they are: float16/bfloat16/float32/float64
  keep their dtype, integers and booleans become float32.
* a folder: every file directly inside it with one of the extensions above,
  in sorted order (not recursive).

With no INPUT at all the command runs on a few of scikit-image's bundled
sample images (:data:`SAMPLE_IMAGES`), which need no network access.

Outputs
-------
For an input ``<stem>.<ext>`` the result is written to
``DIR/<stem>_edges.<fmt>`` or ``DIR/<stem>_blur.<fmt>`` (``DIR`` defaults to
``torchfilters-out`` and is created if needed; a stem already used in the same
run gets its source extension added, e.g. ``a_npy_edges.png``).

* ``--format png`` (default) writes an 8-bit image, ``H×W`` for one channel
  and ``H×W×3`` for three; other channel counts are an error for that input.
  Edge maps are divided by their largest value (over all channels) and scaled
  to 0..255, so the strongest edge is white; an all-zero map stays black.
  Blurred images read from image files are clipped to ``[0, 1]`` and scaled
  to 0..255, i.e. written back in the input's brightness; blurred ``.npy`` /
  ``.pt`` tensors are min-max scaled to 0..255.
* ``--format npy`` / ``--format pt`` write the raw result, unscaled, with
  the same shape as the input tensor: ``(H, W)`` for gray images and 2-D
  arrays, ``(C, H, W)`` for colour images and 3-D arrays (bfloat16 results
  are stored as float32 in ``.npy``, which has no bfloat16).

Errors and exit status
----------------------
A missing, unreadable or wrong-shaped input prints one line on stderr naming
the file (``torchfilters: error: photo.png: cannot read image (...)``); the
other inputs are still processed and the exit status is 1.  Invalid options
(unknown ``--mode`` or ``--operator``, a negative ``--sigma``, ...) are usage
errors reported by argparse with exit status 2 before any file is read.
Exit status 0 means every input was written.

A progress bar (tqdm, on stderr) is shown when there are several inputs and
stderr is a terminal.

The heavy dependencies (torch, imageio, scikit-image, tqdm) are imported only
when needed, so ``torchfilters --help`` is fast.  imageio, scikit-image and
tqdm come with the ``cli`` extra: ``pip install 'torchfilters[cli]'``.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["main", "build_parser", "SAMPLE_IMAGES", "OPERATORS", "MODES"]

PROG = "torchfilters"

#: Derivative operators accepted by ``--operator``.
OPERATORS = ("central", "sobel", "scharr", "prewitt")

#: Boundary modes accepted by ``--mode`` (SciPy's names and meanings).
MODES = (
    "reflect",
    "mirror",
    "nearest",
    "wrap",
    "constant",
    "grid-mirror",
    "grid-constant",
    "grid-wrap",
)

#: Output formats accepted by ``--format``.
FORMATS = ("png", "npy", "pt")

#: scikit-image sample images used when no INPUT is given.  All of them are
#: bundled with scikit-image (no download), in gray and colour, 8-bit.
SAMPLE_IMAGES = (
    "astronaut",
    "camera",
    "checkerboard",
    "chelsea",
    "coffee",
    "coins",
    "moon",
    "page",
    "text",
)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
NPY_EXTENSIONS = (".npy",)
PT_EXTENSIONS = (".pt", ".pth")
INPUT_EXTENSIONS = IMAGE_EXTENSIONS + NPY_EXTENSIONS + PT_EXTENSIONS

DEFAULT_OUT = "torchfilters-out"
#: dtypes ``torchfilters warmup`` compiles kernels for
WARMUP_DTYPES = ("float32", "float64", "float16", "bfloat16")

_INSTALL_HINT = "install the command-line dependencies with: pip install 'torchfilters[cli]'"


class InputError(Exception):
    """One input could not be read, filtered or written; the message says why."""


class MissingDependency(Exception):
    """An optional dependency of the command line is not installed."""


# --------------------------------------------------------------------------
# lazy imports


def _require(module: str, package: str) -> Any:
    """Import ``module`` or raise :class:`MissingDependency` naming ``package``."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"the command line needs the '{package}' package, which is not "
            f"installed ({exc}); {_INSTALL_HINT}"
        ) from None


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("torchfilters")
    except PackageNotFoundError:  # running from a source tree, not installed
        try:
            import torchfilters

            return str(getattr(torchfilters, "__version__", "unknown"))
        except Exception:  # pragma: no cover - broken install
            return "unknown"


# --------------------------------------------------------------------------
# argument parsing


class _VersionAction(argparse.Action):
    """``--version``: like argparse's, but looks the version up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _float(text: str) -> float:
    """argparse type: a finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def _mode(text: str) -> str:
    """argparse type: a SciPy mode name; a torch/NumPy/OpenCV name (``replicate``, ...) gets the
    SciPy name to use in its usage error."""
    from torchfilters._validate import canonical_mode

    try:
        return canonical_mode(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _sigma(text: str) -> float:
    """argparse type: a finite float >= 0 (Gaussian sigma in pixels; 0 keeps the pixels, as
    ``selective_blur(..., sigma=0)`` and ``scipy.ndimage.gaussian_filter``)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


_DESCRIPTION = """\
Exact scipy.ndimage-style image filters on files, computed with PyTorch.

Each INPUT (an image, a .npy/.pt array, or a folder of them) gives one output
file in --out. With no INPUT the scikit-image sample images are used.
Run '%(prog)s edges --help' or '%(prog)s blur --help' for details.
"""

_EPILOG = """\
examples:
  torchfilters edges                          # edge maps of the sample images
  torchfilters edges photos/ --operator scharr --out edges
  torchfilters blur img.png --sigma 2 --threshold 0.5 --format npy

exit status: 0 when every input was written, 1 when some input failed (one
line on stderr per failure, the others are still written), 2 for bad options.
"""

_WARMUP_DESCRIPTION = """\
Compile every kernel of the CPU engine (each op, operator, boundary-mode class,
forward and backward) for the given dtypes into numba's disk cache, so that no
later process compiles at run time: run it once when building a container image,
a CI runner or a cluster node.  The cache lives in NUMBA_CACHE_DIR if set, else in
the package's __pycache__ folders, else (a read-only install) in the per-user
cache folder; the summary line names it.  A later process loads each kernel from
there on first use (well under a second) instead of compiling it (1-3 s each).
"""

_EDGES_DESCRIPTION = """\
Edge maps: torchfilters.gradient_magnitude(x, operator=OP, mode=MODE, cval=CVAL)
of every channel of every INPUT, i.e. sqrt(gx² + gy²) of the x- and
y-derivatives. One output file <stem>_edges.<fmt> per input in --out. PNG
output is divided by the map's maximum, so the strongest edge is white.
"""

_BLUR_DESCRIPTION = """\
Selective blur: torchfilters.selective_blur(x, THRESHOLD, sigma=S, ...) of
every channel of every INPUT. Pixels with value >= THRESHOLD are replaced by a
blur of their neighbourhood (the 3x3 binomial kernel [1,2,1]^T[1,2,1]/16, or a
Gaussian with --sigma); the other pixels are kept. Image files are read into
[0, 1], so the default threshold 0 blurs every pixel of an image. One output
file <stem>_blur.<fmt> per input in --out.
"""

_INPUT_HELP = """\
image file (.png .jpg .jpeg .tif .tiff), .npy array, .pt/.pth tensor, or a
folder of them (not recursive). Images become (C, H, W) float32 tensors,
unsigned integers scaled to [0, 1], alpha dropped; arrays must be (H, W) or
(C, H, W). Default: scikit-image's bundled sample images
({samples}).""".format(samples=", ".join(SAMPLE_IMAGES))


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help=_INPUT_HELP)
    parser.add_argument(
        "--mode",
        default="reflect",
        type=_mode,
        choices=MODES,
        metavar="MODE",
        help="boundary mode, SciPy's names: %(choices)s "
        "(default: %(default)s, i.e. 'd c b a | a b c d | d c b a')",
    )
    parser.add_argument(
        "--cval",
        type=_float,
        default=0.0,
        help="value outside the image for --mode constant / grid-constant (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        "-o",
        default=DEFAULT_OUT,
        metavar="DIR",
        help="output folder, created if needed (default: %(default)s)",
    )
    parser.add_argument(
        "--format",
        "-f",
        default="png",
        choices=FORMATS,
        help="output format: png (8-bit image, scaled for viewing), npy or pt "
        "(raw float result, same shape as the input tensor) (default: %(default)s)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="torch device to compute on, e.g. cpu, cuda, cuda:1 (default: %(default)s)",
    )
    parser.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress bar and no summary line (errors are still printed)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``torchfilters`` command."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version of torchfilters and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    edges = sub.add_parser(
        "edges",
        help="gradient magnitude sqrt(gx² + gy²) (torchfilters.gradient_magnitude)",
        description=_EDGES_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common_options(edges)
    edges.add_argument(
        "--operator",
        default="sobel",
        choices=OPERATORS,
        metavar="OP",
        help="derivative operator: central [-1,0,1]; sobel, scharr, prewitt "
        "([-1,0,1] times the smoothing [1,2,1], [3,10,3], [1,1,1]) (default: %(default)s)",
    )
    edges.add_argument(
        "--normalized",
        action="store_true",
        help="normalise the derivative so that a unit ramp has slope 1",
    )
    edges.set_defaults(suffix="edges", subparser=edges)

    blur = sub.add_parser(
        "blur",
        help="blur only the pixels >= THRESHOLD (torchfilters.selective_blur)",
        description=_BLUR_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common_options(blur)
    blur.add_argument(
        "--threshold",
        "-t",
        type=_float,
        default=0.0,
        help="blur the pixels with value >= THRESHOLD (default: %(default)s)",
    )
    blur.add_argument(
        "--sigma",
        "-s",
        type=_sigma,
        default=None,
        metavar="S",
        help="Gaussian blur with this sigma in pixels (truncated at 4 sigma) "
        "instead of the 3x3 binomial kernel",
    )
    blur.add_argument(
        "--normalized",
        action="store_true",
        help="weighted mean over the selected neighbours only, blur(m*x)/blur(m), "
        "so unselected pixels never leak in (default: blend, where(m, blur(x), x))",
    )
    blur.add_argument(
        "--keep-border",
        action="store_true",
        help="leave a border band of the kernel radius untouched",
    )
    blur.set_defaults(suffix="blur", subparser=blur)

    warm = sub.add_parser(
        "warmup",
        help="compile every CPU kernel into the disk cache (for container images, CI, clusters)",
        description=_WARMUP_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    warm.add_argument(
        "--dtype",
        action="append",
        choices=WARMUP_DTYPES + ("all",),
        metavar="DTYPE",
        help="dtype to compile for, repeatable: %(choices)s (default: float32)",
    )
    warm.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary line")
    warm.set_defaults(subparser=warm)
    return parser


# --------------------------------------------------------------------------
# inputs


@dataclass
class Source:
    """One input: a file, or a scikit-image sample image (``path`` is None)."""

    label: str  # what error messages name: the path as given, or "skimage.data.<name>"
    stem: str  # output name stem
    ext: str  # lower-case extension of the source, "" for samples
    path: Path | None = None
    sample: str | None = None


def _expand_inputs(inputs: Sequence[str]) -> tuple[list[Source], list[str]]:
    """Turn the INPUT arguments into sources; return them and error lines.

    A folder contributes its files with a known extension, sorted by name.
    A path that does not exist is an error line, not a source.
    """
    if not inputs:
        return [Source(f"skimage.data.{n}", n, "", sample=n) for n in SAMPLE_IMAGES], []
    sources: list[Source] = []
    errors: list[str] = []
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            try:
                entries = sorted(path.iterdir(), key=lambda p: p.name)
            except OSError as exc:
                errors.append(f"{text}: cannot list folder ({_describe(exc)})")
                continue
            found = [
                p for p in entries if p.is_file() and p.suffix.lower() in INPUT_EXTENSIONS
            ]
            if not found:
                errors.append(
                    f"{text}: folder has no input files ({' '.join(INPUT_EXTENSIONS)})"
                )
            for p in found:
                sources.append(Source(str(p), p.stem, p.suffix.lower(), path=p))
        elif path.exists():
            sources.append(Source(text, path.stem, path.suffix.lower(), path=path))
        else:
            errors.append(f"{text}: no such file or folder")
    return sources, errors


def _describe(exc: BaseException, limit: int = 300) -> str:
    """A one-line description of an exception: ``Type: first line``, shortened."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:  # torch.load(weights_only=True): keep the reason
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
        text = " ".join(text.split())
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if isinstance(exc, OSError) and exc.strerror:
        first = exc.strerror
    if len(first) > limit:
        first = first[: limit - 3].rstrip() + "..."
    name = type(exc).__name__
    return f"{name}: {first}" if first else name


@dataclass
class Loaded:
    """An input tensor ``(C, H, W)`` and how to turn results back into files."""

    tensor: Any  # torch.Tensor, (C, H, W)
    squeeze: bool  # the source was 2-D: write (H, W) for npy/pt
    from_image: bool  # values were scaled from an image file into [0, 1]


def _image_to_float(arr: Any, np: Any) -> Any:
    """Scale an image array to float32: unsigned ints to [0, 1], bool to 0/1."""
    if arr.dtype == np.bool_:
        return arr.astype(np.float32)
    if np.issubdtype(arr.dtype, np.unsignedinteger):
        return arr.astype(np.float32) / np.float32(np.iinfo(arr.dtype).max)
    if np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        return arr.astype(np.float32)
    raise InputError(f"unsupported image dtype {arr.dtype}")


def _image_to_chw(arr: Any, np: Any, torch: Any) -> Loaded:
    """An ``H×W`` or ``H×W×C`` image array as a ``(C, H, W)`` float32 tensor."""
    if arr.ndim == 3 and arr.shape[-1] in (1, 2, 3, 4):
        if arr.shape[-1] in (2, 4):  # gray+alpha, RGBA: drop alpha
            arr = arr[..., :-1]
        chw = np.ascontiguousarray(np.moveaxis(arr, -1, 0))
        squeeze = False
    elif arr.ndim == 2:
        chw = arr[None]
        squeeze = True
    else:
        raise InputError(
            f"unsupported image shape {tuple(arr.shape)}: expected H×W or H×W×C "
            "with C <= 4 (multi-page images are not supported)"
        )
    data = _image_to_float(chw, np)
    return Loaded(torch.from_numpy(np.ascontiguousarray(data)), squeeze, True)


def _array_to_chw(t: Any, torch: Any) -> Loaded:
    """A ``(H, W)`` or ``(C, H, W)`` tensor as ``(C, H, W)``, float."""
    if t.dim() not in (2, 3):
        raise InputError(
            f"wrong rank: expected shape (H, W) or (C, H, W), got {tuple(t.shape)}"
        )
    if t.is_complex():
        raise InputError(f"unsupported dtype {t.dtype}: complex values have no edges")
    if not t.is_floating_point():
        t = t.to(torch.float32)
    squeeze = t.dim() == 2
    return Loaded(t.unsqueeze(0) if squeeze else t, squeeze, False)


def _load(source: Source) -> Loaded:
    """Read one source into a tensor, or raise :class:`InputError`."""
    import numpy as np
    import torch

    if source.sample is not None:
        data = _require("skimage.data", "scikit-image")
        try:
            arr = getattr(data, source.sample)()
        except Exception as exc:
            raise InputError(f"cannot load sample image ({_describe(exc)})") from None
        return _image_to_chw(np.asarray(arr), np, torch)

    assert source.path is not None
    if source.ext in NPY_EXTENSIONS:
        try:
            arr = np.load(source.path, allow_pickle=False)
        except Exception as exc:
            raise InputError(f"cannot read .npy array ({_describe(exc)})") from None
        if not isinstance(arr, np.ndarray):  # an .npz saved under a .npy name
            raise InputError(f"expected one array, got {type(arr).__name__}")
        if arr.dtype.kind not in "biufc":
            raise InputError(f"unsupported dtype {arr.dtype}")
        if arr.dtype.kind in "biu":  # integers and booleans: float32
            arr = arr.astype(np.float32)
        tensor = torch.from_numpy(np.ascontiguousarray(arr))
        return _array_to_chw(tensor, torch)
    if source.ext in PT_EXTENSIONS:
        try:
            obj = torch.load(source.path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise InputError(f"cannot read tensor ({_describe(exc)})") from None
        if isinstance(obj, np.ndarray):
            obj = torch.from_numpy(obj)
        if not isinstance(obj, torch.Tensor):
            raise InputError(f"expected a tensor, the file holds a {type(obj).__name__}")
        return _array_to_chw(obj, torch)

    iio = _require("imageio.v3", "imageio")
    try:
        with warnings.catch_warnings():  # imageio's plugin probing warns about its own plugins
            warnings.simplefilter("ignore", DeprecationWarning)
            arr = iio.imread(source.path)
    except Exception as exc:
        raise InputError(f"cannot read image ({_describe(exc)})") from None
    return _image_to_chw(np.asarray(arr), np, torch)


# --------------------------------------------------------------------------
# outputs


def _to_uint8(t: Any, lo: float, hi: float) -> Any:
    """Map ``[lo, hi]`` linearly to 0..255 (clipped, NaN -> 0) as uint8."""
    import torch

    t = t.float()
    span = hi - lo
    if not span > 0:  # constant, all-zero or all-NaN: black
        scaled = torch.zeros_like(t)
    else:
        scaled = (t - lo) * (255.0 / span)
    scaled = torch.nan_to_num(scaled, nan=0.0, posinf=255.0, neginf=0.0)
    return scaled.clamp_(0, 255).round_().to(torch.uint8)


def _finite_range(t: Any) -> tuple[float, float]:
    import torch

    finite = t[torch.isfinite(t)]
    if finite.numel() == 0:
        return 0.0, 0.0
    return float(finite.min()), float(finite.max())


def _png_array(result: Any, loaded: Loaded, kind: str) -> Any:
    """The 8-bit ``H×W`` or ``H×W×3`` array written as PNG for a result."""
    channels = result.shape[0]
    if channels not in (1, 3):
        raise InputError(
            f"cannot write PNG with {channels} channels (1 or 3 needed); "
            "use --format npy or --format pt"
        )
    if kind == "edges":
        _, hi = _finite_range(result)
        u8 = _to_uint8(result, 0.0, hi)
    elif loaded.from_image:
        u8 = _to_uint8(result, 0.0, 1.0)
    else:
        lo, hi = _finite_range(result)
        u8 = _to_uint8(result, lo, hi)
    arr = u8.numpy()
    return arr[0] if channels == 1 else arr.transpose(1, 2, 0).copy()


def _output_name(source: Source, suffix: str, fmt: str, used: set[str]) -> str:
    name = f"{source.stem}_{suffix}.{fmt}"
    if name in used and source.ext:
        name = f"{source.stem}_{source.ext.lstrip('.')}_{suffix}.{fmt}"
    base, n = name, 2
    while name in used:
        name = base.replace(f"_{suffix}.{fmt}", f"_{n}_{suffix}.{fmt}")
        n += 1
    used.add(name)
    return name


def _write(result: Any, loaded: Loaded, kind: str, fmt: str, path: Path) -> None:
    """Write one result (a ``(C, H, W)`` CPU tensor) to ``path``."""
    import numpy as np
    import torch

    if fmt == "png":
        arr = _png_array(result, loaded, kind)
        iio = _require("imageio.v3", "imageio")
        try:
            iio.imwrite(path, arr)
        except Exception as exc:
            raise InputError(f"cannot write {path} ({_describe(exc)})") from None
        return
    raw = result[0] if loaded.squeeze else result
    try:
        if fmt == "npy":
            if raw.dtype == torch.bfloat16:
                raw = raw.float()
            np.save(path, raw.numpy())
        else:
            torch.save(raw.clone(), path)
    except Exception as exc:
        raise InputError(f"cannot write {path} ({_describe(exc)})") from None


# --------------------------------------------------------------------------
# running


def _make_filter(args: argparse.Namespace) -> Callable[[Any], Any]:
    """The filter the sub-command applies, as a function of one tensor."""
    import torchfilters

    if args.command == "edges":
        fn = torchfilters.gradient_magnitude
        kwargs = dict(operator=args.operator, mode=args.mode, cval=args.cval)
        if args.normalized:
            kwargs["normalized"] = True
        return lambda x: fn(x, **kwargs)
    fn = torchfilters.selective_blur
    kwargs = dict(
        sigma=args.sigma,
        normalized=args.normalized,
        keep_border=args.keep_border,
        mode=args.mode,
        cval=args.cval,
    )
    threshold = args.threshold
    return lambda x: fn(x, threshold, **kwargs)


def _error(message: str, bar: Any = None) -> None:
    line = f"{PROG}: error: {message}"
    if bar is not None:
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def _warmup(args: argparse.Namespace) -> int:
    import torch

    from torchfilters import backends

    cpu = backends.get("cpu")
    if cpu is None:
        _error("the CPU engine cannot be imported (is numba installed?); nothing to compile")
        return 1
    from torchfilters.backends.cpu import warmup as wu

    names = args.dtype or ["float32"]
    names = list(WARMUP_DTYPES) if "all" in names else list(dict.fromkeys(names))
    bar = None
    if not args.quiet and sys.stderr.isatty():
        bar = _require("tqdm", "tqdm").tqdm(total=None, unit=" calls", file=sys.stderr, leave=False)

    def progress(label: str) -> None:
        if bar is not None:
            bar.set_description(label)
            bar.update()

    try:
        report = wu.warmup([getattr(torch, n) for n in names], progress)
    finally:
        if bar is not None:
            bar.close()
    if not args.quiet:
        print(f"{PROG}: warmup: {report.compiled} kernel(s) compiled, {report.loaded} already cached, {report.calls} calls, "
              f"{report.seconds:.1f} s ({', '.join(names)}); cache: {report.cache_dir or 'none (no writable folder)'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "warmup":
        return _warmup(args)
    import torch

    parser: argparse.ArgumentParser = args.subparser  # usage errors name the sub-command

    try:
        device = torch.device(args.device)
        torch.empty(0, device=device)
    except Exception as exc:
        parser.error(f"argument --device: {args.device!r} is not usable ({_describe(exc)})")

    filt = _make_filter(args)
    # Check the options once on a tiny tensor so that a value the library
    # refuses is one usage error, not the same error for every input.
    try:
        filt(torch.zeros(1, 5, 5, device=device))
    except Exception as exc:
        parser.error(f"the options are not accepted by torchfilters ({_describe(exc)})")

    sources, errors = _expand_inputs(args.inputs)
    for line in errors:
        _error(line)
    failed = len(errors)

    out_dir = Path(args.out)
    if sources:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _error(f"{args.out}: cannot create output folder ({_describe(exc)})")
            return 1

    bar = None
    show_bar = not args.quiet and len(sources) > 1 and sys.stderr.isatty()
    if show_bar:
        tqdm = _require("tqdm", "tqdm").tqdm
        bar = tqdm(total=len(sources), desc=f"{PROG} {args.command}", unit="file",
                   file=sys.stderr)

    used: set[str] = set()
    written = 0
    try:
        for source in sources:
            if bar is not None:
                bar.set_postfix_str(source.stem, refresh=False)
            try:
                loaded = _load(source)
                x = loaded.tensor.to(device)
                with torch.no_grad():
                    try:
                        y = filt(x)
                    except Exception as exc:
                        raise InputError(f"filter failed ({_describe(exc)})") from None
                y = y.detach().cpu()
                name = _output_name(source, args.suffix, args.format, used)
                _write(y, loaded, args.command, args.format, out_dir / name)
                written += 1
            except InputError as exc:
                _error(f"{source.label}: {exc}", bar)
                failed += 1
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    if not args.quiet:
        print(f"{PROG}: wrote {written} file(s) to {out_dir}"
              + (f", {failed} input(s) failed" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``torchfilters`` command with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status: 0 when every input was written, 1 when some
    input failed or a dependency is missing.  Usage errors (bad options,
    ``--help``, ``--version``) raise :class:`SystemExit` as argparse does
    (status 2 for errors, 0 for help and version).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except MissingDependency as exc:
        _error(str(exc))
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
