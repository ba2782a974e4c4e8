"""What each block costs under a configuration, and the memory inputs of the stage-split solvers.

The block graph becomes arrays once per search (``ModelArrays``); for each group of
configurations sharing (tp, sequence parallel, recomputation, micro-batch) the cost models
(costmodels/) give every block's seconds and bytes once (``block_costs``). ``stage_memory`` turns
those into what the solvers check a stage's memory with; it is built in this one place for the
chain split, the DAG and the device-group solvers alike.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field, fields

import numpy as np

from costmodels import attention, comm, compute, context, experts, memory, pipeline, precision
from costmodels.engine import FUSED_ATTENTION, outside_layers
from costmodels.hardware import DTYPE_BYTES
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
    same: list[int]
    """Per block: the index of the first block whose work and checkpointing equal its own (layers
    built from one definition cost the same, and are priced once; a block of the same work outside
    the repeated layers may run other kernels, EngineSpec.fused_scope)."""
    checkpointed: np.ndarray
    """Per block: whether recomputation applies to it (Block.recompute)."""
    work: BlockWork
    """A BlockWork whose numeric fields are numpy arrays over blocks."""
    cut_bytes: np.ndarray
    shared: list[tuple[int, int, float, bool, bool]]
    """(first block, other block, parameters, tp-split, frozen) of each tied weight
    (BlockGraph.shared)."""
    fwd_flops_per_sample: float
    train_flops_per_sample: float
    """Model FLOPs of forward + backward per sample (BlockWork.train_flops)."""
    padding_flops_per_sample: float = 0.0
    """FLOPs of capacity-style experts' empty slots per sample (hardware, not model, FLOPs)."""
    times_key: tuple | None = None
    times: dict = field(default_factory=dict)
    """The last block times priced (block_costs), for the knobs in ``times_key``: the
    configurations of one mesh and micro-batch differ in recomputation next, which changes no
    block's forward or backward."""
    dispatch_memo: dict = field(default_factory=dict)
    """_least_dispatch_s's arrays where they depend on no compute time
    (costmodels.experts.reads_compute), by cluster id, sequence length, engine, forward replay
    and mesh: recomputation policies that replay the forward alike (EngineSpec.replays_forward)
    then share one dispatch, which a search would otherwise find once per policy. The cluster is
    kept with its entry (a reused id never matches); each array is copied in and out (no costs
    share one)."""
    flops_memo: dict = field(default_factory=dict)
    """Per recomputation policy: the forward FLOPs it recomputes per sample
    (pricing.step_flops), and under ("recomputed", policy) the blocks it recomputes."""
    costs_memo: dict = field(default_factory=dict)
    """The block costs made under ``full`` and ``none`` (costs._memo_costs), by policy and knobs,
    each with the cluster and training it was made for (an entry matches only those objects)."""

    def recomputed(self, recompute: str) -> np.ndarray:
        """Per block: whether ``recompute`` recomputes anything in it (memory.layer_policies;
        kept per policy in ``flops_memo``, a copy handed out)."""
        key = ("recomputed", recompute)
        if key not in self.flops_memo:
            self.flops_memo[key] = np.array([p != "none" for p in memory.layer_policies(
                self.checkpointed, recompute)], dtype=bool)
        return self.flops_memo[key].copy()

    @classmethod
    def from_blocks(cls, bg: BlockGraph, order: list[int] | None = None) -> "ModelArrays":
        """Arrays over the blocks in their own order, or in ``order`` (a topological order)."""
        order = list(range(len(bg.blocks))) if order is None else list(order)
        blocks = [bg.blocks[i] for i in order]
        cols = {f: np.array([getattr(b.work, f) for b in blocks], dtype=float) for f in WORK_FIELDS}
        idx = {b.name: i for i, b in enumerate(blocks)}
        shared = [(idx[a], idx[b], float(n), bool(s), bool(f)) for a, b, n, s, f in bg.shared]
        work = BlockWork(**cols)
        first: dict[tuple[BlockWork, bool], int] = {}
        same = [first.setdefault((b.work, b.recompute), i) for i, b in enumerate(blocks)]
        return cls(names=[b.name for b in blocks], works=[b.work for b in blocks], same=same,
                   work=work,
                   checkpointed=np.array([b.recompute for b in blocks], dtype=bool),
                   cut_bytes=np.array(bg.cut_bytes(order), dtype=float), shared=shared,
                   fwd_flops_per_sample=float(np.sum(work.fwd_flops)),
                   train_flops_per_sample=float(sum(b.work.train_flops for b in blocks)),
                   padding_flops_per_sample=float(sum(b.work.padding_train_flops
                                                      for b in blocks)))


