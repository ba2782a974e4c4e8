"""Plans for clusters made of groups of different devices (or sites joined by a slow link).

Every pipeline stage spans ``tp x dp`` GPUs of one group; group g hosts ``gpus_g / (tp x dp)``
consecutive stages (a heterogeneous pipeline in the manner of HetPipe / Metis: fast devices take
more layers). For each configuration and each order of the groups along the pipeline, an exact
dynamic program sizes the stages for their devices' speed and memory; the best candidates are then
re-solved by a CP-SAT model that chooses the group of every stage too (planner.solve.stage_groups), and
re-timed by simulation. Pipeline sends between groups cross the ``inter_group`` link.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np

from costmodels import comm, compute, memory
from costmodels.errors import InfeasibleError, InternalError
from costmodels.topology import HeteroCluster
from planner.errors import SpecError
from planner.options import Config, SearchOptions, TrainingSpec
from planner.search import placement
from planner.search.costs import (BlockCosts, ModelArrays, block_costs, capacity_bytes,
                                  fsdp_pipelined, stage_memory)
from planner.search.dp_traffic import DataParallelBytes, after_tied_sync, exposed_dp_s
from planner.search.pricing import Estimate, assemble, chunks, fp8_refresh_s, rank_memory
from planner.solve.chain import partition, partition_staged
from planner.solve.stage_groups import solve_hetero

GROUP_SCHEDULES = ("1f1b", "gpipe")
"""The schedules priced on device groups (one stage per rank), in the order the search tries them."""


def restrict(options: SearchOptions) -> SearchOptions:
    """``options`` narrowed to what this pricing covers: GPipe and 1F1B with one stage per rank,
    optimizer states on the device. A knob pinned outside that is a SpecError."""
    fix = options.fix
    if "schedule" in fix and fix["schedule"] not in GROUP_SCHEDULES:
        raise SpecError(f"fix.schedule: {fix['schedule']} is not priced on clusters of device "
                        f"groups or sites; use {' or '.join(GROUP_SCHEDULES)}")
    if fix.get("vpp", 1) > 1:
        raise SpecError(f"fix.vpp: clusters of device groups or sites run one stage per rank; "
                        f"drop vpp={fix['vpp']}")
    for key in ("cp", "ep", "etp"):
        if fix.get(key, 1) > 1:
            raise SpecError(f"fix.{key}: context and expert parallelism are not priced on "
                            f"clusters of device groups or sites; drop {key}={fix[key]}")
    if fix.get("offload_optimizer"):
        raise SpecError("fix.offload_optimizer: optimizer offload is not priced on clusters of "
                        "device groups or sites; drop it")
    if fix.get("placement", "tp-dp-pp") != "tp-dp-pp":
        raise SpecError(f"fix.placement: clusters of device groups or sites place each stage's "
                        f"tp x dp ranks together (tp-dp-pp); drop placement={fix['placement']}")
    schedules = tuple(s for s in GROUP_SCHEDULES if s in options.schedules)
    if not schedules:
        raise SpecError(f"target: {options.target} runs none of the schedules priced on clusters "
                        f"with device groups ({', '.join(GROUP_SCHEDULES)}); use --target any")
    return dataclasses.replace(options, schedules=schedules, offload=(False,), vpp=(1,),
                               expert_parallel=False, expert_tensor_parallel=False)


ALL_ORDERS_UP_TO = 3
"""Groups up to this many: every order along the pipeline is priced. More: alike groups (one
device and shape) take the listed order and the cheapest chain through the links between them
(exact, Held-Karp); groups of a few kinds take, for every order of the kinds, the cheapest chain
that keeps each kind together; otherwise the listed order, the cheapest chain and the
nearest-neighbour chain from each group, each both ways. CP-SAT then refines the best plan."""


def kinds(hc: HeteroCluster) -> list[int]:
    """Per group, the index of its kind (device, shape and links inside alike)."""
    seen: dict = {}
    return [seen.setdefault((repr(g.device), g.nodes, g.gpus_per_node, g.intra_node, g.inter_node),
                            len(seen)) for g in hc.groups]


def group_orders(hc: HeteroCluster, cfg: Config) -> list[list[int]]:
    """The orders of the groups along the pipeline to price, as the group of each stage."""
    slots = [g.num_gpus // (cfg.tp * cfg.dp) for g in hc.groups]
    n = len(hc.groups)
    if n <= ALL_ORDERS_UP_TO:
        orders = list(itertools.permutations(range(n)))
    else:
        cost = crossing_costs(hc, cfg, 1e9)
        best = _chain(tuple(tuple(round(c, 9) for c in row) for row in cost))
        kind = kinds(hc)
        count = max(kind) + 1
        if count == 1:  # alike groups joined by symmetric links: an order = its reverse
            orders = list(dict.fromkeys([tuple(range(n)), best]))
        elif count <= ALL_ORDERS_UP_TO:
            members = [[g for g in range(n) if kind[g] == k] for k in range(count)]
            orders = [tuple(range(n))]
            for seq in itertools.permutations(range(count)):
                within = itertools.product(*(itertools.permutations(members[k]) for k in seq))
                chains = (tuple(g for part in parts for g in part)
                          for parts in itertools.islice(within, 5040))
                orders.append(min(chains, key=lambda o: sum(cost[a][b] for a, b in zip(o, o[1:]))))
            orders = list(dict.fromkeys(orders))
        else:
            found = [tuple(range(n)), best]
            for start in range(n):
                chain, left = [start], set(range(n)) - {start}
                while left:
                    nxt = min(left, key=lambda h: (cost[chain[-1]][h], h))
                    chain.append(nxt)
                    left.remove(nxt)
                found.append(tuple(chain))
            orders = list(dict.fromkeys(o for f in found for o in (f, f[::-1])))
    return [[g for g in order for _ in range(slots[g])] for order in orders]


def crossing_costs(hc: HeteroCluster, cfg: Config, nbytes: float) -> list[list[float]]:
    """Seconds for one stage of ``cfg`` (tp x dp GPUs) to send ``nbytes`` per GPU to a stage
    on each other group: the link between the two groups, shared as its scope says."""
    n = len(hc.groups)
    out = [[0.0] * n for _ in range(n)]
    for g in range(n):
        for h in range(n):
            if g != h:
                out[g][h] = comm.p2p_s(nbytes, cross_link(hc, cfg, g, h))
    return out


def crossing_offsets(hc: HeteroCluster, cfg: Config, ma: ModelArrays,
                     stage_group: list[int]) -> list[float] | None:
    """Per stage, the sends it makes across sites per micro-batch (one way to each neighbour on
    another site), at the largest activation a cut may carry: what the split must leave room
    for. None when no stage's neighbour is on another group."""
    if not hc.is_sites or len(ma.cut_bytes) == 0:
        return None
    nbytes = float(np.max(ma.cut_bytes)) * cfg.micro_batch / cfg.tp
    off = [0.0] * len(stage_group)
    for s in range(len(stage_group) - 1):
        g, h = stage_group[s], stage_group[s + 1]
        if g != h:
            t = comm.p2p_s(nbytes, cross_link(hc, cfg, g, h))
            off[s] += t
            off[s + 1] += t
    return off if any(off) else None


