"""Short names of MODELs in tables (planner.report.text.model_name)."""

from planner.report.text import model_name


def test_a_config_file_is_named_by_its_file_and_a_folders_config_by_its_folder():
    # a new-user check: examples/gpt3_xl_config.json read "examples" in plan jobs' table
    assert model_name("examples/gpt3_xl_config.json") == "gpt3_xl_config.json"
    assert model_name("/models/llama-3-8b/config.json") == "llama-3-8b"
    assert model_name("gpt2") == "gpt2"
    assert model_name("examples/branched.py:build") == "branched.py:build"


def test_the_gradient_sync_of_a_context_parallel_plan_names_its_ranks():
    """A new-user check read 'data-parallel gradient sync' 8% of a dp=1, cp=8 plan's step: the
    cp ranks hold the same weights, so the gradients are reduced over dp x cp; the line says so."""
    import os

    from planner.planfile.document import load_plan
    from planner.report.summary import breakdown

    plans = os.path.join(os.path.dirname(__file__), "..", "export", "data", "plans")
    cp = load_plan(os.path.join(plans, "llama3-8b-cp4-torchtitan.json"))
    dp = cp.parallel["dp"]
    assert any(f"data-parallel gradient sync (dp x cp = {dp * 4} ranks)" in line
               for line in breakdown(cp))
    ep = load_plan(os.path.join(plans, "mixtral-8x7b-ep8-megatron.json"))
    lines = [line for line in breakdown(ep) if "data-parallel gradient sync" in line]
    assert lines and "dp x cp" not in lines[0]


def test_expert_groups_straddling_two_nodes_are_named():
    """A new-user check saw two of 18 stages' all-to-alls take 9x the others' on GB200 racks
    with no word why: 16-GPU stages on 72-GPU racks, two of them straddling two."""
    import dataclasses
    import os

    from planner.planfile.document import load_plan
    from planner.report.summary import _ep_straddles

    plans = os.path.join(os.path.dirname(__file__), "..", "export", "data", "plans")
    plan = load_plan(os.path.join(plans, "mixtral-8x7b-ep8-megatron.json"))
    racks = dataclasses.replace(plan, parallel={**plan.parallel, "dp": 16, "tp": 1, "cp": 1,
                                                "pp": 18, "ep": 16, "etp": 1,
                                                "placement": "tp-dp-pp"},
                                cluster={**plan.cluster, "gpus_per_node": 72})
    text = " ".join(_ep_straddles(racks))
    assert "pipeline ranks 4, 13 span 2 nodes, the others 1: a stage of 16 GPUs on nodes of 72" \
        in " ".join(text.split())
    assert _ep_straddles(plan) == []  # every group alike
