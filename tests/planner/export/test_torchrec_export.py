"""The TorchRec export of recommendation plans (planner.export.torchrec): golden file, the exported
Python run for real, TorchRec's own planner given its constraints, and the refusals.

Golden files: tests/golden/plans/dlrm-criteo-1tb.json is a plan of DLRM on Criteo 1TB over one
DGX A100 (8 x 40 GB), global batch 65,536, SGD, with four tables pinned (``FIXTURE_PINS``: one
row-wise, one column-wise, one table-wise in UVM with a cache, one data-parallel; the rest chosen by
the search), made once by ``make_fixture()``; tests/golden/exports/dlrm-criteo-1tb.torchrec.py is
its export. After a deliberate change to the exporter, regenerate the export (not the plan) with

    .venv/bin/python tests/planner/export/test_torchrec_export.py

and review the diff before committing it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import pytest

from planner.cli.main import main
from planner.errors import SpecError
from planner.export import RECSYS_TARGETS, TARGETS, export, to_torchrec, to_torchrec_json
from planner.planfile.document import load_plan

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden")
PLAN = os.path.join(GOLDEN, "plans", "dlrm-criteo-1tb.json")
EXPORT = os.path.join(GOLDEN, "exports", "dlrm-criteo-1tb.torchrec.py")
DENSE = os.path.join(GOLDEN, "plans", "uneven-llama3-8b.json")
TINY = os.path.join(os.path.dirname(HERE), "runtime", "recsys_tiny.py")
FIXTURE_PINS = (("t_cat_1", "row_wise", "hbm"), ("t_cat_9", "column_wise", "hbm"),
                ("t_cat_20", "table_wise", "uvm_caching"), ("t_cat_2", "data_parallel", "hbm"))


def make_fixture(path: str = PLAN) -> None:
    """The golden plan: planner.recsys_api.plan_recsys's chain with ``FIXTURE_PINS`` pinned."""
    import hashlib

    import planner
    from planner.emit import emit_tables
    from planner.options import TrainingSpec
    from planner.search.tables import RecOptions, plan_tables
    from planner.trace.recsys import rec_model

    cl = planner.load_cluster("dgx-a100-40g", nodes=1)
    rec = rec_model("dlrm-criteo-1tb")
    opts = RecOptions(fixed=FIXTURE_PINS, optimizer="sgd")
    tp = plan_tables(rec, cl, global_batch=65536, opts=opts)
    fingerprint = hashlib.sha256(json.dumps(rec.to_dict(), sort_keys=True).encode()).hexdigest()
    info = {"name": rec.name, "source": "zoo", "spec": "dlrm-criteo-1tb",
            "num_params": int(rec.dense_params + sum(t.rows * t.dim for t in rec.tables)),
            "fingerprint": fingerprint[:16]}
    training = TrainingSpec(global_batch=65536, seq_len=1, dtype="fp32", optimizer="sgd")
    emit_tables(model_info=info, rec=rec, tp=tp, cluster=cl, training=training,
                rec_options=opts).save(path)


