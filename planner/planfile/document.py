"""The Plan document: its sections, atomic save and load, and the rounding that keeps its bytes stable.

A plan file is a pure function of its inputs: keys in a fixed order, floats rounded to 6
significant digits, no timestamps (``search.time_s`` stays null unless timing is asked for), so the
same inputs give the same bytes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field, fields

from costmodels.engine import engine_from_mapping, read_setting
from costmodels.experts import overlap_blockers
from costmodels.memory import layer_policies
from planner.errors import SpecError
from planner.files import atomic_write, read_json_object
from planner.options import FIX_KEYS, SearchOptions, fix_text, parallel_text
from planner.planfile.schema import SCHEMA_ID, validate

SIGNIFICANT_DIGITS = 6
"""Floats in a plan file are rounded to this many significant digits."""


log = logging.getLogger(__name__)

PRICED_TRAINING = ("dtype", "optimizer", "seq_len", "global_batch")
"""The training settings a plan records as priced (``search.priced_training``)."""


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
    embeddings: dict | None = None
    """Recommendation models: each embedding table's sharding, and per-rank costs (absent
    otherwise)."""
    extra: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        order = ["schema", "model", "training", "cluster", "parallel", "stages", "tensor_parallel",
                 "schedule", "predicted", "search", "provenance"]
        d = {k: clean(getattr(self, k)) for k in order}
        if self.embeddings is not None:
            d["embeddings"] = clean(self.embeddings)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict, where: str = "plan") -> "Plan":
        validate(d, where)
        engine = d["training"].get("engine")
        if isinstance(engine, dict):  # as every reader compares them (names in lower case)
            # (a plan recorded before tp_grad_overlap existed, 2026-12-07, was priced with every
            # backward collective exposed: as tp_grad_overlap=false prices it)
            d = {**d, "training": {**d["training"], "engine": {
                "tp_grad_overlap": False, **{k: read_setting(k, v) for k, v in engine.items()}}}}
        names = {f.name for f in fields(cls)} - {"extra", "embeddings"}
        return cls(**{k: d[k] for k in names}, embeddings=d.get("embeddings"))

    def save(self, path: str) -> None:
        """Validate, then write atomically: a reader never sees half a file (``-``: stdout)."""
        d = self.to_dict()
        validate(d, path)
        atomic_write(path, json.dumps(d, indent=1) + "\n")

    @property
    def step_time_s(self) -> float:
        return self.predicted["step_time_s"]

    @property
    def per_image(self) -> bool:
        """Whether the plan counts one token per sample of an image input (model.image_input
        traced at seq_len 1: a convolutional network's image): its figures per token are per
        image."""
        return bool(self.model.get("image_input")) and int(self.training.get("seq_len", 0)) == 1

    @property
    def parallel_summary(self) -> str:
        return parallel_text(self.parallel, tables=bool(self.embeddings))

    def sharding_counts(self) -> dict[str, int]:
        """A recommendation plan's tables per TorchRec sharding type, most first (empty for a
        plan without tables)."""
        kinds: dict[str, int] = {}
        for t in (self.embeddings or {}).get("tables", []):
            kinds[t["sharding_type"]] = kinds.get(t["sharding_type"], 0) + 1
        return dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))

    def recomputed_blocks(self) -> list[str]:
        """Names of the blocks the plan recomputes (model.blocks[].recompute, all in older plans;
        under full/k every k-th of those: costmodels.memory.layer_policies)."""
        blocks = self.model["blocks"]
        policies = layer_policies([b.get("recompute", True) for b in blocks],
                                  self.parallel["recompute"])
        return [b["name"] for b, p in zip(blocks, policies) if p != "none"]

    def moe_overlap_blockers(self) -> list[str]:
        """Where the plan's engine asks for the overlapped expert all-to-all (moe_overlap), what
        its configuration lacks to run it, in the words "needs ..." (costmodels.experts.
        overlap_blockers): the plan priced its all-to-alls exposed then; [] where it priced the
        overlap or the engine does not ask for it."""
        engine, par = engine_from_mapping(self.training.get("engine")), self.parallel
        if not engine.moe_overlap:
            return []
        return overlap_blockers(engine, ep=par.get("ep", 1), recompute=par["recompute"],
                                dtype=self.training["dtype"], pp=par["pp"],
                                vpp=par.get("vpp", 1))

    def memory_reserve(self) -> dict:
        """The device memory the plan's search kept free (``memory_reserve_fraction`` and
        ``memory_reserve_bytes`` of SearchOptions) as its ``search.options`` record it, the
        defaults where they do not (a plan made with the defaults, or before 2026-12-06)."""
        kept = self.search.get("options", {}).get("memory_reserve", {})
        where = "search.options.memory_reserve"
        if not isinstance(kept, dict):
            raise SpecError(f"{where}: expected a mapping with fraction and bytes, got "
                            f"{kept!r:.60}; re-create the plan with `plan solve`")
        out = {"memory_reserve_fraction": kept.get("fraction",
                                                   SearchOptions.memory_reserve_fraction),
               "memory_reserve_bytes": kept.get("bytes", SearchOptions.memory_reserve_bytes)}
        try:
            SearchOptions(**out)  # its checks, named after the plan's field
        except SpecError as err:
            raise SpecError(f"{where}: {err}; re-create the plan with `plan solve`") from None
        return out

    def model_spec(self, override: str | None = None) -> str:
        """The MODEL to build for this plan: ``override`` (--model), else the one the plan was
        made from."""
        spec = override or self.model.get("spec")
        if not spec:
            raise SpecError("model.spec: the plan was made from a Python object and names no "
                            "MODEL; pass --model MODEL (a zoo name, config.json or "
                            "file.py:factory)")
        return spec

    def moved_model(self, err: SpecError, spec: str) -> SpecError:
        """``err`` (building ``spec``), saying how to point at the plan's own MODEL where its
        file is not found any more."""
        if spec != self.model.get("spec") or "not found" not in str(err):
            return err
        return SpecError(f"{err} (the plan names the model '{spec}'; pass --model PATH where it "
                         "lies now)")

    def training_edits(self) -> dict:
        """key -> (priced, now) for the training dtype, optimizer, sequence length and global
        batch where they differ from what the predictions were priced with
        (``search.priced_training``, recorded since 2026-12-06, the last two since 2026-12-07;
        {} for a plan without it): a hand edit (a new-user check's optimizer edit ran unnoticed,
        its dtype edit was blamed on the model file)."""
        priced = (self.search or {}).get("priced_training") or {}
        return {k: (priced[k], self.training.get(k)) for k in PRICED_TRAINING
                if k in priced and priced[k] != self.training.get(k)}

    def parallel_edits(self) -> dict:
        """knob -> (priced, now) for each knob of ``parallel`` that differs from the configuration
        its predictions were priced with (``search.priced``, recorded since 2026-12-06; {} for a
        plan without it): a hand edit the other checks let through (new-user checks edited ep,
        zero and recompute, and read the differences as the cost model's)."""
        priced = (self.search or {}).get("priced") or {}
        return {k: (priced[k], v) for k, v in self.parallel.items()
                if k in priced and priced[k] != v}

    def edits_note(self) -> str:
        """One line on the hand edits of ``parallel`` and ``training`` since planning (the
        predictions are the planned configuration's), with the re-plan that prices this one; ''
        for none."""
        edits = {**{f"parallel.{k}": v for k, v in self.parallel_edits().items()},
                 **{f"training.{k}": v for k, v in self.training_edits().items()}}
        if not edits:
            return ""
        pins = fix_text({k: v for k, v in self.parallel.items() if k in FIX_KEYS})
        flags = "".join(f" --{k.replace('_', '-')} {v}" for k, (_, v) in
                        self.training_edits().items())
        return ("edited after planning (" + ", ".join(
            f"{k} {old} -> {new}" for k, (old, new) in edits.items()) + "): the predictions, "
            "memory check included, are the planned configuration's; re-plan with plan solve "
            f"...{flags} --fix {pins} for a prediction of this one")

    def fingerprint_problem(self, spec: str, fingerprint: str) -> str:
        """'' when ``spec`` built with ``fingerprint`` is the planned model, else why not."""
        want = self.model["fingerprint"]
        if fingerprint == want:
            return ""
        edits = self.training_edits()
        if "dtype" in edits:  # (the model is rebuilt in the plan's dtype: not the model's fault)
            was, now = edits["dtype"]
            return (f"training.dtype: {now}, but the plan was traced and priced in {was} (edited "
                    f"after planning); re-plan with plan solve ... --dtype {now}")
        planned = self.model.get("spec") or self.model.get("name", "its MODEL")
        if planned == spec:  # (the same file: it changed, or the settings it is built with)
            return (f"model.fingerprint: '{spec}' builds another model now (fingerprint "
                    f"{fingerprint}) than the plan was made for ({want}): the file was edited, or "
                    "its architecture, size, dtype or frozen parameters differ; re-plan it with "
                    "`plan solve`")
        return (f"model.fingerprint: '{spec}' has fingerprint {fingerprint} but the plan was made "
                f"for {want} (another architecture, size or dtype, or other parameters frozen); "
                f"re-plan '{spec}' with `plan solve`, or pass the model the plan was made for "
                f"({planned}) with --model")


JOB_SEPARATOR = "#"
"""``SCHEDULE.json#JOB``: one job's plan inside a schedule ``plan jobs`` wrote."""


def load_plan(path: str) -> Plan:
    """Read and validate a plan file, or one job's plan in a schedule (``SCHEDULE.json#JOB``);
    warn where it was edited by hand after planning (Plan.edits_note)."""
    plan = read_plan(path)
    note = plan.edits_note()
    if note:
        log.warning("%s: %s", path, note)
    return plan


def read_plan(path: str) -> Plan:
    """load_plan without its warning (each process of a run, which its launcher warned for)."""
    hint = "give the path of a plan `plan solve` wrote (plan solve MODEL ... -o plan.json)"
    file, sep, job = str(path).rpartition(JOB_SEPARATOR)
    if sep and file and not os.path.exists(str(path)):
        doc = read_json_object(file, what="schedule file", missing_hint=hint)
        jobs = {j.get("name"): j for j in doc.get("jobs") or () if isinstance(j, dict)}
        if not str(doc.get("schema", "")).startswith("planner.jobs/"):
            raise SpecError(f"{path}: '{JOB_SEPARATOR}{job}' names a job of a schedule, and "
                            f"{file} is not one (plan jobs ... -o SCHEDULE.json writes them)")
        if job not in jobs:
            raise SpecError(f"{path}: no job '{job}' in the schedule; give one of "
                            f"{', '.join(map(str, jobs))}")
        if not isinstance(jobs[job].get("plan"), dict):
            raise SpecError(f"{path}: job '{job}' holds no plan in the schedule (edited?); "
                            "restore the schedule `plan jobs -o` wrote")
        return Plan.from_dict(jobs[job]["plan"], path)
    doc = read_json_object(path, what="plan file", missing_hint=hint)
    if str(doc.get("schema", "")).startswith("planner.jobs/"):
        names = ", ".join(str(j.get("name")) for j in doc.get("jobs") or () if isinstance(j, dict))
        raise SpecError(f"{path}: a schedule of jobs (plan jobs wrote it), not a plan; give one "
                        f"job's plan as {path}{JOB_SEPARATOR}JOB (jobs: {names})")
    return Plan.from_dict(doc, path)


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
