"""The command line's inputs and outputs: all-or-nothing writes (exceptions, a full disk,
SIGINT/SIGTERM at several moments of a large write), one clear line per bad file, bool arrays
refused as the API refuses them, and the output naming rule for collisions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import torchfilters
from torchfilters import cli
from torchfilters.cli import outputs
from torchfilters.cli.common import DiskFull

iio = pytest.importorskip("imageio.v3")
pytest.importorskip("tqdm")

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _err_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "error:" in line]


def _strays(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith("."))


# ---------------------------------------------------------------- atomic writes, in-process


def test_write_atomic_renames_a_complete_file(tmp_path):
    target = tmp_path / "a.bin"
    size = outputs.write_atomic(target, lambda f: f.write(b"x" * 1000))
    assert size == 1000 and target.read_bytes() == b"x" * 1000
    assert _strays(tmp_path) == []
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # like open(): the umask, not 0600


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_write_atomic_leaves_nothing_on_failure(tmp_path, exc):
    target = tmp_path / "a.npy"
    target.write_bytes(b"old complete file")

    def write(f):
        f.write(b"partial" * 1000)
        raise exc

    expected = {RuntimeError: RuntimeError, KeyboardInterrupt: KeyboardInterrupt, OSError: DiskFull}[type(exc)]
    with pytest.raises(expected):
        outputs.write_atomic(target, write)
    assert target.read_bytes() == b"old complete file"  # the old file is untouched
    assert _strays(tmp_path) == []


def test_an_exception_while_writing_one_output_keeps_the_others(tmp_path, monkeypatch, capsys):
    for i in range(3):
        np.save(tmp_path / f"x{i}.npy", np.full((5, 6), i, np.float32))
    real = outputs.encode

    def encode(result, fmt, *a, **k):
        write = real(result, fmt, *a, **k)
        if float(result.abs().sum()) == 0 and result.numel() and torch.all(result == 0):  # x0: edges of a constant
            def broken(f):
                f.write(b"half a file")
                raise OSError(5, "Input/output error")
            return broken
        return write

    monkeypatch.setattr("torchfilters.cli.run.encode", encode)
    out = tmp_path / "o"
    rc = cli.main(["filter", "gaussian_filter", "--sigma", "1", str(tmp_path), "-o", str(out), "-f", "npy"])
    assert rc == 1
    (line,) = _err_lines(capsys)
    assert "x0.npy" in line and "cannot write x0_gaussian_filter.npy (input/output error)" in line
    assert sorted(p.name for p in out.iterdir()) == ["x1_gaussian_filter.npy", "x2_gaussian_filter.npy"]


# ---------------------------------------------------------------- a full disk (tmpfs)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 192 KiB tmpfs, or a skip saying why it cannot be mounted."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("fmt", ["npy", "png", "pt"])
def test_full_disk_leaves_only_complete_files(tmp_path, small_tmpfs, capsys, fmt):
    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(0)
    arrays = {f"im{i:02d}": rng.random((3, 64, 80)).astype(np.float32) for i in range(24)}  # 61 KiB as npy, 15 as png
    for name, a in arrays.items():
        np.save(src / f"{name}.npy", a)
    rc = cli.main(["edges", str(src), "--out", str(small_tmpfs), "-f", fmt])
    assert rc == 1
    err = capsys.readouterr().err
    names = sorted(p.name for p in small_tmpfs.iterdir())
    assert _strays(small_tmpfs) == [], names
    written = [n for n in names if n.endswith(f"_edges.{fmt}")]
    assert written == names and 0 < len(written) < len(arrays), names
    assert f"wrote {len(written)} file(s)" in err  # the summary counts complete files only
    assert "no space left on device" in err and "the disk is full; stopped" in err
    for n in written:  # every file under a final name is complete and right
        want = torchfilters.gradient_magnitude(torch.from_numpy(arrays[n.split("_")[0]]), operator="sobel")
        if fmt == "npy":
            torch.testing.assert_close(torch.from_numpy(np.load(small_tmpfs / n)), want)
        elif fmt == "pt":
            torch.testing.assert_close(torch.load(small_tmpfs / n, weights_only=True), want)
        else:
            assert iio.imread(small_tmpfs / n).shape == (64, 80, 3)


# ---------------------------------------------------------------- signals, in subprocesses

_DRIVER = """
import os, signal, sys, threading
import numpy as np
from torchfilters.cli import outputs
outputs.CHUNK = 1 << 20                     # 1 MiB writes: many moments to be killed at
moment, target = sys.argv[1], int(sys.argv[2])
calls = {"n": 0}
real_chunked, real_fsync, real_replace = outputs._write_chunked, os.fsync, os.replace

