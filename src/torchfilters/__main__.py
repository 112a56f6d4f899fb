"""``python -m torchfilters``: the same as the ``torchfilters`` command (its launcher)."""

import sys

from _torchfilters_cli import main

if __name__ == "__main__":
    sys.exit(main())
