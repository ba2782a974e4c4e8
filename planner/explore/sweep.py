"""What-if sweeps: plan one model over a grid of clusters, batches and pinned knobs.

``whatif`` expands ``vary`` (key -> values) into the cartesian product of its values, first key
outermost, and plans every point. The model is traced once per (sequence length, dtype) that the
grid needs (planner.api.prepare); every point is then only a search (planner.api.plan_prepared) on a
cluster resized or modified with ``dataclasses.replace``. Points run in a process pool in chunks,
each chunk carrying its traced model once; rows come back in grid order and do not depend on the
number of workers. A point where nothing fits, or whose settings contradict each other, is a row with
``feasible`` False and the reason. Returns plain rows (dicts); never prints.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from costmodels.hardware import get_device
from costmodels.specs import parse_pairs
from costmodels.topology import Cluster, HeteroCluster
from planner import api, recsys_api, targets
from planner.errors import PlannerError, SpecError
from planner.files import fspath_or_same, refuse_plan_file
from planner.explore.costs import (add_costs, check_tokens, gpus_by_device, parse_prices,
                                    resolve_prices, sweep_devices)
from planner.explore.grid import (ENGINE_KEYS, TABLE_KEYS, UNITS, expand, point_cluster,
                                  point_engine, sharding_type)
from planner.inputs.clusters import load_cluster
from planner.inputs.zoo import zoo_heads
from planner.logs import collected_warnings
from planner.machine import usable_cores
from planner.search.feasibility import cluster_pin_problem, reserve_problem
from planner.search.layout import layout_pp_problem
from planner.options import (FIX_KEYS, KNOBS, LAYOUT_FOR_RECSYS, PIPELINES, TABLE_OPTIMIZERS,
                             SearchOptions, TrainingSpec, check_dtype, engine_spec, parse_fix,
                             reserve_options)
from planner.planfile.breakdown import BREAKDOWN_WORDS
from planner.settings import target_engine
from planner.units import counted
from planner.report.text import knob

log = logging.getLogger(__name__)

METRIC_KEYS = ("step_time_s", "samples_per_s", "tokens_per_s", "tflops_per_device", "mfu",
               "peak_memory_bytes")

@dataclass(frozen=True)
class _Task:
    """One grid point, ready to plan: everything but the traced model."""

    index: int
    point: tuple
    """(key, value) pairs of the varied keys."""
    cluster: Cluster | HeteroCluster | None
    training: TrainingSpec | None
    options: SearchOptions | None
    trace_key: tuple
    error: str = ""
    """Why the point cannot be planned at all (contradictory settings)."""
    tables: dict = field(default_factory=dict)
    """A recommendation model's table pins (``sharding``: the type of every table)."""
    layout: str | None = None
    """The pipeline layout pinned at every point (its row says it, planned or not)."""


def _split_fix(fix, recsys: bool) -> tuple[dict, dict]:
    """(pinned knobs, table pins) of ``fix``: ``sharding=<type>`` shards a recommendation
    model's tables (as plan solve --fix pins it), every other key is a parallelism knob."""
    items = parse_pairs(fix, where="fix", example="--fix tp=8") if isinstance(fix, str) else \
        dict(fix or {})
    tables = {k: items.pop(k) for k in TABLE_KEYS if k in items}
    pins = recsys_api.table_pins(items)
    if (tables or pins) and not recsys:
        raise SpecError("fix.sharding: shards a recommendation model's embedding tables, and "
                        "this model has none; drop it")
    return parse_fix(items), {**{k: sharding_type(v, f"fix.{k}") for k, v in tables.items()},
                              **({"pins": pins} if pins else {})}


