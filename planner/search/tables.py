"""Recommendation models: the layouts each embedding table may take, their costs on this cluster,
the placement (planner.solve.table_placement) and the step time of the whole model.

The dense part (MLPs, interaction) is data-parallel on every rank: DistributedDataParallel (as
TorchRec's DistributedModelParallel wraps it) or FSDP2, as the dense search prices it op by op
(planner.search.dense_part); a module whose dense part cannot be run apart from its tables is
priced from its FLOP count, data-parallel (``dense_times``). The tables are sharded. One step:

    host-bound:   host_op_s x (ops the step issues)
    device-bound: sparse_r (lookups + pooled-embedding exchange, forward and backward, on the
                  busiest rank r) + dense (forward and backward) + exposed gradient all-reduce
                  + exposed input distribution
    step = max(host-bound, device-bound)

Pipelines (``pipeline``): ``sparse-dist`` (TorchRec's TrainPipelineSparseDist: the ids of the next
batch are distributed while this one computes, so the input distribution hides behind the step);
``nested`` (NestPipe-style: the embedding exchange of the next batch also runs behind this batch's
dense compute: each rank's lookups, then the longer of its exchange and the dense part; the
lookups share the GPU with the dense kernels and are not hidden); ``none`` (everything in
sequence).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from costmodels import comm as collectives
from costmodels import embeddings as emb
from costmodels.embeddings import Layout, RecEnv, RecModel, Shard, Table
from costmodels.engine import EngineSpec
from costmodels.topology import Cluster
from planner.errors import InfeasibleError, SpecError
from planner.options import PIPELINES
from planner.search.dense_part import DensePart
from planner.solve.table_placement import Load, Option, Problem, place
from planner.units import gb


CACHE_RATIOS = (0.1, 0.5)
"""Cache sizes offered to tables that live in host memory (fraction of rows in HBM)."""

HBM_RESERVE = 0.10
"""Device memory kept free for the allocator, NCCL and kernels' workspaces (fraction)."""

HOST_BYTES_PER_GPU = 125e9
"""Host memory per GPU the tables may use when the cluster does not say: a DGX A100 has 1 TB for
8 GPUs (NVIDIA DGX A100 data sheet; AWS p4d.24xlarge: 1,152 GiB)."""


HOST_OPS_COMMON = 81
HOST_OPS_SHARDED = (95, 6)
HOST_OPS_DATA_PARALLEL = (39, 13)
"""ATen ops one training step issues beyond the dense part's forward and backward (TorchRec's input
and output distribution, the fused table kernels and optimizer, the loss, the dense optimizer):
81, plus for each sharding type in the plan its own exchange, 95 ops and 6 per feature (table-,
column-, row-wise ...), or 39 and 13 per feature for data-parallel tables (plain kernels, their
gradients reduced with the dense part's). Measured by benchmarks/torchrec_host_ops.py (TorchRec
1.8.0, DistributedModelParallel, 2 gloo ranks): table-wise or column-wise alone 176 + 6 per feature
(8, 26 and 64 tables), data-parallel alone 120 + 13 per feature, 13 table-wise + 13 data-parallel
tables 462 (the sum gives 462), 13 table- + 13 column-wise 410 (427), a third each 500 (522). Each
op costs the host ``EngineSpec.host_op_s``; the device waits for the host where TorchRec
synchronizes (the input distribution's lengths), so a step takes at least the host's time."""


def host_ops(model: RecModel, layouts: list) -> int:
    """Ops one step issues: the dense part's forward and backward, and the sparse path's."""
    ops = 3 * model.dense_ops + HOST_OPS_COMMON
    features: dict = {}
    for t, lay in zip(model.tables, layouts):
        features[lay.sharding] = features.get(lay.sharding, 0) + t.features
    for kind, n in features.items():
        base, per = HOST_OPS_DATA_PARALLEL if kind == "data_parallel" else HOST_OPS_SHARDED
        ops += base + per * n
    return ops


