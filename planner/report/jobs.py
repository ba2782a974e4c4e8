"""A joint schedule of many jobs (a planner.jobs/v1 document) as a person reads it: one row per
job, then the makespan and the baselines."""

from __future__ import annotations

from planner.report.text import model_name, runs, table
from planner.solve.job_schedule import TIE_BREAK
from planner.units import cluster_text, counted, duration


def summary(doc: dict, solve_time_s: float) -> str:
    """The schedule as a person reads it: one row per job, then makespan and baselines."""
    c = doc["cluster"]
    lines = [f"Joint schedule of {counted(len(doc['jobs']), 'job')} on {cluster_text(c)}"
             + (f", re-planned at {duration(doc['now_s'])} (done: {', '.join(doc['done']) or '-'})"
                if doc["now_s"] else ""), ""]
    rows = [("job", "model", "GPUs", "nodes", "GPU ids", "start", "end", "state", "plan")]
    for j in sorted(doc["jobs"], key=lambda j: (j["start_s"], j["gpu_ids"])):
        rows.append((j["name"], model_name(j["model"]), str(j["gpus"]), _ranges(j["nodes"]),
                     _ranges(j["gpu_ids"]), duration(j["start_s"]), duration(j["end_s"]),
                     j["state"], j["parallel"]))
    lines += ["  " + line for line in table(rows)]
    s = doc["solve"]
    lines += ["", f"  makespan      {duration(doc['makespan_s'])}  (CP-SAT {s['status']}, "
                  f"gap {100 * s['gap']:.1f}%, objective {doc['objective']}, solved in "
                  f"{solve_time_s:.1f} s, grid {s['time_unit_s']:g} s)"]
    tie = s.get("tie_break", "not run")
    if tie in ("optimal", "feasible"):
        lines.append(f"  {'':<13} ties broken by {TIE_BREAK[doc['objective']]} (CP-SAT {tie})")
    elif tie in ("none found", "discarded"):
        lines.append(f"  {'':<13} ties not broken: " + (
            "the second solve found no schedule within its limit" if tie == "none found" else
            "the tie-broken schedule came out worse in exact seconds; the first one is kept"))
    for name, b in doc["baselines"].items():
        word = "shorter" if b["improvement"] >= 0 else "longer"
        lines.append(f"  {name:<13} {duration(b['makespan_s'])}  ({b['description']}): joint "
                     f"schedule is {100 * abs(b['improvement']):.1f}% {word}"
                     + (f"; it misses the deadline of {', '.join(b['late'])}"
                        if b.get("late") else "")
                     + (f" (the solve places jobs on a {s['time_unit_s']:g} s grid, each "
                        "duration rounded up to it: in exact seconds a baseline can end a "
                        "little sooner)" if _grid_rounding(doc, b) else ""))
    if doc["objective"] == "weighted":  # what the solve minimized, next to the makespans
        lines += _weighted(doc)
    return "\n".join(lines)


def _grid_rounding(doc: dict, b: dict) -> bool:
    """Whether a baseline ending sooner than the joint schedule is the grid's rounding: the
    schedule minimized its makespan, proven optimal on the grid, and the baseline is within a
    grid step per job of it (a weighted objective or a solve cut short has other reasons)."""
    s = doc["solve"]
    return (b["improvement"] < 0 and not b.get("late") and doc["objective"] == "makespan"
            and s["status"] == "optimal"
            and doc["makespan_s"] - b["makespan_s"] <= s["time_unit_s"] * len(doc["jobs"]))


def _weighted(doc: dict) -> list[str]:
    """The weighted completion time (the sum of each job's priority x its end) of the joint
    schedule and of each baseline."""
    priority = {j["name"]: j.get("priority", 1) for j in doc["jobs"]}

    def total(jobs) -> float:
        return sum(priority.get(j["name"], 1) * j["end_s"] for j in jobs)

    joint = total(doc["jobs"])
    lines = [f"  weighted completion (sum of priority x end): {duration(joint)} joint"]
    for name, b in doc["baselines"].items():
        other = total(b["jobs"])
        rel = (other - joint) / other if other > 0 else 0.0
        lines.append(f"  {'':<13} {duration(other)} {name}: joint schedule's is "
                     f"{100 * abs(rel):.1f}% {'lower' if rel >= 0 else 'higher'}")
    return lines


def _ranges(ids) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs(ids))
