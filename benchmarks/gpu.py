"""GPU benchmark of the fused Triton engine: correctness first, then timings.

    python benchmarks/gpu.py               # needs a CUDA device; about 2-4 minutes on an H100/H200
    python benchmarks/gpu.py --quick       # smaller shapes, shorter timing (a smoke run)
    python benchmarks/gpu.py --no-check    # timings only (benchmarks/gpu_check.py checks
                                           # every kernel family against the oracle)

No GPU: ``benchmarks/gpu_check.py --compile-only`` compiles every kernel family for sm_90, and
``benchmarks/gpu_static.py`` models these cases from the compiled code.

1. Correctness: ``gpu_check.py``'s cases of the benchmarked ops, forward and backward, Triton
   against the reference engine.  Any mismatch stops the script (exit 1).
2. Copy bandwidth: ``dst.copy_(src)`` of a 1 GiB tensor (read + write), the floor.
3. Timings (``triton.testing.do_bench``, median): achieved GB/s = (bytes read + bytes
   written by an ideal one-pass kernel) / time, and that as a fraction of the copy bandwidth,
   against plain torch slicing, grouped ``F.conv2d`` and Kornia (if installed).

Targets (DESIGN / issue 4): gradient magnitude forward >= 80 % of copy bandwidth;
selective_blur forward and backward >= 70 %; >= 5x faster than torch slicing on the first case.
Prints only; never asserts a time.  Exits 0 with a message when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torchfilters as tf  # noqa: E402
from torchfilters import _spec, backends  # noqa: E402

# ----------------------------------------------------------------- baselines


def slicing_gradient_magnitude(x):
    """What a user writes by hand: replicate-pad (== SciPy reflect at radius 1) and slice."""
    xp = F.pad(x.reshape(-1, 1, *x.shape[-2:]), (1, 1, 1, 1), mode="replicate").reshape(
        *x.shape[:-2], x.shape[-2] + 2, x.shape[-1] + 2
    )
    gx = xp[..., 1:-1, 2:] - xp[..., 1:-1, :-2]
    gy = xp[..., 2:, 1:-1] - xp[..., :-2, 1:-1]
    return torch.sqrt(gx * gx + gy * gy)


def conv_gradient_magnitude(x):
    """Grouped conv2d: one (2, 1, 3, 3) derivative pair per channel."""
    B, C, H, W = x.shape
    k = torch.zeros(2, 1, 3, 3, dtype=x.dtype, device=x.device)
    k[0, 0, :, 1] = torch.tensor([-1.0, 0.0, 1.0])  # d/dy
    k[1, 0, 1, :] = torch.tensor([-1.0, 0.0, 1.0])  # d/dx
    w = k.repeat(C, 1, 1, 1)
    g = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), w, groups=C).view(B, C, 2, H, W)
    return torch.sqrt((g * g).sum(2))


def slicing_selective_blur(x, threshold=0.0):
    """The GAN case by hand: binomial 3x3 blur where x >= threshold (reflect == replicate at r=1)."""
    xp = F.pad(x, (1, 1, 1, 1), mode="replicate")
    v = 0.25 * xp[..., :-2, :] + 0.5 * xp[..., 1:-1, :] + 0.25 * xp[..., 2:, :]
    b = 0.25 * v[..., :-2] + 0.5 * v[..., 1:-1] + 0.25 * v[..., 2:]
    return torch.where(x >= threshold, b, x)


def conv_selective_blur(x, threshold=0.0):
    C = x.shape[1]
    k = torch.tensor([1.0, 2.0, 1.0], dtype=x.dtype, device=x.device)
    w = (k[:, None] * k[None, :] / 16.0).expand(C, 1, 3, 3).contiguous()
    b = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), w, groups=C)
    return torch.where(x >= threshold, b, x)


def conv_gaussian(x, sigma=2.0):
    from torchfilters import kernels

    r = kernels.gaussian_radius(sigma, 4.0)
    k = torch.tensor(kernels.gaussian_kernel1d(sigma, 0, r), dtype=x.dtype, device=x.device)
    C = x.shape[1]
    xp = F.pad(x, (r, r, r, r), mode="reflect")  # torch reflect == SciPy mirror: close enough to time
    y = F.conv2d(xp, k.view(1, 1, -1, 1).expand(C, 1, -1, 1).contiguous(), groups=C)
    return F.conv2d(y, k.view(1, 1, 1, -1).expand(C, 1, 1, -1).contiguous(), groups=C)


def kornia_ops():
    try:
        import kornia  # noqa: F401
        import kornia.filters as KF
    except Exception:
        return None

    def gm(x):
        g = KF.spatial_gradient(x, mode="diff", order=1, normalized=False)  # replicate border
        return torch.sqrt((g * g).sum(2))

    def blur(x, threshold=0.0):
        k = torch.tensor([[1.0, 2.0, 1.0]], device=x.device, dtype=x.dtype)
        return torch.where(x >= threshold, KF.filter2d(x, (k.T @ k / 16.0)[None], border_type="replicate"), x)

    def gauss(x, sigma=2.0):
        return KF.gaussian_blur2d(x, (17, 17), (sigma, sigma), border_type="reflect")

    return {"gm": gm, "blur": blur, "gauss": gauss}


# --------------------------------------------------------------- correctness


#: the cases of ``gpu_check`` run before timing: the benchmarked ops (one oracle, one tolerance
#: table: ``gpu_check.run_case``)
CHECKED = ("gradient_magnitude central", "selective_blur reflect", "gaussian_filter s=2",
           "3-D gradient_magnitude sobel", "3-D gaussian_filter s=1.5")


def check_correctness(device, quick):
    """``gpu_check``'s cases of the benchmarked ops, Triton against the reference engine on the
    CPU in float64, forward and backward; returns the failures."""
    import gpu_check

    todo = [c for c in gpu_check.cases(quick) if c[0].startswith(CHECKED)]
    failures = []
    for k, case in enumerate(todo):
        r = gpu_check.run_case(case, device, seed=k)
        failures += [f"{case[0]} {str(case[4]).removeprefix('torch.')} {tuple(case[3])} {case[5]}: {f}" for f in r["fails"]]
    return failures


# ------------------------------------------------------------------- timing


def bench(fn, rep_ms):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median")


def copy_bandwidth(device, rep_ms):
    n = 256 * 1024 * 1024  # 1 GiB of float32
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), rep_ms)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def row(case, impl, ms, nbytes, copy_bw, base_ms=None):
    gbs = nbytes / (ms * 1e-3) / 1e9
    sp = f"{base_ms / ms:7.1f}x" if base_ms else "        "
    print(f"  {case:34s} {impl:30s} {ms:9.3f} ms {gbs:8.0f} GB/s {100 * gbs / copy_bw:6.1f} % of copy  {sp}")


def timings(device, quick):
    rep = 100 if quick else 400
    copy_bw = copy_bandwidth(device, rep)
    print(f"\ncopy bandwidth (dst.copy_(src), 1 GiB): {copy_bw:.0f} GB/s  [{torch.cuda.get_device_name(device)}]")
    print(f"  {'case':34s} {'implementation':30s} {'time':>12s} {'achieved':>13s} {'':>16s}  vs slicing")
    K = kornia_ops()
    more_timings(device, quick, rep, copy_bw)  # (first: the N-D cases' targets)

    # 1. gradient magnitude, the CNN-activation case
    shape = (1000, 128, 28, 28) if not quick else (100, 128, 28, 28)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(shape, device=device, dtype=dtype)
        out = torch.empty_like(x)
        nb = 2 * x.numel() * x.element_size()
        case = f"grad-mag central {tuple(shape)} {str(dtype)[6:]}"
        base = bench(lambda: slicing_gradient_magnitude(x), rep)
        row(case, "torch slicing (eager)", base, nb, copy_bw, base)
        row(case, "grouped F.conv2d", bench(lambda: conv_gradient_magnitude(x), rep), nb, copy_bw, base)
        if K:
            row(case, "kornia spatial_gradient", bench(lambda: K["gm"](x), rep), nb, copy_bw, base)
        row(case, "torchfilters triton", bench(lambda: tf.gradient_magnitude(x, backend="triton"), rep), nb, copy_bw, base)
        row(case, "torchfilters triton out=", bench(lambda: tf.gradient_magnitude(x, out=out, backend="triton"), rep),
            nb, copy_bw, base)
        # backward alone: reads x and grad, writes grad_in
        xr = x.clone().requires_grad_(True)
        y = tf.gradient_magnitude(xr, backend="triton")
        gy = torch.randn_like(y)
        row(case + " bwd", "torchfilters triton", bench(lambda: torch.autograd.grad(y, xr, gy, retain_graph=True), rep),
            3 * x.numel() * x.element_size(), copy_bw)
        del x, out, xr, y, gy
        torch.cuda.empty_cache()

    # 2. selective blur forward + backward, the GAN case
    shape = (64, 64, 64, 64) if not quick else (16, 64, 64, 64)
    x = torch.randn(shape, device=device)
    gy = torch.randn_like(x)
    n4 = x.numel() * 4
    case = f"selective_blur {tuple(shape)} f32"
    base = bench(lambda: slicing_selective_blur(x), rep)
    row(case + " fwd", "torch slicing (eager)", base, 2 * n4, copy_bw, base)
    row(case + " fwd", "grouped F.conv2d", bench(lambda: conv_selective_blur(x), rep), 2 * n4, copy_bw, base)
    if K:
        row(case + " fwd", "kornia filter2d", bench(lambda: K["blur"](x), rep), 2 * n4, copy_bw, base)
    row(case + " fwd", "torchfilters triton", bench(lambda: tf.selective_blur(x, 0.0, backend="triton"), rep),
        2 * n4, copy_bw, base)

    def fwd_bwd(fn):
        def run():
            xr = x.detach().requires_grad_(True)
            torch.autograd.grad(fn(xr), xr, gy)

        return run

    base = bench(fwd_bwd(slicing_selective_blur), rep)
    # ideal fused forward + backward: read x, write y; read x and g, write grad_in
    nb = 5 * n4
    row(case + " fwd+bwd", "torch slicing (eager)", base, nb, copy_bw, base)
    row(case + " fwd+bwd", "grouped F.conv2d", bench(fwd_bwd(conv_selective_blur), rep), nb, copy_bw, base)
    if K:
        row(case + " fwd+bwd", "kornia filter2d", bench(fwd_bwd(K["blur"]), rep), nb, copy_bw, base)
    row(case + " fwd+bwd", "torchfilters triton",
        bench(fwd_bwd(lambda t: tf.selective_blur(t, 0.0, backend="triton")), rep), nb, copy_bw, base)
    xr = x.detach().requires_grad_(True)
    y = tf.selective_blur(xr, 0.0, backend="triton")
    row(case + " bwd", "torchfilters triton", bench(lambda: torch.autograd.grad(y, xr, gy, retain_graph=True), rep),
        3 * n4, copy_bw)
    del x, gy, xr, y
    torch.cuda.empty_cache()

    # 3. Gaussian sigma = 2 (17 x 17 separable footprint)
    shape = (32, 3, 512, 512) if not quick else (8, 3, 256, 256)
    x = torch.randn(shape, device=device)
    nb = 2 * x.numel() * 4
    case = f"gaussian sigma=2 {tuple(shape)} f32"
    base = bench(lambda: conv_gaussian(x), rep)
    row(case, "grouped F.conv2d (2 passes)", base, nb, copy_bw)
    if K:
        row(case, "kornia gaussian_blur2d", bench(lambda: K["gauss"](x), rep), nb, copy_bw)
    row(case, "torchfilters triton", bench(lambda: tf.gaussian_filter(x, 2.0, backend="triton"), rep), nb, copy_bw)


def conv3d_sobel_magnitude(x):
    """Three grouped-free conv3d Sobel derivatives (replicate border) and their root."""
    s, d = torch.tensor([1.0, 2.0, 1.0]), torch.tensor([-1.0, 0.0, 1.0])
    ks = [torch.einsum("i,j,k->ijk", *(d if a == b else s for b in range(3))) for a in range(3)]
    w = torch.stack(ks)[:, None].to(x.device, x.dtype)
    xp = F.pad(x, (1, 1, 1, 1, 1, 1), mode="replicate")
    g = F.conv3d(xp, w)
    return torch.sqrt((g * g).sum(1, keepdim=True))


def conv3d_gaussian(x, sigma=2.0):
    from torchfilters import kernels

    r = kernels.gaussian_radius(sigma, 4.0)
    k = torch.tensor(kernels.gaussian_kernel1d(sigma, 0, r), dtype=x.dtype, device=x.device)
    y = F.conv3d(F.pad(x, (0, 0, 0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1, 1))
    y = F.conv3d(F.pad(y, (0, 0, r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1, 1))
    return F.conv3d(F.pad(y, (r, r, 0, 0, 0, 0), mode="replicate"), k.view(1, 1, 1, 1, -1))


def unfold_median3(x):
    xp = F.pad(x, (1, 1, 1, 1), mode="replicate")
    return xp.unfold(2, 3, 1).unfold(3, 3, 1).reshape(*x.shape, 9).median(-1).values


def more_timings(device, quick, rep, copy_bw):
    """The N-D filters' cases (issue 11: >= 60 % of copy bandwidth for the 3-D Sobel magnitude
    and the 3-D Gaussian), the 2-D Gaussian shapes of the static model, rank filters and Canny."""
    ax3 = (-3, -2, -1)

    def case(label, shape, fn, base=None, base_label="", dtype=torch.float32, nbytes=None):
        x = torch.randn(shape, device=device, dtype=dtype)
        nb = nbytes(x) if nbytes else 2 * x.numel() * x.element_size()
        b = None
        if base is not None:
            b = bench(lambda: base(x), rep)
            row(f"{label} {tuple(shape)}", base_label, b, nb, copy_bw, b)
        row(f"{label} {tuple(shape)}", "torchfilters triton", bench(lambda: fn(x), rep), nb, copy_bw, b)
        del x
        torch.cuda.empty_cache()

    s3 = (2, 1, 128, 128, 128) if not quick else (1, 1, 64, 64, 64)
    g3 = (1, 1, 192, 192, 192) if not quick else (1, 1, 96, 96, 96)
    case("3-D sobel magnitude", s3, lambda x: tf.gradient_magnitude(x, operator="sobel", axes=ax3, backend="triton"),
         conv3d_sobel_magnitude, "F.conv3d x3 + sqrt")
    case("3-D sobel magnitude fwd+bwd", s3,
         lambda x: _fwd_bwd(x, lambda t: tf.gradient_magnitude(t, operator="sobel", axes=ax3, backend="triton")),
         nbytes=lambda x: 5 * x.numel() * 4)
    case("3-D gaussian s=2", g3, lambda x: tf.gaussian_filter(x, 2.0, axes=ax3, backend="triton"),
         conv3d_gaussian, "F.conv3d x3 (1-D kernels)")
    case("3-D laplace", (64, 64, 64, 64), lambda x: tf.laplace(x, axes=(-3, -2, -1), backend="triton"))
    case("uniform_filter 5", (64, 64, 64, 64), lambda x: tf.uniform_filter(x, 5, backend="triton"))
    case("gaussian s=2 (28x28 planes)", (200, 128, 28, 28), lambda x: tf.gaussian_filter(x, 2.0, backend="triton"))
    case("gaussian s=2", (1, 1, 4096, 4096), lambda x: tf.gaussian_filter(x, 2.0, backend="triton"))
    case("gaussian_laplace s=2", (1, 1, 4096, 4096), lambda x: tf.gaussian_laplace(x, 2.0, backend="triton"))
    case("sobel magnitude", (1, 1, 4096, 4096), lambda x: tf.gradient_magnitude(x, operator="sobel", backend="triton"))
    case("median 3x3", (64, 3, 256, 256), lambda x: tf.median_filter(x, 3, backend="triton"),
         unfold_median3, "unfold + median")
    case("median 5x5", (16, 3, 256, 256), lambda x: tf.median_filter(x, 5, backend="triton"))
    case("canny s=1", (16, 1, 512, 512), lambda x: tf.canny(x, 1.0, 0.1, 0.2, backend="triton"),
         nbytes=lambda x: x.numel() * 5)


def _fwd_bwd(x, fn):
    xr = x.detach().requires_grad_(True)
    y = fn(xr)
    return torch.autograd.grad(y, xr, y)


# ---------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes and shorter timing")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check (see gpu_check.py)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA device: nothing to benchmark (benchmarks/gpu_check.py --compile-only checks that the "
              "kernels compile).")
        return 0
    T = backends.get("triton")
    if T is None or not T.available(torch.device("cuda"), torch.float32):
        print("The Triton engine cannot run here (is triton installed? is TRITON_INTERPRET set?).")
        return 0
    device = torch.device("cuda")
    t0 = time.time()
    if not args.no_check:
        print("correctness: Triton vs reference engine, forward and backward ...", flush=True)
        failures = check_correctness(device, args.quick)
        if failures:
            print(f"{len(failures)} MISMATCHES -- not timing:")
            for f in failures:
                print("  " + f)
            return 1
        print(f"  all match ({time.time() - t0:.0f} s, including kernel compilation)")
    timings(device, args.quick)
    print(f"\ndone in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
