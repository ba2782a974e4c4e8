"""Closed-form pipeline step time, bubble and in-flight micro-batches per schedule.

With ``p`` stages and ``m`` micro-batches on equal stages of forward+backward time ``t``:
- GPipe (Huang et al., NeurIPS'19) and 1F1B (PipeDream-Flush, Narayanan et al., ICML'21) both take
  ``(m + p - 1) t``; the idle fraction ("bubble") is ``(p - 1) / (m + p - 1)``.
- GPipe keeps all ``m`` micro-batches' activations alive at the flush; 1F1B keeps at most
  ``p - i`` on stage ``i`` (0-based).
On unequal stages the steady state runs at the slowest stage: ``sum_i t_i + (m - 1) max_i t_i``.
"""

from __future__ import annotations

from typing import Sequence

from costmodels.errors import SpecError

SCHEDULES = ("gpipe", "1f1b")


def _check(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise SpecError(f"schedule: unknown schedule '{schedule}'; choose one of {', '.join(SCHEDULES)}")


def in_flight(schedule: str, *, stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak."""
    _check(schedule)
    if schedule == "gpipe":
        return microbatches
    return min(stages - stage, microbatches)


def bubble_fraction(*, stages: int, microbatches: int) -> float:
    """Idle fraction of a GPipe/1F1B step on equal stages."""
    return (stages - 1) / (microbatches + stages - 1)


def step_time_s(stage_times_s: Sequence[float], *, microbatches: int, schedule: str) -> float:
    """Pipeline time of one step, from per-stage forward+backward time of one micro-batch."""
    _check(schedule)
    if not stage_times_s:
        return 0.0
    return sum(stage_times_s) + (microbatches - 1) * max(stage_times_s)
