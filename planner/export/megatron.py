"""Plan -> Megatron-LM command-line arguments, as a bash array in a file you ``source``.

Megatron-LM builds its own transformer (GPT, BERT, ...), so the plan must describe one stack of
identical layers with an embedding side before it and a head side after it; stages are described
by how many layers each holds. Mapping table and limits: docs/exports.md.
"""

from __future__ import annotations

import shlex

from planner.errors import SpecError
from planner.export import common
from planner.planfile.document import Plan

TARGET = "megatron"
ARRAY = "MEGATRON_PARALLEL_ARGS"
RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1"],
}
PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": []}
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}

Group = list[tuple[list[str], str]]
"""Lines of one group: (arguments, comment written above them or "")."""


def to_megatron(plan: Plan) -> str:
    """The plan as Megatron-LM arguments; SpecError when the model is not one layer stack."""
    lay = _checked_layout(plan)
    notes: list[str] = []
    groups = [_degrees(plan, notes), _batch(plan), _pipeline(plan, lay, notes),
              _memory(plan), _precision(plan)]
    common.warn(TARGET, notes)
    intro = common.header(plan, TARGET) + [
        f'Use: source this file, then pass "${{{ARRAY}[@]}}" to pretrain_gpt.py (or',
        "pretrain_bert.py) with your model (--hidden-size, --num-attention-heads, ...), data and",
        "optimizer arguments. The tensor-parallel split of each layer is Megatron's own.", ""]
    lines = common.comment_block(intro + common.notes_block(notes)) + ["", f"{ARRAY}=("]
    for group in groups:
        for args, comment in group:
            if comment:
                lines.append(f"  # {comment}")
            if args:
                lines.append("  " + " ".join(shlex.quote(a) for a in args))
    return "\n".join(lines + [")"]) + "\n"


def _checked_layout(plan: Plan) -> common.Layout:
    """The stage layout, or SpecError when Megatron-LM cannot describe the model at all."""
    lay = common.layout(plan)
    name = plan.model["name"]
    other = "export to torchtitan or deepspeed instead"
    if not lay.stacks:
        raise SpecError(f"export megatron: model '{name}' has no repeated layer list "
                        "(model.trace.repeats is empty) and Megatron-LM only trains its own "
                        f"transformer stacks; {other}")
    if len(lay.stacks) > 1:
        raise SpecError(f"export megatron: model '{name}' has {len(lay.stacks)} layer lists "
                        f"({', '.join(lay.stacks)}) but a Megatron-LM layout describes one stack; "
                        f"{other}")
    if lay.interior:
        raise SpecError(f"export megatron: block '{lay.interior[0]}' sits between transformer "
                        f"layers, where Megatron-LM's stack has no place for it; {other}")
    stack = lay.stacks[0]
    if lay.all_layers != [f"{stack}.{i}" for i in range(lay.expected)]:
        raise SpecError(f"export megatron: the stages hold {len(lay.all_layers)} layers of {stack} "
                        f"but model.trace.repeats says {lay.expected}, in order; re-create the plan")
    return lay


def _degrees(plan: Plan, notes: list[str]) -> Group:
    p = plan.parallel
    out = [([], f"data-parallel size {p['dp']} follows from the world size: launch on "
                f"{plan.cluster['num_gpus']} GPUs = tp {p['tp']} x pp {p['pp']} x dp {p['dp']}"),
           (["--tensor-model-parallel-size", str(p["tp"]),
             "--pipeline-model-parallel-size", str(p["pp"])], "")]
    if p["tp"] > 1 and p["sequence_parallel"]:
        out.append((["--sequence-parallel"], ""))
    if p["pp"] > 1 and p["dp"] > 1 and common.placement(plan) == "tp-pp-dp":
        out.append((["--use-tp-pp-dp-mapping"],
                    "placement tp-pp-dp (Megatron's default order is tp-dp-pp; versions without "
                    "this flag cannot express it)"))
    return out


def _batch(plan: Plan) -> Group:
    p, t = plan.parallel, plan.training
    return [([], f"{p['num_microbatches']} micro-batches of {p['micro_batch']} per step and "
                 "data-parallel rank"),
            (["--micro-batch-size", str(p["micro_batch"]),
              "--global-batch-size", str(t["global_batch"]),
              "--seq-length", str(t["seq_len"])], "")]


