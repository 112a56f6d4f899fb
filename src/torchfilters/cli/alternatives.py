"""What ``torchfilters bench`` compares against: each op as a *recipe* of plain 2-D
correlations (separable taps or a full kernel, combined pointwise), and each installed library
running the recipe its natural way.

A recipe exists where the op's arguments have a plain equivalent (the default axes, one mode
for both axes, no ``out``-only features); otherwise :class:`Unsupported` says why, and the
bench reports that instead of a time.  Results are checked against torchfilters before any
timing (in :mod:`.bench`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


#: the rank filters: SciPy's functions are their only alternative here
RANK_OPS = ("median_filter", "minimum_filter", "maximum_filter", "rank_filter", "percentile_filter")


class Unsupported(Exception):
    """This library cannot compute this call (the message says why)."""


@dataclass
class Recipe:
    """``combine`` of correlations; each term is ``("sep", taps_h, taps_w)`` or ``("full", K)``."""

    terms: list
    combine: str = "one"  # one, sum, hypot, stack, atan2 (atan2(t0, t1): y then x)
    scale: float = 1.0
    select: float | None = None  # selective blur: where(x >= select, result, x)
    mode: str = "reflect"
    cval: float = 0.0
    scipy: tuple | None = None  # (label, fn(ndarray) -> ndarray): SciPy's own function for this op
    gauss: tuple | None = None  # ((sigma_y, sigma_x), (radius_y, radius_x)) of an order-0 Gaussian

    @property
    def radius(self) -> int:
        r = 0
        for t in self.terms:
            shapes = (len(t[1]), len(t[2])) if t[0] == "sep" else t[1].shape
            r = max(r, *(s // 2 for s in shapes))
        return r


def _pair(value: Any, name: str) -> tuple:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise Unsupported(f"{name} needs one value per axis of the last two")
        return tuple(value)
    return (value, value)


def _axis(axis: int, ndim: int) -> int:
    a = axis % ndim if -ndim <= axis < ndim else None
    if a not in (ndim - 2, ndim - 1):
        raise Unsupported("an axis other than the last two")
    return a - ndim


def _gauss(sigma: float, order: int, truncate: float, radius: Any) -> np.ndarray:
    from torchfilters import kernels

    if float(sigma) < 1e-15:
        if order:
            raise Unsupported("a derivative with sigma 0")
        return np.ones(1)
    r = kernels.gaussian_radius(sigma, truncate) if radius is None else int(radius)
    return np.asarray(kernels.gaussian_kernel1d(float(sigma), int(order), r), np.float64)


def recipe(op: str, kw: dict, ndim: int) -> Recipe:
    """The plain-correlation recipe of ``op(x, **kw)`` for an ``ndim``-dimensional input."""
    from torchfilters import kernels
    from torchfilters._validate import canonical_mode

    kw = dict(kw)
    kw.pop("backend", None)
    axes = kw.pop("axes", None)
    if axes is not None:
        a = (axes,) if isinstance(axes, int) else tuple(axes)
        if sorted(x % ndim for x in a) != [ndim - 2, ndim - 1] or tuple(x % ndim for x in a) != (ndim - 2, ndim - 1):
            raise Unsupported("axes other than the last two, in order")
    mode = kw.pop("mode", "reflect")
    if not isinstance(mode, str):
        modes = {canonical_mode(m) for m in mode}
        if len(modes) != 1:
            raise Unsupported("a different mode per axis")
        mode = modes.pop()
    r = Recipe([], mode=canonical_mode(mode), cval=float(kw.pop("cval", 0.0)))
    one = np.ones(1)

    def deriv(operator: str, normalized: bool) -> tuple:
        d, s = (np.asarray(t, np.float64) for t in kernels.derivative_weights(operator))
        return d, s, (np.abs(d).sum() * s.sum() if normalized else 1.0)

    if op in ("gradient_magnitude", "gradient", "gradient_direction"):
        d, s, norm = deriv(kw.pop("operator", "central"), kw.pop("normalized", False))
        r.terms = [("sep", d, s), ("sep", s, d)]
        r.combine = {"gradient_magnitude": "hypot", "gradient": "stack", "gradient_direction": "atan2"}[op]
        r.scale = 1.0 / norm if op != "gradient_direction" else 1.0
    elif op in ("derivative", "sobel", "prewitt", "scharr"):
        operator = kw.pop("operator", op) if op == "derivative" else op
        d, s, norm = deriv(operator, kw.pop("normalized", False))
        axis = _axis(kw.pop("axis", -1), ndim)
        r.terms = [("sep", d, s) if axis == -2 else ("sep", s, d)]
        r.scale = 1.0 / norm
        if op in ("sobel", "prewitt"):
            r.scipy = (f"SciPy ndimage.{op}, per (H, W) slice", _scipy_per_slice(op, axis, r.mode, r.cval))
    elif op == "laplace":
        lap = np.array([1.0, -2.0, 1.0])
        r.terms, r.combine = [("sep", lap, one), ("sep", one, lap)], "sum"
        r.scipy = ("SciPy ndimage.laplace(axes=(-2, -1))", _scipy_call("laplace", mode=r.mode, cval=r.cval))
    elif op in ("gaussian_filter", "gaussian_gradient_magnitude", "gaussian_laplace"):
        sig = _pair(kw.pop("sigma"), "sigma")
        trunc = float(kw.pop("truncate", 4.0))
        rad = _pair(kw.pop("radius", None), "radius")
        g = [lambda o, a=a: _gauss(sig[a], o, trunc, rad[a]) for a in (0, 1)]
        if op == "gaussian_filter":
            order = _pair(kw.pop("order", 0), "order")
            r.terms = [("sep", g[0](order[0]), g[1](order[1]))]
            if order == (0, 0) and min(map(float, sig)) >= 1e-15:
                r.gauss = (tuple(map(float, sig)), (len(r.terms[0][1]) // 2, len(r.terms[0][2]) // 2))
            extra = {} if rad == (None, None) else {"radius": rad}
            r.scipy = ("SciPy ndimage.gaussian_filter(axes=(-2, -1))",
                       _scipy_call("gaussian_filter", sigma=sig, order=order, mode=r.mode, cval=r.cval,
                                   truncate=trunc, **extra))
        elif op == "gaussian_laplace":
            r.terms, r.combine = [("sep", g[0](2), g[1](0)), ("sep", g[0](0), g[1](2))], "sum"
        else:
            r.terms, r.combine = [("sep", g[0](1), g[1](0)), ("sep", g[0](0), g[1](1))], "hypot"
    elif op in ("uniform_filter",):
        size = _pair(kw.pop("size", 3), "size")
        r.terms = [("sep", np.ones(int(size[0])) / int(size[0]), np.ones(int(size[1])) / int(size[1]))]
        r.scipy = ("SciPy ndimage.uniform_filter(axes=(-2, -1))",
                   _scipy_call("uniform_filter", size=size, mode=r.mode, cval=r.cval))
    elif op in ("correlate1d", "convolve1d", "uniform_filter1d", "gaussian_filter1d"):
        axis = _axis(kw.pop("axis", -1), ndim)
        if op == "uniform_filter1d":
            taps = np.ones(int(kw.pop("size"))) / 1.0
            taps /= taps.size
        elif op == "gaussian_filter1d":
            taps = _gauss(kw.pop("sigma"), int(kw.pop("order", 0)), float(kw.pop("truncate", 4.0)), kw.pop("radius", None))
        else:
            taps = np.asarray(kw.pop("weights"), np.float64).reshape(-1)
            if op == "convolve1d":
                if taps.size % 2 == 0:
                    raise Unsupported("an even-length kernel for convolve (SciPy shifts its origin)")
                taps = taps[::-1].copy()
        r.terms = [("sep", taps, one) if axis == -2 else ("sep", one, taps)]
    elif op in ("correlate", "convolve"):
        K = np.asarray(kw.pop("weights"), np.float64)
        if K.ndim != 2:
            raise Unsupported("a kernel that is not 2-D")
        if op == "convolve":
            if any(s % 2 == 0 for s in K.shape):
                raise Unsupported("an even-size kernel for convolve (SciPy shifts its origin)")
            K = K[::-1, ::-1].copy()
        r.terms = [("full", K)]
    elif op == "selective_blur":
        if kw.pop("mask", None) is not None or kw.pop("weights", None) is not None:
            raise Unsupported("a mask or weights")
        if kw.pop("normalized", False) or kw.pop("keep_border", False):
            raise Unsupported("normalized=True or keep_border=True")
        sigma = kw.pop("sigma", None)
        trunc = float(kw.pop("truncate", 4.0))
        if sigma is None:
            b = np.array([1.0, 2.0, 1.0]) / 4
            r.terms = [("sep", b, b)]
        else:
            sig = _pair(sigma, "sigma")
            r.terms = [("sep", _gauss(sig[0], 0, trunc, None), _gauss(sig[1], 0, trunc, None))]
        r.select = float(kw.pop("threshold", 0.0))
    elif op in RANK_OPS:  # no correlation: SciPy's own function only
        window = {k: kw.pop(k) for k in ("rank", "percentile", "size", "origin") if k in kw}
        footprint = kw.pop("footprint", None)
        if footprint is not None:
            window["footprint"] = np.asarray(footprint, bool)
        r.scipy = (f"SciPy ndimage.{op}(axes=(-2, -1))", _scipy_call(op, mode=r.mode, cval=r.cval, **window))
    else:
        raise Unsupported(f"no plain recipe is known for {op}")
    leftover = {k: v for k, v in kw.items() if v not in (None, 0, False)}
    if "origin" in leftover:
        raise Unsupported("origin != 0")
    if leftover:
        raise Unsupported(f"the arguments {', '.join(sorted(leftover))}")
    return r


def _scipy_call(name: str, **kw: Any) -> Callable:
    def run(a: np.ndarray) -> np.ndarray:
        import scipy.ndimage as ndi

        return getattr(ndi, name)(a, axes=(-2, -1), **kw)

    return run


def _scipy_per_slice(name: str, axis: int, mode: str, cval: float) -> Callable:
    def run(a: np.ndarray) -> np.ndarray:
        import scipy.ndimage as ndi

        fn = getattr(ndi, name)
        flat = a.reshape(-1, *a.shape[-2:])
        out = np.empty_like(flat)
        for i in range(flat.shape[0]):
            fn(flat[i], axis=axis, mode=mode, cval=cval, output=out[i])
        return out.reshape(a.shape)

    return run


# ------------------------------------------------------------------ the libraries


@dataclass
class Alternative:
    """One library's way to run a recipe: ``build(recipe, x)`` returns ``fn() -> result``."""

    name: str  # the row label
    module: str  # what must import
    autograd: bool
    build: Callable[[Recipe, Any, bool], Callable[[], Any]]
    note: str = ""
    extra: str = field(default="bench")


