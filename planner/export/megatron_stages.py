"""A plan's stages as Megatron-LM's pipeline arguments: the one layer stack Megatron-LM can
describe, the layers per stage (even, first/last sizes or --pipeline-model-parallel-layout),
virtual stages, the head and embedding sides' places, and where the multi-token-prediction
depths run (with the head, or on a stage of their own: Megatron-Core's validate_layer_layout).
Part of planner.export.megatron."""

from __future__ import annotations

from planner.errors import SpecError
from planner.export import common
from planner.export.shell import Group
from planner.planfile.document import Plan
from planner import targets
from planner.trace.graph import is_mtp_block


def checked_layout(plan: Plan) -> common.Layout:
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
                        f"({', '.join(lay.stacks)}); this export writes one stack's arguments "
                        "(pretrain_gpt.py's), not models of several stacks (an encoder-decoder, "
                        "a dual encoder such as CLIP; Megatron-LM's T5 has a script of its own, "
                        f"pretrain_t5.py, this export does not write); {other}")
    if lay.interior:
        raise SpecError(f"export megatron: block '{lay.interior[0]}' sits between transformer "
                        f"layers, where Megatron-LM's stack has no place for it; {other}")
    stack = lay.stacks[0]
    if lay.all_layers != [f"{stack}.{i}" for i in range(lay.expected)]:
        raise SpecError(f"export megatron: the stages hold {len(lay.all_layers)} layers of {stack} "
                        f"but model.trace.repeats says {lay.expected}, in order; re-create the "
                        "plan")
    return lay


def pipeline_args(plan: Plan, lay: common.Layout, ledger: common.Ledger) -> Group:
    p = plan.parallel
    out = [(["--num-layers", str(lay.expected)], f"{lay.expected} layers in {lay.stacks[0]}")]
    common.check_schedule(plan, ledger.target, targets.engine(ledger.target).schedules,
                          ledger, {
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
    mtp = _mtp_per_stage(plan, lay)
    if mtp and mtp[-1] < common.mtp_depths(plan):  # a depth on a stage of its own: a layout
        if ledger.version == "core_v0.14.0":
            raise SpecError("export megatron: the MTP depths are on a stage of their own, which "
                            "core_v0.14.0 does not run (its layout check means MTP to sit with "
                            "the loss on the last stage); export for core_v0.19.0, or re-plan "
                            "with `--layout` putting m with the head (tmL)")
        return out + [(["--pipeline-model-parallel-layout", _layout_string(counts, mtp)],
                       f"{words} (E embedding, t layer, m MTP depth, L head, | stage boundary; "
                       "the MTP depths on a stage before the head's, as priced)")]
    if lay.even and counts[0] > 0:
        vpp = ["--num-virtual-stages-per-pipeline-rank", str(p["vpp"])] if p["vpp"] > 1 else []
        return out + [(vpp, f"{words} (even: Megatron's default split)")]
    edges = _first_last(counts) if p["vpp"] == 1 else None
    if edges is not None:
        return out + [(edges, f"{words} (uneven: first/last stage sizes, the rest even)")]
    return out + [(["--pipeline-model-parallel-layout", _layout_string(counts, mtp)],
                   f"{words} (E embedding, t layer, {'m MTP depth, ' if mtp else ''}L head, | "
                   "stage boundary)")]


def _mtp_per_stage(plan: Plan, lay: common.Layout) -> list[int]:
    """MTP depths (``m``) on each stage ([] without any), or SpecError where Megatron-Core
    cannot place them so (pipeline_parallel_layer_layout.py, validate_layer_layout, core_v0.19.0:
    every depth on one virtual stage, that stage its rank's last one; stage s is rank s % pp's
    chunk s // pp)."""
    depths = common.mtp_depths(plan)
    at = common.mtp_stages(plan, lay)
    if not depths:
        return []
    if not at:  # (a plan from before the depths had their own block: inside the head's)
        at = [len(plan.stages) - 1]
    per = [depths if s == at[0] else 0 for s in range(len(plan.stages))]
    pp, vpp = plan.parallel["pp"], plan.parallel["vpp"]
    stage = at[0]
    fix = "re-plan with `--layout` placing every m on one stage of a rank's last chunk, e.g. " \
        "with the head (tmL)"
    if stage // pp != vpp - 1:
        raise SpecError(f"export megatron: the MTP depths are on stage {stage} (rank "
                        f"{stage % pp}, chunk {stage // pp} of {vpp}); Megatron-Core runs them "
                        "on a rank's last chunk; " + fix)
    return per


def _side_notes(plan: Plan, lay: common.Layout, ledger: common.Ledger) -> None:
    last = len(plan.stages) - 1
    for stage, block in lay.pre:
        if stage != 0:
            ledger.nearest("stages", f"block '{block}' (embedding side) is on stage {stage}; "
                           "Megatron-LM keeps the whole embedding side on stage 0")
    for stage, block in lay.post:
        if stage != last and not is_mtp_block(block):  # (the depths: the layout's m)
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


def _layout_string(counts: list[int], mtp: list[int] | None = None) -> str:
    """``Et*8|t*9|t*9|t*6L``: Megatron-LM's --pipeline-model-parallel-layout, one part per stage;
    ``mtp``: the MTP depths (``m``) on each stage, after its layers, where the plan prices them
    (on the head's stage: ``tmL``; on a stage of their own: ``m|L``)."""
    parts = []
    for i, n in enumerate(counts):
        layers = "" if n == 0 else "t" if n == 1 else f"t*{n}"
        depths = "m" * (mtp[i] if mtp else 0)
        parts.append(("E" if i == 0 else "") + layers + depths
                     + ("L" if i == len(counts) - 1 else ""))
    return "|".join(parts)


def mtp_args(plan: Plan) -> Group:
    """--mtp-num-layers for a model whose multi-token-prediction depths the plan prices
    (planner.trace.mtp): Megatron-Core places them on the last stage with the loss by default,
    elsewhere as the layout says (pipeline_args)."""
    depths = common.mtp_depths(plan)
    if not depths:
        return []
    return [(["--mtp-num-layers", str(depths)],
             f"{plan.model['name']}: {depths} multi-token-prediction depth(s), priced after the "
             "last layer, where the layout puts them (the last stage with the output head by "
             "default)")]
