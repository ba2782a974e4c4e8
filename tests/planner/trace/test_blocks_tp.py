"""Coarsening into blocks, replication of repeated layers, and the tensor-parallel analysis."""

import pytest


def test_gpt2_blocks_are_embedding_layers_head(tiny_gpt2):
    names = [b.name for b in tiny_gpt2.blocks.blocks]
    assert names == ["transformer.wte..transformer.drop", "transformer.h.0", "transformer.h.1",
                     "transformer.h.2", "transformer.h.3", "transformer.ln_f..lm_head"]
    assert tiny_gpt2.blocks.is_chain()
    # layer 2 and 3 are copies of layer 1
    assert tiny_gpt2.blocks.blocks[3].template == "transformer.h.1"
    assert tiny_gpt2.blocks.blocks[3].params[0].startswith("transformer.h.2.")


def test_replicated_layers_equal_a_full_trace(tiny_gpt2_config):
    from planner.trace.models import resolve
    from planner.trace.blocks import build_blocks
    from planner.trace.tp_roles import analyze
    from planner.trace.tracers import trace

    rm = resolve(tiny_gpt2_config, seq_len=128, dtype="bf16")
    short = trace(rm.module, rm.args, rm.kwargs, seq_len=128, batch=1, dtype="bf16")
    full = trace(rm.module, rm.args, rm.kwargs, seq_len=128, batch=1, dtype="bf16",
                 whole=frozenset({"transformer.h"}))
    assert len(full.ops) > len(short.ops)
    a, b = build_blocks(short, analyze(short)), build_blocks(full, analyze(full))
    assert [x.name for x in a.blocks] == [x.name for x in b.blocks]
    for x, y in zip(a.blocks, b.blocks):
        wx, wy = x.work.to_dict(), y.work.to_dict()
        assert wx.pop("gemms") == wy.pop("gemms"), x.name
        assert wx == pytest.approx(wy), x.name
        assert sorted(x.params) == sorted(y.params)
    assert a.cut_bytes() == pytest.approx(b.cut_bytes())
    assert a.tp_roles == b.tp_roles


def test_megatron_pattern_found_in_llama(tiny_llama):
    roles = tiny_llama.blocks.tp_roles
    layer = "model.layers.3."
    assert {k[len(layer):]: v for k, v in roles.items() if k.startswith(layer)} == {
        "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
        "self_attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
        "mlp.down_proj": "rowwise", "input_layernorm": "replicate",
        "post_attention_layernorm": "replicate"}
    assert roles["model.embed_tokens"] == "vocab"
    assert roles["lm_head"] == "colwise"
    w = tiny_llama.blocks.blocks[2].work
    # two all-reduces forward (attention out, MLP out), two backward, of s*h bf16 each
    assert w.tp_collectives == 4
    assert w.tp_fwd_bytes == pytest.approx(2 * 128 * 64 * 2)
    assert w.tp_bwd_bytes == pytest.approx(2 * 128 * 64 * 2)
    assert w.params_rep == 2 * 64  # the two RMSNorm weights
    # heads (4), kv heads (2) and split feature sizes bound the tensor-parallel degree
    assert {2, 4}.issubset(set(tiny_llama.blocks.blocks[2].tp_divisors))
    assert "tp_whole_attention" not in tiny_llama.info  # every attention split by heads


def test_attention_tensor_parallelism_cannot_split_is_named(tmp_path, caplog):
    """T5's self-attention adds a learned position bias the layers share, so no column/row pair
    forms around it: the model says which attention stays whole on every tp rank (a review saw
    it priced so with no word), while its cross-attention and MLPs split."""
    import json
    import logging

    from planner import model_notes
    from planner.api import prepare

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
        "num_heads": 4, "vocab_size": 128, "decoder_start_token_id": 0, "pad_token_id": 0}))
    t5 = prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)
    whole = t5.info["tp_whole_attention"]
    assert whole[0] == "encoder.block.0.layer.0.SelfAttention" and len(whole) == 4
    assert not any("EncDecAttention" in m for m in whole)
    roles = t5.blocks.tp_roles
    assert roles["decoder.block.0.layer.1.EncDecAttention.o"] == "rowwise"
    assert roles["encoder.block.0.layer.0.SelfAttention.o"] == "replicate"
    with caplog.at_level(logging.WARNING, logger="planner.api"):
        model_notes.say(t5, 16)
    assert ("tensor parallelism would leave the attention of 4 modules whole on every rank "
            "(encoder.block.0.layer.0.SelfAttention and 3 more)") in caplog.text


def test_tied_embedding_is_shared_between_first_and_last_block(tiny_gpt2):
    bg = tiny_gpt2.blocks
    assert bg.shared and bg.shared[0][:2] == [bg.blocks[0].name, bg.blocks[-1].name]
    assert "transformer.wte.weight" in bg.blocks[-1].params


