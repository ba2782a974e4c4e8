"""The `plan` command end to end, and its one-line errors with exit code 2."""

import json
import os
import subprocess
import sys

import pytest

from planner.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_solve_writes_a_plan_and_show_explains_it(capsys, tmp_path, tiny_llama_config):
    out_file = tmp_path / "p.json"
    code, out, err = run(capsys, "solve", tiny_llama_config, "--cluster", "dgx-a100-80g",
                         "--nodes", "2", "--global-batch", "64", "--seq-len", "128",
                         "-o", str(out_file), "--no-cache")  # traced here, whatever ran before
    assert code == 0, err
    for word in ("parallel", "step time", "tokens/s", "TFLOP/s per GPU", "MFU", "peak memory",
                 "stage"):
        assert word in out
    assert "searched" in err and "traced with export" in err
    d = json.loads(out_file.read_text())
    assert d["schema"] == "planner.plan/v1"
    code, shown, _ = run(capsys, "show", str(out_file))
    assert code == 0 and "runners-up" in shown and "stage" in shown


def test_models_and_clusters_list(capsys):
    code, out, _ = run(capsys, "models")
    for name in ("gpt2", "gpt2-xl", "gpt3-175b", "gpt-1.7b", "gpt-1t", "llama3-8b", "llama3-70b",
                 "llama3-405b", "bert-large"):
        assert name in out
    code, out, _ = run(capsys, "clusters")
    for name in ("dgx-a100-80g", "dgx-h100", "hgx-h200", "pcie-4090"):
        assert name in out


