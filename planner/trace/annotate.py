"""Sum a block's traced ops into the per-sample BlockWork the cost model reads.

- GEMMs (every GEMM-like ATen op a node runs, planner.trace.aten) are kept with their shapes, how
  tensor parallelism splits them, and which operand gradients backward computes; their FLOPs also
  go to ``mm_flops_tp`` / ``mm_flops_rep`` and the gradients' to ``bwd_flops``. Activation-
  activation matmuls whose product goes through a softmax (eager attention, found by
  planner.trace.eager_attention), and fused attention, count as attention (``attn_flops``); the
  memory-bound ops on an eager attention's scores are counted apart too, since a fused kernel
  never runs them.
- Memory-bound ops contribute the bytes they move, twice over: one kernel per op (eager PyTorch),
  and fused, where each connected chain of memory-bound ops reads what enters it and writes what
  leaves it once, as a fusing compiler or hand-written kernels do (values only kept for backward
  are recomputed there from the chain's inputs, as torch.compile's min-cut partitioner does).
- A saved activation counts once per block (by storage), as split when the op producing it runs
  split; the scores of an eager attention core are the attention core's (``act_bytes_attn``).
- ``input_bytes``: activations made outside the block and read inside it (none for a block that
  trains nothing: it keeps nothing for a backward).
"""

from __future__ import annotations

import dataclasses
import math

from costmodels.workload import SPLIT_BATCH, SPLIT_K, SPLIT_N, SPLIT_NONE, BlockWork, Gemm
from planner.trace.eager_attention import eager_attention
from planner.trace.fusion import fused_away_keys, fused_kept_inputs, fused_traffic
from planner.trace.graph import Op, OpGraph, consumers_through_views, through_views
from planner.trace.ops import COMPUTE_BOUND, FREE, GROUPED_GEMMS
from planner.trace.tp_roles import TPAnalysis

