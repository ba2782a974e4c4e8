"""Context parallelism: each cp rank holds 1/cp of every sequence and attention runs as a ring.

The sequence is cut into 2 x cp chunks; cp rank r holds chunks r and 2cp-1-r (causal attention's
work is then the same on every rank: Megatron-LM's and torchtitan's load balancing). Position ids
follow the chunks (the model gets them as ``position_ids``, so rotary embeddings see the true
positions), and so do the targets.

Attention is a ring over the cp group (``cp_comm`` "p2p"): keys and values, stacked into one
message, travel to the next rank by point-to-point sends, cp - 1 times, while each rank attends
to the block it holds; partial results merge by their log-sum-exp (online softmax). Causal
masking is per chunk pair: a query chunk sees earlier key chunks whole, its own chunk under a
causal mask, later chunks not at all. Each block is one call of the CPU flash-attention kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, which returns the log-sum-exp the merge
needs; grouped-query heads are expanded per block, after the exchange, so the ring carries the
compact keys and values). The backward is explicit (a custom autograd.Function): each block's
gradients come from the kernel's backward given the merged output and log-sum-exp, and each
rank sends its share of the key/value gradients (one message) straight back to the rank that
owns those keys and values (one point-to-point round per layer instead of cp rounds around the
ring: on gloo every round is a synchronisation of the ranks, which costs more than the
bytes).

torch's own ``torch.distributed.tensor.experimental.context_parallel`` does not run here: in
torch 2.13 it dispatches only the CUDA attention kernels (flash, efficient, cuDNN); on the CPU
scaled_dot_product_attention becomes ``aten._scaled_dot_product_flash_attention_for_cpu``, for
which it has no rule ("does not have a sharding strategy registered").

Hugging Face models call attention through ``transformers.AttentionInterface``; the stage's model
copy is switched to the implementation registered here (``RING``), which needs no mask (the mask
functions are skipped for implementations they do not know).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.distributed as dist

from planner.errors import SpecError

RING = "planner_ring"
"""The attention implementation name registered with transformers."""


def chunk_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of cp rank ``rank``'s tokens: chunks ``rank`` and ``2cp-1-rank`` of
    ``2cp`` equal chunks."""
    c = seq_len // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(first * c, (first + 1) * c),
                      torch.arange(second * c, (second + 1) * c)])


@dataclass
class Ring:
    """This process's place in its context-parallel ring."""

    group: object
    rank: int
    """Position in the ring (the cp coordinate)."""
    size: int
    next_rank: int
    """Global rank of the next position (keys and values go there)."""
    prev_rank: int
    """Global rank of the previous position (keys and values come from there)."""
    ranks: tuple[int, ...] = ()
    """Global rank of every position (the key/value gradients go back to their owner)."""


_RING: Ring | None = None
"""The ring of this process (one per process: a process has one cp coordinate)."""


def set_ring(ring: Ring | None) -> None:
    global _RING
    _RING = ring


def register() -> None:
    """Make ``RING`` an attention implementation transformers can call."""
    from transformers import AttentionInterface  # lazy: transformers takes seconds to import; only cp plans

    if RING not in AttentionInterface._global_mapping:
        AttentionInterface.register(RING, hf_ring_attention)


DROPOUT_KEYS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")
"""Config keys of the dropout Hugging Face attention applies as a function (no module)."""


def hf_ring_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: float | None = None, sliding_window=None, **kwargs):
    """transformers' attention signature: query [B, H, S, D], key/value [B, Hkv, S, D] ->
    (output [B, S, H, D], None)."""
    ring = _RING
    if ring is None:
        raise SpecError("parallel.cp: ring attention called outside a context-parallel run")
    if dropout:
        raise SpecError("parallel.cp: the ring attention has no attention dropout; plan a model "
                        "without it (its config's attention dropout 0), or with --fix cp=1")
    if not getattr(module, "is_causal", True):
        raise SpecError("parallel.cp: the ring attention is causal; this attention is not")
    if kwargs.get("softcap") or kwargs.get("s_aux") is not None:
        raise SpecError("parallel.cp: the ring attention has no logit soft-capping or sinks")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = RingAttention.apply(query, key, value, scale, ring)
    return out.transpose(1, 2).contiguous(), None


