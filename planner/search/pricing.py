"""Step time, breakdown and memory of a configuration whose stage (chunk) bounds are known."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from costmodels import compute, experts, memory, pipeline, precision
from costmodels.comm import GroupShape
from costmodels.topology import Cluster
from planner.options import Config, TrainingSpec
from planner.search import placement
from planner.search.costs import (deferred_sync, expert_deferred_sync, experts_dtype,
                                  fp8_copy_bytes_per_param,
                                  fsdp_pipelined, in_flight_per_rank, working_bytes)
from planner.search.dp_traffic import (DataParallelBytes, after_tied_sync, dp_floor_s, exposed_dp_s,
                                       fsdp_copies_s, window_use_s, windows_left)


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
    tp_fwd_comm_s: float
    """The forward pass's part of ``tp_comm_s`` (BlockCosts.tp_fwd_comm_s)."""
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
    wgrad_s: float = 0.0
    """The part of ``compute_s`` in weight-gradient GEMMs and their accumulation: what ZB-H1
    runs as W, apart from the input-gradient backward."""
    expert_params: float = 0.0
    """The part of ``params`` in routed experts (their states sharded over edp, their gradients
    reduced over it)."""
    frozen_params: float = 0.0
    """The part of ``params`` not trained (weights only: no gradients, optimizer states,
    gradient traffic or update)."""
    forward_only_params: float = 0.0
    """The part of ``params`` in blocks that run no backward (BlockWork.runs_backward): ZeRO-3
    gathers them before the forward only."""
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

    @property
    def rank(self) -> tuple[float, float]:
        """The search's order of preference: faster first; at the same step time (to 9
        significant digits, what sums in another order differ by), less memory per GPU."""
        return float(f"{self.step_time_s:.9g}"), self.peak_memory_bytes

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
    split = Split(cfg, bounds, ma, costs, training)
    return split.estimate(split.placed(cfg, cluster))


