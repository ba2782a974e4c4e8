"""A weight read on two pipeline stages (GPT-2's tied input and output embeddings) has its
gradients all-reduced between the two stages' ranks after backward: that exchange is priced, on
the link the two stages' ranks share."""

import pytest

import planner
from planner.inputs.clusters import load_cluster
from planner.options import parse_fix
from planner.search.dp_traffic import DataParallelBytes

WTE = 50257 * 768  # GPT-2 small's token embedding, which its output head reads too


@pytest.fixture(scope="module")
def gpt2():
    return planner.prepare("gpt2", seq_len=1024)


def _plan(prepared, gpus_per_node):
    cluster = load_cluster("dgx-h100", nodes=2 // gpus_per_node, gpus_per_node=gpus_per_node)
    return planner.plan_prepared(prepared, cluster, planner.TrainingSpec(global_batch=8,
                                                                          seq_len=1024),
                                 planner.SearchOptions(fix=parse_fix(
                                     "pp=2,dp=1,tp=1,micro_batch=1"), top_k=0)), cluster


@pytest.mark.parametrize("gpus_per_node", [1, 2])
def test_tied_embedding_gradients_all_reduced_between_stages(gpt2, gpus_per_node):
    p, cluster = _plan(gpt2, gpus_per_node)
    link = cluster.inter_node if gpus_per_node == 1 else cluster.intra_node
    grads = DataParallelBytes.of(planner.TrainingSpec(global_batch=8, seq_len=1024)).grads
    # dp = 1: nothing else to reduce; a two-rank ring all-reduce sends the buffer once
    want = link.sync_s + 2 * link.latency_s + WTE * grads / link.effective_bytes_per_s
    assert p.predicted["breakdown"]["dp_comm_s"] == pytest.approx(want, rel=1e-4)


def test_one_stage_holds_both_readers_nothing_to_sync(gpt2):
    cluster = load_cluster("dgx-h100", nodes=1, gpus_per_node=1)
    p = planner.plan_prepared(gpt2, cluster, planner.TrainingSpec(global_batch=8, seq_len=1024),
                              planner.SearchOptions(fix=parse_fix(
                                  "pp=1,dp=1,tp=1,micro_batch=1"), top_k=0))
    assert p.predicted["breakdown"]["dp_comm_s"] == 0.0


def test_tie_across_device_groups_crosses_their_link(gpt2):
    # examples/hetero_a100_v100.yaml: 12.5 GB/s at 0.9 between the A100 and the V100 group
    cluster = load_cluster("examples/hetero_a100_v100.yaml")
    training = planner.TrainingSpec(global_batch=64, seq_len=1024, dtype="fp16")
    p = planner.plan_prepared(gpt2, cluster, training,
                              planner.SearchOptions(fix=parse_fix("pp=2,tp=1"), top_k=0))
    assert {s["group"] for s in p.stages} == {"a100", "v100"}
    tie_s = WTE * DataParallelBytes.of(training).grads / (12.5e9 * 0.9)
    assert p.predicted["breakdown"]["dp_comm_s"] >= tie_s
    # one GPU a group, nothing else to reduce: the tie alone, over the groups' link
    link = {"intra_node": {"bandwidth_GBps": 300, "latency_us": 3}}
    one = load_cluster({"name": "two", "groups": [
        {"name": "a", "device": "a100-80g", "nodes": 1, "gpus_per_node": 1, **link},
        {"name": "v", "device": "v100", "nodes": 1, "gpus_per_node": 1, **link}],
        "inter_node": {"bandwidth_GBps": 12.5, "latency_us": 10, "efficiency": 0.9},
        "inter_group": {"bandwidth_GBps": 12.5, "latency_us": 10, "efficiency": 0.9}})
    p = planner.plan_prepared(gpt2, one, training,
                              planner.SearchOptions(fix=parse_fix("pp=2,tp=1,dp=1"), top_k=0))
    want = 2 * 10e-6 + tie_s  # (a two-rank ring: two steps of latency, the buffer sent once)
    assert p.predicted["breakdown"]["dp_comm_s"] == pytest.approx(want, rel=1e-4)
