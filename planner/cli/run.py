"""`plan run PLAN.json`: execute a plan on torch.distributed and compare with its prediction."""

from __future__ import annotations

import json
import logging

from planner.cli.args import count, positive_float, positive_int
from planner.files import atomic_write
from planner.report.measured import summary
from planner.runtime.options import DEVICES, RunOptions


def register(add) -> None:
    r = add("run", help="execute a plan with torch.distributed on synthetic data and measure it")
    r.add_argument("plan", metavar="PLAN.json")
    r.add_argument("--steps", type=positive_int, default=5, help="measured steps (default 5)")
    r.add_argument("--warmup", type=count, default=1, help="untimed steps first (default 1)")
    r.add_argument("--nproc", type=positive_int, help="processes per node (default: what the plan needs)")
    r.add_argument("--model", help="MODEL to build instead of the plan's (same fingerprint)")
    r.add_argument("--seed", type=count, default=0, help="seed of weights and data (default 0)")
    r.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate (default 1e-3)")
    r.add_argument("--device", default="auto", choices=DEVICES)
    r.add_argument("--threads", type=positive_int,
                   help="CPU threads per process (default: cores / processes)")
    r.add_argument("--dump", metavar="DIR", help="write each stage's parameters after the run")
    r.add_argument("-o", "--output", help="write the measurements as JSON here")
    r.set_defaults(func=run)


def run(args) -> int:
    from planner.runtime.launch import check, node_commands, run_local  # lazy: imports torch

    opts = RunOptions(steps=args.steps, warmup=args.warmup, model=args.model, seed=args.seed,
                      lr=args.lr, device=args.device, dump_dir=args.dump, threads=args.threads)
    launch = check(args.plan, opts, args.nproc)
    if launch.nodes > 1:
        print(f"The plan spans {launch.nodes} nodes; run this on each node, with NODE0_ADDR the "
              "address of node 0:")
        for line in node_commands(launch, opts, args.output or "measured.json"):
            print(line)
        return 0
    logging.getLogger("planner").info("running %s with %d processes ...", args.plan,
                                      launch.nproc_per_node)
    result = run_local(launch, opts)
    result = {"plan": args.plan, **result}
    print(summary(result, args.plan))
    if args.output:
        atomic_write(args.output, json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.output}")
    return 0
