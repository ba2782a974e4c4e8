"""Every input checked before the slow part: one line on stderr and the documented exit code
(2 bad input, 3 no plan fits), nothing written where the output could not go."""

import json
import os
import stat

import pytest

from planner.cli.main import main

BAD, NO_PLAN = 2, 3
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code, err, expected_code, *words):
    assert code == expected_code, err
    prefix = "plan: error:" if expected_code == BAD else "plan: no plan fits: "
    lines = [ln for ln in err.splitlines() if ln.startswith("plan: ")]
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory, tiny_gpt2_config):
    path = tmp_path_factory.mktemp("plans") / "p.json"
    assert main(["solve", tiny_gpt2_config, "--cluster", "dgx-a100-80g", "--nodes", "1",
                 "--global-batch", "16", "--seq-len", "64", "--fix", "pp=2", "-q",
                 "-o", str(path)]) == 0
    return str(path)


SOLVE = ["--cluster", "dgx-a100-80g", "--nodes", "1", "--global-batch", "8", "--seq-len", "64"]


def test_binary_files_are_named_not_decoded(capsys, tmp_path):
    blob = tmp_path / "config.json"
    blob.write_bytes(bytes(range(256)) * 2)
    code, _, err = run(capsys, "solve", blob, *SOLVE)
    one_line(code, err, BAD, "config.json", "not text")
    code, _, err = run(capsys, "show", blob)
    one_line(code, err, BAD, "not text")
    code, _, err = run(capsys, "show", tmp_path)  # a folder
    one_line(code, err, BAD, "folder")


def test_a_factory_that_raises_is_named_with_its_line(capsys, tmp_path):
    f = tmp_path / "bad_factory.py"
    f.write_text("def build(seq_len=8):\n    raise ValueError('no such size')\n")
    code, _, err = run(capsys, "solve", f"{f}:build", *SOLVE)
    one_line(code, err, BAD, f"{f}:build", "ValueError: no such size", "bad_factory.py:2")


def test_a_factory_beside_embedding_tables_that_raises_or_needs_arguments(capsys, tmp_path):
    """A new-user check: a file whose source names EmbeddingBag (so the planner first asks whether
    it builds a recommendation model) had its factory's error reported as an internal error
    (exit 1), and a factory with a required argument too."""
    f = tmp_path / "odd.py"
    f.write_text("import torch\nBAG = torch.nn.EmbeddingBag\n"
                 "def boom():\n    raise ValueError('missing checkpoint path')\n"
                 "def sized(width):\n    return torch.nn.Linear(width, width), torch.ones(2, width)\n")
    code, _, err = run(capsys, "solve", f"{f}:boom", *SOLVE)
    one_line(code, err, BAD, f"{f}:boom", "ValueError: missing checkpoint path", "odd.py:4")
    code, _, err = run(capsys, "solve", f"{f}:sized", *SOLVE)
    one_line(code, err, BAD, f"{f}:sized", "takes width without a default", "give them defaults")


def test_impossible_counts_and_sizes_are_refused(capsys, tmp_path, tiny_gpt2_config):
    cfg = tmp_path / "neg.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": -2, "hidden_size": 64,
                               "intermediate_size": 128, "num_attention_heads": 4,
                               "vocab_size": 1000}))
    code, _, err = run(capsys, "solve", cfg, *SOLVE)
    one_line(code, err, BAD, "num_hidden_layers", "-2")
    for option, value in (("--seq-len", "0"), ("--global-batch", "-4"), ("--nodes", "0"),
                          ("--top-k", "-1"), ("--time-limit", "nan")):
        argv = ["solve", tiny_gpt2_config, "--cluster", "dgx-a100-80g", "--global-batch", "8",
                option, value]
        code, _, err = run(capsys, *argv)
        one_line(code, err, BAD, option)


def test_option_names_are_not_abbreviated(capsys, tiny_gpt2_config):
    code, _, err = run(capsys, "solve", tiny_gpt2_config, "--cluster", "dgx-a100-80g",
                       "--global-batch", "8", "--node", "2")
    one_line(code, err, BAD, "--node")


