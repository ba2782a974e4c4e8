"""`plan run PLAN.json`: execute a plan on torch.distributed and compare with its prediction.

A plan with an ``embeddings`` section (a recommendation model) runs with TorchRec
(planner.runtime.recsys); every other plan with planner's own runtime (planner.runtime.launch)."""

from __future__ import annotations

import dataclasses
import json
import logging

from planner.cli.args import count, positive_float, positive_int
from planner.files import atomic_write, check_output, check_output_folder
from planner.machine import usable_cores
from planner.planfile.document import load_plan
from planner.report.measured import off_hints, recsys_summary, summary
from planner.runtime.options import DEVICES, RunOptions

HOST_NOTE_BYTES = 64e9
"""A dry run says how much host memory a node's processes take above this."""


def register(add) -> None:
    r = add("run", help="execute a plan with torch.distributed on synthetic data and measure it")
    r.add_argument("plan", metavar="PLAN.json")
    r.add_argument("--steps", type=positive_int, default=5,
                   help="measured steps after the warm-up (default 5; on the CPU the last one "
                        "profiles memory and is not timed)")
    r.add_argument("--warmup", type=count, default=2,
                   help="untimed steps first (default 2: on a CPU a first timed step after one "
                        "still runs slower)")
    r.add_argument("--nproc", type=positive_int, help="processes per node (default: what the plan needs)")
    r.add_argument("--model", help="MODEL to build instead of the plan's (same fingerprint)")
    r.add_argument("--seed", type=count, default=0, help="seed of weights and data (default 0)")
    r.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate (default 1e-3)")
    r.add_argument("--device", default="auto", choices=DEVICES)
    r.add_argument("--threads", type=positive_int,
                   help="CPU threads per process (default: those the plan's CPU calibration "
                        "measured with, else cores / processes)")
    r.add_argument("--dump", metavar="DIR", help="write each stage's parameters after the run")
    r.add_argument("-o", "--output", help="write the measurements as JSON here")
    r.add_argument("--dry-run", action="store_true",
                   help="print the launch command for the plan's own cluster (one torchrun "
                        "command every node runs, with a c10d rendezvous) instead of running")
    r.set_defaults(func=run)


def _warn_oversubscribed(device: str, processes: int, threads: int | None) -> None:
    """Warn when CPU processes (times their threads) outnumber this machine's cores: they take
    turns on the cores, so the measured step is slower than any prediction."""
    if device != "cpu":
        return
    cores = usable_cores()
    wanted = processes * (threads or 1)
    if wanted > cores:
        fix = (f"give --threads {max(1, cores // processes)}" if processes <= cores else
               f"run plans of at most {cores} processes here")
        logging.getLogger("planner").warning(
            "run: %d processes x %d thread%s on %d core%s: they take turns, so the step measured "
            "here is slower than predicted; %s", processes, threads or 1,
            "" if (threads or 1) == 1 else "s", cores, "" if cores == 1 else "s", fix)


