"""`plan export PLAN.json --to torchtitan|megatron|deepspeed [-o FILE]`: a plan in an engine's terms.

Prints the exported text, or writes it atomically to FILE (a folder gets the suggested file name).
What the engine cannot express exactly is a comment in the text and a warning on stderr.
"""

from __future__ import annotations

import os

from planner.errors import SpecError
from planner.export import TARGETS, export
from planner.files import atomic_write
from planner.planfile.document import load_plan


def register(add) -> None:
    e = add("export", help="turn a plan into torchtitan, Megatron-LM or DeepSpeed settings")
    e.add_argument("plan", metavar="PLAN.json")
    e.add_argument("--to", required=True, choices=sorted(TARGETS), help="target engine")
    e.add_argument("-o", "--output", metavar="FILE",
                   help="write here (a folder: use the suggested name) instead of printing")
    e.set_defaults(func=run)


def run(args) -> int:
    text, name = export(load_plan(args.plan), args.to)
    if not args.output:
        print(text, end="")
        return 0
    path = os.path.join(args.output, name) if os.path.isdir(args.output) else args.output
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise SpecError(f"-o: cannot write '{path}' ({exc.strerror or exc}); choose a writable "
                        "file or folder") from None
    print(f"wrote {path}")
    return 0
