"""Expert parallelism: what moving routed tokens to their experts and back costs.

A Mixture-of-Experts layer routes each token to top-k experts; with expert parallelism the
experts live on ``ep`` ranks, so each token copy travels to its expert's rank (dispatch) and its
result travels back (combine), in forward and again, as gradients, in backward (Lepikhin et al.,
"GShard", 2020; Fedus et al., "Switch Transformers", 2022). Three dispatchers
(costmodels.engine.EngineSpec.moe_dispatcher):

- ``alltoall``: each rank sends every token copy to the rank of its expert: an all-to-all of the
  rank's token copies (hidden states), dispatch and combine;
- ``allgather``: each rank gathers the tokens of the whole expert-parallel group (once per token,
  not per copy) and keeps those routed to its experts; the combine is a reduce-scatter;
- ``deepep``: DeepEP's kernels (DeepSeek-AI, github.com/deepseek-ai/DeepEP; DeepSeek-V3 technical
  report, section 3.2.2): a token crosses the network once per node holding any of its experts,
  to the GPU of the same index there, which forwards it over the node's links once per GPU
  holding any of them; the combine reduces on the way back (node_sends).

With expert tensor parallelism (``etp`` > 1) the token copies are also all-gathered over the etp
group before the experts' GEMMs and reduce-scattered after. The busiest rank (``load``, the
routing imbalance) sets the time. Sizes are per micro-batch on one GPU.
"""

from __future__ import annotations

import math

import numpy as np

from costmodels import comm, memory
from costmodels.comm import GroupShape
from costmodels.compute import expected_max_normal
from costmodels.engine import EngineSpec
from costmodels.topology import Cluster


COUNT_BYTES = 8
"""Bytes of one expert's token count in the count exchange before a dispatch (int64)."""


def rank_load(engine: EngineSpec, *, ep: int, num_experts: int) -> float:
    """Token copies the busiest of ``ep`` expert-parallel ranks computes, relative to the mean,
    each rank holding ``num_experts / ep`` experts of a layer.

    ``engine.moe_imbalance`` is the busiest expert's share over the mean (capped by the capacity
    factor when tokens are dropped). Taking the experts' loads as independent with a common
    coefficient of variation ``c``, the busiest of E experts carries 1 + c E[max of E normals]
    (costmodels.compute.expected_max_normal), which gives ``c``; a rank's E/ep experts carry
    E/ep times the mean with relative spread c / sqrt(E/ep), so the busiest of the ep ranks
    carries 1 + c sqrt(ep/E) E[max of ep normals]: 1 with one rank (nothing to wait for), the
    expert imbalance itself with one expert per rank, and never more than ep (every copy on one
    rank). Against symmetric-Dirichlet loads (E 8-256, ep 2-32, 20,000 draws each) it is always
    pessimistic: +0.4% to +2% on the busiest rank for an expert imbalance below 2, +3% to +7%
    at 2.2-2.7, +8% to +16% at 3.4-6 with 8 ranks, +24% at 6 with 32 ranks (256 experts), and
    more beyond, where the loads' spread is far from normal. With every expert padded to its
    capacity (``engine.moe_pad_to_capacity``) each computes the capacity factor times the mean,
    however the tokens are routed and whatever the expert parallelism."""
    if engine.moe_pad_to_capacity:
        return engine.moe_capacity_factor
    imbalance = engine.moe_imbalance
    if engine.moe_capacity_factor:
        imbalance = min(imbalance, engine.moe_capacity_factor)
    if ep <= 1 or num_experts <= 1 or imbalance <= 1.0:
        return 1.0
    ep = min(ep, num_experts)
    spread = (imbalance - 1.0) / expected_max_normal(num_experts)
    return min(float(ep), 1.0 + spread * (ep / num_experts) ** 0.5 * expected_max_normal(ep))


