"""Engine settings: presets of common stacks, overrides after a preset, and the words a plan shows."""

import pytest

from costmodels.engine import BOOL_SETTINGS, PRESETS, EngineSpec, describe, engine_from_mapping
from costmodels.errors import SpecError


def test_presets_expand_and_take_overrides():
    assert engine_from_mapping("megatron-core") == EngineSpec()  # the default is today's Megatron
    titan = engine_from_mapping("torchtitan")
    assert titan.kernels == "eager" and titan.fsdp_copies and titan.attention == "flash2"
    old = engine_from_mapping("megatron-2021")
    assert old.attention == "materialized" and not old.overlap_grad_reduce
    mixed = engine_from_mapping("torchtitan,attention=materialized")
    assert mixed.attention == "materialized" and mixed.kernels == "eager"


def test_unknown_presets_and_keys_are_named():
    with pytest.raises(SpecError, match="unknown preset 'titan'"):
        engine_from_mapping("titan")
    with pytest.raises(SpecError, match="engine.kernel: unknown key"):
        engine_from_mapping("megatron-core,kernel=eager")
    # a preset after settings: named, with the order that works (which then parses)
    with pytest.raises(SpecError, match="the preset 'torchtitan' comes first, then the settings it "
                                        "changes: write torchtitan,moe_imbalance=1.3,"
                                        "attention=flash$") as err:
        engine_from_mapping("moe_imbalance=1.3,torchtitan,attention=flash")
    fixed = engine_from_mapping(str(err.value).rsplit("write ", 1)[1])
    assert fixed.moe_imbalance == 1.3 and fixed.kernels == "eager"
    for two in ("megatron-core,torchtitan", "megatron-core,megatron-core",
                "moe_imbalance=2,deepspeed,torchtitan"):
        with pytest.raises(SpecError, match="^engine: one preset at most"):
            engine_from_mapping(two)


def test_every_true_or_false_setting_reads_its_text():
    """'false' from --engine or --vary is False, not a non-empty string (moe_etp_replicated was
    once missed); other text is refused naming the setting."""
    assert "moe_etp_replicated" in BOOL_SETTINGS and "moe_overlap" in BOOL_SETTINGS
    for key in BOOL_SETTINGS:
        for text, want in (("false", False), ("0", False), ("no", False), ("Off", False),
                           ("true", True), ("1", True), ("on", True)):
            try:
                got = getattr(engine_from_mapping({key: text}), key)
            except SpecError as err:  # a setting that needs another (pad to capacity)
                assert want and not str(err).startswith(f"engine.{key}: expected"), err
                continue
            assert got is want, (key, text)
        with pytest.raises(SpecError, match=f"^engine.{key}: expected true or false \\(or "
                                            "on/off, yes/no, 1/0\\), got 'maybe'"):
            engine_from_mapping({key: "maybe"})


def test_a_plan_says_which_software_it_assumes():
    for name, kw in PRESETS.items():
        assert describe(EngineSpec(**kw)).endswith(f"(= --engine {name})")
    words = describe(engine_from_mapping("megatron-2021,overlap_grad_reduce=true"))
    assert "attention scores in memory" in words and "overlapped" in words
    assert words.endswith("(= --engine megatron-2021,overlap_grad_reduce=true)")
    # the setting it names reads back to the same engine, MoE and FP8 settings included
    for spec in ("megatron-core,moe_dispatcher=allgather,moe_capacity_factor=1.25",
                 "torchtitan,fp8_recipe=block,moe_overlap=true", "kernels=eager,host_op_s=1e-05"):
        engine = engine_from_mapping(spec)
        setting = describe(engine).rsplit("(= --engine ", 1)[1].rstrip(")")
        assert engine_from_mapping(setting) == engine, setting
    assert describe(engine_from_mapping("megatron-core,moe_imbalance=1.5")).endswith(
        "(= --engine megatron-core,moe_imbalance=1.5)")