def _combine(xp: Any, r: Recipe, parts: list, x: Any) -> Any:
    if r.combine == "one":
        y = parts[0]
    elif r.combine == "sum":
        y = parts[0] + parts[1]
    elif r.combine == "hypot":
        y = xp.sqrt(parts[0] * parts[0] + parts[1] * parts[1])
    elif r.combine == "stack":
        y = xp.stack(parts, -3)
    else:  # atan2(d/dy, d/dx)
        y = (xp.arctan2 if xp is np else xp.atan2)(parts[0], parts[1])
    if r.scale != 1.0:
        y = y * r.scale
    if r.select is not None:
        y = xp.where(x >= r.select, y, x)
    return y


def _correlations(r: Recipe) -> None:
    """Raise :class:`Unsupported` for a recipe that is not made of correlations (a rank filter)."""
    if not r.terms:
        raise Unsupported("a rank filter (this library runs correlations)")


def _np_input(x: Any) -> np.ndarray:
    import torch

    if x.dtype in (torch.bfloat16,):
        raise Unsupported("bfloat16 (NumPy has none)")
    return x.detach().cpu().numpy()


def _scipy(r: Recipe, x: Any, backward: bool) -> Callable[[], Any]:
    import scipy.ndimage as ndi

    if backward:
        raise Unsupported("no autograd")
    a = _np_input(x)
    if r.scipy is not None:
        label, fn = r.scipy
        return lambda: fn(a)

    def run() -> np.ndarray:
        parts = []
        for t in r.terms:
            if t[0] == "sep":
                y = ndi.correlate1d(a, t[1], axis=-2, mode=r.mode, cval=r.cval)
                parts.append(ndi.correlate1d(y, t[2], axis=-1, mode=r.mode, cval=r.cval))
            else:
                K = t[1].reshape((1,) * (a.ndim - 2) + t[1].shape)
                parts.append(ndi.correlate(a, K, mode=r.mode, cval=r.cval))
        return _combine(np, r, parts, a)

    return run


