"""Calibration: measured numbers replace data-sheet ones, and the profiler produces them."""

import json

import pytest

import planner.profile.device as prof
from costmodels.compute import gemm_time_s
from costmodels.hardware import measured_rate
from planner import load_cluster
from planner.inputs.calibration import apply_calibration, load_calibration
from planner.errors import SpecError

CALIB = {
    "schema": "planner.calibration/v1", "device_kind": "cpu", "device_name": "test", "threads": 1,
    "device": {"peak_TFLOPs": {"fp32": 0.1}, "hbm_GBps": 10.0, "kernel_overhead_us": 5.0,
               "attention_efficiency": {"fp32": 0.5},
               "gemm_table": {"fp32": [[1e6, 2e10], [1e9, 1e11]]}},
    "intra_node": {"bandwidth_GBps": 0.5, "latency_us": 300.0, "processes": 2, "backend": "gloo"},
}


def test_apply_replaces_device_and_link():
    c = apply_calibration(load_cluster("cpu"), CALIB)
    assert c.device.peak("fp32") == pytest.approx(1e11)
    assert c.device.hbm_bytes_per_s == pytest.approx(1e10)
    assert c.device.matmul_efficiency == 1.0 and c.device.memory_efficiency == 1.0
    assert c.intra_node.bandwidth_bytes_per_s == pytest.approx(5e8)
    assert c.intra_node.latency_s == pytest.approx(3e-4)
    assert c.device.kernel_overhead_s == pytest.approx(5e-6)
    assert c.intra_node.sync_s == 0.0  # not measured: nothing added
    synced = apply_calibration(load_cluster("cpu"), {**CALIB, "intra_node": {
        **CALIB["intra_node"], "sync_us": 900.0}})
    assert synced.intra_node.sync_s == pytest.approx(9e-4)


def test_a_calibrated_cpu_is_still_the_host(tiny_llama_config):
    """A new-user check saw --calibration bring back optimizer offload on the cpu preset (its
    processes step the optimizer in host memory already), priced as if it moved states away."""
    import planner

    c = apply_calibration(load_cluster("cpu", gpus_per_node=2), CALIB)
    assert c.device.is_host and load_cluster("cpu").device.is_host
    assert not load_cluster("dgx-h100").device.is_host
    with pytest.raises(SpecError, match=r"fix\.offload_optimizer: the cpu cluster's processes "
                                        r"step the optimizer in host memory already"):
        planner.plan(tiny_llama_config, cluster="cpu", gpus_per_node=2, global_batch=8,
                     seq_len=64, dtype="fp32", calibration=CALIB, fix="offload_optimizer=true")
    p = planner.plan(tiny_llama_config, cluster="cpu", gpus_per_node=2, global_batch=8,
                     seq_len=64, dtype="fp32", calibration=CALIB)
    assert not p.parallel["offload_optimizer"]
    with pytest.raises(SpecError, match=r"device_kind: expected cpu or cuda \(what `plan "
                                        r"profile` measures\), got 'tpu'"):
        apply_calibration(load_cluster("cpu"), {**CALIB, "device_kind": "tpu"})


def test_measured_point_to_point_messages_price_sends():
    from costmodels.comm import p2p_s

    plain = apply_calibration(load_cluster("cpu"), CALIB).intra_node
    assert plain.p2p_latency_s is None  # not measured: the all-reduce fit's figures
    assert p2p_s(1e6, plain) == pytest.approx(3e-4 + 1e6 / 5e8)
    link = apply_calibration(load_cluster("cpu"), {**CALIB, "intra_node": {
        **CALIB["intra_node"], "sync_us": 100.0, "p2p_latency_us": 50.0,
        "p2p_bandwidth_GBps": 2.0}}).intra_node
    assert (link.p2p_latency_s, link.p2p_bytes_per_s) == (pytest.approx(5e-5), pytest.approx(2e9))
    assert p2p_s(1e6, link) == pytest.approx(1e-4 + 5e-5 + 1e6 / 2e9)  # busy sync still paid
    assert link.p2p_sync_s is None  # not measured: a send pays the collectives' sync_us
    paired = apply_calibration(load_cluster("cpu"), {**CALIB, "intra_node": {
        **CALIB["intra_node"], "sync_us": 100.0, "p2p_latency_us": 50.0,
        "p2p_bandwidth_GBps": 2.0, "p2p_sync_us": 700.0}}).intra_node
    assert (paired.sync_s, paired.p2p_sync_s) == (pytest.approx(1e-4), pytest.approx(7e-4))
    assert p2p_s(1e6, paired) == pytest.approx(7e-4 + 5e-5 + 1e6 / 2e9)
    with pytest.raises(SpecError, match=r"intra_node.p2p_sync_us: expected a non-negative "
                                        r"number, got -1"):
        apply_calibration(load_cluster("cpu"), {**CALIB, "intra_node": {
            **CALIB["intra_node"], "p2p_sync_us": -1}})
    with pytest.raises(SpecError, match=r"intra_node.p2p_bandwidth_GBps: expected a positive "
                                        r"number, got 0"):
        apply_calibration(load_cluster("cpu"), {**CALIB, "intra_node": {
            **CALIB["intra_node"], "p2p_latency_us": 50.0, "p2p_bandwidth_GBps": 0}})


