"""Long steps (many micro-batches) are simulated at two shorter lengths and extrapolated: the
result equals the event-by-event simulation of the whole step."""

import random

import pytest

from planner.options import Config
from planner.search import refine


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"])
@pytest.mark.parametrize("pp", [2, 4, 8])
def test_extrapolated_steps_equal_the_full_simulation(schedule, pp, monkeypatch):
    rng = random.Random(pp)
    vpp = 2 if schedule == "interleaved-1f1b" else 1
    m = pp * 150 + (0 if vpp > 1 else 3)  # not a multiple of pp where the schedule allows it
    cfg = Config(dp=1, tp=1, pp=pp, micro_batch=1, num_microbatches=m, schedule=schedule, vpp=vpp)
    chunks = pp * vpp
    fwd = [rng.uniform(0.5, 1.5) for _ in range(chunks)]  # unequal stages
    bwd = [2 * f for f in fwd]
    wgrad = [0.3 * f if schedule == "zb-h1" else 0.0 for f in fwd]
    act = [rng.uniform(1.0, 2.0) for _ in range(chunks)]
    assert m > refine.SIM_EXACT + pp  # this step is extrapolated
    step, peaks = refine._simulated_step(cfg, fwd, bwd, wgrad, 0.01, act)
    monkeypatch.setattr(refine, "SIM_EXACT", 10 ** 9)  # now simulated event by event
    full_step, full_peaks = refine._simulated_step(cfg, fwd, bwd, wgrad, 0.01, act)
    assert step == pytest.approx(full_step, rel=1e-9)
    assert peaks == pytest.approx(full_peaks, rel=1e-9)
