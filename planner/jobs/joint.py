"""Many jobs, one cluster: the joint schedule, its baselines and the schedule document.

    spec = load_jobs("examples/jobs.yaml")                     # planner.jobs.spec
    result = plan_jobs(spec, cluster="dgx-a100-80g", nodes=4)  # result.doc: planner.jobs/v1
    write_schedule("schedule.json", result.doc)
    again = replan(result.doc, done=["job3"], now_s=3600.0)    # finished and running jobs fixed

The per-job tables (planner.jobs.tables) give each job's time on each GPU count; the joint
schedule is the CP-SAT model of planner.solve.job_schedule; two baselines use the same tables:
every job on the whole cluster one after another, and an equal split of the GPUs (a queue), in
file order, or under the weighted objective highest priority per hour first.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields

from costmodels.topology import Cluster
from planner.errors import InfeasibleError, SpecError
from planner.files import atomic_write, read_json_object
from planner.inputs.clusters import load_cluster
from planner.inputs.zoo import RECSYS, ZOO, unknown_model
from planner.jobs.spec import JobSpec, JobsSpec, checked_fields
from planner.jobs.tables import TableRow, build_tables, model_tables, trace_key
from planner.options import ScheduleOptions, SearchOptions
from planner.recsys_api import recsys_model
from planner.planfile.document import clean
from planner.solve.job_grid import JobRequest, Placement
from planner.solve.job_queue import list_schedule
from planner.solve.job_schedule import JobSchedule, solve_jobs

log = logging.getLogger(__name__)

SCHEMA_ID = "planner.jobs/v1"


# Baselines -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
    """A reference schedule on the same tables, and how it was made (one line)."""

    description: str
    placements: list[Placement]


def baselines(requests: list[JobRequest], nodes: int, gpus_per_node: int, *,
              now_s: float = 0.0, objective: str = "makespan") -> dict[str, Baseline]:
    """The two reference schedules on the same tables (running jobs stay pinned).

    sequential: each job on the whole cluster (or its largest count that fits, still holding the
    whole cluster), one after another. equal_split: each job on N/J GPUs (the largest count of its
    table not above that, else its smallest), queued, never starting before the job ahead. The
    queue is the file's order, or for the weighted objective the highest priority per hour of its
    duration first (Smith's rule, the best order of one queue for that objective): a queue in
    file order would flatter the joint schedule.
    """
    whole = nodes * gpus_per_node
    share = whole / max(1, sum(1 for r in requests if r.pinned is None))
    seq, seq_counts, equal_counts = [], [], []
    for r in requests:
        if r.pinned is not None:
            seq.append(r)
            seq_counts.append(r.pinned.gpus)
            equal_counts.append(r.pinned.gpus)
            continue
        seq.append(JobRequest(name=r.name, durations_s={whole: r.durations_s[max(r.durations_s)]},
                              priority=r.priority))
        seq_counts.append(whole)
        fits = [g for g in r.durations_s if g <= share]
        equal_counts.append(max(fits) if fits else min(r.durations_s))
    weighted = objective == "weighted"
    queue = ", highest priority per hour first" if weighted else ""

    def order(jobs, counts):
        if not weighted:
            return None
        return sorted(range(len(jobs)), key=lambda j: (
            -jobs[j].priority / max(jobs[j].durations_s[counts[j]], 1e-9), j))

    return {"sequential": Baseline(
                f"every job on the whole cluster, one after another{queue}",
                list_schedule(seq, seq_counts, nodes, gpus_per_node, now_s=now_s,
                              order=order(seq, seq_counts))),
            "equal_split": Baseline(
                f"equal split of the GPUs ({share:.3g} per job), "
                + ("queued highest priority per hour first" if weighted else "FIFO queue"),
                list_schedule(requests, equal_counts, nodes, gpus_per_node, now_s=now_s,
                              order=order(requests, equal_counts)))}


# The schedule ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobsResult:
    """The schedule document, and what is kept out of it so its bytes stay the same run to run."""

    doc: dict
    """planner.jobs/v1: cluster, solve account, makespan, baselines, jobs with plans."""
    solve_time_s: float
    """Seconds CP-SAT took."""


def plan_jobs(spec: JobsSpec, *, cluster=None, nodes: int | None = None,
              options: ScheduleOptions = ScheduleOptions(), workers: int = 1,
              record_timing: bool = False) -> JobsResult:
    """Tables, joint schedule and baselines -> the ``planner.jobs/v1`` document."""
    if cluster is None and spec.cluster is None:
        raise SpecError("cluster: not given; pass --cluster or add 'cluster:' to the jobs file")
    _check_models(spec)
    given = cluster if cluster is not None else spec.cluster
    homogeneous(load_cluster(given))  # before resizing it: a cluster with groups has no nodes
    cl = load_cluster(given, nodes=nodes if nodes is not None else spec.nodes)
    for i, job in enumerate(spec.jobs):  # a dtype the GPU lacks: before any trace
        try:  # (a recommendation model runs fp32: bf16 is not asked of it)
            cl.device.peak(job.dtype or ("fp32" if recsys_model(job.model) else "bf16"))
        except SpecError as exc:
            raise SpecError(f"jobs[{i}].{str(exc).replace('choose --dtype', 'give a dtype')}") \
                from None
    log.info("%d job%s on %s (%d node%s x %d GPUs)", len(spec.jobs),
             "" if len(spec.jobs) == 1 else "s", cl.name, cl.nodes,
             "" if cl.nodes == 1 else "s", cl.gpus_per_node)
    tables = build_tables(spec, cl, workers=workers)
    requests = [JobRequest(name=j.name, durations_s={r.gpus: r.job_time_s for r in tables[j.name]},
                           priority=j.priority, deadline_s=j.deadline_s) for j in spec.jobs]
    result = solve_jobs(requests, cl.nodes, cl.gpus_per_node, options)
    base = baselines(requests, cl.nodes, cl.gpus_per_node, objective=options.objective)
    plans = [_row(tables[j.name], p.gpus).plan for j, p in zip(spec.jobs, result.placements)]
    doc = document(cl, list(spec.jobs), tables, result, base, plans, now_s=0.0, done=[],
                   record_timing=record_timing)
    return JobsResult(doc=doc, solve_time_s=result.time_s)


def _check_models(spec: JobsSpec) -> None:
    """SpecError naming the job whose model cannot be found, before any job is planned: an
    unknown zoo name, or a config.json or file.py that is not there; or a sequence length for
    a recommendation model of the zoo (its samples are not token sequences)."""
    for i, job in enumerate(spec.jobs):
        model = job.model
        if model.lower() in RECSYS:
            if job.seq_len is not None:
                raise SpecError(f"jobs[{i}].seq_len: {model} is a recommendation model, whose "
                                "samples are not token sequences; leave seq_len out")
            if job.dtype not in (None, "fp32"):
                raise SpecError(f"jobs[{i}].dtype: {model} is a recommendation model, planned "
                                "in fp32 (TorchRec's tables); leave dtype out")
            continue
        path = model.partition(":")[0] if ".py:" in model else model
        if ".py:" in model or model.endswith(".json"):
            if not os.path.exists(path):
                raise SpecError(f"jobs[{i}].model: file '{path}' not found (relative paths are "
                                "taken from the jobs file's folder)")
        elif model.lower() not in ZOO and not os.path.isdir(model) and ":" not in model:
            raise SpecError(f"jobs[{i}].model: {unknown_model(model)}")


def homogeneous(cluster) -> Cluster:
    """``cluster``, or SpecError when it has node groups or sites: jobs share whole nodes of one
    kind (docs/jobs.md, Limits)."""
    if not isinstance(cluster, Cluster):
        raise SpecError(f"cluster: {cluster.name} has node groups or sites, and plan jobs "
                        "schedules jobs on whole nodes of one kind; give a cluster of one node "
                        "type (a preset, or a YAML file without groups and sites)")
    return cluster


def replan(doc: dict, *, done: list[str], now_s: float,
           options: ScheduleOptions = ScheduleOptions(), record_timing: bool = False) -> JobsResult:
    """Re-solve from time ``now_s``: ``done`` jobs (and those predicted to have ended) leave,
    running jobs keep their GPUs and end time, the others start at ``now_s`` or later."""
    if doc.get("schema") != SCHEMA_ID:
        raise SpecError(f"replan: schema is {doc.get('schema')!r}, expected '{SCHEMA_ID}'; give "
                        "a schedule written by `plan jobs -o`")
    if not now_s >= doc.get("now_s", 0.0):
        raise SpecError(f"now: {now_s:g} s is before the schedule's own time "
                        f"{doc.get('now_s', 0.0):g} s; give --now in seconds from its start")
    records = {rec["name"]: rec for rec in doc["jobs"]}
    for name in done:
        if name not in records:
            raise SpecError(f"done: no job '{name}' in the schedule; jobs are {', '.join(records)}")
        if records[name]["start_s"] > now_s:
            raise SpecError(f"done: job '{name}' starts at {records[name]['start_s']:g} s, after "
                            f"--now {now_s:g}; check --now")
    ended = [n for n, rec in records.items() if n not in done and rec["end_s"] <= now_s]
    if ended:
        log.info("taken as done (predicted to end by --now): %s", ", ".join(ended))
    keep = [rec for rec in doc["jobs"] if rec["name"] not in done and rec["name"] not in ended]
    if not keep:
        raise SpecError(f"replan: every job has ended by --now {now_s:g} s; nothing to schedule")
    cl = load_cluster(doc["cluster"]["spec"])
    # (a schedule written before a job took a dtype has none: bf16)
    jobs = [JobSpec(**{f.name: rec[f.name] for f in fields(JobSpec) if f.name in rec})
            for rec in keep]
    tables = {rec["name"]: [TableRow(**row) for row in rec["table"]] for rec in keep}
    requests = [_request(rec, now_s) for rec in keep]
    result = solve_jobs(requests, cl.nodes, cl.gpus_per_node, options, now_s=now_s)
    base = baselines(requests, cl.nodes, cl.gpus_per_node, now_s=now_s,
                     objective=options.objective)
    plans = _plans_for(keep, jobs, result.placements, cl)
    new = document(cl, jobs, tables, result, base, plans, now_s=now_s,
                   done=list(doc.get("done", [])) + list(done) + ended, record_timing=record_timing)
    return JobsResult(doc=new, solve_time_s=result.time_s)


def _request(rec: dict, now_s: float) -> JobRequest:
    table = {row["gpus"]: row["job_time_s"] for row in rec["table"]}
    if rec["start_s"] >= now_s:
        return JobRequest(name=rec["name"], durations_s=table, priority=rec["priority"],
                          deadline_s=rec["deadline_s"])
    pin = Placement(name=rec["name"], gpus=rec["gpus"], nodes=tuple(rec["nodes"]),
                    gpu_ids=tuple(rec["gpu_ids"]), start_s=rec["start_s"], end_s=rec["end_s"])
    return JobRequest(name=rec["name"], durations_s=table, priority=rec["priority"], pinned=pin)


def _plans_for(records, jobs, placements, cluster) -> list[dict | None]:
    """Reuse each job's plan where its GPU count is unchanged; plan the others (one trace each)."""
    plans = [rec["plan"] if rec["gpus"] == p.gpus else None for rec, p in zip(records, placements)]
    todo: dict[tuple, list[int]] = {}
    for i, (job, plan) in enumerate(zip(jobs, plans)):
        if plan is None:
            todo.setdefault(trace_key(job), []).append(i)
    for key, idx in todo.items():
        counts = sorted({placements[i].gpus for i in idx})
        log.info("re-planning %s for %s GPUs", key[0], ", ".join(map(str, counts)))
        rows = model_tables(*key, [jobs[i] for i in idx], cluster, counts,
                            SearchOptions(top_k=0))
        for i in idx:
            row = _row(rows[jobs[i].name], placements[i].gpus)
            if row is None:
                raise InfeasibleError(f"job {jobs[i].name}: the planner no longer finds a plan on "
                                      f"{placements[i].gpus} GPUs; run `plan jobs` afresh",
                                      reason="no plan")
            plans[i] = row.plan
    return plans


def _row(rows: list[TableRow], gpus: int) -> TableRow | None:
    return next((r for r in rows if r.gpus == gpus), None)


def document(cluster: Cluster, jobs: list[JobSpec], tables: dict, result: JobSchedule,
             base: dict, plans: list, *, now_s: float, done: list[str],
             record_timing: bool = False) -> dict:
    """The schedule as plain data: same inputs, same bytes (solve time only if asked for)."""
    records = []
    for job, p, plan in zip(jobs, result.placements, plans):
        rec = asdict(job)
        rec.update(_placed(p), state="running" if p.start_s < now_s else "scheduled",
                   parallel=_row(tables[job.name], p.gpus).parallel)
        rec["table"] = [{k: v for k, v in asdict(row).items() if k != "plan"}
                        for row in tables[job.name]]
        rec["plan"] = plan
        records.append(rec)
    return clean({
        "schema": SCHEMA_ID,
        "cluster": {**cluster.summary(), "spec": cluster.to_mapping()},
        "now_s": now_s, "done": done, "objective": result.objective,
        "solve": {"status": result.status, "objective": result.objective_value,
                  "bound": result.bound, "gap": result.gap, "tie_break": result.tie_break,
                  "time_unit_s": result.time_unit_s,
                  "time_s": result.time_s if record_timing else None},
        "makespan_s": result.makespan_s,
        "baselines": {name: _baseline(b, result.makespan_s, jobs) for name, b in base.items()},
        "jobs": records,
    })


def _placed(p: Placement) -> dict:
    return {"gpus": p.gpus, "nodes": list(p.nodes), "gpu_ids": list(p.gpu_ids),
            "start_s": p.start_s, "end_s": p.end_s}


def _baseline(b: Baseline, joint_s: float, jobs: list[JobSpec]) -> dict:
    """A baseline as plain data, with the jobs it ends after their deadlines (``late``)."""
    makespan = max((p.end_s for p in b.placements), default=0.0)
    deadline = {j.name: j.deadline_s for j in jobs}
    late = [p.name for p in b.placements
            if deadline.get(p.name) is not None and p.end_s > deadline[p.name] + 1e-6]
    return {"description": b.description, "makespan_s": makespan,
            "improvement": (makespan - joint_s) / makespan if makespan > 0 else 0.0,
            **({"late": late} if late else {}),
            "jobs": [{"name": p.name, **_placed(p)} for p in b.placements]}


def write_schedule(path: str, doc: dict) -> None:
    atomic_write(path, json.dumps(doc, indent=1) + "\n")


def load_schedule(path: str) -> dict:
    doc = read_json_object(path, what="replan")
    if doc.get("schema") != SCHEMA_ID:
        raise SpecError(f"replan: '{path}' is not a {SCHEMA_ID} schedule; write one with "
                        "`plan jobs -o`")
    problem = schedule_problem(doc)
    if problem:  # (a new-user check's hand edits came back as internal errors, exit 1)
        raise SpecError(f"replan: {problem}; restore the schedule `plan jobs -o` wrote")
    return doc


def schedule_problem(doc: dict) -> str:
    """'' or the first thing a schedule file holds that `plan jobs --replan` cannot read back: the
    cluster, each job's settings (as a jobs file takes them), its placement (GPU count, GPU ids
    of the cluster, none twice, start before end) and its table of times per GPU count."""
    cluster = doc.get("cluster")
    if not isinstance(cluster, dict) or not isinstance(cluster.get("spec"), (dict, str)):
        return "cluster: missing or not a mapping with its spec"
    try:
        total = load_cluster(cluster["spec"]).num_gpus
    except SpecError as exc:
        return f"cluster.spec: {exc}"
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs or not all(isinstance(j, dict) for j in jobs):
        return "jobs: expected a non-empty list of jobs"
    number = (int, float)
    for i, rec in enumerate(jobs):
        try:
            checked_fields({f.name: rec.get(f.name) for f in fields(JobSpec)}, JobSpec,
                           f"jobs[{i}]")
        except SpecError as exc:
            return str(exc)
        at = f"jobs[{i}]"
        for key, kind, words in (("gpus", int, "a positive integer"),
                                 ("start_s", number, "seconds"), ("end_s", number, "seconds"),
                                 ("gpu_ids", list, "a list of GPU ids"),
                                 ("nodes", list, "a list of node ids"),
                                 ("table", list, "a list of {gpus, job_time_s}"),
                                 ("plan", dict, "the job's plan")):
            value = rec.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or \
                    (key == "gpus" and value < 1):
                return f"{at}.{key}: expected {words}, got {value!r}"
        if not rec["start_s"] <= rec["end_s"]:
            return f"{at}: start_s {rec['start_s']:g} is after end_s {rec['end_s']:g}"
        ids = rec["gpu_ids"]
        if len(ids) != rec["gpus"] or len(set(map(str, ids))) != len(ids) or not all(
                isinstance(g, int) and 0 <= g < total for g in ids):
            return (f"{at}.gpu_ids: expected {rec['gpus']} distinct ids of the cluster's "
                    f"{total} GPUs, got {ids!r}")
        for j, row in enumerate(rec["table"]):
            if not isinstance(row, dict) or not isinstance(row.get("gpus"), int) or \
                    not isinstance(row.get("job_time_s"), number) or row["job_time_s"] <= 0:
                return f"{at}.table[{j}]: expected {{gpus, job_time_s}}, got {row!r}"
    return ""
