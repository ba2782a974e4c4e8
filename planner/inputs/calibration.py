"""Load a calibration written by ``plan profile`` and apply it to a cluster.

The measured numbers replace the device's data-sheet peak (and its efficiency factors, which the
measurements already contain), its memory bandwidth, its per-kernel cost, the host cost of DTensor
and how much concurrent processes' speeds vary (CPUs) and, when collectives were measured, the
intra-node link.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Mapping

from costmodels.hardware import GB, TERA
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
    else:
        where = str(source)
        data = read_json_object(source, what="calibration",
                                missing_hint="create it with `plan profile -o FILE`")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise SpecError(f"{where}: not a calibration (schema must be '{SCHEMA}'); create it with "
                        "`plan profile -o FILE`")
    for key in ("peak_TFLOPs", "gemm_table", "hbm_GBps", "kernel_overhead_us",
                "attention_efficiency"):
        if key not in data.get("device", {}):
            raise SpecError(f"{where}: device.{key} is missing; re-run `plan profile`")
    return data


def apply_calibration(cluster: Cluster, calibration) -> Cluster:
    """The cluster with its device (and intra-node link, if measured) replaced by measurements."""
    data = load_calibration(calibration)
    dev = data["device"]
    busy = data.get("processes")
    if data.get("device_kind") == "cpu" and busy and busy != cluster.gpus_per_node:
        log.warning("calibration: measured with %d processes at work, the cluster runs %d per "
                    "node; CPU processes share caches and memory bandwidth, so re-run `plan "
                    "profile --processes %d` for these speeds", busy, cluster.gpus_per_node,
                    cluster.gpus_per_node)
    attn = dev["attention_efficiency"]
    host = dev.get("dtensor") or {}
    skew = dev.get("gemm_skew") or {}
    device = dataclasses.replace(
        cluster.device,
        name=f"{cluster.device.name} (calibrated)",
        peak_flops={dt: float(v) * TERA for dt, v in dev["peak_TFLOPs"].items()},
        gemm_table={dt: tuple((float(f), float(r)) for f, r in table)
                    for dt, table in dev["gemm_table"].items()},
        gemm_skew={dt: {dim: tuple((float(f), float(r)) for f, r in table)
                        for dim, table in dims.items()}
                   for dt, dims in skew.get("tables", {}).items()},
        gemm_skew_aspect=float(skew.get("aspect", 32.0)),
        hbm_bytes_per_s=float(dev["hbm_GBps"]) * GB,
        kernel_overhead_s=float(dev["kernel_overhead_us"]) * 1e-6,
        memory_table=tuple((float(b), float(r)) for b, r in dev.get("memory_table", [])),
        optimizer_s_per_param=float(dev.get("adamw_s_per_param", 0.0)),
        dtensor_linear_fwd_s=float(host.get("linear_fwd_us", 0.0)) * 1e-6,
        dtensor_linear_bwd_s=float(host.get("linear_bwd_us", 0.0)) * 1e-6,
        dtensor_param_s=float(host.get("param_step_us", 0.0)) * 1e-6,
        jitter=float(dev.get("jitter", 0.0)),
        matmul_efficiency=1.0,
        memory_efficiency=1.0,
        attention_efficiency=min(float(v) for v in attn.values()) if attn else 1.0,
    )
    link = data.get("intra_node")
    intra = cluster.intra_node
    if link:
        intra = LinkSpec(name=f"{link.get('backend', 'measured')}", efficiency=1.0,
                         bandwidth_bytes_per_s=float(link["bandwidth_GBps"]) * GB,
                         latency_s=float(link["latency_us"]) * 1e-6,
                         reduce_scatter_factor=float(link.get("reduce_scatter_factor", 1.0)),
                         allgather_factor=float(link.get("all_gather_factor", 1.0)))
    return dataclasses.replace(cluster, device=device, intra_node=intra,
                               name=f"{cluster.name}+calibration")
