"""`plan show PLAN.json [--why KNOB=V,...] [--gantt OUT.png]`: explain a plan file; given what
`plan run` measured (its -o file), print its table of measured against predicted."""

from __future__ import annotations

import json
import sys

from planner.errors import SpecError
from planner.planfile.document import load_plan
from planner.report.figure import check_path
from planner.report.gantt import gantt, rank_labels
from planner.report.measured import recsys_summary
from planner.report.measured import summary as measured_summary
from planner.report.summary import summary, summary_dict
from planner.report.why import why
from planner.schedule.simulator import simulate_plan


def register(add) -> None:
    sh = add("show", help="explain a plan file (or print what plan run measured, from its "
                          "result file)")
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
    measured = run_results(args.plan)
    if measured is not None:  # what `plan run` (or its --dry-run's torchrun command) measured
        if args.why is not None or args.gantt is not None or args.json:
            raise SpecError(f"{args.plan}: holds what plan run measured, which prints as it is; "
                            "drop --why, --gantt and --json, or give the plan file it ran")
        print("\n\n".join(measured))
        return 0
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


def run_results(path: str) -> list[str] | None:
    """The measured-against-predicted tables of a `plan run` result file (its -o file, or the
    file its --dry-run's torchrun command writes: several runs for recommendation plans); None
    for any other file (a plan, left to load_plan to read and check)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("schema") is not None:
        return None
    runs = doc.get("runs") if isinstance(doc.get("runs"), list) else [doc]
    if not runs or not all(isinstance(r, dict) and isinstance(r.get("measured"), dict)
                           and isinstance(r.get("ranks"), list) for r in runs):
        return None
    try:
        return [(recsys_summary if "sharding" in r else measured_summary)(r, str(r.get("plan", path)))
                for r in runs]
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise SpecError(f"{path}: looks like what plan run measured but lacks {exc}; give the "
                        "file plan run -o (or its --dry-run's command) wrote, unedited") from None
