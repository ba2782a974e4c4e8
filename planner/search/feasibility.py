"""When nothing fits: the leanest configuration's memory, and what would make it fit."""

from __future__ import annotations

import math
from dataclasses import replace

from costmodels import memory, pipeline
from costmodels.topology import Cluster
from planner.options import Config, SearchOptions, TrainingSpec
from planner.search.costs import ModelArrays, block_costs, capacity_bytes
from planner.search.pricing import price
from planner.search.space import Space, divisors, pp_reason, tp_reason
from planner.solve.chain import partition
from planner.trace.graph import BlockGraph
from planner.units import gb


def leanest(ma: ModelArrays, bg: BlockGraph, cluster: Cluster, training: TrainingSpec,
            options: SearchOptions) -> tuple[float, Config] | None:
    """The smallest peak memory per GPU any configuration reaches (batch divisibility ignored)."""
    n, space = cluster.num_gpus, Space.of(cluster, bg)
    rc = "full" if "full" in options.recompute else options.recompute[-1]
    zero = max(options.zero)
    best = None
    for tp in divisors(n):
        if tp_reason(tp, space):
            continue
        costs = block_costs(ma, cluster, training, tp=tp, sp=tp > 1, recompute=rc, micro_batch=1)
        for pp in divisors(n // tp):
            if pp_reason(pp, 1, space):
                continue
            dp = n // (tp * pp)
            m = max(1, training.global_batch // dp)
            z = zero if dp > 1 else 0
            cfg = Config(dp=dp, tp=tp, pp=pp, micro_batch=1, num_microbatches=m,
                         schedule="1f1b", recompute=rc, zero=z, sequence_parallel=tp > 1,
                         offload_optimizer=any(options.offload) and z >= 1)
            bpp = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                               zero=cfg.zero, dp=dp, offload=cfg.offload_optimizer)
            first = pipeline.in_flight("1f1b", stage=0, stages=pp, microbatches=m)
            weights = (costs.params_local * bpp + first * costs.act_bytes + costs.work_bytes).tolist()
            part = partition(weights, pp)
            if part is None:
                continue
            est = price(cfg, part.bounds, ma, costs, cluster, training)
            if best is None or est.peak_memory_bytes < best[0]:
                best = (est.peak_memory_bytes, cfg)
    return best


def explain_infeasible(ma: ModelArrays, bg: BlockGraph, cluster: Cluster, training: TrainingSpec,
                       options: SearchOptions, rejected_summary: str) -> str:
    """One line: what the leanest plan needs, what the device offers, and what would fit."""
    cap = capacity_bytes(cluster, options)
    lean = leanest(ma, bg, cluster, training, options)
    if lean is None:
        return f"no configuration is possible on {cluster.num_gpus} GPUs ({rejected_summary})"
    need, cfg = lean
    if need <= cap:
        return (f"no configuration fits the constraints ({rejected_summary}); the leanest one "
                f"({cfg.short()}) would need {gb(need)} per GPU: relax --fix")
    hint = _more_nodes_hint(ma, bg, cluster, training, options, cap)
    device_gb = (need + options.memory_reserve_bytes) / (1 - options.memory_reserve_fraction) / 1e9
    return (f"no plan fits: the leanest ({cfg.short()}) needs {gb(need)} per GPU but a "
            f"{cluster.device.name} leaves {gb(cap)} usable; it would fit on a device with "
            f">= {math.ceil(device_gb)} GB{hint}")


def _more_nodes_hint(ma, bg, cluster, training, options, cap) -> str:
    for factor in (2 ** k for k in range(1, 13)):
        bigger = replace(cluster, nodes=cluster.nodes * factor)
        lean = leanest(ma, bg, bigger, training, options)
        if lean is not None and lean[0] <= cap:
            return f", or on {bigger.nodes} nodes ({bigger.num_gpus} GPUs)"
    return ""
