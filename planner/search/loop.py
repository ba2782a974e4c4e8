"""The search: one loop over the space for every kind of cluster, keeping the top k within a time limit.

The space (planner.search.space) comes grouped by the knobs per-block costs depend on (tp, sequence
parallel, recomputation, micro-batch); a pricer computes those costs once per group and prices each
configuration of it: on one device type the chain split and closed forms (planner.search.evaluate),
on device groups the group orders and per-device split (planner.search.hetero). Before pricing, a
configuration whose weights alone cannot fit is set aside; the others are priced best-first, in
increasing order of a lower bound (the pipeline on perfectly balanced stages, or the least any split
gives for 1F1B, each block on its fastest device; the optimizer step; the data-parallel traffic no
compute can hide: dp_traffic.dp_floor_s), until the next bound cannot enter the top k: the rest are
dominated. A configuration's stage split, found first, gives a tighter bound (Split.floor_s: the
schedule on its real stages, the traffic per rank); when that puts it behind the next one in the
queue it goes back in with it, so what is priced in full is mostly what can win (on device groups,
where the split depends on the group order, each is priced at once). The top k are then refined (exact stage assignment by CP-SAT where it applies, and
simulation of the schedule) and re-ranked. The simulation can find a schedule slower than its
closed form (interleaved 1F1B over chunks of unequal time waits for the slowest rank of each chunk
position), or faster (interleaved chunks again; 1F1B and ZB-H1 are priced rank by rank, and their
pipelines, sends aside, never come out below their simulations); so configurations whose closed
form, less the largest share by which a simulation has come out faster than its closed form (at
least RETIME_MARGIN), is below the best simulated step are simulated too, in increasing order
(pricing dominated ones as their bound comes below it), until the next one cannot beat it, or
RETIME_MAX of them: the plan is the best simulated. When the simulation puts every kept plan over
memory (in-flight activations the closed form undercounts), the next ones are simulated the same
way until one fits.

Status: ``optimal`` (under the cost model) when every configuration was considered and the best
plan's stage split is proven optimal; ``feasible`` when the time limit stopped the enumeration (gap
unknown: None) or CP-SAT did not prove the split optimal (its gap). The time limit stops the
enumeration only once one configuration has been priced, so a search with a limit always returns a
plan when one is found at all.
"""

from __future__ import annotations

import functools
import heapq
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from costmodels import compute, memory, pipeline
from costmodels.errors import InfeasibleError
from costmodels.topology import HeteroCluster
from planner import targets
from planner.options import Config, SearchOptions, TrainingSpec
from planner.search import hetero
from planner.search.costs import ModelArrays, block_costs, capacity_bytes
from planner.search.evaluate import placed_estimate, placements, split_of
from planner.search.dp_traffic import DataParallelBytes, dp_floor_s, dp_rates
from planner.search.pricing import Estimate
from planner.search.refine import (cpsat_budget_s, pipeline_key, refine, simulated,
                                   with_sends_apart)
from planner.search.space import (CostKey, Group, Space, attention_forms, enumerate_space,
                                   kv_heads)
from planner.trace.graph import BlockGraph

TIME_LIMIT = "not evaluated (time limit)"
OUT_OF_MEMORY = "out of memory"
DOMINATED = "dominated (bound)"
SLOWER = "slower than the top k"
RETIME_CAP = "not simulated (re-timing cap)"
RETIME_MAX = 150
"""Simulations beyond the top k a search runs at most to re-time configurations (see the
docstring; configurations that differ only in ZeRO stage or offload share one); past it the
status is ``feasible`` and those left in reach count as RETIME_CAP."""
RETIME_MARGIN = 0.01
"""The least share below its closed form a configuration's simulation is taken to reach when the
search decides what to re-time: closed forms of neighbouring schedules (interleaved chunks)
differ from their simulations by a few tenths of a percent either way, more than the gaps between
the best plans."""
FLOOR_ROUNDING = 1e-8
"""The bounds (the screen's, a stage split's: Split.floor_s) are taken this share lower: they sum
in another order than the closed form they bound, and ties are told apart at 9 significant
digits (Estimate.rank)."""
OUTCOMES = (OUT_OF_MEMORY, DOMINATED, SLOWER, TIME_LIMIT, RETIME_CAP)
"""What became of configurations the search counted; every other reason is a rule of the space
(planner.search.space) that excluded a choice of knobs before it made a configuration."""


