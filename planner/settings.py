"""The training settings against the model and the cluster a search is for: refused where the
model or the target cannot take them (a routing imbalance beyond what its routing reaches, MoE
settings or recomputation a target does not run), adjusted where the hardware decides (attention
on a device without FlashAttention, the options narrowed to the target), and warned about where
they change nothing or are priced otherwise than written. ``prepared``: a planner.traced.Prepared
(its blocks, info and traced length)."""

from __future__ import annotations

import dataclasses
import logging

from costmodels.engine import (FUSED_ATTENTION, PRESET_PROPERTIES, PRESETS, EngineSpec,
                                engine_setting)
from costmodels.experts import copies_per_token, overlap_blockers
from costmodels.memory import layer_interval, modules_of
from planner import targets
from planner.errors import SpecError
from planner.options import SearchOptions, TrainingSpec, engine_spec, parse_layout
from planner.search.feasibility import cluster_pin_problem, recompute_pin_problem
from planner.search.layout import layout_problem
from planner.search.space import cp_chunks

log = logging.getLogger("planner.api")  # the API's lines, which a sweep holds back together


def note_written_attention(prepared, training: TrainingSpec) -> None:
    """Warn where a model of the user's own code computes attention with its own matmul and
    softmax while the engine prices a fused kernel: not what the code writes (a new-user check
    found 22.7 GB priced where the scores in memory take 40.7 GB)."""
    if prepared.info.get("source") not in ("factory", "module") or \
            training.engine.attention not in FUSED_ATTENTION:
        return
    if any(g.attention for b in prepared.blocks.blocks for g in b.work.gemms):  # (eager cores)
        log.warning("%s computes attention with its own matmul and softmax: priced as one fused "
                    "kernel (engine attention=%s); where training runs this code as written, "
                    "--engine attention=materialized prices its scores in memory",
                    prepared.info["name"], training.engine.attention)


def attention_the_devices_run(cluster, training: TrainingSpec) -> TrainingSpec:
    """``training`` with FlashAttention replaced by attention with its scores in memory where a
    device of ``cluster`` has no FlashAttention kernel (DeviceSpec.flash_attention), with a
    warning."""
    devices = [g.device for g in getattr(cluster, "groups", (cluster,))]
    without = sorted({d.name for d in devices if not d.flash_attention})
    if training.engine.attention != "flash" or not without:
        return training
    log.warning("%s has no FlashAttention kernel (it needs sm80 or newer): attention is priced "
                "with its scores in memory, as Megatron-LM runs it there (engine "
                "attention=materialized)", " and ".join(without))
    return dataclasses.replace(training, engine=dataclasses.replace(training.engine,
                                                                    attention="materialized"))


def check_routing(prepared, training: TrainingSpec) -> None:
    """Refuse a routing imbalance, or a capacity every expert is padded to, beyond what the
    model's routing reaches (_routing_problem). Capacity-style experts are left out: their slots
    do not follow the routing (BlockWork.expert_capacity), so any imbalance prices them alike."""
    for b in prepared.blocks.blocks:
        w = b.work
        if not w.num_experts or not w.routed_tokens or w.expert_capacity:
            continue
        top_k = float(copies_per_token(w.routed_tokens, prepared.seq_len, w.moe_layers))
        problem = routing_problem(training.engine, w.num_experts, top_k,
                                   prepared.info.get("name", "the model"))
        if problem:
            raise SpecError(problem)


def routing_problem(engine: EngineSpec, experts: float, top_k: float, name: str) -> str:
    """'' or why the engine's routing settings ask more than E experts with top-k routing
    reach: an expert takes at most one copy of each token, so the busiest carries at most E / k
    times the mean, and a capacity every expert is padded to (EngineSpec.moe_pad_to_capacity)
    is filled up to that much (Megatron-Core gives an expert every token when its capacity is
    larger, and its unfused permutation cannot pad beyond them)."""
    most = experts / top_k
    if engine.moe_imbalance > most * (1 + 1e-9) and not engine.moe_pad_to_capacity:
        return (f"engine.moe_imbalance: {engine.moe_imbalance:g} is more than {name}'s routing "
                f"allows: {experts:g} experts, top-{top_k:g}, so the busiest expert takes at most "
                f"{most:g} x the mean (a copy of every token); give at most {most:g}")
    if engine.moe_pad_to_capacity and engine.moe_capacity_factor > most * (1 + 1e-9):
        return (f"engine.moe_capacity_factor: {engine.moe_capacity_factor:g} with "
                f"moe_pad_to_capacity is more than {name}'s routing fills: {experts:g} experts, "
                f"top-{top_k:g}, so an expert gets at most {most:g} x the mean (a copy of every "
                f"token); give at most {most:g}")
    return ""