# the signals as a shell's foreground command gets them, whatever this process inherited (a run
# started as a background job of a non-interactive shell has SIGINT ignored: "int-mid-chunk"
# then wrote both files and returned 0)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)

def kill():  # to this thread, the main one (a signal to the process may go to another thread)
    sig = signal.SIGTERM if not moment.startswith("int") else signal.SIGINT
    signal.pthread_kill(threading.main_thread().ident, sig)

def chunked(f, data):                       # kill after `target` chunks of the big output
    big = len(data) > 2 * outputs.CHUNK
    for start in range(0, len(data), outputs.CHUNK):
        if big and moment.endswith("chunk") and calls["n"] == target:
            kill()
        calls["n"] += big
        f.write(data[start:start + outputs.CHUNK])

def fsync(fd):
    real_fsync(fd)
    if moment == "term-after-fsync" and os.fstat(fd).st_size > 2 * outputs.CHUNK:
        kill()                              # complete data, not yet renamed

outputs._write_chunked = chunked
outputs.os.fsync = fsync
from torchfilters.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _run_driver(tmp_path, moment, target, *argv, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", _DRIVER, moment, str(target), *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def big_input(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    a = np.random.default_rng(1).random((2, 1024, 1536)).astype(np.float32)  # a 12 MiB result
    np.save(d / "big.npy", a)
    np.save(d / "a_small.npy", a[:, :8, :8].copy())
    return d, a


@pytest.mark.parametrize("moment, target", [("term-first-chunk", 0), ("term-mid-chunk", 5), ("term-last-chunk", 11),
                                            ("term-after-fsync", 0), ("int-mid-chunk", 5)])
def test_a_signal_during_a_large_write_leaves_no_partial_file(tmp_path, big_input, moment, target):
    src, a = big_input
    out = tmp_path / "out"
    r = _run_driver(tmp_path, moment, target, "filter", "uniform_filter", str(src), "-o", str(out), "-f", "npy")
    assert r.returncode == (130 if moment.startswith("int") else 143), r.stderr
    assert "no partial file left" in r.stderr and "wrote 1 complete file(s)" in r.stderr, r.stderr
    assert _strays(out) == []
    # the small input (sorted first) was written whole; the big one is absent, never truncated
    assert sorted(p.name for p in out.iterdir()) == ["a_small_uniform_filter.npy"]
    got = np.load(out / "a_small_uniform_filter.npy")
    torch.testing.assert_close(torch.from_numpy(got), torchfilters.uniform_filter(torch.from_numpy(a[:, :8, :8])))


def test_an_external_sigterm_during_a_large_write(tmp_path, big_input):
    """SIGTERM from another process while the big output's temporary is being written."""
    src, a = big_input
    out = tmp_path / "out"
    code = textwrap.dedent("""
        import sys, time
        from torchfilters.cli import outputs
        outputs.CHUNK = 1 << 16
        real = outputs._write_chunked
        def slow(f, data):                  # ~0.5 s per MiB: the parent's signal lands mid-write
            for start in range(0, len(data), outputs.CHUNK):
                f.write(data[start:start + outputs.CHUNK]); f.flush(); time.sleep(0.03)
        outputs._write_chunked = slow
        from torchfilters.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-c", code, "filter", "uniform_filter", str(src / "big.npy"), "-o", str(out),
                          "-f", "npy"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    tmp = []
    while time.monotonic() < deadline and not tmp:
        tmp = [t for t in (out.iterdir() if out.exists() else []) if t.name.endswith(".tmp") and t.stat().st_size > 1 << 20]
        time.sleep(0.05)
    assert tmp, "the temporary never appeared"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert list(out.iterdir()) == [], err  # neither the final name nor the temporary


# ---------------------------------------------------------------- errors in words


def _png_bytes(shape=(9, 11)):
    import io

    buf = io.BytesIO()
    iio.imwrite(buf, np.random.default_rng(2).integers(0, 256, shape, dtype=np.uint8), extension=".png")
    return buf.getvalue()


def test_each_bad_file_gets_one_line_in_words(tmp_path, capsys):
    png = _png_bytes((40, 50))
    (tmp_path / "zero.png").write_bytes(b"")
    (tmp_path / "text.jpg").write_text("this is a text file, named .jpg")
    (tmp_path / "trunc.png").write_bytes(png[: len(png) // 2])
    jpg = iio.imwrite("<bytes>", np.zeros((32, 32), np.uint8), extension=".jpg")
    (tmp_path / "trunc.jpg").write_bytes(jpg[: len(jpg) // 2])
    np.save(tmp_path / "mask.npy", np.zeros((4, 4), bool))
    torch.save(torch.zeros(4, 4, dtype=torch.bool), tmp_path / "mask.pt")
    np.save(tmp_path / "cplx.npy", np.zeros((4, 4), np.complex64))
    full = (tmp_path / "zero.png").parent / "full.npy"
    np.save(full, np.zeros((30, 40), np.float32))
    (tmp_path / "short.npy").write_bytes(full.read_bytes()[:1000])
    full.unlink()
    np.save(tmp_path / "scalar.npy", np.array(3.0, np.float32))
    np.save(tmp_path / "a_empty.npy", np.zeros((0, 5), np.float32))  # (found by review: its PNG
    torch.save(torch.zeros(3, 0, 10), tmp_path / "b_empty.pt")       # raised, and ended the run)
    (tmp_path / "ok.png").write_bytes(png)
    notes = tmp_path / "notes.txt"
    notes.write_text("some notes")
    out = tmp_path / "o"
    rc = cli.main(["edges", str(tmp_path), str(notes), "-o", str(out)])
    assert rc == 1
    lines = _err_lines(capsys)
    want = {
        "zero.png": "empty file (0 bytes)",
        "text.jpg": "not an image (unrecognised format",
        "notes.txt": "not an image (unrecognised format",
        "trunc.png": "truncated PNG",
        "trunc.jpg": "truncated JPEG",
        "mask.npy": "unsupported array dtype bool",
        "mask.pt": "unsupported array dtype bool",
        "cplx.npy": "unsupported array dtype complex64",
        "short.npy": "truncated .npy array: shape (30, 40) of float32 needs 4800 data bytes",
        "scalar.npy": "wrong rank: expected shape (H, W) or (C, H, W), got ()",  # (review: was (1,))
        "a_empty.npy": "cannot write a PNG of an empty result (shape (0, 5)); use --format npy",
        "b_empty.pt": "cannot write a PNG of an empty result (shape (3, 0, 10)); use --format npy",
    }
    assert len(lines) == len(want), lines
    for name, text in want.items():
        (line,) = [e for e in lines if os.path.basename(e.split(": error: ")[1].split(":")[0]) == name]
        assert line.startswith("torchfilters: error: ") and text in line, line
        for internal in ("Traceback", "backend", "iomode", "unpack_from", "`", "Errno"):
            assert internal not in line, line  # no raw text of the readers' internals
    assert [p.name for p in out.iterdir()] == ["ok_edges.png"]
    # an output folder whose name is too long (found by review: a traceback from exists())
    rc = cli.main(["edges", str(tmp_path / "ok.png"), "-o", str(tmp_path / ("x" * 300))])
    (line,) = _err_lines(capsys)
    assert rc == 1 and "cannot create output folder (file name too long)" in line, line
    # no input usable: the summary names no folder, which was never made (found by review)
    (tmp_path / "none").mkdir()
    rc = cli.main(["edges", str(tmp_path / "none"), "-o", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert rc == 1 and "wrote 0 file(s), 1 input(s) failed" in err and "never" not in err, err
    assert not (tmp_path / "never").exists()


def test_a_signal_right_after_a_rename_is_counted(tmp_path, monkeypatch, capsys):
    """Found by review: a signal between an output's rename and its count left the summary one
    file short.  A SIGTERM sent the moment the second file is renamed (held off with the rename,
    delivered after it): that file is complete, and counted."""
    import threading

    srcs = []
    for i in range(3):
        np.save(tmp_path / f"in{i}.npy", np.full((6, 7), float(i), np.float32))
        srcs.append(str(tmp_path / f"in{i}.npy"))
    out = tmp_path / "o"
    real = os.replace
    renamed = []

    def replace(a, b, *args, **kw):
        real(a, b, *args, **kw)
        if str(b).startswith(str(out)):
            renamed.append(b)
            if len(renamed) == 2:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    monkeypatch.setattr(outputs.os, "replace", replace)
    rc = cli.main(["filter", "uniform_filter", *srcs, "-o", str(out), "-f", "npy"])
    err = capsys.readouterr().err
    assert rc == 128 + signal.SIGTERM and len(renamed) == 2, (rc, err)
    assert "wrote 2 complete file(s)" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["in0_uniform_filter.npy", "in1_uniform_filter.npy"]


def test_unsigned_integer_tensors_are_read_as_their_arrays_are(tmp_path):
    """Found by review: a uint16 ``.pt`` was refused ('real numbers are filtered (float or
    integer)') while the same ``.npy`` and the API take it."""
    a = np.random.default_rng(4).integers(0, 60000, (9, 8)).astype(np.uint16)
    np.save(tmp_path / "a.npy", a)
    torch.save(torch.from_numpy(a.astype(np.int64)).to(torch.uint16), tmp_path / "b.pt")
    out = tmp_path / "o"
    assert cli.main(["filter", "uniform_filter", str(tmp_path / "a.npy"), str(tmp_path / "b.pt"), "-o", str(out),
                     "-f", "npy", "--quiet"]) == 0
    got_a, got_b = np.load(out / "a_uniform_filter.npy"), np.load(out / "b_uniform_filter.npy")
    assert got_a.dtype == np.float32 and np.array_equal(got_a, got_b)


def test_a_file_is_read_by_its_content_not_its_name(tmp_path):
    a = np.random.default_rng(3).random((6, 7)).astype(np.float32)
    np.save(tmp_path / "x.npy", a)
    (tmp_path / "x.npy").rename(tmp_path / "array.png")  # an .npy under an image name
    assert cli.main(["edges", str(tmp_path / "array.png"), "-o", str(tmp_path / "o"), "-f", "npy", "-q"]) == 0
    got = np.load(tmp_path / "o" / "array_edges.npy")
    torch.testing.assert_close(torch.from_numpy(got), torchfilters.gradient_magnitude(torch.from_numpy(a), operator="sobel"))


def test_bool_arrays_are_refused_as_the_api_refuses_them(tmp_path, capsys):
    m = np.random.default_rng(4).random((6, 6)) > 0.5
    with pytest.raises(TypeError):
        torchfilters.gradient_magnitude(torch.from_numpy(m))  # the API's rule ...
    np.save(tmp_path / "m.npy", m)
    rc = cli.main(["filter", "gaussian_filter", "--sigma", "1", str(tmp_path / "m.npy"), "-o", str(tmp_path / "o")])
    assert rc == 1  # ... is the CLI's, in every sub-command
    (line,) = _err_lines(capsys)
    assert "m.npy: unsupported array dtype bool" in line and "uint8" in line
    # converted by the user, as the message says, the same data is filtered
    np.save(tmp_path / "m8.npy", m.astype(np.uint8))
    assert cli.main(["filter", "gaussian_filter", "--sigma", "1", str(tmp_path / "m8.npy"), "-o", str(tmp_path / "o"),
                     "-f", "npy", "-q"]) == 0
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "o" / "m8_gaussian_filter.npy")),
                               torchfilters.gaussian_filter(torch.from_numpy(m.astype(np.float32)), 1.0))


