"""Many jobs on one cluster: choose each job's GPU count, its nodes and its start (CP-SAT).

Data: per job a table ``GPU count -> predicted job time`` (the single-job planner's best plan for
that count, times its steps). Counts are whole nodes (k x gpus_per_node on k specific nodes) or part
of one node (1, 2, 4 of 8 GPUs).

Model (laid out like the OR-Tools scheduling samples):
- time is an integer grid of ``time_unit_s`` seconds; durations round up and deadlines down, so a
  schedule feasible on the grid is feasible in seconds;
- per job one start, and per (job, count) an optional interval on that start: exactly one count;
- per (job, count, node) a boolean "runs on this node" with its own optional interval: k whole
  nodes pick k nodes, a part-node count picks one;
- per node a cumulative of capacity gpus_per_node: a whole-node job demands all of it, part-node
  jobs share the node. Cumulative, not per-GPU slots: inside a node every GPU reaches every other at
  the same speed (NVSwitch), so any free GPUs will do; GPU ids are handed out after the solve by a
  sweep in start order, which always succeeds when the per-node cumulative holds;
- redundant: a cumulative over all GPUs and its linear form (chosen GPU x time <= GPUs x makespan),
  which gives CP-SAT the area lower bound; node and identical-job symmetries are broken;
- running jobs (re-planning) keep their count, nodes, start and end; deadlines bound the ends;
- objective: makespan, or sum of priority x completion time. A greedy list schedule is the hint,
  and the answer if the time limit ends before CP-SAT finds one;
- ties: once CP-SAT has proved the objective optimal, a second solve (at most a quarter of the
  time limit, within it) keeps it at that value on the grid and breaks ties (TIE_BREAK): the
  makespan's by the jobs' ends and the GPU time they hold, the weighted objective's by GPU time
  alone; its schedule is taken unless, in exact seconds, its objective is worse than the first's.
  Without it, schedules of the same objective are told apart by nothing: a job whose time does not
  shrink on more GPUs may hold 4 where 1 runs as fast, and jobs may end later than they could.
  Afterwards every job is shifted as early as its nodes allow.

Here: the answer, the CP-SAT model and solve_jobs (its options are planner.options.ScheduleOptions). The requests, placements and time
grid are planner.solve.job_grid; the list schedules, the left shift and GPU ids
planner.solve.job_queue.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass


from planner.errors import InfeasibleError, SpecError
from planner.options import ScheduleOptions
from planner.solve import cpsat
from planner.solve.job_grid import (EPS, Grid, JobRequest, Placement, in_seconds, nodes_needed,
                                    on_grid)
from planner.solve.job_queue import assign_gpu_ids, greedy_schedule, left_shift, objective_value

log = logging.getLogger(__name__)

@dataclass
class JobSchedule:
    """The answer: one placement per job (in request order) and how good it is."""

    placements: list[Placement]
    makespan_s: float
    objective: str
    status: str
    """optimal, or feasible (time limit reached; ``gap`` says how far from the bound)."""
    objective_value: float
    """On the grid, in seconds (makespan) or priority x seconds (weighted)."""
    bound: float
    """Best lower bound on the objective, same unit."""
    gap: float
    """(objective - bound) / objective."""
    time_s: float
    time_unit_s: float
    tie_break: str = "not run"
    """The second solve's status: optimal or feasible (its limit ended it), its schedule taken;
    none found (its limit ended it first); discarded (equal on the grid, worse in exact seconds:
    the first's kept); not run (the first was not proved optimal within the time limit)."""


TIE_BREAK = {"makespan": "the jobs' ends and GPU time: sum of priority x end + GPU-seconds / GPUs",
             "weighted": "GPU time: sum of GPUs x seconds"}
"""What the second solve minimizes, per objective, with the objective held at its optimum. For
the makespan: sum(priority x end) + sum(GPUs x duration) / GPUs in the cluster, both in seconds:
a job's GPU time counts as the time it would hold the whole cluster."""
TIE_BREAK_SHARE = 0.25
"""The second solve runs at most this share of the time limit in CP-SAT's deterministic time (and
never past the time limit): proving its optimum can take far longer than the first's, and a
schedule of the optimal objective is in hand."""


def candidate_counts(nodes: int, gpus_per_node: int) -> list[int]:
    """Part-node counts (powers of two below a node) and every whole-node count."""
    part = [g for g in (1, 2, 4, 8, 16, 32) if g < gpus_per_node and gpus_per_node % g == 0]
    return part + [k * gpus_per_node for k in range(1, nodes + 1)]


def solve_jobs(requests: list[JobRequest], nodes: int, gpus_per_node: int,
               options: ScheduleOptions, *, now_s: float = 0.0) -> JobSchedule:
    """The joint schedule; jobs that are not pinned start at ``now_s`` or later."""
    t0 = time.perf_counter()
    # Data
    _check(requests, nodes, gpus_per_node)
    grid = on_grid(requests, now_s, options.time_unit_s)
    greedy = greedy_schedule(requests, grid, nodes, gpus_per_node)
    # Variables, constraints, objective
    model, v = _model(requests, grid, nodes, gpus_per_node, greedy, options.objective)
    # Solve
    verdict, first = _solve(model, v, requests, grid, greedy, options, nodes * gpus_per_node)
    secs = in_seconds(requests, now_s)  # exact durations: starts move earlier, never later

    def exact(sol):
        return left_shift(requests, secs, [(s * grid.unit_s, g, on) for s, g, on in sol],
                          nodes, gpus_per_node)

    solution = exact(first)
    second, tie = _tie_break(model, v, requests, grid, options, verdict, first,
                             nodes * gpus_per_node, time.perf_counter() - t0)
    if second is not None:  # equal on the grid; in exact seconds it may come out worse
        shifted = exact(second)
        if objective_value(shifted, requests, secs, options.objective) <= \
                objective_value(solution, requests, secs, options.objective) + 1e-6:
            solution = shifted
        else:
            tie = "discarded"
    return _answer(requests, secs, solution, gpus_per_node, options, verdict, grid.unit_s, t0,
                   tie)


def _model(requests, grid, nodes, gpus_per_node, greedy, objective: str):
    from ortools.sat.python import cp_model  # lazy: 0.2 s that plan show and diff need not wait

    model = cp_model.CpModel()
    # Variables
    v = _variables(model, grid, nodes)
    # Constraints
    _one_count_per_job(model, v, gpus_per_node)
    _node_capacity(model, v, nodes, gpus_per_node)
    _total_capacity(model, v, grid, nodes * gpus_per_node)
    _pins_and_deadlines(model, v, requests, grid)
    _break_symmetry(model, v, requests, grid, nodes)
    if greedy is not None:
        _hint(model, v, greedy)
    # Objective
    model.Minimize(v["makespan"] if objective == "makespan" else _weighted(requests, v["end"]))
    return model, v


def _weighted(requests, ends):
    """The weighted objective: sum of priority x end."""
    return sum(r.priority * e for r, e in zip(requests, ends))


def _solve(model, v, requests, grid, greedy, options, num_gpus):
    """-> ((status, objective, bound), per job (start, count, nodes)) on the grid."""
    log.info("scheduling %d jobs with CP-SAT (objective %s, at most %g s) ...", len(requests),
             options.objective, options.time_limit_s)
    res = cpsat.solve(model, time_limit_s=options.time_limit_s, seed=options.seed,
                      workers=options.workers)
    log.info("CP-SAT %s in %.2f s (%d jobs, grid %g s)", res.status.upper(), res.wall_s,
             len(requests), grid.unit_s)
    if res.status == "infeasible":
        raise InfeasibleError(_infeasible_reason(requests, grid.unit_s),
                              reason="no feasible schedule")
    if res.found:
        return (res.status, res.objective, res.bound), _read(res.solver, v)
    if greedy is None:
        raise InfeasibleError(f"no schedule found within the time limit of "
                              f"{options.time_limit_s:g} s; raise --time-limit",
                              reason="time limit")
    # the time limit ended before CP-SAT found a schedule: keep the greedy one
    value = objective_value(greedy, requests, grid, options.objective)
    bound = max(res.solver.best_objective_bound,
                simple_bound(requests, grid, num_gpus, options.objective))
    return ("feasible", value, min(value, bound)), greedy


def _tie_break(model, v, requests, grid, options, verdict, solution, num_gpus: int,
               spent_s: float):
    """The schedule among those of the optimal objective (on the grid) that TIE_BREAK prefers;
    -> (per job (start, count, nodes) or None, the second solve's status). Its limit is CP-SAT's
    deterministic time (TIE_BREAK_SHARE of the time limit), so that the same inputs give the same
    schedule however busy the machine, and the wall-clock time left as a cap."""
    left = options.time_limit_s - spent_s
    if verdict[0] != "optimal" or left < 0.05:
        return None, "not run"
    ends = sum(r.priority * e for r, e, f in zip(requests, v["end"], grid.fixed) if f is None)
    area = sum(g * d * present[g] for durs, present, f in zip(grid.durations, v["present"],
                                                               grid.fixed) if f is None
               for g, d in durs.items())
    if options.objective == "makespan":
        model.Add(v["makespan"] <= round(verdict[1]))
        model.Minimize(num_gpus * ends + area)
    else:
        model.Add(_weighted(requests, v["end"]) <= round(verdict[1]))
        model.Minimize(area)
    model.ClearHints()
    _hint(model, v, solution)
    res = cpsat.solve(model, time_limit_s=left, seed=options.seed, workers=options.workers,
                      deterministic_s=TIE_BREAK_SHARE * options.time_limit_s)
    log.info("ties broken by %s: CP-SAT %s in %.2f s", TIE_BREAK[options.objective],
             res.status.upper(), res.wall_s)
    if not res.found:
        return None, "none found"
    return _read(res.solver, v), res.status


# Data ----------------------------------------------------------------------------------------


def _check(requests, nodes, gpus_per_node):
    names = [r.name for r in requests]
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise SpecError(f"jobs: names must be unique; '{twice[0]}' is repeated")
    allowed = set(candidate_counts(nodes, gpus_per_node))
    for r in requests:
        if not r.durations_s and r.pinned is None:
            raise InfeasibleError(f"job {r.name}: no GPU count fits it on this cluster (the "
                                  "warning before this says what it needs on the most GPUs): "
                                  "where its model states fill them, a cluster with more or "
                                  "larger GPUs; where its activations do, a smaller batch",
                                  reason="job fits nowhere")
        bad = sorted(set(r.durations_s) - allowed)
        if bad:
            raise SpecError(f"job {r.name}: {bad[0]} GPUs is neither part of a node nor whole "
                            f"nodes of {gpus_per_node} (up to {nodes} nodes)")


# Variables -----------------------------------------------------------------------------------


def _variables(model, grid: Grid, nodes: int) -> dict:
    v = {"start": [], "end": [], "present": [], "interval": [], "on": [], "node_iv": []}
    horizon = grid.horizon
    for j, (durs, fixed) in enumerate(zip(grid.durations, grid.fixed)):
        lo = grid.release if fixed is None else fixed
        start = model.NewIntVar(lo, horizon, f"start_{j}")
        end = model.NewIntVar(lo, horizon, f"end_{j}")
        present, iv, on, node_iv = {}, {}, {}, {}
        for g, d in durs.items():
            present[g] = model.NewBoolVar(f"uses_{j}_{g}")
            iv[g] = model.NewOptionalFixedSizeIntervalVar(start, d, present[g], f"iv_{j}_{g}")
            for n in range(nodes):
                on[g, n] = model.NewBoolVar(f"on_{j}_{g}_{n}")
                node_iv[g, n] = model.NewOptionalFixedSizeIntervalVar(start, d, on[g, n],
                                                                      f"iv_{j}_{g}_{n}")
        model.Add(end == start + sum(d * present[g] for g, d in durs.items()))
        for key, val in zip(v, (start, end, present, iv, on, node_iv)):
            v[key].append(val)
    v["makespan"] = model.NewIntVar(0, horizon, "makespan")
    model.AddMaxEquality(v["makespan"], v["end"])
    return v


# Constraints ---------------------------------------------------------------------------------


def _one_count_per_job(model, v, gpus_per_node):
    """Exactly one GPU count per job; k whole nodes pick k nodes, a part-node count picks one."""
    for present, on in zip(v["present"], v["on"]):
        model.AddExactlyOne(present.values())
        for g, chosen in present.items():
            model.Add(sum(b for (gg, _), b in on.items() if gg == g)
                      == nodes_needed(g, gpus_per_node) * chosen)


def _node_capacity(model, v, nodes, gpus_per_node):
    """Per node: the GPUs in use never exceed gpus_per_node."""
    for n in range(nodes):
        jobs = [(iv, min(g, gpus_per_node)) for ivs in v["node_iv"] for (g, nn), iv in ivs.items()
                if nn == n]
        model.AddCumulative([iv for iv, _ in jobs], [g for _, g in jobs], gpus_per_node)


def _total_capacity(model, v, grid, num_gpus):
    """Redundant: all GPUs together, as a cumulative and as GPU x time <= GPUs x makespan."""
    model.AddCumulative([iv for ivs in v["interval"] for iv in ivs.values()],
                        [g for ivs in v["interval"] for g in ivs], num_gpus)
    work = []
    for durs, present, fixed in zip(grid.durations, v["present"], grid.fixed):
        if fixed is None:
            work += [g * d * present[g] for g, d in durs.items()]
        else:  # a running job: only its work after the release counts
            ((g, d),) = durs.items()
            work.append(g * max(0, fixed + d - grid.release))
    model.Add(sum(work) <= num_gpus * (v["makespan"] - grid.release))


def _pins_and_deadlines(model, v, requests, grid):
    """Running jobs keep start and nodes (their count is their only one); deadlines bound ends."""
    for j, (r, fixed) in enumerate(zip(requests, grid.fixed)):
        if fixed is not None:
            model.Add(v["start"][j] == fixed)
            for (_, n), on in v["on"][j].items():
                model.Add(on == int(n in r.pinned.nodes))
        elif r.deadline_s is not None:
            model.Add(v["end"][j] <= math.floor(r.deadline_s / grid.unit_s + EPS))


def _break_symmetry(model, v, requests, grid, nodes):
    """Nodes are interchangeable (unless a running job is pinned): number them in the order jobs
    first use them. Identical jobs are interchangeable: the earlier listed starts first."""
    if all(f is None for f in grid.fixed):
        uses = [[model.NewBoolVar(f"uses_{j}_node_{n}") for n in range(nodes)]
                for j in range(len(requests))]
        for j, row in enumerate(uses):
            for n, u in enumerate(row):
                model.AddMaxEquality(u, [b for (_, nn), b in v["on"][j].items() if nn == n])
                if n > 0:  # job j uses node n -> some job up to j uses node n - 1
                    model.AddBoolOr([u.Not()] + [uses[i][n - 1] for i in range(j + 1)])
    first: dict[tuple, int] = {}
    for j, r in enumerate(requests):
        if grid.fixed[j] is None:
            key = (tuple(grid.durations[j].items()), r.priority, r.deadline_s)
            if key in first:
                model.Add(v["start"][first[key]] <= v["start"][j])
            first.setdefault(key, j)


def _hint(model, v, solution):
    for j, (start, g, on_nodes) in enumerate(solution):
        model.AddHint(v["start"][j], start)
        for gg, present in v["present"][j].items():
            model.AddHint(present, int(gg == g))
        for (gg, n), on in v["on"][j].items():
            model.AddHint(on, int(gg == g and n in on_nodes))


# Solution ------------------------------------------------------------------------------------


def _read(solver, v) -> list[tuple[int, int, tuple[int, ...]]]:
    """Per job (start, GPU count, nodes) on the grid."""
    out = []
    for start, present, on in zip(v["start"], v["present"], v["on"]):
        g = next(g for g, b in present.items() if solver.BooleanValue(b))
        nodes = tuple(sorted(n for (gg, n), b in on.items() if gg == g and solver.BooleanValue(b)))
        out.append((solver.Value(start), g, nodes))
    return out


def simple_bound(requests, grid: Grid, num_gpus: int, objective: str) -> float:
    """A lower bound without search: each job alone on its fastest count (weighted: the sum of
    those ends), and for the makespan also all work on its leanest count spread over every GPU."""
    ends, work = [], 0
    for durs, fixed in zip(grid.durations, grid.fixed):
        if fixed is None:
            ends.append(grid.release + min(durs.values()))
            work += min(g * d for g, d in durs.items())
        else:
            ((g, d),) = durs.items()
            ends.append(fixed + d)
            work += g * max(0, fixed + d - grid.release)
    if objective == "weighted":
        return float(sum(r.priority * e for r, e in zip(requests, ends)))
    return float(max(max(ends, default=0), grid.release + math.ceil(work / num_gpus)))


def _answer(requests, secs, solution, gpus_per_node, options, verdict, unit_s, t0,
            tie: str) -> JobSchedule:
    ids = assign_gpu_ids(requests, secs, solution, gpus_per_node)
    placements = [r.pinned or Placement(name=r.name, gpus=g, nodes=on_nodes, gpu_ids=gpu_ids,
                                        start_s=start, end_s=start + r.durations_s[g])
                  for r, (start, g, on_nodes), gpu_ids in zip(requests, solution, ids)]
    status, value, bound = verdict
    return JobSchedule(placements=placements,
                       makespan_s=max((p.end_s for p in placements), default=0.0),
                       objective=options.objective, status=status,
                       objective_value=value * unit_s, bound=bound * unit_s,
                       gap=max(0.0, (value - bound) / value) if value > 0 else 0.0,
                       time_s=time.perf_counter() - t0, time_unit_s=unit_s, tie_break=tie)


def _span(s: float) -> str:
    """Seconds in the unit the schedule's report uses for them (h, min or s)."""
    return next(f"{s / unit:.3g} {name}" for unit, name in ((3600, "h"), (60, "min"), (1, "s"))
                if abs(s) >= unit or unit == 1)


def _infeasible_reason(requests, unit_s: float) -> str:
    due, grid = [], False
    for r in (r for r in requests if r.deadline_s is not None):
        best = min(r.durations_s.values()) if r.durations_s else None
        close = best is not None and best <= r.deadline_s < best + unit_s
        grid = grid or close  # (rounded to the grid, the fastest run ends past the deadline)
        span = (lambda s: f"{s:.2f} s") if close else _span
        due.append(f"{r.name} by {span(r.deadline_s)}" + (
            f", at best {span(best)} on {min(r.durations_s, key=r.durations_s.get)} GPUs alone"
            if best is not None else ""))
    if due:
        return (f"no schedule meets every deadline ({', '.join(due)}); relax a deadline, drop a "
                "job or add nodes" + (f" (the solve rounds each run up to its {unit_s:g} s "
                                      "grid: give a deadline at least one step past the run's "
                                      "time, or a finer --time-unit)" if grid else ""))
    return "no schedule fits the running jobs on this cluster; check --done and --now"
