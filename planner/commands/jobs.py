"""`plan jobs`: many jobs on one cluster — GPU counts, plans and start times, against baselines."""

from __future__ import annotations

import logging

log = logging.getLogger("planner")


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
    from planner import jobs
    from planner.errors import SpecError
    from planner.solve.jobs import ScheduleOptions

    options = ScheduleOptions(objective=args.objective, time_limit_s=args.time_limit,
                              time_unit_s=args.time_unit, seed=args.seed)
    if args.replan:
        if args.jobs or args.now is None:
            raise SpecError("replan: give --replan SCHEDULE.json --now SECONDS [--done JOB], "
                            "without a jobs file")
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
        jobs.draw_gantt(result.doc, args.gantt)
        print(f"drew {args.gantt}")
    return 0


def summary(doc: dict, solve_time_s: float) -> str:
    """The schedule as a person reads it: one row per job, then makespan and baselines."""
    c = doc["cluster"]
    lines = [f"Joint schedule of {len(doc['jobs'])} jobs on {c['num_gpus']} x {c['device']} "
             f"({c['name']}: {c['nodes']} nodes x {c['gpus_per_node']})"
             + (f", re-planned at {hours(doc['now_s'])} (done: {', '.join(doc['done']) or '-'})"
                if doc["now_s"] else ""), ""]
    rows = [("job", "model", "GPUs", "nodes", "GPU ids", "start", "end", "state", "plan")]
    for j in sorted(doc["jobs"], key=lambda j: (j["start_s"], j["gpu_ids"])):
        rows.append((j["name"], j["model"], str(j["gpus"]), _ranges(j["nodes"]),
                     _ranges(j["gpu_ids"]), hours(j["start_s"]), hours(j["end_s"]), j["state"],
                     j["parallel"]))
    lines += ["  " + line for line in _table(rows)]
    s = doc["solve"]
    lines += ["", f"  makespan      {hours(doc['makespan_s'])}  (CP-SAT {s['status']}, "
                  f"gap {100 * s['gap']:.1f}%, objective {doc['objective']}, solved in "
                  f"{solve_time_s:.1f} s, grid {s['time_unit_s']:g} s)"]
    for name, b in doc["baselines"].items():
        lines.append(f"  {name:<13} {hours(b['makespan_s'])}  ({b['description']}): joint "
                     f"schedule is {100 * b['improvement']:.1f}% shorter")
    return "\n".join(lines)


def hours(seconds: float) -> str:
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.2f} h"
    if abs(seconds) >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def _ranges(ids) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    out, run = [], []
    for i in list(ids) + [None]:
        if run and (i is None or i != run[-1] + 1):
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        if i is not None:
            run.append(i)
    return ",".join(out)


def _table(rows) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
