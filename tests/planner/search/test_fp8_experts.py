"""``EngineSpec.fp8_experts``: torchtitan's float8 and mx converters swap nn.Linear modules only,
so under fp8 its routed experts' grouped GEMMs stay bf16 (a new-user check: --target torchtitan
--dtype fp8 priced them in fp8, only the export said otherwise). They run at the bf16 rate, with no
casts, no FP8 weight copies and their kept inputs 16-bit; the dense layers stay fp8."""

import dataclasses
import json

import pytest

import planner
from costmodels import compute, memory
from costmodels.engine import engine_from_mapping
from planner.inputs.clusters import load_cluster
from planner.options import SearchOptions, TrainingSpec, parse_fix
from tests.conftest import TINY_MIXTRAL

MIXTRAL = {**TINY_MIXTRAL, "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512}


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8-experts") / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    return planner.prepare(str(path), seq_len=256, dtype="fp8")


def test_16_bit_experts_run_at_the_bf16_rate_and_keep_16_bit_inputs(mixtral):
    w = next(b.work for b in mixtral.blocks.blocks if b.work.num_experts)
    device = load_cluster("dgx-h100", nodes=1).device
    kw = dict(micro_batch=1, tp=1, sp=False)

    def routed(dtype, fp8_experts):
        return compute.gemms_time_s(w.gemms, device, dtype, **kw,
                                    experts=compute.Experts(fp8=fp8_experts))[4]

    assert routed("fp8", False) == pytest.approx(routed("bf16", True))
    assert routed("fp8", True) < routed("fp8", False)
    casts = [compute.fp8_cast_s(w.gemms, device, "current", **kw,
                                experts=compute.Experts(fp8=f))[0] for f in (True, False)]
    assert 0 < casts[1] < casts[0]  # the dense GEMMs' inputs are still quantized
    kept = [memory.activation_bytes(w, **kw, recompute="none", fp8=True, fp8_experts=f)
            for f in (True, False)]
    plain = memory.activation_bytes(w, **kw, recompute="none")
    assert kept[0] < kept[1] < plain


def test_a_torchtitan_fp8_plan_keeps_no_fp8_copies_of_the_experts(mixtral):
    cluster = load_cluster("dgx-h100", nodes=1)
    options = SearchOptions(fix=parse_fix("tp=1,pp=1,ep=8,zero=1,micro_batch=1"), top_k=0)
    plans = {}
    for engine in ("megatron-core,moe_host_op_s=0",
                   "megatron-core,moe_host_op_s=0,fp8_experts=false"):
        training = TrainingSpec(global_batch=8, seq_len=256, dtype="fp8",
                                engine=engine_from_mapping(engine))
        plans[engine] = planner.plan_prepared(mixtral, cluster, training, options)
    on, off = plans.values()
    assert off.predicted["fp8"]["weight_copy_bytes"] < on.predicted["fp8"]["weight_copy_bytes"]
    assert off.predicted["fp8"].get("experts_bf16") and "experts_bf16" not in on.predicted["fp8"]
    assert off.step_time_s > on.step_time_s  # (on the device: no host floor here)
    assert not engine_from_mapping("torchtitan").fp8_experts
    assert dataclasses.replace(engine_from_mapping("torchtitan"), fp8_experts=True) != \
        engine_from_mapping("torchtitan")
