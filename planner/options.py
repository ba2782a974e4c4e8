"""Frozen option dataclasses: the training spec, the search options, and one parallel configuration."""

from __future__ import annotations

import difflib
import math
import numbers
import re
from dataclasses import dataclass, field, fields, replace
from typing import Literal, Mapping, get_args

from costmodels.engine import EngineSpec, engine_from_mapping
from costmodels.memory import RECOMPUTE, Recompute
from costmodels.pipeline import SCHEDULES, Schedule
from costmodels.specs import parse_pairs, positive_int, read_bool
from planner.errors import SpecError

# The sets of choices, each listed once. Schedules and recomputation policies are the ones the cost
# model prices (costmodels.pipeline, costmodels.memory); the others are the planner's own.
Dtype = Literal["bf16", "fp16", "fp32", "fp8"]
"""fp8: FP8 GEMMs of weights with bf16 everything else (costmodels.precision)."""
DTYPES: tuple[str, ...] = get_args(Dtype)
Optimizer = Literal["adam", "adamw", "sgd"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
TABLE_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad", "adam")
"""Fused optimizers of embedding tables (FBGEMM's, as TorchRec names them)."""
PIPELINES = ("sparse-dist", "nested", "none")
"""How a recommendation model's step overlaps its sparse and dense parts (planner.search.tables)."""
ZeroStage = Literal[0, 1, 2, 3]
ZERO_STAGES: tuple[int, ...] = get_args(ZeroStage)
Placement = Literal["tp-pp-dp", "tp-dp-pp"]
"""Order of the mesh dimensions over ranks (planner.search.placement)."""
PLACEMENTS: tuple[str, ...] = get_args(Placement)
CpComm = Literal["p2p", "allgather", "a2a", "a2a+p2p"]
"""How context parallelism exchanges keys and values (costmodels.context): a ring of
point-to-point sends overlapped with attention (Liu et al., Ring Attention, 2023; Megatron-Core's
default), an all-gather of K/V (the Llama 3 paper, Dubey et al. 2024, §3.3.2), all-to-all over
heads (Jacobs et al., DeepSpeed-Ulysses, 2023), or all-to-all inside a node and a ring across."""
CP_COMMS: tuple[str, ...] = get_args(CpComm)
CP_COMM_ALIASES = {"all_gather": "allgather", "all-gather": "allgather"}
"""Other names of the forms: Megatron-LM's --cp-comm-type (Transformer Engine's) spells the
all-gather form all_gather, and the Megatron export writes it so."""
TraceMethod = Literal["auto", "fx", "export"]
"""auto: torch.export (the ATen graph), then torch.fx."""
TRACE_METHODS: tuple[str, ...] = get_args(TraceMethod)
AcrossSites = Literal["auto", "pipeline", "replicas"]
ACROSS_SITES: tuple[str, ...] = get_args(AcrossSites)
FIX_KEYS = ("dp", "tp", "pp", "vpp", "cp", "cp_comm", "ep", "etp", "micro_batch", "schedule",
            "recompute", "zero", "sequence_parallel", "offload_optimizer", "placement")
"""Knobs a person may pin (--fix)."""
MAX_MICROBATCHES = 16384
"""Most micro-batches per step and replica a plan may have: its schedule lists every one for every
pipeline rank, and the simulator steps through each (gradient accumulation beyond this is not a
plan people run; take larger micro-batches or more replicas)."""
KNOBS = ("dp", "tp", "pp", "vpp", "cp", "cp_comm", "ep", "etp", "micro_batch",
         "num_microbatches", "schedule", "recompute", "zero", "sequence_parallel",
         "offload_optimizer", "placement")
"""Every field of a Config, in the order people read them (plan diffs, sweep columns)."""


MAX_TRAINING = {"global_batch": 2 ** 30, "seq_len": 2 ** 30}
"""The largest global batch and sequence accepted (1,073,741,824 samples or tokens; today's runs
take a few thousand sequences of up to a few million tokens): beyond them a value is a typo, and
the search would enumerate its divisors for minutes (a new-user check's 10^17 ran past ten
minutes, its time limit unheeded)."""


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    """What is trained, independent of how it is split."""

    global_batch: int
    """Samples (sequences) per optimizer step, summed over data-parallel replicas."""
    seq_len: int
    """Tokens per sample."""
    dtype: Dtype = "bf16"
    """Compute dtype: bf16 or fp16 (mixed precision with fp32 master weights), fp32, or fp8 (the
    GEMMs of weights in FP8, Transformer Engine style; costmodels.precision)."""
    optimizer: Optimizer = "adam"
    """adam / adamw (two fp32 moments) or sgd (one)."""
    engine: EngineSpec = field(default_factory=EngineSpec)
    """The software's kernels and overlap (costmodels.engine): an EngineSpec, or what
    ``--engine`` takes (a preset name such as ``"torchtitan"``, ``k=v`` settings after it, or a
    mapping of settings)."""

    def __post_init__(self):
        if isinstance(self.engine, (str, Mapping)):
            object.__setattr__(self, "engine", engine_spec(self.engine))
        elif not isinstance(self.engine, EngineSpec):
            raise SpecError(f"engine: expected an EngineSpec, a preset name or a mapping of "
                            f"settings, got {type(self.engine).__name__}")
        for name in ("global_batch", "seq_len"):  # (numpy's integers too, as plain ints)
            object.__setattr__(self, name, positive_int(getattr(self, name), name))
            most = MAX_TRAINING[name]
            if getattr(self, name) > most:  # (the search enumerates its divisors)
                raise SpecError(f"{name}: {getattr(self, name):,} is more than the {most:,} "
                                f"accepted; give a {name.replace('_', ' ')} below it")
        check_dtype(self.dtype)
        if self.optimizer not in OPTIMIZERS:
            raise SpecError(f"optimizer: unknown optimizer '{self.optimizer}'; use one of "
                            f"{', '.join(OPTIMIZERS)}")


def parallel_text(p: Mapping, tables: bool | None = None) -> str:
    """A configuration in one line, ``dp=8 tp=2+sp pp=4x2 cp=2(p2p) ep=4 etp=2 mb=1x16 1f1b
    rc=none zero=3+offload``, from a mapping of its knobs (KNOBS: a Config's fields, a plan's
    ``parallel``, a what-if row): virtual stages, cp, ep, etp and offloading only where used
    (etp alone: the experts' matrices split without spreading them); a plan's replicate groups
    across sites as ``dp=8(2 sites)``. A recommendation model's (``tables``; None: where the
    mapping names its tables, as a what-if row does) is its dense part's data parallelism alone,
    ``dense DDP x8, local batch 8192``: it has no stages, tensor split or recomputation."""
    if tables or (tables is None and p.get("tables")):
        return (f"dense {'FSDP2' if p.get('zero') == 3 else 'DDP'} x{p['dp']}, local batch "
                f"{p['micro_batch'] * p['num_microbatches']}")

    def used(key: str) -> int:
        return p.get(key) or 1
    sp = "+sp" if p.get("sequence_parallel") else ""
    chunks = f"x{used('vpp')}" if used("vpp") > 1 else ""
    cp = f" cp={used('cp')}({p.get('cp_comm') or 'p2p'})" if used("cp") > 1 else ""
    ep = (f" ep={used('ep')}" if used("ep") > 1 else "") + \
        (f" etp={used('etp')}" if used("etp") > 1 else "")
    off = "+offload" if p.get("offload_optimizer") else ""
    sites = f"({used('dp_replicate')} sites)" if used("dp_replicate") > 1 else ""
    return (f"dp={p['dp']}{sites} tp={p['tp']}{sp} pp={p['pp']}{chunks}{cp}{ep} mb={p['micro_batch']}x"
            f"{p['num_microbatches']} {p['schedule']} rc={p['recompute']} zero={p['zero']}{off}")


def zero_runs_with_cp(runs, zero: int, *, ep: int) -> bool:
    """Whether ``runs`` (SearchOptions, or a target's planner.targets.Engine: both carry
    ``zero_with_cp`` and ``zero3_with_cp_ep``) shards as ZeRO-``zero`` with context parallelism,
    with ``ep`` expert-parallel ranks."""
    return zero in runs.zero_with_cp and not (zero == 3 and ep > 1 and not runs.zero3_with_cp_ep)


def zb_split_lost(runs, schedule: str, recompute: str, pp: int) -> bool:
    """Whether ``runs`` (SearchOptions, or a target's planner.targets.Engine: both carry
    ``zb_with_recompute``) computes zb-h1's weight gradients inside B: with a pipeline, in
    recomputed blocks, where its split backward cannot replay the recomputation."""
    return schedule == "zb-h1" and pp > 1 and recompute != "none" and not runs.zb_with_recompute


def same_data_parallelism(tp: int, cp: int, ep: int, etp: int, *, experts: bool) -> bool:
    """Whether the experts' data-parallel degree equals the attention's: ep x etp = tp x cp
    (Megatron-Core takes etp = tp in a model without experts; SearchOptions.pp_inner_same_dp)."""
    return (ep * etp if experts else tp) == tp * cp


PP_INNER = "placement tp-pp-dp with a pipeline not run by the target (its mesh puts pp outermost)"
PP_INNER_SAME_DP = ("placement tp-pp-dp with a pipeline needs as many expert as attention "
                    "data-parallel ranks (ep x etp = tp x cp) in Megatron-Core")
PP_INNER_DENSE_CP = ("placement tp-pp-dp with a pipeline needs cp = 1 in Megatron-Core (it lays "
                     "out expert groups for a model without experts too, of etp = tp ranks, and "
                     "their data-parallel ranks must match the attention's tp x cp)")
PP_INNER_EXPERTS = ("placement tp-pp-dp with a pipeline and ep > 1 not run by the target (its "
                    "expert groups take a stage's ranks to be consecutive)")


def pp_inner_refused(runs, *, pp: int, dp: int, tp: int, cp: int, ep: int, etp: int,
                     experts: bool) -> str:
    """Why ``runs`` (SearchOptions, or a target's planner.targets.Engine: both carry
    ``pp_inner``, ``pp_inner_same_dp`` and ``pp_inner_with_experts``) cannot place this configuration as
    tp-pp-dp (pipeline neighbours on adjacent ranks), or '' when it can."""
    if pp == 1 or dp == 1:
        return ""
    if not runs.pp_inner:
        return PP_INNER
    if runs.pp_inner_same_dp and not same_data_parallelism(tp, cp, ep, etp, experts=experts):
        return PP_INNER_SAME_DP if experts else PP_INNER_DENSE_CP
    if not runs.pp_inner_with_experts and ep > 1:
        return PP_INNER_EXPERTS
    return ""


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """How the search runs."""

    fix: Mapping[str, object] = field(default_factory=dict)
    """Pinned knobs (any of FIX_KEYS); validated by parse_fix."""
    top_k: int = 3
    """Alternatives kept besides the best plan."""
    time_limit_s: float | None = None
    """Stop the search after this many seconds and return the best plan found so far (it goes on
    past the limit until a configuration that fits has been priced)."""
    schedules: tuple[Schedule, ...] = SCHEDULES
    """Pipeline schedules to consider."""
    vpp: tuple[int, ...] = (2, 3, 4, 6, 8, 12, 16)
    """Model chunks per rank tried with interleaved 1F1B (12 and 16 since an expert review found
    GPT-3 175B's 96 layers over 8 ranks 0.8% faster at one layer a chunk than at the search's
    best of 2-8, with less memory)."""
    recompute: tuple[Recompute, ...] = ("none", "selective", "moe_act", "mla_up_proj",
                                        "mla_up_proj+moe_act", "full/4", "full/2", "full")
    """Activation recomputation policies to consider (``moe_act`` for models with routed experts
    only, ``mla_up_proj`` for models with multi-head latent attention only, both together for
    models with both; ``full/4`` and ``full/2``, every fourth or second layer recomputed whole,
    for models of at least 4 and 2 layers; ``op``, torchtitan's op-level policy, when pinned or
    for --target torchtitan)."""
    zero: tuple[ZeroStage, ...] = ZERO_STAGES
    """ZeRO stages to consider (3 = fully sharded, FSDP)."""
    zero_with_pp: tuple[ZeroStage, ...] = ZERO_STAGES
    """ZeRO stages to consider together with pipeline parallelism (DeepSpeed runs 0-1 only)."""
    offload: tuple[bool, ...] = (False, True)
    """Whether to consider keeping optimizer states in host memory (ZeRO-Offload)."""
    sequence_parallel: tuple[bool, ...] = (False, True)
    """With tensor parallelism: sequence parallelism off and/or on."""
    cp_comms: tuple[CpComm, ...] = CP_COMMS
    """Forms of context-parallel K/V exchange to consider (with cp > 1)."""
    cp_comms_windowed: tuple[CpComm, ...] = CP_COMMS
    """The forms the target runs for a model with sliding-window attention."""
    cp_comms_sinks: tuple[CpComm, ...] = CP_COMMS
    """The forms the target runs for a model with attention sinks (gpt-oss)."""
    cp_comms_latent: tuple[CpComm, ...] = CP_COMMS
    """The forms the target runs for a model whose attention keys are wider than its values
    (multi-head latent attention: DeepSeek-V2/V3)."""
    cp_min_tokens: int = 4096
    """The search tries context parallelism only while each cp rank keeps at least this many
    tokens of a sequence (a pinned cp is priced however short its chunks): below it attention is
    a small share of the work, and the published long-context recipes start context parallelism
    at 32k tokens (NeMo's performance_long_sequence.md)."""
    cp_with_tp_pp: bool = True
    """Whether context parallelism may combine with tensor or pipeline parallelism (DeepSpeed's
    Ulysses builds its mesh from data and sequence parallelism only)."""
    tp_with_pp: bool = True
    """Whether tensor parallelism may combine with pipeline parallelism (DeepSpeed's AutoTP does
    not combine with its PipelineModule)."""
    cp_kv_copies: bool = True
    """Whether the all-to-all exchange (cp_comm=a2a) may copy key/value heads when tp x cp
    exceeds them, a multiple of them (DeepSpeed's UlyssesSPAttentionHF repeats each head that
    many times before its all-to-all; Transformer Engine's needs the heads divisible): the
    copies' bytes cross the all-to-all (planner.search.costs)."""
    cp_load_balanced: bool = True
    """Whether context parallelism cuts each sequence into 2 x cp chunks, two per rank (causal
    load balancing: Megatron-Core, Transformer Engine, torch's context_parallel), so the sequence
    must divide by 2 x cp; False: cp contiguous shards (DeepSpeed's Ulysses, balanced by its
    all-to-all over heads), the sequence divisible by cp."""
    expert_parallel: bool = True
    """Whether routed experts may be spread over ranks (ep > 1)."""
    expert_tensor_parallel: bool = True
    """Whether the experts' matrices may be split over the tp ranks (etp = tp > 1)."""
    ep_with_tp: bool = True
    """Whether expert parallelism (ep > 1) may run beside tensor parallelism (tp > 1)."""
    tp_inner_weights: bool = True
    """Whether tensor parallelism may split regions that hold weights of their own (per-head
    norms, attention sinks; planner.trace.graph.Block.tp_inner_weights)."""
    tp_other_modules: bool = True
    """Whether tensor parallelism may split modules other than torch.nn.Linear and
    torch.nn.Embedding (GPT-2's Conv1D; planner.trace.graph.BlockGraph.tp_other_modules)."""
    zb_with_recompute: bool = True
    """Whether zb-h1 may run with activation recomputation (its W actions computing the weight
    gradients of recomputed blocks apart from B)."""
    etp_with_expert_bias: bool = True
    """Whether experts with biases (gpt-oss) may split their matrices (etp > 1); Megatron-Core
    asserts "Bias in Moe is only supported when ETP==1"."""
    op_recompute_with_ep: bool = True
    """Whether op-level recomputation may go with ep > 1: False where the target's op-level
    checkpointing of this model replays the expert all-to-alls (targets.Engine.op_saves_all_to_all),
    which the pricing does not (it keeps their outputs)."""
    zero_with_cp: tuple[ZeroStage, ...] = ZERO_STAGES
    """ZeRO stages to consider together with context parallelism (torchtitan shards whenever cp
    > 1: 2 and 3 only)."""
    zero3_with_cp_ep: bool = True
    """Whether ZeRO-3 may combine with both context and expert parallelism (DeepSpeed's AutoEP
    refuses it under Ulysses)."""
    zero0_with_others: bool = True
    """Whether ZeRO-0 (plain data parallelism) may combine with tensor, pipeline, context or
    expert parallelism (torchtitan 0.2.2's DDP: "DDP has not supported > 1D parallelism")."""
    pp_inner_same_dp: bool = False
    """Whether placement ``tp-pp-dp`` with a pipeline needs the experts' data-parallel degree
    equal to the attention's (ep x etp = tp x cp; etp is tp in a model without experts):
    Megatron-Core's initialize_model_parallel asserts it for any order not ending in pp."""
    pp_inner: bool = True
    """Whether placement ``tp-pp-dp`` (pipeline neighbours on adjacent ranks) may be used with a
    pipeline and data parallelism (torchtitan orders its device mesh pp, dp_replicate, dp_shard,
    cp, tp, outermost first: tp-dp-pp only)."""
    pp_inner_with_experts: bool = True
    """Whether placement ``tp-pp-dp`` with a pipeline may combine with expert parallelism
    (DeepSpeed 0.19.8 builds its expert groups from consecutive ranks of a stage,
    utils/groups.py, so its stages must be blocks of consecutive ranks: tp-dp-pp)."""
    experts_split_without_ep: bool = False
    """Whether, with ep = 1 and tp > 1, the target splits the experts' matrices over the tp ranks
    whatever etp says (etp = tp): torchtitan 0.2.2's apply_moe_ep_tp takes the tp mesh for the
    experts when there is no ep mesh."""
    mixed_precision_needs_sharding: bool = False
    """Whether, with tensor or pipeline parallelism, the target trains in the plan's 16-bit (or
    FP8) dtype only where the model states are sharded over dp x cp > 1: torchtitan 0.2.2's
    maybe_enable_amp turns mixed precision off without FSDP when tp or pp is on (fp32 training)."""
    seq_split_2cp_tp: bool = False
    """Whether the target needs the sequence divisible by tp x 2 x cp even with cp = 1
    (torchtitan 0.2.2's ParallelDims.seq_len_divisor, asserted by its parallelize functions)."""
    ep_needs_sharding: bool = False
    """Whether experts may spread over ranks (ep > 1) only with data or context parallelism to
    shard over (dp x cp > 1): torchtitan 0.2.2's deepseek_v3, gpt_oss and llama4 parallelize
    functions fetch the FSDP mesh whenever ep > 1, and it does not exist at size 1."""
    target: str = "any"
    """The engine the plan is for (planner.targets): ``any`` prices every configuration."""
    memory_reserve_fraction: float = 0.05
    """Fraction of device memory kept free for allocator fragmentation."""
    memory_reserve_bytes: float = 1.0e9
    """Bytes kept free for the CUDA context, NCCL buffers and library workspaces."""
    trace: TraceMethod = "auto"
    """Tracer: auto (torch.export, then torch.fx), fx or export."""
    across_sites: AcrossSites = "auto"
    """On sites of one kind: the pipeline over the sites (``pipeline``), one site's plan on each,
    data parallel across them (``replicas``: planner.search.replicas), or the faster (``auto``)."""
    cpsat_time_limit_s: float = 10.0
    """Seconds CP-SAT may spend on one candidate's stage split (DAG stage assignment, device
    groups) when the search has no time limit; with one, the time left is shared instead."""
    cpsat_seed: int = 0
    """CP-SAT's random seed (one worker: the same inputs give the same plan)."""
    layout: str | None = None
    """The pipeline's stages pinned in Megatron-LM's notation (--pipeline-model-parallel-layout,
    parse_layout): ``Et*4|(t*4|)*14tmL`` is 16 stages (pp x vpp), the embedding and 4 layers on
    the first, 4 layers on each of the next 14, a layer, the MTP depth and the head on the last;
    None: the search splits the blocks itself."""

    @property
    def reserve_changed(self) -> bool:
        """Whether the memory kept free per device is not the default (--memory-reserve-*)."""
        return (self.memory_reserve_fraction, self.memory_reserve_bytes) != (
            SearchOptions.memory_reserve_fraction, SearchOptions.memory_reserve_bytes)

    def __post_init__(self):
        for name in ("top_k", "cp_min_tokens"):  # (numpy's integers too, as plain ints)
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise SpecError(f"{name}: expected an integer >= 0, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.time_limit_s is not None and not (_number(self.time_limit_s) and
                                                  self.time_limit_s > 0):
            raise SpecError(f"time_limit_s: expected a positive number, got {self.time_limit_s!r}")
        if not (_number(self.cpsat_time_limit_s) and self.cpsat_time_limit_s > 0):
            raise SpecError(f"cpsat_time_limit_s: expected a positive number of seconds, got "
                            f"{self.cpsat_time_limit_s!r}")
        if not (_number(self.memory_reserve_fraction) and 0 <= self.memory_reserve_fraction < 1):
            raise SpecError(f"memory_reserve_fraction: expected a number in [0, 1), got "
                            f"{self.memory_reserve_fraction!r}")
        if not (_number(self.memory_reserve_bytes) and self.memory_reserve_bytes >= 0):
            raise SpecError(f"memory_reserve_bytes: expected a number >= 0, got "
                            f"{self.memory_reserve_bytes!r}")
        for name, allowed in (("schedules", SCHEDULES), ("recompute", RECOMPUTE),
                              ("zero", ZERO_STAGES), ("zero_with_pp", ZERO_STAGES),
                              ("offload", (False, True)), ("sequence_parallel", (False, True)),
                              ("cp_comms", CP_COMMS)):
            values = getattr(self, name)
            if isinstance(values, (str, bytes)) or not isinstance(values, (tuple, list)) or \
                    not values or any(v not in allowed or isinstance(v, bool) != isinstance(
                        allowed[0], bool) for v in values):
                raise SpecError(f"{name}: expected a non-empty tuple of "
                                f"{', '.join(map(str, allowed))}; got {values!r}")
        if self.across_sites not in ACROSS_SITES:
            raise SpecError(f"across_sites: expected one of {', '.join(ACROSS_SITES)}, got "
                            f"{self.across_sites!r}")
        if self.trace not in TRACE_METHODS:
            raise SpecError(f"trace: unknown method {self.trace!r}; choose "
                            f"{', '.join(TRACE_METHODS)}")
        for name in ("cp_comms_windowed", "cp_comms_sinks", "cp_comms_latent"):  # may be empty
            forms = getattr(self, name)
            if not isinstance(forms, (tuple, list)) or any(v not in CP_COMMS for v in forms):
                raise SpecError(f"{name}: expected a tuple of {', '.join(CP_COMMS)}; got "
                                f"{forms!r}")
        if not isinstance(self.vpp, (tuple, list)) or not self.vpp or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.vpp):
            raise SpecError(f"vpp: expected a non-empty tuple of positive integers, got "
                            f"{self.vpp!r}")
        object.__setattr__(self, "fix", parse_fix(self.fix))  # checked: knob names and values
        if self.layout is not None:
            parse_layout(self.layout)


