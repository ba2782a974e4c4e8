"""How the training software runs the model: the kernels it uses and what it overlaps.

The same model costs different time on different software stacks; these knobs name the
differences that matter to the cost model. Defaults describe a current engine (torchtitan,
Megatron-Core): FlashAttention, fused element-wise kernels, gradient reduction overlapped with
the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping

from costmodels.errors import SpecError, unknown_key
from costmodels.memory import STATE_LAYOUTS
from costmodels.precision import FP8_LINEARS, FP8_RECIPE_ALIASES, FP8_RECIPES
from costmodels.specs import parse_pairs, read_bool

ATTENTION = ("flash", "flash2", "materialized")
FUSED_ATTENTION = ("flash", "flash2")
"""Attention settings that run one fused kernel (no score tensor in memory)."""
KERNELS = ("fused", "eager")
FUSED_SCOPES = ("model", "layers")
DISPATCHERS = ("alltoall", "allgather", "deepep")
CP_RINGS = ("te", "torch", "runtime")
SELECTIVE_FORMS = ("attention", "matmuls")
OVERLAP_SCOPES = ("all", "sharded")
CHOICES = {"attention": ATTENTION, "kernels": KERNELS, "fused_scope": FUSED_SCOPES,
           "moe_dispatcher": DISPATCHERS, "cp_ring": CP_RINGS, "overlap_scope": OVERLAP_SCOPES,
           "fp8_recipe": FP8_RECIPES, "fp8_linear": FP8_LINEARS, "state_layout": STATE_LAYOUTS,
           "selective": SELECTIVE_FORMS}
"""Settings that take one of a few names (all lower case; a setting given in other case is read
in lower case)."""
HOST_OP_MAX_S = 1e-3
"""Seconds per op above which a host time is taken for a unit slip (eager PyTorch issues an op in
tens of microseconds)."""


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """Software behaviour the step time depends on."""

    attention: str = "flash"
    """``flash``: one fused attention kernel (Dao et al. 2022), no s x s tensor in memory, causal
    masks skip the masked half, at the rate of the fused kernel Transformer Engine runs (cuDNN's
    on Hopper and Blackwell: ``DeviceSpec.attention_efficiency`` forward,
    ``attention_bwd_efficiency`` backward);
    ``flash2``: the same with FlashAttention-2's kernels (PyTorch SDPA's flash backend), which
    newer GPUs run below their best (``DeviceSpec.flash2_efficiency``); ``materialized``: scores
    and probabilities are written to memory between kernels (Megatron-LM before FlashAttention,
    eager PyTorch)."""
    kernels: str = "fused"
    """``fused``: each chain of element-wise ops is one kernel (torch.compile, Megatron's fused
    kernels); ``eager``: one kernel per op."""
    fused_scope: str = "model"
    """Where ``kernels="fused"`` applies: ``model`` (every block) or ``layers`` (the repeated
    layers only, Block.recompute; the embedding, final norm, output projection and loss run one
    kernel per op; a model without repeated layers is fused whole). torchtitan compiles each
    transformer block on its own (``apply_compile`` wraps ``model.layers``), so its loss over
    the vocabulary runs eagerly. ``layers`` also means torch.compile's fusion, which leaves
    gradient accumulation to autograd (a pass per micro-batch after the first), where fused
    kernels over the whole model stand for Megatron-Core's, which fold it into the
    weight-gradient GEMM."""
    overlap_grad_reduce: bool = True
    """Data-parallel gradient reduction runs during the last micro-batch's backward (DDP buckets,
    FSDP2, Megatron --overlap-grad-reduce); False: after it (Megatron-LM's 'local' DDP of 2021)."""
    ddp_accumulates: bool = True
    """Under ZeRO-0 (plain data parallelism), gradients accumulate locally over a step's
    micro-batches and are all-reduced once, in the last one's backward (DDP's no_sync,
    Megatron-Core's DDP); False: all-reduced in every micro-batch's backward (torchtitan 0.2.2,
    whose train loop runs each micro-batch's backward under its replicate() without no_sync:
    train.py, forward_backward_step)."""
    overlap_scope: str = "all"
    """Where ``overlap_grad_reduce`` hides the reduction: ``all`` (every ZeRO stage, with or
    without a pipeline) or ``sharded`` (ZeRO >= 1 without a pipeline: DeepSpeed, whose ZeRO-0
    all-reduces after the backward, engine.allreduce_gradients, and whose pipeline engine turns
    overlap_comm off, runtime/engine.py)."""
    overlap_param_gather: bool = True
    """With ``overlap_grad_reduce`` and ZeRO-1/2, the updated weights are all-gathered behind the
    next step's first forward, bucket by bucket (Megatron-Core --overlap-param-gather, FSDP2's
    prefetch); False: inside the optimizer step, exposed (DeepSpeed's ZeRO-1/2 optimizer)."""
    fsdp_copies: bool = False
    """Data parallelism copies through flat buffers, as FSDP2 does (and ``plan run``'s replicate,
    built on it): gradients are copied into the reduction buffer and out of it, scaled in place,
    and parameters copied out of the all-gather buffer; each copy reads and writes every byte at
    the memory rate, exposed. False: reductions work in place on bucket views (DDP with
    gradient_as_bucket_view, Megatron's contiguous buffers). It matters where memory is slow next
    to the collective (CPUs); on GPUs the copies are a few percent of the communication."""
    fsdp_experts: bool = False
    """With ``fsdp_copies`` and expert parallelism, the routed experts are wrapped in FSDP2 of
    their own over the expert-data-parallel group (torchtitan 0.2.2: ``fully_shard(block.moe.
    experts, mesh=edp_mesh)``), so their weights and gradients pass through the same buffer
    copies; False: they are reduced apart, in place (``plan run`` leaves them out of its data
    parallelism). Without expert parallelism FSDP2 wraps the experts with their layer anyway."""
    pipelined_accumulation: bool = False
    """The micro-batches run under torch.distributed.pipelining's schedules even without a
    pipeline (``plan run`` does; torchtitan only with pp > 1). With ``fsdp_copies`` data
    parallelism those schedules defer FSDP2's gradient sync (and its reshard after backward)
    for every micro-batch and reduce once after all the backward passes: the reduction is not
    hidden behind backward, gradients stay unsharded until then, ZeRO-3's weights stay gathered
    (planner.search.costs.fsdp_pipelined; with a pipeline it applies anyway)."""

    state_layout: str = "megatron"
    """How model states are stored (costmodels.memory.STATE_LAYOUTS): ``megatron`` (fp32 main
    gradients; Megatron-Core), ``megatron-bf16-grads`` (Megatron-Core with --grad-reduce-in-bf16:
    gradients kept and reduced in bf16), ``zero`` (the ZeRO paper's 16 bytes per parameter;
    DeepSpeed) or ``fsdp2`` (torchtitan's FSDP2: fp32 sharded parameters, gradients and moments,
    16 bytes too, with gradients reduced in fp32)."""
    fp8_experts: bool = True
    """Under fp8, whether the routed experts' GEMMs run in FP8 as the dense layers' do
    (Transformer Engine's grouped linear layers: Megatron-Core); False: they stay bf16, with no
    FP8 weight copies or quantized inputs of theirs (torchtitan's float8 and mx converters swap
    nn.Linear modules only; its grouped-GEMM converter is a prototype: planner.export.
    torchtitan)."""
    fp8_recipe: str = "current"
    """How FP8 GEMM inputs are scaled when training in fp8 (costmodels.precision): ``delayed``
    (amax history), ``current`` (the tensor's own amax, an extra read: Megatron-Core's FP8-CS) or
    ``block`` (MXFP8 32-element blocks on Blackwell, row- and column-wise copies)."""
    fp8_linear: str = "te"
    """Which software's FP8 Linear runs those GEMMs (costmodels.precision): ``te`` (Transformer
    Engine: FP8 weight copies kept for the step, inputs saved in FP8; Megatron-Core, DeepSpeed)
    or ``torchao`` (torchao's Float8Linear, torchtitan's converters: 16-bit inputs and weights
    saved and cast again in backward, every weight cast in each pass, no copies kept)."""

    moe_dispatcher: str = "alltoall"
    """How routed tokens reach their experts' ranks: ``alltoall`` (each rank sends every token
    copy to the rank of its expert, and back; Megatron-Core's default), ``allgather`` (every rank
    gathers all tokens of the expert-parallel group and keeps those of its experts; the combine
    is a reduce-scatter) or ``deepep`` (DeepEP's kernels: a token crosses the network once per
    node that holds any of its experts and the node's links once per GPU that does, instead of
    once per copy; Megatron-Core's --moe-token-dispatcher-type flex with the deepep backend,
    torchtitan's expert_parallel_comm_backend = "deepep"; costmodels.experts.node_sends)."""
    moe_imbalance: float = 1.0
    """Token copies routed to the busiest expert of a layer relative to the mean over its experts
    (a property of the routing, whatever the expert parallelism). The busiest expert-parallel
    rank follows from it (costmodels.experts.rank_load: ranks holding more experts average more
    of the spread out), and the expert GEMMs and the dispatch wait for that rank. 1.0 models
    balanced routing, as the published Megatron-Core MoE benchmarks force it
    (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md: "force-balanced routing,
    token-dropless"); real routing is less even (`plan run` measures it: an untrained router sends
    its busiest expert about twice the mean)."""
    moe_capacity_factor: float = 0.0
    """Tokens an expert accepts, relative to the mean (GShard, Lepikhin et al. 2020); tokens
    beyond it are dropped, so the busiest rank computes at most this much. 0: dropless."""
    moe_pad_to_capacity: bool = False
    """With a capacity factor, every expert's input is padded to its capacity, so every expert
    computes, sends and keeps the capacity factor times the mean tokens however they are routed
    (Megatron-Core's --moe-pad-expert-input-to-capacity: the router fills each expert's slots;
    static shapes, no token counts to wait for). Needs ``moe_capacity_factor``."""
    moe_grouped_gemm: bool = True
    """The local experts run as one grouped GEMM (Megatron's --moe-grouped-gemm); False: one GEMM
    per expert, each with its own launch."""
    host_op_s: float = 23.75e-6
    """Host seconds to issue one op of plain eager PyTorch (framework dispatch and kernel
    launch), where the device waits for the host: TorchRec's step, whose many small ops keep the
    device waiting (planner.search.tables). The value was fitted on half of the published
    Megatron-Core MoE runs under an earlier model of their host time (every MoE layer exposing
    its ops' issue time in full: benchmarks/moe_runs.py at commit a3c0864, 2026-12-02), which
    the MoE runs no longer use (moe_host_op_s), and is not refitted: the TorchRec runs, never
    fitted on, are a held-out check of it (benchmarks/recsys_runs.py). It lies within the 5-25
    us per op that eager PyTorch spends on the host for a GPU op (Python binding, autograd
    bookkeeping, the dispatcher, the launch). 0: not modelled."""
    moe_host_op_s: float = 49.75e-6
    """Host seconds per op (as traced, with the alltoall dispatcher's regrouping:
    costmodels.compute.regroup_s) of an MoE layer: the layer's forward takes at least its
    ops times this, its backward twice that, however fast the device runs them. MoE layers run
    many small kernels, and dropless dispatch has the host wait for the device's token counts
    in every layer (the all-to-all is sized from them: Megatron-Core's alltoall and allgather
    dispatchers), so the host cannot run ahead across layers. Fitted on half of the published
    Megatron-Core MoE runs, the other half held out (benchmarks/moe_runs.py): it is per op of the
    traced model, while Megatron-Core fuses some of those ops and runs Transformer Engine's
    Python layers around its kernels, so it is not plain PyTorch's per-op cost (host_op_s).
    Nor is it host time alone: runs whose layers were captured whole in CUDA graphs (no issue
    time at all) are predicted 64-96% too fast without it, so it also stands for device time the
    op-level model misses in those layers (README, the MoE runs). 0: not modelled, as for a run
    replaying its whole iteration as one CUDA graph (Megatron-Core's full_iteration graphs),
    whose published runs that prices 21% too fast on median (benchmarks/moe_runs.py, release
    26.08)."""
    selective: str = "attention"
    """What ``recompute=selective`` runs again in backward: ``attention`` (Megatron-Core's: the
    attention core, its scores, softmax and weighted sum) or ``matmuls`` (``plan run``'s: torch's
    selective activation checkpointing that saves the outputs of matrix multiplications and runs
    every other op again: a fused attention kernel, norms, activations, element-wise ops; a
    new-user check measured it as slow as full recomputation on a CPU, where it was priced as
    1% over none)."""
    cp_ring: str = "te"
    """Whose ring runs context parallelism's p2p exchange (costmodels.context): ``te``
    (Transformer Engine's, Megatron-Core: backward passes K/V and their gradients on around the
    ring, partial outputs merged inside its kernels), ``torch`` (torch's context_parallel,
    torchtitan: backward passes K/V and fp32 gradients on, merges run as element-wise ops; with
    ``cp_comm=allgather`` its all-gather rotater gathers K/V in forward and again in backward but
    keeps the per-chunk calls, merges and fp32 gradient ring) or
    ``runtime`` (``plan run``'s: every step's K/V kept for backward, fp32 gradients returned to
    their owner, merges as element-wise ops)."""
    moe_probs_in_activation: bool = True
    """With ``kernels=fused``: the routing weights multiply the experts' activation inside its
    kernel, before their last GEMM (Megatron-Core's TEGroupedMLP: weighted SwiGLU / quick-GeGLU),
    so that GEMM's output is not kept for backward (BlockWork.act_routed_weighted); False: they
    multiply the experts' outputs, which autograd keeps (Hugging Face models, torchtitan's MoE
    with scores after the experts, DeepSpeed's MoE layer). Eager engines run the model's own
    code either way."""
    moe_etp_replicated: bool = False
    """With the experts' matrices split over etp ranks: every etp rank routes and all-to-alls
    all the tokens of its tensor-parallel group (gathered before the router, the outputs
    reduce-scattered after the combine: torchtitan's ExpertTensorParallel,
    distributed/expert_parallel.py 0.2.2, which skips its sequence-parallel reorderer when etp is
    on), so the all-to-all moves etp times the copies; False: each rank all-to-alls its own
    tokens' copies and the etp ranks gather the copies after it (Megatron-Core's
    MoEAlltoAllTokenDispatcher)."""
    moe_bias_loop: bool = True
    """Routed experts with a bias vector each (gpt-oss) add their output bias outside the grouped
    GEMM, weighted by the routing probabilities, one expert at a time: Megatron-Core's
    TEGroupedMLP (its second GroupedLinear built with skip_bias_add, then _apply_bias: a split
    of the outputs and of the probabilities by each local expert's tokens, ``t + b * p`` per
    expert, a concatenation; core_v0.14.0 to core_v0.19.0). Priced as the element-wise passes
    and kernels that runs (costmodels.compute.bias_loop_s); an iteration replayed as one CUDA
    graph cannot run it (it splits by token counts on the host) and runs Transformer Engine's
    fused grouped MLP instead. On by default, as the default engine is Megatron-Core's; the
    torchtitan, torch and deepspeed presets set it false (their experts add the bias in their
    own batched code)."""
    tp_overlap: bool = False
    """Tensor parallelism's collectives under sequence parallelism (the all-gathers and
    reduce-scatters around each layer's GEMMs) pipelined with those GEMMs, as Megatron-Core's
    ``--tp-comm-overlap`` runs them with Transformer Engine's userbuffers. Priced as
    communication beside compute (comm.beside_compute_s): hidden behind the block's compute
    outside its attention cores (its GEMMs and their element-wise neighbours), the compute
    slowed by the device's overlap_slowdown while both run, what outlasts it exposed; without
    sequence parallelism (which Megatron-Core requires for it) exposed as before. Off by
    default, as in Megatron-Core; NVIDIA's performance recipes set it wherever tp > 1
    (Megatron-Bridge's Llama 3 recipes, recipes/llama/llama3.py; NeMo's launcher,
    conf/training/gpt3/175b_fp8_performance.yaml: ub_tp_comm_overlap)."""
    tp_grad_overlap: bool = True
    """In backward, a column-parallel Linear's input-gradient collective (an all-reduce; a
    reduce-scatter under sequence parallelism) runs while its weight-gradient GEMM computes, and
    under sequence parallelism the input it keeps sharded is all-gathered again for that GEMM
    while its input-gradient GEMM computes; the row-parallel Linear's gradient all-gather (under
    sequence parallelism) stays exposed. Transformer Engine's and Megatron-Core's Linear layers
    run them so (asynchronous collectives, ordered by CUDA_DEVICE_MAX_CONNECTIONS=1;
    Transformer Engine module/layernorm_linear.py and linear.py, "overlap dgrad-RS/AR with
    wgrad"). Priced as communication beside those GEMMs (comm.beside_compute_s, per block);
    ``tp_overlap`` replaces it where it runs. False: every backward collective exposed, and no
    second all-gather: DTensor's parallel styles keep the gathered input for the weight
    gradient (torchtitan, the planner's runtime), as do DeepSpeed's AutoTP and Megatron-LM of
    2021 (whose all-reduce waited for the input gradient)."""
    moe_overlap: bool = False
    """The dispatch and combine all-to-alls run behind another micro-batch's compute (Megatron-Core's
    --overlap-moe-expert-parallel-comm, DeepSeek's DualPipe); False: exposed."""
    moe_shared_overlap: bool = False
    """The shared expert's GEMMs run on a stream of their own beside the token dispatch (its
    first GEMM and activation) and combine (its second), forward and backward, so they hide that
    much of the all-to-alls (Megatron-Core's --moe-shared-expert-overlap; Megatron-Bridge sets it
    for DeepSeek-V3 wherever the all-to-all overlap is off). Only with the alltoall or deepep
    dispatcher and not with ``moe_overlap``, as Megatron-Core requires; no effect on a model
    without shared experts."""

    def replays_forward(self, recompute: str) -> bool:
        """Whether ``recompute`` runs the forward's collectives again in backward (tensor
        parallelism's, the experts' all-to-alls): full recomputation, and selective where it
        keeps the matrix multiplications' outputs alone (``selective=matmuls``: every other op
        runs again, collectives among them)."""
        return recompute == "full" or (recompute == "selective" and self.selective == "matmuls")

    def overlaps_reduction(self, *, zero: int, pp: int) -> bool:
        """Whether data-parallel gradient reduction hides behind the backward for a configuration
        of ZeRO stage ``zero`` and ``pp`` pipeline stages (overlap_grad_reduce, overlap_scope)."""
        return self.overlap_grad_reduce and (self.overlap_scope == "all"
                                             or (zero >= 1 and pp == 1))

    @property
    def fp8_copies(self) -> bool:
        """Under fp8, whether the engine keeps FP8 copies of the weights for the step (and
        refreshes them after the optimizer) and saves Linear inputs in FP8."""
        return self.fp8_linear == "te"

    def __post_init__(self):
        for key, names in CHOICES.items():
            if getattr(self, key) not in names:
                alias = " (Megatron-Core's flex dispatcher, DeepEP or HybridEP, is deepep here)" \
                    if key == "moe_dispatcher" and getattr(self, key) == "flex" else ""
                raise SpecError(f"engine.{key}: expected one of {', '.join(names)}, got "
                                f"{getattr(self, key)!r}{alias}")
        for key, low, fix in (
                ("moe_imbalance", 1.0, "1.0 is balanced routing, 2 sends the busiest expert "
                                       "twice the mean token copies"),
                ("moe_capacity_factor", 0.0, "0 is dropless, 1.25 lets an expert take 1.25 x "
                                             "the mean tokens"),
                ("host_op_s", 0.0, "seconds per op, e.g. 20e-6"),
                ("moe_host_op_s", 0.0, "seconds per op, e.g. 50e-6")):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not value >= low or value == float("inf"):
                what = "0 (dropless) or a number >= 1" if key == "moe_capacity_factor" else \
                    f"a number >= {low:g}"
                raise SpecError(f"engine.{key}: expected {what}, got {value!r}; {fix}")
        for key in ("host_op_s", "moe_host_op_s"):
            if getattr(self, key) > HOST_OP_MAX_S:
                raise SpecError(f"engine.{key}: {getattr(self, key)!r} seconds per op is not a "
                                f"host's issue time; give seconds below {HOST_OP_MAX_S:g} "
                                "(50 us is 50e-6)")
        if 0 < self.moe_capacity_factor < 1:
            raise SpecError("engine.moe_capacity_factor: expected 0 (dropless) or a number >= 1, "
                            f"got {self.moe_capacity_factor!r}; below 1 even balanced routing "
                            "would drop tokens: give 1 or more (1.25 lets an expert take 1.25 x "
                            "the mean tokens)")
        if self.moe_shared_overlap and self.moe_overlap:
            raise SpecError("engine.moe_shared_overlap: Megatron-Core runs the shared expert "
                            "beside the dispatch or overlaps the dispatch with another "
                            "micro-batch (moe_overlap), not both; drop one of the two")
        if self.moe_shared_overlap and self.moe_dispatcher not in ("alltoall", "deepep"):
            raise SpecError("engine.moe_shared_overlap: Megatron-Core overlaps the shared expert "
                            "with the alltoall or deepep (flex) dispatcher only; set "
                            "moe_dispatcher=alltoall or drop moe_shared_overlap")
        if self.moe_pad_to_capacity and self.moe_dispatcher == "deepep":
            raise SpecError("engine.moe_pad_to_capacity: DeepEP's dispatch does not pad experts "
                            "to capacity (Megatron-Core refuses it with the flex dispatcher); "
                            "leave moe_pad_to_capacity out or set moe_dispatcher=alltoall")
        if self.moe_pad_to_capacity and not self.moe_capacity_factor:
            raise SpecError("engine.moe_pad_to_capacity: padding to capacity needs a capacity "
                            "factor; set moe_capacity_factor (e.g. 1.25) or leave "
                            "moe_pad_to_capacity out (dropless)")


PRESETS: dict[str, dict] = {
    # Megatron-LM as of Narayanan et al. (SC'21): attention scores in memory (no FlashAttention
    # yet), fused bias-GELU / bias-dropout-add / softmax kernels, gradients reduced after the
    # backward ("local" DDP)
    "megatron-2021": {"attention": "materialized", "kernels": "fused",
                      "overlap_grad_reduce": False, "tp_grad_overlap": False},
    # Megatron-Core today: FlashAttention (Transformer Engine), fused kernels, overlapped
    # gradient reduction and weight gather (--overlap-grad-reduce, --overlap-param-gather)
    "megatron-core": {"attention": "flash", "kernels": "fused", "overlap_grad_reduce": True},
    # torchtitan in eager mode: SDPA's flash backend (FlashAttention-2 kernels; PyTorch 2.5.1
    # made SDPA's cuDNN backend opt-in), one kernel per element-wise op, FSDP2's overlapped
    # reduce-scatter through its flat buffers, fp32 sharded states and fp32 reduction
    "torchtitan": {"attention": "flash2", "kernels": "eager", "overlap_grad_reduce": True,
                   "ddp_accumulates": False, "tp_grad_overlap": False,
                   "fsdp_copies": True, "fsdp_experts": True, "state_layout": "fsdp2",
                   "cp_ring": "torch", "moe_etp_replicated": True, "fp8_experts": False,
                   "fp8_linear": "torchao", "moe_bias_loop": False},
    # torchtitan with torch.compile: element-wise chains of each transformer block fused by
    # Inductor; embedding, output projection and loss eager
    "torchtitan-compile": {"attention": "flash2", "kernels": "fused", "fused_scope": "layers",
                           "overlap_grad_reduce": True, "ddp_accumulates": False,
                           "tp_grad_overlap": False,
                           "fsdp_copies": True,
                           "fsdp_experts": True, "state_layout": "fsdp2", "cp_ring": "torch",
                           "moe_probs_in_activation": False, "moe_etp_replicated": True,
                           "fp8_experts": False, "fp8_linear": "torchao",
                           "moe_bias_loop": False},
    # the planner's own runtime (`plan run`, --target torch): the model's own eager code with SDPA
    # (its flash backend: FlashAttention-2 kernels), replicate / fully_shard (FSDP2's buffer
    # copies; experts outside them), micro-batches always under torch.distributed.pipelining's
    # schedules, its own ring attention, the routing weights after the experts (transformers'
    # MoE code). Its states stay in the plan's dtype, no master copy (state_layout=native)
    "torch": {"attention": "flash2", "kernels": "eager", "overlap_grad_reduce": True,
              "fsdp_copies": True, "pipelined_accumulation": True, "cp_ring": "runtime",
              "moe_probs_in_activation": False, "selective": "matmuls",
              "tp_grad_overlap": False, "state_layout": "native", "moe_bias_loop": False},
    # DeepSpeed: ZeRO's own state layout, fused kernels, overlapped reduction (overlap_comm); its
    # ZeRO-1/2 optimizer gathers the updated weights inside step()
    "deepspeed": {"attention": "flash", "kernels": "fused", "overlap_grad_reduce": True,
                  "overlap_scope": "sharded", "overlap_param_gather": False,
                  "state_layout": "zero", "tp_grad_overlap": False,
                  "moe_probs_in_activation": False, "moe_bias_loop": False},
}
"""Engine settings of common training stacks, by name (``--engine megatron-core``); ``k=v`` pairs
after the name override single settings."""

PRESET_PROPERTIES = frozenset({"moe_probs_in_activation", "moe_etp_replicated", "fp8_experts",
                               "moe_bias_loop"})
"""Settings that say how a software runs a mixture of experts, which its preset sets: not a
choice a user makes about the run (no warning for dense models; not carried to another
engine's re-plan)."""


def describe(engine: EngineSpec, attention: bool = True) -> str:
    """The software a prediction assumes, in words, and the ``--engine`` setting that gives it:
    the preset closest to it with the settings that differ (``engine_from_mapping`` reads it
    back to the same engine). ``attention``: the model has attention, whose kernel is named."""
    kernel = {"flash": "FlashAttention, ", "flash2": "FlashAttention-2 (PyTorch SDPA), ",
              "materialized": "attention scores in memory, "}[engine.attention] if attention else ""
    layers_only = engine.kernels == "fused" and engine.fused_scope == "layers"
    elementwise = ("fused element-wise kernels" if engine.kernels == "fused"
                   else "eager element-wise ops (a kernel each)")
    words = (f"{kernel}{elementwise}{' in the repeated layers' if layers_only else ''}"
             f", gradient reduction "
             f"{'overlapped with backward' if engine.overlap_grad_reduce else 'after backward'}"
             f"{', FSDP flat-buffer copies' if engine.fsdp_copies else ''}")
    if engine.pipelined_accumulation and engine.fsdp_copies:
        words += ", micro-batches run by pipelining schedules"
    if engine.tp_overlap:
        words += ", tensor-parallel collectives overlapped with their GEMMs"
    if engine.state_layout == "megatron-bf16-grads":
        words += ", gradients reduced in bf16"
    elif engine.state_layout == "fsdp2":
        words += ", FSDP2 states (fp32 parameters and gradients, reduced in fp32)"
    elif engine.state_layout == "native":
        words += ", states in the training dtype (no master copy)"
    return f"{words} (= --engine {engine_setting(engine)})"


def engine_setting(engine: EngineSpec) -> str:
    """The shortest ``--engine`` value giving ``engine``: the preset with the fewest settings
    to override, then those settings (``megatron-core,moe_dispatcher=allgather``)."""
    def overrides(kw: dict) -> list[str]:
        base = EngineSpec(**kw)
        return [f"{f.name}={setting_text(getattr(engine, f.name))}" for f in fields(EngineSpec)
                if getattr(engine, f.name) != getattr(base, f.name)]
    name, extra = min(((n, overrides(kw)) for n, kw in PRESETS.items()),
                      key=lambda item: len(item[1]))
    return ",".join([name, *extra])


def setting_text(value) -> str:
    """A setting as ``--engine`` reads it back."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


BOOL_SETTINGS = tuple(f.name for f in fields(EngineSpec) if f.type in ("bool", bool))
NUMBER_SETTINGS = ("moe_imbalance", "moe_capacity_factor", "host_op_s", "moe_host_op_s")
"""The engine settings that are numbers (text is read as one)."""
"""The engine settings that are true or false (text such as true/false or on/off is read as such:
specs.read_bool)."""


def engine_from_mapping(spec: Mapping | str | None) -> EngineSpec:
    """``{"attention": "materialized"}``, ``"attention=materialized,kernels=eager"``, or a preset
    name (PRESETS) optionally followed by ``,k=v`` overrides: ``"megatron-core,attention=
    materialized"``."""
    if spec is None:
        return EngineSpec()
    if isinstance(spec, EngineSpec):
        return spec
    base: dict = {}
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        named = [p for p in parts if p in PRESETS]
        if len(named) > 1:
            raise SpecError(f"engine: one preset at most, got {', '.join(named)}; keep the one "
                            "you train with and give the settings it changes after it")
        later = [p.strip() for p in spec.split(",")[1:] if p.strip() in PRESETS]
        if later:
            settings = ",".join(p.strip() for p in spec.split(",")
                                if p.strip() and p.strip() != later[0])
            raise SpecError(f"engine: the preset '{later[0]}' comes first, then the settings "
                            f"it changes: write {later[0]},{settings}")
        head, _, rest = spec.partition(",")
        if "=" not in head:
            if head.strip() not in PRESETS:
                raise SpecError(f"engine: unknown preset '{head.strip()}'; choose from "
                                f"{', '.join(PRESETS)} or give k=v settings")
            base, spec = dict(PRESETS[head.strip()]), rest
        spec = parse_pairs(spec, where="engine", example="--engine attention=flash") if spec else {}
    elif not isinstance(spec, Mapping):
        raise SpecError(f"engine: expected a preset name, 'k=v,...' settings, a mapping or an "
                        f"EngineSpec, got a {type(spec).__name__}")
    names = {f.name for f in fields(EngineSpec)}
    unknown = set(spec) - names
    if unknown:
        raise unknown_key("engine", unknown, names)
    kw = {**base, **dict(spec)}
    return EngineSpec(**{key: read_setting(key, value) for key, value in kw.items()})


def read_setting(key: str, value):
    """One engine setting's value as the engine reads it: a name in lower case (CHOICES; an FP8
    recipe by Megatron-LM's name too, FP8_RECIPE_ALIASES),
    true or false (BOOL_SETTINGS, specs.read_bool), a number from text (NUMBER_SETTINGS);
    SpecError naming the setting where it is none of these."""
    if key in CHOICES and isinstance(value, str):
        value = value.strip().lower()
        return FP8_RECIPE_ALIASES.get(value, value) if key == "fp8_recipe" else value
    if key in BOOL_SETTINGS:
        return read_bool(value, f"engine.{key}")
    if key in NUMBER_SETTINGS and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            unit = " of seconds (50 us is 5e-05)" if key.endswith("_op_s") else ""
            raise SpecError(f"engine.{key}: expected a number{unit}, got {value!r}") from None
    return value


def outside_layers(engine: EngineSpec) -> EngineSpec:
    """The engine the blocks outside the repeated layers run under: eager kernels where fusion
    covers the layers only (``fused_scope="layers"``), the engine itself otherwise."""
    if engine.kernels == "fused" and engine.fused_scope == "layers":
        return replace(engine, kernels="eager")
    return engine

