"""Emitting a plan: the invariants every prediction holds, and what its FLOP figures count."""

import dataclasses

import pytest

from costmodels.hardware import FP8_MATMUL_EFFICIENCY
from planner import SearchOptions, TrainingSpec, load_cluster
from planner.emit import FLOPS_COUNTED, check_predictions
from planner.errors import InternalError
from planner.search.loop import search


@pytest.fixture(scope="module")
def found(tiny_gpt2):
    cluster = load_cluster("dgx-a100-80g", nodes=1)
    training = TrainingSpec(global_batch=16, seq_len=tiny_gpt2.seq_len)
    result = search(tiny_gpt2.blocks, cluster, training, SearchOptions(top_k=0))
    return result.best, training, cluster


def test_a_real_prediction_holds_the_invariants(found):
    est, training, cluster = found
    check_predictions(est, training, cluster)  # raises on a violation
    rates = est.throughput(training, cluster)
    assert 0 < rates["mfu"] <= 1 and est.model_flops <= est.hardware_flops


@pytest.mark.parametrize("change,words", [
    ({"step_time_s": 1e-12}, "peak FLOP/s"),
    ({"step_time_s": float("nan")}, "step time"),
    ({"peak_memory_bytes": 0.0}, "peak memory"),
    ({"model_flops": 0.0}, "model FLOPs"),
])
def test_a_broken_prediction_is_an_internal_error_not_a_plan(found, change, words):
    est, training, cluster = found
    with pytest.raises(InternalError, match=words):
        check_predictions(dataclasses.replace(est, **change), training, cluster)


def test_the_plan_says_which_flops_it_counts(tiny_gpt2):
    from planner.api import plan_prepared

    cluster = load_cluster("dgx-a100-80g", nodes=1)
    training = TrainingSpec(global_batch=16, seq_len=tiny_gpt2.seq_len)
    p = plan_prepared(tiny_gpt2, cluster, training, SearchOptions(top_k=0))
    pr = p.predicted
    assert pr["flops_counted"] == FLOPS_COUNTED and "causal" in pr["flops_counted"]
    tokens = training.global_batch * training.seq_len
    assert pr["model_flops_per_token"] == pytest.approx(pr["model_flops_per_step"] / tokens,
                                                        rel=1e-5)


def test_an_fp8_plan_says_what_fp8_changed(tiny_llama):
    import planner
    from planner.report.summary import summary

    cluster = planner.load_cluster({
        "name": "fp8-node", "nodes": 1, "gpus_per_node": 8,
        "device": {"name": "h100-like", "memory_GB": 80, "hbm_GBps": 3350,
                   "peak_TFLOPs": {"bf16": 989, "fp16": 989, "fp32": 67, "fp8": 1979}},
        "intra_node": {"bandwidth_GBps": 450, "latency_us": 3},
        "inter_node": {"bandwidth_GBps": 50, "latency_us": 10}})
    training = planner.TrainingSpec(global_batch=64, seq_len=128, dtype="fp8")
    plan = planner.plan_prepared(tiny_llama, cluster, training, planner.SearchOptions(top_k=0))
    f = plan.predicted["fp8"]
    assert f["recipe"] == "current" and f["gemm_peak_tflops"] == 1979
    assert f["gemm_efficiency"] == FP8_MATMUL_EFFICIENCY and f["bf16_gemm_efficiency"] == 0.70
    assert f["bf16_step_time_s"] > 0 and f["weight_copy_bytes"] > 0
    text = summary(plan)
    assert (f"weight GEMMs on fp8 tensor cores (1,979 TFLOP/s peak, "
            f"{100 * FP8_MATMUL_EFFICIENCY:.0f}% sustained") in text
    assert "in bf16 this plan would take" in text
    assert f["outer_blocks_bf16"] and "embedding and output layer in bf16" in text
    # the summary gives the ratio; on a 2.7M-parameter model it may fall below 1 (GEMMs too
    # small for fp8 to pay for its casts)
    assert f"({f['bf16_step_time_s'] / plan.step_time_s:.2f}x)" in text
    bf16 = planner.plan_prepared(tiny_llama, cluster, planner.TrainingSpec(
        global_batch=64, seq_len=128), planner.SearchOptions(top_k=0))
    assert "fp8" not in bf16.predicted
    with pytest.raises(planner.SpecError, match="no fp8 support"):
        planner.plan("llama3-8b", cluster="dgx-a100-80g", global_batch=8,
                     dtype="fp8")


def test_a_model_without_repeated_layers_runs_every_gemm_in_fp8(branched):
    import planner
    from planner.report.summary import summary

    assert all(b.recompute for b in branched.blocks.blocks)
    training = planner.TrainingSpec(global_batch=64, seq_len=branched.seq_len, dtype="fp8")
    plan = planner.plan_prepared(branched, planner.load_cluster("dgx-h100", nodes=1), training,
                                 planner.SearchOptions(top_k=0))
    assert plan.predicted["fp8"]["outer_blocks_bf16"] is False
    assert "output layer in bf16" not in summary(plan)


def test_attention_outside_tensor_parallel_regions_is_attention(tmp_path):
    """Qwen3-Next's gated attention (every fourth layer, beside linear attention) runs fused but
    outside any region tensor parallelism splits: the plan called the model attention-free and
    its software line dropped the kernel (a new-user check)."""
    import json

    import planner
    from planner.report.summary import summary

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
        "num_hidden_layers": 4, "full_attention_interval": 4, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "vocab_size": 256,
        "max_position_embeddings": 256}))
    prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=64, cache_dir=None)
    fused = [b for b in prepared.blocks.blocks if b.work.fused_attn_calls]
    assert [b.name for b in fused] == ["model.layers.3"]
    plan = planner.plan_prepared(prepared, load_cluster("dgx-h100", nodes=1),
                                 TrainingSpec(global_batch=8, seq_len=64),
                                 SearchOptions(top_k=0))
    assert "no_attention" not in plan.model
    assert "FlashAttention" in summary(plan)
