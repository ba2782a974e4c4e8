"""Pipeline closed forms and the roofline compute model."""

import pytest

from costmodels.compute import (block_time, gemm_time_s, optimizer_step_s, split_gemm,
                                split_k)
from costmodels.engine import EngineSpec
from costmodels.errors import SpecError
from costmodels.hardware import DEVICES, get_device
from costmodels.pipeline import (bubble_fraction, in_flight, one_f_one_b_floor_s, one_f_one_b_s,
                                 step_time_s)
from costmodels.workload import SPLIT_K, SPLIT_N, BlockWork, Gemm


@pytest.mark.parametrize("p,m", [(2, 8), (4, 16), (8, 8), (8, 64)])
def test_equal_stage_pipeline_takes_m_plus_p_minus_1_slots(p, m):
    t = 0.1
    step = step_time_s([t] * p, microbatches=m, schedule="1f1b")
    assert step == pytest.approx((m + p - 1) * t)
    idle = step - m * t
    assert idle / step == pytest.approx(bubble_fraction(stages=p, microbatches=m))
    assert bubble_fraction(stages=p, microbatches=m) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m", [(1, 4), (2, 1), (4, 3), (4, 16), (8, 64)])
def test_1f1b_rank_by_rank_is_m_plus_p_minus_1_slots_on_equal_stages(p, m):
    f, b = 0.1, 0.25
    assert one_f_one_b_s([f] * p, [b] * p, microbatches=m) == pytest.approx((m + p - 1) * (f + b))
    assert step_time_s([f + b] * p, microbatches=m, schedule="1f1b", fwd_s=[f] * p) == \
        pytest.approx((m + p - 1) * (f + b))


def test_1f1b_floor_is_below_the_rank_by_rank_form_of_every_split():
    """The search's bound (one_f_one_b_floor_s, from the total and a least busiest time) never
    exceeds the form it bounds, whatever the split: heavy first, heavy last, or lopsided."""
    import random

    rng = random.Random(7)
    for _ in range(2000):
        p, m = rng.randint(1, 8), rng.randint(1, 40)
        fwd = [rng.uniform(0.2, 2.0) for _ in range(p)]
        bwd = [f * rng.uniform(0.5, 3.0) for f in fwd]
        times = [f + b for f, b in zip(fwd, bwd)]
        total = sum(times)
        floor = one_f_one_b_floor_s(total, max(total / p, rng.uniform(0, max(times))), stages=p,
                                    microbatches=m)
        assert floor <= one_f_one_b_s(fwd, bwd, microbatches=m) * (1 + 1e-12)
    # with more micro-batches than ranks no split beats the balanced pipeline: (m + p - 1) T / p
    assert one_f_one_b_floor_s(8.0, 1.0, stages=8, microbatches=9) == pytest.approx(16.0)
    assert one_f_one_b_floor_s(4.0, 1.0, stages=4, microbatches=16) == pytest.approx(19.0)
    # with no more: the least a linear program over the splits finds (p = m = 8: 16/9 T)
    assert one_f_one_b_floor_s(1.0, 0.125, stages=8, microbatches=8) == pytest.approx(16 / 9)
    assert one_f_one_b_floor_s(1.0, 0.125, stages=8, microbatches=4) == pytest.approx(1.1346,
                                                                                      abs=1e-4)
    assert one_f_one_b_s([2.0 / 3, 0.0], [0.0, 1.0 / 3], microbatches=2) == pytest.approx(4 / 3)


def test_unequal_stages_run_at_the_slowest():
    assert step_time_s([1.0, 2.0, 1.0], microbatches=4, schedule="gpipe") == pytest.approx(4 + 3 * 2)


