"""Where the planner's progress lines go: one stderr handler on the ``planner`` logger, each line
the message alone (the ``plan`` command, and the processes it starts that report for it)."""

from __future__ import annotations

import logging
import sys


def to_stderr(level: int) -> None:
    """Send the ``planner`` logger's records at ``level`` and above to stderr, one message a
    line, and nowhere else (the root logger's handlers are not involved)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("planner")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
