"""The legal configurations and the rules that prune them.

A configuration picks dp x tp x pp = GPUs (tp inside a node, dividing every head count and split
feature size), a micro-batch size dividing the per-replica batch, a schedule, recomputation, ZeRO
stage, sequence parallelism and a placement order. Each rule that rejects a point names a reason the
search reports ("412 candidates: 380 out of memory, 32 tp > gpus per node").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterator

from planner.errors import SpecError
from planner.options import Config, SearchOptions, TrainingSpec


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class CostKey:
    """The knobs per-block costs depend on (the rest only changes the split and the totals)."""

    tp: int
    sp: bool
    recompute: str
    micro_batch: int


def enumerate_space(*, num_gpus: int, gpus_per_node: int, num_blocks: int, tp_divisors: list[int],
                    training: TrainingSpec, options: SearchOptions,
                    rejected: Counter) -> Iterator[tuple[CostKey, list[Config]]]:
    """Configurations grouped by CostKey; rejected points are counted in ``rejected``."""
    fix = dict(options.fix)
    if fix.get("vpp", 1) > 1 and fix.get("schedule", "interleaved-1f1b") != "interleaved-1f1b":
        raise SpecError(f"fix.vpp: vpp={fix['vpp']} needs schedule=interleaved-1f1b, not "
                        f"{fix['schedule']}")
    gb = training.global_batch
    for tp in _choices(fix, "tp", divisors(num_gpus)):
        reason = _tp_reason(tp, gpus_per_node, tp_divisors, num_gpus)
        if reason:
            rejected[reason] += 1
            continue
        for pp in _choices(fix, "pp", divisors(num_gpus // tp)):
            if (num_gpus // tp) % pp:
                rejected["dp x tp x pp != gpus"] += 1
                continue
            if pp > num_blocks:
                rejected["pp > blocks"] += 1
                continue
            dp = num_gpus // (tp * pp)
            if "dp" in fix and fix["dp"] != dp:
                rejected["dp x tp x pp != gpus"] += 1
                continue
            if gb % dp:
                rejected["global batch not divisible by dp"] += 1
                continue
            yield from _inner(fix, tp, pp, dp, gb, training, options, rejected, num_blocks)


def _inner(fix, tp, pp, dp, gb, training, options, rejected, num_blocks):
    states = _zero_offload(fix, dp, options, rejected)
    schedules = _choices(fix, "schedule", list(options.schedules) if pp > 1 else ["1f1b"])
    for mb in _choices(fix, "micro_batch", divisors(gb // dp)):
        if (gb // dp) % mb:
            rejected["micro batch does not divide the per-replica batch"] += 1
            continue
        m = gb // (dp * mb)
        for sp in _choices(fix, "sequence_parallel", [False, True] if tp > 1 else [False]):
            if sp and tp == 1:
                rejected["sequence parallel needs tp > 1"] += 1
                continue
            for rc in _choices(fix, "recompute", list(options.recompute)):
                configs = [
                    Config(dp=dp, tp=tp, pp=pp, micro_batch=mb, num_microbatches=m, schedule=s,
                           recompute=rc, zero=z, sequence_parallel=sp, vpp=v, offload_optimizer=o)
                    for s in schedules
                    for v in _vpps(fix, s, pp, m, num_blocks, options, rejected)
                    for z, o in states
                ]
                if configs:
                    yield CostKey(tp=tp, sp=sp, recompute=rc, micro_batch=mb), configs


def _vpps(fix: dict, schedule: str, pp: int, m: int, num_blocks: int, options: SearchOptions,
          rejected: Counter) -> list[int]:
    """Chunks per rank: 1 unless interleaved, whose micro-batches must fill whole rounds of pp
    (Megatron-LM's requirement) and whose chunks need at least one block each."""
    if schedule != "interleaved-1f1b":
        return [1]
    out = []
    for v in _choices(fix, "vpp", list(options.vpp)):
        if v < 2 or pp < 2:
            rejected["interleaved needs pp > 1 and vpp > 1"] += 1
        elif m % pp:
            rejected["interleaved needs micro-batches divisible by pp"] += 1
        elif pp * v > num_blocks:
            rejected["pp x vpp > blocks"] += 1
        else:
            out.append(v)
    return out


def _zero_offload(fix: dict, dp: int, options: SearchOptions, rejected: Counter) -> list[tuple]:
    """(ZeRO stage, offload) pairs; offloading the optimizer needs its states sharded (ZeRO >= 1),
    as in DeepSpeed, and sharding needs data parallelism."""
    zeros = _choices(fix, "zero", list(options.zero) if dp > 1 else [0])
    offloads = _choices(fix, "offload_optimizer", list(options.offload))
    pairs = [(z, o) for z in zeros for o in offloads if not (o and z == 0)]
    if not pairs:
        rejected["offload needs ZeRO >= 1 (and dp > 1)"] += 1
    return pairs


def _choices(fix: dict, key: str, default: list) -> list:
    return [fix[key]] if key in fix else default


def _tp_reason(tp: int, gpus_per_node: int, tp_divisors: list[int], num_gpus: int) -> str:
    if num_gpus % tp:
        return "tp does not divide gpus"
    if tp > gpus_per_node:
        return "tp > gpus per node"
    if gpus_per_node % tp:
        return "tp does not divide gpus per node"
    if any(d % tp for d in tp_divisors):
        return "tp does not divide heads or hidden sizes"
    return ""
