"""Each group of a heterogeneous cluster on its own: what a plan over all the groups is measured
against.

A plan over sites joined by slow links (or over two GPU generations) can be slower than the same
job on one of its groups alone: the sends between sites, or the slower devices, cost more than the
extra GPUs give. The search only spreads the job over every group, so each distinct group is
searched alone as well: the same model, batch, and the pins that mean the same on fewer GPUs
(not dp or pp, which the GPU count sizes), as `plan solve` plans that group alone (every
schedule, offloading, context and expert parallelism: the line's advice is to plan it so; until
2026-12-05 under the search over groups' rules, GPipe or 1F1B and one stage per rank, and a
new-user check read "no site alone runs the job" of a site that plans with its optimizer
offloaded); the plan says so where one is faster (planner.report.summary).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from costmodels.errors import PlannerError
from costmodels.topology import Cluster, HeteroCluster
from planner.options import SearchOptions, TrainingSpec
from planner.search.loop import search
from planner.trace.graph import BlockGraph

log = logging.getLogger(__name__)

MARGIN = 0.02
"""A group alone is said to be faster (or slower) than the plan over every group only beyond this
share of the plan's step: within it they are about as fast (the extra groups add little)."""
SIZED_BY_GPUS = ("dp", "pp", "vpp")
"""Pins a GPU count sizes: left out when a group is searched alone."""
MIN_TIME_S = 1.0
"""Seconds each group's search gets at least when the planning has a time limit."""


def groups_alone(bg: BlockGraph, cluster: HeteroCluster, training: TrainingSpec,
                 options: SearchOptions, time_left_s: float | None = None) -> list[dict]:
    """Per distinct group (same device, size and link figures as another: searched once, named by
    the first), its best step time alone: {group, gpus, step_time_s, parallel}, or {group, gpus,
    reason} where nothing fits it. The global batch is the plan's, so step times compare
    directly, and each group is searched as a plan on it alone would be (every schedule,
    offloading, context and expert parallelism: the advice is to plan it so). ``time_left_s``:
    what is left of the planning's time limit, shared by the groups."""
    fix = {k: v for k, v in options.fix.items() if k not in SIZED_BY_GPUS}
    distinct: dict[str, Cluster] = {}
    for group in cluster.groups:
        distinct.setdefault(_figures(group), group)
    limit = None if time_left_s is None else max(MIN_TIME_S, time_left_s / len(distinct))
    alone = dataclasses.replace(options, fix=fix, top_k=0, time_limit_s=limit)
    out = []
    for group in distinct.values():
        t0 = time.perf_counter()
        row = {"group": group.name, "gpus": group.num_gpus}
        try:
            best = search(bg, group, training, alone).best
        except PlannerError as exc:
            best, row["reason"] = None, str(exc).splitlines()[0]
        if best is None:
            row.setdefault("reason", "no configuration fits")
        else:
            row.update(step_time_s=best.step_time_s, parallel=best.config.short())
        log.info("%s alone (%d GPUs): %s (%.1f s)", group.name, group.num_gpus,
                 f"{row['step_time_s']:.4g} s a step" if "step_time_s" in row else row["reason"],
                 time.perf_counter() - t0)
        out.append(row)
    return out


def _figures(group: Cluster) -> str:
    """What prices a group: its device and size and its links' figures (not names or text)."""
    def link(spec) -> str:
        return repr(dataclasses.replace(spec, name=""))

    return repr((repr(group.device), group.nodes, group.gpus_per_node, link(group.intra_node),
                 link(group.inter_node)))


def standing(t: float, step_s: float) -> str:
    """faster, about or slower: a step of ``t`` seconds against ``step_s``, alike within
    MARGIN."""
    return "faster" if t < (1 - MARGIN) * step_s else "about" if t <= (1 + MARGIN) * step_s \
        else "slower"


def verdict(rows: list[dict], step_s: float, *, sites: bool, kinds: int,
            groups: int = 0) -> tuple[str, str]:
    """(faster, about, slower or unfit; the sentence) comparing the plan's step (``step_s``, over
    every group) with each group alone (``rows``: groups_alone's); ``kinds``: how many device
    kinds the cluster has (the slower devices are blamed only where there are two or more);
    ``groups``: how many groups or sites it has (with three or more, some of them together may
    beat one alone, which no search here tries)."""
    word = "site" if sites else "group"
    timed = [a for a in rows if "step_time_s" in a]
    unfit = "; ".join(f"{a['group']} ({a['gpus']} GPUs): {a['reason']}" for a in rows
                      if "step_time_s" not in a)
    if not timed:
        return "unfit", f"no {word} alone runs the job: {unfit}"
    best = min(timed, key=lambda a: a["step_time_s"])
    each = "; ".join(f"{a['group']} ({a['gpus']} GPUs) {a['step_time_s']:.4g} s"  # (fastest
                     for a in sorted(timed, key=lambda a: a["step_time_s"]))    # first)
    kind = standing(best["step_time_s"], step_s)
    if kind == "faster":
        text = (
            f"one {word} alone is faster: {each} a step, against {step_s:.4g} s over every {word} "
            f"({step_s / best['step_time_s']:.2f}x slower): the links between {word}s"
            f"{' or the slower devices' if kinds > 1 else ''} cost more than the extra GPUs "
            f"give; plan on {best['group']} alone (a cluster file of that {word} only, as "
            "examples/site_a_alone.yaml)" + (
                f", or on some of the {word}s (a cluster file of those: not searched here, "
                "and it may beat one alone)" if groups > 2 else ""))
    elif kind == "about":
        text = (f"one {word} alone is about as fast: {each} a step, against "
                               f"{step_s:.4g} s over every {word}: the other {word}s add little")
    else:
        text = (f"each {word} alone {'that runs the job ' if unfit else ''}is "
                                f"slower: {each} a step, against {step_s:.4g} s over every "
                                f"{word}")
    return kind, text + (f"; nothing fits {unfit}" if unfit else "")
