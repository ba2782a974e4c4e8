"""A plan as a person reads it: the configuration, where the step time goes, the stage table and
the search's account with its runners-up. Returns strings; printing is the CLI's job."""

from __future__ import annotations

import math
import textwrap

from costmodels.engine import describe, engine_from_mapping
from costmodels.errors import PlannerError
from costmodels.hardware import get_device
from costmodels.memory import every_words, layer_interval, modules_of
from planner.planfile.breakdown import BREAKDOWN_WORDS
from planner import targets
from planner.options import KNOBS, Config
from planner.planfile.document import Plan
from planner.report.embeddings import embeddings_summary
from planner.report.text import compress_names, knob, table, wrap
from planner.search import alone, placement, replicas
from planner.search.feasibility import nearby_multiples
from planner.search.loop import (RETIME_CAP, RETIME_MAX, TIE_SHARE, TIME_LIMIT,
                                  rejection_lines)
from planner.trace.graph import FROZEN_PRICING, frozen_words, is_mtp_block, unpriced_words
from planner.units import GB, cluster_text, counted, gb, gb1, human_count, ms, seconds


def summary(p: Plan) -> str:
    """The whole explanation of a plan, as printed by ``plan solve`` and ``plan show``."""
    lines = [_header(p), ""]
    if p.embeddings is not None:
        return "\n".join(lines + embeddings_summary(p))
    lines += _parallel(p)
    lines += ["", *_engines(p)]  # before the stages: whether an engine runs it as planned
    lines += [*stage_table(p), *_ep_straddles(p), ""]
    lines += _alone(p)
    lines += _placements(p)
    lines += _batch_factors(p)
    lines += _search(p)
    return "\n".join(lines)


ENGINE_TARGETS = ("megatron", "torchtitan", "deepspeed", "torch")
"""The engines a plan made with ``--target any`` is checked against (plan run is torch's)."""


def _engines(p: Plan) -> list[str]:
    """For a plan made with ``--target any``: the engines whose rules its knobs keep to
    (planner.targets.restrict: schedule, ZeRO stage, offload, sequence parallelism,
    recomputation) and the first knob each other one refuses; an export checks the rest."""
    if p.search.get("target", "any") != "any" or "groups" in p.cluster:
        return []
    runs, refused = engine_fit(p)
    if not refused:
        return []
    near = p.search.get("nearest_engine")
    if near and "step_time_s" in near:
        step = p.predicted["step_time_s"]
        change = 100 * (near["step_time_s"] / step - 1)
        near_text = (f"; within {near['target']}'s rules the search's best is "
                     f"{near['parallel']}, {near['step_time_s']:.4g} s a step ({change:+.1f}%, "
                     f"{gb1(near['peak_memory_bytes'])} {_per(p)}): `plan solve --target "
                     f"{near['target']}` plans it")
    elif near:
        near_text = f"; within {near['target']}'s rules nothing fits ({near['reason']})"
    else:
        near_text = "; `plan solve --target NAME` plans within one engine's"
    kernels = ""
    if targets.model_refusal(p.model, "megatron") and \
            engine_from_mapping(p.training.get("engine")).kernels == "fused":
        # (the default software is Megatron-Core's, whose fused kernels no engine running this
        # model has: a review saw a Swin priced 45% faster than its eager code runs)
        kernels = ("; its step is priced with Megatron-Core's fused kernels (the default "
                   "--engine), which the engines that run this model do not have: --engine "
                   "torch prices its own eager code, --engine torchtitan-compile torch.compile's")
    return wrap(f"  engines: planned with --target any; its knobs and dtype keep to the rules of "
                f"{', '.join(runs) or 'no engine'}, not {', '.join(refused)} (an export checks "
                f"the model's own){near_text}{kernels}",
                indent="    ") + [""]


def _every(recompute: str) -> str:
    """' (every 2nd layer whole)' for a full/k policy, '' for the others."""
    k = layer_interval(recompute)
    return f" ({every_words(k)} whole)" if k else ""


def _layer_interval_refusal(p: Plan, target: str) -> str:
    """targets.layer_interval_refusal on the plan's own split."""
    recomputed = set(p.recomputed_blocks())
    held = {b["name"] for b in p.model["blocks"] if b.get("recompute", True)}
    return targets.layer_interval_refusal(
        target, layer_interval(p.parallel["recompute"]),
        [sum(b in recomputed for b in st["blocks"]) for st in p.stages],
        [sum(b in held for b in st["blocks"]) for st in p.stages], p.parallel["pp"])


