"""``EngineSpec.fp8_linear``: torchao's Float8Linear (torchtitan's converters) saves the 16-bit
input and weight and casts both again in backward, keeping no FP8 copies of the weights, where
Transformer Engine keeps FP8 copies for the step and saves inputs in FP8 (a review found the
torchtitan target's fp8 memory priced as Transformer Engine's: ~10 GB low for Llama-3 8B)."""

import dataclasses

import numpy as np
import pytest

import planner
from costmodels import compute, memory, precision
from costmodels.engine import engine_from_mapping
from costmodels.errors import SpecError
from planner.export.common import software_differs
from planner.inputs.clusters import load_cluster
from planner.options import Config, SearchOptions, TrainingSpec, parse_fix
from planner.report.summary import summary
from planner.search.costs import ModelArrays, config_costs


def _layer(prepared):
    return next(b.work for b in prepared.blocks.blocks if b.recompute)


def test_torchao_casts_weights_in_both_passes_and_saved_inputs_again(tiny_llama):
    work, device = _layer(tiny_llama), load_cluster("dgx-h100", nodes=1).device
    rate = device.memory_bytes_per_s

    def casts(linear, recipe="current", micro_batch=1, eager=False):
        return compute.fp8_cast_s(work.gemms, device, recipe, micro_batch=micro_batch, tp=1,
                                  sp=False, linear=linear, eager=eager)

    linear = [g for g in work.gemms if g.linear]
    assert all(g.grad_a and g.grad_b for g in linear)
    acts = sum(g.batch * g.m * g.k for g in linear)  # the inputs
    grads = sum(g.batch * g.m * g.n for g in linear)  # the output gradients
    weights = sum(g.batch * g.n * g.k for g in linear)
    read = precision.HIGH_PRECISION_READ_BYTES
    # Transformer Engine: each input and output gradient cast once, fused into its producer
    te = casts("te")
    assert te[0] * rate == pytest.approx(acts * precision.cast_bytes("current"), rel=1e-9)
    assert te[1] * rate == pytest.approx(grads * precision.cast_bytes("current"), rel=1e-9)
    assert casts("te", eager=True) == te  # (its casts are its own kernels either way)
    # torchao, compiled: the weights in each pass, the saved inputs again, the output gradient
    # once for each gradient GEMM (the second a second write of the first's kernel); its own
    # kernels read the 16-bit tensors
    for recipe in ("current", "block"):
        one = precision.torchao_cast_bytes(recipe)
        ao = casts("torchao", recipe)
        assert ao[0] * rate == pytest.approx(acts * one + weights * (one + read), rel=1e-9)
        assert ao[1] * rate == pytest.approx(
            grads * (one + precision.quantized_bytes(recipe)) + (weights + acts) * (one + read),
            rel=1e-9)
    # eager: every cast is a kernel of its own, reading its 16-bit tensor
    eager = casts("torchao", eager=True)
    one = precision.torchao_cast_bytes("current")
    assert eager[0] * rate == pytest.approx((acts + weights) * (one + read), rel=1e-9)
    assert eager[1] * rate == pytest.approx((2 * grads + weights + acts) * (one + read),
                                            rel=1e-9)
    # the weights' casts do not grow with the micro-batch; the activations' do
    assert casts("torchao", micro_batch=2)[0] < 2 * casts("torchao")[0]
    assert precision.torchao_cast_bytes("block") < precision.cast_bytes("block")  # one copy


def test_torchao_saves_16_bit_linear_inputs_and_keeps_no_fp8_copies(tiny_llama):
    cluster = load_cluster("dgx-h100", nodes=1)
    cfg = Config(dp=8, tp=1, pp=1, micro_batch=1, num_microbatches=1, zero=3, recompute="none")
    ma = ModelArrays.from_blocks(tiny_llama.blocks)

    def costs(engine, dtype="fp8"):
        training = TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len, dtype=dtype,
                                engine=engine_from_mapping(engine))
        return training, config_costs(ma, cluster, training, cfg)

    te_training, te = costs("torchtitan,fp8_linear=te")
    ao_training, ao = costs("torchtitan")
    _, bf16 = costs("torchtitan", "bf16")
    layers = ma.checkpointed
    assert np.all(te.act_bytes[layers] < ao.act_bytes[layers])
    assert np.array_equal(ao.act_bytes, bf16.act_bytes)  # activations as in bf16
    kw = dict(dtype="fp8", optimizer="adamw", zero=3, dp=8, layout="fsdp2")
    assert "fp8_weights" in memory.model_state_bytes(1.0, **kw)
    assert "fp8_weights" not in memory.model_state_bytes(1.0, **kw, fp8_copies=False)
    assert te_training.engine.fp8_copies and not ao_training.engine.fp8_copies
    assert engine_from_mapping("torchtitan-compile").fp8_linear == "torchao"
    assert engine_from_mapping("megatron-core").fp8_linear == "te"


