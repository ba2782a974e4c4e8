"""Module names in an engine's own model definitions, for the zoo models the engine defines.

A plan names modules as the model it traced names them: the zoo's models are Hugging Face
``*ForCausalLM`` classes (``model.embed_tokens``, ``model.layers.<i>``, ``model.norm``,
``lm_head``). torchtitan builds its own Llama 3 (``torchtitan/models/llama3``), Qwen3 with its
mixtures of experts (``models/qwen3``), DeepSeek-V3 (``models/deepseek_v3``) and gpt-oss
(``models/gpt_oss``), whose top-level modules are ``tok_embeddings``, ``layers`` (a ModuleDict
keyed "0", "1", ...), ``norm`` and ``output`` (0.2.2, ``model/model.py``) or ``lm_head`` (0.3.0,
``models/common/decoder.py``); rotary tables are a buffer there, not a module. Its pipeline split
keeps, per stage, the top-level modules and layer keys named in ``module_fqns_per_model_part`` and
deletes the rest, so the names must be its own. Each model below has the zoo model's parameter
count exactly in both releases (built on the meta device: Llama 3 8B/70B/405B; Qwen3-30B-A3B
30,532,122,624; Qwen3-235B-A22B 235,093,634,560; DeepSeek-V3 671,026,404,352; gpt-oss-120b
116,829,156,672). torchtitan defines no Mixtral. tests/planner/export/test_engines.py builds
torchtitan's own models on the meta device and checks that the split puts the parameters where
the plan says.
"""

from __future__ import annotations

import json
import os
import re

from planner.inputs.zoo import ZOO
from planner.planfile.document import Plan

TORCHTITAN_MODELS = {
    "llama3-8b": ("llama3", "8B", "llama3_8b"),
    "llama3-70b": ("llama3", "70B", "llama3_70b"),
    "llama3-405b": ("llama3", "405B", "llama3_405b"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B", None),
    "deepseek-v3": ("deepseek_v3", "671B", "deepseek_v3_671b"),
    "deepseek-v3-mtp": ("deepseek_v3", "671B", "deepseek_v3_671b"),
    "gpt-oss-120b": ("gpt_oss", "120b", "gpt_oss_120b"),
}
"""Zoo model -> (torchtitan model, flavor of the same shapes, 0.3.0 config function or None).
0.2.2 picks a model by ``[model] name`` and ``flavor``; 0.3.0 by ``--module`` and ``--config``, a
function of ``torchtitan/models/<model>/config_registry.py``: 0.3.0 builds Qwen3-235B-A22B
(``model_registry("235B-A22B")``) but has no config function for it. torchtitan's DeepSeek-V3 has
no multi-token prediction: deepseek-v3-mtp exports as its main model, with a note
(planner.export.common.mtp_note)."""

ZOO_SHAPES = {
    ("llama", 8_030_261_248): "llama3-8b",
    ("llama", 70_553_706_496): "llama3-70b",
    ("llama", 405_853_388_800): "llama3-405b",
    ("mixtral", 46_702_792_704): "mixtral-8x7b",
    ("mixtral", 140_630_071_296): "mixtral-8x22b",
    ("qwen3_moe", 30_532_122_624): "qwen3-30b-a3b",
    ("qwen3_moe", 235_093_634_560): "qwen3-235b-a22b",
    ("deepseek_v3", 671_026_404_352): "deepseek-v3",
    ("deepseek_v3", 682_636_472_320): "deepseek-v3-mtp",
    ("gpt_oss", 116_829_156_672): "gpt-oss-120b",
}
"""(Hugging Face model type, parameters) -> the zoo model of that architecture: a plan of a
config.json (Meta-Llama-3.1-8B's, Qwen3-30B-A3B's, ...) builds the same model as the zoo name, so
the engines' own definitions of it apply, where the config also sets what changes the work and
not the parameters as the zoo model does (WORK_KEYS; tests/planner/export/test_zoo_shapes.py
checks the counts against the zoo's models built on the meta device)."""

WORK_KEYS = ("num_experts_per_tok", "n_group", "topk_group", "sliding_window", "layer_types",
             "use_sliding_window")
"""Config keys that change a model's work per token and not its parameters: the experts each
token runs, the router's groups, attention windows."""


def zoo_model(plan: Plan) -> str | None:
    """The zoo model the plan is of: its zoo name, or the zoo model a Hugging Face config of
    the same type and parameter count builds (ZOO_SHAPES), read again to check that it sets
    WORK_KEYS as the zoo model does (a review: a Qwen3-30B-A3B config at top-2 was exported as
    torchtitan's top-8 flavor); None for other models, or a config no longer where the plan says."""
    m = plan.model
    source = m.get("source", "zoo")
    if source == "zoo":
        return m.get("spec") or None
    name = ZOO_SHAPES.get((m.get("model_type"), m.get("num_params")))
    if source != "hf-config" or name is None:
        return None
    path = str(m.get("spec") or "")
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    zoo = ZOO[name].config
    same = isinstance(raw, dict) and all(raw[k] == zoo[k] for k in WORK_KEYS
                                         if k in raw and k in zoo)
    return name if same else None


_HF_TOP = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm"}
_HF_HEAD = {"0.2.2": "output", "0.3.0": "lm_head"}
_HF_DROPPED = {"model.rotary_emb"}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)")