def test_flashattention2_runs_below_hoppers_best_kernel_and_equals_it_on_ampere():
    from costmodels.attention import fused_attention_efficiency
    from costmodels.hardware import DEVICES, device_from_mapping

    fa2, best = EngineSpec(attention="flash2"), EngineSpec(attention="flash")
    h100, a100 = DEVICES["h100"], DEVICES["a100-80g"]
    fwd2, bwd2 = fused_attention_efficiency(h100, fa2)
    fwd, bwd = fused_attention_efficiency(h100, best)
    assert fwd2 < fwd and bwd2 < bwd  # FlashAttention-2 below Hopper's best, both passes
    assert bwd < fwd and bwd2 < fwd2  # backward below forward (FlashAttention-3 paper)
    assert (fused_attention_efficiency(a100, fa2) == fused_attention_efficiency(a100, best)
            == (0.60, 0.60))
    assert "FlashAttention-2" in describe(fa2)
    custom = device_from_mapping({"name": "x", "memory_GB": 96, "hbm_GBps": 2400,
                                  "peak_TFLOPs": {"bf16": 886}, "flash2_efficiency": 0.35,
                                  "sm_count": 132})
    assert custom.flash2_efficiency == 0.35 and custom.sm_count == 132
    with pytest.raises(SpecError, match="device.sm_count: expected a whole number"):
        device_from_mapping({"name": "x", "memory_GB": 96, "hbm_GBps": 2400,
                             "peak_TFLOPs": {"bf16": 886}, "sm_count": 13.5})
    with pytest.raises(SpecError, match="device.flash2_efficiency: expected a fraction"):
        device_from_mapping({"name": "x", "memory_GB": 96, "hbm_GBps": 2400,
                             "peak_TFLOPs": {"bf16": 886}, "flash2_efficiency": 35})


def test_fused_attention_backward_runs_at_its_own_rate():
    from costmodels.attention import FLASH_BACKWARD_FACTOR, attention_time_s
    from costmodels.hardware import DEVICES, HOPPER_ATTENTION
    from costmodels.workload import BlockWork

    work = BlockWork(fused_attn_flops=1e12, attn_flops=1e12, attn_scores=1e8)
    fwd, bwd = attention_time_s(work, DEVICES["h100"], "bf16", EngineSpec(), micro_batch=1, tp=1)
    assert fwd == pytest.approx(1e12 / (989e12 * HOPPER_ATTENTION[0]))
    assert bwd == pytest.approx(FLASH_BACKWARD_FACTOR * 1e12 / (989e12 * HOPPER_ATTENTION[1]))
    assert bwd / fwd > FLASH_BACKWARD_FACTOR  # slower per FLOP than the forward on Hopper
    fwd, bwd = attention_time_s(work, DEVICES["a100-80g"], "bf16", EngineSpec(), micro_batch=1,
                                tp=1)
    assert bwd / fwd == pytest.approx(FLASH_BACKWARD_FACTOR)  # one published share on A100


def test_causal_calls_run_below_unmasked_ones_and_a_ring_mostly_unmasked():
    from costmodels.attention import CAUSAL_SKIP, attention_time_s, ring_attention_s
    from costmodels.hardware import DEVICES, HOPPER_ATTENTION, HOPPER_CAUSAL
    from costmodels.workload import BlockWork

    h100, a100 = DEVICES["h100"], DEVICES["a100-80g"]
    full = BlockWork(fused_attn_flops=1e12, attn_flops=1e12)
    causal = BlockWork(fused_attn_flops=1e12, attn_flops=1e12, attn_causal_flops=1e12)
    flash = EngineSpec()
    f_full, _ = attention_time_s(full, h100, "bf16", flash, micro_batch=1, tp=1)
    f_causal, b_causal = attention_time_s(causal, h100, "bf16", flash, micro_batch=1, tp=1)
    # half the work, at HOPPER_CAUSAL of the unmasked speed (FlashAttention-3 paper, Fig. 5)
    assert f_causal == pytest.approx(CAUSAL_SKIP * 1e12 / (989e12 * HOPPER_ATTENTION[0]
                                                           * HOPPER_CAUSAL))
    assert f_causal / f_full == pytest.approx(CAUSAL_SKIP / HOPPER_CAUSAL)
    # where the ratio is not published (A100), causal work runs at the unmasked speed
    a_full, _ = attention_time_s(full, a100, "bf16", flash, micro_batch=1, tp=1)
    a_causal, _ = attention_time_s(causal, a100, "bf16", flash, micro_batch=1, tp=1)
    assert a_causal == pytest.approx(CAUSAL_SKIP * a_full)
    assert ring_attention_s(causal, a100, "bf16", flash, micro_batch=1, tp=1, cp=4) == (0, 0)
    # a ring of cp ranks: of a rank's 2 cp pair-calls' work, one pair's worth is masked, the
    # rest runs unmasked; the same work as the rank's share of causal calls, done faster
    for cp in (2, 8):
        own_f, own_b = attention_time_s(causal, h100, "bf16", flash, micro_batch=1 / cp, tp=1)
        df, db = ring_attention_s(causal, h100, "bf16", flash, micro_batch=1, tp=1, cp=cp)
        masked = 1 / (2 * cp)
        assert own_f + df == pytest.approx(own_f * (masked + (1 - masked) * HOPPER_CAUSAL))
        assert own_b + db == pytest.approx(own_b * (masked + (1 - masked) * HOPPER_CAUSAL))
    # unmasked attention gains nothing from the ring
    assert ring_attention_s(full, h100, "bf16", flash, micro_batch=1, tp=1, cp=4) == (
        pytest.approx(0.0), pytest.approx(0.0))
    assert b_causal > 0
    from costmodels.hardware import device_from_mapping, device_mapping
    spec = {"name": "x", "memory_GB": 96, "hbm_GBps": 2400, "peak_TFLOPs": {"bf16": 886}}
    assert device_mapping(device_from_mapping({**spec, "causal_attention_ratio": 0.9})
                          )["causal_attention_ratio"] == 0.9
    for bad in (1.5, 0, -1):
        with pytest.raises(SpecError, match="device.causal_attention_ratio: expected a fraction"):
            device_from_mapping({**spec, "causal_attention_ratio": bad})
    old = device_from_mapping({**spec, "flash_attention": False})
    assert not old.flash_attention and device_mapping(old)["flash_attention"] is False
    assert device_from_mapping(device_mapping(old)) == old
    with pytest.raises(SpecError, match="device.flash_attention: expected true or false"):
        device_from_mapping({**spec, "flash_attention": "no"})


