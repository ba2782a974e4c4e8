"""This machine as the planner's own processes see it: the CPU cores they may run on (a leaf)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system says, else the count),
    at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
