"""Turn the search result into a Plan (plain data, ready for JSON)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import platform
from importlib import metadata

from costmodels.topology import Cluster, HeteroCluster
from planner.errors import InternalError
from planner.options import KNOBS, Config, SearchOptions, TrainingSpec
from planner.planfile.breakdown import BREAKDOWN_WORDS
from planner.planfile.document import PRICED_TRAINING, Plan
from planner.schedule import as_text, difference_s
from planner.schedule.builders import build
from planner.search import hetero, placement
from planner.search.loop import SearchResult
from planner.search.pricing import Estimate
from planner.search.costs import ModelArrays
from planner.search.refine import repriced
from planner.search.sites import placement_report
from planner.search.space import attention_forms, kv_heads
from planner.trace.graph import BlockGraph, OpGraph


def emit(*, model_info: dict, opgraph: OpGraph, bg: BlockGraph, result: SearchResult,
         cluster: Cluster, training: TrainingSpec, options: SearchOptions,
         record_timing: bool = False, groups_alone: list[dict] | None = None,
         nearest_engine: dict | None = None, sites_replicas: list[dict] | None = None) -> Plan:
    best = result.best
    cfg = best.config
    check_predictions(best, training, cluster)
    by_name = {b.name: b for b in bg.blocks}
    order = [by_name[name] for st in best.stages for name in st.blocks]  # the split's order
    blocks = [{"name": b.name, "modules": b.modules, "params": b.work.params,
               "fwd_flops_per_sample": b.work.fwd_flops, "recompute": b.recompute} for b in order]
    module_of = {b.name: b.modules for b in bg.blocks}
    stages = [{
        "index": st.index,
        "pipeline_rank": st.rank,
        "modules": [m for name in st.blocks for m in module_of[name]],
        "blocks": st.blocks,
        "ranks": st.ranks or placement.stage_ranks(cfg, st.rank),
        **({"group": st.group} if st.group else {}),
        "predicted": {
            "time_per_microbatch_s": st.time_s, "compute_s": st.compute_s,
            # (a stage without backward: its difference may round below zero)
            "fwd_s": st.fwd_s,
            "bwd_s": difference_s(st.compute_s - st.fwd_s - st.recompute_s, st.compute_s),
            "recompute_s": st.recompute_s, "wgrad_s": st.wgrad_s, "tp_comm_s": st.tp_comm_s,
            "tp_fwd_comm_s": st.tp_fwd_comm_s,
            "p2p_s": st.p2p_s, "params": st.params, "in_flight_microbatches": st.in_flight,
            "activation_bytes_per_microbatch": st.act_bytes, "memory_bytes": st.memory,
            **({"cp_comm_s": st.cp_comm_s} if cfg.cp > 1 else {}),
            **({"ep_comm_s": st.ep_comm_s, "expert_params": st.expert_params}
               if cfg.ep * cfg.etp > 1 else {}),
        },
    } for st in best.stages]
    parallel = {k: v for k, v in cfg.to_dict().items()}
    split = ("CP-SAT stage assignment on the block DAG" if best.stage_split == "cp-sat" else
             "exact contiguous stage split")
    search = {
        "method": f"enumeration of configurations with {split}; the top {len(result.alternatives) + 1}"
                  f" re-timed by simulating their schedules",
        "status": result.status,
        "gap": result.gap if result.status == "feasible" else 0.0,
        "candidates": result.candidates,
        "evaluated": result.evaluated,
        "rejected": dict(sorted(result.rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
        "time_s": result.time_s if record_timing else None,
        "options": _options_record(options),
        "target": options.target,
        "alternatives": [alternative(best, alt, training, cluster) for alt in result.alternatives],
        "priced": dict(parallel),
        "priced_training": priced_training(training),
    }
    if isinstance(cluster, HeteroCluster) and best.stages[0].group:
        # CP-SAT's joint model of the stages, their groups and sizes, on the best plan
        search["groups_check"] = {"status": best.split_status, "gap": best.split_gap}
    if isinstance(cluster, HeteroCluster) and cluster.is_sites and best.stages[0].group:
        search["placements"] = placement_report(best, ModelArrays.from_blocks(bg), cluster,
                                                training)
    if groups_alone is not None:  # each group searched alone (planner.search.alone)
        search["groups_alone"] = groups_alone
    if sites_replicas:  # data parallel across alike sites (planner.search.replicas)
        search["sites_replicas"] = sites_replicas
    if nearest_engine is not None:  # within an exported engine's rules (api._nearest_engine)
        search["nearest_engine"] = nearest_engine
    provenance = {
        "planner": _version("planner"), "torch": _version("torch"),
        "transformers": _version("transformers"), "python": platform.python_version(),
        "trace_method": opgraph.method,
        "unpriced_ops": model_info.get("unpriced_ops", []),
        "input_hash": input_hash(model_info, training, cluster, options),
    }
    plan = Plan(
        model={**{k: v for k, v in model_info.items() if k != "unpriced_ops"}, "trace": {"method": opgraph.method, "ops": len(opgraph.ops),
                                       "seq_len": opgraph.seq_len,
                                       "repeats": [r.__dict__ for r in opgraph.repeats]},
               "blocks": blocks,
               **({"routed_experts": experts} if (experts := int(max(
                   (b.work.num_experts for b in bg.blocks), default=0))) else {}),
               **({} if has_attention(bg) else {"no_attention": True}),
               **({"attention_forms": list(forms)} if (forms := attention_forms(bg)) else {}),
               **({"kv_heads": heads} if (heads := kv_heads(bg)) else {})},
        training=training_dict(training), cluster=cluster.summary(), parallel=parallel,
        stages=stages, tensor_parallel=_tp_map(bg, cfg.tp), schedule=_schedule(cfg),
        predicted={**predicted(best, training, cluster),
                   "active_params_per_token": active_params(bg, opgraph.seq_len),
                   **_fp8_account(best, bg, cluster, training),
                   **_host_account(best, bg, cluster, training)},
        search=search, provenance=provenance,
    )
    return Plan.from_dict(plan.to_dict())  # validated, and rounded exactly as the file will be


def _options_record(options: SearchOptions) -> dict:
    """The plan's ``search.options``: what --why and the exports re-plan with (the pins, the
    runners-up kept, the time limit, and --across-sites where not auto)."""
    return {"fix": dict(options.fix), "top_k": options.top_k, "time_limit_s": options.time_limit_s,
            **({"across_sites": options.across_sites} if options.across_sites != "auto" else {}),
            **({"layout": options.layout} if options.layout is not None else {}),
            **({"memory_reserve": reserve} if (reserve := _reserve_record(options)) else {})}


def _reserve_record(options: SearchOptions) -> dict:
    """The memory kept free on each device where it is not the default (--memory-reserve-*)."""
    if not options.reserve_changed:
        return {}
    return {"fraction": options.memory_reserve_fraction, "bytes": options.memory_reserve_bytes}


def across_sites(site_plan: Plan, row: dict, *, cluster: HeteroCluster, training: TrainingSpec,
                 options: SearchOptions, over: Plan | None = None, rows: list[dict],
                 groups_alone: list[dict] | None = None) -> Plan:
    """The plan of data parallelism across alike sites (planner.search.replicas, whose ``row``
    it is): ``site_plan``, one site's plan for its share of the batch, run on each of the row's
    sites. Its data-parallel degree is the site's times the number of sites, ``dp_replicate``
    that number (HSDP's replicate groups: the gradients reduced inside each site, the shards
    all-reduced across the sites), the ranks numbered site after site (with a pipeline, the
    replicas outermost: tp-pp-dp); its step is the site's plus the part of the all-reduce across
    the sites past the last micro-batch's backward (breakdown ``sites_dp_s``). ``cluster``,
    ``training`` (the whole batch's) and ``options`` are the planning's; ``over``, the pipeline
    over every site as emitted (None where it was not searched), is kept as the runner-up;
    ``rows`` and ``groups_alone`` are every kind's replicas and each site alone
    (search.sites_replicas, search.groups_alone)."""
    k = len(row["sites"])
    par = site_plan.parallel
    cfg = Config(**{key: par[key] for key in KNOBS if key in par})
    whole = cfg.with_(dp=cfg.dp * k, **({"placement": "tp-pp-dp"} if cfg.pp > 1 else {}))
    stages = [{**st, "ranks": placement.stage_ranks(whole, st["pipeline_rank"])}
              for st in site_plan.stages]
    site = site_plan.predicted
    step = site["step_time_s"] + row["exposed_s"]
    scale = site["step_time_s"] / step  # the same FLOPs per GPU in a longer step
    predicted_d = {
        **site, "step_time_s": step,
        "samples_per_s": training.global_batch / step,
        "tokens_per_s": training.global_batch * training.seq_len / step,
        "tflops_per_device": site["tflops_per_device"] * scale, "mfu": site["mfu"] * scale,
        "breakdown": {**site["breakdown"], "sites_dp_s": row["exposed_s"]},
        "model_flops_per_step": site["model_flops_per_step"] * k,
        "hardware_flops_per_step": site["hardware_flops_per_step"] * k,
    }
    if "fp8" in site:  # its bf16 step waits for the same reduction across the sites
        predicted_d["fp8"] = {**site["fp8"], "bf16_step_time_s":
                              site["fp8"]["bf16_step_time_s"] + row["exposed_s"]}
    runner_up = [] if over is None else [{
        "parallel": over.parallel, "step_time_s": over.step_time_s,
        "peak_memory_bytes": over.predicted["peak_memory_bytes"],
        "why": f"{100 * (over.step_time_s / step - 1):+.1f}% step time: the pipeline over the "
               f"sites ({over.parallel_summary}), its sends crossing them"}]
    search = {**site_plan.search, "alternatives": runner_up, "target": options.target,
              "options": _options_record(options),
              "priced": {**whole.to_dict(), "dp_replicate": k},
              "priced_training": priced_training(training),  # (the whole batch, not a site's)
              "sites_replicas": [{**r, "chosen": True} if r["sites"] == row["sites"] else r
                                 for r in rows],
              **({"groups_alone": groups_alone} if groups_alone is not None else {})}
    provenance = {**site_plan.provenance,
                  "input_hash": input_hash(site_plan.model, training, cluster, options)}
    plan = Plan(model=site_plan.model, training=training_dict(training), cluster=cluster.summary(),
                parallel={**whole.to_dict(), "dp_replicate": k}, stages=stages,
                tensor_parallel=site_plan.tensor_parallel, schedule=site_plan.schedule,
                predicted=predicted_d, search=search, provenance=provenance)
    return Plan.from_dict(plan.to_dict())


def _fp8_account(best: Estimate, bg: BlockGraph, cluster, training: TrainingSpec) -> dict:
    """For an fp8 plan: what FP8 changed, against the same configuration and split in bf16
    (``outer_blocks_bf16``: the model has blocks outside its repeated layers, which stay bf16).
    On a cluster of groups the same stages and groups are priced again, and each group's device
    figures are listed (``groups``) in place of the one device's."""
    if training.dtype != "fp8":
        return {}
    in_bf16 = dataclasses.replace(training, dtype="bf16")
    if isinstance(cluster, HeteroCluster):
        bf16 = hetero.repriced(best, ModelArrays.from_blocks(bg), cluster, in_bf16)
        figures = {"groups": [{"group": g.name, **_fp8_figures(g.device)}
                              for g in cluster.groups]}
        holds = {g.name: g.device.memory_bytes for g in cluster.groups}
        fits = all(st.memory["total"] <= holds[st.group] for st in bf16.stages)
    else:
        bf16 = repriced(best, bg, cluster, in_bf16)
        figures = _fp8_figures(cluster.device)
        fits = bf16.peak_memory_bytes <= cluster.device.memory_bytes
    copies = max(st.memory.get("fp8_weights", 0.0) for st in best.stages)
    return {"fp8": {
        "recipe": training.engine.fp8_recipe,
        **figures,
        "weight_copy_bytes": copies,
        **({"linear": training.engine.fp8_linear} if not training.engine.fp8_copies else {}),
        "outer_blocks_bf16": not all(b.recompute for b in bg.blocks),
        **({"experts_bf16": True} if not training.engine.fp8_experts and any(
            b.work.num_experts for b in bg.blocks) else {}),
        "bf16_step_time_s": bf16.step_time_s,
        "bf16_peak_memory_bytes": bf16.peak_memory_bytes,
        "bf16_fits": fits,
    }}


def _fp8_figures(device) -> dict:
    """A device's fp8 and bf16 GEMM peaks (TFLOP/s) and the shares of them GEMMs sustain."""
    return {"gemm_peak_tflops": device.peak("fp8") / 1e12,
            "gemm_efficiency": device.gemm_efficiency("fp8"),
            "bf16_peak_tflops": device.peak("bf16") / 1e12,
            "bf16_gemm_efficiency": device.gemm_efficiency("bf16")}


def _host_account(best: Estimate, bg: BlockGraph, cluster, training: TrainingSpec) -> dict:
    """For a plan whose MoE layers are priced as waiting for the host to issue their ops
    (engine moe_host_op_s), the seconds of the step that wait costs: the step less the same
    configuration and split priced without it (``moe_host_wait_s``; plan show says so, since it
    is counted in the compute part)."""
    if not training.engine.moe_host_op_s or not isinstance(cluster, Cluster) or \
            not any(b.work.num_experts for b in bg.blocks):
        return {}
    free = repriced(best, bg, cluster, dataclasses.replace(
        training, engine=dataclasses.replace(training.engine, moe_host_op_s=0.0)))
    wait = best.step_time_s - free.step_time_s
    return {"moe_host_wait_s": wait} if wait > 1e-6 * best.step_time_s else {}


def training_dict(training: TrainingSpec) -> dict:
    return {"global_batch": training.global_batch, "seq_len": training.seq_len,
            "dtype": training.dtype, "optimizer": training.optimizer,
            "engine": dataclasses.asdict(training.engine)}


FLOPS_COUNTED = ("MFU counts model FLOPs: forward and backward of every op the model runs "
                 "(the operand gradients autograd computes; attention under a causal mask counted "
                 "half, as a causal kernel runs it); TFLOP/s per device counts hardware FLOPs: "
                 "model FLOPs plus the forward recomputed for activation recomputation and "
                 "experts' empty token slots (capacity buffers, inputs padded to capacity)")
"""What the plan's FLOP figures count (``predicted.flops_counted``)."""


def predicted(est: Estimate, training: TrainingSpec, cluster: Cluster) -> dict:
    tokens = training.global_batch * training.seq_len
    return {"step_time_s": est.step_time_s, "timing": est.timing, **est.throughput(training, cluster),
            "peak_memory_bytes": est.peak_memory_bytes, "breakdown": dict(est.breakdown),
            "model_flops_per_step": est.model_flops,
            "hardware_flops_per_step": est.hardware_flops,
            "model_flops_per_token": est.model_flops / tokens,
            "flops_counted": FLOPS_COUNTED}


def has_attention(bg: BlockGraph) -> bool:
    """Whether the model runs an attention core (fused, or QK^T and scores x V written out),
    whether or not tensor parallelism splits it (attn_flops counts only the split ones: a
    new-user check found Qwen3-Next's gated attention, outside any split region, called none)."""
    return any(b.work.attn_flops > 0 or b.work.fused_attn_flops > 0 or b.work.fused_attn_calls
               or any(g.attention for g in b.work.gemms) for b in bg.blocks)


def active_params(bg: BlockGraph, seq_len: int) -> float:
    """Weights that multiply each token: the forward FLOPs of the GEMMs with a weight operand per
    sample, over 2 x tokens (a mixture of experts counts its routed experts only: 2 of 8 experts
    in Mixtral; capacity-style experts their filled slots only). A weight that one GEMM applies
    at many positions of a token (a convolution's kernel over an image counted as one token)
    counts once."""
    tokens = max(seq_len, 1)
    total = 0.0
    for b in bg.blocks:
        for g in b.work.gemms:
            if g.linear:
                per_token = g.flops / (2.0 * tokens)
                total += per_token if g.experts else min(per_token, g.batch * g.n * g.k)
        total -= b.work.expert_slot_flops / (2.0 * tokens)
    return total


def check_predictions(est: Estimate, training: TrainingSpec, cluster: Cluster) -> None:
    """Invariants every emitted prediction holds; a violation is the planner's bug (InternalError),
    never a plan: positive, finite times and memory; model FLOPs <= hardware FLOPs <= the devices'
    peak x the step time (so MFU <= 1)."""
    problems = []
    step = est.step_time_s
    if not (math.isfinite(step) and step > 0):
        problems.append(f"step time {step!r} s")
    if not (math.isfinite(est.peak_memory_bytes) and est.peak_memory_bytes > 0):
        problems.append(f"peak memory {est.peak_memory_bytes!r} bytes")
    for st in est.stages:
        if min(st.compute_s, st.tp_comm_s, st.p2p_s, st.memory.get("total", 0.0)) < 0:
            problems.append(f"stage {st.index} has a negative time or memory")
    if not 0 < est.model_flops <= est.hardware_flops * (1 + 1e-9):
        problems.append(f"model FLOPs {est.model_flops:.4g} not within (0, hardware FLOPs "
                        f"{est.hardware_flops:.4g}]")
    if not problems:
        rates = est.throughput(training, cluster)
        used = rates["mfu"] * est.hardware_flops / est.model_flops
        if used > 1 + 1e-9:
            problems.append(f"the devices would run {used:.3g}x their peak FLOP/s (MFU "
                            f"{rates['mfu']:.3g})")
    if problems:
        raise InternalError(f"the prediction for {est.config.short()} breaks an invariant: "
                            + "; ".join(problems))


def alternative(best: Estimate, alt: Estimate, training: TrainingSpec, cluster: Cluster) -> dict:
    return {"parallel": alt.config.to_dict(), "step_time_s": alt.step_time_s,
            "peak_memory_bytes": alt.peak_memory_bytes, "why": why_slower(best, alt)}


def why_slower(best: Estimate, alt: Estimate) -> str:
    """One line: how much slower, and the two parts of the step that moved most."""
    delta = alt.step_time_s - best.step_time_s
    pct = 100 * delta / best.step_time_s
    parts = [k for k in BREAKDOWN_WORDS if k in best.breakdown or k in alt.breakdown]
    diffs = sorted(((alt.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0), k) for k in parts),
                   key=lambda d: -abs(d[0]))
    parts = [f"{BREAKDOWN_WORDS[k]} {d:+.3g} s" for d, k in diffs[:2] if abs(d) > 1e-6]
    return f"{pct:+.1f}% step time" + (f": {', '.join(parts)}" if parts else "")