def dispatch_s(dispatcher: str, *, copies_bytes: float, tokens_bytes: float, ep: int,
               ep_group: GroupShape, etp_group: GroupShape, cluster: Cluster,
               load: float = 1.0, layers: int = 1, etp_replicated: bool = False) -> float:
    """Seconds of one forward's dispatch and combine for ``layers`` MoE layers (backward moves
    the same bytes again). ``copies_bytes``: hidden states of the rank's token copies (tokens x
    top-k); ``tokens_bytes``: of its tokens (once each). Sizes may be numpy arrays (one entry
    per block; ``layers`` then counts each block's MoE layers, for the latency term).

    ``alltoall``: the copies to their experts' ranks over ep and back, then gathered over the
    expert tensor-parallel ranks and reduce-scattered back (Megatron-Core's
    MoEAlltoAllTokenDispatcher); with ``etp_replicated`` (EngineSpec.moe_etp_replicated) the
    tokens are gathered over the etp ranks before routing and reduce-scattered after the
    combine, and every etp rank all-to-alls the copies of all of them; ``allgather``: every
    token gathered once over the whole ep x etp group and reduce-scattered back
    (MoEAllGatherTokenDispatcher: "this allgather spans the communication domain of TP*EP")."""
    if ep <= 1 and etp_group.size <= 1:
        return 0.0 * copies_bytes
    if dispatcher == "allgather":
        group = comm.folded(etp_group, ep_group) if ep > 1 else etp_group
        gathered = tokens_bytes * group.size
        return comm.allgather_s(gathered, group, cluster, count=layers) + \
            comm.reduce_scatter_s(gathered, group, cluster, count=layers)
    t = 0.0 * copies_bytes
    if etp_replicated and etp_group.size > 1:
        gathered = tokens_bytes * etp_group.size
        t += comm.allgather_s(gathered, etp_group, cluster, count=layers) + \
            comm.reduce_scatter_s(gathered, etp_group, cluster, count=layers)
        if ep > 1:
            t += 2 * comm.alltoall_s(copies_bytes * load * etp_group.size, ep_group, cluster,
                                     count=layers)
        return t
    if ep > 1:
        t += 2 * comm.alltoall_s(copies_bytes * load, ep_group, cluster, count=layers)
    if etp_group.size > 1:
        gathered = copies_bytes * load * etp_group.size
        t += comm.allgather_s(gathered, etp_group, cluster, count=layers) + \
            comm.reduce_scatter_s(gathered, etp_group, cluster, count=layers)
    return t


def _missed(num_experts: int, held: float, topk: int) -> float:
    """The chance that none of a token's ``topk`` distinct experts, drawn evenly from
    ``num_experts``, is among ``held`` of them."""
    p = 1.0
    for i in range(min(topk, int(num_experts))):
        p *= max(0.0, (num_experts - held - i) / (num_experts - i))
    return p


