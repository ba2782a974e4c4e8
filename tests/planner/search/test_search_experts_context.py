"""Expert and context parallelism in the search: what the trace finds, the rules, and what each
degree changes in a plan."""

import dataclasses
import json
import math

import numpy as np
import pytest

import planner
from planner.options import parse_fix
from tests.conftest import TINY_MIXTRAL

MIXTRAL = {**TINY_MIXTRAL, "num_hidden_layers": 3}


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-mixtral") / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    return planner.prepare(str(path), seq_len=256)


def _plan(prepared, fix, *, nodes=1, gb=64, cluster="dgx-h100", engine=None, target="any"):
    training = planner.TrainingSpec(global_batch=gb, seq_len=prepared.seq_len,
                                    **({"engine": engine} if engine else {}))
    return planner.plan_prepared(prepared, planner.load_cluster(cluster, nodes=nodes), training,
                                 planner.SearchOptions(fix=parse_fix(fix), top_k=0,
                                                       target=target))


def test_trace_finds_routed_experts_and_grouped_query_heads(tiny_mixtral):
    layers = [b for b in tiny_mixtral.blocks.blocks if b.work.num_experts]
    assert len(layers) == 3
    w = layers[0].work
    assert w.num_experts == 8
    assert w.routed_tokens == 256 * 2  # tokens x top-k per sample
    assert w.expert_params == 8 * 3 * 64 * 128  # gate, up, down of every expert
    assert w.attn_heads_q == 8 and w.attn_heads_kv == 2  # GQA seen, not repeated heads
    assert w.attn_kv_bytes == 2 * 256 * 2 * 8 * 2  # K and V: kv heads x tokens x head dim, bf16


def test_expert_parallelism_shards_expert_states(tiny_mixtral):
    one = _plan(tiny_mixtral, "ep=1,tp=1,pp=1,zero=0,micro_batch=1")
    four = _plan(tiny_mixtral, "ep=4,tp=1,pp=1,zero=0,micro_batch=1")
    assert four.parallel["ep"] == 4 and four.parallel["dp"] == 8
    w1 = one.stages[0]["predicted"]["memory_bytes"]["weights"]
    w4 = four.stages[0]["predicted"]["memory_bytes"]["weights"]
    expert = sum(b.work.expert_params for b in tiny_mixtral.blocks.blocks)
    assert w1 - w4 == pytest.approx(2 * expert * (1 - 1 / 4), rel=1e-3)  # bf16 weights
    assert four.predicted["breakdown"]["ep_comm_s"] > 0
    assert "ep_comm_s" not in one.predicted["breakdown"]


def test_settings_the_pins_leave_unused_are_named(tiny_mixtral, tiny_llama, caplog):
    from costmodels.engine import engine_from_mapping
    for pins, engine, said in (
            ("ep=1,tp=1,pp=1", "moe_overlap=true", "engine.moe_overlap: with ep=1 (pinned)"),
            ("ep=1,etp=1,tp=1,pp=1", "moe_dispatcher=allgather",
             "engine.moe_dispatcher: with ep=1 and etp=1 (pinned)"),
            ("ep=2,tp=1,pp=1", "moe_capacity_factor=1.25",
             "engine.moe_capacity_factor: under balanced routing")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="planner"):
            _plan(tiny_mixtral, pins, engine=engine_from_mapping(engine))
        assert said in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):  # each used: nothing said
        _plan(tiny_mixtral, "ep=2,tp=1,pp=1", engine=engine_from_mapping(
            "moe_overlap=true,moe_capacity_factor=1.25,moe_imbalance=1.5"))
    assert "changes nothing" not in caplog.text and "not run by this plan" not in caplog.text
    # (a capacity below the busiest expert's share drops tokens: said, with the share)
    assert "engine.moe_capacity_factor: 1.25 with moe_imbalance 1.5 drops tokens" in caplog.text
    assert "17% of its token copies are dropped" in caplog.text
    # the overlap asked for, and a chosen configuration that cannot run it (full recomputation)
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):
        p = _plan(tiny_mixtral, "ep=2,tp=1,pp=1,recompute=full",
                  engine=engine_from_mapping("moe_overlap=true"))
    assert "engine.moe_overlap: not run by this plan's configuration (the overlapped all-to-all " \
        "needs no full recomputation; the search chose" in caplog.text
    assert p.predicted["breakdown"]["ep_comm_s"] > 0
    from planner.report.summary import summary  # noqa: PLC0415
    assert "moe_overlap=true); moe_overlap not run here (it needs no full recomputation)" in \
        summary(p)
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):  # a dense model: said once, before
        _plan(tiny_llama, "tp=1,pp=1,recompute=full", engine=engine_from_mapping(
            "moe_overlap=true"))
    assert "moe_overlap" in caplog.text and "not run by this plan" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):  # an engine setting without its base
        _plan(tiny_mixtral, "ep=2,tp=1,pp=1", engine=engine_from_mapping("fsdp_experts=true"))
    assert "engine.fsdp_experts: applies with fsdp_copies=true" in caplog.text


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep"])
def test_the_searchs_dispatch_bound_is_below_every_placement(tiny_mixtral, dispatcher):
    """The search bounds a configuration with its least dispatch (costs._least_dispatch_s); under
    DeepEP a node's links forward what the network brings, so spreading the group can be the
    cheaper placement when they set the time (a review found the bound 10% above a placed price
    on NVL72 racks): the bound takes the least over the spreads."""
    from costmodels import comm, experts
    from costmodels.engine import engine_from_mapping
    from planner.search import costs

    ma = costs.ModelArrays.from_blocks(tiny_mixtral.blocks)
    w = ma.work
    # a fast network and slow node links: the forwarding sets DeepEP's time
    cluster = planner.load_cluster({"name": "slow-links", "device": "h100", "nodes": 8,
                                    "gpus_per_node": 8,
                                    "intra_node": {"bandwidth_GBps": 20, "latency_us": 1},
                                    "inter_node": {"bandwidth_GBps": 400, "latency_us": 1}})
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len,
                                    engine=engine_from_mapping(f"moe_dispatcher={dispatcher},"
                                                               "moe_host_op_s=0"))
    c = costs.block_costs(ma, cluster, training, tp=1, sp=False, recompute="none",
                          micro_batch=2, ep=8)
    for per_node in range(1, 9):
        placed = experts.block_dispatch_s(
            training.engine, dispatch_bytes=w.dispatch_bytes, routed_tokens=w.routed_tokens,
            seq_len=training.seq_len, share=2.0, ep=8,
            ep_group=comm.GroupShape(size=8, per_node=per_node),
            etp_group=comm.GroupShape(size=1, per_node=1), cluster=cluster,
            recompute_full=False, fwd_s=c.fwd_s, bwd_s=c.backward_pass_s,
            num_experts=w.num_experts, moe_layers=w.moe_layers, capacity=w.expert_capacity)
        assert np.all(c.ep_comm_s <= placed * (1 + 1e-12)), per_node
    assert c.ep_comm_s.max() > 0


def test_torchtitan_runs_deepep_in_its_deepseek_v3_and_llama4_models_only(tiny_mixtral):
    """A Hugging Face model's type, recorded with its trace, says whether torchtitan's model of
    it runs DeepEP: refused before the trace for a zoo model, before the search for others."""
    from costmodels.engine import engine_from_mapping
    with pytest.raises(planner.SpecError, match=r"^engine.moe_dispatcher: torchtitan's MoE runs "
                                                r"DeepEP in its deepseek_v3 and llama4 models "
                                                r"only, not qwen3_moe; set moe_dispatcher="
                                                r"alltoall"):
        planner.plan("qwen3-30b-a3b", cluster="dgx-h100", global_batch=64, target="torchtitan",
                     engine="moe_dispatcher=deepep")
    assert tiny_mixtral.info["model_type"] == "mixtral"
    # its deepseek_v3 raises NotImplementedError for DeepEP with expert tensor parallelism
    from planner import targets
    deepep = engine_from_mapping("torchtitan,moe_dispatcher=deepep")
    options = planner.SearchOptions(top_k=0, target="torchtitan")
    assert not targets.for_engine(options, deepep).expert_tensor_parallel
    assert targets.for_engine(options, engine_from_mapping("torchtitan")) == options
    with pytest.raises(planner.SpecError, match=r"^fix.etp: torchtitan runs DeepEP with whole "
                                                r"expert matrices only; pin etp=1"):
        targets.for_engine(planner.SearchOptions(fix=parse_fix("etp=2"), target="torchtitan"),
                           deepep)
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len,
                                    engine=engine_from_mapping("torchtitan,moe_dispatcher=deepep"))
    with pytest.raises(planner.SpecError, match="not mixtral"):
        planner.plan_prepared(tiny_mixtral, planner.load_cluster("dgx-h100", nodes=2), training,
                              planner.SearchOptions(top_k=0, target="torchtitan"))


def test_op_level_checkpointing_keeps_the_all_to_alls_outputs(tiny_mixtral):
    """torchtitan's op-level policy saves all_to_all_single outputs (gpt_oss, deepseek_v3,
    llama4): with ep > 1 a rank keeps its experts' received copies and the combine's returned
    ones, which the trace on one device never sees; nothing without ep or under other policies."""
    from planner.search import costs

    ma = costs.ModelArrays.from_blocks(tiny_mixtral.blocks)
    cluster = planner.load_cluster("dgx-h100", nodes=2)
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len)

    def act(recompute, ep, micro_batch=2):
        return costs.block_costs(ma, cluster, training, tp=1, sp=False, recompute=recompute,
                                 micro_batch=micro_batch, ep=ep).act_bytes
    moe = ma.work.dispatch_bytes > 0
    assert moe.any()
    extra = act("op", 4) - act("op", 1)
    np.testing.assert_allclose(extra[moe], 2 * 2 * ma.work.dispatch_bytes[moe])
    assert not extra[~moe].any()
    for other in ("none", "full"):
        np.testing.assert_allclose(act(other, 4), act(other, 1))


def test_uneven_routing_slows_expert_parallel_ranks_only(tiny_mixtral):
    from costmodels.engine import engine_from_mapping

    # device time only (the host issue time of the tiny layers would hide the difference)
    balanced, uneven = (engine_from_mapping(f"moe_host_op_s=0,moe_imbalance={x}") for x in (1, 2))
    for fix, slower in (("ep=1,tp=1,pp=1,zero=0,micro_batch=1", False),
                        ("ep=8,tp=1,pp=1,zero=0,micro_batch=1", True)):
        even = _plan(tiny_mixtral, fix, engine=balanced)
        skewed = _plan(tiny_mixtral, fix, engine=uneven)
        # one rank holding every expert computes every token copy whatever the routing
        assert (skewed.step_time_s > even.step_time_s * (1 + 1e-6)) is slower, fix
        # and keeps them for backward: the busiest expert-parallel rank keeps more
        acts = [p.stages[0]["predicted"]["activation_bytes_per_microbatch"]
                for p in (even, skewed)]
        assert (acts[1] > acts[0] * (1 + 1e-6)) is slower, fix
        if not slower:
            assert skewed.step_time_s == pytest.approx(even.step_time_s, rel=1e-9)
            assert acts[1] == pytest.approx(acts[0], rel=1e-12)


def test_the_busiest_rank_moves_its_extra_copies_through_the_experts_element_wise_ops(
        tiny_mixtral):
    """The element-wise ops inside the routed experts (token gathers, the activation between
    the expert GEMMs, the weighting and combine) run on token copies: the busiest rank moves
    load times their mean traffic; the rest of the block's traffic does not change."""
    from costmodels.compute import memory_bound_s
    from costmodels.engine import engine_from_mapping
    from costmodels.hardware import get_device

    device = get_device("h100")
    works = [b.work for b in tiny_mixtral.blocks.blocks if b.work.num_experts]
    assert works and all(0 < w.mem_bytes_routed < w.mem_bytes_rep for w in works)
    for kernels in ("eager", "fused"):
        engine = engine_from_mapping(f"kernels={kernels}")
        for w in works:
            for tp, sp in ((1, False), (2, True)):  # sequence parallelism splits the tokens
                args = dict(micro_batch=64, tp=tp, sp=sp)
                mean, busiest = (memory_bound_s(w, device, engine, load=x, **args)
                                 for x in (1.0, 1.5))
                extra = 64 * 0.5 * w.mem_bytes_routed / tp / device.memory_bytes_per_s
                if kernels == "fused":  # the same share of the fused bytes outside tp regions
                    extra *= w.fused_bytes_rep / w.mem_bytes_rep
                assert busiest - mean == pytest.approx(extra, rel=1e-9), (kernels, tp)
                # etp ranks each gather, weight and combine all their copies at the hidden width;
                # the activation between the expert GEMMs (4x wider) is split over them
                folded = memory_bound_s(w, device, engine, load=1.5, etp=2, **args)
                more = 64 * 1.5 * w.mem_bytes_routed_hidden / tp / device.memory_bytes_per_s
                if kernels == "fused":
                    more *= w.fused_bytes_rep / w.mem_bytes_rep
                assert folded - busiest == pytest.approx(more, rel=1e-9), (kernels, tp)
    assert all(0 < w.mem_bytes_routed_hidden < w.mem_bytes_routed for w in works)


