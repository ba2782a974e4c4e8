"""Our embedding-table planner against TorchRec's own (torchrec.distributed.planner), on the same
model and topology, each plan priced under both cost models.

For each case (model, ranks) it runs

- TorchRec's ``EmbeddingShardingPlanner`` with ``EmbeddingBagCollectionSharder`` on the model's
  EmbeddingBagCollection, ``batch_size`` = the local batch, on a ``Topology`` that describes our
  cluster preset (``topology``: which numbers we set, and why);
- ours, ``planner.search.tables.plan_tables`` (CP-SAT, time limit ``--time-limit``);

then prices both plans under both models:

- ours: ``price_layouts`` (TorchRec's ``ParameterSharding``s converted to our ``Layout``s by
  ``to_layouts``); the slowest rank's sparse seconds (lookups and the pooled-embedding exchange,
  forward and backward) plus the data-parallel tables' gradient all-reduce: our solver's
  objective, and the part of the step that TorchRec's estimate covers; and the whole step (the
  larger of the device's time and the host's, whose ops grow with each sharding type a plan
  mixes);
- TorchRec's: its ``EmbeddingPerfEstimator`` (and ``EmbeddingStorageEstimator``) on
  ``ShardingOption``s of our layouts: our choices go in as ``ParameterConstraints``
  (``sharding_types=[ours]``, ``compute_kernels=[ours]``, the column-piece width as
  ``min_partition``, the cache ratio as ``CacheParams.load_factor``), TorchRec's own enumerator
  builds the one option each table then has, and the shards get our ranks
  (``ParameterConstraints`` cannot pin ranks, so they are set on the options' shards, as
  TorchRec's partitioner would). The slowest rank's cost is TorchRec's: fwd_compute + fwd_comms +
  bwd_compute + bwd_comms of the shards on each rank, summed per rank, the largest (its
  NoopPerfModel also adds prefetch_compute, which TorchRec estimates only for cached tables with
  cache statistics or a prefetch pipeline; shown as "+ prefetch" where non-zero).

Planning time is wall time (time.perf_counter) of ``plan_tables`` and of ``planner.plan`` (which
includes TorchRec's enumeration and estimates). No GPU is needed: TorchRec plans for
``compute_device="cuda"`` on the CPU (it only estimates).

Usage:  python benchmarks/torchrec_planner.py [--quick] [--markdown] [--time-limit S]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import logging
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

from tables import print_table  # noqa: E402

from costmodels import embeddings as emb  # noqa: E402
from costmodels.embeddings import Layout, Shard  # noqa: E402
from costmodels.topology import get_cluster  # noqa: E402
from planner.search import tables as tab  # noqa: E402

GLOBAL_BATCH = 65536
CLUSTER = "dgx-a100-40g"
CASES = [("dlrm-criteo-1tb", 8, (60.0,)), ("dlrm-criteo-1tb", 64, ()), ("dlrm-criteo-1tb", 512, ()),
         ("dlrm-dcnv2", 8, ()), ("synthetic-1000", 512, ())]
"""(model, ranks, further CP-SAT limits ours is also run with, beyond --time-limit)."""
QUICK = [("dlrm-criteo-1tb", 8, ()), ("synthetic-104", 16, ())]
TORCHREC_TIMEOUT_S = 600
"""TorchRec's own timeout_seconds: its proposal loop stops after this (its enumeration comes
first and is not limited). Only the 1,000-table case reaches it."""
SYNTH_BASE = "dlrm-criteo-1tb"

KERNEL_TIER = {"fused": "hbm", "fused_uvm_caching": "uvm_caching", "fused_uvm": "host"}
"""TorchRec compute kernel -> our tier (``dense`` -> data_parallel, always in HBM)."""


def _quiet():
    """TorchRec logs a page per plan and warns about the meta device; keep stdout for the table."""
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


# ---- the model on both sides ---------------------------------------------------------------------

def synthetic(n: int, base=None):
    """``n`` tables: table i has the rows of Criteo 1TB's table i mod 26 (dim 128, one-hot, as in
    dlrm-criteo-1tb), named t_cat_<i>; the dense part is dlrm-criteo-1tb's (its FLOPs, parameters
    and activations per sample). Returns (RecModel, meta EmbeddingBagCollection)."""
    import torch  # lazy: keeps --help fast
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from planner.inputs.zoo import RECSYS
    from planner.trace.recsys import rec_model

    base = base or rec_model(SYNTH_BASE)
    rows = RECSYS[SYNTH_BASE].rows
    dim = RECSYS[SYNTH_BASE].dim
    tables = tuple(emb.Table(name=f"t_cat_{i}", rows=rows[i % len(rows)], dim=dim,
                             feature_names=(f"cat_{i}",)) for i in range(n))
    model = dataclasses.replace(base, name=f"synthetic-{n}", tables=tables)
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                   feature_names=list(t.feature_names)) for t in tables],
        device=torch.device("meta"))
    return model, ebc


def load(name: str, cache: dict):
    """(RecModel, EBC on the meta device, embedding optimizer) of a zoo model or synthetic-<n>."""
    from planner.inputs.zoo import RECSYS
    from planner.trace.recsys import build, rec_model

    if name.startswith("synthetic-"):
        if SYNTH_BASE not in cache:
            cache[SYNTH_BASE] = rec_model(SYNTH_BASE)
        model, ebc = synthetic(int(name.split("-")[1]), cache[SYNTH_BASE])
        return model, ebc, RECSYS[SYNTH_BASE].optimizer
    entry = RECSYS[name]
    return rec_model(name), build(entry).sparse, entry.optimizer


def set_optimizer(ebc, optimizer: str) -> None:
    """Tell TorchRec's storage estimator the embedding optimizer (it reads the parameters'
    ``_optimizer_classes``): row-wise Adagrad keeps one fp32 per row; SGD nothing."""
    if optimizer == "sgd":
        return
    from torch.distributed.optim import _apply_optimizer_in_backward
    import torchrec.optim as trec_optim

    cls = {"rowwise_adagrad": trec_optim.RowWiseAdagrad, "adagrad": trec_optim.Adagrad,
           "adam": trec_optim.Adam}[optimizer]
    _apply_optimizer_in_backward(cls, ebc.parameters(), {"lr": 0.01})


# ---- TorchRec's view of the cluster ----------------------------------------------------------------

def topology(cluster, *, dense_bytes: float = 0.0):
    """TorchRec's Topology for our cluster preset, through its TopologyFactory, and what we set.

    - hbm_cap: the device's memory (A100 40 GB: 40,960 MiB, 42.9e9 bytes); ddr_cap: our
      HOST_BYTES_PER_GPU;
      ssd_cap 0 (no SSD tier on our side, so no key_value kernel);
    - intra_host_bw / inter_host_bw: our links' achievable one-way bandwidth per GPU (NVLink 3:
      300 GB/s x 0.77; HDR InfiniBand 25 GB/s x 0.90), in TorchRec's bytes per millisecond;
    - hbm_mem_bw: the data sheet's HBM bandwidth x our GATHER_EFFICIENCY (the rate random row
      gathers reach; TorchRec's default 897 GiB/s is the same idea); hbm_to_ddr_mem_bw: the host
      link (PCIe 4.0 x16, 25 GB/s; TorchRec divides it by 10 for UVM as we do);
    - local_world_size: GPUs per node; compute_device "cuda".
    """
    from torchrec.distributed.planner.types import (HardwareConfig, KernelConfig, TopologyFactory,
                                                    TrainerConfig)

    dev = cluster.device
    W, g = cluster.num_gpus, min(cluster.gpus_per_node, cluster.num_gpus)
    hw = dict(intra_host_bw=cluster.intra_node.effective_bytes_per_s / 1e3,
              inter_host_bw=cluster.inter_node.effective_bytes_per_s / 1e3,
              hbm_mem_bw=dev.hbm_bytes_per_s * emb.GATHER_EFFICIENCY / 1e3,
              hbm_to_ddr_mem_bw=dev.host_link_bytes_per_s / 1e3)
    trainer = dict(world_size=W, local_world_size=g, hbm_cap_bytes=int(dev.memory_bytes),
                   ddr_cap_bytes=int(tab.HOST_BYTES_PER_GPU), ssd_cap_bytes=0)
    topo = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(**trainer), hardware_config=HardwareConfig(**hw),
        kernel_config=KernelConfig(compute_device="cuda", use_hardware_based_bandwidth=True))
    return topo, {**trainer, **hw}


def storage_reservation(dense_bytes: float):
    """TorchRec's default reservation policy with our numbers: HBM_RESERVE of the device kept free
    and our dense part's bytes (weights, gradients, optimizer state, activations) as its dense
    estimate (its own heuristic, 6 x dense parameters, cannot see the activations on meta)."""
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    return HeuristicalStorageReservation(percentage=tab.HBM_RESERVE,
                                         dense_tensor_estimate=int(dense_bytes))


def base_constraints(model) -> dict:
    """What TorchRec cannot read off the module: ids per sample of each table's features."""
    from torchrec.distributed.planner.types import ParameterConstraints

    return {t.name: ParameterConstraints(pooling_factors=[float(t.pooling)] * t.features)
            for t in model.tables}


