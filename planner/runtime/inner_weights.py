"""Weights inside a tensor-parallel region: sharded with the heads, or kept in step.

Between a column-parallel Linear and its row-parallel partner each tp rank holds the activations
of its own heads (query/key/value heads in contiguous blocks: rank r has heads
[r H/tp, (r + 1) H/tp)). Two kinds of weights live there (planner.trace.tp_roles finds them and
marks their modules ``replicate``):

- one value per head, read with the attention scores (gpt-oss's attention sinks, ``[heads]``):
  each rank keeps its own heads' slice, as Megatron-Core and torchtitan shard them; the module
  reads it through ``reshape(1, -1, 1, 1)``, so the slice needs no other change;
- weights every head shares (Qwen3's ``q_norm`` / ``k_norm``: an RMSNorm over the head
  dimension): every rank keeps them whole, and since each rank's gradient covers its own heads
  only, the gradients are summed over the tp group after backward (what the single process
  computes over all heads), so the copies take the same optimizer step and never drift apart.

A parameter is per-head when it is one-dimensional with as many entries as the module's heads
(``config.num_attention_heads``, or its ``num_heads``). Which modules hold such weights: those the
plan marks ``replicate`` with parameters of their own that a column-parallel Linear feeds (a norm
over each head: its parameters are shared, unless per-head), or that hold the column-parallel
Linears themselves (the attention module, whose forward reads its sinks between them). On the
latter only per-head parameters are placed: the plan does not say whether another parameter of
that module acts inside the split (a scale over the head dimension would) or outside it, so such
a module, or one whose heads the runtime cannot read, is refused rather than left to drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import SpecError


@dataclass
class InnerWeights:
    """This rank's weights inside tensor-parallel regions."""

    tp: int = 1
    tp_index: int = 0
    group: object = None
    sharded: set = field(default_factory=set)
    """FQNs (in the model) of per-head parameters cut to this rank's heads."""
    shared: list = field(default_factory=list)
    """(model, FQN) of parameters every head reads, whole on every rank (gradients summed over
    tp); looked up when used, since data parallelism replaces the parameter objects."""


def inside_modules(roles: dict[str, str], feeds: dict[str, set], present: set[str],
                   modules: dict[str, nn.Module]) -> dict[str, bool]:
    """Modules of this stage, ``replicate`` in the plan, with weights of their own inside a
    split region -> whether a column-parallel Linear feeds them (else they hold one)."""
    out = {}
    for name in sorted(present):
        if roles.get(name) != "replicate" or not any(
                True for _ in modules[name].parameters(recurse=False)):
            continue
        fed = any(roles.get(c) == "colwise" for c in feeds.get(name, ()))
        if fed or any(role == "colwise" and c.startswith(name + ".") for c, role in roles.items()):
            out[name] = fed
    return out


def split_inner(model: nn.Module, names: dict[str, bool], out: InnerWeights) -> None:
    """Cut the per-head parameters of ``model``'s modules ``names`` (inside_modules) to this
    rank's heads and record the shared ones in ``out``."""
    modules = dict(model.named_modules())
    for name, fed in names.items():
        mod = modules[name]
        heads = (getattr(getattr(mod, "config", None), "num_attention_heads", None)
                 or getattr(mod, "num_heads", None))
        for pname, p in list(mod.named_parameters(recurse=False)):
            fqn = f"{name}.{pname}" if name else pname
            if not fed and not (p.dim() == 1 and heads and p.shape[0] == heads):
                known = f"{heads} heads" if heads else "its heads unknown: no num_attention_heads"
                raise SpecError(
                    f"tensor_parallel.{name}: {pname} {tuple(p.shape)} sits on the module that "
                    "holds the split attention's Linears, where the runtime places only one value "
                    f"per head ({known}); plan with --fix tp=1")
            if p.dim() == 1 and heads and p.shape[0] == heads:
                if heads % out.tp:
                    raise SpecError(f"tensor_parallel.{name}: {heads} heads do not divide over "
                                    f"tp={out.tp}; plan another tp")
                local = heads // out.tp
                lo = out.tp_index * local
                setattr(mod, pname, nn.Parameter(p.detach()[lo:lo + local].clone(),
                                                 requires_grad=p.requires_grad))
                out.sharded.add(fqn)
            elif fed:
                out.shared.append((model, fqn))


@torch.no_grad()
def sync_grads(inner: InnerWeights | None) -> None:
    """Sum the shared weights' gradients over the tp group; call after backward, before the
    optimizer step. Under FSDP2 each rank holds the same data-parallel shard as its tp peers."""
    if inner is None or inner.tp <= 1:
        return
    for model, fqn in inner.shared:
        grad = model.get_parameter(fqn).grad
        if grad is None:
            continue
        dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad,
                        group=inner.group)


def gather_heads(t: torch.Tensor, inner: InnerWeights) -> torch.Tensor:
    """The whole per-head parameter from the tp ranks' slices (in tp_index order); every rank of
    the tp group takes part."""
    parts = [torch.empty_like(t) for _ in range(inner.tp)]
    dist.all_gather(parts, t.contiguous(), group=inner.group)
    return torch.cat(parts, dim=0)
