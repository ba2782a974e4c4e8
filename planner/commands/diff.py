"""`plan diff`: two plans side by side — what differs and by how much."""

from __future__ import annotations


def register(add) -> None:
    d = add("diff", help="compare two plan files side by side",
            description="Show where two plans differ: model, cluster and training, the parallel "
                        "configuration, the predicted step time and its parts, throughput, memory "
                        "and the stages, with the change from A to B.")
    d.add_argument("a", metavar="A.json")
    d.add_argument("b", metavar="B.json")
    d.set_defaults(func=_cmd_diff)


def _cmd_diff(args) -> int:
    from planner import report
    from planner.plan import load_plan

    print(report.diff(load_plan(args.a), load_plan(args.b), names=(args.a, args.b)))
    return 0
