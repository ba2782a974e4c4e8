"""Split a chain of blocks into contiguous pipeline stages: minimize the slowest stage, fit memory.

Feasibility for a bound T is decided greedily: each stage takes the longest run of blocks whose time
stays within T and whose memory fits that stage. Both limits only tighten as a run grows. The
memory limit differs per stage (early 1F1B stages hold more micro-batches in flight), and the
greedy fills from the end whose stages are loosest: from the last stage back when the micro-batches
in flight fall along the pipeline (1F1B, ZB-H1), from the first when they do not
grow (GPipe). Filling from the other end is not exact: a first stage that takes all it can may
leave the next (tighter) stage a block only a later one can hold (found by a property test against
brute force, 2026-12-05). From the loose end the exchange argument holds: after every stage the
greedy has covered at least what any feasible split's stages there cover, and where it has
covered more, the blocks left to each tighter stage are a subset of that split's stage or single
blocks that split put on a tighter stage still. Where the limits follow neither order (the chunks
of an interleaved schedule, whose in-flight counts fall over each round of ranks and rise again at
the next), the better of the two fills is taken: not proven exact there (``partition_staged``'s
dynamic program is, at about a hundred times the cost). The optimal bottleneck is the time of some run of
consecutive blocks, so a binary search over those values finds it (Bokhari 1988; Pinar & Aykanat,
"Fast optimal load balancing algorithms for 1D partitioning", JPDC 2004).

``brute_force`` enumerates every split; tests use it as the oracle.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass
class StageMemory:
    """Memory of a stage = sum(static) + in_flight[stage] * sum(act) + max(work) - shared."""

    static: Sequence[float]
    """Per block: bytes independent of micro-batches in flight (model states)."""
    act: Sequence[float]
    """Per block: activation bytes one micro-batch keeps."""
    work: Sequence[float]
    """Per block: transient bytes while it runs (the stage needs the largest)."""
    in_flight: Sequence[int]
    """Per stage: micro-batches whose activations it holds at its peak."""
    capacity: float
    """Bytes available on each GPU."""
    shared: list[tuple[int, int, float]] = field(default_factory=list)
    """(block i, block j, bytes) held once when i and j share a stage (tied weights)."""

    def flipped(self) -> "StageMemory":
        """The same stages and blocks in reverse order (the last stage first)."""
        n = len(self.static)
        return StageMemory(static=list(self.static)[::-1], act=list(self.act)[::-1],
                           work=list(self.work)[::-1], in_flight=list(self.in_flight)[::-1],
                           capacity=self.capacity,
                           shared=[(n - 1 - c, n - 1 - a, b) for a, c, b in self.shared])

    def of(self, stage: int, i: int, j: int) -> float:
        """Memory of blocks [i, j) on stage ``stage``."""
        static = sum(self.static[i:j]) - sum(b for a, c, b in self.shared if i <= a < j and i <= c < j)
        return static + self.in_flight[stage] * sum(self.act[i:j]) + max(self.work[i:j], default=0.0)


@dataclass
class Partition:
    bounds: list[int]
    """Start index of each stage, plus the end (len = stages + 1)."""
    stage_times: list[float]

    @property
    def bottleneck(self) -> float:
        return max(self.stage_times)


def _greedy(times: Sequence[float], stages: int, bound: float, mem: StageMemory | None,
            offsets: Sequence[float] | None = None) -> list[int] | None:
    n = len(times)
    bounds = [0]
    i = 0
    if mem is not None:  # locals: this loop runs for every configuration a search prices
        m_static, m_act, m_work, capacity = mem.static, mem.act, mem.work, mem.capacity
        shared = mem.shared
    for s in range(stages):
        if i >= n:
            return None
        cap = n - (stages - s - 1)  # leave one block for every later stage
        t = offsets[s] if offsets is not None else 0.0
        static = act = 0.0
        work = 0.0
        j = i
        if mem is None:
            while j < cap and not t + times[j] > bound:  # (a NaN time is taken, as below)
                t += times[j]
                j += 1
        else:
            flight = mem.in_flight[s]
            while j < cap:
                t_next = t + times[j]
                if t_next > bound:
                    break
                s_next = static + m_static[j]
                for a, c, b in shared:
                    if c == j and i <= a < j:
                        s_next -= b
                a_next = act + m_act[j]
                w_next = m_work[j] if m_work[j] > work else work
                if s_next + flight * a_next + w_next > capacity:
                    break
                static, act, work = s_next, a_next, w_next
                t = t_next
                j += 1
        if j == i:
            return None
        bounds.append(j)
        i = j
    return bounds if i == n else None


def _times_of(times: Sequence[float], bounds: list[int],
              offsets: Sequence[float] | None = None) -> list[float]:
    off = offsets if offsets is not None else [0.0] * (len(bounds) - 1)
    return [sum(times[a:b]) + o for (a, b), o in zip(zip(bounds, bounds[1:]), off)]


def partition(times: Sequence[float], stages: int, mem: StageMemory | None = None,
              rel_tol: float = 1e-9, offsets: Sequence[float] | None = None) -> Partition | None:
    """Optimal contiguous split of ``times`` into ``stages`` non-empty stages, or None if none fits.
    ``offsets[s]``: seconds stage s spends whatever blocks it holds (sends across a slow link);
    the bottleneck counts them."""
    n = len(times)
    if stages < 1 or n < stages:
        return None
    off = list(offsets) if offsets is not None else [0.0] * stages
    if mem is not None and sum(mem.static) + max(mem.in_flight) * sum(mem.act) + \
            max(mem.work, default=0.0) <= mem.capacity:
        mem = None  # every stage fits even holding all blocks: memory never binds
    if mem is not None:
        flights = list(mem.in_flight)[:stages]
        falls = any(b < a for a, b in zip(flights, flights[1:]))
        if falls:  # later stages are looser: fill from the last one back
            mine = dataclasses.replace(mem, in_flight=flights)
            back = _forward_partition(list(times)[::-1], stages, mine.flipped(), rel_tol,
                                      off[::-1])
            if back is not None:
                back = Partition(bounds := [n - b for b in reversed(back.bounds)],
                                 _times_of(times, bounds, off))
            if not any(b > a for a, b in zip(flights, flights[1:])):
                return back
            # limits in neither order (the chunks of an interleaved schedule): the better of
            # the two fills, neither proven exact here
            ahead = _forward_partition(times, stages, mem, rel_tol, off)
            return min((p for p in (back, ahead) if p is not None), default=None,
                       key=lambda p: p.bottleneck)
    return _forward_partition(times, stages, mem, rel_tol, off)


def _forward_partition(times: Sequence[float], stages: int, mem: StageMemory | None,
                       rel_tol: float, off: list[float]) -> Partition | None:
    """``partition`` filling each stage from the first on (exact where no later stage's memory
    limit is tighter than an earlier one's)."""
    total = float(sum(times))
    hi_bounds = _greedy(times, stages, float("inf"), mem, off)
    if hi_bounds is None:
        return None
    best = hi_bounds
    hi = max(_times_of(times, best, off))
    lo = max(max(times) + min(off), (total + sum(off)) / stages)
    if lo >= hi:
        return Partition(best, _times_of(times, best, off))
    first = _greedy(times, stages, lo * (1 + rel_tol), mem, off)
    if first is not None:
        return Partition(first, _times_of(times, first, off))
    # The optimal bottleneck is the time of some run of consecutive blocks (plus an offset):
    # binary search over those values between the bounds (each probe is one greedy pass).
    candidates = _interval_sums(times, lo, hi, sorted(set(off)))
    low, high = 0, len(candidates) - 1  # invariant: candidates[high] is feasible
    while low < high:
        mid = (low + high) // 2
        b = _greedy(times, stages, candidates[mid] * (1 + rel_tol), mem, off)
        if b is None:
            low = mid + 1
        else:
            best, high = b, mid
    return Partition(best, _times_of(times, best, off))


def _interval_sums(times: Sequence[float], lo: float, hi: float,
                   offsets: Sequence[float] = (0.0,)) -> list[float]:
    """Sorted distinct sums of runs of consecutive times (plus each offset) within [lo, hi] (hi
    included)."""
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(times, dtype=float))))
    sums = (prefix[None, :] - prefix[:, None])[np.triu_indices(len(prefix), k=1)]
    sums = np.concatenate([sums + o for o in offsets])
    inside = sums[(sums >= lo * (1 - 1e-12)) & (sums <= hi * (1 + 1e-12))]
    values = np.unique(np.round(inside, 15))
    if values.size == 0 or values[-1] < hi:
        values = np.append(values, hi)
    return values.tolist()


