"""`plan jobs`: many jobs on one cluster — GPU counts, plans and starts, against baselines."""

from __future__ import annotations

import os

from planner.errors import SpecError


def register(add) -> None:
    j = add("jobs", help="schedule many training jobs on one cluster (GPU counts, plans, times)",
            description="Plan every job of JOBS.yaml on each GPU count, then choose each job's "
                        "count, nodes and start with CP-SAT; compare with running the jobs one "
                        "after another on the whole cluster and with an equal split of the GPUs.")
    j.add_argument("jobs", nargs="?", metavar="JOBS.yaml",
                   help="jobs file: jobs (name, model, global_batch, seq_len, steps[, priority, "
                        "deadline_s]) and optionally cluster, nodes")
    j.add_argument("--cluster", help="preset or cluster YAML (overrides the jobs file)")
    j.add_argument("--nodes", type=int, help="override the number of nodes")
    j.add_argument("-o", "--output", help="write the schedule JSON here")
    j.add_argument("--gantt", metavar="PNG", help="draw the cluster over time here")
    j.add_argument("--time-limit", type=float, default=30.0,
                   help="seconds for the solver; the best schedule found by then (default 30)")
    j.add_argument("--objective", default="makespan", choices=["makespan", "weighted"],
                   help="makespan, or completion time weighted by priority")
    j.add_argument("--time-unit", type=float,
                   help="schedule grid in seconds (default: about 1/10000 of the horizon)")
    j.add_argument("--seed", type=int, default=0, help="solver random seed (default 0)")
    j.add_argument("--workers", type=int, default=2,
                   help="processes tracing and planning distinct models (default 2)")
    j.add_argument("--replan", metavar="SCHEDULE.json",
                   help="re-solve a schedule from --now: --done jobs leave, running jobs stay")
    j.add_argument("--done", action="append", default=[], metavar="JOB[,JOB]",
                   help="with --replan: jobs that have finished (repeat or comma-separate)")
    j.add_argument("--now", type=float, help="with --replan: seconds since the schedule began")
    j.add_argument("--record-timing", action="store_true",
                   help="store the solve time in the schedule (files then differ run to run)")
    j.set_defaults(func=_cmd_jobs)


def _cmd_jobs(args) -> int:
    import logging

    from planner import jobs
    from planner.solve.jobs import ScheduleOptions

    if not args.verbose:  # one line per planned (job, GPU count) is too much here
        logging.getLogger("planner.api").setLevel(logging.WARNING)

    if args.gantt and not args.gantt.lower().endswith(GANTT_FORMATS):
        raise SpecError(f"gantt: '{args.gantt}' must end in {' or '.join(GANTT_FORMATS)}")
    options = ScheduleOptions(objective=args.objective, time_limit_s=args.time_limit,
                              time_unit_s=args.time_unit, seed=args.seed)
    if args.replan:
        if args.jobs or args.now is None or args.cluster or args.nodes:
            raise SpecError("replan: give --replan SCHEDULE.json --now SECONDS [--done JOB], "
                            "without a jobs file or --cluster/--nodes (the schedule holds them)")
        done = [n.strip() for item in args.done for n in item.split(",") if n.strip()]
        result = jobs.replan(jobs.load_schedule(args.replan), done=done, now_s=args.now,
                             options=options, record_timing=args.record_timing)
    else:
        if not args.jobs:
            raise SpecError("jobs: give a jobs file (plan jobs JOBS.yaml --cluster C), or "
                            "--replan SCHEDULE.json")
        if args.done or args.now is not None:
            raise SpecError("done/now: only with --replan SCHEDULE.json")
        if args.workers < 1:
            raise SpecError(f"workers: expected a positive integer, got {args.workers}")
        result = jobs.plan_jobs(jobs.load_jobs(args.jobs), cluster=args.cluster,
                                nodes=args.nodes, options=options, workers=args.workers,
                                record_timing=args.record_timing)
    print(summary(result.doc, result.solve_time_s))
    if args.output:
        jobs.write_schedule(args.output, result.doc)
        print(f"\nwrote {args.output}")
    if args.gantt:
        draw_gantt(result.doc, args.gantt)
        print(f"drew {args.gantt}")
    return 0


GANTT_FORMATS = (".png", ".svg")
GANTT_CLIP = 2.5
"""The time axis ends at this many joint makespans at most (longer baselines are cut off)."""


