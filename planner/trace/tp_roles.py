"""Which ops tensor parallelism splits: Megatron-LM's column/row pattern found on the dataflow graph.

A Linear ``R`` is row-parallel when every gradient-carrying path back from its input reaches other
Linears (``C``, column-parallel) through parameter-free ops only: views, element-wise ops, softmax,
dropout, attention cores and activation-activation matmuls; or through a per-head scale (a norm's
weight over each head, as Qwen3's q_norm and k_norm), whose parameters every rank repeats; or
through a per-head score (one parameter per attention head joined to the scores: gpt-oss's
attention sinks), each rank keeping its own heads' values. Everything on those paths (the region)
runs on 1/t of the heads or hidden units; ``R``'s output is all-reduced in forward and the shared
input of the ``C``s in backward (Shoeybi et al., "Megatron-LM", 2019, section 3). This finds the
attention block (QKV -> attention -> output projection) and the MLP (up/gate -> act -> down) of every
common transformer without knowing module names.

Two more rules follow Megatron: a large embedding table is split by vocabulary rows (``vocab``;
forward all-reduce of its output), and a large Linear whose output only reaches the loss or the
model output is the vocabulary-parallel head (``colwise``; the loss runs on the split logits).
Everything else is replicated. Vocabulary sizes need not divide t: Megatron-LM pads the table to
a multiple of t (planner's own runtime keeps such a table replicated instead, and says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.trace.graph import Op, OpGraph

ROLE_KINDS = {"colwise": "linear", "rowwise": "linear", "vocab": "embedding"}
"""The module kind (graph.OpGraph.module_kinds) each split role needs in an engine that shards
torch.nn.Linear and torch.nn.Embedding only (planner's runtime, DTensor's styles)."""
WALKABLE = {"view", "elementwise", "softmax", "dropout", "attention", "matmul"}
VOCAB_ROWS = 16384
"""An embedding or output Linear with at least this many rows is treated as a vocabulary."""
MAX_WALK = 400
"""Ops one backward walk may visit before the candidate is given up (bounds work on huge DAGs)."""


@dataclass
class TPAnalysis:
    split: dict[str, tuple[bool, bool]] = field(default_factory=dict)
    """op name -> (compute split by t, output split by t)."""
    roles: dict[str, str] = field(default_factory=dict)
    """module FQN -> colwise / rowwise / vocab / replicate."""
    fwd_bytes: dict[str, float] = field(default_factory=dict)
    """op name -> bytes all-reduced across tp in forward, per sample."""
    bwd_bytes: dict[str, float] = field(default_factory=dict)
    """op name -> bytes all-reduced across tp in backward, per sample."""
    divisors: dict[str, list[int]] = field(default_factory=dict)
    """op name -> sizes the tensor-parallel degree must divide."""
    inner_weights: set[str] = field(default_factory=set)
    """Names of ops inside a split region that read weights of their own (per-head norms and
    scores): each tp rank holds or updates them for its own heads only."""
    fused: set[str] = field(default_factory=set)
    """Module FQNs of column-parallel Linears whose output is cut apart along its features (a
    fused q/k/v or gate/up projection, Phi-3's qkv_proj): an engine splitting the weight in
    contiguous rows gives each rank parts of the wrong pieces unless it lays the fused weight
    out per piece (Megatron-Core does; DTensor's ColwiseParallel does not)."""

    def split_of(self, name: str) -> tuple[bool, bool]:
        return self.split.get(name, (False, False))


def analyze(graph: OpGraph) -> TPAnalysis:
    """Find column/row pairs, vocabulary-parallel embeddings and heads."""
    res = TPAnalysis()
    by = graph.by_name
    cons = graph.consumers()
    linears = [op for op in graph.ops if op.dims.get("linear")]
    linear_names = {op.name for op in linears}
    per_head = {op.name: kind for op in graph.ops
                for kind, test in (("scale", _per_head_scale), ("score", _per_head_score))
                if test(op, graph.params)}
    for lin in linears:
        _try_row_parallel(lin, by, cons, linear_names, res, per_head)
    vocab_params = _vocab_embeddings(graph, res)
    for lin in linears:
        if lin.name not in res.split:
            _try_vocab_head(lin, by, cons, graph.batch, vocab_params, res)
    for op in graph.ops:
        if op.params and op.module and op.module not in res.roles:
            res.roles[op.module] = "replicate"
    return res


def _per_head_scale(op: Op, params) -> bool:
    """An element-wise op scaling each head by parameters of the head size (the weight of a norm
    over each head: Qwen3's q_norm and k_norm): on a tensor of (..., heads, head_dim) with every
    parameter head_dim long (the region must hold an attention core of that head size). Tensor parallelism leaves it inside the region, its
    parameters repeated on every rank (Megatron-Core's q/k layernorm), each rank scaling its own
    heads."""
    if op.kind != "elementwise" or not op.params or len(op.shape) < 4 or op.shape[-2] < 2:
        return False
    return all(name in params and params[name].numel == op.shape[-1] for name in op.params)


def _per_head_score(op: Op, params) -> bool:
    """An element-wise op joining one parameter per head to a (..., heads, queries, keys) scores
    tensor (gpt-oss's attention sinks: a learned logit per head that the softmax normalizes over
    with the keys). Tensor parallelism splits it with the heads: Megatron-Core keeps the sinks of
    its own heads on each rank (the region must hold attention scores with that many heads)."""
    if op.kind != "elementwise" or not op.params or len(op.shape) < 4 or op.shape[-3] < 2:
        return False
    return all(name in params and params[name].numel == op.shape[-3] for name in op.params)


def _try_row_parallel(row: Op, by, cons, linear_names, res: TPAnalysis,
                      per_head: dict[str, str] | None = None) -> None:
    per_head = per_head or {}
    region: set[str] = set()
    cols: set[str] = set()
    stack = [i for i in row.inputs if by[i].differentiable]
    while stack:
        if len(region) > MAX_WALK:
            return
        name = stack.pop()
        if name in region or name in cols:
            continue
        op = by[name]
        if not op.differentiable:
            continue
        if name in linear_names:
            if res.split.get(name, (False, False))[0]:
                return  # already part of another pair
            cols.add(name)
            continue
        if op.kind not in WALKABLE or (op.params and name not in per_head):
            return
        region.add(name)
        stack.extend(op.inputs)
    if not cols:
        return
    head_dims = {by[by[n].inputs[0]].shape[-1] for n in region
                 if by[n].kind == "attention" and by[n].inputs and by[by[n].inputs[0]].shape}
    score_heads = {by[n].shape[-3] for n in region
                   if by[n].kind == "matmul" and len(by[n].shape) >= 4}  # eager attention scores
    score_heads |= {by[n].dims.get("heads_q", 0) for n in region if by[n].kind == "attention"}
    inner = region & per_head.keys()
    if not all(by[n].shape[-1] in head_dims if per_head[n] == "scale"
               else by[n].shape[-3] in score_heads for n in inner):
        return  # a scale or score over a dimension that is not the attention's heads
    if row.module in {by[c].module for c in cols}:
        return  # one module on both sides (nn.MultiheadAttention): no role per module fits it
    inside = region | cols | {row.name}
    for name in region | cols:
        if any(by[c].differentiable and c not in inside for c in cons[name]):
            return  # a split tensor escapes the pair: it would need a gather
    for name in region | cols:
        res.split[name] = (True, True)
    res.split[row.name] = (True, False)
    res.roles[row.module] = "rowwise"
    for name in cols:
        res.roles[by[name].module] = "colwise"
        if any(_cuts_features(by[c], by[name]) or _packs_pieces(by[c], by[name], by, cons)
               for c in cons[name]):
            res.fused.add(by[name].module)
    for name in inner:
        res.roles[by[name].module] = "replicate"
    res.inner_weights |= inner
    res.fwd_bytes[row.name] = row.out_bytes
    col_inputs = {i for c in cols for i in by[c].inputs}
    res.bwd_bytes[row.name] = sum(by[i].out_bytes for i in col_inputs)
    divs = {by[c].dims.get("out", 0) for c in cols} | {row.dims.get("in", 0)}
    head_dims = set()
    for name in region:
        if by[name].kind == "attention":
            divs |= {by[name].dims.get("heads_q", 0), by[name].dims.get("heads_kv", 0)}
            query = by[by[name].inputs[0]].shape if by[name].inputs else []
            head_dims |= {query[-1]} if query else set()
    for name in region:
        divs.add(_heads_of_view(by[name], by, head_dims))
    res.divisors[row.name] = sorted(d for d in divs if d > 0)


def whole_attention(graph: OpGraph, res: TPAnalysis) -> list[str]:
    """The modules (in trace order) whose attention no column/row pair splits: a fused core, or
    eager scores' softmax over (..., heads, queries, keys), left out of every region (a learned
    position bias shared by the layers, as T5's and Swin's, or nn.MultiheadAttention's packed
    projections): tensor parallelism runs them whole on every rank."""
    out: list[str] = []
    for op in graph.ops:
        core = op.kind == "attention" or (op.kind == "softmax" and len(op.shape) >= 4
                                          and op.shape[-3] >= 2)
        if core and op.module and not res.split_of(op.name)[0] and op.module not in out:
            out.append(op.module)
    return out


FEATURE_CUTS = {"slice", "split", "split_with_sizes", "chunk", "narrow", "tensor_split"}
"""View ops that cut a tensor into parts (torch.fx targets, as the trace records them)."""


def _cuts_features(op: Op, linear: Op) -> bool:
    """Whether ``op`` takes a part of ``linear``'s output features (its last dimension): Phi-3
    slices its qkv_proj's output into q, k and v, and chunks its gate_up_proj's in two."""
    return (op.kind == "view" and op.target in FEATURE_CUTS and len(op.shape) == len(linear.shape)
            and bool(op.shape) and 0 < op.shape[-1] < linear.shape[-1])


def _packs_pieces(op: Op, linear: Op, by, cons) -> bool:
    """Whether ``op`` reshapes ``linear``'s output features into pieces that are then taken apart
    along the first of the new dimensions: timm's and many a ViT's ``qkv(x).reshape(B, N, 3,
    heads, head_dim).permute(2, 0, 3, 1, 4)`` unbound into q, k and v along the 3. A contiguous
    split of the features by rank would cut across the pieces. A reshape into (heads, ...) whose
    parts are taken along a later dimension (GPT-NeoX's and BLOOM's (heads, 3, head_dim)) keeps
    whole heads on each rank, and (heads, head_dim) alone (grouped keys and values, repeated
    later) is never taken apart along the heads. The piece dimension is followed through views
    that permute the shape where its size tells it apart (the trace keeps shapes, not the
    permutation); where it does not, the module is not marked (plan run's probe,
    planner.runtime.dataflow, follows the real permutation)."""
    src = linear.shape
    if op.kind != "view" or op.target not in PACKING_VIEWS or len(op.shape) <= len(src) or not src:
        return False
    if list(op.shape[:len(src) - 1]) != list(src[:-1]):
        return False
    trailing = op.shape[len(src) - 1:]
    size = 1
    for n in trailing:
        size *= n
    if size != src[-1] or len(trailing) < 2 or trailing[0] < 2:
        return False
    pieces = trailing[0]
    frontier, seen = [(op, len(src) - 1)], 0
    while frontier and seen < MAX_WALK:
        here, axis = frontier.pop()
        shape = list(here.shape)
        for name in cons.get(here.name, ()):
            seen += 1
            nxt = by[name]
            out = list(nxt.shape)
            if nxt.kind != "view":
                continue
            if nxt.target in PERMUTING_VIEWS and sorted(out) == sorted(shape):
                at = [i for i, n in enumerate(out) if n == pieces]
                if len(at) == 1:
                    frontier.append((nxt, at[0]))
            elif nxt.target in PIECE_TAKERS and (
                    out == shape[:axis] + shape[axis + 1:]  # one piece: unbind, select, index
                    or (len(out) == len(shape) and 0 < out[axis] < shape[axis]
                        and out[:axis] + out[axis + 1:] == shape[:axis] + shape[axis + 1:])):
                return True
    return False


PACKING_VIEWS = {"reshape", "view", "unflatten", "_unsafe_view"}
"""View ops that can split a tensor's last dimension into several (torch.fx targets)."""
PERMUTING_VIEWS = {"permute", "transpose", "swapaxes", "movedim", "t"}
"""View ops that reorder a tensor's dimensions (torch.fx targets)."""
PIECE_TAKERS = FEATURE_CUTS | {"unbind", "select", "getitem", "index_select"}
"""View ops that take parts of a tensor along one dimension (torch.fx targets)."""


def _heads_of_view(op: Op, by, head_dims: set[int]) -> int:
    """A view splitting the last dimension into (heads, head_dim) -> heads, else 0.

    Catches grouped-query attention, whose key/value heads are repeated before the attention
    core: tensor parallelism must divide the key/value heads, not only the query heads. Where the
    region has attention cores, only splits into their head size (``head_dims``) count: a split
    of a packed projection into (3, hidden) for q, k and v is not a head count."""
    if op.kind != "view" or len(op.shape) < 3 or not op.inputs:
        return 0
    src = by[op.inputs[0]].shape
    heads, head_dim = op.shape[-2], op.shape[-1]
    if head_dims and head_dim not in head_dims:
        return 0
    if src and len(src) == len(op.shape) - 1 and src[-1] == heads * head_dim and head_dim > 1:
        return heads
    return 0


def _vocab_embeddings(graph: OpGraph, res: TPAnalysis) -> set[str]:
    params = set()
    for op in graph.ops:
        if op.kind == "embedding" and op.dims.get("rows", 0) >= VOCAB_ROWS and op.params:
            res.split[op.name] = (True, False)
            res.roles[op.module] = "vocab"
            res.fwd_bytes[op.name] = op.out_bytes
            params.update(op.params)
    return params


def _try_vocab_head(lin: Op, by, cons, batch: int, vocab_params: set[str], res: TPAnalysis) -> None:
    tied = bool(set(lin.params) & vocab_params)
    if lin.dims.get("out", 0) < VOCAB_ROWS and not tied:
        return
    region: set[str] = set()
    stack = [lin.name]
    reaches_loss = False
    while stack:
        name = stack.pop()
        for c in cons[name]:
            op = by[c]
            if c in region or not op.differentiable:
                continue
            if op.kind == "loss":
                reaches_loss = True
            elif op.kind not in ("view", "elementwise", "softmax", "dropout") or op.params:
                return
            region.add(c)
            stack.append(c)
    res.split[lin.name] = (True, True)
    for name in region:
        res.split[name] = (True, True)
    res.roles[lin.module] = "colwise"
    res.bwd_bytes[lin.name] = sum(by[i].out_bytes for i in lin.inputs)
    # Vocabulary-parallel cross entropy all-reduces three fp32 numbers per token (max, sum of
    # exponentials, target logit); without a loss, the logits are gathered instead.
    tokens_per_sample = _tokens(lin) / batch
    res.fwd_bytes[lin.name] = 3 * 4 * tokens_per_sample if reaches_loss else lin.out_bytes


def _tokens(op: Op) -> int:
    n = 1
    for d in op.shape[:-1]:
        n *= d
    return n
