"""Compare two plans as data: what differs in the configuration, where the step time and the memory
moved, and which knobs and links are behind each move. Reads plan files only (no search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from costmodels.hardware import device_mapping, get_device

from planner.errors import PlannerError
from planner.options import KNOBS, Config
from planner.planfile.breakdown import BREAKDOWN_WORDS
from planner.planfile.document import Plan
from planner.report.text import compress_names, knob
from planner.search import placement


COMPARED = (*KNOBS, "dp_replicate")
"""What two plans' configurations are compared by: every knob, and the replicate groups of data
parallelism across sites (1 where a plan has none)."""


def config_changes(a: Plan, b: Plan) -> list[tuple[str, object, object]]:
    """(knob, value in a, value in b) for every knob that differs (a knob one plan does not
    record, being older than the knob, is not compared; nor the K/V exchange where one plan has
    no context parallelism: the change of cp says it); and the replicate groups of data
    parallelism across sites (``dp_replicate``, 1 where a plan has none)."""
    keys = [k for k in COMPARED if k == "dp_replicate" or k in a.parallel and k in b.parallel]
    return [(k, x, y) for k in keys
            for x, y in [(knob_value(a, k), knob_value(b, k))] if x != y and None not in (x, y)]


def knob_value(plan: Plan, k: str):
    """The plan's value of knob ``k``; None for the K/V exchange of a plan without context
    parallelism (cp = 1), which has none."""
    if k == "cp_comm" and plan.parallel.get("cp", 1) == 1:
        return None
    if k == "dp_replicate":
        return plan.parallel.get(k, 1)
    return plan.parallel.get(k)


def engine_changes(a: Plan, b: Plan) -> list[tuple[str, object, object]]:
    """(engine setting, value in a, value in b) for every setting of the software the plans
    assume (``training.engine``) that differs; one a plan does not record is not compared."""
    ea, eb = a.training.get("engine") or {}, b.training.get("engine") or {}
    dense = not any(p.model.get("routed_experts") or int(p.parallel.get("ep", 1)) > 1
                    for p in (a, b))
    idle = {k for k, knob in IDLE_UNLESS.items()
            if all(int(p.parallel.get(knob, 1)) <= 1 for p in (a, b))}
    if all(p.training.get("dtype") != "fp8" for p in (a, b)):
        # (which GEMMs run in FP8, how scaled, whose Linear: no fp8)
        idle |= {"fp8_experts", "fp8_recipe", "fp8_linear"}
    return [(f"engine {k}", ea[k], eb[k]) for k in ea if k in eb and ea[k] != eb[k]
            and not (dense and _experts_only(k)) and k not in idle]


IDLE_UNLESS = {"cp_ring": "cp", "moe_etp_replicated": "etp", "tp_overlap": "tp",
               "tp_grad_overlap": "tp"}
"""Engine settings that price nothing unless a degree is above 1 in one of the plans: whose
ring runs context parallelism (cp), how experts' activations are kept under expert tensor
parallelism (etp), whether tensor-parallel collectives run beside their GEMMs (tp)."""


RECSYS_SETTINGS = (("table_optimizer", "table optimizer"), ("pipeline", "pipeline"))
"""A recommendation plan's settings of its tables (``embeddings``): their optimizer and how
the batches' table work is pipelined."""


def recsys_changes(a: Plan, b: Plan) -> list[tuple[str, object, object]]:
    """(setting, value in a, value in b) for each of RECSYS_SETTINGS that differs between two
    recommendation plans (a new user's plan diff said 'same configuration' across both)."""
    ea, eb = a.embeddings or {}, b.embeddings or {}
    return [(words, ea.get(key), eb.get(key)) for key, words in RECSYS_SETTINGS
            if ea.get(key) != eb.get(key) and None not in (ea.get(key), eb.get(key))]


def _experts_only(setting: str) -> bool:
    """Whether an engine setting says how routed experts run (nothing for a dense model)."""
    return setting.startswith("moe_") or setting in ("fsdp_experts", "fp8_experts")