def target_engine(engine, target: str) -> EngineSpec:
    """The engine planner.plan prices with: ``engine`` (what --engine takes) over the preset of
    ``target``'s software when it names no preset itself (settings given alone go over it)."""
    software = targets.engine(target).software
    if software and not _names_software(engine):
        engine = software if engine is None else (
            f"{software},{engine}" if isinstance(engine, str) else {**PRESETS[software], **engine})
        log.info("priced as %s runs it (--engine %s; name another preset in --engine for other "
                 "software)", target, engine if isinstance(engine, str) else software)
    return engine_spec(engine)


def _names_software(engine) -> bool:
    """Whether an ``engine`` argument says which software it is: an EngineSpec, or a preset named
    in its ``k=v`` text (``megatron-core,moe_dispatcher=deepep``); settings alone do not."""
    if engine is None:
        return False
    if isinstance(engine, str):
        return any(part.strip() in PRESETS for part in engine.split(","))
    return isinstance(engine, EngineSpec)


def warn_unused_settings(prepared, training: TrainingSpec,
                          fix: dict | None = None) -> None:
    """Say so when engine settings are given that change nothing here: MoE settings for a model
    without routed experts, the expert all-to-alls' settings with ep pinned to 1, a capacity
    factor under balanced routing, an FP8 recipe for a step not in fp8 (a user comparing plans
    would otherwise not know)."""
    fix = fix or {}
    default = EngineSpec()
    if training.dtype != "fp8" and _given(training.engine, "fp8_experts"):
        log.warning("engine.fp8_experts: applies to --dtype fp8 only (whether the experts' GEMMs "
                    "run in FP8); this %s plan does not use it", training.dtype)
    if training.dtype != "fp8" and _given(training.engine, "fp8_linear"):
        log.warning("engine.fp8_linear: applies to --dtype fp8 only (whose FP8 Linear runs the "
                    "GEMMs); this %s plan does not use it", training.dtype)
    if training.dtype != "fp8" and training.engine.fp8_recipe != default.fp8_recipe:
        log.warning("engine.fp8_recipe: %s applies to --dtype fp8 only; this %s plan does not "
                    "use it", training.engine.fp8_recipe, training.dtype)
    if training.engine.fsdp_experts and not training.engine.fsdp_copies:
        log.warning("engine.fsdp_experts: applies with fsdp_copies=true (FSDP2's buffer copies, "
                    "which it extends to the experts); without it, it changes nothing")
    if any(b.work.num_experts for b in prepared.blocks.blocks):
        if training.engine.moe_imbalance != default.moe_imbalance and all(
                b.work.expert_capacity for b in prepared.blocks.blocks if b.work.num_experts):
            log.warning("engine.moe_imbalance: %s's experts compute fixed buffers of token slots "
                        "(capacity-style), as large however tokens are routed; the imbalance "
                        "changes nothing here", prepared.info.get("name", "the model"))
        elif training.engine.moe_imbalance != default.moe_imbalance and \
                training.engine.moe_pad_to_capacity:
            log.warning("engine.moe_imbalance: with moe_pad_to_capacity every expert computes its "
                        "padded capacity however tokens are routed; the imbalance changes "
                        "nothing here")
        engine = training.engine
        if int(fix.get("ep", 0)) == 1 and engine.moe_overlap:
            log.warning("engine.moe_overlap: with ep=1 (pinned) there is no expert all-to-all to "
                        "overlap; moe_overlap changes nothing here")
        if int(fix.get("ep", 0)) == 1 and int(fix.get("etp", 0)) == 1 and \
                engine.moe_dispatcher != default.moe_dispatcher:
            log.warning("engine.moe_dispatcher: with ep=1 and etp=1 (pinned) no token leaves its "
                        "rank; moe_dispatcher=%s changes nothing here", engine.moe_dispatcher)
        if engine.moe_capacity_factor and not engine.moe_pad_to_capacity and \
                engine.moe_imbalance <= 1.0:
            log.warning("engine.moe_capacity_factor: under balanced routing (moe_imbalance=1.0) "
                        "no expert gets more than the mean, so a capacity factor drops nothing "
                        "and changes nothing here; give moe_imbalance (the busiest expert's "
                        "share)" + (" or moe_pad_to_capacity=true"
                                    if engine.moe_dispatcher != "deepep" else ""))
        elif engine.moe_capacity_factor and engine.moe_imbalance > engine.moe_capacity_factor:
            dropped = 1.0 - engine.moe_capacity_factor / engine.moe_imbalance
            log.warning("engine.moe_capacity_factor: %g with moe_imbalance %g drops tokens: the "
                        "busiest expert is routed %g x the mean and keeps %g x, so %.0f%% of its "
                        "token copies are dropped (not computed; the plan prices the kept ones and "
                        "does not say what dropping does to the model's quality); a capacity "
                        "factor of at least %g drops none", engine.moe_capacity_factor,
                        engine.moe_imbalance, engine.moe_imbalance, engine.moe_capacity_factor,
                        100 * dropped, engine.moe_imbalance)
        if engine.moe_shared_overlap and not any(
                g.shared_expert for b in prepared.blocks.blocks for g in b.work.gemms):
            log.warning("engine.moe_shared_overlap: %s has no shared expert (a GEMM of every "
                        "token beside the routed experts, inside their layer); "
                        "moe_shared_overlap changes nothing here",
                        prepared.info.get("name", "the model"))
        if training.engine.moe_overlap and training.engine.moe_dispatcher == "allgather":
            log.warning("engine.moe_overlap: the overlapped dispatch runs with the alltoall and "
                        "deepep dispatchers only (Megatron-Core refuses it with %s); no "
                        "configuration here overlaps it: drop moe_overlap or set "
                        "moe_dispatcher=alltoall",
                        training.engine.moe_dispatcher)
        return
    given = [f.name for f in dataclasses.fields(EngineSpec)
             if (f.name.startswith("moe_") and f.name not in PRESET_PROPERTIES
                 and getattr(training.engine, f.name) != getattr(default, f.name))
             # how the software runs a mixture of experts, set by its preset: said where given
             # otherwise than the preset sets it (a new-user check gave fp8_experts to a dense
             # fp8 plan and heard nothing; the preset's own value is no choice made), fp8_experts
             # outside fp8 said above
             or (f.name in PRESET_PROPERTIES and _given(training.engine, f.name)
                 and (f.name != "fp8_experts" or training.dtype == "fp8"))]
    if given:
        log.warning("engine.%s: %s has no routed experts; %s change%s nothing here", given[0],
                    prepared.info.get("name", "the model"), ", ".join(given),
                    "s" if len(given) == 1 else "")


