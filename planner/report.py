"""Text a person reads: the plan summary, the stage table, the search account. Returns strings."""

from __future__ import annotations

import re

from planner.emit import BREAKDOWN_WORDS
from planner.plan import Plan

GB = 1e9


def summary(p: Plan) -> str:
    """The whole explanation of a plan, as printed by ``plan solve`` and ``plan show``."""
    lines = [_header(p), ""]
    lines += _parallel(p)
    lines += ["", *stage_table(p), ""]
    lines += _search(p)
    return "\n".join(lines)


def _header(p: Plan) -> str:
    c, m, t = p.cluster, p.model, p.training
    return (f"Plan for {m['name']} ({human_count(m['num_params'])} params) on {c['num_gpus']} x "
            f"{c['device']} ({c['name']}: {c['nodes']} nodes x {c['gpus_per_node']})\n"
            f"  global batch {t['global_batch']} x {t['seq_len']} tokens, {t['dtype']}, "
            f"{t['optimizer']}")


def _parallel(p: Plan) -> list[str]:
    par, pr = p.parallel, p.predicted
    sp = " (+sequence parallel)" if par["sequence_parallel"] else ""
    dev_mem = p.cluster.get("device_memory_bytes", 0)
    vpp = f" x {par['vpp']} chunks per rank" if par.get("vpp", 1) > 1 else ""
    offload = ", optimizer states offloaded to host" if par.get("offload_optimizer") else ""
    return [
        f"  parallel    dp={par['dp']}  tp={par['tp']}{sp}  pp={par['pp']}{vpp}",
        f"  batching    micro-batch {par['micro_batch']} x {par['num_microbatches']} micro-batches, "
        f"schedule {par['schedule']}",
        f"  memory      recompute {par['recompute']}, ZeRO-{par['zero']}{offload}, placement "
        f"{par.get('placement', 'tp-pp-dp')}",
        *breakdown(p),
        f"  throughput  {pr['samples_per_s']:.4g} samples/s, {pr['tokens_per_s']:,.0f} tokens/s, "
        f"{pr['tflops_per_device']:.1f} TFLOP/s per GPU, MFU {100 * pr['mfu']:.1f}%",
        f"  peak memory {pr['peak_memory_bytes'] / GB:.1f} GB per GPU"
        + (f" of {dev_mem / GB:.0f} GB" if dev_mem and "groups" not in p.cluster else "")
        + ("" if "groups" not in p.cluster else " (device memory: " + ", ".join(
            f"{g['name']} {g['device_memory_bytes'] / GB:.0f} GB" for g in p.cluster["groups"]) + ")"),
    ]


def breakdown(p: Plan, bar_width: int = 24) -> list[str]:
    """The step time and its parts, largest first, each with its share and a bar."""
    step = p.predicted["step_time_s"]
    parts = sorted(((v, k) for k, v in p.predicted["breakdown"].items() if v > 0), reverse=True)
    rows = [(f"    {BREAKDOWN_WORDS.get(k, k)}", f"{v:.3g} s", f"{100 * v / step:.1f}%",
             "#" * round(bar_width * v / step)) for v, k in parts]
    return [f"  step time   {step:.4g} s, made of:", *_table(rows, indent="  ")]


def stage_table(p: Plan) -> list[str]:
    groups = any("group" in st for st in p.stages)
    rows = [("stage" + (" (group)" if groups else ""), "blocks", "time/mb", "compute", "tp comm",
             "p2p", "memory", "weights+grads+optim", "activations")]
    for st in p.stages:
        pr = st["predicted"]
        mem = pr["memory_bytes"]
        states = mem.get("weights", 0) + mem.get("grads", 0) + mem.get("optimizer", 0)
        label = f"{st['index']} ({st['group']})" if "group" in st else str(st["index"])
        if p.parallel.get("vpp", 1) > 1:  # interleaved: say which rank runs this chunk
            label += f" (rank {st.get('pipeline_rank', st['index'] % p.parallel['pp'])})"
        rows.append((label, compress_names(st["blocks"]),
                     _ms(pr["time_per_microbatch_s"]), _ms(pr.get("compute_s", 0)),
                     _ms(pr.get("tp_comm_s", 0)), _ms(pr.get("p2p_s", 0)),
                     f"{mem['total'] / GB:.1f} GB", f"{states / GB:.1f} GB",
                     f"{mem.get('activations', 0) / GB:.1f} GB x{pr.get('in_flight_microbatches', 1):.3g}"))
    return _table(rows, indent="  ")


