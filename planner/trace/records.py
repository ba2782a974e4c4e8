"""Turn traced nodes (fx or export, with their meta values) into OpGraph ops.

Both tracers reduce their nodes to ``NodeView``s; ``build_ops`` then applies one set of rules:
gradient flow, view aliasing, memory traffic, saved activations (planner.trace.ops), and what each
node that computes runs, priced from its ATen ops (planner.trace.aten): its GEMMs with the
gradients backward computes, fused attention calls, memory traffic, and ops no formula prices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from planner.trace.aten import AtenAttention, CallWork
from planner.trace.graph import Op
from planner.trace.ops import COMPUTE_BOUND, TensorRef, kind_of, saved_tensors

ROUTING = {"topk", "argmax", "max"}
"""Ops that pick experts for tokens (a router's top-k or top-1 choice, over the last dimension:
one score per expert; ``max`` only along a dimension, where it returns the indices too)."""
NON_DIFFERENTIABLE = {"detach", "argmax", "argmin", "_assert_tensor_metadata", "size", "sym_size"}


@dataclass
class NodeView:
    """One traced node, tracer-neutral."""

    name: str
    op: str
    """``input``, ``param``, ``buffer`` or ``call``."""
    short: str
    """Op short name, or the FQN for params and buffers."""
    module: str
    value: object
    """The node's meta value: a tensor, a tuple of tensors, or a non-tensor."""
    inputs: list = field(default_factory=list)
    """fx Nodes it reads."""
    params: list[str] = field(default_factory=list)
    """Parameter FQNs it reads directly (fx call_module)."""
    work_fn: Callable[[Callable[[str], tuple[bool, bool]]], CallWork] = lambda flags: CallWork()
    """Runs the node again and prices it; takes flags(node name) -> (requires_grad, is_param)."""
    attrs: dict = field(default_factory=dict)
    """Non-tensor facts about the call (``causal`` for attention)."""


@dataclass
class _Tensor:
    op_name: str
    nbytes: float
    requires_grad: bool
    base: str
    base_bytes: float
    param: str = ""
    buffer: bool = False
    shape: tuple = ()
    differentiable: bool = False
    """Op.differentiable: carries a gradient were every parameter trained."""


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(_tensors(v))
        return out
    return []


def _nbytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def build_ops(views: list[NodeView], *, batch: int, outputs: list[str] = (),
              frozen: frozenset[str] = frozenset()) -> list[Op]:
    """Ops with per-sample figures (activation sizes and FLOPs divided by ``batch``). Ops the
    loss does not depend on (``outputs``: the graph's outputs) run forward only. Parameters named
    in ``frozen`` (requires_grad=False) carry no gradient: what reads only them and activations
    without one computes no gradient either, as autograd skips it."""
    env: dict[str, _Tensor] = {}
    ops: list[Op] = []
    # module -> {experts chosen among: token copies routed (top-k x tokens, traced batch)}
    routers: dict[str, dict[int, float]] = {}
    for v in views:
        outs = _tensors(v.value)
        if v.short in ROUTING and outs and v.inputs and v.inputs[0].name in env and env[
                v.inputs[0].name].shape and (v.short != "max" or len(outs) == 2):
            shape = env[v.inputs[0].name].shape
            chosen = int(outs[0].shape[-1]) if v.short == "topk" and outs[0].dim() else 1
            routers.setdefault(v.module, {})[int(shape[-1])] = \
                chosen * math.prod(shape[:-1])
        if v.op in ("param", "buffer"):
            if outs:
                nb = _nbytes(outs[0])
                env[v.name] = _Tensor(v.name, nb, v.op == "param" and v.short not in frozen,
                                      v.name, nb,
                                      param=v.short if v.op == "param" else "",
                                      buffer=v.op == "buffer", shape=tuple(outs[0].shape),
                                      differentiable=v.op == "param")
            continue
        if not outs:
            continue  # asserts, sizes, None outputs: no data
        op = _make_op(v, outs, env, batch, routers, frozen)
        ops.append(op)
        env[v.name] = _Tensor(v.name, op.out_bytes, op.requires_grad, op.base,
                              env[op.base].nbytes if op.base in env and op.base != v.name
                              else op.out_bytes, shape=tuple(outs[0].shape),
                              param=_weight_view(op, v, env), differentiable=op.differentiable)
    return _forward_only(ops, outputs)


def _forward_only(ops: list[Op], outputs) -> list[Op]:
    """Ops whose results never reach the loss (a pooling head whose output a classifier ignores)
    get no gradient: no backward GEMMs, nothing saved. The loss is the first scalar output that
    carries a gradient (Op.differentiable); without one, every output that carries a gradient
    is differentiated."""
    by = {op.name: op for op in ops}
    carried = [by[o] for o in outputs if o in by and by[o].differentiable]
    if not carried:
        return ops
    scalars = [op for op in carried if math.prod(op.shape) == 1]
    live, stack = set(), [op.name for op in (scalars[:1] or carried)]
    while stack:
        name = stack.pop()
        if name in live or name not in by:
            continue
        live.add(name)
        stack.extend(by[name].inputs)
    for op in ops:
        if op.differentiable and op.name not in live:
            op.requires_grad = op.differentiable = False
            op.saves = []
            for row in op.dims.get("gemms", []):
                row[5] = row[6] = 0
    return ops


