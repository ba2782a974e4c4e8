"""plan(): resolve the model, trace it, coarsen, search, emit. Orchestration only.

Tracing (planner.traced, planner.trace) loads torch and transformers, which takes seconds; a model
traced before is read back from the trace cache (planner.trace.cache) without loading either. A
recommendation model (embedding tables) is planned by planner.recsys_api.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import time
from typing import Callable

from costmodels import precision
from costmodels.engine import EngineSpec
from costmodels.specs import positive_int
from costmodels.topology import HeteroCluster
from planner.emit import across_sites, emit
from planner.errors import InfeasibleError, PlannerError, SpecError
from planner.files import fspath_or_same
from planner.inputs.calibration import apply_calibration, load_calibration
from planner.inputs.clusters import load_cluster
from planner.inputs.zoo import RECSYS, ZOO, zoo_heads
from planner.options import (LAYOUT_FOR_RECSYS, TRACE_METHODS, SearchOptions, TrainingSpec,
                             check_dtype, parse_fix, reserve_options)
from planner import model_notes, settings, targets, traced
from planner.planfile.document import Plan
from planner.recsys_api import plan_recsys, recsys_model
from planner.search import alone, replicas
from planner.search.costs import ModelArrays
from planner.search.feasibility import (batch_note, cluster_pin_problem, dp_fits,
                                        explain_infeasible,
                                        known_model_pin_problem, length_note, pin_problem,
                                        reserve_problem)
from planner.search.hetero import kinds as hetero_kinds, restrict
from planner.search.layout import layout_pp_problem
from planner.search.loop import rejection_lines, search
from planner.search.space import Space, attention_forms, kv_heads
from planner.trace import cache
from planner.traced import Prepared
from planner.units import human_count

log = logging.getLogger("planner.api")


def prepare(model, *, example_inputs=None, seq_len: int | None = None, dtype: str = "bf16",
            trace_method: str = "auto", cache_dir: str | None = "auto") -> Prepared:
    """Resolve and trace a model once (the slow, torch-touching part). A MODEL spec traced before
    with the same settings is read from the trace cache in ``cache_dir`` ("auto": the user's
    cache folder; None: no cache)."""
    model = fspath_or_same(model)
    if trace_method not in TRACE_METHODS:
        raise SpecError(f"trace_method: unknown method {trace_method!r}; choose "
                        f"{', '.join(TRACE_METHODS)}")
    check_dtype(dtype)
    if isinstance(model, str) and model.lower() in RECSYS:
        raise SpecError(f"model: {model} is a recommendation model (embedding tables): "
                        "planner.prepare and plan_prepared take dense models; plan it with "
                        "planner.plan")
    if seq_len is not None:
        try:
            seq_len = positive_int(seq_len, "seq_len")
        except SpecError:
            raise SpecError(f"seq_len: expected a positive integer (or None: the model's), got "
                            f"{seq_len!r}") from None
    folder = cache.default_dir() if cache_dir == "auto" else cache_dir
    zoo = ZOO.get(model.lower()) if isinstance(model, str) else None
    keyed_len = seq_len or (zoo.seq_len if zoo else None)  # a zoo model's default: the same trace

    def entry_of(length):
        return (cache.key(model, seq_len=length, dtype=dtype, method=trace_method)
                if folder and example_inputs is None else None)

    entry = entry_of(keyed_len)
    stored = cache.load(folder, entry) if entry else None
    if stored is not None:
        prepared = Prepared.from_dict(stored)
        traced.rename(prepared.info, model)
        log.info("model %s: %s parameters, traced before (trace cache)",
                 prepared.info["name"], human_count(prepared.info["num_params"]))
    else:
        with cache.recording_reads() as seen:  # (a factory's data files: checked on reading)
            prepared = traced.trace_model(model, example_inputs, seq_len, dtype, trace_method)
        own = {os.path.abspath(os.path.join(model, "config.json") if os.path.isdir(model)
                               else model)} if entry else set()  # (in the key already)
        stored = {**prepared.to_dict(), "reads": cache.read_signatures(seen - own, folder)} \
            if entry else None
        if entry:
            cache.store(folder, entry, stored)
        if entry and keyed_len is None and (model.endswith(".json") or os.path.isdir(model)):
            # a config's default length, asked for by number next time (plan show --why, the
            # exports' memory check), is the same trace
            cache.store(folder, entry_of(prepared.seq_len), stored)
    model_notes.say(prepared, seq_len)
    return prepared


def plan(model, *, example_inputs=None, cluster, nodes: int | None = None,
         gpus_per_node: int | None = None, global_batch: int, seq_len: int | None = None,
         dtype: str | None = None, optimizer: str = "adam", fix=None, top_k: int = 3,
         time_limit_s: float | None = None, calibration=None, engine=None,
         trace_method: str = "auto", record_timing: bool = False,
         progress: Callable[[int, int], None] | None = None, cache_dir: str | None = "auto",
         target: str = "any", tables=None, table_optimizer: str | None = None,
         pipeline: str = "sparse-dist", across_sites: str = "auto",
         memory_reserve_fraction: float | None = None,
         memory_reserve_gb: float | None = None, layout: str | None = None) -> Plan:
    """Plan how to train ``model`` on ``cluster``; see README.md ("Python API") for every argument.
    A recommendation model (embedding tables: README.md, "Recommendation models") gets its tables
    sharded; ``tables`` (a YAML path or a mapping), ``table_optimizer`` and ``pipeline`` apply to
    those only."""
    model, tables = fspath_or_same(model), fspath_or_same(tables)  # (a cluster Path: load_cluster)
    global_batch = positive_int(global_batch, "global_batch")  # (numpy's integers as ints)
    reserve = reserve_options(memory_reserve_fraction, memory_reserve_gb,
                              recsys=recsys_model(model))
    if recsys_model(model):
        if seq_len is not None:
            raise SpecError(f"seq_len: {seq_len} given, but a recommendation model's samples are "
                            "rows of features, not token sequences; leave seq_len (--seq-len) out")
        if layout is not None:
            raise SpecError(LAYOUT_FOR_RECSYS)
        targets.check_recsys(target)
        return _calibrated(plan_recsys(
            model, cluster=cluster, nodes=nodes, gpus_per_node=gpus_per_node,
            global_batch=global_batch, dtype="fp32" if dtype is None else dtype,
            optimizer=optimizer, fix=fix, time_limit_s=time_limit_s, calibration=calibration,
            engine=engine, record_timing=record_timing, tables=tables,
            table_optimizer=table_optimizer, pipeline=pipeline), calibration)
    given = [name for name, is_given in (("tables", tables is not None),
                                         ("table_optimizer", table_optimizer is not None),
                                         ("pipeline", pipeline != "sparse-dist")) if is_given]
    if given:
        raise SpecError(f"{given[0]}: applies to recommendation models (models with embedding "
                        "tables) only; leave it out for this model")
    dtype = "bf16" if dtype is None else dtype
    cl = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node)
    if calibration is not None:
        if isinstance(cl, HeteroCluster):
            raise SpecError("calibration: applies to one device type; not to a cluster with groups")
        cl = apply_calibration(cl, calibration)
    eng = settings.target_engine(engine, target)
    zoo = ZOO.get(model.lower()) if isinstance(model, str) else None
    if zoo and zoo.routed_experts:  # (other models: once traced, in plan_prepared)
        targets.check_engine(eng, target, zoo.model_type)
        if zoo.experts_per_token:
            problem = settings.routing_problem(eng, zoo.routed_experts,
                                               zoo.experts_per_token, zoo.name)
            if problem:
                raise SpecError(problem)
    TrainingSpec(global_batch=global_batch, seq_len=seq_len or 1, dtype=dtype, optimizer=optimizer,
                 engine=eng)  # validate before the slow part (a dtype name before the device's)
    targets.check_dtype(target, dtype)
    for group in getattr(cl, "groups", (cl,)):
        try:
            group.device.peak(dtype)  # fail early on a dtype a device lacks
        except SpecError as exc:
            if not isinstance(cl, HeteroCluster):
                raise
            raise SpecError(f"{exc} (group {group.name}: every group of {cl.name} runs the one "
                            "dtype)") from None
        precision.check_recipe(group.device, dtype, eng.fp8_recipe)
    options = targets.restrict(SearchOptions(fix=parse_fix(fix), top_k=top_k,
                                             time_limit_s=time_limit_s, trace=trace_method,
                                             across_sites=across_sites, layout=layout,
                                             **reserve), target)
    problem = reserve_problem(cl, options)
    if problem:
        raise SpecError(problem)
    problem = across_sites_problem(cl, across_sites)  # before tracing
    if problem:
        raise SpecError(problem)
    if isinstance(cl, HeteroCluster) and (not cl.is_sites or across_sites == "pipeline"):
        restrict(options)  # pins the device-group pricing cannot honour fail here, before tracing
    elif isinstance(cl, HeteroCluster):  # (sites: the replicas may honour pins the pipeline
        # over them cannot, which plan_prepared tries; asked for, they are checked here)
        problem = across_sites == "replicas" and replicas.pin_problem(dict(options.fix), cl,
                                                                      global_batch)
        if problem:
            raise SpecError(problem)
    else:  # pins the cluster, batch or sequence cannot take: before tracing (a pp the pinned
        # layout rules out named as the layout's first)
        problem = (options.layout and layout_pp_problem(options.layout, options.fix.get("pp"),
                                                        options.fix.get("vpp"))) \
            or cluster_pin_problem(dict(options.fix), cl.num_gpus, global_batch,
                                   heads=zoo_heads(model))
        length = seq_len or (zoo.seq_len if zoo else 0)
        if zoo and not problem and length <= (zoo.learned_positions or length):
            # and those its published dimensions rule out (a sequence longer than its learned
            # positions is the trace's to name first)
            problem = known_model_pin_problem(dict(options.fix), cl.num_gpus, seq_len=length,
                                              experts=zoo.routed_experts, options=options)
        if problem:
            raise SpecError(problem)
    prepared = prepare(model, example_inputs=example_inputs, seq_len=seq_len, dtype=dtype,
                       trace_method=trace_method, cache_dir=cache_dir)
    training = TrainingSpec(global_batch=global_batch, seq_len=prepared.seq_len, dtype=dtype,
                            optimizer=optimizer, engine=eng)
    return _calibrated(plan_prepared(prepared, cl, training, options, progress=progress,
                                     record_timing=record_timing, warn_default_engine=False,
                                     nearest_engine=True), calibration)


def _calibrated(made: Plan, calibration) -> Plan:
    """``made`` recording the calibration that priced it (its cluster's ``calibration``), which
    a re-pricing of the plan (plan show --why, an export's memory check) applies again
    (planner.inputs.clusters.planned_cluster)."""
    if calibration is not None:
        made.cluster["calibration"] = load_calibration(calibration)
    return made


def across_sites_problem(cluster, across_sites: str) -> str:
    """'' or one line saying why ``across_sites`` (SearchOptions.across_sites) cannot apply to
    ``cluster``: a pipeline or replicas asked for on a cluster that is not sites, replicas on
    sites of several kinds. Needs no model."""
    if across_sites != "auto" and not getattr(cluster, "is_sites", False):
        return (f"across_sites: {across_sites} applies to a cluster of sites (the sites form of a "
                "cluster file); leave it out for this cluster")
    if across_sites == "replicas" and len(set(hetero_kinds(cluster))) > 1:
        return str(replicas.cannot_run(replicas.NOT_ONE_KIND))
    return ""


def plan_prepared(prepared: Prepared, cluster, training: TrainingSpec,
                  options: SearchOptions | None = None, *, progress=None,
                  record_timing: bool = False,
                  warn_default_engine: bool = True, compare_groups: bool = True,
                  nearest_engine: bool = False) -> Plan:
    """Search and emit for an already traced model, priced with ``training.engine`` (planner.plan
    takes a target's software for it; here a warning says when a target with software of its
    own, torchtitan, deepspeed or torch, is searched with the default engine's kernels, unless
    ``warn_default_engine`` is False: planner.plan's engine was chosen, by the target or by
    --engine). On a cluster of groups or sites each group is also searched alone
    (planner.search.alone; the plan's search.groups_alone), unless ``compare_groups`` is False
    (a what-if sweep, whose table has no room for them); on sites each kind of site with two or
    more is also searched as data-parallel replicas (planner.search.replicas;
    search.sites_replicas), and where that is faster (SearchOptions.across_sites) it is the plan
    (planner.emit.across_sites). With ``nearest_engine`` (plan solve's), a plan
    for --target any that no exported engine runs as planned is searched again within
    Megatron-LM's rules, with the same software (the plan's search.nearest_engine). ``cluster``
    may be a preset name or a cluster file (as planner.plan takes it); ``options`` None: the
    defaults."""
    prepared, cluster, training, options = _prepared_arguments(prepared, cluster, training,
                                                               options)
    if progress is not None and not callable(progress):
        raise SpecError(f"progress: expected a callable taking (done, total), or None; got "
                        f"{progress!r}")
    if training.seq_len != prepared.seq_len:  # its FLOPs and activations are per traced token
        raise SpecError(f"training.seq_len: {training.seq_len:,} tokens, but the model was traced "
                        f"at {prepared.seq_len:,}; prepare it again with "
                        f"seq_len={training.seq_len}")
    traced, trained = (precision.operand_bytes(precision.core_dtype(d))
                       for d in (prepared.dtype, training.dtype))
    if traced != trained:  # its activation and weight bytes are the traced dtype's
        raise SpecError(f"training.dtype: {training.dtype}, but the model was traced in "
                        f"{prepared.dtype}; prepare it again with dtype={training.dtype!r}")
    software = targets.engine(options.target).software if options.target in targets.TARGETS \
        else None
    if warn_default_engine and software and training.engine == EngineSpec():
        log.warning("engine: target %s runs its own kernels, but the search prices the default "
                    "engine (megatron-core's); pass TrainingSpec(..., engine=%r) (--engine %s) "
                    "to price %s's", options.target, software, software, software)
    options = settings.with_layout(settings.narrowed(options, prepared, training), prepared,
                                   hetero=isinstance(cluster, HeteroCluster))
    if not isinstance(cluster, HeteroCluster):  # a pin no configuration honours: named before
        problem = pin_problem(dict(options.fix), Space.of(
            cluster, prepared.blocks, options, image=bool(prepared.info.get("image_tokens"))),
            training, options)  # the search, not after it
        if problem:
            raise SpecError(problem)
    for group in getattr(cluster, "groups", (cluster,)):
        precision.check_recipe(group.device, training.dtype, training.engine.fp8_recipe)
    training = settings.attention_the_devices_run(cluster, training)
    settings.note_written_attention(prepared, training)
    settings.check_routing(prepared, training)
    settings.warn_unused_settings(prepared, training, dict(options.fix))
    _warn_alike_groups(cluster)
    if options.across_sites == "replicas":
        return _replicas_only(prepared, cluster, training, options, record_timing)
    try:
        result = search(prepared.blocks, cluster, training, options, progress=progress)
        aside, ruled = rejection_lines(result.rejected, most=4)
        log.info("searched %d configuration%s in %.2f s (%s)", result.candidates,
                 "" if result.candidates == 1 else "s", result.time_s,
                 "; ".join(filter(None, (aside and f"set aside: {aside}",
                                         ruled and f"{'others ' if result.candidates else ''}"
                                                   f"ruled out by the rules: {ruled}")))
                 or "none set aside")
        if result.best is None:
            _raise_infeasible(prepared, cluster, training, options, result)
    except PlannerError as exc:
        if not (getattr(cluster, "is_sites", False) and options.across_sites == "auto"):
            raise
        # a pin (or the memory) the pipeline over the sites cannot take: one site's plan on
        # each, data parallel across them, may (a pinned dp counts every site's replicas)
        try:
            plan = _replicas_only(prepared, cluster, training, options, record_timing)
        except PlannerError:
            raise exc from None
        log.warning("cluster: no pipeline over the sites (%s); data parallel across them "
                    "instead", str(exc).splitlines()[0])
        return plan
    best = result.best.config
    for note in settings.idle_pins(options.fix, best.cp, best.pp, best.dp):
        log.warning("%s", note)
    if not isinstance(cluster, HeteroCluster):
        settings.note_cp_limit(best, training, options, cluster.num_gpus)
    settings.warn_ring_unused(best, training)
    settings.warn_tp_overlap_unused(best, training)
    for note in (length_note(training.seq_len, result.rejected, prepared.info.get("image_tokens"),
                             dict(options.fix), prepared.info.get("learned_positions", 0)),
                 batch_note(training.global_batch, cluster.num_gpus, best, result.rejected,
                            dict(options.fix), fits=None if isinstance(cluster, HeteroCluster)
                            else functools.partial(dp_fits, prepared.blocks, cluster, training,
                                                   options))):
        if note:
            log.warning("%s", note)
    if any(b.work.num_experts for b in prepared.blocks.blocks):  # (dense: said before the search)
        settings.warn_overlap_off(result.best.config, training, dict(options.fix))
        settings.warn_dispatch_unused(result.best.config, training, dict(options.fix))
        settings.hint_overlap(result.best, training, options)
    rows = replica_rows = pick = None
    t0 = time.perf_counter()
    if compare_groups and isinstance(cluster, HeteroCluster):  # is one group alone faster?
        rows = alone.groups_alone(prepared.blocks, cluster, training, options,
                                  None if options.time_limit_s is None else
                                  options.time_limit_s - result.time_s)
    if getattr(cluster, "is_sites", False) and (compare_groups or
                                                options.across_sites == "auto"):
        # or one site's plan on each alike site, data parallel across them? (a what-if sweep,
        # without the rows, still takes it where it is faster, as plan solve does)
        reps = replicas.sites_replicas(
            prepared.blocks, cluster, training, options,
            None if options.time_limit_s is None else
            options.time_limit_s - result.time_s - (time.perf_counter() - t0))
        replica_rows = [r.row for r in reps]
        pick = replicas.chosen(reps, result.best.step_time_s, options.across_sites,
                               cluster.num_gpus)
        for kind, text in replicas.verdicts(replica_rows, result.best.step_time_s, rows):
            if kind == "faster" and pick is None and compare_groups:
                log.warning("cluster: %s; %s", text, replicas.how(replica_rows, cluster.num_gpus))
    if rows is not None:  # is one group alone faster than the plan emitted?
        _warn_alone(rows, pick.row["step_time_s"] if pick is not None else
                    result.best.step_time_s, cluster)
    near = _nearest_engine(prepared, cluster, training, options, result) \
        if nearest_engine else None
    over = emit(model_info=prepared.info, opgraph=prepared.opgraph, bg=prepared.blocks,
                result=result, cluster=cluster, training=training, options=options,
                record_timing=record_timing, groups_alone=rows, nearest_engine=near,
                sites_replicas=replica_rows)
    if pick is None:
        return over
    log.info("plan: data parallel across %s (%s on each site), %.4g s a step against %.4g s "
             "for the pipeline over the sites", ", ".join(pick.row["sites"]),
             pick.row["parallel"], pick.row["step_time_s"], over.step_time_s)
    return _replicas_plan(prepared, pick, cluster, training, options, over=over,
                          rows=replica_rows, alone_rows=rows, record_timing=record_timing)


def _prepared_arguments(prepared, cluster, training, options) -> tuple:
    """plan_prepared's positional arguments checked by type (a wrong object failed deep in the
    search), a cluster named or given as a file loaded, options defaulted."""
    if not isinstance(prepared, Prepared):
        raise SpecError(f"prepared: expected what planner.prepare returns, got a "
                        f"{type(prepared).__name__}; call planner.prepare(model) first (or "
                        "planner.plan, which does both)")
    cluster = load_cluster(cluster)  # (a loaded one as it is; a wrong type named)
    if not isinstance(training, TrainingSpec):
        raise SpecError(f"training: expected a planner.TrainingSpec(global_batch=..., "
                        f"seq_len=...), got a {type(training).__name__}")
    if options is None:
        options = SearchOptions()
    elif not isinstance(options, SearchOptions):
        raise SpecError(f"options: expected a planner.SearchOptions(...) or None, got a "
                        f"{type(options).__name__}")
    return prepared, cluster, training, options


def _warn_alike_groups(cluster) -> None:
    """Warn where a cluster of groups (not sites) has groups alike in device, GPUs per node and
    links: the groups form gives each group stages of its own and runs no data parallelism
    across groups, so one kind of node planned as one cluster, or as sites, can only do as well or
    better (a new-user check saw two alike H100 nodes planned 11% slower as groups)."""
    if not isinstance(cluster, HeteroCluster) or cluster.is_sites:
        return
    kinds = [(g.device, g.gpus_per_node, g.intra_node, g.inter_node) for g in cluster.groups]
    if all(k == kinds[0] for k in kinds):
        g = cluster.groups[0]
        log.warning("cluster: its groups are alike (%s x %d GPUs per node, the same links): the "
                    "groups form gives each group pipeline stages of its own and no data "
                    "parallelism across groups; one cluster of %d nodes (name, device, nodes, "
                    "intra_node, inter_node) plans them as well or better", g.device.name,
                    g.gpus_per_node, sum(x.nodes for x in cluster.groups))


def _warn_alone(rows: list[dict], step_s: float, cluster) -> None:
    """Warn where one group or site alone (``rows``: alone.groups_alone's) runs the step faster
    than the plan emitted, of ``step_s``."""
    kind, text = alone.verdict(rows, step_s, sites=cluster.is_sites,
                               kinds=len({g.device.name for g in cluster.groups}),
                               groups=len(cluster.groups))
    if kind == "faster":
        log.warning("cluster: %s", text)


def _raise_infeasible(prepared: Prepared, cluster, training: TrainingSpec,
                      options: SearchOptions, result) -> None:
    """InfeasibleError (or SpecError, for pins no configuration honours) naming what the leanest
    plan needs, for a search that found no plan."""
    ma = ModelArrays.from_blocks(prepared.blocks)
    note = length_note(training.seq_len, result.rejected, prepared.info.get("image_tokens"),
                       dict(options.fix), prepared.info.get("learned_positions", 0))
    raise InfeasibleError(explain_infeasible(ma, prepared.blocks, cluster, training, options,
                                             result.rejected,
                                             image=bool(prepared.info.get("image_tokens")))
                          + (f" ({note})" if note else ""),
                          reason="no feasible plan")


def _replicas_plan(prepared: Prepared, pick, cluster, training: TrainingSpec,
                   options: SearchOptions, *, over: Plan | None, rows: list[dict],
                   alone_rows: list[dict] | None, record_timing: bool) -> Plan:
    """The plan of data parallelism across alike sites for ``pick`` (planner.search.replicas:
    one site's search), beside ``over`` (the pipeline over the sites, or None)."""
    site_plan = emit(model_info=prepared.info, opgraph=prepared.opgraph, bg=prepared.blocks,
                     result=pick.result, cluster=pick.site, training=pick.training,
                     options=pick.options, record_timing=record_timing)
    return across_sites(site_plan, pick.row, cluster=cluster, training=training, options=options,
                        over=over, rows=rows, groups_alone=alone_rows)


def _replicas_only(prepared: Prepared, cluster, training: TrainingSpec, options: SearchOptions,
                   record_timing: bool) -> Plan:
    """across_sites=replicas: each site alone and each kind's replicas searched, the replicas
    emitted (a SpecError naming why where none runs on every GPU); no pipeline over the sites
    is searched (its pins, a dp over every site, need not fit one)."""
    if not getattr(cluster, "is_sites", False):
        raise SpecError("across_sites: replicas applies to a cluster of sites (the sites form "
                        "of a cluster file); leave it out for this cluster")
    t0 = time.perf_counter()
    alone_rows = alone.groups_alone(prepared.blocks, cluster, training, options,
                                    options.time_limit_s)
    left = None if options.time_limit_s is None else \
        options.time_limit_s - (time.perf_counter() - t0)
    reps = replicas.sites_replicas(prepared.blocks, cluster, training, options, left)
    pick = replicas.chosen(reps, math.inf, "replicas", cluster.num_gpus)
    log.info("plan: data parallel across %s (%s on each site), %.4g s a step",
             ", ".join(pick.row["sites"]), pick.row["parallel"], pick.row["step_time_s"])
    _warn_alone(alone_rows, pick.row["step_time_s"], cluster)
    return _replicas_plan(prepared, pick, cluster, training, options, over=None,
                          rows=[r.row for r in reps], alone_rows=alone_rows,
                          record_timing=record_timing)


NEAREST_ENGINE = "megatron"
"""The engine a --target any plan that no exported engine runs is searched again for: the one
whose software (Megatron-Core) the default pricing describes, so that only the rules differ."""


def _nearest_engine(prepared: Prepared, cluster, training: TrainingSpec, options: SearchOptions,
                    result) -> dict | None:
    """For a plan made for any target on one kind of node that none of targets.EXPORTED runs:
    the best configuration within NEAREST_ENGINE's rules ({target, step_time_s, parallel,
    peak_memory_bytes}, or {target, reason}); None where an exported engine runs it, or the
    user's pins already break that engine's rules."""
    if options.target != "any" or isinstance(cluster, HeteroCluster):
        return None
    parallel = result.best.config.to_dict()
    forms = attention_forms(prepared.blocks)
    experts = any(b.work.num_experts for b in prepared.blocks.blocks)
    heads = kv_heads(prepared.blocks)
    if targets.exported_runs(parallel, training.dtype, forms, experts=experts, kv_heads=heads):
        return None
    try:
        left = None if options.time_limit_s is None else \
            max(alone.MIN_TIME_S, options.time_limit_s - result.time_s)  # (the limit is shared)
        # narrowed as plan solve --target NEAREST_ENGINE narrows it: its rules for this model,
        # optimizer and software (one layer stack, offload, MoE settings)
        within = settings.narrowed(dataclasses.replace(options, target=NEAREST_ENGINE,
                                                       time_limit_s=left), prepared, training)
    except SpecError:
        return None
    if targets.exchange_refusal(dict(options.fix), NEAREST_ENGINE, forms,
                                kv_heads=heads) is not None:
        return None  # the pins break its rules for this model (an exchange it does not run)
    log.info("no exported engine runs this plan as planned: searching within %s's rules ...",
             NEAREST_ENGINE)
    found = search(prepared.blocks, cluster, training, within)
    best = found.best
    if best is None:
        try:  # the pins may leave its rules nothing for this model (no exchange at a pinned cp)
            explain_infeasible(ModelArrays.from_blocks(prepared.blocks), prepared.blocks, cluster,
                               training, within, found.rejected)
        except SpecError:
            return None
        return {"target": NEAREST_ENGINE, "reason": "no configuration fits"}
    return {"target": NEAREST_ENGINE, "step_time_s": best.step_time_s,
            "parallel": best.config.short(), "peak_memory_bytes": best.peak_memory_bytes}
