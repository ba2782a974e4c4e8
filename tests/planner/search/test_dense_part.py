"""A recommendation model's dense part, planned by the dense search (planner.search.dense_part)."""

import json

import pytest

from costmodels.comm import beside_compute_s
from costmodels.engine import EngineSpec
from costmodels.topology import get_cluster
from planner.recsys_api import plan_recsys, prepare_recsys
from planner.cli.main import main
from planner.errors import SpecError
from planner.search.dense_part import DensePart, dense_options
from planner.search.tables import RecOptions, plan_tables

pytest.importorskip("torchrec")


@pytest.fixture(scope="module")
def dlrm():
    return prepare_recsys("dlrm-criteo-1tb")


def test_the_dense_part_is_traced_apart_from_its_tables(dlrm):
    # DLRM's MLPs: 13-512-256-128 and 479-1024-1024-512-256-1 (tables excluded)
    mlps = (13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128 + 479 * 1024 + 1024
            + 1024 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256 + 256 + 1)
    assert dlrm.rec.dense_params == mlps
    assert dlrm.dense.info["num_params"] == mlps


def test_ddp_first_then_fsdp2_with_less_memory(dlrm):
    cl = get_cluster("dgx-a100-40g")
    parts = dense_options(dlrm.dense.blocks, cl, global_batch=65536, dtype="fp32",
                          optimizer="adam", engine=EngineSpec())
    assert [p.zero for p in parts] == [0, 3]
    assert parts[1].memory_bytes < parts[0].memory_bytes
    # priced op by op: forward + backward of ~4.9 MFLOP per sample on 8,192 samples in fp32
    # (19.5 TFLOP/s) takes longer than the FLOPs at the GEMM ceiling alone
    floor = 3 * 4.9e6 * 8192 / 19.5e12
    assert floor < parts[0].compute_s < 3 * floor
    (pinned,) = dense_options(dlrm.dense.blocks, cl, global_batch=65536, dtype="fp32",
                              optimizer="adam", engine=EngineSpec(), zero=3)
    assert pinned == parts[1]


def test_the_placement_falls_back_to_the_leaner_dense_part(dlrm):
    cl = get_cluster("dgx-a100-40g")
    opts = RecOptions(time_limit_s=2)
    huge = DensePart(zero=0, compute_s=1e-3, backward_s=6e-4, reduce_s=0.0, exposed_s=0.0,
                     optimizer_s=0.0, memory_bytes=cl.device.memory_bytes)  # no room for tables
    lean = DensePart(zero=3, compute_s=1e-3, backward_s=6e-4, reduce_s=2e-4, exposed_s=1e-4,
                     optimizer_s=0.0, memory_bytes=1e8)
    tp = plan_tables(dlrm.rec, cl, global_batch=65536, opts=opts, dense=(huge, lean))
    assert tp.dense is lean and tp.dense_memory_bytes == lean.memory_bytes
    assert tp.breakdown["dense_compute_s"] == lean.compute_s


def _part(zero, *, reduce_s, exposed_s=0.0):
    return DensePart(zero=zero, compute_s=3e-3, backward_s=2e-3, reduce_s=reduce_s,
                     exposed_s=exposed_s, optimizer_s=1e-4, memory_bytes=1e8)


def test_the_tables_allreduce_shares_the_backward_with_the_dense_reduction(dlrm):
    cl = get_cluster("dgx-a100-40g")
    dp = [(t.name, "data_parallel", "hbm") for t in dlrm.rec.tables if t.rows < 100_000]
    opts = RecOptions(fixed=tuple(dp), time_limit_s=2)

    def price(part):
        return plan_tables(dlrm.rec, cl, global_batch=65536, opts=opts, dense=(part,))

    alone = price(_part(0, reduce_s=0.0))
    tables_s = alone.breakdown["grad_allreduce_s"]
    assert tables_s > 0  # the data-parallel tables' all-reduce
    # DDP: one reduction of dense and table gradients, hidden by the backward (2 ms) up to it,
    # slowing that backward while it runs (the device's overlap_slowdown)
    s = cl.device.overlap_slowdown
    ddp = price(_part(0, reduce_s=1.9e-3))
    assert ddp.breakdown["grad_allreduce_s"] == pytest.approx(1.9e-3 + tables_s)
    assert ddp.breakdown["grad_allreduce_exposed_s"] == pytest.approx(
        beside_compute_s(1.9e-3 + tables_s, 2e-3, s))
    # FSDP2: its own exposed traffic, and the tables' all-reduce in the backward it leaves (the
    # dense reduction took 1.9 ms / (1 + s) of it)
    fsdp = price(_part(3, reduce_s=1.9e-3, exposed_s=4e-4))
    assert fsdp.breakdown["grad_allreduce_exposed_s"] == pytest.approx(
        4e-4 + beside_compute_s(tables_s, 2e-3 - 1.9e-3 / (1 + s), s))
    for tp in (ddp, fsdp):
        assert tp.breakdown["dense_optimizer_s"] == 1e-4
        assert tp.breakdown["device_s"] >= (3e-3 + 1e-4 + tp.breakdown["grad_allreduce_exposed_s"])


def test_plans_state_how_the_dense_part_runs(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["solve", "two-tower", "--cluster", "dgx-a100-40g", "--global-batch", "8192",
                 "--fix", "zero=3", "--time-limit", "2", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["parallel"]["zero"] == doc["embeddings"]["dense"]["zero"] == 3
    assert doc["embeddings"]["dense"]["engine"] == "FSDP2 fully_shard"
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    assert "FSDP2" in capsys.readouterr().out


def test_only_ddp_or_fsdp2_for_the_dense_part():
    with pytest.raises(SpecError, match="fix.zero"):
        plan_recsys("two-tower", cluster="dgx-a100-40g", global_batch=8192, fix="zero=1")
