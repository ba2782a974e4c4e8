"""A pinned pipeline layout in Megatron-LM's notation (SearchOptions.layout, plan solve --layout):
parsed, checked against the model, priced on that cut, recorded and exported."""

import pytest

import planner
from planner.errors import SpecError
from planner.export.megatron import to_megatron
from planner.export.torchtitan import to_torchtitan
from planner.options import parse_fix, parse_layout
from tests.conftest import TINY_DEEPSEEK_V3, write_config
from tests.planner.export.test_export import megatron_args, option


def test_the_notation_expands_repeats_and_groups():
    stages = parse_layout("Et*4|(t*4|)*14tmL")  # DeepSeek-V3's 16 stages in Megatron-Bridge
    assert len(stages) == 16 and stages[0] == "Etttt" and stages[-1] == "tmL"
    assert set(stages[1:-1]) == {"tttt"} and sum(s.count("t") for s in stages) == 61
    assert parse_layout("Et|(tt|)*30mL")[-1] == "mL"
    assert parse_layout("E|t*2|L") == ("E", "tt", "L")


@pytest.mark.parametrize("text, why", [
    ("Et*4|tt", r"the head and loss \(L\) close the last stage"),
    ("tE|L", r"the embedding \(E\) opens the first stage"),
    ("Em|tL", r"MTP depths \(m\) run after every layer and before the head"),
    ("Et|mt|L", r"MTP depths \(m\) run after every layer and before the head"),
    ("Et|tm|mL", r"MTP depths \(m\) run on one stage \(Megatron-LM's rule\)"),
    ("E(t|L", r"unbalanced or unrepeated parentheses"),
    ("Etx|L", r"unknown symbols"),
    ("Et||tL", r"an empty stage"),
    # from a review: a trailing '|' (an empty stage in Megatron too), and repeats without bound
    ("EtL|", r"an empty stage"),
    ("et*4|tL", r"unknown symbols 'e'"),
    ("Et*99999999999999L", r"'t\*99999999999999' repeats past 100,000 symbols"),
    ("E(t*1000|)*1000tL", r"it expands past 100,000 symbols"),
    ("Et|*2tL", r"a repeat \(\*n\) follows no symbol or group"),
    # from a new-user check: 't*1 6' was read as t*16
    ("Et*1 6|t*16L", r"spaces are not part of the notation \(Megatron-LM refuses them too\)"),
])
def test_a_wrong_layout_is_named_with_the_fix(text, why):
    with pytest.raises(SpecError, match=rf"^layout: {why}.*; e\.g\. Et\*4\|\(t\*4\|\)\*14tmL"):
        planner.SearchOptions(layout=text)


@pytest.fixture(scope="module")
def tiny_mtp(tmp_path_factory):
    """TINY_DEEPSEEK_V3 (4 layers) with one MTP depth."""
    path = write_config(tmp_path_factory.mktemp("mtp"),
                        {**TINY_DEEPSEEK_V3, "num_nextn_predict_layers": 1})
    return planner.prepare(path, seq_len=64, cache_dir=None)


def _plan(prepared, layout, fix="pp=2"):
    cluster = planner.load_cluster("dgx-h100")
    options = planner.SearchOptions(fix=parse_fix(fix), top_k=0, layout=layout)
    return planner.plan_prepared(prepared, cluster, planner.TrainingSpec(global_batch=16,
                                                                         seq_len=64), options)


def test_the_plan_is_cut_where_the_layout_says_and_records_it(tiny_mtp):
    """The search's balanced cut puts the heavy head (the head, the MTP layer, the head again)
    alone with fewer layers; the pinned one is priced as given, and slower."""
    free = _plan(tiny_mtp, None)
    pinned = _plan(tiny_mtp, "Et*3|tmL")
    blocks = [s["blocks"] for s in pinned.to_dict()["stages"]]
    assert blocks[0] == ["model.embed_tokens"] + [f"model.layers.{i}" for i in range(3)]
    assert blocks[1] == ["model.layers.3", "model.norm..mtp.0", "lm_head"]
    assert pinned.search["options"]["layout"] == "Et*3|tmL"
    assert "layout" not in free.search["options"]
    assert pinned.predicted["step_time_s"] >= free.predicted["step_time_s"]
    interleaved = _plan(tiny_mtp, "Et|t|t|tmL")  # 4 stages on pp=2: vpp 2 follows
    assert interleaved.parallel["vpp"] == 2 and len(interleaved.stages) == 4


