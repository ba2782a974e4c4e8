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

    def casts(linear, micro_batch=1, eager=False):
        return compute.fp8_cast_s(work.gemms, device, "current", micro_batch=micro_batch, tp=1,
                                  sp=False, linear=linear, eager=eager)

    te, ao = casts("te"), casts("torchao")
    assert ao[0] > te[0] and ao[1] > te[1]
    # the weights' casts do not grow with the micro-batch; the activations' do
    weights = [a - t for a, t in zip(casts("torchao", 2), casts("te", 2))]
    grown = [casts("torchao", 2)[i] - 2 * ao[i] for i in range(2)]
    assert all(g < 0 for g in grown) and weights[0] > 0
    # per weight element: 2 bytes read and the recipe's cast, in each pass
    weight_elements = sum(g.batch * g.n * g.k for g in work.gemms if g.linear)
    per_pass = weight_elements * (precision.cast_bytes("current")
                                  + precision.HIGH_PRECISION_READ_BYTES)
    assert ao[0] - te[0] == pytest.approx(per_pass / device.memory_bytes_per_s, rel=1e-9)
    # eager: every cast reads its 16-bit tensor in a kernel of its own
    assert casts("te", eager=True)[0] > te[0]


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


@pytest.mark.parametrize("engine, recipe, share", [
    ("megatron-core", "current", 0.5), ("megatron-core", "block", (1 + 1 / 32) / 2),
    ("torchtitan", "current", 0.5), ("torchtitan", "block", 1.0)])
def test_sequence_parallel_gathers_carry_fp8_in_the_layers(tiny_llama, engine, recipe, share):
    """Transformer Engine quantizes a column-parallel input (and a row-parallel output gradient)
    before it all-gathers it, and torchao's tensorwise float8 does under torchtitan's float8
    tensor parallelism; the reduce-scatters stay 16-bit, and so do the blocks outside the
    layers."""
    assert precision.sp_gather_share(engine_from_mapping(engine).fp8_linear, recipe) == \
        pytest.approx(share)
    cluster = load_cluster("dgx-h100", nodes=1)
    cfg = Config(dp=1, tp=8, pp=1, micro_batch=1, num_microbatches=8, recompute="none",
                 sequence_parallel=True)
    ma = ModelArrays.from_blocks(tiny_llama.blocks)
    # (every collective exposed: the comparison is of bytes, not of what compute hides)
    spec = f"{engine},tp_overlap=false,tp_grad_overlap=false"
    fp8, bf16 = (config_costs(ma, cluster, TrainingSpec(
        global_batch=8, seq_len=tiny_llama.seq_len, dtype=dtype,
        engine=engine_from_mapping(spec + (f",fp8_recipe={recipe}" if dtype == "fp8" else ""))),
        cfg) for dtype in ("fp8", "bf16"))
    layers, outer = ma.checkpointed, ~ma.checkpointed & (bf16.tp_comm_s > 0)
    assert outer.any()
    assert np.array_equal(fp8.tp_comm_s[outer], bf16.tp_comm_s[outer])
    if share < 1.0:
        assert np.all(fp8.tp_comm_s[layers] < bf16.tp_comm_s[layers])
    else:
        assert np.array_equal(fp8.tp_comm_s[layers], bf16.tp_comm_s[layers])
