"""Command-line options made from an op's signature and docstring.

Every name in ``torchfilters.functional.__all__`` is an op (:func:`op_table`); each of its
parameters but ``input`` and ``out`` becomes an option ``--name`` (``keep_border`` is
``--keep-border``), typed from its annotation and name (:func:`option_for`), helped by the
first sentence of its docstring entry, required where the parameter has no default.  An op
added to ``functional.__all__`` appears without a change here.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .common import MODES, OPERATORS, mode_name

#: parameters never offered as options
SKIP = ("input", "out")
#: parameters whose value is an array: a .npy/.pt file or an inline list
ARRAY_PARAMS = ("weights", "footprint", "structure", "kernel")
BACKENDS = ("auto", "cpu", "triton", "reference")


def op_table() -> dict[str, Callable[..., Any]]:
    """The public ops, by name (``torchfilters.functional.__all__``, in its order)."""
    from torchfilters import functional

    return {name: getattr(functional, name) for name in functional.__all__}


# ------------------------------------------------------------------ value types


def _scalar_or_list(convert: Callable[[str], Any], what: str, whats: str | None) -> Callable[[str], Any]:
    """A parser of one value, or (``whats``: the plural) of comma-separated values, one per axis."""
    def parse(text: str) -> Any:
        parts = [p.strip() for p in text.split(",")] if whats else [text.strip()]
        try:
            values = [convert(p) for p in parts]
        except (ValueError, argparse.ArgumentTypeError):
            many = f" or comma-separated {whats} (one per axis)" if whats else ""
            raise argparse.ArgumentTypeError(f"expected {what}{many}, got {text!r}") from None
        return values[0] if len(values) == 1 else tuple(values)

    parse.__name__ = what
    return parse


def _strict_int(text: str) -> int:
    return int(text)


def _number(text: str) -> float:
    value = float(text)  # NaN and inf pass: the op says whether it takes them
    return value


ints = _scalar_or_list(_strict_int, "an integer", "integers")
numbers = _scalar_or_list(_number, "a number", "numbers")
#: one value, for a parameter that takes no sequence (``threshold``, ``cval``): "1,2" is refused
#: as not a number, not offered as one per axis
an_int = _scalar_or_list(_strict_int, "an integer", None)
a_number = _scalar_or_list(_number, "a number", None)


def optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def opt(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    opt.__name__ = parse.__name__
    return opt


def modes(text: str) -> Any:
    """One mode, or comma-separated modes, one per axis."""
    values = tuple(mode_name(p.strip()) for p in text.split(","))
    return values[0] if len(values) == 1 else values


def array_value(text: str) -> Any:
    """A kernel: a ``.npy`` / ``.pt`` file, or inline: ``1,2,1`` (1-D), ``1,2,1;2,4,2;1,2,1``
    (rows) or a nested list ``[[1,2,1],[2,4,2],[1,2,1]]``."""
    import numpy as np

    path = Path(text)
    if path.suffix.lower() in (".npy", ".pt", ".pth") or path.is_file():
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{text}: no such file")
        boolean = _bool_array(path)
        if boolean is not None:  # a footprint: a boolean window
            return boolean.astype(np.float64)
        from .common import InputError
        from .inputs import Source, load

        try:
            t = load(Source(text, path.stem, path.suffix.lower().lstrip("."), path=path)).tensor
        except InputError as exc:
            raise argparse.ArgumentTypeError(f"{text}: {exc}") from None
        return t.double().numpy()
    try:
        if text.lstrip().startswith("["):
            value = json.loads(text)
        else:
            value = [[float(v) for v in row.split(",")] for row in text.split(";")]
            value = value[0] if len(value) == 1 else value
        arr = np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"expected a .npy/.pt file or numbers such as 1,2,1 or "
                                         f"1,2,1;2,4,2;1,2,1 or [[1,2,1],[2,4,2],[1,2,1]], got {text!r}") from None
    return arr


def _bool_array(path: Path) -> Any:
    """A boolean ``.npy`` / ``.pt`` array as NumPy, else None (other files go through ``load``)."""
    import numpy as np

    try:
        if path.suffix.lower() == ".npy":
            a = np.load(path, allow_pickle=False)
            return a if a.dtype == np.bool_ else None
        if path.suffix.lower() in (".pt", ".pth"):
            import torch

            t = torch.load(path, map_location="cpu", weights_only=True)
            return t.numpy() if isinstance(t, torch.Tensor) and t.dtype == torch.bool else None
    except Exception:
        return None  # ``load`` says what is wrong with it
    return None


def mask_value(text: str) -> Any:
    """A mask file (an image, ``.npy`` or ``.pt``, bool allowed): nonzero pixels are selected."""
    import numpy as np
    import torch

    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    try:
        if path.suffix.lower() == ".npy":
            return torch.from_numpy(np.load(path, allow_pickle=False) != 0)
        if path.suffix.lower() in (".pt", ".pth"):
            return torch.load(path, map_location="cpu", weights_only=True) != 0
    except Exception:
        raise argparse.ArgumentTypeError(f"{text}: cannot read the mask (a .npy, .pt or image file)") from None
    from .common import InputError
    from .inputs import Source, load

    try:
        return load(Source(text, path.stem, "", path=path)).tensor != 0
    except InputError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None


def literal(text: str) -> Any:
    """A Python literal (number, list, None, True/False), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


