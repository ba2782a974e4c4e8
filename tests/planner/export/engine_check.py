"""Run an engine's own parser (or model code) on exported files; one process per engine release.

    python engine_check.py CHECK JOBS.json OUT.json

tests/planner/export/test_engines.py runs this with ``PYTHONPATH`` set to the engine's folder
under ``.venv/engines`` (installed by ``make install``; see the Makefile): two torchtitan releases
cannot share one interpreter, and the engines' imports (DeepSpeed's accelerator set-up, a fake
process group) stay out of the test process. Each job is a dict; the answer for each is a dict of
what the engine made of the file, or {"error": "..."} with the engine's own message.

CHECK is one of:
- ``torchtitan-0.2.2``: ``ConfigManager().parse_args(["--job.config_file", path])``;
- ``torchtitan-0.3.0``: the file is sourced in bash and its array (after ``args``, e.g. --module and
  --config for a model torchtitan does not define) given to ``ConfigManager().parse_args``;
- ``deepspeed``: ``DeepSpeedConfig(path, mpu)`` in a fake process group of ``world`` ranks (rank 0),
  ``mpu`` a stand-in giving the tp/pp/dp sizes (or none: DeepSpeed then counts every rank);
- ``torchtitan-split``: torchtitan's own Llama 3 ``flavor`` built on the meta device and cut into
  stages by ``stages`` (module name lists) with torchtitan's own split function; per stage the
  parameters of matrices (split by tensor parallelism) and of vectors (norms, replicated).

torchtitan's package ``__init__`` imports its quantization kernels, hence triton, which the
default install leaves out; without triton the check loads the ``torchtitan`` package without
running that ``__init__`` (the config parser does not need the kernels).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import traceback


def main(check: str, jobs_path: str, out_path: str) -> None:
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    run = {"torchtitan-0.2.2": titan_022, "torchtitan-0.3.0": titan_030,
           "deepspeed": deepspeed_config, "torchtitan-split": titan_split}[check]
    answers = []
    for job in jobs:
        try:
            answers.append(run(job))
        except SystemExit as exc:  # tyro reports a bad option by exiting
            answers.append({"error": f"parser exited ({exc.code})"})
        except Exception as exc:  # noqa: BLE001 - the engine's own refusal is the answer
            answers.append({"error": f"{type(exc).__name__}: {exc}",
                            "where": traceback.format_exc(limit=-3)})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"answers": answers, "versions": versions()}, f)


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415
    out = {}
    for name in ("torchtitan", "deepspeed", "tyro", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def import_torchtitan() -> None:
    if importlib.util.find_spec("triton") is not None:
        import torchtitan  # noqa: F401, PLC0415
        return
    spec = importlib.util.find_spec("torchtitan")
    shell = importlib.machinery.ModuleSpec("torchtitan", None, is_package=True)
    shell.submodule_search_locations = list(spec.submodule_search_locations)
    sys.modules["torchtitan"] = importlib.util.module_from_spec(shell)


def pick(obj, fields: list[str]) -> dict:
    out = {}
    for dotted in fields:
        value = obj
        for part in dotted.split("."):
            value = getattr(value, part, None)
        out[dotted] = value
    return out


FIELDS = ["parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
          "parallelism.fsdp_reshard_after_forward", "parallelism.tensor_parallel_degree",
          "parallelism.pipeline_parallel_degree", "parallelism.pipeline_parallel_schedule",
          "parallelism.pipeline_parallel_microbatch_size",
          "parallelism.module_fqns_per_model_part", "training.local_batch_size",
          "training.global_batch_size", "training.seq_len", "training.mixed_precision_param",
          "training.mixed_precision_reduce", "training.enable_cpu_offload"]


def titan_022(job: dict) -> dict:
    import_torchtitan()
    from torchtitan.config import ConfigManager  # noqa: PLC0415
    cfg = ConfigManager().parse_args(["--job.config_file", job["path"]])
    out = pick(cfg, FIELDS + ["model.name", "model.flavor", "activation_checkpoint.mode",
                              "activation_checkpoint.selective_ac_option",
                              "parallelism.enable_async_tensor_parallel", "model.converters",
                              "quantize.linear.float8.recipe_name",
                              "quantize.linear.mx.recipe_name"])
    return out


def bash_array(path: str, name: str) -> list[str]:
    script = f'source "$1" && printf "%s\\0" "${{{name}[@]}}"'
    done = subprocess.run(["bash", "-c", script, "bash", path], capture_output=True, check=True)
    return [a.decode() for a in done.stdout.split(b"\0")[:-1]]


def titan_030(job: dict) -> dict:
    import_torchtitan()
    from torchtitan.config import ConfigManager  # noqa: PLC0415
    args = list(job.get("args", [])) + bash_array(job["path"], "TORCHTITAN_ARGS")
    cfg = ConfigManager().parse_args(args)
    out = pick(cfg, FIELDS + ["parallelism.enable_sequence_parallel",
                              "compile.enable_async_tensor_parallel",
                              "training.disable_cuda_graphs"])
    ac = cfg.activation_checkpoint
    out["activation_checkpoint"] = "none" if ac is None else type(ac).__qualname__.split(".")[0]
    out["args"] = args
    return out


class StandInMpu:
    """The sizes a Megatron-style mpu (or a PipelineModule's grid) gives DeepSpeed."""

    def __init__(self, tp: int, pp: int, dp: int):
        self.tp, self.pp, self.dp = tp, pp, dp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_model_parallel_world_size(self):
        return self.tp

    def get_tensor_model_parallel_world_size(self):
        return self.tp

    def get_pipeline_model_parallel_world_size(self):
        return self.pp


def fake_group(world: int, rank: int = 0) -> None:
    import torch.distributed as dist  # noqa: PLC0415
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: PLC0415
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())