def test_the_busiest_ranks_extra_copies_are_what_the_experts_save(tiny_mixtral):
    from costmodels import memory
    from costmodels.experts import rank_load
    from costmodels.engine import engine_from_mapping

    uneven = engine_from_mapping("moe_imbalance=2")
    works = [b.work for b in tiny_mixtral.blocks.blocks if b.work.num_experts]
    load = rank_load(uneven, ep=8, num_experts=int(works[0].num_experts))
    assert load > 1
    for recompute, grows in (("none", True), ("selective", True), ("full", False)):
        for fused in (False, True):
            args = dict(micro_batch=2, tp=1, sp=False, recompute=recompute, fused=fused)
            mean = sum(memory.activation_bytes(w, **args) for w in works)
            busiest = sum(memory.activation_bytes(w, routed_load=load, **args) for w in works)
            routed = sum(w.act_routed_rep + w.act_routed_tp - fused * (
                w.act_routed_fused_away_rep + w.act_routed_fused_away_tp) for w in works)
            expected = 2 * (load - 1) * routed if grows else 0.0
            assert busiest - mean == pytest.approx(expected, rel=1e-9), (recompute, fused)
            # full recomputation keeps the block's input only, but rebuilds all the rest
            again = [sum(memory.recompute_working_bytes(w, routed_load=x, **args) for w in works)
                     for x in (1.0, load)]
            assert again[1] - again[0] == pytest.approx(
                2 * (load - 1) * routed if recompute == "full" else 0.0, rel=1e-9)
    # under fp8 the extra copies the expert GEMMs read are kept quantized, as the mean's are
    linear_in = sum(w.act_routed_linear_in_rep + w.act_routed_linear_in_tp for w in works)
    assert 0 < linear_in < sum(w.act_routed_rep + w.act_routed_tp for w in works)
    args = dict(micro_batch=2, tp=1, sp=False, recompute="none")
    extra = {fp8: sum(memory.activation_bytes(w, routed_load=load, fp8=fp8, **args)
                      - memory.activation_bytes(w, fp8=fp8, **args) for w in works)
             for fp8 in (False, True)}
    assert extra[False] - extra[True] == pytest.approx(2 * (load - 1) * 0.5 * linear_in, rel=1e-9)
    # expert tensor parallelism: each of two etp ranks keeps both ranks' copies of the hidden
    # states the first expert GEMM reads (512 copies of 64 bf16 values a layer), the rest split
    gathered = sum(w.act_routed_gathered for w in works)
    assert gathered == 3 * 2 * 256 * 64 * 2
    args = dict(micro_batch=2, tp=2, sp=True, recompute="none")
    split = [sum(memory.activation_bytes(w, routed_load=load, etp=e, **args) for w in works)
             for e in (1, 2)]
    assert split[1] - split[0] == pytest.approx(load * 2 * gathered / 2, rel=1e-9)


@pytest.mark.parametrize("fix", ["ep=1,tp=1,pp=1,micro_batch=2", "ep=8,tp=1,pp=1,micro_batch=2"])
def test_experts_padded_to_capacity_cost_their_slots_with_balanced_routing(tiny_mixtral, fix):
    """With balanced routing a capacity factor alone changes nothing; padding every expert to its
    capacity makes every rank compute, send and keep the padded slots (with one rank too)."""
    from costmodels.engine import engine_from_mapping
    plans = [_plan(tiny_mixtral, fix, engine=engine_from_mapping(f"moe_host_op_s=0,{e}"))
             for e in ("moe_capacity_factor=0", "moe_capacity_factor=1.5",
                       "moe_capacity_factor=1.5,moe_pad_to_capacity=true")]
    dropless, capped, padded = ((p.predicted["step_time_s"], p.predicted["peak_memory_bytes"])
                                for p in plans)
    assert capped == dropless
    assert padded[0] > dropless[0] and padded[1] > dropless[1]
    sent = [p.predicted["breakdown"].get("ep_comm_s", 0.0) for p in plans]
    if fix.startswith("ep=8"):
        assert sent[0] == sent[1] and sent[2] > sent[0] > 0
    else:
        assert sent == [0.0] * 3
    # the devices compute the padded slots: hardware FLOPs grow by half the routed experts'
    # work (forward and backward), model FLOPs do not
    works = [b.work for b in tiny_mixtral.blocks.blocks if b.work.num_experts]
    routed = 3 * sum(w.expert_flops for w in works) * 64  # global batch 64
    flops = [(p.predicted["model_flops_per_step"], p.predicted["hardware_flops_per_step"])
             for p in plans]
    assert flops[2][0] == flops[0][0]
    assert flops[2][1] - flops[0][1] == pytest.approx(0.5 * routed, rel=1e-3)  # (6 digits kept)
    # op-level recomputation runs the routed GEMMs' forward again whole, padded slots and all
    again = [_plan(tiny_mixtral, fix + ",recompute=op", engine=engine_from_mapping(
        f"moe_host_op_s=0,moe_capacity_factor=1.5{pad}")).predicted["hardware_flops_per_step"]
        for pad in ("", ",moe_pad_to_capacity=true")]
    assert again[1] - again[0] == pytest.approx(0.5 * routed * 4 / 3, rel=1e-3)
    from planner.report.summary import summary
    assert "for TFLOP/s (+ " in summary(plans[2]) and "padded slots)" in summary(plans[2])
    assert "padded" not in summary(plans[0])


def test_padding_beyond_what_routing_fills_is_refused(tiny_mixtral):
    """An expert of E with top-k routing gets at most E / k x the mean, every token once: a
    capacity padded beyond it is refused (Megatron-Core's unfused permutation cannot pad past
    the tokens), at that bound it is taken; the dropless-only targets name both settings."""
    from costmodels.engine import engine_from_mapping
    from planner import targets
    most = MIXTRAL["num_local_experts"] / MIXTRAL["num_experts_per_tok"]
    assert _plan(tiny_mixtral, "ep=2", engine=engine_from_mapping(
        f"moe_capacity_factor={most:g},moe_pad_to_capacity=true")).parallel["ep"] == 2
    with pytest.raises(planner.SpecError, match=r"^engine\.moe_capacity_factor: .* with "
                       r"moe_pad_to_capacity is more than .*give at most"):
        _plan(tiny_mixtral, "ep=2", engine=engine_from_mapping(
            f"moe_capacity_factor={most + 0.5:g},moe_pad_to_capacity=true"))
    with pytest.raises(planner.SpecError, match="leave moe_capacity_factor and "
                                                "moe_pad_to_capacity out"):
        targets.check_engine(engine_from_mapping(
            "moe_capacity_factor=1.25,moe_pad_to_capacity=true"), "torchtitan")


def test_zero_holds_a_whole_gradient_only_of_what_it_shards():
    """ZeRO-2/3 keep a running block's gradient (ZeRO-3: and its gathered weights) whole until
    its reduce-scatter; parameters with one replica are whole in the model states already: the
    dense ones with dp x cp = 1, the routed experts' with edp = 1 (each expert on one rank)."""
    import types
    from planner.options import Config
    from planner.search.costs import working_bytes
    costs = types.SimpleNamespace(work_bytes=np.array([0.0]), params_local=np.array([100.0]),
                                  expert_params_local=np.array([80.0]),
                                  frozen_local=np.array([0.0]), frozen_expert_local=np.array([0.0]))
    training = planner.TrainingSpec(global_batch=64, seq_len=256)
    grads = working_bytes(Config(dp=8, tp=1, pp=1, micro_batch=1, num_microbatches=8, zero=2,
                                 ep=4), costs, training)[0] / 100  # edp 2: all of it
    assert grads > 0
    for dp, ep, zero, whole in ((8, 8, 2, 20), (8, 8, 3, 20), (1, 1, 2, 0), (8, 8, 1, 0)):
        cfg = Config(dp=dp, tp=1, pp=1, micro_batch=1, num_microbatches=8, zero=zero, ep=ep)
        extra = 2 * 2 if zero == 3 else 0  # the bf16 weights gathered, and the next block's
        assert working_bytes(cfg, costs, training)[0] == pytest.approx(whole * (grads + extra))


def test_a_length_that_rules_out_sequence_splits_is_named_with_the_nearest_that_does_not():
    from planner.search.feasibility import length_note
    from planner.search.space import CP_SEQ, SP_SEQ
    note = length_note(131071, {SP_SEQ: 3, CP_SEQ: 2})
    assert note.startswith("training.seq_len: 131,071 tokens")
    assert "(131,072)" in note and length_note(130, {CP_SEQ: 1}).endswith(
        "a multiple of 256 (256) splits over tp up to 8 with cp up to 16")
    assert length_note(131072, {SP_SEQ: 3}) == "" == length_note(131071, {"other": 2})
    # a pinned cp: a length its 2 x cp chunks split into (a new-user check pinned cp=9 and was
    # told 131,072, which 18 chunks do not split)
    pinned = length_note(131076, {SP_SEQ: 3}, fix={"cp": 9})
    assert pinned.endswith("a multiple of 2,304 (131,328) splits over tp up to 8 with cp=9")
    assert length_note(131076, {SP_SEQ: 3}, fix={"cp": 9, "tp": 2}).endswith(
        "a multiple of 2,304 (131,328) splits over tp=2 with cp=9")
    assert length_note(4096, {SP_SEQ: 1}, fix={"cp": 3}).endswith("(3,840) splits over tp up "
                                                                   "to 8 with cp=3")
    assert length_note(1000, {SP_SEQ: 1}, fix={"tp": 3}).endswith("a multiple of 768 (768) "
                                                                  "splits over tp=3 with cp up "
                                                                  "to 16")
    # an image model's length is its patches (ViT-L/16 at 224: 197): no length to pick
    image = length_note(197, {SP_SEQ: 3}, image=True)
    assert "an image's 197 tokens" in image and "image_size and patch_size" in image
    assert "multiple" not in image


def test_a_batch_that_rules_out_data_parallel_degrees_is_named_with_the_nearest_that_do_not():
    from planner.search.feasibility import batch_note
    from planner.search.space import BATCH_DP, Config
    cfg = Config(dp=2, tp=1, pp=4, micro_batch=1, num_microbatches=50)
    note = batch_note(100, 8, cfg, {BATCH_DP: 3})
    assert note == ("training.global_batch: 100 samples do not split over dp=8, which ruled it "
                    "out: the plan uses dp=2 with pp=4; a multiple of 8 (96 or 104) splits")
    assert "(nor dp=8, dp=16)" in batch_note(100, 32, dataclasses.replace(cfg, dp=4), {BATCH_DP: 1})
    assert batch_note(96, 8, cfg, {BATCH_DP: 1}) == "" == batch_note(100, 8, cfg, {})
    # with tp=2 pinned on 8 GPUs dp is at most 4: 52 splits (a review saw 48 or 56 offered)
    pinned = batch_note(50, 8, dataclasses.replace(cfg, tp=2, pp=1), {BATCH_DP: 1}, {"tp": 2})
    assert "over dp=4, which" in pinned and "a multiple of 4 (48 or 52)" in pinned
    # degrees no layout fits at are not worth a larger batch: left out (a new-user check was told
    # to raise a 262k-token run's batch for dp=32, which needs 480 GB per GPU)
    wide = dataclasses.replace(cfg, dp=4)
    assert batch_note(100, 32, wide, {BATCH_DP: 1}, fits=lambda dp: dp <= 8) == (
        "training.global_batch: 100 samples do not split over dp=8, which ruled it out: the plan "
        "uses dp=4 with pp=4; a multiple of 8 (96 or 104) splits")
    assert batch_note(100, 32, wide, {BATCH_DP: 1}, fits=lambda dp: False) == ""


def test_the_batch_note_leaves_out_data_parallel_degrees_that_do_not_fit(caplog):
    """dp_fits over a real model: at 262k tokens llama3-8b fits no dp of 16 or 32 on 32 B200s."""
    from planner.inputs.clusters import load_cluster
    from planner.search.feasibility import dp_fits
    from planner.settings import target_engine

    prepared = planner.prepare("llama3-8b", seq_len=262144, dtype="fp8")
    cluster = load_cluster("dgx-b200", nodes=4)
    training = planner.TrainingSpec(global_batch=8, seq_len=262144, dtype="fp8",
                                    engine=target_engine(None, "any"))
    assert not dp_fits(prepared.blocks, cluster, training, planner.SearchOptions(), 32)
    assert dp_fits(prepared.blocks, cluster, training, planner.SearchOptions(), 4)
    with caplog.at_level("WARNING", logger="planner"):
        planner.plan("llama3-8b", cluster="dgx-b200", nodes=4, global_batch=8, seq_len=262144,
                     dtype="fp8")
    assert "do not split over" not in caplog.text


