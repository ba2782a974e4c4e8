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


def _costs(ma, engine, *, sp, slowdown=None, tp=4, recompute="none"):
    cluster = load_cluster("dgx-h100", nodes=1)
    if slowdown is not None:  # (and no latency: the tiny model's collectives are all latency)
        cluster = dataclasses.replace(cluster, device=dataclasses.replace(
            cluster.device, overlap_slowdown=slowdown), intra_node=dataclasses.replace(
            cluster.intra_node, latency_s=0.0, sync_s=0.0))
    training = TrainingSpec(global_batch=8, seq_len=128, engine=engine_from_mapping(engine))
    return block_costs(ma, cluster, training, tp=tp, sp=sp, recompute=recompute,
                       micro_batch=2), cluster


def _tp_s(ma, engine, **kw):
    costs, cluster = _costs(ma, engine, **kw)
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
    back = ma.work.tp_bwd_bytes > 0  # (the embedding's collective runs in forward only)
    assert back.any() and (new < old)[back].all()
    np.testing.assert_array_equal(new[~back], old[~back])
    # the presets of engines whose Linear layers wait for each collective price them exposed
    np.testing.assert_array_equal(_tp_s(ma, "torch", sp=sp)[0], old)
    assert not engine_from_mapping("megatron-2021").tp_grad_overlap


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_forward_part_and_what_a_split_backward_exposes(ma, recompute):
    """The forward pass's part is its collectives once (a replay runs in backward); under
    ZB-H1, whose W runs apart, nothing hides behind the weight gradients."""
    on, cluster = _costs(ma, "megatron-core", sp=False, recompute=recompute)
    off, _ = _costs(ma, "megatron-core,tp_grad_overlap=false", sp=False, recompute=recompute)
    group = placement.group_shape(4, 1, cluster.gpus_per_node)
    back = ma.work.tp_bwd_bytes > 0
    count = np.where(back, ma.work.tp_collectives / 2, ma.work.tp_collectives)
    forward = comm.allreduce_s(2 * ma.work.tp_fwd_bytes, group, cluster, count=count)
    np.testing.assert_allclose(on.tp_fwd_comm_s, forward, rtol=1e-12)
    np.testing.assert_allclose(off.tp_fwd_comm_s, forward, rtol=1e-12)
    assert (on.tp_wgrad_hidden_s[back] > 0).all() and (on.tp_wgrad_hidden_s[~back] == 0).all()
    np.testing.assert_allclose(on.tp_comm_for("zb-h1"), on.tp_comm_s + on.tp_wgrad_hidden_s)
    np.testing.assert_array_equal(on.tp_comm_for("1f1b"), on.tp_comm_s)
    np.testing.assert_array_equal(off.tp_comm_for("zb-h1"), off.tp_comm_s)


def test_blocks_without_a_backward_pay_no_backward_collective(ma):
    """A frozen model's blocks run forward only: their collectives are the forward's alone,
    with or without the overlap (the review found backward collectives charged to them, and
    under sequence parallelism the second all-gather too)."""
    frozen = dataclasses.replace(ma, work=dataclasses.replace(
        ma.work, runs_backward=np.zeros_like(ma.work.runs_backward)))
    for sp in (False, True):
        on, _ = _costs(frozen, "megatron-core", sp=sp)
        off, _ = _costs(frozen, "megatron-core,tp_grad_overlap=false", sp=sp)
        np.testing.assert_allclose(on.tp_comm_s, on.tp_fwd_comm_s, rtol=1e-12)
        np.testing.assert_allclose(off.tp_comm_s, off.tp_fwd_comm_s, rtol=1e-12)


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


@pytest.mark.parametrize("engine", ["megatron-core", "megatron-core,tp_grad_overlap=false"])
def test_sequence_parallel_collectives_pay_their_own_latency(ma, engine):
    """Under sequence parallelism each all-reduce becomes an all-gather and a reduce-scatter, each
    with a ring's half latency: latency alone (no bandwidth), the forward costs what it does
    without sequence parallelism, not twice that."""
    def fwd(sp):
        cluster = load_cluster("dgx-h100", nodes=1)
        cluster = dataclasses.replace(cluster, intra_node=dataclasses.replace(
            cluster.intra_node, bandwidth_bytes_per_s=1e30))
        training = TrainingSpec(global_batch=8, seq_len=128, engine=engine_from_mapping(engine))
        return block_costs(ma, cluster, training, tp=4, sp=sp, recompute="none",
                           micro_batch=2).tp_fwd_comm_s
    plain, split = fwd(False), fwd(True)
    assert (plain > 0).any()
    np.testing.assert_allclose(split, plain, rtol=1e-9)
