"""Context-parallel K/V exchange, expert dispatch and the experts' GEMMs (costmodels.context,
costmodels.experts, costmodels.compute)."""

import dataclasses
import math

import numpy as np
import pytest

from costmodels import comm, context, experts
from costmodels.comm import GroupShape
from costmodels.compute import Experts, expected_max_normal, split_gemm
from costmodels.engine import EngineSpec, engine_from_mapping
from costmodels.errors import SpecError
from costmodels.topology import get_cluster
from costmodels.workload import SPLIT_K, SPLIT_N, Gemm

H100 = get_cluster("dgx-h100", nodes=4)
CLUSTER = dataclasses.replace(H100, device=dataclasses.replace(H100.device, overlap_slowdown=0.0))
"""DGX H100 nodes with hiding communication priced free: the exchanges' own structure (what
hiding costs the compute beside it: test_hidden_communication_slows_the_compute_beside_it)."""
NODE = GroupShape(size=8, per_node=8)


def test_hidden_communication_slows_the_compute_beside_it():
    """Compute runs 1 / (1 + s) as fast while a collective runs beside it (s: the device's
    overlap_slowdown, 18.9% on GPUs): a send the ring hides behind attention still costs
    s / (1 + s) of its time; one that outlasts the stretched attention exposes what is left."""
    s = H100.device.overlap_slowdown
    assert s == pytest.approx(0.189)
    assert comm.beside_compute_s(1.0, 10.0, s) == pytest.approx(s / (1 + s))
    assert comm.beside_compute_s(3.0, 1.0, s) == pytest.approx(2.0)
    assert comm.beside_compute_s(1.0, 0.0, s) == pytest.approx(1.0)  # nothing to hide behind
    kv = 64e6
    send = comm.p2p_s(kv / 8, H100.intra_node)
    fwd, bwd = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=8 * send * 2,
                                  attn_bwd_s=8 * send * 5, group=NODE, cluster=H100)
    assert fwd == pytest.approx(7 * send * s / (1 + s))
    free = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=8 * send * 2,
                              attn_bwd_s=8 * send * 5, group=NODE, cluster=CLUSTER)
    assert free == (0.0, 0.0) and bwd > 0.0


def test_ring_hides_kv_behind_long_attention_and_exposes_it_behind_short():
    kv = 64e6  # bytes of K/V of the whole sequence on this rank
    send = comm.p2p_s(kv / 8, CLUSTER.intra_node)
    hidden = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=8 * send * 2,
                                attn_bwd_s=8 * send * 5, group=NODE, cluster=CLUSTER)
    assert hidden == (0.0, 0.0)
    fwd, bwd = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=0.0,
                                  attn_bwd_s=0.0, group=NODE, cluster=CLUSTER)
    assert fwd == pytest.approx(7 * send)  # cp - 1 sends, nothing to hide behind
    assert bwd == pytest.approx(7 * comm.p2p_s(2 * kv / 8, CLUSTER.intra_node))


def test_a_ring_that_returns_gradients_to_their_owner_exposes_the_last_send():
    """The runtime's ring sends each backward step's fp32 K/V gradients straight back: with two
    ranks that one send follows all the compute, so however long attention runs it is exposed
    whole; with more ranks the earlier sends hide behind the later steps."""
    kv = 64e6
    grads = comm.p2p_s(2 * kv / 2, CLUSTER.intra_node)  # bf16 K/V, fp32 gradients: 2x the bytes
    _, bwd = context.exchange_s("p2p", cp=2, kv_bytes=kv, q_bytes=kv, attn_fwd_s=10.0,
                                attn_bwd_s=10.0, group=NODE, cluster=CLUSTER, gradients_back=2.0)
    assert bwd == pytest.approx(grads)
    _, around = context.exchange_s("p2p", cp=2, kv_bytes=kv, q_bytes=kv, attn_fwd_s=10.0,
                                   attn_bwd_s=10.0, group=NODE, cluster=CLUSTER)
    assert around == 0.0  # K/V and gradients passed around the ring hide behind long attention
    send = comm.p2p_s(2 * kv / 8, CLUSTER.intra_node)
    _, long = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=10.0,
                                 attn_bwd_s=10.0, group=NODE, cluster=CLUSTER, gradients_back=2.0)
    _, short = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=0.0,
                                  attn_bwd_s=0.0, group=NODE, cluster=CLUSTER, gradients_back=2.0)
    assert long == pytest.approx(send) and short == pytest.approx(7 * send)


def test_torchs_ring_passes_fp32_gradients_on_and_moves_more_in_backward():
    kv = 64e6
    te = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=0.0, attn_bwd_s=0.0,
                            group=NODE, cluster=CLUSTER)
    torch_ring = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=0.0,
                                    attn_bwd_s=0.0, group=NODE, cluster=CLUSTER, gradients_on=2.0)
    assert torch_ring[0] == te[0] and torch_ring[1] > te[1]
    assert torch_ring[1] == pytest.approx(7 * comm.p2p_s(3 * kv / 8, CLUSTER.intra_node))
    # torch's ring then passes the gradients once more, after its last step, each rank getting
    # its own back (the dK/dV rotater awaited after the loop): exposed
    last = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=0.0,
                              attn_bwd_s=100.0, group=NODE, cluster=CLUSTER, gradients_on=2.0,
                              passes_last=True)
    hidden = context.exchange_s("p2p", cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=0.0,
                                attn_bwd_s=100.0, group=NODE, cluster=CLUSTER, gradients_on=2.0)
    assert last[1] - hidden[1] == pytest.approx(comm.p2p_s(2 * kv / 8, CLUSTER.intra_node))