def test_one_bit_images_are_images_scaled_to_0_1(tmp_path):
    from PIL import Image

    m = np.random.default_rng(5).random((10, 12)) > 0.5
    Image.fromarray(m).save(tmp_path / "bw.png")  # a 1-bit PNG: its pixels are black or white
    assert iio.imread(tmp_path / "bw.png").dtype == np.bool_
    assert cli.main(["edges", str(tmp_path / "bw.png"), "-o", str(tmp_path), "-f", "npy", "-q"]) == 0
    want = torchfilters.gradient_magnitude(torch.from_numpy(m.astype(np.float32)), operator="sobel")
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "bw_edges.npy")), want)


# ---------------------------------------------------------------- the naming rule


def test_collisions_take_the_extension_then_a_number(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    rng = np.random.default_rng(6)
    imgs = {}
    for path in (a / "rgb.jpeg", a / "rgb.tiff", a / "solo.png", b / "rgb.tiff", a / "rgb_tiff.png"):
        imgs[path] = rng.integers(0, 256, (8, 9, 3), dtype=np.uint8)
        iio.imwrite(path, imgs[path])
    out = tmp_path / "o"
    argv = [str(a / "rgb.jpeg"), str(a / "rgb.tiff"), str(a / "solo.png"), str(b / "rgb.tiff"), str(a / "rgb_tiff.png")]
    assert cli.main(["edges", *argv, "-o", str(out), "-f", "npy", "-q"]) == 0
    expected = {
        "rgb_jpeg_edges.npy": a / "rgb.jpeg",  # a shared stem: every input sharing it gets its extension
        "rgb_tiff_edges.npy": a / "rgb.tiff",
        "solo_edges.npy": a / "solo.png",  # a unique stem: no extension
        "rgb_tiff_2_edges.npy": b / "rgb.tiff",  # still taken (same name in another folder): _2
        "rgb_tiff_3_edges.npy": a / "rgb_tiff.png",  # its plain name is taken by rgb.tiff's: _3
    }
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)
    for name, src in expected.items():  # each output is its own input's result
        x = torch.from_numpy(iio.imread(src).astype(np.float32) / 255).permute(2, 0, 1)
        if src.suffix == ".jpeg":
            continue  # lossy: compared by shape only
        torch.testing.assert_close(torch.from_numpy(np.load(out / name)),
                                   torchfilters.gradient_magnitude(x, operator="sobel"))


