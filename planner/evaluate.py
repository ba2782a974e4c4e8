"""Price one configuration: per-block costs, the stage split, step time, memory, throughput.

The search builds a Config; this module asks the cost models (costmodels/) and the chain solver
and either returns an Estimate or raises InfeasibleError with a reason the search counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from costmodels import comm, compute, memory, pipeline
from costmodels.errors import InfeasibleError
from costmodels.hardware import DTYPE_BYTES
from costmodels.topology import Cluster
from costmodels.workload import WORK_FIELDS, BlockWork
from planner import placement
from planner.graph import BlockGraph
from planner.options import PLACEMENTS, Config, SearchOptions, TrainingSpec
from planner.solve.chain import StageMemory, partition


@dataclass
class ModelArrays:
    """The block graph as arrays (one entry per block), built once per search."""

    names: list[str]
    work: BlockWork
    """A BlockWork whose fields are numpy arrays over blocks."""
    cut_bytes: np.ndarray
    shared: list[tuple[int, int, float, bool]]
    fwd_flops_per_sample: float

    @classmethod
    def from_blocks(cls, bg: BlockGraph) -> "ModelArrays":
        cols = {f: np.array([getattr(b.work, f) for b in bg.blocks], dtype=float) for f in WORK_FIELDS}
        idx = bg.index()
        shared = [(idx[a], idx[b], float(n), bool(s)) for a, b, n, s in bg.shared]
        work = BlockWork(**cols)
        return cls(names=[b.name for b in bg.blocks], work=work,
                   cut_bytes=np.array(bg.cut_bytes(), dtype=float), shared=shared,
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


def block_costs(ma: ModelArrays, cluster: Cluster, training: TrainingSpec, *, tp: int, sp: bool,
                recompute: str, micro_batch: int) -> BlockCosts:
    w = ma.work
    bt = compute.block_time(w, cluster.device, dtype=training.dtype, micro_batch=micro_batch,
                            tp=tp, sp=sp, recompute=recompute)
    group = placement.group_shape(tp, 1, cluster.gpus_per_node)
    fwd_repeats = 2 if recompute == "full" else 1  # full recompute replays forward all-reduces
    tp_bytes = micro_batch * (fwd_repeats * w.tp_fwd_bytes + w.tp_bwd_bytes)
    count = w.tp_collectives * (2 if sp else 1)  # sp: reduce-scatter + all-gather per all-reduce
    tp_s = comm.allreduce_s(tp_bytes, group, cluster, count=count)
    n = len(ma.names)

    def vec(x) -> np.ndarray:  # scalars (e.g. no recomputation) broadcast over blocks
        return np.broadcast_to(np.asarray(x, dtype=float), (n,)).copy()

    return BlockCosts(
        fwd_s=vec(bt.fwd_s),
        compute_s=vec(bt.fwd_s + bt.bwd_s),
        recompute_s=vec(bt.recompute_s),
        tp_comm_s=vec(tp_s),
        act_bytes=vec(memory.activation_bytes(w, micro_batch=micro_batch, tp=tp, sp=sp,
                                              recompute=recompute)),
        work_bytes=vec(memory.recompute_working_bytes(w, micro_batch=micro_batch, tp=tp, sp=sp,
                                                      recompute=recompute)),
        params_local=vec(w.params_tp / tp + w.params_rep),
    )


@dataclass
class StageEstimate:
    index: int
    blocks: list[str]
    compute_s: float
    """Forward + backward + recomputation of one micro-batch."""
    tp_comm_s: float
    p2p_s: float
    """Sending activations forward and gradients back, per micro-batch."""
    params: float
    """Parameters held per GPU (before ZeRO sharding)."""
    in_flight: int
    memory: dict = field(default_factory=dict)
    fwd_s: float = 0.0
    """Forward compute of one micro-batch (part of compute_s)."""
    recompute_s: float = 0.0
    """Recomputation of one micro-batch (part of compute_s)."""
    act_bytes: float = 0.0
    """Activation bytes one micro-batch keeps on this stage."""

    @property
    def time_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.p2p_s


@dataclass
class Estimate:
    config: Config
    stages: list[StageEstimate]
    step_time_s: float
    breakdown: dict
    peak_memory_bytes: float
    model_flops: float
    hardware_flops: float

    def throughput(self, training: TrainingSpec, cluster: Cluster) -> dict:
        n = cluster.num_gpus
        peak = cluster.device.peak(training.dtype)
        return {
            "samples_per_s": training.global_batch / self.step_time_s,
            "tokens_per_s": training.global_batch * training.seq_len / self.step_time_s,
            "tflops_per_device": self.hardware_flops / self.step_time_s / n / 1e12,
            "mfu": self.model_flops / self.step_time_s / n / peak,
        }


def capacity_bytes(cluster: Cluster, options: SearchOptions) -> float:
    return memory.usable_bytes(cluster.device.memory_bytes,
                               reserve_fraction=options.memory_reserve_fraction,
                               reserve_bytes=options.memory_reserve_bytes)


def evaluate(cfg: Config, ma: ModelArrays, costs: BlockCosts, cluster: Cluster,
             training: TrainingSpec, options: SearchOptions) -> Estimate:
    """Split into stages, then price the step; raises InfeasibleError."""
    bpp = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                       zero=cfg.zero, dp=cfg.dp)
    in_flight = [pipeline.in_flight(cfg.schedule, stage=s, stages=cfg.pp,
                                    microbatches=cfg.num_microbatches) for s in range(cfg.pp)]
    static = costs.params_local * bpp
    shared = [(a, b, bpp * (n / cfg.tp if split else n)) for a, b, n, split in ma.shared]
    mem = StageMemory(static=static.tolist(), act=costs.act_bytes.tolist(),
                      work=costs.work_bytes.tolist(), in_flight=in_flight,
                      capacity=capacity_bytes(cluster, options), shared=shared)
    part = partition(costs.time_s.tolist(), cfg.pp, mem)
    if part is None:
        raise InfeasibleError(_oom_message(cfg, mem), reason="out of memory")
    # The split does not depend on placement; price each order and keep the faster.
    orders = PLACEMENTS if cfg.pp > 1 and cfg.dp > 1 else (cfg.placement,)
    priced = [price(cfg.with_(placement=o), part.bounds, ma, costs, cluster, training) for o in orders]
    return min(priced, key=lambda e: e.step_time_s)


def _oom_message(cfg: Config, mem: StageMemory) -> str:
    need = max(mem.of(0, a, a + 1) for a in range(len(mem.static)))
    return (f"{cfg.short()}: no split into {cfg.pp} stages fits {mem.capacity / 1e9:.3g} GB per "
            f"GPU (the largest block alone needs {need / 1e9:.3g} GB)")


def price(cfg: Config, bounds: list[int], ma: ModelArrays, costs: BlockCosts, cluster: Cluster,
          training: TrainingSpec) -> Estimate:
    """Step time, breakdown and memory of a configuration with given stage bounds."""
    m = cfg.num_microbatches
    links = placement.cut_links(cfg, cluster)
    tp_div = cfg.tp if cfg.tp > 1 else 1
    p2p = [2 * comm.p2p_s(ma.cut_bytes[b - 1] * cfg.micro_batch / tp_div, link)
           for b, link in zip(bounds[1:-1], links)]
    stages = []
    for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
        sl = slice(a, b)
        params = float(np.sum(costs.params_local[sl])) - sum(
            (n / cfg.tp if split else n) for i, j, n, split in ma.shared if a <= i < b and a <= j < b)
        in_flight = pipeline.in_flight(cfg.schedule, stage=s, stages=cfg.pp, microbatches=m)
        states = memory.model_state_bytes(params, dtype=training.dtype,
                                          optimizer=training.optimizer, zero=cfg.zero, dp=cfg.dp)
        act = in_flight * float(np.sum(costs.act_bytes[sl]))
        work = float(np.max(costs.work_bytes[sl]))
        mem = {**states, "activations": act, "working": work}
        mem["total"] = sum(mem.values())
        p2p_s = (p2p[s] / 2 if s < cfg.pp - 1 else 0.0) + (p2p[s - 1] / 2 if s > 0 else 0.0)
        stages.append(StageEstimate(
            index=s, blocks=ma.names[a:b],
            compute_s=float(np.sum(costs.compute_s[sl] + costs.recompute_s[sl])),
            tp_comm_s=float(np.sum(costs.tp_comm_s[sl])), p2p_s=p2p_s, params=params,
            in_flight=in_flight, memory=mem, fwd_s=float(np.sum(costs.fwd_s[sl])),
            recompute_s=float(np.sum(costs.recompute_s[sl])),
            act_bytes=float(np.sum(costs.act_bytes[sl]))))
    times = [st.time_s for st in stages]
    pipe_s = pipeline.step_time_s(times, microbatches=m, schedule=cfg.schedule)
    dp_s, opt_s = _dp_and_optimizer_s(cfg, stages, cluster, training)
    slow = max(stages, key=lambda st: st.time_s)
    breakdown = {
        "compute_s": m * slow.compute_s,
        "bubble_s": pipe_s - m * slow.time_s,
        "tp_comm_s": m * slow.tp_comm_s,
        "pp_comm_s": m * slow.p2p_s,
        "dp_comm_s": dp_s,
        "optimizer_s": opt_s,
    }
    model_flops = 3 * ma.fwd_flops_per_sample * training.global_batch
    rc_flops = {"none": 0.0, "selective": float(np.sum(ma.work.attn_flops)),
                "full": ma.fwd_flops_per_sample}[cfg.recompute] * training.global_batch
    return Estimate(config=cfg, stages=stages, step_time_s=pipe_s + dp_s + opt_s,
                    breakdown=breakdown, peak_memory_bytes=max(st.memory["total"] for st in stages),
                    model_flops=model_flops, hardware_flops=model_flops + rc_flops)


def _dp_and_optimizer_s(cfg: Config, stages, cluster: Cluster, training: TrainingSpec):
    """Gradient synchronization across data-parallel replicas and the optimizer update (the
    slowest stage sets both)."""
    group = placement.dp_group(cfg, cluster)
    grad_b = DTYPE_BYTES[training.dtype]
    state_b = memory.state_bytes_per_param(dtype=training.dtype, optimizer=training.optimizer,
                                           zero=0, dp=1)
    dp_s = opt_s = 0.0
    for st in stages:
        nbytes = st.params * grad_b
        sync = comm.allreduce_s(nbytes, group, cluster)  # ZeRO-1/2: reduce-scatter + all-gather
        if cfg.zero == 3:  # parameters gathered again for every micro-batch's forward and backward
            sync += 2 * cfg.num_microbatches * comm.allgather_s(nbytes, group, cluster)
        dp_s = max(dp_s, sync)
        shard = cfg.dp if cfg.zero >= 1 else 1
        opt_s = max(opt_s, compute.optimizer_step_s(st.params / shard, cluster.device,
                                                    state_bytes_per_param=state_b))
    return dp_s, opt_s