def _blocks(q_rank: int, kv_rank: int, cp: int):
    """(query chunk, key chunk, causal) for the blocks of a query rank's two chunks against a key
    rank's two chunks that are not entirely masked (local chunk indices 0 and 1)."""
    q_chunks = (q_rank, 2 * cp - 1 - q_rank)
    k_chunks = (kv_rank, 2 * cp - 1 - kv_rank)
    out = []
    for i, qc in enumerate(q_chunks):
        for j, kc in enumerate(k_chunks):
            if qc > kc:
                out.append((i, j, False))
            elif qc == kc:
                out.append((i, j, True))
    return out


def _chunks(x: torch.Tensor) -> list[torch.Tensor]:
    """The two chunks along the sequence dimension (2), each contiguous."""
    return [c.contiguous() for c in x.chunk(2, dim=2)]


def _expand(x: torch.Tensor, rep: int) -> torch.Tensor:
    """Key/value heads repeated for the query heads that share them ([B, Hkv, S, D] ->
    [B, Hkv*rep, S, D]; query head h reads key head h // rep, as transformers' repeat_kv)."""
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def _fold(x: torch.Tensor, rep: int) -> torch.Tensor:
    """Gradients of expanded key/value heads summed back ([..., Hkv*rep, S, D] -> [..., Hkv, S,
    D])."""
    if rep == 1:
        return x
    return x.unflatten(-3, (x.shape[-3] // rep, rep)).sum(-3)


def _exchange(ring: Ring, kv: torch.Tensor):
    """Send ``kv`` (keys and values stacked: one message, where a gloo send costs its caller
    about what the transfer does) to the next rank and receive as much from the previous one
    (async)."""
    recv = torch.empty_like(kv)
    return recv, dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, ring.next_rank, ring.group),
                                         dist.P2POp(dist.irecv, recv, ring.prev_rank,
                                                    ring.group)])


def _wait(works) -> None:
    for w in works:
        w.wait()


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _block(q, k, v, causal: bool, scale: float):
    """One block of attention: (output, log-sum-exp of each query row) (CPU flash kernel; on
    CUDA the math is the same, in scaled_dot_product_attention's reference form)."""
    if q.device.type == "cpu":
        out, lse = _FLASH(q, k, v, 0.0, causal, scale=scale)
        return out, lse
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.float()).to(q.dtype), lse


