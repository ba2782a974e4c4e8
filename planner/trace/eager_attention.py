"""Attention computed by eager code (its own matmuls and softmax, not a fused kernel): which
traced ops form its cores, so that the cost model prices them as attention (by ``--engine
attention``) and context parallelism can split and exchange them (planner.trace.annotate reads
them into a block's work)."""

from __future__ import annotations

from planner.trace.graph import OpGraph

SCORE_KINDS = ("elementwise", "softmax", "dropout", "norm", "other")
"""Kinds of memory-bound op (planner.trace.ops) that carry a core's scores along (scale, mask,
softmax, dropout, casts)."""
LOG_SOFTMAX = ("log_softmax", "_log_softmax", "LogSoftmax")
"""Softmax-kind targets that give log-probabilities (a loss or a contrastive similarity's), not
attention weights."""


def eager_attention(graph: OpGraph) -> tuple[set[str], set[str]]:
    """(the GEMM nodes, the score nodes) of attention cores traced from eager code: a matmul of
    two activations that carries gradients and reads no scores produces scores (QK^T); views and
    memory-bound ops of them are scores too (scale, mask, softmax, dropout, casts); a matmul
    reading scores consumes them (scores x V). A core counts only where its scores are normalized
    as a softmax is (a softmax, or a hand-written one: an exp divided by what comes of it, its
    sum): the products of activations in a state-space scan (Mamba2's chunked SSD), a
    log-softmax's contrastive similarity or other einsum code are GEMMs of their own, not
    attention that context parallelism could split."""
    by = graph.by_name
    gemms: dict[str, set[str]] = {}  # a GEMM -> the QK^T matmuls whose scores it makes or reads
    root: dict[str, set[str]] = {}  # a score node -> the QK^T matmuls it comes from
    softmaxed: set[str] = set()  # QK^T matmuls whose scores reach a softmax
    exps: set[str] = set()  # exps of scores (a hand-written softmax divides one by its sum)
    for op in graph.ops:
        roots = set().union(*(root.get(i, ()) for i in op.inputs))
        if op.kind == "matmul" and not op.params and op.differentiable and len(op.inputs) >= 2 \
                and not op.dims.get("linear") and all(not by[i].params for i in op.inputs):
            gemms[op.name] = roots or {op.name}
            if not roots:
                root[op.name] = {op.name}
        elif roots and op.differentiable and (op.kind == "view" or op.kind in SCORE_KINDS):
            root[op.name] = roots
            normalizes = op.target in ("div", "div_", "truediv") and \
                any(i in exps for i in op.inputs)
            if op.kind == "softmax" and op.target not in LOG_SOFTMAX or normalizes:
                softmaxed |= roots
            if op.target in ("exp", "exp_"):
                exps.add(op.name)
    return ({g for g, roots in gemms.items() if roots & softmaxed},
            {s for s, roots in root.items() if roots & softmaxed})
