"""A one-line progress bar on stderr, redrawn on a terminal and silent otherwise."""

from __future__ import annotations

import sys
import time


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
