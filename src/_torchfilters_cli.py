"""The ``torchfilters`` console script: :func:`torchfilters.cli.main`, with Ctrl-C handled from
its first instruction.

It lives outside the ``torchfilters`` package because importing anything in the package imports
the library, and with it torch (1-2 s): a Ctrl-C then would end in a traceback.  An interrupted
run (status 130 or 143) ends at once, not after a kernel that a background thread is compiling
(seconds): its outputs are written all or nothing, and the kernel cache's locks are ``flock``
locks, which the operating system releases.
"""

from __future__ import annotations

import os
import sys

_INTERRUPTED = (130, 143)


def main() -> int | str | None:
    """Run the command; returns its exit status for ``sys.exit``."""
    try:
        try:
            from torchfilters.cli.app import main as run

            status = run()
        except KeyboardInterrupt:  # (during the imports: main handles its own)
            print("torchfilters: interrupted", file=sys.stderr)
            status = 130
        except SystemExit as exc:  # argparse: --help, --version, a usage error
            status = exc.code
        sys.stdout.flush()  # (here, not at the interpreter's exit: a closed pipe is handled)
    except OSError as exc:
        from torchfilters.cli.common import stdout_failed

        status = stdout_failed(exc)
    if status in _INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
