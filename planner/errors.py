"""Errors the planner reports to people: PlannerError > SpecError, TraceError, InfeasibleError,
InternalError.

Each carries one line that names the field, the value and the fix; the CLI prints it and exits 2
(an InternalError, a bug of the planner's own, exits 1).
"""

from costmodels.errors import InfeasibleError, InternalError, PlannerError, SpecError


class TraceError(PlannerError):
    """The model could not be traced (names the op or module, and the fallback to try)."""


__all__ = ["PlannerError", "SpecError", "TraceError", "InfeasibleError", "InternalError"]