def block_work(graph: OpGraph, tp: TPAnalysis, op_names: list[str]) -> tuple[BlockWork, list[str]]:
    """The block's BlockWork, and the parameters tensor parallelism splits."""
    by = graph.by_name
    members = set(op_names)
    attn_gemms, scores = eager_attention(graph)
    acc = dict.fromkeys(("mm_flops_tp", "mm_flops_rep", "attn_flops", "fused_attn_flops",
                         "fused_attn_flops_rep", "attn_causal_flops", "fused_attn_calls",
                         "kernel_bytes_sq", "bwd_flops",
                         "attn_scores", "attn_scores_dropout", "mem_bytes_tp", "mem_bytes_rep",
                         "eager_attn_bytes_tp", "eager_attn_bytes_rep", "eager_attn_kernels",
                         "attn_scores_saved",
                         "kernels_eager", "tp_fwd_bytes", "tp_bwd_bytes", "expert_flops",
                         "num_experts", "routed_tokens", "moe_layers", "dispatch_bytes",
                         "attn_kv_bytes", "attn_kv_calls", "attn_q_bytes", "attn_out_bytes",
                         "attn_heads_q", "attn_heads_kv", "attn_window_cut",
                         "attn_window_flops", "attn_window_rows",
                         "eager_attn_masked_flops", "eager_attn_flops_rep",
                         "attn_score_params", "attn_keys_wider", "act_routed_gathered",
                         "act_routed_weighted", "expert_bias", "expert_slot_flops",
                         "expert_capacity", "mem_bytes_routed", "mem_bytes_routed_hidden",
                         "moe_act_mem_bytes", "moe_act_kernels", "mla_up_mem_bytes_tp",
                         "mla_up_mem_bytes_rep", "mla_up_kernels", "mla_up_flops",
                         "head_dim_flops", "head_dim_weight"),
                        0.0)
    collectives = 0
    param_split: dict[str, bool] = {}
    saved: dict[str, float] = {}
    savers: dict[str, list[str]] = {}
    gemms: list[Gemm] = []
    expert_weights: set[str] = set()
    routed = [r for n in op_names for r in by[n].dims.get("gemms", []) if len(r) > 7 and r[7]]
    hidden = routed[0][3] if routed else 0  # the first expert GEMM reads the hidden states
    returning = _returning_gemms(op_names, by, hidden)
    # the activation between the expert GEMMs is as wide as the returning GEMMs read: where that
    # is the hidden width too (gpt-oss), widths cannot tell it apart, and none is counted
    between = {by[n].dims["gemms"][i][3] for n, i in returning}
    hidden_apart = bool(hidden) and hidden not in between
    widths: dict = {}  # the query width of the last eager QK^T (for scores x V's comparison)
    gathered: set[str] = set()  # the token copies the experts' first GEMMs keep
    expert_modules: set[str] = set()
    routed_modules = {by[n].module for n in op_names if _routes_experts(by[n])}
    recomputed = _moe_act_ops(op_names, by, graph.consumers(), routed_modules,
                              {n for n, _ in returning})
    up_region, up_gemms = _mla_up_ops(op_names, by, graph.consumers())
    shared = _shared_expert_ops(op_names, by, routed_modules)
    for name in op_names:
        op = by[name]
        split_compute, split_out = tp.split_of(name)
        if _routes_experts(op):  # experts are split by expert parallelism (and etp), not tp
            split_compute = split_out = False
            expert_weights.update(op.params)
            expert_modules.add(op.module)
            if not any((name, i) in returning for i in range(len(op.dims.get("gemms", [])))):
                for key, _ in op.saves:
                    producer = by.get(key.split(":")[0])
                    if producer is not None and producer.shape[-1:] == [hidden]:
                        gathered.add(key)
        moved = acc["mem_bytes_rep"]
        moved_tp, made = acc["mem_bytes_tp"], len(gemms)
        _add_compute(op, split_compute, split_out, graph.seq_len, acc, gemms,
                     name in attn_gemms, name in scores, hidden,
                     {i for n, i in returning if n == name})
        if name in shared:
            gemms[made:] = [dataclasses.replace(g, shared_expert=True) for g in gemms[made:]]
        if name in up_gemms:
            gemms[made:] = [dataclasses.replace(g, mla_up=True) for g in gemms[made:]]
            acc["mla_up_flops"] += sum(g.flops for g in gemms[made:])
        if name in up_region and op.kind not in FREE:
            acc["mla_up_mem_bytes_tp"] += 0.0 if name in up_gemms else \
                acc["mem_bytes_tp"] - moved_tp
            acc["mla_up_mem_bytes_rep"] += 0.0 if name in up_gemms else \
                acc["mem_bytes_rep"] - moved
            acc["mla_up_kernels"] += 1
        if name in recomputed and op.kind not in FREE:
            acc["moe_act_mem_bytes"] += acc["mem_bytes_rep"] - moved
            acc["moe_act_kernels"] += 1
        if _inside(op.module, routed_modules):
            acc["mem_bytes_routed"] += acc["mem_bytes_rep"] - moved
            if hidden_apart and op.shape[-1:] == [hidden]:
                acc["mem_bytes_routed_hidden"] += acc["mem_bytes_rep"] - moved
        if name in attn_gemms:
            _add_eager_heads(op, by, name in scores, acc, widths, batch=graph.batch)
        if name in scores and op.params:  # sinks: parameters joined to the scores
            acc["attn_score_params"] += sum(graph.params[p].numel for p in op.params
                                            if p in graph.params)
        for p in op.params:
            param_split[p] = param_split.get(p, False) or split_compute
        for key, nbytes in op.saves:
            saved.setdefault(key, nbytes)
            savers.setdefault(key, []).append(name)
        for table, field in ((tp.fwd_bytes, "tp_fwd_bytes"), (tp.bwd_bytes, "tp_bwd_bytes")):
            if name in table:
                acc[field] += table[name]
                collectives += 1
    linear_inputs = {k for k, ops in savers.items()
                     if all((by[o].kind == "matmul" or by[o].target in GROUPED_GEMMS)
                            and by[o].params for o in ops)}
    # token copies of an MoE layer in the traced batch (a GEMM row counts them per sample)
    copies = {int(r[0] * r[1] * graph.batch) for r in routed}
    acc["act_routed_gathered"] = float(sum(saved[k] for k in gathered if k in saved))
    fused_away = fused_away_keys(graph, op_names, savers)
    returning_gemms = {n for n, _ in returning}
    weighted = _weighted_outputs(savers, by, returning_gemms)
    # a bias added to the output and the weights' multiply are one fused chain, which keeps the
    # GEMM's output in place of the biased sum (fused_kept_inputs): that is the weighted output
    # then, which weights multiplied inside the activation leave unkept as well
    acc["act_routed_weighted"] = float(
        sum(saved[k] for k in weighted - fused_away)
        + sum(nbytes for name, nbytes in fused_kept_inputs(
            graph, op_names, savers, weighted & fused_away).items() if name in returning_gemms))
    _add_saved(saved, by, tp, scores, acc, fused_away, linear_inputs, expert_modules, copies,
               recomputed, up_region, _attention_view_excess(by, savers, saved),
               fused_kept_inputs(graph, op_names, savers, fused_away))
    fused = fused_traffic(graph, tp, op_names, scores)
    acc.update(_op_level_checkpointing(op_names, by, tp))
    acc.update(_backward_transient(op_names, by, tp, scores))
    backward = any(by[n].requires_grad for n in op_names)
    acc["runs_backward"] = float(backward)
    # (a block with nothing to train keeps nothing for a backward, its input neither)
    acc["input_bytes"] = sum(by[i].out_bytes for i in {
        src for n in op_names for src in by[n].inputs
        if src not in members and by[src].differentiable}) if backward else 0.0
    params_tp = sum(graph.params[p].numel for p, s in param_split.items() if s and p in graph.params)
    params_rep = sum(graph.params[p].numel for p, s in param_split.items() if not s and p in graph.params)
    frozen = {p for p in param_split if p in graph.params and not graph.params[p].trainable}
    acc["frozen_params_tp"] = float(sum(graph.params[p].numel for p in frozen if param_split[p]))
    acc["frozen_params_rep"] = float(sum(graph.params[p].numel for p in frozen
                                         if not param_split[p]))
    moved = acc["mem_bytes_tp"] + acc["mem_bytes_rep"]
    weight, weighted = acc.pop("head_dim_weight"), acc.pop("head_dim_flops")
    acc["attn_head_dim"] = weighted / weight if weight else 0.0
    squares = acc.pop("kernel_bytes_sq")
    acc["kernel_bytes"] = squares / moved if moved else 0.0
    known = [s for p, s in param_split.items() if p in graph.params]
    # per-expert biases (gpt-oss's: one row per expert), added by ops of their own: spread over
    # the expert ranks with the experts' matrices (not a router's weight, one row per expert
    # too, which a GEMM of every token reads)
    routers = {p for n in op_names if by[n].dims.get("gemms") and not _routes_experts(by[n])
               for p in by[n].params}
    biases = {name for name, info in graph.params.items()
              if len(info.shape) == 2 and info.shape[0] == acc["num_experts"]
              and any(name.startswith(f"{m}.") for m in expert_modules if m)
              and name not in routers}
    acc["expert_params"] = float(sum(graph.params[p].numel for p in expert_weights | biases
                                     if p in graph.params and not param_split.get(p)))
    acc["frozen_expert_params"] = float(sum(graph.params[p].numel for p in expert_weights | biases
                                            if p in frozen and not param_split.get(p)))
    acc["expert_bias"] = float(bool(biases))
    if acc["num_experts"] and graph.expert_groups:  # the router's groups (planner.trace.tracers)
        acc["expert_groups"], acc["expert_groups_per_token"] = map(float, graph.expert_groups)
    work = BlockWork(params_tp=float(params_tp), params_rep=float(params_rep),
                     tp_collectives=collectives, param_tensors_tp=sum(known),
                     param_tensors_rep=len(known) - sum(known),
                     tp_linears=sum(g.linear and g.split in (SPLIT_N, SPLIT_K) for g in gemms),
                     gemms=tuple(gemms), **fused, **acc)
    return work, sorted(p for p, s in param_split.items() if s)


