"""What the exporters share: the engine release, the header, the layer layout of the stages, and the
ledger that accounts for every knob of the plan.

A plan lists its pipeline stages as blocks and module FQNs. Engines count transformer layers
instead, so ``layout`` reads the plan's repeated layer lists (``model.trace.repeats``, e.g.
``model.layers``) and says which layers each stage holds, and where the blocks that are not layers
sit: the embedding side (before the first layer), the head side (after the last layer), or in
between (a model the layer-count engines cannot describe).

Every exporter records in a ``Ledger`` what it did with each knob of the plan (``ACCOUNTED``):
expressed exactly, or a note saying what is used instead or that the engine has no setting for
it. Each note becomes a comment in the exported text and one logged warning (stderr in the CLI);
``Ledger.close`` fails on a knob nobody accounted for, so a new knob cannot be dropped silently.
"""

from __future__ import annotations

import logging
import re
import textwrap
from dataclasses import dataclass, field

from costmodels.engine import PRESETS, engine_from_mapping, engine_setting
from costmodels.hardware import get_device
from planner.errors import PlannerError, SpecError
from planner.export import moe
from planner.export.replan import resolve_hint
from planner.options import KNOBS, parallel_text
from planner.planfile.document import Plan
from planner import targets
from planner.trace.graph import frozen_words, is_mtp_block
from planner.units import cluster_text

log = logging.getLogger("planner.export")
NOTE_WIDTH = 96

MOE_SETTINGS = ("moe_dispatcher", "moe_capacity_factor", "moe_pad_to_capacity",
                "moe_grouped_gemm", "moe_overlap", "moe_shared_overlap")
"""The engine settings of a mixture of experts the plan was priced with (``training.engine``;
costmodels.engine.EngineSpec). ``moe_imbalance`` is an assumption about the routing, not a setting:
the exports state it in a comment."""
ACCOUNTED = KNOBS + ("dp_replicate", "stages", "dtype", "global_batch", "seq_len",
                     "tp_overlap") + MOE_SETTINGS
"""What an export must express or list as not expressed: every knob of a configuration (with
context and expert parallelism: cp, cp_comm, ep, etp), the replicate groups of data parallelism
across sites, the stage split (module names or layer counts), the precision, the batch, the
sequence length, the tensor-parallel overlap (EngineSpec.tp_overlap) and the
mixture-of-experts settings."""

SUPPORTED_VERSIONS: dict[str, tuple[str, ...]] = {
    "torchtitan": ("0.2.2", "0.3.0"),
    "megatron": ("core_v0.14.0", "core_v0.19.0"),
    "deepspeed": ("0.19.8",),
}
"""Engine releases the exporters write for, each checked by the tests with that release's own
parser (docs/exports.md). The default is ``planner.targets``' version of the engine."""

SCHEDULE_WORDS = {
    "gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B",
    "zb-h1": "zero-bubble ZB-H1", "bidirectional": "bidirectional (two pipelines)",
}


def engine_version(target: str, version: str | None) -> str:
    """The release to write for: ``version`` (as given to --engine-version) or the engine's default
    in planner.targets; SpecError for a release the exporter does not know."""
    known = SUPPORTED_VERSIONS[target]
    default = targets.engine(target).version
    if version is None or version == "":
        version = default
    aliases = {v: v for v in known}
    aliases.update({v.removeprefix("core_v"): v for v in known})
    aliases.update({"v" + v.removeprefix("core_v"): v for v in known})
    if version not in aliases:
        raise SpecError(f"--engine-version: planner writes {target} {' or '.join(known)}, not "
                        f"'{version}'; pick one of those (default {default})")
    return aliases[version]