def _hit(num_experts: int, held: float, topk: int, groups: int = 0,
         group_topk: int = 0) -> float:
    """The chance that ``held`` consecutive experts of ``num_experts`` hold one of a token's
    ``topk``. Routing is even: ``topk`` distinct experts drawn uniformly, or, with group-limited
    routing (``groups`` equal groups of consecutive experts, of which each token keeps the
    ``group_topk`` best and takes its experts from those: DeepSeek-V3's node-limited routing,
    8 groups, 4 per token), ``group_topk`` groups drawn uniformly and the experts uniformly from
    them. Where the held experts neither are whole groups nor divide one, the groups are left out
    (even routing over all the experts)."""
    size = num_experts / groups if groups > 1 and 0 < group_topk < groups else 0.0
    if not size or held >= num_experts or group_topk * size < topk:  # (too few to keep to)
        return 1.0 - _missed(num_experts, held, topk)
    pool = group_topk * size  # the experts of the token's groups
    if held >= size and held % size == 0:  # whole groups: j of them among the token's
        h = int(held // size)
        miss = sum(math.comb(h, j) * math.comb(groups - h, group_topk - j)
                   / math.comb(groups, group_topk) * _missed(int(pool), j * size, topk)
                   for j in range(0, min(h, group_topk) + 1))
        return 1.0 - miss
    if size % held == 0:  # part of one group: taken with it
        return group_topk / groups * (1.0 - _missed(int(pool), held, topk))
    return 1.0 - _missed(num_experts, held, topk)


def node_sends(num_experts: int, topk: int, *, ep: int, etp: int,
               group: GroupShape, groups: int = 0, group_topk: int = 0) -> tuple[float, float]:
    """DeepEP's sends of one token in one direction out of one GPU, in hidden-state copies:
    (over the node's links, over the network). ``group``: the ep x etp ranks the dispatch spans
    (etp ranks of an expert next to each other), ``num_experts / ep`` experts on each rank, each
    expert's matrices split over its etp ranks (every one of them gets the token).

    Routing is taken as even (top-k distinct experts drawn uniformly: the balanced routing the
    published benchmarks force). With q_r the chance that a given rank holds one of the token's
    experts and q_n that a given node does, a token goes over the network to the (N - 1) q_n
    other nodes it needs on average (N nodes in the group), and over the node's links to the
    (g - 1) q_r other GPUs it needs in its own node (g of the group's ranks per node); each GPU
    also forwards the tokens the network brings it to the (g - 1) q_r / q_n others of its node
    that need them, so its node-link sends total (g - 1) q_r N: N times the all-to-all's volume
    over the node's links (without collisions), so the more of the group a node holds, the more
    its links carry. The network carries a token once per node rather than once per copy: k (N -
    1) / N copies become (N - 1) q_n. ``group`` is taken as N equal nodes. ``groups`` and
    ``group_topk``: group-limited routing (_hit), which bounds the nodes a token reaches where
    the nodes hold whole groups (DeepSeek-V3 at ep 64 on 8 nodes: at most 4, about 3.2 other
    nodes instead of 4.6)."""
    size, g = group.size, min(group.per_node, group.size)
    if size <= 1:
        return 0.0, 0.0
    nodes = max(1, size // g)
    per_rank = num_experts / ep
    ranks_of_node = max(1, g // etp)  # expert-parallel ranks (sets of experts) on one node
    q_rank = _hit(num_experts, per_rank, topk, groups, group_topk)
    q_node = _hit(num_experts, min(num_experts, per_rank * ranks_of_node), topk, groups,
                  group_topk)
    return (g - 1) * q_rank * nodes, (nodes - 1) * q_node


def node_sends_s(nbytes, intra_copies, inter_copies, group: GroupShape, cluster: Cluster,
                 count=1):
    """One direction of DeepEP's dispatch (or combine) of ``nbytes`` of tokens per GPU sent as
    ``intra_copies`` and ``inter_copies`` (node_sends): the node's links and the network at once,
    the slower setting the time (DeepEP overlaps the forwarding with the network sends)."""
    if group.size <= 1:
        return 0.0 * nbytes
    return comm.both_tiers_s(nbytes * intra_copies, nbytes * inter_copies, cluster,
                             spans_nodes=group.per_node < group.size, count=count)


def gathered_bytes(dispatcher: str, *, dispatch_bytes, routed_tokens, seq_len: int,
                   share: float, ep: int, etp: int, moe_layers):
    """Per block (numpy arrays over blocks): the transient buffer the ``allgather`` dispatcher
    fills in one MoE layer: every token of the ep x etp group's ranks (``share``: samples' worth
    of tokens one rank holds; ``dispatch_bytes`` and ``routed_tokens`` per sample over the block's
    ``moe_layers``). The combine reduce-scatters a buffer of the same size, after the gathered
    input is gone. The alltoall dispatcher moves token copies, which the routed activations hold
    (costmodels.memory): 0."""
    if dispatcher != "allgather" or ep * etp <= 1:
        return 0.0 * dispatch_bytes
    layers = np.maximum(moe_layers, 1.0)
    return share * dispatch_bytes / copies_per_token(routed_tokens, seq_len, layers) / layers \
        * ep * etp


def copies_per_token(routed_tokens, seq_len: int, moe_layers):
    """The routed copies of a token in one MoE layer (its top-k), per block: ``routed_tokens`` per
    sample over the block's ``moe_layers`` (1 where the block routes nothing)."""
    layers = np.maximum(moe_layers, 1.0)
    return np.where(routed_tokens > 0, routed_tokens / (seq_len * layers), 1.0)


def overlap_blockers(engine: EngineSpec, *, ep: int, recompute: str, dtype: str, pp: int,
                     vpp: int) -> list[str]:
    """What keeps the overlapped dispatch (EngineSpec.moe_overlap) off a configuration, in the
    words "needs ...": Megatron-Core's TransformerConfig refuses --overlap-moe-expert-parallel-comm
    without expert parallelism, without the alltoall or flex (deepep) dispatcher, with full
    recomputation, in fp32 and, with a pipeline, without virtual stages
    (megatron/core/transformer/transformer_config.py, core_v0.19.0); its combined schedule is
    the overlap this cost model prices. Empty: it runs."""
    why = [] if ep > 1 else ["expert parallelism (ep > 1)"]
    if engine.moe_dispatcher not in ("alltoall", "deepep"):
        why.append("the alltoall or deepep dispatcher")
    if recompute in ("full", "op") or memory.layer_interval(recompute):
        why.append("no full recomputation")
    if dtype == "fp32":
        why.append("bf16 or fp16")
    if pp > 1 and vpp == 1:
        why.append("virtual pipeline stages when pp > 1")
    return why


def unpaired_share(micro_batches: int, pp: int = 1, vpp: int = 1) -> float:
    """Of a pipeline rank's forward (and backward) chunk passes, the share that runs with no pass
    of another micro-batch beside it under the overlapped dispatch: the first rank's warm-up
    forwards (and as many cool-down backwards), 2 (pp - 1) + (vpp - 1) pp + 1 of its
    micro-batches x vpp chunks under interleaved 1F1B (Megatron-Core's get_pp_rank_microbatches,
    core_v0.19.0 schedules.py: the warm-up of pipeline rank 0, one more with the overlap, so that
    every 1F1B step pairs independent passes), at least the first one (pp = 1: one forward
    alone, then each forward beside the previous micro-batch's backward). The first rank has the
    most and sets the step. 0 micro-batches: 0 (the steady state)."""
    if not micro_batches:
        return 0.0
    passes = micro_batches * vpp
    warmup = 2 * (pp - 1) + (vpp - 1) * pp + 1 if pp > 1 else 1
    return min(passes, max(1, warmup)) / passes


def reads_compute(engine, ep: int) -> bool:
    """Whether block_dispatch_s reads the compute it is given (``fwd_s``, ``bwd_s``,
    ``shared_fwd_s``, ``shared_bwd_s``, and the schedule's ``micro_batches``, ``pp``, ``vpp``):
    only to hide the all-to-alls behind it, under EngineSpec.moe_overlap or (with expert
    parallelism) moe_shared_overlap. Otherwise its answer is the same for every recomputation
    policy that replays the forward alike, which the search prices once
    (planner.search.costs._least_dispatch_s)."""
    return engine.moe_overlap or (engine.moe_shared_overlap and ep > 1)


def block_dispatch_s(engine, *, dispatch_bytes, routed_tokens, seq_len: int, share: float,
                     ep: int, ep_group: GroupShape, etp_group: GroupShape, cluster: Cluster,
                     recompute_full, fwd_s=0.0, bwd_s=0.0, num_experts=0.0,
                     moe_layers=0.0, micro_batches: int = 0, pp: int = 1, vpp: int = 1,
                     capacity=0.0, groups=0.0, group_topk=0.0, shared_fwd_s=None,
                     shared_bwd_s=None):
    """Per block (numpy arrays over blocks): the dispatch and combine it exposes per micro-batch,
    forward and backward (``recompute_full``, one for every block or per block: full
    recomputation replays the forward's). ``dispatch_bytes`` and
    ``routed_tokens`` per sample, ``moe_layers`` per block (costmodels.workload.BlockWork; a
    block traced before it was recorded counts one where it dispatches); ``share``: samples' worth of
    tokens the rank holds (its 1/(tp x cp) of the micro-batch: MoE layers run
    sequence-parallel); ``fwd_s``, ``bwd_s``: the block's compute for one micro-batch in its
    forward and in its backward pass (with any recomputation); ``num_experts``: the routed
    experts of the block's MoE layer, whose busiest rank the all-to-alls wait for (rank_load),
    except where ``capacity`` marks capacity-style experts (BlockWork.expert_capacity), whose
    slots are sent whole however the tokens were routed. With an overlapped dispatch
    (EngineSpec.moe_overlap) the engine runs one micro-batch's forward next to another's
    backward (Megatron-Core's batch-level EP overlap, "merging FWD-BWD passes of adjacent
    microbatches"; DeepSeek-V3's DualPipe pairs chunks the same way), so the forward's
    all-to-alls run behind the partner's backward compute and the backward's (with a replayed
    forward's) behind the partner's forward: only what exceeds each is exposed, neither pass
    lending the other its spare time. The passes with no partner expose their all-to-alls
    whole (unpaired_share: the warm-up's forwards and the cool-down's backwards of the first
    pipeline rank, of ``micro_batches`` micro-batches over ``pp`` ranks of ``vpp`` chunks each;
    0 micro-batches: the steady state).
    ``groups``, ``group_topk``: the router's group-limited routing (BlockWork.expert_groups),
    which DeepEP's sends follow (node_sends). ``shared_fwd_s``, ``shared_bwd_s``: per block, the
    shared expert's GEMMs in each pass (BlockTime.shared_fwd_s), which
    EngineSpec.moe_shared_overlap runs beside that pass's all-to-alls. With the alltoall and
    deepep dispatchers each forward (and a replayed one) first exchanges the per-expert token
    counts over the ep group (COUNT_BYTES each), which nothing hides."""
    layers = np.where(dispatch_bytes > 0, np.maximum(moe_layers, 1.0), 0.0)
    load = 1.0
    # (a search prices this often: skip the even case)
    if engine.moe_pad_to_capacity or (engine.moe_imbalance > 1.0 and ep > 1):
        counts, index = np.unique(np.broadcast_to(num_experts, layers.shape), return_inverse=True)
        load = np.array([rank_load(engine, ep=ep, num_experts=int(e)) for e in counts])[index]
        load = np.where(np.asarray(capacity) > 0, 1.0, load)
    topk = copies_per_token(routed_tokens, seq_len, layers)
    fwd = dispatch_s(engine.moe_dispatcher, copies_bytes=share * dispatch_bytes,
                     tokens_bytes=share * dispatch_bytes / topk, ep=ep, ep_group=ep_group,
                     etp_group=etp_group, cluster=cluster, load=load,
                     layers=layers, etp_replicated=engine.moe_etp_replicated)
    group = comm.folded(etp_group, ep_group)
    # capacity-style experts' slots go as an all-to-all's; so does a group whose nodes hold
    # unequal numbers of its ranks (DeepEP's kernels take equal ones: not priced here)
    if engine.moe_dispatcher == "deepep" and group.size % min(group.per_node, group.size) == 0:
        rows = np.stack(np.broadcast_arrays(num_experts, np.rint(topk), groups, group_topk))
        counts, index = np.unique(rows.reshape(4, -1).T, axis=0, return_inverse=True)
        sends = np.array([node_sends(int(e), int(k), ep=ep, etp=etp_group.size, group=group,
                                     groups=int(gs), group_topk=int(gk))
                          if e > 0 and k > 0 else (0.0, 0.0) for e, k, gs, gk in counts])
        intra, inter = sends[index.ravel(), 0], sends[index.ravel(), 1]
        node = 2 * node_sends_s(share * dispatch_bytes / topk * load, intra.reshape(layers.shape),
                                inter.reshape(layers.shape), group, cluster, count=layers)
        fwd = np.where(np.asarray(capacity) > 0, fwd, node)
    replay = np.asarray(recompute_full, dtype=bool)  # (per block, or one for every block)
    back = fwd * np.where(replay, 2.0, 1.0)  # the backward pass's (and a replayed forward's)
    if engine.moe_shared_overlap and not engine.moe_overlap and shared_fwd_s is not None \
            and ep > 1:  # (the two are exclusive: EngineSpec refuses both)
        # the shared expert's GEMMs beside the all-to-alls, on a stream of their own: each pass's
        # hide behind that pass's shared-expert compute (a replayed forward's behind its own)
        slow = cluster.device.overlap_slowdown
        fwd_alone = fwd
        fwd = comm.beside_compute_s(fwd, shared_fwd_s, slow)
        back = comm.beside_compute_s(fwd_alone, shared_bwd_s, slow) + np.where(replay, fwd, 0.0)
    total = fwd + back
    if engine.moe_overlap:
        paired = 1.0 - unpaired_share(micro_batches, pp, vpp)
        slow = cluster.device.overlap_slowdown  # the partner's compute, slowed beside them
        exposed = comm.beside_compute_s(fwd, bwd_s, slow) + comm.beside_compute_s(back, fwd_s, slow)
        total = (1 - paired) * total + paired * exposed
    if engine.moe_dispatcher != "allgather" and ep > 1:
        # before its dispatch each rank learns how many copies it will receive: an exchange of
        # the per-expert token counts in every MoE layer's forward (a replayed forward's too;
        # Megatron-Core's alltoall dispatcher gathers them over the ep group in its preprocess,
        # DeepEP's dispatch notifies them before it sends, the runtime all-to-alls them), which
        # the dispatch waits for: never hidden. (The allgather dispatcher's sizes are fixed.)
        counts = comm.alltoall_s(COUNT_BYTES * np.asarray(num_experts, dtype=float), ep_group,
                                 cluster, count=layers)
        total = total + counts * np.where(replay, 2.0, 1.0)
    return np.where(layers > 0, total, 0.0)
