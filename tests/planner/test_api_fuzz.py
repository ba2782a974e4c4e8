"""Property tests of the public API (issue 15, item 8a): random models, clusters, batches and pins.

Every case ends in a Plan that passes its invariants, or in ``SpecError`` (bad input) or
``InfeasibleError`` (nothing fits); never another exception. The invariants (ranks partition the
cluster, each block in one stage with every edge running forward, memory within the device's usable
bytes, 0 < MFU <= 1, positive times, a schedule that runs every micro-batch once, pins and target
honoured, the same bytes on a second run) and the random inputs are those of benchmarks/fuzz.py,
which runs the same cases by the ten thousand and the `plan` command's as well.

Bounded for `make test`: small models (built on the meta device), a fixed number of examples and a
derandomized search, so that every run tests the same cases (about a minute here).

Each bug the fuzzing found has its minimal case as a test at the end of this file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import sys

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

import planner
from planner.files import check_output_folder
from planner.options import parse_fix

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_fuzz():
    spec = importlib.util.spec_from_file_location("planner_fuzz",
                                                  os.path.join(ROOT, "benchmarks", "fuzz.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()

SEEDS = st.integers(min_value=0, max_value=2 ** 32 - 1)
"""Each case is built from a seed by benchmarks/fuzz.py's generators (hypothesis' own randoms
would skew their choices towards the first of each list)."""
FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                phases=(Phase.explicit, Phase.generate),  # shrinking a seed says nothing
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])


# ---- helpers ------------------------------------------------------------------------------------

def _outcome(call, bad):
    """fuzz.api_outcome, asserting that the outcome is one the contract allows."""
    outcome, detail, plan = fuzz.api_outcome(call, bad)
    assert outcome != fuzz.UNEXPECTED, detail
    event(outcome)
    return outcome, plan


def _check(plan, *, cluster, prepared, fix, target, training: dict):
    d = json.loads(plan.to_json())
    planner.Plan.from_dict(d)  # the schema holds
    edges = [(e.src, e.dst) for e in prepared.blocks.edges] if prepared is not None else None
    violations = fuzz.plan_violations(d, cluster=cluster, edges=edges, fix=fix, target=target,
                                      training=training)
    assert not violations, violations
    assert d["search"]["time_s"] is None  # record_timing=False keeps times out of the file


class Pool(dict):
    """Prepared models by name; printed by name (hypothesis prints a failing case's arguments)."""

    def __repr__(self):
        return f"Pool({', '.join(self)})"


@pytest.fixture(scope="module")
def pool(tmp_path_factory, tiny_llama, tiny_gpt2, branched):
    """Prepared models of every shape the planner coarsens differently: the conftest's tiny Llama
    and GPT-2 (chains), examples/branched.py (a DAG), and one small model of each kind of
    benchmarks/data/fuzz/models.py and of T5 (encoder -> decoder) and Mixtral (experts)."""
    models = Pool({"tiny-llama": tiny_llama, "tiny-gpt2": tiny_gpt2, "branched": branched})
    folder = tmp_path_factory.mktemp("fuzz-models")
    for kind, dims in (("mlp", {"depth": 4, "width": 32}), ("towers", {"depth": 3}),
                       ("encoder", {"depth": 2, "width": 32, "heads": 2}), ("conv", {"depth": 2})):
        path = folder / f"{kind}.py"
        path.write_text(fuzz.fuzz_models().factory_source(kind, 16, dims))
        models[kind] = planner.prepare(f"{path}:build", cache_dir=None)
    for name, cfg in (("t5", {"model_type": "t5", "d_model": 32, "d_ff": 64, "d_kv": 8,
                              "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
                              "vocab_size": 128, "decoder_start_token_id": 0, "pad_token_id": 0}),
                      ("mixtral", {"model_type": "mixtral", "num_hidden_layers": 3,
                                   "hidden_size": 32, "intermediate_size": 64,
                                   "num_attention_heads": 4, "num_key_value_heads": 2,
                                   "vocab_size": 256, "max_position_embeddings": 64,
                                   "num_local_experts": 4, "num_experts_per_tok": 2})):
        path = folder / f"{name}.json"
        path.write_text(json.dumps(cfg))
        models[name] = planner.prepare(str(path), seq_len=32, cache_dir=None)
    return models


def _random_cluster(r):
    """A preset resized, a random YAML-form cluster, or heterogeneous groups (all valid)."""
    kind = fuzz.weighted(r, {"preset": 5, "mapping": 3, "hetero": 2})
    if kind == "preset":
        return planner.load_cluster(r.choice(fuzz.PRESETS), nodes=r.choice((1, 1, 2, 3, 4, 8, 32)),
                                    gpus_per_node=r.choice((None, None, 1, 2, 4, 8)))
    if kind == "mapping":
        return planner.load_cluster(fuzz.cluster_mapping(r))
    return planner.load_cluster(fuzz.hetero_mapping(r))


# ---- properties ---------------------------------------------------------------------------------

@settings(FUZZ, max_examples=300)
@given(seed=SEEDS,
       name=st.sampled_from(["tiny-llama", "tiny-gpt2", "branched", "mlp", "towers", "encoder",
                             "conv", "t5", "mixtral"]))
def test_prepared_models_on_random_clusters_batches_and_pins(pool, seed, name):
    """plan_prepared over random clusters, batches, dtypes, pins and targets: a valid plan (the
    same one twice) or SpecError / InfeasibleError."""
    r = random.Random(seed)
    prepared = pool[name]
    cluster = _random_cluster(r)
    fix, bad = fuzz.pins(r, invalid=0.1) if r.random() < 0.6 else ({}, [])
    target = r.choice(fuzz.TARGET_NAMES)
    dtype = r.choice(fuzz.DTYPES)
    if dtype != prepared.dtype and prepared.info.get("spec"):
        prepared = _in_dtype(name, prepared, dtype)
    training_kw = {"global_batch": fuzz.batch(r) if r.random() < 0.9 else r.randint(1, 8),
                   "dtype": prepared.dtype, "optimizer": r.choice(fuzz.OPTIMIZERS)}
    top_k = r.choice((0, 1, 3))
    note(f"model {name}, cluster {cluster}, fix {fix!r}, target {target}, {training_kw}, "
         f"top_k {top_k}")
    try:
        parsed = parse_fix(fix)
    except planner.SpecError:
        assert bad, f"valid pins {fix!r} refused"
        return

    def call():
        from planner.targets import restrict

        training = planner.TrainingSpec(seq_len=prepared.seq_len, **training_kw)
        options = restrict(planner.SearchOptions(fix=parsed, top_k=top_k), target)
        return planner.plan_prepared(prepared, cluster, training, options)

    outcome, plan = _outcome(call, bad)
    if plan is None:
        return
    _check(plan, cluster=cluster, prepared=prepared, fix=parsed, target=target,
           training={**training_kw, "seq_len": prepared.seq_len})
    assert call().to_json() == plan.to_json(), "a second run with the same inputs differs"


_DTYPED: dict = {}


def _in_dtype(name: str, prepared, dtype: str):
    """The pool model ``name`` traced in ``dtype`` (once per test session)."""
    if (name, dtype) not in _DTYPED:
        _DTYPED[name, dtype] = planner.prepare(prepared.info["spec"], seq_len=prepared.seq_len,
                                               dtype=dtype)
    return _DTYPED[name, dtype]


@settings(FUZZ, max_examples=30)
@given(seed=SEEDS)
def test_random_hugging_face_configs_plan_or_refuse(seed, tmp_path_factory):
    """planner.plan on a fresh random config.json (llama, qwen2, gpt2, bert, mixtral, opt, t5; a
    third with one bad value): a valid plan, or SpecError / InfeasibleError — a bad value is never
    planned."""
    r = random.Random(seed)
    cfg, seq_len, bad = fuzz.hf_config(r, invalid=0.35)
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(cfg))
    name = r.choice(fuzz.PRESETS)
    nodes = r.choice((1, 2, 4))
    fix, bad_fix = fuzz.pins(r, invalid=0.0)
    parsed = parse_fix(fix)
    kw = dict(cluster=name, nodes=nodes, global_batch=fuzz.batch(r), seq_len=seq_len,
              dtype=r.choice(fuzz.DTYPES), fix=fix, target=r.choice(fuzz.TARGET_NAMES))
    note(f"config {cfg}, {kw}, invalid: {bad}")
    outcome, plan = _outcome(lambda: planner.plan(str(path), cache_dir=None, **kw),
                             bad + bad_fix)
    if plan is not None:
        _check(plan, cluster=planner.load_cluster(name, nodes=nodes), prepared=None, fix=parsed,
               target=kw["target"], training={"global_batch": kw["global_batch"],
                                              "dtype": kw["dtype"], "seq_len": seq_len})


