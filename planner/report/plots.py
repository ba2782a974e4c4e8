"""Pictures of what-if sweeps (rows from planner.explore.sweep.whatif): scaling, the Pareto front of
step time against memory, and cost. (Gantt charts are planner.report.gantt.)

matplotlib is imported inside each function and drawn on a bare ``Figure`` with the Agg canvas,
so importing this module costs nothing and no global pyplot state or backend is touched.
"""

from __future__ import annotations

import os
import re
import textwrap

from planner.errors import SpecError
from planner.options import parallel_text
from planner.report import figure
from planner.report.figure import check_path
from planner.units import GB, human_count



# ---- what-if sweeps (rows from planner.explore.sweep.whatif) -----------------------------------------

SERIES_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
                  "#F0E442")
"""Okabe-Ito, one per series (a cluster, a device, a pinned knob value)."""
SERIES_KEYS = ("cluster", "device", "intra_node_GBps", "inter_node_GBps", "global_batch",
               "seq_len", "dtype", "optimizer", "fix")
"""Row columns that tell series apart (the x axis, GPUs, is not one of them)."""


def _series(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Rows grouped by the SERIES_KEYS that differ between rows, labelled by those values, in
    first-seen order; one unlabelled series when nothing differs."""
    varying = []
    for k in (k for k in SERIES_KEYS if len({r.get(k) for r in rows}) > 1):
        if not any(_determines(rows, j, k) for j in varying):  # e.g. the cluster names the device
            varying.append(k)
    groups: dict = {}
    for r in rows:
        key = tuple(r.get(k) for k in varying)
        groups.setdefault(key, []).append(r)
    out = []
    for key, members in groups.items():
        parts = [str(v) if k in ("cluster", "device", "fix") else f"{k}={v:g}" if isinstance(
            v, float) else f"{k}={v}" for k, v in zip(varying, key)]
        out.append((", ".join(p for p in parts if p) or "", members))
    return out


def _determines(rows: list[dict], j: str, k: str) -> bool:
    """Whether each value of column ``j`` goes with one value of column ``k``."""
    seen: dict = {}
    return all(seen.setdefault(r.get(j), r.get(k)) == r.get(k) for r in rows)


def _log_axis(axis, unit: str = "") -> None:
    """A log axis ticked at 1, 2, 5 x powers of ten, labelled 50k, 100k, 2M (no 1e5 notation)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator  # lazy: matplotlib only for pictures

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: _short(v) + unit))


