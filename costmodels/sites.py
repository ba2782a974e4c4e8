"""Clusters spread over sites (regions) joined by slow links: the YAML form and the arithmetic of
moving bytes between sites (link figures with units: costmodels.linkunits).

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

import itertools
from dataclasses import replace
from typing import Mapping, Sequence

from costmodels.errors import SpecError, unknown_key
from costmodels.hardware import GB, US
from costmodels.linkunits import link_figures
from costmodels.specs import positive_int
from costmodels.topology import (DEFAULT_LINK_EFFICIENCY, KEY_EXAMPLES, SCOPES, WAN_EFFICIENCY,
                                 Cluster, HeteroCluster, LinkSpec, SiteLink, cluster_from_mapping,
                                 _check_size)

_SITES_KEYS = {"name", "sites", "links", "default_link", "description"}
_SITE_KEYS = {"name", "device", "nodes", "gpus_per_node", "intra_node", "inter_node"}
_LINK_KEYS = {"between", "bandwidth", "latency", "per", "efficiency", "bandwidth_GBps",
              "latency_us"}


def _tier(spec, where: str, name: str) -> dict:
    """A link mapping with units -> the single-site form's {bandwidth_GBps, latency_us, ...}."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: expected a mapping like {{bandwidth: 25Gbps, latency: 10us}}")
    allowed = {"bandwidth", "latency", "efficiency", "alltoall_efficiency", "name",
               "bandwidth_GBps", "latency_us", "per"}
    bad = set(spec) - allowed
    if bad:
        raise unknown_key(where, bad, allowed)
    bw, lat = link_figures(spec, where)
    per = spec.get("per", "gpu")
    if per not in ("gpu", "node"):
        raise SpecError(f"{where}.per: expected gpu or node inside a site, got {per!r}")
    return {"bandwidth_GBps": bw / GB, "latency_us": lat / US,
            "efficiency": spec.get("efficiency", DEFAULT_LINK_EFFICIENCY),
            **({"alltoall_efficiency": spec["alltoall_efficiency"]}
               if spec.get("alltoall_efficiency") is not None else {}),
            "name": spec.get("name", name),
            "_per": per}


def site_link(spec, where: str) -> SiteLink:
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: expected a mapping like {{between: [a, b], bandwidth: 1Gbps, "
                        "latency: 30ms}")
    bad = set(spec) - _LINK_KEYS
    if bad:
        raise unknown_key(where, bad, _LINK_KEYS)
    bw, lat = link_figures(spec, where)
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
        raise unknown_key(where, bad, _SITES_KEYS)
    for key in ("name", "sites"):
        if key not in spec:
            raise SpecError(f"{where}.{key}: missing (see the sites form in README.md)")
    sites = spec["sites"]
    if not isinstance(sites, list) or len(sites) < 2:
        raise SpecError(f"{where}.sites: expected a list of at least two sites; one site is a "
                        "plain cluster: its keys (device, nodes, gpus_per_node, intra_node, "
                        "inter_node) at the top of the file, without sites and links")
    built, names = [], {}
    for i, site in enumerate(sites):
        here = f"{where}.sites[{i}]"
        if not isinstance(site, Mapping):
            raise SpecError(f"{here}: expected a mapping with keys {', '.join(sorted(_SITE_KEYS))}")
        bad = set(site) - _SITE_KEYS
        if bad:
            raise unknown_key(here, bad, _SITE_KEYS)
        for key in ("name", "device", "nodes", "gpus_per_node", "intra_node", "inter_node"):
            if key not in site:
                raise SpecError(f"{here}.{key}: missing (e.g. {KEY_EXAMPLES[key]}; see the sites "
                                "form in README.md)")
        name = str(site["name"])
        if name in names:
            raise SpecError(f"{here}.name: site '{name}' is listed twice")
        names[name] = i
        gpn = positive_int(site["gpus_per_node"], f"{here}.gpus_per_node")
        intra = _tier(site["intra_node"], f"{here}.intra_node", "intra")
        inter = _tier(site["inter_node"], f"{here}.inter_node", "inter")
        for tier in (intra, inter):  # a per-node figure is shared by the node's GPUs
            if tier.pop("_per") == "node":
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
    """Every link between sites set to ``bytes_per_s``, each in its own scope (``per``), and the
    link between device groups, per GPU (what-if sweeps)."""
    links = tuple((pair, replace(link, bandwidth_bytes_per_s=bytes_per_s))
                  for pair, link in hc.links)
    return replace(hc, links=links,
                   inter_group=replace(hc.inter_group, bandwidth_bytes_per_s=bytes_per_s))


def group_nodes(cluster: Cluster, gpus: int) -> int:
    """Nodes that ``gpus`` consecutive GPUs of ``cluster`` occupy."""
    return max(1, -(-gpus // cluster.gpus_per_node))


RING_ORDERS_UP_TO = 8
"""Sites up to which every ring order is tried (7! at 8, each ring in both directions); beyond,
the listed order."""


def replicas_allreduce_s(nbytes: float, hc: HeteroCluster, members: Sequence[int],
                         calls: int = 1) -> tuple[float, tuple[int, ...]]:
    """(seconds, ring order) to all-reduce ``nbytes`` (one replica's gradients) across the sites
    ``members``, each site holding one replica set whose GPUs all hold a share: the hierarchical
    all-reduce of HSDP and of Megatron-LM's partial distributed optimizer (reduce-scattered inside
    each site, the shards all-reduced across the sites in a ring, all-gathered inside again; the
    parts inside a site are its own data-parallel traffic, priced with its plan). In the ring each
    site sends 2 (k - 1) / k of the bytes to the next, every GPU its share at once, on the link
    between the two as its scope (``per``) shares it, with 2 (k - 1) latencies; the ring takes its
    slowest link's time, and the order whose slowest link is fastest is taken. ``calls``: the
    all-reduces the bytes are sent in (an engine's gradient buckets), run one after the other on
    one communicator, so each pays the ring's latencies."""
    k = len(members)
    if k < 2 or nbytes <= 0:
        return 0.0, tuple(members)
    sent = 2.0 * (k - 1) / k * nbytes

    def edge_s(g: int, h: int) -> float:
        site = hc.groups[g]
        return hc.site_link(g, h).transfer_s(sent, site.num_gpus, site.nodes,
                                             messages=2 * (k - 1) * max(1, calls))

    edges = {(g, h): edge_s(g, h) for g in members for h in members if g != h}  # (each once)
    first, rest = members[0], list(members[1:])
    orders = [(first, *p) for p in itertools.permutations(rest)] if k <= RING_ORDERS_UP_TO \
        else [tuple(members)]
    best = min(orders, key=lambda o: max(edges[o[i], o[(i + 1) % k]] for i in range(k)))
    return max(edges[best[i], best[(i + 1) % k]] for i in range(k)), best
