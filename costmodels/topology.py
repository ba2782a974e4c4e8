"""Clusters: nodes, GPUs per node, and the link tiers between them.

A "node" is one domain of the fast tier: the GPUs a tensor-parallel group may span. For an NVL72
rack that is the whole rack (72 GPUs on one NVLink Switch fabric), so ``--nodes`` counts racks.

Link figures are per GPU and per direction (the share of the node's links one GPU can drive); the
efficiency is NCCL's all-reduce bus bandwidth over that line rate, measured where a source is
named, assumed where the entry says so. Latencies (3 us on a GPU fabric, 10 us across nodes) are
the same conventions for every tier.
- NVLink 3 (A100): 600 GB/s bidirectional per GPU -> 300 GB/s each way; NCCL all-reduce bus
  bandwidth inside a DGX A100 is about 230 GB/s (reference data README) -> efficiency 0.77.
- NVLink 4 (H100/H200): 900 GB/s bidirectional -> 450 GB/s each way; about 370 GB/s measured inside
  an H100 node (reference data README) -> efficiency 0.82.
- NVLink 5 (B200, B300, GB200/GB300 NVL72): 1.8 TB/s bidirectional per GPU through NVLink
  Switches (NVIDIA DGX B200 data sheet: 14.4 TB/s aggregate for 8 GPUs; GB200 NVL72 page: 130 TB/s
  for 72 GPUs) -> 900 GB/s each way, the same to any GPU of the domain (8 in a DGX/HGX, 72 in an
  NVL72 rack). Efficiency 0.82 is assumed (NVLink 4's measured ratio), not measured on NVLink 5
  by a vendor (a third-party nccl-tests run across two GB200 trays with NVLink SHARP reports
  811 GB/s bus bandwidth, 0.90, so 0.82 errs on the slow side).
- All-to-all on NVLink runs below the all-reduce: NVIDIA's Megatron-Core MoE report (arXiv
  2603.07685, Table 7) times the expert-parallel token exchange of DeepSeek-V3's shape (4,096
  tokens of hidden 7,168, top-8 of 256 experts, BF16: 470 MB of copies per GPU) with NCCL's
  all-to-all and with HybridEP. On GB200 NVL72, ep 8-64 inside the rack, dispatch and combine,
  both backends: NCCL's 735-930 us for the all-to-all's (n-1)/n of 470 MB, efficiency
  0.55-0.67 of 900 GB/s; HybridEP's 353-744 us for the copies it sends (counted as
  costmodels.experts.node_sends counts them), 0.53-0.70; mean 0.63 over the 16 timings (each
  less the 3 us latency). On H100, ep 8 inside a node: 0.72 (all-to-all) and 0.63-0.67
  (HybridEP) of 450 GB/s, mean 0.68. So ``alltoall_efficiency`` is 0.63 on NVLink 5 (measured
  on GB200, taken for B200/B300/GB300 as the same NVLink 5 switch fabric) and 0.68 on NVLink 4
  (H100 and H200), and not set elsewhere (no measurement: the all-reduce's). The same table's
  H100 timings across 2-8 nodes agree with InfiniBand's 0.90 within 0-10%
  (tests/costmodels/test_comm.py holds the table and derives both means from it).
- InfiniBand: DGX A100 has 8 x 200 Gb/s HDR (25 GB/s per GPU), DGX H100 8 x 400 Gb/s NDR (50 GB/s
  per GPU); NCCL reaches about 90% of line rate across nodes. DGX B200: 8 x ConnectX-7 up to
  400 Gb/s (DGX B200 data sheet) -> 50 GB/s per GPU. DGX B300: 8 x ConnectX-8 up to 800 Gb/s
  (nvidia.com/en-us/data-center/dgx-b300, 2025) -> 100 GB/s per GPU (XDR). GB200 NVL72 racks:
  one ConnectX-7 400 Gb/s InfiniBand NIC per GPU (4 per compute tray of 4 GPUs; NVIDIA DGX
  SuperPOD with DGX GB200 reference architecture, 2025) -> 50 GB/s. GB300 NVL72: one ConnectX-8
  SuperNIC at 800 Gb/s per GPU (GB300 NVL72 page; 4 ConnectX-8 per compute tray of 4 GPUs, NVIDIA
  Enterprise Reference Architecture for GB300 NVL72, 2025) -> 100 GB/s. The 0.90 efficiency is
  assumed for XDR as measured for NDR.
- AMD Infinity Fabric (MI300X platform): each GPU has 7 links, one to each other GPU of the 8
  (a full mesh, no switch), at 64 GB/s per direction each (128 GB/s bidirectional; AMD ROCm blog
  "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025: 448 GB/s
  aggregate unidirectional per GPU). The ring/all-reduce model takes one per-GPU one-way
  bandwidth: RCCL runs enough rings/channels over the mesh that an 8-GPU collective drives all
  7 links at once, so the tier is 7 x 64 = 448 GB/s per GPU. The same blog measures RCCL
  all_reduce_perf at 315-319 GB/s bus bandwidth (1-16 GB messages, 8 GPUs) -> efficiency 0.71
  (measured). Caveat: a group of g < 8 GPUs has only g - 1 links between its members, so it gets
  (g - 1)/7 of this bandwidth (the blog and RCCL's docs say so); the model prices it at the full
  figure, which is optimistic for tensor-parallel groups of 2 or 4.
  Inter-node: one 400 Gb/s NIC per GPU (AMD ROCm docs, "vLLM distributed inference with MoRI",
  2026: 8 x ConnectX-7 per MI300X node, 1:1 with the GPUs; Azure ND MI300X v5: 8 x 400 Gb/s NDR
  InfiniBand) -> 50 GB/s.
- PCIe 4.0 x16: 32 GB/s each way, efficiency 0.75 assumed (with peer-to-peer). GeForce cards have
  no peer-to-peer, so traffic is staged through host memory, which halves it again (efficiency
  0.4, assumed).
- V100 DGX-1: NVLink 2 hybrid cube mesh, 6 links x 25 GB/s each way per GPU (efficiency 0.80,
  assumed); 4 x 100 Gb/s EDR per node (6.25 GB/s per GPU).
- 10 Gb/s Ethernet: 1.25 GB/s, 50 us, efficiency 0.80 assumed. The ``cpu`` preset's loopback
  (2 GB/s, 50 us, 0.80) is a guess for gloo between processes of one host, which ``plan profile``
  replaces by measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from costmodels.errors import SpecError, suggest, unknown_key
from costmodels.hardware import (DEVICES, GB, US, DeviceSpec, _fraction, device_mapping,
                                 get_device)
from costmodels.linkunits import link_figures
from costmodels.specs import positive_int

DEFAULT_LINK_EFFICIENCY = 0.8
"""Share of the line rate collectives reach on a link whose cluster file gives no
``efficiency``: assumed, between NVLink's measured 0.77-0.82 and InfiniBand's 0.90 (above)."""


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """One link tier, per GPU and per direction."""

    bandwidth_bytes_per_s: float
    """Line rate in bytes/s, per GPU, one direction."""
    latency_s: float
    """Per-message latency in seconds (the alpha of the alpha-beta model)."""
    efficiency: float = DEFAULT_LINK_EFFICIENCY
    """Fraction of the line rate collectives reach (NCCL bus bandwidth / line rate)."""
    alltoall_efficiency: float | None = None
    """Fraction of the line rate an exchange between all members reaches: NCCL's all-to-all,
    and DeepEP's or HybridEP's token dispatch and combine, where every GPU sends to every other
    at once (None: ``efficiency``). Measured below the all-reduce's on NVLink (module
    docstring)."""
    name: str = ""
    """Tier name for explanations (``nvlink``, ``ib``, ``pcie``, ``loopback``)."""
    per: str = "gpu"
    """Who owns the figure in the cluster file: ``gpu`` (each GPU its own), or ``node`` (the
    node's NICs together, ``per: node``), in which case ``bandwidth_bytes_per_s`` is one GPU's
    share of it, re-split when the cluster is given another GPU count per node
    (``with_overrides``): a node's NICs do not multiply with the GPUs put in it."""
    reduce_scatter_factor: float = 1.0
    """Measured reduce-scatter time over the ring model (``plan profile``; gloo runs it as an
    all-reduce plus a copy, about 2x)."""
    allgather_factor: float = 1.0
    """Measured all-gather time over the ring model."""
    sync_s: float = 0.0
    """What one synchronizing call (a collective; a send/receive pair too where ``p2p_sync_s`` is
    not measured) costs on top of the alpha-beta model when the ranks compute between calls:
    measured by ``plan profile`` on CPUs, where every core runs a rank's compute thread, so the
    backend's own threads must wait for a core, and the ranks' skew shows at every call
    (planner.profile.collectives.busy_sync_s: 0.8-1.4 ms on this project's 2-core VM against
    0.2-0.7 ms for the same call between idle ranks). Paid once per call and never hidden behind
    compute. 0 where not measured (GPUs: NCCL's kernels queue on the device behind the compute)."""
    p2p_latency_s: float | None = None
    """Measured latency of one point-to-point message (``plan profile``: every rank sending to
    the next and receiving from the previous at once, as a pipeline's or a ring's sends run);
    None: ``latency_s``, the all-reduce fit's per step."""
    p2p_bytes_per_s: float | None = None
    """Measured bandwidth of those messages; None: ``effective_bytes_per_s``."""
    p2p_sync_s: float | None = None
    """What one send/receive pair costs on top of the point-to-point fit when the ranks compute
    between calls, as ``sync_s`` for a collective (``plan profile`` on CPUs:
    planner.profile.collectives.busy_exchange_s; 1.8-2.0 ms on this project's 2-core VM where
    ``sync_s`` read 0.8-1.7 ms, 2026-12-06); None: ``sync_s``."""

    @property
    def effective_bytes_per_s(self) -> float:
        """Achievable bandwidth in bytes/s."""
        return self.bandwidth_bytes_per_s * self.efficiency

    @property
    def alltoall_bytes_per_s(self) -> float:
        """Achievable bandwidth in bytes/s of an exchange between all members (all-to-all)."""
        return self.bandwidth_bytes_per_s * (self.efficiency if self.alltoall_efficiency is None
                                             else self.alltoall_efficiency)

    @property
    def message_latency_s(self) -> float:
        """Latency of one point-to-point message: measured, else the all-reduce fit's."""
        return self.latency_s if self.p2p_latency_s is None else self.p2p_latency_s

    @property
    def message_sync_s(self) -> float:
        """What a send/receive pair costs more between busy ranks: measured, else ``sync_s``."""
        return self.sync_s if self.p2p_sync_s is None else self.p2p_sync_s

    @property
    def message_bytes_per_s(self) -> float:
        """Bandwidth of point-to-point messages: measured, else the collectives'."""
        return self.effective_bytes_per_s if self.p2p_bytes_per_s is None else self.p2p_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """A homogeneous cluster: ``nodes`` x ``gpus_per_node`` devices of one kind."""

    name: str
    """Preset or YAML name."""
    device: DeviceSpec
    """The accelerator in every slot."""
    nodes: int
    """Number of nodes."""
    gpus_per_node: int
    """Devices per node (they share the intra-node tier)."""
    intra_node: LinkSpec
    """Tier between devices of one node."""
    inter_node: LinkSpec
    """Tier between nodes (per GPU: its share of the node's NICs)."""
    description: str = ""
    """One line for ``plan clusters``."""

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def link_for_span(self, span: int) -> LinkSpec:
        """The slowest tier a group crosses whose members lie within ``span`` consecutive ranks."""
        return self.intra_node if span <= self.gpus_per_node else self.inter_node

    def summary(self) -> dict:
        """Plain-data summary for the plan JSON."""
        return {
            "name": self.name,
            "device": self.device.name,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "num_gpus": self.num_gpus,
            "device_memory_bytes": self.device.memory_bytes,
            "intra_node_GBps": self.intra_node.bandwidth_bytes_per_s / GB,
            "inter_node_GBps": self.inter_node.bandwidth_bytes_per_s / GB,
            "spec": self.to_mapping(),
        }

    def to_mapping(self) -> dict:
        """The YAML form that ``cluster_from_mapping`` reads back into this cluster (a preset
        device by name; any other device as its mapping, which holds the fields YAML can set)."""
        d = self.device
        preset = DEVICES.get(d.name)
        device = d.name if preset == d else device_mapping(d)
        return {"name": self.name, "device": device, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node,
                "intra_node": _link_mapping(self.intra_node, self.gpus_per_node),
                "inter_node": _link_mapping(self.inter_node, self.gpus_per_node),
                **({"description": self.description} if self.description else {})}


def _link_mapping(link: LinkSpec, gpus_per_node: int | None = None) -> dict:
    """The YAML form of ``link``: a per-node link as the node's figure with ``per: node`` where
    the GPUs sharing it are known (so a plan's spec, resized again, splits the node's figure
    anew), else the figure per GPU."""
    node = link.per == "node" and bool(gpus_per_node)
    bandwidth_GBps = link.bandwidth_bytes_per_s / GB * (gpus_per_node if node else 1)
    return {"bandwidth_GBps": bandwidth_GBps, "latency_us": round(link.latency_s / US, 6),
            "efficiency": link.efficiency,
            **({"alltoall_efficiency": link.alltoall_efficiency}
               if link.alltoall_efficiency is not None else {}),
            "name": link.name, **({"per": "node"} if node else {})}


def _link(name: str, gbps: float, latency_us: float, efficiency: float,
          alltoall: float | None = None) -> LinkSpec:
    return LinkSpec(name=name, bandwidth_bytes_per_s=gbps * GB, latency_s=latency_us * US,
                    efficiency=efficiency, alltoall_efficiency=alltoall)


NVLINK3 = _link("nvlink", 300, 3, 0.77)
NVLINK4 = _link("nvlink", 450, 3, 0.82, alltoall=0.68)
NVLINK2 = _link("nvlink", 150, 3, 0.80)
NVLINK5 = _link("nvlink", 900, 3, 0.82, alltoall=0.63)
XGMI_MI300X = _link("xgmi", 7 * 64, 3, 0.71)
IB_HDR = _link("ib", 25, 10, 0.90)
IB_NDR = _link("ib", 50, 10, 0.90)
IB_EDR = _link("ib", 6.25, 10, 0.90)
IB_XDR = _link("ib", 100, 10, 0.90)
PCIE4_NO_P2P = _link("pcie", 32, 10, 0.40)
PCIE4 = _link("pcie", 32, 10, 0.75)
ETH_10G = _link("ethernet", 1.25, 50, 0.80)
LOOPBACK = _link("loopback", 2.0, 50, 0.80)


def _preset(name, device, gpn, intra, inter, description) -> Cluster:
    return Cluster(name=name, device=get_device(device), nodes=1, gpus_per_node=gpn,
                   intra_node=intra, inter_node=inter, description=description)


CLUSTERS: dict[str, Cluster] = {
    c.name: c
    for c in (
        _preset("dgx-a100-80g", "a100-80g", 8, NVLINK3, IB_HDR, "DGX A100: 8 x A100 80 GB, NVSwitch, 8 x HDR IB"),
        _preset("dgx-a100-40g", "a100-40g", 8, NVLINK3, IB_HDR, "DGX A100: 8 x A100 40 GB, NVSwitch, 8 x HDR IB"),
        _preset("dgx-h100", "h100", 8, NVLINK4, IB_NDR, "DGX H100: 8 x H100 SXM, NVSwitch, 8 x NDR IB"),
        _preset("hgx-h200", "h200", 8, NVLINK4, IB_NDR, "HGX H200: 8 x H200 SXM, NVSwitch, 8 x NDR IB"),
        _preset("dgx-b200", "b200", 8, NVLINK5, IB_NDR, "DGX B200: 8 x B200, NVLink 5 / NVSwitch, 8 x 400 Gb/s IB"),
        _preset("dgx-b300", "b300", 8, NVLINK5, IB_XDR, "DGX B300: 8 x B300, NVLink 5 / NVSwitch, 8 x 800 Gb/s IB"),
        _preset("gb200-nvl72", "gb200", 72, NVLINK5, IB_NDR, "GB200 NVL72: a node is a rack of 72 GPUs on one NVLink domain, 400 Gb/s IB per GPU"),
        _preset("gb300-nvl72", "gb300", 72, NVLINK5, IB_XDR, "GB300 NVL72: a node is a rack of 72 GPUs on one NVLink domain, 800 Gb/s IB per GPU"),
        _preset("mi300x-8", "mi300x", 8, XGMI_MI300X, IB_NDR, "8 x MI300X, Infinity Fabric full mesh, 400 Gb/s NIC per GPU"),
        _preset("dgx1-v100", "v100", 8, NVLINK2, IB_EDR, "DGX-1: 8 x V100 32 GB, NVLink cube mesh, 4 x EDR IB"),
        _preset("l4-8", "l4", 8, PCIE4, ETH_10G, "8 x L4 on PCIe 4.0, 10 GbE between nodes"),
        _preset("pcie-4090", "rtx4090", 4, PCIE4_NO_P2P, ETH_10G, "4 x RTX 4090 on PCIe 4.0 (no P2P), 10 GbE"),
        _preset("cpu", "cpu", 2, LOOPBACK, ETH_10G, "this host: 2 CPU processes over gloo (estimate; run `plan profile`)"),
    )
}

_CLUSTER_KEYS = {"name", "device", "nodes", "gpus_per_node", "intra_node", "inter_node", "description"}
_LINK_KEYS = {"bandwidth", "latency", "bandwidth_GBps", "latency_us", "efficiency",
              "alltoall_efficiency", "name", "per"}


def get_cluster(name: str, *, nodes: int | None = None, gpus_per_node: int | None = None) -> Cluster:
    """A preset by name, with optional node / GPU-per-node overrides."""
    key = str(name).lower()
    if key not in CLUSTERS:
        raise SpecError(f"cluster: unknown cluster '{name}'{suggest(key, CLUSTERS)} "
                        f"(or pass a YAML file)")
    return with_overrides(CLUSTERS[key], nodes=nodes, gpus_per_node=gpus_per_node)


def with_overrides(cluster: Cluster, *, nodes: int | None = None,
                   gpus_per_node: int | None = None) -> Cluster:
    """The cluster resized; values must be positive integers. A link given ``per: node`` keeps
    the node's figure: its share per GPU is split again among the new GPU count per node (a
    new-user check read 4 GPUs' shares of a 25 Gb/s node NIC for 8 GPUs per node)."""
    changes: dict = {}
    if nodes is not None:
        changes["nodes"] = positive_int(nodes, "nodes")
    if gpus_per_node is not None:
        gpn = changes["gpus_per_node"] = positive_int(gpus_per_node, "gpus_per_node")
        for tier in ("intra_node", "inter_node"):
            link = getattr(cluster, tier)
            if link.per == "node" and gpn != cluster.gpus_per_node:
                share = link.bandwidth_bytes_per_s * cluster.gpus_per_node / gpn
                changes[tier] = replace(link, bandwidth_bytes_per_s=share)
    resized = replace(cluster, **changes) if changes else cluster
    _check_size(resized.num_gpus, "nodes")
    return resized


MAX_GPUS = 2 ** 20
"""The largest cluster accepted (1,048,576 GPUs; today's largest training clusters hold a few
hundred thousand): beyond it a node count is a typo, and the search would enumerate its divisors
for minutes."""


def _check_size(num_gpus: int, where: str) -> None:
    if num_gpus > MAX_GPUS:
        raise SpecError(f"{where}: {num_gpus:,} GPUs in all; the planner takes at most "
                        f"{MAX_GPUS:,}; check nodes and gpus_per_node")


def cluster_from_mapping(spec: Mapping, where: str = "cluster") -> Cluster:
    """Strictly load the YAML form of a cluster file (README.md) (already parsed into a mapping)."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: expected a mapping with keys {', '.join(sorted(_CLUSTER_KEYS))}")
    unknown = set(spec) - _CLUSTER_KEYS
    if unknown:
        raise unknown_key(where, unknown, _CLUSTER_KEYS)
    for key in ("name", "device", "nodes", "gpus_per_node", "intra_node", "inter_node"):
        if key not in spec:
            need = (" (a one-node cluster uses it only when --nodes or a what-if grows it: give "
                    "the network its nodes would have, e.g. {bandwidth: 400Gbps, latency: 5us})"
                    if key == "inter_node" and spec.get("nodes") == 1 else "")
            raise SpecError(f"{where}.{key}: missing{need or ' (e.g. ' + KEY_EXAMPLES[key] + ')'}"
                            " (see the cluster YAML form in README.md)")
    gpn = positive_int(spec["gpus_per_node"], f"{where}.gpus_per_node")
    cluster = Cluster(
        name=str(spec["name"]),
        device=get_device(spec["device"], f"{where}.device"),
        nodes=positive_int(spec["nodes"], f"{where}.nodes"),
        gpus_per_node=gpn,
        intra_node=link_from_mapping(spec["intra_node"], f"{where}.intra_node", "intra", gpn),
        inter_node=link_from_mapping(spec["inter_node"], f"{where}.inter_node", "inter", gpn),
        description=str(spec.get("description", "")),
    )
    _check_size(cluster.num_gpus, f"{where}.nodes")
    return cluster


def link_from_mapping(spec: Mapping, where: str, default_name: str,
                      gpus_per_node: int | None = None, no_width: str = "",
                      fix: str = "give the figure per GPU (per: gpu, the default)") -> LinkSpec:
    """``{bandwidth_GBps, latency_us[, efficiency, alltoall_efficiency, name, per]}`` (or
    ``bandwidth``, ``latency``
    with units: costmodels.linkunits) -> LinkSpec, per GPU: ``per: node`` gives the node's
    figure (its NICs together), shared by its ``gpus_per_node`` GPUs, as the sites form reads it;
    ``no_width`` says why there is no one GPU count per node, where ``gpus_per_node`` is None."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"{where}: expected a mapping like {{bandwidth_GBps: 25, latency_us: 10}}")
    unknown = set(spec) - _LINK_KEYS
    if unknown:
        raise unknown_key(where, unknown, _LINK_KEYS)
    bandwidth, latency = link_figures(spec, where)
    per = spec.get("per", "gpu")
    if per not in ("gpu", "node"):
        raise SpecError(f"{where}.per: expected gpu or node (a node's figure, shared by its "
                        f"GPUs), got {per!r}")
    if per == "node" and not gpus_per_node:
        raise SpecError(f"{where}.per: node shares a node's figure among its GPUs, but "
                        f"{no_width or 'this link has no one GPU count per node'}; {fix}")
    if per == "node":
        bandwidth /= gpus_per_node
    return LinkSpec(
        name=str(spec.get("name", default_name)), per=per,
        bandwidth_bytes_per_s=bandwidth,
        latency_s=latency,
        efficiency=_fraction(spec.get("efficiency", DEFAULT_LINK_EFFICIENCY),
                             f"{where}.efficiency"),
        alltoall_efficiency=None if spec.get("alltoall_efficiency") is None else _fraction(
            spec["alltoall_efficiency"], f"{where}.alltoall_efficiency"),
    )




KEY_EXAMPLES = {"name": "name: dc-east", "device": "device: h100", "nodes": "nodes: 2",
                "gpus_per_node": "gpus_per_node: 8",
                "intra_node": "intra_node: {bandwidth: 900GB/s, latency: 3us}",
                "inter_node": "inter_node: {bandwidth: 400Gbps, latency: 5us}"}
"""An example line for each key a cluster or a site must give, for the error that it is
missing."""


SCOPES = ("gpu", "node", "site")
"""Who shares a link figure between sites: each GPU has it, each node, or the whole site."""


WAN_EFFICIENCY = 0.8
"""Fraction of a WAN link's rate that bulk transfers reach (TCP, many streams): assumed, not
measured (a link's own ``efficiency`` in the sites YAML replaces it)."""


@dataclass(frozen=True, kw_only=True)
class SiteLink:
    """The link between two sites (regions), one direction."""

    bandwidth_bytes_per_s: float
    latency_s: float
    per: str = "site"
    """Whether the bandwidth is each GPU's, each node's or the whole site's (SCOPES)."""
    efficiency: float = WAN_EFFICIENCY
    """Fraction of the line rate transfers reach (TCP over a WAN)."""

    def transfer_s(self, nbytes: float, gpus: int, nodes: int, messages: int = 1) -> float:
        """Seconds to move ``nbytes`` in all from ``gpus`` GPUs on ``nodes`` nodes of one site to
        the other, all at once: the figure times the senders that own a share of it."""
        if nbytes <= 0:
            return 0.0
        share = {"gpu": max(1, gpus), "node": max(1, nodes), "site": 1}[self.per]
        return messages * self.latency_s + nbytes / (self.bandwidth_bytes_per_s * share *
                                                     self.efficiency)

    def per_gpu(self, gpus: int, nodes: int) -> LinkSpec:
        """The LinkSpec each of ``gpus`` concurrent senders sees."""
        share = {"gpu": max(1, gpus), "node": max(1, nodes), "site": 1}[self.per]
        return LinkSpec(name="wan", bandwidth_bytes_per_s=self.bandwidth_bytes_per_s * share /
                        max(1, gpus), latency_s=self.latency_s, efficiency=self.efficiency)

    def to_mapping(self) -> dict:
        return {"bandwidth_GBps": self.bandwidth_bytes_per_s / GB,
                "latency_us": round(self.latency_s / US, 6), "per": self.per,
                "efficiency": self.efficiency}


@dataclass(frozen=True, kw_only=True)
class HeteroCluster:
    """Groups of nodes that differ in device or links (two GPU generations, two sites), joined by
    an ``inter_group`` tier (the slowest link between any two groups), or, for sites, by a link
    per pair of sites (``links``)."""

    name: str
    groups: tuple[Cluster, ...]
    """Each group is a homogeneous cluster (device, nodes, GPUs per node, its own links)."""
    inter_group: LinkSpec
    """Tier between groups, per GPU and direction (e.g. a WAN link between sites)."""
    description: str = ""
    links: tuple = ()
    """Sites: ((i, j), SiteLink) for each pair of groups i < j (costmodels.sites); empty: every
    pair is joined by ``inter_group``."""

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)

    @property
    def is_sites(self) -> bool:
        return bool(self.links)

    def site_link(self, g: int, h: int) -> SiteLink:
        """The link between groups ``g`` and ``h`` (sites form), either direction."""
        key = (min(g, h), max(g, h))
        for pair, link in self.links:
            if tuple(pair) == key:
                return link
        ig = self.inter_group
        return SiteLink(bandwidth_bytes_per_s=ig.bandwidth_bytes_per_s, latency_s=ig.latency_s,
                        per="gpu", efficiency=ig.efficiency)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "device": "+".join(dict.fromkeys(g.device.name for g in self.groups)),  # (each once)
            "nodes": sum(g.nodes for g in self.groups),
            "gpus_per_node": max(g.gpus_per_node for g in self.groups),
            "num_gpus": self.num_gpus,
            "device_memory_bytes": min(g.device.memory_bytes for g in self.groups),
            "groups": [{**g.summary(), "name": g.name} for g in self.groups],
            "inter_group_GBps": self.inter_group.bandwidth_bytes_per_s / GB,
            **({"links": [{"between": [self.groups[i].name, self.groups[j].name],
                           **link.to_mapping()} for (i, j), link in self.links]}
               if self.links else {}),
            "spec": self.to_mapping(),
        }

    def to_mapping(self) -> dict:
        """The YAML form that reads back into this cluster: the sites form
        (costmodels.sites.sites_from_mapping; every pair's link listed) where it has links per
        pair, else the groups form (hetero_from_mapping)."""
        members = [{k: v for k, v in g.to_mapping().items() if k != "description"}
                   for g in self.groups]
        text = {"description": self.description} if self.description else {}
        if self.links:
            return {"name": self.name, "sites": members, **text,
                    "links": [{"between": [self.groups[i].name, self.groups[j].name],
                               **link.to_mapping()} for (i, j), link in self.links]}
        return {"name": self.name, "groups": members, **text,
                "inter_node": members[0]["inter_node"],  # (each group gives its own)
                "inter_group": _link_mapping(self.inter_group)}