def _processes(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def _calibrated_threads(plan, device: str, opts: RunOptions) -> RunOptions:
    """``opts`` with, where --threads was not given and the plan's CPU speeds come from a
    calibration, the threads per process that calibration measured with (a new-user check ran a
    1-thread calibration's plan on 2 threads and read +70% as the cost model's error)."""
    spec = plan.cluster.get("spec")
    own = spec.get("device") if isinstance(spec, dict) else None
    threads = own.get("threads") if isinstance(own, dict) else None
    if opts.threads is not None or device != "cpu" or not threads:
        return opts
    logging.getLogger("planner").info("threads: %d per process, as the plan's calibration "
                                      "measured (--threads sets another)", threads)
    return dataclasses.replace(opts, threads=int(threads))


def run(args) -> int:
    from planner.runtime.launch import (check, cluster_command, host_bytes,  # lazy: imports
                                        node_groups, run_local)  # torch

    if args.output is not None:
        check_output(args.output, "output", inputs=(args.plan,))
    if args.dump is not None:
        check_output_folder(args.dump, "--dump")
    opts = RunOptions(steps=args.steps, warmup=args.warmup, model=args.model, seed=args.seed,
                      lr=args.lr, device=args.device, dump_dir=args.dump, threads=args.threads)
    if load_plan(args.plan).embeddings:
        return _run_recsys(args, opts)
    launch = check(args.plan, opts, args.nproc, dry_run=args.dry_run)
    opts = _calibrated_threads(launch.plan, launch.device, opts)
    if args.dry_run:
        from planner.runtime.build import unrun_notes  # lazy: imports torch
        from planner.runtime.layout import layout_of  # lazy: beside the runtime it describes
        for note in unrun_notes(launch.plan, layout_of(launch.plan)):
            print(f"# note: {note}")
        host = host_bytes(launch.plan, launch.nproc_per_node, launch.device == "cuda")
        if host > HOST_NOTE_BYTES:  # (checked against this host's memory when run here)
            print(f"# note: each process builds the whole model on its host before keeping its "
                  f"stages: a node needs about {host / 1e9:,.0f} GB of host memory")
        from planner.runtime.launch import MAX_CPU_PROCESSES  # lazy: beside the runtime
        if launch.device == "cpu" and launch.nproc_per_node > MAX_CPU_PROCESSES:
            print(f"# note: the runtime starts at most {MAX_CPU_PROCESSES} CPU processes per "
                  f"node, and this plan needs {launch.nproc_per_node}: the command runs on GPUs "
                  "(--device cuda), or re-plan with dp*cp*tp*pp <= "
                  f"{MAX_CPU_PROCESSES} per node")
        groups = node_groups(launch.plan)
        where = _where(launch.nodes) if not groups else (
            f"on each of the {launch.nodes} nodes, with HEAD_NODE set to the address of node 0 "
            f"and NODE_RANK to the node's number ({'; '.join(groups)})")
        print(f"# {launch.nodes} node(s) x {_processes(launch.nproc_per_node)} ({launch.device}); "
              f"run {where}:")
        print(cluster_command(launch, opts, args.output or "measured.json"))
        print(_then(args.output or "measured.json"))
        return 0
    logging.getLogger("planner").info("running %s with %s ...", args.plan,
                                      _processes(launch.nproc_per_node))
    _warn_oversubscribed(launch.device, launch.nproc_per_node, opts.threads)
    result = run_local(launch, opts)
    result = {"plan": args.plan, **result}
    print(summary(result, args.plan))
    from planner.runtime.measure import threads_per_process  # lazy: imports torch (run it has)
    ran = opts.threads or threads_per_process(launch.nproc_per_node)
    for hint in off_hints(result, launch.plan, ran):
        print(f"hint: {hint}")
    if args.output is not None:
        atomic_write(args.output, json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.output}")
    if args.dump is not None:
        print(f"wrote each stage's parameters to {args.dump}")
    return 0


def _run_recsys(args, opts: RunOptions) -> int:
    """A recommendation plan: its tables sharded by TorchRec as the plan says."""
    from planner.runtime import recsys  # lazy: imports torch and TorchRec

    launch = recsys.check(args.plan, opts, args.nproc, dry_run=args.dry_run)
    opts = _calibrated_threads(load_plan(args.plan), launch.device, opts)
    if args.dry_run:
        where = _where(launch.nodes)
        print(f"# {launch.nodes} node(s) x {_processes(launch.nproc_per_node)} ({launch.device}, "
              f"TorchRec); run {where}:")
        print(recsys.cluster_command(launch, opts, args.output or "measured.json"))
        print(_then(args.output or "measured.json"))
        return 0
    logging.getLogger("planner").info("running %s with %s (TorchRec) ...", args.plan,
                                      _processes(launch.nproc_per_node))
    _warn_oversubscribed(launch.device, launch.nproc_per_node, opts.threads)
    result = {**recsys.run_local(launch, opts)[0], "plan": args.plan}
    print(recsys_summary(result, args.plan))
    if args.output is not None:
        atomic_write(args.output, json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.output}")
    if args.dump is not None:
        print(f"wrote the model's parameters to {args.dump}")
    return 0


def _then(result: str) -> str:
    """What to run once a dry run's command is done."""
    return f"# then `plan show {result}` prints measured against predicted"


def _where(nodes: int) -> str:
    """Where a dry run's launch command runs."""
    return (f"on each of the {nodes} nodes, with HEAD_NODE set to the address of the first"
            if nodes > 1 else "on the node")
