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


def ms(seconds: float) -> str:
    """Seconds as milliseconds with one decimal: 0.0123 -> '12.3 ms'."""
    return f"{seconds * 1e3:.1f} ms"


def dollars(x: float | None) -> str:
    """'$1,234', '$3.11', '$0.0031'; empty for None."""
    if x is None:
        return ""
    return f"${x:,.0f}" if x >= 100 else f"${x:.2f}" if x >= 0.1 else f"${x:.2g}"


def duration(seconds: float) -> str:
    """A span of time in the largest fitting unit: '2.50 h', '3.3 min', '42 s'."""
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.2f} h"
    if abs(seconds) >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