@settings(FUZZ, max_examples=12)
@given(seed=SEEDS)
def test_random_modules_plan_or_refuse(seed):
    """planner.plan on an nn.Module (built on the meta device) with its example inputs."""
    import torch

    r = random.Random(seed)
    kind, dims, seq_len = fuzz.module_dims(r)
    with torch.device("meta"):
        model, inputs = fuzz.fuzz_models().build(kind, seq_len=seq_len, **dims)
    cluster = fuzz.cluster_mapping(r)
    kw = dict(cluster=cluster, global_batch=fuzz.batch(r), dtype=r.choice(fuzz.DTYPES))
    note(f"{kind} {dims} seq {seq_len}, {kw}")
    outcome, plan = _outcome(lambda: planner.plan(model, example_inputs=inputs, **kw), [])
    if plan is not None:
        _check(plan, cluster=planner.load_cluster(cluster), prepared=None, fix={}, target="any",
               training={"global_batch": kw["global_batch"], "dtype": kw["dtype"]})


@settings(FUZZ, max_examples=80)
@given(seed=SEEDS)
def test_mutated_clusters_are_refused_or_planned(tiny_llama, tmp_path_factory, seed):
    """A random cluster with 1-3 damaged values (a key removed, a value of the wrong kind or out of
    range, an unknown key), as a mapping or a YAML file, possibly cut or garbled: SpecError, or a
    plan that passes the invariants on the cluster as loaded."""
    r = random.Random(seed)
    base = fuzz.cluster_mapping(r) if r.random() < 0.7 else fuzz.hetero_mapping(r)
    notes: list = []
    spec = fuzz.mutate(r, base, notes)
    if r.random() < 0.5:
        path = tmp_path_factory.mktemp("cluster") / "c.yaml"
        text = fuzz._yaml(spec)
        path.write_bytes(fuzz.mutate_text(r, text) if r.random() < 0.4 else text.encode())
        spec = str(path)
    note(f"cluster {spec!r} ({'; '.join(notes)})")
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_llama.seq_len)

    def call():
        return planner.plan_prepared(tiny_llama, planner.load_cluster(spec), training,
                                     planner.SearchOptions())

    outcome, detail, plan = fuzz.api_outcome(call, [])
    assert outcome != fuzz.UNEXPECTED, detail
    event(outcome)
    if plan is not None:
        _check(plan, cluster=planner.load_cluster(spec), prepared=tiny_llama, fix={},
               target="any", training={"global_batch": 64})