def _for_runtime_encoder_decoder(options: SearchOptions, name: str) -> SearchOptions:
    """What plan run runs of an encoder-decoder: no context parallelism (its ring feeds each
    rank its positions, which T5, BART and Whisper do not take), and no zb-h1 (a later stage
    embeds the decoder's ids and computes its weight gradients inside B: the bubble zb-h1 prices
    as filled stays idle); a pin of either is refused (a new-user check saw both planned), and
    the search keeps cp at 1 as a pin would."""
    fix = dict(options.fix)
    if fix.get("cp", 1) > 1:
        raise SpecError(f"fix.cp: plan run runs context parallelism on decoder-only models, and "
                        f"{name} is an encoder-decoder; pin cp=1 or plan for another --target")
    if fix.get("schedule") == "zb-h1":
        raise SpecError(f"fix.schedule: plan run computes an encoder-decoder's weight gradients "
                        f"inside B where a stage embeds the decoder's ids ({name}), so zb-h1 "
                        "fills no bubble; pin 1f1b or plan for another --target")
    return dataclasses.replace(options, fix={**fix, "cp": 1},
                               schedules=tuple(s for s in options.schedules if s != "zb-h1"))


def _for_runtime_experts(options: SearchOptions, name: str) -> SearchOptions:
    """What plan run runs of a mixture of experts whose MoE layers are not transformers' experts
    interface (Llama 4's, a model of your own code): every rank holds every expert (ep = 1); a
    pin of more is refused (a review: planned, then refused by plan run)."""
    fix = dict(options.fix)
    if int(fix.get("ep", 1)) > 1:
        raise SpecError(f"fix.ep: plan run spreads over expert-parallel ranks the experts of "
                        f"transformers' MoE layers only, and {name}'s are its own code; pin ep=1 "
                        "or plan for another --target")
    return dataclasses.replace(options, fix={**fix, "ep": 1})


