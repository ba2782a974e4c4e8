"""Waiting for the slowest process: the jitter `plan profile` measures and what plans charge for
it; and the runtime's host-memory setting."""

import json
import math
import platform

import pytest

import planner
from costmodels.compute import expected_max_normal, straggler_excess
from costmodels.engine import EngineSpec
from planner import load_cluster
from planner.inputs.calibration import apply_calibration
from planner.runtime.host_memory import keep_freed_memory
from planner.options import parse_fix
from planner.profile.device import jitter

CALIB = {
    "schema": "planner.calibration/v1", "device_kind": "cpu", "device_name": "test", "threads": 1,
    "device": {"peak_TFLOPs": {"fp32": 0.1}, "hbm_GBps": 10.0, "kernel_overhead_us": 5.0,
               "attention_efficiency": {"fp32": 0.5},
               "gemm_table": {"fp32": [[1e6, 2e10], [1e9, 1e11]]}, "jitter": 0.1},
    "intra_node": {"bandwidth_GBps": 0.5, "latency_us": 300.0, "processes": 2, "backend": "gloo"},
}


def test_expected_maximum_of_normal_draws():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(4) == pytest.approx(1.029375, rel=1e-5)  # tabulated order statistic
    values = [expected_max_normal(n) for n in (2, 3, 8, 64, 1024)]
    assert values == sorted(values) and values[-1] < 3.5  # grows like sqrt(2 ln n)


def test_jitter_from_segment_times_inverts_to_the_measured_excess():
    steady = [[0.02] * 10, [0.02] * 10]
    assert jitter(steady) == 0.0
    assert jitter([[0.02] * 10]) == 0.0  # one process: nothing to wait for
    slow_one = [[1.0] * 10, [1.2] * 10]  # one of two processes 20% slower in every segment
    j = jitter(slow_one)
    assert j == pytest.approx((1.2 / 1.1 - 1) / expected_max_normal(2))
    dev = apply_calibration(load_cluster("cpu"), {**CALIB, "device": {**CALIB["device"],
                                                                      "jitter": j}}).device
    assert straggler_excess(dev, 2) == pytest.approx(1.2 / 1.1 - 1)  # the measurement, back
    assert straggler_excess(dev, 1) == 0.0
    assert straggler_excess(dev, 8) > straggler_excess(dev, 2)


def _predicted(fp32_llama, fix: str, calib) -> dict:
    procs = math.prod(int(kv.split("=")[1]) for kv in fix.split(",") if kv[:3] in ("dp=", "tp=",
                                                                                  "pp="))
    cluster = apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=procs), calib)
    training = planner.TrainingSpec(global_batch=4, seq_len=32, dtype="fp32", optimizer="adamw",
                                    engine=EngineSpec(overlap_grad_reduce=False))
    plan = planner.plan_prepared(fp32_llama, cluster, training,
                                 planner.SearchOptions(fix=parse_fix(fix), top_k=0))
    return plan.predicted


@pytest.mark.parametrize("fix", [
    "dp=2,tp=1,pp=1,micro_batch=2,zero=0",
    "dp=1,tp=2,pp=1,micro_batch=4,zero=0",
    "dp=1,tp=1,pp=2,micro_batch=1,zero=0,schedule=1f1b",
])
def test_synchronized_processes_pay_for_the_slowest(fp32_llama, fix):
    fix += ",recompute=none,offload_optimizer=false"
    steady = json.loads(json.dumps(CALIB))
    steady["device"]["jitter"] = 0.0
    a, b = _predicted(fp32_llama, fix, steady), _predicted(fp32_llama, fix, CALIB)
    assert a["breakdown"]["straggler_s"] == 0.0
    bd = b["breakdown"]
    local = bd["compute_s"] + bd["optimizer_s"]
    assert bd["straggler_s"] == pytest.approx(0.1 * expected_max_normal(2) * local, rel=1e-4)
    assert b["step_time_s"] == pytest.approx(a["step_time_s"] + bd["straggler_s"], rel=1e-4)


def test_one_process_waits_for_nobody(fp32_llama):
    fix = "dp=1,tp=1,pp=1,micro_batch=4,zero=0,recompute=none,offload_optimizer=false"
    steady = json.loads(json.dumps(CALIB))
    steady["device"]["jitter"] = 0.0
    assert _predicted(fp32_llama, fix, CALIB)["breakdown"]["straggler_s"] == 0.0
    assert (_predicted(fp32_llama, fix, CALIB)["step_time_s"]
            == pytest.approx(_predicted(fp32_llama, fix, steady)["step_time_s"]))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_runtime_keeps_freed_host_memory_under_glibc():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # idempotent
