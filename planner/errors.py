"""Errors the planner reports to people: PlannerError > SpecError, TraceError, InfeasibleError,
InternalError, RunError.

Each carries one line that names the field, the value and the fix; the CLI prints it and exits 2
(an InternalError, a bug of the planner's own, exits 1; a RunError, a plan run or a measurement
whose processes failed, 4).
"""

import contextlib
import signal
import threading

from costmodels.errors import InfeasibleError, InternalError, PlannerError, SpecError


class TraceError(PlannerError):
    """The model could not be traced (names the op or module, and the fallback to try)."""


class RunError(PlannerError):
    """Processes that failed after the checks passed: a plan run's (`plan run`) or a
    measurement's (`plan profile`, ``kind`` "measurement"): a crash (in the runtime or the
    model's own code) or a kill (a signal: out of host memory, a stop from outside). ``hint``
    says where to look."""

    def __init__(self, message: str, hint: str, kind: str = "run"):
        super().__init__(message)
        self.hint = hint
        self.kind = kind


class Terminated(KeyboardInterrupt):
    """A stop from outside (SIGTERM) while the planner waited on processes of its own: it stops
    them as on Ctrl-C, and the CLI exits 128 + ``signum`` as a process the signal ended would."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def sigterm_raises():
    """Inside: SIGTERM raises Terminated in the main thread (elsewhere nothing changes), so that
    a wait on the planner's own processes stops them in its ``finally`` as on Ctrl-C, and the
    CLI exits 143 with its one line, not the interpreter's default death (a new-user check's
    SIGTERM to ``plan profile`` left a resource tracker's warning of leaked semaphores)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame):
    raise Terminated(signum)


__all__ = ["PlannerError", "SpecError", "TraceError", "InfeasibleError", "InternalError",
           "RunError", "Terminated"]
