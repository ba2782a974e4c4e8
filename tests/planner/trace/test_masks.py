"""Attention masks the modules declare (causal, sliding window) and gpt-oss's attention sinks."""

import dataclasses
import json

import pytest

from planner.trace.masks import window_keep
from tests.conftest import TINY_GPT_OSS


def _pairs(length: int, window: int) -> int:
    """Query-key pairs a causal window lets through, counted one by one."""
    return sum(1 for q in range(length) for k in range(length) if q - window < k <= q)


@pytest.mark.parametrize("length,window", [(64, 8), (100, 1), (37, 36), (4096, 128)])
def test_window_keep_is_the_share_of_the_causal_pairs_inside(length, window):
    assert window_keep(length, window) == pytest.approx(
        _pairs(length, window) / _pairs(length, length), rel=1e-12)


def test_a_window_as_long_as_the_sequence_keeps_the_causal_call():
    assert window_keep(64, 64) == window_keep(64, 1000) == window_keep(64, 0) == 1.0


def _traced(folder, config: dict, dtype: str = "bf16"):
    """The model of a Hugging Face ``config`` traced at 64 tokens (config.json in ``folder``)."""
    from planner.api import prepare

    (folder / "config.json").write_text(json.dumps(config))
    return prepare(str(folder / "config.json"), seq_len=64, dtype=dtype, cache_dir=None)


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory):
    return _traced(tmp_path_factory.mktemp("gpt_oss"), TINY_GPT_OSS)


def _layer(prepared, i):
    return next(b for b in prepared.blocks.blocks if b.name == f"model.layers.{i}")


def test_gpt_oss_eager_attention_is_causal_and_its_sliding_layers_keep_the_window(tiny_gpt_oss):
    """gpt-oss's eager attention adds its mask as data: the modules' is_causal and
    sliding_window say which (layers traced whole, since they alternate)."""
    sliding, full = _layer(tiny_gpt_oss, 0).work, _layer(tiny_gpt_oss, 1).work
    square = sum(g.flops for g in full.gemms if g.attention)
    assert square == sum(g.flops for g in sliding.gemms if g.attention) > 0
    keep = window_keep(64, 8)
    assert {g.masked for g in full.gemms if g.attention} == {0.5}
    assert [g.masked for g in sliding.gemms if g.attention] == pytest.approx([1 - keep / 2] * 2)
    assert full.eager_attn_masked_flops == pytest.approx(0.5 * square)
    assert sliding.eager_attn_masked_flops == pytest.approx((1 - keep / 2) * square)
    assert _layer(tiny_gpt_oss, 2).work.eager_attn_masked_flops == sliding.eager_attn_masked_flops
    assert _layer(tiny_gpt_oss, 3).work.eager_attn_masked_flops == full.eager_attn_masked_flops
    # model FLOPs (forward and backward): the causal half of a full layer's attention, the
    # window's pairs of a sliding one
    assert full.train_flops - sliding.train_flops == pytest.approx(3 * square * (0.5 - keep / 2))


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

    sliding, full = _layer(tiny_gpt_oss, 2).work, _layer(tiny_gpt_oss, 3).work
    undeclared = dataclasses.replace(
        full, eager_attn_masked_flops=0.0,
        gemms=tuple(dataclasses.replace(g, masked=0.0) for g in full.gemms))

    def fwd(work, attention, device="h100"):
        return block_time(work, DEVICES[device], dtype="bf16", micro_batch=8, tp=1, sp=False,
                          recompute="none",
                          engine=engine_from_mapping(f"attention={attention},moe_host_op_s=0")
                          ).fwd_s

    # (H100's kernels pay a fixed work per query row of a window: at 64 tokens, one tile, the
    # window saves nothing; A100's have no such figure and price the kept square)
    assert fwd(sliding, "flash") == pytest.approx(fwd(full, "flash"))
    assert fwd(full, "flash") < fwd(undeclared, "flash")
    assert fwd(sliding, "flash", "a100-80g") < fwd(full, "flash", "a100-80g")
    assert fwd(sliding, "materialized") == pytest.approx(fwd(full, "materialized"))


