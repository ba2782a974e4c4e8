"""Sum a block's traced ops into the per-sample BlockWork the cost model reads.

- GEMM FLOPs go to ``mm_flops_tp`` or ``mm_flops_rep`` by whether tensor parallelism splits the op;
  activation-activation matmuls over an s x s tensor, and fused attention, to ``attn_flops``.
- Memory-bound ops contribute their bytes moved, split or replicated the same way.
- A saved activation counts once per block (by storage), as split when the op producing it runs
  split; tensors with two sequence-length dimensions are the attention core's (``act_bytes_attn``).
- ``input_bytes``: gradient-carrying tensors made outside the block and read inside it.
"""

from __future__ import annotations

from costmodels.workload import BlockWork
from planner.graph import Op, OpGraph
from planner.tp import TPAnalysis


def is_seq_square(op: Op, seq_len: int) -> bool:
    """Whether the op's output has two sequence-length dimensions (an attention score tensor)."""
    return seq_len > 1 and sum(1 for d in op.shape if d == seq_len) >= 2


def block_work(graph: OpGraph, tp: TPAnalysis, op_names: list[str]) -> tuple[BlockWork, list[str]]:
    """The block's BlockWork, and the parameters tensor parallelism splits."""
    by = graph.by_name
    members = set(op_names)
    acc = dict.fromkeys(("mm_flops_tp", "mm_flops_rep", "attn_flops", "mem_bytes_tp",
                         "mem_bytes_rep", "act_bytes_tp", "act_bytes_rep", "act_bytes_attn",
                         "input_bytes", "tp_fwd_bytes", "tp_bwd_bytes"), 0.0)
    collectives = 0
    param_split: dict[str, bool] = {}
    saved: dict[str, float] = {}
    inputs: set[str] = set()
    for name in op_names:
        op = by[name]
        split_compute, _ = tp.split_of(name)
        _add_compute(op, split_compute, graph.seq_len, acc, by)
        for p in op.params:
            param_split[p] = param_split.get(p, False) or split_compute
        for key, nbytes in op.saves:
            saved.setdefault(key, nbytes)
        for src in op.inputs:
            if src not in members and by[src].requires_grad:
                inputs.add(src)
        for table, field in ((tp.fwd_bytes, "tp_fwd_bytes"), (tp.bwd_bytes, "tp_bwd_bytes")):
            if name in table:
                acc[field] += table[name]
                collectives += 1
    for key, nbytes in saved.items():
        producer = by.get(key.split(":")[0])
        out_split = tp.split_of(producer.name)[1] if producer else False
        if producer is not None and is_seq_square(producer, graph.seq_len) and out_split:
            acc["act_bytes_attn"] += nbytes
        elif out_split:
            acc["act_bytes_tp"] += nbytes
        else:
            acc["act_bytes_rep"] += nbytes
    acc["input_bytes"] = sum(by[i].out_bytes for i in inputs)
    params_tp = sum(graph.params[p].numel for p, s in param_split.items() if s and p in graph.params)
    params_rep = sum(graph.params[p].numel for p, s in param_split.items() if not s and p in graph.params)
    work = BlockWork(params_tp=float(params_tp), params_rep=float(params_rep),
                     tp_collectives=collectives, **acc)
    return work, sorted(p for p, s in param_split.items() if s)


def _add_compute(op: Op, split: bool, seq_len: int, acc: dict, by: dict) -> None:
    if op.kind == "attention" or (op.kind == "matmul" and not op.params and split and (
            is_seq_square(op, seq_len) or any(is_seq_square(by[i], seq_len) for i in op.inputs))):
        acc["attn_flops" if split else "mm_flops_rep"] += op.flops
    elif op.kind in ("matmul", "fused"):
        acc["mm_flops_tp" if split else "mm_flops_rep"] += op.flops
    elif op.kind not in ("view", "constant", "input"):
        acc["mem_bytes_tp" if split else "mem_bytes_rep"] += op.io_bytes
        if op.flops:
            acc["mm_flops_tp" if split else "mm_flops_rep"] += op.flops
