"""Memory per GPU: model states under ZeRO, activations under recomputation, in-flight micro-batches.

Model states (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC'20, section 3.1): mixed-precision Adam keeps 2 bytes of half-precision weights, 2 bytes of
half-precision gradients and K = 12 bytes of optimizer state (fp32 master weights, momentum and
variance) per parameter. ZeRO-1 shards the optimizer state across the data-parallel group, ZeRO-2
also the gradients, ZeRO-3 also the weights.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
MLSys'23, section 4): a GPT layer keeps ``s b h (34 + 5 a s / h)`` bytes; with tensor parallel
degree t, ``s b h (10 + 24/t + 5 a s / (h t))``; adding sequence parallelism divides all of it by t;
selective recomputation drops the ``5 a s^2 b`` attention-core term; full recomputation keeps only the
layer input (``2 s b h``, divided by t under sequence parallelism).
"""

from __future__ import annotations

import functools
from typing import Literal, get_args

from costmodels.errors import SpecError
from costmodels.precision import FP8_SAVED_INPUT_SHARE, FP8_WEIGHT_COPY_BYTES
from costmodels.workload import BlockWork

Recompute = Literal["none", "selective", "moe_act", "mla_up_proj", "mla_up_proj+moe_act", "full/4",
                    "full/2", "full", "op"]
"""Activation recomputation: none, the attention core only (``selective``, Megatron-LM's), the
routed experts' activation function and the norm before the experts (``moe_act``,
Megatron-Core's ``--recompute-modules moe_act layernorm``; MoE models only), multi-head latent
attention's up projections and rotary embedding (``mla_up_proj``, Megatron-Core's
``--recompute-modules mla_up_proj``; models with latent attention only), both
(``mla_up_proj+moe_act``: ``--recompute-modules mla_up_proj moe_act layernorm``, which
Megatron-Core's MoE guide gives for DeepSeek-V3), whole blocks
(``full``), whole blocks of every k-th layer (``full/k``, the others kept whole: torchtitan's
layer-frequency checkpointing, ``selective_ac_option = "k"``; Megatron-LM's block method
recomputes as many layers per chunk, the first of each, ``--recompute-method block``), or op-level
selective checkpointing (``op``, torchtitan's: keep attention outputs and every other weight
GEMM's output, recompute the rest)."""
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
MODULES: dict[str, tuple[str, ...]] = {"moe_act": ("moe_act",), "mla_up_proj": ("mla_up_proj",),
                                       "mla_up_proj+moe_act": ("mla_up_proj", "moe_act")}
"""The policies that recompute Megatron-Core recompute modules, and the modules each runs (moe_act
with its layernorm); every other policy keeps or drops whole attention cores or blocks."""


def modules_of(recompute: str) -> tuple[str, ...]:
    """The Megatron-Core recompute modules ``recompute`` runs (MODULES; empty for the others)."""
    return MODULES.get(recompute, ())


def layer_interval(recompute: str) -> int:
    """k of a ``full/k`` policy (every k-th layer recomputed whole), 0 for every other."""
    head, _, k = recompute.partition("/")
    return int(k) if head == "full" and k.isdigit() else 0


def every_words(k: int) -> str:
    """'every 2nd layer' for k = 2, as a ``full/k`` policy recomputes."""
    suffix = "th" if k % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"every {k}{suffix} layer"


def layer_policies(checkpointed, recompute: str) -> list[str]:
    """Per block (``checkpointed``: whether recomputation applies to it, Block.recompute), the
    policy it runs under ``recompute``: the policy on the repeated layers and ``none`` elsewhere;
    under ``full/k``, ``full`` on the k-th, 2k-th ... of the layers, in order, and ``none`` on
    the rest (torchtitan counts its checkpoint wrappers from 1 and wraps those the interval
    divides)."""
    k = layer_interval(recompute)
    out, seen = [], 0
    for c in checkpointed:
        if not c:
            out.append("none")
            continue
        seen += 1
        out.append(recompute if not k else "full" if seen % k == 0 else "none")
    return out