def test_an_image_model_of_a_config_is_known_by_its_pixel_input(tmp_path):
    from planner.trace.models import resolve
    (tmp_path / "vit.json").write_text(json.dumps(
        {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64, "image_size": 32, "patch_size": 16}))
    (tmp_path / "llama.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}))
    assert resolve(str(tmp_path / "vit.json"), seq_len=None, dtype="fp32").image_tokens
    assert not resolve(str(tmp_path / "llama.json"), seq_len=16, dtype="fp32").image_tokens


def test_a_cp_an_images_tokens_do_not_split_names_the_images_sizes(tmp_path, tiny_llama):
    """A new-user check: ViT-H/14's 257 tokens with cp=2 read "(causal load balancing); use a
    sequence length divisible by 4": its attention is not causal, and --seq-len does not set an
    image's tokens."""
    from planner import TrainingSpec
    from planner.inputs.clusters import load_cluster
    from planner.search.feasibility import pin_problem
    from planner.search.space import Space

    (tmp_path / "vit.json").write_text(json.dumps(
        {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64, "image_size": 48, "patch_size": 16}))  # 9 patches + [CLS]
    cluster = load_cluster("dgx-h100", nodes=1)
    with pytest.raises(planner.SpecError) as err:
        planner.plan(str(tmp_path / "vit.json"), cluster="dgx-h100", nodes=1, global_batch=8,
                     fix="cp=4")
    text = str(err.value)
    assert text.startswith("fix.cp: an image's 10 tokens") and "not causal" in text
    # (n x n patches and a class token are never a multiple of 4: no cp > 1 cuts them)
    assert "drop cp" in text and "image_size and patch_size" in text and "--seq-len" not in text
    vit = Space.of(cluster, planner.prepare(str(tmp_path / "vit.json")).blocks, None)
    assert not vit.causal and not vit.image  # (the caller says what the trace found)
    assert Space.of(cluster, tiny_llama.blocks, None).causal
    assert "(causal load balancing)" in pin_problem(
        {"cp": 2}, Space.of(cluster, tiny_llama.blocks, None), TrainingSpec(global_batch=8,
                                                                            seq_len=126), None)


def test_an_encoder_decoders_encoder_length_is_known_and_shown(tmp_path, caplog):
    """A new-user check: Whisper's 1,500 encoder positions appeared nowhere; tokens/s counts the
    decoder's tokens, which the plan's header now says."""
    from planner.report.summary import summary
    from planner.trace.models import resolve
    (tmp_path / "whisper.json").write_text(json.dumps(
        {"model_type": "whisper", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
         "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64,
         "decoder_ffn_dim": 64, "num_mel_bins": 8, "max_source_positions": 24,
         "max_target_positions": 32, "vocab_size": 128, "pad_token_id": 0}))
    (tmp_path / "t5.json").write_text(json.dumps(
        {"model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 1,
         "num_heads": 4, "vocab_size": 128, "decoder_start_token_id": 0, "pad_token_id": 0}))
    assert resolve(str(tmp_path / "whisper.json"), seq_len=16, dtype="fp32").encoder_tokens == 24
    assert resolve(str(tmp_path / "t5.json"), seq_len=16, dtype="fp32").encoder_tokens == 16
    plan = planner.plan(str(tmp_path / "whisper.json"), cluster="dgx-h100", nodes=1,
                        global_batch=16, seq_len=16, cache_dir=None)
    assert plan.model["encoder_tokens"] == 24
    assert "16 x 16 tokens (the decoder's, which tokens/s counts; the encoder reads 24 per " \
        "sample)" in summary(plan)
    # and a what-if's tokens/s column (a new-user check read it as every token's)
    caplog.set_level("WARNING", logger="planner")
    planner.whatif(str(tmp_path / "whisper.json"), cluster="dgx-h100", vary={"nodes": [1]},
                   global_batch=16, seq_len=16, workers=1)
    assert "tokens/s counts the decoder's 16 per sample; the encoder reads 24 more" in caplog.text


def test_context_parallelism_splits_activations(tiny_llama):
    one = _plan(tiny_llama, "cp=1,tp=1,pp=1,dp=8,micro_batch=8,recompute=none")
    two = _plan(tiny_llama, "cp=2,tp=1,pp=1,dp=4,micro_batch=16,recompute=none")
    a1 = one.stages[0]["predicted"]["activation_bytes_per_microbatch"]
    a2 = two.stages[0]["predicted"]["activation_bytes_per_microbatch"]
    assert a2 == pytest.approx(2 * a1 / 2, rel=1e-6)  # twice the samples, half the tokens each
    assert two.parallel["cp"] == 2 and two.predicted["breakdown"]["cp_comm_s"] > 0
    assert "cp_comm_s" not in one.predicted["breakdown"] or \
        one.predicted["breakdown"]["cp_comm_s"] == 0
    ranks = sorted(r for st in two.stages for r in st["ranks"])
    assert ranks == list(range(8))


def test_a_placement_the_pinned_degrees_rule_out_is_bad_input(tiny_mixtral):
    """Megatron-Core places pipeline neighbours on adjacent ranks (tp-pp-dp) only where the
    experts' data parallelism equals the attention's: with tp, cp, ep and pp pinned that is known
    before the search (a new-user check got exit 3, "no plan fits", from a rule count)."""
    def plan(pins, target):
        options = planner.SearchOptions(fix=parse_fix(f"{pins},placement=tp-pp-dp"),
                                        target=target, top_k=0)
        return planner.plan_prepared(
            tiny_mixtral, planner.load_cluster("dgx-h100", nodes=2),
            planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len), options)
    with pytest.raises(planner.SpecError, match=r"^fix.placement: tp-pp-dp with pp=2, tp=2, cp=2, "
                                                r"ep=8 \(dp=2\): .*ep x etp = tp x cp.*; pin "
                                                r"placement=tp-dp-pp"):
        plan("ep=8,cp=2,tp=2,pp=2", "megatron")
    assert plan("ep=4,cp=2,tp=2,pp=2", "megatron").parallel["ep"] == 4
    # a target that never places a pipeline so: whatever ep the search would take
    with pytest.raises(planner.SpecError, match=r"^fix.placement: tp-pp-dp with pp=2, tp=1, cp=1 "
                                                r"\(dp=8\): .* not run by torchtitan .*; pin "
                                                r"placement=tp-dp-pp$"):
        plan("cp=1,tp=1,pp=2", "torchtitan")


def test_every_form_that_splits_the_sequence_calls_attention_per_chunk(tiny_llama_config):
    """Transformer Engine's all-gather form calls attention per query chunk against the keys
    before it, the ring per chunk pair: the same causal pairs and the rest whole, so both run the
    same attention (before 2026-12-04 the all-gather form was priced as one causal call per
    rank); torch's ring holds more while a layer runs (fp32 merges and gradients)."""
    from planner.search import costs

    long = planner.prepare(tiny_llama_config, seq_len=8192, cache_dir=None)
    ma = costs.ModelArrays.from_blocks(long.blocks)
    cluster = planner.load_cluster("dgx-h100", nodes=1)

    def block(form, engine="megatron-core"):
        from costmodels.engine import engine_from_mapping
        training = planner.TrainingSpec(global_batch=8, seq_len=long.seq_len,
                                        engine=engine_from_mapping(engine))
        return costs.block_costs(ma, cluster, training, tp=1, sp=False, recompute="none",
                                 micro_batch=1, cp=4, cp_comm=form)
    ring, gathered = block("p2p"), block("allgather")
    attention = ma.work.fused_attn_flops > 0
    assert attention.any()
    np.testing.assert_allclose(gathered.compute_s, ring.compute_s)
    heads = block("a2a")  # a rank's heads of whole causal calls: the slower kernel shape
    assert (gathered.compute_s[attention] < heads.compute_s[attention]).all()
    torch_ring = block("p2p", "torchtitan,cp_ring=torch")
    te_ring = block("p2p", "torchtitan,cp_ring=te")
    assert (torch_ring.work_bytes[attention] > te_ring.work_bytes[attention]).all()


def test_an_etp_that_fits_no_stage_is_named(tiny_mixtral):
    """3 nodes of 4 GPUs over 4 stages: 3 GPUs a stage, which etp=2 does not divide (no ep to
    offer: a review saw "use one of ep = , ...")."""
    with pytest.raises(planner.SpecError, match=r"^fix\.etp: 2 does not divide the tp x cp x "
                                                r"dp = 3 GPUs of a pipeline stage \(12 GPUs / "
                                                r"pp=4\); pin etp=1 or fewer stages$"):
        _plan(tiny_mixtral, "ep=2,etp=2,pp=4", nodes=3, cluster="pcie-4090", gb=12)


def test_a_pipeline_without_virtual_stages_is_split_on_the_dispatch_it_runs(tiny_mixtral):
    """moe_overlap does not run on a pipeline without virtual stages, which prices the dispatch
    exposed: its stage split balances the exposed figures too, where pp=1 and interleaved ones
    take the overlapped (a new-user check saw moe_overlap=true, not run, change the stages)."""
    from costmodels.engine import engine_from_mapping
    from planner.options import Config
    from planner.search import costs

    ma = costs.ModelArrays.from_blocks(tiny_mixtral.blocks)
    cluster = planner.load_cluster("dgx-h100", nodes=2)

    def split(overlap, pp, vpp):
        training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len,
                                        engine=engine_from_mapping(f"moe_overlap={overlap}"))
        c = costs.block_costs(ma, cluster, training, tp=1, sp=False, recompute="none",
                              micro_batch=1, ep=8)
        cfg = Config(dp=16 // pp, tp=1, pp=pp, micro_batch=1, num_microbatches=8 // pp,
                     schedule="interleaved-1f1b" if vpp > 1 else "1f1b", recompute="none",
                     zero=1, vpp=vpp, ep=8)
        return np.array(c.split_s(cfg))

    np.testing.assert_allclose(split("true", 2, 1), split("false", 2, 1))
    for pp, vpp in ((1, 1), (2, 2)):  # (the overlap runs: the exposed part is smaller)
        assert split("true", pp, vpp).sum() < split("false", pp, vpp).sum(), (pp, vpp)


@pytest.mark.parametrize("fix,words", [
    ("ep=3", "does not divide the model's 8 experts; use one of 1, 2, 4, 8"),
    ("cp=3", "does not divide the cluster's 8 GPUs; use one of 1, 2, 4, 8"),
    ("etp=3", r"fix\.etp: 3 must be 1 or tp, and tp=3 breaks a rule"),
    # one node: a2a+p2p has no ring level, whatever tp (tp=4 would take 16 GPUs); a2a runs
    # (DeepSpeed's Ulysses copies the two key/value heads: test_all_to_all_over_more_ranks...)
    ("cp=4,cp_comm=a2a+p2p", r"a2a\+p2p with cp=4: it needs more than one but not all of the 4 "
                             r"cp ranks in each node \(an all-to-all inside a node, a ring across "
                             r"nodes\), which no tp gives here with nodes of 8 GPUs; pin "
                             r"cp_comm=p2p or allgather or a2a$"),
    ("etp=16", r"fix\.etp: 16 must be 1 or tp, and tp=16"),
    # (a new-user check was told to change the tp it pinned)
    ("etp=4,tp=2", r"^fix\.etp: 4 must be 1 or tp \(2\); pin etp=1 or etp=2$"),  # (tp=4: no)
    ("etp=2,tp=1", r"^fix\.etp: 2 must be 1 or tp \(1\); pin etp=1 \(or tp=2 instead\)$"),
    ("cp=8,dp=1,tp=1,pp=1", None),  # 256 tokens in 16 chunks of 16: allowed when pinned
    ("cp=1,cp_comm=a2a", r"fix\.cp_comm: a2a exchanges .* cp=1 has none; drop cp_comm or pin"),
    ("tp=2,sequence_parallel=false", r"fix\.sequence_parallel: false with tp=2, but a model with "
                                     r"routed experts .*; pin sequence_parallel=true or tp=1$"),
    # etp > 1 takes tp = etp, which sequence_parallel=false refuses: named, not a summary
    ("ep=2,etp=2,sequence_parallel=false", r"^fix\.sequence_parallel: false with etp=2, which "
                                           r"needs tp=2 .*; pin sequence_parallel=true or etp=1$"),
    ("ep=8,pp=2", r"fix\.ep: ep x etp = 8 must fold into the tp x cp x dp = 4 GPUs of a "
                  r"pipeline stage \(8 GPUs / pp=2\); use one of ep = 1, 2, 4, or fewer stages$"),
    ("ep=8,cp=2,tp=1,dp=2", r"fix\.ep: ep x etp = 8 must fold into the tp x cp x dp = 4 GPUs "
                            r"pinned for a pipeline stage; use one of ep = 1, 2, 4, or pin a "
                            r"larger dp$"),
])
def test_pins_of_ep_and_cp_are_checked(tiny_mixtral, fix, words):
    if words is None:
        assert _plan(tiny_mixtral, fix, gb=8).parallel["cp"] == 8
        return
    with pytest.raises(planner.SpecError, match=words):
        _plan(tiny_mixtral, fix)


