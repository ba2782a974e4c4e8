"""`plan run` through the CLI: refusals are one line with exit code 2; a real run writes JSON."""

import dataclasses
import json

import pytest

from planner.cli.main import main
from planner.planfile.document import load_plan


def run(capsys, *argv):
    capsys.readouterr()  # drop what making the plan printed
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_refusal(code, err, *words):
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("plan: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_plan_for_another_model_is_refused(capsys, make_plan, tmp_path):
    path = make_plan("branched", "pp=2,tp=1,dp=1,micro_batch=2")
    plan = load_plan(path)
    plan.model["fingerprint"] = "0123456789abcdef"
    other = str(tmp_path / "other.json")
    plan.save(other)
    code, _, err = run(capsys, "run", other)
    _one_line_refusal(code, err, "fingerprint", "0123456789abcdef", "plan solve")


def test_model_override_with_other_architecture_is_refused(capsys, make_plan, tiny_gpt2_config):
    path = make_plan("llama", "pp=2,tp=1,dp=1,micro_batch=2")
    code, _, err = run(capsys, "run", path, "--model", tiny_gpt2_config)
    _one_line_refusal(code, err, "fingerprint", tiny_gpt2_config)


def test_plan_needing_more_processes_than_the_machine_runs_is_refused(capsys, make_plan):
    path = make_plan("branched", "pp=1,tp=1,dp=16,micro_batch=1", global_batch=16)
    code, _, err = run(capsys, "run", path, "--device", "cpu")
    _one_line_refusal(code, err, "cluster.gpus_per_node: the plan needs 16 processes", "at most 8")


def test_model_too_large_for_this_machine_is_refused(capsys, tmp_path):
    import planner

    p = planner.plan("llama3-8b", cluster="dgx-a100-80g", nodes=1, global_batch=8, seq_len=512,
                     fix="tp=8,pp=1,dp=1")
    path = str(tmp_path / "llama3-8b.json")
    p.save(path)
    code, _, err = run(capsys, "run", path, "--device", "cpu")
    _one_line_refusal(code, err, "model:", "GB", "8 processes", "smaller")


def test_a_hand_edited_batch_is_refused_before_any_process_starts(capsys, make_plan, tmp_path):
    """A new-user check saw "running ... with 2 processes" and then the batch error inside them."""
    plan = load_plan(make_plan("branched", "pp=2,tp=1,dp=1,micro_batch=2"))
    plan.parallel["micro_batch"] = 3
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan.to_dict()))  # (Plan.save refuses to write it)
    code, out, err = run(capsys, "run", str(edited))
    _one_line_refusal(code, err, "micro_batch x num_microbatches x dp = 3 x 4 x 1 = 12",
                      "training.global_batch is 8", "re-plan")
    assert "running" not in out + err.replace("plan: error:", "")


@pytest.mark.parametrize("edit,words", [
    (lambda d: d["training"].update(seq_len=1024),
     ("training.seq_len: 1024, but the plan was traced and priced at", "--seq-len 1024")),
    (lambda d: (d["parallel"].update(num_microbatches=2), d["training"].update(global_batch=4)),
     ("schedule.actions[0]: stage 0's F actions do not cover micro-batches 0..1",)),
    (lambda d: d["schedule"]["actions"][0].pop(), ("schedule.actions[0]",)),
    (lambda d: d["parallel"].update(foo=1), ("parallel.foo: not a knob of a plan",)),
    (lambda d: d["parallel"].update(schedule="gpipe"),
     ("schedule.name: 1f1b, but parallel.schedule is gpipe",)),
])
def test_a_hand_edit_the_plan_disagrees_with_is_refused_before_launch(capsys, make_plan,
                                                                       tmp_path, edit, words):
    """A new-user check saw an edited sequence run with the old memory check, an edited
    micro-batch count crash inside torch's schedule (exit 4), an unknown knob accepted."""
    d = json.loads(open(make_plan("branched", "pp=2,tp=1,dp=1,micro_batch=2,schedule=1f1b"))
                   .read())
    edit(d)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d))
    code, out, err = run(capsys, "run", str(edited), "--dry-run")
    _one_line_refusal(code, err, *words)


