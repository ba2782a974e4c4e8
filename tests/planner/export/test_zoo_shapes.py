"""A plan of a Hugging Face config that builds a zoo model is exported as that model
(planner.export.names.zoo_model)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from planner.export import names
from planner.export.megatron import to_megatron
from planner.export.torchtitan import to_torchtitan
from planner.planfile.document import load_plan

PLANS = os.path.join(os.path.dirname(__file__), "data", "plans")


def test_the_shapes_are_the_zoo_models_parameter_counts():
    """Each (model type, parameters) is what the zoo's configuration builds on the meta device."""
    from transformers import AutoConfig

    from planner.inputs.zoo import ZOO
    from planner.trace import hf

    for (model_type, count), name in names.ZOO_SHAPES.items():
        entry = ZOO[name]
        cfg = AutoConfig.for_model(entry.model_type, **entry.config)
        depths = int(entry.config.get("num_nextn_predict_layers", 0))  # (DeepSeek-V3's MTP)
        built = hf.build(cfg, entry.architecture, 128, torch.bfloat16, "meta", depths).module
        assert (entry.model_type, sum(p.numel() for p in built.parameters())) == \
            (model_type, count), name


def _from_config(plan, spec="no/such/config.json", **model):
    return dataclasses.replace(plan, parallel={**plan.parallel, "recompute": "full"}, model={
        **plan.model, "source": "hf-config", "spec": str(spec), **model})


def _config(folder, name, **changes):
    from planner.inputs.zoo import ZOO

    entry = ZOO[name]
    (folder / "config.json").write_text(json.dumps(
        {"model_type": entry.model_type, **entry.config, **changes}))
    return folder / "config.json"


def test_a_config_of_a_zoo_model_is_exported_as_it(tmp_path):
    """A new-user check exported Qwen3-30B-A3B's config.json (the zoo model's very shapes)
    without torchtitan's [model] section, and Megatron's export asked to check that Megatron-Core
    defines DeepSeek-V3 and Mixtral."""
    qwen = load_plan(os.path.join(PLANS, "qwen3-30b-a3b-pp2-ep8-torchtitan.json"))
    spec = _config(tmp_path, "qwen3-30b-a3b")
    config = _from_config(qwen, spec, model_type="qwen3_moe")
    assert names.zoo_model(config) == "qwen3-30b-a3b"
    assert names.torchtitan_model(config) == ("qwen3", "30B-A3B")
    assert 'name = "qwen3"' in to_torchtitan(config)
    # not the zoo model: other counts or type, a config that routes each token to fewer experts
    # (a review: exported as torchtitan's top-8 flavor), a config no longer where the plan says
    (tmp_path / "top2").mkdir()
    top2 = _config(tmp_path / "top2", "qwen3-30b-a3b", num_experts_per_tok=2)
    for other in (_from_config(qwen, spec, model_type="qwen3_moe", num_params=30_532_122_625),
                  _from_config(qwen, spec, model_type="mixtral"), _from_config(qwen, spec),
                  _from_config(qwen, top2, model_type="qwen3_moe"),
                  _from_config(qwen, model_type="qwen3_moe")):
        assert names.zoo_model(other) is None and names.torchtitan_model(other) is None
    mixtral = load_plan(os.path.join(PLANS, "mixtral-8x7b-ep8-megatron.json"))
    (tmp_path / "mixtral").mkdir()
    text = to_megatron(_from_config(mixtral, _config(tmp_path / "mixtral", "mixtral-8x7b"),
                                    model_type="mixtral"))
    assert "is not one of the planner's zoo models" not in text
    assert "is not one of the planner's zoo models" in to_megatron(
        _from_config(mixtral, model_type="mixtral", num_params=1))


@pytest.mark.parametrize("source", ["zoo", "factory", "module"])
def test_other_sources_keep_their_names(source):
    qwen = load_plan(os.path.join(PLANS, "qwen3-30b-a3b-pp2-ep8-torchtitan.json"))
    plan = dataclasses.replace(qwen, model={**qwen.model, "source": source, "model_type":
                                            "qwen3_moe"})
    assert names.zoo_model(plan) == ("qwen3-30b-a3b" if source == "zoo" else None)