def test_all_to_all_over_more_ranks_than_key_value_heads(tiny_mixtral):
    """Two key/value heads do not split over four ranks: Megatron-LM refuses the pin, naming
    them and the forms that need no heads; DeepSpeed's Ulysses copies them, so a plan for any
    engine takes it."""
    with pytest.raises(planner.SpecError, match=r"needs the 2 key-value heads divisible by tp x "
                                                r"cp = 4; pin cp_comm=p2p or allgather$"):
        _plan(tiny_mixtral, "cp=4,cp_comm=a2a", target="megatron")
    assert _plan(tiny_mixtral, "cp=4,cp_comm=a2a").parallel["cp_comm"] == "a2a"


def test_the_hierarchical_exchange_needs_both_of_its_levels(tiny_mixtral):
    """a2a+p2p runs an all-to-all over the cp ranks of a node and a ring across nodes: with one
    level only it is p2p or a2a under another name, refused when pinned and not searched."""
    with pytest.raises(planner.SpecError, match=r"a2a\+p2p with cp=2: with tp=2 a node of 8 GPUs "
                                                r"holds 2 of the 2 cp ranks, so it would be an "
                                                r"all-to-all alone \(a2a\)"):
        _plan(tiny_mixtral, "cp=2,tp=2,cp_comm=a2a+p2p,ep=1", nodes=2)
    pairs = planner.load_cluster("dgx-h100", nodes=4, gpus_per_node=2)
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len)
    with pytest.raises(planner.SpecError, match=r"with tp=2 a node of 2 GPUs holds 1 of the 2 cp "
                                                r"ranks, so it would be a ring alone \(p2p\)"):
        planner.plan_prepared(tiny_mixtral, pairs, training, planner.SearchOptions(
            fix=parse_fix("cp=2,tp=2,cp_comm=a2a+p2p"), top_k=0))
    # 16 ranks, 8 a node: both levels, and the heads (2 key/value) do not split over 8
    with pytest.raises(planner.SpecError, match=r"divisible by tp x the cp ranks in a node = 8"):
        _plan(tiny_mixtral, "cp=16,cp_comm=a2a+p2p", nodes=2, gb=8)
    # the search leaves one-level a2a+p2p out by that rule; with 2 cp ranks in each of 2 nodes
    # it has both levels and plans
    from planner.search.space import CP_LEVELS

    def pairs_plan(fix):
        return planner.plan_prepared(tiny_mixtral, pairs, training, planner.SearchOptions(
            fix=parse_fix(fix), top_k=0))
    assert pairs_plan("cp=2,tp=2").search["rejected"].get(CP_LEVELS, 0) > 0
    both = pairs_plan("cp=4,tp=1,cp_comm=a2a+p2p")
    assert both.parallel["cp_comm"] == "a2a+p2p" and both.predicted["breakdown"]["cp_comm_s"] > 0
    assert CP_LEVELS not in pairs_plan("cp=4,tp=1").search["rejected"]


def test_expert_pins_on_a_dense_model_and_uneven_sequences_are_refused(tiny_llama,
                                                                       tiny_llama_config,
                                                                       branched):
    with pytest.raises(planner.SpecError, match=r"no routed experts the trace recognizes \(a "
                                                r"grouped GEMM .*torch\._grouped_mm.*; drop ep$"):
        _plan(tiny_llama, "ep=2")
    with pytest.raises(planner.SpecError, match=r"^fix.cp: the model has no attention .*drop cp$"):
        _plan(branched, "cp=2")  # before: a count of the search's rules
    odd = planner.prepare(tiny_llama_config, seq_len=96, cache_dir=None)
    with pytest.raises(planner.SpecError, match="2 x cp = 64 equal chunks"):
        _plan(odd, "cp=32,tp=1,pp=1", nodes=4, gb=8)


def test_the_search_uses_context_parallelism_for_long_sequences(tiny_llama_config):
    """One 64k-token sequence per step on 8 GPUs: no data parallelism to be had, and the free
    search splits the sequence; at 128 tokens it never tries (shorter than cp_min_tokens)."""
    long = planner.prepare(tiny_llama_config, seq_len=65536, cache_dir=None)
    plan = _plan(long, None, nodes=1, gb=1)
    assert plan.parallel["cp"] > 1 and plan.parallel["dp"] == 1
    short = _plan(planner.prepare(tiny_llama_config, seq_len=128, cache_dir=None), None, gb=1)
    assert short.parallel["cp"] == 1


def test_pipelined_accumulation_keeps_one_more_gradient_under_fsdp2(tiny_mixtral):
    """torch.distributed.pipelining's schedules turn FSDP2's gradient sync off until the last
    micro-batch: with FSDP2-style data parallelism over two replicas and two micro-batches the
    gradients of every parameter (experts too, without expert parallelism) accumulate unreduced
    beside the reduced ones (measured on `plan run`'s replicate: 422.7 MB against 344.4 MB
    predicted before, 415.8 MB now; benchmarks/measured_vs_predicted.py --model mixtral)."""
    from costmodels.engine import engine_from_mapping

    def grads(fix, engine, zero=0, nodes=1):
        plan = _plan(tiny_mixtral, f"tp=1,pp=1,zero={zero},{fix}", gb=8, cluster="cpu",
                     nodes=nodes, engine=engine_from_mapping(engine))
        return plan.stages[0]["predicted"]["memory_bytes"]["grads"]  # 6 significant digits

    runtime = "fsdp_copies=true,pipelined_accumulation=true"
    params = sum(b.work.params_tp + b.work.params_rep for b in tiny_mixtral.blocks.blocks)
    base = grads("dp=2,ep=1,micro_batch=2", "fsdp_copies=true")  # fp32 main gradients
    assert base == pytest.approx(4 * params, rel=1e-5)
    # the unreduced sum, in the layout's gradient width (fp32 main gradients)
    assert grads("dp=2,ep=1,micro_batch=2", runtime) == pytest.approx(base + 4 * params, rel=1e-5)
    assert grads("dp=2,ep=1,micro_batch=4", runtime) == pytest.approx(base, rel=1e-5)  # one
    assert grads("dp=2,ep=1,micro_batch=2", "pipelined_accumulation=true") == \
        pytest.approx(base, rel=1e-5)  # Megatron-style buffers accumulate in place
    # with expert parallelism the runtime reduces the experts apart, without the extra buffer
    experts = sum(b.work.expert_params for b in tiny_mixtral.blocks.blocks)
    assert grads("dp=2,ep=2,micro_batch=2", runtime) == pytest.approx(
        4 * (params - experts) + 4 * experts / 2 + 4 * (params - experts), rel=1e-5)
    # sharded by ZeRO-2 over their replicas only once reduced, after every backward pass
    assert grads("dp=4,ep=2,micro_batch=1", runtime, zero=2, nodes=2) == pytest.approx(
        4 * (params - experts) + 4 * experts / 2, rel=1e-5)


# (three layers: one dense and two with experts make one list of layers, as Megatron-LM's stack)
TINY_DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3,
                 "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
                 "vocab_size": 256, "max_position_embeddings": 512, "q_lora_rank": 32,
                 "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                 "v_head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
                 "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                 "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}


def test_megatron_runs_latent_attention_context_parallel_by_ring_only(tmp_path, tiny_mixtral):
    """Transformer Engine's context parallelism refuses multi-head latent attention (keys 24
    wide here, values 16) with all-gather and all-to-all exchanges."""
    from planner.search.space import Space
    from planner.targets import restrict

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_DEEPSEEK))
    mla = planner.prepare(str(path), seq_len=256)
    cluster = planner.load_cluster("dgx-h100")
    assert Space.of(cluster, mla.blocks).latent and not Space.of(cluster, tiny_mixtral.blocks).latent

    def plan(fix, target):
        options = restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0), target)
        return planner.plan_prepared(mla, cluster, planner.TrainingSpec(global_batch=8,
                                                                        seq_len=256), options)
    # (a2a+p2p, which it also runs, needs cp ranks on more than one node)
    with pytest.raises(planner.SpecError, match=r"fix\.cp_comm: a2a with cp=2: .*latent .*"
                                                r"pin cp_comm=p2p$"):
        plan("cp=2,cp_comm=a2a", "megatron")
    # (16 heads on two nodes, cp=4 and tp left open: tp=4 leaves a2a+p2p two levels, so both
    # are named)
    path.write_text(json.dumps({**TINY_DEEPSEEK, "num_attention_heads": 16,
                                "num_key_value_heads": 16}))
    wide = planner.prepare(str(path), seq_len=256)
    with pytest.raises(planner.SpecError, match=r"fix\.cp_comm: a2a with cp=4: .*latent .*"
                                                r"pin cp_comm=p2p or a2a\+p2p$"):
        planner.plan_prepared(wide, planner.load_cluster("dgx-h100", nodes=2),
                              planner.TrainingSpec(global_batch=8, seq_len=256),
                              restrict(planner.SearchOptions(fix=parse_fix("cp=4,cp_comm=a2a"),
                                                             top_k=0), "megatron"))
    assert plan("cp=2", "megatron").parallel["cp_comm"] in ("p2p", "a2a+p2p")
    assert plan("cp=2,cp_comm=a2a", "any").parallel["cp_comm"] == "a2a"


def test_pins_the_cluster_cannot_take_fail_before_the_model_is_traced(monkeypatch):
    import planner.api

    def no_trace(*args, **kwargs):
        raise AssertionError("traced before checking the pins")
    monkeypatch.setattr(planner.api, "prepare", no_trace)
    for fix, words in (("cp=3", r"fix\.cp: 3 does not divide the cluster's 8 GPUs"),
                       ("dp=2,tp=2,pp=1", r"fix: dp x cp x tp x pp = 4"),
                       ("tp=4,pp=4", r"fix: tp x pp = 16 does not divide the cluster's 8 GPUs"),
                       ("micro_batch=16", r"fix\.micro_batch: 16 is larger than the global")):
        with pytest.raises(planner.SpecError, match=words):
            planner.plan("llama3-8b", cluster="dgx-h100", global_batch=8, seq_len=100, fix=fix)


def test_experts_wait_for_their_own_reduction_even_without_dense_replicas():
    """Under pipelining schedules the experts' gradients wait over their own replicas (edp),
    also when the dense weights have none to wait for (dp = 1)."""
    from costmodels.engine import engine_from_mapping
    from planner.options import Config
    from planner.search.costs import deferred_sync, expert_deferred_sync

    training = planner.TrainingSpec(global_batch=8, seq_len=256,
                                    engine=engine_from_mapping("torchtitan"))
    cfg = Config(dp=1, tp=8, pp=2, micro_batch=1, num_microbatches=8, schedule="1f1b",
                 recompute="none", zero=3, ep=2)
    assert cfg.edp == 4 and deferred_sync(cfg, training) == 0
    assert expert_deferred_sync(cfg, training) == 8
    alone = dataclasses.replace(cfg, ep=8)  # one replica of each expert: nothing to reduce
    assert alone.edp == 1 and expert_deferred_sync(alone, training) == 0


def test_an_expert_tensor_parallel_degree_beyond_a_node_asks_for_tp_too():
    from planner.search.feasibility import pin_problem
    from planner.search.space import Space

    space = Space(num_gpus=16, gpus_per_node=8, num_blocks=4, tp_divisors=(16,), experts=8,
                  heads=(16, 16))
    training = planner.TrainingSpec(global_batch=16, seq_len=256)
    assert pin_problem({"etp": 16}, space, training) == (
        "fix.etp: 16 must be 1 or tp, and the search keeps tp within a node of 8 GPUs; pin "
        "tp=16 too, or a smaller etp")
    assert pin_problem({"etp": 16, "tp": 16}, space, training) == ""
    # an ep that does not divide the experts, next to an etp no ep fits with: a hint still
    assert pin_problem({"ep": 3, "etp": 3}, space, training).endswith("use one of 1, 2, 4, 8")
    # an ep dividing six experts but not the 16 GPUs the experts spread over
    six = dataclasses.replace(space, experts=6)
    assert pin_problem({"ep": 3}, six, training) == (
        "fix.ep: ep x etp = 3 does not divide the cluster's 16 GPUs; use one of 1, 2")


