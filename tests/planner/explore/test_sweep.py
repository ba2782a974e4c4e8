"""What-if sweeps: one trace for the whole grid, rows in grid order (infeasible points included),
values checked, clusters modified as asked, costs, CSV, plots and the `plan whatif` command."""

import itertools
import json
import logging

import pytest

from planner import api
from planner.explore import costs, grid
from planner.explore.csv_rows import read_csv, write_csv
from planner.explore import sweep as explore
from planner.report import plots
from planner.cli.main import main
from planner.errors import SpecError
from planner.options import parse_fix
from costmodels.engine import engine_from_mapping
from costmodels.hardware import GB
from conftest import write_config
import planner


@pytest.fixture
def count_prepare(monkeypatch):
    calls = []
    real = api.prepare

    def counting(*args, **kwargs):
        calls.append(kwargs.get("seq_len"))
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "prepare", counting)
    return calls


@pytest.fixture(scope="module")
def two_clusters(tiny_llama_config):
    """Two presets x three sizes, priced: a sweep the plots and the CSV can use."""
    return explore.whatif(tiny_llama_config, vary={"cluster": ["dgx-h100", "dgx-a100-80g"],
                                                   "nodes": [1, 2, 4]},
                          global_batch=64, seq_len=128, prices={"h100": 4, "a100": 2},
                          tokens=1e9)


def test_a_sweep_of_50_points_traces_once(tiny_llama_config, count_prepare):
    vary = {"nodes": [1, 2, 4, 8, 16], "tp": [1, 2, 4, 8, 16], "recompute": ["none", "full"]}
    rows = explore.whatif(tiny_llama_config, cluster="dgx-h100", vary=vary, global_batch=64,
                          seq_len=128)
    assert len(count_prepare) == 1 and count_prepare == [128]
    assert len(rows) == 50
    grid = [f"nodes={n} tp={t} recompute={r}" for n, t, r in itertools.product(*vary.values())]
    assert [r["point"] for r in rows] == grid  # grid order, first key outermost
    for r, (n, t, rc) in zip(rows, itertools.product(*vary.values())):
        assert r["gpus"] == 8 * n and r["nodes"] == n
        if t > 2:  # 4 heads, 2 key/value heads: tp is at most 2
            assert not r["feasible"] and "tp" in r["reason"] and r["step_time_s"] is None
        else:
            assert r["feasible"] and r["reason"] is None
            assert (r["tp"], r["recompute"]) == (t, rc) and r["dp"] * r["tp"] * r["pp"] == 8 * n
            assert r["tokens_per_s"] == pytest.approx(64 * 128 / r["step_time_s"], rel=1e-4)
            parts = sum(r[k] for k in ("compute_s", "bubble_s", "tp_comm_s", "pp_comm_s",
                                       "dp_comm_s", "optimizer_s"))
            assert parts == pytest.approx(r["step_time_s"], rel=0.02)


def test_one_trace_per_sequence_length_and_workers_do_not_change_rows(tiny_llama_config,
                                                                      count_prepare):
    vary = {"seq_len": [64, 128], "global_batch": [16, 32]}
    pooled = explore.whatif(tiny_llama_config, cluster="dgx-h100", vary=vary, workers=2)
    assert sorted(count_prepare) == [64, 128]
    serial = explore.whatif(tiny_llama_config, cluster="dgx-h100", vary=vary, workers=1)
    assert pooled == serial
    assert [(r["seq_len"], r["global_batch"]) for r in pooled] == [(64, 16), (64, 32),
                                                                   (128, 16), (128, 32)]


def test_a_row_is_the_plan_solve_gives_at_that_point():
    """The sweep searches as `plan solve` does (the runners-up re-timed by simulation too): on 64
    A100 the closed form's favourite for Llama-3 70B is not the simulation's, and a row that
    simulated only the favourite would differ from the plan."""
    import planner
    kw = dict(global_batch=1024, seq_len=4096)
    row, = explore.whatif("llama3-70b", cluster="dgx-a100-80g", vary={"nodes": [8]}, workers=1,
                          **kw)
    p = planner.plan("llama3-70b", cluster="dgx-a100-80g", nodes=8, **kw)
    assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
    assert row["schedule"] == p.parallel["schedule"]


def test_a_sweep_with_a_calibration_prices_each_point_as_plan_solve_does(tiny_llama_config):
    """A new-user check: plan profile's calibration went into plan solve only (whatif had no
    --calibration): each point's device is the measured one, refused with a varied device."""
    calib = {"schema": "planner.calibration/v1", "device_kind": "cpu", "device_name": "test",
             "threads": 1,
             "device": {"peak_TFLOPs": {"fp32": 0.1}, "hbm_GBps": 10.0, "kernel_overhead_us": 5.0,
                        "attention_efficiency": {"fp32": 0.5},
                        "gemm_table": {"fp32": [[1e6, 2e10], [1e9, 1e11]]}}}
    kw = dict(global_batch=8, seq_len=64, dtype="fp32")
    rows = explore.whatif(tiny_llama_config, cluster="cpu", vary={"gpus_per_node": [1, 2]},
                          calibration=calib, workers=1, **kw)
    for row in rows:
        p = planner.plan(tiny_llama_config, cluster="cpu", gpus_per_node=row["gpus"],
                         calibration=calib, **kw)
        plain = planner.plan(tiny_llama_config, cluster="cpu", gpus_per_node=row["gpus"], **kw)
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
        assert row["step_time_s"] != pytest.approx(plain.step_time_s, rel=1e-3)
    with pytest.raises(SpecError, match="vary.device: a calibration measures one device"):
        explore.whatif(tiny_llama_config, cluster="cpu", vary={"device": ["cpu", "a100-80g"]},
                       calibration=calib, workers=1, **kw)