def _add_compute(op: Op, split: bool, split_out: bool, seq_len: int, acc: dict,
                 gemms: list[Gemm], attn_gemm: bool, score: bool, hidden: float = 0,
                 returning: set[int] = frozenset()) -> None:
    """Add the op's work to ``acc`` and its GEMMs to ``gemms``. ``hidden``: the width of the
    hidden states the block's routed experts read (0: no experts); ``returning``: the positions
    of the op's GEMM rows that bring routed tokens back to it (_returning_gemms)."""
    if op.kind in FREE:
        return
    acc["kernels_eager"] += 1
    word = _word(op.dtype)
    if op.kind == "attention":
        _add_head_dim(acc, op.flops, op.dims.get("head_dim", 0))
        _add_attention(op.flops, op.dims.get("scores", 0), bool(op.dims.get("causal")),
                       bool(op.dims.get("dropout")), split, acc, op.requires_grad, word,
                       op.dims.get("keep", 1.0), op.dims.get("length", 0))
        _add_heads(acc, op.dims.get("heads_q", 0), op.dims.get("heads_kv", 0),
                   op.dims.get("q_elems", 0) * word, op.dims.get("kv_elems", 0) * word,
                   op.out_bytes)
        if _keys_wider(op):
            acc["attn_keys_wider"] = 1.0
    elif "gemms" in op.dims or "attention" in op.dims:  # a node that computes: its ATen work
        for i, row in enumerate(op.dims.get("gemms", [])):
            g = _gemm(row, split, split_out, seq_len if op.kind != "matmul" else 0, attn_gemm,
                      i in returning, masked=_masked_share(op))
            gemms.append(g)
            acc["attn_flops" if g.attention and split else
                "mm_flops_tp" if split else "mm_flops_rep"] += g.flops
            acc["bwd_flops"] += g.bwd_flops
            if g.attention:  # an eager attention core (its mask declared or not)
                # (QK^T's reduction, or scores x V's output width: the smaller side either way)
                _add_head_dim(acc, g.flops, min(g.n, g.k))
                acc["eager_attn_masked_flops"] += g.masked * g.flops
                acc["eager_attn_flops_rep"] += 0.0 if split else g.flops
            if g.experts:
                acc["expert_flops"] += g.flops
                if len(row) > 8:  # capacity slots: the share the router fills (records)
                    acc["expert_slot_flops"] += g.flops * (1.0 - row[8])
                    acc["expert_capacity"] = 1.0
                acc["num_experts"] = max(acc["num_experts"], float(g.experts))
                if i in returning:  # one per MoE layer
                    acc["moe_layers"] += 1
                    acc["routed_tokens"] += g.batch * g.m
                    acc["dispatch_bytes"] += g.batch * g.m * hidden * word
        for a in op.dims.get("attention", []):
            if a["head_dim"] > a["value_dim"]:
                acc["attn_keys_wider"] = 1.0
            scores = a["batch"] * a["heads_q"] * a["q_len"] * a["kv_len"]
            flops = 2.0 * scores * (a["head_dim"] + a["value_dim"])
            _add_head_dim(acc, flops, a["head_dim"])
            _add_attention(flops, scores, bool(a["causal"]), bool(a["dropout"]), split, acc,
                           op.requires_grad, word)
            _add_heads(acc, a["heads_q"], a["heads_kv"],
                       a["batch"] * a["heads_q"] * a["q_len"] * a["head_dim"] * word,
                       a["batch"] * a["heads_kv"] * a["kv_len"] * (a["head_dim"] + a["value_dim"])
                       * word, a["batch"] * a["heads_q"] * a["q_len"] * a["value_dim"] * word)
        inside = op.dims.get("mem_bytes", 0.0)
        acc["mem_bytes_tp" if split else "mem_bytes_rep"] += inside
        acc["kernel_bytes_sq"] += inside ** 2 / max(op.dims.get("kernels", 1), 1)
        acc["kernels_eager"] += op.dims.get("kernels", 0)
    else:
        acc["mem_bytes_tp" if split else "mem_bytes_rep"] += op.io_bytes
        acc["kernel_bytes_sq"] += op.io_bytes ** 2
        if score:  # the softmax, mask or dropout of an eager attention's scores
            acc["eager_attn_bytes_tp" if split else "eager_attn_bytes_rep"] += op.io_bytes
            acc["eager_attn_kernels"] += 1