@pytest.mark.parametrize("value_width,latent", [(16, True), (24, False)])
def test_eager_attention_cores_are_latent_when_their_values_are_narrower(value_width, latent):
    """An attention core written out (QK^T, softmax, scores x V) reads 24-wide queries; values
    16 wide make it latent attention, as the fused call's shapes do."""
    from planner.trace.annotate import _add_eager_heads
    from planner.trace.graph import Op

    def op(name, shape, inputs=()):
        return Op(name=name, kind="matmul", target="matmul", module="attn", inputs=list(inputs),
                  shape=list(shape), out_bytes=2.0 * math.prod(shape))
    ops = [op("q", (1, 4, 32, 24)), op("kt", (1, 4, 24, 32)), op("v", (1, 4, 32, value_width)),
           op("scores", (1, 4, 32, 32), ("q", "kt")), op("probs", (1, 4, 32, 32)),
           op("out", (1, 4, 32, value_width), ("probs", "v"))]
    by = {o.name: o for o in ops}
    acc = dict.fromkeys(("attn_kv_bytes", "attn_kv_calls", "attn_q_bytes", "attn_out_bytes",
                         "attn_heads_q", "attn_heads_kv", "attn_keys_wider"), 0.0)
    widths: dict = {}
    _add_eager_heads(by["scores"], by, True, acc, widths)
    _add_eager_heads(by["out"], by, False, acc, widths)
    assert acc["attn_keys_wider"] == (1.0 if latent else 0.0)
    assert acc["attn_heads_q"] == 4
    assert acc["attn_out_bytes"] == by["out"].out_bytes  # as wide as the values


def test_moe_settings_on_a_dense_model_are_named_as_unused(tiny_llama, tiny_mixtral, caplog):
    from costmodels.engine import engine_from_mapping

    engine = engine_from_mapping("megatron-core,moe_dispatcher=allgather,moe_imbalance=1.5")
    with caplog.at_level("WARNING", logger="planner"):
        _plan(tiny_llama, "tp=1,pp=1", engine=engine)
    assert "no routed experts; moe_dispatcher, moe_imbalance change nothing" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):
        _plan(tiny_mixtral, "tp=1,pp=1", engine=engine)
    assert "no routed experts" not in caplog.text and "moe_overlap" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):  # an overlap no dispatch here runs
        _plan(tiny_mixtral, "tp=1,pp=1", engine=engine_from_mapping(
            "megatron-core,moe_dispatcher=allgather,moe_overlap=true"))
    assert "engine.moe_overlap: the overlapped dispatch runs with the alltoall and deepep " \
        "dispatchers only" \
        in caplog.text


@pytest.mark.parametrize("form,cp", [("a2a", 2), ("allgather", 2), ("p2p", 4)])
def test_recomputing_the_attention_core_exchanges_keys_and_values_again(tiny_llama_config, form,
                                                                         cp):
    """Selective recomputation reruns the attention core, and the exchange is part of it (the
    rings and all-to-alls run inside the core): it repeats the forward exchange as full does."""
    long = planner.prepare(tiny_llama_config, seq_len=16384, cache_dir=None)
    cluster = planner.load_cluster("dgx-h100", nodes=1, gpus_per_node=cp)

    def exchange(recompute):
        fix = f"cp={cp},cp_comm={form},tp=1,pp=1,dp=1,micro_batch=1,recompute={recompute}"
        plan = planner.plan_prepared(long, cluster, planner.TrainingSpec(global_batch=2,
                                                                         seq_len=16384),
                                     planner.SearchOptions(fix=parse_fix(fix), top_k=0))
        return plan.predicted["breakdown"]["cp_comm_s"]
    none, selective = exchange("none"), exchange("selective")
    assert selective > none and selective == pytest.approx(exchange("full"))


@pytest.mark.parametrize("fix,engine,hidden", [
    ("recompute=none", "moe_overlap=true", True),
    ("recompute=full", "moe_overlap=true", False),  # Megatron-Core refuses it with full
    ("recompute=none", "moe_overlap=true,moe_dispatcher=allgather", False),  # alltoall only
    ("ep=1,etp=2,tp=2,dp=4,recompute=none", "moe_overlap=true", False),  # needs ep > 1
])
def test_the_overlapped_dispatch_applies_where_megatron_core_runs_it(tiny_mixtral, fix, engine,
                                                                    hidden):
    from costmodels.engine import engine_from_mapping
    pins = f"ep=8,dp=8,tp=1,pp=1,micro_batch=2,zero=1,{fix}"
    if fix.startswith("ep=1"):
        pins = f"pp=1,micro_batch=2,zero=1,sequence_parallel=true,{fix}"
    plain = _plan(tiny_mixtral, pins, engine=engine_from_mapping(engine.replace(
        "moe_overlap=true", "moe_overlap=false")))
    over = _plan(tiny_mixtral, pins, engine=engine_from_mapping(engine))
    exposed = [p.predicted["breakdown"]["ep_comm_s"] for p in (plain, over)]
    assert exposed[0] > 0 and (exposed[1] < exposed[0] if hidden else exposed[1] == exposed[0])


def test_megatron_places_tp_pp_dp_only_where_experts_and_attention_share_dp(tiny_mixtral):
    from planner import targets
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len)

    def plan(fix):
        options = targets.restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0),
                                   "megatron")
        return planner.plan_prepared(tiny_mixtral, planner.load_cluster("dgx-h100", nodes=2),
                                     training, options)
    assert plan("ep=2,tp=2,etp=1,pp=2,placement=tp-pp-dp").parallel["placement"] == "tp-pp-dp"
    with pytest.raises(planner.SpecError, match=r"ep x etp = tp x cp"):
        plan("ep=8,tp=1,pp=2,placement=tp-pp-dp")
    assert plan("ep=8,tp=1,pp=2").parallel["placement"] == "tp-dp-pp"


def test_deepspeed_plans_no_zero3_with_both_cp_and_ep(tiny_mixtral):
    """DeepSpeed's AutoEP refuses ZeRO stage 3 under (Ulysses) sequence parallelism."""
    from planner import targets
    with pytest.raises(planner.SpecError, match="does not run ZeRO-3 with both cp and ep"):
        targets.restrict(planner.SearchOptions(fix=parse_fix("cp=2,ep=2,zero=3")), "deepspeed")
    pins = "cp=2,ep=2,cp_comm=a2a,tp=1,pp=1,micro_batch=4,recompute=none"

    def plan(target, fix):
        options = targets.restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0), target)
        return planner.plan_prepared(tiny_mixtral, planner.load_cluster("dgx-h100", nodes=1),
                                     planner.TrainingSpec(global_batch=64,
                                                          seq_len=tiny_mixtral.seq_len), options)
    assert plan("any", pins + ",zero=3").parallel["zero"] == 3  # it fits: the rule rules it out
    assert plan("deepspeed", pins).parallel["zero"] in (0, 1, 2)
    # DeepSpeed runs no sequence parallelism, which routed experts with tp > 1 need: the pin
    # itself is named, not the rules that ruled out every configuration
    with pytest.raises(planner.SpecError, match=r"^fix\.tp: routed experts with tp=2 need "
                                                r"sequence parallelism .*; pin tp=1"):
        plan("deepspeed", "ep=2,tp=2")


def test_torchtitan_plans_context_parallelism_with_sharded_states_only(tiny_llama_config):
    """torchtitan turns FSDP on whenever cp > 1 (ParallelDims.fsdp_enabled)."""
    from planner import targets
    with pytest.raises(planner.SpecError, match="does not run ZeRO-0 with context parallelism"):
        targets.restrict(planner.SearchOptions(fix=parse_fix("cp=2,zero=0")), "torchtitan")
    long = planner.prepare(tiny_llama_config, seq_len=16384, cache_dir=None)
    options = targets.restrict(planner.SearchOptions(fix=parse_fix("cp=2"), top_k=0),
                               "torchtitan")
    plan = planner.plan_prepared(long, planner.load_cluster("dgx-h100", nodes=1),
                                 planner.TrainingSpec(global_batch=8, seq_len=16384), options)
    assert plan.parallel["cp"] == 2 and plan.parallel["zero"] in (2, 3)
    assert plan.parallel["cp_comm"] == "allgather"  # torchtitan's training all-gathers K/V


def test_whose_ring_runs_context_parallelism_changes_memory_and_backward(tiny_llama_config):
    """plan run's ring keeps every step's keys and values for backward (activations, unless the
    attention is recomputed); torch's passes fp32 gradients on around the ring, Transformer
    Engine's 16-bit ones."""
    from costmodels.engine import engine_from_mapping
    long = planner.prepare(tiny_llama_config, seq_len=16384, cache_dir=None)
    cluster = planner.load_cluster("dgx-h100", nodes=1, gpus_per_node=4)

    def plan(ring, recompute="none"):
        fix = f"cp=4,cp_comm=p2p,tp=1,pp=1,dp=1,micro_batch=1,recompute={recompute}"
        return planner.plan_prepared(
            long, cluster, planner.TrainingSpec(global_batch=2, seq_len=16384,
                                                engine=engine_from_mapping(f"cp_ring={ring}")),
            planner.SearchOptions(fix=parse_fix(fix), top_k=0))

    def act(p):
        return p.stages[0]["predicted"]["activation_bytes_per_microbatch"]
    kv = 16384 * 2 * 2 * 16 * 2 * 4  # tokens x (K, V) x kv heads x head dim x bf16 x 4 layers
    assert act(plan("runtime")) - act(plan("te")) == pytest.approx(kv * 3 / 4, rel=1e-3)
    assert act(plan("runtime", "selective")) == pytest.approx(act(plan("te", "selective")))
    with pytest.raises(planner.SpecError, match="engine.cp_ring: expected one of te, torch, runtime"):
        engine_from_mapping("cp_ring=ring")
    assert engine_from_mapping("torchtitan").cp_ring == "torch"


def test_an_exchange_form_pinned_without_cp_is_said_to_change_nothing(tiny_mixtral, caplog):
    """cp_comm pinned alone leaves the search free to keep cp=1, where it changes nothing: a
    warning says so and how to make the plan use it."""
    from planner.settings import idle_pins
    from planner.search.loop import rejection_lines

    with caplog.at_level("WARNING"):
        p = _plan(tiny_mixtral, "cp_comm=p2p,tp=1,pp=1,ep=1,dp=8")  # 8 GPUs: cp=1
    assert [r.message for r in caplog.records if "is not used" in r.message] == [
        "fix.cp_comm=p2p is not used: the plan chosen has no context parallelism (cp=1); pin cp "
        "too (e.g. cp=2,cp_comm=p2p) to make it use one"]
    assert idle_pins({"cp_comm": "a2a"}, 1) == [
        "fix.cp_comm=a2a is not used: the plan chosen has no context parallelism (cp=1); pin cp "
        "too (e.g. cp=2,cp_comm=a2a) to make it use one"]
    assert idle_pins({"cp_comm": "a2a"}, 2) == [] and p.parallel["cp"] == 1
    # a2a+p2p at cp=2 never has both levels: the example is one that can
    assert "cp=2" not in idle_pins({"cp_comm": "a2a+p2p"}, 1)[0]
    assert "whose ranks span nodes, more than one in each" in idle_pins({"cp_comm": "a2a+p2p"}, 1)[0]
    counts = {f"rule {i}": 10 - i for i in range(7)}
    assert rejection_lines(counts, most=5)[1] == ("rule 0: 10; rule 1: 9; rule 2: 8; rule 3: 7; "
                                                  "rule 4: 6; and 2 more")
    assert rejection_lines({"out of memory": 42}) == ("42 out of memory", "")


def test_the_leanest_plan_with_cp_pinned_shards_states_over_the_cp_ranks(tiny_llama):
    """When nothing fits, the leanest configuration honours the pins and shards the model states
    over dp x cp: context-parallel ranks hold the same weights (dp = 1 is no reason for ZeRO-0)."""
    from planner.search.costs import ModelArrays
    from planner.search.feasibility import leanest

    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    ma = ModelArrays.from_blocks(tiny_llama.blocks)
    for fix, zero in (("cp=8", 3), ("cp=8,zero=2", 2)):
        options = planner.SearchOptions(fix=parse_fix(fix), top_k=0)
        _, cfg, _ = leanest(ma, tiny_llama.blocks, cluster, training, options)
        assert (cfg.dp, cfg.cp, cfg.zero) == (1, 8, zero)
    # a target running fewer ZeRO stages with cp than without gets the largest it runs there
    options = planner.SearchOptions(fix=parse_fix("cp=8"), top_k=0, zero_with_cp=(0, 1, 2))
    assert leanest(ma, tiny_llama.blocks, cluster, training, options)[1].zero == 2
    # one replica (tp x pp over every GPU): a pinned ZeRO stage holds there too (ZeRO-0 with
    # the optimizer on the GPU, not ZeRO-1 with it offloaded)
    options = planner.SearchOptions(fix=parse_fix("dp=1,zero=0"), top_k=0)
    _, cfg, _ = leanest(ma, tiny_llama.blocks, cluster, training, options)
    assert (cfg.dp * cfg.cp, cfg.zero, cfg.offload_optimizer) == (1, 0, False)


