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
from dataclasses import dataclass, field, replace

from costmodels.engine import (PRESET_PROPERTIES, PRESETS, EngineSpec, engine_from_mapping,
                               engine_setting, setting_text)
from costmodels.hardware import get_device
from costmodels.memory import MODULES, modules_of
from costmodels.topology import CLUSTERS, get_cluster
from planner.errors import PlannerError, SpecError
from planner.export import moe
from planner.inputs.calibration import CALIBRATED
from planner.options import (KNOBS, SearchOptions, fix_text, parallel_text, pp_inner_refused,
                             zero_runs_with_cp)
from planner.planfile.document import Plan
from planner import targets
from planner.trace.graph import frozen_words
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


def cluster_args(cluster: dict) -> str:
    """The `plan solve` arguments that give a plan's cluster (its ``cluster`` section) back: a
    preset's name with the nodes and GPUs per node it was resized to, where the plan's cluster
    is that (with ``--calibration CALIBRATION_JSON`` where a calibration priced it: the plan
    names the preset, not the file); else CLUSTER_YAML, standing for the YAML it was read from
    (which the plan does not name), with its size."""
    name, nodes, per_node = cluster.get("name"), cluster["nodes"], cluster["gpus_per_node"]
    base = str(name).removesuffix(CALIBRATED)
    if base != name and base in CLUSTERS and "groups" not in cluster:
        return (f"--cluster {base} --nodes {nodes}"
                + (f" --gpus-per-node {per_node}" if per_node != CLUSTERS[base].gpus_per_node
                   else "") + " --calibration CALIBRATION_JSON")
    if name in CLUSTERS and "groups" not in cluster:
        preset = CLUSTERS[name]
        try:
            again = get_cluster(name, nodes=nodes, gpus_per_node=per_node).to_mapping()
        except SpecError:
            again = None
        if again is not None and again == cluster.get("spec", again):
            return f"--cluster {name} --nodes {nodes}" + (
                f" --gpus-per-node {per_node}" if per_node != preset.gpus_per_node else "")
    if "groups" in cluster:  # its nodes are the groups', in the YAML
        return "--cluster CLUSTER_YAML"
    return f"--cluster CLUSTER_YAML --nodes {nodes} --gpus-per-node {per_node}"


def reserve_args(plan: Plan) -> str:
    """The `plan solve` flags of the memory the plan kept free on each device, where it is not
    the default ('' where it is)."""
    if not plan.search.get("options", {}).get("memory_reserve"):
        return ""
    kept = plan.memory_reserve()
    return (f" --memory-reserve-fraction {kept['memory_reserve_fraction']:.6g}"
            f" --memory-reserve-gb {kept['memory_reserve_bytes'] / 1e9:.6g}")