def sharder():
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return EmbeddingBagCollectionSharder()


# ---- conversions -------------------------------------------------------------------------------

def to_layouts(model, sharding_plan, world: int) -> list:
    """TorchRec's ShardingPlan (of an EmbeddingBagCollection) -> our Layout per table."""
    from torchrec.distributed.planner.constants import UVM_CACHING_RATIO

    params = {}
    for module_plan in sharding_plan.plan.values():
        params.update(module_plan)
    out = []
    for t in model.tables:
        ps = params[t.name]
        if ps.sharding_type == "data_parallel":
            ranks = ps.ranks if ps.ranks else list(range(world))
            out.append(Layout("data_parallel", tuple(Shard(r, 0, 0, t.rows, t.dim) for r in ranks),
                              "hbm", 0.0))
            continue
        tier = KERNEL_TIER[ps.compute_kernel]
        ratio = 0.0
        if tier == "uvm_caching":
            lf = ps.cache_params.load_factor if ps.cache_params is not None else None
            ratio = float(lf) if lf is not None else UVM_CACHING_RATIO
        # table_column_wise (column pieces on the ranks of one node) is column-wise to our model
        kind = "column_wise" if ps.sharding_type == "table_column_wise" else ps.sharding_type
        shards = tuple(Shard(int(r), int(m.shard_offsets[0]), int(m.shard_offsets[1]),
                             int(m.shard_sizes[0]), int(m.shard_sizes[1]))
                       for r, m in zip(ps.ranks, ps.sharding_spec.shards))
        out.append(Layout(kind, shards, tier, ratio))
    return out