def rejection_lines(rejected, most: int = 5) -> tuple[str, str]:
    """('n reason, ...' of counted configurations set aside, 'rule: n; ...' of choices the rules
    excluded), each with its ``most`` largest counts: the first adds up to at most the
    configurations counted, the second counts choices of knobs at the level each rule applies
    (after the rule: "10 micro batch does not divide ..." read as a micro-batch of 10)."""
    pairs = sorted(rejected.items(), key=lambda kv: -kv[1])

    def text(keep, form, sep) -> str:
        kept = [kv for kv in pairs if keep(kv[0])]
        more = f"{sep}and {len(kept) - most} more" if len(kept) > most else ""
        return sep.join(form(r, n) for r, n in kept[:most]) + more
    return (text(lambda r: r in OUTCOMES, lambda r, n: f"{n} {r}", ", "),
            text(lambda r: r not in OUTCOMES, lambda r, n: f"{r}: {n}", "; "))


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
        self.splits: dict = {}  # stage splits found (evaluate.split_of)
        self.rates: dict = {}  # data-parallel rates per mesh (dp_rates)

    def largest_capacity(self) -> float:
        """Usable bytes per GPU (of the largest device, on device groups)."""
        return capacity_bytes(self.cluster, self.options)

    def costs(self, key: CostKey):
        return block_costs(self.ma, self.cluster, self.training, tp=key.tp, sp=key.sp,
                           recompute=key.recompute, micro_batch=key.micro_batch, cp=key.cp,
                           cp_comm=key.cp_comm, ep=key.ep, etp=key.etp)

    def fastest_s(self, costs) -> np.ndarray:
        """Per block: the seconds of one micro-batch on the fastest device holding it."""
        return costs.time_s

    def params(self, costs, tp: int) -> tuple[float, float]:
        """(parameters, frozen parameters) one tensor-parallel rank holds over the whole model,
        each tied weight once."""
        tied = [n / tp if split else n for _, _, n, split, _ in self.ma.shared]
        frozen = sum(n for n, (*_, f) in zip(tied, self.ma.shared) if f)
        one = self.one(costs)
        return (float(one.params_local.sum()) - sum(tied),
                float(one.frozen_local.sum()) - frozen)

    def one(self, costs):
        """Device-independent figures (parameters, activation bytes) from ``costs``."""
        return costs

    def split(self, cfg: Config, costs):
        """The stage split of ``cfg`` (evaluate.split_of; raises InfeasibleError), whose floor_s
        bounds its step more tightly than the screen; None where pricing has no such half."""
        return split_of(cfg, self.ma, costs, self.cluster, self.training, self.options,
                        self.splits)

    def dp_rates(self, cfg: Config) -> list[tuple]:
        """dp_traffic.dp_rates of ``cfg``'s mesh under the placements it may take, found once per
        mesh."""
        key = (cfg.tp, cfg.dp, cfg.pp, cfg.cp, cfg.ep, cfg.etp, cfg.placement)
        hit = self.rates.get(key)
        if hit is None:
            hit = self.rates[key] = dp_rates(cfg, self.cluster, self.training,
                                             placements(cfg, self.ma, self.options))
        return hit

    def floor_s(self, split) -> float:
        return split.floor_s(self.cluster.device, self.dp_rates(split.cfg))

    def price(self, cfg: Config, costs, split=None) -> Estimate:
        if split is None:
            split = self.split(cfg, costs)
        return placed_estimate(split, self.cluster, self.options)

    def refine(self, ranked: list[Estimate], deadline: float | None) -> list[Estimate]:
        def cost_of(cfg: Config):
            return self.costs(CostKey.of(cfg))

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

    def one(self, costs):
        return costs[0]

    def split(self, cfg: Config, costs):
        return None  # (hetero.best_order splits per group order)

    def price(self, cfg: Config, costs, split=None) -> Estimate:
        return hetero.best_order(cfg, self.ma, self.cluster, self.training, self.options, costs)

    def refine(self, ranked: list[Estimate], deadline: float | None) -> list[Estimate]:
        out = []
        for i, est in enumerate(ranked):
            budget = cpsat_budget_s(self.options, deadline, len(ranked) - i)
            if hetero.uniform(self.cluster):  # alike groups: the exact split and chain stand;
                if i > 0:                        # CP-SAT certifies the best one, briefly
                    out.append(simulated(est, self.training, sends_apart=False))
                    continue
                budget = min(budget, hetero.UNIFORM_REFINE_S)
            out.append(simulated(hetero.refine_groups(est, self.ma, self.cluster, self.training,
                                                      self.options, budget), self.training))
        return sorted(out, key=lambda e: e.rank)


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
    space = list(enumerate_space(Space.of(cluster, bg, options), training, options, rejected,
                                 mb_fits=_MicroBatchWall(pricer, options)))
    total = sum(len(group.variants) for group in space)
    top = _TopK(max(options.top_k + 1, TIE_POOL))
    # screen every configuration (its costs are shared by its group), then price best-first:
    # in increasing order of the lower bound, until the next bound cannot enter the top k
    queue: list[tuple[float, int, Group, tuple, object]] = []  # (bound, order, ..., split)
    spare: list[tuple[float, int, Estimate]] = []  # every priced estimate (closed form)
    order_of: dict[Config, int] = {}  # each priced configuration's place in the enumeration
    costs_of: dict[CostKey, object] = {}  # meshes of other pp and dp share a key's costs
    totals_of: dict[CostKey, tuple] = {}  # ... and their totals (_totals)
    unscreened = iter(space)
    done = 0

    def screen() -> None:
        """Screen the groups not yet screened into the queue, stopping past the deadline once
        the queue holds a configuration (which may still not fit: pricing asks for more)."""
        nonlocal done
        for group in unscreened:
            key = group.key
            costs = costs_of.get(key)
            if costs is None:
                costs = costs_of[key] = pricer.costs(key)
                totals_of[key] = _totals(pricer, costs, key.tp)
            bounds = _Screen(group, costs, pricer, training, totals_of[key]).bounds()
            for i, (variant, bound) in enumerate(zip(group.variants, bounds), 1):
                if bound is not None:
                    heapq.heappush(queue, (bound, done + i, group, variant, None))
            done += len(bounds)
            if None in bounds:
                rejected[OUT_OF_MEMORY] += bounds.count(None)
            if deadline is not None and queue and time.perf_counter() > deadline:
                return

    # the queue in increasing (bound, enumeration order): popped as far as it is priced; a
    # configuration's stage split gives a tighter bound (Split.floor_s), with which it goes back
    # into the queue when that puts it behind the next one
    screen()
    queued, settled, shown = len(queue), 0, -1  # settled: priced, or found not to fit
    queued_as = DOMINATED  # what the configurations left in the queue are counted as
    while queue or (not top.priced and done < total):
        if not queue:  # a deadline cut the screening before anything that fits was priced
            screen()
            queued = settled + len(queue)
            continue
        bound, order, group, variant, split = queue[0]
        if progress and settled % 64 == 0 and settled != shown:
            progress(settled, queued)
            shown = settled
        if top.full and bound > top.worst:  # (an equal time may still rank first: less memory)
            rejected[DOMINATED] += len(queue)
            queued_as = DOMINATED
            break
        if deadline is not None and top.priced and time.perf_counter() > deadline:
            rejected[TIME_LIMIT] += len(queue)
            queued_as = TIME_LIMIT
            break
        heapq.heappop(queue)
        if split is None:
            try:
                split = pricer.split(_config(group, variant, costs_of, pricer),
                                     costs_of[group.key])
            except InfeasibleError as exc:
                rejected[exc.reason] += 1
                settled += 1
                continue
            if split is not None:
                floor = pricer.floor_s(split) * (1.0 - FLOOR_ROUNDING)
                if (queue and floor > queue[0][0]) or (top.full and floor > top.worst):
                    heapq.heappush(queue, (floor, order, group, variant, split))
                    continue
        settled += 1
        est = _price_queued(group, variant, costs_of, pricer, rejected, split)
        if est is None:
            continue
        if not top.offer(est, order):
            rejected[SLOWER] += 1
        spare.append((est.step_time_s, order, est))
        order_of[est.config] = order
    if done < total:
        rejected[TIME_LIMIT] += total - done
    if progress:
        progress(queued, queued)
    ranked = pricer.refine(top.ranked(), deadline)
    cut = bool(rejected[TIME_LIMIT])
    if not cut or not ranked:  # (also when the simulation put every kept plan over memory: the
        # next ones, past the time limit too, until one fits)
        closed = top.ranked()
        kept = {id(e) for e in closed}
        spare = [s for s in spare if id(s[2]) not in kept]
        faster = max((1.0 - r.step_time_s / c.step_time_s for c in closed for r in ranked
                      if r.config == c.config), default=0.0)
        faster = max(faster, RETIME_MARGIN)
        ranked, stopped = _retime(ranked, spare, queue, costs_of, pricer, training, rejected,
                                  top, deadline, faster, order_of, queued_as)
        cut = cut or stopped
    # at the same rank, the configuration enumerated first (as the top k keeps them)
    ranked = sorted(ranked, key=lambda e: (e.rank, order_of.get(e.config, total)))
    if not groups_of_devices:  # (on groups a plan's memory is its own group's share: no edge)
        ranked = tie_broken(ranked, lambda e: order_of.get(e.config, total), pricer.capacity,
                            _engine_runs(bg, training) if options.target == "any" else None)
    ranked = ranked[:options.top_k + 1]
    # the plans returned tell the waits for their sends apart from the bubble (simulated again
    # with free sends: a second simulation each, left out of the re-timing of every candidate)
    ranked = [with_sends_apart(e) for e in ranked]
    status, gap = ("feasible", None) if cut else ("optimal", 0.0)
    if ranked and ranked[0].split_status != "optimal" and not cut:
        status, gap = "feasible", ranked[0].split_gap
    return SearchResult(best=ranked[0] if ranked else None, alternatives=ranked[1:],
                        candidates=total, evaluated=top.priced, rejected=rejected, status=status,
                        time_s=time.perf_counter() - t0, gap=gap)


