"""What-if sweeps as a table: one line per point (planner.explore.sweep rows)."""

from __future__ import annotations

from planner.options import experts_text
from planner.units import dollars, gb, human_count
from planner.report.text import table


def short_config(row: dict) -> str:
    """``dp=8 tp=2+sp pp=4 cp=2(p2p) ep=2 mb=1 1f1b rc=none z3`` from a sweep row or a plan's
    ``parallel`` (cp and ep where they are above 1)."""
    sp = "+sp" if row.get("sequence_parallel") else ""
    v = f"x{row['vpp']}" if (row.get("vpp") or 1) > 1 else ""
    off = "+off" if row.get("offload_optimizer") else ""
    cp = f" cp={row['cp']}({row.get('cp_comm') or 'p2p'})" if (row.get("cp") or 1) > 1 else ""
    ep = experts_text(row.get("ep") or 1, row.get("etp") or 1)
    return (f"dp={row['dp']} tp={row['tp']}{sp} pp={row['pp']}{v}{cp}{ep} "
            f"mb={row['micro_batch']} {row['schedule']} rc={row['recompute']} z{row['zero']}{off}")


def sweep_table(rows: list[dict], reason_width: int = 110, rate: str = "tokens/s") -> str:
    """One line per what-if row: the point, GPUs, the chosen configuration and what it gives;
    an infeasible point shows its reason instead, a point that is not valid input (a varied pin
    the model cannot take) why not. ``rate``: "tokens/s", or "samples/s" for a
    recommendation model (a sample is not a sequence of tokens)."""
    costs = any(r.get("cost_per_step_usd") is not None for r in rows)
    run = any(r.get("run_cost_usd") is not None for r in rows)
    head = ["point", "GPUs", "configuration", "step", rate, "MFU", "memory/GPU"]
    rate_key = {"tokens/s": "tokens_per_s", "samples/s": "samples_per_s"}[rate]
    head += ["$/step", "$/M tokens"] if costs else []
    head += [f"days ({human_count(rows[0]['tokens'])} tok)", "$ run"] if run else []
    out, reasons = [tuple(head)], {}
    for r in rows:
        cells = [r["point"], str(r["gpus"] or "")]
        if not r["feasible"]:
            word = "not valid: " if r.get("bad_input") else "infeasible: "
            reasons[len(out)] = word + (r["reason"] if len(r["reason"]) <= reason_width
                                        else r["reason"][:reason_width - 3] + "...")
            out.append((*cells, *[""] * (len(head) - 2)))
            continue
        cells += [short_config(r), f"{r['step_time_s']:.3g} s", f"{r[rate_key]:,.0f}",
                  f"{100 * r['mfu']:.1f}%", gb(r["peak_memory_bytes"])]
        if costs:
            cells += [dollars(r.get("cost_per_step_usd")), dollars(r.get("cost_per_mtok_usd"))]
        if run:
            hours = r.get("run_hours")
            cells += ["" if hours is None else f"{hours / 24:,.1f}",
                      dollars(r.get("run_cost_usd"))]
        out.append(tuple(cells))
    lines = table(out)
    for i, reason in reasons.items():  # reasons run across the columns, not widening one
        lines[i] = lines[i].rstrip().ljust(len(lines[0].split("configuration")[0])) + reason
    return "\n".join(lines)