def test_a_sweep_for_a_target_plans_each_point_as_plan_solve_does_for_it():
    """--target: each point keeps to the engine's rules and software, as `plan solve --target`
    (a new-user check compared a what-if's ZeRO-3 with a pipeline, which Megatron-LM does not run,
    against a Megatron plan)."""
    import planner
    kw = dict(global_batch=64, seq_len=8192, fix="cp_comm=a2a")
    rows = explore.whatif("llama3-8b", cluster="dgx-h100", nodes=4, vary={"cp": [4, 8]},
                          workers=1, target="megatron", **kw)
    for row in rows:
        p = planner.plan("llama3-8b", cluster="dgx-h100", nodes=4, target="megatron",
                         **{**kw, "fix": f"{kw['fix']},cp={row['cp']}"})
        assert row["step_time_s"] == pytest.approx(p.step_time_s, rel=1e-9)
        assert row["zero"] == p.parallel["zero"] and not (row["zero"] >= 2 and row["pp"] > 1)
    with pytest.raises(SpecError, match="target: unknown engine 'megatorn'"):
        explore.whatif("llama3-8b", cluster="dgx-h100", vary={"nodes": [1]}, global_batch=8,
                       target="megatorn")


def test_points_change_the_cluster_as_asked():
    base = {"cluster": "dgx-h100", "nodes": None, "gpus_per_node": None}
    c = grid.point_cluster({**base, "nodes": 3, "device": "a100-80g",
                               "inter_node_bandwidth": 12.5})
    assert (c.nodes, c.gpus_per_node, c.device.name) == (3, 8, "a100-80g")
    assert c.inter_node.bandwidth_bytes_per_s == 12.5e9 and c.inter_node.name == "ib"
    assert c.intra_node.bandwidth_bytes_per_s == 450e9  # the preset's NVLink stays
    c = grid.point_cluster({**base, "gpus_per_node": 4, "intra_node_bandwidth": 100})
    assert c.num_gpus == 4 and c.intra_node.bandwidth_bytes_per_s == 100e9


def test_a_point_of_another_gpu_count_splits_a_nodes_link_among_its_gpus():
    """A new-user check: --vary gpus_per_node=2,4,8 on a file whose inter_node is per: node
    priced every point at the file's 4 GPUs' share; a varied bandwidth is each GPU's, as the
    key says, and is written per GPU in the plan's cluster spec."""
    slow = {"name": "slow-eth", "device": "h100", "nodes": 4, "gpus_per_node": 4,
            "intra_node": {"bandwidth": "64GB/s", "latency": "5us"},
            "inter_node": {"bandwidth": "25Gbps", "latency": "50us", "per": "node"}}
    base = {"cluster": slow, "nodes": None, "gpus_per_node": None}
    shares = [grid.point_cluster({**base, "gpus_per_node": n}).inter_node.bandwidth_bytes_per_s
              for n in (2, 4, 8)]
    assert shares == pytest.approx([3.125e9 / 2, 3.125e9 / 4, 3.125e9 / 8])
    from planner.inputs.clusters import load_cluster  # (the Python API's gpus_per_node=)
    assert load_cluster(slow, gpus_per_node=8).inter_node.bandwidth_bytes_per_s == shares[2]
    c = grid.point_cluster({**base, "gpus_per_node": 8, "inter_node_bandwidth": 1.0})
    assert c.inter_node.bandwidth_bytes_per_s == 1e9
    assert c.to_mapping()["inter_node"]["bandwidth_GBps"] == 1.0
    assert "per" not in c.to_mapping()["inter_node"]


def test_a_cluster_of_node_groups_is_not_resized_and_says_by_what(tmp_path):
    """--nodes beside a file of node groups: the point names the size it was given, and a price
    for that file's devices says why the point was not counted (a new-user check)."""
    import os
    hetero = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                          "hetero_a100_v100.yaml")
    with pytest.raises(SpecError, match=r"has node groups, which nodes=4 cannot resize"):
        grid.point_cluster({"cluster": hetero, "nodes": 4, "gpus_per_node": None})
    with pytest.raises(SpecError, match=r"^price_per_gpu_hour.v100: matches no device of the "
                                        r"sweep \(a100-80g\); name one of them \(the devices of a point that "
                                        r"could not be built are not known: "
                                        r"cluster .*nodes=4 cannot resize"):
        explore.whatif("gpt2", vary={"cluster": [hetero, "dgx-a100-80g"]}, nodes=4,
                       global_batch=512, dtype="fp16", prices={"a100": 2, "v100": 0.5})


def test_a_point_shows_bandwidth_in_the_unit_it_is_priced_in(tiny_llama_config):
    """Bandwidths given in other units (400Gbps) are shown in GB/s, with the unit, and a name
    given in capitals reads as the engine's name."""
    rows = explore.whatif(tiny_llama_config, cluster="dgx-h100", nodes=2, global_batch=16,
                          seq_len=64, fix="tp=1,pp=1,dp=16", vary={
                              "inter_node_bandwidth": ["400Gbps", "12.5"],
                              "attention": ["Flash"]})
    assert [r["point"] for r in rows] == ["inter_node_bandwidth=50GB/s attention=flash",
                                          "inter_node_bandwidth=12.5GB/s attention=flash"]
    assert [r["inter_node_GBps"] for r in rows] == [50, 12.5]


def test_a_link_no_point_uses_is_said(tiny_llama_config, caplog):
    """A new-user check varied the link between nodes on one node and got the same row at every
    point, with no word; on two nodes the link is used, and nothing is said."""
    def said(nodes):
        caplog.clear()
        with caplog.at_level("WARNING"):
            explore.whatif(tiny_llama_config, cluster="dgx-h100", nodes=nodes, global_batch=16,
                           seq_len=64, fix="tp=1,pp=1", vary={"inter_node_bandwidth": [1]})
        return [r.getMessage() for r in caplog.records if "changes nothing" in r.getMessage()]

    assert said(1) == ["vary.inter_node_bandwidth: every point's cluster has one node, whose GPUs "
                       "use no link between nodes; it changes nothing here (vary nodes or "
                       "gpus_per_node with it)"]
    assert said(2) == []