OPTIMIZER_STATE_BYTES = {
    # bytes of optimizer state per parameter, by optimizer and compute dtype
    ("adam", "mixed"): 12,  # fp32 master copy + fp32 momentum + fp32 variance
    ("adam", "fp32"): 8,  # fp32 momentum + variance (the weights are the master copy)
    ("sgd", "mixed"): 8,  # fp32 master copy + fp32 momentum
    ("sgd", "fp32"): 4,  # fp32 momentum
}


def precision_class(dtype: str) -> str:
    return "fp32" if dtype == "fp32" else "mixed"


STATE_LAYOUTS = ("megatron", "megatron-bf16-grads", "zero", "fsdp2", "native")
"""How an engine stores model states: ``zero`` as the ZeRO paper counts them (16 bytes per
parameter in mixed precision: 16-bit weights and gradients, 12 bytes of fp32 master weights and
Adam moments);
``megatron`` as Megatron-Core keeps them (docs/user-guide/features/dist_optimizer.md: bf16
parameters with fp32 main gradients, 18 bytes or 6 + 12/d with the distributed optimizer; fp16
parameters and gradients, 20 bytes or 4 + 16/d, the fp32 main gradients sharded with the
optimizer); ``megatron-bf16-grads`` the same with the gradient buffer in bf16 under bf16 and FP8
training (--grad-reduce-in-bf16; ddp.grad_reduce_in_fp32=False, which Megatron-Bridge's
performance configurations set): 16 bytes, and gradients reduced at half the size; ``fsdp2`` as
FSDP2 keeps them under torchtitan's mixed precision (MixedPrecisionPolicy with bf16 parameters
and fp32 reduction, its job_config defaults mixed_precision_param and mixed_precision_reduce):
fp32 sharded parameters that are the optimizer's master copy, fp32 gradients (reduced in fp32)
and moments, 16 bytes; without resharding after forward (ZeRO-2) the gathered bf16 parameters
stay too, and DDP (ZeRO-0) keeps the fp32 parameters whole; ``native`` as the planner's runtime
(``plan run``) keeps them: every state in the training dtype, no master copy (a bf16 model under
torch.optim: 2 + 2 + 4 bytes with Adam), sharded by FSDP2's fully_shard, which has no ZeRO-1:
ZeRO-1 and 2 both shard parameters and gradients and keep the gathered parameters from forward
to backward (planner.runtime.parallelize)."""


def model_state_bytes(params: float, *, dtype: str, optimizer: str, zero: int, dp: int,
                      offload: bool = False, layout: str = "zero",
                      deferred: int = 0, frozen: float = 0.0, fp8_copies: bool = True) -> dict:
    """Bytes per GPU of weights, gradients and optimizer states for ``params`` local parameters,
    ``frozen`` of them not trained (requires_grad=False): those keep their weights (and FP8
    copies), sharded as the weights are, but no gradients and no optimizer states.

    ``params`` is the count this GPU holds before ZeRO sharding (after tensor/pipeline splits).
    With ``offload`` the optimizer states live in host memory (ZeRO-Offload, Ren et al., USENIX
    ATC'21) and take no device memory. ``layout``: STATE_LAYOUTS. ``deferred``: the micro-batches
    of a step whose FSDP2 gradient sync torch's pipelining schedules defer until after every
    backward pass (EngineSpec.pipelined_accumulation; 0: not deferred). The gradients then stay
    unsharded through the backward passes, in the layout's gradient width (fp32 under ``fsdp2``,
    torchtitan's, and ``megatron``'s main-gradient buffer; else the compute dtype's), and ZeRO-3's
    gathered weights stay gathered;
    replicate (ZeRO-0) holds one more whole gradient while it accumulates over several
    micro-batches (measured on `plan run`, docs/runtime.md). ``fp8_copies``: under fp8 the
    engine keeps FP8 copies of the weights (EngineSpec.fp8_copies; torchao keeps none).
    """
    kw = dict(dtype=dtype, optimizer=optimizer, zero=zero, dp=dp, offload=offload, layout=layout,
              deferred=deferred, fp8_copies=fp8_copies)
    per = _state_bytes(**kw)
    if isinstance(frozen, (int, float)) and not frozen:
        return {kind: params * b for kind, b in per}
    held = dict(_state_bytes(**kw, trainable=False))
    return {kind: (params - frozen) * b + frozen * held[kind] for kind, b in per}


