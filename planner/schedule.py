"""Pipeline schedules as per-rank action lists: build, print as a grid, parse back, validate.

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

from planner.errors import SpecError

ACTION = re.compile(r"^(\d+)([FBW])(\d+)$")
ACTION_ANY = re.compile(r"(\d+)([FBW])(\d+)")
ACTIONS = re.compile(r"(?:\d+[FBW]\d+ )*\d+[FBW]\d+")
GRID_ROW = re.compile(r"^\s*rank\s+(\d+)\s*\|(.*)$")
EMPTY = "."


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

    def deps(self, kind: str, stage: int, mb: int) -> list[tuple[int, str, int]]:
        """Actions, as (stage, kind, micro-batch), that must finish before this one starts."""
        pos = stage % self.depth
        if kind == "F":
            return [(stage - 1, "F", mb)] if pos > 0 else []
        if kind == "B":
            return [(stage, "F", mb)] + ([(stage + 1, "B", mb)] if pos < self.depth - 1 else [])
        return [(stage, "B", mb)]

    @classmethod
    def infer(cls, actions: list[list[str]]) -> "Shape":
        """Guess the shape from where stage ids sit (for printing only)."""
        p = max(len(actions), 1)
        where = {parse_action(a)[0]: r for r, acts in enumerate(actions) for a in acts}
        top = max(where, default=0) + 1
        if p > 1 and top == 2 * p and where.get(p) == p - 1:
            return cls(ranks=p, bidirectional=True)
        return cls(ranks=p, vpp=max(1, -(-top // p)))


def gpipe(stages: int, microbatches: int) -> list[list[str]]:
    """GPipe (Huang et al., NeurIPS'19): every forward, then every backward."""
    return [[f"{s}F{i}" for i in range(microbatches)] + [f"{s}B{i}" for i in range(microbatches)]
            for s in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> list[list[str]]:
    """1F1B (PipeDream-Flush, Narayanan et al., ICML'21): warm up with ``stages - s - 1``
    forwards, then alternate one forward and one backward, then drain the backwards."""
    ranks = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        acts = [f"{s}F{i}" for i in range(warmup)]
        for f in range(warmup, microbatches):
            acts += [f"{s}F{f}", f"{s}B{f - warmup}"]
        acts.extend(f"{s}B{i}" for i in range(microbatches - warmup, microbatches))
        ranks.append(acts)
    return ranks


def interleaved(stages: int, microbatches: int, vpp: int) -> list[list[str]]:
    """Interleaved 1F1B (Narayanan et al., SC'21), in the order of torch's
    ScheduleInterleaved1F1B: forwards go through a rank's chunks in rounds of ``k`` micro-batches
    (``k = m / max(1, m // p)``), backwards through the chunks in reverse; rank ``r`` warms up with
    ``(v-1) k + 2 (p-1-r)`` forwards, then alternates, then drains."""
    p, m, v = stages, microbatches, vpp
    rounds = max(1, m // p)
    k = m // rounds
    if m % rounds:
        raise SpecError(f"num_microbatches: interleaved 1F1B runs m in max(1, m // pp) = {rounds} "
                        f"equal rounds, and {m} is not a multiple of {rounds}; try "
                        f"{rounds * k} or {rounds * (k + 1)}")

    def order(j: int, backward: bool) -> tuple[int, int]:
        rnd, pos = divmod(j, k * v)
        chunk = pos // k
        return (v - 1 - chunk if backward else chunk) * p, rnd * k + pos % k

    ranks = []
    for r in range(p):
        fwd = [f"{c + r}F{i}" for c, i in (order(j, False) for j in range(m * v))]
        bwd = [f"{c + r}B{i}" for c, i in (order(j, True) for j in range(m * v))]
        warmup = min((v - 1) * k + 2 * (p - 1 - r), m * v)
        acts = fwd[:warmup]
        for j in range(m * v - warmup):
            acts += [fwd[warmup + j], bwd[j]]
        ranks.append(acts + bwd[m * v - warmup:])
    return ranks


def zb_h1(stages: int, microbatches: int) -> list[list[str]]:
    """ZB-H1 (Qi et al., ICLR'24): 1F1B with the backward split into B (input gradient) and W
    (weight gradient); rank ``r`` holds back its W passes during its first ``r`` steady-state
    steps and runs them in the drain, so the bubble shrinks to ``(p-1)(F+B-W)`` at 1F1B's
    activation memory (the order of torch's ScheduleInterleavedZeroBubble with one stage per rank)."""
    p, m = stages, microbatches
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts, w = [f"{r}F{i}" for i in range(warmup)], 0
        for j in range(m):
            if warmup + j < m:
                acts.append(f"{r}F{warmup + j}")
            acts.append(f"{r}B{j}")
            if j >= r or warmup + j >= m:  # rank r holds back its first r W passes
                acts.append(f"{r}W{w}")
                w += 1
        ranks.append(acts + [f"{r}W{i}" for i in range(w, m)])
    return ranks


def bidirectional(stages: int, microbatches: int) -> list[list[str]]:
    """Two pipelines in opposite directions over the same ranks, in the manner of Chimera
    (Li & Hoefler, SC'21): even micro-batches flow down ids ``0..p-1``, odd ones up ids
    ``p..2p-1`` (module docstring). Each rank's order comes from a greedy list schedule on unit
    times (F = 1, B = 2, as Chimera assumes): a free rank runs a ready B, else a ready F, the
    oldest micro-batch first, and a stage keeps at most ``p - position`` micro-batches in flight
    (1F1B's bound, per direction). It beats 1F1B's bubble for m <= 2p, Chimera's regime; Chimera's
    forward doubling for m >> p is not built, and there 1F1B is better."""
    shape = Shape(ranks=stages, bidirectional=True)
    p, m = stages, microbatches
    queue = {s: [i for i in range(m) if s in shape.chain(i)] for s in range(2 * p)}
    nf, nb = dict.fromkeys(queue, 0), dict.fromkeys(queue, 0)
    done: dict[tuple[int, str, int], int] = {}
    acts: list[list[str]] = [[] for _ in range(p)]
    free, t, left = [0] * p, 0, 2 * sum(len(q) for q in queue.values())
    while left:
        for r in range(p):
            if free[r] > t:
                continue
            best = None  # (F after B, micro-batch, kind, stage)
            for s in (r, 2 * p - 1 - r):
                for kind, n in (("B", nb[s]), ("F", nf[s])):
                    if n >= len(queue[s]) or (kind == "F" and nf[s] - nb[s] >= p - s % p):
                        continue
                    i = queue[s][n]
                    ready = [done.get(d) for d in shape.deps(kind, s, i)]
                    if None not in ready and max(ready, default=0) <= t:
                        cand = (kind == "F", i, kind, s)
                        best = min(best, cand) if best else cand
            if best:
                _, i, kind, s = best
                free[r] = done[(s, kind, i)] = t + (1 if kind == "F" else 2)
                (nf if kind == "F" else nb)[s] += 1
                acts[r].append(f"{s}{kind}{i}")
                left -= 1
        t += 1
    return acts


BUILDERS = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved-1f1b": interleaved,
            "zb-h1": zb_h1, "bidirectional": bidirectional}
"""Schedule names, as plans and the CLI spell them."""
SPLIT_BACKWARD = frozenset({"zb-h1"})
"""Schedules whose backward is split into B (input gradient) and W (weight gradient)."""


def shape_of(name: str, stages: int, vpp: int = 1) -> Shape:
    """The stage layout schedule ``name`` uses."""
    return Shape(ranks=stages, vpp=vpp, bidirectional=name == "bidirectional")


def build(name: str, stages: int, microbatches: int, vpp: int = 1) -> list[list[str]]:
    """Per-rank action lists of schedule ``name`` on ``stages`` pipeline ranks (``vpp`` virtual
    stages per rank for interleaved-1f1b, where vpp=1 is plain 1F1B)."""
    if name not in BUILDERS:
        raise SpecError(f"schedule: unknown schedule '{name}'; choose {', '.join(BUILDERS)}")
    if stages < 1 or microbatches < 1 or vpp < 1:
        raise SpecError(f"schedule: pp={stages}, micro-batches={microbatches}, vpp={vpp}; "
                        "each must be at least 1")
    if name == "interleaved-1f1b" and vpp > 1:
        return interleaved(stages, microbatches, vpp)
    if name == "interleaved-1f1b":
        return one_f_one_b(stages, microbatches)
    if vpp != 1:
        raise SpecError(f"vpp: {name} runs one stage per rank, got vpp={vpp}; use vpp=1 or "
                        "schedule interleaved-1f1b")
    return BUILDERS[name](stages, microbatches)


def parse_action(text: str) -> tuple[int, str, int]:
    """``"1B3"`` -> (1, "B", 3)."""
    m = ACTION.match(text.strip())
    if not m:
        raise SpecError(f"schedule: '{text}' is not an action like 0F3, 1B0 or 2W5")
    return int(m.group(1)), m.group(2), int(m.group(3))


def torch_actions(actions: list[list[str]]) -> list[list[str]]:
    """The same schedule in torch.distributed.pipelining's spelling (torch >= 2.5), where ``B`` is
    a full backward and ``I`` the input-gradient half that a later ``W`` completes."""
    split = {a.replace("W", "B", 1) for acts in actions for a in acts if "W" in a}
    return [[a.replace("B", "I", 1) if a in split else a for a in acts] for acts in actions]


def _parsed(actions: list[list[str]]) -> list[list[tuple[int, str, int]]]:
    out = []
    for acts in actions:
        text = " ".join(acts)
        if acts and not ACTIONS.fullmatch(text):
            [parse_action(a) for a in acts]  # raises, naming the bad action
        out.append([(int(s), k, int(i)) for s, k, i in ACTION_ANY.findall(text)])
    return out


def _unit_slots(parsed, shape: Shape) -> tuple[list[list[int]], list[int]]:
    """Run each rank's list in order with unit-time actions: every action's earliest time slot.
    Returns the slots and, per rank, the index of the action it is stuck at (its length if none);
    actions after a stuck one get the rank's next free slots, for printing."""
    done: dict[tuple[int, str, int], int] = {}
    slots: list[list[int]] = [[] for _ in parsed]
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(parsed):
            while len(slots[r]) < len(acts):
                s, kind, i = acts[len(slots[r])]
                ready = [done.get(d) for d in shape.deps(kind, s, i)]
                if None in ready:
                    break
                slot = max([slots[r][-1] if slots[r] else -1, *ready]) + 1
                slots[r].append(slot)
                done[(s, kind, i)] = slot
                progress = True
    stuck = [len(sl) for sl in slots]
    for r, acts in enumerate(parsed):
        while len(slots[r]) < len(acts):
            slots[r].append(slots[r][-1] + 1 if slots[r] else 0)
    return slots, stuck


def format_grid(actions: list[list[str]], *, shape: Shape | None = None,
                mark: frozenset[tuple[int, int]] = frozenset()) -> str:
    """One row per rank, one column per unit time slot (each action as soon as its inputs allow,
    in the rank's order; ``.`` is idle). ``mark`` holds (rank, index in its list) pairs to show
    as ``[0B1]``. ``parse_grid`` reads the text back."""
    parsed = _parsed(actions)
    slots, _ = _unit_slots(parsed, shape or Shape.infer(actions))
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


def parse_grid(text: str) -> list[list[str]]:
    """Read a grid that ``format_grid`` printed (rows ``rank N | ...``; ``.`` and brackets are
    ignored; other lines are skipped) back into action lists."""
    rows = [GRID_ROW.match(line) for line in text.splitlines()]
    rows = [r for r in rows if r]
    if [int(r.group(1)) for r in rows] != list(range(len(rows))):
        raise SpecError("schedule grid: rows must be 'rank 0 | ...', 'rank 1 | ...', ... in order")
    out = []
    for r in rows:
        cells = [c.strip("[]") for c in r.group(2).split() if c != EMPTY]
        for c in cells:
            parse_action(c)
        out.append(cells)
    return out


def _fail(actions, shape: Shape, why: str, mark=()) -> SpecError:
    grid = format_grid(actions, shape=shape, mark=frozenset(mark))
    return SpecError(f"schedule: {why}\n{grid}")


def validate(actions: list[list[str]], *, stages: int, microbatches: int, vpp: int = 1,
             bidirectional: bool = False, deadlock: bool = True) -> list[list[tuple[int, str, int]]]:
    """Check a schedule; raise SpecError with the grid, the failing step marked ``[..]``.
    Returns the parsed actions, ``(stage, kind, micro-batch)`` per rank.

    Every rank runs only its own stages; each (stage, micro-batch) on the micro-batch's path has
    exactly one F and one B (and one W, if the schedule splits backward at all), F before B before
    W; and (unless ``deadlock=False``, for callers that run the schedule themselves) running every
    rank in order never deadlocks on an input from another rank."""
    shape = Shape(ranks=stages, vpp=vpp, bidirectional=bidirectional)
    if len(actions) != stages:
        raise SpecError(f"schedule: {len(actions)} rank lists for pp={stages}; give one per rank")
    parsed = _parsed(actions)
    seen = _check_each(actions, parsed, shape, microbatches)
    kinds = "FBW" if any(k == "W" for _, k, _ in seen) else "FB"
    if len(seen) != len(kinds) * shape.depth * microbatches:
        for i in range(microbatches):
            for s in shape.chain(i):
                for kind in kinds:
                    if (s, kind, i) not in seen:
                        raise _fail(actions, shape, f"{s}{kind}{i} is missing; stage {s} must "
                                    f"run {'/'.join(kinds)} once for micro-batch {i}")
    if deadlock:
        _check_deadlock(actions, parsed, shape)
    return parsed


def _check_each(actions, parsed, shape: Shape, microbatches: int) -> dict:
    """Each action on its own: on the micro-batch's path, on its rank, once, after its F (B)."""
    home = [shape.rank_of(s) for s in range(shape.num_ids)]
    depth, ids, two = shape.depth, shape.num_ids, shape.bidirectional
    seen: dict[tuple[int, str, int], tuple[int, int]] = {}
    for r, acts in enumerate(parsed):
        for k, act in enumerate(acts):
            s, kind, i = act
            if not (0 <= i < microbatches and 0 <= s < ids) or (two and (s >= depth) != i % 2):
                raise _fail(actions, shape, f"{actions[r][k]} is not a stage of micro-batch {i}'s "
                            f"path ({microbatches} micro-batches, {ids} stage ids)", [(r, k)])
            if home[s] != r:
                raise _fail(actions, shape, f"rank {r} runs {actions[r][k]} but stage {s} lives "
                            f"on rank {home[s]}", [(r, k)])
            if act in seen:
                raise _fail(actions, shape, f"{actions[r][k]} appears twice", [seen[act], (r, k)])
            if kind != "F" and (s, "F" if kind == "B" else "B", i) not in seen:
                before = f"{s}{'F' if kind == 'B' else 'B'}{i}"
                raise _fail(actions, shape, f"rank {r} runs {actions[r][k]} before {before}; "
                            "move it after", [(r, k)])
            seen[act] = (r, k)
    return seen


def _check_deadlock(actions, parsed, shape: Shape) -> None:
    _, stuck = _unit_slots(parsed, shape)
    heads = [(r, k) for r, k in enumerate(stuck) if k < len(parsed[r])]
    if heads:
        waits = []
        for r, k in heads:
            s, kind, i = parsed[r][k]
            need = ["".join(map(str, d)) for d in shape.deps(kind, s, i)]
            waits.append(f"rank {r} waits at {actions[r][k]} for {' and '.join(need)}")
        raise _fail(actions, shape, "deadlock: " + "; ".join(waits) + "; reorder so every "
                    "action's inputs are produced earlier", heads)
