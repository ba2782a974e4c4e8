"""Search results and the plan file: every block in one stage, memory fits, pins hold, the schema
round-trips, files are written atomically and deterministically."""

import json
import os

import pytest

from planner import load_plan, plan_prepared
from planner.inputs.clusters import load_cluster
from planner.errors import InfeasibleError, SpecError
from planner.options import SearchOptions, TrainingSpec, parse_fix
from planner.planfile.document import Plan, validate


def make(prepared, cluster="dgx-a100-80g", nodes=1, gb=32, fix=None, top_k=2):
    cl = load_cluster(cluster, nodes=nodes)
    tr = TrainingSpec(global_batch=gb, seq_len=prepared.seq_len)
    return plan_prepared(prepared, cl, tr, SearchOptions(fix=parse_fix(fix), top_k=top_k))


def check_plan(p: Plan):
    d = p.to_dict()
    par = d["parallel"]
    assert par["dp"] * par["tp"] * par["pp"] == d["cluster"]["num_gpus"]
    listed = [b for st in d["stages"] for b in st["blocks"]]
    assert listed == [b["name"] for b in d["model"]["blocks"]]
    assert d["predicted"]["peak_memory_bytes"] <= d["cluster"]["device_memory_bytes"]
    ranks = sorted(r for st in d["stages"] for r in st["ranks"])
    assert ranks == list(range(d["cluster"]["num_gpus"]))
    bd = d["predicted"]["breakdown"]
    assert sum(bd.values()) == pytest.approx(d["predicted"]["step_time_s"], rel=1e-4)
    assert len(d["schedule"]["actions"]) == par["pp"]


def test_free_search_gives_a_valid_plan(tiny_llama):
    p = make(tiny_llama, nodes=2)
    check_plan(p)
    assert p.search["status"] == "optimal" and p.search["candidates"] > 0
    assert len(p.search["alternatives"]) == 2
    for alt in p.search["alternatives"]:
        assert alt["step_time_s"] >= p.step_time_s
        assert "step time" in alt["why"]


@pytest.mark.parametrize("fix", ["tp=2,pp=2", "pp=4,schedule=gpipe,recompute=full",
                                 "tp=2,sequence_parallel=true,zero=1", "dp=16,micro_batch=2"])
def test_fix_pins_knobs(tiny_llama, fix):
    p = make(tiny_llama, nodes=2, fix=fix)
    check_plan(p)
    for k, v in parse_fix(fix).items():
        assert p.parallel[k] == v


def test_a_training_sequence_other_than_the_traced_one_is_refused(tiny_llama):
    cl = load_cluster("dgx-a100-80g")
    tr = TrainingSpec(global_batch=32, seq_len=2 * tiny_llama.seq_len)
    with pytest.raises(SpecError, match=r"training.seq_len: .* but the model was traced at .*; "
                                        r"prepare it again with seq_len="):
        plan_prepared(tiny_llama, cl, tr, SearchOptions())


def test_tp_map_names_megatron_roles(tiny_llama):
    p = make(tiny_llama, fix="tp=2,pp=1")
    assert p.tensor_parallel["model.layers.0.self_attn.o_proj"] == "rowwise"
    assert p.tensor_parallel["model.layers.3.mlp.up_proj"] == "colwise"