@dataclass(frozen=True)
class RecOptions:
    pipeline: str = "sparse-dist"
    optimizer: str = "sgd"
    fix_sharding: str | None = None
    """Pin every table to one sharding type (``table_wise``, ``row_wise``, ...)."""
    fixed: tuple = ()
    """Pinned layouts: ((table name, sharding type, tier or None: any), ...)."""
    tiers: tuple = ("hbm", "uvm_caching", "host")
    time_limit_s: float = 10.0
    comm_bytes: int = emb.OUTPUT_DTYPE_BYTES

    def __post_init__(self):
        if self.pipeline not in PIPELINES:
            raise SpecError(f"pipeline: expected one of {', '.join(PIPELINES)}, got "
                            f"{self.pipeline!r}")
        if self.optimizer not in emb.OPTIMIZERS:
            raise SpecError(f"table_optimizer: expected one of {', '.join(emb.OPTIMIZERS)} for "
                            f"embedding tables, got {self.optimizer!r}")
        if self.fix_sharding is not None and self.fix_sharding not in emb.SHARDING_TYPES:
            raise SpecError(f"sharding: expected one of {', '.join(emb.SHARDING_TYPES)}, got "
                            f"{self.fix_sharding!r}")
        for t in self.tiers:
            if t not in emb.TIERS:
                raise SpecError(f"tiers: expected some of {', '.join(emb.TIERS)}, got {t!r}")


@dataclass
class TablePlan:
    """The tables' layouts and what the step costs."""

    layouts: list
    """Layout per table (in the model's order)."""
    per_rank: list
    """Dict per rank: time_s, sparse_s, lookup_s, comm_s, hbm_bytes, host_bytes, tables."""
    step_s: float
    breakdown: dict
    solver: dict
    env: RecEnv
    dense_memory_bytes: float
    table_costs: list = field(default_factory=list)
    dense: DensePart | None = None
    """How the dense part runs, as the dense search planned it (None: priced from its FLOP count,
    data-parallel: ``dense_times``)."""


def environment(cluster: Cluster, local_batch: int, optimizer: str,
                comm_bytes: int = emb.OUTPUT_DTYPE_BYTES) -> RecEnv:
    dev = cluster.device
    return RecEnv(world=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                  local_batch=local_batch, hbm_bytes_per_s=dev.hbm_bytes_per_s,
                  host_link_bytes_per_s=dev.host_link_bytes_per_s,
                  intra_bytes_per_s=cluster.intra_node.effective_bytes_per_s,
                  inter_bytes_per_s=cluster.inter_node.effective_bytes_per_s,
                  intra_exchange_bytes_per_s=cluster.intra_node.alltoall_bytes_per_s,
                  inter_exchange_bytes_per_s=cluster.inter_node.alltoall_bytes_per_s,
                  intra_latency_s=cluster.intra_node.latency_s,
                  inter_latency_s=cluster.inter_node.latency_s,
                  optimizer=optimizer, comm_bytes=comm_bytes)


def layouts(table: Table, env: RecEnv, opts: RecOptions, big: float,
            replica_cap: float = float("inf")) -> list:
    """The layouts offered to ``table``, with movable pieces on rank -1 (the solver places them).
    ``big``: bytes above which a table is also offered column-wise (a table that alone would
    unbalance the ranks); ``replica_cap``: the bytes of one GPU the tables may take, which a
    data-parallel copy (its weights, their dense gradient and the optimizer state) must fit.
    Until 2026-12-07 only tables up to 64 MiB were offered data-parallel: a review found
    two-tower's 268 MB tables 17% faster so, under the planner's own model, than the plan it
    called optimal."""
    W, g = env.world, min(env.gpus_per_node, env.world)
    out = []
    pinned = {name: (s, t) for name, s, t in opts.fixed}.get(table.name)
    kinds = [pinned[0]] if pinned else ([opts.fix_sharding] if opts.fix_sharding else
                                         list(emb.SHARDING_TYPES))
    tiers = [pinned[1]] if pinned and pinned[1] else list(opts.tiers)  # (None: any tier)
    for tier in tiers:
        ratios = CACHE_RATIOS if tier == "uvm_caching" else (0.0,)
        for ratio in ratios:
            for kind in kinds:
                for shards in _shardings(kind, table, W, g, big,
                                         forced=bool(pinned or opts.fix_sharding),
                                         replica_cap=replica_cap, optimizer=opts.optimizer):
                    if kind == "data_parallel" and tier != "hbm":
                        continue
                    out.append(Layout(kind, tuple(shards), tier, ratio))
    return out


