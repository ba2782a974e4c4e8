"""Module names in an engine's own model definitions, for the zoo models the engine defines.

A plan names modules as the model it traced names them: the zoo's Llama 3 models are Hugging Face
``LlamaForCausalLM`` (``model.embed_tokens``, ``model.layers.<i>``, ``model.norm``, ``lm_head``).
torchtitan builds its own Llama 3 (``torchtitan/models/llama3``) whose top-level modules are
``tok_embeddings``, ``layers`` (a ModuleDict keyed "0", "1", ...), ``norm`` and ``output``
(0.2.2, ``model/model.py``) or ``lm_head`` (0.3.0, ``models/common/decoder.py``); rotary tables
are a buffer there, not a module. Its pipeline split keeps, per stage, the top-level modules and
layer keys named in ``module_fqns_per_model_part`` and deletes the rest, so the names must be its
own. tests/planner/export/test_engines.py builds torchtitan's own model on the meta device and
checks that the split puts the parameters where the plan says.
"""

from __future__ import annotations

import re

from planner.planfile.document import Plan

TORCHTITAN_LLAMA3 = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}
"""Zoo model -> torchtitan llama3 flavor of the same size (dim, layers, heads, kv heads, FFN and
vocabulary sizes equal)."""

_HF_LLAMA_TOP = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm"}
_HF_LLAMA_HEAD = {"0.2.2": "output", "0.3.0": "lm_head"}
_HF_LLAMA_DROPPED = {"model.rotary_emb"}
_HF_LLAMA_LAYER = re.compile(r"model\.layers\.(\d+)")


def torchtitan_model(plan: Plan) -> tuple[str, str] | None:
    """(torchtitan model, flavor) when the plan is of a zoo model torchtitan defines, else None."""
    m = plan.model
    flavor = TORCHTITAN_LLAMA3.get(m.get("spec") or "")
    if flavor is None or m.get("source", "zoo") != "zoo":
        return None
    return "llama3", flavor


def torchtitan_names(plan: Plan, version: str) -> list[list[str]] | None:
    """Each stage's modules in torchtitan's own names for the plan's model, or None when
    torchtitan does not define it (its names are then the user's)."""
    if torchtitan_model(plan) is None:
        return None
    head = _HF_LLAMA_HEAD[version]
    parts = []
    for st in plan.stages:
        names = []
        for fqn in st["modules"]:
            layer = _HF_LLAMA_LAYER.fullmatch(fqn)
            if layer:
                names.append(f"layers.{layer.group(1)}")
            elif fqn in _HF_LLAMA_TOP:
                names.append(_HF_LLAMA_TOP[fqn])
            elif fqn == "lm_head":
                names.append(head)
            elif fqn not in _HF_LLAMA_DROPPED:
                return None  # a module this mapping does not know: not the zoo model as expected
        parts.append(names)
    return parts
