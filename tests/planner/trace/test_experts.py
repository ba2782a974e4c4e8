"""Mixtures of experts: a token pays for the experts it is routed to, never for all of them."""

import json

import pytest

MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
           "vocab_size": 256, "max_position_embeddings": 128}


def _flops(folder, dtype="fp32", **experts) -> float:
    from planner.api import prepare

    folder.mkdir(parents=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**MIXTRAL, **experts}))
    p = prepare(str(path), seq_len=32, dtype=dtype)
    return sum(b.work.fwd_flops for b in p.blocks.blocks)


def test_expert_flops_follow_the_routed_experts_not_all_of_them(tmp_path):
    two_of_four = _flops(tmp_path / "a", num_local_experts=4, num_experts_per_tok=2)
    two_of_eight = _flops(tmp_path / "b", num_local_experts=8, num_experts_per_tok=2)
    one_of_four = _flops(tmp_path / "c", num_local_experts=4, num_experts_per_tok=1)
    router_growth = 3 * 2 * 32 * 64 * 4  # the router's GEMM grows with the number of experts
    assert two_of_eight == pytest.approx(two_of_four + router_growth)
    expert = 3 * 2 * 32 * (64 * 2 * 128 + 128 * 64)  # per routed copy of each token, 3 layers
    assert two_of_four - one_of_four == pytest.approx(expert)


def test_an_expert_size_torch_grouped_mm_cannot_align_still_traces(tmp_path):
    # 130 bf16 columns are 260 bytes, not a multiple of 16: torch's grouped_mm refuses the
    # stride; the experts run as transformers' grouped GEMM fallback, priced the same way
    aligned = _flops(tmp_path / "a", "bf16", num_local_experts=4, num_experts_per_tok=2)
    odd = _flops(tmp_path / "b", "bf16", num_local_experts=4, num_experts_per_tok=2,
                 intermediate_size=130)
    two_columns = 2 * 3 * 2 * 32 * (64 * 2 * 2 + 2 * 64)  # 2 copies, 3 layers, 32 tokens
    assert odd - aligned == pytest.approx(two_columns)


def test_mixtral_8x7b_flops_per_token_are_two_active_experts_plus_attention():
    import planner

    p = planner.plan("mixtral-8x7b", cluster="dgx-h100", nodes=8, global_batch=256,
                     seq_len=4096, top_k=0)
    layers, d, kv, ffn, vocab = 32, 4096, 1024, 14336, 32000
    active = layers * (d * (2 * d + 2 * kv) + d * 8 + 2 * 3 * d * ffn) + d * vocab
    assert p.predicted["active_params_per_token"] == pytest.approx(active, rel=1e-3)
    # QK^T and attention x V per token, forward, under the causal mask (counted half)
    attention = layers * 2 * 2 * 4096 * d / 2
    per_token = 3 * (2 * active + attention)
    assert p.predicted["model_flops_per_token"] == pytest.approx(per_token, rel=1e-3)
    assert 12.5e9 < active < 13e9 < p.model["num_params"] < 47e9


def _blocks(folder, **experts):
    from planner.api import prepare

    folder.mkdir(parents=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**MIXTRAL, **experts}))
    return prepare(str(path), seq_len=32, dtype="bf16").blocks.blocks


def test_what_the_routed_experts_save_grows_with_the_token_copies(tmp_path):
    one = _blocks(tmp_path / "a", num_local_experts=4, num_experts_per_tok=1)
    two = _blocks(tmp_path / "b", num_local_experts=4, num_experts_per_tok=2)
    routed = [sum(b.work.act_routed_rep + b.work.act_routed_tp for b in bs) for bs in (one, two)]
    total = [sum(b.work.act_bytes_rep + b.work.act_bytes_tp for b in bs) for bs in (one, two)]
    assert 0 < routed[0] < total[0]
    # every tensor saved inside the experts is per token copy: twice the copies, twice the bytes,
    # and the rest of the layer saves the same (the router's top-k keeps one more score a token)
    assert routed[1] == pytest.approx(2 * routed[0])
    assert total[1] - total[0] == pytest.approx(routed[1] - routed[0], rel=0.05)


