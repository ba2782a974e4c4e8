"""Data parallelism across alike sites: what the plan over sites is also measured against.

The search over sites chains pipeline stages through them, so only activations cross the slow
links. The other way to use several sites of one kind is to run one site's plan on each, every
site on its share of the global batch, and to all-reduce the gradients across the sites once a
step (hierarchically: reduce-scattered inside each site, the shards all-reduced across the
sites, all-gathered inside again; HSDP's replicate groups, Megatron-LM's
--num-distributed-optimizer-instances). With a large batch and a fast enough link that wins,
since the gradients cross once a step whatever the batch while the pipeline's sends grow with
it.

For each kind of site with two or more sites, its plan is searched on one site for the share of
the batch, at each pipeline depth apart (the same model, pins and rules; a pinned dp counts the
replicas over every site, so each site takes its share of them; ZeRO-1 at least unless zero is
pinned, since the reduction shards the gradients inside a site), and the all-reduce across the
sites is priced on their links (costmodels.sites.replicas_allreduce_s), one call per gradient
bucket (BUCKET_PARAMS), beside the last micro-batch's backward, for the CANDIDATES fastest site
plans of each depth (the engines reduce each bucket as it fills; the rest is exposed,
last_backward_s). Where that is faster than the pipeline over the sites, it is the plan
planner.api emits (planner.emit.across_sites: the site's plan with ``dp_replicate`` = the number
of sites, ranks numbered site after site); the plan's ``search.sites_replicas`` keeps every
kind's row either way.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter

from costmodels import comm
from costmodels.errors import PlannerError, SpecError
from costmodels.sites import replicas_allreduce_s
from costmodels.topology import HeteroCluster
from planner.options import SearchOptions, TrainingSpec
from planner.search import alone, hetero
from planner.search.dp_traffic import DataParallelBytes
from planner.search.feasibility import cluster_pin_problem
from planner.search.loop import OUTCOMES, SearchResult, search
from planner.search.space import MESH, divisors
from planner.trace.graph import BlockGraph

log = logging.getLogger(__name__)

BUCKET_PARAMS = 40e6
"""Parameters per gradient bucket, each reduced by one all-reduce: Megatron-Core's default,
max(40M, 1M x dp) (megatron/core/distributed/distributed_data_parallel.py, core_v0.15.0;
--ddp-bucket-size sets another). Across sites every bucket pays the ring's latencies."""


def buckets(params: float, dp: int, chunks: int = 1) -> int:
    """Gradient all-reduces per step of a rank holding ``params`` in ``chunks`` model chunks
    (virtual stages, bucketed apart) over ``dp`` data- and context-parallel replicas
    (BUCKET_PARAMS)."""
    chunks = max(1, chunks)
    return chunks * max(1, math.ceil(params / chunks / max(BUCKET_PARAMS, 1e6 * dp)))


def reductions(params: float, layers: int, cfg, sites: int, engine, experts: float = 0.0) -> int:
    """All-reduces a rank runs one after the other each step for its gradients, when one site's
    configuration ``cfg`` runs on each of ``sites`` sites: every tensor- and pipeline-parallel
    rank reduces its own share with its own replicas (the groups at once, on their shares of the
    links), in Megatron-Core's buckets (buckets: the data-parallel size over every site), one per
    model chunk where the reduction is not overlapped (Megatron-Core then makes one bucket), or
    one per wrapped layer under FSDP2 (EngineSpec.fsdp_copies: torchtitan's HSDP). ``experts``
    of the ``params`` are routed experts' (ep x etp ranks share them), in buffers of their own
    reduced over the expert-data-parallel ranks."""
    chunks = cfg.vpp if cfg.pp > 1 else 1
    if engine.fsdp_copies:
        return max(1, math.ceil(layers / cfg.pp))
    if not engine.overlap_grad_reduce:
        return chunks * (2 if experts else 1)
    dense = buckets((params - experts) / (cfg.tp * cfg.pp), sites * cfg.dp * cfg.cp, chunks)
    if not experts:
        return dense
    return dense + buckets(experts / (cfg.ep * cfg.etp * cfg.pp), sites * cfg.edp, chunks)


