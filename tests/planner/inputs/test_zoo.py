"""The zoo's mixtures of experts: their published dimensions (planner/inputs/zoo.py cites the
source of each) and the parameter count the planner builds."""

import pytest

from planner.inputs.zoo import ZOO

# name: layers, hidden, query heads, key/value heads, routed experts, experts per token,
# expert FFN, vocabulary -- as the model's config.json / paper / technical report publish them.
PUBLISHED = {
    "mixtral-8x7b": (32, 4096, 32, 8, 8, 2, 14336, 32000),
    "mixtral-8x22b": (56, 6144, 48, 8, 8, 2, 16384, 32768),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 128, 8, 768, 151936),
    "qwen3-235b-a22b": (94, 4096, 64, 4, 128, 8, 1536, 151936),
    "deepseek-v3": (61, 7168, 128, 128, 256, 8, 2048, 129280),
    "gpt-oss-120b": (36, 2880, 64, 8, 128, 4, 2880, 201088),
}
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")  # mixtral/gpt_oss, qwen3_moe, deepseek_v3
EXPERT_FFN = ("moe_intermediate_size", "intermediate_size")  # the first the family has


def _first(config: dict, keys: tuple) -> int:
    return next(config[k] for k in keys if k in config)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_entries_have_the_published_dimensions(name):
    c = ZOO[name].config
    got = (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
           c["num_key_value_heads"], _first(c, EXPERTS), c["num_experts_per_tok"],
           _first(c, EXPERT_FFN), c["vocab_size"])
    assert got == PUBLISHED[name]


def test_deepseek_v3_is_the_main_model_with_its_latent_attention_and_dense_first_layers():
    c = ZOO["deepseek-v3"].config
    assert c["num_nextn_predict_layers"] == 0  # no multi-token prediction module
    assert (c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
            c["v_head_dim"]) == (1536, 512, 128, 64, 128)
    assert (c["first_k_dense_replace"], c["intermediate_size"]) == (3, 18432)
    assert (c["n_shared_experts"], c["n_group"], c["topk_group"]) == (1, 8, 4)


def test_gpt_oss_alternates_sliding_window_and_full_attention():
    c = ZOO["gpt-oss-120b"].config
    assert c["head_dim"] == 64 and c["sliding_window"] == 128
    assert c["layer_types"] == ["sliding_attention", "full_attention"] * 18


def test_the_models_command_lists_them(capsys):
    from planner.cli.main import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in PUBLISHED:
        assert name in out


def test_qwen3_30b_a3b_traces_to_its_published_30_5b_parameters():
    from planner.api import prepare

    p = prepare("qwen3-30b-a3b", seq_len=256, cache_dir=None)  # parameters do not depend on it
    assert p.info["num_params"] == pytest.approx(30.5e9, rel=0.01)
    assert len(p.blocks.blocks) == 48 + 2  # a stage boundary may fall after any layer


def test_relative_position_buckets_set_no_length_limit():
    """t5-large's config.json carries n_positions 512, but T5's positions are relative buckets:
    a new-user check saw --seq-len 4096 refused as past its 'learned positions'."""
    from planner.inputs.zoo import learned_positions
    assert learned_positions({"model_type": "gpt2", "n_positions": 1024}) == 1024
    assert learned_positions({"model_type": "t5", "n_positions": 512,
                              "relative_attention_num_buckets": 32}) is None
