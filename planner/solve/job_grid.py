"""The problem of scheduling many jobs on one cluster: per-job records (``JobRequest`` in,
``Placement`` out), the integer time grid the requests are put on (``Grid``, ``on_grid``,
``nice_unit``) and how many nodes a GPU count takes. The CP-SAT model (planner.solve.job_schedule)
and the list schedules (planner.solve.job_queue) both work on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

GRID_STEPS = 10_000
"""The automatic time unit makes the horizon about this many grid steps."""
EPS = 1e-9


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
    """GPU count -> predicted seconds for the whole job (only counts where it fits)."""
    priority: int = 1
    """Weight of its completion time in the weighted objective."""
    deadline_s: float | None = None
    """It must end by then (seconds from the origin); None: no deadline."""
    pinned: Placement | None = None
    """A running job: keeps its GPUs, start and end."""


@dataclass(frozen=True)
class Grid:
    """The requests in grid units (or in seconds, for list schedules: unit 1)."""

    unit_s: float
    release: float
    """Earliest start of the jobs that are not pinned."""
    durations: list[dict]
    """Per job: GPU count -> duration (a pinned job: its own count only)."""
    fixed: list
    """Per job: its start if pinned, else None."""

    @property
    def horizon(self) -> int:
        ends = [s + max(d.values()) for s, d in zip(self.fixed, self.durations) if s is not None]
        free = sum(max(d.values()) for s, d in zip(self.fixed, self.durations) if s is None)
        return math.ceil(max(ends + [self.release]) + free)


def nodes_needed(gpus: int, gpus_per_node: int) -> int:
    if gpus % gpus_per_node == 0:
        return gpus // gpus_per_node
    assert gpus < gpus_per_node, f"{gpus} GPUs is neither part of a node nor whole nodes"
    return 1


def in_seconds(requests, now_s: float) -> Grid:
    """The requests on a grid of one second, unrounded (the list schedules' view)."""
    return Grid(unit_s=1.0, release=now_s,
                durations=[({r.pinned.gpus: r.pinned.end_s - r.pinned.start_s} if r.pinned
                            else dict(r.durations_s)) for r in requests],
                fixed=[r.pinned.start_s if r.pinned else None for r in requests])


def on_grid(requests, now_s: float, unit_s: float | None) -> Grid:
    """The requests in integer grid units of ``unit_s`` seconds (None: 1, 2 or 5 x 10^k s, about
    GRID_STEPS steps over the horizon): durations round up, pinned starts down."""
    secs = in_seconds(requests, now_s)
    unit = float(unit_s or nice_unit(secs.horizon / GRID_STEPS))
    fixed = [None if s is None else math.floor(s / unit + EPS) for s in secs.fixed]
    durations = []
    for s, d, f in zip(secs.fixed, secs.durations, fixed):
        if f is None:
            durations.append({g: max(1, math.ceil(x / unit - EPS)) for g, x in sorted(d.items())})
        else:  # pinned: from the grid cell of its start to the one holding its end
            ((g, x),) = d.items()
            durations.append({g: max(1, math.ceil((s + x) / unit - EPS) - f)})
    return Grid(unit_s=unit, release=math.ceil(now_s / unit - EPS), durations=durations,
                fixed=fixed)


def nice_unit(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= x (1 s for a zero horizon)."""
    if x <= 0:
        return 1.0
    exp = math.floor(math.log10(x))
    return next(float(f"{m * 10.0 ** exp:.12g}") for m in (1, 2, 5, 10)
                if m * 10.0 ** exp >= x * (1 - 1e-12))