@pytest.mark.parametrize("where", ["missing folder", "a folder", "read-only file", "empty",
                                   "missing folder/"])
def test_output_paths_are_checked_before_any_work(capsys, tmp_path, tiny_gpt2_config, small_plan,
                                                  where):
    target = {"missing folder": tmp_path / "no" / "p.json", "a folder": tmp_path,
              "read-only file": tmp_path / "ro.json", "empty": "",
              "missing folder/": f"{tmp_path / 'no'}/"}[where]
    if where == "read-only file":
        target.write_text("{}")
        target.chmod(0o444)
        if os.access(target, os.W_OK):
            pytest.skip("running as a user who may write read-only files")
    cases = [
        ["solve", tiny_gpt2_config, *SOLVE, "-o", target],
        ["profile", "--processes", "1", "-o", target],  # fails before minutes of measuring
        ["jobs", os.path.join(REPO, "examples", "jobs.yaml"), "-o", target],
        ["run", small_plan, "-o", target],
        ["show", small_plan, "--gantt", f"{target}.png" if where == "read-only file" else target],
        ["simulate", small_plan, "--schedule", "gpipe", "--gantt",
         f"{target}.png" if where == "read-only file" else target],
    ]
    # export takes a folder (the file gets its suggested name there), and makes one named with a
    # trailing slash (tests/planner/export/test_export.py)
    if where not in ("a folder", "missing folder/"):
        cases.append(["export", small_plan, "--to", "megatron", "-o", target])
    for argv in cases:
        code, _, err = run(capsys, *argv)
        one_line(code, err, BAD)
        if where == "missing folder/" and "-o" in argv:
            assert f"folder '{tmp_path / 'no'}' does not exist" in err
    if where == "read-only file":
        assert target.read_text() == "{}"


def test_an_output_link_is_kept_and_a_pipe_is_written_into(capsys, tmp_path, tiny_gpt2_config):
    """A link stays a link (the file it points to gets the plan, also when that file is not
    there yet), and a pipe or device takes the bytes (found replacing /dev/null with a plan)."""
    existing, link = tmp_path / "script.sh", tmp_path / "link.sh"
    existing.write_text("old")
    link.symlink_to(existing)
    code, _, err = run(capsys, "solve", tiny_gpt2_config, *SOLVE, "-o", link)
    assert code == 0, err
    assert link.is_symlink() and existing.read_text().startswith("{")
    dangling = tmp_path / "dangling.sh"
    dangling.symlink_to(tmp_path / "new.sh")
    assert run(capsys, "solve", tiny_gpt2_config, *SOLVE, "-o", dangling)[0] == 0
    assert dangling.is_symlink() and (tmp_path / "new.sh").read_text().startswith("{")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the writer's open needs a reader
    try:
        code, _, err = run(capsys, "solve", tiny_gpt2_config, *SOLVE, "-o", fifo)
        assert code == 0, err
        assert os.read(reader, 1 << 16).startswith(b"{")
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_an_output_that_is_the_commands_input_is_refused(capsys, tmp_path, small_plan):
    """`plan export p.json -o p.json` would replace the plan with a script: refused, file kept."""
    plan = tmp_path / "p.json"
    plan.write_text(open(small_plan).read())
    before = plan.read_text()
    code, _, err = run(capsys, "export", plan, "--to", "megatron", "-o", plan)
    one_line(code, err, BAD, "output:", "this command's input")
    code, _, err = run(capsys, "run", plan, "-o", plan)
    one_line(code, err, BAD, "output:", "this command's input")
    assert plan.read_text() == before


