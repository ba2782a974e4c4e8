"""Compare two plans: what differs in the configuration, and where the step time moved.

Returns data (and one-line summaries); printing is the CLI's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.emit import BREAKDOWN_WORDS
from planner.plan import Plan

KNOBS = ("dp", "tp", "pp", "vpp", "micro_batch", "num_microbatches", "schedule", "recompute",
         "zero", "sequence_parallel", "offload_optimizer", "placement")


def config_changes(a: Plan, b: Plan) -> list[tuple[str, object, object]]:
    """(knob, value in a, value in b) for every knob that differs (a knob one plan does not
    record, being older than the knob, is not compared)."""
    return [(k, a.parallel[k], b.parallel[k]) for k in KNOBS
            if k in a.parallel and k in b.parallel and a.parallel[k] != b.parallel[k]]


def breakdown_changes(a: Plan, b: Plan) -> list[tuple[str, float, float]]:
    """(part, seconds in a, seconds in b) for each part of the step, largest change first."""
    ba, bb = a.predicted["breakdown"], b.predicted["breakdown"]
    parts = [(k, ba.get(k, 0.0), bb.get(k, 0.0)) for k in BREAKDOWN_WORDS]
    return sorted(parts, key=lambda p: -abs(p[2] - p[1]))


def summary(a: Plan, b: Plan, parts: int = 3) -> str:
    """'b is 12.3% faster than a: tp 8 -> 4, recompute full -> selective; compute -1.2 s, ...'."""
    ta, tb = a.step_time_s, b.step_time_s
    rel = (ta - tb) / ta
    verdict = (f"{100 * rel:.1f}% faster" if rel > 0 else
               f"{-100 * rel:.1f}% slower" if rel < 0 else "as fast")
    knobs = ", ".join(f"{k} {_fmt(x)} -> {_fmt(y)}" for k, x, y in config_changes(a, b)
                      if k != "num_microbatches") or "same configuration"
    moved = ", ".join(f"{BREAKDOWN_WORDS[k]} {y - x:+.3g} s" for k, x, y in
                      breakdown_changes(a, b)[:parts] if abs(y - x) > 1e-9 * max(ta, tb))
    return f"{verdict}: {knobs}" + (f"; {moved}" if moved else "")


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


# ---- plan diff: every difference, as data ------------------------------------------------------

INPUTS = (("model", "name", "text"), ("model", "num_params", "count"),
          ("cluster", "name", "text"), ("cluster", "device", "text"),
          ("cluster", "nodes", "count"), ("cluster", "gpus_per_node", "count"),
          ("cluster", "num_gpus", "count"), ("cluster", "inter_node_GBps", "rate"),
          ("training", "global_batch", "count"), ("training", "seq_len", "count"),
          ("training", "dtype", "text"), ("training", "optimizer", "text"))
PREDICTED = (("step time", "step_time_s", "s"), ("tokens/s", "tokens_per_s", "rate"),
             ("TFLOP/s per GPU", "tflops_per_device", "rate"), ("MFU", "mfu", "frac"),
             ("peak memory per GPU", "peak_memory_bytes", "bytes"))
MEMORY_KINDS = ("weights", "grads", "optimizer", "activations", "working")


@dataclass(frozen=True)
class Diff:
    """One compared quantity: its section, label, value in a and in b, and its kind (text,
    count, s, bytes, frac, rate), which says how to show it and its change."""

    section: str
    label: str
    a: object
    b: object
    kind: str

    @property
    def differs(self) -> bool:
        if isinstance(self.a, float) and isinstance(self.b, float):
            return abs(self.a - self.b) > 1e-9 * max(abs(self.a), abs(self.b), 1e-30)
        return self.a != self.b


def compare(a: Plan, b: Plan) -> list[Diff]:
    """Inputs, configuration, predictions, step parts, peak-rank memory and stages of two plans."""
    out = [Diff("inputs", f"{part} {key}".replace("_", " "), getattr(a, part).get(key),
                getattr(b, part).get(key), kind) for part, key, kind in INPUTS]
    out += [Diff("configuration", k, a.parallel.get(k), b.parallel.get(k),
                 "text" if k in ("schedule", "recompute", "placement") else "count") for k in KNOBS]
    out += [Diff("predicted", label, a.predicted.get(key), b.predicted.get(key), kind)
            for label, key, kind in PREDICTED]
    out += [Diff("step time by part", BREAKDOWN_WORDS[k], a.predicted["breakdown"].get(k, 0.0),
                 b.predicted["breakdown"].get(k, 0.0), "s") for k in BREAKDOWN_WORDS]
    ma, mb = peak_stage(a)["predicted"]["memory_bytes"], peak_stage(b)["predicted"]["memory_bytes"]
    out += [Diff("memory of the fullest GPU", kind, ma.get(kind, 0.0), mb.get(kind, 0.0), "bytes")
            for kind in MEMORY_KINDS if ma.get(kind) or mb.get(kind)]
    out.append(Diff("stages", "stages", len(a.stages), len(b.stages), "count"))
    for i in range(max(len(a.stages), len(b.stages))):
        sa = a.stages[i] if i < len(a.stages) else None
        sb = b.stages[i] if i < len(b.stages) else None
        out.append(Diff("stages", f"stage {i} blocks", _blocks(sa), _blocks(sb), "text"))
        out.append(Diff("stages", f"stage {i} time per micro-batch", _stage(sa, "time"),
                        _stage(sb, "time"), "s"))
        out.append(Diff("stages", f"stage {i} memory", _stage(sa, "memory"), _stage(sb, "memory"),
                        "bytes"))
    return out


def peak_stage(p: Plan) -> dict:
    """The stage whose GPUs hold the most memory."""
    return max(p.stages, key=lambda st: st["predicted"]["memory_bytes"]["total"])


def _blocks(st: dict | None):
    from planner.report import compress_names

    return None if st is None else compress_names(st["blocks"])


def _stage(st: dict | None, what: str):
    if st is None:
        return None
    pr = st["predicted"]
    return pr["time_per_microbatch_s"] if what == "time" else pr["memory_bytes"]["total"]


# ---- why the step moved: each part with the knobs and links behind it --------------------------

PART_KNOBS = {
    "compute_s": ("tp", "pp", "dp", "recompute", "micro_batch"),
    "bubble_s": ("pp", "vpp", "num_microbatches", "schedule"),
    "tp_comm_s": ("tp", "sequence_parallel", "micro_batch", "recompute"),
    "pp_comm_s": ("pp", "placement", "tp", "micro_batch"),
    "dp_comm_s": ("dp", "zero", "placement", "pp", "tp"),
    "optimizer_s": ("zero", "offload_optimizer", "dp", "tp", "pp"),
    "straggler_s": ("dp", "tp", "pp", "recompute", "micro_batch"),
}
"""The knobs each part of the step depends on (costmodels: compute, comm, pipeline, memory)."""


@dataclass(frozen=True)
class PartChange:
    part: str
    """A BREAKDOWN_WORDS key."""
    delta_s: float
    because: str
    """The knob changes behind it, and the link a collective moved to."""


def part_changes(a: Plan, b: Plan, min_share: float = 0.002) -> list[PartChange]:
    """Parts of the step that moved by at least ``min_share`` of a's step, largest first."""
    knobs = {k: (x, y) for k, x, y in config_changes(a, b)}
    out = []
    for part, x, y in breakdown_changes(a, b):
        if abs(y - x) < min_share * a.step_time_s:
            continue
        why = [f"{k} {_fmt(knobs[k][0])} -> {_fmt(knobs[k][1])}" for k in PART_KNOBS[part]
               if k in knobs]
        link = _link_note(a, b, part)
        out.append(PartChange(part, y - x, "; ".join(filter(None, [link, ", ".join(why)]))))
    return out


