"""A block as fused kernels run it: chains of memory-bound ops merged into one kernel each, what
such a chain reads and writes (fused_traffic), the saved tensors it does not keep
(fused_away_keys) and what it keeps in their place (fused_kept_inputs)."""

from __future__ import annotations

from planner.trace.graph import OpGraph, consumers_through_views, through_views
from planner.trace.ops import COMPUTE_BOUND, FREE
from planner.trace.tp_roles import TPAnalysis


LAYOUT_COPIES = frozenset({"contiguous", "clone"})
"""Ops that copy a tensor into another memory layout (eager code's transpose + contiguous before
a projection); fused stacks read the layout they need, keeping one copy."""


def fused_away_keys(graph: OpGraph, op_names: list[str], savers: dict[str, list[str]]) -> set[str]:
    """Saved tensors a fused kernel does not keep: made inside a chain of memory-bound ops
    (regions) and saved only by element-wise ops of that same chain.
    Dropout masks stay (the backward needs the same random mask), and so do the inputs a norm
    keeps (fused norm kernels keep them too: Korthikanti et al. count 2sbh per LayerNorm)."""
    by = graph.by_name
    region_of = regions(memory_bound(op_names, by), op_names, by, graph.consumers())
    away = set()
    for key, ops in savers.items():
        if key.endswith(":mask") or key.split(":")[0] not in by:
            continue
        producer = through_views(key.split(":")[0], by)
        copied = by[producer]
        if copied.target in LAYOUT_COPIES and copied.inputs and \
                through_views(copied.inputs[0], by) in savers:
            away.add(key)  # a copy into another layout of a tensor kept anyway: kept once
            continue
        home = region_of.get(producer)
        if home is not None and all(region_of.get(o) == home and by[o].kind == "elementwise"
                                    for o in ops):
            away.add(key)
    return away


def fused_kept_inputs(graph: OpGraph, op_names: list[str], savers: dict[str, list[str]],
                      away: set[str]) -> dict[str, float]:
    """Tensors entering a chain that a fused kernel keeps in place of the saved tensors it does
    not keep (``away``): its backward computes those again from what entered the chain, so each
    activation entering the chain that a dropped tensor is made from, where no op saves it
    already. A GEMM's output with a bias added before a gated activation is one: the bias and the
    activation run as one kernel (Megatron-Core's bias-GeGLU / bias-SwiGLU), which keeps its
    input, while eager code keeps the biased tensor the chain makes. The walk back from a dropped
    tensor stops at a tensor of the chain that is kept (the kernel computes again from there)
    and at integer ones (indices, which carry no gradient). Parameters and constants are no
    activations. Returns {op name: bytes of its output}."""
    by = graph.by_name
    region_of = regions(memory_bound(op_names, by), op_names, by, graph.consumers())
    saved = {through_views(k.split(":")[0], by) for k in savers if k.split(":")[0] in by}
    dropped = {through_views(k.split(":")[0], by) for k in away if k.split(":")[0] in by}
    kept: dict[str, float] = {}
    for key in away:
        if key.split(":")[0] not in by:
            continue
        start = through_views(key.split(":")[0], by)
        home = region_of.get(start)
        stack, seen = ([start] if home is not None else []), {start}
        while stack:
            for i in by[stack.pop()].inputs:
                src = through_views(i, by)
                if src in seen:
                    continue
                seen.add(src)
                if not by[src].differentiable or (src in saved and src not in dropped):
                    continue
                if region_of.get(src) == home:
                    stack.append(src)
                elif by[src].kind not in ("constant", "input") and src not in saved:
                    kept[src] = by[src].out_bytes
    return kept


def memory_bound(op_names: list[str], by) -> set[str]:
    """Ops that fused kernels merge: memory-bound, not a node priced from its own GEMMs."""
    return {n for n in op_names if by[n].kind not in FREE and by[n].kind not in COMPUTE_BOUND
            and not ("gemms" in by[n].dims or "attention" in by[n].dims)}


def fused_traffic(graph: OpGraph, tp: TPAnalysis, op_names: list[str],
                  scores: set[str] = frozenset()) -> dict:
    """The block's memory traffic when each connected chain of memory-bound ops is one kernel: it
    reads each tensor entering the chain once and writes each tensor another kernel reads once.
    Chains over the scores of an eager attention core are also counted apart (a fused attention
    kernel replaces them). Returns BlockWork fields."""
    by = graph.by_name
    cons = graph.consumers()
    region_of = regions(memory_bound(op_names, by), op_names, by, cons)
    groups: dict[int, list[str]] = {}
    for n in op_names:
        if n in region_of:
            groups.setdefault(region_of[n], []).append(n)
    out = dict.fromkeys(("fused_bytes_tp", "fused_bytes_rep", "eager_attn_fused_tp",
                         "eager_attn_fused_rep", "eager_attn_kernels_fused"), 0.0)
    for ops in groups.values():
        inside = set(ops)
        where = "tp" if all(tp.split_of(n)[0] for n in ops) else "rep"
        entering = {through_views(i, by) for n in ops for i in by[n].inputs}
        entering = {i for i in entering if i not in inside and by[i].kind != "constant"}
        leaving = {n for n in ops if any(_leaves(c, inside, by, cons) for c in cons[n])}
        nbytes = sum(by[i].out_bytes for i in entering) + sum(by[n].out_bytes for n in leaving)
        out[f"fused_bytes_{where}"] += nbytes
        if inside & scores:
            out[f"eager_attn_fused_{where}"] += nbytes
            out["eager_attn_kernels_fused"] += 1
    out["kernels_fused"] = float(len(groups))
    return out


def regions(bound: set[str], op_names: list[str], by, cons) -> dict[str, int]:
    """Connected components of memory-bound ops (views between them do not separate them)."""
    region: dict[str, int] = {}
    next_id = 0
    for start in op_names:
        if start not in bound or start in region:
            continue
        stack = [start]
        region[start] = next_id
        while stack:
            n = stack.pop()
            neighbours = ([through_views(i, by) for i in by[n].inputs]
                          + consumers_through_views(n, by, cons))
            for m in neighbours:
                if m in bound and m not in region:
                    region[m] = next_id
                    stack.append(m)
        next_id += 1
    return region


def _leaves(consumer: str, inside: set[str], by, cons) -> bool:
    if by[consumer].kind == "view":
        return any(_leaves(c, inside, by, cons) for c in cons[consumer])
    return consumer not in inside
