"""`plan simulate`: re-simulate a plan's pipeline under another schedule and print the difference.

Per-stage times come from the plan's ``stages[].predicted`` (planner.schedule.simulator.plan_inputs):
the forward with half the tensor-parallel communication, the backward with recomputation and the
other half; schedules that split the backward (zb-h1) give its weight-gradient GEMMs (``wgrad_s``)
to W and the rest to B. Each rank's memory is the plan's with its peak of activations replaced by
the other schedule's (planner.report.simulation.rank_memory); a schedule that does not fit is said.
"""

from __future__ import annotations

import sys

from costmodels import experts
from costmodels.engine import engine_from_mapping
from planner import targets
from planner.cli.args import positive_int
from planner.errors import SpecError
from planner.options import SCHEDULES
from planner.planfile.document import load_plan
from planner.report.figure import check_path
from planner.report.gantt import gantt, rank_labels
from planner.report.simulation import comparison, rank_memory
from planner.schedule.builders import BUILDERS
from planner.schedule.simulator import simulate_plan
from planner.search.hetero import GROUP_SCHEDULES


def register(add) -> None:
    s = add("simulate", help="simulate a plan's pipeline under another schedule",
            description="Simulate the plan's own pipeline schedule and SCHEDULE (event-driven, "
                        "per-stage times from the plan) and print step time, bubble, peak "
                        "in-flight micro-batches and activations, and the difference.")
    s.add_argument("plan", metavar="PLAN.json")
    s.add_argument("--schedule", required=True, choices=list(BUILDERS),
                   help="the schedule to compare with the plan's own")
    s.add_argument("--microbatches", type=positive_int,
                   help="micro-batches per step for SCHEDULE (default: the plan's)")
    s.add_argument("--vpp", type=positive_int, help="virtual stages per rank for interleaved-1f1b")
    s.add_argument("--gantt", metavar="OUT.png", help="draw SCHEDULE's simulation (.png or .svg)")
    s.set_defaults(func=run)


def _overlap_lost(plan, schedule: str, vpp: int | None) -> str:
    """Where the engine's overlapped expert all-to-alls (moe_overlap) run under one of the plan's
    schedule and ``schedule`` and not the other (Megatron-Core needs virtual stages with a
    pipeline): the stage times keep the plan's own exposure, so ``schedule`` reads faster or
    slower than it would run. '' where both agree, or the engine does not overlap them."""
    engine = engine_from_mapping(plan.training.get("engine"))
    p = plan.parallel
    if not engine.moe_overlap:
        return ""
    new_vpp = (vpp or p.get("vpp", 1)) if schedule == "interleaved-1f1b" else 1
    own, new = (not experts.overlap_blockers(engine, ep=p.get("ep", 1), recompute=p["recompute"],
                                             dtype=plan.training.get("dtype", "bf16"),
                                             pp=p["pp"], vpp=v) for v in (p.get("vpp", 1), new_vpp))
    if own == new:
        return ""
    pins = f"schedule={schedule},pp={p['pp']}" + (f",vpp={new_vpp}" if new_vpp > 1 else "")
    again = (f": plan solve --fix {pins} prices them {'exposed' if own else 'overlapped'}"
             if schedule in SCHEDULES else "")
    if own:
        return (f"the plan overlaps the expert all-to-alls with another micro-batch's compute "
                f"(engine moe_overlap), which {schedule} does not run (it needs virtual pipeline "
                f"stages when pp > 1); its stage times keep them hidden, so {schedule} reads "
                f"faster than it would run{again}")
    return (f"{schedule} would run the engine's overlapped expert all-to-alls (moe_overlap), "
            f"which the plan's own schedule does not; its stage times keep them exposed, so "
            f"{schedule} reads slower than it would run{again}")


def run(args) -> int:
    if args.gantt is not None:
        check_path(args.gantt, "gantt")
    plan = load_plan(args.plan)
    if plan.cluster.get("groups") and plan.parallel.get("dp_replicate", 1) == 1 and (
            args.schedule not in GROUP_SCHEDULES or (args.vpp or 1) > 1):
        # (its stages' times hold for one stage per rank: more chunks cross the slow links more;
        # data parallelism across sites keeps each pipeline inside a site, priced as one kind)
        raise SpecError(f"schedule: {args.schedule}{f' with vpp={args.vpp}' if args.vpp else ''} "
                        "is not priced on clusters of device groups or sites, whose stages keep "
                        f"one per rank; simulate {' or '.join(GROUP_SCHEDULES)}")
    base = simulate_plan(plan)
    other = simulate_plan(plan, schedule_name=args.schedule, microbatches=args.microbatches,
                          vpp=args.vpp)
    print(comparison(plan, base, other, args.schedule, args.vpp))
    unrun = targets.schedule_unrun(plan.search.get("target", "any"), args.schedule,
                                   plan.parallel["recompute"], plan.parallel["pp"])
    if unrun:
        print(f"note: the plan was made for --target {plan.search['target']}, and {unrun}")
    overlap = _overlap_lost(plan, args.schedule, args.vpp)
    if overlap:
        print(f"note: {overlap}")
    memory = rank_memory(plan, base, other, twice=args.schedule == "bidirectional")
    if args.gantt is not None:
        new_v = f" x{args.vpp}" if args.vpp and args.vpp > 1 else ""
        gantt(other, args.gantt, title=f"{plan.model.get('name', 'model')}: "
              f"{args.schedule}{new_v}, pp={plan.parallel['pp']}", labels=rank_labels(plan))
        print(f"\nwrote {args.gantt}")
    if memory is not None and memory[2]:  # the schedule asked for does not fit: as solve, exit 3
        print(f"plan: no plan fits: {args.schedule} on {len(memory[2])} of the plan's "
              f"{plan.parallel['pp']} pipeline ranks (the comparison above says by how much)",
              file=sys.stderr)
        return 3
    return 0
