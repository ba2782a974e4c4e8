"""Pipeline schedules as typed data: per-rank lists of actions.

This module holds the notation (``Action``, ``Shape``, parsing and torch's spelling); the
schedules themselves are built in ``builders``, printed, parsed and checked as a grid in ``grid``,
and timed in ``simulator``.

Notation. An action is ``<stage><F|B|W><micro-batch>``: ``0F3`` is stage 0's forward of
micro-batch 3, ``1B3`` stage 1's backward, ``0W1`` stage 0's weight-gradient pass. A schedule is one
list of actions per pipeline rank, in the order that rank runs them. When a schedule has ``W``
actions its ``B`` is the input-gradient half of the backward and ``W`` the weight-gradient half
(Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024); without ``W``, ``B`` is the whole
backward. torch.distributed.pipelining (torch >= 2.5) reads the same strings but spells the
input-gradient half ``I``; ``torch_actions`` converts.

Conventions. ``stages`` (the ``p`` of the papers) is the pipeline depth, i.e. the number of
pipeline ranks. Stage ids are numbered along the path a micro-batch takes:
- gpipe, 1f1b, zb-h1: stage ``s`` runs on rank ``s`` (``p`` stages).
- interleaved-1f1b with ``vpp = v``: ``p*v`` virtual stages; rank ``r`` holds ``r, r+p, r+2p, ...``
  (Megatron-LM and torch's ScheduleInterleaved1F1B; Narayanan et al., SC'21).
- bidirectional (after Chimera, Li & Hoefler, SC'21): two pipelines with their own weight copies.
  Ids ``0..p-1`` are the "down" pipeline (model stage ``j`` on rank ``j``); ids ``p..2p-1`` are the
  "up" pipeline, id ``p+j`` being model stage ``j`` on rank ``p-1-j``. So rank ``r`` holds ids ``r``
  and ``2p-1-r``. Even micro-batches go down, odd ones go up.
Dependencies: ``F`` of (stage, mb) needs the previous stage's ``F`` of that mb; ``B`` needs the
stage's own ``F`` and the next stage's ``B`` (the last stage of a pipeline starts backward from its
own forward, where the loss is); ``W`` needs the stage's ``B``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, NamedTuple, Sequence

from planner.errors import SpecError

ACTION = re.compile(r"^(\d+)([FBW])(\d+)$")
ACTION_ANY = re.compile(r"(\d+)([FBW])(\d+)")
ACTIONS = re.compile(r"(?:\d+[FBW]\d+ )*\d+[FBW]\d+")

Kind = Literal["F", "B", "W"]
"""Forward, backward (the input-gradient half when the schedule has W), weight gradient."""


class Action(NamedTuple):
    """One step of a rank: stage ``stage`` runs ``kind`` on micro-batch ``microbatch``. Prints as
    (and parses from) ``<stage><kind><micro-batch>``: ``Action(1, "B", 3)`` is ``1B3``."""

    stage: int
    """Stage id along the micro-batch's path (see the module docstring)."""
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: "str | Action") -> "Action":
        """``"1B3"`` -> Action(1, "B", 3) (an Action is returned as it is); SpecError naming the
        text otherwise."""
        if isinstance(text, Action):
            return text
        m = ACTION.match(text.strip()) if isinstance(text, str) else None
        if not m:
            raise SpecError(f"schedule: '{text}' is not an action like 0F3, 1B0 or 2W5")
        return cls(int(m.group(1)), m.group(2), int(m.group(3)))


Actions = list[list[Action]]
"""A schedule: one list of actions per pipeline rank, in the order that rank runs them."""


def as_actions(actions: Sequence[Sequence[Action | str]]) -> Actions:
    """Per-rank lists of Actions from Actions or their strings (as plan files hold them)."""
    out = []
    for acts in actions:
        if all(isinstance(a, Action) for a in acts):
            out.append(list(acts))
            continue
        text = " ".join(str(a) for a in acts)
        if not ACTIONS.fullmatch(text):
            for a in acts:
                Action.parse(str(a))  # raises, naming the bad action
        out.append([Action(int(s), k, int(i)) for s, k, i in ACTION_ANY.findall(text)])
    return out


