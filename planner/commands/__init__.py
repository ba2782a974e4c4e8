"""More `plan` subcommands, one module each.

A command module defines ``register(add)``: ``add(name, help=...)`` returns an argparse
subparser (it already has --debug/-v/-q); the module adds its arguments and
``set_defaults(func=...)``, where ``func(args) -> int`` parses nothing and holds no planning logic:
it calls the API and prints. PlannerError raised by ``func`` becomes a one-line error, exit 2.
"""

from __future__ import annotations

import importlib

COMMANDS: list[str] = ["profile", "simulate", "export", "run", "jobs", "whatif", "diff"]
"""Module names under planner.commands, in the order `plan --help` lists them."""


def register_all(add) -> None:
    for name in COMMANDS:
        importlib.import_module(f"planner.commands.{name}").register(add)
