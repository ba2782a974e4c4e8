"""What a call costs more between ranks busy computing (`plan profile` on CPUs): the measuring
loop, and how a collective's and a send/receive pair's figures reach the calibration."""

import time

import pytest

from planner.profile import collectives


class _NoGroup:
    """Stands for torch.distributed in one process: the barrier has no one to wait for."""

    def barrier(self):
        pass


class _SteadyTorch:
    """Stands for torch in the loop: each GEMM takes 0.5 ms, whatever else the machine runs."""

    @staticmethod
    def randn(*shape):
        return None

    @staticmethod
    def mm(a, b):
        time.sleep(5e-4)


def test_busy_call_measures_what_the_call_adds_to_compute(monkeypatch):
    monkeypatch.setattr(collectives, "SYNC_ITERS", 5)
    monkeypatch.setattr(collectives, "SYNC_ROUNDS", 3)
    monkeypatch.setattr(collectives, "torch", _SteadyTorch)
    added = collectives.busy_call_s(_NoGroup(), lambda: time.sleep(0.004))
    assert 0.0035 < added < 0.008  # the call's 4 ms, not the 3 ms of GEMMs around it
    assert collectives.busy_call_s(_NoGroup(), lambda: None) < 0.0015


def _results(sync_s, p2p_sync_s):
    ar = [[b, 1e-4 + b / 1e9] for b in collectives.COLLECTIVE_BYTES]
    p2p = [[b, 5e-5 + b / 2e9] for b in collectives.COLLECTIVE_BYTES]
    return {"all_reduce": ar, "reduce_scatter": ar, "all_gather": ar, "p2p": p2p,
            "sync": sync_s, "p2p_sync": p2p_sync_s}


def test_the_busy_exchange_is_kept_beyond_the_point_to_point_fit(monkeypatch):
    """2 ranks: the exchange's fit says 50 us + 1 KB / 2 GB/s; measured 2.05 ms between busy
    ranks, the calibration keeps the rest (about 2 ms) as p2p_sync_us, apart from sync_us (the
    all-reduce's)."""
    monkeypatch.setattr(collectives, "gather", lambda *a, **k: [_results(1.2e-3, 2.05e-3)])
    link = collectives.collectives(2, "gloo")
    fit = link["p2p_latency_us"] + collectives.SYNC_BYTES / (link["p2p_bandwidth_GBps"] * 1e3)
    assert link["p2p_sync_us"] == pytest.approx(2050 - fit, rel=1e-6)
    assert 1900 < link["p2p_sync_us"] < 2000
    assert 1000 < link["sync_us"] < 1200
    # an exchange no slower than the fit adds nothing (never a negative cost)
    monkeypatch.setattr(collectives, "gather", lambda *a, **k: [_results(1.2e-3, 1e-5)])
    assert collectives.collectives(2, "gloo")["p2p_sync_us"] == 0.0


CALIB = {
    "schema": "planner.calibration/v1", "device_kind": "cpu", "device_name": "test", "threads": 1,
    "device": {"peak_TFLOPs": {"fp32": 0.1}, "hbm_GBps": 10.0, "kernel_overhead_us": 5.0,
               "attention_efficiency": {"fp32": 0.5},
               "gemm_table": {"fp32": [[1e6, 2e10], [1e9, 1e11]]}},
    "intra_node": {"bandwidth_GBps": 0.5, "latency_us": 300.0, "processes": 2, "backend": "gloo",
                   "sync_us": 1000.0},
}


@pytest.mark.parametrize("fix", ["dp=1,tp=1,pp=2,micro_batch=1,schedule=gpipe",
                                 "dp=1,tp=1,pp=1,cp=2,cp_comm=p2p,micro_batch=2"])
def test_sends_between_busy_ranks_pay_the_measured_pair(fp32_llama, fix):
    """A pipeline's sends and a context-parallel ring's exchanges pay p2p_sync_us where it was
    measured (here 3 ms against the all-reduce's 1 ms): the step grows by a whole number of
    2 ms differences, at least one per send; a plan without sends does not move."""
    import planner
    from planner import load_cluster
    from planner.inputs.calibration import apply_calibration
    from planner.options import parse_fix

    def step(calib, fixed):
        cluster = apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=2), calib)
        training = planner.TrainingSpec(global_batch=4, seq_len=32, dtype="fp32",
                                        optimizer="adamw")
        pins = parse_fix(fixed + ",zero=0,recompute=none,offload_optimizer=false")
        return planner.plan_prepared(fp32_llama, cluster, training,
                                     planner.SearchOptions(fix=pins, top_k=0)).step_time_s

    paired = {**CALIB, "intra_node": {**CALIB["intra_node"], "p2p_sync_us": 3000.0}}
    grown = (step(paired, fix) - step(CALIB, fix)) / 2e-3
    assert grown >= 1.0 and grown == pytest.approx(round(grown), abs=1e-3)
    dp = "dp=2,tp=1,pp=1,micro_batch=2"  # an all-reduce only: sync_us
    assert step(paired, dp) == pytest.approx(step(CALIB, dp))