FBGEMM_COLUMNS = 4
"""The columns a sharded table's every piece is a multiple of: FBGEMM's table-batched kernels,
which TorchRec's sharded tables run on, assert it (TorchRec's sharding: "local_cols ... not
divisible by 4"; a new user's dim-6 table planned table-wise crashed at plan run). Data-parallel
tables run as plain embedding bags, whatever their width."""


def _shardings(kind: str, t: Table, W: int, g: int, big: float, forced: bool,
               replica_cap: float = float("inf"), optimizer: str = "sgd"):
    """Shard lists of one sharding type; rank -1 marks a movable piece."""
    if kind == "data_parallel":
        replica = 2 * t.bytes + t.rows * emb.optimizer_row_bytes(optimizer, t.dim)
        if replica <= replica_cap or forced:
            yield [Shard(r, 0, 0, t.rows, t.dim) for r in range(W)]
    elif t.dim % FBGEMM_COLUMNS or (kind in EBC_ONLY and not t.pooled):
        return
    elif kind == "table_wise":
        yield [Shard(-1, 0, 0, t.rows, t.dim)]
    elif kind == "column_wise":
        if (t.bytes >= big or forced) and W > 1:
            for k in (2, 4, 8):
                if k <= W and _pieces(t.dim, k):
                    yield [Shard(-1, 0, c, t.rows, w) for c, w in emb.column_pieces(t.dim, k)]
    elif kind == "row_wise":  # fewer rows than ranks: the last shards are empty, as TorchRec's
        if W > 1:
            yield [Shard(r, lo, 0, n, t.dim) for r, (lo, n) in enumerate(emb.even_rows(t.rows, W))]
    elif kind == "table_row_wise":
        if W > g:
            for node in range(W // g):
                yield [Shard(node * g + i, lo, 0, n, t.dim)
                       for i, (lo, n) in enumerate(emb.even_rows(t.rows, g))]
    elif kind == "grid_shard":
        if W > g and t.rows >= g and (t.bytes >= big or forced):
            for k in (2, 4):
                if k <= W // g and _pieces(t.dim, k):
                    # each column piece row-wise over one node; nodes k apart, pieces in order
                    for first in range(0, W // g - k + 1):
                        yield [Shard((first + p) * g + i, lo, c, n, w)
                               for p, (c, w) in enumerate(emb.column_pieces(t.dim, k))
                               for i, (lo, n) in enumerate(emb.even_rows(t.rows, g))]


def _pieces(dim: int, k: int) -> bool:
    """Whether ``dim`` columns cut into ``k`` equal pieces of 32 columns or more, each a multiple
    of FBGEMM_COLUMNS."""
    return dim % k == 0 and dim // k >= 32 and (dim // k) % FBGEMM_COLUMNS == 0


EBC_ONLY = ("table_row_wise", "grid_shard")
"""Sharding types TorchRec's EmbeddingBagCollectionSharder offers and its
EmbeddingCollectionSharder does not (torchrec/distributed/embedding.py, 1.8.0: data_parallel,
table_wise, column_wise and row_wise only): not offered to a sequence table."""


def _why_not(kind: str, t: Table, W: int, gpus_per_node: int) -> str:
    """Why ``_shardings`` offers no layout of ``kind`` (for the error a pin gets, and where a
    table has no layout at all)."""
    pin = f"sharding.{t.name}="  # (this table alone; sharding= pins every table)
    if kind in EBC_ONLY and not t.pooled:
        return ("it is a sequence table (an EmbeddingCollection's), which TorchRec shards "
                f"data_parallel, table_wise, column_wise or row_wise only; pin {pin}row_wise "
                "or another of those")
    if kind != "data_parallel" and t.dim % FBGEMM_COLUMNS:
        wider = -(-t.dim // FBGEMM_COLUMNS) * FBGEMM_COLUMNS
        return (f"its {t.dim} columns are not a multiple of {FBGEMM_COLUMNS}, which FBGEMM's "
                f"kernels under TorchRec's sharded tables need; widen it to {wider} columns, or "
                f"pin {pin}data_parallel (a copy on every GPU)")
    if kind in ("table_row_wise", "grid_shard") and W <= gpus_per_node:
        return (f"{kind} shards rows inside each node and needs more than one node (this "
                f"cluster is one node of {W} GPUs); pin {pin}row_wise instead")
    if kind in ("row_wise", "column_wise") and W == 1:
        return f"{kind} needs more than one GPU"
    if kind in ("column_wise", "grid_shard"):
        return (f"its {t.dim} columns do not cut into 2, 4 or 8 pieces of 32 columns or more, "
                f"each a multiple of {FBGEMM_COLUMNS} (on the ranks or nodes there are); pin "
                f"{pin}table_wise or row_wise")
    return f"pin {pin}<another sharding type>"


def _load(cost: emb.ShardCost, rank: int, env: RecEnv) -> Load:
    """One rank's share of a layout's cost, in the solver's resources (seconds, bytes)."""
    share = env.intra_share()
    two = 2.0  # forward and backward exchange
    saved = cost.recv_saved.get(rank, 0.0)
    return Load(time=cost.lookup_s.get(rank, 0.0),
                si=two * cost.send_intra.get(rank, 0.0) / env.intra_exchange,
                sx=two * cost.send_inter.get(rank, 0.0) / env.inter_exchange,
                ri=two * saved * share / env.intra_exchange,
                rx=two * saved * (1 - share) / env.inter_exchange,
                hbm=cost.hbm_bytes.get(rank, 0.0), host=cost.host_bytes.get(rank, 0.0))


def option(table: Table, layout: Layout, env: RecEnv, host_op_s: float = 0.0) -> Option:
    """A layout as the solver sees it: loads on named ranks, and movable pieces; ``host_op_s``
    prices the ops its features add to the host's step."""
    per = (HOST_OPS_DATA_PARALLEL if layout.sharding == "data_parallel" else HOST_OPS_SHARDED)[1]
    host_s = host_op_s * per * table.features
    movable = [s for s in layout.shards if s.rank < 0]
    if movable:  # price each piece as if on rank 0; the solver moves it
        fixed_layout = Layout(layout.sharding, tuple(Shard(0, s.row, s.col, s.rows, s.cols)
                                                     for s in movable), layout.tier,
                              layout.cache_ratio)
        pieces = []
        for s in fixed_layout.shards:
            one = emb.price(table, Layout(layout.sharding, (s,), layout.tier, layout.cache_ratio),
                            env)
            pieces.append(_load(one, 0, env))
        return Option(label=_label(layout), pieces=pieces, group=layout.sharding, host_s=host_s)
    cost = emb.price(table, layout, env)
    fixed = {r: _load(cost, r, env) for r in layout.ranks}
    return Option(label=_label(layout), fixed=fixed,
                  global_s=emb.allreduce_s(cost.allreduce_bytes, env), group=layout.sharding,
                  host_s=host_s)


def _label(layout: Layout) -> str:
    tier = layout.tier + (f"@{layout.cache_ratio:g}" if layout.tier == "uvm_caching" else "")
    return f"{layout.sharding}/{tier}/{len(layout.shards)}"


def dense_times(model: RecModel, cluster: Cluster, env: RecEnv, dtype: str,
                engine: EngineSpec) -> dict:
    """Seconds of the dense part on one rank, and its gradient all-reduce."""
    dev = cluster.device
    rate = dev.peak(dtype) * dev.matmul_efficiency
    fwd = model.dense_flops_per_sample * env.local_batch / rate
    bwd = 2 * fwd
    grad_bytes = model.dense_params * 4
    ar = emb.allreduce_s(grad_bytes, env)
    exposed = collectives.beside_compute_s(ar, bwd, dev.overlap_slowdown) \
        if engine.overlap_grad_reduce else ar
    return {"fwd_s": fwd, "bwd_s": bwd, "allreduce_s": ar, "allreduce_exposed_s": exposed}


def dense_memory(model: RecModel, env: RecEnv, dense_optimizer_state: int = 2) -> float:
    """Bytes of the dense part on one rank: fp32 weights, gradients and optimizer state (Adagrad or
    Adam: 1-2 fp32 per parameter; SGD: none), and its saved activations."""
    states = 4 * model.dense_params * (2 + dense_optimizer_state)
    return states + model.dense_act_bytes_per_sample * env.local_batch


def plan_tables(model: RecModel, cluster: Cluster, *, global_batch: int, dtype: str = "fp32",
                engine: EngineSpec | None = None, opts: RecOptions | None = None,
                solve_time_limit_s: float | None = None,
                dense: tuple[DensePart, ...] = ()) -> TablePlan:
    """Shard ``model``'s tables on ``cluster`` for ``global_batch`` and price the step.
    ``dense``: ways to run the dense part (planner.search.dense_part.dense_options: DDP, then
    FSDP2 if leaner); the first that leaves the tables room is taken. Empty: the dense part is priced
    from its FLOP count, data-parallel."""
    if global_batch % cluster.num_gpus:
        raise SpecError(f"global_batch: {global_batch} does not divide over {cluster.num_gpus} "
                        f"GPUs; give a multiple of {cluster.num_gpus}")
    for i, part in enumerate(dense):
        try:
            return _plan_tables(model, cluster, global_batch, dtype, engine, opts,
                                solve_time_limit_s, part)
        except InfeasibleError as e:
            if e.reason != "out of memory" or i == len(dense) - 1:
                raise
    return _plan_tables(model, cluster, global_batch, dtype, engine, opts, solve_time_limit_s,
                        None)


def _plan_tables(model, cluster, global_batch, dtype, engine, opts, solve_time_limit_s,
                 part: DensePart | None) -> TablePlan:
    engine = engine or EngineSpec()
    opts = opts or RecOptions()
    W = cluster.num_gpus
    env = environment(cluster, global_batch // W, opts.optimizer, opts.comm_bytes)
    dense_mem = _dense_mem(model, env, opts, part)
    cap = cluster.device.memory_bytes * (1 - HBM_RESERVE) - dense_mem
    if cap <= 0:
        raise InfeasibleError(f"the dense part alone needs {dense_mem / 1e9:.1f} GB per GPU at "
                              f"local batch {env.local_batch}, more than "
                              f"{gb(cluster.device.memory_bytes)}; use a smaller batch",
                              reason="out of memory")
    names = {t.name for t in model.tables}
    for name, _, _ in opts.fixed:
        if name not in names:
            listed = sorted(names)
            raise SpecError(f"fix.sharding.{name}: not a table of the model (its tables: "
                            f"{', '.join(listed[:8])}{', ...' if len(listed) > 8 else ''})")
    big = model.table_bytes / W
    held = [t.bytes + t.rows * emb.optimizer_row_bytes(opts.optimizer, t.dim)
            for t in model.tables]  # each table with its optimizer state
    # (a sharding pinned for every table that keeps each whole on one rank: the largest must fit
    # one GPU, else the slower tiers hold it; a new user's pin was refused as not fitting)
    whole = opts.fix_sharding == "table_wise" and max(held, default=0.0) > 0.8 * cap
    if sum(held) <= 0.8 * cap * W and not whole and not any(t for _, _, t in opts.fixed
                                                            if t != "hbm"):
        opts = dataclasses.replace(opts, tiers=("hbm",))  # all fits in HBM: no slower tier helps
    options, layouts_per_table = [], []
    for t in model.tables:
        lays = layouts(t, env, opts, big, replica_cap=cap)
        if not lays:
            pinned = {n: s for n, s, _ in opts.fixed}.get(t.name) or opts.fix_sharding
            if pinned is None:  # (unpinned: too large for a copy on every GPU, too odd to shard)
                raise SpecError(f"table {t.name}: no layout on {W} GPUs ({t.rows} rows, dim "
                                f"{t.dim}): {_why_not('table_wise', t, W, env.gpus_per_node)}")
            raise SpecError(f"table {t.name}: no {pinned} layout on {W} GPUs ({t.rows} rows, dim "
                            f"{t.dim}): {_why_not(pinned, t, W, env.gpus_per_node)}")
        layouts_per_table.append(lays)
        options.append([option(t, lay, env, engine.host_op_s) for lay in lays])
    recv = sum(emb.price(t, Layout("table_wise", (Shard(0, 0, 0, t.rows, t.dim),)), env)
               .recv_bytes_per_rank for t in model.tables)
    share = env.intra_share()
    problem = Problem(world=W, gpus_per_node=min(cluster.gpus_per_node, W), hbm_cap=[cap] * W,
                      host_cap=HOST_BYTES_PER_GPU * min(cluster.gpus_per_node, W),
                      recv_intra_s=2 * recv * (W - 1) / W * share / env.intra_exchange
                      if W > 1 else 0.0,
                      recv_inter_s=2 * recv * (W - 1) / W * (1 - share) / env.inter_exchange
                      if W > cluster.gpus_per_node else 0.0,
                      options=options,
                      group_s={kind: engine.host_op_s * (HOST_OPS_DATA_PARALLEL[0]
                                                         if kind == "data_parallel"
                                                         else HOST_OPS_SHARDED[0])
                               for kind in emb.SHARDING_TYPES},
                      host_base_s=engine.host_op_s * (3 * model.dense_ops + HOST_OPS_COMMON),
                      dense_s=(part.device_s if part is not None
                               else _dense_device_s(model, cluster, env, dtype, engine)),
                      dense_compute_s=(part.compute_s if part is not None
                                       else _dense_compute_s(model, cluster, env, dtype, engine)),
                      comm_latency_s=exchange_latency_s(cluster, W),
                      overlap_dense=opts.pipeline == "nested")
    t0 = time.perf_counter()
    limit = opts.time_limit_s if solve_time_limit_s is None else solve_time_limit_s
    placed = place(problem, time_limit_s=limit)
    wall = time.perf_counter() - t0
    if placed is None:
        need = model.table_bytes / 1e9
        if opts.fix_sharding == "data_parallel":  # every GPU holds every table, in HBM
            raise InfeasibleError(
                f"sharding=data_parallel copies every table onto every GPU: {sum(held) / 1e9:.1f}"
                f" GB with the optimizer state, more than the {cap / 1e9:.1f} GB each GPU has "
                "free after the dense part (more GPUs do not help); pin another sharding or leave "
                "sharding out", reason="out of memory")
        raise InfeasibleError(f"the tables ({need:.1f} GB) do not fit in {W} GPUs' memory "
                              f"({cap * W / 1e9:.1f} GB free after the dense part) nor in the "
                              "hosts' memory; add GPUs",
                              reason="out of memory")
    chosen = []
    for t, lays, o, ranks in zip(model.tables, layouts_per_table, placed.choice, placed.ranks):
        lay = lays[o]
        shards, it = [], iter(ranks)
        for s in lay.shards:
            shards.append(Shard(next(it), s.row, s.col, s.rows, s.cols) if s.rank < 0 else s)
        lay = Layout(lay.sharding, tuple(shards), lay.tier, lay.cache_ratio)
        pinned = opts.fix_sharding or t.name in {n for n, _, _ in opts.fixed}
        chosen.append(lay if pinned else _whole_where_stacked(lay, t))
    return _price_plan(model, cluster, env, chosen, dtype, engine, opts, placed, wall,
                       dense_mem, part)


def _whole_where_stacked(lay: Layout, t: Table) -> Layout:
    """A column-wise layout whose pieces the placement put on one rank is that table whole there
    (table-wise): the same lookups and exchange on that rank, one piece and one sharding group
    fewer for the host to run (a review saw ``CW x2, ranks 0``, which the solver's ties left)."""
    if lay.sharding != "column_wise" or len({s.rank for s in lay.shards}) != 1:
        return lay
    return Layout("table_wise", (Shard(lay.shards[0].rank, 0, 0, t.rows, t.dim),), lay.tier,
                  lay.cache_ratio)


def _dense_mem(model: RecModel, env: RecEnv, opts: RecOptions, part: DensePart | None) -> float:
    if part is not None:
        return part.memory_bytes
    return dense_memory(model, env, 0 if opts.optimizer == "sgd" else 1)


def _dense_compute_s(model: RecModel, cluster: Cluster, env: RecEnv, dtype: str,
                     engine: EngineSpec) -> float:
    """The dense forward and backward (FLOP-count pricing), which a nested pipeline's exchange
    runs beside."""
    dense = dense_times(model, cluster, env, dtype, engine)
    return dense["fwd_s"] + dense["bwd_s"]


def exchange_latency_s(cluster: Cluster, W: int) -> float:
    """The latency of a rank's embedding exchange, forward and backward: the intra-node link's,
    and the inter-node one's where the ranks span nodes."""
    if W <= 1:
        return 0.0
    return 2 * (cluster.intra_node.latency_s + (cluster.inter_node.latency_s
                                                if W > cluster.gpus_per_node else 0.0))


def _dense_device_s(model: RecModel, cluster: Cluster, env: RecEnv, dtype: str,
                    engine: EngineSpec) -> float:
    """The device's seconds besides the sparse part, as the placement weighs them."""
    dense = dense_times(model, cluster, env, dtype, engine)
    return dense["fwd_s"] + dense["bwd_s"] + dense["allreduce_exposed_s"]


def price_layouts(model: RecModel, cluster: Cluster, chosen: list, *, global_batch: int,
                  dtype: str = "fp32", engine: EngineSpec | None = None,
                  opts: RecOptions | None = None, dense: DensePart | None = None) -> TablePlan:
    """Price given layouts (another planner's, or a pinned plan) under this cost model."""
    engine = engine or EngineSpec()
    opts = opts or RecOptions()
    W = cluster.num_gpus
    env = environment(cluster, global_batch // W, opts.optimizer, opts.comm_bytes)
    return _price_plan(model, cluster, env, chosen, dtype, engine, opts, None, 0.0,
                       _dense_mem(model, env, opts, dense), dense)


def _price_plan(model, cluster, env, chosen, dtype, engine, opts, placed, wall,
                dense_mem, part: DensePart | None = None) -> TablePlan:
    W = env.world
    share = env.intra_share()
    loads = [Load() for _ in range(W)]
    dp_bytes = 0.0
    costs = []
    recv = 0.0
    for t, lay in zip(model.tables, chosen):
        c = emb.price(t, lay, env)
        costs.append(c)
        dp_bytes += c.allreduce_bytes
        recv += c.recv_bytes_per_rank
        for r in lay.ranks:
            loads[r].add(_load(c, r, env))
    recv_i = 2 * recv * (W - 1) / W * share / env.intra_exchange if W > 1 else 0.0
    recv_x = (2 * recv * (W - 1) / W * (1 - share) / env.inter_exchange
              if W > cluster.gpus_per_node else 0.0)
    lat = exchange_latency_s(cluster, W)
    per_rank = []
    for r, ld in enumerate(loads):
        comm = max(ld.si, recv_i - ld.ri, ld.sx, recv_x - ld.rx) + lat
        per_rank.append({"rank": r, "lookup_s": ld.time, "comm_s": comm,
                         "sparse_s": ld.time + comm, "hbm_bytes": ld.hbm + dense_mem,
                         "host_bytes": ld.host,
                         "tables": sum(1 for lay in chosen if r in lay.ranks)})
    sparse = max(p["sparse_s"] for p in per_rank)
    dp_tables = emb.allreduce_s(dp_bytes, env)
    slow = cluster.device.overlap_slowdown  # compute beside a hidden reduction
    optimizer = 0.0
    if part is None:
        dense = dense_times(model, cluster, env, dtype, engine)
        grads = dense["allreduce_s"] + dp_tables
        exposed = collectives.beside_compute_s(grads, dense["bwd_s"], slow) \
            if engine.overlap_grad_reduce else grads
        compute = dense["fwd_s"] + dense["bwd_s"]
    else:  # the dense search's part, its reduction sharing the backward with the tables'
        compute = part.compute_s
        grads = part.reduce_s + dp_tables
        if part.zero == 0:  # one DDP over the dense part and the data-parallel tables
            exposed = (collectives.beside_compute_s(grads, part.backward_s, slow)
                       if engine.overlap_grad_reduce else grads)
        else:  # FSDP2's traffic as the search priced it; the tables' all-reduce in what is left
            # (the dense reduction used reduce_s / (1 + s) of the backward: dp_traffic.window_use_s)
            left = max(0.0, part.backward_s - part.reduce_s / (1 + slow)) \
                if engine.overlap_grad_reduce else 0.0
            exposed = part.exposed_s + collectives.beside_compute_s(dp_tables, left, slow)
        optimizer = part.optimizer_s
    ids = emb.input_dist_bytes(model.tables, env)
    input_s = (emb.comm_s(ids * share, ids * (1 - share), ids, env) / 2) if W > 1 else 0.0
    if opts.pipeline == "nested":  # each rank's exchange behind the dense part, not its lookups
        device = max(p["lookup_s"] + max(p["comm_s"], compute) for p in per_rank) + exposed \
            + max(0.0, input_s - compute)
    elif opts.pipeline == "sparse-dist":
        device = sparse + compute + exposed + max(0.0, input_s - (sparse + compute))
    else:
        device = sparse + compute + exposed + input_s
    device += optimizer
    host = engine.host_op_s * host_ops(model, chosen)
    step = max(device, host)
    for p in per_rank:  # (as the step: nested hides the exchange behind the dense part)
        p["time_s"] = (p["lookup_s"] + max(p["comm_s"], compute) if opts.pipeline == "nested"
                       else p["sparse_s"] + compute) + exposed + optimizer
    breakdown = {"lookup_s": max(p["lookup_s"] for p in per_rank),
                 "embedding_comm_s": max(p["comm_s"] for p in per_rank),
                 "dense_compute_s": compute, "grad_allreduce_s": grads,
                 "grad_allreduce_exposed_s": exposed, "dense_optimizer_s": optimizer,
                 "input_dist_s": input_s,
                 "host_s": host, "device_s": device}
    solver = {"name": "cp-sat", "status": "priced", "gap": None, "time_s": wall}
    if placed is not None:
        solver = {"name": "cp-sat", "status": placed.status, "gap": placed.gap,
                  "objective_s": placed.objective_s, "bound_s": placed.bound_s,
                  "greedy_s": placed.greedy_s, "time_s": wall}
    if not math.isfinite(step):
        raise InfeasibleError("no finite step time for these tables", reason="no plan")
    return TablePlan(layouts=chosen, per_rank=per_rank, step_s=step, breakdown=breakdown,
                     solver=solver, env=env, dense_memory_bytes=dense_mem, table_costs=costs,
                     dense=part)