def test_bad_fix_is_a_spec_error(tiny_llama):
    with pytest.raises(SpecError, match="unknown knob 'tensor'"):
        parse_fix("tensor=2")
    # names from elsewhere (Megatron's flags, capitals) point to the knob or the engine setting
    with pytest.raises(SpecError, match=r"^fix: unknown knob 'expert_model_parallel_size'; did "
                                        r"you mean ep=8\?$"):
        parse_fix("expert_model_parallel_size=8")
    with pytest.raises(SpecError, match=r"did you mean ep=8\?$"):
        parse_fix("EP=8")
    with pytest.raises(SpecError, match=r"^fix: unknown knob 'dispatcher'; the engine setting "
                                        r"moe_dispatcher is given with --engine "
                                        r"moe_dispatcher=deepep$"):
        parse_fix("dispatcher=deepep")
    with pytest.raises(SpecError, match=r"unknown knob 'foo'; choose from dp, tp"):
        parse_fix("foo=1")
    with pytest.raises(SpecError, match=r"did you mean pp=4\?$"):
        parse_fix("pipeline_model_parallel_size=4")
    with pytest.raises(SpecError, match=r"'global_batch_size'; a setting of the run, given with "
                                        r"--global-batch 512$"):
        parse_fix("global_batch_size=512")
    with pytest.raises(SpecError, match=r"^fix\.tp: expected a whole number, got '2\.5'"):
        parse_fix("tp=2.5")
    with pytest.raises(SpecError, match="fix.schedule"):
        parse_fix("schedule=zigzag")
    with pytest.raises(SpecError, match=r"fix.tp: given twice \(2 and 4\); give it once"):
        parse_fix("tp=2,tp=4")
    # a setting given with the wrong option is sent to the right one
    with pytest.raises(SpecError, match=r"^fix.moe_overlap: an engine setting, not a parallelism "
                                        r"knob; give it with --engine moe_overlap=true$"):
        parse_fix("moe_overlap=true")
    with pytest.raises(SpecError, match=r"^fix.seq_len: a setting of the run, .* --seq-len 8192$"):
        parse_fix("seq_len=8192")
    with pytest.raises(SpecError, match=r"^why.moe_overlap: .* --engine moe_overlap=true to plan "
                                        r"solve \(re-plan\)$"):
        parse_fix("moe_overlap=true", where="why")
    with pytest.raises(SpecError, match=r"^fix.num_microbatches: follows from the global batch"):
        parse_fix("num_microbatches=8")
    with pytest.raises(SpecError, match=r"^fix.edp: the expert data-parallel degree follows from "
                                        r"the others \(dp x cp x tp / \(ep x etp\)\)"):
        parse_fix("edp=2")  # (a new-user check was asked 'did you mean ep or dp?')
    from planner.options import engine_spec
    with pytest.raises(SpecError, match=r"^engine.ep: a parallelism knob, not an engine setting; "
                                        r"give it with --fix ep=8"):
        engine_spec("megatron-core,ep=8")
    assert engine_spec("megatron-core,moe_overlap=true").moe_overlap
    with pytest.raises(SpecError, match=r"^engine.dtype: a setting of the run, .* --dtype fp8$"):
        engine_spec("dtype=fp8")
    # a pin no configuration can honour is bad input, named with the model's sizes
    with pytest.raises(SpecError, match=r"fix.tp: 8 does not divide the model's heads .*\(2, 4,"):
        make(tiny_llama, fix="tp=8")


def test_nothing_fits_says_what_would(tiny_llama):
    with pytest.raises(InfeasibleError, match=r"needs .* GB per GPU .* would fit on a device with"):
        _tiny_memory_plan(tiny_llama)


def test_a_batch_that_does_not_split_is_bad_input_with_a_batch_that_does(tiny_llama):
    # every layout would fit in memory; micro_batch=3 divides no replica's share of 32. The
    # batch named (a multiple of 3 x the 8 GPUs) plans, whatever dp the search picks
    with pytest.raises(SpecError, match=r"--global-batch must be a multiple of dp x micro_batch, "
                                        r"e\.g\. 24 \(multiples of micro_batch 3 x 8 GPUs, so "
                                        r"any dp divides them\); or relax") as err:
        make(tiny_llama, fix="micro_batch=3")
    assert "48" not in str(err.value)  # 16 away from 32: not near
    for dp in (1, 2, 8):
        assert make(tiny_llama, gb=24, fix=f"micro_batch=3,dp={dp}").parallel["dp"] == dp
    # far from any multiple of 3 x 8: the leanest layout's multiples
    with pytest.raises(SpecError, match=r"e\.g\. 3 or 6 for dp=1, micro_batch=3"):
        make(tiny_llama, gb=4, fix="micro_batch=3")
    # nothing pinned: the batch is the field the error names (a new-user check saw none)
    with pytest.raises(SpecError, match=r"^training\.global_batch: no configuration is possible "
                                        r"\(.*\); --global-batch must be a multiple"):
        make(tiny_llama, nodes=8, gb=31)  # 64 GPUs: no dp divides 31 but 1, too few to split