def check_dtype(dtype) -> None:
    """SpecError unless ``dtype`` is one of DTYPES."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise SpecError(f"dtype: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _policy_order(text: str) -> str:
    """A recompute policy of several modules in whatever order they are named
    (``moe_act+mla_up_proj``) as RECOMPUTE spells it (``mla_up_proj+moe_act``); else ``text``."""
    parts = sorted(text.split("+"))
    return next((r for r in RECOMPUTE if sorted(r.split("+")) == parts), text)


def reserve_options(fraction: float | None = None, gb: float | None = None, *,
                    recsys: bool = False) -> dict:
    """SearchOptions fields for the memory kept free per device, from the API's and CLI's units
    (``fraction`` of the memory, ``gb`` GB besides; None: the default), each to the plan file's
    precision (6 significant digits), so that the search keeps free what the plan records.
    SpecError for a GB figure that is not a finite number >= 0 (SearchOptions checks the
    fraction), and for either given for a recommendation model (``recsys``), whose table
    sharding has no such search."""
    out = {}
    if fraction is not None:
        if isinstance(fraction, float) and math.isfinite(fraction):
            fraction = float(f"{fraction:.6g}")
        out["memory_reserve_fraction"] = fraction
    if gb is not None:
        if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not math.isfinite(gb) \
                or gb < 0:
            raise SpecError(f"memory_reserve_gb: expected a number of GB >= 0 (1 by default: "
                            f"the CUDA context, NCCL buffers and library workspaces), got {gb!r}")
        out["memory_reserve_bytes"] = float(f"{float(gb) * 1e9:.6g}")
    if out and recsys:
        name = next(iter(out)).replace("_bytes", "_gb")
        raise SpecError(f"{name} (--{name.replace('_', '-')}): applies to the search of dense "
                        "models, not to a recommendation model's table sharding; leave it out")
    return out


@dataclass(frozen=True, kw_only=True)
class Config:
    """One parallel configuration: a point of the search space."""

    dp: int
    """Data-parallel replicas."""
    tp: int
    """Tensor-parallel degree (GPUs sharing each layer)."""
    pp: int
    """Pipeline ranks."""
    micro_batch: int
    """Samples per micro-batch."""
    num_microbatches: int
    """Micro-batches per optimizer step on each replica (global batch = dp x this x micro_batch)."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule."""
    recompute: Recompute = "none"
    """Activation recomputation of the repeated layers."""
    zero: ZeroStage = 0
    """ZeRO stage: 1 shards optimizer states over dp, 2 also gradients, 3 also weights (FSDP)."""
    sequence_parallel: bool = False
    """Shard the norms' and dropouts' activations over tp (reduce-scatter + all-gather)."""
    vpp: int = 1
    """Model chunks per pipeline rank (interleaved 1F1B), 1 otherwise."""
    offload_optimizer: bool = False
    """Optimizer states and step in host memory (ZeRO-Offload)."""
    placement: Placement = "tp-pp-dp"
    """Order of the mesh dimensions over consecutive ranks, innermost first."""
    cp: int = 1
    """Context-parallel degree: each sample's sequence split over cp ranks (2 cp chunks, so that
    causal attention's work is balanced); dp x cp x tp x pp = GPUs."""
    cp_comm: CpComm = "p2p"
    """How the cp ranks exchange keys and values (CP_COMMS); meaningful when cp > 1."""
    ep: int = 1
    """Expert-parallel degree: the routed experts spread over ep ranks drawn from the tp x cp x dp
    ranks (Megatron-Core's parallel folding); 1 for dense models."""
    etp: int = 1
    """Tensor-parallel degree of the experts' matrices (may differ from tp). The expert
    data-parallel degree follows: tp x cp x dp / (ep x etp)."""

    @property
    def edp(self) -> int:
        """Replicas of each expert (the group reducing the experts' gradients)."""
        return max(1, self.tp * self.cp * self.dp // (self.ep * self.etp))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def short(self) -> str:
        return parallel_text({f.name: getattr(self, f.name) for f in fields(self)})

    def with_(self, **kw) -> "Config":
        return replace(self, **kw)


Objective = Literal["makespan", "weighted"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)


@dataclass(frozen=True, kw_only=True)
class ScheduleOptions:
    """How the joint schedule of many jobs is solved (planner.solve.job_schedule)."""

    objective: Objective = "makespan"
    """makespan, or weighted (sum of priority x completion time)."""
    time_limit_s: float = 30.0
    """Seconds for CP-SAT; the best schedule found by then is returned."""
    time_unit_s: float | None = None
    """Grid resolution in seconds; None: 1, 2 or 5 x 10^k s, about 10,000 steps over the horizon
    (planner.solve.job_queue.GRID_STEPS)."""
    seed: int = 0
    """CP-SAT random seed."""
    workers: int = 1
    """CP-SAT search workers; one makes the answer repeatable (same inputs, same schedule)."""

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise SpecError(f"objective: unknown '{self.objective}'; use makespan or weighted")
        for key in ("time_limit_s", "time_unit_s"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise SpecError(f"{key}: expected seconds > 0, got {value!r}")


LAYOUT_EXAMPLE = "Et*4|(t*4|)*14tmL"
"""A pipeline layout in Megatron-LM's notation (DeepSeek-V3's on 16 stages)."""
LAYOUT_FOR_RECSYS = ("layout: pins the pipeline stages of a layer stack; a recommendation model's "
                     "tables are sharded, not pipelined: leave it out")
"""Why a recommendation model takes no layout (planner.plan, planner.whatif)."""
LAYOUT_MAX = 100_000
"""Most symbols a layout may expand to (stages and layers of any real model are far fewer)."""


def parse_layout(text) -> tuple[str, ...]:
    """Megatron-LM's pipeline layout notation -> one string per stage over ``E`` (the embedding
    side), ``t`` (a layer), ``m`` (an MTP depth) and ``L`` (the head side, with the loss):
    ``|`` ends a stage, ``x*n`` and ``(...)*n`` repeat, commas are cosmetic (as in Megatron-LM,
    which refuses spaces, as this does: ``t*1 6`` is no repeat count). The embedding opens the
    first stage and the head closes the last; MTP depths come after every layer and before the
    head, all on one stage: the head's (``tmL``) or one of their own (``m|L``, as Megatron-LM
    places them), and no stage is empty (Megatron-LM runs one). SpecError naming the fix
    otherwise."""
    def bad(why: str) -> SpecError:
        return SpecError(f"layout: {why}; e.g. {LAYOUT_EXAMPLE} (E embedding, t layer, m MTP "
                         "depth, L head and loss, | stage boundary, *n repeats)")

    if not isinstance(text, str) or not text.strip():
        raise bad(f"expected a layout string, got {text!r}")
    s = text.strip().replace(",", "")
    if re.search(r"\s", s):
        raise bad(f"spaces are not part of the notation (Megatron-LM refuses them too): remove "
                  f"them from {text!r}")
    odd = sorted(set(re.sub(r"[EtmL|()*0-9]", "", s)))
    if odd:
        raise bad(f"unknown symbols {' '.join(map(repr, odd))} in {text!r}")

    def repeated(m: re.Match) -> str:
        if len(m.group(1)) * int(m.group(2)) > LAYOUT_MAX:
            raise bad(f"{m.group(0)!r} repeats past {LAYOUT_MAX:,} symbols")
        return m.group(1) * int(m.group(2))

    group = re.compile(r"\(([^()]*)\)\*([0-9]+)")
    while "(" in s or ")" in s:
        expanded = group.sub(repeated, s)
        if expanded == s:
            raise bad(f"unbalanced or unrepeated parentheses in {text!r}")
        s = expanded
        if len(s) > LAYOUT_MAX:
            raise bad(f"it expands past {LAYOUT_MAX:,} symbols")
    s = re.sub(r"([EtmL])\*([0-9]+)", repeated, s)
    if len(s) > LAYOUT_MAX:
        raise bad(f"it expands past {LAYOUT_MAX:,} symbols")
    if "*" in s:
        raise bad(f"a repeat (*n) follows no symbol or group in {text!r}")
    stages = tuple(s.split("|"))  # (a trailing '|' opens an empty last stage, as in Megatron)
    if any(not st for st in stages):
        raise bad(f"an empty stage in {text!r} (Megatron-LM runs one with no layers; the "
                  "planner's stages hold at least one block)")
    if s.count("E") != 1 or not stages[0].startswith("E"):
        raise bad("the embedding (E) opens the first stage, once")
    if s.count("L") != 1 or not stages[-1].endswith("L"):
        raise bad("the head and loss (L) close the last stage, once")
    if "m" in s and not re.fullmatch(r"Et*m+L", s.replace("|", "")):
        raise bad("MTP depths (m) run after every layer and before the head: put them after "
                  "the last t, before L (on its stage, or on a stage of their own: m|L)")
    if sum("m" in st for st in stages) > 1:
        raise bad("MTP depths (m) run on one stage (Megatron-LM's rule): put every m on the "
                  "same stage")
    return stages


def fix_text(pins: Mapping) -> str:
    """Pinned knobs as a --fix argument that parse_fix reads back: ``tp=8,sequence_parallel=true``
    (booleans in lower case)."""
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in pins.items())


def parse_fix(fix, where: str = "fix", example: str = "--fix tp=8,pp=4") -> dict:
    """``"tp=8,pp=4"`` or a mapping -> validated dict of pinned knobs; errors name ``where``
    (the option the knobs came from: fix, why, vary) and show ``example``."""
    if fix is None:
        return {}
    if isinstance(fix, str):
        fix = parse_pairs(fix, where=where, example=example)
    if not isinstance(fix, Mapping):
        raise SpecError(f"{where}: expected a mapping or 'k=v,...', got {type(fix).__name__}")
    out = {}
    for key, value in fix.items():
        again = " to plan solve (re-plan)" if where == "why" else ""
        if key in _ENGINE_KEYS:
            raise SpecError(f"{where}.{key}: an engine setting, not a parallelism knob; give it "
                            f"with --engine {key}={value}{again}")
        if key in _RUN_FLAGS:
            raise SpecError(f"{where}.{key}: a setting of the run, not a parallelism knob; give "
                            f"it with {_RUN_FLAGS[key]} {value}{again}")
        if key == "num_microbatches":
            raise SpecError(f"{where}.num_microbatches: follows from the global batch, dp and "
                            "micro_batch; pin micro_batch (and dp) instead")
        if str(key).lower().replace("-", "_").removesuffix("_size") in (
                "edp", "expert_data_parallel"):
            raise SpecError(f"{where}.{key}: the expert data-parallel degree follows from the "
                            "others (dp x cp x tp / (ep x etp)); pin ep and etp (and dp) "
                            "instead")
        if key == "sharding":  # (a knob of recommendation models' tables, read apart)
            raise SpecError(f"{where}.sharding: applies to recommendation models' embedding "
                            "tables; a dense model is split with dp, tp, pp, cp and ep")
        if key not in FIX_KEYS:
            raise SpecError(_unknown_knob(key, value, where))
        out[key] = _fix_value(key, value, where)
    return out


_KNOB_NAMES = {"data_parallel": "dp", "tensor_parallel": "tp", "pipeline_parallel": "pp",
               "virtual_pipeline": "vpp", "context_parallel": "cp", "expert_parallel": "ep",
               "expert_model_parallel": "ep", "expert_tensor_parallel": "etp", "mbs": "micro_batch",
               "microbatch": "micro_batch", "micro_batch_size": "micro_batch",
               "sp": "sequence_parallel", "zero_stage": "zero", "activation_checkpointing":
               "recompute", "pp_schedule": "schedule", "cp_comm_type": "cp_comm",
               "tensor_model_parallel": "tp", "pipeline_model_parallel": "pp",
               "virtual_pipeline_model_parallel": "vpp", "data_parallel_shard": "dp",
               "data_parallel_replicate": "dp"}
"""What people call the knobs elsewhere (Megatron's and torchtitan's flag names, shorthands),
for the hint after an unknown one (matched on the lowercased name, any '-size' / '_size' dropped)."""


def knob_meant(key) -> str | None:
    """The knob (FIX_KEYS) another name stands for: Megatron's and torchtitan's flag names and
    shorthands (``tensor_parallel``, ``mbs``), in any case, with '-size' or '-degree'; None."""
    plain = str(key).lower().replace("-", "_").removesuffix("_size").removesuffix("_degree")
    return plain if plain in FIX_KEYS else _KNOB_NAMES.get(plain)


def _unknown_knob(key: str, value, where: str) -> str:
    """The one-line error for a knob not in FIX_KEYS: the knob or engine setting meant, where one
    is close, else the list."""
    plain = str(key).lower().replace("-", "_").removesuffix("_size").removesuffix("_degree")
    again = " to plan solve (re-plan)" if where == "why" else ""
    meant = knob_meant(key)
    if meant:
        return f"{where}: unknown knob '{key}'; did you mean {meant}={value}?"
    if plain in _RUN_FLAGS:  # global_batch_size: a setting of the run
        return (f"{where}: unknown knob '{key}'; a setting of the run, given with "
                f"{_RUN_FLAGS[plain]} {value}{again}")
    close = difflib.get_close_matches(plain, FIX_KEYS, n=2, cutoff=0.75)
    if close:
        return f"{where}: unknown knob '{key}'; did you mean " + (
            f"{close[0]}={value}?" if len(close) == 1 else f"{' or '.join(close)}?")
    engine = [name for name in _ENGINE_KEYS if plain in name.split("_")] or \
        difflib.get_close_matches(plain, sorted(_ENGINE_KEYS), n=1, cutoff=0.75)
    if len(engine) == 1:
        return (f"{where}: unknown knob '{key}'; the engine setting {engine[0]} is given with "
                f"--engine {engine[0]}={value}{again}")
    return f"{where}: unknown knob '{key}'; choose from {', '.join(FIX_KEYS)}"


_ENGINE_KEYS = frozenset(f.name for f in fields(EngineSpec))
_RUN_FLAGS = {"seq_len": "--seq-len", "global_batch": "--global-batch", "dtype": "--dtype",
              "optimizer": "--optimizer", "nodes": "--nodes", "gpus_per_node": "--gpus-per-node",
              "target": "--target"}
"""Settings of the run that people give as knobs (or engine settings) by mistake, and the option
that takes them."""


def engine_spec(spec) -> EngineSpec:
    """``costmodels.engine.engine_from_mapping``, with a parallelism knob given as an engine
    setting named as such (``--engine ep=8``: give it with --fix)."""
    pairs = dict(p.split("=", 1) for p in spec.replace(" ", "").split(",") if "=" in p) \
        if isinstance(spec, str) else spec if isinstance(spec, Mapping) else {}
    for key in pairs:
        if key in FIX_KEYS and key not in _ENGINE_KEYS:
            raise SpecError(f"engine.{key}: a parallelism knob, not an engine setting; give it "
                            f"with --fix {key}={pairs[key]}")
        if key in _RUN_FLAGS and key not in _ENGINE_KEYS:
            raise SpecError(f"engine.{key}: a setting of the run, not an engine setting; give "
                            f"it with {_RUN_FLAGS[key]} {pairs[key]}")
    return engine_from_mapping(spec)


def _fix_value(key: str, value, where: str = "fix"):
    if key in ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "zero"):
        try:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            v = int(value)
        except (TypeError, ValueError, OverflowError):
            raise SpecError(f"{where}.{key}: expected a whole number, got {value!r}; e.g. "
                            f"{key}={2 if key != 'zero' else 1}") from None
        if key == "zero" and v not in ZERO_STAGES:
            raise SpecError(f"{where}.zero: expected 0, 1, 2 or 3, got {value!r}")
        if key != "zero" and v < 1:
            raise SpecError(f"{where}.{key}: expected a positive integer, got {value!r}")
        return v
    if key == "schedule":
        if str(value) not in SCHEDULES:
            raise SpecError(f"{where}.schedule: unknown schedule '{value}'; choose {', '.join(SCHEDULES)}")
        return str(value)
    if key == "placement":
        if str(value) not in PLACEMENTS:
            raise SpecError(f"{where}.placement: expected {' or '.join(PLACEMENTS)}, got {value!r}")
        return str(value)
    if key == "cp_comm":
        value = CP_COMM_ALIASES.get(str(value), value)
        if str(value) not in CP_COMMS:
            raise SpecError(f"{where}.cp_comm: unknown form '{value}'; choose {', '.join(CP_COMMS)}")
        return str(value)
    if key == "recompute":
        value = _policy_order(str(value))
        if value not in RECOMPUTE:
            raise SpecError(f"{where}.recompute: expected {', '.join(RECOMPUTE[:-1])} or "
                            f"{RECOMPUTE[-1]}, got {value!r}")
        return str(value)
    return read_bool(value, f"{where}.{key}")