def test_a_model_files_code_is_never_overwritten_nor_its_exit_taken_for_success(capsys,
                                                                                  tmp_path):
    """A new-user check: -o naming the model's own file.py replaced the code with the plan; a
    factory calling sys.exit(0) exited 0 with no plan; a script's argument parser at import
    printed a usage line that read as the planner's own."""
    model = tmp_path / "mlp.py"
    model.write_text("import torch\ndef build():\n    return torch.nn.Linear(8, 8), "
                     "(torch.randn(4, 8),)\n")
    before = model.read_text()
    code, _, err = run(capsys, "solve", f"{model}:build", "--cluster", "dgx-h100", "--nodes", 1,
                       "--global-batch", 8, "-o", model)
    one_line(code, err, BAD, "output:", "this command's input")
    assert model.read_text() == before
    code, _, err = run(capsys, "whatif", f"{model}:build", "--cluster", "dgx-h100",
                       "--global-batch", 8, "--vary", "nodes=1,2", "--csv", model)
    one_line(code, err, BAD, "csv:", "this command's input")
    quits = tmp_path / "quits.py"
    quits.write_text("import sys\ndef build():\n    sys.exit(0)\n")
    code, _, err = run(capsys, "solve", f"{quits}:build", "--cluster", "dgx-h100",
                       "--global-batch", 8, "-o", tmp_path / "o.json")
    one_line(code, err, BAD, "model:", "exited (SystemExit 0)")
    assert not (tmp_path / "o.json").exists()
    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\n"
                      "p.add_argument('--lr', required=True)\nargs = p.parse_args()\n"
                      "def build():\n    pass\n")
    code, _, err = run(capsys, "solve", f"{script}:build", "--cluster", "dgx-h100",
                       "--global-batch", 8)
    one_line(code, err, BAD, "model: importing", "exited (SystemExit 2)", "__main__")
    assert "usage: train.py" in err  # (the script's own parser, named as the script)


def test_sizes_past_any_run_are_refused_at_once(capsys):
    """A new-user check: --global-batch 10^17 enumerated its divisors past ten minutes."""
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", "dgx-h100", "--global-batch",
                       10 ** 17, "--time-limit", 3)
    one_line(code, err, BAD, "global_batch: 100,000,000,000,000,000 is more than the "
                             "1,073,741,824 accepted")
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", "dgx-h100", "--global-batch", 8,
                       "--seq-len", 2 ** 31)
    one_line(code, err, BAD, "seq_len:", "more than the")


def test_a_yaml_key_given_twice_is_refused(capsys, tmp_path):
    """A new-user check: the safe loader kept the last of nodes: 1, nodes: 4 (32 GPUs)."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c\nnodes: 1\ngpus_per_node: 8\ndevice: h100\nnodes: 4\n"
                       "intra_node: {bandwidth: 450GB/s, latency: 3us}\n"
                       "inter_node: {bandwidth: 50GB/s, bandwidth: 10us}\n")
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", cluster, "--global-batch", 8)
    one_line(code, err, BAD, "c.yaml: nodes given twice (lines 2 and 5); keep one")
    cluster.write_text(cluster.read_text().replace("nodes: 4\n", ""))
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", cluster, "--global-batch", 8)
    one_line(code, err, BAD, "c.yaml: bandwidth given twice (on line 6); keep one")
    # a merge key (<<: *base) is no key given twice, and a key beside it overrides the merged one
    from planner.files import read_yaml
    cluster.write_text("base: &link {bandwidth: 450GB/s, latency: 3us}\n"
                       "intra_node: {<<: *link, latency: 2us}\n")
    assert read_yaml(str(cluster), what="cluster")["intra_node"] == {"bandwidth": "450GB/s",
                                                                      "latency": "2us"}


def test_hand_edited_stage_ranks_and_endless_steps_are_refused(capsys, tmp_path, small_plan):
    """A new-user check: a stage of ranks [0, 0, ...] was shown, simulated and diffed, and a step
    of Infinity seconds printed as 'inf s'."""
    good = json.load(open(small_plan))
    for edit, said in ((lambda d: d["stages"][0].update(ranks=[0] * len(d["stages"][0]["ranks"])),
                        "stages[0].ranks: a rank is listed twice"),
                       (lambda d: d["stages"][1].update(ranks=d["stages"][0]["ranks"]),
                        "stages[1].ranks: rank 0 also runs pipeline rank 0"),
                       (lambda d: d["stages"][0]["ranks"].__setitem__(0, 99),
                        "stages[0].ranks: rank 99 is not one of the cluster's 8 GPUs"),
                       (lambda d: d["predicted"].update(step_time_s=float("inf")),
                        "predicted.step_time_s = inf is not a number of seconds")):
        d = json.loads(json.dumps(good))
        edit(d)
        path = tmp_path / "edited.json"
        path.write_text(json.dumps(d))
        for command in (("show", path), ("simulate", path, "--schedule", "1f1b"),
                        ("diff", small_plan, path)):
            code, _, err = run(capsys, *command)
            one_line(code, err, BAD, said)


def test_a_config_with_no_learned_positions_is_refused(capsys, tmp_path):
    """A new-user check: GPT-2's n_positions: 0 was read as no limit (2,048 tokens planned)."""
    config = tmp_path / "g.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
                                  "vocab_size": 1000, "n_positions": 0, "bos_token_id": 0,
                                  "eos_token_id": 0}))
    code, _, err = run(capsys, "solve", config, "--cluster", "dgx-h100", "--global-batch", 8)
    one_line(code, err, BAD, "model config: n_positions is 0")


