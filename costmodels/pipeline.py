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
  with fewer micro-batches than stages (m < p) the step is ``(m + p - 1)(t_F + t_B) + t_W``: every
  W but the first stage's last one runs beside another stage's F or B (one micro-batch: the forward
  chain, the backward chain back, and stage 0's W). Its first rank holds 1F1B's p micro-batches;
  rank r holds p - r like 1F1B's plus the r whose W it holds back, each keeping its Linear
  layers' inputs and output gradients, about a micro-batch's activations (Qi et al., Table 1:
  32 sbh against 34 sbh a layer), so counted whole: about p on every rank.
On unequal stages the steady state runs at the slowest rank: ``sum_r t_r / v + (m - 1/v) max_r t_r``.
"""

from __future__ import annotations

from typing import Literal, Sequence, get_args

from costmodels.errors import SpecError

Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]
"""The pipeline schedules these closed forms price (the planner searches over these)."""
SCHEDULES: tuple[str, ...] = get_args(Schedule)


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
                vpp: int = 1, wgrad_s: float = 0.0) -> float:
    """Pipeline time of one step, from each rank's forward+backward time of one micro-batch
    (summed over its ``vpp`` chunks); ``wgrad_s``: the weight-gradient part of the slowest rank's
    backward (what ZB-H1 moves into the bubble)."""
    _check(schedule)
    if not rank_times_s:
        return 0.0
    v = vpp if schedule == "interleaved-1f1b" else 1
    step = sum(rank_times_s) / v + (microbatches - 1 / v) * max(rank_times_s)
    if schedule == "zb-h1":  # the drain's weight gradients fill its bubbles
        pp = len(rank_times_s)
        step -= min(2 * (pp - 1), microbatches + pp - 2) * wgrad_s
    return step
