"""The dense part of a recommendation model (MLPs, interaction), planned by the dense search.

TorchRec's all-to-all hands every rank the pooled embeddings of its own samples, so the dense part
runs on each rank's local batch: data-parallel over all ranks, one micro-batch per step, no tensor
or pipeline split (they would need the sparse output laid out by tensor-parallel group, which
TorchRec's sharders do not do). Within that, the dense search (planner.search.loop, priced op by op
from the traced graph: costmodels.compute) chooses how the replicas keep their states: ZeRO 0
(DistributedDataParallel, what DistributedModelParallel wraps the dense part in) or ZeRO 3 (FSDP2's
fully_shard: weights, gradients and optimizer states sharded over the ranks, gathered per layer).
Activation recomputation is not offered (TorchRec's dense parts are small next to their tables).

``dense_options`` returns DDP first, then FSDP2 when it needs less memory: the table placement takes
the first that leaves room for the tables. DDP comes first although the search often prices FSDP2 a
little faster (its optimizer steps 1/N of the parameters, its gathers hide behind compute): that
price leaves out FSDP2's host work per sharded module (copy-in/copy-out around each gather and
reduce-scatter), which for dense parts of a few million parameters is of the order of what the
sharded optimizer saves. FSDP2 is taken when the tables need its memory, or when pinned.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import InfeasibleError
from planner.options import SearchOptions, TrainingSpec
from planner.search import placement
from planner.search.loop import search
from planner.search.dp_traffic import DataParallelBytes, exposed_dp_s
from planner.trace.graph import BlockGraph

ZERO_CHOICES = (0, 3)
"""DDP or FSDP2 for the dense replicas (what `plan run` builds with DistributedModelParallel)."""


@dataclass(frozen=True)
class DensePart:
    """One way to run the dense part, as the dense search priced it (per rank, per step)."""

    zero: int
    compute_s: float
    """Forward and backward."""
    backward_s: float
    """The backward's share of ``compute_s``: the window gradient reductions hide behind."""
    reduce_s: float
    """The dense part's data-parallel traffic of one step if nothing hid it (DDP: the gradient
    all-reduce; FSDP2: the weight all-gathers and gradient reduce-scatter)."""
    exposed_s: float
    """The part of it compute does not hide, with FSDP2's buffer copies where the engine has
    them."""
    optimizer_s: float
    """The optimizer step (and the straggler wait the search adds to local work)."""
    memory_bytes: float
    """Peak bytes on one rank: states, activations, buffers."""

    @property
    def device_s(self) -> float:
        return self.compute_s + self.exposed_s + self.optimizer_s

    def to_dict(self) -> dict:
        return {"zero": self.zero, "engine": "FSDP2 fully_shard" if self.zero == 3 else "DDP",
                "priced_by": "dense search (op by op)", "compute_s": self.compute_s,
                "reduce_s": self.reduce_s, "exposed_s": self.exposed_s,
                "optimizer_s": self.optimizer_s, "memory_bytes": self.memory_bytes}


def dense_options(blocks: BlockGraph, cluster, *, global_batch: int, dtype: str,
                  optimizer: str, engine, zero: int | None = None) -> tuple[DensePart, ...]:
    """Ways to run the dense part data-parallel on every rank of ``cluster``, in the order the
    table placement tries them (DDP, then FSDP2 if leaner). ``zero`` pins the state sharding."""
    world = cluster.num_gpus
    training = TrainingSpec(global_batch=global_batch, seq_len=1, dtype=dtype,
                            optimizer=optimizer, engine=engine)
    fix = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": world, "micro_batch": global_batch // world,
           "offload_optimizer": False}
    zeros = (zero,) if zero is not None else ZERO_CHOICES
    found = []
    for z in zeros:
        result = search(blocks, cluster, training,
                        SearchOptions(fix={**fix, "zero": z}, recompute=("none",), top_k=1))
        if result.best is not None:
            found.append(_part(result.best, cluster, training))
    if not found:
        raise InfeasibleError(f"the dense part does not fit one GPU at local batch "
                              f"{global_batch // world} (ZeRO {'/'.join(map(str, zeros))}); use a "
                              "smaller batch or more GPUs", reason="out of memory")
    ddp = [d for d in found if d.zero == 0]
    return tuple(ddp + [d for d in found if d.zero == 3
                        and (not ddp or d.memory_bytes < ddp[0].memory_bytes)])


def _part(est, cluster, training: TrainingSpec) -> DensePart:
    """The estimate's numbers, and its gradient traffic before hiding (dp_traffic.exposed_dp_s
    without overlap) so that the tables' reduction can share the window."""
    cfg, bd = est.config, est.breakdown
    (stage,) = est.stages  # one stage, one micro-batch
    backward = stage.compute_s - stage.fwd_s - stage.recompute_s
    reduce = float(exposed_dp_s(cfg, stage.params, DataParallelBytes.of(training),
                                placement.dp_group(cfg, cluster), cluster, stage.compute_s,
                                backward, overlap=False, frozen=stage.frozen_params,
                                forward_only=stage.forward_only_params))
    return DensePart(zero=cfg.zero, compute_s=bd["compute_s"], backward_s=backward,
                     reduce_s=reduce, exposed_s=bd["dp_comm_s"],
                     optimizer_s=bd["optimizer_s"] + bd.get("straggler_s", 0.0),
                     memory_bytes=est.peak_memory_bytes)
