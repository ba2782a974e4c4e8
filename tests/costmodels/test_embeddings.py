"""The embedding-table cost model against hand arithmetic."""

import pytest

from costmodels import embeddings as emb
from costmodels.embeddings import Layout, RecEnv, Shard, Table
from costmodels.errors import SpecError

ENV = RecEnv(world=8, gpus_per_node=8, local_batch=1024, hbm_bytes_per_s=1.555e12,
             host_link_bytes_per_s=25e9, intra_bytes_per_s=231e9, inter_bytes_per_s=22.5e9,
             optimizer="sgd")


def test_table_wise_lookup_bytes_and_memory():
    t = Table("t", rows=1_000_000, dim=128, pooling=2.0)
    c = emb.price(t, Layout("table_wise", (Shard(3, 0, 0, t.rows, t.dim),)), ENV)
    ids = 8 * 1024 * 2.0  # every id of the global batch
    rows_b, out_b = ids * 128 * 4, 8 * 1024 * 128 * 4
    want = (rows_b + out_b + out_b + 2 * rows_b) / (1.555e12 * emb.GATHER_EFFICIENCY)
    assert c.lookup_s == {3: pytest.approx(want)}
    assert c.hbm_bytes[3] == pytest.approx(t.bytes)  # sgd: no optimizer state
    # it sends 7/8 of the pooled outputs, 7/7 of them inside the node
    assert c.send_intra[3] == pytest.approx(out_b * 7 / 8)
    assert c.send_inter[3] == 0


def test_row_wise_splits_ids_and_state():
    t = Table("t", rows=800, dim=64)
    env = RecEnv(**{**ENV.__dict__, "optimizer": "rowwise_adagrad"})
    shards = tuple(Shard(r, lo, 0, n, 64) for r, (lo, n) in enumerate(emb.even_rows(800, 8)))
    c = emb.price(t, Layout("row_wise", shards), env)
    assert sum(s.rows for s in shards) == 800
    assert len(c.lookup_s) == 8 and len(set(round(v, 15) for v in c.lookup_s.values())) == 1
    assert c.hbm_bytes[0] == pytest.approx(100 * 64 * 4 + 100 * 4)  # rows + one fp32 per row


def test_uvm_cache_is_between_hbm_and_host():
    t = Table("t", rows=10_000_000, dim=128, skew=0.5)
    one = (Shard(0, 0, 0, t.rows, t.dim),)
    hbm = emb.price(t, Layout("table_wise", one, "hbm"), ENV).lookup_s[0]
    cached = emb.price(t, Layout("table_wise", one, "uvm_caching", 0.2), ENV)
    host = emb.price(t, Layout("table_wise", one, "host"), ENV).lookup_s[0]
    assert hbm < cached.lookup_s[0] < host
    assert cached.hbm_bytes[0] == pytest.approx(0.2 * t.bytes)
    assert cached.host_bytes[0] == pytest.approx(t.bytes)
    assert emb.coverage(0.2, 0.5) == pytest.approx(0.2 ** 0.5)
    assert emb.coverage(0.2, 0.0) == pytest.approx(0.2)


def test_data_parallel_reduces_the_whole_table():
    t = Table("t", rows=1000, dim=16)
    shards = tuple(Shard(r, 0, 0, 1000, 16) for r in range(8))
    c = emb.price(t, Layout("data_parallel", shards), ENV)
    assert c.allreduce_bytes == t.bytes
    assert c.recv_bytes_per_rank == 0 and not c.send_intra


def test_allreduce_and_even_rows():
    assert emb.allreduce_s(0, ENV) == 0
    ring = 2 * 7 / 8 * 1e9 / 231e9 + 14 * 3e-6
    assert emb.allreduce_s(1e9, ENV) == pytest.approx(ring)
    assert emb.even_rows(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]


@pytest.mark.parametrize("field,value", [("rows", 0), ("dim", 2.5), ("pooling", -1), ("skew", 1.0)])
def test_bad_tables_name_the_field(field, value):
    kw = {"name": "t", "rows": 10, "dim": 8, field: value}
    with pytest.raises(SpecError, match=f"tables.t.{field}"):
        Table(**kw)
