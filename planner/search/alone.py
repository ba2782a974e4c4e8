"""Each group of a heterogeneous cluster on its own: what a plan over all the groups is measured
against.

A plan over sites joined by slow links (or over two GPU generations) can be slower than the same
job on one of its groups alone: the sends between sites, or the slower devices, cost more than the
extra GPUs give. The search only spreads the job over every group, so each distinct group is
searched alone as well (the same model, batch and pins, but for dp, which follows the GPU
count), and the plan says so where one is faster (planner.report.summary).
"""

from __future__ import annotations

import dataclasses
import json
import logging

from costmodels.errors import PlannerError
from costmodels.topology import HeteroCluster
from planner.options import SearchOptions, TrainingSpec
from planner.search.loop import search
from planner.trace.graph import BlockGraph

log = logging.getLogger(__name__)

MARGIN = 0.02
"""A group alone is said to be faster (or slower) than the plan over every group only beyond this
share of the plan's step: within it they are about as fast (the extra groups add little)."""


def groups_alone(bg: BlockGraph, cluster: HeteroCluster, training: TrainingSpec,
                 options: SearchOptions) -> list[dict]:
    """Per distinct group (same device, size and links as another: searched once, named by the
    first), its best step time alone: {group, gpus, step_time_s, parallel}, or with ``reason``
    where nothing fits it. The global batch is the plan's, so step times compare directly."""
    fix = {k: v for k, v in options.fix.items() if k != "dp"}
    alone = dataclasses.replace(options, fix=fix, top_k=0)
    seen: dict[str, str] = {}
    out = []
    for group in cluster.groups:
        key = json.dumps({**group.to_mapping(), "name": ""}, sort_keys=True, default=str)
        if key in seen:
            continue
        seen[key] = group.name
        row = {"group": group.name, "gpus": group.num_gpus}
        try:
            best = search(bg, group, training, alone).best
        except PlannerError as exc:
            best, row["reason"] = None, str(exc).splitlines()[0]
        if best is None:
            row.setdefault("reason", "no configuration fits")
        else:
            row.update(step_time_s=best.step_time_s, parallel=best.config.short())
        log.info("%s alone (%d GPUs): %s", group.name, group.num_gpus,
                 f"{row['step_time_s']:.4g} s a step" if "step_time_s" in row else row["reason"])
        out.append(row)
    return out