@pytest.mark.parametrize("vary,message", [
    ({"nodez": [1]}, "vary: unknown key 'nodez'; did you mean nodes?"),
    ({"nodes": [0]}, "vary.nodes: expected a positive integer"),
    ({"nodes": "8,16"}, "vary.nodes: expected a non-empty list"),
    ({"device": ["h1000"]}, "did you mean h100"),
    ({"tp": ["x"]}, "vary.tp: expected a whole number"),
    ({"inter_node_bandwidth": [-1]}, "vary.inter_node_bandwidth: must be positive, got -1"),
    ({"inter_node_bandwidth": ["-1"]}, "vary.inter_node_bandwidth: must be positive, got '-1'"),
    ({"inter_node_bandwidth": ["fast"]}, "vary.inter_node_bandwidth: expected a bandwidth like"),
    ({"dtype": ["fp4"]}, "vary.dtype: unknown dtype"),
    ({"moe_dispatcher": ["foo"]}, r"^vary.moe_dispatcher: expected one of alltoall, allgather, deepep"),
    ({"moe_imbalance": ["0.5"]}, r"^vary.moe_imbalance: expected a number >= 1, got 0.5"),
])
def test_bad_values_are_one_line_errors_naming_the_key(vary, message):
    with pytest.raises(SpecError, match=message):
        explore.whatif("gpt2", cluster="dgx-h100", vary=vary, global_batch=8)


def test_parse_vary_and_prices():
    assert grid.parse_vary(["nodes=8, 16", "gpus-per-node=4"]) == {
        "nodes": ["8", "16"], "gpus_per_node": ["4"]}
    with pytest.raises(SpecError, match="is not KEY=V1,V2"):
        grid.parse_vary(["nodes"])
    assert costs.parse_prices("h100=$4, a100-80g=2.5") == {"h100": 4.0, "a100-80g": 2.5}
    with pytest.raises(SpecError, match="price_per_gpu_hour.h100: expected dollars"):
        costs.parse_prices("h100=four")
    assert costs.resolve_prices({"a100": 2}, ["a100-80g", "h100"]) == {"a100-80g": 2}
    with pytest.raises(SpecError, match="matches several"):
        costs.resolve_prices({"a100": 2}, ["a100-80g", "a100-40g"])


def test_a_mixed_cluster_is_priced_per_device(caplog):
    """Node groups of two devices are priced at each one's rate (a new-user check found all 32
    GPUs of an A100 + V100 cluster charged the A100's price, and v100=1 refused as matching no
    device of 'a100-80g+v100'); a device without a price leaves its rows unpriced, said once."""
    mixed = {"device": "a100-80g+v100", "gpus": 32, "feasible": True, "step_time_s": 2.0,
             "tokens_per_s": 1000.0, "gpus_by_device": "a100-80g:16,v100:16"}
    alone = {"device": "h100", "gpus": 8, "feasible": True, "step_time_s": 1.0,
             "tokens_per_s": 500.0, "gpus_by_device": "h100:8"}
    costs.add_costs([mixed], {"a100": 2, "v100": 1})
    assert mixed["price_per_gpu_hour"] == 1.5
    assert mixed["cost_per_step_usd"] == pytest.approx((16 * 2 + 16 * 1) * 2.0 / 3600)
    old = {k: v for k, v in alone.items() if k != "gpus_by_device"}  # a CSV from before
    with caplog.at_level("WARNING"):
        costs.add_costs([mixed, alone, old], {"a100": 2, "h100": 4})
    assert mixed["cost_per_step_usd"] is None and alone["price_per_gpu_hour"] == 4
    assert old["cost_per_step_usd"] == pytest.approx(8 * 4 / 3600)
    assert "no price for v100" in caplog.text and "add v100=DOLLARS" in caplog.text
    before = {k: v for k, v in mixed.items() if k != "gpus_by_device"}  # one device, it seemed
    with caplog.at_level("WARNING"):  # (the root level an earlier test left does not apply)
        costs.add_costs([before], {"a100": 2})
    assert before["cost_per_step_usd"] is None and "sweep them again" in caplog.text
    assert costs.gpus_by_device({"device": "a+b", "num_gpus": 24, "groups": [
        {"device": "a", "num_gpus": 8}, {"device": "b", "num_gpus": 8},
        {"device": "a", "num_gpus": 8}]}) == "a:16,b:8"


def test_a_length_the_model_cannot_take_is_a_row_not_the_sweeps_end():
    """A new-user check: --vary seq_len past GPT-2's learned positions ended the whole sweep with
    'seq_len: ... use --seq-len 1024 or less'; that point is a row now, worded as varied."""
    rows = explore.whatif("gpt2", cluster="dgx-h100", vary={"seq_len": [256, 2048]},
                          global_batch=8)
    ok, bad = rows
    assert ok["feasible"] and not bad["feasible"] and bad["bad_input"]
    assert bad["reason"] == ("vary.seq_len: 2048 exceeds gpt2's learned positions (1024); use "
                             "1024 or less")
    with pytest.raises(SpecError, match=r"^vary.seq_len: 2048 exceeds .* \(and 1 other point"):
        explore.whatif("gpt2", cluster="dgx-h100", vary={"seq_len": [2048, 4096]},
                       global_batch=8)


def test_an_image_models_length_is_not_varied(tmp_path):
    """A new-user check: --vary seq_len=197,256 on a ViT gave a 'seq_len=256' row with the 197
    tokens' numbers; the image sets the length, so that point is bad input."""
    (tmp_path / "vit.json").write_text(json.dumps(
        {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64, "image_size": 32, "patch_size": 16}))
    ok, bad = explore.whatif(str(tmp_path / "vit.json"), cluster="dgx-h100",
                             vary={"seq_len": [5, 256]}, global_batch=8)
    assert ok["feasible"] and ok["seq_len"] == 5
    assert bad["bad_input"] and bad["reason"] == (
        "vary.seq_len: 256 does not apply; a sample is the image's 5 tokens (image_size and "
        "patch_size in the config set them)")


