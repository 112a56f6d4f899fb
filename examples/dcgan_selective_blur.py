"""A small DCGAN whose generator ends in ``torchfilters.selective_blur`` (issue 3, section e).

The generator's last layer smooths, with the 3x3 binomial kernel, only the
pixels that pass ``x >= 0`` -- the case that started the project, where a
per-pixel Python loop made ``backward()`` take over a minute.  Training data
are random 32x32 patches of scikit-image's bundled images (no download).

The script trains the same model twice from the same seed, once with
``torchfilters.selective_blur`` and once with the plain-PyTorch equivalent
(``F.conv2d`` with replicate padding -- SciPy's ``reflect`` for a 3x3 kernel --
then ``torch.where``), and prints the median time of a full training step
(generator and discriminator, forward and backward) for each.

    PYTHONPATH=src python examples/dcgan_selective_blur.py            # ~1 minute
    PYTHONPATH=src python examples/dcgan_selective_blur.py --steps 200 --batch 128
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchfilters as tf

PATCH = 32


def load_patches(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` random 32x32 grayscale patches in [-1, 1] from scikit-image's bundled images."""
    from skimage import color, data, util

    names = ["camera", "astronaut", "coins", "moon", "page", "text", "chelsea", "coffee", "clock", "horse",
             "rocket", "immunohistochemistry", "hubble_deep_field", "grass", "gravel", "brick"]
    images = []
    for name in names:
        try:
            img = getattr(data, name)()
        except Exception:  # an image that would need a download: skip it
            continue
        if img.ndim == 3:
            img = color.rgb2gray(img[..., :3])
        img = util.img_as_float32(img)
        if min(img.shape) >= 2 * PATCH:
            images.append(img)
    if not images:
        raise SystemExit("no bundled scikit-image images found")
    rng = np.random.default_rng(seed)
    out = np.empty((n, 1, PATCH, PATCH), np.float32)
    for i in range(n):
        img = images[rng.integers(len(images))]
        r = rng.integers(img.shape[0] - PATCH + 1)
        c = rng.integers(img.shape[1] - PATCH + 1)
        out[i, 0] = img[r:r + PATCH, c:c + PATCH]
    return torch.from_numpy(out * 2.0 - 1.0), len(images)


class BinomialBlurWhere(nn.Module):
    """The plain-PyTorch reference: blur everywhere with conv2d, keep it where x >= 0."""

    def __init__(self):
        super().__init__()
        k = torch.tensor([1.0, 2.0, 1.0])
        self.register_buffer("kernel", (k[:, None] * k[None, :] / 16.0)[None, None])

    def forward(self, x):
        c = x.shape[1]
        b = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), self.kernel.expand(c, 1, 3, 3), groups=c)
        return torch.where(x >= 0, b, x)


class SelectiveBlur(nn.Module):
    def forward(self, x):
        return tf.selective_blur(x, 0.0)


class Generator(nn.Module):
    def __init__(self, nz: int, ngf: int, blur: nn.Module):
        super().__init__()
        self.net = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),  # 4x4
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),  # 8x8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),  # 16x16
            nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False), nn.Tanh(),  # 32x32
        )
        self.blur = blur

    def forward(self, z):
        return self.blur(self.net(z))


class Discriminator(nn.Module):
    def __init__(self, ndf: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True),  # 16x16
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, True),  # 8x8
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2, True),
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),  # 1x1 logit
        )

    def forward(self, x):
        return self.net(x).flatten()


def train(blur: nn.Module, patches: torch.Tensor, args) -> tuple:
    torch.manual_seed(args.seed)
    G = Generator(args.nz, args.ngf, blur)
    D = Discriminator(args.ndf)
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    ones = torch.ones(args.batch)
    zeros = torch.zeros(args.batch)
    g = torch.Generator().manual_seed(args.seed)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        real = patches[torch.randint(len(patches), (args.batch,), generator=g)]
        z = torch.randn(args.batch, args.nz, 1, 1, generator=g)
        t0 = time.perf_counter()
        fake = G(z)
        loss_d = bce(D(real), ones) + bce(D(fake.detach()), zeros)
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
        loss_g = bce(D(fake), ones)
        opt_g.zero_grad(set_to_none=True)
        loss_g.backward()
        opt_g.step()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
        losses.append((loss_d.item(), loss_g.item()))
    return statistics.median(times), losses, G


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="timed training steps per variant")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--patches", type=int, default=4096)
    p.add_argument("--nz", type=int, default=64)
    p.add_argument("--ngf", type=int, default=32)
    p.add_argument("--ndf", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    patches, n_images = load_patches(args.patches, args.seed)
    print(f"{len(patches)} patches of {PATCH}x{PATCH} from {n_images} scikit-image images; batch {args.batch}, "
          f"{torch.get_num_threads()} threads")
    # the two blur layers agree (float32 rounding aside)
    x = torch.randn(8, 1, PATCH, PATCH)
    err = (SelectiveBlur()(x) - BinomialBlurWhere()(x)).abs().max().item()
    print(f"selective_blur vs conv2d + where on random data: max |difference| = {err:.2e}")

    rows = []
    for name, blur in (("torchfilters.selective_blur", SelectiveBlur()), ("conv2d + torch.where", BinomialBlurWhere())):
        t, losses, _ = train(blur, patches, args)
        rows.append((name, t))
        d, g = losses[-1]
        print(f"  {name:<30s} median step {t * 1e3:8.2f} ms   (last losses: D {d:.3f}, G {g:.3f})")
    (n1, t1), (n2, t2) = rows
    print(f"  -> training step with selective_blur: {t2 / t1:.2f}x the speed of conv2d + where "
          f"(conv2d + where takes {(t2 - t1) * 1e3:+.2f} ms more per step)")

    # the blur layer alone, forward + backward, on the generator's output shape
    y0 = torch.randn(args.batch, 1, PATCH, PATCH)
    gy = torch.randn_like(y0)
    layer = {}
    for name, blur in (("torchfilters.selective_blur", SelectiveBlur()), ("conv2d + torch.where", BinomialBlurWhere())):
        def step():
            y = y0.clone().requires_grad_()
            blur(y).backward(gy)
        for _ in range(20):
            step()
        ts = []
        for _ in range(200):
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
        layer[name] = statistics.median(ts)
        print(f"  blur layer alone, fwd+bwd ({args.batch}, 1, {PATCH}, {PATCH}): {name:<28s} {layer[name] * 1e6:8.1f} us")
    print(f"  -> blur layer: {layer['conv2d + torch.where'] / layer['torchfilters.selective_blur']:.2f}x faster "
          f"with selective_blur")


if __name__ == "__main__":
    main()
