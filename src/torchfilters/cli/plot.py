"""The bar chart of ``torchfilters bench --plot``: median times on a log scale, the floor
marked, the machine and versions in the caption."""

from __future__ import annotations

import math
import textwrap
from typing import Any, Callable

from .common import require


def figure_writer(result: dict) -> Callable[[Any], None]:
    """A function writing the chart of ``result`` (``bench``'s JSON dict) as PNG to a file."""
    mpl = require("matplotlib", "matplotlib", extra="bench")
    mpl.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["seconds"]]
    skipped = [r for r in result["rows"] if not r["seconds"]]
    floor = next((r["seconds"] for r in rows if r["kind"] == "floor"), None)
    names = [r["name"] for r in rows]
    times = [r["seconds"] * 1e3 for r in rows]
    colours = {"floor": "#9e9e9e", "torchfilters": "#1f77b4", "alternative": "#ff7f0e"}

    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.55 * len(rows)))
    y = list(range(len(rows)))[::-1]
    ax.barh(y, times, color=[colours[r["kind"]] for r in rows], height=0.6)
    ax.set_yticks(y, names)
    ax.set_xscale("log")
    ax.set_xlabel("median time per call (ms, log scale)")
    if floor:
        floor_name = next(r["name"] for r in rows if r["kind"] == "floor").replace("floor: ", "")
        ax.axvline(floor * 1e3, color="black", linestyle="--", linewidth=1,
                   label=f"one-pass floor, {floor_name}")
        ax.legend(loc="upper right", fontsize=8, frameon=False)
    from .bench import _format_time

    lo, hi = min(times), max(times)
    left, right = lo / 3, max(hi * 4, lo * 1e3)
    ax.set_xlim(left, right)
    mid = math.sqrt(left * right)
    for yi, r, t in zip(y, rows, times):
        label = f"{_format_time(r['seconds'])} · {r['ratio_floor']:.3g}× floor"
        if r["speedup"]:
            label += f" · torchfilters {r['speedup']:.3g}× faster"
        if t > mid:  # a long bar holds its label; a short one has it on its right
            ax.text(t / 1.08, yi, label + " ", va="center", ha="right", fontsize=8, color="white")
        else:
            ax.text(t * 1.08, yi, label, va="center", ha="left", fontsize=8)
    ax.set_title(textwrap.fill(result["title"], 90), fontsize=10)
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items())
    caption = f"{result['machine']}" + (f", {result['gpu']}" if result.get("gpu") else "") + f". {versions}."
    if skipped:
        caption += " Not timed: " + "; ".join(f"{r['name']} ({r['status']}: {r['note']})" for r in skipped) + "."
    caption = textwrap.fill(caption, 120)
    n_lines = caption.count("\n") + 1
    fig.text(0.01, 0.01, caption, fontsize=7, va="bottom", ha="left", wrap=True)
    fig.tight_layout(rect=(0, 0.03 + 0.025 * n_lines, 1, 1))

    def write(f: Any) -> None:
        fig.savefig(f, format="png", dpi=110)
        plt.close(fig)

    return write