def test_a_hand_edited_micro_batch_count_without_a_pipeline_is_refused(capsys, make_plan,
                                                                        tmp_path):
    """A new-user check edited a pp=1 plan to 2 micro-batches of 2 (the batch still adds up):
    torch's schedule then crashed inside the processes (exit 4, 'please report'); one stage's
    actions are checked as a pipeline's are."""
    d = json.loads(open(make_plan("branched", "pp=1,tp=1,dp=2,micro_batch=1")).read())
    d["parallel"].update(micro_batch=2, num_microbatches=d["parallel"]["num_microbatches"] // 2)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d))
    code, out, err = run(capsys, "run", str(edited), "--dry-run")
    _one_line_refusal(code, err, "schedule.actions[0]: stage 0's F actions do not cover "
                      "micro-batches 0..1")


def test_a_hand_edit_of_the_training_is_named_as_such(capsys, make_plan, tmp_path):
    """A new-user check edited training.optimizer (run with no word, its model states read +50%)
    and training.dtype (refused as the model file's fingerprint, suggesting --model with the
    same file): the plan records what it was priced with (search.priced_training)."""
    path = make_plan("branched", "pp=1,tp=1,dp=2,micro_batch=2,zero=0")
    d = json.loads(open(path).read())
    assert d["search"]["priced_training"] == {"dtype": "fp32", "optimizer": "sgd",
                                              "seq_len": d["training"]["seq_len"],
                                              "global_batch": d["training"]["global_batch"]}
    d["training"]["optimizer"] = "adam"
    edited = tmp_path / "optimizer.json"
    edited.write_text(json.dumps(d))
    code, out, err = run(capsys, "run", str(edited), "--dry-run")
    assert code == 0 and "# note: training.optimizer edited after planning (sgd -> adam): the " \
        "predictions are sgd's" in out, err
    d["training"].update(optimizer="sgd", dtype="bf16")
    edited.write_text(json.dumps(d))
    code, out, err = run(capsys, "run", str(edited))
    _one_line_refusal(code, err, "training.dtype: bf16, but the plan was traced and priced in "
                      "fp32 (edited after planning); re-plan with plan solve ... --dtype bf16")


def test_every_command_reading_a_hand_edited_plan_says_so(capsys, make_plan, tmp_path):
    """A new-user check edited parallel.recompute and training.seq_len in a plan that still
    passed every check: plan show and plan export printed the planned configuration's
    predictions for it without a word. Reading a plan warns, naming the edits and the re-plan."""
    d = json.loads(open(make_plan("branched", "pp=1,tp=1,dp=2,micro_batch=2,zero=0")).read())
    seq = d["training"]["seq_len"]
    d["parallel"]["recompute"] = "full"
    d["training"]["seq_len"] = seq // 2
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d))
    for command in (["show", str(edited)], ["export", str(edited), "--to", "deepspeed"]):
        code, out, err = run(capsys, *command)
        assert code == 0, err
        assert f"edited after planning (parallel.recompute none -> full, training.seq_len {seq} " \
            f"-> {seq // 2}): the predictions" in err, (command, err)
        assert f"plan solve ... --seq-len {seq // 2} --fix " in err and "recompute=full" in err