def whatif(model, *, cluster=None, vary: Mapping[str, Sequence], global_batch: int | None = None,
           seq_len: int | None = None, dtype: str | None = None, optimizer: str | None = None,
           fix=None,
           nodes: int | None = None, gpus_per_node: int | None = None, prices=None,
           tokens: float | None = None, top_k: int = SearchOptions().top_k,
           time_limit_s: float | None = None,
           engine=None, example_inputs=None, workers: int | None = None,
           target: str = "any", calibration=None,
           memory_reserve_fraction: float | None = None, memory_reserve_gb: float | None = None,
           layout: str | None = None, tables=None, table_optimizer: str | None = None,
           pipeline: str | None = None, across_sites: str = "auto",
           progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Plan ``model`` at every point of the grid ``vary`` spans; one row per point, in grid order.

    ``vary`` maps keys of planner.explore.grid.VARY_KEYS to lists of values (``{"nodes": [8, 16], "tp": [4, 8]}``);
    the other arguments are the settings every point shares (as for planner.plan; optimizer
    default adam; ``target``: every point planned for that engine, as planner.plan's), and one
    given there and varied too is refused (SpecError). ``prices``
    maps device names (or unique prefixes, ``a100``) to dollars per GPU-hour and adds cost
    columns; ``tokens`` adds the hours to train on that many tokens (and with prices, the
    dollars); ``calibration`` (plan profile's file or mapping) replaces every point's device
    figures with the measured ones, as planner.plan's does; ``memory_reserve_fraction`` and
    ``memory_reserve_gb``: the memory every point keeps free per device, as planner.plan's;
    ``layout``: every point's pipeline stages pinned in Megatron-LM's notation, as
    planner.plan's (a point whose pp does not divide its stages is a row saying so);
    ``across_sites``: on clusters of sites, as planner.plan's (a point whose cluster is not
    sites, with anything but auto, is a row saying so).
    Recommendation models: ``tables`` (a YAML path or mapping of table statistics),
    ``table_optimizer`` and ``pipeline`` as planner.plan's, at every point (the last two may
    be varied instead)."""
    model = fspath_or_same(model)  # (a cluster Path stays one: load_cluster reads it as a file)
    refuse_plan_file(model)  # (before the arguments a model's what-if needs)
    grid = expand(vary)
    recsys = recsys_api.recsys_model(model)
    fixed, pins = _split_fix(fix, recsys)  # (pins: the tables' settings at every point)
    reserve = reserve_options(memory_reserve_fraction, memory_reserve_gb, recsys=recsys)
    # a fraction out of range, or a layout that does not parse, is bad input before any trace
    SearchOptions(**reserve, layout=layout)
    if recsys and layout is not None:
        raise SpecError(LAYOUT_FOR_RECSYS)
    if "sharding" in vary and not recsys:
        raise SpecError("vary.sharding: shards a recommendation model's embedding tables, and "
                        "this model has none; vary its parallelism knobs (tp, pp, ...) instead")
    shared = {k: v for k, v in (("tables", tables), ("table_optimizer", table_optimizer),
                                ("pipeline", pipeline)) if v is not None}
    for key in [k for k in ("table_optimizer", "pipeline") if k in vary] + list(shared):
        if not recsys:
            where = f"vary.{key}" if key in vary else key
            raise SpecError(f"{where}: applies to recommendation models (models with embedding "
                            "tables) only; leave it out for this model")
    for key, allowed in (("table_optimizer", TABLE_OPTIMIZERS), ("pipeline", PIPELINES)):
        if key in shared:
            if shared[key] not in allowed:
                raise SpecError(f"{key}: expected one of {', '.join(allowed)}, got "
                                f"{shared[key]!r}")
            pins[key] = shared[key]
    settings = {"cluster": cluster, "nodes": nodes, "gpus_per_node": gpus_per_node,
                "global_batch": global_batch, "seq_len": seq_len, "dtype": dtype,
                "optimizer": optimizer}
    for key, given, where in (
            [(k, knob(v), "--" + k.replace("_", "-") if k in shared else "fix")
             for k, v in {**fixed, **pins}.items()]
            + [(k, v, "--" + k.replace("_", "-")) for k, v in settings.items()]
            + [(k, v, "engine") for k, v in _engine_settings(engine).items()]):
        if given is not None and key in vary:  # one would silently override the other
            raise SpecError(f"vary.{key}: also given as {key}={given} ({where}); give it in one "
                            "place")
    dtype = ("fp32" if recsys else "bf16") if dtype is None else dtype
    check_dtype(dtype)  # (a name no device has, said as such, before the devices' own check)
    targets.engine(target)  # an unknown one is bad input
    if recsys:
        targets.check_recsys(target)
    if recsys and (seq_len is not None or "seq_len" in vary):  # (as planner.plan refuses it)
        where = "vary.seq_len" if "seq_len" in vary else "seq_len"
        raise SpecError(f"{where}: a recommendation model's samples are rows of features, not "
                        "token sequences; leave seq_len (--seq-len) out")
    if cluster is None and "cluster" not in vary:
        raise SpecError("cluster: missing; pass cluster= (--cluster) or vary it "
                        "(--vary cluster=A,B)")
    if global_batch is None and "global_batch" not in vary:
        raise SpecError("global_batch: missing; give --global-batch (global_batch= in Python) or "
                        "vary it")
    base = {"cluster": cluster, "nodes": nodes, "gpus_per_node": gpus_per_node,
            "global_batch": global_batch, "seq_len": seq_len, "dtype": dtype,
            "optimizer": optimizer or "adam", "fix": fixed, "tables": pins,
            "engine": target_engine(engine, target) if not recsys else engine_spec(engine),
            "top_k": top_k, "time_limit_s": time_limit_s, "target": target, "reserve": reserve,
            "recsys": recsys, "layout": layout, "table_stats": fspath_or_same(tables),
            "calibration": fspath_or_same(calibration), "heads": zoo_heads(model),
            "across_sites": across_sites}
    for value in [cluster] if "cluster" not in vary else vary["cluster"]:
        load_cluster(value)  # a cluster name or file that does not load is bad input, not a row
    if "device" in vary:
        for value in vary["device"]:
            get_device(value, "vary.device")
    tasks = [_task(i, point, base) for i, point in enumerate(grid)]
    _say_idle_links(vary, tasks)
    failed = [_as_varied(t.point, t.error) for t in tasks if t.error]
    if failed and len(failed) == len(tasks):  # the shared settings are wrong: before any trace
        _refuse(failed)
    _check_prices(tasks, prices, tokens)  # before the traces and searches
    if recsys:
        rows = _run_recsys(model, tasks, progress, base["table_stats"])
        _refuse_all_bad(rows)
        if prices or tokens is not None:
            add_costs(rows, prices, tokens)
        return [_ordered(r) for r in rows]
    keys = sorted({t.trace_key for t in tasks if not t.error}, key=str)
    prepared, untraced = {}, {}
    for k in keys:  # (the API's own lines are held back in a sweep: say what takes seconds)
        log.info("what-if: reading or tracing the model at %s in %s (seconds; a minute for the "
                 "largest)", f"{k[0]:,} tokens" if k[0] else "its default length", k[1])
        try:
            prepared[k] = api.prepare(model, example_inputs=example_inputs, seq_len=k[0],
                                      dtype=k[1])
            image = prepared[k].info.get("image_tokens")
            if image and k[0] and prepared[k].seq_len != k[0]:
                raise SpecError(f"seq_len: {k[0]:,} does not apply; a sample is the image's "
                                f"{prepared[k].seq_len:,} tokens (image_size and patch_size in "
                                "the config set them)")
            if not k[0]:
                log.info("what-if: its length is %s (%s)", counted(prepared[k].seq_len, "token"),
                         "an image's patches and prepended tokens, which image_size and "
                         "patch_size in the config set" if image else "--seq-len sets another")
            encoder = prepared[k].info.get("encoder_tokens")
            if encoder:  # (a new-user check read Whisper's tokens/s as every token's)
                log.warning("what-if: tokens/s counts the decoder's %s per sample; the encoder "
                            "reads %s more, not counted (as plan show says)",
                            f"{prepared[k].seq_len:,}", f"{encoder:,}")
        except SpecError as exc:  # the model cannot take this point's length: its row says so
            prepared.pop(k, None)
            untraced[k] = str(exc)
    if untraced:
        tasks = [replace(t, error=untraced[t.trace_key])
                 if not t.error and t.trace_key in untraced else t for t in tasks]
        if all(t.error for t in tasks):
            _refuse([_as_varied(t.point, t.error) for t in tasks])
    log.info("what-if: %d points, %d trace%s", len(tasks), len(prepared),
             "" if len(prepared) == 1 else "s")
    t0 = time.perf_counter()
    rows = _run(tasks, prepared, workers, progress)
    log.info("what-if: searched %d points in %.1f s", len(rows), time.perf_counter() - t0)
    _refuse_all_bad(rows)
    _say_warnings(rows)
    name = next(iter(prepared.values())).info["name"] if prepared else str(model)
    for row in rows:
        row["model"] = name
    if prices or tokens is not None:
        add_costs(rows, prices, tokens)
    return [_ordered(r) for r in rows]


def _say_idle_links(vary: Mapping, tasks: list[_Task]) -> None:
    """Warn where a varied link is one no point's cluster uses: the link between nodes of
    one-node clusters, the link inside a node of one-GPU nodes (a new-user check varied the
    first on one node and got the same row at every point, with no word)."""
    valid = [t.cluster for t in tasks if not t.error and isinstance(t.cluster, Cluster)]
    for key, unused, what in (("inter_node_bandwidth", lambda c: c.nodes == 1,
                               "one node, whose GPUs use no link between nodes"),
                              ("intra_node_bandwidth", lambda c: c.gpus_per_node == 1,
                               "one GPU a node, which uses no link inside a node")):
        if key in vary and valid and all(unused(c) for c in valid):
            log.warning("vary.%s: every point's cluster has %s; it changes nothing here (vary "
                        "nodes or gpus_per_node with it)", key, what)


def _bad_row(task: "_Task", reason: str) -> dict:
    """The row of a point that is bad input (not an infeasible one: ``bad_input``, which
    _refuse_all_bad reads)."""
    return {**_row(task, None, _as_varied(task.point, reason)), "bad_input": True}


def _relax_varied(task: _Task, reason: str) -> str:
    """An infeasible point's reason, its advice to relax --fix naming the point's own pins where
    they are varied, not given with --fix (a new-user check read "relax --fix" of pins only
    --vary had set)."""
    varied = [f"{k}={knob(v)}" for k, v in task.point if k in FIX_KEYS]
    if not varied or not reason.endswith("relax --fix"):
        return reason
    given = set(task.options.fix) - {k for k, _ in task.point}
    return reason[:-len("relax --fix")] + (f"relax this point's {' '.join(varied)}"
                                           + (" or --fix" if given else ""))


def _as_varied(point: tuple, reason: str) -> str:
    """``reason`` naming a knob the point varies as varied (vary.cp), not pinned (fix.cp), or a
    setting it varies (seq_len: ... use --seq-len 1024 or less -> vary.seq_len: ... use 1024 or
    less; 'pin cp_comm=p2p' -> 'give cp_comm=p2p')."""
    for key, _ in point:
        for where in ("fix", "engine"):
            if reason.startswith(f"{where}.{key}:"):
                reason = "vary." + reason[len(where) + 1:].replace(f"pin {key}=", f"give {key}=")
        if reason.startswith(f"{key}:"):
            reason = "vary." + reason.replace(f"--{key.replace('_', '-')} ", "")
    return reason


def _refuse_all_bad(rows: list[dict]) -> None:
    """SpecError when no point is valid input (the sweep's settings are wrong); the rows stay as
    they are otherwise."""
    bad = [r["reason"] for r in rows if r.get("bad_input")]
    if rows and len(bad) == len(rows):
        _refuse(bad)


def _refuse(reasons: list[str]) -> None:
    """SpecError with the first point's reason, counting the others (one message: the same)."""
    others = len(reasons) - 1 if len(set(reasons)) > 1 else 0
    raise SpecError(reasons[0] + (f" (and {others} other point{'' if others == 1 else 's'} "
                                  "refused)" if others else ""))


def _check_prices(tasks: list, prices, tokens) -> None:
    """SpecError for prices that name no device of the sweep, or a token count that is not one."""
    check_tokens(tokens)
    if prices:
        try:
            resolve_prices(parse_prices(prices), sweep_devices(
                gpus_by_device(t.cluster.summary()) for t in tasks if t.cluster is not None))
        except SpecError as exc:
            failed = [t for t in tasks if t.cluster is None and t.error]
            if not failed:
                raise
            # a point whose cluster could not be built has no devices to price: say why
            raise SpecError(f"{exc} (the devices of a point that could not be built are not "
                            f"known: {_as_varied(failed[0].point, failed[0].error)})") from None


def _run_recsys(model, tasks: list[_Task], progress, stats=None) -> list[dict]:
    """A recommendation model's points, one after the other (each shards the tables with CP-SAT
    under its time limit; the model is read once, with ``stats``: its tables' statistics, a
    YAML path or mapping)."""
    prepared = recsys_api.prepare_recsys(model, tables=stats)
    info = prepared.info
    rows = []
    for i, t in enumerate(tasks):
        if t.error:
            rows.append(_bad_row(t, t.error))
        elif t.options.fix and set(t.options.fix) - {"zero"}:
            key = sorted(set(t.options.fix) - {"zero"})[0]
            where = "vary" if key in dict(t.point) else "fix"
            rows.append(_bad_row(t, f"{where}.{key}: a recommendation model takes sharding="
                                    "<type> (its tables) and zero=0|3 (its dense part) as knobs, "
                                    f"not {key}"))
        else:
            try:
                plan = recsys_api.plan_rec_prepared(
                    prepared, t.cluster, t.training, sharding=t.tables.get("sharding"),
                    table_pins=t.tables.get("pins"),
                    zero=t.options.fix.get("zero"),
                    table_optimizer=t.tables.get("table_optimizer"),
                    pipeline=t.tables.get("pipeline", "sparse-dist"),
                    time_limit_s=t.options.time_limit_s)
                rows.append(_row(t, plan, ""))
            except SpecError as exc:  # bad input, not an infeasible point
                rows.append(_bad_row(t, str(exc)))
            except PlannerError as exc:
                rows.append(_row(t, None, str(exc)))
        rows[-1]["model"] = info["name"]
        if progress:
            progress(i + 1, len(tasks))
    return rows


def _engine_settings(engine) -> dict:
    """The settings an ``engine`` argument names itself (``k=v`` pairs of a string, a mapping's
    keys), not those its preset or an EngineSpec carries."""
    if isinstance(engine, str):  # (the preset name, the one part without '=', left out)
        return parse_pairs(",".join(p for p in engine.split(",") if "=" in p), where="engine",
                           example="--engine moe_imbalance=1.2")
    return dict(engine) if isinstance(engine, Mapping) else {}


def _task(index: int, point: tuple, base: dict) -> _Task:
    """Resolve one point's cluster, training and options from the shared settings."""
    s = {**base, **{k: v for k, v in point if k not in FIX_KEYS and k not in ENGINE_KEYS}}
    fix = {**base["fix"], **{k: v for k, v in point if k in FIX_KEYS}}
    tables = {**base["tables"], **{k: v for k, v in point if k in TABLE_KEYS}}
    if fix.get("cp") == 1:  # a cp=1 point of a sweep over cp and cp_comm: no exchange to pick
        fix.pop("cp_comm", None)
    trace_key = (s["seq_len"], s["dtype"])
    cl = None
    try:
        cl = point_cluster(s)
        for group in getattr(cl, "groups", (cl,)):
            group.device.peak(s["dtype"])
        training = TrainingSpec(global_batch=s["global_batch"], seq_len=s["seq_len"] or 1,
                                dtype=s["dtype"], optimizer=s["optimizer"],
                                engine=point_engine(s["engine"], point))
        targets.check_dtype(s["target"], s["dtype"])
        options = targets.restrict(SearchOptions(fix=fix, top_k=s["top_k"],
                                                 time_limit_s=s["time_limit_s"],
                                                 layout=s["layout"],
                                                 across_sites=s["across_sites"], **s["reserve"]),
                                   s["target"])
        # (a recommendation model's table sharding keeps no reserve: planner.plan's check)
        problem = (not s["recsys"] and reserve_problem(cl, options)) or \
            api.across_sites_problem(cl, s["across_sites"]) or (
            "" if isinstance(cl, HeteroCluster) else
            (s["layout"] and layout_pp_problem(s["layout"], fix.get("pp"), fix.get("vpp")))
            or cluster_pin_problem(dict(fix), cl.num_gpus, s["global_batch"], heads=s["heads"]))
        # (before any trace, as planner.plan)
        if problem:
            raise SpecError(problem)
    except SpecError as exc:
        return _Task(index, point, cl, None, None, trace_key, error=str(exc), tables=tables,
                     layout=s["layout"])
    return _Task(index, point, cl, training, options, trace_key, tables=tables,
                 layout=s["layout"])


def _run(tasks: list[_Task], prepared: dict, workers: int | None, progress) -> list[dict]:
    """Plan every task; rows in task order. Uses a process pool when it pays."""
    todo = [t for t in tasks if not t.error]
    rows: list[dict | None] = [None] * len(tasks)
    for t in tasks:
        if t.error:
            rows[t.index] = _bad_row(t, t.error)
    done = len(tasks) - len(todo)
    if progress:
        progress(done, len(tasks))
    n = _workers(workers, len(todo))
    if n <= 1:
        for t in todo:
            rows[t.index] = plan_point(t, prepared[t.trace_key])
            done += 1
            if progress:
                progress(done, len(tasks))
        return rows
    with ProcessPoolExecutor(max_workers=n, mp_context=_context()) as pool:
        futures = {pool.submit(_plan_chunk, prepared[chunk[0].trace_key], chunk): len(chunk)
                   for chunk in _chunks(todo, CHUNKS_PER_WORKER * n)}
        for future in as_completed(futures):
            for index, row in future.result():
                rows[index] = row
            done += futures[future]
            if progress:
                progress(done, len(tasks))
    return rows


CHUNKS_PER_WORKER = 4
"""Chunks of points per pool worker: more chunks, finer progress; each carries its traced model."""


def _chunks(tasks: list[_Task], count: int) -> list[list[_Task]]:
    """``tasks`` dealt round-robin into about ``count`` chunks, each of one trace key."""
    by_key: dict = {}
    for t in tasks:
        by_key.setdefault(t.trace_key, []).append(t)
    per_key = max(1, count // len(by_key))
    return [chunk for group in by_key.values()
            for chunk in (group[i::per_key] for i in range(min(per_key, len(group))))]


def _plan_chunk(prepared, tasks: list[_Task]) -> list[tuple[int, dict]]:
    """(index, row) for each task of one chunk, in a pool worker."""
    return [(t.index, plan_point(t, prepared)) for t in tasks]


def _workers(workers: int | None, points: int) -> int:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise SpecError(f"workers: expected a positive integer, got {workers!r}")
    return min(workers or usable_cores(), points)


def _context():
    """fork where it is safe and cheap (Linux: workers inherit the imported modules); spawn
    elsewhere."""
    methods = multiprocessing.get_all_start_methods()
    fork = "fork" in methods and sys.platform.startswith("linux")
    return multiprocessing.get_context("fork" if fork else "spawn")


def plan_point(task: _Task, prepared) -> dict:
    """Plan one point; an infeasible point is a row with the reason. The warnings planning it
    logs are kept in the row (``warnings``), not logged: the sweep says each once
    (_say_warnings), however many points give it."""
    task = replace(task, training=replace(task.training, seq_len=prepared.seq_len))
    with collected_warnings() as said:
        try:
            plan = api.plan_prepared(prepared, task.cluster, task.training, task.options,
                                     compare_groups=False)
        except SpecError as exc:  # bad input (a pin the model cannot take), not infeasible
            row = _bad_row(task, _relax_varied(task, str(exc)))
        except PlannerError as exc:
            row = _row(task, None, _relax_varied(task, str(exc)))
        else:
            row = _row(task, plan, "")
    row["warnings"] = " | ".join(dict.fromkeys(said)) or None
    return row


def _say_warnings(rows: list[dict]) -> None:
    """Each warning the points gave, once, with the points that gave it; warnings alike but for
    their figures (a share of the step per point) are one, in the first point's words."""
    points: dict[str, tuple[str, list[str], set[str]]] = {}
    for r in rows:
        for text in (r.get("warnings") or "").split(" | "):
            if text:
                first, where, texts = points.setdefault(_FIGURES.sub("#", text), (text, [], set()))
                if r["point"] not in where:
                    where.append(r["point"])
                texts.add(text)
    for first, where, texts in points.values():
        at = ("every point" if len(where) == len(rows) else
              f"{len(where)} of {len(rows)} points: {', '.join(where[:4])}"
              + (", ..." if len(where) > 4 else ""))
        log.warning("%s (%s%s)", first, at,
                    f"; in the words of {where[0]}, other figures elsewhere"
                    if len(texts) > 1 else "")


_FIGURES = re.compile(r"\d+(?:[.,]\d+)*")
"""Numbers in a warning's text (what _say_warnings sets aside to tell warnings alike)."""


def _row(task: _Task, plan, reason: str) -> dict:
    """One flat row: the point, its cluster and training, the plan's configuration and metrics;
    None where a value does not apply (so rows survive a CSV round trip unchanged)."""
    summary = task.cluster.summary() if task.cluster is not None else {}
    tr = task.training
    row = {
        "point": " ".join(f"{k}={knob(v)}{UNITS.get(k, '')}" for k, v in task.point),
        "cluster": summary.get("name"), "device": summary.get("device"),
        "nodes": summary.get("nodes"), "gpus_per_node": summary.get("gpus_per_node"),
        "gpus": summary.get("num_gpus"),
        "gpus_by_device": gpus_by_device(summary) if summary else None,
        "intra_node_GBps": summary.get("intra_node_GBps"),
        "inter_node_GBps": summary.get("inter_node_GBps"),
        "global_batch": tr.global_batch if tr else None, "seq_len": tr.seq_len if tr else None,
        "dtype": tr.dtype if tr else None, "optimizer": tr.optimizer if tr else None,
        "fix": ",".join(f"{k}={knob(v)}" for k, v in task.options.fix.items())
        if task.options and task.options.fix else None,
        "layout": task.layout,
        "feasible": plan is not None, "reason": reason or None, "bad_input": False,
        "warnings": None,
        "config": plan.parallel_summary if plan else None,
        "tables": ", ".join(f"{k} {n}" for k, n in plan.sharding_counts().items())
        if plan is not None and plan.embeddings else None,
        "routed_experts": plan.model.get("routed_experts") if plan else None,
        "moe_host_wait_s": plan.predicted.get("moe_host_wait_s", 0.0) if plan else None,
    }
    row.update({k: plan.parallel.get(k) if plan else None for k in KNOBS})
    row["dp_replicate"] = plan.parallel.get("dp_replicate", 1) if plan else None  # (across sites)
    row.update({k: plan.predicted[k] if plan else None for k in METRIC_KEYS})
    row["device_memory_bytes"] = summary.get("device_memory_bytes")
    row.update({k: plan.predicted["breakdown"].get(k, 0.0) if plan else None
                for k in BREAKDOWN_WORDS})
    return row


def _ordered(row: dict) -> dict:
    return {"model": row.pop("model"), **row}
