"""One process of `plan run`: started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), it builds its share of the plan, runs the steps, and rank 0 writes the results.

    python -m planner.runtime.worker PLAN.json --result OUT.json [--steps N --warmup W ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

from planner.errors import InternalError, PlannerError, SpecError
from planner.files import atomic_write
from planner.planfile.document import read_plan
from planner.runtime import experts as moe
from planner.runtime import inner_weights
from planner.runtime import measure
from planner.runtime.host_memory import keep_freed_memory
from planner.runtime.build import Built, build
from planner.runtime.launch import CRASH_MARK, ERROR_MARK
from planner.runtime.options import RunOptions
from planner.runtime.tied import sync_grads

log = logging.getLogger("planner.runtime")
EXIT_BAD_INPUT = 2


def pick_device(choice: str) -> torch.device:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise SpecError("device: cuda asked for but no GPU is visible; use --device cpu")
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def execute(plan, opts: RunOptions, device: torch.device) -> dict:
    """Run the plan in this (initialized) process group; every rank returns the same summary."""
    reuses_memory = device.type != "cpu" or keep_freed_memory()  # before the model is built
    built = build(plan, opts, device)
    if not reuses_memory:
        built.notes.append("freed CPU memory goes back to the OS here (no glibc mallopt): large "
                           "tensors fault their pages in again every step, which the plan does "
                           "not price")
    mem = measure.Memory(device)
    timer = measure.StepTimer(device)
    total = opts.warmup + opts.steps
    profiled = device.type == "cpu" and opts.steps >= 2
    if device.type == "cpu" and not profiled:  # (said where the footnote names the method)
        mem.method = ("not measured: a CPU run profiles its last timed step for it, so give "
                      "--steps 2 or more")
    step_losses = []
    timed = end = None  # (wall, own CPU, the machine's CPU) when the timed steps start and end
    for step in range(total):
        if step == opts.warmup:
            mem.reset()
            for record in (built.experts, built.routing):
                if record is not None:
                    record.routing.clear()  # routing of the timed steps only
        dist.barrier()
        if step == opts.warmup and device.type == "cpu":  # (a GPU's step is the device's, not
            timed = _mark()                                 # the host CPUs' others share)
        if profiled and step == total - 1:  # (the profiled step is not timed)
            end = _mark()
        timer.start()
        if profiled and step == total - 1:
            step_losses.append(mem.profile(lambda: _step(built)))
        else:
            step_losses.append(_step(built))
        timer.stop()
    measured = timer.times[opts.warmup:total - 1 if profiled else total]
    end = end or _mark()
    record = {
        "rank": dist.get_rank(), **built.coords,
        "stages": [st.stage_index for st in built.stages],
        "step_times_s": timer.times, "median_step_time_s": measure.median(measured),
        "profiled_step": total - 1 if profiled else None,
        "peak_memory_bytes": mem.peak(), "rss_peak_bytes": mem.rss_peak(),
        "rss_baseline_bytes": mem.baseline, "memory_method": mem.method,
        "state_bytes": measure.state_bytes(built.modules, built.optimizer),
        "state_grads": measure.grads_held(built.modules),
        "expert_params": sum(p.numel() for p in built.experts.params) if built.experts else 0,
        "routing": moe.routing_summary(built.experts or built.routing),
        "losses": step_losses, "notes": built.notes + ([mem.failure] if mem.failure else []),
        **_load(timed, end),
    }
    if opts.dump_dir:
        _dump(built, opts.dump_dir)
    records: list = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    notes = list(dict.fromkeys(n for r in records for n in r["notes"]))
    return {"measured": measure.summarize(records, plan, warmup=opts.warmup),
            "loss_per_step": _global_losses(records), "ranks": records,
            "data_parallel": built.dp_wrap, "notes": notes,
            "device": str(device.type), "backend": dist.get_backend()}


def _mark() -> tuple:
    """(wall seconds, this process's CPU seconds, the machine's (CPU seconds, CPUs) or None)."""
    return time.perf_counter(), measure.cpu_seconds(), measure.machine_cpu()


def _load(timed: tuple | None, end: tuple) -> dict:
    """What the timed steps took of this process's CPU and of the machine's (measure.other_load
    reads them: other processes slowing the run)."""
    if timed is None:
        return {}
    out = {"timed_wall_s": end[0] - timed[0], "cpu_s": end[1] - timed[1]}
    if timed[2] is not None and end[2] is not None:
        out.update(machine_cpu_s=end[2][0] - timed[2][0], machine_cpus=end[2][1])
    return out


def _step(built: Built) -> list[float] | None:
    """One optimizer step; the micro-batch losses when this rank holds the last stage."""
    losses: list = []
    built.schedule.step(*built.inputs, target=built.targets, losses=losses, return_outputs=False)
    scale = built.microbatches  # (each loss was divided by their number: mdl.micro_batch_loss)
    sync_grads(built.ties)
    inner_weights.sync_grads(built.inner)
    moe.sync_grads(built.experts)
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)
    return [float(x.detach()) * scale for x in losses] if losses else None


def _global_losses(records: list[dict]) -> list[float | None]:
    """Mean over micro-batches, data-parallel replicas and context-parallel shards (each holds
    as many tokens; one tensor-parallel shard each)."""
    last = [r for r in records if r["losses"][0] is not None and r["tp"] == 0] if records else []
    if not last:
        return []
    steps = len(last[0]["losses"])
    return [sum(sum(r["losses"][i]) / len(r["losses"][i]) for r in last) / len(last)
            for i in range(steps)]


def _dump(built: Built, folder: str) -> None:
    """Full parameters of each stage, written by the stage's (dp 0, cp 0, tp 0) rank. Expert
    parameters are gathered from the expert-parallel group first, per-head ones from the
    tensor-parallel group (every rank takes part)."""
    os.makedirs(folder, exist_ok=True)
    for st, module in zip(built.stages, built.modules):
        full = {}
        for name, p in module.named_parameters(remove_duplicate=False):  # tied names too
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            key = name.removeprefix("model.")
            if key in built.expert_names:
                t = _gather_experts(t.detach(), built.experts)
            elif key in built.inner.sharded:
                t = inner_weights.gather_heads(t.detach(), built.inner)
            full[key] = t.detach().cpu().clone()
        if all(built.coords[k] == 0 for k in ("dp", "cp", "tp")):
            torch.save(full, os.path.join(folder, f"stage{st.stage_index}.pt"))


def _gather_experts(t: torch.Tensor, groups) -> torch.Tensor:
    """The whole [E, ...] tensor from the ep slices (in ep_index order)."""
    parts = [torch.empty_like(t) for _ in range(groups.ep)]
    dist.all_gather(parts, t.contiguous(), group=groups.ep_group)
    return torch.cat(parts, dim=0)


def parser(prog: str) -> argparse.ArgumentParser:
    """The options every torchrun worker of `plan run` takes."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--result", required=True, help="rank 0 writes the results JSON here")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="auto")
    p.add_argument("--model")
    p.add_argument("--dump")
    p.add_argument("--threads", type=int)
    return p