def breakdown_changes(a: Plan, b: Plan) -> list[tuple[str, float, float]]:
    """(part, seconds in a, seconds in b) for each part of the step, largest change first."""
    ba, bb = a.predicted["breakdown"], b.predicted["breakdown"]
    parts = [(k, ba.get(k, 0.0), bb.get(k, 0.0)) for k in BREAKDOWN_WORDS]
    return sorted(parts, key=lambda p: -abs(p[2] - p[1]))


def _ratio(r: float) -> str:
    """A ratio with two decimals, or three significant digits below 0.1 (0.00087, not 0.00),
    never in exponent notation."""
    if r >= 0.1 or r <= 0:
        return f"{r:.2f}"
    return f"{r:.{2 - math.floor(math.log10(r))}f}"


def headline(a: Plan, b: Plan, parts: int = 3) -> str:
    """'1.14x as fast (a 12.3% shorter step): tp 8 -> 4, recompute full -> selective; compute
    -1.2 s, ...' (b against a; '2.85x slower (a 185.2% longer step)' the other way). Where the
    steps do other work (another model, batch or length) it leads with the throughput:
    'at 0.30x the tokens/s (a step 6.73x as long): ...'."""
    ta, tb = a.step_time_s, b.step_time_s
    rel = (ta - tb) / ta
    verdict = ("as fast" if abs(rel) < 5e-4 else
               f"{ta / tb:.2f}x as fast (a {100 * rel:.1f}% shorter step)" if rel > 0 else
               f"{tb / ta:.2f}x slower (a {-100 * rel:.1f}% longer step)")
    inputs = [("model" if key == "name" else key, x, y) for sec, key, _ in HEADLINE_INPUTS
              for x, y in [(getattr(a, sec).get(key), getattr(b, sec).get(key))] if x != y]
    if any(k in ("model", "global_batch", "seq_len") for k, _, _ in inputs):
        # samples where tokens do not compare: recommendation models (their samples are rows),
        # and other models of other lengths (an image model's patches against one token a
        # sample); the same model at another length compares by tokens/s
        other_tokens = a.model.get("name") != b.model.get("name") and \
            a.training.get("seq_len") != b.training.get("seq_len")
        rate = ("samples" if a.embeddings is not None or b.embeddings is not None or other_tokens
                or (a.per_image and b.per_image) else "tokens")
        ra, rb = (p.predicted[f"{rate}_per_s"] for p in (a, b))
        unit = "images" if a.per_image and b.per_image else rate
        verdict = f"at {_ratio(rb / ra)}x the {unit}/s (a step {tb / ta:.3g}x as long)"
    inputs += engine_changes(a, b) + recsys_changes(a, b)
    ra, rb = (_reserve_text(p.memory_reserve()) for p in (a, b))  # (memory kept free per device)
    if ra != rb:
        inputs.append(("memory reserve", ra, rb))
    la, lb = link_figures(a), link_figures(b)  # (links between sites or groups, by GB/s)
    inputs += [(k.split(" GB/s")[0], f"{la[k]:.4g} GB/s", f"{lb[k]:.4g} GB/s") for k in la
               if "GB/s" in k and k in lb and la[k] != lb[k]]
    inputs += figure_changes(a, b)
    ga, gb = group_shapes(a), group_shapes(b)
    inputs += [(k, ga[k], gb[k]) for k in ga if k in gb and ga[k] != gb[k]]
    changes = [f"{k} {knob(x)} -> {knob(y)}" for k, x, y in
               inputs + [c for c in config_changes(a, b) if c[0] != "num_microbatches"]]
    tables = [(n, x, y) for n, x, y in table_changes(a, b, short=True) if x != y]
    changes += [f"table {n} {_shorter(x, y)}" for n, x, y in tables[:2]]
    if len(tables) > 2:
        changes.append(f"{len(tables) - 2} more tables laid out differently")
    knobs = ", ".join(changes) or "same configuration"
    moved = ", ".join(f"{BREAKDOWN_WORDS[k]} {y - x:+.3g} s" for k, x, y in
                      breakdown_changes(a, b)[:parts] if abs(y - x) > 1e-9 * max(ta, tb))
    other_work = any(k in ("model", "global_batch", "seq_len") for k, _, _ in inputs)
    return (f"{verdict}: {knobs}" + (f"; {moved}" if moved else "") +
            ("; the step does other work (model or batch differ): the rate compares them"
             if other_work else ""))


