"""Device specifications and presets.

Every number is a vendor data-sheet figure (dense, no sparsity) unless stated otherwise. Where a
sheet gives only figures "with sparsity" (2:4 structured sparsity doubles the rate), they are
halved here and the entry says so. ``fp8`` is the dense FP8 tensor-core rate with FP32
accumulation, the rate a training GEMM runs at.

- A100: NVIDIA A100 Tensor Core GPU data sheet (2021): 312 TFLOP/s bf16/fp16, 19.5 fp32,
  1,555 GB/s (40 GB) / 2,039 GB/s (80 GB) HBM2e. No FP8 tensor cores.
- H100 SXM: NVIDIA H100 data sheet (2023): 989 TFLOP/s bf16 dense, 67 fp32, 3.35 TB/s HBM3;
  FP8 3,958 TFLOP/s with sparsity -> 1,979 dense. 132 SMs (NVIDIA H100 Tensor Core GPU
  Architecture whitepaper, 2022, for the SXM5 product).
- H200 SXM: NVIDIA H200 data sheet (2024): 989 TFLOP/s bf16 dense, 141 GB, 4.8 TB/s HBM3e;
  FP8 3,958 with sparsity -> 1,979 dense (the H100 silicon, so H100's 132 SMs).
- V100 SXM2 32 GB: NVIDIA V100 data sheet: 125 TFLOP/s fp16 tensor, 15.7 fp32, 900 GB/s; no bf16,
  no FP8.
- L4: NVIDIA L4 data sheet: 121 TFLOP/s bf16 dense (242 with sparsity), 30.3 fp32, 24 GB, 300 GB/s;
  FP8 485 with sparsity -> 242.5 dense.
- RTX 4090: NVIDIA Ada Lovelace architecture whitepaper, Table 2: 165.2 TFLOP/s fp16/bf16 tensor
  with fp32 accumulate (dense), 82.6 fp32, 24 GB GDDR6X at 1,008 GB/s; FP8 tensor with FP32
  accumulate 330.3 dense (660.6 with sparsity; GeForce runs FP32 accumulation at half the FP16-
  accumulate rate, as for fp16).
- B200 (HGX / DGX B200, 1,000 W): NVIDIA DGX B200 data sheet (2024/2025): 8 GPUs, 1,440 GB HBM3e
  and 64 TB/s in total -> 180 GB and 8 TB/s per GPU; FP8 72 PFLOP/s per system with sparsity ->
  4.5 PFLOP/s dense per GPU. NVIDIA HGX platform page (nvidia.com/en-us/data-center/hgx, HGX B200
  column, 2025): FP16/BF16 36 PFLOP/s per 8 GPUs with sparsity -> 2,250 TFLOP/s dense per GPU,
  FP32 600 TFLOP/s per 8 GPUs -> 75. Host: the DGX B200's two Xeon Platinum 8570 hosts attach
  the GPUs over PCIe 5.0 x16 (same 50 GB/s achieved as H100).
  SMs: NVIDIA publishes no enabled-SM count for B200; 148 is what the device reports
  (cudaDeviceProp.multiProcessorCount), measured by Chips and Cheese, "Nvidia's B200: Keeping
  the CUDA Juggernaut Rolling" (2025): 2 dies x 74 enabled SMs.
- GB200 (the Blackwell GPU of a GB200 NVL72 rack, 1,200 W): NVIDIA GB200 NVL72 page
  (nvidia.com/en-us/data-center/gb200-nvl72, spec table, 2025), per rack of 72 GPUs: FP8 720
  PFLOP/s and FP16/BF16 360 PFLOP/s with sparsity -> 5,000 and 2,500 TFLOP/s dense per GPU;
  FP32 5,760 TFLOP/s -> 80; HBM3e up to 13.4 TB at 576 TB/s -> 186 GB and 8 TB/s per GPU (the
  GB200 superchip column: up to 372 GB, 16 TB/s per 2 GPUs). Host link: NVLink-C2C to the Grace
  CPU, 900 GB/s bidirectional -> 450 GB/s one way. Host memory: one Grace (up to 480 GB LPDDR5X
  at up to 512 GB/s, superchip column) serves 2 GPUs -> 256 GB/s each. SMs: not published; the
  B200 die, so B200's 148 is assumed.
- B300 (HGX / DGX B300, Blackwell Ultra): NVIDIA HGX platform page (HGX B300 column, 2025), per
  8 GPUs with sparsity: FP8 72 PFLOP/s -> 4,500 dense per GPU, FP16/BF16 36 -> 2,250; FP32 600
  TFLOP/s -> 75; memory up to 2.3 TB -> 288 GB per GPU. NVIDIA Technical Blog, "Inside NVIDIA
  Blackwell Ultra: The Chip Powering the AI Factory Era" (Aug 2025): 288 GB HBM3e at 8 TB/s per
  GPU; 160 SMs "in the full GPU implementation" (the enabled count of a shipping B300 is not
  published; 160 is an upper bound). Host link: PCIe 5.0 x16 assumed as for B200 (the GPU has a
  PCIe 6 interface, but host traffic runs at the host's PCIe 5 rate).
- GB300 (the Blackwell Ultra GPU of a GB300 NVL72 rack, 1,400 W): NVIDIA GB300 NVL72 page
  (nvidia.com/en-us/data-center/gb300-nvl72, spec table, 2025), per rack of 72 GPUs: FP8/FP6 720
  PFLOP/s and FP16/BF16 360 PFLOP/s with sparsity -> 5,000 and 2,500 dense per GPU; FP32 6 PFLOP/s
  -> 83.3 (the page rounds); HBM3e 576 TB/s -> 8 TB/s per GPU; 288 GB per GPU (Blackwell Ultra
  blog above); CPU memory up to 17 TB LPDDR5X at up to 14 TB/s per rack -> 194 GB/s per GPU.
  Host link NVLink-C2C 900 GB/s bidirectional -> 450 GB/s one way. SMs: 160 as for B300.
- MI300X: AMD Instinct MI300X product page and data sheet (amd.com, 2023/2024): 304 compute units,
  192 GB HBM3 at 5.3 TB/s, peak dense 1,307.4 TFLOP/s fp16/bf16 (2,614.9 with sparsity), FP8
  2,614.9 dense, FP32 163.4 (matrix and vector); host bus PCIe 5.0 x16. ``sm_count`` holds the
  compute units (the GEMM wave model places one tile per CU). ``gemm_tile`` stays 128: AMD states
  no tile size for its libraries; hipBLASLt often uses larger macro tiles (256 wide) on MI300X, so
  run ``plan profile`` there for measured GEMM speeds.
- cpu: a two-core x86-64 machine like the one CI runs on (2 cores x 2 FMA ports x 8 fp32 lanes x
  2 FLOP x ~3 GHz ~= 0.19 TFLOP/s; ~20 GB/s DRAM). Use ``plan profile`` to replace these guesses
  by measurements.

Efficiencies are the fraction of peak that kernels sustain in training (see each field). They were
set on A100/H100 (``matmul_efficiency`` fitted on Megatron-LM's A100 runs) and are assumed, not
measured, for the Blackwell and MI300X presets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from costmodels.errors import SpecError, suggest, unknown_key

GB = 1e9
TERA = 1e12
US = 1e-6

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
"""Bytes of one stored value (weights, activations, gradients) when training in this dtype. FP8
training (Transformer Engine style) runs GEMMs on FP8 operands but keeps weights, activations and
gradients in bf16 (costmodels.precision says what changes)."""


FP8_MATMUL_EFFICIENCY = 0.51
"""Share of the FP8 peak that FP8 GEMMs sustain in training, every device: fitted on half of 22
published dense FP8 runs (Megatron-Core / Transformer Engine on H100, B200, GB200 and GB300,
their output layers in bf16, their tensor-parallel collectives overlapped with the GEMMs as
their configurations set; benchmarks/dense_fp8_runs.py: alternate configurations, a row's
twin under the other FP8 recipe on its side), held-out median error 4.7% (5.5% before
the tied weights' gradient all-reduce and sequence parallelism's second all-gather were priced,
2026-12-07; 0.49 and 8.4% with those collectives priced exposed, until that day). (Split by row parity,
which held out four twins of fitted rows, the fit read 0.51 and 7.9%; 0.52 and 9.4% before
hidden communication slowed the compute beside it, OVERLAP_SLOWDOWN.)
Isolated FP8 GEMMs reach about 70% of the FP8 peak as bf16 ones do of theirs; in whole steps FP8
GEMMs run about 1.4x the bf16 GEMM rate, not 2x (power and clock limits at the FP8 rate, scaling
in the GEMM epilogue), the range of the end-to-end FP8 speedups published for dense models
(torchao: 1.25-1.5x)."""

OVERLAP_SLOWDOWN = 0.189
"""How much slower compute kernels run while a collective runs beside them, every GPU: 18.9% is the
mean slowdown measured over GPT and Llama training kernels overlapped with NCCL/RCCL collectives
on A100, H100, MI250 and MI210 (maximum 40%; Lee et al., "Characterizing Compute-
Communication Overlap in GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114, 2025).
The communication kernels take SMs (NCCL runs a block per channel) and memory bandwidth. Measured
on 4 GPUs of one node; applied here to collectives across nodes and to the context-parallel
ring's point-to-point sends too, which is an extrapolation (fewer SMs drive a send)."""