BACKWARD_SHARE = 2.0 / 3.0
"""The backward's share of a micro-batch's compute (twice the forward's FLOPs)."""


def last_backward_s(best, training: TrainingSpec) -> float:
    """Seconds of compute the reduction across sites can run beside: the last micro-batch's
    backward, whose buckets go out as they fill (Megatron-Core's overlapped reduction, FSDP2's
    per-layer reduce-scatter); none where the engine reduces after the backward
    (EngineSpec.overlap_grad_reduce false)."""
    if not training.engine.overlap_grad_reduce:
        return 0.0
    m = max(1, best.config.num_microbatches)
    return best.breakdown.get("compute_s", 0.0) / m * BACKWARD_SHARE


def trained_params(bg: BlockGraph) -> float:
    """Parameters with gradients in one replica (a weight two blocks share counted once)."""
    blocks = sum(b.work.params - b.work.frozen_params_tp - b.work.frozen_params_rep
                 for b in bg.blocks)
    return blocks - sum(float(n) for _, _, n, _, frozen in bg.shared if not frozen)


@dataclasses.dataclass
class Replicas:
    """One kind of site's data parallelism across its sites: the plan file's row, and what the
    row was found with (the site's search result, the site, the share of the batch, the options),
    from which planner.emit.across_sites writes the plan."""

    row: dict
    result: SearchResult | None
    site: object
    training: TrainingSpec
    options: SearchOptions