@pytest.mark.parametrize("layout, fix, why", [
    ("Et*2|tmL", "pp=2", r"3 layers \(t\) given, the model has 4"),
    ("Et*3|tL", "pp=2", r"0 MTP depths \(m\) given, the model runs 1; write them before L"),
    ("Et*3|tmL", "tp=1", r"its 2 stages are pp x vpp: pin pp too"),
    ("Et|t|t|tmL", "pp=3", r"4 stages, and pp=3 does not make them; use pp one of 2, 4 "
                           r"\(vpp follows: pp x vpp = 4\)"),
    # (a new-user check: pp=1 pinned vpp=4, refused as a vpp the user never gave)
    ("Et|t|t|tmL", "pp=1", r"4 stages, and pp=1 does not make them; use pp one of 2, 4"),
    # (a new-user check was offered the pp it had pinned, the vpp it had pinned not named)
    ("Et|t|t|tmL", "pp=4,vpp=2", r"4 stages on pp=4 are vpp=1, not 2; pin vpp=1 or leave vpp "
                                 r"out \(it follows from the layout\)$"),
])
def test_a_layout_that_does_not_fit_the_model_or_pins_is_refused(tiny_mtp, layout, fix, why):
    with pytest.raises(SpecError, match=rf"^layout: {why}"):
        _plan(tiny_mtp, layout, fix)


def test_an_export_refusing_virtual_stages_suggests_one_stage_per_rank(tiny_mtp):
    """4 stages on pp=2 interleave, which deepspeed does not run: its re-plan command pins pp=4
    (a new-user check was given the plan's pp=2, which the layout then refused), and that plan
    runs on deepspeed."""
    from planner.export import export

    with pytest.raises(SpecError, match=r"interleaved 1F1B") as err:
        export(_plan(tiny_mtp, "Et|t|t|tmL"), "deepspeed")
    command = str(err.value)
    assert "--layout 'Et|t|t|tmL' --fix pp=4 --target deepspeed" in command
    fix = command.split("--fix ")[1].split()[0]
    plan = planner.plan_prepared(
        tiny_mtp, planner.load_cluster("dgx-h100"), planner.TrainingSpec(global_batch=16,
                                                                        seq_len=64),
        planner.SearchOptions(fix=parse_fix(fix), top_k=0, layout="Et|t|t|tmL",
                              target="deepspeed"))
    assert (plan.parallel["pp"], plan.parallel["vpp"]) == (4, 1)


def test_a_layout_of_one_stage_needs_no_pp_pin(tiny_mtp):
    """One stage can only be pp=1 (a new-user check was asked to pin it)."""
    plan = _plan(tiny_mtp, "Et*4mL", "tp=1")
    assert (plan.parallel["pp"], plan.parallel["vpp"], len(plan.stages)) == (1, 1, 1)
    with pytest.raises(SpecError, match=r"^layout: 1 stage is pp=1, not pp=2; pin pp=1 or "
                                        r"leave pp out$"):
        _plan(tiny_mtp, "Et*4mL", "pp=2")
    with pytest.raises(SpecError, match=r"^layout: 1 stage is pp=1 x vpp=1, not vpp=2; leave "
                                        r"vpp out$"):  # (a review: it named pp=1 as wrong)
        _plan(tiny_mtp, "Et*4mL", "vpp=2")


def test_a_pp_the_layout_rules_out_is_named_so_before_the_cluster_check(tmp_path):
    """pp=3 neither makes 4 stages nor divides a node's 8 GPUs: the layout's reason is given,
    before any trace (a new-user check read 'does not divide the cluster's GPUs' first)."""
    path = write_config(tmp_path, {**TINY_DEEPSEEK_V3, "num_nextn_predict_layers": 1})
    with pytest.raises(SpecError, match=r"^layout: 4 stages, and pp=3 does not make them"):
        planner.plan(path, cluster="dgx-h100", global_batch=16, seq_len=64, fix="pp=3",
                     layout="Et|t|t|tmL")
    with pytest.raises(SpecError, match=r"^fix.pp: 3 does not divide the cluster's 8 GPUs"):
        planner.plan(path, cluster="dgx-h100", global_batch=16, seq_len=64, fix="pp=3")


