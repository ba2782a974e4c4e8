"""Measure this machine: GEMM speed by size, memory bandwidth, per-op overhead, attention speed,
and collective bandwidth/latency among local processes (planner.profile.collectives). Writes a
calibration the cost model uses instead of data-sheet numbers (planner.inputs.calibration).

On a CPU a "device" is one process with ``threads`` threads (default 1, so that two processes on
two cores are two devices); on CUDA it is one GPU.
"""

from __future__ import annotations

import logging
import math
import platform
import statistics
import time

import torch

from costmodels.compute import expected_max_normal
from costmodels.hardware import ATTENTION_KINDS
from planner import logs
from planner.errors import SpecError
from planner.profile import DEVICES
from planner.profile.collectives import collectives
from planner.profile.timing import Timer
from planner.profile.workers import gather
from planner.runtime.host_memory import keep_freed_memory

log = logging.getLogger(__name__)

GEMM_SIZES = (64, 128, 256, 512, 768, 1024, 1536, 2048)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


COLD_BYTES = 128 << 20
"""GEMM operands are cycled through this many bytes, more than the last-level cache of current
CPUs and GPUs, so that each call reads them from memory."""


def gemm_table(timer: Timer, dtype: str) -> list[list[float]]:
    """[[FLOPs per call, FLOP/s], ...] for square GEMMs of growing size, as training runs them:
    operands read from memory (in a training step they were written long before: activations
    saved in forward, weights last touched a step ago) and a fresh output per call."""
    out = []
    for n in GEMM_SIZES:
        rate = cold_mm_rate(n, n, n, timer, dtype)
        out.append([2.0 * n ** 3, rate])
        log.info("  gemm %s %5d^3: %.3g GFLOP/s", dtype, n, rate / 1e9)
    return out


GRID_SIZES = {"cpu": (8, 32, 128, 512, 2048), "cuda": (32, 128, 512, 2048, 8192)}
"""Each of m, k and n of the GEMM shapes measured (every combination: 125 shapes), four times
apart: from a few routed tokens per expert to an output head's width. A GEMM's rate depends on its
shape as well as its FLOPs: one with a short m or n reuses its large operand little and streams
it from memory (on one CPU core [32 x 2048] @ [2048 x 2048] runs at about 60 GFLOP/s, the square
GEMM of equal FLOPs at about 150), one with a short k does not."""
GRID_MIN_S = 0.1
"""Seconds each grid shape is repeated for (the square table's 0.4 s is for its finer sizes)."""


def gemm_grid(timer: Timer, dtype: str) -> list:
    """FLOP/s of (m x k) @ (k x n) GEMMs for every m, k, n in GRID_SIZES of this device, nested
    [m][k][n], operands read from memory as in gemm_table."""
    sizes = GRID_SIZES[timer.device]
    grid = [[[cold_mm_rate(m, k, n, timer, dtype, min_s=GRID_MIN_S) for n in sizes]
             for k in sizes] for m in sizes]
    log.info("  gemm %s shapes (m, k, n in %s): %.3g to %.3g GFLOP/s", dtype,
             "/".join(map(str, sizes)), min(r for a in grid for b in a for r in b) / 1e9,
             max(r for a in grid for b in a for r in b) / 1e9)
    return grid


