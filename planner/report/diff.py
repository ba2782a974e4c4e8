"""Two plans side by side as text: every difference, with its change from A to B."""

from __future__ import annotations

from planner.planfile.document import Plan
from planner.report import compare
from planner.report.text import knob, table, wrap
from planner.units import GB, gb, human_count, seconds


ALWAYS = ("predicted", "step time by part")
"""Sections shown in full; the others list only what differs."""


def diff(a: Plan, b: Plan, names: tuple[str, str] | None = None,
         max_stage_rows: int = 12) -> str:
    """Two plans side by side: every difference, with its change from A to B. ``names``: what
    A and B stand for (their files); by default each plan's model and configuration."""
    if names is None:
        names = (_named(a), _named(b))
    rows = [("", "A", "B", "change")]
    same, section, stage_rows = [], None, 0
    for d in compare.compare(a, b):
        if d.section not in ALWAYS and not d.differs:
            if d.section in ("inputs", "configuration") and d.a is not None:
                same.append(f"{d.label} {_value(d.a, d.kind)}")
            continue
        if d.section == "step time by part" and not d.a and not d.b:
            continue  # a part neither plan has (a pipeline bubble without pipelines)
        if d.section == "stages" and d.label != "stages":
            stage_rows += 1
            if stage_rows > max_stage_rows:
                continue
        if d.section != section:
            rows.append((d.section, "", "", ""))
            section = d.section
        rows.append((f"  {d.label}", _value(d.a, d.kind), _value(d.b, d.kind),
                     _change(d.a, d.b, d.kind)))
    head = [f"A = {names[0]}", f"B = {names[1]}",
            f"B is {compare.headline(a, b)}" if a.step_time_s != b.step_time_s else
            f"B takes as long as A: {compare.headline(a, b).split(': ', 1)[-1]}", ""]
    tail = ([f"  ... and {stage_rows - max_stage_rows} more stage rows differ"]
            if stage_rows > max_stage_rows else [])
    if same:
        tail += ["", *wrap("same in both: " + ", ".join(same))]
    return "\n".join(head + table(rows) + tail)


def _named(p: Plan) -> str:
    """A plan without a file, in words: its model and configuration."""
    return f"{p.model.get('name', 'a plan')}: {p.parallel_summary}"


def _value(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "s":
        return seconds(v)
    if kind == "bytes":
        return gb(v)
    if kind == "frac":
        return f"{100 * v:.1f}%"
    if kind == "rate":
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if kind == "count" and isinstance(v, int) and not isinstance(v, bool) and v >= 1e6:
        return human_count(v)
    return knob(v)


def _factor(r: float) -> str:
    """A ratio of ten and more: three digits, whole from a thousand on (x126, x12,528)."""
    return f"{r:,.0f}" if float(f"{r:.3g}") >= 1000 else f"{r:.3g}"


def _change(a, b, kind: str) -> str:
    if a is None or b is None or kind == "text" or a == b:
        return ""
    if isinstance(a, bool) or isinstance(b, bool):
        return ""
    d = b - a
    ratio = b / a if a else None  # ten times or a tenth and beyond reads as a factor
    pct = ("" if ratio is None else f" (x{_factor(ratio)})" if ratio >= 10 else
           f" (/{_factor(1 / ratio)})" if 0 < ratio <= 0.1 else f" ({100 * d / a:+.1f}%)")
    if kind == "s":
        return f"{'-' if d < 0 else '+'}{seconds(abs(d), 3)}{pct}"
    if kind == "bytes":
        return f"{d / GB:+.3g} GB{pct}"
    if kind == "frac":
        return f"{100 * d:+.1f} points"
    if kind == "rate":
        return pct.strip(" ()")
    if a > 0 and b > 0 and (b % a == 0 or a % b == 0):
        return f"x{b // a}" if b > a else f"/{a // b}"
    if abs(d) >= 1e6 and isinstance(d, int):
        return ("+" if d > 0 else "-") + human_count(abs(d)) + pct
    return f"{d:+g}"
