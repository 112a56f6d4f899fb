"""Differential check of the Triton engine on a real GPU: every kernel family against the oracle.

    python benchmarks/gpu_check.py                   # CUDA device; every case
    python benchmarks/gpu_check.py --shard 3/8       # every 8th case from the 4th (run 8 at once:
                                                     # Triton compiles each variant in its process)
    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --device cpu --quick
                                                     # the script itself, through the interpreter
    python benchmarks/gpu_check.py --compile-only    # no GPU: compile every case's kernels for
                                                     # sm_90 (gpu_static's stand-in driver) and
                                                     # report the compile errors (a Triton upgrade
                                                     # or downgrade shows here first)

The interpreter suite (``tests/test_triton*.py``) proves the kernels' semantics on CPU tensors.
What it cannot see is what only the GPU does: the real compiler (its FMA contraction, its
bfloat16 rounding, its vector widths), int32 offsets on large tensors, races between programs,
and launch shapes.  So each case here runs one public call with ``backend="triton"`` on the
device, forward and (where differentiable) backward, and compares it with the reference engine
run on the CPU in float64 on the same (dtype-rounded) input:

* error = max |triton - oracle| / max(1, max |oracle|), against a tolerance per dtype (the
  engine computes in float32 for 16-bit inputs, in the input's dtype otherwise);
* NaN where the oracle has NaN, nowhere else;
* every output element written: the call is repeated with ``out=`` filled with NaN (where the op
  takes ``out``) and must give the same bits;
* the Triton kernels launched (``LAUNCHES``); a case the engine hands to the reference
  (``FALLBACKS``) is reported as such, not as a pass;
* with ``--cpu-bits``, for float32, the fraction of elements whose bits differ from the CPU
  engine's, and the largest difference in float32 ulps (information: 3x3 stencils share SciPy's
  order of operations; the Triton Gaussians add each term by an ``fma``, the CPU's do not).

Prints one line per case and a summary; exits 1 on any failure, 2 when the engine cannot run
on the device (nothing checked).  ``--json FILE`` writes every
case's figures.  No timing here: ``benchmarks/gpu.py`` times.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torchfilters as tf  # noqa: E402
from torchfilters import backends  # noqa: E402

MODES = ("reflect", "mirror", "nearest", "wrap", "constant")
AX3 = (-3, -2, -1)
#: tolerance on max |error| / max(1, max |oracle|), by dtype
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _w(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64) - 0.5


def _mask(x):
    return (torch.arange(x.shape[-1]) % 3 != 0).expand(x.shape).to(x.device)


# (name, fn(x, backend, **out), differentiable, takes out=); each run on the shapes of its group
OPS_2D = [
    ("gradient_magnitude central {m}", lambda x, b, m, **o: tf.gradient_magnitude(x, mode=m, cval=0.5, backend=b, **o), True, True),
    ("gradient_magnitude sobel {m}", lambda x, b, m, **o: tf.gradient_magnitude(x, operator="sobel", mode=m, cval=0.5, backend=b, **o), True, True),
    ("gradient scharr {m}", lambda x, b, m, **o: tf.gradient(x, operator="scharr", mode=m, cval=0.5, backend=b, **o), True, True),
    ("gradient_direction prewitt {m}", lambda x, b, m, **o: tf.gradient_direction(x, operator="prewitt", mode=m, cval=0.5, backend=b, **o), True, True),
    ("sobel axis=-2 {m}", lambda x, b, m, **o: tf.sobel(x, -2, mode=m, cval=0.5, backend=b, **o), True, True),
    ("selective_blur {m}", lambda x, b, m, **o: tf.selective_blur(x, 0.0, mode=m, cval=0.5, backend=b, **o), True, True),
    ("selective_blur mask sigma normalized keep_border {m}",
     lambda x, b, m, **o: tf.selective_blur(x, mask=_mask(x), sigma=1.5, normalized=True, keep_border=True, mode=m,
                                            cval=0.5, backend=b, **o), True, True),
    ("gaussian_filter s=2 {m}", lambda x, b, m, **o: tf.gaussian_filter(x, 2.0, mode=m, cval=0.5, backend=b, **o), True, True),
    ("gaussian_filter s=(1,3) order=(1,0) {m}",
     lambda x, b, m, **o: tf.gaussian_filter(x, (1.0, 3.0), order=(1, 0), mode=m, cval=0.5, backend=b, **o), True, True),
    ("gaussian_gradient_magnitude s=1.5 {m}", lambda x, b, m, **o: tf.gaussian_gradient_magnitude(x, 1.5, mode=m, cval=0.5, backend=b, **o), True, True),
    ("gaussian_laplace s=2 {m}", lambda x, b, m, **o: tf.gaussian_laplace(x, 2.0, mode=m, cval=0.5, backend=b, **o), True, True),
    ("laplace {m}", lambda x, b, m, **o: tf.laplace(x, mode=m, cval=0.5, backend=b, **o), True, True),
    ("uniform_filter 5 {m}", lambda x, b, m, **o: tf.uniform_filter(x, 5, mode=m, cval=0.5, backend=b, **o), True, True),
    ("correlate 5x4 origin {m}",
     lambda x, b, m, **o: tf.correlate(x, _w((5, 4), 1), origin=(1, -1), mode=m, cval=0.5, backend=b, **o), True, True),
    ("convolve1d 6 axis=-2 {m}", lambda x, b, m, **o: tf.convolve1d(x, _w((6,), 2), -2, mode=m, cval=0.5, backend=b, **o), True, True),
    ("unsharp_mask {m}", lambda x, b, m, **o: tf.unsharp_mask(x, 1.5, 0.7, mode=m, cval=0.5, backend=b, **o), True, True),
    ("difference_of_gaussians {m}", lambda x, b, m, **o: tf.difference_of_gaussians(x, 1.0, 2.0, mode=m, cval=0.5, backend=b, **o), True, True),
    ("median_filter 3 {m}", lambda x, b, m, **o: tf.median_filter(x, 3, mode=m, cval=0.5, backend=b, **o), True, True),
    ("median_filter 5 {m}", lambda x, b, m, **o: tf.median_filter(x, 5, mode=m, cval=0.5, backend=b, **o), True, True),
    ("rank_filter footprint origin {m}",
     lambda x, b, m, **o: tf.rank_filter(x, 2, footprint=torch.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.bool),
                                         origin=(0, 1), mode=m, cval=0.5, backend=b, **o), True, True),
    ("minimum_filter (3,7) {m}", lambda x, b, m, **o: tf.minimum_filter(x, (3, 7), mode=m, cval=0.5, backend=b, **o), True, True),
    ("maximum_filter1d 4 {m}", lambda x, b, m, **o: tf.maximum_filter1d(x, 4, mode=m, cval=0.5, backend=b, **o), True, True),
    ("canny s=1.5 {m}", lambda x, b, m, **o: tf.canny(x, 1.5, 0.05, 0.15, mode=m, cval=0.5, backend=b), False, False),
]
OPS_3D = [
    ("3-D gradient_magnitude sobel {m}",
     lambda x, b, m, **o: tf.gradient_magnitude(x, operator="sobel", mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
    ("3-D gradient central {m}", lambda x, b, m, **o: tf.gradient(x, mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
    ("3-D prewitt axis=-3 {m}", lambda x, b, m, **o: tf.prewitt(x, -3, mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
    ("3-D gaussian_filter s=1.5 {m}", lambda x, b, m, **o: tf.gaussian_filter(x, 1.5, mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
    ("3-D gaussian_filter per-axis modes",
     lambda x, b, m, **o: tf.gaussian_filter(x, (1.0, 2.0, 0.7), mode=("wrap", "constant", m), cval=0.5, axes=AX3, backend=b, **o),
     True, True),
    ("3-D laplace {m}", lambda x, b, m, **o: tf.laplace(x, mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
    ("3-D uniform_filter 3 {m}", lambda x, b, m, **o: tf.uniform_filter(x, 3, mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
    ("3-D gaussian_laplace s=1 {m}", lambda x, b, m, **o: tf.gaussian_laplace(x, 1.0, mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
    ("3-D median_filter 3 {m}", lambda x, b, m, **o: tf.median_filter(x, 3, mode=m, cval=0.5, axes=AX3, backend=b, **o), True, True),
]
OPS_1D = [
    ("1-D gaussian_filter1d s=3 {m}", lambda x, b, m, **o: tf.gaussian_filter1d(x, 3.0, mode=m, cval=0.5, backend=b, **o), True, True),
    ("1-D uniform_filter1d 4 {m}", lambda x, b, m, **o: tf.uniform_filter1d(x, 4, mode=m, cval=0.5, backend=b, **o), True, True),
    ("1-D gradient_magnitude axes=(-1,) {m}", lambda x, b, m, **o: tf.gradient_magnitude(x, mode=m, cval=0.5, axes=(-1,), backend=b, **o), True, True),
]


def cases(quick):
    """``(name, fn, mode, shape, dtype, layout, differentiable, takes_out)``."""
    shapes2 = [(2, 3, 28, 28), (1, 2, 67, 131)] + ([] if quick else [(1, 1, 300, 517), (1, 1, 1, 7)])
    shapes3 = [(1, 2, 9, 12, 20)] + ([] if quick else [(1, 1, 33, 40, 70)])
    shapes1 = [(3, 100)] + ([] if quick else [(2, 4099)])
    out = []
    for group, shapes in ((OPS_2D, shapes2), (OPS_3D, shapes3), (OPS_1D, shapes1)):
        for k, (name, fn, diff, takes_out) in enumerate(group):
            for j, shape in enumerate(shapes):
                # every mode on the first shape; the modes in turn on the others
                modes = MODES if j == 0 else (MODES[(k + j) % len(MODES)],)
                for m in modes:
                    out.append((name.format(m=m), fn, m, shape, torch.float32, "contiguous", diff, takes_out))
            m = MODES[k % len(MODES)]
            for dt in (torch.float64, torch.float16, torch.bfloat16):
                out.append((name.format(m=m), fn, m, shapes[0], dt, "contiguous", diff, takes_out))
            out.append((name.format(m=m), fn, m, shapes[0], torch.float32, "transposed", diff, takes_out))
            if len(shapes[0]) == 4:
                out.append((name.format(m=m), fn, m, shapes[0], torch.float32, "channels_last", diff, takes_out))
    return out


def make_input(shape, dtype, layout, device, seed):
    x = (_w(shape, seed) * 4).to(dtype)
    if layout == "transposed":  # a view whose last two axes are swapped in memory
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return x.to(device)


def counters():
    T = backends.get("triton")
    from torchfilters.backends.triton import canny as C

    return sum(T.LAUNCHES.values()) + sum(C.LAUNCHES.values()), sum(T.FALLBACKS.values())


def _err(a, r):
    """(max error over scale, NaNs agree)."""
    a, r = a.double().cpu(), r.double().cpu()
    same_nan = torch.equal(a.isnan(), r.isnan())
    scale = max(1.0, float(r.nan_to_num(0).abs().max())) if r.numel() else 1.0
    d = (a - r).nan_to_num(0).abs()
    return (float(d.max()) / scale if d.numel() else 0.0), same_nan


def _ulps(a, b):
    """(fraction of float32 elements whose bits differ, max difference in ulps)."""
    a, b = a.detach().float().cpu().contiguous(), b.detach().float().cpu().contiguous()
    if a.numel() == 0:
        return 0.0, 0
    ia, ib = a.view(torch.int32).long(), b.view(torch.int32).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF), ia)  # monotonic integer order
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    d = (ia - ib).abs()
    return float((d != 0).double().mean()), int(d.max())


def run_case(case, device, seed, cpu_bits=False):
    name, fn, m, shape, dtype, layout, diff, takes_out = case
    x = make_input(shape, dtype, layout, device, seed)
    g_seed = seed + 1
    res = {"case": name, "shape": list(shape), "dtype": str(dtype)[6:], "layout": layout}
    n0, f0 = counters()
    xt = x.detach().clone().requires_grad_(diff)
    y = fn(xt, "triton", m)
    if diff:
        gy = (_w(y.shape, g_seed)).to(y.dtype).to(device)
        (gx,) = torch.autograd.grad(y, xt, gy)
    if device.type == "cuda":
        torch.cuda.synchronize()
    n1, f1 = counters()
    res["launched"], res["fell_back"] = n1 > n0, f1 > f0
    # the oracle: the reference engine on the CPU, float64, on the same rounded input (Canny's
    # edges in the input's dtype: its thresholds are decisions, and float64 moves a few)
    xr = x.detach().cpu()
    xr = (xr if y.dtype == torch.bool else xr.double()).requires_grad_(diff)
    yr = fn(xr, "reference", m)
    fails = []
    if y.dtype == torch.bool:
        res["fwd_err"] = float((y.cpu() != yr.cpu()).double().mean()) if y.numel() else 0.0
        if res["fwd_err"] > 0:
            fails.append(f"{res['fwd_err']:.2%} of the edges differ")
    else:
        a, r = y.detach(), yr.detach()
        if "direction" in name:  # compare angles modulo 2 pi (+-pi for signed zeros is a known rule)
            d = torch.remainder(a.double().cpu() - r + math.pi, 2 * math.pi) - math.pi
            a, r = d, torch.zeros_like(d)
        res["fwd_err"], nan_ok = _err(a, r)
        if not nan_ok:
            fails.append("forward NaNs differ")
    if diff:
        (gr,) = torch.autograd.grad(yr, xr, gy.cpu().double())
        res["bwd_err"], nan_ok = _err(gx, gr)
        if not nan_ok:
            fails.append("backward NaNs differ")
    tol = TOL[dtype]
    for what in ("fwd_err", "bwd_err"):
        if res.get(what, 0.0) > tol:
            fails.append(f"{what} {res[what]:.3g} > {tol:g}")
    # every element written: out= poisoned with NaN gives the same bits
    if takes_out:
        o = torch.full_like(y.detach(), float("nan"))
        fn(x.detach(), "triton", m, out=o)
        a, b = o.cpu(), y.detach().cpu()
        if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))):
            fails.append("out= (NaN-poisoned) differs from the plain call")
    # float32: bits against the CPU engine (information)
    if cpu_bits and dtype == torch.float32 and y.dtype == torch.float32 and backends.get("cpu") is not None:
        yc = fn(x.detach().cpu(), "cpu", m)
        res["cpu_bits_differ"], res["cpu_max_ulps"] = _ulps(y, yc)
    if not res["launched"]:
        fails.append("no Triton kernel launched")
    res["fails"] = fails
    return res


def big_offsets(device):
    """int64 offsets: a float16 tensor of more than 2**31 elements; its last planes against the
    same planes filtered alone (int32 offsets)."""
    if device.type != "cuda":
        return None
    need = 2 * (2**31 + 2**20) * 2 * 1.1
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        return {"case": "int64 offsets", "skipped": f"needs {need / 2**30:.1f} GiB"}
    x = torch.empty((8193, 1, 512, 512), dtype=torch.float16, device=device).uniform_(-1, 1)
    res = {"case": "int64 offsets: gradient_magnitude sobel, float16 (8193, 1, 512, 512)"}
    fails = []
    for name, fn in (("gm", lambda t: tf.gradient_magnitude(t, operator="sobel", backend="triton")),
                     ("gauss", lambda t: tf.gaussian_filter(t, 1.0, backend="triton"))):
        y = fn(x)
        tail = fn(x[-3:].clone())
        if not torch.equal(y[-3:], tail):
            fails.append(f"{name}: the last planes differ from the same planes alone")
        del y
    res["fails"] = fails
    return res


def compile_only(todo):
    """Every case's launches compiled for sm_90 through ``gpu_static``'s stand-in driver (nothing
    runs; the values are garbage).  Returns the number of cases whose compile failed."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET for --compile-only")
        return 1
    import triton

    import gpu_static

    gpu_static.install()
    errors = {}
    t0 = time.time()
    for name, fn, m, shape, dtype, layout, diff, _ in todo:
        x = make_input(shape, dtype, layout, torch.device("cpu"), 0).requires_grad_(diff)
        try:
            y = fn(x, "triton", m)
            if diff:
                torch.autograd.grad(y, x, torch.ones_like(y))
        except Exception as e:
            c = e
            while c.__cause__ is not None or c.__context__ is not None:
                c = c.__cause__ or c.__context__
            key = f"{type(c).__name__}: {str(c).splitlines()[0][:160] if str(c) else ''}"
            errors.setdefault(key, []).append(f"{name} {str(dtype)[6:]} {tuple(shape)}")
    print(f"triton {triton.__version__}: {len(todo)} cases compiled in {time.time() - t0:.0f} s, "
          f"{sum(map(len, errors.values()))} failed")
    for key, where in errors.items():
        print(f"  {len(where):3d} x {key}\n        e.g. {where[0]}")
    return sum(map(len, errors.values()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th case from the i-th")
    ap.add_argument("--big", action="store_true", help="also the > 2**31-element int64-offset case")
    ap.add_argument("--json", help="write every case's figures here")
    ap.add_argument("--only", default="", help="substring of the case names to run (\"laplace\" also "
                    "selects gaussian_laplace; \"laplace constant\" one mode)")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile every case for sm_90")
    ap.add_argument("--cpu-bits", action="store_true", help="float32: also count the bits that differ from the "
                    "CPU engine's (compiles its numba kernels)")
    args = ap.parse_args(argv)
    i, n = (int(v) for v in args.shard.split("/"))
    if args.compile_only:
        return 1 if compile_only([c for c in cases(args.quick) if args.only in c[0]][i::n]) else 0
    device = torch.device(args.device)
    T = backends.get("triton")
    if T is None or not T.available(device, torch.float32):
        print(f"The Triton engine cannot run on {device} here (CUDA device? TRITON_INTERPRET=1 for cpu?): "
              "nothing checked.")
        return 2
    todo = [c for c in cases(args.quick) if args.only in c[0]][i::n]
    t0 = time.time()
    results, failed = [], 0
    for k, case in enumerate(todo):
        t1 = time.time()
        try:
            r = run_case(case, device, seed=1000 * i + k, cpu_bits=args.cpu_bits)
        except Exception as e:  # report and go on
            r = {"case": case[0], "shape": list(case[3]), "dtype": str(case[4])[6:], "layout": case[5],
                 "fails": [f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"]}
        r["s"] = round(time.time() - t1, 2)
        results.append(r)
        failed += bool(r["fails"])
        info = f"fwd {r.get('fwd_err', float('nan')):.1e} bwd {r.get('bwd_err', float('nan')):.1e}"
        if "cpu_bits_differ" in r:
            info += f" cpu-bits {r['cpu_bits_differ']:.1%}/{r['cpu_max_ulps']}ulp"
        if r.get("fell_back"):
            info += " FELL BACK"
        status = "FAIL " + "; ".join(r["fails"]) if r["fails"] else "ok"
        print(f"{status:4s} {r['case']:55s} {str(tuple(case[3])):22s} {r['dtype']:8s} {r['layout']:13s} "
              f"{info} {r['s']:.1f}s", flush=True)
    if args.big and i == 0:
        r = big_offsets(device)
        if r is not None:
            results.append(r)
            failed += bool(r.get("fails"))
            print(("FAIL " + "; ".join(r["fails"])) if r.get("fails") else f"ok   {r['case']} {r.get('skipped', '')}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(f"shard {args.shard}: {len(results)} cases, {failed} failed, {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