TIE_SHARE = 0.001
"""Step times within this share of the fastest are a tie: 0.1% is far below what the cost model
can tell apart (its validations: a few percent at best). Where the fastest plan fills more than
TIE_MEMORY_EDGE of the usable memory, the tie goes to the plan with least memory per GPU: one
with room to spare runs where one at the edge may not (a new-user check got a ZeRO-3 plan with
its optimizer offloaded, 73 GB of 80, over one of 51 GB that was 0.004% slower)."""
TIE_MEMORY_EDGE = 0.9
"""The share of a GPU's usable memory past which a plan is at its edge: the memory model's
error on measured runs reaches 6% (README, torchtitan's runs); a tenth leaves room for it. Below
it a tie keeps the fastest (no offloading or recomputation chosen to save memory nobody
needs)."""
TIE_POOL = 3
"""The fastest estimates kept however few runners-up are asked for (top_k), so that a search
for the best alone breaks its ties as one with runners-up does."""


def tie_broken(ranked: list, order, capacity: float,
               engine_runs: Callable[[Config], bool] | None = None) -> list:
    """``ranked`` (fastest first) with one of its first TIE_POOL tied with the fastest (TIE_SHARE)
    first, then the rest as they were: with ``engine_runs`` (a search for any target), one an
    exported engine runs where one of them does (a new-user check got a plan that only the
    planner's own runtime runs over a tie Megatron runs); and of those, the plan of least memory
    where their fastest fills more than TIE_MEMORY_EDGE of ``capacity`` (usable bytes per GPU).
    ``order``: an estimate's place in the enumeration (the last tie-break, as the top k keeps
    them). The first TIE_POOL alone, so that the answer does not hang on how many runners-up
    were asked for."""
    if not ranked:
        return ranked
    limit = ranked[0].step_time_s * (1.0 + TIE_SHARE)
    tied = [e for e in ranked[:TIE_POOL] if e.step_time_s <= limit]
    if engine_runs is not None and len(tied) > 1:  # (then memory among those an engine runs)
        tied = [e for e in tied if engine_runs(e.config)] or tied
    if tied[0].peak_memory_bytes <= TIE_MEMORY_EDGE * capacity:
        pick = tied[0]
    else:
        pick = min(tied, key=lambda e: (e.peak_memory_bytes, e.rank, order(e)))
    return [pick] + [e for e in ranked if e is not pick]


