"""The ``plan`` command: parse arguments, call the API, print. No planning logic lives here."""

from __future__ import annotations

import argparse
import logging
import sys
import time

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for flag in ("debug", "verbose", "quiet"):  # accepted before or after the command
        setattr(args, flag, getattr(args, flag, False))
    _setup_logging(args.verbose, args.quiet)
    try:
        from planner.errors import PlannerError
    except ImportError as exc:  # pragma: no cover - broken install
        print(f"plan: cannot import the planner ({exc})", file=sys.stderr)
        return 1
    try:
        return args.func(args) or 0
    except PlannerError as exc:
        if args.debug:
            raise
        print(f"plan: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="more progress detail")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress output")
    p = argparse.ArgumentParser(prog="plan", parents=[common],
                                description="Plan data/tensor/pipeline parallelism for a PyTorch "
                                "training run, and explain the plan.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, **kw):
        return sub.add_parser(name, parents=[common], **kw)

    s = add("solve", help="find the fastest plan that fits and write it as JSON")
    s.add_argument("model", metavar="MODEL", help="zoo name (see `plan models`), config.json "
                   "path, or file.py:factory")
    s.add_argument("--cluster", required=True, help="preset (see `plan clusters`) or YAML file")
    s.add_argument("--nodes", type=int, help="override the number of nodes")
    s.add_argument("--gpus-per-node", type=int, help="override GPUs per node")
    s.add_argument("--global-batch", type=int, required=True, help="samples per optimizer step")
    s.add_argument("--seq-len", type=int, help="tokens per sample (default: the model's)")
    s.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    s.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd"])
    s.add_argument("--fix", help="pin knobs, e.g. tp=8,pp=4,schedule=1f1b,recompute=full,zero=1")
    s.add_argument("--calibration", help="calibration JSON from `plan profile` (measured speeds "
                   "replace data-sheet numbers)")
    s.add_argument("--engine", help="software behaviour: attention=flash|materialized, "
                   "kernels=fused|eager, overlap_grad_reduce=true|false, fsdp_copies=true|false")
    s.add_argument("--top-k", type=int, default=3, help="runners-up to keep (default 3)")
    s.add_argument("--time-limit", type=float, help="seconds; return the best plan found so far")
    s.add_argument("--trace", default="auto", choices=["auto", "fx", "export"],
                   help="tracer (default: torch.fx, then torch.export)")
    s.add_argument("--record-timing", action="store_true",
                   help="store the search time in the plan (plan files then differ run to run)")
    s.add_argument("-o", "--output", help="write the plan JSON here")
    s.set_defaults(func=_cmd_solve)

    sh = add("show", help="explain a plan file")
    sh.add_argument("plan", metavar="PLAN.json")
    sh.add_argument("--gantt", metavar="OUT.png|svg",
                    help="draw the plan's pipeline schedule, simulated, as a Gantt chart")
    sh.add_argument("--why", metavar="KNOB=V,...",
                    help="why not these knobs? re-plan the plan's own inputs with them pinned "
                         "(e.g. tp=16 or pp=1,zero=3) and say what changes or what does not fit")
    sh.set_defaults(func=_cmd_show)

    m = add("models", help="list the built-in models")
    m.set_defaults(func=_cmd_models)
    c = add("clusters", help="list the cluster presets")
    c.set_defaults(func=_cmd_clusters)
    from planner.commands import register_all

    register_all(add)
    return p


def _setup_logging(verbose: bool, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("planner")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    for noisy in ("transformers", "torch"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


class _Progress:
    """A one-line progress bar on stderr (redrawn on a terminal, summarized otherwise)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if self.quiet or not self.tty or total == 0:
            return
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        width = 30
        filled = int(width * done / total)
        sys.stderr.write(f"\rsearching [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _cmd_solve(args) -> int:
    import planner
    from planner import report

    logging.getLogger("planner").info("planning %s on %s ...", args.model, args.cluster)
    p = planner.plan(args.model, cluster=args.cluster, nodes=args.nodes,
                     gpus_per_node=args.gpus_per_node, global_batch=args.global_batch,
                     seq_len=args.seq_len, dtype=args.dtype, optimizer=args.optimizer,
                     fix=args.fix, top_k=args.top_k, time_limit_s=args.time_limit,
                     engine=args.engine, calibration=args.calibration,
                     trace_method=args.trace, record_timing=args.record_timing,
                     progress=_Progress(args.quiet))
    print(report.summary(p))
    if args.output:
        p.save(args.output)
        print(f"\nwrote {args.output}")
    return 0


def _cmd_show(args) -> int:
    from planner import report
    from planner.plan import load_plan

    plan = load_plan(args.plan)
    if args.why:
        from planner.explain import why_not

        print(report.why(plan, why_not(plan, args.why)))
    else:
        print(report.summary(plan))
    if args.gantt:
        from planner.plots import gantt
        from planner.simulate import simulate_plan

        gantt(simulate_plan(plan), args.gantt,
              title=f"{plan.model['name']}: {plan.parallel_summary}")
        print(f"\nwrote {args.gantt}")
    return 0


def _cmd_models(args) -> int:
    from planner import report
    from planner.zoo import ZOO

    rows = [("name", "default seq", "description")]
    rows += [(e.name, str(e.seq_len), e.description) for e in ZOO.values()]
    print(report.listing(rows))
    print("\nAlso: a Hugging Face config.json path, or path/to/file.py:factory returning "
          "(model, example_inputs).")
    return 0


def _cmd_clusters(args) -> int:
    from costmodels.topology import CLUSTERS
    from planner import report

    rows = [("name", "device", "gpus/node", "memory", "intra GB/s", "inter GB/s", "description")]
    for c in CLUSTERS.values():
        rows.append((c.name, c.device.name, str(c.gpus_per_node),
                     f"{c.device.memory_bytes / 1e9:.0f} GB",
                     f"{c.intra_node.bandwidth_bytes_per_s / 1e9:g}",
                     f"{c.inter_node.bandwidth_bytes_per_s / 1e9:g}", c.description))
    print(report.listing(rows))
    print("\nResize with --nodes / --gpus-per-node, or describe your own in YAML (see README).")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