@functools.lru_cache(maxsize=4096)
def _state_bytes(*, dtype: str, optimizer: str, zero: int, dp: int, offload: bool,
                 layout: str, deferred: int = 0, trainable: bool = True,
                 fp8_copies: bool = True) -> tuple[tuple[str, float], ...]:
    """(kind, bytes per local parameter) of model_state_bytes (a search asks for the same
    settings over and over); ``trainable=False``: of a frozen parameter."""
    params = 1.0
    opt = optimizer.lower()
    if opt == "adamw":
        opt = "adam"
    key = (opt, precision_class(dtype))
    if key not in OPTIMIZER_STATE_BYTES:
        raise SpecError(f"optimizer: unknown optimizer '{optimizer}'; use adam, adamw or sgd")
    if zero not in (0, 1, 2, 3):
        raise SpecError(f"zero: expected 0, 1, 2 or 3, got {zero!r}")
    if layout not in STATE_LAYOUTS:
        raise SpecError(f"engine.state_layout: expected one of {', '.join(STATE_LAYOUTS)}, got "
                        f"{layout!r}")
    weight_b = 4 if dtype == "fp32" else 2
    grad_b = weight_b
    opt_b = OPTIMIZER_STATE_BYTES[key]
    if layout == "native":  # the moments in the training dtype, no master copy
        opt_b = (2 if opt == "adam" else 1) * weight_b
        zero = max(zero, 2) if zero else 0  # (fully_shard: ZeRO-1 runs as ZeRO-2)
    if layout == "megatron" and dtype in ("bf16", "fp8"):
        grad_b = 4  # the fp32 main-gradient buffer backward accumulates into
    elif layout.startswith("megatron") and dtype == "fp16":
        opt_b += 4  # fp32 main gradients, kept (and sharded) with the optimizer
    weights = params * weight_b / (dp if zero >= 3 else 1)
    if layout == "fsdp2":
        # fp32 parameters (in mixed precision the master copy: the optimizer keeps only its
        # moments), fp32 gradients; ZeRO-2 keeps the gathered parameters from forward to backward
        if dtype != "fp32":
            grad_b, opt_b = 4, opt_b - 4
        weights = params * 4 / (dp if zero >= 2 else 1) + (params * weight_b if zero == 2 else 0)
    elif layout == "native" and zero == 2 and dp > 1:  # the gathered ones, forward to backward
        weights = params * weight_b / dp + params * weight_b
    grads = params * grad_b / (dp if zero >= 2 else 1)
    if deferred:
        unsharded = params * grad_b  # never less than the sharded gradients it replaces
        if zero >= 1:  # the sharded gradients come only with the reduction, after backward
            grads = unsharded
        elif deferred > 1:
            grads += unsharded
        if zero >= 3:
            weights += params * weight_b
    optim = 0.0 if offload else params * opt_b / (dp if zero >= 1 else 1)
    if not trainable:
        grads = optim = 0.0
    out = {"weights": weights, "grads": grads, "optimizer": optim}
    if dtype == "fp8" and fp8_copies:  # the cached FP8 copies, sharded like the weights
        out["fp8_weights"] = params * FP8_WEIGHT_COPY_BYTES / (dp if zero >= 3 else 1)
    return tuple(out.items())