# ------------------------------------------------------------------ options


@dataclass
class Option:
    """How one parameter is read from the command line."""

    name: str
    kwargs: dict = field(default_factory=dict)  # for add_argument
    flags: tuple = ()


def _annotation(p: inspect.Parameter) -> str:
    a = p.annotation
    if a is inspect.Parameter.empty:
        return ""
    return a if isinstance(a, str) else getattr(a, "__name__", str(a))


def option_for(p: inspect.Parameter) -> Option:
    """The argparse option of parameter ``p`` (from its name and annotation)."""
    ann = _annotation(p).replace("typing.", "").replace(" ", "")
    name = p.name
    kw: dict[str, Any] = {}
    allows_none = "None" in ann or "Optional" in ann or (p.default is None)
    if name == "mode":
        kw.update(type=modes, metavar="MODE[,MODE...]",
                  help_extra=f"one of {', '.join(MODES)}, or one per axis")
    elif name == "operator":
        kw.update(choices=OPERATORS)
    elif name == "backend":
        kw.update(choices=BACKENDS)
    elif name == "axes" or name == "axis":
        kw.update(type=optional(ints) if allows_none else ints, metavar="AXIS" if name == "axis" else "AXIS[,AXIS...]")
    elif name == "mask":
        kw.update(type=mask_value, metavar="FILE")
    elif name in ARRAY_PARAMS:
        kw.update(type=array_value, metavar="FILE|1,2,1;...")
    elif ann == "bool" or isinstance(p.default, bool):
        kw.update(action=argparse.BooleanOptionalAction)
    elif "Sequence[int]" in ann or ann in ("int", "Optional[int]"):
        parse = ints if "Sequence" in ann else an_int
        kw.update(type=optional(parse) if allows_none else parse, metavar="N[,N...]" if parse is ints else "N")
    elif "Number" in ann or "float" in ann:
        parse = numbers if "Sequence" in ann else a_number
        kw.update(type=optional(parse) if allows_none else parse, metavar="X[,X...]" if parse is numbers else "X")
    elif ann == "str":
        kw.update(type=str)
    else:
        kw.update(type=literal, metavar="VALUE")
    return Option(name, kw)


_ARG_LINE = re.compile(r"^ {4}(\w+):\s*(.*)$")


#: the docstrings' words for what only the Python API takes, and the command line's
_CLI_WORDS = (("a sequence, NumPy array or tensor", "comma-separated"),)


