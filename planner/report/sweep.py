"""What-if sweeps as a table: one line per point (planner.explore.sweep rows)."""

from __future__ import annotations

import textwrap

from costmodels.errors import PlannerError
from costmodels.hardware import get_device
from planner.options import parallel_text
from planner.report.summary import moe_accuracy
from planner.units import dollars, gb, human_count, seconds
from planner.report.text import table


def sweep_table(rows: list[dict], reason_width: int = 110, rate: str = "tokens/s") -> str:
    """One line per what-if row: the point, GPUs, the chosen configuration and what it gives;
    an infeasible point shows its reason instead, a point that is not valid input (a varied pin
    the model cannot take) why not. ``rate``: "tokens/s", or "samples/s" for a
    recommendation model (a sample is not a sequence of tokens: its costs are per sample too)."""
    costs = any(r.get("cost_per_step_usd") is not None for r in rows)
    days = any(r.get("run_hours") is not None for r in rows)
    run = any(r.get("run_cost_usd") is not None for r in rows)
    # MFU is against each point's own peak (its dtype's on its device): where points differ
    # there, MFU does not rank them and the header says so
    peaks = {_peak(r) for r in rows if r["feasible"]}
    head = ["point", "GPUs", "configuration", "step", rate,
            "MFU (own peak)" if len(peaks) > 1 else "MFU", "memory/GPU"]
    rate_key = {"tokens/s": "tokens_per_s", "samples/s": "samples_per_s"}[rate]
    unit = "tokens" if rate == "tokens/s" else "samples"
    head += ["$/step", f"$/M {unit}"] if costs else []
    head += [f"days ({human_count(rows[0]['tokens'])} {unit})"] if days else []
    head += ["$ run"] if run else []
    out, reasons, cut = [tuple(head)], {}, []
    for r in rows:
        cells = [r["point"], str(r["gpus"] or "")]
        if not r["feasible"]:
            word = "not valid: " if r.get("bad_input") else "infeasible: "
            reasons[len(out)] = word + (r["reason"] if len(r["reason"]) <= reason_width
                                        else r["reason"][:reason_width - 3] + "...")
            if len(r["reason"]) > reason_width:
                cut.append(f"  {r['point']}: {r['reason']}")
            out.append((*cells, *[""] * (len(head) - 2)))
            continue
        layout = parallel_text(r) + (f"; tables {r['tables']}" if r.get("tables") else "")
        cells += [layout, seconds(r["step_time_s"], 3), f"{r[rate_key]:,.0f}",
                  f"{100 * r['mfu']:.1f}%", gb(r["peak_memory_bytes"])]
        if costs:
            cells += [dollars(r.get("cost_per_step_usd")), dollars(r.get("cost_per_mtok_usd"))]
        if days:
            hours = r.get("run_hours")
            cells += ["" if hours is None else f"{hours / 24:,.1f}" if hours >= 24 else
                      f"{hours / 24:.2f}" if hours >= 0.24 else "<0.01"]
        if run:
            cells += [dollars(r.get("run_cost_usd"))]
        out.append(tuple(cells))
    lines = table(out)
    for i, reason in reasons.items():  # reasons run across the columns, not widening one
        lines[i] = lines[i].rstrip().ljust(len(lines[0].split("configuration")[0])) + reason
    if cut:
        lines += ["", "reasons cut short above, in full:", *cut]
    slower = _slower_with_more(rows)
    if slower:
        lines += ["", *slower]
    if any(r.get("routed_experts") for r in rows):  # as plan show says under an MoE step time
        waits = any(r.get("moe_host_wait_s") for r in rows)
        lines += ["", *textwrap.wrap(moe_accuracy(waits).replace("as here", "as at some points"),
                                     100, subsequent_indent="  ")]
    return "\n".join(lines)


SIZE_KNOBS = ("nodes", "gpus_per_node")
"""The what-if knobs that change how many GPUs a point has and nothing else."""


def _slower_with_more(rows: list[dict]) -> list[str]:
    """A line for each point that steps slower than a point with fewer GPUs and otherwise the same
    knobs (the step cannot use the extra GPUs: a batch too small to split, communication that
    grows faster than the work shrinks), naming the fastest such point."""
    def rest(r: dict) -> tuple:  # the point's knobs other than its size
        return tuple(p for p in str(r["point"]).split() if p.split("=")[0] not in SIZE_KNOBS)

    timed = [r for r in rows if r["feasible"] and r.get("gpus")]
    out = []
    for r in timed:
        fewer = [o for o in timed if rest(o) == rest(r) and o["gpus"] < r["gpus"]
                 and o["step_time_s"] < r["step_time_s"] * (1 - 0.01)]
        if fewer:
            best = min(fewer, key=lambda o: o["step_time_s"])
            out += textwrap.wrap(
                f"{r['point']} ({r['gpus']} GPUs) steps slower than {best['point']} "
                f"({best['gpus']} GPUs): {seconds(r['step_time_s'], 3)} against "
                f"{seconds(best['step_time_s'], 3)}; the extra GPUs cost more than they give "
                "(a batch too small to split over them, communication that grows faster than "
                "the work shrinks): a larger global batch, or fewer GPUs", 100,
                subsequent_indent="  ")
    return out


def _peak(row: dict):
    """The peak FLOP/s a row's MFU counts against: its dtype's on its device (a preset), or the
    pair of names where the device is none."""
    try:
        return get_device(str(row.get("device"))).peak(row.get("dtype"))
    except PlannerError:
        return str(row.get("device")), row.get("dtype")