def engine_fit(p: Plan) -> tuple[list[str], list[str]]:
    """(the engines of ENGINE_TARGETS whose rules ``p``'s knobs and dtype keep to, the others
    each with the first knob it refuses)."""
    runs, refused = [], []
    engine = engine_from_mapping(p.training.get("engine"))
    for target in ENGINE_TARGETS:
        why = targets.model_refusal(p.model, target) or targets.refusal(
            p.parallel, p.training["dtype"], target, p.model.get("attention_forms", ()),
            experts=bool(p.model.get("routed_experts")), kv_heads=p.model.get("kv_heads", 0))
        if why is None and "moe_act" in modules_of(p.parallel["recompute"]) and \
                targets.moe_act_refusal(target, engine, p.training["dtype"]):
            why = "recompute: moe_act under these engine settings"
        if why is None and layer_interval(p.parallel["recompute"]):
            why = _layer_interval_refusal(p, target) or None
        if why is None:
            runs.append(target + (" (plan run)" if target == "torch" else ""))
        else:
            refused.append(f"{target} ({why.partition(':')[0].removeprefix('fix.')})")
    return runs, refused


def _batch_factors(p: Plan) -> list[str]:
    """A note when part of the GPU count shares no factor with the global batch: data
    parallelism divides the batch, so that part goes to tp, pp or cp whatever they cost; a batch
    that is a multiple of the GPU count frees it. Not for clusters of device groups, whose data
    parallelism is bounded by each group's GPUs."""
    if "groups" in p.cluster:
        return []
    gpus, batch = int(p.cluster["num_gpus"]), int(p.training["global_batch"])
    apart, rest = 1, gpus
    for f in range(2, gpus + 1):
        if rest % f:
            continue
        power = 1
        while rest % f == 0:
            rest, power = rest // f, power * f
        if batch % f:
            apart *= power
        if rest == 1:
            break
    if apart == 1:
        return []
    par = p.parallel
    took = [f"{k}={par[k]}" for k in ("tp", "pp", "cp") if math.gcd(par.get(k, 1), apart) > 1]
    who = (f"{', '.join(took)} take{'s' if len(took) == 1 else ''} it" if took else
           "the other degrees take it")
    near = nearby_multiples(batch, gpus, within=batch / 4)
    split = f" = {gpus // apart} x {apart}" if apart < gpus else ""
    return [*wrap(f"  batch       {gpus} GPUs{split}, and the global batch "
            f"{batch:,} shares no factor with {apart}: data parallelism, which divides the "
            f"batch, cannot take it, so {who}"
            + (f"; a global batch of {' or '.join(f'{b:,}' for b in near)} (a multiple of the "
               f"GPUs) frees it" if near else ""), indent=" " * 14), ""]


def _alone(p: Plan) -> list[str]:
    """For a cluster of groups or sites: each group searched alone (planner.search.alone), and
    whether one runs the step faster than this plan over all of them."""
    rows = p.search.get("groups_alone")
    if not rows:
        return []
    _, text = alone.verdict(rows, p.predicted["step_time_s"], sites=bool(p.cluster.get("links")),
                            kinds=len(set(str(p.cluster.get("device", "")).split("+"))),
                            groups=len(p.cluster.get("groups") or ()))
    lines = wrap(f"  alone       {text}", indent=" " * 14)
    verdicts = replicas.verdicts(p.search.get("sites_replicas") or [], p.predicted["step_time_s"],
                                 rows)
    for _, line in verdicts:
        lines += wrap(f"  replicas    {line}", indent=" " * 14)
    if any(kind not in ("unfit", "chosen") for kind, _ in verdicts):
        how = replicas.how(p.search["sites_replicas"], p.cluster["num_gpus"])
        lines += wrap(f"              ({how})", indent=" " * 15)
    return [*lines, ""]


def _placements(p: Plan) -> list[str]:
    """On sites: the plan's placement against the naive and random ones, priced alike."""
    pl = p.search.get("placements")
    if not pl:
        return []
    sites = " -> ".join(dict.fromkeys(st.get("group", "") for st in p.stages))
    return [f"  placement   stages chained {sites}; each stage's replicas inside one site",
            "              priced alike by the slot model (planner.search.sites), coarser than the "
            "step time above and kept for comparing placements:",
            f"                this plan         {pl['planned_s']:.4g} s",
            f"                naive site order  {pl['naive_s']:.4g} s "
            f"({pl['naive_s'] / pl['planned_s']:.2f}x)",
            f"                random            {pl['random_mean_s']:.4g} s mean of "
            f"{pl['random_samples']} ({pl['random_min_s']:.4g} to {pl['random_max_s']:.4g} s, "
            f"{pl['random_mean_s'] / pl['planned_s']:.2f}x)",
            *(wrap(" " * 16 + RANDOM_FASTER, indent=" " * 17)
              if pl["random_mean_s"] < pl["planned_s"] else []), ""]


RANDOM_FASTER = ("(random placements faster than this plan spread a stage's replicas over several "
                 "sites, which a pipeline over sites never does: fewer of its sends cross a link "
                 "between sites, more of its gradient traffic does; data parallelism across "
                 "whole sites, the replicas line where the plan has one, is the planner's form "
                 "of that)")
"""Said under the placements where random ones beat the plan on average (a new-user check read
it as the search giving up speed): the search keeps every stage's tp x dp ranks inside one
site."""