@functools.lru_cache(maxsize=4096)
def state_bytes_per_param(*, dtype: str, optimizer: str, zero: int, dp: int,
                          offload: bool = False, layout: str = "zero",
                          deferred: int = 0, trainable: bool = True,
                          fp8_copies: bool = True) -> float:
    """Model-state bytes per local parameter (weights + grads + optimizer) after ZeRO sharding;
    ``trainable=False``: of a frozen one (model_state_bytes)."""
    return sum(model_state_bytes(1.0, dtype=dtype, optimizer=optimizer, zero=zero, dp=dp,
                                 offload=offload, layout=layout, deferred=deferred,
                                 frozen=0.0 if trainable else 1.0,
                                 fp8_copies=fp8_copies).values())


def optimizer_traffic_bytes(*, dtype: str, optimizer: str, layout: str = "zero") -> float:
    """Bytes one optimizer step moves per parameter: it reads the gradient, reads and writes the
    optimizer states (fp32 master weights, moments, and Megatron's fp32 main gradients where the
    optimizer keeps them) and writes the compute-dtype weights."""
    s = model_state_bytes(1.0, dtype=dtype, optimizer=optimizer, zero=0, dp=1, layout=layout)
    if layout in ("fsdp2", "native"):  # the parameters are the master copy: read and written
        return s["grads"] + 2 * (s["optimizer"] + s["weights"])
    return s["grads"] + 2 * s["optimizer"] + s["weights"]


def optimizer_bytes_per_param(*, dtype: str, optimizer: str) -> float:
    """Optimizer-state bytes per parameter (what offloading moves to the host)."""
    return model_state_bytes(1.0, dtype=dtype, optimizer=optimizer, zero=0, dp=1)["optimizer"]


def usable_bytes(device_memory_bytes: float, *, reserve_fraction: float, reserve_bytes: float) -> float:
    """Memory a training process may plan for: the device minus allocator fragmentation and the
    fixed cost of the runtime (CUDA context, NCCL buffers, cuBLAS workspaces)."""
    return device_memory_bytes * (1.0 - reserve_fraction) - reserve_bytes


