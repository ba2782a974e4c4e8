"""Text a person reads: the plan summary, the stage table, the search account. Returns strings."""

from __future__ import annotations

import re

from planner.emit import BREAKDOWN_WORDS
from planner.options import Config
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
    bd = pr["breakdown"]
    parts = ", ".join(f"{BREAKDOWN_WORDS[k]} {v:.3g}" for k, v in bd.items() if v > 0)
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
        f"  step time   {pr['step_time_s']:.3f} s  ({parts})",
        f"  throughput  {pr['samples_per_s']:.4g} samples/s, {pr['tokens_per_s']:,.0f} tokens/s, "
        f"{pr['tflops_per_device']:.1f} TFLOP/s per GPU, MFU {100 * pr['mfu']:.1f}%",
        f"  peak memory {pr['peak_memory_bytes'] / GB:.1f} GB per GPU"
        + (f" of {dev_mem / GB:.0f} GB" if dev_mem and "groups" not in p.cluster else "")
        + ("" if "groups" not in p.cluster else " (device memory: " + ", ".join(
            f"{g['name']} {g['device_memory_bytes'] / GB:.0f} GB" for g in p.cluster["groups"]) + ")"),
    ]


def stage_table(p: Plan) -> list[str]:
    groups = any("group" in st for st in p.stages)
    rows = [("stage" + (" (group)" if groups else ""), "blocks", "time/mb", "compute", "tp comm",
             "p2p", "memory", "weights+grads+optim", "activations")]
    for st in p.stages:
        pr = st["predicted"]
        mem = pr["memory_bytes"]
        states = mem.get("weights", 0) + mem.get("grads", 0) + mem.get("optimizer", 0)
        label = f"{st['index']} ({st['group']})" if "group" in st else str(st["index"])
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
             f"{status}" + (f"; set aside: {rejected}" if rejected else "")]
    alts = s.get("alternatives", [])
    if alts:
        lines.append("  runners-up:")
        for i, a in enumerate(alts, 2):
            lines.append(f"    {i}. {Config(**a['parallel']).short()}: {a['step_time_s']:.3f} s, "
                         f"{a['peak_memory_bytes'] / GB:.1f} GB ({a['why']})")
    return lines


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
