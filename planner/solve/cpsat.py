"""Running a CP-SAT model the same way everywhere: seed, time limit, one worker, status and gap."""

from __future__ import annotations

from ortools.sat.python import cp_model


def solve(model: cp_model.CpModel, *, time_limit_s: float, seed: int = 0):
    """(solver, status, gap): status is ``optimal``, ``feasible`` or None (no solution found);
    gap is (objective - best bound) / objective, 0 when optimal. One worker keeps results
    deterministic: the same inputs give the same plan."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = 1
    code = solver.solve(model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver, None, None
    objective, bound = solver.objective_value, solver.best_objective_bound
    optimal = code == cp_model.OPTIMAL
    gap = 0.0 if optimal or objective <= 0 else max(0.0, (objective - bound) / objective)
    return solver, "optimal" if optimal else "feasible", gap
