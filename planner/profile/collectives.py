"""Collectives among local processes: all-reduce, reduce-scatter and all-gather of growing buffers
among ``world`` processes. The all-reduce fits the alpha-beta ring model (latency per step,
bandwidth); the other two are kept as factors over the ring model with that fit, since backends
differ (gloo has no native reduce-scatter and runs it as an all-reduce plus a copy, about twice the
ring's time). On CPUs the same processes then measure the host cost of the runtime's DTensor path
(planner.profile.dtensor), which needs a process group, and what a call costs more when the
ranks compute between calls: a collective (``busy_sync_s``) and a send/receive pair
(``busy_exchange_s``).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import statistics
import time

import torch

from planner.profile.timing import Timer
from planner.profile.workers import gather

log = logging.getLogger(__name__)

COLLECTIVE_BYTES = (1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
COLLECTIVE_TIMEOUT_S = 180
FACTOR_MIN_BYTES = 1 << 20
"""Reduce-scatter/all-gather factors are the median over messages at least this large."""


def _collective_worker(rank: int, world: int, port: int, backend: str, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist  # lazy: imported in the spawned worker process

    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = "cuda" if backend == "nccl" else "cpu"
    timer = Timer(device)
    if device == "cuda":
        torch.cuda.set_device(rank)
    results = {"all_reduce": [], "reduce_scatter": [], "all_gather": [], "p2p": []}
    # (output, input) either way; the *_single names replace the *_tensor ones in newer torch
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    for nbytes in COLLECTIVE_BYTES:
        full = torch.ones(nbytes // 4, device=device)
        shard = torch.ones(nbytes // 4 // world, device=device)
        ops = {"all_reduce": lambda: dist.all_reduce(full),
               "reduce_scatter": lambda: scatter(shard, full),
               "all_gather": lambda: gather(full, shard)}
        reps = 3 if nbytes >= 1 << 22 else 10  # the same count on every rank: collectives pair up
        for name, op in ops.items():
            op()  # warm-up
            dist.barrier()
            samples = []
            for _ in range(reps):
                t0 = time.perf_counter()
                op()
                timer.sync()
                samples.append(time.perf_counter() - t0)
            results[name].append([nbytes, statistics.median(samples)])
        results["p2p"].append([nbytes, _exchange_s(dist, timer, nbytes, rank, world, reps)])
    if device == "cpu":
        from planner.profile.dtensor import dtensor_overheads  # lazy: loads torch.distributed.tensor, which only this worker needs

        results["sync"] = busy_sync_s(dist)
        results["p2p_sync"] = busy_exchange_s(dist, rank, world)
        results["dtensor"] = dtensor_overheads(world)
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


P2P_REPS = 20
"""Exchanges timed per message size (at least; more than the collectives' few: small messages
are the noisiest and the fit's intercept rests on them)."""


def _exchange_s(dist, timer: Timer, nbytes: int, rank: int, world: int, reps: int) -> float:
    """Median seconds of every rank sending ``nbytes`` to the next and receiving as many from the
    previous at once (batched isend/irecv, as a pipeline's or a context-parallel ring's sends)."""
    out = torch.ones(nbytes // 4, device=timer.device)
    into = torch.empty(nbytes // 4, device=timer.device)

    def exchange():
        _ring_exchange(dist, out, into, rank, world)
        timer.sync()

    exchange()  # warm-up
    dist.barrier()
    samples = []
    for _ in range(max(reps, P2P_REPS)):
        t0 = time.perf_counter()
        exchange()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


SYNC_ROUNDS = 5
SYNC_ITERS = 40
SYNC_BYTES = 1024


def busy_sync_s(dist) -> float:
    """What one small all-reduce (``SYNC_BYTES``) takes between ranks that compute between calls
    (on a CPU every core runs a rank's compute thread, so the backend's threads wait for a core,
    and the ranks' skew shows at every call). ``collectives`` keeps what the alpha-beta fit does
    not explain of it as ``LinkSpec.sync_s``."""
    small = torch.ones(SYNC_BYTES // 4)
    return busy_call_s(dist, lambda: dist.all_reduce(small))


def busy_exchange_s(dist, rank: int, world: int) -> float:
    """The same for a send/receive pair of ``SYNC_BYTES``: every rank sending to the next and
    receiving from the previous at once (batched isend/irecv, as a pipeline's, a
    context-parallel ring's and the runtime's all-to-all's sends run). Between busy ranks it
    costs more than the all-reduce above (on this project's 2-core VM 1.4-3.2 ms against about
    1.5 ms, 2026-12-06); ``collectives`` keeps what the point-to-point fit does not explain of
    it as ``LinkSpec.p2p_sync_s``."""
    out, into = torch.ones(SYNC_BYTES // 4), torch.empty(SYNC_BYTES // 4)
    return busy_call_s(dist, lambda: _ring_exchange(dist, out, into, rank, world))


def _ring_exchange(dist, out, into, rank: int, world: int) -> None:
    """Send ``out`` to the next rank and receive ``into`` from the previous one at once (batched
    isend/irecv), and wait for both."""
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % world),
           dist.P2POp(dist.irecv, into, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def busy_call_s(dist, call) -> float:
    """Seconds ``call`` (the same on every rank) adds to a loop of a few ms of GEMMs: each round
    times the loop alone and with the call after each pass; the medians over rounds give the
    difference."""
    a, b = torch.randn(256, 512), torch.randn(512, 512)

    def loop(compute: bool, with_call: bool) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(SYNC_ITERS):
            if compute:
                for _ in range(6):
                    torch.mm(a, b)
            if with_call:
                call()
        return (time.perf_counter() - t0) / SYNC_ITERS

    alone, busy = [], []
    for _ in range(SYNC_ROUNDS):
        alone.append(loop(True, False))
        busy.append(loop(True, True))
    return max(0.0, statistics.median(busy) - statistics.median(alone))


def collectives(world: int, backend: str) -> dict:
    """Measure the collectives; fit all-reduce time = 2 (n-1) alpha + 2 (n-1)/n B / beta."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [results] = gather(_collective_worker, world, (world, port, backend), reports=1,
                       what=f"the collective measurement among {world} {backend} processes",
                       timeout_s=COLLECTIVE_TIMEOUT_S)
    points = results["all_reduce"]
    steps = 2 * (world - 1)
    bandwidth, latency = _fit(points, 2 * (world - 1) / world, steps, "all-reduce")
    for b, t in points:
        log.info("  all-reduce %8d B on %d ranks: %.3g ms", b, world, 1e3 * t)
    link = {"bandwidth_GBps": bandwidth / 1e9, "latency_us": latency * 1e6, "processes": world,
            "backend": backend, "points": points}
    for name in ("reduce_scatter", "all_gather"):
        ring = [(world - 1) * latency + (world - 1) / world * b / bandwidth
                for b, _ in results[name]]
        ratios = [t / r for (b, t), r in zip(results[name], ring) if b >= FACTOR_MIN_BYTES and r > 0]
        link[f"{name}_factor"] = statistics.median(ratios) if ratios else 1.0
        link[f"{name}_points"] = results[name]
        log.info("  %s: %.2fx the ring model", name.replace("_", "-"), link[f"{name}_factor"])
    p2p = results["p2p"]
    p2p_bandwidth, p2p_latency = _fit(p2p, 1.0, 1, "point-to-point")
    link.update(p2p_bandwidth_GBps=p2p_bandwidth / 1e9, p2p_latency_us=p2p_latency * 1e6,
                p2p_points=p2p)
    log.info("  point-to-point (each rank sending and receiving at once): %.3g GB/s, %.0f us "
             "latency", p2p_bandwidth / 1e9, p2p_latency * 1e6)
    if "sync" in results:
        model = steps * latency + 2 * (world - 1) / world * SYNC_BYTES / bandwidth
        link["sync_us"] = max(0.0, results["sync"] - model) * 1e6
        log.info("  a %d-byte all-reduce between ranks busy computing: %.0f us, %.0f us more "
                 "than the fit", SYNC_BYTES, results["sync"] * 1e6, link["sync_us"])
    if "p2p_sync" in results:
        model = p2p_latency + SYNC_BYTES / p2p_bandwidth
        link["p2p_sync_us"] = max(0.0, results["p2p_sync"] - model) * 1e6
        log.info("  a %d-byte exchange between ranks busy computing: %.0f us, %.0f us more than "
                 "the fit", SYNC_BYTES, results["p2p_sync"] * 1e6, link["p2p_sync_us"])
    if "dtensor" in results:
        d = results["dtensor"]
        log.info("  DTensor host cost: %.0f us forward and %.0f us backward per parallel Linear, "
                 "%.0f us per parameter in AdamW", d["linear_fwd_us"], d["linear_bwd_us"],
                 d["param_step_us"])
        link["dtensor"] = d
    return link


def _fit(points, wire_per_byte: float, steps: int, what: str) -> tuple[float, float]:
    """(bytes/s, seconds per step) of ``points`` ([bytes, seconds]) made monotone, then fitted by
    least squares against the bytes each rank puts on the wire (``wire_per_byte`` per byte)."""
    fit = monotone(points, what)
    slope, intercept = _least_squares([wire_per_byte * b for b, _ in fit], [t for _, t in fit])
    return fitted_link(fit, slope, intercept, steps, what=what)


def monotone(points, what: str) -> list:
    """``points`` ([bytes, seconds]) by size, each time at most any larger message's: fewer bytes
    cannot take longer to move, so a message measured slower than a larger one was held up by
    something else (another load on the machine), and its time is taken as the larger one's
    (with a warning) before the fit, where one such point would make the latency (least
    squares' intercept) many times too large. The measured points are kept as they were."""
    out = sorted([b, t] for b, t in points)
    lowered = []
    for i in range(len(out) - 2, -1, -1):
        if out[i][1] > out[i + 1][1]:
            lowered.append(f"{out[i][0]} B ({1e3 * out[i][1]:.3g} ms)")
            out[i][1] = out[i + 1][1]
    if lowered:
        log.warning("%s: %s took longer than a larger message (noise: another load on this "
                    "machine?); fitted at the larger one's time; profile again on a quiet "
                    "machine for a better figure", what, ", ".join(reversed(lowered)))
    return out


def fitted_link(points, slope: float, intercept: float, steps: int,
                what: str = "all-reduce") -> tuple[float, float]:
    """(bytes/s, seconds per ring step) of the all-reduce fit (``steps`` = 2 (n - 1); of a
    point-to-point fit with ``steps`` = 1, its points' bytes being what each message carries);
    where noise left the line no intercept, the smallest message's time stands for the latency
    (it bounds it: a small message is mostly latency), and where it left no slope, the largest
    message's wire bytes over its whole time for the bandwidth (a lower bound), each with a
    warning, instead of 0 us or an infinite rate."""
    latency = intercept / steps
    if latency <= 0:
        small = min(points)
        latency = small[1] / steps
        log.warning("%s latency: the timings gave the fit no intercept (noisy: another load on "
                    "this machine?); taken from the smallest message instead, %.0f us per "
                    "step; profile again on a quiet machine for a better figure", what,
                    latency * 1e6)
    if slope > 0:
        return 1 / slope, latency
    big = max(points)
    wire = (2 * (steps // 2) / (steps // 2 + 1)) if steps > 1 else 1.0  # 2 (n - 1) / n x size
    bandwidth = wire * big[0] / big[1]
    log.warning("%s bandwidth: the timings gave the fit no slope (noisy); taken from the "
                "largest message instead, %.3g GB/s; profile again on a quiet machine", what,
                bandwidth / 1e9)
    return bandwidth, latency


def _least_squares(xs, ys) -> tuple[float, float]:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx
