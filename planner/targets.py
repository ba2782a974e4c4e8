"""What each training engine runs: the knobs a plan made for it (``--target``) may use.

A plan is only useful if an engine can run it. ``any`` searches every configuration the cost
model prices; each other target narrows the search to what that engine offers, so the plan needs
no translation that changes its cost. The facts are per engine release (``version``, the release
the exports target by default) and cited in docs/exports.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from costmodels.memory import modules_of
from costmodels.pipeline import SCHEDULES, Schedule
from planner.errors import SpecError
from planner.options import (CP_COMMS, FIX_KEYS, ZERO_STAGES, SearchOptions, pp_inner_refused,
                             zb_split_lost)

DEFAULT_RECOMPUTE = SearchOptions().recompute
"""The forms a search tries when the caller names none (a target replaces them by its own)."""


@dataclass(frozen=True, kw_only=True)
class Engine:
    """The configurations one engine release runs."""

    name: str
    version: str
    """The release this table describes and the exports target by default."""
    schedules: tuple[Schedule, ...] = SCHEDULES
    """Pipeline schedules it runs (pp > 1)."""
    zero: tuple[int, ...] = ZERO_STAGES
    """Ways of sharding model states over data parallelism, as ZeRO stages."""
    zero_with_pp: tuple[int, ...] = ZERO_STAGES
    """The stages it runs together with pipeline parallelism."""
    offload: bool = True
    """Optimizer states and step in host memory (ZeRO-Offload)."""
    offload_optimizers: tuple[str, ...] = ("adam", "adamw", "sgd")
    """The training optimizers it offloads."""
    sequence_parallel: tuple[bool, ...] = (False, True)
    """With tensor parallelism: whether norms and dropouts may (True) or must not (False) run
    sequence-parallel; (True,) when the engine always does."""
    recompute: tuple[str, ...] = ("none", "selective", "moe_act", "mla_up_proj",
                                  "mla_up_proj+moe_act", "full/4", "full/2", "full")
    """Activation recomputation policies the search tries (costmodels.memory.RECOMPUTE; with
    ``any`` a pin may name any of them)."""
    cp_comms: tuple[str, ...] = CP_COMMS
    """Context-parallel K/V exchanges it runs (empty: no context parallelism)."""
    cp_comms_windowed: tuple[str, ...] = CP_COMMS
    """The exchanges it runs over sliding-window attention (gpt-oss, Mistral, Gemma 2/3)."""
    cp_comms_sinks: tuple[str, ...] = CP_COMMS
    """The exchanges it runs over attention with sinks (gpt-oss)."""
    cp_comms_latent: tuple[str, ...] = CP_COMMS
    """The exchanges it runs over attention whose keys are wider than its values (MLA)."""
    cp_with_tp_pp: bool = True
    """Context parallelism together with tensor or pipeline parallelism."""
    tp_with_pp: bool = True
    """Tensor parallelism together with pipeline parallelism (SearchOptions.tp_with_pp)."""
    cp_load_balanced: bool = True
    """Sequences cut into 2 x cp chunks (SearchOptions.cp_load_balanced)."""
    cp_kv_copies: bool = False
    """Its all-to-all exchange copies key/value heads when cp exceeds them
    (SearchOptions.cp_kv_copies)."""
    expert_parallel: bool = True
    """Routed experts spread over ranks (ep > 1)."""
    expert_tensor_parallel: bool = True
    """Experts' matrices split over the tp ranks (etp = tp > 1)."""
    tp_inner_weights: bool = True
    """Tensor parallelism through a region with weights of its own (Qwen3's per-head norms,
    gpt-oss's attention sinks), which it must shard with the heads or keep in step."""
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16", "fp8")
    """The training dtypes it runs (fp8: its GEMMs on FP8 tensor cores)."""
    zb_with_recompute: bool = True
    """zb-h1's weight-gradient pass (W) apart from B in recomputed blocks. torch's split backward
    cannot replay torch.utils.checkpoint's recomputation in its W pass, so the planner's runtime
    computes such a stage's weight gradients inside B (planner.runtime.build._whole_backward):
    the schedule runs, its zero-bubble saving does not."""
    tp_other_modules: bool = True
    """Tensor parallelism over the model's modules that are not torch.nn.Linear or
    torch.nn.Embedding (GPT-2's Conv1D). The engines the exports target build their own model
    from its dimensions; the planner's runtime shards the given modules with DTensor's styles,
    which take those two classes only."""
    zero_with_cp: tuple[int, ...] = ZERO_STAGES
    """The stages it runs together with context parallelism."""
    etp_with_expert_bias: bool = True
    """Experts' matrices split (etp > 1) where the experts carry biases (gpt-oss)."""
    one_layer_stack: bool = False
    """It trains one stack of transformer layers of its own (Megatron-LM): a model without
    exactly one list of repeated layers is refused, as its export refuses it."""
    op_saves_all_to_all: tuple[str, ...] | None = None
    """The model types (Hugging Face's) whose op-level checkpointing keeps the expert
    all-to-alls' outputs, as the planner prices recompute=op with ep > 1
    (planner.search.costs._op_saved_exchange); None: every model's. Others replay the dispatch
    and combine in backward, which the search does not price: it leaves op with ep > 1 out."""
    zero3_with_cp_ep: bool = True
    """ZeRO-3 together with both context and expert parallelism."""
    zero0_with_others: bool = True
    """ZeRO-0 (plain data parallelism) together with tensor, pipeline, context or expert
    parallelism."""
    pp_inner_same_dp: bool = False
    """Placement tp-pp-dp with a pipeline only where the experts' data parallelism equals the
    attention's (SearchOptions.pp_inner_same_dp)."""
    pp_inner: bool = True
    """Placement tp-pp-dp with a pipeline and data parallelism (SearchOptions.pp_inner)."""
    pp_inner_with_experts: bool = True
    """Placement tp-pp-dp with a pipeline together with ep > 1
    (SearchOptions.pp_inner_with_experts)."""
    experts_split_without_ep: bool = False
    """With ep = 1 and tp > 1 the experts' matrices split over tp whatever etp says
    (SearchOptions.experts_split_without_ep)."""
    mixed_precision_needs_sharding: bool = False
    """With tp or pp, mixed precision only under sharding over dp x cp > 1
    (SearchOptions.mixed_precision_needs_sharding)."""
    seq_split_2cp_tp: bool = False
    """The sequence divisible by tp x 2 x cp, cp = 1 included (SearchOptions.seq_split_2cp_tp)."""
    ep_needs_sharding: bool = False
    """Experts spread over ranks only with sharded data parallelism (SearchOptions.
    ep_needs_sharding)."""
    moe_capacity: bool = True
    """Its MoE can drop tokens beyond a capacity factor (EngineSpec.moe_capacity_factor)."""
    moe_dispatchers: tuple[str, ...] = ("alltoall", "allgather", "deepep")
    """Token dispatchers of its MoE (EngineSpec.moe_dispatcher)."""
    moe_overlap: bool = True
    """Its expert all-to-alls overlap another micro-batch's compute (EngineSpec.moe_overlap) with
    the schedules it offers."""
    moe_shared_overlap: bool = True
    """It runs a shared expert beside the dispatch and combine (EngineSpec.moe_shared_overlap)."""
    tp_overlap: bool = True
    """It pipelines tensor parallelism's collectives with their GEMMs as planned
    (EngineSpec.tp_overlap: Megatron-Core's --tp-comm-overlap)."""
    deepep_models: tuple[str, ...] = ()
    """The Hugging Face model types whose model in the engine runs DeepEP (moe_dispatcher
    deepep); empty: any that it runs."""
    deepep_with_etp: bool = True
    """DeepEP runs with the experts' matrices split (etp > 1)."""
    deepep_with_tp: bool = True
    """DeepEP runs beside tensor parallelism (tp > 1 with ep > 1)."""
    deepep_dtypes: tuple[str, ...] = ()
    """The training dtypes whose tokens its DeepEP dispatches; empty: any."""
    moe_act_needs_grouped_gemm: bool = False
    """``recompute="moe_act"`` runs only with the experts' GEMMs grouped
    (EngineSpec.moe_grouped_gemm)."""
    moe_act_with_delayed_fp8: bool = True
    """``recompute="moe_act"`` runs under FP8 training with delayed scaling."""
    software: str | None = None
    """The engine preset (costmodels.engine.PRESETS) a plan for it is priced with when no engine
    is given; None: the default (Megatron-Core's)."""

    def exchanges_over(self, form: str) -> tuple[str, ...]:
        """The context-parallel exchanges it runs over attention of ``form`` (ATTENTION_FORMS:
        latent, sinks, sliding_window)."""
        return {"latent": self.cp_comms_latent, "sinks": self.cp_comms_sinks,
                "sliding_window": self.cp_comms_windowed}[form]


