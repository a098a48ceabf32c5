"""Every line a process prints reaches the log whole.

All processes of a node share the container's stdout and stderr (Cloud Logging makes an entry
of each line). The launcher sets PYTHONUNBUFFERED=1 so lines show as printed, but an unbuffered
text stream writes `print`'s text and newline in two system calls, so two ranks printing at
once interleave: `...fingerprint 67fb1eae2ccerank 0/2 (node 0...` and two bare newlines. A
line-buffered stream writes each line in one call and still flushes it at once.
"""

from __future__ import annotations

import sys

MAX_LINE = 300
"""The longest line that ends a run or warns (without its `error: ` or `warning: ` prefix):
what failed and what to do, each long location named once."""


def write_whole_lines() -> None:
    """Line-buffer stdout and stderr (where they are plain text streams)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)
