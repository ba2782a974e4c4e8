"""Time of one block's forward and backward on one GPU: a roofline per kernel.

Each kernel is bound either by arithmetic or by memory traffic (Williams, Waterman & Patterson,
"Roofline", CACM 2009), plus a fixed launch cost.

- GEMMs reach ``matmul_efficiency`` of the dense peak (FP8 GEMMs ``gemm_efficiency("fp8")`` of
  the FP8 peak), reduced by wave quantization: the output is cut into tiles, one per SM at a time,
  and a last partial wave leaves SMs idle (NVIDIA, "Matrix Multiplication Background User's
  Guide", section on tile and wave quantization); an output of fewer tiles than SMs splits its
  reduction over the idle ones (split-K). A skinny GEMM is bound by its operand traffic instead.
  Backward runs the two transposed GEMMs (input gradient m x k x n, weight gradient k x n x m).
- Attention: costmodels.attention.
- Element-wise ops move their bytes at ``memory_efficiency`` of the bandwidth; backward moves
  about twice the forward traffic (each op reads the incoming gradient and what it saved, and
  writes a gradient per input).
- Recomputation runs the forward again (full), the attention core again (selective), or the
  memory-bound ops and every other weight GEMM (op-level, torchtitan's selective checkpointing).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass

from costmodels import precision
from costmodels.attention import CAUSAL_SKIP, attention_time_s, fused_attention_s
from costmodels.engine import FUSED_ATTENTION, EngineSpec
from costmodels.hardware import DTYPE_BYTES, DeviceSpec, measured_rate
from costmodels.workload import SPLIT_BATCH, SPLIT_K, SPLIT_N, SPLIT_NONE, BlockWork, Gemm

MEMORY_BACKWARD_FACTOR = 2.0
"""Backward traffic of element-wise ops relative to their forward: a count, not a measurement. A
unary op's forward reads its input and writes its output (2 tensors); its backward reads the
output's gradient and what it saved and writes the input's gradient, and a binary op's writes two
gradients (3-4 tensors): about twice."""


@dataclass(frozen=True, kw_only=True)
class BlockTime:
    """Seconds for one micro-batch on one GPU (compute only; communication is separate)."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    attn_fwd_s: float = 0.0
    """The part of ``fwd_s`` in attention cores (what context parallelism's ring hides K/V
    exchange behind)."""
    attn_bwd_s: float = 0.0
    op_recompute_s: float = 0.0
    """What op-level checkpointing recomputes: every other weight GEMM and the memory-bound ops,
    not attention; for an MoE layer at least the issue time of those ops."""
    moe_act_recompute_s: float = 0.0
    """What ``recompute="moe_act"`` runs again: the memory-bound ops of the routed experts'
    activation function and of the norms before them (BlockWork.moe_act_mem_bytes); in an MoE
    layer what they add to a backward pass that waits for the host or for the device, whichever
    is slower with them."""
    mla_up_recompute_s: float = 0.0
    """What ``recompute="mla_up_proj"`` runs again: multi-head latent attention's up projections
    (Gemm.mla_up) and the memory-bound ops between them and the attention
    (BlockWork.mla_up_mem_bytes_*); in an MoE layer taken as moe_act's ops are."""
    both_recompute_s: float = 0.0
    """What ``recompute="mla_up_proj+moe_act"`` runs again: both of the above, taken together in
    an MoE layer's backward (one wait for the host or the device, not two)."""
    tp_col_dgrad_s: float = 0.0
    """With tp > 1, the input-gradient GEMMs of the column-parallel Linears (routed experts'
    aside), part of ``bwd_s``: what tensor parallelism's second all-gather of their inputs runs
    beside (EngineSpec.tp_grad_overlap)."""
    tp_col_wgrad_s: float = 0.0
    """With tp > 1, the weight-gradient GEMMs of the same Linears: what their input gradients'
    collective runs beside."""
    wgrad_s: float = 0.0
    """The part of ``bwd_s`` in the weight-gradient GEMMs of Linear layers: what a schedule
    that splits the backward (ZB-H1's W) can run apart from the input gradient. Attention's and
    the element-wise backward are input-gradient work."""
    shared_fwd_s: float = 0.0
    """The part of ``fwd_s`` in the shared expert's GEMMs (Gemm.shared_expert): what
    Megatron-Core's --moe-shared-expert-overlap runs beside the token dispatch and combine."""
    shared_bwd_s: float = 0.0
    """... and of ``bwd_s``."""
    backward: bool = True
    """Whether a backward runs through the block (BlockWork.runs_backward): without one nothing
    is recomputed."""
    selective_s: float | None = None
    """What ``recompute="selective"`` runs again where the engine keeps the matrix
    multiplications' outputs alone (EngineSpec.selective = matmuls); None: the attention core
    (``attn_fwd_s``), as Megatron-Core's selective recomputation."""

    def recomputing(self, recompute: str) -> "BlockTime":
        """The same block under another recomputation policy: full replays the forward,
        selective the attention core (or all but the matrix multiplications: selective_s),
        op-level its share (op_recompute_s), moe_act the experts'
        activation function and the norm before them (moe_act_recompute_s), mla_up_proj latent
        attention's up projections (mla_up_recompute_s), mla_up_proj+moe_act both
        (both_recompute_s)."""
        selective = self.attn_fwd_s if self.selective_s is None else self.selective_s
        again = {"full": self.fwd_s, "selective": selective, "op": self.op_recompute_s,
                 "moe_act": self.moe_act_recompute_s, "mla_up_proj": self.mla_up_recompute_s,
                 "mla_up_proj+moe_act": self.both_recompute_s, "none": 0.0}[recompute]
        return dataclasses.replace(self, recompute_s=again if self.backward else 0.0)

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s


