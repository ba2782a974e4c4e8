"""Map the (pp, dp, tp) mesh onto global ranks, and say which links each group crosses.

Ranks fill nodes in order (rank r lives on node r // gpus_per_node). Tensor parallelism is always
innermost (consecutive ranks, so a tp group stays inside one node, as Megatron-LM places it). The
placement names the order of the other two dimensions:

- ``tp-pp-dp``: pipeline neighbours next to each other (p2p on the fast tier when they share a node),
  data-parallel replicas outermost;
- ``tp-dp-pp``: data-parallel peers next to each other (gradient all-reduce on the fast tier),
  pipeline stages outermost (Megatron-LM's default order).
"""

from __future__ import annotations

import functools

from costmodels.comm import GroupShape
from costmodels.topology import Cluster, LinkSpec
from planner.options import Config


def strides(cfg: Config) -> dict[str, int]:
    """Rank distance between neighbours along each mesh dimension."""
    if cfg.placement == "tp-pp-dp":
        return {"tp": 1, "pp": cfg.tp, "dp": cfg.tp * cfg.pp}
    return {"tp": 1, "dp": cfg.tp, "pp": cfg.tp * cfg.dp}


def rank_of(cfg: Config, *, pp: int, dp: int, tp: int) -> int:
    s = strides(cfg)
    return tp * s["tp"] + pp * s["pp"] + dp * s["dp"]


def group_shape(size: int, stride: int, gpus_per_node: int,
                starts: tuple[int, ...] = (0,)) -> GroupShape:
    """Where the worst placed of the groups of ``size`` ranks, ``stride`` apart, starting at
    ``starts``, sits: the fewest members it has on one node. A group whose ranks do not line up
    with node boundaries (a block of tp x dp = 32 ranks on 72-GPU nodes) has a node with few of
    its members, and those carry the group's inter-node traffic; every group of a collective waits
    for the slowest."""
    if size <= 1:
        return GroupShape(size=1, per_node=1)
    if stride >= gpus_per_node or gpus_per_node % stride:
        return GroupShape(size=size, per_node=1)
    return GroupShape(size=size, per_node=_fewest_on_a_node(size, stride, gpus_per_node,
                                                            tuple(sorted(starts))))


@functools.lru_cache(maxsize=4096)
def _fewest_on_a_node(size: int, stride: int, gpn: int, starts: tuple[int, ...]) -> int:
    full = gpn // stride  # members on a node the group covers whole
    fewest = size
    for r0 in starts:
        first = min(size, -(-(gpn - r0 % gpn) // stride))  # members on the first node
        rest = size - first
        counts = [first] + ([full] if rest >= full else []) + ([rest % full] if rest % full else [])
        fewest = min(fewest, *counts)
    return max(1, fewest)


def _starts_mod(base: int, stride: int, count: int, gpn: int) -> tuple[int, ...]:
    """Distinct ``(base + k * stride) mod gpn`` for k < count (the residues repeat within gpn
    steps)."""
    return tuple(sorted({(base + k * stride) % gpn for k in range(min(count, gpn))}))


def tp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    g = cluster.gpus_per_node
    return group_shape(cfg.tp, 1, g, _starts_mod(0, cfg.tp, cfg.dp * cfg.pp, g))


def dp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    """The worst placed data-parallel group (all start at a tp index and a pipeline rank)."""
    s, g = strides(cfg), cluster.gpus_per_node
    starts = {(t + p * s["pp"]) % g for t in range(min(cfg.tp, g)) for p in range(min(cfg.pp, g))}
    return group_shape(cfg.dp, s["dp"], g, tuple(sorted(starts)))


def link_between(cfg: Config, cluster: Cluster, rank_a: int, rank_b: int) -> LinkSpec:
    """The link between pipeline ranks ``rank_a`` and ``rank_b``: the inter-node link when any
    replica's pair of ranks sits on two nodes."""
    crosses = _crosses(cfg.tp, cfg.dp, cfg.pp, cfg.placement, cluster.gpus_per_node,
                       rank_a, rank_b)
    return cluster.inter_node if crosses else cluster.intra_node


@functools.lru_cache(maxsize=65536)
def _crosses(tp: int, dp: int, pp: int, order: str, g: int, rank_a: int, rank_b: int) -> bool:
    """Whether some tp shard of some replica has its stage-a and stage-b ranks on two nodes."""
    cfg = Config(dp=dp, tp=tp, pp=pp, micro_batch=1, num_microbatches=1, placement=order)
    for d in range(min(dp, g)):
        a, b = sorted((rank_of(cfg, pp=rank_a, dp=d, tp=0), rank_of(cfg, pp=rank_b, dp=d, tp=0)))
        gap = b - a
        last = a % g + tp - 1  # the highest in-node position of a's tp shards (may wrap)
        if gap >= g or (last if last < g else g - 1) + gap >= g:
            return True
    return False


def cut_links(cfg: Config, cluster: Cluster) -> list[LinkSpec]:
    """The link each pipeline cut (stage c -> c + 1) crosses."""
    return [link_between(cfg, cluster, c, c + 1) for c in range(cfg.pp - 1)]


def stage_ranks(cfg: Config, stage: int) -> list[int]:
    """Global ranks holding pipeline stage ``stage`` (all its dp replicas and tp shards)."""
    return sorted(rank_of(cfg, pp=stage, dp=d, tp=t) for d in range(cfg.dp) for t in range(cfg.tp))