def test_infeasible_points_are_rows(tiny_llama_config):
    rows = explore.whatif(tiny_llama_config, cluster="dgx-h100",
                          vary={"device": ["v100", "h100"]}, global_batch=8, seq_len=64)
    v100, h100 = rows
    assert not v100["feasible"] and "v100 has no bf16" in v100["reason"]
    assert v100["device"] is None or v100["device"] == "v100"
    assert h100["feasible"] and h100["device"] == "h100"


def test_prices_and_tokens_are_checked_before_any_trace(monkeypatch):
    """A token count that is none, or a price for no device of the sweep, fail before the slow
    part."""
    def no_trace(*a, **kw):
        raise AssertionError("traced before the prices were checked")
    monkeypatch.setattr(api, "prepare", no_trace)
    with pytest.raises(SpecError, match="tokens: expected a positive number of training tokens"):
        explore.whatif("gpt2", cluster="dgx-h100", vary={"nodes": [1, 2]}, global_batch=8,
                       tokens=-1)
    with pytest.raises(SpecError, match=r"price_per_gpu_hour.a100: matches no device of the "
                                        r"sweep \(h100\)"):
        explore.whatif("gpt2", cluster="dgx-h100", vary={"nodes": [1, 2]}, global_batch=8,
                       prices={"a100": 2.0})


def test_days_need_no_prices(tiny_llama_config):
    """Days to train on a token count follow from the throughput alone: without prices, and on
    a device no price names, the row has them and no dollars (a new-user check)."""
    from planner.report.sweep import sweep_table
    rows = explore.whatif(tiny_llama_config, cluster="dgx-h100", global_batch=8, seq_len=64,
                          vary={"device": ["h100", "a100-80g"]}, tokens=1e9)
    for r in rows:
        assert r["run_hours"] == pytest.approx(1e9 / r["tokens_per_s"] / 3600)
        assert r["run_cost_usd"] is None and r["cost_per_step_usd"] is None
    head = sweep_table(rows).splitlines()[0]
    assert "days (1 B tokens)" in head and "$ run" not in head and "$/step" not in head
    assert "MFU (own peak)" in head  # two devices, two peaks: MFU does not rank the points
    one = sweep_table(rows[:1]).splitlines()[0]
    assert "MFU" in one and "own peak" not in one
    # a model with routed experts: the MoE runs' held-out error under the table, as plan show
    assert "accuracy: step times of mixtures" not in sweep_table(rows)
    moe = " ".join(sweep_table([{**r, "routed_experts": 8} for r in rows]).split())
    assert "accuracy: step times of mixtures" in moe and "wait for the host" not in moe
    # (the host caveat where a point's MoE layers wait for the host, and only there)
    waits = " ".join(sweep_table([{**r, "routed_experts": 8, "moe_host_wait_s": 0.1}
                                  for r in rows]).split())
    assert "where MoE layers wait for the host, as at some points, a faster precision" in waits
    priced = explore.whatif(tiny_llama_config, cluster="dgx-h100", global_batch=8, seq_len=64,
                            vary={"device": ["h100", "a100-80g"]}, tokens=1e9,
                            prices={"h100": 4.0})
    assert [r["run_hours"] for r in priced] == pytest.approx([r["run_hours"] for r in rows])
    assert priced[0]["run_cost_usd"] > 0 and priced[1]["run_cost_usd"] is None


def test_costs_follow_from_price_time_and_gpus(two_clusters):
    for r in two_clusters:
        price = 4 if r["device"] == "h100" else 2
        assert r["price_per_gpu_hour"] == price
        assert r["cost_per_step_usd"] == pytest.approx(r["gpus"] * price * r["step_time_s"] / 3600)
        tokens_per_step = r["global_batch"] * r["seq_len"]
        assert r["cost_per_mtok_usd"] == pytest.approx(
            r["cost_per_step_usd"] / tokens_per_step * 1e6, rel=1e-4)
        assert r["run_hours"] == pytest.approx(1e9 / r["tokens_per_s"] / 3600)
        assert r["run_cost_usd"] == pytest.approx(r["run_hours"] * r["gpus"] * price)


def test_csv_round_trips(two_clusters, tmp_path):
    path = str(tmp_path / "w.csv")
    write_csv(two_clusters, path)
    with open(path) as f:
        header = f.readline().strip().split(",")
    assert header[:3] == ["model", "point", "cluster"] and "run_cost_usd" in header
    back = read_csv(path)
    assert back == two_clusters


def test_plots_are_written_and_show_the_series(two_clusters, tmp_path):
    paths, skipped = plots.sweep_plots(two_clusters, str(tmp_path / "w.png"))
    assert [p.rsplit("-", 1)[1] for p in paths] == ["scaling.png", "pareto.png", "cost.png"]
    assert skipped == []
    one_size = [r for r in two_clusters if r["gpus"] == two_clusters[0]["gpus"]]
    paths, skipped = plots.sweep_plots(one_size, str(tmp_path / "one.png"))
    assert [p.rsplit("-", 1)[1] for p in paths] == ["pareto.png", "cost.png"]
    assert len(skipped) == 1 and "one-scaling.png" in skipped[0] and "vary nodes" in skipped[0]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    fig = plots.scaling(two_clusters, str(tmp_path / "s.svg"))
    tokens_ax, mfu_ax = fig.axes
    assert [t.get_text() for t in tokens_ax.get_legend().get_texts()] == ["dgx-h100",
                                                                           "dgx-a100-80g"]
    solid = [ln for ln in tokens_ax.get_lines() if ln.get_linestyle() == "-"]
    assert [list(ln.get_xdata()) for ln in solid] == [[8, 16, 32]] * 2
    # the labels at the first and last GPU counts lean inward, not cut at the axes' edge
    lean = {(t.xy[0], t.get_ha()) for t in mfu_ax.texts}
    assert {ha for x, ha in lean if x == 8} == {"left"} and {ha for x, ha in lean if x == 32} \
        == {"right"} and {ha for x, ha in lean if x == 16} == {"center"}
    fig = plots.cost(two_clusters, str(tmp_path / "c.png"))
    assert len(fig.axes) == 3  # $ per step, $ for the run, days for the run
    front = plots.pareto_front(two_clusters)
    for r in two_clusters:  # nothing beats a front point on both axes
        for f in front:
            assert not (r["step_time_s"] < f["step_time_s"] and
                        r["peak_memory_bytes"] < f["peak_memory_bytes"])
    with pytest.raises(SpecError, match="must end in"):
        plots.scaling(two_clusters, str(tmp_path / "s.jpg"))