def summary_dict(p: Plan) -> dict:
    """The same explanation for scripts (``plan show --json``): what was planned, the
    configuration, the predictions, each stage, and the search's status; for a recommendation
    plan also each embedding table's layout (``embeddings``; its samples are rows of features,
    so its tokens are its samples)."""
    out = {
        "model": {k: p.model.get(k) for k in ("name", "num_params", "fingerprint",
                                               "frozen_params", "mtp_depths") if k in p.model},
        "cluster": {k: p.cluster.get(k) for k in ("name", "device", "nodes", "gpus_per_node",
                                                   "num_gpus")},
        "training": p.training,
        "parallel": p.parallel,
        "predicted": {k: v for k, v in p.predicted.items()},
        "stages": [{"index": st["index"], "ranks": st["ranks"], "blocks": st["blocks"],
                    "time_per_microbatch_s": st["predicted"]["time_per_microbatch_s"],
                    "memory_bytes": st["predicted"]["memory_bytes"]["total"]}
                   for st in p.stages],
        "search": {k: p.search.get(k) for k in ("status", "gap", "candidates", "evaluated",
                                                 "target")},
    }
    for k in ("groups_alone", "sites_replicas", "placements", "nearest_engine"):
        if p.search.get(k):  # (what the plan is measured against, where it has it)
            out["search"][k] = p.search[k]
    if (p.search.get("options") or {}).get("layout"):  # (the stages pinned: plan solve --layout)
        out["search"]["layout"] = p.search["options"]["layout"]
    if p.embeddings:
        emb = p.embeddings
        out["embeddings"] = {
            **{k: emb.get(k) for k in ("world_size", "table_optimizer", "pipeline")},
            "tables": [{k: t.get(k) for k in ("name", "sharding_type", "compute_kernel", "ranks",
                                               "rows", "dim")} for t in emb.get("tables", [])]}
    return out


def _header(p: Plan) -> str:
    c, m, t = p.cluster, p.model, p.training
    batch = (f"{t['global_batch']} samples" if p.embeddings else
             f"{t['global_batch']} images" if p.per_image else
             f"{t['global_batch']} x {counted(t['seq_len'], 'token')}")
    if m.get("encoder_tokens"):  # the tokens counted (per second, per token) are the decoder's
        batch += (f" (the decoder's, which tokens/s counts; the encoder reads "
                  f"{m['encoder_tokens']:,} per sample)")
    optimizer = t["optimizer"] + (" for the dense part" if p.embeddings else "")
    return (f"Plan for {m['name']} ({human_count(m['num_params'])} params) on {cluster_text(c)}\n"
            f"  global batch {batch}, {t['dtype']}, {optimizer}")


CP_COMM_WORDS = {"p2p": "K/V by p2p ring", "allgather": "K/V by all-gather",
                 "a2a": "heads by all-to-all of q, k, v and output",
                 "a2a+p2p": "a2a+p2p: all-to-all in a node, K/V ring across"}
"""How a plan's context parallelism exchanges its data (options.CpComm), in words."""


def _kv_copies(p: Plan) -> str:
    """``; key/value heads copied 2x``: where the plan's all-to-all exchange has more ranks than
    the model's key/value heads (DeepSpeed's Ulysses copies them); else ''."""
    par, heads = p.parallel, int(p.model.get("kv_heads", 0) or 0)
    width = int(par.get("cp", 1)) * int(par.get("tp", 1))
    if par.get("cp_comm") != "a2a" or not heads or heads % width == 0 or width % heads:
        return ""
    return f"; key/value heads copied {width // heads}x"