def resolve_hint(plan: Plan, target: str, pins: dict | None = None, *,
                 nearest: bool = True) -> str:
    """The `plan solve` command that makes a plan for ``target`` from the same inputs (the plan's
    pins kept, less those the engine cannot run, and ``pins`` put over them). A pinned
    recomputation the engine does not run becomes its nearest (``nearest``: torchtitan's per-op
    policy for Megatron's selective, moe_act and mla_up_proj), or is left to the search (where
    the nearest did not fit)."""
    spec = plan.model.get("spec") or "MODEL"
    c, t = plan.cluster, plan.training
    eng = targets.engine(target)
    fix = {**plan.search.get("options", {}).get("fix", {}), **(pins or {})}
    pipelined = int(fix.get("pp", 1)) > 1
    runs = {"schedule": eng.schedules, "zero": eng.zero_with_pp if pipelined else eng.zero,
            "offload_optimizer": (False, True) if eng.offload else (False,),
            "sequence_parallel": eng.sequence_parallel, "cp_comm": eng.cp_comms,
            "recompute": eng.recompute}
    if pipelined and not eng.tp_with_pp:
        runs["tp"] = (1,)  # no tensor parallelism beside a pipeline
    if not eng.expert_tensor_parallel:
        runs["etp"] = (1,)
    if "interleaved-1f1b" not in eng.schedules:  # virtual stages only interleave
        runs["vpp"] = (1,)
    if int(fix.get("ep", 1)) > 1 and True not in eng.sequence_parallel:
        runs["tp"] = (1,)  # experts with tp > 1 need sequence parallelism (planner.search.space)
    facts = moe.model(plan)
    # the exchanges it runs over this model's attention (latent, windowed, with sinks)
    forms = [f for f, has in (("latent", facts.mla), ("sliding_window", facts.sliding_window),
                              ("sinks", facts.sinks)) if has]
    runs["cp_comm"] = tuple(c for c in eng.cp_comms
                            if all(c in eng.exchanges_over(f) for f in forms))
    cp, ep = int(fix.get("cp", 1)), int(fix.get("ep", 1))
    if cp > 1:  # the stages it shards with context parallelism (and with experts too)
        runs["zero"] = tuple(z for z in runs["zero"] if zero_runs_with_cp(eng, z, ep=ep))
    if facts.expert_bias and not eng.etp_with_expert_bias:
        runs["etp"] = (1,)
    tp = int(fix.get("tp", 1))
    seq = int(t["seq_len"])
    if eng.seq_split_2cp_tp and seq % (2 * cp * tp):  # pins the target cannot run at this length
        runs["tp"] = tuple(x for x in range(1, tp + 1) if seq % (2 * cp * x) == 0)
        if seq % (2 * cp):
            runs["cp"] = (1,)
    if pp_inner_refused(eng, pp=int(fix.get("pp", 1)), dp=2, tp=tp, cp=cp, ep=ep,
                        etp=int(fix.get("etp", 1)), experts=facts.moe):
        runs["placement"] = ("tp-dp-pp",)  # (dp=2: any data parallelism, the rule's case)
    if eng.ep_needs_sharding and int(fix.get("dp", 2)) * cp == 1:
        runs["ep"] = (1,)  # experts spread only with sharded data parallelism
    if eng.experts_split_without_ep and facts.moe and ep == 1 and tp > 1:
        runs["etp"] = (tp,)  # the experts split over tp whatever etp says
    if fix.get("recompute") in ("selective", *MODULES) and fix["recompute"] not in runs["recompute"]:
        if nearest and "op" in runs["recompute"]:
            fix["recompute"] = "op"  # the engine's nearest: its per-op policy
        else:
            del fix["recompute"]  # the target's search picks its own
    kept_pins = _passing({k: v for k, v in fix.items() if k not in runs or v in runs[k]}, target)
    kept, dropped = _kept_engine_settings(plan, target)
    software = engine_from_mapping(",".join([eng.software or "megatron-core", *kept]))
    rc = kept_pins.get("recompute", "")
    why = "moe_act" in modules_of(rc) and targets.moe_act_refusal(target, software,
                                                                  t.get("dtype", "bf16"))
    if why:  # (the rest of a policy of several modules kept: mla_up_proj+moe_act -> mla_up_proj)
        rest = "+".join(m for m in modules_of(rc) if m != "moe_act")
        if rest:
            kept_pins["recompute"] = rest
        else:
            del kept_pins["recompute"]
        dropped = [*dropped, f"recompute moe_act {why}"]
    pinned = fix_text(kept_pins)
    extra = "".join(f" --{k} {t[k]}" for k, default in (("dtype", "bf16"), ("optimizer", "adam"))
                    if t.get(k, default) != default)
    if kept:  # the target's software, with the plan's MoE and FP8 assumptions over it
        extra += f" --engine {','.join([eng.software or 'megatron-core', *kept])}"
    across = plan.search.get("options", {}).get("across_sites")
    if across:  # (a plan over sites made with --across-sites pipeline or replicas)
        extra += f" --across-sites {across}"
    layout = plan.search.get("options", {}).get("layout")
    if layout:  # (a plan whose stages were pinned with --layout)
        extra += f" --layout '{layout}'"
    extra += reserve_args(plan)
    notes = [f"without {', '.join(dropped)}, which {target} does not run"] if dropped else []
    if pipelined and not eng.tp_with_pp and int(plan.parallel.get("tp", 1)) > 1 and \
            "pp" in kept_pins:  # (a new-user check: the pinned pp then fit nowhere, exit 3)
        notes.append(f"{target} runs no tensor parallelism beside a pipeline: if nothing fits "
                     f"with pp={kept_pins['pp']}, leave pp out")
    return (f"plan solve {spec} {cluster_args(c)} --global-batch "
            f"{t['global_batch']} --seq-len {t['seq_len']}{extra}"
            + (f" --fix {pinned}" if pinned else "") + f" --target {target}"
            # (a shell comment: the command stays one to paste)
            + (f"  # {'; '.join(notes)}" if notes else ""))


