"""Plan -> DeepSpeed config JSON, plus the pipeline stage boundaries under the extra key "planner".

DeepSpeed's config has no place for stage boundaries: they are arguments of
``deepspeed.pipe.PipelineModule`` in the training script. The export therefore adds one top-level
key, ``"planner"`` (DeepSpeed reads only the keys it knows), holding the header, the notes on what
is not expressed exactly, and the ``PipelineModule`` arguments (``parts``, topology, checkpoint
interval). When DeepSpeed runs only a nearby configuration that may need more memory (ZeRO-1
instead of ZeRO-2/3 in its pipeline engine, no sequence parallelism), the export re-prices the
plan's split under it (planner.export.reprice) and refuses when it no longer fits. Mapping table
and limits: docs/exports.md.
"""

from __future__ import annotations

import json

from costmodels.engine import engine_from_mapping
from costmodels.memory import every_words, layer_interval
from planner.errors import SpecError
from planner.options import pp_inner_refused
from planner.export import common, moe, replan
from planner.planfile.document import Plan
from planner import targets

TARGET = "deepspeed"
AXES = {"tp-dp-pp": ["pipe", "data", "model"], "tp-pp-dp": ["data", "pipe", "model"]}
"""deepspeed.runtime.pipe.topology.ProcessTopology axes, outermost first, per plan placement."""
AUTOEP_PRESETS = {"mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3"}
"""Hugging Face model type -> DeepSpeed 0.19.8's AutoEP preset_model
(deepspeed/module_inject/auto_ep_presets/registry.py: mixtral, qwen3_moe, qwen3_5_moe, deepseek_v2,
deepseek_v3, minimax_m3; none for gpt_oss)."""
HOW = ("deepspeed.pipe.PipelineModule(layers=[one LayerSpec per entry of 'layers', in order], "
       "num_stages, topology=ProcessTopology(axes, dims), activation_checkpoint_interval); stock "
       "partition_method values take no explicit boundaries, so set self.parts = parts in a "
       "PipelineModule subclass's _partition_layers")


def to_deepspeed(plan: Plan, version: str | None = None) -> str:
    """The plan as a DeepSpeed config for ``version`` (default: planner.targets' release)."""
    version = common.engine_version(TARGET, version)
    ledger = common.Ledger(TARGET, version)
    common.software_note(plan, TARGET, ledger)
    common.frozen_note(plan, TARGET, ledger)
    common.mtp_note(plan, TARGET, ledger)
    p, t = plan.parallel, plan.training
    changes: dict = {}
    raising: list[str] = []  # changes that may need more memory than planned
    lower: list[str] = []  # changes that need less
    if common.check_schedule(plan, TARGET, targets.engine(TARGET).schedules, ledger,
                             {"gpipe": "1f1b"}) != p["schedule"]:
        changes["schedule"] = "1f1b"
        lower.append("1F1B instead of GPipe")
    _check_context(plan)
    zero = _zero_stage(plan, ledger, changes, raising)
    _tp_notes(plan, ledger, changes, raising)
    extra = {"about": "Written by planner; DeepSpeed does not read this key. Stage boundaries and "
                      "recomputation are PipelineModule arguments in your script "
                      "(docs/exports.md).",
             "header": common.header(plan, TARGET, version)}
    ulysses = _ulysses(plan, ledger)
    config = _batch(plan, ledger, extra, ulysses)
    config["zero_optimization"] = {"stage": zero, **_overlap(plan, zero, ledger)}
    if p["tp"] > 1 and p["pp"] == 1:
        config["tensor_parallel"] = {"autotp_size": p["tp"]}
    if ulysses:
        config.update({"sequence_parallel_size": p["cp"], "data_parallel_size": p["dp"]})
        extra["sequence_parallel"] = {
            "size": p["cp"],
            "how": "DeepSpeed-Ulysses: deepspeed.initialize builds a (data_parallel, "
                   "sequence_parallel) device mesh from sequence_parallel_size and "
                   "data_parallel_size; wrap the attention with deepspeed.sequence.layer."
                   "DistributedAttention(attention, engine's sequence-parallel group), or for a "
                   "Hugging Face model call deepspeed.runtime.sequence_parallel.ulysses_sp."
                   f"UlyssesSPAttentionHF.register_with_transformers(..., sequence_parallel_size="
                   f"{p['cp']}, ...) and pass the mpu it returns; each rank reads 1/{p['cp']} of "
                   "every sample's tokens" + _copies_words(plan)}
        ledger.info(f"context parallelism cp={p['cp']} (Ulysses): the config sets "
                    "sequence_parallel_size; your script wraps the attention "
                    "(planner.sequence_parallel.how), or each rank attends over its own tokens "
                    "only")
    experts = _experts(plan, ledger, changes, raising)
    if experts:
        config["expert_parallel"], extra["experts"] = experts
    _offload(plan, ledger, config, extra)
    config.update(_precision(plan, ledger))
    extra["recompute"] = _recompute(plan, ledger, changes, lower)
    if p["pp"] > 1:
        extra["pipeline"] = _pipeline(plan, ledger)
    else:
        ledger.exact("pp", "stages")
    ledger.missing("seq_len", f"sequence length {t['seq_len']}: DeepSpeed's config has no such "
                   "setting; your data loader gives each sample's tokens")
    if (raising or common.layout_differs(plan, "zero")
            or common.kernels_differ(plan, TARGET)):
        from planner.export import reprice  # lazy: prices with the search (and may trace)
        ledger.info(reprice.recheck(plan, TARGET, ", ".join(raising + lower), state_layout="zero",
                                    required=bool(raising), **changes))
    else:
        common.layout_note(plan, TARGET, "zero", ledger)
    extra["not_expressed"] = ledger.close()
    order = ["about", "header", "not_expressed", "batch", "sequence_parallel", "experts", "offload",
             "recompute", "pipeline"]
    return dumps({"planner": {k: extra[k] for k in order if k in extra}, **config}) + "\n"