def test_one_gpu_offloads_the_optimizer_when_that_is_what_fits(tiny_llama):
    """ZeRO-Offload on a single GPU: ZeRO 1 with the optimizer on the host, the only plan that
    fits when its states (12 bytes per parameter with Adam) would not."""
    tr = TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    no_reserve = dict(memory_reserve_bytes=0.0, memory_reserve_fraction=0.0)

    def one_gpu(memory_gb: float) -> dict:
        return {"name": "one", "device": {"name": "small", "memory_GB": memory_gb,
                                          "hbm_GBps": 100, "peak_TFLOPs": {"bf16": 10}},
                "nodes": 1, "gpus_per_node": 1,
                "intra_node": {"bandwidth_GBps": 10, "latency_us": 5},
                "inter_node": {"bandwidth_GBps": 1, "latency_us": 50}}

    lean = "recompute=full,micro_batch=1"
    offloaded = plan_prepared(tiny_llama, load_cluster(one_gpu(80)), tr, SearchOptions(
        fix=parse_fix(f"{lean},offload_optimizer=true"), **no_reserve))
    assert offloaded.parallel["zero"] == 1
    room = offloaded.predicted["peak_memory_bytes"] + 6 * tiny_llama.info["num_params"]
    p = plan_prepared(tiny_llama, load_cluster(one_gpu(room / 1e9)), tr,
                      SearchOptions(fix=parse_fix(lean), **no_reserve))
    assert p.parallel["dp"] == 1 and p.parallel["offload_optimizer"] and p.parallel["zero"] == 1


def _tiny_memory_plan(prepared):
    cl = load_cluster({"name": "tiny", "device": {"name": "tiny", "memory_GB": 1.05,
                                                  "hbm_GBps": 100, "peak_TFLOPs": {"bf16": 10}},
                       "nodes": 1, "gpus_per_node": 1,
                       "intra_node": {"bandwidth_GBps": 10, "latency_us": 5},
                       "inter_node": {"bandwidth_GBps": 1, "latency_us": 50}})
    tr = TrainingSpec(global_batch=8, seq_len=prepared.seq_len)
    return plan_prepared(prepared, cl, tr, SearchOptions())


def test_round_trip_and_identical_bytes(tiny_gpt2, tmp_path):
    a, b = make(tiny_gpt2), make(tiny_gpt2)
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    a.save(str(pa))
    b.save(str(pb))
    assert pa.read_bytes() == pb.read_bytes()
    loaded = load_plan(str(pa))
    assert loaded.to_dict() == a.to_dict()
    assert oct(os.stat(pa).st_mode & 0o777) != "0o600"


def test_validation_names_the_key_and_keeps_old_file(tiny_gpt2, tmp_path):
    p = make(tiny_gpt2)
    d = p.to_dict()
    bad = json.loads(json.dumps(d))
    del bad["parallel"]["tp"]
    with pytest.raises(SpecError, match="parallel"):
        validate(bad)
    bad = json.loads(json.dumps(d))
    bad["stages"][0]["blocks"] = bad["stages"][0]["blocks"][1:]
    with pytest.raises(SpecError, match="every block exactly once"):
        validate(bad)
    target = tmp_path / "plan.json"
    target.write_text("precious")
    broken = Plan(**{**{k: getattr(p, k) for k in ("model", "training", "cluster", "parallel",
                                                    "stages", "tensor_parallel", "schedule",
                                                    "predicted", "search", "provenance")}})
    broken.parallel = {**broken.parallel, "dp": 999}
    with pytest.raises(SpecError):
        broken.save(str(target))
    assert target.read_text() == "precious"
    assert [f.name for f in tmp_path.iterdir()] == ["plan.json"]


@pytest.mark.parametrize("kw,field", [({"fix": {"foo": 1}}, "fix"), ({"zero": (7,)}, "zero"),
                                      ({"schedules": ()}, "schedules"),
                                      ({"memory_reserve_fraction": 1.0}, "memory_reserve_fraction"),
                                      ({"time_limit_s": "1"}, "time_limit_s"),
                                      ({"recompute": ()}, "recompute"), ({"vpp": (0,)}, "vpp"),
                                      ({"cp_min_tokens": -1}, "cp_min_tokens"),
                                      ({"top_k": 1.5}, "top_k")])
def test_search_options_are_checked_when_made(kw, field):
    with pytest.raises(SpecError, match=rf"^{field}"):
        SearchOptions(**kw)


def test_an_unknown_target_is_refused_by_plan_prepared(tiny_llama):
    tr = TrainingSpec(global_batch=32, seq_len=tiny_llama.seq_len)
    with pytest.raises(SpecError, match="target: unknown engine 'jax'"):
        plan_prepared(tiny_llama, load_cluster("dgx-a100-80g"), tr, SearchOptions(target="jax"))


