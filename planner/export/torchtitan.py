"""Plan -> torchtitan settings: TOML job-config sections (0.2.2) or command-line overrides (0.3.0).

torchtitan 0.2.2 reads a TOML job config (``torchtitan/config/job_config.py``, parsed by
``ConfigManager().parse_args(["--job.config_file", path])``); the export writes the sections to
merge into one. torchtitan 0.3.0 reads no TOML: a job is a Python config function chosen with
``--module``/``--config`` plus ``--section.key value`` overrides (``torchtitan/config/manager.py``),
so the export writes a bash array of those overrides. Both come from one list of settings, so the
two releases say the same thing. Mapping table and limits: docs/exports.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.engine import engine_from_mapping
from costmodels.memory import RECOMPUTE, every_words, layer_interval
from planner.errors import PlannerError, SpecError
from planner.export import common, moe, names, replan
from planner.export.shell import bash_file
from planner.export.toml import Entry, table
from planner.planfile.document import Plan
from planner import targets
from planner.units import counted

TARGET = "torchtitan"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
PRECISION = {"bf16": "bfloat16", "fp32": "float32"}
ARRAY = "TORCHTITAN_ARGS"
SECTION_ORDER = ("model", "parallelism", "compile", "activation_checkpoint", "training",
                 "quantize.linear.float8", "quantize.linear.mx")
NO_CONTEXT_PARALLEL = {
    ("0.2.2", "gpt_oss"): "its gpt_oss model raises \"CP support for gpt-oss model is still in "
                          "progress\" (models/gpt_oss/model/args.py, update_from_config)",
    ("0.2.2", "deepseek_v3"): "its deepseek_v3 671B flavor uses FlexAttention and "
                              "update_from_config raises \"Context Parallel only supports SDPA "
                              "attention\" (models/deepseek_v3/model/args.py)",
}
"""(release, torchtitan model) -> why torchtitan refuses context parallelism for that model."""
FLEX_ATTENTION = {("0.2.2", "deepseek_v3")}
"""(release, torchtitan model) whose flavors run FlexAttention with a block-causal mask
(models/deepseek_v3/__init__.py: attn_type "flex", attn_mask_type "block_causal")."""
FP8 = {"current": ("quantize.linear.float8", "tensorwise"),
       "delayed": ("quantize.linear.float8", "tensorwise"),
       "block": ("quantize.linear.mx", "mxfp8_cublas")}
"""Plan FP8 recipe -> torchtitan 0.2.2 converter and its recipe_name (torchao's float8 training
scales tensorwise from the current amax and has no delayed scaling; MXFP8 is its mx converter)."""

CONFIG_FP8 = {"llama3_405b": "rowwise"}
"""torchtitan 0.3.0 config functions that convert the model's Linears to FP8 themselves (all but
lm_head; Float8LinearConverter, whose recipe defaults to rowwise scaling): torchtitan/models/
llama3/config_registry.py and components/quantization/float8.py of the 0.3.0 wheel."""


@dataclass(frozen=True)
class Setting:
    """One option: ``[section] key = value`` in TOML, ``--section.key value`` on a command line."""

    section: str
    key: str
    value: object
    comments: tuple[str, ...] = ()


def to_torchtitan(plan: Plan, version: str | None = None) -> str:
    """The plan as torchtitan settings for ``version`` (default: planner.targets' release)."""
    version = common.engine_version(TARGET, version)
    ledger = common.Ledger(TARGET, version)
    _check_mesh(plan, version, ledger)
    common.software_note(plan, TARGET, ledger)
    common.frozen_note(plan, TARGET, ledger)
    common.mtp_note(plan, TARGET, ledger)
    raising: dict[str, tuple[object, str]] = {}  # knob -> (what torchtitan runs, words)
    settings = (_model(plan, version, ledger) + _data_parallel(plan, version, ledger)
                + _model_parallel(plan, version, ledger)
                + _context(plan, version, ledger, raising)
                + _experts(plan, version, ledger, raising) + _training(plan, ledger)
                + _fp8(plan, version, ledger))
    ac = _activation_checkpoint(plan, version, ledger)
    _recheck(plan, version, ledger, raising)
    notes = ledger.close()
    if version == "0.2.2":
        return _toml(plan, version, settings + [Setting("activation_checkpoint", k, v, c)
                                                for k, v, c in ac], notes)
    return _cli(plan, version, settings, ac, notes)


def _check_mesh(plan: Plan, version: str, ledger: common.Ledger) -> None:
    """SpecError for a mesh torchtitan's parallelize functions refuse: a sequence not divisible
    by tp x 2 x cp (their assert on ParallelDims.seq_len_divisor, cp = 1 included; for a model
    torchtitan does not define, whose parallelize function is the user's, a note), and in 0.2.2
    experts spread over ranks without an FSDP mesh (dp x cp = 1) in its deepseek_v3 and gpt_oss
    models, which fetch that mesh whenever ep > 1 (get_mesh(["fsdp"]) raises for a size-1 mesh)."""
    p, seq = plan.parallel, plan.training["seq_len"]
    divisor = p["tp"] * 2 * p.get("cp", 1)
    if seq % divisor and names.torchtitan_model(plan) is None:
        ledger.info(f"sequence length {seq}: torchtitan's own models assert a multiple of tp x 2 "
                    f"x cp = {divisor} in their parallelize functions "
                    "(ParallelDims.seq_len_divisor); drop that assert from yours")
    elif seq % divisor:
        again = (f", or re-plan with `{replan.resolve_hint(plan, TARGET)}`" if seq % 2 == 0
                 else "")  # an odd length splits for no tp
        raise SpecError(f"export torchtitan: torchtitan requires the sequence length ({seq}) to "
                        f"be a multiple of tp x 2 x cp = {divisor} (ParallelDims.seq_len_divisor); "
                        f"train on a sequence length divisible by {divisor}{again}")
    if p.get("offload_optimizer") and not _fsdp_on(plan, version):
        raise SpecError("export torchtitan: parallel.offload_optimizer: optimizer offload "
                        "becomes torchtitan's training.enable_cpu_offload, which builds the model on the CPU and moves "
                        "it back only through FSDP2's offload policy, and this plan runs no FSDP "
                        f"(dp x cp = {p['dp'] * p.get('cp', 1)}"
                        + (", ZeRO-0 replicas" if p["dp"] * p.get("cp", 1) > 1 else "")
                        + "): the model would train on the CPU; re-plan with "
                        f"`{replan.resolve_hint(plan, TARGET)}`")
    known = names.torchtitan_model(plan)
    if version == "0.2.2" and known and known[0] in ("deepseek_v3", "gpt_oss") and \
            p.get("ep", 1) > 1 and p["dp"] * p.get("cp", 1) == 1:
        raise SpecError(f"export torchtitan: torchtitan {version}'s {known[0]} needs an FSDP mesh "
                        f"(dp x cp > 1) with ep={p['ep']} (its parallelize function fetches it "
                        f"whenever experts are spread, and a mesh of size 1 does not exist); "
                        f"re-plan with `{replan.resolve_hint(plan, TARGET)}`")


def _tying(plan: Plan, version: str, ledger: common.Ledger, model: str | None) -> None:
    """A model whose input embedding and output head share one weight (model.tied_embeddings),
    in torchtitan's ``model`` (None: a model of the user's): 0.2.2's llama3 has no tying (its
    output a weight of its own); 0.2.2's qwen3 ties where the flavor sets enable_weight_tying;
    0.3.0 ties where the flavor says and refuses tying with a pipeline (NotImplementedError in its
    decoder). A pipeline otherwise puts the two on different stages, each its own copy: the
    split syncs no weight across stages."""
    if not plan.model.get("tied_embeddings"):
        return
    name, pp = plan.model["name"], plan.parallel.get("pp", 1)
    if model is not None and version != "0.2.2" and pp > 1:
        raise SpecError(f"export torchtitan: {name} ties its input embedding and output head "
                        f"(one weight), and torchtitan {version} refuses weight tying with "
                        f"pipeline parallelism; re-plan with "
                        f"`{replan.resolve_hint(plan, TARGET, {'pp': 1})}`")
    if version == "0.2.2" and model == "llama3":
        ledger.info(f"{name} ties its input embedding and output head (one weight); "
                    "torchtitan 0.2.2's llama3 has no weight tying, so its output layer is a "
                    "second weight of vocabulary x hidden size, with gradients and optimizer "
                    "states the plan did not price")
    elif pp > 1:
        ledger.info(f"{name} ties its input embedding and output head (one weight); with "
                    f"pp={pp} torchtitan {version}'s pipeline split puts them on different "
                    "stages, each its own copy (it syncs no weight across stages), and the two "
                    "train apart, where the plan priced one weight whose gradients the two "
                    "stages reduce")
    elif model is not None:
        ledger.info(f"{name} ties its input embedding and output head: set "
                    f"enable_weight_tying=True in the {model} flavor that trains it")


# ---- the settings --------------------------------------------------------------------------------

def _model(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    known = names.torchtitan_model(plan)
    _tying(plan, version, ledger, known[0] if known else names.torchtitan_family(plan))
    if known is None:
        family = names.torchtitan_family(plan)
        if plan.parallel["pp"] == 1 and family:  # (with a pipeline the module names say it)
            ledger.info(f"torchtitan has no flavor of {family} with {plan.model['name']}'s "
                        "dimensions: no [model] section is written; register one (its "
                        f"{family} model with these dimensions) and name it there")
        elif plan.parallel["pp"] == 1:
            ledger.info(f"torchtitan defines no model for {plan.model['name']}: no [model] "
                        "section is written; register yours with torchtitan (its parallelize "
                        "function applies the degrees below) and name it there")
        return []
    model, flavor = known
    if plan.parallel.get("cp", 1) > 1 and (version, model) in NO_CONTEXT_PARALLEL:
        raise SpecError(f"export torchtitan: torchtitan {version} runs no context parallelism "
                        f"for {plan.model['name']}: {NO_CONTEXT_PARALLEL[version, model]}; re-plan "
                        f"with `{replan.resolve_hint(plan, TARGET, {'cp': 1})}`")
    split = plan.parallel.get("pp", 1) > 1  # module names appear in the pipeline's split only
    names_note = "; the module names below are that model's" if split else ""
    why = (f"the plan's {plan.model['name']} is torchtitan's own {model} {flavor}{names_note}",)
    if (version, model) in FLEX_ATTENTION:
        ledger.info(f"timing: torchtitan {version}'s {model} {flavor} runs FlexAttention with a "
                    "block-causal mask (attention within each document of a packed sample), "
                    "which the plan priced as fused attention under a causal mask over the whole "
                    "sample: its attention time differs from planned")
    if version == "0.2.2":
        return [Setting("model", "name", model, why), Setting("model", "flavor", flavor)]
    config = names.torchtitan_config(plan)
    if config is None:
        ledger.info(f"torchtitan {version} builds {model} {flavor} (model_registry(\"{flavor}\") "
                    f"in torchtitan/models/{model}) but has no config function for it: pass "
                    f"--module {model} and --config <a config function of yours built on that "
                    f"model_registry> before these arguments{names_note}")
        return []
    return [Setting("cli", "--module", model, why), Setting("cli", "--config", config)]


def _data_parallel(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    p = plan.parallel
    dp, zero = p["dp"], p["zero"]
    out = _offload(plan, ledger)
    if dp == 1 and p.get("cp", 1) == 1:
        ledger.exact("dp", "zero")
        return [Setting("parallelism", "data_parallel_replicate_degree", 1,
                        ("no data parallelism (dp = 1)",)),
                Setting("parallelism", "data_parallel_shard_degree", 1)] + out
    ddp_refused = _ddp_refused(plan, version)
    if zero == 0 and not ddp_refused:
        ledger.exact("dp", "zero")
        if p.get("dp_replicate", 1) > 1:
            ledger.nearest("dp_replicate", "data parallel across sites with ZeRO-0: torchtitan's "
                           "DDP all-reduces over every replica at once, not inside each site "
                           "first (more bytes across the sites than planned)")
        return [Setting("parallelism", "data_parallel_replicate_degree", dp,
                        (f"ZeRO-0: plain data parallelism over dp = {dp} replicas, no sharding",)),
                Setting("parallelism", "data_parallel_shard_degree", 1)] + out
    ledger.exact("dp")
    states = "less memory for the states it shards"
    zero2 = ("nearest is FSDP without resharding after forward (ZeRO-2: gradients and optimizer "
             f"states sharded too, {states}, a reduce-scatter and an all-gather per step instead "
             "of one all-reduce)")
    if zero == 0 and ddp_refused == "cp":
        ledger.nearest("zero", f"ZeRO-0 with cp={p['cp']}: torchtitan shards the model states "
                       "whenever context parallelism is on (ParallelDims.fsdp_enabled: dp_shard "
                       f"or cp), over dp_shard x cp ranks; {zero2}")
    elif zero == 0 and ddp_refused == "experts":
        ep, etp = p.get("ep", 1), _expert_tp(plan, version)
        ledger.nearest("zero", f"ZeRO-0 with ep={p['ep']}: torchtitan folds the experts over "
                       f"dp_shard x cp x tp ranks (efsdp = dp_shard x cp x tp / (ep x etp) in its "
                       f"ParallelDims), and cp x tp = {p.get('cp', 1) * p['tp']} ranks cannot hold "
                       f"ep x etp = {ep * etp} expert ranks without sharded data parallelism; "
                       f"{zero2}")
    elif zero == 0:
        ledger.nearest("zero", f"ZeRO-0 with tp={p['tp']} pp={p['pp']}: torchtitan 0.2.2 runs "
                       "DDP only without tensor or pipeline parallelism (its llama3 "
                       "parallelize_llama raises 'DDP has not supported > 1D parallelism'); "
                       f"{zero2}")
    elif zero == 1:
        ledger.nearest("zero", "ZeRO-1 (optimizer states sharded, gradients and weights "
                       "replicated): FSDP2 always shards gradients and weights too; nearest is "
                       "FSDP without resharding after forward (ZeRO-2: gradients reduce-scattered "
                       "after every micro-batch's backward, not once a step"
                       + (f": {p['num_microbatches']} reduce-scatters a step where the plan prices "
                          "one" if p["num_microbatches"] > 1 else "") + f"; {states})")
    else:
        ledger.exact("zero")
    reshard = "always" if zero == 3 else "never"
    why = {0: "ZeRO-0 -> nearest FSDP2 setting (see the note above)",
           1: "ZeRO-1 -> nearest FSDP2 setting (see the note above)",
           2: "ZeRO-2 -> FSDP2 without resharding after forward (FSDP1's SHARD_GRAD_OP)",
           3: "ZeRO-3 -> FSDP2, weights resharded after every forward"}[zero]
    k = p.get("dp_replicate", 1)
    if k > 1:  # HSDP: sharded inside each site, replicated across the sites
        ledger.exact("dp_replicate")
        why = (f"{why}; HSDP: sharded over the {dp // k} replicas of each site, replicated "
               f"across the {k} sites (data parallel across sites)")
    return [Setting("parallelism", "data_parallel_replicate_degree", k, (why,)),
            Setting("parallelism", "data_parallel_shard_degree", dp // k),
            Setting("parallelism", "fsdp_reshard_after_forward", reshard)] + out


def _fsdp_on(plan: Plan, version: str) -> bool:
    """Whether the export turns FSDP on (ParallelDims.fsdp_enabled: dp_shard > 1 or cp > 1): with
    context parallelism, or data parallelism that is sharded or cannot be replicated."""
    p = plan.parallel
    return p.get("cp", 1) > 1 or (p["dp"] > 1 and (p["zero"] > 0 or bool(_ddp_refused(plan,
                                                                                     version))))


def _ddp_refused(plan: Plan, version: str) -> str:
    """Why torchtitan cannot replicate (DDP) over the plan's data-parallel ranks, or '': context
    parallelism turns FSDP on (ParallelDims.fsdp_enabled); 0.2.2's DDP takes a 1-D mesh only;
    experts fold over dp_shard x cp x tp, not over replicas."""
    p = plan.parallel
    if p.get("cp", 1) > 1:
        return "cp"
    if p.get("ep", 1) > 1 and (p.get("cp", 1) * p["tp"]) % (p["ep"] * _expert_tp(plan, version)):
        return "experts"  # (named first: the experts' mesh fails before any DDP check)
    if version == "0.2.2" and (p["tp"] > 1 or p["pp"] > 1):
        return "mesh"
    return ""


def _expert_tp(plan: Plan, version: str) -> int:
    """The experts' tensor-parallel degree torchtitan runs: the plan's in 0.2.2, 1 in 0.3.0 (its
    ParallelDims has no etp: experts borrow ranks from FSDP and TP, efsdp = dp_shard x cp x tp /
    ep)."""
    return plan.parallel.get("etp", 1) if version == "0.2.2" else 1


def _offload(plan: Plan, ledger: common.Ledger) -> list[Setting]:
    if not plan.parallel.get("offload_optimizer"):
        ledger.exact("offload_optimizer")
        return []
    ledger.nearest("offload_optimizer",
                   "optimizer offload: torchtitan cannot keep only the optimizer on the host; "
                   "nearest is training.enable_cpu_offload (FSDP2's CPUOffloadPolicy), which keeps "
                   "weights and gradients there too: less device memory than planned, but a "
                   "slower step (every all-gather reads host memory); for a plan without offload "
                   f"use `{replan.resolve_hint(plan, TARGET)}`")
    return [Setting("training", "enable_cpu_offload", True,
                    ("optimizer offload -> FSDP2 CPU offload (see the note above)",))]


def _model_parallel(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    p = plan.parallel
    ledger.exact("tp")
    out = [Setting("parallelism", "tensor_parallel_degree", p["tp"])]
    if p["tp"] == 1:
        ledger.exact("sequence_parallel")
    elif version == "0.2.2":
        if p["sequence_parallel"]:
            ledger.exact("sequence_parallel")
        else:
            ledger.nearest("sequence_parallel",
                           "sequence parallelism is off in the plan, but torchtitan 0.2.2 always "
                           "applies it with tensor parallelism (less activation memory than "
                           "planned; 0.3.0 has parallelism.enable_sequence_parallel)")
    else:
        ledger.exact("sequence_parallel")
        out.append(Setting("parallelism", "enable_sequence_parallel", bool(p["sequence_parallel"]),
                           (f"sequence parallelism {'on' if p['sequence_parallel'] else 'off'}",)))
    common.tp_overlap(plan, ledger, f"torchtitan {version} overlaps them only as async tensor "
                      "parallelism, which needs torch.compile; the export keeps it off")
    if p["tp"] > 1:
        section = "parallelism" if version == "0.2.2" else "compile"
        out.append(Setting(section, "enable_async_tensor_parallel", False,
                           ("the plan prices synchronous TP collectives (async TP also needs "
                            "compile)",)))
    out.append(Setting("parallelism", "pipeline_parallel_degree", p["pp"]))
    ledger.exact("pp")
    if p["pp"] > 1:
        out += _pipeline(plan, version, ledger)
    else:
        ledger.exact("stages", "schedule", "vpp")
    _placement(plan, ledger)
    common.site_stages(plan, ledger)
    if common.replica_sites(plan, ledger) > 1 and p["pp"] > 1:
        raise SpecError(f"export {TARGET}: data parallel across sites with a pipeline (pp="
                        f"{p['pp']}): torchtitan orders its device mesh pp outermost, so the "
                        "ranks of one site would hold pipeline stages, not whole replicas; "
                        f"re-plan with `{replan.resolve_hint(plan, TARGET)}`")
    return out


def _context(plan: Plan, version: str, ledger: common.Ledger,
             raising: dict[str, tuple[object, str]]) -> list[Setting]:
    """Context parallelism: the degree. Keys and values are all-gathered, torch's default rotate
    method for its context-parallel SDPA (torch/distributed/tensor/experimental/_context_parallel/
    _attention.py); FlexAttention always all-gathers (0.3.0's distributed/context_parallel/
    api.py). 0.2.2 has parallelism.context_parallel_rotate_method, but only its validator applies
    it (components/validate.py calls set_rotate_method; train.py does not), so training
    all-gathers whatever it says."""
    p = plan.parallel
    cp, form = p.get("cp", 1), p.get("cp_comm", "p2p")
    if cp == 1:
        ledger.exact("cp", "cp_comm")
        return []
    none = [targets.ATTENTION_FORMS[f] for f in plan.model.get("attention_forms", ())
            if f in targets.ATTENTION_FORMS and not targets.engine(TARGET).exchanges_over(f)]
    if none:  # (before the memory re-check below, which would blame the memory)
        raise SpecError(f"export torchtitan: torchtitan {version} runs no context parallelism "
                        f"over {' or '.join(none)}, which {plan.model['name']} has; re-plan "
                        f"with `{replan.resolve_hint(plan, TARGET, {'cp': 1})}`")
    ledger.exact("cp")
    why = (f"context parallelism: each sample's {plan.training['seq_len']} tokens over {cp} ranks "
           "(two chunks each, torchtitan's headtail load balancer)",)
    out = [Setting("parallelism", "context_parallel_degree", cp, why)]
    if form == "allgather":
        ledger.exact("cp_comm")
        return out
    raising["cp_comm"] = ("allgather", f"K/V all-gathered instead of {form}")
    ring = (" (with SDPA attention, call torch.distributed.tensor.experimental._attention."
            "set_rotate_method(\"alltoall\") in your training script for the planned ring)"
            if form == "p2p" else "")
    option = (" (its context_parallel_rotate_method reaches only the validator)"
              if version == "0.2.2" else "")
    ledger.nearest("cp_comm", f"cp_comm {form}: torchtitan {version} has no option for the K/V "
                   f"exchange in training{option}; its context parallelism all-gathers keys and "
                   f"values (torch's default rotate method; FlexAttention always){ring}; memory "
                   "re-checked below")
    return out


def _experts(plan: Plan, version: str, ledger: common.Ledger,
             raising: dict[str, tuple[object, str]]) -> list[Setting]:
    """Expert parallelism (parallelism.expert_parallel_degree, and in 0.2.2
    expert_tensor_parallel_degree, which must be 1 or tp) and the MoE settings torchtitan's MoE
    layer runs: all-to-all dispatch, no token dropping, grouped GEMMs (MoEArgs.use_grouped_mm)."""
    p = plan.parallel
    ep, etp = p.get("ep", 1), p.get("etp", 1)
    facts, s = moe.model(plan), moe.settings(plan)
    if not facts.moe:
        ledger.exact("ep", "etp", *common.MOE_SETTINGS)
        return []
    ledger.exact("ep")
    words = f"{facts.experts} routed experts" if facts.experts else "the routed experts"
    # (ParallelDims: with etp = tp the ep ranks come from dp_shard x cp, with etp = 1 from
    # dp_shard x cp x tp)
    over = "dp_shard x cp" if etp == p["tp"] else "dp_shard x cp x tp"
    out = [Setting("parallelism", "expert_parallel_degree", ep,
                   (f"{words} over ep {ep} ranks (folded over {over}); "
                    f"{moe.imbalance_words(plan)}",))]
    if version != "0.2.2" and ep > 1 and p["pp"] == 1:  # (with a pipeline: _pipeline's)
        out.append(Setting("training", "disable_cuda_graphs", True, (
            "torchtitan 0.3.0 refuses CUDA graphs with its all-to-all expert dispatch "
            "(TrainerConfig._validate_cuda_graphs)",)))
    if version == "0.2.2" and ep == 1 and p["tp"] > 1 and etp != p["tp"]:
        raising["etp"] = (p["tp"], f"experts' matrices split over tp={p['tp']}")
        ledger.nearest("etp", f"etp={etp} with ep=1: torchtitan {version} splits the experts' "
                       f"matrices over the tp={p['tp']} ranks when there is no expert "
                       "parallelism (apply_moe_ep_tp takes the tp mesh; its "
                       "expert_tensor_parallel_degree applies only with ep > 1): etp "
                       f"{p['tp']}, time and memory re-checked below")
    elif version == "0.2.2":
        ledger.exact("etp")
        out.append(Setting("parallelism", "expert_tensor_parallel_degree", etp))
    elif etp > 1:
        raising["etp"] = (1, "experts' matrices whole (etp 1)")
        ledger.nearest("etp", f"etp={etp}: torchtitan 0.3.0 does not split the experts' matrices "
                       "(its ParallelDims has no etp; experts borrow ranks from FSDP and TP); "
                       "nearest etp 1, memory re-checked below")
    else:
        ledger.exact("etp")
    return out + _moe_settings(plan, version, s, ledger)


MEGATRON_STYLE = ("selective", "moe_act", "mla_up_proj", "mla_up_proj+moe_act")
"""Megatron-Core's recomputation policies, which torchtitan runs as its per-op policy."""
SAVES_ALL_TO_ALL = targets.engine(TARGET).op_saves_all_to_all
"""torchtitan 0.2.2's models whose op-level checkpointing saves the expert all-to-alls' outputs,
as the planner prices op-level recomputation (targets.Engine.op_saves_all_to_all)."""

def _moe_settings(plan: Plan, version: str, s: dict, ledger: common.Ledger) -> list[Setting]:
    p = plan.parallel
    ep = p.get("ep", 1)
    known = names.torchtitan_model(plan)
    # its deepseek_v3 and llama4 read parallelism.expert_parallel_comm_backend (their names are
    # the Hugging Face model types the target lists)
    runs_deepep = targets.engine(TARGET)
    out = []
    if s["moe_dispatcher"] == "allgather" and ep > 1:
        backend = (" (parallelism.expert_parallel_comm_backend \"standard\")"
                   if version == "0.2.2" else "")
        ledger.nearest("moe_dispatcher", "moe_dispatcher allgather: torchtitan's MoE dispatches "
                       f"tokens by all-to-all{backend}; the step time differs from planned")
    elif s["moe_dispatcher"] == "deepep" and ep > 1:
        why = None
        if version != "0.2.2":
            why = (f"torchtitan {version} chooses DeepEP in a model's config function "
                   "(moe_comm_backend), not by a job option")
        elif not known or known[0] not in runs_deepep.deepep_models:
            why = (f"torchtitan {version} runs DeepEP in its "
                   f"{' and '.join(runs_deepep.deepep_models)} "
                   "models only (their parallelize functions read "
                   "parallelism.expert_parallel_comm_backend)")
        elif p.get("etp", 1) > 1 and not runs_deepep.deepep_with_etp:
            why = (f"torchtitan {version} raises NotImplementedError for DeepEP with expert "
                   f"tensor parallelism (etp={p['etp']})")
        if why:
            ledger.nearest("moe_dispatcher", f"moe_dispatcher deepep: {why}; its experts "
                           "exchange tokens by torch's all-to-all, and the step time differs "
                           "from planned")
        else:
            ledger.exact("moe_dispatcher")
            out.append(Setting("parallelism", "expert_parallel_comm_backend", "deepep",
                               ("DeepEP's dispatch and combine (install DeepEP next to "
                                "torchtitan)",)))
    else:
        ledger.exact("moe_dispatcher")
    # (a Megatron-style policy is written as op-level checkpointing too: _activation_checkpoint)
    if p["recompute"] in ("op", *MEGATRON_STYLE) and ep > 1 and version == "0.2.2" and \
            known and known[0] not in SAVES_ALL_TO_ALL:
        ledger.info(f"recompute op: torchtitan {version}'s {known[0]} does not save the expert "
                    "all-to-alls' outputs under op-level checkpointing (its _op_sac_save_list "
                    f"lacks all_to_all_single; its {', '.join(SAVES_ALL_TO_ALL)} save them, as "
                    "the plan prices): backward replays the forward's dispatch and combine, a "
                    "slower step and less memory than planned")
    ledger.dropless(s, "torchtitan's MoE")
    if s["moe_grouped_gemm"]:
        ledger.exact("moe_grouped_gemm")  # MoEArgs.use_grouped_mm, torchtitan's default on SM90+
    else:
        ledger.nearest("moe_grouped_gemm", "moe_grouped_gemm false: torchtitan's MoE runs the "
                       "experts as grouped GEMMs (its model's MoEArgs.use_grouped_mm, on by "
                       "default from SM90); not a job setting")
    if s["moe_overlap"] and ep > 1 and not plan.moe_overlap_blockers():  # (priced hidden)
        where = ("only with the DualPipeV schedule (parallelism.pipeline_parallel_expert_parallel_"
                 "overlap), which this plan does not use" if version == "0.2.2" else
                 "with no option of the job config")
        ledger.missing("moe_overlap", f"moe_overlap: torchtitan {version} overlaps the expert "
                       f"all-to-alls with compute {where}; they run exposed (a slower step than "
                       "planned)")
    else:
        ledger.exact("moe_overlap")
    if s["moe_shared_overlap"]:
        ledger.missing("moe_shared_overlap", f"moe_shared_overlap: torchtitan {version} runs the "
                       "shared expert apart from the dispatch; the all-to-alls it hid run exposed "
                       "(a slower step than planned)")
    else:
        ledger.exact("moe_shared_overlap")
    return out


def _placement(plan: Plan, ledger: common.Ledger) -> None:
    p = plan.parallel
    if p["pp"] > 1 and p["dp"] > 1 and common.placement(plan) == "tp-pp-dp":
        ledger.nearest("placement", "placement tp-pp-dp (pipeline neighbours on adjacent ranks): "
                       "torchtitan orders its device mesh pp, dp_replicate, dp_shard, cp, tp "
                       "(outermost first), which is tp-dp-pp; pipeline sends may cross slower "
                       "links than planned")
    else:
        ledger.exact("placement")


def _pipeline(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    p = plan.parallel
    parts = [list(st["modules"]) for st in plan.stages]
    if len(parts) != p["pp"] * p["vpp"]:
        raise SpecError(f"export torchtitan: the plan lists {len(parts)} stages for pp={p['pp']} x "
                        f"vpp={p['vpp']}; torchtitan needs one module list per (virtual) stage, "
                        "so re-create the plan or export to megatron")
    name = common.check_schedule(plan, TARGET, targets.engine(TARGET).schedules, ledger, {})
    ledger.exact("vpp", "micro_batch")
    out = [Setting("parallelism", "pipeline_parallel_schedule", SCHEDULES[name]),
           Setting("parallelism", "pipeline_parallel_microbatch_size", p["micro_batch"],
                   (f"{p['num_microbatches']} micro-batches per step = local_batch_size / this",))]
    parts, comments = _module_names(plan, version, ledger)
    out.append(Setting("parallelism", "module_fqns_per_model_part", parts, tuple(comments)))
    if version != "0.2.2":
        out.append(Setting("training", "disable_cuda_graphs", True,
                           ("torchtitan 0.3.0 refuses CUDA graphs with pipeline parallelism",)))
    return out


def _module_names(plan: Plan, version: str, ledger: common.Ledger) -> tuple[list, list[str]]:
    """(module lists per stage, comment lines); notes when the names are the user's."""
    lay = common.layout(plan)
    comments = [f"{len(plan.stages)} model parts, one per (virtual) stage"]
    if lay.stacks:
        comments.append(f"layers per stage: {common.stage_counts_text(lay)}"
                        + (" (even)" if lay.even else " (uneven)"))
    if not lay.stacks:
        ledger.info("the model has no repeated layer list: torchtitan cuts a model into stages "
                    "by deleting the modules a stage does not hold, so its forward must skip "
                    "missing modules")
    own = names.torchtitan_names(plan, version)
    known = names.torchtitan_model(plan)
    if own is not None and known is not None:
        ledger.exact("stages")
        comments.append(f"module names of torchtitan's own {known[0]} {known[1]}")
        return own, comments
    if own is not None:  # torchtitan's architecture, at a size of the user's
        family = names.torchtitan_family(plan)
        ledger.nearest("stages", f"module names: torchtitan has no flavor of {family} with "
                       f"{plan.model['name']}'s dimensions; register one (its {family} model "
                       "with these dimensions) and run that: module_fqns_per_model_part holds "
                       f"the module names of torchtitan's {family}")
        comments.append(f"module names of torchtitan's {family}, at a flavor of yours")
        return own, comments
    parts, wrapper = names.top_level_names(plan)
    unwrapped = (f", with the wrapper '{wrapper}' taken off the plan's names (the split matches "
                 "no deeper name)" if wrapper else "")
    ledger.nearest("stages", f"module names: torchtitan defines no model for "
                   f"{plan.model['name']}, so module_fqns_per_model_part holds your model's "
                   f"module names{unwrapped}: torchtitan's split keeps each stage's top-level "
                   "modules and entries of top-level layer lists (layers.3) by these names and "
                   "deletes the rest, so the model you register with torchtitan must hold them "
                   "at the top level")
    comments.append("module names are your model's (see the note above)")
    return parts, comments


def _activation_checkpoint(plan: Plan, version: str,
                           ledger: common.Ledger) -> list[tuple[str, object, tuple]]:
    """(key, value, comments) of [activation_checkpoint]; 0.3.0 takes the mode as a subcommand."""
    rc = plan.parallel["recompute"]
    if rc in ("none", "full"):
        ledger.exact("recompute")
        return [("mode", rc, (f"recompute {rc}",))]
    k = layer_interval(rc)
    if k and version != "0.2.2":  # (its subcommands: full, selective per op, none)
        ledger.nearest("recompute", f"recompute {rc} ({every_words(k)}): torchtitan {version}'s "
                       "activation-checkpoint subcommands take no layer frequency (selective is "
                       "per op); nearest full: more recompute time than planned, less memory")
        return [("mode", "full", (f"recompute {rc} -> full (see the note above)",))]
    if k:
        _layer_frequency_note(plan, k, ledger)
        return [("mode", "selective", (f"recompute {rc}: {every_words(k)} recomputed whole",)),
                ("selective_ac_option", str(k), ())]
    op = [("mode", "selective", (f"recompute {rc} -> per-op selective checkpointing",)),
          ("selective_ac_option", "op", ())]
    if rc == "op":
        ledger.exact("recompute")
        return op
    what = {"moe_act": "the routed experts' activation function and the norm before them",
            "mla_up_proj": "latent attention's up projections and rotary embedding",
            "mla_up_proj+moe_act": "latent attention's up projections and rotary embedding, and "
                                   "the routed experts' activation function and the norm before "
                                   "them"}.get(rc, "the attention core")
    ledger.nearest("recompute", f"recompute {rc} (Megatron-style: recompute {what}) "
                   "-> torchtitan's per-op selective checkpointing, which keeps attention outputs "
                   "and every other matmul output and recomputes the rest")
    return op


def _layer_frequency_note(plan: Plan, k: int, ledger: common.Ledger) -> None:
    """torchtitan's layer-frequency checkpointing counts the layers each process wraps, across
    its chunks, and wraps every k-th (a count global to its activation-checkpointing module):
    per pipeline rank that is a k-th of the rank's layers, rounded down, where the plan
    recomputes every k-th layer of the whole model (costmodels.memory.layer_policies). Exact
    where each rank's counts agree."""
    pp, recomputed = plan.parallel["pp"], set(plan.recomputed_blocks())
    layers = {b["name"] for b in plan.model["blocks"] if b.get("recompute", True)}
    planned, runs = zip(*targets.torchtitan_layer_counts(
        k, [sum(b in recomputed for b in st["blocks"]) for st in plan.stages],
        [sum(b in layers for b in st["blocks"]) for st in plan.stages], pp))
    if runs == planned:
        ledger.exact("recompute")
        return
    off = [r for r in range(pp) if runs[r] != planned[r]]
    fewer = [r for r in off if runs[r] < planned[r]]
    ledger.nearest("recompute", f"recompute {every_words(k)}: torchtitan counts each pipeline "
                   f"rank's own layers, so {len(off)} of the {pp} ranks "
                   f"recompute{'s' if len(off) == 1 else ''} another number "
                   f"of layers than planned (rank {off[0]}: {runs[off[0]]}, planned "
                   f"{planned[off[0]]})" + (
                       f"; {len(fewer)} of them keep{'s' if len(fewer) == 1 else ''} more "
                       "activations than planned, which is not "
                       f"re-checked: `{replan.resolve_hint(plan, TARGET)}` plans a split "
                       "torchtitan recomputes as priced" if fewer else ""))


def _recheck(plan: Plan, version: str, ledger: common.Ledger,
             raising: dict[str, tuple[object, str]]) -> None:
    """Re-price the plan as torchtitan runs it when that may need more memory: Megatron-style
    selective recomputation becomes torchtitan's per-op policy (the cost model prices both), a
    K/V exchange torchtitan lacks becomes one it has, split experts become whole (``raising``)."""
    p = plan.parallel
    changes, words = {}, []
    if p["recompute"] in MEGATRON_STYLE and "op" in RECOMPUTE:
        changes["recompute"] = "op"
        words.append(f"per-op instead of {p['recompute']} recomputation")
    dtype = None
    if _amp_off(plan):  # (said in _training's note)
        dtype = "fp32"
        words.append("float32 parameters and activations (no mixed precision without FSDP)")
    required = bool(changes or raising or dtype)  # else only the layout of the states differs
    if (not required and not common.layout_differs(plan, "fsdp2")
            and not common.kernels_differ(plan, TARGET)):
        common.layout_note(plan, TARGET, "fsdp2", ledger)
        return
    sharded = p["dp"] * p.get("cp", 1) > 1  # FSDP over dp_shard x cp (ParallelDims)
    if sharded and (p["zero"] == 1 or (p["zero"] == 0 and _ddp_refused(plan, version))):
        changes["zero"] = 2
        words.append(f"ZeRO-2 instead of ZeRO-{p['zero']}")
    if p["tp"] > 1 and not p["sequence_parallel"] and version == "0.2.2":
        changes["sequence_parallel"] = True
        words.append("sequence parallelism")
    for knob, (value, word) in raising.items():
        changes[knob] = value
        words.append(word)
    if p.get("offload_optimizer"):
        extra = required and [w for w in words if not w.startswith("ZeRO-")]
        ledger.info("memory not re-checked with the model states as torchtitan's FSDP2 lays them "
                    "out: its CPU offload (above) keeps the sharded parameters and gradients on "
                    "the host too, which the cost model does not price"
                    + (f"; {_offload_bound(plan, extra, dtype, changes)}" if extra else ""))
        return
    from planner.export import reprice  # lazy: prices with the search (and may trace)
    ledger.info(reprice.recheck(plan, TARGET, ", ".join(words), state_layout="fsdp2",
                                required=required, dtype=dtype, **changes))


def _offload_bound(plan: Plan, extra: list[str], dtype: str | None, changes: dict) -> str:
    """What else differs from an offloaded plan (``extra``: the changes but ZeRO's), priced with
    the plan's own layout (the optimizer alone on the host): a bound torchtitan's peak stays
    under, since its offload keeps more on the host (a review saw such an export say nothing of a
    K/V exchange that grows the activations)."""
    from planner.export import reprice  # lazy: prices with the search (and may trace)
    try:
        mem = reprice.memory(plan, target=TARGET, dtype=dtype,
                             **{k: v for k, v in changes.items() if k != "zero"})
    except PlannerError as exc:
        return (f"what else differs from the plan ({', '.join(extra)}) is not checked either "
                f"({exc}): watch the first steps' memory")
    where = f"{reprice.rank_words(mem)}; " if reprice.rank_words(mem) else ""
    bound = (f"with {', '.join(extra)} and the optimizer alone on the host, a GPU needs at most "
             f"{common.gb(mem.peak)} ({where}torchtitan's offload keeps more on the host)")
    if mem.peak <= mem.usable:
        return f"{bound}: within the {common.gb(mem.usable)} usable"
    return (f"{bound}, more than the {common.gb(mem.usable)} usable: whether the parameters and "
            "gradients on the host make up for it is not priced; watch the first steps' memory")


def _fp8(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    """FP8 GEMMs: 0.2.2 converts the Linears with a model converter; 0.3.0 sets converters in the
    Python config function (its model spec is not a command-line option)."""
    config = names.torchtitan_config(plan) if version != "0.2.2" else None
    if config in CONFIG_FP8 and plan.training["dtype"] != "fp8":
        ledger.nearest("dtype", f"dtype {plan.training['dtype']}: torchtitan {version}'s {config} "
                       "config function converts every Linear but lm_head to FP8 "
                       f"(Float8LinearConverter, {CONFIG_FP8[config]} scaling): these settings "
                       "train in FP8 where the plan is not (faster GEMMs than planned, other "
                       "numerics); give a config function of your own without the converter to "
                       "train as planned")
    if plan.training["dtype"] != "fp8":
        return []
    recipe = plan.training.get("engine", {}).get("fp8_recipe", "current")
    if config in CONFIG_FP8:
        ledger.nearest("dtype", f"dtype fp8 ({recipe} scaling): torchtitan {version}'s {config} "
                       "config function converts every Linear but lm_head to FP8 itself, with "
                       f"{CONFIG_FP8[config]} scaling (Float8LinearConverter's default recipe)")
        return []
    if version != "0.2.2":
        ledger.missing("dtype", "dtype fp8: torchtitan 0.3.0 converts Linears to FP8 in the "
                       "config function (model_registry(..., converters=[Float8LinearConverter."
                       "Config(...)]), as llama3_debugmodel_float8 does), not on the command line; "
                       "these settings train in bfloat16 unless your --config adds the converter")
        return []
    section, name = FP8[recipe]
    if recipe == "delayed":
        ledger.nearest("dtype", "fp8 with delayed scaling: torchao's float8 training (torchtitan's "
                       "converter) scales from the current amax (tensorwise); an amax read more "
                       "per cast than planned")
    if moe.model(plan).moe and engine_from_mapping(plan.training.get("engine")).fp8_experts:
        grouped = "float8" if recipe != "block" else "mx"
        ledger.nearest("dtype", f"fp8 for the routed experts: the {section.rsplit('.', 1)[1]} "
                       "converter swaps nn.Linear modules only, so the experts' grouped GEMMs run "
                       "in bf16 (the plan priced them in fp8; the torchtitan engine presets price "
                       "them bf16, fp8_experts=false); 0.2.2's grouped-GEMM converter "
                       f"(model.converters += quantize.grouped_mm.{grouped}, with "
                       f"--quantize.grouped_mm.{grouped}.fqns=experts) is a prototype that needs "
                       "torchao's nightly build and compile, and refuses pipeline and context "
                       "parallelism")
    return [Setting("model", "converters", [section],
                    (f"dtype fp8 ({recipe} scaling): the {section.rsplit('.', 1)[1]} converter "
                     "(needs torchao)",)),
            Setting(section, "recipe_name", name),
            Setting(section, "filter_fqns", ["output"],
                    ("the output layer stays bf16, as planned" + (
                        " (the float8 converter's default list is empty)"
                        if section.endswith("float8") else ""),))]


def _amp_off(plan: Plan) -> bool:
    """Whether torchtitan trains the plan in float32 though it asks for less: without FSDP (dp x
    cp = 1) and with tensor or pipeline parallelism, maybe_enable_amp turns mixed precision off
    (distributed/utils.py)."""
    p = plan.parallel
    return plan.training["dtype"] != "fp32" and p["dp"] * p.get("cp", 1) == 1 and (
        p["tp"] > 1 or p["pp"] > 1)


def _training(plan: Plan, ledger: common.Ledger) -> list[Setting]:
    p, t = plan.parallel, plan.training
    if p["pp"] > 1:
        local, why = p["micro_batch"] * p["num_microbatches"], (
            f"per data-parallel rank: micro-batch {p['micro_batch']} x "
            f"{p['num_microbatches']} pipeline micro-batches")
    else:
        local, why = p["micro_batch"], (
            f"the micro-batch; torchtitan accumulates gradients over global / (local x dp) = "
            f"{p['num_microbatches']} steps")
    ledger.exact("micro_batch", "num_microbatches", "global_batch", "seq_len")
    dtype = PRECISION.get(t["dtype"])
    if t["dtype"] == "fp8":
        dtype = "bfloat16"  # the weights and what is not an FP8 GEMM stay bf16 (see _fp8)
        ledger.exact("dtype")
    elif dtype is None:
        lacking = common.devices_without(plan, "bf16")
        if lacking:
            verb = "has" if len(lacking) == 1 else "have"
            raise SpecError(f"export {TARGET}: dtype {t['dtype']}, but torchtitan's mixed "
                            "precision offers bfloat16 or float32 parameters only, and "
                            f"{' and '.join(lacking)} {verb} no bfloat16; re-plan with --dtype "
                            "fp32, or export to megatron or deepspeed, which train in fp16")
        dtype = "bfloat16"
        ledger.nearest("dtype", f"dtype {t['dtype']}: torchtitan's mixed precision offers "
                       "bfloat16 or float32 parameters only; nearest bfloat16 (same bytes, wider "
                       "range)")
    else:
        ledger.exact("dtype")
    if _amp_off(plan):
        ledger.nearest("dtype", f"dtype {t['dtype']} with tp={p['tp']} pp={p['pp']} and no data "
                       "parallelism: torchtitan turns mixed precision off without FSDP when tensor "
                       "or pipeline parallelism is on (maybe_enable_amp, distributed/utils.py), so "
                       "it trains in float32: more memory and a slower step than planned; "
                       f"`{replan.resolve_hint(plan, TARGET)}` plans for it")
    return [Setting("training", "local_batch_size", local, (why,)),
            Setting("training", "global_batch_size", t["global_batch"]),
            Setting("training", "seq_len", t["seq_len"]),
            Setting("training", "mixed_precision_param", dtype, (f"dtype {t['dtype']}",)),
            Setting("training", "mixed_precision_reduce", "float32")]


# ---- writing them --------------------------------------------------------------------------------

def _intro(plan: Plan, version: str, how: list[str], notes: list[str]) -> list[str]:
    return common.header(plan, TARGET, version) + how + [
        f"Run it on exactly {plan.cluster['num_gpus']} GPUs "
        f"({counted(plan.cluster['nodes'], 'node')} x {plan.cluster['gpus_per_node']}).", ""] + common.notes_block(notes)


def _toml(plan: Plan, version: str, settings: list[Setting], notes: list[str]) -> str:
    how = ["Merge these sections into a torchtitan TOML job config ([job], tokenizer and",
           "hf_assets_path, [optimizer], data and checkpointing stay yours) and pass it with",
           "--job.config_file."]
    lines = common.comment_block(_intro(plan, version, how, notes)) + [""]
    for section in SECTION_ORDER:
        entries = [Entry(s.key, s.value, list(s.comments)) for s in settings
                   if s.section == section]
        lines += table(section, entries)
    return "\n".join(lines).rstrip("\n") + "\n"


def _cli(plan: Plan, version: str, settings: list[Setting], ac, notes: list[str]) -> str:
    model = [s for s in settings if s.section == "cli"]
    how = [f'Use: source this file, then pass "${{{ARRAY}[@]}}" to torchtitan\'s trainer, e.g.',
           f'torchrun --nnodes {plan.cluster["nodes"]} --nproc_per_node '
           f'{plan.cluster["gpus_per_node"]} -m torchtitan.train "${{{ARRAY}[@]}}"',
           "(tokenizer and hf_assets_path, optimizer, data and checkpointing stay yours; add",
           "their overrides among these, before the closing activation-checkpoint subcommand,",
           "which torchtitan's parser needs last)."]
    if not model:
        how.append("Put your model's --module <module> --config <config function> first.")
    groups = []
    for s in model:
        groups.append(([s.key, str(s.value)], " ".join(s.comments)))
    for section in SECTION_ORDER:
        for s in settings:
            if s.section != section:
                continue
            flag = _flag(s)
            if isinstance(s.value, list):  # one line per stage
                groups += [(flag[:1], "; ".join(s.comments))] + [([part], "") for part in flag[1:]]
            else:
                groups.append((flag, "; ".join(s.comments)))
    _, mode, comments = ac[0]
    groups.append(([f"activation-checkpoint:{mode}"], "; ".join(comments + (
        "a subcommand of torchtitan's parser: keep it last",))))
    return bash_file(common.comment_block(_intro(plan, version, how, notes)), [], ARRAY, groups)


def _flag(s: Setting) -> list[str]:
    """``--section.key value`` as torchtitan 0.3.0's parser (tyro) prints it in --help: hyphens
    in names, ``--section.no-key`` for false, stage lists as comma-joined words."""
    name = f"{s.section}.{s.key.replace('_', '-')}"
    v = s.value
    if isinstance(v, bool):
        return [f"--{name}"] if v else [f"--{s.section}.no-{s.key.replace('_', '-')}"]
    if isinstance(v, list):
        return [f"--{name}"] + [",".join(part) for part in v]
    return [f"--{name}", str(v)]