def regenerate() -> None:
    text, _ = export(load_plan(PLAN), "torchrec")
    with open(EXPORT, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def load_export(text: str, tmp_path, name: str = "sharding"):
    """The exported file imported as a module, as a TorchRec user would load it."""
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"_exported_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_plan(tmp_path, **kw):
    spec = importlib.util.spec_from_file_location("_recsys_tiny_for_export", TINY)
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    return tiny, load_plan(tiny.make_plan(str(tmp_path / "tiny.json"), **kw))


# ---- golden file --------------------------------------------------------------------------------

def test_the_fixture_holds_every_kind_the_export_writes():
    plan = load_plan(PLAN)
    kinds = {t["sharding_type"] for t in plan.embeddings["tables"]}
    assert {"row_wise", "column_wise", "table_wise", "data_parallel"} <= kinds
    assert any(t["compute_kernel"] == "fused_uvm_caching" for t in plan.embeddings["tables"])


def test_export_matches_golden_file_byte_for_byte():
    text, name = export(load_plan(PLAN), "torchrec")
    with open(EXPORT, encoding="utf-8", newline="") as f:
        assert text == f.read(), "regenerate with: python tests/planner/export/test_torchrec_export.py"
    assert name == "dlrm-criteo-1tb.torchrec.py" and TARGETS["torchrec"][1] == "torchrec.py"


def test_a_model_not_from_the_zoo_is_told_to_set_its_module_path(caplog):
    """MODULE_PATH is where the zoo's models keep their EmbeddingBagCollection; another model's
    tables (plain nn.EmbeddingBag among them) are elsewhere."""
    plan = load_plan(PLAN)
    assert "MODULE_PATH is 'sparse'" not in to_torchrec(plan)
    plan.model["source"] = "factory"
    with caplog.at_level("WARNING", logger="planner.export"):
        text = to_torchrec(plan)
    assert "MODULE_PATH is 'sparse', where the zoo's models keep their tables: set it to" in \
        caplog.text
    assert "# - MODULE_PATH is 'sparse', where the zoo's models keep their tables" in text


def test_the_module_path_is_where_the_model_keeps_its_collection(caplog):
    """A model with its EmbeddingBagCollection at ``ebc``: the plan records the path and the
    export writes it (a new user's export wrote 'sparse' and only warned)."""
    pytest.importorskip("torchrec")
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    from planner.trace.recsys import rec_model

    class Rec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=16, num_embeddings=100, feature_names=[f"f{i}"])
                for i in range(2)], device=torch.device("meta"))
            self.top = torch.nn.Linear(32, 1)

    rec = rec_model(Rec(), stats={"t0": {"pooling": 1}, "t1": {"pooling": 1}})
    assert {t.module for t in rec.tables} == {"ebc"}
    plan = load_plan(PLAN)
    plan.model["source"] = "factory"
    for t in plan.embeddings["tables"]:
        t["module"] = "ebc"
    with caplog.at_level("WARNING", logger="planner.export"):
        text = to_torchrec(plan)
    assert "MODULE_PATH = 'ebc'" in text and "MODULE_PATH is 'sparse'" not in caplog.text
    assert json.loads(to_torchrec_json(plan))["module_path"] == "ebc"
    plan.embeddings["tables"][0]["module"] = "other"  # two collections: said
    with caplog.at_level("WARNING", logger="planner.export"):
        assert "MODULE_PATH = 'sparse'" in to_torchrec(plan)
    assert "the tables are in 2 collections (ebc, other)" in caplog.text
    caplog.clear()
    plan.embeddings["tables"][0]["module"] = ""  # one a module of its own: said, not silent
    with caplog.at_level("WARNING", logger="planner.export"):
        assert "MODULE_PATH = 'ebc'" in to_torchrec(plan)
    assert "1 table(s) (t_cat_0) are modules of their own, not in ebc" in caplog.text


