"""Load a calibration written by ``plan profile`` and apply it to a cluster.

The measured numbers replace the device's data-sheet peak (and its efficiency factors, which the
measurements already contain), its memory bandwidth, its per-kernel cost, the host cost of DTensor
and how much concurrent processes' speeds vary (CPUs) and, when collectives were measured, the
intra-node link.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Mapping

from costmodels.hardware import ATTENTION_KINDS, GB, TERA
from costmodels.topology import Cluster, LinkSpec
from planner.errors import SpecError
from planner.files import read_json_object

SCHEMA = "planner.calibration/v1"
log = logging.getLogger(__name__)


def load_calibration(source) -> dict:
    """A path to a calibration JSON, or an already loaded mapping; checks the keys."""
    if isinstance(source, Mapping):
        data = dict(source)
        where = "calibration"
    elif not isinstance(source, (str, os.PathLike)):
        raise SpecError(f"calibration: expected a calibration file path (a str or pathlib.Path) "
                        f"or a mapping, got {type(source).__name__} {source!r}")
    else:
        where = str(source)
        data = read_json_object(source, what="calibration",
                                missing_hint="create it with `plan profile -o FILE`")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise SpecError(f"{where}: not a calibration (schema must be '{SCHEMA}'); create it with "
                        "`plan profile -o FILE`")
    if not isinstance(data.get("device"), Mapping):
        raise SpecError(f"{where}: device must be a mapping of the measured figures, got "
                        f"{type(data.get('device')).__name__}; re-run `plan profile`")
    for key in ("peak_TFLOPs", "gemm_table", "hbm_GBps", "kernel_overhead_us",
                "attention_efficiency"):
        if key not in data["device"]:
            raise SpecError(f"{where}: device.{key} is missing; re-run `plan profile`")
    return data


def _check_device(data: dict, cluster: Cluster, where: str) -> None:
    """A calibration measured on a CPU does not price GPUs, nor the reverse (SpecError); one
    measured on another GPU model than the cluster's is used with a warning (a custom device may
    carry any name)."""
    kind, measured = data.get("device_kind"), str(data.get("device_name", "?"))
    if kind not in ("cpu", "cuda", None):
        raise SpecError(f"{where}: device_kind: expected cpu or cuda (what `plan profile` "
                        f"measures), got {kind!r}; {FIX}")
    target = cluster.device.name
    on_cpu = target.split()[0].startswith("cpu")
    if kind in ("cpu", "cuda") and (kind == "cpu") != on_cpu:
        raise SpecError(f"{where}: measured on {'a CPU' if kind == 'cpu' else 'a GPU'} "
                        f"({measured}), but the cluster's device is {target}; run `plan profile` "
                        "on that device, or drop --calibration")
    family = target.split("-")[0].lower()
    if kind == "cuda" and family not in measured.lower():
        log.warning("calibration: measured on %s, the cluster's device is %s; its speeds are "
                    "used as if they were that device's", measured, target)


NOISY_SPREAD = 0.10
"""Median spread of a calibration's repeated measurements (interquartile range over the median)
above which it is called noisy: a machine busy with other work while it measured (a new-user
check's calibration at 12% read its plans 14-44% too slow; one taken minutes later, with the
machine idle, read them as the README does)."""


def noisy_calibration(data: Mapping) -> str:
    """'' or a warning that ``data`` (a calibration) was measured on a busy machine."""
    device = data.get("device")
    spread = device.get("repeat_spread") if isinstance(device, Mapping) else None
    spread = spread.get("median") if isinstance(spread, Mapping) else None
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or spread <= NOISY_SPREAD:
        return ""
    return (f"calibration: its repeated measurements spread by {100 * spread:.0f}% on median "
            f"(more than {100 * NOISY_SPREAD:.0f}%): the machine was busy while it measured, and "
            "predictions from it can be off by as much or more; re-run `plan profile` on an idle "
            "machine")


def apply_calibration(cluster: Cluster, calibration) -> Cluster:
    """The cluster with its device (and intra-node link, if measured) replaced by measurements."""
    data = load_calibration(calibration)
    where = "calibration" if isinstance(calibration, Mapping) else str(calibration)
    dev = _mapping(data["device"], f"{where}: device")
    _check_device(data, cluster, where)
    noisy = noisy_calibration(data)
    if noisy:
        log.warning("%s (%s)", noisy, where)
    busy = data.get("processes")
    if data.get("device_kind") == "cpu" and busy and busy != cluster.gpus_per_node:
        log.warning("calibration: measured with %s processes at work, the cluster runs %d per "
                    "node; CPU processes share caches and memory bandwidth, so re-run `plan "
                    "profile --processes %d` for these speeds", busy, cluster.gpus_per_node,
                    cluster.gpus_per_node)

    def num(d: dict, key: str, default=None, *, positive=False, at="device") -> float:
        value = d.get(key, default)
        return _number(value, f"{where}: {at}.{key}", positive=positive)

    attn = _mapping(dev["attention_efficiency"], f"{where}: device.attention_efficiency")
    host = _mapping(dev.get("dtensor") or {}, f"{where}: device.dtensor")
    sizes, grids = _gemm_grid(dev, where)
    stray = sorted(set(grids) - set(_mapping(dev["gemm_table"], f"{where}: device.gemm_table")))
    if stray:  # (shapes refine a dtype's measured rates; without those they are never read)
        raise SpecError(f"{where}: device.gemm_grid.tables.{stray[0]}: no device.gemm_table."
                        f"{stray[0]} beside it (a dtype's shapes refine its measured rates); {FIX}")
    device = dataclasses.replace(
        cluster.device,
        name=_named(cluster.device.name, " (calibrated)"),
        peak_flops={dt: _number(v, f"{where}: device.peak_TFLOPs.{dt}", positive=True) * TERA
                    for dt, v in _mapping(dev["peak_TFLOPs"],
                                          f"{where}: device.peak_TFLOPs").items()},
        gemm_table={dt: _table(table, f"{where}: device.gemm_table.{dt}")
                    for dt, table in _mapping(dev["gemm_table"],
                                              f"{where}: device.gemm_table").items()},
        gemm_grid=grids, gemm_grid_sizes=sizes,
        attention_table=_attention_tables(dev.get("attention_table") or {},
                                          f"{where}: device.attention_table"),
        hbm_bytes_per_s=num(dev, "hbm_GBps", positive=True) * GB,
        kernel_overhead_s=num(dev, "kernel_overhead_us") * 1e-6,
        memory_table=_table(dev.get("memory_table", []), f"{where}: device.memory_table",
                            allow_empty=True),
        optimizer_s_per_param=num(dev, "adamw_s_per_param", 0.0),
        dtensor_linear_fwd_s=num(host, "linear_fwd_us", 0.0, at="device.dtensor") * 1e-6,
        dtensor_linear_bwd_s=num(host, "linear_bwd_us", 0.0, at="device.dtensor") * 1e-6,
        dtensor_param_s=num(host, "param_step_us", 0.0, at="device.dtensor") * 1e-6,
        jitter=num(dev, "jitter", 0.0),
        grouped_gemm_efficiency=num(dev, "grouped_gemm_efficiency", 1.0, positive=True),
        matmul_efficiency=1.0,
        memory_efficiency=1.0,
        attention_efficiency=min(_number(v, f"{where}: device.attention_efficiency.{dt}",
                                         positive=True)
                                 for dt, v in attn.items()) if attn else 1.0,
        attention_bwd_efficiency=None,  # measured forward and backward together
        flash2_efficiency=None,  # the measured rate is SDPA's default kernel's, whatever it is
        flash2_bwd_efficiency=None,
        causal_attention_ratio=1.0,  # measured tables price causal calls at their own rate
        threads=_threads(data, where),
    )
    link = data.get("intra_node")
    intra = cluster.intra_node
    if link:
        link = _mapping(link, f"{where}: intra_node")
        intra = LinkSpec(name=f"{link.get('backend', 'measured')}", efficiency=1.0,
                         bandwidth_bytes_per_s=num(link, "bandwidth_GBps", positive=True,
                                                   at="intra_node") * GB,
                         latency_s=num(link, "latency_us", at="intra_node") * 1e-6,
                         reduce_scatter_factor=num(link, "reduce_scatter_factor", 1.0,
                                                   positive=True, at="intra_node"),
                         allgather_factor=num(link, "all_gather_factor", 1.0, positive=True,
                                              at="intra_node"),
                         sync_s=num(link, "sync_us", 0.0, at="intra_node") * 1e-6,
                         p2p_sync_s=(num(link, "p2p_sync_us", at="intra_node") * 1e-6
                                     if "p2p_sync_us" in link else None),
                         p2p_latency_s=(num(link, "p2p_latency_us", at="intra_node") * 1e-6
                                        if "p2p_latency_us" in link else None),
                         p2p_bytes_per_s=(num(link, "p2p_bandwidth_GBps", positive=True,
                                              at="intra_node") * GB
                                          if "p2p_bandwidth_GBps" in link else None),
                         # all-to-alls keep the preset's share of the collectives' rate (the
                         # calibration measures the all-reduce's)
                         alltoall_efficiency=(cluster.intra_node.alltoall_efficiency /
                                              cluster.intra_node.efficiency
                                              if cluster.intra_node.alltoall_efficiency
                                              is not None else None))
    return dataclasses.replace(cluster, device=device, intra_node=intra,
                               name=_named(cluster.name, CALIBRATED))


def _named(name: str, suffix: str) -> str:
    """``name`` with ``suffix`` once (a plan's calibrated cluster calibrated again as it is
    re-priced keeps one)."""
    return name if name.endswith(suffix) else f"{name}{suffix}"


FIX = "re-run `plan profile`"
CALIBRATED = "+calibration"
"""What a calibrated cluster's name adds to its preset's (``cpu+calibration``)."""


def _threads(data: Mapping, where: str) -> int:
    """The threads per process a CPU calibration measured with (0: a GPU's, or not recorded)."""
    if data.get("device_kind") != "cpu" or data.get("threads") is None:
        return 0
    threads = _number(data["threads"], f"{where}: threads", positive=True)
    if threads != int(threads):
        raise SpecError(f"{where}: threads: expected a whole number of CPU threads per process, "
                        f"got {data['threads']!r}; {FIX}")
    return int(threads)


def _number(value, where: str, *, positive: bool = False) -> float:
    """``value`` as a finite, non-negative (or positive) float; SpecError naming ``where``."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > 0 if positive else value >= 0))
    if not ok:
        raise SpecError(f"{where}: expected a {'positive' if positive else 'non-negative'} number, "
                        f"got {value!r}; {FIX}")
    return float(value)


def _mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping, got {value!r:.60}; {FIX}")
    return value


_OLD_SAID: set[str] = set()
"""Calibrations whose long-shaped tables were already said to be ignored (a sweep applies one
calibration at every point)."""


def _gemm_grid(dev: dict, where: str) -> tuple[tuple, dict]:
    """``device.gemm_grid``: the sizes measured and, per dtype, the nested [m][k][n] FLOP/s;
    ((), {}) where the calibration has none (GEMMs then priced by FLOPs alone). A calibration
    written before 2026-12-06 has long-shaped tables instead (``gemm_skew``), which this version
    no longer reads: said once."""
    if "gemm_skew" in dev and "gemm_grid" not in dev and where not in _OLD_SAID:
        _OLD_SAID.add(where)
        log.warning("%s: measured GEMMs of a few long shapes only (device.gemm_skew, before "
                    "2026-12-06), which this version does not read: GEMMs are priced by their "
                    "FLOPs alone; re-run `plan profile` to measure them by shape", where)
    if "gemm_grid" not in dev:
        return (), {}
    at = f"{where}: device.gemm_grid"
    grid = _mapping(dev["gemm_grid"], at)
    sizes = grid.get("sizes")
    if not isinstance(sizes, list) or len(sizes) < 2:
        raise SpecError(f"{at}.sizes: expected a list of at least two sizes, got {sizes!r:.60}; "
                        f"{FIX}")
    sizes = tuple(_number(s, f"{at}.sizes[{i}]", positive=True) for i, s in enumerate(sizes))
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise SpecError(f"{at}.sizes: expected increasing sizes, got {list(sizes)}; {FIX}")
    if "tables" not in grid:
        raise SpecError(f"{at}.tables is missing; {FIX}")
    out = {}
    for dt, rates in _mapping(grid["tables"], f"{at}.tables").items():
        out[dt] = _cube(rates, len(sizes), f"{at}.tables.{dt}")
    return sizes, out


def _cube(rates, n: int, where: str, depth: int = 3):
    """A nested list ``depth`` deep with ``n`` entries at each level and positive numbers at the
    bottom, as nested tuples."""
    if depth == 0:
        return _number(rates, where, positive=True)
    if not isinstance(rates, list) or len(rates) != n:
        raise SpecError(f"{where}: expected a list of {n} entries (one per measured size), got "
                        f"{rates!r:.60}; {FIX}")
    return tuple(_cube(r, n, f"{where}[{i}]", depth - 1) for i, r in enumerate(rates))


def _attention_tables(data, where: str) -> dict:
    """``device.attention_table``: per dtype, the four tables of ATTENTION_KINDS."""
    out = {}
    for dt, kinds in _mapping(data, where).items():
        kinds = _mapping(kinds, f"{where}.{dt}")
        missing = [k for k in ATTENTION_KINDS if k not in kinds]
        if missing:
            raise SpecError(f"{where}.{dt}: {missing[0]} is missing; {FIX}")
        out[dt] = {k: _table(kinds[k], f"{where}.{dt}.{k}") for k in ATTENTION_KINDS}
    return out


def _table(rows, where: str, *, allow_empty: bool = False) -> tuple[tuple[float, float], ...]:
    """A measured table: a list of [size, rate] pairs of positive numbers."""
    if not isinstance(rows, list) or not (rows or allow_empty):
        raise SpecError(f"{where}: expected a list of [size, rate] pairs, got {rows!r:.60}; {FIX}")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != 2:
            raise SpecError(f"{where}[{i}]: expected [size, rate], got {row!r:.60}; {FIX}")
        out.append((_number(row[0], f"{where}[{i}][0]", positive=True),
                    _number(row[1], f"{where}[{i}][1]", positive=True)))
    return tuple(out)
