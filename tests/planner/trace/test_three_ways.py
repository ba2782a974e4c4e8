"""One transformer written three ways (examples/three_ways.py) costs the same: it is priced from
the ops it runs, not from the modules it is written with."""

import importlib.util
import os

import pytest
import torch

import planner
from planner.options import parse_fix

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
SMALL = {"dim": 256, "layers": 4, "heads": 4, "seq_len": 128}
WAYS = ("plain", "mha", "encoder")


@pytest.fixture(scope="module")
def ways():
    spec = importlib.util.spec_from_file_location(
        "three_ways", os.path.join(REPO, "examples", "three_ways.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = {}
    for way in WAYS:
        with torch.device("meta"):
            model, inputs = getattr(module, way)(**SMALL)
        out[way] = planner.prepare(model, example_inputs=inputs, dtype="bf16", cache_dir=None)
    return out


@pytest.fixture(scope="module")
def plans(ways):
    return {w: planner.plan_prepared(ways[w], planner.load_cluster("dgx-a100-80g", nodes=1),
                                     planner.TrainingSpec(global_batch=32, seq_len=SMALL["seq_len"]),
                                     planner.SearchOptions(top_k=0))
            for w in WAYS}


def test_the_three_ways_count_the_same_flops(plans):
    d, s, layers = SMALL["dim"], SMALL["seq_len"], SMALL["layers"]
    # per token, forward + backward: 3 x 2 x (12 d^2 weights + 2 s d attention) per layer
    expected = 3 * 2 * layers * (12 * d * d + 2 * s * d)
    for way in WAYS:
        assert plans[way].predicted["model_flops_per_token"] == pytest.approx(expected, rel=0.02), way


def test_the_three_ways_plan_alike_on_8_a100(plans):
    steps = [p.step_time_s for p in plans.values()]
    assert max(steps) / min(steps) < 1.10
    assert all(0 < p.predicted["mfu"] < 0.70 for p in plans.values())


def test_multihead_attention_is_replicated_and_its_mlp_split(ways):
    """nn.MultiheadAttention keeps q, k, v in one packed parameter and calls its output
    projection functionally, so no per-module role splits its attention; the MLP's Linears do.
    Its attention then runs whole on every tensor-parallel rank and costs more than split."""
    tp2 = {w: planner.plan_prepared(ways[w], planner.load_cluster("dgx-a100-80g", nodes=1),
                                    planner.TrainingSpec(global_batch=8, seq_len=SMALL["seq_len"]),
                                    planner.SearchOptions(fix=parse_fix("tp=2,dp=4"), top_k=0))
           for w in ("plain", "mha")}
    roles = tp2["mha"].tensor_parallel
    assert roles["body.0.attn"] == "replicate"
    assert roles["body.0.up"] == "colwise" and roles["body.0.down"] == "rowwise"
    plain = tp2["plain"].tensor_parallel
    assert plain["body.0.qkv"] == "colwise" and plain["body.0.proj"] == "rowwise"
    compute = {w: tp2[w].predicted["breakdown"]["compute_s"] for w in tp2}
    assert compute["mha"] > compute["plain"]


def test_a_module_is_planned_in_the_training_dtype_and_left_as_given():
    """The API traces a copy of the caller's module on meta, cast to the training dtype as a
    factory's model is: the plan equals the one of the same factory given by name."""
    spec = importlib.util.spec_from_file_location(
        "three_ways", os.path.join(REPO, "examples", "three_ways.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, inputs = module.plain(dim=64, layers=2, heads=2, seq_len=32)  # real fp32 weights
    before = model.body[0].qkv.weight.clone()
    kw = dict(cluster="dgx-a100-80g", nodes=1, global_batch=8, dtype="bf16")
    given = planner.plan(model, example_inputs=inputs, **kw)
    assert model.body[0].qkv.weight.dtype == torch.float32
    assert model.body[0].qkv.weight.device.type == "cpu"
    assert torch.equal(model.body[0].qkv.weight, before)
    with torch.device("meta"):
        meta_model, meta_inputs = module.plain(dim=64, layers=2, heads=2, seq_len=32)
    named = planner.plan(meta_model.to(torch.bfloat16), example_inputs=meta_inputs, **kw)
    assert given.step_time_s == named.step_time_s
    assert given.predicted["peak_memory_bytes"] == named.predicted["peak_memory_bytes"]
