"""Summarise a log of numba's top-level compiles (``TORCHFILTERS_COMPILE_LOG``, ``tests/_compile_log.py``).

    TORCHFILTERS_COMPILE_LOG=/tmp/compiles.jsonl NUMBA_CACHE_DIR=/tmp/empty make test
    .venv/bin/python benchmarks/compile_log.py /tmp/compiles.jsonl [--top 25]

Prints the compile seconds by kernel family (the kernel's module and function), by compute
dtype (read from its arguments), by test file and by test: which tests pay for a cold cache.
A kernel compiles once over all the test processes (they share the cache and its compile
locks), so each compile is charged to the test that asked for it first.
"""

from __future__ import annotations

import argparse
import collections
import json
import re


def _family(kernel: str) -> str:
    mod, _, name = kernel.rpartition(".<locals>.")[0].rpartition(".") if "<locals>" in kernel else \
        kernel.rpartition(".")
    return f"{mod.rsplit('.', 1)[-1]}.{name}"


def _dtype(args: str) -> str:
    m = re.search(r"\b(float16|bfloat16|float32|float64|uint16|int16)\b", args)
    return m.group(1) if m else "?"


def _table(title, counter, counts, top):
    total = sum(counter.values())
    print(f"\n{title} (seconds, compiles, share)")
    for k, s in counter.most_common(top):
        print(f"  {s:8.1f}  {counts[k]:4d}  {100 * s / total:5.1f}%  {k}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    recs = [json.loads(line) for line in open(args.log) if line.strip()]
    by = {k: (collections.Counter(), collections.Counter()) for k in ("family", "dtype", "file", "test")}
    for r in recs:
        keys = {"family": _family(r["kernel"]), "dtype": _dtype(r["args"]),
                "file": r["test"].split("::")[0], "test": r["test"]}
        for k, v in keys.items():
            by[k][0][v] += r["s"]
            by[k][1][v] += 1
    print(f"{len(recs)} top-level compiles, {sum(r['s'] for r in recs):.1f} s, "
          f"{len({r['pid'] for r in recs})} processes")
    for k, title in (("family", "by kernel family"), ("dtype", "by dtype"), ("file", "by test file"),
                     ("test", "by test (first to ask)")):
        _table(title, by[k][0], by[k][1], args.top)


if __name__ == "__main__":
    main()
