"""Plan -> DeepSpeed config JSON, plus the pipeline stage boundaries under the extra key "planner".

DeepSpeed's config has no place for stage boundaries: they are arguments of
``deepspeed.pipe.PipelineModule`` in the training script. The export therefore adds one top-level
key, ``"planner"`` (DeepSpeed reads only the keys it knows), holding the header, the notes on what
is approximated, and the ``PipelineModule`` arguments (``parts``, topology, checkpoint interval).
Mapping table and limits: docs/exports.md.
"""

from __future__ import annotations

import json

from planner.export import common
from planner.planfile.document import Plan

TARGET = "deepspeed"
AXES = {"tp-dp-pp": ["pipe", "data", "model"], "tp-pp-dp": ["data", "pipe", "model"]}
"""deepspeed.runtime.pipe.topology.ProcessTopology axes, outermost first, per plan placement."""
HOW = ("deepspeed.pipe.PipelineModule(layers=[one LayerSpec per entry of 'layers', in order], "
       "num_stages, topology=ProcessTopology(axes, dims), activation_checkpoint_interval); stock "
       "partition_method values take no explicit boundaries, so set self.parts = parts in a "
       "PipelineModule subclass's _partition_layers")


def to_deepspeed(plan: Plan) -> str:
    """The plan as a DeepSpeed config; notes on what is approximated."""
    p, t = plan.parallel, plan.training
    notes: list[str] = []
    config = {
        "train_batch_size": t["global_batch"],
        "train_micro_batch_size_per_gpu": p["micro_batch"],
        "gradient_accumulation_steps": p["num_microbatches"],
        "zero_optimization": {"stage": _zero_stage(plan, notes)},
        "bf16": {"enabled": t["dtype"] == "bf16"},
        "fp16": {"enabled": True, "loss_scale": 0} if t["dtype"] == "fp16" else {"enabled": False},
    }
    if p["tp"] > 1:
        _tp_notes(plan, notes)
        if p["pp"] == 1:
            config["tensor_parallel"] = {"autotp_size": p["tp"]}
    extra = {
        "about": "Written by planner; DeepSpeed does not read this key. Stage boundaries and "
                 "recomputation are PipelineModule arguments in your script (docs/exports.md).",
        "header": common.header(plan, TARGET),
        "not_expressed": notes,
        "recompute": _recompute(plan, notes),
    }
    if p["pp"] > 1:
        extra["pipeline"] = _pipeline(plan, notes)
    common.warn(TARGET, notes)
    return dumps({"planner": extra, **config}) + "\n"


def _zero_stage(plan: Plan, notes: list[str]) -> int:
    p = plan.parallel
    zero = p["zero"]
    if p["pp"] > 1 and zero >= 2:
        notes.append(f"ZeRO-{zero} with pp={p['pp']}: DeepSpeed's pipeline engine supports ZeRO "
                     "stages 0 and 1 only; nearest ZeRO-1 (more memory than planned)")
        return 1
    if p["tp"] > 1 and zero == 3:
        notes.append(f"ZeRO-3 with tp={p['tp']}: DeepSpeed's AutoTP training supports ZeRO stages "
                     "0-2; nearest ZeRO-2 (weights replicated over data parallelism: more memory "
                     "than planned)")
        return 2
    return zero


def _tp_notes(plan: Plan, notes: list[str]) -> None:
    p = plan.parallel
    if p["pp"] > 1:
        notes.append(f"tp={p['tp']} with pp={p['pp']}: AutoTP training (the tensor_parallel key) "
                     "is documented with data parallelism and ZeRO, not with PipelineModule, so it "
                     "is left out; the topology's 'model' axis carries tp, and the model needs its "
                     "own tensor-parallel layers and a Megatron-style mpu (as in "
                     "Megatron-DeepSpeed)")
    if p["sequence_parallel"]:
        notes.append("sequence parallelism: AutoTP has none; activations between the "
                     "tensor-parallel regions stay replicated (more activation memory than "
                     "planned)")


def _recompute(plan: Plan, notes: list[str]) -> dict:
    rc = plan.parallel["recompute"]
    if rc == "selective":
        notes.append("recompute selective (attention core only): DeepSpeed checkpoints whole "
                     "layers; nearest is checkpointing every layer (more recompute time than "
                     "planned, less memory)")
    interval = 0 if rc == "none" else 1
    how = ("PipelineModule(activation_checkpoint_interval=...)" if plan.parallel["pp"] > 1 else
           "checkpoint each layer in the model (deepspeed.checkpointing.checkpoint, or "
           "gradient_checkpointing_enable() on a Hugging Face model)" if interval else
           "no activation checkpointing")
    return {"plan": rc, "activation_checkpoint_interval": interval, "how": how}


def _pipeline(plan: Plan, notes: list[str]) -> dict:
    p = plan.parallel
    _schedule_notes(plan, notes)
    lay = common.layout(plan)
    if not lay.stacks:
        notes.append("the model has no repeated layer list: PipelineModule runs its layers as a "
                     "sequence, each output feeding the next, so a model that branches (a DAG) "
                     "must first be rewritten as such a sequence")
    out = {"num_stages": p["pp"], "how": HOW, "topology": _topology(plan, notes),
           "partition_method": None, "parts": None}
    if len(plan.stages) != p["pp"]:
        notes.append(f"the plan has {len(plan.stages)} virtual stages; DeepSpeed runs one stage "
                     "per rank, so the split is left to partition_method 'parameters'")
        out["partition_method"] = "parameters"
    else:
        bounds = [0]
        for st in plan.stages:
            bounds.append(bounds[-1] + len(st["blocks"]))
        out["parts"] = bounds
        if lay.stacks and lay.even:
            out["even_alternative"] = ("the stages hold equal numbers of layers: "
                                       "partition_method='type:<decoder layer class name>' "
                                       "gives the same split without a subclass")
    out["layers"] = [b for st in plan.stages for b in st["blocks"]]
    out["stage_modules"] = [list(st["modules"]) for st in plan.stages]
    return out


def _topology(plan: Plan, notes: list[str]) -> dict:
    p, where = plan.parallel, common.placement(plan)
    axes = AXES.get(where)
    if axes is None:
        axes = AXES["tp-dp-pp"]
        notes.append(f"placement {where}: no DeepSpeed topology for it; nearest tp-dp-pp")
    size = {"pipe": p["pp"], "data": p["dp"], "model": p["tp"]}
    return {"class": "ProcessTopology", "axes": axes, "dims": [size[a] for a in axes]}


def _schedule_notes(plan: Plan, notes: list[str]) -> None:
    name = plan.parallel["schedule"]
    if name == "1f1b" and plan.parallel["vpp"] == 1:
        return
    if name == "gpipe":
        notes.append("schedule GPipe: DeepSpeed's pipeline engine runs 1F1B (its TrainSchedule), "
                     "which has the same bubble and keeps fewer micro-batches in flight")
        return
    notes.append(f"schedule {common.schedule_words(name)} (vpp={plan.parallel['vpp']}): "
                 "DeepSpeed's pipeline engine runs 1F1B only, one stage per rank; nearest 1F1B")


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
