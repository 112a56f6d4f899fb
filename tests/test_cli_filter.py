"""``torchfilters filter OP``: every public op from the command line, its options typed from its
signature, results equal to the API's, and bad values as usage errors naming the option."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import torchfilters
from torchfilters import cli, functional

iio = pytest.importorskip("imageio.v3")


def _gray(path, shape=(12, 15), seed=0):
    img = np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
    iio.imwrite(path, img)
    return torch.from_numpy(img.astype(np.float32) / 255)


def _run(tmp_path, op, src, *opts, fmt="npy"):
    out = tmp_path / "o"
    rc = cli.main(["filter", op, str(src), *opts, "-o", str(out), "-f", fmt, "-q"])
    assert rc == 0
    name = f"{src.stem}_{op}.{fmt}"
    return np.load(out / name) if fmt == "npy" else (torch.load(out / name, weights_only=True) if fmt == "pt"
                                                     else iio.imread(out / name))


VOL = np.random.default_rng(1).random((4, 5, 6)).astype(np.float32)
K3 = np.array([[1.0, 2.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.5, 2.0]])

CASES = [
    ("gaussian_filter", ["--sigma", "2", "--mode", "nearest"], dict(sigma=2.0, mode="nearest")),
    ("gaussian_filter", ["--sigma", "1,0.5", "--order", "0,1", "--truncate", "3"],
     dict(sigma=(1.0, 0.5), order=(0, 1), truncate=3.0)),
    ("gaussian_filter", ["--sigma", "1", "--radius", "2,3", "--mode", "constant", "--cval", "0.5"],
     dict(sigma=1.0, radius=(2, 3), mode="constant", cval=0.5)),
    ("correlate", ["--weights", "1,2,1;0,1,0;-1,0.5,2"], dict(weights=K3)),
    ("correlate", ["--weights", "[[1, 2, 1], [0, 1, 0], [-1, 0.5, 2]]", "--origin", "-1,0"], dict(weights=K3, origin=(-1, 0))),
    ("convolve", ["--weights", "1,2,1;0,1,0;-1,0.5,2", "--mode", "mirror"], dict(weights=K3, mode="mirror")),
    ("correlate1d", ["--weights", "1,-2,3", "--axis", "-2"], dict(weights=[1.0, -2.0, 3.0], axis=-2)),
    ("convolve1d", ["--weights", "1,-2,3,4"], dict(weights=[1.0, -2.0, 3.0, 4.0])),
    ("uniform_filter", ["--size", "3,4"], dict(size=(3, 4))),
    ("uniform_filter1d", ["--size", "4", "--axis", "0", "--origin", "1"], dict(size=4, axis=0, origin=1)),
    ("derivative", ["--axis", "-2", "--operator", "sobel", "--normalized"],
     dict(axis=-2, operator="sobel", normalized=True)),
    ("gradient", ["--operator", "scharr"], dict(operator="scharr")),
    ("gradient_magnitude", ["--mode", "wrap"], dict(mode="wrap")),
    ("gradient_direction", [], {}),
    ("sobel", ["--axis", "0"], dict(axis=0)),
    ("prewitt", [], {}),
    ("scharr", ["--mode", "grid-wrap"], dict(mode="grid-wrap")),
    ("laplace", ["--mode", "wrap,nearest"], dict(mode=("wrap", "nearest"))),
    ("gaussian_filter1d", ["--sigma", "1.5", "--order", "1", "--axis", "-2"], dict(sigma=1.5, order=1, axis=-2)),
    ("gaussian_gradient_magnitude", ["--sigma", "1", "--backend", "reference"], dict(sigma=1.0, backend="reference")),
    ("gaussian_laplace", ["--sigma", "1.5,1"], dict(sigma=(1.5, 1.0))),
    ("selective_blur", ["--threshold", "0.5", "--keep-border"], dict(threshold=0.5, keep_border=True)),
    ("selective_blur", ["--sigma", "1", "--normalized", "--no-keep-border"], dict(sigma=1.0, normalized=True)),
]


@pytest.mark.parametrize("op, opts, kwargs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_filter_op_equals_the_api(tmp_path, op, opts, kwargs):
    x = _gray(tmp_path / "im.png")
    got = _run(tmp_path, op, tmp_path / "im.png", *opts)
    want = getattr(torchfilters, op)(x, **kwargs)
    assert got.shape == tuple(want.shape)
    torch.testing.assert_close(torch.from_numpy(got), want)


def test_volume_over_three_axes_with_per_axis_options(tmp_path):
    np.save(tmp_path / "vol.npy", VOL)
    got = _run(tmp_path, "gaussian_filter", tmp_path / "vol.npy", "--sigma", "1,2,0.5", "--axes", "-3,-2,-1",
               "--mode", "wrap,reflect,nearest")
    want = torchfilters.gaussian_filter(torch.from_numpy(VOL), (1.0, 2.0, 0.5), axes=(-3, -2, -1),
                                        mode=("wrap", "reflect", "nearest"))
    torch.testing.assert_close(torch.from_numpy(got), want)
    got = _run(tmp_path, "gradient_magnitude", tmp_path / "vol.npy", "--axes", "0,2", fmt="pt")
    torch.testing.assert_close(got, torchfilters.gradient_magnitude(torch.from_numpy(VOL), axes=(0, 2)))


def test_weights_and_mask_from_files(tmp_path):
    x = _gray(tmp_path / "im.png", seed=3)
    np.save(tmp_path / "k.npy", K3)
    torch.save(torch.from_numpy(K3[::-1].copy()), tmp_path / "k.pt")
    got = _run(tmp_path, "correlate", tmp_path / "im.png", "--weights", str(tmp_path / "k.npy"))
    torch.testing.assert_close(torch.from_numpy(got), torchfilters.correlate(x, K3))
    got = _run(tmp_path, "convolve", tmp_path / "im.png", "--weights", str(tmp_path / "k.pt"))
    torch.testing.assert_close(torch.from_numpy(got), torchfilters.convolve(x, K3[::-1].copy()))
    mask = np.random.default_rng(4).random(x.shape) > 0.5
    np.save(tmp_path / "m.npy", mask)  # a mask is bool by nature: here bool is what the API wants
    got = _run(tmp_path, "selective_blur", tmp_path / "im.png", "--mask", str(tmp_path / "m.npy"), "--normalized")
    want = torchfilters.selective_blur(x, mask=torch.from_numpy(mask), normalized=True)
    torch.testing.assert_close(torch.from_numpy(got), want)


def test_png_output_of_signed_results_puts_zero_at_mid_gray(tmp_path):
    ramp = np.tile(np.linspace(0, 255, 16).astype(np.uint8), (8, 1))
    ramp[:, 8:] = ramp[:, 8:][:, ::-1]  # up then down: derivatives of both signs
    iio.imwrite(tmp_path / "r.png", ramp)
    png = _run(tmp_path, "derivative", tmp_path / "r.png", fmt="png")
    d = torchfilters.derivative(torch.from_numpy(ramp.astype(np.float32) / 255))
    m = float(d.abs().max())
    want = torch.round((d + m) / (2 * m) * 255).to(torch.uint8).numpy()
    assert np.abs(png.astype(int) - want.astype(int)).max() <= 1
    assert png.max() == 255 or png.min() == 0  # the largest |derivative| is white or black


def test_results_without_a_png_form_say_which_format_to_use(tmp_path, capsys):
    _gray(tmp_path / "im.png")
    rc = cli.main(["filter", "gradient", str(tmp_path / "im.png"), "-o", str(tmp_path / "o")])
    assert rc == 1
    err = capsys.readouterr().err
    assert "cannot write a PNG of a result of shape (2, 12, 15)" in err and "--format npy" in err


@pytest.mark.parametrize("name", functional.__all__)
def test_every_public_op_has_its_parameters_as_options(name, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["filter", name, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for p in inspect.signature(getattr(functional, name)).parameters:
        if p not in ("input", "out"):
            assert f"--{p.replace('_', '-')}" in text, (name, p)
    # in the command line's words: a sequence is comma-separated (found by a fresh user)
    assert "a sequence, NumPy array or tensor" not in " ".join(text.split()), name


def test_filter_help_lists_every_op(capsys):
    with pytest.raises(SystemExit):
        cli.main(["filter", "--help"])
    text = capsys.readouterr().out
    for name in functional.__all__:
        assert name in text


@pytest.mark.parametrize(
    "argv, where",
    [
        (["gaussian_filter", "--sigma", "-1"], "argument --sigma: sigma must be finite and >= 0"),
        (["gaussian_filter", "--sigma", "abc"], "argument --sigma: expected a number or comma-separated numbers"),
        (["gaussian_filter"], "the following arguments are required: --sigma"),
        (["gaussian_filter", "--sigma", "1", "--mode", "replicate"], "use mode='nearest'"),
        (["gaussian_filter", "--sigma", "1", "--order", "1.5"], "argument --order: expected an integer"),
        (["gaussian_filter", "--sigma", "1,2,3"], "argument --sigma"),
        # (an error names the one option given that it mentions; none when it mentions several given,
        # or none given: found by review, --truncate was named)
        (["gaussian_filter", "--sigma", "1e9"], "error: argument --sigma: sigma=(1000000000.0, 1000000000.0)"),
        (["gaussian_filter", "--sigma", "1", "--truncate", "1e12"], "error: sigma=(1.0, 1.0) with truncate=1000000000000.0"),
        (["difference_of_gaussians", "--low-sigma", "1e9"], "error: sigma=(1000000000.0"),
        (["gradient_magnitude", "--operator", "laplace"], "argument --operator: invalid choice"),
        (["gradient_magnitude", "--axes", "0,0"], "argument --axes"),
        (["correlate", "--weights", "[1, 2]"], "argument --weights: weights must be 2-D"),
        (["correlate", "--weights", "1,x"], "argument --weights: expected a .npy/.pt file or numbers"),
        (["correlate", "--weights", "missing.npy"], "argument --weights: missing.npy: no such file"),
        (["selective_blur", "--threshold", "nan"], "argument --threshold"),
        # (a scalar option is not offered per axis: found by a README walk)
        (["selective_blur", "--threshold", "0.5,0.2"], "argument --threshold: expected a number, got '0.5,0.2'"),
        (["uniform_filter", "--size", "0"], "argument --size"),
        (["bilateral_filter"], "invalid choice: 'bilateral_filter'"),
        ([], "the following arguments are required: OP"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(tmp_path, capsys, argv, where):
    with pytest.raises(SystemExit) as exc:
        cli.main(["filter", *argv, "-o", str(tmp_path / "never")] if argv else ["filter"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and where in err, err
    assert not (tmp_path / "never").exists()


def test_an_op_added_to_functional_all_appears_without_a_cli_change(tmp_path, monkeypatch):
    def bilateral_filter(input, size=3, *, mode: str = "reflect", cval: float = 0.0, axes=None, out=None,
                         backend=None):
        """Bilateral filter (a stand-in: the box mean, so the result is checkable).

        Args:
            input: the images.
            size: the window's size per axis.
        """
        return torchfilters.uniform_filter(input, size, mode=mode, cval=cval, axes=axes, out=out, backend=backend)

    monkeypatch.setattr(functional, "bilateral_filter", bilateral_filter, raising=False)
    monkeypatch.setattr(functional, "__all__", [*functional.__all__, "bilateral_filter"])
    x = _gray(tmp_path / "photo.png", seed=5)
    got = _run(tmp_path, "bilateral_filter", tmp_path / "photo.png", "--size", "5", "--mode", "nearest")
    torch.testing.assert_close(torch.from_numpy(got), torchfilters.uniform_filter(x, 5, mode="nearest"))


@pytest.mark.parametrize("argv, usage", [
    (["blur", "x.png", "--sigmaa", "2"], "usage: torchfilters blur"),
    (["filter", "gaussian_filter", "--sigma", "2", "--foo", "1", "x.npy"], "usage: torchfilters filter gaussian_filter"),
    (["edges", "--operater", "sobel", "x.png"], "usage: torchfilters edges"),
])
def test_an_unknown_option_shows_its_subcommands_usage(argv, usage, capsys):
    """Found by the walkthrough: unknown options printed the top-level usage."""
    from torchfilters.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert usage in err and "unrecognized arguments" in err