@dataclass
class BlockCosts:
    """Per-block seconds and bytes for one micro-batch under (tp, sp, recompute, micro_batch)."""

    fwd_s: np.ndarray
    compute_s: np.ndarray
    """Forward + backward."""
    recompute_s: np.ndarray
    tp_comm_s: np.ndarray
    tp_fwd_comm_s: np.ndarray
    """The part of ``tp_comm_s`` in the forward pass (its collectives once; a replay under
    full recomputation runs in the backward): what a pipeline schedule puts in F."""
    tp_wgrad_hidden_s: np.ndarray
    """Of the input gradients' collectives, the seconds ``tp_comm_s`` hides behind the
    weight-gradient GEMMs (EngineSpec.tp_grad_overlap): exposed again where a schedule runs
    those GEMMs apart (ZB-H1's W; tp_comm_for)."""
    act_bytes: np.ndarray
    work_bytes: np.ndarray
    params_local: np.ndarray
    expert_params_local: np.ndarray
    """The part of ``params_local`` in routed experts (sharded by ep x etp, reduced over edp)."""
    frozen_local: np.ndarray
    """The part of ``params_local`` not trained (BlockWork.frozen_params_tp and _rep)."""
    frozen_expert_local: np.ndarray
    """The part of ``frozen_local`` in routed experts."""
    accumulate_s: np.ndarray
    """Adding one micro-batch's weight gradients into the accumulated ones, where that is a pass
    of its own (eager kernels, and torch.compile per block, EngineSpec.fused_scope "layers":
    autograd's accumulation; Megatron-style fused engines fold it into the weight-gradient GEMM,
    as Megatron-Core's gradient accumulation fusion does): 0 otherwise.
    Gradients stay whole between micro-batches (the pipelining schedule syncs FSDP2 on the last
    one only); pricing counts it for every micro-batch but the first."""
    wgrad_s: np.ndarray
    """The part of ``compute_s`` in Linear layers' weight-gradient GEMMs
    (costmodels.compute.BlockTime.wgrad_s): ZB-H1's W, with ``accumulate_s``."""
    cp_comm_s: np.ndarray
    """Context-parallel K/V exchange the block exposes (forward + backward); for the p2p ring
    of torch or of the runtime (EngineSpec.cp_ring) also its merges and chunk copies
    (costmodels.context.ring_merge_s). What the ring's per-chunk-pair attention calls change
    (costmodels.attention.ring_attention_s) is in the compute times."""
    ep_comm_s: np.ndarray | None = None
    """Expert dispatch and combine at the least any placement of the ep group gives
    (_least_dispatch_s), for the bounds and the stage split; the pricing replaces it by each
    pipeline rank's own under the placement (pricing.Split._expert_comm_s)."""
    ep_comm_1f1b_s: np.ndarray | None = None
    """The same where a pipeline without virtual stages keeps the overlapped dispatch
    (EngineSpec.moe_overlap) off, which ``ep_comm_s`` prices as running (the least: the bounds
    take it); None where the two agree. The stage split of such a pipeline takes this one, as its
    pricing does (a new-user check saw moe_overlap=true, not run, change the plan's stages)."""
    cp_comm: str = "p2p"
    """The K/V exchange form these costs price (with cp > 1: the fastest of those allowed)."""
    shared_fwd_s: np.ndarray | None = None
    """The shared expert's GEMMs in each block's forward (BlockTime.shared_fwd_s): what
    EngineSpec.moe_shared_overlap hides the forward's dispatch and combine behind."""
    shared_bwd_s: np.ndarray | None = None
    """... and in its backward."""

    def tp_comm_for(self, schedule: str) -> np.ndarray:
        """``tp_comm_s`` under ``schedule``: with the weight gradients run apart (ZB-H1),
        nothing hides behind them."""
        return self.tp_comm_s + self.tp_wgrad_hidden_s if schedule == "zb-h1" else self.tp_comm_s

    @property
    def backward_pass_s(self) -> np.ndarray:
        """The compute of a micro-batch's backward pass: its backward and any recomputation."""
        return self.compute_s - self.fwd_s + self.recompute_s

    @property
    def time_s(self) -> np.ndarray:
        t = self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s
        return t if self.ep_comm_s is None else t + self.ep_comm_s

    def split_s(self, cfg) -> list[float]:
        """Per block, the seconds a stage split of configuration ``cfg`` balances: ``time_s``
        (with the dispatch its pipeline runs: ep_comm_1f1b_s) and, after the first of the step's
        micro-batches, the gradient accumulation pass (as pricing counts them)."""
        m = cfg.num_microbatches
        t = self.time_s
        if self.ep_comm_1f1b_s is not None and cfg.pp > 1 and cfg.vpp == 1:
            t = t - self.ep_comm_s + self.ep_comm_1f1b_s
        return (t + (m - 1) / m * self.accumulate_s).tolist()

    def weight_grad_s(self, microbatches: int) -> np.ndarray:
        """Per block, ZB-H1's W of one micro-batch: the weight-gradient GEMMs and, after the
        first of the step's ``microbatches``, the gradient accumulation pass."""
        return self.wgrad_s + (microbatches - 1) / microbatches * self.accumulate_s

    def permuted(self, order: list[int]) -> "BlockCosts":
        return BlockCosts(**{f.name: getattr(self, f.name)[order] for f in fields(self)
                             if f.name != "cp_comm" and getattr(self, f.name) is not None},
                          cp_comm=self.cp_comm)

    def where(self, mask: np.ndarray, other: "BlockCosts") -> "BlockCosts":
        """These costs on the blocks ``mask`` selects, ``other``'s (of the same mesh, exchange
        form and dispatch) on the rest."""
        def pick(a, b):
            if a is None or b is None:
                assert a is None and b is None, "costs of different dispatches"
                return None
            return np.where(mask, a, b)
        return BlockCosts(**{f.name: pick(getattr(self, f.name), getattr(other, f.name))
                             for f in fields(self) if f.name != "cp_comm"}, cp_comm=self.cp_comm)


def block_costs(ma: ModelArrays, cluster: Cluster, training: TrainingSpec, *, tp: int, sp: bool,
                recompute: str, micro_batch: int, cp: int = 1,
                cp_comm: str | tuple[str, ...] = "p2p", ep: int = 1, etp: int = 1) -> BlockCosts:
    """Per-block costs of one micro-batch on one GPU. With context parallelism the GPU holds 1/cp
    of each sample's tokens (costmodels.compute.block_time) and exchanges keys and values
    (costmodels.context) in the form ``cp_comm``, or the fastest of several; with experts, ep
    and etp say how the routed experts are spread. Under ``full/k`` the layers it recomputes
    (memory.layer_policies) cost as under ``full``, the others as under ``none``, with the
    exchange form the recomputed ones take and no overlapped dispatch anywhere (Megatron-Core
    refuses it with any full recomputation)."""
    knobs = dict(tp=tp, sp=sp, micro_batch=micro_batch, cp=cp, ep=ep, etp=etp)
    if not memory.layer_interval(recompute):
        return _memo_costs(ma, cluster, training, recompute=recompute, cp_comm=cp_comm, **knobs)
    full = _memo_costs(ma, cluster, training, recompute="full", cp_comm=cp_comm, **knobs)
    kept = _memo_costs(ma, cluster, training, recompute="none", cp_comm=cp_comm,
                       overlap_as="full", **knobs)
    if kept.cp_comm != full.cp_comm:  # (the forms' fastest without recomputation differs)
        kept = _memo_costs(ma, cluster, training, recompute="none", cp_comm=full.cp_comm,
                           overlap_as="full", **knobs)
    return full.where(ma.recomputed(recompute), kept)


