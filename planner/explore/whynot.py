"""Why not these knobs? Re-plan a plan's own model, training and cluster with some knobs pinned,
and say what changes, or why nothing fits: the search's reasons, the space's rules the pinned
configuration breaks, and, priced outside the search, the memory of each stage that does not fit.
Returns data (``WhyNot``); planner.report.why turns it into text.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

from costmodels.engine import engine_from_mapping
from costmodels.topology import HeteroCluster
from planner import api, settings
from planner.emit import emit
from planner.errors import PlannerError, SpecError
from planner.inputs.clusters import planned_cluster
from planner.options import KNOBS, Config, SearchOptions, TrainingSpec, parse_fix
from planner.planfile.document import Plan
from planner.report.compare import stage_blocks
from planner.report.text import pins_text
from planner.search.costs import ModelArrays, capacity_bytes, config_costs
from planner.search import hetero
from planner.search.feasibility import cluster_pin_problem, pin_problem
from planner.search.loop import OUTCOMES, SearchResult, rejection_lines, search
from planner.search.pricing import price
from planner.search.refine import simulated
from planner.search.space import TP_CLASS, TP_INNER, TP_MODEL, Space, pp_reason, tp_reasons
from planner.solve.chain import partition

log = logging.getLogger(__name__)


@dataclass
class WhyNot:
    """The answer to "why not these knobs?" for a plan."""

    pins: dict
    """The knobs asked about."""
    variant: Plan | None
    """With the knobs pinned: the planner's best plan, or (when the search finds none) the plan's
    own configuration with the knobs changed, priced on a time-balanced split; None when it
    cannot even be priced."""
    feasible: bool
    """Whether the planner itself finds a plan with these knobs."""
    message: str = ""
    """The planner's reason when it finds none."""
    notes: list = None
    """Why the search sets such a configuration aside, besides memory."""
    over: list = None
    """(stage, its blocks, bytes it would need, its memory by kind) for every stage that does not
    fit, with ``usable`` and ``device`` bytes in ``limits``."""
    limits: tuple = (0.0, 0.0)
    """(usable bytes per GPU after the reserve, the device's bytes)."""


def _for_show(message: str) -> str:
    """A refusal worded for `plan show --why`, which re-plans for the plan's own target: the
    other target is a new `plan solve`."""
    return message.replace("use --target any", "re-solve with plan solve ... --target any")


def _as_why(message: str, pins: dict, fixed: dict | None = None) -> str:
    """A refusal of pins named as --why gave them: ``fix.tp: ...`` -> ``why.tp: ...`` for a knob
    of ``pins``, ``fix: ...`` (the pins together) -> ``why: ...``. A refusal of a knob the plan
    itself fixed (``fixed``) that names a pin too (``fix.ep: ep x etp = 32 ...`` for --why
    etp=2) is the pins' with that value kept, and says so."""
    field, sep, rest = message.partition(":")
    if field == "fix":
        return "why" + sep + rest
    knob = field.removeprefix("fix.")
    if field.startswith("fix.") and knob in pins:
        return "why." + message[4:]
    if field.startswith("fix.") and knob in (fixed or {}) and any(
            re.search(rf"\b{re.escape(k)}\b", rest) for k in pins):
        return (f"why{sep}{rest} (with the plan's own {knob}={fixed[knob]} kept; give "
                f"{knob} in --why too to change it)")
    return message


def _fixed(plan: Plan) -> dict:
    """The knobs the plan was made with pinned (its ``--fix``)."""
    return dict(plan.search.get("options", {}).get("fix", {}))


