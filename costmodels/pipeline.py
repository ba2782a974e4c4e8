"""Closed-form pipeline step time, bubble and in-flight micro-batches per schedule.

With ``p`` stages and ``m`` micro-batches on equal stages of forward+backward time ``t``:
- GPipe (Huang et al., NeurIPS'19) and 1F1B (PipeDream-Flush, Narayanan et al., ICML'21) both take
  ``(m + p - 1) t``; the idle fraction ("bubble") is ``(p - 1) / (m + p - 1)``.
- Interleaved 1F1B (Narayanan et al., SC'21, section 2.2.2) gives each rank ``v`` model chunks of
  time ``t / v``: ``(m + (p - 1) / v) t``, bubble ``(p - 1) / (v m + p - 1)``.
- GPipe keeps all ``m`` micro-batches' activations alive at the flush; 1F1B keeps at most
  ``p - i`` on stage ``i`` (0-based); interleaved 1F1B warms up with ``2 (p - i - 1) + (v - 1) p``
  chunk forwards (Megatron-LM's schedule), each holding 1/v of the rank's activations.
- ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24) splits the backward into the
  input gradient B and the weight gradient W and fills the drain with W's: its bubble is
  ``(p - 1)(t_F + t_B - t_W)`` against 1F1B's ``(p - 1)(t_F + t_B + t_W)``;
  with fewer micro-batches than stages (m < p) and ``t_W <= t_B`` the step is
  ``(m + p - 1)(t_F + t_B) + t_W``: every
  W but the first stage's last one runs beside another stage's F or B (one micro-batch: the forward
  chain, the backward chain back, and stage 0's W). Its first rank holds 1F1B's p micro-batches;
  rank r holds p - r like 1F1B's plus the r whose W it holds back, each keeping its Linear
  layers' inputs and output gradients, about a micro-batch's activations (Qi et al., Table 1:
  32 sbh against 34 sbh a layer), so counted whole: about p on every rank.
On unequal stages the steady state runs at the slowest rank: ``sum_r t_r / v + (m - 1/v) max_r t_r``.
For 1F1B with each rank's forward known (``fwd_s``), the step is the largest over ranks of what
each must take (``one_f_one_b_s``): exact on equal stages and never above the schedule's
simulation, where the steady-state form overcounts the fill when the slowest rank is not the last
(by up to about a fifth on splits with a heavy first stage). ZB-H1 with each rank's forward and
weight gradients known is priced the same way (``zb_h1_s``): exact on equal stages and never above
its simulation, which the form on the slowest rank's weight gradients could exceed.
"""

from __future__ import annotations

from typing import Literal, Sequence, get_args

from costmodels import memory
from costmodels.errors import SpecError

Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]
"""The pipeline schedules these closed forms price (the planner searches over these)."""
SCHEDULES: tuple[str, ...] = get_args(Schedule)


def forward_comm_share(recompute: str) -> float:
    """The share of a chunk's collectives (tensor-parallel all-reduces, context-parallel K/V
    exchange, expert dispatch) its forward runs: half, the backward the other half; a third under
    full recomputation, which replays the forward's in backward (Korthikanti et al., MLSys'23);
    under ``full/k`` (every k-th layer recomputed, the layers' collectives alike) k of the 2k + 1
    passes a group of k layers runs them in."""
    k = memory.layer_interval(recompute)
    if k:
        return k / (2 * k + 1)
    return 1 / 3 if recompute == "full" else 1 / 2