def test_torchs_gathered_ring_passes_fp32_gradients_around_instead_of_reduce_scattering():
    """torch's templated ring with the all-gather rotater (torchtitan's context parallelism)
    all-gathers K/V in forward and in backward, each behind the first step's attention, and
    passes the fp32 K/V gradients around the whole ring (cp sends, the last one exposed) where
    Transformer Engine reduce-scatters once."""
    kv = 64e6
    kw = dict(cp=8, kv_bytes=kv, q_bytes=kv, attn_fwd_s=0.0, group=NODE, cluster=CLUSTER)
    gather = comm.allgather_s(kv, NODE, CLUSTER)
    te = context.exchange_s("allgather", attn_bwd_s=0.0, **kw)
    assert te[1] == pytest.approx(gather + comm.reduce_scatter_s(kv, NODE, CLUSTER))
    bare = context.exchange_s("allgather", attn_bwd_s=0.0, gradients_on=2.0, gathered_ring=True,
                              **kw)
    send = comm.p2p_s(2 * kv / 8, CLUSTER.intra_node)
    assert bare == (pytest.approx(gather), pytest.approx(gather + 8 * send))
    behind = context.exchange_s("allgather", attn_bwd_s=10.0, gradients_on=2.0,
                                gathered_ring=True, **{**kw, "attn_fwd_s": 10.0})
    sync = CLUSTER.intra_node.sync_s
    assert behind == (pytest.approx(sync), pytest.approx(sync + 7 * sync + send))
    # the first step, 1 / cp of the attention, hides as much of the gather as it lasts
    step = context.exchange_s("allgather", attn_bwd_s=8 * gather / 2, gradients_on=2.0,
                              gathered_ring=True, **{**kw, "attn_fwd_s": 8 * gather / 2})
    assert step[0] == pytest.approx(sync + gather / 2 - sync)


def test_all_to_all_sends_back_an_output_as_wide_as_the_values():
    """Under latent attention the values (and so the output) are narrower than the queries: the
    all-to-all forms send q, k, v in and the output back at its own width."""
    q, kv, out = 64e6, 96e6, 40e6
    kw = dict(cp=8, kv_bytes=kv, q_bytes=q, attn_fwd_s=0.0, attn_bwd_s=0.0, group=NODE,
              cluster=CLUSTER)
    same = context.exchange_s("a2a", **kw)
    latent = context.exchange_s("a2a", out_bytes=out, **kw)
    assert same[0] == pytest.approx(comm.alltoall_s((2 * q + kv) / 8, NODE, CLUSTER, count=4))
    assert latent[0] == pytest.approx(comm.alltoall_s((q + out + kv) / 8, NODE, CLUSTER, count=4))


def test_forms_of_exchange_and_cp_one():
    kv, q = 32e6, 64e6
    assert context.exchange_s("a2a", cp=1, kv_bytes=kv, q_bytes=q, attn_fwd_s=0, attn_bwd_s=0,
                              group=NODE, cluster=CLUSTER) == (0.0, 0.0)
    ag = context.exchange_s("allgather", cp=8, kv_bytes=kv, q_bytes=q, attn_fwd_s=1.0,
                            attn_bwd_s=1.0, group=NODE, cluster=CLUSTER)
    assert ag[0] == pytest.approx(comm.allgather_s(kv, NODE, CLUSTER))  # never hidden
    a2a = context.exchange_s("a2a", cp=8, kv_bytes=kv, q_bytes=q, attn_fwd_s=1.0,
                             attn_bwd_s=1.0, group=NODE, cluster=CLUSTER)
    assert a2a[0] == pytest.approx(comm.alltoall_s((2 * q + kv) / 8, NODE, CLUSTER, count=4))
    across = GroupShape(size=16, per_node=8)  # two nodes: heads inside, ring across
    hier = context.exchange_s("a2a+p2p", cp=16, kv_bytes=kv, q_bytes=q, attn_fwd_s=0.0,
                              attn_bwd_s=0.0, group=across, cluster=CLUSTER)
    assert hier[0] > comm.alltoall_s((2 * q + kv) / 16, NODE, CLUSTER, count=4)


def test_alltoall_runs_inside_and_across_nodes_at_once():
    nbytes = 1e9
    inside = comm.alltoall_s(nbytes, NODE, CLUSTER)
    link = CLUSTER.intra_node
    assert inside == pytest.approx(link.latency_s + nbytes * 7 / 8 / link.alltoall_bytes_per_s)
    spread = comm.alltoall_s(nbytes, GroupShape(size=32, per_node=8), CLUSTER)
    inter = CLUSTER.inter_node
    assert spread == pytest.approx(inter.latency_s + nbytes * 24 / 32 / inter.alltoall_bytes_per_s)
    assert comm.alltoall_s(nbytes, GroupShape(size=1, per_node=1), CLUSTER) == 0.0


@pytest.mark.parametrize("ep,etp,tp", [(1, 1, 1), (8, 1, 1), (4, 2, 2), (16, 1, 4)])
def test_expert_gemm_keeps_its_flops_and_regroups_tokens(ep, etp, tp):
    """Whatever the split, one rank computes its own token copies' share (tokens / tp, the MoE
    layer running sequence-parallel) times the load, on E / ep local experts."""
    up = Gemm(batch=1, m=4096 * 8, n=2 * 1408, k=2048, split=SPLIT_N, experts=64)
    down = Gemm(batch=1, m=4096 * 8, n=2048, k=1408, split=SPLIT_K, experts=64)
    load = 1.25
    for g in (up, down):
        b, m, n, k = split_gemm(g, micro_batch=2, tp=tp, sp=True,
                                experts=Experts(ep=ep, etp=etp, load=load))
        assert b == 64 / ep
        assert b * m * n * k == pytest.approx(2 * g.m * g.n * g.k * load / tp)
        assert m == pytest.approx(2 * g.m / tp * load * etp * ep / 64)  # tokens per local expert


def test_the_allgather_dispatcher_gathers_every_token_once_over_ep_x_etp():
    """Megatron-Core's MoEAllGatherTokenDispatcher gathers the hidden states over the tp x ep
    group of the MoE layer and reduce-scatters them back, with no expert tensor-parallel step
    of its own (the all-to-all dispatcher has one)."""
    tokens = 4096 * 7168 * 2.0
    etp, ep = GroupShape(size=2, per_node=2), GroupShape(size=8, per_node=4)  # 16 ranks, 2 nodes
    both = GroupShape(size=16, per_node=8)
    t = experts.dispatch_s("allgather", copies_bytes=8 * tokens, tokens_bytes=tokens, ep=8,
                           ep_group=ep, etp_group=etp, cluster=CLUSTER)
    assert t == pytest.approx(comm.allgather_s(16 * tokens, both, CLUSTER)
                              + comm.reduce_scatter_s(16 * tokens, both, CLUSTER))
    assert comm.folded(etp, ep) == both
    alone = experts.dispatch_s("allgather", copies_bytes=8 * tokens, tokens_bytes=tokens, ep=1,
                               ep_group=GroupShape(size=1, per_node=1), etp_group=etp,
                               cluster=CLUSTER)
    assert alone == pytest.approx(comm.allgather_s(2 * tokens, etp, CLUSTER)
                                  + comm.reduce_scatter_s(2 * tokens, etp, CLUSTER))


