"""Where the ranks of a plan sit on a cluster of sites, and what that placement costs.

The search (planner.search.hetero) places every pipeline stage's tp x dp ranks inside one site and
chains the stages through as few slow links as it can. People without a planner get one of two
placements instead: the naive one (ranks numbered site after site, the framework's rank order:
tp fastest, then dp, then pp, as Megatron-LM and torchrun do it) or, when the machines come from a
pool, a random one. This module prices any placement of the (stage, replica) shards with one step
model, so that the three can be compared on equal terms (``plan show``):

    slot  = max over stages of (the slowest replica's compute per micro-batch
                                 + the sends on its two boundaries)
    step  = (micro-batches + pp - 1) x slot + the slowest stage's gradient all-reduce
            (exposed unless the engine overlaps it with the backward) + optimizer

Sends and all-reduces take the link between the two ranks: inside a node, between nodes of a
site, or between sites (the pair's link, shared by the transfers that cross it at once as its
``per`` scope says). A data-parallel group spread over sites reduces hierarchically: inside each
site, then across sites on the slowest link it spans, then back.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from costmodels import comm
from costmodels.topology import HeteroCluster
from planner.options import Config
from planner.search.hetero import group_costs
from planner.search.dp_traffic import DataParallelBytes

RANDOM_SAMPLES = 20
"""Random placements averaged for the comparison."""


@dataclass(frozen=True)
class Slot:
    """Where one tp group of one (stage, replica) sits."""

    site: int
    node: int
    """The node's index inside its site."""


def naive(hc: HeteroCluster, cfg: Config) -> dict:
    """(stage, replica) -> Slot for ranks numbered site after site in tp-dp-pp order."""
    return _from_ranks(hc, cfg, list(range(hc.num_gpus)))


def shuffled(hc: HeteroCluster, cfg: Config, seed: int) -> dict:
    ranks = list(range(hc.num_gpus))
    random.Random(seed).shuffle(ranks)
    return _from_ranks(hc, cfg, ranks)


