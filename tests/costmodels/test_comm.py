"""Alpha-beta collectives against their closed forms."""

import dataclasses
import math

import numpy as np
import pytest

from costmodels.comm import (GroupShape, allgather_s, allreduce_s, alltoall_s, p2p_s,
                             ring_allgather_s, ring_allreduce_s)
from costmodels.topology import LinkSpec, get_cluster

LINK = LinkSpec(bandwidth_bytes_per_s=100e9, latency_s=0.0, efficiency=1.0)


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_bytes(n):
    nbytes = 1e9
    assert ring_allreduce_s(nbytes, n, LINK) == pytest.approx(2 * (n - 1) / n * nbytes / 100e9)


@pytest.mark.parametrize("n", [2, 8])
def test_allgather_moves_n_minus_1_over_n(n):
    assert ring_allgather_s(8e8, n, LINK) == pytest.approx((n - 1) / n * 8e8 / 100e9)


def test_latency_term_counts_steps_and_collectives():
    link = LinkSpec(bandwidth_bytes_per_s=1e30, latency_s=1e-5, efficiency=1.0)
    assert ring_allreduce_s(1.0, 8, link) == pytest.approx(2 * 7 * 1e-5)
    assert ring_allreduce_s(1.0, 8, link, count=3) == pytest.approx(3 * 2 * 7 * 1e-5)


def test_single_rank_costs_nothing_and_arrays_work():
    assert ring_allreduce_s(1e9, 1, LINK) == 0.0
    out = ring_allreduce_s(np.array([1e9, 2e9]), 4, LINK)
    assert out[1] == pytest.approx(2 * out[0])


def test_efficiency_scales_bandwidth():
    half = LinkSpec(bandwidth_bytes_per_s=100e9, latency_s=0.0, efficiency=0.5)
    assert ring_allreduce_s(1e9, 4, half) == pytest.approx(2 * ring_allreduce_s(1e9, 4, LINK))


def test_hierarchical_allreduce_inside_and_across_nodes():
    c = get_cluster("dgx-a100-80g", nodes=4)
    inside = allreduce_s(1e9, GroupShape(size=8, per_node=8), c)
    assert inside == pytest.approx(ring_allreduce_s(1e9, 8, c.intra_node))
    across = allreduce_s(1e9, GroupShape(size=32, per_node=8), c)
    # the two tiers at once (NCCL's chunks flow through both): the slower tier's transfer sets
    # the time, and a chunk pays both tiers' latencies
    intra, inter = 2 * ring_allgather_s(1e9, 8, c.intra_node), ring_allreduce_s(1e9 / 8, 4,
                                                                                 c.inter_node)
    lat_intra, lat_inter = 2 * ring_allgather_s(0.0, 8, c.intra_node), ring_allreduce_s(
        0.0, 4, c.inter_node)
    assert across == pytest.approx(inter + lat_intra) and inter - lat_inter > intra - lat_intra
    tiny = allreduce_s(1e3, GroupShape(size=32, per_node=8), c)  # latency-bound: both tiers'
    assert tiny >= lat_intra + lat_inter
    # so the bus bandwidth across nodes is the NICs' (8 per node, one per GPU), not less
    busbw = 2 * 31 / 32 * 1e9 / across
    assert 8 * c.inter_node.effective_bytes_per_s < busbw < 8 * c.inter_node.bandwidth_bytes_per_s * 1.5
    flat = allreduce_s(1e9, GroupShape(size=4, per_node=1), c)
    assert flat == pytest.approx(ring_allreduce_s(1e9, 4, c.inter_node))
    assert across > inside


