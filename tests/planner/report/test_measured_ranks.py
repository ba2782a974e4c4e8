"""`plan run`'s per-rank table names each rank's place on every axis the plan splits."""

import pytest

from planner.report.measured import summary


def _result(ranks):
    measured = {"warmup_steps": 1, "step_time_s": 0.1, "predicted_step_time_s": 0.1,
                "step_time_error": 0.0, "peak_memory_bytes": 1e6,
                "predicted_peak_memory_bytes": 1e6, "peak_memory_error": 0.0,
                "state_bytes": 1e5, "rss_peak_bytes": 1e7}
    rank = {"step_times_s": [0.1] * 3, "profiled_step": None, "stages": [0],
            "median_step_time_s": 0.1, "peak_memory_bytes": 1e6, "state_bytes": 1e5,
            "rss_peak_bytes": 1e7, "memory_method": "allocator"}
    return {"measured": measured, "device": "cpu", "backend": "gloo", "data_parallel": "ddp",
            "ranks": [{**rank, "rank": i, **r} for i, r in enumerate(ranks)]}


def _header(text):
    return next(line for line in text.splitlines() if line.startswith("rank")).split()


def test_cp_and_ep_columns_appear_where_the_plan_splits_them():
    plain = _result([{"pp": 0, "dp": d, "cp": 0, "tp": 0, "ep": 0} for d in range(2)])
    assert _header(summary(plain, "p.json"))[:5] == ["rank", "pp", "dp", "tp", "stages"]
    split = _result([{"pp": 0, "dp": 0, "cp": c, "tp": 0, "ep": c} for c in range(2)])
    text = summary(split, "p.json")
    assert _header(text)[:7] == ["rank", "pp", "dp", "cp", "tp", "ep", "stages"]
    rows = [line.split() for line in text.splitlines() if line[:1].isdigit()]
    assert [r[3] for r in rows] == ["0", "1"] and [r[5] for r in rows] == ["0", "1"]
    # a result written before the ranks recorded ep reads as ep 0
    old = _result([{"pp": 0, "dp": 0, "cp": c, "tp": 0} for c in range(2)])
    assert "ep" not in _header(summary(old, "p.json"))


def test_the_peak_says_how_many_ranks_it_covers_and_warmup_0_reads_plainly():
    """A new-user check: one rank's memory profile failed and the peak shown was the other's,
    unsaid; --warmup 0 printed "the first 0 not timed"."""
    result = _result([{"pp": 0, "dp": d, "cp": 0, "tp": 0, "ep": 0} for d in range(2)])
    assert "peak memory (" not in summary(result, "p.json")
    result["measured"]["peak_memory_ranks"] = 1
    assert "peak memory (1 of 2 ranks)" in summary(result, "p.json")
    result["measured"]["warmup_steps"] = 0
    assert "3 steps, all timed" in summary(result, "p.json")


def test_a_step_far_from_its_prediction_gets_hints_on_why():
    """A new-user check saw -73% and -79% with no word on the uncalibrated preset, the software
    the plan was priced for, or the threads."""
    from types import SimpleNamespace

    from planner.report.measured import off_hints

    result = _result([{"pp": 0, "dp": 0, "cp": 0, "tp": 0, "ep": 0}])
    plan = SimpleNamespace(cluster={"device": "cpu"}, search={"target": "any"},
                           training={"engine": {"kernels": "fused", "attention": "flash"}})
    assert off_hints(result, plan, None) == []  # on time: nothing to say
    result["measured"]["step_time_error"] = -0.79
    hints = " ".join(off_hints(result, plan, None))
    assert "plan profile" in hints and "--target torch" in hints and "--threads 1" in hints
    plan = SimpleNamespace(cluster={"device": "cpu-calibrated"}, search={"target": "any"},
                           training={"engine": {"kernels": "eager", "attention": "flash2"}})
    assert off_hints(result, plan, 1) == []
    # made for the runtime with attention=flash chosen (docs/runtime.md's recipe): no hint to
    # plan for the runtime (a new-user check got one)
    plan = SimpleNamespace(cluster={"device": "cpu-calibrated"}, search={"target": "torch"},
                           training={"engine": {"kernels": "eager", "attention": "flash"}})
    assert off_hints(result, plan, 1) == []


