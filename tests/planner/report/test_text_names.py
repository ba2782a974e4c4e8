"""Short names of MODELs in tables (planner.report.text.model_name)."""

from planner.report.text import model_name


def test_a_config_file_is_named_by_its_file_and_a_folders_config_by_its_folder():
    # a new-user check: examples/gpt3_xl_config.json read "examples" in plan jobs' table
    assert model_name("examples/gpt3_xl_config.json") == "gpt3_xl_config.json"
    assert model_name("/models/llama-3-8b/config.json") == "llama-3-8b"
    assert model_name("gpt2") == "gpt2"
    assert model_name("examples/branched.py:build") == "branched.py:build"