def _memo_costs(ma: ModelArrays, cluster: Cluster, training: TrainingSpec, *, recompute: str,
                cp_comm, overlap_as: str | None = None, **knobs) -> BlockCosts:
    """_block_costs; those of ``full`` and ``none`` kept in ``ma.costs_memo``, as the halves of
    the ``full/k`` policies (a search holds every policy's costs anyway: the memo shares them),
    ``overlap_as`` only where it changes anything (an overlapped dispatch), one exchange form as
    itself. Costs are never changed once made."""
    moe = training.engine.moe_overlap and knobs["ep"] * knobs["etp"] > 1
    overlap_as = overlap_as if moe else None
    if recompute not in ("full", "none"):
        return _block_costs(ma, cluster, training, recompute=recompute, cp_comm=cp_comm,
                            overlap_as=overlap_as, **knobs)
    forms = (cp_comm,) if isinstance(cp_comm, str) else tuple(cp_comm)
    key = (recompute, forms, overlap_as, tuple(sorted(knobs.items())))
    hit = ma.costs_memo.get(key)
    if hit is not None and hit[0] is cluster and hit[1] is training:
        return hit[2]
    costs = _block_costs(ma, cluster, training, recompute=recompute, cp_comm=cp_comm,
                         overlap_as=overlap_as, **knobs)
    ma.costs_memo[key] = (cluster, training, costs)
    return costs