def _copies_words(plan: Plan) -> str:
    """Where the plan's cp exceeds the model's key/value heads (model.kv_heads): which of
    DeepSpeed's Ulysses wrappers copies them, as planned."""
    cp, heads = int(plan.parallel.get("cp", 1)), int(plan.model.get("kv_heads", 0) or 0)
    if not heads or cp <= heads or cp % heads:
        return ""
    return (f". The model's {heads} key/value heads are fewer than {cp}: UlyssesSPAttentionHF "
            f"copies each {cp // heads} times before its all-to-all, as planned; "
            f"DistributedAttention needs them divisible by {cp}")


def _batch(plan: Plan, ledger: common.Ledger, extra: dict, ulysses: bool) -> dict:
    """The batch settings. DeepSpeedConfig asserts train_batch_size = micro x accumulation x the
    data-parallel world an mpu gives (the PipelineModule's grid when pp > 1), or every GPU without
    one (AutoTP), divided by sequence_parallel_size when set (Ulysses): when GPUs that read the
    same samples are left in that world, the size is left for DeepSpeed to derive."""
    p, t = plan.parallel, plan.training
    ledger.exact("micro_batch", "num_microbatches", "global_batch", "dp", "placement")
    common.site_stages(plan, ledger)
    if common.replica_sites(plan, ledger) > 1:
        ledger.nearest("dp_replicate", "data parallel across sites: DeepSpeed's ZeRO reduces the "
                       "gradients over every data-parallel rank at once (its hierarchical "
                       "partitioning, ZeRO++'s zero_hpz_partition_size, applies to ZeRO-3 weights "
                       "only), not inside each site first: more bytes cross the sites than "
                       "planned; megatron (--num-distributed-optimizer-instances) or torchtitan "
                       "(HSDP) reduce as priced")
    config = {"train_batch_size": t["global_batch"],
              "train_micro_batch_size_per_gpu": p["micro_batch"],
              "gradient_accumulation_steps": p["num_microbatches"]}
    cp = p.get("cp", 1) if not ulysses else 1
    if p["pp"] == 1 and (p["tp"] > 1 or cp > 1):
        del config["train_batch_size"]
        sharing = [(n, w) for n, w in ((p["tp"], "tensor"), (cp, "context")) if n > 1]
        kinds = " and ".join(f"{w}-parallel" for _, w in sharing)
        group = " x ".join(f"{n} {w}-parallel" for n, w in sharing)
        extra["batch"] = {
            "global_batch": t["global_batch"],
            "why": "train_batch_size is left for DeepSpeed to derive: without an mpu"
                   f"{' (AutoTP)' if cp == 1 else ''} its batch check counts every GPU, {kinds} "
                   "ones included, as data-parallel (train_batch_size = micro x accumulation x "
                   f"{plan.cluster['num_gpus']} GPUs), so the {t['global_batch']} samples of the "
                   f"plan would fail it; the {group} GPUs of a group read the same samples"}
    return config


