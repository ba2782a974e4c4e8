"""Timing a piece of work on one device, the same way for every measurement of ``plan profile``."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Timer:
    """Times callables on ``device`` (cpu or cuda). With a ``barrier`` shared by concurrent
    processes, every measurement starts when all of them reach it, so they measure the same kernel
    at the same time (memory-bound kernels slow each other down only when they overlap, as in
    training)."""

    device: str
    barrier: object | None = None
    """A multiprocessing Barrier, or None for a process measuring alone."""
    spreads: list = field(default_factory=list, compare=False)
    """Each measurement's spread over its repeats (spread_of), in the order taken."""

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA kernels run asynchronously)."""
        if self.device == "cuda":
            torch.cuda.synchronize()

    def align(self) -> None:
        """Wait for the other processes, when there are any."""
        if self.barrier is not None:
            self.barrier.wait()

    def median_s(self, fn, min_s: float = 0.4, min_reps: int = 5) -> float:
        """Median seconds of ``fn()`` (after one warm-up), repeating for at least ``min_s``."""
        self.align()
        fn()
        self.sync()
        samples, start = [], time.perf_counter()
        while len(samples) < min_reps or time.perf_counter() - start < min_s:
            t0 = time.perf_counter()
            fn()
            self.sync()
            samples.append(time.perf_counter() - t0)
            if len(samples) > 2000:
                break
        self.spreads.append(spread_of(samples))
        return statistics.median(samples)


def spread_of(samples: list[float]) -> float:
    """The interquartile range of a measurement's repeats over their median: how far a second
    measurement of the same work may land."""
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)
