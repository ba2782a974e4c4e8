"""Context parallelism: what exchanging keys and values costs per layer and micro-batch.

Each of ``cp`` ranks holds 1/cp of every sample's tokens (2 cp chunks, each rank a chunk from the
front and one from the back, so that causal attention's work is the same on every rank; Megatron-
Core's load balancing). Attention needs every earlier key and value, which the ranks exchange in
one of four forms (``CP_COMMS`` in planner/options.py):

- ``p2p``: a ring (Liu et al., "Ring Attention with Blockwise Transformers", 2023): cp steps, each
  computing attention against one chunk of K/V while the next chunk arrives from the neighbour;
  backward sends K/V and their gradients (the runtime's ring instead returns each step's
  gradients to their owner). Only what a step's compute does not cover is exposed.
- ``allgather``: K/V all-gathered before attention, their gradients reduce-scattered after
  (the Llama 3 paper, Dubey et al. 2024, §3.3.2): exposed, cheap with few key/value heads.
- ``a2a``: all-to-all from sequence shards to head shards and back for q, k, v and the output
  (Jacobs et al., "DeepSpeed Ulysses", 2023): exposed; needs the heads divisible by cp.
- ``a2a+p2p``: all-to-all inside a node and a ring across nodes (Megatron-Core's hierarchical
  form): heads split over the ranks of a node, the ring over the rest.

Sizes are per micro-batch on one GPU, for the whole sequence (``kv_bytes``: keys and values of
every token of the micro-batch on this tensor-parallel rank; ``q_bytes`` the queries, the output
being as large).
"""

from __future__ import annotations

from costmodels import comm
from costmodels.comm import GroupShape
from costmodels.compute import elementwise_s
from costmodels.hardware import DeviceSpec
from costmodels.topology import Cluster