def _overlap(plan: Plan, zero: int, ledger: common.Ledger) -> dict:
    """overlap_comm as the plan was priced (EngineSpec.overlap_grad_reduce; DeepSpeed's default
    is on for ZeRO-3 only, zero/config.py), and notes where DeepSpeed cannot hide what the plan
    hides: under its pipeline engine it turns overlap_comm off (runtime/engine.py: "Pipeline
    parallelism does not support overlapped communication"), ZeRO-0 all-reduces after the
    backward (engine.allreduce_gradients), and the ZeRO-1/2 optimizer gathers the updated
    weights inside its step (EngineSpec.overlap_param_gather)."""
    engine = engine_from_mapping(plan.training.get("engine"))
    p = plan.parallel
    if not engine.overlap_grad_reduce or p["dp"] * p.get("cp", 1) == 1:
        return {"overlap_comm": engine.overlap_grad_reduce} if zero >= 1 else {}
    if not engine.overlaps_reduction(zero=zero, pp=p["pp"]):  # priced as DeepSpeed runs it
        return {"overlap_comm": False} if zero >= 1 else {}
    if p["pp"] > 1:
        gathers = (" and gathers the updated weights inside its step" if zero in (1, 2)
                   and engine.overlap_param_gather else "")
        ledger.info(f"pp={p['pp']}: DeepSpeed's pipeline engine turns overlap_comm off "
                    f"(runtime/engine.py) and reduces the gradients after the last backward"
                    f"{gathers}, where the plan hides them: a slower step than planned, by up to "
                    "their time")
        return {}
    if zero == 0:
        ledger.info("ZeRO-0: DeepSpeed all-reduces the gradients after the backward "
                    "(engine.allreduce_gradients), where the plan hides the all-reduce behind it: "
                    "a slower step than planned, by up to the all-reduce's time (ZeRO-1 hides "
                    "it with overlap_comm)")
        return {}
    if zero <= 2 and engine.overlap_param_gather:
        ledger.info(f"ZeRO-{zero}: DeepSpeed's optimizer all-gathers the updated weights inside "
                    "its step, where the plan hides the gather behind the next forward: a slower "
                    "step than planned, by up to the all-gather's time (plans made with --engine "
                    "deepspeed price it so)")
    return {"overlap_comm": True}


def _check_context(plan: Plan) -> None:
    """SpecError for context parallelism with pipeline parallelism: DeepSpeed's pipeline engine
    lays ranks out by a ProcessTopology of pipe, data and model axes (runtime/pipe/topology.py,
    PipelineParallelGrid), which has no axis for ranks holding shards of the same samples."""
    p = plan.parallel
    if p.get("cp", 1) > 1 and p["pp"] > 1:
        raise SpecError(f"export deepspeed: context parallelism (cp={p['cp']}) with pp={p['pp']}: "
                        "DeepSpeed's pipeline engine (PipelineModule's topology of pipe, data and "
                        "model ranks) has no axis for sequence shards; re-plan for it with "
                        f"`{replan.resolve_hint(plan, TARGET, {'cp': 1})}`")
    if _runs_ulysses(p) and p.get("ep", 1) > 1 and p["zero"] == 3:
        raise SpecError(f"export deepspeed: ZeRO-3 with cp={p['cp']} and ep={p['ep']}: DeepSpeed's "
                        "engine refuses AutoEP with ZeRO stage 3 under sequence parallelism "
                        "(runtime/engine.py); re-plan for it with "
                        f"`{replan.resolve_hint(plan, TARGET)}`")


def _runs_ulysses(p: dict) -> bool:
    """Whether the export hands the plan's context parallelism to DeepSpeed-Ulysses (_ulysses)."""
    return p.get("cp", 1) > 1 and p.get("cp_comm", "p2p") == "a2a" and p["tp"] == 1