def test_plots_of_swept_batches_compare_time_per_token_and_say_the_batches(two_clusters,
                                                                          tmp_path):
    """A new-user check: with --vary global_batch=1024,4096 the titles read 'global batch 1024'
    and the Pareto front set a 4096-sample step against a 1024-sample one (its front was the
    smallest batch alone); the run's cost read '$M' over labels like 0.000112."""
    real = next(r for r in two_clusters if r["feasible"])

    def row(batch, step, mem):
        return {**real, "global_batch": batch, "seq_len": 100, "step_time_s": step,
                "peak_memory_bytes": mem * GB, "point": f"global_batch={batch}",
                "run_cost_usd": 112.0, "tokens": 10e9}
    small, large = row(1024, 1.0, 10), row(4096, 3.0, 20)  # the large one: faster per token
    assert plots.pareto_front([small, large]) == [small, large]
    assert plots.pareto_front([small, row(1024, 0.5, 20)]) == [small, row(1024, 0.5, 20)]
    fig = plots.pareto([small, large], str(tmp_path / "p.png"))
    title = fig._suptitle.get_text()  # (Figure.get_suptitle: matplotlib 3.8 on)
    assert "global batch 1,024 or 4,096 x 100 tokens" in title
    assert "time per million tokens against memory" in title
    fig = plots.cost([small, large], str(tmp_path / "c.png"))
    assert fig.axes[1].get_title() == "$ for 10 B tokens"


def test_whatif_command_prints_a_table_and_writes_files(capsys, tiny_llama_config, tmp_path):
    csv_path, png = str(tmp_path / "o.csv"), str(tmp_path / "o.png")
    code = main(["whatif", tiny_llama_config, "--cluster", "dgx-h100", "--vary", "nodes=1,2",
                 "--vary", "tp=1,4", "--global-batch", "32", "--seq-len", "64",
                 "--price-per-gpu-hour", "h100=4", "--csv", csv_path, "--plot", png])
    out, err = capsys.readouterr()
    logging.getLogger("planner").handlers[:] = []
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["point", "GPUs", "configuration"] and "$/step" in lines[0]
    assert lines[1].startswith("nodes=1 tp=1") and "not valid: vary.tp: 4" in lines[2]
    assert len(read_csv(csv_path)) == 4
    assert "o-scaling.png" in out and "o-pareto.png" in out and "o-cost.png" in out
    code = main(["whatif", "gpt2", "--cluster", "dgx-h100", "--vary", "nodez=1"])
    _, err = capsys.readouterr()
    logging.getLogger("planner").handlers[:] = []
    assert code == 2 and "unknown key 'nodez'" in err


def test_a_sweep_where_no_point_fits_prints_its_table_and_exits_3(capsys, tiny_llama_config,
                                                                  tmp_path):
    """As a solve that finds no plan (a new-user check got exit 0 and a table of infeasible rows);
    the trace is announced first (the API's lines are held back in a sweep). 1.06 GB: the default
    reserve (5% and 1 GB) leaves about 7 MB; a device smaller than the reserve is bad input."""
    yaml = tmp_path / "small.yaml"
    yaml.write_text("name: small\nnodes: 1\ngpus_per_node: 2\n"
                    "device: {name: small, memory_GB: 1.06, peak_TFLOPs: {bf16: 100, fp32: 10}, "
                    "hbm_GBps: 1000}\nintra_node: {bandwidth_GBps: 100, latency_us: 5}\n"
                    "inter_node: {bandwidth_GBps: 10, latency_us: 10}\n")
    csv_path, png = tmp_path / "o.csv", tmp_path / "o.png"
    code = main(["whatif", tiny_llama_config, "--cluster", str(yaml), "--vary", "zero=0,3",
                 "--global-batch", "8", "--seq-len", "64", "--csv", str(csv_path),
                 "--plot", str(png)])
    out, err = capsys.readouterr()
    logging.getLogger("planner").handlers[:] = []
    assert code == 3 and "infeasible" in out and "zero=3" in out
    assert "plan: no plan fits: none of the 2 points" in err
    # the table's rows are written; no plot to draw (the same exit with --plot as without)
    assert len(read_csv(str(csv_path))) == 2 and not png.exists()
    assert "not drawn: no feasible point to draw" in out
    assert err.index("what-if: reading or tracing the model at 64 tokens") < err.index("searched")


def test_a_sweep_whose_every_point_is_bad_input_is_an_error(tiny_llama_config):
    """A pin no point can take is bad input (exit 2 from the CLI), not a table of infeasible
    rows; with one valid point the others stay rows with their reason."""
    with pytest.raises(SpecError, match="vary.tp: 3 does not divide"):
        explore.whatif(tiny_llama_config, cluster="dgx-h100", vary={"tp": [3]}, global_batch=8,
                       seq_len=64, workers=1)
    bad, good = explore.whatif(tiny_llama_config, cluster="dgx-h100", vary={"tp": [3, 2]},
                               global_batch=8, seq_len=64, workers=1)
    assert not bad["feasible"] and "vary.tp: 3 does not divide" in bad["reason"]
    assert good["feasible"] and bad["bad_input"] and not good["bad_input"]
    from planner.report.sweep import sweep_table
    assert "not valid: vary.tp: 3 does not divide" in sweep_table([bad, good])
    # a reason too long for the line is cut there and given in full under the table
    text = sweep_table([bad, good], reason_width=20)
    assert "not valid: " + bad["reason"][:17] + "...\n" in text
    assert text.endswith(f"reasons cut short above, in full:\n  tp=3: {bad['reason']}")
    assert "reasons cut short" not in sweep_table([bad, good])


