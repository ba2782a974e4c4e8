"""Attention masks the modules declare (causal, sliding window) and gpt-oss's attention sinks."""

import json

import pytest

from planner.trace.masks import window_keep


def _pairs(length: int, window: int) -> int:
    """Query-key pairs a causal window lets through, counted one by one."""
    return sum(1 for q in range(length) for k in range(length) if q - window < k <= q)


@pytest.mark.parametrize("length,window", [(64, 8), (100, 1), (37, 36), (4096, 128)])
def test_window_keep_is_the_share_of_the_causal_pairs_inside(length, window):
    assert window_keep(length, window) == pytest.approx(
        _pairs(length, window) / _pairs(length, length), rel=1e-12)


def test_a_window_as_long_as_the_sequence_keeps_the_causal_call():
    assert window_keep(64, 64) == window_keep(64, 1000) == window_keep(64, 0) == 1.0


GPT_OSS = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
           "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
           "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 20000,
           "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 2,
           "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory):
    from planner.api import prepare

    path = tmp_path_factory.mktemp("gpt_oss") / "config.json"
    path.write_text(json.dumps(GPT_OSS))
    return prepare(str(path), seq_len=64, cache_dir=None)


def _layer(prepared, i):
    return next(b for b in prepared.blocks.blocks if b.name == f"model.layers.{i}")


def test_gpt_oss_eager_attention_is_causal_and_its_sliding_layers_keep_the_window(tiny_gpt_oss):
    """gpt-oss's eager attention adds its mask as data: the modules' is_causal and
    sliding_window say which (layers traced whole, since they alternate)."""
    sliding, full = _layer(tiny_gpt_oss, 0).work, _layer(tiny_gpt_oss, 1).work
    assert sliding.eager_attn_causal_flops == full.eager_attn_causal_flops > 0
    assert full.eager_attn_window_cut == 0
    assert sliding.eager_attn_window_cut == pytest.approx(
        (1 - window_keep(64, 8)) * sliding.eager_attn_causal_flops)
    assert _layer(tiny_gpt_oss, 2).work.eager_attn_window_cut == sliding.eager_attn_window_cut
    assert _layer(tiny_gpt_oss, 3).work.eager_attn_window_cut == 0
    # model FLOPs: the causal half of a full layer's attention, the window's pairs of a sliding one
    attention = 3 * full.eager_attn_causal_flops  # forward and backward of the square
    assert full.train_flops - sliding.train_flops == pytest.approx(
        attention * (0.5 - 0.5 * window_keep(64, 8)))


def test_gpt_oss_sinks_keep_the_attention_tensor_parallel(tiny_gpt_oss):
    """The sinks (a logit per head joined to the scores) are split with the heads: q/k/v and o
    are Megatron's pair (the parameter used to end the region and replicate the attention)."""
    roles = tiny_gpt_oss.blocks.tp_roles
    layer = "model.layers.1.self_attn"
    assert {k: v for k, v in roles.items() if k.startswith(layer)} == {
        layer: "replicate", f"{layer}.q_proj": "colwise", f"{layer}.k_proj": "colwise",
        f"{layer}.v_proj": "colwise", f"{layer}.o_proj": "rowwise"}
    w = _layer(tiny_gpt_oss, 1).work
    eager = sum(g.flops for g in w.gemms if g.attention)
    assert w.attn_flops == pytest.approx(eager) and eager > 0  # the cores split by tp
    assert f"{layer}.sinks" in _layer(tiny_gpt_oss, 1).split_params


def test_priced_time_follows_the_declared_masks(tiny_gpt_oss):
    """Under fused attention an eager core declared causal runs as a causal call, a windowed one
    as a causal call of the window's share of the square; materialized attention runs it all."""
    from costmodels.compute import block_time
    from costmodels.engine import engine_from_mapping
    from costmodels.hardware import DEVICES

    h100 = DEVICES["h100"]
    sliding, full = _layer(tiny_gpt_oss, 2).work, _layer(tiny_gpt_oss, 3).work
    undeclared = type(full)(**{**full.__dict__, "eager_attn_causal_flops": 0.0})

    def fwd(work, attention):
        return block_time(work, h100, dtype="bf16", micro_batch=8, tp=1, sp=False,
                          recompute="none",
                          engine=engine_from_mapping(f"attention={attention},moe_host_op_s=0")
                          ).fwd_s

    assert fwd(sliding, "flash") < fwd(full, "flash") < fwd(undeclared, "flash")
    assert fwd(sliding, "materialized") == pytest.approx(fwd(full, "materialized"))


def test_a_windowed_fused_call_costs_a_causal_call_of_the_kept_square():
    from costmodels.compute import attention_time_s
    from costmodels.engine import EngineSpec
    from costmodels.hardware import DEVICES
    from costmodels.workload import BlockWork

    square, keep = 1e12, 0.25
    windowed = BlockWork(attn_flops=square, fused_attn_flops=square, attn_causal_flops=square,
                         attn_window_cut=(1 - keep) * square, fused_attn_calls=1)
    smaller = BlockWork(attn_flops=keep * square, fused_attn_flops=keep * square,
                        attn_causal_flops=keep * square, fused_attn_calls=1)
    for dev in ("h100", "b200"):
        got = attention_time_s(windowed, DEVICES[dev], "bf16", EngineSpec(), micro_batch=2, tp=2)
        assert got == pytest.approx(attention_time_s(smaller, DEVICES[dev], "bf16", EngineSpec(),
                                                     micro_batch=2, tp=2))
        assert got[0] > 0


def test_sdpa_sliding_layers_get_the_window_of_their_module(tmp_path):
    """Qwen2 with sliding layers: SDPA gets a materialized mask there (not is_causal), and the
    module's sliding_window makes it a windowed causal call; full layers stay causal calls."""
    from planner.api import prepare

    cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 4,
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 20000, "max_position_embeddings": 256,
           "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2,
           "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    prepared = prepare(str(tmp_path / "config.json"), seq_len=64, cache_dir=None)
    works = [_layer(prepared, i).work for i in range(4)]
    windowed = [w.attn_window_cut > 0 for w in works]
    assert any(windowed) and not all(windowed)
    for w in works:
        assert w.attn_causal_flops == w.fused_attn_flops > 0
        assert w.attn_window_cut in (0.0, pytest.approx((1 - window_keep(64, 16))
                                                         * w.attn_causal_flops))


def test_eager_scores_are_a_backward_transient_only_where_attention_is_materialized(tiny_gpt_oss):
    """The largest gradient a gpt-oss layer's backward holds is its scores' (heads x 64 x 65
    with the sinks) when attention runs as traced; a fused kernel never makes them, and the
    layer's largest other tensor is what is left."""
    from costmodels.memory import backward_transient_bytes

    w = _layer(tiny_gpt_oss, 1).work
    materialized = backward_transient_bytes(w, micro_batch=2, tp=1, sp=False)
    fused = backward_transient_bytes(w, micro_batch=2, tp=1, sp=False, scores_kept=False)
    assert materialized == pytest.approx(2 * max(w.bwd_transient_scores_tp, w.bwd_transient_tp,
                                                 w.bwd_transient_rep))
    assert fused == pytest.approx(2 * max(w.bwd_transient_tp, w.bwd_transient_rep))
    assert w.bwd_transient_scores_tp >= 2 * 2 * 4 * 64 * 65  # two gradients of one score tensor
    assert fused < materialized