def test_exports_carry_the_mtp_depth_or_say_they_cannot(tiny_mtp):
    """Megatron-LM trains the depth with --mtp-num-layers on the last stage (with the head, as
    priced); torchtitan's model has none, which the export says."""
    with pytest.raises(SpecError, match=r"--layout 'Et\*2\|t\*2mL' --fix pp=2,vpp=1 "
                                         r"--target megatron`$"):  # (a schedule it does not run)
        to_megatron(_plan(tiny_mtp, "Et*2|t*2mL", "pp=2,schedule=zb-h1"))
    plan = _plan(tiny_mtp, "Et*2|t*2mL", "pp=2,schedule=1f1b")
    args = megatron_args(to_megatron(plan))
    assert option(args, "--mtp-num-layers") == "1"
    uneven = megatron_args(to_megatron(_plan(tiny_mtp, "Et|t|t|tmL")))
    assert option(uneven, "--mtp-num-layers") == "1"
    notes = " ".join(line.lstrip("# ").strip() for line in to_torchtitan(plan).splitlines())
    assert "multi-token-prediction depth(s): the plan prices them after the last layer, and " \
        "torchtitan does not train them" in notes


def test_megatrons_standalone_mtp_stage_is_read():
    """Megatron-LM's own example (Et*3|(tt|)*29,m|L: the MTP depth on a stage of its own, as
    NVIDIA's DeepSeek-V3 runs on H100 place it) and the depth with the head."""
    stages = parse_layout("Et*3|(tt|)*29,m|L")
    assert len(stages) == 32 and stages[-2:] == ("m", "L") and stages[-3] == "tt"
    assert parse_layout("Et|tmL") == ("Et", "tmL")


def test_commas_are_cosmetic_as_in_megatron():
    assert parse_layout("Et*3,|(tt|)*29,tmL") == parse_layout("Et*3|(tt|)*29tmL")


def test_why_not_on_a_layout_plan_keeps_the_layout_and_says_where_pp_breaks_it(tiny_mtp):
    """A review: --why pp=... re-planned without the layout (its ruled-out count said "pinned
    layout" and the explanation used a balanced split). The layout is pinned again, with vpp
    following the new pp; a pp that does not divide its stages is named."""
    from planner.explore.whynot import why_not  # noqa: PLC0415
    from planner.report.summary import summary  # noqa: PLC0415

    plan = _plan(tiny_mtp, "Et|t|t|tmL", "pp=2,schedule=interleaved-1f1b")
    assert "stages pinned: --layout 'Et|t|t|tmL'" in summary(plan)
    assert "multi-token prediction: 1 depth(s) priced" in summary(plan)
    answer = why_not(plan, "pp=4,schedule=1f1b")
    assert answer.feasible and answer.variant.parallel["vpp"] == 1
    assert [s["blocks"][-1] for s in answer.variant.to_dict()["stages"]] == [
        "model.layers.0", "model.layers.1", "model.layers.2", "lm_head"]
    with pytest.raises(SpecError, match=r"layout: 4 stages, and pp=3 does not make them"):
        why_not(plan, "pp=3")


def test_torchtitan_names_leave_the_mtp_depth_out(tiny_mtp):
    """A review: the stage holding mtp.0 lost torchtitan's names for the whole model."""
    from planner.export import names  # noqa: PLC0415

    plan = _plan(tiny_mtp, "Et*2|t*2mL", "pp=2,schedule=1f1b")
    plan = type(plan).from_dict({**plan.to_dict(), "model": {**plan.model,
                                                             "spec": "deepseek-v3-mtp",
                                                             "source": "zoo"}})
    parts = names.torchtitan_names(plan, "0.2.2")
    assert parts is not None and parts[-1][-2:] == ["norm", "output"]
    assert not any("mtp" in n for part in parts for n in part)


