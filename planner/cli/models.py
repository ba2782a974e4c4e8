"""`plan models`: the built-in models."""

from __future__ import annotations

from planner.inputs.zoo import RECSYS, ZOO
from planner.report.text import listing


def register(add) -> None:
    m = add("models", help="list the built-in models")
    m.set_defaults(func=run)


def run(args) -> int:
    rows = [("name", "default seq", "description")]
    rows += [(e.name, str(e.seq_len), e.description) for e in ZOO.values()]
    rows += [(e.name, "-", e.description + " (recommendation model: tables sharded)")
             for e in RECSYS.values()]
    print(listing(rows))
    print("\nAlso: a Hugging Face config.json path, or path/to/file.py:factory returning "
          "(model, example_inputs).")
    return 0
