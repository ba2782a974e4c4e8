"""Assign the blocks of a DAG to pipeline stages with CP-SAT (OR-Tools).

A chain split keeps blocks in one topological order; a DAG (two towers, an encoder and a decoder)
may do better by putting parallel branches on different stages in any interleaving. The model:

- data: per-block time and memory (model states, activations per micro-batch in flight, transient
  working memory), the edges, stages and per-stage memory capacity;
- variables: ``x[b, s]`` block b on stage s, the stage index of each block, each stage's time and
  transient memory, the bottleneck;
- constraints: each block on exactly one stage; a block's stage >= each predecessor's (activations
  only flow forward); every stage non-empty; each stage's memory within its capacity;
- objective: the slowest stage's time;
- solve: with a seed, a time limit and the chain solution as a hint; the status says whether the
  answer is optimal or only feasible, with the gap to the best bound.

Times and bytes are scaled to integers (CP-SAT is an integer solver) at a resolution of 1e-6 of the
total, so rounding moves the objective by at most about n x 1e-6 of the total time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence


from planner.solve import cpsat
from planner.solve.chain import StageMemory

RESOLUTION = 1_000_000


@dataclass
class DagPartition:
    order: list[int]
    """Blocks in their new topological order (by stage, then original position)."""
    bounds: list[int]
    """Stage s holds order[bounds[s]:bounds[s + 1]]."""
    stage_of: list[int]
    stage_times: list[float]
    status: str
    """optimal or feasible."""
    gap: float | None
    """(objective - best bound) / objective; 0 when optimal; None when unknown (time ran out
    before CP-SAT found a solution and the hint was returned)."""

    @property
    def bottleneck(self) -> float:
        return max(self.stage_times)


def solve_dag(times: Sequence[float], edges: Sequence[tuple[int, int]], stages: int,
              mem: StageMemory | None = None, *, time_limit_s: float = 10.0, seed: int = 0,
              hint: Sequence[int] | None = None) -> DagPartition | None:
    """Optimal (or best found) assignment of blocks to ``stages`` stages, or None if none exists."""
    n = len(times)
    if stages < 1 or n < stages:
        return None
    # --- data --------------------------------------------------------------------------------
    t_unit = max(sum(times), 1e-30) / RESOLUTION
    t = [int(round(x / t_unit)) for x in times]
    from ortools.sat.python import cp_model  # lazy: 0.2 s that plan show and diff need not wait

    model = cp_model.CpModel()
    # --- variables ---------------------------------------------------------------------------
    x = {(b, s): model.new_bool_var(f"x_{b}_{s}") for b in range(n) for s in range(stages)}
    stage = [model.new_int_var(0, stages - 1, f"stage_{b}") for b in range(n)]
    horizon = sum(t)
    stage_time = [model.new_int_var(0, horizon, f"time_{s}") for s in range(stages)]
    bottleneck = model.new_int_var(0, horizon, "bottleneck")
    # --- constraints -------------------------------------------------------------------------
    _one_stage_each(model, x, stage, n, stages)
    _precedence(model, stage, edges)
    _non_empty(model, x, n, stages)
    if mem is not None:
        _memory(model, x, mem, n, stages)
    for s in range(stages):
        model.add(stage_time[s] == sum(t[b] * x[b, s] for b in range(n)))
    model.add_max_equality(bottleneck, stage_time)
    # --- objective ---------------------------------------------------------------------------
    model.minimize(bottleneck)
    if hint is not None:  # a complete hint: CP-SAT starts from a known feasible solution
        for b in range(n):
            model.add_hint(stage[b], hint[b])
            for s in range(stages):
                model.add_hint(x[b, s], int(hint[b] == s))
        hinted = [sum(t[b] for b in range(n) if hint[b] == s) for s in range(stages)]
        for s in range(stages):
            model.add_hint(stage_time[s], hinted[s])
        model.add_hint(bottleneck, max(hinted))
    # --- solve -------------------------------------------------------------------------------
    res = cpsat.solve(model, time_limit_s=time_limit_s, seed=seed)
    solver, status, gap = res.solver, res.status, res.gap
    if not res.found:  # out of time before any solution: the hint still is one, if valid
        if hint is not None and _valid(list(hint), edges, stages, mem):
            return _result(list(hint), times, stages, "feasible", None)
        return None
    stage_of = [solver.value(stage[b]) for b in range(n)]
    return _result(stage_of, times, stages, status, gap)


def _valid(stage_of: list[int], edges, stages: int, mem: StageMemory | None) -> bool:
    if set(stage_of) != set(range(stages)) or any(stage_of[u] > stage_of[v] for u, v in edges):
        return False
    return mem is None or _fits(stage_of, mem, stages)


def _one_stage_each(model, x, stage, n: int, stages: int) -> None:
    for b in range(n):
        model.add_exactly_one(x[b, s] for s in range(stages))
        model.add(stage[b] == sum(s * x[b, s] for s in range(stages)))


def _precedence(model, stage, edges) -> None:
    for u, v in edges:
        model.add(stage[u] <= stage[v])


def _non_empty(model, x, n: int, stages: int) -> None:
    for s in range(stages):
        model.add(sum(x[b, s] for b in range(n)) >= 1)


def _memory(model, x, mem: StageMemory, n: int, stages: int) -> None:
    """static + in-flight x activations + largest working set (+ tied weights once) <= capacity."""
    unit = max(mem.capacity, 1.0) / RESOLUTION
    cap = int(mem.capacity / unit) + n  # slack for rounding each block's bytes (1e-6 each)
    for s in range(stages):
        per_block = [int(round((mem.static[b] + mem.in_flight[s] * mem.act[b]) / unit)) for b in range(n)]
        work = model.new_int_var(0, cap + 1, f"work_{s}")
        for b in range(n):
            w = int(round(mem.work[b] / unit))
            if w:
                model.add(work >= w).only_enforce_if(x[b, s])
        saved = []
        for a, c, nbytes in mem.shared:  # a tied weight held once when both readers share s
            both = model.new_bool_var(f"tied_{a}_{c}_{s}")
            model.add_bool_and([x[a, s], x[c, s]]).only_enforce_if(both)
            model.add_bool_or([x[a, s].Not(), x[c, s].Not()]).only_enforce_if(both.Not())
            saved.append(int(round(nbytes / unit)) * both)
        model.add(sum(per_block[b] * x[b, s] for b in range(n)) + work - sum(saved) <= cap)


def _result(stage_of: list[int], times, stages: int, status: str, gap: float) -> DagPartition:
    order = sorted(range(len(times)), key=lambda b: (stage_of[b], b))
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + sum(1 for b in order if stage_of[b] == s))
    stage_times = [sum(times[b] for b in range(len(times)) if stage_of[b] == s) for s in range(stages)]
    return DagPartition(order=order, bounds=bounds, stage_of=stage_of, stage_times=stage_times,
                        status=status, gap=gap)


def brute_force_dag(times, edges, stages: int, mem: StageMemory | None = None) -> float | None:
    """The optimal bottleneck by enumerating every assignment (tests only; tiny instances)."""
    n, best = len(times), None
    for assign in itertools.product(range(stages), repeat=n):
        if len(set(assign)) != stages or any(assign[u] > assign[v] for u, v in edges):
            continue
        if mem is not None and not _fits(assign, mem, stages):
            continue
        value = max(sum(times[b] for b in range(n) if assign[b] == s) for s in range(stages))
        best = value if best is None else min(best, value)
    return best


def _fits(assign, mem: StageMemory, stages: int) -> bool:
    for s in range(stages):
        blocks = [b for b, a in enumerate(assign) if a == s]
        total = sum(mem.static[b] + mem.in_flight[s] * mem.act[b] for b in blocks)
        total += max(mem.work[b] for b in blocks)
        total -= sum(nb for a, c, nb in mem.shared if a in blocks and c in blocks)
        if total > mem.capacity:
            return False
    return True