def even_partition(times: Sequence[float], stages: int) -> Partition | None:
    """The split whose cuts fall nearest to equal shares of the total time (every stage keeps at
    least one block), memory not considered: the chunks of an interleaved schedule add up per
    rank, and a split that minimizes the slowest chunk may still load one rank's chunks more
    than another's (a short first chunk where the embedding's memory binds, long ones after)."""
    n = len(times)
    if stages < 1 or n < stages:
        return None
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(times, dtype=float))))
    bounds = [0]
    for k in range(1, stages):
        lo, hi = bounds[-1] + 1, n - (stages - k)
        target = k * prefix[-1] / stages
        bounds.append(lo + int(np.argmin(np.abs(prefix[lo:hi + 1] - target))))
    bounds.append(n)
    return Partition(bounds, _times_of(times, bounds))


class RanksFit:
    """Whether a split's ranks fit ``capacity``: each rank's chunks together (chunk c on rank c %
    ``ranks``), each counted whole as ``StageMemory.of`` counts a stage, their transient bytes
    added (an upper bound)."""

    def __init__(self, mem: StageMemory, ranks: int, chunks: int, capacity: float):
        self.static = np.concatenate(([0.0], np.cumsum(mem.static)))
        self.act = np.concatenate(([0.0], np.cumsum(mem.act)))
        self.work = np.asarray(mem.work, dtype=float)
        self.flight = np.asarray(mem.in_flight[:chunks])
        self.credit = [(a, c, b) for a, c, b in mem.shared if b > 0]
        self.onehot = np.eye(ranks)[np.arange(chunks) % ranks]
        self.capacity = capacity

    def __call__(self, bounds) -> bool:
        b = np.asarray(bounds)
        used = np.diff(self.static[b]) + self.flight * np.diff(self.act[b]) + \
            np.maximum.reduceat(self.work, b[:-1])
        for a, c, shared in self.credit:  # a tied weight held once where both ends share a chunk
            k = int(np.searchsorted(b, a, side="right")) - 1
            if b[k] <= c < b[k + 1]:
                used[k] -= shared
        return bool((used @ self.onehot <= self.capacity * (1 + 1e-12)).all())


