"""Step time, breakdown and memory of a configuration whose stage (chunk) bounds are known."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from costmodels import comm, compute, experts, memory, pipeline, precision
from costmodels.hardware import DTYPE_BYTES
from costmodels.topology import Cluster
from planner.options import Config, TrainingSpec
from planner.search import placement


@dataclass
class StageEstimate:
    """One pipeline stage (with interleaving: one model chunk) and the rank running it."""

    index: int
    rank: int
    """Pipeline rank (chunk ``index`` runs on rank ``index mod pp``)."""
    blocks: list[str]
    compute_s: float
    """Forward + backward + recomputation of one micro-batch through this chunk."""
    tp_comm_s: float
    p2p_s: float
    """Sending activations forward and gradients back, per micro-batch."""
    params: float
    """Parameters held per GPU by this rank (before ZeRO sharding)."""
    in_flight: float
    """Micro-batches' worth of the rank's activations alive at its peak."""
    memory: dict = field(default_factory=dict)
    """The rank's memory by kind (bytes)."""
    fwd_s: float = 0.0
    recompute_s: float = 0.0
    act_bytes: float = 0.0
    """Activation bytes one micro-batch keeps on this chunk."""
    cp_comm_s: float = 0.0
    """Context-parallel K/V exchange exposed per micro-batch (costmodels.context)."""
    ep_comm_s: float = 0.0
    """Expert-parallel dispatch and combine exposed per micro-batch (costmodels.experts)."""
    expert_params: float = 0.0
    """The part of ``params`` in routed experts (their states sharded over edp, their gradients
    reduced over it)."""
    dtensor_params: float = 0.0
    """Parameter tensors of the rank that the runtime makes DTensors (tensor-parallel ones; all
    of them under data parallelism, which FSDP2 wraps)."""
    group: str = ""
    """Device group running it (heterogeneous clusters)."""
    ranks: list[int] = field(default_factory=list)
    """Global ranks running it, when they do not follow the homogeneous layout."""

    @property
    def time_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.p2p_s + self.cp_comm_s + self.ep_comm_s


@dataclass
class Estimate:
    config: Config
    stages: list[StageEstimate]
    step_time_s: float
    breakdown: dict
    peak_memory_bytes: float
    model_flops: float
    """FLOPs of the step's forward and backward (BlockWork.train_flops x global batch): what MFU
    counts."""
    hardware_flops: float
    """``model_flops`` plus the forward recomputed (activation recomputation): what the devices
    run, and what TFLOP/s per device counts."""
    cut_p2p_s: list[float] = field(default_factory=list)
    """One-way send seconds per micro-batch over each cut between consecutive chunks."""
    timing: str = "closed form"
    """How the pipeline time was found: closed form, or simulated (planner.schedule.simulator)."""
    stage_split: str = "chain"
    """chain (contiguous in topological order, exact) or cp-sat (DAG assignment)."""
    split_status: str = "optimal"
    split_gap: float | None = 0.0
    """CP-SAT's relative gap for the stage split; None when unknown."""
    straggler_excess: float = 0.0
    """Share of the local work (compute, optimizer) added by waiting for the slowest process
    (costmodels.compute.straggler_excess); breakdown["straggler_s"] is it times that work."""

    def throughput(self, training: TrainingSpec, cluster) -> dict:
        n = cluster.num_gpus
        if hasattr(cluster, "groups"):  # heterogeneous: the GPU-weighted mean peak
            peak = sum(g.num_gpus * g.device.peak(training.dtype) for g in cluster.groups) / n
        else:
            peak = cluster.device.peak(training.dtype)
        return {
            "samples_per_s": training.global_batch / self.step_time_s,
            "tokens_per_s": training.global_batch * training.seq_len / self.step_time_s,
            "tflops_per_device": self.hardware_flops / self.step_time_s / n / 1e12,
            "mfu": self.model_flops / self.step_time_s / n / peak,
        }


