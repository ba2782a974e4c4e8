"""Tensor parallelism, activation recomputation and data parallelism on one stage's modules.

Order as in torchtitan: tensor parallelism (DTensor ``parallelize_module``), then activation
checkpointing (composable ``checkpoint``, which keeps module names), then data parallelism
(``replicate`` for ZeRO 0, FSDP2 ``fully_shard`` for ZeRO >= 1; both are FSDP2-based, so they
compose with DTensor tensor parallelism and with torch.distributed.pipelining).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from planner.errors import SpecError
from planner.trace.tp_roles import ROLE_KINDS
from planner.trace.tracers import module_kind

log = logging.getLogger(__name__)

TP_ROLES = tuple(ROLE_KINDS)


def check_modules(roles: dict[str, str], modules: dict) -> None:
    """Refuse (SpecError naming the module) a tensor-parallel role on a module the runtime cannot
    shard: 'vocab' on anything but nn.Embedding, the Linear roles on anything but nn.Linear (a
    Hugging Face GPT-2's Conv1D)."""
    for name, role in roles.items():
        mod = modules.get(name)
        if role not in TP_ROLES or mod is None:
            continue
        if module_kind(mod) == ROLE_KINDS[role]:
            continue
        if role == "vocab":
            raise SpecError(f"tensor_parallel.{name}: 'vocab' needs an nn.Embedding, found "
                            f"{type(mod).__name__}")
        raise SpecError(f"tensor_parallel.{name}: the runtime shards nn.Linear and nn.Embedding "
                        f"only, this is {type(mod).__name__}; plan with --target torch (what plan "
                        f"run runs) or --fix tp=1")


def tp_styles(roles: dict[str, str], feeds: dict[str, set], present: set[str],
              modules: dict[str, nn.Module], tp: int) -> tuple[dict, list[str]]:
    """DTensor styles for the plan's ``tensor_parallel`` map, restricted to ``present`` modules.

    A column-parallel Linear that feeds a row-parallel one keeps its output sharded (Megatron's
    pair); one that feeds none (a vocabulary head) gathers its output. Returns the styles and the
    deviations from the plan (modules left replicated, with the reason). Weights inside a pair's
    region (per-head norms, attention sinks) are planner.runtime.inner_weights' part."""
    styles, notes = {}, []
    shared = SharedInput()
    partners = {c for r, src in feeds.items() if roles.get(r) == "rowwise" for c in src}
    check_modules({n: r for n, r in roles.items() if n in present}, modules)
    for name, role in roles.items():
        if role not in TP_ROLES or name not in present:
            continue
        mod = modules[name]
        if role == "vocab":
            if mod.num_embeddings % tp:
                notes.append(f"{name} replicated: {mod.num_embeddings} rows do not divide tp={tp}")
                continue
            styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
            continue
        size = mod.out_features if role == "colwise" else mod.in_features
        if size % tp:
            raise SpecError(f"tensor_parallel.{name}: {size} features do not divide tp={tp}; plan "
                            "another tp")
        if role == "rowwise":
            if not any(roles.get(c) == "colwise" for c in feeds.get(name, ())):
                raise SpecError(f"tensor_parallel.{name}: row-parallel but no column-parallel "
                                "Linear feeds it; re-create the plan")
            styles[name] = RowwiseParallel()
        elif name in partners:
            styles[name] = SharedInputColwise(shared)
        else:
            styles[name] = SharedInputColwise(shared, output_layouts=Replicate())
    return styles, notes


@dataclass
class SharedInput:
    """The last plain tensor a column-parallel Linear read, and its replicated DTensor."""

    source: torch.Tensor | None = None
    dtensor: DTensor | None = None


class SharedInputColwise(ColwiseParallel):
    """ColwiseParallel whose Linears reading the same tensor (query/key/value, gate/up) read one
    replicated DTensor made from it, as Megatron's fused column-parallel Linear does.

    Each Linear's input gradient is a partial sum over the tensor-parallel ranks; with one shared
    DTensor, autograd adds the partial sums first and the backward all-reduces once per tensor
    (one per attention and one per MLP) instead of once per Linear, which is what the cost model
    prices. Only the most recent tensor is remembered, so nothing outlives its use."""

    def __init__(self, shared: SharedInput, **kwargs):
        super().__init__(**kwargs)
        # ColwiseParallel._apply binds (input_layouts, desired_input_layouts) to this callable.
        self._prepare_input_fn = functools.partial(_shared_prepare, shared)


def _shared_prepare(shared: SharedInput, input_layouts, desired_input_layouts, mod, inputs,
                    device_mesh):
    x = inputs[0]
    if isinstance(x, DTensor) or tuple(input_layouts) != (Replicate(),):
        return ColwiseParallel._prepare_input_fn(input_layouts, desired_input_layouts, mod,
                                                 inputs, device_mesh)
    if shared.source is not x or shared.dtensor is None or shared.dtensor.device_mesh != device_mesh:
        shared.source = x
        shared.dtensor = DTensor.from_local(x, device_mesh, (Replicate(),), run_check=False)
    return shared.dtensor


HEAD_COUNTS = ("num_heads", "n_heads", "num_key_value_heads")
"""Attributes in which an attention module keeps its head counts (Whisper's and BART's
``num_heads``, T5's ``n_heads``), which its forward reads to shape its tensors."""


def apply_tp(model: nn.Module, mesh, styles: dict) -> None:
    """Apply the DTensor ``styles``; a module whose column-parallel Linears now compute its
    heads' share on each rank has its head counts (HEAD_COUNTS) divided by tp to match (a view
    to ``[batch, tokens, num_heads, head_dim]`` would otherwise fold the missing heads into the
    tokens)."""
    if not styles:
        return
    parallelize_module(model, mesh, styles)
    tp = mesh.size()
    holders = {name.rpartition(".")[0] for name, style in styles.items()
               if isinstance(style, ColwiseParallel)}
    for name in holders:
        mod = model.get_submodule(name)
        for attr in HEAD_COUNTS:
            count = getattr(mod, attr, None)
            if not isinstance(count, int) or isinstance(count, bool):
                continue
            if count % tp:
                raise SpecError(f"tensor_parallel.{name}: its {attr} = {count} does not divide "
                                f"over tp={tp}, as its split Linears' heads must; plan another tp")
            setattr(mod, attr, count // tp)


def apply_recompute(model: nn.Module, units: tuple[str, ...], policy: str) -> None:
    """``full``: recompute each unit's forward in backward. ``selective``: keep the outputs of
    matrix multiplications and recompute everything else (attention core, norms, activations),
    in the spirit of Megatron-LM's selective recomputation (Korthikanti et al. 2022)."""
    if policy == "none":
        return
    from torch.distributed._composable import checkpoint  # lazy: only recomputing plans need it

    context = None
    if policy == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts  # lazy: only selective recomputation

        context = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
    for name in units:
        if context is None:
            checkpoint(model.get_submodule(name))
        else:
            checkpoint(model.get_submodule(name), context_fn=context)


_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def _save_matmuls(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy  # lazy: only selective recomputation

    return (CheckpointPolicy.MUST_SAVE if op in _MATMULS else CheckpointPolicy.PREFER_RECOMPUTE)


def apply_dp(stage: nn.Module, units: tuple[str, ...], mesh, zero: int,
             ignored: set | None = None) -> str:
    """Wrap for data parallelism; returns what was applied, for the report.

    ZeRO 0: ``replicate`` (DDP semantics: full replicas, gradients all-reduced once per step).
    ZeRO 1 and 2: ``fully_shard(reshard_after_forward=False)``: parameters stay gathered from
    forward to backward, gradients are reduce-scattered and optimizer states sharded. That is
    ZeRO-2; FSDP2 has no ZeRO-1 (it never keeps full gradients), so ZeRO-1 runs as ZeRO-2.
    ZeRO 3: ``fully_shard(reshard_after_forward=True)`` per unit (units that share a weight with
    another unit or with a module outside the units stay in the stage's group, which FSDP2 needs
    of a parameter). ``mesh`` is the dp (x cp)
    group, or its 2-D (replicate, shard) form for data parallelism across sites (HSDP);
    ``ignored`` parameters (routed experts, reduced over their own group) are left alone."""
    if mesh is None:
        return "none"
    ignored = ignored or None
    if zero == 0:
        from torch.distributed._composable.replicate_with_fsdp import replicate  # lazy: recent torch only; only ZeRO-0 with dp > 1

        replicate(stage, mesh=mesh, ignored_params=ignored)
        return "replicate"
    from torch.distributed.fsdp import fully_shard  # lazy: only ZeRO >= 1 with dp > 1

    reshard = zero >= 3
    owners: dict[int, set[str]] = {}
    for name in units:
        for p in stage.model.get_submodule(name).parameters():
            owners.setdefault(id(p), set()).add(name)
    for name, p in stage.model.named_parameters(remove_duplicate=False):
        if id(p) in owners and not any(name.startswith(u + ".") for u in units):
            owners[id(p)].add("")  # also reached outside the units (T5's ``shared`` embedding)
    tied = {u for us in owners.values() if len(us) > 1 for u in us if u}
    for name in units:
        if name in tied:  # a weight shared with another unit (tied embedding and output head):
            continue      # one FSDP group must own it, the stage's own below
        fully_shard(stage.model.get_submodule(name), mesh=mesh, reshard_after_forward=reshard,
                    ignored_params=ignored)
    fully_shard(stage, mesh=mesh, reshard_after_forward=reshard, ignored_params=ignored)
    hybrid = (f", HSDP: {mesh.size(1)} shards x {mesh.size(0)} replicas"
              if mesh.ndim == 2 else "")  # sharded inside a site, replicated across the sites
    return f"fully_shard (ZeRO-{3 if reshard else 2}{hybrid})"