def _engine_runs(bg: BlockGraph, training: TrainingSpec) -> Callable[[Config], bool]:
    """Whether an exported engine (targets.EXPORTED) runs a configuration's knobs and dtype as
    planned (targets.refusal; an export checks the model's other rules besides)."""
    forms, experts = attention_forms(bg), any(b.work.num_experts for b in bg.blocks)
    heads = kv_heads(bg)
    return lambda cfg: targets.exported_runs(cfg.to_dict(), training.dtype, forms,
                                             experts=experts, kv_heads=heads)


def _config(group: Group, variant: tuple, costs_of: dict, pricer) -> Config:
    """A queued configuration (with its group's costs' K/V exchange under context
    parallelism)."""
    costs = costs_of[group.key]
    return group.config(variant, pricer.one(costs).cp_comm if group.key.cp > 1 else None)


def _price_queued(group: Group, variant: tuple, costs_of: dict, pricer,
                  rejected: Counter, split=None) -> Estimate | None:
    """A queued configuration priced (on its stage split when found already), or None (its
    reason counted) when it cannot run."""
    try:
        return pricer.price(_config(group, variant, costs_of, pricer), costs_of[group.key], split)
    except InfeasibleError as exc:
        rejected[exc.reason] += 1
        return None


def _retime(ranked: list[Estimate], spare: list, queue: list, costs_of: dict, pricer,
            training: TrainingSpec, rejected: Counter, top, deadline: float | None,
            faster: float = 0.0, order_of: dict | None = None,
            queued_as: str = DOMINATED) -> tuple[list[Estimate], bool]:
    """(the re-timed estimates best first, whether RETIME_MAX or the time limit stopped it): the
    priced estimates of ``spare`` (not yet simulated) and the configurations left in ``queue``
    (dominated by the top k's closed forms, or left by the time limit: counted as ``queued_as``)
    simulated while their closed form (their bound,
    before pricing), less the largest share by which a simulation came out faster than its
    closed form so far (``faster``, from the top k on), is below the best simulated step.
    RETIME_MAX counts distinct simulations (refine.pipeline_key); neither it nor the time limit
    stops the search while no simulated plan fits."""
    heapq.heapify(spare)
    best = ranked[0].step_time_s if ranked else float("inf")
    done = 0
    runs: dict = {}
    while True:
        reach = best / (1.0 - max(0.0, min(faster, 0.5)))  # closed forms that may simulate below
        while queue and queue[0][0] < reach and (not spare or queue[0][0] < spare[0][0]):
            _, order, group, variant, split = heapq.heappop(queue)
            rejected[queued_as] -= 1
            est = _price_queued(group, variant, costs_of, pricer, rejected, split)
            if est is None:
                continue
            top.priced += 1
            rejected[SLOWER] += 1
            heapq.heappush(spare, (est.step_time_s, order, est))
            if order_of is not None:
                order_of[est.config] = order
        if not spare or spare[0][0] >= reach:
            return sorted(ranked, key=lambda e: e.rank), False
        if ranked and (done >= RETIME_MAX or (deadline is not None and
                                              time.perf_counter() > deadline)):
            priced = sum(1 for s in spare if s[0] < reach)  # counted as slower so far
            bound = sum(1 for q in queue if q[0] < reach)  # counted as dominated so far
            rejected[SLOWER] -= priced
            rejected[queued_as] -= bound
            rejected[RETIME_CAP if done >= RETIME_MAX else TIME_LIMIT] += priced + bound
            return sorted(ranked, key=lambda e: e.rank), True
        closed = heapq.heappop(spare)[2]
        done += pipeline_key(closed) not in runs  # (ZeRO or offload alone: simulated already)
        est = simulated(closed, training, runs, sends_apart=False)
        faster = max(faster, 1.0 - est.step_time_s / closed.step_time_s)
        if est.peak_memory_bytes <= pricer.capacity:
            ranked.append(est)
            best = min(best, est.step_time_s)


