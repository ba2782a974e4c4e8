"""Tensor parallelism's backward collectives beside the column-parallel Linears' GEMMs, as
Transformer Engine's and Megatron-Core's Linear layers run them (EngineSpec.tp_grad_overlap):
the input gradients' all-reduce (reduce-scatter under sequence parallelism) beside the weight
gradients, and under sequence parallelism the inputs all-gathered a second time beside the
input gradients."""

import dataclasses

import numpy as np
import pytest

from costmodels import comm
from costmodels.engine import engine_from_mapping
from planner.inputs.clusters import load_cluster
from planner.options import TrainingSpec
from planner.search import placement
from planner.search.costs import ModelArrays, block_costs


@pytest.fixture(scope="module")
def ma(tiny_llama):
    return ModelArrays.from_blocks(tiny_llama.blocks)


def _tp_s(ma, engine, *, sp, slowdown=None, tp=4):
    cluster = load_cluster("dgx-h100", nodes=1)
    if slowdown is not None:  # (and no latency: the tiny model's collectives are all latency)
        cluster = dataclasses.replace(cluster, device=dataclasses.replace(
            cluster.device, overlap_slowdown=slowdown), intra_node=dataclasses.replace(
            cluster.intra_node, latency_s=0.0, sync_s=0.0))
    training = TrainingSpec(global_batch=8, seq_len=128, engine=engine_from_mapping(engine))
    costs = block_costs(ma, cluster, training, tp=tp, sp=sp, recompute="none", micro_batch=2)
    return costs.tp_comm_s, cluster


@pytest.mark.parametrize("sp", [False, True])
def test_hiding_nothing_it_adds_only_the_second_all_gather(ma, sp):
    """Beside compute that an infinite slowdown stops, nothing hides: the overlapped form costs
    what the exposed one does, plus under sequence parallelism the inputs' second all-gather
    (which DTensor's styles, keeping the gathered input, do not run)."""
    old, cluster = _tp_s(ma, "megatron-core,tp_grad_overlap=false", sp=sp, slowdown=np.inf)
    new, _ = _tp_s(ma, "megatron-core", sp=sp, slowdown=np.inf)
    group = placement.group_shape(4, 1, cluster.gpus_per_node)
    regather = comm.allgather_s(2 * ma.work.tp_bwd_bytes, group, cluster) if sp else 0.0
    np.testing.assert_allclose(new, old + regather, rtol=1e-9, atol=1e-15)
    if sp:
        assert (regather > 0).any()


@pytest.mark.parametrize("sp", [False, True])
def test_the_backward_hides_behind_the_column_gemms(ma, sp):
    old, _ = _tp_s(ma, "megatron-core,tp_grad_overlap=false", sp=sp)
    new, _ = _tp_s(ma, "megatron-core", sp=sp)
    torch_engine, _ = _tp_s(ma, "torch", sp=sp)
    assert (new < old)[old > 0].all() and (old > 0).any()
    # engines whose Linear layers wait for each collective: as before
    np.testing.assert_array_equal(torch_engine, _tp_s(ma, "torch,tp_grad_overlap=false",
                                                      sp=sp)[0])
    assert not engine_from_mapping("torch").tp_grad_overlap
    assert not engine_from_mapping("megatron-2021").tp_grad_overlap


def test_a_plan_recorded_before_the_setting_reads_as_priced_without_it(tmp_path):
    """Plans saved before tp_grad_overlap existed priced every backward collective exposed."""
    import json

    from planner.planfile.document import load_plan
    d = json.loads(open("tests/planner/export/data/plans/llama3-8b-cp4-megatron.json").read())
    assert d["training"]["engine"].pop("tp_grad_overlap") is True
    (tmp_path / "old.json").write_text(json.dumps(d))
    old = load_plan(str(tmp_path / "old.json"))
    assert not engine_from_mapping(old.training["engine"]).tp_grad_overlap
    assert engine_from_mapping(None).tp_grad_overlap  # (new plans record it: on by default)
