"""Recommendation plans run with TorchRec (planner.runtime.recsys) on 2 gloo processes.

A tiny DLRM (recsys_tiny.py) planned on the `cpu` preset with every table table-wise, row-wise,
column-wise or data-parallel, one plan mixing the four (with a UVM-cached table, which runs
with the fused kernel on CPU), and one with its dense part sharded by FSDP2 (zero=3): a few SGD steps of DistributedModelParallel with the plan's
ShardingPlan equal the same steps of the unsharded model in one process (same weights, same
global batches), losses and updated weights alike. All plans run in one torchrun launch.
"""

import json

import pytest
from recsys_tiny import make_plan

from planner.cli.main import main
from planner.errors import SpecError
from planner.planfile.document import load_plan
from planner.runtime import recsys, table_sharding
from planner.runtime.options import RunOptions

MIXED = (("t_cat_0", "row_wise", "hbm"), ("t_cat_1", "column_wise", "hbm"),
         ("t_cat_2", "table_wise", "uvm_caching"), ("t_cat_3", "data_parallel", "hbm"))
CASES = {"table_wise": {"sharding": "table_wise"}, "row_wise": {"sharding": "row_wise"},
         "column_wise": {"sharding": "column_wise"},
         "data_parallel": {"sharding": "data_parallel"}, "mixed": {"fixed": MIXED},
         "fsdp_dense": {"sharding": "table_wise", "zero": 3}}
LR = 2.0
"""Large enough that the tables move by more than 1e-3 in three steps."""
TOL = 1e-5


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torchrec-plans")
    return {case: make_plan(str(folder / f"{case}.json"), **kw) for case, kw in CASES.items()}


@pytest.fixture(scope="module")
def runs(plans):
    """Every plan in one launch, each also trained unsharded (``--reference``)."""
    opts = RunOptions(steps=2, warmup=1, lr=LR, device="cpu", threads=1)
    launch = recsys.check(list(plans.values()), opts)
    results = recsys.run_local(launch, opts, reference=True)
    return dict(zip(plans, results))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_sharded_steps_equal_the_unsharded_model(runs, plans, case):
    res = runs[case]
    plan = load_plan(plans[case])
    kinds = {t["sharding_type"] for t in plan.embeddings["tables"]}
    assert kinds == ({s for _, s, _ in MIXED} if case == "mixed" else {CASES[case]["sharding"]})
    zero = CASES[case].get("zero", 0)
    assert plan.embeddings["dense"]["zero"] == plan.parallel["zero"] == zero
    assert res["dense_engine"] == ("FSDP2" if zero == 3 else "DDP")
    assert res["sharding"] == {k: sum(t["sharding_type"] == k for t in plan.embeddings["tables"])
                               for k in kinds}
    ref = res["reference"]
    assert len(ref["losses"]) == len(res["loss_per_step"]) == 3
    assert ref["loss_max_abs_diff"] < TOL
    assert set(ref["table_max_abs_diff"]) == {t["name"] for t in plan.embeddings["tables"]}
    assert max(ref["table_max_abs_diff"].values()) < TOL
    assert ref["dense_max_abs_diff"] < TOL
    assert ref["table_max_update"] > 100 * TOL  # the tables did move: the check is not vacuous


@pytest.mark.slow
def test_each_run_is_measured_next_to_the_plans_prediction(runs, plans):
    for case, res in runs.items():
        plan = load_plan(plans[case])
        m = res["measured"]
        assert m["predicted_step_time_s"] == plan.predicted["step_time_s"]
        assert m["step_time_s"] == max(r["median_step_time_s"] for r in res["ranks"]) > 0
        assert [r["rank"] for r in res["ranks"]] == [0, 1]
        for r in res["ranks"]:
            assert len(r["step_times_s"]) == 3
            assert r["predicted_time_s"] == plan.embeddings["ranks"][r["rank"]]["time_s"]
    assert any("UVM kernels need a GPU" in n for n in runs["mixed"]["notes"])


