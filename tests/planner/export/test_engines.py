"""Exports read by the engines' own parsers, at the releases the exporters write for.

- torchtitan 0.2.2: ``ConfigManager().parse_args(["--job.config_file", file])``;
- torchtitan 0.3.0: ``ConfigManager().parse_args([...the exported arguments...])`` (it reads no
  TOML), and torchtitan's own Llama 3 70B built on the meta device, cut into stages by the exported
  module names with torchtitan's own split, in both releases;
- DeepSpeed 0.19.8: ``DeepSpeedConfig(file, mpu)`` with the world size of the plan;
- Megatron-LM core_v0.14.0 and core_v0.19.0: an argparse parser rebuilt from the record of
  ``add_megatron_arguments`` at the release's commit (data/megatron-<tag>.json, made by
  record_megatron_options.py), plus the rules of its ``validate_args`` the exports must meet.

``make install`` puts torchtitan 0.2.2 and DeepSpeed under ``.venv/engines`` (engine_check.py runs
them in a subprocess); ``make engines-full`` adds torchtitan 0.3.0 and what torchtitan's model
code imports (triton, datasets: about 1.3 GB). A test whose engine is missing skips, except that
under CI (``CI`` set) the default ones must be there.

Plans: data/plans/llama3-70b-pp4-<target>.json were made with ``plan solve llama3-70b --cluster
dgx-h100 --nodes 8 --global-batch 256 --seq-len 4096 --fix pp=4 --target <target>``;
llama3-70b-offload-<target>.json with ``plan solve llama3-70b --cluster dgx-h100 --nodes 1
--global-batch 16 --seq-len 2048 --target <target>`` (Llama 3 70B on 8 H100 fits only with the
optimizer on the host); llama3-70b-pp4-zero3-megatron.json with ``--fix pp=4,schedule=1f1b,zero=3
--target megatron`` before that target knew Megatron-FSDP runs without a pipeline (the pin is
refused now, and the plan's Megatron export too: it stays for the other engines' exports). Expert and context parallelism (all on dgx-h100, with ``--target <target>``):

- mixtral-8x7b-ep8-<target>.json: ``plan solve mixtral-8x7b --nodes 8 --global-batch 256
  --seq-len 4096 --fix ep=8``; mixtral-8x7b-ep4-etp2-megatron.json the same with
  ``--fix ep=4,tp=2,etp=2``;
- qwen3-30b-a3b-ep8-capacity-megatron.json: ``plan solve qwen3-30b-a3b --nodes 2 --global-batch
  128 --seq-len 4096 --fix ep=8 --engine moe_dispatcher=allgather,moe_capacity_factor=1.25,
  moe_imbalance=1.2``; qwen3-30b-a3b-pp2-ep8-torchtitan.json with ``--fix pp=2,ep=8`` (torchtitan
  defines Qwen3-30B-A3B: its own module names);
- llama3-8b-cp4-<target>.json: ``plan solve llama3-8b --nodes 4 --global-batch 32 --seq-len 65536
  --fix cp=4`` (the deepspeed one: tp 2 with Ulysses); llama3-8b-cp8-a2a-deepspeed.json with
  ``--fix cp=8,tp=1,pp=1``; llama3-8b-cp16-hier-megatron.json with
  ``--fix cp=16,tp=1,cp_comm=a2a+p2p``.

Each records ``tp_grad_overlap`` as the engine it was made with sets it (the default's and
megatron-core's true, torchtitan's false; added on 2026-12-07, when that setting came, so that the
exports read them as made with today's engines: their times predate its pricing, which these
tests do not compare).

They are loaded, never re-planned.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys

import pytest

from planner import targets
from planner.errors import InfeasibleError, SpecError
from planner.export import export, names, reprice
from planner.export.common import layout
from planner.planfile.document import Plan, load_plan

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
GOLDEN_PLANS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden", "plans")
ENGINES = os.path.join(sys.prefix, "engines")
CHECK = os.path.join(HERE, "engine_check.py")
FOLDERS = {"torchtitan-0.2.2": ["torchtitan-0.2.2"],
           "torchtitan-0.3.0": ["torchtitan-0.3.0", "torchtitan-runtime"],
           "deepspeed": ["deepspeed-0.19.8"],
           "split-0.2.2": ["torchtitan-0.2.2", "torchtitan-runtime"],
           "split-0.3.0": ["torchtitan-0.3.0", "torchtitan-runtime"]}
DEFAULT_INSTALL = {"torchtitan-0.2.2", "deepspeed"}
"""What ``make install`` installs; the others come with ``make engines-full``."""


@functools.lru_cache(maxsize=None)
def plan_named(name: str) -> Plan:
    for folder in (os.path.join(DATA, "plans"), GOLDEN_PLANS):
        path = os.path.join(folder, f"{name}.json")
        if os.path.exists(path):
            return load_plan(path)
    raise FileNotFoundError(name)


def variant(plan: Plan, **parallel) -> Plan:
    return dataclasses.replace(plan, parallel={**plan.parallel, **parallel})


def users_model(plan: Plan) -> Plan:
    """The plan as if made from a config.json of the user's: torchtitan defines no such model
    (with full recomputation, which needs no memory re-check, i.e. no trace of the config)."""
    return dataclasses.replace(variant(plan, recompute="full"),
                               model={**plan.model, "spec": "my/config.json", "source": "config"})


def engine_settings(plan: Plan, **settings) -> Plan:
    """The plan priced with other MoE engine settings (training.engine)."""
    engine = {**plan.training.get("engine", {}), **settings}
    return dataclasses.replace(plan, training={**plan.training, "engine": engine})


def fp8(plan: Plan, recipe: str) -> Plan:
    """The plan trained in FP8 with ``recipe`` (full recomputation: no memory re-check)."""
    plan = variant(plan, recompute="full")
    return dataclasses.replace(plan, training={**plan.training, "dtype": "fp8",
                                               "engine": {"fp8_recipe": recipe}})


CASES = {
    "70b-pp4-torchtitan": lambda: plan_named("llama3-70b-pp4-torchtitan"),
    "70b-pp4-deepspeed": lambda: plan_named("llama3-70b-pp4-deepspeed"),
    "70b-offload-megatron": lambda: plan_named("llama3-70b-offload-megatron"),
    "70b-gpipe-full": lambda: plan_named("even-llama3-70b"),
    "8b-uneven-selective": lambda: plan_named("uneven-llama3-8b"),
    "8b-zero0": lambda: variant(plan_named("uneven-llama3-8b"), zero=0),
    "8b-users-model": lambda: users_model(plan_named("uneven-llama3-8b")),
    "8b-op-recompute": lambda: variant(plan_named("uneven-llama3-8b"), recompute="op"),
    "8b-fp8-current": lambda: fp8(plan_named("uneven-llama3-8b"), "current"),
    "8b-fp8-block": lambda: fp8(plan_named("uneven-llama3-8b"), "block"),
    "8b-cp4-ring": lambda: plan_named("llama3-8b-cp4-torchtitan"),
    "8b-cp4-allgather": lambda: variant(plan_named("llama3-8b-cp4-torchtitan"),
                                        cp_comm="allgather"),
    "8b-cp4-ulysses": lambda: variant(plan_named("llama3-8b-cp4-torchtitan"), cp_comm="a2a"),
    "mixtral-ep8": lambda: plan_named("mixtral-8x7b-ep8-torchtitan"),
    "mixtral-ep8-allgather-capacity": lambda: engine_settings(
        plan_named("mixtral-8x7b-ep8-torchtitan"), moe_dispatcher="allgather",
        moe_capacity_factor=1.25, moe_overlap=True),
    "qwen3-pp2-ep8": lambda: plan_named("qwen3-30b-a3b-pp2-ep8-torchtitan"),
    "deepseek-ep8-deepep": lambda: engine_settings(renamed(
        plan_named("mixtral-8x7b-ep8-torchtitan"), "deepseek-v3"), moe_dispatcher="deepep"),
}
"""Plans every torchtitan release is checked with."""


def renamed(plan: Plan, spec: str) -> Plan:
    """The plan as if made for zoo model ``spec`` (a plan without a pipeline names no modules)."""
    return dataclasses.replace(plan, model={**plan.model, "spec": spec, "name": spec})


def engine(check: str, jobs: list[dict], tmp_path) -> list[dict]:
    """Run engine_check.py ``check`` on ``jobs`` with the engine's folders on PYTHONPATH."""
    folders = [os.path.join(ENGINES, f) for f in FOLDERS[check]]
    missing = [f for f in folders if not os.path.isdir(f)]
    if missing:
        fix = "make install" if check in DEFAULT_INSTALL else "make engines-full"
        if os.environ.get("CI") and check in DEFAULT_INSTALL:
            pytest.fail(f"{missing[0]} is missing: `{fix}` installs it")
        pytest.skip(f"{missing[0]} is not installed (`{fix}`)")
    jobs_path, out_path = tmp_path / f"{check}-jobs.json", tmp_path / f"{check}-out.json"
    jobs_path.write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(folders)}
    name = "torchtitan-split" if check.startswith("split-") else check
    done = subprocess.run([sys.executable, CHECK, name, str(jobs_path), str(out_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out_path.read_text())
    return result["answers"]


# ---- torchtitan ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def titan(tmp_path_factory):
    """{(version, case): (plan, what torchtitan's own parser made of the export)}."""
    out = {}
    for version in ("0.2.2", "0.3.0"):
        tmp = tmp_path_factory.mktemp(f"titan-{version}")
        jobs, keys = [], []
        for case, make in CASES.items():
            plan = make()
            text, name = export(plan, "torchtitan", version)
            path = tmp / f"{case}-{name}"
            path.write_text(text)
            job = {"path": str(path), "world": plan.cluster["num_gpus"]}
            if version != "0.2.2" and names.torchtitan_model(plan) is None:
                job["args"] = ["--module", "llama3", "--config", "llama3_8b"]
            jobs.append(job)
            keys.append((case, plan))
        try:
            answers = engine(f"torchtitan-{version}", jobs, tmp)
        except pytest.skip.Exception as skip:
            out[version] = skip
            continue
        out[version] = {case: (plan, a) for (case, plan), a in zip(keys, answers)}
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("version", ["0.2.2", "0.3.0"])
def test_torchtitan_parses_the_export_to_the_plan(titan, version, case):
    if isinstance(titan[version], BaseException):
        pytest.skip(str(titan[version]))
    plan, got = titan[version][case]
    assert "error" not in got, got
    p, t = plan.parallel, plan.training
    assert got["parallelism.data_parallel_replicate_degree"] * \
        got["parallelism.data_parallel_shard_degree"] == p["dp"]
    assert (got["parallelism.tensor_parallel_degree"],
            got["parallelism.pipeline_parallel_degree"]) == (p["tp"], p["pp"])
    assert got["training.global_batch_size"] == t["global_batch"]
    assert got["training.seq_len"] == t["seq_len"]
    assert got["training.enable_cpu_offload"] == bool(p.get("offload_optimizer"))
    local = got["training.local_batch_size"]
    if p["pp"] > 1:
        schedule = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
        assert got["parallelism.pipeline_parallel_schedule"] == schedule[p["schedule"]]
        assert got["parallelism.pipeline_parallel_microbatch_size"] == p["micro_batch"]
        assert local == p["micro_batch"] * p["num_microbatches"]
        own = names.torchtitan_names(plan, version)
        expected = own if own is not None else names.top_level_names(plan)[0]
        assert got["parallelism.module_fqns_per_model_part"] == expected
        assert len(expected) == p["pp"] * p["vpp"]
    else:
        assert local == p["micro_batch"]  # torchtitan accumulates global / (local x dp) steps
        assert t["global_batch"] // (local * p["dp"]) == p["num_microbatches"]
    if version == "0.2.2":
        mode = "selective" if p["recompute"] == "op" else p["recompute"]
        assert got["activation_checkpoint.mode"] == mode
        if mode == "selective":
            assert got["activation_checkpoint.selective_ac_option"] == "op"
        fp8 = t["dtype"] == "fp8"
        recipe = t.get("engine", {}).get("fp8_recipe") if fp8 else None
        converter = {"current": "quantize.linear.float8", "block": "quantize.linear.mx"}.get(recipe)
        assert got["model.converters"] == ([converter] if fp8 else [])
        assert got["quantize.linear.float8.recipe_name"] == ("tensorwise" if recipe == "current"
                                                             else None)
        assert got["quantize.linear.mx.recipe_name"] == "mxfp8_cublas"  # its default, or ours
    else:
        ac = {"none": "none", "full": "FullAC", "selective": "SelectiveAC",
              "op": "SelectiveAC"}[p["recompute"]]
        assert got["activation_checkpoint"] == ac
        assert got["compile.enable_async_tensor_parallel"] is False
        assert got["training.disable_cuda_graphs"] == (p["pp"] > 1)
        if p["tp"] > 1:
            assert got["parallelism.enable_sequence_parallel"] == p["sequence_parallel"]
    # context and expert parallelism, and the meshes torchtitan's ParallelDims builds from them
    cp, ep = p.get("cp", 1), p.get("ep", 1)
    assert got["parallelism.context_parallel_degree"] == cp
    assert got["parallelism.expert_parallel_degree"] == ep
    if version == "0.2.2":
        assert got["parallelism.expert_tensor_parallel_degree"] == p.get("etp", 1)
        deepep = t.get("engine", {}).get("moe_dispatcher") == "deepep" and ep > 1 and \
            names.torchtitan_model(plan)[0] in ("deepseek_v3", "llama4")
        assert got["parallelism.expert_parallel_comm_backend"] == \
            ("deepep" if deepep else "standard")
        if cp > 1:  # torch's default all-gather: the option reaches only the validator
            assert got["parallelism.context_parallel_rotate_method"] == "allgather"
    meshes = got["meshes"]
    shard = got["parallelism.data_parallel_shard_degree"]
    assert meshes.get("cp", 1) == cp and meshes.get("tp", 1) == p["tp"]
    assert meshes.get("pp", 1) == p["pp"]
    if ep > 1:  # experts folded over dp_shard x cp x tp: efsdp x ep (x etp) of them
        etp = p.get("etp", 1) if version == "0.2.2" else 1
        assert meshes["ep"] == ep and meshes["efsdp"] * ep * etp == shard * cp * p["tp"]


def test_torchtitan_module_names_are_its_own_for_the_zoo_and_the_users_otherwise(titan):
    if isinstance(titan["0.2.2"], BaseException):
        pytest.skip(str(titan["0.2.2"]))
    _, own = titan["0.2.2"]["8b-uneven-selective"]
    parts = own["parallelism.module_fqns_per_model_part"]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    _, users = titan["0.2.2"]["8b-users-model"]  # (Hugging Face's wrapper taken off)
    assert users["parallelism.module_fqns_per_model_part"][0][:3] == [
        "embed_tokens", "rotary_emb", "layers.0"]
    text = export(users_model(plan_named("uneven-llama3-8b")), "torchtitan")[0]
    assert "torchtitan defines no model for llama3-8b" in text
    assert "with the wrapper 'model.' taken off the plan's names" in text


# ---- torchtitan's own model, split by the exported names ---------------------------------------

SPLITS = [("0.2.2", "llama3-70b-pp4-deepspeed"), ("0.3.0", "llama3-70b-pp4-torchtitan"),
          ("0.2.2", "qwen3-30b-a3b-pp2-ep8-torchtitan"),
          ("0.3.0", "qwen3-30b-a3b-pp2-ep8-torchtitan")]


@pytest.mark.parametrize("version,stem", SPLITS)
def test_torchtitans_own_llama_split_by_the_exported_names_holds_the_plans_parameters(
        version, stem, tmp_path):
    """Per pipeline rank, torchtitan's chunks hold the parameters the plan prices: matrices split
    over tp, routed experts over ep x etp, norms (vectors) whole, summed over the rank's virtual
    stages (Llama 3 70B, and the mixture of experts Qwen3-30B-A3B). The plan's own Hugging Face
    names (what the export used to write) leave the chunks empty."""
    plan = plan_named(stem)
    p = plan.parallel
    schedule = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}[p["schedule"]]
    stages = names.torchtitan_names(plan, version)
    hf = [list(st["modules"]) for st in plan.stages]
    module, flavor = names.torchtitan_model(plan)
    job = {"module": module, "flavor": flavor, "schedule": schedule, "pp": p["pp"]}
    own, theirs = engine(f"split-{version}", [{**job, "stages": stages}, {**job, "stages": hf}],
                         tmp_path)
    assert "error" not in own, own
    assert own["total"] == plan.model["num_params"]
    assert own["children"][-1] == {"0.2.2": "output", "0.3.0": "lm_head"}[version]
    per_rank = [0.0] * p["pp"]
    experts = p.get("ep", 1) * p.get("etp", 1)
    for i, chunk in enumerate(own["stages"]):
        per_rank[i % p["pp"]] += (chunk["matrices"] / p["tp"] + chunk["experts"] / experts
                                  + chunk["vectors"])
    for rank, params in enumerate(per_rank):
        assert params == pytest.approx(plan.stages[rank]["predicted"]["params"], rel=1e-5), rank
    assert sum(c["matrices"] + c["experts"] + c["vectors"] for c in own["stages"]) == own["total"]
    assert any(c["experts"] for c in own["stages"]) == (plan.parallel.get("ep", 1) > 1)
    # the Hugging Face names match nothing there ("lm_head" is 0.3.0's own name for the head)
    kept = [c["matrices"] + c["experts"] + c["vectors"] for c in theirs["stages"]]
    assert all(n == 0 for n, part in zip(kept, hf) if "lm_head" not in part or version == "0.2.2")


# ---- DeepSpeed ----------------------------------------------------------------------------------

def ds_job(plan: Plan, path, *, mpu: bool) -> dict:
    p = plan.parallel
    return {"path": str(path), "world": plan.cluster["num_gpus"],
            "mpu": [p["tp"], p["pp"], p["dp"]] if mpu else None}


def test_deepspeed_config_accepts_the_exports(tmp_path):
    """With pp > 1 DeepSpeed's pipeline engine passes the PipelineModule's grid as the mpu (the
    stand-in gives its sizes); AutoTP (pp = 1) has none, and DeepSpeed counts every GPU. The
    export that used to give AutoTP the plan's batch size fails DeepSpeed's batch check. Ulysses
    (cp_comm a2a, tp 1) builds the (data_parallel, sequence_parallel) mesh deepspeed.initialize
    builds, and DeepSpeed counts the data-parallel ranks only; context parallelism DeepSpeed
    cannot express leaves the batch size to DeepSpeed, as AutoTP does. Expert parallelism goes
    through AutoEP's own checks, DeepEP (comm_backend "deepep") with its buffer sized to the
    tokens a rank routes, which AutoEP requires."""
    jobs, plans = [], []
    for stem, plan in (("70b-pp4", plan_named("llama3-70b-pp4-deepspeed")),
                       ("70b-gpipe", plan_named("even-llama3-70b")),
                       ("8b", plan_named("uneven-llama3-8b")),
                       ("8b-fp8", fp8(plan_named("uneven-llama3-8b"), "current")),
                       ("70b-offload", plan_named("llama3-70b-offload-deepspeed")),
                       ("mixtral-ep8", plan_named("mixtral-8x7b-ep8-deepspeed")),
                       ("mixtral-ep8-allgather", engine_settings(
                           plan_named("mixtral-8x7b-ep8-deepspeed"), moe_dispatcher="allgather",
                           moe_grouped_gemm=False)),
                       ("mixtral-ep8-deepep", engine_settings(
                           plan_named("mixtral-8x7b-ep8-deepspeed"), moe_dispatcher="deepep")),
                       ("8b-cp8-ulysses", plan_named("llama3-8b-cp8-a2a-deepspeed")),
                       ("8b-cp8-ring", variant(plan_named("llama3-8b-cp8-a2a-deepspeed"),
                                               cp_comm="p2p")),
                       ("8b-cp4-tp2", plan_named("llama3-8b-cp4-deepspeed"))):
        path = tmp_path / f"{stem}.json"
        path.write_text(export(plan, "deepspeed")[0])
        autotp = plan.parallel["pp"] == 1 and plan.parallel["tp"] > 1
        jobs.append(ds_job(plan, path, mpu=plan.parallel["pp"] > 1))
        plans.append(plan)
        if autotp:  # the same file when the training script passes a Megatron-style mpu
            jobs.append(ds_job(plan, path, mpu=True))
            plans.append(plan)
    old = json.loads(export(plan_named("llama3-70b-offload-deepspeed"), "deepspeed")[0])
    old["train_batch_size"] = 16
    (tmp_path / "old.json").write_text(json.dumps(old))
    jobs.append(ds_job(plan_named("llama3-70b-offload-deepspeed"), tmp_path / "old.json",
                       mpu=False))
    answers = engine("deepspeed", jobs, tmp_path)
    for plan, job, got in zip(plans, jobs, answers):
        p = plan.parallel
        cp, ep = p.get("cp", 1), p.get("ep", 1)
        ulysses = cp > 1 and p["cp_comm"] == "a2a" and p["tp"] == 1
        assert "error" not in got, (job, got)
        # without an mpu DeepSpeed counts the tp ranks, and cp ranks unless Ulysses divides them out
        per_sample = 1 if job["mpu"] else p["tp"] * (1 if ulysses else cp)
        assert got["train_batch_size"] == plan.training["global_batch"] * per_sample
        assert got["world_size"] == (p["dp"] if job["mpu"] or ulysses else
                                     plan.cluster["num_gpus"])
        assert (got["train_micro_batch_size_per_gpu"], got["gradient_accumulation_steps"]) == \
            (p["micro_batch"], p["num_microbatches"])
        zero = p["zero"] if p["pp"] == 1 else min(p["zero"], 1)
        assert got["zero_stage"] == zero
        assert got["offload_optimizer"] == ("cpu" if p.get("offload_optimizer") else None)
        assert got["autotp_size"] == (p["tp"] if p["pp"] == 1 and p["tp"] > 1 else 0)
        assert got["bf16"] is (plan.training["dtype"] in ("bf16", "fp8"))
        assert got["mesh"] == ({"data_parallel": p["dp"], "sequence_parallel": cp} if ulysses
                               else None)
        if ep > 1:
            engine_ = plan.training.get("engine", {})
            deepep = engine_.get("moe_dispatcher") == "deepep"
            assert got["autoep"] == {"autoep_size": ep, "etp": 1, "preset_model": "mixtral",
                                     "use_grouped_mm": engine_.get("moe_grouped_gemm", True),
                                     "edp": plan.cluster["num_gpus"] // p["pp"] // ep,
                                     "comm_backend": "deepep" if deepep else "comm",
                                     "comm_max_tokens_per_rank": p["micro_batch"] *
                                     plan.training["seq_len"] if deepep else 0}
        else:
            assert got["autoep"] is None
    assert "train_batch_size is not equal to micro_batch_per_gpu" in answers[-1]["error"]


# ---- Megatron-LM --------------------------------------------------------------------------------

MEGATRON = ("core_v0.14.0", "core_v0.19.0")
TYPES = {"int": int, "float": float, "str": str}


@functools.lru_cache(maxsize=None)
def megatron_parser(version: str) -> argparse.ArgumentParser:
    """Megatron-LM's parser at ``version``, rebuilt from the recorded options: names, kinds,
    nargs, types and choices (options with a custom type function accept any string)."""
    with open(os.path.join(DATA, f"megatron-{version}.json"), encoding="utf-8") as f:
        record = json.load(f)
    assert record["ref"] == version and len(record["commit"]) == 40
    parser = argparse.ArgumentParser(prog=f"megatron {version}", allow_abbrev=False,
                                     exit_on_error=False)
    for o in record["options"]:
        kw = {"dest": o["dest"]}
        if o["kind"] in ("store_true", "store_false"):
            kw["action"] = o["kind"]
        elif o["kind"] == "boolean_optional":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = TYPES.get(o["type"], str)
            if o["nargs"] is not None:
                kw["nargs"] = o["nargs"]
            if o["choices"] is not None:
                kw["choices"] = [kw["type"](c) for c in o["choices"]] \
                    if o["type"] in TYPES else [str(c) for c in o["choices"]]
        names_ = [n for n in o["options"] if not (o["kind"] == "boolean_optional"
                                                  and n.startswith("--no-"))]
        parser.add_argument(*names_, **kw)
    return parser


def sourced(path) -> tuple[list[str], dict]:
    """The array and the exported environment of a Megatron export, as bash sees them."""
    script = ('env -u CUDA_DEVICE_MAX_CONNECTIONS bash -c \'source "$1" && printf "%s\\0" '
              '"${MEGATRON_PARALLEL_ARGS[@]}" && printf "\\1%s" '
              '"${CUDA_DEVICE_MAX_CONNECTIONS-unset}"\' bash "$0"')
    out = subprocess.run(["bash", "-c", script, str(path)], capture_output=True, check=True,
                         env={**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "8"}).stdout
    args, env = out.split(b"\1")
    return [a.decode() for a in args.split(b"\0")[:-1]], {"CUDA_DEVICE_MAX_CONNECTIONS":
                                                          env.decode()}


MEGATRON_PLANS = {
    "70b-pp4-megatron": lambda: plan_named("llama3-70b-pp4-megatron"),
    "70b-offload-megatron": lambda: plan_named("llama3-70b-offload-megatron"),
    "70b-gpipe-full": lambda: plan_named("even-llama3-70b"),
    "8b-uneven-selective": lambda: plan_named("uneven-llama3-8b"),
    "70b-every-2nd-layer": lambda: variant(plan_named("llama3-70b-pp4-megatron"),
                                           recompute="full/2"),
    "70b-pp4-deepspeed": lambda: plan_named("llama3-70b-pp4-deepspeed"),
    "8b-op-recompute": CASES["8b-op-recompute"],
    "8b-fp8-delayed": lambda: fp8(plan_named("uneven-llama3-8b"), "delayed"),
    "8b-fp8-block": CASES["8b-fp8-block"],
    "mixtral-ep8": lambda: plan_named("mixtral-8x7b-ep8-megatron"),
    "mixtral-ep4-etp2": lambda: plan_named("mixtral-8x7b-ep4-etp2-megatron"),
    "mixtral-ep4-etp2-no-sp": lambda: variant(plan_named("mixtral-8x7b-ep4-etp2-megatron"),
                                              sequence_parallel=False),
    "qwen3-allgather-capacity": lambda: plan_named("qwen3-30b-a3b-ep8-capacity-megatron"),
    "qwen3-capacity-padded": lambda: engine_settings(
        plan_named("qwen3-30b-a3b-ep8-capacity-megatron"), moe_dispatcher="alltoall",
        moe_pad_to_capacity=True),
    "qwen3-deepep-overlap": lambda: engine_settings(
        plan_named("qwen3-30b-a3b-ep8-capacity-megatron"), moe_dispatcher="deepep",
        moe_overlap=True),
    "qwen3-overlap": lambda: engine_settings(plan_named("qwen3-30b-a3b-ep8-capacity-megatron"),
                                             moe_dispatcher="alltoall", moe_capacity_factor=0.0,
                                             moe_overlap=True),
    "mixtral-overlap-tp": lambda: engine_settings(plan_named("mixtral-8x7b-ep4-etp2-megatron"),
                                                  moe_overlap=True),
    "qwen3-moe-act": lambda: variant(plan_named("qwen3-30b-a3b-ep8-capacity-megatron"),
                                     recompute="moe_act"),
    "qwen3-moe-act-ungrouped": lambda: engine_settings(variant(
        plan_named("qwen3-30b-a3b-ep8-capacity-megatron"), recompute="moe_act"),
        moe_grouped_gemm=False),
    # moe_act refused (ungrouped expert GEMMs): full is written, and so no overlap beside it
    "qwen3-moe-act-refused-overlap": lambda: engine_settings(variant(
        plan_named("qwen3-30b-a3b-ep8-capacity-megatron"), recompute="moe_act"),
        moe_grouped_gemm=False, moe_dispatcher="alltoall", moe_capacity_factor=0.0,
        moe_overlap=True),
    "deepseek-mla-up-proj": lambda: variant(renamed(
        plan_named("qwen3-30b-a3b-ep8-capacity-megatron"), "deepseek-v3"),
        recompute="mla_up_proj"),
    "deepseek-mla-up-proj-moe-act": lambda: variant(renamed(
        plan_named("qwen3-30b-a3b-ep8-capacity-megatron"), "deepseek-v3"),
        recompute="mla_up_proj+moe_act"),
    "qwen3-overlap-full-recompute": lambda: engine_settings(variant(
        plan_named("qwen3-30b-a3b-ep8-capacity-megatron"), recompute="full"),
        moe_dispatcher="alltoall", moe_overlap=True),
    "8b-cp4-ring": lambda: plan_named("llama3-8b-cp4-megatron"),
    "8b-cp4-allgather": lambda: variant(plan_named("llama3-8b-cp4-megatron"),
                                        cp_comm="allgather"),
    "8b-cp4-ulysses": lambda: variant(plan_named("llama3-8b-cp4-megatron"), cp_comm="a2a"),
    "8b-cp16-hierarchical": lambda: plan_named("llama3-8b-cp16-hier-megatron"),
}
CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
"""What Transformer Engine's attn_forward_func_with_cp runs (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py); Megatron-LM passes --cp-comm-type to it unchecked."""


@pytest.mark.parametrize("case", sorted(MEGATRON_PLANS))
@pytest.mark.parametrize("version", MEGATRON)
def test_megatron_parser_reads_the_export_to_the_plan(version, case, tmp_path):
    plan = MEGATRON_PLANS[case]()
    p = plan.parallel
    if version == "core_v0.14.0" and p.get("ep", 1) > 1 and p["zero"] >= 2:
        with pytest.raises(SpecError, match=r"runs Megatron-FSDP, which has no expert groups in "
                                            r"core_v0\.14\.0; export for core_v0\.19\.0"):
            export(plan, "megatron", version)
        return
    path = tmp_path / "args.sh"
    path.write_text(export(plan, "megatron", version)[0])
    args, env = sourced(path)
    ns = megatron_parser(version).parse_args(args)
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (p["tp"], p["pp"])
    assert (ns.micro_batch_size, ns.global_batch_size, ns.seq_length) == (
        p["micro_batch"], plan.training["global_batch"], plan.training["seq_len"])
    assert ns.global_batch_size // (ns.micro_batch_size * p["dp"]) == p["num_microbatches"]
    forced = p.get("ep", 1) > 1 and version == "core_v0.14.0"  # see megatron_rules
    assert ns.sequence_parallel == (p["tp"] > 1 and (p["sequence_parallel"] or forced))
    assert ns.bf16 == (plan.training["dtype"] in ("bf16", "fp8"))
    recipe = plan.training.get("engine", {}).get("fp8_recipe")
    if plan.training["dtype"] == "fp8":
        assert ns.fp8 == ("e4m3" if recipe == "block" else "hybrid")  # --fp8-format
        assert ns.fp8_recipe == {"delayed": "delayed", "current": "tensorwise",
                                 "block": "mxfp8"}[recipe]
    else:
        assert ns.fp8 is None
    rc = {"none": None, "selective": "selective", "full": "full", "op": "full",
          "full/2": "full", "full/4": "full",
          "moe_act": "selective" if ns.moe_grouped_gemm else "full",
          "mla_up_proj": "selective", "mla_up_proj+moe_act": "selective"}[p["recompute"]]
    assert ns.recompute_granularity == rc
    if p["recompute"].startswith("full/"):  # the block method, as many layers as planned
        assert (ns.recompute_method, ns.recompute_num_layers) == ("block", max(
            sum(b in plan.recomputed_blocks() for b in st["blocks"]) for st in plan.stages))
    if rc == "selective":
        assert ns.recompute_modules == {"moe_act": ["moe_act", "layernorm"],
                                        "mla_up_proj": ["mla_up_proj"],
                                        "mla_up_proj+moe_act": ["mla_up_proj", "moe_act",
                                                                "layernorm"]}.get(
            p["recompute"])  # (None: Megatron's default, core_attn)
    fsdp = p["dp"] > 1 and p["zero"] >= 2
    assert ns.use_megatron_fsdp == fsdp and ns.use_distributed_optimizer == (
        p["dp"] > 1 and p["zero"] >= 1)
    if fsdp:
        assert ns.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}[
            p["zero"]]
    offload = bool(p.get("offload_optimizer"))
    assert ns.optimizer_cpu_offload == offload
    if offload:
        assert ns.optimizer_offload_fraction == 1.0
    assert megatron_stages(ns) == layout(plan).counts
    megatron_experts(plan, ns, version)
    megatron_rules(ns, env, version, plan.cluster["num_gpus"])


