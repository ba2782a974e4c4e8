"""What-if sweeps: plan one model over a grid of clusters, batches and pinned knobs.

``whatif`` expands ``vary`` (key -> values) into the cartesian product of its values, first key
outermost, and plans every point. The model is traced once per (sequence length, dtype) that the
grid needs (planner.api.prepare); every point is then only a search (planner.api.plan_prepared) on a
cluster resized or modified with ``dataclasses.replace``. Points run in a process pool, each worker
receiving the traced models once; rows come back in grid order and do not depend on the number of
workers. A point where nothing fits, or whose settings contradict each other, is a row with
``feasible`` False and the reason. Returns plain rows (dicts); never prints.
"""

from __future__ import annotations

import csv
import itertools
import logging
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from costmodels.engine import engine_from_mapping
from costmodels.hardware import GB, get_device
from costmodels.topology import Cluster, HeteroCluster
from planner import api
from planner.clusters import load_cluster
from planner.emit import BREAKDOWN_WORDS
from planner.errors import PlannerError, SpecError
from planner.options import DTYPES, FIX_KEYS, OPTIMIZERS, SearchOptions, TrainingSpec, parse_fix

log = logging.getLogger(__name__)

CLUSTER_KEYS = ("cluster", "nodes", "gpus_per_node", "device", "inter_node_bandwidth",
                "intra_node_bandwidth")
"""Keys that change the cluster (bandwidths in GB/s per GPU and direction)."""
TRAINING_KEYS = ("global_batch", "seq_len", "dtype", "optimizer")
VARY_KEYS = CLUSTER_KEYS + TRAINING_KEYS + FIX_KEYS
CONFIG_KEYS = ("dp", "tp", "pp", "vpp", "micro_batch", "num_microbatches", "schedule", "recompute",
               "zero", "sequence_parallel", "offload_optimizer", "placement")
METRIC_KEYS = ("step_time_s", "samples_per_s", "tokens_per_s", "tflops_per_device", "mfu",
               "peak_memory_bytes")
HOUR_S = 3600.0

_IN_WORKER: dict = {}
"""A pool worker's own copy of the traced models, set once by ``_init_worker`` in that worker
process; the calling process never writes or reads it."""


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