def _parallel(p: Plan) -> list[str]:
    par, pr = p.parallel, p.predicted
    sp = " (+sequence parallel)" if par["sequence_parallel"] else ""
    dev_mem = p.cluster.get("device_memory_bytes", 0)
    vpp = f" x {par['vpp']} chunks per rank" if par.get("vpp", 1) > 1 else ""
    offload = ", optimizer states offloaded to host" if par.get("offload_optimizer") else ""
    cp = (f"  cp={par['cp']} ({CP_COMM_WORDS.get(par.get('cp_comm', 'p2p'), par.get('cp_comm'))}"
          f"{_kv_copies(p)})" if par.get("cp", 1) > 1 else "")
    k = par.get("dp_replicate", 1)
    sites = (f" ({k} sites x {par['dp'] // k}: data parallel across "
             f"{', '.join(g['name'] for g in p.cluster.get('groups', []))}, gradients reduced "
             f"inside each site, then all-reduced across them)" if k > 1 else "")
    lines = [f"  parallel    dp={par['dp']}{sites}  tp={par['tp']}{sp}  pp={par['pp']}{vpp}{cp}"]
    if par.get("ep", 1) * par.get("etp", 1) > 1:
        ep, etp = par["ep"], par.get("etp", 1)
        edp = par["dp"] * par.get("cp", 1) * par["tp"] // (ep * etp)
        spread = [f"spread over {ep} ranks" if ep > 1 else "on every rank",
                  f"their matrices split over {etp}" if etp > 1 else "",
                  f"{edp} {'replica' if edp == 1 else 'replicas'} of each"]
        lines.append(f"  experts     ep={ep}  etp={etp}  edp={edp}: routed experts "
                     + ", ".join(filter(None, spread)))
    elif p.model.get("routed_experts"):  # recognised, and kept whole on every rank
        grouped = "groups" in p.cluster  # device groups price no expert parallelism
        lines.append(f"  experts     ep=1: {p.model['routed_experts']} routed experts per MoE "
                     "layer on every rank " + ("(expert parallelism is not priced on clusters "
                                               "of device groups)" if grouped else
                                               "(--fix ep=N spreads them)"))
    return lines + [
        f"  batching    micro-batch {par['micro_batch']} x {par['num_microbatches']} micro-batches, "
        f"schedule {par['schedule']}",
        f"  memory      recompute {par['recompute']}{_every(par['recompute'])}, "
        f"ZeRO-{par['zero']}{offload}, placement "
        f"{par.get('placement', 'tp-pp-dp')}",
        f"  software    {p.training['dtype']}; "
        f"{describe(engine_from_mapping(p.training.get('engine')), not p.model.get('no_attention'))}"
        f"{_without_flash(p)}{_overlap_off(p)}{_tp_overlap_unused(p)}",
        *breakdown(p),
        f"  throughput  {_samples(pr['samples_per_s'])} "
        + ("images/s, " if p.per_image else
           f"samples/s, {pr['tokens_per_s']:,.0f} tokens/s, ")
        + f"{_tflops(pr['tflops_per_device'])} TFLOP/s {_per(p)}, MFU "
        f"{100 * pr['mfu']:.1f}%",
        *_flops(p),
        *_fp8(p),
        f"  peak memory {gb1(pr['peak_memory_bytes'])} {_per(p)}"
        + (f" of {gb(dev_mem)}" if dev_mem and "groups" not in p.cluster else "")
        + ("" if "groups" not in p.cluster else " (device memory: " + ", ".join(
            f"{g['name']} {gb(g['device_memory_bytes'])}" for g in p.cluster["groups"])
           + ")") + _reserve(p),
    ]


def _reserve(p: Plan) -> str:
    """The memory the search kept free on each device, where not the default."""
    if not p.search.get("options", {}).get("memory_reserve"):
        return ""
    r = p.memory_reserve()
    return (f" ({100 * r['memory_reserve_fraction']:.3g}% and {r['memory_reserve_bytes'] / GB:.3g} "
            "GB of each kept free: --memory-reserve-*)")


def _flops(p: Plan) -> list[str]:
    """What the FLOP figures count, per token (plans made before this line was added lack it)."""
    pr, t = p.predicted, p.training
    if not all(isinstance(pr.get(k), (int, float)) for k in (
            "model_flops_per_token", "model_flops_per_step", "hardware_flops_per_step")):
        return []
    hardware = pr["hardware_flops_per_step"] / (t["global_batch"] * t["seq_len"])
    extras = [what for what, where in (
        ("recomputation", p.parallel.get("recompute", "none") not in ("none", "moe_act")),
        ("experts' padded slots", (t.get("engine") or {}).get("moe_pad_to_capacity")
         and p.model.get("routed_experts"))) if where]
    if not extras and pr["hardware_flops_per_step"] > pr["model_flops_per_step"] * (1 + 1e-6):
        extras = ["experts' empty token slots"]  # capacity-style experts' buffers
    unit = "image" if p.per_image else "token"
    lines = [f"  FLOPs       {pr['model_flops_per_token']:.3g} per {unit} for MFU "
             "(forward + backward), "
             f"{hardware:.3g} for TFLOP/s"
             + (f" (+ {', '.join(extras)})" if extras else
                " (the same: moe_act recomputes memory-bound ops only)"
                if p.parallel.get("recompute") == "moe_act" else " (the same: nothing recomputed)")]
    # (a convolution's weights, or an encoder's read by every decoder token, multiply a token
    # more than once: a count above the model's says nothing)
    if pr.get("active_params_per_token") and \
            pr["active_params_per_token"] <= p.model["num_params"] * (1 + 1e-9):
        lines += textwrap.wrap(
            f"{human_count(pr['active_params_per_token'])} of the "
            f"{human_count(p.model['num_params'])} parameters multiply each {unit}"
            + (f" ({_inactive_words(p)})"
               if pr["active_params_per_token"] < 0.99 * p.model["num_params"] else ""),
            100, initial_indent=" " * 14, subsequent_indent=" " * 14)
    return lines + _caveats(p)


