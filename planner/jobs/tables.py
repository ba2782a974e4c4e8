"""Per-job tables: for each job and candidate GPU count, the single-job planner's best plan.

Job time = step time x steps. Each distinct (model, seq_len) is traced once
(planner.api.prepare) and planned for every count on a resized cluster (planner.api.plan_prepared);
with several workers, distinct models are done in parallel processes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from costmodels.topology import Cluster, with_overrides
from planner.api import plan_prepared, prepare
from planner.errors import PlannerError, SpecError
from planner.logs import collected_warnings
from planner.jobs.spec import JobSpec, JobsSpec
from planner.options import SearchOptions, TrainingSpec
from planner.recsys_api import plan_rec_prepared, prepare_recsys, recsys_model
from planner.solve.job_schedule import candidate_counts

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TableRow:
    """The single-job planner's answer for one job on one GPU count."""

    gpus: int
    step_time_s: float
    job_time_s: float
    """step_time_s x steps."""
    peak_memory_bytes: float
    parallel: str
    """Short form of the plan's parallel degrees (and of a recommendation plan's table
    shardings)."""
    plan: dict | None = None
    """The plan (planner.plan/v1 dict); None where only the table row was kept."""


def _named(args: tuple) -> str:
    """A (model, seq_len, dtype, ...) group of jobs as the progress lines name it."""
    return (f"{args[0]} at {args[1]:,} tokens" if args[1] else str(args[0])) + \
        (f" in {args[2]}" if args[2] else "")


def build_tables(spec: JobsSpec, cluster: Cluster, *, workers: int = 1,
                 search: SearchOptions = SearchOptions(top_k=0)) -> dict[str, list[TableRow]]:
    """For every job the best plan per candidate GPU count (counts where nothing fits are absent).

    Each distinct (model, seq_len, dtype) is traced once; with ``workers`` > 1 distinct models are
    done in parallel processes. The result does not depend on ``workers``.
    """
    groups: dict[tuple, list[JobSpec]] = {}
    first: dict[tuple, int] = {}  # the jobs file's index of each group's first job
    for i, job in enumerate(spec.jobs):
        groups.setdefault(trace_key(job), []).append(job)
        first.setdefault(trace_key(job), i)
    counts = candidate_counts(cluster.nodes, cluster.gpus_per_node)
    args = [(*key, jobs, cluster, counts, search, f"jobs[{first[key]}]")
            for key, jobs in groups.items()]
    t0, results = time.perf_counter(), {}
    if workers > 1 and len(args) > 1:
        # fork: the children start with torch imported (spawn re-imports it, about 5 s each);
        # safe while the parent has run no torch kernels (the CLI has not; tracing runs in the
        # children, on the meta device)
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(args)), mp_context=ctx) as pool:
            futures = {pool.submit(model_tables, *a): a for a in args}
            for k, fut in enumerate(as_completed(futures), 1):
                results.update(fut.result())
                log.info("tables: %s done [%d/%d] %.1f s", _named(futures[fut]), k, len(args),
                         time.perf_counter() - t0)
    else:
        for k, a in enumerate(args, 1):
            results.update(model_tables(*a))
            log.info("tables: %s done [%d/%d] %.1f s", _named(a), k, len(args),
                     time.perf_counter() - t0)
    return {job.name: results[job.name] for job in spec.jobs}


def trace_key(job: JobSpec) -> tuple:
    """(model, seq_len, dtype): the jobs one trace serves."""
    return job.model, job.seq_len, job.dtype


