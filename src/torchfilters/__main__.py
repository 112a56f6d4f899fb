"""``python -m torchfilters``: the same as the ``torchfilters`` command."""

import sys

from torchfilters.cli import main

if __name__ == "__main__":
    sys.exit(main())