BAD = {
    "unknown model": (["solve", "gtp2", "--cluster", "dgx-h100", "--global-batch", "8"],
                      "unknown model 'gtp2'; did you mean gpt2"),
    "unknown cluster": (["solve", "gpt2", "--cluster", "dgx-h1000", "--global-batch", "8"],
                        "unknown cluster 'dgx-h1000'; did you mean dgx-h100"),
    "bad fix": (["solve", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8", "--fix", "tpp=2"],
                "unknown knob 'tpp'"),
    # (a new-user check read the count of refused configurations, 10, as a batch size)
    "micro-batch of no share": (["solve", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8",
                                 "--fix", "micro_batch=3"],
                                "(configurations each rule refused: micro batch does not divide "
                                "the per-replica batch: "),
    # one slip away: that name alone (it listed moe_imbalance and moe_shared_overlap too)
    "engine typo": (["solve", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8", "--engine",
                     "moe_dispacher=deepep"],
                    "engine.moe_dispacher: unknown key; did you mean moe_dispatcher?"),
    "bad batch": (["solve", "gpt2", "--cluster", "dgx-h100", "--global-batch", "0"],
                  "argument --global-batch: expected an integer >= 1, got '0'"),
    "missing plan": (["show", "/nonexistent/plan.json"],
                     "plan file: file '/nonexistent/plan.json' not found; give the path of a plan"),
    # an option the command does not take points to that command's help
    "unknown option": (["whatif", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8",
                        "--vary", "tp=1,2", "--record-timing"],
                       "unrecognized argument --record-timing (see `plan whatif --help`)"),
    # the same before the command, plan's own option after it, and --output's hint (a review)
    "misspelled before the command": (["--verbsoe", "solve", "gpt2"],
                                      "unrecognized argument --verbsoe; did you mean --verbose? "
                                      "(see `plan --help`)"),
    "version after the command": (["solve", "--version"],
                                  "--version goes before the command: plan --version"),
    "output of whatif, long": (["whatif", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8",
                                "--vary", "tp=1,2", "--output", "wi"],
                               "unrecognized argument --output (plan whatif writes --csv OUT.csv "
                               "and --plot OUT.png; see `plan whatif --help`)"),
    # a Python file without its factory: the functions it defines (a new-user check)
    "file without factory": (["solve", os.path.join(REPO, "examples", "branched.py"), "--cluster",
                              "dgx-h100", "--global-batch", "8"],
                             "branched.py' is a Python file: name the function in it that builds "
                             "the model, "),
    # a batch smaller than the GPUs' replicas: fewer GPUs is the other way out
    "batch below the replicas": (["solve", "gpt2", "--cluster", "dgx-h100", "--nodes", "100000",
                                  "--global-batch", "8"],
                                 "or fewer GPUs (--nodes): the leanest layout on 800,000 needs "
                                 "dp=100,000 replicas"),
    # a misspelled required option is named as misspelled, with the closest (not "required")
    "misspelled option": (["solve", "gpt2", "--cluster", "dgx-h100", "--global-btach", "8"],
                          "unrecognized argument --global-btach; did you mean --global-batch? "
                          "(see `plan solve --help`)"),
    # -o where the command writes something else (a new-user check)
    "output of whatif": (["whatif", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8",
                          "--vary", "tp=1,2", "-o", "wi"],
                         "unrecognized arguments: -o wi (plan whatif writes --csv OUT.csv and "
                         "--plot OUT.png; see `plan whatif --help`)"),
    # errors name the option the user typed
    "bad vary value": (["whatif", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8",
                        "--vary", "tp=abc"], "vary.tp: expected a whole number, got 'abc'"),
    "bad why": (["show", os.path.join(REPO, "tests", "golden", "plans", "uneven-llama3-8b.json"),
                 "--why", "tp"], "why: 'tp' is not key=value; write e.g. --why tp=16,pp=1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(capsys, case):
    argv, message = BAD[case]
    code, out, err = run(capsys, *argv)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("plan: error")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


def test_bad_yaml_and_config_files(capsys, tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("name: x\ndevice: a100-80g\nnodes: [1\n")
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", str(y), "--global-batch", "8")
    assert code == 2 and "invalid YAML at line" in err
    y.write_text("name: x\ndevice: a100-80g\nnodes: 1\ngpus_per_node: 8\nintra_node: "
                 "{bandwidth_GBps: 300, latency_us: 3}\ninter_node: {bandwidth_GBps: 25, "
                 "latency_us: 10}\nnics: 8\n")
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", str(y), "--global-batch", "8")
    assert code == 2 and "c.yaml.nics: unknown key" in err
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64}))
    code, _, err = run(capsys, "solve", str(cfg), "--cluster", "dgx-h100", "--global-batch", "8")
    assert code == 2 and "key 'model_type' is missing" in err
    cfg.write_text("{not json")
    code, _, err = run(capsys, "solve", str(cfg), "--cluster", "dgx-h100", "--global-batch", "8")
    assert code == 2 and "cannot read" in err


def test_untraceable_factory_model(capsys, tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.lin = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        y = self.lin(x)\n"
        "        return y if y.sum().item() > 0 else -y\n"
        "def build():\n"
        "    return M(), (torch.randn(2, 3, 4),)\n")
    code, _, err = run(capsys, "solve", f"{f}:build", "--cluster", "dgx-h100", "--global-batch", "8")
    errors = [ln for ln in err.splitlines() if ln.startswith("plan: error")]
    assert code == 2 and len(errors) == 1 and "could not trace" in errors[0]
    assert "in module 'M (the root)'" in errors[0]
    assert "at m.py:7 (`return y if y.sum().item() > 0 else -y`)" in errors[0]
    assert "def forward" not in err, "torch.export's partial graph stays out of the message"


def test_module_factories_import_from_the_working_folder_and_fail_in_one_line(tmp_path):
    """``module:factory`` imports a module of the working folder, as Python does there (the `plan`
    script's path did not hold it); a data-dependent branch fails in one stderr line, torch's
    symbolic-shapes warning kept out."""
    import shutil
    shutil.copy(os.path.join(REPO, "examples", "branched.py"), tmp_path / "cwd_model.py")
    (tmp_path / "cwd_branchy.py").write_text(
        "import torch\n"
        "class B(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.fc = torch.nn.Linear(16, 16)\n"
        "    def forward(self, h):\n"
        "        if h.sum() > 0:\n"
        "            return self.fc(h)\n"
        "        return h\n"
        "def build():\n"
        "    return torch.nn.Sequential(B(), B()), (torch.randn(2, 8, 16),)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plan = [sys.executable, os.path.join(os.path.dirname(sys.executable), "plan")]
    plan = plan[1:] if os.access(plan[1], os.X_OK) else [sys.executable, "-m", "planner.cli"]
    ok = subprocess.run(plan + ["solve", "cwd_model:build", "--cluster", "cpu", "--global-batch",
                                "8", "-o", "p.json"], capture_output=True, text=True, env=env,
                        cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(plan + ["solve", "cwd_branchy:build", "--cluster", "cpu",
                                 "--global-batch", "8", "-q"], capture_output=True, text=True,
                         env=env, cwd=tmp_path)
    lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert lines[0].startswith("plan: error: could not trace cwd_branchy:build")


def test_console_script_exit_code_and_debug(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO}
    cmd = [sys.executable, "-m", "planner.cli", "solve", "nope", "--cluster", "dgx-h100",
           "--global-batch", "8"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = subprocess.run(cmd[:3] + ["--debug"] + cmd[3:], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_an_internal_error_is_one_line_exit_1(capsys, monkeypatch):
    from planner import api
    from planner.errors import InternalError

    def broken(*args, **kwargs):
        raise InternalError("the prediction breaks an invariant")

    monkeypatch.setattr(api, "plan", broken)
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", "dgx-h100", "--global-batch", "8")
    assert code == 1 and "internal error: the prediction breaks an invariant" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2  # planning ... + error


class _ClosedPipe:
    """stdout whose reader has gone (`plan ... | head -1` after the first line)."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_fix_and_engine_given_twice_add_up(capsys, tmp_path, tiny_llama_config):
    """--fix and --engine may be repeated: the later adds to the earlier (a key in both is
    refused as given twice), it does not replace it."""
    out_file = tmp_path / "p.json"
    base = ("solve", tiny_llama_config, "--cluster", "dgx-a100-80g", "--global-batch", "64",
            "--seq-len", "128", "-o", str(out_file))
    code, _, err = run(capsys, *base, "--fix", "tp=2", "--fix", "pp=2", "--engine",
                       "megatron-core", "--engine", "overlap_grad_reduce=false")
    assert code == 0, err
    d = json.loads(out_file.read_text())
    assert (d["parallel"]["tp"], d["parallel"]["pp"]) == (2, 2)
    assert d["training"]["engine"]["overlap_grad_reduce"] is False
    code, _, err = run(capsys, *base, "--fix", "tp=2", "--fix", "tp=4")
    assert code == 2 and "fix.tp: given twice (2 and 4)" in err


def test_a_plan_written_under_another_suffix_is_warned_about(capsys, tmp_path,
                                                            tiny_llama_config):
    """`plan solve -o w1.csv` replaced a new user's CSV with the plan without a word: the
    warning comes before the search, and the plan is still written as asked."""
    out_file = tmp_path / "w1.csv"
    code, _, err = run(capsys, "solve", tiny_llama_config, "--cluster", "dgx-a100-80g",
                       "--global-batch", "64", "--seq-len", "128", "-o", str(out_file))
    assert code == 0, err
    assert f"output: the plan is JSON, written to '{out_file}' as asked, whose name ends in " \
        ".csv" in err
    assert json.loads(out_file.read_text())["schema"] == "planner.plan/v1"
    code, _, err = run(capsys, "solve", tiny_llama_config, "--cluster", "dgx-a100-80g",
                       "--global-batch", "64", "--seq-len", "128", "-o", str(tmp_path / "p.JSON"))
    assert code == 0 and "output:" not in err

def test_a_closed_pipe_does_not_cost_the_plan_file(monkeypatch, tmp_path, tiny_llama_config):
    """The plan is written before the report is printed: a reader closing the pipe early ends
    the command (exit 0, as `head` expects) with the file on disk."""
    out_file = tmp_path / "p.json"
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))  # main closes it on a broken pipe
    code = main(["solve", tiny_llama_config, "--cluster", "dgx-a100-80g", "--global-batch", "64",
                 "--seq-len", "128", "-o", str(out_file)])
    assert code == 0
    assert json.loads(out_file.read_text())["schema"] == "planner.plan/v1"


def test_a_plan_names_its_model_file_wherever_it_is_run(capsys, tmp_path, monkeypatch,
                                                         tiny_llama_config):
    """A config given by a relative path is recorded by its absolute path, so that `plan run`
    and the exports' memory check find it from another folder (a new-user check's run from
    /tmp could not: "file 'tiny-llama.json' not found")."""
    import shutil

    made = tmp_path / "made"
    made.mkdir()
    shutil.copy(tiny_llama_config, made / "tiny.json")
    monkeypatch.chdir(made)
    code, _, err = run(capsys, "solve", "tiny.json", "--cluster", "dgx-a100-80g", "--nodes", "1",
                       "--global-batch", "8", "--seq-len", "64", "-o", "p.json")
    assert code == 0, err
    assert json.loads((made / "p.json").read_text())["model"]["spec"] == str(made / "tiny.json")
    from planner.traced import spec_of
    assert spec_of("llama3-8b") == "llama3-8b" and spec_of("no/such.json") == "no/such.json"
    assert spec_of("tiny.json:build") == "tiny.json:build"  # not a factory file: as given


def test_show_why_takes_the_model_where_its_file_lies_now(capsys, tmp_path):
    """`plan show --why` re-traces the plan's model: where its factory file moved, the error
    says to pass --model, and --model takes it (another model is refused, as by plan run)."""
    f = tmp_path / "m.py"
    f.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))\n"
        "    def forward(self, x):\n"
        "        for lay in self.layers:\n"
        "            x = x + lay(x).relu()\n"
        "        return x.pow(2).mean()\n"
        "def build():\n"
        "    return M(), (torch.randn(2, 16, 64),)\n")
    plan = str(tmp_path / "p.json")
    assert run(capsys, "solve", f"{f}:build", "--cluster", "dgx-h100", "--global-batch", "16",
               "--fix", "pp=1", "-o", plan)[0] == 0
    f.rename(tmp_path / "moved.py")
    code, _, err = run(capsys, "show", plan, "--why", "pp=2")
    assert code == 2 and "not found" in err and "pass --model PATH where it lies now" in err
    code, out, _ = run(capsys, "show", plan, "--why", "pp=2", "--model",
                       f"{tmp_path / 'moved.py'}:build")
    assert code == 0 and "pp 1 -> 2" in out
    code, _, err = run(capsys, "show", plan, "--why", "pp=2", "--model", "gpt2")
    assert code == 2 and "model.fingerprint: 'gpt2' has fingerprint " in err
    code, _, err = run(capsys, "show", plan, "--model", "gpt2")
    assert code == 2 and "add --why KNOB=V or drop --model" in err


def test_profile_refuses_more_cpu_processes_than_plan_run_starts(capsys, tmp_path):
    """A new-user check's --processes 64 on a 2-core machine ran on for minutes."""
    code, _, err = run(capsys, "profile", "--processes", "64", "-o", str(tmp_path / "c.json"))
    assert code == 2 and "plan: error: processes: 64 CPU processes" in err
    assert not (tmp_path / "c.json").exists()


def test_profile_refuses_more_threads_than_the_cores_give(capsys, tmp_path, monkeypatch):
    """A new-user check's --threads 2 beside the default 2 processes on a 2-core machine
    measured every speed 10-25x too slow, and its plans then read +2315%."""
    import planner.cli.profile as cli_profile

    monkeypatch.setattr(cli_profile, "usable_cores", lambda: 2)
    code, _, err = run(capsys, "profile", "--threads", "2", "-o", str(tmp_path / "c.json"))
    assert code == 2 and err.strip() == (
        "plan: error: threads: 2 processes x 2 threads want 4 cores, and this machine gives 2: "
        "they would take turns and every speed measured would be too slow; give --threads 1")
    code, _, err = run(capsys, "profile", "--processes", "4", "-o", str(tmp_path / "c.json"))
    assert code == 2 and err.strip().endswith("give --processes 2")
    assert not (tmp_path / "c.json").exists()


def test_profile_names_the_dtype_it_measured_in_the_command_it_suggests(capsys, tmp_path,
                                                                         monkeypatch):
    """A new-user check ran the suggested `plan solve ... --calibration calib.json` on a CPU
    profile: bf16, which the calibrated CPU was not measured in, refused (exit 2)."""
    from planner.profile import device

    calib = {"device_name": "cpu", "device": {"peak_TFLOPs": {"fp32": 0.2},
                                              "hbm_GBps": 20.0, "kernel_overhead_us": 5.0}}
    monkeypatch.setattr(device, "profile", lambda *a, **k: calib)
    code, out, _ = run(capsys, "profile", "--processes", "1", "-o", str(tmp_path / "c.json"))
    assert code == 0 and f"--calibration {tmp_path / 'c.json'} --dtype fp32`" in out
    calib["device"]["peak_TFLOPs"]["bf16"] = 0.1
    code, out, _ = run(capsys, "profile", "--processes", "1", "-o", str(tmp_path / "c.json"))
    assert code == 0 and f"--calibration {tmp_path / 'c.json'}`" in out


def test_a_review_of_show_simulate_diff_and_run(capsys, tmp_path):
    """From a new user's check: a schedule that does not fit exits 3 after its comparison; --why
    refusals name --why (why:, not fix:); a calibration given as a plan is named as one; small
    memory reads in MB, not 0.0 GB; run --dump is checked before the run."""
    code, _, err = run(capsys, "solve", "gpt2", "--cluster", "cpu", "--global-batch", "8",
                       "--seq-len", "1024", "--dtype", "fp32", "--fix", "pp=2", "-o",
                       str(tmp_path / "p.json"))
    assert code == 0, err
    plan = str(tmp_path / "p.json")
    code, out, err = run(capsys, "simulate", plan, "--schedule", "gpipe", "--microbatches", "256")
    assert code == 3 and "does not fit: gpipe" in out
    assert err.startswith("plan: no plan fits: gpipe on ")  # README's exit-code table
    assert run(capsys, "simulate", plan, "--schedule", "1f1b")[0] == 0
    code, _, err = run(capsys, "show", plan, "--why", "dp=1,tp=1,pp=1")
    assert code == 2 and "plan: error: why: dp x cp x tp x pp = 1" in err
    (tmp_path / "c.json").write_text('{"schema": "planner.calibration/v1", "device": {}}')
    code, _, err = run(capsys, "diff", str(tmp_path / "c.json"), plan)
    assert code == 2 and "a calibration file (schema 'planner.calibration/v1'), not a plan" in err
    code, out, _ = run(capsys, "show", plan)
    assert code == 0 and " MB" in out and "0.0 GB" not in out
    (tmp_path / "taken").write_text("x")
    code, _, err = run(capsys, "run", plan, "--dump", str(tmp_path / "taken"))
    assert code == 2 and "--dump: " in err and "is a file, not a folder" in err
    code, _, err = run(capsys, "run", plan, "--dump", str(tmp_path / "no" / "such"))
    assert code == 2 and "does not exist; create it first" in err


def test_run_refuses_tensor_parallel_conv1d_before_any_process(capsys, tmp_path):
    """GPT-2's Conv1D layers take no tensor parallelism in the runtime: the torch target never
    plans it (a pin of it is refused, naming a module), and a plan for any engine that has it
    is refused by `plan run`'s checks before any process starts (it failed in the processes,
    seconds later), dry runs too."""
    config = tmp_path / "gpt2.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
                                  "vocab_size": 1000, "n_positions": 128}))
    out = str(tmp_path / "p.json")
    args = ("solve", str(config), "--cluster", "cpu", "--gpus-per-node", "2", "--global-batch",
            "8", "--seq-len", "128", "--dtype", "fp32", "-o", out)
    code, _, err = run(capsys, *args, "--target", "torch", "--fix", "tp=2")
    assert code == 2 and "fix.tp: 2 would split transformer.h.0." in err and "(Conv1D), and " \
        "the target splits unfused nn.Linear and nn.Embedding only; pin tp=1" in err
    assert not os.path.exists(out)
    assert run(capsys, *args, "--target", "torch")[0] == 0
    assert json.load(open(out))["parallel"]["tp"] == 1
    assert run(capsys, *args, "--target", "any", "--fix", "tp=2")[0] == 0
    code, _, err = run(capsys, "run", out, "--dry-run")
    assert code == 2 and "the runtime shards nn.Linear and nn.Embedding only, this is Conv1D" \
        in err


def test_fused_projections_take_no_tensor_parallelism_in_the_runtime(capsys, tmp_path):
    """Phi-3 slices its qkv_proj's output into q, k and v and chunks its gate_up_proj's: a
    contiguous split of their rows mixes the pieces up across ranks, which crashed the runtime in
    DTensor's sharding propagation (a review). The torch target plans no tp for them; a plan for
    any engine (Megatron-Core lays fused weights out per piece) is refused by plan run."""
    import torch
    from planner.runtime.dataflow import probe
    from planner.trace import hf
    from planner.trace.models import resolve
    config = tmp_path / "phi3.json"
    config.write_text(json.dumps({"model_type": "phi3", "hidden_size": 32,
                                  "intermediate_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 128, "max_position_embeddings": 64,
                                  "pad_token_id": 0}))
    out = str(tmp_path / "p.json")
    args = ("solve", str(config), "--cluster", "cpu", "--gpus-per-node", "2", "--global-batch",
            "8", "--seq-len", "16", "--dtype", "fp32", "-o", out)
    code, _, err = run(capsys, *args, "--target", "torch", "--fix", "tp=2")
    assert code == 2 and "(Linear, its output cut into parts: fused), and the target splits "         "unfused nn.Linear and nn.Embedding only" in err
    assert run(capsys, *args, "--target", "any", "--fix", "tp=2")[0] == 0
    # the runtime's probe sees the cuts (the processes refuse the plan with them)
    meta = resolve(str(config), seq_len=16, dtype="fp32")
    module = hf.build(meta.module.config, type(meta.module).__name__, 16, torch.float32,
                      "cpu").module
    mods = ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
            "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"]
    with torch.no_grad():
        flow = probe(module, (torch.randint(0, 128, (1, 16)),), {"use_cache": False},
                     ["model.layers.0"], mods, lambda o: o.logits)
    assert flow.cut == {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"}


def test_progress_off_a_terminal_is_a_line_now_and_then(monkeypatch, capsys):
    """A long sweep or search piped to a log says how far it got every LINE_EVERY_S seconds
    (it was silent off a terminal: a new-user check waited 30 s with no word); -q silences it."""
    from planner.cli import progress

    # the bar is made before the model is traced (26 s here); its seconds count from its first
    # call (a new-user check read 'pricing: 0/36639 (26 s)' as pricing stalled)
    clock = iter([26.0, 27.0, 36.5, 38.0, 47.0, 56.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    bar = progress.Bar(False, label="sweeping", unit=" points")
    for done in (0, 1, 2, 3, 4):  # at 26, 27, 36.5, 38 and 47 s
        bar(done, 4)
    assert capsys.readouterr().err.splitlines() == ["sweeping: 2/4 points (10 s)",
                                                    "sweeping: 4/4 points (21 s)"]
    quiet = progress.Bar(True)
    quiet(1, 2)
    assert capsys.readouterr().err == ""


def test_per_plan_lines_hold_back_the_searches_beside_a_plan_over_sites():
    """A new-user check: a what-if sweep over a cluster of sites printed each point's replicas
    line, unnamed and out of order."""
    import logging

    from planner.cli.progress import per_plan_lines

    replicas_log = logging.getLogger("planner.search.replicas")
    before = replicas_log.level
    with per_plan_lines(False):
        assert not replicas_log.isEnabledFor(logging.INFO)
        assert not logging.getLogger("planner.search.alone").isEnabledFor(logging.INFO)
    assert replicas_log.level == before