def to_constraints(model, layouts, base: dict | None = None) -> dict:
    """Our layouts -> ParameterConstraints that leave TorchRec one option per table: our sharding
    type and kernel, our column-piece width, our cache ratio."""
    from torchrec.distributed.types import CacheParams

    base = base or base_constraints(model)
    out = {}
    for t, lay in zip(model.tables, layouts):
        extra = {}
        if lay.sharding in ("column_wise", "grid_shard"):
            extra["min_partition"] = lay.shards[0].cols
        if lay.tier == "uvm_caching":
            extra["cache_params"] = CacheParams(load_factor=lay.cache_ratio)
        out[t.name] = dataclasses.replace(base[t.name], sharding_types=[lay.sharding],
                                          compute_kernels=[lay.kernel], **extra)
    return out


def to_options(model, ebc, layouts, topo, local_batch: int, base: dict | None = None) -> list:
    """ShardingOptions of our layouts, built and estimated by TorchRec's own enumerator
    (EmbeddingPerfEstimator, EmbeddingStorageEstimator), shards on our ranks; in table order."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    cons = to_constraints(model, layouts, base)
    enum = EmbeddingEnumerator(topology=topo, batch_size=local_batch, constraints=cons)
    options = {o.name: o for o in enum.enumerate(ebc, [sharder()])}
    out = []
    for t, lay in zip(model.tables, layouts):
        o = options[t.name]
        if len(o.shards) != len(lay.shards):
            raise ValueError(f"{t.name}: TorchRec makes {len(o.shards)} shards of "
                             f"{lay.sharding}, our layout has {len(lay.shards)}")
        free = {}
        for s in lay.shards:
            free.setdefault((s.row, s.col, s.rows, s.cols), []).append(s.rank)
        for sh in o.shards:
            key = (sh.offset[0], sh.offset[1], sh.size[0], sh.size[1])
            if not free.get(key):
                raise ValueError(f"{t.name}: TorchRec's shard {key} is not in our layout")
            sh.rank = free[key].pop(0)
        out.append(o)
    return out


def options_to_layouts(model, options, topo) -> list:
    """ShardingOptions with ranks -> TorchRec's ShardingPlan (its own to_sharding_plan) -> ours."""
    from torchrec.distributed.planner.planners import to_sharding_plan

    return to_layouts(model, to_sharding_plan(options, topo), topo.world_size)


