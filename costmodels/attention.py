"""Time of a block's attention on one GPU: fused kernels, materialized scores, and the extra
calls of a context-parallel ring (costmodels.compute prices the rest of the block with these).

A fused kernel (``flash``) runs at ``attention_efficiency`` forward and ``attention_bwd_efficiency``
backward (``flash2``, FlashAttention-2's kernels, at ``flash2_efficiency`` and
``flash2_bwd_efficiency`` where the device has them) and skips about half the work under a causal
mask, running what is left ``causal_attention_ratio`` as fast (a context-parallel ring's calls are
mostly unmasked pairs of chunks, at the unmasked speed); its backward recomputes the scores, 2.5x
the forward FLOPs (Dao, "FlashAttention-2", 2023). Where ``plan profile`` measured attention by call
size (CPUs), each call runs at the measured rate of its size and mask instead. ``materialized``
attention runs two batched GEMMs and moves the score matrix through memory between kernels (bytes
per score element below). An attention core traced from eager code (explicit GEMMs, softmax,
masking) runs as traced when attention is ``materialized`` and as one fused kernel (its GEMMs' FLOPs
at the flash rate, its score traffic gone) when it is ``flash``; it skips masked work only where its
module declares the mask (planner.trace.masks), since the traced mask is data. A fused kernel under
a sliding window runs only the tiles inside it: such a call is priced as a causal call of the
smaller square the trace gives it (BlockWork.attn_window_cut), and where the device's kernels
were measured under windows, as unmasked work plus a fixed work per query row (window_work).
"""

from __future__ import annotations

import math

from costmodels.engine import FUSED_ATTENTION, EngineSpec
from costmodels.hardware import DTYPE_BYTES, DeviceSpec, measured_rate
from costmodels.workload import BlockWork

FLASH_BACKWARD_FACTOR = 2.5
"""FlashAttention backward FLOPs relative to forward (it recomputes the scores)."""
CAUSAL_SKIP = 0.5
"""Fraction of a causal attention's work a fused kernel skips (the masked upper triangle)."""
SCORE_TRAFFIC_FWD = 4
"""16-bit words moved per score element in materialized attention's forward: QK^T writes the
scores, the fused scale-mask-softmax reads them and writes probabilities, attention x V reads them."""
SCORE_TRAFFIC_BWD = 7
"""... and in backward: read probabilities, write and read their gradient, softmax backward
reads probabilities and gradient and writes the score gradient, which the two GEMMs read."""
WINDOW_REFERENCE_KEYS = 8192.0
"""Keys per query row in the calls the devices' shares of peak were read at (8k-16k tokens
without a mask): their rows' fixed work (DeviceSpec.attention_window_keys) is in those shares."""
SCORE_TRAFFIC_DROPOUT = 2.5
"""Extra words per score element per pass when attention dropout is on (read, write, 1-byte mask)."""


def fused_attention_efficiency(device: DeviceSpec, engine: EngineSpec,
                               head_dim: float = 0.0) -> tuple[float, float]:
    """(forward, backward) shares of peak the engine's fused attention kernel reaches on
    ``device``, at ``head_dim`` (0: unknown, as 128; DeviceSpec.attention_d64_share)."""
    if engine.attention == "flash2" and device.flash2_efficiency is not None:
        fwd = device.flash2_efficiency
        bwd = device.flash2_bwd_efficiency or fwd
        d64 = (device.flash2_d64_share, device.flash2_bwd_d64_share)
    else:
        fwd = device.attention_efficiency
        bwd = device.attention_bwd_efficiency or fwd
        d64 = (device.attention_d64_share, device.attention_bwd_d64_share)
    if 0 < head_dim < 128:  # linear in log2(head dim) from its share at 64 to 1 at 128
        at = max(0.0, math.log2(head_dim / 64))
        fwd, bwd = (eff * (share + (1.0 - share) * at) for eff, share in zip((fwd, bwd), d64))
    return fwd, bwd


