"""Error types shared by the cost models and the planner.

They live here (the bottom of the dependency graph) so that costmodels can raise them without
importing the planner; ``planner.errors`` re-exports them.
"""


class PlannerError(Exception):
    """Any error the planner reports to a person (one line, no traceback by default)."""


class SpecError(PlannerError):
    """Bad input: an unknown name, a missing or unknown key, a value out of range. The message
    names the field first, as every bad-input message does ("fix.tp: ...; the fix")."""

    @property
    def field(self) -> str:
        """The input field the message names ("fix.tp", "engine.moe_capacity_factor")."""
        return str(self).partition(":")[0]


class InternalError(PlannerError):
    """A broken invariant of the planner itself (a bug, not bad input): reported in one line with
    a request to report it, never turned into a plan."""


class InfeasibleError(PlannerError):
    """A configuration that cannot run (out of memory, indivisible degrees, ...).

    ``reason`` is a short category the search counts ("out of memory", "tp > gpus per node");
    the message says the details.
    """

    def __init__(self, message: str, *, reason: str = "infeasible"):
        super().__init__(message)
        self.reason = reason
