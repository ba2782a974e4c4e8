"""Errors the planner reports to people: PlannerError > SpecError, TraceError, InfeasibleError,
InternalError, RunError.

Each carries one line that names the field, the value and the fix; the CLI prints it and exits 2
(an InternalError, a bug of the planner's own, exits 1; a RunError, a plan run whose processes
failed, 4).
"""

from costmodels.errors import InfeasibleError, InternalError, PlannerError, SpecError


class TraceError(PlannerError):
    """The model could not be traced (names the op or module, and the fallback to try)."""


class RunError(PlannerError):
    """A plan run (`plan run`) whose processes failed after the checks passed: a crash (in the
    runtime or the model's own code) or a kill (a signal: out of host memory, a stop from
    outside). ``hint`` says where to look."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


__all__ = ["PlannerError", "SpecError", "TraceError", "InfeasibleError", "InternalError",
           "RunError"]
