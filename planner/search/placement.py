"""Map the (pp, dp, cp, tp) mesh onto global ranks, and say which links each group crosses.

Ranks fill nodes in order (rank r lives on node r // gpus_per_node). Tensor parallelism is always
innermost (consecutive ranks, so a tp group stays inside one node, as Megatron-LM places it), and
context parallelism next (Megatron-LM's tp-cp-ep-dp-pp order): a replica's shard of one stage is a
block of tp x cp consecutive ranks. Expert parallelism folds over those ranks and the
data-parallel ones (Megatron-Core's "parallel folding"): its groups take etp x ep consecutive
positions of the flattened (tp, cp, dp) index. The placement names the order of the other two
dimensions:

- ``tp-pp-dp``: pipeline neighbours next to each other (p2p on the fast tier when they share a node),
  data-parallel replicas outermost;
- ``tp-dp-pp``: data-parallel peers next to each other (gradient all-reduce on the fast tier),
  pipeline stages outermost (Megatron-LM's default order).
"""

from __future__ import annotations

import functools

import numpy as np

from costmodels.comm import GroupShape, folded
from costmodels.topology import Cluster, LinkSpec
from planner.options import Config


def strides(cfg: Config) -> dict[str, int]:
    """Rank distance between neighbours along each mesh dimension."""
    inner = cfg.tp * cfg.cp
    if cfg.placement == "tp-pp-dp":
        return {"tp": 1, "cp": cfg.tp, "pp": inner, "dp": inner * cfg.pp}
    return {"tp": 1, "cp": cfg.tp, "dp": inner, "pp": inner * cfg.dp}


def rank_of(cfg: Config, *, pp: int, dp: int, tp: int, cp: int = 0) -> int:
    s = strides(cfg)
    return tp * s["tp"] + cp * s["cp"] + pp * s["pp"] + dp * s["dp"]


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
    return group_shape(cfg.tp, 1, g, _starts_mod(0, cfg.tp, cfg.dp * cfg.cp * cfg.pp, g))


def cp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    """The worst placed context-parallel group (cp ranks, tp apart)."""
    g = cluster.gpus_per_node
    return group_shape(cfg.cp, cfg.tp, g, _starts_mod(0, cfg.tp * cfg.cp, cfg.dp * cfg.pp, g))


def dp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    """The worst placed data-parallel group (all start at a tp index and a pipeline rank). With
    context parallelism the group that reduces gradients is dp x cp ranks (the cp ranks hold the
    same weights): its cp members sit tp apart, next to each other."""
    s, g = strides(cfg), cluster.gpus_per_node
    starts = {(t + p * s["pp"]) % g for t in range(min(cfg.tp, g)) for p in range(min(cfg.pp, g))}
    replicas = group_shape(cfg.dp, s["dp"], g, tuple(sorted(starts)))
    if cfg.cp == 1:
        return replicas
    return folded(cp_group(cfg, cluster), replicas)


def ep_groups(cfg: Config, cluster: Cluster) -> tuple[GroupShape, ...]:
    """Per pipeline rank: the worst placed of its expert-parallel groups, ep members etp apart
    along the flattened (tp, cp, dp) index, which runs over consecutive ranks for tp x cp
    positions, then jumps by the data-parallel stride. They differ where stages do not line up
    with the nodes (32-GPU stages on 72-GPU racks: two stages inside a rack, the next across
    two)."""
    return ep_groups_on(cfg, cluster.gpus_per_node)


def ep_groups_on(cfg: Config, gpus_per_node: int) -> tuple[GroupShape, ...]:
    """ep_groups on nodes of ``gpus_per_node`` (what a plan file records of its cluster)."""
    if cfg.ep <= 1:
        return (GroupShape(size=cfg.ep, per_node=1),) * cfg.pp
    per_rank = _fewest_on_a_node_by_rank(cfg.tp * cfg.cp, cfg.dp, cfg.pp, cfg.placement,
                                         gpus_per_node, cfg.ep, cfg.etp)
    return tuple(GroupShape(size=cfg.ep, per_node=n) for n in per_rank)


def etp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    """The expert tensor-parallel group: etp consecutive positions of the same index."""
    return _flat_group(cfg, cluster, cfg.etp, 1)


def edp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    """The group that reduces the experts' gradients: the tp x cp x dp positions holding the same
    experts, etp x ep apart."""
    size = cfg.tp * cfg.cp * cfg.dp // (cfg.ep * cfg.etp)
    return _flat_group(cfg, cluster, size, cfg.ep * cfg.etp)


def _flat_group(cfg: Config, cluster: Cluster, size: int, stride: int) -> GroupShape:
    """The worst placed of the groups of ``size`` positions ``stride`` apart along the flattened
    (tp, cp, dp) index, each group within ``size x stride`` consecutive positions. Counted rank by
    rank: groups need not line up with the tp x cp blocks (ep = 6 over blocks of 4) nor with the
    nodes (blocks of 4 ranks on 72-GPU nodes)."""
    if size <= 1:
        return GroupShape(size=1, per_node=1)
    return GroupShape(size=size, per_node=_fewest_on_a_node_flat(
        cfg.tp * cfg.cp, cfg.dp, cfg.pp, cfg.placement, cluster.gpus_per_node, size, stride))