BAD_VALUES = {
    "nodes": (0, -1, 2.5, "4", True),
    "gpus_per_node": (0, -8, 1.5, "8"),
    "global_batch": (0, -1, 2.5, "64", True, None),
    "seq_len": (0, -8, "128", 1.5),
    "dtype": ("fp4", "BF16", ""),  # None: the default (bf16; fp32 for recommendation models)
    "optimizer": ("lamb", "Adam", None),
    "top_k": (-1, "3", 2.5),
    "target": ("nccl", "", "Megatron"),
    "fix": ("tpp=2", "tp=0", "pp=-1", "zero=4", "schedule=ring", "recompute=all",
            "sequence_parallel=maybe", {"dp": "two"}, "tp", 42),
    "cluster": ("dgx-a100", "", 42, ["dgx-h100"], "/nonexistent/cluster.yaml"),
    "calibration": ("/nonexistent/calib.json", {"schema": "other"}),
    "engine": ("attention=fast", "bogus=1", {"kernels": "slow"}),
    "time_limit_s": (0, -1.0),
}


@settings(FUZZ, max_examples=60)
@given(key=st.sampled_from(sorted(BAD_VALUES)), data=st.data())
def test_invalid_arguments_raise_spec_error(tiny_llama_config, key, data):
    """One invalid argument among valid ones: SpecError (never a plan, InfeasibleError or another
    exception), before any tracing."""
    value = data.draw(st.sampled_from(BAD_VALUES[key]), label=key)
    kw = dict(cluster="dgx-a100-80g", nodes=1, global_batch=64, seq_len=128)
    kw[key] = value
    with pytest.raises(planner.SpecError):
        planner.plan(tiny_llama_config, **kw)


