"""A plan's pipeline simulated under its own schedule and under another, side by side
(``plan simulate``)."""

from __future__ import annotations

from costmodels.memory import usable_bytes
from planner.options import SearchOptions
from planner.planfile.document import Plan
from planner.report.text import listing
from planner.schedule.simulator import SimResult
from planner.units import counted, gb


def comparison(plan: Plan, base: SimResult, other: SimResult, schedule: str,
               vpp: int | None) -> str:
    """Step time, bubble, peak in-flight micro-batches and activations of ``base`` (the plan's
    own schedule) and ``other`` (``schedule`` with ``vpp`` chunks per rank), and the change."""
    par = plan.parallel
    new_v = f" x{vpp}" if vpp and vpp > 1 else ""
    own_v = f" x{par.get('vpp', 1)}" if par.get("vpp", 1) > 1 else ""
    same_batch = other.microbatches == base.microbatches
    per = [r.step_time_s / r.microbatches for r in (base, other)]
    rows = [("", f"plan: {par['schedule']}{own_v}", f"{schedule}{new_v}", "change"),
            ("micro-batches", str(base.microbatches), str(other.microbatches), ""),
            ("pipeline time", f"{base.step_time_s:.4g} s", f"{other.step_time_s:.4g} s",
             f"{other.step_time_s - base.step_time_s:+.3f} s " + (
                 f"({100 * (other.step_time_s / base.step_time_s - 1):+.1f}%)" if same_batch
                 else "(another batch)")),
            *([] if same_batch else [
                ("per micro-batch", f"{per[0]:.4g} s", f"{per[1]:.4g} s",
                 f"{100 * (per[1] / per[0] - 1):+.1f}%")]),
            ("idle (of pipeline time)", f"{base.bubble_fraction:.1%}", f"{other.bubble_fraction:.1%}",
             f"{round(100 * (other.bubble_fraction - base.bubble_fraction), 1) + 0.0:+.1f} points"),
            ("peak in flight", str(max(base.peak_in_flight)), str(max(other.peak_in_flight)),
             f"{max(other.peak_in_flight) - max(base.peak_in_flight):+d}"),
            ("peak activations", gb(max(base.peak_activation_bytes)),
             gb(max(other.peak_activation_bytes)),
             f"{(max(other.peak_activation_bytes) - max(base.peak_activation_bytes)) / 1e9:+.3g} GB")]
    memory = rank_memory(plan, base, other, twice=schedule == "bidirectional")
    if memory is not None:
        own_peak, new_peak, _ = memory
        rows.append(("peak memory per GPU", gb(own_peak), gb(new_peak),
                     f"{(new_peak - own_peak) / 1e9:+.3g} GB"))
    lines = [f"{plan.model.get('name', 'model')}: pp={par['pp']}, per-micro-batch times from the "
             f"plan; pipeline only (no data-parallel sync or optimizer step)\n",
             listing(rows),
             "\nidle: the ranks' mean time without a pass to run, the bubble and any wait for "
             "sends between stages (plan show counts those waits as pipeline sends, apart)",
             "peak in flight: (stage, micro-batch) activations held by the busiest rank; "
             "with vpp > 1 each is one chunk of the rank's layers"]
    if other.microbatches != base.microbatches:
        mb = par.get("micro_batch", 1)
        per = (f"{base.step_time_s / base.microbatches:.4g} s -> "
               f"{other.step_time_s / other.microbatches:.4g} s")
        n = other.microbatches
        lines.append(f"note: {n:,} micro-batch{'' if n == 1 else 'es'} of {mb} "
                     f"{'is' if other.microbatches == 1 else 'are'} "
                     f"{counted(other.microbatches * mb, 'sample')} per replica a step, not the plan's "
                     f"{base.microbatches * mb:,}: a different batch, so compare the time per "
                     f"micro-batch ({per}), not the step")
    if schedule == "bidirectional":
        lines.append("bidirectional keeps two copies of every stage's weights, gradients and "
                     "optimizer state (counted in its peak memory)")
    if memory is not None and memory[2]:
        worst = max(memory[2], key=lambda o: o[1] - o[2])
        rest = [o for o in memory[2] if o is not worst]  # each against its own GPU (groups)
        lines.append(f"does not fit: {schedule}{new_v} needs {gb(worst[1])} on pipeline rank "
                     f"{worst[0]}, more than the {gb(worst[2])} a plan may use of its GPU"
                     + (f" (and pipeline rank{'s' if len(rest) > 1 else ''} "
                        + ", ".join(f"{r}: {gb(need)} of {gb(cap)}" for r, need, cap in rest[:4])
                        + (f" and {len(rest) - 4} more" if len(rest) > 4 else "") + ")"
                        if rest else "")
                     + "; fewer micro-batches in flight, recomputation or a higher ZeRO stage "
                     "would be needed (plan solve --fix schedule=... finds one that fits)")
    return "\n".join(lines)


def rank_memory(plan: Plan, base: SimResult, other: SimResult, *, twice: bool = False):
    """(the plan's peak memory per GPU, the other schedule's, [(rank, bytes, capacity)] of the
    ranks where it exceeds its GPU's memory), or None for a plan without per-stage memory.

    Each pipeline rank keeps the plan's memory (stages[].predicted.memory_bytes: the rank's, for
    every chunk on it) less its simulated peak of activations under the plan's schedule, plus
    that peak under the other; ``twice``: the weights, gradients and optimizer state of the
    stage it runs in the other direction too (bidirectional pipelines: rank r holds stages r and
    pp - 1 - r). Capacity is what a plan may use of its GPU (less the reserve the plan was
    searched with, Plan.memory_reserve, as ``plan solve`` checks it)."""
    mem = {}
    for st in plan.stages:
        m = st.get("predicted", {}).get("memory_bytes")
        if not m or "total" not in m:
            return None
        mem[st.get("pipeline_rank", st["index"] % plan.parallel["pp"])] = (m, st.get("group"))
    if sorted(mem) != list(range(other.ranks)):
        return None
    caps = {g["name"]: g["device_memory_bytes"] for g in plan.cluster.get("groups", [])}
    reserve = SearchOptions(**plan.memory_reserve())
    own_peak, new_peak, over = 0.0, 0.0, []
    for r, (m, group) in sorted(mem.items()):
        new = m["total"] + other.peak_activation_bytes[r] - base.peak_activation_bytes[r]
        if twice:
            mirror = mem[other.ranks - 1 - r][0]
            new += sum(mirror.get(k, 0.0) for k in ("weights", "fp8_weights", "grads",
                                                     "optimizer"))
        own_peak, new_peak = max(own_peak, m["total"]), max(new_peak, new)
        device = caps.get(group, plan.cluster.get("device_memory_bytes"))
        cap = device and usable_bytes(device, reserve_fraction=reserve.memory_reserve_fraction,
                                      reserve_bytes=reserve.memory_reserve_bytes)
        if cap and new > cap:
            over.append((r, new, cap))
    return own_peak, new_peak, over
