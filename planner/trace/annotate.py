"""Sum a block's traced ops into the per-sample BlockWork the cost model reads.

- GEMMs are kept with their shapes and how tensor parallelism splits them; their FLOPs also go to
  ``mm_flops_tp`` / ``mm_flops_rep``. Activation-activation matmuls over an s x s tensor, and fused
  attention, count as attention (``attn_flops``).
- Memory-bound ops contribute the bytes they move, twice over: one kernel per op (eager PyTorch),
  and fused, where each connected chain of memory-bound ops reads what enters it and writes what
  leaves it once, as a fusing compiler or hand-written kernels do (values only kept for backward
  are recomputed there from the chain's inputs, as torch.compile's min-cut partitioner does).
- A saved activation counts once per block (by storage), as split when the op producing it runs
  split; tensors with two sequence-length dimensions are the attention core's (``act_bytes_attn``).
- ``input_bytes``: gradient-carrying tensors made outside the block and read inside it.
"""

from __future__ import annotations

from costmodels.workload import SPLIT_BATCH, SPLIT_K, SPLIT_N, SPLIT_NONE, BlockWork, Gemm
from planner.trace.graph import Op, OpGraph
from planner.trace.ops import COMPUTE_BOUND
from planner.trace.tp_roles import TPAnalysis

FREE = ("view", "constant", "input")


def is_seq_square(op: Op, seq_len: int) -> bool:
    """Whether the op's output has two sequence-length dimensions (an attention score tensor)."""
    return seq_len > 1 and sum(1 for d in op.shape if d == seq_len) >= 2


def block_work(graph: OpGraph, tp: TPAnalysis, op_names: list[str]) -> tuple[BlockWork, list[str]]:
    """The block's BlockWork, and the parameters tensor parallelism splits."""
    by = graph.by_name
    members = set(op_names)
    acc = dict.fromkeys(("mm_flops_tp", "mm_flops_rep", "attn_flops", "fused_attn_flops",
                         "attn_causal_flops", "kernel_bytes_sq",
                         "attn_scores", "attn_scores_dropout", "mem_bytes_tp", "mem_bytes_rep",
                         "kernels_eager", "tp_fwd_bytes", "tp_bwd_bytes"), 0.0)
    collectives = 0
    param_split: dict[str, bool] = {}
    saved: dict[str, float] = {}
    gemms: list[Gemm] = []
    for name in op_names:
        op = by[name]
        split_compute, split_out = tp.split_of(name)
        _add_compute(op, split_compute, graph.seq_len, acc, by)
        gemm = _gemm(op, split_compute, split_out)
        if gemm is not None:
            gemms.append(gemm)
        for p in op.params:
            param_split[p] = param_split.get(p, False) or split_compute
        for key, nbytes in op.saves:
            saved.setdefault(key, nbytes)
        for table, field in ((tp.fwd_bytes, "tp_fwd_bytes"), (tp.bwd_bytes, "tp_bwd_bytes")):
            if name in table:
                acc[field] += table[name]
                collectives += 1
    _add_saved(saved, by, tp, graph.seq_len, acc)
    fused_tp, fused_rep, kernels_fused = fused_traffic(graph, tp, op_names)
    acc["input_bytes"] = sum(by[i].out_bytes for i in {
        src for n in op_names for src in by[n].inputs
        if src not in members and by[src].requires_grad})
    params_tp = sum(graph.params[p].numel for p, s in param_split.items() if s and p in graph.params)
    params_rep = sum(graph.params[p].numel for p, s in param_split.items() if not s and p in graph.params)
    moved = acc["mem_bytes_tp"] + acc["mem_bytes_rep"]
    squares = acc.pop("kernel_bytes_sq")
    acc["kernel_bytes"] = squares / moved if moved else 0.0
    known = [s for p, s in param_split.items() if p in graph.params]
    work = BlockWork(params_tp=float(params_tp), params_rep=float(params_rep),
                     tp_collectives=collectives, param_tensors_tp=sum(known),
                     param_tensors_rep=len(known) - sum(known),
                     tp_linears=sum(g.linear and g.split in (SPLIT_N, SPLIT_K) for g in gemms), fused_bytes_tp=fused_tp, fused_bytes_rep=fused_rep,
                     kernels_fused=kernels_fused, gemms=tuple(gemms), **acc)
    return work, sorted(p for p, s in param_split.items() if s)