def activation_bytes(work: BlockWork, *, micro_batch: int, tp: int, sp: bool, recompute: str,
                     scores_kept: bool = True, fused: bool = False, fp8: bool = False,
                     routed_load: float = 1.0, etp: int = 1,
                     probs_in_activation: bool = False, fp8_experts: bool = True) -> float:
    """Bytes one micro-batch leaves saved in one block until its backward runs. ``scores_kept``:
    attention score tensors traced from eager code are saved (False with flash attention, whose
    fused kernel saves none); ``fused``: chains of element-wise ops run as one kernel each, which
    keeps only the tensors entering the chain (and dropout masks); ``fp8``: the inputs of weight
    GEMMs are kept quantized (costmodels.precision); ``routed_load``: token copies this rank's
    experts receive relative to the mean (costmodels.experts.rank_load), which scales what the
    routed experts save (BlockWork.act_routed_*) where the block keeps its activations (no
    recomputation, or selective); with op-level and full recomputation it is left at the mean:
    full keeps the block's input only, and op-level keeps outputs of plain weight GEMMs and
    attention (torchtitan's policy saves ``aten.mm`` and SDPA outputs), while routed experts run
    grouped or batched GEMMs, which it recomputes (the expert all-to-alls' outputs it keeps with
    expert parallelism are planner.search.costs._op_saved_exchange's: the trace does not see
    them).
    ``etp``: expert tensor parallelism, whose ranks each keep the token copies of all etp ranks
    at the hidden width (BlockWork.act_routed_gathered). ``probs_in_activation``: the routing
    weights multiply the experts' activation before their last GEMM, whose output is then not
    kept (BlockWork.act_routed_weighted; Megatron-Core). ``fp8_experts`` False: under fp8 the
    routed experts' GEMMs stay 16-bit (EngineSpec.fp8_experts), and so do their kept inputs."""
    sp_div = tp if sp else 1
    if recompute == "full":
        return micro_batch * work.input_bytes / sp_div
    if recompute == "op":
        return micro_batch * (work.input_bytes / sp_div + work.op_saved_rep / sp_div
                              + work.op_saved_tp / tp)
    rep, tp_part = work.act_bytes_rep, work.act_bytes_tp
    routed_rep, routed_tp = work.act_routed_rep, work.act_routed_tp
    if fused:
        rep, tp_part = rep - work.act_fused_away_rep, tp_part - work.act_fused_away_tp
        routed_rep = routed_rep - work.act_routed_fused_away_rep
        routed_tp = routed_tp - work.act_routed_fused_away_tp
    if probs_in_activation:
        rep, routed_rep = rep - work.act_routed_weighted, routed_rep - work.act_routed_weighted
    if fp8:
        bf16_in = 0.0 if fp8_experts else 1.0  # (routed inputs, part of the linear inputs)
        rep = rep - FP8_SAVED_INPUT_SHARE * (work.act_linear_in_rep
                                             - bf16_in * work.act_routed_linear_in_rep)
        tp_part = tp_part - FP8_SAVED_INPUT_SHARE * (work.act_linear_in_tp
                                                     - bf16_in * work.act_routed_linear_in_tp)
        if fp8_experts:
            routed_rep = routed_rep - FP8_SAVED_INPUT_SHARE * work.act_routed_linear_in_rep
            routed_tp = routed_tp - FP8_SAVED_INPUT_SHARE * work.act_routed_linear_in_tp
    kept = rep / sp_div + tp_part / tp  # the fused-away parts are parts of these
    # the busiest expert-parallel rank keeps the copies of more tokens than the mean
    kept += (routed_load - 1.0) * (routed_rep / sp_div + routed_tp / tp)
    # (the gathered copies are the experts' first GEMM input: quantized under fp8)
    kept += (etp - 1) * routed_load * work.act_routed_gathered / sp_div * (
        1.0 - FP8_SAVED_INPUT_SHARE if fp8 and fp8_experts else 1.0)
    modules = modules_of(recompute)
    if recompute == "none" or modules:
        kept += work.act_bytes_attn / tp if scores_kept else 0.0
    elif recompute != "selective":
        raise SpecError(f"recompute: expected {', '.join(RECOMPUTE[:-1])} or {RECOMPUTE[-1]}, "
                        f"got {recompute!r}")
    if "moe_act" in modules:
        kept -= moe_act_freed_bytes(work, fused=fused, fp8=fp8, routed_load=routed_load,
                                    fp8_experts=fp8_experts) / sp_div
    if "mla_up_proj" in modules:
        kept -= mla_up_freed_bytes(work, tp=tp, sp=sp, fused=fused)
    return micro_batch * kept


def mla_up_freed_bytes(work: BlockWork, *, tp: int, sp: bool, fused: bool = False) -> float:
    """Bytes per sample on one GPU that ``recompute="mla_up_proj"`` frees of what the block keeps
    without recomputation: what latent attention's up projections and rotary embedding make and
    the attention saves (its queries, keys and values) or those ops save, less what a fused kernel
    would not keep anyway. Megatron-Core runs them under a checkpoint that discards its outputs
    once the attention has run, and again before the attention's backward."""
    tp_part, rep = work.act_mla_up_tp, work.act_mla_up_rep
    if fused:
        tp_part, rep = tp_part - work.act_mla_up_fused_away_tp, rep - work.act_mla_up_fused_away_rep
    return tp_part / tp + rep / (tp if sp else 1)