_GEMMS: dict[tuple, tuple[DeviceSpec, float]] = {}
"""Seconds of GEMMs already priced, by (device id, dtype, shape): a search prices the same
shapes under many configurations. The device is kept with its entry, so that a reused id never
matches."""


def gemm_time_s(batch: float, m: float, n: float, k: float, device: DeviceSpec, dtype: str) -> float:
    """One (batched) GEMM in ``dtype`` (the GEMM's own: fp8 for weight GEMMs under FP8 training):
    max(compute with wave quantization, operand traffic) + launch. With a measured table (``plan
    profile``) the compute term is FLOPs / measured FLOP/s at that size, which already contains
    the launch cost."""
    key = (id(device), dtype, batch, m, n, k)
    hit = _GEMMS.get(key)
    if hit is not None and hit[0] is device:
        return hit[1]
    if len(_GEMMS) > 200_000:
        _GEMMS.clear()
    t = _gemm_time_s(batch, m, n, k, device, dtype)
    _GEMMS[key] = (device, t)
    return t


def _gemm_time_s(batch: float, m: float, n: float, k: float, device: DeviceSpec,
                 dtype: str) -> float:
    if min(batch, m, n, k) <= 0:
        return 0.0
    flops = 2.0 * batch * m * n * k
    word = precision.operand_bytes(dtype)
    traffic = batch * (word * (m * k + k * n) + DTYPE_BYTES[dtype] * m * n)
    memory_s = traffic / device.memory_bytes_per_s
    table = device.gemm_table.get(dtype)
    if table:
        # a batch of GEMMs at the rate of one GEMM of all its rows (a grouped GEMM of experts:
        # device.grouped_gemm_efficiency is measured against that GEMM)
        return max(flops / shaped_rate(device, dtype, flops, batch * m, n, k), memory_s)
    tile = device.gemm_tile
    tiles = math.ceil(batch) * math.ceil(m / tile) * math.ceil(n / tile)
    best = math.inf
    for split in {1, split_k(tiles, k, device)}:  # the library splits only when it pays
        # each slice writes its fp32 partial output and a reduction reads them all back
        partial = 2 * batch * m * n * 4 * split if split > 1 else 0.0
        waves = math.ceil(tiles * split / device.sm_count)
        quantization = tiles * split / (waves * device.sm_count)
        compute_s = flops / (device.peak(dtype) * device.gemm_efficiency(dtype) * quantization)
        best = min(best, max(compute_s, (traffic + partial) / device.memory_bytes_per_s))
    return best + device.kernel_overhead_s


