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

from planner.export import common
from planner.planfile.document import Plan
from planner import targets

TARGET = "deepspeed"
AXES = {"tp-dp-pp": ["pipe", "data", "model"], "tp-pp-dp": ["data", "pipe", "model"]}
"""deepspeed.runtime.pipe.topology.ProcessTopology axes, outermost first, per plan placement."""
HOW = ("deepspeed.pipe.PipelineModule(layers=[one LayerSpec per entry of 'layers', in order], "
       "num_stages, topology=ProcessTopology(axes, dims), activation_checkpoint_interval); stock "
       "partition_method values take no explicit boundaries, so set self.parts = parts in a "
       "PipelineModule subclass's _partition_layers")


def to_deepspeed(plan: Plan, version: str | None = None) -> str:
    """The plan as a DeepSpeed config for ``version`` (default: planner.targets' release)."""
    version = common.engine_version(TARGET, version)
    ledger = common.Ledger(TARGET, version)
    p, t = plan.parallel, plan.training
    changes: dict = {}
    raising: list[str] = []  # changes that may need more memory than planned
    lower: list[str] = []  # changes that need less
    if common.check_schedule(plan, TARGET, targets.engine(TARGET).schedules, ledger,
                             {"gpipe": "1f1b"}) != p["schedule"]:
        changes["schedule"] = "1f1b"
        lower.append("1F1B instead of GPipe")
    zero = _zero_stage(plan, ledger, changes, raising)
    _tp_notes(plan, ledger, changes, raising)
    extra = {"about": "Written by planner; DeepSpeed does not read this key. Stage boundaries and "
                      "recomputation are PipelineModule arguments in your script "
                      "(docs/exports.md).",
             "header": common.header(plan, TARGET, version)}
    config = _batch(plan, ledger, extra)
    config["zero_optimization"] = {"stage": zero}
    if p["tp"] > 1 and p["pp"] == 1:
        config["tensor_parallel"] = {"autotp_size": p["tp"]}
    _offload(plan, ledger, config, extra)
    config.update(_precision(plan, ledger))
    extra["recompute"] = _recompute(plan, ledger, changes, lower)
    if p["pp"] > 1:
        extra["pipeline"] = _pipeline(plan, ledger)
    else:
        ledger.exact("pp", "stages")
    ledger.missing("seq_len", f"sequence length {t['seq_len']}: DeepSpeed's config has no such "
                   "setting; your data loader gives each sample's tokens")
    if raising:
        from planner.export import reprice  # lazy: prices with the search (and may trace)
        ledger.info(reprice.recheck(plan, TARGET, ", ".join(raising + lower), state_layout="zero",
                                    **changes))
    ledger.absent(plan.parallel, tuple(common.CONTEXT_EXPERTS), common.CONTEXT_EXPERTS)
    extra["not_expressed"] = ledger.close()
    order = ["about", "header", "not_expressed", "batch", "offload", "recompute", "pipeline"]
    return dumps({"planner": {k: extra[k] for k in order if k in extra}, **config}) + "\n"


def _batch(plan: Plan, ledger: common.Ledger, extra: dict) -> dict:
    """The batch settings. DeepSpeedConfig asserts train_batch_size = micro x accumulation x the
    data-parallel world an mpu gives (the PipelineModule's grid when pp > 1), or every GPU without
    one (AutoTP): then the size is left for DeepSpeed to derive."""
    p, t = plan.parallel, plan.training
    ledger.exact("micro_batch", "num_microbatches", "global_batch", "dp", "placement")
    config = {"train_batch_size": t["global_batch"],
              "train_micro_batch_size_per_gpu": p["micro_batch"],
              "gradient_accumulation_steps": p["num_microbatches"]}
    if p["tp"] > 1 and p["pp"] == 1:
        del config["train_batch_size"]
        extra["batch"] = {
            "global_batch": t["global_batch"],
            "why": "train_batch_size is left for DeepSpeed to derive: without an mpu (AutoTP) its "
                   "batch check counts every GPU, tensor-parallel ones included, as data-parallel "
                   f"(train_batch_size = micro x accumulation x {plan.cluster['num_gpus']} GPUs), "
                   f"so the {t['global_batch']} samples of the plan would fail it; the "
                   f"{p['tp']} GPUs of a tensor-parallel group read the same samples"}
    return config


def _zero_stage(plan: Plan, ledger: common.Ledger, changes: dict, raising: list[str]) -> int:
    p = plan.parallel
    zero = p["zero"]
    runs = targets.engine(TARGET).zero_with_pp
    if p["pp"] > 1 and zero not in runs:
        nearest = max(z for z in runs if z < zero)
        changes["zero"] = nearest
        raising.append(f"ZeRO-{nearest} instead of the plan's ZeRO-{zero}")
        ledger.nearest("zero", f"ZeRO-{zero} with pp={p['pp']}: DeepSpeed's pipeline engine runs "
                       f"ZeRO stages {', '.join(map(str, runs))} only (deepspeed/runtime/pipe/"
                       f"engine.py asserts it); nearest ZeRO-{nearest}: more memory than planned "
                       "(re-checked below)")
        return nearest
    ledger.exact("zero")
    return zero


def _tp_notes(plan: Plan, ledger: common.Ledger, changes: dict, raising: list[str]) -> None:
    p = plan.parallel
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
        what = "attention core only" if rc == "selective" else "per op"
        ledger.nearest("recompute", f"recompute {rc} ({what}): DeepSpeed checkpoints whole "
                       "layers; nearest is checkpointing every layer (more recompute time than "
                       "planned, less memory)")
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
    bounds = [0]
    for st in plan.stages:
        bounds.append(bounds[-1] + len(st["blocks"]))
    ledger.exact("stages")
    out = {"num_stages": p["pp"], "how": HOW, "topology": _topology(plan),
           "partition_method": None, "parts": bounds}
    if lay.stacks and lay.even:
        out["even_alternative"] = ("the stages hold equal numbers of layers: "
                                   "partition_method='type:<decoder layer class name>' gives the "
                                   "same split without a subclass")
    out["layers"] = [b for st in plan.stages for b in st["blocks"]]
    out["stage_modules"] = [list(st["modules"]) for st in plan.stages]
    return out


def _topology(plan: Plan) -> dict:
    p, where = plan.parallel, common.placement(plan)
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
