"""Many jobs on one cluster: choose each job's GPU count, its nodes and its start (CP-SAT).

Data: per job a table ``GPU count -> predicted job time`` (the single-job planner's best plan for
that count, times the number of steps). Candidate counts are whole nodes (k x gpus_per_node, the
job owns k specific nodes) or a part of one node (1, 2, 4 of 8 GPUs).

Model (written like the OR-Tools scheduling samples):
- time is an integer grid of ``time_unit_s`` seconds; durations are rounded up and deadlines down,
  so a schedule that is feasible on the grid is feasible in seconds;
- per job one start, and per (job, count) an optional interval sharing that start; exactly one
  count is chosen;
- per (job, count, node) a boolean "runs on this node" with its own optional interval; a count of k
  whole nodes picks k nodes, a part-node count picks one;
- per node a cumulative constraint with capacity gpus_per_node (a whole-node job demands all of
  them, so it excludes everything else on that node; part-node jobs share a node up to its GPUs),
  plus a redundant cumulative over all GPUs that tightens the bound;
- cumulative rather than exact GPU slots: inside a node every GPU reaches every other one at the
  same speed (NVSwitch), so any free GPUs will do, and GPU ids are handed out after the solve by a
  sweep in start order (always possible when the per-node cumulative holds);
- objective: makespan (then, with the makespan fixed, the sum of completion times so nothing
  starts later than it must), or the priority-weighted sum of completion times; deadlines are
  hard constraints. A greedy list schedule is given as a hint and kept as the answer when the time
  limit ends before CP-SAT finds anything better.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Mapping

from planner.errors import InfeasibleError, SpecError

log = logging.getLogger(__name__)

OBJECTIVES = ("makespan", "weighted")
GRID_STEPS = 10_000
"""The automatic time unit makes the horizon about this many grid steps."""


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where and when one job runs."""

    name: str
    gpus: int
    """GPUs the job uses."""
    nodes: tuple[int, ...]
    """Node indices (0-based)."""
    gpu_ids: tuple[int, ...]
    """Global GPU ids: node x gpus_per_node + local index."""
    start_s: float
    """Start, seconds from the schedule's origin."""
    end_s: float
    """Predicted end, seconds from the schedule's origin."""


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """One job as the scheduler sees it."""

    name: str
    durations_s: Mapping[int, float]
    """GPU count -> predicted time of the whole job in seconds (counts that fit only)."""
    priority: int = 1
    """Weight of the job's completion time in the weighted objective."""
    deadline_s: float | None = None
    """The job must end by then (seconds from the origin); None: no deadline."""
    pinned: Placement | None = None
    """A running job: keeps its GPUs, start and end."""


@dataclass(frozen=True, kw_only=True)
class ScheduleOptions:
    """How the joint schedule is solved."""

    objective: str = "makespan"
    """makespan, or weighted (sum of priority x completion time)."""
    time_limit_s: float = 30.0
    """Seconds for CP-SAT; the best schedule found by then is returned."""
    time_unit_s: float | None = None
    """Grid resolution in seconds; None: 1, 2 or 5 x 10^k s with about GRID_STEPS steps."""
    seed: int = 0
    """CP-SAT random seed."""
    workers: int = 1
    """CP-SAT search workers; one makes the answer repeatable (same inputs, same schedule)."""

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise SpecError(f"objective: unknown objective '{self.objective}'; use makespan or "
                            "weighted")
        if not self.time_limit_s > 0:
            raise SpecError(f"time_limit: expected seconds > 0, got {self.time_limit_s!r}")
        if self.time_unit_s is not None and not self.time_unit_s > 0:
            raise SpecError(f"time_unit_s: expected seconds > 0, got {self.time_unit_s!r}")


@dataclass
class JobSchedule:
    """The answer: one placement per job (in request order) and how good it is."""

    placements: list[Placement]
    makespan_s: float
    objective: str
    status: str
    """optimal, or feasible (time limit reached; ``gap`` says how far from the bound)."""
    objective_value: float
    """In seconds (makespan) or priority x seconds (weighted)."""
    bound: float
    """Best lower bound on the objective, same unit."""
    gap: float
    """(objective - bound) / objective."""
    time_s: float
    time_unit_s: float


