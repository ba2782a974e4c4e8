"""Discrete-event simulation of a pipeline schedule: step time, idle time and activation memory.

Each rank runs its action list (planner.schedule notation) in order, one action at a time. An action starts
when its rank is free and its inputs have arrived: a forward needs the previous stage's forward of
the same micro-batch, a backward the next stage's backward (the last stage starts backward from its
own forward) — plus the point-to-point time of the cut between the two stages when they sit on
different ranks. Sends overlap compute (asynchronous send/recv, as in Megatron-LM and
torch.distributed.pipelining), so p2p time delays the receiver but does not occupy either rank.
It does occupy the link: the sends from one rank to another go one after another, in the order
their actions end (activations one way, gradients the other, on full-duplex links), so a schedule
that sends faster than the link carries waits for it (cross-site links, slow Ethernet).

Memory: a stage allocates its activations for a micro-batch when the forward starts and releases
them when that micro-batch's backward on the stage finishes (B under a B/W split, as the input
gradient is the last use of most saved tensors; Qi et al., ICLR'24, section 2). Per-rank peaks are
reported as bytes and as (stage, micro-batch) pairs held.

On equal stages the results match the closed forms (Huang et al., NeurIPS'19; Narayanan et al.,
ICML'21 and SC'21): GPipe and 1F1B take ``(m+p-1)(t_f+t_b)``, a bubble of ``(p-1)/(m+p-1)``;
interleaved with per-chunk time ``t/v`` has bubble ``(p-1)/(v m + p-1)`` (tests check these).
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple, Sequence

from costmodels import pipeline
from planner.errors import SpecError
from planner.options import MAX_MICROBATCHES
from planner.schedule import Action, Shape, difference_s
from planner.schedule.builders import SPLIT_BACKWARD, build
from planner.schedule.grid import validate


class Interval(NamedTuple):
    """One action as it ran."""

    rank: int
    action: str
    start_s: float
    end_s: float
    kind: str
    """F, B or W."""
    stage: int
    microbatch: int


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What one simulated step of a pipeline schedule costs."""

    step_time_s: float
    """Seconds from the first action's start to the last action's end."""
    busy_s: tuple[float, ...]
    """Seconds each rank spends running actions."""
    idle_s: tuple[float, ...]
    """Seconds each rank waits during the step (``step_time_s - busy_s``)."""
    bubble_fraction: float
    """Idle share of all ranks' time: ``sum(idle_s) / (ranks * step_time_s)``, in [0, 1)."""
    peak_activation_bytes: tuple[float, ...]
    """Most activation bytes each rank holds at once."""
    peak_in_flight: tuple[int, ...]
    """Most (stage, micro-batch) pairs whose activations each rank holds at once."""
    timeline: tuple[Interval, ...]
    """Every action with its rank and start/end seconds, in start order."""
    microbatches: int
    """Micro-batches in the step."""

    @property
    def ranks(self) -> int:
        return len(self.busy_s)


def _per_stage(name: str, value, n: int, what: str = "model stages") -> list[float]:
    """A scalar broadcast to ``n`` stages, or a sequence of exactly ``n`` non-negative numbers."""
    vals = [float(value)] * n if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(vals) != n:
        raise SpecError(f"{name}: {len(vals)} values for {n} {what}; give one each")
    if any(v < 0 for v in vals):
        raise SpecError(f"{name}: negative value in {vals}; times and bytes are >= 0")
    return vals


def simulate(actions: Sequence[Sequence[Action | str]], *, microbatches: int, fwd_s, bwd_s, wgrad_s=0.0,
             p2p_s=0.0, activation_bytes=0.0, vpp: int = 1,
             bidirectional: bool = False, timeline: bool = True) -> SimResult:
    """Simulate one step of ``actions`` (validated first).

    Per model stage (``len(actions) * vpp`` of them; both replicas of a bidirectional schedule
    share an entry), as one number or a sequence: ``fwd_s`` forward seconds, ``bwd_s`` backward
    seconds (the input-gradient half B if the schedule has W actions, else the whole backward),
    ``wgrad_s`` weight-gradient seconds of a W (must be 0 when there are no W actions),
    ``activation_bytes`` kept per micro-batch. ``p2p_s``: seconds to send one micro-batch's
    activations (or gradients) over each cut between neighbouring model stages (``depth - 1``
    values, or one number); free between stages on the same rank. ``timeline=False`` leaves the
    result's timeline empty (the search needs the times, not the picture)."""
    p = len(actions)
    checked = isinstance(actions, Checked) and not bidirectional and \
        (actions.microbatches, actions.vpp) == (microbatches, vpp)
    parsed = actions if checked else validate(
        actions, stages=p, microbatches=microbatches, vpp=vpp, bidirectional=bidirectional,
        deadlock=False)
    shape = Shape(ranks=p, vpp=vpp, bidirectional=bidirectional)
    n = shape.depth
    dur = {"F": _per_stage("fwd_s", fwd_s, n), "B": _per_stage("bwd_s", bwd_s, n),
           "W": _per_stage("wgrad_s", wgrad_s, n)}
    cut = _per_stage("p2p_s", p2p_s, n - 1, "cuts between stages")
    act = _per_stage("activation_bytes", activation_bytes, n)
    if any(dur["W"]) and not any(k == "W" for acts in parsed for _, k, _ in acts):
        raise SpecError("wgrad_s: this schedule has no W actions; add the weight-gradient time "
                        "to bwd_s and pass wgrad_s=0")
    steps, sends = _compile(parsed, shape, dur, cut)
    starts = _run(steps, sends)
    if any(len(st) < len(acts) for st, acts in zip(starts, parsed)):
        validate(parsed, stages=p, microbatches=microbatches, vpp=vpp,
                 bidirectional=bidirectional)  # raises, naming the deadlock
    return _result(parsed, starts, steps, shape, act, microbatches, timeline)


