"""What a command reports while it works: a one-line progress bar on stderr, redrawn on a
terminal and silent otherwise, and the per-plan log lines a many-plan command holds back."""

from __future__ import annotations

import contextlib
import logging
import sys
import time


@contextlib.contextmanager
def per_plan_lines(verbose: bool):
    """Hold back the API's lines for every plan (one per job and GPU count, or per what-if
    point) unless ``verbose``; the level is restored after, for later commands in the process."""
    api_log = logging.getLogger("planner.api")
    level = api_log.level
    if not verbose:
        api_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        api_log.setLevel(level)


class Bar:
    """``<label> [#####.....] 12/50<unit>``; call it with (done, total)."""

    def __init__(self, quiet: bool, label: str = "searching", unit: str = ""):
        self.show = not quiet and sys.stderr.isatty()
        self.label, self.unit = label, unit
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.show or total == 0 or (done < total and now - self.last < 0.1):
            return
        self.last = now
        filled = int(30 * done / total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                         f"{done}/{total}{self.unit}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
