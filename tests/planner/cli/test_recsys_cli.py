"""Recommendation models through `plan solve` / `plan show`, and their one-line errors."""

import json
import os

import pytest

from planner.cli.main import main

SITES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples",
                     "two_sites.yaml")

FACTORY = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.EmbeddingBag(50000, 32, mode="sum")
        self.item = nn.EmbeddingBag(20000, 32, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, users, items):
        return self.mlp(torch.cat([self.user(users), self.item(items)], dim=1))


def make():
    return Tiny(), (torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, 1, dtype=torch.long))
'''


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_model_plans_and_shows(capsys, tmp_path):
    path = tmp_path / "p.json"
    code, out, err = run(capsys, "solve", "two-tower", "--cluster", "dgx-a100-40g", "--nodes", "1",
                         "--global-batch", "8192", "-o", str(path))
    assert code == 0, err
    plan = json.loads(path.read_text())
    e = plan["embeddings"]
    assert e["world_size"] == 8 and e["local_batch"] == 1024 and len(e["tables"]) == 2
    assert plan["training"]["dtype"] == "fp32"  # TorchRec's default, not bf16
    code, out, err = run(capsys, "show", str(path))
    assert code == 0, err
    for word in ("tables", "imbalance", "rank", "CP-SAT", "samples/s", "software", "TorchRec"):
        assert word in out
    # the header's optimizer is the dense part's; the tables' own is on the tables line
    assert "fp32, adam for the dense part" in out and "fused in the backward" in out
    code, out, err = run(capsys, "show", str(path), "--json")  # the tables' layouts for scripts
    tables = json.loads(out)["embeddings"]["tables"]
    assert code == 0 and [(t["name"], t["sharding_type"], t["ranks"]) for t in tables] == [
        (t["name"], t["sharding_type"], t["ranks"]) for t in e["tables"]]


def test_module_with_embedding_bags_and_a_tables_yaml(capsys, tmp_path):
    (tmp_path / "tiny.py").write_text(FACTORY)
    (tmp_path / "tiny.tables.yaml").write_text("tables:\n  user: {pooling: 3, skew: 0.5}\n")
    path = tmp_path / "p.json"
    code, out, err = run(capsys, "solve", f"{tmp_path}/tiny.py:make", "--cluster", "cpu",
                         "--global-batch", "64", "-o", str(path))
    assert code == 0, err
    tables = {t["name"]: t for t in json.loads(path.read_text())["embeddings"]["tables"]}
    assert tables["user"]["pooling"] == 3 and tables["user"]["skew"] == 0.5
    assert tables["item"]["pooling"] == 1
    # the table the file leaves out is named (a new-user check found every table at 1 id per
    # sample, silently)
    assert "ids per sample of item not given, 1 taken" in err and "of user" not in err
    # a factory whose model comes from a file beside it, which it imports (a review saw it
    # taken for a dense model, whose example inputs it lacked)
    (tmp_path / "entry.py").write_text("from tiny import make\n\n\ndef build():\n"
                                       "    return make()\n")
    code, out, err = run(capsys, "solve", f"{tmp_path}/entry.py:build", "--cluster", "cpu",
                         "--global-batch", "64", "-o", str(tmp_path / "q.json"))
    assert code == 0, err
    assert len(json.loads((tmp_path / "q.json").read_text())["embeddings"]["tables"]) == 2


@pytest.mark.parametrize("extra,words", [
    (["--fix", "tp=2"], "sharding=<type>"),
    (["--fix", "zero=0,tp=2"], "fix.tp:"),
    (["--fix", "zero=2"], "give zero=0 or zero=3"),
    (["--fix", "sharding=diagonal"], "sharding: expected one of"),
    (["--tables", "/nonexistent.yaml"], "not found"),
    (["--global-batch", "1001"], "global_batch"),
    (["--seq-len", "2048"], "seq_len: 2048 given, but a recommendation model's samples are rows"),
    (["--target", "megatron"], "target: megatron given, but recommendation models are planned "
                               "for TorchRec's engine"),
    (["--cluster", SITES], "cluster: 2 node groups (sites or device types)"),
    # (a new-user check got an fp8 plan priced as 16-bit, which plan run then refused)
    (["--dtype", "fp8", "--cluster", "dgx-h100"], "dtype: fp8 does not apply to recommendation "
                                                  "models"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, extra, words):
    argv = ["solve", "two-tower", "--cluster", "dgx-a100-40g", "--nodes", "1",
            "--global-batch", "8192"]
    if "--global-batch" in extra:
        argv = argv[:-2]
    if "--cluster" in extra and "--dtype" in extra:  # (fp8 needs a GPU that has it)
        argv = ["solve", "two-tower", "--nodes", "1", "--global-batch", "8192"]
    elif "--cluster" in extra:  # a sites file: no --nodes
        argv = ["solve", "two-tower", "--global-batch", "8192"]
    code, out, err = run(capsys, *argv, *extra)
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("plan: error")]
    assert len(errors) == 1 and words in errors[0]


def test_a_gantt_of_a_recommendation_plan_is_refused_before_the_report(capsys, tmp_path):
    path = tmp_path / "p.json"
    assert run(capsys, "solve", "two-tower", "--cluster", "dgx-a100-40g", "--nodes", "1",
               "--global-batch", "8192", "-o", str(path))[0] == 0
    code, out, err = run(capsys, "show", str(path), "--gantt", str(tmp_path / "g.png"))
    assert code == 2 and out == "" and "gantt: a recommendation plan" in err
    assert not (tmp_path / "g.png").exists()


def test_one_table_is_pinned_apart_from_the_others(capsys, tmp_path):
    """sharding.<table>=<type> pins one table, over sharding=<type> for the rest (a review's
    18-wide table, which only a copy on every GPU takes, made every all-table pin fail, and the
    error's hint could not be followed); plan solve and plan whatif alike."""
    (tmp_path / "odd.py").write_text(FACTORY.replace("nn.EmbeddingBag(20000, 32", "nn.EmbeddingBag("
                                                     "20000, 18").replace("nn.Linear(64, 64)",
                                                                          "nn.Linear(50, 64)"))
    spec = f"{tmp_path}/odd.py:make"
    args = ("--cluster", "dgx-a100-40g", "--global-batch", "8192")
    code, _, err = run(capsys, "solve", spec, *args, "--fix", "sharding=row_wise")
    assert code == 2 and "pin sharding.item=data_parallel (a copy on every GPU)" in err
    path = tmp_path / "p.json"
    code, _, err = run(capsys, "solve", spec, *args, "--fix",
                       "sharding=row_wise,sharding.item=data_parallel", "-o", str(path))
    assert code == 0, err
    kinds = {t["name"]: t["sharding_type"] for t in json.loads(path.read_text())["embeddings"]
             ["tables"]}
    assert kinds == {"user": "row_wise", "item": "data_parallel"}
    code, out, err = run(capsys, "whatif", spec, *args, "--fix", "sharding.item=data_parallel",
                         "--vary", "sharding=row_wise,table_wise")
    assert code == 0, err
    assert "tables data_parallel 1, row_wise 1" in out and "data_parallel 1, table_wise 1" in out
    for pin, words in (("sharding.item=diagonal", "fix.sharding.item: expected sharding.<table>="
                                                  "<type> with a type of data_parallel"),
                       ("sharding.nope=row_wise", "fix.sharding.nope: not a table of the model "
                                                  "(its tables: item, user)")):
        code, _, err = run(capsys, "solve", spec, *args, "--fix", pin)
        assert code == 2 and words in err, err


def test_a_factory_of_the_planners_recnet_plans_from_the_command_line(capsys, tmp_path):
    """A factory building planner.trace.recsys.RecNet (TorchRec imported lazily, under the meta
    device the factory runs on) is a recommendation model to `plan solve`."""
    pytest.importorskip("torchrec")
    tiny = os.path.join(os.path.dirname(SITES), "..", "tests", "planner", "runtime",
                        "recsys_tiny.py")
    code, out, err = run(capsys, "solve", f"{tiny}:model", "--cluster", "cpu", "--global-batch",
                         "64", "-o", str(tmp_path / "p.json"))
    assert code == 0, err
    assert "embedding" in out.lower() and json.loads((tmp_path / "p.json").read_text())[
        "embeddings"]["tables"]


def test_recsys_options_on_a_dense_model_are_refused(capsys):
    code, out, err = run(capsys, "solve", "gpt2", "--cluster", "dgx-a100-40g", "--nodes", "1",
                         "--global-batch", "8", "--pipeline", "nested")
    assert code == 2 and "plan: error: pipeline: applies to recommendation models (models with " \
        "embedding tables) only; leave it out for this model" in err


def test_whatif_of_a_recommendation_model_counts_samples(capsys):
    """A sample of a recommendation model is not a sequence of tokens: the what-if table's rate
    column says samples/s and holds each point's samples per second."""
    code, out, err = run(capsys, "whatif", "two-tower", "--cluster", "dgx-a100-40g",
                         "--global-batch", "8192", "--vary", "nodes=1,2")
    assert code == 0, err
    head = out.splitlines()[0]
    assert "samples/s" in head and "tokens/s" not in head
    for extra in (["--seq-len", "2048"], ["--vary", "seq_len=1024,2048"]):
        code, out, err = run(capsys, "whatif", "two-tower", "--cluster", "dgx-a100-40g",
                             "--global-batch", "8192", "--vary", "nodes=1", *extra)
        assert code == 2 and "a recommendation model's samples are rows of features" in err


def test_whatif_of_a_recommendation_model_varies_and_pins_its_sharding(capsys, tmp_path):
    """A new-user check found --fix sharding= and --vary sharding= refused ('unknown knob'), and
    a varied tp answered with a hint naming the knob whatif refused. Tables sharded one way per
    point now, the layout in the configuration column; the dense knobs named as not taken."""
    base = ["whatif", "two-tower", "--cluster", "dgx-a100-40g", "--global-batch", "8192"]
    code, out, err = run(capsys, *base, "--vary", "sharding=table_wise,row_wise",
                         "--price-per-gpu-hour", "a100=2")
    assert code == 0, err
    lines = out.splitlines()
    assert "$/M samples" in lines[0]
    assert "; tables table_wise 2" in lines[1] and "; tables row_wise 2" in lines[2]
    # the dense part's data parallelism alone: no stages, tensor split or schedule to name
    assert "dense DDP x8, local batch 1024; tables" in lines[1] and "tp=" not in out, out
    code, out, err = run(capsys, *base, "--vary", "nodes=1,2", "--fix", "sharding=column_wise")
    assert code == 0 and out.count("; tables column_wise 2") == 2, err
    for argv, words in ((["--vary", "tp=1,2"], "vary.tp: a recommendation model takes sharding="
                                               "<type> (its tables) and zero=0|3 (its dense "
                                               "part) as knobs, not tp"),
                        (["--vary", "sharding=rows"], "vary.sharding: expected one of "),
                        (["--vary", "nodes=1", "--fix", "sharding=rows"], "fix.sharding: expected"),
                        (["--vary", "sharding=row_wise", "--fix", "sharding=row_wise"],
                         "vary.sharding: also given as sharding=row_wise (fix)")):
        code, _, err = run(capsys, *base, *argv)
        assert code == 2 and words in err, err
    code, _, err = run(capsys, "whatif", "gpt2", "--cluster", "dgx-a100-40g", "--global-batch",
                       "8", "--vary", "sharding=row_wise")
    assert code == 2 and "vary.sharding: shards a recommendation model's embedding tables, and " \
        "this model has none" in err
    plan = str(tmp_path / "tt.json")
    assert run(capsys, "solve", "two-tower", "--cluster", "dgx-a100-40g", "--nodes", "1",
               "--global-batch", "8192", "-o", plan)[0] == 0
    code, _, err = run(capsys, "show", plan, "--why", "sharding=row_wise")
    assert code == 2 and "why: not available for recommendation plans" in err \
        and "plan whatif --vary sharding=" in err


@pytest.mark.parametrize("text,words", [
    ("tables:\n  t_cat_0: {poolng: 3}\n", "tables.t_cat_0.poolng: unknown key; use pooling"),
    ("tabels:\n  t_cat_0: {pooling: 3}\n", "unknown key 'tabels'"),
    ("tables:\n  usr: {pooling: 3}\n", "tables.usr: not a table of the model (its tables: t_cat_0"),
    # values that are not numbers (a new user's pooling: abc, skew: null and TorchRec's list of
    # pooling factors ended in an internal error), or not in range
    ("tables:\n  t_cat_0: {pooling: abc}\n",
     "tables.t_cat_0.pooling: expected a number of ids per sample and feature above 0 and below "
     "1,000,000, e.g. 1.5, got 'abc'"),
    # (a review's 1e9 was refused by the table itself, without the file's name or the bound)
    ("tables:\n  t_cat_0: {pooling: 1e9}\n", "t.yaml: tables.t_cat_0.pooling: expected "
                                              "a number of ids per sample and feature above 0 "
                                              "and below 1,000,000"),
    ("tables:\n  t_cat_0: {skew: null}\n", "tables.t_cat_0.skew: expected a number from 0"),
    ("tables:\n  t_cat_0: {skew: 1.0}\n", "up to, not including, 1, e.g. 0.6, got 1.0"),
    ("tables:\n  t_cat_0: {pooling: [1, 2]}\n", "got [1, 2] (one figure for all the table's "
                                                 "features: their mean)"),
    ("tables:\n  t_cat_0: {features: 2.5}\n", "tables.t_cat_0.features: expected a whole number"),
    ("tables:\n  t_cat_0: {pooling: true}\n", "got True"),
])
def test_a_tables_file_with_a_typo_names_the_key(capsys, tmp_path, text, words):
    tables = tmp_path / "t.yaml"
    tables.write_text(text)
    code, _, err = run(capsys, "solve", "two-tower", "--cluster", "dgx-a100-40g", "--nodes", "1",
                       "--global-batch", "8192", "--tables", str(tables))
    errors = [line for line in err.splitlines() if line.startswith("plan: error")]
    assert code == 2 and len(errors) == 1 and words in errors[0], err


def test_a_missing_tables_file_and_a_misspelled_table_optimizer_say_the_fix(capsys, tmp_path):
    base = ("solve", "two-tower", "--cluster", "dgx-a100-40g", "--nodes", "1", "--global-batch",
            "8192")
    code, _, err = run(capsys, *base, "--tables", str(tmp_path / "nope.yaml"))
    assert code == 2 and "tables file: file" in err and "not found; give the path of a YAML of " \
        "'tables:' name -> {pooling, skew, features}, or leave --tables out" in err
    code, _, err = run(capsys, *base, "--table-optimizer", "adagrad")
    assert code == 0, err
    import planner
    with pytest.raises(planner.SpecError, match="^table_optimizer: expected one of"):
        planner.plan("two-tower", cluster="dgx-a100-40g", nodes=1, global_batch=8192,
                     table_optimizer="adagard")


def test_whatif_of_a_recommendation_model_takes_its_tables_settings(capsys, tmp_path):
    """A new user could not sweep the table optimizer or the pipeline, nor give a tables file:
    plan whatif takes --tables, --table-optimizer and --pipeline (or varies the last two), as
    plan solve does; a dense model refuses them."""
    import planner.explore.sweep as sweep
    base = ["whatif", "two-tower", "--cluster", "dgx-a100-40g", "--nodes", "1",
            "--global-batch", "8192"]
    code, out, err = run(capsys, *base, "--vary", "table_optimizer=sgd,adam",
                         "--vary", "pipeline=sparse-dist,nested")
    assert code == 0, err
    assert sum("table_optimizer=adam pipeline=nested" in ln for ln in out.splitlines()) == 1
    for argv, words in ((["--vary", "nodes=1", "--pipeline", "sparse-dist", "--vary",
                          "pipeline=none,nested"], "vary.pipeline: also given as "
                                                   "pipeline=sparse-dist (--pipeline)"),
                        (["--vary", "table_optimizer=sgd,adagard"],
                         "vary.table_optimizer: expected one of sgd, rowwise_adagrad")):
        code, _, err = run(capsys, *base, *argv)
        assert code == 2 and words in err, err
    code, _, err = run(capsys, "whatif", "gpt2", "--cluster", "dgx-a100-40g", "--global-batch",
                       "8", "--vary", "nodes=1", "--table-optimizer", "sgd")
    assert code == 2 and "table_optimizer: applies to recommendation models" in err
    # the tables' statistics reach every point: more ids per sample, longer lookups
    rows = [sweep.whatif("dlrm-criteo-1tb", cluster="dgx-a100-40g", nodes=1,
                         global_batch=65536, vary={"pipeline": ["none"]}, time_limit_s=2,
                         tables=stats)[0] for stats in
            (None, {f"t_cat_{i}": {"pooling": 50} for i in range(26)})]
    assert rows[1]["step_time_s"] > rows[0]["step_time_s"]