def _short(v: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def _figure(panels: int, path: str, width_in: float = 5.2, height_in: float = 4.4):
    check_path(path, "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only for pictures
    from matplotlib.figure import Figure  # lazy: matplotlib only for pictures

    fig = Figure(figsize=(width_in * panels, height_in), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, panels, squeeze=False)[0]


def _gpu_axis(ax, gpus: list[int]) -> None:
    """GPUs on a base-2 log axis, ticked at the values swept."""
    from matplotlib.ticker import FixedLocator, NullLocator  # lazy: matplotlib only for pictures

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(gpus))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(g) for g in sorted(set(gpus))])
    ax.set_xlabel("GPUs")
    ax.grid(color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def _title(rows: list[dict], what: str) -> str:
    """The model and what the chart shows, over the batch, length and dtype of the rows (each
    value swept, where they differ)."""
    def values(key: str) -> str:
        seen = sorted({r.get(key) for r in rows if r.get(key) is not None},
                      key=lambda v: (isinstance(v, str), v if not isinstance(v, str) else 0,
                                     str(v)))
        return " or ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in seen) or "?"
    return (f"{rows[0].get('model', 'model')}: {what}\nglobal batch {values('global_batch')} x "
            f"{values('seq_len')} tokens, {values('dtype')}")


def _per_token(rows: list[dict]) -> bool:
    """Whether the rows' steps hold different numbers of tokens (a swept batch or length), so
    their step times compare only per token."""
    return len({(r.get("global_batch"), r.get("seq_len")) for r in rows if r["feasible"]}) > 1


def _time(r: dict, per_token: bool) -> float:
    """A row's step time, or with ``per_token`` its seconds per million tokens."""
    return r["step_time_s"] / (r["global_batch"] * r["seq_len"]) * 1e6 if per_token else \
        r["step_time_s"]


def _degrees(r: dict) -> str:
    """A point's label: 'dp·tp·pp', then 'cp2' and 'ep8' where the plan uses them."""
    extra = "".join(f"·{k}{r[k]}" for k in ("cp", "ep") if (r.get(k) or 1) > 1)
    return f"{r['dp']}·{r['tp']}·{r['pp']}{extra}"


def scaling(rows: list[dict], path: str):
    """Tokens/s (left, with linear scaling from each series' smallest point dashed) and MFU
    (right) against GPUs, one line per series; each MFU point names its dp/tp/pp, and infeasible
    points are crosses on the MFU axis' floor. Writes ``path`` (.png/.svg); returns the Figure."""
    fig, (ax_t, ax_m) = _figure(2, path)
    feasible = [r for r in rows if r["feasible"]]
    if not feasible:
        raise SpecError("plot: no feasible point to draw")
    rank = {}  # per point: its place by MFU among the points at its GPU count (its label's)
    ends = (min(r["gpus"] for r in feasible), max(r["gpus"] for r in feasible))
    for gpus in {r["gpus"] for r in feasible}:
        here = sorted((r for r in feasible if r["gpus"] == gpus), key=lambda r: -r["mfu"])
        rank.update({id(r): i for i, r in enumerate(here)})
    for i, (label, members) in enumerate(_series(rows)):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        ok = sorted((r for r in members if r["feasible"]), key=lambda r: r["gpus"])
        xs = [r["gpus"] for r in ok]
        if ok:
            ax_t.plot(xs, [r["tokens_per_s"] for r in ok], "o-", color=colour, label=label or None)
            x0, t0 = xs[0], ok[0]["tokens_per_s"]
            ax_t.plot(xs, [t0 * x / x0 for x in xs], "--", color=colour, linewidth=0.9, alpha=0.6)
            ax_m.plot(xs, [100 * r["mfu"] for r in ok], "o-", color=colour, label=label or None)
            for r in ok:  # above the top point at its GPU count, the others below, stacked
                place = rank[id(r)]
                # (the first and last GPU counts' labels lean inward: centred, they were cut
                # at the axes' edge)
                ha = ("center" if ends[0] == ends[1] else "left" if r["gpus"] == ends[0] else
                      "right" if r["gpus"] == ends[1] else "center")
                ax_m.annotate(_degrees(r), (r["gpus"], 100 * r["mfu"]),
                              textcoords="offset points",
                              xytext=(0, 7 if place == 0 else -13 - 9 * (place - 1)),
                              ha=ha, fontsize=7, color=colour)
        # (a point the model cannot take, bad input, is not a configuration that does not fit)
        bad = [r["gpus"] for r in members if not r["feasible"] and not r.get("bad_input")]
        if bad:
            ax_m.plot(bad, [0.0] * len(bad), "x", color=colour, markersize=8, clip_on=False)
    gpus = [r["gpus"] for r in rows if r["gpus"]]
    _gpu_axis(ax_t, gpus)
    _gpu_axis(ax_m, gpus)
    ax_t.set_yscale("log")
    _log_axis(ax_t.yaxis)
    ax_t.set_ylabel("tokens/s")
    ax_m.set_ylabel("MFU (%)")
    ax_m.set_ylim(0, max(100 * r["mfu"] for r in feasible) * 1.25)
    ax_t.set_title("throughput (dashed: linear scaling from the smallest run)", fontsize=10)
    ax_m.set_title("model FLOPs utilization (labels: dp·tp·pp, with cp/ep where used"
                   + ("; x: nothing fits)" if any(not r["feasible"] and not r.get("bad_input")
                                                   for r in rows) else ")"),
                   fontsize=10)
    if any(label for label, _ in _series(rows)):
        ax_t.legend(fontsize=8, loc="upper left")
    fig.suptitle(_title(rows, "scaling"), fontsize=11)
    figure.save(fig, path)
    return fig


def pareto_front(rows: list[dict]) -> list[dict]:
    """Feasible rows that no other row beats on both step time and memory per GPU, by memory;
    time per token where the rows' steps hold different numbers of tokens (_per_token)."""
    per_token = _per_token(rows)
    ok = sorted((r for r in rows if r["feasible"]),
                key=lambda r: (r["peak_memory_bytes"], _time(r, per_token)))
    front, best = [], float("inf")
    for r in ok:
        if _time(r, per_token) < best:
            front.append(r)
            best = _time(r, per_token)
    return front


def pareto(rows: list[dict], path: str, *, max_listed: int = 14):
    """Step time against peak memory per GPU for every feasible point (coloured by series, or by
    the swept key with the fewest values when there are many series), the Pareto front joined
    and numbered, each number listed beside the chart with its swept values, configuration,
    memory and step time, and the device's memory as a vertical line. Writes ``path``; returns
    the Figure."""
    check_path(path, "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only for pictures
    from matplotlib.figure import Figure  # lazy: matplotlib only for pictures

    front = pareto_front(rows)
    if not front:
        raise SpecError("plot: no feasible point to draw")
    per_token = _per_token(rows)
    fig = Figure(figsize=(11.0, 5.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.07, 0.11, 0.55, 0.74))
    groups = _colour_groups(rows)
    for i, (label, members) in enumerate(groups):
        ok = [r for r in members if r["feasible"]]
        ax.scatter([r["peak_memory_bytes"] / GB for r in ok], [_time(r, per_token) for r in ok],
                   s=22, color=SERIES_COLOURS[i % len(SERIES_COLOURS)] if len(groups) > 1
                   else "#999999", label=label or None, zorder=2)
    xs, ys = [r["peak_memory_bytes"] / GB for r in front], [_time(r, per_token) for r in front]
    ax.step(xs, ys, where="post", color="#000000", linewidth=1.2, zorder=3, label="Pareto front")
    ax.scatter(xs, ys, s=40, facecolors="none", edgecolors="#000000", zorder=4)
    for k, (x, y) in enumerate(zip(xs, ys)):
        ax.annotate(str(k + 1), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8,
                    fontweight="bold")
    _memory_axes(ax, rows, per_token)
    ax.legend(fontsize=8, loc="best")  # (the front starts at the upper left)
    lines = [f"{k + 1:>2}. {r['point'] or ''}\n"
             f"{textwrap.fill(parallel_text(r), 56, initial_indent=' ' * 4, subsequent_indent=' ' * 6)}\n"
             f"    {r['peak_memory_bytes'] / GB:.1f} GB, {r['step_time_s']:.4g} s"
             + (f" ({_time(r, True):.4g} s per M tokens)" if per_token else "")
             for k, r in enumerate(front[:max_listed])]
    if len(front) > max_listed:
        lines.append(f"... {len(front) - max_listed} more on the front")
    fig.text(0.65, 0.85, "Pareto front (no point is both faster and smaller):\n\n"
             + "\n".join(lines), va="top", ha="left", fontsize=7.5, family="monospace")
    what = "time per million tokens" if per_token else "step time"
    fig.suptitle(_title(rows, f"{what} against memory per GPU ({len(front)} of "
                              f"{sum(r['feasible'] for r in rows)} feasible points on the front)"),
                 fontsize=11)
    figure.save(fig, path)
    return fig


def _colour_groups(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """The series, or when there are more than colours, the rows grouped by the swept key with
    the fewest distinct values (``recompute=none`` ...)."""
    series = _series(rows)
    if len(series) <= len(SERIES_COLOURS):
        return series
    points = [dict(re.findall(r"(\w+)=(\S+)", r.get("point") or "")) for r in rows]
    keys = {k for p in points for k in p}
    counts = {k: len({p.get(k) for p in points}) for k in keys}
    usable = sorted((n, k) for k, n in counts.items() if 1 < n <= len(SERIES_COLOURS))
    if not usable:
        return [("", rows)]
    key = usable[0][1]
    groups: dict = {}
    for r, p in zip(rows, points):
        groups.setdefault(f"{key}={p.get(key)}", []).append(r)
    return list(groups.items())


def _memory_axes(ax, rows: list[dict], per_token: bool = False) -> None:
    """Memory on x (from a little below the smallest point to the device's memory), step time
    (``per_token``: seconds per million tokens) on y (log when it spans more than 8x), and a
    dotted line at each device's memory."""
    ok = [r for r in rows if r["feasible"]]
    caps = sorted({r["device_memory_bytes"] for r in rows if r.get("device_memory_bytes")})
    mems = [r["peak_memory_bytes"] / GB for r in ok]
    right = max([c / GB for c in caps] + mems) * 1.03
    left = min(mems) * 0.85 if min(mems) > 0.3 * right else 0.0
    for cap in caps:
        ax.axvline(cap / GB, color="#D55E00", linestyle=":", linewidth=1)
        ax.text(cap / GB, 0.5, f"{cap / GB:.0f} GB per device", color="#D55E00", fontsize=8,
                va="center", ha="right", rotation=90, transform=ax.get_xaxis_transform())
    ax.set_xlim(left, right)
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("seconds per million tokens" if per_token else "step time (s)")
    times = [_time(r, per_token) for r in ok]
    if max(times) > 8 * min(times):
        ax.set_yscale("log")
        _log_axis(ax.yaxis, " s")
    ax.grid(color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def cost(rows: list[dict], path: str):
    """Dollars per step and per million tokens against GPUs, one line per series; when the rows
    carry a run's tokens, the cost and the days to train on them instead of per million. The rows
    carry their costs (planner.explore.costs.add_costs; whatif with prices). Writes ``path``;
    returns the Figure."""
    priced = [r for r in rows if r.get("cost_per_step_usd") is not None]
    if not priced:
        raise SpecError("plot: no point has a price; pass prices={'h100': 4.0, ...}")
    run = priced[0].get("run_cost_usd") is not None
    fig, axes = _figure(3 if run else 2, path, width_in=4.6)
    if run:
        top = max(r["run_cost_usd"] for r in priced)
        unit, scale = next((u, s) for u, s in (("$M", 1e-6), ("$k", 1e-3), ("$", 1.0))
                           if top * s >= 1 or u == "$")
        panels = [("cost_per_step_usd", 1.0, "$ per step"),
                  ("run_cost_usd", scale, f"{unit} for {human_count(priced[0]['tokens'])} "
                                          "tokens"),
                  ("run_hours", 1 / 24,
                   f"days for {human_count(priced[0]['tokens'])} tokens (log)")]
    else:
        panels = [("cost_per_step_usd", 1.0, "$ per step"),
                  ("cost_per_mtok_usd", 1.0, "$ per million tokens")]
    for i, (label, members) in enumerate(_series(rows)):
        ok = sorted((r for r in members if r.get("cost_per_step_usd") is not None),
                    key=lambda r: r["gpus"])
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        price = f" at ${ok[0]['price_per_gpu_hour']:g}/GPU-h" if ok else ""
        for j, (ax, (key, scale, _)) in enumerate(zip(axes, panels)):
            ax.plot([r["gpus"] for r in ok], [r[key] * scale for r in ok], "o-", color=colour,
                    label=(label + price) if ok else None)
            if j == 1:
                for r in ok:
                    ax.annotate(f"{r[key] * scale:.3g}", (r["gpus"], r[key] * scale), fontsize=7,
                                textcoords="offset points", xytext=(0, 6), ha="center",
                                color=colour)
    gpus = [r["gpus"] for r in rows if r["gpus"]]
    for j, (ax, (_, _, ylabel)) in enumerate(zip(axes, panels)):
        _gpu_axis(ax, gpus)
        ax.set_title(ylabel, fontsize=10)
        if j == 2:  # days halve with every doubling: a log axis keeps the short runs readable
            ax.set_yscale("log")
            _log_axis(ax.yaxis)
        else:
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(_title(rows, "cost"), fontsize=11)
    figure.save(fig, path)
    return fig


def sweep_plots(rows: list[dict], path: str) -> tuple[list[str], list[str]]:
    """The pictures a sweep supports, next to ``path`` (``out.png`` -> ``out-scaling.png``,
    ``out-pareto.png``, ``out-cost.png``): scaling when the GPU count varies, the Pareto front
    always, cost when the rows carry prices. Returns the paths written and, for each picture
    left out, why."""
    stem, ext = os.path.splitext(path)
    check_path(path, "plot")
    written, skipped = [], []
    if len({r["gpus"] for r in rows if r["feasible"]}) > 1:
        scaling(rows, f"{stem}-scaling{ext}")
        written.append(f"{stem}-scaling{ext}")
    else:
        skipped.append(f"{stem}-scaling{ext} (the feasible points share one GPU count; vary "
                       "nodes or gpus_per_node to draw scaling)")
    pareto(rows, f"{stem}-pareto{ext}")
    written.append(f"{stem}-pareto{ext}")
    if any(r.get("cost_per_step_usd") is not None for r in rows):
        cost(rows, f"{stem}-cost{ext}")
        written.append(f"{stem}-cost{ext}")
    else:
        skipped.append(f"{stem}-cost{ext} (no prices; give --price-per-gpu-hour)")
    return written, skipped
