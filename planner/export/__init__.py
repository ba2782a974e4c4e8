"""Export a plan to the engines people already use: torchtitan, Megatron-LM, DeepSpeed.

``export(plan, target)`` returns the text and a suggested file name; ``to_torchtitan``,
``to_megatron`` and ``to_deepspeed`` are the three pure functions behind it. What a target cannot
express exactly becomes a comment in the text and a logged warning; a plan a target cannot express
at all raises SpecError. Mapping tables: docs/exports.md.
"""

from __future__ import annotations

from planner.errors import SpecError
from planner.export.common import slug
from planner.export.deepspeed import to_deepspeed
from planner.export.megatron import to_megatron
from planner.export.torchtitan import to_torchtitan
from planner.planfile.document import Plan

TARGETS = {
    "torchtitan": (to_torchtitan, "torchtitan.toml"),
    "megatron": (to_megatron, "megatron.sh"),
    "deepspeed": (to_deepspeed, "deepspeed.json"),
}
"""Target name -> (exporter, file-name suffix)."""


def export(plan: Plan, target: str) -> tuple[str, str]:
    """(text, suggested file name) of ``plan`` exported to ``target``."""
    if target not in TARGETS:
        raise SpecError(f"export: unknown target '{target}'; choose {', '.join(TARGETS)}")
    fn, suffix = TARGETS[target]
    return fn(plan), f"{slug(plan.model['name'])}.{suffix}"


__all__ = ["TARGETS", "export", "to_deepspeed", "to_megatron", "to_torchtitan"]
