"""Step timing and peak memory of one process, and the measured-vs-predicted summary.

Memory on GPU is ``torch.cuda.max_memory_allocated`` over the measured steps (tensors only, as the
cost model counts). CPU has no allocator statistic, so the last measured step runs under
torch.profiler with ``profile_memory`` and the peak of its memory timeline (live tensor bytes,
tensors made before the step included once they are used) is the tensor peak; that step is left out
of the timing. That timeline is a private torch API that now and then fails on a rank (a version
check of its data-flow graph); there the peak is the tensors Python held before the step plus the
running sum of the profiler's allocation events: an upper bound (tensors the step does not use
count too, frees of tensors made before it are not reported), equal to the timeline's where both
were compared (docs/runtime.md). The process's resident-set high-water mark (``VmHWM``, reset before the measured
steps with Linux ``clear_refs``) is reported too: it adds the interpreter, torch's libraries and
allocator slack. ``state_bytes`` (parameters and optimizer states held by the rank at the end of the
run, gradients freed, summed from the tensors themselves) is the exactly comparable part.
"""

from __future__ import annotations

import os
import resource
import statistics
import time

import torch

from planner.machine import usable_cores


class Memory:
    """Peak-memory bookkeeping for one process."""

    def __init__(self, device: torch.device):
        self.device = device
        self.method = ("torch.cuda.max_memory_allocated over the measured steps"
                       if device.type == "cuda" else
                       "tensor bytes over the last step from torch.profiler's memory timeline")
        self.profiled_peak: int | None = None
        self.failure: str | None = None
        self.baseline = 0

    def reset(self) -> None:
        """Start the high-water marks here (before the measured steps)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
        self.baseline = _rss_bytes("VmRSS")

    def profile(self, fn):
        """Run ``fn`` under the profiler (CPU only) and keep the peak of live tensor bytes."""
        from torch.profiler import ProfilerActivity, profile  # lazy: only the profiled step needs it
        from torch.profiler._memory_profiler import MemoryProfileTimeline  # lazy: private torch API, only the profiled step

        before = live_tensor_bytes()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            result = fn()
        try:
            _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
            self.profiled_peak = int(max(sum(row) for row in sizes)) if sizes else None
        except Exception as exc:  # noqa: BLE001 - a private API, which fails now and then
            failed = type(exc).__name__
            try:
                self.profiled_peak = before + allocation_peak(prof)
            except Exception:  # noqa: BLE001 - the events are a private API too
                self.profiled_peak = None
            self.method = ("tensor bytes over the last step from torch.profiler's allocation "
                           f"events (its memory timeline failed: {failed})"
                           if self.profiled_peak is not None else
                           f"not measured on this rank: torch.profiler failed ({failed})")
            # (the same words on every rank that fails, so that the run says it once)
            self.failure = (f"torch.profiler's memory timeline failed on one or more ranks "
                            f"({failed}); their peak is the tensors held before the step plus "
                            "the running sum of the profiler's allocation events: an upper bound "
                            "(tensors the step does not use count too), equal to the timeline's "
                            "on the runs compared (docs/runtime.md)")
        return result

    def peak(self) -> int | None:
        """Peak tensor bytes (None on CPU when no step was profiled)."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return self.profiled_peak

    def rss_peak(self) -> int:
        """Resident-set high-water mark of the process since ``reset`` (VmHWM)."""
        hwm = _rss_bytes("VmHWM")
        return hwm or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def live_tensor_bytes() -> int:
    """Bytes of the CPU tensors Python holds now (parameters, gradients, optimizer states,
    buffers), each storage once."""
    import gc  # lazy: only the profiled step counts tensors
    import warnings  # lazy: as gc

    gc.collect()
    storages: dict[int, int] = {}
    with warnings.catch_warnings():  # (isinstance on every object wakes deprecated modules)
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if not isinstance(obj, torch.Tensor):
                continue
            try:
                if obj.device.type != "cpu":
                    continue
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            except (RuntimeError, NotImplementedError):  # wrappers (DTensor: its local tensor
                continue                                   # counts), sparse tensors
    return sum(storages.values())