def _ulysses(plan: Plan, ledger: common.Ledger) -> bool:
    """Whether DeepSpeed-Ulysses expresses the plan's context parallelism: all-to-all over heads
    (cp_comm a2a) without tensor parallelism (AutoTP builds its own data x tensor mesh over every
    rank, deepspeed/utils/groups.py _init_tp_mesh_device, and no DeepSpeed path combines it with
    the sequence-parallel mesh)."""
    p = plan.parallel
    cp, form = p.get("cp", 1), p.get("cp_comm", "p2p")
    if cp == 1:
        ledger.exact("cp", "cp_comm")
        return False
    if _runs_ulysses(p):
        ledger.exact("cp", "cp_comm")
        return True
    if form != "a2a":
        ledger.missing(("cp", "cp_comm"), f"context parallelism cp={cp} with K/V exchange {form}: "
                       "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads, "
                       "cp_comm a2a) only; your model must split the sequence itself (a ring or "
                       f"all-gather attention, and {_sequence_mpu(p)}); train_batch_size is left "
                       "for DeepSpeed to derive (see batch)")
    else:
        ledger.missing(("cp", "cp_comm"), f"context parallelism cp={cp} (Ulysses) with "
                       f"tp={p['tp']}: DeepSpeed's AutoTP builds its own data x tensor mesh over "
                       "every rank (utils/groups.py _init_tp_mesh_device) and does not combine "
                       "with the Ulysses sequence-parallel mesh; your model must split the "
                       f"sequence itself (and {_sequence_mpu(p)}); train_batch_size is left for "
                       "DeepSpeed to derive (see batch)")
    return False


def _sequence_mpu(p: dict) -> str:
    """What an mpu must give DeepSpeed for context parallelism it does not run itself: the
    engine reduces gradients and shards ZeRO states over the mpu's sequence-data-parallel group
    where it has one, else over its data-parallel group (utils/groups.py
    _get_sequence_data_parallel_group), which the batch check counts too."""
    return (f"an mpu whose data-parallel group is the {p['dp']} ranks holding other samples and "
            f"whose get_sequence_data_parallel_group spans the {p['dp'] * p['cp']} dp x cp ranks: "
            "DeepSpeed reduces gradients and shards ZeRO states over that group, and without it "
            "over the data-parallel group only, leaving the cp ranks' gradients unreduced")


