"""`plan clusters`: the cluster presets."""

from __future__ import annotations

from costmodels.topology import CLUSTERS
from planner.report.text import listing
from planner.units import gb


def register(add) -> None:
    c = add("clusters", help="list the cluster presets")
    c.set_defaults(func=run)


def run(args) -> int:
    rows = [("name", "device", "gpus/node", "memory", "intra GB/s", "inter GB/s", "description")]
    for c in CLUSTERS.values():
        rows.append((c.name, c.device.name, str(c.gpus_per_node),
                     gb(c.device.memory_bytes),
                     f"{c.intra_node.bandwidth_bytes_per_s / 1e9:g}",
                     f"{c.inter_node.bandwidth_bytes_per_s / 1e9:g}", c.description))
    print(listing(rows))
    print("\nResize with --nodes / --gpus-per-node, or describe your own in YAML (see README).")
    return 0
