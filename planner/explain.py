"""Compare two plans: what differs in the configuration, and where the step time moved.

Returns data (and one-line summaries); printing is the CLI's job.
"""

from __future__ import annotations

from planner.emit import BREAKDOWN_WORDS
from planner.plan import Plan

KNOBS = ("dp", "tp", "pp", "vpp", "micro_batch", "num_microbatches", "schedule", "recompute",
         "zero", "sequence_parallel", "offload_optimizer", "placement")


def config_changes(a: Plan, b: Plan) -> list[tuple[str, object, object]]:
    """(knob, value in a, value in b) for every knob that differs."""
    return [(k, a.parallel.get(k), b.parallel.get(k)) for k in KNOBS
            if a.parallel.get(k) != b.parallel.get(k)]


def breakdown_changes(a: Plan, b: Plan) -> list[tuple[str, float, float]]:
    """(part, seconds in a, seconds in b) for each part of the step, largest change first."""
    ba, bb = a.predicted["breakdown"], b.predicted["breakdown"]
    parts = [(k, ba.get(k, 0.0), bb.get(k, 0.0)) for k in BREAKDOWN_WORDS]
    return sorted(parts, key=lambda p: -abs(p[2] - p[1]))


def summary(a: Plan, b: Plan, parts: int = 3) -> str:
    """'b is 12.3% faster than a: tp 8 -> 4, recompute full -> selective; compute -1.2 s, ...'."""
    ta, tb = a.step_time_s, b.step_time_s
    rel = (ta - tb) / ta
    verdict = (f"{100 * rel:.1f}% faster" if rel > 0 else
               f"{-100 * rel:.1f}% slower" if rel < 0 else "as fast")
    knobs = ", ".join(f"{k} {_fmt(x)} -> {_fmt(y)}" for k, x, y in config_changes(a, b)
                      if k != "num_microbatches") or "same configuration"
    moved = ", ".join(f"{BREAKDOWN_WORDS[k]} {y - x:+.3g} s" for k, x, y in
                      breakdown_changes(a, b)[:parts] if abs(y - x) > 1e-9 * max(ta, tb))
    return f"{verdict}: {knobs}" + (f"; {moved}" if moved else "")


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)
