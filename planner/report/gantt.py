"""Gantt charts: a simulated pipeline schedule (one row per rank, planner.schedule.simulator) and
many jobs on one cluster over time (one row per GPU, a planner.jobs schedule document).

matplotlib is imported inside the functions and drawn on a bare ``Figure`` with the Agg canvas,
so importing this module costs nothing and no global pyplot state or backend is touched.
"""

from __future__ import annotations

from planner.report import figure
from planner.report.figure import check_path
from planner.report.text import model_name, runs
from planner.schedule.simulator import SimResult
from planner.units import cluster_text

COLOURS = {"F": "#0072B2", "B": "#E69F00", "W": "#009E73"}
"""Forward blue, backward orange, weight-gradient green (Okabe-Ito, readable when colour-blind)."""
WORDS = {"F": "forward (F)", "B": "backward (B)", "W": "weight gradient (W)"}
FONT_PT = 7.0
"""Size of the micro-batch numbers inside blocks."""
AXES_WIDTH = 0.84
"""Share of the figure's width the time axis takes."""


def _shade(colour: str, chunk: int) -> str:
    """The colour for a rank's ``chunk``-th stage (0: as is; later chunks mixed with white)."""
    mix = min(0.6, 0.4 * chunk)
    rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def _label_px(label: str, dpi: int) -> float:
    """Pixels a block needs to show ``label`` (a digit is about 0.62 em wide, plus margins)."""
    return (len(label) * 0.62 + 0.6) * FONT_PT * dpi / 72


