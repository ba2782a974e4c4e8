"""Plan -> Megatron-LM command-line arguments, as a bash array in a file you ``source``.

Megatron-LM builds its own transformer (GPT, BERT, ...), so the plan must describe one stack of
identical layers with an embedding side before it and a head side after it; stages are described
by how many layers each holds. Mapping table and limits: docs/exports.md.
"""

from __future__ import annotations

import math

from costmodels.engine import engine_from_mapping
from costmodels.experts import overlap_blockers
from costmodels.memory import layer_interval, modules_of
from planner.errors import SpecError
from planner.options import same_data_parallelism
from planner.export import common, megatron_stages as stages, moe, names, replan
from planner.export.shell import Group, bash_file
from planner.planfile.document import Plan
from planner import targets

TARGET = "megatron"
ARRAY = "MEGATRON_PARALLEL_ARGS"
RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "moe_act": ["--recompute-granularity", "selective", "--recompute-modules", "moe_act",
                "layernorm"],
    "mla_up_proj": ["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"],
    "mla_up_proj+moe_act": ["--recompute-granularity", "selective", "--recompute-modules",
                            "mla_up_proj", "moe_act", "layernorm"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform",
             "--recompute-num-layers", "1"],
}
PRECISION = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [], "fp8": ["--bf16"]}
FP8_RECIPE = {"delayed": "delayed", "current": "tensorwise", "block": "mxfp8"}
"""Plan FP8 recipe -> Megatron-LM's --fp8-recipe (Transformer Engine's delayed scaling, per-tensor
current scaling, MXFP8 blocks)."""
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
CP_COMM = {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a", "a2a+p2p": "a2a+p2p"}
"""Plan K/V exchange -> --cp-comm-type. Megatron-LM passes the word to Transformer Engine's
DotProductAttention (megatron/core/extensions/transformer_engine.py), whose
attn_forward_func_with_cp accepts "p2p", "all_gather", "a2a" and "a2a+p2p" and raises "Unsupported
communication type" otherwise; the help text's "allgather" is not one of them."""


SCRIPTS = {"core_v0.14.0": "pretrain_gpt.py (or pretrain_bert.py)",
           "core_v0.19.0": "pretrain_gpt.py"}
"""The training scripts of each release the arguments suit (core_v0.19.0 ships no
pretrain_bert.py: pretrain_gpt.py, pretrain_mamba.py, pretrain_hybrid.py, pretrain_vlm.py)."""


def to_megatron(plan: Plan, version: str | None = None) -> str:
    """The plan as Megatron-LM arguments for ``version`` (default: planner.targets' release);
    SpecError when the model is not one layer stack or the engine cannot run the plan."""
    version = common.engine_version(TARGET, version)
    ledger = common.Ledger(TARGET, version)
    common.software_note(plan, TARGET, ledger)
    common.frozen_note(plan, TARGET, ledger)
    if targets.image_model(plan.model):
        raise SpecError(f"export megatron: {plan.model['name']} is an image model; this export "
                        "writes arguments for token sequences (pretrain_gpt.py's), not vision "
                        "models' layouts; export to torchtitan or deepspeed instead")
    if plan.model.get("model_type") == "bert":  # (a bidirectional encoder, not a decoder)
        ledger.info(f"{plan.model['name']} is a BERT encoder: pass these arguments to "
                    "pretrain_bert.py, not pretrain_gpt.py (a causal decoder)"
                    if "pretrain_bert.py" in SCRIPTS[version] else
                    f"{plan.model['name']} is a BERT encoder, and Megatron-LM {version} has no "
                    "BERT script (pretrain_gpt.py builds a causal decoder): export with "
                    "--engine-version core_v0.14.0 for its pretrain_bert.py")
    elif names.zoo_model(plan) is None and plan.model.get("source", "zoo") != "zoo":
        kind = plan.model.get("model_type") or "a model of your own code"
        ledger.info(f"{plan.model['name']} ({kind}) is not one of the planner's zoo models: these "
                    "arguments lay out Megatron-LM's own transformer (pretrain_gpt.py builds a "
                    "decoder from --hidden-size, --num-attention-heads, ...); check that "
                    "Megatron-Core defines this architecture before training it there")
    if plan.model.get("tied_embeddings") is False:
        ledger.info(f"{plan.model['name']} keeps its input embedding and output head apart: pass "
                    "--untie-embeddings-and-output-weights with your model arguments (Megatron "
                    "ties them unless told)")
    lay = stages.checked_layout(plan)
    _check_context(plan)
    _check_expert_bias(plan, version)
    groups = [_degrees(plan, version, ledger), _context(plan, ledger), _batch(plan, ledger),
              stages.pipeline_args(plan, lay, ledger), _memory(plan, version, ledger),
              _precision(plan, ledger)]
    experts, overlap = _experts(plan, version, ledger)
    groups += [experts, stages.mtp_args(plan)]
    env = _environment(plan, common.exported_zero(plan, TARGET, one_rank_any=True), overlap)
    notes = ledger.close()
    intro = common.header(plan, TARGET, version) + [
        f'Use: source this file, then pass "${{{ARRAY}[@]}}" to {SCRIPTS[version]} with your',
        "model (--hidden-size, --num-attention-heads, ...), data and optimizer arguments. The",
        "tensor-parallel split of each layer is Megatron's own.", ""]
    return bash_file(common.comment_block(intro + common.notes_block(notes)), env, ARRAY,
                     [line for group in groups for line in group])


def _check_expert_bias(plan: Plan, version: str) -> None:
    """SpecError for experts with biases (gpt-oss) split over etp > 1 ranks, which core_v0.19.0's
    TransformerConfig refuses ("Bias in Moe is only supported when ETP==1"; core_v0.14.0 does
    not check)."""
    etp = plan.parallel.get("etp", 1)
    if etp > 1 and version != "core_v0.14.0" and moe.model(plan).expert_bias:
        raise SpecError(f"export megatron: etp={etp} with {plan.model['name']}'s expert biases: "
                        f"Megatron-Core {version} supports bias in MoE only with "
                        "--expert-tensor-parallel-size 1; re-plan for it with "
                        f"`{replan.resolve_hint(plan, TARGET)}`")


def _check_context(plan: Plan) -> None:
    """SpecError when Megatron-LM refuses the plan's sequence split: validate_args wants the
    sequence in 2 x cp chunks (each rank one from the front and one from the back), and sequence
    parallelism scatters a cp rank's tokens over the tp ranks (tensor_parallel/mappings.py,
    _split_along_first_dim asserts they divide)."""
    p, seq = plan.parallel, plan.training["seq_len"]
    cp = p.get("cp", 1)
    if cp > 1 and seq % (2 * cp):
        raise SpecError(f"export megatron: Megatron-LM's validate_args requires the sequence "
                        f"length ({seq}) to be a multiple of 2 x context-parallel size ({2 * cp}); "
                        f"re-plan with `{replan.resolve_hint(plan, TARGET)}`")
    if p["tp"] > 1 and p["sequence_parallel"] and (seq // cp) % p["tp"]:
        raise SpecError(f"export megatron: sequence parallelism splits each cp rank's {seq // cp} "
                        f"tokens over tp={p['tp']} ranks, and Megatron-Core requires them to "
                        f"divide; re-plan with `{replan.resolve_hint(plan, TARGET)}`")


def _degrees(plan: Plan, version: str, ledger: common.Ledger) -> Group:
    p = plan.parallel
    cp = p.get("cp", 1)
    ledger.exact("dp", "tp", "pp")
    mesh = f"tp {p['tp']} x cp {cp} x pp {p['pp']}" if cp > 1 else f"tp {p['tp']} x pp {p['pp']}"
    out = [([], f"data-parallel size {p['dp']} follows from the world size: launch on "
                f"{plan.cluster['num_gpus']} GPUs = {mesh} x dp {p['dp']}"),
           (["--tensor-model-parallel-size", str(p["tp"]),
             "--pipeline-model-parallel-size", str(p["pp"])], "")]
    out += _sequence_parallel(plan, version, ledger)
    if common.tp_overlap(plan, ledger):
        out.append((["--tp-comm-overlap"], "tensor-parallel all-gathers and reduce-scatters "
                    "pipelined with their GEMMs (Transformer Engine's userbuffers), as planned"))
    out += _placement(plan, ledger)
    common.site_stages(plan, ledger)
    k = common.replica_sites(plan, ledger)
    if k > 1 and p["pp"] > 1 and not same_data_parallelism(
            p["tp"], p.get("cp", 1), p.get("ep", 1), p.get("etp", 1), experts=moe.model(plan).moe):
        raise SpecError(f"export {TARGET}: data parallel across {k} sites with a pipeline (pp="
                        f"{p['pp']}) needs the replicas outermost (--use-tp-pp-dp-mapping), which "
                        "Megatron-Core refuses unless ep x etp = tp x cp; its default order would "
                        "put each pipeline across the sites; re-plan with "
                        f"`{replan.resolve_hint(plan, TARGET)}`")
    if k > 1 and p["zero"] >= 1:
        ledger.exact("dp_replicate")
        out.append((["--num-distributed-optimizer-instances", str(k)],
                    f"data parallel across {k} sites: one distributed-optimizer instance per "
                    f"site, the gradients reduced inside its {p['dp'] // k} replicas, the shards "
                    "all-reduced across the sites"))
    elif k > 1:
        ledger.nearest("dp_replicate", f"data parallel across {k} sites with ZeRO-0: Megatron-LM "
                       "forms replicate groups (--num-distributed-optimizer-instances) only with "
                       "its distributed optimizer, so the gradients are all-reduced over every "
                       "replica at once, not inside each site first (more bytes across the "
                       "sites than planned)")
    return out


def _placement(plan: Plan, ledger: common.Ledger) -> Group:
    """--use-tp-pp-dp-mapping for placement tp-pp-dp, which Megatron-Core's
    initialize_model_parallel refuses with a pipeline unless the experts' data parallelism equals
    the attention's (options.same_data_parallelism): then its default order, tp-dp-pp."""
    p = plan.parallel
    if not (p["pp"] > 1 and p["dp"] > 1 and common.placement(plan) == "tp-pp-dp"):
        ledger.exact("placement")
        return []
    if same_data_parallelism(p["tp"], p.get("cp", 1), p.get("ep", 1), p.get("etp", 1),
                             experts=moe.model(plan).moe):
        ledger.exact("placement")
        return [(["--use-tp-pp-dp-mapping"],
                 "placement tp-pp-dp (Megatron's default order is tp-dp-pp)")]
    ledger.nearest("placement", "placement tp-pp-dp: Megatron-Core's initialize_model_parallel "
                   "refuses it with a pipeline unless ep x etp = tp x cp (the experts' and the "
                   "attention's data parallelism alike); its default order tp-dp-pp instead, "
                   "whose pipeline sends may cross nodes where the plan kept them inside"
                   + (", and whose expert-parallel groups (the all-to-alls) span other ranks "
                      "than planned" if p.get("ep", 1) > 1 else "")
                   + f" (not priced here); `{replan.resolve_hint(plan, TARGET)}` plans for it")
    return []


def _sequence_parallel(plan: Plan, version: str, ledger: common.Ledger) -> Group:
    """--sequence-parallel with tp > 1 as planned; with experts spread over ranks (ep > 1) and
    tp > 1 Megatron-Core's ModelParallelConfig raises without it in core_v0.14.0 ("When using
    expert parallelism and tensor parallelism, sequence parallelism must be used") and warns in
    core_v0.19.0 (megatron/core/model_parallel_config.py, __post_init__)."""
    p = plan.parallel
    if p["tp"] == 1:
        ledger.exact("sequence_parallel")
        return []
    if p["sequence_parallel"]:
        ledger.exact("sequence_parallel")
        return [(["--sequence-parallel"], "")]
    if p.get("ep", 1) == 1:
        ledger.exact("sequence_parallel")
        return []
    if version == "core_v0.14.0":
        ledger.nearest("sequence_parallel", f"sequence parallelism is off in the plan, but with "
                       f"ep={p['ep']} and tp={p['tp']} core_v0.14.0's ModelParallelConfig raises "
                       "\"When using expert parallelism and tensor parallelism, sequence "
                       "parallelism must be used\"; it is set: less activation memory than planned")
        return [(["--sequence-parallel"], "sequence parallelism: required with ep and tp (see "
                                          "the note above)")]
    ledger.exact("sequence_parallel")
    ledger.info(f"sequence parallelism is off as planned; with ep={p['ep']} and tp={p['tp']} "
                "core_v0.19.0's ModelParallelConfig warns \"When using expert parallelism and "
                "tensor parallelism for training, sequence parallelism must be used\" "
                "(core_v0.14.0 raises); add --sequence-parallel to follow it (less activation "
                "memory than planned)")
    return []


def _context(plan: Plan, ledger: common.Ledger) -> Group:
    """Context parallelism: --context-parallel-size and the K/V exchange, --cp-comm-type (with
    a2a+p2p the two levels, --hierarchical-context-parallel-sizes, which validate_args requires:
    the cp ranks of a node exchange heads by all-to-all, the nodes form a ring, as planned)."""
    p = plan.parallel
    cp, form = p.get("cp", 1), p.get("cp_comm", "p2p")
    ledger.exact("cp", "cp_comm")
    if cp == 1:
        return []
    args = ["--context-parallel-size", str(cp), "--cp-comm-type", CP_COMM[form]]
    words = {"p2p": "a ring of point-to-point K/V sends", "allgather": "K/V all-gathered",
             "a2a": "all-to-all over heads (Ulysses)",
             "a2a+p2p": "all-to-all inside a node, a ring across"}[form]
    if form == "a2a+p2p":
        inner = math.gcd(cp, max(1, plan.cluster["gpus_per_node"] // p["tp"]))
        args += ["--hierarchical-context-parallel-sizes", str(inner), str(cp // inner)]
        words += f": {inner} cp ranks per node x {cp // inner} nodes"
        if inner in (1, cp):  # a plan made before the planner refused one-level a2a+p2p
            ledger.info(f"cp_comm a2a+p2p with {inner} cp rank(s) per node x {cp // inner} "
                        f"node(s) has one level only: it runs as {'p2p' if inner == 1 else 'a2a'}"
                        " would; re-plan for the planner's current rules")
    _attention_notes(plan, form, ledger)
    return [(args, f"context parallelism: each sample's {plan.training['seq_len']} tokens over "
                   f"{cp} ranks, {words}")]


def _attention_notes(plan: Plan, form: str, ledger: common.Ledger) -> None:
    """Transformer Engine's attn_forward_func_with_cp refuses some exchanges for some attention
    (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): multi-head
    latent attention only with p2p or a2a+p2p before v2.16 (a note: later releases run it), a
    sliding window only with a2a or all_gather, sinks (a learnable softmax offset) only with a2a
    (planner.targets, "megatron"): a SpecError for those, naming a form that runs all of the
    model's attention and the re-plan (``--target megatron`` keeps to the forms every release
    runs)."""
    facts = moe.model(plan)
    if facts.mla and form in ("allgather", "a2a"):
        ledger.info(f"cp_comm {form} with {plan.model['name']}'s multi-head latent attention: "
                    "Transformer Engine before v2.16 runs MLA's context parallelism only with "
                    "p2p or a2a+p2p (it asserts \"Context parallelism does not support MLA with "
                    f"cp_comm_type='{CP_COMM[form]}'!\"); v2.16 and later run it; with an "
                    "older release re-plan with --fix cp_comm=p2p")
    eng = targets.engine("megatron")
    limits = [(what, forms) for what, forms, has in (
        ("sliding-window attention", eng.cp_comms_windowed, facts.sliding_window),
        ("attention with sinks", eng.cp_comms_sinks, facts.sinks)) if has]
    if any(form not in forms for _, forms in limits):
        runs = [f for f in eng.cp_comms if all(f in forms for _, forms in limits)]
        only = "; ".join(f"{what} only with {' or '.join(CP_COMM[f] for f in forms)}"
                         for what, forms in limits)
        raise SpecError(f"export megatron: cp_comm {form} with {plan.model['name']}'s attention: "
                        f"Transformer Engine's context parallelism runs {only}"
                        + (f"; re-plan with `{replan.resolve_hint(plan, TARGET)}`, which keeps "
                           f"to cp_comm={runs[0]} with degrees whose heads split for it"
                           if runs else ""))


def _experts(plan: Plan, version: str, ledger: common.Ledger) -> tuple[Group, bool]:
    """Expert parallelism and the MoE settings: (arguments, whether the EP all-to-all overlap is
    on). Megatron-LM's validate_args requires --num-experts, a multiple of
    --expert-model-parallel-size, with ep > 1; the count and top-k come from the zoo model."""
    p = plan.parallel
    ep, etp = p.get("ep", 1), p.get("etp", 1)
    facts, s = moe.model(plan), moe.settings(plan)
    ledger.exact("ep", "etp")
    if not facts.moe:
        ledger.exact(*common.MOE_SETTINGS)
        return [], False
    if etp > 1 and not facts.model_type and version != "core_v0.14.0":
        ledger.info(f"etp={etp}: the plan does not record whether {plan.model['name']}'s experts "
                    f"carry biases; Megatron-Core {version} supports bias in MoE only with "
                    "--expert-tensor-parallel-size 1 (re-plan with etp=1 if they do)")
    out: Group = [(["--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size",
                    str(etp)],
                   f"experts over ep {ep} ranks (folded over tp x cp x dp), their matrices over "
                   f"etp {etp} (Megatron's default etp is tp: written out)")]
    if facts.experts and facts.top_k:
        out.append((["--num-experts", str(facts.experts), "--moe-router-topk", str(facts.top_k)],
                    f"{plan.model['name']}: {facts.experts} routed experts, {facts.top_k} per "
                    f"token ({facts.known_from}); the rest of the MoE model "
                    "(--moe-ffn-hidden-size, shared experts, router) stays with your model "
                    "arguments"))
        if facts.layers and not all(facts.layers):  # (Megatron's default: every layer MoE)
            dense = len(facts.layers) - sum(facts.layers)
            out.append((["--moe-layer-freq", moe.layer_pattern(facts.layers)],
                        f"{dense} of its {len(facts.layers)} layers dense (1: routed experts, "
                        "0: a dense MLP); without it every layer would route"))
        if facts.groups:
            out.append((["--moe-router-num-groups", str(facts.groups[0]),
                         "--moe-router-group-topk", str(facts.groups[1])],
                        f"its node-limited routing: each token's experts from its best "
                        f"{facts.groups[1]} of {facts.groups[0]} groups, as priced (DeepEP's "
                        "network sends follow it)"))
    elif facts.experts:  # counted by the trace; the router's k is the model's own
        out.append((["--num-experts", str(facts.experts)],
                    f"{plan.model['name']}: {facts.experts} routed experts ({facts.known_from}); "
                    "add --moe-router-topk and the rest of the MoE model with your model "
                    "arguments"))
    else:
        ledger.info("--num-experts and --moe-router-topk are not written: the export does not "
                    f"know {plan.model['name']}'s expert count and top-k (not a zoo model, and no "
                    f"config.json where the plan names it that gives both and fits ep={ep}); "
                    "add them with your model arguments (validate_args requires --num-experts, "
                    f"a multiple of ep={ep}, when ep > 1)")
    ledger.exact("moe_dispatcher", "moe_capacity_factor", "moe_pad_to_capacity")
    out.append(_dispatcher(plan, version, s))
    if s["moe_capacity_factor"]:
        out.append((["--moe-expert-capacity-factor", f"{s['moe_capacity_factor']:g}",
                     "--moe-token-drop-policy", "probs"],
                    f"an expert takes at most {s['moe_capacity_factor']:g} x its mean tokens; "
                    "the rest are dropped, lowest router probability first (Megatron's default "
                    "policy)"))
    if s["moe_pad_to_capacity"]:
        out.append((["--moe-pad-expert-input-to-capacity"],
                    "every expert's input padded to its capacity (the router fills each expert's "
                    "slots" + ("; static shapes, no token counts to wait for)"
                               if s["moe_dispatcher"] == "alltoall" else ")")))
    out += _grouped_gemm(plan, version, s, ledger)
    overlap = _overlap(plan, s, version, ledger)
    if overlap:
        out.append((["--overlap-moe-expert-parallel-comm"],
                    "dispatch and combine all-to-alls behind another micro-batch's compute"))
    if s["moe_shared_overlap"] and plan.parallel.get("ep", 1) > 1 and \
            version == "core_v0.14.0" and _dispatcher(plan, version, s)[0][1] != "alltoall":
        # (core_v0.14.0's TransformerConfig: "moe_shared_expert_overlap only works with alltoall
        # token dispatcher"; core_v0.19.0 takes the flex dispatcher too)
        ledger.missing("moe_shared_overlap", f"Megatron-Core {version} runs the shared expert "
                       "beside the dispatch with the alltoall dispatcher only (its "
                       "TransformerConfig raises with DeepEP's flex dispatcher); left off: a "
                       "shared expert, where the model has one, runs after the routed experts, "
                       "slower than planned by up to its GEMMs' time per MoE layer; export for core_v0.19.0 or plan with "
                       "moe_shared_overlap=false")
        return out, overlap
    ledger.exact("moe_shared_overlap")
    facts = moe.model(plan)
    if s["moe_shared_overlap"] and facts.known_from and not facts.shared:
        ledger.info(f"moe_shared_overlap: {plan.model['name']} has no shared expert, so the "
                    "export leaves --moe-shared-expert-overlap out (it changes nothing)")
    elif s["moe_shared_overlap"] and plan.parallel.get("ep", 1) > 1:
        out.append((["--moe-shared-expert-overlap"],
                    "the shared expert beside the dispatch and combine (with your model's "
                    "--moe-shared-expert-intermediate-size)"))
    return out, overlap


def _dispatcher(plan: Plan, version: str, s: dict) -> tuple[list[str], str]:
    """--moe-token-dispatcher-type, and for DeepEP the flex dispatcher with its backend
    (core_v0.14.0: --moe-enable-deepep; core_v0.19.0 deprecates it for
    --moe-flex-dispatcher-backend deepep). Megatron-Core's flex dispatcher asserts "TPxEP > 1"
    (its tp being the experts'): with ep x etp = 1 nothing is dispatched, and alltoall is written."""
    p = plan.parallel
    imbalance = moe.imbalance_words(plan)
    if s["moe_dispatcher"] != "deepep":
        return (["--moe-token-dispatcher-type", s["moe_dispatcher"]],
                f"token dispatch by {s['moe_dispatcher']}; {imbalance}")
    if p.get("ep", 1) * p.get("etp", 1) == 1:
        return (["--moe-token-dispatcher-type", "alltoall"],
                "no expert parallelism: no token leaves its rank (the flex dispatcher that runs "
                f"DeepEP asserts TPxEP > 1); {imbalance}")
    backend = (["--moe-enable-deepep"] if version == "core_v0.14.0"
               else ["--moe-flex-dispatcher-backend", "deepep"])
    return (["--moe-token-dispatcher-type", "flex", *backend],
            "token dispatch by DeepEP (a token crosses the network once per node holding any of "
            f"its experts; install DeepEP next to Megatron-LM); {imbalance}")


def _grouped_gemm(plan: Plan, version: str, s: dict, ledger: common.Ledger) -> Group:
    if not s["moe_grouped_gemm"]:
        ledger.exact("moe_grouped_gemm")
        return []
    dtype = plan.training["dtype"]
    if version == "core_v0.14.0" and dtype in ("fp16", "fp32"):
        ledger.nearest("moe_grouped_gemm", f"grouped GEMM of the experts with dtype {dtype}: "
                       "core_v0.14.0's validate_args allows --moe-grouped-gemm with --bf16 only; "
                       "the local experts run one GEMM each (more launches than planned)")
        return []
    if version == "core_v0.14.0" and moe.model(plan).expert_bias:
        ledger.nearest("moe_grouped_gemm", f"grouped GEMM of {plan.model['name']}'s experts, "
                       "which have biases: core_v0.14.0's GroupedMLP and TEGroupedMLP assert "
                       "add_bias_linear is off (moe/experts.py), so the export leaves "
                       "--moe-grouped-gemm out and the local experts run one GEMM each "
                       "(SequentialMLP: more launches than planned)")
        return []
    ledger.exact("moe_grouped_gemm")
    return [(["--moe-grouped-gemm"], "the local experts as one grouped GEMM")]


def written_recompute(plan: Plan, version: str) -> str:
    """The recomputation the export writes: the plan's, or full where Megatron-LM has none of
    its kind (torchtitan's per-op policy) or refuses it (_moe_act_refused)."""
    rc = plan.parallel["recompute"]
    if layer_interval(rc):
        return rc
    if rc not in RECOMPUTE or ("moe_act" in modules_of(rc) and _moe_act_refused(plan, version)):
        return "full"
    return rc


def _overlap(plan: Plan, s: dict, version: str, ledger: common.Ledger) -> bool:
    """--overlap-moe-expert-parallel-comm, unless Megatron-Core's TransformerConfig refuses it for
    this plan (megatron/core/transformer/transformer_config.py: expert parallelism, the alltoall
    dispatcher, no full recomputation, bf16 or fp16, and virtual stages when pp > 1)."""
    p = plan.parallel
    if not s["moe_overlap"] or p.get("ep", 1) == 1:
        ledger.exact("moe_overlap")
        return False
    written = written_recompute(plan, version)
    why = overlap_blockers(engine_from_mapping({"moe_dispatcher": s["moe_dispatcher"]}),
                           ep=p.get("ep", 1), recompute=written, dtype=plan.training["dtype"],
                           pp=p["pp"], vpp=p["vpp"])
    if not why:
        ledger.exact("moe_overlap")
        return True
    ledger.exact("moe_overlap")  # the planner prices the overlap off where Megatron refuses it
    ledger.info("the engine setting overlaps the expert all-to-alls with compute, but "
                "Megatron-Core's --overlap-moe-expert-parallel-comm needs "
                f"{' and '.join(why)}; it is left off, and the plan prices the dispatch and "
                "combine exposed, as they run")
    return False


def _environment(plan: Plan, zero: int, overlap: bool = False
                 ) -> list[tuple[str, str | None, str]]:
    """CUDA_DEVICE_MAX_CONNECTIONS: Megatron-LM's validate_args asserts it is 1 with tensor or
    context parallelism on GPUs before Blackwell (get_device_arch_version() < 10; none on
    Blackwell's, common.blackwell_or_newer), unless Megatron-FSDP (ZeRO-2/3, which asserts it
    is not 1) or the EP all-to-all overlap (which needs it > 1: megatron/core/transformer/moe/
    README.md; validate_args then only warns about tp or cp) is on. ``zero``: the stage
    exported (common.exported_zero)."""
    p = plan.parallel
    if p["dp"] * p.get("cp", 1) > 1 and zero >= 2:
        both = (p["tp"] > 1 or p.get("cp", 1) > 1) and not common.blackwell_or_newer(plan)
        return [("CUDA_DEVICE_MAX_CONNECTIONS", None,
                 "Megatron-FSDP: Megatron-LM's validate_args requires CUDA_DEVICE_MAX_CONNECTIONS "
                 "unset or > 1" + ("; with tensor or context parallelism on GPUs before "
                                   "Blackwell it warns that those run best at 1, which "
                                   "Megatron-FSDP forbids (the cost of that is not priced)"
                                   if both else ""))]
    if overlap:
        return [("CUDA_DEVICE_MAX_CONNECTIONS", "32",
                 "the EP all-to-all overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (Megatron-Core's "
                 "MoE README); validate_args then only warns about tp or cp")]
    if p["tp"] == 1 and p.get("cp", 1) == 1 or common.blackwell_or_newer(plan):
        return []  # (validate_args asks for it below sm100 only)
    what = "tensor parallelism" if p.get("cp", 1) == 1 else (
        "context parallelism" if p["tp"] == 1 else "tensor and context parallelism")
    return [("CUDA_DEVICE_MAX_CONNECTIONS", "1",
             f"{what}: Megatron-LM's validate_args requires "
             "CUDA_DEVICE_MAX_CONNECTIONS=1 (on GPUs before Blackwell)")]


def _batch(plan: Plan, ledger: common.Ledger) -> Group:
    p, t = plan.parallel, plan.training
    ledger.exact("micro_batch", "num_microbatches", "global_batch", "seq_len")
    count = p["num_microbatches"]
    return [([], f"{count} micro-batch{'es' if count != 1 else ''} of {p['micro_batch']} per step "
                 "and data-parallel rank"),
            (["--micro-batch-size", str(p["micro_batch"]),
              "--global-batch-size", str(t["global_batch"]),
              "--seq-length", str(t["seq_len"])], "")]


def _check_states(plan: Plan, version: str, zero: int) -> None:
    """Refuse what Megatron-LM ``version`` refuses of the plan's state sharding and precision:
    core_v0.14.0's validate_args asserts "Expert parallelism is not supported with fp16
    training", and its Megatron-FSDP has no expert groups (megatron_fsdp.py calls a
    get_expert_dp_group its DistIndex lacks; utils.py: "Expert parallel is not supported in
    Megatron-FSDP"); Megatron-FSDP lays every rank of the world out as data x expert x tensor
    parallel ranks, so not beside a pipeline (mcore_fsdp_adapter.py _get_dp_tp_mesh, both
    releases: ZeRO-2 and -3 with a pipeline export as ZeRO-1, ``zero``, the stage exported:
    common.exported_zero); the precision-aware optimizer that optimizer offload needs takes adam
    only (OptimizerConfig, both releases)."""
    p, dtype = plan.parallel, plan.training["dtype"]
    ep = p.get("ep", 1)
    if version == "core_v0.14.0" and ep > 1 and dtype == "fp16":
        raise SpecError(f"export megatron: expert parallelism (ep={ep}) in fp16, which "
                        f"{version}'s validate_args refuses; export for core_v0.19.0, or re-plan with "
                        "--dtype bf16")
    if version == "core_v0.14.0" and ep > 1 and zero >= 2 and p["dp"] * p.get("cp", 1) > 1:
        raise SpecError(f"export megatron: ZeRO-{zero} with expert parallelism "
                        f"(ep={ep}) runs Megatron-FSDP, which has no expert groups in {version}; "
                        "export for core_v0.19.0, or re-plan with --fix zero=1")
    if p.get("offload_optimizer") and plan.training.get("optimizer") not in ("adam", "adamw"):
        raise SpecError("export megatron: optimizer offload runs Megatron's "
                        "precision-aware optimizer, which takes adam only, and the plan's "
                        f"optimizer is {plan.training.get('optimizer')}; re-plan with --fix "
                        "offload_optimizer=false or --optimizer adam")


def _memory(plan: Plan, version: str, ledger: common.Ledger) -> Group:
    p = plan.parallel
    zero = common.exported_zero(plan, TARGET, one_rank_any=True)
    _check_states(plan, version, zero)
    ledger.exact("offload_optimizer")
    _zero_note(plan, zero, ledger)
    out = _recompute(plan, version, ledger)
    layout = common.planned_layout(plan)
    if zero != p["zero"] or (layout is not None and (
            (common.layout_differs(plan, "megatron") and layout != "megatron-bf16-grads")
            or common.kernels_differ(plan, TARGET))):
        # another ZeRO stage, or priced for another engine's states or kernels
        from planner.export import reprice  # lazy: prices with the search (and may trace)
        kept = layout if layout == "megatron-bf16-grads" else "megatron"
        changed = zero != p["zero"]
        ledger.info(reprice.recheck(
            plan, TARGET, f"ZeRO-{zero} instead of the plan's ZeRO-{p['zero']}" if changed else "",
            state_layout=kept, required=changed, **({"zero": zero} if changed else {})))
    elif layout is None:
        common.layout_note(plan, TARGET, "megatron", ledger)
    if layout == "megatron-bf16-grads" and plan.training["dtype"] in ("bf16", "fp8"):
        out = out + [(["--grad-reduce-in-bf16"], "gradients kept and reduced in bf16, as priced")]
    if p["dp"] * p.get("cp", 1) == 1:  # states shard over dp x cp (Megatron's data-and-context
        # group); over one rank only the optimizer offload needs the distributed optimizer
        dist = [(["--use-distributed-optimizer"], "the distributed optimizer, over one rank: the "
                 "optimizer offload needs it")] if p.get("offload_optimizer") else []
        return out + dist + _offload(plan)
    if zero == 0:
        return out + [([], "ZeRO-0: plain data parallelism (Megatron's DDP)")] + \
            _overlap_dp(plan, zero, ledger) + _offload(plan)
    if zero == 1:
        return out + [(["--use-distributed-optimizer"], "ZeRO-1: the distributed optimizer")] + \
            _overlap_dp(plan, zero, ledger) + _offload(plan)
    return out + [(["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_STRATEGY[zero],
                    "--use-distributed-optimizer", "--no-gradient-accumulation-fusion",
                    "--ckpt-format", "fsdp_dtensor"],
                   f"ZeRO-{zero}: Megatron-FSDP")] + _overlap_dp(plan, zero, ledger) + \
        _offload(plan)


def _zero_note(plan: Plan, zero: int, ledger: common.Ledger) -> None:
    """What the export did with the plan's ZeRO stage: ``zero`` (common.exported_zero) is the
    plan's, or beside a pipeline ZeRO-1 for ZeRO-2 and -3, which run Megatron-FSDP, whose device
    mesh spans the data, expert and tensor parallel ranks only (mcore_fsdp_adapter.py: every
    rank of the world in one stage): the distributed optimizer, gradients not sharded (more
    memory, re-checked)."""
    p = plan.parallel
    if zero == p["zero"]:
        ledger.exact("zero")
        return
    ledger.nearest("zero", f"ZeRO-{p['zero']} with pp={p['pp']}: Megatron-LM runs it as "
                   "Megatron-FSDP, whose device mesh holds no pipeline (mcore_fsdp_adapter.py); "
                   f"nearest ZeRO-{zero}, the distributed optimizer: gradients not sharded, more "
                   "memory for them than planned (the whole re-checked below, with the other "
                   "changes)")


def _overlap_dp(plan: Plan, zero: int, ledger: common.Ledger) -> Group:
    """The data-parallel overlap the plan was priced with (EngineSpec.overlap_grad_reduce and
    overlap_param_gather), which Megatron-LM leaves off by default; --overlap-param-gather needs
    the distributed optimizer or Megatron-FSDP (ZeRO >= 1) and --overlap-grad-reduce
    (validate_args). ``zero``: the stage exported (common.exported_zero)."""
    engine = engine_from_mapping(plan.training.get("engine"))
    if not engine.overlap_grad_reduce:
        if zero >= 2:
            ledger.info(f"ZeRO-{zero}: Megatron-FSDP always overlaps its "
                        "gradient reduction (and, with optim_grads_params, its weight gathers: "
                        "megatron_fsdp.py), which the plan prices exposed (engine "
                        "overlap_grad_reduce=false): a faster step than planned")
            # (core_v0.14.0's MegatronFSDP asserts the flag with optim_grads; later releases
            # set it themselves)
            return [(["--overlap-grad-reduce"], "Megatron-FSDP reduces gradients behind "
                     "compute whatever the flag (core_v0.14.0 asserts it for ZeRO-2)")]
        return []
    if zero == 3:
        return [(["--overlap-grad-reduce", "--overlap-param-gather"],
                 "gradients reduced and weights gathered behind compute, as priced")]
    if zero >= 1 and engine.overlap_param_gather:
        return [(["--overlap-grad-reduce", "--overlap-param-gather"],
                 "gradients reduced behind the last micro-batch's backward, the updated weights "
                 "gathered behind the next step's first forward, as priced")]
    return [(["--overlap-grad-reduce"], "gradients reduced behind the last micro-batch's "
             "backward, as priced")]


def _recompute(plan: Plan, version: str, ledger: common.Ledger) -> Group:
    rc, written = plan.parallel["recompute"], written_recompute(plan, version)
    if layer_interval(rc):
        return _recompute_block(plan, ledger)
    if written == rc:
        ledger.exact("recompute")
        modules = modules_of(rc)
        if "moe_act" in modules and plan.training["dtype"] == "fp8":
            ledger.info(f"recompute {rc} under FP8: Megatron-Core runs moe_act and layernorm "
                        "recomputation in FP8 with Transformer Engine 2.6 or later only (it "
                        "raises otherwise)")
        if modules and version == "core_v0.14.0":
            ledger.info(f"recompute {rc} with {version}: its output-discarding checkpoint "
                        "(CheckpointWithoutOutput._recompute) copies the recomputed tensors into "
                        "the freed storage and keeps its own copy too, so while a layer's "
                        "backward runs it holds the freed tensors twice, where the plan prices "
                        "once (later releases share the storage)")
        what = [{"mla_up_proj": "multi-head latent attention's up projections and rotary "
                                "embedding (with --multi-latent-attention among the model's "
                                "arguments only: Megatron-Core's TransformerConfig raises "
                                "otherwise)",
                 "moe_act": "the routed experts' activation function and the norms before the "
                            "experts" + (" and before multi-head latent attention"
                                         if moe.model(plan).mla else "")}[m] for m in modules]
        return [(RECOMPUTE[rc], f"recompute {rc}" + (f": {'; '.join(what)}" if what else ""))]
    if "moe_act" in modules_of(rc):
        ledger.nearest("recompute", f"recompute {rc}: Megatron-Core refuses --recompute-modules "
                       f"moe_act layernorm {_moe_act_refused(plan, version)}; nearest full: less "
                       "memory, more recompute time than planned")
    else:
        ledger.nearest("recompute", f"recompute {rc} (torchtitan's per-op selective "
                       "checkpointing): Megatron-LM recomputes the attention core (selective) or "
                       "whole layers (full); nearest full: less memory, more recompute time than "
                       "planned")
    return [(RECOMPUTE[written], f"recompute {rc} -> {written} (see the note above)")]


def _recompute_block(plan: Plan, ledger: common.Ledger) -> Group:
    """full/k as Megatron-LM's block method: the first --recompute-num-layers layers of each
    chunk (virtual stage) recomputed whole, the others kept (TransformerBlock._checkpointed_forward
    counts the layers of its own chunk), the count the plan's chunks recompute."""
    rc, recomputed = plan.parallel["recompute"], set(plan.recomputed_blocks())
    counts = [sum(b in recomputed for b in st["blocks"]) for st in plan.stages]
    n = max(counts)
    if len(set(counts)) == 1:
        ledger.exact("recompute")
    else:
        fewer = sum(c < n for c in counts)
        ledger.nearest("recompute", f"recompute {rc}: the plan recomputes {min(counts)} to {n} "
                       "layers per chunk, and Megatron-LM one count for every chunk; "
                       f"--recompute-num-layers {n} recomputes more than planned on {fewer} of "
                       f"the {len(counts)} chunks (more time, less memory)")
    return [(["--recompute-granularity", "full", "--recompute-method", "block",
              "--recompute-num-layers", str(n)],
             f"recompute {rc}: the first {n} layer{'s' if n != 1 else ''} of each chunk "
             "recomputed whole, the others kept (as many as the plan's chunks recompute)")]


def _moe_act_refused(plan: Plan, version: str) -> str:
    """Why Megatron-Core would refuse the plan's ``moe_act`` recomputation ('' if it runs it):
    its TransformerConfig needs the experts' GEMMs grouped and no delayed FP8 scaling."""
    s = plan.training.get("engine", {})
    dtype = plan.training["dtype"]
    if not s.get("moe_grouped_gemm", True) or (version == "core_v0.14.0"
                                               and dtype in ("fp16", "fp32")):
        return "with the experts' GEMMs ungrouped (it needs --moe-grouped-gemm)"
    if dtype == "fp8" and s.get("fp8_recipe", "current") == "delayed":
        return "under FP8 delayed scaling"
    return ""


def _offload(plan: Plan) -> Group:
    """Optimizer states and step on the host: Megatron-LM's HybridDeviceOptimizer, which
    validate_args allows only with the precision-aware optimizer (itself needing the distributed
    optimizer, which ZeRO >= 1 gives); fraction 1 offloads all of it, as the plan prices."""
    if not plan.parallel.get("offload_optimizer"):
        return []
    return [(["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0",
              "--use-precision-aware-optimizer"],
             "optimizer offload: all optimizer states and the step on the host (fp32 main params "
             "and moments, Megatron's defaults, as planned; --overlap-cpu-optimizer-d2h-h2d would "
             "overlap the copies the plan prices as serial)")]


def _precision(plan: Plan, ledger: common.Ledger) -> Group:
    ledger.exact("dtype")
    dtype = plan.training["dtype"]
    out = [(PRECISION[dtype], f"dtype {dtype}" + (" (Megatron's default)" if dtype == "fp32"
                                                  else ""))]
    if dtype == "fp8":
        recipe = plan.training.get("engine", {}).get("fp8_recipe", "current")
        # MXFP8 in E4M3 throughout: Transformer Engine's MXFP8BlockScaling default and
        # Megatron-Bridge's MXFP8 recipes (fp8="e4m3"), whose published runs the FP8 GEMM share
        # is fitted on; the per-tensor recipes in hybrid (E5M2 gradients), as theirs
        fmt = "e4m3" if recipe == "block" else "hybrid"
        words = "E4M3 throughout" if recipe == "block" else "E4M3 forward, E5M2 gradients"
        out.append((["--fp8-format", fmt, "--fp8-recipe", FP8_RECIPE[recipe]],
                    f"FP8 GEMMs through Transformer Engine, {recipe} scaling ({words}); weights "
                    "and the rest in bf16"))
    return out
