"""Data-parallel traffic: the bytes a step's gradient reduction and weight gathers move, how much
of that compute hides under each ZeRO stage and engine (exposed_dp_s, after Rajbhandari et al.
2020), FSDP2's copies, the search's lower bound of what stays exposed (dp_floor_s), and the
tied weights' gradient all-reduce between the pipeline ranks that read them, after it
(after_tied_sync). planner.search.pricing adds it up per pipeline rank."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels import comm, compute, memory, precision
from costmodels.hardware import DTYPE_BYTES
from costmodels.topology import Cluster
from planner.options import Config, TrainingSpec
from planner.search import placement
from planner.search.costs import fsdp_pipelined


def fsdp_copies_s(cfg: Config, params: float, per: "DataParallelBytes", device, *,
                  pipelined: bool = False, replicas: int | None = None,
                  frozen: float = 0.0, forward_only: float = 0.0) -> float:
    """Buffer copies of FSDP2-style data parallelism per step (EngineSpec.fsdp_copies), for
    ``params`` parameters on the rank, each copy of their weights or gradients at the bytes data
    parallelism moves them in (``per``):

    - ZeRO-0 (replicate): gradients copied into the all-reduce buffer, scaled, copied back;
    - ZeRO-1/2: parameters copied out of the all-gather buffer (the local shard in), gradients
      copied into the reduce-scatter buffer, the shard scaled; ZeRO-2 reduce-scatters after every
      micro-batch's backward, as exposed_dp_s counts;
    - ZeRO-3: the same all-gathers before forward and backward and the reduce-scatter, per
      micro-batch; ``pipelined`` (costs.fsdp_pipelined): as many all-gathers as exposed_dp_s
      counts, and one reduce-scatter (ZeRO-2 too).

    ``replicas``: the ranks holding copies of these parameters (default dp x cp: context-parallel
    ranks reduce their gradients the same way; the experts' edp). ``frozen`` of the ``params``
    have no gradients (nor weights to gather where the engine keeps them whole):
    frozen_traffic; ``forward_only`` of those sit in blocks that run no backward, which ZeRO-3
    gathers before the forward only."""
    if replicas is None:
        replicas = cfg.dp * cfg.cp
    if replicas <= 1:
        return 0.0
    shard = 1.0 / replicas
    if cfg.zero == 0:
        weights, grads = 0.0, 3.0
    elif cfg.zero <= 2:
        scatters = cfg.num_microbatches if cfg.zero == 2 and not pipelined else 1
        weights, grads = 1.0 + shard, scatters * (1.0 + shard)
    else:
        gathers, scatters = zero3_calls(cfg.num_microbatches, pipelined)
        weights, grads = gathers * (1.0 + shard), scatters * (1.0 + shard)
    reduced, gathered = frozen_traffic(cfg.zero, params, frozen, per)
    copies = weights * compute.copy_s(gathered * per.weights, device)
    if cfg.zero == 3 and not pipelined and forward_only:  # half of them before the backwards
        copies -= weights / 2 * compute.copy_s(forward_only * per.weights, device)
    return copies + grads * compute.copy_s(reduced * per.grads, device)


def _moved(collective, nbytes, group, cluster: Cluster):
    """``collective``'s seconds for ``nbytes`` (a number or numpy array), none where there is
    nothing to move (a rank whose parameters are all frozen issues no gradient collective)."""
    return collective(nbytes, group, cluster) * (nbytes > 0)


def frozen_traffic(zero: int, params, frozen, per: "DataParallelBytes"):
    """(parameters whose gradients are reduced, parameters whose weights are all-gathered) of
    ``params`` with ``frozen`` of them not trained: a frozen weight has no gradient and, never
    updated, is gathered only where the weights themselves are kept sharded
    (DataParallelBytes.frozen_gathered_from)."""
    trained = params - frozen
    return trained, (params if zero >= per.frozen_gathered_from else trained)


@dataclass(frozen=True)
class DataParallelBytes:
    """Bytes per parameter that data parallelism moves: gradients reduced (all-reduce or
    reduce-scatter) as they are kept, weights all-gathered in the dtype the forward reads."""

    grads: float
    weights: float
    frozen_gathered_from: int = 3
    """The ZeRO stage from which frozen weights are sharded, and so all-gathered: 3 where an
    engine shards the weights only then (Megatron-Core's distributed optimizer and DeepSpeed's
    ZeRO-1/2 shard optimizer states and gradients, which frozen weights have none of); 1 under
    FSDP2 (EngineSpec.fsdp_copies), whose ZeRO-1/2 is fully_shard without resharding after
    forward: every parameter sharded, frozen ones too, and gathered for the forward."""
    ddp_each_microbatch: bool = False
    """ZeRO-0's all-reduce runs after every micro-batch's backward, not once a step
    (EngineSpec.ddp_accumulates False: torchtitan's)."""

    @classmethod
    def of(cls, training: TrainingSpec) -> "DataParallelBytes":
        """Gradients as the engine's state layout keeps them (Megatron-Core's fp32 main gradients
        under bf16: its arguments.py sets accumulate_allreduce_grads_in_fp32; 16-bit under the
        ``zero`` layout; fp32 under ``fsdp2``, torchtitan's reduce dtype),
        weights in the 16-bit compute dtype (fp32 when training in fp32; FP8 training gathers
        its bf16 weights)."""
        grads = memory.model_state_bytes(1.0, dtype=training.dtype, optimizer=training.optimizer,
                                         zero=0, dp=1, layout=training.engine.state_layout)["grads"]
        return cls(grads=grads, weights=DTYPE_BYTES[precision.core_dtype(training.dtype)],
                   frozen_gathered_from=1 if training.engine.fsdp_copies else 3,
                   ddp_each_microbatch=not training.engine.ddp_accumulates)


def zero3_calls(m: int, pipelined: bool) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of ZeRO-3 per step over ``m`` micro-batches: before every
    forward and backward, and after every backward; under pipelining schedules (costs.
    fsdp_pipelined) gradients are reduced once, and a backward leaves its parameters gathered
    for the forward that follows it (1F1B) or for the next backward (GPipe): about one
    all-gather per micro-batch, and one more."""
    return (m + 1, 1) if pipelined else (2 * m, m)


def windows_left(compute_s, backward_s, used: tuple) -> tuple:
    """(compute, backward) seconds of the windows that other traffic's ``used`` (forward,
    backward: window_use_s) leaves, each window on its own: a forward the first traffic
    overran leaves no forward, never less, and takes nothing from the backward."""
    forward = np.maximum(0.0, compute_s - backward_s - used[0])
    backward = np.maximum(0.0, backward_s - used[1])
    return forward + backward, backward


def window_use_s(cfg: Config, params, per: DataParallelBytes, group, cluster: Cluster, *,
                 pipelined: bool = False, gather_overlap: bool = False, frozen=0.0,
                 forward_only=0.0):
    """Seconds of the windows that hide data-parallel traffic (``exposed_dp_s``) that ``params``
    parameters' traffic occupies, per micro-batch, as (forward, backward): the reduction in the
    last micro-batch's backward for ZeRO-0/1, in each micro-batch's for ZeRO-2, and with
    ``gather_overlap`` the ZeRO-1/2 weights' all-gather in the first forward; ZeRO-3's gathers
    and reduction in every forward and backward; ``pipelined``: only ZeRO-3's gathers use them
    (the reduction waits for every backward). Compute beside the traffic runs slowed
    (DeviceSpec.overlap_slowdown), so M seconds of traffic use M / (1 + s) of the compute: what
    is left for the next traffic, which windows_left subtracts (the stretch is exposed_dp_s's)."""
    used = _window_traffic_s(cfg, params, per, group, cluster, pipelined=pipelined,
                             gather_overlap=gather_overlap, frozen=frozen,
                             forward_only=forward_only)
    slow = cluster.device.overlap_slowdown
    return used[0] / (1.0 + slow), used[1] / (1.0 + slow)


def _window_traffic_s(cfg: Config, params, per: DataParallelBytes, group, cluster: Cluster, *,
                      pipelined: bool, gather_overlap: bool, frozen=0.0, forward_only=0.0):
    """(forward, backward) seconds of the traffic window_use_s places in each window."""
    reduced, gathered = frozen_traffic(cfg.zero, params, frozen, per)
    if pipelined:
        gathers = zero3_calls(cfg.num_microbatches, True)[0] if cfg.zero == 3 else 0
        gather = _moved(comm.allgather_s, gathered * per.weights, group, cluster)
        return 0.0, gathers * gather / cfg.num_microbatches
    if cfg.zero == 0:
        return 0.0, _moved(comm.allreduce_s, reduced * per.grads, group, cluster)
    scatter = _moved(comm.reduce_scatter_s, reduced * per.grads, group, cluster)
    gather = _moved(comm.allgather_s, gathered * per.weights, group, cluster)
    if cfg.zero <= 2:
        return (gather if gather_overlap else 0.0), scatter
    back = _moved(comm.allgather_s, (gathered - forward_only) * per.weights, group, cluster)
    return gather, back + scatter


def exposed_dp_s(cfg: Config, params, per: DataParallelBytes, group, cluster: Cluster, compute_s,
                 backward_s, overlap: bool, *, pipelined: bool = False,
                 gather_overlap: bool = False, frozen=0.0, forward_only=0.0):
    """Data-parallel traffic of one step that compute does not hide (Rajbhandari et al. 2020, §7):

    - ZeRO-0/1: gradients accumulate locally; one all-reduce (ZeRO-1: a reduce-scatter, the same
      ring volume with the all-gather below) during the last micro-batch's backward (ZeRO-0 with
      ``per.ddp_each_microbatch``: an all-reduce in every micro-batch's backward).
    - ZeRO-2: gradients are reduce-scattered after every micro-batch's backward (they are kept
      sharded).
    - ZeRO-1/2: the updated weights are all-gathered after the optimizer step, which no backward
      can hide; with ``gather_overlap`` (EngineSpec.overlap_param_gather) behind the next step's
      first forward (``compute_s - backward_s``), as Megatron-Core's --overlap-param-gather and
      FSDP2's prefetch run it.
    - ZeRO-3: weights are all-gathered before every micro-batch's forward and backward and
      gradients reduce-scattered after it, prefetched behind compute (FSDP).
    - ``pipelined`` (FSDP2 under torch's pipelining schedules, costs.fsdp_pipelined): gradients
      are reduced once, after all the backward passes, so nothing hides the reduction (ZeRO-2
      then moves what ZeRO-1 does), and ZeRO-3 gathers about once per micro-batch
      (zero3_calls), behind compute.
    Hidden traffic still slows the compute it runs beside (comm.beside_compute_s, the device's
    overlap_slowdown). Without overlap every byte is exposed. Gradients travel at ``per.grads``
    bytes per parameter, gathered weights at ``per.weights``; ``frozen`` of the ``params`` move
    no gradient, and no weights where the engine keeps them whole (frozen_traffic); those of
    them in blocks that run no backward (``forward_only``) are gathered by ZeRO-3 before the
    forward only. ``params``, ``frozen``, ``forward_only``, ``compute_s`` and ``backward_s`` may
    be numpy arrays (one entry per pipeline rank)."""
    m = cfg.num_microbatches
    slow = cluster.device.overlap_slowdown

    def beside(comm_s, window_s):  # hidden behind compute, at the cost of slowing it
        return comm.beside_compute_s(comm_s, window_s, slow)

    reduced, gathered = frozen_traffic(cfg.zero, params, frozen, per)
    scatter = _moved(comm.reduce_scatter_s, reduced * per.grads, group, cluster)
    gather = _moved(comm.allgather_s, gathered * per.weights, group, cluster)
    weights = (beside(gather, compute_s - backward_s) if overlap and gather_overlap
               else gather)  # ZeRO-1/2's all-gather of the updated weights
    if pipelined:
        if cfg.zero <= 1:
            if cfg.zero == 0:
                return _moved(comm.allreduce_s, reduced * per.grads, group, cluster)
            return scatter + gather
        if cfg.zero == 2:
            return gather + scatter
        gathers = zero3_calls(m, True)[0] * gather
        return scatter + (beside(gathers, m * compute_s) if overlap else gathers)
    if cfg.zero <= 1:  # ZeRO-1 runs the two halves as separate calls (backend speeds may differ)
        if cfg.zero == 0:
            sync = _moved(comm.allreduce_s, reduced * per.grads, group, cluster)
            if per.ddp_each_microbatch:  # (each micro-batch's backward hides its own)
                return beside(m * sync, m * backward_s) if overlap else m * sync
            return beside(sync, backward_s) if overlap else sync
        return weights + (beside(scatter, backward_s) if overlap else scatter)
    if cfg.zero == 2:
        return weights + (beside(m * scatter, m * backward_s) if overlap else m * scatter)
    gathers, scatters = zero3_calls(m, False)  # half before the forwards, half the backwards
    back = _moved(comm.allgather_s, (gathered - forward_only) * per.weights, group, cluster)
    total = gathers / 2 * (gather + back) + scatters * scatter
    return beside(total, m * compute_s) if overlap else total


def dp_rates(cfg: Config, cluster: Cluster, training: TrainingSpec, orders) -> list[tuple]:
    """Per placement of ``orders``: (all-gather, reduce-scatter, all-reduce) seconds per dense
    parameter over its data-parallel group, the same per routed-expert parameter over theirs,
    latencies left out (dp_floor_s); none under the pipelining schedules' FSDP2
    (fsdp_pipelined), which reduces once, after the last backward (its floor is then 0)."""
    if fsdp_pipelined(cfg, training):
        return []
    per = DataParallelBytes.of(training)
    out = []
    for order in orders:
        c = cfg if order == cfg.placement else cfg.with_(placement=order)
        rates: tuple = ()
        for group in (placement.dp_group(c, cluster), placement.edp_group(c, cluster)):
            rates += (_per_byte_s(comm.allgather_s, group, cluster) * per.weights,
                      _per_byte_s(comm.reduce_scatter_s, group, cluster) * per.grads,
                      _per_byte_s(comm.allreduce_s, group, cluster) * per.grads)
        out.append(rates)
    return out


def dp_floor_s(zero: int, microbatches: int, dense, experts_, compute_s,
               rates: list[tuple]) -> float:
    """At most the data-parallel traffic ``_dp_and_optimizer_s`` exposes (that of the busiest
    pipeline rank), with the ranks holding ``dense`` and ``experts_`` parameters and
    ``compute_s`` seconds of compute per micro-batch (numbers, or numpy arrays over ranks), under
    the best of the placements whose ``rates`` (dp_rates) are given: every window that hides a
    collective (exposed_dp_s, windows_left) lies within the rank's compute, so each collective
    exposes at least its time beyond that compute, and without its latencies each is linear in
    the parameters. Under one placement the floor of a rank is convex in (dense, experts_,
    compute_s), so its value at the ranks' means is at most the mean of theirs, and at most
    their largest: the search's screen prices it so before a split is known."""
    m = microbatches
    arrays = any(isinstance(v, np.ndarray) for v in (dense, experts_, compute_s))
    # the screen passes numbers, many thousand times a search: numpy's per-call cost there
    # would exceed the arithmetic's
    beyond = (lambda x: np.maximum(0.0, x)) if arrays else (lambda x: x if x > 0.0 else 0.0)
    best = 0.0
    for i, (g_d, s_d, r_d, g_e, s_e, r_e) in enumerate(rates):
        total = 0.0 * compute_s
        for params, gather, scatter, reduce in ((dense, g_d, s_d, r_d),
                                                (experts_, g_e, s_e, r_e)):
            if zero == 3:  # gathered before every forward and backward, reduced after it
                total = total + m * beyond((2 * gather + scatter) * params - compute_s)
            elif zero == 2:  # reduced after every backward, gathered after the update
                total = total + (m * beyond(scatter * params - compute_s)
                                 + beyond(gather * params - compute_s))
            elif zero == 1:
                total = total + (beyond(scatter * params - compute_s)
                                 + beyond(gather * params - compute_s))
            else:
                total = total + beyond(reduce * params - compute_s)
        busiest = float(np.max(total)) if arrays else float(total)  # one placement for all ranks
        best = busiest if i == 0 else min(best, busiest)
    return best


def _per_byte_s(collective, group, cluster: Cluster) -> float:
    """Seconds per byte of ``collective`` on ``group`` (its time less its latencies)."""
    return collective(1.0, group, cluster) - collective(0.0, group, cluster)


def after_tied_sync(exposed, ties, per: DataParallelBytes, link_of) -> np.ndarray:
    """Per pipeline rank, ``exposed`` (its data-parallel tail) with the all-reduce of each tied
    weight's gradients between the two ranks that read it (``RankMemory.ties``; ``link_of(a,
    b)``: the link between ranks a and b) after it: the
    all-reduce starts once both ranks have reduced over data parallelism and ends before the
    optimizer step, with nothing left to hide it (Megatron-Core's embedding group in
    finalize_model_grads, DeepSpeed's tied layers, planner/runtime/tied.py); every replica's and
    shard's pair at once, each over its own link."""
    out = np.array(exposed, dtype=float)
    for a, b, n in ties:
        t = comm.ring_allreduce_s(n * per.grads, 2, link_of(a, b))
        out[a] = out[b] = max(out[a], out[b]) + t
    return out