def _width_in(sim: SimResult, dpi: int) -> float:
    """A figure width (10 to 40 inches) at which a typical block of the shortest kind has room
    for the widest micro-batch number."""
    blocks = {}
    for iv in sim.timeline:
        if iv.end_s > iv.start_s:
            blocks.setdefault(iv.kind, []).append(iv.end_s - iv.start_s)
    if not blocks or sim.step_time_s <= 0:
        return 10.0
    typical = min(sorted(d)[len(d) // 2] for d in blocks.values())
    axes_px = 1.15 * _label_px(str(sim.microbatches - 1), dpi) * sim.step_time_s / typical
    return min(40.0, max(10.0, axes_px / dpi / AXES_WIDTH))


def rank_labels(plan) -> list[str] | None:
    """Row labels naming each pipeline rank's device group or site (``rank 0 (h100s)``) for a
    plan over groups or sites; None for any other plan (``rank r``)."""
    groups = {st.get("pipeline_rank", st["index"] % plan.parallel["pp"]): st["group"]
              for st in plan.stages if st.get("group")}
    if not groups:
        return None
    return [f"rank {r} ({groups[r]})" if r in groups else f"rank {r}"
            for r in range(plan.parallel["pp"])]


def gantt(sim: SimResult, path: str, *, title: str = "pipeline schedule",
          width_in: float | None = None, dpi: int = 150, labels: list[str] | None = None):
    """Draw ``sim`` as a Gantt chart and write it to ``path`` (``.png`` or ``.svg``).

    One row per rank (rank 0 on top), one block per action coloured by kind (F/B/W), blank where
    the rank idles; a block shows its micro-batch number when wide enough to read. A rank's later
    virtual stages (interleaved) or its up-pipeline stage (bidirectional) are drawn lighter. The
    right margin gives each rank's idle share; the x axis is in seconds. Returns the matplotlib
    Figure (one axes: time in data x, rank in data y). ``labels``: the rows' names (rank_labels)
    in place of ``rank r``."""
    check_path(path, "gantt")
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only for pictures
    from matplotlib.figure import Figure  # lazy: matplotlib only for pictures
    from matplotlib.patches import Patch  # lazy: matplotlib only for pictures

    ranks, step = sim.ranks, sim.step_time_s
    width_in = width_in or _width_in(sim, dpi)
    # fixed inches above the rows (the two-line title) and below them (the time axis, the
    # legend), so that a plan of two ranks keeps both in the picture
    rows_in, top_in, bottom_in = 0.42 * max(ranks, 2), 0.75, 0.85
    height_in = rows_in + top_in + bottom_in
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.07, bottom_in / height_in, AXES_WIDTH, rows_in / height_in))
    ax.set_xlim(0, step * 1.002 or 1.0)
    ax.set_ylim(ranks - 0.5, -0.5)
    px_per_s = width_in * AXES_WIDTH * dpi / (step or 1.0)
    kinds = sorted({iv.kind for iv in sim.timeline}, key="FBW".index)
    chunks = max((iv.stage // max(ranks, 1) for iv in sim.timeline), default=0)
    for iv in sim.timeline:
        width = iv.end_s - iv.start_s
        colour = _shade(COLOURS[iv.kind], iv.stage // ranks)
        ax.broken_barh([(iv.start_s, width)], (iv.rank - 0.4, 0.8), facecolors=colour,
                       edgecolor="white", linewidth=0.4)
        label = str(iv.microbatch)
        if width * px_per_s >= _label_px(label, dpi):
            ax.text(iv.start_s + width / 2, iv.rank, label, ha="center", va="center",
                    fontsize=FONT_PT, color="white" if iv.kind != "B" else "black")
    for r in range(ranks):
        ax.text(1.005, r, f"idle {sim.idle_s[r] / step:.0%}" if step else "", va="center",
                fontsize=8, transform=ax.get_yaxis_transform())
    ax.set_yticks(range(ranks), labels if labels and len(labels) == ranks else
                  [f"rank {r}" for r in range(ranks)])
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.set_title(f"{title}\npipeline {step:.4g} s (the step less data-parallel sync and optimizer"
                 f"), ranks idle {sim.bubble_fraction:.1%} of it, "
                 f"{sim.microbatches} micro-batch{'' if sim.microbatches == 1 else 'es'}; "
                 "numbers are micro-batches", fontsize=10)
    handles = [Patch(color=COLOURS[k], label=WORDS[k]) for k in kinds]
    if chunks:
        handles.append(Patch(color=_shade("#666666", 1), label="lighter: rank's next stage"))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.05 / height_in),
               ncol=len(handles), fontsize=8, frameon=False)
    figure.save(fig, path)
    return fig


# ---- many jobs on one cluster -------------------------------------------------------------------

GANTT_CLIP = 2.5
"""The time axis ends at this many joint makespans at most (longer baselines are cut off)."""


def _time_unit(seconds: float) -> tuple[float, str, str]:
    """(seconds per unit, its name, its symbol) for an axis spanning ``seconds``: hours, or
    minutes or seconds for a short schedule (a 19 s one read 'makespan 0.01 h')."""
    if seconds >= 2 * 3600:
        return 3600.0, "hours", "h"
    if seconds >= 120:
        return 60.0, "minutes", "min"
    return 1.0, "seconds", "s"


def jobs_gantt(doc: dict, path: str) -> None:
    """The cluster over time, one row per GPU (labelled by node): the joint schedule of ``doc``
    (a planner.jobs/v1 document) above the two baselines, in hours, or minutes or seconds for a
    short one. Writes ``path`` (.png or .svg)."""
    from matplotlib import colormaps  # lazy: matplotlib only for pictures
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib only for pictures
    from matplotlib.figure import Figure  # lazy: matplotlib only for pictures
    from matplotlib.patches import Patch  # lazy: matplotlib only for pictures

    check_path(path, "gantt")
    unit, name, sym = _time_unit(doc["makespan_s"])
    c, joint = doc["cluster"], doc["makespan_s"] / unit
    panels = [("joint schedule (CP-SAT)", doc["jobs"], joint)]
    panels += [(b["description"], b["jobs"], b["makespan_s"] / unit)
               for b in doc["baselines"].values()]
    span = min(max(p[2] for p in panels), GANTT_CLIP * joint)  # a slow baseline runs off
    cmap = colormaps["tab10" if len(doc["jobs"]) <= 10 else "tab20"]
    colors = {j["name"]: cmap(i % cmap.N) for i, j in enumerate(doc["jobs"])}
    panel_in = min(4.0, max(1.5, 0.09 * c["num_gpus"]))  # one row per GPU, within reason
    fig = Figure(figsize=(12, 1.0 + panel_in * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True)
    for ax, (title, placed, makespan) in zip(axes, panels):
        for j in placed:
            _bars(ax, j, colors[j["name"]], span, unit)
        ax.axvline(makespan, color="black", linestyle="--", linewidth=1)
        if makespan > span:
            ax.annotate(f"ends at {makespan:.1f} {sym}", xy=(span, 0.5),
                        xycoords=("data", "axes fraction"),
                        ha="right", va="center", fontsize=9,
                        bbox={"boxstyle": "rarrow", "fc": "white", "ec": "black"})
        if placed is doc["jobs"]:
            title += f": makespan {makespan:.3g} {sym} (dashed)"
        else:
            ax.axvline(joint, color="black", linestyle=":", linewidth=1)
            gain = 100 * (makespan - joint) / makespan
            title += (f": makespan {makespan:.3g} {sym}, joint schedule (dotted) {joint:.3g} "
                      f"{sym} is {abs(gain):.1f}% {'shorter' if gain >= 0 else 'longer'}")
        if doc["now_s"]:
            ax.axvline(doc["now_s"] / unit, color="red", linewidth=1.2)
        ax.set_title(title, fontsize=10, loc="left")
        _node_axis(ax, c["nodes"], c["gpus_per_node"])
    axes[-1].set_xlim(0, span * 1.02)
    axes[-1].set_xlabel(name + (" (red: re-planned at this time)" if doc["now_s"] else ""))
    handles = [Patch(color=colors[j["name"]], label=f"{j['name']}: {model_name(j['model'])}")
               for j in doc["jobs"]]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5),
               fontsize=8, frameon=False)
    fig.suptitle(f"{len(doc['jobs'])} jobs on {cluster_text(c)}", fontsize=11)
    figure.save(fig, path, dpi=110)


def _bars(ax, job: dict, color, span_h: float, unit: float) -> None:
    """One bar per run of consecutive GPU ids, labelled with the job and its GPU count (times in
    ``unit`` seconds, as ``span_h``)."""
    x, w = job["start_s"] / unit, (job["end_s"] - job["start_s"]) / unit
    seen = max(0.0, min(x + w, span_h) - x)  # the part left of the cut
    for lo, hi in runs(job["gpu_ids"]):
        ax.broken_barh([(x, w)], (lo, hi - lo + 1), facecolors=color, edgecolors="white",
                       linewidth=0.8)
        label, rows = f"{job['name']} ({job['gpus']})", hi - lo + 1
        across = len(label) * span_h / 140 < seen  # about 140 characters span the axis
        if across or (rows >= 1.2 * len(label) and seen > span_h / 80):
            ax.text(x + seen / 2, lo + rows / 2, label, ha="center", va="center",
                    rotation=0 if across else 90, fontsize=8 if rows >= 3 else 6, clip_on=True)


def _node_axis(ax, nodes: int, gpus_per_node: int) -> None:
    ax.set_ylim(nodes * gpus_per_node, 0)
    ax.set_yticks([(n + 0.5) * gpus_per_node for n in range(nodes)])
    ax.set_yticklabels([f"node {n}" for n in range(nodes)], fontsize=8)
    for n in range(1, nodes):
        ax.axhline(n * gpus_per_node, color="grey", linewidth=0.6)
