"""`plan show` names the wait of pipeline ranks that carry less work than the busiest (the step's
parts run along the busiest rank, so its compute holds that wait)."""

import copy

from planner.planfile.document import load_plan
from planner.report.summary import summary

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
    assert line.startswith(f"pipeline ranks unequal: rank 1 works {1e3 * max(work):.3g} ms a "
                           f"micro-batch, rank 0 {1e3 * min(work):.3g} ms")
    assert f"wait for it {wait:.3g} s of the step" in line
    assert f"({100 * wait / plan.predicted['step_time_s']:.0f}%" in line


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
