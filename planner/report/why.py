"""The answer to "why not these knobs?" as text (``plan show --why``): what changes with them, or
which stages they do not fit. The answer itself comes from planner.explore.whynot."""

from __future__ import annotations

from planner.planfile.breakdown import BREAKDOWN_WORDS
from planner.planfile.document import Plan
from planner.report import compare
from planner.report.summary import engine_fit
from planner.report.text import knob, pins_text, wrap
from planner.units import GB, gb


def why(plan: Plan, answer) -> str:
    """The answer to ``plan show --why``: what changes with the pinned knobs, or why they do not
    fit (each stage over the device's memory, with what it would need)."""
    pins = pins_text(answer.pins)
    c = plan.cluster
    where = f"{c['num_gpus']:,} x {c['device']}"
    lines = [f"Why not {pins}? (plan: {plan.parallel_summary}, {plan.step_time_s:.4g} s per step)"]
    if answer.feasible:
        v = answer.variant
        kept = f"the plan already has {pins}"
        lead = (f"The plan already has {pins}; the best plan with it" if kept in answer.notes
                else f"With {pins} the best plan")
        lines.append(f"  {lead} on {where} is {v.parallel_summary}:")
        lines += _what_changes(plan, v)
        lines += _engines_lost(plan, v)
        lines += [ln for n in answer.notes or [] if n != kept
                  for ln in wrap(f"  - {n}", indent="    ")]
        return "\n".join(lines)
    lines += wrap(f"  The planner finds no plan with {pins} on {where}: {answer.message}.",
                   indent="    ")
    lines += [ln for n in answer.notes for ln in wrap(f"  - {n}", indent="    ")]
    v = answer.variant
    if v is None:
        return "\n".join(lines)
    usable, device = answer.limits
    lines += wrap(f"  The plan's own configuration with {pins} ({v.parallel_summary}), split "
                   "to balance time:", indent="    ")
    for index, blocks, need, mem in answer.over:
        parts = ", ".join(f"{k} {mem[k] / GB:.3g}" for k in compare.MEMORY_KINDS if mem.get(k))
        lines += wrap(f"  - stage {index} ({blocks}) would need {gb(need)} per GPU ({parts} GB), "
                       f"but each {c['device']} has {gb(device)}, {gb(usable)} usable after "
                       "the reserve", indent="    ")
    if not answer.over:
        lines.append(f"  - every stage fits ({gb(v.predicted['peak_memory_bytes'])} per GPU at "
                     f"most, {gb(usable)} usable)")
    lines.append("  If it ran:")
    lines += _what_changes(plan, v)
    return "\n".join(lines)


def _engines_lost(a: Plan, b: Plan) -> list[str]:
    """Where plan ``a`` was made with --target any and the pinned plan ``b`` leaves the rules of
    an engine ``a`` keeps to, which (a new-user check was offered cp=2 with the ring over
    gpt-oss's attention sinks, which Megatron-LM does not run, and nothing said so)."""
    if a.search.get("target", "any") != "any" or "groups" in a.cluster:
        return []
    runs_a, _ = engine_fit(a)
    runs_b, refused_b = engine_fit(b)
    if not [r for r in runs_a if r not in runs_b]:
        return []
    keeps = f"the rules of {', '.join(runs_b)}, not" if runs_b else "no engine's rules:"
    return wrap(f"    engines: unlike the plan, it keeps to {keeps} {', '.join(refused_b)} (a plan "
                "solved with --target NAME keeps to that engine's)", indent="      ")


def _what_changes(a: Plan, b: Plan) -> list[str]:
    ta, tb = a.step_time_s, b.step_time_s
    verdict = (f"{100 * (tb / ta - 1):+.1f}% step time" if tb != ta else "the same step time")
    lines = [f"    {tb:.4g} s per step ({verdict}; {ta:.4g} s now), "
             f"{b.predicted['tokens_per_s']:,.0f} tokens/s, MFU {100 * b.predicted['mfu']:.1f}%"]
    knobs = ", ".join(f"{k} {knob(x)} -> {knob(y)}"
                      for k, x, y in compare.config_changes(a, b) if k != "num_microbatches")
    lines += wrap(f"    configuration: {knobs or 'unchanged'}", indent="      ")
    for ch in compare.part_changes(a, b):
        lines += wrap(f"    {BREAKDOWN_WORDS[ch.part]} {ch.delta_s:+.3g} s"
                       + (f": {ch.because}" if ch.because else ""), indent="      ")
    pa, pb, moved = compare.memory_change(a, b)
    kinds = ", ".join(f"{k} {d / GB:+.3g} GB" for k, d in moved)
    fullest = [p.stages.index(compare.peak_stage(p)) for p in (a, b)]
    where = ("the fullest GPU" if fullest[0] == fullest[1] else
             f"the fullest GPUs: stage {fullest[0]}'s, then stage {fullest[1]}'s")
    lines += wrap(f"    memory: {gb(pa)} -> {gb(pb)} per GPU at the peak"
                   + (f" ({kinds} on {where})" if kinds else ""), indent="      ")
    return lines
