"""Shared fixtures and the SciPy oracle for the torchfilters test suite.

The oracle is ``scipy.ndimage`` in float64, applied to each ``(H, W)`` slice
of a ``(..., H, W)`` array.  Every parity / gradient / dtype test takes the
``engine`` fixture and passes ``backend=engine`` to the op, so the same tests
check every engine that can run here.

Adding an engine: append its name to ``CANDIDATE_ENGINES``; it is tested as
soon as ``torchfilters.backends.get(name)`` imports it.  The environment
variable ``TORCHFILTERS_TEST_ENGINES=reference,cpu`` restricts the list.

Grids.  The semantics live in cross products (mode x size x kernel x op x
dtype x engine ...) far too large to run whole on every ``make test``.  Each
grid is tested twice over:

* a fixed **core grid** (``grid(...)``, plain pytest parameters): a covering
  array of the axes -- by default every *pair* of values of any two axes
  appears in some case (``strength=2``), plus the cases a test names
  explicitly (``extra=``);
* **sampled cases** of the whole grid (``@given`` with ``st.sampled_from``),
  the engine drawn as one more axis, so that each engine gets its own cases.

``TORCHFILTERS_FULL_GRID=1`` (``make test-full``) makes every ``grid`` the
full cross product and loads the ``full`` Hypothesis profile (many more
examples).  Hypothesis profiles: ``ci`` (chosen when ``CI`` is set: fixed
seeds, no example database), ``dev`` (the default: random seeds, database in
the git-ignored ``.hypothesis/``), ``full``; ``HYPOTHESIS_PROFILE`` picks one
explicitly.  ``deadline=None`` everywhere: numba compiles kernels on first use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import itertools
import math
import os
import sys

# auto calls on CPU tensors compile in the calling thread here (``backends._tiered``): every test
# sees the fused engine, and subprocesses inherit it; tests of the background mode set it back
os.environ.setdefault("TORCHFILTERS_COMPILE", "wait")

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import torchfilters
from torchfilters import backends

# --------------------------------------------------------------------- engines

#: engines that run CPU tensors (Triton has its own tests)
CANDIDATE_ENGINES = ("reference", "cpu")


def _engines():
    names = [b for b in CANDIDATE_ENGINES if torchfilters.backends.get(b) is not None]
    only = os.environ.get("TORCHFILTERS_TEST_ENGINES")
    if only:
        wanted = [s.strip() for s in only.split(",") if s.strip()]
        names = [b for b in names if b in wanted]
    return names


ENGINES = _engines()


@pytest.fixture(params=ENGINES)
def engine(request):
    """Name of a backend to force with ``backend=engine``."""
    return request.param


def float_bits(t, nan_sign: bool = True):
    """The bits of a float tensor (or array) as integers of its width, to compare results bit for
    bit; ``nan_sign=False`` makes every NaN the positive quiet NaN first (the sign of a NaN is not
    part of the engines' contract: which of two NaNs an x86 add passes on follows the compiled
    operand order)."""
    t = torch.as_tensor(t)
    if not nan_sign:
        t = torch.where(t.isnan(), torch.full_like(t, float("nan")).abs(), t)
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


class _NoReplays(dict):
    """A ``cpu._replays`` that keeps nothing: every small call is planned afresh."""

    def __setitem__(self, key, value):
        pass


@pytest.fixture
def no_replays(monkeypatch):
    """The CPU engine plans every call afresh (no replays of small calls, ``cpu._replays``): for
    tests that patch its planning, which a replay recorded before the patch would skip."""
    mod = torchfilters.backends.get("cpu")
    if mod is not None:
        monkeypatch.setattr(mod, "_replays", _NoReplays())


#: one more axis of every sampled grid: each engine gets its own cases (a fixed seed
#: is a hash of the test function, the same for every value of a pytest parameter)
engines = st.sampled_from(ENGINES)


def runs(engine: str, dtype: torch.dtype, device: str = "cpu") -> bool:
    """Whether ``engine`` declares it runs ``dtype`` tensors (sampled tests: ``assume`` it)."""
    return backends.get(engine).available(torch.device(device), dtype)


def require_dtype(engine: str, dtype: torch.dtype, device: str = "cpu") -> None:
    """Skip (visibly) when ``engine`` declares it cannot run ``dtype`` tensors."""
    if not runs(engine, dtype, device):
        pytest.skip(f"backend {engine!r} does not run {dtype} on {device}")


# ----------------------------------------------------------------- constants

#: every mode name we accept, SciPy's grid-* aliases included
MODES = ("reflect", "mirror", "nearest", "wrap", "constant", "grid-mirror", "grid-constant", "grid-wrap")
BASE_MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
#: a non-zero cval, passed to every mode (it must be ignored outside constant)
CVAL = 1.5
SIZES = ((1, 1), (1, 5), (5, 1), (2, 3), (7, 9), (28, 28))
SMALL_SIZES = ((1, 1), (1, 5), (5, 1), (2, 3), (7, 9))
OPERATORS = ("central", "sobel", "scharr", "prewitt")
#: the normalisation divisors stated in derivative's docstring
DIVISORS = {"central": 2.0, "sobel": 8.0, "scharr": 32.0, "prewitt": 6.0}
SMOOTH = {"central": None, "sobel": [1.0, 2.0, 1.0], "scharr": [3.0, 10.0, 3.0], "prewitt": [1.0, 1.0, 1.0]}
BINOMIAL = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]) / 16.0
#: float dtypes besides float64
LOW_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# strategies for the sampled cases of the grids above
modes = st.sampled_from(MODES)
base_modes = st.sampled_from(BASE_MODES)
operators = st.sampled_from(OPERATORS)
#: the grid's sizes, and any other small image
sizes = st.sampled_from(SIZES) | st.tuples(st.integers(1, 12), st.integers(1, 12))
small_sizes = st.sampled_from(SMALL_SIZES) | st.tuples(st.integers(1, 9), st.integers(1, 9))


def size_id(hw):
    return f"{hw[0]}x{hw[1]}"


# ------------------------------------------------------------ grids, profiles


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


#: ``TORCHFILTERS_FULL_GRID=1``: every ``grid`` is the whole cross product
FULL_GRID = _truthy("TORCHFILTERS_FULL_GRID")
CI = _truthy("CI")

_COMMON = {
    "deadline": None,  # numba compiles on first use: seconds for the first example of a kernel
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    "print_blob": True,
}
settings.register_profile("dev", max_examples=20, **_COMMON)
settings.register_profile("ci", max_examples=20, derandomize=True, database=None, **_COMMON)
settings.register_profile("full", max_examples=400, derandomize=CI, database=None if CI else settings.default.database,
                          **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("full" if FULL_GRID else "ci" if CI else "dev")
settings.load_profile(PROFILE)
#: ``examples(n)`` budgets scale by this in the ``full`` profile
EXAMPLE_SCALE = 20 if PROFILE == "full" else 1


def examples(n: int):
    """``@settings`` for a sampled test worth ``n`` examples per run (times 20 in ``full``)."""
    return settings(max_examples=max(1, n * EXAMPLE_SCALE))


def covering(axes, strength=2, extra=()):
    """A deterministic covering array: rows (tuples, one value per axis) such that every
    combination of ``strength`` values of any ``strength`` axes appears in some row
    (``strength=1``: every value of every axis at least once).  ``extra`` rows come first.

    Greedy (AETG-like, no randomness): each new row is the best of a few candidates, each
    started from an uncovered combination and completed axis by axis with the value that
    covers most still-uncovered combinations (ties: the value used least so far).
    """
    values = [list(v) for v in axes]
    n = len(values)
    strength = min(strength, n)
    rows = [tuple(r) for r in extra]
    index = [{_key(v): i for i, v in enumerate(vs)} for vs in values]

    def combos(pick):
        return {tuple((a, pick[a]) for a in c) for c in itertools.combinations(range(n), strength)}

    todo = set()
    for c in itertools.combinations(range(n), strength):
        todo.update(tuple(zip(c, p)) for p in itertools.product(*(range(len(values[a])) for a in c)))
    uses = [[0] * len(vs) for vs in values]
    for r in rows:
        pick = [index[a][_key(v)] for a, v in enumerate(r)]
        todo -= combos(pick)
        for a in range(n):
            uses[a][pick[a]] += 1

    def complete(seed):
        pick = dict(seed)
        for a in range(n):
            if a in pick:
                continue
            mine = [comb for comb in todo if any(ax == a for ax, _ in comb)]
            best, best_score = 0, None
            for i in range(len(values[a])):
                trial = {**pick, a: i}
                gain = sum(1 for comb in mine if all(trial.get(ax) == vi for ax, vi in comb))
                score = (gain, -uses[a][i])
                if best_score is None or score > best_score:
                    best, best_score = i, score
            pick[a] = best
        return [pick[a] for a in range(n)]

    while todo:
        ordered = sorted(todo)
        seeds = ordered[:: max(1, len(ordered) // 8)][:8]
        candidates = [complete(seed) for seed in seeds]
        pick = max(candidates, key=lambda p: len(combos(p) & todo))  # first of the best
        rows.append(tuple(values[a][pick[a]] for a in range(n)))
        todo -= combos(pick)
        for a in range(n):
            uses[a][pick[a]] += 1
    return rows


def _key(v):
    return repr(v)


def value_id(v) -> str:
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    if isinstance(v, tuple) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return size_id(v)
    return str(v)


def grid(argnames: str, *axes, strength=2, extra=()):
    """``pytest.mark.parametrize`` over the core grid of ``axes`` (one sequence of values per
    name in ``argnames``): a ``covering`` array, or with ``TORCHFILTERS_FULL_GRID=1`` the whole
    cross product (``extra`` rows are then part of it, or appended)."""
    names = [a.strip() for a in argnames.split(",")]
    assert len(names) == len(axes), (names, len(axes))
    if FULL_GRID:
        rows = list(itertools.product(*axes))
        have = {_key(r) for r in rows}
        rows += [tuple(r) for r in extra if _key(tuple(r)) not in have]
    else:
        rows = covering(axes, strength, extra)
    return _parametrize(names, rows)


def cases(argnames: str, rows, core):
    """``pytest.mark.parametrize`` over the ``core`` rows of a list of cases (every row of
    ``rows`` with ``TORCHFILTERS_FULL_GRID=1``): for grids that are lists, not products."""
    names = [a.strip() for a in argnames.split(",")]
    rows = [tuple(r) if len(names) > 1 else (r,) for r in rows]
    core = [tuple(r) if len(names) > 1 else (r,) for r in core]
    have = {_key(r) for r in rows}
    assert all(_key(r) in have for r in core), "core cases must be cases"
    return _parametrize(names, rows if FULL_GRID else core)


def _parametrize(names, rows):
    ids = ["-".join(value_id(v) for v in r) for r in rows]
    if len(names) == 1:
        rows = [r[0] for r in rows]
    return pytest.mark.parametrize(names if len(names) > 1 else names[0], rows, ids=ids)


# --------------------------------------------------------------------- inputs


def rand(*shape, seed=0, dtype=torch.float64, low=-1.0, high=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)


def away_from(x: torch.Tensor, threshold: float = 0.0, gap: float = 0.05) -> torch.Tensor:
    """Push values at least ``gap`` away from ``threshold`` (stable masks under finite differences)."""
    d = x - threshold
    return torch.where(d >= 0, threshold + gap + d, threshold - gap + d)


def to_np(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


# ---------------------------------------------------------------- assertions


def assert_close(actual: torch.Tensor, expected, *, rtol=1e-10, scale=None, msg=""):
    """``|actual - expected| <= rtol * scale`` elementwise, ``scale`` = max(1, max|expected|)."""
    expected = to_np(expected)
    got = to_np(actual)
    assert got.shape == expected.shape, f"shape {got.shape} != {expected.shape} {msg}"
    if scale is None:
        scale = max(1.0, float(np.abs(expected).max())) if expected.size else 1.0
    err = np.abs(got - expected)
    bad = ~(err <= rtol * scale)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{int(bad.sum())}/{bad.size} values differ (tol {rtol * scale:.3g}); first at {idx}: "
            f"got {got[idx]!r}, expected {expected[idx]!r}; max err {np.nanmax(err):.3g} {msg}"
        )


def assert_angles_close(actual, expected, *, atol=1e-9, ignore=None):
    """Angles equal modulo 2*pi (atan2 of a signed zero may give +pi or -pi)."""
    d = (to_np(actual) - to_np(expected) + math.pi) % (2 * math.pi) - math.pi
    d = np.abs(d)
    if ignore is not None:
        d = np.where(ignore, 0.0, d)
    assert np.all(d <= atol), f"max angle error {d.max():.3g}"


# ---------------------------------------------------------------- the oracle


def per_slice(fn, x, *args, out_lead=(), **kw):
    """Apply ``fn(slice2d, *args, **kw)`` to each ``(H, W)`` slice of ``x`` (float64)."""
    x = to_np(x)
    lead, (H, W) = x.shape[:-2], x.shape[-2:]
    flat = x.reshape(-1, H, W)
    res = [np.asarray(fn(s, *args, **kw), dtype=np.float64) for s in flat]
    if not res:
        return np.zeros(lead + tuple(out_lead) + (H, W))
    return np.stack(res).reshape(lead + res[0].shape)


def _pair(v):
    return (int(v), int(v)) if np.isscalar(v) else tuple(int(o) for o in v)


def _correlate_slice(s, w, mode, cval, origin):
    """``ndi.correlate`` on one 2-D slice.

    SciPy bug worked around: in ``reflect`` (``grid-mirror``) mode the N-D
    ``ndi.correlate``/``convolve`` (scipy 1.17) read uninitialised memory once
    the kernel reaches about two reflection periods (4 n) past the image edge
    (e.g. a 1x2 image and a 1x16 kernel gives ``1.6e-322``).  ``ndi.correlate1d`` is right there, so for
    long kernels in that mode the 2-D correlation is built from 1-D SciPy
    passes: sum over kernel rows ``a`` of ``shift_a(correlate1d(x, w[a]))``.
    """
    oy, ox = _pair(origin)
    kh, kw = w.shape
    H, W = s.shape
    if mode in ("reflect", "grid-mirror") and (kh > 2 * H or kw > 2 * W):
        out = np.zeros_like(s)
        for a in range(kh):
            row = ndi.correlate1d(s, w[a], axis=1, mode=mode, cval=cval, origin=ox)
            e = np.zeros(kh)
            e[a] = 1.0
            out += ndi.correlate1d(row, e, axis=0, mode=mode, cval=cval, origin=oy)
        return out
    return ndi.correlate(s, w, mode=mode, cval=cval, origin=(oy, ox))


def sp_correlate(x, w, mode="reflect", cval=0.0, origin=0):
    return per_slice(_correlate_slice, x, np.asarray(to_np(w), np.float64), mode, cval, origin)


def sp_convolve(x, w, mode="reflect", cval=0.0, origin=0):
    """``ndi.convolve``: correlate with the flipped kernel, mirrored origin (even sizes shifted)."""
    w = np.asarray(to_np(w), np.float64)
    origin = [-o - (1 - k % 2) for o, k in zip(_pair(origin), w.shape)]
    return sp_correlate(x, w[::-1, ::-1].copy(), mode, cval, tuple(origin))


def sp_correlate1d(x, w, axis=-1, mode="reflect", cval=0.0, origin=0):
    return ndi.correlate1d(to_np(x), np.asarray(w, np.float64), axis=axis, mode=mode, cval=cval, origin=origin)


def sp_convolve1d(x, w, axis=-1, mode="reflect", cval=0.0, origin=0):
    return ndi.convolve1d(to_np(x), np.asarray(w, np.float64), axis=axis, mode=mode, cval=cval, origin=origin)


def sp_derivative(x, axis=-1, operator="central", mode="reflect", cval=0.0, normalized=False):
    """SciPy's sobel/prewitt recipe: ``[-1, 0, 1]`` along ``axis``, then smoothing across.

    ``normalized=True`` is the unnormalised result divided by the docstring's divisor.
    """
    y = ndi.correlate1d(to_np(x), [-1.0, 0.0, 1.0], axis=axis, mode=mode, cval=cval)
    if SMOOTH[operator] is not None:
        other = -3 - axis  # -1 <-> -2
        y = ndi.correlate1d(y, SMOOTH[operator], axis=other, mode=mode, cval=cval)
    if normalized:
        y = y / DIVISORS[operator]
    return y


def sp_gradient(x, operator="central", mode="reflect", cval=0.0, normalized=False):
    gy = sp_derivative(x, -2, operator, mode, cval, normalized)
    gx = sp_derivative(x, -1, operator, mode, cval, normalized)
    return np.stack([gy, gx], axis=-3)


def sp_gradient_magnitude(x, operator="central", mode="reflect", cval=0.0, normalized=False):
    g = sp_gradient(x, operator, mode, cval, normalized)
    return np.sqrt(g[..., 0, :, :] ** 2 + g[..., 1, :, :] ** 2)


def sp_gradient_direction(x, operator="central", mode="reflect", cval=0.0):
    g = sp_gradient(x, operator, mode, cval)
    return np.arctan2(g[..., 0, :, :], g[..., 1, :, :])


def sp_gaussian_filter(x, sigma, order=0, mode="reflect", cval=0.0, truncate=4.0, radius=None):
    return ndi.gaussian_filter(
        to_np(x), sigma, order=order, mode=mode, cval=cval, truncate=truncate, radius=radius, axes=(-2, -1)
    )


def sp_gaussian_gradient_magnitude(x, sigma, mode="reflect", cval=0.0, truncate=4.0, radius=None):
    # per slice: with axes=(-2, -1) on an N-D array SciPy's derivative callback
    # does not pass ``axes`` on to gaussian_filter, so it also smooths the
    # leading (batch) axes
    return per_slice(
        ndi.gaussian_gradient_magnitude, x, sigma, mode=mode, cval=cval, truncate=truncate, radius=radius
    )


def _footprint(weights=None, sigma=None, truncate=4.0):
    """(lo, hi) offsets per axis of the blur kernel (for keep_border)."""
    if weights is not None:
        kh, kw = np.asarray(weights).shape
        return [(-(k // 2), -(k // 2) + k - 1) for k in (kh, kw)]
    if sigma is not None:
        sig = (sigma, sigma) if np.isscalar(sigma) else tuple(sigma)
        out = []
        for s in sig:
            r = int(truncate * float(s) + 0.5) if s > 1e-15 else 0
            out.append((-r, r))
        return out
    return [(-1, 1), (-1, 1)]


def border_band(H, W, weights=None, sigma=None, truncate=4.0):
    """True where the kernel footprint stays inside an ``H x W`` image."""
    (ly, hy), (lx, hx) = _footprint(weights, sigma, truncate)
    r = np.arange(H)[:, None]
    c = np.arange(W)[None, :]
    return (r + ly >= 0) & (r + hy <= H - 1) & (c + lx >= 0) & (c + hx <= W - 1)


def sp_selective_blur(
    x, threshold=0.0, *, mask=None, sigma=None, weights=None, normalized=False, keep_border=False,
    mode="reflect", cval=0.0, truncate=4.0,
):
    """The oracle of DESIGN.md, built from scipy:

    blend: ``where(m, blur(x), x)``; normalized: ``where(m & den > 0, blur(m*x)/den, x)``
    with ``den = blur(m)``, both blurred with cval=0 (nothing outside the image is masked).

    ``keep_border`` only decides which pixels are *written*: border pixels stay
    untouched, but a masked border pixel still counts as a masked neighbour in
    the normalized mean of the pixels next to it (as the blend variant reads
    every original neighbour).
    """
    xn = to_np(x)
    m = (xn >= threshold) if mask is None else np.broadcast_to(to_np(mask) != 0, xn.shape)
    write = m
    if keep_border:
        write = m & border_band(xn.shape[-2], xn.shape[-1], weights, sigma, truncate)

    def blur(a, c):
        if sigma is not None:
            return sp_gaussian_filter(a, sigma, mode=mode, cval=c, truncate=truncate)
        w = BINOMIAL if weights is None else np.asarray(to_np(weights))
        return sp_correlate(a, w, mode=mode, cval=c)

    if not normalized:
        return np.where(write, blur(xn, cval), xn)
    mf = m.astype(np.float64)
    num = blur(mf * xn, 0.0)
    den = blur(mf, 0.0)
    use = write & (den > 0)
    return np.where(use, num / np.where(use, den, 1.0), xn)


# ------------------------------------------------------- one case per public op
#
# ``OPS[name](x, **kw)`` runs one public op on ``x`` with ``kw`` in
# ``mode``/``cval``/``backend``/``out``; used by the gradient, layout, dtype,
# empty-input and out= tests.  Kernels have radius >= 2 where they can.

K2 = ((0.5, -1.0, 2.0, 0.25), (1.0, 0.0, -0.5, 1.5), (0.75, 2.0, 1.0, -1.0), (0.1, 0.2, 0.3, 0.4), (-0.3, 0.6, 0.9, 1.2))
K1 = (0.5, -1.0, 2.0, 0.25, 1.0)
K1_EVEN = (1.0, -2.0, 0.5, 3.0)
BLUR_W = ((1.0, 2.0, 0.0, 2.0, 1.0), (0.5, 1.0, 3.0, 1.0, 0.5), (1.0, 0.0, 2.0, 0.0, 1.0))


def pattern_mask(H, W):
    """A fixed (H, W) bool mask, broadcast over leading axes."""
    i = torch.arange(H)[:, None]
    j = torch.arange(W)[None, :]
    return (i * 3 + j * 2) % 5 < 3


OPS = {
    "correlate": lambda x, **k: torchfilters.correlate(x, K2, origin=(0, 1), **k),
    "convolve": lambda x, **k: torchfilters.convolve(x, K2, origin=(-1, -2), **k),
    "correlate1d": lambda x, **k: torchfilters.correlate1d(x, K1, -1, **k),
    "convolve1d": lambda x, **k: torchfilters.convolve1d(x, K1_EVEN, -2, origin=1, **k),
    "derivative-central-x": lambda x, **k: torchfilters.derivative(x, -1, **k),
    "derivative-sobel-y": lambda x, **k: torchfilters.derivative(x, -2, operator="sobel", **k),
    "derivative-scharr-x-normalized": lambda x, **k: torchfilters.derivative(x, operator="scharr", normalized=True, **k),
    "derivative-prewitt-y": lambda x, **k: torchfilters.derivative(x, axis=-2, operator="prewitt", **k),
    "gradient-sobel": lambda x, **k: torchfilters.gradient(x, operator="sobel", **k),
    "gradient_magnitude-central": lambda x, **k: torchfilters.gradient_magnitude(x, **k),
    "gradient_magnitude-scharr-normalized": lambda x, **k: torchfilters.gradient_magnitude(
        x, operator="scharr", normalized=True, **k
    ),
    "gradient_direction-sobel": lambda x, **k: torchfilters.gradient_direction(x, operator="sobel", **k),
    "sobel": lambda x, **k: torchfilters.sobel(x, **k),
    "prewitt": lambda x, **k: torchfilters.prewitt(x, -2, **k),
    "scharr": lambda x, **k: torchfilters.scharr(x, axis=-1, **k),
    "gaussian_filter": lambda x, **k: torchfilters.gaussian_filter(x, (1.0, 0.7), **k),
    "gaussian_filter-order": lambda x, **k: torchfilters.gaussian_filter(x, 0.8, order=(1, 2), radius=(2, 3), **k),
    "gaussian_gradient_magnitude": lambda x, **k: torchfilters.gaussian_gradient_magnitude(x, 0.9, **k),
    "selective_blur": lambda x, **k: torchfilters.selective_blur(x, 0.0, **k),
    "selective_blur-normalized": lambda x, **k: torchfilters.selective_blur(x, 0.0, normalized=True, **k),
    "selective_blur-sigma-keep_border": lambda x, **k: torchfilters.selective_blur(
        x, 0.0, sigma=(0.6, 0.8), keep_border=True, **k
    ),
    "selective_blur-weights-normalized-keep_border": lambda x, **k: torchfilters.selective_blur(
        x, 0.0, weights=BLUR_W, normalized=True, keep_border=True, **k
    ),
    "selective_blur-mask": lambda x, **k: torchfilters.selective_blur(
        x, mask=pattern_mask(*x.shape[-2:]), weights=BLUR_W, **k
    ),
}

#: ops with a threshold at 0: inputs for finite differences must stay away from it
THRESHOLDED = {name for name in OPS if name.startswith("selective_blur") and name != "selective_blur-mask"}


def op_out_shape(name, shape):
    return tuple(shape[:-2]) + (2,) + tuple(shape[-2:]) if name == "gradient-sobel" else tuple(shape)


# ------------------------------------------------------ frames of a test call


def _big_frame_runner(slots):
    """``run(fn, *args, **kwargs)``: ``fn(*args, **kwargs)`` called from a frame of ``slots``
    local variables (never assigned: only the frame's size matters)."""
    names = ",".join(f"_{i}" for i in range(slots))
    src = f"def run(fn, /, *args, **kwargs):\n    if 0:\n        {names} = None\n    return fn(*args, **kwargs)\n"
    namespace = {}
    exec(compile(src, "<conftest: big frame>", "exec"), namespace)
    return namespace["run"]


#: 512 KiB of locals: its data-stack chunk is 1 MiB, about half of it free for the test's frames
_run_in_big_frame = _big_frame_runner(65536)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    """Run each test function from a frame that starts a large data-stack chunk.

    CPython 3.11 keeps Python frames on a per-thread stack of chunks, 16 KiB each, mapped
    with ``mmap``, and unmaps a chunk as soon as the first frame in it returns.  A hot loop
    whose calls cross a chunk boundary maps and unmaps a chunk on every call, each a few page
    faults: where the test function's frame sits depends on the runner's call depth, and in
    xdist workers the Triton interpreter's call pattern sat on a boundary -- 546,000 16 KiB
    mmap/munmap pairs and 3.3 s of system time in one 7 s test, which took 2.5 s outside
    pytest, and several interpreted tests ran 3-5x slower.  Called from a frame too big for
    the current chunk, the test gets a fresh 1 MiB chunk whose free half holds its frames.
    """
    fn = pyfuncitem.obj
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return (yield)  # pytest refuses these before calling them
    pyfuncitem.obj = functools.partial(_run_in_big_frame, fn)
    try:
        return (yield)
    finally:
        pyfuncitem.obj = fn


# ------------------------------------------------------------ compile log

if os.environ.get("TORCHFILTERS_COMPILE_LOG"):
    import _compile_log  # (tests/, on the path as this file's folder)

    _compile_log.install(os.path.abspath(os.environ["TORCHFILTERS_COMPILE_LOG"]))

    def pytest_runtest_setup(item):
        """Name the test that compiles (``_compile_log``: which test compiles which kernel)."""
        _compile_log.set_test(item.nodeid)


# ------------------------------------------------------------ worker shutdown


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """Collect the garbage and freeze the heap in xdist workers before they report "finished".

    After the controller has every worker's "finished" it closes the gateways, and execnet
    gives a worker's execution 5 s to end before it sends the worker a SIGINT.  What the
    worker still runs then is pytest's unconfigure and cleanup, each a full ``gc.collect()``
    (the unraisable-exception plugin), over a heap of over half a million objects (torch,
    numba, Triton, Hypothesis, the collected items): about a second each on a quiet machine,
    several on a loaded one.  Past 5 s the SIGINT lands while the collector runs, where the
    only Python code executing is Hypothesis' ``gc_callback`` (it times collections), so a
    ``KeyboardInterrupt`` traceback from ``gc_callback`` is printed at shutdown.

    This hook runs inside xdist's ``pytest_sessionfinish`` wrapper, before "finished" is
    sent: one collection here (still under pytest's unraisable hook), then ``gc.freeze()``
    moves the survivors to the permanent generation, which later collections skip, so the
    worker's remaining teardown takes milliseconds.  At exit (after execnet's wait) they are
    unfrozen, so that the interpreter's last collection still frees them (nanobind, under
    Triton, reports objects left alive at exit as leaks).
    """
    if hasattr(session.config, "workerinput"):
        import atexit
        import gc

        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)


