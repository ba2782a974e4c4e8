"""Recommendation models (embedding tables: README.md, "Recommendation models"): told apart from
dense ones (``recsys_model``), measured once (``prepare_recsys``: the tables with their statistics,
the dense part traced apart from them) and planned (``plan_recsys``, ``plan_rec_prepared``: the
tables sharded by CP-SAT beside the dense part's data parallelism). planner.api.plan hands such a
model here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass

from costmodels.embeddings import SHARDING_TYPES
from costmodels.topology import HeteroCluster
from planner.emit import emit_tables
from planner.errors import SpecError
from planner.files import fspath_or_same
from planner.trace.cache import local_sources
from planner.inputs.calibration import apply_calibration
from planner.inputs.clusters import load_cluster
from planner.inputs.modules import import_from_working_folder
from planner.inputs.zoo import RECSYS
from planner.options import TrainingSpec, engine_spec
from planner.planfile.document import Plan
from planner import traced
from planner.traced import Prepared, spec_of

log = logging.getLogger("planner.api")  # the API's lines, which a sweep holds back together


def recsys_model(model) -> bool:
    """A recommendation model: a zoo name from RECSYS, or a module (or factory's module) holding
    embedding tables that the dense search does not handle."""
    if isinstance(model, str):
        if model.lower() in RECSYS:
            return True
        if ":" not in model or model.endswith(".json") or not _mentions_tables(model):
            return False
    from planner.trace import recsys  # lazy: loads torch (seconds)
    from planner.trace.models import call_factory, load_factory  # lazy: as above

    if isinstance(model, str):
        model = _factory_module(call_factory(load_factory(model), model, meta=False), model)
    return recsys.is_recsys(model) and recsys.has_table_collections(model)


TABLE_WORDS = ("EmbeddingBag", "EmbeddingCollection", "torchrec", "RecNet")
"""Words in a factory's source without which it builds no recommendation model (so that a dense
model's factory is not called twice); RecNet: the planner's own (planner.trace.recsys)."""


def _mentions_tables(spec: str) -> bool:
    target = spec.rpartition(":")[0]
    path = target
    if not target.endswith(".py"):
        import importlib.util  # lazy: only package.module:factory specs need it

        import_from_working_folder()
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            return False
        path = getattr(found, "origin", None) or ""
    # the file and what it imports from its own folder (a factory importing its model from a
    # file beside it: a review saw such a model planned as dense)
    for source in local_sources(path) if path else ():
        try:
            with open(source, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if any(w in text for w in TABLE_WORDS):
            return True
    return False


def _factory_module(out, spec: str):
    """The module in what a ``file.py:factory`` returned, ``out`` (alone or first of ``(model,
    example_inputs)``)."""
    module = out[0] if isinstance(out, (tuple, list)) and out else out
    if not hasattr(module, "named_modules"):
        raise SpecError(f"model: {spec} must return (nn.Module, example_inputs), got "
                        f"{type(out).__name__}")
    return module


def plan_recsys(model, *, cluster, nodes=None, gpus_per_node=None, global_batch: int,
                dtype: str = "fp32", optimizer: str = "adam", fix=None,
                time_limit_s: float | None = None, calibration=None, engine=None,
                record_timing: bool = False, tables=None, table_optimizer: str | None = None,
                pipeline: str = "sparse-dist") -> Plan:
    """Shard a recommendation model's embedding tables (CP-SAT) with its dense part
    data-parallel; see README.md, "Recommendation models"."""
    _check_dtype(dtype)
    cl = load_cluster(cluster, nodes=nodes, gpus_per_node=gpus_per_node)
    if isinstance(cl, HeteroCluster):
        raise SpecError(f"cluster: {len(cl.groups)} node groups (sites or device types), but "
                        "recommendation models are planned on one group of one device type; "
                        "give a cluster file without groups or sites")
    if calibration is not None:
        cl = apply_calibration(cl, calibration)
    cl.device.peak(dtype)
    training = TrainingSpec(global_batch=global_batch, seq_len=1, dtype=dtype,
                            optimizer=optimizer, engine=engine_spec(engine))
    sharding, zero, pins = _rec_fix(fix)
    if global_batch % cl.num_gpus:
        raise SpecError(f"global_batch: {global_batch} does not divide over {cl.num_gpus} GPUs; "
                        f"give a multiple of {cl.num_gpus}")
    prepared = prepare_recsys(model, tables, dtype=dtype)
    return plan_rec_prepared(prepared, cl, training, sharding=sharding, zero=zero, table_pins=pins,
                             table_optimizer=table_optimizer, pipeline=pipeline,
                             time_limit_s=time_limit_s, record_timing=record_timing)


def _check_dtype(dtype: str) -> None:
    """Refuse fp8 for a recommendation model: no part of it is priced in FP8 (its tables keep
    their element size, its dense part its 16- or 32-bit GEMMs), and ``plan run`` runs fp32 only
    (a new-user check got an fp8 plan priced as bf16, then refused by plan run)."""
    if dtype == "fp8":
        raise SpecError("dtype: fp8 does not apply to recommendation models (their tables and "
                        "dense part are priced in fp32 or bf16; TorchRec trains them in fp32); "
                        "use --dtype fp32 or bf16")


@dataclass
class PreparedRec:
    """A recommendation model measured once: its tables and dense work (``rec``), the plan's
    model section (``info``) and its dense part traced for the dense search (``dense``; None when
    the module cannot run it apart from its tables)."""

    rec: object
    info: dict
    dense: Prepared | None = None


def prepare_recsys(model, tables=None, dtype: str = "fp32") -> PreparedRec:
    """A recommendation model's tables with their statistics (``tables``: a YAML path or mapping;
    default: the zoo's, or MODEL.tables.yaml beside a factory file) and its dense part measured
    and traced on the meta device (in ``dtype``, the dense part's training dtype)."""
    from planner.trace import recsys  # lazy: loads torch (seconds)

    model, tables = fspath_or_same(model), fspath_or_same(tables)
    entry = RECSYS.get(model.lower()) if isinstance(model, str) else None
    stats = tables
    if isinstance(tables, str):
        stats = recsys.read_table_stats(tables)
    elif tables is not None:
        stats = recsys.check_table_stats(tables)
    elif tables is None and isinstance(model, str):
        beside = recsys.default_stats_path(model)
        stats = recsys.read_table_stats(beside) if beside else None
    module = model
    if isinstance(model, str) and entry is None:
        from planner.trace.models import call_factory, load_factory  # lazy: loads torch

        module = _factory_module(call_factory(load_factory(model), model, meta=False), model)
    rec = recsys.rec_model(entry.name if entry else module, stats=stats)
    digest = hashlib.sha256(json.dumps(rec.to_dict(), sort_keys=True).encode())
    fingerprint = digest.hexdigest()[:16]
    info = {"name": rec.name, "source": "zoo" if entry else ("factory" if isinstance(model, str)
                                                             else "module"),
            "spec": spec_of(model),
            "num_params": int(rec.dense_params + sum(t.rows * t.dim for t in rec.tables)),
            "fingerprint": fingerprint}
    arch = recsys.dense_arch(recsys.build(entry) if entry else module)
    dense = None
    if arch is not None:
        log.info("%s: tracing its dense part (DenseArch) apart from the tables", rec.name)
        dense = traced.trace_model(arch[0], arch[1], None, dtype, "auto", per_sample=True)
    return PreparedRec(rec, info, dense)


def plan_rec_prepared(prepared: PreparedRec, cluster, training: TrainingSpec, *,
                      sharding: str | None = None, zero: int | None = None,
                      table_pins: dict | None = None,
                      table_optimizer: str | None = None, pipeline: str = "sparse-dist",
                      time_limit_s: float | None = None, record_timing: bool = False) -> Plan:
    """Shard and price an already measured recommendation model on ``cluster``: the dense part
    by the dense search (``zero`` pins its state sharding: 0 DDP, 3 FSDP2), then the tables."""
    from planner.search.dense_part import dense_options  # lazy: recsys only
    from planner.search.tables import RecOptions, plan_tables  # lazy: recsys only

    _check_dtype(training.dtype)
    rec, info = prepared.rec, prepared.info
    entry = RECSYS.get((info.get("spec") or "").lower())
    default_opt = entry.optimizer if entry else ("sgd" if training.optimizer == "sgd" else "adam")
    if table_optimizer is None and entry is None:  # (a review's own model got adam unsaid)
        log.info("tables: their fused optimizer is %s, from the dense part's%s; "
                 "--table-optimizer sets another (sgd or rowwise_adagrad keep the least state)",
                 default_opt, " (two fp32 states per element, twice the table)"
                 if default_opt == "adam" else "")
    opts = RecOptions(pipeline=pipeline, fix_sharding=sharding,
                      fixed=tuple((name, kind, None) for name, kind in (table_pins or {}).items()),
                      optimizer=table_optimizer or default_opt,
                      time_limit_s=time_limit_s or RecOptions.time_limit_s)
    t0 = time.perf_counter()
    dense = ()
    zero = None if zero is None else _dense_zero(zero)
    if prepared.dense is not None:
        dense = dense_options(prepared.dense.blocks, cluster, global_batch=training.global_batch,
                              dtype=training.dtype, optimizer=training.optimizer,
                              engine=training.engine, zero=zero)
    elif zero is not None:
        raise SpecError("fix: zero= needs a model whose dense part runs apart from its tables "
                        "(dense_forward and dense_inputs, as the zoo's models have)")
    log.info("sharding %d tables over %d GPUs (CP-SAT, up to %g s) ...", len(rec.tables),
             cluster.num_gpus, opts.time_limit_s)
    tp = plan_tables(rec, cluster, global_batch=training.global_batch, dtype=training.dtype,
                     engine=training.engine, opts=opts, dense=dense)
    log.info("sharded %d tables over %d GPUs in %.2f s (%s)", len(rec.tables), cluster.num_gpus,
             time.perf_counter() - t0, tp.solver["status"])
    return emit_tables(model_info=info, rec=rec, tp=tp, cluster=cluster, training=training,
                       rec_options=opts, record_timing=record_timing)


def _rec_fix(fix) -> tuple:
    """(sharding, zero, pins): the knobs a recommendation model's --fix takes: ``sharding=<type>``
    for every table, ``sharding.<table>=<type>`` for one (over the first), ``zero=0|3`` for the
    dense part (DDP or FSDP2)."""
    if fix is None or fix == "" or fix == {}:
        return None, None, {}
    items = dict(fix) if isinstance(fix, dict) else dict(
        part.split("=", 1) if "=" in part else (part, "") for part in str(fix).split(","))
    pins = table_pins(items)
    if (not items and not pins) or set(items) - {"sharding", "zero"}:
        other = sorted(set(items) - {"sharding", "zero"}) or ["nothing"]
        raise SpecError(f"fix.{other[0]}: recommendation models take only sharding=<type> (one "
                        f"of data_parallel, table_wise, column_wise, row_wise, table_row_wise, "
                        f"grid_shard; sharding.<table>=<type> for one table) and zero=0|3; drop "
                        f"{', '.join(other)}")
    zero = items.pop("zero", None)
    if zero is not None:
        zero = _dense_zero(zero)
    return (str(items["sharding"]) if "sharding" in items else None), zero, pins


def table_pins(items: dict, where: str = "fix") -> dict[str, str]:
    """The ``sharding.<table>=<type>`` pins of ``items`` (removed from it), by table name, each
    type checked (a review's one narrow table made every all-table pin fail)."""
    pins = {}
    for key in [k for k in items if str(k).startswith("sharding.")]:
        name, kind = str(key).split(".", 1)[1], str(items.pop(key)).strip()
        if not name or kind not in SHARDING_TYPES:
            raise SpecError(f"{where}.{key}: expected sharding.<table>=<type> with a type of "
                            f"{', '.join(SHARDING_TYPES)}, got {kind!r}")
        pins[name] = kind
    return pins


def _dense_zero(value) -> int:
    if str(value).strip() not in ("0", "3"):
        raise SpecError(f"fix.zero: the dense part of a recommendation model runs with DDP or "
                        f"FSDP2, got {value!r}; give zero=0 or zero=3")
    return int(value)