def _add_attention(flops: float, scores: float, causal: bool, dropout: bool, split: bool,
                   acc: dict, backward: bool = True, word: float = 2.0,
                   keep: float = 1.0, length: int = 0) -> None:
    """A fused attention call: its FLOPs (2x in backward), score elements, causal (with the share
    ``keep`` of the square a sliding window leaves over ``length`` tokens, planner.trace.masks)
    and dropout;
    and what a materialized attention core would keep of its scores for backward (the softmax
    output, and with dropout its one-byte mask and its output: Korthikanti et al.'s 5 a s^2 b in
    16 bits), which a fused kernel (FlashAttention) keeps none of."""
    if backward:
        acc["attn_scores_saved"] += scores * (word + (word + 1.0 if dropout else 0.0))
    acc["attn_flops" if split else "mm_flops_rep"] += flops
    acc["fused_attn_flops"] += flops
    acc["fused_attn_flops_rep"] += 0.0 if split else flops
    acc["fused_attn_calls"] += 1
    acc["bwd_flops"] += 2.0 * flops if backward else 0.0
    if causal:
        acc["attn_causal_flops"] += flops
        acc["attn_window_cut"] += (1.0 - keep) * flops
        if keep < 1.0 and length:
            acc["attn_window_flops"] += flops
            acc["attn_window_rows"] += flops / length
    acc["attn_scores"] += scores
    if dropout:
        acc["attn_scores_dropout"] += scores


def _keys_wider(op: Op) -> bool:
    """Whether an attention call reads queries and keys wider than its values (multi-head latent
    attention: DeepSeek-V3's 192 against 128): its output's last dimension is the value width,
    and the query elements over the heads and query tokens the query width."""
    heads, shape = op.dims.get("heads_q", 0), op.shape
    if not heads or len(shape) < 3 or not op.dims.get("q_elems"):
        return False
    # [..., heads, tokens, value] (SDPA) or [..., tokens, heads, value]
    tokens = shape[-2] if shape[-3] == heads else shape[-3] if shape[-2] == heads else 0
    return bool(tokens) and op.dims["q_elems"] / (heads * tokens) > shape[-1]


def _returning_gemms(op_names: list[str], by: dict, hidden: float) -> set[tuple[str, int]]:
    """(op, GEMM row) of each routed-expert GEMM that brings its token copies back to the
    ``hidden`` width (the down projection, one per MoE layer): of a run of expert GEMMs over the
    same token copies (gate, up, down, with only element-wise work between), the last one, if its
    output is ``hidden`` wide. Taking the last matters when a gate-and-up GEMM is itself
    ``hidden`` wide (an expert width of half the hidden size, or equal to it unfused)."""
    rows = [(name, i, r) for name in op_names
            for i, r in enumerate(by[name].dims.get("gemms", []))]
    out = set()
    for (name, i, r), after in zip(rows, rows[1:] + [None]):
        if not (len(r) > 7 and r[7]) or r[2] != hidden:
            continue
        same_run = after is not None and len(after[2]) > 7 and after[2][7] and \
            after[2][0] * after[2][1] == r[0] * r[1]
        if not same_run:
            out.add((name, i))
    return out


def _weighted_outputs(savers: dict[str, list[str]], by: dict, returning: set[str]) -> set[str]:
    """Saved tensors that only the routing weights' multiply keeps: the output of a returning
    expert GEMM (``returning``: op names), or of the bias added to it, saved by ``mul`` ops
    alone (for the weights' gradient)."""
    out = set()
    for key, ops in savers.items():
        if ":" in key or key not in by or not all(
                by[o].kind == "elementwise" and str(by[o].target) == "mul" for o in ops):
            continue
        node = by[through_views(key, by)]
        if node.kind == "elementwise" and str(node.target) in ("add", "add_") and node.inputs:
            node = by[through_views(node.inputs[0], by)]  # the experts' bias on the output
        if node.name in returning:
            out.add(key)
    return out


def _routes_experts(op: Op) -> bool:
    """Whether the op runs routed experts (a grouped GEMM of token copies, one matrix each)."""
    return any(len(r) > 7 and r[7] for r in op.dims.get("gemms", []))


