"""Embedding tables of recommendation models: what one shard of a table costs on the rank that holds
it, in time (lookup, update, the pooled-embedding exchange) and in bytes (device and host memory).

The sharding types are TorchRec's (``torchrec.distributed.types.ShardingType``):

- ``data_parallel``: every rank holds the whole table, looks up its own samples and all-reduces the
  table's (dense) gradient;
- ``table_wise``: one rank holds the table and serves every sample of the global batch;
- ``column_wise``: the embedding dimension is cut into pieces, each piece table-wise on some rank;
- ``row_wise``: the rows are cut evenly over all ranks; each rank serves the ids that fall in its
  rows and the partial sums are reduce-scattered;
- ``table_row_wise``: row-wise over the ranks of one node, then an all-to-all across nodes;
- ``grid_shard``: column pieces, each table-row-wise over one node.

A shard lives in one memory tier: ``hbm`` (TorchRec's ``fused`` kernel), ``uvm_caching`` (the
table in host memory reached through unified memory, a ``cache_ratio`` of its rows cached in HBM:
``fused_uvm_caching``) or ``host`` (``fused_uvm``: every access crosses PCIe).

Costs are the bytes each step moves over the resource that carries them:

- lookups gather ``ids x dim x element`` bytes from the tier (forward), and the fused backward reads
  the output gradient and reads, updates and writes each touched row (twice the forward's row
  bytes) plus the optimizer's row state. Random row gathers reach ``GATHER_EFFICIENCY`` of the data
  sheet's HBM bandwidth; accesses through unified memory reach ``UVM_EFFICIENCY`` of the host link.
- a cached table serves the fraction ``coverage(cache_ratio, skew)`` of its lookups from HBM: the
  hottest fraction ``c`` of rows receives ``c ** (1 - skew)`` of the lookups (``skew`` 0: uniform
  access, the conservative default; a Zipf-like table has ``skew`` near 1).
- the pooled outputs cross the network once forward (all-to-all or reduce-scatter) and once
  backward (their gradients), each byte on the tier between the two ranks: ``(g - 1)/(W - 1)`` of
  a rank's traffic stays in its node of ``g`` GPUs, the rest crosses the inter-node tier.

Nothing here imports torch or the planner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from costmodels.errors import SpecError

SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise",
                  "grid_shard")
"""TorchRec's sharding types, by their ShardingType values."""

TIERS = {"hbm": "fused", "uvm_caching": "fused_uvm_caching", "host": "fused_uvm"}
"""Memory tier -> TorchRec/FBGEMM compute kernel (data-parallel tables run the ``dense`` kernel)."""

OPTIMIZERS = {"sgd": 0, "rowwise_adagrad": 1, "adagrad": -1, "adam": -2}
"""Optimizer state per row: 0 none, 1 one fp32 per row, -k k fp32 per element."""

GATHER_EFFICIENCY = 0.58
"""Fraction of the data sheet's HBM bandwidth that FBGEMM's table-batched embedding kernels reach on
random row gathers. Source: TorchRec's planner (torchrec/distributed/planner/constants.py,
``HBM_MEM_BW`` = 897 GB/s for its default device, the A100, whose data sheet gives 1,555 GB/s)."""

UVM_EFFICIENCY = 0.1
"""Fraction of the host link's bandwidth that row accesses through unified memory reach (rows are
fetched in small pieces, page by page). Source: TorchRec's planner, ``kernel_bw_lookup``: the
``fused_uvm`` kernel runs at ``HBM_TO_DDR_MEM_BW / 10``."""

OUTPUT_DTYPE_BYTES = 4
"""Pooled embeddings and their gradients travel in fp32 unless quantized communication is set."""

ID_BYTES = 8
"""Ids (int64) and their lengths travel in the input distribution."""


MAX_POOLING = 1e6
"""Ids per sample and feature a table's pooling stays below (a figure past it is a typo: a
sample of a million lookups in one feature)."""