HIDES_NOTHING = "inf"
"""What a device mapping (cluster YAML, a plan's cluster) says for an infinite overlap_slowdown."""

HOST_OVERLAP_SLOWDOWN = math.inf
"""The ``cpu`` preset's: nothing is hidden behind compute. Its processes are its cores, each busy
with a rank's compute thread, and gloo's transfers are work for those cores (copies into socket
buffers, the loopback's TCP processing), so compute stops while they run. Measured on the 2-core
VM (2026-12-06): an exchange of 64 KB to 1 MB posted by both of two ranks before 2-10 ms of GEMMs
and awaited after them added 0.6-1.4x (about 1x) its time alone to the GEMMs'."""


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One accelerator (or CPU) as the cost model sees it."""

    name: str
    """Preset name, e.g. ``a100-80g``."""
    memory_bytes: float
    """Device memory in bytes (HBM, or RAM for ``cpu``)."""
    peak_flops: Mapping[str, float]
    """Dense peak in FLOP/s per compute dtype (``bf16``, ``fp16``, ``fp32``, ``fp8``); a dtype
    the device does not support is absent."""
    hbm_bytes_per_s: float
    """Memory bandwidth in bytes/s."""
    matmul_efficiency: float = 0.70
    """Fraction of peak FLOP/s that large GEMMs sustain in training (dimensionless). Isolated GEMM
    benchmarks reach 80-87% on A100/H100; 0.70 was fitted to Megatron-LM's published A100 runs in
    fp16 (Narayanan et al. 2021, Table 1; benchmarks/megatron_table1.py), which includes clock
    throttling under sustained load. Under today's model the even rows fit 0.690 (held-out median
    1.9%), and at 0.70 all ten rows read median 1.7%, max 6.4% (`--fit-rows none`): the round
    figure is kept."""
    fp8_matmul_efficiency: float = FP8_MATMUL_EFFICIENCY
    """Fraction of the FP8 peak that FP8 GEMMs sustain in training (a measured GEMM table
    replaces it, as it does ``matmul_efficiency``)."""
    memory_efficiency: float = 0.80
    """Fraction of memory bandwidth that element-wise kernels reach (dimensionless): a streaming
    copy reaches 750 of V100's 900 GB/s (83%; Jia et al., "Dissecting the NVIDIA Volta GPU
    Architecture via Microbenchmarking", arXiv 1804.06826, 2018); training's element-wise kernels
    (several inputs, reductions, broadcasts) reach no more, and 0.80 is taken for every GPU (a
    measured table from ``plan profile`` replaces it)."""
    grouped_gemm_efficiency: float = 1.0
    """Speed of the grouped GEMM that runs routed experts, relative to a plain GEMM of the same
    FLOPs (1.0: as fast, assumed on GPUs, where no comparison is published; measured by ``plan
    profile``, where CPU builds of torch loop over the groups)."""
    attention_efficiency: float = 0.60
    """Fraction of peak FLOP/s the device's best fused attention kernel reaches in its forward
    pass, and in its backward where ``attention_bwd_efficiency`` is None (FlashAttention-2
    forward reaches about 70% on A100, its backward about 60%: Dao 2023, Fig. 5; 0.60 covers
    both)."""
    attention_bwd_efficiency: float | None = None
    """The same kernel's backward pass, where it was published apart (None: as the forward)."""
    flash2_efficiency: float | None = None
    """The forward share of FlashAttention-2's kernels (PyTorch SDPA's flash backend, engine
    attention ``flash2``) where the device's best kernel goes further; None: the best kernel's
    (FlashAttention-2 is the best kernel there, or its share was not published)."""
    flash2_bwd_efficiency: float | None = None
    """... and of their backward (None: as their forward)."""
    attention_d64_share: float = 1.0
    """The best fused attention kernel's forward speed at head dimension 64, as a share of its
    speed at 128 (the head dimension its efficiency was read at): narrower heads give each tile
    less work per load. Between 64 and 128 the share is taken linearly in log2 of the head
    dimension; at 64 and below it is this, at 128 and above 1 (1.0: not published for the
    device). Hopper: HOPPER_HEAD_DIM."""
    attention_bwd_d64_share: float = 1.0
    """... of its backward pass."""
    flash2_d64_share: float = 1.0
    """The same for FlashAttention-2's kernels (engine attention ``flash2``), forward ..."""
    flash2_bwd_d64_share: float = 1.0
    """... and backward."""
    flash_attention: bool = True
    """The device runs FlashAttention-style fused attention (Transformer Engine's, FlashAttention-2
    and -3 need sm80 or newer). False on V100 (sm70), where Megatron-LM keeps the attention scores
    in memory: an engine asking for ``flash`` is priced ``materialized`` there."""
    fp8_block_scaling: bool = False
    """The tensor cores take block-scaled FP8 (MXFP8: a scale per 32 elements, sm100 and newer,
    Blackwell), which the ``block`` FP8 recipe needs; Hopper's FP8 GEMMs take per-tensor scales
    only (Transformer Engine refuses MXFP8 below sm100, as torchtitan's quantize.linear.mx does)."""
    causal_attention_ratio: float = 1.0
    """Speed of a fused attention call under a causal mask relative to an unmasked call of the
    same shape, both counting only the work the kernel does (the masked half skipped): the
    diagonal tiles are part-masked and the query tiles carry unequal work. Applies to either
    kernel, forward and backward (1.0: not published for the device)."""
    attention_window_keys: float = 0.0
    """A fused attention kernel's fixed work per query row of a sliding-window call, in keys'
    worth of work, forward: the two part-masked key tiles at the window's edges, and the query
    tile's own loads, rescaling and stores, which a short window leaves few full tiles to spread
    over. A call whose rows see ``w`` keys each runs at (w / (w + this)) of the unmasked speed,
    relative to calls of 8,192 keys (costmodels.attention.WINDOW_REFERENCE_KEYS) where the
    device's shares of peak were read (0: not published; windowed calls then run as causal calls
    of the kept square). Hopper and Blackwell: HOPPER_WINDOW, BLACKWELL_WINDOW."""
    attention_bwd_window_keys: float = 0.0
    """... of its backward pass."""
    sm_count: int = 108
    """Streaming multiprocessors (tiles of one GEMM wave); 1 for a CPU."""
    threads: int = 0
    """CPU threads per process the speeds were measured with (a ``plan profile`` calibration of a
    CPU): plan run takes it as its default, so that a run computes as the calibration did. 0: not
    a CPU calibration."""
    gemm_tile: int = 128
    """Edge of the output tile one SM computes: 128 x 128, among the tile shapes cuBLAS picks for
    large tensor-core GEMMs (NVIDIA, "Matrix Multiplication Background User's Guide", tile
    quantization: 256x128, 128x128, 128x64, ...)."""
    kernel_overhead_s: float = 3e-6
    """Fixed cost per kernel (launch and ramp) in seconds: back to back in one stream, a 2.9 us
    kernel takes 3.8 us from launch to launch (A. Gray, "Getting Started with CUDA Graphs", NVIDIA
    Technical Blog, 2019), so about 1 us between kernels plus the ramp-up and tail of a short
    one; 3 us is taken for every GPU."""
    host_link_bytes_per_s: float = 25e9
    """Device <-> host bandwidth in bytes/s, one direction (PCIe 4.0 x16: 32 GB/s line rate,
    about 25 GB/s achieved; PCIe 5.0 doubles it)."""
    host_memory_bytes_per_s: float = 25e9
    """Host memory bandwidth available to the optimizer of one device, bytes/s (a two-socket host
    with ~200 GB/s of DRAM bandwidth shared by 8 GPUs)."""
    memory_table: tuple = ()
    """Measured element-wise throughput by size: ((bytes one kernel moves, bytes/s), ...) sorted,
    from ``plan profile``; small kernels run from cache, large ones from memory. When present it
    replaces bandwidth x memory efficiency."""
    optimizer_s_per_param: float = 0.0
    """Measured seconds of one AdamW step per parameter (``plan profile``); 0: derive it from
    the memory bandwidth."""
    dtensor_linear_fwd_s: float = 0.0
    """Host seconds DTensor adds to the forward of one tensor-parallel Linear (``plan profile`` on
    CPUs, where the host is the device); 0 on GPUs, where it overlaps the asynchronous kernels."""
    dtensor_linear_bwd_s: float = 0.0
    """... and to its backward."""
    dtensor_param_s: float = 0.0
    """Host seconds DTensor adds to one AdamW step per parameter tensor (tensor-parallel or
    FSDP2-wrapped parameters are DTensors), measured like the above."""
    gemm_table: Mapping[str, tuple] = field(default_factory=dict)
    """Measured GEMM speed per dtype: ((FLOPs of one call, FLOP/s achieved), ...) sorted by FLOPs,
    from ``plan profile``; when present it replaces peak x efficiency for that dtype."""
    gemm_grid: Mapping[str, tuple] = field(default_factory=dict)
    """Measured GEMM speed by shape per dtype: FLOP/s of (m x k) @ (k x n) nested [m][k][n] over
    ``gemm_grid_sizes`` in each dimension (``plan profile``); when present a GEMM's rate is
    interpolated in it by shape (costmodels.compute.shaped_rate) instead of read from
    ``gemm_table`` by FLOPs alone."""
    gemm_grid_sizes: tuple = ()
    """The sizes of m, k and n that ``gemm_grid`` measured, increasing."""
    attention_table: Mapping[str, Mapping[str, tuple]] = field(default_factory=dict)
    """Measured fused attention by call size per dtype (``plan profile``): {kind in
    ATTENTION_KINDS: ((square FLOPs of one call, square FLOPs per second), ...)}, square FLOPs
    being 4 x batch x heads x queries x keys x head dim whatever the mask lets the kernel skip.
    When present it replaces ``attention_efficiency``, the causal skip and the backward factor
    for that dtype: a CPU kernel runs small calls far below its large-call rate and skips masked
    blocks only at long sequences."""
    jitter: float = 0.0
    """Relative standard deviation of one process's time for the same work when all of the node's
    processes run at once (OS noise, shared caches and memory); processes that synchronize wait
    for the slowest (costmodels.compute.straggler_excess). Measured by ``plan profile`` on CPUs;
    0 = not measured."""
    overlap_slowdown: float = OVERLAP_SLOWDOWN
    """How much slower compute runs while a collective runs beside it (its kernels hold SMs and
    memory bandwidth): what hiding communication behind compute costs (costmodels.comm.
    beside_compute_s). 0: not modelled (everything hidden for free); infinite: nothing hidden
    (the CPU preset, HOST_OVERLAP_SLOWDOWN)."""
    description: str = ""
    """One line for ``plan clusters``."""
    base: str = ""
    """The preset a cluster file's device started from (``base:``), whose figures it keeps where
    not given, those a file cannot set among them; '' for a preset or a device given in full."""

    @property
    def is_host(self) -> bool:
        """Whether this is the ``cpu`` preset (the processes' own host CPU), measured or not (a
        calibration names its device "cpu (calibrated)")."""
        return self.name.split(" (")[0] == "cpu"

    @property
    def memory_bytes_per_s(self) -> float:
        """Memory bandwidth kernels reach: the data-sheet figure times ``memory_efficiency``."""
        return self.hbm_bytes_per_s * self.memory_efficiency

    def gemm_efficiency(self, dtype: str) -> float:
        """Fraction of ``dtype``'s peak that large GEMMs sustain in training."""
        return self.fp8_matmul_efficiency if dtype == "fp8" else self.matmul_efficiency

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; raises SpecError when the device lacks it."""
        if dtype not in self.peak_flops:
            have = ", ".join(sorted(self.peak_flops))
            measured = " (the calibration measured only those)" if "calibrated" in self.name else ""
            if dtype == "bf16" and "fp8" in self.peak_flops:  # (fp8's core dtype)
                raise SpecError(f"dtype: device {self.name} has no bf16 rate, and fp8 training "
                                "runs attention, norms and everything but the layers' GEMMs in "
                                "bf16; add bf16 to its peak_TFLOPs")
            raise SpecError(f"dtype: device {self.name} has no {dtype} support (it has "
                            f"{have}{measured}); choose --dtype from those (a device of a "
                            f"cluster file lists the dtypes it runs, with their TFLOP/s, under "
                            f"peak_TFLOPs)")
        return self.peak_flops[dtype]


ATTENTION_KINDS = ("causal_fwd", "causal_bwd", "full_fwd", "full_bwd")
"""The tables of ``DeviceSpec.attention_table`` per dtype: causal and unmasked calls, forward
and backward."""


V100_GEMM_EFFICIENCY = 0.31
"""V100 tensor cores in training reach a smaller share of their peak than A100's: Megatron-LM on one
V100 sustains 39 TFLOP/s for a 1.2B GPT, 30% of the 125 TFLOP/s peak (Shoeybi et al. 2019,
"Megatron-LM", section 5.1); 0.31 = 39 / 125. That is a whole step's rate taken as the GEMMs'
share, with the other kernels (attention with its scores, element-wise passes) priced on top: at
that run's own configuration (one V100, fp16, full recomputation) the planner reads 28.9 TFLOP/s,
26% slow (a new-user check, 2026-12-07). Not refitted there: on the 64-V100 data-center runs of
benchmarks/cross_site_runs.py the pipeline-only rows already come out up to 25% fast and the
tensor-parallel ones 23-40% slow, so no one share fits both."""


MIB = 2 ** 20
NVML_MIB = {"a100-40g": 40_960, "a100-80g": 81_920, "h100": 81_559, "h200": 143_771,
            "l4": 23_034, "b200": 183_359}
"""Device memory as NVML reports it (nvidia-smi's total, in MiB), for the GPUs with a published
reading: A100 40 and 80 GB, H100 SXM, H200 and L4 (Modal's table, thundergolfer.com/blog/
nvidia-gpu-memory-capacity, and modal-labs/modal-client pull request #2797), B200 (nvidia-smi in
NVIDIA/TensorRT-LLM issue #10278). The data sheets' "80 GB" of an H100 or A100 are 80 GiB of HBM
(an H100 keeps 81,559 MiB of it usable, 85.5e9 bytes): a preset of 80e9 bytes held 7% less than
the device (a review, 2026-12-07, tenth session). The other presets keep the data sheet's GB,
a lower bound where the same holds (GB200's 186 GB, B300's and GB300's 288 GB, MI300X's 192 GB,
V100's 32 GB, the RTX 4090's 24 GB)."""


def _gpu(name: str, mem_gb: float, bf16: float | None, fp16: float, fp32: float, hbm_gbps: float,
         description: str, fp8: float | None = None, **kw) -> DeviceSpec:
    """A GPU preset from data-sheet units: GB (NVML_MIB's reading where it has one), dense
    TFLOP/s per dtype (``None``: no such tensor cores), GB/s."""
    peaks = {"fp16": fp16 * TERA, "fp32": fp32 * TERA}
    if bf16 is not None:
        peaks["bf16"] = bf16 * TERA
    if fp8 is not None:
        peaks["fp8"] = fp8 * TERA
    memory = NVML_MIB[name] * MIB if name in NVML_MIB else mem_gb * GB
    return DeviceSpec(name=name, memory_bytes=memory, peak_flops=peaks,
                      hbm_bytes_per_s=hbm_gbps * GB, description=description, **kw)


HOPPER_ATTENTION = (0.61, 0.52)
"""(forward, backward) shares of peak of the fused attention Transformer Engine runs on Hopper
(cuDNN's, which it prefers on sm90; FlashAttention-3 is within 10% of it): about 600 and 516
TFLOP/s of H100's 989 at head dim 128 and 8k-16k tokens without a causal mask (Shah et al.,
"FlashAttention-3", 2024, Figs. 5 and 6, cuDNN bars; causal calls: HOPPER_CAUSAL)."""
HOPPER_FLASH2 = (0.37, 0.33)
"""The same for FlashAttention-2's kernels on H100: about 370 and 322 TFLOP/s (same figures), the
"35% utilization" of that paper's abstract."""
BLACKWELL_ATTENTION = (0.55, 0.47)
"""The same for the fused attention Transformer Engine runs on Blackwell (cuDNN): FlashAttention-4
reaches 1,605 TFLOP/s in BF16 on B200 (71% of 2,250) and up to 1.3x cuDNN 9.13 (Zadouri et al.,
"FlashAttention-4", 2026, abstract), so cuDNN about 1,235 (0.55) forward; its backward is taken
at Hopper's cuDNN backward-to-forward ratio (516 / 600), since Blackwell's backward is bound by
shared-memory traffic that did not grow with the tensor cores (same paper)."""
HOPPER_CAUSAL = 0.89
"""Causal over unmasked forward speed on H100 at head dim 128 and 8k-16k tokens, each counted
as the work the kernel does (same paper, Fig. 5, with and without the causal mask): cuDNN 529-539
against 595-600 TFLOP/s (0.89), FlashAttention-2 333-335 against 370 (0.90), FlashAttention-3
602-616 against 646-648 (0.94; not what Transformer Engine runs). The paper publishes the backward
without the mask only; it is taken at the forward's ratio."""
HOPPER_HEAD_DIM = ((0.69, 0.84), (0.87, 0.90))
"""((forward, backward) of cuDNN's kernels, (forward, backward) of FlashAttention-2's): their
speed at head dimension 64 as a share of it at 128 on H100, 8k-16k tokens without a causal mask
(Shah et al., "FlashAttention-3", 2024, Figs. 5 and 6): cuDNN forward 412-413 against 595-600
TFLOP/s, backward 432-433 against 516-518; FlashAttention-2 forward 322-324 against 370,
backward 287-291 against 318-322. At head dimension 256 its forward figures are within 3% of
128's (cuDNN 580-581, FlashAttention-2 324-326 against 370: 0.88, taken as 1 as no backward was
published there)."""
BLACKWELL_HEAD_DIM = (0.61, 0.64)
"""(forward, backward) speed of Blackwell's fused attention (cuDNN) at head dimension 64 as a
share of it at 128: a tile's exponentials are as many at either width, and at 64 they are set
against half the matrix work, where the softmax's exponential units already bound Blackwell's
forward at 128 (Zadouri et al., "FlashAttention-4", 2026). From NVIDIA's cudnn-frontend training
benchmark on GB300 (benchmark/sdpa_benchmark_training): head dimension 128, causal, 16k tokens,
1,915 TFLOP/s forward and 1,507 backward, rows of 8k keys at 95% of the speed of long rows (a
causal row's fixed work of 450 keys, BLACKWELL_WINDOW), so about 2,020 and 1,590 for long rows;
head dimension 64 (gpt-oss's shape: 64 query and 8 key-value heads, a 1,024-key window) at
675-738 forward and 638-682 backward over 4k-16k tokens, which BLACKWELL_WINDOW's row work puts
at about 1,220 and 1,010 for long rows: 0.61 and 0.64. (FlashAttention-4's own forward on GB300,
flash-attention PR #2605: 1,144-1,246 TFLOP/s at 64 against 1,646-1,749 at 128, 0.70; cuDNN's
causal forward at 64 in that table, 1,074-1,117 at 8k-16k, against the benchmark's 1,856-1,915
at 128: 0.58.)"""
HOPPER_WINDOW = (180.0, 560.0)
"""(forward, backward) fixed work per query row of a sliding-window call of Hopper's fused
attention, in keys (DeviceSpec.attention_window_keys): NVIDIA's cudnn-frontend training
benchmark runs gpt-oss's shape (head dimension 64, a 1,024-key window) on H200 at 358 TFLOP/s
forward and 299 backward at 32k tokens, against cuDNN's 412 and 432 at head dimension 64 without
a mask (HOPPER_HEAD_DIM's figures): 412 / 358 = (1 + c / 1024) / (1 + c / 8192) gives c = 181
forward, and 556 backward. One published point each, from two sources (the unmasked speeds are
the FlashAttention-3 paper's, on H100 with 2024's cuDNN): c follows the unmasked speed closely,
an unmasked speed 10% higher gives c = 320 forward."""
BLACKWELL_WINDOW = (730.0, 540.0)
"""The same for Blackwell, from two windows of the same benchmark (cuDNN 9.19-9.22, head
dimension 64), whose ratio fixes c without the unmasked speed: on GB200 a 1,024-key window runs
at 574-624 TFLOP/s forward and 617-658 backward (4k-16k tokens, 64 query heads) and a 128-key
window at 161-167 and 182-188 (128 query heads); at the ranges' middles
8 (128 + c) / (1024 + c) = 599 / 164 gives c = 625 forward, and 550 backward; on GB300
(675-738 / 167-173 forward, 638-682 / 191-200 backward) 841 and 526. The forward mean is 733,
taken as 730, the backward's 540. The same row work explains the shorter causal calls' slower
speed: cuDNN's causal forward at head dimension 64 on GB300 runs at 627, 826, 977, 1,074 and
1,117 TFLOP/s at 1k-16k tokens (flash-attention PR #2605's table), which rows of s / 2 keys with
a fixed work of 450 keys reproduce within 2%. Only ratios are taken from this benchmark: its
absolute speeds (cuDNN 9.19-9.22; GB300 at head dimension 128, causal, 16k tokens: 1,915 TFLOP/s
forward, 1,507 backward) run about 1.4x and 1.3x those BLACKWELL_ATTENTION keeps (cuDNN 9.13 as
FlashAttention-4's paper gives it, the release the 2025 runs compared here used), and the B200
long-sequence runs, predicted too fast already (README), do not support raising them."""
HOPPER_KERNELS = dict(attention_efficiency=HOPPER_ATTENTION[0],
                      attention_bwd_efficiency=HOPPER_ATTENTION[1],
                      causal_attention_ratio=HOPPER_CAUSAL,
                      flash2_efficiency=HOPPER_FLASH2[0], flash2_bwd_efficiency=HOPPER_FLASH2[1],
                      attention_d64_share=HOPPER_HEAD_DIM[0][0],
                      attention_bwd_d64_share=HOPPER_HEAD_DIM[0][1],
                      flash2_d64_share=HOPPER_HEAD_DIM[1][0],
                      flash2_bwd_d64_share=HOPPER_HEAD_DIM[1][1],
                      attention_window_keys=HOPPER_WINDOW[0],
                      attention_bwd_window_keys=HOPPER_WINDOW[1])
BLACKWELL_KERNELS = dict(attention_efficiency=BLACKWELL_ATTENTION[0],
                         attention_bwd_efficiency=BLACKWELL_ATTENTION[1], fp8_block_scaling=True,
                         attention_d64_share=BLACKWELL_HEAD_DIM[0],
                         attention_bwd_d64_share=BLACKWELL_HEAD_DIM[1],
                         attention_window_keys=BLACKWELL_WINDOW[0],
                         attention_bwd_window_keys=BLACKWELL_WINDOW[1])
PCIE5_HOST_BYTES_PER_S = 50e9
"""PCIe 5.0 x16 host link, one direction: 64 GB/s line rate, about 50 GB/s achieved (twice the
PCIe 4.0 figure of ``DeviceSpec.host_link_bytes_per_s``)."""
NVLINK_C2C_HOST_BYTES_PER_S = 450e9
"""NVLink-C2C between a Grace CPU and its GPUs: 900 GB/s bidirectional (NVIDIA GB200 / GB300
NVL72 pages) -> 450 GB/s one way."""

DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        _gpu("a100-40g", 40, 312, 312, 19.5, 1555, "NVIDIA A100 SXM 40 GB", sm_count=108),
        _gpu("a100-80g", 80, 312, 312, 19.5, 2039, "NVIDIA A100 SXM 80 GB", sm_count=108),
        _gpu("h100", 80, 989, 989, 67, 3350, "NVIDIA H100 SXM 80 GB", fp8=1979, sm_count=132,
             host_link_bytes_per_s=PCIE5_HOST_BYTES_PER_S, **HOPPER_KERNELS),
        _gpu("h200", 141, 989, 989, 67, 4800, "NVIDIA H200 SXM 141 GB", fp8=1979, sm_count=132,
             host_link_bytes_per_s=PCIE5_HOST_BYTES_PER_S, **HOPPER_KERNELS),
        _gpu("v100", 32, None, 125, 15.7, 900, "NVIDIA V100 SXM2 32 GB (no bf16)", sm_count=80,
             matmul_efficiency=V100_GEMM_EFFICIENCY, flash_attention=False),
        _gpu("l4", 24, 121, 121, 30.3, 300, "NVIDIA L4 24 GB (PCIe)", fp8=242.5, sm_count=58),
        _gpu("rtx4090", 24, 165.2, 165.2, 82.6, 1008, "NVIDIA GeForce RTX 4090 24 GB",
             fp8=330.3, sm_count=128),
        _gpu("b200", 180, 2250, 2250, 75, 8000, "NVIDIA B200 (HGX/DGX B200) 180 GB", fp8=4500,
             **BLACKWELL_KERNELS, sm_count=148,
             host_link_bytes_per_s=PCIE5_HOST_BYTES_PER_S),
        _gpu("gb200", 186, 2500, 2500, 80, 8000, "NVIDIA Blackwell GPU of a GB200 NVL72, 186 GB",
             fp8=5000, **BLACKWELL_KERNELS, sm_count=148,
             host_link_bytes_per_s=NVLINK_C2C_HOST_BYTES_PER_S,
             host_memory_bytes_per_s=256e9),
        _gpu("b300", 288, 2250, 2250, 75, 8000, "NVIDIA B300 Blackwell Ultra (HGX/DGX B300) 288 GB",
             fp8=4500, **BLACKWELL_KERNELS, sm_count=160,
             host_link_bytes_per_s=PCIE5_HOST_BYTES_PER_S),
        _gpu("gb300", 288, 2500, 2500, 83.3, 8000,
             "NVIDIA Blackwell Ultra GPU of a GB300 NVL72, 288 GB", fp8=5000,
             **BLACKWELL_KERNELS, sm_count=160,
             host_link_bytes_per_s=NVLINK_C2C_HOST_BYTES_PER_S,
             host_memory_bytes_per_s=14e12 / 72),
        _gpu("mi300x", 192, 1307.4, 1307.4, 163.4, 5300, "AMD Instinct MI300X 192 GB",
             fp8=2614.9, sm_count=304, host_link_bytes_per_s=PCIE5_HOST_BYTES_PER_S),
        _gpu("cpu", 24, 0.19, 0.19, 0.19, 20, "a 2-core x86-64 host (estimate; run `plan profile`)",
             matmul_efficiency=0.6, memory_efficiency=0.6, attention_efficiency=0.3, sm_count=1,
             gemm_tile=1, kernel_overhead_s=2e-5, overlap_slowdown=HOST_OVERLAP_SLOWDOWN),
    )
}

_SHARE_KEYS = ("matmul_efficiency", "fp8_matmul_efficiency", "memory_efficiency",
               "attention_efficiency", "attention_bwd_efficiency", "flash2_efficiency",
               "flash2_bwd_efficiency", "causal_attention_ratio", "attention_d64_share",
               "attention_bwd_d64_share", "flash2_d64_share", "flash2_bwd_d64_share")
"""DeviceSpec fields a cluster file may set as fractions in (0, 1]."""
_WINDOW_KEYS = ("attention_window_keys", "attention_bwd_window_keys")
"""DeviceSpec fields a cluster file may set as numbers of keys > 0 (a windowed call's fixed work
per query row)."""
_DEVICE_KEYS = {"name", "memory_GB", "peak_TFLOPs", "hbm_GBps", "sm_count", "description",
                "flash_attention", "fp8_block_scaling", "overlap_slowdown", "threads", "base",
                *_SHARE_KEYS, *_WINDOW_KEYS}


def device_from_mapping(spec: Mapping, where: str = "device") -> DeviceSpec:
    """Build a DeviceSpec from the YAML mapping form of a cluster file (README.md, "Cluster"; GB,
    TFLOP/s, GB/s). With ``base`` (a preset's name) every field not given is the preset's, its
    efficiencies and attention speeds among them; a ``peak_TFLOPs`` given replaces the preset's
    whole mapping (list every dtype the device runs)."""
    unknown = set(spec) - _DEVICE_KEYS
    if unknown:
        raise unknown_key(where, unknown, _DEVICE_KEYS)
    base = None
    if "base" in spec:
        if isinstance(spec["base"], Mapping) or spec["base"] in (None, ""):
            raise SpecError(f"{where}.base: expected a preset's name (e.g. base: b200), got "
                            f"{spec['base']!r}")
        base = get_device(spec["base"], f"{where}.base")
    for key in ("name", "memory_GB", "peak_TFLOPs", "hbm_GBps"):
        if key not in spec and base is None:
            raise SpecError(f"{where}.{key}: missing; a device mapping needs name, memory_GB, "
                            f"peak_TFLOPs (per dtype it trains in, e.g. {{bf16: 989, fp32: 67}}) "
                            f"and hbm_GBps, or base: a preset whose figures it keeps")
    kw = {}
    if "peak_TFLOPs" in spec:
        peaks = spec["peak_TFLOPs"]
        if not isinstance(peaks, Mapping) or not peaks:
            raise SpecError(f"{where}.peak_TFLOPs: expected a mapping like {{bf16: 312, fp32: "
                            "19.5}")
        bad = set(peaks) - set(DTYPE_BYTES)
        if bad:
            raise SpecError(f"{where}.peak_TFLOPs.{sorted(bad)[0]}: unknown dtype; use bf16, "
                            "fp16, fp32, fp8")
        kw["peak_flops"] = {k: _positive(v, f"{where}.peak_TFLOPs.{k}") * TERA
                            for k, v in peaks.items()}
    if "memory_GB" in spec:
        kw["memory_bytes"] = _positive(spec["memory_GB"], f"{where}.memory_GB") * GB
    if "hbm_GBps" in spec:
        kw["hbm_bytes_per_s"] = _positive(spec["hbm_GBps"], f"{where}.hbm_GBps") * GB
    if "description" in spec:
        kw["description"] = str(spec["description"])
    for key in _SHARE_KEYS:
        if key in spec:
            kw[key] = _fraction(spec[key], f"{where}.{key}")
    for key in _WINDOW_KEYS:
        if key in spec:
            kw[key] = _positive(spec[key], f"{where}.{key}")
    if "overlap_slowdown" in spec:  # 0 (not modelled) allowed, unlike the shares
        slow = spec["overlap_slowdown"]
        if slow == HIDES_NOTHING or (isinstance(slow, float) and slow == math.inf):
            slow = math.inf
        elif isinstance(slow, bool) or not isinstance(slow, (int, float)) or not 0 <= slow <= 1:
            raise SpecError(f"{where}.overlap_slowdown: expected a number from 0 to 1 (0.189: "
                            f"compute 18.9% slower beside a collective) or \"{HIDES_NOTHING}\" "
                            f"(compute stops while it runs, as on a CPU), got {slow!r}")
        kw["overlap_slowdown"] = float(slow)
    for key, what in (("sm_count", "SMs"), ("threads", "CPU threads per process")):
        if key in spec:
            kw[key] = _whole(spec[key], f"{where}.{key}", what)
    for key in ("flash_attention", "fp8_block_scaling"):
        if key in spec:
            if not isinstance(spec[key], bool):
                raise SpecError(f"{where}.{key}: expected true or false, got {spec[key]!r}")
            kw[key] = spec[key]
    if base is not None:  # (a name of its own: the preset's figures changed are not the preset)
        name = str(spec["name"]) if "name" in spec else f"{base.name}-custom"
        if name in DEVICES and name != base.name:  # (prices, groups and reports go by name)
            raise SpecError(f"{where}.name: {name!r} is another preset's name (this device is "
                            f"based on {base.name}); give it a name of its own")
        return replace(base, name=name, base=base.base or base.name, **kw)
    return DeviceSpec(name=str(spec["name"]), **kw)


def device_mapping(d: DeviceSpec) -> dict:
    """The YAML mapping ``device_from_mapping`` reads back into ``d`` (the fields YAML can set, and
    the preset it started from, whose other figures it keeps; measured tables do not travel)."""
    out = {**({"base": d.base} if d.base else {}), "name": d.name,
           "memory_GB": d.memory_bytes / GB,
           "peak_TFLOPs": {k: v / TERA for k, v in sorted(d.peak_flops.items())},
           "hbm_GBps": d.hbm_bytes_per_s / GB, "sm_count": d.sm_count}
    if not d.flash_attention:
        out["flash_attention"] = False
    if d.fp8_block_scaling:
        out["fp8_block_scaling"] = True
    if d.threads:
        out["threads"] = d.threads
    if d.overlap_slowdown != OVERLAP_SLOWDOWN:  # (JSON has no infinity: the word)
        out["overlap_slowdown"] = HIDES_NOTHING if math.isinf(d.overlap_slowdown) \
            else d.overlap_slowdown
    for key in (*_SHARE_KEYS, "description"):
        value = getattr(d, key)
        if value is not None and value != "":
            out[key] = value
    for key in _WINDOW_KEYS:
        if getattr(d, key):  # (0: none given)
            out[key] = getattr(d, key)
    return out


def get_device(name_or_mapping, where: str = "device") -> DeviceSpec:
    """A preset by name, or a mapping; unknown names get close suggestions."""
    if isinstance(name_or_mapping, Mapping):
        return device_from_mapping(name_or_mapping, where)
    name = str(name_or_mapping).lower()
    if name not in DEVICES:
        raise SpecError(f"{where}: unknown device '{name_or_mapping}'{suggest(name, DEVICES)}")
    return DEVICES[name]


LARGEST = 1e9
"""The largest number a device or link figure may take in its unit (GB, TFLOP/s, GB/s, us):
far beyond any hardware, and small enough that every product the cost model forms stays finite."""


def _whole(value, where: str, what: str) -> int:
    """A positive whole number (``what`` names its unit in the error)."""
    x = _positive(value, where)
    if x != int(x):
        raise SpecError(f"{where}: expected a whole number of {what}, got {value!r}")
    return int(x)


def _positive(value, where: str) -> float:
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        x = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: expected a positive number, got {value!r}") from None
    if not (0 < x <= LARGEST):
        raise SpecError(f"{where}: expected a positive number up to {LARGEST:g}, got {value!r}")
    return x


def _fraction(value, where: str) -> float:
    try:
        x = _positive(value, where)
    except SpecError:
        x = None
    if x is None or x > 1:
        raise SpecError(f"{where}: expected a fraction in (0, 1], got {value!r}")
    return x


__all__ = ["DeviceSpec", "DEVICES", "DTYPE_BYTES", "get_device", "device_from_mapping",
           "device_mapping", "suggest",
           "GB", "TERA"]


def measured_rate(table, size: float) -> float:
    """Rate at ``size`` (FLOPs or bytes per call), interpolated log-linearly in a measured table
    of (size, rate) pairs, held flat beyond its ends."""
    if size <= table[0][0]:
        return table[0][1]
    for (f0, r0), (f1, r1) in zip(table, table[1:]):
        if size <= f1:
            w = (math.log(size) - math.log(f0)) / (math.log(f1) - math.log(f0))
            return r0 + w * (r1 - r0)
    return table[-1][1]
