"""CPU benchmarks of torchfilters' fused numba engine against SciPy, Kornia, OpenCV and plain
PyTorch, with the one-pass floor ``torch.neg(x, out=y)`` measured alongside.

Sections (``--only``):
  a        gradient magnitude (central) of a (1000, 128, 28, 28) float32 batch
  b        selective_blur forward + backward, (64, 64, 64, 64)
  a2       Sobel gradient magnitude of one 4096x4096 image
  c        gaussian_filter(sigma=2) on a (200, 128, 28, 28) batch and a 4096x4096 image
  v        3-D volumes: Sobel gradient magnitude (2, 1, 128^3), gaussian_filter sigma=2 (1, 1, 192^3),
           a dense 3x3x3 correlate (2, 1, 128^3), selective_blur (2, 1, 128^3)
  d        time per element from 1e4 to 4e8 elements, and call latency at (1, 1, 28, 28)
  latency  call latency alone
  lap      laplace and uniform_filter(size=5) on (64, 64, 64, 64); gaussian_laplace(sigma=2) on 4096x4096
  rank     maximum_filter(size=15) on 4096x4096; median_filter(size=3, 5) on (64, 3, 256, 256)
  canny    canny on (16, 1, 512, 512) float32 (camera + noise) against scikit-image and OpenCV
  startup  the first call of a fresh process, with an empty and with a warm numba cache

Every row is a median from ``torch.utils.benchmark`` in this one process, and
every ratio is between rows measured here, so the table describes this
machine at this moment.  Nothing is asserted.

    .venv/bin/python benchmarks/cpu.py            # after `make bench`; full run (a few minutes)
    .venv/bin/python benchmarks/cpu.py --quick    # smaller repeat counts
    .venv/bin/python benchmarks/cpu.py --only a,a2 --markdown results.md

(from a source checkout without installing: ``PYTHONPATH=src python benchmarks/cpu.py``)

Kornia and OpenCV rows appear only when those packages import.  Section (e),
the DCGAN training step, is ``examples/dcgan_selective_blur.py``.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils import benchmark as tbench

# time the fused engine, never the reference engine that an auto call runs while its kernel
# compiles in the background (the start-up section measures both modes in fresh processes)
os.environ.setdefault("TORCHFILTERS_COMPILE", "wait")

import torchfilters as tf  # noqa: E402

try:
    import scipy.ndimage as ndi
except ImportError:  # pragma: no cover
    ndi = None
try:
    import kornia
except ImportError:  # pragma: no cover
    kornia = None
try:
    import cv2
except ImportError:  # pragma: no cover
    cv2 = None

QUICK = False
ROWS: list = []  # (section, label, median seconds or None for a ratio line, note)
SECTION = ""


def median(fn, min_run_time=1.0, slow=False):
    """Median seconds per call of ``fn()`` (one warm-up call first)."""
    fn()
    if QUICK:
        min_run_time = min_run_time / 4
    # Timer runs stmt with num_threads=1 unless told otherwise: every row gets the process's threads
    t = tbench.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    if slow:  # calls of a second or more: a few single runs
        times = []
        for _ in range(2 if QUICK else 3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))
    return t.blocked_autorange(min_run_time=min_run_time).median


def row(section, label, seconds, note=""):
    global SECTION
    SECTION = section
    ROWS.append((section, label, seconds, note))
    print(f"  {label:<58s} {seconds * 1e3:10.3f} ms  {note}", flush=True)
    return seconds


def ratio_line(text):
    ROWS.append((SECTION, text, None, ""))
    print(f"  -> {text}", flush=True)


def fresh():
    gc.collect()


# --------------------------------------------------------------------------- (a)


def section_a():
    print("\n(a) gradient magnitude, central differences, (1000, 128, 28, 28) float32, mode='reflect'")
    x = torch.randn(1000, 128, 28, 28)
    y = torch.empty_like(x)
    S = "a"
    t_out = row(S, "torchfilters.gradient_magnitude(x, out=y)", median(lambda: tf.gradient_magnitude(x, out=y)))
    t_new = row(S, "torchfilters.gradient_magnitude(x)", median(lambda: tf.gradient_magnitude(x)))
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    others = {}

    if ndi is not None:
        xn = x.numpy()
        kx = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, -1.0], [0.0, 0.0, 0.0]], np.float32)[None, None]
        ky = np.ascontiguousarray(kx.transpose(0, 1, 3, 2))

        def scipy_original():
            gx = ndi.convolve(xn, kx)
            gy = ndi.convolve(xn, ky)
            return np.sqrt(gx * gx + gy * gy)

        others["SciPy: two ndimage.convolve calls + sqrt (the original)"] = median(scipy_original, slow=True)

    def torch_slicing():
        xp = torch.cat([x[..., :1], x, x[..., -1:]], -1)  # reflect, radius 1
        gx = xp[..., 2:] - xp[..., :-2]
        yp = torch.cat([x[..., :1, :], x, x[..., -1:, :]], -2)
        gy = yp[..., 2:, :] - yp[..., :-2, :]
        return torch.sqrt(gx * gx + gy * gy)

    others["plain torch slicing"] = median(torch_slicing)

    C = x.shape[1]
    w = torch.zeros(2 * C, 1, 3, 3)
    w[0::2, 0, 1, 0], w[0::2, 0, 1, 2] = -1.0, 1.0
    w[1::2, 0, 0, 1], w[1::2, 0, 2, 1] = -1.0, 1.0

    def grouped_conv():
        g = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), w, groups=C)
        return torch.sqrt(g[:, 0::2] ** 2 + g[:, 1::2] ** 2)

    others["grouped F.conv2d (replicate pad) + sqrt"] = median(grouped_conv)

    if kornia is not None:

        def kornia_grad():
            g = kornia.filters.spatial_gradient(x, mode="diff", order=1)
            return torch.sqrt(g[:, :, 0] ** 2 + g[:, :, 1] ** 2)

        others["Kornia spatial_gradient(mode='diff') + sqrt"] = median(kornia_grad)

    if cv2 is not None:
        kx2 = np.array([[0.0, 0.0, 0.0], [-1.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
        ky2 = np.ascontiguousarray(kx2.T)
        xn = x.numpy()

        def opencv_per_sample():
            out = np.empty((x.shape[0], 28, 28, C), np.float32)
            for b in range(x.shape[0]):
                img = np.ascontiguousarray(xn[b].transpose(1, 2, 0))
                gx = cv2.filter2D(img, -1, kx2, borderType=cv2.BORDER_REFLECT)
                gy = cv2.filter2D(img, -1, ky2, borderType=cv2.BORDER_REFLECT)
                out[b] = cv2.magnitude(gx.reshape(28, -1), gy.reshape(28, -1)).reshape(28, 28, C)
            return out

        others["OpenCV filter2D x2 + magnitude, per sample (HWC)"] = median(opencv_per_sample, slow=True)

    for label, t in others.items():
        row(S, label, t)
    ratio_line(f"out=: {t_out / t_floor:.2f}x the floor (target <= 1.5x); fresh output: {t_new / t_floor:.2f}x (target <= 2.5x)")
    for label, t in others.items():
        ratio_line(f"{t / t_new:.1f}x faster than {label}" + (" (target >= 40x)" if label.startswith("SciPy") else ""))
    del x, y
    fresh()


# --------------------------------------------------------------------------- (b)


def section_b():
    print("\n(b) selective_blur forward + backward, (64, 64, 64, 64) float32 (3x3 binomial where x >= 0)")
    S = "b"
    x0 = torch.randn(64, 64, 64, 64)
    g = torch.randn_like(x0)
    k = (torch.tensor([1.0, 2.0, 1.0])[:, None] * torch.tensor([1.0, 2.0, 1.0])[None, :] / 16).expand(64, 1, 3, 3)

    def ours():
        x = x0.clone().requires_grad_()
        tf.selective_blur(x, 0.0).backward(g)
        return x.grad

    def ours_fwd():
        return tf.selective_blur(x0, 0.0)

    def conv_where():
        x = x0.clone().requires_grad_()
        b = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), k, groups=64)
        torch.where(x >= 0, b, x).backward(g)
        return x.grad

    def elementwise():
        x = x0.clone().requires_grad_()
        (x * 2).backward(g)
        return x.grad

    t_ours = row(S, "torchfilters.selective_blur fwd+bwd", median(ours))
    row(S, "torchfilters.selective_blur forward only", median(ours_fwd))
    t_conv = row(S, "conv2d (replicate pad) + torch.where, fwd+bwd", median(conv_where))
    t_elem = row(S, "elementwise: (x.clone().requires_grad_() * 2).backward(g)", median(elementwise))
    ratio_line(f"{t_ours / t_elem:.2f}x the elementwise autograd step (target <= 2x)")
    ratio_line(f"{t_conv / t_ours:.1f}x faster than conv2d + where (target >= 3x)")
    fresh()


# -------------------------------------------------------------------------- (a2)


def section_a2():
    print("\n(a2) Sobel gradient magnitude, one (1, 1, 4096, 4096) float32 image")
    S = "a2"
    x = torch.randn(1, 1, 4096, 4096)
    y = torch.empty_like(x)
    t_out = row(S, "torchfilters.gradient_magnitude(x, 'sobel', out=y)",
                median(lambda: tf.gradient_magnitude(x, operator="sobel", out=y)))
    t_new = row(S, "torchfilters.gradient_magnitude(x, 'sobel')",
                median(lambda: tf.gradient_magnitude(x, operator="sobel")))
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    ratio_line(f"out=: {t_out / t_floor:.2f}x the floor (target <= 1.5x); fresh: {t_new / t_floor:.2f}x")
    if cv2 is not None:
        img = x[0, 0].numpy()

        def opencv():
            gx = cv2.Sobel(img, cv2.CV_32F, 1, 0, ksize=3, borderType=cv2.BORDER_REFLECT)
            gy = cv2.Sobel(img, cv2.CV_32F, 0, 1, ksize=3, borderType=cv2.BORDER_REFLECT)
            return cv2.magnitude(gx, gy)

        t_cv = row(S, "OpenCV Sobel x2 + magnitude", median(opencv))
        ratio_line(f"{t_cv / t_new:.1f}x faster than OpenCV (target >= 5x)")
    del x, y
    fresh()


# --------------------------------------------------------------------------- (c)


def section_c():
    for shape, label in (((200, 128, 28, 28), "(200, 128, 28, 28)"), ((1, 1, 4096, 4096), "one 4096x4096 image"),
                         ((4096, 16, 16, 16), "(4096, 16, 16, 16) patches")):
        print(f"\n(c) gaussian_filter sigma=2 (truncate 4: 17 taps), {label}, float32, mode='reflect'")
        S = "c " + label
        x = torch.randn(*shape)
        y = torch.empty_like(x)
        t_new = row(S, "torchfilters.gaussian_filter(x, 2.0)", median(lambda: tf.gaussian_filter(x, 2.0)))
        t_out = row(S, "torchfilters.gaussian_filter(x, 2.0, out=y)", median(lambda: tf.gaussian_filter(x, 2.0, out=y)))
        t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
        issue = "patches" not in label  # (issue 10's targets: the batch and the large image)
        ratio_line(f"{t_new / t_floor:.2f}x the floor{' (target <= 2x)' if issue else ''}; "
                   f"with out=: {t_out / t_floor:.2f}x")
        others = {}
        if ndi is not None:
            xn = x.numpy()
            others["SciPy ndimage.gaussian_filter(axes=(-2, -1))"] = median(
                lambda: ndi.gaussian_filter(xn, 2.0, axes=(-2, -1)), slow=True)
        if kornia is not None:
            others["Kornia gaussian_blur2d (17x17, reflect)"] = median(
                lambda: kornia.filters.gaussian_blur2d(x, (17, 17), (2.0, 2.0), border_type="reflect"), slow=True)
        if cv2 is not None:
            xn = x.numpy()
            if shape[0] == 1:
                others["OpenCV GaussianBlur (17x17)"] = median(
                    lambda: cv2.GaussianBlur(xn[0, 0], (17, 17), 2.0, borderType=cv2.BORDER_REFLECT))
            else:
                def opencv_per_sample():
                    h, w = shape[-2:]
                    out = np.empty((shape[0], h, w, shape[1]), np.float32)
                    for b in range(shape[0]):
                        img = np.ascontiguousarray(xn[b].transpose(1, 2, 0))
                        out[b] = cv2.GaussianBlur(img, (17, 17), 2.0, borderType=cv2.BORDER_REFLECT).reshape(h, w, -1)
                    return out

                others["OpenCV GaussianBlur (17x17) per sample (HWC)"] = median(opencv_per_sample, slow=True)
        for lab, t in others.items():
            row(S, lab, t)
        for lab, t in others.items():
            tgt = {"OpenCV": " (target >= 2x)", "SciPy": " (target >= 8x)"}.get(lab.split()[0], " (target >= 5x)")
            tgt = tgt if issue else ""
            ratio_line(f"{t / t_new:.1f}x faster than {lab}{tgt}; with out=: {t / t_out:.1f}x")
        del x, y
        fresh()


# -------------------------------------------------------------------------- (rank)


def section_rank():
    print("\n(rank) maximum_filter(size=15) on one 4096x4096 image, float32, mode='reflect'")
    S = "rank max15"
    x = torch.randn(4096, 4096)
    y = torch.empty_like(x)
    t_new = row(S, "torchfilters.maximum_filter(x, size=15)", median(lambda: tf.maximum_filter(x, size=15)))
    t_out = row(S, "torchfilters.maximum_filter(x, size=15, out=y)", median(lambda: tf.maximum_filter(x, size=15, out=y)))
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    ratio_line(f"{t_new / t_floor:.2f}x the floor (target <= 3x); with out=: {t_out / t_floor:.2f}x")
    if ndi is not None:
        xn = x.numpy()
        t = row(S, "SciPy ndimage.maximum_filter(size=15)", median(lambda: ndi.maximum_filter(xn, size=15), slow=True))
        ratio_line(f"{t / t_new:.1f}x faster than SciPy (target >= 10x); with out=: {t / t_out:.1f}x")
    if cv2 is not None:
        xn = x.numpy()
        k = np.ones((15, 15), np.uint8)
        t = row(S, "OpenCV dilate (15x15 ones)", median(lambda: cv2.dilate(xn, k, borderType=cv2.BORDER_REFLECT)))
        ratio_line(f"{t / t_new:.2f}x the time of OpenCV dilate")
    del x, y
    fresh()
    shape = (64, 3, 256, 256)
    x = torch.randn(*shape)
    y = torch.empty_like(x)
    t_floor = None
    for k in (3, 5):
        print(f"\n(rank) median_filter(size={k}) on {shape} float32, mode='reflect'")
        S = f"rank median{k}"
        t_new = row(S, f"torchfilters.median_filter(x, size={k})", median(lambda: tf.median_filter(x, size=k)))
        t_out = row(S, f"torchfilters.median_filter(x, size={k}, out=y)", median(lambda: tf.median_filter(x, size=k, out=y)))
        if t_floor is None:
            t_floor = median(lambda: torch.neg(x, out=y))
        row(S, "floor: torch.neg(x, out=y)", t_floor)
        ratio_line(f"{t_new / t_floor:.2f}x the floor; with out=: {t_out / t_floor:.2f}x")
        others = {}
        if ndi is not None:
            xn = x.numpy()
            part = 8  # SciPy on 8 samples, scaled to the batch (it is single-threaded and linear)

            def scipy_slices():
                for s in xn[:part].reshape(-1, 256, 256):
                    ndi.median_filter(s, size=k)

            others["SciPy ndimage.median_filter per slice (8 samples, x8)"] = median(scipy_slices, slow=True) * (
                shape[0] // part)
        if cv2 is not None:
            hwc = [np.ascontiguousarray(s.transpose(1, 2, 0)) for s in x.numpy()]

            def opencv_per_sample():
                for img in hwc:
                    cv2.medianBlur(img, k)

            others["OpenCV medianBlur per sample (HWC float32)"] = median(opencv_per_sample)
        if kornia is not None:
            others["Kornia median_blur"] = median(lambda: kornia.filters.median_blur(x, (k, k)), slow=True)
        for lab, t in others.items():
            row(S, lab, t)
        for lab, t in others.items():
            tgt = {"SciPy": " (target >= 20x)"}.get(lab.split()[0], " (target > 1x)")
            ratio_line(f"{t / t_new:.1f}x faster than {lab}{tgt}; with out=: {t / t_out:.1f}x")
    del x, y
    fresh()


# --------------------------------------------------------------------------- (lap)


def section_lap():
    print("\n(lap) laplace and uniform_filter(size=5), (64, 64, 64, 64) float32, axes (-2, -1), mode='reflect'")
    S = "lap (64, 64, 64, 64)"
    x = torch.randn(64, 64, 64, 64)
    y = torch.empty_like(x)
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    cases = {
        "laplace": (lambda: tf.laplace(x), lambda: tf.laplace(x, out=y),
                    (lambda: kornia.filters.laplacian(x, 3, border_type="reflect", normalized=False))
                    if kornia is not None else None, "Kornia laplacian(3)",
                    (lambda: ndi.laplace(x.numpy(), axes=(-2, -1))) if ndi is not None else None),
        "uniform_filter(size=5)": (lambda: tf.uniform_filter(x, 5), lambda: tf.uniform_filter(x, 5, out=y),
                                   (lambda: kornia.filters.box_blur(x, (5, 5), border_type="reflect"))
                                   if kornia is not None else None, "Kornia box_blur(5x5)",
                                   (lambda: ndi.uniform_filter(x.numpy(), 5, axes=(-2, -1))) if ndi is not None else None),
    }
    for name, (f, f_out, k, klabel, sp) in cases.items():
        t = row(S, f"torchfilters.{name}", median(f))
        t_o = row(S, f"torchfilters.{name}, out=y", median(f_out))
        ratio_line(f"{name}: {t / t_floor:.2f}x the floor (target <= 2x); with out=: {t_o / t_floor:.2f}x")
        if k is not None:
            tk = row(S, klabel, median(k, slow=True))
            ratio_line(f"{name}: {tk / t:.1f}x faster than {klabel} (target > 1x)")
        if sp is not None:
            ts = row(S, f"SciPy ndimage.{name.split('(')[0]}", median(sp, slow=True))
            ratio_line(f"{name}: {ts / t:.1f}x faster than SciPy")
    del x, y
    fresh()
    print("\n(lap) gaussian_laplace sigma=2, one 4096x4096 image, float32")
    S = "lap 4096x4096"
    x = torch.randn(4096, 4096)
    y = torch.empty_like(x)
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    t = row(S, "torchfilters.gaussian_laplace(x, 2.0)", median(lambda: tf.gaussian_laplace(x, 2.0)))
    t_o = row(S, "torchfilters.gaussian_laplace(x, 2.0, out=y)", median(lambda: tf.gaussian_laplace(x, 2.0, out=y)))
    ratio_line(f"gaussian_laplace: {t / t_floor:.2f}x the floor (target <= 3x); with out=: {t_o / t_floor:.2f}x")
    if ndi is not None:
        ts = row(S, "SciPy ndimage.gaussian_laplace", median(lambda: ndi.gaussian_laplace(x.numpy(), 2.0), slow=True))
        ratio_line(f"gaussian_laplace: {ts / t:.1f}x faster than SciPy")
    del x, y
# --------------------------------------------------------------------------- (v)


def section_v():
    """3-D volumes: the volume engine (``backends/cpu/volume.py``)."""
    print("\n(v) 3-D Sobel gradient magnitude, (2, 1, 128, 128, 128) float32, mode='reflect'")
    S = "v sobel"
    x = torch.randn(2, 1, 128, 128, 128)
    y = torch.empty_like(x)
    ax = (-3, -2, -1)
    t_new = row(S, "torchfilters.gradient_magnitude(x, 'sobel', axes=(-3, -2, -1))",
                median(lambda: tf.gradient_magnitude(x, operator="sobel", axes=ax)))
    t_out = row(S, "... out=y", median(lambda: tf.gradient_magnitude(x, operator="sobel", axes=ax, out=y)))
    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)

    def fwd_bwd():
        xg.grad = None
        tf.gradient_magnitude(xg, operator="sobel", axes=ax).backward(g)

    row(S, "... forward + backward", median(fwd_bwd))
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    ratio_line(f"{t_new / t_floor:.2f}x the floor (target <= 2.5x); with out=: {t_out / t_floor:.2f}x")
    others = {}
    if not QUICK:
        others["reference engine (the fallback before the volume engine)"] = median(
            lambda: tf.gradient_magnitude(x, operator="sobel", axes=ax, backend="reference"), slow=True)
    if ndi is not None:
        xn = x.numpy()

        def scipy_sobel():
            for v in xn.reshape(-1, 128, 128, 128):
                gz, gy, gx = (ndi.sobel(v, axis=a) for a in range(3))
                np.sqrt(gz * gz + gy * gy + gx * gx)

        others["SciPy 3x ndimage.sobel + hypot"] = median(scipy_sobel, slow=True)
    if kornia is not None:
        others["Kornia spatial_gradient3d (diff) + norm"] = median(
            lambda: kornia.filters.spatial_gradient3d(x, mode="diff").norm(dim=2), slow=True)
    for label, t in others.items():
        row(S, label, t)
    for label, t in others.items():
        target = " (target >= 20x)" if label.startswith("SciPy") else " (target > 1x)" if "Kornia" in label else ""
        ratio_line(f"{t / t_new:.1f}x faster than {label}{target}")
    del x, y, xg, g
    fresh()

    print("\n(v) 3-D gaussian_filter sigma=2 (17 taps per axis), (1, 1, 192, 192, 192) float32, mode='reflect'")
    S = "v gaussian"
    x = torch.randn(1, 1, 192, 192, 192)
    y = torch.empty_like(x)
    t_new = row(S, "torchfilters.gaussian_filter(x, 2.0, axes=(-3, -2, -1))",
                median(lambda: tf.gaussian_filter(x, 2.0, axes=ax)))
    t_out = row(S, "... out=y", median(lambda: tf.gaussian_filter(x, 2.0, axes=ax, out=y)))
    xg = x.clone().requires_grad_()
    g = torch.randn_like(x)

    def fwd_bwd_g():
        xg.grad = None
        tf.gaussian_filter(xg, 2.0, axes=ax).backward(g)

    row(S, "... forward + backward", median(fwd_bwd_g))
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    ratio_line(f"{t_new / t_floor:.2f}x the floor (target <= 3x); with out=: {t_out / t_floor:.2f}x")
    others = {}
    if not QUICK:
        others["reference engine (the fallback before the volume engine)"] = median(
            lambda: tf.gaussian_filter(x, 2.0, axes=ax, backend="reference"), slow=True)
    if ndi is not None:
        xn = x.numpy()[0, 0]
        others["SciPy ndimage.gaussian_filter"] = median(lambda: ndi.gaussian_filter(xn, 2.0), slow=True)
    for label, t in others.items():
        row(S, label, t)
    for label, t in others.items():
        target = " (target >= 8x)" if label.startswith("SciPy") else ""
        ratio_line(f"{t / t_new:.1f}x faster than {label}{target}")
    del x, y, xg, g
    fresh()

    print("\n(v) 3-D correlate, a dense 3x3x3 kernel (Kornia's filter3d), (2, 1, 128, 128, 128) float32, mode='reflect'")
    S = "v dense"
    x = torch.randn(2, 1, 128, 128, 128)
    y = torch.empty_like(x)
    w3 = torch.rand(3, 3, 3, generator=torch.Generator().manual_seed(0)).tolist()
    t_new = row(S, "torchfilters.correlate(x, w3, axes=(-3, -2, -1))", median(lambda: tf.correlate(x, w3, axes=ax)))
    t_out = row(S, "... out=y", median(lambda: tf.correlate(x, w3, axes=ax, out=y)))
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    ratio_line(f"{t_new / t_floor:.2f}x the floor; with out=: {t_out / t_floor:.2f}x")
    others = {}
    if not QUICK:
        others["reference engine (the fallback before the dense volume kernel)"] = median(
            lambda: tf.correlate(x, w3, axes=ax, backend="reference"), slow=True)
    if ndi is not None:
        xn, wn = x.numpy(), np.asarray(w3)
        others["SciPy ndimage.correlate, per volume"] = median(
            lambda: [ndi.correlate(v[0], wn) for v in xn], slow=True)
    if kornia is not None:
        kw = torch.tensor(w3)[None]
        others["Kornia filter3d (replicate border)"] = median(lambda: kornia.filters.filter3d(x, kw, "replicate"), slow=True)
    for label, t in others.items():
        row(S, label, t)
    for label, t in others.items():
        ratio_line(f"{t / t_new:.1f}x faster than {label}")
    del x, y
    fresh()

    print("\n(v) 3-D selective_blur (blend, sigma=1, x >= 0), (2, 1, 128, 128, 128) float32")
    S = "v blur"
    x = torch.randn(2, 1, 128, 128, 128)
    g = torch.randn_like(x)
    xg = x.clone().requires_grad_()

    def blur_fb(backend=None):
        xg.grad = None
        tf.selective_blur(xg, 0.0, sigma=1.0, axes=ax, backend=backend).backward(g)

    t_f = row(S, "torchfilters.selective_blur(x, 0.0, sigma=1.0, axes=(-3, -2, -1))",
              median(lambda: tf.selective_blur(x, 0.0, sigma=1.0, axes=ax)))
    t_fb = row(S, "... forward + backward", median(blur_fb))
    t_g = row(S, "gaussian_filter(x, 1.0, axes=(-3, -2, -1)) alone", median(lambda: tf.gaussian_filter(x, 1.0, axes=ax)))
    if not QUICK:
        t_ref = row(S, "reference engine forward + backward", median(lambda: blur_fb("reference"), slow=True))
        ratio_line(f"{t_ref / t_fb:.1f}x faster than the reference engine (forward + backward)")
    ratio_line(f"forward {t_f / t_g:.2f}x the Gaussian alone")
    del x, g, xg
    fresh()


# --------------------------------------------------------------------------- (canny)


def section_canny():
    print("\n(canny) canny(sigma=1), (16, 1, 512, 512) float32: skimage.data.camera() plus noise per sample")
    S = "canny"
    try:
        from skimage import data as skdata
        from skimage.feature import canny as sk_canny
    except ImportError:  # pragma: no cover
        skdata = sk_canny = None
    g = torch.Generator().manual_seed(0)
    if skdata is not None:
        base = torch.from_numpy(skdata.camera().astype(np.float32) / 255)
    else:  # pragma: no cover
        base = torch.rand(512, 512, generator=g)
    x = (base + 0.05 * torch.randn(16, 1, 512, 512, generator=g)).clamp(0, 1).contiguous()
    y = torch.empty_like(x)
    t = row(S, "torchfilters.canny(x)", median(lambda: tf.canny(x)))
    tq = row(S, "torchfilters.canny(x, use_quantiles=True, 0.8, 0.9)",
             median(lambda: tf.canny(x, low_threshold=0.8, high_threshold=0.9, use_quantiles=True)))
    big = x[:4, 0].reshape(1, 2048, 512).repeat(1, 1, 4).contiguous()  # one slice: row bands
    row(S, "torchfilters.canny(one 2048x2048 image)", median(lambda: tf.canny(big)))
    t_floor = row(S, "floor: torch.neg(x, out=y)", median(lambda: torch.neg(x, out=y)))
    ratio_line(f"canny: {t / t_floor:.1f}x the floor")
    if sk_canny is not None:
        xn = x.numpy()

        def sk_loop():
            return [sk_canny(xn[b, 0], sigma=1.0) for b in range(xn.shape[0])]

        ts = row(S, "scikit-image feature.canny, per sample", median(sk_loop, slow=True))
        ratio_line(f"{ts / t:.1f}x faster than scikit-image (target >= 10x)")
    if cv2 is not None:
        xu = (x.numpy()[:, 0] * 255).round().astype(np.uint8)

        def cv_loop():
            return [cv2.Canny(xu[b], 50, 100, L2gradient=True) for b in range(xu.shape[0])]

        def cv_blur_loop():
            return [cv2.Canny(cv2.GaussianBlur(xu[b], (9, 9), 1.0), 50, 100, L2gradient=True)
                    for b in range(xu.shape[0])]

        tc = row(S, "OpenCV Canny(uint8, L2gradient=True), per sample", median(cv_loop))
        tb = row(S, "OpenCV GaussianBlur(9x9, 1.0) + Canny, per sample", median(cv_blur_loop))
        ratio_line(f"{t / tc:.1f}x OpenCV Canny's time (target <= 2x); {t / tb:.1f}x GaussianBlur + Canny")
    del x, y
    fresh()


# --------------------------------------------------------------------------- (d)


def section_d():
    print("\n(d) scaling: gradient_magnitude (central), float32 planes of 28x28 (numel = planes * 784)")
    S = "d scaling"
    per = {}
    sizes = [1e4, 1e5, 1e6, 1e7, 1e8, 4e8]
    for n in sizes:
        planes = max(1, int(round(n / 784)))
        x = torch.randn(planes, 28, 28)
        y = torch.empty_like(x)
        t_out = median(lambda: tf.gradient_magnitude(x, out=y), min_run_time=0.5)
        t_new = median(lambda: tf.gradient_magnitude(x), min_run_time=0.5)
        t_floor = median(lambda: torch.neg(x, out=y), min_run_time=0.5)
        per[n] = (t_out / x.numel(), t_new / x.numel(), t_floor / x.numel())
        row(S, f"numel {x.numel():>11,d}: out= / fresh / floor ns per element",
            t_out, f"{per[n][0] * 1e9:.3f} / {per[n][1] * 1e9:.3f} / {per[n][2] * 1e9:.3f} ns/elem")
        del x, y
        fresh()
    big = [n for n in sizes if n >= 1e6]
    for j, name in ((0, "out="), (1, "fresh")):
        vals = [per[n][j] for n in big]
        ratio_line(f"{name}: time per element varies {max(vals) / min(vals):.2f}x over numel 1e6..4e8 (target <= 1.5x)")

    section_latency()


def section_latency():
    print("\n(d) call latency, (1, 1, 28, 28) float32")
    S = "d latency"
    x = torch.randn(1, 1, 28, 28)
    t_add = row(S, "torch.add(x, x)", median(lambda: torch.add(x, x)))
    t_gm = row(S, "torchfilters.gradient_magnitude(x)", median(lambda: tf.gradient_magnitude(x)))
    t_sb = row(S, "torchfilters.selective_blur(x)", median(lambda: tf.selective_blur(x)))
    t_g = row(S, "torchfilters.gaussian_filter(x, 2.0)", median(lambda: tf.gaussian_filter(x, 2.0)))
    t_l = row(S, "torchfilters.laplace(x)", median(lambda: tf.laplace(x)))
    t_u = row(S, "torchfilters.uniform_filter(x, 5)", median(lambda: tf.uniform_filter(x, 5)))
    xr = x.clone().requires_grad_()
    t_ag = row(S, "torchfilters.gradient_magnitude(x), requires_grad", median(lambda: tf.gradient_magnitude(xr)))
    ratio_line(f"gradient_magnitude latency {t_gm / t_add:.1f}x torch.add (target <= 15x); selective_blur "
               f"{t_sb / t_add:.1f}x; gaussian_filter {t_g / t_add:.1f}x; laplace {t_l / t_add:.1f}x; uniform_filter "
               f"{t_u / t_add:.1f}x; with autograd recording {t_ag / t_add:.1f}x")


# --------------------------------------------------------------------------- startup

_PROBE = """
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torchfilters as tf
t2 = time.perf_counter()
{body}
"""
_IMPORT = "print(t2 - t1)"
_FIRST = """
x = torch.rand(8, 3, 28, 28)
t = time.perf_counter(); tf.gradient_magnitude(x); print(time.perf_counter() - t)
"""
_NEW_SIZE = """
tf.gradient_magnitude(torch.rand(8, 3, 28, 28))
x = torch.rand(2, 100, 100)
t = time.perf_counter(); tf.gradient_magnitude(x); print(time.perf_counter() - t)
"""
_FWD_BWD = """
x = torch.rand(4, 3, 28, 28, requires_grad=True)
t = time.perf_counter(); ({call}).sum().backward(); print(time.perf_counter() - t)
"""
_SPAWN = """
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 16
    def __getitem__(self, i): return tf.gradient_magnitude(torch.rand(3, 28, 28), operator="sobel")