def megatron_experts(plan: Plan, ns, version: str) -> None:
    """Context and expert parallelism and the MoE settings, as the plan has them (the rebuilt
    parser keeps no defaults: an option not given is None)."""
    p, engine = plan.parallel, plan.training.get("engine", {})
    cp, ep, etp = p.get("cp", 1), p.get("ep", 1), p.get("etp", 1)
    assert (ns.context_parallel_size or 1) == cp
    if cp > 1:
        form = {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a",
                "a2a+p2p": "a2a+p2p"}[p["cp_comm"]]
        assert ns.cp_comm_type == [form]
        if form == "a2a+p2p":  # a2a inside a node (8 GPUs / tp), a ring across
            inner = min(cp, plan.cluster["gpus_per_node"] // p["tp"])
            assert ns.hierarchical_context_parallel_sizes == [inner, cp // inner]
    assert (ns.expert_model_parallel_size or 1) == ep
    moe = ep > 1 or plan.model["name"].startswith(("mixtral", "qwen3"))
    if not moe:
        assert ns.num_experts is None and ns.expert_tensor_parallel_size is None
        return
    assert ns.expert_tensor_parallel_size == etp
    assert (ns.num_experts, ns.moe_router_topk) == {"mixtral": (8, 2), "qwen3": (128, 8),
                                                    "deepseek": (256, 8)}[
        plan.model["name"].split("-")[0]]
    dispatcher = engine.get("moe_dispatcher", "alltoall")
    assert ns.moe_token_dispatcher_type == {"deepep": "flex"}.get(dispatcher, dispatcher)
    if dispatcher == "deepep":  # the flex dispatcher's DeepEP backend, as each release names it
        assert bool(ns.moe_enable_deepep) == (version == "core_v0.14.0")
        assert version == "core_v0.14.0" or ns.moe_flex_dispatcher_backend == "deepep"
    capacity = engine.get("moe_capacity_factor", 0.0)
    assert ns.moe_expert_capacity_factor == (capacity or None)
    assert ns.moe_pad_expert_input_to_capacity == engine.get("moe_pad_to_capacity", False)
    assert ns.moe_grouped_gemm == engine.get("moe_grouped_gemm", True)
    # (the recomputation written: full where Megatron has none of the plan's kind or refuses it)
    overlap = engine.get("moe_overlap", False) and dispatcher in ("alltoall", "deepep") \
        and ns.recompute_granularity != "full" and (p["pp"] == 1 or p["vpp"] > 1)
    assert ns.overlap_moe_expert_parallel_comm == overlap


def megatron_stages(ns) -> list[int]:
    """Layers per (virtual) stage as Megatron-LM builds them from the parsed arguments."""
    if ns.pipeline_model_parallel_layout:
        import re  # noqa: PLC0415
        text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)),
                      ns.pipeline_model_parallel_layout)
        return [part.count("t") for part in text.split("|")]
    pp, vpp = ns.pipeline_model_parallel_size, ns.num_virtual_stages_per_pipeline_rank or 1
    first, last = ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers
    edges = [n for n in (first, last) if n is not None]
    middle = (ns.num_layers - sum(edges)) // (pp * vpp - len(edges))
    return ([first] if first else []) + [middle] * (pp * vpp - len(edges)) + (
        [last] if last else [])