def exchange_s(form: str, *, cp: int, kv_bytes: float, q_bytes: float, attn_fwd_s: float,
               attn_bwd_s: float, group: GroupShape, cluster: Cluster,
               gradients_back: float = 0.0, gradients_on: float = 1.0,
               gathered_ring: bool = False, passes_last: bool = False,
               out_bytes: float | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of K/V exchange one layer exposes, per micro-batch.
    ``gradients_back`` (p2p ring): gradient bytes per K/V byte that each rank sends straight back
    to the owner of those keys and values once a backward step is done, as the runtime's ring
    does (planner/runtime/context.py; fp32 gradients: 4 / bytes of the compute dtype); 0 for a
    ring that passes K/V and their gradients on around the ring, ``gradients_on`` gradient bytes
    per K/V byte (Transformer Engine's, in the compute dtype: 1; torch's, in fp32).
    ``gathered_ring`` (allgather form): torch's templated ring with its all-gather rotater
    (torchtitan's context parallelism), which all-gathers K/V in forward and again in backward,
    each issued before the first step's attention and awaited after it (hidden behind that
    step, 1 / cp of the rank's attention), and passes the K/V gradients (``gradients_on`` bytes
    per K/V byte) around the whole ring, a send behind each step's backward and the last one
    exposed, instead of one reduce-scatter. ``passes_last`` (p2p form): the ring passes the K/V
    gradients on once more after its last step, exposed (torch's templated ring: each rank gets
    its own K/V's gradients back that way, torch/distributed/tensor/experimental/
    _context_parallel/_attention.py, the dK/dV rotater awaited after the loop).
    ``out_bytes``: the attention output the all-to-all forms send back (default: as large as the
    queries; smaller under latent attention, whose values are narrower)."""
    if cp <= 1 or kv_bytes <= 0:
        return 0.0, 0.0
    slow = cluster.device.overlap_slowdown  # what a send hidden behind attention costs it
    if form == "p2p":
        link = cluster.intra_node if group.per_node >= group.size else cluster.inter_node
        fwd, bwd = _ring(cp, kv_bytes / cp, attn_fwd_s, attn_bwd_s, link, slow, gradients_on)
        if gradients_back:
            bwd = _sent_back(cp, gradients_back * kv_bytes / cp, attn_bwd_s, link, slow)
        elif passes_last:
            bwd += comm.p2p_s(gradients_on * kv_bytes / cp, link)
        return fwd, bwd
    if form == "allgather":
        gather = comm.allgather_s(kv_bytes, group, cluster)
        if gathered_ring:
            link = cluster.intra_node if group.per_node >= group.size else cluster.inter_node
            sync = link.sync_s
            fwd = sync + comm.beside_compute_s(gather - sync, attn_fwd_s / cp, slow)
            again = sync + comm.beside_compute_s(gather - sync, attn_bwd_s / cp, slow)
            return fwd, again + _passed_on(cp, gradients_on * kv_bytes / cp, attn_bwd_s, link,
                                           slow)
        return gather, gather + comm.reduce_scatter_s(kv_bytes, group, cluster)
    out = q_bytes if out_bytes is None else out_bytes
    moved = (q_bytes + out + kv_bytes) / cp  # q, k, v in and the output back, each a local shard
    if form == "a2a":
        t = comm.alltoall_s(moved, group, cluster, count=4)
        return t, t
    # a2a+p2p: heads over the ranks of a node, a ring of node-sized chunks across nodes
    inner = heads_ranks(group)
    outer = cp // inner
    heads = comm.alltoall_s(moved, GroupShape(size=inner, per_node=inner), cluster, count=4)
    f, b = _ring(outer, kv_bytes / cp, attn_fwd_s, attn_bwd_s, cluster.inter_node, slow)
    return heads + f, heads + b


def heads_ranks(group: GroupShape) -> int:
    """Ranks of the a2a+p2p form's all-to-all (those of the context-parallel group in one node):
    each holds 1 / that many of the heads, the ring runs over the rest."""
    return max(1, min(group.per_node, group.size))


def _ring(steps: int, chunk_bytes: float, attn_fwd_s: float, attn_bwd_s: float,
          link, slow: float, gradients_on: float = 1.0) -> tuple[float, float]:
    """A ring of ``steps`` ranks: steps - 1 sends of one K/V chunk in forward (in backward the
    chunk and its gradients, ``gradients_on`` bytes per K/V byte), each behind one step's share
    of the attention compute; what a send/receive pair costs between busy ranks
    (``LinkSpec.message_sync_s``) is not hidden; a hidden send slows that compute by ``slow``
    (comm.beside_compute_s)."""
    if steps <= 1:
        return 0.0, 0.0
    sync = link.message_sync_s
    send_f = comm.p2p_s(chunk_bytes, link) - sync
    send_b = comm.p2p_s((1 + gradients_on) * chunk_bytes, link) - sync
    return ((steps - 1) * (sync + comm.beside_compute_s(send_f, attn_fwd_s / steps, slow)),
            (steps - 1) * (sync + comm.beside_compute_s(send_b, attn_bwd_s / steps, slow)))


def _passed_on(steps: int, grad_bytes: float, attn_bwd_s: float, link, slow: float) -> float:
    """Backward of a ring that passes each rank's running key/value gradients (``grad_bytes``) to
    the next rank after every step, ``steps`` sends in all (torch's templated ring, whose last
    send brings each rank its own): each behind the next step's compute, the last one exposed."""
    if steps <= 1:
        return 0.0
    send = comm.p2p_s(grad_bytes, link)
    hidden = comm.beside_compute_s(send - link.message_sync_s, attn_bwd_s / steps, slow)
    return (steps - 1) * (link.message_sync_s + hidden) + send


def _sent_back(steps: int, grad_bytes: float, attn_bwd_s: float, link, slow: float) -> float:
    """Backward of a ring whose ranks send each step's key/value gradients (``grad_bytes``) to
    their owner as soon as the step is done: steps - 1 sends queue on the link behind the
    compute of the steps after theirs, so the last one is exposed whole; each call's
    synchronisation between busy ranks (``LinkSpec.message_sync_s``) is never hidden."""
    if steps <= 1:
        return 0.0
    sync = link.message_sync_s
    send = comm.p2p_s(grad_bytes, link) - sync
    later = (steps - 2) * attn_bwd_s / steps  # compute after the first send, before the last
    return (steps - 1) * sync + send + comm.beside_compute_s((steps - 2) * send, later, slow)


def ring_merge_s(cp: int, *, q_bytes: float, kv_bytes: float, word: int,
                 device: DeviceSpec, out_bytes: float | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of the element-wise work a p2p ring adds per layer and
    micro-batch when each op is its own kernel (EngineSpec.cp_ring "runtime": the runtime's
    ring, planner/runtime/context.py, and "torch"): a rank attends with its two query chunks to
    2 cp + 1 unmasked chunk pairs, so 2 cp - 1 partial outputs merge by their log-sum-exp, in
    fp32 (seven passes over a query chunk each: two rescales and their sum); the chunks are copied
    out of the local tensors (queries once, each step's keys and values), the output assembled
    and cast back. The backward accumulates each block's query gradient (three passes), assembles
    and sums the key/value gradients of every step, and cuts the queries, output and output
    gradient into chunks again. Sizes as ``exchange_s``; ``word``: bytes of the compute dtype;
    ``out_bytes``: the attention output's, where it is narrower than the queries (latent
    attention: values 128 wide against queries of 192; None: as the queries). The merges and the
    output's copies move the output's width, the query gradient's accumulation the queries'."""
    if cp <= 1 or q_bytes <= 0:
        return 0.0, 0.0
    wide = 4 / word  # merges and accumulations run in fp32
    q_local, kv_local = q_bytes / cp, kv_bytes / cp
    out_local = (q_bytes if out_bytes is None else out_bytes) / cp
    blocks, merges = 2 * cp + 1, 2 * cp - 1
    fwd_bytes = (7 * merges * out_local / 2 * wide + 2 * q_local + 2 * cp * kv_local
                 + 2 * out_local * wide)
    fwd_kernels = 7 * merges + 4 * cp + 4
    bwd_bytes = (3 * blocks * q_local / 2 * wide + 2 * cp * kv_local * wide
                 + 3 * (cp - 1) * kv_local * wide + 2 * (q_local + 2 * out_local)
                 + 3 * q_local * wide + 2 * cp * kv_local)
    bwd_kernels = 3 * blocks + 9 * cp + 5
    return (elementwise_s(fwd_bytes, fwd_kernels, device),
            elementwise_s(bwd_bytes, bwd_kernels, device))
