"""A schedule as a grid a person reads (one row per rank, one column per unit time slot), read back
from that text, and checked: a validation error shows the grid with the failing action marked."""

from __future__ import annotations

import re
from typing import Sequence

from planner.errors import SpecError
from planner.schedule import Action, Actions, Shape, as_actions

GRID_ROW = re.compile(r"^\s*rank\s+(\d+)\s*\|(.*)$")
EMPTY = "."


def _unit_slots(parsed: Actions, shape: Shape) -> tuple[list[list[int]], list[int]]:
    """Run each rank's list in order with unit-time actions: every action's earliest time slot.
    Returns the slots and, per rank, the index of the action it is stuck at (its length if none);
    actions after a stuck one get the rank's next free slots, for printing."""
    done: dict[Action, int] = {}
    slots: list[list[int]] = [[] for _ in parsed]
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(parsed):
            while len(slots[r]) < len(acts):
                act = acts[len(slots[r])]
                ready = [done.get(d) for d in shape.deps(act)]
                if None in ready:
                    break
                slot = max([slots[r][-1] if slots[r] else -1, *ready]) + 1
                slots[r].append(slot)
                done[act] = slot
                progress = True
    stuck = [len(sl) for sl in slots]
    for r, acts in enumerate(parsed):
        while len(slots[r]) < len(acts):
            slots[r].append(slots[r][-1] + 1 if slots[r] else 0)
    return slots, stuck


def format_grid(actions: Sequence[Sequence[Action | str]], *, shape: Shape | None = None,
                mark: frozenset[tuple[int, int]] = frozenset()) -> str:
    """One row per rank, one column per unit time slot (each action as soon as its inputs allow,
    in the rank's order; ``.`` is idle). ``mark`` holds (rank, index in its list) pairs to show
    as ``[0B1]``. ``parse_grid`` reads the text back."""
    parsed = as_actions(actions)
    slots, _ = _unit_slots(parsed, shape or Shape.infer(parsed))
    actions = [[str(a) for a in acts] for acts in parsed]
    width = max([len(a) for acts in actions for a in acts] + [1]) + (2 if mark else 0)
    n = max([sl[-1] + 1 for sl in slots if sl] + [0])
    label = len(f"rank {len(actions) - 1}")
    lines = [f"{'slot':<{label}} |" + "".join(f" {t:>{width}}" for t in range(n))]
    for r, acts in enumerate(actions):
        row = [EMPTY] * n
        for k, (a, t) in enumerate(zip(acts, slots[r])):
            row[t] = f"[{a}]" if (r, k) in mark else a
        lines.append(f"{f'rank {r}':<{label}} |" + "".join(f" {c:>{width}}" for c in row))
    return "\n".join(lines)


def parse_grid(text: str) -> Actions:
    """Read a grid that ``format_grid`` printed (rows ``rank N | ...``; ``.`` and brackets are
    ignored; other lines are skipped) back into action lists."""
    rows = [GRID_ROW.match(line) for line in text.splitlines()]
    rows = [r for r in rows if r]
    if [int(r.group(1)) for r in rows] != list(range(len(rows))):
        raise SpecError("schedule grid: rows must be 'rank 0 | ...', 'rank 1 | ...', ... in order")
    out = []
    for r in rows:
        cells = [c.strip("[]") for c in r.group(2).split() if c != EMPTY]
        out.append([Action.parse(c) for c in cells])
    return out


def _fail(actions, shape: Shape, why: str, mark=()) -> SpecError:
    grid = format_grid(actions, shape=shape, mark=frozenset(mark))
    return SpecError(f"schedule: {why}\n{grid}")


def validate(actions: Sequence[Sequence[Action | str]], *, stages: int, microbatches: int,
             vpp: int = 1, bidirectional: bool = False, deadlock: bool = True) -> Actions:
    """Check a schedule (Actions or their strings); raise SpecError with the grid, the failing
    step marked ``[..]``. Returns the schedule as Actions.

    Every rank runs only its own stages; each (stage, micro-batch) on the micro-batch's path has
    exactly one F and one B (and one W, if the schedule splits backward at all), F before B before
    W; and (unless ``deadlock=False``, for callers that run the schedule themselves) running every
    rank in order never deadlocks on an input from another rank."""
    shape = Shape(ranks=stages, vpp=vpp, bidirectional=bidirectional)
    if len(actions) != stages:
        raise SpecError(f"schedule: {len(actions)} rank lists for pp={stages}; give one per rank")
    parsed = as_actions(actions)
    seen = _check_each(parsed, shape, microbatches)
    kinds = "FBW" if any(a.kind == "W" for a in seen) else "FB"
    if len(seen) != len(kinds) * shape.depth * microbatches:
        for i in range(microbatches):
            for s in shape.chain(i):
                for kind in kinds:
                    if Action(s, kind, i) not in seen:
                        raise _fail(parsed, shape, f"{s}{kind}{i} is missing; stage {s} must "
                                    f"run {'/'.join(kinds)} once for micro-batch {i}")
    if deadlock:
        _check_deadlock(parsed, shape)
    return parsed


def _check_each(parsed: Actions, shape: Shape, microbatches: int) -> dict:
    """Each action on its own: on the micro-batch's path, on its rank, once, after its F (B)."""
    home = [shape.rank_of(s) for s in range(shape.num_ids)]
    depth, ids, two = shape.depth, shape.num_ids, shape.bidirectional
    seen: dict[Action, tuple[int, int]] = {}
    for r, acts in enumerate(parsed):
        for k, act in enumerate(acts):
            s, kind, i = act
            if not (0 <= i < microbatches and 0 <= s < ids) or (two and (s >= depth) != i % 2):
                raise _fail(parsed, shape, f"{act} is not a stage of micro-batch {i}'s "
                            f"path ({microbatches} micro-batches, {ids} stage ids)", [(r, k)])
            if home[s] != r:
                raise _fail(parsed, shape, f"rank {r} runs {act} but stage {s} lives "
                            f"on rank {home[s]}", [(r, k)])
            if act in seen:
                raise _fail(parsed, shape, f"{act} appears twice", [seen[act], (r, k)])
            before = Action(s, "F" if kind == "B" else "B", i)
            if kind != "F" and before not in seen:
                raise _fail(parsed, shape, f"rank {r} runs {act} before {before}; "
                            "move it after", [(r, k)])
            seen[act] = (r, k)
    return seen


def _check_deadlock(parsed: Actions, shape: Shape) -> None:
    _, stuck = _unit_slots(parsed, shape)
    heads = [(r, k) for r, k in enumerate(stuck) if k < len(parsed[r])]
    if heads:
        waits = []
        for r, k in heads:
            act = parsed[r][k]
            need = [str(d) for d in shape.deps(act)]
            waits.append(f"rank {r} waits at {act} for {' and '.join(need)}")
        raise _fail(parsed, shape, "deadlock: " + "; ".join(waits) + "; reorder so every "
                    "action's inputs are produced earlier", heads)
