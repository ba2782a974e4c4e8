"""`plan export PLAN.json --to torchtitan|megatron|deepspeed|torchrec [--engine-version V] [-o FILE]`.

Prints the exported text, or writes it atomically to FILE (a folder gets the plan file's name with
the target's suffix).
What the engine cannot express exactly is a comment in the text and a warning on stderr.
"""

from __future__ import annotations

import logging
import os

from planner.cli.progress import per_plan_lines
from planner.export import SUPPORTED_VERSIONS, TARGETS, export
from planner.files import STDOUT, atomic_write, check_output, check_output_folder
from planner.planfile.document import load_plan

log = logging.getLogger(__name__)

_FORMATS = {".sh": "a command line", ".toml": "TOML", ".json": "JSON", ".py": "Python code"}
"""What each export suffix holds, in words, for the warning when -o names another."""


def register(add) -> None:
    e = add("export", help="turn a plan into torchtitan, Megatron-LM or DeepSpeed settings, or a "
                           "recommendation plan into TorchRec's sharding")
    e.add_argument("plan", metavar="PLAN.json")
    e.add_argument("--to", "--target", dest="to", required=True, choices=sorted(TARGETS),
                   help="target engine (torchrec: recommendation plans only; the others: plans "
                        "without embedding tables, mixtures of experts included); --target, as "
                        "`plan solve` names it, is the same")
    versions = "; ".join(f"{t} {', '.join(v)}" for t, v in SUPPORTED_VERSIONS.items())
    e.add_argument("--engine-version", metavar="V", default=None,
                   help=f"engine release to write for ({versions}); default: the release "
                        "planner.targets describes")
    e.add_argument("-o", "--output", metavar="FILE",
                   help="write here (a folder, one that exists or one made in an existing folder "
                        "if the name ends in / : the plan file's name with the target's suffix; "
                        "-: stdout) instead of printing")
    e.set_defaults(func=run)


def run(args) -> int:
    folder = bool(args.output) and args.output != STDOUT and (
        os.path.isdir(args.output) or args.output.endswith(("/", os.sep)))
    if folder:
        check_output_folder(args.output, "output")  # a missing one is made (as plan run does)
    elif args.output is not None:
        check_output(args.output, "output", inputs=(args.plan,))
    stem = os.path.splitext(os.path.basename(args.plan))[0]  # a folder gets PLAN.<target suffix>
    with per_plan_lines(args.verbose):  # the memory re-check's trace: the plan said it already
        text, name = export(load_plan(args.plan), args.to, args.engine_version, stem=stem)
    if not args.output or args.output == STDOUT:
        print(text, end="")
        return 0
    if folder:
        os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, name) if folder else args.output
    check_output(path, "output", inputs=(args.plan,))
    given, written = os.path.splitext(path)[1], os.path.splitext(name)[1]
    if given and given != written:  # e.g. torchtitan 0.3.0's command line into a .toml file
        log.warning("export %s: the export is %s (%s), written to '%s' as asked, whose name "
                    "ends in %s", args.to, _FORMATS.get(written, "text"), written, path, given)
    atomic_write(path, text)
    print(f"wrote {path}")
    return 0