def test_the_torch_target_runs_zb_h1_only_without_recomputation(tiny_llama):
    """The planner's runtime computes zb-h1's weight gradients inside B in recomputed blocks
    (torch's split backward cannot replay checkpointing): the torch target keeps zb-h1 to
    recompute none, a pin of both is refused; another target still pairs them."""
    from planner.search.space import ZB_RECOMPUTE

    cl = load_cluster("dgx-a100-80g")
    tr = TrainingSpec(global_batch=32, seq_len=tiny_llama.seq_len)
    with pytest.raises(SpecError, match=r"^fix.schedule: torch computes zb-h1's weight "
                                        r"gradients inside B .*recompute=full"):
        plan_prepared(tiny_llama, cl, tr, SearchOptions(
            fix=parse_fix("pp=2,schedule=zb-h1,recompute=full"), target="torch"))
    p = plan_prepared(tiny_llama, cl, tr, SearchOptions(fix=parse_fix("pp=2,schedule=zb-h1"),
                                                        target="torch", top_k=0))
    assert p.parallel["recompute"] == "none"
    assert p.search["rejected"].get(ZB_RECOMPUTE, 0) > 0
    p = plan_prepared(tiny_llama, cl, tr, SearchOptions(
        fix=parse_fix("pp=2,schedule=zb-h1,recompute=full"), top_k=0))
    assert p.parallel["schedule"] == "zb-h1" and p.parallel["recompute"] == "full"
    # a what-if on a torch plan (plan simulate) says so where the target would not run it
    from planner.targets import schedule_unrun
    assert "inside B where blocks are recomputed" in schedule_unrun("torch", "zb-h1", "full", 2)
    assert schedule_unrun("torch", "zb-h1", "none", 2) == schedule_unrun("any", "zb-h1", "full", 2) \
        == schedule_unrun("torch", "zb-h1", "full", 1) == ""
    assert "not bidirectional" in schedule_unrun("torch", "bidirectional", "none", 2)
    # without a pipeline there is no W to split: pp=1 with recomputation plans as before
    p = plan_prepared(tiny_llama, cl, tr, SearchOptions(
        fix=parse_fix("pp=1,schedule=zb-h1,recompute=full"), target="torch", top_k=0))
    assert p.parallel["recompute"] == "full" and ZB_RECOMPUTE not in p.search["rejected"]


def test_the_torch_target_trains_in_no_fp8(tiny_llama_config, tiny_llama, monkeypatch):
    """plan run builds the model in the plan's dtype (no FP8 GEMMs): --target torch with fp8 is
    refused before tracing, and by plan_prepared (a new-user check got an fp8 plan that plan run
    then refused)."""
    import planner
    from planner import traced

    monkeypatch.setattr(traced, "trace_model",
                        lambda *a, **k: pytest.fail("traced before the check"))
    with pytest.raises(SpecError, match=r"^training.dtype: the planner's runtime \(plan run\) "
                                        r"trains in fp32, bf16, fp16, not fp8"):
        planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=8, seq_len=128,
                     dtype="fp8", target="torch")
    tr = TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len, dtype="fp8")
    with pytest.raises(SpecError, match=r"^training.dtype: "):
        plan_prepared(tiny_llama, load_cluster("dgx-h100"), tr, SearchOptions(target="torch"))