def test_dispatch_grows_with_the_nodes_it_spans_and_is_zero_without_ep():
    engine = EngineSpec()
    copies = 4096 * 8 * 7168 * 2.0
    one_node = experts.dispatch_s("alltoall", copies_bytes=copies, tokens_bytes=copies / 8, ep=8,
                                  ep_group=NODE, etp_group=GroupShape(size=1, per_node=1),
                                  cluster=CLUSTER)
    four = experts.dispatch_s("alltoall", copies_bytes=copies, tokens_bytes=copies / 8, ep=32,
                              ep_group=GroupShape(size=32, per_node=8),
                              etp_group=GroupShape(size=1, per_node=1), cluster=CLUSTER)
    assert 0 < one_node < four
    assert experts.dispatch_s("alltoall", copies_bytes=copies, tokens_bytes=copies / 8, ep=1,
                              ep_group=GroupShape(size=1, per_node=1),
                              etp_group=GroupShape(size=1, per_node=1), cluster=CLUSTER) == 0.0
    per_block = experts.block_dispatch_s(
        engine, dispatch_bytes=np.array([0.0, copies]), routed_tokens=np.array([0.0, 4096 * 8]),
        seq_len=4096, share=1.0, ep=8, ep_group=NODE, etp_group=GroupShape(size=1, per_node=1),
        cluster=CLUSTER, recompute_full=False)
    counts = comm.alltoall_s(0.0, NODE, CLUSTER)  # the forward's exchange of token counts
    assert per_block[0] == 0.0 and per_block[1] == pytest.approx(2 * one_node + counts)
    # uneven routing: the all-to-all waits for the busiest of the 8 ranks (one expert each)
    uneven = experts.block_dispatch_s(
        engine_from_mapping("moe_imbalance=1.5"), dispatch_bytes=np.array([0.0, copies]),
        routed_tokens=np.array([0.0, 4096 * 8]), seq_len=4096, share=1.0, ep=8, ep_group=NODE,
        etp_group=GroupShape(size=1, per_node=1), cluster=CLUSTER, recompute_full=False,
        num_experts=np.array([0.0, 8.0]))
    assert uneven[1] == pytest.approx(2 * experts.dispatch_s(
        "alltoall", copies_bytes=1.5 * copies, tokens_bytes=copies / 8, ep=8, ep_group=NODE,
        etp_group=GroupShape(size=1, per_node=1), cluster=CLUSTER)
        + comm.alltoall_s(8 * 8.0, NODE, CLUSTER))
    # overlapped: the forward's all-to-alls run behind the paired micro-batch's backward, the
    # backward's behind its forward; a long backward lends a short forward nothing
    overlapped = engine_from_mapping("moe_overlap=true")
    for fwd_s, bwd_s, exposed in ((0.25, 0.25, 1.5), (1.0, 2.0, 0.0), (0.5, 1.5, 0.5)):
        hidden = experts.block_dispatch_s(
            overlapped, dispatch_bytes=np.array([0.0, copies]),
            routed_tokens=np.array([0.0, 4096 * 8]), seq_len=4096, share=1.0, ep=8,
            ep_group=NODE, etp_group=GroupShape(size=1, per_node=1), cluster=CLUSTER,
            recompute_full=False, fwd_s=np.array([1.0, fwd_s * one_node]),
            bwd_s=np.array([2.0, bwd_s * one_node]))
        assert hidden[0] == 0.0 and hidden[1] == pytest.approx(exposed * one_node + counts)
    # one micro-batch has no partner to run behind: all exposed; of four, one
    for micro_batches, share in ((1, 1.0), (4, 0.25)):
        alone = experts.block_dispatch_s(
            overlapped, dispatch_bytes=np.array([copies]), routed_tokens=np.array([4096 * 8]),
            seq_len=4096, share=1.0, ep=8, ep_group=NODE,
            etp_group=GroupShape(size=1, per_node=1), cluster=CLUSTER, recompute_full=False,
            fwd_s=np.array([one_node]), bwd_s=np.array([2 * one_node]),
            micro_batches=micro_batches)
        assert alone[0] == pytest.approx(share * (per_block[1] - counts) + counts)
    # with a pipeline the first rank's warm-up forwards and cool-down backwards run alone:
    # interleaved 1F1B over pp=8 ranks of 4 chunks, 128 micro-batches: 2 x 7 + 3 x 8 + 1 = 39
    # of its 512 chunk passes each way (Megatron-Core's warm-up of pipeline rank 0, one more
    # with the overlap)
    assert experts.unpaired_share(128, pp=8, vpp=4) == pytest.approx(39 / 512)
    assert experts.unpaired_share(4, pp=1) == pytest.approx(1 / 4)
    assert experts.unpaired_share(2, pp=4, vpp=2) == 1.0  # all warm-up: nothing pairs
    piped = experts.block_dispatch_s(
        overlapped, dispatch_bytes=np.array([copies]), routed_tokens=np.array([4096 * 8]),
        seq_len=4096, share=1.0, ep=8, ep_group=NODE, etp_group=GroupShape(size=1, per_node=1),
        cluster=CLUSTER, recompute_full=False, fwd_s=np.array([one_node]),
        bwd_s=np.array([2 * one_node]), micro_batches=128, pp=8, vpp=4)
    assert piped[0] == pytest.approx(39 / 512 * (per_block[1] - counts) + counts)