def scipy_label(r: Recipe | None) -> str:
    return r.scipy[0] if r is not None and r.scipy is not None else "SciPy ndimage.correlate1d/correlate passes"


_CV_BORDER = {"reflect": "BORDER_REFLECT", "mirror": "BORDER_REFLECT_101", "nearest": "BORDER_REPLICATE",
              "constant": "BORDER_CONSTANT"}


def _opencv(r: Recipe, x: Any, backward: bool) -> Callable[[], Any]:
    _correlations(r)
    import cv2
    import torch

    if backward:
        raise Unsupported("no autograd")
    if x.dtype not in (torch.float32, torch.float64):
        raise Unsupported(f"{str(x.dtype).replace('torch.', '')} (its filters take float32 and float64)")
    if r.mode not in _CV_BORDER or (r.mode == "constant" and r.cval != 0):
        raise Unsupported(f"mode {r.mode!r}" + (f" with cval {r.cval}" if r.mode == "constant" else ""))
    border = getattr(cv2, _CV_BORDER[r.mode])
    a = _np_input(x)
    H, W = a.shape[-2:]
    per_sample = a.ndim == 4 and a.shape[1] <= 512
    samples = a if per_sample else a.reshape(-1, 1, H, W)
    dt = a.dtype

    def filt(img: np.ndarray, t: tuple) -> np.ndarray:
        if t[0] == "sep":
            return cv2.sepFilter2D(img, -1, t[2].astype(dt), t[1].astype(dt), borderType=border)
        return cv2.filter2D(img, -1, t[1].astype(dt), borderType=border)

    def run() -> np.ndarray:
        parts = [np.empty_like(samples) for _ in r.terms]
        for b in range(samples.shape[0]):
            img = np.ascontiguousarray(samples[b].transpose(1, 2, 0))  # (H, W, C): OpenCV's layout
            for p, t in zip(parts, r.terms):
                out = filt(img, t)
                p[b] = (out if out.ndim == 3 else out[..., None]).transpose(2, 0, 1)
        parts = [p.reshape(a.shape) for p in parts]
        return _combine(np, r, parts, a)

    return run