def figure_changes(a: Plan, b: Plan) -> list[tuple[str, str, str]]:
    """(label, value in a, value in b) with units, for the device memory and the links' latency
    and efficiency (link_details) that differ between the plans: inputs a headline names,
    where 'same configuration' alone left a longer step unexplained."""
    out = []  # (another device's memory goes with its name, which the headline gives)
    memory = ([("device memory", *(device_figure(p, "memory_GB") for p in (a, b)))]
              if a.cluster.get("device") == b.cluster.get("device") else [])
    ma, mb = group_memory(a), group_memory(b)
    memory += [(k.removesuffix(" GB"), ma[k], mb[k]) for k in ma if k in mb]
    out += [(k, f"{x:.4g} GB", f"{y:.4g} GB") for k, x, y in memory
            if None not in (x, y) and x != y]
    la, lb = link_details(a), link_details(b)
    for k in (k for k in la if k in lb and None not in (la[k][0], lb[k][0])):
        (x, kind), (y, _) = la[k], lb[k]
        if x != y:
            show = ((lambda v: f"{100 * v:.3g}%") if kind == "frac" else
                    (lambda v: f"{v:,.6g} us"))
            out.append((k.removesuffix(" us"), show(x), show(y)))
    return out


def _reserve_text(kept: dict) -> str:
    """'5% + 1 GB': the memory a plan kept free on each device (Plan.memory_reserve)."""
    return (f"{100 * kept['memory_reserve_fraction']:.3g}% + "
            f"{kept['memory_reserve_bytes'] / 1e9:.3g} GB")


def _shorter(x: str | None, y: str | None) -> str:
    """'data_parallel -> table_wise' for two short layouts ('<sharding>, pooling <p>') whose
    pooling is the same; both in full otherwise."""
    if x and y and x.split(", ")[1:] == y.split(", ")[1:]:
        return f"{x.split(', ')[0]} -> {y.split(', ')[0]}"
    return f"{x} -> {y}"


HEADLINE_INPUTS = (("model", "name", "text"), ("cluster", "device", "text"),
                   ("cluster", "num_gpus", "count"), ("training", "global_batch", "count"),
                   ("training", "seq_len", "count"), ("training", "dtype", "text"),
                   ("search", "target", "text"))
"""The inputs a headline names when they differ, before the knobs."""


def table_changes(a: Plan, b: Plan, short: bool = False
                  ) -> list[tuple[str, str | None, str | None]]:
    """(table, its layout in a, in b) for every embedding table of either recommendation plan:
    sharding type, compute kernel, ranks and pooling, or (``short``) the sharding type and
    pooling (None where a plan lacks the table)."""
    def layouts(p: Plan) -> dict:
        return {t["name"]: (f"{t.get('sharding_type')}"
                            + ("" if short else f" ({t.get('compute_kernel')}) on ranks "
                               f"{','.join(map(str, t.get('ranks', [])))}")
                            + f", pooling {float(t.get('pooling', 1)):g}")
                for t in (p.embeddings or {}).get("tables", [])}
    la, lb = layouts(a), layouts(b)
    return [(n, la.get(n), lb.get(n)) for n in list(la) + [n for n in lb if n not in la]]


# ---- plan diff: every difference, as data ------------------------------------------------------