def test_allgather_hierarchical_and_p2p():
    c = get_cluster("dgx-h100", nodes=2)
    # two nodes of DGX H100: each GPU's NIC carries half of its 1/8 share while NVLink gathers
    # the node's 7/8, both at once; NVLink's part is the larger, so the time is the node's
    inside = allgather_s(1e9, GroupShape(size=8, per_node=8), c)
    assert allgather_s(1e9, GroupShape(size=16, per_node=8), c) == pytest.approx(
        inside + ring_allgather_s(0.0, 2, c.inter_node))  # and the NICs' latency
    assert allgather_s(1e9, GroupShape(size=64, per_node=8), c) > inside  # 7/8 across: the NICs
    link = c.inter_node
    assert p2p_s(1e6, link) == pytest.approx(link.latency_s + 1e6 / link.effective_bytes_per_s)
    assert p2p_s(0, link) == 0.0
    assert math.isclose(GroupShape(size=16, per_node=8).nodes, 2)


def test_sync_cost_is_paid_once_per_call():
    """A call between busy ranks (LinkSpec.sync_s, measured on CPUs) costs its sync once, however
    many ring steps it takes; a point-to-point message pays it too."""
    link = LinkSpec(bandwidth_bytes_per_s=1e30, latency_s=1e-5, efficiency=1.0, sync_s=1e-3)
    assert ring_allreduce_s(1.0, 8, link) == pytest.approx(1e-3 + 2 * 7 * 1e-5)
    assert ring_allreduce_s(1.0, 8, link, count=3) == pytest.approx(3 * (1e-3 + 2 * 7 * 1e-5))
    assert ring_allgather_s(1.0, 8, link) == pytest.approx(1e-3 + 7 * 1e-5)
    assert p2p_s(1.0, link) == pytest.approx(1e-3 + 1e-5)
    assert p2p_s(0.0, link) == 0.0  # no message, no call


def test_a_send_receive_pair_pays_its_own_busy_cost_where_measured():
    """LinkSpec.p2p_sync_s (a send/receive pair between busy ranks) prices point-to-point messages
    and all-to-alls (grouped sends); collectives keep sync_s."""
    link = LinkSpec(bandwidth_bytes_per_s=1e30, latency_s=1e-5, efficiency=1.0, sync_s=1e-3,
                    p2p_sync_s=2.5e-3)
    assert link.message_sync_s == 2.5e-3
    assert p2p_s(1.0, link) == pytest.approx(2.5e-3 + 1e-5)
    assert ring_allreduce_s(1.0, 8, link) == pytest.approx(1e-3 + 2 * 7 * 1e-5)
    cluster = dataclasses.replace(get_cluster("cpu", nodes=1, gpus_per_node=2), intra_node=link)
    assert alltoall_s(1.0, GroupShape(size=2, per_node=2), cluster) == \
        pytest.approx(2.5e-3 + 1e-5)
    unmeasured = dataclasses.replace(link, p2p_sync_s=None)
    assert unmeasured.message_sync_s == 1e-3 and p2p_s(1.0, unmeasured) == \
        pytest.approx(1e-3 + 1e-5)


# Megatron-Core MoE report (arXiv 2603.07685), Table 7: DeepSeek-V3's token exchange (4,096
# tokens of hidden 7,168 in BF16, top-8) with NCCL's all-to-all, dispatch and combine, in us.
TABLE7_ALLTOALL = {("gb200-nvl72", 8): (735, 741), ("gb200-nvl72", 16): (743, 765),
                   ("gb200-nvl72", 32): (769, 758), ("gb200-nvl72", 64): (930, 827),
                   ("dgx-h100", 8): (1265, 1277), ("dgx-h100", 16): (5774, 5628),
                   ("dgx-h100", 32): (8059, 7815), ("dgx-h100", 64): (9164, 8727)}


