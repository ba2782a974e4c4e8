"""The table placement: fits memory, beats or equals its greedy start, honours pins."""

import dataclasses

import pytest

from costmodels.embeddings import RecModel, Table
from costmodels.topology import get_cluster
from planner.errors import InfeasibleError, SpecError
from planner.search.tables import RecOptions, plan_tables, price_layouts


def model(n=12, big=2_000_000):
    tables = tuple(Table(f"t{i}", rows=big if i < 2 else 1000 * (i + 1), dim=64, pooling=1 + i % 3)
                   for i in range(n))
    return RecModel("toy", tables, dense_params=100_000, dense_flops_per_sample=2e6,
                    dense_act_bytes_per_sample=4e4, dense_ops=20)


def test_plan_fits_and_is_no_worse_than_greedy():
    cl = get_cluster("dgx-a100-40g", nodes=1, gpus_per_node=4)
    tp = plan_tables(model(), cl, global_batch=4096, opts=RecOptions(time_limit_s=5))
    assert tp.solver["status"] in ("optimal", "feasible")
    assert tp.solver["objective_s"] <= tp.solver["greedy_s"] + 1e-9
    assert max(r["hbm_bytes"] for r in tp.per_rank) <= cl.device.memory_bytes
    for t, lay in zip(model().tables, tp.layouts):  # the shards tile each table
        if lay.sharding != "data_parallel":
            assert sum(s.rows * s.cols for s in lay.shards) == t.rows * t.dim
    # repricing the chosen layouts gives the same step
    again = price_layouts(model(), cl, tp.layouts, global_batch=4096)
    assert again.step_s == pytest.approx(tp.step_s)


def test_pinned_sharding_is_used():
    cl = get_cluster("dgx-a100-40g", nodes=1, gpus_per_node=4)
    tp = plan_tables(model(), cl, global_batch=4096,
                     opts=RecOptions(fix_sharding="row_wise", time_limit_s=2))
    assert {lay.sharding for lay in tp.layouts} == {"row_wise"}
    free = plan_tables(model(), cl, global_batch=4096, opts=RecOptions(time_limit_s=5))
    assert free.solver["objective_s"] <= tp.solver["objective_s"] + 1e-9


def test_tables_too_large_go_to_host_memory_or_fail():
    cl = get_cluster("dgx-a100-40g", nodes=1, gpus_per_node=1)
    huge = dataclasses.replace(model(), tables=(Table("t", rows=150_000_000, dim=128),))
    tp = plan_tables(huge, cl, global_batch=1024, opts=RecOptions(time_limit_s=2))
    assert tp.layouts[0].tier in ("uvm_caching", "host")
    with pytest.raises(InfeasibleError, match="do not fit"):
        plan_tables(huge, cl, global_batch=1024, opts=RecOptions(tiers=("hbm",), time_limit_s=2))


def test_batch_must_divide():
    cl = get_cluster("dgx-a100-40g", nodes=1, gpus_per_node=4)
    with pytest.raises(SpecError, match="global_batch"):
        plan_tables(model(), cl, global_batch=1001)


@pytest.mark.parametrize("kind,nodes,gpus,why", [
    ("table_row_wise", 1, 8, "needs more than one node"),
    ("grid_shard", 1, 8, "needs more than one node"),
    ("row_wise", 1, 1, "needs more than one GPU"),
])
def test_a_pinned_sharding_no_table_can_take_says_why(kind, nodes, gpus, why):
    cl = get_cluster("dgx-a100-40g", nodes=nodes, gpus_per_node=gpus)
    with pytest.raises(SpecError, match=f"no {kind} layout on {nodes * gpus} GPUs.*{why}"):
        plan_tables(model(), cl, global_batch=1024,
                    opts=RecOptions(fix_sharding=kind, time_limit_s=1))
    if nodes * gpus > 1:  # on two nodes the same pin plans
        two = get_cluster("dgx-a100-40g", nodes=2, gpus_per_node=gpus)
        tp = plan_tables(model(), two, global_batch=1024,
                         opts=RecOptions(fix_sharding=kind, time_limit_s=1))
        assert tp.layouts[0].sharding == kind