def _link_note(a: Plan, b: Plan, part: str) -> str:
    """'tensor parallel crosses nodes: ... on the inter-node link (ib, 50 GB/s per GPU)' when a
    part's collective leaves the node in b but not in a (or comes back)."""
    group = {"tp_comm_s": "tensor parallel", "dp_comm_s": "data parallel"}.get(part)
    if group is None:
        return ""
    ca, cb = bool(_crosses(a, part)), _crosses(b, part)
    if cb is None or ca == cb:  # no such group in b, or it sits where it did
        return ""
    c = b.cluster
    link = (c.get("spec") or {}).get("inter_node", {}).get("name", "inter-node")
    where = f"the inter-node link ({link}, {c.get('inter_node_GBps', 0):g} GB/s per GPU)"
    return (f"{group} crosses nodes: all-reduce on {where}" if cb else
            f"{group} stays inside a node: no traffic on {where}")


def _crosses(p: Plan, part: str) -> bool | None:
    from planner import placement
    from planner.options import Config

    cfg = Config(**{k: p.parallel[k] for k in KNOBS if k in p.parallel})
    gpn = p.cluster["gpus_per_node"]
    size, stride = ((cfg.tp, 1) if part == "tp_comm_s" else
                    (cfg.dp, placement.strides(cfg)["dp"]))
    if size <= 1:
        return None  # no such group, no traffic
    return placement.group_shape(size, stride, gpn).nodes > 1


