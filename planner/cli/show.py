"""`plan show PLAN.json [--why KNOB=V,...] [--gantt OUT.png]`: explain a plan file."""

from __future__ import annotations

import json
import sys

from planner.errors import SpecError
from planner.planfile.document import load_plan
from planner.report.figure import check_path
from planner.report.gantt import gantt, rank_labels
from planner.report.summary import summary, summary_dict
from planner.report.why import why
from planner.schedule.simulator import simulate_plan


def register(add) -> None:
    sh = add("show", help="explain a plan file")
    sh.add_argument("plan", metavar="PLAN.json")
    sh.add_argument("--gantt", metavar="OUT.png|svg",
                    help="draw the plan's pipeline schedule, simulated, as a Gantt chart")
    sh.add_argument("--why", metavar="KNOB=V,...",
                    help="why not these knobs? re-plan the plan's own inputs with them pinned "
                         "(e.g. tp=16 or pp=1,zero=3) and say what changes or what does not fit")
    sh.add_argument("--model", help="with --why: the MODEL to trace instead of the plan's (the "
                                    "same model, where its file moved or the plan was made from "
                                    "a Python object)")
    sh.add_argument("--json", action="store_true",
                    help="print the summary as JSON for scripts (keys model, cluster, "
                         "training, parallel, predicted, stages, search)")
    sh.set_defaults(func=run)


def run(args) -> int:
    if args.gantt is not None:
        check_path(args.gantt, "gantt")
    plan = load_plan(args.plan)
    if args.gantt is not None and getattr(plan, "embeddings", None) is not None:
        raise SpecError("gantt: a recommendation plan (sharded embedding tables, a data-parallel "
                        "dense part) runs no pipeline schedule to draw; drop --gantt")
    if args.model is not None and args.why is None:
        raise SpecError("model: --model names the model --why re-plans; add --why KNOB=V or drop "
                        "--model")
    if args.json:
        if args.why is not None or args.gantt is not None:
            raise SpecError("json: prints the plan's summary only; drop --why and --gantt")
        print(json.dumps(summary_dict(plan), indent=1))
        return 0
    drawn, code = plan, 0
    if args.why is not None:
        from planner.explore.whynot import why_not  # lazy: re-planning imports torch

        answer = why_not(plan, args.why, args.model)
        print(why(plan, answer))
        if answer.feasible and answer.variant is not None:
            drawn = answer.variant  # (--gantt draws the plan --why found)
        code = 0 if answer.feasible else 3  # the pins leave no plan that fits
        if code:  # (none to price at all: the rules refused every one, not the memory)
            word = "no plan" if answer.message.startswith("no configuration has") else \
                "no plan fits"
            print(f"plan: {word}: with {args.why} (the explanation above says why)",
                  file=sys.stderr)
    else:
        print(summary(plan))
    if args.gantt is not None:
        gantt(simulate_plan(drawn), args.gantt,
              title=f"{drawn.model['name']}: {drawn.parallel_summary}"
              + (f" (--why {args.why})" if drawn is not plan else ""),
              labels=rank_labels(drawn))
        print(f"\nwrote {args.gantt}")
    return code