def test_megatron_keeps_no_expert_output_for_the_routing_weights(tiny_mixtral):
    """Hugging Face's experts multiply their outputs by the routing weights, which keeps each
    copy's output (hidden wide) for the weights' gradient; Megatron-Core multiplies the weights
    into the activation before the last GEMM and keeps none of it. The trace finds those bytes,
    and only the fused (Megatron-Core) engine drops them."""
    from costmodels import memory
    from costmodels.engine import engine_from_mapping

    w = next(b.work for b in tiny_mixtral.blocks.blocks if b.work.num_experts)
    assert w.act_routed_weighted == 256 * 2 * 64 * 2  # copies x hidden x bf16, one MoE layer
    assert w.act_routed_weighted < w.act_routed_rep
    kw = dict(micro_batch=2, tp=1, sp=False, recompute="none", fused=True, routed_load=1.5)
    kept = memory.activation_bytes(w, **kw)
    assert kept - memory.activation_bytes(w, **kw, probs_in_activation=True) == pytest.approx(
        2 * 1.5 * w.act_routed_weighted)  # the busiest rank keeps more copies: more of these
    megatron = _plan(tiny_mixtral, "tp=1,pp=1,ep=2,dp=8,micro_batch=2,recompute=none")
    hf = _plan(tiny_mixtral, "tp=1,pp=1,ep=2,dp=8,micro_batch=2,recompute=none",
               engine=engine_from_mapping("megatron-core,moe_probs_in_activation=false"))
    act = [p.stages[0]["predicted"]["activation_bytes_per_microbatch"] for p in (megatron, hf)]
    layers = sum(b.work.num_experts > 0 for b in tiny_mixtral.blocks.blocks)
    assert act[1] - act[0] == pytest.approx(2 * layers * w.act_routed_weighted, rel=1e-4)


def test_torchtitan_plans_plain_data_parallelism_only_alone(tiny_llama, tiny_mixtral):
    """torchtitan 0.2.2's DDP refuses a mesh of more than one dimension ("DDP has not supported
    > 1D parallelism"): ZeRO-0 with data parallelism and tp, pp, cp or ep is not planned for it;
    alone, or with one replica, it is."""
    from planner import targets
    with pytest.raises(planner.SpecError, match="runs ZeRO-0 .* only without tensor"):
        targets.restrict(planner.SearchOptions(fix=parse_fix("dp=4,tp=2,zero=0")), "torchtitan")
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    # (with ep > 1, which torchtitan shards for, that is known from the pins)
    for model, fix, said in ((tiny_llama, "tp=2", "no configuration with"),
                             (tiny_mixtral, "ep=2,tp=1", "^fix.zero: torchtitan runs ZeRO-0")):
        options = targets.restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0),
                                   "torchtitan")
        with pytest.raises(planner.SpecError, match=said):
            planner.plan_prepared(model, cluster, planner.TrainingSpec(
                global_batch=64, seq_len=model.seq_len),
                dataclasses.replace(options, fix=parse_fix(fix + ",zero=0")))
    alone = planner.plan_prepared(tiny_llama, cluster, planner.TrainingSpec(
        global_batch=64, seq_len=tiny_llama.seq_len), targets.restrict(planner.SearchOptions(
            fix=parse_fix("dp=8,zero=0"), top_k=0), "torchtitan"))
    assert (alone.parallel["dp"], alone.parallel["zero"]) == (8, 0)


def test_deepspeed_keeps_stages_on_consecutive_ranks_with_experts(tiny_mixtral):
    """DeepSpeed's expert groups are consecutive ranks of a pipeline stage (utils/groups.py), so
    with a pipeline and ep > 1 it places pp outermost (tp-dp-pp); without experts either order."""
    from planner import targets
    with pytest.raises(planner.SpecError, match="fix.placement: deepspeed runs tp-pp-dp"):
        targets.restrict(planner.SearchOptions(fix=parse_fix(
            "pp=2,dp=2,ep=2,placement=tp-pp-dp")), "deepspeed")
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len)
    cluster = planner.load_cluster("dgx-h100", nodes=2)

    def plan(target, fix):
        options = targets.restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0), target)
        return planner.plan_prepared(tiny_mixtral, cluster, training, options)
    pins = "tp=1,pp=2,ep=8,zero=1,micro_batch=2"
    assert plan("any", pins + ",placement=tp-pp-dp").parallel["placement"] == "tp-pp-dp"
    assert plan("deepspeed", pins).parallel["placement"] == "tp-dp-pp"
    assert plan("deepspeed", "tp=1,pp=2,ep=1,zero=1,micro_batch=2,placement=tp-pp-dp"
                ).parallel["placement"] == "tp-pp-dp"  # no expert groups: no rule


def test_torchtitan_mesh_rules(tiny_llama, tiny_mixtral, tiny_llama_config, tmp_path):
    """torchtitan 0.2.2: pp outermost only; with ep = 1 its experts split over tp (etp = tp);
    without FSDP (dp x cp = 1) and with tp or pp it trains fp32, so a bf16 plan shards; the
    sequence divides by tp x 2 x cp."""
    from collections import Counter

    from planner import targets
    from planner.search.space import (AMP_UNSHARDED, EP_UNSHARDED, ETP_NO_EP, SEQ_TP_2CP, Space,
                                      enumerate_space)
    with pytest.raises(planner.SpecError, match="places pipeline stages outermost"):
        targets.restrict(planner.SearchOptions(fix=parse_fix("pp=2,dp=2,placement=tp-pp-dp")),
                         "torchtitan")
    targets.restrict(planner.SearchOptions(fix=parse_fix("placement=tp-pp-dp,pp=2,dp=1")),
                     "torchtitan")  # one replica: both orders are the same
    cluster = planner.load_cluster("dgx-h100", nodes=1)

    def search(model, fix, target="torchtitan", where=cluster, **training):
        options = targets.restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0), target)
        spec = planner.TrainingSpec(**{"global_batch": 64, "seq_len": model.seq_len, **training})
        return planner.plan_prepared(model, where, spec, options)
    assert search(tiny_mixtral, "tp=2,ep=1,pp=1").parallel["etp"] == 2
    assert search(tiny_mixtral, "tp=2,ep=1,pp=1,etp=1", target="any").parallel["etp"] == 1
    with pytest.raises(planner.SpecError, match=ETP_NO_EP.split(" (")[0]):
        search(tiny_mixtral, "tp=2,ep=1,pp=1,etp=1")
    assert search(tiny_llama, "tp=2,etp=1").parallel["tp"] == 2  # no experts: no such rule
    two = planner.load_cluster("dgx-h100", nodes=1, gpus_per_node=2)
    with pytest.raises(planner.SpecError, match=AMP_UNSHARDED):
        search(tiny_llama, "tp=2,dp=1", where=two)  # bf16 with tp and no FSDP
    llama32 = planner.prepare(tiny_llama_config, seq_len=tiny_llama.seq_len, dtype="fp32")
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    mixtral32 = planner.prepare(str(tmp_path / "config.json"), seq_len=256, dtype="fp32")
    assert search(llama32, "tp=2,dp=1", where=two, dtype="fp32").parallel["tp"] == 2
    assert search(tiny_llama, "tp=2,dp=1", where=two, target="any").parallel["tp"] == 2
    with pytest.raises(planner.SpecError, match=EP_UNSHARDED):  # no FSDP mesh for the experts
        search(mixtral32, "tp=2,dp=1,ep=2", where=two, dtype="fp32")
    options = targets.restrict(planner.SearchOptions(fix=parse_fix("tp=2,cp=1"), top_k=0),
                               "torchtitan")
    rejected = Counter()
    groups = list(enumerate_space(Space.of(cluster, tiny_llama.blocks, options),
                                  planner.TrainingSpec(global_batch=64, seq_len=258), options,
                                  rejected))
    assert not groups and rejected[SEQ_TP_2CP]  # 258 is not a multiple of 2 x 2


def test_pins_that_leave_no_configuration_are_bad_input(tiny_mixtral):
    """When the rules and the pins leave no configuration at all, memory is not the reason: the
    refusal is a SpecError (exit 2), not an InfeasibleError (exit 3)."""
    with pytest.raises(planner.SpecError, match=r"no configuration with dp=8,etp=2 is possible "
                                                r"on 8 GPUs \(.*etp is neither 1 nor tp.*relax"):
        _plan(tiny_mixtral, "dp=8,etp=2")


def test_fp8_keeps_the_experts_gemm_inputs_quantized(tiny_mixtral):
    """The routed experts' grouped GEMMs keep their activation operand as a Linear does (FP8:
    quantized, Transformer Engine's GroupedLinear), so the gathered token copies count among the
    GEMM inputs that FP8 halves."""
    from costmodels.memory import FP8_SAVED_INPUT_SHARE, activation_bytes
    w = next(b.work for b in tiny_mixtral.blocks.blocks if b.work.num_experts)
    assert w.act_routed_gathered > 0
    assert w.act_linear_in_rep >= w.act_routed_gathered  # the experts' first GEMM input is one
    kw = dict(micro_batch=1, tp=1, sp=False, recompute="none", scores_kept=False, fused=True)
    saved = activation_bytes(w, **kw) - activation_bytes(w, **kw, fp8=True)
    assert saved == pytest.approx(FP8_SAVED_INPUT_SHARE * (w.act_linear_in_rep + w.act_linear_in_tp))
    two = dict(kw, tp=2, sp=True, etp=2)  # etp's gathered copies are quantized too
    extra = activation_bytes(w, **two) - activation_bytes(w, **two, fp8=True)
    assert extra > FP8_SAVED_INPUT_SHARE * (w.act_linear_in_rep / 2 + w.act_linear_in_tp / 2)


def test_deepspeed_runs_no_tensor_parallelism_with_a_pipeline(tiny_llama):
    """DeepSpeed's AutoTP does not combine with its PipelineModule, and its checkpointing takes
    whole layers: --target deepspeed plans neither tp with pp nor selective recomputation."""
    from planner import targets
    from planner.search.space import TP_PP
    with pytest.raises(planner.SpecError, match="fix.tp: deepspeed does not run tensor"):
        targets.restrict(planner.SearchOptions(fix=parse_fix("tp=2,pp=2")), "deepspeed")
    with pytest.raises(planner.SpecError, match="fix.recompute: deepspeed does not offer "
                                                "selective"):
        targets.restrict(planner.SearchOptions(fix=parse_fix("recompute=selective")), "deepspeed")
    with pytest.raises(planner.SpecError, match="fix.zero: deepspeed does not run ZeRO-3 with a "
                                                "pipeline"):
        targets.restrict(planner.SearchOptions(fix=parse_fix("zero=3,pp=2")), "deepspeed")
    options = targets.restrict(planner.SearchOptions(fix=parse_fix("pp=2"), top_k=0), "deepspeed")
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    plan = planner.plan_prepared(tiny_llama, cluster, planner.TrainingSpec(
        global_batch=64, seq_len=tiny_llama.seq_len), options)
    assert plan.parallel["tp"] == 1 and plan.search["rejected"].get(TP_PP)


def test_ulysses_needs_the_sequence_divisible_by_cp_only():
    """DeepSpeed's Ulysses splits each sequence into cp contiguous shards (its all-to-all over
    heads balances causal attention), not into 2 x cp chunks: a sequence of 4100 tokens takes
    cp=4 there, not under Megatron-Core's load balancing."""
    from planner import targets
    from planner.search.feasibility import pin_problem
    from planner.search.space import Space
    space = Space(num_gpus=16, gpus_per_node=8, num_blocks=34, heads=(32, 8))
    training = planner.TrainingSpec(global_batch=64, seq_len=4100)
    for target, refused in (("deepspeed", False), ("megatron", True)):
        options = targets.restrict(planner.SearchOptions(fix=parse_fix("cp=4")), target)
        problem = pin_problem({"cp": 4}, space, training, options)
        assert bool(problem) == refused, (target, problem)
    assert "2 x cp = 8 equal chunks" in pin_problem({"cp": 4}, space, training, None)


