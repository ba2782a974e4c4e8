"""Resolve a cluster argument: a preset name, a YAML file, a mapping or a Cluster."""

from __future__ import annotations

import logging
import os
from typing import Mapping

from costmodels.topology import (CLUSTERS, Cluster, HeteroCluster, cluster_from_mapping,
                                 get_cluster, hetero_from_mapping, with_overrides)
from costmodels.sites import sites_from_mapping
from planner.errors import SpecError
from planner.files import as_path, read_yaml
from planner.inputs.calibration import apply_calibration

log = logging.getLogger(__name__)


def load_cluster(spec, *, nodes: int | None = None,
                 gpus_per_node: int | None = None) -> Cluster | HeteroCluster:
    """Preset name, path to a YAML file, mapping or Cluster -> Cluster (with overrides); a YAML
    file or mapping with ``groups`` or ``sites`` gives a HeteroCluster."""
    path_given = isinstance(spec, os.PathLike)  # (a pathlib.Path is a file, whatever its name)
    if path_given:
        spec = as_path(spec, "cluster")
    if isinstance(spec, HeteroCluster):
        return _no_overrides(spec, nodes, gpus_per_node)
    if isinstance(spec, Cluster):
        cluster = spec
    elif isinstance(spec, Mapping):
        if "sites" in spec:
            return _no_overrides(sites_from_mapping(spec), nodes, gpus_per_node)
        if "groups" in spec:
            return _no_overrides(hetero_from_mapping(spec), nodes, gpus_per_node)
        cluster = cluster_from_mapping(spec)
    elif isinstance(spec, str) and (path_given or spec.endswith((".yaml", ".yml"))
                                    or os.path.sep in spec or os.path.splitext(spec)[1] != ""):
        data = _read_yaml(spec)
        if "sites" in data:
            return _no_overrides(sites_from_mapping(data, where=os.path.basename(spec)), nodes,
                                 gpus_per_node)
        if "groups" in data:
            return _no_overrides(hetero_from_mapping(data, where=os.path.basename(spec)), nodes,
                                 gpus_per_node)
        cluster = cluster_from_mapping(data, where=os.path.basename(spec))
    elif isinstance(spec, str):
        if spec.lower() not in CLUSTERS and os.path.isfile(spec):  # (no preset has a suffix)
            raise SpecError(f"cluster: '{spec}' is a file here, and a name without a suffix or "
                            f"folder is read as a preset; give it as ./{spec}")
        preset = get_cluster(spec)
        if isinstance(gpus_per_node, int) and gpus_per_node > preset.gpus_per_node \
                and preset.intra_node.name == "nvlink":  # (an NVLink domain has a size)
            log.warning("cluster %s: --gpus-per-node %d puts %d GPUs on one NVLink domain, "
                        "where its nodes hold %d: they are priced as one node of that size "
                        "(describe another machine in a cluster file)", preset.name,
                        gpus_per_node, gpus_per_node, preset.gpus_per_node)
        return get_cluster(spec, nodes=nodes, gpus_per_node=gpus_per_node)
    else:
        raise SpecError(f"cluster: expected a preset name ({', '.join(CLUSTERS)}), a YAML path (a "
                        f"str or pathlib.Path) or a mapping, got {type(spec).__name__}")
    return with_overrides(cluster, nodes=nodes, gpus_per_node=gpus_per_node)


def planned_cluster(record: Mapping, what: str) -> Cluster | HeteroCluster:
    """The cluster a plan was made for, from its record (Plan.cluster): the form its file had
    (groups or sites), its mapping, or its preset; with the calibration that priced it applied
    again where the plan records one (the device's mapping keeps what a cluster file can set, not
    the measured GEMM tables: without them a calibrated plan was re-priced 26% faster by its
    own `plan show --why`). ``what``: what needs it, for the error."""
    name = record.get("name")
    if "groups" in record and "spec" in record:
        return load_cluster(record["spec"])
    if "groups" in record:
        raise SpecError(f"{what}: the plan does not record the groups of cluster '{name}' in "
                        "full; re-create it with this planner version")
    if "spec" in record:
        cluster = cluster_from_mapping(record["spec"], where="plan.cluster.spec")
    elif name in CLUSTERS:
        cluster = get_cluster(name, nodes=record["nodes"], gpus_per_node=record["gpus_per_node"])
    else:
        raise SpecError(f"{what}: the plan does not record cluster '{name}' in full; re-create "
                        "it with this planner version")
    calibration = record.get("calibration")
    return cluster if calibration is None else apply_calibration(cluster, calibration)


def _no_overrides(cluster: HeteroCluster, nodes, gpus_per_node) -> HeteroCluster:
    if nodes is not None or gpus_per_node is not None:
        raise SpecError("nodes: --nodes/--gpus-per-node do not apply to a cluster with node groups; "
                        "edit the groups in its YAML file")
    return cluster


def _read_yaml(path: str) -> dict:
    data = read_yaml(path, what="cluster")
    if not isinstance(data, dict):
        raise SpecError(f"{os.path.basename(path)}: expected a mapping of cluster keys "
                        "(name, device, nodes, gpus_per_node, intra_node, inter_node)")
    return data
