"""Plan -> torchtitan job config (TOML): ``[parallelism]``, ``[activation_checkpoint]``, ``[training]``.

Targets the TOML job config of torchtitan (``torchtitan/config/job_config.py``): the sections are
meant to be merged into a job file that already names the model, tokenizer, data and optimizer.
Mapping table and limits: docs/exports.md.
"""

from __future__ import annotations

from planner.errors import SpecError
from planner.export import common
from planner.export.toml import Entry, table
from planner.planfile.document import Plan

TARGET = "torchtitan"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
PRECISION = {"bf16": "bfloat16", "fp32": "float32"}
HF_LLAMA = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output"}
"""Hugging Face Llama module FQNs -> torchtitan llama3 names (``model.layers.<i>`` -> ``layers.<i>``)."""
HF_LLAMA_DROPPED = {"model.rotary_emb"}
"""Hugging Face modules torchtitan's llama3 has no module for (it keeps rotary tables as a buffer)."""


def to_torchtitan(plan: Plan) -> str:
    """The plan as torchtitan TOML job-config sections; notes on what is approximated."""
    notes: list[str] = []
    parallelism = _data_parallel(plan, notes) + _model_parallel(plan, notes)
    sections = (table("parallelism", parallelism)
                + table("activation_checkpoint", _activation_checkpoint(plan, notes))
                + table("training", _training(plan, notes)))
    common.warn(TARGET, notes)
    intro = common.header(plan, TARGET) + [
        "Merge these sections into a torchtitan TOML job config ([job], [model], [optimizer],",
        "data and checkpointing stay yours). Run it on exactly "
        f"{plan.cluster['num_gpus']} GPUs (NGPU x nodes).", ""] + common.notes_block(notes)
    return "\n".join(common.comment_block(intro) + [""] + sections).rstrip("\n") + "\n"


def _data_parallel(plan: Plan, notes: list[str]) -> list[Entry]:
    dp, zero = plan.parallel["dp"], plan.parallel["zero"]
    if dp == 1:
        return [Entry("data_parallel_replicate_degree", 1, ["no data parallelism (dp = 1)"]),
                Entry("data_parallel_shard_degree", 1)]
    if zero == 0:
        why = ["ZeRO-0: plain data parallelism (DDP) over dp = "
               f"{dp} replicas, no sharding"]
        if plan.parallel["tp"] > 1 or plan.parallel["pp"] > 1:
            why.append("(older torchtitan refuses DDP together with TP/PP; there use "
                       f"data_parallel_shard_degree = {dp} and fsdp_reshard_after_forward = "
                       '"never")')
        return [Entry("data_parallel_replicate_degree", dp, why),
                Entry("data_parallel_shard_degree", 1)]
    if zero == 1:
        notes.append("ZeRO-1 (optimizer states sharded, gradients and weights replicated): FSDP2 "
                     "always shards gradients and weights too; nearest is FSDP without resharding "
                     "after forward (ZeRO-2-like: the same traffic per step, less memory than "
                     "planned)")
    reshard = "always" if zero == 3 else "never"
    why = {1: "ZeRO-1 -> nearest FSDP2 setting (see the note above)",
           2: "ZeRO-2 -> FSDP2 without resharding after forward (FSDP1's SHARD_GRAD_OP)",
           3: "ZeRO-3 -> FSDP2, weights resharded after every forward"}[zero]
    return [Entry("data_parallel_replicate_degree", 1, [why]),
            Entry("data_parallel_shard_degree", dp),
            Entry("fsdp_reshard_after_forward", reshard)]


def _model_parallel(plan: Plan, notes: list[str]) -> list[Entry]:
    p = plan.parallel
    out = [Entry("tensor_parallel_degree", p["tp"])]
    if p["tp"] > 1:
        if not p["sequence_parallel"]:
            notes.append("sequence parallelism is off in the plan, but torchtitan's TOML config "
                         "always applies TP with sequence parallelism (versions with Python configs "
                         "have parallelism.enable_sequence_parallel = false)")
        out.append(Entry("enable_async_tensor_parallel", False,
                         ["the plan prices synchronous TP collectives (async TP also needs "
                          "compile)"]))
    out.append(Entry("pipeline_parallel_degree", p["pp"]))
    if p["pp"] > 1:
        out += _pipeline(plan, notes)
    if p["pp"] > 1 and p["dp"] > 1 and common.placement(plan) == "tp-pp-dp":
        notes.append("placement tp-pp-dp (pipeline neighbours on adjacent ranks): torchtitan "
                     "orders its device mesh pp, dp_replicate, dp_shard, cp, tp (outermost "
                     "first), which is tp-dp-pp; pipeline sends may cross slower links than "
                     "planned")
    return out


