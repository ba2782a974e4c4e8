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


def group_shape(size: int, stride: int, gpus_per_node: int) -> GroupShape:
    """Where a group of ``size`` ranks, ``stride`` apart, sits."""
    if size <= 1:
        return GroupShape(size=1, per_node=1)
    if stride >= gpus_per_node or gpus_per_node % stride:
        return GroupShape(size=size, per_node=1)
    return GroupShape(size=size, per_node=min(size, gpus_per_node // stride))


def tp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    return group_shape(cfg.tp, 1, cluster.gpus_per_node)


def dp_group(cfg: Config, cluster: Cluster) -> GroupShape:
    return group_shape(cfg.dp, strides(cfg)["dp"], cluster.gpus_per_node)


def link_between(cfg: Config, cluster: Cluster, rank_a: int, rank_b: int) -> LinkSpec:
    """The link between pipeline ranks ``rank_a`` and ``rank_b`` (same dp and tp index)."""
    s, g = strides(cfg)["pp"], cluster.gpus_per_node
    same_node = s < g and g % s == 0 and (rank_a * s) // g == (rank_b * s) // g
    return cluster.intra_node if same_node else cluster.inter_node


def cut_links(cfg: Config, cluster: Cluster) -> list[LinkSpec]:
    """The link each pipeline cut (stage c -> c + 1) crosses."""
    return [link_between(cfg, cluster, c, c + 1) for c in range(cfg.pp - 1)]


def stage_ranks(cfg: Config, stage: int) -> list[int]:
    """Global ranks holding pipeline stage ``stage`` (all its dp replicas and tp shards)."""
    return sorted(rank_of(cfg, pp=stage, dp=d, tp=t) for d in range(cfg.dp) for t in range(cfg.tp))
