"""Plan -> torchtitan settings: TOML job-config sections (0.2.2) or command-line overrides (0.3.0).

torchtitan 0.2.2 reads a TOML job config (``torchtitan/config/job_config.py``, parsed by
``ConfigManager().parse_args(["--job.config_file", path])``); the export writes the sections to
merge into one. torchtitan 0.3.0 reads no TOML: a job is a Python config function chosen with
``--module``/``--config`` plus ``--section.key value`` overrides (``torchtitan/config/manager.py``),
so the export writes a bash array of those overrides. Both come from one list of settings, so the
two releases say the same thing. Mapping table and limits: docs/exports.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.memory import RECOMPUTE
from planner.errors import SpecError
from planner.export import common, names
from planner.export.shell import bash_file
from planner.export.toml import Entry, table
from planner.planfile.document import Plan
from planner import targets

TARGET = "torchtitan"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
PRECISION = {"bf16": "bfloat16", "fp32": "float32"}
ARRAY = "TORCHTITAN_ARGS"
SECTION_ORDER = ("model", "parallelism", "compile", "activation_checkpoint", "training",
                 "quantize.linear.float8", "quantize.linear.mx")
FP8 = {"current": ("quantize.linear.float8", "tensorwise"),
       "delayed": ("quantize.linear.float8", "tensorwise"),
       "block": ("quantize.linear.mx", "mxfp8_cublas")}
"""Plan FP8 recipe -> torchtitan 0.2.2 converter and its recipe_name (torchao's float8 training
scales tensorwise from the current amax and has no delayed scaling; MXFP8 is its mx converter)."""


@dataclass(frozen=True)
class Setting:
    """One option: ``[section] key = value`` in TOML, ``--section.key value`` on a command line."""

    section: str
    key: str
    value: object
    comments: tuple[str, ...] = ()


def to_torchtitan(plan: Plan, version: str | None = None) -> str:
    """The plan as torchtitan settings for ``version`` (default: planner.targets' release)."""
    version = common.engine_version(TARGET, version)
    ledger = common.Ledger(TARGET, version)
    settings = (_model(plan, version, ledger) + _data_parallel(plan, version, ledger)
                + _model_parallel(plan, version, ledger) + _training(plan, ledger)
                + _fp8(plan, version, ledger))
    ac = _activation_checkpoint(plan, ledger)
    _recheck(plan, version, ledger)
    ledger.absent(plan.parallel, tuple(common.CONTEXT_EXPERTS), common.CONTEXT_EXPERTS)
    notes = ledger.close()
    if version == "0.2.2":
        return _toml(plan, version, settings + [Setting("activation_checkpoint", k, v, c)
                                                for k, v, c in ac], notes)
    return _cli(plan, version, settings, ac, notes)


# ---- the settings --------------------------------------------------------------------------------

def _model(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    known = names.torchtitan_model(plan)
    if known is None:
        return []
    model, flavor = known
    why = (f"the plan's {plan.model['name']} is torchtitan's own {model} {flavor}; the module "
           "names below are that model's",)
    if version == "0.2.2":
        return [Setting("model", "name", model, why), Setting("model", "flavor", flavor)]
    return [Setting("cli", "--module", model, why), Setting("cli", "--config",
                                                             f"{model}_{flavor.lower()}")]


def _data_parallel(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    p = plan.parallel
    dp, zero = p["dp"], p["zero"]
    out = _offload(plan, ledger)
    if dp == 1:
        ledger.exact("dp", "zero")
        return [Setting("parallelism", "data_parallel_replicate_degree", 1,
                        ("no data parallelism (dp = 1)",)),
                Setting("parallelism", "data_parallel_shard_degree", 1)] + out
    ddp_refused = version == "0.2.2" and (p["tp"] > 1 or p["pp"] > 1)
    if zero == 0 and not ddp_refused:
        ledger.exact("dp", "zero")
        return [Setting("parallelism", "data_parallel_replicate_degree", dp,
                        (f"ZeRO-0: plain data parallelism over dp = {dp} replicas, no sharding",)),
                Setting("parallelism", "data_parallel_shard_degree", 1)] + out
    ledger.exact("dp")
    if zero == 0:
        ledger.nearest("zero", f"ZeRO-0 with tp={p['tp']} pp={p['pp']}: torchtitan 0.2.2 runs "
                       "DDP only without tensor or pipeline parallelism (its llama3 "
                       "parallelize_llama raises 'DDP has not supported > 1D parallelism'); "
                       "nearest is FSDP without resharding after forward (ZeRO-2: gradients and "
                       "optimizer states sharded too, less memory than planned, a reduce-scatter "
                       "and an all-gather per step instead of one all-reduce)")
    elif zero == 1:
        ledger.nearest("zero", "ZeRO-1 (optimizer states sharded, gradients and weights "
                       "replicated): FSDP2 always shards gradients and weights too; nearest is "
                       "FSDP without resharding after forward (ZeRO-2: the same traffic per step, "
                       "less memory than planned)")
    else:
        ledger.exact("zero")
    reshard = "always" if zero == 3 else "never"
    why = {0: "ZeRO-0 -> nearest FSDP2 setting (see the note above)",
           1: "ZeRO-1 -> nearest FSDP2 setting (see the note above)",
           2: "ZeRO-2 -> FSDP2 without resharding after forward (FSDP1's SHARD_GRAD_OP)",
           3: "ZeRO-3 -> FSDP2, weights resharded after every forward"}[zero]
    return [Setting("parallelism", "data_parallel_replicate_degree", 1, (why,)),
            Setting("parallelism", "data_parallel_shard_degree", dp),
            Setting("parallelism", "fsdp_reshard_after_forward", reshard)] + out


def _offload(plan: Plan, ledger: common.Ledger) -> list[Setting]:
    if not plan.parallel.get("offload_optimizer"):
        ledger.exact("offload_optimizer")
        return []
    ledger.nearest("offload_optimizer",
                   "optimizer offload: torchtitan cannot keep only the optimizer on the host; "
                   "nearest is training.enable_cpu_offload (FSDP2's CPUOffloadPolicy), which keeps "
                   "weights and gradients there too: less device memory than planned, but a "
                   "slower step (every all-gather reads host memory); for a plan without offload "
                   f"use `{common.resolve_hint(plan, TARGET)}`")
    return [Setting("training", "enable_cpu_offload", True,
                    ("optimizer offload -> FSDP2 CPU offload (see the note above)",))]


def _model_parallel(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    p = plan.parallel
    ledger.exact("tp")
    out = [Setting("parallelism", "tensor_parallel_degree", p["tp"])]
    if p["tp"] == 1:
        ledger.exact("sequence_parallel")
    elif version == "0.2.2":
        if p["sequence_parallel"]:
            ledger.exact("sequence_parallel")
        else:
            ledger.nearest("sequence_parallel",
                           "sequence parallelism is off in the plan, but torchtitan 0.2.2 always "
                           "applies it with tensor parallelism (less activation memory than "
                           "planned; 0.3.0 has parallelism.enable_sequence_parallel)")
    else:
        ledger.exact("sequence_parallel")
        out.append(Setting("parallelism", "enable_sequence_parallel", bool(p["sequence_parallel"]),
                           (f"sequence parallelism {'on' if p['sequence_parallel'] else 'off'}",)))
    if p["tp"] > 1:
        section = "parallelism" if version == "0.2.2" else "compile"
        out.append(Setting(section, "enable_async_tensor_parallel", False,
                           ("the plan prices synchronous TP collectives (async TP also needs "
                            "compile)",)))
    out.append(Setting("parallelism", "pipeline_parallel_degree", p["pp"]))
    ledger.exact("pp")
    if p["pp"] > 1:
        out += _pipeline(plan, version, ledger)
    else:
        ledger.exact("stages", "schedule", "vpp")
    _placement(plan, ledger)
    return out


def _placement(plan: Plan, ledger: common.Ledger) -> None:
    p = plan.parallel
    if p["pp"] > 1 and p["dp"] > 1 and common.placement(plan) == "tp-pp-dp":
        ledger.nearest("placement", "placement tp-pp-dp (pipeline neighbours on adjacent ranks): "
                       "torchtitan orders its device mesh pp, dp_replicate, dp_shard, cp, tp "
                       "(outermost first), which is tp-dp-pp; pipeline sends may cross slower "
                       "links than planned")
    else:
        ledger.exact("placement")


def _pipeline(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    p = plan.parallel
    parts = [list(st["modules"]) for st in plan.stages]
    if len(parts) != p["pp"] * p["vpp"]:
        raise SpecError(f"export torchtitan: the plan lists {len(parts)} stages for pp={p['pp']} x "
                        f"vpp={p['vpp']}; torchtitan needs one module list per (virtual) stage, "
                        "so re-create the plan or export to megatron")
    name = common.check_schedule(plan, TARGET, targets.engine(TARGET).schedules, ledger, {})
    ledger.exact("vpp", "micro_batch")
    out = [Setting("parallelism", "pipeline_parallel_schedule", SCHEDULES[name]),
           Setting("parallelism", "pipeline_parallel_microbatch_size", p["micro_batch"],
                   (f"{p['num_microbatches']} micro-batches per step = local_batch_size / this",))]
    parts, comments = _module_names(plan, version, ledger)
    out.append(Setting("parallelism", "module_fqns_per_model_part", parts, tuple(comments)))
    if version != "0.2.2":
        out.append(Setting("training", "disable_cuda_graphs", True,
                           ("torchtitan 0.3.0 refuses CUDA graphs with pipeline parallelism",)))
    return out


def _module_names(plan: Plan, version: str, ledger: common.Ledger) -> tuple[list, list[str]]:
    """(module lists per stage, comment lines); notes when the names are the user's."""
    lay = common.layout(plan)
    comments = [f"{len(plan.stages)} model parts, one per (virtual) stage"]
    if lay.stacks:
        comments.append(f"layers per stage: {common.stage_counts_text(lay)}"
                        + (" (even)" if lay.even else " (uneven)"))
    if not lay.stacks:
        ledger.info("the model has no repeated layer list: torchtitan cuts a model into stages "
                    "by deleting the modules a stage does not hold, so its forward must skip "
                    "missing modules")
    own = names.torchtitan_names(plan, version)
    if own is not None:
        ledger.exact("stages")
        model, flavor = names.torchtitan_model(plan)
        comments.append(f"module names of torchtitan's own {model} {flavor}")
        return own, comments
    ledger.nearest("stages", f"module names: torchtitan defines no model for "
                   f"{plan.model['name']}, so module_fqns_per_model_part holds the plan's "
                   "module names, which are yours: torchtitan's split keeps the named top-level "
                   "modules and entries of top-level layer lists of each stage and deletes the "
                   "rest, so the model you register with torchtitan must carry these names at "
                   "that depth")
    comments.append("module names are the plan's, i.e. your model's (see the note above)")
    return [list(st["modules"]) for st in plan.stages], comments


def _activation_checkpoint(plan: Plan, ledger: common.Ledger) -> list[tuple[str, object, tuple]]:
    """(key, value, comments) of [activation_checkpoint]; 0.3.0 takes the mode as a subcommand."""
    rc = plan.parallel["recompute"]
    if rc in ("none", "full"):
        ledger.exact("recompute")
        return [("mode", rc, (f"recompute {rc}",))]
    op = [("mode", "selective", (f"recompute {rc} -> per-op selective checkpointing",)),
          ("selective_ac_option", "op", ())]
    if rc == "op":
        ledger.exact("recompute")
        return op
    ledger.nearest("recompute", f"recompute {rc} (Megatron-style: recompute the attention core) "
                   "-> torchtitan's per-op selective checkpointing, which keeps attention outputs "
                   "and every other matmul output and recomputes the rest")
    return op


def _recheck(plan: Plan, version: str, ledger: common.Ledger) -> None:
    """Re-price the plan as torchtitan runs it when that may need more memory: Megatron-style
    selective recomputation becomes torchtitan's per-op policy (the cost model prices both)."""
    p = plan.parallel
    if p["recompute"] != "selective" or "op" not in RECOMPUTE:
        return
    changes, words = {"recompute": "op"}, ["per-op instead of selective recomputation"]
    if p["dp"] > 1 and (p["zero"] == 1 or (p["zero"] == 0 and version == "0.2.2" and
                                           (p["tp"] > 1 or p["pp"] > 1))):
        changes["zero"] = 2
        words.append(f"ZeRO-2 instead of ZeRO-{p['zero']}")
    if p["tp"] > 1 and not p["sequence_parallel"] and version == "0.2.2":
        changes["sequence_parallel"] = True
        words.append("sequence parallelism")
    from planner.export import reprice  # lazy: prices with the search (and may trace)
    ledger.info(reprice.recheck(plan, TARGET, ", ".join(words), state_layout="zero",
                                **changes))


def _fp8(plan: Plan, version: str, ledger: common.Ledger) -> list[Setting]:
    """FP8 GEMMs: 0.2.2 converts the Linears with a model converter; 0.3.0 sets converters in the
    Python config function (its model spec is not a command-line option)."""
    if plan.training["dtype"] != "fp8":
        return []
    recipe = plan.training.get("engine", {}).get("fp8_recipe", "current")
    if version != "0.2.2":
        ledger.missing("dtype", "dtype fp8: torchtitan 0.3.0 converts Linears to FP8 in the "
                       "config function (model_registry(..., converters=[Float8LinearConverter."
                       "Config(...)]), as llama3_debugmodel_float8 does), not on the command line; "
                       "these settings train in bfloat16 unless your --config adds the converter")
        return []
    section, name = FP8[recipe]
    if recipe == "delayed":
        ledger.nearest("dtype", "fp8 with delayed scaling: torchao's float8 training (torchtitan's "
                       "converter) scales from the current amax (tensorwise); an amax read more "
                       "per cast than planned")
    return [Setting("model", "converters", [section],
                    (f"dtype fp8 ({recipe} scaling): the {section.rsplit('.', 1)[1]} converter "
                     "(needs torchao)",)),
            Setting(section, "recipe_name", name)]


def _training(plan: Plan, ledger: common.Ledger) -> list[Setting]:
    p, t = plan.parallel, plan.training
    if p["pp"] > 1:
        local, why = p["micro_batch"] * p["num_microbatches"], (
            f"per data-parallel rank: micro-batch {p['micro_batch']} x "
            f"{p['num_microbatches']} pipeline micro-batches")
    else:
        local, why = p["micro_batch"], (
            f"the micro-batch; torchtitan accumulates gradients over global / (local x dp) = "
            f"{p['num_microbatches']} steps")
    ledger.exact("micro_batch", "num_microbatches", "global_batch", "seq_len")
    dtype = PRECISION.get(t["dtype"])
    if t["dtype"] == "fp8":
        dtype = "bfloat16"  # the weights and what is not an FP8 GEMM stay bf16 (see _fp8)
        ledger.exact("dtype")
    elif dtype is None:
        dtype = "bfloat16"
        ledger.nearest("dtype", f"dtype {t['dtype']}: torchtitan's mixed precision offers "
                       "bfloat16 or float32 parameters only; nearest bfloat16 (same bytes, wider "
                       "range)")
    else:
        ledger.exact("dtype")
    return [Setting("training", "local_batch_size", local, (why,)),
            Setting("training", "global_batch_size", t["global_batch"]),
            Setting("training", "seq_len", t["seq_len"]),
            Setting("training", "mixed_precision_param", dtype, (f"dtype {t['dtype']}",)),
            Setting("training", "mixed_precision_reduce", "float32")]


# ---- writing them --------------------------------------------------------------------------------

def _intro(plan: Plan, version: str, how: list[str], notes: list[str]) -> list[str]:
    return common.header(plan, TARGET, version) + how + [
        f"Run it on exactly {plan.cluster['num_gpus']} GPUs ({plan.cluster['nodes']} nodes x "
        f"{plan.cluster['gpus_per_node']}).", ""] + common.notes_block(notes)


def _toml(plan: Plan, version: str, settings: list[Setting], notes: list[str]) -> str:
    how = ["Merge these sections into a torchtitan TOML job config ([job], tokenizer and",
           "hf_assets_path, [optimizer], data and checkpointing stay yours) and pass it with",
           "--job.config_file."]
    lines = common.comment_block(_intro(plan, version, how, notes)) + [""]
    for section in SECTION_ORDER:
        entries = [Entry(s.key, s.value, list(s.comments)) for s in settings
                   if s.section == section]
        lines += table(section, entries)
    return "\n".join(lines).rstrip("\n") + "\n"


def _cli(plan: Plan, version: str, settings: list[Setting], ac, notes: list[str]) -> str:
    model = [s for s in settings if s.section == "cli"]
    how = [f'Use: source this file, then pass "${{{ARRAY}[@]}}" to torchtitan\'s trainer, e.g.',
           f'torchrun --nnodes {plan.cluster["nodes"]} --nproc_per_node '
           f'{plan.cluster["gpus_per_node"]} -m torchtitan.train "${{{ARRAY}[@]}}"',
           "(tokenizer and hf_assets_path, optimizer, data and checkpointing stay yours; add",
           "their overrides after these)."]
    if not model:
        how.append("Put your model's --module <module> --config <config function> first.")
    groups = []
    for s in model:
        groups.append(([s.key, str(s.value)], " ".join(s.comments)))
    for section in SECTION_ORDER:
        for s in settings:
            if s.section != section:
                continue
            flag = _flag(s)
            if isinstance(s.value, list):  # one line per stage
                groups += [(flag[:1], "; ".join(s.comments))] + [([part], "") for part in flag[1:]]
            else:
                groups.append((flag, "; ".join(s.comments)))
    _, mode, comments = ac[0]
    groups.append(([f"activation-checkpoint:{mode}"], "; ".join(comments + (
        "a subcommand of torchtitan's parser: keep it last",))))
    return bash_file(common.comment_block(_intro(plan, version, how, notes)), [], ARRAY, groups)


def _flag(s: Setting) -> list[str]:
    """``--section.key value`` as torchtitan 0.3.0's parser (tyro) prints it in --help: hyphens
    in names, ``--section.no-key`` for false, stage lists as comma-joined words."""
    name = f"{s.section}.{s.key.replace('_', '-')}"
    v = s.value
    if isinstance(v, bool):
        return [f"--{name}"] if v else [f"--{s.section}.no-{s.key.replace('_', '-')}"]
    if isinstance(v, list):
        return [f"--{name}"] + [",".join(part) for part in v]
    return [f"--{name}", str(v)]
