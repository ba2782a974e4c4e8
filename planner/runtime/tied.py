"""Parameters shared by two stages (tied input and output embeddings), kept equal across stages.

Each stage holds its own copy, initialized identically. After the backward of a step, the copies'
gradients are summed (an all-reduce among the ranks that hold the stages, one group per data-,
context- and tensor-parallel coordinate, or a local sum when one rank holds both stages), so every
copy takes the same optimizer step: Megatron-LM's treatment of the word embeddings shared by the
first and last pipeline stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from planner.runtime.layout import Layout


@dataclass(frozen=True)
class Tie:
    """One parameter under several names, in different stages."""

    names: tuple[tuple[int, str], ...]
    """(stage, parameter FQN in the model) for each stage that holds a copy."""


@dataclass
class TieSync:
    """This rank's part of keeping the tied copies equal."""

    local: list = field(default_factory=list)
    """(Tie, [(StageModule, name)] held here, process group or None)."""


def find_ties(model: nn.Module, units: list[list[str]]) -> list[Tie]:
    """Parameters reachable under units of more than one stage."""
    stage_of = {u: s for s, us in enumerate(units) for u in us}
    by_param: dict[int, dict[int, str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        unit = next((u for u in stage_of if name.startswith(u + ".")), None)
        if unit is not None:
            by_param.setdefault(id(p), {}).setdefault(stage_of[unit], name)
    return [Tie(names=tuple(sorted(stages.items())))
            for stages in by_param.values() if len(stages) > 1]


def tie_sync(ties: list[Tie], layout: Layout, rank: int, modules: dict) -> TieSync:
    """Create the process groups (every rank, same order) and keep those this rank belongs to.

    ``modules``: stage index -> StageModule on this rank."""
    out = TieSync()
    me = layout.coords(rank)
    for tie in ties:
        pps = sorted({layout.stage_pp_rank[s] for s, _ in tie.names})
        held = [(modules[s], name) for s, name in tie.names if s in modules]
        mine = None
        for d in range(layout.dp):
            for c in range(layout.cp):
                for t in range(layout.tp):
                    ranks = [layout.rank_of(pp=p, dp=d, cp=c, tp=t) for p in pps]
                    group = dist.new_group(ranks) if len(ranks) > 1 else None
                    if (d, c, t) == (me["dp"], me["cp"], me["tp"]):
                        mine = group
        if held:
            out.local.append((tie, held, mine))
    return out


@torch.no_grad()
def sync_grads(sync: TieSync) -> None:
    """Sum the gradients of every tied copy; call after backward, before the optimizer step."""
    for _, held, group in sync.local:
        grads = [_local(module.model.get_parameter(name).grad) for module, name in held]
        grads = [g for g in grads if g is not None]
        if not grads:
            continue
        total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0].clone()
        if group is not None:
            dist.all_reduce(total, group=group)
        for g in grads:
            g.copy_(total)


def _local(t):
    if t is None:
        return None
    return t.to_local() if hasattr(t, "to_local") else t