def _weight_view(op: Op, v: NodeView, env: dict[str, _Tensor]) -> str:
    """The parameter a view of a weight shows (a transposed expert matrix), so that what reads it
    reads a weight; '' for anything else."""
    if op.kind != "view" or op.inputs:
        return ""
    return next((env[n.name].param for n in v.inputs if n.name in env and env[n.name].param), "")


def _routed_copies(module: str, routers: dict[str, dict[int, float]], experts: int) -> float:
    """The token copies routed to ``experts`` groups for ``module`` (0: it routes none): a top-k
    or argmax over that many scores ran before in the same repeated block (the entry of a layer
    list it is in, as ``mlp.gate`` beside ``mlp.experts`` in ``layers.3``), or, outside any
    layer list, in the module itself or beside it under its parent."""
    parts = module.split(".")
    numbered = [i for i, part in enumerate(parts) if part.isdigit()]
    scope = ".".join(parts[:numbered[-1] + 1]) if numbered else module.rpartition(".")[0]
    return next((chosen[experts] for r, chosen in routers.items() if experts in chosen and (
        r == module or (scope and (r == scope or r.startswith(scope + "."))))), 0.0)


def _make_op(v: NodeView, outs: list[torch.Tensor], env: dict[str, _Tensor], batch: int,
             routers: dict[str, dict[int, float]] | None = None,
             frozen: frozenset[str] = frozenset()) -> Op:
    ins = [env[n.name] for n in v.inputs if n.name in env]
    acts = [x for x in ins if not x.param and not x.buffer]
    kind = "input" if v.op == "input" else kind_of(v.short)
    # (complex results carry gradients too: rotary embeddings as complex products, Llama 4's)
    floating = any(t.is_floating_point() or t.is_complex() for t in outs)
    reads_params = [x.param for x in ins if x.param] + list(v.params)
    can_differentiate = floating and kind not in ("constant", "input") and \
        v.short not in NON_DIFFERENTIABLE
    requires_grad = can_differentiate and (any(x.requires_grad for x in ins)
                                           or any(p not in frozen for p in v.params))
    differentiable = can_differentiate and (any(x.differentiable for x in ins) or bool(v.params))
    out_bytes = sum(_nbytes(t) for t in outs) / batch
    base = v.name
    if kind == "view" and acts:
        base = acts[0].base
    # Memory traffic: activation operands and outputs. Weights are read once per micro-batch, not
    # per sample, and an embedding reads only the rows it returns: neither scales with the batch.
    in_bytes = sum(x.nbytes for x in acts)
    if kind == "embedding":
        in_bytes = out_bytes
    io_bytes = 0.0 if kind in ("view", "constant", "input") else in_bytes + out_bytes
    dims = _dims(kind, acts, ins, outs, bool(v.params), v.attrs, batch)
    flops, unpriced, gates = 0.0, {}, 0.0
    if kind == "attention":
        flops = _attention(acts, v.attrs).flops / batch if "scores" in dims else 0.0
    elif kind in COMPUTE_BOUND or kind == "other":
        work = v.work_fn(lambda name: (env[name].requires_grad, bool(env[name].param))
                         if name in env else (False, False))
        flops, gates = work.flops / batch, work.gemm_out_bytes / batch
        dims.update(_work_dims(work, batch, routed=lambda experts: _routed_copies(
            v.module, routers or {}, experts)))
        unpriced = {name: [n, nbytes / batch] for name, (n, nbytes) in work.unpriced.items()}
    refs = [TensorRef(key=x.base, nbytes=x.base_bytes, requires_grad=x.requires_grad,
                      is_param=bool(x.param) or x.buffer) for x in ins]
    out_ref = TensorRef(key=v.name, nbytes=out_bytes, requires_grad=requires_grad)
    out_numel = sum(t.numel() for t in outs) / batch
    saves = saved_tensors(v.short, kind, refs, out_ref, out_numel, v.name)
    if v.short in RECURRENT and requires_grad and gates > 0:
        # a recurrent layer keeps every timestep's gates and states for its backward (the
        # native fused cells save the gates, the cell state and the output, cuDNN's in its reserve
        # space): priced as its GEMMs' results, each step's input and hidden projections (8H an
        # LSTM step against the 7H a native cell keeps)
        saves.append((f"{v.name}:states", gates))
    return Op(
        name=v.name, kind=kind, target=v.short, module=v.module,
        inputs=list(dict.fromkeys(x.op_name for x in acts)), params=list(dict.fromkeys(reads_params)),
        flops=flops, out_bytes=out_bytes, io_bytes=io_bytes, shape=list(outs[0].shape),
        dtype=str(outs[0].dtype).replace("torch.", ""), requires_grad=requires_grad,
        differentiable=differentiable, base=base,
        saves=[[k, b] for k, b in saves], dims=dims, unpriced=unpriced,
    )