class Split:
    """What ``cfg`` costs with chunk ``c`` = blocks [bounds[c], bounds[c+1]) before its ranks are
    placed on nodes: per chunk (on pipeline rank c mod pp) the sums over its blocks, per rank its
    parameters and memory (RankMemory). ``placed`` adds what the placement changes (sends, expert
    dispatch, data-parallel traffic) and the step time; ``estimate`` makes the Estimate. A search
    prices one split under both placements, so the shared part is computed once; figures are
    numpy arrays over chunks or ranks, added in the order of the per-stage sums they replace."""

    def __init__(self, cfg: Config, bounds: list[int], ma, costs, training: TrainingSpec):
        assert all(b > a for a, b in zip(bounds, bounds[1:])), f"an empty chunk in {bounds}"
        self.cfg, self.bounds, self.ma, self.costs, self.training = cfg, bounds, ma, costs, training
        self.starts = np.asarray(bounds[:-1])
        m = cfg.num_microbatches  # gradients accumulate after every micro-batch but the first
        self.compute_s = self.per_chunk(costs.compute_s + costs.recompute_s
                                        + (m - 1) / m * costs.accumulate_s)
        self.tp_s, self.fwd_s = (self.per_chunk(costs.tp_comm_for(cfg.schedule)),
                                 self.per_chunk(costs.fwd_s))
        self.tp_fwd = self.per_chunk(costs.tp_fwd_comm_s)
        self.rc_s, self.act = self.per_chunk(costs.recompute_s), self.per_chunk(costs.act_bytes)
        self.cp_s = self.per_chunk(costs.cp_comm_s)
        self.wgrad_s = self.per_chunk(costs.weight_grad_s(m))
        self.ranks = RankMemory(cfg, bounds, self.act, ma, costs, training)
        self.rank_compute_s = rank_totals(self.compute_s, cfg.pp)
        self.rank_backward_s = self.rank_compute_s - rank_totals(self.fwd_s, cfg.pp)
        self._optimizer_s: float | None = None

    def per_chunk(self, x: np.ndarray) -> np.ndarray:
        """Sums of a per-block array over each chunk's blocks."""
        return np.add.reduceat(x, self.starts)

    def _expert_comm_s(self, cfg: Config, cluster: Cluster) -> np.ndarray:
        """Per chunk: the expert dispatch and combine it exposes (expert_comm_s), with its
        pipeline rank's own expert-parallel groups (placement.ep_groups)."""
        shapes = placement.ep_groups(cfg, cluster)
        by_shape: dict = {}
        out = np.empty(len(self.starts))
        for c in range(len(self.starts)):
            shape = shapes[c % cfg.pp]
            if shape not in by_shape:
                by_shape[shape] = self.per_chunk(expert_comm_s(cfg, self.ma, self.costs, cluster,
                                                               self.training, ep_group=shape))
            out[c] = by_shape[shape][c]
        return out

    @property
    def peak_memory_bytes(self) -> float:
        return self.ranks.peak

    def floor_s(self, device, rates: list[tuple]) -> float:
        """At most the step ``placed`` gives under any placement: the schedule's closed form on
        the chunks without what placement adds to them (sends, expert dispatch; each form grows
        with every chunk's time, and 1F1B's and ZB-H1's with each rank's forward, backward and
        weight-gradient parts), plus the optimizer step, which placement leaves alone. The
        data-parallel traffic adds its floor under the best of the placements whose ``rates``
        (dp_traffic.dp_rates) are given (dp_floor_s)."""
        cfg = self.cfg
        pp, m = cfg.pp, cfg.num_microbatches
        time_s = rank_totals(self.compute_s + self.tp_s + self.cp_s, pp).tolist()
        fwd, wgrad = None, 0.0
        if cfg.vpp == 1 and cfg.schedule in ("1f1b", "zb-h1"):
            share = pipeline.forward_comm_share(cfg.recompute)
            fwd = rank_totals(self.fwd_s + self.tp_fwd + share * self.cp_s, pp).tolist()
            if cfg.schedule == "zb-h1":
                wgrad = rank_totals(self.wgrad_s, pp).tolist()
        pipe_s = pipeline.step_time_s(time_s, microbatches=m, schedule=cfg.schedule, vpp=cfg.vpp,
                                      wgrad_s=wgrad, fwd_s=fwd)
        ranks = self.ranks
        dp_s = dp_floor_s(cfg.zero, m, ranks.params - ranks.expert_params
                          - (ranks.frozen - ranks.frozen_experts),
                          ranks.expert_params - ranks.frozen_experts, self.rank_compute_s, rates)
        return pipe_s + dp_s + self.optimizer_s(device)

    def optimizer_s(self, device) -> float:
        """The optimizer step of the slowest rank on ``device`` (found once: a search prices a
        split on one device type)."""
        if self._optimizer_s is None:
            self._optimizer_s = _optimizer_s(self.cfg, self, device, self.training)
        return self._optimizer_s

    def placed(self, cfg: Config, cluster: Cluster) -> "Placed":
        """The step under ``cfg``'s placement (``cfg`` is this split's, placement aside)."""
        training = self.training
        p2p_s, cut_s = _p2p_sends(cfg, self.bounds, self.ma, cluster)
        ep_s = self._expert_comm_s(cfg, cluster)
        dp_s, opt_s = _dp_and_optimizer_s(cfg, self, cluster, training)
        excess = compute.straggler_excess(cluster.device, cfg.dp * cfg.cp * cfg.tp * cfg.pp)
        time_s = self.compute_s + self.tp_s + p2p_s + self.cp_s + ep_s  # StageEstimate.time_s
        step_s, breakdown = closed_form(cfg, time_s, self.compute_s, self.fwd_s, self.wgrad_s,
                                        self.tp_s, p2p_s, self.cp_s, ep_s, dp_s, opt_s, excess,
                                        cut_s=cut_s, tp_fwd_s=self.tp_fwd)
        return Placed(cfg=cfg, p2p_s=p2p_s, cut_s=cut_s, ep_s=ep_s, step_time_s=step_s,
                      breakdown=breakdown, excess=excess)

    def estimate(self, placed: "Placed") -> Estimate:
        cfg, pp, ranks = placed.cfg, placed.cfg.pp, self.ranks
        memories = ranks.dicts()
        params, experts_, dtensors = (ranks.params.tolist(), ranks.expert_params.tolist(),
                                      ranks.dtensors.tolist())
        frozen, forward_only = ranks.frozen.tolist(), ranks.forward_only.tolist()
        compute_s, tp_s, p2p_s = self.compute_s.tolist(), self.tp_s.tolist(), placed.p2p_s.tolist()
        fwd_s, rc_s, act = self.fwd_s.tolist(), self.rc_s.tolist(), self.act.tolist()
        cp_s, ep_s, names = self.cp_s.tolist(), placed.ep_s.tolist(), self.ma.names
        wgrad_s, tp_fwd = self.wgrad_s.tolist(), self.tp_fwd.tolist()
        stages = [StageEstimate(index=c, rank=c % pp, blocks=names[a:b], compute_s=compute_s[c],
                                tp_comm_s=tp_s[c], tp_fwd_comm_s=tp_fwd[c], p2p_s=p2p_s[c],
                                params=params[c % pp],
                                in_flight=ranks.in_flight[c % pp], memory=memories[c % pp],
                                fwd_s=fwd_s[c], recompute_s=rc_s[c], act_bytes=act[c],
                                cp_comm_s=cp_s[c], ep_comm_s=ep_s[c], wgrad_s=wgrad_s[c],
                                expert_params=experts_[c % pp], dtensor_params=dtensors[c % pp],
                                frozen_params=frozen[c % pp],
                                forward_only_params=forward_only[c % pp])
                  for c, (a, b) in enumerate(zip(self.bounds, self.bounds[1:]))]
        model_flops, hardware_flops = step_flops(self.ma, cfg, self.training)
        return Estimate(config=cfg, stages=stages, step_time_s=placed.step_time_s,
                        breakdown=placed.breakdown, straggler_excess=placed.excess,
                        peak_memory_bytes=ranks.peak, model_flops=model_flops,
                        hardware_flops=hardware_flops, cut_p2p_s=placed.cut_s.tolist())