def test_each_moe_forward_exchanges_its_token_counts_before_the_dispatch():
    """Before each MoE layer's dispatch the ranks exchange their per-expert token counts (twice
    with a replayed forward): a call each, at a send/receive pair's cost between busy ranks where
    measured; not with the allgather dispatcher (fixed sizes) or without expert parallelism."""
    busy = dataclasses.replace(CLUSTER, intra_node=dataclasses.replace(
        CLUSTER.intra_node, sync_s=1e-3, p2p_sync_s=2e-3))

    def priced(dispatcher="alltoall", ep=8, recompute_full=False, layers=3.0):
        return experts.block_dispatch_s(
            engine_from_mapping(f"moe_dispatcher={dispatcher}"), dispatch_bytes=np.array([1.0]),
            routed_tokens=np.array([8.0]), seq_len=1, share=1.0, ep=ep,
            ep_group=GroupShape(size=ep, per_node=8), etp_group=GroupShape(size=1, per_node=1),
            cluster=busy, recompute_full=recompute_full, num_experts=np.array([64.0]),
            moe_layers=np.array([layers]))[0]

    counts = comm.alltoall_s(8 * 64.0, GroupShape(size=8, per_node=8), busy, count=3.0)
    assert counts > 3 * 2e-3  # each layer's exchange pays the busy send/receive pair
    moved = priced() - counts  # dispatch and combine, forward and backward
    assert moved > 0
    # a replayed forward moves the forward's tokens again and exchanges its counts again
    assert priced(recompute_full=True) == pytest.approx(1.5 * moved + 2 * counts)
    assert priced(ep=1) == 0.0
    gathered = priced("allgather")  # every token gathered: no counts to wait for
    assert gathered > 0 and priced("allgather", recompute_full=True) == \
        pytest.approx(1.5 * gathered)


@pytest.mark.parametrize("settings", ["megatron-core", "moe_dispatcher=deepep",
                                      "moe_dispatcher=allgather", "moe_imbalance=1.5",
                                      "moe_etp_replicated=true", "moe_overlap=true",
                                      "moe_shared_overlap=true"])
@pytest.mark.parametrize("ep", [1, 8])
def test_reads_compute_says_when_the_dispatch_depends_on_the_compute(settings, ep):
    """Where reads_compute is False, block_dispatch_s gives the same for any compute beside it
    (the search then prices one dispatch for several recomputation policies:
    planner.search.costs._least_dispatch_s); where it is True, some compute changes it."""
    engine = engine_from_mapping(settings)

    def priced(scale):
        compute = np.array([0.0, 1e-4]) * scale
        return experts.block_dispatch_s(
            engine, dispatch_bytes=np.array([0.0, 4096 * 8 * 7168 * 2.0]),
            routed_tokens=np.array([0.0, 4096 * 8]), seq_len=4096, share=1.0, ep=ep,
            ep_group=GroupShape(size=ep, per_node=min(ep, 8)),
            etp_group=GroupShape(size=2, per_node=2), cluster=CLUSTER, recompute_full=False,
            num_experts=np.array([0.0, 64.0]), fwd_s=compute, bwd_s=2 * compute,
            shared_fwd_s=compute, shared_bwd_s=2 * compute, micro_batches=4 * scale)
    if experts.reads_compute(engine, ep):
        assert not np.array_equal(priced(1), priced(100))
    else:
        assert np.array_equal(priced(1), priced(100))


def test_torchtitans_expert_tensor_parallelism_all_to_alls_the_whole_groups_copies():
    """torchtitan's ExpertTensorParallel gathers the tokens over tp before the router (no
    sequence-parallel reorderer with etp) and every etp rank all-to-alls all their copies;
    Megatron-Core all-to-alls a rank's own copies, then gathers the copies over etp."""
    copies = 4096 * 8 * 2048 * 2.0
    tokens = copies / 8
    ep_group, etp_group = GroupShape(size=4, per_node=4), GroupShape(size=2, per_node=2)

    def priced(replicated):
        return experts.dispatch_s("alltoall", copies_bytes=copies, tokens_bytes=tokens, ep=4,
                                  ep_group=ep_group, etp_group=etp_group, cluster=CLUSTER,
                                  etp_replicated=replicated)
    assert priced(True) == pytest.approx(
        2 * comm.alltoall_s(2 * copies, ep_group, CLUSTER)
        + comm.allgather_s(2 * tokens, etp_group, CLUSTER)
        + comm.reduce_scatter_s(2 * tokens, etp_group, CLUSTER))
    assert priced(False) == pytest.approx(
        2 * comm.alltoall_s(copies, ep_group, CLUSTER)
        + comm.allgather_s(2 * copies, etp_group, CLUSTER)
        + comm.reduce_scatter_s(2 * copies, etp_group, CLUSTER))
    assert engine_from_mapping("torchtitan").moe_etp_replicated
    assert not engine_from_mapping("megatron-core").moe_etp_replicated


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_a_block_of_two_moe_layers_dispatches_twice_what_one_does(dispatcher):
    """A small model traced as one block holds several MoE layers: each gathers (or exchanges)
    its own tokens, at the top-k of one layer."""
    engine = engine_from_mapping(f"moe_dispatcher={dispatcher}")
    copies, tokens = 4096 * 2 * 1024 * 2.0, 4096 * 2.0  # top-2, hidden 1024, bf16

    def one_block(layers):
        return experts.block_dispatch_s(
            engine, dispatch_bytes=np.array([layers * copies]),
            routed_tokens=np.array([layers * tokens * 2]), seq_len=4096, share=1.0, ep=8,
            ep_group=NODE, etp_group=GroupShape(size=1, per_node=1), cluster=CLUSTER,
            recompute_full=False, moe_layers=np.array([float(layers)]))
    assert one_block(2)[0] == pytest.approx(2 * one_block(1)[0])


@pytest.mark.parametrize("num_experts,topk,ep,etp,per_node,groups", [
    (256, 8, 64, 1, 8, 0), (256, 8, 16, 1, 8, 0), (128, 8, 32, 1, 4, 0), (8, 2, 8, 1, 8, 0),
    (64, 6, 8, 2, 8, 0),
    # DeepSeek-V3's node-limited routing (8 groups, 4 per token): nodes of whole groups, of two,
    # of half of one
    (256, 8, 64, 1, 8, 8), (256, 8, 32, 1, 8, 8), (256, 8, 128, 1, 8, 8)])