def _experts(plan: Plan, ledger: common.Ledger, changes: dict,
             raising: list[str]) -> tuple[dict, dict] | None:
    """Expert parallelism: DeepSpeed's own MoE layer (deepspeed.moe.layer.MoE) takes ep_size in
    the model's code, not in the config; DeepSpeed 0.19.8's AutoEP, which replaces a Hugging Face
    model's MoE blocks, takes it from the config's ``expert_parallel`` section
    (deepspeed/module_inject/auto_ep_config.py). (config section, planner.experts) or None."""
    p = plan.parallel
    ep, etp = p.get("ep", 1), p.get("etp", 1)
    facts, s = moe.model(plan), moe.settings(plan)
    if not facts.moe:
        ledger.exact("ep", "etp", *common.MOE_SETTINGS)
        return None
    counts = (f"{facts.experts} routed experts" + (f", top-{facts.top_k}" if facts.top_k else "")
              if facts.experts else "the model's experts")
    drop = (f"capacity_factor={s['moe_capacity_factor']:g}" if s["moe_capacity_factor"] else
            "drop_tokens=False")
    # the layer splits its experts over the model's own tensor-parallel group, or not at all
    split = ", enable_expert_tensor_parallelism=True" if etp > 1 else ""
    code = (f"deepspeed.moe.layer.MoE(hidden_size, expert, num_experts="
            f"{facts.experts or '<experts>'}, ep_size={ep}, k={facts.top_k or '<top-k>'}, {drop}"
            f"{split}) "
            "in your model: DeepSpeed's MoE layer takes ep_size in code, not in the config"
            + (" (and not with ZeRO-3: DeepSpeed's engine refuses its native MoE there)"
               if p["zero"] == 3 else "")
            + ("; that layer pads every expert to its capacity, which the plan priced without "
               "(moe_pad_to_capacity=true prices it)"
               if s["moe_capacity_factor"] and not s["moe_pad_to_capacity"] else ""))
    info = {"ep_size": ep, "experts": counts, "routing": moe.imbalance_words(plan)}
    if ep == 1:
        ledger.exact("ep", "etp", "moe_dispatcher", "moe_overlap", "moe_shared_overlap")
        ledger.dropless(s, "the model's own MoE layer (ep 1)")
        # with ep = 1 the model's own experts run: a Hugging Face model's experts_implementation
        # defaults to grouped_mm (transformers' get_correct_experts_implementation), the grouped
        # GEMMs the trace priced
        ledger.exact("moe_grouped_gemm")
        return None
    why = _autoep_refuses(plan)
    if why:
        ledger.missing(("ep", "etp"), f"ep={ep}" + (f" etp={etp}" if etp > 1 else "") +
                       f": DeepSpeed 0.19.8's AutoEP {why}; build the experts with {code}")
        if etp > 1 and etp != p["tp"]:
            ledger.nearest("etp", f"etp={etp}: DeepSpeed's MoE layer splits its experts over "
                           f"the tensor-parallel group (tp={p['tp']}) or not at all; nearest etp "
                           f"{p['tp']}, the expert memory and step time differ from planned")
            changes["etp"] = p["tp"]
            if p["tp"] < etp:
                raising.append(f"experts split {p['tp']} ways (etp {p['tp']})")
        _moe_layer_settings(plan, s, ledger)
        return None
    ledger.exact("ep")
    if etp > 1:
        changes["etp"] = 1
        raising.append("whole expert matrices (etp 1)")
        ledger.nearest("etp", f"etp={etp}: DeepSpeed 0.19.8's AutoEP reserves "
                       "expert_tensor_parallel_size and accepts 1 only (auto_ep_folding.py, "
                       "validate_folding_global); nearest etp 1: more memory than planned "
                       "(re-checked below)")
    else:
        ledger.exact("etp")
    section = {"enabled": True, "autoep_size": ep, "expert_tensor_parallel_size": 1}
    preset = AUTOEP_PRESETS.get(facts.model_type)
    if preset:
        section["preset_model"] = preset
    elif plan.model.get("source", "zoo") in ("zoo", "hf-config"):
        ledger.info(f"expert_parallel: DeepSpeed 0.19.8's AutoEP has no preset for "
                    f"{plan.model['name']}; it tries its presets' patterns, else set "
                    "moe_layer_pattern, router_pattern and expert_pattern (and the expert weight "
                    "names) in the expert_parallel section for your model")
    else:
        ledger.info(f"expert_parallel: AutoEP replaces Hugging Face-style MoE blocks; for "
                    f"{plan.model['name']} set moe_layer_pattern, router_pattern and "
                    f"expert_pattern in the expert_parallel section, or build the experts with "
                    f"{code}")
    section["use_grouped_mm"] = bool(s["moe_grouped_gemm"])
    ledger.exact("moe_grouped_gemm")
    section.update(_autoep_settings(plan, s, ledger))
    info["how"] = ("AutoEP (the expert_parallel section) replaces the model's Hugging Face MoE "
                   f"blocks at deepspeed.initialize; with experts of your own use {code}")
    return section, info


def _moe_layer_settings(plan: Plan, s: dict, ledger: common.Ledger) -> None:
    """The MoE settings under DeepSpeed's own MoE layer (deepspeed/moe: sharded_moe.py's MOELayer
    dispatches by all-to-all; experts.py runs each local expert apart; the capacity is the
    layer's argument, which the code the export suggests passes)."""
    ledger.exact("moe_capacity_factor", "moe_pad_to_capacity")
    if s["moe_dispatcher"] != "alltoall":
        ledger.nearest("moe_dispatcher", f"moe_dispatcher {s['moe_dispatcher']}: DeepSpeed's MoE "
                       "layer dispatches by all-to-all; nearest all-to-all, the step time differs "
                       "from planned")
    else:
        ledger.exact("moe_dispatcher")
    if s["moe_grouped_gemm"]:
        ledger.nearest("moe_grouped_gemm", "moe_grouped_gemm: DeepSpeed's MoE layer runs its "
                       "local experts one after another (deepspeed/moe/experts.py), not as "
                       "grouped GEMMs; the step time differs from planned")
    else:
        ledger.exact("moe_grouped_gemm")
    _overlap_notes(plan, s, ledger, "DeepSpeed's MoE layer")


