"""FP8 training (costmodels.precision): weight GEMMs at the FP8 peak with 1-byte operands, casts
priced by the recipe, everything else in bf16, FP8 weight copies and quantized Linear inputs."""

import dataclasses

import pytest

from costmodels import memory, precision
from costmodels.compute import block_time, gemm_time_s
from costmodels.engine import EngineSpec
from costmodels.errors import SpecError
from costmodels.hardware import DEVICES, FP8_MATMUL_EFFICIENCY, device_from_mapping
from costmodels.workload import BlockWork, Gemm

H100_FP8 = dataclasses.replace(DEVICES["h100"], peak_flops={**DEVICES["h100"].peak_flops,
                                                            "fp8": 1979e12})


def test_weight_gemms_run_in_fp8_and_the_rest_in_bf16():
    assert precision.gemm_dtype("fp8", weight_gemm=True) == "fp8"
    assert precision.gemm_dtype("fp8", weight_gemm=False) == "bf16"  # attention's QK^T and AV
    assert precision.gemm_dtype("bf16", weight_gemm=True) == "bf16"
    big = (1, 8192, 8192, 8192)
    bf16 = gemm_time_s(*big, H100_FP8, "bf16") - H100_FP8.kernel_overhead_s
    fp8 = gemm_time_s(*big, H100_FP8, "fp8") - H100_FP8.kernel_overhead_s
    # twice the peak, at the share of it FP8 GEMMs sustain in training
    share = FP8_MATMUL_EFFICIENCY / H100_FP8.matmul_efficiency
    assert fp8 == pytest.approx(bf16 / (2 * share), rel=1e-3)
    assert 1.2 < bf16 / fp8 < 2.0  # faster than bf16, short of the peaks' ratio


def test_a_device_can_state_its_own_fp8_gemm_efficiency():
    own = device_from_mapping({"name": "x", "memory_GB": 80, "hbm_GBps": 3350,
                               "peak_TFLOPs": {"bf16": 989, "fp8": 1979},
                               "fp8_matmul_efficiency": 0.7, "sm_count": 132})
    assert own.gemm_efficiency("fp8") == 0.7 and own.gemm_efficiency("bf16") == 0.70
    assert DEVICES["b200"].gemm_efficiency("fp8") == FP8_MATMUL_EFFICIENCY
    with pytest.raises(SpecError, match="device.fp8_matmul_efficiency: expected a fraction"):
        device_from_mapping({"name": "x", "memory_GB": 80, "hbm_GBps": 3350,
                             "peak_TFLOPs": {"bf16": 989}, "fp8_matmul_efficiency": 1.5})


def test_a_block_in_fp8_adds_casts_by_recipe_and_keeps_attention_in_bf16():
    linear = Gemm(batch=1, m=4096, n=8192, k=8192)
    w = BlockWork(gemms=(linear,), fused_attn_flops=1e12, attn_flops=1e12, attn_scores=1e8)
    bf16 = block_time(w, H100_FP8, dtype="bf16", micro_batch=1, tp=1, sp=False, recompute="none")
    times = {r: block_time(w, H100_FP8, dtype="fp8", micro_batch=1, tp=1, sp=False,
                           recompute="none", engine=EngineSpec(fp8_recipe=r))
             for r in precision.FP8_RECIPES}
    gemm_saved = (gemm_time_s(1, 4096, 8192, 8192, H100_FP8, "bf16")
                  - gemm_time_s(1, 4096, 8192, 8192, H100_FP8, "fp8"))
    cast = 4096 * 8192 * precision.cast_bytes("current") / H100_FP8.memory_bytes_per_s
    assert times["current"].fwd_s == pytest.approx(bf16.fwd_s - gemm_saved + cast)
    assert times["delayed"].fwd_s < times["block"].fwd_s < times["current"].fwd_s
    with pytest.raises(SpecError, match="fp8_recipe"):
        EngineSpec(fp8_recipe="tensorwise")


def test_fp8_keeps_weight_copies_and_quantized_linear_inputs():
    states = memory.model_state_bytes(1e9, dtype="fp8", optimizer="adam", zero=0, dp=1)
    assert states["fp8_weights"] == 2e9 and states["weights"] == 2e9
    sharded = memory.model_state_bytes(1e9, dtype="fp8", optimizer="adam", zero=3, dp=8)
    assert sharded["fp8_weights"] == 2e9 / 8
    assert "fp8_weights" not in memory.model_state_bytes(1e9, dtype="bf16", optimizer="adam",
                                                         zero=0, dp=1)
    w = BlockWork(act_bytes_tp=10e6, act_linear_in_tp=4e6, act_bytes_rep=2e6)
    kw = dict(micro_batch=1, tp=1, sp=False, recompute="none")
    assert (memory.activation_bytes(w, **kw) - memory.activation_bytes(w, fp8=True, **kw)
            == pytest.approx(2e6))
