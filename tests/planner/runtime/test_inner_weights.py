"""Weights inside a tensor-parallel region (planner.runtime.inner_weights): one optimizer step of
tiny Qwen3 (query and key norms shared by the heads) and gpt-oss (a sink per head) models under
tp = 2, alone and with data parallelism (FSDP2), on gloo processes equals the same step in one
process, fp32, SGD. Before, `plan run` refused both ("weights inside a tensor-parallel region").
"""


import pytest
import torch
from torch import nn

from equal_steps import assert_equals_single_process
from job import run_cases
from planner.planfile.document import load_plan
from planner.runtime.inner_weights import InnerWeights, inside_modules, split_inner

LR = 10.0
TOL = 1e-5
FLAT = "pp=1,recompute=none,zero=0,sequence_parallel=false"

TWO = {
    "qwen3-tp2": f"dp=1,tp=2,micro_batch=2,{FLAT}",
    # experts with tp > 1 are planned under sequence parallelism, which the runtime leaves out
    "gptoss-tp2": "dp=1,tp=2,pp=1,micro_batch=2,recompute=none,zero=0,sequence_parallel=true",
}
FOUR = {
    "qwen3-tp2xdp2-fsdp": "dp=2,tp=2,pp=1,micro_batch=2,recompute=none,zero=1,"
                          "sequence_parallel=false",
    "gptoss-tp2xdp2-fsdp": "dp=2,tp=2,pp=1,micro_batch=2,recompute=none,zero=1,"
                           "sequence_parallel=true",
}


@pytest.fixture(scope="module")
def runs(make_plan, tmp_path_factory):
    """Run every case; -> {name: (plan path, result dict, dump folder)}."""
    jobs = [(nproc, {name: make_plan(name.split("-")[0], fix, name)
                      for name, fix in cases.items()}) for nproc, cases in ((2, TWO), (4, FOUR))]
    return run_cases(tmp_path_factory.mktemp("inner-weights-runs"), jobs, lr=LR)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TWO) + list(FOUR))
def test_one_step_equals_single_process(runs, case):
    path, result, dump = runs[case]
    plan = load_plan(path)
    assert plan.parallel["tp"] == 2
    roles = plan.tensor_parallel
    inner = "model.layers.0.self_attn" + (".q_norm" if case.startswith("qwen3") else "")
    assert roles[inner] == "replicate"  # weights of its own inside the split attention
    assert roles["model.layers.0.self_attn.q_proj"] == "colwise"
    assert_equals_single_process(plan, result, dump, lr=LR, tol=TOL)


def test_per_head_weights_are_cut_to_the_ranks_heads_and_shared_ones_kept_whole():
    """Sinks ([heads], read by the attention module that has the config) are sliced to the
    rank's contiguous block of heads; a norm over the head dimension stays whole."""

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"num_attention_heads": 4})()
            self.sinks = nn.Parameter(torch.arange(4.0))
            self.q_proj = nn.Linear(8, 32)
            self.q_norm = nn.RMSNorm(8)
            self.o_proj = nn.Linear(32, 8)

    model = nn.Module()
    model.attn = Attention()
    roles = {"attn.q_proj": "colwise", "attn.o_proj": "rowwise", "attn": "replicate",
             "attn.q_norm": "replicate"}
    # the attention module is fed by what precedes it; its norm by its query projection
    feeds = {"attn": {"norm"}, "attn.q_norm": {"attn.q_proj"}, "attn.o_proj": {"attn.q_norm"}}
    modules = dict(model.named_modules())
    names = inside_modules(roles, feeds, set(modules), modules)
    assert names == {"attn": False, "attn.q_norm": True}
    out = InnerWeights(tp=2, tp_index=1)
    split_inner(model, names, out)
    assert out.sharded == {"attn.sinks"}
    assert model.attn.sinks.tolist() == [2.0, 3.0]  # heads 2 and 3 of 4
    assert [fqn for _, fqn in out.shared] == ["attn.q_norm.weight"]
    assert model.attn.q_norm.weight.shape == (8,)
    # another parameter on the module holding the split Linears (inside or outside the split?
    # the plan does not say), or per-head values of a module whose heads are unknown: refused
    from planner.errors import SpecError

    model.attn = Attention()
    model.attn.register_parameter("gate", nn.Parameter(torch.ones(8)))  # [head_dim]
    with pytest.raises(SpecError, match=r"tensor_parallel.attn: gate \(8,\) sits on the module "
                                        r"that holds the split attention's Linears.*4 heads.*"
                                        r"--fix tp=1"):
        split_inner(model, {"attn": False}, InnerWeights(tp=2, tp_index=0))
    model.attn = Attention()
    del model.attn.config
    with pytest.raises(SpecError, match=r"sinks \(4,\) .*heads unknown"):
        split_inner(model, {"attn": False}, InnerWeights(tp=2, tp_index=0))
    model.attn.num_heads = 4  # as torch's and many modules name it
    split_inner(model, {"attn": False}, InnerWeights(tp=2, tp_index=0))
    assert model.attn.sinks.tolist() == [0.0, 1.0]
    # a module fed by a row-parallel Linear (a norm before the region) is not inside it
    assert inside_modules({**roles, "norm": "replicate"}, {"norm": {"attn.o_proj"}},
                          {"norm"}, {"norm": nn.RMSNorm(8)}) == {}