def test_bandwidths_take_a_number_of_gb_per_s_or_units():
    """The node bandwidths read a plain number as GB/s per GPU, and units too; the links between
    sites need a unit, as the sites form of a cluster file does (a new-user check swept
    "1,10" meaning Gb/s and got 8x the bandwidth, unsaid)."""
    from planner.explore.grid import value
    assert value("inter_node_bandwidth", "50GB/s") == value("inter_node_bandwidth", "50") == 50.0
    assert value("intra_node_bandwidth", "800Gbps") == pytest.approx(100.0)
    assert value("inter_region_bandwidth", "1Gbps") == "1Gbps"  # parsed at the point
    with pytest.raises(SpecError, match=r"^vary.inter_region_bandwidth: '10' has no unit \(Gb/s "
                                        r"or GB/s\?\); write it as 10Gbps or 10GB/s$"):
        value("inter_region_bandwidth", "10")


@pytest.mark.parametrize("kw,message", [
    ({"fix": "tp=2", "vary": {"tp": [1, 2]}}, r"vary.tp: also given as tp=2 \(fix\)"),
    ({"nodes": 2, "vary": {"nodes": [1, 2]}}, r"vary.nodes: also given as nodes=2 \(--nodes\)"),
    ({"global_batch": 8, "vary": {"global_batch": [8, 16]}}, "vary.global_batch: also given"),
    ({"optimizer": "sgd", "vary": {"optimizer": ["adam"]}}, "vary.optimizer: also given"),
    ({"engine": "megatron-core,moe_imbalance=2", "vary": {"moe_imbalance": [1, 2]}},
     r"vary.moe_imbalance: also given as moe_imbalance=2 \(engine\)"),
])
def test_a_setting_given_and_varied_is_refused_before_any_trace(kw, message, monkeypatch):
    """One would silently override the other (before, --vary won over --fix)."""
    monkeypatch.setattr(api, "prepare", lambda *a, **k: pytest.fail("traced before the check"))
    kw = {"cluster": "dgx-h100", "global_batch": 8, **kw}
    with pytest.raises(SpecError, match=message):
        explore.whatif("gpt2", **kw)


def test_engine_settings_vary_per_point_on_the_sweeps_engine(tmp_path):
    """Each point runs --engine with its value: a busier expert slows the plan as plan solve
    prices it; a combination the engine refuses is that point's row."""
    config = write_config(tmp_path, {
        "model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
        "vocab_size": 256, "max_position_embeddings": 512, "num_local_experts": 8,
        "num_experts_per_tok": 2})
    cluster, fix = planner.load_cluster("dgx-h100", nodes=1), "ep=2,tp=1,pp=1,dp=8"
    rows = explore.whatif(config, cluster="dgx-h100", nodes=1, global_batch=64, seq_len=64,
                          fix=fix, engine="megatron-core,moe_dispatcher=alltoall",
                          vary={"moe_imbalance": ["1", "2"],
                                "moe_pad_to_capacity": ["false", "true"]})
    assert [r["point"] for r in rows] == [  # (true/false read as the engine reads them: on/off)
        "moe_imbalance=1 moe_pad_to_capacity=off", "moe_imbalance=1 moe_pad_to_capacity=on",
        "moe_imbalance=2 moe_pad_to_capacity=off", "moe_imbalance=2 moe_pad_to_capacity=on"]
    even, busy = rows[0], rows[2]
    assert even["feasible"] and busy["feasible"] and busy["step_time_s"] > even["step_time_s"]
    assert not rows[1]["feasible"] and rows[1]["reason"].startswith(
        "vary.moe_pad_to_capacity: padding to capacity needs a capacity factor")
    # a value out of its range is its point's row too, named as varied
    bad, ok = explore.whatif(config, cluster="dgx-h100", nodes=1, global_batch=64, seq_len=64,
                             fix=fix, vary={"host_op_s": ["1", "1e-5"]})
    assert bad["reason"].startswith("vary.host_op_s: 1.0 seconds per op") and ok["feasible"]
    prepared = planner.prepare(config, seq_len=64, cache_dir=None)
    for row, imbalance in ((even, 1.0), (busy, 2.0)):
        training = planner.TrainingSpec(global_batch=64, seq_len=64, engine=engine_from_mapping(
            f"megatron-core,moe_dispatcher=alltoall,moe_imbalance={imbalance}"))
        solved = planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
            fix=parse_fix(fix)))
        assert row["step_time_s"] == pytest.approx(solved.predicted["step_time_s"], rel=1e-9)


def test_cp_1_points_of_a_sweep_over_the_exchange_form_are_listed_once():
    points = grid.expand({"cp": [1, 2], "cp_comm": ["p2p", "a2a"]})
    assert points == [(("cp", 1),), (("cp", 2), ("cp_comm", "p2p")), (("cp", 2), ("cp_comm", "a2a"))]


def test_scaling_labels_name_context_and_expert_degrees_where_used():
    from planner.report.plots import _degrees
    assert _degrees({"dp": 4, "tp": 2, "pp": 2, "cp": 1, "ep": 8}) == "4·2·2·ep8"
    assert _degrees({"dp": 2, "tp": 1, "pp": 1, "cp": 4, "ep": None}) == "2·1·1·cp4"
    assert _degrees({"dp": 8, "tp": 1, "pp": 1}) == "8·1·1"


