"""``--engine moe_shared_overlap=true``: Megatron-Core's --moe-shared-expert-overlap. The shared
expert's GEMMs run on a stream of their own beside the token dispatch and combine, so each pass
hides that much of its all-to-alls (at the cost of slowing the GEMMs beside them)."""

import json

import pytest

import planner
from costmodels.engine import engine_from_mapping
from costmodels.errors import SpecError
from planner.export import export

TINY_MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64,
                "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 256,
                "max_position_embeddings": 256}


def test_the_trace_marks_the_shared_experts_gemms_not_the_routers_nor_the_routed(tiny_deepseek_v3_prepared):
    prepared, cfg = tiny_deepseek_v3_prepared
    hidden, shared_ffn = cfg["hidden_size"], cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
    for b in prepared.blocks.blocks:
        shared = [g for g in b.work.gemms if g.shared_expert]
        if not b.work.num_experts:  # the dense first layer, the embedding and the head
            assert not shared
            continue
        # gate and up projections (hidden -> ffn), down projection (ffn -> hidden)
        assert sorted((g.k, g.n) for g in shared) == sorted(
            [(hidden, shared_ffn), (hidden, shared_ffn), (shared_ffn, hidden)])
        assert not any(g.experts for g in shared)
        # the router (a column per routed expert) is not among them
        assert all(g.n != cfg["n_routed_experts"] for g in shared)


def test_a_model_without_a_shared_expert_has_none_and_the_setting_is_said_to_change_nothing(
        tmp_path, caplog):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_MIXTRAL))
    prepared = planner.prepare(str(path), seq_len=64, cache_dir=None)
    assert not any(g.shared_expert for b in prepared.blocks.blocks for g in b.work.gemms)
    training = planner.TrainingSpec(global_batch=16, seq_len=64, engine=engine_from_mapping(
        "megatron-core,moe_shared_overlap=true"))
    planner.plan_prepared(prepared, planner.load_cluster("dgx-h100", nodes=2), training,
                          planner.SearchOptions(fix=planner.options.parse_fix("ep=8")))
    assert any(r.getMessage().startswith("engine.moe_shared_overlap: ") and "no shared expert"
               in r.getMessage() for r in caplog.records)


def test_the_shared_expert_hides_the_dispatch_of_its_pass(tiny_deepseek_v3_prepared):
    prepared, _ = tiny_deepseek_v3_prepared
    cluster = planner.load_cluster("dgx-h100", nodes=2)

    def plan(engine):
        training = planner.TrainingSpec(global_batch=16, seq_len=64,
                                        engine=engine_from_mapping(engine))
        return planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
            fix=planner.options.parse_fix("ep=8,tp=1,pp=1,dp=16,micro_batch=1,zero=1,"
                                          "recompute=none")))

    alone = plan("megatron-core")
    beside = plan("megatron-core,moe_shared_overlap=true")
    exposed = alone.predicted["breakdown"]["ep_comm_s"]
    hidden = exposed - beside.predicted["breakdown"]["ep_comm_s"]
    assert exposed > 0 and hidden > 0  # some of the all-to-alls hide
    assert beside.predicted["step_time_s"] < alone.predicted["step_time_s"]
    # the shared expert's GEMMs are tiny here: they hide at most their own time
    assert beside.predicted["breakdown"]["ep_comm_s"] > 0


def test_megatron_refuses_it_beside_the_overlapped_dispatch_or_the_allgather_dispatcher():
    with pytest.raises(SpecError, match=r"^engine.moe_shared_overlap: .* not both; drop one"):
        engine_from_mapping("moe_shared_overlap=true,moe_overlap=true")
    with pytest.raises(SpecError, match=r"^engine.moe_shared_overlap: .* alltoall or deepep"):
        engine_from_mapping("moe_shared_overlap=true,moe_dispatcher=allgather")


def test_exports_write_it_for_megatron_and_list_it_elsewhere(tiny_deepseek_v3_prepared, tmp_path,
                                                           tiny_deepseek_v3, caplog):
    prepared, _ = tiny_deepseek_v3_prepared
    prepared_path = str(tmp_path / "config.json")
    with open(prepared_path, "w") as f:
        json.dump(tiny_deepseek_v3, f)
    cluster = planner.load_cluster("dgx-h100", nodes=2)
    training = planner.TrainingSpec(global_batch=16, seq_len=64, engine=engine_from_mapping(
        "megatron-core,moe_shared_overlap=true"))
    plan = planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
        fix=planner.options.parse_fix("ep=8,tp=1,pp=1,dp=16,micro_batch=1,zero=1")))
    path = tmp_path / "p.json"
    plan.save(str(path))
    text, _ = export(str(path), "megatron")
    assert "--moe-shared-expert-overlap" in text
    # with DeepEP's flex dispatcher core_v0.19.0 takes it and core_v0.14.0 raises: left off there
    training = planner.TrainingSpec(global_batch=16, seq_len=64, engine=engine_from_mapping(
        "megatron-core,moe_shared_overlap=true,moe_dispatcher=deepep"))
    deepep = planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
        fix=planner.options.parse_fix("ep=8,tp=1,pp=1,dp=16,micro_batch=1,zero=1")))
    deepep.save(str(path))
    new, _ = export(str(path), "megatron")
    assert "--moe-shared-expert-overlap" in new and "--moe-token-dispatcher-type flex" in new
    with caplog.at_level("WARNING", logger="planner.export"):
        old, _ = export(str(path), "megatron", version="core_v0.14.0")
    assert "--moe-shared-expert-overlap" not in old and "--moe-enable-deepep" in old
    assert "Megatron-Core core_v0.14.0 runs the shared expert beside the dispatch with the " \
           "alltoall dispatcher only" in caplog.text
    titan, _ = export(str(path), "torchtitan")
    assert "moe_shared_overlap: torchtitan" in titan and "run exposed" in titan
    # a target that does not run it refuses it when planning
    with pytest.raises(SpecError, match=r"^engine.moe_shared_overlap: torchtitan's MoE runs a shared "
                                        r"expert before or after the dispatch"):
        planner.plan(prepared_path, cluster="dgx-h100", nodes=2, global_batch=16, seq_len=64,
                     target="torchtitan", engine="torchtitan,moe_shared_overlap=true",
                     cache_dir=None)