if __name__ == "__main__":
    t = time.perf_counter()
    n = sum(1 for _ in DataLoader(D(), batch_size=2, num_workers=2, multiprocessing_context="spawn"))
    print(time.perf_counter() - t)
"""


def _probe(body, env, script=False):
    """Run ``body`` (after timed imports of torch and torchfilters) in a fresh process; the float
    it prints last."""
    import tempfile

    code = _PROBE.format(body=body)
    if script:  # spawn workers re-import the main module: it must be a file
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(code)
        cmd = [sys.executable, f.name]
    else:
        cmd = [sys.executable, "-c", code]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if script:
        os.unlink(f.name)
    if run.returncode != 0:
        raise RuntimeError(f"the start-up probe failed:\n{run.stderr}")
    return float(run.stdout.split()[-1])


def _process_time(env, *argv):
    """Wall time of a whole ``python ARGV`` process."""
    t = time.perf_counter()
    run = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"the probe {argv} failed:\n{run.stderr}")
    return time.perf_counter() - t


def _cli_time(env, *argv):
    return _process_time(env, "-m", "torchfilters", *argv)


def section_startup():
    """Start-up in fresh processes: ``import torchfilters`` over ``import torch``; the first
    gradient_magnitude call with a warm numba cache (over import), and of a new image size; the
    first forward + backward of three ops with an empty cache (``NUMBA_CACHE_DIR`` points at a
    new folder: everything compiles); the command line; spawned DataLoader workers."""
    import tempfile

    print("\n(startup) fresh processes: import, first calls (warm and empty numba cache), CLI, spawn workers")
    S = "startup"
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    base = dict(os.environ)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (src, base.get("PYTHONPATH")) if p)
    t_imp = row(S, "import torchfilters, over import torch", min(_probe(_IMPORT, base) for _ in range(3)))
    calls = (("gradient_magnitude", "tf.gradient_magnitude(x)"), ("selective_blur", "tf.selective_blur(x, 0.5)"),
             ("gaussian_filter", "tf.gaussian_filter(x, 2.0)"))
    # the default (``TORCHFILTERS_COMPILE=background``: an auto call runs on the reference engine
    # until its fused kernel is ready) and ``wait`` (the call compiles or loads the kernel itself)
    bg = {k: v for k, v in base.items() if k != "TORCHFILTERS_COMPILE"}
    with tempfile.TemporaryDirectory() as cache:
        cold = [row(S, f"{name} forward + backward, empty cache",
                    _probe(_FWD_BWD.format(call=call), dict(bg, NUMBA_CACHE_DIR=cache))) for name, call in calls]
    with tempfile.TemporaryDirectory() as cache:
        env = dict(base, NUMBA_CACHE_DIR=cache)
        [row(S, f"{name} forward + backward, empty cache, wait (compiles)",
             _probe(_FWD_BWD.format(call=call), env)) for name, call in calls]
        _probe(_NEW_SIZE, env)  # compiles what the warm rows load
        t_first = row(S, "first gradient_magnitude, warm cache (over import)",
                      min(_probe(_FIRST, dict(bg, NUMBA_CACHE_DIR=cache)) for _ in range(3)))
        row(S, "first gradient_magnitude, warm cache, wait (loads numba)", min(_probe(_FIRST, env) for _ in range(3)))
        t_new = row(S, "first call at a new size (2, 100, 100) after (8, 3, 28, 28)", _probe(_NEW_SIZE, env))
        t_spawn = row(S, "DataLoader, 2 spawn workers, 16 samples", _probe(_SPAWN, env, script=True))
        cli_env = dict(bg, NUMBA_CACHE_DIR=cache)  # (the command as a user runs it: the default mode)
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "one.png")
            try:
                import imageio.v3 as iio

                iio.imwrite(png, (np.random.rand(256, 256) * 255).astype(np.uint8))
                _cli_time(cli_env, "edges", png, "-o", d, "-q")
                t_cli = row(S, "torchfilters edges one.png, warm", min(_cli_time(cli_env, "edges", png, "-o", d, "-q")
                                                                        for _ in range(3)))
            except ImportError:
                t_cli = math.nan
            t_ver = row(S, "torchfilters --version", min(_cli_time(cli_env, "--version") for _ in range(3)))
    t_torch = row(S, "python -c 'import torch'", min(_process_time(base, "-c", "import torch") for _ in range(3)))
    ratio_line(f"import +{t_imp:.2f} s (target <= 0.2 s); first call warm {t_first:.2f} s (target <= 0.3 s); "
               f"new size {t_new:.2f} s (target: no compile); cold fwd+bwd {' / '.join(f'{c:.1f}' for c in cold)} s "
               f"(target <= 2 s each); CLI edges +{t_cli - t_torch:.2f} s and --version +{t_ver - t_torch:.2f} s over "
               f"import torch (target <= 1 s); spawn loader {t_spawn:.1f} s")


# --------------------------------------------------------------------------- main


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = _load()
    import llvmlite.binding
    import numba

    # LLVM's name for the host CPU: the same cloud machine type can land on different CPU
    # generations (znver4 runs 512-bit vectors as two halves, znver5 does not)
    return (f"{cpu} ({llvmlite.binding.get_host_cpu_name()}), {os.cpu_count()} cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), numba {numba.__version__}, numpy {np.__version__}, "
            f"Python {platform.python_version()}; load average at start {load:.2f}")


def _load():
    """The 1-minute load average (NaN where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _load_change(start):
    """A line on the load average at the end against ``start``, with a warning when it moved:
    the floor moves with the machine's load, so ratios within a section hold but sections run
    under different loads are not comparable."""
    end = _load()
    if math.isnan(end):
        return None
    line = f"load average at end {end:.2f} (start {start:.2f})"
    if abs(end - start) > 0.5:
        line += ": the machine's load changed during the run; compare ratios within a section only"
    return line


def to_markdown(info):
    lines = ["# torchfilters CPU benchmarks", "", f"Machine: {info}", "",
             "Medians from `torch.utils.benchmark` in one process (`benchmarks/cpu.py`); ratios are between rows "
             "of the same run.", ""]
    sections = []
    for sec, label, t, note in ROWS:
        if not sections or sections[-1][0] != sec:
            sections.append((sec, [], []))
        (sections[-1][1] if t is not None else sections[-1][2]).append((label, t, note))
    for sec, rows, ratios in sections:
        lines += ["", f"### ({sec})", "", "| case | median | |", "|---|---:|---|"]
        lines += [f"| {label} | {t * 1e3:.3f} ms | {note} |" for label, t, note in rows]
        lines += [""] + [f"- {label}" for label, _, _ in ratios]
    return "\n".join(lines) + "\n"


def main(argv=None):
    global QUICK
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller repeat counts")
    p.add_argument("--only", default="a,b,a2,c,v,lap,rank,canny,d,startup",
                   help="comma-separated sections (default: all)")
    p.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
    args = p.parse_args(argv)
    QUICK = args.quick
    start = _load()
    info = machine()
    print(info)
    # compile (or load from the numba cache) before timing anything
    t0 = time.perf_counter()
    tf.gradient_magnitude(torch.randn(2, 3, 28, 28))
    print(f"first torchfilters call: {time.perf_counter() - t0:.2f} s")
    sections = {"a": section_a, "b": section_b, "a2": section_a2, "c": section_c, "v": section_v,
                "lap": section_lap, "rank": section_rank, "canny": section_canny, "d": section_d,
                "latency": section_latency, "startup": section_startup}
    for name in args.only.split(","):
        sections[name.strip()]()
    end = _load_change(start)
    if end:
        print(f"\n{end}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(to_markdown(info) + (f"\n{end[0].upper()}{end[1:]}.\n" if end else ""))
        print(f"\nwrote {args.markdown}")


if __name__ == "__main__":
    main()
