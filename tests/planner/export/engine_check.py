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
  for both, with ``world`` in the job, the parsed parallelism also builds torchtitan's
  ``ParallelDims`` as its trainer does, and its device meshes (dense and, with experts, sparse)
  in a fake process group of ``world`` ranks;
- ``deepspeed``: ``DeepSpeedConfig(path, mpu)`` in a fake process group of ``world`` ranks (rank 0),
  ``mpu`` a stand-in giving the tp/pp/dp sizes (or none: DeepSpeed then counts every rank); a config
  with ``sequence_parallel_size`` and ``data_parallel_size`` gets the (data_parallel,
  sequence_parallel) device mesh ``deepspeed.initialize`` builds from them; a config with an
  ``expert_parallel`` section also goes through the checks AutoEP runs at initialize
  (``validate_autoep_config``, ``build_folding_spec``, ``validate_folding_global``) with the
  sizes the engine would pass (pp from the mpu, AutoTP's tp, the Ulysses size);
- ``torchtitan-split``: torchtitan's own model ``module`` (default llama3) of ``flavor``, built on
  the meta device (0.2.2: its train spec's model class and args; 0.3.0: ``model_registry``) and
  cut into stages by ``stages`` (module name lists) with torchtitan's own split function; per
  stage the parameters of matrices (split by tensor parallelism), of the routed experts (3-D
  weights of ``experts`` modules, split by expert parallelism) and of vectors (norms, replicated).

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


FIELDS = ["parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
          "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
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
                              "quantize.linear.mx.recipe_name",
                              "parallelism.context_parallel_rotate_method",
                              "parallelism.expert_tensor_parallel_degree",
                              "parallelism.expert_parallel_comm_backend"])
    if job.get("world"):
        from torchtitan.distributed import ParallelDims  # noqa: PLC0415
        par = cfg.parallelism
        out["meshes"] = meshes(lambda: ParallelDims(
            dp_shard=par.data_parallel_shard_degree,
            dp_replicate=par.data_parallel_replicate_degree,
            cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
            pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
            etp=par.expert_tensor_parallel_degree, world_size=job["world"]), job["world"])
    return out


def meshes(make, world: int) -> dict:
    """torchtitan's ParallelDims (its checks run on construction) and the sizes of its device
    meshes, built in a fake process group of ``world`` ranks as its trainer builds them."""
    fake_group(world)
    dims = make()
    if hasattr(dims, "build_mesh"):
        try:
            dims.build_mesh()
        except TypeError:  # 0.2.2 and 0.3.0 differ in whether the device type is an argument
            dims.build_mesh("cpu")
    out = {}
    for name in ("dp_replicate", "fsdp", "dp_shard", "cp", "tp", "pp", "ep", "etp", "efsdp"):
        try:
            out[name] = dims.get_mesh(name).size()
        except (KeyError, ValueError, AttributeError, RuntimeError, AssertionError):
            pass
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
    if job.get("world"):
        from torchtitan.distributed import ParallelDims  # noqa: PLC0415
        out["meshes"] = meshes(lambda: ParallelDims.from_config(cfg.parallelism, job["world"]),
                               job["world"])
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
    with open(job["path"], encoding="utf-8") as f:
        raw = json.load(f)
    mesh = None
    if "sequence_parallel_size" in raw and "data_parallel_size" in raw:  # as deepspeed.initialize
        mesh = ds_dist.initialize_mesh_device((raw["data_parallel_size"],
                                               raw["sequence_parallel_size"]),
                                              ("data_parallel", "sequence_parallel"))
    cfg = DeepSpeedConfig(job["path"], mpu, mesh_device=mesh)
    offload = cfg.zero_config.offload_optimizer
    ep = cfg.expert_parallel_config
    autoep = None
    if ep is not None and ep.enabled:
        autoep = autoep_checks(cfg, job, raw)
    return {"sequence_parallel_size": raw.get("sequence_parallel_size"),
            "mesh": None if mesh is None else dict(zip(mesh.mesh_dim_names, mesh.mesh.shape)),
            "autoep": autoep,
            "train_batch_size": cfg.train_batch_size,
            "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
            "world_size": cfg.world_size, "zero_stage": int(cfg.zero_optimization_stage),
            "offload_optimizer": None if offload is None else str(
                getattr(offload.device, "value", offload.device)),
            "autotp_size": cfg.tensor_parallel_config.autotp_size,
            "bf16": cfg.bfloat16_config.enabled, "fp16": cfg.float16_config.enabled}


def autoep_checks(cfg, job: dict, raw: dict) -> dict:
    """The checks DeepSpeed's engine runs on the expert_parallel section at initialize
    (runtime/engine.py _configure_expert_parallel), with the sizes it would pass."""
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config  # noqa: PLC0415
    from deepspeed.module_inject.auto_ep_folding import (  # noqa: PLC0415
        build_folding_spec, validate_folding_global)
    ep = cfg.expert_parallel_config
    world = job["world"]
    tp = raw.get("tensor_parallel", {}).get("autotp_size", 0) or 1
    pp = job["mpu"][1] if job.get("mpu") else 1
    if job.get("mpu") and job["mpu"][0] != 1:
        raise ValueError("AutoEP does not currently support tensor model parallelism from mpu")
    sp = raw.get("sequence_parallel_size", 1)
    validate_autoep_config(ep, world, pp, tp, sp)
    spec = build_folding_spec(world_size=world, pp_size=pp, tp_size=tp, ep_size=ep.autoep_size,
                              etp_size=ep.expert_tensor_parallel_size,
                              mp_mode="tp" if tp > 1 else "sp")
    validate_folding_global(spec, zero_stage=int(cfg.zero_optimization_stage), sp_size=sp,
                            autoep_enabled=True, ep_preset=ep.preset_model,
                            zero_offload_optimizer=cfg.zero_config.offload_optimizer is not None,
                            mpu=StandInMpu(*job["mpu"]) if job.get("mpu") else None)
    return {"autoep_size": ep.autoep_size, "etp": ep.expert_tensor_parallel_size,
            "preset_model": ep.preset_model, "use_grouped_mm": ep.use_grouped_mm,
            "edp": spec.edp_size, "comm_backend": ep.comm_backend,
            "comm_max_tokens_per_rank": ep.comm_max_tokens_per_rank}


def titan_split(job: dict) -> dict:
    import torch  # noqa: PLC0415
    import_torchtitan()
    from importlib.metadata import version  # noqa: PLC0415
    name = job.get("module", "llama3")
    with torch.device("meta"):
        if version("torchtitan") == "0.2.2":
            from torchtitan.protocols.train_spec import get_train_spec  # noqa: PLC0415
            spec = get_train_spec(name)
            whole = spec.model_cls(spec.model_args[job["flavor"]])
        else:
            module = importlib.import_module(f"torchtitan.models.{name}")
            whole = module.model_registry(job["flavor"]).model.build()
    chunks = split(whole, job["stages"], job["schedule"], job["pp"])

    def expert(param_name: str, p) -> bool:
        # moe.experts.w1 (0.2.2), moe.routed_experts.inner_experts.w1_EFD (0.3.0)
        return p.dim() == 3 and "experts." in param_name

    return {"total": sum(p.numel() for p in whole.parameters()),
            "children": [n for n, _ in whole.named_children()],
            "stages": [{"matrices": sum(p.numel() for n, p in c.named_parameters()
                                        if p.dim() > 1 and not expert(n, p)),
                        "experts": sum(p.numel() for n, p in c.named_parameters()
                                       if expert(n, p)),
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
