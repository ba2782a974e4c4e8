"""`plan show PLAN.json [--why KNOB=V,...] [--gantt OUT.png]`: explain a plan file."""

from __future__ import annotations

from planner.planfile.document import load_plan
from planner.report.gantt import gantt
from planner.report.summary import summary
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
    sh.set_defaults(func=run)


def run(args) -> int:
    plan = load_plan(args.plan)
    if args.why:
        from planner.explore.whynot import why_not  # lazy: re-planning imports torch

        print(why(plan, why_not(plan, args.why)))
    else:
        print(summary(plan))
    if args.gantt:
        gantt(simulate_plan(plan), args.gantt,
              title=f"{plan.model['name']}: {plan.parallel_summary}")
        print(f"\nwrote {args.gantt}")
    return 0