def whatif(model, *, cluster=None, vary: Mapping[str, Sequence], global_batch: int | None = None,
           seq_len: int | None = None, dtype: str = "bf16", optimizer: str = "adam", fix=None,
           nodes: int | None = None, gpus_per_node: int | None = None, prices=None,
           tokens: float | None = None, top_k: int = 0, time_limit_s: float | None = None,
           engine=None, example_inputs=None, workers: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Plan ``model`` at every point of the grid ``vary`` spans; one row per point, in grid order.

    ``vary`` maps keys of VARY_KEYS to lists of values (``{"nodes": [8, 16], "tp": [4, 8]}``);
    the other arguments are the settings every point shares (as for planner.plan). ``prices``
    maps device names (or unique prefixes, ``a100``) to dollars per GPU-hour and adds cost
    columns; ``tokens`` adds the hours and dollars to train on that many tokens."""
    grid = expand(vary)
    if cluster is None and "cluster" not in vary:
        raise SpecError("cluster: missing; pass cluster= (--cluster) or vary it "
                        "(--vary cluster=A,B)")
    if global_batch is None and "global_batch" not in vary:
        raise SpecError("global_batch: missing; pass global_batch= (--global-batch) or vary it")
    base = {"cluster": cluster, "nodes": nodes, "gpus_per_node": gpus_per_node,
            "global_batch": global_batch, "seq_len": seq_len, "dtype": dtype,
            "optimizer": optimizer, "fix": parse_fix(fix), "engine": engine_from_mapping(engine),
            "top_k": top_k, "time_limit_s": time_limit_s}
    tasks = [_task(i, point, base) for i, point in enumerate(grid)]
    keys = sorted({t.trace_key for t in tasks if not t.error}, key=str)
    prepared = {k: api.prepare(model, example_inputs=example_inputs, seq_len=k[0], dtype=k[1])
                for k in keys}
    log.info("what-if: %d points, %d trace%s", len(tasks), len(prepared),
             "" if len(prepared) == 1 else "s")
    rows = _run(tasks, prepared, workers, progress)
    name = next(iter(prepared.values())).info["name"] if prepared else str(model)
    for row in rows:
        row["model"] = name
    if prices:
        add_costs(rows, prices, tokens)
    elif tokens is not None:
        raise SpecError("tokens: the cost of a run needs prices; pass prices={'h100': 4.0, ...}")
    return [_ordered(r) for r in rows]


def expand(vary: Mapping[str, Sequence]) -> list[tuple]:
    """The grid: a list of points, each a tuple of (key, value) in ``vary``'s key order."""
    if not isinstance(vary, Mapping) or not vary:
        raise SpecError("vary: give at least one key with values, e.g. vary={'nodes': [8, 16]}")
    axes = []
    for key, values in vary.items():
        if key not in VARY_KEYS:
            raise SpecError(f"vary: unknown key '{key}'; choose from {', '.join(VARY_KEYS)}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise SpecError(f"vary.{key}: expected a non-empty list of values, got {values!r}")
        axes.append([(key, _value(key, v)) for v in values])
    return list(itertools.product(*axes))


def parse_vary(items: Sequence[str]) -> dict:
    """``["nodes=8,16", "tp=4,8"]`` -> ``{"nodes": ["8", "16"], "tp": ["4", "8"]}``."""
    out: dict = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values.strip():
            raise SpecError(f"vary: '{item}' is not KEY=V1,V2,...; e.g. --vary nodes=8,16,32")
        if key in out:
            raise SpecError(f"vary.{key}: given twice; list all its values in one --vary")
        out[key] = [v.strip() for v in values.split(",") if v.strip()]
    return out


def parse_prices(text: str | Mapping | None) -> dict:
    """``"h100=4,a100-80g=$2"`` -> ``{"h100": 4.0, "a100-80g": 2.0}`` (dollars per GPU-hour)."""
    if text is None or isinstance(text, Mapping):
        items = dict(text or {})
    else:
        items = {}
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            name, sep, value = part.partition("=")
            if not sep:
                raise SpecError(f"price_per_gpu_hour: '{part}' is not GPU=dollars; e.g. h100=4")
            items[name.strip()] = value.strip().lstrip("$")
    out = {}
    for name, value in items.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise SpecError(f"price_per_gpu_hour.{name}: expected dollars per GPU-hour, got "
                            f"{value!r}") from None
        if not out[name] > 0:
            raise SpecError(f"price_per_gpu_hour.{name}: expected a positive price, got {value!r}")
    return out


def _value(key: str, raw):
    """One value of ``key``, converted and checked (SpecError names key and value)."""
    if key in FIX_KEYS:
        return parse_fix({key: raw})[key]
    if key in ("nodes", "gpus_per_node", "global_batch", "seq_len"):
        try:
            value = int(raw)
        except (TypeError, ValueError):
            value = 0
        if isinstance(raw, bool) or value < 1 or (isinstance(raw, float) and raw != value):
            raise SpecError(f"vary.{key}: expected a positive integer, got {raw!r}")
        return value
    if key.endswith("_bandwidth"):
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = 0.0
        if not value > 0:
            raise SpecError(f"vary.{key}: expected GB/s per GPU (a positive number), got {raw!r}")
        return value
    if key == "device":
        get_device(str(raw), "vary.device")
        return str(raw)
    if key == "dtype" and raw not in DTYPES:
        raise SpecError(f"vary.dtype: unknown dtype {raw!r}; use one of {', '.join(DTYPES)}")
    if key == "optimizer" and raw not in OPTIMIZERS:
        raise SpecError(f"vary.optimizer: unknown optimizer {raw!r}; use one of "
                        f"{', '.join(OPTIMIZERS)}")
    if key == "cluster":
        load_cluster(raw)  # fails early on an unknown preset or a bad file
    return raw


def _task(index: int, point: tuple, base: dict) -> _Task:
    """Resolve one point's cluster, training and options from the shared settings."""
    s = {**base, **{k: v for k, v in point if k not in FIX_KEYS}}
    fix = {**base["fix"], **{k: v for k, v in point if k in FIX_KEYS}}
    trace_key = (s["seq_len"], s["dtype"])
    cl = None
    try:
        cl = point_cluster(s)
        for group in getattr(cl, "groups", (cl,)):
            group.device.peak(s["dtype"])
        training = TrainingSpec(global_batch=s["global_batch"], seq_len=s["seq_len"] or 1,
                                dtype=s["dtype"], optimizer=s["optimizer"], engine=s["engine"])
        options = SearchOptions(fix=fix, top_k=s["top_k"], time_limit_s=s["time_limit_s"])
    except SpecError as exc:
        return _Task(index, point, cl, None, None, trace_key, error=str(exc))
    return _Task(index, point, cl, training, options, trace_key)


def point_cluster(s: Mapping) -> Cluster | HeteroCluster:
    """The cluster of one point: the preset or file, resized, with its device or links swapped."""
    changes = [k for k in ("device", "inter_node_bandwidth", "intra_node_bandwidth") if k in s]
    cl = load_cluster(s["cluster"])
    if isinstance(cl, HeteroCluster):
        if s["nodes"] or s["gpus_per_node"] or changes:
            raise SpecError("vary: a cluster with node groups cannot be resized or modified here; "
                            "vary its YAML file instead (--vary cluster=a.yaml,b.yaml)")
        return cl
    cl = load_cluster(cl, nodes=s["nodes"], gpus_per_node=s["gpus_per_node"])
    if "device" in s:
        cl = replace(cl, device=get_device(s["device"], "vary.device"))
    for key, tier in (("inter_node_bandwidth", "inter_node"),
                      ("intra_node_bandwidth", "intra_node")):
        if key in s:
            link = replace(getattr(cl, tier), bandwidth_bytes_per_s=s[key] * GB)
            cl = replace(cl, **{tier: link})
    return cl


def _run(tasks: list[_Task], prepared: dict, workers: int | None, progress) -> list[dict]:
    """Plan every task; rows in task order. Uses a process pool when it pays."""
    todo = [t for t in tasks if not t.error]
    rows: list[dict | None] = [None] * len(tasks)
    for t in tasks:
        if t.error:
            rows[t.index] = _row(t, None, t.error)
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
    with ProcessPoolExecutor(max_workers=n, mp_context=_context(), initializer=_init_worker,
                             initargs=(prepared,)) as pool:
        futures = {pool.submit(_plan_in_worker, t): t.index for t in todo}
        for future in as_completed(futures):
            rows[futures[future]] = future.result()
            done += 1
            if progress:
                progress(done, len(tasks))
    return rows


def _workers(workers: int | None, points: int) -> int:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise SpecError(f"workers: expected a positive integer, got {workers!r}")
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(workers or available or 1, points)


def _context():
    """fork where it is safe and cheap (Linux: workers inherit the imported modules); spawn
    elsewhere."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    fork = "fork" in methods and sys.platform.startswith("linux")
    return multiprocessing.get_context("fork" if fork else "spawn")


def _init_worker(prepared: dict) -> None:
    _IN_WORKER["prepared"] = prepared


def _plan_in_worker(task: _Task) -> dict:
    return plan_point(task, _IN_WORKER["prepared"][task.trace_key])


def plan_point(task: _Task, prepared) -> dict:
    """Plan one point; an infeasible point is a row with the reason."""
    training = replace(task.training, seq_len=prepared.seq_len)
    try:
        plan = api.plan_prepared(prepared, task.cluster, training, task.options)
    except PlannerError as exc:
        return _row(replace(task, training=training), None, str(exc))
    return _row(replace(task, training=training), plan, "")


def _row(task: _Task, plan, reason: str) -> dict:
    """One flat row: the point, its cluster and training, the plan's configuration and metrics;
    None where a value does not apply (so rows survive a CSV round trip unchanged)."""
    summary = task.cluster.summary() if task.cluster is not None else {}
    tr = task.training
    row = {
        "point": " ".join(f"{k}={_text(v)}" for k, v in task.point),
        "cluster": summary.get("name"), "device": summary.get("device"),
        "nodes": summary.get("nodes"), "gpus_per_node": summary.get("gpus_per_node"),
        "gpus": summary.get("num_gpus"), "intra_node_GBps": summary.get("intra_node_GBps"),
        "inter_node_GBps": summary.get("inter_node_GBps"),
        "global_batch": tr.global_batch if tr else None, "seq_len": tr.seq_len if tr else None,
        "dtype": tr.dtype if tr else None, "optimizer": tr.optimizer if tr else None,
        "fix": ",".join(f"{k}={_text(v)}" for k, v in task.options.fix.items())
        if task.options and task.options.fix else None,
        "feasible": plan is not None, "reason": reason or None,
        "config": plan.parallel_summary if plan else None,
    }
    row.update({k: plan.parallel.get(k) if plan else None for k in CONFIG_KEYS})
    row.update({k: plan.predicted[k] if plan else None for k in METRIC_KEYS})
    row["device_memory_bytes"] = summary.get("device_memory_bytes")
    row.update({k: plan.predicted["breakdown"].get(k, 0.0) if plan else None
                for k in BREAKDOWN_WORDS})
    return row


def _text(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _ordered(row: dict) -> dict:
    return {"model": row.pop("model"), **row}


def add_costs(rows: list[dict], prices, tokens: float | None = None) -> None:
    """Add price_per_gpu_hour, cost_per_step_usd and cost_per_mtok_usd (per million tokens), and
    with ``tokens`` run_hours and run_cost_usd, to every row whose device has a price."""
    prices = parse_prices(prices)
    if tokens is not None and (isinstance(tokens, bool) or not float(tokens) > 0):
        raise SpecError(f"tokens: expected a positive number of training tokens, got {tokens!r}")
    by_device = resolve_prices(prices, sorted({r["device"] for r in rows if r["device"]}))
    for r in rows:
        price = by_device.get(r["device"])
        cost = {"price_per_gpu_hour": price, "cost_per_step_usd": None, "cost_per_mtok_usd": None}
        if tokens is not None:
            cost.update({"tokens": float(tokens), "run_hours": None, "run_cost_usd": None})
        if price is not None and r["feasible"]:
            dollars_per_s = r["gpus"] * price / HOUR_S
            cost["cost_per_step_usd"] = dollars_per_s * r["step_time_s"]
            cost["cost_per_mtok_usd"] = dollars_per_s / r["tokens_per_s"] * 1e6
            if tokens is not None:
                hours = float(tokens) / r["tokens_per_s"] / HOUR_S
                cost.update({"run_hours": hours, "run_cost_usd": hours * r["gpus"] * price})
        r.update(cost)


def resolve_prices(prices: Mapping[str, float], devices: Sequence[str]) -> dict:
    """Device name -> price; a key may be a device name or a prefix naming exactly one of
    ``devices`` (``a100`` for ``a100-80g``)."""
    out = {}
    for key, price in prices.items():
        matches = [d for d in devices if d == key] or [d for d in devices if d.startswith(key)]
        if len(matches) != 1:
            which = "matches several" if matches else "matches no"
            raise SpecError(f"price_per_gpu_hour.{key}: {which} device of the sweep "
                            f"({', '.join(devices)}); name one of them")
        out[matches[0]] = price
    return out


def write_csv(rows: list[dict], path: str) -> None:
    """Write ``rows`` as CSV (columns in the rows' order; empty cells for None)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    except OSError as exc:
        raise SpecError(f"csv: cannot write '{path}' ({exc.strerror})") from None


def read_csv(path: str) -> list[dict]:
    """Rows written by ``write_csv``, with numbers, booleans and empty cells (None) restored."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [{k: _cell(v) for k, v in r.items()} for r in csv.DictReader(f)]
    except OSError as exc:
        raise SpecError(f"csv: cannot read '{path}' ({exc.strerror})") from None


def _cell(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
