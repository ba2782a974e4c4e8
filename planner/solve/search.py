"""Search the configuration space for the fastest plan that fits.

For every group of configurations sharing per-block costs (tp, sequence parallel, recomputation,
micro-batch) the costs are computed once; each configuration is then split into stages by the chain
solver and priced. A lower bound on the step time (the pipeline on perfectly balanced stages) skips
configurations that cannot enter the top k. With a time limit the search stops early and reports
status ``feasible``; an exhaustive search reports ``optimal`` (optimal under the cost model).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from costmodels import memory
from costmodels.errors import InfeasibleError
from costmodels.topology import Cluster
from planner.evaluate import Estimate, ModelArrays, block_costs, capacity_bytes, evaluate
from planner.graph import BlockGraph
from planner.options import SearchOptions, TrainingSpec
from planner.refine import refine
from planner.space import enumerate_space

log = logging.getLogger(__name__)


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


def search(bg: BlockGraph, cluster: Cluster, training: TrainingSpec, options: SearchOptions,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    t0 = time.perf_counter()
    ma = ModelArrays.from_blocks(bg)
    rejected: Counter = Counter()
    tp_divs = sorted({d for b in bg.blocks for d in b.tp_divisors})
    groups = list(enumerate_space(num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                                  num_blocks=len(bg.blocks), tp_divisors=tp_divs,
                                  training=training, options=options, rejected=rejected))
    total = sum(len(c) for _, c in groups)
    keep = options.top_k + 1
    heap: list[tuple[float, int, Estimate]] = []  # max-heap on step time via negation
    capacity = capacity_bytes(cluster, options)
    done = evaluated = 0
    status = "optimal"
    for key, configs in groups:
        if options.time_limit_s is not None and time.perf_counter() - t0 > options.time_limit_s:
            status = "feasible"
            rejected["not evaluated (time limit)"] += total - done
            break
        costs = block_costs(ma, cluster, training, tp=key.tp, sp=key.sp, recompute=key.recompute,
                            micro_batch=key.micro_batch)
        total_time = float(costs.time_s.sum())
        total_params = float(costs.params_local.sum())
        for cfg in configs:
            done += 1
            bpp = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                               zero=cfg.zero, dp=cfg.dp,
                                               offload=cfg.offload_optimizer)
            if total_params * bpp / cfg.pp > capacity:
                rejected["out of memory"] += 1
                continue
            bound = total_time + (cfg.num_microbatches - 1) * total_time / cfg.pp
            if len(heap) == keep and bound >= -heap[0][0]:
                rejected["dominated (bound)"] += 1
                continue
            try:
                est = evaluate(cfg, ma, costs, cluster, training, options)
            except InfeasibleError as exc:
                rejected[exc.reason] += 1
                continue
            evaluated += 1
            item = (-est.step_time_s, -done, est)
            if len(heap) < keep:
                heapq.heappush(heap, item)
            elif est.step_time_s < -heap[0][0]:
                heapq.heapreplace(heap, item)
                rejected["slower than the top k"] += 1
            else:
                rejected["slower than the top k"] += 1
        if progress:
            progress(done, total)
    ranked = [e for _, _, e in sorted(heap, key=lambda it: (-it[0], -it[1]))]
    deadline = None if options.time_limit_s is None else t0 + options.time_limit_s
    ranked = [e for e in refine(ranked, bg, ma, cluster, training, options, deadline)
              if e.peak_memory_bytes <= capacity]
    # Unknown gap when the time limit cut the enumeration; else the stage split's (0 for chains).
    gap = None if status == "feasible" else 0.0
    if ranked and ranked[0].split_status != "optimal" and status == "optimal":
        status, gap = "feasible", ranked[0].split_gap
    return SearchResult(best=ranked[0] if ranked else None, alternatives=ranked[1:],
                        candidates=total, evaluated=evaluated, rejected=rejected, status=status,
                        time_s=time.perf_counter() - t0, gap=gap)