class Checked(tuple):
    """Per-rank actions (tuples of Action) that ``validate`` has passed for ``microbatches`` and
    ``vpp`` (``built``): ``simulate`` takes them for those without checking them again."""

    microbatches: int
    vpp: int


@functools.lru_cache(maxsize=16)
def built(name: str, stages: int, microbatches: int, vpp: int = 1) -> Checked:
    """``build``'s actions, checked once: the search simulates one schedule for several
    candidates (planner.search.refine), and builds and checks it once for all of them."""
    parsed = validate(build(name, stages, microbatches, vpp=vpp), stages=stages,
                      microbatches=microbatches, vpp=vpp, deadlock=False)
    out = Checked(tuple(acts) for acts in parsed)
    out.microbatches, out.vpp = microbatches, vpp
    return out


def _compile(parsed, shape: Shape, dur: dict, cut: list[float]):
    """(per rank, each action as (action, seconds, inputs); per (stage, kind), the sends its
    result takes to other ranks). Inputs list (stage, kind, link) of the actions on the same
    micro-batch it waits for, ``link`` the (sending rank, receiving rank) pair or None on the
    same rank; sends list (link, p2p seconds)."""
    home = [shape.rank_of(s) for s in range(shape.num_ids)]
    inputs, seconds, sends = {}, {}, {}
    for s in range(shape.num_ids):
        for kind in "FBW":
            seconds[s, kind] = dur[kind][shape.model_stage(s)]
            deps = []
            for ds, dk, _ in shape.deps(Action(s, kind, 0)):
                link = None if home[ds] == home[s] else (home[ds], home[s])
                if link is not None:
                    sends.setdefault((ds, dk), {})[link] = cut[min(s, ds) % shape.depth]
                deps.append((ds, dk, link))
            inputs[s, kind] = tuple(deps)
    steps = [[(act, seconds[act[:2]], inputs[act[:2]]) for act in acts] for acts in parsed]
    return steps, {k: tuple(v.items()) for k, v in sends.items()}


def _run(steps, sends) -> list[list[float]]:
    """The event loop: per rank, each action's start time. An action's end puts its sends on
    their links (each link carries one send at a time, in the order they were issued), wakes
    the ranks waiting for it and its own rank; a rank starts its next action once every input
    is in."""
    p = len(steps)
    starts: list[list[float]] = [[] for _ in range(p)]
    free = [0.0] * p
    done: dict[tuple, float] = {}
    arrived: dict[tuple, float] = {}  # (stage, kind, micro-batch, link) -> arrival time
    link_free: dict[tuple, float] = {}
    waiting: dict[tuple, list[int]] = {}
    events: list[tuple[float, int]] = []  # (end time, rank); a rank runs one action at a time

    def try_start(r: int) -> None:
        k = len(starts[r])
        if k == len(steps[r]):
            return
        (_, _, mb), seconds, inputs = steps[r][k]
        t = free[r]
        for stage, kind, link in inputs:
            end = done.get((stage, kind, mb))
            if end is None:
                waiting.setdefault((stage, kind, mb), []).append(r)
                return
            if link is not None:
                end = arrived[stage, kind, mb, link]
            if end > t:
                t = end
        starts[r].append(t)
        heapq.heappush(events, (t + seconds, r))

    for r in range(p):
        try_start(r)
    while events:
        end, r = heapq.heappop(events)
        act = steps[r][len(starts[r]) - 1][0]
        done[act] = free[r] = end
        for link, hop in sends.get(act[:2], ()):
            arrival = max(end, link_free.get(link, 0.0)) + hop
            arrived[act[0], act[1], act[2], link] = link_free[link] = arrival
        for w in waiting.pop(act, ()):
            try_start(w)
        try_start(r)
    return starts