def _pipeline(plan: Plan, notes: list[str]) -> list[Entry]:
    p = plan.parallel
    parts = [list(st["modules"]) for st in plan.stages]
    if len(parts) != p["pp"] * p["vpp"]:
        raise SpecError(f"export torchtitan: the plan lists {len(parts)} stages for pp={p['pp']} x "
                        f"vpp={p['vpp']}; torchtitan needs one module list per (virtual) stage, "
                        "so re-plan or export to megatron")
    name = p["schedule"]
    sched = SCHEDULES.get(name)
    if sched is None:
        sched = "Interleaved1F1B" if p["vpp"] > 1 else "1F1B"
        notes.append(f"schedule {common.schedule_words(name)}: no torchtitan schedule by that "
                     f"name; nearest {sched} (torchtitan can replay the plan's own per-rank "
                     "actions from a CSV: pipeline_parallel_schedule_csv with "
                     "pipeline_parallel_schedule = \"_PipelineScheduleRuntime\")")
    lay = common.layout(plan)
    split = [f"{len(parts)} model parts, one per stage, in the plan's module FQNs"]
    if lay.stacks:
        split.append(f"layers per stage: {common.stage_counts_text(lay)}"
                     + (" (even)" if lay.even else " (uneven)"))
    else:
        split.append("the model has no repeated layer list: torchtitan cuts a model into stages "
                     "by deleting the modules a stage does not hold, so its forward must skip "
                     "missing modules")
    split += _torchtitan_llama_names(parts)
    return [Entry("pipeline_parallel_schedule", sched),
            Entry("pipeline_parallel_microbatch_size", p["micro_batch"],
                  [f"{p['num_microbatches']} micro-batches per step = local_batch_size / this "
                   "(newer Python configs: parallelism.num_pp_microbatches)"]),
            Entry("module_fqns_per_model_part", parts,
                  split + ["(newer Python configs: "
                           "parallelism.pipeline_parallel_module_fqns_per_model_part)"])]


def _torchtitan_llama_names(parts: list[list[str]]) -> list[str]:
    """Commented-out module lists in torchtitan's llama3 naming, when the plan's FQNs are Hugging
    Face Llama ones; else nothing."""
    renamed = []
    for part in parts:
        new = []
        for fqn in part:
            if fqn in HF_LLAMA_DROPPED:
                continue
            if fqn.startswith("model.layers.") and fqn[len("model.layers."):].isdigit():
                new.append(fqn[len("model."):])
            elif fqn in HF_LLAMA:
                new.append(HF_LLAMA[fqn])
            else:
                return []
        renamed.append(new)
    lines = ["torchtitan's own llama3 model names these modules tok_embeddings, layers.<i>, norm,",
             "output; with that model definition use instead:", "module_fqns_per_model_part = ["]
    lines += ["  [" + ", ".join(f'"{m}"' for m in part) + "]," for part in renamed]
    return lines + ["]"]


def _activation_checkpoint(plan: Plan, notes: list[str]) -> list[Entry]:
    rc = plan.parallel["recompute"]
    if rc != "selective":
        return [Entry("mode", rc, [f"recompute {rc}"])]
    notes.append("recompute selective (Megatron-style: recompute the attention core) -> "
                 "torchtitan's per-op selective checkpointing, which saves matmul outputs and "
                 "recomputes the rest; its memory and recompute time differ somewhat from the "
                 "plan's")
    return [Entry("mode", "selective", ["recompute selective -> per-op selective checkpointing"]),
            Entry("selective_ac_option", "op")]


def _training(plan: Plan, notes: list[str]) -> list[Entry]:
    p, t = plan.parallel, plan.training
    if p["pp"] > 1:
        local, why = p["micro_batch"] * p["num_microbatches"], (
            f"per data-parallel rank: micro-batch {p['micro_batch']} x "
            f"{p['num_microbatches']} pipeline micro-batches")
    else:
        local, why = p["micro_batch"], (
            f"the micro-batch; torchtitan accumulates gradients over global / (local x dp) = "
            f"{p['num_microbatches']} steps")
    dtype = PRECISION.get(t["dtype"])
    if dtype is None:
        dtype = "bfloat16"
        notes.append(f"dtype {t['dtype']}: torchtitan's mixed precision offers bfloat16 or "
                     "float32 parameters only; nearest bfloat16 (same bytes, wider range)")
    return [Entry("local_batch_size", local, [why]),
            Entry("global_batch_size", t["global_batch"]),
            Entry("seq_len", t["seq_len"]),
            Entry("mixed_precision_param", dtype, [f"dtype {t['dtype']}"]),
            Entry("mixed_precision_reduce", "float32")]
