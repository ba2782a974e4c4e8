"""List schedules of many jobs on one cluster (the problem itself is planner.solve.job_grid):

- greedy_schedule: the CP-SAT model's hint (planner.solve.job_schedule), and its answer if the time
  limit ends first;
- list_place / list_schedule: running jobs stay, the others at their earliest fit in a given order
  (list_schedule is the first-in first-out queue of the baselines, in seconds);
- left_shift: every job as early as its nodes allow, keeping counts and nodes;
- _Occupancy: per-node reservations (start, end, GPUs) behind all of these;
- assign_gpu_ids: GPU ids per job by a sweep in start order;
- objective_value: makespan or weighted completion time of a (start, count, nodes) solution.
"""

from __future__ import annotations

import math

from planner.solve.job_grid import EPS, Grid, JobRequest, Placement, in_seconds, nodes_needed

def greedy_schedule(requests, grid: Grid, nodes: int, gpus_per_node: int):
    """The better of two list schedules (None if both miss a deadline): every job on its fastest
    count one after another in the given order, or every job on its leanest count (least GPU x
    time), longest first, each at its earliest fit."""
    jobs = range(len(requests))
    fastest = [min(d, key=lambda g: (d[g], -g)) for d in grid.durations]
    leanest = [min(d, key=lambda g: (d[g] * g, d[g])) for d in grid.durations]
    by_length = sorted(jobs, key=lambda j: -grid.durations[j][leanest[j]])
    best, best_value = None, math.inf
    for counts, order, fifo in ((fastest, jobs, True), (leanest, by_length, False)):
        sol = list_place(requests, grid, counts, order, nodes, gpus_per_node, fifo=fifo)
        late = any(r.deadline_s is not None and f is None and
                   s + grid.durations[j][g] > math.floor(r.deadline_s / grid.unit_s + EPS)
                   for j, (r, f, (s, g, _)) in enumerate(zip(requests, grid.fixed, sol)))
        value = objective_value(sol, requests, grid, "makespan")
        if not late and value < best_value:
            best, best_value = sol, value
    return best


def objective_value(solution, requests, grid: Grid, objective: str) -> float:
    ends = [s + grid.durations[j][g] for j, (s, g, _) in enumerate(solution)]
    if objective == "weighted":
        return float(sum(r.priority * e for r, e in zip(requests, ends)))
    return float(max(ends, default=0))


def list_place(requests, grid: Grid, counts, order, nodes, gpus_per_node, *, fifo: bool):
    """Running jobs where they are, then the others in ``order`` at their earliest fit on
    ``counts[j]`` GPUs (fifo: never before the job ahead starts).

    Returns per job (start, count, nodes)."""
    occ = _Occupancy(nodes, gpus_per_node)
    sol: list = [None] * len(requests)
    for j, (r, fixed) in enumerate(zip(requests, grid.fixed)):
        if fixed is not None:
            sol[j] = occ.add(r.pinned.nodes, fixed, grid.durations[j][r.pinned.gpus], r.pinned.gpus)
    not_before = grid.release
    for j in order:
        if grid.fixed[j] is None:
            g = counts[j]
            start, on_nodes = occ.earliest(g, grid.durations[j][g], not_before)
            sol[j] = occ.add(on_nodes, start, grid.durations[j][g], g)
            not_before = start if fifo else grid.release
    return sol


def list_schedule(requests: list[JobRequest], counts: list[int], nodes: int, gpus_per_node: int,
                  *, now_s: float = 0.0, order=None) -> list[Placement]:
    """A first-in first-out queue, in seconds: each job in turn (``order``, default the given
    one) on ``counts[j]`` GPUs at its earliest fit, never before the job ahead of it starts
    (running jobs stay)."""
    grid = in_seconds(requests, now_s)
    sol = list_place(requests, grid, counts, range(len(requests)) if order is None else order,
                     nodes, gpus_per_node, fifo=True)
    ids = assign_gpu_ids(requests, grid, sol, gpus_per_node)
    return [r.pinned or Placement(name=r.name, gpus=g, nodes=on, gpu_ids=i, start_s=s,
                                  end_s=s + grid.durations[j][g])
            for j, (r, (s, g, on), i) in enumerate(zip(requests, sol, ids))]