def test_a_hand_edit_of_a_priced_knob_is_said_before_and_with_the_run(capsys, make_plan,
                                                                       tmp_path):
    """A plan records what its predictions were priced with (search.priced); an edit the other
    checks let run (zero, recompute) is named with the fix, as a new-user check asked, not left
    to read as the cost model's error."""
    plan = load_plan(make_plan("branched", "pp=1,tp=1,dp=2,micro_batch=2,zero=0"))
    assert plan.search["priced"] == plan.parallel
    code, out, _ = run(capsys, "run", make_plan("branched", "pp=1,tp=1,dp=2,micro_batch=2,zero=0"),
                       "--dry-run")
    assert code == 0 and "edited" not in out
    plan.parallel = {**plan.parallel, "zero": 3, "recompute": "full"}
    edited = str(tmp_path / "edited.json")
    plan.save(edited)
    code, out, _ = run(capsys, "run", edited, "--dry-run")
    assert code == 0 and "# note: parallel edited after planning (recompute none -> full, zero 0 " \
        "-> 3)" in out
    # (the re-plan pins every knob a person pins, so that it prices this configuration, and only
    # those: num_microbatches follows from the batch; a review saw a hint plan solve refused)
    hint = out.split("--fix ")[1].split(" for a prediction")[0]
    assert "zero=3" in hint and "recompute=full" in hint and "dp=2" in hint
    assert "num_microbatches" not in hint
    from planner.options import parse_fix  # noqa: PLC0415
    assert parse_fix(hint)["zero"] == 3


def test_a_run_takes_the_threads_its_calibration_measured_with(capsys, make_plan, tmp_path):
    """A plan priced from a CPU calibration runs its processes on the threads that calibration
    measured with, unless --threads says otherwise (a new-user check ran a 1-thread
    calibration's plan on 2 threads and read +70%)."""
    from costmodels.hardware import device_mapping, get_device
    plan = load_plan(make_plan("branched", "pp=1,tp=1,dp=2,micro_batch=2"))
    spec = plan.cluster["spec"]  # (a calibrated device travels as its mapping)
    device = spec["device"] if isinstance(spec["device"], dict) else device_mapping(
        get_device(spec["device"]))
    plan.cluster = {**plan.cluster, "spec": {**spec, "device": {**device, "threads": 1}}}
    path = str(tmp_path / "calibrated.json")
    plan.save(path)
    code, out, _ = run(capsys, "run", path, "--dry-run")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("torchrun ")]
    assert code == 0 and line.endswith("--threads 1"), out
    code, out, _ = run(capsys, "run", path, "--dry-run", "--threads", "2")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("torchrun ")]
    assert code == 0 and line.endswith("--threads 2"), out


def test_tp_with_a_map_that_splits_nothing_is_refused(capsys, make_plan, tmp_path):
    d = json.loads(open(make_plan("llama", "tp=2,pp=1,dp=1,micro_batch=2")).read())
    d["tensor_parallel"] = {k: "replicate" for k in d["tensor_parallel"]}
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(d))
    code, out, err = run(capsys, "run", str(edited), "--dry-run")
    _one_line_refusal(code, err, "parallel.tp: 2, but tensor_parallel splits no module")


def test_nproc_that_does_not_match_the_plan_is_refused(capsys, make_plan):
    path = make_plan("branched", "pp=2,tp=1,dp=1,micro_batch=2")
    code, _, err = run(capsys, "run", path, "--nproc", "3")
    _one_line_refusal(code, err, "nproc", "--nproc 2")


def test_a_multi_node_plan_is_refused_and_its_dry_run_is_one_torchrun_command(capsys, make_plan):
    path = make_plan("branched", "pp=2,tp=1,dp=2,micro_batch=1", nodes=2)
    code, _, err = run(capsys, "run", path, "--steps", "3")
    _one_line_refusal(code, err, "2 nodes", "--dry-run")
    code, out, _ = run(capsys, "run", path, "--steps", "3", "--dry-run")
    assert code == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("torchrun ")]
    assert "--nnodes 2" in line and "--nproc-per-node 2" in line and "--node-rank" not in line
    assert "--rdzv-backend c10d" in line and "--rdzv-endpoint $HEAD_NODE:29500" in line
    assert "planner.runtime.worker" in line and path in line and "--steps 3" in line
    one = make_plan("branched", "pp=2,tp=1,dp=1,micro_batch=1")  # one node: no HEAD_NODE to set
    code, out, _ = run(capsys, "run", one, "--dry-run")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("torchrun ")]
    assert code == 0 and "--standalone" in line and "HEAD_NODE" not in line
    assert "host memory" not in out  # a small model: nothing to say
    # a check found no command that prints the file the command writes: plan show does
    assert "# then `plan show measured.json` prints measured against predicted" in out


