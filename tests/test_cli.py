"""Tests of the ``torchfilters`` command line (``torchfilters.cli.main``), in-process."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torchfilters
from torchfilters import cli

iio = pytest.importorskip("imageio.v3")
pytest.importorskip("skimage")
pytest.importorskip("tqdm")


# ---------------------------------------------------------------- helpers


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _gray_png(path, shape=(17, 23), seed=0):
    img = _rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
    iio.imwrite(path, img)
    return img


def _rgb_png(path, shape=(13, 19, 3), seed=1):
    img = _rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
    iio.imwrite(path, img)
    return img


def _as_chw(img: np.ndarray) -> torch.Tensor:
    """What the CLI makes of a uint8 image: (C, H, W) float32 in [0, 1]."""
    x = torch.from_numpy(img.astype(np.float32) / 255)
    return x.unsqueeze(0) if x.dim() == 2 else x.permute(2, 0, 1).contiguous()


def _edges(x, **kw):
    kw = {"operator": "sobel", "mode": "reflect", "cval": 0.0, **kw}
    return torchfilters.gradient_magnitude(x, **kw)


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "error" in line]


# ---------------------------------------------------------------- edges on files


def test_edges_gray_and_colour_png_match_gradient_magnitude(tmp_path):
    gray = _gray_png(tmp_path / "gray.png")
    rgb = _rgb_png(tmp_path / "rgb.png")
    out = tmp_path / "out"
    rc = cli.main(["edges", str(tmp_path / "gray.png"), str(tmp_path / "rgb.png"),
                   "--out", str(out), "--format", "npy"])
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["gray_edges.npy", "rgb_edges.npy"]

    g = np.load(out / "gray_edges.npy")
    assert g.shape == gray.shape and g.dtype == np.float32
    torch.testing.assert_close(torch.from_numpy(g), _edges(_as_chw(gray))[0])

    c = np.load(out / "rgb_edges.npy")
    assert c.shape == (3, 13, 19)  # channels first, each channel filtered on its own
    torch.testing.assert_close(torch.from_numpy(c), _edges(_as_chw(rgb)))


@pytest.mark.parametrize("operator", ["central", "scharr"])
@pytest.mark.parametrize("mode", ["constant", "wrap"])
def test_edges_options_are_passed_through(tmp_path, operator, mode):
    img = _gray_png(tmp_path / "im.png", shape=(9, 11))
    rc = cli.main(["edges", str(tmp_path / "im.png"), "--operator", operator, "--mode", mode,
                   "--cval", "0.25", "--out", str(tmp_path), "-f", "pt", "-q"])
    assert rc == 0
    got = torch.load(tmp_path / "im_edges.pt", weights_only=True)
    want = _edges(_as_chw(img), operator=operator, mode=mode, cval=0.25)[0]
    torch.testing.assert_close(got, want)


def test_edges_png_output_is_scaled_to_its_maximum(tmp_path):
    rgb = _rgb_png(tmp_path / "rgb.png")
    _gray_png(tmp_path / "gray.png")
    rc = cli.main(["edges", str(tmp_path / "rgb.png"), str(tmp_path / "gray.png"),
                   "--out", str(tmp_path / "o")])
    assert rc == 0
    png = iio.imread(tmp_path / "o" / "rgb_edges.png")
    assert png.shape == rgb.shape and png.dtype == np.uint8
    y = _edges(_as_chw(rgb)).permute(1, 2, 0)
    want = torch.round(y / y.max() * 255).numpy()
    assert np.abs(png.astype(np.float64) - want).max() <= 1
    assert png.max() == 255
    assert iio.imread(tmp_path / "o" / "gray_edges.png").shape == (17, 23)


def test_flat_image_gives_black_png(tmp_path):
    iio.imwrite(tmp_path / "flat.png", np.full((8, 8), 77, np.uint8))
    assert cli.main(["edges", str(tmp_path / "flat.png"), "--out", str(tmp_path)]) == 0
    png = iio.imread(tmp_path / "flat_edges.png")
    assert png.shape == (8, 8) and not png.any()


def test_alpha_channel_is_dropped(tmp_path):
    rgba = _rng(3).integers(0, 256, size=(10, 12, 4), dtype=np.uint8)
    iio.imwrite(tmp_path / "logo.png", rgba)
    assert cli.main(["edges", str(tmp_path / "logo.png"), "--out", str(tmp_path), "-f", "npy"]) == 0
    got = np.load(tmp_path / "logo_edges.npy")
    torch.testing.assert_close(torch.from_numpy(got), _edges(_as_chw(rgba[..., :3])))


def test_tiff_input(tmp_path):
    img = _rng(4).integers(0, 65536, size=(12, 14), dtype=np.uint16)
    iio.imwrite(tmp_path / "scan.tif", img)
    assert cli.main(["edges", str(tmp_path / "scan.tif"), "--out", str(tmp_path), "-f", "npy"]) == 0
    x = torch.from_numpy(img.astype(np.float32) / 65535)[None]
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "scan_edges.npy")), _edges(x)[0])


# ---------------------------------------------------------------- tensors


@pytest.mark.parametrize("shape", [(6, 7), (2, 6, 7)])
def test_npy_and_pt_inputs_keep_their_shape(tmp_path, shape):
    a = _rng(5).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "arr.npy", a)
    t = torch.from_numpy(_rng(6).standard_normal(shape)).to(torch.float64)
    torch.save(t, tmp_path / "ten.pt")
    out = tmp_path / "out"
    rc = cli.main(["edges", str(tmp_path / "arr.npy"), str(tmp_path / "ten.pt"),
                   "--out", str(out), "--format", "pt"])
    assert rc == 0
    got_a = torch.load(out / "arr_edges.pt", weights_only=True)
    got_t = torch.load(out / "ten_edges.pt", weights_only=True)
    assert got_a.shape == shape and got_a.dtype == torch.float32
    assert got_t.shape == shape and got_t.dtype == torch.float64  # raw values, dtype kept
    torch.testing.assert_close(got_a, _edges(torch.from_numpy(a)))
    torch.testing.assert_close(got_t, _edges(t))


def test_integer_npy_is_promoted_not_scaled(tmp_path):
    a = np.array([[1, 2, 3, 4, 4, 3, 2, 1]] * 3, dtype=np.uint8)
    np.save(tmp_path / "ints.npy", a)
    assert cli.main(["edges", str(tmp_path / "ints.npy"), "--operator", "central",
                     "--out", str(tmp_path), "-f", "npy"]) == 0
    got = np.load(tmp_path / "ints_edges.npy")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got[1], [1, 2, 2, 1, 1, 2, 2, 1])


def test_same_stem_gives_distinct_names(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((4, 4), np.float32))
    torch.save(torch.ones(4, 4), tmp_path / "a.pt")
    assert cli.main(["edges", str(tmp_path), "--out", str(tmp_path / "o"), "-f", "npy"]) == 0
    assert len(list((tmp_path / "o").iterdir())) == 2


# ---------------------------------------------------------------- folders, samples


def test_folder_input_is_sorted_and_non_recursive(tmp_path):
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    _gray_png(src / "b.png")
    np.save(src / "a.npy", np.zeros((5, 5), np.float32))
    torch.save(torch.zeros(5, 5), src / "c.pt")
    (src / "notes.txt").write_text("not an image")
    _gray_png(src / "sub" / "deep.png")
    out = tmp_path / "out"
    assert cli.main(["edges", str(src), "--out", str(out), "-f", "npy", "-q"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a_edges.npy", "b_edges.npy", "c_edges.npy"]


def test_no_input_runs_on_sample_images(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli.inputs, "SAMPLE_IMAGES", ("camera", "astronaut", "checkerboard"))
    out = tmp_path / "demo"
    assert cli.main(["edges", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["astronaut_edges.png", "camera_edges.png", "checkerboard_edges.png"]
    assert iio.imread(out / "astronaut_edges.png").shape == (512, 512, 3)
    cam = iio.imread(out / "camera_edges.png")
    assert cam.shape == (512, 512) and cam.max() == 255
    assert "wrote 3 file(s)" in capsys.readouterr().err


def test_every_default_sample_image_is_bundled():
    import skimage.data

    assert len(cli.SAMPLE_IMAGES) >= 3
    for name in cli.SAMPLE_IMAGES:
        img = np.asarray(getattr(skimage.data, name)())  # no network: bundled files only
        assert img.ndim in (2, 3), name


def test_a_foreign_mode_name_gets_the_scipy_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["edges", "--mode", "replicate", "--out", str(tmp_path / "never")])
    assert exc.value.code == 2
    assert "use mode='nearest' for the same boundary" in capsys.readouterr().err


# ---------------------------------------------------------------- blur


@pytest.mark.parametrize(
    "opts, kwargs",
    [
        ([], {}),
        (["--threshold", "0.5", "--keep-border"], {"threshold": 0.5, "keep_border": True}),
        (["-t", "0.3", "--sigma", "1.5", "--normalized", "--mode", "nearest"],
         {"threshold": 0.3, "sigma": 1.5, "normalized": True, "mode": "nearest"}),
        (["--sigma", "0"], {"sigma": 0.0}),  # as the API: the pixels are kept
    ],
)
def test_blur_matches_selective_blur(tmp_path, opts, kwargs):
    rgb = _rgb_png(tmp_path / "rgb.png")
    rc = cli.main(["blur", str(tmp_path / "rgb.png"), "--out", str(tmp_path), "-f", "npy", *opts])
    assert rc == 0
    got = np.load(tmp_path / "rgb_blur.npy")
    threshold = kwargs.pop("threshold", 0.0)
    want = torchfilters.selective_blur(_as_chw(rgb), threshold, **kwargs)
    torch.testing.assert_close(torch.from_numpy(got), want)


def test_blur_png_keeps_image_brightness(tmp_path):
    iio.imwrite(tmp_path / "flat.png", np.full((6, 9, 3), 200, np.uint8))
    assert cli.main(["blur", str(tmp_path / "flat.png"), "--out", str(tmp_path)]) == 0
    png = iio.imread(tmp_path / "flat_blur.png")
    assert png.shape == (6, 9, 3) and (png == 200).all()


# ---------------------------------------------------------------- errors


def test_missing_file_is_reported_and_others_still_written(tmp_path, capsys):
    _gray_png(tmp_path / "ok.png")
    missing = tmp_path / "photo.png"
    rc = cli.main(["edges", str(missing), str(tmp_path / "ok.png"), "--out", str(tmp_path / "o")])
    assert rc == 1
    errors = _err_lines(capsys)
    assert len(errors) == 1
    assert str(missing) in errors[0] and errors[0].startswith("torchfilters: error:")
    assert (tmp_path / "o" / "ok_edges.png").exists()


def test_unreadable_and_wrong_rank_inputs(tmp_path, capsys):
    (tmp_path / "junk.png").write_bytes(b"this is not a png")
    np.save(tmp_path / "vol.npy", np.zeros((2, 3, 4, 5), np.float32))
    np.save(tmp_path / "line.npy", np.zeros(5, np.float32))
    torch.save({"weights": torch.zeros(3, 3)}, tmp_path / "dict.pt")
    (tmp_path / "trunc.pt").write_bytes(b"\x80\x02garbage")
    np.save(tmp_path / "good.npy", np.ones((4, 4), np.float32))
    out = tmp_path / "o"
    rc = cli.main(["edges", str(tmp_path), "--out", str(out), "-f", "npy"])
    assert rc == 1
    errors = _err_lines(capsys)
    assert len(errors) == 5, errors
    for name in ["junk.png", "vol.npy", "line.npy", "dict.pt", "trunc.pt"]:
        (line,) = [e for e in errors if name in e]
        assert line.startswith("torchfilters: error:")
    (rank,) = [e for e in errors if "vol.npy" in e]
    assert "(2, 3, 4, 5)" in rank and "(C, H, W)" in rank
    assert [p.name for p in out.iterdir()] == ["good_edges.npy"]


def test_png_with_unsupported_channel_count(tmp_path, capsys):
    np.save(tmp_path / "two.npy", np.ones((2, 4, 4), np.float32))
    assert cli.main(["edges", str(tmp_path / "two.npy"), "--out", str(tmp_path)]) == 1
    (line,) = _err_lines(capsys)
    assert "two.npy" in line and "--format npy" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["edges", "--mode", "replicate"],
        ["edges", "--operator", "laplace"],
        ["edges", "--format", "jpg"],
        ["blur", "--sigma", "-1"],
        ["blur", "--sigma", "-0.5"],
        ["blur", "--sigma", "nan"],
        ["blur", "--threshold", "abc"],
        ["frobnicate"],
        [],
    ],
)
def test_bad_options_are_usage_errors(tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--out", str(tmp_path / "never")] if argv[:1] in (["edges"], ["blur"]) else argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_missing_dependency_message(tmp_path, monkeypatch, capsys):
    _gray_png(tmp_path / "ok.png")
    monkeypatch.setitem(sys.modules, "imageio", None)
    monkeypatch.setitem(sys.modules, "imageio.v3", None)
    rc = cli.main(["edges", str(tmp_path / "ok.png"), "--out", str(tmp_path)])
    assert rc == 1
    assert "pip install 'torchfilters[cli]'" in capsys.readouterr().err


def test_progress_bar_only_for_several_inputs(tmp_path, monkeypatch, capsys):
    for i in range(3):
        np.save(tmp_path / f"x{i}.npy", np.ones((4, 4), np.float32))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert cli.main(["edges", str(tmp_path), "--out", str(tmp_path / "o"), "-f", "npy"]) == 0
    assert "3/3" in capsys.readouterr().err
    assert cli.main(["edges", str(tmp_path / "x0.npy"), "--out", str(tmp_path / "o"), "-f", "npy"]) == 0
    assert "1/1" not in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("torchfilters ") and out.strip() != "torchfilters"


def test_help_mentions_every_option(capsys):
    for cmd, opts in [("edges", ["--operator", "--mode", "--cval", "--out", "--format"]),
                      ("blur", ["--threshold", "--sigma", "--normalized", "--keep-border"])]:
        with pytest.raises(SystemExit):
            cli.main([cmd, "--help"])
        text = capsys.readouterr().out
        for opt in opts:
            assert opt in text


def test_python_dash_m(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((4, 4), np.float32))
    proc = subprocess.run(
        [sys.executable, "-m", "torchfilters", "edges", str(tmp_path / "a.npy"),
         "--out", str(tmp_path / "o"), "-f", "npy"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "o" / "a_edges.npy").exists()


def test_choices_match_the_library():
    # The CLI lists the names itself (so `--help` needs no torch import); keep them in sync.
    from torchfilters import _validate, kernels

    assert set(cli.MODES) == set(_validate.MODES)
    assert set(cli.OPERATORS) == set(kernels.OPERATORS)
    for mode in cli.MODES:
        torchfilters.gradient_magnitude(torch.zeros(3, 3), mode=mode)


#: runs the console script's launcher in a child that gets a SIGINT (a Ctrl-C during the 1-2 s of
#: start-up, deterministically) when the import of ``{module}`` starts, signals as at a terminal
_INTERRUPTED_IMPORT = """
import importlib.abc, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Finder())
import _torchfilters_cli
sys.exit(_torchfilters_cli.main())
"""


@pytest.mark.parametrize("module", ["torch", "numpy._core.multiarray", "torchfilters.cli.app"])
def test_ctrl_c_during_start_up_is_one_line_and_status_130(tmp_path, module):
    """Also where torch imports NumPy from C (``numpy._core.multiarray``): torch swallowed the
    KeyboardInterrupt there, and the run went on (status 0, files written) or failed strangely."""
    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT.format(module=module), "edges", "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (130, "torchfilters: interrupted\n")
    assert not (tmp_path / "o").exists()


def test_an_interrupted_run_ends_at_once(monkeypatch):
    """The launcher ends a run that returned 130 / 143 with ``os._exit`` (not after a kernel that
    a background thread is compiling); other statuses go back to ``sys.exit``."""
    import _torchfilters_cli

    from torchfilters.cli import app

    class Exited(Exception):
        pass

    def fake_exit(status):
        raise Exited(status)

    monkeypatch.setattr(os, "_exit", fake_exit)
    for status in (130, 143):
        monkeypatch.setattr(app, "main", lambda status=status: status)
        with pytest.raises(Exited) as exc:
            _torchfilters_cli.main()
        assert exc.value.args == (status,)
    monkeypatch.setattr(app, "main", lambda: 1)
    assert _torchfilters_cli.main() == 1


@pytest.mark.parametrize("stdout, status, err", [("closed pipe", 141, ""),
                                                 ("/dev/full", 1, "torchfilters: error: stdout: No space left on device\n"),
                                                 ("closed", 0, "")])
def test_version_to_a_closed_pipe_a_full_disk_or_no_stdout(stdout, status, err):
    if stdout == "/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    w = None
    if stdout == "closed pipe":
        r, w = os.pipe()
        os.close(r)
    elif stdout == "/dev/full":
        w = os.open("/dev/full", os.O_WRONLY)
    try:
        proc = subprocess.run([sys.executable, "-c", "import sys, _torchfilters_cli; sys.exit(_torchfilters_cli.main())",
                               "--version"], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120,
                              preexec_fn=(lambda: os.close(1)) if w is None else None)
    finally:
        if w is not None:
            os.close(w)
    assert (proc.returncode, proc.stderr) == (status, err)


def test_version_imports_no_torch():
    """``torchfilters --version`` reads the installed version without importing the library
    (0.1 s, not torch's 1-2 s)."""
    from importlib.metadata import version

    code = ("import sys, _torchfilters_cli; sys.argv = ['torchfilters', '--version']; "
            "rc = _torchfilters_cli.main(); print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout == f"torchfilters {version('torchfilters')}\n0 False\n", proc.stderr


@pytest.mark.parametrize("argv, status", [(["--help"], 0), (["-h"], 0), ([], 2)])
def test_top_level_help_and_usage_import_no_torch(argv, status):
    """``torchfilters --help`` (and a bare ``torchfilters``: the usage error) prints the parser's
    text without importing the library (0.1 s, not torch's 2-3 s), the same text as from the
    imported library's parser."""
    # (then, in the same process, the library: not the bare package the help was printed with)
    code = (f"import sys, _torchfilters_cli; sys.argv = ['torchfilters'] + {argv!r}; "
            "rc = _torchfilters_cli.main(); print(rc, 'torch' in sys.modules); "
            "import torchfilters; from torchfilters import gaussian_filter; print(torchfilters.sobel.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    want = subprocess.run([sys.executable, "-m", "torchfilters", *argv], capture_output=True, text=True, timeout=300)
    assert want.returncode == status
    assert (proc.stdout, proc.stderr) == (want.stdout + f"{status} False\nsobel\n", want.stderr)
    assert "COMMAND" in (want.stdout if status == 0 else want.stderr)


def test_an_os_error_at_start_up_is_not_called_a_stdout_failure():
    """A shared library torch cannot load (an OSError of its import) is that error's traceback,
    not ``error: stdout: ...`` with the traceback lost (found by a review)."""
    code = """
import importlib.abc, sys

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise OSError("libtorch_cpu.so: cannot open shared object file")
        return None

sys.meta_path.insert(0, Finder())
import _torchfilters_cli
sys.exit(_torchfilters_cli.main())
"""
    proc = subprocess.run([sys.executable, "-c", code, "edges"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "stdout:" not in proc.stderr
    assert proc.stderr.rstrip().endswith("OSError: libtorch_cpu.so: cannot open shared object file"), proc.stderr