# ---- minimal cases of the bugs the fuzzing found (each fixed) ----------------------------------

def test_fuzz_found_vpp_pin_is_honoured(tiny_llama):
    cluster = planner.load_cluster("dgx-a100-80g", nodes=1)
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_llama.seq_len)
    try:
        plan = planner.plan_prepared(tiny_llama, cluster, training,
                                     planner.SearchOptions(fix=parse_fix("vpp=2")))
    except planner.InfeasibleError:
        return  # refusing the pin is an honest answer too
    assert plan.parallel["vpp"] == 2 and plan.parallel["schedule"] == "interleaved-1f1b"


@pytest.mark.parametrize("size", [4.5, ""])
def test_fuzz_found_config_size_not_an_int_is_a_spec_error(tmp_path, size):
    cfg = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": size,
           "intermediate_size": 16, "num_attention_heads": 1, "num_key_value_heads": 1,
           "vocab_size": 16, "max_position_embeddings": 32}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(planner.SpecError):
        planner.plan(str(path), cluster="dgx-a100-80g", global_batch=8, cache_dir=None)


def test_fuzz_found_fractional_pin_is_a_spec_error():
    with pytest.raises(planner.SpecError):
        parse_fix({"dp": 1.5})


def test_fuzz_found_target_is_kept_on_device_groups(tiny_llama_config):
    cluster = {"name": "h", "inter_node": {"bandwidth_GBps": 1.25, "latency_us": 3},
               "groups": [{"name": "g0", "device": "l4", "nodes": 1, "gpus_per_node": 2,
                           "intra_node": {"bandwidth_GBps": 1.25, "latency_us": 0}},
                          {"name": "g1", "device": "rtx4090", "nodes": 2, "gpus_per_node": 1,
                           "intra_node": {"bandwidth_GBps": 50, "latency_us": 1}}]}
    plan = planner.plan(tiny_llama_config, cluster=cluster, global_batch=64, seq_len=128,
                        dtype="fp16", target="deepspeed")
    schedules = {plan.parallel["schedule"]} | {a["parallel"]["schedule"]
                                               for a in plan.search["alternatives"]}
    assert schedules <= {"1f1b"}, schedules


# ---- the same for bugs benchmarks/fuzz.py found through the `plan` command ----------------------

def _cli(*argv):
    import contextlib
    import io

    from planner.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, tiny_llama):
    cluster = planner.load_cluster("dgx-a100-80g", nodes=1)
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_llama.seq_len)
    plan = planner.plan_prepared(tiny_llama, cluster, training,
                                 planner.SearchOptions(fix=parse_fix("pp=2,schedule=1f1b")))
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    plan.save(str(path))
    return path


@pytest.mark.parametrize("command", ["show", "diff"])
def test_fuzz_found_plan_file_with_a_string_number_is_bad_input(plan_file, tmp_path, command):
    d = json.loads(plan_file.read_text())
    d["predicted"]["breakdown"]["optimizer_s"] = "5e-06"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    argv = ["show", str(bad)] if command == "show" else ["diff", str(plan_file), str(bad)]
    code, err = _cli(*argv, "-q")
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("plan: error: ") and "optimizer_s" in last, err


def test_fuzz_found_calibration_with_a_bad_table_is_a_spec_error(tiny_llama_config):
    calib = json.loads(open(fuzz.CALIBRATION).read())
    calib["device"]["gemm_table"]["fp32"][0] = 5.0
    with pytest.raises(planner.SpecError):
        planner.plan(tiny_llama_config, cluster="cpu", global_batch=8, seq_len=128, dtype="fp32",
                     calibration=calib)


def test_fuzz_found_whatif_with_an_unknown_cluster_is_bad_input(tiny_llama_config):
    code, err = _cli("whatif", tiny_llama_config, "--cluster", "h100", "--vary", "nodes=1,2",
                     "--global-batch", "8", "--seq-len", "128", "--workers", "1", "-q")
    assert code == 2, err


def test_fuzz_found_yaml_error_is_one_line(tmp_path, tiny_llama_config):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"name: x\ndevice: a100-80g\x12\nnodes: 1\n")
    with pytest.raises(planner.SpecError) as info:
        planner.plan(tiny_llama_config, cluster=str(path), global_batch=8, seq_len=128)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(not (os.path.isdir("/sys") and os.access("/sys", os.W_OK)),
                    reason="needs a folder that access() calls writable but that refuses new files "
                           "(/sys, as root)")
