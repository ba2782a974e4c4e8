"""What the three exporters share: the header, the layer layout of the stages, notes and warnings.

A plan lists its pipeline stages as blocks and module FQNs. Engines count transformer layers
instead, so ``layout`` reads the plan's repeated layer lists (``model.trace.repeats``, e.g.
``model.layers``) and says which layers each stage holds, and where the blocks that are not layers
sit: the embedding side (before the first layer), the head side (after the last layer), or in
between (a model the layer-count engines cannot describe).

Every exporter collects the things its engine cannot express exactly as ``notes``: each becomes a
comment in the exported text and one logged warning.
"""

from __future__ import annotations

import logging
import re
import textwrap
from dataclasses import dataclass

from planner.planfile.document import Plan

log = logging.getLogger("planner.export")
NOTE_WIDTH = 96

SCHEDULE_WORDS = {
    "gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B",
    "zb-h1": "zero-bubble ZB-H1", "bidirectional": "bidirectional (two pipelines)",
}


@dataclass(frozen=True)
class Layout:
    """Which transformer layers, and which other blocks, each pipeline stage holds."""

    stacks: list[str]
    """FQNs of the repeated layer lists (``model.layers``); empty for a model without one."""
    layers: list[list[str]]
    """Per stage, the FQNs of the layers it holds (``model.layers.7``), in order."""
    pre: list[tuple[int, str]]
    """(stage, block name) of the blocks before the first layer: the embedding side."""
    post: list[tuple[int, str]]
    """(stage, block name) of the blocks after the last layer: the head side."""
    interior: list[str]
    """Blocks that are not layers but sit between layers."""
    expected: int
    """Layers the repeated lists hold in the real model (sum of their counts)."""

    @property
    def counts(self) -> list[int]:
        """Layers per stage."""
        return [len(s) for s in self.layers]

    @property
    def even(self) -> bool:
        """Every stage holds the same number of layers."""
        return len(set(self.counts)) == 1

    @property
    def all_layers(self) -> list[str]:
        return [fqn for s in self.layers for fqn in s]


def layout(plan: Plan) -> Layout:
    """Count the layers of each stage, and place the non-layer blocks (see the module docstring)."""
    repeats = plan.model.get("trace", {}).get("repeats", [])
    stacks = [r["fqn"] for r in repeats]
    pattern = re.compile("|".join(rf"{re.escape(f)}\.\d+" for f in stacks)) if stacks else None
    blocks = []  # (stage position, block name, layer FQNs in it)
    by_name = {b["name"]: b for b in plan.model["blocks"]}
    for pos, st in enumerate(plan.stages):
        for name in st["blocks"]:
            mods = by_name[name]["modules"] if name in by_name else []
            found = [m for m in mods if pattern is not None and pattern.fullmatch(m)]
            blocks.append((pos, name, found))
    layers: list[list[str]] = [[] for _ in plan.stages]
    for pos, _, found in blocks:
        layers[pos].extend(found)
    with_layers = [i for i, (_, _, found) in enumerate(blocks) if found]
    if not with_layers:
        return Layout(stacks=stacks, layers=layers, pre=[], post=[], interior=[],
                      expected=sum(int(r.get("count", 0)) for r in repeats))
    first, last = with_layers[0], with_layers[-1]
    return Layout(
        stacks=stacks, layers=layers,
        pre=[(s, n) for s, n, _ in blocks[:first]],
        post=[(s, n) for s, n, _ in blocks[last + 1:]],
        interior=[n for _, n, found in blocks[first:last + 1] if not found],
        expected=sum(int(r.get("count", 0)) for r in repeats),
    )


def header(plan: Plan, target: str) -> list[str]:
    """Lines (without comment markers) naming the source plan: deterministic, no timestamps."""
    m, c, prov = plan.model, plan.cluster, plan.provenance
    p = plan.parallel
    return [
        f"{target} settings exported by planner from a plan ({plan.schema}).",
        f"model {m['name']}  fingerprint {m['fingerprint']}  "
        f"input_hash {prov['input_hash']}  planner {prov.get('planner', 'unknown')}",
        f"plan: {plan.parallel_summary}, placement {p.get('placement', 'tp-pp-dp')}",
        f"on {c['num_gpus']} x {c['device']} ({c['name']}: {c['nodes']} nodes x "
        f"{c['gpus_per_node']}); global batch {plan.training['global_batch']} x "
        f"{plan.training['seq_len']} tokens, {plan.training['dtype']}, "
        f"{plan.training['optimizer']}",
    ]


def comment_block(lines: list[str], prefix: str = "# ") -> list[str]:
    return [(prefix + line).rstrip() for line in lines]


def notes_block(notes: list[str]) -> list[str]:
    """The "cannot be expressed exactly" section of an exported text (without comment markers)."""
    if not notes:
        return ["Everything in the plan is expressed exactly below."]
    lines = ["Not expressed exactly (the nearest setting is used; see docs/exports.md):"]
    for note in notes:
        lines += textwrap.wrap(note, NOTE_WIDTH, initial_indent="- ", subsequent_indent="  ",
                               break_on_hyphens=False)
    return lines


def warn(target: str, notes: list[str]) -> None:
    """One logged warning per note."""
    for note in notes:
        log.warning("export %s: %s", target, note)


def stage_counts_text(lay: Layout) -> str:
    return ", ".join(str(n) for n in lay.counts)


def placement(plan: Plan) -> str:
    return plan.parallel.get("placement", "tp-pp-dp")


def schedule_words(name: str) -> str:
    return SCHEDULE_WORDS.get(name, repr(name))


def slug(text: str) -> str:
    """A file-name-safe form of a model name."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return out or "model"