INPUTS = (("model", "name", "text"), ("model", "num_params", "count"),
          ("model", "frozen_params", "count"),
          ("cluster", "name", "text"), ("cluster", "device", "text"),
          ("cluster", "nodes", "count"), ("cluster", "gpus_per_node", "count"),
          ("cluster", "num_gpus", "count"), ("cluster", "intra_node_GBps", "rate"),
          ("cluster", "inter_node_GBps", "rate"),
          ("training", "global_batch", "count"), ("training", "seq_len", "count"),
          ("training", "dtype", "text"), ("training", "optimizer", "text"),
          ("search", "target", "text"))
DEVICE_FIGURES = (("device peak TFLOP/s", "peak_TFLOPs"), ("device memory GB/s", "hbm_GBps"),
                  ("device memory GB", "memory_GB"))
"""The device's own figures a plan's cluster records (its preset's, or a calibration's measured
ones, or a cluster file's): two plans on devices of one name may differ there (a new-user check
read 'same in both' for devices of 48 and 24 GB, whose steps differ)."""
LINK_DETAILS = (("latency us", "latency_us", "rate"), ("efficiency", "efficiency", "frac"),
                ("all-to-all efficiency", "alltoall_efficiency", "frac"))
"""The figures of a link besides its bandwidth that a plan's cluster spec records and the step
depends on: the alpha of each message, and the shares of the line rate collectives and
all-to-alls reach."""
IN_PLACE_OF = {"alltoall_efficiency": "efficiency"}
"""A link figure a spec leaves out for another's value (costmodels.topology.LinkSpec: without
its own all-to-all efficiency a link runs all-to-alls at the collectives'): compared at the value
used, so that a preset's 0.68 against a file's link without the key reads 0.68 -> 0.8."""
TIERS = (("intra_node", "intra-node link"), ("inter_node", "inter-node link"))
"""The link tiers of a cluster spec of one kind of node (or of one group's), with their words."""


def link_figures(p: Plan) -> dict:
    """The links between a plan's sites (each pair's bandwidth and latency) or device groups
    (their inter-group link, per GPU), by label: what a cluster over sites differs in most."""
    c, out = p.cluster, {}
    for ln in c.get("links") or []:
        pair = " - ".join(map(str, ln.get("between", [])))
        out[f"link {pair} GB/s ({ln.get('per', 'site')})"] = ln.get("bandwidth_GBps")
        out[f"link {pair} latency us"] = ln.get("latency_us")
    if "inter_group_GBps" in c and not c.get("links"):
        out["inter-group link GB/s (per GPU)"] = c["inter_group_GBps"]
    return out


def link_details(p: Plan) -> dict[str, tuple[object, str]]:
    """Each link's latency and efficiency (LINK_DETAILS) from the plan's cluster spec, by label,
    with its kind: the tiers inside and between nodes of a cluster of one kind of node, each
    group's or site's, and the link between device groups; a plan whose cluster records no spec
    (or a link without the figure) has none. A new-user check read 'same in both' for two files
    whose inter-node latency was 5 us and 5000 us."""
    c, out = p.cluster, {}

    def tiers(spec, prefix: str, keys=TIERS, details=LINK_DETAILS) -> None:
        for tier, words in keys:
            link = spec.get(tier) if isinstance(spec, Mapping) else None
            if isinstance(link, Mapping):
                out.update({f"{prefix}{words} {label}": (link.get(key, link.get(
                    IN_PLACE_OF.get(key))), kind) for label, key, kind in details
                    if key in link or IN_PLACE_OF.get(key) in link})
    groups = [g for g in c.get("groups") or [] if isinstance(g, Mapping)]
    if not groups:
        tiers(c.get("spec"), "")
    for g in groups:
        tiers(g.get("spec"), f"group {g.get('name')} ")
    if groups and not c.get("links"):  # (sites: each pair's link, in link_figures)
        # (no all-to-all crosses between groups: an expert-parallel group stays in one)
        tiers(c.get("spec"), "", (("inter_group", "inter-group link"),), LINK_DETAILS[:2])
    return out