def _inactive_words(p: Plan) -> str:
    """Why fewer parameters multiply a token than the model has, for this kind of model: a
    lookup table's rows (every model with an input embedding), the routed experts a token is not
    sent to, and the layers that run on fewer tokens than the plan counts (a vision model's
    later, downsampled stages; the other input of a model of two)."""
    why = ["a lookup table's rows, as the input embedding's, multiply none"]
    if p.model.get("routed_experts"):
        why.append("each token meets only the routed experts it is sent to")
    if p.model.get("image_tokens") or p.model.get("image_input") or \
            p.model.get("encoder_tokens"):
        why.append("layers that run on fewer tokens than counted (downsampled stages, the other "
                   "of two inputs) multiply each of them in part")
    return "; ".join(why)


def _caveats(p: Plan) -> list[str]:
    """What the trace could not price (ops without a FLOP formula), as plan solve warned when it
    made the plan, and how it priced frozen parameters."""
    lines = []
    unpriced = (p.provenance or {}).get("unpriced_ops") or []
    if unpriced:
        lines.append(f"  not priced  {len(unpriced)} kind(s) of op without a FLOP formula, costed "
                     f"by the bytes they move only: {unpriced_words(unpriced)}")
    frozen = p.model.get("frozen_params")
    if frozen:
        lines += wrap(f"  frozen      {frozen_words(frozen, p.model['num_params'])}: "
                      f"{FROZEN_PRICING}", indent="              ")
    return lines


RECIPE_WORDS = {"delayed": "delayed scaling (amax history)",
                "current": "current scaling (each tensor's own amax)",
                "block": "MXFP8 block scaling"}


def _sustained(f: dict, key: str) -> str:
    """', N% sustained' where the plan file records the GEMM share (files before 2026-12-02 do
    not)."""
    return f", {100 * f[key]:.0f}% sustained" if key in f else ""


def _without_flash(p: Plan) -> str:
    """' (v100: no FlashAttention)' where the plan's attention is materialized because a device
    of its cluster runs no FlashAttention (planner.api prices it so), else ''."""
    if engine_from_mapping(p.training.get("engine")).attention != "materialized":
        return ""
    names = set()
    for group in p.cluster.get("groups") or [p.cluster]:  # each with its spec (device mapping)
        try:
            device = get_device((group.get("spec") or {}).get("device", group.get("device", "")))
        except PlannerError:
            continue
        if not device.flash_attention:
            names.add(device.name)
    return f" ({', '.join(sorted(names))}: no FlashAttention)" if names else ""


def _fp8(p: Plan) -> list[str]:
    """What FP8 changed: the GEMM rate, the scaling, the weight copies, and the same plan in bf16."""
    f = p.predicted.get("fp8")
    if not f:
        return []
    step = p.predicted["step_time_s"]

    def peaks(d: dict) -> str:
        return (f"{d['gemm_peak_tflops']:,.0f} TFLOP/s peak" + _sustained(d, "gemm_efficiency")
                + f"; bf16 {d['bf16_peak_tflops']:,.0f}" + _sustained(d, "bf16_gemm_efficiency"))

    rates = ("; ".join(f"{g['group']}: {peaks(g)}" for g in f["groups"]) if "groups" in f
             else peaks(f))
    return [
        *wrap(f"  fp8         weight GEMMs on fp8 tensor cores ({rates}), inputs quantized with "
              f"{RECIPE_WORDS[f['recipe']]}; attention, norms, element-wise ops"
              + (", embedding and output layer" if f.get("outer_blocks_bf16", True) else "")
              + (", routed experts (their grouped GEMMs: the engine's fp8 converts plain Linear "
                 "layers only)" if f.get("experts_bf16") else "")
              + " in bf16; MFU is against the fp8 peak", indent=" " * 14),
        *wrap("              " + (
                  f"{gb1(f['weight_copy_bytes'])} of fp8 weight copies per GPU"
                  if f.get("linear", "te") == "te" else
                  "no fp8 weight copies (torchao casts every weight in each pass and saves 16-bit "
                  "inputs)") + f"; in bf16 this plan would take {f['bf16_step_time_s']:.4g} s "
              f"({f['bf16_step_time_s'] / step:.2f}x) and {gb1(f['bf16_peak_memory_bytes'])}"
              + (" (more than the GPU holds)" if not f.get("bf16_fits", f["bf16_peak_memory_bytes"]
                                                            <= p.cluster.get("device_memory_bytes",
                                                                             float("inf")))
                 else ""), indent=" " * 14),
    ]


def _per(p: Plan) -> str:
    """'per GPU', or 'per process' where the plan's cluster is CPU processes (the cpu preset)."""
    return "per process" if str(p.cluster.get("device", "")).startswith("cpu") else "per GPU"