@dataclass(frozen=True)
class _Grid:
    """Requests on the time grid."""

    unit_s: float
    release: int
    horizon: int
    durations: list[dict[int, int]]


def candidate_counts(nodes: int, gpus_per_node: int) -> list[int]:
    """Part-node counts (powers of two below a node) and every whole-node count."""
    part = [g for g in (1, 2, 4, 8, 16, 32) if g < gpus_per_node and gpus_per_node % g == 0]
    return part + [k * gpus_per_node for k in range(1, nodes + 1)]


def nodes_needed(gpus: int, gpus_per_node: int) -> int:
    if gpus % gpus_per_node == 0:
        return gpus // gpus_per_node
    assert gpus < gpus_per_node, f"{gpus} GPUs is neither part of a node nor whole nodes"
    return 1


def solve_jobs(requests: list[JobRequest], nodes: int, gpus_per_node: int,
               options: ScheduleOptions, *, now_s: float = 0.0) -> JobSchedule:
    """The joint schedule; jobs that are not pinned start at ``now_s`` or later."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    # Data
    _check_requests(requests, nodes, gpus_per_node)
    grid = _grid(requests, options, now_s)
    greedy = greedy_schedule(requests, nodes, gpus_per_node, grid)
    # Variables
    model = cp_model.CpModel()
    v = _variables(model, requests, nodes, grid)
    # Constraints
    _one_count_per_job(model, v, requests, gpus_per_node)
    _node_capacity(model, v, requests, nodes, gpus_per_node)
    _total_capacity(model, v, nodes * gpus_per_node)
    _energy(model, v, requests, grid, nodes * gpus_per_node)
    _pins_and_deadlines(model, v, requests, grid)
    _break_symmetry(model, v, requests, grid, nodes)
    if greedy is not None:
        _hint(model, v, greedy)
    # Objective
    _objective(model, v, requests, grid, options.objective)
    # Solve
    solver = _solver(options, options.time_limit_s)
    status = solver.Solve(model)
    log.info("CP-SAT %s in %.2f s: objective %s, bound %s", solver.StatusName(status),
             solver.WallTime(), solver.ObjectiveValue() if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else "-",
             solver.BestObjectiveBound())
    if status == cp_model.INFEASIBLE:
        raise InfeasibleError(_infeasible_reason(requests), reason="no feasible schedule")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if greedy is None:
            raise InfeasibleError(f"no schedule found within the time limit of "
                                  f"{options.time_limit_s:g} s; raise --time-limit",
                                  reason="time limit")
        value = _objective_value(greedy, requests, grid, options.objective)
        placements = _placements(requests, grid, greedy, gpus_per_node)
        return _result(placements, requests, grid, options,
                       ("feasible", value, min(value, solver.BestObjectiveBound())), t0)
    solution = left_shift(_read(solver, v), requests, grid, nodes, gpus_per_node)
    word = "optimal" if status == cp_model.OPTIMAL else "feasible"
    value, bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
    placements = _placements(requests, grid, solution, gpus_per_node)
    return _result(placements, requests, grid, options, (word, value, bound), t0)


# Data ----------------------------------------------------------------------------------------


def _check_requests(requests, nodes, gpus_per_node):
    names = [r.name for r in requests]
    if len(set(names)) != len(names):
        raise SpecError(f"jobs: names must be unique; repeated: {sorted({n for n in names if names.count(n) > 1})}")
    allowed = set(candidate_counts(nodes, gpus_per_node))
    for r in requests:
        if not r.durations_s and r.pinned is None:
            raise InfeasibleError(f"job {r.name}: no GPU count fits it on this cluster",
                                  reason="job fits nowhere")
        bad = sorted(set(r.durations_s) - allowed)
        if bad:
            raise SpecError(f"job {r.name}: GPU count {bad[0]} is neither part of a node nor whole "
                            f"nodes of {gpus_per_node} (up to {nodes} nodes)")


def _grid(requests, options, now_s) -> _Grid:
    longest = sum(max(r.durations_s.values()) for r in requests if r.pinned is None)
    pinned_end = max((r.pinned.end_s for r in requests if r.pinned), default=0.0)
    horizon_s = max(now_s, pinned_end) + longest
    unit = float(options.time_unit_s or nice_unit(horizon_s / GRID_STEPS))
    durations = [{g: max(1, math.ceil(d / unit - 1e-9)) for g, d in sorted(r.durations_s.items())}
                 for r in requests]
    release = math.ceil(now_s / unit - 1e-9)
    horizon = release + sum(max(d.values()) for d, r in zip(durations, requests) if r.pinned is None)
    horizon = max([horizon] + [math.ceil(r.pinned.end_s / unit) for r in requests if r.pinned])
    return _Grid(unit_s=unit, release=release, horizon=horizon, durations=durations)


def nice_unit(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= x."""
    if x <= 0:
        return 1.0
    exp = math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * 10.0 ** exp >= x * (1 - 1e-12):
            return float(f"{m * 10.0 ** exp:.12g}")
    return 10.0 ** (exp + 1)