def test_a_target_with_its_own_software_is_priced_with_it(tiny_llama_config):
    """`--target torchtitan` without --engine prices torchtitan's software (eager kernels,
    SDPA's FlashAttention-2, FSDP2's copies), not Megatron-Core's; an engine given wins."""
    import planner
    from costmodels.engine import PRESETS, engine_from_mapping

    kw = dict(cluster="dgx-a100-80g", global_batch=16, seq_len=128, top_k=0)
    titan = planner.plan(tiny_llama_config, target="torchtitan", **kw)
    assert engine_from_mapping(titan.training["engine"]) == engine_from_mapping("torchtitan")
    ds = planner.plan(tiny_llama_config, target="deepspeed", **kw)
    assert engine_from_mapping(ds.training["engine"]) == engine_from_mapping("deepspeed")
    # the planner's own runtime: eager code, SDPA, FSDP2's copies, its own ring (a new-user
    # check found --target torch priced as Megatron-Core, 16 GB leaner than plan run needs)
    own = engine_from_mapping(planner.plan(tiny_llama_config, target="torch", **kw)
                              .training["engine"])
    assert own == engine_from_mapping("torch") and (own.kernels, own.cp_ring) == (
        "eager", "runtime") and own.pipelined_accumulation
    chosen = planner.plan(tiny_llama_config, target="torchtitan", engine="torchtitan-compile", **kw)
    assert engine_from_mapping(chosen.training["engine"]).kernels == "fused"
    megatron = planner.plan(tiny_llama_config, target="megatron", **kw)
    assert engine_from_mapping(megatron.training["engine"]) == engine_from_mapping(
        "megatron-core") and "megatron-core" in PRESETS
    # settings given alone go over the target's software (a new-user check found them priced
    # as Megatron-Core's under --target torchtitan), in text and as a mapping
    for given in ("overlap_grad_reduce=false", {"overlap_grad_reduce": False}):
        over = planner.plan(tiny_llama_config, target="torchtitan", engine=given, **kw)
        assert engine_from_mapping(over.training["engine"]) == engine_from_mapping(
            "torchtitan,overlap_grad_reduce=false")


def test_at_the_same_step_time_the_plan_with_less_memory_ranks_first(tiny_llama):
    """Equal times (to 9 digits: sums in another order) go to the leaner plan, kept in a full
    top k even when offered last; before, the first one offered won and could hold more memory."""
    from dataclasses import replace

    from planner.search.loop import _TopK

    base = _an_estimate(tiny_llama)
    lean = replace(base, peak_memory_bytes=base.peak_memory_bytes / 2,
                   step_time_s=base.step_time_s * (1 + 1e-12))
    heavy, slower = base, replace(base, step_time_s=base.step_time_s * 1.01)
    top = _TopK(2)
    for order, e in enumerate((heavy, slower, lean)):
        top.offer(e, order)
    assert top.ranked() == [lean, heavy]
    assert sorted([slower, heavy, lean], key=lambda e: e.rank) == [lean, heavy, slower]


def _an_estimate(prepared):
    from planner.search.loop import search

    cl = load_cluster("dgx-a100-80g", nodes=1)
    tr = TrainingSpec(global_batch=32, seq_len=prepared.seq_len)
    return search(prepared.blocks, cl, tr, SearchOptions(top_k=1)).best


def test_a_cpu_cluster_offloads_nothing(tiny_llama_config):
    """On the cpu cluster the device is the host: the search leaves offload out (the processes
    step the optimizer in host memory already, and `plan run` would not apply it), and a pin of
    it is refused."""
    import planner

    p = planner.plan(tiny_llama_config, cluster="cpu", global_batch=4, seq_len=64, dtype="fp32",
                     fix="dp=2,zero=1", top_k=3)
    assert p.parallel["offload_optimizer"] is False
    alternatives = p.search["alternatives"]
    assert alternatives and not any(a["parallel"]["offload_optimizer"] for a in alternatives)
    with pytest.raises(SpecError, match="fix.offload_optimizer: the cpu cluster's processes"):
        planner.plan(tiny_llama_config, cluster="cpu", global_batch=4, seq_len=64, dtype="fp32",
                     fix="offload_optimizer=true")
    rows = planner.whatif(tiny_llama_config, cluster="cpu", global_batch=4, seq_len=64,
                          dtype="fp32", fix="dp=2", vary={"zero": [1, 2]})  # what-if, too
    assert [r["feasible"] for r in rows] == [True, True]
    assert not any(r["offload_optimizer"] for r in rows)


