"""``torchfilters bench``."""
from __future__ import annotations


def add_parser(sub, make, build=True):
    p = make(sub, "bench", "time an op against the one-pass floor and the installed alternatives", "bench")
    p.set_defaults(subparser=p)
    return p


def run(args):
    return 0