def test_a_short_window_runs_at_the_published_share_of_a_long_one():
    """cudnn-frontend's benchmark on GB200 (head dimension 64): a 128-key window runs at
    161-167 TFLOP/s forward and 182-188 backward, a 1,024-key one at 574-624 and 617-658
    (costmodels.hardware.BLACKWELL_WINDOW): the priced speeds keep those ratios within 12%,
    and a window stays dearer than the kept square and cheaper than no window."""
    from costmodels.attention import fused_attention_s
    from costmodels.engine import EngineSpec
    from costmodels.hardware import DEVICES

    gb200, length = DEVICES["gb200"], 16384
    square = 4.0 * 64 * 64 * length * length  # 64 heads of dimension 64, one sample

    def speeds(window):
        keep = window_keep(length, window)
        kept = 0.5 * keep * square
        window_args = (kept, square / length, 0.5 * square)
        f, b = fused_attention_s(0.0, gb200, "bf16", EngineSpec(), masked=kept, head_dim=64,
                                 window=window_args)
        plain = fused_attention_s(0.0, gb200, "bf16", EngineSpec(), masked=kept, head_dim=64)
        whole = fused_attention_s(0.0, gb200, "bf16", EngineSpec(), masked=0.5 * square,
                                  head_dim=64)
        assert plain[0] < f < whole[0] and plain[1] < b < whole[1]
        return kept / f, 2.5 * kept / b

    (f128, b128), (f1024, b1024) = speeds(128), speeds(1024)
    assert f128 / f1024 == pytest.approx(164 / 600, rel=0.12)
    assert b128 / b1024 == pytest.approx(185 / 638, rel=0.12)


def test_a_windowed_fused_call_costs_a_causal_call_of_the_kept_square():
    from costmodels.attention import attention_time_s
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
    cfg = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 4,
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 20000, "max_position_embeddings": 256,
           "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2,
           "tie_word_embeddings": False}
    prepared = _traced(tmp_path, cfg)
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


def test_qwen2_moe_full_layers_take_no_window_from_the_config(tmp_path):
    """Qwen2-MoE sets ``sliding_window`` on its sliding layers' attention only: a full layer
    without the attribute does not fall back to the config's window (its layer type says full)."""
    cfg = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
           "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128,
           "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
           "num_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 20000, "max_position_embeddings": 256,
           "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1,
           "tie_word_embeddings": False}
    prepared = _traced(tmp_path, cfg)
    from transformers import AutoConfig

    types = AutoConfig.from_pretrained(tmp_path).layer_types
    works = [_layer(prepared, i).work for i in range(4)]
    assert [w.attn_window_cut > 0 for w in works] == [t == "sliding_attention" for t in types]
    assert all(w.attn_causal_flops == w.fused_attn_flops > 0 for w in works)


def test_cross_attention_is_not_causal_whatever_is_causal_says():
    import torch

    from planner.trace.masks import declared

    class Attention(torch.nn.Module):
        def __init__(self, cross):
            super().__init__()
            self.is_causal, self.is_cross_attention, self.sliding_window = True, cross, 4

    assert declared(Attention(False)) == (True, 4)
    assert declared(Attention(True)) == (False, 0)


def test_eager_cores_are_priced_by_their_own_masks_and_split():
    """One block with a masked core split by tp and an unmasked one repeated on every rank: each
    GEMM keeps its own mask and split (shares over the block would mix them)."""
    from costmodels.compute import gemms_time_s
    from costmodels.hardware import DEVICES
    from costmodels.workload import SPLIT_BATCH, SPLIT_NONE, Gemm

    masked = Gemm(batch=8, m=64, n=64, k=16, split=SPLIT_BATCH, linear=False, attention=True,
                  masked=0.5)
    plain = Gemm(batch=8, m=64, n=64, k=16, split=SPLIT_NONE, linear=False, attention=True)
    *_, fused, fused_masked = gemms_time_s((masked, plain), DEVICES["h100"], "bf16",
                                           micro_batch=2, tp=4, sp=False, fused_attention=True)
    assert fused == pytest.approx(2 * plain.flops)  # repeated on every rank
    assert fused_masked == pytest.approx(0.5 * 2 * masked.flops / 4)  # split, half done