def breakdown(p: Plan, bar_width: int = 24) -> list[str]:
    """The step time and its parts, largest first, each with its share and a bar."""
    step = p.predicted["step_time_s"]
    parts = sorted(((v, k) for k, v in p.predicted["breakdown"].items() if v > 0), reverse=True)
    cp = p.parallel.get("cp", 1) or 1  # (gradients and ZeRO shards span dp x cp ranks)
    rows = [(f"    {BREAKDOWN_WORDS.get(k, k)}"
             + (f" (dp x cp = {p.parallel['dp'] * cp} ranks)" if k == "dp_comm_s" and cp > 1
                else ""),
             seconds(v, 3), f"{100 * v / step:.1f}%", "#" * round(bar_width * v / step))
            for v, k in parts]
    wait = p.predicted.get("moe_host_wait_s")
    where = "compute and the pipeline bubble" if p.parallel.get("pp", 1) > 1 else "compute"
    host = textwrap.wrap(
        f"MoE layers waiting for the host to issue their many small ops make {seconds(wait, 3)} of "
        f"the step ({100 * wait / step:.0f}%, counted in {where}; engine moe_host_op_s: "
        f"{1e6 * engine_from_mapping(p.training.get('engine')).moe_host_op_s:.4g} us per op, "
        "fitted on published runs; "
        "README, MoE engine settings)", 100, initial_indent="      ",
        subsequent_indent="        ") if wait else []
    accuracy = textwrap.wrap(moe_accuracy(bool(wait)), 100, initial_indent="      ",
                             subsequent_indent="        ") if p.model.get("routed_experts") or \
        p.parallel.get("ep", 1) * p.parallel.get("etp", 1) > 1 else []
    return [f"  step time   {step:.4g} s, made of:", *table(rows, indent="  "), *host,
            *_imbalance(p), *accuracy]


IMBALANCE_SHARE = 0.01
"""Pipeline ranks whose work per micro-batch differs by more than this share of the busiest
rank's are named under the step's parts (_imbalance)."""


def _imbalance(p: Plan) -> list[str]:
    """Where the pipeline's ranks carry unequal work, what the others wait for the busiest: the
    parts above run along the busiest rank, so their compute holds this wait, which the Gantt
    chart shows as idle time (a new-user check read compute 94% and a bubble of 1.4% for a plan
    whose chart had the ranks idle 9.2%)."""
    pp = p.parallel.get("pp", 1)
    if pp <= 1 or not p.stages:
        return []
    work = [0.0] * pp  # per rank, seconds a micro-batch (its chunks' passes, no sends)
    for i, s in enumerate(p.stages):
        d = s["predicted"]
        rank = s.get("pipeline_rank", s.get("index", i) % pp)
        if not 0 <= rank < pp:
            return []
        work[rank] += d["time_per_microbatch_s"] - d.get("p2p_s", 0.0)
    busiest, mean = max(work), sum(work) / pp
    if busiest - mean <= IMBALANCE_SHARE * busiest:
        return []
    m = p.parallel["num_microbatches"]
    wait = m * (busiest - mean)
    step = p.predicted["step_time_s"]
    slow, fast = work.index(busiest), work.index(min(work))

    def t(x: float) -> str:  # (a thousand ms and more in seconds: a new user read '1.06e+03 ms')
        return seconds(x, 3) if x >= 0.9995 else f"{1e3 * x:.3g} ms"

    return textwrap.wrap(
        f"pipeline ranks unequal: rank {slow} computes {t(busiest)} a micro-batch "
        f"(sends apart), rank {fast} {t(min(work))} (mean {t(mean)}); the "
        f"others wait for it "
        f"{seconds(wait, 3)} of the step on average ({100 * wait / step:.0f}%, counted in the "
        "parts above, which run along the busiest rank)", 100, initial_indent="      ",
        subsequent_indent="        ")


def _overlap_off(p: Plan) -> str:
    """Where the engine asks for the overlapped expert all-to-all and the plan's configuration
    cannot run it (costmodels.experts.overlap_blockers), what it lacks: the software line names
    the setting, and the plan prices its all-to-alls exposed."""
    why = p.moe_overlap_blockers()
    return f"; moe_overlap not run here (it needs {' and '.join(why)})" if why else ""


def _tp_overlap_unused(p: Plan) -> str:
    """Where the engine pipelines tensor-parallel collectives (EngineSpec.tp_overlap) and the
    plan has none to pipeline (tp=1, or no sequence parallelism, which Megatron-Core's overlap
    needs), that the setting changes nothing here (settings.warn_tp_overlap_unused warns the
    same when the plan is made)."""
    if not engine_from_mapping(p.training.get("engine")).tp_overlap:
        return ""
    if p.parallel["tp"] == 1:
        return "; tp_overlap unused here (tp=1)"
    return "" if p.parallel["sequence_parallel"] else \
        "; tp_overlap unused here (it needs sequence parallelism)"


MOE_ACCURACY = ("accuracy: step times of mixtures of experts are this cost model's least certain: "
                "on the published Megatron-Core MoE runs its held-out median error is 16.5%, and "
                "some rows come out up to 2.5x too fast (Qwen3-30B-A3B dropless on H100; "
                "GPT-OSS-120B on B200 2x; docs/moe-accuracy.md)")
