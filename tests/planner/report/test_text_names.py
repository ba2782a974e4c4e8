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
