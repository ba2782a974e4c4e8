"""The plan command's stderr lines (planner.logs)."""

from __future__ import annotations

import logging

from planner import logs


def test_a_warning_is_shown_once_per_command_and_progress_lines_every_time(capsys):
    """A what-if traced its model once per point and an export re-priced it, each time repeating
    the model's warnings (a new-user check: the MTP warning on every point)."""
    log = logging.getLogger("planner.api")
    try:
        logs.to_stderr(logging.INFO)
        for _ in range(3):
            log.warning("model x: a warning")
            log.info("tracing")
        log.warning("model x: another warning")
        log.error("an error")
        log.error("an error")
        err = capsys.readouterr().err.splitlines()
        assert err.count("model x: a warning") == 1 and err.count("tracing") == 3
        assert "model x: another warning" in err and err.count("an error") == 2
        logs.to_stderr(logging.INFO)  # the next command shows it again
        log.warning("model x: a warning")
        assert capsys.readouterr().err.splitlines() == ["model x: a warning"]
    finally:
        root = logging.getLogger("planner")
        root.handlers[:] = []
        root.propagate = True
        root.setLevel(logging.NOTSET)