def test_selective_recomputation_counts_the_eager_cores_outside_tp_regions():
    """Selective recomputation replays every attention core, inside a tensor-parallel region
    or not, less what a masked kernel skips."""
    import numpy as np

    from costmodels.workload import BlockWork
    from planner.search.pricing import _recomputed_flops

    w = BlockWork(attn_flops=4.0, mm_flops_rep=10.0, eager_attn_flops_rep=6.0,
                  eager_attn_masked_flops=5.0, op_recompute_gemm_share=0.5)

    class Arrays:
        work = BlockWork(**{f: np.array([getattr(w, f)]) for f in
                            ("attn_flops", "mm_flops_rep", "eager_attn_flops_rep",
                             "eager_attn_masked_flops", "op_recompute_gemm_share")})
        checkpointed = np.array([True])

    assert _recomputed_flops(Arrays, "selective") == pytest.approx(4 + 6 - 5)
    assert _recomputed_flops(Arrays, "full") == pytest.approx(4 + 10 - 5)
    # op-level: the share of the weight GEMMs, not the eager cores among mm_flops_rep
    assert _recomputed_flops(Arrays, "op") == pytest.approx(0.5 * (10 - 6))


def test_a_target_without_tp_through_inner_weights_keeps_tp_off(tmp_path):
    """gpt-oss's sinks (as Qwen3's per-head norms) sit inside the split attention; every target
    shards them with the heads (planner's runtime too: planner.runtime.inner_weights), but a
    target that could not (SearchOptions.tp_inner_weights=False) would never get tp > 1 for
    such a model, and is told why when tp is pinned."""
    import dataclasses

    import planner
    from planner import SearchOptions, TrainingSpec
    from planner.errors import SpecError
    from planner.options import parse_fix
    from planner.targets import restrict

    tiny_gpt_oss = _traced(tmp_path, TINY_GPT_OSS, dtype="fp32")  # (the CPU trains in fp32)
    assert any(b.tp_inner_weights for b in tiny_gpt_oss.blocks.blocks)
    cluster = planner.load_cluster("cpu", nodes=1, gpus_per_node=4)
    training = TrainingSpec(global_batch=8, seq_len=64, dtype="fp32", optimizer="sgd")
    unable = dataclasses.replace(restrict(SearchOptions(top_k=0), "torch"),
                                 tp_inner_weights=False)
    free = planner.plan_prepared(tiny_gpt_oss, cluster, training, unable)
    assert free.parallel["tp"] == 1
    pinned = dataclasses.replace(unable, fix=parse_fix("tp=2"))
    with pytest.raises(SpecError, match="fix.tp: 2 would split attention that keeps weights of "
                                        "its own .*pin tp=1 or plan for another --target"):
        planner.plan_prepared(tiny_gpt_oss, cluster, training, pinned)
    # what the leanest plan would need, when nothing fits, is one the target runs (tp = 1)
    from planner.search.costs import ModelArrays
    from planner.search.feasibility import leanest

    lean = leanest(ModelArrays.from_blocks(tiny_gpt_oss.blocks), tiny_gpt_oss.blocks, cluster,
                   training, unable)
    assert lean is not None and lean[1].tp == 1
    anywhere = planner.plan_prepared(tiny_gpt_oss, cluster, training,
                                     SearchOptions(fix=parse_fix("tp=2"), top_k=0))
    assert anywhere.parallel["tp"] == 2


def test_eager_attention_gives_context_parallelism_its_heads_and_key_value_bytes(tiny_gpt_oss):
    """gpt-oss's eager cores: 4 query heads, 2 key/value heads repeated to 4 before QK^T; a rank
    holds and exchanges the unrepeated keys and values (64 tokens x 2 heads x 16, fp32 trace
    in bf16 words), so context parallelism is planned for it."""
    import planner
    from planner import SearchOptions, TrainingSpec
    from planner.options import parse_fix

    w = _layer(tiny_gpt_oss, 1).work
    word = 2  # the trace's bf16
    assert (w.attn_heads_q, w.attn_heads_kv) == (4, 2)
    assert w.attn_q_bytes == 64 * 4 * 16 * word
    assert w.attn_kv_bytes == 2 * 64 * 2 * 16 * word  # keys and values
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch=8, seq_len=64, dtype="bf16", optimizer="adam")
    plan = planner.plan_prepared(tiny_gpt_oss, cluster, training,
                                 SearchOptions(fix=parse_fix("cp=2,tp=1,pp=1"), top_k=0))
    assert plan.parallel["cp"] == 2 and plan.predicted["breakdown"].get("cp_comm_s", 0) > 0