# ---- costs ---------------------------------------------------------------------------------------

def torchrec_cost(options, world: int) -> dict:
    """Per-rank sums of TorchRec's shard estimates (ms and bytes) and the slowest rank."""
    perf = [0.0] * world
    prefetch = [0.0] * world
    hbm = [0.0] * world
    ddr = [0.0] * world
    for o in options:
        for sh in o.shards:
            p = sh.perf
            perf[sh.rank] += p.fwd_compute + p.fwd_comms + p.bwd_compute + p.bwd_comms
            prefetch[sh.rank] += p.prefetch_compute
            hbm[sh.rank] += sh.storage.hbm
            ddr[sh.rank] += sh.storage.ddr
    r = max(range(world), key=lambda i: perf[i])
    return {"max_ms": perf[r], "rank": r, "max_with_prefetch_ms":
            max(a + b for a, b in zip(perf, prefetch)), "prefetch_ms": max(prefetch),
            "hbm_max": max(hbm), "ddr_max": max(ddr)}


def our_cost(model, cluster, layouts, optimizer: str) -> dict:
    """The layouts under our cost model: the slowest rank's sparse seconds plus the gradient
    all-reduce of the data-parallel tables (what our solver minimises, and what TorchRec counts in
    a data-parallel shard's bwd_comms), the step, HBM per rank."""
    p = tab.price_layouts(model, cluster, layouts, global_batch=GLOBAL_BATCH,
                          opts=tab.RecOptions(optimizer=optimizer))
    worst = max(p.per_rank, key=lambda x: x["sparse_s"])
    dp_s = emb.allreduce_s(sum(c.allreduce_bytes for c in p.table_costs), p.env)
    cap = cluster.device.memory_bytes * (1 - tab.HBM_RESERVE)
    return {"sparse_ms": (worst["sparse_s"] + dp_s) * 1e3, "dp_allreduce_ms": dp_s * 1e3,
            "step_ms": p.step_s * 1e3,
            "hbm_max": max(x["hbm_bytes"] for x in p.per_rank), "fits": all(
                x["hbm_bytes"] <= cap for x in p.per_rank)}


