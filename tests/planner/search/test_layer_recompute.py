"""``recompute="full/k"``: every k-th layer recomputed whole, the others kept (torchtitan's
layer-frequency checkpointing; Megatron-LM's block method with as many layers per chunk)."""

import dataclasses

import numpy as np
import pytest

import planner
from costmodels import memory
from costmodels.experts import overlap_blockers
from costmodels.engine import engine_from_mapping
from planner.export import export
from planner.options import parse_fix
from planner.report.summary import summary
from planner.search import pricing
from planner.search.evaluate import LAYER_INTERVAL_SPLIT
from planner.search.costs import ModelArrays, block_costs
from tests.conftest import TINY_LLAMA, write_config


def test_every_kth_layer_counted_from_the_first_as_torchtitan_wraps_them():
    ckpt = [False, True, True, True, True, True, False]  # embedding, 5 layers, head
    assert memory.layer_policies(ckpt, "full/2") == [
        "none", "none", "full", "none", "full", "none", "none"]
    assert memory.layer_policies(ckpt, "full/4") == ["none"] * 4 + ["full"] + ["none"] * 2
    assert memory.layer_policies(ckpt, "selective") == ["none"] + ["selective"] * 5 + ["none"]
    assert (memory.layer_interval("full/4"), memory.layer_interval("full"),
            memory.layer_interval("none")) == (4, 0, 0)
    assert [memory.every_words(k) for k in (2, 3, 4, 11, 21)] == [
        "every 2nd layer", "every 3rd layer", "every 4th layer", "every 11th layer",
        "every 21st layer"]


def test_recomputed_layers_cost_as_under_full_and_the_others_as_under_none(tiny_llama):
    ma = ModelArrays.from_blocks(tiny_llama.blocks)
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    knobs = dict(tp=2, sp=True, micro_batch=2)
    part, full, none = (block_costs(ma, cluster, training, recompute=rc, **knobs)
                        for rc in ("full/2", "full", "none"))
    mask = ma.recomputed("full/2")
    assert mask.sum() == 2 and list(mask) == [p == "full" for p in memory.layer_policies(
        ma.checkpointed, "full/2")]
    for name in ("compute_s", "recompute_s", "tp_comm_s", "act_bytes", "work_bytes", "fwd_s"):
        a, f, n = getattr(part, name), getattr(full, name), getattr(none, name)
        np.testing.assert_array_equal(a[mask], f[mask])
        np.testing.assert_array_equal(a[~mask], n[~mask])
    assert np.all(part.recompute_s[mask] > 0) and np.all(part.recompute_s[~mask] == 0)
    assert none.act_bytes.sum() > part.act_bytes.sum() > full.act_bytes.sum()
    # the FLOPs the step recomputes: the forward of the two layers recomputed, half of full's
    cfg = planner.Config(dp=1, tp=2, pp=1, micro_batch=2, num_microbatches=4, schedule="1f1b",
                         recompute="full/2", zero=0, sequence_parallel=True)
    model, hardware = pricing.step_flops(ma, cfg, training)
    _, hardware_full = pricing.step_flops(ma, dataclasses.replace(cfg, recompute="full"),
                                          training)
    assert hardware - model == pytest.approx((hardware_full - model) / 2)


def test_any_full_recomputation_keeps_megatron_cores_overlapped_dispatch_off():
    engine = engine_from_mapping({"moe_dispatcher": "alltoall"})
    for rc in ("full", "full/2", "full/4"):
        assert "no full recomputation" in overlap_blockers(engine, ep=8, recompute=rc,
                                                           dtype="bf16", pp=2, vpp=2)
    assert not overlap_blockers(engine, ep=8, recompute="none", dtype="bf16", pp=2, vpp=2)


def test_full4_on_four_layers_recomputes_the_fourth(tiny_llama):
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    layers = sum(b.recompute for b in tiny_llama.blocks.blocks)
    assert layers == 4
    plan = planner.plan_prepared(tiny_llama, cluster, training, planner.SearchOptions(
        fix=parse_fix("recompute=full/4,tp=1,pp=1"), top_k=0))
    assert plan.parallel["recompute"] == "full/4"
    assert plan.recomputed_blocks() == ["model.layers.3"]
    assert "recompute full/4 (every 4th layer whole), ZeRO-" in summary(plan)


def test_a_model_of_fewer_layers_than_the_interval_is_refused_naming_the_fix(tmp_path):
    two = planner.prepare(write_config(tmp_path, {**TINY_LLAMA, "num_hidden_layers": 2}),
                          seq_len=64, cache_dir=None)
    training = planner.TrainingSpec(global_batch=8, seq_len=64)
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    with pytest.raises(planner.SpecError, match=r"^fix.recompute: full/4 recomputes every 4th "
                                                r"layer, and the model has 2 layers; pin none, "
                                                r"full or full/2$"):
        planner.plan_prepared(two, cluster, training,
                              planner.SearchOptions(fix=parse_fix("recompute=full/4")))
    free = planner.plan_prepared(two, cluster, training, planner.SearchOptions(top_k=0))
    assert free.parallel["recompute"] != "full/4"


@pytest.fixture(scope="module")
def every_2nd(tiny_llama):
    """Tiny Llama (4 layers) on two pipeline stages, every 2nd layer recomputed."""
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    return planner.plan_prepared(tiny_llama, cluster, training, planner.SearchOptions(
        fix=parse_fix("recompute=full/2,pp=2,tp=1,vpp=1,schedule=1f1b"), top_k=0))