def test_fuzz_found_unwritable_output_is_bad_input(plan_file):
    code, err = _cli("export", str(plan_file), "--to", "megatron", "-o", "/sys/fuzz-export.sh")
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("plan: error: ") and "/sys/fuzz-export.sh" in last, err
    assert not [f for f in os.listdir("/sys") if f.startswith(".tmp")]


@pytest.mark.skipif(not (os.path.isdir("/sys/kernel") and os.access("/sys/kernel", os.W_OK)),
                    reason="needs a folder that access() calls writable but that refuses new files "
                           "(/sys, as root)")
@pytest.mark.parametrize("folder", ["/sys/kernel", "/sys/kernel/fuzz-dump"])
def test_fuzz_found_an_output_folder_that_refuses_files_is_bad_input(folder):
    """plan run --dump and plan export's folders: an existing one, and one to be made in it."""
    with pytest.raises(planner.SpecError, match=r"^--dump: .*refuses new files.*another folder"):
        check_output_folder(folder, "--dump")


@pytest.mark.parametrize("where", ["intra_node.bandwidth_GBps", "intra_node.latency_us",
                                   "device.memory_GB", "device.hbm_GBps"])
def test_fuzz_found_non_finite_cluster_numbers_are_spec_errors(tiny_llama, where):
    spec = {"name": "x", "nodes": 1, "gpus_per_node": 8,
            "device": {"name": "d", "memory_GB": 80, "peak_TFLOPs": {"bf16": 312, "fp32": 19.5},
                       "hbm_GBps": 2039},
            "intra_node": {"bandwidth_GBps": 300, "latency_us": 3},
            "inter_node": {"bandwidth_GBps": 25, "latency_us": 10}}
    section, key = where.split(".")
    spec[section][key] = float("nan") if key == "latency_us" else float("inf")
    training = planner.TrainingSpec(global_batch=64, seq_len=tiny_llama.seq_len)
    try:
        planner.plan_prepared(tiny_llama, planner.load_cluster(spec), training,
                              planner.SearchOptions())
    except planner.SpecError:
        return
    except Exception as exc:  # noqa: BLE001 - what the bug raises today
        raise AssertionError(f"{type(exc).__name__}: {exc}") from None
    raise AssertionError(f"{where} = {spec[section][key]} planned")


def test_fuzz_found_huge_node_count_is_refused_before_any_search():
    """10^18 nodes once sent the search into a loop over their divisors: the cluster is refused
    where it is read, above costmodels.topology.MAX_GPUS GPUs, and accepted up to it."""
    from costmodels.topology import MAX_GPUS

    with pytest.raises(planner.SpecError, match=r"^nodes: 8,000,000,000,000,000,000 GPUs in all; "
                                                r"the planner takes at most 1,048,576"):
        planner.load_cluster("dgx-a100-80g", nodes=10 ** 18)
    with pytest.raises(planner.SpecError, match="^nodes: "):
        planner.load_cluster("dgx-a100-80g", nodes=MAX_GPUS // 8 + 1)
    assert planner.load_cluster("dgx-a100-80g", nodes=MAX_GPUS // 8).num_gpus == MAX_GPUS


def test_fuzz_found_runners_up_without_the_best_plans_parts():
    """The best plan exchanges K/V (cp = 2) and its runners-up do not: explaining why they lost
    compared a part only the best one has (KeyError 'cp_comm_s'; case 6495 of the 10k run, on
    dgx1-v100, where attention is now priced without FlashAttention: l4-8 has the same shape)."""
    plan = planner.plan("llama3-8b", cluster="l4-8", global_batch=44, dtype="fp32",
                        optimizer="sgd", fix="cp_comm=allgather,recompute=none", top_k=3)
    assert plan.parallel["cp"] == 2  # the case: the runners-up lack the best plan's cp_comm_s
    cps = [a["parallel"]["cp"] for a in plan.search["alternatives"]]
    assert cps and set(cps) == {1}  # (as many as fit in the L4s' 24 GB)
    assert all(re.match(r"^\+\d+\.\d% step time: ", a["why"])
               for a in plan.search["alternatives"])
