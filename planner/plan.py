"""The Plan: JSON schema ``planner.plan/v1``, validation, atomic save and load.

A plan file is a pure function of its inputs: keys in a fixed order, floats rounded to 6
significant digits, no timestamps (``search.time_s`` stays null unless timing is asked for), so the
same inputs give the same bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources

from planner.errors import SpecError
from planner.files import atomic_write, read_json_object

__all__ = ["Plan", "SCHEMA_ID", "atomic_write", "clean", "load_plan", "schema", "validate"]

SCHEMA_ID = "planner.plan/v1"
SIGNIFICANT_DIGITS = 6


@dataclass
class Plan:
    """A parallelization plan: what to run where, and what it is predicted to cost."""

    model: dict
    training: dict
    cluster: dict
    parallel: dict
    stages: list
    tensor_parallel: dict
    schedule: dict
    predicted: dict
    search: dict
    provenance: dict
    schema: str = SCHEMA_ID
    extra: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        order = ["schema", "model", "training", "cluster", "parallel", "stages", "tensor_parallel",
                 "schedule", "predicted", "search", "provenance"]
        return {k: clean(getattr(self, k)) for k in order}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict, where: str = "plan") -> "Plan":
        validate(d, where)
        names = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: d[k] for k in names})

    def save(self, path: str) -> None:
        """Validate, then write atomically: a reader never sees half a file."""
        d = self.to_dict()
        validate(d, path)
        atomic_write(path, json.dumps(d, indent=1) + "\n")

    @property
    def step_time_s(self) -> float:
        return self.predicted["step_time_s"]

    @property
    def parallel_summary(self) -> str:
        p = self.parallel
        sp = "+sp" if p["sequence_parallel"] else ""
        return (f"dp={p['dp']} tp={p['tp']}{sp} pp={p['pp']} mb={p['micro_batch']}x"
                f"{p['num_microbatches']} {p['schedule']} rc={p['recompute']} zero={p['zero']}")


def load_plan(path: str) -> Plan:
    """Read and validate a plan file."""
    return Plan.from_dict(read_json_object(path, what="plan"), path)


@lru_cache(maxsize=1)
def schema() -> dict:
    text = resources.files("planner").joinpath("schema/plan.v1.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(d: dict, where: str = "plan") -> None:
    """Raise SpecError naming the first failing key path."""
    import jsonschema

    if d.get("schema") != SCHEMA_ID:
        raise SpecError(f"{where}: schema is {d.get('schema')!r}, expected '{SCHEMA_ID}'; "
                        "re-create the plan with this planner version")
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(d), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        path = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise SpecError(f"{where}: invalid plan at {path}: {err.message[:200]}")
    _check_consistency(d, where)


def _check_consistency(d: dict, where: str) -> None:
    """Invariants the schema cannot express."""
    par = d["parallel"]
    if par["dp"] * par["tp"] * par["pp"] != d["cluster"]["num_gpus"]:
        raise SpecError(f"{where}: parallel dp*tp*pp = {par['dp'] * par['tp'] * par['pp']} but the "
                        f"cluster has {d['cluster']['num_gpus']} GPUs")
    if len(d["stages"]) != par["pp"] * par["vpp"]:
        raise SpecError(f"{where}: {len(d['stages'])} stages listed for pp={par['pp']} x "
                        f"vpp={par['vpp']}")
    listed = [b for st in d["stages"] for b in st["blocks"]]
    names = [b["name"] for b in d["model"]["blocks"]]
    if listed != names:
        raise SpecError(f"{where}: stages must list every block exactly once, in order")


def clean(obj):
    """numpy scalars -> Python numbers; floats rounded to SIGNIFICANT_DIGITS."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if hasattr(obj, "item") and not isinstance(obj, (int, float)):
        obj = obj.item()
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"non-finite number in plan: {obj}")
        if obj == 0:
            return 0.0
        return float(f"{obj:.{SIGNIFICANT_DIGITS}g}")
    return obj