def test_fused_attention_runs_narrower_heads_slower_where_that_was_published():
    """Head dimension 64 on H100 (FlashAttention-3 paper, Figs. 5-6): cuDNN 0.69 of its forward
    speed at 128 and 0.84 of its backward, FlashAttention-2 0.87 and 0.90; linear in log2 of the
    head dimension between 64 and 128; 128 and wider, or unknown (0), as read; devices without
    published figures (A100) unchanged."""
    from costmodels.attention import fused_attention_efficiency
    from costmodels.hardware import DEVICES, device_from_mapping, device_mapping

    h100, a100 = DEVICES["h100"], DEVICES["a100-80g"]
    best, fa2 = EngineSpec(attention="flash"), EngineSpec(attention="flash2")
    full = fused_attention_efficiency(h100, best)
    assert fused_attention_efficiency(h100, best, 0.0) == full
    assert fused_attention_efficiency(h100, best, 192.0) == full
    assert fused_attention_efficiency(h100, best, 64.0) == pytest.approx(
        (full[0] * 0.69, full[1] * 0.84))
    assert fused_attention_efficiency(h100, best, 32.0) == fused_attention_efficiency(
        h100, best, 64.0)
    mid = fused_attention_efficiency(h100, best, 64 * 2 ** 0.5)  # halfway in log2
    assert mid == pytest.approx((full[0] * (0.69 + 0.31 / 2), full[1] * (0.84 + 0.16 / 2)))
    two = fused_attention_efficiency(h100, fa2)
    assert fused_attention_efficiency(h100, fa2, 64.0) == pytest.approx(
        (two[0] * 0.87, two[1] * 0.90))
    assert fused_attention_efficiency(a100, best, 64.0) == fused_attention_efficiency(a100, best)
    # a cluster file's device keeps the shares (and may set them)
    assert device_from_mapping(device_mapping(h100)).attention_d64_share == 0.69


def test_blocks_carry_their_attention_head_dimension(tiny_gpt2, tiny_gpt2_config):
    """The FLOP-weighted head dimension of a block's attention (BlockWork.attn_head_dim): the
    hidden size over the heads in every layer, 0 in blocks without attention."""
    import json

    config = json.load(open(tiny_gpt2_config))
    width = config["n_embd"] // config["n_head"]
    layers = [b for b in tiny_gpt2.blocks.blocks if b.work.attn_heads_q]
    assert layers and {b.work.attn_head_dim for b in layers} == {width}
    assert all(b.work.attn_head_dim == 0 for b in tiny_gpt2.blocks.blocks
               if not b.work.attn_heads_q)


def test_megatrons_flex_dispatcher_is_named_as_deepep():
    """A new-user check gave moe_dispatcher=flex (Megatron's name, which the export writes for
    deepep) and got the list alone."""
    with pytest.raises(SpecError, match=r"got 'flex' \(Megatron-Core's flex dispatcher, DeepEP "
                                        r"or HybridEP, is deepep here\)$"):
        EngineSpec(moe_dispatcher="flex")
