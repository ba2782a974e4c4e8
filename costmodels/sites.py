"""Clusters spread over sites (regions) joined by slow links: the YAML form, link units, and the
arithmetic of moving bytes between sites.

The form (README.md, "Training across sites")::

    name: two-campuses
    sites:
      - {name: east, device: v100, nodes: 4, gpus_per_node: 8,
         intra_node: {bandwidth: 150GB/s, latency: 3us},
         inter_node: {bandwidth: 5Gbps, latency: 100us, per: node}}
      - {name: west, ...}
    links:
      - {between: [east, west], bandwidth: 1.2Gbps, latency: 30ms, per: site}
    default_link: {bandwidth: 1Gbps, latency: 50ms, per: site}   # pairs not listed

Bandwidths take units (``10Gbps``, ``100 Mbps``, ``1.25GB/s``, ``25 Gb/s``), latencies too
(``30ms``, ``5us``, ``0.5s``): a bare number is refused there (Gb/s or GB/s? ms or us?), and
``bandwidth_GBps`` / ``latency_us`` take plain numbers, as in the single-site form. ``per`` says who owns the figure: each ``gpu``, each ``node`` (its NICs shared by its
GPUs), or the whole ``site`` (one WAN pipe shared by every transfer leaving the site; the default
for links between sites). Inside a site, ``inter_node`` figures are per node by default when
``per: node`` is given and per GPU otherwise, as in the single-site form.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Mapping

from costmodels.errors import SpecError
from costmodels.hardware import GB
from costmodels.topology import (DEFAULT_LINK_EFFICIENCY, LARGEST, SCOPES, US, WAN_EFFICIENCY,
                                 Cluster, HeteroCluster, LinkSpec, SiteLink, cluster_from_mapping,
                                 _check_size)

_NUMBER = re.compile(r"^\s*[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?\s*$")
_BW = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMGT]?)(bps|b/s|B/s|Bps)\s*$")
_LAT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}

_SITES_KEYS = {"name", "sites", "links", "default_link", "description"}
_SITE_KEYS = {"name", "device", "nodes", "gpus_per_node", "intra_node", "inter_node"}
_LINK_KEYS = {"between", "bandwidth", "latency", "per", "efficiency", "bandwidth_GBps",
              "latency_us"}


def parse_bandwidth(value, where: str) -> float:
    """``"10Gbps"`` / ``"1.25GB/s"`` / a number (or its text) of GB/s -> bytes per second."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: expected a bandwidth like 10Gbps or 1.25GB/s, got {value!r}")
    if isinstance(value, (int, float)) or _NUMBER.match(str(value)):
        bps = float(value) * GB
    else:
        m = _BW.match(str(value))
        if not m:
            raise SpecError(f"{where}: expected a bandwidth like 10Gbps, 100Mbps or 1.25GB/s, got "
                            f"{value!r}")
        bps = float(m.group(1)) * _SCALE[m.group(2)]
        if m.group(3) in ("bps", "b/s"):
            bps /= 8
    if not 0 < bps <= LARGEST * GB:
        raise SpecError(f"{where}: expected a positive bandwidth up to {LARGEST:g} GB/s, got "
                        f"{value!r}")
    return bps


