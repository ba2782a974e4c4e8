"""Expert parallelism: the routed experts of each MoE layer spread over an expert-parallel group.

transformers (5.x) keeps a layer's routed experts in one module with 3-D parameters ``[E, ...]``
(Mixtral's and Qwen3-MoE's ``gate_up_proj`` and ``down_proj``), called as
``experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])`` after the router. With
``ep > 1`` each rank keeps ``E / ep`` consecutive experts (same parameter names, first dimension
cut) and the module's forward becomes:

1. sort the T x k (token, expert) pairs by expert; exchange the per-expert counts with the group,
   then the tokens themselves (an all-to-all with uneven splits: each rank receives the tokens
   routed to its experts, from every rank of the group);
2. run the local experts on what arrived, with transformers' own expert code (the module's class
   forward, here with E / ep experts, each token sent to one of them with weight 1);
3. send the results back by the reverse all-to-all, weight them by the router's probabilities and
   sum each token's k results, in the same order as transformers does.

Both all-to-alls are autograd functions whose backward is the opposite all-to-all. gloo runs
``all_to_all_single`` with uneven splits on the CPU (checked on torch 2.13), but the runtime
exchanges the rows by batched point-to-point sends instead (``all_to_all`` below: faster here, and
torch.profiler's memory timeline, which gives the CPU peak, fails on steps that run gloo's
all-to-all). torchtitan's expert-parallel code (0.2.2, in .venv/engines) imports only
with triton on the path and expects its own ``GroupedExperts`` (w1/w2/w3, token counts as
input), not transformers' fused experts, so the runtime has this compact version instead.

With tensor parallelism (no sequence parallelism) the tp ranks hold the same tokens; the
expert-parallel group folds over them (Megatron-Core's parallel folding), so each tp rank routes
its 1/tp of the tokens and the results are gathered over tp afterwards (the gradients' way back:
the slice's backward gathers, the gather's backward slices).

Gradients: the experts' are summed over the expert-data-parallel group (edp ranks holding the same
experts) and divided by dp x cp, as the dense parameters' are averaged over dp x cp by the data
parallel wrapper, which leaves the expert parameters alone (``ignored_params``).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import SpecError
from planner.trace.hf import experts_modules


def check_model(module: nn.Module, ep: int, etp: int) -> None:
    """Refuse (SpecError naming ep) what the runtime cannot spread over ep ranks."""
    if etp > 1:
        raise SpecError(f"parallel.etp: the runtime does not split experts' matrices (etp={etp}); "
                        "re-plan with --fix etp=1 (or --target torch)")
    found = experts_modules(module)
    if not found:
        raise SpecError(f"parallel.ep: ep={ep} but {type(module).__name__} has no routed-experts "
                        "module the runtime knows (transformers' experts with [E, ...] "
                        "parameters); plan with --fix ep=1")
    for name, mod in found.items():
        if mod.num_experts % ep:
            raise SpecError(f"parallel.ep: {name} has {mod.num_experts} experts, which do not "
                            f"divide over ep={ep} ranks; plan another ep")


@dataclass
class ExpertGroups:
    """This rank's expert-parallel, expert-data-parallel and tensor-parallel groups."""

    ep: int
    ep_index: int
    ep_group: object
    edp_group: object | None
    """None when edp = 1."""
    tp: int
    tp_index: int
    tp_group: object | None
    grad_divisor: int
    """dp x cp: the experts' summed gradients are divided by it (the dense ones are averaged
    over dp x cp)."""
    params: list = field(default_factory=list)
    """Every expert parameter this rank holds."""
    routing: list = field(default_factory=list)
    """Per MoE layer call on this rank (recomputed forwards too): ([busiest local expert's token
    copies, all of them, from every rank of the group] as a tensor read after the timed steps,
    the layer's experts): routing_summary."""
    recording: bool = True
    """False while torch's pipelining infers the stages' shapes with a forward of its own
    (on uninitialized tensors past the first stage): record_routing_outside."""