def _pipeline(plan: Plan, lay: common.Layout, notes: list[str]) -> Group:
    p = plan.parallel
    out = [(["--num-layers", str(lay.expected)], f"{lay.expected} layers in {lay.stacks[0]}")]
    if p["pp"] == 1:
        return out
    _schedule_notes(plan, notes)
    if p["vpp"] > 1 and len(plan.stages) == p["pp"]:
        notes.append(f"vpp={p['vpp']}: the plan gives one layer range per rank, not per virtual "
                     "stage, so Megatron-LM splits the layers evenly over the virtual stages")
        return out + [(["--num-virtual-stages-per-pipeline-rank", str(p["vpp"])], "")]
    _side_notes(plan, lay, notes)
    counts = lay.counts
    words = f"layers per stage: {common.stage_counts_text(lay)}"
    if lay.even and counts[0] > 0:
        vpp = ["--num-virtual-stages-per-pipeline-rank", str(p["vpp"])] if p["vpp"] > 1 else []
        return out + [(vpp, f"{words} (even: Megatron's default split)")]
    edges = _first_last(counts) if p["vpp"] == 1 else None
    if edges is not None:
        return out + [(edges, f"{words} (uneven: first/last stage sizes, the rest even)")]
    return out + [(["--pipeline-model-parallel-layout", _layout_string(counts)],
                   f"{words} (E embedding, t layer, L head, | stage boundary)")]


def _schedule_notes(plan: Plan, notes: list[str]) -> None:
    name = plan.parallel["schedule"]
    if name in ("1f1b", "interleaved-1f1b"):
        return
    if name == "gpipe":
        notes.append("schedule GPipe: Megatron-LM runs 1F1B, which has the same bubble and keeps "
                     "fewer micro-batches in flight (less activation memory than planned)")
        return
    notes.append(f"schedule {common.schedule_words(name)}: Megatron-LM has no such schedule; "
                 "nearest 1F1B (a larger pipeline bubble than planned)")


def _side_notes(plan: Plan, lay: common.Layout, notes: list[str]) -> None:
    last = len(plan.stages) - 1
    for stage, block in lay.pre:
        if stage != 0:
            notes.append(f"block '{block}' (embedding side) is on stage {stage}; Megatron-LM "
                         "keeps the whole embedding side on stage 0")
    for stage, block in lay.post:
        if stage != last:
            notes.append(f"block '{block}' (head side) is on stage {stage}; Megatron-LM keeps "
                         f"the whole head side on the last stage ({last})")


def _first_last(counts: list[int]) -> list[str] | None:
    """--decoder-first/last-pipeline-num-layers when they describe ``counts`` (the stages between
    hold equal numbers of layers), else None."""
    if min(counts) == 0:
        return None
    first = ["--decoder-first-pipeline-num-layers", str(counts[0])]
    last = ["--decoder-last-pipeline-num-layers", str(counts[-1])]
    if len(set(counts[1:])) == 1:
        return first
    if len(set(counts[:-1])) == 1:
        return last
    if len(counts) >= 3 and len(set(counts[1:-1])) == 1:
        return first + last
    return None


def _layout_string(counts: list[int]) -> str:
    """``Et*8|t*9|t*9|t*6L``: Megatron-LM's --pipeline-model-parallel-layout, one part per stage."""
    parts = []
    for i, n in enumerate(counts):
        layers = "" if n == 0 else "t" if n == 1 else f"t*{n}"
        parts.append(("E" if i == 0 else "") + layers + ("L" if i == len(counts) - 1 else ""))
    return "|".join(parts)


def _memory(plan: Plan) -> Group:
    p = plan.parallel
    out = [(RECOMPUTE[p["recompute"]], f"recompute {p['recompute']}")]
    if p["dp"] == 1:
        return out
    zero = p["zero"]
    if zero == 0:
        return out + [([], "ZeRO-0: plain data parallelism (Megatron's DDP)")]
    if zero == 1:
        return out + [(["--use-distributed-optimizer"], "ZeRO-1: the distributed optimizer")]
    return out + [(["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_STRATEGY[zero],
                    "--use-distributed-optimizer", "--no-gradient-accumulation-fusion",
                    "--ckpt-format", "fsdp_dtensor"],
                   f"ZeRO-{zero}: Megatron-FSDP (versions without it only offer ZeRO-1: "
                   "--use-distributed-optimizer)")]


def _precision(plan: Plan) -> Group:
    dtype = plan.training["dtype"]
    return [(PRECISION[dtype], f"dtype {dtype}" + (" (Megatron's default)" if dtype == "fp32"
                                                   else ""))]
