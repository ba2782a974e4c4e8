"""Price one configuration on one device type: split the blocks into stages, then price the step.

The exact chain split (planner.solve.chain) cuts the blocks into ``pp x vpp`` chunks that fit
memory; chunk ``c`` runs on pipeline rank ``c mod pp`` (Megatron-LM's placement), so a rank's time
and memory add up its chunks. Either an Estimate comes back or InfeasibleError with a reason the
search counts.
"""

from __future__ import annotations

import dataclasses

from costmodels import pipeline
from costmodels.errors import InfeasibleError
from costmodels.memory import layer_interval
from costmodels.topology import Cluster
from planner import targets
from planner.options import PLACEMENTS, Config, SearchOptions, TrainingSpec, pp_inner_refused
from planner.search.costs import BlockCosts, ModelArrays, capacity_bytes, stage_memory
from planner.search.layout import layout_bounds
from planner.search.pricing import Estimate, Split
from planner.solve.chain import (RanksFit, StageMemory, even_partition, partition,
                                  rank_balanced)


def evaluate(cfg: Config, ma: ModelArrays, costs: BlockCosts, cluster: Cluster,
             training: TrainingSpec, options: SearchOptions,
             splits: dict | None = None) -> Estimate:
    """Split into stages (chunks), then price the step; raises InfeasibleError. ``splits``: a
    dict the calls of one search share, which keeps each split found (configurations that
    differ only in what the split does not depend on, 1F1B and ZB-H1 say, share it)."""
    return placed_estimate(split_of(cfg, ma, costs, cluster, training, options, splits), cluster,
                           options)


LAYER_INTERVAL_SPLIT = "full/k on a split whose layers the target recomputes otherwise"


def split_of(cfg: Config, ma: ModelArrays, costs: BlockCosts, cluster: Cluster,
             training: TrainingSpec, options: SearchOptions,
             splits: dict | None = None) -> Split:
    """The first half of ``evaluate``: the stage split that fits, before its ranks are placed
    (Split.floor_s bounds what any placement gives); raises InfeasibleError, also for a full/k
    plan whose target would recompute other layers on its split (targets.layer_interval_refusal:
    its export would not run what is priced)."""
    split = _split_of(cfg, ma, costs, cluster, training, options, splits)
    k = layer_interval(cfg.recompute)
    if k and options.target in ("megatron", "torchtitan"):
        rec, held = ma.recomputed(cfg.recompute), ma.checkpointed
        pairs = list(zip(split.bounds, split.bounds[1:]))
        why = targets.layer_interval_refusal(
            options.target, k, [int(rec[a:b].sum()) for a, b in pairs],
            [int(held[a:b].sum()) for a, b in pairs], cfg.pp)
        if why:
            raise InfeasibleError(f"{cfg.short()}: {why}", reason=LAYER_INTERVAL_SPLIT)
    return split


def _split_of(cfg: Config, ma: ModelArrays, costs: BlockCosts, cluster: Cluster,
              training: TrainingSpec, options: SearchOptions, splits: dict | None) -> Split:
    """split_of before the target's check of a full/k split."""
    capacity = capacity_bytes(cluster, options)
    if options.layout is not None:  # the stages pinned: priced on that cut, if it fits
        bounds = layout_bounds(options.layout, ma.checkpointed)
        if len(bounds) - 1 != cfg.pp * cfg.vpp:
            raise InfeasibleError(f"{cfg.short()}: the pinned layout has {len(bounds) - 1} "
                                  "stages", reason="pinned layout")
        return _fitting(Split(cfg, bounds, ma, costs, training), capacity, ma, options)
    mem = stage_memory(cfg, costs, ma, training, capacity)
    part = _partition(cfg, costs, mem, splits)
    if cfg.vpp == 1:
        if part is None:
            raise InfeasibleError(_oom_message(cfg, mem), reason="out of memory")
        # Memory does not depend on placement: a split that does not fit is not priced at all.
        return _fitting(Split(cfg, part.bounds, ma, costs, training), capacity, ma, options)
    return _interleaved_split(cfg, ma, costs, training, options, mem, part, capacity, splits)