class _MicroBatchWall:
    """Whether a micro-batch's activations alone could fit: on pipeline rank i at least
    c_i = min(pp - i, m) micro-batches are in flight under every schedule (m per step), so with A
    the activation bytes of one micro-batch over the whole model (at its leanest tp, sequence
    parallelism and recomputation), the fullest rank holds at least A / sum(1 / c_i), the
    continuous split of the layers that equalizes c_i x a_i."""

    def __init__(self, pricer: _Pricer, options: SearchOptions):
        self.pricer, self.options = pricer, options
        self.per_sample: dict[int, float] = {}

    def __call__(self, tp: int, pp: int, mb: int, m: int, cp: int = 1) -> bool:
        if tp not in self.per_sample:
            fix = self.options.fix
            sp = fix.get("sequence_parallel", tp > 1 and True in self.options.sequence_parallel)
            # the leanest policy the search may take: full where it may, else the least of those
            # it may (which keeps least depends on the attention kernel: compare them)
            rcs = ([fix["recompute"]] if "recompute" in fix else
                   ["full"] if "full" in self.options.recompute else self.options.recompute)
            least = []
            for rc in rcs:
                costs = self.pricer.costs(CostKey(tp=tp, sp=sp, recompute=rc, micro_batch=1))
                one = costs[0] if isinstance(costs, list) else costs
                least.append(float(one.act_bytes.sum()))
            self.per_sample[tp] = min(least)
        return mb * self.per_sample[tp] / (cp * _wall_spread(pp, m)) <= self.pricer.capacity