def test_a_calibration_prices_only_the_kind_of_device_it_was_measured_on(caplog):
    with pytest.raises(SpecError, match=r"measured on a CPU \(test\), but the cluster's device "
                                        r"is h100; run `plan profile` on that device"):
        apply_calibration(load_cluster("dgx-h100"), CALIB)
    gpu = {**CALIB, "device_kind": "cuda", "device_name": "NVIDIA A100-SXM4-80GB"}
    with pytest.raises(SpecError, match="measured on a GPU"):
        apply_calibration(load_cluster("cpu"), gpu)
    with caplog.at_level("WARNING", logger="planner"):
        apply_calibration(load_cluster("dgx-a100-80g"), gpu)
    assert not caplog.records  # the same GPU model: no warning
    with caplog.at_level("WARNING", logger="planner"):
        c = apply_calibration(load_cluster("dgx-h100"), gpu)  # another GPU model: used, said
    assert "measured on NVIDIA A100-SXM4-80GB, the cluster's device is h100" in caplog.text
    assert c.device.name == "h100 (calibrated)"


def test_gemm_time_uses_the_measured_table():
    dev = apply_calibration(load_cluster("cpu"), CALIB).device
    table = dev.gemm_table["fp32"]
    assert measured_rate(table, 1e3) == 2e10  # flat below the table
    assert measured_rate(table, 1e12) == 1e11  # flat above
    mid = measured_rate(table, 10 ** 7.5)  # halfway in log space
    assert mid == pytest.approx(6e10)
    n = 1000  # 2e9 FLOPs: above the table, at 1e11 FLOP/s
    assert gemm_time_s(1, n, n, n, dev, "fp32") == pytest.approx(2e9 / 1e11)


def test_bad_calibration_files(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_calibration(str(tmp_path / "none.json"))
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(SpecError, match="not a calibration"):
        load_calibration(str(p))
    bad = json.loads(json.dumps(CALIB))
    del bad["device"]["gemm_table"]
    with pytest.raises(SpecError, match="device.gemm_table is missing"):
        load_calibration(bad)
    # (fuzz seed 1306, case 847: a device that is a number raised TypeError)
    with pytest.raises(SpecError, match=r": device must be a mapping of the measured figures, got "
                                        r"float; re-run `plan profile`$"):
        load_calibration({**CALIB, "device": float("nan")})


def test_profile_measures_this_cpu(monkeypatch):
    monkeypatch.setattr(prof, "GEMM_SIZES", (32, 64, 128))
    monkeypatch.setattr(prof, "MEMORY_SIZES", (1 << 12, 1 << 14))
    monkeypatch.setattr(prof, "GRID_SIZES", {"cpu": (8, 64)})
    monkeypatch.setattr(prof, "ATTENTION_SIZES", {"cpu": ((4, 32), (4, 64))})
    calib = prof.profile("cpu", threads=1, processes=1)
    load_calibration(calib)  # the profiler's output is a valid calibration
    dev = calib["device"]
    assert len(dev["gemm_table"]["fp32"]) == 3
    assert all(rate > 1e8 for _, rate in dev["gemm_table"]["fp32"])  # > 0.1 GFLOP/s
    grid = dev["gemm_grid"]
    assert grid["sizes"] == [8, 64] and len(grid["tables"]["fp32"]) == 2
    assert all(rate > 1e6 for a in grid["tables"]["fp32"] for b in a for rate in b)
    assert dev["hbm_GBps"] > 0.1 and 0 < dev["kernel_overhead_us"] < 1e4
    assert [b for b, _ in dev["memory_table"]] == sorted(b for b, _ in dev["memory_table"])
    assert all(rate > 1e8 for _, rate in dev["memory_table"])
    attn = dev["attention_table"]["fp32"]
    assert sorted(attn) == ["causal_bwd", "causal_fwd", "full_bwd", "full_fwd"]
    assert [f for f, _ in attn["causal_fwd"]] == [4.0 * 4 * 32 * 32 * 64, 4.0 * 4 * 64 * 64 * 64]
    # the backward is never taken faster than the forward
    assert all(b <= f for (_, f), (_, b) in zip(attn["full_fwd"], attn["full_bwd"]))
    assert calib["intra_node"] is None
    assert calib["processes"] == 1 and dev["jitter"] == 0.0  # one process: nobody to wait for
    # how far a second profile may land: each measurement's repeats, summarized
    spread = dev["repeat_spread"]
    assert 0 <= spread["median"] <= spread["max"] < 10
    c = apply_calibration(load_cluster("cpu"), calib)
    assert c.device.peak("fp32") == pytest.approx(max(r for _, r in dev["gemm_table"]["fp32"]))


def test_warns_when_the_cluster_runs_another_number_of_cpu_processes(caplog):
    calib = {**CALIB, "processes": 2}
    with caplog.at_level("WARNING", logger="planner.inputs.calibration"):
        apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=2), calib)
    assert not caplog.records
    with caplog.at_level("WARNING", logger="planner.inputs.calibration"):
        apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=1), calib)
    assert "plan profile --processes 1" in caplog.text