def all_to_all(out: torch.Tensor, inp: torch.Tensor, out_sizes: list[int], in_sizes: list[int],
               group) -> None:
    """``all_to_all_single(out, inp, out_sizes, in_sizes)`` as batched point-to-point sends and
    receives (rows ``in_sizes[p]`` go to group rank p, ``out_sizes[p]`` rows come from it; empty
    slices are skipped on both sides, which agree on the sizes). gloo's own all_to_all_single
    gives the same numbers, but half as fast for two ranks (0.98 against 0.50 ms for 512 KB here)
    and torch.profiler's memory timeline fails on the steps that run it ("duplicate outputs"),
    which left expert-parallel runs without a measured peak."""
    ranks = dist.get_process_group_ranks(group)
    me = dist.get_rank(group)
    outs, ins = out.split(out_sizes), inp.split(in_sizes)
    ops = []
    for p, peer in enumerate(ranks):
        if p == me:
            outs[p].copy_(ins[p])
            continue
        if in_sizes[p]:
            ops.append(dist.P2POp(dist.isend, ins[p].contiguous(), peer, group))
        if out_sizes[p]:
            ops.append(dist.P2POp(dist.irecv, outs[p], peer, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


class _AllToAll(torch.autograd.Function):
    """All-to-all of rows with uneven splits; the backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_sizes: list[int], in_sizes: list[int], group):
        ctx.sizes, ctx.group = (out_sizes, in_sizes), group
        out = x.new_empty((sum(out_sizes), *x.shape[1:]))
        all_to_all(out, x.contiguous(), out_sizes, in_sizes, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_sizes, in_sizes = ctx.sizes
        back = grad.new_empty((sum(in_sizes), *grad.shape[1:]))
        all_to_all(back, grad.contiguous(), in_sizes, out_sizes, ctx.group)
        return back, None, None, None


class _SliceTP(torch.autograd.Function):
    """This tp rank's rows of a tensor every tp rank holds whole; the backward gathers the
    rows' gradients from all tp ranks (each rank then holds the whole gradient)."""

    @staticmethod
    def forward(ctx, x, index: int, size: int, group):
        ctx.index, ctx.size, ctx.group = index, size, group
        return x.chunk(size, dim=0)[index].contiguous()

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(ctx.size)]
        dist.all_gather(parts, grad.contiguous(), group=ctx.group)
        return torch.cat(parts, dim=0), None, None, None


class _GatherTP(torch.autograd.Function):
    """The rows of every tp rank, concatenated; the backward keeps this rank's rows."""

    @staticmethod
    def forward(ctx, x, index: int, size: int, group):
        ctx.index, ctx.size = index, size
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=0)[ctx.index].contiguous(), None, None, None


def shard_experts(model: nn.Module, groups: ExpertGroups) -> list[str]:
    """Keep this rank's E/ep experts of every routed-experts module and route tokens over the
    group. Returns the FQNs of the expert parameters (names unchanged)."""
    names = []
    for fqn, mod in experts_modules(model).items():
        total = mod.num_experts
        local = total // groups.ep
        lo = groups.ep_index * local
        for pname, p in list(mod.named_parameters(recurse=False)):
            keep = nn.Parameter(p.detach()[lo:lo + local].clone(), requires_grad=p.requires_grad)
            setattr(mod, pname, keep)
            groups.params.append(keep)
            names.append(f"{fqn}.{pname}" if fqn else pname)
        mod.num_experts = local
        mod.__dict__["_planner_ep"] = (groups, total)
        mod.forward = types.MethodType(_expert_parallel_forward, mod)
    return names