def fused_attention_s(flops: float, device: DeviceSpec, dtype: str, engine: EngineSpec,
                      masked: float = 0.0, head_dim: float = 0.0,
                      window: tuple[float, float, float] = (0.0, 0.0, 0.0)
                      ) -> tuple[float, float]:
    """(forward, backward) seconds of fused attention doing ``flops`` of forward work unmasked
    and ``masked`` more in calls under a causal mask (the work left after the skip), of which
    ``window`` = (work, rows, causal work without the window) in calls under a sliding window
    (window_work); its backward does FLASH_BACKWARD_FACTOR times as much, each pass at its own
    share of peak."""
    f_eff, b_eff = fused_attention_efficiency(device, engine, head_dim)
    ratio = device.causal_attention_ratio
    windowed, rows, whole = window

    def work(row_keys: float) -> float:
        if not (windowed > 0 and row_keys):
            return flops + masked / ratio
        return flops + (masked - windowed) / ratio + min(
            window_work(windowed, rows, row_keys), whole / ratio)
    peak = device.peak(dtype)
    return (work(device.attention_window_keys) / (peak * f_eff),
            FLASH_BACKWARD_FACTOR * work(device.attention_bwd_window_keys) / (peak * b_eff))


def window_work(kept: float, rows: float, row_keys: float) -> float:
    """Unmasked-speed work of sliding-window calls doing ``kept`` FLOPs over query ``rows`` (FLOPs
    per key, summed: BlockWork.attn_window_rows), each row paying ``row_keys`` keys' worth of
    fixed work (DeviceSpec.attention_window_keys), against the share of it the device's speed
    already holds at WINDOW_REFERENCE_KEYS keys per row: a row of w keys runs at
    (w / (w + c)) / (8192 / (8192 + c)) of that speed. Never below ``kept``; fused_attention_s
    also keeps it below the same calls' price without their window (short sequences, whose few
    tiles a window hardly thins)."""
    return max(kept, (kept + row_keys * rows) / (1.0 + row_keys / WINDOW_REFERENCE_KEYS))


def attention_time_s(work: BlockWork, device: DeviceSpec, dtype: str, engine: EngineSpec, *,
                     micro_batch: int, tp: int) -> tuple[float, float]:
    """(forward, backward) seconds of the block's fused attention ops."""
    if work.fused_attn_flops <= 0:
        return 0.0, 0.0
    share = _attention_share(work, micro_batch, tp)
    flops = share * work.fused_attn_flops
    if engine.attention in FUSED_ATTENTION:  # sliding windows priced as smaller causal calls
        flops -= share * work.attn_window_cut
        causal = share * (work.attn_causal_flops - work.attn_window_cut)
        kept = (1.0 - CAUSAL_SKIP) * share * (work.attn_window_flops - work.attn_window_cut)
        whole = (1.0 - CAUSAL_SKIP) * share * work.attn_window_flops
        return _calls_s(flops, causal, work, device, dtype, engine,
                        window=(kept, share * work.attn_window_rows, whole))
    rate = device.peak(dtype) * device.matmul_efficiency
    word = DTYPE_BYTES[dtype]
    scores = share * work.attn_scores
    dropout = share * work.attn_scores_dropout
    bandwidth = device.memory_bytes_per_s
    fwd_traffic = word * (SCORE_TRAFFIC_FWD * scores + SCORE_TRAFFIC_DROPOUT * dropout)
    bwd_traffic = word * (SCORE_TRAFFIC_BWD * scores + SCORE_TRAFFIC_DROPOUT * dropout)
    return flops / rate + fwd_traffic / bandwidth, 2 * flops / rate + bwd_traffic / bandwidth