def test_a_dry_run_says_how_much_host_memory_a_node_needs(capsys, make_plan, monkeypatch):
    """Each process builds the whole model on its host (a new-user check's Llama-3 70B dry run
    printed a command for 8 processes a node without saying they need about 1.1 TB)."""
    import planner.cli.run as cli_run
    from planner.runtime.launch import host_bytes

    path = make_plan("branched", "pp=2,tp=1,dp=2,micro_batch=1", nodes=2)
    plan = load_plan(path)
    monkeypatch.setattr(cli_run, "HOST_NOTE_BYTES", 0.0)
    code, out, _ = run(capsys, "run", path, "--dry-run", "--device", "cuda")
    assert code == 0
    need = host_bytes(plan, 2, True)
    assert need == 2 * plan.model["num_params"] * 4  # fp32 weights, one copy per process
    assert f"a node needs about {need / 1e9:,.0f} GB of host memory" in out


@pytest.mark.slow
def test_run_measures_each_rank_next_to_the_prediction(capsys, make_plan, tmp_path):
    path = make_plan("branched", "pp=2,tp=1,dp=1,schedule=1f1b,micro_batch=2")
    out_file = tmp_path / "measured.json"
    code, out, err = run(capsys, "run", path, "--steps", "2", "--warmup", "1", "-o",
                         str(out_file))
    assert code == 0, err
    assert "step time" in out and "peak memory" in out
    res = json.loads(out_file.read_text())
    plan = load_plan(path)
    m = res["measured"]
    assert m["predicted_step_time_s"] == plan.predicted["step_time_s"]
    assert m["predicted_peak_memory_bytes"] == plan.predicted["peak_memory_bytes"]
    assert [r["rank"] for r in res["ranks"]] == [0, 1]
    for r in res["ranks"]:
        assert len(r["step_times_s"]) == 3  # warm-up, timed, profiled for memory
        assert r["median_step_time_s"] == r["step_times_s"][1] > 0
        assert r["peak_memory_bytes"] > r["state_bytes"] > 0
    assert m["step_time_s"] == max(r["median_step_time_s"] for r in res["ranks"])
    # the project's sign everywhere: predicted / measured - 1, negative when too fast
    assert m["step_time_error"] == pytest.approx(m["predicted_step_time_s"] / m["step_time_s"] - 1)
    assert len(res["loss_per_step"]) == 3 and res["loss_per_step"][2] < res["loss_per_step"][0]
    # the result file prints again as the run printed its table (plan show reads it)
    code, shown, _ = run(capsys, "show", str(out_file))
    assert code == 0 and shown.strip() in out and "step time" in shown
    code, _, err = run(capsys, "show", str(out_file), "--json")
    _one_line_refusal(code, err, "plan run measured", "drop --why")
    # data parallelism holds DTensors (replicate), whose count of held tensors crashed once
    dp = make_plan("branched", "pp=1,tp=1,dp=2,zero=0,micro_batch=2")
    code, out, err = run(capsys, "run", dp, "--steps", "2", "-o", str(out_file))
    assert code == 0, err
    assert all(r["peak_memory_bytes"] > r["state_bytes"] > 0
               for r in json.loads(out_file.read_text())["ranks"])


def test_a_gpu_plan_run_on_cpu_says_its_predictions_are_the_gpus(make_plan, tmp_path, caplog):
    from planner.runtime.launch import check
    from planner.runtime.options import RunOptions

    plan = load_plan(make_plan("llama", "pp=1,tp=1,dp=2,micro_batch=1"))
    plan.cluster = {**plan.cluster, "device": "a100-80g"}  # as if planned for two A100s
    path = str(tmp_path / "gpu.json")
    plan.save(path)
    with caplog.at_level("WARNING", logger="planner"):
        launch = check(path, RunOptions(steps=2, device="cpu"), None)
    assert launch.device == "cpu"
    assert "made for a100-80g GPUs, run here on CPU processes" in caplog.text


