"""The legal configurations and the rules that prune them, for every search.

A configuration picks dp x cp x tp x pp GPUs (tp inside a node, dividing every head count and split
feature size; cp splitting each sequence into 2 cp chunks), for models with routed experts an
expert-parallel degree ep and an expert tensor-parallel degree etp folded over the tp x cp x dp
ranks, a micro-batch size dividing the per-replica batch, a schedule, recomputation, ZeRO
stage, sequence parallelism and a placement order. On one device type dp x tp x pp is the cluster;
on a cluster of device groups every pipeline stage spans tp x dp GPUs of one group, so tp x dp
divides each group's GPUs and pp is the number of such slots (``Space.group_gpus``).

Each rule that rejects a point names a reason, one of the constants below, which the search counts
and reports ("412 candidates: 380 out of memory, 32 tp > gpus per node"). The same rule functions
serve the search (both kinds of cluster), the leanest-plan account of an infeasible search
(planner.search.feasibility) and the why-not answers (planner.explore.whynot).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterator

from costmodels.memory import modules_of
from planner.errors import SpecError
from planner.options import (MAX_MICROBATCHES, Config, SearchOptions, TrainingSpec,
                             zb_split_lost, zero_runs_with_cp)

TP_GPUS = "tp does not divide gpus"
TP_NODE = "tp > gpus per node"
TP_NODE_SPLIT = "tp does not divide gpus per node (or, across nodes, is no multiple of them)"
TP_MODEL = "tp does not divide heads or hidden sizes"
TP_INNER = "tp through per-head weights not run by the target"
TP_CLASS = "tp over modules other than unfused nn.Linear and nn.Embedding not run by the target"
TP_NOTHING = "tp splits no module of this model (searched only where pinned)"
MESH = "dp x cp x tp x pp != gpus"
GROUP_WIDTH = "tp x dp does not divide every group's GPUs"
PP_BLOCKS = "pp > blocks"
BATCH_DP = "global batch not divisible by dp"
MICRO_BATCH = "micro batch does not divide the per-replica batch"
SP_TP = "sequence parallel needs tp > 1"
VPP_SHAPE = "interleaved needs pp > 1 and vpp > 1"
VPP_ROUNDS = "interleaved needs micro-batches divisible by pp"
VPP_SCHEDULE = "vpp > 1 needs the interleaved-1f1b schedule"
ZB_RECOMPUTE = "zb-h1 with recomputation not run by the target (W inside B)"
VPP_BLOCKS = "pp x vpp > blocks"
OFFLOAD_ZERO = "offload needs ZeRO >= 1"
OFFLOAD_HOST = "offload on a device that is the host (cpu)"
ZERO_PP = "ZeRO stage not run with pipelines by the target"
ZERO3_CP_EP = "ZeRO-3 with both cp and ep not run by the target"
ZERO_CP = "ZeRO stage not run with cp by the target"
ZERO0_ALONE = "ZeRO-0 with other parallelism not run by the target"
MB_MEMORY = "micro-batch activations alone exceed memory"
CP_SEQ = ("sequence not divisible into 2 x cp chunks (into cp chunks where the target does not "
          "balance causal attention)")
CP_SHORT = "fewer tokens per cp rank than the search's minimum (cp_min_tokens)"
CP_HEADS = "cp all-to-all needs heads divisible by tp x cp"
CP_LEVELS = "cp a2a+p2p needs cp ranks both inside a node and across nodes"
CP_NONE = "cp needs attention"
CP_TARGET = "cp not run by the target"
CP_WINDOW = "cp_comm not run by the target over sliding windows"
CP_WINDOW_NONE = "cp not run by the target over sliding windows"
CP_SINKS = "cp_comm not run by the target with attention sinks"
CP_SINKS_NONE = "cp not run by the target with attention sinks"
CP_LATENT = "cp_comm not run by the target with latent attention (keys wider than values)"
CP_LATENT_NONE = "cp not run by the target with latent attention (keys wider than values)"
CP_ALONE = "cp with tp or pp not run by the target"
TP_PP = "tp with pp not run by the target"
EP_EXPERTS = "ep does not divide the experts"
EP_GROUP = "ep x etp does not divide tp x cp x dp"
EP_NONE = "ep needs routed experts"
ETP_TP = "etp is neither 1 nor tp"
ETP_BIAS = "etp > 1 over experts with biases not run by the target"
MOE_SP = "experts with tp > 1 need sequence parallelism"
MOE_ACT_NONE = "recompute moe_act needs routed experts"
MLA_UP_NONE = "recompute mla_up_proj needs latent attention"
OP_EP = ("recompute op with ep > 1 replays the all-to-alls in the target's model "
         "(not priced)")
SP_SEQ = "sequence parallel needs the tokens of a cp rank divisible by tp"
SEQ_TP_2CP = "sequence not divisible by tp x 2 x cp, as the target requires"
AMP_UNSHARDED = "tp or pp without sharding over dp x cp runs in fp32 in the target"
ETP_NO_EP = "etp 1 with ep = 1 and tp > 1 not run by the target (it splits experts over tp)"
EP_UNSHARDED = "ep > 1 without sharding over dp x cp not run by the target"
EP_TP = "ep > 1 with tp > 1 not run by the target with these engine settings (DeepEP)"
TOO_MANY_MB = f"more than {MAX_MICROBATCHES:,} micro-batches per step"


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def attention_forms(blocks) -> tuple[str, ...]:
    """The forms of attention in ``blocks`` (a BlockGraph) that decide which context-parallel
    exchanges an engine runs over them: ``latent`` (keys wider than values: multi-head latent
    attention), ``sinks`` (weights inside the scores: gpt-oss's sinks), ``sliding_window``."""
    found = (("latent", any(b.work.attn_keys_wider for b in blocks.blocks)),
             ("sinks", any(b.work.attn_score_params for b in blocks.blocks)),
             ("sliding_window", any(b.work.attn_window_cut > 0 or any(
                 g.masked > 0.5 for g in b.work.gemms) for b in blocks.blocks)))
    return tuple(name for name, has in found if has)


def kv_heads(blocks) -> int:
    """The fewest key/value heads of any attention in ``blocks`` (a BlockGraph); 0 without
    attention."""
    return min((int(b.work.attn_heads_kv) for b in blocks.blocks if b.work.attn_heads_kv),
               default=0)


@dataclass(frozen=True, kw_only=True)
class Space:
    """What the rules need to know about the cluster and the model."""

    num_gpus: int
    """GPUs the configuration spreads over (with device groups: the largest number dividing every
    group's GPUs, the widest a stage may be)."""
    gpus_per_node: int
    """GPUs a tensor-parallel group may span (with device groups: the largest number dividing
    every group's GPUs per node)."""
    num_blocks: int
    """Blocks of the model: at most one pipeline stage (chunk) each."""
    tp_divisors: tuple[int, ...] = ()
    """Sizes a tensor-parallel degree must divide (heads, split feature sizes)."""
    group_gpus: tuple[int, ...] = ()
    """GPUs of each device group; empty on a cluster of one device type."""
    experts: int = 0
    """Routed experts per MoE layer (0: a dense model); ep must divide it."""
    heads: tuple[int, int] = (0, 0)
    """The fewest query and key/value heads of any attention (0: no attention)."""
    windowed: bool = False
    """Whether some attention runs under a sliding window (BlockWork.attn_window_cut, or an eager
    core's Gemm.masked beyond the causal half)."""
    sinks: bool = False
    """Whether some attention has parameters joined to its scores (BlockWork.attn_score_params:
    gpt-oss's sinks)."""
    latent: bool = False
    """Whether some attention's keys are wider than its values (multi-head latent attention)."""
    causal: bool = True
    """Whether some attention is causal (False: a vision or encoder model's attends both ways,
    which the causal load balancing of context parallelism is not for)."""
    image: bool = False
    """Whether a sample's tokens are an image's patches (their number set by the model's
    image_size and patch_size, not by --seq-len), as the caller holding the trace says."""
    etp_one_only: bool = False
    """Whether the target splits no expert matrices for this model: its experts carry biases
    (BlockWork.expert_bias) and the target refuses that with etp > 1
    (SearchOptions.etp_with_expert_bias)."""
    tp_one_only: bool = False
    """Whether the target runs no tensor parallelism for this model: a block keeps weights inside
    a tensor-parallel region (Block.tp_inner_weights) and the target does not split such regions
    (SearchOptions.tp_inner_weights)."""
    tp_unsplit: str = ""
    """A module the target cannot split by tensor parallelism, as ``fqn (Class)``, where it
    splits torch.nn.Linear and torch.nn.Embedding only (SearchOptions.tp_other_modules) and the
    model's split modules include others (BlockGraph.tp_other_modules); '' otherwise."""
    tp_nothing: bool = False
    """Whether tensor parallelism splits no module of the model (BlockGraph.tp_roles has no
    column, row or vocabulary split: convolutions, recurrent layers): tp > 1 would only
    replicate the work, so the search tries it only where a pin asks."""
    host: bool = False
    """Whether the device is the host CPU (the cpu cluster): its processes step the optimizer in
    host memory already, so there is nothing to offload it to."""

    @classmethod
    def of(cls, cluster, blocks, options: SearchOptions | None = None, *,
           image: bool = False) -> "Space":
        """The space of ``blocks`` (a BlockGraph) on ``cluster`` (Cluster or HeteroCluster), for
        the target of ``options`` (None: any); ``image``: the trace found a sample's tokens to be
        an image's patches (Prepared.info's image_tokens)."""
        divs = tuple(sorted({d for b in blocks.blocks for d in b.tp_divisors}))
        experts = {int(b.work.num_experts) for b in blocks.blocks if b.work.num_experts}
        unsplit = blocks.tp_other_modules if options is not None and \
            not options.tp_other_modules else {}
        forms = attention_forms(blocks)
        model = dict(experts=math.gcd(*experts) if experts else 0, image=image,
                     sinks="sinks" in forms, latent="latent" in forms,
                     windowed="sliding_window" in forms,
                     causal=any(b.work.attn_causal_flops > 0 for b in blocks.blocks) or not any(
                         b.work.attn_heads_q for b in blocks.blocks),
                     etp_one_only=(options is not None and not options.etp_with_expert_bias
                                   and any(b.work.expert_bias for b in blocks.blocks)),
                     tp_one_only=(options is not None and not options.tp_inner_weights
                                  and any(b.tp_inner_weights for b in blocks.blocks)),
                     tp_unsplit=next((f"{m} ({c})" for m, c in unsplit.items()), ""),
                     tp_nothing=not any(r in ("colwise", "rowwise", "vocab")
                                        for r in blocks.tp_roles.values()),
                     heads=tuple(min((int(getattr(b.work, f)) for b in blocks.blocks
                                      if getattr(b.work, f)), default=0)
                                 for f in ("attn_heads_q", "attn_heads_kv")))
        groups = getattr(cluster, "groups", None)
        if groups:
            return cls(num_gpus=math.gcd(*(g.num_gpus for g in groups)),
                       gpus_per_node=math.gcd(*(g.gpus_per_node for g in groups)),
                       num_blocks=len(blocks.blocks), tp_divisors=divs,
                       group_gpus=tuple(g.num_gpus for g in groups), **model)
        return cls(num_gpus=cluster.num_gpus, gpus_per_node=cluster.gpus_per_node,
                   num_blocks=len(blocks.blocks), tp_divisors=divs,
                   host=cluster.device.is_host, **model)


@dataclass(frozen=True)
class CostKey:
    """The knobs per-block costs depend on (the rest only changes the split and the totals)."""

    tp: int
    sp: bool
    recompute: str
    micro_batch: int
    cp: int = 1
    cp_comm: str | tuple[str, ...] = "p2p"
    """The K/V exchange form, or the forms the pricing chooses the fastest of."""
    ep: int = 1
    etp: int = 1

    @classmethod
    def of(cls, cfg: Config) -> "CostKey":
        return cls(tp=cfg.tp, sp=cfg.sequence_parallel, recompute=cfg.recompute,
                   micro_batch=cfg.micro_batch, cp=cfg.cp, cp_comm=cfg.cp_comm, ep=cfg.ep,
                   etp=cfg.etp)


@dataclass(frozen=True)
class Group:
    """Configurations that share a CostKey, a mesh and a micro-batch count: they differ only in
    their ``variants``, (schedule, vpp, ZeRO stage, offload) each. A search screens most of them
    without making a Config (``config`` makes one)."""

    key: CostKey
    dp: int
    pp: int
    num_microbatches: int
    variants: tuple[tuple[str, int, int, bool], ...]

    def config(self, variant: tuple[str, int, int, bool], cp_comm: str | None = None) -> Config:
        """The configuration of ``variant``, with the K/V exchange ``cp_comm`` (default: the
        first form the key allows)."""
        k = self.key
        schedule, vpp, zero, offload = variant
        return Config(dp=self.dp, tp=k.tp, pp=self.pp, micro_batch=k.micro_batch,
                      num_microbatches=self.num_microbatches, schedule=schedule,
                      recompute=k.recompute, zero=zero, sequence_parallel=k.sp, vpp=vpp,
                      offload_optimizer=offload, cp=k.cp,
                      cp_comm=cp_comm or (k.cp_comm if isinstance(k.cp_comm, str)
                                          else k.cp_comm[0]),
                      ep=k.ep, etp=k.etp)

    def configs(self) -> list[Config]:
        return [self.config(v) for v in self.variants]


# ---- rules ---------------------------------------------------------------------------------------

def tp_reasons(tp: int, space: Space, pinned: bool = False) -> list[str]:
    """Every rule a tensor-parallel degree breaks, in the order the search checks them. The search
    keeps tensor parallelism inside a node; a pinned degree may span whole nodes (its all-reduces
    then priced on the inter-node link), except across device groups."""
    out = []
    if space.num_gpus % tp:
        out.append(TP_GPUS)
    across = tp > space.gpus_per_node
    if across and not (pinned and not space.group_gpus):
        out.append(TP_NODE)
    if (space.gpus_per_node % tp if not across else tp % space.gpus_per_node if pinned else 0):
        out.append(TP_NODE_SPLIT)
    if any(d % tp for d in space.tp_divisors):
        out.append(TP_MODEL)
    if tp > 1 and space.tp_one_only:
        out.append(TP_INNER)
    if tp > 1 and space.tp_unsplit:
        out.append(TP_CLASS)
    if tp > 1 and space.tp_nothing and not pinned:
        out.append(TP_NOTHING)
    return out


def tp_pinned(tp: int, fix: dict) -> bool:
    """Whether ``fix`` asks for tensor-parallel degree ``tp``: pinned, or as the experts' (etp,
    which is 1 or tp)."""
    return "tp" in fix or (tp > 1 and fix.get("etp") == tp)


def tp_reason(tp: int, space: Space, pinned: bool = False) -> str:
    """The first rule ``tp`` breaks, or '' when it is legal."""
    reasons = tp_reasons(tp, space, pinned)
    return reasons[0] if reasons else ""


def cp_reason(cp: int, space: Space, training: TrainingSpec, options: SearchOptions,
              pinned: bool = False) -> str:
    """The first rule a context-parallel degree breaks, or ''."""
    if cp == 1:
        return ""
    if not space.heads[0]:
        return CP_NONE
    if not options.cp_comms:
        return CP_TARGET
    if space.windowed and not set(options.cp_comms) & set(options.cp_comms_windowed):
        return CP_WINDOW_NONE
    if space.sinks and not set(options.cp_comms) & set(options.cp_comms_sinks):
        return CP_SINKS_NONE
    if space.latent and not set(options.cp_comms) & set(options.cp_comms_latent):
        return CP_LATENT_NONE
    if training.seq_len % cp_chunks(cp, options):
        return CP_SEQ
    if not pinned and training.seq_len // cp < options.cp_min_tokens:
        return CP_SHORT
    return ""


def cp_chunks(cp: int, options: SearchOptions | None) -> int:
    """Chunks each sequence is cut into under context parallelism (SearchOptions.cp_load_balanced):
    2 x cp, or cp where the target does not balance causal attention by reordering."""
    return 2 * cp if options is None or options.cp_load_balanced else cp


def cp_comm_reason(form: str, tp: int, cp: int, space: Space,
                   options: SearchOptions | None = None) -> str:
    """'' when the exchange ``form`` can split the heads it needs to (all-to-all forms) and the
    target runs it over the model's sliding windows and attention sinks, if any."""
    if space.windowed and options is not None and form not in options.cp_comms_windowed:
        return CP_WINDOW
    if space.sinks and options is not None and form not in options.cp_comms_sinks:
        return CP_SINKS
    if space.latent and options is not None and form not in options.cp_comms_latent:
        return CP_LATENT
    if form in ("a2a", "a2a+p2p"):
        width = cp if form == "a2a" else math.gcd(cp, max(1, space.gpus_per_node // tp))
        if form == "a2a+p2p" and width in (1, cp):  # one level only: p2p's ring, or a2a
            return CP_LEVELS
        q, kv = space.heads
        copies = (form == "a2a" and options is not None and options.cp_kv_copies
                  and kv and (tp * width) % kv == 0)  # (a2a: DeepSpeed's head copies)
        if (q and q % (tp * width)) or (kv and kv % (tp * width) and not copies):
            return CP_HEADS
    return ""


def ep_reasons(ep: int, etp: int, tp: int, cp: int, dp: int, space: Space) -> list[str]:
    """Every rule an (ep, etp) pair breaks."""
    out = []
    if (ep > 1 or etp > 1) and not space.experts:
        return [EP_NONE]
    if space.experts and space.experts % ep:
        out.append(EP_EXPERTS)
    if etp not in (1, tp):
        out.append(ETP_TP)
    if etp > 1 and space.etp_one_only:
        out.append(ETP_BIAS)
    if (tp * cp * dp) % (ep * etp):
        out.append(EP_GROUP)
    return out


def pp_reason(pp: int, vpp: int, space: Space) -> str:
    """'' when ``pp x vpp`` stages can each take at least one block."""
    if pp > space.num_blocks:
        return PP_BLOCKS
    if pp * vpp > space.num_blocks:
        return VPP_BLOCKS
    return ""


# ---- the enumeration -----------------------------------------------------------------------------

def enumerate_space(space: Space, training: TrainingSpec, options: SearchOptions,
                    rejected: Counter,
                    mb_fits: Callable[[int, int, int, int], bool] | None = None
                    ) -> Iterator[Group]:
    """Configurations in Groups (one CostKey and mesh each; a CostKey recurs for every pp and dp);
    rejected points are counted in ``rejected``.
    ``mb_fits(tp, pp, micro_batch, micro_batches)``: False when that micro-batch cannot fit in
    memory (a bound from the activations alone); such micro-batches are not enumerated, so how
    many divisors the batch has no longer decides how long the search takes."""
    fix = dict(options.fix)
    if fix.get("vpp", 1) > 1 and fix.get("schedule", "interleaved-1f1b") != "interleaved-1f1b":
        raise SpecError(f"fix.vpp: vpp={fix['vpp']} needs schedule=interleaved-1f1b, not "
                        f"{fix['schedule']}")
    if space.group_gpus:
        meshes = ((tp, 1, pp, dp) for tp, pp, dp in _group_meshes(space, fix, training, options,
                                                                   rejected))
    else:
        meshes = _meshes(space, fix, training, options, rejected)
    for tp, cp, pp, dp in meshes:
        fits = mb_fits if "micro_batch" not in fix else None
        for ep, etp in _experts(fix, tp, cp, dp, space, options, rejected):
            yield from _inner(fix, tp, pp, dp, training.global_batch, options, rejected, space,
                              fits, cp=cp, ep=ep, etp=etp, seq_len=training.seq_len)


def _meshes(space: Space, fix: dict, training: TrainingSpec, options: SearchOptions,
            rejected: Counter):
    """(tp, cp, pp, dp) with dp x cp x tp x pp = the cluster's GPUs."""
    n, gb = space.num_gpus, training.global_batch
    for tp in _choices(fix, "tp", divisors(n)):
        reason = tp_reason(tp, space, pinned=tp_pinned(tp, fix))
        if reason:
            rejected[reason] += 1
            continue
        for cp in _choices(fix, "cp", divisors(n // tp)):
            reason = (MESH if (n // tp) % cp else
                      cp_reason(cp, space, training, options, pinned="cp" in fix))
            if reason:
                rejected[reason] += 1
                continue
            for pp in _choices(fix, "pp", divisors(n // (tp * cp))):
                dp = n // (tp * cp * pp)
                reason = (MESH if (n // (tp * cp)) % pp else pp_reason(pp, 1, space) or (
                    MESH if fix.get("dp", dp) != dp else BATCH_DP if gb % dp else "") or (
                    CP_ALONE if cp > 1 and (tp > 1 or pp > 1) and not options.cp_with_tp_pp
                    else "") or target_mesh_reason(tp, cp, pp, dp, training, options))
                if reason:
                    rejected[reason] += 1
                    continue
                yield tp, cp, pp, dp


def target_mesh_reason(tp: int, cp: int, pp: int, dp: int, training: TrainingSpec,
                        options: SearchOptions) -> str:
    """The first of the target's own rules a mesh breaks, or '' (SearchOptions.tp_with_pp,
    seq_split_2cp_tp, mixed_precision_needs_sharding)."""
    if tp > 1 and pp > 1 and not options.tp_with_pp:
        return TP_PP
    if options.seq_split_2cp_tp and training.seq_len % (tp * 2 * cp):
        return SEQ_TP_2CP
    if options.mixed_precision_needs_sharding and dp * cp == 1 and (tp > 1 or pp > 1) and \
            training.dtype != "fp32":
        return AMP_UNSHARDED
    return ""


def _experts(fix: dict, tp: int, cp: int, dp: int, space: Space, options: SearchOptions,
             rejected: Counter):
    """(ep, etp) pairs: ep dividing the experts, etp 1 or tp, ep x etp folded into tp x cp x dp."""
    if not space.experts:
        if fix.get("ep", 1) > 1 or fix.get("etp", 1) > 1:
            rejected[EP_NONE] += 1
            return
        yield 1, 1
        return
    split = options.expert_tensor_parallel and not space.etp_one_only
    for etp in _choices(fix, "etp", sorted({1, tp}) if split else [1]):
        for ep in _choices(fix, "ep", divisors(tp * cp * dp) if options.expert_parallel else [1]):
            reasons = ep_reasons(ep, etp, tp, cp, dp, space)
            if options.experts_split_without_ep and ep == 1 and etp != tp:
                reasons.append(ETP_NO_EP)
            if options.ep_needs_sharding and ep > 1 and dp * cp == 1:
                reasons.append(EP_UNSHARDED)
            if not options.ep_with_tp and ep > 1 and tp > 1:
                reasons.append(EP_TP)
            if reasons:
                rejected[reasons[0]] += 1
                continue
            yield ep, etp


def _group_meshes(space: Space, fix: dict, training: TrainingSpec, options: SearchOptions,
                  rejected: Counter):
    """(tp, pp, dp) with stages of tp x dp GPUs filling every device group: pp = sum of the
    groups' GPUs / (tp x dp)."""
    gb = training.global_batch
    for tp in _choices(fix, "tp", divisors(space.num_gpus)):
        reason = tp_reason(tp, space)
        if reason:
            rejected[reason] += 1
            continue
        for dp in _choices(fix, "dp", divisors(space.num_gpus // tp)):
            width = tp * dp
            pp = sum(g // width for g in space.group_gpus)
            reason = (GROUP_WIDTH if any(g % width for g in space.group_gpus) else
                      MESH if fix.get("pp", pp) != pp else
                      pp_reason(pp, 1, space) or (BATCH_DP if gb % dp else "")
                      or target_mesh_reason(tp, 1, pp, dp, training, options))
            if reason:
                rejected[reason] += 1
                continue
            yield tp, pp, dp


def _inner(fix, tp, pp, dp, gb, options, rejected, space, mb_fits=None, *, cp=1, ep=1, etp=1,
           seq_len=0):
    states = _zero_offload(fix, dp * cp, pp, options, rejected, host=space.host)
    if not options.zero0_with_others and dp * cp > 1 and max(tp, pp, cp, ep) > 1 and states:
        kept = [(z, o) for z, o in states if z != 0]
        if not kept:
            rejected[ZERO0_ALONE] += 1
        states = kept
    if cp > 1 and states:
        kept = [(z, o) for z, o in states if zero_runs_with_cp(options, z, ep=ep)]
        if not kept:
            rejected[ZERO_CP if all(z not in options.zero_with_cp for z, _ in states)
                     else ZERO3_CP_EP] += 1
        states = kept
    schedules = _choices(fix, "schedule", list(options.schedules) if pp > 1 else ["1f1b"])
    comms: tuple[str, ...] = ("p2p",)  # cp = 1: no exchange (a pinned form applies to cp > 1)
    if cp > 1:  # the exchange forms allowed; the pricing takes the fastest (CostKey.cp_comm)
        allowed = []
        for form in _choices(fix, "cp_comm", list(options.cp_comms)):
            reason = cp_comm_reason(form, tp, cp, space, options)
            if reason:
                rejected[reason] += 1
            else:
                allowed.append(form)
        if not allowed:
            return
        comms = tuple(allowed)
    for mb in _choices(fix, "micro_batch", divisors(gb // dp)):
        if (gb // dp) % mb:
            rejected[MICRO_BATCH] += 1
            continue
        m = gb // (dp * mb)
        if m > MAX_MICROBATCHES:
            rejected[TOO_MANY_MB] += 1
            continue
        if mb_fits is not None and not mb_fits(tp, pp, mb, m, cp):
            rejected[MB_MEMORY] += 1
            continue
        # (schedules run -> the variants and the rules their chunk counts broke: the same for
        # every sp and recomputation that runs those schedules, counted each time as before)
        variants_of: dict[tuple, tuple] = {}
        for sp in _choices(fix, "sequence_parallel",
                           list(options.sequence_parallel) if tp > 1 else [False]):
            if sp and tp == 1:
                rejected[SP_TP] += 1
                continue
            if sp and seq_len % (tp * cp):
                rejected[SP_SEQ] += 1
                continue
            if space.experts and tp > 1 and not sp:
                rejected[MOE_SP] += 1
                continue
            for rc in _choices(fix, "recompute", list(options.recompute)):
                if "moe_act" in modules_of(rc) and not space.experts:
                    rejected[MOE_ACT_NONE] += 1
                    continue
                if "mla_up_proj" in modules_of(rc) and not space.latent:
                    rejected[MLA_UP_NONE] += 1
                    continue
                if rc == "op" and ep > 1 and not options.op_recompute_with_ep:
                    rejected[OP_EP] += 1
                    continue
                runs = [s for s in schedules if not zb_split_lost(options, s, rc, pp)]
                if len(runs) < len(schedules):
                    rejected[ZB_RECOMPUTE] += 1
                if tuple(runs) not in variants_of:
                    broken: Counter = Counter()
                    variants_of[tuple(runs)] = (tuple(
                        (s, v, z, o) for s in runs
                        for v in _vpps(fix, s, pp, m, options, broken, space)
                        for z, o in states), broken)
                variants, broken = variants_of[tuple(runs)]
                rejected.update(broken)
                if variants:
                    yield Group(key=CostKey(tp=tp, sp=sp, recompute=rc, micro_batch=mb, cp=cp,
                                            cp_comm=comms, ep=ep, etp=etp),
                                dp=dp, pp=pp, num_microbatches=m, variants=variants)


def _vpps(fix: dict, schedule: str, pp: int, m: int, options: SearchOptions,
          rejected: Counter, space: Space) -> list[int]:
    """Chunks per rank: 1 unless interleaved, whose micro-batches must fill whole rounds of pp
    (Megatron-LM's requirement) and whose chunks need at least one block each."""
    if schedule != "interleaved-1f1b":
        if fix.get("vpp", 1) > 1:
            rejected[VPP_SCHEDULE] += 1
            return []
        return [1]
    out = []
    for v in _choices(fix, "vpp", list(options.vpp)):
        reason = (VPP_SHAPE if v < 2 or pp < 2 else VPP_ROUNDS if m % pp else
                  pp_reason(pp, v, space))
        if reason:
            rejected[reason] += 1
        else:
            out.append(v)
    return out


def _zero_offload(fix: dict, dp: int, pp: int, options: SearchOptions,
                  rejected: Counter, *, host: bool = False) -> list[tuple]:
    """(ZeRO stage, offload) pairs; offloading the optimizer needs its states sharded (ZeRO >= 1),
    as in DeepSpeed. Without data parallelism sharding changes nothing, so ZeRO 0 stands for
    every stage, except that ZeRO 1 with offload is the single-GPU ZeRO-Offload (Ren et al.,
    USENIX ATC'21, train 13B parameters on one V100). With a pipeline, the stages the target
    engine runs with one. On the ``host`` (the cpu cluster) nothing is offloaded."""
    allowed = [z for z in options.zero if pp == 1 or z in options.zero_with_pp]
    zeros = _choices(fix, "zero", allowed if dp > 1 else [0] + [1] * (1 in allowed))
    if pp > 1 and dp > 1 and "zero" in fix and fix["zero"] not in options.zero_with_pp:
        rejected[ZERO_PP] += 1
        return []
    offloads = _choices(fix, "offload_optimizer", list(options.offload))
    if host and True in offloads:
        offloads = [o for o in offloads if not o]
        if not offloads:
            rejected[OFFLOAD_HOST] += 1
            return []
    pairs = [(z, o) for z in zeros for o in offloads
             if not (o and z == 0) and not (dp == 1 and z >= 1 and not o and "zero" not in fix)]
    if not pairs:
        rejected[OFFLOAD_ZERO] += 1
    return pairs


def _choices(fix: dict, key: str, default: list) -> list:
    return [fix[key]] if key in fix else default
