"""What `plan run` prints: measured against predicted, per rank (a dense plan's and a
recommendation plan's). Returns strings."""

from __future__ import annotations

from planner.report.text import listing, table
from planner.units import counted


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _ms2(seconds) -> str:
    """Milliseconds to two places (a recommendation model's CPU steps take a few)."""
    return "-" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _mb(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:.1f} MB"


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def _method(ranks: list[dict]) -> str:
    """How peak memory was measured: as a rank that measured it says (one whose profile failed
    says it was not measured)."""
    return next((r["memory_method"] for r in ranks if r["peak_memory_bytes"] is not None),
                ranks[0]["memory_method"])


def summary(result: dict, plan_name: str) -> str:
    m = result["measured"]
    # each rank's coordinates; cp and ep where the plan has them
    axes = [k for k in ("pp", "dp", "cp", "tp", "ep")
            if k in ("pp", "dp", "tp") or any(r.get(k, 0) for r in result["ranks"])]
    lines = [
        f"Ran {plan_name} on {len(result['ranks'])} {result['device']} "
        f"{'process' if len(result['ranks']) == 1 else 'processes'} "
        f"({result['backend']}; "
        f"{'data parallel over dp x cp' if 'cp' in axes else 'data parallel'}: "
        f"{result['data_parallel']}), "
        f"{counted(len(result['ranks'][0]['step_times_s']), 'step')}, "
        + (("the first" if m["warmup_steps"] == 1 else f"the first {m['warmup_steps']}")
           + " not timed" if m["warmup_steps"] else "all timed")
        + ((", nor the last (memory profile)" if m["warmup_steps"] else " but the last (memory "
            "profile)") if result["ranks"][0]["profiled_step"] is not None else ""),
        "",
        listing([
            ("", "measured", "predicted", "error (predicted / measured - 1)"),
            ("step time", _ms(m["step_time_s"]), _ms(m["predicted_step_time_s"]),
             _pct(m["step_time_error"])),
            (_peak_label(m, len(result.get("ranks", []))), _mb(m["peak_memory_bytes"]),
             _mb(m["predicted_peak_memory_bytes"]), _pct(m["peak_memory_error"])),
            ("model states" if m.get("state_grads", True) else
             "model states (gradients freed)", _mb(m["state_bytes"]),
             _mb(m.get("predicted_state_bytes")),
             _pct(m["predicted_state_bytes"] / m["state_bytes"] - 1)
             if m.get("predicted_state_bytes") and m.get("state_bytes") else ""),
            ("process RSS peak", _mb(m["rss_peak_bytes"]), "", ""),
        ]),
        "",
        listing([("rank", *axes, "stages", "median step", "peak memory", "states",
                  "RSS peak")] + [
            (str(r["rank"]), *(str(r.get(k, 0)) for k in axes),
             ",".join(map(str, r["stages"])), _ms(r["median_step_time_s"]),
             _mb(r["peak_memory_bytes"]), _mb(r["state_bytes"]), _mb(r["rss_peak_bytes"]))
            for r in result["ranks"]]),
        "",
        f"peak memory: {_method(result['ranks'])}; states: the parameters, gradients still held "
        "and optimizer states the rank holds after the run, against the plan's fullest stage's "
        "at their peak (with ZeRO-3 / FSDP that counts the gathered parameters and the unsharded "
        "gradients before their reduce-scatter, which a rank at rest no longer holds)",
    ]
    rt = m.get("routing")
    if rt:
        ranks = (f"the busiest expert-parallel rank {rt['busiest_rank']:.2f} x"
                 if rt.get("expert_parallel", True) else "each rank holds every expert")
        lines.append(
            f"routing (timed steps, up to {rt['calls_per_rank']} MoE layer calls per rank"
            + (", recomputed forwards included" if rt.get("recomputed", True) else "")
            + "): the busiest "
            f"expert got {rt['busiest_expert']:.2f} x the mean token copies, {ranks}; the plan "
            f"assumed moe_imbalance {rt['planned_moe_imbalance']:g}"
            + ("" if abs(rt["busiest_expert"] - rt["planned_moe_imbalance"])
               <= 0.05 * rt["planned_moe_imbalance"] else
               f" (plan with --engine moe_imbalance={rt['busiest_expert']:.2f} to price this "
               "routing)" if rt.get("expert_parallel", True) else
               " (without expert parallelism a rank computes every expert's copies, so how they "
               "spread over the experts does not change its step)"))
    spread = m.get("step_spread")
    if spread:
        lines.append(f"timed steps of the slowest rank: {spread['steps']}, from "
                     f"{_ms(spread['min_s'])} to {_ms(spread['max_s'])} "
                     f"({100 * spread['range_over_median']:.0f}% of the median apart)"
                     + (": a step time error within that says little about the cost model"
                        if spread["range_over_median"] > NOISY else ""))
    load = m.get("other_load")
    if load is not None and load > OTHER_LOAD:
        lines.append(f"note: other processes took {100 * load:.0f}% of this machine's CPU time "
                     "during the timed steps: the step measured is slower than the plan runs "
                     "alone; run again on an idle machine for a figure to hold the prediction "
                     "against")
    warming = m.get("still_warming")
    if warming:
        lines.append(f"note: the timed steps were still getting faster ({_ms(warming[0])} first, "
                     f"{_ms(warming[1])} last): the median times a warming process; a longer "
                     f"warm-up (--warmup {m['warmup_steps'] + 2}) gives a steadier figure")
    if result.get("loss_per_step"):
        lines.append("loss per step: " + ", ".join(f"{x:.4f}" for x in result["loss_per_step"]))
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