def as_text(actions: Sequence[Sequence[Action | str]]) -> list[list[str]]:
    """The strings of a schedule, as plan files hold them."""
    return [[str(a) for a in acts] for acts in actions]


def torch_actions(actions: Sequence[Sequence[Action | str]]) -> list[list[str]]:
    """The same schedule in torch.distributed.pipelining's spelling (torch >= 2.5), where ``B`` is
    a full backward and ``I`` the input-gradient half that a later ``W`` completes."""
    typed = as_actions(actions)
    split = {(a.stage, a.microbatch) for acts in typed for a in acts if a.kind == "W"}
    return [[f"{a.stage}I{a.microbatch}" if a.kind == "B" and (a.stage, a.microbatch) in split
             else str(a) for a in acts] for acts in typed]


@dataclass(frozen=True, kw_only=True)
class Shape:
    """How stage ids map to ranks and model stages (see the module docstring)."""

    ranks: int
    """Pipeline ranks ``p`` (the ``stages`` argument of ``build``)."""
    vpp: int = 1
    """Virtual stages per rank (interleaved 1F1B); 1 otherwise."""
    bidirectional: bool = False
    """Two pipelines in opposite directions (Chimera-style); ids ``p..2p-1`` are the up pipeline."""

    @cached_property
    def depth(self) -> int:
        """Stages a micro-batch passes through."""
        return self.ranks * self.vpp

    @cached_property
    def num_ids(self) -> int:
        return self.depth * (2 if self.bidirectional else 1)

    def rank_of(self, stage: int) -> int:
        if self.bidirectional and stage >= self.ranks:
            return 2 * self.ranks - 1 - stage
        return stage % self.ranks

    def model_stage(self, stage: int) -> int:
        """Index into per-model-stage times and bytes (both replicas share one entry)."""
        return stage % self.depth

    def chain(self, mb: int) -> range:
        """Stage ids micro-batch ``mb`` passes through, in order."""
        if self.bidirectional and mb % 2:
            return range(self.depth, 2 * self.depth)
        return range(self.depth)

    def deps(self, action: Action) -> list[Action]:
        """Actions that must finish before ``action`` starts."""
        stage, kind, mb = action
        pos = stage % self.depth
        if kind == "F":
            return [Action(stage - 1, "F", mb)] if pos > 0 else []
        if kind == "B":
            return [Action(stage, "F", mb)] + ([Action(stage + 1, "B", mb)]
                                               if pos < self.depth - 1 else [])
        return [Action(stage, "B", mb)]

    def chunk(self, action: Action) -> int:
        """Which of its rank's stages ``action`` runs: 0 for the first (the only one without
        interleaving); with interleaving, the rank's k-th model chunk; bidirectional, 1 for the
        up pipeline."""
        if self.bidirectional:
            return int(action.stage >= self.depth)
        return action.stage // self.ranks

    def peer(self, action: Action) -> int | None:
        """The rank ``action``'s input arrives from (a forward's activations from the previous
        stage, a backward's gradient from the next), or None when the input is local: the first
        stage's forward, the last stage's backward, a W, or a neighbour on the same rank."""
        other = [d for d in self.deps(action) if d.stage != action.stage]
        if not other:
            return None
        rank = self.rank_of(other[0].stage)
        return None if rank == self.rank_of(action.stage) else rank

    @classmethod
    def infer(cls, actions: list[list[str]]) -> "Shape":
        """Guess the shape from where stage ids sit (for printing only)."""
        p = max(len(actions), 1)
        where = {a.stage: r for r, acts in enumerate(as_actions(actions)) for a in acts}
        top = max(where, default=0) + 1
        if p > 1 and top == 2 * p and where.get(p) == p - 1:
            return cls(ranks=p, bidirectional=True)
        return cls(ranks=p, vpp=max(1, -(-top // p)))


ROUNDING = 1e-9
"""The share of a stage's time below which a negative difference of its times (a backward
taken as compute less forward, in a stage that runs none) is rounding."""


def difference_s(value: float, scale: float) -> float:
    """A time computed as a difference of times: 0 where it is negative by rounding alone (less
    than ROUNDING of ``scale``); a larger negative one is returned as it is, for the simulator
    to refuse."""
    return 0.0 if -ROUNDING * abs(scale) <= value < 0.0 else value