def _add_eager_heads(op: Op, by: dict, makes_scores: bool, acc: dict,
                     widths: dict | None = None, batch: int = 1) -> None:
    """The heads and the query and key/value bytes of an eager attention core, as ``_add_heads``
    takes them from a fused call (what context parallelism exchanges and divides): QK^T reads
    the queries and the keys, scores x V the values. Grouped-query attention repeats the key and
    value heads before the GEMM (an expand under views); the bytes before it are what a rank
    holds and sends, and their share of the repeated tensor gives the key/value heads.
    ``widths`` carries the query width from QK^T to the scores x V that follows it: values
    narrower than the queries are latent attention (BlockWork.attn_keys_wider). Cores on
    three-dimensional tensors have the heads folded into the traced ``batch`` (BLOOM's
    ``baddbmm`` of its ALiBi bias, q and k^T: batch x heads, queries, keys)."""
    if len(op.inputs) < 2 or len(op.shape) < 3:
        return
    first, second = by[op.inputs[-2]], by[op.inputs[-1]]  # baddbmm(bias, q, k^T): the last two
    held = _unrepeated_bytes(second, by)
    widths = {} if widths is None else widths
    if not makes_scores:  # scores x V: the values, op.shape[-1] wide, and the output
        acc["attn_kv_bytes"] += held
        acc["attn_out_bytes"] += op.out_bytes
        if widths.get("query", 0) > op.shape[-1]:
            acc["attn_keys_wider"] = 1.0
        return
    if first.shape:
        widths["query"] = first.shape[-1]  # (..., heads, queries, width)
    if not second.out_bytes:
        return
    # the scores: (..., heads, queries, keys), however q and k are laid out
    folded = op.shape[0] // batch if op.shape[0] % batch == 0 else 0
    heads = op.shape[-3] if len(op.shape) >= 4 else folded
    kv_heads = max(1, round(heads * held / second.out_bytes)) if heads else 0
    _add_heads(acc, heads, kv_heads, first.out_bytes, held)


def _unrepeated_bytes(op: Op, by: dict) -> float:
    """The fewest bytes along the chain of views that made ``op`` (a repeated or transposed
    operand is a view of the smaller tensor that was computed)."""
    least = op.out_bytes
    while op.kind == "view" and op.inputs:
        op = by[op.inputs[0]]
        least = min(least, op.out_bytes)
    return least


def _add_head_dim(acc: dict, flops: float, head_dim: float) -> None:
    """An attention call's head dimension, weighted by its FLOPs (BlockWork.attn_head_dim);
    a call whose head dimension is not known is left out."""
    if head_dim > 0 and flops > 0:
        acc["head_dim_flops"] += flops * head_dim
        acc["head_dim_weight"] += flops


def _add_heads(acc: dict, heads_q: float, heads_kv: float, q_bytes: float,
               kv_bytes: float, out_bytes: float = 0.0) -> None:
    """An attention call's heads (the fewest over the block's calls) and query, key/value and
    output bytes (eager cores add their output where scores x V makes it)."""
    for key, heads in (("attn_heads_q", heads_q), ("attn_heads_kv", heads_kv)):
        if heads:
            acc[key] = min(acc[key], heads) if acc[key] else float(heads)
    acc["attn_q_bytes"] += q_bytes
    acc["attn_kv_bytes"] += kv_bytes
    acc["attn_kv_calls"] += 1.0 if kv_bytes else 0.0
    acc["attn_out_bytes"] += out_bytes


def _masked_share(op) -> float:
    """The share of an attention op's square a kernel skipping masked tiles does not do, where
    its module declares the mask (planner.trace.masks: causal, with ``keep`` under a window)."""
    return 1.0 - 0.5 * op.dims.get("keep", 1.0) if op.dims.get("causal") else 0.0


def _gemm(row: list, split_compute: bool, split_out: bool, seq_len: int,
          attention: bool, returning: bool = False, masked: float = 0.0) -> Gemm:
    """A priced GEMM row [batch, m, n, k, weight, grad_a, grad_b(, experts)] as the cost model's
    Gemm: split as its node is (a Linear's output or reduction, an attention matmul's heads), and
    marked as an attention core when its node is one (``attention``) or, inside a module priced
    whole (an ``nn.MultiheadAttention``), when it multiplies two activations over a ``seq_len``
    square. A routed-expert GEMM is split as expert tensor parallelism splits it: the one
    ``returning`` the tokens to the hidden width along its reduction (row-parallel), the others
    along their output (column-parallel). ``masked``: what a declared mask lets a fused kernel skip of an
    attention core's GEMM."""
    batch, m, n, k, weight, grad_a, grad_b = row[:7]
    experts = int(row[7]) if len(row) > 7 else 0
    if experts:
        return Gemm(batch=batch, m=m, n=n, k=k, split=SPLIT_K if returning else SPLIT_N,
                    linear=bool(weight), grad_a=bool(grad_a), grad_b=bool(grad_b),
                    experts=experts)
    scores = not weight and (attention or (seq_len > 1 and m == seq_len and seq_len in (n, k)))
    if not split_compute:
        split = SPLIT_NONE
    elif not weight:
        split = SPLIT_BATCH  # heads of an attention matmul
    else:
        split = SPLIT_N if split_out else SPLIT_K
    return Gemm(batch=batch, m=m, n=n, k=k, split=split, linear=bool(weight),
                grad_a=bool(grad_a), grad_b=bool(grad_b), attention=scores,
                masked=masked if scores else 0.0)