def test_deepep_sends_match_a_simulation_of_its_routing(num_experts, topk, ep, etp, per_node,
                                                       groups):
    """node_sends against routing drawn at random (top-k distinct experts per token, E/ep experts
    per rank, every etp rank of a chosen expert needing the token; with ``groups``, the token's
    experts drawn from 4 of them drawn first): each token crosses the network once per other
    node holding any of its experts, and the node's links once per other GPU of the sender's
    node needing it plus, forwarded, once per other GPU of each remote node needing it (the GPU
    of the sender's index there receives it from the network)."""
    rng = np.random.default_rng(0)
    size = ep * etp
    group = GroupShape(size=size, per_node=per_node)
    nodes = size // per_node
    tokens = 20000
    if groups:
        kept, width = 4, num_experts // groups
        picked = np.argsort(rng.random((tokens, groups)), axis=1)[:, :kept]
        pool = (picked[:, :, None] * width + np.arange(width)).reshape(tokens, -1)
        order = np.argsort(rng.random(pool.shape), axis=1)[:, :topk]
        chosen = np.take_along_axis(pool, order, axis=1)
    else:
        chosen = np.argsort(rng.random((tokens, num_experts)), axis=1)[:, :topk]
    rank_of_expert = chosen // (num_experts // ep)  # expert-parallel index
    me = rng.integers(0, size, tokens)  # the sending GPU (etp ranks of an index side by side)
    node_of = np.arange(size) // per_node
    intra = inter = 0
    for t in range(tokens):
        needing = {r * etp + j for r in set(rank_of_expert[t].tolist()) for j in range(etp)}
        needing.discard(int(me[t]))
        home = node_of[me[t]]
        for n in {int(node_of[r]) for r in needing}:
            if n == home:
                intra += sum(node_of[r] == n for r in needing)
            else:
                inter += 1
                forwarder = n * per_node + me[t] % per_node
                intra += sum(node_of[r] == n and r != forwarder for r in needing)
    want_intra, want_inter = experts.node_sends(num_experts, topk, ep=ep, etp=etp, group=group,
                                                groups=groups, group_topk=4 if groups else 0)
    assert intra / tokens == pytest.approx(want_intra, rel=0.03)
    assert inter / tokens == pytest.approx(want_inter, rel=0.03, abs=1e-9)
    if nodes == 1:
        assert want_inter == 0.0


def test_groups_too_few_to_hold_a_tokens_experts_are_left_out():
    """A router keeping 1 group of 2 experts for a top-4 token cannot keep to its groups (a
    review found node_sends dividing by zero): priced as routing over all experts."""
    group = GroupShape(size=8, per_node=4)
    assert experts.node_sends(16, 4, ep=8, etp=1, group=group, groups=8, group_topk=1) == \
        experts.node_sends(16, 4, ep=8, etp=1, group=group)


def test_deepep_moves_fewer_bytes_across_nodes_than_the_all_to_all():
    """DeepSeek-V3's 256 experts, top-8, on 64 ranks of 8 nodes: the all-to-all sends 7 of a
    token's 8 copies over the network, DeepEP one per other node holding any of its experts
    (about 4.6), so the network-bound dispatch takes about 0.66 of the time; within one node,
    with experts on as many ranks as a token picks, both send each copy once."""
    copies = 4096 * 8 * 7168 * 2.0

    def dispatch(dispatcher, ep, per_node, num_experts=256, topk=8):
        return experts.block_dispatch_s(
            engine_from_mapping(f"moe_dispatcher={dispatcher}"),
            dispatch_bytes=np.array([copies / 8 * topk]),
            routed_tokens=np.array([4096.0 * topk]), seq_len=4096, share=1.0, ep=ep,
            ep_group=GroupShape(size=ep, per_node=per_node),
            etp_group=GroupShape(size=1, per_node=1), cluster=get_cluster("dgx-h100", nodes=8),
            recompute_full=False, num_experts=np.array([float(num_experts)]),
            moe_layers=np.array([1.0]))[0]
    across = dispatch("deepep", 64, 8) / dispatch("alltoall", 64, 8)
    # a node of 32 of the 256 experts is missed by a token's 8 picks with probability
    # C(224, 8) / C(256, 8): DeepEP's network copies per token over the all-to-all's 7
    assert across == pytest.approx(1 - math.comb(224, 8) / math.comb(256, 8), rel=0.02)
    assert 0.6 < across < 0.7
    # 8 experts of which a token picks 2, one per rank: no two copies share a rank
    assert dispatch("deepep", 8, 8, num_experts=8, topk=2) == pytest.approx(
        dispatch("alltoall", 8, 8, num_experts=8, topk=2), rel=1e-6)
    # Megatron-Core refuses padding to capacity with the flex dispatcher; the overlap runs
    with pytest.raises(SpecError, match="engine.moe_pad_to_capacity: DeepEP"):
        engine_from_mapping("moe_dispatcher=deepep,moe_capacity_factor=1.25,"
                            "moe_pad_to_capacity=true")
    assert not experts.overlap_blockers(engine_from_mapping("moe_dispatcher=deepep"), ep=8,
                                        recompute="none", dtype="bf16", pp=1, vpp=1)


def test_moe_engine_settings_are_checked_and_load_follows_capacity():
    def load(settings, ep, num_experts=8):
        return experts.rank_load(engine_from_mapping(settings), ep=ep, num_experts=num_experts)

    assert experts.rank_load(EngineSpec(), ep=8, num_experts=8) == 1.0
    # one expert per rank: the busiest rank is the busiest expert, capped by the capacity factor
    assert load("moe_imbalance=1.4,moe_capacity_factor=1.2", ep=8) == pytest.approx(1.2)
    assert load("moe_imbalance=1.1,moe_capacity_factor=2", ep=8) == pytest.approx(1.1)
    # one rank holds every expert and waits for no one; more experts per rank average more out
    assert load("moe_imbalance=2", ep=1) == 1.0
    loads = [load("moe_imbalance=2", ep=ep, num_experts=64) for ep in (2, 8, 32, 64)]
    assert 1.0 < loads[0] < loads[1] < loads[2] < loads[3] == pytest.approx(2.0)
    # two ranks of four experts each: spread (2 - 1) / E[max of 8], over sqrt(4), times E[max of 2]
    assert load("moe_imbalance=2", ep=2) == pytest.approx(
        1 + expected_max_normal(2) / (2 * expected_max_normal(8)))
    for bad in ("moe_imbalance=0.5", "moe_capacity_factor=0.5", "moe_dispatcher=flex",
                "host_op_s=-1", "moe_imbalance=nan"):
        with pytest.raises(SpecError):
            engine_from_mapping(bad)
    assert math.isfinite(engine_from_mapping("host_op_s=1.5e-5").host_op_s)
    with pytest.raises(SpecError, match=r"engine.moe_host_op_s: 53.5 seconds per op .*50e-6"):
        engine_from_mapping("moe_host_op_s=53.5")  # microseconds given for seconds