@dataclass
class Ledger:
    """What one export did with each knob of the plan (see the module docstring)."""

    target: str
    version: str
    notes: list[str] = field(default_factory=list)
    """Everything not expressed exactly, in the order found."""
    done: dict[str, str] = field(default_factory=dict)
    """knob -> "exact", "nearest" or "not expressed"."""

    def exact(self, *knobs: str) -> None:
        for k in knobs:
            self.done.setdefault(k, "exact")

    def nearest(self, knobs: str | tuple[str, ...], note: str) -> None:
        """The engine gets the nearest setting; ``note`` says which and what it changes."""
        self._note(knobs, "nearest", note)

    def missing(self, knobs: str | tuple[str, ...], note: str) -> None:
        """The engine has no setting for it; ``note`` says what the user must do instead."""
        self._note(knobs, "not expressed", note)

    def dropless(self, settings: dict, who: str) -> None:
        """An engine whose MoE drops no tokens and pads none: a plan's capacity factor (and its
        padding to capacity) becomes dropless. ``settings``: planner.export.moe.settings."""
        factor, padded = settings["moe_capacity_factor"], settings["moe_pad_to_capacity"]
        if padded:
            self.nearest(("moe_capacity_factor", "moe_pad_to_capacity"),
                         f"moe_capacity_factor {factor:g} with moe_pad_to_capacity: {who} drops no "
                         "tokens and pads none (it has no capacity factor); each expert computes "
                         "the tokens routed to it, not its padded capacity (faster than planned, "
                         "except a busiest expert above the capacity)")
        elif factor:
            self.nearest("moe_capacity_factor", f"moe_capacity_factor {factor:g}: {who} "
                         "drops no tokens (it has no capacity factor); the busiest expert rank "
                         "computes all its tokens (slower than planned when routing is less even "
                         "than the capacity)")
        self.exact("moe_capacity_factor", "moe_pad_to_capacity")

    def info(self, note: str) -> None:
        """A note about the export that concerns no single knob (e.g. whose module names)."""
        self.notes.append(note)

    def _note(self, knobs, kind: str, note: str) -> None:
        for k in (knobs,) if isinstance(knobs, str) else knobs:
            if self.done.get(k, "exact") == "exact":
                self.done[k] = kind
        self.notes.append(note)

    def close(self) -> list[str]:
        """Check that every knob was accounted for (an internal invariant), log one warning per note
        and return the notes."""
        left = [k for k in ACCOUNTED if k not in self.done]
        assert not left, f"export {self.target}: knobs not accounted for: {left}"
        for note in self.notes:
            log.warning("export %s %s: %s", self.target, self.version, note)
        return self.notes


def tp_overlap(plan: Plan, ledger: Ledger, unrun: str = "") -> bool:
    """Whether the export turns on the tensor-parallel overlap the plan priced
    (EngineSpec.tp_overlap, with tp > 1 and sequence parallelism); ``unrun``: why the engine
    does not run it ('' where it does), listed as not expressed."""
    p = plan.parallel
    priced = engine_from_mapping(plan.training.get("engine")).tp_overlap and p["tp"] > 1 and \
        p.get("sequence_parallel", False)
    if priced and unrun:
        ledger.missing("tp_overlap", f"tp_overlap: {unrun}; its tensor-parallel collectives run "
                       "exposed, where the plan hid most of them (its tensor-parallel part is "
                       "what the overlap left): re-plan with tp_overlap=false for the step it "
                       "takes")
        return False
    ledger.exact("tp_overlap")
    return priced


@dataclass(frozen=True)
class Layout:
    """Which transformer layers, and which other blocks, each pipeline stage holds."""

    stacks: list[str]
    """FQNs of the repeated layer lists (``model.layers``); empty for a model without one."""
    layers: list[list[str]]
    """Per stage, the FQNs of the layers it holds (``model.layers.7``), in order."""
    pre: list[tuple[int, str]]
    """(stage, block name) of the blocks before the first layer: the embedding side."""
    post: list[tuple[int, str]]
    """(stage, block name) of the blocks after the last layer: the head side."""
    interior: list[str]
    """Blocks that are not layers but sit between layers."""
    expected: int
    """Layers the repeated lists hold in the real model (sum of their counts)."""

    @property
    def counts(self) -> list[int]:
        """Layers per stage."""
        return [len(s) for s in self.layers]

    @property
    def even(self) -> bool:
        """Every stage holds the same number of layers."""
        return len(set(self.counts)) == 1

    @property
    def all_layers(self) -> list[str]:
        return [fqn for s in self.layers for fqn in s]