def test_only_the_token_copies_count_as_routed_where_the_block_runs_its_own_grouped_gemms():
    """An MoE block calling the grouped GEMMs in its own forward, its router and a shared expert
    inside it: the router's per-token tensors and the shared expert's are not the copies."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from planner.api import prepare

    hidden, experts, topk, ffn, tokens = 64, 4, 2, 128, 32

    class MoE(nn.Module):
        def __init__(self, shared):
            super().__init__()
            self.gate = nn.Linear(hidden, experts, bias=False)
            self.w1 = nn.Parameter(torch.randn(experts, hidden, ffn))
            self.w2 = nn.Parameter(torch.randn(experts, ffn, hidden))
            self.shared = nn.Sequential(nn.Linear(hidden, 4 * ffn), nn.GELU(),
                                        nn.Linear(4 * ffn, hidden)) if shared else None

        def forward(self, x):
            t = x.reshape(-1, hidden)
            w, idx = torch.topk(self.gate(t).softmax(-1), topk)
            order = idx.flatten().argsort()
            copies = t.repeat_interleave(topk, 0)[order]
            offs = (torch.arange(1, experts + 1) * (t.shape[0] * topk // experts)).to(torch.int32)
            y = torch._grouped_mm(F.gelu(torch._grouped_mm(copies, self.w1, offs=offs)), self.w2,
                                  offs=offs)
            out = torch.zeros_like(t).index_add(0, order // topk, y * w.flatten()[order, None])
            if self.shared is not None:
                out = out + self.shared(t)
            return out.reshape(x.shape)

    def routed_and_all(shared, batch=1):
        torch.manual_seed(0)
        model = nn.Sequential(nn.LayerNorm(hidden), MoE(shared))
        x = torch.randn(batch, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
        work = [b.work for b in prepare(model, example_inputs=(x,), dtype="bf16",
                                        cache_dir=None).blocks.blocks]
        return (sum(w.act_routed_rep + w.act_routed_tp for w in work),
                sum(w.act_bytes_rep + w.act_bytes_tp for w in work))
    (plain, total), (with_shared, total_shared) = routed_and_all(False), routed_and_all(True)
    assert total_shared > total and with_shared == plain  # the shared expert's are not routed
    word, copies = 2, tokens * topk
    # at least the copies, the first GEMM's output and its activation: one row per copy
    assert plain >= copies * (hidden + 2 * ffn) * word
    assert plain < total - tokens * experts * word  # the router's scores stay out
    assert routed_and_all(False, batch=2) == (plain, total)  # per sample, however traced


@pytest.mark.parametrize("expert_ffn", [32, 48])
def test_each_moe_layer_returns_its_token_copies_once_whatever_the_expert_width(tmp_path,
                                                                                 expert_ffn):
    """An expert width of half the hidden size makes the fused gate-and-up GEMM as wide as the
    hidden states: the down projection alone brings the copies back (and is the row-parallel
    one under expert tensor parallelism)."""
    from costmodels.workload import SPLIT_K
    blocks = _blocks(tmp_path / "a", num_local_experts=4, num_experts_per_tok=2,
                     intermediate_size=expert_ffn)
    copies = 3 * 32 * 2  # 3 layers, 32 tokens, 2 experts each
    assert sum(b.work.routed_tokens for b in blocks) == copies
    assert sum(b.work.dispatch_bytes for b in blocks) == copies * 64 * 2  # bf16 at hidden width
    returning = [g for b in blocks for g in b.work.gemms if g.experts and g.split == SPLIT_K]
    assert len(returning) == 3 and all(g.k == expert_ffn for g in returning)


def test_a_router_that_keeps_its_best_groups_of_experts_is_recorded(tmp_path, tiny_deepseek_v3):
    """DeepSeek-V3's router takes each token's experts from its best 4 of 8 groups (node-limited
    routing, which DeepEP's sends follow: costmodels.experts.node_sends); a router without groups
    records none."""
    from planner.api import prepare

    config = {**tiny_deepseek_v3, "n_routed_experts": 16, "num_experts_per_tok": 4}
    for groups, kept, want in ((4, 2, (4.0, 2.0)), (1, 1, (0.0, 0.0))):
        folder = tmp_path / f"g{groups}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, "n_group": groups,
                                                        "topk_group": kept}))
        blocks = prepare(str(folder / "config.json"), seq_len=32, cache_dir=None).blocks.blocks
        moe = [b.work for b in blocks if b.work.num_experts]
        assert moe and all((w.expert_groups, w.expert_groups_per_token) == want for w in moe)
        assert all(b.work.expert_groups == 0 for b in blocks if not b.work.num_experts)