def test_a_stage_of_the_embedding_alone_needs_an_embedding_side():
    """E alone on its stage holds no block where the model has nothing before its layers."""
    from planner.search.layout import layout_bounds, layout_problem  # noqa: PLC0415

    assert layout_problem("E|t*2|L", [False, True, True, False], 0, 3, None) == ""
    assert layout_bounds("E|t*2|L", [False, True, True, False]) == [0, 1, 3, 4]
    assert layout_problem("E|t*2|L", [True, True, False], 0, 3, None).startswith(
        "layout: stage 0 (E) holds no block of this model")


def test_a_sweep_pins_the_layout_at_every_point(tiny_mtp, tmp_path):
    """plan whatif --layout: each point is cut as the layout says (vpp following its pp); a pp
    that does not make its stages is that point's row; one that does not parse is refused
    before any trace."""
    from planner.explore.sweep import whatif  # noqa: PLC0415

    path = write_config(tmp_path, {**TINY_DEEPSEEK_V3, "num_nextn_predict_layers": 1})
    rows = whatif(path, cluster="dgx-h100", vary={"pp": [2, 4, 8]}, global_batch=16, seq_len=64,
                  layout="Et|t|t|tmL", workers=1)
    by_pp = {r["point"]: r for r in rows}
    assert by_pp["pp=2"]["feasible"] and by_pp["pp=2"]["vpp"] == 2
    assert {r["layout"] for r in rows} == {"Et|t|t|tmL"}  # (a CSV column: the stages pinned)
    assert by_pp["pp=4"]["feasible"] and by_pp["pp=4"]["vpp"] == 1
    assert not by_pp["pp=8"]["feasible"]
    assert "layout: 4 stages, and pp=8 does not make them" in by_pp["pp=8"]["reason"]
    with pytest.raises(SpecError, match=r"^layout: unknown symbols 'x'"):
        whatif("no-such-model", cluster="dgx-h100", vary={"pp": [2]}, global_batch=16,
               layout="Et|x")


def test_a_layout_needing_chunks_names_a_target_without_interleaving(tiny_mtp):
    """A new-user check: --target deepspeed with 4 stages on pp=2 was refused as "fix: no
    configuration with pp=2,vpp=2", a vpp the user never pinned."""
    cluster = planner.load_cluster("dgx-h100")
    training = planner.TrainingSpec(global_batch=16, seq_len=64)
    options = planner.SearchOptions(fix=parse_fix("pp=2"), top_k=0, layout="Et|t|t|tmL",
                                    target="deepspeed")
    with pytest.raises(SpecError, match=r"^layout: 4 stages on pp=2 are 2 chunks per pipeline "
                                        r"rank, an interleaved schedule, which deepspeed does "
                                        r"not run; use pp=4"):
        planner.plan_prepared(tiny_mtp, cluster, training, options)


def test_show_json_says_the_layout_and_the_mtp_depths(tiny_mtp):
    from planner.report.summary import summary_dict  # noqa: PLC0415

    out = summary_dict(_plan(tiny_mtp, "Et*3|tmL"))
    assert out["search"]["layout"] == "Et*3|tmL" and out["model"]["mtp_depths"] == 1
    assert "layout" not in summary_dict(_plan(tiny_mtp, None))["search"]


def test_a_recommendation_sweep_refuses_a_layout():
    """Its tables are sharded, not pipelined: planner.plan refused the layout, and a sweep let
    it pass unused."""
    from planner.explore.sweep import whatif  # noqa: PLC0415

    with pytest.raises(SpecError, match=r"^layout: pins the pipeline stages of a layer stack"):
        whatif("two-tower", cluster="dgx-a100-40g", vary={"nodes": [1]}, global_batch=8192,
               layout="Et|tL")