TABLE = {"causal_fwd": [[1e6, 2e9], [1e8, 4e10]], "causal_bwd": [[1e6, 1e9], [1e8, 1.6e10]],
         "full_fwd": [[1e6, 2e9], [1e8, 2e10]], "full_bwd": [[1e6, 1e9], [1e8, 8e9]]}
"""Square FLOPs per second: a causal call skips half of a large square, nothing of a small one."""


def test_attention_priced_at_the_rate_of_its_call_size():
    from costmodels.attention import attention_time_s, ring_attention_s
    from costmodels.engine import EngineSpec
    from costmodels.workload import BlockWork

    calib = json.loads(json.dumps(CALIB))
    calib["device"]["attention_table"] = {"fp32": TABLE}
    dev = apply_calibration(load_cluster("cpu"), calib).device
    flash = EngineSpec(attention="flash")
    causal = BlockWork(fused_attn_flops=1e8, attn_flops=1e8, attn_causal_flops=1e8,
                       fused_attn_calls=1)
    # one call of 1e8 square FLOPs per sample, at the large-call rates of the table
    assert attention_time_s(causal, dev, "fp32", flash, micro_batch=1, tp=1) == pytest.approx(
        (1e8 / 4e10, 1e8 / 1.6e10))
    # two calls of half the size each run at the rate of their size (log-linear in the table)
    two = BlockWork(fused_attn_flops=1e8, attn_flops=1e8, attn_causal_flops=1e8,
                    fused_attn_calls=2)
    half_rate = measured_rate(tuple(map(tuple, TABLE["causal_fwd"])), 5e7)
    assert attention_time_s(two, dev, "fp32", flash, micro_batch=1, tp=1)[0] == pytest.approx(
        1e8 / half_rate)
    # a ring of 2 ranks calls the kernel per chunk pair (1/16 of the call): slower here, and
    # nothing extra without a measured table
    f, b = ring_attention_s(causal, dev, "fp32", flash, micro_batch=1, tp=1, cp=2)
    assert f > 0 and b > 0
    sheet = load_cluster("cpu").device
    assert ring_attention_s(causal, sheet, "fp32", flash, micro_batch=1, tp=1, cp=2) == (0, 0)
    bad = json.loads(json.dumps(calib))
    del bad["device"]["attention_table"]["fp32"]["full_bwd"]
    with pytest.raises(SpecError, match="attention_table.fp32: full_bwd is missing"):
        apply_calibration(load_cluster("cpu"), bad)