# Variables -----------------------------------------------------------------------------------


def _variables(model, requests, nodes, grid) -> dict:
    v = {"start": [], "end": [], "present": [], "interval": [], "on": [], "node_iv": []}
    for j, r in enumerate(requests):
        durs = grid.durations[j] if r.pinned is None else {r.pinned.gpus: _pinned_len(r, grid)}
        lo = grid.release if r.pinned is None else math.floor(r.pinned.start_s / grid.unit_s + 1e-9)
        start = model.NewIntVar(lo, grid.horizon, f"start_{j}")
        end = model.NewIntVar(lo, grid.horizon, f"end_{j}")
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
    v["makespan"] = model.NewIntVar(0, grid.horizon, "makespan")
    model.AddMaxEquality(v["makespan"], v["end"])
    return v


def _pinned_len(r: JobRequest, grid: _Grid) -> int:
    lo = math.floor(r.pinned.start_s / grid.unit_s + 1e-9)
    return max(1, math.ceil(r.pinned.end_s / grid.unit_s - 1e-9) - lo)


# Constraints ---------------------------------------------------------------------------------


def _one_count_per_job(model, v, requests, gpus_per_node):
    """Exactly one GPU count per job; k whole nodes pick k nodes, a part-node count picks one."""
    for j in range(len(requests)):
        model.AddExactlyOne(v["present"][j].values())
        for g, present in v["present"][j].items():
            on = [b for (gg, _), b in v["on"][j].items() if gg == g]
            model.Add(sum(on) == nodes_needed(g, gpus_per_node) * present)


def _node_capacity(model, v, requests, nodes, gpus_per_node):
    """Per node: the GPUs in use never exceed gpus_per_node."""
    for n in range(nodes):
        intervals, demands = [], []
        for j in range(len(requests)):
            for (g, node), iv in v["node_iv"][j].items():
                if node == n:
                    intervals.append(iv)
                    demands.append(min(g, gpus_per_node))
        model.AddCumulative(intervals, demands, gpus_per_node)


def _total_capacity(model, v, num_gpus):
    """Redundant: all GPUs together (tightens the lower bound)."""
    intervals = [iv for ivs in v["interval"] for iv in ivs.values()]
    demands = [g for ivs in v["interval"] for g in ivs]
    model.AddCumulative(intervals, demands, num_gpus)


def _energy(model, v, requests, grid, num_gpus):
    """Redundant: the GPU-time of the chosen counts fits between the release and the makespan
    (the linear form of the cumulative above; it gives CP-SAT the area lower bound)."""
    work = []
    for j, r in enumerate(requests):
        if r.pinned is None:
            work += [g * grid.durations[j][g] * p for g, p in v["present"][j].items()]
        else:
            end = math.floor(r.pinned.start_s / grid.unit_s + 1e-9) + _pinned_len(r, grid)
            work.append(r.pinned.gpus * max(0, end - grid.release))
    model.Add(sum(work) <= num_gpus * (v["makespan"] - grid.release))


def _pins_and_deadlines(model, v, requests, grid):
    """Running jobs keep start, end and nodes; deadlines bound the end of the others."""
    for j, r in enumerate(requests):
        if r.pinned is not None:
            p = r.pinned
            model.Add(v["start"][j] == math.floor(p.start_s / grid.unit_s + 1e-9))
            for (_, n), on in v["on"][j].items():
                model.Add(on == int(n in p.nodes))
        elif r.deadline_s is not None:
            model.Add(v["end"][j] <= math.floor(r.deadline_s / grid.unit_s + 1e-9))


