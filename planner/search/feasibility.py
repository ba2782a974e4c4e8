"""When nothing fits: a pin that no configuration can honour (bad input, named), or the leanest
configuration with the pins the user gave, its memory per stage, and what would make it fit."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Callable

from costmodels import pipeline
from costmodels.memory import every_words, layer_interval, modules_of
from costmodels.topology import Cluster, HeteroCluster
from planner.errors import PlannerError, SpecError
from planner.options import (CP_COMMS, MAX_MICROBATCHES, PP_INNER, Config, SearchOptions,
                             TrainingSpec, fix_text, pp_inner_refused, zero_runs_with_cp)
from planner.search.costs import ModelArrays, block_costs, block_state_bytes, capacity_bytes
from planner.search.loop import OUTCOMES, rejection_lines
from planner.search.pricing import Estimate, price
from planner.search.space import (BATCH_DP, CP_HEADS, CP_LATENT_NONE, CP_LEVELS, CP_SEQ,
                                  CP_SHORT, CP_SINKS_NONE, CP_WINDOW_NONE, MICRO_BATCH,
                                  PP_BLOCKS, SEQ_TP_2CP, SP_SEQ, TOO_MANY_MB, TP_CLASS, TP_GPUS,
                                  TP_INNER, TP_MODEL, TP_NODE, Space,
                                  cp_chunks, cp_comm_reason, cp_reason, divisors, ep_reasons,
                                  pp_reason, target_mesh_reason, tp_pinned, tp_reasons)
from planner.solve.chain import partition
from planner.trace.graph import BlockGraph
from planner.units import gb


def pin_problem(fix: dict, space: Space, training: TrainingSpec,
                options: SearchOptions | None = None) -> str:
    """'' or one line naming a pinned knob no configuration can honour, the rule, the numbers
    and the fix; ``options`` (the target's) adds the exchange forms the target runs."""
    n, gpn, batch = space.num_gpus, space.gpus_per_node, training.global_batch
    whose = gpus_words(space)
    tp, pp = fix.get("tp"), fix.get("pp")
    if tp is not None:
        broken = tp_reasons(tp, space, pinned=True)
        # (the degrees named are those every rule takes: a new-user check was offered tp=16 on
        # groups of 8-GPU nodes, which tp's node rule then refused)
        allowed = [d for d in divisors(n) if not tp_reasons(d, space, pinned=True)]
        if TP_GPUS in broken:
            how = "is more than" if tp > n else "does not divide"
            return (f"fix.tp: {tp} {how} {whose.format(n=n)}; use one of "
                    f"{_some(allowed or divisors(n))}")
        if TP_MODEL in broken:
            fits = allowed
            return (f"fix.tp: {tp} does not divide the model's heads and split sizes "
                    f"({', '.join(map(str, space.tp_divisors))}); use one of {_some(fits)}")
        if TP_INNER in broken:
            return (f"fix.tp: {tp} would split attention that keeps weights of its own (per-head "
                    "norms or attention sinks), which the target does not run; pin tp=1 or "
                    "plan for another --target")
        if TP_CLASS in broken:
            return (f"fix.tp: {tp} would split {space.tp_unsplit}, and the target splits "
                    "unfused nn.Linear and nn.Embedding only; pin tp=1 or plan for another "
                    "--target")
        if TP_NODE in broken:
            return (f"fix.tp: {tp} spans nodes of {gpn} GPUs; across device groups tensor "
                    "parallelism stays inside a node")
        if broken:
            return (f"fix.tp: {tp} must divide the {gpn} GPUs of a node, or be a multiple of "
                    "them to span whole nodes")
        if space.experts and tp > 1 and options and True not in options.sequence_parallel:
            return (f"fix.tp: routed experts with tp={tp} need sequence parallelism (each tp rank "
                    "routes its 1/tp of the tokens), which the target does not run; pin tp=1 "
                    "(ep shards the experts) or plan for another --target")
    if space.group_gpus and pp is not None:  # stages of one width filling every group
        dp = fix.get("dp")  # (a pinned tp or dp fixes the width's factors)
        widths = [w for w in divisors(n) if (tp is None or w % tp == 0) and
                  (dp is None or w % dp == 0) and (None in (tp, dp) or w == tp * dp)]
        depths = sorted({sum(g // w for g in space.group_gpus) for w in widths})
        if depths and pp not in depths:  # (offered: the depths the model's blocks allow)
            depths = [d for d in depths if not pp_reason(d, fix.get("vpp", 1), space)] or depths
            sizes = " + ".join(map(str, space.group_gpus))
            with_pins = ", ".join(f"{k}={v}" for k, v in (("tp", tp), ("dp", dp)) if v)
            return (f"fix.pp: {pp} {'stage does' if pp == 1 else 'stages do'} not fill the "
                    f"groups (every stage is tp x dp GPUs of one group, of one width in all: "
                    f"{sizes} GPUs){' with ' + with_pins if with_pins else ''}; use one of "
                    f"{_some(depths)}")
    problem = cluster_pin_problem({k: v for k, v in fix.items() if k != "pp"}
                                  if space.group_gpus else fix, n, batch, whose)
    if problem:
        return problem
    if fix.get("offload_optimizer") and space.host:
        return ("fix.offload_optimizer: the cpu cluster's processes step the optimizer in host "
                "memory already; drop offload_optimizer")
    cp = fix.get("cp", 1)
    if cp > 1 and not space.heads[0]:
        return ("fix.cp: the model has no attention (context parallelism splits attention's "
                "sequence); drop cp")
    problem = sequence_pin_problem(fix, training.seq_len, n, options, image=space.image,
                                   causal=space.causal)
    if problem:
        return problem
    seq = training.seq_len
    if options is not None and options.seq_split_2cp_tp and ("tp" in fix or "cp" in fix) and \
            seq % (2 * cp * (tp or 1)):
        key = "tp" if "tp" in fix and ("cp" not in fix or seq % (2 * cp) == 0) else "cp"
        if seq % 2:
            return (f"fix.{key}: the target needs the sequence length ({seq}) divisible by tp x 2 "
                    "x cp, which an odd length never is; use an even sequence length")
        need = 2 * cp * (tp or 1)
        fits = [t for t in divisors(gpn) if seq % (2 * cp * t) == 0
                and not tp_reasons(t, space, pinned=True)] if key == "tp" else []
        return (f"fix.{key}: the target needs the sequence length ({seq}) divisible by tp x 2 x "
                f"cp = {need}; " + (f"use tp={' or '.join(map(str, fits))}, or " if fits else "")
                + f"a sequence length divisible by {need}")
    ep, etp = fix.get("ep", 1), fix.get("etp", 1)
    if (ep > 1 or etp > 1) and not space.experts:
        key = "ep" if ep > 1 else "etp"
        return (f"fix.{key}: the model has no routed experts the trace recognizes (a grouped "
                "GEMM of routed tokens by stacked [experts, in, out] weights, torch._grouped_mm "
                "with offs=, as transformers' MoE layers run it, or a bmm of [experts, capacity, "
                "in] token slots by such weights beside a router's topk/argmax over the experts; "
                f"README: ep); drop {key}")
    problem = recompute_pin_problem(fix, space.experts, space.latent)
    if problem:
        return problem
    if space.experts and tp is not None and tp > 1 and fix.get("sequence_parallel") is False:
        sp = options is None or True in options.sequence_parallel  # the target can run it
        return (f"fix.sequence_parallel: false with tp={tp}, but a model with routed experts runs "
                "tensor parallelism sequence-parallel (as Megatron-Core requires); pin "
                + ("sequence_parallel=true or tp=1" if sp else "tp=1 (the target runs no "
                   "sequence parallelism)"))
    if space.experts and tp is None and etp > 1 and fix.get("sequence_parallel") is False:
        sp = options is None or True in options.sequence_parallel  # the target can run it
        return (f"fix.sequence_parallel: false with etp={etp}, which needs tp={etp} (etp is 1 or "
                "tp), and a model with routed experts runs tensor parallelism sequence-parallel "
                "(as Megatron-Core requires); pin "
                + ("sequence_parallel=true or etp=1" if sp else "etp=1 (the target runs no "
                   "sequence parallelism)"))
    problem = experts_pin_problem(fix, space.experts, n)
    if problem:
        return problem
    if etp > 1 and tp is not None and etp != tp:
        other = "" if tp_reasons(etp, space, pinned=True) else f" (or tp={etp} instead)"
        return (f"fix.etp: {etp} must be 1 or tp ({tp}); pin etp=1"
                + (f" or etp={tp}" if tp > 1 else "") + other)
    etp_broken = tp_reasons(etp, space, pinned=True) if etp > 1 and tp is None else []
    if etp_broken:
        return (f"fix.etp: {etp} must be 1 or tp, and tp={etp} breaks a rule here "
                f"({etp_broken[0]}); pin etp=1 or a tp the model and cluster allow")
    if etp > gpn and tp is None:
        return (f"fix.etp: {etp} must be 1 or tp, and the search keeps tp within a node of "
                f"{gpn} GPUs; pin tp={etp} too, or a smaller etp")
    stage = n // pp if pp is not None and n % pp == 0 else None  # tp x cp x dp of one stage
    if stage is not None and stage % (ep * etp) and n % (ep * etp) == 0:
        fits = [e for e in divisors(space.experts or 1) if stage % (e * etp) == 0]
        if not fits:
            return (f"fix.etp: {etp} does not divide the tp x cp x dp = {stage} GPUs of a "
                    f"pipeline stage ({n} GPUs / pp={pp}); pin etp=1 or fewer stages")
        return (f"fix.ep: ep x etp = {ep * etp} must fold into the tp x cp x dp = {stage} GPUs of "
                f"a pipeline stage ({n} GPUs / pp={pp}); use one of ep = {_some(fits)}, "
                "or fewer stages")
    inner = [fix.get(k) for k in ("tp", "cp", "dp")]
    if stage is None and None not in inner and (ep * etp) > 1 and \
            math.prod(inner) % (ep * etp) and n % (ep * etp) == 0:
        stage = math.prod(inner)
        fits = [e for e in divisors(space.experts or 1) if stage % (e * etp) == 0]
        if not fits:
            return (f"fix.etp: {etp} does not divide the tp x cp x dp = {stage} GPUs pinned for "
                    "a pipeline stage; pin etp=1 or a larger dp")
        return (f"fix.ep: ep x etp = {ep * etp} must fold into the tp x cp x dp = {stage} GPUs "
                f"pinned for a pipeline stage; use one of ep = {_some(fits)}, or pin a "
                "larger dp")
    if n % (ep * etp) and n % etp == 0:  # the experts spread over ranks of the tp x cp x dp
        fits = [e for e in divisors(space.experts or 1) if n % (e * etp) == 0]
        return (f"fix.ep: ep x etp = {ep * etp} does not divide the cluster's {n} GPUs; use one "
                f"of {_some(fits)}")
    form = fix.get("cp_comm")
    if cp > 1 and form:
        t = 1 if tp is None else tp  # an unpinned tp can be 1, the widest heads allow
        rule = cp_comm_reason(form, t, cp, space, options)
        if rule == CP_LEVELS and tp is None and any(  # another tp may leave both levels
                n % (d * cp) == 0 and not tp_reasons(d, space, False)
                and not cp_comm_reason(form, d, cp, space, options) for d in divisors(gpn)):
            rule = ""
        if rule:
            # (with tp unpinned, a form another tp runs: a2a+p2p's two levels need tp > 1)
            tps = [t] if tp is not None else [d for d in divisors(gpn) if n % (d * cp) == 0
                                              and not tp_reasons(d, space, False)] or [t]
            allowed = [c for c in (options.cp_comms if options else CP_COMMS)
                       if any(not cp_comm_reason(c, d, cp, space, options) for d in tps)]
            other = f"pin cp_comm={' or '.join(allowed)}" if allowed else "pin cp=1"
            inner = math.gcd(cp, max(1, gpn // t))
            width = (f"tp x cp = {t * cp}" if form == "a2a" else
                     f"tp x the cp ranks in a node = {t * inner}")
            split = t * cp if form == "a2a" else t * inner
            copies = form == "a2a" and options is not None and options.cp_kv_copies
            short = [f"{h} {kind} heads" for h, kind in zip(space.heads, ("query", "key-value"))
                     if h and h % split and not (copies and kind == "key-value" and split % h == 0)]
            kv_short = any(s.endswith("key-value heads") for s in short)
            why = (f"needs the {' and the '.join(short) or 'heads'} divisible by {width}"
                   + (f" ({width} may also be a multiple of the key-value heads: they are "
                      "copied)" if copies and kv_short else "")
                   if rule == CP_HEADS else
                   f"it needs more than one but not all of the {cp} cp ranks in each node (an "
                   f"all-to-all inside a node, a ring across nodes), which no tp gives here with "
                   f"nodes of {gpn} GPUs"
                   if rule == CP_LEVELS and tp is None
                   and not any(1 < math.gcd(cp, max(1, gpn // d)) < cp for d in divisors(gpn)
                               if n % (d * cp) == 0)
                   else f"with tp={t} a node of {gpn} GPUs holds {inner} of the {cp} cp ranks, so "
                   f"it would be {'a ring alone (p2p)' if inner == 1 else 'an all-to-all alone (a2a)'}"
                   if rule == CP_LEVELS else rule)
            return f"fix.cp_comm: {form} with cp={cp}: {why}; {other}"
    vpp = fix.get("vpp", 1)
    if pp is not None and pp_reason(pp, vpp, space):
        what = f"pp={pp}" if pp_reason(pp, vpp, space) == PP_BLOCKS else f"pp x vpp = {pp * vpp}"
        return f"fix: {what} stages for a model of {space.num_blocks} blocks; pin fewer stages"
    attention = {CP_WINDOW_NONE: "sliding-window attention", CP_SINKS_NONE: "attention with sinks",
                 CP_LATENT_NONE: "latent attention (keys wider than values)"}
    rule = cp_reason(cp, space, training, options, pinned=True) if options and cp > 1 else ""
    if rule in attention:
        return (f"fix.cp: {options.target} runs no context parallelism over the model's "
                f"{attention[rule]}; drop cp (or plan for --target any)")
    if etp > 1 and space.etp_one_only:
        return (f"fix.etp: {options.target} does not split experts' matrices where the experts "
                "carry biases, as this model's do; pin etp=1")
    if fix.get("placement") == "tp-pp-dp" and options is not None and pp is not None and \
            tp is not None and "cp" in fix and n % (tp * cp * pp) == 0:
        dp = n // (tp * cp * pp)
        etps = [etp] if "etp" in fix else sorted({1, tp})
        reasons = [pp_inner_refused(options, pp=pp, dp=dp, tp=tp, cp=cp, ep=ep, etp=e,
                                    experts=bool(space.experts)) for e in etps]
        # (an unpinned ep may meet a rule about the experts, not the target's own refusal)
        if all(reasons) and ("ep" in fix or not space.experts or reasons[0] == PP_INNER):
            degrees = f"pp={pp}, tp={tp}, cp={cp}" + (f", ep={ep}" if "ep" in fix else "")
            rule = reasons[0].replace("the target", options.target)
            return (f"fix.placement: tp-pp-dp with {degrees} (dp={dp}): {rule}; pin "
                    "placement=tp-dp-pp" + ("" if reasons[0] == PP_INNER else
                                            ", or degrees that meet it"))
    return ""


def sequence_pin_problem(fix: dict, seq_len: int, num_gpus: int,
                         options: SearchOptions | None = None, *, image: bool = False,
                         causal: bool = True) -> str:
    """'' or the line saying a pinned cp does not cut the sequence into its equal chunks;
    ``image``: the sequence is an image's patches (image_size and patch_size set it, not
    --seq-len); ``causal``: the model has causal attention (the 2 x cp chunks balance it; the
    engines cut them whatever the mask)."""
    cp = fix.get("cp", 1)
    chunks = cp_chunks(cp, options)
    if cp > 1 and seq_len % chunks:
        fits = [c for c in divisors(num_gpus) if c > 1 and seq_len % cp_chunks(c, options) == 0]
        why = "causal load balancing" if causal else \
            "the load-balanced chunks the engines cut, though this model's attention is not causal"
        what = (f"2 x cp = {chunks} equal chunks ({why})" if chunks == 2 * cp
                else f"cp = {cp} equal shards")
        if image:
            return (f"fix.cp: an image's {seq_len} tokens (its patches and the tokens the model "
                    f"prepends) do not split into {what}; "
                    + (f"use cp={' or '.join(map(str, fits[:4]))}, or " if fits else "drop cp, or ")
                    + "set image_size and patch_size in the config to give a multiple of "
                    f"{chunks} tokens")
        ulysses = chunks == 2 * cp and seq_len % cp == 0 and \
            fix.get("cp_comm", "a2a") == "a2a" and int(fix.get("tp", 1)) == 1 and \
            int(fix.get("pp", 1)) == 1  # (its all-to-all over heads balances it; its mesh has
        # data and sequence parallelism alone)
        return (f"fix.cp: the sequence of {seq_len} tokens does not split into {what}; use "
                + (f"cp={' or '.join(map(str, fits[:4]))}, or " if fits else "")
                + f"a sequence length divisible by {chunks}"
                + (f" (DeepSpeed's Ulysses cuts it into cp = {cp} shards: --target deepspeed "
                   "plans within its rules)" if ulysses else ""))
    return ""


def recompute_pin_problem(fix: dict, experts: int, latent: bool, layers: int | None = None) -> str:
    """'' or the line saying a pinned recomputation has nothing to recompute in the model: moe_act
    without routed experts (``experts``: the model's, 0 for none), mla_up_proj without latent
    attention (``latent``), full/k with fewer than k ``layers`` (None: not checked)."""
    rc = fix.get("recompute", "none")
    k = layer_interval(rc)
    if layers is not None and k > layers:
        return (f"fix.recompute: {rc} recomputes {every_words(k)}, and the model has "
                f"{layers} layer{'s' if layers != 1 else ''}; pin none, full"
                + (" or full/2" if layers >= 2 else ""))
    if "moe_act" in modules_of(rc) and not experts:
        return (f"fix.recompute: {rc} recomputes the routed experts' activation function, and "
                "the model has no routed experts the trace recognizes; pin none, selective or "
                "full" + (", or mla_up_proj" if latent else ""))
    if "mla_up_proj" in modules_of(rc) and not latent:
        return (f"fix.recompute: {rc} recomputes multi-head latent attention's up "
                "projections, and the model has no latent attention (no attention whose keys are wider "
                "than its values, as DeepSeek's are); "
                "pin none, selective or full" + (", or moe_act" if experts else ""))
    return ""


def experts_pin_problem(fix: dict, experts: int, num_gpus: int) -> str:
    """'' or the line saying a pinned ep does not divide the model's ``experts`` (0: none)."""
    ep, etp = fix.get("ep", 1), fix.get("etp", 1)
    if experts and experts % ep:
        fits = [e for e in divisors(experts) if num_gpus % (e * etp) == 0]  # ep x etp | the GPUs
        return (f"fix.ep: {ep} does not divide the model's {experts} experts; use one of "
                f"{_some(fits or divisors(experts))}")
    return ""


def known_model_pin_problem(fix: dict, num_gpus: int, *, seq_len: int, experts: int,
                            options: SearchOptions | None = None) -> str:
    """The part of pin_problem a zoo model's published dimensions (its sequence length, its
    routed experts) decide before it is traced."""
    ep, etp = fix.get("ep", 1), fix.get("etp", 1)
    if not experts and (ep > 1 or etp > 1):  # (a traced model's line says what the trace seeks)
        key = "ep" if ep > 1 else "etp"
        return f"fix.{key}: the model is dense (no routed experts to spread); drop {key}"
    return (sequence_pin_problem(fix, seq_len, num_gpus, options)
            or experts_pin_problem(fix, experts, num_gpus))


def _heads_words(heads: tuple[int, ...]) -> str:
    """'32 heads', or '32 query and 8 key/value heads' (ZooEntry.head_counts: largest first)."""
    return f"{heads[0]} heads" if len(heads) == 1 else \
        f"{heads[0]} query and {heads[1]} key/value heads"


def gpus_words(space: Space) -> str:
    """The GPUs a pinned degree must divide, in words ('the cluster's {n} GPUs' to format with
    Space.num_gpus): on a cluster of device groups or sites, those every group's count shares,
    inside which each pipeline stage's tp x dp ranks stay."""
    return ("the {n} GPUs a pipeline stage may take in any group or site (the most dividing "
            "every one's GPU count), inside which its tp x dp ranks stay" if space.group_gpus
            else "the cluster's {n} GPUs")


def cluster_pin_problem(fix: dict, num_gpus: int, batch: int,
                        whose: str = "the cluster's {n} GPUs", heads: tuple[int, ...] = ()) -> str:
    """The part of pin_problem that needs no model (checked before tracing it): the pins against
    the cluster's GPUs (``whose``: gpus_words), the batch and each other (not the sequence: a
    model may set its own, as image models do from their patches). ``heads``, where known before
    the trace (a zoo model's query and key/value heads: ZooEntry.head_counts), narrows the tp
    degrees offered to those dividing them (a new-user check was offered tp=16 for Mixtral's 8
    key/value heads, which the trace then refused)."""
    n, tp, pp, dp, cp = num_gpus, fix.get("tp"), fix.get("pp"), fix.get("dp"), fix.get("cp", 1)
    for key, value in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp)):
        if value is not None and n % value:
            how = "is more than" if value > n else "does not divide"
            by_heads = key == "tp" and bool(heads)
            offered = [d for d in divisors(n) if not by_heads or all(h % d == 0 for h in heads)]
            return (f"fix.{key}: {value} {how} {whose.format(n=n)}; use one of {_some(offered)}"
                    + (f" (dividing the model's {_heads_words(heads)})" if by_heads else ""))
    if None not in (tp, pp, dp) and tp * pp * dp * cp != n:
        return (f"fix: dp x cp x tp x pp = {dp * cp * tp * pp}, but the cluster has {n} GPUs; "
                "pin degrees whose product is the number of GPUs, or leave one out")
    pinned = [(k, v) for k, v in (("dp", dp), ("cp", cp), ("tp", tp), ("pp", pp))
              if v is not None and v > 1]
    product = math.prod(v for _, v in pinned)
    if len(pinned) > 1 and n % product:
        names = " x ".join(k for k, _ in pinned)
        return (f"fix: {names} = {product} does not divide {whose.format(n=n)}; pin smaller "
                "degrees")
    vpp = fix.get("vpp", 1)
    if dp is not None and batch % dp:
        return (f"fix.dp: the global batch {batch} does not split over {dp} replicas; use a "
                f"global batch divisible by {dp}, or a dp dividing {batch}")
    mb = fix.get("micro_batch")
    if mb is not None:
        if mb > batch:
            return f"fix.micro_batch: {mb} is larger than the global batch {batch}"
        if dp is not None and (batch // dp) % mb:
            return (f"fix.micro_batch: {mb} does not divide the {batch // dp} samples of each of "
                    f"the {dp} replicas")

    if fix.get("sequence_parallel") and tp == 1:
        return "fix.sequence_parallel: needs tp > 1; pin tp > 1 or drop sequence_parallel"
    if "cp_comm" in fix and fix.get("cp") == 1 and fix["cp_comm"] != "p2p":
        # (p2p at cp=1 is what every plan file records: its parallel given back as pins)
        return (f"fix.cp_comm: {fix['cp_comm']} exchanges keys and values between context-"
                "parallel ranks and cp=1 has none; drop cp_comm or pin cp > 1")
    if fix.get("offload_optimizer") and fix.get("zero") == 0:
        return "fix.offload_optimizer: needs zero >= 1 (the optimizer states sharded)"
    if vpp > 1 and pp == 1:
        return (f"fix.vpp: vpp={vpp} splits each pipeline stage into chunks and needs pp > 1; "
                "pin pp or drop vpp")
    if vpp > 1 and fix.get("schedule", "interleaved-1f1b") != "interleaved-1f1b":
        return f"fix.vpp: vpp={vpp} needs schedule=interleaved-1f1b, not {fix['schedule']}"
    return ""


def _some(values: list[int], most: int = 12) -> str:
    """``1, 2, 4`` (the first and last of a long list, with an ellipsis between)."""
    if len(values) <= most:
        return ", ".join(map(str, values))
    return ", ".join(map(str, values[:most - 2])) + ", ..., " + ", ".join(map(str, values[-2:]))


LEANEST_FIRST = ("full", "op", "full/2", "full/4", "mla_up_proj+moe_act", "mla_up_proj",
                 "moe_act", "selective", "none")
"""Recomputation policies from the one that keeps least to the one that keeps most, as a rule
(with materialized attention selective can keep less than moe_act)."""


def leanest(ma: ModelArrays, bg: BlockGraph, cluster: Cluster, training: TrainingSpec,
            options: SearchOptions) -> tuple[float, Config, Estimate] | None:
    """The configuration with the smallest peak memory per GPU among those with the pinned knobs
    (``options.fix``; batch divisibility ignored where not pinned), its peak and its estimate.
    Context parallelism counts where the model and target allow it (it divides the activations
    of long sequences)."""
    fix = options.fix
    n, space = cluster.num_gpus, Space.of(cluster, bg, options)
    rc = fix.get("recompute", next(r for r in LEANEST_FIRST if r in options.recompute))
    etp = fix.get("etp", 1)
    cps = ([fix["cp"]] if "cp" in fix else
           [c for c in divisors(n) if not cp_reason(c, space, training, options)])
    best = None
    for cp in cps:
        for tp in ([fix["tp"]] if "tp" in fix else divisors(n // cp)):
            if n % (tp * cp) or tp_reasons(tp, space, pinned=tp_pinned(tp, fix)) or \
                    etp not in (1, tp):
                continue
            form = fix.get("cp_comm") or next(
                (f for f in options.cp_comms if not cp_comm_reason(f, tp, cp, space, options)),
                None) if cp > 1 else "p2p"
            if form is None:
                continue
            sp = fix.get("sequence_parallel", tp > 1 and True in options.sequence_parallel
                         and training.seq_len % (tp * cp) == 0)  # (the SP_SEQ rule)
            if space.experts and tp > 1 and not sp:
                continue  # routed experts with tp > 1 need sequence parallelism (MOE_SP)
            mb = fix.get("micro_batch", 1)
            costs_by_ep: dict = {}
            for pp in ([fix["pp"]] if "pp" in fix else divisors(n // (tp * cp))):
                vpp = fix.get("vpp", 1)
                if (n // (tp * cp)) % pp or pp_reason(pp, vpp, space):
                    continue
                dp = n // (tp * pp * cp)
                if fix.get("dp", dp) != dp or target_mesh_reason(tp, cp, pp, dp, training, options) \
                        or (cp > 1 and (tp > 1 or pp > 1) and not options.cp_with_tp_pp):
                    continue  # a mesh the target does not run (space.meshes' rules)
                # the experts spread as far as the pins allow: the fewest expert states per GPU
                ep = fix.get("ep", max((e for e in divisors(dp * cp * tp // etp)
                                        if space.experts and space.experts % e == 0), default=1))
                if ep_reasons(ep, etp, tp, cp, dp, space):
                    continue  # a pinned ep that this stage's GPUs cannot hold (EP_GROUP, ...)
                if ep not in costs_by_ep:  # the block costs depend on ep, not on pp
                    costs_by_ep[ep] = block_costs(ma, cluster, training, tp=tp, sp=sp, recompute=rc,
                                                  micro_batch=mb, cp=cp, cp_comm=form, ep=ep,
                                                  etp=etp)
                costs = costs_by_ep[ep]
                m = max(1, training.global_batch // (dp * mb))
                wants_offload = fix.get("offload_optimizer", any(options.offload))
                # states shard over dp x cp (context-parallel ranks hold the same weights), with the
                # ZeRO stages the target runs there
                zeros = [z for z in options.zero if cp == 1 or zero_runs_with_cp(options, z, ep=ep)]
                zero = fix.get("zero", max(zeros, default=0) if dp * cp > 1
                               else int(wants_offload))  # (one replica: ZeRO-1 to offload)
                offload = wants_offload and zero >= 1
                schedule = fix.get("schedule", "interleaved-1f1b" if vpp > 1 else "1f1b")
                cfg = Config(dp=dp, tp=tp, pp=pp, micro_batch=mb, num_microbatches=m,
                             schedule=schedule if pp > 1 else "1f1b", recompute=rc, zero=zero,
                             sequence_parallel=sp, vpp=vpp if pp > 1 else 1,
                             offload_optimizer=offload and zero >= 1, cp=cp, cp_comm=form,
                             ep=ep, etp=etp)
                first = pipeline.in_flight(cfg.schedule, stage=0, stages=pp, microbatches=m,
                                           vpp=cfg.vpp)
                weights = (block_state_bytes(cfg, costs, ma, training) + first * costs.act_bytes
                           + costs.work_bytes).tolist()
                part = partition(weights, pp * cfg.vpp)
                if part is None:
                    continue
                est = price(cfg, part.bounds, ma, costs, cluster, training)
                if best is None or est.peak_memory_bytes < best[0]:
                    best = (est.peak_memory_bytes, cfg, est)
    return best


def reserve_problem(cluster, options: SearchOptions) -> str:
    """Why the memory kept free leaves a device of ``cluster`` nothing ('' where it does not)."""
    for group in getattr(cluster, "groups", (cluster,)):
        device = group.device
        if capacity_bytes(group, options) <= 0:
            return (f"memory_reserve_gb (--memory-reserve-gb), memory_reserve_fraction "
                    f"(--memory-reserve-fraction): keeping {options.memory_reserve_fraction:g} of "
                    f"each device and {options.memory_reserve_bytes / 1e9:.3g} GB besides leaves "
                    f"nothing of {device.name}'s {device.memory_bytes / 1e9:.3g} GB; lower them")
    return ""


def explain_infeasible(ma: ModelArrays, bg: BlockGraph, cluster, training: TrainingSpec,
                       options: SearchOptions, rejected: Counter, *, image: bool = False) -> str:
    """One line: what the leanest plan (with the user's pins) needs, what the device offers, and
    what would fit. A pin no configuration can honour raises SpecError instead (bad input).
    ``image``: the model's tokens are an image's patches (Space.image)."""
    problem = pin_problem(dict(options.fix), Space.of(cluster, bg, options, image=image),
                          training, options)
    if problem:
        raise SpecError(problem)
    if "cp" not in options.fix:  # the search's own choice to skip short cp, not a rule that binds
        rejected = Counter({r: n for r, n in rejected.items() if r != CP_SHORT})
    summary = "; ".join(filter(None, rejection_lines(rejected, most=6))) or "no candidates"
    counted = f"configurations each rule refused: {summary}" if rejected else summary
    pins = fix_text(options.fix)
    with_pins = f" with {pins}" if pins else ""
    lead = "fix: " if pins else ""  # the pins are the field to change
    priced = any(rejected[r] for r in OUTCOMES)  # some configurations passed the rules
    relax = "relax --fix" if pins else "see `plan solve --help` for the knobs"
    over_memory = (f"no plan fits: no configuration{with_pins} fits on {cluster.num_gpus} GPUs "
                   f"({summary})" + ("; relax --fix" if pins else ""))
    if isinstance(cluster, HeteroCluster):
        if not priced:  # the rules alone left nothing: bad input
            raise SpecError(f"{lead}no configuration{with_pins} is possible on the cluster's groups "
                            f"({counted}); {relax}")
        kind = "sites" if cluster.is_sites else "groups"
        return (f"no plan fits: no configuration{with_pins} fits the cluster's {kind} ({summary})"
                + _groups_alone_note(ma, bg, cluster, training, options)
                + ("; relax --fix" if pins else ""))
    cap = capacity_bytes(cluster, options)
    lean = leanest(ma, bg, cluster, training, options)
    if lean is None and priced:  # memory stops what the rules allow
        return over_memory
    if lean is None:  # the rules (and the pins) leave nothing, whatever the memory: bad input
        raise SpecError(f"{lead}no configuration{with_pins} is possible on {cluster.num_gpus} GPUs "
                        f"({counted}); {relax}")
    need, cfg, est = lean
    if need <= cap and rejected[TOO_MANY_MB]:
        least = -(-training.global_batch // (cluster.num_gpus * MAX_MICROBATCHES))
        return (f"the global batch {training.global_batch:,} over at most {cluster.num_gpus} "
                f"replicas needs micro-batches of {least:,}+ samples to stay within "
                f"{MAX_MICROBATCHES:,} per step, and their activations do not fit ({summary}); "
                "use a smaller global batch or more GPUs")
    if need <= cap and priced and not (rejected[MICRO_BATCH] or rejected[BATCH_DP]):
        return over_memory  # the leanest layout breaks a rule; what the rules allow is too big
    if need <= cap:  # memory is not what stops it: the batch or the pins break the rules
        advice = _rules_advice(cfg, training.global_batch, rejected, bool(pins), cluster.num_gpus)
        if not pins and advice.startswith("--global-batch"):  # the batch is the field to change
            lead = "training.global_batch: "
        raise SpecError(f"{lead}no configuration{with_pins} is possible ({counted}); {advice}")
    worst = max(est.stages, key=lambda st: st.memory.get("total", 0.0))
    kinds = ", ".join(f"{k} {v / 1e9:.3g}" for k, v in worst.memory.items()
                      if k != "total" and v > 0)
    where = (f"stage {worst.index} of the leanest with {pins} ({cfg.short()})" if pins else
             f"stage {worst.index} of the leanest ({cfg.short()})")
    hint = "" if pins else _more_nodes_hint(ma, bg, cluster, training, options, cap)
    device_gb = (need + options.memory_reserve_bytes) / (1 - options.memory_reserve_fraction) / 1e9
    fix_hint = "; relax --fix" if pins else ""
    if options.reserve_changed:
        fix_hint += (f"; or keep less of each device free (--memory-reserve-fraction "
                     f"{options.memory_reserve_fraction:g}, --memory-reserve-gb "
                     f"{options.memory_reserve_bytes / 1e9:.3g} now)")
    return (f"no plan fits: {where} needs {gb(need)} per GPU ({kinds} GB) but each "
            f"{cluster.device.name} leaves {gb(cap)} usable; it would fit on a device with "
            f">= {math.ceil(device_gb)} GB{hint}{fix_hint}")


def _rules_advice(cfg, global_batch: int, rejected: Counter, pinned: bool,
                  num_gpus: int) -> str:
    """What to change when configurations that would fit in memory all break a rule: the batch
    when it does not split, else the pins. The batches named are near the asked one: multiples
    of micro_batch x the GPU count, which every data-parallel degree divides (dp divides the
    GPUs), where one lies within a quarter of it; else multiples for the leanest layout's dp."""
    relax = "relax --fix" if pinned else "see `plan solve --help` for the knobs"
    step = cfg.dp * cfg.micro_batch
    if (rejected[MICRO_BATCH] or rejected[BATCH_DP]) and global_batch % step:
        every = cfg.micro_batch * num_gpus
        near_every = nearby_multiples(global_batch, every, within=global_batch / 4)
        if near_every and global_batch % every:
            return (f"--global-batch must be a multiple of dp x micro_batch, e.g. "
                    f"{' or '.join(f'{b:,}' for b in near_every)} (multiples of micro_batch "
                    f"{cfg.micro_batch} x {num_gpus} GPUs, so any dp divides them); or {relax}")
        fewer = (f"; or fewer GPUs (--nodes): the leanest layout on {num_gpus:,} needs dp="
                 f"{cfg.dp:,} replicas of at least one sample" if global_batch < step else "")
        return (f"--global-batch must be a multiple of dp x micro_batch, e.g. "
                f"{' or '.join(f'{b:,}' for b in nearby_multiples(global_batch, step))} for dp="
                f"{cfg.dp}, micro_batch={cfg.micro_batch}{fewer}; or {relax}")
    return relax


def nearby_multiples(value: int, step: int, within: float | None = None) -> list[int]:
    """The positive multiples of ``step`` just below and just above ``value`` (those at most
    ``within`` away from it, when given)."""
    lower = value // step * step
    return [b for b in (lower, lower + step)
            if b > 0 and (within is None or abs(b - value) <= within)]


def dp_fits(bg: BlockGraph, cluster: Cluster, training: TrainingSpec, options: SearchOptions,
            dp: int) -> bool:
    """Whether the leanest layout with ``dp`` data-parallel replicas (and the other pins) fits
    each device's usable memory (batch divisibility aside)."""
    lean = leanest(ModelArrays.from_blocks(bg), bg, cluster, training,
                   replace(options, fix={**options.fix, "dp": dp}))
    return lean is not None and lean[0] <= capacity_bytes(cluster, options)


def _groups_alone_note(ma, bg, cluster: HeteroCluster, training: TrainingSpec,
                       options: SearchOptions) -> str:
    """What the leanest configuration needs on each device group alone against what its devices
    leave (a new-user check got only the count of configurations out of memory on groups): a
    group alone that fits is named as the way out."""
    parts, fits = [], []
    for group in cluster.groups:
        try:
            lean = leanest(ma, bg, group, training, options)
        except PlannerError:  # (a pin this group cannot take)
            lean = None
        if lean is None:
            continue
        cap = capacity_bytes(group, options)
        parts.append(f"{group.name} ({group.num_gpus} x {group.device.name}) {gb(lean[0])} of "
                     f"{gb(cap)} usable")
        if lean[0] <= cap:
            fits.append(group.name)
    if not parts:
        return ""
    kind = "site" if cluster.is_sites else "group"
    way = (f"; {' and '.join(fits)} alone would fit: plan on "
           f"{'it' if len(fits) == 1 else 'one of them'} alone (a cluster file of that {kind})"
           if fits else "")
    return (f"; the leanest configuration on each {kind} alone needs per GPU: "
            f"{'; '.join(parts)}{way}")


def _more_nodes_hint(ma, bg, cluster, training, options, cap) -> str:
    for factor in (2 ** k for k in range(1, 13)):
        bigger = replace(cluster, nodes=cluster.nodes * factor)
        lean = leanest(ma, bg, bigger, training, options)
        if lean is not None and lean[0] <= cap:
            return f", or on {bigger.nodes} nodes ({bigger.num_gpus} GPUs)"
    return ""


def batch_note(global_batch: int, num_gpus: int, cfg, rejected, fix=None,
               fits: Callable[[int], bool] | None = None) -> str:
    """'' or a warning that the global batch's size ruled out data-parallel degrees above that
    of the plan's configuration ``cfg`` (the search's BATCH_DP rule) and within what the pinned
    degrees (``fix``) leave, with the nearest batches that do not (a new-user check saw a batch
    of 100 on 8 GPUs planned as dp 2 x pp 4 with only a count in the ruled-out list to say
    why). ``fits(dp)``: whether some layout with that data-parallel degree fits in memory
    (dp_fits); the degrees none fits at are left out, as a larger batch would not make them
    plans (a new-user check was told to raise a 262k-token run's batch for dp=32, which needs
    480 GB per GPU)."""
    if not rejected.get(BATCH_DP):
        return ""
    fix = fix or {}
    dp = cfg.dp
    most = num_gpus // (fix.get("tp", 1) * fix.get("pp", 1) * fix.get("cp", 1))
    ruled = [d for d in range(dp + 1, most + 1) if num_gpus % d == 0 and global_batch % d]
    if fits is not None:
        ruled = [d for d in ruled if fits(d)]
    if not ruled:
        return ""
    top = ruled[-1]
    batches = " or ".join(f"{n:,}" for n in nearby_multiples(global_batch, top))
    also = f" (nor {', '.join(f'dp={d}' for d in ruled[:-1])})" if len(ruled) > 1 else ""
    others = " x ".join(f"{k}={v}" for k, v in (("tp", cfg.tp), ("pp", cfg.pp), ("cp", cfg.cp))
                        if v > 1)
    samples = "1 sample does" if global_batch == 1 else f"{global_batch:,} samples do"
    return (f"training.global_batch: {samples} not split over dp={top}{also}, "
            f"which ruled {'them' if also else 'it'} out: the plan uses dp={dp}{f' with {others}' if others else ''}; a "
            f"multiple of {top} ({batches}) splits")


SEQ_MULTIPLE = 256
"""A sequence length that is a multiple of this splits for sequence parallelism over up to 8
tensor-parallel ranks with context parallelism up to 16 (2 x cp chunks per sequence)."""


def length_note(seq_len: int, rejected, image: bool = False, fix: dict | None = None,
                positions: int = 0) -> str:
    """'' or a warning that the sequence length itself ruled out sequence or context parallelism
    for some degrees (the search's SP_SEQ, CP_SEQ and SEQ_TP_2CP rules), with the nearest length
    that does not (with a pinned cp in ``fix``, and a pinned tp, one that splits for those), or
    for an image model (``image``: its sequence is its patches) where its length comes from;
    none for one token per sample (an image, a recommendation sample), which has no sequence to
    split. ``positions``: the model's learned positions (0: no such limit), past which no length
    is offered (a new-user check was offered 256 tokens for CLIP's 77, which the trace then
    refused)."""
    ruled = sum(rejected.get(rule, 0) for rule in (SP_SEQ, CP_SEQ, SEQ_TP_2CP))
    fix = fix or {}
    cp, tp = int(fix.get("cp", 0)), int(fix.get("tp", 0))
    multiple, over = SEQ_MULTIPLE, "over tp up to 8 with cp up to 16"
    if cp:  # 2 x cp chunks, each split over tp for sequence parallelism
        multiple = math.lcm(SEQ_MULTIPLE, 2 * cp * (tp or 8))
        over = f"over {f'tp={tp}' if tp else 'tp up to 8'} with cp={cp}"
    elif tp:  # (a tp of 3 splits no multiple of 256)
        multiple = math.lcm(SEQ_MULTIPLE, 2 * 16 * tp)
        over = f"over tp={tp} with cp up to 16"
    if not ruled or seq_len % multiple == 0 or seq_len == 1:
        return ""
    if image:
        return (f"training.seq_len: an image's {seq_len:,} tokens (from image_size and patch_size "
                "in a config; for a module or factory, the seq_len given) do not split evenly, "
                "which ruled out sequence or context parallelism for some degrees")
    lower = seq_len // multiple * multiple
    fitting = [n for n in (lower, lower + multiple) if 0 < n <= (positions or n)]
    if not fitting:
        return (f"training.seq_len: {seq_len:,} tokens do not split evenly, which ruled out "
                f"sequence or context parallelism for some degrees; no multiple of {multiple:,} "
                f"(which splits {over}) fits the model's {positions:,} learned positions")
    nearest = min(fitting, key=lambda n: abs(n - seq_len))
    return (f"training.seq_len: {seq_len:,} tokens do not split evenly, which ruled out sequence "
            f"or context parallelism for some degrees; a multiple of {multiple:,} "
            f"({nearest:,}) splits {over}")