@functools.lru_cache(maxsize=4096)
def _fewest_on_a_node_flat(inner: int, dp: int, pp: int, order: str, g: int, size: int,
                           stride: int) -> int:
    """The fewest members a node holds of any of ``_flat_group``'s groups, at every pipeline
    rank (_fewest_on_a_node_by_rank's least)."""
    return min(_fewest_on_a_node_by_rank(inner, dp, pp, order, g, size, stride))


@functools.lru_cache(maxsize=4096)
def _fewest_on_a_node_by_rank(inner: int, dp: int, pp: int, order: str, g: int, size: int,
                              stride: int) -> tuple[int, ...]:
    """Per pipeline rank: the fewest members a node holds of any of ``_flat_group``'s groups
    among that rank's ranks (ranks whose offsets on the nodes agree, modulo g, agree)."""
    if (inner * dp) % (size * stride):  # groups that do not tile the ranks (a configuration
        return (1,) * pp  # the rules refuse, priced only to explain why): every member apart
    s = strides(Config(dp=dp, tp=inner, pp=pp, micro_batch=1, num_microbatches=1,
                       placement=order))
    members = np.arange(inner * dp).reshape(-1, size, stride).transpose(0, 2, 1).reshape(-1, size)
    ranks = members % inner + members // inner * s["dp"]
    rank_offsets = np.arange(pp) * s["pp"] % g if pp > 1 else np.zeros(1, dtype=int)
    offsets, which = np.unique(rank_offsets, return_inverse=True)
    nodes = (ranks[None] + offsets[:, None, None]) // g  # (offset, group, member)
    groups = nodes.shape[1]
    group = np.arange(nodes.shape[0] * groups).repeat(size)
    keys, counts = np.unique(group * (int(nodes.max()) + 1) + nodes.ravel(), return_counts=True)
    fewest = np.full(len(offsets), size)
    np.minimum.at(fewest, keys // (int(nodes.max()) + 1) // groups, counts)
    return tuple(int(fewest[i]) for i in np.ravel(which))


def link_between(cfg: Config, cluster: Cluster, rank_a: int, rank_b: int) -> LinkSpec:
    """The link between pipeline ranks ``rank_a`` and ``rank_b``: the inter-node link when any
    replica's pair of ranks sits on two nodes."""
    crosses = _crosses(cfg.tp * cfg.cp, cfg.dp, cfg.pp, cfg.placement, cluster.gpus_per_node,
                       rank_a, rank_b)
    return cluster.inter_node if crosses else cluster.intra_node


@functools.lru_cache(maxsize=65536)
def _crosses(inner: int, dp: int, pp: int, order: str, g: int, rank_a: int, rank_b: int) -> bool:
    """Whether some tp x cp shard of some replica has its stage-a and stage-b ranks on two nodes
    (``inner`` = tp x cp consecutive ranks per replica and stage)."""
    cfg = Config(dp=dp, tp=inner, pp=pp, micro_batch=1, num_microbatches=1, placement=order)
    for d in range(min(dp, g)):
        a, b = sorted((rank_of(cfg, pp=rank_a, dp=d, tp=0), rank_of(cfg, pp=rank_b, dp=d, tp=0)))
        gap = b - a
        last = a % g + inner - 1  # the highest in-node position of a's shards (may wrap)
        if gap >= g or (last if last < g else g - 1) + gap >= g:
            return True
    return False


def next_rank_crosses(cfg: Config, cluster: Cluster) -> np.ndarray:
    """Per pipeline rank r: whether the link to rank (r + 1) mod pp (the next chunk's; with
    interleaving the last rank sends back to the first) is the inter-node one (link_between).
    Read-only; shared by every call with the same mesh."""
    return _next_rank_crosses(cfg.tp * cfg.cp, cfg.dp, cfg.pp, cfg.placement,
                              cluster.gpus_per_node)


@functools.lru_cache(maxsize=4096)
def _next_rank_crosses(inner: int, dp: int, pp: int, order: str, g: int) -> np.ndarray:
    out = np.array([_crosses(inner, dp, pp, order, g, r, (r + 1) % pp) for r in range(pp)])
    out.setflags(write=False)
    return out


def cut_links(cfg: Config, cluster: Cluster) -> list[LinkSpec]:
    """The link each pipeline cut (stage c -> c + 1) crosses."""
    return [link_between(cfg, cluster, c, c + 1) for c in range(cfg.pp - 1)]


def stage_ranks(cfg: Config, stage: int) -> list[int]:
    """Global ranks holding pipeline stage ``stage`` (all its dp replicas, cp and tp shards)."""
    return sorted(rank_of(cfg, pp=stage, dp=d, tp=t, cp=c) for d in range(cfg.dp)
                  for c in range(cfg.cp) for t in range(cfg.tp))