def test_experts_padded_to_capacity_compute_and_send_their_capacity():
    """Megatron-Core's --moe-pad-expert-input-to-capacity: every expert fills its slots, so every
    rank computes and sends the capacity factor times the mean, balanced routing or not, with or
    without expert parallelism; without padding the capacity only caps a busier expert."""
    padded = engine_from_mapping("moe_capacity_factor=1.25,moe_pad_to_capacity=true")
    for ep in (1, 2, 8):
        assert experts.rank_load(padded, ep=ep, num_experts=8) == 1.25
    skewed = engine_from_mapping("moe_imbalance=3,moe_capacity_factor=1.25,moe_pad_to_capacity=1")
    assert experts.rank_load(skewed, ep=8, num_experts=8) == 1.25
    plain = engine_from_mapping("moe_capacity_factor=1.25")
    assert experts.rank_load(plain, ep=8, num_experts=8) == 1.0

    def dispatched(engine, ep=8, etp=1, capacity=0.0):
        return experts.block_dispatch_s(
            engine, dispatch_bytes=np.array([4096 * 2 * 1024 * 2.0]),
            routed_tokens=np.array([4096 * 2.0]), seq_len=4096, share=1.0, ep=ep,
            ep_group=GroupShape(size=ep, per_node=ep), etp_group=GroupShape(size=etp,
                                                                            per_node=etp),
            cluster=CLUSTER, recompute_full=False, num_experts=np.array([8.0]),
            moe_layers=np.array([1.0]), capacity=np.array([capacity]))[0]
    for ep, etp in ((8, 1), (1, 2)):  # the all-to-all, or the expert-tensor-parallel gather
        sends = (dispatched(padded, ep, etp) - dispatched(plain, ep, etp)) / \
            dispatched(plain, ep, etp)
        assert 0.1 < sends <= 0.25  # the bytes grow 25%, each call's latency does not
    # capacity-style experts (GShard's traced buffers) hold their capacity already
    assert dispatched(padded, capacity=1.0) == dispatched(plain, capacity=1.0)
    with pytest.raises(SpecError, match="engine.moe_pad_to_capacity: .*set moe_capacity_factor"):
        engine_from_mapping("moe_pad_to_capacity=true")
    with pytest.raises(SpecError, match="engine.moe_pad_to_capacity: expected true or false"):
        engine_from_mapping("moe_capacity_factor=1.25,moe_pad_to_capacity=maybe")


def test_ring_never_hides_the_sync_of_a_call_between_busy_ranks():
    """Long attention hides the bytes of every ring step, not what each step's wait costs when
    the ranks compute between calls (LinkSpec.sync_s: the CPU's)."""
    slow = dataclasses.replace(CLUSTER, intra_node=dataclasses.replace(CLUSTER.intra_node,
                                                                      sync_s=1e-3))
    fwd, bwd = context.exchange_s("p2p", cp=4, kv_bytes=64e6, q_bytes=64e6, attn_fwd_s=10.0,
                                  attn_bwd_s=10.0, group=NODE, cluster=slow)
    assert (fwd, bwd) == (pytest.approx(3e-3), pytest.approx(3e-3))
    a2a = comm.alltoall_s(1e6, NODE, slow, count=4)
    assert a2a == pytest.approx(comm.alltoall_s(1e6, NODE, CLUSTER, count=4) + 4e-3)


def test_ring_merges_cost_element_wise_passes_and_kernels():
    """Op by op, a rank of a cp=2 ring merges 2cp-1 = 3 partial outputs (7 passes over an fp32
    query chunk and 7 kernels each) besides copying its chunks; nothing without context
    parallelism, and bf16 merges move fp32 (twice the bytes of a bf16 chunk)."""
    from costmodels.hardware import get_device

    dev = get_device("h100")
    assert context.ring_merge_s(1, q_bytes=1e6, kv_bytes=1e6, word=2, device=dev) == (0.0, 0.0)
    q, kv = 8e6, 4e6
    fwd, bwd = context.ring_merge_s(2, q_bytes=q, kv_bytes=kv, word=4, device=dev)
    chunk = q / 2 / 2
    fwd_bytes = 7 * 3 * chunk + 2 * q / 2 + 2 * 2 * kv / 2 + 2 * q / 2
    kernels = 7 * 3 + 4 * 2 + 4
    assert fwd == pytest.approx(fwd_bytes / dev.memory_bytes_per_s + kernels * dev.kernel_overhead_s)
    assert bwd > fwd > 0
    f16, _ = context.ring_merge_s(2, q_bytes=q / 2, kv_bytes=kv / 2, word=2, device=dev)
    assert f16 > fwd / 2  # the same tensors in bf16: the merges still move fp32
    # latent attention: an output 2/3 the queries' width merges 2/3 of the bytes
    narrow, narrow_b = context.ring_merge_s(2, q_bytes=q, kv_bytes=kv, word=4, device=dev,
                                            out_bytes=q * 2 / 3)
    narrow_bytes = 7 * 3 * chunk * 2 / 3 + 2 * q / 2 + 2 * 2 * kv / 2 + 2 * q / 2 * 2 / 3
    assert narrow == pytest.approx(narrow_bytes / dev.memory_bytes_per_s
                                   + kernels * dev.kernel_overhead_s)
    assert narrow_b < bwd