def doc_params(fn: Callable[..., Any]) -> dict[str, str]:
    """The first sentence of each ``Args:`` entry of ``fn``'s docstring (written in a function or
    filled from a template: the docstring is dedented first), in the command line's words
    (``_CLI_WORDS``)."""
    out: dict[str, list[str]] = {}
    current = None
    in_args = False
    for line in inspect.cleandoc(fn.__doc__ or "").splitlines():
        if line.strip() == "Args:":
            in_args = True
            continue
        if in_args and line.strip() and not line.startswith(" " * 4):
            in_args = False  # Returns:, Raises: ...
        if not in_args:
            continue
        m = _ARG_LINE.match(line)
        if m:
            current = m.group(1)
            out[current] = [m.group(2)]
        elif current and line.strip():
            out[current].append(line.strip())
    result = {}
    for name, parts in out.items():
        text = " ".join(parts).replace("``", "")
        for api, cli in _CLI_WORDS:
            text = text.replace(api, cli)
        first = re.split(r"(?<=[a-z0-9)\]'])\.\s", text, maxsplit=1)[0].rstrip(".")
        result[name] = first[:220] + ("..." if len(first) > 220 else "")
    return result


def _escape(text: str) -> str:
    return text.replace("%", "%%")


def add_op_options(parser: argparse.ArgumentParser, fn: Callable[..., Any], *,
                   only: tuple[str, ...] | None = None, defaults: dict[str, Any] | None = None,
                   short: dict[str, str] | None = None, helps: dict[str, str] | None = None,
                   required: bool = True) -> list[str]:
    """Add an option per parameter of ``fn`` to ``parser``; return the parameter names.

    ``only``: the parameters to offer (default: all but :data:`SKIP`); ``defaults``: defaults
    that replace the signature's (and make a parameter optional); ``short``: short flags;
    ``helps``: help texts that replace the docstring's; ``required=False`` makes every
    parameter optional (``bench`` supplies its own values).
    """
    defaults = defaults or {}
    short = short or {}
    helps = helps or {}
    docs = doc_params(fn)
    names = []
    group = parser.add_argument_group(f"options of {fn.__name__} (see help(torchfilters.{fn.__name__}))")
    for p in inspect.signature(fn).parameters.values():
        if p.name in SKIP or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or (only is not None and p.name not in only):
            continue
        opt = option_for(p)
        kw = dict(opt.kwargs)
        extra = kw.pop("help_extra", "")
        has_default = p.name in defaults or p.default is not inspect.Parameter.empty
        default = defaults.get(p.name, None if p.default is inspect.Parameter.empty else p.default)
        if p.name == "backend" and default is None:
            default = "auto"
        text = helps.get(p.name) or docs.get(p.name, "")
        if extra:
            text = f"{text} ({extra})" if text else extra
        if has_default:
            text += f" (default: {default!r})" if not isinstance(default, (list, tuple)) or default else ""
        else:
            text += " (required)"
        flags = [f"--{p.name.replace('_', '-')}"] + ([short[p.name]] if p.name in short else [])
        group.add_argument(*flags, dest=p.name, default=default if has_default else None,
                           required=required and not has_default, help=_escape(text), **kw)
        names.append(p.name)
    return names


def op_kwargs(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The keyword arguments of the op call from the parsed options."""
    kwargs = {n: getattr(args, n) for n in names}
    if kwargs.get("backend") == "auto":
        kwargs["backend"] = None
    return kwargs


def name_option(message: str, names: list[str], given=None) -> str:
    """``argument --sigma: MESSAGE`` when the op's error names exactly one of the options the
    user gave (``given``; None: every one of ``names``); the message alone when it names none of
    them, or several ("sigma=... with truncate=..." after both were given)."""
    found = [n for n in names if re.search(rf"\b{re.escape(n)}\b", message) and (given is None or n in given)]
    if len(found) == 1:
        return f"argument --{found[0].replace('_', '-')}: {message}"
    return message


def given_options(parser: argparse.ArgumentParser, kwargs: dict[str, Any]) -> set[str]:
    """The options of ``kwargs`` whose values differ from ``parser``'s defaults (the ones the
    user gave, to name in an error)."""
    out = set()
    for n, v in kwargs.items():
        d = parser.get_default(n)
        try:
            same = v is d or (v is not None and d is not None and bool(v == d))
        except Exception:  # (a tensor against a default: given)
            same = False
        if not same:
            out.add(n)
    return out