def _search(p: Plan) -> list[str]:
    s = p.search
    rejected = ", ".join(f"{n} {r}" for r, n in list(s.get("rejected", {}).items())[:5])
    timing = f" in {s['time_s']:.2f} s" if s.get("time_s") is not None else ""
    status = {"optimal": "best under the cost model", "feasible": "best found (time limit)",
              "fixed": "configuration fixed"}.get(s["status"], s["status"])
    lines = [f"  search: {s['candidates']} configurations, {s.get('evaluated', 0)} priced{timing}; "
             f"{status}"] + ([f"  set aside: {rejected}"] if rejected else [])
    alts = s.get("alternatives", [])
    if alts:
        lines.append("  runners-up, and why they lost:")
        for i, a in enumerate(alts, 2):
            lines += _runner_up(p, i, a)
    return lines


def _runner_up(p: Plan, i: int, a: dict) -> list[str]:
    """'3. tp 4 -> 8, dp 32 -> 16: 18.68 s (+1.5%), 31.6 GB (-29.3)' and the parts that moved."""
    knobs = ", ".join(f"{k.replace('_', ' ')} {_fmt(p.parallel.get(k))} -> {_fmt(v)}"
                      for k, v in a["parallel"].items()
                      if k != "num_microbatches" and p.parallel.get(k) != v) or "same knobs"
    rel = 100 * (a["step_time_s"] / p.step_time_s - 1)
    mem = (a["peak_memory_bytes"] - p.predicted["peak_memory_bytes"]) / GB
    parts = a["why"].split(": ", 1)[1] if ": " in a["why"] else "no part of the step moved"
    return [f"    {i}. {knobs}: {a['step_time_s']:.4g} s ({rel:+.1f}%), "
            f"{a['peak_memory_bytes'] / GB:.1f} GB per GPU ({mem:+.1f})",
            f"       {parts}"]


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


def compress_names(names: list[str]) -> str:
    """``['h.0', 'h.1', 'h.2', 'ln_f..lm_head']`` -> ``'h.0-2, ln_f..lm_head'``."""
    out: list[str] = []
    run_prefix, run_start, run_end = None, None, None

    def flush():
        if run_prefix is not None:
            out.append(f"{run_prefix}{run_start}" + (f"-{run_end}" if run_end != run_start else ""))

    for name in names:
        m = re.match(r"^(.*\.)(\d+)$", name)
        if m and run_prefix == m.group(1) and int(m.group(2)) == run_end + 1:
            run_end = int(m.group(2))
            continue
        flush()
        if m:
            run_prefix, run_start, run_end = m.group(1), int(m.group(2)), int(m.group(2))
        else:
            run_prefix = None
            out.append(name)
    flush()
    text = ", ".join(out)
    return text if len(text) <= 60 else text[:57] + "..."


def gb(nbytes: float) -> str:
    """Bytes as GB, three significant digits below 100, whole numbers above."""
    x = nbytes / GB
    return f"{x:,.0f} GB" if abs(x) >= 100 else f"{x:.3g} GB"


def human_count(n: float) -> str:
    """1234 -> '1.23 K', 1.7e9 -> '1.7 B'."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _table(rows, indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def listing(rows: list[tuple[str, ...]]) -> str:
    return "\n".join(_table(rows))


# ---- what-if sweeps ----------------------------------------------------------------------------


def short_config(row: dict) -> str:
    """``dp=8 tp=2+sp pp=4 mb=1 1f1b rc=none z3`` from a sweep row or a plan's ``parallel``."""
    sp = "+sp" if row.get("sequence_parallel") else ""
    v = f"x{row['vpp']}" if (row.get("vpp") or 1) > 1 else ""
    off = "+off" if row.get("offload_optimizer") else ""
    return (f"dp={row['dp']} tp={row['tp']}{sp} pp={row['pp']}{v} mb={row['micro_batch']} "
            f"{row['schedule']} rc={row['recompute']} z{row['zero']}{off}")