def with_layout(options: SearchOptions, prepared, hetero: bool = False) -> SearchOptions:
    """``options`` with a pinned pipeline layout (SearchOptions.layout) checked against the
    model's blocks and pp, and vpp pinned to the stages it makes; SpecError naming the fix."""
    if options.layout is None:
        return options
    if hetero:
        raise SpecError("layout: a pinned layout splits the stages for one kind of GPU; on a "
                        "cluster of several kinds leave the split to the search")
    fix = dict(options.fix)
    stages = len(parse_layout(options.layout))
    if stages == 1:  # one stage is pp=1 (a new-user check was asked to pin it)
        fix.setdefault("pp", 1)
    problem = layout_problem(options.layout, [b.recompute for b in prepared.blocks.blocks],
                             int(prepared.info.get("mtp_depths", 0) or 0), fix.get("pp"),
                             fix.get("vpp"))
    if problem:
        raise SpecError(problem)
    fix["vpp"] = stages // fix["pp"]
    if fix["vpp"] > 1 and "interleaved-1f1b" not in targets.engine(options.target).schedules:
        raise SpecError(f"layout: {stages} stages on pp={fix['pp']} are {fix['vpp']} chunks per "
                        f"pipeline rank, an interleaved schedule, which {options.target} does "
                        f"not run; use pp={stages} (one stage per rank) or another --target")
    return dataclasses.replace(options, fix=fix)


def narrowed(options: SearchOptions, prepared, training: TrainingSpec) -> SearchOptions:
    """``options`` narrowed to what the target runs for this model and software: an unknown
    target is refused, a known one keeps to what its engine runs (planner.plan has done so
    already: restricting again changes nothing), without optimizer offload where it does not
    offload the training's optimizer (targets.for_optimizer; a pin of it is refused); MoE
    settings it does not run are refused; a dense model has no moe_act recomputation to try, a model without latent attention no
    mla_up_proj, a model of fewer than k layers no full/k (a pin of one is refused, naming the
    fix)."""
    options = targets.for_optimizer(targets.restrict(options, options.target), training.optimizer)
    targets.check_dtype(options.target, training.dtype)
    stacks = [r.fqn for r in prepared.opgraph.repeats]
    engine = targets.engine(options.target) if options.target in targets.TARGETS else None
    if engine is not None and engine.one_layer_stack and len(stacks) != 1:
        has = (f"{len(stacks)} lists of layers ({', '.join(stacks)})" if stacks else
               "no list of repeated layers (3 or more of one class)")
        raise SpecError(f"target: {options.target} trains one transformer stack, and "
                        f"{prepared.info['name']} has {has}; plan with --target torchtitan, "
                        "deepspeed or any")
    if engine is not None and engine.one_layer_stack and targets.image_model(prepared.info):
        raise SpecError(f"target: {options.target} trains token sequences (pretrain_gpt.py's "
                        f"layout), and {prepared.info['name']} is an image model; plan with "
                        "--target torchtitan, deepspeed or any")
    if options.target == "torch" and prepared.info.get("encoder_tokens"):
        options = _for_runtime_encoder_decoder(options, prepared.info["name"])
    blocks = prepared.blocks.blocks
    experts = any(b.work.num_experts for b in blocks)
    if options.target == "torch" and experts and prepared.info.get("experts_own_code"):
        options = _for_runtime_experts(options, prepared.info["name"])
    latent = any(b.work.attn_keys_wider for b in blocks)
    targets.check_overlap(training.engine, options.target)
    if experts:  # (dense: a warning later)
        model_type = prepared.info.get("model_type")
        targets.check_engine(training.engine, options.target, model_type)
        options = targets.for_engine(options, training.engine, training.dtype)
        saving = engine.op_saves_all_to_all if engine is not None else None
        if saving is not None and model_type not in saving:
            options = dataclasses.replace(options, op_recompute_with_ep=False)
    layers = sum(1 for b in blocks if b.recompute)
    problem = recompute_pin_problem(dict(options.fix), int(experts), latent, layers)
    if problem:
        raise SpecError(problem)
    lacks = {"moe_act": "" if experts else "no routed experts",
             "mla_up_proj": "" if latent else "no latent attention"}
    left_out = [r for r in options.recompute if any(lacks[m] for m in modules_of(r))
                or layer_interval(r) > layers]  # (full/k on fewer than k layers: none)
    if not left_out:
        return options
    kept = tuple(r for r in options.recompute if r not in left_out)
    if not kept:
        missing = dict.fromkeys(lacks[m] for r in left_out for m in modules_of(r) if lacks[m])
        raise SpecError(f"recompute: {' and '.join(left_out)} "
                        + ("is the only policy" if len(left_out) == 1 else "are the only policies")
                        + " to try, and the model has nothing for them to recompute ("
                        + ", ".join(missing) + "); add none, selective or full")
    return dataclasses.replace(options, recompute=kept)


