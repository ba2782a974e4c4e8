"""What each block costs under a configuration, and the memory inputs of the stage-split solvers.

The block graph becomes arrays once per search (``ModelArrays``); for each group of
configurations sharing (tp, sequence parallel, recomputation, micro-batch) the cost models
(costmodels/) give every block's seconds and bytes once (``block_costs``). ``stage_memory`` turns
those into what the solvers check a stage's memory with; it is built in this one place for the
chain split, the DAG and the device-group solvers alike.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from costmodels import comm, compute, memory, pipeline
from costmodels.topology import Cluster
from costmodels.workload import WORK_FIELDS, BlockWork
from planner.options import Config, SearchOptions, TrainingSpec
from planner.search import placement
from planner.solve.chain import StageMemory
from planner.trace.graph import BlockGraph


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
    train_flops_per_sample: float
    """Model FLOPs of forward + backward per sample (BlockWork.train_flops)."""

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
                   fwd_flops_per_sample=float(np.sum(work.fwd_flops)),
                   train_flops_per_sample=float(sum(b.work.train_flops for b in blocks)))


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

    kept = training.engine.attention != "flash"  # eager attention's scores, saved or fused away
    fused = training.engine.kernels == "fused"  # element-wise chains keep only what enters them
    fp8 = training.dtype == "fp8"  # Linear inputs kept quantized
    return BlockCosts(
        fwd_s=vec([t.fwd_s for t in bt]),
        compute_s=vec([t.fwd_s + t.bwd_s for t in bt]),
        recompute_s=vec([t.recompute_s for t in bt]),
        tp_comm_s=vec(tp_s),
        act_bytes=np.where(ma.checkpointed, vec(memory.activation_bytes(
            w, micro_batch=micro_batch, tp=tp, sp=sp, recompute=recompute, scores_kept=kept,
            fused=fused, fp8=fp8)),
            vec(memory.activation_bytes(w, micro_batch=micro_batch, tp=tp, sp=sp, recompute="none",
                                        scores_kept=kept, fused=fused, fp8=fp8))),
        work_bytes=np.maximum(np.where(ma.checkpointed, vec(memory.recompute_working_bytes(
            w, micro_batch=micro_batch, tp=tp, sp=sp, recompute=recompute, scores_kept=kept,
            fused=fused, fp8=fp8)), 0.0),
            vec(memory.backward_transient_bytes(w, micro_batch=micro_batch, tp=tp, sp=sp))),
        params_local=vec(w.params_tp / tp + w.params_rep),
    )


def capacity_bytes(cluster: Cluster, options: SearchOptions) -> float:
    return memory.usable_bytes(cluster.device.memory_bytes,
                               reserve_fraction=options.memory_reserve_fraction,
                               reserve_bytes=options.memory_reserve_bytes)


def stage_memory(cfg: Config, costs: BlockCosts, ma: ModelArrays, training: TrainingSpec,
                 capacity: float) -> StageMemory:
    """The solvers' memory inputs: per block its model states and activations per micro-batch,
    per stage (chunk, with interleaving) the micro-batches in flight on its rank, and the bytes a
    stage may use: ``capacity`` per GPU, of which a chunk may take 1/vpp (exact for vpp = 1).
    Tied weights read by two blocks are held once when both share a stage."""
    bpp = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                       zero=cfg.zero, dp=cfg.dp, offload=cfg.offload_optimizer,
                                       layout=training.engine.state_layout)
    rank_in_flight = [pipeline.in_flight(cfg.schedule, stage=r, stages=cfg.pp,
                                         microbatches=cfg.num_microbatches, vpp=cfg.vpp)
                      for r in range(cfg.pp)]
    shared = [(a, b, bpp * (n / cfg.tp if split else n)) for a, b, n, split in ma.shared]
    return StageMemory(static=(costs.params_local * bpp).tolist(), act=costs.act_bytes.tolist(),
                       work=costs.work_bytes.tolist(),
                       in_flight=[rank_in_flight[c % cfg.pp] for c in range(cfg.pp * cfg.vpp)],
                       capacity=capacity / cfg.vpp, shared=shared)