def model_tables(model: str, seq_len: int | None, dtype: str | None, jobs: list[JobSpec],
                 cluster: Cluster, counts: list[int], search: SearchOptions,
                 where: str = "jobs") -> dict[str, list[TableRow]]:
    """Trace ``model`` once, in ``dtype`` (None: bf16), then plan each job on each GPU count (a
    recommendation model: its tables measured once, then sharded for each count its global batch
    divides over, its dense part in fp32 with Adam, as plan solve plans it by default). A model
    that cannot be built or traced is a SpecError naming ``where`` (the first of the jobs in the
    jobs file)."""
    dtype = dtype or "bf16"
    try:
        rec = recsys_model(model)
        with warnings_named(f"job{'s' if len(jobs) > 1 else ''} "
                            f"{', '.join(j.name for j in jobs)}"):
            prepared = prepare_recsys(model) if rec else prepare(model, seq_len=seq_len,
                                                                 dtype=dtype)
    except SpecError as exc:  # "seq_len: ..." -> "jobs[2].seq_len: ...", in the file's words
        raise SpecError(f"{where}.{str(exc).replace('--seq-len ', 'seq_len: ')}") from None
    out = {}
    for job in jobs:
        training = TrainingSpec(global_batch=job.global_batch, seq_len=prepared.seq_len,
                                dtype=dtype) \
            if not rec else TrainingSpec(global_batch=job.global_batch, seq_len=1, dtype="fp32")
        rows, why, said = [], "", {}
        for g in counts:
            sized = resized(cluster, g)
            try:
                if rec and job.global_batch % g:
                    raise SpecError(f"global batch {job.global_batch} does not divide over {g} "
                                    "GPUs")
                with collected_warnings() as said[g]:
                    p = (plan_rec_prepared(prepared, sized, training) if rec else
                         plan_prepared(prepared, sized, training, search))
            except PlannerError as exc:
                log.debug("%s on %d GPUs: %s", job.name, g, exc)
                why = f"on {g} GPUs: {str(exc).splitlines()[0]}"
                continue
            tables = ", ".join(f"{k} {n}" for k, n in p.sharding_counts().items())
            rows.append(TableRow(gpus=g, step_time_s=p.step_time_s,
                                 job_time_s=p.step_time_s * job.steps,
                                 peak_memory_bytes=p.predicted["peak_memory_bytes"],
                                 parallel=p.parallel_summary + (f"; tables {tables}" if tables
                                                                else ""), plan=p.to_dict()))
        if not rows:  # say why on the most GPUs the job could have had
            log.warning("job %s fits on no GPU count of %s (%s)", job.name, cluster.name,
                        why or "no counts")
        _say_once(job.name, said)
        out[job.name] = rows
    return out


def _say_once(job: str, said: dict[int, list[str]]) -> None:
    """The warnings planning ``job`` gave on each GPU count (``said``), one per field they name
    (a batch that does not split over dp on 8, 16 and 32 GPUs is one warning): the most GPUs'
    words, and the other counts that gave it."""
    by_field: dict[str, list[tuple[int, str]]] = {}
    for g, texts in said.items():
        for text in dict.fromkeys(texts):
            by_field.setdefault(text.partition(":")[0], []).append((g, text))
    for seen in by_field.values():
        g, text = max(seen)
        others = sorted(c for c, _ in seen if c != g)
        log.warning("job %s on %d GPUs: %s%s", job, g, text,
                    f" (and alike on {', '.join(map(str, others))} GPUs)" if others else "")


_WHO: contextvars.ContextVar[str | None] = contextvars.ContextVar("planner_jobs_who",
                                                                  default=None)
"""Whose planning is under way in this thread or task (warnings_named)."""


@contextlib.contextmanager
def warnings_named(who: str):
    """Warnings the planner and its cost models log inside (about a model's inputs or a plan)
    begin with ``who``: among many jobs and GPU counts, a bare warning would not say whose it is.
    Per thread and task (a context variable) and nestable; the record factory that reads it is
    installed once."""
    _install_factory()
    token = _WHO.set(who)
    try:
        yield
    finally:
        _WHO.reset(token)


@functools.cache
def _install_factory() -> None:
    make = logging.getLogRecordFactory()

    def named(*args, **kwargs):
        record = make(*args, **kwargs)
        who = _WHO.get()
        if who and record.levelno >= logging.WARNING and isinstance(record.msg, str) and \
                record.name.startswith(("planner", "costmodels")):
            # (formatted later, as logging does: a %-sign in the name is not an argument)
            record.msg = (who.replace("%", "%%") if record.args else who) + ": " + record.msg
        return record

    logging.setLogRecordFactory(named)


def resized(cluster: Cluster, gpus: int) -> Cluster:
    """The cluster as one job of ``gpus`` GPUs sees it: part of one node, or whole nodes."""
    if gpus < cluster.gpus_per_node:
        return with_overrides(cluster, nodes=1, gpus_per_node=gpus)
    return with_overrides(cluster, nodes=gpus // cluster.gpus_per_node)
