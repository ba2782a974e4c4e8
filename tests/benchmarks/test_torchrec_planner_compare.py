"""benchmarks/torchrec_planner.py's conversions between our table layouts and TorchRec's planner
types, both ways, on a tiny model: our layouts -> ParameterConstraints -> TorchRec's enumerator's
ShardingOptions (shards on our ranks) -> its ShardingPlan -> our layouts again, equal; and
TorchRec's own plan -> our layouts -> its options -> the same per-rank cost it rated."""

import importlib.util
import os
import sys

import pytest

pytest.importorskip("torchrec")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "benchmarks", "torchrec_planner.py")
spec = importlib.util.spec_from_file_location("torchrec_planner_bench", SCRIPT)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up
spec.loader.exec_module(bench)

from costmodels import embeddings as emb  # noqa: E402
from costmodels.embeddings import Layout, Shard  # noqa: E402
from costmodels.topology import get_cluster  # noqa: E402
from planner.search import tables as tab  # noqa: E402

ROWS = 1000
DIM = 64
BATCH = 256  # global


@pytest.fixture(scope="module")
def tiny():
    """Six tables of 1,000 x 64 (the synthetic builder's names and module), a 4-rank cluster of two
    nodes of two GPUs."""
    import dataclasses

    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    bench._quiet()
    tables = tuple(emb.Table(name=f"t_cat_{i}", rows=ROWS + 7 * i, dim=DIM, pooling=1.0 + i,
                             feature_names=(f"cat_{i}",)) for i in range(6))
    model = emb.RecModel(name="tiny", tables=tables, dense_params=1000,
                         dense_flops_per_sample=2e4, dense_act_bytes_per_sample=1e3)
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                   feature_names=list(t.feature_names)) for t in tables],
        device=torch.device("meta"))
    cl = get_cluster("dgx-a100-40g", nodes=2, gpus_per_node=2)
    topo, _ = bench.topology(cl)
    return dataclasses.replace(model), ebc, cl, topo


def _every_kind(model, W, g):
    """One layout of each sharding type and tier, on chosen ranks."""
    t = model.tables
    rows = lambda i, parts: emb.even_rows(t[i].rows, parts)  # noqa: E731
    return [
        Layout("table_wise", (Shard(3, 0, 0, t[0].rows, DIM),), "hbm"),
        Layout("column_wise", tuple(Shard(r, 0, c, t[1].rows, w) for r, (c, w) in
                                    zip((2, 0), emb.column_pieces(DIM, 2))), "uvm_caching", 0.5),
        Layout("row_wise", tuple(Shard(r, lo, 0, n, DIM) for r, (lo, n) in enumerate(rows(2, W))),
               "host"),
        Layout("table_row_wise", tuple(Shard(g + i, lo, 0, n, DIM)
                                       for i, (lo, n) in enumerate(rows(3, g))), "hbm"),
        Layout("data_parallel", tuple(Shard(r, 0, 0, t[4].rows, DIM) for r in range(W)), "hbm"),
        Layout("grid_shard", tuple(Shard(p * g + i, lo, c, n, w)
                                   for p, (c, w) in enumerate(emb.column_pieces(DIM, 2))
                                   for i, (lo, n) in enumerate(rows(5, g))), "uvm_caching", 0.1),
    ]


def test_our_layouts_round_trip_through_torchrec(tiny):
    model, ebc, cl, topo = tiny
    W = cl.num_gpus
    layouts = _every_kind(model, W, cl.gpus_per_node)
    cons = bench.to_constraints(model, layouts)
    assert cons["t_cat_1"].sharding_types == ["column_wise"]
    assert cons["t_cat_1"].compute_kernels == ["fused_uvm_caching"]
    assert cons["t_cat_1"].min_partition == DIM // 2
    assert cons["t_cat_1"].cache_params.load_factor == 0.5
    assert cons["t_cat_2"].compute_kernels == ["fused_uvm"]
    assert cons["t_cat_4"].compute_kernels == ["dense"]
    options = bench.to_options(model, ebc, layouts, topo, BATCH // W)
    assert [o.sharding_type for o in options] == [lay.sharding for lay in layouts]
    assert bench.options_to_layouts(model, options, topo) == layouts
    cost = bench.torchrec_cost(options, W)
    assert cost["max_ms"] > 0 and cost["hbm_max"] > 0 and cost["ddr_max"] > 0  # host tiers
    # and our model prices the same layouts
    assert bench.our_cost(model, cl, layouts, "sgd")["sparse_ms"] > 0


def test_our_plan_and_torchrecs_plan_convert_and_keep_their_costs(tiny):
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    model, ebc, cl, topo = tiny
    W = cl.num_gpus
    base = bench.base_constraints(model)
    planner = EmbeddingShardingPlanner(topology=topo, batch_size=BATCH // W, constraints=base,
                                       debug=False)
    theirs = bench.to_layouts(model, planner.plan(ebc, [bench.sharder()]), W)
    options = bench.to_options(model, ebc, theirs, topo, BATCH // W, base)
    assert bench.options_to_layouts(model, options, topo) == theirs
    # TorchRec's own rating of its plan is what its estimates on our conversion sum to
    cost = bench.torchrec_cost(options, W)
    assert cost["max_with_prefetch_ms"] == pytest.approx(bench._rating(planner._best_plan, W))

    ours = tab.plan_tables(model, cl, global_batch=BATCH,
                           opts=tab.RecOptions(optimizer="sgd", time_limit_s=1))
    options = bench.to_options(model, ebc, ours.layouts, topo, BATCH // W, base)
    assert bench.options_to_layouts(model, options, topo) == ours.layouts