def test_a_warning_every_point_gives_is_said_once(tiny_llama_config, caplog):
    """The points' warnings are kept in their rows and said once, with the points that gave it,
    not once per point."""
    with caplog.at_level(logging.WARNING, logger="planner"):
        rows = explore.whatif(tiny_llama_config, cluster="dgx-h100", vary={"nodes": [1, 2]},
                              global_batch=8, seq_len=64, engine="fp8_recipe=block", workers=1)
    assert all("engine.fp8_recipe: block applies to --dtype fp8 only" in r["warnings"]
               for r in rows)
    said = [rec.getMessage() for rec in caplog.records if "fp8_recipe" in rec.getMessage()]
    assert len(said) == 1 and said[0].endswith("(every point)")


def test_odd_sweep_values_and_idle_schedules_are_named():
    """An empty value (--vary nodes=1,,2) or one given twice is refused, not dropped or merged;
    a schedule pinned where the plan has no pipeline is said to change nothing."""
    from planner.explore.grid import expand, parse_vary
    from planner.settings import idle_pins
    with pytest.raises(SpecError, match=r"^vary.nodes: an empty value in '1,,2'"):
        parse_vary(["nodes=1,,2"])
    with pytest.raises(SpecError, match=r"^vary.nodes: 1 given twice"):
        expand({"nodes": [1, 1]})
    with pytest.raises(SpecError, match=r"^vary.tp: 2 given twice"):
        expand({"tp": ["2", 2]})
    # the same bandwidth in two spellings, either link (a new-user check)
    with pytest.raises(SpecError, match=r"^vary.inter_node_bandwidth: 400Gb/s and 50GB/s are the "
                                        r"same value; list each value once$"):
        expand({"inter_node_bandwidth": ["400Gb/s", "50GB/s"]})
    with pytest.raises(SpecError, match=r"^vary.inter_region_bandwidth: 10Gbps and 1.25GB/s are "
                                        r"the same value"):
        expand({"inter_region_bandwidth": ["10Gbps", "1.25GB/s"]})
    # engine settings read as the engine reads them (a review: true and on swept twice)
    for key, values in (("moe_overlap", ["true", "on"]), ("moe_capacity_factor", ["1.25", "1.250"]),
                        ("moe_dispatcher", ["DeepEP", "deepep"])):
        with pytest.raises(SpecError, match=rf"^vary.{key}: {values[0]} and {values[1]} are the "
                                            "same value"):
            expand({key: values})
    assert len(expand({"nodes": [1, 2], "tp": [1, 2]})) == 4
    assert idle_pins({"schedule": "zb-h1", "pp": 1}, 1, 1) == [
        "fix.schedule=zb-h1 is not used: the plan chosen has no pipeline (pp=1); leave the "
        "schedule out, or pin pp > 1"]
    assert "pin pp too (e.g. pp=2,schedule=zb-h1)" in idle_pins({"schedule": "zb-h1"}, 1, 1)[0]
    assert idle_pins({"schedule": "zb-h1"}, 1, 2) == [] == idle_pins({"schedule": "1f1b"}, 1, 1)
    # GPipe holds every micro-batch's activations even without a pipeline: it changes memory
    assert idle_pins({"schedule": "gpipe"}, 1, 1) == []
    # a plan's own parallel (a valid fix) records cp_comm=p2p at cp=1: nothing to say of it
    assert idle_pins({"cp": 1, "cp_comm": "p2p"}, 1) == [] != idle_pins({"cp_comm": "p2p"}, 1)
    # ZeRO with one replica (a new-user check: zero 0 -> 3 at dp=1 was "as long", unsaid)
    assert idle_pins({"zero": 3, "dp": 1}, 1, 1, 1) == [
        "fix.zero=3 is not used: the plan chosen has one data-parallel replica (dp=1, cp=1), and "
        "ZeRO shards over the dp x cp ranks; leave zero out, or pin dp > 1"]
    assert "pin dp too" in idle_pins({"zero": 1}, 1, 1, 1)[0]
    assert idle_pins({"zero": 3}, 2, 1, 1) == [] == idle_pins({"zero": 3}, 1, 1, 2) \
        == idle_pins({"zero": 0}, 1, 1, 1) == idle_pins({"zero": 3}, 1, 1)  # (dp not known)


def test_an_infeasible_point_names_its_varied_pins_to_relax():
    """'relax --fix' of a point whose pins came from --vary names them (a new-user check)."""
    from types import SimpleNamespace
    task = SimpleNamespace(point=(("tp", 8), ("nodes", 2)), options=SimpleNamespace(
        fix={"tp": 8, "pp": 1}))
    assert explore._relax_varied(task, "no plan fits: ...; relax --fix") == \
        "no plan fits: ...; relax this point's tp=8 or --fix"
    alone = SimpleNamespace(point=(("tp", 8),), options=SimpleNamespace(fix={"tp": 8}))
    assert explore._relax_varied(alone, "x; relax --fix") == "x; relax this point's tp=8"
    unvaried = SimpleNamespace(point=(("nodes", 2),), options=SimpleNamespace(fix={"tp": 8}))
    assert explore._relax_varied(unvaried, "x; relax --fix") == "x; relax --fix"


def test_the_link_between_device_groups_can_be_varied_and_a_plain_cluster_says_what_to_vary():
    groups = {"name": "mixed", "inter_node": {"bandwidth_GBps": 12.5, "latency_us": 10},
              "groups": [{"name": n, "device": d, "nodes": 1, "gpus_per_node": 2,
                          "intra_node": {"bandwidth_GBps": 300, "latency_us": 3}}
                         for n, d in (("a", "a100-80g"), ("b", "v100"))]}
    point = {"cluster": groups, "nodes": None, "gpus_per_node": None,
             "inter_region_bandwidth": "100Gbps"}
    assert grid.point_cluster(point).inter_group.bandwidth_bytes_per_s == 12.5e9
    with pytest.raises(SpecError, match=r"^vary.inter_region_bandwidth: applies to a cluster of "
                                        r"sites or of device groups .* vary inter_node_bandwidth"):
        grid.point_cluster({**point, "cluster": "dgx-h100"})


