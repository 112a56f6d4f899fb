"""``torchfilters.ndimage`` against ``scipy.ndimage`` on NumPy arrays, conversions included.

The cases of issue 13: ``gaussian_filter(sigma=2)``, ``sobel``, ``correlate`` (3x3) and
``uniform_filter(5)`` (and the rank filters ``median_filter(3)``, ``maximum_filter(15)``) on a ``(64, 3, 256, 256)`` float32 array with ``axes=(-2, -1)`` (SciPy's
``sobel`` has no ``axes``: both filter the whole array there, every axis) and on one
4096x4096 image, and a 3-D ``gaussian_filter`` on a 256^3 volume.  Medians of a few runs in
this one process; nothing is asserted.

    .venv/bin/python benchmarks/ndimage.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import scipy.ndimage as ndi

# time the fused engine, never the reference engine that auto calls run while kernels compile
os.environ.setdefault("TORCHFILTERS_COMPILE", "wait")

import torchfilters.ndimage as tfn  # noqa: E402


def median(fn, n):
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one run per row (and smaller arrays)")
    args = p.parse_args(argv)
    n = 1 if args.quick else 3
    rng = np.random.default_rng(0)
    batch = rng.random((16 if args.quick else 64, 3, 256, 256), dtype=np.float32)
    image = rng.random((4096, 4096), dtype=np.float32)
    volume = rng.random((128 if args.quick else 256,) * 3, dtype=np.float32)
    k3 = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16
    cases = []
    for label, a, ax in ((f"{batch.shape}", batch, (-2, -1)), ("4096x4096", image, None)):
        cases += [
            (f"gaussian_filter(sigma=2) {label}", lambda m, a=a, ax=ax: m.gaussian_filter(a, 2.0, axes=ax)),
            (f"sobel(axis=-1) {label}", lambda m, a=a: m.sobel(a, -1)),
            (f"correlate(3x3) {label}", lambda m, a=a, ax=ax: m.correlate(a, k3, axes=ax or (-2, -1))),
            (f"uniform_filter(5) {label}", lambda m, a=a, ax=ax: m.uniform_filter(a, 5, axes=ax)),
            (f"median_filter(3) {label}", lambda m, a=a, ax=ax: m.median_filter(a, 3, axes=ax)),
            (f"maximum_filter(15) {label}", lambda m, a=a, ax=ax: m.maximum_filter(a, 15, axes=ax)),
        ]
    cases.append((f"gaussian_filter(sigma=2) volume {volume.shape}", lambda m: m.gaussian_filter(volume, 2.0)))
    print(f"cpu count {os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
    print(f"{'case':<52s} {'scipy':>10s} {'torchfilters':>13s} {'speed-up':>9s}")
    for label, fn in cases:
        ours = median(lambda: fn(tfn), n)
        theirs = median(lambda: fn(ndi), 1 if args.quick else 2)
        print(f"{label:<52s} {theirs * 1e3:8.1f}ms {ours * 1e3:11.1f}ms {theirs / ours:8.1f}x  (target >= 8x)",
              flush=True)


if __name__ == "__main__":
    main()