def _overlap_notes(plan: Plan, s: dict, ledger: common.Ledger, who: str) -> None:
    """The all-to-all and shared-expert overlaps, which neither of DeepSpeed's MoE paths runs:
    not expressed where the plan priced them running (an overlap its configuration does not run
    was priced exposed too)."""
    runs = {"moe_overlap": s["moe_overlap"] and not plan.moe_overlap_blockers(),
            "moe_shared_overlap": s["moe_shared_overlap"]}
    for knob, what in (("moe_overlap", "its all-to-alls with compute"),
                       ("moe_shared_overlap", "a shared expert with the dispatch")):
        if runs[knob]:
            ledger.missing(knob, f"{knob}: {who} does not overlap {what}; the all-to-alls run "
                           "exposed (a slower step than planned)")
        else:
            ledger.exact(knob)


def _autoep_refuses(plan: Plan) -> str:
    """Why DeepSpeed 0.19.8's AutoEP cannot run the plan's expert parallelism, or ''
    (runtime/engine.py _configure_expert_parallel; module_inject/auto_ep_folding.py)."""
    p = plan.parallel
    if p["tp"] > 1 and p["pp"] > 1:
        return ("refuses tensor model parallelism from an mpu (\"AutoEP does not currently support "
                "tensor model parallelism from mpu\"), which the pipeline engine's grid gives")
    if p["tp"] > 1 and p.get("offload_optimizer"):
        return "refuses ZeRO offload with AutoTP folding (validate_folding_global)"
    return ""