def moe_act_freed_bytes(work: BlockWork, *, fused: bool = False, fp8: bool = False,
                        routed_load: float = 1.0, fp8_experts: bool = True) -> float:
    """Bytes per sample (before sequence parallelism) that ``recompute="moe_act"`` frees of what
    the block keeps without recomputation: the routed experts' activations (``routed_load``
    times the mean on the busiest expert rank) and the norm before the experts, less what a
    fused kernel would not keep anyway and, under fp8, the part a GEMM keeps quantized."""
    def part(total: float, away: float, linear_in: float, quantized: bool) -> float:
        return (total - (away if fused else 0.0)
                - (FP8_SAVED_INPUT_SHARE * linear_in if quantized else 0.0))

    return (routed_load * part(work.act_moe_act_routed, work.act_moe_act_routed_fused_away,
                               work.act_moe_act_routed_linear_in, fp8 and fp8_experts)
            + part(work.act_moe_act_norm, work.act_moe_act_norm_fused_away,
                   work.act_moe_act_norm_linear_in, fp8))


def backward_transient_bytes(work: BlockWork, *, micro_batch: int, tp: int, sp: bool,
                             scores_kept: bool = True) -> float:
    """Bytes one block's backward allocates transiently (BlockWork.bwd_transient_*): the larger
    of its split and unsplit parts, per GPU; eager attention's score tensors count only where
    ``scores_kept`` (materialized attention; a fused kernel never makes them)."""
    tp_part, rep = work.bwd_transient_tp, work.bwd_transient_rep
    if scores_kept:
        tp_part = tp_part + (work.bwd_transient_scores_tp - tp_part
                             + abs(work.bwd_transient_scores_tp - tp_part)) / 2  # max
        rep = rep + (work.bwd_transient_scores_rep - rep
                     + abs(work.bwd_transient_scores_rep - rep)) / 2
    a = micro_batch * tp_part / tp
    b = micro_batch * rep / (tp if sp else 1)
    return (a + b + abs(a - b)) / 2  # max, on numbers or arrays of blocks


def recompute_working_bytes(work: BlockWork, *, micro_batch: int, tp: int, sp: bool,
                            recompute: str, scores_kept: bool = True, fused: bool = False,
                            fp8: bool = False, routed_load: float = 1.0, etp: int = 1,
                            probs_in_activation: bool = False, fp8_experts: bool = True) -> float:
    """Extra bytes alive while one block's forward is recomputed during backward (on the busiest
    expert-parallel rank with ``routed_load``, as activation_bytes)."""
    if recompute == "none":
        return 0.0
    if recompute == "selective":
        return micro_batch * work.act_bytes_attn / tp if scores_kept else 0.0
    modules = modules_of(recompute)
    if modules:  # one layer's freed tensors of a module, made again for its backward (the
        # attention's and the experts' are made again at different points of it: the larger)
        act = moe_act_freed_bytes(work, fused=fused, fp8=fp8, routed_load=routed_load,
                                  fp8_experts=fp8_experts) / (
            tp if sp else 1) if "moe_act" in modules else 0.0
        up = mla_up_freed_bytes(work, tp=tp, sp=sp, fused=fused) if "mla_up_proj" in modules \
            else 0.0
        return micro_batch * (act + up + abs(act - up)) / 2
    full = activation_bytes(work, micro_batch=micro_batch, tp=tp, sp=sp, recompute="none",
                            scores_kept=scores_kept, fused=fused, fp8=fp8,
                            routed_load=routed_load, etp=etp,
                            probs_in_activation=probs_in_activation, fp8_experts=fp8_experts)
    if recompute == "op":  # the recomputed rest, next to what was kept
        rest = full - activation_bytes(work, micro_batch=micro_batch, tp=tp, sp=sp,
                                       recompute="op")
        return (rest + abs(rest)) / 2  # not below zero (works on arrays of blocks too)
    return full


def megatron_layer_activation_bytes(*, s: int, b: int, h: int, a: int, t: int = 1,
                                    sp: bool = False, recompute: str = "none") -> float:
    """Korthikanti et al. (2022), Table 2: activation bytes of one GPT layer (16-bit activations)."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    attn = 5 * a * s / h
    if recompute == "selective":
        attn = 0.0
    if sp:
        return s * b * h / t * (34 + attn)
    return s * b * h * (10 + 24 / t + attn / t)
