"""`plan jobs`: many jobs on one cluster — GPU counts, plans and starts, against baselines."""

from __future__ import annotations

import os

from planner.cli.args import count, non_negative_float, positive_float, positive_int
from planner.cli.progress import per_plan_lines
from planner.errors import SpecError
from planner.files import check_output
from planner.report.figure import check_path
from planner.report.gantt import jobs_gantt
from planner.report.jobs import summary
from planner.options import OBJECTIVES, ScheduleOptions


def register(add) -> None:
    j = add("jobs", help="schedule many training jobs on one cluster (GPU counts, plans, times)",
            description="Plan every job of JOBS.yaml on each GPU count, then choose each job's "
                        "count, nodes and start with CP-SAT; compare with running the jobs one "
                        "after another on the whole cluster and with an equal split of the GPUs.")
    j.add_argument("jobs", nargs="?", metavar="JOBS.yaml",
                   help="jobs file: jobs (name, model, global_batch, steps[, seq_len, dtype, "
                        "priority, deadline_s]) and optionally cluster, nodes")
    j.add_argument("--cluster", help="preset or cluster YAML (overrides the jobs file)")
    j.add_argument("--nodes", type=positive_int, help="override the number of nodes")
    j.add_argument("-o", "--output", help="write the schedule JSON here")
    j.add_argument("--gantt", metavar="PNG", help="draw the cluster over time here")
    j.add_argument("--time-limit", type=positive_float, default=30.0,
                   help="seconds for the solver; the best schedule found by then (default 30)")
    j.add_argument("--objective", choices=OBJECTIVES,
                   help="makespan, or completion time weighted by priority (default makespan; "
                        "with --replan, the schedule's own)")
    j.add_argument("--time-unit", type=positive_float,
                   help="schedule grid in seconds (default: about 1/10000 of the horizon)")
    j.add_argument("--seed", type=count, default=0, help="solver random seed (default 0)")
    j.add_argument("--workers", type=positive_int, default=2,
                   help="processes tracing and planning distinct models (default 2)")
    j.add_argument("--replan", metavar="SCHEDULE.json",
                   help="re-solve a schedule from --now: --done jobs leave, running jobs stay")
    j.add_argument("--done", action="append", default=[], metavar="JOB[,JOB]",
                   help="with --replan: jobs that have finished (repeat or comma-separate)")
    j.add_argument("--now", type=non_negative_float, help="with --replan: seconds since the schedule began")
    j.add_argument("--record-timing", action="store_true",
                   help="store the solve time in the schedule (files then differ run to run)")
    j.set_defaults(func=run)


def run(args) -> int:
    with per_plan_lines(args.verbose):
        return _run(args)


def _run(args) -> int:
    from planner.jobs import joint, spec  # lazy: planning the jobs imports torch (seconds)

    if args.gantt:
        check_path(args.gantt, "gantt")
    if args.output is not None:
        check_output(args.output, "output", inputs=(args.jobs, args.replan))
        if args.gantt and os.path.abspath(args.gantt) == os.path.abspath(args.output):
            raise SpecError(f"gantt: '{args.gantt}' is also the schedule's --output; draw it "
                            "to another file")
    schedule = joint.load_schedule(args.replan) if args.replan else {}
    options = ScheduleOptions(objective=args.objective or schedule.get("objective", "makespan"),
                              time_limit_s=args.time_limit, time_unit_s=args.time_unit,
                              seed=args.seed)
    if args.replan:
        if args.now is None:
            raise SpecError("now: missing; --replan needs --now SECONDS, the time into the "
                            "schedule at which it is made again (--replan SCHEDULE.json --now "
                            "SECONDS [--done JOB])")
        if args.jobs or args.cluster or args.nodes:
            raise SpecError("replan: give --replan SCHEDULE.json --now SECONDS [--done JOB], "
                            "without a jobs file or --cluster/--nodes (the schedule holds them)")
        done = [n.strip() for item in args.done for n in item.split(",") if n.strip()]
        result = joint.replan(schedule, done=done, now_s=args.now,
                              options=options, record_timing=args.record_timing)
    else:
        if not args.jobs:
            raise SpecError("jobs: give a jobs file (plan jobs JOBS.yaml --cluster C), or "
                            "--replan SCHEDULE.json")
        if args.done or args.now is not None:
            raise SpecError("done/now: only with --replan SCHEDULE.json")
        if args.workers < 1:
            raise SpecError(f"workers: expected a positive integer, got {args.workers}")
        result = joint.plan_jobs(spec.load_jobs(args.jobs), cluster=args.cluster,
                                 nodes=args.nodes, options=options, workers=args.workers,
                                 record_timing=args.record_timing)
    # the files first: a reader closing the pipe early (`| head`) must not cost them
    if args.output is not None:
        joint.write_schedule(args.output, result.doc)
    if args.gantt:
        jobs_gantt(result.doc, args.gantt)
    print(summary(result.doc, result.solve_time_s))
    if args.output is not None:
        print(f"\nwrote {args.output}")
    if args.gantt:
        print(f"drew {args.gantt}")
    return 0