def _break_symmetry(model, v, requests, grid, nodes):
    """Nodes are interchangeable (unless a running job is pinned): number them in the order jobs
    first use them. Identical jobs are interchangeable: the earlier in the list starts first."""
    if all(r.pinned is None for r in requests):
        uses = [[model.NewBoolVar(f"uses_{j}_node_{n}") for n in range(nodes)]
                for j in range(len(requests))]
        for j, row in enumerate(uses):
            for n, u in enumerate(row):
                model.AddMaxEquality(u, [b for (_, nn), b in v["on"][j].items() if nn == n])
                if n > 0:  # job j uses node n -> some job up to j uses node n - 1
                    model.AddBoolOr([u.Not()] + [uses[i][n - 1] for i in range(j + 1)])
    seen: dict[tuple, int] = {}
    for j, r in enumerate(requests):
        key = (tuple(grid.durations[j].items()), r.priority, r.deadline_s, r.pinned)
        if r.pinned is None and key in seen:
            model.Add(v["start"][seen[key]] <= v["start"][j])
        seen[key] = j


def _hint(model, v, greedy: list[tuple[int, int, tuple[int, ...]]]):
    for j, (start, g, on_nodes) in enumerate(greedy):
        model.AddHint(v["start"][j], start)
        for gg, present in v["present"][j].items():
            model.AddHint(present, int(gg == g))
        for (gg, n), on in v["on"][j].items():
            model.AddHint(on, int(gg == g and n in on_nodes))


# Objective -----------------------------------------------------------------------------------


def _objective(model, v, requests, grid, objective: str):
    if objective == "weighted":
        model.Minimize(sum(r.priority * end for r, end in zip(requests, v["end"])))
    else:
        model.Minimize(v["makespan"])


# Solve ---------------------------------------------------------------------------------------


def _solver(options: ScheduleOptions, limit_s: float):
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, limit_s)
    solver.parameters.random_seed = options.seed
    solver.parameters.num_workers = options.workers
    return solver


def _read(solver, v) -> list[tuple[int, int, tuple[int, ...]]]:
    """Per job (start, GPU count, nodes) on the grid."""
    starts = [solver.Value(s) for s in v["start"]]
    choice = [next(g for g, b in present.items() if solver.BooleanValue(b))
              for present in v["present"]]
    on_nodes = [tuple(sorted(n for (g, n), b in on.items() if g == c and solver.BooleanValue(b)))
                for on, c in zip(v["on"], choice)]
    return list(zip(starts, choice, on_nodes))




def _objective_value(solution, requests, grid, objective: str) -> float:
    ends = [start + (grid.durations[j].get(g) if r.pinned is None else _pinned_len(r, grid))
            for j, (r, (start, g, _)) in enumerate(zip(requests, solution))]
    if objective == "weighted":
        return float(sum(r.priority * e for r, e in zip(requests, ends)))
    return float(max(ends, default=0))


def _placements(requests, grid, solution, gpus_per_node) -> list[Placement]:
    spans = []
    for j, (r, (start, g, on_nodes)) in enumerate(zip(requests, solution)):
        length = grid.durations[j].get(g) if r.pinned is None else _pinned_len(r, grid)
        spans.append((start, start + length, g, on_nodes, r.pinned.gpu_ids if r.pinned else None))
    ids = assign_gpu_ids(spans, gpus_per_node)
    out = []
    for r, (start, _, g, on_nodes, _), gpu_ids in zip(requests, spans, ids):
        if r.pinned is not None:
            out.append(r.pinned)
            continue
        start_s = start * grid.unit_s
        out.append(Placement(name=r.name, gpus=g, nodes=on_nodes, gpu_ids=gpu_ids,
                             start_s=start_s, end_s=start_s + r.durations_s[g]))
    return out


def _result(placements, requests, grid, options, verdict, t0) -> JobSchedule:
    status, value, bound = verdict
    gap = (value - bound) / value if value > 0 else 0.0
    return JobSchedule(placements=placements,
                       makespan_s=max((p.end_s for p in placements), default=0.0),
                       objective=options.objective, status=status,
                       objective_value=value * grid.unit_s, bound=bound * grid.unit_s,
                       gap=max(0.0, gap), time_s=time.perf_counter() - t0,
                       time_unit_s=grid.unit_s)