def test_a_measurements_spread_is_its_interquartile_range_over_its_median():
    from planner.profile.timing import spread_of

    assert spread_of([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert spread_of([1.0, 2.0]) == 0.0  # too few repeats to say
    # quartiles (exclusive method) of 1..8: 2.25 and 6.75; median 4.5
    assert spread_of([float(x) for x in range(1, 9)]) == pytest.approx(4.5 / 4.5)
    assert spread_of([10.0, 10.0, 10.0, 10.0, 30.0]) == pytest.approx(10.0 / 10.0)


def test_a_cpu_calibration_keeps_its_threads_and_a_noisy_one_is_said(caplog):
    """The threads it measured with travel with the device (plan run's default, so that a run
    computes as the calibration did); a calibration whose repeats spread by more than 10% on
    median was taken on a busy machine, and planning with it says so (a new-user check planned
    with one at 12% and read its plans 14-44% off)."""
    from costmodels.hardware import device_from_mapping, device_mapping
    c = apply_calibration(load_cluster("cpu"), {**CALIB, "threads": 2})
    assert c.device.threads == 2 and device_mapping(c.device)["threads"] == 2
    assert device_from_mapping(device_mapping(c.device)).threads == 2
    assert load_cluster("cpu").device.threads == 0 and "threads" not in device_mapping(
        load_cluster("cpu").device)
    with pytest.raises(SpecError, match=r"^device.threads: expected a whole number"):
        device_from_mapping({**device_mapping(c.device), "threads": 1.5})
    quiet = {**CALIB, "device": {**CALIB["device"], "repeat_spread": {"median": 0.04,
                                                                       "max": 3.0}}}
    noisy = {**CALIB, "device": {**CALIB["device"], "repeat_spread": {"median": 0.12,
                                                                       "max": 69.3}}}
    with caplog.at_level("WARNING", logger="planner.inputs.calibration"):
        apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=2), quiet)
    assert "busy" not in caplog.text
    with caplog.at_level("WARNING", logger="planner.inputs.calibration"):
        apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=2), noisy)
    assert "calibration: its repeated measurements spread by 12% on median (more than 10%): " \
        "the machine was busy while it measured" in caplog.text


def test_a_calibrated_link_keeps_its_presets_share_for_alltoalls():
    """The calibration measures the all-reduce's bandwidth; on NVLink all-to-alls reach less of
    the line (costmodels.topology), and keep that share of the measured figure."""
    h100 = load_cluster("dgx-h100")
    link = {"bandwidth_GBps": 370.0, "latency_us": 3.0, "processes": 8, "backend": "nccl"}
    c = apply_calibration(h100, {**CALIB, "device_kind": "cuda", "intra_node": link})
    assert c.intra_node.efficiency == 1.0
    assert c.intra_node.alltoall_efficiency == pytest.approx(0.68 / 0.82)
    assert c.intra_node.alltoall_bytes_per_s == pytest.approx(370e9 * 0.68 / 0.82)
    cpu = apply_calibration(load_cluster("cpu"), CALIB)  # no figure of its own: as measured
    assert cpu.intra_node.alltoall_bytes_per_s == cpu.intra_node.effective_bytes_per_s


def test_a_calibrated_plan_is_re_priced_with_its_calibration(tiny_llama_config, tmp_path):
    """A new-user check saw `plan show --why` re-price a calibrated plan's own configuration 26%
    faster: its cluster's device mapping keeps what a cluster file can set, not the measured
    GEMM table. The plan records the calibration, and its configuration re-prices the same,
    written and read back; the cluster is named calibrated once."""
    import planner
    from planner.explore.whynot import why_not
    from planner.inputs.clusters import planned_cluster
    from planner.planfile.document import load_plan

    p = planner.plan(tiny_llama_config, cluster="cpu", gpus_per_node=2, global_batch=8,
                     seq_len=64, dtype="fp32", calibration=CALIB, fix="dp=2,micro_batch=4")
    assert p.cluster["calibration"] == load_calibration(CALIB)
    from planner.report.summary import summary
    shown = summary(p)  # CPU processes, not GPUs
    assert "TFLOP/s per process" in shown and "per process of" in shown and "per GPU" not in shown
    path = tmp_path / "plan.json"
    p.save(str(path))
    again = load_plan(str(path))
    cluster = planned_cluster(again.cluster, "why")
    assert cluster.name == "cpu+calibration"
    assert cluster.device.name == "cpu (calibrated)"
    assert cluster.device.gemm_table == apply_calibration(load_cluster("cpu"), CALIB
                                                          ).device.gemm_table
    answer = why_not(again, "dp=2,micro_batch=4")
    assert answer.variant.step_time_s == pytest.approx(p.step_time_s, rel=1e-6)
    bare = dict(again.cluster)
    bare.pop("calibration")  # as a plan written before: the data sheet's figures
    assert planned_cluster(bare, "why").device.gemm_table != cluster.device.gemm_table
