"""What one block of a model asks of the hardware, per training sample.

The tracer measures these quantities on one sample (batch 1) at the traced sequence length; the cost
model multiplies by the micro-batch size. Quantities split by tensor parallelism ("_tp") follow
Megatron-LM's column/row pattern (Shoeybi et al. 2019): the ops between a column-parallel Linear and
the row-parallel Linear that consumes it run on 1/t of the heads or hidden units. Quantities marked
"_rep" are repeated on every tensor-parallel rank unless sequence parallelism splits them along the
sequence (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

SPLIT_NONE, SPLIT_N, SPLIT_K, SPLIT_BATCH = 0, 1, 2, 3
"""How tensor parallelism splits a GEMM: not at all, its output features (column-parallel), its
reduction dimension (row-parallel), or its batch of heads (attention matmuls)."""


@dataclass(frozen=True, kw_only=True)
class Gemm:
    """One GEMM of a block's forward, per sample: ``batch`` independent (m x k) @ (k x n) products.

    For a Linear, ``m`` counts the tokens of one sample; for a batched matmul, ``batch`` counts the
    heads of one sample. The micro-batch multiplies ``m`` (Linear) or ``batch`` (batched)."""

    batch: float
    m: float
    n: float
    k: float
    split: int = SPLIT_NONE
    """SPLIT_NONE, SPLIT_N, SPLIT_K or SPLIT_BATCH."""
    linear: bool = True
    """True when one operand is a weight (the samples run along ``m``)."""
    grad_a: bool = True
    """Backward computes the gradient of the left operand (the m x k activation): an
    (m x n) @ (n x k) GEMM. False for inputs no gradient reaches (pixels, frozen branches)."""
    grad_b: bool = True
    """Backward computes the gradient of the right operand (a weight, or a second activation):
    a (k x m) @ (m x n) GEMM. False for frozen weights."""
    attention: bool = False
    """A GEMM of an unfused attention core (QK^T or scores x V, traced from eager code): priced
    as it runs with materialized attention, as part of a fused kernel with flash attention."""
    experts: int = 0
    """Routed experts of a Mixture-of-Experts GEMM (one matrix per expert, each routed token copy
    meeting its own expert's): ``m`` counts the token copies of one sample (tokens x top-k), split
    over the experts; expert parallelism places the experts, and ``etp`` (not ``tp``) splits
    the matrices (``split`` says how). 0 for every other GEMM."""
    masked: float = 0.0
    """For a GEMM of an eager attention core whose module declares its mask
    (planner.trace.masks): the share of its FLOPs a fused kernel skipping masked tiles does not
    do (1/2 under a causal mask, more under a sliding window); 0 otherwise."""
    mla_up: bool = False
    """An up projection of multi-head latent attention (the queries', and the keys' and values'
    from their shared latent), which ``recompute="mla_up_proj"`` runs again in backward."""
    shared_expert: bool = False
    """A GEMM of an MoE layer's shared expert (DeepSeek's, Qwen2-MoE's: every token, beside the
    routed experts), which Megatron-Core's --moe-shared-expert-overlap runs beside the token
    dispatch and combine (EngineSpec.moe_shared_overlap)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def bwd_flops(self) -> float:
        """FLOPs of the gradients backward computes for this GEMM."""
        return self.flops * (int(self.grad_a) + int(self.grad_b))


