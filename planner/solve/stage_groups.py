"""Place pipeline stages on groups of different devices and size each stage for its device (CP-SAT).

Data: per device group, each block's time on that device; how many stage slots each group has
(its GPUs / GPUs per stage); per-block memory (model states, activations per micro-batch in
flight, transient working set); each group's memory per GPU.

Variables: ``x[b, s]`` block b on stage s; ``y[s, g]`` stage s on group g; ``z[b, s, g]`` both;
each stage's time; the bottleneck.

Constraints (one helper each): every block on one stage, stages in dataflow order (a block's stage
>= its predecessors'); every stage on one group, each group filled to its slots, each group's stages
consecutive (the pipeline crosses the slow link between groups as few times as possible); every
stage non-empty; each stage's memory within its device's.

Objective: the slowest stage's time. Solved with a seed, a time limit, and the dynamic-programming
split over the best group order as a hint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


from planner.solve import cpsat
from planner.solve.chain import StageMemory

RESOLUTION = 1_000_000


@dataclass
class HeteroPartition:
    bounds: list[int]
    group_of_stage: list[int]
    stage_times: list[float]
    status: str
    gap: float

    @property
    def bottleneck(self) -> float:
        return max(self.stage_times)


def solve_hetero(times: Sequence[Sequence[float]], slots: Sequence[int],
                 edges: Sequence[tuple[int, int]], mem: StageMemory | None,
                 capacities: Sequence[float], *, time_limit_s: float = 10.0, seed: int = 0,
                 hint: tuple[list[int], list[int]] | None = None,
                 cross: Sequence[Sequence[float]] | None = None) -> HeteroPartition | None:
    """``times[g][b]``: block b on group g's device; ``slots[g]``: stages group g hosts;
    ``capacities[g]``: its bytes per GPU; ``hint``: (bounds, group_of_stage) of a known split;
    ``cross[g][h]``: seconds a stage on group g spends per micro-batch sending to the next stage
    when that stage is on group h (sites joined by slow links), added to the sending stage."""
    groups, n, stages = len(times), len(times[0]), sum(slots)
    if n < stages:
        return None
    # --- data ---------------------------------------------------------------------------------
    unit = max(max(sum(t) for t in times), 1e-30) / RESOLUTION
    t = [[int(round(v / unit)) for v in row] for row in times]
    from ortools.sat.python import cp_model  # lazy: 0.2 s that plan show and diff need not wait

    model = cp_model.CpModel()
    # --- variables ----------------------------------------------------------------------------
    x = {(b, s): model.new_bool_var(f"x_{b}_{s}") for b in range(n) for s in range(stages)}
    y = {(s, g): model.new_bool_var(f"y_{s}_{g}") for s in range(stages) for g in range(groups)}
    z = {(b, s, g): model.new_bool_var(f"z_{b}_{s}_{g}")
         for b in range(n) for s in range(stages) for g in range(groups)}
    stage = [model.new_int_var(0, stages - 1, f"stage_{b}") for b in range(n)]
    c = ([[int(round(v / unit)) for v in row] for row in cross] if cross is not None else None)
    horizon = max(sum(row) for row in t) + (max(max(row) for row in c) if c else 0)
    stage_time = [model.new_int_var(0, horizon, f"time_{s}") for s in range(stages)]
    bottleneck = model.new_int_var(0, horizon, "bottleneck")
    # --- constraints --------------------------------------------------------------------------
    _blocks(model, x, stage, edges, n, stages)
    _groups(model, y, slots, stages, groups)
    _links(model, x, y, z, n, stages, groups)
    if mem is not None:
        _memory(model, x, y, mem, capacities, n, stages, groups)
    crossing = [0] * stages
    if c is not None:
        for s in range(stages - 1):
            terms = []
            for g in range(groups):
                for h in range(groups):
                    if g != h and c[g][h]:
                        w = model.new_bool_var(f"w_{s}_{g}_{h}")
                        model.add_bool_and([y[s, g], y[s + 1, h]]).only_enforce_if(w)
                        model.add_bool_or([y[s, g].Not(), y[s + 1, h].Not(), w])
                        terms.append(c[g][h] * w)
            crossing[s] = sum(terms)
    for s in range(stages):
        model.add(stage_time[s] == sum(t[g][b] * z[b, s, g] for b in range(n) for g in range(groups))
                  + crossing[s])
    model.add_max_equality(bottleneck, stage_time)
    # --- objective ----------------------------------------------------------------------------
    model.minimize(bottleneck)
    if hint is not None:
        _hint(model, x, y, z, stage, stage_time, bottleneck, t, hint, n, stages, groups)
    # --- solve --------------------------------------------------------------------------------
    res = cpsat.solve(model, time_limit_s=time_limit_s, seed=seed)
    solver, status, gap = res.solver, res.status, res.gap
    if not res.found:
        return None
    stage_of = [solver.value(stage[b]) for b in range(n)]
    group_of = [next(g for g in range(groups) if solver.value(y[s, g])) for s in range(stages)]
    bounds = [0] + [sum(1 for b in range(n) if stage_of[b] <= s) for s in range(stages)]
    stage_times = [sum(times[group_of[s]][b] for b in range(n) if stage_of[b] == s)
                   + (cross[group_of[s]][group_of[s + 1]] if cross is not None and s + 1 < stages
                      and group_of[s] != group_of[s + 1] else 0.0)
                   for s in range(stages)]
    return HeteroPartition(bounds=bounds, group_of_stage=group_of, stage_times=stage_times,
                           status=status, gap=gap)


def _blocks(model, x, stage, edges, n: int, stages: int) -> None:
    """One stage per block, in dataflow order; no stage empty."""
    for b in range(n):
        model.add_exactly_one(x[b, s] for s in range(stages))
        model.add(stage[b] == sum(s * x[b, s] for s in range(stages)))
    for u, v in edges:
        model.add(stage[u] <= stage[v])
    for s in range(stages):
        model.add(sum(x[b, s] for b in range(n)) >= 1)


def _groups(model, y, slots, stages: int, groups: int) -> None:
    """One group per stage, each group filled to its slots, each group's stages consecutive."""
    for s in range(stages):
        model.add_exactly_one(y[s, g] for g in range(groups))
    for g in range(groups):
        model.add(sum(y[s, g] for s in range(stages)) == slots[g])
    changes = []
    for s in range(stages - 1):
        same = [model.new_bool_var(f"same_{s}_{g}") for g in range(groups)]
        for g in range(groups):
            model.add_bool_and([y[s, g], y[s + 1, g]]).only_enforce_if(same[g])
        change = model.new_bool_var(f"change_{s}")
        model.add_bool_or(same + [change])
        changes.append(change)
    model.add(sum(changes) <= groups - 1)