ENGINES: dict[str, Engine] = {
    # any: what some engine runs (DeepSpeed's copies of key/value heads among them)
    "any": Engine(name="any", version="", cp_kv_copies=True),
    # planner's own runtime (`plan run`): torch.distributed.pipelining actions, DTensor tensor
    # parallelism without sequence parallelism (per-head weights inside a split region sharded
    # with the heads, per-head norms kept in step: planner.runtime.inner_weights),
    # replicate / fully_shard; the optimizer stays on the device.
    "torch": Engine(name="torch", version="2.13",
                    schedules=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1"),
                    offload=False, sequence_parallel=(False,), cp_comms=("p2p",),
                    recompute=("none", "selective", "full/4", "full/2", "full"),
                    # fully_shard has no ZeRO-1: it runs as ZeRO-2 (priced alike under its
                    # state_layout=native; offered once)
                    zero=(0, 2, 3), zero_with_pp=(0, 2, 3), zero_with_cp=(0, 2, 3),
                    expert_tensor_parallel=False, cp_comms_windowed=(), cp_comms_sinks=(),
                    # its experts run every routed token (no capacity), exchanged by
                    # point-to-point all-to-alls between the passes (planner.runtime.experts)
                    moe_capacity=False, moe_dispatchers=("alltoall",), moe_overlap=False,
                    moe_shared_overlap=False, tp_overlap=False, software="torch",
                    tp_other_modules=False,
                    zb_with_recompute=False,
                    # the model is built and trained in the plan's dtype: no FP8 GEMMs
                    # (Transformer Engine's, torchao's) in plan run
                    dtypes=("fp32", "bf16", "fp16")),
    # torchtitan: FSDP2 (reshard after forward = ZeRO-3, or not = ZeRO-2) or DDP; its tensor
    # parallelism always shards norms over the sequence; CPU offload moves parameters too, not
    # only the optimizer; activation checkpointing none, full or op-level selective. 0.2.2 runs
    # DDP (ZeRO-0) only without other parallelisms (parallelize.py raises "DDP has not supported
    # > 1D parallelism"), so with a pipeline it shards, and with context parallelism it always
    # shards (ParallelDims.fsdp_enabled = dp_shard or cp); 0.3.0 is the newest release, but its
    # config parser imports the whole trainer (triton, datasets), so the checked default is 0.2.2.
    # Without FSDP (dp x cp = 1) and with tp or pp, maybe_enable_amp turns mixed precision off
    # (distributed/utils.py); with ep = 1 apply_moe_ep_tp splits the experts over the tp mesh; its
    # parallelize functions assert seq_len % (tp x 2 x cp) == 0 (ParallelDims.seq_len_divisor);
    # its deepseek_v3, gpt_oss and llama4 models fetch the FSDP mesh whenever ep > 1, which does
    # not exist without sharding (dp x cp = 1);
    # its device mesh orders pp, dp_replicate, dp_shard, cp, tp, outermost first (tp-dp-pp).
    "torchtitan": Engine(name="torchtitan", version="0.2.2",
                         mixed_precision_needs_sharding=True, experts_split_without_ep=True,
                         ep_needs_sharding=True,
                         pp_inner=False,
                         seq_split_2cp_tp=True,
                         schedules=("gpipe", "1f1b", "interleaved-1f1b"),
                         zero=(0, 2, 3), zero_with_pp=(2, 3), zero_with_cp=(2, 3),
                         zero0_with_others=False, offload=False,
                         sequence_parallel=(True,),
                         recompute=("none", "full/4", "full/2", "full", "op"),
                         # context parallelism through torch's context_parallel, which
                         # all-gathers K/V (torch's default rotate method; 0.2.2's
                         # context_parallel_rotate_method reaches only its validator)
                         cp_comms=("allgather",), software="torchtitan",
                         # all_to_all_single in models/*/infra/parallelize.py's
                         # _op_sac_save_list of these models only
                         op_saves_all_to_all=("deepseek_v3", "gpt_oss", "llama4"),
                         # torch's context_parallel takes SDPA with is_causal, not a window
                         # nor sinks; its MLA model (deepseek_v3) refuses it (export.torchtitan
                         # NO_CONTEXT_PARALLEL)
                         cp_comms_windowed=(), cp_comms_sinks=(), cp_comms_latent=(),
                         # its MoE drops no tokens, dispatches by all-to-all (or DeepEP:
                         # parallelism.expert_parallel_comm_backend, its deepseek_v3 and llama4
                         # models), and overlaps the all-to-alls only under DualPipeV, a
                         # schedule this table does not offer
                         moe_capacity=False, moe_dispatchers=("alltoall", "deepep"),
                         moe_overlap=False, moe_shared_overlap=False, tp_overlap=False,
                         deepep_models=("deepseek_v3", "llama4"),
                         # "DeepEP with Expert Tensor Parallelism (ETP) is not supported yet"
                         deepep_with_etp=False),
    # Megatron-LM: 1F1B and interleaved 1F1B; the distributed optimizer (ZeRO-1), Megatron FSDP
    # (optim_grads = ZeRO-2, optim_grads_params = ZeRO-3); --optimizer-cpu-offload.
    # Transformer Engine's attn_forward_func_with_cp runs a sliding window with a2a or all_gather
    # only, a learnable softmax offset (sinks) with a2a only, since v2.10, and multi-head latent
    # attention with p2p or a2a+p2p only before v2.16 ("Context parallelism does not support MLA
    # with cp_comm_type=...!"; the check went with commit ee5dcec, "Add MXFP8 attention")
    # (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py). The
    # target keeps to what every release runs; an export of another plan notes the versions.
    # --use-tp-pp-dp-mapping with pp > 1 needs the experts' data-parallel size equal to the
    # attention's (megatron/core/parallel_state.py, initialize_model_parallel).
    # Its TransformerConfig asserts "Bias in Moe is only supported when ETP==1" (core_v0.19.0).
    # Megatron-FSDP (ZeRO-2/3) lays the world out as data x expert x tensor parallel ranks
    # (mcore_fsdp_adapter.py, _get_dp_tp_mesh): not beside a pipeline. Optimizer offload needs its
    # precision-aware optimizer, which asserts "only supported with adam" (OptimizerConfig).
    # Its TransformerConfig raises "moe_act in recompute_modules is only supported with
    # moe_grouped_gemm" and "Delayed scaling does not support moe_act and layernorm recompute
    # for fp8" (core_v0.19.0).
    "megatron": Engine(name="megatron", version="core_v0.19.0",
                       schedules=("1f1b", "interleaved-1f1b"), pp_inner_same_dp=True,
                       zero_with_pp=(0, 1), offload_optimizers=("adam", "adamw"),
                       moe_act_needs_grouped_gemm=True, moe_act_with_delayed_fp8=False,
                       etp_with_expert_bias=False, one_layer_stack=True,
                       cp_comms_windowed=("a2a", "allgather"), cp_comms_sinks=("a2a",),
                       cp_comms_latent=("p2p", "a2a+p2p")),
    # DeepSpeed: its pipeline engine runs one 1F1B-like schedule and only ZeRO 0-1 with it;
    # no Megatron-style sequence parallelism in the engine itself.
    # its MoE layer spreads experts over ep ranks (experts' data parallelism follows) without
    # splitting their matrices; its sequence parallelism is Ulysses (all-to-all over heads);
    # AutoEP refuses ZeRO-3 with sequence parallelism (runtime/engine.py: "AutoEP with ZeRO
    # Stage 3 does not support sequence parallelism yet"); its expert groups are consecutive
    # ranks of a stage (utils/groups.py, _create_expert_and_data_parallel), so with a pipeline
    # the stages must be blocks of consecutive ranks (placement tp-dp-pp). AutoTP (its tensor
    # parallelism) does not combine with its PipelineModule, and its activation checkpointing
    # takes whole layers (checkpoint_interval): no selective recomputation.
    "deepspeed": Engine(name="deepspeed", version="0.19.8", schedules=("1f1b",),
                        pp_inner_with_experts=False, tp_with_pp=False, cp_load_balanced=False,
                        # UlyssesSPAttentionHF repeats each key/value head cp / heads times
                        # before its all-to-all when cp exceeds them (a multiple of them)
                        cp_kv_copies=True,
                        recompute=("none", "full"),
                        zero_with_pp=(0, 1), sequence_parallel=(False,), cp_comms=("a2a",),
                        cp_with_tp_pp=False, expert_tensor_parallel=False,
                        zero3_with_cp_ep=False, software="deepspeed",
                        # its MoE layer (and AutoEP) dispatch by all-to-all with no overlap
                        # setting, AutoEP also by DeepEP (comm_backend "deepep", not with
                        # folded tensor parallelism: auto_ep_layer.py). The experts its config
                        # sets up (AutoEP) drop no tokens: a capacity factor needs its own MoE
                        # layer built in the model's code, which --target any plans
                        moe_capacity=False,
                        moe_dispatchers=("alltoall", "deepep"), moe_overlap=False,
                        moe_shared_overlap=False, tp_overlap=False, deepep_with_etp=False,
                        deepep_with_tp=False,
                        # AutoEP's DeepEP route dispatches bfloat16 rows only (auto_ep_comm.py
                        # assert_dtype_supported); fp8 training keeps bf16 activations
                        deepep_dtypes=("bf16", "fp8")),
}
TARGETS: tuple[str, ...] = tuple(ENGINES)