def mix(layouts) -> str:
    """Sharding types and tiers, counted: 'TW 20, RW 6; hbm'."""
    short = {"data_parallel": "DP", "table_wise": "TW", "column_wise": "CW", "row_wise": "RW",
             "table_row_wise": "TWRW", "grid_shard": "GS"}
    kinds, tiers = {}, {}
    for lay in layouts:
        kinds[short[lay.sharding]] = kinds.get(short[lay.sharding], 0) + 1
        tier = lay.tier + (f"@{lay.cache_ratio:g}" if lay.tier == "uvm_caching" else "")
        tiers[tier] = tiers.get(tier, 0) + 1
    return (", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda x: -x[1])) + "; " +
            ", ".join(f"{k} {v}" for k, v in sorted(tiers.items(), key=lambda x: -x[1])))


# ---- one case ------------------------------------------------------------------------------------

def run_case(name: str, ranks: int, limits: tuple, cache: dict,
             torchrec_timeout: int | None = None) -> list:
    """Both planners on one (model, ranks), ours once per CP-SAT time limit in ``limits``: a dict
    per plan."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    model, ebc, optimizer = load(name, cache)
    set_optimizer(ebc, optimizer)
    cl = get_cluster(CLUSTER, nodes=max(1, ranks // 8), gpus_per_node=min(8, ranks))
    W = cl.num_gpus
    local = GLOBAL_BATCH // W
    env = tab.environment(cl, local, optimizer)
    dense = tab.dense_memory(model, env, 0 if optimizer == "sgd" else 1)
    topo, _ = topology(cl)
    base = base_constraints(model)

    planner = EmbeddingShardingPlanner(topology=topo, batch_size=local, constraints=base,
                                       storage_reservation=storage_reservation(dense),
                                       debug=False, timeout_seconds=torchrec_timeout)
    enum_s = _time_enumeration(planner)
    with _timeouts() as timed_out, contextlib.redirect_stdout(io.StringIO()):
        t0 = time.perf_counter()
        splan = planner.plan(ebc, [sharder()])
        tr_wall = time.perf_counter() - t0
    tr_layouts = to_layouts(model, splan, W)
    tr_rating = _rating(planner._best_plan, W)
    plans = [("TorchRec", tr_layouts, tr_wall,
              {"proposals": planner._num_proposals, "timed_out": bool(timed_out),
               "enumerate_s": enum_s[0], "timeout_s": torchrec_timeout})]
    for i, limit in enumerate(limits):
        t0 = time.perf_counter()
        ours = tab.plan_tables(model, cl, global_batch=GLOBAL_BATCH,
                               opts=tab.RecOptions(optimizer=optimizer, time_limit_s=limit))
        wall = time.perf_counter() - t0
        plans.append(("ours" if i == 0 else f"ours, {limit:g} s", ours.layouts, wall,
                      {**ours.solver, "limit_s": limit}))

    rows = []
    for who, lays, wall, solver in plans:
        opts_ = to_options(model, ebc, lays, topo, local, base)
        back = options_to_layouts(model, opts_, topo)
        rows.append({"model": name, "ranks": W, "planner": who,
                     "ours": our_cost(model, cl, lays, optimizer),
                     "torchrec": torchrec_cost(opts_, W), "wall_s": wall, "solver": solver,
                     "mix": mix(lays), "round_trip": back == list(lays)})
    rows[0]["torchrec_rating_ms"] = tr_rating
    return rows


def _time_enumeration(planner) -> list:
    """Wrap the planner's enumerator to time its enumeration (part of planner.plan's time)."""
    spent = [0.0]
    inner = planner._enumerator.enumerate

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0

    planner._enumerator.enumerate = timed
    return spent


@contextlib.contextmanager
def _timeouts():
    """Catch TorchRec's 'Exceeded time limit' log line (its planner stopped proposing)."""
    hits = []

    class Catch(logging.Handler):
        def emit(self, record):
            if "Exceeded time limit" in record.getMessage():
                hits.append(record.getMessage())

    log = logging.getLogger("torchrec.distributed.planner.planners")
    saved = (log.level, log.propagate)
    handler = Catch(logging.INFO)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    try:
        yield hits
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def _rating(best_plan, world: int) -> float:
    """TorchRec's own rating of its best plan (NoopPerfModel: perf.total summed per rank, max)."""
    perfs = [0.0] * world
    for o in best_plan:
        for sh in o.shards:
            perfs[sh.rank] += sh.perf.total
    return max(perfs)