def why_not(plan: Plan, pins, model: str | None = None) -> WhyNot:
    """Re-plan ``plan``'s own model (or ``model``, a MODEL where the plan's is not found or was
    a Python object), training and cluster with ``pins`` fixed (on top of what the plan already
    fixed) and return what changes, or why nothing fits."""

    if plan.embeddings:  # (before its knobs: sharding is none of the dense knobs --why takes)
        raise SpecError("why: not available for recommendation plans (sharded embedding tables); "
                        "re-plan with plan solve ... --fix, or compare layouts with plan whatif "
                        "--vary sharding=...")
    pins = parse_fix(pins, where="why", example="--why tp=16,pp=1")
    if not pins:
        raise SpecError("why: name the knobs to try, e.g. --why tp=16 or --why pp=1,zero=3")
    carried, carried_notes = _carried(plan, pins)
    try:
        prepared, cluster, training, options = replan_inputs(plan, {**carried, **pins}, model)
    except SpecError as err:  # a pin the plan's target refuses: named as the option gave it
        raise SpecError(_as_why(_for_show(str(err)), pins, _fixed(plan))) from None
    if isinstance(cluster, HeteroCluster) and (
            not cluster.is_sites or options.across_sites == "pipeline"
            or len(set(hetero.kinds(cluster))) > 1):  # only a pipeline over them can run
        try:  # a knob it does not price, refused before the slow part (a new-user check waited
            hetero.restrict(options)  # 7 s); alike sites' replicas may run it (plan_prepared)
        except SpecError as err:
            raise SpecError(_as_why(str(err), pins, _fixed(plan))) from None
    if getattr(cluster, "is_sites", False):  # the pipeline over the sites, or data parallelism
        return _over_sites(plan, pins, prepared, cluster, training, options,  # across them
                           carried_notes)
    result = search(prepared.blocks, cluster, training, options)
    if result.best is not None:
        variant = emit(model_info=prepared.info, opgraph=prepared.opgraph, bg=prepared.blocks,
                       result=result, cluster=cluster, training=training, options=options)
        return WhyNot(pins=pins, variant=variant, feasible=True,
                      notes=_kept(plan, pins) + carried_notes + _lifted(plan, pins)
                      + settings.idle_pins(pins, variant.parallel.get("cp", 1),
                                         variant.parallel["pp"], variant.parallel["dp"])
                      + _untried(plan, variant, options), over=[])
    grouped = isinstance(cluster, HeteroCluster)
    problem = pin_problem(dict(options.fix), Space.of(
        cluster, prepared.blocks, options, image=bool(prepared.info.get("image_tokens"))),
        training, options)
    if problem:  # a pin the model or cluster cannot take is bad input, as in solve, named as
        raise SpecError(_as_why(problem, pins, _fixed(plan)))  # the option that gave it
    if grouped and not any(result.rejected[r] for r in OUTCOMES):  # the rules alone: bad input
        rules = "; ".join(filter(None, rejection_lines(result.rejected)))
        raise SpecError(f"why: no configuration with {pins_text(pins)} is possible on the "
                        f"cluster's groups ({rules}); try other knobs")
    aside, ruled = rejection_lines(result.rejected)
    ruled = f"ruled out by the rules: {ruled}" if ruled else ""
    message = (f"all {result.candidates} configurations with {pins_text(pins)} set aside ("
               + "; ".join(filter(None, (aside, ruled))) + ")" if result.candidates
               else f"no configuration has {pins_text(pins)} ({ruled or 'none counted'})")
    if grouped:  # (what the pinned configuration would need is priced on one kind of node)
        return WhyNot(pins=pins, variant=None, feasible=False, message=message,
                      notes=carried_notes + _lifted(plan, pins), over=[])

    limits = (capacity_bytes(cluster, options), cluster.device.memory_bytes)
    cfg, problem = pinned_config(plan, pins)
    notes = carried_notes + _lifted(plan, pins) + ([problem] if problem else
                                   structural_notes(cfg, cluster, prepared.blocks, options))
    variant = None if problem or any(n.startswith("cannot") for n in notes) else hypothetical(
        cfg, prepared, cluster, training, options)
    over = [] if variant is None else [
        (st["index"], stage_blocks(st), st["predicted"]["memory_bytes"]["total"],
         st["predicted"]["memory_bytes"]) for st in variant.stages
        if st["predicted"]["memory_bytes"]["total"] > limits[0]]
    return WhyNot(pins=pins, variant=variant, feasible=False, message=message, notes=notes,
                  over=over, limits=limits)


def _over_sites(plan: Plan, pins: dict, prepared, cluster, training: TrainingSpec,
                options: SearchOptions, carried_notes: list[str]) -> WhyNot:
    """--why on a plan over sites: re-planned as plan solve plans sites (planner.api.plan_prepared:
    the pipeline over the sites, or data parallelism across them where faster or where only it
    takes the pins), with ``pins`` fixed."""
    try:
        variant = api.plan_prepared(prepared, cluster, training, options, compare_groups=False,
                                    warn_default_engine=False)
    except SpecError as err:  # a pin the rules refuse: bad input, named as --why gave it
        raise SpecError(_as_why(_for_show(str(err)), pins, _fixed(plan))) from None
    except PlannerError as err:  # nothing fits with the pins
        return WhyNot(pins=pins, variant=None, feasible=False,
                      message=str(err).splitlines()[0],
                      notes=carried_notes + _lifted(plan, pins), over=[])
    return WhyNot(pins=pins, variant=variant, feasible=True,
                  notes=_kept(plan, pins) + carried_notes + _lifted(plan, pins)
                  + settings.idle_pins(pins, variant.parallel.get("cp", 1),
                                         variant.parallel["pp"], variant.parallel["dp"])
                  + _untried(plan, variant, options), over=[])