def test_cuda_on_a_machine_without_gpus_is_refused_as_a_device(capsys, make_plan):
    """A new-user check got the refusal under the field nproc."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    path = make_plan("branched", "pp=2,tp=1,dp=1,micro_batch=2")
    code, _, err = run(capsys, "run", path, "--device", "cuda")
    _one_line_refusal(code, err, "device: cuda", "--device cpu")


def test_an_interrupted_run_stops_the_processes_it_started(tmp_path):
    """SIGTERM to the planner alone stops torchrun's whole process group, not torchrun alone (a
    new-user check found its workers running on under init, and the temporary folder left), and
    the planner exits 143 as a process SIGTERM ended (a check found 130, Ctrl-C's code)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pids = tmp_path / "pids"
    script = (
        "import sys\n"
        "import argparse\n"
        "from planner.cli.main import run_command\n"
        "from planner.runtime.launch import run_group\n"
        f"argv = ['bash', '-c', 'sleep 60 & echo $! > {pids}; wait']\n"
        "args = argparse.Namespace(debug=False, func=lambda a: run_group(argv, sys.stdout))\n"
        "sys.exit(run_command(args))\n")
    proc = subprocess.Popen([sys.executable, "-c", script])
    for _ in range(200):  # the grandchild is up once its pid is written
        if pids.exists() and pids.read_text().strip():
            break
        time.sleep(0.05)
    grandchild = int(pids.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(grandchild, signal.SIGKILL)
        raise AssertionError("the worker outlived the run")


def test_a_run_still_warming_up_is_said():
    """Timed steps that keep getting faster (a new-user check: 687, 407, 326, 273, 228 ms with
    one untimed step) are named, with the warm-up that gives a steadier median."""
    from planner.runtime.measure import still_warming

    def rank(times, profiled=None):
        return {"step_times_s": times, "profiled_step": profiled,
                "median_step_time_s": sorted(times)[len(times) // 2]}

    warming = rank([0.9, 0.687, 0.407, 0.326, 0.273, 0.228], profiled=5)
    steady = rank([0.9, 0.25, 0.24, 0.26, 0.25])
    assert still_warming([warming, steady], 1) == [0.687, 0.273]
    assert still_warming([steady], 1) is None
    assert still_warming([rank([0.9, 0.5, 0.2])], 1) is None  # two timed steps: too few to say


def test_a_run_too_large_for_its_training_memory_asks_for_a_smaller_batch(capsys, make_plan,
                                                                           monkeypatch):
    """Where the plan's training peak, not the parameters, is what does not fit this machine's
    memory, the advice is a smaller batch or sequence, not a smaller model (a new-user check: a
    20.8 M-parameter MoE planned on H100s was told to run a smaller model)."""
    from planner.runtime import launch

    path = make_plan("llama", "pp=1,tp=1,dp=2,micro_batch=1")
    plan = load_plan(path)
    weights = plan.model["num_params"] * 4  # fp32, built by each of the two processes
    monkeypatch.setattr(launch, "_available_bytes", lambda: int(3 * weights))
    big = dict(plan.predicted, peak_memory_bytes=20 * weights)
    with pytest.raises(launch.SpecError, match="re-plan for this machine .* smaller batch"):
        launch._check_memory(dataclasses.replace(plan, predicted=big), 2, cuda=False)
    small = dict(plan.predicted, peak_memory_bytes=weights // 10)
    monkeypatch.setattr(launch, "_available_bytes", lambda: int(weights))
    with pytest.raises(launch.SpecError, match="run a smaller one"):  # the weights do not fit
        launch._check_memory(dataclasses.replace(plan, predicted=small), 2, cuda=False)


def test_the_cpu_memory_peak_is_measured_where_the_profilers_timeline_fails():
    """torch.profiler's memory timeline fails now and then on a rank (a new-user check saw it
    fail on every expert-parallel run); the peak then comes from the profiler's allocation
    events over the tensors held before the step, which agree with the timeline. In a process of
    its own, as a rank is: the tensors held before the step are all the process holds; with a
    DTensor among them, as every data- or tensor-parallel rank has (a review found the count of
    held tensors crashing on one)."""
    import subprocess
    import sys

    script = """
import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, distribute_tensor, init_device_mesh
from torch.profiler import _memory_profiler
from planner.runtime import measure

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29531", rank=0, world_size=1)
held = distribute_tensor(torch.zeros(1024, 256), init_device_mesh("cpu", (1,)), [Replicate()])

model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 256)

def step():
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

step()  # the optimizer's states exist before the measured step, as in a run
timeline = measure.Memory(torch.device("cpu"))
timeline.profile(step)
assert timeline.failure is None and timeline.peak() > 0

def broken(*args, **kwargs):
    raise AssertionError("version mismatch")

_memory_profiler.MemoryProfileTimeline = broken
events = measure.Memory(torch.device("cpu"))
events.profile(step)
assert "memory timeline failed on one or more ranks (AssertionError)" in events.failure
assert "allocation events" in events.method
print(timeline.peak(), events.peak())
dist.destroy_process_group()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    timeline, events = map(int, out.stdout.split())
    # an upper bound: the held DTensor's local tensor, which the step never reads, counts too
    assert events - timeline == pytest.approx(1024 * 256 * 4, abs=64)


@pytest.mark.parametrize("config,reads", [
    ({"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
      "intermediate_size": 64, "image_size": 32, "patch_size": 16}, None),
    ({"model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
      "vocab_size": 128, "decoder_start_token_id": 0, "pad_token_id": 0}, None),
    ({"model_type": "clip", "projection_dim": 16,
      "text_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 2, "vocab_size": 128, "max_position_embeddings": 32},
      "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "image_size": 32, "patch_size": 16}},
     "token ids and pixel_values"),
    ({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 128}, None)])
def test_models_the_runtime_cannot_feed_are_refused_before_any_process(tmp_path, config, reads):
    """Models the runtime cannot feed (two towers reading images and captions) are refused in one
    line before any process starts (a new-user check saw them crash inside the processes);
    decoder-only, image and encoder-decoder models (fed synthetic pixel values and decoder ids:
    tests/planner/runtime/test_equivalence.py) pass."""
    from planner.errors import SpecError
    from planner.runtime import model as mdl
    from planner.trace.models import resolve

    (tmp_path / "config.json").write_text(json.dumps(config))
    meta = resolve(str(tmp_path / "config.json"), seq_len=16, dtype="fp32")
    if reads is None:
        mdl.check_runnable(meta)
        return
    with pytest.raises(SpecError, match=f"plan run trains Hugging Face models that read token "
                                        f"ids or pixel values alone .*encoder-decoders.*{reads}"):
        mdl.check_runnable(meta)


def test_a_crash_in_the_processes_is_a_failed_run_and_a_refusal_bad_input(capfd, monkeypatch):
    """A process's crash (of the runtime or the model's code) is a failed run (exit 4), its
    refusal bad input (exit 2) (a new-user check saw crashes reported as bad input)."""
    from planner.errors import RunError, SpecError
    from planner.runtime import launch

    from planner.runtime import worker

    def boom(opts, device):
        raise RuntimeError("first line\nboom")

    import torch

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29537"), ("RANK", "0"),
                       ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        monkeypatch.setenv(key, value)
    args = worker.parser("x").parse_args(["--result", "/dev/null", "--device", "cpu"])
    threads = torch.get_num_threads()
    try:
        assert worker.guarded(args, boom) == 1  # a crash, with the worker's own line for it
    finally:
        torch.set_num_threads(threads)
    crash = launch._failure(1, capfd.readouterr().err)
    assert isinstance(crash, RunError) and "a process crashed: RuntimeError: boom;" in str(crash)
    assert "in the planner's runtime or in the model's own code" in crash.hint
    refusal = launch._failure(1, f"rank 0 {launch.ERROR_MARK} model: no such thing; fix it")
    assert type(refusal) is SpecError and str(refusal) == "model: no such thing; fix it"


def test_a_process_killed_by_a_signal_is_a_failed_run_that_names_the_likely_cause(
        capsys, monkeypatch, make_plan):
    """torchrun's summary of a worker the kernel killed (SIGKILL: out of host memory, most
    often) is a failed run, exit 4, with where to look; not bad input (exit 2), as it was."""
    from planner.errors import RunError
    from planner.runtime import launch
    summary = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-05_14:40:00\n"
               "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 4242)\n"
               "  error_file: <N/A>\n  traceback : Signal 9 (SIGKILL) received by PID 4242\n")
    killed = launch._failure(1, summary, "/tmp/run.log")
    assert isinstance(killed, RunError)
    assert "run: the processes failed (exit 1): rank      : 1 (local_rank: 1), exitcode  : -9" \
        in str(killed) and "/tmp/run.log" in str(killed)
    assert "out-of-memory killer" in killed.hint
    stopped = launch._failure(1, summary.replace("9 (SIGKILL)", "15 (SIGTERM)"))
    assert stopped.hint == "a process was stopped by SIGTERM from outside the run"
    # a segfault on one rank: the other's knock-on crash (a peer's connection reset) and
    # torchrun's SIGTERM to the rest are not the cause (a review read both as the cause)
    segv = (f"rank 0 {launch.CRASH_MARK} RuntimeError: [gloo] Read error: Connection reset by "
            "peer\n" + summary.replace("9 (SIGKILL)", "11 (SIGSEGV)")
            + "  traceback : Signal 15 (SIGTERM) received by PID 4243\n")
    died = launch._failure(1, segv)
    assert str(died).startswith("run: a process died of SIGSEGV (exit 1): rank      : 1")
    assert "Connection reset" not in str(died) and "native code" in died.hint

    def fail(*args, **kwargs):
        raise killed

    monkeypatch.setattr(launch, "check", fail)
    code = main(["run", make_plan("llama", "pp=1,tp=1,dp=1,micro_batch=2,recompute=none,zero=0")])
    err = capsys.readouterr().err
    assert code == 4 and err.startswith("plan: run failed: run: the processes failed"), err
    assert "out-of-memory killer" in err and len(err.strip().splitlines()) == 1


def test_a_model_with_dropout_is_said_to_differ_between_layouts():
    """A new-user check compared a T5's layouts (its default dropout_rate 0.1) and found their
    losses apart with no word why: every layout draws its own masks."""
    from torch import nn

    from planner.runtime.build import dropout_note
    assert dropout_note(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0))) == ""
    note = dropout_note(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Dropout(0.25)))
    assert note.startswith("the model has dropout (p = 0.1, 0.25): each layout draws other")


def test_oversubscribed_cpu_runs_name_the_fix_that_applies(caplog, monkeypatch):
    """A new-user check ran 2 processes x 4 threads on 2 cores and was told to run plans of at
    most 2 processes, which it did: the fix was fewer threads."""
    import os

    from planner.cli.run import _warn_oversubscribed
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    with caplog.at_level("WARNING", logger="planner"):
        _warn_oversubscribed("cpu", 2, 4)
        _warn_oversubscribed("cpu", 4, None)
        _warn_oversubscribed("cpu", 2, 1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].endswith("give --threads 1")
    assert lines[1].endswith("run plans of at most 2 processes here")


def test_sgd_keeps_the_momentum_buffer_the_plan_prices(make_plan):
    """costmodels.memory counts 4 bytes of fp32 momentum per parameter for SGD; the runtime's
    SGD keeps that buffer (a new-user check read plain SGD's states as +100%)."""
    import torch

    from planner.runtime import model as mdl
    plan = load_plan(make_plan("branched", "pp=1,tp=1,dp=2,micro_batch=2"))
    plan.training = {**plan.training, "optimizer": "sgd"}
    w = torch.nn.Parameter(torch.ones(3))
    opt = mdl.make_optimizer(plan, [w], lr=1.0)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == mdl.SGD_MOMENTUM > 0
    w.grad = torch.ones(3)
    opt.step()  # (the first step is plain SGD's: the buffer starts as the gradient)
    assert torch.equal(w.detach(), torch.zeros(3))
    assert torch.equal(opt.state[w]["momentum_buffer"], torch.ones(3))