RECURRENT = {"LSTM", "GRU", "RNN", "lstm", "gru", "rnn_tanh", "rnn_relu"}
"""Recurrent layers (nn modules traced as leaves, or their ATen ops): what they save for backward
is each timestep's gates and states, not their inputs and output alone."""


def _attention(acts: list[_Tensor], attrs: dict) -> AtenAttention:
    """A fused attention node from its query, key and value shapes (batch, heads, length, dim)."""
    q, k = acts[0].shape, acts[1].shape
    v = acts[2].shape if len(acts) > 2 else k
    return AtenAttention(batch=int(q[0]), heads_q=int(q[1]), heads_kv=int(k[1]), q_len=int(q[2]),
                         kv_len=int(k[2]), head_dim=int(q[3]), value_dim=int(v[3]),
                         causal=bool(attrs.get("causal")), dropout=attrs.get("dropout", 0) > 0)


def _work_dims(work: CallWork, batch: int, routed=lambda experts: 0.0) -> dict:
    """A priced call per sample: its GEMMs as [batch, m, n, k, weight, grad_a, grad_b, experts] (the
    dimension that carries the samples divided by ``batch``), its fused attention calls, and the
    bytes and kernels of its memory-bound ATen ops. A GEMM against a stacked weight
    (AtenGemm.stacked) of E matrices where ``routed(E)`` token copies were routed among E experts
    (_routed_copies) is capacity-style experts: one row of all the experts' token slots, as a
    grouped GEMM's, with a ninth entry, the share of the slots those copies fill (at most 1)."""
    gemms = []
    for g in work.gemms:
        copies = routed(int(g.batch)) if g.stacked else 0.0
        if copies:
            slots = g.batch * g.m
            gemms.append([1, slots / batch, g.n, g.k, 1, int(g.grad_a), int(g.grad_b),
                          int(g.batch), min(1.0, copies / slots)])
            continue
        b, m = (g.batch, g.m / batch) if g.weight or g.batch == 1 else (g.batch / batch, g.m)
        gemms.append([b, m, g.n, g.k, int(g.weight), int(g.grad_a), int(g.grad_b), g.experts])
    attention = [{"batch": a.batch / batch, "heads_q": a.heads_q, "heads_kv": a.heads_kv,
                  "q_len": a.q_len, "kv_len": a.kv_len, "head_dim": a.head_dim,
                  "value_dim": a.value_dim, "causal": int(a.causal), "dropout": int(a.dropout)}
                 for a in work.attention]
    out = {"gemms": gemms} if gemms else {}
    if attention:
        out["attention"] = attention
    if work.mem_bytes:
        out["mem_bytes"] = work.mem_bytes / batch
        out["kernels"] = work.kernels
    return out


def _dims(kind: str, acts: list[_Tensor], ins: list[_Tensor], outs, module_params: bool,
          attrs: dict, batch: int) -> dict:
    """Kind-specific sizes: a Linear's in/out features (what tensor parallelism splits),
    attention heads, embedding rows."""
    out_shape = tuple(outs[0].shape)
    if kind == "matmul" and acts and (module_params or any(x.param and len(x.shape) == 2 for x in ins)):
        k = int(acts[0].shape[-1]) if acts[0].shape else 0
        n = int(out_shape[-1]) if out_shape else 0
        if module_params and len(acts[0].shape) != len(out_shape):
            return {}  # a convolution: not a Linear tensor parallelism could split
        return {"in": k, "out": n, "linear": 1}
    if kind == "attention" and len(acts) >= 2 and len(acts[0].shape) == 4:
        q, k = acts[0].shape, acts[1].shape
        v = acts[2].shape if len(acts) > 2 else k
        return {"heads_q": int(q[1]), "heads_kv": int(k[1]), "head_dim": int(q[3]),
                "causal": int(bool(attrs.get("causal"))), "dropout": int(attrs.get("dropout", 0) > 0),
                "scores": int(q[1]) * int(q[2]) * int(k[2]),
                "q_elems": int(q[1]) * int(q[2]) * int(q[3]),
                "kv_elems": int(k[1]) * int(k[2]) * (int(k[3]) + int(v[3]))}
    if kind == "embedding":
        weights = [x for x in ins if x.param and len(x.shape) == 2]
        if weights:
            return {"rows": int(weights[0].shape[0]), "cols": int(weights[0].shape[1])}
    return {}


def _prod(dims) -> float:
    out = 1.0
    for d in dims:
        out *= int(d)
    return out
