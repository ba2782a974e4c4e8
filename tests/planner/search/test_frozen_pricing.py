"""Frozen parameters (requires_grad=False) in the search: weights without gradients, optimizer
states, gradient traffic or update, in the priced plan and in the search's bounds alike."""

import os

import pytest
import torch
from torch import nn

import planner
from costmodels import comm
from costmodels.engine import engine_from_mapping
from planner.errors import InfeasibleError
from planner.options import Config, parse_fix
from planner.search import placement
from planner.search.dp_traffic import DataParallelBytes, exposed_dp_s, frozen_traffic


class Stack(nn.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width))
                                    for _ in range(layers))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def _plan(width, layers, *, frozen: bool, gpus: int, fix="offload_optimizer=false"):
    with torch.device("meta"):
        model = Stack(width, layers)
    if frozen:
        model.layers.requires_grad_(False)  # the head alone trains
    return planner.plan(model, example_inputs=(torch.randn(2, 16, width, device="meta"),),
                        cluster="dgx-h100", nodes=1, gpus_per_node=gpus, global_batch=16,
                        fix=fix, cache_dir=None)


def test_frozen_parameters_are_priced_with_their_weights_only():
    """One configuration, the model trained whole and with its layers frozen: the same weights,
    gradients and optimizer states of the trained share only, less gradient traffic and a
    shorter update."""
    fix = "dp=8,tp=1,pp=1,zero=1,micro_batch=2,recompute=none,offload_optimizer=false"
    whole = _plan(512, 6, frozen=False, gpus=8, fix=fix)
    part = _plan(512, 6, frozen=True, gpus=8, fix=fix)
    total, frozen = part.model["num_params"], part.model["frozen_params"]
    trained = (total - frozen) / total
    assert 0 < trained < 0.1
    (a,), (b,) = whole.stages, part.stages
    ma, mb = a["predicted"]["memory_bytes"], b["predicted"]["memory_bytes"]
    assert mb["weights"] == pytest.approx(ma["weights"])  # (plans keep 6 significant digits)
    assert mb["grads"] == pytest.approx(trained * ma["grads"], rel=1e-5)
    assert mb["optimizer"] == pytest.approx(trained * ma["optimizer"], rel=1e-5)
    da, db = whole.predicted["breakdown"], part.predicted["breakdown"]
    assert db["dp_comm_s"] < 0.5 * da["dp_comm_s"]
    assert db["optimizer_s"] == pytest.approx(trained * da["optimizer_s"], rel=0.05)
    assert db["compute_s"] < da["compute_s"]  # the layers' weight gradients are not computed


def test_a_model_that_fits_only_because_it_is_frozen_is_planned():
    """6.3 B parameters on one 80 GB GPU: trained whole they need ~100 GB of model states (the
    search's memory bound rules every configuration out); with only the head trained, 13 GB of
    weights, and the search must not rule it out on the states it would have trained (the
    optimizer states kept on the GPU: offloaded, the whole model fits too)."""
    with pytest.raises(InfeasibleError):
        _plan(8192, 12, frozen=False, gpus=1)
    p = _plan(8192, 12, frozen=True, gpus=1)
    assert p.predicted["peak_memory_bytes"] < 80e9
    assert p.stages[0]["predicted"]["memory_bytes"]["weights"] > 12e9


def test_frozen_weights_move_only_where_the_engine_shards_the_weights():
    """No gradient to reduce; the weights, never updated, gathered only where the engine keeps
    them sharded: under ZeRO-3 (before every forward and backward), and under FSDP2's ZeRO-1/2
    too (fully_shard without resharding: gathered once for the forward), as for trained ones."""
    megatron = planner.TrainingSpec(global_batch=64, seq_len=1024)
    fsdp = planner.TrainingSpec(global_batch=64, seq_len=1024,
                                engine=engine_from_mapping("torchtitan"))
    cluster = planner.load_cluster("dgx-h100")
    for training, gathered_from in ((megatron, 3), (fsdp, 1)):
        per = DataParallelBytes.of(training)
        assert frozen_traffic(1, 100.0, 30.0, per) == (70.0, 100.0 if gathered_from == 1 else 70.0)
        assert frozen_traffic(3, 100.0, 30.0, per) == (70.0, 100.0)
        for zero in (0, 1, 2, 3):
            cfg = Config(dp=8, tp=1, pp=1, micro_batch=1, num_microbatches=8, zero=zero)
            group = placement.dp_group(cfg, cluster)
            exposed = exposed_dp_s(cfg, 1e9, per, group, cluster, 1.0, 0.5, overlap=False,
                                   frozen=1e9)
            gather = comm.allgather_s(1e9 * per.weights, group, cluster)
            expected = 2 * 8 * gather if zero == 3 else gather if zero >= gathered_from else 0.0
            assert exposed == pytest.approx(expected)
            # in blocks that run no backward: gathered before each forward only
            idle = exposed_dp_s(cfg, 1e9, per, group, cluster, 1.0, 0.5, overlap=False,
                                frozen=1e9, forward_only=1e9)
            assert idle == pytest.approx(expected / 2 if zero == 3 else expected)