def sites_replicas(bg: BlockGraph, cluster: HeteroCluster, training: TrainingSpec,
                   options: SearchOptions, time_left_s: float | None = None) -> list[Replicas]:
    """Per kind of site with two or more sites, a Replicas whose row is {sites, gpus,
    step_time_s, site_step_s, allreduce_s, exposed_s, gradient_bytes, buckets, ring, parallel,
    global_batch} (the step with one replica set per site, and its parts: the site plan's step,
    the all-reduce across sites and the part of it past the last backward, its bytes, calls and
    ring order), or {sites, gpus, reason} where it cannot run. ``time_left_s``: what is left of
    the planning's time limit, shared by the kinds. The site's ranks are laid out with the
    pipeline inside the data-parallel replicas (placement tp-pp-dp) unless placement is pinned
    or the target refuses it, so that numbering the ranks site after site puts whole replicas
    on each site (whole_replicas)."""
    members: dict[int, list[int]] = {}
    for g, kind in enumerate(hetero.kinds(cluster)):
        members.setdefault(kind, []).append(g)
    sets = [m for m in members.values() if len(m) >= 2]
    if not sets:
        return []
    limit = None if time_left_s is None else max(alone.MIN_TIME_S, time_left_s / len(sets))
    params = trained_params(bg)
    experts = sum(b.work.expert_params - b.work.frozen_expert_params for b in bg.blocks)
    layers = sum(1 for b in bg.blocks if b.recompute) or len(bg.blocks)
    grad_bytes = params * DataParallelBytes.of(training).grads
    out = []
    for group in sets:
        site, k = cluster.groups[group[0]], len(group)
        row: dict = {"sites": [cluster.groups[g].name for g in group], "gpus": k * site.num_gpus}
        t0 = time.perf_counter()
        share, result = training, None
        # a pipeline inside each site needs the replicas outermost (tp-pp-dp): where the target
        # or a pin places them otherwise, each site runs without one
        pipelined = options.pp_inner and options.fix.get("placement",
                                                         REPLICA_PLACEMENT) == REPLICA_PLACEMENT
        fix = {**({"placement": REPLICA_PLACEMENT} if pipelined else {"pp": 1}),
               **{key: v for key, v in options.fix.items() if key != "dp"}}
        if "dp" in options.fix and int(options.fix["dp"]) % k == 0:  # the pinned replicas, over
            fix["dp"] = int(options.fix["dp"]) // k                  # every site: a share each
        site_options = dataclasses.replace(options, fix=fix, top_k=CANDIDATES,
                                           time_limit_s=limit)
        if int(fix["pp"] if "pp" in fix else 1) > 1 and not pipelined:
            row["reason"] = (f"pp={fix['pp']} on each site needs its replicas outermost "
                             "(placement tp-pp-dp), so that each site holds whole pipelines; "
                             + ("the target orders its ranks pipeline outermost"
                                if not options.pp_inner else
                                f"the pinned placement={options.fix['placement']} does not"))
        elif training.global_batch % k:
            row["reason"] = (f"the global batch ({training.global_batch:,}) does not split into "
                             f"{k} equal shares")
        elif int(options.fix.get("dp", k)) % k:
            row["reason"] = (f"the pinned dp={options.fix['dp']} does not split into {k} equal "
                             "shares, one per site")
        else:
            share = dataclasses.replace(training, global_batch=training.global_batch // k)
            result, candidates, refused = None, [], ""
            # each pipeline depth searched apart: the site's fastest plans differ mostly in what
            # the site alone rewards, and the depth changes what the reduction across the sites
            # exposes (a new-user check: pinned pp=16 crossed two sites in 7.9 s where the best
            # of the fastest eight took 11.9 s)
            depths = [fix["pp"]] if "pp" in fix else divisors(site.num_gpus)
            deadline = None if limit is None else time.perf_counter() + limit  # (shared)
            for pp in depths:
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0 and result is not None:
                    break  # the time limit: the depths searched so far
                try:
                    found = _site_search(bg, site, share, dataclasses.replace(
                        site_options, fix={**fix, "pp": pp},
                        time_limit_s=None if left is None else max(left, 1e-3)), options)
                except PlannerError as exc:
                    refused = refused or str(exc).splitlines()[0]
                    continue
                result = found if result is None else _merged(result, found)
                # ZeRO-1 at least unless zero is pinned (the reduction shards inside a site):
                # a depth's runners-up may have ZeRO-0 where its best did not (ZeRO-0 only
                # where the depth has nothing else that fits)
                found_all = ([found.best] if found.best else []) + found.alternatives
                sharded = [e for e in found_all if e.config.zero >= 1]
                candidates += found_all if "zero" in options.fix or not sharded else sharded
            if not candidates:
                row["reason"] = refused or (f"no configuration fits {site.name} at "
                                            f"{share.global_batch:,} samples a step")
            else:
                def across_sites(est):  # (calls, seconds, ring order, exposed) of ``est``
                    calls = reductions(params, layers, est.config, k, training.engine, experts)
                    seconds, ring = replicas_allreduce_s(grad_bytes, cluster, group, calls)
                    return calls, seconds, ring, comm.beside_compute_s(
                        seconds, last_backward_s(est, training), site.device.overlap_slowdown)
                # the site plan whose step with the reduction across the sites is shortest,
                # among the site's fastest (a review: the fastest alone with tp=1 paid 46 s
                # where tp=4, slower alone, paid 28 s: fewer, larger buckets)
                priced = [(est, across_sites(est)) for est in candidates]
                best, (calls, across, order, exposed) = min(
                    priced, key=lambda p: p[0].step_time_s + p[1][3])
                result = dataclasses.replace(result, best=best, alternatives=[])
                row.update(step_time_s=best.step_time_s + exposed, site_step_s=best.step_time_s,
                           allreduce_s=across, exposed_s=exposed, gradient_bytes=grad_bytes,
                           buckets=calls,
                           ring=[cluster.groups[g].name for g in order],
                           parallel=best.config.short(), global_batch=share.global_batch)
        log.info("data parallel across %s (%d GPUs): %s (%.1f s)", ", ".join(row["sites"]),
                 row["gpus"], f"{row['step_time_s']:.4g} s a step" if "step_time_s" in row
                 else row["reason"], time.perf_counter() - t0)
        out.append(Replicas(row, result if "step_time_s" in row else None, site, share,
                            site_options))
    return out


CANDIDATES = 8
"""Site plans (the fastest and its runners-up) kept at each pipeline depth, each searched apart,
that each kind's replicas are priced with, the reduction across the sites added: the fastest on
a site need not be the fastest across them."""

REPLICA_PLACEMENT = "tp-pp-dp"
"""The site plan's rank order (unless pinned): data-parallel replicas outermost, so the ranks of
one site, numbered together, hold whole replicas (pipelines included)."""


def _merged(a: SearchResult, b: SearchResult) -> SearchResult:
    """Two searches of one space, each with another pipeline depth pinned, as one: the
    configurations they counted (and their outcomes) added, the rules' counts of knob choices
    made before the depth (tp, micro-batch, ...) taken once (each search counts them again), the
    depth's own pin not counted as a rule the user met; the worse status and gap kept (best and
    alternatives are the caller's)."""
    status = "optimal" if a.status == b.status == "optimal" else "feasible"
    gaps = (a.gap, b.gap)
    rejected = Counter({r: (a.rejected[r] + b.rejected[r] if r in OUTCOMES
                            else max(a.rejected[r], b.rejected[r]))
                        for r in set(a.rejected) | set(b.rejected) if r != MESH})
    return dataclasses.replace(
        a, candidates=a.candidates + b.candidates, evaluated=a.evaluated + b.evaluated,
        rejected=rejected, status=status, time_s=a.time_s + b.time_s,
        gap=None if None in gaps else max(gaps))


def _site_search(bg: BlockGraph, site, share: TrainingSpec, site_options: SearchOptions,
                 options: SearchOptions) -> SearchResult:
    """One site's search for its share of the batch, with ZeRO-1 at least unless zero is pinned
    (the hierarchical reduction shards inside a site: a distributed optimizer or FSDP)."""
    result = search(bg, site, share, site_options)
    if result.best is not None and result.best.config.zero == 0 and "zero" not in options.fix:
        sharded = search(bg, site, share, dataclasses.replace(
            site_options, fix={**site_options.fix, "zero": 1}))
        result = sharded if sharded.best is not None else result
    return result


def pin_problem(fix: dict, cluster: HeteroCluster, batch: int) -> str:
    """'' or why ``fix`` (or the global ``batch``) cannot run as one site's plan on each of
    ``cluster``'s sites (of one kind), checked before tracing: a pinned dp counts the replicas
    over every site, the other degrees are each site's."""
    k, site = len(cluster.groups), cluster.groups[0]
    n, dp = site.num_gpus, fix.get("dp")
    per_site = dict(fix)
    if dp is not None:
        fits = [k * d for d in divisors(n)]
        if dp % k or n % (dp // k):
            return (f"fix.dp: {dp} replicas over {k} sites of {n} GPUs: each site holds dp / {k}, "
                    f"which must divide its GPUs; use one of {', '.join(map(str, fits))}")
        per_site["dp"] = dp // k
    if batch % k:
        return (f"training.global_batch: {batch:,} samples do not split into {k} equal shares, "
                f"one per site; use a multiple of {k}")
    per = f" (dp counted per site: {dp // k})" if dp else ""
    return cluster_pin_problem(per_site, n, batch // k, whose="the {n} GPUs of each site" + per)


NOT_ONE_KIND = "the sites are not all of one kind and size (one site's plan runs on each)"


def cannot_run(why: str) -> SpecError:
    """The error for --across-sites replicas where they cannot run, saying ``why``."""
    return SpecError(f"across_sites: replicas cannot run here: {why}; leave --across-sites out "
                     "to plan a pipeline over the sites")


def whole_replicas(cfg, options: SearchOptions) -> bool:
    """Whether ``cfg`` on each site (searched with ``options``, sites_replicas'), as one plan over
    the sites with its ranks numbered site after site, puts whole replicas on each site: without
    a pipeline, or with the replicas outermost (tp-pp-dp, which the plan over the sites then
    takes: its data parallelism spans the sites) where the target and the pins place ranks so
    (sites_replicas then keeps each site to pp = 1 otherwise, so every row it prices is)."""
    return cfg.pp == 1 or (options.pp_inner and
                           options.fix.get("placement") == REPLICA_PLACEMENT)


def chosen(reps: list[Replicas], step_s: float, across: str, gpus: int) -> Replicas | None:
    """The replicas to emit in place of the pipeline over every site (``step_s``), on a cluster
    of ``gpus``: the fastest row that runs on every GPU (one kind of site) with whole replicas on
    each site (whole_replicas), where it is faster (alone.standing) and ``across`` is "auto", or
    wherever ``across`` is "replicas" (a SpecError naming why where none runs); None for
    "pipeline" or where none is faster."""
    if across == "pipeline":
        return None
    runs = [r for r in reps if r.result is not None and "step_time_s" in r.row]
    fits = [r for r in runs if r.row["gpus"] == gpus and whole_replicas(r.result.best.config,
                                                                        r.options)]
    best = min(fits, key=lambda r: r.row["step_time_s"], default=None)
    if across == "replicas" and best is None:
        why = (NOT_ONE_KIND if not any(r.row["gpus"] == gpus for r in reps) else
               next((r.row["reason"] for r in reps if "reason" in r.row), None) or
               "no site plan puts whole replicas on each site")
        raise cannot_run(why)
    if best is not None and (across == "replicas" or
                             alone.standing(best.row["step_time_s"], step_s) == "faster"):
        return best
    return None


def verdicts(rows: list[dict], step_s: float,
             alone_rows: list[dict] | None = None) -> list[tuple[str, str]]:
    """Per row (sites_replicas'): (faster, about, slower or unfit: against the plan's step over
    every site, ``step_s``: alone.standing; or chosen: the row is the plan; the sentence, which
    says where one site alone (``alone_rows``: alone.groups_alone's) is faster still)."""
    alone_best = min((a for a in alone_rows or [] if "step_time_s" in a),
                     key=lambda a: a["step_time_s"], default=None)
    out = []
    for r in rows:
        names = " and ".join([", ".join(r["sites"][:-1]), r["sites"][-1]])
        if "step_time_s" not in r:
            out.append(("unfit", f"data parallel across {names}: {r['reason']}"))
            continue
        k, t = len(r["sites"]), r["step_time_s"]
        kind = "chosen" if r.get("chosen") else alone.standing(t, step_s)
        how = {"faster": f"{step_s / t:.2f}x faster than this plan",
               "about": "about as fast as this plan", "chosen": "this plan",
               "slower": f"{t / step_s:.2f}x slower than this plan"}[kind]
        out.append((kind, f"data parallel across {names} ({r['gpus']} GPUs): {t:.4g} s a step "
                    f"({how}): {r['sites'][0]}'s plan ({r['parallel']}) on each "
                    f"site for {r['global_batch']:,} of the samples, {r['site_step_s']:.4g} s, "
                    f"then {r['gradient_bytes'] / 1e9:.3g} GB of gradients all-reduced across "
                    f"the {k} sites in {r['allreduce_s']:.4g} s"
                    + (f" ({r['buckets']} buckets, each paying the links' latency)"
                       if r.get("buckets", 1) > 1 else "")
                    + (f", {r['exposed_s']:.4g} s of it past the last micro-batch's backward"
                       if "exposed_s" in r else "")
                    + (f"; {alone_best['group']} alone is faster still "
                       f"({alone_best['step_time_s']:.4g} s)" if alone_best and
                       alone.standing(alone_best["step_time_s"], min(t, step_s)) == "faster"
                       else "")))
    return out


def how(rows: list[dict], gpus: int) -> str:
    """What a row of sites_replicas that was not emitted takes to run, said once under the rows
    (``gpus``: the cluster's)."""
    priced = ("the all-reduce across sites is priced in a ring over their links, beside the last "
              "micro-batch's backward")
    if not any(r["gpus"] == gpus for r in rows):
        return ("not planned: these sites are some of the cluster's, and data parallelism across "
                "sites of different kinds, or across some sites while the others idle, is not "
                f"planned; {priced}")
    return ("plan solve --across-sites replicas emits it: one site's plan on each site, its "
            "data-parallel degree times the number of sites, the gradients reduced inside each "
            "site and all-reduced across them (HSDP's replicate degree, Megatron-LM's "
            "--num-distributed-optimizer-instances), the ranks numbered site after site; "
            + priced)