def draw_gantt(doc: dict, path: str) -> None:
    """The cluster over time, one row per GPU: the joint schedule above the two baselines.

    Drawn on a bare matplotlib Figure with the Agg canvas (no pyplot state, no backend switch)."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if not path.lower().endswith(GANTT_FORMATS):
        raise SpecError(f"gantt: '{path}' must end in {' or '.join(GANTT_FORMATS)}")
    c, joint = doc["cluster"], doc["makespan_s"] / 3600
    panels = [("joint schedule (CP-SAT)", doc["jobs"], joint)]
    panels += [(b["description"], b["jobs"], b["makespan_s"] / 3600)
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
            _bars(ax, j, colors[j["name"]], span)
        ax.axvline(makespan, color="black", linestyle="--", linewidth=1)
        if makespan > span:
            ax.annotate(f"ends at {makespan:.1f} h", xy=(span, 0.5),
                        xycoords=("data", "axes fraction"),
                        ha="right", va="center", fontsize=9,
                        bbox={"boxstyle": "rarrow", "fc": "white", "ec": "black"})
        if placed is doc["jobs"]:
            title += f": makespan {makespan:.2f} h (dashed)"
        else:
            ax.axvline(joint, color="black", linestyle=":", linewidth=1)
            title += (f": makespan {makespan:.2f} h, joint schedule (dotted) {joint:.2f} h is "
                      f"{100 * (makespan - joint) / makespan:.0f}% shorter")
        if doc["now_s"]:
            ax.axvline(doc["now_s"] / 3600, color="red", linewidth=1.2)
        ax.set_title(title, fontsize=10, loc="left")
        _node_axis(ax, c["nodes"], c["gpus_per_node"])
    axes[-1].set_xlim(0, span * 1.02)
    axes[-1].set_xlabel("hours" + (" (red: re-planned at this time)" if doc["now_s"] else ""))
    handles = [Patch(color=colors[j["name"]], label=f"{j['name']}: {_model_name(j['model'])}")
               for j in doc["jobs"]]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5),
               fontsize=8, frameon=False)
    fig.suptitle(f"{len(doc['jobs'])} jobs on {c['nodes']} nodes x {c['gpus_per_node']} "
                 f"{c['device']} ({c['name']})", fontsize=11)
    fig.savefig(path, dpi=110)


def _bars(ax, job: dict, color, span_h: float) -> None:
    """One bar per run of consecutive GPU ids, labelled with the job and its GPU count."""
    x, w = job["start_s"] / 3600, (job["end_s"] - job["start_s"]) / 3600
    seen = max(0.0, min(x + w, span_h) - x)  # the part left of the cut
    for lo, hi in _runs(job["gpu_ids"]):
        ax.broken_barh([(x, w)], (lo, hi - lo + 1), facecolors=color, edgecolors="white",
                       linewidth=0.8)
        label, rows = f"{job['name']} ({job['gpus']})", hi - lo + 1
        across = len(label) * span_h / 140 < seen  # about 140 characters span the axis
        if across or (rows >= 1.2 * len(label) and seen > span_h / 80):
            ax.text(x + seen / 2, lo + rows / 2, label, ha="center", va="center",
                    rotation=0 if across else 90, fontsize=8 if rows >= 3 else 6, clip_on=True)


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ids: [0,1,2,5] -> [(0, 2), (5, 5)]."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return [tuple(r) for r in runs]


def _node_axis(ax, nodes: int, gpus_per_node: int) -> None:
    ax.set_ylim(nodes * gpus_per_node, 0)
    ax.set_yticks([(n + 0.5) * gpus_per_node for n in range(nodes)])
    ax.set_yticklabels([f"node {n}" for n in range(nodes)], fontsize=8)
    for n in range(1, nodes):
        ax.axhline(n * gpus_per_node, color="grey", linewidth=0.6)


def summary(doc: dict, solve_time_s: float) -> str:
    """The schedule as a person reads it: one row per job, then makespan and baselines."""
    c = doc["cluster"]
    lines = [f"Joint schedule of {len(doc['jobs'])} jobs on {c['num_gpus']} x {c['device']} "
             f"({c['name']}: {c['nodes']} nodes x {c['gpus_per_node']})"
             + (f", re-planned at {hours(doc['now_s'])} (done: {', '.join(doc['done']) or '-'})"
                if doc["now_s"] else ""), ""]
    rows = [("job", "model", "GPUs", "nodes", "GPU ids", "start", "end", "state", "plan")]
    for j in sorted(doc["jobs"], key=lambda j: (j["start_s"], j["gpu_ids"])):
        rows.append((j["name"], _model_name(j["model"]), str(j["gpus"]), _ranges(j["nodes"]),
                     _ranges(j["gpu_ids"]), hours(j["start_s"]), hours(j["end_s"]), j["state"],
                     j["parallel"]))
    lines += ["  " + line for line in _table(rows)]
    s = doc["solve"]
    lines += ["", f"  makespan      {hours(doc['makespan_s'])}  (CP-SAT {s['status']}, "
                  f"gap {100 * s['gap']:.1f}%, objective {doc['objective']}, solved in "
                  f"{solve_time_s:.1f} s, grid {s['time_unit_s']:g} s)"]
    for name, b in doc["baselines"].items():
        word = "shorter" if b["improvement"] >= 0 else "longer"
        lines.append(f"  {name:<13} {hours(b['makespan_s'])}  ({b['description']}): joint "
                     f"schedule is {100 * abs(b['improvement']):.1f}% {word}")
    return "\n".join(lines)


def hours(seconds: float) -> str:
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.2f} h"
    if abs(seconds) >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def _ranges(ids) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in _runs(ids))


def _table(rows) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _model_name(model: str) -> str:
    """A short name for a MODEL: the zoo name, a config's folder, or the factory."""
    if model.endswith("config.json"):
        return os.path.basename(os.path.dirname(os.path.abspath(model))) or model
    return os.path.basename(model)