def test_a_torchtitan_fp8_plan_says_it_keeps_no_copies(tiny_llama):
    cluster = load_cluster("dgx-h100", nodes=1)
    options = SearchOptions(fix=parse_fix("tp=1,pp=1,zero=3,micro_batch=1"), top_k=0)
    plans = {}
    for engine in ("torchtitan", "torchtitan,fp8_linear=te"):
        training = TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len, dtype="fp8",
                                engine=engine_from_mapping(engine))
        plans[engine] = planner.plan_prepared(tiny_llama, cluster, training, options)
    ao, te = plans.values()
    assert ao.predicted["fp8"]["weight_copy_bytes"] == 0.0
    assert te.predicted["fp8"]["weight_copy_bytes"] > 0.0
    assert ao.predicted["fp8"]["linear"] == "torchao" and "linear" not in te.predicted["fp8"]
    assert "no fp8 weight copies (torchao" in " ".join(summary(ao).split())
    assert "of fp8 weight copies per GPU" in " ".join(summary(te).split())
    # priced with Transformer Engine's Linear, a torchtitan export runs other software
    assert software_differs(te, "torchtitan") and not software_differs(ao, "torchtitan")
    # ...but not in bf16, where no FP8 Linear runs
    bf16 = dataclasses.replace(te, training={**te.training, "dtype": "bf16"})
    assert engine_from_mapping(bf16.training["engine"]).fp8_linear == "te"
    assert not software_differs(bf16, "torchtitan")


def test_an_unknown_fp8_linear_is_refused():
    with pytest.raises(SpecError, match="engine.fp8_linear: expected one of te, torchao"):
        engine_from_mapping("megatron-core,fp8_linear=transformer-engine")


@pytest.mark.parametrize("engine, recipe, shares", [
    ("megatron-core", "current", (0.5, 0.5)),
    ("megatron-core", "block", ((1 + 1 / 32) / 2, 1 + 1 / 32)),
    ("torchtitan", "current", (1.0, 1.0)), ("torchtitan", "block", (1.0, 1.0))])
@pytest.mark.parametrize("grad_overlap", [False, True])
def test_sequence_parallel_gathers_carry_fp8_in_the_layers(tiny_llama, engine, recipe, shares,
                                                           grad_overlap, monkeypatch):
    """Transformer Engine quantizes a column-parallel input (and a row-parallel output gradient,
    under MXFP8 both row- and column-wise) before it all-gathers it; torchtitan 0.2.2 gathers
    16-bit (its float8 tensor parallelism looks for a converter named "float8"). The
    reduce-scatters stay 16-bit, and so do the blocks outside the layers. Priced with every
    collective exposed, and with the backward's beside the gradient GEMMs (its exposed gradient
    all-gather and the inputs' second one)."""
    assert precision.sp_gather_shares(engine_from_mapping(engine).fp8_linear, recipe) == \
        pytest.approx(shares)
    cluster = load_cluster("dgx-h100", nodes=1)
    cfg = Config(dp=1, tp=8, pp=1, micro_batch=1, num_microbatches=8, recompute="none",
                 sequence_parallel=True)
    ma = ModelArrays.from_blocks(tiny_llama.blocks)
    spec = f"{engine},tp_overlap=false,tp_grad_overlap={str(grad_overlap).lower()}"
    training = TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len, dtype="fp8",
                            engine=engine_from_mapping(f"{spec},fp8_recipe={recipe}"))
    fp8 = config_costs(ma, cluster, training, cfg).tp_comm_s
    # the same step with 16-bit gathers: only the layers' collectives change (fresh arrays:
    # ModelArrays memoizes its blocks' costs)
    monkeypatch.setattr(precision, "sp_gather_shares", lambda linear, recipe: (1.0, 1.0))
    wide = config_costs(ModelArrays.from_blocks(tiny_llama.blocks), cluster, training,
                        cfg).tp_comm_s
    layers = ma.checkpointed
    assert (wide[~layers] > 0).any()
    assert np.array_equal(fp8[~layers], wide[~layers])
    if shares == (1.0, 1.0):
        assert np.array_equal(fp8[layers], wide[layers])
        return
    assert np.all(fp8[layers] < wide[layers])
    # the gradients' share alone moves the backward (MXFP8's gathers them at ~1.03: slower)
    monkeypatch.setattr(precision, "sp_gather_shares", lambda linear, recipe: (1.0, shares[1]))
    grads_only = config_costs(ModelArrays.from_blocks(tiny_llama.blocks), cluster, training,
                              cfg).tp_comm_s
    assert np.all((grads_only[layers] > wide[layers]) if shares[1] > 1 else
                  (grads_only[layers] < wide[layers]))
