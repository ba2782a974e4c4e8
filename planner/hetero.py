"""Plans for clusters made of groups of different devices (or sites joined by a slow link).

Every pipeline stage spans ``tp x dp`` GPUs of one group; group g hosts ``gpus_g / (tp x dp)``
consecutive stages (a heterogeneous pipeline in the manner of HetPipe / Metis: fast devices take
more layers). For each configuration and each order of the groups along the pipeline, an exact
dynamic program sizes the stages for their devices' speed and memory; the best candidates are then
re-solved by a CP-SAT model that chooses the group of every stage too (planner.solve.hetero), and
re-timed by simulation. Pipeline sends between groups cross the ``inter_group`` link.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import time
from collections import Counter

import numpy as np

from costmodels import comm, compute, memory, pipeline
from costmodels.errors import InfeasibleError
from costmodels.hardware import DTYPE_BYTES
from costmodels.topology import HeteroCluster
from planner import placement
from planner.evaluate import BlockCosts, ModelArrays, block_costs, capacity_bytes
from planner.graph import BlockGraph
from planner.options import Config, SearchOptions, TrainingSpec
from planner.pricing import Estimate, assemble, chunks, exposed_dp_s, rank_memory
from planner.refine import simulated
from planner.solve.chain import StageMemory, partition_staged
from planner.solve.hetero import solve_hetero
from planner.solve.search import SearchResult
from planner.space import divisors

log = logging.getLogger(__name__)

CPSAT_TIME_LIMIT_S = 10.0


def search_hetero(bg: BlockGraph, hc: HeteroCluster, training: TrainingSpec,
                  options: SearchOptions, progress=None) -> SearchResult:
    t0 = time.perf_counter()
    ma = ModelArrays.from_blocks(bg)
    rejected: Counter = Counter()
    keep, heap, count = options.top_k + 1, [], 0
    cache: dict[tuple, list[BlockCosts]] = {}
    for cfg, orders in _configs(bg, hc, training, options, rejected):
        count += 1
        if options.time_limit_s is not None and time.perf_counter() - t0 > options.time_limit_s:
            rejected["not evaluated (time limit)"] += 1
            continue
        key = (cfg.tp, cfg.sequence_parallel, cfg.recompute, cfg.micro_batch)
        if key not in cache:
            cache[key] = _group_costs(cfg, ma, hc, training)
        costs = cache[key]
        fastest = np.min([c.time_s for c in costs], axis=0).sum()
        bound = fastest * (cfg.num_microbatches + cfg.pp - 1) / cfg.pp
        if len(heap) == keep and bound >= -heap[0][0]:
            rejected["dominated (bound)"] += 1
            continue
        try:
            est = _best_order(cfg, orders, ma, hc, training, options, costs)
        except InfeasibleError as exc:
            rejected[exc.reason] += 1
            continue
        item = (-est.step_time_s, -count, est)
        if len(heap) < keep:
            heapq.heappush(heap, item)
        else:
            rejected["slower than the top k"] += 1
            if est.step_time_s < -heap[0][0]:
                heapq.heapreplace(heap, item)
    ranked = [e for _, _, e in sorted(heap, key=lambda it: (-it[0], -it[1]))]
    ranked = sorted((simulated(_cpsat(e, bg, ma, hc, training, options), training) for e in ranked),
                    key=lambda e: e.step_time_s)
    status = "feasible" if ranked and ranked[0].split_status != "optimal" else "optimal"
    if progress:
        progress(count, count)
    return SearchResult(best=ranked[0] if ranked else None, alternatives=ranked[1:],
                        candidates=count, evaluated=len(ranked), rejected=rejected, status=status,
                        time_s=time.perf_counter() - t0,
                        gap=ranked[0].split_gap if status == "feasible" and ranked else 0.0)


def _best_order(cfg, orders, ma, hc, training, options, costs) -> Estimate:
    """The fastest placement of the groups along the pipeline (each order priced)."""
    found, last = [], None
    for order in orders:
        try:
            found.append(evaluate_hetero(cfg, order, ma, hc, training, options, costs))
        except InfeasibleError as exc:
            last = exc
    if not found:
        raise last
    return min(found, key=lambda e: e.step_time_s)


def _configs(bg: BlockGraph, hc: HeteroCluster, training: TrainingSpec, options: SearchOptions,
             rejected: Counter):
    """(Config, group order) pairs. Stage width tp x dp must divide every group's GPUs."""
    fix = dict(options.fix)
    gpn = math.gcd(*(g.gpus_per_node for g in hc.groups))
    width_limit = math.gcd(*(g.num_gpus for g in hc.groups))
    tp_divs = sorted({d for b in bg.blocks for d in b.tp_divisors})
    for tp in [fix["tp"]] if "tp" in fix else divisors(gpn):
        if gpn % tp or any(d % tp for d in tp_divs):
            rejected["tp must divide every group's GPUs per node and the heads"] += 1
            continue
        for dp in [fix["dp"]] if "dp" in fix else divisors(width_limit // tp if width_limit % tp == 0 else 1):
            slots = [g.num_gpus // (tp * dp) for g in hc.groups]
            if any(g.num_gpus % (tp * dp) for g in hc.groups):
                rejected["tp x dp must divide every group's GPUs"] += 1
                continue
            pp = sum(slots)
            if ("pp" in fix and fix["pp"] != pp) or pp > len(bg.blocks) or training.global_batch % dp:
                rejected["pp or batch does not fit the groups"] += 1
                continue
            orders = [[g for g in order for _ in range(slots[g])]
                      for order in itertools.permutations(range(len(hc.groups)))]
            for cfg in _inner(fix, tp, dp, pp, training, options):
                yield cfg, orders


def _inner(fix, tp, dp, pp, training: TrainingSpec, options: SearchOptions):
    gb = training.global_batch
    for mb in [fix["micro_batch"]] if "micro_batch" in fix else divisors(gb // dp):
        if (gb // dp) % mb:
            continue
        for rc in [fix["recompute"]] if "recompute" in fix else options.recompute:
            for sp in [fix["sequence_parallel"]] if "sequence_parallel" in fix else (
                    [False, True] if tp > 1 else [False]):
                for zero in [fix["zero"]] if "zero" in fix else (options.zero if dp > 1 else [0]):
                    for sched in [fix["schedule"]] if "schedule" in fix else (
                            ["1f1b", "gpipe"] if pp > 1 else ["1f1b"]):
                        yield Config(dp=dp, tp=tp, pp=pp, micro_batch=mb,
                                     num_microbatches=gb // (dp * mb), schedule=sched,
                                     recompute=rc, zero=zero, sequence_parallel=sp)


def _group_costs(cfg: Config, ma: ModelArrays, hc: HeteroCluster, training) -> list[BlockCosts]:
    return [block_costs(ma, g, training, tp=cfg.tp, sp=cfg.sequence_parallel,
                        recompute=cfg.recompute, micro_batch=cfg.micro_batch) for g in hc.groups]


def _stage_memory(cfg: Config, costs: BlockCosts, training, ma) -> StageMemory:
    bpp = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                       zero=cfg.zero, dp=cfg.dp)
    in_flight = [pipeline.in_flight(cfg.schedule, stage=s, stages=cfg.pp,
                                    microbatches=cfg.num_microbatches) for s in range(cfg.pp)]
    return StageMemory(static=(costs.params_local * bpp).tolist(), act=costs.act_bytes.tolist(),
                       work=costs.work_bytes.tolist(), in_flight=in_flight, capacity=0.0,
                       shared=[(a, b, bpp * (n / cfg.tp if s else n)) for a, b, n, s in ma.shared])


def evaluate_hetero(cfg: Config, stage_group: list[int], ma: ModelArrays, hc: HeteroCluster,
                    training: TrainingSpec, options: SearchOptions,
                    costs: list[BlockCosts] | None = None) -> Estimate:
    """Size the stages (exact DP) for a given group of every stage, then price the step."""
    costs = costs or _group_costs(cfg, ma, hc, training)
    caps = [capacity_bytes(hc.groups[g], options) for g in stage_group]
    part = partition_staged([costs[g].time_s.tolist() for g in stage_group], cfg.pp,
                            _stage_memory(cfg, costs[0], training, ma), caps)
    if part is None:
        raise InfeasibleError(f"{cfg.short()}: no split fits the groups' memory", reason="out of memory")
    return price_hetero(cfg, part.bounds, stage_group, ma, costs, hc, training)


def price_hetero(cfg: Config, bounds: list[int], stage_group: list[int], ma: ModelArrays,
                 costs: list[BlockCosts], hc: HeteroCluster, training: TrainingSpec) -> Estimate:
    """Each stage priced on its group's device; sends between groups cross ``inter_group``."""
    group_of_block = np.concatenate([[stage_group[s]] * (b - a)
                                     for s, (a, b) in enumerate(zip(bounds, bounds[1:]))])
    stitched = BlockCosts(**{f.name: np.choose(group_of_block, [getattr(c, f.name) for c in costs])
                             for f in dataclasses.fields(BlockCosts)})
    sends, cuts = [0.0] * cfg.pp, []
    for s in range(cfg.pp - 1):
        g, h = stage_group[s], stage_group[s + 1]
        link = hc.inter_group if g != h else placement.link_between(cfg, hc.groups[g], 0, 1)
        one_way = comm.p2p_s(ma.cut_bytes[bounds[s + 1] - 1] * cfg.micro_batch / cfg.tp, link)
        sends[s] += one_way
        sends[s + 1] += one_way
        cuts.append(one_way)
    stages = chunks(cfg, bounds, ma, stitched, sends)
    ranks = rank_memory(cfg, bounds, stages, ma, stitched, training)
    dp_s = opt_s = 0.0
    state_b = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                           zero=0, dp=1)
    for st in stages:
        group = hc.groups[stage_group[st.index]]
        nbytes = st.params * DTYPE_BYTES[training.dtype]
        dp_s = max(dp_s, exposed_dp_s(cfg, nbytes, placement.dp_group(cfg, group), group,
                                      st.compute_s, st.compute_s - st.fwd_s,
                                      training.engine.overlap_grad_reduce))
        shard = cfg.dp if cfg.zero >= 1 else 1
        opt_s = max(opt_s, compute.optimizer_step_s(st.params / shard, group.device,
                                                    state_bytes_per_param=state_b))
    est = assemble(cfg, stages, ranks, dp_s, opt_s, ma, training, cuts)
    offsets = list(itertools.accumulate([0] + [g.num_gpus for g in hc.groups]))
    width = cfg.tp * cfg.dp
    for st in est.stages:
        g = stage_group[st.index]
        k = stage_group[:st.index].count(g)  # k-th stage on this group
        st.group = hc.groups[g].name
        st.ranks = list(range(offsets[g] + k * width, offsets[g] + (k + 1) * width))
    return est


def _cpsat(est: Estimate, bg: BlockGraph, ma: ModelArrays, hc: HeteroCluster,
           training: TrainingSpec, options: SearchOptions) -> Estimate:
    """Let CP-SAT choose every stage's group and size; keep the DP's answer unless it is beaten."""
    cfg = est.config
    costs = _group_costs(cfg, ma, hc, training)
    names = {g.name: i for i, g in enumerate(hc.groups)}
    stage_group = [names[st.group] for st in est.stages]
    bounds = [0] + list(itertools.accumulate(len(st.blocks) for st in est.stages))
    slots = [stage_group.count(g) for g in range(len(hc.groups))]
    edges = [(b, b + 1) for b in range(len(ma.names) - 1)]  # stages stay contiguous in order
    res = solve_hetero([c.time_s.tolist() for c in costs], slots, edges,
                       _stage_memory(cfg, costs[0], training, ma),
                       [capacity_bytes(g, options) for g in hc.groups],
                       time_limit_s=CPSAT_TIME_LIMIT_S, hint=(bounds, stage_group))
    if res is None:
        return dataclasses.replace(est, split_status="feasible", split_gap=None)
    old = max(st.compute_s + st.tp_comm_s for st in est.stages)
    if res.bottleneck >= old * (1 - 1e-6):
        return dataclasses.replace(est, split_status=res.status, split_gap=res.gap)
    better = price_hetero(cfg, res.bounds, res.group_of_stage, ma, costs, hc, training)
    return dataclasses.replace(better, stage_split="cp-sat", split_status=res.status,
                               split_gap=res.gap)