_HETERO_KEYS = {"name", "groups", "inter_node", "inter_group", "description"}
_GROUP_KEYS = {"name", "device", "nodes", "gpus_per_node", "intra_node", "inter_node"}


def hetero_from_mapping(spec: Mapping, where: str = "cluster") -> HeteroCluster:
    """The heterogeneous YAML form: ``groups`` of nodes plus the links between them."""
    unknown = set(spec) - _HETERO_KEYS
    if unknown:
        raise unknown_key(where, unknown, _HETERO_KEYS)
    groups = spec.get("groups")
    if groups is not None and (not isinstance(groups, list) or len(groups) < 2):
        raise SpecError(f"{where}.groups: expected a list of at least two node groups (one kind "
                        "of node needs no groups: give name, device, nodes, intra_node and "
                        "inter_node)")
    for key in ("name", "groups", "inter_node"):
        if key not in spec:
            raise SpecError(f"{where}.{key}: missing (see the heterogeneous cluster form in README.md)")
    widths = {g.get("gpus_per_node") for g in groups if isinstance(g, Mapping)}
    width = next(iter(widths)) if len(widths) == 1 else None
    no_width = "the groups have " + " and ".join(sorted(map(str, widths))) + " GPUs per node"
    # the shared link's own figures checked where the file gives them (each group reads them
    # again, with its own GPUs per node, below)
    link_from_mapping(spec["inter_node"], f"{where}.inter_node", "inter", width or 1)
    built = []
    for i, g in enumerate(groups):
        here = f"{where}.groups[{i}]"
        if not isinstance(g, Mapping):
            raise SpecError(f"{here}: expected a mapping with keys {sorted(_GROUP_KEYS)}")
        bad = set(g) - _GROUP_KEYS
        if bad:
            raise unknown_key(here, bad, _GROUP_KEYS)
        full = {"inter_node": spec["inter_node"], **g}
        full.setdefault("name", f"group{i}")
        if any(b.name == str(full["name"]) for b in built):
            raise SpecError(f"{here}.name: {full['name']!r} names an earlier group too; give each "
                            "group its own name (plans and reports tell them apart by it)")
        built.append(cluster_from_mapping(full, here))
    # (each group reads inter_node with its own GPUs per node; without inter_group it also joins
    # the groups, where a node's figure needs one GPU count per node)
    inter_group = (link_from_mapping(spec["inter_group"], f"{where}.inter_group", "inter-group",
                                     width, no_width) if "inter_group" in spec else
                   link_from_mapping(spec["inter_node"], f"{where}.inter_node", "inter", width,
                                     no_width + ", and with no inter_group it joins the groups "
                                     "too", "give inter_group (the link between the groups), or "
                                     "inter_node's figure per GPU (per: gpu, the default)"))
    _check_size(sum(g.num_gpus for g in built), f"{where}.groups")
    return HeteroCluster(name=str(spec["name"]), groups=tuple(built), inter_group=inter_group,
                         description=str(spec.get("description", "")))