def test_an_moe_layer_takes_at_least_its_ops_issue_time():
    """The device waits for the host where an MoE layer's ops issue slower than they run: the
    forward takes max(device, ops x moe_host_op_s), the backward twice the ops; a dense block
    is not bound this way (the host runs ahead of it)."""
    from costmodels.compute import block_time
    from costmodels.hardware import DEVICES
    from costmodels.workload import BlockWork

    up = Gemm(batch=1, m=4096 * 8, n=2 * 1408, k=2048, split=SPLIT_N, experts=64)
    work = BlockWork(gemms=(up,), num_experts=64, kernels_eager=200.0, kernels_fused=50.0,
                     mem_bytes_rep=1e8, fused_bytes_rep=5e7)
    h100 = DEVICES["h100"]

    def times(work, host):
        t = block_time(work, h100, dtype="bf16", micro_batch=1, tp=1, sp=False,
                       recompute="none", engine=engine_from_mapping(f"moe_host_op_s={host}"))
        return t.fwd_s, t.bwd_s

    device_f, device_b = times(work, 0.0)
    assert times(work, 1e-9) == pytest.approx((device_f, device_b))  # host far ahead
    slow = 10 * device_f / 200  # issuing the layer's ops takes ten times its forward
    assert times(work, slow) == pytest.approx((200 * slow, 400 * slow))
    dropping = block_time(work, h100, dtype="bf16", micro_batch=1, tp=1, sp=False,
                          recompute="none", engine=engine_from_mapping(
                              f"moe_host_op_s={slow},moe_capacity_factor=1.0"))
    assert dropping.fwd_s == pytest.approx(200 * slow)  # no wait for counts, same issue time
    dense = dataclasses.replace(work, num_experts=0, gemms=(dataclasses.replace(up, experts=0),))
    assert times(dense, slow) == pytest.approx(times(dense, 0.0))
    # op-level checkpointing saves no routed experts' GEMM (torchtitan's policy saves aten.mm
    # outputs, not grouped GEMMs'): it issues all the layer's ops again, bound by their issue
    # time too; on the device it runs the routed GEMM again whole (here the block's only GEMM,
    # so the whole forward)
    def again(host):
        return block_time(work, h100, dtype="bf16", micro_batch=1, tp=1, sp=False,
                          recompute="op", engine=engine_from_mapping(f"moe_host_op_s={host}")
                          ).recompute_s
    assert again(slow) == pytest.approx(200 * slow)
    assert again(0.0) == pytest.approx(device_f)
    with pytest.raises(SpecError, match="engine.moe_host_op_s: expected a number >= 0"):
        engine_from_mapping("moe_host_op_s=-1")
    # without grouping, each of the 64 local experts' GEMMs is its own launch: 63 more to issue
    ungrouped = block_time(work, h100, dtype="bf16", micro_batch=1, tp=1, sp=False,
                           recompute="none", engine=engine_from_mapping(
                               f"moe_host_op_s={slow}"), experts=Experts(grouped=False))
    assert ungrouped.fwd_s == pytest.approx((200 + 63) * slow)


def test_a_ring_exposes_each_send_receive_pairs_busy_cost():
    """Behind long attention a ring hides its transfers but not what each send/receive pair
    costs between busy ranks: LinkSpec.p2p_sync_s where measured (2 ms here), else sync_s."""
    link = dataclasses.replace(CLUSTER.intra_node, sync_s=1e-3, p2p_sync_s=2e-3)
    free = dataclasses.replace(CLUSTER.device, overlap_slowdown=0.0)  # hiding costs nothing
    busy = dataclasses.replace(CLUSTER, device=free, intra_node=link)
    kw = dict(cp=4, kv_bytes=1e6, q_bytes=1e6, attn_fwd_s=10.0, attn_bwd_s=10.0, group=NODE,
              cluster=busy)
    assert context.exchange_s("p2p", **kw) == (pytest.approx(3 * 2e-3), pytest.approx(3 * 2e-3))
    unpaired = dataclasses.replace(busy, intra_node=dataclasses.replace(link, p2p_sync_s=None))
    assert context.exchange_s("p2p", **{**kw, "cluster": unpaired}) == \
        (pytest.approx(3 * 1e-3), pytest.approx(3 * 1e-3))
    # the runtime's ring returns the gradients: each of its sends pays the pair too
    _, back = context.exchange_s("p2p", gradients_back=2.0, **kw)
    assert back > 3 * 2e-3


@pytest.mark.parametrize("setting, said", [
    ("moe_capacity_factor=-1", r"^engine.moe_capacity_factor: expected 0 \(dropless\) or a number "
                               r">= 1, got -1.0; 0 is dropless"),
    ("moe_capacity_factor=0.5", r"^engine.moe_capacity_factor: expected 0 \(dropless\) or a "
                                r"number >= 1, got 0.5; below 1 even balanced routing"),
    ("moe_imbalance=0.5", r"^engine.moe_imbalance: expected a number >= 1, got 0.5; 1.0 is "
                          r"balanced routing"),
])
def test_moe_numbers_out_of_range_are_refused_alike_with_the_fix(setting, said):
    """A new-user check: -1 and 0.5 of a capacity factor were refused in two wordings, and
    neither, nor the imbalance's, said what to give."""
    with pytest.raises(SpecError, match=said):
        engine_from_mapping(setting)


def test_the_alltoall_dispatcher_regroups_the_copies_by_local_expert_and_back():
    """After an all-to-all the copies arrive grouped by source rank: with several local experts
    the alltoall dispatcher sorts them by expert and back (two passes, each reading and writing
    every copy the rank receives, forward and backward alike); one local expert, DeepEP and the
    allgather dispatcher (whose receivers expand tokens in expert order once, as the traced
    model's gather) and a rank without expert parallelism add nothing."""
    from costmodels.compute import block_time, regroup_s
    from costmodels.hardware import DEVICES
    from costmodels.workload import BlockWork

    up = Gemm(batch=1, m=4096 * 8, n=2 * 1408, k=2048, split=SPLIT_N, experts=64)
    copies = 4096 * 8 * 2048 * 2  # one sample's copies at the hidden width, bf16
    work = BlockWork(gemms=(up,), num_experts=64, kernels_eager=200.0, kernels_fused=50.0,
                     mem_bytes_rep=1e8, fused_bytes_rep=5e7, dispatch_bytes=copies,
                     moe_layers=1.0)
    b200 = DEVICES["b200"]
    alltoall = engine_from_mapping("moe_host_op_s=0")

    def priced(engine, ep, *, tp=1, micro_batch=2, etp=1, load=1.0):
        return regroup_s(work, b200, engine, micro_batch=micro_batch, tp=tp,
                         experts=Experts(ep=ep, etp=etp, load=load))

    seconds, kernels = priced(alltoall, 8)
    held = 2 * copies  # two samples' copies: this rank receives as many as it sends
    assert kernels == 2
    assert seconds == pytest.approx(2 * 2 * held / b200.memory_bytes_per_s
                                    + 2 * b200.kernel_overhead_s)
    # the busiest rank's copies, gathered over etp; a tp rank holds 1/tp of the tokens
    assert priced(alltoall, 8, etp=2, load=1.5)[0] > priced(alltoall, 8)[0]
    assert priced(alltoall, 8, tp=2)[0] < seconds
    for engine, ep in ((alltoall, 1), (alltoall, 64),
                       (engine_from_mapping("moe_dispatcher=deepep"), 8),
                       (engine_from_mapping("moe_dispatcher=allgather"), 8)):
        assert priced(engine, ep) == (0.0, 0.0)

    def times(engine, ep):
        t = block_time(work, b200, dtype="bf16", micro_batch=2, tp=1, sp=False,
                       recompute="none", engine=engine, experts=Experts(ep=ep))
        return t.fwd_s, t.bwd_s

    deepep = engine_from_mapping("moe_dispatcher=deepep,moe_host_op_s=0")
    with_f, with_b = times(alltoall, 8)
    without_f, without_b = times(deepep, 8)
    assert with_f - without_f == pytest.approx(seconds)
    assert with_b - without_b == pytest.approx(seconds)
    # their launches join the layer's issue time where the host binds
    slow = 1e-3
    bound = block_time(work, b200, dtype="bf16", micro_batch=2, tp=1, sp=False,
                       recompute="none", engine=engine_from_mapping(f"moe_host_op_s={slow}"),
                       experts=Experts(ep=8))
    assert bound.fwd_s == pytest.approx((200 + 2) * slow)


