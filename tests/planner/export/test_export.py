"""Exports to torchtitan, Megatron-LM and DeepSpeed: golden files, parsing, mappings, errors.

Golden files: tests/golden/plans/ holds two plan fixtures made once with the real planner (they are
loaded, never re-planned, so cost-model changes cannot break them):

- even-llama3-70b.json: ``plan solve llama3-70b --cluster dgx-h100 --nodes 8 --global-batch 128
  --seq-len 4096 --fix tp=8,pp=4,schedule=gpipe,recompute=full`` (20 layers on each of 4 stages);
- uneven-llama3-8b.json: ``plan solve llama3-8b --cluster dgx-h100 --nodes 2 --global-batch 64
  --seq-len 4096 --fix tp=2,pp=4,recompute=selective`` (8, 9, 9, 6 layers).

tests/golden/exports/<plan>.<target suffix> holds the expected export of each, for the engine
release planner.targets names (the default of --engine-version). After a deliberate change to an
exporter, regenerate them (no environment variables involved) with

    .venv/bin/python tests/planner/export/test_export.py

and review the diff of tests/golden/exports before committing it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
from unittest import mock

import pytest

from costmodels.engine import engine_from_mapping
from planner import plan as plan_model, targets
from planner.cli.main import main
from planner.errors import InfeasibleError, SpecError
from planner.export import (RECSYS_TARGETS, SUPPORTED_VERSIONS, TARGETS, export, names,
                            to_deepspeed, to_megatron, to_torchtitan)
from planner.export.common import ACCOUNTED, Ledger, layout
from planner.export.replan import resolve_hint
from planner.planfile.document import Plan, load_plan

DENSE_TARGETS = {t: v for t, v in TARGETS.items() if t not in RECSYS_TARGETS}
"""The engines dense plans export to (recommendation plans go to torchrec: test_torchrec_export)."""

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "golden")
PLANS = ("even-llama3-70b", "uneven-llama3-8b")
LAYER = re.compile(r"model\.layers\.\d+")


@functools.lru_cache(maxsize=None)
def plan_of(stem: str) -> Plan:
    """A fixture plan (cached: tests derive variants with dataclasses.replace, never mutate)."""
    return load_plan(os.path.join(GOLDEN, "plans", f"{stem}.json"))


def golden_path(stem: str, target: str) -> str:
    return os.path.join(GOLDEN, "exports", f"{stem}.{TARGETS[target][1]}")


def golden_export(plan: Plan, target: str) -> tuple[str, str]:
    """The export with the memory re-check's figures left out: they follow the cost model, which
    changes more often than the exporters (test_engines.py checks the re-check itself); and as
    with a cost model that prices torchtitan's per-op recomputation, whether this one does or not.
    """
    from planner.export import reprice, torchtitan  # noqa: PLC0415
    with mock.patch.object(reprice, "recheck", lambda plan, target, change, **kw:
                           f"memory re-checked with {change} (figures not in golden files)"), \
            mock.patch.object(torchtitan, "RECOMPUTE", tuple(torchtitan.RECOMPUTE) + ("op",)):
        return export(plan, target)


def regenerate() -> None:
    """Rewrite every golden export from the plan fixtures."""
    for stem in PLANS:
        plan = plan_of(stem)
        for target in DENSE_TARGETS:
            with open(golden_path(stem, target), "w", encoding="utf-8", newline="") as f:
                f.write(golden_export(plan, target)[0])


def variant(plan: Plan, **parallel) -> Plan:
    return dataclasses.replace(plan, parallel={**plan.parallel, **parallel})


def regroup(plan: Plan, counts: list[int], **parallel) -> Plan:
    """The same model cut into len(counts) stages holding counts[i] layers (embedding side on the
    first stage, head side on the last)."""
    groups: list[list[dict]] = [[] for _ in counts]
    stage = held = 0
    for block in plan.model["blocks"]:
        if LAYER.fullmatch(block["name"]):
            while held >= counts[stage]:
                stage, held = stage + 1, 0
            held += 1
        elif held or stage:
            stage = len(counts) - 1
        groups[stage].append(block)
    stages = [{"index": i, "blocks": [b["name"] for b in g], "ranks": [], "predicted": {},
               "modules": [m for b in g for m in b["modules"]]} for i, g in enumerate(groups)]
    return dataclasses.replace(variant(plan, **{"pp": len(counts), **parallel}), stages=stages)


class Notes(logging.Handler):
    """Collects the export warnings (pytest runs with -p no:logging, so no caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def notes():
    handler = Notes()
    log = logging.getLogger("planner.export")
    log.addHandler(handler)
    yield handler.messages
    log.removeHandler(handler)


# ---- golden files -------------------------------------------------------------------------------

@pytest.mark.parametrize("target", sorted(DENSE_TARGETS))
@pytest.mark.parametrize("stem", PLANS)
def test_export_matches_golden_file_byte_for_byte(stem, target):
    text, name = golden_export(plan_of(stem), target)
    with open(golden_path(stem, target), encoding="utf-8", newline="") as f:
        assert text == f.read(), \
            f"regenerate with: python tests/planner/export/test_export.py ({stem})"
    assert name == f"{plan_of(stem).model['name']}.{TARGETS[target][1]}"


def test_fixtures_are_one_even_and_one_uneven_plan():
    assert layout(plan_of("even-llama3-70b")).counts == [20, 20, 20, 20]
    uneven = layout(plan_of("uneven-llama3-8b")).counts
    assert uneven == [8, 9, 9, 6] and sum(uneven) == 32


@pytest.mark.parametrize("stem", PLANS)
def test_every_output_begins_with_the_source_plan(stem):
    plan = plan_of(stem)
    ids = (plan.model["name"], plan.model["fingerprint"], plan.provenance["input_hash"])
    for target in DENSE_TARGETS:
        text = export(plan, target)[0]
        head = text.splitlines()[1] if target != "deepspeed" else \
            json.loads(text)["planner"]["header"][1]
        assert all(i in head for i in ids), (target, head)
        assert not re.search(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d", text)  # no timestamps


# ---- every output parses, and says what the plan says --------------------------------------------

@pytest.mark.parametrize("stem", PLANS)
def test_torchtitan_toml_parses_to_the_plan(stem):
    tomllib = pytest.importorskip("tomllib")
    plan = plan_of(stem)
    p = plan.parallel
    cfg = tomllib.loads(to_torchtitan(plan))
    par, train = cfg["parallelism"], cfg["training"]
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == p["dp"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (p["tp"], p["pp"])
    titan = par["module_fqns_per_model_part"]
    assert titan == names.torchtitan_names(plan, "0.2.2")
    assert [len(part) for part in titan] == [
        len([m for m in st["modules"] if m != "model.rotary_emb"]) for st in plan.stages]
    assert titan[0][0] == "tok_embeddings" and titan[-1][-2:] == ["norm", "output"]
    assert not any(m.startswith("model.") or m == "lm_head" for part in titan for m in part)
    assert (cfg["model"]["name"], cfg["model"]["flavor"]) == (
        "llama3", plan.model["name"][7:].upper())
    local = train["local_batch_size"]
    assert local // par["pipeline_parallel_microbatch_size"] == p["num_microbatches"]
    assert local * p["dp"] == train["global_batch_size"] == plan.training["global_batch"]
    assert cfg["activation_checkpoint"]["mode"] == p["recompute"]


def bash_args(text: str, array: str = "MEGATRON_PARALLEL_ARGS") -> list[str]:
    tokens = shlex.split(text, comments=True)
    assert tokens[-1] == ")"
    return tokens[tokens.index(f"{array}=(") + 1:-1]


def megatron_args(text: str) -> list[str]:
    return bash_args(text)


def option(args: list[str], name: str):
    return args[args.index(name) + 1] if name in args else None


def megatron_stage_layers(args: list[str]) -> list[int]:
    """Layers per stage as Megatron-LM would build them from these arguments."""
    n, pp = int(option(args, "--num-layers")), int(option(args, "--pipeline-model-parallel-size"))
    text = option(args, "--pipeline-model-parallel-layout")
    if text:
        text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        return [part.count("t") for part in text.split("|")]
    first, last = option(args, "--decoder-first-pipeline-num-layers"), \
        option(args, "--decoder-last-pipeline-num-layers")
    edges = [int(x) for x in (first, last) if x is not None]
    middle = (n - sum(edges)) // (pp - len(edges))
    return ([int(first)] if first else []) + [middle] * (pp - len(edges)) + \
        ([int(last)] if last else [])


@pytest.mark.parametrize("stem", PLANS)
def test_megatron_args_parse_to_the_plan(stem):
    plan = plan_of(stem)
    p = plan.parallel
    args = megatron_args(to_megatron(plan))
    assert option(args, "--tensor-model-parallel-size") == str(p["tp"])
    assert option(args, "--micro-batch-size") == str(p["micro_batch"])
    assert option(args, "--global-batch-size") == str(plan.training["global_batch"])
    assert ("--sequence-parallel" in args) == p["sequence_parallel"]
    assert megatron_stage_layers(args) == layout(plan).counts


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_megatron_file_sources_in_bash_to_the_same_arguments(tmp_path):
    text = to_megatron(regroup(plan_of("uneven-llama3-8b"), [10, 6, 9, 7]))
    path = tmp_path / "args.sh"
    path.write_text(text)
    out = subprocess.run(["bash", "-c", f'source {shlex.quote(str(path))} && '
                          'printf "%s\\n" "${MEGATRON_PARALLEL_ARGS[@]}"'],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == megatron_args(text)
    assert "Et*10|t*6|t*9|t*7L" in out.splitlines()


@pytest.mark.parametrize("stem", PLANS)
def test_deepspeed_json_parses_to_the_plan(stem):
    plan = plan_of(stem)
    p = plan.parallel
    cfg = json.loads(to_deepspeed(plan))
    assert cfg["train_batch_size"] == (cfg["train_micro_batch_size_per_gpu"]
                                       * cfg["gradient_accumulation_steps"] * p["dp"])
    pipe = cfg["planner"]["pipeline"]
    parts, names = pipe["parts"], pipe["layers"]
    assert [names[a:b] for a, b in zip(parts, parts[1:])] == [st["blocks"] for st in plan.stages]
    assert pipe["topology"]["dims"][0] * pipe["topology"]["dims"][1] * \
        pipe["topology"]["dims"][2] == plan.cluster["num_gpus"]
    assert cfg["bf16"]["enabled"] == (plan.training["dtype"] == "bf16")


# ---- mapping decisions --------------------------------------------------------------------------

def titan_settings(text: str, version: str) -> dict:
    """{"section.key": value} of a torchtitan export, from its TOML (0.2.2) or its arguments."""
    if version == "0.2.2":
        tomllib = pytest.importorskip("tomllib")
        return {f"{sec}.{k}": v for sec, kv in tomllib.loads(text).items() for k, v in kv.items()}
    out, args, i = {}, bash_args(text, "TORCHTITAN_ARGS"), 0
    while i < len(args):
        flag, i = args[i], i + 1
        if not (flag.startswith("--") and "." in flag):
            continue
        values = []
        while i < len(args) and not args[i].startswith(("--", "activation-checkpoint:")):
            values, i = values + [args[i]], i + 1
        sec, key = flag[2:].split(".", 1)
        off = key.startswith("no-")
        key = f"{sec}.{key.removeprefix('no-').replace('-', '_')}"
        out[key] = (not off if not values else int(values[0]) if values[0].isdigit() else
                    values[0] if len(values) == 1 and "," not in values[0] else
                    [v.split(",") for v in values])
    return out


@pytest.mark.parametrize("version,zero,replicate,shard,reshard", [
    ("0.2.2", 0, 1, 2, "never"), ("0.3.0", 0, 2, 1, None),
    ("0.2.2", 1, 1, 2, "never"), ("0.2.2", 2, 1, 2, "never"), ("0.3.0", 3, 1, 2, "always")])
def test_torchtitan_maps_zero_to_replicate_or_shard(version, zero, replicate, shard, reshard,
                                                     notes):
    """ZeRO-0 with tp/pp: torchtitan 0.2.2 applies DDP only to 1-D meshes, 0.3.0 replicates."""
    text = to_torchtitan(variant(plan_of("uneven-llama3-8b"), zero=zero), version)
    par = titan_settings(text, version)
    assert (par["parallelism.data_parallel_replicate_degree"],
            par["parallelism.data_parallel_shard_degree"]) == (replicate, shard)
    assert par.get("parallelism.fsdp_reshard_after_forward") == reshard
    assert any("ZeRO-1" in n for n in notes) == (zero == 1)
    assert any("DDP only without tensor or pipeline" in n for n in notes) == \
        (zero == 0 and version == "0.2.2")


@pytest.mark.parametrize("zero,flags", [
    (0, []), (1, ["--use-distributed-optimizer"]),
    (3, ["--use-megatron-fsdp", "--use-distributed-optimizer"])])
def test_megatron_maps_zero(zero, flags):
    # (Megatron-FSDP, ZeRO-2/3, runs without a pipeline: a pp=1 plan)
    args = megatron_args(to_megatron(variant(data_plan("llama3-8b-cp4-megatron"), zero=zero)))
    assert all(f in args for f in flags) and ("--use-distributed-optimizer" in args) == (zero > 0)
    if zero == 3:
        assert option(args, "--data-parallel-sharding-strategy") == "optim_grads_params"
    # the overlap the plan was priced with (Megatron-LM leaves it off by default)
    assert ("--overlap-grad-reduce" in args, "--overlap-param-gather" in args) == (True, zero > 0)


def test_the_tensor_parallel_overlap_is_written_where_the_engine_runs_it(notes):
    """EngineSpec.tp_overlap: Megatron-LM's --tp-comm-overlap (its arguments require sequence
    parallelism, which the planner prices it with); torchtitan and DeepSpeed list it as not
    expressed."""
    megatron = data_plan("llama3-70b-pp4-megatron")  # tp 4 with sequence parallelism
    for version in ("core_v0.14.0", "core_v0.19.0"):
        assert "--tp-comm-overlap" in megatron_args(to_megatron(
            engine_settings(megatron, tp_overlap=True), version))
    assert "--tp-comm-overlap" not in megatron_args(to_megatron(megatron))
    unsplit = engine_settings(variant(megatron, sequence_parallel=False), tp_overlap=True)
    assert "--tp-comm-overlap" not in megatron_args(to_megatron(unsplit))  # (not priced)
    titan = engine_settings(data_plan("llama3-70b-pp4-torchtitan"), tp_overlap=True)
    notes.clear()
    export(titan, "torchtitan")
    assert any("tp_overlap: torchtitan" in n and "async tensor parallelism" in n
               for n in notes), notes
    deepspeed = engine_settings(variant(data_plan("llama3-70b-pp4-deepspeed"),
                                        sequence_parallel=True), tp_overlap=True)
    notes.clear()
    export(deepspeed, "deepspeed")
    assert any("tp_overlap: DeepSpeed's AutoTP" in n for n in notes), notes


def test_tp_overlap_is_refused_where_the_target_does_not_run_it_and_kept_in_re_plans():
    """A review: --engine tp_overlap=true --target torchtitan was accepted for a dense model (the
    MoE checks alone ran), and the re-plan an export suggests dropped the setting."""
    from planner.export.replan import _kept_engine_settings
    from planner.targets import check_overlap
    from costmodels.engine import engine_from_mapping

    for target in ("torchtitan", "deepspeed", "torch"):
        with pytest.raises(SpecError, match=r"^engine\.tp_overlap: .* does not pipeline"):
            check_overlap(engine_from_mapping("tp_overlap=true"), target)
    check_overlap(engine_from_mapping("tp_overlap=true"), "megatron")
    plan = engine_settings(data_plan("llama3-70b-pp4-megatron"), tp_overlap=True)
    assert "tp_overlap=true" in _kept_engine_settings(plan, "megatron")[0]
    kept, dropped = _kept_engine_settings(plan, "torchtitan")
    assert "tp_overlap=true" not in kept and "tp_overlap=true" in dropped


def test_megatron_writes_no_overlap_for_a_plan_priced_without_it(notes):
    serial = engine_settings(variant(data_plan("llama3-8b-cp4-megatron"), zero=1),
                             overlap_grad_reduce=False)
    args = megatron_args(to_megatron(serial))
    assert "--overlap-grad-reduce" not in args and "--overlap-param-gather" not in args
    assert not any("Megatron-FSDP always overlaps" in n for n in notes)
    for zero in (2, 3):  # Megatron-FSDP overlaps whatever it is told (core_v0.14.0 asserts the
        notes.clear()    # flag with ZeRO-2): written, and noted
        for version in ("core_v0.14.0", "core_v0.19.0"):
            fsdp = megatron_args(to_megatron(variant(serial, zero=zero), version))
            assert "--overlap-grad-reduce" in fsdp and "--use-megatron-fsdp" in fsdp
        assert any("Megatron-FSDP always overlaps" in n and "faster step than planned" in n
                   for n in notes)


def test_megatron_refuses_what_its_releases_refuse_of_the_states(notes):
    """Megatron-FSDP lays the world out as data x expert x tensor parallel ranks (no pipeline):
    ZeRO-3 beside a pipeline exports as the nearest, ZeRO-1, its memory re-checked;
    core_v0.14.0 has no expert groups in it and refuses expert parallelism in fp16; offloading
    the optimizer takes its precision-aware optimizer, adam only."""
    text = to_megatron(variant(plan_of("uneven-llama3-8b"), zero=3))  # tp=2, pp=4
    args = megatron_args(text)
    assert "--use-distributed-optimizer" in args and "--use-megatron-fsdp" not in args
    # the rest of the file is written for the stage exported (a review found FSDP's environment)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text and "Megatron-FSDP:" not in text
    # core_v0.14.0's Megatron-FSDP has no expert groups, but beside a pipeline ZeRO-1 runs
    # instead: re-checked (here it does not fit), not refused for the groups
    moe_pp = data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan")
    assert moe_pp.parallel["zero"] == 2 and moe_pp.parallel["pp"] > 1
    with pytest.raises(InfeasibleError, match=r"^no megatron export fits: "
                                              r"with ZeRO-1 instead of the "
                                              r"plan's ZeRO-2 "):
        to_megatron(moe_pp, "core_v0.14.0")
    assert any("ZeRO-3 with pp=4: Megatron-LM runs it as Megatron-FSDP" in n and
               "nearest ZeRO-1" in n for n in notes)
    assert any("memory re-checked with ZeRO-1 instead of the plan's ZeRO-3" in n
               for n in notes)
    serial = engine_settings(variant(plan_of("uneven-llama3-8b"), zero=2),
                             overlap_grad_reduce=False)
    notes.clear()
    assert "--overlap-grad-reduce" not in megatron_args(to_megatron(serial))
    assert not any("Megatron-FSDP always overlaps" in n for n in notes)
    moe = data_plan("qwen3-30b-a3b-ep8-capacity-megatron")  # zero=3, ep=8, pp=1
    to_megatron(moe, "core_v0.19.0")
    with pytest.raises(SpecError, match=r"^export megatron: ZeRO-3 with expert parallelism "
                                        r"\(ep=8\) runs Megatron-FSDP, which has no expert groups "
                                        r"in core_v0\.14\.0"):
        to_megatron(moe, "core_v0.14.0")
    half = dataclasses.replace(variant(moe, zero=1), training={**moe.training, "dtype": "fp16"})
    to_megatron(half, "core_v0.19.0")
    with pytest.raises(SpecError, match=r"^export megatron: expert parallelism \(ep=8\) in fp16, "
                                        r"which core_v0\.14\.0's validate_args refuses"):
        to_megatron(half, "core_v0.14.0")
    sgd = dataclasses.replace(variant(moe, zero=1, offload_optimizer=True),
                              training={**moe.training, "optimizer": "sgd"})
    with pytest.raises(SpecError, match=r"^export megatron: optimizer offload runs Megatron's "
                                        r"precision-aware optimizer, which takes adam only"):
        to_megatron(sgd)


@pytest.mark.parametrize("zero,flag", [(1, "--use-distributed-optimizer"),
                                       (3, "--use-megatron-fsdp")])
def test_megatron_shards_states_over_context_parallel_ranks_without_data_parallelism(zero, flag):
    """Megatron's distributed optimizer and FSDP shard over the data-and-context group: with
    dp = 1 and cp > 1 the plan's sharding still runs (it was dropped)."""
    plan = variant(data_plan("llama3-8b-cp4-megatron"), dp=1, zero=zero)
    assert flag in megatron_args(to_megatron(plan))
    alone = variant(plan, cp=1, zero=1, offload_optimizer=True)  # one rank: offload needs it
    assert "--use-distributed-optimizer" in megatron_args(to_megatron(alone))


@pytest.mark.parametrize("counts,expect", [
    ([11, 7, 7, 7], ["--decoder-first-pipeline-num-layers", "11"]),
    ([7, 7, 7, 11], ["--decoder-last-pipeline-num-layers", "11"]),
    ([10, 6, 9, 7], ["--pipeline-model-parallel-layout", "Et*10|t*6|t*9|t*7L"]),
    ([12, 10, 10, 0], ["--pipeline-model-parallel-layout", "Et*12|t*10|t*10|L"]),
    ([8, 8, 8, 8], [])])
def test_megatron_describes_each_stage_split(counts, expect):
    args = megatron_args(to_megatron(regroup(plan_of("uneven-llama3-8b"), counts)))
    assert " ".join(expect) in " ".join(args)
    assert megatron_stage_layers(args) == counts


def test_virtual_stages_map_to_interleaved_schedules(notes):
    tomllib = pytest.importorskip("tomllib")
    base = plan_of("uneven-llama3-8b")
    even = regroup(base, [4] * 8, pp=4, vpp=2, schedule="interleaved-1f1b")
    par = tomllib.loads(to_torchtitan(even))["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert len(par["module_fqns_per_model_part"]) == 8
    assert option(megatron_args(to_megatron(even)), "--num-virtual-stages-per-pipeline-rank") == "2"
    uneven = regroup(base, [3, 4, 4, 5, 4, 4, 4, 4], pp=4, vpp=2, schedule="interleaved-1f1b")
    assert option(megatron_args(to_megatron(uneven)), "--pipeline-model-parallel-layout") == \
        "Et*3|t*4|t*4|t*5|t*4|t*4|t*4|t*4L"
    with pytest.raises(SpecError, match="does not run the interleaved 1F1B schedule") as err:
        to_deepspeed(uneven)
    assert "--target deepspeed" in str(err.value) and "\n" not in str(err.value)


def test_approximations_are_commented_and_logged(notes):
    plan = variant(plan_of("uneven-llama3-8b"), schedule="gpipe", sequence_parallel=False,
                   placement="tp-pp-dp")
    mega = to_megatron(plan)
    assert "schedule GPipe: Megatron-LM runs 1F1B" in mega
    assert "--use-tp-pp-dp-mapping" in megatron_args(mega)
    titan = to_torchtitan(plan)
    assert "# - sequence parallelism is off" in titan and "# - placement tp-pp-dp" in titan
    ds = json.loads(to_deepspeed(plan))
    assert ds["planner"]["pipeline"]["topology"]["axes"] == ["data", "pipe", "model"]
    assert any(n.startswith("schedule GPipe: DeepSpeed") for n in ds["planner"]["not_expressed"])
    assert {n.split(" ")[1] for n in notes} >= {"megatron", "torchtitan", "deepspeed"}
    for text in (mega, titan, json.dumps(ds)):
        assert "Every knob of the plan is expressed exactly" not in text


def test_precision_maps_per_target(notes):
    tomllib = pytest.importorskip("tomllib")
    plan = variant(plan_of("uneven-llama3-8b"), zero=0)
    plan = dataclasses.replace(plan, training={**plan.training, "dtype": "fp16"})
    assert tomllib.loads(to_torchtitan(plan))["training"]["mixed_precision_param"] == "bfloat16"
    assert any("dtype fp16" in n for n in notes)
    assert "--fp16" in megatron_args(to_megatron(plan))
    ds = json.loads(to_deepspeed(plan))
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0} and ds["bf16"] == {"enabled": False}


def test_single_stage_plan_has_no_pipeline_settings():
    tomllib = pytest.importorskip("tomllib")
    plan = regroup(plan_of("uneven-llama3-8b"), [32], dp=8)
    par = tomllib.loads(to_torchtitan(plan))["parallelism"]
    assert par["pipeline_parallel_degree"] == 1 and "module_fqns_per_model_part" not in par
    args = megatron_args(to_megatron(plan))
    assert not any("layout" in a or "decoder-first" in a for a in args)
    ds = json.loads(to_deepspeed(plan))
    assert "pipeline" not in ds["planner"] and ds["tensor_parallel"] == {"autotp_size": 2}
    assert ds["zero_optimization"]["stage"] == 1
    # AutoTP: DeepSpeed counts the tensor-parallel GPUs in its batch check, so it derives the size
    assert "train_batch_size" not in ds and ds["planner"]["batch"]["global_batch"] == 64


def test_deepspeed_keeps_zero_3_with_autotp():
    """DeepSpeed 0.19.8 trains AutoTP with ZeRO-3 (runtime/engine.py, _configure_tensor_parallel_
    states); only its pipeline engine is limited to ZeRO 0-1."""
    plan = regroup(plan_of("uneven-llama3-8b"), [32], dp=8, zero=3)
    assert json.loads(to_deepspeed(plan))["zero_optimization"]["stage"] == 3


def test_deepspeed_pipeline_falls_back_to_zero_1_after_a_memory_recheck(notes):
    ds = json.loads(to_deepspeed(variant(plan_of("uneven-llama3-8b"), zero=3)))
    assert ds["zero_optimization"]["stage"] == 1
    assert any("ZeRO-3 with pp=4" in n for n in notes)
    recheck = [n for n in ds["planner"]["not_expressed"] if n.startswith("memory re-checked")]
    assert len(recheck) == 1 and "ZeRO-1 instead of the plan's ZeRO-3" in recheck[0]
    assert re.search(r"a peak of \d+\.\d GB per GPU .* within the 80\.2 GB usable", recheck[0])
    # the plan's states are Megatron-Core's; the re-check says it priced DeepSpeed's instead
    planned = engine_from_mapping(plan_of("uneven-llama3-8b").training.get("engine")).state_layout
    assert planned == "megatron" and "model states as ZeRO lays them out" in recheck[0]


# ---- plans a target cannot express --------------------------------------------------------------

def without_stack(plan: Plan, repeats: list[dict]) -> Plan:
    return dataclasses.replace(plan, model={**plan.model,
                                            "trace": {**plan.model["trace"], "repeats": repeats}})


@pytest.mark.parametrize("repeats,message", [
    ([], "has no repeated layer list"),
    ([{"fqn": "model.layers", "count": 32}, {"fqn": "model.extra", "count": 2}],
     "has 2 layer lists"),
    ([{"fqn": "model.layers", "count": 40}], "says 40, in order; re-create the plan")])
def test_megatron_refuses_a_model_that_is_not_one_layer_stack(repeats, message):
    with pytest.raises(SpecError, match=message) as err:
        to_megatron(without_stack(plan_of("uneven-llama3-8b"), repeats))
    assert "\n" not in str(err.value) and str(err.value).startswith("export megatron: ")


def test_megatron_refuses_an_image_model():
    """A new-user check saw a ViT's plan written as pretrain_gpt.py arguments (--seq-length 197)
    while T5's was refused; core_v0.19.0 ships no vision script."""
    plan = plan_of("uneven-llama3-8b")
    vit = dataclasses.replace(plan, model={**plan.model, "name": "vit-304M", "image_tokens": True})
    with pytest.raises(SpecError, match=r"^export megatron: vit-304M is an image model; .*"
                                        r"export to torchtitan or deepspeed instead$"):
        to_megatron(vit)


def test_megatron_refuses_a_block_between_layers():
    plan = plan_of("uneven-llama3-8b")
    blocks = [dict(b, modules=["model.adapter"]) if b["name"] == "model.layers.12" else b
              for b in plan.model["blocks"]]
    with pytest.raises(SpecError, match="block 'model.layers.12' sits between"):
        to_megatron(dataclasses.replace(plan, model={**plan.model, "blocks": blocks}))


def test_other_targets_export_a_model_without_layer_stack_with_a_warning(notes):
    plan = without_stack(plan_of("uneven-llama3-8b"), [])
    assert "no repeated layer list" in to_torchtitan(plan)
    assert any("no repeated layer list" in n for n in json.loads(to_deepspeed(plan))["planner"]
               ["not_expressed"])


def test_unknown_target_and_virtual_stage_mismatch_are_one_line_errors():
    with pytest.raises(SpecError, match="unknown target 'nemo'; choose torchtitan"):
        export(plan_of("even-llama3-70b"), "nemo")
    with pytest.raises(SpecError, match="4 stages for pp=4 x vpp=2"):
        to_torchtitan(variant(plan_of("even-llama3-70b"), vpp=2, schedule="interleaved-1f1b"))


# ---- releases and the account of every knob -----------------------------------------------------

def test_the_default_release_is_planner_targets_and_every_file_names_its_release():
    plan = plan_of("uneven-llama3-8b")
    for target, versions in SUPPORTED_VERSIONS.items():
        assert targets.engine(target).version in versions
        for version in versions:
            text = export(plan, target, version)[0]
            assert f"Written for {target} {version} (" in text
        assert export(plan, target)[0] == export(plan, target, targets.engine(target).version)[0]
    assert export(plan, "megatron", "0.19.0")[0] == export(plan, "megatron", "core_v0.19.0")[0]
    assert export(plan, "torchtitan", "0.3.0")[1] == "llama3-8b.torchtitan.sh"


def test_an_unknown_release_is_a_one_line_error(capsys):
    with pytest.raises(SpecError, match=r"--engine-version: planner writes torchtitan 0\.2\.2 or "
                                        r"0\.3\.0, not '0\.9'"):
        export(plan_of("uneven-llama3-8b"), "torchtitan", "0.9")
    plan = os.path.join(GOLDEN, "plans", "uneven-llama3-8b.json")
    assert main(["export", plan, "--to", "deepspeed", "--engine-version", "0.18.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "deepspeed 0.19.8, not '0.18.0'" in err


KNOB_VARIANTS = [
    {}, {"zero": 0}, {"zero": 2}, {"zero": 3}, {"zero": 2, "offload_optimizer": True},
    {"sequence_parallel": False}, {"recompute": "none"}, {"recompute": "full"},
    {"schedule": "gpipe"}, {"placement": "tp-pp-dp"}, {"micro_batch": 2, "num_microbatches": 16},
]


@pytest.mark.parametrize("changes", KNOB_VARIANTS, ids=lambda c: ",".join(
    f"{k}={v}" for k, v in c.items()) or "plan")
def test_every_knob_is_expressed_or_listed_in_the_file_and_on_stderr(changes, notes, monkeypatch):
    """Ledger.close asserts that each exporter accounted for every knob (ACCOUNTED); each note it
    lists is in the file and is one warning. The memory re-check is stubbed here (tested in
    test_engines.py), so that no variant traces the model."""
    from planner.export import reprice  # noqa: PLC0415
    monkeypatch.setattr(reprice, "recheck",
                        lambda plan, target, change, **kw: f"re-checked {change}")
    plan = variant(plan_of("uneven-llama3-8b"), **changes)
    for target, versions in SUPPORTED_VERSIONS.items():
        for version in versions:
            notes.clear()
            try:
                text = export(plan, target, version)[0]
            except SpecError as err:  # (Megatron-FSDP with this plan's pipeline)
                assert "\n" not in str(err) and str(err).startswith(f"export {target}: ")
                assert target == "megatron" and changes.get("zero", 0) >= 2, err
                continue
            assert all(n.startswith(f"export {target} {version}: ") for n in notes)
            body = " ".join(re.sub(r"^ *# ?(- )?", "", line) for line in text.splitlines())
            body = " ".join(body.split())
            for note in notes:
                assert " ".join(note.split(": ", 1)[1].split()) in body, (target, note)
            assert ("Every knob of the plan is expressed exactly" in text) == (not notes)


ENGINE_PLANS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "plans")


@functools.lru_cache(maxsize=None)
def data_plan(stem: str) -> Plan:
    """A plan of tests/planner/export/data/plans (made as test_engines.py's docstring says)."""
    return load_plan(os.path.join(ENGINE_PLANS, f"{stem}.json"))


def engine_settings(plan: Plan, **settings) -> Plan:
    engine = {**plan.training.get("engine", {}), **settings}
    return dataclasses.replace(plan, training={**plan.training, "engine": engine})


MOE_CP_VARIANTS = {
    "mixtral-ep8": lambda: data_plan("mixtral-8x7b-ep8-megatron"),
    "mixtral-ep8-pp1": lambda: data_plan("mixtral-8x7b-ep8-deepspeed"),
    "mixtral-ep4-etp2": lambda: data_plan("mixtral-8x7b-ep4-etp2-megatron"),
    "mixtral-ep4-etp2-no-sp": lambda: variant(data_plan("mixtral-8x7b-ep4-etp2-megatron"),
                                              sequence_parallel=False),
    "qwen3-allgather-capacity-overlap": lambda: engine_settings(
        data_plan("qwen3-30b-a3b-ep8-capacity-megatron"), moe_overlap=True,
        moe_grouped_gemm=False),
    "qwen3-capacity-padded": lambda: engine_settings(
        data_plan("qwen3-30b-a3b-ep8-capacity-megatron"), moe_dispatcher="alltoall",
        moe_pad_to_capacity=True),
    "qwen3-pp2-ep8": lambda: data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan"),
    "8b-cp4": lambda: data_plan("llama3-8b-cp4-megatron"),
    "8b-cp4-allgather": lambda: variant(data_plan("llama3-8b-cp4-megatron"), cp_comm="allgather"),
    "8b-cp4-a2a": lambda: variant(data_plan("llama3-8b-cp4-megatron"), cp_comm="a2a"),
    "8b-cp8-a2a": lambda: data_plan("llama3-8b-cp8-a2a-deepspeed"),
    "8b-cp16-a2a+p2p": lambda: data_plan("llama3-8b-cp16-hier-megatron"),
}


@pytest.mark.parametrize("case", sorted(MOE_CP_VARIANTS))
def test_context_and_expert_knobs_are_expressed_or_listed(case, notes, monkeypatch):
    """The same account for plans with context or expert parallelism: every note in the file and
    on stderr, for every engine release (a plan an engine refuses says why in one line)."""
    from planner.export import reprice  # noqa: PLC0415
    monkeypatch.setattr(reprice, "recheck",
                        lambda plan, target, change, **kw: f"re-checked {change}")
    plan = MOE_CP_VARIANTS[case]()
    for target, versions in SUPPORTED_VERSIONS.items():
        for version in versions:
            notes.clear()
            try:
                text = export(plan, target, version)[0]
            except SpecError as err:
                assert "\n" not in str(err) and str(err).startswith(f"export {target}: ")
                continue
            if target == "deepspeed":  # JSON escapes quotes: read the notes back
                text = "\n".join(json.loads(text)["planner"]["not_expressed"]) or \
                    "Every knob of the plan is expressed exactly"
            body = " ".join(re.sub(r"^ *# ?(- )?", "", line) for line in text.splitlines())
            body = " ".join(body.split())
            for note in notes:
                assert " ".join(note.split(": ", 1)[1].split()) in body, (target, note)
            assert ("Every knob of the plan is expressed exactly" in text) == (not notes)


def test_megatron_expresses_context_parallelism_in_transformer_engines_words():
    """--cp-comm-type takes Transformer Engine's words (all_gather, not the help text's
    allgather); a2a+p2p names its two levels: the cp ranks of a node, and the nodes."""
    plan = data_plan("llama3-8b-cp4-megatron")
    for form, word in (("p2p", "p2p"), ("allgather", "all_gather"), ("a2a", "a2a")):
        args = megatron_args(to_megatron(variant(plan, cp_comm=form)))
        assert option(args, "--context-parallel-size") == "4"
        assert option(args, "--cp-comm-type") == word
        assert "--hierarchical-context-parallel-sizes" not in args
    text = to_megatron(data_plan("llama3-8b-cp16-hier-megatron"))
    args = megatron_args(text)
    i = args.index("--hierarchical-context-parallel-sizes")
    assert args[i + 1:i + 3] == ["8", "2"] and option(args, "--cp-comm-type") == "a2a+p2p"
    assert "launch on 32 GPUs = tp 1 x cp 16 x pp 1 x dp 2" in text
    tp_cp = to_megatron(plan)  # tp 2 x cp 4, ZeRO-1: validate_args wants 1 connection
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in tp_cp
    assert "# tensor and context parallelism: " in tp_cp


def test_megatron_refuses_a_sequence_it_cannot_split_into_2cp_chunks():
    plan = data_plan("llama3-8b-cp4-megatron")
    plan = dataclasses.replace(plan, training={**plan.training, "seq_len": 65532})
    with pytest.raises(SpecError, match=r"multiple of 2 x context-parallel size \(8\)"):
        to_megatron(plan)


def test_megatron_expresses_experts_and_their_settings(notes):
    plan = data_plan("mixtral-8x7b-ep4-etp2-megatron")
    args = megatron_args(to_megatron(plan))
    for flag, value in (("--expert-model-parallel-size", "4"),
                        ("--expert-tensor-parallel-size", "2"), ("--num-experts", "8"),
                        ("--moe-router-topk", "2"), ("--moe-token-dispatcher-type", "alltoall")):
        assert option(args, flag) == value, flag
    assert "--moe-grouped-gemm" in args and "--sequence-parallel" in args
    assert "--moe-expert-capacity-factor" not in args  # dropless
    assert not notes
    capacity = megatron_args(to_megatron(data_plan("qwen3-30b-a3b-ep8-capacity-megatron")))
    assert option(capacity, "--moe-expert-capacity-factor") == "1.25"
    assert option(capacity, "--moe-token-drop-policy") == "probs"
    assert option(capacity, "--moe-token-dispatcher-type") == "allgather"
    assert (option(capacity, "--num-experts"), option(capacity, "--moe-router-topk")) == \
        ("128", "8")


def test_torchtitan_says_where_op_level_checkpointing_replays_the_all_to_alls(notes):
    """0.2.2's qwen3 keeps no all-to-all output under op-level checkpointing (its gpt_oss,
    deepseek_v3 and llama4 do, as the plan prices)."""
    plan = variant(data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan"), recompute="op")
    to_torchtitan(plan)
    assert any("torchtitan 0.2.2's qwen3 does not save the expert all-to-alls' outputs" in n
               for n in notes)
    notes.clear()
    to_torchtitan(variant(plan, recompute="full"))
    assert not any("all-to-alls' outputs" in n for n in notes)


def test_a_re_plan_keeps_the_users_moe_choices_not_the_softwares():
    """A torchtitan plan's re-plan for Megatron-LM carries the MoE settings chosen (deepep),
    not how torchtitan runs its experts (moe_etp_replicated, a preset's property)."""
    from costmodels.engine import engine_from_mapping, setting_text
    plan = data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan")
    engine = engine_from_mapping("torchtitan,moe_dispatcher=deepep")
    plan = dataclasses.replace(plan, training={**plan.training, "engine": {
        k: setting_text(v) for k, v in dataclasses.asdict(engine).items()}})
    hint = resolve_hint(plan, "megatron")
    assert " --engine megatron-core,moe_dispatcher=deepep " in hint, hint
    assert "etp_replicated" not in hint and "probs_in_activation" not in hint


def test_a_re_plan_leaves_out_a_recomputation_its_engine_refuses_with_the_plans_settings():
    """A plan with moe_act pinned under FP8 delayed scaling (which torch runs): its re-plan for
    Megatron-LM, which refuses moe_act there, leaves the pin out and says so (a new-user check:
    the suggested command was refused); in bf16 the pin is kept."""
    from costmodels.engine import engine_from_mapping, setting_text
    plan = data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan")
    search = {**plan.search, "options": {**plan.search.get("options", {}),
                                         "fix": {"recompute": "moe_act"}}}
    engine = engine_from_mapping("torchtitan,fp8_recipe=delayed")
    fp8 = dataclasses.replace(plan, search=search, training={
        **plan.training, "dtype": "fp8",
        "engine": {k: setting_text(v) for k, v in dataclasses.asdict(engine).items()}})
    hint = resolve_hint(fp8, "megatron")
    assert "fp8_recipe=delayed" in hint and "recompute=moe_act" not in hint.split("#")[0], hint
    assert hint.endswith("# without recompute moe_act under FP8 delayed scaling, which megatron "
                         "does not run"), hint
    bf16 = dataclasses.replace(plan, search=search)
    assert "--fix recompute=moe_act" in resolve_hint(bf16, "megatron")
    # (of a policy of several modules only moe_act goes; a review saw the whole pin dropped)
    both = {**search, "options": {**search["options"], "fix": {"recompute": "mla_up_proj+moe_act"}}}
    hint = resolve_hint(dataclasses.replace(fp8, search=both), "megatron")
    assert "--fix recompute=mla_up_proj --target megatron" in hint, hint
    # (a refusal of another setting, DeepEP in fp16, is not read as the recomputation's)
    deepep = engine_from_mapping("torchtitan,moe_dispatcher=deepep")
    fp16 = dataclasses.replace(plan, search={**search, "options": {
        **search["options"], "fix": {"recompute": "full"}}}, training={
        **plan.training, "dtype": "fp16",
        "engine": {k: setting_text(v) for k, v in dataclasses.asdict(deepep).items()}})
    assert "recompute=full" in resolve_hint(fp16, "deepspeed").split("#")[0]


def test_an_edited_plan_whose_ep_does_not_divide_the_experts_is_refused():
    plan = variant(data_plan("mixtral-8x7b-ep8-megatron"), ep=16, dp=16)
    for target in ("megatron", "torchtitan", "deepspeed"):
        with pytest.raises(SpecError, match=r"^parallel.ep: 16 does not divide mixtral-8x7b's 8 "
                                            r"routed experts \(planner's zoo\); re-plan"):
            export(plan, target)


def test_deepep_runs_as_each_engine_names_it(notes):
    """Megatron-Core: the flex dispatcher with DeepEP (core_v0.14.0 --moe-enable-deepep,
    core_v0.19.0 --moe-flex-dispatcher-backend deepep), alltoall where nothing is dispatched
    (the flex dispatcher asserts TPxEP > 1); torchtitan 0.2.2: expert_parallel_comm_backend in
    its deepseek_v3 and llama4 models, the nearest (torch's all-to-all) elsewhere; DeepSpeed
    0.19.8: AutoEP's comm_backend deepep, the nearest (all-to-all) with AutoTP's folded tp, which
    its DeepEP route refuses (auto_ep_layer.py)."""
    plan = engine_settings(variant(data_plan("qwen3-30b-a3b-ep8-capacity-megatron"), zero=1),
                           moe_dispatcher="deepep")  # (core_v0.14.0's FSDP has no expert groups)
    old = megatron_args(to_megatron(plan, "core_v0.14.0"))
    assert option(old, "--moe-token-dispatcher-type") == "flex" and "--moe-enable-deepep" in old
    new = megatron_args(to_megatron(plan, "core_v0.19.0"))
    assert option(new, "--moe-token-dispatcher-type") == "flex"
    assert option(new, "--moe-flex-dispatcher-backend") == "deepep"
    assert "--moe-enable-deepep" not in new  # deprecated there
    alone = megatron_args(to_megatron(variant(plan, ep=1)))
    assert option(alone, "--moe-token-dispatcher-type") == "alltoall"
    assert not notes
    tomllib = pytest.importorskip("tomllib")
    titan = engine_settings(data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan"), moe_dispatcher="deepep")
    par = tomllib.loads(to_torchtitan(titan))["parallelism"]
    assert "expert_parallel_comm_backend" not in par
    assert any("moe_dispatcher deepep: torchtitan 0.2.2 runs DeepEP in its deepseek_v3 and "
               "llama4 models only" in n for n in notes)
    notes.clear()
    deepseek = dataclasses.replace(titan, model={**titan.model, "spec": "deepseek-v3",
                                                 "name": "deepseek-v3"})
    assert names.torchtitan_model(deepseek)[0] == "deepseek_v3"
    from planner.export import moe, torchtitan  # noqa: PLC0415
    ledger = Ledger("torchtitan", "0.2.2")
    assert [(s.section, s.key, s.value) for s in torchtitan._moe_settings(
        deepseek, "0.2.2", moe.settings(deepseek), ledger)] == \
        [("parallelism", "expert_parallel_comm_backend", "deepep")]
    assert ledger.done["moe_dispatcher"] == "exact"
    ds = engine_settings(data_plan("mixtral-8x7b-ep8-deepspeed"), moe_dispatcher="deepep")
    section = json.loads(to_deepspeed(ds))["expert_parallel"]
    assert ds.parallel["tp"] == 1 and section["comm_backend"] == "deepep"
    assert section["comm_max_tokens_per_rank"] == ds.parallel["micro_batch"] * \
        ds.training["seq_len"]
    assert not any("moe_dispatcher deepep" in n for n in notes)
    folded = json.loads(to_deepspeed(variant(ds, tp=2, dp=ds.parallel["dp"] // 2,
                                             sequence_parallel=False)))["expert_parallel"]
    assert "comm_backend" not in folded
    assert any("moe_dispatcher deepep with tp=2: AutoEP runs DeepEP without folded tensor "
               "parallelism" in n for n in notes)
    half = dataclasses.replace(ds, training={**ds.training, "dtype": "fp16"})
    assert "comm_backend" not in json.loads(to_deepspeed(half))["expert_parallel"]
    assert any("moe_dispatcher deepep in fp16: AutoEP's DeepEP dispatches bfloat16 only" in n
               for n in notes)


def test_megatron_sets_sequence_parallelism_where_it_requires_it(notes):
    """ep > 1 with tp > 1: core_v0.14.0's ModelParallelConfig raises without sequence
    parallelism, core_v0.19.0's warns."""
    plan = variant(data_plan("mixtral-8x7b-ep4-etp2-megatron"), sequence_parallel=False)
    assert "--sequence-parallel" in megatron_args(to_megatron(plan, "core_v0.14.0"))
    assert any("core_v0.14.0's ModelParallelConfig raises" in n for n in notes)
    notes.clear()
    assert "--sequence-parallel" not in megatron_args(to_megatron(plan, "core_v0.19.0"))
    assert any("core_v0.19.0's ModelParallelConfig warns" in n for n in notes)


def test_megatron_overlaps_expert_all_to_alls_only_where_megatron_core_allows(notes):
    plan = engine_settings(data_plan("qwen3-30b-a3b-ep8-capacity-megatron"),
                           moe_dispatcher="alltoall", moe_overlap=True)
    text = to_megatron(plan)
    assert "--overlap-moe-expert-parallel-comm" in megatron_args(text)
    assert not notes
    tp = to_megatron(engine_settings(data_plan("mixtral-8x7b-ep4-etp2-megatron"),
                                     moe_overlap=True))  # DDP-like ZeRO-1 with tp: connections
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=32\n" in tp
    deepep = to_megatron(engine_settings(plan, moe_dispatcher="deepep"))
    assert "--overlap-moe-expert-parallel-comm" in megatron_args(deepep)
    for refused, why in ((engine_settings(plan, moe_dispatcher="allgather"),
                          "the alltoall or deepep dispatcher"),
                         (variant(plan, recompute="full"), "no full recomputation")):
        notes.clear()
        assert "--overlap-moe-expert-parallel-comm" not in megatron_args(to_megatron(refused))
        assert any(why in n and "the plan prices the dispatch and combine exposed" in n for n in notes)


def test_megatron_refuses_split_experts_with_biases():
    """core_v0.19.0's TransformerConfig: "Bias in Moe is only supported when ETP==1" (gpt-oss's
    experts carry biases); core_v0.14.0 does not check."""
    plan = data_plan("mixtral-8x7b-ep4-etp2-megatron")
    oss = dataclasses.replace(plan, model={**plan.model, "name": "gpt-oss-120b",
                                           "spec": "gpt-oss-120b"})
    megatron_args(to_megatron(plan))
    with pytest.raises(SpecError, match="supports bias in MoE only with") as err:
        to_megatron(oss)
    assert "--target megatron" in str(err.value)
    assert option(megatron_args(to_megatron(oss, "core_v0.14.0")),
                  "--expert-tensor-parallel-size") == "2"


def test_megatron_names_no_expert_count_it_does_not_know(notes):
    plan = data_plan("mixtral-8x7b-ep8-megatron")
    unrecorded = {k: v for k, v in plan.model.items() if k != "routed_experts"}  # (made by hand)
    mine = dataclasses.replace(plan, model={**unrecorded, "spec": "my/config.json",
                                            "source": "hf-config"})
    args = megatron_args(to_megatron(mine))
    assert "--num-experts" not in args and option(args, "--expert-model-parallel-size") == "8"
    assert any("--num-experts and --moe-router-topk are not written" in n for n in notes)


def test_megatron_reads_the_expert_count_from_the_config_the_plan_names(tmp_path):
    """A plan traced from a Hugging Face config.json (not a zoo model) still names it: the
    export reads its expert count and top-k there (OLMoE's keys: num_experts, 8 per token)."""
    config = tmp_path / "olmoe.json"
    config.write_text(json.dumps({"model_type": "olmoe", "num_experts": 64,
                                  "num_experts_per_tok": 8}))
    plan = data_plan("mixtral-8x7b-ep8-megatron")
    unrecorded = {k: v for k, v in plan.model.items() if k != "routed_experts"}  # (an old plan)
    mine = dataclasses.replace(plan, model={**unrecorded, "spec": str(config),
                                            "source": "hf-config"})
    args = megatron_args(to_megatron(mine))
    assert (option(args, "--num-experts"), option(args, "--moe-router-topk")) == ("64", "8")
    # a file that cannot be the plan's (ep 8 does not divide 6 experts): not read
    config.write_text(json.dumps({"model_type": "olmoe", "num_experts": 6,
                                  "num_experts_per_tok": 2}))
    assert "--num-experts" not in megatron_args(to_megatron(mine))


def test_torchtitan_expresses_context_and_expert_parallelism(notes):
    tomllib = pytest.importorskip("tomllib")
    par = tomllib.loads(to_torchtitan(data_plan("llama3-8b-cp4-torchtitan")))["parallelism"]
    # the plan's all-gather, torch's default: 0.2.2's rotate-method option reaches only its
    # validator, so it is not written
    assert par["context_parallel_degree"] == 4 and "context_parallel_rotate_method" not in par
    assert "expert_parallel_degree" not in par
    plan = data_plan("mixtral-8x7b-ep8-torchtitan")  # tp 2, etp 1
    par = tomllib.loads(to_torchtitan(plan))["parallelism"]
    assert (par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]) == (8, 1)
    assert "context_parallel_degree" not in par
    # where its ep ranks come from (torchtitan's ParallelDims): with etp 1 the tp ranks too,
    # with etp = tp not
    assert "ranks (folded over dp_shard x cp x tp)" in to_torchtitan(plan)
    folded = dataclasses.replace(plan, parallel={**plan.parallel, "etp": 2})
    assert "ranks (folded over dp_shard x cp);" in to_torchtitan(folded)
    settings = titan_settings(to_torchtitan(data_plan("mixtral-8x7b-ep8-torchtitan"), "0.3.0"),
                              "0.3.0")
    assert settings["parallelism.expert_parallel_degree"] == 8
    assert "parallelism.expert_tensor_parallel_degree" not in settings  # 0.3.0 has none
    # 0.3.0's trainer refuses CUDA graphs with its all-to-all dispatch, pipeline or not (a
    # check of the exports with torchtitan's own parser)
    assert settings["training.disable_cuda_graphs"] is True


def test_engine_checks_of_the_exports_outside_the_default_releases(notes):
    """A check of the exports with the engines' own parsers: torchtitan 0.3.0's llama3_405b
    config function converts the Linears to FP8 itself (a bf16 plan trained in FP8, nothing
    said); core_v0.14.0 asserts no grouped GEMM for experts with biases (gpt-oss); a shared
    expert overlap for a model without shared experts is left out."""
    p405 = dataclasses.replace(data_plan("llama3-70b-pp4-torchtitan"),
                               model={**data_plan("llama3-70b-pp4-torchtitan").model,
                                      "spec": "llama3-405b"})
    notes.clear()
    to_torchtitan(p405, "0.3.0")
    assert [n for n in notes if "llama3_405b config function converts every Linear" in n]
    notes.clear()
    to_torchtitan(p405)  # (0.2.2 picks the model by name and flavor: no converter of its own)
    assert not [n for n in notes if "converts every Linear" in n]
    oss = dataclasses.replace(data_plan("mixtral-8x7b-ep8-megatron"),
                              model={**data_plan("mixtral-8x7b-ep8-megatron").model,
                                     "spec": "gpt-oss-120b"})
    old = to_megatron(oss, "core_v0.14.0")
    assert "--moe-grouped-gemm" not in bash_args(old, "MEGATRON_PARALLEL_ARGS")
    assert "--moe-grouped-gemm" in bash_args(to_megatron(oss), "MEGATRON_PARALLEL_ARGS")
    qwen = engine_settings(data_plan("qwen3-30b-a3b-ep8-capacity-megatron"),
                           moe_shared_overlap=True, moe_dispatcher="alltoall")
    assert "--moe-shared-expert-overlap" not in bash_args(to_megatron(qwen),
                                                          "MEGATRON_PARALLEL_ARGS")
    assert [n for n in notes if "has no shared expert" in n]


def test_torchtitan_runs_a_nearby_exchange_and_re_checks_the_memory(notes, monkeypatch):
    from planner.export import reprice  # noqa: PLC0415
    seen = []
    monkeypatch.setattr(reprice, "recheck", lambda plan, target, change, **kw:
                        seen.append(kw) or f"re-checked {change}")
    for form in ("a2a", "p2p"):
        plan = variant(data_plan("llama3-8b-cp4-torchtitan"), cp_comm=form)
        par = pytest.importorskip("tomllib").loads(to_torchtitan(plan))["parallelism"]
        assert "context_parallel_rotate_method" not in par
        assert seen[-1]["cp_comm"] == "allgather"
        assert any(n.startswith(f"export torchtitan 0.2.2: cp_comm {form}:") and
                   "reaches only the validator" in n for n in notes)
        to_torchtitan(plan, "0.3.0")  # 0.3.0 all-gathers too
        assert seen[-1]["cp_comm"] == "allgather"
    to_torchtitan(variant(data_plan("mixtral-8x7b-ep4-etp2-megatron"), zero=2), "0.3.0")
    assert seen[-1]["etp"] == 1  # 0.3.0 does not split experts' matrices


def test_torchtitan_offload_is_bounded_not_refused_whatever_else_changes(notes, monkeypatch):
    """FSDP2's CPU offload keeps parameters and gradients on the host too, which no re-pricing
    with the optimizer alone offloaded shows: a plan whose K/V exchange torchtitan changes is
    not refused on it (its all-gather twin never was); the note gives the peak with the optimizer
    alone on the host as a bound torchtitan stays under (a review saw it say nothing of the
    K/V exchange), and says so where that bound is over the usable memory."""
    from planner.export import reprice  # noqa: PLC0415
    monkeypatch.setattr(reprice, "recheck", lambda *a, **kw: pytest.fail("re-priced"))
    for form in ("allgather", "p2p"):
        to_torchtitan(variant(data_plan("llama3-8b-cp4-torchtitan"), cp_comm=form,
                              offload_optimizer=True))
    said = [n for n in notes if "memory not re-checked with the model states as torchtitan's"
            in n]
    assert len(said) == 2 and "K/V" not in said[0]
    assert ("with K/V all-gathered instead of p2p and the optimizer alone on the host, a GPU "
            "needs at most " in said[1]) and "usable" in said[1]
    notes.clear()
    monkeypatch.setattr(reprice, "memory", lambda *a, **kw: reprice.Memory(
        per_rank=[90e9], usable=75e9, device=80e9))
    to_torchtitan(variant(data_plan("llama3-8b-cp4-torchtitan"), cp_comm="p2p",
                          offload_optimizer=True))
    (over,) = [n for n in notes if "a GPU needs at most" in n]
    assert "90.0 GB (torchtitan's offload keeps more on the host), more than the 75.0 GB " \
           "usable: whether the parameters and gradients on the host make up for it" in over


def test_torchtitan_shards_data_parallelism_where_its_experts_fold_over_it(notes):
    """ZeRO-0 would be DDP (replicas), but torchtitan folds experts over dp_shard x cp x tp."""
    # dp 64, tp = pp = 1; full recomputation leaves room for torchtitan's eager kernels
    plan = variant(data_plan("mixtral-8x7b-ep8-deepspeed"), zero=0, recompute="full")
    for version in SUPPORTED_VERSIONS["torchtitan"]:
        par = titan_settings(to_torchtitan(plan, version), version)
        assert (par["parallelism.data_parallel_replicate_degree"],
                par["parallelism.data_parallel_shard_degree"]) == (1, 64)
    assert any("torchtitan folds the experts over dp_shard x cp x tp" in n for n in notes)


def test_torchtitan_names_its_own_mixtures_of_experts():
    """torchtitan defines Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and gpt-oss-120b (their
    module names are its own), not Mixtral (the names are the user's)."""
    plan = data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan")
    assert names.torchtitan_model(plan) == ("qwen3", "30B-A3B")
    assert names.torchtitan_names(plan, "0.2.2")[0][0] == "tok_embeddings"
    assert names.torchtitan_names(plan, "0.3.0")[-1][-1] == "lm_head"
    args = bash_args(to_torchtitan(plan, "0.3.0"), "TORCHTITAN_ARGS")
    assert args[:4] == ["--module", "qwen3", "--config", "qwen3_30b_a3b"]
    for spec, known in (("qwen3-235b-a22b", ("qwen3", "235B-A22B")),
                        ("deepseek-v3", ("deepseek_v3", "671B")),
                        ("gpt-oss-120b", ("gpt_oss", "120b")), ("mixtral-8x7b", None)):
        other = dataclasses.replace(plan, model={**plan.model, "spec": spec, "name": spec})
        assert names.torchtitan_model(other) == known
    assert names.torchtitan_config(dataclasses.replace(
        plan, model={**plan.model, "spec": "qwen3-235b-a22b"})) is None  # no 0.3.0 config


def test_megatron_gets_the_node_limited_routing_the_plan_was_priced_with():
    """DeepSeek-V3 routes each token to experts of its best 4 of 8 groups, which DeepEP's sends
    follow (costmodels.experts.node_sends): the export writes Megatron-Core's flags for it;
    a model without groups gets none."""
    from planner.export import moe
    plan = data_plan("qwen3-30b-a3b-ep8-capacity-megatron")
    deepseek = dataclasses.replace(plan, model={**plan.model, "spec": "deepseek-v3",
                                                "name": "deepseek-v3"})
    assert moe.model(deepseek).groups == (8, 4) and moe.model(plan).groups is None
    args = bash_args(to_megatron(deepseek), "MEGATRON_PARALLEL_ARGS")
    at = args.index("--moe-router-num-groups")
    assert args[at:at + 4] == ["--moe-router-num-groups", "8", "--moe-router-group-topk", "4"]
    assert "--moe-router-num-groups" not in bash_args(to_megatron(plan), "MEGATRON_PARALLEL_ARGS")


def test_megatron_gets_the_dense_layers_of_a_model_that_mixes_them_with_moe():
    """Megatron-LM's --moe-layer-freq defaults to every layer routed: DeepSeek-V3's three dense
    first layers (a new-user check got 61 MoE layers from the arguments) and Qwen-MoE's sparse
    step and dense-only layers are written; a model routed in every layer gets no flag."""
    from planner.export import moe
    plan = data_plan("qwen3-30b-a3b-ep8-capacity-megatron")
    deepseek = dataclasses.replace(plan, model={**plan.model, "spec": "deepseek-v3",
                                                "name": "deepseek-v3"})
    args = bash_args(to_megatron(deepseek), "MEGATRON_PARALLEL_ARGS")
    assert args[args.index("--moe-layer-freq") + 1] == "([0]*3+[1]*58)"
    assert "--moe-layer-freq" not in bash_args(to_megatron(plan), "MEGATRON_PARALLEL_ARGS")
    assert moe.layer_pattern(moe.moe_layers({"num_hidden_layers": 8, "decoder_sparse_step": 2})) \
        == "([0]+[1])*4"
    assert moe.layer_pattern(moe.moe_layers({"num_hidden_layers": 8, "mlp_only_layers": [0, 7]})) \
        == "([0]+[1]*6+[0])"
    assert moe.moe_layers({"num_hidden_layers": 6, "first_k_dense_replace": 1,
                           "moe_layer_freq": 2}) == (0, 1, 0, 1, 0, 1)


def test_torchtitan_refuses_context_parallelism_its_own_model_refuses():
    plan = data_plan("llama3-8b-cp4-torchtitan")
    gpt_oss = dataclasses.replace(plan, model={**plan.model, "spec": "gpt-oss-120b",
                                               "name": "gpt-oss-120b"})
    with pytest.raises(SpecError, match="CP support for gpt-oss model is still in progress") as e:
        to_torchtitan(gpt_oss, "0.2.2")
    assert "--fix cp=1" in str(e.value) and "\n" not in str(e.value)


def test_torchtitan_refuses_meshes_its_parallelize_functions_refuse():
    """seq_len % (tp x 2 x cp) is asserted (cp = 1 included); 0.2.2's deepseek_v3 and gpt_oss
    fetch the FSDP mesh whenever ep > 1, which does not exist when dp x cp = 1."""
    plan = data_plan("qwen3-30b-a3b-pp2-ep8-torchtitan")
    odd = dataclasses.replace(plan, training={**plan.training, "seq_len": 4095})
    with pytest.raises(SpecError, match=r"multiple of tp x 2 x cp = 2 .*seq_len_divisor.*"
                                        r"divisible by 2$"):
        to_torchtitan(odd, "0.2.2")  # an odd length splits for no tp: no re-plan offered
    # a model torchtitan does not define (a ViT's 197 tokens): the assert is in the user's
    # parallelize function, so a note (a new-user check saw the export refused)
    own = dataclasses.replace(odd, model={**odd.model, "spec": "vit.json", "name": "vit-304M"},
                              parallel={**odd.parallel, "ep": 1})
    assert "(ParallelDims.seq_len_divisor); drop that assert from yours" in to_torchtitan(own,
                                                                                       "0.2.2")
    # an even one that tp = 2 does not split: the re-plan drops the pin it cannot run
    pinned = dataclasses.replace(plan, training={**plan.training, "seq_len": 4098},
                                 parallel={**plan.parallel, "tp": 2},
                                 search={**plan.search, "options": {"fix": {"tp": 2, "pp": 2}}})
    with pytest.raises(SpecError, match=r"tp x 2 x cp = 4 .*re-plan with `plan solve .*"
                                        r"--seq-len 4098 (--engine \S+ )?--fix pp=2 --target "
                                        r"torchtitan`$"):  # (the plan's engine where it differs)
        to_torchtitan(pinned, "0.2.2")
    deepseek = dataclasses.replace(plan, model={**plan.model, "spec": "deepseek-v3"},
                                   parallel={**plan.parallel, "dp": 1})
    with pytest.raises(SpecError, match=r"deepseek_v3 needs an FSDP mesh \(dp x cp > 1\) with "
                                        r"ep=8") as e:
        to_torchtitan(deepseek, "0.2.2")
    assert "--target torchtitan" in str(e.value) and "\n" not in str(e.value)


def test_torchtitan_notes_fp32_training_without_fsdp(notes):
    """Without FSDP and with tp or pp, torchtitan's maybe_enable_amp leaves mixed precision off:
    the export says so and re-checks the memory in float32 (it priced bf16 and passed a plan that
    needs twice the bytes)."""
    plan = data_plan("llama3-70b-pp4-torchtitan")
    to_torchtitan(plan, "0.2.2")
    assert not [n for n in notes if "float32" in n]
    notes.clear()
    with pytest.raises(InfeasibleError, match=r"^no torchtitan export fits: "
                                              r"with float32 parameters and "
                       r"activations \(no mixed precision without FSDP\).* needs 3\d\d\.\d GB"):
        to_torchtitan(dataclasses.replace(plan, parallel={**plan.parallel, "dp": 1}), "0.2.2")
    small = plan_model("gpt2", cluster="dgx-h100", gpus_per_node=2, global_batch=8,
                       seq_len=1024, fix="tp=2,dp=1", top_k=0)
    to_torchtitan(small, "0.2.2")
    assert [n for n in notes if "so it trains in float32" in n and "--target torchtitan" in n]
    checked = [n for n in notes if "memory re-checked with float32" in n]
    assert checked and "instead of the plan's" in checked[0]


def test_torchtitan_fp8_keeps_the_output_layer_in_bf16_as_planned():
    """The float8 converter's filter_fqns default is empty in 0.2.2 (job_config.py), so without
    it the output projection would run in FP8, which the plan prices in bf16."""
    tomllib = pytest.importorskip("tomllib")
    dense = data_plan("llama3-70b-pp4-torchtitan")
    for recipe, section in (("current", "float8"), ("block", "mx")):
        fp8 = dataclasses.replace(dense, training={
            **dense.training, "dtype": "fp8",
            "engine": {**dense.training.get("engine", {}), "fp8_recipe": recipe}})
        got = tomllib.loads(to_torchtitan(fp8, "0.2.2"))["quantize"]["linear"][section]
        assert got["filter_fqns"] == ["output"]


def test_torchtitan_refuses_optimizer_offload_without_fsdp():
    """enable_cpu_offload builds the model on the CPU; only FSDP2's offload policy moves it back
    (parallelize.py, under fsdp_enabled: dp_shard > 1 or cp > 1)."""
    plan = data_plan("llama3-70b-pp4-torchtitan")
    offload = variant(plan, offload_optimizer=True)
    assert "enable_cpu_offload = true" in to_torchtitan(offload, "0.2.2")
    with pytest.raises(SpecError, match=r"^export torchtitan: parallel.offload_optimizer: .* this plan "
                                        r"runs no FSDP \(dp x cp = 1\).*--target torchtitan"):
        to_torchtitan(variant(offload, dp=1), "0.2.2")


def test_torchtitan_says_the_experts_stay_bf16_under_fp8(notes):
    """Its float8 converter swaps nn.Linear modules, not the experts' grouped GEMMs the plan
    priced in fp8: the export says so, naming the prototype converter; a dense plan does not."""
    plan = data_plan("mixtral-8x7b-ep8-torchtitan")
    fp8 = dataclasses.replace(plan, training={**plan.training, "dtype": "fp8"})
    assert 'converters = ["quantize.linear.float8"]' in to_torchtitan(fp8, "0.2.2")
    assert [n for n in notes if "grouped GEMMs run in bf16" in n
            and "quantize.grouped_mm.float8" in n]
    notes.clear()
    dense = data_plan("llama3-70b-pp4-torchtitan")
    to_torchtitan(dataclasses.replace(dense, training={**dense.training, "dtype": "fp8"}), "0.2.2")
    assert not [n for n in notes if "grouped GEMMs" in n]


def test_deepspeed_puts_pipe_outermost_with_expert_parallelism(notes):
    """AutoEP's expert groups are consecutive ranks of one stage: a tp-pp-dp plan with ep > 1 gets
    the pipe axis outermost, with a note; without experts the plan's order stays."""
    plan = data_plan("llama3-70b-pp4-deepspeed")
    inner = dataclasses.replace(plan, parallel={**plan.parallel, "placement": "tp-pp-dp"})
    topology = json.loads(to_deepspeed(inner))["planner"]["pipeline"]["topology"]
    assert topology["axes"] == ["data", "pipe", "model"]
    assert not [n for n in notes if "consecutive ranks" in n]
    with_ep = dataclasses.replace(inner, parallel={**inner.parallel, "ep": 2})
    topology = json.loads(to_deepspeed(with_ep))["planner"]["pipeline"]["topology"]
    assert topology["axes"] == ["pipe", "data", "model"] and topology["dims"] == [4, 4, 4]
    assert [n for n in notes if "consecutive ranks of a pipeline stage" in n]


def test_exports_say_which_site_runs_which_stage(notes):
    """On a cluster of sites the launch must put each pipeline stage on its site's nodes (the
    engines number ranks stage by stage); no engine setting says it, so every export notes it."""
    sites = ["us-west", "us-east", "eu-west", "eu-north"]
    for write, stem in ((to_megatron, "llama3-70b-pp4-megatron"),
                         (to_torchtitan, "llama3-70b-pp4-torchtitan"),
                         (to_deepspeed, "llama3-70b-pp4-deepspeed")):
        plan = data_plan(stem)
        staged = dataclasses.replace(
            plan, stages=[{**st, "group": sites[st["pipeline_rank"]]} for st in plan.stages],
            cluster={**plan.cluster, "links": [{"between": sites[:2], "bandwidth": "10Gbps"}]})
        per, gpn = plan.cluster["num_gpus"] // 4, plan.cluster["gpus_per_node"]
        notes.clear()
        write(plan)
        assert not [n for n in notes if "sites:" in n]
        write(staged)
        note = [n for n in notes if "sites:" in n]
        assert len(note) == 1 and f"ranks 0-{per - 1} (stage 0, node ranks 0-{per // gpn - 1}) " \
            "on us-west" in note[0] and f"ranks {3 * per}-{4 * per - 1}" in note[0] and \
            "eu-north" in note[0]


def test_deepspeed_says_which_of_its_moe_paths_pads_or_drops(notes, monkeypatch):
    """DeepSpeed's own MoE layer pads every expert to its capacity (its hint says so when the
    plan priced no padding); with ep = 1 the model's own MoE blocks run dropless, a note."""
    from planner.export import reprice  # noqa: PLC0415
    monkeypatch.setattr(reprice, "recheck",  # (the ep = 1 variant is not re-priced)
                        lambda plan, target, change, **kw: f"re-checked {change}")
    plan = engine_settings(data_plan("mixtral-8x7b-ep8-deepspeed"), moe_capacity_factor=1.25)
    how = json.loads(to_deepspeed(plan))["planner"]["experts"]["how"]
    assert "capacity_factor=1.25" in how and "pads every expert to its capacity" in how
    padded = engine_settings(plan, moe_pad_to_capacity=True)
    assert "pads every expert" not in json.loads(to_deepspeed(padded))["planner"]["experts"]["how"]
    notes.clear()
    to_deepspeed(variant(plan, ep=1))
    assert any("the model's own MoE layer (ep 1) drops no tokens" in n for n in notes)


def test_deepspeed_expresses_ulysses_and_autoep(notes):
    ulysses = json.loads(to_deepspeed(data_plan("llama3-8b-cp8-a2a-deepspeed")))
    assert (ulysses["sequence_parallel_size"], ulysses["data_parallel_size"]) == (8, 4)
    assert ulysses["train_batch_size"] == 32 and "DistributedAttention" in \
        ulysses["planner"]["sequence_parallel"]["how"]
    notes.clear()
    moe = json.loads(to_deepspeed(data_plan("mixtral-8x7b-ep8-deepspeed")))
    assert moe["expert_parallel"] == {"enabled": True, "autoep_size": 8,
                                      "expert_tensor_parallel_size": 1, "preset_model": "mixtral",
                                      "use_grouped_mm": True}
    how = moe["planner"]["experts"]["how"]
    assert "ep_size=8" in how and "takes ep_size in code, not in the config" in how
    assert moe["zero_optimization"] == {"stage": 2, "overlap_comm": True}  # as priced
    # priced as Megatron-Core runs it (a plan for --target any): said once, with the re-plan
    timing = [n for n in notes if ": timing: " in n]
    assert len(timing) == 1 and "--engine megatron-core (" in timing[0] and \
        "not for what deepspeed runs (--engine deepspeed)" in timing[0] and \
        timing[0].endswith("--target deepspeed` prices it as deepspeed runs it")
    # priced with Megatron-Core's layout of the states: priced again as ZeRO lays them out
    recheck = [n for n in notes if "memory re-checked with the model states as ZeRO lays" in n]
    assert len(recheck) == 1 and "still within" in recheck[0]
    # priced with the weights gathered behind the next forward, which DeepSpeed's step does not
    assert [n for n in notes if "sequence length" not in n and n not in timing + recheck] == [
        "export deepspeed 0.19.8: ZeRO-2: DeepSpeed's optimizer all-gathers the updated weights "
        "inside its step, where the plan hides the gather behind the next forward: a slower step "
        "than planned, by up to the all-gather's time (plans made with --engine deepspeed price "
        "it so)"]
    # (a variant as if priced with ZeRO's layout: ZeRO-0 of this plan needs 147 GB as ZeRO lays
    # the states out, which the layout's re-check would refuse; the settings are what is tested)
    plain = engine_settings(variant(data_plan("mixtral-8x7b-ep8-deepspeed"), zero=0),
                            state_layout="zero")
    notes.clear()
    assert "overlap_comm" not in json.loads(to_deepspeed(plain))["zero_optimization"]
    assert any("ZeRO-0: DeepSpeed all-reduces the gradients after the backward" in n
               for n in notes)
    serial = engine_settings(variant(plain, zero=1), overlap_grad_reduce=False)
    assert json.loads(to_deepspeed(serial))["zero_optimization"] == {"stage": 1,
                                                                      "overlap_comm": False}


def test_deepspeed_lists_context_parallelism_it_has_no_form_for(notes):
    ring = json.loads(to_deepspeed(variant(data_plan("llama3-8b-cp8-a2a-deepspeed"),
                                           cp_comm="p2p")))
    assert "sequence_parallel_size" not in ring and "train_batch_size" not in ring
    assert ring["planner"]["batch"]["global_batch"] == 32
    assert any(n.startswith("context parallelism cp=8 with K/V exchange p2p: DeepSpeed's "
                            "sequence parallelism is Ulysses") for n in
               ring["planner"]["not_expressed"])
    # DeepSpeed reduces gradients over the mpu's sequence-data-parallel group where it has one,
    # else over its data-parallel group: the mpu must give the dp x cp group
    assert any("get_sequence_data_parallel_group spans the 32 dp x cp ranks" in n
               for n in ring["planner"]["not_expressed"])
    tp = json.loads(to_deepspeed(data_plan("llama3-8b-cp4-deepspeed")))  # Ulysses with AutoTP
    assert "sequence_parallel_size" not in tp
    assert any("get_sequence_data_parallel_group spans the 16 dp x cp ranks" in n
               for n in tp["planner"]["not_expressed"])
    with pytest.raises(SpecError, match="has no axis for sequence shards") as err:
        to_deepspeed(variant(data_plan("llama3-8b-cp4-deepspeed"), pp=2))
    assert "--fix " in str(err.value) and "cp=1" in str(err.value)


def test_deepspeed_lists_what_the_script_must_do_beside_its_config():
    """Ulysses' attention wrapper and recomputation without a pipeline are code, not config."""
    ulysses = json.loads(to_deepspeed(data_plan("llama3-8b-cp8-a2a-deepspeed")))
    assert any(n.startswith("context parallelism cp=8 (Ulysses): the config sets "
                            "sequence_parallel_size; your script wraps the attention")
               for n in ulysses["planner"]["not_expressed"])
    full = json.loads(to_deepspeed(variant(data_plan("llama3-8b-cp8-a2a-deepspeed"),
                                           recompute="full")))
    assert any(n.startswith("recompute full: DeepSpeed's config cannot turn it on")
               for n in full["planner"]["not_expressed"])
    assert full["planner"]["recompute"]["activation_checkpoint_interval"] == 1
    piped = json.loads(to_deepspeed(variant(data_plan("llama3-70b-pp4-deepspeed"),
                                            recompute="full")))
    assert not any(n.startswith("recompute") for n in piped["planner"]["not_expressed"])


def test_deepspeed_refuses_zero3_with_ulysses_and_autoep_as_its_engine_does():
    both = variant(data_plan("mixtral-8x7b-ep8-deepspeed"), cp=2, cp_comm="a2a", dp=32)
    json.loads(to_deepspeed(variant(both, zero=1)))
    with pytest.raises(SpecError, match="refuses AutoEP with ZeRO stage 3") as err:
        to_deepspeed(variant(both, zero=3))
    assert "--target deepspeed" in str(err.value)
    # a ring the model runs itself sets no sequence_parallel_size: the engine has nothing to refuse
    ring = json.loads(to_deepspeed(variant(both, zero=3, cp_comm="p2p")))
    assert "sequence_parallel_size" not in ring and ring["zero_optimization"]["stage"] == 3


def test_deepspeed_says_where_experts_go_when_autoep_cannot(notes, monkeypatch):
    from planner.export import reprice  # noqa: PLC0415
    monkeypatch.setattr(reprice, "recheck", lambda plan, target, change, **kw: "re-checked")
    pipelined = regroup(data_plan("mixtral-8x7b-ep8-deepspeed"), [16, 16], tp=2, dp=16)
    ds = json.loads(to_deepspeed(pipelined))
    assert "expert_parallel" not in ds
    assert any("AutoEP refuses tensor model parallelism from an mpu" in n and
               "ep_size=8" in n for n in ds["planner"]["not_expressed"])
    # DeepSpeed's own MoE layer then runs the experts: its tensor-parallel split, its all-to-all
    # and its loop over local experts are said (a review saw etp and the dispatcher dropped
    # without a word)
    split = engine_settings(variant(pipelined, etp=2), moe_dispatcher="allgather",
                            moe_grouped_gemm=True)
    notes_of = json.loads(to_deepspeed(split))["planner"]["not_expressed"]
    assert any(n.startswith("ep=8 etp=2: ") and "enable_expert_tensor_parallelism=True" in n
               for n in notes_of)
    assert any(n.startswith("moe_dispatcher allgather: DeepSpeed's MoE layer dispatches by "
                            "all-to-all") for n in notes_of)
    assert any(n.startswith("moe_grouped_gemm: DeepSpeed's MoE layer runs its local experts one "
                            "after another") for n in notes_of)
    assert not any("enable_expert_tensor_parallelism" in n for n in ds["planner"]["not_expressed"])


def test_the_experts_come_from_the_zoo_model_the_plan_names():
    from planner.export import moe  # noqa: PLC0415
    plan = data_plan("llama3-8b-cp4-megatron")
    facts = {spec: moe.model(dataclasses.replace(plan, model={**plan.model, "spec": spec}))
             for spec in ("llama3-8b", "mixtral-8x22b", "qwen3-235b-a22b", "deepseek-v3",
                          "gpt-oss-120b")}
    assert not facts["llama3-8b"].moe
    assert [(f.experts, f.top_k) for s, f in facts.items() if s != "llama3-8b"] == [
        (8, 2), (128, 8), (256, 8), (128, 4)]
    assert facts["deepseek-v3"].shared == 1 and facts["deepseek-v3"].mla
    assert facts["gpt-oss-120b"].sliding_window == 128
    mixtral = data_plan("mixtral-8x7b-ep8-megatron")
    unknown = moe.model(dataclasses.replace(mixtral, model={  # (routed_experts unrecorded)
        **{k: v for k, v in mixtral.model.items() if k != "routed_experts"},
        "source": "hf-config", "spec": "moe/config.json"}))
    assert unknown.moe and unknown.experts is None  # ep > 1: experts, their count unknown


def test_megatron_refuses_exchanges_transformer_engine_refuses_for_the_attention(notes):
    """MLA's (older releases only) is a note; a window's and sinks' are refused, exit 2 (a
    new-user check found gpt-oss's p2p plan exported with a warning, exit 0)."""
    plan = data_plan("llama3-8b-cp4-megatron")
    mla = dataclasses.replace(variant(plan, cp_comm="allgather"),
                              model={**plan.model, "spec": "deepseek-v3", "name": "deepseek-v3"})
    to_megatron(mla)
    assert any("before v2.16 runs MLA's context parallelism only with p2p or a2a+p2p" in n
               and "cp_comm_type='all_gather'" in n for n in notes)
    notes.clear()
    swa = dataclasses.replace(plan, model={**plan.model, "spec": "gpt-oss-120b",
                                           "name": "gpt-oss-120b"})
    # the window and the sinks: the one form that runs both is named (a2a), not all_gather,
    # which --target megatron refuses over sinks
    with pytest.raises(SpecError, match=r"^export megatron: cp_comm p2p with gpt-oss-120b's "
                                        r"attention: .*sliding-window attention only with a2a or "
                                        r"all_gather; attention with sinks only with a2a; re-plan "
                                        r"with `plan solve gpt-oss-120b .*--target megatron`, "
                                        r"which keeps to cp_comm=a2a"):
        to_megatron(swa)
    with pytest.raises(SpecError, match=r"cp_comm allgather with gpt-oss-120b's attention.*"
                                        r"keeps to cp_comm=a2a"):
        to_megatron(variant(swa, cp_comm="allgather"))  # a window runs with it, sinks do not
    notes.clear()
    to_megatron(variant(swa, cp_comm="a2a"))
    assert not any("cp_comm" in n for n in notes)
    # an older plan's one-level a2a+p2p (tp=2, cp=4: all four cp ranks in one node of 8)
    notes.clear()
    assert "--hierarchical-context-parallel-sizes 4 1" in to_megatron(
        variant(plan, cp_comm="a2a+p2p"))
    assert any("has one level only: it runs as a2a would" in n for n in notes)


def test_summary_line_names_context_and_expert_parallelism():
    assert "cp=4(p2p)" in to_megatron(data_plan("llama3-8b-cp4-megatron")).splitlines()[2]
    head = to_megatron(data_plan("mixtral-8x7b-ep4-etp2-megatron")).splitlines()[2]
    assert " ep=4 etp=2 " in head


def test_ledger_refuses_a_knob_nobody_accounted_for():
    ledger = Ledger("megatron", "core_v0.14.0")
    ledger.exact(*[k for k in ACCOUNTED if k != "offload_optimizer"])
    with pytest.raises(AssertionError, match="offload_optimizer"):
        ledger.close()


def test_offload_is_expressed_by_every_engine(notes):
    plan = variant(plan_of("uneven-llama3-8b"), offload_optimizer=True)
    args = megatron_args(to_megatron(plan))
    assert {"--optimizer-cpu-offload", "--use-precision-aware-optimizer",
            "--use-distributed-optimizer"} <= set(args)
    assert option(args, "--optimizer-offload-fraction") == "1.0"
    # (the golden plan predates recorded state layouts, which the one note says)
    assert [n for n in notes if "memory not re-checked" not in n] == []
    ds = json.loads(to_deepspeed(plan))
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "DeepSpeedCPUAdam" in ds["planner"]["offload"]
    titan = to_torchtitan(plan)
    assert "enable_cpu_offload = true" in titan
    assert any(n.startswith("export torchtitan 0.2.2: optimizer offload: torchtitan cannot keep "
                            "only") for n in notes)


def test_megatron_sets_cuda_device_max_connections_as_validate_args_asks():
    tp = to_megatron(plan_of("uneven-llama3-8b"))
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in tp
    fsdp = to_megatron(variant(data_plan("llama3-8b-cp4-megatron"), zero=3))
    assert "\nunset CUDA_DEVICE_MAX_CONNECTIONS\n" in fsdp
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in fsdp
    single = to_megatron(variant(plan_of("uneven-llama3-8b"), tp=1))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in single
    # on Blackwell validate_args asks nothing (get_device_arch_version() >= 10; a new-user check
    # read the "before Blackwell" comment over the export of a B200 plan)
    plan = plan_of("uneven-llama3-8b")
    b200 = dataclasses.replace(plan, cluster={**plan.cluster, "device": "b200"})
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in to_megatron(b200)
    from planner.export.common import blackwell_or_newer  # noqa: PLC0415
    sites = dataclasses.replace(plan, cluster={**plan.cluster, "device": "b200+b200"})
    mixed = dataclasses.replace(plan, cluster={**plan.cluster, "device": "b200+h100"})
    own = {"name": "b200 (calibrated)", "fp8_block_scaling": True}  # (a device of its own)
    calibrated = dataclasses.replace(plan, cluster={**plan.cluster, "device": own["name"],
                                                    "spec": {"device": own}})
    assert blackwell_or_newer(sites) and blackwell_or_newer(calibrated)
    assert not blackwell_or_newer(mixed) and not blackwell_or_newer(plan)


def test_torchtitan_module_names_of_a_model_torchtitan_does_not_define_are_the_users(notes):
    plan = variant(plan_of("uneven-llama3-8b"), recompute="full")
    mine = dataclasses.replace(plan, model={**plan.model, "spec": "my/config.json",
                                            "source": "config"})
    for version in SUPPORTED_VERSIONS["torchtitan"]:
        notes.clear()
        text = to_torchtitan(mine, version)
        assert "embed_tokens" in text and "model.embed_tokens" not in text
        assert "tok_embeddings" not in text
        assert any("module names: torchtitan defines no model for llama3-8b" in n for n in notes)
        assert "[model]" not in text and "--module" not in text.split(")")[-1]


# ---- the command --------------------------------------------------------------------------------

def test_cli_prints_or_writes_the_export(capsys, tmp_path):
    plan = os.path.join(GOLDEN, "plans", "uneven-llama3-8b.json")
    with open(golden_path("uneven-llama3-8b", "megatron"), encoding="utf-8") as f:
        expected = f.read()
    assert main(["export", plan, "--to", "megatron"]) == 0
    assert capsys.readouterr().out == expected
    assert main(["export", plan, "--to", "megatron", "-o", str(tmp_path / "a.sh")]) == 0
    assert (tmp_path / "a.sh").read_text() == expected
    # --target, the word `plan solve` uses, is the same option
    assert main(["export", plan, "--target", "megatron", "-o", str(tmp_path / "b.sh")]) == 0
    assert (tmp_path / "b.sh").read_text() == expected
    assert main(["export", plan, "--to", "deepspeed", "-o", str(tmp_path)]) == 0
    written = tmp_path / "uneven-llama3-8b.deepspeed.json"  # named after the plan file
    assert json.loads(written.read_text())["train_batch_size"] == 64


def test_cli_errors_are_one_line_with_exit_code_2(capsys, tmp_path):
    assert main(["export", str(tmp_path / "none.json"), "--to", "torchtitan"]) == 2
    assert "not found" in capsys.readouterr().err
    d = json.loads(open(os.path.join(GOLDEN, "plans", "uneven-llama3-8b.json")).read())
    d["model"]["trace"]["repeats"] = []
    (tmp_path / "p.json").write_text(json.dumps(d))
    assert main(["export", str(tmp_path / "p.json"), "--to", "megatron"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no repeated layer list" in err
    assert main(["export", str(tmp_path / "p.json"), "--to", "deepspeed",
                 "-o", str(tmp_path / "no" / "such" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plan: error: output: folder") and "does not exist" in err


def test_torchtitan_speaks_of_module_names_only_where_a_pipeline_split_lists_them(notes):
    note = "the module names below are that model's"
    assert note not in to_torchtitan(data_plan("llama3-8b-cp4-torchtitan"))  # pp=1: none
    assert note in to_torchtitan(data_plan("llama3-70b-pp4-torchtitan"))


if __name__ == "__main__":
    regenerate()
    print(f"rewrote {len(PLANS) * len(DENSE_TARGETS)} golden exports under {GOLDEN}/exports")


def test_the_replan_hint_keeps_only_pins_the_target_can_run():
    """The `plan solve` an export suggests must itself succeed: virtual stages only with the
    interleaved schedule, experts with tp > 1 only with sequence parallelism."""
    from planner.export.replan import resolve_hint

    data = os.path.join(os.path.dirname(__file__), "data", "plans")
    vpp = load_plan(os.path.join(data, "mixtral-8x7b-ep4-etp2-megatron.json"))
    vpp.search = {**vpp.search, "options": {**vpp.search.get("options", {}),
                                            "fix": {"ep": 4, "tp": 2, "pp": 2, "vpp": 4}}}
    hint = resolve_hint(vpp, "deepspeed")
    assert "--fix ep=4,pp=2 --target deepspeed" in hint  # no vpp, no tp: DeepSpeed runs neither
    assert "vpp=4" in resolve_hint(vpp, "megatron") and "tp=2" in resolve_hint(vpp, "megatron")
    assert "--engine" not in hint  # nothing but the defaults to keep
    # the plan's MoE assumptions travel, over the target's own software
    moe = engine_settings(vpp, moe_imbalance=1.5, moe_dispatcher="allgather")
    assert " --engine megatron-core,moe_dispatcher=allgather,moe_imbalance=1.5 " in \
        resolve_hint(moe, "megatron")
    # less the settings the target refuses (DeepSpeed dispatches by all-to-all only; torchtitan
    # drops no tokens and pads none), which would make the suggested command fail
    assert " --engine deepspeed,moe_imbalance=1.5 " in resolve_hint(moe, "deepspeed")
    padded = engine_settings(vpp, moe_capacity_factor=1.25, moe_pad_to_capacity=True,
                             moe_imbalance=1.5)
    assert " --engine megatron-core,moe_imbalance=1.5,moe_capacity_factor=1.25," \
           "moe_pad_to_capacity=true " in resolve_hint(padded, "megatron")
    assert " --engine torchtitan,moe_imbalance=1.5 " in resolve_hint(padded, "torchtitan")


def test_the_replan_hint_gives_the_cluster_back():
    """A resized preset keeps its resize; a cluster read from a YAML file (which the plan does not
    name) is CLUSTER_YAML, not its name, which `plan solve --cluster` would refuse (a new-user
    check ran the hint and got "unknown cluster 'my-h100'")."""
    from costmodels.topology import get_cluster
    from planner.export.replan import cluster_args

    resized = get_cluster("dgx-h100", nodes=4, gpus_per_node=4).summary()
    assert cluster_args(resized) == "--cluster dgx-h100 --nodes 4 --gpus-per-node 4"
    assert cluster_args(get_cluster("dgx-h100", nodes=2).summary()) == \
        "--cluster dgx-h100 --nodes 2"
    own = {**resized, "name": "my-h100", "spec": {**resized["spec"], "name": "my-h100"}}
    assert cluster_args(own) == "--cluster CLUSTER_YAML --nodes 4 --gpus-per-node 4"
    # a preset's name over other links is the user's file too
    slower = {**resized, "spec": {**resized["spec"], "inter_node": {
        **resized["spec"]["inter_node"], "bandwidth_GBps": 12.5}}}
    assert cluster_args(slower).startswith("--cluster CLUSTER_YAML")
    # a calibrated preset is that preset and a calibration, not a YAML (a new-user check)
    calibrated = {**get_cluster("cpu").summary(), "name": "cpu+calibration"}
    assert cluster_args(calibrated) == "--cluster cpu --nodes 1 --calibration CALIBRATION_JSON"


def test_a_dropless_engine_says_it_pads_no_expert(notes):
    """A plan priced with every expert padded to capacity, exported to an engine whose MoE drops
    and pads nothing: one note names both settings; Megatron-LM pads as planned."""
    plan = engine_settings(data_plan("mixtral-8x7b-ep8-torchtitan"), moe_capacity_factor=1.25,
                           moe_pad_to_capacity=True)
    export(plan, "torchtitan", "0.2.2")
    assert [n for n in notes if "moe_pad_to_capacity" in n] == [
        n for n in notes if "drops no tokens and pads none" in n] != []
    notes.clear()
    args = megatron_args(to_megatron(engine_settings(
        data_plan("mixtral-8x7b-ep8-megatron"), moe_capacity_factor=1.25,
        moe_pad_to_capacity=True)))
    assert "--moe-pad-expert-input-to-capacity" in args and not notes
    # the re-plan command for torchtitan says what it leaves out (a new-user check ran it and
    # got a dropless plan with nothing said)
    hint = resolve_hint(plan, "torchtitan")
    assert hint.endswith("--target torchtitan  # without moe_capacity_factor=1.25, "
                         "moe_pad_to_capacity=true, which torchtitan does not run")


def test_a_plan_whose_layer_stacks_are_not_as_written_is_bad_input():
    """A hand-edited plan file: its model.trace.repeats named in one line, not a traceback."""
    plan = data_plan("mixtral-8x7b-ep8-megatron")
    for repeats, field in (["1e999"], "repeats[0]"), ("layers", "repeats"):
        bad = dataclasses.replace(plan, model={**plan.model, "trace": {
            **plan.model["trace"], "repeats": repeats}})
        with pytest.raises(SpecError, match=rf"^model\.trace\.{re.escape(field)}: expected"):
            export(bad, "megatron")


def test_export_into_a_folder_names_the_file_after_the_plan(tmp_path, capsys):
    """Two plans of one model exported into one folder do not overwrite each other."""
    import shutil
    from planner.cli.main import main

    for stem in ("a", "b"):
        shutil.copy(os.path.join(GOLDEN, "plans", "uneven-llama3-8b.json"),
                    tmp_path / f"{stem}.json")
        assert main(["export", str(tmp_path / f"{stem}.json"), "--to", "megatron", "-o",
                     str(tmp_path)]) == 0
    capsys.readouterr()
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".json"))
    assert len(names) == 2 and names[0].startswith("a.") and names[1].startswith("b.")
    # a folder named with a trailing slash is made, as docs/exports.md's `-o out/` writes it
    assert main(["export", str(tmp_path / "a.json"), "--to", "megatron", "-o",
                 f"{tmp_path / 'out'}/"]) == 0
    assert os.listdir(tmp_path / "out") == [names[0]]
    assert main(["export", str(tmp_path / "a.json"), "--to", "megatron", "-o",
                 f"{tmp_path / 'no' / 'out'}/"]) == 2  # only the last folder is made
    assert "folder" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert main(["export", str(tmp_path / "a.json"), "--to", "megatron", "-o",
                 f"{tmp_path / 'a.json'}/"]) == 2  # a file named as a folder (a review)
    assert "is a file, not a folder" in capsys.readouterr().err


def test_bf16_gradient_reduction_exports_as_megatrons_flag():
    """A plan priced with gradients kept and reduced in bf16 (Megatron-Bridge's performance
    configurations) asks Megatron-LM for it; the default fp32 main gradients add nothing."""
    plan = plan_of("uneven-llama3-8b")
    assert "--grad-reduce-in-bf16" not in megatron_args(to_megatron(plan))
    bf16 = dataclasses.replace(plan, training={**plan.training, "engine": {
        **plan.training.get("engine", {}), "state_layout": "megatron-bf16-grads"}})
    args = megatron_args(to_megatron(bf16))
    assert "--grad-reduce-in-bf16" in args
    for version in ("0.14.0", "0.19.0"):  # an option of both releases' parsers
        here = os.path.dirname(os.path.abspath(__file__))
        recorded = json.load(open(os.path.join(here, "data", f"megatron-core_v{version}.json")))
        assert any("--grad-reduce-in-bf16" in o["options"] for o in recorded["options"])


def test_megatron_maps_ranks_tp_pp_dp_only_where_experts_and_attention_share_dp(notes):
    """Megatron-Core's initialize_model_parallel asserts, for an order not ending in pp with a
    pipeline, that the experts' data-parallel size is the attention's: ep x etp = tp x cp."""
    plan = variant(data_plan("mixtral-8x7b-ep8-megatron"), placement="tp-pp-dp", pp=2, dp=4)
    folded = variant(plan, tp=8, ep=8, etp=1, sequence_parallel=True)
    assert "--use-tp-pp-dp-mapping" in megatron_args(to_megatron(folded)) and not notes
    apart = variant(plan, tp=1, ep=8, etp=1, dp=32)
    assert "--use-tp-pp-dp-mapping" not in megatron_args(to_megatron(apart))
    assert any("ep x etp = tp x cp" in n for n in notes)
    # (the expert groups move with the order too: said, as a new-user check asked)
    assert any("whose expert-parallel groups (the all-to-alls) span other ranks than planned "
               "(not priced here)" in n for n in notes)


def test_torchtitan_shards_whenever_context_parallelism_is_on(notes):
    """ParallelDims.fsdp_enabled is dp_shard or cp: a ZeRO-0 plan with cp > 1 runs FSDP over
    dp_shard x cp, and says so, even without data parallelism."""
    tomllib = pytest.importorskip("tomllib")
    for dp in (4, 1):
        plan = variant(data_plan("llama3-8b-cp4-torchtitan"), zero=0, dp=dp, recompute="full")
        notes.clear()
        par = tomllib.loads(to_torchtitan(plan))["parallelism"]
        assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
                par["fsdp_reshard_after_forward"]) == (1, dp, "never")
        assert any("ZeRO-0 with cp=4: torchtitan shards the model states" in n for n in notes)


def test_torchtitan_says_it_has_no_model_for_a_mixtral_without_a_pipeline(notes):
    plan = data_plan("mixtral-8x7b-ep8-torchtitan")
    text = to_torchtitan(variant(plan, pp=1, dp=plan.parallel["dp"] * 2, schedule="1f1b"))
    assert "\n[model]" not in text
    assert any("torchtitan defines no model for mixtral-8x7b" in n for n in notes)


@pytest.mark.parametrize("stem,pins,target,dropped", [
    ("mixtral-8x7b-ep8-deepspeed", {"ep": 8, "cp": 2, "zero": 3}, "deepspeed", "zero=3"),
    ("llama3-8b-cp4-torchtitan", {"cp": 4, "zero": 0}, "torchtitan", "zero=0"),
    ("mixtral-8x7b-ep4-etp2-megatron", {"ep": 4, "tp": 2, "etp": 2}, "megatron", "etp=2"),
    ("mixtral-8x7b-ep8-megatron", {"ep": 8, "tp": 1, "pp": 2, "placement": "tp-pp-dp"},
     "megatron", "placement=tp-pp-dp"),
    # DeepSpeed runs context parallelism beside data parallelism only (a rule between two pins)
    ("mixtral-8x7b-ep8-deepspeed", {"ep": 8, "cp": 2, "pp": 2}, "deepspeed", "cp=2"),
])
def test_the_replan_hint_keeps_no_pin_the_targets_rules_refuse(stem, pins, target, dropped):
    """The re-plan an export suggests after refusing a plan passes the target's own pin checks."""
    from planner import SearchOptions, targets
    from planner.export.replan import resolve_hint
    from planner.options import parse_fix

    plan = data_plan(stem)
    if "etp" in pins:  # gpt-oss's experts carry biases, which Megatron splits with etp 1 only
        plan = dataclasses.replace(plan, model={**plan.model, "name": "gpt-oss-120b",
                                                "spec": "gpt-oss-120b"})
    plan.search = {**plan.search, "options": {**plan.search.get("options", {}), "fix": pins}}
    hint = resolve_hint(plan, target)
    assert dropped not in hint
    fix = hint.split(" --fix ")[1].split(" ")[0] if " --fix " in hint else ""
    targets.restrict(SearchOptions(fix=parse_fix(fix)), target)  # no SpecError


def test_a_replan_hint_drops_an_exchange_the_target_does_not_run_over_the_attention():
    """Megatron runs latent attention (DeepSeek-V3) with p2p or a2a+p2p only, and a window or
    sinks (gpt-oss) with a2a (and all-gather) only: a hint keeps a pinned cp_comm only where the
    re-plan would take it."""
    base = data_plan("llama3-8b-cp4-megatron")
    for spec, dropped, kept in (("deepseek-v3", "a2a", "p2p"), ("gpt-oss-120b", "p2p", "a2a")):
        for form, stays in ((dropped, False), (kept, True)):
            plan = dataclasses.replace(base, model={**base.model, "spec": spec}, search={
                **base.search, "options": {"fix": {"cp": 2, "cp_comm": form}}})
            hint = resolve_hint(plan, "megatron")
            assert (f"cp_comm={form}" in hint) == stays, hint


def test_site_node_ranks_count_each_sites_own_nodes(notes):
    """Groups whose nodes hold different numbers of GPUs: node ranks follow each group's nodes
    (named groups: a cluster of node groups, not sites, lists no links between sites)."""
    plan = data_plan("llama3-70b-pp4-megatron")  # 64 GPUs, 16 per stage
    sites = ["big", "big", "small", "small"]
    groups = [{"name": "big", "gpus_per_node": 8, "nodes": 4, "device": "h100"},
              {"name": "small", "gpus_per_node": 4, "nodes": 8, "device": "h100"}]
    staged = dataclasses.replace(plan, cluster={**plan.cluster, "groups": groups},
                                 stages=[{**st, "group": sites[st["pipeline_rank"]]}
                                         for st in plan.stages])
    to_megatron(staged)
    note = next(n for n in notes if "groups:" in n)
    assert "as the plan chains the groups" in note and "naive" not in note
    # (consecutive stages on one group in one span: a new-user check read eight spans for two
    # sites)
    assert "ranks 0-31 (stages 0-1, node ranks 0-3) on big, ranks 32-63 (stages 2-3, node ranks " \
           "4-11) on small" in note


def test_a_plan_priced_for_other_software_says_so_once_per_export(notes):
    """A plan for --target any is priced as Megatron-Core runs it; exported to torchtitan, the
    layout runs at torchtitan's speed, which the note says with the command that prices it so.
    A plan priced for the target's own software gets no such note."""
    from costmodels.engine import PRESETS

    plan = variant(data_plan("mixtral-8x7b-ep8-deepspeed"), recompute="full")  # (room for
    to_torchtitan(plan, "0.2.2")  # torchtitan's eager kernels)
    timing = [n for n in notes if ": timing: " in n]
    assert len(timing) == 1 and "not for what torchtitan runs (--engine torchtitan)" in timing[0]
    notes.clear()
    to_torchtitan(engine_settings(plan, **PRESETS["torchtitan"]), "0.2.2")
    # MoE settings are the plan's assumptions, kept by a re-plan: not other software
    to_torchtitan(engine_settings(plan, **{**PRESETS["torchtitan"],
                                           "moe_probs_in_activation": True}), "0.2.2")
    to_megatron(plan)
    assert not [n for n in notes if ": timing: " in n]


def test_an_engine_laying_the_states_out_otherwise_prices_the_memory_again(notes):
    """A plan priced with one engine's layout of the model states is priced again with the
    target's, even when no knob changes: refused with the numbers when a rank no longer fits;
    noted when it does, or when the model cannot be priced again here."""
    # pp=4, ZeRO-3, priced for Megatron (the file predates recorded layouts: say it so)
    megatron = engine_settings(data_plan("llama3-70b-pp4-zero3-megatron"), state_layout="megatron")
    with pytest.raises(InfeasibleError, match=r"^no torchtitan export fits: "
                                              r"with the model states as "
                                        r"torchtitan's FSDP2 lays them out .* needs [0-9.]+ GB "
                                        r"per GPU, more than the 80.2 GB usable"):
        to_torchtitan(megatron, "0.2.2")
    to_megatron(data_plan("llama3-8b-cp4-torchtitan"))  # FSDP2's layout -> Megatron-Core's
    assert [n for n in notes if "memory re-checked with the model states as Megatron-Core lays "
            "them out" in n and "still within" in n]
    notes.clear()
    to_megatron(data_plan("llama3-8b-cp4-megatron"))  # its own layout: nothing to re-check
    assert not [n for n in notes if "re-checked" in n]
    elsewhere = dataclasses.replace(megatron, model={**megatron.model, "spec": "my/config.json"})
    with pytest.raises(SpecError, match="my/config.json"):  # a change the engine forces: needed
        to_deepspeed(elsewhere)
    cp = data_plan("llama3-8b-cp4-torchtitan")
    to_megatron(dataclasses.replace(cp, model={**cp.model, "spec": "my/config.json"}))
    assert [n for n in notes if "memory not re-checked with the model states as Megatron-Core"
            in n and "my/config.json" in n]


def test_export_takes_a_plan_files_path_too(tmp_path):
    from planner.export import export
    path = os.path.join(ENGINE_PLANS, "llama3-8b-cp4-megatron.json")
    text, name = export(path, "megatron")
    assert name == "llama3-8b-cp4-megatron.megatron.sh"
    assert text == export(data_plan("llama3-8b-cp4-megatron"), "megatron",
                          stem="llama3-8b-cp4-megatron")[0]
    with pytest.raises(SpecError, match="^export: expected a Plan or a plan file's path, got int"):
        export(3, "megatron")


def test_a_plan_that_does_not_record_its_layout_says_its_memory_is_not_checked_again(notes):
    old = data_plan("llama3-70b-pp4-zero3-megatron")  # made before plans recorded the layout
    to_torchtitan(old, "0.2.2")
    assert [n for n in notes if "memory not re-checked with the model states as torchtitan's "
            "FSDP2 lays them out" in n and "the plan does not record how it laid them out" in n
            and "--target torchtitan` prices it" in n]
    # made for Megatron-LM before the target knew Megatron-FSDP runs without a pipeline: its
    # nearest, ZeRO-1, does not fit (exit 3, with the command that plans for Megatron-LM)
    with pytest.raises(InfeasibleError, match=r"^no megatron export fits: "
                                              r"with ZeRO-1 instead of the "
                                              r"plan's ZeRO-3 .* --target megatron`$"):
        to_megatron(old)


def test_a_v100_plan_is_exported_as_its_engine_runs_there(tiny_llama_config, tmp_path):
    """V100s have no FlashAttention and no bf16 (a new-user check): a plan made for Megatron-LM
    there is priced with attention's scores in memory, as the export's engine runs it, so the
    export neither says it was priced for other software nor re-checks its memory with
    FlashAttention; torchtitan, which trains in bf16 or fp32 only, refuses an fp16 plan."""
    import planner

    plan = planner.plan(tiny_llama_config, cluster="dgx1-v100", nodes=1, global_batch=16,
                        seq_len=64, dtype="fp16", target="megatron")
    text, _ = export(plan, "megatron")
    assert "timing: the plan was priced" not in text and "memory re-checked" not in text
    with pytest.raises(SpecError, match=r"^export torchtitan: dtype fp16, .* v100 has no "
                                        r"bfloat16; re-plan with --dtype fp32"):
        export(plan, "torchtitan")


def test_torchtitan_says_its_deepseek_v3_runs_flex_attention(notes):
    """torchtitan 0.2.2's deepseek_v3 flavors set attn_type "flex" with a block-causal mask; the
    plan priced fused causal attention, so the export says the attention time differs."""
    plan = data_plan("mixtral-8x7b-ep8-torchtitan")
    deepseek = dataclasses.replace(plan, model={**plan.model, "spec": "deepseek-v3",
                                                "name": "deepseek-v3"})
    to_torchtitan(deepseek, "0.2.2")
    assert [n for n in notes if "FlexAttention with a block-causal mask" in n]
    notes.clear()
    to_torchtitan(plan, "0.2.2")
    assert not [n for n in notes if "FlexAttention" in n]


def test_megatron_export_of_a_model_outside_the_zoo_says_to_check_megatron_builds_it(notes):
    """Megatron-LM builds its own transformer from the arguments: a model given as a config or
    a factory (a ViT in a new-user check) is said not to be one the export knows it builds."""
    plan = data_plan("llama3-8b-cp4-megatron")
    to_megatron(plan)
    assert not any("is not one of the planner's zoo models" in n for n in notes)
    vit = dataclasses.replace(plan, model={**plan.model, "source": "hf-config",
                                           "model_type": "vit", "name": "vit-86.6M"})
    text = to_megatron(vit)
    assert any("vit-86.6M (vit) is not one of the planner's zoo models" in n for n in notes)
    assert "check that Megatron-Core defines this architecture" in text


def test_every_engine_export_says_which_parameters_the_plan_priced_frozen(notes):
    """The exports carry the layout, not which parameters train: a plan of a model with frozen
    parameters says so, with the counts, in each engine's text."""
    for to_engine, name in ((to_megatron, "megatron"), (to_torchtitan, "torchtitan"),
                            (to_deepspeed, "deepspeed")):
        plan = data_plan(f"llama3-70b-pp4-{name}")
        notes.clear()
        to_engine(plan)
        assert not any("frozen" in n for n in notes)
        frozen = dataclasses.replace(plan, model={**plan.model, "source": "factory",
                                                  "frozen_params": plan.model["num_params"] - 1000})
        notes.clear()
        text = to_engine(frozen)
        (note,) = [n for n in notes if "frozen parameters" in n]
        assert "frozen parameters: 1,000 of its " in note and f"; {name} trains" in note
        assert "1,000 of its" in text
        # a model built from its configuration froze them itself (Whisper's positions): no
        # fine-tuning setup to repeat (a new-user check)
        notes.clear()
        to_engine(dataclasses.replace(frozen, model={**frozen.model, "source": "hf-config"}))
        (note,) = [n for n in notes if "frozen parameters" in n]
        assert "as transformers builds the model" in note and "LoRA" not in note


def test_data_parallel_across_sites_exports_its_replicate_groups(tmp_path, notes):
    """A plan of data parallelism across two sites (dp_replicate = 2): Megatron-LM one
    distributed-optimizer instance per site, torchtitan HSDP (replicate x shard), DeepSpeed a
    flat reduction, noted; every export says to number the nodes site after site."""
    from costmodels.sites import sites_from_mapping  # noqa: PLC0415
    from planner.api import plan_prepared, prepare  # noqa: PLC0415
    from planner.options import SearchOptions, TrainingSpec  # noqa: PLC0415
    from tests.conftest import TINY_LLAMA, write_config  # noqa: PLC0415

    site = {"device": "a100-80g", "nodes": 2, "gpus_per_node": 2,
            "intra_node": {"bandwidth": "300GB/s", "latency": "3us"},
            "inter_node": {"bandwidth": "25GB/s", "latency": "10us"}}
    hc = sites_from_mapping({"name": "two", "sites": [{**site, "name": "a"}, {**site, "name": "b"}],
                             "links": [{"between": ["a", "b"], "bandwidth": "10Gbps",
                                        "latency": "5ms"}]})
    prepared = prepare(write_config(tmp_path, TINY_LLAMA), seq_len=256, dtype="bf16",
                       cache_dir=None)
    plan = plan_prepared(prepared, hc, TrainingSpec(global_batch=64, seq_len=256), SearchOptions(
        top_k=0, across_sites="replicas", fix={"dp": 8, "zero": 1}))
    assert plan.parallel["dp_replicate"] == 2 and plan.parallel["dp"] == 8
    megatron = to_megatron(plan)
    assert "--num-distributed-optimizer-instances 2" in megatron
    assert "launch with the nodes numbered site after site, ranks 0-3 (node ranks 0-1) on a, " \
           "ranks 4-7 (node ranks 2-3) on b" in " ".join(megatron.replace("#", "").split())
    titan = to_torchtitan(plan)
    assert "data_parallel_replicate_degree = 2" in titan and \
        "data_parallel_shard_degree = 4" in titan
    notes.clear()
    to_deepspeed(plan)
    assert [n for n in notes if "DeepSpeed's ZeRO reduces the gradients over every" in n]
    assert [n for n in notes if "numbered site after site" in n]


def test_an_overlap_the_plan_never_priced_is_not_called_a_slowdown(notes):
    """A new-user check: moe_overlap asked for, on a configuration that does not run it (full
    recomputation), was exported to torchtitan and DeepSpeed as 'they run exposed (a slower step
    than planned)', where the plan had priced them exposed too."""
    plan = engine_settings(data_plan("mixtral-8x7b-ep8-torchtitan"), moe_overlap=True)
    for recompute, slower in (("none", True), ("full", False)):
        notes.clear()
        to_torchtitan(variant(plan, recompute=recompute))
        said = [n for n in notes if "moe_overlap" in n and "a slower step than" in n]
        assert bool(said) == slower, (recompute, notes)
    assert variant(plan, recompute="full").moe_overlap_blockers() == ["no full recomputation"]


def test_a_replan_an_engine_cannot_fit_with_its_pins_says_which_to_leave_out():
    """A new-user check copied the DeepSpeed refusal's re-plan (pp=4 pinned, tp=1 forced: no
    tensor parallelism beside a pipeline there) and got exit 3: the command says to leave pp out
    where nothing fits with it."""
    plan = data_plan("llama3-70b-pp4-zero3-megatron")
    with pytest.raises(InfeasibleError) as err:
        to_deepspeed(plan)
    assert "--fix pp=4,schedule=1f1b --target deepspeed  # deepspeed runs no tensor " \
           "parallelism beside a pipeline: if nothing fits with pp=4, leave pp out`" in \
           str(err.value)
    assert "leave pp out" not in resolve_hint(plan, "megatron")  # (it runs tp beside pp)



def test_tied_embeddings_are_traced_and_noted_in_torchtitan(notes, tiny_gpt2, tiny_llama):
    """A review: a Llama config that ties its embedding and head was exported to torchtitan's
    llama3, which (0.2.2) has no tying, and nothing said so. GPT-2 ties; the tiny Llama does
    not. 0.3.0 ties through its flavor but refuses tying beside a pipeline."""
    assert tiny_gpt2.info.get("tied_embeddings") is True
    assert tiny_llama.info.get("tied_embeddings") is False
    plan = variant(plan_of("uneven-llama3-8b"), recompute="full")
    assert plan.parallel["pp"] > 1
    mine = dataclasses.replace(plan, model={**plan.model, "spec": "my/config.json",
                                            "source": "config", "model_type": "llama",
                                            "name": "tied-llama", "tied_embeddings": True})
    to_torchtitan(mine, "0.2.2")
    assert any("tied-llama ties its input embedding and output head (one weight); torchtitan "
               "0.2.2's llama3 has no weight tying" in n for n in notes), notes
    with pytest.raises(SpecError, match=r"^export torchtitan: tied-llama ties its input embedding "
                                        r"and output head \(one weight\), and torchtitan 0\.3\.0 "
                                        r"refuses weight tying with pipeline parallelism; re-plan "
                                        r"with `plan solve .*--fix (.*,)?pp=1[,' ]"):
        to_torchtitan(mine, "0.3.0")
    notes.clear()
    qwen = dataclasses.replace(mine, model={**mine.model, "model_type": "qwen3"})
    to_torchtitan(qwen, "0.2.2")
    assert any(f"with pp={plan.parallel['pp']} torchtitan 0.2.2's pipeline split puts them on "
               "different stages, each its own copy" in n for n in notes), notes
    notes.clear()
    to_torchtitan(dataclasses.replace(mine, model={**mine.model, "tied_embeddings": False}))
    assert not any("ties its input embedding" in n for n in notes)


def test_tied_embeddings_over_a_pipeline_are_noted_for_deepspeed_and_untied_for_megatron(notes):
    """A new-user check: a T5 whose head shares the embedding's weight, split over 4 stages, was
    exported with nothing said (DeepSpeed needs one TiedLayerSpec for the pair); Megatron ties
    the two unless told, so a model that keeps them apart gets the flag to pass."""
    plan = variant(plan_of("uneven-llama3-8b"), recompute="full")
    tied = dataclasses.replace(plan, model={**plan.model, "name": "tied", "tied_embeddings": True})
    to_deepspeed(tied)
    assert any("tied ties its input embedding and output head (one weight), which the first and "
               "the last stage hold: give both one deepspeed.pipe.TiedLayerSpec" in n
               for n in notes), notes
    notes.clear()
    to_megatron(tied)
    assert not any("untie" in n for n in notes)
    apart = dataclasses.replace(plan, model={**plan.model, "name": "apart",
                                             "tied_embeddings": False})
    to_megatron(apart)
    assert any("apart keeps its input embedding and output head apart: pass "
               "--untie-embeddings-and-output-weights" in n for n in notes), notes
    notes.clear()
    to_deepspeed(apart)
    assert not any("TiedLayerSpec" in n for n in notes)

def test_torchtitan_names_a_llama_of_other_dimensions_as_its_own_llama3(notes):
    """A config of an architecture torchtitan defines, at a size it has no flavor of, is that
    model with a flavor of the user's: its module names are torchtitan's, and the note says to
    register the flavor (the plan's Hugging Face names would match nothing in its split). (Full
    recomputation: no memory re-check, which would trace the config.)"""
    plan = variant(plan_of("uneven-llama3-8b"), recompute="full")
    mine = dataclasses.replace(plan, model={**plan.model, "spec": "my/config.json",
                                            "source": "config", "model_type": "llama",
                                            "num_params": 509_000_000, "name": "llama-509M"})
    assert names.torchtitan_model(mine) is None and names.torchtitan_family(mine) == "llama3"
    for version in SUPPORTED_VERSIONS["torchtitan"]:
        notes.clear()
        text = to_torchtitan(mine, version)
        assert names.torchtitan_names(mine, version) == names.torchtitan_names(plan, version)
        assert "tok_embeddings" in text and "model.layers" not in text
        assert any("torchtitan has no flavor of llama3 with llama-509M's dimensions" in n
                   for n in notes)
    other = dataclasses.replace(mine, model={**mine.model, "model_type": "my_arch"})
    assert names.torchtitan_names(other, "0.2.2") is None
    parts, wrapper = names.top_level_names(other)
    assert wrapper == "model." and parts[0][0] == "embed_tokens" and parts[-1][-1] == "lm_head"
    nested = dataclasses.replace(other, stages=[  # (wrappers within wrappers: a review)
        {**st, "modules": [m.replace("model.", "model.language_model.") for m in st["modules"]]}
        for st in other.stages])
    assert names.top_level_names(nested) == (parts, "model.language_model.")


def test_a_bert_plan_exported_to_megatron_names_its_script(notes):
    """A new-user check: zoo bert-large was exported to Megatron as 'every knob expressed
    exactly', for pretrain_gpt.py (a causal decoder); core_v0.19.0 has no BERT script."""
    plan = variant(plan_of("uneven-llama3-8b"), recompute="full")
    bert = dataclasses.replace(plan, model={**plan.model, "name": "bert-x", "model_type": "bert"})
    to_megatron(bert, "core_v0.19.0")
    assert any("bert-x is a BERT encoder, and Megatron-LM core_v0.19.0 has no BERT script" in n
               for n in notes), notes
    notes.clear()
    to_megatron(bert, "core_v0.14.0")
    assert any("bert-x is a BERT encoder: pass these arguments to pretrain_bert.py" in n
               for n in notes), notes