def memory_change(a: Plan, b: Plan, min_share: float = 0.05):
    """(peak of a, peak of b, [(kind, change)]) for the kinds of memory on the fullest GPU that
    moved by at least ``min_share`` of a's peak, largest first."""
    ma, mb = peak_stage(a)["predicted"]["memory_bytes"], peak_stage(b)["predicted"]["memory_bytes"]
    pa = a.predicted["peak_memory_bytes"]
    moved = sorted(((k, mb.get(k, 0.0) - ma.get(k, 0.0)) for k in MEMORY_KINDS),
                   key=lambda kd: -abs(kd[1]))
    return pa, b.predicted["peak_memory_bytes"], [(k, d) for k, d in moved
                                                  if abs(d) >= min_share * pa]


# ---- why not this? -------------------------------------------------------------------------------


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
    """Why the search sets such a configuration aside, besides memory (a tp group across nodes)."""
    over: list = None
    """(stage, its blocks, bytes it would need, its memory by kind) for every stage that does not
    fit, with ``usable`` and ``device`` bytes in ``limits``."""
    limits: tuple = (0.0, 0.0)
    """(usable bytes per GPU after the reserve, the device's bytes)."""


def why_not(plan: Plan, pins) -> WhyNot:
    """Re-plan ``plan``'s own model, training and cluster with ``pins`` fixed (on top of what the
    plan already fixed) and return what changes, or why nothing fits."""
    from planner.emit import emit
    from planner.errors import SpecError
    from planner.evaluate import capacity_bytes
    from planner.options import parse_fix
    from planner.solve.search import search

    pins = parse_fix(pins)
    if not pins:
        raise SpecError("why: name the knobs to try, e.g. --why tp=16 or --why pp=1,zero=3")
    prepared, cluster, training, options = replan_inputs(plan, pins)
    result = search(prepared.blocks, cluster, training, options)
    if result.best is not None:
        variant = emit(model_info=prepared.info, opgraph=prepared.opgraph, bg=prepared.blocks,
                       result=result, cluster=cluster, training=training, options=options)
        return WhyNot(pins=pins, variant=variant, feasible=True, notes=[], over=[])
    counts = ", ".join(f"{n} {r}" for r, n in result.rejected.most_common())
    message = (f"all {result.candidates} configurations with {_pins(pins)} set aside ({counts})"
               if result.candidates else f"no configuration has {_pins(pins)} ({counts})")

    limits = (capacity_bytes(cluster, options), cluster.device.memory_bytes)
    cfg, problem = pinned_config(plan, pins)
    notes = [problem] if problem else structural_notes(cfg, cluster, prepared.blocks)
    variant = None if problem or any(n.startswith("cannot") for n in notes) else hypothetical(
        cfg, prepared, cluster, training, options)
    over = [] if variant is None else [
        (st["index"], _blocks(st), st["predicted"]["memory_bytes"]["total"],
         st["predicted"]["memory_bytes"]) for st in variant.stages
        if st["predicted"]["memory_bytes"]["total"] > limits[0]]
    return WhyNot(pins=pins, variant=variant, feasible=False, message=message, notes=notes,
                  over=over, limits=limits)


