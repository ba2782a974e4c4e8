"""The `plan solve` command an export suggests where the plan does not run as planned on its
target: the same inputs, the plan's pins less those the engine refuses, its cluster given back
(a preset's name and size, or CLUSTER_YAML) and the engine settings a re-plan keeps."""

from __future__ import annotations

from dataclasses import replace

from costmodels.engine import (PRESET_PROPERTIES, EngineSpec, engine_from_mapping,
                               engine_setting, setting_text)
from costmodels.memory import MODULES, modules_of
from costmodels.topology import CLUSTERS, get_cluster
from planner import targets
from planner.errors import SpecError
from planner.export import moe
from planner.inputs.calibration import CALIBRATED
from planner.options import (SearchOptions, fix_text, parse_layout, pp_inner_refused,
                             zero_runs_with_cp)
from planner.planfile.document import Plan


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
    layout = plan.search.get("options", {}).get("layout")
    stages = len(parse_layout(layout)) if layout else 0
    if stages and "interleaved-1f1b" not in eng.schedules and "pp" in kept_pins:
        kept_pins["pp"] = stages  # one stage per rank (a new-user check was given the pp the
        # plan had, which the layout then made interleaved on a target that runs no such schedule)
    pinned = fix_text(kept_pins)
    extra = "".join(f" --{k} {t[k]}" for k, default in (("dtype", "bf16"), ("optimizer", "adam"))
                    if t.get(k, default) != default)
    if kept:  # the target's software, with the plan's MoE and FP8 assumptions over it
        extra += f" --engine {','.join([eng.software or 'megatron-core', *kept])}"
    across = plan.search.get("options", {}).get("across_sites")
    if across:  # (a plan over sites made with --across-sites pipeline or replicas)
        extra += f" --across-sites {across}"
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