def test_warnings_alike_but_for_their_figures_are_said_once(caplog):
    """A warning that names a share of the step per point (the overlap's hint in an ep sweep) is
    one warning, in the first point's words, not one per point (a new-user check read seven)."""
    from planner.explore.sweep import _say_warnings

    rows = [{"point": f"ep={e}", "warnings": f"engine.moe_overlap: off; it would hide {s}% of "
             "the step | plain warning"} for e, s in ((2, 3.5), (4, 7.25), (8, 12))]
    rows.append({"point": "ep=16", "warnings": None})
    with caplog.at_level(logging.WARNING, logger="planner"):
        _say_warnings(rows)
    said = [rec.getMessage() for rec in caplog.records]
    assert said == [
        "engine.moe_overlap: off; it would hide 3.5% of the step (3 of 4 points: ep=2, ep=4, "
        "ep=8; in the words of ep=2, other figures elsewhere)",
        "plain warning (3 of 4 points: ep=2, ep=4, ep=8)"]
    caplog.clear()  # one point giving it twice with other figures counts once
    with caplog.at_level(logging.WARNING, logger="planner"):
        _say_warnings([{"point": "a", "warnings": "w on stage 1 | w on stage 2"},
                       {"point": "b", "warnings": None}])
    assert [rec.getMessage() for rec in caplog.records] == [
        "w on stage 1 (1 of 2 points: a; in the words of a, other figures elsewhere)"]


def test_a_price_key_matching_several_devices_names_those_it_matches():
    """A new-user check: 'a100' against a sweep of a100-40g, a100-80g and h100 listed h100 among
    the matches ('matches several device')."""
    with pytest.raises(SpecError, match=r"^price_per_gpu_hour.a100: matches several devices of "
                                        r"the sweep \(a100-40g, a100-80g\); name each of them$"):
        costs.resolve_prices({"a100": 2.0}, ["a100-40g", "a100-80g", "h100"])
    assert costs.resolve_prices({"a100-80g": 2.0, "h1": 4.0}, ["a100-80g", "h100"]) == {
        "a100-80g": 2.0, "h100": 4.0}


def test_a_varied_knobs_refusal_is_worded_as_varied():
    """A new-user check read 'pin cp_comm=p2p or allgather' in a --vary cp_comm row."""
    from planner.explore.sweep import _as_varied

    assert _as_varied((("cp_comm", "a2a"),), "fix.cp_comm: a2a needs more heads; pin "
                      "cp_comm=p2p or allgather") == ("vary.cp_comm: a2a needs more heads; give "
                                                      "cp_comm=p2p or allgather")
    assert _as_varied((("tp", 2),), "fix.cp_comm: pin cp_comm=p2p") == "fix.cp_comm: pin " \
        "cp_comm=p2p"  # (a pin of the sweep's, not a varied knob: as solve words it)


def test_whatif_takes_across_sites_as_plan_solve_does(tiny_llama_config, tmp_path):
    """A new-user check found no --across-sites in plan whatif: every point is planned with it,
    as plan solve plans; a cluster that is not sites refuses anything but auto."""
    site = ("{{name: {}, device: h100, nodes: 1, gpus_per_node: 8, "
            "intra_node: {{bandwidth: 900GB/s, latency: 3us}}, "
            "inter_node: {{bandwidth: 400Gbps, latency: 5us}}}}")
    path = tmp_path / "sites.yaml"
    path.write_text("name: two\nsites:\n" + "".join(f"  - {site.format(n)}\n" for n in "ab")
                    + "links:\n  - {between: [a, b], bandwidth: 1Gbps, latency: 1ms, per: site}\n")

    def rows(across):
        return explore.whatif(tiny_llama_config, cluster=str(path), global_batch=64,
                              seq_len=64, vary={"inter_region_bandwidth": ["1Gbps"]},
                              across_sites=across)

    (replicated,) = rows("replicas")
    (piped,) = rows("pipeline")
    assert replicated["dp_replicate"] == 2 and piped["dp_replicate"] == 1
    with pytest.raises(SpecError, match=r"^across_sites: pipeline applies to a cluster of sites"):
        explore.whatif(tiny_llama_config, cluster="dgx-h100", global_batch=64, seq_len=64,
                       vary={"nodes": [1, 2]}, across_sites="pipeline")


def test_a_point_slower_with_more_gpus_is_said_under_the_table():
    """More GPUs that step slower than fewer (a batch too small to split over them) get a line
    naming the faster point with fewer; points that differ in another knob are not compared (a
    new-user check saw 64 GPUs slower than 32 with no word)."""
    from planner.report.sweep import sweep_table

    def row(point, gpus, step):
        return {"point": point, "gpus": gpus, "feasible": True, "step_time_s": step,
                "tokens_per_s": 1.0, "mfu": 0.1, "peak_memory_bytes": 1e9, "dp": 1, "tp": 1,
                "pp": 1, "micro_batch": 1, "num_microbatches": 1, "schedule": "1f1b",
                "recompute": "none", "zero": 0}

    rows = [row("nodes=4", 32, 0.00298), row("nodes=8", 64, 0.00331),
            row("nodes=2 dtype=fp8", 16, 0.001), row("nodes=8 dtype=fp8", 64, 0.0009)]
    text = " ".join(sweep_table(rows).split())
    assert ("nodes=8 (64 GPUs) steps slower than nodes=4 (32 GPUs): 0.00331 s against 0.00298 s"
            in text)
    assert text.count("steps slower than") == 1  # fp8's points are faster with more; not mixed
    assert "steps slower than" not in sweep_table(rows[:1] + rows[2:])