RANK_TIE = 1e-3
"""Ranks within this share of the busiest rank's time count as tied with it in ``rank_balanced``
(the search's own tie between plans is 0.1%): layers whose times differ in the fourth digit
(a send more on one) would otherwise be shuffled between ranks for nothing, a hundred moves on
Llama-3 405B's 96 chunks."""


def rank_balanced(times: Sequence[float], ranks: int, start: Partition,
                  mem: StageMemory | None = None, capacity: float = float("inf"),
                  max_moves: int | None = None) -> Partition:
    """``start``'s cuts moved while the busiest rank gets lighter: the chunks of an interleaved
    schedule go round the ``ranks`` (chunk c on rank c % ranks), and its step grows with the
    busiest rank's chunks together, which neither the slowest chunk (``partition``) nor equal
    chunks (``even_partition``) decide: Llama-3 8B's 34 blocks in 2 x 4 chunks split 4, 4, 5, 4,
    4, 4, 5, 2 + head put 18 layers on one rank and 14 and the head on the other, 5% slower than
    4, 4, 4, 4, 4, 4, 5, 3 + head (a review, 2026-12-07). A move shifts a run of consecutive
    cuts (up to ``ranks`` of them) one block back or on, which carries one block from the chunk
    before the run to the chunk after it, so a block can reach any rank; each step takes the
    move that lowers (the busiest rank's time, how many ranks take it, within RANK_TIE) most,
    so that ties on the busiest rank still progress (the sum of the ranks' squares breaks ties
    between moves).
    A local search, not proven optimal: from the even split of 300 small random chains (2-4
    ranks x 2-3 chunks) its busiest rank came out 0.8% above the best split's on average, 3.1%
    at the 90th percentile (the even split: 10.8%).
    With ``mem``, a move is taken only where each rank's chunks together (each counted whole,
    as ``mem.of``, their transient bytes added: an upper bound) fit ``capacity``."""
    n, chunks = len(times), len(start.bounds) - 1
    bounds = np.asarray(start.bounds)
    if ranks < 2 or chunks <= ranks:
        return Partition(bounds.tolist(), _times_of(times, bounds.tolist()))
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(times, dtype=float))))
    onehot = np.eye(ranks)[np.arange(chunks) % ranks]  # chunk -> its rank
    # every move: (first cut k, last cut j, direction), j - k < ranks
    first, last = zip(*[(k, j) for k in range(1, chunks)
                        for j in range(k, min(k + ranks, chunks))])
    first, last = np.array(first), np.array(last)
    cols = np.arange(chunks + 1)
    shifted = ((cols >= first[:, None]) & (cols <= last[:, None])).astype(int)
    shift = np.concatenate((-shifted, shifted))
    first, last = np.concatenate((first, first)), np.concatenate((last, last))
    back = np.arange(len(shift)) < len(shift) // 2
    # the ranks whose chunks a move changes: those of the chunks from the one before its run to
    # the last one in it
    touched = (cols[None, :chunks] >= first[:, None] - 1) & (cols[None, :chunks] <= last[:, None])
    touches = (touched.astype(int) @ onehot) > 0
    giver = np.where(back, first - 1, last) % ranks  # the rank whose chunk loses the block

    fits = RanksFit(mem, ranks, chunks, capacity) if mem is not None else (lambda b: True)

    def step(rows: np.ndarray, peak: float, busy: np.ndarray):
        """The best of ``rows``' moves that fits and lowers (peak, how many ranks take it)."""
        moved = bounds[None, :] + shift[rows]
        # every chunk keeps a block: the one before a run moved back, the one after a run on
        at = np.arange(len(rows))
        allowed = np.where(back[rows], moved[at, first[rows]] > bounds[first[rows] - 1],
                           moved[at, last[rows]] < bounds[last[rows] + 1])
        new = np.diff(prefix[moved], axis=1) @ onehot
        busiest = new.max(axis=1)
        at_peak = (new >= peak * (1 - RANK_TIE)).sum(axis=1)
        ok = np.flatnonzero(allowed & ((busiest < peak * (1 - RANK_TIE)) | (
            (busiest <= peak) & (at_peak < busy.sum()))))
        for i in ok[np.lexsort(((new[ok] ** 2).sum(axis=1), at_peak[ok], busiest[ok]))]:
            if fits(moved[i]):
                return moved[i], new[i]
        return None

    rank_t = np.diff(prefix[bounds]) @ onehot
    for _ in range(max_moves if max_moves is not None else 4 * n):
        peak = rank_t.max()
        busy = rank_t >= peak * (1 - RANK_TIE)
        # only a move changing a busiest rank can lower the peak or how many ranks take it:
        # first those taking a block from one (fewer), then those whose run shifts a busiest
        # rank's chunk along (blocks of unequal times)
        took = busy[giver]
        found = step(np.flatnonzero(took), peak, busy) or \
            step(np.flatnonzero(~took & touches[:, busy].any(axis=1)), peak, busy)
        if found is None:
            break
        bounds, rank_t = found
    return Partition(bounds.tolist(), _times_of(times, bounds.tolist()))