def group_memory(p: Plan) -> dict:
    """Each device group's or site's device memory in GB, by label, from its spec (the cluster's
    device figures cover a cluster of one kind of node)."""
    out = {}
    for g in p.cluster.get("groups") or []:
        device = _device(g.get("spec") or {}, g.get("device")) if isinstance(g, Mapping) else None
        if device is not None and isinstance(device.get("memory_GB"), (int, float)):
            out[f"group {g.get('name')} device memory GB"] = float(device["memory_GB"])
    return out


def group_shapes(p: Plan) -> dict:
    """Each device group's or site's nodes, GPUs per node and device, and its links per GPU
    inside and between nodes, by label ("group a100": "2 x 8 a100-80g, 300/12.5 GB/s"): the
    cluster's totals do not tell a group's change apart (a new-user check shrank one group's
    nodes to 3 GPUs and read only the GPU count changed)."""
    return {f"group {g.get('name')}": f"{g.get('nodes')} x {g.get('gpus_per_node')} "
            f"{g.get('device')}, {g.get('intra_node_GBps', 0):.4g}/"
            f"{g.get('inter_node_GBps', 0):.4g} GB/s"
            for g in p.cluster.get("groups") or [] if isinstance(g, Mapping)}


def device_figure(p: Plan, key: str) -> float | None:
    """The plan's device figure ``key`` (DEVICE_FIGURES; the peak in the training's GEMM dtype),
    from its cluster's spec (a mapping: a calibration's or a file's device; or a preset name) or,
    in a plan without one, its device's name; None where neither says (device groups)."""
    device = _device(p.cluster.get("spec") or {}, p.cluster.get("device"))
    if device is None:
        return None
    value = device.get(key)
    if isinstance(value, Mapping):  # peaks per dtype
        value = value.get(p.training.get("dtype")) or value.get("bf16")
    return float(value) if isinstance(value, (int, float)) else None


def _device(spec: Mapping, name) -> Mapping | None:
    """The device mapping of a cluster spec (a file's or calibration's mapping, or a preset
    name), else of the device's name; None where neither names a device (device groups)."""
    device = spec.get("device") or name
    if isinstance(device, str):
        try:
            device = device_mapping(get_device(device))
        except PlannerError:
            return None
    return device if isinstance(device, Mapping) else None


PREDICTED = (("step time", "step_time_s", "s"), ("tokens/s", "tokens_per_s", "rate"),
             ("TFLOP/s per GPU", "tflops_per_device", "rate"), ("MFU", "mfu", "frac"),
             ("peak memory per GPU", "peak_memory_bytes", "bytes"))