def _interleaved_split(cfg: Config, ma: ModelArrays, costs: BlockCosts, training: TrainingSpec,
                       options: SearchOptions, mem: StageMemory, part, capacity: float,
                       splits: dict | None) -> Split:
    """The split of an interleaved schedule's chunks: the split with 1/vpp of the GPU per chunk
    (``part``), or where none meets that and the ranks may fit, the split with the whole GPU per
    chunk (a rank's chunks may differ: the one with the output head holds more; their sum is
    what must fit); and in place of either the even split of the time, or the faster of the two
    with its cuts moved till the busiest rank's chunks together are lightest (chain.rank_balanced,
    its ranks' memory kept within the GPU), the faster of these by the schedule's closed form
    on the chunk times (_interleaved_s) where that makes it faster by more than EVEN_MARGIN. The
    step grows with the busiest rank's chunks together, which the slowest chunk alone does not
    decide: a split that minimized the slowest chunk under its memory chose 1, 1, 1, 4, 5, 5,
    ... layers on a 70B model, its ranks' totals 5% apart, 6% slower (simulated) than the even
    split it could hold; the even split of Llama-3 8B's 34 blocks into 2 x 4 chunks put 18
    layers on one rank and 14 and the head on the other, 5% slower than the balanced one."""
    may_fit = _ranks_may_fit(mem, cfg.pp, capacity)
    if part is None and may_fit:
        part = _partition(cfg, costs, dataclasses.replace(mem, capacity=capacity), splits)
    times = costs.split_s(cfg)
    even = even_partition(times, cfg.pp * cfg.vpp) if may_fit else None
    starts = [p for p in (part, even) if p is not None]
    start = min(starts, key=lambda p: _interleaved_s(cfg, times, p.bounds), default=None)
    if part is not None and _even_ranks_s(cfg, times) >= (1.0 - EVEN_MARGIN) * _interleaved_s(
            cfg, times, part.bounds):
        start = None  # not even ranks of exactly equal times would replace the memory-bound split
    # balanced on the times alone (shared by configurations that differ in memory only), or
    # where that does not fit, within the memory
    balanced = start and _memo(splits, ("balanced", cfg.pp, tuple(start.bounds)), cfg, costs,
                               lambda: rank_balanced(times, cfg.pp, start))
    if balanced and not RanksFit(mem, cfg.pp, cfg.pp * cfg.vpp, capacity)(balanced.bounds):
        balanced = _memo(splits, ("balanced", cfg.pp, tuple(start.bounds), tuple(mem.static),
                                  tuple(mem.in_flight), capacity, tuple(mem.shared)), cfg, costs,
                         lambda: rank_balanced(times, cfg.pp, start, mem, capacity))
    ranked = sorted({tuple(p.bounds): p for p in (even, balanced) if p is not None}.values(),
                    key=lambda p: _interleaved_s(cfg, times, p.bounds))
    first = ranked + [part] if ranked and (part is None or _interleaved_s(
        cfg, times, ranked[0].bounds) < (1.0 - EVEN_MARGIN) * _interleaved_s(
            cfg, times, part.bounds)) else [part] + ranked
    tried = list({tuple(p.bounds): p for p in first if p is not None}.values())
    if not tried:
        raise InfeasibleError(_oom_message(cfg, mem), reason="out of memory")
    for p in tried[:-1]:  # Memory does not depend on placement: a split that does not fit is
        try:              # not priced; the other is tried (its ranks may fit where these do not)
            return _fitting(Split(cfg, p.bounds, ma, costs, training), capacity, ma, options)
        except InfeasibleError:
            pass
    return _fitting(Split(cfg, tried[-1].bounds, ma, costs, training), capacity, ma, options)


EVEN_MARGIN = 0.02
"""How much faster the even split of an interleaved schedule's chunks (or its rank-balanced one)
must be, by the schedule's closed form, to replace the memory-bound split: the closed form does
not see how unequal chunks of one round stall each other (Llama-3 70B on 128 H100 at pp 4 x 8:
the even split, 2 and 3 layers a chunk, 0.35% faster than the memory-bound one in closed form,
simulated 27.12 s against 26.50), nor where the simulated schedule holds more activations than
it counts."""


def _interleaved_s(cfg: Config, times: list[float], bounds: list[int]) -> float:
    """The interleaved schedule's closed form (costmodels.pipeline.step_time_s) on ``bounds``'
    chunks of block ``times``: each rank's chunks together."""
    chunks = [sum(times[a:b]) for a, b in zip(bounds, bounds[1:])]
    ranks = [sum(chunks[r::cfg.pp]) for r in range(cfg.pp)]
    return pipeline.step_time_s(ranks, microbatches=cfg.num_microbatches, schedule=cfg.schedule,
                                vpp=cfg.vpp)


def _even_ranks_s(cfg: Config, times: list[float]) -> float:
    """The interleaved schedule's closed form with every rank at an equal share of the time: what
    no split beats (by that form)."""
    share = float(sum(times)) / cfg.pp
    return pipeline.step_time_s([share] * cfg.pp, microbatches=cfg.num_microbatches,
                                schedule=cfg.schedule, vpp=cfg.vpp)


