"""The ``torchfilters`` command line.

Sub-commands::

    torchfilters edges  [INPUT ...] [--operator sobel] [--mode reflect] [--cval 0] [--normalized]
    torchfilters blur   [INPUT ...] [--threshold 0] [--sigma S] [--normalized] [--keep-border] ...
    torchfilters filter OP [INPUT ...] [--PARAM VALUE ...]     # any op of torchfilters.functional
    torchfilters bench  [--op gradient_magnitude] [--shape 1000,128,28,28] [--plot bench.png] ...
    torchfilters warmup [--dtype float32|float64|float16|bfloat16|all ...] [--only OP ...] [--jobs N]

Modules, one idea each:

* :mod:`.common`: constants, exceptions, lazy imports, argparse types, the error line format;
* :mod:`.inputs`: which files are read, format by content, error reasons in words;
* :mod:`.outputs`: output names (the collision rule), PNG scaling, all-or-nothing writes;
* :mod:`.ops`: options made from an op's signature and docstring;
* :mod:`.run`: the one loop of every filtering sub-command (inputs, outputs, progress, errors);
* :mod:`.bench`: ``torchfilters bench``; :mod:`.alternatives`: what it compares against;
  :mod:`.plot`: its bar chart;
* :mod:`.app`: the parser and :func:`main`.

The heavy dependencies (torch, imageio, scikit-image, tqdm, matplotlib) are imported only when
needed.  imageio, scikit-image and tqdm come with the ``cli`` extra
(``pip install 'torchfilters[cli]'``); ``bench --plot`` needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

from .app import build_parser, main
from .common import FORMATS, MODES, OPERATORS
from .inputs import SAMPLE_IMAGES

__all__ = ["main", "build_parser", "SAMPLE_IMAGES", "OPERATORS", "MODES", "FORMATS"]
