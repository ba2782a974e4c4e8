"""The grid of a what-if sweep: the keys a sweep may vary, their values parsed and checked, the
points (the cartesian product, first key outermost) and the cluster of one point."""

from __future__ import annotations

import itertools
from dataclasses import fields, replace
from typing import Mapping, Sequence

from costmodels.embeddings import SHARDING_TYPES
from costmodels.errors import suggest
from costmodels.engine import EngineSpec, engine_from_mapping, read_setting
from costmodels.hardware import GB, get_device
from costmodels.linkunits import parse_bandwidth
from costmodels.sites import with_site_bandwidth
from costmodels.topology import Cluster, HeteroCluster
from planner.errors import SpecError
from planner.inputs.calibration import apply_calibration
from planner.inputs.clusters import load_cluster
from planner.options import (DTYPES, FIX_KEYS, OPTIMIZERS, PIPELINES, TABLE_OPTIMIZERS,
                             knob_meant, parse_fix)

CLUSTER_KEYS = ("cluster", "nodes", "gpus_per_node", "device", "inter_node_bandwidth",
                "intra_node_bandwidth", "inter_region_bandwidth")
"""Keys that change the cluster (node bandwidths in GB/s per GPU and direction; the bandwidth of
every link between sites, or of a cluster of device groups' inter_group link, with its unit:
10Gbps or 1.25GB/s, in each link's own scope)."""
UNITS = {"inter_node_bandwidth": "GB/s", "intra_node_bandwidth": "GB/s"}
"""The unit a point's value is in, where it was given in another (400Gbps reads as 50GB/s)."""
TRAINING_KEYS = ("global_batch", "seq_len", "dtype", "optimizer")
ENGINE_KEYS = tuple(f.name for f in fields(EngineSpec))
"""Engine settings (``--engine`` keys: moe_imbalance, moe_dispatcher, attention, ...): each point
runs the sweep's engine with its value."""
TABLE_KEYS = ("sharding", "table_optimizer", "pipeline")
"""A recommendation model's tables: the sharding type every table takes (as ``--fix
sharding=<type>`` pins it in plan solve), their fused optimizer and the train pipeline (plan
solve's --table-optimizer and --pipeline)."""
VARY_KEYS = CLUSTER_KEYS + TRAINING_KEYS + FIX_KEYS + ENGINE_KEYS + TABLE_KEYS


def expand(vary: Mapping[str, Sequence]) -> list[tuple]:
    """The grid: a list of points, each a tuple of (key, value) in ``vary``'s key order. A point
    at cp=1 has no K/V exchange to pick: it drops its cp_comm, and is listed once."""
    if not isinstance(vary, Mapping) or not vary:
        raise SpecError("vary: give at least one key with values, e.g. vary={'nodes': [8, 16]}")
    axes = []
    for key, values in vary.items():
        if key not in VARY_KEYS:
            meant = knob_meant(key)
            raise SpecError(f"vary: unknown key '{key}'" + (
                f"; did you mean {meant}?" if meant else suggest(key, VARY_KEYS)))
        if hasattr(values, "tolist") and not isinstance(values, (str, bytes)):
            values = values.tolist()  # a numpy array (np.arange) as a list of plain numbers
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise SpecError(f"vary.{key}: expected a non-empty list of values, got {values!r}")
        axes.append([(key, value(key, v)) for v in values])
        seen = [parse_bandwidth(v, f"vary.{key}") if key == "inter_region_bandwidth" else v
                for _, v in axes[-1]]
        twice = next(((seen.index(v), i) for i, v in enumerate(seen) if v in seen[:i]), None)
        if twice is not None:
            first, again = (str(values[i]).strip() for i in twice)
            same = (f"{first} given twice" if first == again else
                    f"{first} and {again} are the same value")
            raise SpecError(f"vary.{key}: {same}; list each value once")
    points = []
    for point in itertools.product(*axes):
        if ("cp", 1) in point:
            point = tuple(kv for kv in point if kv[0] != "cp_comm")
        if point not in points:
            points.append(point)
    return points


def sharding_type(raw, where: str) -> str:
    """A TorchRec sharding type (a table pin of a recommendation model); SpecError at ``where``
    for anything else."""
    text = str(raw).strip()
    if text not in SHARDING_TYPES:
        raise SpecError(f"{where}: expected one of {', '.join(SHARDING_TYPES)}, got {raw!r}")
    return text


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
        out[key] = [v.strip() for v in values.split(",")]
        if "" in out[key]:
            raise SpecError(f"vary.{key}: an empty value in '{values}'; list the values with one "
                            "comma between each, e.g. --vary nodes=8,16,32")
    return out