def _fitting(split: Split, capacity: float, ma: ModelArrays, options: SearchOptions) -> Split:
    """``split`` where its ranks fit ``capacity`` and its placement is allowed; raises
    InfeasibleError otherwise."""
    cfg = split.cfg
    if not placements(cfg, ma, options):  # tp-pp-dp pinned and refused
        refused = _refused(cfg, ma, options)
        raise InfeasibleError(f"{cfg.short()}: {refused}", reason=refused)
    if split.peak_memory_bytes > capacity:
        raise InfeasibleError(f"{cfg.short()}: a rank needs {split.peak_memory_bytes / 1e9:.3g} GB",
                              reason="out of memory")
    return split


def placed_estimate(split: Split, cluster: Cluster, options: SearchOptions) -> Estimate:
    """The second half of ``evaluate``: the split does not depend on placement, so each order
    the search may choose is priced on it and the faster kept."""
    cfg = split.cfg
    placed = [split.placed(cfg if o == cfg.placement else cfg.with_(placement=o), cluster)
              for o in placements(cfg, split.ma, options)]
    return split.estimate(min(placed, key=lambda p: p.step_time_s))


def placements(cfg: Config, ma: ModelArrays, options: SearchOptions) -> tuple[str, ...]:
    """The placements (rank orders) ``cfg`` may take: both with pipeline and data parallelism,
    unless pinned or refused (planner.options.pp_inner_refused). Without one of the two they
    are the same ranks, named as the target names its own where it places stages outermost
    only (torchtitan: tp-dp-pp)."""
    if "placement" not in options.fix and (cfg.pp == 1 or cfg.dp == 1):
        return (cfg.placement if options.pp_inner else "tp-dp-pp",)
    orders = (PLACEMENTS if cfg.pp > 1 and cfg.dp > 1 and "placement" not in options.fix
              else (options.fix.get("placement", cfg.placement),))
    if _refused(cfg, ma, options):
        orders = tuple(o for o in orders if o != "tp-pp-dp")
    return orders


def _refused(cfg: Config, ma: ModelArrays, options: SearchOptions) -> str | None:
    return pp_inner_refused(options, pp=cfg.pp, dp=cfg.dp, tp=cfg.tp, cp=cfg.cp, ep=cfg.ep,
                            etp=cfg.etp, experts=bool(ma.work.num_experts.any()))


def _partition(cfg: Config, costs: BlockCosts, mem: StageMemory, splits: dict | None):
    """planner.solve.chain.partition of ``costs``' block times under ``mem``, found once per
    ``splits``."""
    return _memo(splits, (cfg.pp * cfg.vpp, tuple(mem.static), tuple(mem.in_flight),
                          mem.capacity, tuple(mem.shared)), cfg, costs,
                 lambda: partition(costs.split_s(cfg), cfg.pp * cfg.vpp, mem))


def _memo(splits: dict | None, key: tuple, cfg: Config, costs: BlockCosts, find):
    """``find()`` (a split of ``costs``' block times for ``cfg``), found once per ``splits`` and
    ``key`` (what the split depends on besides the block times)."""
    if splits is None:
        return find()
    # the block times, activations and transient bytes are those of ``costs`` (kept alive in
    # the value, so that its id is not reused)
    m = cfg.num_microbatches if costs.accumulate_s.any() else 0  # split_s depends on m only then
    no_virtual = cfg.pp > 1 and cfg.vpp == 1  # (and on this: BlockCosts.ep_comm_1f1b_s)
    key = (id(costs), m, no_virtual, *key)
    hit = splits.get(key)
    if hit is None or hit[0] is not costs:
        hit = splits[key] = (costs, find())
    return hit[1]


def _ranks_may_fit(mem, pp: int, capacity: float) -> bool:
    """Whether the model states and the activations in flight, spread evenly over the pp ranks
    (each chunk's activations times the mean micro-batches in flight), fit ``capacity``: the
    search looks for an uneven split only then (a screen, not a proof; the split found is
    checked exactly)."""
    mean_in_flight = sum(mem.in_flight) / len(mem.in_flight)
    return (sum(mem.static) + mean_in_flight * sum(mem.act)) / pp <= capacity


def _oom_message(cfg: Config, mem: StageMemory) -> str:
    return (f"{cfg.short()}: no split into {cfg.pp * cfg.vpp} stages fits "
            f"{mem.capacity * cfg.vpp / 1e9:.3g} GB per GPU")
