"""OpGraph (traced ops) and BlockGraph (layer-sized units): plain data, networkx inside, no torch.

An OpGraph holds the ops of one trace in topological order. When a model repeats one layer many
times, the tracer keeps only the first two copies (``RepeatInfo``); the block builder re-creates the
others from the second, so neither tracing nor the graph grows with depth.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import networkx as nx

from costmodels.workload import BlockWork
from planner.units import human_count


@dataclass
class Op:
    """One traced op, for one sample (batch 1) at the traced sequence length."""

    name: str
    """Unique node name from the trace."""
    kind: str
    """Kind from planner.trace.ops (matmul, attention, norm, elementwise, view, ...)."""
    target: str
    """Short op name: aten packet (``linear``), function (``add``) or module class (``Linear``)."""
    module: str
    """FQN of the innermost module that ran it ('' for the root)."""
    inputs: list[str] = field(default_factory=list)
    """Names of the ops producing its tensor operands (parameters excluded)."""
    params: list[str] = field(default_factory=list)
    """FQNs of the parameters it reads."""
    flops: float = 0.0
    """Forward FLOPs."""
    out_bytes: float = 0.0
    """Bytes of its output(s)."""
    io_bytes: float = 0.0
    """Bytes it reads and writes (memory-bound ops)."""
    shape: list[int] = field(default_factory=list)
    """Shape of the (first) output."""
    dtype: str = ""
    """Dtype of the (first) output."""
    requires_grad: bool = False
    """Whether a gradient flows through its output."""
    differentiable: bool = False
    """Whether one would were every parameter trained: what tells the model's activations from
    its constants (masks, positions) whatever is frozen, for the blocks and the tensor-parallel
    regions (``requires_grad`` prices the backward)."""
    base: str = ""
    """Op owning the storage its output aliases (itself unless a view)."""
    saves: list[list] = field(default_factory=list)
    """[key, bytes] of activations it keeps for backward (keys are storage owners)."""
    dims: dict = field(default_factory=dict)
    """Kind-specific sizes: linear in/out features, attention heads, embedding rows; for a node
    that computes, what its ATen ops run per sample (planner.trace.aten): ``gemms`` as
    [batch, m, n, k, weight, grad_a, grad_b], fused ``attention`` calls, ``mem_bytes`` and
    ``kernels`` of its memory-bound ops."""
    unpriced: dict = field(default_factory=dict)
    """ATen (or custom) op name -> [calls, bytes per sample] inside this node that no formula
    prices (priced by their bytes only)."""


@dataclass
class ParamInfo:
    """One parameter tensor."""

    shape: list[int]
    numel: int
    nbytes: int
    trainable: bool = True
    """Whether training updates it (requires_grad): a frozen parameter keeps its weights but has
    no gradient, no optimizer states and no weight-gradient GEMMs."""


@dataclass
class RepeatInfo:
    """A ModuleList (or Sequential) of layers; the first ``traced`` are in the trace (all of them
    when ``traced == count``), and each layer after them is a copy of the last traced period's
    layer of its phase (planner.trace.tracers.layer_pattern)."""

    fqn: str
    """FQN of the list (``model.layers``)."""
    count: int
    """Layers in the real model."""
    traced: int
    """Layers present in the trace (the first ones)."""
    period: int = 1
    """Layers after which the stack repeats itself (1: identical layers; 2: gpt-oss's sliding-
    window and full attention in turn)."""

    def template(self, k: int) -> int:
        """The traced layer that layer ``k`` (not traced) is a copy of: the same phase in the
        last traced period."""
        return self.traced - self.period + (k - self.traced) % self.period


@dataclass
class OpGraph:
    """Ops of one trace, in topological order."""

    ops: list[Op]
    params: dict[str, ParamInfo]
    outputs: list[str]
    seq_len: int
    batch: int
    dtype: str
    method: str
    """``fx`` or ``export``: which tracer produced it."""
    repeats: list[RepeatInfo] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    """FQNs of ModuleList / ModuleDict / Sequential modules (their children are the units)."""
    expert_groups: list[int] = field(default_factory=list)
    """[groups, groups per token] of a router that limits each token's experts to its best
    groups of consecutive experts (DeepSeek-V3's node-limited routing: 8, 4); empty: none."""
    module_kinds: dict[str, str] = field(default_factory=dict)
    """Module FQN -> ``linear`` (a torch.nn.Linear), ``embedding`` (a torch.nn.Embedding) or the
    class name, for modules holding parameters of their own: which of them an engine that shards
    those two classes only can split (BlockGraph.tp_other_modules)."""

    def __post_init__(self):
        self.by_name = {op.name: op for op in self.ops}

    def position_tables(self) -> list[tuple[str, int]]:
        """(module, rows) of the embeddings looked up by torch.arange positions (learned position
        embeddings), through any views of the positions."""
        ops = {op.name: op for op in self.ops}
        out = []
        for op in self.ops:
            if op.kind != "embedding" or not op.inputs or not op.params:
                continue
            source = ops.get(op.inputs[0])
            while source is not None and source.kind == "view" and source.inputs:
                source = ops.get(source.inputs[0])
            rows = self.params[op.params[0]].shape[0] if op.params[0] in self.params else 0
            if source is not None and source.target == "arange" and rows > 0:
                out.append((op.module or op.params[0], rows))
        return out

    def unpriced_ops(self) -> list[dict]:
        """What no formula prices: per op name, its calls and its share of the bytes the traced
        ops move, largest share first."""
        moved = sum(op.io_bytes + op.dims.get("mem_bytes", 0.0) for op in self.ops) or 1.0
        totals: dict[str, list] = {}
        for op in self.ops:
            for name, (calls, nbytes) in op.unpriced.items():
                entry = totals.setdefault(name, [0, 0.0])
                entry[0] += calls
                entry[1] += nbytes
        rows = [{"op": name, "count": calls, "bytes_share": nbytes / moved}
                for name, (calls, nbytes) in totals.items()]
        return sorted(rows, key=lambda r: (-r["bytes_share"], r["op"]))

    def to_nx(self) -> nx.DiGraph:
        """Dataflow graph: an edge per (producer, consumer), weighted by the producer's bytes."""
        g = nx.DiGraph()
        for op in self.ops:
            g.add_node(op.name)
            for src in op.inputs:
                g.add_edge(src, op.name, bytes=self.by_name[src].out_bytes)
        return g

    def consumers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {op.name: [] for op in self.ops}
        for op in self.ops:
            for src in op.inputs:
                out[src].append(op.name)
        return out

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "OpGraph":
        return cls(
            ops=[Op(**o) for o in d["ops"]],
            params={k: ParamInfo(**v) for k, v in d["params"].items()},
            outputs=list(d["outputs"]), seq_len=d["seq_len"], batch=d["batch"],
            dtype=d["dtype"], method=d["method"],
            repeats=[RepeatInfo(**r) for r in d.get("repeats", [])],
            containers=list(d.get("containers", [])),
            expert_groups=list(d.get("expert_groups", [])),
            module_kinds=dict(d.get("module_kinds", {})),
        )


@dataclass
class Block:
    """A layer-sized unit of the model: the granularity of pipeline cuts."""

    name: str
    """The block's module FQN (``model.layers.7``) or a merged name (``model.embed_tokens+...``)."""
    modules: list[str]
    """Module FQNs in the block, in execution order (the plan's stage ``modules``)."""
    work: BlockWork
    """Per-sample work and memory (see costmodels.workload)."""
    params: list[str] = field(default_factory=list)
    """Parameter FQNs the block reads (tied parameters appear in every block that reads them)."""
    ops: list[str] = field(default_factory=list)
    """Traced op names (empty for blocks re-created from a repeated layer)."""
    template: str = ""
    """For a re-created layer: the traced block it copies."""
    tp_divisors: list[int] = field(default_factory=list)
    """Sizes a tensor-parallel degree must divide (head counts, split feature sizes)."""
    split_params: list[str] = field(default_factory=list)
    """The parameters of ``params`` that tensor parallelism splits."""
    recompute: bool = True
    """Whether activation checkpointing applies to it: the repeated layers of a model that has
    them (as Megatron-LM and torchtitan checkpoint transformer blocks), every block otherwise."""
    tp_inner_weights: bool = False
    """Whether weights of its own sit inside a tensor-parallel region (Qwen3's per-head norms,
    gpt-oss's attention sinks), which an engine must shard with the heads or keep in step
    (planner.targets; planner's runtime: planner.runtime.inner_weights)."""


@dataclass
class BlockEdge:
    """Activations flowing from one block to another, per sample."""

    src: str
    dst: str
    nbytes: float
    """Bytes of the gradient-carrying tensor (sent forward, and its gradient sent back)."""
    tensor: str = ""
    """Which tensor (one edge per tensor and consuming block; cuts count a tensor once)."""


MTP_MODULE = "mtp"
"""The model's attribute holding the multi-token-prediction depths planner.trace.mtp builds (a
ModuleList: each depth's unit is ``mtp.<k>``)."""

_MTP_BLOCK = re.compile(rf"(^|.*\.\.){MTP_MODULE}\.\d+")


def is_mtp_depth_unit(key: str) -> bool:
    """Whether a unit of the trace is one MTP depth (the block builder closes the depths' block
    after the last)."""
    return re.fullmatch(rf"{MTP_MODULE}\.\d+", key) is not None


def is_mtp_block(name: str) -> bool:
    """Whether a block, by its name, holds the MTP depths (``model.norm..mtp.0``: the final norm
    and the depths, the last closing it)."""
    return _MTP_BLOCK.fullmatch(name) is not None


@dataclass
class BlockGraph:
    """Blocks in a topological order, and the activations between them."""

    blocks: list[Block]
    edges: list[BlockEdge]
    tp_roles: dict[str, str] = field(default_factory=dict)
    """Module FQN -> colwise / rowwise / vocab / replicate, for modules holding parameters."""
    tp_other_modules: dict[str, str] = field(default_factory=dict)
    """Module FQN -> class name of the traced modules ``tp_roles`` splits that are not of the
    class the role needs in an engine sharding torch.nn.Linear and torch.nn.Embedding only
    (planner's runtime: planner.runtime.parallelize.check_modules): a Hugging Face GPT-2's
    Conv1D (a Linear with its weight transposed). Layers traced once stand for their copies."""
    shared: list[list] = field(default_factory=list)
    """[first block, other block, numel, tp-split, frozen] for each parameter two blocks read
    (tied weights): a stage holding both keeps one copy."""

    def index(self) -> dict[str, int]:
        return {b.name: i for i, b in enumerate(self.blocks)}

    def to_dict(self) -> dict:
        """Plain data; blocks copied from one layer keep sharing one BlockWork (``works``)."""
        works, slot = [], {}
        for b in self.blocks:
            if id(b.work) not in slot:
                slot[id(b.work)] = len(works)
                works.append(b.work.to_dict())
        blocks = [{**{k: v for k, v in asdict(b).items() if k != "work"}, "work": slot[id(b.work)]}
                  for b in self.blocks]
        return {"works": works, "blocks": blocks, "edges": [asdict(e) for e in self.edges],
                "tp_roles": dict(self.tp_roles), "tp_other_modules": dict(self.tp_other_modules),
                "shared": [list(x) for x in self.shared]}

    @classmethod
    def from_dict(cls, d: dict) -> "BlockGraph":
        works = [BlockWork.from_dict(w) for w in d["works"]]
        blocks = [Block(**{**b, "work": works[b["work"]]}) for b in d["blocks"]]
        return cls(blocks=blocks, edges=[BlockEdge(**e) for e in d["edges"]],
                   tp_roles=dict(d["tp_roles"]),
                   tp_other_modules=dict(d.get("tp_other_modules", {})),
                   shared=[list(x) for x in d["shared"]])

    def to_nx(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(b.name for b in self.blocks)
        for e in self.edges:
            g.add_edge(e.src, e.dst, bytes=e.nbytes)
        return g

    def is_chain(self) -> bool:
        """True when every edge joins neighbours in the order (a simple chain)."""
        idx = self.index()
        return all(idx[e.dst] == idx[e.src] + 1 for e in self.edges)

    def cut_bytes(self, order: list[int] | None = None) -> list[float]:
        """Per-sample bytes crossing the cut after position i, for i in 0..n-2, with the blocks in
        their own order or in ``order`` (block indices; must be a topological order)."""
        idx = self.index()
        if order is not None:
            position = {self.blocks[b].name: i for i, b in enumerate(order)}
            idx = {name: position[name] for name in idx}
        n = len(self.blocks)
        last: dict[tuple[str, str], tuple[int, int, float]] = {}
        for e in self.edges:
            key = (e.src, e.tensor or e.dst)
            a, b = idx[e.src], idx[e.dst]
            if key not in last or b > last[key][1]:
                last[key] = (a, b, e.nbytes)
        diff = [0.0] * (n + 1)
        for a, b, nbytes in last.values():
            if b > a:
                diff[a] += nbytes
                diff[b] -= nbytes
        cuts, run = [], 0.0
        for i in range(n - 1):
            run += diff[i]
            cuts.append(run)
        return cuts


def through_views(name: str, by) -> str:
    """The op whose output ``name`` is, through views of views (``by``: ops by name)."""
    op = by[name]
    while op.kind == "view" and op.inputs:
        op = by[op.inputs[0]]
    return op.name


def consumers_through_views(name: str, by, cons) -> list[str]:
    """The ops reading ``name``'s output, through views of it (``cons``: OpGraph.consumers())."""
    out, stack = [], list(cons[name])
    while stack:
        c = stack.pop()
        if by[c].kind == "view":
            stack.extend(cons[c])
        else:
            out.append(c)
    return out


def unpriced_words(rows: list[dict], most: int = 4) -> str:
    """``aten._fft_r2c x1, ...``: the first ``most`` of OpGraph.unpriced_ops' rows (a plan's
    ``provenance.unpriced_ops``), as plan solve warns and plan show lists them."""
    return ", ".join(f"{u['op']} x{u['count']}" for u in rows[:most]) + (
        ", ..." if len(rows) > most else "")


FROZEN_PRICING = ("priced with their weights only (no gradients, optimizer states, gradient "
                  "traffic or update) and without their weight gradients; the backward runs "
                  "back only as far as the earliest layer that trains")
"""How plans price frozen parameters (plan solve says it, plan show repeats it)."""


def frozen_words(frozen: int, total: int) -> str:
    """``589,824 of its 267 M parameters train (0.221%); the other 266 M are frozen``: the
    trained count exact, since a rounded one reads as nothing trained (a new-user check)."""
    trained = total - frozen
    return (f"{trained:,} of its {human_count(total)} parameters train "
            f"({100 * trained / total:.3g}%); the other {human_count(frozen)} are frozen "
            "(requires_grad=False)")