def _calls_s(square: float, causal: float, work: BlockWork, device: DeviceSpec, dtype: str,
             engine: EngineSpec, window: tuple[float, float, float] = (0.0, 0.0, 0.0)
             ) -> tuple[float, float]:
    """(forward, backward) seconds of fused attention calls of ``square`` FLOPs, ``causal`` of
    them under a causal mask (``window``: fused_attention_s's), at the rates measured by call
    size where the device has them (the block's calls sharing the square), else at the fused
    kernel's shares of peak."""
    table = device.attention_table.get(dtype)
    if table:
        return measured_attention_s(square, causal, square / max(work.fused_attn_calls, 1.0),
                                    table)
    return fused_attention_s(square - causal, device, dtype, engine,
                             masked=(1.0 - CAUSAL_SKIP) * causal, head_dim=work.attn_head_dim,
                             window=window)


def _attention_share(work: BlockWork, micro_batch: float, tp: int) -> float:
    """Samples' worth of the per-sample fused attention figures one GPU runs: the part inside
    tensor-parallel regions is split over the tp ranks' heads, the rest repeated."""
    rep = work.fused_attn_flops_rep / work.fused_attn_flops
    return micro_batch * ((1.0 - rep) / tp + rep)


def measured_attention_s(square: float, causal: float, per_call: float,
                         table) -> tuple[float, float]:
    """(forward, backward) seconds of fused attention calls of ``per_call`` square FLOPs each,
    ``square`` in all of which ``causal`` under a causal mask, at the rates measured by call size
    (DeviceSpec.attention_table)."""
    full = max(0.0, square - causal)

    def seconds(way: str) -> float:
        return ((causal / measured_rate(table[f"causal_{way}"], per_call) if causal else 0.0)
                + (full / measured_rate(table[f"full_{way}"], per_call) if full else 0.0))
    return seconds("fwd"), seconds("bwd")


def ring_attention_s(work: BlockWork, device: DeviceSpec, dtype: str, engine: EngineSpec, *,
                     micro_batch: int, tp: int, cp: int) -> tuple[float, float]:
    """(forward, backward) seconds a ring of ``cp`` ranks (context parallelism, p2p form) adds to
    the attention ``attention_time_s`` prices for a rank's share, because it calls the kernel once
    per pair of chunks: each sample is cut into 2 cp chunks and a rank's two query chunks meet
    every key chunk the mask lets through, 2 cp - 1 whole pairs and 2 causal ones per causal
    call (4 cp whole pairs otherwise), each pair 1 / (2 cp)^2 of the call. Where attention was
    measured by call size (DeviceSpec.attention_table) the pairs run at the rate of their size;
    otherwise only the causal pairs run at the causal speed (DeviceSpec.causal_attention_ratio),
    so the ring is faster than the rank's share of causal calls (a negative figure)."""
    table = device.attention_table.get(dtype)
    if cp <= 1 or engine.attention not in FUSED_ATTENTION or work.fused_attn_flops <= 0 or \
            not (table or device.causal_attention_ratio != 1.0):
        return 0.0, 0.0
    share = _attention_share(work, micro_batch, tp)
    # (calls under a sliding window keep their own price, the rank's share of them: a window
    # shorter than a chunk meets few of the ring's pairs, and window_work prices their rows)
    square = share * (work.fused_attn_flops - work.attn_window_flops)
    causal = share * (work.attn_causal_flops - work.attn_window_flops)
    if square <= 0:
        return 0.0, 0.0
    pairs = (2 * cp) ** 2
    masked = 2 * causal / pairs  # square FLOPs of the causal pairs
    whole = (2 * cp - 1) * causal / pairs + 4 * cp * (square - causal) / pairs
    if table:
        ring_f, ring_b = measured_attention_s(
            whole + masked, masked, square / max(work.fused_attn_calls, 1.0) / pairs, table)
    else:
        ring_f, ring_b = fused_attention_s(whole, device, dtype, engine,
                                           masked=(1.0 - CAUSAL_SKIP) * masked,
                                           head_dim=work.attn_head_dim)
    # (less the rank's share of the same calls, as attention_time_s prices them)
    own_f, own_b = _calls_s(square / cp, causal / cp, work, device, dtype, engine)
    return ring_f - own_f, ring_b - own_b