def _tp_map(bg: BlockGraph, tp: int) -> dict:
    if tp == 1:
        return {m: "replicate" for m in bg.tp_roles}
    return dict(bg.tp_roles)


def _schedule(cfg) -> dict:
    actions = as_text(build(cfg.schedule, cfg.pp, cfg.num_microbatches, vpp=cfg.vpp))
    return {"name": cfg.schedule, "format": "torch.distributed.pipelining actions, one list per "
            "pipeline rank (with W actions, B is the input-gradient half, which torch spells I: "
            "planner.schedule.torch_actions converts)", "actions": actions}


def priced_training(training: TrainingSpec) -> dict:
    """``search.priced_training``: the training settings the predictions are priced with, which a
    hand edit of ``training`` leaves behind (Plan.training_edits)."""
    return {k: getattr(training, k) for k in PRICED_TRAINING}


def input_hash(model_info: dict, training: TrainingSpec, cluster: Cluster,
               options: SearchOptions) -> str:
    payload = {"model": model_info.get("fingerprint"), "name": model_info.get("name"),
               "training": training_dict(training), "cluster": repr(cluster),
               "fix": dict(options.fix), "top_k": options.top_k,
               "planner": _version("planner"), **_reserve_record(options)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "unknown"


def emit_tables(*, model_info: dict, rec, tp, cluster: Cluster, training: TrainingSpec,
                rec_options, record_timing: bool = False) -> Plan:
    """A recommendation model's plan: the dense part data-parallel on every rank (DDP or FSDP2, as
    the dense search chose), the tables as ``tp`` (planner.search.tables.TablePlan) shards them;
    the plan's ``embeddings`` section."""
    W = cluster.num_gpus
    env = tp.env
    bd = tp.breakdown
    step = tp.step_s
    dense = {"name": "dense", "modules": ["dense"], "params": rec.dense_params,
             "fwd_flops_per_sample": rec.dense_flops_per_sample, "recompute": False}
    peak_mem = max(p["hbm_bytes"] for p in tp.per_rank)
    breakdown = {"compute_s": bd["dense_compute_s"], "bubble_s": 0.0, "tp_comm_s": 0.0,
                 "pp_comm_s": 0.0, "dp_comm_s": bd["grad_allreduce_exposed_s"],
                 "optimizer_s": bd.get("dense_optimizer_s", 0.0),
                 "embedding_lookup_s": bd["lookup_s"],
                 "embedding_comm_s": bd["embedding_comm_s"],
                 "host_wait_s": max(0.0, bd["host_s"] - bd["device_s"])}
    flops = 3 * rec.dense_flops_per_sample * training.global_batch
    peak = cluster.device.peak(training.dtype)
    predicted_d = {
        "step_time_s": step, "timing": "closed form",
        "samples_per_s": training.global_batch / step, "tokens_per_s": training.global_batch / step,
        "tflops_per_device": flops / step / W / 1e12, "mfu": flops / step / W / peak,
        "peak_memory_bytes": peak_mem, "breakdown": breakdown,
        "model_flops_per_step": flops, "hardware_flops_per_step": flops,
        "model_flops_per_token": flops / training.global_batch,
        "flops_counted": "dense part only (forward and backward); table lookups move bytes, not "
                         "FLOPs",
    }
    tables = []
    for t, lay, c in zip(rec.tables, tp.layouts, tp.table_costs):
        tables.append({
            **t.to_dict(), "sharding_type": lay.sharding, "compute_kernel": lay.kernel,
            "tier": lay.tier, **({"cache_ratio": lay.cache_ratio} if lay.tier == "uvm_caching"
                                 else {}),
            "ranks": list(lay.ranks),
            "shards": [{"rank": s.rank, "offsets": [s.row, s.col], "sizes": [s.rows, s.cols]}
                       for s in lay.shards],
            "lookup_s": max(c.lookup_s.values()) if c.lookup_s else 0.0,
            "hbm_bytes": sum(c.hbm_bytes.values()), "host_bytes": sum(c.host_bytes.values())})
    times = [p["time_s"] for p in tp.per_rank]
    mems = [p["hbm_bytes"] for p in tp.per_rank]
    embeddings = {
        "pipeline": rec_options.pipeline, "table_optimizer": rec_options.optimizer,
        "world_size": W, "local_batch": env.local_batch, "tables": tables,
        "ranks": tp.per_rank,
        "imbalance": {"time": max(times) / (sum(times) / W), "hbm": max(mems) / (sum(mems) / W)},
        "breakdown": bd,
        "dense": {"params": rec.dense_params, "fwd_flops_per_sample": rec.dense_flops_per_sample,
                  "activation_bytes_per_sample": rec.dense_act_bytes_per_sample,
                  "ops_per_forward": rec.dense_ops, "memory_bytes": tp.dense_memory_bytes,
                  **(tp.dense.to_dict() if tp.dense is not None else
                     {"zero": 0, "engine": "DDP", "priced_by": "FLOP count (data-parallel)"})},
        "solver": tp.solver if record_timing else {**tp.solver, "time_s": None},
    }
    parallel = {"dp": W, "tp": 1, "pp": 1, "vpp": 1, "micro_batch": env.local_batch,
                "num_microbatches": 1, "schedule": "1f1b", "recompute": "none",
                "zero": tp.dense.zero if tp.dense is not None else 0,
                "sequence_parallel": False, "offload_optimizer": False, "placement": "tp-pp-dp",
                "cp": 1, "cp_comm": "p2p", "ep": 1, "etp": 1}
    stage = {"index": 0, "pipeline_rank": 0, "modules": ["dense"], "blocks": ["dense"],
             "ranks": list(range(W)),
             "predicted": {"time_per_microbatch_s": step, "compute_s": bd["dense_compute_s"],
                           "params": rec.dense_params,
                           "memory_bytes": {"total": peak_mem,
                                            "dense": tp.dense_memory_bytes,
                                            "tables": peak_mem - tp.dense_memory_bytes}}}
    search = {
        "method": "embedding tables: CP-SAT over each table's layouts (sharding type, ranks, "
                  "memory tier) minimising the slowest rank, from a greedy start; dense part "
                  "data-parallel (DDP or FSDP2) as the dense search prices it",
        "status": tp.solver["status"] if tp.solver["status"] in ("optimal", "feasible")
        else "feasible",
        "gap": tp.solver.get("gap") or 0.0,
        "candidates": sum(1 for _ in tp.layouts), "evaluated": 1, "rejected": {},
        "time_s": tp.solver["time_s"] if record_timing else None,
        "options": {"fix": {}, "top_k": 1, "time_limit_s": rec_options.time_limit_s},
        "target": "torchrec", "alternatives": [],
        "priced_training": priced_training(training),
    }
    provenance = {
        "planner": _version("planner"), "torch": _version("torch"),
        "torchrec": _version("torchrec"), "python": platform.python_version(),
        "trace_method": "flop-counter", "unpriced_ops": [],
        "input_hash": hashlib.sha256(json.dumps(
            {"model": model_info.get("fingerprint"), "training": training_dict(training),
             "cluster": repr(cluster), "options": repr(rec_options)},
            sort_keys=True, default=str).encode()).hexdigest()[:16],
    }
    plan = Plan(model={**model_info, "blocks": [dense]}, training=training_dict(training),
                cluster=cluster.summary(), parallel=parallel, stages=[stage], tensor_parallel={},
                schedule={"name": "1f1b", "actions": [["0F0", "0B0"]]},
                predicted=predicted_d, search=search, provenance=provenance,
                embeddings=embeddings)
    return Plan.from_dict(plan.to_dict())