MEMORY_KINDS = ("weights", "fp8_weights", "grads", "optimizer", "activations", "working")
"""The parts of a GPU's memory a plan records (stages[].predicted.memory_bytes, less the total);
fp8_weights: the FP8 copies of the weights an fp8 plan keeps."""
MEMORY_WORDS = {"fp8_weights": "fp8 weight copies"}
"""How a kind of MEMORY_KINDS reads where it is not its own name."""


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
    out += [Diff("inputs", label, device_figure(a, key), device_figure(b, key), "rate")
            for label, key in DEVICE_FIGURES]
    la, lb = link_figures(a), link_figures(b)
    out += [Diff("inputs", k, la.get(k), lb.get(k), "rate")
            for k in list(la) + [k for k in lb if k not in la]]
    la, lb = link_details(a), link_details(b)
    out += [Diff("inputs", k, la.get(k, (None,))[0], lb.get(k, (None,))[0],
                 (la.get(k) or lb[k])[1]) for k in list(la) + [k for k in lb if k not in la]]
    ma, mb = group_memory(a), group_memory(b)
    out += [Diff("inputs", k, ma.get(k), mb.get(k), "rate")
            for k in list(ma) + [k for k in mb if k not in ma]]
    ga, gb = group_shapes(a), group_shapes(b)
    out += [Diff("inputs", k, ga.get(k), gb.get(k), "text")
            for k in list(ga) + [k for k in gb if k not in ga]]
    ra, rb = a.memory_reserve(), b.memory_reserve()  # each device's memory the search kept free
    out += [Diff("inputs", "memory reserve fraction", ra["memory_reserve_fraction"],
                 rb["memory_reserve_fraction"], "rate"),
            Diff("inputs", "memory reserve GB", ra["memory_reserve_bytes"] / 1e9,
                 rb["memory_reserve_bytes"] / 1e9, "rate")]
    # what the search was asked for besides the pins (--across-sites, --layout)
    oa, ob = ((p.search or {}).get("options") or {} for p in (a, b))
    out += [Diff("inputs", f"search {k.replace('_', ' ')}", oa.get(k), ob.get(k), "text")
            for k in ("across_sites", "layout")]
    out += [Diff("configuration", k, knob_value(a, k), knob_value(b, k),
                 "text" if k in ("schedule", "recompute", "placement", "cp_comm", "zero",
                                 "sequence_parallel", "offload_optimizer") else "count")
            for k in COMPARED]
    out += [Diff("software", k.removeprefix("engine "), x, y, "text")
            for k, x, y in engine_changes(a, b)]
    if a.embeddings is not None and b.embeddings is not None:
        out += [Diff("configuration", words, (a.embeddings or {}).get(key),
                     (b.embeddings or {}).get(key), "text") for key, words in RECSYS_SETTINGS]
    recsys = a.embeddings is not None or b.embeddings is not None  # samples, not tokens
    images = a.per_image and b.per_image  # (one token an image: the samples are images)
    # MFU is against each plan's own peak (its dtype's, its device's): where those differ, the
    # MFU points do not compare the plans' speed, TFLOP/s per GPU does
    peaks = [device_figure(p, "peak_TFLOPs") for p in (a, b)]
    own = " (each against its own peak)" if peaks[0] != peaks[1] else ""
    samples = recsys or images
    out += [Diff("predicted", ("images/s" if images else "samples/s")
                 if samples and key == "tokens_per_s" else label + (own if key == "mfu" else ""),
                 a.predicted.get("samples_per_s" if samples and key == "tokens_per_s" else key),
                 b.predicted.get("samples_per_s" if samples and key == "tokens_per_s" else key),
                 kind) for label, key, kind in PREDICTED]
    ba, bb = a.predicted["breakdown"], b.predicted["breakdown"]
    out += [Diff("step time by part", BREAKDOWN_WORDS[k], ba.get(k, 0.0), bb.get(k, 0.0), "s")
            for k in BREAKDOWN_WORDS if k in ba or k in bb]
    out += [Diff("embedding tables", n, x, y, "text") for n, x, y in table_changes(a, b)]
    wa, wb = other_ways(a), other_ways(b)
    out += [Diff("other ways to use the cluster (step time)", k, wa.get(k), wb.get(k), "s")
            for k in list(wa) + [k for k in wb if k not in wa]]
    ma, mb = peak_stage(a)["predicted"]["memory_bytes"], peak_stage(b)["predicted"]["memory_bytes"]
    out += [Diff("memory of the fullest GPU", MEMORY_WORDS.get(kind, kind), ma.get(kind, 0.0),
                 mb.get(kind, 0.0), "bytes")
            for kind in MEMORY_KINDS if ma.get(kind) or mb.get(kind)]
    out.append(Diff("stages", "stages", len(a.stages), len(b.stages), "count"))
    if len(a.stages) != len(b.stages):  # other splits: no stage of one is a stage of the other
        slowest = [max(_stage(st, "time") for st in p.stages) for p in (a, b)]
        return out + [Diff("stages", "slowest stage's time per micro-batch", *slowest, "s")]
    for i, (sa, sb) in enumerate(zip(a.stages, b.stages)):
        if sa.get("group") or sb.get("group"):  # which device group or site runs it
            out.append(Diff("stages", f"stage {i} group", sa.get("group", "every"),
                            sb.get("group", "every"), "text"))
        out.append(Diff("stages", f"stage {i} blocks", stage_blocks(sa), stage_blocks(sb), "text"))
        out.append(Diff("stages", f"stage {i} time per micro-batch", _stage(sa, "time"),
                        _stage(sb, "time"), "s"))
        out.append(Diff("stages", f"stage {i} memory", _stage(sa, "memory"), _stage(sb, "memory"),
                        "bytes"))
    return out