# ------------------------------------------------------------- interpreted Triton


@contextlib.contextmanager
def _lean_interpreter():
    """Triton's interpreter, without its two costs that do not change what a kernel computes.

    - Each call of a ``@triton.jit`` *device* function re-patches ``triton.language`` for the
      interpreter (``_patch_lang``: five ``inspect.getmembers`` walks), although the launch in
      progress patched the same modules already and keeps them patched until it returns; the
      device call's patch is never undone either.  Here a device call whose modules the launch
      has patched skips it.  (A third of the interpreted suite's time.)
    - ``_get_np_dtype`` builds its table of dtypes on every call: here its answers are kept.
    - The interpreter's int32 overflow sanitizer is off.  As shipped it redoes each int32 add,
      sub and mul in int64 and compares the result with the int32 range -- half of an interpreted
      launch's time -- and then drops the comparison: its ``device_assert`` only asserts with
      ``debug=True``, which the interpreter leaves off.  ``make test-full`` keeps the inert
      computation (the interpreter as shipped), and
      ``test_triton.py::test_index_arithmetic_passes_the_overflow_sanitizer`` runs each kernel
      family with the sanitizer *and* ``debug`` on, where it asserts.

    They stand down (the interpreter as shipped) where the Triton in use lacks the names."""
    try:
        from triton.runtime import interpreter as interp

        patch_lang, executor_call, np_dtype = interp._patch_lang, interp.GridExecutor.__call__, interp._get_np_dtype
        empty_scope, tl = interp._LangPatchScope, interp.tl
        builder, options = interp.interpreter_builder, interp.interpreter_builder.options
        lean_options = dataclasses.replace(options, sanitize_overflow=FULL_GRID)
    except (ImportError, AttributeError, TypeError):
        yield
        return
    state = {"launch": None, "patched": False}
    langs_of = {}

    def langs(fn):
        found = langs_of.get(fn)
        if found is None:
            found = langs_of[fn] = frozenset(
                id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        return found

    def lean_patch_lang(fn):
        launch = state["launch"]
        mine = langs(fn)
        if launch is not None and state["patched"] and mine and mine <= launch:
            return empty_scope()  # a device function inside a launch: already patched
        # (no ``triton.language`` in its module: the interpreter's own check and error)
        scope = patch_lang(fn)
        if launch is not None:
            state["patched"] = True  # (the launch's own patch comes first)
        return scope

    def lean_call(self, *args, **kwargs):
        outer = state["launch"], state["patched"]
        state["launch"], state["patched"] = langs(self.fn), False
        try:
            return executor_call(self, *args, **kwargs)
        finally:
            state["launch"], state["patched"] = outer

    dtypes = {}

    def lean_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):  # (a block's answer is its element type's)
            tt_dtype = tt_dtype.element_ty
        try:
            return dtypes[tt_dtype]
        except KeyError:
            dtypes[tt_dtype] = got = np_dtype(tt_dtype)
            return got
        except TypeError:  # (unhashable: pointer types)
            return np_dtype(tt_dtype)

    interp._patch_lang, interp.GridExecutor.__call__, interp._get_np_dtype = lean_patch_lang, lean_call, lean_np_dtype
    builder.options = lean_options
    try:
        yield
    finally:
        interp._patch_lang, interp.GridExecutor.__call__, interp._get_np_dtype = patch_lang, executor_call, np_dtype
        builder.options = options


