"""Record Megatron-LM's command-line options at a pinned release, as test data; or run its own
``validate_args`` on an exported file.

Megatron-LM's argument parser lives in ``megatron/training/arguments.py``, which the
``megatron-core`` wheel does not ship, and importing it needs triton and CUDA-era packages. So the
tests read a record of it instead: every option of ``add_megatron_arguments`` (its names, kind,
nargs, type and choices), made by this script from a checkout at a tag and stored with the commit
in ``data/megatron-<tag>.json``. tests/planner/export/test_engines.py rebuilds an argparse parser
from the record and parses each Megatron export with it.

    # record (a git directory of NVIDIA/Megatron-LM, e.g. a bare clone, and a tag):
    python tests/planner/export/record_megatron_options.py record GIT_DIR core_v0.14.0
    # run Megatron-LM's parser, validate_args and Megatron-Core's TransformerConfig on an export
    # (a one-off check, not a test):
    python tests/planner/export/record_megatron_options.py validate GIT_DIR core_v0.19.0 \\
        args.sh --num-gpus 64 -- --hidden-size 8192 --num-attention-heads 64 ...

Both import Megatron-LM, so run them with triton and six importable (after ``make engines-full``:
``PYTHONPATH=.venv/engines/torchtitan-runtime`` plus ``pip install --target`` six); Megatron-LM
releases from 2026 use ``typing.override`` (Python 3.12), which the script provides on 3.11 from
typing_extensions. ``validate`` pretends a Hopper GPU (``get_device_arch_version`` = 9, compute
capability 9.0) and the given world size; nothing is launched. After validate_args it builds the
TransformerConfig as pretrain_gpt.py does (``core_transformer_config_from_args``), whose checks
cover expert parallelism with tensor parallelism and the EP all-to-all overlap. Without Transformer
Engine installed, pass ``--no-rope-fusion`` with the model arguments (TransformerConfig asks TE for
the fused RoPE otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def checkout(git_dir: str, ref: str, into: str) -> str:
    """Extract ``megatron/`` at ``ref`` into ``into``; return the commit."""
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", commit, "megatron"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return commit


def import_arguments(root: str):
    import typing  # noqa: PLC0415
    if not hasattr(typing, "override"):
        import typing_extensions  # noqa: PLC0415
        typing.override = typing_extensions.override
    sys.path.insert(0, root)
    from megatron.training import arguments  # noqa: PLC0415
    return arguments


def options(arguments) -> list[dict]:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    out = []
    for action in parser._actions:  # noqa: SLF001 - argparse keeps them here
        if not action.option_strings or isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        kind = type(action).__name__.strip("_").removesuffix("Action").lower() or "store"
        kind = {"storetrue": "store_true", "storefalse": "store_false",
                "storeconst": "store_const", "booleanoptional": "boolean_optional"}.get(kind, kind)
        typ = getattr(action.type, "__name__", None) if action.type is not None else None
        choices = None if action.choices is None else [
            c if isinstance(c, (str, int, float, bool)) else str(c) for c in action.choices]
        out.append({"options": sorted(action.option_strings), "dest": action.dest, "kind": kind,
                    "nargs": action.nargs, "type": typ, "choices": choices})
    return sorted(out, key=lambda o: o["options"][0])


def record(git_dir: str, ref: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        commit = checkout(git_dir, ref, tmp)
        opts = options(import_arguments(tmp))
    path = os.path.join(DATA, f"megatron-{ref}.json")
    doc = {"source": "NVIDIA/Megatron-LM megatron/training/arguments.py add_megatron_arguments",
           "ref": ref, "commit": commit, "made_by": "tests/planner/export/"
           "record_megatron_options.py", "options": opts}
    os.makedirs(DATA, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    return f"{len(opts)} options of {ref} ({commit}) -> {path}"


def sourced(path: str, array: str) -> tuple[list[str], dict]:
    """The array and the exported environment of a bash file."""
    script = (f'source "$1" >/dev/null && printf "%s\\0" "${{{array}[@]}}" && printf "\\1" && '
              'env -0')
    out = subprocess.run(["bash", "-c", script, "bash", path], capture_output=True,
                         check=True).stdout
    args, env = out.split(b"\1", 1)
    pairs = [e.decode().split("=", 1) for e in env.split(b"\0") if b"=" in e]
    return [a.decode() for a in args.split(b"\0")[:-1]], dict(pairs)


def validate(git_dir: str, ref: str, path: str, gpus: int, model_args: list[str]) -> str:
    args, env = sourced(path, "MEGATRON_PARALLEL_ARGS")
    for key in ("CUDA_DEVICE_MAX_CONNECTIONS",):
        if key in env:
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)
    os.environ.update({"WORLD_SIZE": str(gpus), "RANK": "0"})
    with tempfile.TemporaryDirectory() as tmp:
        commit = checkout(git_dir, ref, tmp)
        arguments = import_arguments(tmp)
        arguments.get_device_arch_version = lambda: 9  # a Hopper GPU, as on H100 clusters
        import torch  # noqa: PLC0415
        torch.cuda.get_device_capability = lambda *a: (9, 0)  # --moe-grouped-gemm asks
        parser = argparse.ArgumentParser(allow_abbrev=False)
        arguments.add_megatron_arguments(parser)
        ns = parser.parse_args(args + model_args)
        ns.rank, ns.world_size = 0, gpus
        arguments.validate_args(ns, {})
        config = transformer_config(arguments, ns)
    return (f"Megatron-LM {ref} ({commit}): parse_args + validate_args + TransformerConfig "
            f"accepted {path} ({len(args)} exported arguments) on {gpus} ranks: "
            f"tp={ns.tensor_model_parallel_size} cp={ns.context_parallel_size} "
            f"({config.cp_comm_type}) pp={ns.pipeline_model_parallel_size} "
            f"dp={ns.data_parallel_size} ep={config.expert_model_parallel_size} "
            f"etp={config.expert_tensor_parallel_size} sp={config.sequence_parallel} "
            f"experts={config.num_moe_experts} top-k={config.moe_router_topk} "
            f"dispatcher={config.moe_token_dispatcher_type} "
            f"capacity={config.moe_expert_capacity_factor} "
            f"overlap={config.overlap_moe_expert_parallel_comm} "
            f"vpp={ns.virtual_pipeline_model_parallel_size} "
            "micro-batches="
            f"{ns.global_batch_size // (ns.micro_batch_size * ns.data_parallel_size)} "
            f"offload={ns.optimizer_cpu_offload} "
            f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS')}")


def transformer_config(arguments, ns):
    """Megatron-Core's TransformerConfig from the validated arguments, as pretrain_gpt.py builds
    it (core_transformer_config_from_args): its __post_init__ and ModelParallelConfig's run the
    checks validate_args leaves to them (expert parallelism with tensor parallelism needs sequence
    parallelism; the EP all-to-all overlap's conditions; capacity factor and dispatcher)."""
    build = getattr(arguments, "core_transformer_config_from_args", None)
    if build is None:  # core_v0.19.0 moved it
        from megatron.training.argument_utils import core_transformer_config_from_args  # noqa
        build = core_transformer_config_from_args
    return build(ns)


def main(argv: list[str]) -> None:
    model_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("git_dir")
    r.add_argument("ref")
    v = sub.add_parser("validate")
    v.add_argument("git_dir")
    v.add_argument("ref")
    v.add_argument("file")
    v.add_argument("--num-gpus", type=int, required=True)
    a = p.parse_args(argv)
    if a.cmd == "record":
        print(record(a.git_dir, a.ref))
    else:
        print(validate(a.git_dir, a.ref, a.file, a.num_gpus, model_args))


if __name__ == "__main__":
    main(sys.argv[1:])