@functools.lru_cache(maxsize=4096)
def _wall_spread(pp: int, m: int) -> float:
    """sum(1 / c_i), c_i = min(pp - i, m) (_MicroBatchWall)."""
    return sum(1.0 / min(pp - i, m) for i in range(pp))


class _Screen:
    """The memory screen and the lower bound of one group's configurations. They share the
    costs, the mesh and the micro-batch, so each part is found once for the knobs it depends on:
    the memory screen per (ZeRO stage, offload, GPipe or not), the pipeline bound per (schedule,
    vpp), the bound of the optimizer step and the data-parallel traffic per (ZeRO stage,
    offload)."""

    def __init__(self, group: Group, costs, pricer: _Pricer, training: TrainingSpec,
                 totals: tuple | None = None):
        """``totals``: _totals of ``costs``, where the caller keeps them (a search screens
        several groups of one CostKey, far apart in the enumeration); None: found here."""
        self.group, self.pricer, self.training = group, pricer, training
        (self.params, self.frozen, self.acts, self.total_s, self.slowest_s, self.fwd_s,
         self.experts, self.frozen_experts, self.compute_s) = \
            _totals(pricer, costs, group.key.tp) if totals is None else totals
        base = group.config(group.variants[0])
        self.replicas, self.edp = base.dp * base.cp, base.edp
        self.dp_rates = [] if isinstance(pricer, _GroupPricer) else pricer.dp_rates(base)

    def bounds(self) -> list[float | None]:
        """Per variant (Group.variants): a lower bound of its step time, None when it cannot fit
        (out_of_memory)."""
        memory_keys, pipeline_keys, optimizer_keys, index = _variant_parts(self.group.variants)
        fits = [not self.out_of_memory(*key) for key in memory_keys]
        pipeline_s: list[float | None] = [None] * len(pipeline_keys)
        optimizer_s: list[float | None] = [None] * len(optimizer_keys)
        out: list[float | None] = []
        for m, p, o in index:
            if not fits[m]:
                out.append(None)
                continue
            pipe = pipeline_s[p]
            if pipe is None:
                pipe = pipeline_s[p] = self.pipeline_bound_s(*pipeline_keys[p])
            opt = optimizer_s[o]
            if opt is None:
                zero, offload = optimizer_keys[o]
                opt = optimizer_s[o] = self.optimizer_bound_s(zero, offload) + self.dp_bound_s(zero)
            out.append((pipe + opt) * (1.0 - FLOOR_ROUNDING))
        return out

    def out_of_memory(self, zero: int, offload: bool, gpipe: bool) -> bool:
        """A lower bound of the fullest rank's memory exceeds the largest device's. With S the
        model states and A one micro-batch's activations over the whole model, and
        c_i >= min(pp - i, m) micro-batches in flight on rank i under every schedule (m under
        GPipe), any split of the blocks leaves some rank with at least
        (A + S / max c) / sum(1 / c_i): the average of the ranks' memory weighted by 1 / c_i."""
        t = self.training
        # (experts' states may shard further; frozen parameters keep their weights only)
        trained, frozen = _least_states(zero, offload, self.replicas, self.edp, t.dtype,
                                        t.optimizer, t.engine.state_layout)
        states = (self.params - self.frozen) * trained + self.frozen * frozen
        pp = self.group.pp
        most, spread = _in_flight_spread(pp, self.group.num_microbatches, gpipe)
        need = (self.acts + states / most) / spread
        return max(need, states / pp) > self.pricer.capacity

    def pipeline_bound_s(self, schedule: str, vpp: int) -> float:
        """A lower bound of the pipeline's time: the busiest rank runs at least 1/pp of the model
        and at least the slowest block, each block on its fastest device; nothing else. The
        schedule's closed form (costmodels.pipeline) on ranks that balanced, or for 1F1B, which
        is priced rank by rank, the least that form gives any split (one_f_one_b_floor_s)."""
        total_s, pp, m = self.total_s, self.group.pp, self.group.num_microbatches
        t = max(total_s / pp, self.slowest_s)  # the busiest rank's share, at least
        if schedule == "interleaved-1f1b":  # costmodels.pipeline: sum / v + (m - 1/v) max
            return total_s / vpp + (m - 1 / vpp) * t
        if schedule == "zb-h1":  # weight gradients (at most half of a backward) may fill the
            # whole drain: the busiest rank's passes, and one micro-batch's path without them
            return max(m * t, 0.5 * (total_s + self.fwd_s))
        if schedule == "1f1b":  # priced rank by rank (pipeline.one_f_one_b_s)
            return pipeline.one_f_one_b_floor_s(total_s, t, stages=pp, microbatches=m)
        return total_s + (m - 1) * t

    def dp_bound_s(self, zero: int) -> float:
        """A lower bound of the exposed data-parallel traffic (dp_traffic.dp_floor_s at the ranks'
        means: 1/pp of the dense and expert parameters and of the compute; of the trained ones,
        frozen weights' ZeRO-3 gathers left out); 0 on device groups."""
        pp = self.group.pp
        trained, experts_ = self.params - self.frozen, self.experts - self.frozen_experts
        return dp_floor_s(zero, self.group.num_microbatches, (trained - experts_) / pp,
                          experts_ / pp, self.compute_s / pp, self.dp_rates)

    def optimizer_bound_s(self, zero: int, offload: bool) -> float:
        """A lower bound of the optimizer step: the busiest rank holds at least 1/pp of the
        trained parameters, sharded at most over max(dp x cp, edp) ranks (ZeRO >= 1); 0 on
        device groups."""
        if isinstance(self.pricer, _GroupPricer):
            return 0.0
        shard = max(self.replicas, self.edp) if zero >= 1 else 1
        per_rank = (self.params - self.frozen) / self.group.pp / shard
        device, t = self.pricer.cluster.device, self.training
        traffic = _optimizer_traffic(t.dtype, t.optimizer, t.engine.state_layout)
        if offload:
            per = DataParallelBytes.of(t)
            return compute.offloaded_optimizer_step_s(per_rank, device,
                                                      traffic_bytes_per_param=traffic,
                                                      grad_bytes=per.grads,
                                                      weight_bytes=per.weights)
        return compute.optimizer_step_s(per_rank, device, traffic_bytes_per_param=traffic)