def deepspeed_config(job: dict) -> dict:
    fake_group(job["world"])
    import deepspeed.comm as ds_dist  # noqa: PLC0415
    # no shared-memory op (DeepSpeed would compile it on a CPU): the check never communicates
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    if not ds_dist.is_initialized():
        ds_dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False,
                                 dist_init_required=False)
    from deepspeed.runtime.config import DeepSpeedConfig  # noqa: PLC0415
    mpu = StandInMpu(*job["mpu"]) if job.get("mpu") else None
    cfg = DeepSpeedConfig(job["path"], mpu)
    offload = cfg.zero_config.offload_optimizer
    return {"train_batch_size": cfg.train_batch_size,
            "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
            "world_size": cfg.world_size, "zero_stage": int(cfg.zero_optimization_stage),
            "offload_optimizer": None if offload is None else str(
                getattr(offload.device, "value", offload.device)),
            "autotp_size": cfg.tensor_parallel_config.autotp_size,
            "bf16": cfg.bfloat16_config.enabled, "fp16": cfg.float16_config.enabled}


def titan_split(job: dict) -> dict:
    import torch  # noqa: PLC0415
    import_torchtitan()
    from importlib.metadata import version  # noqa: PLC0415
    with torch.device("meta"):
        if version("torchtitan") == "0.2.2":
            from torchtitan.models.llama3 import Transformer, llama3_args  # noqa: PLC0415
            whole = Transformer(llama3_args[job["flavor"]])
        else:
            from torchtitan.models.llama3 import model_registry  # noqa: PLC0415
            whole = model_registry(job["flavor"]).model.build()
    chunks = split(whole, job["stages"], job["schedule"], job["pp"])
    return {"total": sum(p.numel() for p in whole.parameters()),
            "children": [n for n, _ in whole.named_children()],
            "stages": [{"matrices": sum(p.numel() for p in c.parameters() if p.dim() > 1),
                        "vectors": sum(p.numel() for p in c.parameters() if p.dim() <= 1),
                        "modules": [n for n, m in c.named_children() if m is not None
                                    and (len(m) if hasattr(m, "__len__") else 1)]}
                       for c in chunks]}


def split(whole, stages: list[list[str]], schedule: str, degree: int) -> list:
    """Each stage's model chunk, made by torchtitan's own split: 0.3.0's ``_split_module``;
    0.2.2's ``pipeline_module_split``, once per pipeline rank of a fake process group."""
    import torch  # noqa: PLC0415
    from torchtitan.distributed import pipeline_parallel as pp  # noqa: PLC0415
    if hasattr(pp, "_split_module"):
        return [pp._split_module(whole, names) for names in stages]
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    chunks = {}
    for rank in range(degree):
        fake_group(degree, rank)
        mesh = init_device_mesh("cpu", (degree,), mesh_dim_names=("pp",))
        found, models = pp.pipeline_module_split(whole, mesh, schedule, torch.device("meta"),
                                                 stages)
        for stage, model in zip(found, models):
            chunks[stage.stage_index] = model
    return [chunks[i] for i in range(len(stages))]


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(*sys.argv[1:4])