def _block_costs(ma: ModelArrays, cluster: Cluster, training: TrainingSpec, *, tp: int, sp: bool,
                 recompute: str, micro_batch: int, cp: int, cp_comm: str | tuple[str, ...],
                 ep: int, etp: int, overlap_as: str | None = None) -> BlockCosts:
    """block_costs under one policy; ``overlap_as``: the policy whose blockers of the
    overlapped dispatch apply (experts.overlap_blockers), if not ``recompute``."""
    w = ma.work
    engine = training.engine
    routed = compute.Experts(ep=ep, etp=etp, grouped=engine.moe_grouped_gemm,
                             fp8=engine.fp8_experts,
                             load=experts.rank_load(engine, ep=ep, num_experts=int(
                                 np.max(w.num_experts, initial=0))))
    # capacity-style experts' fixed slots are as large however tokens are routed (per block, as
    # the dispatch takes them: costmodels.experts.block_dispatch_s)
    slots = dataclasses.replace(routed, load=1.0)
    load = np.where(w.expert_capacity > 0, 1.0, routed.load)
    # blocks of equal work are priced once, and once for every recomputation policy
    shared = (id(cluster.device), training.dtype, engine, micro_batch, tp, sp, cp, routed)
    if ma.times_key != shared:
        ma.times_key, ma.times = shared, {}
    times = ma.times
    policies = [recompute if c else "none" for c in ma.checkpointed]
    outer = outside_layers(engine)  # blocks outside the repeated layers
    core = precision.core_dtype(training.dtype)
    for i, work in enumerate(ma.works):
        if ma.same[i] not in times:
            layer = ma.checkpointed[i]  # fp8 covers the repeated layers' GEMMs only
            times[ma.same[i]] = compute.block_time(
                work, cluster.device, dtype=training.dtype if layer else core,
                micro_batch=micro_batch, tp=tp, sp=sp, recompute="none",
                engine=engine if layer else outer, cp=cp,
                experts=slots if work.expert_capacity else routed)
    n = len(ma.names)

    def vec(x) -> np.ndarray:  # a new array; scalars (e.g. no recomputation) broadcast
        out = np.array(x, dtype=float)
        return out if out.shape == (n,) else np.broadcast_to(out, (n,)).copy()

    fwd_repeats = 2 if engine.replays_forward(recompute) else 1  # (forward all-reduces again)
    # recomputing the attention core (full, or selective) exchanges its keys and values again:
    # the exchange is part of the core (Transformer Engine's, torch's and the runtime's rings)
    attn_repeats = np.array([2.0 if p in ("full", "selective") else 1.0 for p in policies])
    kept = engine.attention not in FUSED_ATTENTION  # eager attention's scores, saved or fused away
    fused = engine.kernels == "fused"  # element-wise chains keep only what enters them
    # Megatron-Core's experts weight their activation before the last GEMM (fused engines stand
    # for it; an eager engine runs the model's own code)
    weighted = fused and engine.moe_probs_in_activation
    fused_outer = outer.kernels == "fused"
    fp8 = training.dtype == "fp8" and engine.fp8_copies  # Linear inputs kept quantized
    heads_div = np.maximum(1.0, np.minimum(tp, np.maximum(w.attn_heads_kv, 1.0)))
    kv = micro_batch * w.attn_kv_bytes / heads_div  # the whole sequence's K/V on this tp rank
    kv_copies = a2a_kv_copies(w.attn_heads_kv, heads_div, cp)
    q = micro_batch * w.attn_q_bytes / tp
    out = np.where(w.attn_out_bytes > 0, micro_batch * w.attn_out_bytes / tp, q)
    layers = np.maximum(w.attn_kv_calls, 1.0)  # attention layers per block
    word = DTYPE_BYTES[core]
    forms = (cp_comm,) if isinstance(cp_comm, str) else tuple(cp_comm)
    # the runtime's ring returns fp32 K/V gradients to their owner; torch's passes them on in
    # fp32, Transformer Engine's in the compute dtype (EngineSpec.cp_ring)
    back = 4 / word if engine.cp_ring == "runtime" else 0.0
    on = 4 / word if engine.cp_ring == "torch" else 1.0
    form, cp_s, cp_buffers, ring_kept = forms[0], np.zeros(n), np.zeros(n), np.zeros(n)
    ring = np.zeros((n, 2))  # (forward, backward) attention seconds the ring's calls change
    if cp > 1:
        g = cluster.gpus_per_node
        cp_group = placement.group_shape(cp, tp, g, tuple(range(0, g, tp * cp)) or (0,))
        best = None
        for f_name in forms:
            s_, calls = np.zeros(n), np.zeros((n, 2))
            for i in range(n):
                t = times[ma.same[i]]
                if ma.same[i] != i:  # equal work: equal exchange
                    s_[i], calls[i] = s_[ma.same[i]], calls[ma.same[i]]
                elif kv[i] > 0:
                    gathered_ring = f_name == "allgather" and engine.cp_ring == "torch"
                    if f_name in ("p2p", "a2a+p2p", "allgather"):
                        # the ring calls attention per chunk pair (torch's, gathered K/V too);
                        # Transformer Engine's all-gather form calls it per query chunk against
                        # the keys before it: the same causal pairs, the rest whole
                        # (a2a+p2p: a ring of cp / inner steps, each rank on 1 / inner of heads)
                        inner = context.heads_ranks(cp_group) if f_name == "a2a+p2p" else 1
                        calls[i] = attention.ring_attention_s(
                            ma.works[i], cluster.device, core, engine,
                            micro_batch=micro_batch / inner, tp=tp, cp=cp // inner)
                    # each attention layer of the block exchanges its own K/V
                    per = layers[i]
                    copied = kv_copies[i] if f_name == "a2a" else 1.0
                    f, b = context.exchange_s(f_name, cp=cp, kv_bytes=copied * kv[i] / per,
                                              q_bytes=q[i] / per,
                                              attn_fwd_s=(t.attn_fwd_s + calls[i, 0]) / per,
                                              attn_bwd_s=(t.attn_bwd_s + calls[i, 1]) / per,
                                              group=cp_group, cluster=cluster,
                                              gradients_back=back, gradients_on=on,
                                              gathered_ring=gathered_ring,
                                              passes_last=engine.cp_ring == "torch",
                                              out_bytes=out[i] / per)
                    if (f_name == "p2p" and engine.cp_ring != "te") or gathered_ring:
                        # the partial outputs merge as element-wise ops
                        mf, mb = context.ring_merge_s(cp, q_bytes=q[i] / per, kv_bytes=kv[i] / per,
                                                      word=word, device=cluster.device,
                                                      out_bytes=out[i] / per)
                        f, b = f + mf, b + mb
                    s_[i] = per * (attn_repeats[i] * f + b)
            total = float(s_.sum() + attn_repeats @ calls[:, 0] + calls[:, 1].sum())
            if best is None or total < best:
                best, form, cp_s, ring = total, f_name, s_, calls
        # K/V held while one attention layer runs: two chunks in flight (ring), the gathered
        # sequence (all-gather), the head shards of q, k, v and the output (all-to-all)
        cp_buffers = {"p2p": 2 * kv / cp, "allgather": kv,
                      "a2a": (q + out + kv * kv_copies) / cp,
                      "a2a+p2p": (q + out + 3 * kv) / cp}[form] / layers
        if form in ("p2p", "allgather") and engine.cp_ring == "torch":
            # torch's ring also holds, while a layer's forward runs, the merged output in fp32
            # and a temporary as large; while its backward runs, the query's gradients in fp32
            # and the K/V gradients accumulated and one passed on (in ``on``'s width)
            # (_attention.py: _SDPAMerger, grad_query / grad_key / grad_value in accum_dtype)
            fp32 = 4 / word
            cp_buffers = cp_buffers + np.maximum(2 * fp32 * out, fp32 * q + 2 * on * kv) \
                / cp / layers
        if form == "p2p" and engine.cp_ring == "runtime":
            # the runtime's ring keeps every step's K/V for backward: with the attention kept,
            # as activations; recomputed (full, selective), while that layer's backward runs
            others = kv * (cp - 1) / cp
            recomputed = np.array([p in ("full", "selective") for p in policies])
            ring_kept, cp_buffers = np.where(recomputed, 0.0, others), \
                cp_buffers + np.where(recomputed, others / layers, 0.0)
    under: dict[tuple, compute.BlockTime] = {}
    for i, policy in enumerate(policies):
        if (ma.same[i], policy) not in under:
            t = times[ma.same[i]]
            rf, rb = ring[ma.same[i]]
            if rf or rb:  # the attention the ring runs in its calls, in place of the rank's own
                t = dataclasses.replace(t, fwd_s=t.fwd_s + rf, bwd_s=t.bwd_s + rb,
                                        attn_fwd_s=t.attn_fwd_s + rf, attn_bwd_s=t.attn_bwd_s + rb,
                                        selective_s=None if t.selective_s is None
                                        else t.selective_s + rf)
            under[ma.same[i], policy] = t.recomputing(policy)
    bt = [under[ma.same[i], policy] for i, policy in enumerate(policies)]
    group = placement.group_shape(tp, 1, cluster.gpus_per_node)
    share = micro_batch / cp  # samples' worth of tokens on this GPU
    # (the layers' FP8 GEMM inputs and output gradients all-gathered in FP8)
    inputs, grads = precision.sp_gather_shares(engine.fp8_linear, engine.fp8_recipe) \
        if training.dtype == "fp8" else (1.0, 1.0)
    tp_s, tp_fwd, tp_hidden = tp_comm_s(
        w, bt, engine, group, cluster, share=share, sp=sp, tp=tp, fwd_repeats=fwd_repeats,
        gathered=(np.where(ma.checkpointed, inputs, 1.0), np.where(ma.checkpointed, grads, 1.0)))
    local = vec(w.params_tp / tp + w.params_rep - w.expert_params + w.expert_params / (ep * etp))
    frozen = vec(w.frozen_params_tp / tp + w.frozen_params_rep - w.frozen_expert_params
                 + w.frozen_expert_params / (ep * etp))
    accumulate = np.zeros(n)
    # Megatron's fused kernels fold accumulation into the wgrad GEMM; eager kernels do not,
    # nor does torch.compile per block (autograd adds each compiled backward's gradients)
    if engine.kernels == "eager" or engine.fused_scope == "layers":
        grad_b = memory.model_state_bytes(1.0, dtype=training.dtype, optimizer=training.optimizer,
                                          zero=0, dp=1, layout=engine.state_layout)["grads"]
        accumulate = vec([compute.accumulate_s(x * grad_b, cluster.device)
                          for x in (local - frozen).tolist()])  # (frozen weights: no gradient)
    costs = BlockCosts(
        fwd_s=vec([t.fwd_s for t in bt]),
        compute_s=vec([t.fwd_s + t.bwd_s for t in bt]),
        recompute_s=vec([t.recompute_s for t in bt]),
        tp_comm_s=vec(tp_s),
        act_bytes=np.where(ma.checkpointed, vec(memory.activation_bytes(
            w, micro_batch=share, tp=tp, sp=sp, recompute=recompute, scores_kept=kept,
            fused=fused, fp8=fp8, routed_load=load, etp=etp, probs_in_activation=weighted,
            fp8_experts=engine.fp8_experts)),
            vec(memory.activation_bytes(w, micro_batch=share, tp=tp, sp=sp, recompute="none",
                                        scores_kept=kept, fused=fused_outer, fp8=False,
                                        routed_load=load, etp=etp,
                                        probs_in_activation=weighted))) + ring_kept
        + _op_saved_exchange(w, recompute, checkpointed=ma.checkpointed,
                             share=share / tp * (etp if engine.moe_etp_replicated else 1),
                             ep=ep, load=load),
        work_bytes=np.maximum(np.where(ma.checkpointed, vec(memory.recompute_working_bytes(
            w, micro_batch=share, tp=tp, sp=sp, recompute=recompute, scores_kept=kept,
            fused=fused, fp8=fp8, routed_load=load, etp=etp,
            probs_in_activation=weighted, fp8_experts=engine.fp8_experts)), 0.0),
            vec(memory.backward_transient_bytes(w, micro_batch=share, tp=tp, sp=sp,
                                                scores_kept=kept))) + cp_buffers
        + vec(experts.gathered_bytes(engine.moe_dispatcher, dispatch_bytes=w.dispatch_bytes,
                                     routed_tokens=w.routed_tokens, seq_len=training.seq_len,
                                     share=share / tp, ep=ep, etp=etp,
                                     moe_layers=w.moe_layers)),
        params_local=local,
        accumulate_s=accumulate,
        wgrad_s=vec([t.wgrad_s for t in bt]),
        shared_fwd_s=vec([t.shared_fwd_s for t in bt]),
        shared_bwd_s=vec([t.shared_bwd_s for t in bt]),
        tp_fwd_comm_s=vec(tp_fwd), tp_wgrad_hidden_s=vec(tp_hidden),
        expert_params_local=vec(w.expert_params / (ep * etp)),
        frozen_local=frozen,
        frozen_expert_local=vec(w.frozen_expert_params / (ep * etp)),
        cp_comm_s=cp_s,
        cp_comm=form,
    )
    costs.ep_comm_s = _least_dispatch_s(ma, cluster, training, tp=tp, cp=cp, ep=ep, etp=etp,
                                        micro_batch=micro_batch, recompute=recompute,
                                        costs=costs, overlap_as=overlap_as)
    if costs.ep_comm_s is not None and engine.moe_overlap and not experts.overlap_blockers(
            engine, ep=ep, recompute=overlap_as or recompute, dtype=training.dtype, pp=1, vpp=1):
        costs.ep_comm_1f1b_s = _least_dispatch_s(
            ma, cluster, training, tp=tp, cp=cp, ep=ep, etp=etp, micro_batch=micro_batch,
            recompute=recompute, costs=costs, pp=2)
    return costs


def _op_saved_exchange(w, recompute: str, *, checkpointed, share: float, ep: int, load):
    """Per block: what op-level checkpointing keeps of the expert all-to-alls, which the trace
    on one device does not see: torchtitan's op-level policy saves the outputs of
    ``all_to_all_single`` in its deepseek_v3, gpt_oss and llama4 models (their
    ``_op_sac_save_list``, 0.2.2), so with ep > 1 a rank keeps the token copies its experts
    received (``load`` times the mean on the busiest rank) and those the combine returned
    (``share``: samples' worth of tokens a rank all-to-alls, EngineSpec.moe_etp_replicated).
    Counted for every model (its qwen3 saves neither, replaying the forward's dispatch in
    backward instead: the export says so)."""
    if recompute != "op" or ep <= 1:
        return 0.0
    return np.where(checkpointed, share * w.dispatch_bytes * (1.0 + load), 0.0)


def _least_dispatch_s(ma: ModelArrays, cluster: Cluster, training: TrainingSpec, *, tp: int,
                      cp: int, ep: int, etp: int, micro_batch: int, recompute: str,
                      costs: BlockCosts, pp: int = 1,
                      overlap_as: str | None = None) -> np.ndarray | None:
    """Per block: the least expert dispatch and combine any placement of the ep (and etp) group
    gives: the least over every even count of its members per node, up to the most the node
    holding fewest can have (all on the fewest nodes, split as evenly as they allow), and with
    DeepEP also the all-to-all's (what an uneven group is priced as). Consecutive ranks are the
    cheapest where the node's links are the faster, but not with DeepEP (a node's links forward
    what the network brings: the more of the group a node holds, the more they carry) nor on a
    cluster whose network outruns its node links. ``pp``: 1, or more for a pipeline without
    virtual stages (where the overlapped dispatch does not run). ``overlap_as``: the policy whose
    blockers of the overlapped dispatch apply, if not ``recompute``."""
    w = ma.work
    if ep * etp <= 1 or not np.any(w.dispatch_bytes):
        return None
    g = cluster.gpus_per_node
    engine = training.engine
    if engine.moe_overlap and experts.overlap_blockers(engine, ep=ep,
                                                       recompute=overlap_as or recompute,
                                                       dtype=training.dtype, pp=pp, vpp=1):
        engine = dataclasses.replace(engine, moe_overlap=False)
    memo_key = None if experts.reads_compute(engine, ep) else (
        id(cluster), training.seq_len, engine, engine.replays_forward(recompute), micro_batch,
        tp, cp, ep, etp)
    hit = ma.dispatch_memo.get(memo_key) if memo_key else None
    if hit is not None and hit[0] is cluster:
        return hit[1].copy()
    least = placement.group_shape(ep, etp, g)

    def dispatch(engine, ep_group):
        return experts.block_dispatch_s(
            engine, dispatch_bytes=w.dispatch_bytes, routed_tokens=w.routed_tokens,
            seq_len=training.seq_len, share=micro_batch / (tp * cp), ep=ep,
            ep_group=ep_group, etp_group=placement.group_shape(etp, 1, g),
            cluster=cluster, recompute_full=engine.replays_forward(recompute), fwd_s=costs.fwd_s,
            bwd_s=costs.backward_pass_s, shared_fwd_s=costs.shared_fwd_s,
            shared_bwd_s=costs.shared_bwd_s,
            num_experts=w.num_experts, moe_layers=w.moe_layers, capacity=w.expert_capacity,
            groups=w.expert_groups, group_topk=w.expert_groups_per_token)
    # the most members the node holding fewest can have: consecutive ranks fill whole nodes and
    # leave a remainder (72 + 56 of 128 on 72-GPU nodes), while a rank whose groups start
    # elsewhere may split them evenly (64 + 64: placement.ep_groups prices each rank's own)
    per = g // etp if g % etp == 0 else 1
    top = max(least.per_node, ep // -(-ep // per)) if per > 1 else least.per_node
    spread = [dispatch(engine, comm.GroupShape(size=ep, per_node=k))
              for k in range(1, top + 1) if ep % k == 0 or k in (least.per_node, top)]
    if engine.moe_dispatcher == "deepep":
        spread.append(dispatch(dataclasses.replace(engine, moe_dispatcher="alltoall"), least))
    out = np.minimum.reduce(spread)
    if memo_key:
        ma.dispatch_memo[memo_key] = (cluster, out.copy())
    return out


def a2a_kv_copies(kv_heads, heads_div, cp: int):
    """Per block: the copies of each key/value head the all-to-all exchange sends where cp
    exceeds the heads a tensor-parallel rank holds (``kv_heads`` / ``heads_div``): DeepSpeed's
    UlyssesSPAttentionHF repeats each that many times (the rules allow it where the target does:
    SearchOptions.cp_kv_copies); 1 elsewhere."""
    return np.maximum(1.0, cp / np.maximum(1.0, kv_heads / heads_div))


def tp_comm_s(w, bt, engine, group, cluster: Cluster, *, share: float, sp: bool, tp: int,
              fwd_repeats: int, gathered=(1.0, 1.0)) -> tuple:
    """Per block (arrays over blocks of the model's ``w``, BlockWork columns, and ``bt``, its
    BlockTimes): tensor parallelism's collectives a micro-batch exposes, the forward pass's part
    of them, and what of them hides behind the weight-gradient GEMMs.

    Forward: the row-parallel outputs' all-reduces (under sequence parallelism an all-gather and
    a reduce-scatter each), again in the backward under a recomputation replaying them
    (``fwd_repeats``). Backward, only in blocks that run one: the column-parallel inputs'
    gradients, exposed; or with EngineSpec.tp_grad_overlap beside the weight-gradient GEMMs, and
    under sequence parallelism the row-parallel gradients' all-gather exposed and the inputs of
    trained column-parallel weights all-gathered again beside their input-gradient GEMMs; or with
    EngineSpec.tp_overlap (under sequence parallelism) all of it, the second all-gather too,
    beside the block's compute outside attention. A block whose collectives run in forward only
    (an embedding's) has its count of latencies there. ``gathered``: per block, the shares of
    their 16-bit bytes that the all-gathers of inputs and of output gradients carry
    (precision.sp_gather_shares: FP8 layers gather FP8)."""
    slowdown = cluster.device.overlap_slowdown
    runs = w.runs_backward
    count = w.tp_collectives * (2 if sp else 1)  # sp: reduce-scatter + all-gather per all-reduce
    fwd_count = np.where(w.tp_bwd_bytes > 0, count / 2, count)
    bwd_count = (count - fwd_count) * runs
    fwd_b, bwd_b = share * w.tp_fwd_bytes, share * w.tp_bwd_bytes * runs
    inputs, grads = gathered

    def reduced_s(nbytes, calls, gathered_bytes):
        # an all-reduce's traffic in ``calls`` collectives; under sequence parallelism half of
        # them all-gathers (of ``gathered_bytes``) and half reduce-scatters, each with its own
        # (half) latency
        if not sp:
            return comm.allreduce_s(nbytes, group, cluster, count=calls)
        return comm.allgather_s(gathered_bytes, group, cluster, count=calls / 2) + \
            comm.reduce_scatter_s(nbytes, group, cluster, count=calls / 2)

    fwd_s = reduced_s(fwd_b, fwd_count, fwd_b * inputs)
    zero = np.zeros(len(fwd_b))
    if tp <= 1:
        return zero, zero, zero
    dgrad = np.array([t.tp_col_dgrad_s for t in bt])
    wgrad = np.array([t.tp_col_wgrad_s for t in bt])
    trained = wgrad > 0  # (frozen column weights: their inputs are not gathered again)
    grad_overlap = engine.tp_grad_overlap
    whole = (engine.tp_overlap and sp) or not grad_overlap
    if whole:  # every collective as one all-reduce's traffic, forward (replays too) and backward
        total = reduced_s(fwd_repeats * fwd_b + bwd_b, fwd_repeats * fwd_count + bwd_count,
                          fwd_repeats * fwd_b * inputs + bwd_b * grads)
    if engine.tp_overlap and sp:  # pipelined with the GEMMs (EngineSpec.tp_overlap)
        window = np.array([t.fwd_s + t.bwd_s + t.recompute_s - t.attn_fwd_s - t.attn_bwd_s
                           for t in bt])
        if grad_overlap:  # (Megatron-Core's second all-gather, beside compute with the rest)
            total = total + np.where(trained, comm.allgather_s(bwd_b * inputs, group, cluster,
                                                               count=bwd_count / 2), 0.0)
        out = comm.beside_compute_s(total, window, slowdown)
        with np.errstate(divide="ignore", invalid="ignore"):
            fwd = np.where(total > 0, out * fwd_s / total, 0.0)
        return out, fwd, zero
    if whole:  # (exposed: Linear layers that wait for each collective)
        return total, fwd_s, zero
    replay = (fwd_repeats - 1) * fwd_s  # (recomputation's forward collectives, in backward)
    if sp:  # the row-parallel gradients' all-gather exposed; the column-parallel inputs
        # all-gathered again beside their input gradients, those reduce-scattered beside the
        # weight gradients
        exposed = comm.allgather_s(bwd_b * grads, group, cluster, count=bwd_count / 2)
        regather = np.where(trained, comm.beside_compute_s(
            comm.allgather_s(bwd_b * inputs, group, cluster, count=bwd_count / 2), dgrad,
            slowdown), 0.0)
        full = comm.reduce_scatter_s(bwd_b, group, cluster, count=bwd_count / 2)
    else:
        exposed = regather = zero
        full = comm.allreduce_s(bwd_b, group, cluster, count=bwd_count)
    beside = comm.beside_compute_s(full, wgrad, slowdown)
    return fwd_s + replay + exposed + regather + beside, fwd_s, full - beside


def config_costs(ma: ModelArrays, cluster: Cluster, training: TrainingSpec,
                 cfg: Config) -> BlockCosts:
    """block_costs for the knobs of ``cfg``."""
    return block_costs(ma, cluster, training, tp=cfg.tp, sp=cfg.sequence_parallel,
                       recompute=cfg.recompute, micro_batch=cfg.micro_batch, cp=cfg.cp,
                       cp_comm=cfg.cp_comm, ep=cfg.ep, etp=cfg.etp)


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
    bpp = (state_bytes_per_param(cfg, training)[0],
           state_bytes_per_param(cfg, training, trainable=False)[0])  # (trained, frozen)
    copy = fp8_copy_bytes_per_param(cfg, training)
    rank_in_flight = in_flight_per_rank(cfg.schedule, cfg.pp, cfg.num_microbatches, cfg.vpp)
    layer = ma.checkpointed
    # a tied weight held once keeps an FP8 copy where a layer reads it
    shared = [(a, b, (bpp[frozen] - (0.0 if layer[a] and layer[b] else copy))
               * (n / cfg.tp if split else n)) for a, b, n, split, frozen in ma.shared]
    static = block_state_bytes(cfg, costs, ma, training)
    return StageMemory(static=static.tolist(), act=costs.act_bytes.tolist(),
                       work=working_bytes(cfg, costs, training).tolist(),
                       in_flight=[rank_in_flight[c % cfg.pp] for c in range(cfg.pp * cfg.vpp)],
                       capacity=capacity / cfg.vpp, shared=shared)


@functools.lru_cache(maxsize=4096)
def in_flight_per_rank(schedule: str, pp: int, microbatches: int, vpp: int) -> tuple:
    """Per pipeline rank: costmodels.pipeline.in_flight (an int or a float, as it gives it)."""
    return tuple(pipeline.in_flight(schedule, stage=r, stages=pp, microbatches=microbatches,
                                    vpp=vpp) for r in range(pp))


def working_bytes(cfg: Config, costs: BlockCosts, training: TrainingSpec) -> np.ndarray:
    """Per block: the bytes it needs only while it runs (BlockCosts.work_bytes) and, where ZeRO-2/3
    reduce gradients as the backward makes them, its gradient whole until its reduce-scatter;
    under ZeRO-3 also its weights gathered and the next block's prefetched (taken as large). Only
    parameters ZeRO shards count: the dense ones over dp x cp replicas, the routed experts' over
    their edp replicas; with one replica (edp = 1: each expert on one rank) their gradients and
    weights are whole in the model states already, unless an FSDP2 of their own wraps them
    anyway (EngineSpec.fsdp_copies: torchtitan shards the experts over their own mesh, one rank
    or more, and so gathers 16-bit copies). The stage split and the priced plan (pricing.Split)
    both take a stage's largest."""
    if cfg.zero < 2:
        return costs.work_bytes
    grad_b = memory.model_state_bytes(1.0, dtype=training.dtype, optimizer=training.optimizer,
                                      zero=0, dp=1, layout=training.engine.state_layout)["grads"]
    gathered_b = 2 * DTYPE_BYTES[precision.core_dtype(training.dtype)] if cfg.zero == 3 else 0.0
    dense_on = cfg.dp * cfg.cp > 1 and not deferred_sync(cfg, training)
    experts_on = ((cfg.edp > 1 or training.engine.fsdp_copies)
                  and not expert_deferred_sync(cfg, training))
    dense = costs.params_local - costs.expert_params_local
    frozen_dense = costs.frozen_local - costs.frozen_expert_local
    trained = ((dense - frozen_dense) * dense_on
               + (costs.expert_params_local - costs.frozen_expert_local) * experts_on)
    held = dense * dense_on + costs.expert_params_local * experts_on  # frozen weights gathered too
    return costs.work_bytes + grad_b * trained + gathered_b * held


def block_state_bytes(cfg: Config, costs: BlockCosts, ma: ModelArrays,
                      training: TrainingSpec) -> np.ndarray:
    """Per block: its model-state bytes on one GPU after ZeRO sharding (state_bytes_per_param);
    the dense parameters of blocks outside the repeated layers keep no FP8 weight copies, since
    their GEMMs stay 16-bit (costmodels.precision)."""
    bpp, expert_bpp = state_bytes_per_param(cfg, training)
    frozen_bpp, frozen_expert_bpp = state_bytes_per_param(cfg, training, trainable=False)
    dense = costs.params_local - costs.expert_params_local
    frozen_dense = costs.frozen_local - costs.frozen_expert_local
    static = ((dense - frozen_dense) * bpp + frozen_dense * frozen_bpp
              + (costs.expert_params_local - costs.frozen_expert_local) * expert_bpp
              + costs.frozen_expert_local * frozen_expert_bpp)
    copy = fp8_copy_bytes_per_param(cfg, training)
    return static - np.where(ma.checkpointed, 0.0, dense) * copy if copy else static


def fp8_copy_bytes_per_param(cfg: Config, training: TrainingSpec) -> float:
    """Bytes of FP8 weight copies per dense parameter after ZeRO sharding (0 unless fp8): the
    part of state_bytes_per_param the blocks outside the layers do not hold."""
    if training.dtype != "fp8":
        return 0.0
    return memory.model_state_bytes(
        1.0, dtype=training.dtype, optimizer=training.optimizer, zero=cfg.zero,
        dp=cfg.dp * cfg.cp, offload=cfg.offload_optimizer,
        layout=training.engine.state_layout,
        fp8_copies=training.engine.fp8_copies).get("fp8_weights", 0.0)


def state_bytes_per_param(cfg: Config, training: TrainingSpec,
                          trainable: bool = True) -> tuple[float, float]:
    """Model-state bytes per local parameter after ZeRO sharding: (dense parameters, whose states
    ZeRO shards over the dp x cp ranks holding them; routed experts', sharded over their edp
    replicas); ``trainable=False``: of frozen ones (weights only)."""
    kw = dict(dtype=training.dtype, optimizer=training.optimizer, zero=cfg.zero,
              offload=cfg.offload_optimizer, layout=training.engine.state_layout,
              trainable=trainable, fp8_copies=training.engine.fp8_copies)
    return (memory.state_bytes_per_param(dp=cfg.dp * cfg.cp, **kw,
                                         deferred=deferred_sync(cfg, training)),
            memory.state_bytes_per_param(dp=cfg.edp, **{**kw, "dtype": experts_dtype(training)},
                                         deferred=expert_deferred_sync(cfg, training)))


def experts_dtype(training: TrainingSpec) -> str:
    """The dtype the routed experts' weights train in: bf16 where the engine keeps their GEMMs
    16-bit under fp8 (EngineSpec.fp8_experts: no FP8 weight copies of theirs), else the plan's."""
    return "bf16" if training.dtype == "fp8" and not training.engine.fp8_experts \
        else training.dtype


def fsdp_pipelined(cfg: Config, training: TrainingSpec) -> bool:
    """Whether FSDP2-style data parallelism (EngineSpec.fsdp_copies) runs under
    torch.distributed.pipelining's schedules (a pipeline, or an engine that always uses them:
    EngineSpec.pipelined_accumulation). For every micro-batch, the last included, they turn
    FSDP2's gradient sync and its reshard after backward off, and reduce the gradients once
    after all the backward passes (PipelineStage.backward_maybe_with_nosync and
    perform_reduce_grad, torch 2.13): the reduction is not hidden behind backward, and
    parameters a backward gathered stay gathered."""
    engine = training.engine
    return engine.fsdp_copies and (cfg.pp > 1 or engine.pipelined_accumulation)


def deferred_sync(cfg: Config, training: TrainingSpec) -> int:
    """The micro-batches whose dense gradients wait unreduced for the step's reduction
    (costmodels.memory.model_state_bytes ``deferred``), 0 when the sync is not deferred or
    there is nothing to reduce over (one replica)."""
    if not fsdp_pipelined(cfg, training) or cfg.dp * cfg.cp <= 1:
        return 0
    return cfg.num_microbatches


def expert_deferred_sync(cfg: Config, training: TrainingSpec) -> int:
    """deferred_sync for the routed experts' gradients. Without expert parallelism they are
    wrapped with the dense ones. With it, `plan run` keeps them out of the data-parallel wrapper,
    accumulating in their own gradients until one reduction over edp after the schedule: whole
    until then (ZeRO's sharding comes only with the reduction) but without replicate's second
    buffer at ZeRO-0; torchtitan wraps them in an FSDP of their own, deferred the same way
    (over their own replicas, edp, however many dense ones there are)."""
    if cfg.ep == 1:
        return deferred_sync(cfg, training)
    if not fsdp_pipelined(cfg, training) or cfg.edp <= 1 or cfg.zero == 0:
        return 0
    return cfg.num_microbatches