def torchtitan_model(plan: Plan) -> tuple[str, str] | None:
    """(torchtitan model, flavor) when the plan is of a zoo model torchtitan defines (by name or
    by its config: zoo_model), else None."""
    known = TORCHTITAN_MODELS.get(zoo_model(plan) or "")
    return None if known is None else (known[0], known[1])


def torchtitan_config(plan: Plan) -> str | None:
    """torchtitan 0.3.0's config function for the plan's model (``--config``), or None."""
    known = TORCHTITAN_MODELS.get(zoo_model(plan) or "")
    return None if known is None else known[2]


TORCHTITAN_FAMILIES = {"llama": "llama3", "qwen3": "qwen3", "qwen3_moe": "qwen3",
                       "deepseek_v3": "deepseek_v3", "gpt_oss": "gpt_oss"}
"""Hugging Face model type -> the torchtitan model of that architecture, at any size: a plan of
a config of another size is that model with a flavor the user registers (its model args), whose
module names are torchtitan's."""


def torchtitan_family(plan: Plan) -> str | None:
    """The torchtitan model of the plan's architecture (TORCHTITAN_FAMILIES), whatever its size;
    None where torchtitan defines none or the plan does not record its model type."""
    m = plan.model
    kind = m.get("model_type")
    if not kind and m.get("source", "zoo") == "zoo" and (m.get("spec") or "") in ZOO:
        kind = ZOO[m["spec"]].model_type
    return TORCHTITAN_FAMILIES.get(str(kind or ""))


def torchtitan_names(plan: Plan, version: str) -> list[list[str]] | None:
    """Each stage's modules in torchtitan's own names for the plan's model, or for a model of an
    architecture torchtitan defines at another size (torchtitan_family); None otherwise (its
    names are then the user's: top_level_names)."""
    if torchtitan_model(plan) is None and torchtitan_family(plan) is None:
        return None
    head = _HF_HEAD[version]
    parts = []
    for st in plan.stages:
        names = []
        for fqn in st["modules"]:
            layer = _HF_LAYER.fullmatch(fqn)
            if layer:
                names.append(f"layers.{layer.group(1)}")
            elif fqn in _HF_TOP:
                names.append(_HF_TOP[fqn])
            elif fqn == "lm_head":
                names.append(head)
            elif fqn == "mtp" or fqn.startswith("mtp."):
                continue  # MTP depths: torchtitan's model has none (common.mtp_note says so)
            elif fqn not in _HF_DROPPED:
                return None  # a module this mapping does not know: not the zoo model as expected
        parts.append(names)
    return parts


def top_level_names(plan: Plan) -> tuple[list[list[str]], str]:
    """Each stage's modules as torchtitan's split can find them in a model of the user's, and the
    wrappers taken off ("" for none; "model.language_model." for two). The split keeps a stage's
    top-level modules and entries of top-level layer lists (``layers.3``) by name, so a name
    nested deeper matches nothing: while every nested name sits under one wrapper (Hugging Face's
    ``model.``), it is taken off, and the user's model must hold the modules at the top level
    under the names left."""
    parts, taken = [list(st["modules"]) for st in plan.stages], ""
    while True:  # (wrappers within wrappers: model.language_model.layers.0)
        nested = {m.split(".")[0] for part in parts for m in part
                  if m.count(".") > 1 or (m.count(".") == 1 and not m.split(".")[1].isdigit())}
        if len(nested) != 1:
            return parts, taken
        wrapper = nested.pop() + "."
        taken += wrapper
        parts = [[m[len(wrapper):] if m.startswith(wrapper) else m for m in part]
                 for part in parts]