@functools.lru_cache(maxsize=64)
def _variant_parts(variants: tuple) -> tuple[tuple, tuple, tuple, tuple]:
    """(the memory keys (ZeRO stage, offload, GPipe or not), the pipeline keys (schedule, vpp)
    and the optimizer keys (ZeRO stage, offload) of ``variants`` (Group.variants), each once in
    the order the variants first take it, and per variant the index of its key of each):
    _Screen.bounds finds each part once per key, and a search's hundreds of thousands of
    variants come in a few tuples of them."""
    memory_keys: dict[tuple, int] = {}
    pipeline_keys: dict[tuple, int] = {}
    optimizer_keys: dict[tuple, int] = {}
    index = tuple((memory_keys.setdefault((zero, offload, schedule == "gpipe"), len(memory_keys)),
                   pipeline_keys.setdefault((schedule, vpp), len(pipeline_keys)),
                   optimizer_keys.setdefault((zero, offload), len(optimizer_keys)))
                  for schedule, vpp, zero, offload in variants)
    return tuple(memory_keys), tuple(pipeline_keys), tuple(optimizer_keys), index


@functools.lru_cache(maxsize=64)
def _optimizer_traffic(dtype: str, optimizer: str, layout: str) -> float:
    """memory.optimizer_traffic_bytes, which the screen asks for with the same arguments for
    every group and ZeRO stage."""
    return memory.optimizer_traffic_bytes(dtype=dtype, optimizer=optimizer, layout=layout)