def _passing(fix: dict, target: str) -> dict:
    """``fix`` less the pins the target's own pin checks refuse (targets.restrict), such as cp
    beside a pipeline for an engine that runs context parallelism with data parallelism only."""
    return _less_refused(fix, lambda f: targets.restrict(SearchOptions(fix=f), target), "fix.")


def _less_refused(settings: dict, check, prefix: str) -> dict:
    """``settings`` less those ``check`` refuses: the one each SpecError names (its field less
    ``prefix``), in turn, until the check passes or names none of them."""
    settings = dict(settings)
    while settings:
        try:
            check(settings)
            return settings
        except SpecError as exc:
            key = exc.field.removeprefix(prefix)
            if key not in settings:
                return settings
            del settings[key]
    return settings


SOFTWARE_KEYS = frozenset(k for preset in PRESETS.values() for k in preset
                          if not k.startswith("moe_"))
"""The engine settings that say which software runs the step (what the presets set, less the
MoE settings, which a re-plan keeps: _kept_engine_settings)."""
MEMORY_SOFTWARE_KEYS = frozenset({"attention", "kernels", "fused_scope", "fsdp_copies",
                                  "fsdp_experts", "cp_ring", "fp8_experts"})
"""The software settings that change what a GPU holds (activations, buffers) besides the
state layout, which the exports check apart (layout_differs)."""


STATE_LAYOUT_WORDS = {"zero": "model states as ZeRO lays them out (16-bit weights and gradients, "
                               "fp32 master weights and optimizer states)",
                      "megatron": "model states as Megatron-Core lays them out (fp32 main "
                                  "gradients)",
                      "megatron-bf16-grads": "model states as Megatron-Core lays them out with "
                                             "--grad-reduce-in-bf16",
                      "fsdp2": "model states as torchtitan's FSDP2 lays them out (fp32 "
                               "parameters and gradients)"}
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


def mtp_note(plan: Plan, target: str, ledger: Ledger) -> None:
    """For a target without multi-token prediction (torchtitan, DeepSpeed): the plan priced the
    model's MTP depths (model.mtp_depths) on its last stage, which the target does not train."""
    depths = mtp_depths(plan)
    if depths:
        ledger.missing("mtp_depths", f"{depths} multi-token-prediction depth(s): the plan prices "
                       f"them on the last stage, and {target} does not train them (its model is "
                       "the main one): that stage runs faster than planned; plan the config with "
                       "num_nextn_predict_layers: 0 for a split without them")


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


def _kept_engine_settings(plan: Plan, target: str) -> tuple[list[str], list[str]]:
    """(kept, dropped): the plan's engine settings a re-plan for ``target`` keeps, as ``k=v``: its
    MoE settings, FP8 recipe and tensor-parallel overlap where they differ from the defaults (the
    rest is the target's software), less those the target refuses (targets.check_engine and
    check_overlap; padding to capacity without
    the capacity factor it needs is refused by EngineSpec itself, and goes next), which are the
    dropped."""
    engine, default = engine_from_mapping(plan.training.get("engine")), EngineSpec()
    # what the plan's software preset sets is that software's, not a choice to carry over
    chosen = [part.partition("=")[0] for part in engine_setting(engine).split(",")[1:]]
    kept = {k: getattr(engine, k) for k in chosen
            if (k.startswith("moe_") or k in ("fp8_recipe", "tp_overlap"))
            and k not in PRESET_PROPERTIES}
    model_type = plan.model.get("model_type") or moe.model(plan).model_type or None
    wanted = dict(kept)

    def refused(s: dict) -> None:
        targets.check_engine(replace(default, **s), target, model_type)
        targets.check_overlap(replace(default, **s), target)
    kept = _less_refused(kept, refused, "engine.")
    return ([f"{k}={setting_text(v)}" for k, v in kept.items()],
            [f"{k}={setting_text(v)}" for k, v in wanted.items() if k not in kept])


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def slug(text: str) -> str:
    """A file-name-safe form of a model name."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return out or "model"
