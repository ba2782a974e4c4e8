"""Plan -> Megatron-LM command-line arguments, as a bash array in a file you ``source``.

Megatron-LM builds its own transformer (GPT, BERT, ...), so the plan must describe one stack of
identical layers with an embedding side before it and a head side after it; stages are described
by how many layers each holds. Mapping table and limits: docs/exports.md.
"""

from __future__ import annotations

from planner.errors import SpecError
from planner.export import common
from planner.export.shell import Group, bash_file
from planner.planfile.document import Plan
from planner import targets

TARGET = "megatron"
ARRAY = "MEGATRON_PARALLEL_ARGS"
RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1"],
}
PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [], "fp8": ["--bf16"]}
FP8_RECIPE = {"delayed": "delayed", "current": "tensorwise", "block": "mxfp8"}
"""Plan FP8 recipe -> Megatron-LM's --fp8-recipe (Transformer Engine's delayed scaling, per-tensor
current scaling, MXFP8 blocks)."""
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}



def to_megatron(plan: Plan, version: str | None = None) -> str:
    """The plan as Megatron-LM arguments for ``version`` (default: planner.targets' release);
    SpecError when the model is not one layer stack or the engine cannot run the plan."""
    version = common.engine_version(TARGET, version)
    ledger = common.Ledger(TARGET, version)
    lay = _checked_layout(plan)
    groups = [_degrees(plan, ledger), _batch(plan, ledger), _pipeline(plan, lay, ledger),
              _memory(plan, ledger), _precision(plan, ledger)]
    env = _environment(plan)
    ledger.absent(plan.parallel, tuple(common.CONTEXT_EXPERTS), common.CONTEXT_EXPERTS)
    notes = ledger.close()
    intro = common.header(plan, TARGET, version) + [
        f'Use: source this file, then pass "${{{ARRAY}[@]}}" to pretrain_gpt.py (or',
        "pretrain_bert.py) with your model (--hidden-size, --num-attention-heads, ...), data and",
        "optimizer arguments. The tensor-parallel split of each layer is Megatron's own.", ""]
    return bash_file(common.comment_block(intro + common.notes_block(notes)), env, ARRAY,
                     [line for group in groups for line in group])


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
                        f"but model.trace.repeats says {lay.expected}, in order; re-create the "
                        "plan")
    return lay


def _degrees(plan: Plan, ledger: common.Ledger) -> Group:
    p = plan.parallel
    ledger.exact("dp", "tp", "pp", "sequence_parallel", "placement")
    out = [([], f"data-parallel size {p['dp']} follows from the world size: launch on "
                f"{plan.cluster['num_gpus']} GPUs = tp {p['tp']} x pp {p['pp']} x dp {p['dp']}"),
           (["--tensor-model-parallel-size", str(p["tp"]),
             "--pipeline-model-parallel-size", str(p["pp"])], "")]
    if p["tp"] > 1 and p["sequence_parallel"]:
        out.append((["--sequence-parallel"], ""))
    if p["pp"] > 1 and p["dp"] > 1 and common.placement(plan) == "tp-pp-dp":
        out.append((["--use-tp-pp-dp-mapping"],
                    "placement tp-pp-dp (Megatron's default order is tp-dp-pp)"))
    return out


def _environment(plan: Plan) -> list[tuple[str, str | None, str]]:
    """CUDA_DEVICE_MAX_CONNECTIONS: Megatron-LM's validate_args asserts it is 1 with tensor
    parallelism on GPUs before Blackwell, and that it is not 1 with Megatron-FSDP (ZeRO-2/3)."""
    p = plan.parallel
    if p["dp"] > 1 and p["zero"] >= 2:
        return [("CUDA_DEVICE_MAX_CONNECTIONS", None,
                 "Megatron-FSDP: Megatron-LM's validate_args requires CUDA_DEVICE_MAX_CONNECTIONS "
                 "unset or > 1")]
    if p["tp"] == 1:
        return []
    return [("CUDA_DEVICE_MAX_CONNECTIONS", "1",
             "tensor parallelism: Megatron-LM's validate_args requires "
             "CUDA_DEVICE_MAX_CONNECTIONS=1 (on GPUs before Blackwell)")]


def _batch(plan: Plan, ledger: common.Ledger) -> Group:
    p, t = plan.parallel, plan.training
    ledger.exact("micro_batch", "num_microbatches", "global_batch", "seq_len")
    return [([], f"{p['num_microbatches']} micro-batches of {p['micro_batch']} per step and "
                 "data-parallel rank"),
            (["--micro-batch-size", str(p["micro_batch"]),
              "--global-batch-size", str(t["global_batch"]),
              "--seq-length", str(t["seq_len"])], "")]


