"""``torchfilters bench``: rows checked for agreement before timing, disagreements and
impossible calls reported rather than timed, the table's figures consistent, JSON, the plot
(log time, floor marked, machine and versions in the caption) and the progress bar.  Tiny
shapes and --min-time 0.01: these tests check the bench, not the machine."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from torchfilters import cli
from torchfilters.cli import alternatives as alt

pytest.importorskip("scipy")

FAST = ["--shape", "2,3,12,14", "--min-time", "0.01", "-q"]


def _bench(tmp_path, *argv, capsys=None):
    path = tmp_path / "b.json"
    rc = cli.main(["bench", *FAST, "--json", str(path), *argv])
    assert rc == 0
    return json.loads(path.read_text())


def _rows(result):
    return {r["name"]: r for r in result["rows"]}


def test_rows_agree_then_are_timed_and_the_figures_are_consistent(tmp_path, capsys):
    res = _bench(tmp_path)
    out = capsys.readouterr().out
    rows = _rows(res)
    floor, tf = rows["floor: torch.neg(x, out=y)"], rows["torchfilters"]
    assert res["op"] == "gradient_magnitude" and res["shape"] == [2, 3, 12, 14] and not res["backward"]
    assert res["bytes"] == 2 * 2 * 3 * 12 * 14 * 4  # one read, one write, float32
    assert {"torchfilters (out=)", "plain torch: index padding + grouped F.conv2d",
            "SciPy ndimage.correlate1d/correlate passes"} <= set(rows)
    for r in res["rows"]:
        if r["kind"] == "alternative" and r["status"] == "ok":
            assert r["max_rel_error"] <= alt.tolerance(torch.float32)  # checked before it was timed
        if r["seconds"] is not None:
            assert r["gbps"] == pytest.approx(res["bytes"] / r["seconds"] / 1e9)
            assert r["ratio_floor"] == pytest.approx(r["seconds"] / floor["seconds"])
            if r["kind"] == "alternative":
                assert r["speedup"] == pytest.approx(r["seconds"] / tf["seconds"])
    for col in ("median", "GB/s", "× floor", "tf speed-up"):
        assert col in out
    assert res["versions"]["torch"] == torch.__version__ and "scipy" in res["versions"]
    assert "cores" in res["machine"]


def test_a_disagreeing_alternative_is_reported_not_timed(tmp_path, monkeypatch, capsys):
    def wrong(r, x, backward):
        return lambda inp: torch.zeros_like(inp)  # right shape, wrong values

    monkeypatch.setattr(alt, "ALTERNATIVES", [*alt.ALTERNATIVES, alt.Alternative("broken library", "torch", True, wrong)])
    res = _bench(tmp_path)
    row = _rows(res)["broken library"]
    assert row["status"] == "disagrees" and row["seconds"] is None and row["max_rel_error"] > 0.01
    assert "broken library" in capsys.readouterr().out.split("disagrees")[0].splitlines()[-1]


def test_calls_without_an_equivalent_are_reported(tmp_path):
    res = _bench(tmp_path, "--op", "gaussian_filter", "--sigma", "1", "--axes", "-1,-2")
    for r in res["rows"]:
        if r["kind"] == "alternative":
            assert r["status"] == "n/a" and "axes other than the last two" in r["note"], r
    assert _rows(res)["torchfilters"]["seconds"] > 0


def test_scipy_uses_its_own_function_and_op_options_reach_every_row(tmp_path):
    res = _bench(tmp_path, "--op", "gaussian_filter", "--sigma", "1.5", "--mode", "nearest")
    assert res["kwargs"] == {"sigma": 1.5, "mode": "nearest"}
    row = _rows(res)["SciPy ndimage.gaussian_filter(axes=(-2, -1))"]
    assert row["status"] == "ok" and row["max_rel_error"] < 1e-5


@pytest.mark.parametrize("op, opts", [("selective_blur", ["--threshold", "0.2"]), ("laplace", ["--mode", "wrap"]),
                                      ("sobel", ["--axis", "-2"]), ("uniform_filter", ["--size", "4"]),
                                      ("correlate", []), ("gaussian_laplace", []), ("gradient", ["--operator", "sobel"])])
def test_every_recipe_agrees_with_torchfilters(tmp_path, op, opts):
    res = _bench(tmp_path, "--op", op, *opts)
    alts = [r for r in res["rows"] if r["kind"] == "alternative"]
    assert alts and not [r for r in alts if r["status"] in ("disagrees", "error")], alts
    assert any(r["status"] == "ok" for r in alts)


def test_backward_times_autograd_rows_only(tmp_path):
    res = _bench(tmp_path, "--op", "selective_blur", "--backward")
    rows = _rows(res)
    assert res["backward"] and res["bytes"] == 4 * 2 * 3 * 12 * 14 * 4
    assert rows["floor: torch.neg(x).backward(g)"]["seconds"] > 0
    assert rows["torchfilters"]["seconds"] > 0 and "torchfilters (out=)" not in rows
    assert rows["plain torch: index padding + grouped F.conv2d"]["status"] == "ok"  # forward and gradient agree
    scipy_row = next(r for r in res["rows"] if r["name"].startswith("SciPy"))
    assert scipy_row["status"] == "n/a" and scipy_row["note"] == "no autograd"


@pytest.mark.parametrize("argv, where", [
    (["--op", "bilateral_filter"], "argument --op: unknown op 'bilateral_filter'"),
    (["--shape", "0,3"], "argument --shape: every size must be 1 to 2**63-1"),
    (["--shape", "99999999999999999999999,2"], "argument --shape: every size must be 1 to 2**63-1"),
    (["--shape", "100000,100000,100000"], "argument --shape: cannot make an input of shape"),
    (["--min-time", "nan"], "argument --min-time: must be finite"),
    (["--min-time", "inf"], "argument --min-time: must be finite"),
    (["--min-time", "0"], "argument --min-time: must be > 0"),
    (["--quick"], "argument --quick: not allowed with argument --min-time"),
    (["--threads", "100000"], "argument --threads: must be 1 to"),
    (["--seed", str(2**64)], "argument --seed: must be 0 to 2**64-1"),
    (["--shape", "2,x"], "argument --shape"),
    (["--op", "gaussian_filter", "--sigma", "-1"], "argument --sigma"),
    (["--op", "gaussian_filter", "--frobnicate", "1"], "unrecognized arguments: --frobnicate"),
    (["--device", "nonsense"], "argument --device"),
])
def test_bad_bench_options_are_usage_errors(capsys, argv, where):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", *FAST, *argv])
    assert exc.value.code == 2
    assert where in capsys.readouterr().err


def test_progress_bar_on_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert cli.main(["bench", "--shape", "2,8,8", "--min-time", "0.01"]) == 0
    assert "torchfilters bench" in capsys.readouterr().err  # tqdm's bar


def test_plot_has_log_time_the_floor_and_the_machine(tmp_path):
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from PIL import Image

    res = _bench(tmp_path, "--plot", str(tmp_path / "b.png"))
    with Image.open(tmp_path / "b.png") as im:
        assert im.format == "PNG" and im.size[0] >= 800
    from torchfilters.cli.plot import figure_writer

    plt.close("all")
    write = figure_writer(res)
    (num,) = plt.get_fignums()
    fig = plt.figure(num)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    floor_ms = _rows(res)["floor: torch.neg(x, out=y)"]["seconds"] * 1e3
    assert [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == "--"] == [pytest.approx(floor_ms)]
    caption = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert res["machine"] in caption and f"torch {torch.__version__}" in caption
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "torchfilters" in labels and labels[0].startswith("floor")
    assert ax.get_yticks()[0] == max(ax.get_yticks())  # the floor is the top bar
    with open(tmp_path / "again.png", "wb") as f:
        write(f)


def test_plot_without_matplotlib_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc = cli.main(["bench", *FAST, "--plot", str(tmp_path / "b.png")])
    assert rc == 1
    cap = capsys.readouterr()
    assert "pip install 'torchfilters[bench]'" in cap.err
    assert not (tmp_path / "b.png").exists()
    assert "median" not in cap.out  # refused before any timing


def test_max_rel_error_scale_and_nans():
    w = torch.tensor([1.0, 100.0, float("nan")])
    assert alt.max_rel_error(np.array([1.0, 101.0, np.nan]), w) == pytest.approx(0.01)
    assert alt.max_rel_error(np.array([1.0, 100.0, 0.0]), w) == float("inf")
    assert alt.max_rel_error(np.zeros(2), w) == float("inf")  # shapes differ


@pytest.mark.parametrize("op, opts", [("median_filter", []), ("rank_filter", ["--size", "3"]),
                                      ("percentile_filter", ["--footprint", "1,0,1;0,1,0;1,0,1"])])
def test_rank_filters_get_a_window_and_scipy_is_their_alternative(tmp_path, op, opts):
    res = _bench(tmp_path, "--op", op, *opts)
    assert res["kwargs"].get("size") == (5 if not opts else 3 if op == "rank_filter" else None)
    rows = _rows(res)
    scipy_row = rows[f"SciPy ndimage.{op}(axes=(-2, -1))"]
    assert scipy_row["status"] == "ok" and scipy_row["max_rel_error"] == 0.0 and scipy_row["seconds"] > 0
    assert rows["plain torch: index padding + grouped F.conv2d"]["status"] == "n/a"


class _ClosedPipe:
    """A stdout whose reader went away."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_a_closed_stdout_still_writes_the_json(tmp_path, monkeypatch):
    path = tmp_path / "b.json"
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert cli.main(["bench", *FAST, "--json", str(path)]) == 128 + 13  # SIGPIPE's status, quietly
    assert json.loads(path.read_text())["rows"]


def test_sigterm_while_the_json_is_written_is_status_143(tmp_path, monkeypatch, capsys):
    from torchfilters.cli import outputs
    from torchfilters.cli.common import Terminated

    def terminated(path, write):
        raise Terminated(15)

    monkeypatch.setattr(outputs, "write_atomic", terminated)
    assert cli.main(["bench", *FAST, "--json", str(tmp_path / "b.json")]) == 143
    assert capsys.readouterr().err.strip().endswith("torchfilters: terminated (SIGTERM)")
    assert not list(tmp_path.iterdir())