"""Said under an MoE plan's step time and under a what-if of one: the figures of
benchmarks/moe_runs.py --no-search (2026-12-07, sixth session: held out 16.5%; Qwen3-30B-A3B
dropless on 16 H100 +145%, GPT-OSS-120B on B200 +104% since 2026-12-07, seventh session: +122%
before its experts' bias loop was priced); rerun it and update these with the cost
model."""

MOE_HOST_CAVEAT = ("; where MoE layers wait for the host, as here, a faster precision or GPU "
                   "gains less than the published runs did (DeepSeek-V3 on 256 GB300 at its "
                   "published layout: FP8 13% faster than BF16, predicted equal), and a larger "
                   "micro-batch or CUDA graphs may gain more than they do (GPT-OSS-120B's "
                   "published throughput moved 5% from one sample per micro-batch to four)")
"""Added where the plan's (or a what-if point's) MoE layers wait for the host
(``moe_host_wait_s``): benchmarks/moe_runs.py rows 0 and 1 (2026-12-06), published 3,848 and 4,357
tokens/s per GPU, predicted 3,477 and 3,478 (3,530 and 3,435 on 2026-12-07, sixth session); rows
7 and 205 (GPT-OSS-120B on 64 GB200, one and four samples per micro-batch: published 15,876 and
16,640, predicted -1% and +79%: +4% and +87% before the experts' bias loop); NVIDIA's
Megatron-Core MoE report (arXiv 2603.07685, 4.3.6): partial CUDA graphs made DeepSeek-V3 on GB200
10% faster, where the host floor would give its MoE layers about 1.5x (docs/moe-accuracy.md)."""


def moe_accuracy(host_bound: bool) -> str:
    """MOE_ACCURACY, with MOE_HOST_CAVEAT where the MoE layers wait for the host."""
    return MOE_ACCURACY + (MOE_HOST_CAVEAT if host_bound else "")



def stage_table(p: Plan) -> list[str]:
    """One row per stage: its blocks, time per micro-batch and its parts (the context- and
    expert-parallel exchanges where the plan has them), memory and its parts."""
    groups = any("group" in st for st in p.stages)
    extra = [(key, words) for key, words in (("cp_comm_s", "cp comm"), ("ep_comm_s", "ep comm"))
             if any(key in st["predicted"] for st in p.stages)]
    rows = [("stage" + (" (group)" if groups else ""), "blocks", "time/mb", "compute", "tp comm",
             *(words for _, words in extra), "p2p", "memory", "weights+grads+optim",
             "activations (mb in flight)", "working")]
    for st in p.stages:
        pr = st["predicted"]
        mem = pr["memory_bytes"]
        states = (mem.get("weights", 0) + mem.get("grads", 0) + mem.get("optimizer", 0)
                  + mem.get("fp8_weights", 0))
        label = f"{st['index']} ({st['group']})" if "group" in st else str(st["index"])
        if p.parallel.get("vpp", 1) > 1:  # interleaved: say which rank runs this chunk
            label += f" (rank {st.get('pipeline_rank', st['index'] % p.parallel['pp'])})"
        rows.append((label, compress_names(st["blocks"]),
                     ms(pr["time_per_microbatch_s"]), ms(pr.get("compute_s", 0)),
                     ms(pr.get("tp_comm_s", 0)), *(ms(pr.get(key, 0)) for key, _ in extra),
                     ms(pr.get("p2p_s", 0)),
                     gb1(mem['total']), gb1(states),
                     f"{gb1(mem.get('activations', 0))} "
                     f"({pr.get('in_flight_microbatches', 1):.3g})",
                     gb1(mem['total'] - states - mem.get('activations', 0))))
    return table(rows, indent="  ")


def _ep_straddles(p: Plan) -> list[str]:
    """Where some pipeline ranks' expert-parallel groups span more nodes than others' (stages
    that do not line up with the nodes: 16-GPU stages on 72-GPU racks), which ranks, and why
    their ep comm is larger (a new-user check saw one stage's all-to-alls take 9x the others'
    with no word why)."""
    if p.parallel.get("ep", 1) <= 1 or any("group" in st for st in p.stages):
        return []
    cfg = Config(**{k: p.parallel[k] for k in KNOBS if k in p.parallel})
    gpn = p.cluster["gpus_per_node"]
    nodes = [g.nodes for g in placement.ep_groups_on(cfg, gpn)]
    if len(set(nodes)) <= 1:
        return []
    wide = [r for r, n in enumerate(nodes) if n > min(nodes)]
    ranks = ", ".join(map(str, wide))
    return wrap(f"  expert-parallel groups: pipeline rank{'s' if len(wide) > 1 else ''} {ranks} "
                f"span{'' if len(wide) > 1 else 's'} {max(nodes)} nodes, the others "
                f"{min(nodes)}: a stage of {cfg.dp * cfg.cp * cfg.tp} GPUs on nodes of {gpn} "
                "lines up with them or straddles two, and a straddling group's all-to-alls cross "
                "the inter-node link (its ep comm above)", indent="    ")