def other_ways(p: Plan) -> dict[str, float | None]:
    """A plan over groups or sites: the step of each group alone (search.groups_alone) and of
    data parallelism across each kind of alike sites (search.sites_replicas), by label; None
    where one cannot run. Empty for any other plan."""
    out: dict[str, float | None] = {}
    for r in p.search.get("groups_alone") or []:
        out[f"{r['group']} alone"] = r.get("step_time_s")
    for r in p.search.get("sites_replicas") or []:
        out[f"data parallel across {', '.join(r['sites'])}"] = r.get("step_time_s")
    return out


def peak_stage(p: Plan) -> dict:
    """The stage whose GPUs hold the most memory."""
    return max(p.stages, key=lambda st: st["predicted"]["memory_bytes"]["total"])


def stage_blocks(st: dict):
    """A stage's blocks, compressed (``h.0-9, ln_f``)."""
    return compress_names(st["blocks"])


def _stage(st: dict, what: str):
    pr = st["predicted"]
    return pr["time_per_microbatch_s"] if what == "time" else pr["memory_bytes"]["total"]


# ---- why the step moved: each part with the knobs and links behind it --------------------------

PART_KNOBS = {
    "compute_s": ("tp", "pp", "dp", "cp", "ep", "etp", "recompute", "micro_batch"),
    "cp_comm_s": ("cp", "cp_comm", "tp", "micro_batch", "recompute"),
    "ep_comm_s": ("ep", "etp", "tp", "cp", "dp", "placement", "micro_batch", "recompute"),
    "bubble_s": ("pp", "vpp", "num_microbatches", "schedule"),
    "tp_comm_s": ("tp", "sequence_parallel", "micro_batch", "recompute"),
    "pp_comm_s": ("pp", "placement", "tp", "micro_batch"),
    "dp_comm_s": ("dp", "zero", "placement", "pp", "tp"),
    "optimizer_s": ("zero", "offload_optimizer", "dp", "tp", "pp"),
    "straggler_s": ("dp", "tp", "pp", "recompute", "micro_batch"),
    # data parallelism across sites: the gradient buckets and the last backward it runs beside
    "sites_dp_s": ("dp_replicate", "dp", "tp", "pp", "zero", "micro_batch"),
    # a recommendation plan's parts follow its tables' layout (table_changes), and the dense
    # part's sharding
    "embedding_lookup_s": (), "embedding_comm_s": (), "host_wait_s": ("zero",),
}
"""The knobs each part of the step depends on (costmodels: compute, comm, pipeline, memory)."""


@dataclass(frozen=True)
class PartChange:
    part: str
    """A BREAKDOWN_WORDS key."""
    delta_s: float
    because: str
    """The knob changes behind it, and the link a collective moved to."""


SPLIT_PARTS = ("compute_s", "cp_comm_s", "ep_comm_s", "bubble_s", "tp_comm_s", "pp_comm_s",
               "straggler_s")
"""Parts priced per pipeline stage, which a move of the stage split changes by itself."""


def part_changes(a: Plan, b: Plan, min_share: float = 0.002) -> list[PartChange]:
    """Parts of the step that moved by at least ``min_share`` of a's step, largest first."""
    knobs = {k: (x, y) for k, x, y in config_changes(a, b)}
    split = split_note(a, b)
    out = []
    for part, x, y in breakdown_changes(a, b):
        if abs(y - x) < min_share * a.step_time_s:
            continue
        why = [f"{k} {knob(knobs[k][0])} -> {knob(knobs[k][1])}" for k in PART_KNOBS[part]
               if k in knobs]
        link = _link_note(a, b, part)
        moved = split if part in SPLIT_PARTS else ""
        out.append(PartChange(part, y - x, "; ".join(filter(None, [link, ", ".join(why),
                                                                   moved]))))
    return out