def test_a_tie_at_the_edge_of_memory_goes_to_the_plan_with_room():
    """A new-user check got a plan of 73 GB per 80 GB GPU (ZeRO-3, optimizer offloaded) over one
    of 51 GB 0.004% slower: within TIE_SHARE the plan with less memory wins where the fastest is
    at the edge (TIE_MEMORY_EDGE of the usable memory); below it the fastest stays."""
    from types import SimpleNamespace as E

    from planner.search.loop import tie_broken

    fast = E(step_time_s=118.782, peak_memory_bytes=73.3e9, rank=(118.782, 73.3e9))
    lean = E(step_time_s=118.787, peak_memory_bytes=50.7e9, rank=(118.787, 50.7e9))
    slow = E(step_time_s=119.1, peak_memory_bytes=49.6e9, rank=(119.1, 49.6e9))  # no tie: +0.3%
    order = [fast, lean, slow].index
    assert tie_broken([fast, lean, slow], order, capacity=76e9) == [lean, fast, slow]
    assert tie_broken([fast, lean, slow], order, capacity=90e9) == [fast, lean, slow]
    assert tie_broken([], order, capacity=1.0) == []
    # within the first TIE_POOL alone: the same answer however many runners-up are kept
    leaner = E(step_time_s=118.783, peak_memory_bytes=40e9, rank=(118.783, 40e9))
    four = [fast, lean, slow, leaner]
    assert tie_broken(four, four.index, capacity=76e9)[0] is lean


def test_a_tie_goes_to_a_plan_an_exported_engine_runs():
    """A new-user check: with --target any, a plan only the planner's own runtime runs won a tie
    (0.1%) over one Megatron runs. Where the fastest is not exported and a tied one is, the tied
    one wins; memory then decides among those; a plan out of the tie stays behind."""
    from types import SimpleNamespace as E

    from planner.search.loop import tie_broken

    own = E(config="own", step_time_s=10.0, peak_memory_bytes=50e9, rank=(10.0, 50e9))
    runs = E(config="runs", step_time_s=10.005, peak_memory_bytes=60e9, rank=(10.005, 60e9))
    far = E(config="far", step_time_s=10.5, peak_memory_bytes=40e9, rank=(10.5, 40e9))
    exported = {"runs", "far"}.__contains__
    order = [own, runs, far].index
    assert tie_broken([own, runs, far], order, 80e9, exported) == [runs, own, far]
    assert tie_broken([own, runs, far], order, 80e9) == [own, runs, far]  # (a target's search)
    assert tie_broken([own, far], [own, far].index, 80e9, exported) == [own, far]  # no tie
    # both exported: the fastest stays unless at the memory edge, as before
    assert tie_broken([runs, far], [runs, far].index, 80e9, lambda c: True) == [runs, far]
    # the fastest exported and at the memory edge: a leaner tie no engine runs does not win it
    lean = E(config="lean", step_time_s=10.001, peak_memory_bytes=40e9, rank=(10.001, 40e9))
    assert tie_broken([runs, lean], [runs, lean].index, 62e9, exported)[0] is runs
    assert tie_broken([runs, lean], [runs, lean].index, 62e9)[0] is lean  # (a target's search)


def test_a_tp_pin_refused_before_tracing_offers_degrees_the_heads_take(monkeypatch):
    """gpt2 has 12 heads: of the cluster's 1, 2, 4, 8 GPUs' divisors, tp=8 is not offered (a
    review saw it offered, then refused once traced)."""
    import planner
    from planner import traced

    monkeypatch.setattr(traced, "trace_model",
                        lambda *a, **k: pytest.fail("traced before the check"))
    with pytest.raises(SpecError, match=r"^fix\.tp: 5 does not divide the cluster's 8 GPUs; use "
                                        r"one of 1, 2, 4 \(dividing the model's 12 heads\)$"):
        planner.plan("gpt2", cluster="dgx-h100", global_batch=8, fix="tp=5")


def test_a_tp_pin_refused_before_tracing_offers_degrees_the_key_value_heads_take(monkeypatch):
    """Mixtral's 8 key/value heads rule out tp=16 and 32 on 64 GPUs, which its 32 query heads
    take (a new-user check was offered them, then refused once traced), in plan and whatif."""
    import planner
    from planner import traced

    monkeypatch.setattr(traced, "trace_model",
                        lambda *a, **k: pytest.fail("traced before the check"))
    message = (r"^fix\.tp: 3 does not divide the cluster's 64 GPUs; use one of 1, 2, 4, 8 "
               r"\(dividing the model's 32 query and 8 key/value heads\)$")
    with pytest.raises(SpecError, match=message):
        planner.plan("mixtral-8x7b", cluster="dgx-h100", nodes=8, global_batch=256, fix="tp=3")
    with pytest.raises(SpecError, match=message):
        planner.whatif("mixtral-8x7b", cluster="dgx-h100", nodes=8, global_batch=256,
                       fix="tp=3", vary={"ep": [2, 4]})