CARRIERS = {"cp_comm": ("cp", "the form of its context parallelism"),
            "schedule": ("pp", "the order of its pipeline's passes")}
"""A knob that only applies with another above 1 -> (that other, what the knob is of it)."""


def _carried(plan: Plan, pins: dict) -> tuple[dict, list[str]]:
    """The plan's own degrees kept beside pins that apply only with them (cp_comm with its cp,
    a schedule with its pp), where the pins leave the degree free: asked "why not a2a?" of a
    cp=2 plan, the answer is cp=2 with a2a, not whichever cp is best with a2a (cp=1, where the
    form is not used). With the notes that say so."""
    carried, notes = {}, []
    for knob, (degree, what) in CARRIERS.items():
        own = plan.parallel.get(degree) or 1
        if knob in pins and degree not in pins and own > 1 and not cluster_pin_problem(
                {**pins, degree: own}, plan.cluster["num_gpus"], plan.training["global_batch"]):
            # (not where the other pins leave it no room: --why cp_comm=a2a,dp=8 of a cp=2 plan
            # on 8 GPUs was refused for a cp never asked for)
            carried[degree] = own
            notes.append(f"the plan's own {degree}={own} kept ({knob} is {what}); give {degree} "
                         f"too to try another")
    return carried, notes


def _kept(plan: Plan, pins: dict) -> list[str]:
    """A note when the plan already has every pinned value."""
    if all(plan.parallel.get(k) == v for k, v in pins.items()):
        return [f"the plan already has {pins_text(pins)}"]
    return []


def _lifted(plan: Plan, pins: dict) -> list[str]:
    """A note when the answer replaces a value the plan was made with (``--fix``): its search
    never tried the one asked about."""
    made_with = plan.search.get("options", {}).get("fix", {})
    lifted = {k: v for k, v in made_with.items() if k in pins and pins[k] != v}
    if lifted:
        return [f"the plan was made with --fix {pins_text(lifted)}, so its search did not try "
                f"{pins_text({k: pins[k] for k in lifted})}"]
    return []


def _untried(plan: Plan, variant: Plan, options: SearchOptions) -> list[str]:
    """Why the plan's search did not find ``variant`` where it is faster: context parallelism
    shorter than the search tries (SearchOptions.cp_min_tokens)."""
    cp = variant.parallel.get("cp", 1)
    per_rank = plan.training["seq_len"] // max(cp, 1)
    made_with = plan.search.get("options", {}).get("fix", {})
    if variant.step_time_s < plan.step_time_s and cp > 1 and "cp" not in made_with and \
            per_rank < options.cp_min_tokens:
        return [f"the search does not try context parallelism below {options.cp_min_tokens:,} "
                f"tokens per cp rank ({per_rank:,} here at cp={cp}): pin cp, or lower "
                "SearchOptions.cp_min_tokens from the Python API"]
    return []


def replan_inputs(plan: Plan, pins: dict, model: str | None = None):
    """(prepared model, cluster, training, options) of the plan, with ``pins`` added to its fix;
    ``model``: the MODEL to trace instead of the plan's."""
    spec = plan.model_spec(model)
    cluster = planned_cluster(plan.cluster, "why")
    t = plan.training
    training = TrainingSpec(global_batch=t["global_batch"], seq_len=t["seq_len"], dtype=t["dtype"],
                            optimizer=t["optimizer"], engine=engine_from_mapping(t.get("engine")))
    recorded = dict(plan.search.get("options", {}).get("fix", {}))
    layout = plan.search.get("options", {}).get("layout")
    if layout and "vpp" not in pins:
        recorded.pop("vpp", None)  # (the layout's stages over pp make it: with_layout again)
    fix = {**recorded, **pins}
    try:
        prepared = api.prepare(spec, seq_len=t["seq_len"], dtype=t["dtype"])
    except SpecError as err:
        raise plan.moved_model(err, spec) from None
    problem = plan.fingerprint_problem(spec, prepared.info["fingerprint"])
    if problem and model:  # another model than the one planned, as plan run refuses it
        raise SpecError(problem)
    if problem:
        log.warning("%s traces differently now than when the plan was made", spec)
    # re-timed as plan solve does, for the engine the plan was made for
    options = SearchOptions(fix=fix, target=plan.search.get("target", "any"),
                            across_sites=plan.search.get("options", {}).get("across_sites",
                                                                             "auto"),
                            layout=layout, **plan.memory_reserve())
    return prepared, cluster, training, settings.with_layout(
        settings.narrowed(options, prepared, training), prepared,
        hetero=isinstance(cluster, HeteroCluster))