def left_shift(requests, grid: Grid, solution, nodes: int, gpus_per_node: int):
    """Start every job as early as its nodes allow, in start order, keeping counts and nodes.

    Never later than before: the jobs placed ahead of a job only moved earlier, so its old start
    still fits (and ``grid`` may hold exact durations no longer than those that were solved)."""
    occ, out = _Occupancy(nodes, gpus_per_node), list(solution)
    for j, fixed in enumerate(grid.fixed):
        if fixed is not None:
            _, g, on_nodes = solution[j]
            out[j] = occ.add(on_nodes, fixed, grid.durations[j][g], g)
    for j in sorted(range(len(solution)), key=lambda j: (solution[j][0], j)):
        if grid.fixed[j] is None:
            start, g, on_nodes = solution[j]
            d = grid.durations[j][g]
            out[j] = occ.add(on_nodes, occ.earliest_on(on_nodes, g, d, grid.release, start), d, g)
    return out


class _Occupancy:
    """Reservations per node: (start, end, GPUs)."""

    def __init__(self, nodes: int, gpus_per_node: int):
        self.booked: list[list[tuple]] = [[] for _ in range(nodes)]
        self.gpus_per_node = gpus_per_node

    def add(self, on_nodes, start, duration, gpus):
        for n in on_nodes:
            self.booked[n].append((start, start + duration, min(gpus, self.gpus_per_node)))
        return start, gpus, tuple(on_nodes)

    def fits(self, n, gpus, t0, t1) -> bool:
        points = [t0] + [s for s, _, _ in self.booked[n] if t0 < s < t1]
        used = max(sum(g for s, e, g in self.booked[n] if s <= p < e) for p in points)
        return used + min(gpus, self.gpus_per_node) <= self.gpus_per_node

    def load(self, n, t) -> int:
        return sum(g for s, e, g in self.booked[n] if s <= t < e)

    def earliest(self, gpus, duration, not_before):
        """Earliest start and nodes: whole nodes lowest first, part of a node best fit."""
        k = nodes_needed(gpus, self.gpus_per_node)
        for t in sorted({not_before} | {e for b in self.booked for _, e, _ in b if e > not_before}):
            free = [n for n in range(len(self.booked)) if self.fits(n, gpus, t, t + duration)]
            if len(free) >= k:
                if gpus < self.gpus_per_node:  # the fullest node that still has room
                    free = sorted(free, key=lambda n: (-self.load(n, t), n))
                return t, tuple(sorted(free[:k]))
        raise AssertionError(f"no room for {gpus} GPUs even on an empty cluster")

    def earliest_on(self, on_nodes, gpus, duration, not_before, latest):
        """The earliest start on these nodes; ``latest`` is known to fit."""
        times = {not_before, latest} | {e for n in on_nodes for _, e, _ in self.booked[n]
                                        if not_before < e < latest}
        return next((t for t in sorted(times)
                     if all(self.fits(n, gpus, t, t + duration) for n in on_nodes)), latest)


def assign_gpu_ids(requests, grid: Grid, solution, gpus_per_node) -> list[tuple[int, ...]]:
    """GPU ids per job, sweeping in start order (running jobs keep theirs); part-node jobs get an
    aligned block of consecutive ids when one is free."""
    free_at: dict[int, float] = {}
    out: list = [None] * len(solution)
    for j in sorted(range(len(solution)), key=lambda j: (grid.fixed[j] is None, solution[j][0], j)):
        start, g, on_nodes = solution[j]
        if requests[j].pinned is not None:
            ids = tuple(requests[j].pinned.gpu_ids)
        elif g >= gpus_per_node:
            ids = tuple(n * gpus_per_node + i for n in on_nodes for i in range(gpus_per_node))
        else:
            base = on_nodes[0] * gpus_per_node
            free = [base + i for i in range(gpus_per_node)
                    if free_at.get(base + i, -math.inf) <= start]
            blocks = [tuple(range(lo, lo + g)) for lo in range(base, base + gpus_per_node, g)]
            ids = next((b for b in blocks if set(b) <= set(free)), tuple(free[:g]))
        assert len(ids) == g and all(free_at.get(i, -math.inf) <= start for i in ids), \
            f"GPU clash for job {requests[j].name}"
        for i in ids:
            free_at[i] = start + grid.durations[j][g]
        out[j] = ids
    return out