def layout(plan: Plan) -> Layout:
    """Count the layers of each stage, and place the non-layer blocks (see the module docstring)."""
    trace = plan.model.get("trace", {})
    repeats = trace.get("repeats", []) if isinstance(trace, dict) else None
    if not isinstance(repeats, list):
        raise SpecError("model.trace.repeats: expected the list of layer stacks plan solve "
                        "writes; re-create the plan")
    for i, r in enumerate(repeats):
        if not isinstance(r, dict) or not isinstance(r.get("fqn"), str):
            raise SpecError(f"model.trace.repeats[{i}]: expected a layer stack with its 'fqn' "
                            f"(as plan solve writes it), got {r!r:.60}; re-create the plan")
    stacks = [r["fqn"] for r in repeats]
    pattern = re.compile("|".join(rf"{re.escape(f)}\.\d+" for f in stacks)) if stacks else None
    blocks = []  # (stage position, block name, layer FQNs in it)
    by_name = {b["name"]: b for b in plan.model["blocks"]}
    for pos, st in enumerate(plan.stages):
        for name in st["blocks"]:
            mods = by_name[name]["modules"] if name in by_name else []
            found = [m for m in mods if pattern is not None and pattern.fullmatch(m)]
            blocks.append((pos, name, found))
    layers: list[list[str]] = [[] for _ in plan.stages]
    for pos, _, found in blocks:
        layers[pos].extend(found)
    with_layers = [i for i, (_, _, found) in enumerate(blocks) if found]
    if not with_layers:
        return Layout(stacks=stacks, layers=layers, pre=[], post=[], interior=[],
                      expected=sum(int(r.get("count", 0)) for r in repeats))
    first, last = with_layers[0], with_layers[-1]
    return Layout(
        stacks=stacks, layers=layers,
        pre=[(s, n) for s, n, _ in blocks[:first]],
        post=[(s, n) for s, n, _ in blocks[last + 1:]],
        interior=[n for _, n, found in blocks[first:last + 1] if not found],
        expected=sum(int(r.get("count", 0)) for r in repeats),
    )


def summary(plan: Plan) -> str:
    """The plan's configuration in one line, every knob included."""
    return f"{parallel_text(plan.parallel)}, placement {placement(plan)}"


def header(plan: Plan, target: str, version: str) -> list[str]:
    """Lines (without comment markers) naming the engine release and the source plan:
    deterministic, no timestamps."""
    m, c, prov = plan.model, plan.cluster, plan.provenance
    made_for = plan.search.get("target", "any")
    default = targets.engine(target).version
    which = (f"the default release for {target}" if version == default
             else f"the default is {default}")
    return [
        f"{target} {version} settings exported by planner from a plan ({plan.schema}).",
        f"model {m['name']}  fingerprint {m['fingerprint']}  "
        f"input_hash {prov['input_hash']}  planner {prov.get('planner', 'unknown')}",
        f"plan (made for target {made_for}): {summary(plan)}",
        f"on {cluster_text(c)}; global batch {plan.training['global_batch']} x "
        f"{plan.training['seq_len']} tokens, {plan.training['dtype']}, "
        f"{plan.training['optimizer']}",
        f"Written for {target} {version} ({which}; plan export --engine-version for another).",
    ]


def comment_block(lines: list[str], prefix: str = "# ") -> list[str]:
    return [(prefix + line).rstrip() for line in lines]


def notes_block(notes: list[str]) -> list[str]:
    """The section listing what is not expressed exactly (without comment markers)."""
    if not notes:
        return ["Every knob of the plan is expressed exactly below."]
    lines = ["Not expressed exactly, or not at all (each also warned on stderr; docs/exports.md):"]
    for note in notes:
        lines += textwrap.wrap(note, NOTE_WIDTH, initial_indent="- ", subsequent_indent="  ",
                               break_on_hyphens=False, break_long_words=False)
    return lines


def stage_counts_text(lay: Layout) -> str:
    return ", ".join(str(n) for n in lay.counts)


def placement(plan: Plan) -> str:
    return plan.parallel.get("placement", "tp-pp-dp")