@pytest.mark.slow
def test_plan_run_dispatches_a_recsys_plan_to_torchrec(plans, tmp_path, capsys):
    out_file = tmp_path / "measured.json"
    code = main(["run", plans["mixed"], "--steps", "2", "--device", "cpu", "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "DistributedModelParallel" in out and "step time" in out and "predicted" in out
    res = json.loads(out_file.read_text())
    assert res["plan"] == plans["mixed"] and res["measured"]["step_time_s"] > 0
    assert res["engine"].startswith("torchrec")
    # the result file prints again as the run printed it (plan show reads it)
    assert main(["show", str(out_file)]) == 0
    assert capsys.readouterr().out.strip() == out.split("\nwrote ")[0].strip()


# ---- without processes ----------------------------------------------------------------------

def test_the_sharding_plan_says_what_the_plan_says(plans):
    plan = load_plan(plans["mixed"])
    sp = table_sharding.sharding_plan(plan, device_type="cpu")
    per_table = sp.plan["sparse"]
    by_name = {t["name"]: t for t in plan.embeddings["tables"]}
    for name, ps in per_table.items():
        t = by_name[name]
        assert ps.sharding_type == t["sharding_type"]
        if t["sharding_type"] == "data_parallel":
            assert ps.sharding_spec is None and ps.ranks == [0, 1]
            assert ps.compute_kernel == "dense"
            continue
        shards = ps.sharding_spec.shards
        assert [s.placement.rank() for s in shards] == ps.ranks
        assert sorted((list(s.shard_offsets), list(s.shard_sizes), s.placement.rank())
                      for s in shards) == sorted((x["offsets"], x["sizes"], x["rank"])
                                                 for x in t["shards"])
        assert all(str(s.placement) == f"rank:{s.placement.rank()}/cpu" for s in shards)
    # the UVM-cached table runs fused on CPU; on GPUs as planned, with the plan's cache ratio
    assert per_table["t_cat_2"].compute_kernel == "fused"
    gpu = table_sharding.sharding_plan(plan, device_type="cuda",
                                       local_world=2).plan["sparse"]["t_cat_2"]
    assert gpu.compute_kernel == "fused_uvm_caching"
    assert gpu.cache_params.load_factor == by_name["t_cat_2"]["cache_ratio"]
    assert str(gpu.sharding_spec.shards[0].placement).endswith("/cuda:0")


def test_column_pieces_are_ordered_by_offset(plans):
    plan = load_plan(plans["column_wise"])
    t = plan.embeddings["tables"][0]
    t["shards"] = list(reversed(t["shards"]))  # the plan may list them in any order
    ps = table_sharding.sharding_plan(plan).plan["sparse"][t["name"]]
    assert [s.shard_offsets[1] for s in ps.sharding_spec.shards] == [0, 32]


def test_row_wise_shards_torchrec_cannot_route_are_refused(plans):
    plan = load_plan(plans["row_wise"])
    t = plan.embeddings["tables"][0]
    t["shards"][0]["sizes"][0] -= 1
    t["shards"][1]["offsets"][0] -= 1
    t["shards"][1]["sizes"][0] += 1
    with pytest.raises(SpecError, match="ceil"):
        table_sharding.sharding_plan(plan)


def test_the_cpu_sharder_offers_row_wise_types():
    types = table_sharding.cpu_sharder().sharding_types("cpu")
    assert {"row_wise", "table_row_wise", "grid_shard", "table_wise", "column_wise",
            "data_parallel"} <= set(types)


def test_a_plan_too_large_for_this_machine_is_refused_before_any_process(tmp_path, capsys):
    import planner

    p = planner.plan("dlrm-criteo-1tb", cluster="dgx-a100-40g", nodes=1, global_batch=65536,
                     optimizer="sgd")
    path = str(tmp_path / "dlrm.json")
    p.save(path)
    assert main(["run", path, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("plan: error:")]
    assert "GB" in line and "smaller" in line
    assert main(["run", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    (cmd,) = [ln for ln in out.splitlines() if ln.startswith("torchrun ")]
    assert "--nproc-per-node 8" in cmd and "planner.runtime.recsys" in cmd and path in cmd
    # one node: torchrun's own rendezvous (a fixed rendezvous id could join two jobs)
    assert cmd.startswith("torchrun --standalone ") and "--rdzv-id" not in cmd
    two = str(tmp_path / "dlrm2.json")
    planner.plan("dlrm-criteo-1tb", cluster="dgx-a100-40g", nodes=2, global_batch=65536,
                 optimizer="sgd").save(two)
    assert main(["run", two, "--dry-run"]) == 0
    (cmd,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("torchrun ")]
    assert f"--rdzv-id plan-{load_plan(two).provenance['input_hash']}" in cmd


def test_a_table_optimizer_the_cpu_kernels_do_not_fuse_is_refused_before_any_process(
        tmp_path, capsys):
    """fbgemm's CPU kernels fuse SGD and (row-wise) Adagrad only: an Adam plan on the CPU is
    refused by the check, before `plan run` says it is running anything."""
    path = make_plan(str(tmp_path / "adam.json"), sharding="row_wise", table_optimizer="adam")
    with pytest.raises(SpecError, match=r"^plan: table optimizer adam: fbgemm's CPU kernels "
                                        r"fuse only .* --table-optimizer adagrad"):
        recsys.check([path], RunOptions(device="cpu"))
    assert main(["run", path, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "running" not in err and "plan: error: plan: table optimizer adam" in err


def test_a_plan_from_a_module_object_needs_model(plans, tmp_path, capsys):
    plan = load_plan(plans["table_wise"])
    plan.model["spec"] = None
    path = str(tmp_path / "module.json")
    plan.save(path)
    assert main(["run", path, "--device", "cpu"]) == 2
    assert "--model" in capsys.readouterr().err


def test_plain_embedding_bag_tables_are_refused_with_the_fix():
    import torch.nn as nn  # the runtime shards TorchRec collections only

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.tables = nn.ModuleList(nn.EmbeddingBag(10, 4, device="meta") for _ in range(2))

    with pytest.raises(SpecError, match=r"^model: .*has 0 \(plain nn.EmbeddingBag tables are "
                                        r"planned and exported, not run: put them in one "):
        recsys.ebc_path(Plain())


def test_a_gpu_recommendation_plan_run_on_cpu_says_its_predictions_are_the_gpus(plans, tmp_path,
                                                                                caplog):
    """As a dense plan does (a new-user check ran an A100 plan on CPU without a word)."""
    plan = load_plan(plans["table_wise"])
    plan.cluster = {**plan.cluster, "device": "a100-40g"}
    path = str(tmp_path / "gpu.json")
    plan.save(path)
    with caplog.at_level("WARNING", logger="planner"):
        recsys.check([path], RunOptions(device="cpu"))
    assert "made for a100-40g GPUs, run here on CPU processes" in caplog.text