def test_branched_model_keeps_its_dag(branched):
    bg = branched.blocks
    assert [b.name for b in bg.blocks] == ["embed", "tower_a", "tower_b", "merge", "head"]
    edges = {(e.src, e.dst) for e in bg.edges}
    assert {("embed", "tower_a"), ("embed", "tower_b"), ("tower_a", "merge"),
            ("tower_b", "merge"), ("merge", "head")} == edges
    assert not bg.is_chain()
    cuts = bg.cut_bytes()
    act = 512 * 2048 * 2  # one bf16 activation of (seq, width) per sample
    # after embed: its output (read by both towers) crosses once; after tower_a: a and x cross
    assert cuts[0] == pytest.approx(act) and cuts[1] == pytest.approx(2 * act)


def test_unchained_identical_lists_are_traced_whole(branched):
    assert branched.opgraph.repeats == []
    assert len(branched.opgraph.ops) > 40  # all four up/down pairs of both towers


def test_op_level_checkpointing_keeps_attention_and_every_other_weight_gemm(tiny_llama):
    """torchtitan's op-level policy on a Llama layer: q, k, v, o, gate, up, down projections in
    forward order; the 1st, 3rd, 5th and 7th outputs (q, v, gate, down) are kept with the
    attention output, the others (k, o, up) recomputed."""
    from costmodels import memory

    layer = next(b for b in tiny_llama.blocks.blocks if b.recompute)
    g = tiny_llama.opgraph
    h, kv = 64, 32  # tiny_llama: hidden 64, 4 heads of 16, 2 kv heads
    ffn = next(o for o in g.ops if o.kind == "matmul" and o.module.endswith("gate_proj")).shape[-1]
    w = layer.work
    recomputed = h * kv + h * h + h * ffn  # k, o, up (weights: FLOPs per token / 2)
    total = h * h + 2 * h * kv + h * h + 3 * h * ffn
    assert w.op_recompute_gemm_share == pytest.approx(recomputed / total, rel=1e-6)
    kept = memory.activation_bytes(w, micro_batch=1, tp=1, sp=False, recompute="op")
    assert memory.activation_bytes(w, micro_batch=1, tp=1, sp=False, recompute="full") < kept
    assert kept < memory.activation_bytes(w, micro_batch=1, tp=1, sp=False, recompute="none",
                                          scores_kept=False)


def test_per_head_norms_stay_inside_qwen3s_tensor_parallel_attention(tmp_path):
    """Qwen3 normalizes each query and key head (q_norm, k_norm, weights of the head size)
    between the projections and the attention core: the attention is still Megatron's pair,
    the norms' weights repeated on every rank (they were read as a wall and the whole attention
    replicated, its FLOPs and weights not split by tp)."""
    import json

    from planner.api import prepare

    cfg = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4,
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 20000,
           "max_position_embeddings": 256, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    prepared = prepare(str(tmp_path / "config.json"), seq_len=64, dtype="fp32", cache_dir=None)
    roles = prepared.blocks.tp_roles
    layer = "model.layers.1.self_attn."
    assert {k[len(layer):]: v for k, v in roles.items() if k.startswith(layer)} == {
        "q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise",
        "q_norm": "replicate", "k_norm": "replicate"}
    w = next(b for b in prepared.blocks.blocks if b.name.endswith("layers.2")).work
    assert w.fused_attn_flops_rep == 0 and w.attn_flops == w.fused_attn_flops > 0
    # planner's runtime keeps the norms in step across tp ranks, so --target torch plans tp > 1
    import planner
    from planner.options import parse_fix
    from planner.targets import restrict

    plan = planner.plan_prepared(
        prepared, planner.load_cluster("cpu", nodes=1, gpus_per_node=2),
        planner.TrainingSpec(global_batch=4, seq_len=64, dtype="fp32", optimizer="sgd"),
        restrict(planner.SearchOptions(fix=parse_fix("tp=2"), top_k=0), "torch"))
    assert plan.parallel["tp"] == 2 and plan.tensor_parallel[layer + "q_norm"] == "replicate"


def test_a_norm_over_the_whole_split_width_still_ends_the_region():
    """A norm over the last dimension of a 4-D MLP activation (not an attention head) must see
    the whole width: its weight keeps the MLP replicated, as before per-head norms were let in."""
    import torch
    import torch.nn as nn

    from planner.api import prepare

    class Norm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.norm, self.down = nn.Linear(64, 256), Norm(256), nn.Linear(256, 64)

        def forward(self, x):
            return x + self.down(self.norm(torch.nn.functional.gelu(self.up(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(*[Block() for _ in range(4)])

        def forward(self, x):
            return self.blocks(x).sum()

    prepared = prepare(Model(), example_inputs=(torch.randn(2, 8, 8, 64),), cache_dir=None)
    roles = prepared.blocks.tp_roles
    assert roles["blocks.1.up"] == roles["blocks.1.down"] == "replicate"