def cold_mm_rate(m: int, k: int, n: int, timer: Timer, dtype: str,
                  min_s: float = 0.4) -> float:
    """FLOP/s of an (m x k) @ (k x n) GEMM with operands cycled through COLD_BYTES."""
    device = timer.device
    size = DTYPES[dtype].itemsize * (m * k + k * n)
    ring = max(2, min(4096, COLD_BYTES // size))
    a = [torch.randn(m, k, device=device, dtype=DTYPES[dtype]) for _ in range(ring)]
    b = [torch.randn(k, n, device=device, dtype=DTYPES[dtype]) for _ in range(ring)]
    turn = [0]

    def call():
        i = turn[0] = (turn[0] + 1) % ring
        torch.mm(a[i], b[i])

    return 2.0 * m * k * n / timer.median_s(call, min_s=min_s)


MEMORY_SIZES = (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
"""Elements per tensor for the element-wise table (64 KB to 64 MB of fp32)."""


def memory_table(timer: Timer) -> list[list[float]]:
    """[[bytes one kernel moves, bytes/s], ...]: the element-wise kernels a transformer layer runs,
    as training runs them (out of place, fresh outputs), by size. Each rate is the geometric mean
    over add, mul, GELU, exp, softmax, layer norm and dropout: on a CPU the transcendental ops,
    the caches and the allocation of large outputs set the pace, not DRAM alone."""
    f, device = torch.nn.functional, timer.device
    out = []
    for n in MEMORY_SIZES if device == "cpu" else tuple(16 * s for s in MEMORY_SIZES):
        x = torch.randn(n, device=device)
        y = torch.randn(n, device=device)
        rows = x.view(-1, 1024)
        ops = [(lambda: x + y, 12), (lambda: x * y, 12), (lambda: f.gelu(x), 8),
               (lambda: torch.exp(x), 8), (lambda: torch.softmax(rows, -1), 8),
               (lambda: f.layer_norm(rows, (1024,)), 8), (lambda: f.dropout(x, 0.1, True), 9)]
        moved = [per_element * n for _, per_element in ops]
        rates = [b / timer.median_s(op, min_s=0.05) for (op, _), b in zip(ops, moved)]
        mean_bytes = math.exp(sum(math.log(b) for b in moved) / len(moved))
        out.append([mean_bytes, math.exp(sum(math.log(r) for r in rates) / len(rates))])
        log.info("  element-wise %9d elements: %.3g GB/s", n, out[-1][1] / 1e9)
    return out


def optimizer_rate(timer: Timer) -> float:
    """Seconds per parameter of one torch.optim.AdamW step (fp32 states) on 16M parameters: 256 MB
    of weights, gradients and moments, more than any cache holds, as in training."""
    params = [torch.nn.Parameter(torch.randn(1 << 22, device=timer.device)) for _ in range(4)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4)
    return timer.median_s(opt.step) / (16 << 20)


def op_overhead(timer: Timer) -> float:
    """Seconds of a tiny element-wise op: dispatch and launch cost."""
    x = torch.ones(8, device=timer.device)
    reps = 200

    def many():
        for _ in range(reps):
            torch.add(x, 1.0)

    return timer.median_s(many) / reps


GROUPED = (8, 4096, 256, 1024)
"""Experts, token copies, hidden and expert width of the grouped-GEMM probe (routed tokens
split evenly over the experts)."""


def grouped_gemm_ratio(timer: Timer, dtype: str) -> float:
    """The speed of a grouped GEMM of routed tokens (``torch._grouped_mm``, one matrix per
    expert, as Mixture-of-Experts layers run their experts) over a plain GEMM of the same FLOPs
    and total shape; 1.0 where torch has no grouped GEMM for this device."""
    if not hasattr(torch, "_grouped_mm"):
        return 1.0
    experts, rows, k, n = GROUPED
    dt = DTYPES[dtype]
    x = torch.randn(rows, k, device=timer.device, dtype=dt)
    w = torch.randn(experts, k, n, device=timer.device, dtype=dt)
    offs = torch.arange(1, experts + 1, device=timer.device, dtype=torch.int32) * (rows // experts)
    try:
        grouped = timer.median_s(lambda: torch._grouped_mm(x, w, offs=offs))
    except (RuntimeError, NotImplementedError):  # no kernel for this device or dtype
        return 1.0
    plain = timer.median_s(lambda: torch.mm(x, w[0]))
    return min(1.0, plain / grouped)


def attention_rate(timer: Timer, dtype: str) -> float:
    """FLOP/s of scaled_dot_product_attention (forward), heads 8 x seq 512 x head dim 64."""
    q = torch.randn(1, 8, 512, 64, device=timer.device, dtype=DTYPES[dtype])
    seconds = timer.median_s(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    return 4.0 * 8 * 512 * 512 * 64 / seconds


ATTENTION_SIZES = {"cpu": ((16, 32), (16, 64), (16, 128), (16, 256), (8, 512), (4, 1024)),
                   "cuda": ((32, 512), (32, 1024), (32, 2048), (16, 4096), (8, 8192))}
"""(batch x heads, sequence) of the attention calls measured by size: from a ring's chunk pairs
of a small model to one long sequence (square FLOPs 4 M to 1 G on CPUs, 17 G to 275 G on GPUs)."""
ATTENTION_HEAD_DIM = {"cpu": 64, "cuda": 128}


def attention_table(timer: Timer, dtype: str) -> dict[str, list[list[float]]]:
    """scaled_dot_product_attention by call size, as training runs it (inputs that need
    gradients): {"causal_fwd", "causal_bwd", "full_fwd", "full_bwd": [[square FLOPs per call,
    square FLOPs per second], ...]}, square FLOPs = 4 x batch x heads x s^2 x head dim whatever
    the causal mask lets the kernel skip; backward = forward + backward less the forward, never
    taken below the forward (timing noise)."""
    d = ATTENTION_HEAD_DIM[timer.device]
    out: dict[str, list[list[float]]] = {k: [] for k in ATTENTION_KINDS}
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for heads, s in ATTENTION_SIZES[timer.device]:
        square = 4.0 * heads * s * s * d
        q, k, v = (torch.randn(1, heads, s, d, device=timer.device, dtype=DTYPES[dtype],
                               requires_grad=True) for _ in range(3))
        grad = torch.ones(1, heads, s, d, device=timer.device, dtype=DTYPES[dtype])
        for mask in ("causal", "full"):
            causal = mask == "causal"
            fwd = timer.median_s(lambda: sdpa(q, k, v, is_causal=causal), min_s=0.2)
            both = timer.median_s(lambda: torch.autograd.grad(
                sdpa(q, k, v, is_causal=causal), (q, k, v), grad), min_s=0.2)
            out[f"{mask}_fwd"].append([square, square / fwd])
            out[f"{mask}_bwd"].append([square, square / max(both - fwd, fwd)])
        log.info("  attention %s %d x %d: causal %.3g GFLOP/s forward (square FLOPs)", dtype,
                 heads, s, out["causal_fwd"][-1][1] / 1e9)
    return out


def profile(device: str = "cpu", *, threads: int = 1, processes: int = 2,
            dtypes: tuple[str, ...] | None = None) -> dict:
    """Measure and return a calibration mapping (planner.inputs.calibration reads it).

    On a CPU with ``processes`` >= 2 the device speeds are measured in that many processes at
    once, since in training every device of the node works at the same time and the processes
    share caches and memory bandwidth; on GPUs one process measures."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device: cuda requested but torch sees no GPU; use --device cpu")
    if device not in DEVICES:
        raise SpecError(f"device: expected cpu or cuda, got {device!r}")
    dtypes = dtypes or (("fp32",) if device == "cpu" else ("bf16", "fp16", "fp32"))
    busy = processes if device == "cpu" and processes > 1 else 1
    log.info("profiling %s (%d thread(s), %d process(es) at once): GEMMs, element-wise "
             "throughput, op overhead, attention", device, threads, busy)
    speeds = (device_speeds(Timer(device), threads, dtypes) if busy == 1 else
              _concurrently(busy, device, threads, dtypes))
    backend = "nccl" if device == "cuda" else "gloo"
    world = min(processes, torch.cuda.device_count()) if device == "cuda" else processes
    link = None
    if world >= 2:
        log.info("profiling all-reduce among %d %s processes", world, backend)
        link = collectives(world, backend)
    calibration = _calibration(device, threads, speeds, link)
    spreads = speeds["spreads"]
    if spreads:
        calibration["device"]["repeat_spread"] = {"median": statistics.median(spreads),
                                                  "max": max(spreads)}
    calibration["processes"] = busy  # device speeds measured with this many at work
    if link and "dtensor" in link:  # host cost of the runtime's engine, a device property
        calibration["device"]["dtensor"] = link.pop("dtensor")
    return calibration


def device_speeds(timer: Timer, threads: int, dtypes) -> dict:
    """GEMM tables (square, and by shape) by dtype, element-wise table, per-op overhead,
    attention FLOP/s and attention by call size per dtype, AdamW seconds per parameter, and
    (concurrent CPU processes) the times of a fixed segment of work, each started together
    (``segment_times``)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    if timer.device == "cpu":
        keep_freed_memory()  # as the runtime does: large tensors reuse the heap's pages
    try:
        return {"gemm": {dt: gemm_table(timer, dt) for dt in dtypes},
                "grid": {dt: gemm_grid(timer, dt) for dt in dtypes},
                "memory": memory_table(timer), "overhead": op_overhead(timer),
                "attention": {dt: attention_rate(timer, dt) for dt in dtypes},
                "attention_table": {dt: attention_table(timer, dt) for dt in dtypes},
                "grouped": {dt: grouped_gemm_ratio(timer, dt) for dt in dtypes},
                "adamw": optimizer_rate(timer),
                "segments": segment_times(timer) if timer.barrier is not None else [],
                "spreads": list(timer.spreads)}
    finally:
        torch.set_num_threads(previous)


SEGMENTS = 40
"""Repetitions of the fixed segment timed for the jitter (about 20 ms each on one CPU core)."""


def segment_times(timer: Timer) -> list[float]:
    """Seconds of a fixed stretch of training-like work (GEMMs and element-wise ops of a small
    layer), ``SEGMENTS`` times, each started at the shared barrier."""
    device = timer.device
    x = torch.randn(1024, 256, device=device)
    w1 = torch.randn(256, 688, device=device)
    w2 = torch.randn(688, 256, device=device)

    def segment():
        h = x
        for _ in range(3):
            h = torch.nn.functional.silu(h @ w1) @ w2 + h
        timer.sync()

    segment()
    out = []
    for _ in range(SEGMENTS):
        timer.align()
        t0 = time.perf_counter()
        segment()
        out.append(time.perf_counter() - t0)
    return out


def jitter(segments: list[list[float]]) -> float:
    """Relative standard deviation of a process's time for the same work, from each process's
    times of the same segments run together: the mean excess of the slowest over the mean,
    divided by E[max] of that many standard normals (costmodels.compute.straggler_excess inverts
    it for any number of processes)."""
    n = len(segments)
    if n < 2 or not segments[0]:
        return 0.0
    excess = statistics.fmean(max(row) / statistics.fmean(row) - 1 for row in zip(*segments))
    return excess / expected_max_normal(n)


SPEEDS_TIMEOUT_S = 3600
"""How long concurrent device measurers may take in all (a CPU's shape grid takes minutes)."""
BARRIER_TIMEOUT_S = 600
"""How long one measurer waits for the others at a segment's start."""


def _speeds_worker(rank: int, device: str, threads: int, dtypes, barrier, level: int,
                   queue) -> None:
    """One of the concurrent measurers; the first reports its progress on stderr at the
    parent's log ``level`` (a spawned process starts with no logging set up)."""
    if rank == 0:
        logs.to_stderr(level)
    queue.put((rank, device_speeds(Timer(device, barrier), threads, dtypes)))


def _concurrently(n: int, device: str, threads: int, dtypes) -> dict:
    """device_speeds measured in ``n`` processes at once; rates averaged over the processes,
    the jitter from their segment times."""
    import torch.multiprocessing as mp  # lazy: only for the workers' barrier

    barrier = mp.get_context("spawn").Barrier(n, timeout=BARRIER_TIMEOUT_S)
    log.info("  (the first of the %d processes reports)", n)
    level = logging.getLogger("planner").getEffectiveLevel()
    results = [r for _, r in gather(_speeds_worker, n, (device, threads, dtypes, barrier, level),
                                    reports=n, what=f"the device measurement in {n} processes",
                                    timeout_s=SPEEDS_TIMEOUT_S)]
    return {"gemm": {dt: _mean_table([r["gemm"][dt] for r in results]) for dt in dtypes},
            "grid": {dt: _mean_grid([r["grid"][dt] for r in results]) for dt in dtypes},
            "memory": _mean_table([r["memory"] for r in results]),
            "overhead": statistics.fmean(r["overhead"] for r in results),
            "attention": {dt: statistics.fmean(r["attention"][dt] for r in results)
                          for dt in dtypes},
            "attention_table": {dt: {kind: _mean_table([r["attention_table"][dt][kind]
                                                        for r in results])
                                     for kind in results[0]["attention_table"][dt]}
                                for dt in dtypes},
            "grouped": {dt: statistics.fmean(r["grouped"][dt] for r in results)
                        for dt in dtypes},
            "adamw": statistics.fmean(r["adamw"] for r in results),
            "jitter": jitter([r["segments"] for r in results]),
            "spreads": [s for r in results for s in r["spreads"]]}


def _mean_table(tables: list[list[list[float]]]) -> list[list[float]]:
    return [[rows[0][0], statistics.fmean(r[1] for r in rows)] for rows in zip(*tables)]


def _mean_grid(grids: list) -> list:
    """The processes' gemm_grid, averaged shape by shape."""
    return [[[statistics.fmean(rates) for rates in zip(*ns)] for ns in zip(*ks)]
            for ks in zip(*grids)]


def _calibration(device, threads, speeds: dict, link) -> dict:
    tables, mem, attn = speeds["gemm"], speeds["memory"], speeds["attention"]
    peaks = {dt: max(r for _, r in table) for dt, table in tables.items()}
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu"
    return {
        "schema": "planner.calibration/v1",
        "device_kind": device,
        "device_name": name,
        "threads": threads,
        "torch": torch.__version__,
        "device": {
            "peak_TFLOPs": {dt: p / 1e12 for dt, p in peaks.items()},
            "gemm_table": tables,
            "gemm_grid": {"sizes": list(GRID_SIZES[device]), "tables": speeds["grid"]},
            "hbm_GBps": mem[-1][1] / 1e9,
            "memory_table": mem,
            "adamw_s_per_param": speeds["adamw"],
            "kernel_overhead_us": speeds["overhead"] * 1e6,
            "attention_efficiency": {dt: min(1.0, attn[dt] / peaks[dt]) for dt in attn},
            "attention_table": speeds["attention_table"],
            "grouped_gemm_efficiency": min(speeds["grouped"].values()),
            "jitter": speeds.get("jitter", 0.0),
        },
        "intra_node": link,
    }