def _block_backward(do, q, k, v, out, lse, causal: bool, scale: float):
    """Gradients of one block given the *merged* output and log-sum-exp (the probabilities of
    the block are then its share of the whole softmax)."""
    if q.device.type == "cpu":
        return _FLASH_BACKWARD(do, q, k, v, out, lse, 0.0, causal, scale=scale)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    dof = do.float()
    dv = torch.matmul(p.transpose(-1, -2), dof)
    dp = torch.matmul(dof, v.float().transpose(-1, -2))
    ds = p * (dp - (dof * out.float()).sum(-1, keepdim=True))
    return (torch.matmul(ds, k.float()) * scale, torch.matmul(ds.transpose(-1, -2), q.float())
            * scale, dv)


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries against every rank's keys and values, passed
    around the ring. Tensors are [B, heads, S_local, D] (fewer key/value heads than query heads
    allowed); each block runs the CPU flash-attention kernel, blocks merge in fp32."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, ring: Ring):
        rep = q.shape[1] // k.shape[1]
        q_chunks = _chunks(q)
        out: list = [None, None]
        lse: list = [None, None]
        held = torch.stack([k, v])  # [2, B, Hkv, S, D]
        saved = []
        for step in range(ring.size):
            src = (ring.rank - step) % ring.size
            pending = None
            if step < ring.size - 1:
                incoming, pending = _exchange(ring, held)
            kc = [_expand(c, rep) for c in _chunks(held[0])]
            vc = [_expand(c, rep) for c in _chunks(held[1])]
            for i, j, causal in _blocks(ring.rank, src, ring.size):
                o, l = _block(q_chunks[i], kc[j], vc[j], causal, scale)
                o = o.float()
                if out[i] is None:
                    out[i], lse[i] = o, l
                    continue
                new = torch.logaddexp(lse[i], l)
                out[i] = (out[i] * torch.exp(lse[i] - new).unsqueeze(-1)
                          + o * torch.exp(l - new).unsqueeze(-1))
                lse[i] = new
            saved.append(held)
            if pending is not None:
                _wait(pending)
                held = incoming
        result = torch.cat(out, dim=2).to(q.dtype)
        ctx.scale, ctx.ring, ctx.rep = scale, ring, rep
        ctx.save_for_backward(q, result, torch.cat(lse, dim=2), *saved)
        return result

    @staticmethod
    def backward(ctx, grad_out):
        ring, scale, rep = ctx.ring, ctx.scale, ctx.rep
        q, out, lse, *saved = ctx.saved_tensors  # saved: each step's stacked keys and values
        q_chunks, do_chunks, out_chunks = _chunks(q), _chunks(grad_out), _chunks(out)
        lse_chunks = [c.contiguous() for c in lse.chunk(2, dim=2)]
        dq = [torch.zeros(c.shape, dtype=torch.float32, device=c.device) for c in q_chunks]
        others = [p for p in range(ring.size) if p != ring.rank]
        incoming = {p: torch.empty(saved[0].shape, dtype=torch.float32, device=q.device)
                    for p in others}
        works = [dist.irecv(incoming[p], ring.ranks[p], ring.group) for p in others]
        own = None
        for step in range(ring.size):
            src = (ring.rank - step) % ring.size
            kc = [_expand(c, rep) for c in _chunks(saved[step][0])]
            vc = [_expand(c, rep) for c in _chunks(saved[step][1])]
            b, h, c, d = kc[0].shape
            grads = torch.zeros((2, b, h, 2 * c, d), dtype=torch.float32, device=q.device)
            dk, dv = grads[0].chunk(2, dim=2), grads[1].chunk(2, dim=2)
            for i, j, causal in _blocks(ring.rank, src, ring.size):
                gq, gk, gv = _block_backward(do_chunks[i], q_chunks[i], kc[j], vc[j],
                                             out_chunks[i], lse_chunks[i], causal, scale)
                dq[i] += gq
                dk[j].add_(gk)
                dv[j].add_(gv)
            grads = _fold(grads, rep).contiguous()  # one message: keys' and values' gradients
            if src == ring.rank:
                own = grads
            else:  # straight back to the owner of these keys and values
                works.append(dist.isend(grads, ring.ranks[src], ring.group))
        _wait(works)
        for p in others:  # every rank's share, in rank order
            own = own + incoming[p]
        dtype = saved[0].dtype
        return (torch.cat(dq, dim=2).to(q.dtype), own[0].to(dtype), own[1].to(dtype), None,
                None)


def check_model(module, seq_len: int, cp: int) -> None:
    """Refuse (SpecError naming cp) a model or sequence the ring cannot run."""
    if seq_len % (2 * cp):
        raise SpecError(f"parallel.cp: the sequence of {seq_len} tokens does not split into "
                        f"2 x cp = {2 * cp} equal chunks; plan another cp or seq_len")
    config = getattr(module, "config", None)
    if config is None or not hasattr(module, "get_input_embeddings"):
        raise SpecError("parallel.cp: the runtime runs context parallelism on Hugging Face "
                        "decoders only (their attention and position ids); plan with --fix cp=1")
    if "position_ids" not in inspect.signature(module.forward).parameters:
        raise SpecError(f"parallel.cp: {type(module).__name__} takes no position_ids, which "
                        "context parallelism must pass; plan with --fix cp=1")
    v_dim, qk_dim = getattr(config, "v_head_dim", None), getattr(config, "qk_head_dim", None)
    if v_dim and qk_dim and v_dim != qk_dim:
        raise SpecError(f"parallel.cp: the ring attention needs values as wide as keys (this "
                        f"model's are {v_dim} and {qk_dim} wide: latent attention); plan with "
                        "--fix cp=1")
    window = getattr(config, "sliding_window", None)
    if window and window < seq_len:
        raise SpecError(f"parallel.cp: the ring attention has no sliding window ({window} < "
                        f"{seq_len} tokens); plan with --fix cp=1")
    dropped = [k for k in DROPOUT_KEYS if float(getattr(config, k, 0.0) or 0.0) > 0]
    if dropped:  # (GPT-2's is attn_pdrop, BERT's attention_probs_dropout_prob)
        raise SpecError(f"parallel.cp: the ring attention has no attention dropout (this model's "
                        f"{dropped[0]} is {getattr(config, dropped[0]):g}); plan with --fix cp=1, "
                        f"or a config.json with {dropped[0]}: 0")
    if getattr(config, "attn_logit_softcapping", None) or any(
            isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in module.modules()):
        raise SpecError("parallel.cp: the ring attention has no logit soft-capping or attention "
                        "sinks; plan with --fix cp=1")