def _add_compute(op: Op, split: bool, seq_len: int, acc: dict, by: dict) -> None:
    if op.kind in FREE:
        return
    acc["kernels_eager"] += 1
    if op.kind == "attention" or _is_attention_matmul(op, split, seq_len, by):
        acc["attn_flops" if split else "mm_flops_rep"] += op.flops
        if op.kind == "attention":
            acc["fused_attn_flops"] += op.flops
            if op.dims.get("causal"):
                acc["attn_causal_flops"] += op.flops
            scores = op.dims.get("scores", 0)
            acc["attn_scores"] += scores
            if op.dims.get("dropout"):
                acc["attn_scores_dropout"] += scores
    elif op.kind in ("matmul", "fused"):
        acc["mm_flops_tp" if split else "mm_flops_rep"] += op.flops
    else:
        acc["mem_bytes_tp" if split else "mem_bytes_rep"] += op.io_bytes
        acc["kernel_bytes_sq"] += op.io_bytes ** 2
        if op.flops:
            acc["mm_flops_tp" if split else "mm_flops_rep"] += op.flops


def _is_attention_matmul(op: Op, split: bool, seq_len: int, by: dict) -> bool:
    return (op.kind == "matmul" and not op.params and split and (
        is_seq_square(op, seq_len) or any(is_seq_square(by[i], seq_len) for i in op.inputs)))


def _gemm(op: Op, split_compute: bool, split_out: bool) -> Gemm | None:
    shape = op.dims.get("gemm")
    if not shape:
        return None
    batch, m, n, k = shape
    linear = bool(op.dims.get("linear"))
    if not split_compute:
        split = SPLIT_NONE
    elif not linear:
        split = SPLIT_BATCH  # heads of an attention matmul
    else:
        split = SPLIT_N if split_out else SPLIT_K
    return Gemm(batch=batch, m=m, n=n, k=k, split=split, linear=linear)


def _add_saved(saved: dict[str, float], by: dict, tp: TPAnalysis, seq_len: int, acc: dict) -> None:
    for field in ("act_bytes_tp", "act_bytes_rep", "act_bytes_attn"):
        acc[field] = 0.0
    for key, nbytes in saved.items():
        producer = by.get(key.split(":")[0])
        out_split = tp.split_of(producer.name)[1] if producer else False
        if producer is not None and is_seq_square(producer, seq_len) and out_split:
            acc["act_bytes_attn"] += nbytes
        elif out_split:
            acc["act_bytes_tp"] += nbytes
        else:
            acc["act_bytes_rep"] += nbytes


def fused_traffic(graph: OpGraph, tp: TPAnalysis, op_names: list[str]) -> tuple[float, float, float]:
    """(split bytes, replicated bytes, kernels) when each connected chain of memory-bound ops in
    the block is one kernel: it reads each tensor entering the chain once and writes each tensor
    another kernel reads once."""
    by = graph.by_name
    cons = graph.consumers()
    bound = {n for n in op_names if by[n].kind not in FREE and by[n].kind not in COMPUTE_BOUND}
    region_of = _regions(bound, op_names, by, cons)
    groups: dict[int, list[str]] = {}
    for n in op_names:
        if n in region_of:
            groups.setdefault(region_of[n], []).append(n)
    totals = {True: 0.0, False: 0.0}
    for ops in groups.values():
        inside = set(ops)
        split = all(tp.split_of(n)[0] for n in ops)
        entering = {_through_views(i, by) for n in ops for i in by[n].inputs}
        entering = {i for i in entering if i not in inside and by[i].kind != "constant"}
        leaving = {n for n in ops if any(_leaves(c, inside, by, cons) for c in cons[n])}
        nbytes = sum(by[i].out_bytes for i in entering) + sum(by[n].out_bytes for n in leaving)
        totals[split] += nbytes
    return totals[True], totals[False], float(len(groups))


def _regions(bound: set[str], op_names: list[str], by, cons) -> dict[str, int]:
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
            neighbours = [_through_views(i, by) for i in by[n].inputs] + _consumers_through_views(n, by, cons)
            for m in neighbours:
                if m in bound and m not in region:
                    region[m] = next_id
                    stack.append(m)
        next_id += 1
    return region


def _through_views(name: str, by) -> str:
    op = by[name]
    while op.kind == "view" and op.inputs:
        op = by[op.inputs[0]]
    return op.name


def _consumers_through_views(name: str, by, cons) -> list[str]:
    out, stack = [], list(cons[name])
    while stack:
        c = stack.pop()
        if by[c].kind == "view":
            stack.extend(cons[c])
        else:
            out.append(c)
    return out


def _leaves(consumer: str, inside: set[str], by, cons) -> bool:
    if by[consumer].kind == "view":
        return any(_leaves(c, inside, by, cons) for c in cons[consumer])
    return consumer not in inside