def test_targets_keep_to_the_exchanges_they_run_over_sliding_windows(tiny_gpt_oss):
    """Transformer Engine runs context parallelism over a sliding window with a2a or all_gather
    only, and over sinks with a2a only (gpt-oss has both); planner's runtime and torch's
    context_parallel (torchtitan) run none over a window."""
    import planner
    from planner import SearchOptions, TrainingSpec
    from planner.errors import SpecError
    from planner.options import parse_fix
    from planner.targets import restrict

    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch=8, seq_len=64, dtype="bf16", optimizer="adam")

    def plan(fix: str, target: str):
        return planner.plan_prepared(tiny_gpt_oss, cluster, training,
                                     restrict(SearchOptions(fix=parse_fix(fix), top_k=0), target))

    assert tiny_gpt_oss.blocks.blocks[1].work.attn_score_params == 4  # a sink per head
    megatron = plan("cp=2,tp=1,pp=2", "megatron")
    assert (megatron.parallel["cp"], megatron.parallel["cp_comm"]) == (2, "a2a")
    with pytest.raises(SpecError, match="cp_comm not run by the target over sliding windows"):
        plan("cp=2,tp=1,pp=2,cp_comm=p2p", "megatron")
    with pytest.raises(SpecError, match="cp_comm not run by the target with attention sinks"):
        plan("cp=2,tp=1,pp=2,cp_comm=allgather", "megatron")
    for target in ("torch", "torchtitan"):
        with pytest.raises(SpecError, match=f"^fix.cp: {target} runs no context parallelism over "
                                            "the model's sliding-window attention"):
            plan("cp=2,tp=1,pp=1", target)
    anywhere = plan("cp=2,tp=1,pp=1,cp_comm=p2p", "any")
    assert anywhere.parallel["cp_comm"] == "p2p"
    # exported to torchtitan, such a plan is refused for its attention (a new-user check: the
    # export blamed the memory of the nearest exchange and advised a re-plan that fails)
    from planner.export.torchtitan import to_torchtitan
    with pytest.raises(SpecError, match=r"^export torchtitan: torchtitan 0\.2\.2 runs no context "
                                        r"parallelism over attention with sinks or sliding-window "
                                        r"attention, which .* has; re-plan with `.*--fix cp=1"):
        to_torchtitan(anywhere)



def test_eager_heads_come_from_the_scores_however_queries_are_laid_out(tmp_path):
    """An einsum attention over (batch, tokens, heads, dim) queries: the heads are the scores'
    (batch, heads, queries, keys), not the queries' third-last dimension (the tokens)."""
    from planner.api import prepare

    (tmp_path / "einsum_attention.py").write_text('''
import torch


class Attention(torch.nn.Module):
    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k).softmax(-1)
        return self.out(torch.einsum("bhqk,bkhd->bqhd", scores, v).reshape(b, s, w))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Attention() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x.sum()


def build():
    return Model(), (torch.randn(2, 16, 32),)
''')
    prepared = prepare(f"{tmp_path / 'einsum_attention.py'}:build", cache_dir=None)
    heads = {(b.work.attn_heads_q, b.work.attn_heads_kv) for b in prepared.blocks.blocks
             if b.work.attn_heads_q}
    assert heads == {(4, 4)}


def test_gpt_oss_experts_carry_biases_and_megatron_keeps_their_matrices_whole(tiny_gpt_oss):
    """Megatron-Core asserts "Bias in Moe is only supported when ETP==1": --target megatron
    plans etp = 1 for gpt-oss, whose experts add a bias each; other targets may split them."""
    import planner
    from planner import targets
    from planner.options import parse_fix
    w = _layer(tiny_gpt_oss, 0).work
    assert w.expert_bias == 1.0
    # the biases (one row per expert) are expert parameters: spread over ep with the matrices
    experts = {n: p for n, p in tiny_gpt_oss.opgraph.params.items()
               if n.startswith("model.layers.0.mlp.experts.")}
    assert w.expert_params == sum(p.numel for p in experts.values())
    assert any(len(p.shape) == 2 for p in experts.values())

    def plan(target, fix):
        options = targets.restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0), target)
        return planner.plan_prepared(tiny_gpt_oss, planner.load_cluster("dgx-h100", nodes=1),
                                     planner.TrainingSpec(global_batch=16, seq_len=64), options)
    assert plan("any", "tp=2,etp=2,ep=2").parallel["etp"] == 2
    with pytest.raises(planner.SpecError, match="^fix.etp: megatron does not split experts' "
                                                "matrices where the experts carry biases"):
        plan("megatron", "tp=2,etp=2,ep=2")
    assert plan("megatron", "tp=2,ep=2").parallel["etp"] == 1