def test_the_fine_tuning_example_trains_its_adapters_only():
    """examples/finetune.py:build (README, MODEL): rank-16 adapters beside the query (4096 ->
    4096) and value (4096 -> 1024) projections of 32 layers train, nothing else; its states on
    one rank are the frozen weights and the adapters' full states."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    prepared = planner.prepare(os.path.join(repo, "examples", "finetune.py") + ":build",
                               cache_dir=None)
    trained = 32 * 16 * ((4096 + 4096) + (4096 + 1024))
    total = prepared.info["num_params"]
    assert total - prepared.info["frozen_params"] == trained == 6_815_744
    p = planner.plan_prepared(prepared, planner.load_cluster("dgx-h100", nodes=1),
                              planner.TrainingSpec(global_batch=64, seq_len=4096),
                              planner.SearchOptions(fix=parse_fix(
                                  "dp=8,tp=1,pp=1,zero=0,micro_batch=2,recompute=none,"
                                  "offload_optimizer=false"), top_k=0))
    memory = p.stages[0]["predicted"]["memory_bytes"]
    # bf16 weights of all, Megatron-Core's fp32 main gradients and 12 bytes of Adam per trained
    assert memory["weights"] == pytest.approx(2 * total, rel=1e-5)
    assert memory["grads"] == pytest.approx(4 * trained, rel=1e-5)
    assert memory["optimizer"] == pytest.approx(12 * trained, rel=1e-5)


def test_a_stage_that_runs_forward_only_sends_no_gradient_back():
    """Two stages, the first wholly frozen (nothing before it trains): the second stage sends
    nothing back to it; with the model trained whole, it sends the gradient of what it got."""
    fix = ("dp=1,tp=1,pp=2,zero=0,micro_batch=2,recompute=none,offload_optimizer=false,"
           "schedule=1f1b,vpp=1")
    sends = {}
    for frozen in (0, 5):
        with torch.device("meta"):
            model = Stack(512, 6)
        for layer in model.layers[:frozen]:
            layer.requires_grad_(False)
        p = planner.plan(model, example_inputs=(torch.randn(2, 16, 512, device="meta"),),
                         cluster="dgx-h100", nodes=1, gpus_per_node=2, global_batch=16, fix=fix,
                         cache_dir=None)
        first, second = p.stages
        if frozen:
            assert all(int(b.split(".")[1]) < frozen for b in first["blocks"])
        sends[frozen] = (first["predicted"]["p2p_s"], second["predicted"]["p2p_s"])
    assert sends[0][0] == pytest.approx(sends[0][1]) and sends[0][0] > 0
    assert sends[5][0] == pytest.approx(sends[0][0], rel=0.1) and sends[5][1] == 0.0


def test_frozen_experts_issue_no_weight_gradient_kernels():
    """An MoE layer bound by the host's issue time (EngineSpec.moe_host_op_s): its backward
    issues the input gradients' kernels and, for trained weights only, the weight gradients'
    (a new-user check saw a Mixtral with frozen experts take as long as one trained whole)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from costmodels.compute import block_time
    from costmodels.engine import EngineSpec
    from costmodels.hardware import get_device

    config = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, vocab_size=256, use_cache=False)
    times = {}
    for frozen in (False, True):
        with torch.device("meta"):
            model = MixtralForCausalLM(config)
        if frozen:
            for layer in model.model.layers:
                layer.mlp.experts.requires_grad_(False)
        prepared = planner.prepare(model, example_inputs=(torch.zeros(1, 16, dtype=torch.long),),
                                   cache_dir=None)
        moe = next(b.work for b in prepared.blocks.blocks if b.work.num_experts)
        weights = [g for g in moe.gemms if g.linear]
        share = sum(g.grad_b for g in weights) / len(weights)
        t = block_time(moe, get_device("h100"), dtype="bf16", micro_batch=1, tp=1, sp=False,
                       recompute="none", engine=EngineSpec(moe_host_op_s=1e-3))
        times[frozen] = (t.fwd_s, t.bwd_s, share)
    (fwd, bwd, share), (fwd_f, bwd_f, share_f) = times[False], times[True]
    assert share == 1.0 and 0 < share_f < 1.0
    assert bwd == pytest.approx(2 * fwd) and fwd_f == pytest.approx(fwd)  # host-bound
    assert bwd_f == pytest.approx((1 + share_f) * fwd_f)