def replan_inputs(plan: Plan, pins: dict):
    """(prepared model, cluster, training, options) of the plan, with ``pins`` added to its fix."""
    import logging

    from costmodels.engine import engine_from_mapping
    from costmodels.topology import cluster_from_mapping, get_cluster, CLUSTERS
    from planner import api
    from planner.errors import SpecError
    from planner.options import SearchOptions, TrainingSpec

    spec, c = plan.model.get("spec"), plan.cluster
    if not spec:
        raise SpecError("why: the plan was made from a Python module, not a model spec; re-plan "
                        "with planner.plan(..., fix=...) instead")
    if "groups" in c:
        raise SpecError("why: not available for clusters with node groups; re-plan with --fix")
    if "spec" in c:
        cluster = cluster_from_mapping(c["spec"], where="plan.cluster.spec")
    elif c["name"] in CLUSTERS:
        cluster = get_cluster(c["name"], nodes=c["nodes"], gpus_per_node=c["gpus_per_node"])
    else:
        raise SpecError(f"why: the plan does not record cluster '{c['name']}' in full; re-create "
                        "it with this planner version")
    t = plan.training
    training = TrainingSpec(global_batch=t["global_batch"], seq_len=t["seq_len"], dtype=t["dtype"],
                            optimizer=t["optimizer"], engine=engine_from_mapping(t.get("engine")))
    fix = {**plan.search.get("options", {}).get("fix", {}), **pins}
    prepared = api.prepare(spec, seq_len=t["seq_len"], dtype=t["dtype"])
    if prepared.info["fingerprint"] != plan.model["fingerprint"]:
        logging.getLogger(__name__).warning("%s traces differently now than when the plan was made",
                                            spec)
    return prepared, cluster, training, SearchOptions(fix=fix, top_k=0)


def pinned_config(plan: Plan, pins: dict):
    """The plan's configuration with ``pins`` applied and the rest adjusted to stay legal
    (dp x tp x pp = GPUs, micro-batches filling the batch); (Config, "") or (None, problem)."""
    from planner.options import Config

    p = {**{k: plan.parallel[k] for k in KNOBS if k in plan.parallel}, **pins}
    gpus, batch = plan.cluster["num_gpus"], plan.training["global_batch"]
    if p["dp"] * p["tp"] * p["pp"] != gpus:
        for k in (k for k in ("dp", "pp", "tp") if k not in pins):
            rest = p["dp"] * p["tp"] * p["pp"] // p[k]
            if gpus % rest == 0:
                p[k] = gpus // rest
                break
        else:
            return None, (f"{_pins(pins)} cannot make dp x tp x pp equal the {gpus} GPUs")
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


def structural_notes(cfg, cluster, bg) -> list[str]:
    """Rules of the search space the configuration breaks; 'cannot ...' when it cannot be priced."""
    notes = []
    divs = sorted({d for b in bg.blocks for d in b.tp_divisors})
    if any(d % cfg.tp for d in divs):
        notes.append(f"cannot split: tp={cfg.tp} does not divide the heads and hidden sizes "
                     f"({', '.join(map(str, divs))})")
    if cfg.pp * cfg.vpp > len(bg.blocks):
        notes.append(f"cannot cut {len(bg.blocks)} blocks into pp={cfg.pp} x vpp={cfg.vpp} stages")
    if cfg.tp > cluster.gpus_per_node:
        notes.append(f"tp={cfg.tp} spans {-(-cfg.tp // cluster.gpus_per_node)} nodes of "
                     f"{cluster.gpus_per_node} GPUs; the planner keeps tensor parallelism inside "
                     f"a node, where its all-reduces run on {cluster.intra_node.name or 'intra'} "
                     f"({cluster.intra_node.bandwidth_bytes_per_s / 1e9:g} GB/s per GPU) instead "
                     f"of {cluster.inter_node.name or 'inter'} "
                     f"({cluster.inter_node.bandwidth_bytes_per_s / 1e9:g} GB/s)")
    return notes


def hypothetical(cfg, prepared, cluster, training, options) -> Plan:
    """``cfg`` priced outside the search: stages split to balance time (memory unchecked), the
    pipeline simulated as the planner's own plans are."""
    from planner.emit import emit
    from planner.evaluate import ModelArrays, block_costs, price
    from planner.refine import simulated
    from planner.solve.chain import partition
    from planner.solve.search import SearchResult

    ma = ModelArrays.from_blocks(prepared.blocks)
    costs = block_costs(ma, cluster, training, tp=cfg.tp, sp=cfg.sequence_parallel,
                        recompute=cfg.recompute, micro_batch=cfg.micro_batch)
    part = partition(costs.time_s.tolist(), cfg.pp * cfg.vpp)
    est = simulated(price(cfg, part.bounds, ma, costs, cluster, training), training)
    result = SearchResult(best=est, alternatives=[], candidates=1, evaluated=1, status="fixed")
    return emit(model_info=prepared.info, opgraph=prepared.opgraph, bg=prepared.blocks,
                result=result, cluster=cluster, training=training, options=options)


def _pins(pins: dict) -> str:
    return ",".join(f"{k}={_fmt(v)}" for k, v in pins.items())
