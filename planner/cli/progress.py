"""What a command reports while it works: a one-line progress bar on stderr, redrawn on a
terminal and a line now and then otherwise (a log, CI), and the per-plan log lines a many-plan
command holds back."""

from __future__ import annotations

import contextlib
import logging
import sys
import time


@contextlib.contextmanager
def per_plan_lines(verbose: bool):
    """Hold back the API's lines for every plan (one per job and GPU count, or per what-if
    point), and those of the searches beside a plan over groups or sites (each group alone, the
    replicas across sites), unless ``verbose``; the levels are restored after, for later
    commands in the process."""
    logs = [logging.getLogger(name) for name in PER_PLAN_LOGGERS]
    levels = [log.level for log in logs]
    if not verbose:
        for log in logs:
            log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


PER_PLAN_LOGGERS = ("planner.api", "planner.search.alone", "planner.search.replicas")
"""Loggers whose lines come once per plan (per_plan_lines holds them back)."""


class Bar:
    """``<label> [#####.....] 12/50<unit>``; call it with (done, total). Off a terminal:
    ``<label>: 12/50<unit> (31 s)`` once every LINE_EVERY_S seconds of work, counted from the
    first call (a bar made before a model is traced does not count the trace)."""

    LINE_EVERY_S = 10.0

    def __init__(self, quiet: bool, label: str = "searching", unit: str = ""):
        self.show = not quiet
        self.tty = sys.stderr.isatty()
        self.label, self.unit = label, unit
        self.start = self.last = None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.show or total == 0:
            return
        if self.start is None:
            self.start = self.last = now
        if not self.tty:
            if now - self.last >= self.LINE_EVERY_S:
                self.last = now
                sys.stderr.write(f"{self.label}: {done}/{total}{self.unit} "
                                 f"({now - self.start:.0f} s)\n")
                sys.stderr.flush()
            return
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        filled = int(30 * done / total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                         f"{done}/{total}{self.unit}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
