"""``plan``: the parser, logging, and the one-line error contract (PlannerError -> exit 2).

Each subcommand lives in its own module of this package, which defines ``register(add)``:
``add(name, help=...)`` returns an argparse subparser (it already has --debug/-v/-q); the module
adds its arguments and ``set_defaults(func=...)``, where ``func(args) -> int`` calls the API and
prints. A PlannerError raised by ``func`` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from planner.errors import InternalError, PlannerError

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1
COMMANDS = ("solve", "show", "models", "clusters", "profile", "simulate", "export", "run", "jobs",
            "whatif", "diff")
"""Modules of planner.cli, one per subcommand, in the order `plan --help` lists them."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for flag in ("debug", "verbose", "quiet"):  # accepted before or after the command
        setattr(args, flag, getattr(args, flag, False))
    _setup_logging(args.verbose, args.quiet)
    try:
        return args.func(args) or 0
    except InternalError as exc:
        if args.debug:
            raise
        print(f"plan: internal error: {exc} (a bug in the planner: please report it with the "
              "command line; --debug shows where)", file=sys.stderr)
        return EXIT_INTERNAL
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

    for name in COMMANDS:
        importlib.import_module(f"planner.cli.{name}").register(add)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