def _backward_transient(op_names: list[str], by: dict, tp: TPAnalysis,
                        scores: set[str] = frozenset()) -> dict:
    """The largest gradient pair the block's backward holds at once: an op's output gradient and
    the input gradient it writes, about twice its largest gradient-carrying output (the fp32
    log-softmax of a large vocabulary dominates a language model's head). A block that runs
    forward only (frozen, nothing trained before it) keeps nothing, and what it holds while it
    runs is its forward's largest op's input and output instead: about twice its largest
    output. The score tensors of eager attention cores (``scores``) are apart: a fused kernel
    never makes them. Returns BlockWork fields, split or not by tensor parallelism."""
    out = dict.fromkeys(("bwd_transient_tp", "bwd_transient_rep", "bwd_transient_scores_tp",
                         "bwd_transient_scores_rep"), 0.0)
    backward = any(by[n].requires_grad for n in op_names)
    for name in op_names:
        op = by[name]
        if (op.requires_grad if backward else op.differentiable) and op.kind not in FREE:
            key = ("bwd_transient_scores" if name in scores else "bwd_transient") + (
                "_tp" if tp.split_of(name)[1] else "_rep")
            out[key] = max(out[key], 2.0 * op.out_bytes)
    return out


def _op_level_checkpointing(op_names: list[str], by: dict, tp: TPAnalysis) -> dict:
    """What torchtitan's op-level selective checkpointing keeps of the block and recomputes:
    the outputs of fused attention calls and of every other weight GEMM, in forward order (its
    policy saves ``aten.mm`` outputs except each second one, and SDPA outputs), the rest
    recomputed in backward. Routed experts run grouped or batched GEMMs (``_grouped_mm``,
    ``bmm``), which the policy neither saves nor counts: recomputed whole (BlockWork.expert_flops),
    outside the share. Returns BlockWork fields."""
    out = dict.fromkeys(("op_saved_tp", "op_saved_rep"), 0.0)
    linear_flops = recomputed_flops = 0.0
    count = 0
    for name in op_names:
        op = by[name]
        save = False
        if op.kind == "attention":
            save = True
        elif op.kind == "matmul" and op.params and not _routes_experts(op):
            count += 1
            flops = sum(2.0 * r[0] * r[1] * r[2] * r[3] for r in op.dims.get("gemms", []))
            linear_flops += flops
            save = count % 2 == 1
            recomputed_flops += 0.0 if save else flops
        if save and op.requires_grad:
            out["op_saved_tp" if tp.split_of(name)[1] else "op_saved_rep"] += op.out_bytes
    out["op_recompute_gemm_share"] = recomputed_flops / linear_flops if linear_flops else 0.0
    return out