def allocation_peak(prof) -> int:
    """The most CPU bytes a profiled stretch held beyond what it started with: the running sum
    of the profiler's allocation and free events (frees of tensors made before it are not
    reported, so a peak after such a free is over-counted by it)."""
    live = peak = 0
    for event in sorted((e for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]" and e.device_type().name == "CPU"),
                        key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def _rss_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def state_bytes(modules, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer states this rank holds (local shards)."""
    total = 0
    for m in modules:
        for p in m.parameters():
            total += _local_bytes(p)
            if p.grad is not None:
                total += _local_bytes(p.grad)
    for st in optimizer.state.values():
        total += sum(_local_bytes(v) for v in st.values() if isinstance(v, torch.Tensor))
    return total


STATE_KINDS = ("weights", "grads", "optimizer", "fp8_weights")
"""The plan's memory kinds that state_bytes measures (parameters, gradients, optimizer states)."""


def grads_held(modules) -> bool:
    """Whether this rank's parameters hold gradients now (after a step the optimizer has zeroed
    them to None: state_bytes then counts none)."""
    return any(p.grad is not None for m in modules for p in m.parameters())


def predicted_state_bytes(plan, grads: bool = True) -> float | None:
    """The fullest stage's predicted parameters, gradients (``grads``: where the measurement
    held them) and optimizer states (what state_bytes measures on its rank); None for a plan
    without stages (a recommendation plan)."""
    kinds = [k for k in STATE_KINDS if grads or k != "grads"]
    totals = [sum(st["predicted"]["memory_bytes"].get(k, 0.0) for k in kinds)
              for st in plan.stages or []]
    return max(totals) if totals else None


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


class StepTimer:
    """Wall time of each optimizer step on this rank (device work included)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: list[float] = []
        self._t0 = 0.0

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._t0)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def summarize(records: list[dict], plan, *, warmup: int) -> dict:
    """Per-rank records -> measured vs predicted (the step takes as long as its slowest rank)."""
    medians = [r["median_step_time_s"] for r in records if r["median_step_time_s"] is not None]
    peaks = [r["peak_memory_bytes"] for r in records if r["peak_memory_bytes"] is not None]
    step = max(medians) if medians else None
    pred_t = plan.predicted["step_time_s"]
    pred_m = plan.predicted["peak_memory_bytes"]
    # the states are measured after a step, the gradients freed: compared without theirs
    grads = any(r.get("state_grads", True) for r in records)
    return {
        "step_time_s": step,
        "peak_memory_bytes": max(peaks) if peaks else None,
        "peak_memory_ranks": len(peaks),
        "rss_peak_bytes": max(r["rss_peak_bytes"] for r in records) if records else None,
        "state_bytes": max(r["state_bytes"] for r in records) if records else None,
        "state_grads": grads,
        "predicted_state_bytes": predicted_state_bytes(plan, grads),
        "predicted_step_time_s": pred_t,
        "predicted_peak_memory_bytes": pred_m,
        # errors as the project states them everywhere: predicted / measured - 1 (negative: the
        # prediction is too fast, or too small)
        "step_time_error": pred_t / step - 1 if step else None,
        "peak_memory_error": pred_m / max(peaks) - 1 if peaks and max(peaks) else None,
        "warmup_steps": warmup,
        "still_warming": still_warming(records, warmup),
        "step_spread": step_spread(records, warmup),
        "other_load": other_load(records),
        "routing": routing(records, plan),
    }


WARMING_RATIO = 1.25
"""A run whose first timed step took this much longer than its last was still warming up."""


def _slowest_timed(records: list[dict], warmup: int) -> list[float]:
    """The timed steps (after the warm-up, before a profiled step) of the rank whose median is
    the step's; [] where no rank timed any."""
    timed = [r["step_times_s"][warmup:r["profiled_step"]] for r in records
             if r["median_step_time_s"] is not None]
    return max(timed, key=median) if timed else []


def still_warming(records: list[dict], warmup: int) -> list[float] | None:
    """[first, last] timed step of the slowest rank where the first took WARMING_RATIO times the
    last or more, three timed steps at least (the median then times a process still warming
    up: allocator, caches, thread pools); else None."""
    slowest = _slowest_timed(records, warmup)
    if len(slowest) >= 3 and slowest[0] >= WARMING_RATIO * slowest[-1]:
        return [slowest[0], slowest[-1]]
    return None


def cpu_seconds() -> float:
    """CPU time this process (all its threads) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_cpu() -> tuple[float, int] | None:
    """(CPU seconds every process has used on the CPUs this process may run on, a VM's stolen
    time included; how many CPUs those are), read from Linux's /proc/stat; None where there is
    none. (The CPUs the run's processes share, not the whole host: a container's neighbours on
    other cores are none of its business.)"""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy, cpus = 0, 0
    for line in lines:
        fields = line.split()
        if not (fields and fields[0][3:].isdigit() and fields[0].startswith("cpu")
                and len(fields) >= 9):
            continue
        if mine is not None and int(fields[0][3:]) not in mine:
            continue
        # user nice system idle iowait irq softirq steal: all but idle and iowait were busy
        busy += sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8))
        cpus += 1
    return (busy / os.sysconf("SC_CLK_TCK"), cpus) if cpus else None


def other_load(records: list[dict]) -> float | None:
    """The share of this machine's CPU time during the timed steps that went to other processes
    than the run's (rank 0's reading of the machine less every rank's own CPU time, over its
    timed wall time and the machine's CPUs); None where not measured."""
    first = records[0] if records else {}
    machine, wall = first.get("machine_cpu_s"), first.get("timed_wall_s")
    if machine is None or not wall or not first.get("machine_cpus"):
        return None
    own = sum(r.get("cpu_s") or 0.0 for r in records)
    return max(0.0, machine - own) / (wall * first["machine_cpus"])


def step_spread(records: list[dict], warmup: int) -> dict | None:
    """How much the slowest rank's timed steps vary (three at least): their fastest, slowest, and
    (slowest - fastest) / median, the noise an error against the prediction should be read
    beside (a busy machine's steps spread widely); None with fewer steps."""
    slowest = _slowest_timed(records, warmup)
    if len(slowest) < 3:
        return None
    mid = median(slowest)
    return {"steps": len(slowest), "min_s": min(slowest), "max_s": max(slowest),
            "range_over_median": (max(slowest) - min(slowest)) / mid if mid else 0.0}


def routing(records: list[dict], plan) -> dict | None:
    """The routing of the timed steps' MoE layer calls (planner.runtime.experts.routing_summary,
    averaged over the ranks) next to the imbalance the plan was priced with
    (training.engine.moe_imbalance); None for a model without routed experts."""
    seen = [r["routing"] for r in records if r.get("routing")]
    if not seen:
        return None
    engine = plan.training.get("engine") or {}
    calls = sum(x["calls"] for x in seen)  # ranks of stages with more MoE layers weigh more
    return {key: sum(x[key] * x["calls"] for x in seen) / calls
            for key in ("busiest_expert", "busiest_rank")} | {
        "calls_per_rank": max(x["calls"] for x in seen),
        "expert_parallel": int(plan.parallel.get("ep", 1)) > 1,
        "recomputed": plan.parallel.get("recompute", "none") != "none",
        "planned_moe_imbalance": float(engine.get("moe_imbalance", 1.0))}


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def threads_per_process(local_world: int) -> int:
    """CPU threads each process may use so that the processes share the cores evenly."""
    return max(1, usable_cores() // max(1, local_world))
