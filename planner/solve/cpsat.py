"""Running a CP-SAT model the same way everywhere: seed, time limit, workers, status and gap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

STATUS_WORDS = {"OPTIMAL": "optimal", "FEASIBLE": "feasible", "INFEASIBLE": "infeasible"}
"""CP-SAT's answers in the planner's words; anything else (out of time before a first solution,
an invalid model) is ``unknown``."""


@dataclass(frozen=True)
class Solved:
    """What one CP-SAT solve found."""

    solver: cp_model.CpSolver
    """Read variable values from it (only when ``found``)."""
    status: str
    """optimal, feasible (the time limit ended the search), infeasible or unknown."""
    objective: float | None
    """The objective of the solution found; None without one."""
    bound: float | None
    """CP-SAT's best lower bound on the objective (minimization); None without a solution."""
    gap: float | None
    """(objective - bound) / objective, 0 when optimal; None without a solution."""
    wall_s: float
    """Seconds CP-SAT ran."""

    @property
    def found(self) -> bool:
        return self.status in ("optimal", "feasible")


def solve(model: cp_model.CpModel, *, time_limit_s: float, seed: int = 0,
          workers: int = 1, deterministic_s: float | None = None) -> Solved:
    """Solve ``model``. One worker (the default) keeps results deterministic: the same inputs give
    the same plan where the search ends by itself, or by ``deterministic_s`` (CP-SAT's
    deterministic time, which counts work, not seconds) before ``time_limit_s`` (wall clock)."""
    from ortools.sat.python import cp_model  # lazy: 0.2 s that plan show and diff need not wait

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    if deterministic_s is not None:
        solver.parameters.max_deterministic_time = max(0.01, deterministic_s)
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = workers
    code = solver.solve(model)
    status = STATUS_WORDS.get(solver.status_name(code), "unknown")
    if status not in ("optimal", "feasible"):
        return Solved(solver, status, None, None, None, solver.wall_time)
    objective, bound = solver.objective_value, solver.best_objective_bound
    gap = 0.0 if status == "optimal" or objective <= 0 else max(0.0, (objective - bound) / objective)
    return Solved(solver, status, objective, bound, gap, solver.wall_time)