def test_counts_a_command_cannot_use_are_refused(capsys, small_plan):
    code, _, err = run(capsys, "run", small_plan, "--steps", "0")
    one_line(code, err, BAD, "--steps")
    code, _, err = run(capsys, "simulate", small_plan, "--schedule", "1f1b", "--microbatches", "0")
    one_line(code, err, BAD, "--microbatches")
    # interleaved needs whole rounds of pp micro-batches, as the search requires
    code, _, err = run(capsys, "simulate", small_plan, "--schedule", "interleaved-1f1b",
                       "--vpp", "2", "--microbatches", "3")
    one_line(code, err, BAD, "microbatches", "pp=2", "use 2 or 4")


def test_an_output_under_a_file_is_named_a_file_not_a_missing_folder(capsys, tmp_path,
                                                                     small_plan):
    """-o a.json/p.json where a.json is a file: 'create the folder' could not be followed."""
    blocker = tmp_path / "a.json"
    blocker.write_text("kept")
    code, _, err = run(capsys, "export", small_plan, "--to", "megatron", "-o",
                       blocker / "sub" / "m.sh")
    one_line(code, err, BAD, "output:", f"'{blocker}' is a file, not a folder")
    assert blocker.read_text() == "kept"


def test_an_export_named_for_another_format_is_written_with_a_warning(capsys, tmp_path,
                                                                      tiny_gpt2_config):
    """torchtitan 0.3.0 reads a command line: written to the .toml path asked for, and said so."""
    small_plan, path = tmp_path / "p.json", tmp_path / "t.toml"
    assert main(["solve", tiny_gpt2_config, "--cluster", "dgx-a100-80g", "--nodes", "1",
                 "--global-batch", "16", "--seq-len", "64", "--target", "torchtitan", "-q",
                 "-o", str(small_plan)]) == 0
    code, _, err = run(capsys, "export", small_plan, "--to", "torchtitan", "--engine-version",
                       "0.3.0", "-o", path)
    assert code == 0, err
    assert path.read_text().startswith("#") and "--parallelism." in path.read_text()
    assert "the export is a command line (.sh)" in err and "ends in .toml" in err
    code, _, err = run(capsys, "export", small_plan, "--to", "torchtitan", "-o", path)
    assert code == 0 and path.read_text().startswith("#") and "[parallelism]" in path.read_text()
    assert "as asked" not in err  # 0.2.2 writes TOML: no warning


def test_a_plan_for_more_nodes_than_this_host_is_refused(capsys, tmp_path):
    path = tmp_path / "big.json"
    assert main(["solve", "gpt2", "--cluster", "dgx-a100-80g", "--nodes", "128",
                 "--global-batch", "1024", "-q", "-o", str(path)]) == 0
    code, out, err = run(capsys, "run", path)
    one_line(code, err, BAD, "128 nodes", "--dry-run")
    assert "torchrun" not in out