def _infeasible_reason(requests) -> str:
    due = [f"{r.name} by {r.deadline_s:g} s" for r in requests if r.deadline_s is not None]
    if due:
        return (f"no schedule meets every deadline ({', '.join(due)}); relax a deadline, drop a "
                "job or add nodes")
    return "no schedule fits the running jobs and the cluster; check the pinned jobs"


# Greedy list schedules: the hint, the fallback, and the baselines ----------------------------


def greedy_schedule(requests, nodes, gpus_per_node, grid: _Grid):
    """The better of two list schedules on the grid (None if both miss a deadline).

    (a) every job on its fastest GPU count, one after another in the given order;
    (b) every job on its most GPU-efficient count (least GPU x time), longest first, each at its
    earliest fit.
    """
    fastest = [min(d, key=lambda g: (d[g], -g)) for d in grid.durations]
    leanest = [min(d, key=lambda g: (d[g] * g, d[g])) for d in grid.durations]
    order = sorted(range(len(requests)), key=lambda j: -grid.durations[j][leanest[j]])
    best, best_value = None, math.inf
    for counts, seq, fifo in ((fastest, range(len(requests)), True), (leanest, order, False)):
        sol = _list_place(requests, counts, grid.durations, seq, nodes, gpus_per_node,
                          grid.release, fifo, grid)
        due_ok = all(r.deadline_s is None or r.pinned is not None or
                     start + grid.durations[j][g] <= math.floor(r.deadline_s / grid.unit_s + 1e-9)
                     for j, (r, (start, g, _)) in enumerate(zip(requests, sol)))
        value = _objective_value(sol, requests, grid, "makespan")
        if due_ok and value < best_value:
            best, best_value = sol, value
    return best


def _list_place(requests, counts, durations, order, nodes, gpus_per_node, release, fifo,
                grid=None):
    """Place jobs in ``order`` at their earliest fit (FIFO: never before the previous start)."""
    occ = _Occupancy(nodes, gpus_per_node)
    sol: list = [None] * len(requests)
    for j, r in enumerate(requests):
        if r.pinned is not None:
            p = r.pinned
            start = math.floor(p.start_s / grid.unit_s + 1e-9) if grid else p.start_s
            end = start + _pinned_len(r, grid) if grid else p.end_s
            occ.add(p.nodes, start, end, p.gpus)
            sol[j] = (start, p.gpus, p.nodes)
    not_before = release
    for j in order:
        if requests[j].pinned is not None:
            continue
        g, d = counts[j], durations[j][counts[j]]
        start, on_nodes = occ.earliest(g, d, not_before)
        occ.add(on_nodes, start, start + d, g)
        sol[j] = (start, g, on_nodes)
        not_before = start if fifo else release
    return sol


def list_schedule(requests: list[JobRequest], counts: list[int], nodes: int, gpus_per_node: int,
                  *, now_s: float = 0.0, fifo: bool = True) -> list[Placement]:
    """A queue without a solver, in seconds: each job, in order, on ``counts[j]`` GPUs at its
    earliest fit (FIFO: no job starts before the one ahead of it)."""
    durations = [dict(r.durations_s) for r in requests]
    sol = _list_place(requests, counts, durations, range(len(requests)), nodes, gpus_per_node,
                      now_s, fifo)
    spans = [(s, s + (durations[j][g] if requests[j].pinned is None else
                      requests[j].pinned.end_s - s), g, on, requests[j].pinned and requests[j].pinned.gpu_ids)
             for j, (s, g, on) in enumerate(sol)]
    ids = assign_gpu_ids(spans, gpus_per_node)
    return [r.pinned or Placement(name=r.name, gpus=g, nodes=on, gpu_ids=i, start_s=s, end_s=e)
            for r, (s, e, g, on, _), i in zip(requests, spans, ids)]