def split_note(a: Plan, b: Plan) -> str:
    """'the stage split moved (the slowest, stage 1: 9 -> 10 blocks)' where the plans have as
    many stages but split the blocks differently; else ''."""
    if len(a.stages) != len(b.stages) or not a.stages or \
            [st["blocks"] for st in a.stages] == [st["blocks"] for st in b.stages]:
        return ""

    def slowest(p: Plan) -> tuple[int, int]:
        i, st = max(enumerate(p.stages),
                    key=lambda ist: ist[1]["predicted"]["time_per_microbatch_s"])
        return i, len(st["blocks"])

    (i, n), (j, m) = slowest(a), slowest(b)
    which = f"stage {i}" if i == j else f"stage {i} in A, stage {j} in B"
    if n != m:
        return f"the stage split moved (the slowest, {which}: {n} -> {m} blocks)"
    # (the slowest keeps its count: name where the split moved instead of '2 -> 2 blocks')
    k, sa, sb = next((k, x, y) for k, (x, y) in enumerate(zip(a.stages, b.stages))
                     if x["blocks"] != y["blocks"])
    moved = (f"stage {k}: {len(sa['blocks'])} -> {len(sb['blocks'])} blocks"
             if len(sa["blocks"]) != len(sb["blocks"]) else f"stage {k} holds other blocks")
    return f"the stage split moved ({moved}; the slowest, {which}, has {n} either way)"


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
    if "inter_node_GBps" not in c:  # groups or sites: each its own link between its nodes
        where = "the links between nodes"
    else:
        link = (c.get("spec") or {}).get("inter_node", {}).get("name", "inter-node")
        where = f"the inter-node link ({link}, {c['inter_node_GBps']:g} GB/s per GPU)"
    return (f"{group} crosses nodes: all-reduce on {where}" if cb else
            f"{group} stays inside a node: no traffic on {where}")


def _crosses(p: Plan, part: str) -> bool | None:
    cfg = Config(**{k: p.parallel[k] for k in KNOBS if k in p.parallel})
    gpn = p.cluster["gpus_per_node"]
    size, stride = ((cfg.tp, 1) if part == "tp_comm_s" else
                    (cfg.dp, placement.strides(cfg)["dp"]))
    if size <= 1:
        return None  # no such group, no traffic
    return placement.group_shape(size, stride, gpn).nodes > 1


REST_SHARE = 0.01
"""The share of a plan's peak below which the kinds too small to list apart go unsaid together."""


def memory_change(a: Plan, b: Plan, min_share: float = 0.05):
    """(peak of a, peak of b, [(kind, change)]) for the kinds of memory on the fullest GPU that
    moved by at least ``min_share`` of a's peak, largest first, and the rest together as
    ``other kinds`` where they add up to REST_SHARE of it (so the changes add up to the peaks'
    to within that)."""
    ma, mb = peak_stage(a)["predicted"]["memory_bytes"], peak_stage(b)["predicted"]["memory_bytes"]
    pa = a.predicted["peak_memory_bytes"]
    moved = sorted(((MEMORY_WORDS.get(k, k), mb.get(k, 0.0) - ma.get(k, 0.0))
                    for k in MEMORY_KINDS),
                   key=lambda kd: -abs(kd[1]))
    big = [(k, d) for k, d in moved if abs(d) >= min_share * pa]
    rest = sum(d for k, d in moved if abs(d) < min_share * pa)
    if big and abs(rest) >= REST_SHARE * pa:
        big.append(("other kinds", rest))
    return pa, b.predicted["peak_memory_bytes"], big
