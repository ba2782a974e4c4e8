"""Numbers and sizes as people read them: counts, bytes, seconds and dollars. A leaf module."""

from __future__ import annotations

GB = 1e9
"""Bytes in a gigabyte (decimal, as device data sheets count)."""


def human_count(n: float) -> str:
    """1234 -> '1.23 K', 1.7e9 -> '1.7 B'."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def gb(nbytes: float) -> str:
    """Bytes as GB, three significant digits below 100, whole numbers above."""
    x = nbytes / GB
    return f"{x:,.0f} GB" if abs(x) >= 100 else f"{x:.3g} GB"


def gb1(nbytes: float) -> str:
    """Bytes as GB with one decimal, or as MB below 0.1 GB (a small model's 21 MB is not 0.0 GB)."""
    if 0 < abs(nbytes) < 0.1 * GB:
        return f"{nbytes / 1e6:.1f} MB"
    return f"{nbytes / GB:.1f} GB"


def seconds(x: float, digits: int = 4) -> str:
    """Seconds to ``digits`` significant digits, whole and grouped from 10^digits on (1,230 s,
    not 1.23e+03 s)."""
    rounded = float(f"{x:.{digits}g}")  # (999.95 at 3 digits is 1,000)
    return f"{x:,.0f} s" if abs(rounded) >= 10 ** digits else f"{x:.{digits}g} s"


def ms(seconds: float) -> str:
    """Seconds as milliseconds with one decimal: 0.0123 -> '12.3 ms'."""
    return f"{seconds * 1e3:.1f} ms"


def dollars(x: float | None) -> str:
    """'$1,234', '$3.11', '$0.0031'; empty for None."""
    if x is None:
        return ""
    return f"${x:,.0f}" if x >= 100 else f"${x:.2f}" if x >= 0.1 else f"${x:.2g}"


def duration(seconds: float) -> str:
    """A span of time in the largest fitting unit: '2.50 h', '3.3 min', '42.5 s', '9.23 s' (three
    significant figures under a minute: whole seconds hid a 2.6% gain between makespans of 9 s)."""
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.2f} h"
    if abs(seconds) >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def counted(n: int, noun: str) -> str:
    """'1 node', '4 nodes': a count with its noun, plural unless one."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def cluster_text(c) -> str:
    """A cluster summary (Cluster.summary(), a plan's ``cluster``) as people read it:
    '16 x h100 (dgx-h100: 2 nodes x 8)'; with device groups, each group's nodes and device:
    '32 GPUs (a100-plus-v100: a100 2 nodes x 8 a100-80g, v100 2 nodes x 8 v100)'."""
    if c.get("groups"):
        return (f"{c['num_gpus']:,} GPUs ({c['name']}: " + ", ".join(
            f"{g['name']} {counted(g['nodes'], 'node')} x {g['gpus_per_node']} {g['device']}"
            for g in c["groups"]) + ")")
    return (f"{c['num_gpus']:,} x {c['device']} ({c['name']}: {counted(c['nodes'], 'node')} x "
            f"{c['gpus_per_node']})")