def test_a_standalone_mtp_stage_is_priced_and_exported_where_the_layout_puts_it(tiny_mtp):
    """Megatron's m|L: the depth on a stage of its own, between the last layers and the head;
    Megatron-LM core_v0.19.0 runs it so (on a rank's last chunk), core_v0.14.0 does not."""
    plan = _plan(tiny_mtp, "Et*2|t*2|m|L", "pp=4,schedule=1f1b")
    blocks = [s["blocks"] for s in plan.to_dict()["stages"]]
    assert blocks[2:] == [["model.norm..mtp.0"], ["lm_head"]]
    assert blocks[1] == ["model.layers.2", "model.layers.3"]
    args = megatron_args(to_megatron(plan, "core_v0.19.0"))
    assert option(args, "--pipeline-model-parallel-layout") == "Et*2|t*2|m|L"
    assert option(args, "--mtp-num-layers") == "1"
    with pytest.raises(SpecError, match=r"export megatron: the MTP depths are on a stage of "
                                        r"their own, which core_v0.14.0 does not run"):
        to_megatron(plan, "core_v0.14.0")
    from planner.report.summary import summary  # noqa: PLC0415

    assert "multi-token prediction: 1 depth(s) priced on stage 2, before the head's stage (3)" \
        in summary(plan)
    # two chunks per rank: stage 2 is rank 0's last chunk, which Megatron-Core takes
    chunked = _plan(tiny_mtp, "Et*2|t*2|m|L", "pp=2,schedule=interleaved-1f1b")
    assert option(megatron_args(to_megatron(chunked, "core_v0.19.0")),
                  "--pipeline-model-parallel-layout") == "Et*2|t*2|m|L"
    # the depth's stage runs about a layer's work; the head's alone far less
    times = [s["predicted"]["compute_s"] for s in plan.to_dict()["stages"]]
    assert times[2] > 0.5 * times[1] / 2 and times[3] < 0.1 * times[2]


def test_two_depths_are_one_block_on_one_stage(tmp_path):
    """A review: with a block per depth the search split them over stages (which Megatron-Core
    refuses), priced the embedding they read once per depth, and re-split a pinned layout."""
    path = write_config(tmp_path, {**TINY_DEEPSEEK_V3, "num_nextn_predict_layers": 2})
    prepared = planner.prepare(path, seq_len=64, cache_dir=None)
    names = [b.name for b in prepared.blocks.blocks]
    assert names[-2:] == ["model.norm..mtp.1", "lm_head"] and prepared.blocks.is_chain()
    assert [s[:2] for s in prepared.blocks.shared] == [["model.embed_tokens",
                                                        "model.norm..mtp.1"]]
    plan = _plan(prepared, "Et*2|t*2|mm|L", "pp=4,schedule=1f1b")
    assert [s["blocks"] for s in plan.to_dict()["stages"]][2:] == [["model.norm..mtp.1"],
                                                                    ["lm_head"]]
    args = megatron_args(to_megatron(plan, "core_v0.19.0"))
    assert option(args, "--pipeline-model-parallel-layout") == "Et*2|t*2|mm|L"
    assert option(args, "--mtp-num-layers") == "2"


def test_a_plan_pricing_its_depth_inside_the_head_block_exports_it_on_the_last_stage(tiny_mtp):
    """A review: a plan written before the depths had a block of their own (the depth inside
    model.norm..lm_head) lost its m in the exported layout beside --mtp-num-layers."""
    plan = _plan(tiny_mtp, "Et*2|t|t|mL", "pp=2,schedule=interleaved-1f1b")
    d = plan.to_dict()
    merged = "model.norm..lm_head"
    last = d["stages"][-1]
    last["blocks"] = [b for b in last["blocks"] if b not in ("model.norm..mtp.0", "lm_head")] + [
        merged]
    by = {b["name"]: b for b in d["model"]["blocks"]}
    depth, head = by.pop("model.norm..mtp.0"), by.pop("lm_head")
    joined = {**head, "name": merged, "modules": depth["modules"] + head["modules"],
              "params": depth["params"] + head["params"]}
    old = type(plan).from_dict({**d, "model": {**d["model"], "blocks": [*by.values(), joined]}})
    args = megatron_args(to_megatron(old, "core_v0.19.0"))
    assert option(args, "--pipeline-model-parallel-layout") == "Et*2|t|t|mL"