def _table7_group(name: str, ep: int):
    """The cluster and expert-parallel group of a Table 7 timing: GB200's inside one NVL72
    rack, H100's over as many 8-GPU nodes as it takes."""
    cluster = get_cluster(name, nodes=max(1, ep // 8) if name == "dgx-h100" else 1)
    return cluster, GroupShape(size=ep, per_node=min(ep, cluster.gpus_per_node))


@pytest.mark.parametrize("name,ep", sorted(TABLE7_ALLTOALL))
def test_alltoall_reads_the_published_token_exchange_within_a_fifth(name, ep):
    cluster, group = _table7_group(name, ep)
    predicted = alltoall_s(4096 * 8 * 7168 * 2, group, cluster) * 1e6
    for measured in TABLE7_ALLTOALL[(name, ep)]:
        assert predicted == pytest.approx(measured, rel=0.2), (name, ep, predicted, measured)


def test_alltoall_runs_at_the_links_own_efficiency_where_it_has_one():
    cluster = get_cluster("dgx-h100")
    link = cluster.intra_node
    assert link.alltoall_efficiency == 0.68 and link.efficiency == 0.82
    group = GroupShape(size=8, per_node=8)
    t = alltoall_s(8e9, group, cluster)
    assert t == pytest.approx(link.message_latency_s + 7e9 / (450e9 * 0.68))
    # collectives keep theirs; a link without the figure runs its all-to-alls at theirs
    assert ring_allreduce_s(1e9, 8, link) == pytest.approx(ring_allreduce_s(
        1e9, 8, dataclasses.replace(link, alltoall_efficiency=None)))
    plain = dataclasses.replace(cluster, intra_node=dataclasses.replace(
        link, alltoall_efficiency=None))
    assert alltoall_s(8e9, group, plain) == pytest.approx(
        link.message_latency_s + 7e9 / (450e9 * 0.82))


# The same table's HybridEP timings (dispatch, combine; us): DeepEP's kind of exchange, which
# sends a token once per rank (over NVLink) and once per node (over the network) it needs.
TABLE7_HYBRIDEP = {("gb200-nvl72", 8): (391, 353), ("gb200-nvl72", 16): (578, 527),
                   ("gb200-nvl72", 32): (612, 646), ("gb200-nvl72", 64): (675, 744),
                   ("dgx-h100", 8): (661, 624), ("dgx-h100", 16): (1485, 1688),
                   ("dgx-h100", 32): (3064, 3088), ("dgx-h100", 64): (4626, 4398)}


@pytest.mark.parametrize("name,ep", sorted(TABLE7_HYBRIDEP))
def test_deepep_sends_read_the_published_hybridep_exchange_within_a_quarter(name, ep):
    from costmodels.experts import node_sends, node_sends_s

    cluster, group = _table7_group(name, ep)
    # DeepSeek-V3's node-limited routing: each token's experts from its best 4 of 8 groups
    intra, inter = node_sends(256, 8, ep=ep, etp=1, group=group, groups=8, group_topk=4)
    predicted = node_sends_s(4096 * 7168 * 2, intra, inter, group, cluster) * 1e6
    for measured in TABLE7_HYBRIDEP[(name, ep)]:
        assert predicted == pytest.approx(measured, rel=0.25), (name, ep, predicted, measured)


def test_the_nvlink_alltoall_efficiencies_are_the_tables_means():
    """costmodels.topology's NVLink figures derived here from Table 7: each timing inside one
    NVLink domain (GB200 ep 8-64, H100 ep 8), the bytes each backend sends (NCCL: (n-1)/n of
    the copies; HybridEP: node_sends' copies) over the time less one latency, per line rate."""
    from costmodels.experts import node_sends

    nbytes = 4096 * 7168 * 2
    shares: dict[str, list[float]] = {}
    for table, hybrid in ((TABLE7_ALLTOALL, False), (TABLE7_HYBRIDEP, True)):
        for (name, ep), timings in table.items():
            cluster = get_cluster(name)
            if ep > cluster.gpus_per_node:
                continue
            link = cluster.intra_node
            group = GroupShape(size=ep, per_node=ep)
            sent = nbytes * (node_sends(256, 8, ep=ep, etp=1, group=group, groups=8,
                                        group_topk=4)[0] if hybrid else 8 * (ep - 1) / ep)
            shares.setdefault(name, []).extend(
                sent / ((t * 1e-6 - link.latency_s) * link.bandwidth_bytes_per_s)
                for t in timings)
    for name, values in shares.items():
        assert len(values) == {"gb200-nvl72": 16, "dgx-h100": 4}[name]
        mean = sum(values) / len(values)
        assert get_cluster(name).intra_node.alltoall_efficiency == pytest.approx(mean, abs=0.005)