def _add_saved(saved: dict[str, float], by: dict, tp: TPAnalysis, scores: set[str],
               acc: dict, fused_away: set[str], linear_inputs: set[str],
               expert_modules: set[str] = frozenset(), copies: set[int] = frozenset(),
               moe_act: set[str] = frozenset(), mla_up: set[str] = frozenset(),
               partly_away: dict[str, float] | None = None,
               fused_kept: dict[str, float] | None = None) -> None:
    """Sort the saved tensors into BlockWork's act_* fields. ``expert_modules``: modules running
    routed experts; what is made inside them with a row per token copy (``copies`` rows in the
    traced batch: the copies, and everything computed per copy) is also counted as routed, not
    the router's or a shared expert's tensors where they run inside the same module (unless
    each token has one copy, top-1 routing, whose rows the filter cannot tell apart).
    ``moe_act``, ``mla_up``: the ops whose outputs ``recompute="moe_act"`` and
    ``recompute="mla_up_proj"`` do not keep (_moe_act_ops, _mla_up_ops). ``partly_away``: bytes
    of saved tensors a fused stack does not keep though eager code does
    (_attention_view_excess). ``fused_kept``: tensors a fused chain keeps in place of the ones it
    drops, which eager code does not keep (fusion.fused_kept_inputs): counted against the
    dropped ones (fused_away fields), so fused stacks keep them and eager ones do not."""
    partly_away = partly_away or {}
    for field in ("act_bytes_tp", "act_bytes_rep", "act_fused_away_tp", "act_fused_away_rep",
                  "act_linear_in_tp", "act_linear_in_rep", "act_routed_tp", "act_routed_rep",
                  "act_routed_fused_away_tp", "act_routed_fused_away_rep",
                  "act_routed_linear_in_tp", "act_routed_linear_in_rep", "act_moe_act_routed",
                  "act_moe_act_routed_fused_away", "act_moe_act_routed_linear_in",
                  "act_moe_act_norm", "act_moe_act_norm_fused_away",
                  "act_moe_act_norm_linear_in", "act_mla_up_tp", "act_mla_up_rep",
                  "act_mla_up_fused_away_tp", "act_mla_up_fused_away_rep"):
        acc[field] = 0.0
    acc["act_bytes_attn"] = acc.pop("attn_scores_saved")
    for key, nbytes in saved.items():
        producer = by.get(key.split(":")[0])
        out_split = tp.split_of(producer.name)[1] if producer else False
        if producer is not None and producer.name in scores and out_split:
            acc["act_bytes_attn"] += nbytes
            continue
        where = "tp" if out_split else "rep"
        acc[f"act_bytes_{where}"] += nbytes
        if key in fused_away:
            acc[f"act_fused_away_{where}"] += nbytes
        elif key in linear_inputs:
            acc[f"act_linear_in_{where}"] += nbytes
        elif key in partly_away:
            acc[f"act_fused_away_{where}"] += partly_away[key]
        routed = producer is not None and _inside(producer.module, expert_modules) and \
            _rows(producer.shape) in copies
        if routed:
            acc[f"act_routed_{where}"] += nbytes
            if key in fused_away:
                acc[f"act_routed_fused_away_{where}"] += nbytes
            elif key in linear_inputs:
                acc[f"act_routed_linear_in_{where}"] += nbytes
        if producer is not None and producer.name in moe_act and where == "rep":
            part = "act_moe_act_routed" if routed else "act_moe_act_norm"
            acc[part] += nbytes
            if key in fused_away:
                acc[f"{part}_fused_away"] += nbytes
            elif key in linear_inputs:
                acc[f"{part}_linear_in"] += nbytes
        if producer is not None and producer.name in mla_up:
            acc[f"act_mla_up_{where}"] += nbytes
            if key in fused_away:
                acc[f"act_mla_up_fused_away_{where}"] += nbytes
            elif key in partly_away and key not in linear_inputs:
                acc[f"act_mla_up_fused_away_{where}"] += partly_away[key]
    for name, nbytes in (fused_kept or {}).items():
        producer = by[name]
        where = "tp" if tp.split_of(name)[1] else "rep"
        acc[f"act_fused_away_{where}"] -= nbytes
        if _inside(producer.module, expert_modules) and _rows(producer.shape) in copies:
            acc[f"act_routed_fused_away_{where}"] -= nbytes
        if name in moe_act and where == "rep":
            acc["act_moe_act_routed_fused_away" if _inside(producer.module, expert_modules) and
                _rows(producer.shape) in copies else "act_moe_act_norm_fused_away"] -= nbytes
        if name in mla_up:
            acc[f"act_mla_up_fused_away_{where}"] -= nbytes


def _attention_view_excess(by: dict, savers: dict[str, list[str]],
                           saved: dict[str, float]) -> dict[str, float]:
    """Bytes of saved tensors that only attention calls keep, and only because they read views of
    them: what the views do not cover. Eager code's views keep the whole tensor alive (DeepSeek-V3's
    values, a slice of the key-value up projection's output, keep all of it, twice their size);
    a fused stack hands the attention contiguous inputs of their own (Megatron-Core's MLA:
    ``value.contiguous()``). Views of one tensor that together cover it (GPT-2's q, k and v of
    one projection) leave nothing."""
    out = {}
    for key, ops in savers.items():
        if key not in by or not ops or any(by[o].kind != "attention" for o in ops):
            continue
        views = {i for o in ops for i in by[o].inputs
                 if i in by and by[i].kind == "view" and through_views(i, by) == key}
        excess = saved[key] - sum(by[v].out_bytes for v in views)
        if views and excess > 0:
            out[key] = excess
    return out


def _mla_up_ops(op_names: list[str], by: dict, cons: dict) -> tuple[set[str], set[str]]:
    """(the ops, and among them the weight GEMMs) that Megatron-Core's ``--recompute-modules
    mla_up_proj`` runs under a checkpoint discarding their outputs once the attention has run
    (``recompute="mla_up_proj"``): in a module running multi-head latent attention (keys wider
    than values), the ops before the attention call that follow one of its weight GEMMs,
    except the norms of its own (the latents' q/kv norms) and the down projections whose
    output such a norm reads. What remains is the up
    projections (the queries', and the keys' and values' from the shared latent; a query
    projection reading the hidden states where there is no query latent) and what makes the
    attention's inputs of their outputs: head views, splits, the rotary embedding, the
    concatenations. What they read from outside (the normed latents, the positional part of
    the down projection, the rotary tables) is the checkpoint's input, kept.

    Empty for a block without latent attention."""
    index = {n: i for i, n in enumerate(op_names)}
    region: set[str] = set()
    for att in op_names:
        if by[att].kind != "attention" or not _keys_wider(by[att]):
            continue
        module = by[att].module
        norms = {by[n].module for n in op_names if (by[n].kind == "norm" or by[n].target == "rsqrt")
                 and by[n].module != module and _inside(by[n].module, {module})}
        downs: set[str] = set()
        for name in op_names[:index[att]]:
            op = by[name]
            if not _inside(op.module, {module}) or _inside(op.module, norms) or op.kind == "input":
                continue
            if _weight_gemm(op):
                if any(_inside(by[c].module, norms)
                       for c in consumers_through_views(name, by, cons)):
                    downs.add(name)  # a down projection (its output normed): an input
                else:
                    region.add(name)
            elif any(i in region or i in downs for i in op.inputs):
                region.add(name)
    return region, {n for n in region if _weight_gemm(by[n])}