@dataclass
class Placed:
    """A Split under one placement: per chunk its sends and expert dispatch, and the step."""

    cfg: Config
    p2p_s: np.ndarray
    cut_s: np.ndarray
    ep_s: np.ndarray
    step_time_s: float
    breakdown: dict
    excess: float


def rank_totals(x: np.ndarray, pp: int) -> np.ndarray:
    """Per pipeline rank r: x[r] + x[r + pp] + ..., added in that order (as ``sum`` adds a
    rank's chunks)."""
    if len(x) % pp:
        return np.array([sum(x[r::pp].tolist()) for r in range(pp)])
    rows = x.reshape(-1, pp)
    total = 0.0 + rows[0]
    for row in rows[1:]:
        total = total + row
    return total


def rank_sums(x: np.ndarray, pp: int) -> np.ndarray:
    """Per pipeline rank r: numpy's sum of x[r], x[r + pp], ... (``x[[r, r + pp, ...]].sum()``,
    whose order of additions differs from ``rank_totals`` from eight chunks on)."""
    if len(x) % pp:
        return np.array([x[r::pp].sum() for r in range(pp)])
    return np.ascontiguousarray(x.reshape(-1, pp).T).sum(axis=1)


def rank_max(x: np.ndarray, pp: int) -> np.ndarray:
    """Per pipeline rank r: the largest of x[r], x[r + pp], ..."""
    if len(x) % pp:
        return np.array([x[r::pp].max() for r in range(pp)])
    return x.reshape(-1, pp).max(axis=0)