def _autoep_settings(plan: Plan, s: dict, ledger: common.Ledger) -> dict:
    """The expert_parallel settings of the dispatch (auto_ep_config.py): DeepEP's buffer holds
    the tokens one rank routes, the micro-batch's share of the sequence on it."""
    out = {}
    p = plan.parallel
    dtype = plan.training["dtype"]
    if s["moe_dispatcher"] == "deepep" and p["tp"] > 1:
        ledger.nearest("moe_dispatcher", f"moe_dispatcher deepep with tp={p['tp']}: AutoEP "
                       "runs DeepEP without folded tensor parallelism (auto_ep_layer.py); nearest "
                       "all-to-all (comm_backend \"comm\"), the step time differs from planned")
    elif s["moe_dispatcher"] == "deepep" and dtype not in ("bf16", "fp8"):
        ledger.nearest("moe_dispatcher", f"moe_dispatcher deepep in {dtype}: AutoEP's DeepEP "
                       "dispatches bfloat16 only (auto_ep_comm.py); nearest all-to-all "
                       "(comm_backend \"comm\"), the step time differs from planned")
    elif s["moe_dispatcher"] == "deepep":
        tokens = p["micro_batch"] * -(-plan.training["seq_len"] // p.get("cp", 1))
        out = {"comm_backend": "deepep", "comm_max_tokens_per_rank": tokens}
        ledger.exact("moe_dispatcher")
    elif s["moe_dispatcher"] != "alltoall":
        ledger.nearest("moe_dispatcher", f"moe_dispatcher {s['moe_dispatcher']}: AutoEP "
                       "dispatches tokens by all-to-all (comm_backend \"comm\") or DeepEP; "
                       "nearest all-to-all, the step time differs from planned")
    else:
        ledger.exact("moe_dispatcher")
    ledger.dropless(s, "AutoEP")
    _overlap_notes(plan, s, ledger, "AutoEP")
    return out


def _zero_stage(plan: Plan, ledger: common.Ledger, changes: dict, raising: list[str]) -> int:
    p = plan.parallel
    zero, runs = p["zero"], targets.engine(TARGET).zero_with_pp
    nearest = common.exported_zero(plan, TARGET)
    if nearest != zero:
        changes["zero"] = nearest
        raising.append(f"ZeRO-{nearest} instead of the plan's ZeRO-{zero}")
        ledger.nearest("zero", f"ZeRO-{zero} with pp={p['pp']}: DeepSpeed's pipeline engine runs "
                       f"ZeRO stages {', '.join(map(str, runs))} only (deepspeed/runtime/pipe/"
                       f"engine.py asserts it); nearest ZeRO-{nearest}: more memory for the model "
                       "states than planned (the whole re-checked below, with the other changes)")
        return nearest
    ledger.exact("zero")
    return zero


def _tp_notes(plan: Plan, ledger: common.Ledger, changes: dict, raising: list[str]) -> None:
    p = plan.parallel
    common.tp_overlap(plan, ledger, "DeepSpeed's AutoTP does not overlap its collectives with "
                      "the GEMMs")
    if p["tp"] == 1:
        ledger.exact("tp", "sequence_parallel")
        return
    if p["pp"] > 1:
        ledger.missing("tp", f"tp={p['tp']} with pp={p['pp']}: DeepSpeed's AutoTP (the "
                       "tensor_parallel key) does not combine with PipelineModule, so the "
                       "topology's 'model' axis only reserves the tensor-parallel ranks: the model "
                       "needs its own tensor-parallel layers (as in Megatron-DeepSpeed)")
    else:
        ledger.exact("tp")
    if p["sequence_parallel"]:
        changes["sequence_parallel"] = False
        raising.append("no sequence parallelism")
        ledger.nearest("sequence_parallel", "sequence parallelism: DeepSpeed has none (nor has "
                       "AutoTP); activations between the tensor-parallel regions stay replicated "
                       "unless your own tensor-parallel layers shard them (more activation memory "
                       "than planned, re-checked below)")
    else:
        ledger.exact("sequence_parallel")


def _offload(plan: Plan, ledger: common.Ledger, config: dict, extra: dict) -> None:
    ledger.exact("offload_optimizer")
    if not plan.parallel.get("offload_optimizer"):
        return
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    extra["offload"] = ("optimizer states and step on the host (ZeRO-Offload): let DeepSpeed build "
                        "the optimizer from an \"optimizer\" section (Adam/AdamW become "
                        "DeepSpeedCPUAdam, built on first use) or pass DeepSpeedCPUAdam; DeepSpeed "
                        "refuses a torch optimizer with offload unless zero_force_ds_cpu_optimizer "
                        "is false")


def _precision(plan: Plan, ledger: common.Ledger) -> dict:
    ledger.exact("dtype")
    dtype = plan.training["dtype"]
    if dtype == "fp8":
        recipe = plan.training.get("engine", {}).get("fp8_recipe", "current")
        ledger.missing("dtype", f"dtype fp8 ({recipe} scaling): DeepSpeed's config has no FP8 "
                       "training setting (bf16 is set); the FP8 GEMMs come from Transformer "
                       "Engine layers in your model run under te.fp8_autocast with that recipe")
        dtype = "bf16"
    return {"bf16": {"enabled": dtype == "bf16"},
            "fp16": {"enabled": True, "loss_scale": 0} if dtype == "fp16" else {"enabled": False}}


def _recompute(plan: Plan, ledger: common.Ledger, changes: dict, lower: list[str]) -> dict:
    rc = plan.parallel["recompute"]
    if rc not in ("none", "full"):
        changes["recompute"] = "full"
        lower.append(f"full instead of {rc} recomputation")
        k = layer_interval(rc)
        what = f"{every_words(k)}, the others kept" if k else {
            "selective": "attention core only", "op": "per op",
            "moe_act": "the experts' activation function and the norm before them",
            "mla_up_proj": "latent attention's up projections and rotary embedding",
            "mla_up_proj+moe_act": "latent attention's up projections and the experts' "
                                   "activation function"}[rc]
        ledger.nearest("recompute", f"recompute {rc} ({what}): DeepSpeed checkpoints whole "
                       "layers; nearest is checkpointing every layer (more recompute time than "
                       "planned, less memory)" + ("" if plan.parallel["pp"] > 1 else
                                                  ", which without a pipeline the model does "
                                                  "itself (planner.recompute.how)"))
    elif rc == "full" and plan.parallel["pp"] == 1:
        ledger.missing("recompute", "recompute full: DeepSpeed's config cannot turn it on without "
                       "a pipeline; checkpoint each layer in the model (planner.recompute.how), "
                       "or activations take more memory than planned")
    else:
        ledger.exact("recompute")
    interval = 0 if rc == "none" else 1
    how = ("PipelineModule(activation_checkpoint_interval=...)" if plan.parallel["pp"] > 1 else
           "checkpoint each layer in the model (deepspeed.checkpointing.checkpoint, or "
           "gradient_checkpointing_enable() on a Hugging Face model)" if interval else
           "no activation checkpointing")
    return {"plan": rc, "activation_checkpoint_interval": interval, "how": how}


def _pipeline(plan: Plan, ledger: common.Ledger) -> dict:
    p = plan.parallel
    if p["schedule"] == "gpipe":
        ledger.nearest("schedule", "schedule GPipe: DeepSpeed's pipeline engine runs 1F1B (its "
                       "TrainSchedule), which has the same bubble and keeps fewer micro-batches in "
                       "flight (less memory than planned)")
    ledger.exact("pp", "vpp")
    lay = common.layout(plan)
    if not lay.stacks:
        ledger.info("the model has no repeated layer list: PipelineModule runs its layers as a "
                    "sequence, each output feeding the next, so a model that branches (a DAG) "
                    "must first be rewritten as such a sequence")
    if plan.model.get("tied_embeddings") and p["pp"] > 1:
        ledger.info(f"{plan.model['name']} ties its input embedding and output head (one weight), "
                    "which the first and the last stage hold: give both one "
                    "deepspeed.pipe.TiedLayerSpec (one key) so that its pipeline engine reduces "
                    "their gradients across the stages, as planned; two LayerSpecs would train "
                    "two copies apart")
    bounds = [0]
    for st in plan.stages:
        bounds.append(bounds[-1] + len(st["blocks"]))
    ledger.exact("stages")
    out = {"num_stages": p["pp"], "how": HOW, "topology": _topology(plan, ledger),
           "partition_method": None, "parts": bounds}
    if lay.stacks and lay.even:
        out["even_alternative"] = ("the stages hold equal numbers of layers: "
                                   "partition_method='type:<decoder layer class name>' gives the "
                                   "same split without a subclass")
    out["layers"] = [b for st in plan.stages for b in st["blocks"]]
    out["stage_modules"] = [list(st["modules"]) for st in plan.stages]
    return out


def _topology(plan: Plan, ledger: common.Ledger) -> dict:
    """The pipeline's ProcessTopology; with experts spread over ranks, stages on blocks of
    consecutive ranks (pipe outermost), as AutoEP's expert groups assume (targets' deepspeed
    entry), whatever the plan's placement."""
    p, where = plan.parallel, common.placement(plan)
    if where == "tp-pp-dp" and pp_inner_refused(
            targets.engine(TARGET), pp=p["pp"], dp=p["dp"], tp=p["tp"], cp=p.get("cp", 1),
            ep=p.get("ep", 1), etp=p.get("etp", 1), experts=moe.model(plan).moe):
        where = "tp-dp-pp"
        ledger.nearest("placement", f"placement tp-pp-dp with ep={p['ep']}: DeepSpeed builds its "
                       "expert groups from consecutive ranks of a pipeline stage "
                       "(utils/groups.py), so the stages must be blocks of consecutive ranks; "
                       "the topology puts pipe outermost (tp-dp-pp), whose pipeline sends may "
                       "cross nodes where the plan kept them inside; "
                       f"`{replan.resolve_hint(plan, TARGET)}` plans for it")
    axes = AXES[where]
    size = {"pipe": p["pp"], "data": p["dp"], "model": p["tp"]}
    return {"class": "ProcessTopology", "axes": axes, "dims": [size[a] for a in axes]}


def dumps(obj, indent: str = "", inline: bool = False) -> str:
    """JSON with two-space indents; a list of scalars stays on one line when short or when it is
    one row of a list of lists (a stage's modules)."""
    inner = indent + "  "
    flat = json.dumps(obj, separators=(", ", ": "))
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if not isinstance(obj, list) or not obj or inline:
        return flat
    rows = all(isinstance(x, list) for x in obj)
    if not rows and not any(isinstance(x, dict) for x in obj) and len(flat) <= 96:
        return flat
    return ("[\n" + ",\n".join(inner + dumps(x, inner, inline=rows) for x in obj) + "\n"
            + indent + "]")