def brute_force(times: Sequence[float], stages: int, mem: StageMemory | None = None) -> Partition | None:
    """Every split of ``times`` into ``stages`` contiguous non-empty stages; the best feasible one."""
    n = len(times)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        if mem is not None and any(mem.of(s, a, b) > mem.capacity
                                   for s, (a, b) in enumerate(zip(bounds, bounds[1:]))):
            continue
        p = Partition(bounds, _times_of(times, bounds))
        if best is None or p.bottleneck < best.bottleneck:
            best = p
    return best


def partition_staged(times: Sequence[Sequence[float]], stages: int, mem: StageMemory | None = None,
                     capacities: Sequence[float] | None = None) -> Partition | None:
    """Like ``partition`` when stage ``s`` runs block ``b`` in ``times[s][b]`` seconds and may use
    ``capacities[s]`` bytes (stages on different devices). The greedy is no longer exact here
    (taking more on a fast stage can leave a slow one too much), so this is the dynamic program
    best[s][j] = min over i of max(best[s-1][i], time of blocks i..j-1 on stage s), vectorized
    over i. Tied weights are not credited (they matter only when both ends share a stage)."""
    n = len(times[0])
    if stages < 1 or n < stages:
        return None
    inf = float("inf")
    prefix = [np.concatenate(([0.0], np.cumsum(np.asarray(t, dtype=float)))) for t in times]
    if mem is not None:
        static = np.concatenate(([0.0], np.cumsum(mem.static)))
        act = np.concatenate(([0.0], np.cumsum(mem.act)))
        work = np.asarray(mem.work, dtype=float)
    best = np.full(n + 1, inf)
    best[0] = 0.0
    choice = np.zeros((stages, n + 1), dtype=int)
    for s in range(stages):
        nxt = np.full(n + 1, inf)
        for j in range(s + 1, n - (stages - s - 1) + 1):
            i = np.arange(s, j)
            value = np.maximum(best[i], prefix[s][j] - prefix[s][i])
            if mem is not None:
                run_max = np.maximum.accumulate(work[s:j][::-1])[::-1]
                need = (static[j] - static[i]) + mem.in_flight[s] * (act[j] - act[i]) + run_max
                limit = capacities[s] if capacities is not None else mem.capacity
                value = np.where(need <= limit * (1 + 1e-12), value, inf)  # prefix-sum rounding
            k = int(np.argmin(value))
            nxt[j], choice[s][j] = value[k], i[k]
        best = nxt
    if not np.isfinite(best[n]):
        return None
    bounds = [n]
    for s in range(stages - 1, -1, -1):
        bounds.append(int(choice[s][bounds[-1]]))
    bounds.reverse()
    return Partition(bounds, [sum(times[s][a:b]) for s, (a, b) in enumerate(zip(bounds, bounds[1:]))])


def brute_force_staged(times: Sequence[Sequence[float]], stages: int,
                       mem: StageMemory | None = None,
                       capacities: Sequence[float] | None = None) -> Partition | None:
    """Every split, with stage-dependent times and capacities (tests only)."""
    n, best = len(times[0]), None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        if mem is not None and any(  # the DP's tolerance for prefix-sum rounding, too
                mem.of(s, a, b) > (capacities[s] if capacities is not None else mem.capacity)
                * (1 + 1e-12) for s, (a, b) in enumerate(zip(bounds, bounds[1:]))):
            continue
        p = Partition(bounds, [sum(times[s][a:b]) for s, (a, b) in enumerate(zip(bounds, bounds[1:]))])
        if best is None or p.bottleneck < best.bottleneck:
            best = p
    return best
