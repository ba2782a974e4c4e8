"""The plan file's schema and the planner's lists of choices say the same thing."""

import json
import os
from importlib import resources

import pytest

from planner.errors import SpecError
from costmodels.pipeline import SCHEDULES
from planner.options import DTYPES, OPTIMIZERS, RECOMPUTE, ZERO_STAGES
from planner.planfile.document import clean
from planner.planfile.schema import schema, validate


def test_schema_enums_are_the_options_lists():
    text = resources.files("planner.planfile").joinpath("plan.v1.json").read_text()
    props = json.loads(text)["properties"]
    assert tuple(props["training"]["properties"]["dtype"]["enum"]) == DTYPES
    assert tuple(props["training"]["properties"]["optimizer"]["enum"]) == OPTIMIZERS
    assert tuple(props["parallel"]["properties"]["recompute"]["enum"]) == RECOMPUTE
    assert tuple(props["parallel"]["properties"]["zero"]["enum"]) == ZERO_STAGES
    # (a hand-edited "zigzag" ran as a plan before: a new-user check)
    assert tuple(props["parallel"]["properties"]["schedule"]["enum"]) == SCHEDULES
    assert schema()["properties"] == props


def test_wrong_schema_id_and_rounding():
    with pytest.raises(SpecError, match="schema is 'x'"):
        validate({"schema": "x"}, "p.json")
    # a model's config given where a plan goes (a new-user check: `plan run config.json`)
    with pytest.raises(SpecError, match=r"^c.json: this is a model's config.json, not a plan; "
                                        r"make a plan of it first with `plan solve"):
        validate({"model_type": "llama", "hidden_size": 64}, "c.json")
    # plan run's own results given back to it (a new-user check read only 'not a plan file')
    with pytest.raises(SpecError, match=r"^m.json: this is what plan run measured \(its -o "
                                        r"file\), not a plan; give the plan file it ran$"):
        validate({"measured": {"step_time_s": 0.3}, "predicted": {}}, "m.json")
    assert clean({"a": 1.23456789, "b": [0.0, 3], "c": True}) == {"a": 1.23457, "b": [0.0, 3],
                                                                  "c": True}


def test_a_plan_whose_engine_settings_no_command_reads_is_refused():
    """Every command reads a plan's training.engine back (show, export, diff alike)."""
    path = os.path.join(os.path.dirname(__file__), "..", "export", "data", "plans",
                        "mixtral-8x7b-ep8-megatron.json")
    d = json.load(open(path))
    validate(d, "p.json")
    d["training"]["engine"] = {**d["training"].get("engine", {}), "moe_dispatcher": "bogus"}
    with pytest.raises(SpecError, match=r"^p.json: training.engine.moe_dispatcher: expected one of "
                                        r"alltoall, allgather, deepep, got 'bogus'$"):
        validate(d, "p.json")


def test_a_step_part_longer_than_the_step_is_refused():
    """Fuzz seed 1303, case 405: a part of 1e30 s broke plan show's bars (an internal error)."""
    path = os.path.join(os.path.dirname(__file__), "..", "export", "data", "plans",
                        "mixtral-8x7b-ep8-megatron.json")
    d = json.load(open(path))
    d["predicted"]["breakdown"]["bubble_s"] = 1e30
    with pytest.raises(SpecError, match=r"^p.json: predicted.breakdown.bubble_s = 1e\+30 s is "
                                        r"not a part of the .* s step"):
        validate(d, "p.json")


@pytest.mark.parametrize("where,value,words", [
    (("search", "rejected", "slower than the top k"), "10", "'10' is not of type 'integer'"),
    (("model", "frozen_params"), -5, "-5 is less than the minimum of 0")])
def test_counts_a_command_reads_back_are_checked(where, value, words):
    """Fuzz seed 1700, case 16: a count written as text (search.rejected) broke plan show's
    search lines (an internal error); the frozen parameters' count is read the same way."""
    path = os.path.join(os.path.dirname(__file__), "..", "export", "data", "plans",
                        "mixtral-8x7b-ep8-megatron.json")
    d = json.load(open(path))
    *parents, key = where
    node = d
    for k in parents:
        node = node[k]
    node[key] = value
    with pytest.raises(SpecError, match=r"^p.json: invalid plan at " + r"\.".join(where)) as info:
        validate(d, "p.json")
    assert words in str(info.value)


