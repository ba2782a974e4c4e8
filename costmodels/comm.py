"""Collectives and point-to-point transfers in the alpha-beta model.

A message of ``B`` bytes over a link costs ``alpha + B / beta`` (Hockney). Ring collectives on
``n`` ranks (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; Thakur et al., "Optimization of collective communication operations in
MPICH", IJHPCA 2005):

- all-reduce moves ``2 (n-1)/n * B`` bytes per rank in ``2 (n-1)`` steps;
- reduce-scatter and all-gather move ``(n-1)/n * B`` bytes per rank in ``n-1`` steps,
  ``B`` being the size of the full (unsharded) buffer.

A group that spans nodes runs hierarchically: reduce-scatter inside each node, an all-reduce of
each node-local shard across nodes (every GPU drives its own share of the NICs, so the ``g``
shards travel in parallel), then all-gather inside the node. NCCL cuts the buffer into chunks that
flow through both tiers together, so the phases overlap: the slower tier sets the time (as for
the all-to-all, whose shares for the own node and for other nodes also go at once).

The collective functions are plain arithmetic, so ``nbytes`` and ``count`` (how many separate
collectives the bytes are spread over, for the latency term) may be numpy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from costmodels.topology import Cluster, LinkSpec


@dataclass(frozen=True, kw_only=True)
class GroupShape:
    """Where the members of one communication group sit."""

    size: int
    """Ranks in the group."""
    per_node: int
    """Members that share one node (1 = every member on its own node; ``size`` = one node)."""

    @property
    def nodes(self) -> int:
        return max(1, self.size // max(1, self.per_node))


def folded(inner: GroupShape, outer: GroupShape) -> GroupShape:
    """A group made of ``outer``'s members, each a block of ranks placed as ``inner`` (the
    context-parallel ranks of each data-parallel replica; the expert tensor-parallel ranks of
    each expert-parallel member): the members one node holds."""
    if inner.per_node < inner.size:  # the inner block already spans nodes
        return GroupShape(size=inner.size * outer.size, per_node=inner.per_node)
    return GroupShape(size=inner.size * outer.size, per_node=inner.size * outer.per_node)


def beside_compute_s(comm_s, window_s, slowdown: float):
    """Seconds that ``comm_s`` of communication, run beside ``window_s`` of compute, adds to that
    compute, when compute runs ``slowdown`` slower while both run (DeviceSpec.overlap_slowdown):
    what outlasts the stretched compute, else the stretch itself, the share
    slowdown / (1 + slowdown) of the communication's time (compute done at 1 / (1 + slowdown)
    of its speed for ``comm_s``, then the rest at full speed; an infinite slowdown hides
    nothing). numpy arrays too."""
    stretch = comm_s * (1.0 if math.isinf(slowdown) else slowdown / (1.0 + slowdown))
    beyond = comm_s - window_s
    return _larger(_larger(0.0 * beyond, beyond), stretch)


def p2p_s(nbytes: float, link: LinkSpec) -> float:
    """One message of ``nbytes`` over ``link`` (a send/receive pair: LinkSpec.message_sync_s)."""
    if nbytes <= 0:
        return 0.0
    return link.message_sync_s + link.message_latency_s + nbytes / link.message_bytes_per_s


def ring_allreduce_s(nbytes, n: int, link: LinkSpec, count=1):
    """Ring all-reduce of an ``nbytes`` buffer on ``n`` ranks over one tier."""
    if n <= 1:
        return 0.0 * nbytes
    steps = 2 * (n - 1)
    wire_bytes = 2 * (n - 1) / n * nbytes
    return count * (link.sync_s + steps * link.latency_s) + wire_bytes / link.effective_bytes_per_s


def ring_allgather_s(nbytes, n: int, link: LinkSpec, count=1):
    """Ring all-gather producing an ``nbytes`` buffer on each of ``n`` ranks."""
    return link.allgather_factor * _ring_half_s(nbytes, n, link, count)


def ring_reduce_scatter_s(nbytes, n: int, link: LinkSpec, count=1):
    """Ring reduce-scatter of an ``nbytes`` buffer on ``n`` ranks (same volume as all-gather)."""
    return link.reduce_scatter_factor * _ring_half_s(nbytes, n, link, count)


def _ring_half_s(nbytes, n: int, link: LinkSpec, count=1):
    """Half an all-reduce: ``n - 1`` steps moving ``(n-1)/n`` of the buffer per rank."""
    if n <= 1:
        return 0.0 * nbytes
    steps = n - 1
    wire_bytes = (n - 1) / n * nbytes
    return count * (link.sync_s + steps * link.latency_s) + wire_bytes / link.effective_bytes_per_s


def allreduce_s(nbytes, group: GroupShape, cluster: Cluster, count=1):
    """All-reduce on a group placed on ``cluster``: flat inside a node; across nodes each GPU
    carries its 1/g share over its own NIC (the ring over the nodes) while the intra-node tier
    reduces and gathers the rest, both tiers at once: the slower sets the time.

    NCCL cuts a collective into chunks that flow through every link of its rings together, so
    the intra-node and inter-node traffic overlap rather than run one after the other; its
    multi-node bus bandwidth on DGX H100 (8 x 400 Gb/s NICs) is reported at 400-450 GB/s (on
    A100 with 8 x HDR, 250-300), about the NICs' line rate per node, which the sum of the two
    phases would halve. The inter-node volume is the hierarchical one (each GPU's 1/g share
    over the ring of nodes): a flat ring over all ranks would put up to a third more through
    each NIC, and stay below the line rate those reports exceed."""
    n, g = group.size, min(group.per_node, group.size)
    if n <= 1:
        return 0.0 * nbytes
    if g >= n:
        return ring_allreduce_s(nbytes, n, cluster.intra_node, count)
    # the all-reduce's own phases, not the backend's separate reduce-scatter/all-gather calls
    intra = 2 * _ring_half_s(nbytes, g, cluster.intra_node, count)
    inter = ring_allreduce_s(nbytes / g, group.nodes, cluster.inter_node, count)
    return _tiers_s(intra, 2 * _ring_half_s(0.0 * nbytes, g, cluster.intra_node, count),
                    inter, ring_allreduce_s(0.0 * nbytes, group.nodes, cluster.inter_node, count))


def _tiers_s(intra, intra_latency, inter, inter_latency):
    """A collective's intra-node and inter-node phases at once (each with its latency part):
    the slower tier's transfer sets the time, and both latencies are paid, as every chunk
    crosses both tiers."""
    return _larger(intra - intra_latency, inter - inter_latency) + intra_latency + inter_latency


def _larger(a, b):
    """The larger of two times, numpy arrays too."""
    return a + (b - a) * (b > a)


def allgather_s(nbytes, group: GroupShape, cluster: Cluster, count=1):
    """All-gather of an ``nbytes`` (full-size) buffer on a placed group."""
    return _half_collective_s(ring_allgather_s, nbytes, group, cluster, count)


def reduce_scatter_s(nbytes, group: GroupShape, cluster: Cluster, count=1):
    """Reduce-scatter of an ``nbytes`` (full-size) buffer on a placed group."""
    return _half_collective_s(ring_reduce_scatter_s, nbytes, group, cluster, count)


def _half_collective_s(ring, nbytes, group: GroupShape, cluster: Cluster, count=1):
    n, g = group.size, min(group.per_node, group.size)
    if n <= 1:
        return 0.0 * nbytes
    if g >= n:
        return ring(nbytes, n, cluster.intra_node, count)
    inter = ring(nbytes / g, group.nodes, cluster.inter_node, count)
    intra = ring(nbytes, g, cluster.intra_node, count)
    return _tiers_s(intra, ring(0.0 * nbytes, g, cluster.intra_node, count),  # as allreduce_s
                    inter, ring(0.0 * nbytes, group.nodes, cluster.inter_node, count))


def alltoall_s(nbytes, group: GroupShape, cluster: Cluster, count=1):
    """All-to-all on a placed group, each rank holding ``nbytes`` and sending an equal share to
    every member: the shares for members on its own node cross the intra-node tier, the others
    the inter-node tier (every GPU driving its own share of the NICs), both at once."""
    n, g = group.size, min(group.per_node, group.size)
    if n <= 1:
        return 0.0 * nbytes
    return both_tiers_s(nbytes * (g - 1) / n, nbytes * (n - g) / n, cluster,
                        spans_nodes=g < n, count=count)


def both_tiers_s(intra_bytes, inter_bytes, cluster: Cluster, *, spans_nodes: bool, count=1):
    """Each GPU sending ``intra_bytes`` over the intra-node tier and ``inter_bytes`` over the
    inter-node tier at once (``count`` calls' latency on each): the slower tier sets the time;
    only the intra-node tier where the group does not span nodes. The calls are sends and
    receives (NCCL's all-to-all is grouped send/receive pairs, the runtime's batched
    point-to-point sends): each pays a send/receive pair's latency and its cost between busy
    ranks (LinkSpec.message_latency_s, message_sync_s: measured for such pairs where profiled,
    else the collectives'); the bytes move at the tier's all-to-all bandwidth
    (LinkSpec.alltoall_bytes_per_s: on NVLink below the all-reduce's)."""
    intra = cluster.intra_node
    t = count * (intra.message_sync_s + intra.message_latency_s) + \
        intra_bytes / intra.alltoall_bytes_per_s
    if not spans_nodes:
        return t
    inter = cluster.inter_node
    across = count * (inter.message_sync_s + inter.message_latency_s) + \
        inter_bytes / inter.alltoall_bytes_per_s
    return _larger(t, across)
