"""No CPU kernel reads or writes outside its tensors: every op family runs on inputs and
``out=`` tensors placed flush against ``PROT_NONE`` guard pages (``_guard``), at the start and
at the end of the guarded region, in every mode.  A read one element outside faults (vector
loads of every lane do so on hosts without masked loads, such as AVX2 ones: the direct path's
wrap-mode run once did), and the results must equal the reference engine's.  One subprocess
runs the lot (float32, and float16 on a few ops); ``tests/test_cpu_direct.py`` sweeps the direct
3x3 path's shapes in float32 and float64."""

from __future__ import annotations

import math
import mmap
import sys

import pytest
import torch

import torchfilters as tf

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="guard pages via libc mmap/mprotect")

MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
W5 = ((0.5, -1.0, 2.0, 0.0, 1.0), (1.0, 0.0, -0.5, 0.25, 0.5), (0.75, 2.0, 1.0, -1.0, 0.0),
      (0.1, 0.2, 0.3, 0.4, 0.5), (-0.3, 0.6, 0.9, 0.0, 0.2))

#: (name, op(x, mode, **out), volume?): the op families of the CPU engine's kernels
OPS = (
    ("gaussian_filter", lambda x, m, **k: tf.gaussian_filter(x, 1.5, mode=m, cval=0.5, **k), False),
    ("gaussian_filter-order", lambda x, m, **k: tf.gaussian_filter(x, 1.0, order=(1, 2), mode=m, **k), False),
    ("gaussian_filter1d", lambda x, m, **k: tf.gaussian_filter1d(x, 2.0, -1, mode=m, **k), False),
    ("uniform_filter", lambda x, m, **k: tf.uniform_filter(x, 4, mode=m, **k), False),
    ("laplace", lambda x, m, **k: tf.laplace(x, mode=m, **k), False),
    ("gaussian_laplace", lambda x, m, **k: tf.gaussian_laplace(x, 1.0, mode=m, **k), False),
    ("gaussian_gradient_magnitude", lambda x, m, **k: tf.gaussian_gradient_magnitude(x, 1.0, mode=m, **k), False),
    ("correlate-5x5", lambda x, m, **k: tf.correlate(x, W5, mode=m, cval=-1.0, **k), False),
    ("convolve-3x3", lambda x, m, **k: tf.convolve(x, [r[:3] for r in W5[:3]], mode=m, **k), False),
    ("correlate1d", lambda x, m, **k: tf.correlate1d(x, W5[0], -2, mode=m, **k), False),
    ("sobel", lambda x, m, **k: tf.sobel(x, -1, mode=m, **k), False),
    ("gradient-scharr", lambda x, m, **k: tf.gradient(x, operator="scharr", mode=m, **k), False),
    ("gradient_magnitude", lambda x, m, **k: tf.gradient_magnitude(x, operator="sobel", mode=m, **k), False),
    ("gradient_direction", lambda x, m, **k: tf.gradient_direction(x, mode=m, **k), False),
    ("selective_blur", lambda x, m, **k: tf.selective_blur(x, 0.0, sigma=1.0, mode=m, **k), False),
    ("selective_blur-normalized", lambda x, m, **k: tf.selective_blur(x, 0.0, sigma=1.0, normalized=True,
                                                                       mode=m, **k), False),
    ("difference_of_gaussians", lambda x, m, **k: tf.difference_of_gaussians(x, 1.0, mode=m, **k), False),
    ("unsharp_mask", lambda x, m, **k: tf.unsharp_mask(x, 1.0, mode=m, **k), False),
    ("median_filter", lambda x, m, **k: tf.median_filter(x, 3, mode=m, **k), False),
    ("maximum_filter", lambda x, m, **k: tf.maximum_filter(x, 5, mode=m, **k), False),
    ("minimum_filter1d", lambda x, m, **k: tf.minimum_filter1d(x, 9, -1, mode=m, **k), False),
    ("rank_filter", lambda x, m, **k: tf.rank_filter(x, 2, (3, 5), mode=m, **k), False),
    ("percentile_filter", lambda x, m, **k: tf.percentile_filter(x, 70.0, 7, mode=m, **k), False),
    ("canny", lambda x, m, **k: tf.canny(x, 1.0, mode=m, **k), False),
    ("gaussian_filter-3d", lambda x, m, **k: tf.gaussian_filter(x, 1.0, mode=m, axes=(-3, -2, -1), **k), True),
    ("gradient_magnitude-3d", lambda x, m, **k: tf.gradient_magnitude(x, operator="sobel", mode=m,
                                                                       axes=(-3, -2, -1), **k), True),
    ("laplace-3d", lambda x, m, **k: tf.laplace(x, mode=(m, "wrap", "reflect"), axes=(-3, -2, -1), **k), True),
)
#: shapes of 2048 elements (two float32 pages), plane and row extremes among them
SHAPES = ((2, 32, 32), (1, 1, 2048), (1, 2048, 1), (1024, 2), (2, 1024), (8, 16, 16))
VOLUMES = ((2, 8, 8, 16), (1, 2, 32, 32))


def test_no_kernel_reads_or_writes_outside_its_tensors():
    from _guard import run_in_subprocess

    run_in_subprocess("test_guard_pages", "_sweep")


def _place(region, n, dtype, at_end):
    """``n`` elements of ``dtype`` flush against the start or the end of a guarded region."""
    flat = region.view(dtype)
    return flat[flat.numel() - n:] if at_end else flat[:n]


def _sweep():
    from _guard import guarded
    from conftest import rand

    pg = mmap.PAGESIZE
    k = 0
    for dtype, ops in ((torch.float32, OPS), (torch.float16, OPS[::5])):
        for name, op, volume in ops:
            for shape in VOLUMES if volume else SHAPES:
                n = math.prod(shape)
                src = rand(n, seed=k, dtype=dtype).view(shape)
                for at_end in (False, True):
                    mode = MODES[k % len(MODES)]
                    k += 1
                    want = op(src, mode, backend="reference")
                    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-5)
                    with guarded(-(-n * src.element_size() // pg) * pg) as region:
                        x = _place(region, n, dtype, at_end).view(shape)
                        x.copy_(src)
                        y = op(x, mode, backend="cpu")
                        torch.testing.assert_close(y, want, **tol, msg=lambda m: f"{name} {shape} {mode}: {m}")
                        assert torch.equal(x, src), (name, shape, mode)  # the input untouched
                    if name == "canny":  # (no out=)
                        continue
                    with guarded(-(-want.numel() * want.element_size() // pg) * pg) as region:
                        out = _place(region, want.numel(), want.dtype, at_end).view(want.shape)
                        y = op(src, mode, backend="cpu", out=out)
                        assert y is out
                        torch.testing.assert_close(y, want, **tol, msg=lambda m: f"{name} {shape} {mode} out=: {m}")