@dataclass(frozen=True)
class Table:
    """One embedding table and how the model uses it."""

    name: str
    rows: int
    dim: int
    pooling: float = 1.0
    """Mean ids per sample per feature (1 for one-hot features)."""
    features: int = 1
    """Features that look up this table (each produces its own pooled output)."""
    skew: float = 0.0
    """Access skew in [0, 1): the hottest fraction c of the rows receives c ** (1 - skew) of the
    lookups; 0 = uniform."""
    element_bytes: int = 4
    """Bytes per stored element (4: fp32 weights, TorchRec's default; 2: fp16)."""
    pooled: bool = True
    """True for an EmbeddingBag (one pooled vector per sample and feature); False for a sequence
    embedding (one vector per id)."""
    feature_names: tuple = ()
    module: str = ""
    """The path in the model of the collection that holds the table (TorchRec's
    EmbeddingBagCollection, which the TorchRec export shards); '' where the table is a module of
    its own (an nn.EmbeddingBag) or the path is not known."""

    def __post_init__(self):
        for key in ("rows", "dim"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"tables.{self.name}.{key}: expected a positive integer, got {v!r}")
        if not (isinstance(self.pooling, (int, float)) and 0 < self.pooling < MAX_POOLING):
            raise SpecError(f"tables.{self.name}.pooling: expected a number of ids per sample "
                            f"above 0 and below {MAX_POOLING:,.0f}, got {self.pooling!r}")
        if not (isinstance(self.skew, (int, float)) and 0 <= self.skew < 1):
            raise SpecError(f"tables.{self.name}.skew: expected a number in [0, 1), got "
                            f"{self.skew!r}")
        if isinstance(self.features, bool) or not isinstance(self.features, int) or self.features < 1:
            raise SpecError(f"tables.{self.name}.features: expected a positive integer, got "
                            f"{self.features!r}")

    @property
    def bytes(self) -> float:
        return float(self.rows) * self.dim * self.element_bytes

    @property
    def ids_per_sample(self) -> float:
        return self.pooling * self.features

    def to_dict(self) -> dict:
        return {"name": self.name, "rows": self.rows, "dim": self.dim, "pooling": self.pooling,
                "features": self.features, "skew": self.skew, "element_bytes": self.element_bytes,
                "pooled": self.pooled, "feature_names": list(self.feature_names),
                **({"module": self.module} if self.module else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "Table":
        return cls(name=d["name"], rows=int(d["rows"]), dim=int(d["dim"]),
                   pooling=float(d.get("pooling", 1.0)), features=int(d.get("features", 1)),
                   skew=float(d.get("skew", 0.0)), element_bytes=int(d.get("element_bytes", 4)),
                   pooled=bool(d.get("pooled", True)),
                   feature_names=tuple(d.get("feature_names", ())),
                   module=str(d.get("module", "")))


def coverage(cache_ratio: float, skew: float) -> float:
    """Fraction of lookups served by the hottest ``cache_ratio`` of the rows."""
    if cache_ratio >= 1:
        return 1.0
    if cache_ratio <= 0:
        return 0.0
    return cache_ratio ** (1.0 - skew)


@dataclass(frozen=True)
class Shard:
    """One piece of a table on one rank: rows [row, row + rows) x columns [col, col + cols)."""

    rank: int
    row: int
    col: int
    rows: int
    cols: int


@dataclass(frozen=True)
class Layout:
    """How one table is sharded, and in which tier."""

    sharding: str
    shards: tuple
    """Shards (data-parallel: one full-table shard per rank)."""
    tier: str = "hbm"
    cache_ratio: float = 0.0
    """Rows cached in HBM, for ``uvm_caching``."""

    @property
    def ranks(self) -> tuple:
        return tuple(sorted({s.rank for s in self.shards}))

    @property
    def kernel(self) -> str:
        return "dense" if self.sharding == "data_parallel" else TIERS[self.tier]


@dataclass(frozen=True)
class RecEnv:
    """What the cost of a shard depends on besides the table: the ranks, the batch, the devices."""

    world: int
    gpus_per_node: int
    local_batch: int
    hbm_bytes_per_s: float
    """Data-sheet HBM bandwidth of one device."""
    host_link_bytes_per_s: float
    intra_bytes_per_s: float
    """Achievable bandwidth per GPU, one direction, inside a node (collectives)."""
    inter_bytes_per_s: float
    """... and to other nodes (a GPU's share of the NICs)."""
    intra_exchange_bytes_per_s: float | None = None
    """What the pooled embeddings' exchange reaches inside a node (their all-to-all, and a
    row-wise table's reduce-scatter counted with it: LinkSpec.alltoall_bytes_per_s, below the
    collectives' on NVLink); None: ``intra_bytes_per_s``."""
    inter_exchange_bytes_per_s: float | None = None
    """... and to other nodes; None: ``inter_bytes_per_s``."""
    intra_latency_s: float = 3e-6
    inter_latency_s: float = 10e-6
    optimizer: str = "sgd"
    comm_bytes: int = OUTPUT_DTYPE_BYTES
    """Bytes per element of the pooled embeddings on the wire."""

    @property
    def intra_exchange(self) -> float:
        """Bytes/s of the all-to-all inside a node."""
        return self.intra_bytes_per_s if self.intra_exchange_bytes_per_s is None \
            else self.intra_exchange_bytes_per_s

    @property
    def inter_exchange(self) -> float:
        """Bytes/s of the all-to-all to other nodes."""
        return self.inter_bytes_per_s if self.inter_exchange_bytes_per_s is None \
            else self.inter_exchange_bytes_per_s

    @property
    def global_batch(self) -> int:
        return self.world * self.local_batch

    @property
    def nodes(self) -> int:
        return max(1, self.world // self.gpus_per_node)

    def intra_share(self) -> float:
        """Fraction of an all-to-all's traffic that stays inside a node."""
        if self.world <= 1:
            return 1.0
        g = min(self.gpus_per_node, self.world)
        return (g - 1) / (self.world - 1)


@dataclass
class ShardCost:
    """What one table's layout puts on each rank (dicts keyed by rank)."""

    lookup_s: dict = field(default_factory=dict)
    """Forward lookup plus fused backward and update, seconds."""
    send_intra: dict = field(default_factory=dict)
    """Pooled-output bytes each rank sends forward to ranks of its own node (and receives back as
    gradients backward)."""
    send_inter: dict = field(default_factory=dict)
    """... and to ranks of other nodes."""
    recv_saved: dict = field(default_factory=dict)
    """Bytes a rank does NOT receive because it holds the shard itself."""
    hbm_bytes: dict = field(default_factory=dict)
    host_bytes: dict = field(default_factory=dict)
    allreduce_bytes: float = 0.0
    """Gradient bytes all-reduced over all ranks (data-parallel tables)."""
    recv_bytes_per_rank: float = 0.0
    """Pooled-output bytes every rank receives for its local batch if it held none of the table."""


def optimizer_row_bytes(optimizer: str, cols: int) -> float:
    if optimizer not in OPTIMIZERS:
        raise SpecError(f"optimizer: {optimizer!r} is not an embedding optimizer; choose from "
                        f"{', '.join(OPTIMIZERS)}")
    per = OPTIMIZERS[optimizer]
    return 4.0 * per if per >= 0 else 4.0 * -per * cols


def _rate(table: Table, layout: Layout, env: RecEnv) -> float:
    """Bytes per second the lookups of this tier reach (blend of HBM and host for caches)."""
    hbm = env.hbm_bytes_per_s * GATHER_EFFICIENCY
    uvm = env.host_link_bytes_per_s * UVM_EFFICIENCY
    if layout.tier == "hbm":
        return hbm
    hit = coverage(layout.cache_ratio, table.skew) if layout.tier == "uvm_caching" else 0.0
    return 1.0 / (hit / hbm + (1.0 - hit) / uvm)


def price(table: Table, layout: Layout, env: RecEnv) -> ShardCost:
    """Time and bytes per rank of one table under one layout."""
    c = ShardCost()
    e, a = table.element_bytes, env.comm_bytes
    share = env.intra_share()
    rate = _rate(table, layout, env)
    ids_global = env.global_batch * table.ids_per_sample
    out_rows = table.features if table.pooled else table.ids_per_sample
    c.recv_bytes_per_rank = (env.local_batch * out_rows * table.dim * a
                             if layout.sharding != "data_parallel" else 0.0)
    for s in layout.shards:
        frac_rows = s.rows / table.rows
        if layout.sharding == "data_parallel":
            ids = env.local_batch * table.ids_per_sample
        else:
            ids = ids_global * frac_rows  # every id of the global batch that falls in these rows
        samples = env.local_batch if layout.sharding == "data_parallel" else env.global_batch
        outputs = samples * out_rows * s.cols * e
        row_bytes = ids * s.cols * e
        st = ids * optimizer_row_bytes(env.optimizer, s.cols)
        # forward: gather rows, write outputs; backward: read output grads, read+write rows, state
        c.lookup_s[s.rank] = c.lookup_s.get(s.rank, 0.0) + (
            (row_bytes + outputs) + (outputs + 2 * row_bytes + 2 * st)) / rate
        weights = s.rows * s.cols * e
        opt_state = s.rows * optimizer_row_bytes(env.optimizer, s.cols)
        if layout.sharding == "data_parallel":
            # the dense kernel's gradient is a full dense tensor; the optimizer is the dense one
            hbm, host = 2 * weights + opt_state, 0.0
        elif layout.tier == "hbm":
            hbm, host = weights + opt_state, 0.0
        elif layout.tier == "uvm_caching":
            hbm, host = layout.cache_ratio * (weights + opt_state), weights + opt_state
        else:
            hbm, host = 0.0, weights + opt_state
        c.hbm_bytes[s.rank] = c.hbm_bytes.get(s.rank, 0.0) + hbm
        c.host_bytes[s.rank] = c.host_bytes.get(s.rank, 0.0) + host
        if layout.sharding == "data_parallel":
            continue
        # pooled outputs of the global batch leave this rank, except its own local batch's
        full = env.global_batch * out_rows * s.cols * a  # this shard's outputs, whole batch
        group = len({x.rank for x in layout.shards if x.col == s.col})
        if layout.sharding in ("table_wise", "column_wise") or group == env.world:
            # to every other rank its local batch's share: an all-to-all (row-wise over all
            # ranks: a reduce-scatter of partial sums, the same bytes)
            send = full * (env.world - 1) / env.world
            intra, inter = send * share, send * (1 - share)
            if group == 1:
                c.recv_saved[s.rank] = c.recv_saved.get(s.rank, 0.0) + \
                    env.local_batch * out_rows * s.cols * a
        else:  # row-wise inside one node: reduce-scatter there, then the node's share travels
            intra = full * (group - 1) / group
            inter = full / group * (env.world - group) / env.world
        c.send_intra[s.rank] = c.send_intra.get(s.rank, 0.0) + intra
        c.send_inter[s.rank] = c.send_inter.get(s.rank, 0.0) + inter
    if layout.sharding == "data_parallel":
        c.allreduce_bytes = table.bytes
    return c


def comm_s(send_intra: float, send_inter: float, recv_bytes: float, env: RecEnv,
           messages: int = 1) -> float:
    """Forward plus backward exchange of one rank: each tier carries the larger of what the rank
    sends and receives on it (full duplex), both tiers at once, the slower deciding; received bytes
    come evenly from all other ranks."""
    if env.world <= 1:
        return 0.0
    share = env.intra_share()
    intra = env.intra_latency_s * messages + \
        max(send_intra, recv_bytes * share) / env.intra_exchange
    inter = 0.0
    if env.world > env.gpus_per_node:
        inter = env.inter_latency_s * messages + \
            max(send_inter, recv_bytes * (1 - share)) / env.inter_exchange
    return 2.0 * max(intra, inter)


def allreduce_s(nbytes: float, env: RecEnv) -> float:
    """Ring all-reduce over all ranks (hierarchical across nodes, both tiers at once as
    costmodels.comm.allreduce_s: the slower tier's transfer and both latencies), seconds."""
    w, g = env.world, min(env.gpus_per_node, env.world)
    if w <= 1 or nbytes <= 0:
        return 0.0
    intra = 2 * (g - 1) / g * nbytes / env.intra_bytes_per_s
    intra_latency = 2 * (g - 1) * env.intra_latency_s
    if w <= g:
        return intra + intra_latency
    n = w // g
    inter = 2 * (n - 1) / n * nbytes / g / env.inter_bytes_per_s
    return max(intra, inter) + intra_latency + 2 * (n - 1) * env.inter_latency_s


def input_dist_bytes(tables, env: RecEnv) -> float:
    """Ids and lengths one rank sends in the input distribution (its local batch's ids for the
    tables other ranks hold)."""
    per_sample = sum(t.ids_per_sample * ID_BYTES + t.features * ID_BYTES for t in tables)
    return env.local_batch * per_sample * (env.world - 1) / max(env.world, 1)


def even_rows(rows: int, parts: int) -> list:
    """TorchRec's row-wise split: blocks of ceil(rows / parts), the last shorter (or empty)."""
    block = math.ceil(rows / parts)
    out = []
    for i in range(parts):
        lo = min(rows, i * block)
        out.append((lo, min(rows, lo + block) - lo))
    return out


def column_pieces(dim: int, pieces: int) -> list:
    """Equal column pieces (dim must divide)."""
    w = dim // pieces
    return [(i * w, w) for i in range(pieces)]


@dataclass(frozen=True)
class RecModel:
    """What the planner knows of a recommendation model: its tables and its dense part."""

    name: str
    tables: tuple
    """Table, one per table."""
    dense_params: int
    dense_flops_per_sample: float
    """Forward FLOPs of everything but the table lookups, per sample."""
    dense_act_bytes_per_sample: float
    """Activations the dense part keeps for its backward, per sample."""
    dense_ops: int = 0
    """ATen ops the dense forward runs (kernels launched per step scale with it)."""

    @property
    def table_bytes(self) -> float:
        return sum(t.bytes for t in self.tables)

    def to_dict(self) -> dict:
        return {"name": self.name, "tables": [t.to_dict() for t in self.tables],
                "dense_params": self.dense_params,
                "dense_flops_per_sample": self.dense_flops_per_sample,
                "dense_act_bytes_per_sample": self.dense_act_bytes_per_sample,
                "dense_ops": self.dense_ops}

    @classmethod
    def from_dict(cls, d: dict) -> "RecModel":
        return cls(name=d["name"], tables=tuple(Table.from_dict(t) for t in d["tables"]),
                   dense_params=int(d["dense_params"]),
                   dense_flops_per_sample=float(d["dense_flops_per_sample"]),
                   dense_act_bytes_per_sample=float(d["dense_act_bytes_per_sample"]),
                   dense_ops=int(d.get("dense_ops", 0)))
