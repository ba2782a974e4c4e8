"""Price one configuration: per-block costs, the stage split, step time, memory, throughput.

The search builds a Config; this module asks the cost models (costmodels/) and the chain solver
and either returns an Estimate or raises InfeasibleError with a reason the search counts.

With interleaved 1F1B the blocks are cut into ``pp x vpp`` chunks; chunk ``c`` runs on pipeline
rank ``c mod pp`` (Megatron-LM's placement), so a rank's time and memory add up its chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodels import comm, compute, memory, pipeline
from costmodels.errors import InfeasibleError
from costmodels.topology import Cluster
from costmodels.workload import WORK_FIELDS, BlockWork
from planner import placement
from planner.graph import BlockGraph
from planner.options import PLACEMENTS, Config, SearchOptions, TrainingSpec
from planner.pricing import Estimate, StageEstimate, price
from planner.solve.chain import StageMemory, partition

__all__ = ["Estimate", "StageEstimate", "ModelArrays", "BlockCosts", "block_costs", "evaluate",
           "capacity_bytes", "price"]


@dataclass
class ModelArrays:
    """The block graph as arrays (one entry per block), built once per search."""

    names: list[str]
    works: list[BlockWork]
    checkpointed: np.ndarray
    """Per block: whether recomputation applies to it (Block.recompute)."""
    work: BlockWork
    """A BlockWork whose numeric fields are numpy arrays over blocks."""
    cut_bytes: np.ndarray
    shared: list[tuple[int, int, float, bool]]
    fwd_flops_per_sample: float

    @classmethod
    def from_blocks(cls, bg: BlockGraph, order: list[int] | None = None) -> "ModelArrays":
        """Arrays over the blocks in their own order, or in ``order`` (a topological order)."""
        order = list(range(len(bg.blocks))) if order is None else list(order)
        blocks = [bg.blocks[i] for i in order]
        cols = {f: np.array([getattr(b.work, f) for b in blocks], dtype=float) for f in WORK_FIELDS}
        idx = {b.name: i for i, b in enumerate(blocks)}
        shared = [(idx[a], idx[b], float(n), bool(s)) for a, b, n, s in bg.shared]
        work = BlockWork(**cols)
        return cls(names=[b.name for b in blocks], works=[b.work for b in blocks], work=work,
                   checkpointed=np.array([b.recompute for b in blocks], dtype=bool),
                   cut_bytes=np.array(bg.cut_bytes(order), dtype=float), shared=shared,
                   fwd_flops_per_sample=float(np.sum(work.fwd_flops)))


@dataclass
class BlockCosts:
    """Per-block seconds and bytes for one micro-batch under (tp, sp, recompute, micro_batch)."""

    fwd_s: np.ndarray
    compute_s: np.ndarray
    """Forward + backward."""
    recompute_s: np.ndarray
    tp_comm_s: np.ndarray
    act_bytes: np.ndarray
    work_bytes: np.ndarray
    params_local: np.ndarray

    @property
    def time_s(self) -> np.ndarray:
        return self.compute_s + self.recompute_s + self.tp_comm_s

    def permuted(self, order: list[int]) -> "BlockCosts":
        return BlockCosts(**{f.name: getattr(self, f.name)[order] for f in fields(self)})


def block_costs(ma: ModelArrays, cluster: Cluster, training: TrainingSpec, *, tp: int, sp: bool,
                recompute: str, micro_batch: int) -> BlockCosts:
    w = ma.work
    times: dict[tuple, compute.BlockTime] = {}  # blocks copied from one layer share one BlockWork
    policies = [recompute if c else "none" for c in ma.checkpointed]
    for work, policy in zip(ma.works, policies):
        if (id(work), policy) not in times:
            times[id(work), policy] = compute.block_time(
                work, cluster.device, dtype=training.dtype, micro_batch=micro_batch, tp=tp, sp=sp,
                recompute=policy, engine=training.engine)
    bt = [times[id(work), policy] for work, policy in zip(ma.works, policies)]
    group = placement.group_shape(tp, 1, cluster.gpus_per_node)
    fwd_repeats = 2 if recompute == "full" else 1  # full recompute replays forward all-reduces
    tp_bytes = micro_batch * (fwd_repeats * w.tp_fwd_bytes + w.tp_bwd_bytes)
    count = w.tp_collectives * (2 if sp else 1)  # sp: reduce-scatter + all-gather per all-reduce
    tp_s = comm.allreduce_s(tp_bytes, group, cluster, count=count)
    n = len(ma.names)

    def vec(x) -> np.ndarray:  # scalars (e.g. no recomputation) broadcast over blocks
        return np.broadcast_to(np.asarray(x, dtype=float), (n,)).copy()

    return BlockCosts(
        fwd_s=vec([t.fwd_s for t in bt]),
        compute_s=vec([t.fwd_s + t.bwd_s for t in bt]),
        recompute_s=vec([t.recompute_s for t in bt]),
        tp_comm_s=vec(tp_s),
        act_bytes=np.where(ma.checkpointed, vec(memory.activation_bytes(
            w, micro_batch=micro_batch, tp=tp, sp=sp, recompute=recompute)), vec(
            memory.activation_bytes(w, micro_batch=micro_batch, tp=tp, sp=sp, recompute="none"))),
        work_bytes=np.where(ma.checkpointed, vec(memory.recompute_working_bytes(
            w, micro_batch=micro_batch, tp=tp, sp=sp, recompute=recompute)), 0.0),
        params_local=vec(w.params_tp / tp + w.params_rep),
    )


def capacity_bytes(cluster: Cluster, options: SearchOptions) -> float:
    return memory.usable_bytes(cluster.device.memory_bytes,
                               reserve_fraction=options.memory_reserve_fraction,
                               reserve_bytes=options.memory_reserve_bytes)


def evaluate(cfg: Config, ma: ModelArrays, costs: BlockCosts, cluster: Cluster,
             training: TrainingSpec, options: SearchOptions) -> Estimate:
    """Split into stages (chunks), then price the step; raises InfeasibleError."""
    bpp = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                       zero=cfg.zero, dp=cfg.dp, offload=cfg.offload_optimizer)
    chunks = cfg.pp * cfg.vpp
    rank_in_flight = [pipeline.in_flight(cfg.schedule, stage=r, stages=cfg.pp,
                                         microbatches=cfg.num_microbatches, vpp=cfg.vpp)
                      for r in range(cfg.pp)]
    # A chunk may use 1/vpp of its rank's memory (exact for vpp = 1).
    in_flight = [rank_in_flight[c % cfg.pp] for c in range(chunks)]
    shared = [(a, b, bpp * (n / cfg.tp if split else n)) for a, b, n, split in ma.shared]
    mem = StageMemory(static=(costs.params_local * bpp).tolist(), act=costs.act_bytes.tolist(),
                      work=costs.work_bytes.tolist(), in_flight=in_flight,
                      capacity=capacity_bytes(cluster, options) / cfg.vpp, shared=shared)
    part = partition(costs.time_s.tolist(), chunks, mem)
    if part is None:
        raise InfeasibleError(_oom_message(cfg, mem), reason="out of memory")
    # The split does not depend on placement; price each order and keep the faster.
    orders = PLACEMENTS if cfg.pp > 1 and cfg.dp > 1 else (cfg.placement,)
    priced = [price(cfg.with_(placement=o), part.bounds, ma, costs, cluster, training)
              for o in orders]
    best = min(priced, key=lambda e: e.step_time_s)
    if best.peak_memory_bytes > capacity_bytes(cluster, options):
        raise InfeasibleError(f"{cfg.short()}: a rank needs {best.peak_memory_bytes / 1e9:.3g} GB",
                              reason="out of memory")
    return best


def _oom_message(cfg: Config, mem: StageMemory) -> str:
    return (f"{cfg.short()}: no split into {cfg.pp * cfg.vpp} stages fits "
            f"{mem.capacity / 1e9:.3g} GB per GPU")