EXPORTED = ("megatron", "torchtitan", "deepspeed")
"""The engines a plan is exported to (``torch`` is the planner's own runtime, plan run)."""


ATTENTION_FORMS = {"latent": "multi-head latent attention",
                   "sinks": "attention with sinks", "sliding_window": "sliding-window attention"}
"""The forms of attention (planner.search.space.attention_forms, a plan's model.attention_forms)
over which an engine runs only some context-parallel exchanges, in words."""


def torchtitan_layer_counts(k: int, recomputed: list[int], layers: list[int],
                            pp: int) -> list[tuple[int, int]]:
    """Per pipeline rank: (the layers a full/k plan recomputes there, those torchtitan's layer
    SAC wraps: every k-th of the rank's own, counted over its chunks); ``recomputed`` and
    ``layers`` per chunk, chunk c on rank c mod pp."""
    return [(sum(recomputed[r::pp]), sum(layers[r::pp]) // k) for r in range(pp)]


def layer_interval_refusal(target: str, k: int, recomputed: list[int], layers: list[int],
                           pp: int) -> str:
    """Why ``target`` does not recompute, on this split, the layers a full/k plan recomputes
    (every k-th of the model's: costmodels.memory.layer_policies); '' where it does, or for a
    target that takes the plan's own layers (the runtime, DeepSpeed's nearest full).
    ``recomputed`` and ``layers``: per chunk (rank ``c mod pp``), the layers recomputed and held.
    Megatron-LM recomputes the first N layers of every chunk, one N for all (its block method);
    torchtitan every k-th layer a process wraps, counted over its chunks (its layer SAC)."""
    if target == "megatron":
        n = max(recomputed, default=0)
        if any(c != min(n, held) for c, held in zip(recomputed, layers)):
            return (f"recompute: Megatron-LM's block method recomputes the first "
                    f"--recompute-num-layers of every chunk, and this split's chunks recompute "
                    f"{min(recomputed)} to {n} of their layers, not the first {n} of each")
    if target == "torchtitan":
        ranks = torchtitan_layer_counts(k, recomputed, layers, pp)
        off = [r for r, (planned, runs) in enumerate(ranks) if planned != runs]
        if off:
            return (f"recompute: torchtitan wraps every {k}th layer of each pipeline rank's own, "
                    f"{ranks[off[0]][1]} on rank {off[0]}, where this split recomputes "
                    f"{ranks[off[0]][0]}")
    return ""


def refusal(parallel: dict, dtype: str, target: str, forms=(), *,
            experts: bool = False, kv_heads: int = 0) -> str | None:
    """Why ``target`` does not run a plan's knobs (``parallel``, as Config.to_dict or a plan's
    parallel section gives them) and dtype as planned, in restrict's words: the first refused
    setting; None where it runs them. ``forms``: the model's forms of attention
    (ATTENTION_FORMS), whose context-parallel exchanges the engine may not run; ``experts``:
    whether the model routes tokens to experts, which the placement's rules look at (an export
    checks the model's other rules besides); ``kv_heads``: its fewest key/value heads (0:
    unknown), which an all-to-all exchange splits."""
    fix = {k: parallel[k] for k in FIX_KEYS if k in parallel}
    try:
        restrict(SearchOptions(fix=fix), target)
        check_dtype(target, dtype)
    except SpecError as err:
        return str(err)
    if parallel.get("placement") == "tp-pp-dp":
        why = pp_inner_refused(engine(target), experts=experts,
                               **{k: int(parallel.get(k, 1))
                                  for k in ("pp", "dp", "tp", "cp", "ep", "etp")})
        if why:
            return f"fix.placement: {why}"
    return exchange_refusal(parallel, target, forms, kv_heads=kv_heads)


def image_model(model: dict) -> bool:
    """Whether a traced model's record (Prepared.info, a plan's model section) is an image
    model, which an engine of one transformer stack over tokens (Megatron's pretrain_gpt.py)
    does not lay out."""
    return bool(model.get("image_tokens") or model.get("image_input"))


def model_refusal(model: dict, target: str) -> str | None:
    """Why ``target`` does not train the model a plan records, in a few words (an engine of one
    transformer stack over tokens: an image model, or other than one list of layers); None where
    nothing in the record rules it out (its export checks the rest)."""
    if target not in TARGETS or not engine(target).one_layer_stack:
        return None
    if image_model(model):
        return "image model"
    stacks = model.get("trace", {}).get("repeats")
    if stacks is not None and len(stacks) != 1:  # (Megatron-LM trains one stack of layers)
        return "several layer stacks" if stacks else "no repeated layer stack"
    return None


def exported_runs(parallel: dict, dtype: str, forms=(), *, experts: bool = False,
                  kv_heads: int = 0) -> bool:
    """Whether an exported engine (EXPORTED) runs ``parallel``'s knobs and ``dtype`` as planned
    (refusal; an export checks the model's other rules besides)."""
    return any(refusal(parallel, dtype, t, forms, experts=experts, kv_heads=kv_heads) is None
               for t in EXPORTED)


def _fewer_exchanges(eng: Engine) -> str:
    """`` (fewer over ...)``: the forms of attention over which ``eng`` runs fewer exchanges than
    it offers, so that a refusal of one exchange does not send the user to another the model's
    attention rules out."""
    fewer: dict[tuple, list[str]] = {}  # the exchanges run -> the forms they are run over
    for form in ("sliding_window", "sinks", "latent"):
        runs = tuple(c for c in eng.exchanges_over(form) if c in eng.cp_comms)
        if runs != eng.cp_comms:
            fewer.setdefault(runs, []).append(ATTENTION_FORMS[form])
    parts = [f"{', '.join(runs) or 'none'} over "
             f"{', '.join(forms[:-1]) + ' or ' + forms[-1] if len(forms) > 1 else forms[0]}"
             for runs, forms in fewer.items()]
    return f" ({'; '.join(parts)})" if parts else ""


def exchange_refusal(parallel: dict, target: str, forms, *, kv_heads: int = 0) -> str | None:
    """Why ``target`` does not run the context-parallel exchange of ``parallel`` (cp > 1 with a
    cp_comm) over the model's ``forms`` of attention (ATTENTION_FORMS) and its ``kv_heads`` (the
    all-to-all with more ranks than heads: copies, Engine.cp_kv_copies); None where it does."""
    if int(parallel.get("cp", 1)) > 1 and "cp_comm" in parallel:
        eng = engine(target)
        width = int(parallel["cp"]) * int(parallel.get("tp", 1))
        if parallel["cp_comm"] == "a2a" and kv_heads and kv_heads % width and \
                not (eng.cp_kv_copies and width % kv_heads == 0):
            copies = " or a multiple of them (copies)" if eng.cp_kv_copies else \
                " (it does not copy them)"
            return (f"fix.cp_comm: {target}'s a2a exchange needs the {kv_heads} key-value heads "
                    f"divisible by tp x cp = {width}{copies}")
        for form in forms:
            runs = eng.exchanges_over(form)
            if parallel["cp_comm"] not in runs:
                offers = f"it offers {', '.join(runs)} there" if runs else \
                    "it runs no context parallelism there"
                return (f"fix.cp_comm: {target} does not run the {parallel['cp_comm']} exchange "
                        f"over {ATTENTION_FORMS[form]}; {offers}")
    return None


def engine(target: str) -> Engine:
    if target not in ENGINES:
        raise SpecError(f"target: unknown engine '{target}'; choose {', '.join(TARGETS)}")
    return ENGINES[target]


def moe_act_refusal(target: str, engine_spec, dtype: str = "bf16") -> str:
    """Why ``target`` runs no ``moe_act`` recomputation with these engine settings and ``dtype``
    (words to follow "does not run moe_act recomputation"); '' where it runs it."""
    eng = engine(target)
    return ("with ungrouped expert GEMMs (moe_grouped_gemm=false)"
            if eng.moe_act_needs_grouped_gemm and not engine_spec.moe_grouped_gemm else
            "under FP8 delayed scaling" if not eng.moe_act_with_delayed_fp8 and dtype == "fp8"
            and engine_spec.fp8_recipe == "delayed" else "")


def for_engine(options: SearchOptions, engine_spec, dtype: str = "bf16") -> SearchOptions:
    """``options`` narrowed to what the target runs with these engine settings (and ``dtype``):
    no expert tensor parallelism under DeepEP where the engine refuses it, no ``moe_act``
    recomputation where it refuses that (moe_act_refusal; SpecError for such a pin)."""
    eng = engine(options.target)
    why = moe_act_refusal(options.target, engine_spec, dtype)
    with_act = tuple(r for r in options.recompute if "moe_act" in modules_of(r))
    if why and with_act:
        pinned = options.fix.get("recompute")
        if pinned in with_act:
            raise SpecError(f"fix.recompute: {options.target} does not run moe_act recomputation "
                            f"{why}; pin another recompute or change the engine setting")
        options = replace(options, recompute=tuple(r for r in options.recompute
                                                   if r not in with_act))
    if engine_spec.moe_dispatcher != "deepep":
        return options
    fix = options.fix
    if eng.deepep_dtypes and dtype not in eng.deepep_dtypes:
        raise SpecError(f"engine.moe_dispatcher: {options.target} runs DeepEP in "
                        f"{' or '.join(eng.deepep_dtypes)} only, not {dtype}; set "
                        "moe_dispatcher=alltoall or train in bf16")
    if not eng.deepep_with_tp and int(fix.get("tp", 1)) > 1 and int(fix.get("ep", 1)) > 1:
        raise SpecError(f"fix.tp: {options.target} runs DeepEP without tensor parallelism (its "
                        "folded tp) beside expert parallelism; pin tp=1 or ep=1, or set "
                        "moe_dispatcher=alltoall")
    if not eng.deepep_with_tp:
        options = replace(options, ep_with_tp=False)
    if eng.deepep_with_etp:
        return options
    if int(fix.get("etp", 1)) > 1:
        raise SpecError(f"fix.etp: {options.target} runs DeepEP with whole expert matrices only; "
                        "pin etp=1 or set moe_dispatcher=alltoall")
    return replace(options, expert_tensor_parallel=False)


def for_optimizer(options: SearchOptions, optimizer: str) -> SearchOptions:
    """``options`` without optimizer offload where the target does not offload ``optimizer``
    (SpecError for a pin of it)."""
    eng = engine(options.target)
    if optimizer in eng.offload_optimizers:
        return options
    if options.fix.get("offload_optimizer"):
        raise SpecError(f"fix.offload_optimizer: {options.target} offloads "
                        f"{' and '.join(eng.offload_optimizers)} only, not {optimizer}; pin "
                        "offload_optimizer=false or train with adam")
    return replace(options, offload=tuple(o for o in options.offload if not o))


def check_overlap(engine_spec, target: str) -> None:
    """Refuse tp_overlap (EngineSpec.tp_overlap) where ``target`` does not run it, for every
    model (check_engine holds the settings of a mixture of experts)."""
    if engine_spec.tp_overlap and not engine(target).tp_overlap:
        who = target if target != "torch" else "planner's runtime (plan run)"
        raise SpecError(f"engine.tp_overlap: {who} does not pipeline tensor-parallel collectives "
                        "with their GEMMs as planned (Megatron-Core's --tp-comm-overlap); leave "
                        "tp_overlap out or use --target megatron")


def check_engine(engine_spec, target: str, model_type: str | None = None) -> None:
    """Refuse (SpecError naming the engine setting) MoE settings ``target`` does not run: a plan
    priced with them would promise a step its engine cannot take. ``model_type``: the model's
    Hugging Face type where known (DeepEP runs in some of an engine's models only)."""
    eng = engine(target)
    who = f"{target}'s MoE" if target != "torch" else "planner's runtime (plan run)"
    if engine_spec.moe_capacity_factor and not eng.moe_capacity:
        settings = ("moe_capacity_factor and moe_pad_to_capacity"
                    if engine_spec.moe_pad_to_capacity else "moe_capacity_factor")
        what = ("the experts deepspeed's config sets up (AutoEP) drop no tokens (its own MoE "
                "layer's capacity factor is code in your model)" if target == "deepspeed" else
                f"{who} drops no tokens (it has no capacity factor)")
        raise SpecError(f"engine.moe_capacity_factor: {what}; leave {settings} out (dropless) or "
                        "use --target any")
    if engine_spec.moe_dispatcher not in eng.moe_dispatchers:
        raise SpecError(f"engine.moe_dispatcher: {who} dispatches tokens by "
                        f"{' or '.join(eng.moe_dispatchers)}, not {engine_spec.moe_dispatcher}; "
                        f"set moe_dispatcher={eng.moe_dispatchers[0]} or use --target any")
    if engine_spec.moe_dispatcher == "deepep" and eng.deepep_models and model_type and \
            model_type not in eng.deepep_models:
        raise SpecError(f"engine.moe_dispatcher: {who} runs DeepEP in its "
                        f"{' and '.join(eng.deepep_models)} models only, not {model_type}; set "
                        f"moe_dispatcher={eng.moe_dispatchers[0]} or use --target any")
    if engine_spec.moe_shared_overlap and not eng.moe_shared_overlap:
        raise SpecError(f"engine.moe_shared_overlap: {who} runs a shared expert before or after "
                        "the dispatch, not beside it; leave moe_shared_overlap out or use "
                        "--target any")
    if engine_spec.moe_overlap and not eng.moe_overlap:
        raise SpecError(f"engine.moe_overlap: {who} does not overlap its expert all-to-alls with "
                        "compute in the schedules it offers; leave moe_overlap out or use "
                        "--target any")


_RECOMPUTE_NEEDS = {"moe_act": " (models with experts)", "mla_up_proj": " (latent attention)",
                    "mla_up_proj+moe_act": " (both)"}
"""What a model needs for each recomputation policy that not every model can take, for the
list of a target's policies in an error."""


def check_recsys(target: str) -> None:
    """SpecError where a recommendation model is given a target: it is planned for TorchRec."""
    if target != "any":
        raise SpecError(f"target: {target} given, but recommendation models are planned for "
                        "TorchRec's engine (tables sharded, dense part data-parallel); leave "
                        "target (--target) out")


def check_dtype(target: str, dtype: str) -> None:
    """SpecError where ``target`` does not train in ``dtype``."""
    eng = engine(target) if target != "any" else None
    if eng is not None and dtype not in eng.dtypes:
        who = "the planner's runtime (plan run)" if target == "torch" else target
        raise SpecError(f"training.dtype: {who} trains in {', '.join(eng.dtypes)}, not {dtype}; "
                        f"re-plan with --dtype bf16, or for another --target")


def schedule_unrun(target: str, schedule: str, recompute: str, pp: int) -> str:
    """'' where ``target`` runs ``schedule`` as priced with ``recompute`` on ``pp`` pipeline
    ranks, else why not (for a what-if on a plan made for that target: `plan simulate`)."""
    if target not in ENGINES:  # any
        return ""
    eng = ENGINES[target]
    if schedule not in eng.schedules:
        return f"{target} runs {', '.join(eng.schedules)}, not {schedule}"
    if zb_split_lost(eng, schedule, recompute, pp):
        return (f"{target} computes zb-h1's weight gradients inside B where blocks are "
                f"recomputed (recompute={recompute}): it runs without the saving simulated here")
    return ""


def restrict(options: SearchOptions, target: str) -> SearchOptions:
    """``options`` narrowed to what ``target`` runs; a pin it cannot run is an error naming both."""
    eng = engine(target)
    fix = options.fix
    pinned_sched = fix.get("schedule")
    if pinned_sched is not None and int(fix.get("pp", 2)) > 1 and pinned_sched not in eng.schedules:
        raise SpecError(f"fix.schedule: {target} does not run {pinned_sched}; it runs "
                        f"{', '.join(eng.schedules)} (or use --target any)")
    if zb_split_lost(eng, pinned_sched, fix.get("recompute", "none"), int(fix.get("pp", 2))):
        raise SpecError(f"fix.schedule: {target} computes zb-h1's weight gradients inside B "
                        f"where blocks are recomputed (recompute={fix['recompute']}), so the "
                        "schedule saves nothing; pin recompute=none or another schedule")
    if "zero" in fix and fix["zero"] not in eng.zero:
        raise SpecError(f"fix.zero: {target} does not shard model states as ZeRO-{fix['zero']}; "
                        f"it offers {', '.join(map(str, eng.zero))}")
    if "zero" in fix and int(fix.get("pp", 1)) > 1 and fix["zero"] not in eng.zero_with_pp and \
            int(fix.get("dp", 2)) * int(fix.get("cp", 1)) > 1:  # (over one rank ZeRO shards nothing)
        raise SpecError(f"fix.zero: {target} does not run ZeRO-{fix['zero']} with a pipeline; it "
                        f"offers {', '.join(map(str, eng.zero_with_pp))} there (or pin pp=1)")
    if "zero" in fix and int(fix.get("cp", 1)) > 1 and fix["zero"] not in eng.zero_with_cp:
        raise SpecError(f"fix.zero: {target} does not run ZeRO-{fix['zero']} with context "
                        f"parallelism; it offers {', '.join(map(str, eng.zero_with_cp))} there")
    if fix.get("zero") == 3 and int(fix.get("cp", 1)) > 1 and int(fix.get("ep", 1)) > 1 and \
            not eng.zero3_with_cp_ep:
        raise SpecError(f"fix.zero: {target} does not run ZeRO-3 with both cp and ep (pin zero "
                        "below 3, or cp=1 or ep=1)")
    sharded = int(fix.get("dp", 1)) > 1 or (eng.ep_needs_sharding and int(fix.get("ep", 1)) > 1)
    if fix.get("zero") == 0 and not eng.zero0_with_others and sharded and any(
            int(fix.get(k, 1)) > 1 for k in ("tp", "pp", "cp", "ep")):
        raise SpecError(f"fix.zero: {target} runs ZeRO-0 (plain data parallelism) only without "
                        "tensor, pipeline, context or expert parallelism; pin zero=2 or zero=3")
    if fix.get("offload_optimizer") and not eng.offload:
        raise SpecError(f"fix.offload_optimizer: {target} does not offload the optimizer alone "
                        "(pin offload_optimizer=false or use another target)")
    if "sequence_parallel" in fix and int(fix.get("tp", 2)) > 1 and \
            fix["sequence_parallel"] not in eng.sequence_parallel:
        raise SpecError(f"fix.sequence_parallel: {target} runs tensor parallelism "
                        f"{'with' if eng.sequence_parallel == (True,) else 'without'} sequence "
                        "parallelism")
    if target != "any" and "recompute" in fix and fix["recompute"] not in eng.recompute:
        offered = ", ".join(r + _RECOMPUTE_NEEDS.get(r, "") for r in eng.recompute)
        raise SpecError(f"fix.recompute: {target} does not offer {fix['recompute']} "
                        f"recomputation; it offers {offered}")
    if int(fix.get("cp", 1)) > 1 and not eng.cp_comms:
        raise SpecError(f"fix.cp: {target} runs no context parallelism")
    if "cp_comm" in fix and int(fix.get("cp", 2)) > 1 and fix["cp_comm"] not in eng.cp_comms:
        raise SpecError(f"fix.cp_comm: {target} does not exchange K/V by {fix['cp_comm']}; it "
                        f"offers {', '.join(eng.cp_comms)}{_fewer_exchanges(eng)}")
    if int(fix.get("cp", 1)) > 1 and not eng.cp_with_tp_pp and (
            int(fix.get("tp", 1)) > 1 or int(fix.get("pp", 1)) > 1):
        raise SpecError(f"fix.cp: {target} runs context parallelism with data parallelism only "
                        "(pin tp=1 and pp=1)")
    if int(fix.get("tp", 1)) > 1 and int(fix.get("pp", 1)) > 1 and not eng.tp_with_pp:
        raise SpecError(f"fix.tp: {target} does not run tensor parallelism together with a "
                        "pipeline; pin tp=1 or pp=1")
    if int(fix.get("ep", 1)) > 1 and not eng.expert_parallel:
        raise SpecError(f"fix.ep: {target} runs no expert parallelism")
    if int(fix.get("etp", 1)) > 1 and not eng.expert_tensor_parallel:
        raise SpecError(f"fix.etp: {target} does not split experts' matrices (pin etp=1)")
    inner = fix.get("placement") == "tp-pp-dp" and int(fix.get("pp", 1)) > 1 and \
        int(fix.get("dp", 1)) > 1  # (one replica: the orders are the same; unpinned: searched)
    if inner and not eng.pp_inner:
        raise SpecError(f"fix.placement: {target} places pipeline stages outermost (tp-dp-pp) "
                        "only; pin placement=tp-dp-pp")
    if inner and int(fix.get("ep", 1)) > 1 and not eng.pp_inner_with_experts:
        raise SpecError(f"fix.placement: {target} runs tp-pp-dp with a pipeline only without "
                        "expert parallelism (its expert groups are consecutive ranks of a "
                        "stage); pin placement=tp-dp-pp or ep=1")
    narrowed = {"schedules": tuple(s for s in options.schedules if s in eng.schedules),
                # the engine's own forms unless the caller chose some (then those it runs)
                "recompute": (eng.recompute if options.recompute == DEFAULT_RECOMPUTE else
                              tuple(r for r in options.recompute if r in eng.recompute)),
                "zero": tuple(z for z in options.zero if z in eng.zero)}
    for name, kept in narrowed.items():
        if not kept:
            raise SpecError(f"{name}: {target} runs {', '.join(map(str, getattr(eng, name)))}, "
                            f"none of the SearchOptions.{name} given "
                            f"({', '.join(map(str, getattr(options, name)))})")
    return replace(options, target=target, recompute=narrowed["recompute"],
                   cp_comms=tuple(c for c in options.cp_comms if c in eng.cp_comms),
                   cp_comms_windowed=tuple(c for c in options.cp_comms_windowed
                                           if c in eng.cp_comms_windowed),
                   cp_comms_sinks=tuple(c for c in options.cp_comms_sinks
                                        if c in eng.cp_comms_sinks),
                   cp_comms_latent=tuple(c for c in options.cp_comms_latent
                                         if c in eng.cp_comms_latent),
                   cp_with_tp_pp=options.cp_with_tp_pp and eng.cp_with_tp_pp,
                   tp_with_pp=options.tp_with_pp and eng.tp_with_pp,
                   cp_load_balanced=options.cp_load_balanced and eng.cp_load_balanced,
                   cp_kv_copies=options.cp_kv_copies and eng.cp_kv_copies,
                   expert_parallel=options.expert_parallel and eng.expert_parallel,
                   expert_tensor_parallel=(options.expert_tensor_parallel
                                           and eng.expert_tensor_parallel),
                   tp_inner_weights=options.tp_inner_weights and eng.tp_inner_weights,
                   tp_other_modules=options.tp_other_modules and eng.tp_other_modules,
                   zb_with_recompute=options.zb_with_recompute and eng.zb_with_recompute,
                   pp_inner_same_dp=options.pp_inner_same_dp or eng.pp_inner_same_dp,
                   pp_inner=options.pp_inner and eng.pp_inner,
                   pp_inner_with_experts=options.pp_inner_with_experts and eng.pp_inner_with_experts,
                   experts_split_without_ep=(options.experts_split_without_ep
                                             or eng.experts_split_without_ep),
                   mixed_precision_needs_sharding=(options.mixed_precision_needs_sharding
                                                   or eng.mixed_precision_needs_sharding),
                   seq_split_2cp_tp=options.seq_split_2cp_tp or eng.seq_split_2cp_tp,
                   ep_needs_sharding=options.ep_needs_sharding or eng.ep_needs_sharding,
                   zero3_with_cp_ep=options.zero3_with_cp_ep and eng.zero3_with_cp_ep,
                   zero0_with_others=options.zero0_with_others and eng.zero0_with_others,
                   etp_with_expert_bias=options.etp_with_expert_bias and eng.etp_with_expert_bias,
                   schedules=narrowed["schedules"], zero=narrowed["zero"],
                   zero_with_pp=tuple(z for z in options.zero_with_pp if z in eng.zero_with_pp),
                   zero_with_cp=tuple(z for z in options.zero_with_cp if z in eng.zero_with_cp),
                   offload=tuple(o for o in options.offload if eng.offload or not o),
                   sequence_parallel=tuple(s for s in options.sequence_parallel
                                           if s in eng.sequence_parallel))