def sweep_table(rows: list[dict], reason_width: int = 70) -> str:
    """One line per what-if row: the point, GPUs, the chosen configuration and what it gives;
    an infeasible point shows its reason instead."""
    costs = any(r.get("cost_per_step_usd") is not None for r in rows)
    run = any(r.get("run_cost_usd") is not None for r in rows)
    head = ["point", "GPUs", "configuration", "step", "tokens/s", "MFU", "memory/GPU"]
    head += ["$/step", "$/M tokens"] if costs else []
    head += [f"days ({human_count(rows[0]['tokens'])} tok)", "$ run"] if run else []
    out, reasons = [tuple(head)], {}
    for r in rows:
        cells = [r["point"], str(r["gpus"] or "")]
        if not r["feasible"]:
            reasons[len(out)] = "infeasible: " + (r["reason"] if len(r["reason"]) <= reason_width
                                                  else r["reason"][:reason_width - 3] + "...")
            out.append((*cells, *[""] * (len(head) - 2)))
            continue
        cells += [short_config(r), f"{r['step_time_s']:.3g} s", f"{r['tokens_per_s']:,.0f}",
                  f"{100 * r['mfu']:.1f}%", gb(r["peak_memory_bytes"])]
        if costs:
            cells += [_dollars(r.get("cost_per_step_usd")), _dollars(r.get("cost_per_mtok_usd"))]
        if run:
            hours = r.get("run_hours")
            cells += ["" if hours is None else f"{hours / 24:,.1f}",
                      _dollars(r.get("run_cost_usd"))]
        out.append(tuple(cells))
    lines = _table(out)
    for i, reason in reasons.items():  # reasons run across the columns, not widening one
        lines[i] = lines[i].rstrip().ljust(len(lines[0].split("configuration")[0])) + reason
    return "\n".join(lines)


def _dollars(x) -> str:
    if x is None:
        return ""
    return f"${x:,.0f}" if x >= 100 else f"${x:.2f}" if x >= 0.1 else f"${x:.2g}"


# ---- plan diff and "why not" -------------------------------------------------------------------

ALWAYS = ("predicted", "step time by part")
"""Sections shown in full; the others list only what differs."""


def diff(a: Plan, b: Plan, names: tuple[str, str] = ("A", "B"), max_stage_rows: int = 12) -> str:
    """Two plans side by side: every difference, with its change from A to B."""
    from planner import explain

    rows = [("", "A", "B", "change")]
    same, section, stage_rows = [], None, 0
    for d in explain.compare(a, b):
        if d.section not in ALWAYS and not d.differs:
            if d.section in ("inputs", "configuration"):
                same.append(f"{d.label} {_value(d.a, d.kind)}")
            continue
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
            f"B is {explain.summary(a, b)}" if a.step_time_s != b.step_time_s else
            f"B takes as long as A: {explain.summary(a, b).split(': ', 1)[-1]}", ""]
    tail = ([f"  ... and {stage_rows - max_stage_rows} more stage rows differ"]
            if stage_rows > max_stage_rows else [])
    if same:
        tail += ["", *_wrap("same in both: " + ", ".join(same))]
    return "\n".join(head + _table(rows) + tail)


