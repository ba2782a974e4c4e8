"""Export a plan to the engines people already use: torchtitan, Megatron-LM, DeepSpeed, and TorchRec
for a recommendation model's tables.

``export(plan, target, version=None)`` returns the text and a suggested file name;
``to_torchtitan``, ``to_megatron`` and ``to_deepspeed`` are the three functions behind it. Each
writes for one release of its engine (``version``; default: ``planner.targets``' release of that
engine) and names it in the text. Every knob of the plan is either expressed or listed as not
expressed exactly, in the text and as one logged warning each (planner.export.common.Ledger); a
plan the engine cannot run at all (a schedule it lacks, a model it cannot describe) raises
SpecError; a nearby configuration that no longer fits memory, InfeasibleError. Mapping tables: docs/exports.md.

A recommendation-model plan (one with an ``embeddings`` section) exports to ``torchrec`` only
(``to_torchrec``: a Python file building TorchRec's ShardingPlan and ParameterConstraints), and
only such a plan does: ``export`` refuses the other pairings in one line.
"""

from __future__ import annotations

import os

from planner.errors import SpecError
from planner.export import moe
from planner.export.common import SUPPORTED_VERSIONS, engine_version, slug
from planner.export.deepspeed import to_deepspeed
from planner.export.megatron import to_megatron
from planner.export.torchrec import engine_version as torchrec_version
from planner.export.torchrec import to_torchrec, to_torchrec_json
from planner.export.torchtitan import to_torchtitan
from planner.planfile.document import Plan, load_plan
from planner.targets import model_refusal

TARGETS = {
    "torchtitan": (to_torchtitan, "torchtitan.toml"),
    "megatron": (to_megatron, "megatron.sh"),
    "deepspeed": (to_deepspeed, "deepspeed.json"),
    "torchrec": (to_torchrec, "torchrec.py"),
}
"""Target name -> (exporter, file-name suffix)."""
RECSYS_TARGETS = ("torchrec",)
"""The targets of recommendation-model plans (embedding tables); the others train dense models."""


def suffix(target: str, version: str) -> str:
    """The file-name suffix of ``target``'s export for ``version`` (torchtitan 0.3.0 reads command
    lines, not TOML)."""
    if target == "torchtitan" and version != "0.2.2":
        return "torchtitan.sh"
    return TARGETS[target][1]


def export(plan: Plan | str, target: str, version: str | None = None,
           stem: str | None = None) -> tuple[str, str]:
    """(text, suggested file name) of ``plan`` (a Plan, or a plan file's path) exported to
    ``target`` ``version``; the name starts with ``stem`` (the plan file's name, so that two plans
    of one model differ), else the model's name."""
    if isinstance(plan, (str, os.PathLike)):
        path = os.fspath(plan)
        plan = load_plan(path)
        stem = stem or os.path.splitext(os.path.basename(path))[0]
    elif not isinstance(plan, Plan):
        raise SpecError(f"export: expected a Plan or a plan file's path, got "
                        f"{type(plan).__name__}")
    if target not in TARGETS:
        raise SpecError(f"export: unknown target '{target}'; choose {', '.join(TARGETS)}")
    tables = bool(plan.embeddings)
    if tables and target not in RECSYS_TARGETS:
        raise SpecError(f"export {target}: {plan.model['name']}'s plan shards embedding tables "
                        f"(a recommendation model), which {target} does not; use --to torchrec")
    if not tables and target in RECSYS_TARGETS:
        dense = [t for t in sorted(set(TARGETS) - set(RECSYS_TARGETS))
                 if not model_refusal(plan.model, t)]
        raise SpecError(f"export {target}: {plan.model['name']}'s plan has no embedding tables "
                        f"(no embeddings section); {target} shards recommendation models: use "
                        f"--to {', '.join(dense)}")
    if target in RECSYS_TARGETS:
        version = torchrec_version(version)
        text = to_torchrec(plan, version)
    else:
        version = engine_version(target, version)
        _check_experts(plan)
        text = TARGETS[target][0](plan, version)
    return text, f"{slug(stem or plan.model['name'])}.{suffix(target, version)}"


def _check_experts(plan: Plan) -> None:
    """SpecError where the plan's ep does not divide the routed experts the export knows of its
    model (a plan file edited by hand: every engine refuses it)."""
    ep, facts = plan.parallel.get("ep", 1), moe.model(plan)
    if facts.experts and facts.experts % ep:
        raise SpecError(f"parallel.ep: {ep} does not divide {plan.model['name']}'s "
                        f"{facts.experts} routed experts ({facts.known_from}); re-plan with plan "
                        f"solve (--fix ep=N with N dividing {facts.experts}, or no ep pin)")


__all__ = ["RECSYS_TARGETS", "SUPPORTED_VERSIONS", "TARGETS", "export", "suffix", "to_deepspeed",
           "to_megatron", "to_torchrec", "to_torchrec_json", "to_torchtitan"]
