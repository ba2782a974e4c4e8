"""The pipeline schedules, each a function (ranks, micro-batches) -> per-rank Actions, and ``build``
by name. Stage ids and dependencies follow the notation of ``planner.schedule``."""

from __future__ import annotations

from planner.errors import SpecError
from planner.schedule import Action, Actions, Shape


def gpipe(stages: int, microbatches: int) -> Actions:
    """GPipe (Huang et al., NeurIPS'19): every forward, then every backward."""
    return [[Action(s, "F", i) for i in range(microbatches)]
            + [Action(s, "B", i) for i in range(microbatches)] for s in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> Actions:
    """1F1B (PipeDream-Flush, Narayanan et al., ICML'21): warm up with ``stages - s - 1``
    forwards, then alternate one forward and one backward, then drain the backwards."""
    ranks = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        acts = [Action(s, "F", i) for i in range(warmup)]
        for f in range(warmup, microbatches):
            acts += [Action(s, "F", f), Action(s, "B", f - warmup)]
        acts.extend(Action(s, "B", i) for i in range(microbatches - warmup, microbatches))
        ranks.append(acts)
    return ranks


def interleaved(stages: int, microbatches: int, vpp: int) -> Actions:
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
        fwd = [Action(c + r, "F", i) for c, i in (order(j, False) for j in range(m * v))]
        bwd = [Action(c + r, "B", i) for c, i in (order(j, True) for j in range(m * v))]
        warmup = min((v - 1) * k + 2 * (p - 1 - r), m * v)
        acts = fwd[:warmup]
        for j in range(m * v - warmup):
            acts += [fwd[warmup + j], bwd[j]]
        ranks.append(acts + bwd[m * v - warmup:])
    return ranks


def zb_h1(stages: int, microbatches: int) -> Actions:
    """ZB-H1 (Qi et al., ICLR'24): 1F1B with the backward split into B (input gradient) and W
    (weight gradient); rank ``r`` holds back its W passes during its first ``r`` steady-state
    steps and runs them in the drain, so the bubble shrinks to ``(p-1)(F+B-W)``; rank 0 holds
    1F1B's p micro-batches, rank r also the r whose W waits (costmodels.pipeline.in_flight) (the
    order of torch's ScheduleInterleavedZeroBubble with one stage per rank)."""
    p, m = stages, microbatches
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        acts, w = [Action(r, "F", i) for i in range(warmup)], 0
        for j in range(m):
            if warmup + j < m:
                acts.append(Action(r, "F", warmup + j))
            acts.append(Action(r, "B", j))
            if j >= r or warmup + j >= m:  # rank r holds back its first r W passes
                acts.append(Action(r, "W", w))
                w += 1
        ranks.append(acts + [Action(r, "W", i) for i in range(w, m)])
    return ranks


def bidirectional(stages: int, microbatches: int) -> Actions:
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
    done: dict[Action, int] = {}
    acts: Actions = [[] for _ in range(p)]
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
                    ready = [done.get(d) for d in shape.deps(Action(s, kind, i))]
                    if None not in ready and max(ready, default=0) <= t:
                        cand = (kind == "F", i, kind, s)
                        best = min(best, cand) if best else cand
            if best:
                _, i, kind, s = best
                free[r] = done[Action(s, kind, i)] = t + (1 if kind == "F" else 2)
                (nf if kind == "F" else nb)[s] += 1
                acts[r].append(Action(s, kind, i))
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


def build(name: str, stages: int, microbatches: int, vpp: int = 1) -> Actions:
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