def left_shift(solution, requests, grid, nodes, gpus_per_node):
    """Start every job as early as its nodes allow, in start order, keeping counts and nodes.

    Never later than before: the jobs placed ahead of a job only moved earlier, so its old start
    still fits (makespan objectives leave the non-critical jobs anywhere up to the makespan)."""
    occ, out = _Occupancy(nodes, gpus_per_node), list(solution)
    for j, r in enumerate(requests):
        if r.pinned is not None:
            start, g, on_nodes = solution[j]
            occ.add(on_nodes, start, start + _pinned_len(r, grid), g)
    for j in sorted(range(len(requests)), key=lambda j: (solution[j][0], j)):
        if requests[j].pinned is not None:
            continue
        start, g, on_nodes = solution[j]
        d = grid.durations[j][g]
        new = occ.earliest_on(on_nodes, g, d, grid.release, start)
        occ.add(on_nodes, new, new + d, g)
        out[j] = (new, g, on_nodes)
    return out


class _Occupancy:
    """Reservations per node: (start, end, GPUs)."""

    def __init__(self, nodes: int, gpus_per_node: int):
        self.booked: list[list[tuple]] = [[] for _ in range(nodes)]
        self.gpus_per_node = gpus_per_node

    def add(self, on_nodes, start, end, gpus):
        for n in on_nodes:
            self.booked[n].append((start, end, min(gpus, self.gpus_per_node)))

    def used(self, n, t0, t1):
        points = [t0] + [s for s, _, _ in self.booked[n] if t0 < s < t1]
        return max(sum(g for s, e, g in self.booked[n] if s <= p < e) for p in points)

    def earliest(self, gpus, duration, not_before):
        times = sorted({not_before} | {e for b in self.booked for _, e, _ in b if e > not_before})
        k = nodes_needed(gpus, self.gpus_per_node)
        for t in times:
            if gpus >= self.gpus_per_node:
                free = [n for n in range(len(self.booked)) if self.used(n, t, t + duration) == 0]
                if len(free) >= k:
                    return t, tuple(free[:k])
                continue
            fits = [(-u, n) for n in range(len(self.booked))
                    if (u := self.used(n, t, t + duration)) + gpus <= self.gpus_per_node]
            if fits:
                return t, (min(fits)[1],)  # best fit: the fullest node that still has room
        raise AssertionError(f"no room for {gpus} GPUs even when the cluster is empty")

    def earliest_on(self, on_nodes, gpus, duration, not_before, latest):
        """The earliest start on these nodes; ``latest`` is known to fit."""
        times = sorted({not_before, latest} | {e for n in on_nodes for _, e, _ in self.booked[n]
                                               if not_before < e < latest})
        need = min(gpus, self.gpus_per_node)
        return next(t for t in times
                    if all(self.used(n, t, t + duration) + need <= self.gpus_per_node
                           for n in on_nodes))


def assign_gpu_ids(spans, gpus_per_node) -> list[tuple[int, ...]]:
    """GPU ids per job from (start, end, gpus, nodes, pinned ids or None), sweeping in start order;
    part-node jobs get a contiguous aligned block when one is free."""
    free_at: dict[int, float] = {}
    out: list = [None] * len(spans)
    order = sorted(range(len(spans)), key=lambda j: (spans[j][4] is None, spans[j][0], j))
    for j in order:
        start, end, gpus, on_nodes, pinned = spans[j]
        if pinned is not None:
            ids = tuple(pinned)
        elif gpus >= gpus_per_node:
            ids = tuple(n * gpus_per_node + i for n in on_nodes for i in range(gpus_per_node))
        else:
            ids = _pick_ids(on_nodes[0], gpus, gpus_per_node, free_at, start)
        assert all(free_at.get(i, -math.inf) <= start for i in ids), f"GPU clash for job {j}"
        for i in ids:
            free_at[i] = end
        out[j] = ids
    return out


def _pick_ids(node, gpus, gpus_per_node, free_at, start) -> tuple[int, ...]:
    base = node * gpus_per_node
    free = [base + i for i in range(gpus_per_node) if free_at.get(base + i, -math.inf) <= start]
    for lo in range(base, base + gpus_per_node, gpus):  # aligned blocks first
        block = tuple(range(lo, lo + gpus))
        if all(i in free for i in block):
            return block
    assert len(free) >= gpus, f"node {node} has {len(free)} free GPUs, {gpus} needed"
    return tuple(free[:gpus])