def pinned_config(plan: Plan, pins: dict):
    """The plan's configuration with ``pins`` applied and the rest adjusted to stay legal
    (dp x cp x tp x pp = GPUs, micro-batches filling the batch); (Config, "") or (None, problem)."""
    p = {**{k: plan.parallel[k] for k in KNOBS if k in plan.parallel}, **pins}
    gpus, batch = plan.cluster["num_gpus"], plan.training["global_batch"]
    ranks = ("dp", "cp", "tp", "pp")
    p.setdefault("cp", 1)
    if math.prod(p[k] for k in ranks) != gpus:
        for k in (k for k in ("dp", "pp", "tp", "cp") if k not in pins):
            rest = math.prod(p[j] for j in ranks) // p[k]
            if gpus % rest == 0:
                p[k] = gpus // rest
                break
        else:
            return None, (f"{pins_text(pins)} cannot make dp x cp x tp x pp equal the {gpus} "
                          "GPUs")
    if batch % p["dp"]:
        return None, f"the global batch {batch} does not split over dp={p['dp']} replicas"
    if (batch // p["dp"]) % p["micro_batch"]:
        if "micro_batch" in pins:
            return None, f"micro_batch={p['micro_batch']} does not divide {batch // p['dp']}"
        p["micro_batch"] = 1
    p["num_microbatches"] = batch // (p["dp"] * p["micro_batch"])
    if p["tp"] == 1:
        p["sequence_parallel"] = False
    if p["dp"] == 1 and "zero" not in pins:
        p["zero"] = 0
    if p["zero"] == 0 and "offload_optimizer" not in pins:
        p["offload_optimizer"] = False
    if "vpp" in pins and pins["vpp"] > 1 and "schedule" not in pins:
        p["schedule"] = "interleaved-1f1b"
    if p["pp"] == 1 and "schedule" not in pins:
        p["schedule"] = "1f1b"
    if p["schedule"] != "interleaved-1f1b" or p["pp"] == 1:
        p["vpp"] = 1
    return Config(**p), ""


def structural_notes(cfg, cluster, bg, options: SearchOptions | None = None) -> list[str]:
    """The space's rules the configuration breaks (planner.search.space) for the target of
    ``options``, besides memory; 'cannot ...' when it cannot be priced at all."""
    notes = []
    space = Space.of(cluster, bg, options)
    broken = tp_reasons(cfg.tp, space, pinned=True)
    if TP_MODEL in broken:
        notes.append(f"cannot split: tp={cfg.tp} does not divide the heads and hidden sizes "
                     f"({', '.join(map(str, space.tp_divisors))})")
    if TP_INNER in broken:
        notes.append(f"tp={cfg.tp} splits attention that keeps weights of its own (per-head "
                     "norms or attention sinks), which the plan's target does not run")
    if TP_CLASS in broken:
        notes.append(f"tp={cfg.tp} splits {space.tp_unsplit}, and the plan's target splits "
                     "unfused nn.Linear and nn.Embedding only")
    if pp_reason(cfg.pp, cfg.vpp, space):
        notes.append(f"cannot cut {len(bg.blocks)} blocks into pp={cfg.pp} x vpp={cfg.vpp} stages")
    return notes


def hypothetical(cfg, prepared, cluster, training, options) -> Plan:
    """``cfg`` priced outside the search: stages split to balance time (memory unchecked), the
    pipeline simulated as the planner's own plans are."""
    ma = ModelArrays.from_blocks(prepared.blocks)
    costs = config_costs(ma, cluster, training, cfg)
    part = partition(costs.split_s(cfg), cfg.pp * cfg.vpp)  # (as the search balances them)
    est = simulated(price(cfg, part.bounds, ma, costs, cluster, training), training)
    result = SearchResult(best=est, alternatives=[], candidates=1, evaluated=1, status="fixed")
    return emit(model_info=prepared.info, opgraph=prepared.opgraph, bg=prepared.blocks,
                result=result, cluster=cluster, training=training, options=options)
