"""Llama 4's MoE layers, whose transformers code runs every expert on every token, are built as
routed experts (planner.trace.dense_experts)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import planner
from planner.trace import dense_experts

TINY_LLAMA4 = {"model_type": "llama4_text", "architectures": ["Llama4ForCausalLM"],
               "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 32,
               "intermediate_size_mlp": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "num_local_experts": 8, "num_experts_per_tok": 1,
               "vocab_size": 256, "max_position_embeddings": 256,
               "interleave_moe_layer_step": 1, "no_rope_layers": [1, 1]}


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_routed_layer_computes_what_transformers_computes(top_k):
    """Same output, router logits and gradients (weights and input) as the layer as written."""
    from transformers import AutoConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**{**TINY_LLAMA4, "num_experts_per_tok": top_k})
    written = Llama4TextMoe(cfg).float()
    for p in written.parameters():  # (the experts' weights start at zero in transformers)
        torch.nn.init.normal_(p, std=0.2)
    routed = copy.deepcopy(written)
    holder = torch.nn.ModuleList([routed])
    assert dense_experts.route(holder) == 1
    x = torch.randn(2, 24, 64)
    out, logits = [], []
    for layer in (written, routed):
        xi = x.clone().requires_grad_(True)
        o, lg = layer(xi)
        (o.square().sum() + lg.sum()).backward()
        out.append((o, xi.grad, {n: p.grad for n, p in layer.named_parameters()}))
        logits.append(lg)
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1], logits[0])
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-5, atol=1e-5)
    for name, grad in out[0][2].items():
        torch.testing.assert_close(out[1][2][name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_llama4_experts_are_traced_and_priced_as_routed_copies(tmp_path):
    """The trace finds the experts as routed (token copies = tokens x top-k, no capacity slots),
    and the plan's hardware FLOPs are its model FLOPs (a new-user check: Llama 4 Scout priced
    every expert on every token, 6x its FLOPs)."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA4))
    prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=32, dtype="bf16",
                               cache_dir=None)
    work = [b.work for b in prepared.blocks.blocks if b.work.num_experts]
    assert work and all(w.num_experts == 8 and not w.expert_capacity and not w.expert_slot_flops
                        for w in work)
    assert sum(w.routed_tokens for w in work) == 2 * 32 * 1  # two MoE layers, top-1
    routed = [g for w in work for g in w.gemms if g.experts]
    assert routed and all(g.m == 32 for g in routed)
    plan = planner.plan_prepared(prepared, planner.load_cluster("dgx-h100", nodes=1),
                                 planner.TrainingSpec(global_batch=8, seq_len=32),
                                 planner.SearchOptions(fix={"recompute": "none"}, top_k=0))
    assert plan.predicted["hardware_flops_per_step"] == pytest.approx(
        plan.predicted["model_flops_per_step"], rel=1e-3)


def test_llama4_attention_splits_over_tensor_parallel_ranks(tmp_path):
    """Llama 4 applies rotary positions as complex products (view_as_complex, view_as_real): the
    trace called them non-differentiable and their path from q_proj and k_proj cut, so the
    attention was never split by tensor parallelism (a review)."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA4))
    prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=32, dtype="bf16",
                               cache_dir=None)
    roles = prepared.blocks.tp_roles
    for layer in (0, 1):
        attn = f"model.layers.{layer}.self_attn"
        assert [roles[f"{attn}.{p}"] for p in ("q_proj", "k_proj", "v_proj", "o_proj")] == \
            ["colwise", "colwise", "colwise", "rowwise"], layer
    complex_ops = [op for op in prepared.opgraph.ops if op.target == "view_as_complex"]
    assert complex_ops and all(op.differentiable for op in complex_ops)


def test_plan_run_is_planned_without_expert_parallelism_for_llama4(tmp_path):
    """plan run spreads transformers' experts modules over ep ranks; Llama 4's MoE layer is not
    one, so a --target torch plan keeps ep at 1 and a pin of more is refused (a review: planned,
    then refused by plan run); other targets keep ep free."""
    from planner.errors import SpecError

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA4))
    prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=32, dtype="fp32",
                               cache_dir=None)
    assert prepared.info["experts_own_code"] is True
    cluster = planner.load_cluster("cpu", nodes=1, gpus_per_node=2)
    training = planner.TrainingSpec(global_batch=4, seq_len=32, dtype="fp32")
    plan = planner.plan_prepared(prepared, cluster, training,
                                 planner.SearchOptions(target="torch", top_k=0))
    assert plan.parallel.get("ep", 1) == 1
    with pytest.raises(SpecError, match=r"^fix\.ep: plan run spreads over expert-parallel ranks "
                                        r"the experts of transformers' MoE layers only"):
        planner.plan_prepared(prepared, cluster, training,
                              planner.SearchOptions(target="torch", fix={"ep": 2}, top_k=0))
    assert planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
        target="any", fix={"ep": 2, "tp": 1}, top_k=0)).parallel["ep"] == 2