def test_an_fp8_recipe_for_a_bf16_step_is_named_as_unused(tiny_llama, caplog):
    from costmodels.engine import engine_from_mapping

    with caplog.at_level("WARNING", logger="planner"):
        _plan(tiny_llama, "tp=1,pp=1", engine=engine_from_mapping("megatron-core,fp8_recipe=delayed"))
    assert "engine.fp8_recipe: delayed applies to --dtype fp8 only" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):
        _plan(tiny_llama, "tp=1,pp=1", engine=engine_from_mapping("megatron-core"))
    assert "fp8_recipe" not in caplog.text


def test_expert_settings_a_plan_does_not_use_are_named(tiny_mixtral, caplog):
    """A new-user check set moe_etp_replicated on a plan with etp=1 and fp8_experts=false under
    bf16, and neither was said to change nothing; a preset carrying them says nothing."""
    from costmodels.engine import engine_from_mapping

    for engine, said in (("megatron-core,moe_etp_replicated=true", "engine.moe_etp_replicated"),
                         ("megatron-core,fp8_experts=false", "engine.fp8_experts: applies to "
                                                             "--dtype fp8 only")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="planner"):
            p = _plan(tiny_mixtral, "tp=1,pp=1,ep=2", engine=engine_from_mapping(engine))
        assert p.parallel.get("etp", 1) == 1
        assert said in caplog.text, (engine, caplog.text)
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):
        _plan(tiny_mixtral, "tp=2,pp=1,ep=2,etp=2",
              engine=engine_from_mapping("megatron-core,moe_etp_replicated=true"))
        _plan(tiny_mixtral, "tp=1,pp=1,ep=2", engine=engine_from_mapping("torchtitan"))
        _plan(tiny_mixtral, "tp=1,pp=1,ep=2",
              engine=engine_from_mapping("megatron-core,moe_dispatcher=allgather"))
    assert "moe_etp_replicated" not in caplog.text and "fp8_experts" not in caplog.text
    assert "moe_dispatcher" not in caplog.text
    # a dispatcher given where the search chose no expert parallelism (a new-user check:
    # moe_dispatcher=deepep said nothing on a plan with ep=1), not said twice where ep=etp=1 pinned
    one = planner.load_cluster("dgx-h100", nodes=1, gpus_per_node=1)
    for pins, times in (("", 1), ("ep=1,etp=1", 1)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="planner"):
            p = planner.plan_prepared(tiny_mixtral, one, planner.TrainingSpec(
                global_batch=8, seq_len=tiny_mixtral.seq_len,
                engine=engine_from_mapping("megatron-core,moe_dispatcher=deepep")),
                planner.SearchOptions(fix=parse_fix(pins) if pins else {}, top_k=0))
        assert p.parallel.get("ep", 1) * p.parallel.get("etp", 1) == 1
        assert caplog.text.count("engine.moe_dispatcher:") == times, caplog.text


def test_the_leanest_plan_splits_a_long_sequence_when_cp_is_free(tiny_llama_config):
    """Context parallelism divides a long sequence's activations, so the leanest configuration
    (what 'no plan fits' reports, and what its more-nodes hint tries) may use it; before, it kept
    cp = 1 unless pinned and a long-context model was never said to fit on more nodes."""
    from planner.search.costs import ModelArrays
    from planner.search.feasibility import leanest

    long = planner.prepare(tiny_llama_config, seq_len=65536, cache_dir=None)
    cluster = planner.load_cluster("dgx-h100", nodes=2)
    training = planner.TrainingSpec(global_batch=1, seq_len=long.seq_len)
    ma = ModelArrays.from_blocks(long.blocks)
    free, cfg, _ = leanest(ma, long.blocks, cluster, training, planner.SearchOptions(top_k=0))
    one, _, _ = leanest(ma, long.blocks, cluster, training,
                        planner.SearchOptions(fix=parse_fix("cp=1"), top_k=0))
    assert cfg.cp > 1 and free < one


def test_the_leanest_plan_keeps_to_the_sequence_parallel_rule(tiny_llama_config):
    """A length tp does not divide rules out sequence parallelism (the search's SP_SEQ rule), so
    the leanest configuration 'no plan fits' reports does not use it there either."""
    from planner.search.costs import ModelArrays
    from planner.search.feasibility import leanest

    cluster = planner.load_cluster("dgx-h100")
    for seq, split in ((129, False), (128, True)):
        prepared = planner.prepare(tiny_llama_config, seq_len=seq, cache_dir=None)
        training = planner.TrainingSpec(global_batch=1, seq_len=seq)
        _, cfg, _ = leanest(ModelArrays.from_blocks(prepared.blocks), prepared.blocks, cluster,
                            training, planner.SearchOptions(fix=parse_fix("tp=2"), top_k=0))
        assert cfg.tp == 2 and cfg.sequence_parallel is split


def test_a_tp_pin_torchtitan_cannot_run_at_this_sequence_length_is_named(tiny_llama_config):
    """torchtitan asserts seq_len % (tp x 2 x cp) == 0 even with cp = 1: a pinned tp that breaks
    it is refused naming the pin and the tp that works (before: a count of the search's rules)."""
    from planner import targets

    odd = planner.prepare(tiny_llama_config, seq_len=130, cache_dir=None)  # 2 x 65
    training = planner.TrainingSpec(global_batch=8, seq_len=odd.seq_len)
    options = targets.restrict(planner.SearchOptions(fix=parse_fix("tp=2"), top_k=0),
                               "torchtitan")
    with pytest.raises(planner.SpecError, match=r"^fix.tp: the target needs the sequence length "
                                                r"\(130\) divisible by tp x 2 x cp = 4; use tp=1, "
                                                r"or a sequence length divisible by 4$"):
        planner.plan_prepared(odd, planner.load_cluster("dgx-h100", nodes=1), training, options)


def test_the_leanest_plan_keeps_to_the_meshes_the_target_runs(tiny_llama_config):
    """'No plan fits' and its more-nodes hint name a layout the target can run: under torchtitan
    the sequence must split by tp x 2 x cp (before, the leanest could break it and the hint then
    sent the user to a cluster where the search refused every layout)."""
    from planner import targets
    from planner.search.costs import ModelArrays
    from planner.search.feasibility import leanest, pin_problem
    from planner.search.space import Space

    long = planner.prepare(tiny_llama_config, seq_len=65544, cache_dir=None)  # 8 x 8193
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = planner.TrainingSpec(global_batch=1, seq_len=long.seq_len)
    options = targets.restrict(planner.SearchOptions(top_k=0), "torchtitan")
    _, cfg, _ = leanest(ModelArrays.from_blocks(long.blocks), long.blocks, cluster, training,
                        options)
    assert long.seq_len % (2 * cfg.tp * cfg.cp) == 0
    # an odd length splits for no tp: the pin given is named, not another
    odd = planner.TrainingSpec(global_batch=1, seq_len=4095)
    space = Space.of(cluster, long.blocks, options)
    assert pin_problem({"tp": 2}, space, odd, options).startswith(
        "fix.tp: the target needs the sequence length (4095) divisible by tp x 2 x cp, which an "
        "odd length never is")


@pytest.mark.parametrize("model,fix,seq,words", [
    ("deepseek-v3", "ep=3", None, r"^fix\.ep: 3 does not divide the model's 256 experts"),
    ("mixtral-8x7b", "cp=2", 4001, r"^fix\.cp: the sequence of 4001 tokens does not split into "
                                   r"2 x cp = 4 equal chunks"),
    ("qwen3-30b-a3b", "cp=3", None, r"^fix\.cp: the sequence of 4096 tokens does not split"),
])
def test_a_zoo_models_pins_are_checked_before_it_is_traced(monkeypatch, model, fix, seq, words):
    """Its published dimensions (experts, default sequence) rule a pin out at once, not after a
    trace of half a minute (DeepSeek-V3)."""
    from planner import api

    def no_trace(*args, **kwargs):
        raise AssertionError("traced before the pins were checked")

    monkeypatch.setattr(api, "prepare", no_trace)
    with pytest.raises(planner.SpecError, match=words):
        planner.plan(model, cluster="dgx-h100", nodes=3, global_batch=240, seq_len=seq, fix=fix)
    # a sequence beyond the model's learned positions is the trace's to name (gpt2: 1024)
    with pytest.raises(AssertionError, match="traced before"):
        planner.plan("gpt2", cluster="dgx-h100", global_batch=8, seq_len=1026, fix="cp=2")


def test_plan_prepared_searches_what_its_target_runs(tiny_mixtral):
    """SearchOptions(target=...) narrows the search in plan_prepared as planner.plan does: the
    plan names the target, so its schedule must be one the engine runs."""
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len)
    for target in ("deepspeed", "torchtitan"):
        options = planner.SearchOptions(fix={"pp": 2}, top_k=0, target=target)
        p = planner.plan_prepared(tiny_mixtral, cluster, training, options)
        assert p.search["target"] == target
        assert p.parallel["schedule"] in planner.targets.engine(target).schedules
    with pytest.raises(planner.SpecError, match="fix.schedule: deepspeed does not run zb-h1"):
        planner.plan_prepared(tiny_mixtral, cluster, training, planner.SearchOptions(
            fix={"pp": 2, "schedule": "zb-h1"}, target="deepspeed"))


def test_megatron_plans_megatron_fsdp_without_a_pipeline_and_offloads_adam_only(tiny_mixtral):
    """Megatron-FSDP (ZeRO-2/3) lays the world out without pipeline stages, and optimizer
    offload needs its precision-aware optimizer, adam only: the target searches neither, and
    refuses a pin of either naming the fix."""
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    for optimizer in ("adam", "sgd"):
        training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len,
                                        optimizer=optimizer)
        p = planner.plan_prepared(tiny_mixtral, cluster, training, planner.SearchOptions(
            fix={"pp": 2}, top_k=30, target="megatron"))
        found = [p.parallel] + [a["parallel"] for a in p.search["alternatives"]]
        assert len(found) > 10 and all(c["zero"] <= 1 for c in found)
        if optimizer == "sgd":
            assert not any(c.get("offload_optimizer") for c in found)
            with pytest.raises(planner.SpecError, match=r"^fix.offload_optimizer: megatron "
                                                        r"offloads adam and adamw only, not sgd"):
                planner.plan_prepared(tiny_mixtral, cluster, training, planner.SearchOptions(
                    fix={"offload_optimizer": True}, target="megatron"))
    with pytest.raises(planner.SpecError, match=r"^fix.zero: megatron does not run ZeRO-3 with a "
                                                r"pipeline; it offers 0, 1 there"):
        planner.plan_prepared(tiny_mixtral, cluster, training, planner.SearchOptions(
            fix={"pp": 2, "zero": 3}, target="megatron"))


def test_an_imbalance_beyond_what_top_k_routing_reaches_is_refused(tiny_mixtral):
    """8 experts with top-2: the busiest expert takes at most a copy of every token, 4 x the
    mean; 4 plans, more is bad input naming the bound."""
    from costmodels.engine import engine_from_mapping

    even = _plan(tiny_mixtral, "ep=2", engine=engine_from_mapping("moe_imbalance=1"))
    busy = _plan(tiny_mixtral, "ep=2", engine=engine_from_mapping("moe_imbalance=4"))
    assert busy.parallel["ep"] == 2
    assert busy.predicted["step_time_s"] > even.predicted["step_time_s"]
    with pytest.raises(planner.SpecError, match=r"^engine\.moe_imbalance: 4\.5 is more than .* "
                                                r"8 experts, top-2, .* give at most 4$"):
        _plan(tiny_mixtral, "ep=2", engine=engine_from_mapping("moe_imbalance=4.5"))
    # a zoo model's published experts and top-k: refused before it is traced
    with pytest.raises(planner.SpecError, match=r"^engine\.moe_imbalance: 40 is more than "
                                                r"deepseek-v3's routing allows: 256 experts, top-8"):
        planner.plan("deepseek-v3", cluster="dgx-h100", global_batch=64, cache_dir=None,
                     engine="moe_imbalance=40", fix="tp=3")  # (were it traced, the pin fails)


def test_a_target_refuses_moe_settings_its_engine_does_not_run(tiny_mixtral):
    """A capacity factor, the allgather dispatcher or the overlapped all-to-all under a target
    whose MoE has none is bad input naming the setting, in plan_prepared and before tracing in
    planner.plan; the same settings plan with Megatron-LM (it runs all three)."""
    from costmodels.engine import engine_from_mapping

    cluster = planner.load_cluster("dgx-h100", nodes=1)
    refused = {"moe_capacity_factor=1.0": {"torch", "torchtitan", "deepspeed"},
               "moe_dispatcher=allgather": {"torch", "torchtitan", "deepspeed"},
               "moe_overlap=true": {"torch", "torchtitan", "deepspeed"}}
    for setting, targets in refused.items():
        training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len,
                                        engine=engine_from_mapping(setting))
        for target in ("torch", "torchtitan", "deepspeed", "megatron"):
            options = planner.SearchOptions(fix={"ep": 2, "pp": 1}, top_k=0, target=target)
            if target in targets:
                key = setting.split("=")[0]
                with pytest.raises(planner.SpecError, match=rf"^engine\.{key}: .*--target any"):
                    planner.plan_prepared(tiny_mixtral, cluster, training, options)
            else:
                assert planner.plan_prepared(tiny_mixtral, cluster, training,
                                             options).parallel["ep"] == 2
    # a zoo MoE model: refused before it is traced
    with pytest.raises(planner.SpecError, match="engine.moe_capacity_factor: torchtitan's MoE"):
        planner.plan("mixtral-8x7b", cluster="dgx-h100", global_batch=64, target="torchtitan",
                     engine="torchtitan,moe_capacity_factor=1.25", cache_dir=None,
                     fix="tp=16")  # (were it traced, this pin would fail after)


