"""The search: one loop over the space for every kind of cluster, keeping the top k within a time limit.

The space (planner.search.space) comes grouped by the knobs per-block costs depend on (tp, sequence
parallel, recomputation, micro-batch); a pricer computes those costs once per group and prices each
configuration of it: on one device type the chain split and closed forms (planner.search.evaluate),
on device groups the group orders and per-device split (planner.search.hetero). Before pricing, a
configuration whose weights alone cannot fit, or whose lower bound (the pipeline on perfectly
balanced stages, each block on its fastest device) cannot enter the top k, is set aside with its
reason. The top k are then refined (exact stage assignment by CP-SAT where it applies, and
simulation of the schedule) and re-ranked.

Status: ``optimal`` (under the cost model) when every configuration was considered and the best
plan's stage split is proven optimal; ``feasible`` when the time limit stopped the enumeration (gap
unknown: None) or CP-SAT did not prove the split optimal (its gap). The time limit stops the
enumeration only once one configuration has been priced, so a search with a limit always returns a
plan when one is found at all.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from costmodels import memory
from costmodels.errors import InfeasibleError
from costmodels.topology import HeteroCluster
from planner.options import Config, SearchOptions, TrainingSpec
from planner.search import hetero
from planner.search.costs import ModelArrays, block_costs, capacity_bytes
from planner.search.evaluate import evaluate
from planner.search.pricing import Estimate
from planner.search.refine import cpsat_budget_s, refine, simulated
from planner.search.space import CostKey, Space, enumerate_space
from planner.trace.graph import BlockGraph

TIME_LIMIT = "not evaluated (time limit)"
OUT_OF_MEMORY = "out of memory"
DOMINATED = "dominated (bound)"
SLOWER = "slower than the top k"


@dataclass
class SearchResult:
    best: Estimate | None
    alternatives: list[Estimate]
    candidates: int
    evaluated: int
    rejected: Counter = field(default_factory=Counter)
    status: str = "optimal"
    time_s: float = 0.0
    gap: float | None = 0.0
    """Relative gap of the stage split (CP-SAT) when not proven optimal; None when unknown (the
    time limit stopped the enumeration of configurations)."""


class _Pricer:
    """Prices configurations on one device type (see the module docstring)."""

    def __init__(self, bg: BlockGraph, ma: ModelArrays, cluster, training: TrainingSpec,
                 options: SearchOptions):
        self.bg, self.ma, self.cluster, self.training, self.options = bg, ma, cluster, training, options
        self.capacity = self.largest_capacity()

    def largest_capacity(self) -> float:
        """Usable bytes per GPU (of the largest device, on device groups)."""
        return capacity_bytes(self.cluster, self.options)

    def costs(self, key: CostKey):
        return block_costs(self.ma, self.cluster, self.training, tp=key.tp, sp=key.sp,
                           recompute=key.recompute, micro_batch=key.micro_batch)

    def fastest_s(self, costs) -> np.ndarray:
        """Per block: the seconds of one micro-batch on the fastest device holding it."""
        return costs.time_s

    def params(self, costs) -> float:
        return float(costs.params_local.sum())

    def price(self, cfg: Config, costs) -> Estimate:
        return evaluate(cfg, self.ma, costs, self.cluster, self.training, self.options)

    def refine(self, ranked: list[Estimate], deadline: float | None) -> list[Estimate]:
        def cost_of(cfg: Config):
            return self.costs(CostKey(tp=cfg.tp, sp=cfg.sequence_parallel,
                                      recompute=cfg.recompute, micro_batch=cfg.micro_batch))

        out = refine(ranked, self.bg, self.ma, cost_of, self.cluster, self.training, self.options,
                     deadline)
        return [e for e in out if e.peak_memory_bytes <= self.capacity]


class _GroupPricer(_Pricer):
    """Prices configurations on a cluster of device groups (planner.search.hetero)."""

    def largest_capacity(self) -> float:
        return max(capacity_bytes(g, self.options) for g in self.cluster.groups)

    def costs(self, key: CostKey):
        return hetero.group_costs(self.ma, self.cluster, self.training, tp=key.tp, sp=key.sp,
                                  recompute=key.recompute, micro_batch=key.micro_batch)

    def fastest_s(self, costs) -> np.ndarray:
        return np.min([c.time_s for c in costs], axis=0)

    def params(self, costs) -> float:
        return float(costs[0].params_local.sum())

    def price(self, cfg: Config, costs) -> Estimate:
        return hetero.best_order(cfg, self.ma, self.cluster, self.training, self.options, costs)

    def refine(self, ranked: list[Estimate], deadline: float | None) -> list[Estimate]:
        out = []
        for i, est in enumerate(ranked):
            budget = cpsat_budget_s(self.options, deadline, len(ranked) - i)
            out.append(simulated(hetero.refine_groups(est, self.ma, self.cluster, self.training,
                                                      self.options, budget), self.training))
        return sorted(out, key=lambda e: e.step_time_s)


def search(bg: BlockGraph, cluster, training: TrainingSpec, options: SearchOptions,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """The best configurations of ``bg`` on ``cluster`` (a Cluster or a HeteroCluster)."""
    t0 = time.perf_counter()
    deadline = None if options.time_limit_s is None else t0 + options.time_limit_s
    ma = ModelArrays.from_blocks(bg)
    groups_of_devices = isinstance(cluster, HeteroCluster)
    if groups_of_devices:
        options = hetero.restrict(options)
    pricer = (_GroupPricer if groups_of_devices else _Pricer)(bg, ma, cluster, training, options)
    rejected: Counter = Counter()
    space = list(enumerate_space(Space.of(cluster, bg), training, options, rejected))
    total = sum(len(configs) for _, configs in space)
    top = _TopK(options.top_k + 1)
    done = 0
    for key, configs in space:
        costs = None
        for cfg in configs:
            done += 1
            if deadline is not None and top.priced and time.perf_counter() > deadline:
                rejected[TIME_LIMIT] += total - done + 1
                break
            costs = costs if costs is not None else pricer.costs(key)
            reason = _screen(cfg, costs, pricer, training, top)
            if reason:
                rejected[reason] += 1
                continue
            try:
                est = pricer.price(cfg, costs)
            except InfeasibleError as exc:
                rejected[exc.reason] += 1
                continue
            if not top.offer(est, done):
                rejected[SLOWER] += 1
        if progress:
            progress(done, total)
        if rejected[TIME_LIMIT]:
            break
    ranked = pricer.refine(top.ranked(), deadline)
    cut = bool(rejected[TIME_LIMIT])
    status, gap = ("feasible", None) if cut else ("optimal", 0.0)
    if ranked and ranked[0].split_status != "optimal" and not cut:
        status, gap = "feasible", ranked[0].split_gap
    return SearchResult(best=ranked[0] if ranked else None, alternatives=ranked[1:],
                        candidates=total, evaluated=top.priced, rejected=rejected, status=status,
                        time_s=time.perf_counter() - t0, gap=gap)


def _screen(cfg: Config, costs, pricer: _Pricer, training: TrainingSpec, top: "_TopK") -> str:
    """Why ``cfg`` need not be priced ('' when it must): its model states alone exceed the
    largest device's memory on the average stage, or its lower bound cannot enter the top k."""
    bpp = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                       zero=cfg.zero, dp=cfg.dp, offload=cfg.offload_optimizer)
    if pricer.params(costs) * bpp / cfg.pp > pricer.capacity:
        return OUT_OF_MEMORY
    total_s = float(pricer.fastest_s(costs).sum())
    bound = total_s + (cfg.num_microbatches - 1) * total_s / cfg.pp
    return DOMINATED if top.full and bound >= top.worst else ""


class _TopK:
    """The k fastest estimates so far; ties go to the one offered first."""

    def __init__(self, k: int):
        self.k = k
        self.heap: list[tuple[float, int, Estimate]] = []  # max-heap on step time via negation
        self.priced = 0

    @property
    def full(self) -> bool:
        return len(self.heap) == self.k

    @property
    def worst(self) -> float:
        return -self.heap[0][0]

    def offer(self, est: Estimate, order: int) -> bool:
        """Keep ``est`` if it is among the k fastest; False when the top k was full already (it
        may still have displaced a slower one)."""
        self.priced += 1
        item = (-est.step_time_s, -order, est)
        if not self.full:
            heapq.heappush(self.heap, item)
            return True
        if est.step_time_s < self.worst:
            heapq.heapreplace(self.heap, item)
        return False

    def ranked(self) -> list[Estimate]:
        return [e for _, _, e in sorted(self.heap, key=lambda it: (-it[0], -it[1]))]
