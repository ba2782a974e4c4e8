"""What the exporters know of a plan's mixture of experts and attention, and its MoE settings.

A plan records the model by name, source and spec (``model.spec``: a zoo name, a config.json path,
``file.py:factory``), its size, its blocks and its layer lists, not the model's configuration. So
the expert count and the experts each token is routed to (top-k), which Megatron-LM needs on its
command line, come from the zoo entry the plan names (planner/inputs/zoo.py, the configuration the
plan was traced from) or from the Hugging Face config.json the plan names, read again where it
still is; for a model from anywhere else they are unknown to the export and stay the user's model
arguments. A model is a mixture of experts when its zoo entry has routed experts, when
the plan spreads experts (ep or etp > 1), or when its stages price expert parameters.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from planner.inputs.zoo import ROUTED_KEYS, ZOO
from planner.planfile.document import Plan

EXPERT_BIAS = ("gpt_oss",)
"""Hugging Face model types whose routed experts carry biases (gpt-oss's GptOssExperts:
gate_up_proj_bias and down_proj_bias; the trace marks them as BlockWork.expert_bias)."""
SINKS = ("gpt_oss",)
"""Hugging Face model types whose attention has sinks (gpt-oss's learnable softmax offset)."""
MOE_DEFAULTS = {"moe_dispatcher": "alltoall", "moe_capacity_factor": 0.0,
                "moe_pad_to_capacity": False,
                "moe_grouped_gemm": True, "moe_overlap": False, "moe_shared_overlap": False,
                "moe_imbalance": 1.0}
"""costmodels.engine.EngineSpec's defaults (plans from before these settings existed)."""


@dataclass(frozen=True)
class Model:
    """The facts of the plan's model an export may need beyond the plan itself."""

    moe: bool
    """The model routes tokens to experts."""
    experts: int | None = None
    """Routed experts per MoE layer (None: not known to the export)."""
    top_k: int | None = None
    """Experts each token is routed to (None: not known)."""
    groups: tuple[int, int] | None = None
    """(groups, groups per token) of node-limited routing (DeepSeek-V3: 8, 4); None: none."""
    shared: int = 0
    """Shared experts every token passes through (DeepSeek-V3: 1)."""
    model_type: str = ""
    """The Hugging Face model type of a zoo model ("mixtral", "qwen3_moe", ...); "" otherwise."""
    mla: bool = False
    """Multi-head latent attention (DeepSeek-V3): keys and values of different head sizes."""
    sliding_window: int = 0
    """Tokens of a sliding attention window in some layers (gpt-oss: 128); 0 for none."""
    expert_bias: bool = False
    """The routed experts add a bias vector each (gpt-oss)."""
    sinks: bool = False
    """The attention has sinks (gpt-oss)."""
    known_from: str = ""
    """Where the expert count came from ("planner's zoo", the config file's path); "" unknown."""
    layers: tuple[int, ...] | None = None
    """Per decoder layer, 1 where it routes to experts and 0 where its MLP is dense, from the
    config (DeepSeek's first_k_dense_replace and moe_layer_freq, Qwen-MoE's decoder_sparse_step
    and mlp_only_layers); None where not known."""


def moe_layers(cfg: dict) -> tuple[int, ...] | None:
    """Which decoder layers of a Hugging Face MoE config route to experts (Model.layers)."""
    n = int(cfg.get("num_hidden_layers") or 0)
    if not n:
        return None
    first, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = {int(i) for i in cfg.get("mlp_only_layers") or ()}
    return tuple(int(i >= first and (i - first) % freq == 0 and (i + 1) % step == 0
                     and i not in dense) for i in range(n))


def layer_pattern(layers: tuple[int, ...]) -> str:
    """Megatron-LM's --moe-layer-freq list expression of ``layers``: runs of equal values, and
    the shortest period repeated (``([0]*3+[1]*58)``, ``([0]+[1])*24``)."""
    def runs(seq) -> str:
        out, i = [], 0
        while i < len(seq):
            j = i
            while j < len(seq) and seq[j] == seq[i]:
                j += 1
            out.append(f"[{seq[i]}]" + (f"*{j - i}" if j - i > 1 else ""))
            i = j
        return "+".join(out)

    n = len(layers)
    period = next(p for p in range(1, n + 1) if n % p == 0 and layers == layers[:p] * (n // p))
    return f"({runs(layers[:period])})*{n // period}" if period < n else f"({runs(layers)})"


def model(plan: Plan) -> Model:
    """The plan's model as far as the export can know it (see the module docstring)."""
    m, p = plan.model, plan.parallel
    spread = p.get("ep", 1) > 1 or p.get("etp", 1) > 1 or any(
        "expert_params" in st.get("predicted", {}) for st in plan.stages)
    entry = ZOO.get((m.get("spec") or "").lower()) if m.get("source", "zoo") == "zoo" else None
    if entry is not None:
        cfg, model_type, where = entry.config, entry.model_type, "planner's zoo"
    else:
        cfg, where = _config_file(m)
        model_type = str(cfg.get("model_type", ""))
    routed = next((int(cfg[k]) for k in ROUTED_KEYS if cfg.get(k)), None) if cfg else None
    if entry is None and routed and routed % int(p.get("ep", 1)):
        cfg, routed = {}, None  # not the config the plan was made from (edited, or another file)
    if not cfg:  # the expert count the trace found, where the plan records it
        traced = int(m.get("routed_experts", 0)) or None
        return Model(moe=spread or bool(traced), experts=traced,
                     known_from="the trace" if traced else "")
    top_k = cfg.get("num_experts_per_tok")
    groups, kept = int(cfg.get("n_group") or 0), int(cfg.get("topk_group") or 0)
    return Model(moe=bool(routed) or spread, experts=routed,
                 top_k=int(top_k) if routed and top_k else None,
                 groups=(groups, kept) if routed and 0 < kept < groups else None,
                 shared=int(cfg.get("n_shared_experts", 0) or 0) or  # (Qwen2-MoE: one, sized)
                 int(bool(cfg.get("shared_expert_intermediate_size"))), model_type=model_type,
                 mla=bool(cfg.get("kv_lora_rank")), sliding_window=int(cfg.get("sliding_window")
                                                                       or 0),
                 expert_bias=model_type in EXPERT_BIAS, sinks=model_type in SINKS,
                 known_from=where if routed else "", layers=moe_layers(cfg) if routed else None)


def _config_file(m: dict) -> tuple[dict, str]:
    """(the Hugging Face config the plan was traced from, its path) where the plan names one that
    is still there (a relative path from the current folder, as the plan was made); ({}, "")
    otherwise. ``model`` drops one whose expert count the plan's ep does not divide."""
    spec = m.get("spec") or ""
    if m.get("source") != "hf-config" or not spec:
        return {}, ""
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}, ""
    return (cfg, path) if isinstance(cfg, dict) else ({}, "")


def settings(plan: Plan) -> dict:
    """The MoE engine settings the plan was priced with (training.engine, with the defaults)."""
    engine = plan.training.get("engine") or {}
    return {k: engine.get(k, v) for k, v in MOE_DEFAULTS.items()}


def imbalance_words(plan: Plan) -> str:
    """A comment on the routing the plan assumed (a modelling assumption, not an engine setting)."""
    s = settings(plan)
    load = s["moe_imbalance"]
    if s["moe_pad_to_capacity"]:
        return (f"every expert padded to {s['moe_capacity_factor']:g} x the mean tokens "
                "(moe_pad_to_capacity), however the router spreads them")
    if load == 1.0:
        return ("the plan assumes balanced routing (moe_imbalance 1.0, as forced-balance "
                "benchmarks run); real routing loads the busiest expert more")
    return (f"the plan assumes a layer's busiest expert gets {load:g} x the mean tokens "
            "(moe_imbalance; an assumption, no engine setting)")