def test_moe_settings_a_target_lacks_change_nothing_for_a_dense_model(tiny_llama, caplog):
    from costmodels.engine import engine_from_mapping

    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_llama.seq_len,
                                    engine=engine_from_mapping("torchtitan,moe_capacity_factor=1"))
    with caplog.at_level("WARNING"):
        p = planner.plan_prepared(tiny_llama, planner.load_cluster("dgx-h100"), training,
                                  planner.SearchOptions(top_k=0, target="torchtitan"))
    assert p.search["target"] == "torchtitan"
    assert any("has no routed experts" in r.message for r in caplog.records)


@pytest.mark.parametrize("engine,dtype,said", [
    ("megatron-core,fp8_experts=false", "fp8", "fp8_experts"),
    ("megatron-core,moe_bias_loop=false", "bf16", "moe_bias_loop"),
    ("torchtitan,moe_probs_in_activation=false", "bf16", "moe_probs_in_activation"),
    ("megatron-core", "fp8", None),  # the preset's own: nothing given
    ("torchtitan", "bf16", None),
])
def test_a_presets_moe_property_given_for_a_dense_model_is_said(tiny_llama, caplog, engine,
                                                                dtype, said):
    """A new-user check gave fp8_experts to a dense fp8 plan and heard nothing: the MoE settings a
    preset carries are said when given otherwise, not when the preset sets them."""
    from costmodels.engine import engine_from_mapping

    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_llama.seq_len, dtype=dtype,
                                    engine=engine_from_mapping(engine))
    caplog.clear()
    with caplog.at_level("WARNING"):
        planner.plan_prepared(tiny_llama, planner.load_cluster("dgx-b200"), training,
                              planner.SearchOptions(top_k=0))
    notes = [r.message for r in caplog.records if "has no routed experts" in r.message]
    assert notes == ([] if said is None else
                     [f"engine.{said}: {tiny_llama.info['name']} has no routed experts; {said} "
                      "changes nothing here"])


def test_a_target_narrows_the_callers_search_options_without_replacing_them():
    from planner import targets
    mine = planner.SearchOptions(recompute=("none",))
    assert targets.restrict(mine, "any").recompute == ("none",)
    assert targets.restrict(mine, "torchtitan").recompute == ("none",)
    # nothing chosen: the target's own forms (torchtitan's per-op policy), the same when restricted
    # again (planner.plan, then plan_prepared)
    once = targets.restrict(planner.SearchOptions(), "torchtitan")
    assert "op" in once.recompute and targets.restrict(once, "torchtitan") == once
    with pytest.raises(planner.SpecError, match=r"^schedules: deepspeed runs 1f1b, none of the "
                                                 r"SearchOptions.schedules given \(gpipe\)"):
        targets.restrict(planner.SearchOptions(schedules=("gpipe",)), "deepspeed")


def test_the_allgather_dispatcher_holds_the_groups_tokens_while_a_layer_runs(tiny_mixtral):
    """MoEAllGatherTokenDispatcher gathers every token of the ep group before it keeps its
    experts' copies: one layer's gathered hidden states (ep x the rank's tokens) are working
    memory the alltoall dispatcher does not need."""
    fix = "ep=4,tp=1,pp=1,zero=0,micro_batch=2,recompute=none"
    from costmodels.engine import engine_from_mapping

    a2a, gathered = (_plan(tiny_mixtral, fix, engine=engine_from_mapping(
        f"megatron-core,moe_dispatcher={d}")) for d in ("alltoall", "allgather"))
    layer = next(b.work for b in tiny_mixtral.blocks.blocks if b.work.num_experts)
    tokens = 2 * 256 * layer.dispatch_bytes / layer.routed_tokens  # hidden states, bf16
    assert tokens == 2 * 256 * 64 * 2
    work = [p.stages[0]["predicted"]["memory_bytes"]["working"] for p in (a2a, gathered)]
    assert work[1] - work[0] == pytest.approx(4 * tokens, rel=1e-4)  # (plans keep 6 digits)


@pytest.mark.parametrize("form", ["p2p", "a2a"])
def test_each_attention_layer_of_a_block_exchanges_its_own_keys_and_values(form):
    """A small model traced as one block of two attention layers pays each layer's exchange, its
    latency and synchronisation included, as the same layers in two blocks do."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, d=64, heads=8):
            super().__init__()
            self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2)
                       for y in self.qkv(x).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.out(y.transpose(1, 2).reshape(b, t, d))

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Attention(), Attention()

        def forward(self, x):
            return self.b(self.a(x))

    class Net(nn.Module):
        def __init__(self, together):
            super().__init__()
            self.emb, self.head = nn.Embedding(256, 64), nn.Linear(64, 256)
            self.layers = nn.ModuleList([Pair()] if together else [Attention(), Attention()])

        def forward(self, ids):
            x = self.emb(ids)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = planner.TrainingSpec(global_batch=8, seq_len=1024, dtype="bf16")
    cp_s = {}
    for together in (True, False):
        with torch.device("meta"):
            net, ids = Net(together), torch.zeros(1, 1024, dtype=torch.long)
        prepared = planner.prepare(net, example_inputs=(ids,), dtype="bf16", cache_dir=None)
        calls = [b.work.attn_kv_calls for b in prepared.blocks.blocks if b.work.attn_kv_bytes]
        assert calls == ([2.0] if together else [1.0, 1.0])
        p = planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
            fix={"cp": 8, "cp_comm": form, "tp": 1, "pp": 1, "recompute": "none"}, top_k=0))
        cp_s[together] = p.predicted["breakdown"]["cp_comm_s"]
    assert cp_s[True] > 0 and cp_s[True] == pytest.approx(cp_s[False], rel=1e-6)


def test_deepspeed_runs_deepep_without_tensor_parallelism(tiny_mixtral):
    """DeepSpeed 0.19.8's AutoEP takes comm_backend deepep, but not with AutoTP's folded tensor
    parallelism (auto_ep_layer.py): the target pairs ep > 1 with tp 1 only under DeepEP."""
    from planner import targets
    from planner.search.space import EP_TP
    cluster = planner.load_cluster("dgx-h100", nodes=1)

    def search(fix, dispatcher):
        training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len,
                                        engine=f"deepspeed,moe_dispatcher={dispatcher}")
        options = targets.restrict(planner.SearchOptions(fix=parse_fix(fix), top_k=0),
                                   "deepspeed")
        return planner.plan_prepared(tiny_mixtral, cluster, training, options)
    with pytest.raises(planner.SpecError, match=r"^fix.tp: deepspeed runs DeepEP without tensor "
                                                r"parallelism"):
        search("tp=2,ep=2", "deepep")
    plan = search("ep=2,pp=1", "deepep")
    assert plan.parallel["tp"] == 1 and plan.parallel["ep"] == 2
    assert plan.search["rejected"].get(EP_TP, 0) > 0
    assert EP_TP not in search("ep=2,pp=1", "alltoall").search["rejected"]
    # AutoEP's DeepEP dispatches bfloat16 rows only
    fp16 = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len, dtype="fp16",
                                engine="deepspeed,moe_dispatcher=deepep")
    with pytest.raises(planner.SpecError, match=r"^engine.moe_dispatcher: deepspeed runs DeepEP "
                                                r"in bf16 or fp8 only, not fp16"):
        planner.plan_prepared(tiny_mixtral, cluster, fp16, targets.restrict(
            planner.SearchOptions(top_k=0), "deepspeed"))


def test_the_moe_layers_wait_for_the_host_is_told_apart_from_compute(tiny_mixtral):
    """The MoE layers' host issue time is priced inside compute; the plan says how much of the
    step it makes (a new-user check found 60% of a step labelled compute), and a plan priced
    without it says nothing."""
    from costmodels.engine import engine_from_mapping
    from planner.report.summary import summary

    fix = "ep=4,tp=1,pp=1,zero=1,micro_batch=1"
    plan = _plan(tiny_mixtral, fix)
    free = _plan(tiny_mixtral, fix, engine=engine_from_mapping("megatron-core,moe_host_op_s=0"))
    wait = plan.predicted["moe_host_wait_s"]
    assert wait == pytest.approx(plan.predicted["step_time_s"] - free.predicted["step_time_s"],
                                 rel=1e-4)  # (plans keep six significant digits)
    assert 0 < wait < plan.predicted["breakdown"]["compute_s"]
    assert "MoE layers waiting for the host to issue their many small ops make" in summary(plan)
    assert "moe_host_wait_s" not in free.predicted and "waiting for the host" not in summary(free)


def test_torchtitan_op_checkpointing_with_ep_only_where_its_model_saves_the_all_to_alls(
        tiny_mixtral):
    """torchtitan's op-level checkpointing keeps the all-to-alls' outputs in its deepseek_v3,
    gpt_oss and llama4 only; elsewhere backward replays them, which the pricing does not, so the
    search leaves op with ep > 1 out for its other models (a new-user check: a Qwen3 plan for
    torchtitan picked it, and its export said it would run slower than planned)."""
    from planner import targets

    assert tiny_mixtral.info["model_type"] not in targets.engine("torchtitan").op_saves_all_to_all
    from costmodels.engine import engine_from_mapping
    eng = engine_from_mapping("torchtitan")
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_mixtral.seq_len, engine=eng)
    cluster = planner.load_cluster("dgx-h100", nodes=1)

    def plan(fix, target="torchtitan"):
        return planner.plan_prepared(tiny_mixtral, cluster, training, planner.SearchOptions(
            fix=parse_fix(fix), top_k=0, target=target), warn_default_engine=False)

    with pytest.raises(planner.SpecError, match="recompute op with ep > 1 replays"):
        plan("recompute=op,ep=2")
    assert plan("recompute=op,ep=1").parallel["recompute"] == "op"
    assert plan("recompute=op,ep=2", target="any").parallel["ep"] == 2  # priced as it saves them


def test_the_leanest_plan_with_ep_pinned_folds_the_experts_into_a_stage(tiny_mixtral):
    """A pinned ep the leanest configuration names must fold into its stages' tp x cp x dp GPUs:
    a deep pipeline that leaves each stage fewer GPUs than ep is skipped (before, 'no plan fits'
    named dp=1 pp=8 ep=8 on 8 GPUs, which the search refuses, and priced its experts as split
    over 8 ranks)."""
    from planner.search.costs import ModelArrays
    from planner.search.feasibility import leanest

    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_mixtral.seq_len)
    ma = ModelArrays.from_blocks(tiny_mixtral.blocks)
    for pins in ("ep=4", "ep=2,etp=2"):
        options = planner.SearchOptions(fix=parse_fix(pins), top_k=0)
        _, cfg, _ = leanest(ma, tiny_mixtral.blocks, cluster, training, options)
        assert (cfg.tp * cfg.cp * cfg.dp) % (cfg.ep * cfg.etp) == 0, cfg.short()
        assert cfg.ep == options.fix["ep"]


def test_a_cp_pin_the_causal_chunks_refuse_names_ulysses_shards():
    """A new-user check pinned cp=8 with a2a at 131,000 tokens under --engine deepspeed and was
    refused for 16 causal chunks with no word that --target deepspeed (Ulysses: cp shards) takes
    it."""
    from planner.search.feasibility import sequence_pin_problem

    said = sequence_pin_problem({"cp": 8, "cp_comm": "a2a"}, 131000, 64)
    assert said.startswith("fix.cp: the sequence of 131000 tokens does not split into 2 x cp = "
                           "16 equal chunks (causal load balancing)")
    assert said.endswith("(DeepSpeed's Ulysses cuts it into cp = 8 shards: --target deepspeed "
                         "plans within its rules)")
    assert "Ulysses" not in sequence_pin_problem({"cp": 8, "cp_comm": "p2p"}, 131000, 64)
    assert "Ulysses" not in sequence_pin_problem({"cp": 16}, 131000, 64)  # 131000 % 16
    assert "Ulysses" not in sequence_pin_problem({"cp": 8, "tp": 2}, 131000, 64)  # dp x cp only