def site_stages(plan: Plan, ledger: Ledger) -> None:
    """On a cluster of device groups or sites, which nodes run which pipeline stage: the engines
    number their ranks stage by stage (pipeline outermost), so the launch must put each stage's
    ranks on its site's nodes; no engine setting says it (the launcher's node ranks do)."""
    groups = {st["pipeline_rank"]: st["group"] for st in plan.stages if st.get("group")}
    if not groups:
        return
    per_stage = plan.cluster["num_gpus"] // plan.parallel["pp"]
    per_node = {g["name"]: g["gpus_per_node"] for g in plan.cluster.get("groups", [])}
    runs: list[list] = []  # [group, first stage, last stage]: consecutive stages on one group
    for k in sorted(groups):
        if runs and runs[-1][0] == groups[k] and runs[-1][2] == k - 1:
            runs[-1][2] = k
        else:
            runs.append([groups[k], k, k])
    spans, node = [], 0  # node: the launch's next node rank (nodes of sites differ in size)
    for group, s0, s1 in runs:
        first, last = s0 * per_stage, (s1 + 1) * per_stage - 1
        gpn = per_node.get(group, plan.cluster["gpus_per_node"])
        stages = f"stage {s0}" if s0 == s1 else f"stages {s0}-{s1}"
        if node is not None and (last - first + 1) % gpn == 0:
            n = (last - first + 1) // gpn
            stages += f", node rank {node}" if n == 1 else f", node ranks {node}-{node + n - 1}"
            node += n
        else:
            node = None  # stages share nodes with another group's: ranks only
        spans.append(f"ranks {first}-{last} ({stages}) on {group}")
    word = "sites" if plan.cluster.get("links") else "groups"  # (a sites YAML lists its links)
    ledger.missing("placement", f"{word}: the engine numbers its ranks pipeline stage by stage, "
                   f"so launch with the nodes ordered as the plan chains the {word}: "
                   + ", ".join(spans) + ("; another order is what `plan show` prices as the "
                                         "naive or a random placement" if word == "sites" else
                                         ""))


def replica_sites(plan: Plan, ledger: Ledger) -> int:
    """For a plan of data parallelism across sites (``dp_replicate`` > 1): the note that the
    launch numbers the ranks site after site, so that each site holds its replicas (the engines
    form their replicate groups from consecutive ranks of the data-parallel group); the number
    of sites (1 for any other plan, which this leaves alone)."""
    k = plan.parallel.get("dp_replicate", 1)
    if k == 1:
        ledger.exact("dp_replicate")
        return 1
    spans, first, node = [], 0, 0
    for g in plan.cluster["groups"]:
        n, gpus = g["nodes"], g["num_gpus"]
        spans.append(f"ranks {first}-{first + gpus - 1} (node ranks {node}-{node + n - 1}) on "
                     f"{g['name']}")
        first, node = first + gpus, node + n
    ledger.info(f"data parallel across {k} sites: launch with the nodes numbered site after site, "
                f"{', '.join(spans)}, so that each site holds {plan.parallel['dp'] // k} of the "
                f"{plan.parallel['dp']} replicas whole")
    return k


def schedule_words(name: str) -> str:
    return SCHEDULE_WORDS.get(name, repr(name))


def check_schedule(plan: Plan, target: str, runs: tuple[str, ...], ledger: Ledger,
                   nearest: dict[str, str]) -> str:
    """The schedule the engine runs for the plan's: its own, a ``nearest`` stand-in (noted), or a
    SpecError naming the schedule and the way to a plan the engine runs."""
    p = plan.parallel
    name = p["schedule"]
    if p["pp"] == 1:
        ledger.exact("schedule", "vpp")
        return name
    if name in runs:
        ledger.exact("schedule")
        return name
    if name in nearest:
        return nearest[name]
    raise SpecError(f"export {target}: {target} does not run the {schedule_words(name)} schedule "
                    f"of this plan (it runs {', '.join(map(schedule_words, runs))}); re-plan for "
                    f"it with `{resolve_hint(plan, target)}`")


def exported_zero(plan: Plan, target: str, *, one_rank_any: bool = False) -> int:
    """The ZeRO stage ``target`` runs for the plan's: the plan's, or beside a pipeline where the
    engine does not run it there (targets.Engine.zero_with_pp) the nearest lower stage it runs;
    ``one_rank_any``: the engine takes any stage where the states shard over one rank (dp x cp =
    1: Megatron-LM, whose flags are then none of ZeRO's)."""
    p, zero = plan.parallel, plan.parallel["zero"]
    runs = targets.engine(target).zero_with_pp
    if p["pp"] == 1 or zero in runs or (one_rank_any and p["dp"] * p.get("cp", 1) == 1):
        return zero
    return max(z for z in runs if z < zero)


SOFTWARE_KEYS = frozenset(k for preset in PRESETS.values() for k in preset
                          if not k.startswith("moe_"))
"""The engine settings that say which software runs the step (what the presets set, less the
MoE settings, which a re-plan keeps: _kept_engine_settings)."""
MEMORY_SOFTWARE_KEYS = frozenset({"attention", "kernels", "fused_scope", "fsdp_copies",
                                  "fsdp_experts", "cp_ring", "fp8_experts", "fp8_linear"})
