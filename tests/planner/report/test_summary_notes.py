"""What `plan show` says beside the step's parts: the wait of pipeline ranks that carry less work
than the busiest (the parts run along the busiest rank, so its compute holds that wait), why
the plan won a tie over a faster runner-up, and an engine setting the plan has no use for."""

import copy
from types import SimpleNamespace

from costmodels.engine import engine_from_mapping
from planner.options import TrainingSpec
from planner.planfile.document import load_plan
from planner.report.summary import summary
from planner.settings import warn_tp_overlap_unused

PLAN = "tests/planner/export/data/plans/llama3-70b-pp4-megatron.json"


def _line(text: str) -> str:
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if "pipeline ranks unequal" in ln)
    return " ".join(ln.strip() for ln in lines[at:at + 3])


def test_unequal_ranks_are_named_with_what_the_others_wait():
    plan = load_plan(PLAN)  # interleaved, 4 x 3 chunks: ranks 0 and 3 hold the embedding and head
    work = [0.0] * 4
    for s in plan.stages:
        work[s["pipeline_rank"]] += s["predicted"]["time_per_microbatch_s"] - s["predicted"]["p2p_s"]
    wait = plan.parallel["num_microbatches"] * (max(work) - sum(work) / 4)
    line = _line(summary(plan))
    assert line.startswith(f"pipeline ranks unequal: rank 1 computes {1e3 * max(work):.3g} ms a "
                           f"micro-batch (sends apart), rank 0 {1e3 * min(work):.3g} ms")
    assert f"wait for it {wait:.3g} s of the step" in line
    assert f"({100 * wait / plan.predicted['step_time_s']:.0f}%" in line


def test_a_second_and_more_a_micro_batch_reads_in_seconds():
    """A new user read 'rank 3 computes 1.06e+03 ms a micro-batch'."""
    plan = load_plan(PLAN)
    slow = copy.deepcopy(plan)
    for s in slow.stages:
        s["predicted"]["time_per_microbatch_s"] *= 20  # (a rank's chunks: over a second)
    line = _line(summary(slow))
    assert "e+0" not in line and " s a micro-batch (sends apart), rank 0 " in line


def test_equal_ranks_say_nothing():
    plan = load_plan(PLAN)
    even = copy.deepcopy(plan)
    for s in even.stages:
        s["predicted"]["time_per_microbatch_s"] = 0.07 + s["predicted"]["p2p_s"]
    assert "pipeline ranks unequal" not in summary(even)
    assert "pipeline ranks unequal" in summary(plan)


def test_one_stage_has_no_ranks_to_compare():
    plan = load_plan("tests/planner/export/data/plans/llama3-8b-cp4-megatron.json")
    assert plan.parallel["pp"] == 1 and "pipeline ranks unequal" not in summary(plan)


def test_a_runner_up_that_lost_a_tie_says_why():
    """The search's tie-break (search.loop.tie_broken) is said beside the faster runner-up: an
    exported engine runs the plan, or it holds less memory."""
    plan = load_plan(PLAN)  # interleaved 1F1B, which Megatron-LM runs
    plan.search = {**plan.search, "target": "any"}
    step, peak = plan.predicted["step_time_s"], plan.predicted["peak_memory_bytes"]
    zb = {**plan.parallel, "schedule": "zb-h1", "vpp": 1}  # the planner's own runtime alone
    faster = {"parallel": zb, "step_time_s": step * 0.9995, "peak_memory_bytes": peak - 1e9,
              "why": "-0.05% step time: compute -0.01 s"}
    plan.search["alternatives"] = [faster]
    assert "a tie, within 0.1%: an exported engine runs the plan, not this one" in _flat(plan)
    leaner = {**faster, "parallel": {**plan.parallel, "vpp": 2}, "peak_memory_bytes": peak + 1e9}
    plan.search["alternatives"] = [leaner]
    assert "a tie, within 0.1%: the plan holds less memory" in _flat(plan)


def _flat(plan) -> str:
    return " ".join(summary(plan).split())


def test_tp_overlap_with_nothing_to_pipeline_is_said_unused():
    """A review: with engine tp_overlap set and the chosen plan at tp=1, the software line named
    the overlap as if it ran (only a warning at solve time said it changes nothing)."""
    plan = copy.deepcopy(load_plan(PLAN))
    plan.training["engine"]["tp_overlap"] = True
    assert plan.parallel["tp"] == 4 and plan.parallel["sequence_parallel"]
    text = summary(plan)
    assert "collectives overlapped with their GEMMs" in text and "tp_overlap unused" not in text
    plan.parallel["sequence_parallel"] = False
    assert "; tp_overlap unused here (it needs sequence parallelism)" in summary(plan)
    plan.parallel["tp"] = 1
    assert "; tp_overlap unused here (tp=1)" in summary(plan)


def test_tp_overlap_unused_is_warned_when_the_plan_is_made(caplog):
    training = TrainingSpec(global_batch=8, seq_len=128,
                            engine=engine_from_mapping("megatron-core,tp_overlap=true"))
    with caplog.at_level("WARNING", logger="planner"):
        warn_tp_overlap_unused(SimpleNamespace(tp=4, sequence_parallel=True), training)
        assert "tp_overlap" not in caplog.text
        warn_tp_overlap_unused(SimpleNamespace(tp=1, sequence_parallel=False), training)
        assert "no tensor parallelism (tp=1)" in caplog.text
        warn_tp_overlap_unused(SimpleNamespace(tp=2, sequence_parallel=False), training)
        assert "tp=2 without sequence parallelism" in caplog.text


def test_the_parameters_a_token_skips_are_explained_by_the_kind_of_model():
    """A new-user check: Swin's and a mixture of experts' few active parameters were put down
    to 'a lookup table's rows' alone."""
    moe = load_plan("tests/planner/export/data/plans/mixtral-8x7b-ep8-megatron.json")
    assert moe.model.get("routed_experts")
    assert "each token meets only the routed experts it is sent to" in _flat(moe)
    assert "downsampled stages" not in _flat(moe)
    image = copy.deepcopy(moe)
    image.model.pop("routed_experts")
    image.model["image_tokens"] = True
    assert "routed experts it is sent to" not in _flat(image)
    assert "layers that run on fewer tokens than counted (downsampled stages" in _flat(image)