def _pipeline(plan: Plan, lay: common.Layout, ledger: common.Ledger) -> Group:
    p = plan.parallel
    out = [(["--num-layers", str(lay.expected)], f"{lay.expected} layers in {lay.stacks[0]}")]
    common.check_schedule(plan, TARGET, targets.engine(TARGET).schedules, ledger, {
        "gpipe": "1f1b"})
    if p["pp"] == 1:
        ledger.exact("stages")
        return out
    if p["schedule"] == "gpipe":
        ledger.nearest("schedule", "schedule GPipe: Megatron-LM runs 1F1B, which has the same "
                       "bubble and keeps fewer micro-batches in flight (less activation memory "
                       "than planned)")
    if p["vpp"] > 1 and len(plan.stages) == p["pp"]:
        ledger.nearest(("vpp", "stages"), f"vpp={p['vpp']}: the plan gives one layer range per "
                       "rank, not per virtual stage, so Megatron-LM splits the layers evenly over "
                       "the virtual stages")
        return out + [(["--num-virtual-stages-per-pipeline-rank", str(p["vpp"])], "")]
    ledger.exact("vpp")
    _side_notes(plan, lay, ledger)
    ledger.exact("stages")
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


def _side_notes(plan: Plan, lay: common.Layout, ledger: common.Ledger) -> None:
    last = len(plan.stages) - 1
    for stage, block in lay.pre:
        if stage != 0:
            ledger.nearest("stages", f"block '{block}' (embedding side) is on stage {stage}; "
                           "Megatron-LM keeps the whole embedding side on stage 0")
    for stage, block in lay.post:
        if stage != last:
            ledger.nearest("stages", f"block '{block}' (head side) is on stage {stage}; "
                           f"Megatron-LM keeps the whole head side on the last stage ({last})")


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


def _memory(plan: Plan, ledger: common.Ledger) -> Group:
    p = plan.parallel
    ledger.exact("zero", "offload_optimizer")
    out = _recompute(p["recompute"], ledger)
    if p["dp"] == 1:
        return out + _offload(plan)
    zero = p["zero"]
    if zero == 0:
        return out + [([], "ZeRO-0: plain data parallelism (Megatron's DDP)")] + _offload(plan)
    if zero == 1:
        return out + [(["--use-distributed-optimizer"], "ZeRO-1: the distributed optimizer")] + \
            _offload(plan)
    return out + [(["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_STRATEGY[zero],
                    "--use-distributed-optimizer", "--no-gradient-accumulation-fusion",
                    "--ckpt-format", "fsdp_dtensor"],
                   f"ZeRO-{zero}: Megatron-FSDP")] + _offload(plan)


def _recompute(rc: str, ledger: common.Ledger) -> Group:
    if rc in RECOMPUTE:
        ledger.exact("recompute")
        return [(RECOMPUTE[rc], f"recompute {rc}")]
    ledger.nearest("recompute", f"recompute {rc} (torchtitan's per-op selective checkpointing): "
                   "Megatron-LM recomputes the attention core (selective) or whole layers (full); "
                   "nearest full: less memory, more recompute time than planned")
    return [(RECOMPUTE["full"], f"recompute {rc} -> full (see the note above)")]


def _offload(plan: Plan) -> Group:
    """Optimizer states and step on the host: Megatron-LM's HybridDeviceOptimizer, which
    validate_args allows only with the precision-aware optimizer (itself needing the distributed
    optimizer, which ZeRO >= 1 gives); fraction 1 offloads all of it, as the plan prices."""
    if not plan.parallel.get("offload_optimizer"):
        return []
    return [(["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0",
              "--use-precision-aware-optimizer"],
             "optimizer offload: all optimizer states and the step on the host (fp32 main params "
             "and moments, Megatron's defaults, as planned; --overlap-cpu-optimizer-d2h-h2d would "
             "overlap the copies the plan prices as serial)")]


def _precision(plan: Plan, ledger: common.Ledger) -> Group:
    ledger.exact("dtype")
    dtype = plan.training["dtype"]
    out = [(PRECISION[dtype], f"dtype {dtype}" + (" (Megatron's default)" if dtype == "fp32"
                                                  else ""))]
    if dtype == "fp8":
        recipe = plan.training.get("engine", {}).get("fp8_recipe", "current")
        out.append((["--fp8-format", "hybrid", "--fp8-recipe", FP8_RECIPE[recipe]],
                    f"FP8 GEMMs through Transformer Engine, {recipe} scaling (E4M3 forward, E5M2 "
                    "gradients); weights and the rest in bf16"))
    return out
