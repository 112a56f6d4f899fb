"""What a first call costs on an empty kernel cache: a fresh process per run, its own empty
``NUMBA_CACHE_DIR``, ``TORCHFILTERS_COMPILE=wait`` (each call compiles its kernels in the call).

    .venv/bin/python benchmarks/compile_cost.py [--runs 2]

Prints one table per run: the seconds of each call, in order (the first one pays numba's import
and the engine's; each later one compiles what the calls before it did not).  Compare runs of two
checkouts on the same quiet machine, alternating them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

#: (label, statement); ``x`` is a (2, 3, 64, 64) float32 tensor
CALLS = (
    ("engine import + general kernel (constant mode, float64)",
     "tf.gradient_magnitude(torch.rand(8, 8, dtype=torch.float64), mode='constant', backend='cpu')"),
    ("gradient_magnitude float32 (direct 3x3)", "tf.gradient_magnitude(x, backend='cpu')"),
    ("sobel float64, wrap", "tf.sobel(x.double(), axis=-1, mode='wrap', backend='cpu')"),
    ("gradient_magnitude float16", "tf.gradient_magnitude(x.half(), backend='cpu')"),
    ("gaussian_filter float32, forward + backward",
     "tf.gaussian_filter(x.clone().requires_grad_(True), 2.0, backend='cpu').sum().backward()"),
    ("selective_blur float32, forward + backward",
     "tf.selective_blur(x.clone().requires_grad_(True), 0.5, sigma=1.0, backend='cpu').sum().backward()"),
    ("laplace float32", "tf.laplace(x, backend='cpu')"),
    ("median_filter float32", "tf.median_filter(x, 3, backend='cpu')"),
    ("canny float32", "tf.canny(x[0, 0], backend='cpu')"),
)


def _child() -> None:
    import torch

    import torchfilters as tf

    x = torch.rand(2, 3, 64, 64)
    names = {"tf": tf, "torch": torch, "x": x}
    for label, stmt in CALLS:
        t = time.perf_counter()
        exec(stmt, names)
        print(f"{time.perf_counter() - t:8.2f}  {label}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child()
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="torchfilters-compile-cost-") as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache, TORCHFILTERS_COMPILE="wait")
            t = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
            if out.returncode:
                sys.exit(out.stderr[-3000:])
            print(f"run {run + 1}: seconds per call, empty cache\n{out.stdout}{time.perf_counter() - t:8.2f}  "
                  "the whole process\n")


if __name__ == "__main__":
    main()
