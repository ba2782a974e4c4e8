"""Where the planner's progress lines go: one stderr handler on the ``planner`` logger, each line
the message alone (the ``plan`` command, and the processes it starts that report for it)."""

from __future__ import annotations

import contextlib
import logging
import sys


def to_stderr(level: int) -> None:
    """Send the ``planner`` logger's records at ``level`` and above to stderr, one message a
    line, and nowhere else (the root logger's handlers are not involved). A warning already shown
    is not shown again: a command that traces or prices a model more than once (a what-if's
    points, an export's re-pricing) would repeat what the model's reading said."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    shown: set[str] = set()

    def first_time(record) -> bool:
        if not logging.WARNING <= record.levelno < logging.ERROR:
            return True
        text = record.getMessage()
        if text in shown:
            return False
        shown.add(text)
        return True

    handler.addFilter(first_time)
    root = logging.getLogger("planner")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    for name in QUIET_TORCH_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


QUIET_TORCH_LOGGERS = ("torch.fx._symbolic_trace",)
"""torch's loggers whose warnings are about torch's own API, not the user's model, kept off the
command's stderr: TorchRec's modules ask torch.fx whether they are traced, and torch warns once
that is_fx_tracing covers torch.export too (every recommendation model printed it, -q or not)."""


@contextlib.contextmanager
def collected_warnings():
    """The warnings the planner's loggers give inside the block, as a list of messages, taken
    from the handlers that would show them (the planner's and the root's; without any, from
    logging's last resort)."""
    said: list[str] = []

    def shown(record) -> bool:  # a warning goes to the list instead
        return not (logging.WARNING <= record.levelno < logging.ERROR
                    and record.name.startswith("planner"))

    class Collect(logging.Handler):
        def emit(self, record):
            if not shown(record):
                said.append(record.getMessage())

    planner_log = logging.getLogger("planner")
    others = planner_log.handlers + logging.getLogger().handlers
    collect = Collect(level=logging.WARNING)
    for h in others:
        h.addFilter(shown)
    planner_log.addHandler(collect)
    try:
        yield said
    finally:
        planner_log.removeHandler(collect)
        for h in others:
            h.removeFilter(shown)
