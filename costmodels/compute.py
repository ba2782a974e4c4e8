"""Time of one block's forward and backward on one GPU (roofline with efficiency factors).

Each op is bound either by arithmetic or by memory traffic (Williams, Waterman & Patterson,
"Roofline", CACM 2009). GEMMs and attention cores are compute-bound at training sizes and run at
``matmul_efficiency`` of the dense peak; the other ops move bytes at ``memory_efficiency`` of the
memory bandwidth. Backward costs twice the forward (a GEMM's backward is two GEMMs of the same size:
input gradient and weight gradient; Narayanan et al. 2021, eq. 3 counts it the same way).
Recomputation runs the forward again (full) or the attention core again (selective).
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.hardware import DeviceSpec
from costmodels.workload import BlockWork

BACKWARD_FACTOR = 2.0
"""Backward work relative to forward (two GEMMs per GEMM; grad-in and grad-out per element-wise op)."""


@dataclass(frozen=True, kw_only=True)
class BlockTime:
    """Seconds for one micro-batch on one GPU (compute only; communication is separate)."""

    fwd_s: float
    bwd_s: float
    recompute_s: float

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s


def forward_parts_s(work: BlockWork, device: DeviceSpec, *, dtype: str, micro_batch: int, tp: int,
                    sp: bool) -> tuple[float, float, float]:
    """(GEMM seconds, attention-core seconds, memory-bound seconds) of one forward."""
    flops_per_s = device.peak(dtype) * device.matmul_efficiency
    bytes_per_s = device.hbm_bytes_per_s * device.memory_efficiency
    sp_div = tp if sp else 1
    gemm_flops = micro_batch * (work.mm_flops_tp / tp + work.mm_flops_rep / sp_div)
    attn_flops = micro_batch * work.attn_flops / tp
    mem_bytes = micro_batch * (work.mem_bytes_tp / tp + work.mem_bytes_rep / sp_div)
    return gemm_flops / flops_per_s, attn_flops / flops_per_s, mem_bytes / bytes_per_s


def block_time(work: BlockWork, device: DeviceSpec, *, dtype: str, micro_batch: int, tp: int,
               sp: bool, recompute: str) -> BlockTime:
    """Forward, backward and recomputation seconds of one block for one micro-batch."""
    gemm_s, attn_s, mem_s = forward_parts_s(work, device, dtype=dtype, micro_batch=micro_batch,
                                            tp=tp, sp=sp)
    fwd_s = gemm_s + attn_s + mem_s
    bwd_s = BACKWARD_FACTOR * fwd_s
    if recompute == "full":
        recompute_s = fwd_s
    elif recompute == "selective":
        recompute_s = attn_s
    else:
        recompute_s = 0.0
    return BlockTime(fwd_s=fwd_s, bwd_s=bwd_s, recompute_s=recompute_s)


def optimizer_step_s(params: float, device: DeviceSpec, *, state_bytes_per_param: float) -> float:
    """Adam's update is memory-bound: it reads and writes every state byte once."""
    traffic_bytes = 2 * params * state_bytes_per_param
    return traffic_bytes / (device.hbm_bytes_per_s * device.memory_efficiency)
