"""The jobs file: its frozen dataclasses (JobSpec, JobsSpec) and its strict reader.

    spec = load_jobs("examples/jobs.yaml")      # or jobs_from_mapping(parsed_yaml, base_dir=...)

Unknown or missing keys and values of the wrong type raise SpecError naming the key path
(``jobs[2].steps``); relative model paths are taken from the jobs file's folder.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, fields
from typing import Mapping

from costmodels.errors import suggest
from planner.errors import SpecError
from planner.files import read_yaml
from planner.options import DTYPES
from planner.planfile.document import JOB_SEPARATOR


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One training job of the jobs file."""

    name: str
    """Unique name."""
    model: str
    """MODEL: zoo name, config.json path or file.py:factory (paths relative to the jobs file)."""
    global_batch: int
    """Samples per optimizer step."""
    steps: int
    """Optimizer steps the job runs."""
    seq_len: int | None = None
    """Tokens per sample; None: the model's default length (as plan solve takes it). A
    recommendation model's samples are not token sequences: it takes none."""
    dtype: str | None = None
    """Compute dtype (DTYPES: bf16, fp16, fp32, fp8); None: bf16, as plan solve takes it (a
    recommendation model: fp32, its only one)."""
    priority: int = 1
    """Weight of its completion time in the weighted objective (integer >= 1)."""
    deadline_s: float | None = None
    """Must end within this many seconds of the schedule's start; none by default."""


@dataclass(frozen=True, kw_only=True)
class JobsSpec:
    """The jobs file: the jobs, and optionally the cluster they share."""

    jobs: tuple[JobSpec, ...]
    """At least one job."""
    cluster: str | Mapping | None = None
    """Preset name, cluster YAML path or mapping; the command line's --cluster overrides it."""
    nodes: int | None = None
    """Resize the cluster to this many nodes; --nodes overrides it."""


def load_jobs(path: str) -> JobsSpec:
    """Read a jobs YAML file strictly; relative model and cluster paths are taken from the
    file's folder."""
    data = read_yaml(path, what="jobs")
    return jobs_from_mapping(data, base_dir=os.path.dirname(path))


def jobs_from_mapping(data, *, base_dir: str = "") -> JobsSpec:
    """A parsed jobs file -> JobsSpec; unknown or missing keys raise SpecError naming the path."""
    top = checked_fields(data, JobsSpec, "")
    jobs = top.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise SpecError("jobs: expected a non-empty list of jobs (name, model, global_batch, "
                        "steps[, seq_len])")
    specs = []
    for i, item in enumerate(jobs):
        kw = checked_fields(item, JobSpec, f"jobs[{i}]")
        if kw.get("dtype") is not None and kw["dtype"] not in DTYPES:
            raise SpecError(f"jobs[{i}].dtype: expected one of {', '.join(DTYPES)}, got "
                            f"{kw['dtype']!r}")
        kw["model"] = _model_path(kw["model"], base_dir)
        specs.append(JobSpec(**kw))
    names = [s.name for s in specs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(f"jobs[{i}].name: '{name}' is used twice; job names must be unique")
        if JOB_SEPARATOR in name:  # (SCHEDULE.json#JOB names a job's plan: load_plan)
            raise SpecError(f"jobs[{i}].name: '{name}' holds '{JOB_SEPARATOR}', which separates "
                            f"a schedule file from a job's name (SCHEDULE.json{JOB_SEPARATOR}JOB) "
                            "in plan show, diff and export; name it without")
    cluster = top.get("cluster")
    if isinstance(cluster, str) and cluster.endswith((".yaml", ".yml")):
        cluster = _model_path(cluster, base_dir)  # a cluster file beside the jobs file, too
    return JobsSpec(jobs=tuple(specs), cluster=cluster, nodes=top.get("nodes"))


_CHECKS = {
    "name": (str, "a name"), "model": (str, "a MODEL (zoo name, config.json, file.py:factory)"),
    "global_batch": (int, "a positive integer"), "seq_len": (int, "a positive integer"),
    "dtype": (str, f"one of {', '.join(DTYPES)}"),
    "steps": (int, "a positive integer"), "priority": (int, "a positive integer"),
    "deadline_s": ((int, float), "seconds > 0"), "nodes": (int, "a positive integer"),
    "cluster": ((str, dict), "a preset name, a YAML path or a cluster mapping"),
    "jobs": (list, "a list of jobs"),
}

_EXAMPLES = {"name": "name: 7b-lr1", "model": "model: gpt-1.7b", "global_batch": "global_batch: 8",
             "seq_len": "seq_len: 2048", "steps": "steps: 20000", "jobs": "jobs: [{name: ..., "
             "model: ..., global_batch: 8, seq_len: 2048, steps: 1000}]"}


def checked_fields(data, cls, where: str) -> dict:
    """The fields of ``cls`` from ``data``, type-checked; ``where`` is the key path so far."""
    names = [f.name for f in fields(cls)]
    if not isinstance(data, dict):
        raise SpecError(f"{where or 'jobs file'}: expected a mapping with keys {', '.join(names)}")
    for key in data:
        if key not in names:
            raise SpecError(f"{_key(where, key)}: unknown key{suggest(key, names)}")
    out = {}
    for f in fields(cls):
        if data.get(f.name) is None:
            if f.default is MISSING:
                raise SpecError(f"{_key(where, f.name)}: missing; give {_CHECKS[f.name][1]}, "
                                f"e.g. {_EXAMPLES[f.name]}")
            continue
        value, (kind, words) = data[f.name], _CHECKS[f.name]
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if ok and isinstance(value, (int, float)):
            ok = value > 0
        if ok and isinstance(value, str):
            ok = bool(value.strip())
        if not ok:
            raise SpecError(f"{_key(where, f.name)}: expected {words}, got {value!r}")
        out[f.name] = value
    return out


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _model_path(model: str, base_dir: str) -> str:
    """Resolve a relative config.json / file.py (or cluster YAML) path against the jobs file's
    folder, where it is there."""
    path, sep, factory = model.partition(":") if ".py:" in model else (model, "", "")
    if base_dir and not os.path.isabs(path) and os.path.exists(os.path.join(base_dir, path)):
        return os.path.normpath(os.path.join(base_dir, path)) + sep + factory
    return model
