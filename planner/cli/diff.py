"""`plan diff A.json B.json`: two plans side by side — what differs and by how much."""

from __future__ import annotations

from planner.planfile.document import load_plan
from planner.report.diff import diff


def register(add) -> None:
    d = add("diff", help="compare two plan files side by side",
            description="Show where two plans differ: model, cluster and training, the parallel "
                        "configuration, the predicted step time and its parts, throughput, memory "
                        "and the stages, with the change from A to B.")
    d.add_argument("a", metavar="A.json")
    d.add_argument("b", metavar="B.json")
    d.set_defaults(func=run)


def run(args) -> int:
    print(diff(load_plan(args.a), load_plan(args.b), names=(args.a, args.b)))
    return 0