OVERLAP_HINT_SHARE = 0.10
"""Share of the step the exposed expert all-to-alls take above which a plan that could overlap
them says so (hint_overlap)."""


def idle_pins(fix: dict, cp: int, pp: int = 0, dp: int = 0) -> list[str]:
    """Pins a configuration with context-parallel degree ``cp``, pipeline degree ``pp`` and
    data-parallel degree ``dp`` (0: not known) does not use: the exchange form without context
    parallelism, ZB-H1 without a pipeline (priced as 1F1B there; the search may leave cp or pp at
    1 when only the form is pinned), ZeRO without a second replica to shard over.
    Not "changes nothing": with the form pinned, the plan without cp or pp may be the best left
    where a free search had chosen one."""
    notes = []
    if "cp_comm" in fix and cp == 1 and not (fix.get("cp") == 1 and fix["cp_comm"] == "p2p"):
        # (a plan's own parallel, a valid fix, records p2p at cp=1: no note for it)
        how = ("a cp whose ranks span nodes, more than one in each (e.g. cp=16 on nodes of 8 "
               "GPUs with tp=1), as its two levels need" if fix["cp_comm"] == "a2a+p2p" else
               f"e.g. cp=2,cp_comm={fix['cp_comm']}")
        notes.append(f"fix.cp_comm={fix['cp_comm']} is not used: the plan chosen has no context "
                     f"parallelism (cp=1); pin cp too ({how}) to make it use one")
    if fix.get("schedule") == "zb-h1" and pp == 1:  # (GPipe holds every micro-batch's
        # activations even without a pipeline; interleaving needs one)
        how = ("leave the schedule out, or pin pp > 1" if "pp" in fix else
               f"pin pp too (e.g. pp=2,schedule={fix['schedule']}) to make it use one")
        notes.append(f"fix.schedule={fix['schedule']} is not used: the plan chosen has no "
                     f"pipeline (pp=1); {how}")
    if int(fix.get("zero", 0)) > 0 and dp == 1 and cp == 1:  # (a new-user check: zero 0 -> 3
        # at dp=1 read "B takes as long as A" with nothing said)
        how = "leave zero out, or pin dp > 1" if "dp" in fix else "pin dp too (e.g. dp=2)"
        notes.append(f"fix.zero={fix['zero']} is not used: the plan chosen has one data-parallel "
                     f"replica (dp=1, cp=1), and ZeRO shards over the dp x cp ranks; {how}")
    return notes


