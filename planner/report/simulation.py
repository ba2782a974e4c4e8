"""A plan's pipeline simulated under its own schedule and under another, side by side
(``plan simulate``)."""

from __future__ import annotations

from planner.planfile.document import Plan
from planner.report.text import listing
from planner.schedule.simulator import SimResult
from planner.units import gb


def comparison(plan: Plan, base: SimResult, other: SimResult, schedule: str,
               vpp: int | None) -> str:
    """Step time, bubble, peak in-flight micro-batches and activations of ``base`` (the plan's
    own schedule) and ``other`` (``schedule`` with ``vpp`` chunks per rank), and the change."""
    par = plan.parallel
    own_v = f" x{par.get('vpp', 1)}" if par.get("vpp", 1) > 1 else ""
    new_v = f" x{vpp}" if vpp and vpp > 1 else ""
    rows = [("", f"plan: {par['schedule']}{own_v}", f"{schedule}{new_v}", "change"),
            ("micro-batches", str(base.microbatches), str(other.microbatches), ""),
            ("pipeline time", f"{base.step_time_s:.4g} s", f"{other.step_time_s:.4g} s",
             f"{other.step_time_s - base.step_time_s:+.3f} s "
             f"({100 * (other.step_time_s / base.step_time_s - 1):+.1f}%)"),
            ("bubble (of pipeline time)", f"{base.bubble_fraction:.1%}", f"{other.bubble_fraction:.1%}",
             f"{round(100 * (other.bubble_fraction - base.bubble_fraction), 1) + 0.0:+.1f} points"),
            ("peak in flight", str(max(base.peak_in_flight)), str(max(other.peak_in_flight)),
             f"{max(other.peak_in_flight) - max(base.peak_in_flight):+d}"),
            ("peak activations", gb(max(base.peak_activation_bytes)),
             gb(max(other.peak_activation_bytes)),
             f"{(max(other.peak_activation_bytes) - max(base.peak_activation_bytes)) / 1e9:+.3g} GB")]
    lines = [f"{plan.model.get('name', 'model')}: pp={par['pp']}, per-micro-batch times from the "
             f"plan; pipeline only (no data-parallel sync or optimizer step)\n",
             listing(rows),
             "\npeak in flight: (stage, micro-batch) activations held by the busiest rank; "
             "with vpp > 1 each is one chunk of the rank's layers"]
    if other.microbatches != base.microbatches:
        mb = par.get("micro_batch", 1)
        per = (f"{base.step_time_s / base.microbatches:.4g} s -> "
               f"{other.step_time_s / other.microbatches:.4g} s")
        lines.append(f"note: {other.microbatches} micro-batches of {mb} is "
                     f"{other.microbatches * mb:,} samples per replica a step, not the plan's "
                     f"{base.microbatches * mb:,}: a different batch, so compare the time per "
                     f"micro-batch ({per}), not the step")
    if schedule == "bidirectional":
        lines.append("bidirectional keeps two copies of every stage's weights, gradients and "
                     "optimizer state (not counted above)")
    return "\n".join(lines)