@contextlib.contextmanager
def interpreted_triton():
    """The Triton engine with interpreted kernels, installed as backend "triton" for the block.

    ``TRITON_INTERPRET=1`` must be set before the engine's kernels are decorated, so the module
    is (re)imported here; the previous module, registration and environment come back after."""
    name = "torchfilters.backends.triton"

    def package():  # the engine and its submodules (prims, footprint, plan, rows, rank, canny)
        return {k: v for k, v in sys.modules.items() if k == name or k.startswith(name + ".")}

    old_env = os.environ.get("TRITON_INTERPRET")
    old_mods = package()
    for k in old_mods:
        del sys.modules[k]
    old_loaded = backends._loaded.pop("triton", None)
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        mod = importlib.import_module(name)
        assert mod.interpreted(), "TRITON_INTERPRET=1 did not give interpreted kernels"
        backends._loaded["triton"] = mod
        with _lean_interpreter():
            yield mod
    finally:
        if old_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old_env
        for k in package():
            del sys.modules[k]
        backends._loaded.pop("triton", None)
        sys.modules.update(old_mods)
        if name in old_mods:
            backends.triton = old_mods[name]
        elif hasattr(backends, "triton"):
            del backends.triton
        if old_loaded is not None:
            backends._loaded["triton"] = old_loaded


class AtenLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops run inside the block (``.ops``): launch paths that must allocate nothing."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


#: aten ops that allocate, upload or write a tensor
ALLOCATING = ("empty", "zeros", "ones", "full", "tensor", "lift_fresh", "_to_copy", "clone", "copy_", "new_",
              "scalar_tensor", "arange")