def note_cp_limit(cfg, training: TrainingSpec, options: SearchOptions, num_gpus: int) -> None:
    """Say so when the search chose a cp it could not double only for SearchOptions.cp_min_tokens
    (a new-user check found cp=64 1.5% faster than the chosen cp=32 at 131k tokens, with nothing
    saying the search stops there)."""
    if cfg.cp <= 1 or "cp" in options.fix:
        return
    wider = 2 * cfg.cp  # (as --fix cp=wider takes it: the other degrees free, its chunks whole)
    if training.seq_len // wider >= options.cp_min_tokens or \
            training.seq_len % cp_chunks(wider, options) or \
            cluster_pin_problem({"cp": wider}, num_gpus, training.global_batch):
        return
    # (a warning, as the other advice after the search: a new-user check lost it under -q)
    log.warning("cp=%d is the widest context parallelism the search tries at %s tokens (each "
                "rank keeps at least %s: SearchOptions.cp_min_tokens); --fix cp=%d prices a wider "
                "one", cfg.cp, f"{training.seq_len:,}", f"{options.cp_min_tokens:,}", wider)


def hint_overlap(best, training: TrainingSpec, options: SearchOptions) -> None:
    """Warn when the engine leaves the expert all-to-alls exposed (moe_overlap off: Megatron-Core's
    default), they take OVERLAP_HINT_SHARE of the best plan's step or more, and its
    configuration could run them behind another micro-batch's compute on a target that offers
    it (a new-user check priced NVIDIA's DeepSeek-V3 layout 31% slower than published, its
    all-to-alls half the step, and nothing said what its release sets)."""
    engine, cfg, fix = training.engine, best.config, dict(options.fix)
    software = engine_setting(engine).split(",")[0]  # (the preset it is closest to)
    no_overlap = {targets.engine(t).software for t in targets.TARGETS
                  if targets.engine(t).software and not targets.engine(t).moe_overlap}
    if engine.moe_overlap or cfg.ep <= 1 or (options.target in targets.TARGETS and
                                             not targets.engine(options.target).moe_overlap) \
            or software.split("-")[0] in no_overlap:  # (software that does not run it)
        return
    share = best.breakdown.get("ep_comm_s", 0.0) / best.step_time_s if best.step_time_s else 0.0
    # what the search chose beside the all-to-alls (recomputation, virtual stages) it may choose
    # otherwise with the overlap: only pins block it
    pinned_vpp = "vpp" in fix or "schedule" in fix
    if share < OVERLAP_HINT_SHARE or overlap_blockers(
            engine, ep=cfg.ep, recompute=cfg.recompute if "recompute" in fix else "none",
            dtype=training.dtype, pp=cfg.pp, vpp=cfg.vpp if pinned_vpp else 2):
        return
    # (the shared expert's overlap and this one exclude each other: the re-plan drops it)
    setting = engine_setting(dataclasses.replace(engine, moe_shared_overlap=False))
    # what this configuration itself lacks for it (the search chose it without the overlap)
    lacks = overlap_blockers(engine, ep=cfg.ep, recompute=cfg.recompute, dtype=training.dtype,
                             pp=cfg.pp, vpp=cfg.vpp)
    # pins that make the re-plan try a configuration running it (a new-user check followed the
    # hint and got this very plan back, with a warning that the overlap does not run in it)
    pins = [p for p, need in (("recompute=selective", "no full recomputation"),
                              ("vpp=2", "virtual pipeline stages when pp > 1")) if need in lacks]
    log.warning("engine.moe_overlap: off, and this plan's expert all-to-alls take %.0f%% of its "
                "step exposed; Megatron-Core can run them behind another micro-batch's compute "
                "(--overlap-moe-expert-parallel-comm, which Megatron-Bridge's performance "
                "configurations set for DeepSeek-V3 and Qwen3-235B-A22B on H100): plan with "
                "--engine %s,moe_overlap=true to price that%s%s", 100 * share, setting,
                " (without moe_shared_overlap, which Megatron-Core runs only without this "
                "overlap)" if engine.moe_shared_overlap else "",
                f" (this configuration cannot run it, as the overlap needs {' and '.join(lacks)}; "
                "the search takes the overlap only where a configuration running it fits, and "
                "else gives this plan again" + (f": add --fix {','.join(pins)} to see whether "
                                                "one fits" if pins else "") + ")"
                if lacks else "")