def test_in_flight_gpipe_m_1f1b_at_most_p():
    assert in_flight("gpipe", stage=0, stages=4, microbatches=16) == 16
    assert [in_flight("1f1b", stage=s, stages=4, microbatches=16) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight("1f1b", stage=0, stages=8, microbatches=3) == 3
    with pytest.raises(SpecError):
        in_flight("zigzag", stage=0, stages=2, microbatches=2)


def test_big_gemm_runs_at_the_efficiency_ceiling_and_small_ones_lose_to_waves():
    dev = DEVICES["a100-80g"]
    big = gemm_time_s(1, 16384, 16384, 16384, dev, "bf16")
    ideal = 2 * 16384 ** 3 / (312e12 * dev.matmul_efficiency)
    waves = -(-(128 * 128) // 108)  # 16384 tiles on 108 SMs: 152 waves, the last one partial
    assert big == pytest.approx(ideal * waves * 108 / (128 * 128) + dev.kernel_overhead_s, rel=1e-9)
    # 109 tiles of 128 x 128 on 108 SMs: two waves, the second almost empty
    m, n = 128 * 109, 128
    t = gemm_time_s(1, m, n, 8192, dev, "bf16")
    assert t > 1.9 * (2 * m * n * 8192 / (312e12 * dev.matmul_efficiency))
    # a skinny GEMM is bound by its operand traffic
    skinny = gemm_time_s(1, 1, 8192, 8192, dev, "bf16")
    assert skinny == pytest.approx(2 * 8192 * 8192 / (2039e9 * dev.memory_efficiency)
                                   + dev.kernel_overhead_s, rel=0.01)


def test_a_small_output_with_a_long_reduction_splits_it_over_the_idle_sms():
    dev = DEVICES["a100-40g"]
    # the weight gradient of a 256 -> 128 layer at batch 8192: 2 output tiles, reduction 8192
    assert split_k(2, 8192, dev) == 54  # 2 x 54 = 108 tiles: one full wave
    t = gemm_time_s(1, 256, 128, 8192, dev, "fp32")
    ideal = 2 * 256 * 128 * 8192 / (19.5e12 * dev.matmul_efficiency)
    assert t == pytest.approx(ideal + dev.kernel_overhead_s, rel=1e-9)
    # without the split the two tiles would leave 106 of 108 SMs idle: 54x slower
    assert t < 2 * ideal
    # where the partial outputs' traffic costs more than the idle SMs, one slice is kept: a
    # 2048 x 512 output (64 tiles) with a short reduction prices as the unsplit wave model
    h100 = DEVICES["h100"]
    short = gemm_time_s(1, 2048, 512, 256, h100, "bf16")
    one_wave = 2 * 2048 * 512 * 256 / (989e12 * h100.matmul_efficiency * 64 / 132)
    assert split_k(64, 256, h100) == 2
    assert short == pytest.approx(max(one_wave, (2 * (2048 * 256 + 256 * 512) + 2 * 2048 * 512)
                                      / h100.memory_bytes_per_s) + h100.kernel_overhead_s)
    # a reduction shorter than two tiles is not split; an output that fills the GPU never is
    assert split_k(2, 200, dev) == 1
    assert split_k(108, 1 << 20, dev) == split_k(500, 1 << 20, dev) == 1


def test_tensor_parallel_splits_the_right_gemm_dimension():
    col = Gemm(batch=1, m=2048, n=4096, k=1024, split=SPLIT_N)
    row = Gemm(batch=1, m=2048, n=1024, k=4096, split=SPLIT_K)
    rep = Gemm(batch=1, m=2048, n=1024, k=1024)
    assert split_gemm(col, micro_batch=2, tp=4, sp=False) == (1, 4096, 1024, 1024)
    assert split_gemm(row, micro_batch=1, tp=4, sp=False) == (1, 2048, 1024, 1024)
    assert split_gemm(rep, micro_batch=1, tp=4, sp=True) == (1, 512, 1024, 1024)


def test_block_time_backward_recompute_and_engines():
    dev = DEVICES["a100-80g"]
    w = BlockWork(gemms=(Gemm(batch=1, m=2048, n=8192, k=8192),), fused_attn_flops=1e12,
                  attn_flops=1e12, attn_causal_flops=1e12, attn_scores=32 * 2048 * 2048,
                  fused_bytes_rep=4e8, mem_bytes_rep=1.2e9, kernels_fused=4, kernels_eager=30)
    flash = block_time(w, dev, dtype="bf16", micro_batch=1, tp=1, sp=False, recompute="none")
    gemm = gemm_time_s(1, 2048, 8192, 8192, dev, "bf16")
    attn = 0.5 * 1e12 / (312e12 * dev.attention_efficiency)
    mem = 4e8 / (2039e9 * dev.memory_efficiency) + 4 * dev.kernel_overhead_s
    assert flash.fwd_s == pytest.approx(gemm + attn + mem)
    # backward GEMMs: input gradient (m x k x n) and weight gradient (k x n x m)
    gemm_bwd = gemm_time_s(1, 2048, 8192, 8192, dev, "bf16") + gemm_time_s(1, 8192, 8192, 2048, dev, "bf16")
    assert flash.bwd_s == pytest.approx(gemm_bwd + 2.5 * attn + 2 * mem)
    # ZB-H1's W: the weight-gradient GEMM only, not half the backward (attention's backward
    # and the element-wise one are input-gradient work)
    assert flash.wgrad_s == pytest.approx(gemm_time_s(1, 8192, 8192, 2048, dev, "bf16"))
    assert flash.wgrad_s < 0.5 * flash.bwd_s
    full = block_time(w, dev, dtype="bf16", micro_batch=1, tp=1, sp=False, recompute="full")
    assert full.recompute_s == pytest.approx(full.fwd_s)
    sel = block_time(w, dev, dtype="bf16", micro_batch=1, tp=1, sp=False, recompute="selective")
    assert sel.recompute_s == pytest.approx(attn)
    slow = block_time(w, dev, dtype="bf16", micro_batch=1, tp=1, sp=False, recompute="none",
                      engine=EngineSpec(attention="materialized", kernels="eager"))
    assert slow.fwd_s > flash.fwd_s
    scores_s = 2 * 4 * 32 * 2048 * 2048 / (2039e9 * dev.memory_efficiency)
    assert slow.fwd_s == pytest.approx(gemm + 1e12 / (312e12 * dev.matmul_efficiency) + scores_s
                                       + 1.2e9 / (2039e9 * dev.memory_efficiency)
                                       + 30 * dev.kernel_overhead_s)


def test_device_without_bf16_is_a_clear_error_and_optimizer_is_memory_bound():
    with pytest.raises(SpecError, match="v100 has no bf16"):
        get_device("v100").peak("bf16")
    dev = DEVICES["h100"]
    assert optimizer_step_s(1e9, dev, traffic_bytes_per_param=32) == pytest.approx(
        2 * 16e9 / (dev.hbm_bytes_per_s * dev.memory_efficiency))


def test_mxfp8_needs_block_scaled_tensor_cores():
    """The block recipe (MXFP8) runs on Blackwell's block-scaled FP8 GEMMs only; Hopper and a
    cluster file's device without the flag are refused by name, with the recipes that run."""
    from costmodels.hardware import device_from_mapping, device_mapping
    from costmodels.precision import check_recipe

    check_recipe(DEVICES["b200"], "fp8", "block")
    check_recipe(DEVICES["h100"], "fp8", "current")
    check_recipe(DEVICES["h100"], "bf16", "block")  # no FP8: the recipe does not apply
    with pytest.raises(SpecError, match="engine.fp8_recipe: block.*h100.*current or delayed"):
        check_recipe(DEVICES["h100"], "fp8", "block")
    spec = device_mapping(DEVICES["gb200"])
    assert spec["fp8_block_scaling"] is True
    check_recipe(device_from_mapping(spec), "fp8", "block")
    with pytest.raises(SpecError, match="device.fp8_block_scaling: expected true or false"):
        device_from_mapping({**spec, "fp8_block_scaling": "yes"})


def test_a_cluster_file_sets_what_hiding_communication_costs_its_device():
    """overlap_slowdown: the GPUs' published mean by default, infinite on the CPU preset (its
    cores run the transfers: nothing hidden), written "inf" (JSON has no infinity); a cluster
    file may set it from 0 to 1 or "inf", and it travels with the plan's cluster."""
    import json
    import math

    from costmodels.hardware import OVERLAP_SLOWDOWN, device_from_mapping, device_mapping

    assert DEVICES["h100"].overlap_slowdown == OVERLAP_SLOWDOWN == 0.189
    assert DEVICES["cpu"].overlap_slowdown == math.inf
    assert "overlap_slowdown" not in device_mapping(DEVICES["h100"])  # the default: not written
    cpu = device_mapping(DEVICES["cpu"])
    assert json.loads(json.dumps(cpu, allow_nan=False))["overlap_slowdown"] == "inf"
    assert device_from_mapping(cpu).overlap_slowdown == math.inf
    assert device_from_mapping({**cpu, "overlap_slowdown": 0.0}).overlap_slowdown == 0.0
    assert device_from_mapping({**cpu, "overlap_slowdown": 0.3}).overlap_slowdown == 0.3
    for bad in (-0.1, 1.5, "high", True):
        with pytest.raises(SpecError, match=r"^device\.overlap_slowdown: expected a number from "
                                            r"0 to 1"):
            device_from_mapping({**cpu, "overlap_slowdown": bad})


def test_selective_recomputation_keeping_matmul_outputs_runs_every_other_op_again():
    """plan run's selective (torch's selective activation checkpointing saving mm/addmm/bmm
    outputs) runs the attention kernel, norms and element-wise ops again: a new-user check
    measured it as slow as full recomputation on a CPU where it was priced as Megatron's
    attention core alone (1% over none). EngineSpec.selective = matmuls prices it so."""
    dev = DEVICES["a100-80g"]
    w = BlockWork(gemms=(Gemm(batch=1, m=2048, n=8192, k=8192),), fused_attn_flops=1e12,
                  attn_flops=1e12, attn_causal_flops=1e12, attn_scores=32 * 2048 * 2048,
                  fused_bytes_rep=4e8, mem_bytes_rep=1.2e9, kernels_fused=4, kernels_eager=30)

    def recompute(**engine):
        return block_time(w, dev, dtype="bf16", micro_batch=1, tp=1, sp=False,
                          recompute="selective", engine=EngineSpec(**engine))

    gemm = gemm_time_s(1, 2048, 8192, 8192, dev, "bf16")
    megatron, torch_sac = recompute(), recompute(selective="matmuls")
    attn = 0.5 * 1e12 / (312e12 * dev.attention_efficiency)
    assert megatron.recompute_s == pytest.approx(attn)  # the attention core alone
    assert torch_sac.recompute_s == pytest.approx(torch_sac.fwd_s - gemm)  # all but the GEMM
    assert megatron.recompute_s < torch_sac.recompute_s < torch_sac.fwd_s


def test_selective_keeping_matmuls_replays_the_forwards_collectives():
    """torch's selective checkpointing runs every op but the matrix multiplications again,
    DTensor's collectives and the experts' all-to-alls among them (a code review): priced as full
    recomputation's are."""
    assert EngineSpec().replays_forward("full") and not EngineSpec().replays_forward("selective")
    assert EngineSpec(selective="matmuls").replays_forward("selective")
    assert not EngineSpec(selective="matmuls").replays_forward("none")