def test_the_measured_routing_is_offered_as_an_imbalance_only_where_it_prices_anything():
    """At ep = 1 a rank computes every expert's copies: moe_imbalance changes nothing there,
    so it is not offered (a new-user check re-planned with it and got the same prediction)."""
    routing = {"calls_per_rank": 4, "busiest_expert": 2.15, "busiest_rank": 1.3,
               "planned_moe_imbalance": 1.0}
    for parallel, offered in ((True, True), (False, False)):
        result = _result([{"pp": 0, "dp": d, "cp": 0, "tp": 0, "ep": 0} for d in range(2)])
        result["measured"]["routing"] = {**routing, "expert_parallel": parallel}
        text = summary(result, "p.json")
        assert ("--engine moe_imbalance=2.15" in text) == offered
        assert ("does not change its step" in text) == (not offered)


def test_the_timed_steps_spread_is_said_and_a_wide_one_flagged():
    """A new-user check saw one plan's error go from -26% to +9% a minute later on a shared
    machine, with nothing printed to judge the noise by."""
    from planner.runtime.measure import step_spread

    records = [{"step_times_s": [0.5, 0.10, 0.12, 0.11, 0.5], "profiled_step": 4,
                "median_step_time_s": 0.11}]
    spread = step_spread(records, warmup=1)  # the warm-up and the profiled step left out
    assert spread["steps"] == 3 and (spread["min_s"], spread["max_s"]) == (0.10, 0.12)
    assert abs(spread["range_over_median"] - 0.02 / 0.11) < 1e-12
    result = _result([{"pp": 0, "dp": 0, "cp": 0, "tp": 0, "ep": 0}])
    result["measured"]["step_spread"] = spread
    text = summary(result, "p.json")
    assert "timed steps of the slowest rank: 3, from 100.0 ms to 120.0 ms (18% of the median " \
           "apart)" in text and "says little" not in text
    result["measured"]["step_spread"] = {**spread, "max_s": 0.2, "range_over_median": 0.9}
    assert "says little about the cost model" in summary(result, "p.json")
    assert step_spread(records, warmup=3) is None  # one timed step: no spread


def test_model_states_are_compared_with_the_plans_fullest_stage():
    from types import SimpleNamespace

    from planner.runtime.measure import predicted_state_bytes

    stages = [{"predicted": {"memory_bytes": {"weights": 2e6, "grads": 4e6, "optimizer": 12e6,
                                              "activations": 9e9, "total": 9e9}}},
              {"predicted": {"memory_bytes": {"weights": 1e6, "grads": 2e6, "optimizer": 6e6,
                                              "fp8_weights": 1e6, "total": 1e9}}}]
    assert predicted_state_bytes(SimpleNamespace(stages=stages)) == 18e6  # no activations
    assert predicted_state_bytes(SimpleNamespace(stages=None)) is None  # recommendation plans
    result = _result([{"pp": 0, "dp": 0, "cp": 0, "tp": 0, "ep": 0}])
    result["measured"]["predicted_state_bytes"] = 1.5e5  # measured 1e5
    row = next(line for line in summary(result, "p.json").splitlines()
               if line.startswith("model states"))
    assert row.rstrip().endswith("+50%")
    # measured after a step, the gradients freed: compared without theirs (a new-user check
    # read +33% on every run: the states at rest against the prediction with gradients)
    assert predicted_state_bytes(SimpleNamespace(stages=stages), grads=False) == 14e6
    result["measured"]["state_grads"] = False
    assert "model states (gradients freed)" in summary(result, "p.json")


def test_a_run_slowed_by_other_processes_says_so():
    """A new-user check measured one plan at 634 ms and, minutes later, at 362 ms, with nothing
    said: the timed steps' CPU time of the machine less the run's own is other processes'."""
    from planner.runtime.measure import machine_cpu, other_load

    ranks = [{"timed_wall_s": 1.0, "cpu_s": 0.9, "machine_cpu_s": 3.0, "machine_cpus": 2},
             {"timed_wall_s": 1.0, "cpu_s": 0.9}]
    assert other_load(ranks) == pytest.approx(0.6)  # (3.0 - 1.8) / (1.0 x 2 CPUs)
    assert other_load([{**ranks[0], "machine_cpu_s": 1.5}, ranks[1]]) == 0.0  # never below 0
    assert other_load([{"timed_wall_s": 1.0}]) is None and other_load([]) is None
    busy = _result([{"pp": 0, "dp": d, "cp": 0, "tp": 0, "ep": 0} for d in range(2)])
    busy["measured"]["other_load"] = 0.6
    assert "note: other processes took 60% of this machine's CPU time during the timed " \
        "steps" in summary(busy, "p.json")
    busy["measured"]["other_load"] = 0.1
    assert "other processes" not in summary(busy, "p.json")
    reading = machine_cpu()  # (Linux: the machine's busy seconds so far, over its CPUs)
    assert reading is None or (reading[0] > 0 and reading[1] >= 1)