def _solver_cell(row) -> str:
    s = row["solver"]
    if row["planner"] == "TorchRec":
        out = f"{s['proposals']} proposals"
        if s["timed_out"]:
            out += f", stopped by timeout_seconds={s['timeout_s']}"
        return out
    gap = s.get("gap")
    return f"CP-SAT {s['status']}" + (f", gap {gap:.0%}" if gap is not None else "")


def _parse_case(text: str) -> tuple:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise SystemExit(f"--case: expected MODEL:RANKS[:LIMITS], got {text!r}")
    limits = tuple(float(x) for x in parts[2].split(",")) if len(parts) == 3 else None
    return parts[0], int(parts[1]), limits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a small run: dlrm-criteo-1tb on 8 ranks, 104 synthetic tables on 16")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--time-limit", type=float, default=10.0,
                    help="our CP-SAT time limit, seconds (default 10, RecOptions' default)")
    ap.add_argument("--torchrec-timeout", type=int, default=TORCHREC_TIMEOUT_S,
                    help="TorchRec's timeout_seconds (its proposal loop stops after this; "
                    f"default {TORCHREC_TIMEOUT_S}; 0: none)")
    ap.add_argument("--case", action="append", default=[],
                    help="MODEL:RANKS[:LIMIT,LIMIT...] (repeatable; MODEL a zoo name or "
                    "synthetic-<n>; default: the full list)")
    args = ap.parse_args(argv)
    _quiet()
    if args.case:
        cases = [_parse_case(c) for c in args.case]
    else:
        cases = [(n, r, (args.time_limit, *more)) for n, r, more in (QUICK if args.quick
                                                                        else CASES)]
    cache: dict = {}
    rows = []
    for name, ranks, limits in cases:
        got = run_case(name, ranks, limits or (args.time_limit,), cache,
                       args.torchrec_timeout or None)
        rows += got
        for r in got:
            extra = ""
            if r["planner"] == "TorchRec":
                extra = (f"; its enumeration {r['solver']['enumerate_s']:.1f} s; its own "
                         f"rating {r['torchrec_rating_ms']:.3f} ms")
            print(f"# {name} x{ranks} {r['planner']}: {r['mix']}; round trip "
                  f"{'ok' if r['round_trip'] else 'DIFFERS'}; plan {r['wall_s']:.2f} s; "
                  f"{_solver_cell(r)}; our step {r['ours']['step_ms']:.3f} ms (DP tables' "
                  f"all-reduce {r['ours']['dp_allreduce_ms']:.3f} ms); max HBM ours "
                  f"{r['ours']['hbm_max'] / 1e9:.1f} GB, TorchRec's "
                  f"{r['torchrec']['hbm_max'] / 1e9:.1f} GB; fits ours: {r['ours']['fits']}"
                  + extra, file=sys.stderr, flush=True)
    head = ["model", "ranks", "planner", "slowest rank, our model (ms)",
            "slowest rank, TorchRec's (ms)", "step, our model (ms)", "plan time (s)", "solver",
            "tables"]
    body = [[r["model"], str(r["ranks"]), r["planner"], f"{r['ours']['sparse_ms']:.3g}",
             f"{r['torchrec']['max_ms']:.3g}" + (
                 f" (+{r['torchrec']['prefetch_ms']:.2g} prefetch)"
                 if r["torchrec"]["prefetch_ms"] > 0 else ""),
             f"{r['ours']['step_ms']:.3g}", f"{r['wall_s']:.1f}", _solver_cell(r), r["mix"]]
            for r in rows]
    print_table(head, body, args.markdown)
    return 1 if any(not r["round_trip"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