def value(key: str, raw):
    """One value of ``key``, converted and checked (SpecError names key and value)."""
    if key in FIX_KEYS:
        return parse_fix({key: raw}, where="vary")[key]
    if key in ENGINE_KEYS:  # a value of the wrong kind is refused here; what is out of range or
        text = str(raw).strip()  # depends on other settings is that point's row (with the reason)
        try:
            engine_from_mapping({key: text})
        except SpecError as exc:
            if str(exc).startswith(f"engine.{key}: expected"):
                raise SpecError(f"vary.{str(exc)[len('engine.'):]}") from None
        return read_setting(key, text)  # one spelling per value: on and true are one point
    if key in ("nodes", "gpus_per_node", "global_batch", "seq_len"):
        try:
            value = int(raw)
        except (TypeError, ValueError):
            value = 0
        if isinstance(raw, bool) or value < 1 or (isinstance(raw, float) and raw != value):
            raise SpecError(f"vary.{key}: expected a positive integer, got {raw!r}")
        return value
    if key == "inter_region_bandwidth":  # units required, as in the sites form of a cluster file:
        try:                            # links between sites are quoted in Gb/s, nodes' in GB/s
            float(str(raw))
        except ValueError:
            parse_bandwidth(raw, f"vary.{key}")
            return str(raw).strip()
        raise SpecError(f"vary.{key}: {raw!r} has no unit (Gb/s or GB/s?); write it as "
                        f"{raw}Gbps or {raw}GB/s")
    if key.endswith("_bandwidth"):  # GB/s per GPU: a number, or with units (100Gbps)
        return parse_bandwidth(raw, f"vary.{key}") / GB
    if key == "device":
        get_device(str(raw), "vary.device")
        return str(raw)
    if key == "sharding":
        return sharding_type(raw, "vary.sharding")
    for name, allowed in (("table_optimizer", TABLE_OPTIMIZERS), ("pipeline", PIPELINES)):
        if key == name:
            if str(raw).strip() not in allowed:
                raise SpecError(f"vary.{key}: expected one of {', '.join(allowed)}, got {raw!r}")
            return str(raw).strip()
    if key == "dtype" and raw not in DTYPES:
        raise SpecError(f"vary.dtype: unknown dtype {raw!r}; use one of {', '.join(DTYPES)}")
    if key == "optimizer" and raw not in OPTIMIZERS:
        raise SpecError(f"vary.optimizer: unknown optimizer {raw!r}; use one of "
                        f"{', '.join(OPTIMIZERS)}")
    if key == "cluster":
        load_cluster(raw)  # fails early on an unknown preset or a bad file
    return raw


def point_engine(engine: EngineSpec, point: Sequence[tuple]) -> EngineSpec:
    """``engine`` with the point's engine settings (ENGINE_KEYS) in place (SpecError when the
    combination is refused)."""
    changes = {k: v for k, v in point if k in ENGINE_KEYS}
    if not changes:
        return engine
    return engine_from_mapping({**{f.name: getattr(engine, f.name) for f in fields(EngineSpec)},
                                **changes})


def point_cluster(s: Mapping) -> Cluster | HeteroCluster:
    """The cluster of one point: the preset or file, resized, with its device or links swapped."""
    changes = [k for k in ("device", "inter_node_bandwidth", "intra_node_bandwidth") if k in s]
    cl = load_cluster(s["cluster"])
    if "inter_region_bandwidth" in s:  # every link between sites, or the groups' inter_group
        if not isinstance(cl, HeteroCluster):
            raise SpecError("vary.inter_region_bandwidth: applies to a cluster of sites or of "
                            "device groups (the link between them); this cluster has one kind of "
                            "node; vary inter_node_bandwidth for the link between its nodes")
        cl = with_site_bandwidth(cl, parse_bandwidth(s["inter_region_bandwidth"],
                                                     "vary.inter_region_bandwidth"))
    if isinstance(cl, HeteroCluster) and s.get("calibration") is not None:
        raise SpecError("calibration: applies to one device type; not to a cluster with groups")
    if isinstance(cl, HeteroCluster):
        given = [f"{k}={s[k]}" for k in ("nodes", "gpus_per_node") if s[k]] + changes
        if given:
            form = "sites" if cl.is_sites else "node groups"
            raise SpecError(f"cluster {s['cluster']}: has {form}, which {', '.join(given)} "
                            f"cannot resize or change (each sets its own); give them in the YAML "
                            "file, and for other sizes or links vary files "
                            "(--vary cluster=a.yaml,b.yaml)" + (
                                "; for the links between the sites, inter_region_bandwidth"
                                if cl.is_sites else ""))
        return cl
    cl = load_cluster(cl, nodes=s["nodes"], gpus_per_node=s["gpus_per_node"])
    if s.get("calibration") is not None:  # measured figures, before a varied link replaces one
        if "device" in s:
            raise SpecError("vary.device: a calibration measures one device; vary the device "
                            "without --calibration, or leave device out of --vary")
        cl = apply_calibration(cl, s["calibration"])
    if "device" in s:
        cl = replace(cl, device=get_device(s["device"], "vary.device"))
    for key, tier in (("inter_node_bandwidth", "inter_node"),
                      ("intra_node_bandwidth", "intra_node")):
        if key in s:  # (a figure per GPU, as the key says, whoever owned the file's figure)
            link = replace(getattr(cl, tier), bandwidth_bytes_per_s=s[key] * GB, per="gpu")
            cl = replace(cl, **{tier: link})
    return cl