def _fold(n: int, r_left: int, r_right: int, mode: str) -> Any:
    """Indices of an axis of length n extended by SciPy's ``mode`` (not constant)."""
    import torch

    i = torch.arange(-r_left, n + r_right)
    if mode == "nearest" or n == 1:
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return i % n
    if mode == "reflect":
        j = i % (2 * n)
        return torch.where(j >= n, 2 * n - 1 - j, j)
    j = i % (2 * n - 2)  # mirror
    return torch.where(j >= n, 2 * n - 2 - j, j)


def _pad(t: Any, kh: int, kw: int, mode: str, cval: float) -> Any:
    import torch
    import torch.nn.functional as F

    (t0, b0), (l0, r0) = (kh // 2, kh - 1 - kh // 2), (kw // 2, kw - 1 - kw // 2)
    if mode == "constant":
        return F.pad(t, (l0, r0, t0, b0), value=cval)
    H, W = t.shape[-2:]
    if t0 or b0:
        t = t.index_select(-2, _fold(H, t0, b0, mode).to(t.device))
    if l0 or r0:
        t = t.index_select(-1, _fold(W, l0, r0, mode).to(t.device))
    return t


def _identity(taps: np.ndarray) -> bool:
    return len(taps) == 1 and float(taps[0]) == 1.0


def _as_bchw(t: Any) -> Any:
    """``(..., H, W)`` as 4-D ``(B, C, H, W)``, the layout the torch libraries take."""
    H, W = t.shape[-2:]
    if t.dim() == 2:
        return t.reshape(1, 1, H, W)
    return t.reshape(-1, t.shape[-3], H, W)


def _torch_conv(r: Recipe, x: Any, backward: bool) -> Callable[[], Any]:
    _correlations(r)
    import torch
    import torch.nn.functional as F

    C = _as_bchw(x).shape[1]

    def kernel(K: np.ndarray) -> Any:  # one copy per channel: a grouped (depthwise) convolution
        k = torch.as_tensor(np.ascontiguousarray(K), dtype=x.dtype, device=x.device)
        return k[None, None].expand(C, 1, *k.shape).contiguous()

    ks = [(kernel(t[1][:, None]), kernel(t[2][None, :])) if t[0] == "sep" else kernel(t[1]) for t in r.terms]

    def run(inp: Any) -> Any:
        b = _as_bchw(inp)
        parts = []
        for t, k in zip(r.terms, ks):
            if t[0] == "sep":  # a pass of the taps [1] is skipped, as one would write it by hand
                y = b
                for taps, kk, dim in ((t[1], k[0], 0), (t[2], k[1], 1)):
                    if not _identity(taps):
                        shape = (len(taps), 1) if dim == 0 else (1, len(taps))
                        y = F.conv2d(_pad(y, *shape, r.mode, r.cval), kk, groups=C)
            else:
                y = F.conv2d(_pad(b, *t[1].shape, r.mode, r.cval), k, groups=C)
            parts.append(y.reshape(inp.shape))
        return _combine(torch, r, parts, inp)

    return run


_KORNIA_BORDER = {"mirror": "reflect", "nearest": "replicate", "wrap": "circular", "constant": "constant"}


def _kornia(r: Recipe, x: Any, backward: bool) -> Callable[[], Any]:
    _correlations(r)
    import kornia
    import torch

    mode = r.mode
    if mode == "reflect" and r.radius <= 1:
        mode = "nearest"  # the same extension at radius 1
    if mode not in _KORNIA_BORDER or (mode == "constant" and r.cval != 0):
        raise Unsupported(f"mode {r.mode!r} at radius {r.radius} (Kornia's 'reflect' is SciPy's 'mirror')")
    if any(len(s) % 2 == 0 for t in r.terms for s in ((t[1], t[2]) if t[0] == "sep" else (t[1][0], t[1][:, 0]))):
        raise Unsupported("an even-size kernel")
    border = _KORNIA_BORDER[mode]

    def k(a: np.ndarray) -> Any:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=x.dtype, device=x.device)[None]

    ks = [(k(t[2]), k(t[1])) if t[0] == "sep" else k(t[1]) for t in r.terms]

    def run(inp: Any) -> Any:
        b = _as_bchw(inp)
        parts = []
        for t, kk in zip(r.terms, ks):
            if t[0] == "sep" and _identity(t[1]):
                y = kornia.filters.filter2d(b, kk[0][:, None, :], border_type=border)
            elif t[0] == "sep" and _identity(t[2]):
                y = kornia.filters.filter2d(b, kk[1][:, :, None], border_type=border)
            elif t[0] == "sep":
                y = kornia.filters.filter2d_separable(b, kk[0], kk[1], border_type=border)
            else:
                y = kornia.filters.filter2d(b, kk, border_type=border)
            parts.append(y.reshape(inp.shape))
        return _combine(torch, r, parts, inp)

    return run