def test_engine_names_in_a_plan_file_read_in_the_case_commands_compare():
    """A hand-edited plan's "DeepEP" is the deepep every reader (exports) compares against (a
    review: validated in any case, exported as if not set)."""
    import planner.planfile.document as document
    path = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "plans",
                        "uneven-llama3-8b.json")
    d = json.load(open(path))
    d["training"]["engine"] = {**d["training"].get("engine", {}), "moe_dispatcher": "DeepEP"}
    assert document.Plan.from_dict(d).training["engine"]["moe_dispatcher"] == "deepep"


@pytest.mark.parametrize("edit,said", [
    (lambda d: d["parallel"].update(placement="pp-tp-dp"),
     r"parallel.placement 'pp-tp-dp' is not one of tp-pp-dp, tp-dp-pp"),
    (lambda d: d["training"].update(global_batch=250),
     r"micro_batch x num_microbatches x dp = 1 x 32 x 8 = 256 samples, but "
     r"training.global_batch is 250"),
    (lambda d: d["parallel"].update(num_microbatches=16), r"micro_batch x .* = 128 samples, but"),
    (lambda d: d["parallel"].update(ep=2), r"parallel.ep = 2, but the model has no routed experts"),
    (lambda d: d["stages"][1]["modules"].remove("model.layers.3"),
     r"stages\[1\].modules are not the modules of its blocks"),
    (lambda d: d["cluster"].update(nodes=4),
     r"cluster.nodes x gpus_per_node = 4 x 8, but cluster.num_gpus is 64")])
def test_hand_edits_the_engines_would_run_otherwise_are_refused(edit, said):
    """A new-user check of the exports edited a plan by hand: a placement no engine has crashed
    DeepSpeed's export; a batch that did not add up, ep on a dense model, a stage that lost a
    layer's module and nodes not matching the GPUs were exported, exit 0."""
    path = os.path.join(os.path.dirname(__file__), "..", "export", "data", "plans",
                        "llama3-70b-pp4-torchtitan.json")
    d = json.load(open(path))
    validate(d, "p.json")
    edit(d)
    with pytest.raises(SpecError, match=r"^p.json: " + said):
        validate(d, "p.json")


def test_a_hand_edited_tables_sharding_is_refused():
    """A new-user check: a shard on rank 99 of 8, and one of 5 x 5 of a 1M x 32 table, were shown
    and exported to TorchRec."""
    import copy

    from planner.planfile.document import Plan

    golden = json.load(open("tests/golden/plans/dlrm-criteo-1tb.json"))
    Plan.from_dict(golden, "g.json")  # (as plan solve wrote it: every kind of sharding)
    kinds = {t["sharding_type"]: i for i, t in enumerate(golden["embeddings"]["tables"])}
    for kind, edit, said in (
            ("row_wise", lambda sh: sh[0].update(rank=99), r"shards\[0\]\.rank: 99 is not one of"),
            ("column_wise", lambda sh: sh[0].update(sizes=[5, 5]), "do not cover"),
            ("row_wise", lambda sh: sh[1].update(offsets=sh[0]["offsets"]), "do not cover"),
            ("column_wise", lambda sh: sh[0].update(offsets=[0, 10 ** 6]), "lie outside"),
            ("data_parallel", lambda sh: sh[0].update(sizes=[1, 1]), "copies are whole")):
        d = copy.deepcopy(golden)
        edit(d["embeddings"]["tables"][kinds[kind]]["shards"])
        with pytest.raises(SpecError, match=said):
            Plan.from_dict(d, "g.json")


def test_an_empty_row_shard_and_an_unstated_pipeline_rank_are_read_as_written():
    """A review: TorchRec's even row split leaves the last ranks of a small table no rows, and
    such a plan (plan solve's own) was refused; a stage without pipeline_rank (optional in the
    schema: index mod pp) was refused or crashed plan show."""
    import copy

    from planner.planfile.document import Plan
    from planner.report.summary import summary

    golden = json.load(open("tests/golden/plans/dlrm-criteo-1tb.json"))
    d = copy.deepcopy(golden)
    table = next(t for t in d["embeddings"]["tables"] if t["sharding_type"] == "row_wise")
    *_, before, last = table["shards"]
    before["sizes"][0] += last["sizes"][0]  # the rank before takes the last rank's rows
    last["offsets"][0], last["sizes"][0] = table["rows"], 0
    Plan.from_dict(d, "g.json")
    dense = json.load(open("tests/planner/export/data/plans/llama3-70b-pp4-megatron.json"))
    for st in dense["stages"]:
        del st["pipeline_rank"]
    assert "pipeline ranks unequal" in summary(Plan.from_dict(dense, "p.json"))
    dense["stages"][0]["pipeline_rank"] = 5
    with pytest.raises(SpecError, match=r"stages\[0\]\.pipeline_rank: 5 is not one of the 4"):
        Plan.from_dict(dense, "p.json")