def test_the_export_begins_with_the_source_plan():
    plan = load_plan(PLAN)
    text = to_torchrec(plan)
    head = text.splitlines()[1]
    for i in (plan.model["name"], plan.model["fingerprint"], plan.provenance["input_hash"]):
        assert i in head
    assert "Written for torchrec 1.8.0" in text
    assert not re.search(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d", text)


# ---- the exported Python, run --------------------------------------------------------------------

def test_the_exported_file_builds_the_plans_sharding_plan(tmp_path):
    from planner.runtime.table_sharding import sharding_plan

    plan = load_plan(PLAN)
    mod = load_export(to_torchrec(plan), tmp_path)
    assert mod.sharding_plan() == sharding_plan(plan, device_type="cuda", local_world=8)
    assert mod.sharding_plan("cpu") == sharding_plan(plan, device_type="cpu")
    by_name = {t["name"]: t for t in plan.embeddings["tables"]}
    for name, ps in mod.sharding_plan().plan["sparse"].items():
        t = by_name[name]
        assert (ps.sharding_type, ps.compute_kernel) == (t["sharding_type"], t["compute_kernel"])
        if ps.sharding_spec is not None:
            got = sorted((list(s.shard_offsets), list(s.shard_sizes), s.placement.rank())
                         for s in ps.sharding_spec.shards)
            assert got == sorted((s["offsets"], s["sizes"], s["rank"]) for s in t["shards"])
    assert mod.RANKS["t_cat_2"] == list(range(8))  # data-parallel
    assert mod.sharding_plan().plan["sparse"]["t_cat_20"].cache_params.load_factor == \
        by_name["t_cat_20"]["cache_ratio"]


def test_the_exported_file_runs_as_a_script(tmp_path):
    import subprocess

    path = tmp_path / "dlrm.torchrec.py"
    path.write_text(to_torchrec(load_plan(PLAN)))
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    assert "t_cat_1" in out and "row_wise" in out and "column_wise" in out


def test_torchrecs_planner_accepts_the_constraints(tmp_path):
    """TorchRec's EmbeddingShardingPlanner on a 2-process CPU topology, given the exported
    constraints of the tiny model's mixed plan, picks each table's sharding type and kernel."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    tiny, plan = tiny_plan(tmp_path, fixed=(("t_cat_0", "row_wise", "hbm"),
                                            ("t_cat_1", "column_wise", "hbm"),
                                            ("t_cat_2", "table_wise", "uvm_caching"),
                                            ("t_cat_3", "data_parallel", "hbm")))
    mod = load_export(to_torchrec(plan), tmp_path)
    constraints = mod.constraints("cpu")
    assert set(constraints) == {t["name"] for t in plan.embeddings["tables"]}
    model = tiny.model("cpu")[0]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, local_world_size=2, compute_device="cpu"),
        constraints=constraints)
    got = planner.plan(model, [mod.sharder(learning_rate=0.1)]).plan["sparse"]
    for t in plan.embeddings["tables"]:
        want_kernel = "fused" if t["compute_kernel"] == "fused_uvm_caching" else t["compute_kernel"]
        assert (got[t["name"]].sharding_type, got[t["name"]].compute_kernel) == \
            (t["sharding_type"], want_kernel), t["name"]
    assert mod.sharding_plan("cpu", local_world_size=2).plan["sparse"]["t_cat_0"].ranks == [0, 1]


def test_the_json_form_holds_the_same_shards():
    plan = load_plan(PLAN)
    doc = json.loads(to_torchrec_json(plan))
    assert doc["torchrec"] == "1.8.0" and doc["world_size"] == 8
    assert doc["fused_optimizer"] == "EXACT_SGD"
    for t in plan.embeddings["tables"]:
        d = doc["tables"][t["name"]]
        assert d["sharding_type"] == t["sharding_type"]
        if t["sharding_type"] == "data_parallel":
            assert d["shards"] == [] and d["ranks"] == list(range(8))
        else:
            assert sorted((s["offsets"], s["sizes"], s["rank"]) for s in d["shards"]) == \
                sorted((s["offsets"], s["sizes"], s["rank"]) for s in t["shards"])
            assert [s["rank"] for s in d["shards"]] == d["ranks"]


# ---- refusals ------------------------------------------------------------------------------------

def test_a_dense_plan_is_refused_by_the_torchrec_target(capsys):
    with pytest.raises(SpecError) as err:
        export(load_plan(DENSE), "torchrec")
    assert "\n" not in str(err.value) and str(err.value).startswith("export torchrec: ")
    assert "no embedding tables" in str(err.value)
    assert main(["export", DENSE, "--to", "torchrec"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("plan: error:")]
    assert len(lines) == 1 and "--to" in lines[0]


@pytest.mark.parametrize("target", sorted(set(TARGETS) - set(RECSYS_TARGETS)))
def test_a_recsys_plan_is_refused_by_the_dense_targets(target, capsys):
    with pytest.raises(SpecError) as err:
        export(load_plan(PLAN), target)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"export {target}: ") and "--to torchrec" in msg
    assert main(["export", PLAN, "--to", target]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("plan: error:")]
    assert len(lines) == 1 and "--to torchrec" in lines[0]


def test_engine_versions():
    plan = load_plan(PLAN)
    assert export(plan, "torchrec", "1.8")[0] == export(plan, "torchrec")[0]
    with pytest.raises(SpecError, match="torchrec 1.8.0"):
        export(plan, "torchrec", "1.9.0")


def test_the_cli_writes_the_suggested_file_name(tmp_path, capsys):
    assert main(["export", PLAN, "--to", "torchrec", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "dlrm-criteo-1tb.torchrec.py").exists()


if __name__ == "__main__":
    if "--fixture" in sys.argv:  # the plan itself: only when the fixture must change
        make_fixture()
    regenerate()
    print(f"rewrote {EXPORT}")


def test_an_fsdp2_dense_part_is_named_not_written_as_ddp():
    """A plan whose dense part is sharded (FSDP2, ZeRO-3) says so: DistributedModelParallel
    would wrap it in DDP."""
    import dataclasses

    plan = load_plan(PLAN)
    emb = {**plan.embeddings, "dense": {**plan.embeddings["dense"], "zero": 3}}
    text = to_torchrec(dataclasses.replace(plan, embeddings=emb))
    assert "shards it with FSDP2" in text and "--fix zero=0" in text
    assert "data-parallel (DDP, as DistributedModelParallel wraps it)" not in text
    assert "data-parallel (DDP, as DistributedModelParallel wraps it)" in to_torchrec(plan)


def test_sequence_tables_get_the_embedding_collection_sharder(tmp_path, caplog):
    """Tables of an EmbeddingCollection (no pooling): DistributedModelParallel matches sharders
    by module type, so the file builds an EmbeddingCollectionSharder (a review saw the bag
    collection's written, which would leave the tables unsharded); a plan with both kinds says
    what to add. The search offers such tables only the types that sharder takes."""
    pytest.importorskip("torchrec")
    from costmodels.embeddings import Table
    from planner.search.tables import _shardings, _why_not

    plan = load_plan(PLAN)
    for t in plan.embeddings["tables"]:
        t["pooled"] = False
    mod = load_export(to_torchrec(plan), tmp_path)
    from torchrec import EmbeddingCollection
    assert mod.sharder(learning_rate=0.1).module_type is EmbeddingCollection
    assert "the EmbeddingCollection's path in the model" in to_torchrec(plan)
    plan.embeddings["tables"][0]["pooled"] = True
    with caplog.at_level("WARNING", logger="planner.export"):
        to_torchrec(plan)
    assert "are an EmbeddingCollection's (sequence tables): sharder() is the " \
           "EmbeddingBagCollection's" in caplog.text
    seq = Table(name="seq", rows=10_000_000, dim=64, pooled=False)
    for kind in ("table_row_wise", "grid_shard"):
        assert list(_shardings(kind, seq, 16, 8, 0.0, True)) == []
        assert "a sequence table" in _why_not(kind, seq, 16, 8)
    assert list(_shardings("row_wise", seq, 16, 8, 0.0, True))


def test_a_16_bit_plan_says_the_dense_part_needs_casting(caplog):
    """DistributedModelParallel runs the model in its own dtype: a bf16 plan's export says to
    cast the dense part or autocast it (a review saw nothing said); an fp32 plan says nothing."""
    plan = load_plan(PLAN)
    with caplog.at_level("WARNING", logger="planner.export"):
        to_torchrec(plan)
    assert "torch.autocast" not in caplog.text
    plan.training["dtype"] = "bf16"
    with caplog.at_level("WARNING", logger="planner.export"):
        text = to_torchrec(plan)
    assert "dtype bf16: the plan priced the dense part in bf16" in caplog.text
    assert "torch.autocast" in text