def test_megatron_core_adds_biased_experts_outputs_bias_one_local_expert_at_a_time():
    """gpt-oss's experts add a bias each after their last GEMM: Megatron-Core (core_v0.14.0 to
    core_v0.19.0, TEGroupedMLP._apply_bias) splits the outputs and the routing probabilities by
    local expert and runs ``t + b * p`` per expert, then concatenates: forward 2 kernels an expert
    and a + 5r bytes an element, backward 4 kernels an expert and 6r + 2a bytes (r: the wider of
    the activations, a, and the probabilities, fp32 with DeepEP, so a cast each way). Where the
    engine fuses the bias (other presets), or the experts have none, nothing."""
    from costmodels.compute import bias_loop_s, block_time
    from costmodels.engine import PRESETS
    from costmodels.hardware import DEVICES
    from costmodels.workload import BlockWork

    up = Gemm(batch=1, m=4096 * 4, n=2 * 2880, k=2880, split=SPLIT_N, experts=128)
    copies = 4096 * 4 * 2880 * 2  # one sample's copies at the hidden width, bf16
    work = BlockWork(gemms=(up,), num_experts=128, kernels_eager=100.0, kernels_fused=10.0,
                     mem_bytes_rep=1e8, fused_bytes_rep=5e7, dispatch_bytes=copies,
                     moe_layers=1.0, expert_bias=1.0)
    b200 = DEVICES["b200"]
    megatron = engine_from_mapping("megatron-core,moe_host_op_s=0")
    assert megatron.moe_bias_loop and EngineSpec().moe_bias_loop  # (the default's software)
    assert not any(PRESETS[name]["moe_bias_loop"]
                   for name in ("torchtitan", "torchtitan-compile", "torch", "deepspeed"))

    def loop(engine, ep=8, work=work):
        return bias_loop_s(work, b200, engine, micro_batch=2, tp=1, experts=Experts(ep=ep),
                           word=2.0)

    elements = 2 * copies / 2  # two samples' copies this rank receives, 2 bytes each
    fwd, bwd, fwd_k, bwd_k = loop(megatron)
    assert (fwd_k, bwd_k) == (2 * 16 + 1, 4 * 16 + 1)  # 16 local experts at ep 8
    assert fwd == pytest.approx(12 * elements / b200.memory_bytes_per_s
                                + fwd_k * b200.kernel_overhead_s)
    assert bwd == pytest.approx(16 * elements / b200.memory_bytes_per_s
                                + bwd_k * b200.kernel_overhead_s)
    assert loop(megatron, ep=64)[2] == 2 * 2 + 1  # fewer local experts, fewer launches
    deepep = engine_from_mapping("megatron-core,moe_dispatcher=deepep")  # fp32 probabilities
    d_fwd, d_bwd, d_fk, d_bk = loop(deepep)
    assert (d_fk, d_bk) == (2 * 16 + 2, 4 * 16 + 1 + 17)
    assert d_fwd == pytest.approx(28 * elements / b200.memory_bytes_per_s
                                  + d_fk * b200.kernel_overhead_s)
    assert d_bwd == pytest.approx(40 * elements / b200.memory_bytes_per_s
                                  + d_bk * b200.kernel_overhead_s)
    for engine in (engine_from_mapping("torchtitan"), engine_from_mapping("deepspeed"),
                   engine_from_mapping("megatron-core,moe_bias_loop=false")):
        assert loop(engine) == (0.0, 0.0, 0.0, 0.0)
    assert loop(megatron, work=dataclasses.replace(work, expert_bias=0.0)) == (0.0,) * 4
    # ungrouped experts (SequentialMLP) add theirs inside each expert's Linear (a review)
    assert bias_loop_s(work, b200, megatron, micro_batch=2, tp=1,
                       experts=Experts(ep=8, grouped=False), word=2.0) == (0.0,) * 4

    def times(engine, h=0.0):
        t = block_time(work, b200, dtype="bf16", micro_batch=2, tp=1, sp=False,
                       recompute="none", engine=dataclasses.replace(engine, moe_host_op_s=h),
                       experts=Experts(ep=8))
        return t.fwd_s, t.bwd_s

    off = engine_from_mapping("megatron-core,moe_bias_loop=false")
    assert times(megatron)[0] - times(off)[0] == pytest.approx(fwd)

    def op_level(engine):  # what op-level checkpointing runs again: the loop's forward too
        return block_time(work, b200, dtype="bf16", micro_batch=2, tp=1, sp=False,
                          recompute="none",
                          engine=dataclasses.replace(engine, moe_host_op_s=0.0),
                          experts=Experts(ep=8)).op_recompute_s
    assert op_level(megatron) - op_level(off) == pytest.approx(fwd)
    assert times(megatron)[1] - times(off)[1] == pytest.approx(bwd)
    # its launches join the layer's issue time where the host binds
    slow = 1e-3
    assert times(megatron, slow)[0] - times(off, slow)[0] == pytest.approx(fwd_k * slow)
    assert times(megatron, slow)[1] - times(off, slow)[1] == pytest.approx(bwd_k * slow)