@functools.lru_cache(maxsize=4096)
def _least_states(zero: int, offload: bool, replicas: int, edp: int, dtype: str,
                  optimizer: str, layout: str) -> tuple[float, float]:
    """(_least_state_bytes of trained parameters, of frozen ones): _Screen.out_of_memory asks
    for both of every memory key of every group, which keyword arguments made slow."""
    kw = dict(zero=zero, offload=offload, replicas=replicas, edp=edp, dtype=dtype,
              optimizer=optimizer, layout=layout)
    return _least_state_bytes(**kw), _least_state_bytes(**kw, trainable=False)


@functools.lru_cache(maxsize=4096)
def _least_state_bytes(*, zero: int, offload: bool, replicas: int, edp: int, dtype: str,
                       optimizer: str, layout: str, trainable: bool = True) -> float:
    """The fewer model-state bytes per parameter of the dense parameters (sharded over
    ``replicas``) and the experts' (over ``edp``): costs.state_bytes_per_param, without FP8
    weight copies (the blocks outside the layers keep none) and without what a deferred FSDP2
    gradient sync adds (costs.deferred_sync): a lower bound. ``trainable=False``: of frozen
    parameters (weights only)."""
    kw = dict(dtype=dtype, optimizer=optimizer, zero=zero, offload=offload, layout=layout,
              frozen=0.0 if trainable else 1.0)

    def without_copies(dp: int) -> float:
        states = memory.model_state_bytes(1.0, dp=dp, **kw)
        return sum(v for k, v in states.items() if k != "fp8_weights")

    return min(without_copies(replicas), without_copies(edp))


@functools.lru_cache(maxsize=4096)
def _in_flight_spread(pp: int, m: int, gpipe: bool) -> tuple[int, float]:
    """(max c_i, sum of 1 / c_i) with c_i the fewest micro-batches in flight on rank i: m under
    GPipe, min(pp - i, m) otherwise (the first pp - m ranks hold m, the rest pp - i)."""
    if gpipe:
        return m, pp / m
    full = max(0, pp - m)
    return min(pp, m), full / m + sum(1.0 / (pp - i) for i in range(full, pp))


def _totals(pricer: _Pricer, costs, tp: int) -> tuple[float, ...]:
    """(parameters held per tp rank and the frozen ones of them, one micro-batch's activation
    bytes over the model, the blocks' seconds on their fastest devices: in all and the slowest
    block's, and the forward seconds of the fastest device's blocks, the routed experts'
    parameters per tp rank and the frozen ones of them, and the compute of one micro-batch through every block with its gradient accumulation (at least
    what Split.rank_compute_s adds up): these three 0 on device groups) of ``costs``. The search
    finds them once per CostKey, beside its costs (a key's groups lie too far apart in the
    enumeration for a cache of the last few costs to hold them)."""
    fastest = pricer.fastest_s(costs)
    one_type = not isinstance(pricer, _GroupPricer)
    forward = float(costs.fwd_s.sum()) if one_type else 0.0
    experts_ = float(costs.expert_params_local.sum()) if one_type else 0.0
    frozen_experts = float(costs.frozen_expert_local.sum()) if one_type else 0.0
    compute_s = float(np.sum(costs.compute_s + costs.recompute_s + costs.accumulate_s)
                      ) if one_type else 0.0
    return (*pricer.params(costs, tp), float(pricer.one(costs).act_bytes.sum()),
            float(fastest.sum()), float(fastest.max()), forward, experts_, frozen_experts,
            compute_s)


class _TopK:
    """The k fastest estimates so far (Estimate.rank: at the same time, the one with less memory;
    then the one first in the enumeration, whatever order they are priced in)."""

    def __init__(self, k: int):
        self.k = k
        self.heap: list[tuple[float, float, int, Estimate]] = []  # max-heap on rank via negation
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
        step, memory = est.rank
        item = (-step, -memory, -order, est)
        if not self.full:
            heapq.heappush(self.heap, item)
            return True
        worst = self.heap[0]
        if (step, memory, order) < (-worst[0], -worst[1], -worst[2]):  # (whatever order they
            heapq.heapreplace(self.heap, item)                          # were priced in)
        return False

    def ranked(self) -> list[Estimate]:
        return [it[3] for it in sorted(self.heap, key=lambda it: (-it[0], -it[1], -it[2]))]