def _shared_expert_ops(op_names: list[str], by: dict, routed_modules: set[str]) -> set[str]:
    """The weight GEMMs of an MoE layer's shared expert: inside the module that holds the routed
    experts, not theirs, and not the router's (whose output has a column per routed expert;
    Qwen2-MoE's one-column shared-expert gate counts with the shared expert)."""
    layers = {m.rsplit(".", 1)[0] for m in routed_modules if "." in m}
    experts = {int(r[7]) for n in op_names if _routes_experts(by[n])
               for r in by[n].dims.get("gemms", []) if len(r) > 7 and r[7]}
    return {n for n in op_names
            if _weight_gemm(by[n]) and not _routes_experts(by[n])
            and _inside(by[n].module, layers) and not _inside(by[n].module, routed_modules)
            and not any(r[2] in experts for r in by[n].dims.get("gemms", []))}


def _weight_gemm(op: Op) -> bool:
    return bool(op.params) and (op.kind == "matmul" or bool(op.dims.get("gemms")))


def _moe_act_ops(op_names: list[str], by: dict, cons: dict, routed_modules: set[str],
                 returning: set[str]) -> set[str]:
    """The ops whose outputs Megatron-Core's ``--recompute-modules moe_act layernorm`` frees
    after forward and recomputes in backward, for an MoE block (``recompute="moe_act"``):

    - the routed experts' activation function: the memory-bound ops inside the experts' modules
      that read (through other such ops) the output of an expert GEMM that is not the last of
      its run (the gate and up projection), up to the GEMM that brings the copies back; a bias
      added to that GEMM's output counts as the GEMM's (what the activation is recomputed from,
      kept);
    - the norm before the experts: the ops of a norm module (one running a norm op or an
      ``rsqrt``) whose output an op of an MoE module reads (the router, or a shared expert), an
      MoE module being the parent of the experts' module that runs no attention;
    - the norm before multi-head latent attention (keys wider than values), which Transformer
      Engine does not fuse into the next Linear there (Megatron-Core's MLA layer spec keeps
      ``input_layernorm`` a norm of its own unless ``mla_down_proj_fusion``), in dense layers
      too; not the norms inside the attention (its q/kv norms).

    Empty for a block without routed experts or latent attention."""
    latent = {by[n].module for n in op_names if by[n].kind == "attention" and _keys_wider(by[n])
              or any(a["head_dim"] > a["value_dim"] for a in by[n].dims.get("attention", []))}
    if not routed_modules and not latent:
        return set()
    members = set(op_names)
    firsts = {n for n in op_names if _routes_experts(by[n]) and n not in returning}
    made = set(firsts)  # outputs the activation is recomputed from (kept)
    act: set[str] = set()
    for name in op_names:
        op = by[name]
        if name in made or not _inside(op.module, routed_modules) or op.kind in ("constant",
                                                                                "input"):
            continue
        if op.kind in COMPUTE_BOUND or op.dims.get("gemms") or op.target in GROUPED_GEMMS:
            continue
        sources = {through_views(i, by) for i in op.inputs if i in by}
        if op.kind == "view":
            continue
        if op.target in ("add", "add_") and sources & firsts:
            made.add(name)  # a bias on the GEMM's output
        elif sources & (made | act):
            act.add(name)
    moe_modules = {m.rsplit(".", 1)[0] for m in routed_modules if "." in m}
    attention = {by[n].module for n in op_names if by[n].kind == "attention"}
    moe_modules = {m for m in moe_modules if not any(_inside(a, {m}) for a in attention)}
    before = moe_modules | latent  # the modules whose norm in front is recomputed
    norm_modules = {by[n].module for n in op_names
                    if by[n].kind == "norm" or by[n].target == "rsqrt"}
    norm_ops: set[str] = set()
    for module in norm_modules:
        if _inside(module, before):
            continue  # a norm inside them (MLA's q/kv norms)
        ops = [n for n in op_names if by[n].module == module]
        readers = {c for n in ops for c in consumers_through_views(n, by, cons)
                   if c in members and by[c].module != module}
        if any(_inside(by[c].module, before) for c in readers):
            norm_ops.update(n for n in ops if by[n].kind not in FREE)
    return act | norm_ops


def _rows(shape) -> int:
    """Rows of a tensor of this shape: all but the last dimension (the only one of a vector)."""
    return int(math.prod(shape[:-1])) if len(shape) > 1 else int(shape[0]) if shape else 0


def _inside(module: str, parents: set[str]) -> bool:
    """Whether ``module`` is one of ``parents`` or a submodule of one."""
    return any(module == p or module.startswith(p + ".") for p in parents)


def _word(dtype: str) -> float:
    """Bytes per element of a traced dtype name (16-bit unless it says otherwise)."""
    return 4.0 if "32" in dtype else 8.0 if "64" in dtype else 1.0 if "8" in dtype else 2.0