def parse_latency(value, where: str) -> float:
    """``"30ms"`` / ``"5us"`` / a number of microseconds -> seconds."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: expected a latency like 30ms or 5us, got {value!r}")
    if isinstance(value, (int, float)):
        s = float(value) * US
    else:
        m = _LAT.match(str(value))
        if not m:
            raise SpecError(f"{where}: expected a latency like 30ms, 5us or 0.2s, got {value!r}")
        s = float(m.group(1)) * _TIME[m.group(2)]
    if not 0 <= s <= 60:
        raise SpecError(f"{where}: expected a latency from 0 to 60 s, got {value!r}")
    return s


def _tier(spec, where: str, name: str) -> dict:
    """A link mapping with units -> the single-site form's {bandwidth_GBps, latency_us, ...}."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: expected a mapping like {{bandwidth: 25Gbps, latency: 10us}}")
    allowed = {"bandwidth", "latency", "efficiency", "name", "bandwidth_GBps", "latency_us", "per"}
    bad = set(spec) - allowed
    if bad:
        raise SpecError(f"{where}.{sorted(bad)[0]}: unknown key; "
                        f"allowed: {', '.join(sorted(allowed))}")
    bw, lat = _bandwidth_latency(spec, where)
    per = spec.get("per", "gpu")
    if per not in ("gpu", "node"):
        raise SpecError(f"{where}.per: expected gpu or node inside a site, got {per!r}")
    return {"bandwidth_GBps": bw / GB, "latency_us": lat / US,
            "efficiency": spec.get("efficiency", DEFAULT_LINK_EFFICIENCY),
            "name": spec.get("name", name),
            "_per": per}


def _bandwidth_latency(spec: Mapping, where: str) -> tuple:
    if "bandwidth" in spec and "bandwidth_GBps" in spec:
        raise SpecError(f"{where}: give bandwidth or bandwidth_GBps, not both")
    if "latency" in spec and "latency_us" in spec:
        raise SpecError(f"{where}: give latency or latency_us, not both")
    if "bandwidth" not in spec and "bandwidth_GBps" not in spec:
        raise SpecError(f"{where}.bandwidth: missing (e.g. bandwidth: 10Gbps)")
    if "latency" not in spec and "latency_us" not in spec:
        raise SpecError(f"{where}.latency: missing (e.g. latency: 30ms)")
    # the unit keys take a unit: a bare number there is ambiguous (Gb/s or GB/s? ms or us?)
    for key, example, plain in (("bandwidth", "10Gbps or 1.25GB/s", "bandwidth_GBps"),
                                ("latency", "30ms or 5us", "latency_us")):
        value = spec.get(key)
        if value is not None and not isinstance(value, bool) and (
                isinstance(value, (int, float)) or _NUMBER.match(str(value))):
            raise SpecError(f"{where}.{key}: {value!r} has no unit; write it with one, like "
                            f"{example}, or give {plain}: {value} for a plain number")
    bw = (parse_bandwidth(spec["bandwidth"], f"{where}.bandwidth") if "bandwidth" in spec
          else parse_bandwidth(spec["bandwidth_GBps"], f"{where}.bandwidth_GBps"))
    lat = (parse_latency(spec["latency"], f"{where}.latency") if "latency" in spec
           else parse_latency(spec["latency_us"], f"{where}.latency_us"))
    return bw, lat