def split_k(tiles: int, k: float, device: DeviceSpec) -> int:
    """Slices of the reduction dimension a GEMM with fewer output tiles than SMs may run in
    parallel (split-K: cuBLAS and CUTLASS choose it for a small output and a long reduction, e.g.
    the weight gradient of a narrow layer, whose reduction is the batch; NVIDIA, CUTLASS "Efficient
    GEMM in CUDA", parallelized reductions): as many as fill the SMs once, each slice at least a
    tile deep. 1 when the output alone fills the GPU. ``gemm_time_s`` takes it only where it is
    faster than one slice, its partial outputs' traffic counted."""
    if tiles >= device.sm_count:
        return 1
    return max(1, min(device.sm_count // tiles, int(k // device.gemm_tile)))


def shaped_rate(device: DeviceSpec, dtype: str, flops: float, m: float, n: float,
                k: float) -> float:
    """Measured FLOP/s of an m x k by k x n GEMM: interpolated in the measured shapes
    (``gemm_grid``) where there are some, linearly in log(rate) over log(m), log(k) and log(n)
    between the eight measured shapes around it; beyond the grid's largest size a dimension
    keeps that size's rate, below its smallest that size's time (a GEMM smaller than any
    measured costs what the smallest did: launch and setup, not FLOPs, set its time); else the
    square table's rate at these FLOPs."""
    grid = device.gemm_grid.get(dtype)
    if not grid:
        return measured_rate(device.gemm_table[dtype], flops)
    logs = [math.log(s) for s in device.gemm_grid_sizes]
    smallest = device.gemm_grid_sizes[0]
    below = 1.0  # the rate scaled down where a dimension is below the grid: its time held
    corners = []
    for x in (m, k, n):
        below *= min(1.0, max(x, 1e-9) / smallest)
        lx = min(max(math.log(max(x, 1e-9)), logs[0]), logs[-1])
        i = min(len(logs) - 2, max(0, bisect.bisect_right(logs, lx) - 1))
        corners.append((i, (lx - logs[i]) / (logs[i + 1] - logs[i])))
    (i, u), (j, v), (q, w) = corners
    log_rate = 0.0
    for di, dj, dq in itertools.product((0, 1), repeat=3):
        weight = (u if di else 1 - u) * (v if dj else 1 - v) * (w if dq else 1 - w)
        if weight:
            log_rate += weight * math.log(grid[i + di][j + dj][q + dq])
    return math.exp(log_rate) * below


@dataclass(frozen=True, kw_only=True)
class Experts:
    """How a rank runs the routed experts: ``ep`` ranks share them, ``etp`` splits their
    matrices, ``load`` is the busiest rank's token copies relative to the mean
    (costmodels.experts.rank_load), ``grouped``: one grouped GEMM for the local experts."""

    ep: int = 1
    etp: int = 1
    load: float = 1.0
    grouped: bool = True
    fp8: bool = True
    """Under fp8, whether their GEMMs run in FP8 (EngineSpec.fp8_experts)."""


DENSE = Experts()


def ungrouped_launches(work: BlockWork, experts: Experts) -> float:
    """GEMM launches a forward adds when the local experts run one GEMM each instead of one
    grouped GEMM (the trace counts one per grouped call): local experts - 1 per routed-expert
    GEMM."""
    if experts.grouped:
        return 0.0
    return sum(max(0.0, g.experts / experts.ep - 1.0) for g in work.gemms if g.experts)


def split_gemm(g: Gemm, *, micro_batch: float, tp: int, sp: bool,
               experts: Experts = DENSE) -> tuple[float, float, float, float]:
    """(batch, m, n, k) one GPU runs for this GEMM. ``micro_batch`` may be a fraction of a
    sample (a context-parallel rank's share of the sequence).

    A routed-expert GEMM runs on this rank's token copies: its own tokens (MoE layers with tensor
    parallelism run sequence-parallel, so the tp ranks hold 1/tp of them each, as Megatron-Core
    requires), times the load, gathered over the etp group, regrouped over the E/ep local experts;
    etp splits the matrices."""
    batch, m, n, k = g.batch, g.m, g.n, g.k
    if g.linear:
        m *= micro_batch
    else:
        batch *= micro_batch
    if g.experts:
        local = g.experts / experts.ep
        copies = batch * m / tp * experts.load * experts.etp
        batch, m = local, copies / local
        if g.split == SPLIT_N:
            n /= experts.etp
        elif g.split == SPLIT_K:
            k /= experts.etp
        return batch, m, n, k
    if g.split == SPLIT_N:
        n /= tp
    elif g.split == SPLIT_K:
        k /= tp
    elif g.split == SPLIT_BATCH:
        batch /= tp
    elif g.split == SPLIT_NONE and sp and g.linear:
        m /= tp
    return batch, m, n, k


def gemms_time_s(gemms, device: DeviceSpec, dtype: str, *, micro_batch: float, tp: int,
                 sp: bool, fused_attention: bool = False, experts: Experts = DENSE
                 ) -> tuple[float, float, float, float, float, float, float]:
    """(forward, backward, the weight-gradient GEMMs of that backward, attention-matmul forward,
    routed experts' forward, fused-away attention FLOPs unmasked, and the work left of those
    under a declared mask) of a block's GEMMs. The backward runs the gradient GEMMs the operands need: the input gradient
    (m x n) @ (n x k) and the weight gradient (k x m) @ (m x n). With ``fused_attention`` the
    GEMMs of eager attention cores are left out
    and their forward FLOPs returned instead (those under a mask their module declares as the
    work a kernel skipping masked tiles leaves, ``Gemm.masked``). Local experts run as one
    grouped GEMM (a batch of per-expert products, whose waves the experts share) or, without
    grouping, one GEMM per expert."""
    fwd = bwd = wgrad = attn = routed = fused = fused_masked = 0.0
    for g in gemms:
        b, m, n, k = split_gemm(g, micro_batch=micro_batch, tp=tp, sp=sp, experts=experts)
        if g.attention and fused_attention:
            if g.masked:
                fused_masked += (1.0 - g.masked) * 2.0 * b * m * n * k
            else:
                fused += 2.0 * b * m * n * k
            continue
        gd = precision.gemm_dtype(dtype, g.linear and (experts.fp8 or not g.experts))
        calls, b1 = (b, 1.0) if g.experts and not experts.grouped else (1.0, b)
        slow = calls / (device.grouped_gemm_efficiency if g.experts and experts.grouped else 1.0)
        f = slow * gemm_time_s(b1, m, n, k, device, gd)
        back = 0.0
        if g.grad_a:
            back += slow * gemm_time_s(b1, m, k, n, device, gd)
        if g.grad_b:
            w = slow * gemm_time_s(b1, k, n, m, device, gd)
            back += w
            if g.linear:
                wgrad += w
        fwd += f
        bwd += back
        if not g.linear:
            attn += f
        if g.experts:
            routed += f
    return fwd, bwd, wgrad, attn, routed, fused, fused_masked


def eager_window(gemms, *, micro_batch: float, tp: int,
                 sp: bool) -> tuple[float, float, float]:
    """(work, rows, causal work without the window) of the eager attention cores under a sliding
    window (a Gemm.masked above the half a causal mask skips), as
    costmodels.attention.fused_attention_s takes them: the forward FLOPs a kernel skipping masked
    tiles keeps of their GEMMs, their square's FLOPs per key (each GEMM of a core has the
    sequence's queries as m), and the half of the square a causal call keeps."""
    kept = rows = whole = 0.0
    for g in gemms:
        if g.attention and g.masked > 1.0 - CAUSAL_SKIP:
            b, m, n, k = split_gemm(g, micro_batch=micro_batch, tp=tp, sp=sp)
            kept += (1.0 - g.masked) * 2.0 * b * m * n * k
            rows += 2.0 * b * n * k
            whole += (1.0 - CAUSAL_SKIP) * 2.0 * b * m * n * k
    return kept, rows, whole


def op_recomputed_kernel_share(work: BlockWork) -> float:
    """The share of the block's forward kernels that op-level checkpointing issues again: all
    but the weight GEMMs it saves (every other one, BlockWork.op_saved_*; routed experts' are
    recomputed) and the fused attention calls (their outputs are saved)."""
    if work.kernels_eager <= 0:
        return 0.0
    saved = math.ceil(sum(1 for g in work.gemms if g.linear and not g.experts) / 2) + \
        work.fused_attn_calls
    return max(0.0, work.kernels_eager - saved) / work.kernels_eager


def fp8_cast_s(gemms, device: DeviceSpec, recipe: str, *, micro_batch: float, tp: int,
               sp: bool, experts: Experts = DENSE, linear: str = "te",
               eager: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds quantizing the activation inputs of FP8 weight GEMMs and, in
    backward, their output gradients (costmodels.precision). ``linear="torchao"``
    (EngineSpec.fp8_linear): each cast makes the one orientation its GEMM reads
    (precision.torchao_cast_bytes); the weights are cast too, in both passes, the saved 16-bit
    inputs again for the weight gradients, and the output gradients once for each gradient
    GEMM; ``eager`` (torchao's casts: Transformer Engine's are kernels of its own either way):
    no cast fused into the kernel making its tensor, nor the output gradient's two casts into
    one."""
    torchao = linear == "torchao"
    per_element = precision.torchao_cast_bytes(recipe) if torchao else \
        precision.cast_bytes(recipe)
    alone = per_element + precision.HIGH_PRECISION_READ_BYTES  # a cast kernel of its own
    made = alone if eager and torchao else per_element  # of a tensor a kernel has just made
    # the output gradient's second cast: eager, a kernel of its own; compiled, a second write of
    # the kernel making the first (the same tensor read once)
    second = alone if eager else precision.quantized_bytes(recipe)
    fwd = bwd = 0.0
    for g in gemms:
        if not g.linear or (g.experts and not experts.fp8):  # (16-bit experts: no casts)
            continue
        b, m, n, k = split_gemm(g, micro_batch=micro_batch, tp=tp, sp=sp, experts=experts)
        fwd += b * m * k * made
        if g.grad_a or g.grad_b:
            bwd += b * m * n * made
        if torchao:  # (b x n x k: the weights, a routed expert's each)
            fwd += b * n * k * alone
            bwd += (b * n * k * alone if g.grad_a else 0.0) + \
                (b * m * k * alone if g.grad_b else 0.0) + \
                (b * m * n * second if g.grad_a and g.grad_b else 0.0)
    rate = device.memory_bytes_per_s
    return fwd / rate, bwd / rate


def memory_bound_s(work: BlockWork, device: DeviceSpec, engine: EngineSpec, *, micro_batch: int,
                   tp: int, sp: bool, load: float = 1.0, etp: int = 1) -> float:
    """Forward seconds of the element-wise ops (with their kernel launches); with flash
    attention, the score traffic of eager attention cores is gone (a fused kernel never writes
    the scores). The routed experts' part of the traffic outside tensor-parallel regions
    (BlockWork.mem_bytes_routed: its share of the one-kernel-per-op bytes that run, taken as the
    same share of the fused bytes) is ``load`` times the mean on the busiest expert rank; with
    expert tensor parallelism its part at the hidden width (BlockWork.mem_bytes_routed_hidden)
    runs on the copies of all ``etp`` ranks."""
    sp_div = tp if sp else 1
    flash = engine.attention in FUSED_ATTENTION
    if engine.kernels == "fused":
        tp_b, rep_b = work.fused_bytes_tp, work.fused_bytes_rep
        kernels = work.kernels_fused
        if flash:
            tp_b, rep_b = tp_b - work.eager_attn_fused_tp, rep_b - work.eager_attn_fused_rep
            kernels -= work.eager_attn_kernels_fused
    else:
        tp_b, rep_b, kernels = work.mem_bytes_tp, work.mem_bytes_rep, work.kernels_eager
        if flash:
            tp_b, rep_b = tp_b - work.eager_attn_bytes_tp, rep_b - work.eager_attn_bytes_rep
            kernels -= work.eager_attn_kernels
    if (load != 1.0 or etp > 1) and work.mem_bytes_routed > 0:
        running = work.mem_bytes_rep - (work.eager_attn_bytes_rep if flash else 0.0)
        routed = min(1.0, work.mem_bytes_routed / running)
        hidden = min(routed, work.mem_bytes_routed_hidden / running)
        rep_b *= 1.0 + routed * (load - 1.0) + hidden * load * (etp - 1)
    nbytes = max(0.0, tp_b) / tp + max(0.0, rep_b) / sp_div
    kernels = max(0.0, kernels)
    total = micro_batch * nbytes
    per_kernel = (micro_batch * work.kernel_bytes if engine.kernels == "eager" and work.kernel_bytes
                  else None)
    return elementwise_s(total, kernels, device, per_kernel)


REGROUP_PASSES = 2
"""Passes over the received token copies the alltoall dispatcher adds to a forward when a rank
holds several experts, each reading and writing every copy: the all-to-all delivers them grouped
by source rank, and the experts' grouped GEMM needs them grouped by expert, so they are sorted
by local expert after the dispatch and back before the combine (Megatron-Core's
MoEAlltoAllTokenDispatcher: sort_chunks_by_idxs in dispatch_postprocess and combine_preprocess,
or a transpose when padded to capacity; torchtitan's expert parallelism permutes after its
all-to-all and unpermutes before the return; this project's runtime has the model's own expert
code sort them). The backward moves their gradients the same way. DeepEP's and the allgather
dispatcher's receivers expand tokens into expert order once, which the traced model's own gather
already prices."""


def received_bytes(work: BlockWork, *, micro_batch: float, tp: int, experts: Experts) -> float:
    """Bytes of the routed token copies one micro-batch brings this rank's experts: the busiest
    expert rank's (``load`` times the mean), gathered over the etp ranks, a tp rank holding 1/tp
    of the tokens."""
    return micro_batch * work.dispatch_bytes / tp * experts.load * experts.etp


def regroup_s(work: BlockWork, device: DeviceSpec, engine: EngineSpec, *, micro_batch: float,
              tp: int, experts: Experts) -> tuple[float, float]:
    """(seconds, kernels) of one forward's regrouping of the routed copies by local expert
    (REGROUP_PASSES), each pass reading and writing every copy this rank's experts receive (the
    busiest rank's, gathered over etp); (0, 0) without expert parallelism, with one local expert
    or another dispatcher."""
    if engine.moe_dispatcher != "alltoall" or experts.ep <= 1 or \
            work.num_experts <= experts.ep or work.dispatch_bytes <= 0:
        return 0.0, 0.0
    copies = received_bytes(work, micro_batch=micro_batch, tp=tp, experts=experts)
    kernels = float(REGROUP_PASSES) * max(work.moe_layers, 1.0)
    return elementwise_s(2.0 * REGROUP_PASSES * copies, kernels, device), kernels


def bias_loop_s(work: BlockWork, device: DeviceSpec, engine: EngineSpec, *, micro_batch: float,
                tp: int, experts: Experts, word: float) -> tuple[float, float, float, float]:
    """(forward seconds, backward seconds, forward kernels, backward kernels) of the routed
    experts' output bias added one local expert at a time (EngineSpec.moe_bias_loop), over the
    copies this rank's experts receive (the busiest rank's, gathered over etp), their elements
    ``word`` bytes each. Forward: ``b * p`` and ``t + b * p`` per expert, the concatenation, and
    a cast back where the probabilities are wider than the activations (fp32 with DeepEP, which
    needs them so; the router's dtype, the model's, otherwise): a + 5r bytes an element (+ r + a
    with the cast), r the wider of the two. Backward: per expert the two products' gradients
    (a product and a reduction each), the split's concatenation of the outputs' gradients, the
    casts: 6r + 2a (+ 2 (a + r)). (0, 0, 0, 0) where the engine fuses the bias, the experts
    have none, or they run ungrouped (``moe_grouped_gemm=false``: Megatron-Core's SequentialMLP,
    each expert's bias added inside its own Linear)."""
    if not engine.moe_bias_loop or not work.expert_bias or work.dispatch_bytes <= 0 or \
            not work.num_experts or not experts.grouped:
        return 0.0, 0.0, 0.0, 0.0
    a = word
    r = max(a, 4.0) if engine.moe_dispatcher == "deepep" else a
    cast = r != a
    elements = received_bytes(work, micro_batch=micro_batch, tp=tp, experts=experts) / a
    local = max(1.0, work.num_experts / experts.ep)
    layers = max(work.moe_layers, 1.0)
    fwd_k = layers * (2.0 * local + 1.0 + cast)
    bwd_k = layers * (4.0 * local + 1.0 + (local + 1.0 if cast else 0.0))
    fwd_b = elements * (a + 5.0 * r + ((r + a) if cast else 0.0))
    bwd_b = elements * (6.0 * r + 2.0 * a + (2.0 * (a + r) if cast else 0.0))
    return (elementwise_s(fwd_b, fwd_k, device), elementwise_s(bwd_b, bwd_k, device), fwd_k,
            bwd_k)


def elementwise_s(nbytes: float, kernels: float, device: DeviceSpec,
                  per_kernel: float | None = None) -> float:
    """``kernels`` element-wise kernels moving ``nbytes`` in all: with a measured table (``plan
    profile``) at the rate of the typical kernel's size (``per_kernel``, else the mean), which
    contains its launch; otherwise at the data-sheet bandwidth plus a launch per kernel."""
    if device.memory_table:
        size = per_kernel if per_kernel is not None else nbytes / max(kernels, 1)
        return nbytes / measured_rate(device.memory_table, size)
    return nbytes / device.memory_bytes_per_s + kernels * device.kernel_overhead_s


def block_time(work: BlockWork, device: DeviceSpec, *, dtype: str, micro_batch: int, tp: int,
               sp: bool, recompute: str, engine: EngineSpec = EngineSpec(), cp: int = 1,
               experts: Experts = DENSE) -> BlockTime:
    """Forward, backward and recomputation seconds of one block for one micro-batch on one GPU.
    With context parallelism (``cp``) the GPU holds 1/cp of every sample's tokens, balanced so
    that its share of causal attention is 1/cp too: every per-sample figure scales by 1/cp."""
    flash = engine.attention in FUSED_ATTENTION
    core = precision.core_dtype(dtype)  # attention, norms and element-wise stay 16-bit under fp8
    micro_batch = micro_batch / cp
    gemm_f, gemm_b, gemm_w, gemm_attn, gemm_routed, eager_flops, eager_masked = gemms_time_s(
        work.gemms, device, dtype, micro_batch=micro_batch, tp=tp, sp=sp, fused_attention=flash,
        experts=experts)
    attn_f, attn_b = attention_time_s(work, device, core, engine, micro_batch=micro_batch, tp=tp)
    if eager_flops or eager_masked:  # eager attention cores, run as fused kernels
        eager_f, eager_b = fused_attention_s(
            eager_flops, device, core, engine, masked=eager_masked, head_dim=work.attn_head_dim,
            window=eager_window(work.gemms, micro_batch=micro_batch, tp=tp, sp=sp))
        attn_f, attn_b = attn_f + eager_f, attn_b + eager_b
    mem_f = memory_bound_s(work, device, engine, micro_batch=micro_batch, tp=tp, sp=sp,
                           load=experts.load, etp=experts.etp)
    # the alltoall dispatcher's regrouping by local expert, forward and backward alike
    regroup, regroup_kernels = regroup_s(work, device, engine, micro_batch=micro_batch, tp=tp,
                                         experts=experts)
    # Megatron-Core's per-expert output bias (gpt-oss)
    loop_f, loop_b, loop_fk, loop_bk = bias_loop_s(work, device, engine, micro_batch=micro_batch,
                                                   tp=tp, experts=experts, word=DTYPE_BYTES[core])
    fwd_s = gemm_f + attn_f + mem_f + regroup + loop_f
    bwd_s = gemm_b + attn_b + MEMORY_BACKWARD_FACTOR * mem_f + regroup + loop_b
    cast_f = 0.0
    if dtype == "fp8":
        cast_f, cast_b = fp8_cast_s(work.gemms, device, engine.fp8_recipe,
                                    micro_batch=micro_batch, tp=tp, sp=sp, experts=experts,
                                    linear=engine.fp8_linear, eager=engine.kernels == "eager")
        fwd_s, bwd_s = fwd_s + cast_f, bwd_s + cast_b
    # selective keeping the matrix multiplications' outputs: every other op of the forward again
    # (a fused attention kernel among them; eager attention's score GEMMs kept)
    selective = attn_f + mem_f + regroup + loop_f + cast_f if engine.selective == "matmuls" \
        else None
    # op-level: its share of the dense weight GEMMs, the routed experts' whole (not saved)
    op_again = (gemm_f - gemm_attn - gemm_routed) * work.op_recompute_gemm_share + gemm_routed \
        + mem_f + loop_f
    # (the moe_act ops' share of the one-kernel-per-op bytes this GPU's memory-bound ops move,
    # without eager attention's scores where a fused kernel never makes them, as mem_f)
    per_gpu = (work.mem_bytes_tp - (work.eager_attn_bytes_tp if flash else 0.0)) / tp + \
        (work.mem_bytes_rep - (work.eager_attn_bytes_rep if flash else 0.0)) / (tp if sp else 1)
    act_again = mem_f * (work.moe_act_mem_bytes / (tp if sp else 1)) / per_gpu \
        if per_gpu > 0 else 0.0
    up_again = _mla_up_s(work, device, dtype, engine, micro_batch=micro_batch, tp=tp, sp=sp) + (
        mem_f * (work.mla_up_mem_bytes_tp / tp + work.mla_up_mem_bytes_rep / (tp if sp else 1))
        / per_gpu if per_gpu > 0 else 0.0)
    if work.num_experts:
        # an MoE layer runs many small kernels: the device waits whenever the host issues its
        # ops slower than the device runs them (about twice as many in backward: the input
        # gradients' and the weight gradients', fewer where weights are frozen). Dropless
        # dispatch also has the host wait for the device's token counts in every MoE layer, so
        # the host cannot run ahead across layers; a uniform stack of MoE layers is bound the
        # same way layer by layer without that wait.
        host = (work.kernels_eager + ungrouped_launches(work, experts) + regroup_kernels) * \
            engine.moe_host_op_s
        # (each weight GEMM weighted by its launches: one per local expert where ungrouped)
        launches = [(1.0 + (max(0.0, g.experts / experts.ep - 1.0)
                            if g.experts and not experts.grouped else 0.0), g.grad_b)
                    for g in work.gemms if g.linear]
        total = sum(n for n, _ in launches)
        host_bwd = host * (1.0 + (sum(n for n, grad in launches if grad) / total
                                  if total else 1.0)) + loop_bk * engine.moe_host_op_s
        host += loop_fk * engine.moe_host_op_s
        device_bwd = bwd_s
        fwd_s, bwd_s = max(fwd_s, host), max(bwd_s, host_bwd)
        op_again = max(op_again, host * op_recomputed_kernel_share(work))
        # moe_act's ops run inside the backward: what they add to its device time and to its
        # issue time, the slower of the two setting the pass (hidden where the other has room)

        def again(device_s: float, kernels: float) -> float:
            return max(device_bwd + device_s, host_bwd + kernels * engine.moe_host_op_s) - bwd_s

        act_again, up_again, both_again = (
            again(act_again, work.moe_act_kernels), again(up_again, work.mla_up_kernels),
            again(act_again + up_again, work.moe_act_kernels + work.mla_up_kernels))
    else:
        both_again = act_again + up_again
    if tp > 1:  # host-side DTensor work per sharded Linear (non-zero where measured: CPUs)
        fwd_s += work.tp_linears * device.dtensor_linear_fwd_s
        bwd_s += work.tp_linears * device.dtensor_linear_bwd_s
    shared = [g for g in work.gemms if g.shared_expert]
    shared_f, shared_b = gemms_time_s(shared, device, dtype, micro_batch=micro_batch, tp=tp,
                                      sp=sp)[:2] if shared else (0.0, 0.0)
    column = [g for g in work.gemms if g.linear and g.split == SPLIT_N and not g.experts] \
        if tp > 1 else []
    col_b, col_w = gemms_time_s(column, device, dtype, micro_batch=micro_batch, tp=tp,
                                sp=sp)[1:3] if column else (0.0, 0.0)
    if not work.runs_backward:  # forward only (frozen, with nothing trained before it)
        return BlockTime(fwd_s=fwd_s, bwd_s=0.0, recompute_s=0.0, attn_fwd_s=attn_f + gemm_attn,
                         shared_fwd_s=shared_f, backward=False)
    bt = BlockTime(fwd_s=fwd_s, bwd_s=bwd_s, recompute_s=0.0, attn_fwd_s=attn_f + gemm_attn,
                   attn_bwd_s=attn_b, op_recompute_s=op_again, moe_act_recompute_s=act_again,
                   mla_up_recompute_s=up_again, both_recompute_s=both_again, wgrad_s=gemm_w,
                   tp_col_dgrad_s=col_b - col_w, tp_col_wgrad_s=col_w,
                   shared_fwd_s=shared_f, shared_bwd_s=shared_b, selective_s=selective)
    return bt.recomputing(recompute)


def _mla_up_s(work: BlockWork, device: DeviceSpec, dtype: str, engine: EngineSpec, *,
              micro_batch: float, tp: int, sp: bool) -> float:
    """Forward seconds of latent attention's up-projection GEMMs (Gemm.mla_up), with their fp8
    casts: what ``recompute="mla_up_proj"`` runs again besides their memory-bound ops."""
    up = [g for g in work.gemms if g.mla_up]
    if not up:
        return 0.0
    seconds = gemms_time_s(up, device, dtype, micro_batch=micro_batch, tp=tp, sp=sp)[0]
    if dtype == "fp8":
        seconds += fp8_cast_s(up, device, engine.fp8_recipe, micro_batch=micro_batch, tp=tp,
                              sp=sp, linear=engine.fp8_linear,
                              eager=engine.kernels == "eager")[0]
    return seconds


def optimizer_step_s(params: float, device: DeviceSpec, *, traffic_bytes_per_param: float,
                     dtensor_params: float = 0.0) -> float:
    """Adam's update is memory-bound: it moves ``traffic_bytes_per_param``
    (costmodels.memory.optimizer_traffic_bytes) per parameter (a measured seconds-per-parameter
    from ``plan profile`` replaces this when present). ``dtensor_params`` parameter tensors that
    are DTensors add their host-side dispatch each."""
    host_s = dtensor_params * device.dtensor_param_s
    if device.optimizer_s_per_param:
        return params * device.optimizer_s_per_param + host_s
    return params * traffic_bytes_per_param / device.memory_bytes_per_s + host_s


def copy_s(nbytes: float, device: DeviceSpec) -> float:
    """One copy of ``nbytes`` (read once, written once) at the element-wise memory rate."""
    return _streamed_s(2 * nbytes, device)


def accumulate_s(nbytes: float, device: DeviceSpec) -> float:
    """``nbytes`` of new gradients added into the accumulated ones (both read, one written), as
    autograd does for every micro-batch after the first when no kernel fuses it."""
    return _streamed_s(3 * nbytes, device)


def _streamed_s(traffic: float, device: DeviceSpec) -> float:
    """``traffic`` bytes of one pass over large buffers at the element-wise memory rate."""
    if traffic <= 0:
        return 0.0
    rate = (measured_rate(device.memory_table, traffic) if device.memory_table
            else device.memory_bytes_per_s)
    return traffic / rate


def offloaded_optimizer_step_s(params: float, device: DeviceSpec, *,
                               traffic_bytes_per_param: float, grad_bytes: float,
                               weight_bytes: float) -> float:
    """ZeRO-Offload (Ren et al. 2021): gradients go to the host, the host updates the states in its
    memory, updated weights come back; transfers and the host update do not overlap here."""
    transfer_s = params * (grad_bytes + weight_bytes) / device.host_link_bytes_per_s
    update_s = params * traffic_bytes_per_param / device.host_memory_bytes_per_s
    return transfer_s + update_s


@functools.lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """E[max of ``n`` independent standard normal draws]: 0 for one, 1/sqrt(pi) for two, ~1.03
    for four, ~1.42 for eight (trapezoid rule of x n phi(x) Phi(x)^(n-1) over [-8, 8])."""
    if n <= 1:
        return 0.0
    steps, lo, hi = 3200, -8.0, 8.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        pdf = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        total += (0.5 if i in (0, steps) else 1.0) * x * n * pdf * cdf ** (n - 1)
    return total * h


def straggler_excess(device: DeviceSpec, processes: int) -> float:
    """Fraction of its own work a synchronized process adds by waiting for the slowest of
    ``processes``: every collective or send/receive pair waits for the last arrival, and with
    per-process times N(t, (jitter t)^2) the expected maximum is t (1 + jitter E[max of n])."""
    return device.jitter * expected_max_normal(processes)