def test_output_names_do_not_depend_on_the_order_of_same_stem_inputs():
    from torchfilters.cli.inputs import Source

    s1, s2 = Source("x.png", "x", "png"), Source("x.npy", "x", "npy")
    assert outputs.output_names([s1, s2], "edges", "png") == ["x_png_edges.png", "x_npy_edges.png"]
    assert outputs.output_names([s2, s1], "edges", "png") == ["x_npy_edges.png", "x_png_edges.png"]


def test_an_existing_output_is_replaced_whole(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((5, 5), np.float32))
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "a_edges.npy").write_bytes(b"stale")
    assert cli.main(["edges", str(tmp_path / "a.npy"), "-o", str(tmp_path / "o"), "-f", "npy", "-q"]) == 0
    assert np.load(tmp_path / "o" / "a_edges.npy").shape == (5, 5)


def test_rerunning_into_the_input_folder_does_not_filter_the_outputs(tmp_path):
    np.save(tmp_path / "a.npy", np.random.default_rng(7).random((5, 6)).astype(np.float32))
    for _ in range(2):
        assert cli.main(["edges", str(tmp_path), "-o", str(tmp_path), "-f", "npy", "-q"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "a_edges.npy"]
    # named explicitly, an output is an input like any other
    assert cli.main(["edges", str(tmp_path / "a_edges.npy"), "-o", str(tmp_path), "-f", "npy", "-q"]) == 0
    assert (tmp_path / "a_edges_edges.npy").exists()


@pytest.mark.parametrize("t", [torch.randn(3, 4), torch.zeros(0, 5), torch.tensor(2.0), torch.randn(2, 3, 4).half(),
                               torch.randn(2, 3).bfloat16(), torch.randn(4, 5).t(), torch.randn(3, 8)[:, ::2]],
                         ids=["2d", "empty", "0d", "float16", "bfloat16", "transposed", "strided"])
def test_the_chunked_npy_writer_round_trips(tmp_path, t):
    outputs.write_atomic(tmp_path / "a.npy", outputs.encode(t, "npy"))
    got = np.load(tmp_path / "a.npy")
    want = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
    assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