def test_the_exports_write_each_engines_form(every_2nd):
    assert every_2nd.recomputed_blocks() == ["model.layers.1", "model.layers.3"]
    counts = [sum(b in every_2nd.recomputed_blocks() for b in st["blocks"])
              for st in every_2nd.stages]
    assert counts == [1, 1]  # one of each stage's two layers
    text = " ".join(export(every_2nd, "megatron", "core_v0.19.0")[0].split())
    assert ("--recompute-granularity full --recompute-method block --recompute-num-layers 1"
            in text)
    toml = export(every_2nd, "torchtitan")[0]
    assert 'mode = "selective"' in toml and 'selective_ac_option = "2"' in toml
    ds = export(every_2nd, "deepspeed")[0]
    assert "recompute full/2 (every 2nd layer, the others kept): DeepSpeed checkpoints whole" in ds


def test_megatron_takes_one_count_for_every_chunk_and_says_where_chunks_differ(tiny_llama):
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    plan = planner.plan_prepared(tiny_llama, cluster, training, planner.SearchOptions(
        fix=parse_fix("recompute=full/2,pp=4,tp=1,vpp=1,schedule=1f1b"), top_k=0))
    counts = [sum(b in plan.recomputed_blocks() for b in st["blocks"]) for st in plan.stages]
    assert sorted(counts) == [0, 0, 1, 1]
    text = " ".join(export(plan, "megatron", "core_v0.19.0")[0].replace("#", " ").split())
    assert "--recompute-method block --recompute-num-layers 1" in text
    assert ("the plan recomputes 0 to 1 layers per chunk, and Megatron-LM one count for every "
            "chunk; --recompute-num-layers 1 recomputes more than planned on 2 of the 4 chunks"
            in text)
    # torchtitan wraps every 2nd layer of a rank's own: none of one layer each, where the plan
    # recomputes 1 on two ranks, which then keep more activations than planned
    toml = " ".join(export(plan, "torchtitan")[0].replace("#", " ").split())
    assert ("so 2 of the 4 ranks recompute another number of layers than planned" in toml
            and "2 of them keep more activations than planned, which is not re-checked" in toml
            and "--target torchtitan` plans a split torchtitan recomputes as priced" in toml)


def test_llama3_405b_as_meta_ran_it_recomputes_every_2nd_layer_faster_than_every_layer():
    """Meta's layout (tp 8, pp 16, no context parallelism) on 16,384 H100 at 8,192 tokens: no
    recomputation fits 85.5 GB only at ZeRO-2 (7.31 s), full recomputation pays the whole forward
    again (7.31 s); every 2nd layer sits between. Megatron-LM's block method would recompute the
    first layer of every chunk, the first chunk's layer 0 too: --target megatron keeps full."""
    fix = "tp=8,pp=16,cp=1"
    kw = dict(cluster="dgx-h100", nodes=2048, global_batch=2048, seq_len=8192)
    free = planner.plan("llama3-405b", fix=parse_fix(fix), top_k=0, **kw)
    full = planner.plan("llama3-405b", fix=parse_fix(fix + ",recompute=full"), top_k=0, **kw)
    assert free.parallel["recompute"] == "full/2"
    assert free.step_time_s < 0.97 * full.step_time_s
    assert "megatron (recompute)" in summary(free)
    megatron = planner.plan("llama3-405b", fix=parse_fix(fix), top_k=0, target="megatron", **kw)
    assert megatron.parallel["recompute"] == "full"
    assert megatron.search["rejected"][LAYER_INTERVAL_SPLIT] > 0


def test_each_engines_layers_on_a_split_and_the_forward_share_of_the_collectives():
    from costmodels.pipeline import forward_comm_share
    from planner.targets import layer_interval_refusal
    # 4 chunks on 2 ranks, 2 layers each, every 2nd recomputed: one per chunk, as both run it
    assert layer_interval_refusal("megatron", 2, [1, 1, 1, 1], [2, 2, 2, 2], 2) == ""
    assert layer_interval_refusal("torchtitan", 2, [1, 1, 1, 1], [2, 2, 2, 2], 2) == ""
    # a first chunk of layer 0 alone: Megatron-LM recomputes it too (the first N of each)
    assert "first --recompute-num-layers" in layer_interval_refusal(
        "megatron", 2, [0, 1, 1, 1], [1, 2, 2, 2], 2)
    # torchtitan counts a rank's own layers: 3 on rank 0 -> 1 wrapped, where 2 are planned
    assert "1 on rank 0, where this split recomputes 2" in layer_interval_refusal(
        "torchtitan", 2, [1, 1, 1, 1], [1, 2, 2, 2], 2)
    assert layer_interval_refusal("torch", 2, [0, 1], [1, 2], 2) == ""
    # a group of k layers runs its collectives in 2k + 1 passes, k of them forwards
    assert [forward_comm_share(r) for r in ("none", "full/2", "full/4", "full")] == \
        pytest.approx([1 / 2, 2 / 5, 4 / 9, 1 / 3])


def test_torchtitan_030_has_no_layer_frequency_and_takes_full(every_2nd):
    text = export(every_2nd, "torchtitan", "0.3.0")[0]
    assert "activation-checkpoint:full" in text and "activation-checkpoint:selective" not in text
    assert "take no layer frequency" in " ".join(text.replace("#", " ").split())