def megatron_rules(ns, env: dict, version: str, world: int) -> None:
    """What Megatron-LM's validate_args asserts of these options (megatron/training/arguments.py
    at core_v0.19.0, lines in brackets; core_v0.14.0 has the same checks), and what Megatron-Core's
    ModelParallelConfig and TransformerConfig (model_parallel_config.py, transformer/
    transformer_config.py, built from the arguments by core_transformer_config_from_args) and its
    parallel_state.initialize_model_parallel assert of them."""
    connections = env["CUDA_DEVICE_MAX_CONNECTIONS"]
    tp, cp, pp = (ns.tensor_model_parallel_size, ns.context_parallel_size or 1,
                  ns.pipeline_model_parallel_size)
    ep = ns.expert_model_parallel_size or 1
    etp = ns.expert_tensor_parallel_size or tp
    if ns.optimizer_cpu_offload:  # [1803-1807]; and optimizer_config.py [430-436]
        assert ns.use_precision_aware_optimizer and ns.use_distributed_optimizer
    if ns.use_megatron_fsdp:  # [1143-1147]
        assert connections != "1" and ns.ckpt_format == "fsdp_dtensor"
    elif ns.overlap_moe_expert_parallel_comm:  # [1426-1435] warns; the MoE README asks > 1
        assert connections != "1"
    elif tp > 1 or cp > 1:  # [1413-1439], GPUs before Blackwell
        assert connections == "1"
    assert sum(x is not None for x in (ns.num_layers_per_virtual_pipeline_stage,
                                       ns.num_virtual_stages_per_pipeline_rank,
                                       ns.pipeline_model_parallel_layout)) <= 1  # [895-904]
    assert ns.sequence_parallel <= (tp > 1)
    assert world % (tp * cp * pp) == 0  # [422-429]
    if cp > 1:
        assert ns.seq_length % (2 * cp) == 0  # [1295-1298]
        assert all(t in CP_COMM_TYPES for t in ns.cp_comm_type)
        if "a2a+p2p" in ns.cp_comm_type:  # [562-567]
            assert math.prod(ns.hierarchical_context_parallel_sizes) == cp
    if ep > 1:  # [1600-1603]; 0.14.0 also asserts not fp16
        assert ns.num_experts is not None and ns.num_experts % ep == 0
        assert world % (etp * ep * pp) == 0  # parallel_state.initialize_model_parallel
        if tp > 1 and version == "core_v0.14.0":  # ModelParallelConfig raises (0.19.0 warns)
            assert ns.sequence_parallel
    if ns.moe_grouped_gemm and version == "core_v0.14.0":  # 0.14.0 validate_args [790-793]
        assert ns.bf16
    if ns.recompute_granularity == "selective" and "moe_act" in (ns.recompute_modules or []):
        assert ns.moe_grouped_gemm  # TransformerConfig.__post_init__ raises ValueError
        if ns.fp8:  # the same: "Delayed scaling does not support moe_act and layernorm ..."
            assert ns.fp8_recipe != "delayed"
    if ns.moe_pad_expert_input_to_capacity:  # TransformerConfig.__post_init__
        assert ns.moe_expert_capacity_factor is not None
        assert ns.moe_token_dispatcher_type != "flex"
    if ns.moe_token_dispatcher_type == "flex":  # MoEFlexTokenDispatcher: "requires TPxEP > 1"
        assert etp * ep > 1
    if ns.moe_enable_deepep:  # TransformerConfig.__post_init__
        assert ns.moe_token_dispatcher_type == "flex"
    if ns.overlap_moe_expert_parallel_comm:  # TransformerConfig.__post_init__
        assert ep > 1 and ns.moe_token_dispatcher_type in ("alltoall", "flex")
        assert ns.recompute_granularity != "full" and ns.recompute_method is None
        assert ns.bf16 or ns.fp16
        assert pp == 1 or ns.num_virtual_stages_per_pipeline_rank or \
            ns.pipeline_model_parallel_layout