def _samples(x: float) -> str:
    """Samples per second: four significant digits, whole and grouped from 1,000 (not 4.894e+04)."""
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def _tflops(x: float) -> str:
    """TFLOP/s with one decimal, or three significant digits below 1 (a small model's 0.0289)."""
    return f"{x:,.1f}" if x >= 1 or x == 0 else f"{x:.3g}"


def _search(p: Plan) -> list[str]:
    s = p.search
    aside, ruled = rejection_lines(s.get("rejected", {}))
    timing = f" in {s['time_s']:.2f} s" if s.get("time_s") is not None else ""
    status = {"optimal": "best under the cost model", "feasible": "best found (time limit)",
              "fixed": "configuration fixed"}.get(s["status"], s["status"])
    rejected = s.get("rejected", {})
    if s["status"] == "feasible" and rejected.get(RETIME_CAP) and not rejected.get(TIME_LIMIT):
        status = (f"best found (re-timing cap: {RETIME_MAX} more schedules simulated; a plan "
                  "among those left might simulate faster)")
    check = s.get("groups_check")
    if check:  # (planner.search.hetero.refine_groups)
        status += ("; CP-SAT's check of the stages' groups and sizes: " + (
            "no answer in its time" if check["gap"] is None and check["status"] != "optimal" else
            check["status"] + (f" (gap {100 * check['gap']:.1f}%)" if check["gap"] else "")))
    layout = s.get("options", {}).get("layout")
    depths = p.model.get("mtp_depths")
    lines = [f"  search: {counted(s['candidates'], 'configuration')}, "
             f"{s.get('evaluated', 0):,} priced{timing}; "
             f"{status}"] + ([f"  stages pinned: --layout '{layout}'"] if layout else []) + (
        [f"  multi-token prediction: {depths} depth(s) priced {_mtp_where(p)}"]
        if depths else []) + ([f"  set aside: {aside}"] if aside else []) + (
        [f"  ruled out before pricing (choices of knobs, not configurations): {ruled}"]
        if ruled else [])
    alts = s.get("alternatives", [])
    if alts:
        lines.append("  runners-up, and why they lost:")
        for i, a in enumerate(alts, 2):
            lines += _runner_up(p, i, a)
    return lines


def _tie_reason(p: Plan, a: dict, mem: float) -> str:
    """Why the plan won a tie over the faster runner-up ``a`` (search.loop.tie_broken): an
    exported engine runs it and not the runner-up, or it holds less memory."""
    forms, dtype = p.model.get("attention_forms", ()), p.training["dtype"]
    kw = dict(experts=bool(p.model.get("routed_experts")), kv_heads=p.model.get("kv_heads", 0))
    if p.search.get("target", "any") == "any" and \
            targets.exported_runs(p.parallel, dtype, forms, **kw) and \
            not targets.exported_runs({**p.parallel, **a["parallel"]}, dtype, forms, **kw):
        return "an exported engine runs the plan, not this one"
    return "the plan holds less memory" if mem > 0 else "the plan chosen first"


def _mtp_where(p: Plan) -> str:
    """Where a plan prices its MTP depths: with the head, or on a stage of their own."""
    last = len(p.stages) - 1
    at = [s["index"] for s in p.to_dict()["stages"] if any(is_mtp_block(b) for b in s["blocks"])]
    if not at or at[0] == last:
        return "with the head on the last stage"
    return f"on stage {at[0]}, before the head's stage ({last})"


def _runner_up(p: Plan, i: int, a: dict) -> list[str]:
    """'3. tp 4 -> 8, dp 32 -> 16: 18.68 s (+1.5%), 31.6 GB (-29.3 GB)' and the parts that moved;
    knobs named as --fix and `plan diff` name them (micro_batch)."""
    knobs = ", ".join(f"{k} {knob(p.parallel.get(k))} -> {knob(v)}"
                      for k, v in a["parallel"].items()
                      if k != "num_microbatches" and p.parallel.get(k) != v) or "same knobs"
    rel = 100 * (a["step_time_s"] / p.step_time_s - 1)
    mem = a["peak_memory_bytes"] - p.predicted["peak_memory_bytes"]
    parts = a["why"].split(": ", 1)[1] if ": " in a["why"] else "no part of the step moved"
    tie = (f"; a tie, within {100 * TIE_SHARE:g}%: {_tie_reason(p, a, mem)}"
           if a["step_time_s"] < p.step_time_s else "")  # (search.loop.tie_broken)
    head = textwrap.wrap(f"{i}. {knobs}: {a['step_time_s']:.4g} s ({rel:+.1f}%{tie}), "
                         f"{gb1(a['peak_memory_bytes'])} {_per(p)} "
                         + (f"({'-' if mem < 0 else '+'}{gb1(abs(mem))})" if abs(mem) >= 1e6
                            else "(the same)"),
                         width=96, subsequent_indent="   ", break_on_hyphens=False)
    return [f"    {line}" for line in head] + [f"       {parts}"]