def site_link(spec, where: str) -> SiteLink:
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: expected a mapping like {{between: [a, b], bandwidth: 1Gbps, "
                        "latency: 30ms}")
    bad = set(spec) - _LINK_KEYS
    if bad:
        raise SpecError(f"{where}.{sorted(bad)[0]}: unknown key; "
                        f"allowed: {', '.join(sorted(_LINK_KEYS))}")
    bw, lat = _bandwidth_latency(spec, where)
    per = spec.get("per", "site")
    if per not in SCOPES:
        raise SpecError(f"{where}.per: expected one of {', '.join(SCOPES)}, got {per!r}")
    eff = spec.get("efficiency", WAN_EFFICIENCY)
    if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1:
        raise SpecError(f"{where}.efficiency: expected a number in (0, 1], got {eff!r}")
    return SiteLink(bandwidth_bytes_per_s=bw, latency_s=lat, per=per, efficiency=float(eff))


def sites_from_mapping(spec: Mapping, where: str = "cluster") -> HeteroCluster:
    """The sites YAML form -> a HeteroCluster whose groups are the sites, with a link per pair."""
    bad = set(spec) - _SITES_KEYS
    if bad:
        raise SpecError(f"{where}.{sorted(bad)[0]}: unknown key; "
                        f"allowed: {', '.join(sorted(_SITES_KEYS))}")
    for key in ("name", "sites"):
        if key not in spec:
            raise SpecError(f"{where}.{key}: missing (see the sites form in README.md)")
    sites = spec["sites"]
    if not isinstance(sites, list) or len(sites) < 2:
        raise SpecError(f"{where}.sites: expected a list of at least two sites")
    built, names = [], {}
    for i, site in enumerate(sites):
        here = f"{where}.sites[{i}]"
        if not isinstance(site, Mapping):
            raise SpecError(f"{here}: expected a mapping with keys {', '.join(sorted(_SITE_KEYS))}")
        bad = set(site) - _SITE_KEYS
        if bad:
            raise SpecError(f"{here}.{sorted(bad)[0]}: unknown key; "
                            f"allowed: {', '.join(sorted(_SITE_KEYS))}")
        for key in ("name", "device", "nodes", "gpus_per_node", "intra_node", "inter_node"):
            if key not in site:
                raise SpecError(f"{here}.{key}: missing")
        name = str(site["name"])
        if name in names:
            raise SpecError(f"{here}.name: site '{name}' is listed twice")
        names[name] = i
        gpn = site["gpus_per_node"]
        intra = _tier(site["intra_node"], f"{here}.intra_node", "intra")
        inter = _tier(site["inter_node"], f"{here}.inter_node", "inter")
        for tier in (intra, inter):  # a per-node figure is shared by the node's GPUs
            if tier.pop("_per") == "node" and isinstance(gpn, int) and gpn > 0:
                tier["bandwidth_GBps"] /= gpn
        built.append(cluster_from_mapping({"name": name, "device": site["device"],
                                           "nodes": site["nodes"], "gpus_per_node": gpn,
                                           "intra_node": intra, "inter_node": inter}, here))
    default = (site_link(spec["default_link"], f"{where}.default_link")
               if "default_link" in spec else None)
    links = {}
    for k, ln in enumerate(spec.get("links") or []):
        here = f"{where}.links[{k}]"
        link = site_link(ln, here)
        pair = ln.get("between")
        if not isinstance(pair, list) or len(pair) != 2 or pair[0] == pair[1]:
            raise SpecError(f"{here}.between: expected two different site names, got {pair!r}")
        for p in pair:
            if p not in names:
                raise SpecError(f"{here}.between: unknown site {p!r}; sites: {', '.join(names)}")
        key = tuple(sorted((names[pair[0]], names[pair[1]])))
        if key in links:
            raise SpecError(f"{here}.between: the link {pair[0]}-{pair[1]} is listed twice")
        links[key] = link
    for i in range(len(built)):
        for j in range(i + 1, len(built)):
            if (i, j) not in links:
                if default is None:
                    raise SpecError(f"{where}.links: no link between {built[i].name} and "
                                    f"{built[j].name}; list it or give default_link")
                links[(i, j)] = default
    _check_size(sum(g.num_gpus for g in built), f"{where}.sites")
    slowest = min(links.values(), key=lambda ln: ln.bandwidth_bytes_per_s)
    inter_group = LinkSpec(name="wan", bandwidth_bytes_per_s=slowest.bandwidth_bytes_per_s,
                           latency_s=slowest.latency_s, efficiency=slowest.efficiency)
    return HeteroCluster(name=str(spec["name"]), groups=tuple(built), inter_group=inter_group,
                         description=str(spec.get("description", "")),
                         links=tuple(sorted(links.items())))


def with_site_bandwidth(hc: HeteroCluster, bytes_per_s: float) -> HeteroCluster:
    """Every link between sites set to ``bytes_per_s`` (what-if sweeps)."""
    links = tuple((pair, replace(link, bandwidth_bytes_per_s=bytes_per_s))
                  for pair, link in hc.links)
    return replace(hc, links=links,
                   inter_group=replace(hc.inter_group, bandwidth_bytes_per_s=bytes_per_s))


def group_nodes(cluster: Cluster, gpus: int) -> int:
    """Nodes that ``gpus`` consecutive GPUs of ``cluster`` occupy."""
    return max(1, -(-gpus // cluster.gpus_per_node))