"""The software settings that change what a GPU holds (activations, buffers) besides the
state layout, which the exports check apart (layout_differs)."""


STATE_LAYOUT_WORDS = {"zero": "model states as ZeRO lays them out (16-bit weights and gradients, "
                               "fp32 master weights and optimizer states)",
                      "megatron": "model states as Megatron-Core lays them out (fp32 main "
                                  "gradients)",
                      "megatron-bf16-grads": "model states as Megatron-Core lays them out with "
                                             "--grad-reduce-in-bf16",
                      "fsdp2": "model states as torchtitan's FSDP2 lays them out (fp32 "
                               "parameters and gradients)",
                      "native": "model states as the planner's runtime keeps them (in the "
                                "training dtype, no master copy)"}
"""How a re-check names a state layout (costmodels.memory.STATE_LAYOUTS) other than the plan's."""


def layout_note(plan: Plan, target: str, state_layout: str, ledger: Ledger) -> None:
    """Note, for a plan made for another target that does not record how it laid out the model
    states, that its memory is not priced again with the engine's layout."""
    if planned_layout(plan) is None and (plan.search or {}).get("target") != target:
        ledger.info(f"memory not re-checked with the {STATE_LAYOUT_WORDS[state_layout]}: the "
                    "plan does not record how it laid them out (made before plans recorded it); "
                    f"`{resolve_hint(plan, target)}` prices it as {target} runs it")


def layout_differs(plan: Plan, state_layout: str) -> bool:
    """Whether the engine lays the model states out otherwise than the plan was priced with
    (its memory must then be checked again, whatever else the export changes); False for a plan
    that does not record its layout (layout_note says so)."""
    planned = planned_layout(plan)
    return planned is not None and planned != state_layout


def planned_layout(plan: Plan) -> str | None:
    """How the plan priced the model states in memory (costmodels.engine ``state_layout``); None
    for a plan from before plans recorded it (2026-12-01), whose re-check would compare today's
    prices with another model's."""
    engine = plan.training.get("engine") or {}
    return engine_from_mapping(engine).state_layout if "state_layout" in engine else None


def software_of(target: str, plan: Plan | None = None) -> str:
    """The ``--engine`` preset of the software ``target`` runs (Megatron-Core's for Megatron-LM),
    with attention's scores in memory where a device of the ``plan``'s cluster has no
    FlashAttention kernel (as the planner priced it there: V100s)."""
    preset = targets.engine(target).software or "megatron-core"
    return preset + (",attention=materialized" if plan is not None and not _flash(plan) else "")


def blackwell_or_newer(plan: Plan) -> bool:
    """Whether every GPU of the plan's cluster is sm100 or newer (Blackwell: the devices whose
    tensor cores take block-scaled FP8, DeviceSpec.fp8_block_scaling), by name or, for a device
    of the cluster's own mapping (a calibrated one), by that mapping; False where one is neither."""
    names = {n for n in str(plan.cluster.get("device", "")).split("+") if n}
    known = _known_devices(plan)
    spec = plan.cluster.get("spec")
    own = spec.get("device") if isinstance(spec, dict) else None
    own = own if isinstance(own, dict) else {}
    return bool(names) and all(
        known[n].fp8_block_scaling if n in known else
        own.get("name") == n and own.get("fp8_block_scaling") is True for n in names)


def _known_devices(plan: Plan) -> dict:
    """Name -> DeviceSpec of the plan's cluster's devices this planner knows by name."""
    out = {}
    for name in str(plan.cluster.get("device", "")).split("+"):
        try:
            out[name] = get_device(name)
        except PlannerError:
            pass
    return out


def devices_without(plan: Plan, dtype: str) -> list[str]:
    """The plan's cluster's devices (known to this planner) with no ``dtype`` arithmetic."""
    return [n for n, d in _known_devices(plan).items() if dtype not in d.peak_flops]


def _flash(plan: Plan) -> bool:
    """Whether every device of the plan's cluster runs FlashAttention (DeviceSpec.flash_attention;
    a device this planner does not know: taken as running it)."""
    return all(d.flash_attention for d in _known_devices(plan).values())