def test_pins_are_priced_as_pinned_or_refused_for_a_named_reason(capsys, tiny_gpt2_config):
    base = ["solve", tiny_gpt2_config, "--cluster", "dgx-a100-80g", "--nodes", "1",
            "--global-batch", "8", "--seq-len", "64"]
    code, _, err = run(capsys, *base, "--fix", "tp=3")
    one_line(code, err, BAD, "fix.tp: 3 does not divide the cluster's 8 GPUs")
    code, _, err = run(capsys, *base, "--fix", "micro_batch=0")
    one_line(code, err, BAD, "fix.micro_batch")
    code, _, err = run(capsys, *base, "--fix", "vpp=2,pp=1")  # the reason, not the rule counts
    one_line(code, err, BAD, "fix.vpp: vpp=2", "needs pp > 1")


def test_a_pinned_configuration_that_does_not_fit_reports_its_own_memory(capsys):
    pins = "dp=8,tp=1,pp=1,zero=0,micro_batch=1,recompute=none,offload_optimizer=false"
    code, _, err = run(capsys, "solve", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "1",
                       "--global-batch", "8", "--seq-len", "4096", "--fix", pins)
    line = one_line(code, err, NO_PLAN, "stage 0", f"with {pins}", "weights", "optimizer")
    assert "dp=8 tp=1 pp=1" in line  # its own configuration, not another one


def test_tensor_parallelism_across_nodes_is_priced_when_pinned(capsys, tmp_path):
    out_file = tmp_path / "tp16.json"
    code, _, err = run(capsys, "solve", "gpt3-175b", "--cluster", "dgx-a100-80g", "--nodes", "16",
                       "--global-batch", "256", "--seq-len", "2048", "--fix", "tp=16", "-q",
                       "-o", out_file)
    assert code == 0, err
    plan = json.loads(out_file.read_text())
    assert plan["parallel"]["tp"] == 16 and plan["predicted"]["breakdown"]["tp_comm_s"] > 0


def test_the_plan_goes_to_stdout_with_dash(capsys, tiny_gpt2_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "solve", tiny_gpt2_config, *SOLVE, "-o", "-")
    assert code == 0 and json.loads(out)["schema"] == "planner.plan/v1"
    assert "Plan for" in err and not os.path.exists(tmp_path / "-")


def test_version_and_json_summary(capsys, small_plan):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.startswith("plan ")
    code, out, _ = run(capsys, "show", small_plan, "--json")
    summary = json.loads(out)
    assert code == 0 and summary["parallel"]["pp"] == 2 and len(summary["stages"]) == 2


def test_a_plan_file_given_as_the_model_is_named_with_its_model(capsys, small_plan,
                                                                tiny_gpt2_config):
    """`plan whatif plan.json ...` (a new-user check): a plan file read as a Hugging Face
    config asked for its model_type; it is named as a plan, with the model it was made for."""
    for argv in (("solve", small_plan, "--cluster", "dgx-h100", "--global-batch", "16"),
                 ("whatif", small_plan, "--cluster", "dgx-h100", "--global-batch", "16",
                  "--vary", "nodes=1,2"),
                 # (before the cluster and batch a what-if asks for: a later new-user check)
                 ("whatif", small_plan, "--vary", "dtype=bf16,fp8")):
        code, _, err = run(capsys, *argv)
        one_line(code, err, BAD, f"model: {small_plan} is a plan file, not a model; give the "
                                 f"model it was made for ({tiny_gpt2_config})")


def test_a_factory_whose_seq_len_has_no_default_asks_for_it(capsys, tmp_path):
    f = tmp_path / "seq.py"
    f.write_text("import torch\ndef build(seq_len):\n"
                 "    return torch.nn.Linear(8, 8), torch.ones(2, seq_len, 8)\n")
    code, _, err = run(capsys, "solve", f"{f}:build", *SOLVE[:-2])  # (no --seq-len)
    one_line(code, err, BAD, "takes seq_len without a default", "pass --seq-len")


def test_a_full_disk_under_stdout_is_said_not_called_a_bug(monkeypatch, capsys, small_plan):
    """A new-user check: `plan show p.json > /dev/full` read "internal error" (exit 1)."""
    import errno
    import sys

    class Full:
        encoding = "utf-8"

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Full())
    code = main(["show", small_plan])
    err = capsys.readouterr().err
    one_line(code, err, BAD, "cannot write the output: No space left on device")