def _links(model, x, y, z, n: int, stages: int, groups: int) -> None:
    """z = x AND y."""
    for b in range(n):
        for s in range(stages):
            for g in range(groups):
                model.add_implication(z[b, s, g], x[b, s])
                model.add_implication(z[b, s, g], y[s, g])
                model.add_bool_or([x[b, s].Not(), y[s, g].Not(), z[b, s, g]])


def _memory(model, x, y, mem: StageMemory, capacities, n: int, stages: int, groups: int) -> None:
    unit = max(max(capacities), 1.0) / RESOLUTION
    for s in range(stages):
        need = [int(round((mem.static[b] + mem.in_flight[s] * mem.act[b]) / unit)) for b in range(n)]
        work = model.new_int_var(0, RESOLUTION * 4, f"work_{s}")
        for b in range(n):
            w = int(round(mem.work[b] / unit))
            if w:
                model.add(work >= w).only_enforce_if(x[b, s])
        # + n units of slack: rounding each block's bytes must not reject an exact fit
        cap = sum((int(capacities[g] / unit) + n) * y[s, g] for g in range(groups))
        model.add(sum(need[b] * x[b, s] for b in range(n)) + work <= cap)


def _hint(model, x, y, z, stage, stage_time, bottleneck, t, hint, n, stages, groups) -> None:
    bounds, group_of = hint
    stage_of = [next(s for s in range(stages) if bounds[s] <= b < bounds[s + 1]) for b in range(n)]
    for b in range(n):
        model.add_hint(stage[b], stage_of[b])
        for s in range(stages):
            model.add_hint(x[b, s], int(stage_of[b] == s))
            for g in range(groups):
                model.add_hint(z[b, s, g], int(stage_of[b] == s and group_of[s] == g))
    for s in range(stages):
        for g in range(groups):
            model.add_hint(y[s, g], int(group_of[s] == g))
    times = [sum(t[group_of[s]][b] for b in range(n) if stage_of[b] == s) for s in range(stages)]
    for s in range(stages):
        model.add_hint(stage_time[s], times[s])
    model.add_hint(bottleneck, max(times))