def test_gpt_oss_experts_output_with_its_bias_is_dropped_once(tiny_gpt_oss):
    """gpt-oss adds a bias to its experts' output before the routing weights multiply it: the
    multiply keeps the sum, which the fused chain of the two drops, keeping the GEMM's output in
    its place (fusion.fused_kept_inputs); that output is what the routing weights alone keep
    (BlockWork.act_routed_weighted), dropped once where they multiply inside the activation."""
    from costmodels import memory

    w = _layer(tiny_gpt_oss, 0).work
    copies = 64 * TINY_GPT_OSS["num_experts_per_tok"]  # (traced at 64 tokens, bf16)
    assert w.num_experts and w.expert_bias
    assert w.act_routed_weighted == copies * TINY_GPT_OSS["hidden_size"] * 2
    kw = dict(micro_batch=1, tp=1, sp=False, recompute="none", fused=True)
    assert memory.activation_bytes(w, **kw, probs_in_activation=True) == \
        memory.activation_bytes(w, **kw) - w.act_routed_weighted


def test_routed_traffic_at_the_hidden_width_is_left_uncounted_where_widths_coincide(
        tmp_path_factory):
    """Expert tensor parallelism repeats the routed experts' hidden-width traffic on every etp
    rank (BlockWork.mem_bytes_routed_hidden); the trace tells it from the activation between the
    expert GEMMs by width, which it cannot where the experts' inner width is the hidden width."""
    inner = TINY_GPT_OSS["intermediate_size"]
    wide = _traced(tmp_path_factory.mktemp("gpt_oss_wide"), {**TINY_GPT_OSS,
                                                              "hidden_size": inner // 2})
    narrow = _traced(tmp_path_factory.mktemp("gpt_oss_same"), {**TINY_GPT_OSS, "hidden_size": inner})
    for prepared, counted in ((wide, True), (narrow, False)):
        works = [b.work for b in prepared.blocks.blocks if b.work.num_experts]
        assert works and all(w.mem_bytes_routed > 0 for w in works)
        assert all((0 < w.mem_bytes_routed_hidden < w.mem_bytes_routed) if counted
                   else w.mem_bytes_routed_hidden == 0 for w in works)



def test_windowed_calls_under_a_ring_keep_their_own_price():
    """A review: on H100 a ring of 2 priced a 128-key window at a quarter of one rank's price
    (the ring's pairs left the window's row work out and took it off again). Windowed calls
    keep the rank's share of their price; a causal call still gains the ring's unmasked pairs."""
    from costmodels.attention import attention_time_s, ring_attention_s
    from costmodels.engine import EngineSpec
    from costmodels.hardware import DEVICES
    from costmodels.workload import BlockWork

    length, square = 32768, 4.0 * 64 * 64 * 32768 ** 2
    keep = window_keep(length, 128)
    windowed = BlockWork(attn_flops=square, fused_attn_flops=square, attn_causal_flops=square,
                         attn_window_cut=(1 - keep) * square, attn_window_flops=square,
                         attn_window_rows=square / length, fused_attn_calls=1, attn_head_dim=64)
    causal = BlockWork(attn_flops=square, fused_attn_flops=square, attn_causal_flops=square,
                       fused_attn_calls=1, attn_head_dim=64)
    h100, engine = DEVICES["h100"], EngineSpec()

    def summed(work):  # both ranks of the ring, forward and backward
        own = attention_time_s(work, h100, "bf16", engine, micro_batch=0.5, tp=1)
        ring = ring_attention_s(work, h100, "bf16", engine, micro_batch=1, tp=1, cp=2)
        return [2 * (o + r) for o, r in zip(own, ring)]

    alone = attention_time_s(windowed, h100, "bf16", engine, micro_batch=1, tp=1)
    assert summed(windowed) == pytest.approx(list(alone))
    whole = attention_time_s(causal, h100, "bf16", engine, micro_batch=1, tp=1)
    assert all(s < w for s, w in zip(summed(causal), whole))
