"""Inputs: which files a run reads, how each is recognised (by its content, not its name),
and the one-line reasons, in words, why a file cannot be read.

A file's format is what its first bytes say (PNG, JPEG, TIFF, BMP, GIF, WebP, ``.npy``, a
``torch.save`` archive), whatever its extension; extensions only choose which files of a
folder are inputs (:data:`INPUT_EXTENSIONS`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .common import InputError, describe, require

#: scikit-image sample images used when no INPUT is given (bundled: no download).
SAMPLE_IMAGES = ("astronaut", "camera", "checkerboard", "chelsea", "coffee", "coins", "moon", "page", "text")

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
NPY_EXTENSIONS = (".npy",)
PT_EXTENSIONS = (".pt", ".pth")
#: extensions of the files of a folder that are read (a file named on the command line is read
#: whatever its name)
INPUT_EXTENSIONS = IMAGE_EXTENSIONS + NPY_EXTENSIONS + PT_EXTENSIONS

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"II+\x00", "TIFF"),
    (b"MM\x00+", "TIFF"),
    (b"BM", "BMP"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"\x93NUMPY", "npy"),
    (b"PK\x03\x04", "pt"),  # torch.save's zip archive
)
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_IMAGE_FORMATS = ("PNG", "JPEG", "TIFF", "BMP", "GIF", "WebP")


@dataclass
class Source:
    """One input: a file, or a scikit-image sample image (``path`` is None)."""

    label: str  # what error messages name: the path as given, or "skimage.data.<name>"
    stem: str  # output name stem
    ext: str  # lower-case extension of the source without the dot, "" for samples
    path: Path | None = None
    sample: str | None = None


@dataclass
class Loaded:
    """An input tensor and where it came from."""

    tensor: Any  # torch.Tensor: (H, W) or (C, H, W) for images; arrays as stored
    from_image: bool  # values were scaled from an image file into [0, 1]


def expand_inputs(inputs: Sequence[str], samples: Sequence[str] = SAMPLE_IMAGES,
                  outputs: tuple[Path, str] | None = None) -> tuple[list[Source], list[str]]:
    """Turn the INPUT arguments into sources; return them and error lines.

    A folder contributes its files with a known extension, sorted by name (not recursive),
    except hidden files and, in the output folder ``outputs[0]``, the files named like this
    run's outputs (ending in ``outputs[1]``, e.g. ``_edges.png``): running twice with
    ``--out`` the input folder does not filter the first run's results.  A path that does
    not exist is an error line, not a source.  No INPUT: the sample images.
    """
    if not inputs:
        return [Source(f"skimage.data.{n}", n, "", sample=n) for n in samples], []
    sources: list[Source] = []
    errors: list[str] = []
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            try:
                entries = sorted(path.iterdir(), key=lambda p: p.name)
            except OSError as exc:
                errors.append(f"{text}: cannot list folder ({describe(exc)})")
                continue
            own = outputs is not None and _same_dir(path, outputs[0])
            found = [p for p in entries if p.suffix.lower() in INPUT_EXTENSIONS and p.is_file()
                     and not p.name.startswith(".") and not (own and p.name.endswith(outputs[1]))]
            if not found:
                errors.append(f"{text}: folder has no input files ({' '.join(INPUT_EXTENSIONS)})")
            sources += [Source(str(p), p.stem, p.suffix.lower().lstrip("."), path=p) for p in found]
        elif path.exists():
            sources.append(Source(text, path.stem, path.suffix.lower().lstrip("."), path=path))
        else:
            errors.append(f"{text}: no such file or folder")
    return sources, errors


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return b.exists() and a.samefile(b)
    except OSError:
        return False


def sniff(head: bytes) -> str | None:
    """The format the first bytes of a file announce, or None."""
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # torch.save's legacy pickle format
        return "pt"
    return None


def load(source: Source, ranks: tuple[int, int] | None = None) -> Loaded:
    """Read one source into a tensor, or raise :class:`InputError` saying why in words.

    ``ranks``: the (least, most) number of dimensions an array may have (images always pass).
    """
    import numpy as np
    import torch

    if source.sample is not None:
        data = require("skimage.data", "scikit-image")
        try:
            arr = getattr(data, source.sample)()
        except Exception as exc:
            raise InputError(f"cannot load sample image ({describe(exc)})") from None
        return _image(np.asarray(arr), np, torch)

    assert source.path is not None
    path = source.path
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise InputError(f"cannot open ({describe(exc).lower()})") from None
    if size == 0:
        raise InputError("empty file (0 bytes)")
    kind = sniff(head)
    if kind is None:
        raise InputError("not an image (unrecognised format; PNG, JPEG, TIFF, BMP, GIF, WebP, "
                         ".npy and .pt files are read)")
    if kind == "npy":
        loaded = Loaded(_npy(path, size, np, torch), False)
    elif kind == "pt":
        loaded = Loaded(_pt(path, np, torch), False)
    else:
        return _image(_read_image(path, kind, size), np, torch)
    t = loaded.tensor
    if ranks is not None and not ranks[0] <= t.dim() <= ranks[1]:
        want = "(H, W) or (C, H, W)" if ranks == (2, 3) else f"{ranks[0]} to {ranks[1]} dimensions"
        raise InputError(f"wrong rank: expected shape {want}, got {tuple(t.shape)}")
    return loaded


def _dtype_error(name: str) -> InputError:
    if name == "bool":
        return InputError("unsupported array dtype bool: the filters refuse bool arrays, as the API "
                          "does (TypeError); convert it first, e.g. to uint8 or float32")
    return InputError(f"unsupported array dtype {name}: real numbers are filtered (float or integer)")


def _npy(path: Path, size: int, np: Any, torch: Any) -> Any:
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            readers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
            if version not in readers:
                raise InputError(f"unsupported .npy format version {version[0]}.{version[1]}")
            shape, _fortran, dtype = readers[version](f)
            offset = f.tell()
    except InputError:
        raise
    except Exception:
        raise InputError("damaged .npy file (its header cannot be read)") from None
    if dtype.hasobject:
        raise InputError("unsupported array dtype object (pickled Python objects are not read)")
    if dtype.kind not in "iuf":
        raise _dtype_error(str(dtype) if dtype.kind != "b" else "bool")
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size - offset < need:
        raise InputError(f"truncated .npy array: shape {tuple(shape)} of {dtype} needs {need} data bytes, "
                         f"the file holds {size - offset}")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise InputError(f"damaged .npy file ({describe(exc)})") from None
    if arr.dtype.kind in "iu" or arr.dtype.byteorder not in "=|":
        arr = arr.astype(np.float32 if arr.dtype.kind in "iu" else arr.dtype.newbyteorder("="))
    # (ascontiguousarray makes a 0-d array 1-d: its shape would be misreported)
    return torch.from_numpy(arr if arr.flags.c_contiguous else arr.copy(order="C"))


def _pt(path: Path, np: Any, torch: Any) -> Any:
    import pickle
    import zipfile

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights_only" in str(exc) or "Weights only" in str(exc):
            raise InputError("the .pt file holds pickled Python objects other than tensors; only "
                             "tensors are read (torch.load with weights_only=True)") from None
        raise InputError("damaged .pt file (not a readable torch.save archive)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError):
        raise InputError("damaged or truncated .pt file (not a complete torch.save archive)") from None
    except Exception:
        raise InputError("damaged .pt file (not a readable torch.save archive)") from None
    if isinstance(obj, np.ndarray):
        obj = torch.from_numpy(obj)
    if not isinstance(obj, torch.Tensor):
        raise InputError(f"expected one tensor, the file holds a {type(obj).__name__}")
    if obj.dtype == torch.bool:
        raise _dtype_error("bool")
    # (every integer dtype, the unsigned 16- to 64-bit ones too, as .npy inputs and the API take them)
    ints = {getattr(torch, f"{u}int{b}", None) for u in ("", "u") for b in (8, 16, 32, 64)} - {None}
    if obj.is_complex() or not (obj.is_floating_point() or obj.dtype in ints):
        raise _dtype_error(str(obj.dtype).replace("torch.", ""))
    return obj if obj.is_floating_point() else obj.to(torch.float32)


def _read_image(path: Path, kind: str, size: int) -> Any:
    iio = require("imageio.v3", "imageio")
    try:
        with warnings.catch_warnings():  # imageio's plugin probing warns about its own plugins
            warnings.simplefilter("ignore")
            return iio.imread(path)
    except Exception:
        pass
    tail = b""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, size - 12))
            tail = f.read()
    except OSError:
        pass
    if kind == "PNG" and not tail.endswith(_PNG_END):
        raise InputError("truncated PNG (the file ends before the image's end chunk)")
    if kind == "JPEG" and not tail.endswith(b"\xff\xd9"):
        raise InputError("truncated JPEG (the file ends before the image's end marker)")
    raise InputError(f"damaged {kind} (the image data cannot be decoded)")


def _image(arr: Any, np: Any, torch: Any) -> Loaded:
    """An ``H×W`` or ``H×W×C`` image array as an ``(H, W)`` or ``(C, H, W)`` float32 tensor:
    unsigned integers scaled to [0, 1], 1-bit (bool) pixels to 0/1, alpha dropped."""
    arr = np.asarray(arr)
    if arr.ndim == 3 and arr.shape[-1] in (1, 2, 3, 4):
        if arr.shape[-1] in (2, 4):  # gray+alpha, RGBA: drop alpha
            arr = arr[..., :-1]
        arr = np.moveaxis(arr, -1, 0)
    elif arr.ndim != 2:
        raise InputError(f"unsupported image shape {tuple(arr.shape)}: expected H×W or H×W×C with C <= 4 "
                         "(multi-page images are not read)")
    if arr.dtype == np.bool_:
        data = arr.astype(np.float32)
    elif np.issubdtype(arr.dtype, np.unsignedinteger):
        data = arr.astype(np.float32) / np.float32(np.iinfo(arr.dtype).max)
    elif np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        data = arr.astype(np.float32)
    else:
        raise InputError(f"unsupported image pixel type {arr.dtype}")
    return Loaded(torch.from_numpy(np.ascontiguousarray(data)), True)