@dataclass(frozen=True, kw_only=True)
class BlockWork:
    """Per-sample work and memory of one block (all figures for batch 1)."""

    mm_flops_tp: float = 0.0
    """Forward FLOPs of GEMMs that tensor parallelism splits."""
    mm_flops_rep: float = 0.0
    """Forward FLOPs of GEMMs repeated on every tensor-parallel rank."""
    attn_flops: float = 0.0
    """Forward FLOPs of attention cores (QK^T and attention x V), split over heads by tp."""
    fused_attn_flops: float = 0.0
    """The part of ``attn_flops`` run by fused attention ops (scaled_dot_product_attention); the
    rest are explicit matmuls, listed in ``gemms``."""
    fused_attn_flops_rep: float = 0.0
    """The part of ``fused_attn_flops`` outside tensor-parallel regions, repeated on every tp rank
    (the attention of an ``nn.MultiheadAttention``, whose packed projections no module role
    splits); its scores and causal share are taken in proportion."""
    attn_causal_flops: float = 0.0
    """The part of ``fused_attn_flops`` under a causal mask (a fused kernel skips about half)."""
    attn_score_params: float = 0.0
    """Parameters joined to eager attention scores (gpt-oss's sinks: a learned logit per head the
    softmax normalizes over with the keys), which Transformer Engine's context parallelism runs
    by a2a only."""
    attn_window_cut: float = 0.0
    """What sliding windows take off ``attn_causal_flops``: a causal call of square F under a
    window is priced as a causal call of square keep x F (planner.trace.masks), and this holds
    the (1 - keep) x F of such calls."""
    attn_window_flops: float = 0.0
    """The square FLOPs of the causal calls under a sliding window (part of
    ``attn_causal_flops``)."""
    attn_window_rows: float = 0.0
    """... and those FLOPs per key: the square over its length, summed over the windowed calls
    (the query rows, in FLOPs per query-key pair, that a windowed kernel's fixed work per row
    applies to: costmodels.attention.window_work)."""
    eager_attn_masked_flops: float = 0.0
    """Forward FLOPs of eager attention cores (their GEMMs, in ``gemms``) that a fused kernel
    skipping masked tiles does not do, where their module declares the mask (``Gemm.masked``)."""
    eager_attn_flops_rep: float = 0.0
    """Forward FLOPs of eager attention cores outside tensor-parallel regions (part of
    ``mm_flops_rep``; those inside are in ``attn_flops``)."""
    fused_attn_calls: float = 0.0
    """Fused attention calls the block makes per micro-batch (each call takes the whole
    micro-batch): a kernel's rate depends on its size where it was measured by size."""
    attn_scores: float = 0.0
    """Attention score elements (heads x queries x keys) of fused attention cores, split by tp."""
    attn_scores_dropout: float = 0.0
    """The part of ``attn_scores`` followed by attention dropout."""
    bwd_flops: float = 0.0
    """Backward FLOPs: the gradients of the GEMM operands that need them, and 2x the forward of
    attention cores (the FLOPs a training step counts, before any recomputation)."""
    eager_attn_bytes_tp: float = 0.0
    """Bytes the memory-bound ops of unfused attention cores (softmax, masking, dropout of the
    scores) move, one kernel per op: part of ``mem_bytes_tp``; a fused attention kernel never
    writes the scores."""
    eager_attn_bytes_rep: float = 0.0
    """The same outside tensor-parallel regions (part of ``mem_bytes_rep``)."""
    eager_attn_fused_tp: float = 0.0
    """The same with memory-bound chains fused (part of ``fused_bytes_tp``)."""
    eager_attn_fused_rep: float = 0.0
    """The same outside tensor-parallel regions (part of ``fused_bytes_rep``)."""
    eager_attn_kernels: float = 0.0
    """Kernels of those ops, one per op (part of ``kernels_eager``)."""
    eager_attn_kernels_fused: float = 0.0
    """Kernels of those ops with chains fused (part of ``kernels_fused``)."""
    mem_bytes_tp: float = 0.0
    """Bytes read + written by memory-bound ops inside tensor-parallel regions, one kernel per op."""
    mem_bytes_rep: float = 0.0
    """Bytes read + written by memory-bound ops outside them (split only by sequence parallel)."""
    mem_bytes_routed: float = 0.0
    """The part of ``mem_bytes_rep`` that ops inside the routed experts' modules move (experts are
    split by expert parallelism, not tp) (gathering token copies, activations between expert
    GEMMs, weighting and combining them): work on token copies, which the busiest
    expert-parallel rank does (costmodels.experts.rank_load) times more of than the mean."""
    mem_bytes_routed_hidden: float = 0.0
    """The part of ``mem_bytes_routed`` made at the hidden width (gathering, weighting and
    combining the token copies): expert tensor parallelism runs it on all its etp ranks' copies
    (as the allgather dispatcher does; the alltoall dispatcher permutes before its etp gather,
    so this is an upper bound there), while the activations between the expert GEMMs are split
    over them. 0 where the experts' inner width equals the hidden width (gpt-oss), which the
    trace cannot tell apart."""
    fused_bytes_tp: float = 0.0
    """Like ``mem_bytes_tp`` when chains of memory-bound ops run as one fused kernel each."""
    fused_bytes_rep: float = 0.0
    """Like ``mem_bytes_rep`` for fused kernels."""
    kernel_bytes: float = 0.0
    """Typical bytes one memory-bound kernel moves per sample, weighted by bytes (sum of squares
    over sum): the size a measured throughput table is read at."""
    kernels_eager: float = 0.0
    """Forward kernel launches with one kernel per op (per micro-batch, not per sample)."""
    kernels_fused: float = 0.0
    """Forward kernel launches with memory-bound chains fused (per micro-batch)."""
    act_bytes_tp: float = 0.0
    """Bytes saved for backward, produced inside tensor-parallel regions (not the attention core)."""
    act_bytes_rep: float = 0.0
    """Bytes saved for backward, produced outside tensor-parallel regions."""
    act_bytes_attn: float = 0.0
    """Bytes saved for backward by the attention core's s x s tensors (selective recompute drops them)."""
    act_fused_away_tp: float = 0.0
    """The part of ``act_bytes_tp`` a fused kernel does not keep: tensors made and saved inside one
    chain of element-wise ops (the tanh-GELU of eager code saves four tensors, a fused GELU its
    input only; the backward kernel recomputes the rest). Dropout masks are always kept."""
    act_fused_away_rep: float = 0.0
    """The same outside tensor-parallel regions (part of ``act_bytes_rep``)."""
    act_linear_in_tp: float = 0.0
    """The part of ``act_bytes_tp`` saved only as the input of weight GEMMs (Linear layers), which
    FP8 training keeps quantized (costmodels.precision)."""
    act_linear_in_rep: float = 0.0
    """The same outside tensor-parallel regions (part of ``act_bytes_rep``)."""
    act_routed_tp: float = 0.0
    """The part of ``act_bytes_tp`` made inside the routed experts' modules (token copies, expert
    GEMM outputs and activations): it grows with the tokens routed to the rank's experts
    (costmodels.experts.rank_load)."""
    act_routed_rep: float = 0.0
    """The same outside tensor-parallel regions (part of ``act_bytes_rep``)."""
    act_routed_fused_away_tp: float = 0.0
    """The part of ``act_routed_tp`` a fused kernel does not keep (part of ``act_fused_away_tp``)."""
    act_routed_fused_away_rep: float = 0.0
    """The same outside tensor-parallel regions."""
    act_routed_linear_in_tp: float = 0.0
    """The part of ``act_routed_tp`` that weight GEMMs keep as their input (part of
    ``act_linear_in_tp``: quantized under fp8)."""
    act_routed_linear_in_rep: float = 0.0
    """The same outside tensor-parallel regions."""
    act_routed_gathered: float = 0.0
    """The part of ``act_routed_rep`` the experts' first GEMMs keep as their input: the token
    copies at the hidden width, which expert tensor parallelism gathers over its etp ranks
    before the experts (Megatron-Core's dispatcher), so each of them keeps etp times its own."""
    act_routed_weighted: float = 0.0
    """The part of ``act_routed_rep`` kept only for the routing weights' multiply after the
    experts: the output of each expert's last GEMM, at the hidden width, which the multiply saves
    for the weights' gradient (with a bias added first, the sum, which a fused chain of the two
    already drops: not counted here). An engine that multiplies the weights into the activation
    before that GEMM keeps none of it (EngineSpec.moe_probs_in_activation)."""
    expert_groups: float = 0.0
    """Groups of consecutive experts the router limits each token to (0: no such limit):
    DeepSeek-V3's node-limited routing, 8 groups (the router modules' ``n_group``)."""
    expert_groups_per_token: float = 0.0
    """Of ``expert_groups``, how many each token's experts come from (``topk_group``: 4)."""
    act_moe_act_routed: float = 0.0
    """The part of ``act_routed_rep`` that ``recompute="moe_act"`` does not keep: what the routed
    experts' activation function makes and saves between their GEMMs (the second GEMM's input
    among it), recomputed in backward from the first GEMM's output (Megatron-Core's
    ``moe_act`` recompute module; planner.trace.annotate._moe_act_ops)."""
    act_moe_act_routed_fused_away: float = 0.0
    """The part of ``act_moe_act_routed`` a fused kernel does not keep anyway."""
    act_moe_act_routed_linear_in: float = 0.0
    """The part of ``act_moe_act_routed`` kept as a weight GEMM's input (quantized under fp8)."""
    act_moe_act_norm: float = 0.0
    """The part of ``act_bytes_rep`` that ``recompute="moe_act"`` does not keep outside the
    experts: what the norm before them makes and saves (its output among it), recomputed in
    backward from its input (Megatron-Core's ``layernorm`` recompute module)."""
    act_moe_act_norm_fused_away: float = 0.0
    """The part of ``act_moe_act_norm`` a fused kernel does not keep anyway."""
    act_moe_act_norm_linear_in: float = 0.0
    """The part of ``act_moe_act_norm`` kept as a weight GEMM's input (quantized under fp8)."""
    moe_act_mem_bytes: float = 0.0
    """The part of ``mem_bytes_rep`` in the ops ``recompute="moe_act"`` runs again."""
    moe_act_kernels: float = 0.0
    """Kernels those ops launch (one per op; per micro-batch)."""
    act_mla_up_tp: float = 0.0
    """The part of ``act_bytes_tp`` that ``recompute="mla_up_proj"`` does not keep: what multi-head
    latent attention's up projections and the rotary embedding applied after them make and the
    attention or those ops save (the queries, keys and values among it), per sample
    (Megatron-Core's ``mla_up_proj`` recompute module; planner.trace.annotate._mla_up_ops)."""
    act_mla_up_rep: float = 0.0
    """The same, of ``act_bytes_rep`` (outputs tensor parallelism leaves whole)."""
    act_mla_up_fused_away_tp: float = 0.0
    """The part of ``act_mla_up_tp`` a fused kernel does not keep anyway."""
    act_mla_up_fused_away_rep: float = 0.0
    """The part of ``act_mla_up_rep`` a fused kernel does not keep anyway."""
    mla_up_mem_bytes_tp: float = 0.0
    """The part of ``mem_bytes_tp`` in the memory-bound ops ``recompute="mla_up_proj"`` runs
    again (its GEMMs are those marked ``Gemm.mla_up``)."""
    mla_up_mem_bytes_rep: float = 0.0
    """The same, of ``mem_bytes_rep``."""
    mla_up_kernels: float = 0.0
    """Kernels those ops and GEMMs launch (one per op; per micro-batch)."""
    mla_up_flops: float = 0.0
    """Forward FLOPs per sample of the GEMMs marked ``Gemm.mla_up``."""
    input_bytes: float = 0.0
    """Bytes of the gradient-carrying activations entering the block (what full recompute keeps)."""
    op_saved_tp: float = 0.0
    """What op-level selective checkpointing (``recompute="op"``, torchtitan's) keeps besides the
    block's input: outputs of fused attention and of every other weight GEMM, inside
    tensor-parallel regions."""
    op_saved_rep: float = 0.0
    """The same outside them."""
    bwd_transient_tp: float = 0.0
    """Bytes the block's backward holds transiently beyond what was saved: twice its largest
    gradient-carrying output inside tensor-parallel regions (an output gradient and the input
    gradient written from it); for a block that runs forward only (``runs_backward`` 0), what
    its forward holds instead: twice its largest output (an op's input and output)."""
    bwd_transient_rep: float = 0.0
    """The same outside them."""
    bwd_transient_scores_tp: float = 0.0
    """The same for the score tensors of eager attention cores (heads x queries x keys), inside
    tensor-parallel regions: held only where attention runs materialized (a fused kernel never
    makes them)."""
    bwd_transient_scores_rep: float = 0.0
    """The same outside them."""
    op_recompute_gemm_share: float = 0.0
    """The share of the block's dense weight-GEMM FLOPs that op-level checkpointing recomputes
    (the routed experts' GEMMs, which it does not save, are recomputed whole)."""
    params_tp: float = 0.0
    """Parameters (count) split by tensor parallelism."""
    params_rep: float = 0.0
    """Parameters (count) repeated on every tensor-parallel rank."""
    runs_backward: float = 1.0
    """1 where a backward runs through the block (an op of it carries a gradient: it trains, or
    something before it does); 0 where it runs forward only (every parameter in and before it
    frozen, or nothing of it reaches the loss): no backward, so no recomputation either."""
    frozen_params_tp: float = 0.0
    """The part of ``params_tp`` not trained (requires_grad=False): weights without gradients
    or optimizer states (costmodels.memory.model_state_bytes)."""
    frozen_params_rep: float = 0.0
    """The part of ``params_rep`` not trained."""
    frozen_expert_params: float = 0.0
    """The part of ``expert_params`` not trained (part of ``frozen_params_rep``)."""
    tp_fwd_bytes: float = 0.0
    """Bytes all-reduced across the tensor-parallel group in forward (row-parallel outputs)."""
    tp_bwd_bytes: float = 0.0
    """Bytes all-reduced across the tensor-parallel group in backward (column-parallel input grads)."""
    tp_collectives: int = 0
    """Number of tensor-parallel collectives per forward + backward (for the latency term)."""
    tp_linears: int = 0
    """Linears tensor parallelism shards (column- or row-parallel)."""
    param_tensors_tp: int = 0
    """Parameter tensors tensor parallelism splits."""
    param_tensors_rep: int = 0
    """Parameter tensors repeated on every tensor-parallel rank."""
    expert_params: float = 0.0
    """Parameters of routed experts (count, all experts; part of ``params_rep``): expert
    parallelism shards them over ep x etp ranks instead of tp."""
    expert_flops: float = 0.0
    """Forward FLOPs of routed-expert GEMMs (part of ``mm_flops_rep``; the work the routed token
    copies do, not the experts' whole matrices)."""
    expert_slot_flops: float = 0.0
    """Forward FLOPs of capacity-style experts' empty token slots (GShard's buffers of C slots
    per expert, more than the router fills): the devices compute them, the model's FLOPs (and
    so MFU) leave them out (train_flops)."""
    expert_capacity: float = 0.0
    """1 when the block's routed experts compute fixed buffers of token slots (capacity-style:
    GShard, Switch, DeepSpeed-MoE; the slots already hold the model's capacity factor): their
    GEMMs, dispatch and saved activations are as large however unevenly the router spreads
    tokens, so routing imbalance (EngineSpec.moe_imbalance) does not scale them; else 0."""
    num_experts: float = 0.0
    """Routed experts of the block's Mixture-of-Experts layer (0: none)."""
    routed_tokens: float = 0.0
    """Token copies one sample sends to experts (tokens x top-k, summed over MoE layers)."""
    expert_bias: float = 0.0
    """1 when the block's routed experts add a bias vector each (a parameter of the experts'
    modules with one row per expert: gpt-oss), else 0."""
    moe_layers: float = 0.0
    """Mixture-of-Experts layers in the block (usually 1 or 0; a block a small model collapses
    into holds several)."""
    dispatch_bytes: float = 0.0
    """Bytes of the hidden states those copies carry (dispatch; combine returns as many)."""
    attn_kv_bytes: float = 0.0
    """Bytes of the keys and values entering the block's fused attention (one sample, all heads):
    what context parallelism exchanges."""
    attn_kv_calls: float = 0.0
    """Attention calls (fused or eager cores) whose keys and values ``attn_kv_bytes`` sums: one
    per attention layer, each a context-parallel exchange of its own (a block a small model
    collapses into holds several). 0 in a block traced before it was recorded: one."""
    attn_q_bytes: float = 0.0
    """Bytes of the queries (one sample, all heads)."""
    attn_out_bytes: float = 0.0
    """Bytes of the attention output (one sample, all heads): as large as the queries unless the
    values are narrower than the keys (multi-head latent attention)."""
    attn_heads_q: float = 0.0
    """Query heads of the block's attention (the fewest of its calls; 0: no attention)."""
    attn_heads_kv: float = 0.0
    """Key/value heads of the block's attention (the fewest of its calls)."""
    attn_keys_wider: float = 0.0
    """1 when some attention call of the block reads queries and keys wider than its values
    (multi-head latent attention), else 0."""
    attn_head_dim: float = 0.0
    """Head dimension of the block's attention (fused calls and eager cores), weighted by their
    FLOPs: fused kernels run narrower heads slower (DeviceSpec.attention_d64_share). 0: no
    attention, or a block traced before it was recorded (priced as head dim 128)."""
    gemms: tuple = ()
    """The forward GEMMs (``Gemm``), for shape-dependent efficiency."""

    @property
    def params(self) -> float:
        return self.params_tp + self.params_rep

    @property
    def fwd_flops(self) -> float:
        return self.mm_flops_tp + self.mm_flops_rep + self.attn_flops

    @property
    def train_flops(self) -> float:
        """Model FLOPs of a training step per sample: forward and backward, with attention under
        a causal mask counted half (the work a causal kernel does; Megatron-Core counts it so)
        and under a sliding window the work inside it; capacity-style experts' empty slots left
        out (hardware FLOPs count them: padding_train_flops)."""
        return (self.fwd_flops + self.bwd_flops - 3.0 * self.masked_attn_flops
                - self.padding_train_flops)

    @property
    def padding_train_flops(self) -> float:
        """Forward and backward FLOPs of capacity-style experts' empty token slots per sample."""
        return 3.0 * self.expert_slot_flops

    @property
    def masked_attn_flops(self) -> float:
        """Forward FLOPs of attention (fused calls and eager cores) that a kernel skipping masked
        tiles does not do: half of the causal squares, and what windows cut of the rest."""
        return (0.5 * (self.attn_causal_flops + self.attn_window_cut)
                + self.eager_attn_masked_flops)

    def to_dict(self) -> dict:
        d = {f: getattr(self, f) for f in WORK_FIELDS}
        d["gemms"] = [[g.batch, g.m, g.n, g.k, g.split, int(g.linear), int(g.grad_a),
                       int(g.grad_b), int(g.attention), g.experts, g.masked, int(g.mla_up),
                       int(g.shared_expert)]
                      for g in self.gemms]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BlockWork":
        gemms = tuple(Gemm(batch=b, m=m, n=n, k=k, split=int(s), linear=bool(lin),
                           grad_a=bool(ga), grad_b=bool(gb), attention=bool(at),
                           experts=int(rest[0]) if rest else 0,
                           masked=float(rest[1]) if len(rest) > 1 else 0.0,
                           mla_up=bool(rest[2]) if len(rest) > 2 else False,
                           shared_expert=bool(rest[3]) if len(rest) > 3 else False)
                      for b, m, n, k, s, lin, ga, gb, at, *rest in d.get("gemms", []))
        return cls(gemms=gemms, **{f: d[f] for f in WORK_FIELDS if f in d})


WORK_FIELDS = tuple(f.name for f in fields(BlockWork) if f.name != "gemms")
"""The numeric fields (those the search turns into per-block arrays)."""