def price(cfg: Config, bounds: list[int], ma, costs, cluster: Cluster,
          training: TrainingSpec) -> Estimate:
    """Step time, breakdown and memory of ``cfg`` with chunk ``c`` = blocks [bounds[c], bounds[c+1])."""
    p2p_out, cut_p2p = _p2p_sends(cfg, bounds, ma, cluster)
    stages = chunks(cfg, bounds, ma, costs, p2p_out,
                    expert_comm_s(cfg, ma, costs, cluster, training))
    ranks = rank_memory(cfg, bounds, stages, ma, costs, training)
    dp_s, opt_s = _dp_and_optimizer_s(cfg, stages, ranks, cluster, training)
    excess = compute.straggler_excess(cluster.device, cfg.dp * cfg.cp * cfg.tp * cfg.pp)
    return assemble(cfg, stages, ranks, dp_s, opt_s, ma, training, cut_p2p, excess=excess)


def chunks(cfg: Config, bounds: list[int], ma, costs, p2p_out: list[float],
           ep_s: np.ndarray | None = None) -> list[StageEstimate]:
    """One StageEstimate per chunk, from per-block costs (memory filled in by _rank_memory);
    ``ep_s``: per block, the expert-parallel communication it exposes (expert_comm_s)."""
    starts = np.asarray(bounds[:-1])
    assert all(b > a for a, b in zip(bounds, bounds[1:])), f"an empty chunk in {bounds}"

    def per_chunk(x: np.ndarray) -> list[float]:  # sums over each chunk's blocks
        return np.add.reduceat(x, starts).tolist()

    compute_s = per_chunk(costs.compute_s + costs.recompute_s)
    tp_s, fwd_s, rc_s = per_chunk(costs.tp_comm_s), per_chunk(costs.fwd_s), per_chunk(
        costs.recompute_s)
    act, cp_s = per_chunk(costs.act_bytes), per_chunk(costs.cp_comm_s)
    ep = per_chunk(ep_s) if ep_s is not None else [0.0] * len(starts)
    return [StageEstimate(index=c, rank=c % cfg.pp, blocks=ma.names[a:b], compute_s=compute_s[c],
                          tp_comm_s=tp_s[c], p2p_s=p2p_out[c], params=0.0, in_flight=0.0,
                          fwd_s=fwd_s[c], recompute_s=rc_s[c], act_bytes=act[c],
                          cp_comm_s=cp_s[c], ep_comm_s=ep[c])
            for c, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def expert_comm_s(cfg: Config, ma, costs, cluster: Cluster, training: TrainingSpec) -> np.ndarray:
    """Per block: seconds of the routed tokens' dispatch and combine it exposes per micro-batch
    on this configuration's placement (costmodels.experts.block_dispatch_s)."""
    if cfg.ep * cfg.etp <= 1 or not np.any(ma.work.dispatch_bytes):
        return np.zeros(len(ma.names))
    w = ma.work
    return experts.block_dispatch_s(
        training.engine, dispatch_bytes=w.dispatch_bytes, routed_tokens=w.routed_tokens,
        seq_len=training.seq_len, share=cfg.micro_batch / (cfg.tp * cfg.cp), ep=cfg.ep,
        ep_group=placement.ep_group(cfg, cluster), etp_group=placement.etp_group(cfg, cluster),
        cluster=cluster, recompute_full=cfg.recompute == "full", expert_s=costs.expert_s)


def assemble(cfg: Config, stages, ranks, dp_s: float, opt_s: float, ma, training: TrainingSpec,
             cut_p2p: list[float], *, excess: float = 0.0) -> Estimate:
    """Pipeline time (closed form), breakdown along the slowest rank, FLOPs: the Estimate.
    ``excess``: the straggler share of local work (pricing.Estimate.straggler_excess)."""
    rank_time = [sum(st.time_s for st in stages if st.rank == r) for r in range(cfg.pp)]
    m = cfg.num_microbatches
    slow = int(np.argmax(rank_time))
    mine = [st for st in stages if st.rank == slow]
    wgrad = sum(weight_grad_s(st) for st in mine)
    pipe_s = pipeline.step_time_s(rank_time, microbatches=m, schedule=cfg.schedule, vpp=cfg.vpp,
                                  wgrad_s=wgrad)
    breakdown = {
        "compute_s": m * sum(st.compute_s for st in mine),
        "bubble_s": idle_s(pipe_s, m * rank_time[slow]),
        "tp_comm_s": m * sum(st.tp_comm_s for st in mine),
        "pp_comm_s": m * sum(st.p2p_s for st in mine),
        "dp_comm_s": dp_s,
        "optimizer_s": opt_s,
    }
    if cfg.cp > 1:
        breakdown["cp_comm_s"] = m * sum(st.cp_comm_s for st in mine)
    if cfg.ep * cfg.etp > 1:
        breakdown["ep_comm_s"] = m * sum(st.ep_comm_s for st in mine)
    breakdown["straggler_s"] = excess * (breakdown["compute_s"] + opt_s)
    model_flops = ma.train_flops_per_sample * training.global_batch
    ckpt = ma.checkpointed
    causal = 0.5 * float(np.sum(ma.work.attn_causal_flops[ckpt]))
    w = ma.work
    weight_gemms = w.mm_flops_tp + w.mm_flops_rep - w.fused_attn_flops_rep
    rc_flops = {"none": 0.0, "selective": float(np.sum(w.attn_flops[ckpt])) - causal,
                "full": float(np.sum(w.fwd_flops[ckpt])) - causal,
                "op": float(np.sum((weight_gemms * w.op_recompute_gemm_share)[ckpt]))
                }[cfg.recompute]
    rc_flops *= training.global_batch
    return Estimate(config=cfg, stages=stages,
                    step_time_s=pipe_s + dp_s + opt_s + breakdown["straggler_s"],
                    breakdown=breakdown, straggler_excess=excess,
                    peak_memory_bytes=max(r["total"] for r in ranks),
                    model_flops=model_flops, hardware_flops=model_flops + rc_flops,
                    cut_p2p_s=cut_p2p)


def idle_s(step_s: float, busy_s: float) -> float:
    """The pipeline's idle time: the step less the slowest rank's work, 0 when they differ only
    by floating-point rounding (a single stage)."""
    idle = step_s - busy_s
    return idle if idle > 1e-9 * step_s else 0.0


def weight_grad_s(st: StageEstimate) -> float:
    """The weight-gradient half of a chunk's backward (a GEMM's backward is two GEMMs of equal
    size: input gradient and weight gradient)."""
    return 0.5 * (st.compute_s - st.fwd_s - st.recompute_s)


def _p2p_sends(cfg: Config, bounds: list[int], ma, cluster: Cluster) -> list[float]:
    """Per chunk: seconds per micro-batch spent sending (its output forward, its input's
    gradient back). With tensor parallelism each rank sends 1/t of the activation and the receivers
    all-gather it inside the node (Megatron-LM's scatter-gather optimization)."""
    sends = [0.0] * (len(bounds) - 1)
    cuts = []
    for c in range(len(bounds) - 2):
        link = placement.link_between(cfg, cluster, c % cfg.pp, (c + 1) % cfg.pp)
        nbytes = ma.cut_bytes[bounds[c + 1] - 1] * cfg.micro_batch / (cfg.tp * cfg.cp)
        one_way = comm.p2p_s(nbytes, link)
        sends[c] += one_way  # activations forward
        sends[c + 1] += one_way  # gradients back
        cuts.append(one_way)
    return sends, cuts


def rank_memory(cfg: Config, bounds, stages, ma, costs, training: TrainingSpec) -> list[dict]:
    """Per pipeline rank: memory by kind; also fills each chunk's params, in_flight, memory."""
    out = []
    starts = np.asarray(bounds[:-1])
    assert all(b > a for a, b in zip(bounds, bounds[1:])), f"an empty chunk in {bounds}"
    # per chunk (one pass over the blocks each): sums and maxima the ranks add up below
    chunk_params = np.add.reduceat(costs.params_local, starts)
    chunk_experts = np.add.reduceat(costs.expert_params_local, starts)
    chunk_work = np.maximum.reduceat(costs.work_bytes, starts)
    chunk_largest = np.maximum.reduceat(costs.params_local, starts)
    chunk_split = np.add.reduceat(ma.work.param_tensors_tp, starts)
    chunk_rep = np.add.reduceat(ma.work.param_tensors_rep, starts)
    whole = memory.model_state_bytes(1.0, dtype=training.dtype, optimizer=training.optimizer,
                                     zero=0, dp=1, layout=training.engine.state_layout)
    # tied weights read by two blocks on one rank are held once
    owner = (np.searchsorted(bounds, np.arange(len(ma.names)), side="right") - 1) % cfg.pp
    tied = [0.0] * cfg.pp
    for i, j, n, split in ma.shared:
        if owner[i] == owner[j]:
            tied[owner[i]] += n / cfg.tp if split else n
    for r in range(cfg.pp):
        mine = [st for st in stages if st.rank == r]
        idx = [st.index for st in mine]
        params = float(chunk_params[idx].sum()) - tied[r]
        expert_params = float(chunk_experts[idx].sum())
        in_flight = pipeline.in_flight(cfg.schedule, stage=r, stages=cfg.pp,
                                       microbatches=cfg.num_microbatches, vpp=cfg.vpp)
        kw = dict(dtype=training.dtype, optimizer=training.optimizer, zero=cfg.zero,
                  offload=cfg.offload_optimizer, layout=training.engine.state_layout)
        states = memory.model_state_bytes(params - expert_params, dp=cfg.dp * cfg.cp, **kw)
        if expert_params:
            states = {k: v + memory.model_state_bytes(expert_params, dp=cfg.edp, **kw)[k]
                      for k, v in states.items()}
        act = in_flight * sum(st.act_bytes for st in mine)
        working = float(chunk_work[idx].max())
        largest = float(chunk_largest[idx].max())
        if cfg.zero == 3:  # the running and the prefetched block's weights, gathered
            working += 2 * whole["weights"] * largest
        if cfg.zero >= 2:  # a block's gradient, whole until its reduce-scatter is done
            working += whole["grads"] * largest
        mem = {**states, "activations": act, "working": working}
        mem["total"] = sum(mem.values())
        split = float(chunk_split[idx].sum())
        dtensors = (split + float(chunk_rep[idx].sum()) if cfg.dp > 1
                    else split if cfg.tp > 1 else 0.0)
        for st in mine:
            st.params, st.in_flight, st.memory = params, in_flight, mem
            st.expert_params = expert_params
            st.dtensor_params = dtensors
        out.append(mem)
    return out


def _dp_and_optimizer_s(cfg: Config, stages, ranks, cluster: Cluster, training: TrainingSpec):
    """Exposed data-parallel communication and the optimizer update; the slowest rank sets both."""
    group = placement.dp_group(cfg, cluster)
    expert_group = placement.edp_group(cfg, cluster)
    states = memory.model_state_bytes(1.0, dtype=training.dtype, optimizer=training.optimizer,
                                      zero=0, dp=1, layout=training.engine.state_layout)
    # gradients travel as they are kept: Megatron-Core's fp32 main gradients under bf16 (its
    # arguments.py sets accumulate_allreduce_grads_in_fp32 for bf16), the compute dtype otherwise
    grad_b = states["grads"]
    traffic = memory.optimizer_traffic_bytes(dtype=training.dtype, optimizer=training.optimizer,
                                             layout=training.engine.state_layout)
    refresh_b = precision.FP8_WEIGHT_REFRESH_BYTES if "fp8_weights" in states else 0.0
    dp_s = opt_s = 0.0
    for r in range(cfg.pp):
        mine = [st for st in stages if st.rank == r]
        params = mine[0].params
        expert_params = mine[0].expert_params
        compute_s = sum(st.compute_s for st in mine)
        backward_s = compute_s - sum(st.fwd_s for st in mine)
        exposed = exposed_dp_s(cfg, (params - expert_params) * grad_b, group, cluster, compute_s,
                               backward_s, training.engine.overlap_grad_reduce)
        if expert_params:  # the experts' gradients, over their own replicas, in the same window
            exposed = max(exposed, exposed_dp_s(
                cfg, expert_params * grad_b, expert_group, cluster, compute_s, backward_s,
                training.engine.overlap_grad_reduce))
        if training.engine.fsdp_copies:
            # the dense parameters: the experts' gradients are reduced apart (over edp)
            exposed += fsdp_copies_s(cfg, (params - expert_params) * grad_b, cluster.device)
        dp_s = max(dp_s, exposed)
        dense_shard = cfg.dp * cfg.cp if cfg.zero >= 1 else 1
        expert_shard = cfg.edp if cfg.zero >= 1 else 1
        local = (params - expert_params) / dense_shard + expert_params / expert_shard
        shard = params / local if local else 1.0
        if cfg.offload_optimizer:
            step = compute.offloaded_optimizer_step_s(
                params / shard, cluster.device, traffic_bytes_per_param=traffic,
                grad_bytes=DTYPE_BYTES[training.dtype], weight_bytes=DTYPE_BYTES[training.dtype])
        else:
            step = compute.optimizer_step_s(params / shard, cluster.device,
                                            traffic_bytes_per_param=traffic,
                                            dtensor_params=mine[0].dtensor_params)
        step += params * refresh_b / cluster.device.memory_bytes_per_s  # FP8 weight copies
        opt_s = max(opt_s, step)
    return dp_s, opt_s


def fsdp_copies_s(cfg: Config, nbytes: float, device) -> float:
    """Buffer copies of FSDP2-style data parallelism per step (EngineSpec.fsdp_copies), for
    ``nbytes`` of parameters (= of gradients) on the rank:

    - ZeRO-0 (replicate): gradients copied into the all-reduce buffer, scaled, copied back;
    - ZeRO-1/2: parameters copied out of the all-gather buffer (the local shard in), gradients
      copied into the reduce-scatter buffer, the shard scaled;
    - ZeRO-3: the same all-gathers before forward and backward and the reduce-scatter, per
      micro-batch."""
    replicas = cfg.dp * cfg.cp  # context-parallel ranks reduce their gradients the same way
    if replicas <= 1:
        return 0.0
    shard = 1.0 / replicas
    if cfg.zero == 0:
        copies = 3.0
    elif cfg.zero <= 2:
        copies = 2.0 + 2 * shard
    else:
        copies = cfg.num_microbatches * 3 * (1.0 + shard)
    return copies * compute.copy_s(nbytes, device)


def exposed_dp_s(cfg: Config, nbytes: float, group, cluster: Cluster, compute_s: float,
                 backward_s: float, overlap: bool) -> float:
    """Data-parallel traffic of one step that compute does not hide (Rajbhandari et al. 2020, §7):

    - ZeRO-0/1: gradients accumulate locally; one all-reduce (ZeRO-1: reduce-scatter + all-gather,
      the same ring volume) during the last micro-batch's backward.
    - ZeRO-2: gradients are reduce-scattered after every micro-batch's backward (they are kept
      sharded), and the updated weights all-gathered after the step.
    - ZeRO-3: weights are all-gathered before every micro-batch's forward and backward and
      gradients reduce-scattered after it, prefetched behind compute (FSDP).
    Without overlap every byte is exposed."""
    m = cfg.num_microbatches
    scatter = comm.reduce_scatter_s(nbytes, group, cluster)
    gather = comm.allgather_s(nbytes, group, cluster)
    if cfg.zero <= 1:  # ZeRO-1 runs the two halves as separate calls (backend speeds may differ)
        sync = comm.allreduce_s(nbytes, group, cluster) if cfg.zero == 0 else scatter + gather
        return max(0.0, sync - backward_s) if overlap else sync
    if cfg.zero == 2:
        per_mb = scatter
        return gather + (max(0.0, m * per_mb - m * backward_s) if overlap else m * per_mb)
    per_mb = 2 * gather + scatter
    return max(0.0, m * per_mb - m * compute_s) if overlap else m * per_mb