NOISY = 0.2
"""Timed steps this far apart (range over median) are noise a step time error can hide in."""
OTHER_LOAD = 0.2
"""The share of this machine's CPU time other processes may take during the timed steps before a
run says its step was slowed by them (a new-user check measured one plan at 634 ms and then at 362
ms minutes apart, with nothing said)."""


def _peak_label(m: dict, ranks: int) -> str:
    """'peak memory', with how many ranks it covers where some could not be measured."""
    measured = m.get("peak_memory_ranks")
    if measured is None or not ranks or measured >= ranks:
        return "peak memory"
    return f"peak memory ({measured} of {ranks} ranks)"


def off_hints(result: dict, plan, threads: int | None) -> list[str]:
    """Where a run's step time is far from the prediction (beyond OFF), what may explain it: a plan
    priced for another machine than this one (the cpu preset, not a measured calibration), or
    for other software than the runtime's (torch's eager code), and threads that vary on a
    loaded machine."""
    err = result["measured"].get("step_time_error")
    if err is None or abs(err) <= OFF or result.get("device") != "cpu":
        return []
    device = str(plan.cluster.get("device", ""))
    out = []
    if device.startswith("cpu") and "calibrated" not in device:
        out.append("the plan was priced for the cpu preset, not this machine: `plan profile -o "
                   "calib.json` measures it, and `plan solve ... --calibration calib.json` "
                   "prices for it")
    engine = (plan.training.get("engine") or {})
    if plan.search.get("target") != "torch" and (  # (its own engine settings chosen with it)
            engine.get("kernels", "eager") != "eager" or engine.get("attention") == "flash"):
        out.append("the plan was priced for other software than the runtime's eager PyTorch "
                   "(its engine settings); `plan solve ... --target torch` prices it as plan "
                   "run runs it")
    if threads != 1:
        out.append("with several threads a process, CPU steps vary with the machine's load: "
                   "--threads 1 steadies them")
    return out


OFF = 0.3
"""A step time this far from the prediction (predicted / measured - 1) gets off_hints."""


def _size(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1e6:.1f} MB" if x >= 1e5 else f"{x / 1e3:.1f} kB"


def recsys_summary(result: dict, plan_name: str) -> str:
    """What `plan run` prints for a recommendation plan: measured against predicted."""
    m = result["measured"]
    err = m["step_time_error"]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(result["sharding"].items()))
    steps = len(result["ranks"][0]["step_times_s"])
    bd = result.get("predicted_breakdown") or {}
    lines = [f"Ran {plan_name} on {result['world_size']} {result['device']} processes "
             f"({result['backend']}; {result['engine']}; tables: {kinds}), {steps} steps of "
             f"{result['local_batch']} samples per rank, "
             + (f"the first {m['warmup_steps']} not timed" if m["warmup_steps"] > 1 else
                "the first not timed" if m["warmup_steps"] else "all timed"),
             ""]
    lines += table([("", "measured", "predicted", "error (predicted / measured - 1)"),
                     ("step time", _ms2(m["step_time_s"]), _ms2(m["predicted_step_time_s"]),
                      "-" if err is None else f"{err * 100:+.0f}%")])
    if bd:
        lines += ["", f"predicted step = max(device {_ms2(bd.get('device_s'))}, host "
                      f"{_ms2(bd.get('host_s'))}); device = lookups {_ms2(bd.get('lookup_s'))} + "
                      f"embedding exchange {_ms2(bd.get('embedding_comm_s'))} + dense "
                      f"{_ms2(bd.get('dense_compute_s'))} + exposed all-reduce "
                      f"{_ms2(bd.get('grad_allreduce_exposed_s'))} (busiest rank)"]
    lines.append("")
    lines += table([("rank", "tables", "median step", "predicted device", "table shards",
                      "RSS peak")] +
                    [(str(r["rank"]), str(len(r["tables"])), _ms2(r["median_step_time_s"]),
                      _ms2(r["predicted_time_s"]), _size(r["table_bytes"]),
                      _size(r["rss_peak_bytes"])) for r in result["ranks"]])
    lines.append("")
    lines.append("loss per step: " + ", ".join(f"{x:.4f}" for x in result["loss_per_step"]))
    ref = result.get("reference")
    if ref:
        lines.append(f"unsharded reference: losses within {ref['loss_max_abs_diff']:.2e}, tables "
                     f"within {max(ref['table_max_abs_diff'].values(), default=0):.2e}, dense "
                     f"within {ref['dense_max_abs_diff']:.2e}")
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)
