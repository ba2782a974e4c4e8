"""Pipeline closed forms and the roofline compute model."""

import pytest

from costmodels.compute import block_time, forward_parts_s, optimizer_step_s
from costmodels.errors import SpecError
from costmodels.hardware import DEVICES, get_device
from costmodels.pipeline import bubble_fraction, in_flight, step_time_s
from costmodels.workload import BlockWork


@pytest.mark.parametrize("p,m", [(2, 8), (4, 16), (8, 8), (8, 64)])
def test_equal_stage_pipeline_takes_m_plus_p_minus_1_slots(p, m):
    t = 0.1
    step = step_time_s([t] * p, microbatches=m, schedule="1f1b")
    assert step == pytest.approx((m + p - 1) * t)
    idle = step - m * t
    assert idle / step == pytest.approx(bubble_fraction(stages=p, microbatches=m))
    assert bubble_fraction(stages=p, microbatches=m) == pytest.approx((p - 1) / (m + p - 1))


def test_unequal_stages_run_at_the_slowest():
    assert step_time_s([1.0, 2.0, 1.0], microbatches=4, schedule="gpipe") == pytest.approx(4 + 3 * 2)


def test_in_flight_gpipe_m_1f1b_at_most_p():
    assert in_flight("gpipe", stage=0, stages=4, microbatches=16) == 16
    assert [in_flight("1f1b", stage=s, stages=4, microbatches=16) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight("1f1b", stage=0, stages=8, microbatches=3) == 3
    with pytest.raises(SpecError):
        in_flight("zigzag", stage=0, stages=2, microbatches=2)


def test_roofline_times_and_backward_factor():
    dev = DEVICES["a100-80g"]
    w = BlockWork(mm_flops_tp=1e12, attn_flops=2e11, mem_bytes_rep=4e9)
    gemm, attn, mem = forward_parts_s(w, dev, dtype="bf16", micro_batch=2, tp=2, sp=False)
    peak = 312e12 * dev.matmul_efficiency
    assert gemm == pytest.approx(2 * 1e12 / 2 / peak)
    assert attn == pytest.approx(2 * 2e11 / 2 / peak)
    assert mem == pytest.approx(2 * 4e9 / (2039e9 * dev.memory_efficiency))
    bt = block_time(w, dev, dtype="bf16", micro_batch=2, tp=2, sp=False, recompute="selective")
    assert bt.bwd_s == pytest.approx(2 * bt.fwd_s)
    assert bt.recompute_s == pytest.approx(attn)
    full = block_time(w, dev, dtype="bf16", micro_batch=2, tp=2, sp=True, recompute="full")
    assert full.recompute_s == pytest.approx(full.fwd_s)
    assert full.fwd_s < bt.fwd_s  # sequence parallel splits the replicated memory-bound ops


def test_device_without_bf16_is_a_clear_error_and_optimizer_is_memory_bound():
    with pytest.raises(SpecError, match="v100 has no bf16"):
        get_device("v100").peak("bf16")
    dev = DEVICES["h100"]
    assert optimizer_step_s(1e9, dev, state_bytes_per_param=16) == pytest.approx(
        2 * 16e9 / (dev.hbm_bytes_per_s * dev.memory_efficiency))