def chunks(cfg: Config, bounds: list[int], ma, costs, p2p_out: list[float]) -> list[StageEstimate]:
    """One StageEstimate per chunk, from per-block costs (memory filled in by rank_memory), with
    no expert dispatch (Split prices it per pipeline rank: Split._expert_comm_s)."""
    starts = np.asarray(bounds[:-1])
    assert all(b > a for a, b in zip(bounds, bounds[1:])), f"an empty chunk in {bounds}"

    def per_chunk(x: np.ndarray) -> list[float]:  # sums over each chunk's blocks
        return np.add.reduceat(x, starts).tolist()

    m = cfg.num_microbatches  # as Split: accumulation after every micro-batch but the first
    compute_s = per_chunk(costs.compute_s + costs.recompute_s + (m - 1) / m * costs.accumulate_s)
    tp_s, fwd_s, rc_s = per_chunk(costs.tp_comm_for(cfg.schedule)), per_chunk(costs.fwd_s), \
        per_chunk(costs.recompute_s)
    tp_fwd = per_chunk(costs.tp_fwd_comm_s)
    act, cp_s = per_chunk(costs.act_bytes), per_chunk(costs.cp_comm_s)
    wgrad_s = per_chunk(costs.weight_grad_s(m))
    return [StageEstimate(index=c, rank=c % cfg.pp, blocks=ma.names[a:b], compute_s=compute_s[c],
                          tp_comm_s=tp_s[c], tp_fwd_comm_s=tp_fwd[c], p2p_s=p2p_out[c],
                          params=0.0, in_flight=0.0,
                          fwd_s=fwd_s[c], recompute_s=rc_s[c], act_bytes=act[c],
                          cp_comm_s=cp_s[c], ep_comm_s=0.0, wgrad_s=wgrad_s[c])
            for c, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def expert_comm_s(cfg: Config, ma, costs, cluster: Cluster, training: TrainingSpec, *,
                  ep_group: GroupShape) -> np.ndarray:
    """Per block: seconds of the routed tokens' dispatch and combine it exposes per micro-batch
    with the expert-parallel group ``ep_group`` (one pipeline rank's: placement.ep_groups) on
    this configuration's placement (costmodels.experts.block_dispatch_s)."""
    if cfg.ep * cfg.etp <= 1 or not np.any(ma.work.dispatch_bytes):
        return np.zeros(len(ma.names))
    w = ma.work
    engine = training.engine
    if engine.moe_overlap and experts.overlap_blockers(
            engine, ep=cfg.ep, recompute=cfg.recompute, dtype=training.dtype, pp=cfg.pp,
            vpp=cfg.vpp):
        engine = replace(engine, moe_overlap=False)
    return experts.block_dispatch_s(
        engine, dispatch_bytes=w.dispatch_bytes, routed_tokens=w.routed_tokens,
        seq_len=training.seq_len, share=cfg.micro_batch / (cfg.tp * cfg.cp), ep=cfg.ep,
        ep_group=ep_group,
        etp_group=placement.etp_group(cfg, cluster),
        cluster=cluster,
        recompute_full=[engine.replays_forward(r) for r in memory.layer_policies(
            ma.checkpointed, cfg.recompute)] if memory.layer_interval(cfg.recompute)
        else engine.replays_forward(cfg.recompute),
        fwd_s=costs.fwd_s,
        bwd_s=costs.backward_pass_s, num_experts=w.num_experts,
        shared_fwd_s=costs.shared_fwd_s, shared_bwd_s=costs.shared_bwd_s,
        moe_layers=w.moe_layers, micro_batches=cfg.num_microbatches, pp=cfg.pp, vpp=cfg.vpp,
        capacity=w.expert_capacity, groups=w.expert_groups,
        group_topk=w.expert_groups_per_token)


def assemble(cfg: Config, stages, ranks, dp_s: float, opt_s: float, ma, training: TrainingSpec,
             cut_p2p: list[float], *, excess: float = 0.0) -> Estimate:
    """Pipeline time (closed form), breakdown along the slowest rank, FLOPs: the Estimate.
    ``excess``: the straggler share of local work (pricing.Estimate.straggler_excess)."""
    def arr(attr: str) -> np.ndarray:
        return np.array([getattr(st, attr) for st in stages], dtype=float)

    step_s, breakdown = closed_form(cfg, arr("time_s"), arr("compute_s"), arr("fwd_s"),
                                    arr("wgrad_s"), arr("tp_comm_s"), arr("p2p_s"), arr("cp_comm_s"),
                                    arr("ep_comm_s"), dp_s, opt_s, excess,
                                    cut_s=np.asarray(cut_p2p, dtype=float),
                                    tp_fwd_s=arr("tp_fwd_comm_s"))
    model_flops, hardware_flops = step_flops(ma, cfg, training)
    return Estimate(config=cfg, stages=stages, step_time_s=step_s, breakdown=breakdown,
                    straggler_excess=excess, peak_memory_bytes=max(r["total"] for r in ranks),
                    model_flops=model_flops, hardware_flops=hardware_flops, cut_p2p_s=cut_p2p)


def closed_form(cfg: Config, time_s, compute_s, fwd_s, wgrad_s, tp_s, p2p_s, cp_s, ep_s,
                dp_s: float, opt_s: float, excess: float,
                cut_s: np.ndarray | None = None, tp_fwd_s=None) -> tuple[float, dict]:
    """(step seconds, breakdown along the slowest rank) from per-chunk arrays (``time_s``: each
    chunk's StageEstimate.time_s) and the step's data-parallel and optimizer seconds.

    Pipeline sends count once, in the pipeline's fill and drain: one micro-batch's sends through
    every chunk, forward and back; and a link between neighbouring ranks carries one send at a
    time, so the pipeline takes at least every micro-batch's sends over its busiest link (``cut_s``:
    one send over each cut between chunks; with interleaving, cuts c, c + pp, ... share rank c's
    link), and one micro-batch's passes before and after them (under GPipe every micro-batch's
    forward crosses a cut before the first backward does: twice the sends); under 1F1B and ZB-H1,
    whose first rank holds pp micro-batches at most, every pp-th micro-batch waits for the round
    trip of the one before, sends included; and 1F1B's rank-by-rank form counts the sends in
    each rank's waits for the round trip through the ranks after it (pipeline.one_f_one_b_s with
    ``sends_s``). The schedule's simulation (refine.simulated), which
    times the plans the search keeps, overlaps sends with other passes' compute and queues them
    on their links, and exposes at least that much: this closed form stays at or below it where
    the sends are concerned, so that the search re-times every configuration that could beat the
    best simulated one (loop._retime). ``tp_fwd_s``: per chunk, the forward pass's part of
    ``tp_s`` (half where not given)."""
    pp, m = cfg.pp, cfg.num_microbatches
    time_s = time_s - p2p_s
    rank_time = rank_totals(time_s, pp)
    slow = int(np.argmax(rank_time))

    def mine(x: np.ndarray) -> float:  # over the slowest rank's chunks
        return sum(x[slow::pp].tolist())

    fwd, wgrad = None, 0.0
    if cfg.vpp == 1 and cfg.schedule in ("1f1b", "zb-h1"):  # rank by rank, each rank's forward
        # (and ZB-H1's weight gradients) as the simulation splits them (refine.simulated)
        share = pipeline.forward_comm_share(cfg.recompute)
        tp_f = tp_s / 2 if tp_fwd_s is None else tp_fwd_s
        fwd = rank_totals(fwd_s + tp_f + share * (cp_s + ep_s), pp).tolist()
        if cfg.schedule == "zb-h1":
            wgrad = rank_totals(wgrad_s, pp).tolist()
    pipe_s = pipeline.step_time_s(rank_time.tolist(), microbatches=m, schedule=cfg.schedule,
                                  vpp=cfg.vpp, wgrad_s=wgrad, fwd_s=fwd)
    breakdown = {
        "compute_s": m * mine(compute_s),
        "bubble_s": idle_s(pipe_s, m * float(rank_time[slow])),
        "tp_comm_s": m * mine(tp_s),
        "pp_comm_s": sum(p2p_s.tolist()),
        "dp_comm_s": dp_s,
        "optimizer_s": opt_s,
    }
    if cfg.cp > 1:
        breakdown["cp_comm_s"] = m * mine(cp_s)
    if cfg.ep * cfg.etp > 1:
        breakdown["ep_comm_s"] = m * mine(ep_s)
    if cut_s is not None and len(cut_s):
        # the busiest link, each way, carries m sends of its cuts; before its first send the
        # first micro-batch runs forward up to it, after its last the last micro-batch runs
        # backward through every chunk (and, with one cut per link, forward past it)
        load = float(np.bincount(np.arange(len(cut_s)) % pp, weights=cut_s).max())
        # (the weight gradients of ZB-H1 may wait: its input-gradient backward only)
        held_back = float(np.sum(wgrad_s)) if cfg.schedule == "zb-h1" else 0.0
        one_pass = (float(np.sum(compute_s)) if cfg.vpp == 1 else float(np.sum(compute_s - fwd_s))
                    ) - held_back
        floor = m * load + one_pass
        if cfg.vpp == 1 and cfg.schedule == "gpipe":  # every forward crosses before any backward
            floor = 2 * m * load + one_pass
        if cfg.vpp == 1 and cfg.schedule in ("1f1b", "zb-h1"):
            # rank 0 starts micro-batch i + k only after micro-batch i came back (k = pp in
            # flight): a chain of ceil(m / k) round trips, each every chunk's forward and input-
            # gradient backward and a send over every cut each way
            k = min(pp, m)
            trip = float(np.sum(time_s)) - held_back
            floor = max(floor, -(-m // k) * (trip + 2 * float(np.sum(cut_s))))
        if fwd is not None:  # rank by rank, each wait with its sends
            floor = max(floor, pipeline.step_time_s(
                rank_time.tolist(), microbatches=m, schedule=cfg.schedule, wgrad_s=wgrad,
                fwd_s=fwd, sends_s=cut_s.tolist()))
        if floor - pipe_s > breakdown["pp_comm_s"] * (1 + 1e-9):  # (not by rounding alone)
            breakdown["pp_comm_s"] = floor - pipe_s
    breakdown["straggler_s"] = excess * (breakdown["compute_s"] + opt_s)
    return pipe_s + breakdown["pp_comm_s"] + dp_s + opt_s + breakdown["straggler_s"], breakdown


def step_flops(ma, cfg: Config, training: TrainingSpec) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of a step: forward and backward of the global batch, and
    those plus the forward recomputed under ``cfg.recompute``, capacity-style experts' empty
    slots and the slots an engine pads every expert's input to (_padded_slots_flops)."""
    model_flops = ma.train_flops_per_sample * training.global_batch
    rc_flops = ma.flops_memo.get(cfg.recompute)
    if rc_flops is None:
        rc_flops = ma.flops_memo[cfg.recompute] = _recomputed_flops(ma, cfg.recompute)
    padded = _padded_slots_flops(ma, cfg.recompute, training.engine)
    return model_flops, model_flops + (rc_flops + ma.padding_flops_per_sample + padded) * \
        training.global_batch


def _padded_slots_flops(ma, recompute: str, engine) -> float:
    """FLOPs per sample of the token slots an engine pads every routed expert's input to beyond
    the tokens routed to it (EngineSpec.moe_pad_to_capacity: the capacity factor times the
    mean, where the routed copies average the mean), in forward, backward and the forward
    ``recompute`` runs again; capacity-style experts' slots are traced and counted apart."""
    if not engine.moe_pad_to_capacity:
        return 0.0
    w = ma.work
    routed = np.where(w.expert_capacity > 0, 0.0, w.expert_flops)
    # full and op-level recomputation both run the routed experts' forward again (op-level saves
    # no grouped GEMM's output: planner.trace.annotate._op_level_checkpointing)
    again = ma.recomputed(recompute) * 1.0 if recompute in ("full", "op") \
        or memory.layer_interval(recompute) else 0.0
    return (engine.moe_capacity_factor - 1.0) * float(np.sum(routed * (3.0 + again)))


def _recomputed_flops(ma, recompute: str) -> float:
    """Forward FLOPs per sample that ``recompute`` runs again."""
    modules = memory.modules_of(recompute)
    if recompute == "none" or modules:  # moe_act: memory-bound ops only
        return float(np.sum(ma.work.mla_up_flops[ma.checkpointed])) \
            if "mla_up_proj" in modules else 0.0  # latent attention's up projections
    w = ma.work
    ckpt = ma.recomputed(recompute) if memory.layer_interval(recompute) else ma.checkpointed
    masked = float(np.sum(w.masked_attn_flops[ckpt]))  # what a masked kernel skips
    if recompute == "selective":  # the attention cores, split by tp or not
        return float(np.sum((w.attn_flops + w.fused_attn_flops_rep + w.eager_attn_flops_rep)
                            [ckpt])) - masked
    if recompute == "full" or memory.layer_interval(recompute):
        return float(np.sum(w.fwd_flops[ckpt])) - masked
    if recompute == "op":
        weight_gemms = (w.mm_flops_tp + w.mm_flops_rep - w.fused_attn_flops_rep
                        - w.eager_attn_flops_rep)
        dense = weight_gemms - w.expert_flops  # routed experts' GEMMs: recomputed whole
        return float(np.sum((dense * w.op_recompute_gemm_share + w.expert_flops)[ckpt]))
    raise KeyError(recompute)


def idle_s(step_s: float, busy_s: float) -> float:
    """The pipeline's idle time: the step less the slowest rank's work, 0 when they differ only
    by floating-point rounding (a single stage)."""
    idle = step_s - busy_s
    return idle if idle > 1e-9 * step_s else 0.0


def weight_grad_s(st: StageEstimate) -> float:
    """The weight-gradient part of a chunk's backward (StageEstimate.wgrad_s)."""
    return st.wgrad_s


def _p2p_sends(cfg: Config, bounds: list[int], ma, cluster: Cluster) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """(per chunk: seconds per micro-batch spent sending (its output forward, its input's
    gradient back, none after a block that runs forward only: BlockWork.runs_backward), per
    cut: one send). With tensor parallelism each rank sends 1/t of the activation and the
    receivers all-gather it inside the node (Megatron-LM's scatter-gather optimization)."""
    n = len(bounds) - 1
    sends = np.zeros(n)
    if n < 2:
        return sends, np.zeros(0)
    crosses = placement.next_rank_crosses(cfg, cluster)[np.arange(n - 1) % cfg.pp]
    inter, intra = cluster.inter_node, cluster.intra_node
    latency = np.where(crosses, inter.message_sync_s + inter.message_latency_s,
                       intra.message_sync_s + intra.message_latency_s)
    speed = np.where(crosses, inter.message_bytes_per_s, intra.message_bytes_per_s)
    nbytes = ma.cut_bytes[np.asarray(bounds[1:-1]) - 1] * cfg.micro_batch / (cfg.tp * cfg.cp)
    one_way = np.where(nbytes > 0, latency + nbytes / speed, 0.0)  # comm.p2p_s
    sends[:-1] += one_way  # activations forward
    sends[1:] += one_way * ma.work.runs_backward[np.asarray(bounds[1:-1]) - 1]  # gradients back
    return sends, one_way


class RankMemory:
    """Per pipeline rank (numpy arrays over ranks): parameters held, micro-batches in flight,
    memory by kind, DTensor parameter tensors; ``act``: per chunk, one micro-batch's activation
    bytes."""

    def __init__(self, cfg: Config, bounds, act: np.ndarray, ma, costs, training: TrainingSpec):
        pp = cfg.pp
        starts = np.asarray(bounds[:-1])
        # per chunk (one pass over the blocks each): sums and maxima the ranks add up below
        chunk_work = np.maximum.reduceat(working_bytes(cfg, costs, training), starts)
        chunk_split = np.add.reduceat(ma.work.param_tensors_tp, starts)
        chunk_rep = np.add.reduceat(ma.work.param_tensors_rep, starts)
        kw = dict(dtype=training.dtype, optimizer=training.optimizer, zero=cfg.zero,
                  offload=cfg.offload_optimizer, layout=training.engine.state_layout,
                  fp8_copies=training.engine.fp8_copies)
        owner = (np.searchsorted(bounds, np.arange(len(ma.names)), side="right") - 1) % pp
        layer, backward = ma.checkpointed, ma.work.runs_backward

        def held(per_block, tie=lambda i, j, frozen: True) -> np.ndarray:
            """Per rank: ``per_block`` summed over its blocks, each tied weight both of whose
            readers are on the rank held once where ``tie`` (first reader, other, frozen)
            says it counts in ``per_block``."""
            tied = np.zeros(pp)
            for i, j, n, split, frozen in ma.shared:
                if owner[i] == owner[j] and tie(i, j, frozen):
                    tied[owner[i]] += n / cfg.tp if split else n
            return rank_sums(np.add.reduceat(per_block, starts), pp) - tied

        idle = 1.0 - backward  # blocks that run forward only
        outer = np.where(layer, 0.0, costs.params_local - costs.expert_params_local)
        self.params = held(costs.params_local)
        self.expert_params = rank_sums(np.add.reduceat(costs.expert_params_local, starts), pp)
        self.frozen = held(costs.frozen_local, lambda i, j, frozen: frozen)
        """Of ``params``, those not trained (weights only: no gradient, traffic or update)."""
        self.ties = [(int(owner[i]), int(owner[j]), n / cfg.tp if split else n)
                     for i, j, n, split, frozen in ma.shared if owner[i] != owner[j] and not frozen]
        """Trained tied weights read on two ranks: (rank, other rank, parameters each holds)."""
        self.frozen_experts = rank_sums(np.add.reduceat(costs.frozen_expert_local, starts), pp)
        """Of ``expert_params``, those not trained."""
        # (a tie is gathered for a backward if either reader runs one)
        self.forward_only = np.maximum(0.0, held(costs.params_local * idle, lambda i, j, _: not (
            backward[i] and backward[j])))
        """Of ``params``, those in blocks that run forward only (frozen with nothing trained
        before them: ZeRO-3 gathers them before the forward only)."""
        self.forward_only_experts = rank_sums(
            np.add.reduceat(costs.expert_params_local * idle, starts), pp)
        """Of ``expert_params``, those in blocks that run forward only."""
        # (a tie held once keeps an FP8 copy only where layers alone read it)
        self.outer_params = np.maximum(0.0, held(outer, lambda i, j, _: not (layer[i] and
                                                                             layer[j])))
        """Dense parameters outside the repeated layers (embedding, output projection) that no
        layer reads: under fp8 their GEMMs stay 16-bit (costmodels.precision), so they keep no
        FP8 copies (costs.block_state_bytes, for the stage split)."""
        self.outer_frozen = np.maximum(0.0, held(
            np.where(layer, 0.0, costs.frozen_local - costs.frozen_expert_local),
            lambda i, j, frozen: frozen and not (layer[i] and layer[j])))
        """Of ``outer_params``, those not trained."""
        self.in_flight = in_flight_per_rank(cfg.schedule, pp, cfg.num_microbatches, cfg.vpp)
        """Per rank, as costmodels.pipeline.in_flight gives it (an int or a float)."""
        deferred = deferred_sync(cfg, training)
        states = memory.model_state_bytes(self.params - self.expert_params, dp=cfg.dp * cfg.cp,
                                          **kw, deferred=deferred,
                                          frozen=self.frozen - self.frozen_experts)
        has_experts = self.expert_params != 0
        if has_experts.any():  # the experts' states, sharded over their own replicas
            expert_states = memory.model_state_bytes(
                self.expert_params, dp=cfg.edp, **{**kw, "dtype": experts_dtype(training)},
                deferred=expert_deferred_sync(cfg, training), frozen=self.frozen_experts)
            states = {k: np.where(has_experts, v + expert_states.get(k, 0.0), v)
                      for k, v in states.items()}
        if "fp8_weights" in states:
            states["fp8_weights"] = states["fp8_weights"] - \
                self.outer_params * fp8_copy_bytes_per_param(cfg, training)
        working = rank_max(chunk_work, pp)  # with ZeRO-2/3's whole gradient and gathered weights
        self.memory = {**states, "activations": np.array(self.in_flight, dtype=float)
                       * rank_totals(act, pp), "working": working}
        """Bytes per rank by kind, and their total."""
        total = 0.0
        for v in self.memory.values():
            total = total + v
        self.memory["total"] = total
        self.peak = float(np.max(total))
        split = rank_sums(chunk_split, pp)
        self.dtensors = (split + rank_sums(chunk_rep, pp) if cfg.dp > 1
                         else split if cfg.tp > 1 else np.zeros(pp))

    def dicts(self) -> list[dict]:
        """Per rank: memory by kind (bytes)."""
        columns = {k: v.tolist() for k, v in self.memory.items()}
        return [{k: v[r] for k, v in columns.items()} for r in range(len(self.in_flight))]

    def fill(self, stages, dicts: list[dict]) -> None:
        """Each chunk's params, in_flight, memory, expert_params, frozen_params, dtensor_params
        from its rank."""
        params, experts_ = self.params.tolist(), self.expert_params.tolist()
        dtensors, frozen = self.dtensors.tolist(), self.frozen.tolist()
        forward_only = self.forward_only.tolist()
        for st in stages:
            r = st.rank
            st.params, st.in_flight, st.memory = params[r], self.in_flight[r], dicts[r]
            st.expert_params, st.dtensor_params = experts_[r], dtensors[r]
            st.frozen_params, st.forward_only_params = frozen[r], forward_only[r]


def rank_memory(cfg: Config, bounds, stages, ma, costs,
                training: TrainingSpec) -> tuple[list[dict], RankMemory]:
    """Per pipeline rank: memory by kind, and the RankMemory it came from; also fills each
    chunk's params, in_flight, memory."""
    ranks = RankMemory(cfg, bounds, np.array([st.act_bytes for st in stages], dtype=float), ma,
                       costs, training)
    out = ranks.dicts()
    ranks.fill(stages, out)
    return out, ranks


def _dp_and_optimizer_s(cfg: Config, split: Split, cluster: Cluster, training: TrainingSpec):
    """Exposed data-parallel communication and the optimizer update; the slowest rank sets both
    (per rank as numpy arrays)."""
    group = placement.dp_group(cfg, cluster)
    expert_group = placement.edp_group(cfg, cluster)
    per = DataParallelBytes.of(training)
    ranks = split.ranks
    params, expert_params = ranks.params, ranks.expert_params
    frozen, frozen_experts = ranks.frozen, ranks.frozen_experts
    idle = ranks.forward_only - ranks.forward_only_experts  # dense ones in forward-only blocks
    idle_experts = ranks.forward_only_experts
    compute_s, backward_s = split.rank_compute_s, split.rank_backward_s
    overlap = training.engine.overlaps_reduction(zero=cfg.zero, pp=cfg.pp)
    gathers = training.engine.overlap_param_gather
    pipelined = fsdp_pipelined(cfg, training)
    dense, frozen_dense = params - expert_params, frozen - frozen_experts
    exposed = exposed_dp_s(cfg, dense, per, group, cluster, compute_s, backward_s, overlap,
                           pipelined=pipelined, gather_overlap=gathers, frozen=frozen_dense,
                           forward_only=idle)
    has_experts = expert_params != 0
    if has_experts.any():
        # the experts' gradients, over their own replicas, after the dense ones on the same links:
        # they get what the dense traffic leaves of the windows that hide it
        left_compute, left_backward = windows_left(compute_s, backward_s, window_use_s(
            cfg, dense, per, group, cluster, pipelined=pipelined, gather_overlap=gathers,
            frozen=frozen_dense, forward_only=idle))
        exposed = exposed + np.where(has_experts, exposed_dp_s(
            cfg, expert_params, per, expert_group, cluster, left_compute, left_backward,
            overlap, pipelined=pipelined, gather_overlap=gathers, frozen=frozen_experts,
            forward_only=idle_experts),
            0.0)
    if training.engine.fsdp_copies:
        # FSDP2 copies what it wraps: the dense parameters, and the experts too without expert
        # parallelism; with ep > 1 the experts over edp in an FSDP2 of their own
        # (EngineSpec.fsdp_experts), or not at all (reduced apart, in place)
        wrapped, held, idle_held = ((dense, frozen_dense, idle) if cfg.ep > 1
                                    else (params, frozen, ranks.forward_only))
        exposed = exposed + np.array([fsdp_copies_s(cfg, n, per, cluster.device,
                                                    pipelined=pipelined, frozen=f, forward_only=o)
                                      for n, f, o in zip(wrapped.tolist(), held.tolist(),
                                                         idle_held.tolist())])
        if cfg.ep > 1 and training.engine.fsdp_experts:
            exposed = exposed + np.array([fsdp_copies_s(cfg, n, per, cluster.device,
                                                        pipelined=pipelined, replicas=cfg.edp,
                                                        frozen=f, forward_only=o)
                                          for n, f, o in zip(expert_params.tolist(),
                                                             frozen_experts.tolist(),
                                                             idle_experts.tolist())])
    exposed = after_tied_sync(exposed, ranks.ties, per,
                              lambda a, b: placement.link_between(cfg, cluster, a, b))
    return max(0.0, float(np.max(exposed))), split.optimizer_s(cluster.device)


def _optimizer_s(cfg: Config, split: Split, device, training: TrainingSpec) -> float:
    """The optimizer update of the slowest rank, the FP8 weight copies' refresh included."""
    per = DataParallelBytes.of(training)
    traffic = memory.optimizer_traffic_bytes(dtype=training.dtype, optimizer=training.optimizer,
                                             layout=training.engine.state_layout)
    ranks = split.ranks
    # frozen parameters are not updated (nor, under fp8, their FP8 copies refreshed)
    params = ranks.params - ranks.frozen
    expert_params = ranks.expert_params - ranks.frozen_experts
    dense = params - expert_params
    dense_shard = cfg.dp * cfg.cp if cfg.zero >= 1 else 1
    expert_shard = cfg.edp if cfg.zero >= 1 else 1
    local = dense / dense_shard + expert_params / expert_shard
    with np.errstate(divide="ignore", invalid="ignore"):
        shard = np.where(local != 0, params / local, 1.0)
    if cfg.offload_optimizer:
        # gradients leave as the layout keeps them, 16-bit weights come back
        step = compute.offloaded_optimizer_step_s(
            params / shard, device, traffic_bytes_per_param=traffic,
            grad_bytes=per.grads, weight_bytes=per.weights)
    else:
        step = compute.optimizer_step_s(params / shard, device,
                                        traffic_bytes_per_param=traffic,
                                        dtensor_params=ranks.dtensors)
    step = step + fp8_refresh_s(ranks, training, device)
    return max(0.0, float(np.max(step)))


def fp8_refresh_s(ranks: RankMemory, training: TrainingSpec, device) -> np.ndarray:
    """Per pipeline rank: refreshing the FP8 copies of the layers' trained weights from the
    16-bit ones after the optimizer update (none of the routed experts' where they stay 16-bit:
    EngineSpec.fp8_experts), at ``device``'s memory bandwidth; zeros without FP8 copies."""
    states = memory.model_state_bytes(1.0, dtype=training.dtype, optimizer=training.optimizer,
                                      zero=0, dp=1, layout=training.engine.state_layout,
                                      fp8_copies=training.engine.fp8_copies)
    if "fp8_weights" not in states:
        return np.zeros_like(ranks.params)
    layers = (ranks.params - ranks.outer_params) - (ranks.frozen - ranks.outer_frozen)
    if not training.engine.fp8_experts:
        layers = layers - (ranks.expert_params - ranks.frozen_experts)
    return np.maximum(0.0, layers) * precision.FP8_WEIGHT_REFRESH_BYTES / device.memory_bytes_per_s