def _given(engine: EngineSpec, name: str) -> bool:
    """Whether ``engine`` sets ``name`` otherwise than the preset nearest to it does (a setting the
    user gave, not one the software's preset carries)."""
    return any(part.startswith(name + "=") for part in engine_setting(engine).split(",")[1:])


def warn_ring_unused(cfg, training: TrainingSpec) -> None:
    """Warn when a cp_ring was given and the chosen plan runs no ring: no context parallelism, or
    its all-to-all over heads alone (a new-user check gave cp_ring=torch and saw the same numbers,
    with no word why)."""
    if not _given(training.engine, "cp_ring"):
        return
    if cfg.cp == 1 or cfg.cp_comm == "a2a":
        why = "has no context parallelism (cp=1)" if cfg.cp == 1 else \
            "exchanges K/V by all-to-all over heads (cp_comm=a2a), with no ring"
        log.warning("engine.cp_ring: says whose ring runs context parallelism's exchange, and the "
                    "chosen plan %s; cp_ring=%s changes nothing in it", why,
                    training.engine.cp_ring)


def warn_tp_overlap_unused(cfg, training: TrainingSpec) -> None:
    """Warn when tp_overlap was given and the chosen plan has nothing it overlaps: no tensor
    parallelism, or none with sequence parallelism (which Megatron-Core's --tp-comm-overlap
    requires, and the pricing follows)."""
    if not training.engine.tp_overlap or (cfg.tp > 1 and cfg.sequence_parallel):
        return
    if cfg.tp == 1:
        log.warning("engine.tp_overlap: the chosen plan has no tensor parallelism (tp=1); "
                    "tp_overlap changes nothing in it")
    else:
        log.warning("engine.tp_overlap: the chosen plan runs tp=%d without sequence parallelism, "
                    "which the overlap needs: its collectives are priced exposed (pin "
                    "sequence_parallel=true to price them overlapped)", cfg.tp)


def warn_dispatch_unused(cfg, training: TrainingSpec, fix: dict) -> None:
    """Warn when the plan the search chose dispatches no token, or splits no expert matrices,
    while a setting of that dispatch was given: moe_dispatcher with ep = etp = 1 (unless both
    were pinned, which warn_unused_settings names before the search), moe_etp_replicated with
    etp = 1 (set against its preset)."""
    engine = training.engine
    if cfg.ep * cfg.etp == 1 and engine.moe_dispatcher != EngineSpec().moe_dispatcher and \
            not (int(fix.get("ep", 0)) == 1 and int(fix.get("etp", 0)) == 1):
        log.warning("engine.moe_dispatcher: the chosen plan has ep=1 and etp=1, so no token "
                    "leaves its rank; moe_dispatcher=%s changes nothing in it (pin ep to "
                    "compare dispatchers)", engine.moe_dispatcher)
    if cfg.etp == 1 and _given(engine, "moe_etp_replicated"):
        log.warning("engine.moe_etp_replicated: says how the ranks of an expert-tensor-parallel "
                    "group dispatch, and this plan has etp=1; it changes nothing here")


def warn_overlap_off(cfg, training: TrainingSpec, fix: dict) -> None:
    """Warn when the engine asks for the overlapped expert all-to-all and the chosen
    configuration cannot run it (costmodels.experts.overlap_blockers; the plan prices its
    all-to-alls exposed), unless a warning before the search said so (ep pinned to 1, the
    allgather dispatcher)."""
    engine = training.engine
    if not engine.moe_overlap or engine.moe_dispatcher == "allgather" or \
            int(fix.get("ep", 0)) == 1:
        return
    why = overlap_blockers(engine, ep=cfg.ep, recompute=cfg.recompute, dtype=training.dtype,
                           pp=cfg.pp, vpp=cfg.vpp)
    if why:
        log.warning("engine.moe_overlap: not run by this plan's configuration (the overlapped "
                    "all-to-all needs %s; the search chose ep=%d, recompute=%s, pp=%d x vpp=%d); "
                    "its all-to-alls are priced exposed: pin a configuration that runs it (--fix), "
                    "or drop moe_overlap", " and ".join(why),
                    cfg.ep, cfg.recompute, cfg.pp, cfg.vpp)