def guarded(a, body) -> int:
    """Join the process group, run ``body(opts, device)`` -> a JSON-able result, and leave: bad
    input is one line and exit 2, a crash its traceback and exit 1; rank 0 writes the result."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        opts = RunOptions(steps=a.steps, warmup=a.warmup, seed=a.seed, lr=a.lr, device=a.device,
                          model=a.model, dump_dir=a.dump, threads=a.threads)
        device = pick_device(opts.device)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if device.type == "cpu":
            torch.set_num_threads(opts.threads or measure.threads_per_process(local_world))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        result = body(opts, device)
    except PlannerError as exc:
        if isinstance(exc, InternalError):  # a broken invariant: a crash, not bad input
            return _crashed(exc)
        print(f"{ERROR_MARK}{exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        return _crashed(exc)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        atomic_write(a.result, json.dumps(result, indent=1) + "\n")
    return 0


def _crashed(exc: Exception) -> int:
    """Print the traceback and the one line the launcher reports (CRASH_MARK); exit 1."""
    traceback.print_exc()
    last = (str(exc).strip().splitlines() or [""])[-1]
    print(f"{CRASH_MARK}{type(exc).__name__}: {last}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    p = parser("planner.runtime.worker")
    p.add_argument("plan")
    a = p.parse_args(argv)
    return guarded(a, lambda opts, device: execute(read_plan(a.plan), opts, device))


if __name__ == "__main__":  # pragma: no cover
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The run is complete (rank 0 wrote the result, the process group is destroyed). Skip the
    # interpreter's teardown: now and then a torch C++ thread is still joinable when static
    # objects are destroyed and std::terminate aborts the process ("terminate called without an
    # active exception"), which torchrun would report as a failed run.
    os._exit(code)