def _tie_link(hc: HeteroCluster, cfg: Config, stage_group: list[int], a: int, b: int):
    """The link between stages ``a`` and ``b`` (one a rank): the groups' where they differ;
    inside a group, whose stages' tp x dp ranks lie consecutively, the intra-node one where both
    stages' ranks share a node."""
    g, h = stage_group[a], stage_group[b]
    if g != h:
        return cross_link(hc, cfg, g, h)
    group, width = hc.groups[g], cfg.tp * cfg.dp
    ka, kb = sorted((stage_group[:a].count(g), stage_group[:b].count(g)))
    same = ka * width // group.gpus_per_node == ((kb + 1) * width - 1) // group.gpus_per_node
    return group.intra_node if same else group.inter_node


def cross_link(hc: HeteroCluster, cfg: Config, g: int, h: int):
    """The per-GPU link a stage on group ``g`` sees when all its tp x dp GPUs send to group
    ``h`` at once (sites: the pair's link shared per its scope; else ``inter_group``)."""
    if not hc.is_sites:
        return hc.inter_group
    gpus = cfg.tp * cfg.dp
    nodes = max(1, -(-gpus // hc.groups[g].gpus_per_node))
    return hc.site_link(g, h).per_gpu(gpus, nodes)


@functools.lru_cache(maxsize=256)
def _chain(cost: tuple) -> tuple:
    return cheapest_chain([list(row) for row in cost])


def cheapest_chain(cost: list[list[float]]) -> tuple:
    """The order visiting every group once with the smallest sum of crossing costs (Held-Karp)."""
    n = len(cost)
    best = {(1 << g, g): (0.0, (g,)) for g in range(n)}
    for mask in range(1, 1 << n):
        for last in range(n):
            here = best.get((mask, last))
            if here is None:
                continue
            for nxt in range(n):
                if mask >> nxt & 1:
                    continue
                key = (mask | 1 << nxt, nxt)
                cand = (here[0] + cost[last][nxt], here[1] + (nxt,))
                if key not in best or cand < best[key]:
                    best[key] = cand
    full = (1 << n) - 1
    return min(best[(full, g)] for g in range(n))[1]


def best_order(cfg: Config, ma: ModelArrays, hc: HeteroCluster, training: TrainingSpec,
               options: SearchOptions, costs: list[BlockCosts]) -> Estimate:
    """The fastest placement of the groups along the pipeline (each order priced)."""
    found, last = [], None
    orders = group_orders(hc, cfg)
    kind = kinds(hc)
    splits: dict = {}  # the split depends on the kind of device of each stage only
    for order in orders:
        key = tuple(kind[g] for g in order)
        try:
            if uniform(hc) or key not in splits:
                est = evaluate_hetero(cfg, order, ma, hc, training, options, costs)
                splits[key] = [0] + list(itertools.accumulate(len(st.blocks) for st in est.stages))
            else:
                est = price_hetero(cfg, splits[key], order, ma, costs, hc, training)
            found.append(est)
        except InfeasibleError as exc:
            last = exc
    if not found:
        raise last
    return min(found, key=lambda e: e.step_time_s)


UNIFORM_REFINE_S = 2.0
"""CP-SAT seconds spent re-checking the best plan on alike groups (sites of one kind), whose
stage split (exact dynamic program) and chain of sites (exact Held-Karp over the crossings) are
already computed exactly; CP-SAT reports its status and gap on the joint model."""


def uniform(hc: HeteroCluster) -> bool:
    """Every group alike (device, shape, links inside): groups differ only in where they are."""
    first = hc.groups[0]
    return all((g.device, g.nodes, g.gpus_per_node, g.intra_node, g.inter_node) ==
               (first.device, first.nodes, first.gpus_per_node, first.intra_node, first.inter_node)
               for g in hc.groups[1:])


def group_costs(ma: ModelArrays, hc: HeteroCluster, training: TrainingSpec, *, tp: int, sp: bool,
                recompute: str, micro_batch: int) -> list[BlockCosts]:
    """Per group, every block's costs on its device (planner.search.costs.block_costs)."""
    return [block_costs(ma, g, training, tp=tp, sp=sp, recompute=recompute,
                        micro_batch=micro_batch) for g in hc.groups]


def _costs_of(cfg: Config, ma: ModelArrays, hc: HeteroCluster, training) -> list[BlockCosts]:
    return group_costs(ma, hc, training, tp=cfg.tp, sp=cfg.sequence_parallel,
                       recompute=cfg.recompute, micro_batch=cfg.micro_batch)


def evaluate_hetero(cfg: Config, stage_group: list[int], ma: ModelArrays, hc: HeteroCluster,
                    training: TrainingSpec, options: SearchOptions,
                    costs: list[BlockCosts] | None = None) -> Estimate:
    """Size the stages (exact DP) for a given group of every stage, then price the step."""
    costs = costs or _costs_of(cfg, ma, hc, training)
    if uniform(hc):  # every stage on the same device: the homogeneous exact split, with each
        cap = capacity_bytes(hc.groups[0], options)  # stage's sends across sites counted in
        part = partition(costs[0].split_s(cfg), cfg.pp,
                         stage_memory(cfg, costs[0], ma, training, cap),
                         offsets=crossing_offsets(hc, cfg, ma, stage_group))
    else:
        caps = [capacity_bytes(hc.groups[g], options) for g in stage_group]
        part = partition_staged([costs[g].split_s(cfg) for g in stage_group],
                                cfg.pp,
                                stage_memory(cfg, costs[0], ma, training, 0.0), caps)
    if part is None:
        raise InfeasibleError(f"{cfg.short()}: no split fits the groups' memory", reason="out of memory")
    return price_hetero(cfg, part.bounds, stage_group, ma, costs, hc, training)


def price_hetero(cfg: Config, bounds: list[int], stage_group: list[int], ma: ModelArrays,
                 costs: list[BlockCosts], hc: HeteroCluster, training: TrainingSpec) -> Estimate:
    """Each stage priced on its group's device; sends between groups cross ``inter_group`` (or the
    pair's link, for sites). A stage's tp x dp ranks are consecutive in its group (the
    ``tp-dp-pp`` order), which is where its sends and its gradient all-reduce go."""
    lay = cfg.with_(placement="tp-dp-pp")
    group_of_block = np.concatenate([[stage_group[s]] * (b - a)
                                     for s, (a, b) in enumerate(zip(bounds, bounds[1:]))])
    stitched = BlockCosts(**{f.name: np.choose(group_of_block, [getattr(c, f.name) for c in costs])
                             for f in dataclasses.fields(BlockCosts)
                             if f.name != "cp_comm" and getattr(costs[0], f.name) is not None})
    sends, cuts = [0.0] * cfg.pp, []
    for s in range(cfg.pp - 1):
        g, h = stage_group[s], stage_group[s + 1]
        link = cross_link(hc, cfg, g, h) if g != h else placement.link_between(lay, hc.groups[g],
                                                                                0, 1)
        one_way = comm.p2p_s(ma.cut_bytes[bounds[s + 1] - 1] * cfg.micro_batch / cfg.tp, link)
        sends[s] += one_way
        sends[s + 1] += one_way * ma.work.runs_backward[bounds[s + 1] - 1]  # (its gradient)
        cuts.append(one_way)
    stages = chunks(cfg, bounds, ma, stitched, sends)
    ranks, held = rank_memory(cfg, bounds, stages, ma, stitched, training)
    tails, opt_s = np.zeros(cfg.pp), 0.0
    traffic = memory.optimizer_traffic_bytes(dtype=training.dtype, optimizer=training.optimizer,
                                             layout=training.engine.state_layout)
    per = DataParallelBytes.of(training)
    for st in stages:
        group = hc.groups[stage_group[st.index]]
        tails[st.rank] = exposed_dp_s(cfg, st.params, per, placement.dp_group(lay, group), group,
                                      st.compute_s, st.compute_s - st.fwd_s,
                                      training.engine.overlaps_reduction(zero=cfg.zero,
                                                                         pp=cfg.pp),
                                      pipelined=fsdp_pipelined(cfg, training),
                                      gather_overlap=training.engine.overlap_param_gather,
                                      frozen=st.frozen_params,
                                      forward_only=st.forward_only_params)
        shard = cfg.dp if cfg.zero >= 1 else 1
        refresh = fp8_refresh_s(held, training, group.device)[st.rank]  # (one stage a rank)
        opt_s = max(opt_s, compute.optimizer_step_s((st.params - st.frozen_params) / shard,
                                                    group.device,
                                                    traffic_bytes_per_param=traffic) + refresh)
    dp_s = max(0.0, float(np.max(after_tied_sync(tails, held.ties, per, functools.partial(
        _tie_link, hc, cfg, stage_group)))))
    est = assemble(lay, stages, ranks, dp_s, opt_s, ma, training, cuts)  # as laid out
    offsets = list(itertools.accumulate([0] + [g.num_gpus for g in hc.groups]))
    width = cfg.tp * cfg.dp
    for st in est.stages:
        g = stage_group[st.index]
        k = stage_group[:st.index].count(g)  # k-th stage on this group
        st.group = hc.groups[g].name
        st.ranks = list(range(offsets[g] + k * width, offsets[g] + (k + 1) * width))
    return est


def repriced(est: Estimate, ma: ModelArrays, hc: HeteroCluster,
             training: TrainingSpec) -> Estimate:
    """``est``'s configuration, stage split and stage groups priced under ``training`` (another
    dtype) and its schedule simulated: what the same plan costs with that software (the groups'
    counterpart of planner.search.refine.repriced)."""
    from planner.search.refine import simulated  # lazy: refine is the phase after this one

    cfg = est.config
    names = {g.name: i for i, g in enumerate(hc.groups)}
    bounds = [0] + list(itertools.accumulate(len(st.blocks) for st in est.stages))
    if [list(st.blocks) for st in est.stages] != [list(ma.names[a:b])
                                                   for a, b in zip(bounds, bounds[1:])]:
        raise InternalError("hetero.repriced: the stages' blocks are not consecutive in the "
                            "model's order, which pricing on device groups keeps")
    priced = price_hetero(cfg, bounds, [names[st.group] for st in est.stages], ma,
                          _costs_of(cfg, ma, hc, training), hc, training)
    return simulated(priced, training)


def refine_groups(est: Estimate, ma: ModelArrays, hc: HeteroCluster, training: TrainingSpec,
                  options: SearchOptions, budget_s: float) -> Estimate:
    """Let CP-SAT choose every stage's group and size; keep the DP's answer unless it is beaten."""
    cfg = est.config
    costs = _costs_of(cfg, ma, hc, training)
    names = {g.name: i for i, g in enumerate(hc.groups)}
    stage_group = [names[st.group] for st in est.stages]
    bounds = [0] + list(itertools.accumulate(len(st.blocks) for st in est.stages))
    slots = [stage_group.count(g) for g in range(len(hc.groups))]
    edges = [(b, b + 1) for b in range(len(ma.names) - 1)]  # stages stay contiguous in order
    # a boundary between groups costs the sending stage the largest activation's send, both ways
    cut = float(np.max(ma.cut_bytes)) * cfg.micro_batch / cfg.tp if len(ma.cut_bytes) else 0.0
    cross = [[2 * c for c in row] for row in crossing_costs(hc, cfg, cut)] if hc.is_sites else None
    res = solve_hetero([c.split_s(cfg) for c in costs], slots, edges,
                       stage_memory(cfg, costs[0], ma, training, 0.0),
                       [capacity_bytes(g, options) for g in hc.groups],
                       time_limit_s=budget_s, seed=options.cpsat_seed, hint=(bounds, stage_group),
                       cross=cross)
    if res is None:
        return dataclasses.replace(est, split_status="feasible", split_gap=None)
    old = max(st.compute_s + st.tp_comm_s for st in est.stages)
    if res.bottleneck >= old * (1 - 1e-6) and cross is None:
        return dataclasses.replace(est, split_status=res.status, split_gap=res.gap)
    better = price_hetero(cfg, res.bounds, res.group_of_stage, ma, costs, hc, training)
    if better.step_time_s >= est.step_time_s:
        return dataclasses.replace(est, split_status=res.status, split_gap=res.gap)
    return dataclasses.replace(better, stage_split="cp-sat", split_status=res.status,
                               split_gap=res.gap)