def from_stage_sites(hc: HeteroCluster, cfg: Config, stage_site: list[int]) -> dict:
    """The search's placement: stage s's replicas packed, in order, into site ``stage_site[s]``."""
    used = [0] * len(hc.groups)
    out = {}
    for s, g in enumerate(stage_site):
        site = hc.groups[g]
        for d in range(cfg.dp):
            first = used[g] + d * cfg.tp
            out[s, d] = Slot(g, first // site.gpus_per_node)
        used[g] += cfg.tp * cfg.dp
    return out


def _from_ranks(hc: HeteroCluster, cfg: Config, order: list[int]) -> dict:
    """Global rank r (tp-dp-pp: tp fastest) runs on the GPU ``order[r]`` of the site-ordered
    list; a (stage, replica)'s tp group is placed by its first rank."""
    where = []
    for g, site in enumerate(hc.groups):
        where += [Slot(g, i // site.gpus_per_node) for i in range(site.num_gpus)]
    out = {}
    for s in range(cfg.pp):
        for d in range(cfg.dp):
            out[s, d] = where[order[(s * cfg.dp + d) * cfg.tp]]
    return out


def step_s(hc: HeteroCluster, cfg: Config, slots: dict, stage_compute: list[list[float]],
           cut_bytes: list[float], stage_grad_bytes: list[float], overlap: bool,
           optimizer_s: float = 0.0) -> dict:
    """The step under ``slots``. ``stage_compute[s][g]``: stage s's seconds per micro-batch on
    site g's device (forward, backward, recomputation, tensor-parallel communication);
    ``cut_bytes[s]``: bytes one replica's tp group sends from stage s to s + 1 per micro-batch
    (all its GPUs together); ``stage_grad_bytes[s]``: one GPU's gradient bytes of stage s.

    In every slot all stages send at once, so the transfers that cross from one site to another
    share that pair's link as its scope says (one pipe per site, one NIC per node, or one per GPU)."""
    pp, dp = cfg.pp, cfg.dp
    crossing: dict = {}  # (site, site) -> {sender key -> bytes}
    local = [0.0] * pp
    for s in range(pp - 1):
        for d in range(dp):
            a, b = slots[s, d], slots[s + 1, d]
            if a.site == b.site:
                site = hc.groups[a.site]
                tier = site.intra_node if a.node == b.node else site.inter_node
                local[s] = max(local[s], comm.p2p_s(cut_bytes[s] / cfg.tp, tier))
                continue
            link = hc.site_link(a.site, b.site)
            owner = {"site": a.site, "node": (a.site, a.node), "gpu": (s, d)}[link.per]
            senders = crossing.setdefault((a.site, b.site), {})
            senders[owner] = senders.get(owner, 0.0) + cut_bytes[s] / (cfg.tp if link.per == "gpu"
                                                                         else 1)
    pair_s = {}
    for (g, h), senders in crossing.items():
        link = hc.site_link(g, h)
        pair_s[g, h] = link.latency_s + max(senders.values()) / (link.bandwidth_bytes_per_s *
                                                                  link.efficiency)
    out_s = [0.0] * pp  # each boundary's one-way send, charged to both of its stages
    for s in range(pp - 1):
        out_s[s] = local[s]
        for d in range(dp):
            a, b = slots[s, d], slots[s + 1, d]
            if a.site != b.site:
                out_s[s] = max(out_s[s], pair_s[a.site, b.site])
    slot_s, dp_s = 0.0, []
    for s in range(pp):
        compute = max(stage_compute[s][slots[s, d].site] for d in range(dp))
        slot_s = max(slot_s, compute + out_s[s] + (out_s[s - 1] if s else 0.0))
        dp_s.append(_allreduce_s(hc, cfg, [slots[s, d] for d in range(dp)], stage_grad_bytes[s]))
    sends = out_s
    grads = max(dp_s) if dp_s else 0.0
    bwd = min(stage_compute[s][slots[s, 0].site] for s in range(pp)) * cfg.num_microbatches * 2 / 3
    slow = max(group.device.overlap_slowdown for group in hc.groups)  # compute beside it
    exposed = comm.beside_compute_s(grads, bwd, slow) if overlap else grads
    return {"step_s": (cfg.num_microbatches + pp - 1) * slot_s + exposed + optimizer_s,
            "slot_s": slot_s, "send_s": max(sends) if sends else 0.0, "grad_sync_s": grads}


def _allreduce_s(hc: HeteroCluster, cfg: Config, members: list[Slot], nbytes: float) -> float:
    """Ring all-reduce of ``nbytes`` per GPU over the replicas of one stage (each tp shard in
    parallel): inside a site on its slowest tier; across sites hierarchically, the two at once
    (the slower sets the time, as comm.allreduce_s has it)."""
    if len(members) <= 1 or nbytes <= 0:
        return 0.0
    by_site: dict = {}
    for m in members:
        by_site.setdefault(m.site, []).append(m)
    inside = 0.0
    for g, ms in by_site.items():
        site = hc.groups[g]
        tier = site.intra_node if len({m.node for m in ms}) == 1 else site.inter_node
        inside = max(inside, comm.ring_allreduce_s(nbytes, len(ms), tier))
    if len(by_site) == 1:
        return inside
    sites = sorted(by_site)
    k = min(len(by_site[g]) for g in sites)  # the shard each site's members carry across
    across = 0.0
    for i, g in enumerate(sites):  # a ring over the sites: each hop on its pair's link
        h = sites[(i + 1) % len(sites)]
        link = hc.site_link(g, h).per_gpu(k * cfg.tp, max(1, k * cfg.tp // hc.groups[g].gpus_per_node))
        across = max(across, comm.ring_allreduce_s(nbytes / k, len(sites), link))
    return max(inside, across)


def compare(hc: HeteroCluster, cfg: Config, chosen: list[int], stage_compute, cut_bytes,
            stage_grad_bytes, overlap: bool, optimizer_s: float = 0.0) -> dict:
    """The plan's placement, the naive one and random ones, priced alike."""
    def price(slots):
        return step_s(hc, cfg, slots, stage_compute, cut_bytes, stage_grad_bytes, overlap,
                      optimizer_s)["step_s"]

    rand = [price(shuffled(hc, cfg, seed)) for seed in range(RANDOM_SAMPLES)]
    return {"planned_s": price(from_stage_sites(hc, cfg, chosen)),
            "naive_s": price(naive(hc, cfg)),
            "random_mean_s": sum(rand) / len(rand), "random_min_s": min(rand),
            "random_max_s": max(rand), "random_samples": len(rand)}


def placement_report(est, ma, hc: HeteroCluster, training) -> dict:
    """For a plan on sites: its placement, the naive one and random ones, priced alike."""
    cfg = est.config
    costs = group_costs(ma, hc, training, tp=cfg.tp, sp=cfg.sequence_parallel,
                        recompute=cfg.recompute, micro_batch=cfg.micro_batch)
    names = {g.name: i for i, g in enumerate(hc.groups)}
    bounds, b = [0], 0
    for st in est.stages:
        b += len(st.blocks)
        bounds.append(b)
    stage_compute = [[float(c.time_s[bounds[s]:bounds[s + 1]].sum()) for c in costs]
                     for s in range(len(est.stages))]
    cut = [float(ma.cut_bytes[bounds[s + 1] - 1]) * cfg.micro_batch
           if s + 1 < len(est.stages) else 0.0 for s in range(len(est.stages))]
    per = DataParallelBytes.of(training)  # the all-reduce moves gradients as kept
    grads = [(st.params - st.frozen_params) * per.grads for st in est.stages]
    chosen = [names[st.group] for st in est.stages]
    out = compare(hc, cfg, chosen, stage_compute, cut, grads,
                  training.engine.overlaps_reduction(zero=cfg.zero, pp=cfg.pp),
                  est.breakdown.get("optimizer_s", 0.0))
    out["model"] = ("slot model: (micro-batches + pp - 1) x slowest (compute + sends) + exposed "
                    "gradient all-reduce (planner.search.sites)")
    return out