def _expert_parallel_forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    groups, total = self.__dict__["_planner_ep"]
    local, ep = total // groups.ep, groups.ep
    split_tp = groups.tp > 1
    if split_tp:
        if hidden.shape[0] % groups.tp:
            raise SpecError(f"parallel.ep: {hidden.shape[0]} tokens per micro-batch do not split "
                            f"over tp={groups.tp} ranks; plan another micro_batch or seq_len")
        args = (groups.tp_index, groups.tp, groups.tp_group)
        hidden = _SliceTP.apply(hidden, *args)
        top_k_weights = _SliceTP.apply(top_k_weights, *args)
        top_k_index = top_k_index.chunk(groups.tp, dim=0)[groups.tp_index]
    tokens, k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=total).view(ep, local)
    received = torch.empty_like(counts)
    all_to_all(received, counts.contiguous(), [1] * ep, [1] * ep, groups.ep_group)
    send = counts.sum(1).tolist()
    recv = received.sum(1).tolist()
    if groups.recording:
        local_loads = received.sum(0)
        groups.routing.append((torch.stack([local_loads.max(), local_loads.sum()]), total))
    rows = _AllToAll.apply(hidden[order // k], recv, send, groups.ep_group)
    expert_ids = torch.repeat_interleave(
        torch.arange(local, device=rows.device).repeat(ep), received.reshape(-1))
    if rows.shape[0]:
        ones = torch.ones(rows.shape[0], 1, dtype=top_k_weights.dtype, device=rows.device)
        done = type(self).forward(self, rows, expert_ids.unsqueeze(1), ones)
    else:  # no token for these experts; keep the graph (the backward all-to-all runs everywhere)
        done = rows * 0
    back = _AllToAll.apply(done, send, recv, groups.ep_group)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    weighted = back[inverse] * top_k_weights.reshape(-1, 1)
    out = weighted.view(tokens, k, -1).sum(dim=1).to(hidden.dtype)
    if split_tp:
        out = _GatherTP.apply(out, groups.tp_index, groups.tp, groups.tp_group)
    return out


@dataclass
class RoutingRecord:
    """The routing of a rank that holds every expert (no expert parallelism): per MoE layer call,
    ([busiest expert's token copies, all of them] as a tensor, the layer's experts), counted by
    forward pre-hooks (record_routing)."""

    routing: list = field(default_factory=list)
    recording: bool = True
    """As ExpertGroups.recording."""


def record_routing(model: nn.Module, record: RoutingRecord) -> None:
    """Count, on every call of ``model``'s routed-experts modules, the token copies each expert
    gets (one bincount of the router's choices; read after the timed steps: routing_summary)."""
    for mod in experts_modules(model).values():
        mod.register_forward_pre_hook(functools.partial(_count_routing, record, mod.num_experts))


def _count_routing(record: RoutingRecord, total: int, _module, args) -> None:
    if record.recording and len(args) > 1:
        loads = torch.bincount(args[1].reshape(-1), minlength=total)
        record.routing.append((torch.stack([loads.max(), loads.sum()]), total))


def record_routing_outside(stage, groups: ExpertGroups | RoutingRecord | None) -> None:
    """Leave the forward and backward that torch's pipelining runs once to infer a stage's shapes
    (``PipelineStage._forward_metadata_inference`` and ``_backward_metadata_inference``, torch
    2.13; absent: nothing to leave) out of the routing record. Both: the backward recomputes a
    checkpointed layer's forward, and the recording's ops must run there as in the forward it
    recomputes (selective recomputation finds every op of the forward again, in order: a count
    made in the recompute only was refused as 'not found in storage', a new-user check)."""
    if groups is None:
        return
    for name in ("_forward_metadata_inference", "_backward_metadata_inference"):
        infer = getattr(stage, name, None)
        if infer is not None:
            setattr(stage, name, _unrecorded(infer, groups))


def _unrecorded(infer, groups: ExpertGroups | RoutingRecord):
    def quiet(*args, **kwargs):
        was, groups.recording = groups.recording, False
        try:
            return infer(*args, **kwargs)
        finally:
            groups.recording = was
    return quiet


@torch.no_grad()
def routed_experts(module: nn.Module, *args, **kwargs) -> list[torch.Tensor]:
    """One forward of ``module`` in this process: per call of a routed-experts module
    (planner.trace.hf.experts_modules), in call order, the experts each token copy goes to
    ([tokens, top-k], tokens in batch order)."""
    seen: list[torch.Tensor] = []
    hooks = [mod.register_forward_pre_hook(lambda _m, a: seen.append(a[1].detach().clone()))
             for mod in experts_modules(module).values()]
    try:
        module(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return seen


def load_ratios(top_k_index: torch.Tensor, num_experts: int, ep: int) -> tuple[float, float]:
    """(busiest expert's token copies over the mean, busiest of ``ep`` ranks' over the mean; rank
    r holds experts [r E/ep, (r + 1) E/ep)) of the copies in ``top_k_index``."""
    loads = torch.bincount(top_k_index.reshape(-1), minlength=num_experts).double()
    ranks = loads.view(ep, -1).sum(1)
    return float(loads.max() / loads.mean()), float(ranks.max() / ranks.mean())


def routing_summary(groups: ExpertGroups | RoutingRecord | None) -> dict | None:
    """How evenly the calls recorded in ``groups.routing`` spread token copies, as the cost
    model states it (costmodels.engine.EngineSpec.moe_imbalance): per call, the busiest expert's
    copies over the mean of the layer's experts, and the busiest rank's over
    the mean of the group's ranks, each averaged over the calls. Every rank of the group must call
    it (one all-gather over the group; the ranks of a group run the same stages, so all of them
    or none recorded calls, as many each). A RoutingRecord (no expert parallelism) is read
    alone. None without a record or calls (a stage without MoE layers)."""
    if groups is None or not groups.routing:
        return None
    mine = torch.stack([loads for loads, _ in groups.routing]).to(torch.float64)
    experts = torch.tensor([float(e) for _, e in groups.routing])
    if isinstance(groups, RoutingRecord):  # one rank holds every expert: nothing to wait for
        mine = mine.cpu()
        return {"busiest_expert": float((mine[:, 0] / (mine[:, 1] / experts)).mean()),
                "busiest_rank": 1.0, "calls": len(mine)}
    parts = [torch.empty_like(mine) for _ in range(groups.ep)]
    dist.all_gather(parts, mine.contiguous(), group=groups.ep_group)
    every = torch.stack(parts).cpu()  # [rank, call, (busiest local expert, all)]
    per_rank = every[:, :, 1]
    mean_expert = per_rank.sum(0) / experts
    busiest_expert = every[:, :, 0].max(0).values / mean_expert
    busiest_rank = per_rank.max(0).values / per_rank.mean(0)
    return {"busiest_expert": float(busiest_expert.mean()),
            "busiest_rank": float(busiest_rank.mean()), "calls": len(mine)}


@torch.no_grad()
def sync_grads(groups: ExpertGroups | None) -> None:
    """Sum the experts' gradients over the expert-data-parallel group and divide by dp x cp;
    call after backward, before the optimizer step. A rank whose experts got no token gets zero
    gradients (as the whole [E, ...] parameter of one process would)."""
    if groups is None:
        return
    for p in groups.params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if groups.edp_group is not None:
            dist.all_reduce(p.grad, group=groups.edp_group)
        if groups.grad_divisor > 1:
            p.grad.div_(groups.grad_divisor)
