"""`plan simulate`: re-simulate a plan's pipeline under another schedule and print the difference.

Per-stage times come from the plan's ``stages[].predicted`` (planner.simulate.plan_inputs): the
forward with half the tensor-parallel communication, the backward with recomputation and the other
half; schedules that split the backward (zb-h1) give half of ``bwd_s`` to W and the rest to B.
"""

from __future__ import annotations


def register(add) -> None:
    from planner.schedule import BUILDERS

    s = add("simulate", help="simulate a plan's pipeline under another schedule",
            description="Simulate the plan's own pipeline schedule and SCHEDULE (event-driven, "
                        "per-stage times from the plan) and print step time, bubble, peak "
                        "in-flight micro-batches and activations, and the difference.")
    s.add_argument("plan", metavar="PLAN.json")
    s.add_argument("--schedule", required=True, choices=list(BUILDERS),
                   help="the schedule to compare with the plan's own")
    s.add_argument("--microbatches", type=int,
                   help="micro-batches per step for SCHEDULE (default: the plan's)")
    s.add_argument("--vpp", type=int, help="virtual stages per rank for interleaved-1f1b")
    s.add_argument("--gantt", metavar="OUT.png", help="draw SCHEDULE's simulation (.png or .svg)")
    s.set_defaults(func=_cmd_simulate)


def _cmd_simulate(args) -> int:
    from planner import report
    from planner.plan import load_plan
    from planner.simulate import simulate_plan

    plan = load_plan(args.plan)
    par = plan.parallel
    base = simulate_plan(plan)
    other = simulate_plan(plan, schedule_name=args.schedule, microbatches=args.microbatches,
                          vpp=args.vpp)
    own_v = f" x{par.get('vpp', 1)}" if par.get("vpp", 1) > 1 else ""
    new_v = f" x{args.vpp}" if args.vpp and args.vpp > 1 else ""
    rows = [("", f"plan: {par['schedule']}{own_v}", f"{args.schedule}{new_v}", "change"),
            ("micro-batches", str(base.microbatches), str(other.microbatches), ""),
            ("pipeline time", f"{base.step_time_s:.4g} s", f"{other.step_time_s:.4g} s",
             f"{other.step_time_s - base.step_time_s:+.3f} s "
             f"({100 * (other.step_time_s / base.step_time_s - 1):+.1f}%)"),
            ("bubble", f"{base.bubble_fraction:.1%}", f"{other.bubble_fraction:.1%}",
             f"{round(100 * (other.bubble_fraction - base.bubble_fraction), 1) + 0.0:+.1f} points"),
            ("peak in flight", str(max(base.peak_in_flight)), str(max(other.peak_in_flight)),
             f"{max(other.peak_in_flight) - max(base.peak_in_flight):+d}"),
            ("peak activations", report.gb(max(base.peak_activation_bytes)),
             report.gb(max(other.peak_activation_bytes)),
             f"{(max(other.peak_activation_bytes) - max(base.peak_activation_bytes)) / 1e9:+.3g} GB")]
    print(f"{plan.model.get('name', 'model')}: pp={par['pp']}, per-micro-batch times from the "
          f"plan; pipeline only (no data-parallel sync or optimizer step)\n")
    print(report.listing(rows))
    print("\npeak in flight: (stage, micro-batch) activations held by the busiest rank; "
          "with vpp > 1 each is one chunk of the rank's layers")
    if args.schedule == "bidirectional":
        print("bidirectional keeps two copies of every stage's weights, gradients and optimizer "
              "state (not counted above)")
    if args.gantt:
        from planner import plots

        plots.gantt(other, args.gantt, title=f"{plan.model.get('name', 'model')}: "
                    f"{args.schedule}{new_v}, pp={par['pp']}")
        print(f"\nwrote {args.gantt}")
    return 0