def _result(parsed, starts, steps, shape: Shape, act: list[float],
            microbatches: int, keep_timeline: bool = True) -> SimResult:
    timeline, busy, peak_bytes, peak_count = [], [], [], []
    step = 0.0
    for r, acts in enumerate(parsed):
        held = top_bytes = busy_s = 0.0
        count = top_count = 0
        # a split backward keeps a micro-batch's Linear inputs and output gradients until its W
        frees = "W" if any(a[1] == "W" for a in acts) else "B"
        for a, t, (_, d, _) in zip(acts, starts[r], steps[r]):
            s, kind, i = a
            if keep_timeline:
                timeline.append(Interval(r, str(a), t, t + d, kind, s, i))
            step = max(step, t + d)
            busy_s += d
            if kind == "F":
                held += act[shape.model_stage(s)]
                count += 1
                top_bytes, top_count = max(top_bytes, held), max(top_count, count)
            elif kind == frees:
                held -= act[shape.model_stage(s)]
                count -= 1
        busy.append(busy_s)
        peak_bytes.append(top_bytes)
        peak_count.append(top_count)
    timeline.sort(key=itemgetter(2, 0))  # by start, then rank
    idle = tuple(step - b for b in busy)
    return SimResult(step_time_s=step, busy_s=tuple(busy), idle_s=idle,
                     bubble_fraction=sum(idle) / (len(busy) * step) if step > 0 else 0.0,
                     peak_activation_bytes=tuple(peak_bytes), peak_in_flight=tuple(peak_count),
                     timeline=tuple(timeline), microbatches=microbatches)


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Simulator inputs taken from a plan, per model stage (see ``plan_inputs``)."""

    fwd_s: tuple[float, ...]
    """Forward seconds per micro-batch, with its share of tensor-parallel communication."""
    bwd_s: tuple[float, ...]
    """Backward seconds (the B half when split) with recomputation and tensor-parallel share."""
    wgrad_s: tuple[float, ...]
    """Weight-gradient seconds (W), 0 unless the schedule splits backward."""
    p2p_s: tuple[float, ...]
    """One-way send seconds over each cut between neighbouring model stages."""
    activation_bytes: tuple[float, ...]
    """Activation bytes one micro-batch keeps on the stage."""


PREDICTED_KEYS = ("fwd_s", "bwd_s", "recompute_s", "tp_comm_s", "p2p_s",
                  "activation_bytes_per_microbatch")


def plan_inputs(plan, *, schedule_name: str, vpp: int = 1) -> StageTimes:
    """Per-stage times and bytes of ``plan`` (a planner.planfile.document.Plan) for
    ``schedule_name``.

    From ``stages[i].predicted``: F = fwd_s plus the forward's share of tp_comm_s (half; a third
    under full recomputation, which replays the forward's all-reduces in backward, Korthikanti
    et al., MLSys'23), and likewise of the context- and expert-parallel exchanges (cp_comm_s,
    ep_comm_s); the backward = bwd_s + recompute_s + the rest. Schedules with
    W actions (zb-h1) split it in two: W, the weight-gradient GEMMs (wgrad_s; half of bwd_s in
    plans written before it was recorded), and B (input gradients, with recomputation and all of
    the backward's communication).
    The plan's per-stage p2p_s is one send each way, so the cuts' one-way times are recovered
    by differences from the first stage. When ``vpp`` differs from the plan's, each rank's work
    and activations are split evenly over its ``vpp`` new chunks and every cut takes the mean
    one-way time (the activations crossing are the same hidden states)."""
    if getattr(plan, "embeddings", None) is not None:
        raise SpecError("schedule: a recommendation plan (sharded embedding tables, a "
                        "data-parallel dense part) runs no pipeline schedule to simulate or draw")
    stages, pp = plan.stages, plan.parallel["pp"]
    for key in PREDICTED_KEYS:
        if any(key not in st.get("predicted", {}) for st in stages):
            raise SpecError(f"stages[].predicted.{key}: missing from this plan; solve it again "
                            "with this version of the planner")
    pred = [st["predicted"] for st in stages]
    share = pipeline.forward_comm_share(plan.parallel.get("recompute", "none"))
    split = schedule_name in SPLIT_BACKWARD
    # tensor parallelism's collectives split between the passes as the plan records them (by
    # the share in plans made before it did); the K/V exchange and expert dispatch by the share
    tp_f = [s.get("tp_fwd_comm_s", share * s["tp_comm_s"]) for s in pred]
    other = [s.get("cp_comm_s", 0.0) + s.get("ep_comm_s", 0.0) for s in pred]
    cols = [[s["fwd_s"] + f + share * c for s, f, c in zip(pred, tp_f, other)],
            [s["bwd_s"] + s["recompute_s"] + s["tp_comm_s"] - f + (1 - share) * c
             for s, f, c in zip(pred, tp_f, other)],
            [s.get("wgrad_s", 0.5 * s["bwd_s"]) if split else 0.0 for s in pred],
            [s["activation_bytes_per_microbatch"] for s in pred]]
    cuts, prev = [], 0.0
    for s in pred[:-1]:
        prev = max(0.0, s["p2p_s"] - prev)
        cuts.append(prev)
    if len(stages) != pp * vpp:  # regroup the plan's chunks by rank, split evenly into vpp
        rank = [st.get("pipeline_rank", st["index"] % pp) for st in stages]
        cols = [[sum(x for x, r in zip(col, rank) if r == k % pp) / vpp for k in range(pp * vpp)]
                for col in cols]
        cuts = [sum(cuts) / len(cuts) if cuts else 0.0] * (pp * vpp - 1)
    fwd, back, wgrad, act = cols
    return StageTimes(fwd_s=tuple(fwd),
                      bwd_s=tuple(difference_s(b - w, f + b) for f, b, w in zip(fwd, back, wgrad)),
                      wgrad_s=tuple(wgrad), p2p_s=tuple(cuts), activation_bytes=tuple(act))


def simulate_plan(plan, *, schedule_name: str | None = None, microbatches: int | None = None,
                  vpp: int | None = None) -> SimResult:
    """Simulate ``plan``'s pipeline under ``schedule_name`` (default: the plan's own) with
    ``microbatches`` (default: the plan's) of the plan's micro-batch size, and ``vpp`` virtual
    stages per rank (default: the plan's for its own schedule, else 1). The result covers the
    pipeline only, not the data-parallel gradient sync or the optimizer step."""
    par = plan.parallel
    name = schedule_name or par["schedule"]
    own = name == par["schedule"]
    v = vpp or (par.get("vpp", 1) if own else 1)
    m = microbatches or par["num_microbatches"]
    pp = par["pp"]
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise SpecError(f"microbatches: expected a positive integer, got {m!r}")
    if m > MAX_MICROBATCHES:
        raise SpecError(f"microbatches: {m} is more than the {MAX_MICROBATCHES:,} a step may have")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"vpp: expected a positive integer, got {v!r}")
    if name == "interleaved-1f1b" and v < 2:
        raise SpecError("vpp: interleaved-1f1b needs vpp >= 2 virtual stages per rank; pass --vpp")
    if name != "interleaved-1f1b" and v > 1:
        raise SpecError(f"vpp: {v} virtual stages per rank need --schedule interleaved-1f1b")
    if name == "bidirectional" and pp < 2:
        raise SpecError("schedule: bidirectional runs two pipelines in opposite directions over "
                        "pp >= 2 ranks, and this plan has pp=1; simulate a plan with a pipeline")
    if name == "interleaved-1f1b" and pp < 2:
        raise SpecError("schedule: interleaved-1f1b interleaves virtual stages over pp >= 2 "
                        "ranks, and this plan has pp=1; simulate a plan with a pipeline")
    if pp < 2 and name != par["schedule"] and {name, par["schedule"]} <= {"1f1b", "zb-h1"}:
        raise SpecError(f"schedule: this plan has pp=1, no pipeline: {name} runs each "
                        f"micro-batch's forward and backward one after another as its "
                        f"{par['schedule']} does (the same step, the same memory); simulate a plan "
                        "with a pipeline, or gpipe to see all micro-batches in flight")
    if name == "interleaved-1f1b" and m % pp:
        raise SpecError(f"microbatches: interleaved-1f1b needs micro-batches in whole rounds of "
                        f"pp={pp} (as Megatron-LM requires); {m} is not a multiple of {pp}: use "
                        + " or ".join(str(k) for k in ((m // pp) * pp, (m // pp + 1) * pp) if k))
    blocks = len(plan.model.get("blocks", [])) or pp * v
    if pp * v > blocks:
        raise SpecError(f"vpp: pp x vpp = {pp * v} stages for {blocks} blocks; use a smaller --vpp")
    actions = build(name, par["pp"], m, vpp=v)
    t = plan_inputs(plan, schedule_name=name, vpp=v)
    return simulate(actions, microbatches=m, fwd_s=t.fwd_s, bwd_s=t.bwd_s, wgrad_s=t.wgrad_s,
                    p2p_s=t.p2p_s, activation_bytes=t.activation_bytes, vpp=v,
                    bidirectional=name == "bidirectional")
