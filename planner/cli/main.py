"""``plan``: the parser, logging, and the one-line error contract.

Each subcommand lives in its own module of this package, which defines ``register(add)``:
``add(name, help=...)`` returns an argparse subparser (it already has --debug/-v/-q); the module
adds its arguments and ``set_defaults(func=...)``, where ``func(args) -> int`` calls the API and
prints. What ``func`` raises becomes one line on stderr and an exit code: 2 bad input (SpecError,
TraceError), 3 no plan fits (InfeasibleError), 4 processes of a plan run or a measurement failed
(RunError),
1 a bug of the planner's own (InternalError or any other exception; --debug shows the
traceback).
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import logging
import sys
from importlib.metadata import PackageNotFoundError, version

from planner import logs
from planner.errors import (InfeasibleError, InternalError, PlannerError, RunError,
                            Terminated)

EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_NO_PLAN = 3
EXIT_RUN_FAILED = 4
COMMANDS = ("solve", "show", "models", "clusters", "profile", "simulate", "export", "run", "jobs",
            "whatif", "diff")
"""Modules of planner.cli, one per subcommand, in the order `plan --help` lists them."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (one line, already printed), --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    for flag in ("debug", "verbose", "quiet"):  # accepted before or after the command
        setattr(args, flag, getattr(args, flag, False))
    for stream in (sys.stdout, sys.stderr):  # a name a terminal's encoding lacks: escaped,
        if hasattr(stream, "reconfigure"):   # not a crash (PYTHONIOENCODING=ascii)
            stream.reconfigure(errors="backslashreplace")
    _setup_logging(args.verbose, args.quiet)
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command ``args.func``; what it raises becomes one line and an exit code."""
    try:
        return args.func(args) or 0
    except InternalError as exc:
        if args.debug:
            raise
        hint = getattr(exc, "hint", "a bug in the planner: please report it with the command "
                                    "line; --debug shows where")
        print(f"plan: internal error: {exc} ({hint})", file=sys.stderr)
        return EXIT_INTERNAL
    except InfeasibleError as exc:
        if args.debug:
            raise
        text = str(exc)
        # "no plan fits: ..." / "no schedule ...": the message names what was not found; a
        # configuration a rule refuses (not its memory) is "no plan:"
        fits = exc.reason in ("out of memory", "no plan", "infeasible", "job fits nowhere")
        word = "no plan fits" if fits else "no plan"
        print(f"plan: {text}" if text.startswith("no ") else f"plan: {word}: {text}",
              file=sys.stderr)
        return EXIT_NO_PLAN
    except RunError as exc:
        if args.debug:
            raise
        print(f"plan: {exc.kind} failed: {exc} ({exc.hint})", file=sys.stderr)
        return EXIT_RUN_FAILED
    except PlannerError as exc:
        if args.debug:
            raise
        print(f"plan: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:  # Ctrl-C: 130; a SIGTERM plan run passed on: 143
        print("plan: interrupted", file=sys.stderr)
        return 128 + exc.signum if isinstance(exc, Terminated) else 130
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0
    except OSError as exc:
        if args.debug:
            raise
        if exc.errno in WRITE_ERRNOS:  # stdout on a full disk or a failing device: not a bug
            print(f"plan: error: cannot write the output: {exc.strerror}; free space or write "
                  "elsewhere", file=sys.stderr)
            return EXIT_BAD_INPUT
        return _internal(exc)
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: one line, exit 1
        if args.debug:
            raise
        return _internal(exc)


WRITE_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS)
"""Errors of writing where the output went (a full disk, a failing device): the machine's, not
the planner's."""


def _internal(exc: BaseException) -> int:
    """A bug of the planner's own: one line, exit 1."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    print(f"plan: internal error: {type(exc).__name__}: {first}; run with --debug for the "
          "traceback, and please report it with the command line", file=sys.stderr)
    return EXIT_INTERNAL


OUTPUT_OPTIONS = {"whatif": "plan whatif writes --csv OUT.csv and --plot OUT.png; ",
                  "show": "plan show writes --gantt OUT.png or --json to stdout; ",
                  "diff": "plan diff prints; ",
                  "simulate": "plan simulate prints, and draws --gantt OUT.png; "}
"""What a command writes instead of -o, said where -o is given to it."""


class _Parser(argparse.ArgumentParser):
    """argparse with the planner's error contract: one line on stderr, exit 2."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"plan: error: {message} (see `{self.prog} --help`)\n")

    def parse_args(self, args=None, namespace=None):
        """Options no command knows point to the help of the command given, not the top's."""
        args = list(sys.argv[1:] if args is None else args)
        self._refuse_misspelled(args)
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(ns, "command", None)
            where = f"{self.prog} {command}" if command else self.prog
            hint = OUTPUT_OPTIONS.get(command, "") if {"-o", "--output"} & set(extras) else ""
            self.exit(EXIT_BAD_INPUT, f"plan: error: unrecognized arguments: {' '.join(extras)} "
                                      f"({hint}see `{where} --help`)\n")
        return ns

    def _refuse_misspelled(self, args: list[str]) -> None:
        """A long option the command (or, before it, `plan` itself) does not know, named with
        the closest it does, before argparse would report the required option it stands for as
        missing instead."""
        commands = self._subparsers._group_actions[0].choices if self._subparsers else {}
        command = next((a for a in args if a in commands), None)
        if command is None:
            return
        at = args.index(command)
        after = args[at + 1:]
        for arg in args[:at]:
            self._refuse_unknown(arg, self._option_string_actions, self.prog)
        for arg in after[:after.index("--")] if "--" in after else after:
            self._refuse_unknown(arg, commands[command]._option_string_actions,
                                 f"{self.prog} {command}", command)

    def _refuse_unknown(self, arg: str, known, where: str, command: str | None = None) -> None:
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in known:
            return
        if command and name in self._option_string_actions:  # `plan`'s own (--version)
            self.exit(EXIT_BAD_INPUT, f"plan: error: {name} goes before the command: "
                                      f"{self.prog} {name}\n")
        close = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], n=1,
                                          cutoff=0.6)
        output = OUTPUT_OPTIONS.get(command, "") if name == "--output" else ""
        # (where the command writes elsewhere, that is the hint: not --output's look-alike)
        hint = f"; did you mean {close[0]}?" if close and not output else ""
        self.exit(EXIT_BAD_INPUT, f"plan: error: unrecognized argument {name}{hint} "
                                  f"({output}see `{where} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="more progress detail")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress output")
    p = _Parser(prog="plan", parents=[common], allow_abbrev=False,
                                description="Plan data/tensor/pipeline parallelism for a PyTorch "
                                "training run, and explain the plan.")
    p.add_argument("--version", action="version", version=f"plan {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, **kw):
        if "help" in kw:  # `plan NAME --help` opens with what the command does, as `plan --help`
            kw.setdefault("description", kw["help"][0].upper() + kw["help"][1:] + ".")
        return sub.add_parser(name, parents=[common], allow_abbrev=False, **kw)

    for name in COMMANDS:
        importlib.import_module(f"planner.cli.{name}").register(add)
    return p


def _version() -> str:
    try:
        return version("planner")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown (not installed)"


def _setup_logging(verbose: bool, quiet: bool) -> None:
    logs.to_stderr(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    for noisy in ("transformers", "torch"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