def test_megatron_parser_rejects_what_megatron_does_not_have():
    """The rebuilt parser is as strict as Megatron-LM's: no abbreviations, no unknown options,
    choices checked."""
    parser = megatron_parser("core_v0.19.0")
    for bad in (["--optimizer-cpu-offloading"], ["--tensor-model-parallel", "2"],
                ["--recompute-granularity", "selected"], ["--ckpt-format", "dtensor"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parser.parse_args(bad)


def test_megatron_offload_needs_what_megatron_asks_for(tmp_path):
    """The export for a plan that fits only with the optimizer on the host (Llama 3 70B on 8 H100
    made for Megatron-LM): the offload flags, the precision-aware optimizer they need, and
    Megatron-FSDP with its checkpoint format and CUDA_DEVICE_MAX_CONNECTIONS unset."""
    plan = plan_named("llama3-70b-offload-megatron")
    assert plan.parallel["offload_optimizer"] and plan.search["target"] == "megatron"
    text = export(plan, "megatron")[0]
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in text
    args = text[text.index("MEGATRON_PARALLEL_ARGS=("):]
    for flag in ("--optimizer-cpu-offload --optimizer-offload-fraction 1.0 "
                 "--use-precision-aware-optimizer", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy optim_grads_params",
                 "--use-distributed-optimizer", "--ckpt-format fsdp_dtensor"):
        assert flag in args
    assert "Every knob of the plan is expressed exactly below." in text
    # (with tensor or context parallelism on a Hopper, Megatron-LM warns about the two settings)
    warned = "it warns that those run best at 1, which Megatron-FSDP forbids"
    assert (plan.parallel["tp"] > 1) == (warned in text)
    assert warned in export(variant(plan, tp=2, sequence_parallel=True), "megatron")[0]
    assert warned not in export(variant(plan, tp=1, cp=1), "megatron")[0]
    ds = json.loads(export(plan_named("llama3-70b-offload-deepspeed"), "deepspeed")[0])
    assert ds["zero_optimization"] == {"stage": 3, "overlap_comm": True,
                                       "offload_optimizer": {"device": "cpu",
                                                             "pin_memory": True}}


# ---- the memory of what the engine runs ---------------------------------------------------------

@pytest.mark.parametrize("fix", ["tp=2,pp=4,schedule=1f1b,zero=1",
                                 "tp=2,pp=2,vpp=2,schedule=interleaved-1f1b,recompute=selective"])
def test_repricing_the_plans_own_configuration_gives_its_memory(fix):
    """The re-check prices as the search does: a plan's own configuration on its own split gives
    the plan's memory per pipeline rank (1F1B, and interleaved with the schedule simulated)."""
    import planner  # noqa: PLC0415
    plan = planner.plan("llama3-8b", cluster="dgx-h100", nodes=1, global_batch=32, seq_len=4096,
                        fix=fix, top_k=0)
    mem = reprice.memory(plan)
    planned = [plan.stages[r]["predicted"]["memory_bytes"]["total"]
               for r in range(plan.parallel["pp"])]
    assert mem.per_rank == pytest.approx(planned, rel=1e-5)


def test_deepspeed_refuses_a_zero_downgrade_that_no_longer_fits():
    """ZeRO-3 with pp=4 (made for Megatron-LM): DeepSpeed's pipeline engine runs ZeRO-1, which
    needs more memory than an H100 has; the refusal gives the numbers and the way out."""
    plan = plan_named("llama3-70b-pp4-zero3-megatron")
    with pytest.raises(InfeasibleError) as err:
        export(plan, "deepspeed")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("no deepspeed export fits: "
                                              "with ZeRO-1 instead of the plan's "
                                              "ZeRO-3")
    assert "GB per GPU, more than the 80.2 GB usable of 85.5 GB (the plan: 59.9 GB)" in msg
    assert "--fix pp=4,schedule=1f1b --target deepspeed" in msg  # zero=3 dropped: not with pp


@pytest.mark.parametrize("target", ["torchtitan", "megatron", "deepspeed"])
@pytest.mark.parametrize("schedule", ["zb-h1", "bidirectional"])
def test_schedules_an_engine_does_not_run_are_refused(target, schedule):
    plan = variant(plan_named("uneven-llama3-8b"), schedule=schedule)
    assert schedule not in targets.engine(target).schedules
    with pytest.raises(SpecError) as err:
        export(plan, target)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"export {target}: ")
    assert {"zb-h1": "ZB-H1", "bidirectional": "bidirectional"}[schedule] in msg
    assert f"--target {target}`" in msg or f"--target {target}  # " in msg  # (a shell comment)