def why(plan: Plan, answer) -> str:
    """The answer to ``plan show --why``: what changes with the pinned knobs, or why they do not
    fit (each stage over the device's memory, with what it would need)."""
    from planner import explain

    pins = explain._pins(answer.pins)
    c = plan.cluster
    where = f"{c['num_gpus']} x {c['device']}"
    lines = [f"Why not {pins}? (plan: {plan.parallel_summary}, {plan.step_time_s:.4g} s per step)"]
    if answer.feasible:
        v = answer.variant
        lines.append(f"  With {pins} the best plan on {where} is {v.parallel_summary}:")
        lines += _what_changes(plan, v)
        return "\n".join(lines)
    lines += _wrap(f"  The planner finds no plan with {pins} on {where}: {answer.message}.",
                   indent="    ")
    lines += [ln for n in answer.notes for ln in _wrap(f"  - {n}", indent="    ")]
    v = answer.variant
    if v is None:
        return "\n".join(lines)
    usable, device = answer.limits
    lines += _wrap(f"  The plan's own configuration with {pins} ({v.parallel_summary}), split "
                   "to balance time:", indent="    ")
    for index, blocks, need, mem in answer.over:
        parts = ", ".join(f"{k} {mem[k] / GB:.3g}" for k in explain.MEMORY_KINDS if mem.get(k))
        lines += _wrap(f"  - stage {index} ({blocks}) would need {gb(need)} per GPU ({parts} GB), "
                       f"but each {c['device']} has {gb(device)}, {gb(usable)} usable after "
                       "the reserve", indent="    ")
    if not answer.over:
        lines.append(f"  - every stage fits ({gb(v.predicted['peak_memory_bytes'])} per GPU at "
                     f"most, {gb(usable)} usable)")
    lines.append("  If it ran:")
    lines += _what_changes(plan, v)
    return "\n".join(lines)


def _what_changes(a: Plan, b: Plan) -> list[str]:
    from planner import explain

    ta, tb = a.step_time_s, b.step_time_s
    verdict = (f"{100 * (tb / ta - 1):+.1f}% step time" if tb != ta else "the same step time")
    lines = [f"    {tb:.4g} s per step ({verdict}; {ta:.4g} s now), "
             f"{b.predicted['tokens_per_s']:,.0f} tokens/s, MFU {100 * b.predicted['mfu']:.1f}%"]
    knobs = ", ".join(f"{k} {explain._fmt(x)} -> {explain._fmt(y)}"
                      for k, x, y in explain.config_changes(a, b) if k != "num_microbatches")
    lines += _wrap(f"    configuration: {knobs or 'unchanged'}", indent="      ")
    for ch in explain.part_changes(a, b):
        lines += _wrap(f"    {BREAKDOWN_WORDS[ch.part]} {ch.delta_s:+.3g} s"
                       + (f": {ch.because}" if ch.because else ""), indent="      ")
    pa, pb, moved = explain.memory_change(a, b)
    kinds = ", ".join(f"{k} {d / GB:+.3g} GB" for k, d in moved)
    lines += _wrap(f"    memory: {gb(pa)} -> {gb(pb)} per GPU at the peak"
                   + (f" ({kinds} on the fullest GPU)" if kinds else ""), indent="      ")
    return lines


def _value(v, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "s":
        return f"{v:.4g} s"
    if kind == "bytes":
        return gb(v)
    if kind == "frac":
        return f"{100 * v:.1f}%"
    if kind == "rate":
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if kind == "count" and isinstance(v, int) and not isinstance(v, bool) and v >= 1e6:
        return human_count(v)
    return _fmt(v)


def _change(a, b, kind: str) -> str:
    if a is None or b is None or kind == "text" or a == b:
        return ""
    if isinstance(a, bool) or isinstance(b, bool):
        return ""
    d = b - a
    pct = f" ({100 * d / a:+.1f}%)" if a else ""
    if kind == "s":
        return f"{d:+.3g} s{pct}"
    if kind == "bytes":
        return f"{d / GB:+.3g} GB{pct}"
    if kind == "frac":
        return f"{100 * d:+.1f} points"
    if kind == "rate":
        return pct.strip(" ()")
    if a > 0 and b > 0 and (b % a == 0 or a % b == 0):
        return f"x{b // a}" if b > a else f"/{a // b}"
    return f"{d:+g}"


def _wrap(text: str, width: int = 100, indent: str = "  ") -> list[str]:
    import textwrap

    lead = text[:len(text) - len(text.lstrip())]
    return textwrap.wrap(text.strip(), width=width, initial_indent=lead, subsequent_indent=indent,
                         break_on_hyphens=False)