def _check(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise SpecError(f"schedule: unknown schedule '{schedule}'; choose one of {', '.join(SCHEDULES)}")


def in_flight(schedule: str, *, stage: int, stages: int, microbatches: int, vpp: int = 1) -> float:
    """Micro-batches' worth of activations rank ``stage`` holds at its peak."""
    _check(schedule)
    if schedule == "gpipe":
        return microbatches
    if schedule == "interleaved-1f1b" and vpp > 1:
        chunks = min(microbatches * vpp, 2 * (stages - stage - 1) + (vpp - 1) * stages + 1)
        return chunks / vpp
    full = min(stages - stage, microbatches)
    if schedule == "zb-h1":  # and the micro-batches whose W waits (planner.schedule.builders)
        return full + min(stage, max(0, microbatches - stages + stage))
    return full


def bubble_fraction(*, stages: int, microbatches: int, vpp: int = 1) -> float:
    """Idle fraction of a step on equal stages."""
    return (stages - 1) / (vpp * microbatches + stages - 1)


def step_time_s(rank_times_s: Sequence[float], *, microbatches: int, schedule: str,
                vpp: int = 1, wgrad_s: float | Sequence[float] = 0.0,
                fwd_s: Sequence[float] | None = None,
                sends_s: Sequence[float] | None = None) -> float:
    """Pipeline time of one step, from each rank's forward+backward time of one micro-batch
    (summed over its ``vpp`` chunks); ``wgrad_s``: the weight-gradient part of the backward (what
    ZB-H1 moves into the bubble), the slowest rank's (a number) or, with ``fwd_s``, each rank's
    (a sequence); ``fwd_s``: each rank's forward part, which prices 1F1B and ZB-H1 on unequal
    stages rank by rank (``one_f_one_b_s``, ``zb_h1_s``), there with ``sends_s``: one send's
    seconds over each cut between neighbouring ranks."""
    _check(schedule)
    if not rank_times_s:
        return 0.0
    if schedule == "1f1b" and fwd_s is not None:
        return one_f_one_b_s(fwd_s, [t - f for t, f in zip(rank_times_s, fwd_s)],
                             microbatches=microbatches, sends_s=sends_s)
    per_rank = not isinstance(wgrad_s, (int, float))  # a sequence or an array, one per rank
    if schedule == "zb-h1" and fwd_s is not None:
        if not per_rank:
            raise SpecError("wgrad_s: ZB-H1 priced rank by rank (fwd_s given) needs each rank's "
                            "weight-gradient seconds; pass a sequence, one per rank")
        return zb_h1_s(fwd_s, [t - f - w for t, f, w in zip(rank_times_s, fwd_s, wgrad_s)],
                       wgrad_s, microbatches=microbatches, sends_s=sends_s)
    if per_rank:
        raise SpecError("wgrad_s: without fwd_s ZB-H1 takes the slowest rank's weight-gradient "
                        "seconds; pass a number")
    v = vpp if schedule == "interleaved-1f1b" else 1
    step = sum(rank_times_s) / v + (microbatches - 1 / v) * max(rank_times_s)
    if schedule == "zb-h1":  # the drain's weight gradients fill its bubbles
        pp = len(rank_times_s)
        step -= min(2 * (pp - 1), microbatches + pp - 2) * wgrad_s
    return step


def one_f_one_b_s(fwd_s: Sequence[float], bwd_s: Sequence[float], *, microbatches: int,
                  sends_s: Sequence[float] | None = None) -> float:
    """1F1B's step from each rank's forward and backward time of one micro-batch: the most any
    rank s must take. Rank s runs k = min(p - s, m) forwards before its first backward (the
    schedule's warm-up and one). It starts once micro-batch 0 has crossed the ranks before it,
    runs m (F_s + B_s), and waits twice for a round trip D_s through the ranks after it (the
    sum of their F + B): before its first backward for micro-batch 0's, beyond its k - 1 further
    forwards; and, with m > k, after its last forward for the last micro-batch's, beyond its
    k - 1 backwards still due. Its last backward's gradient then crosses the ranks before it.
    And with k in flight it starts micro-batch i + k only after micro-batch i came back: a chain
    of ceil(m / k) round trips F_s + D_s + B_s between the same crossings. The same holds part
    of the way (m >= p - s): rank s + e runs B(i) after F(i + k - e - 1), and rank s runs
    F(i + k) after B(i), so micro-batch i + k leaves rank s at least a cycle after i + k - e - 1
    did: F_s + B_s and the passes and sends there and back through ranks s + 1 .. s + e; a
    chain of floor((m - k + e) / (e + 1)) cycles after rank s's first k - e forwards, which
    slow links (sends as long as the passes) make the pace of the whole pipeline.
    Equal stages give (m + p - 1) t; on unequal ones it never exceeds the event-by-event
    simulation (planner.schedule.simulator), which can be less (tests/costmodels).
    ``sends_s``: one send's seconds over each cut between neighbouring ranks (p - 1 values; an
    activation forward or its gradient back): micro-batch 0 crosses the cuts before s on its way
    in and its gradient on its way back, and a round trip crosses every cut after s both ways."""
    sends = list(sends_s) if sends_s is not None else [0.0] * (len(fwd_s) - 1)
    return _back_to_rank_0(_last_backward_ends(fwd_s, bwd_s, microbatches, sends), bwd_s, sends)


def _back_to_rank_0(ends: Sequence[float], bwd_s: Sequence[float],
                    sends: Sequence[float]) -> float:
    """The most of each rank's last backward end and its gradient's way back to rank 0."""
    back = 0.0  # the last gradient's way from rank s back through the ranks before it
    step = 0.0
    for s, end in enumerate(ends):
        step = max(step, end + back)
        back += bwd_s[s] + (sends[s] if s < len(sends) else 0.0)
    return step


def _last_backward_ends(fwd_s: Sequence[float], bwd_s: Sequence[float], m: int,
                        sends: Sequence[float]) -> list[float]:
    """Per rank, at most the end of its last backward under 1F1B (one_f_one_b_s, which adds the
    gradient's way back to rank 0)."""
    p = len(fwd_s)
    ends = [0.0] * p
    after = 0.0  # D_s, the round trip through the ranks after s
    before_f = sum(fwd_s) + sum(sends)
    for s in reversed(range(p)):
        f, b = fwd_s[s], bwd_s[s]
        before_f -= f
        k = min(p - s, m)
        wait = max(0.0, after - (k - 1) * f) + (max(0.0, after - (k - 1) * b) if m > k else 0.0)
        end = max(before_f + m * (f + b) + wait, before_f + -(-m // k) * (f + after + b))
        if m >= p - s:  # rank s and the e ranks after it in their steady state
            path = 0.0
            for e in range(1, k - 1):
                r = s + e
                path += fwd_s[r] + bwd_s[r] + 2 * sends[r - 1]
                cycle = f + b + path
                start = k - e - 1  # the first micro-batch of the chain
                end = max(end, before_f + (start + 1) * f + (m - 1 - start) // (e + 1) * cycle
                          + cycle - f)
        ends[s] = end
        into = sends[s - 1] if s > 0 else 0.0  # the cut into rank s
        before_f -= into
        after += f + b + 2 * into
    return ends


def zb_h1_s(fwd_s: Sequence[float], bwd_s: Sequence[float], wgrad_s: Sequence[float], *,
            microbatches: int, sends_s: Sequence[float] | None = None) -> float:
    """ZB-H1's step from each rank's forward, input-gradient backward (B) and weight-gradient (W)
    time of one micro-batch, in the order planner.schedule.builders.zb_h1 runs them: 1F1B's
    forwards and backwards, rank 0 running each W right after its B, rank r holding back its
    first r. The most of three lower bounds of the simulation:

    - 1F1B's rank-by-rank form (one_f_one_b_s) with rank 0's backward B + W and the other ranks'
      W left out: leaving work out only moves passes earlier;
    - each rank's passes, m (F + B + W), after micro-batch 0 has crossed the ranks before it;
    - each rank r > 0's last B (at the earliest as that form has it) and the W passes still due
      after it: 1 + min(r, m - warm-up, m - 1), the ones it held back.
    Exact on equal stages: Qi et al.'s (m + p - 1)(t_F + t_B) + (m - p + 1) t_W with m >= p
    (t_W at most t_F + t_B), rank 0's chain (m + p - 1)(t_F + t_B) + t_W with m < p (t_W at
    most t_B; a heavier W, which real blocks do not have, is undercounted by a few percent); on
    unequal ones never above the event-by-event simulation (tests/planner/schedule).
    ``sends_s``: one send's seconds over each cut (p - 1 values), as in one_f_one_b_s."""
    p, m = len(fwd_s), microbatches
    sends = list(sends_s) if sends_s is not None else [0.0] * (p - 1)
    merged = [bwd_s[0] + wgrad_s[0]] + list(bwd_s[1:])
    ends = _last_backward_ends(fwd_s, merged, m, sends)
    step = _back_to_rank_0(ends, merged, sends)  # one_f_one_b_s(fwd_s, merged, ...)
    arrive = 0.0  # micro-batch 0 reaches rank s
    for s in range(p):
        step = max(step, arrive + m * (fwd_s[s] + bwd_s[s] + wgrad_s[s]))
        arrive += fwd_s[s] + (sends[s] if s < p - 1 else 0.0)
    for r, end in enumerate(ends):
        if r:
            warmup = min(p - r - 1, m)
            step = max(step, end + (1 + min(r, m - warmup, m - 1)) * wgrad_s[r])
    return step


def one_f_one_b_floor_s(total_s: float, busiest_s: float, *, stages: int,
                        microbatches: int) -> float:
    """At most ``one_f_one_b_s`` of any split of ``total_s`` (T) over ``stages`` (p) ranks whose
    busiest takes at least ``busiest_s`` (the search's bound). With m > p, rank s (time t_s, D_s
    after it, P_s = T - t_s - D_s before it) takes L_s >= T + D_s + (m - p + s) t_s (its two
    waits), and also P_s + m t_s. For the busiest rank the mean of the two is
    T + (m - (p - s + 1) / 2) t. Over all ranks, the weights w_s = u_s / (m - p + s) with
    u_s = c (m - p - 1) / (m - p + s - 1), c = (m - 1) / p, are non-negative, add up to 1 and
    give every t_i the coefficient c in sum_s w_s (D_s + (m - p + s) t_s), so some L_s is at
    least T + c T = (m + p - 1) T / p: the balanced pipeline's time. With 2 <= m <= p, rank
    q = p - m + 1 waits twice (L_q >= T + D_q + t_q) and every rank takes P_s + m t_s: weights v
    on L_q and w_s = (v - W_s) / m on the ranks s <= p - m (W_s: the weight of the ranks after s
    among them), v (2 - (1 - 1/m)^(p - m + 1)) = 1, give every t_i the coefficient 2 v, so
    L >= 2 T / (2 - (1 - 1/m)^(p - m + 1)) (2 p T / (p + 1) at m = p): the least any split gives,
    as a linear program over the splits finds. The busiest runs m passes."""
    p, m, t = stages, microbatches, busiest_s
    if m > p:
        return max(m * t, total_s + (m - (p + 1) / 2) * t, (m + p - 1) * total_s / p)
    return max(m * t, 2 * total_s / (2 - (1 - 1 / m) ** (p - m + 1)))