def _torchvision(r: Recipe, x: Any, backward: bool) -> Callable[[], Any]:
    import torchvision.transforms.v2.functional as TF

    if r.gauss is None:
        raise Unsupported("only gaussian_filter (order 0) applies")
    mode = "mirror" if r.mode == "reflect" and r.radius <= 1 else r.mode
    if mode != "mirror":
        raise Unsupported(f"mode {r.mode!r} (its blur pads with torch 'reflect', SciPy's 'mirror')")
    (sy, sx), (ry, rx) = r.gauss
    if min(ry, rx) >= min(x.shape[-2:]):
        raise Unsupported("a kernel radius beyond the image (torch's reflect padding refuses)")

    def run(inp: Any) -> Any:
        y = TF.gaussian_blur(_as_bchw(inp), [2 * rx + 1, 2 * ry + 1], [sx, sy])
        return y.reshape(inp.shape)

    return run


#: torch-based alternatives take the input tensor (``fn(inp)``); the others are closures
ALTERNATIVES = [
    Alternative("SciPy", "scipy.ndimage", False, _scipy),
    Alternative("OpenCV sepFilter2D/filter2D, per sample (HWC)", "cv2", False, _opencv),
    Alternative("Kornia filters.filter2d_separable", "kornia", True, _kornia),
    Alternative("plain torch: index padding + grouped F.conv2d", "torch", True, _torch_conv),
    Alternative("torchvision gaussian_blur", "torchvision.transforms.v2.functional", True, _torchvision),
]
#: packages named when not installed (pip names)
PIP_NAMES = {"scipy.ndimage": "scipy", "cv2": "opencv-python-headless", "kornia": "kornia",
             "torchvision.transforms.v2.functional": "torchvision"}


def tolerance(dtype: Any) -> float:
    import torch

    return {torch.float64: 1e-9, torch.float32: 2e-5}.get(dtype, 2e-2)


def max_rel_error(got: Any, want: Any) -> float:
    """max |got - want| over max(1, max |want|), NaNs matching NaNs."""
    import torch

    g = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got).detach().cpu().double()
    w = want.detach().cpu().double()
    if g.shape != w.shape:
        return math.inf
    both_nan = torch.isnan(g) & torch.isnan(w)
    diff = torch.where(both_nan, torch.zeros_like(g), (g - w).abs())
    if torch.isnan(diff).any():
        return math.inf
    scale = max(1.0, float(w[torch.isfinite(w)].abs().max()) if torch.isfinite(w).any() else 1.0)
    return float(diff.max()) / scale if diff.numel() else 0.0