def software_differs(plan: Plan, target: str, keys=SOFTWARE_KEYS) -> bool:
    """Whether the plan was priced for other software than ``target`` runs in ``keys`` (kernels,
    attention, state layout...): its times differ there (MEMORY_SOFTWARE_KEYS: and what a GPU
    holds)."""
    planned = engine_from_mapping(plan.training.get("engine"))
    runs = engine_from_mapping(software_of(target, plan))
    if plan.training.get("dtype") != "fp8" or not moe.model(plan).moe:
        keys = keys - {"fp8_experts"}  # (which experts' GEMMs run in FP8: fp8 MoE plans only)
    if plan.training.get("dtype") != "fp8":
        keys = keys - {"fp8_linear"}  # (whose FP8 Linear: fp8 plans only)
    if plan.parallel.get("tp", 1) == 1:
        keys = keys - {"tp_grad_overlap"}  # (tensor parallelism's collectives: tp > 1 only)
    return any(getattr(planned, k) != getattr(runs, k) for k in keys)


def kernels_differ(plan: Plan, target: str) -> bool:
    """Whether ``target`` runs other software than the plan was priced for in what changes a
    GPU's memory (MEMORY_SOFTWARE_KEYS), so that its memory must be checked again; False for a
    plan that does not record its software in full (made before plans recorded their state
    layout: layout_note says so)."""
    return (planned_layout(plan) is not None
            and software_differs(plan, target, MEMORY_SOFTWARE_KEYS))


def mtp_depths(plan: Plan) -> int:
    """The multi-token-prediction depths the plan prices (model.mtp_depths; planner.trace.mtp)."""
    return int(plan.model.get("mtp_depths", 0) or 0)


def mtp_stages(plan: Plan, lay: Layout) -> list[int]:
    """The stage of the block holding the plan's MTP depths ([] where it has none: a plan from
    before they had a block of their own priced them in the head's)."""
    return [stage for stage, name in lay.post if is_mtp_block(name)]


def mtp_note(plan: Plan, target: str, ledger: Ledger) -> None:
    """For a target without multi-token prediction (torchtitan, DeepSpeed): the plan priced the
    model's MTP depths (model.mtp_depths) after its last layer, which the target does not
    train."""
    depths = mtp_depths(plan)
    if depths:
        ledger.missing("mtp_depths", f"{depths} multi-token-prediction depth(s): the plan prices "
                       f"them after the last layer, and {target} does not train them (its model "
                       "is the main one): their stage runs faster than planned; plan the config "
                       "with num_nextn_predict_layers: 0 for a split without them")


def frozen_note(plan: Plan, target: str, ledger: Ledger) -> None:
    """Say so when the plan priced frozen parameters (model.frozen_params): the export carries
    the layout, not which parameters train. A model built from its configuration (a zoo name, a
    config.json) froze them itself: transformers builds Whisper's sinusoidal positions frozen."""
    frozen = plan.model.get("frozen_params")
    if frozen and plan.model.get("source") in ("zoo", "hf-config"):
        ledger.info(f"frozen parameters: {frozen_words(frozen, plan.model['num_params'])}, as "
                    "transformers builds the model (fixed tables such as sinusoidal positions), "
                    f"and the plan priced them so; {target}'s model of it must keep them frozen "
                    "too")
    elif frozen:
        ledger.info(f"frozen parameters: {frozen_words(frozen, plan.model['num_params'])}, and "
                    f"the plan priced them so; {target} trains what the model it builds leaves "
                    "trainable: freeze the same parameters there (its fine-tuning or LoRA "
                    "setup), or the step takes more memory and time than planned")


def software_note(plan: Plan, target: str, ledger: Ledger) -> None:
    """Say so when the plan's times were priced for other software than ``target`` runs (a plan
    for --target any is priced as Megatron-Core runs it): the engine runs the layout, at its own
    speed, and the re-plan command prices it as the engine runs it."""
    if not software_differs(plan, target):
        return
    planned = engine_from_mapping(plan.training.get("engine"))
    software = software_of(target, plan)
    priced = engine_setting(planned)
    ledger.info(f"timing: the plan was priced for the software of --engine {priced} "
                f"({plan.predicted['step_time_s']:.4g} s a step), not for what {target} runs "
                f"(--engine {software}); its step takes another time there: "
                f"`{resolve_hint(plan, target)}` prices it as {target} runs it")


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def slug(text: str) -> str:
    """A file-name-safe form of a model name."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return out or "model"
