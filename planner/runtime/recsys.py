"""Run a recommendation-model plan (a plan with an ``embeddings`` section) with TorchRec.

The plan's tables become a TorchRec ``ShardingPlan`` (planner.runtime.table_sharding). Each
process wraps the model
in ``DistributedModelParallel`` with that plan: the tables are sharded as planned (their optimizer
fused into the backward), the data-parallel tables are replicated with DDP, and the dense part too,
or, when the plan's dense part has ``zero: 3``, sharded with FSDP2 (``fully_shard`` on each of the
model's children that holds no table; ``FsdpDenseWrapper``).
Steps run on synthetic data (each table's ids per sample as the plan says, ids uniform over the
rows); the step time of the slowest rank is compared with the plan's ``predicted.step_time_s``.

    python -m planner.runtime.recsys PLAN.json [PLAN.json ...] --result OUT.json [--reference]

``--reference`` (the equivalence tests) also trains the unsharded model in one process on the
global batch, from the same weights, and reports how far the losses and the updated weights are
from the sharded run's.

On CPU (gloo): the stock ``EmbeddingBagCollectionSharder`` offers the row-wise types only for CUDA,
so ``CpuEmbeddingBagCollectionSharder`` offers every type (TorchRec's CPU kernels run them); the
UVM kernels, which need a GPU, run as ``fused``. TorchRec's sharded lookups return pooled
embeddings in shard order, so the model selects them by feature name (the zoo's ``RecNet`` does),
and the table gradients are averaged over the ranks (``comm_ops.get_gradient_division``), like
DDP's: each rank's loss is the mean over its local batch, and the sharded step equals one step of
the unsharded model on the mean over the global batch.
"""

from __future__ import annotations

import copy
import logging
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from planner.errors import SpecError
from planner.planfile.document import Plan, load_plan
from planner.runtime import measure, worker
from planner.runtime.launch import (MAX_CPU_PROCESSES, MEMORY_USE_FRACTION, _available_bytes,
                                    _free_port, run_processes, torchrun_command, warn_device)
from planner.runtime.model import SGD_MOMENTUM
from planner.runtime.options import RunOptions
from planner.runtime.table_sharding import (cpu_sharder, kernel_on, shard_ranks, sharding_plan,
                                            tables_of)

log = logging.getLogger("planner.runtime")
EXIT_BAD_INPUT = 2

FUSED_OPTIMIZERS = {"sgd": "EXACT_SGD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
                    "adagrad": "EXACT_ADAGRAD", "adam": "ADAM"}
"""Plan table optimizer -> fbgemm's EmbOptimType member (fused into the backward)."""
CPU_FUSED_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adagrad")
"""Table optimizers fbgemm's CPU kernels fuse (its CPU mode has no Adam)."""


# ---- the model -------------------------------------------------------------------------------

def resolve_model(plan: Plan, model: str | None = None) -> nn.Module:
    """The module the plan was made for, on the meta device where the builder allows: ``model``
    (a zoo name or ``file.py:factory``) or the plan's own ``model.spec``."""
    from planner.inputs.zoo import RECSYS  # lazy: keeps the module light for the export's tests
    from planner.trace import recsys as rs  # lazy: as above
    from planner.trace.models import load_factory  # lazy: as above

    spec = model or plan.model.get("spec")
    if not spec:
        raise SpecError(f"model: the plan was made from a module object ({plan.model['name']}); "
                        "pass --model path/to/file.py:factory that builds it")
    if spec.lower() in RECSYS:
        module = rs.build(RECSYS[spec.lower()], device="meta")
    else:
        made = load_factory(spec)()
        module = made[0] if isinstance(made, tuple) else made
        if not isinstance(module, nn.Module):
            raise SpecError(f"model: {spec} returned {type(module).__name__}, not a module")
    check_model(plan, module, spec)
    return module


def ebc_path(module: nn.Module) -> str:
    """Path of the model's one EmbeddingBagCollection."""
    found = [p for p, m in module.named_modules() if hasattr(m, "embedding_bag_configs")]
    if len(found) != 1:
        raise SpecError(f"model: the runtime shards one TorchRec EmbeddingBagCollection; this "
                        f"model has {len(found)} (plain nn.EmbeddingBag tables are planned and "
                        f"exported, not run: put them in one EmbeddingBagCollection)")
    return found[0]


def check_model(plan: Plan, module: nn.Module, spec: str = "") -> None:
    """The model holds the plan's tables (names, rows, dims) and offers dense_inputs."""
    path = ebc_path(module)
    ebc = module.get_submodule(path)
    have = {c.name: (int(c.num_embeddings), int(c.embedding_dim))
            for c in ebc.embedding_bag_configs()}
    want = {t["name"]: (int(t["rows"]), int(t["dim"])) for t in plan.embeddings["tables"]}
    if have != want:
        diff = sorted(set(have.items()) ^ set(want.items()))[:3]
        raise SpecError(f"model: {spec or plan.model['name']} does not hold the plan's tables "
                        f"(name, (rows, dim)) differ: {diff}; plan it again for this model")
    if not hasattr(module, "dense_inputs"):
        raise SpecError(f"model: {spec or plan.model['name']} has no dense_inputs(batch); the "
                        "runtime trains models shaped like the zoo's RecNet: forward(dense, kjt)")


def dense_width(module: nn.Module) -> int:
    return int(module.dense_inputs(1, device="meta")[0].shape[1])


def materialize(module: nn.Module, seed: int) -> nn.Module:
    """A real CPU copy of ``module`` with seeded weights (the unsharded reference)."""
    ref = copy.deepcopy(module)
    if any(p.device.type == "meta" for p in ref.parameters()):
        ref = ref.to_empty(device="cpu")
    torch.manual_seed(seed)
    done: list[str] = []
    with torch.no_grad():
        for name, m in ref.named_modules():
            if not name or any(name.startswith(d + ".") for d in done):
                continue
            if hasattr(m, "embedding_bag_configs"):  # its own reset skips a module built on meta
                for c in m.embedding_bag_configs():
                    c.init_fn(m.embedding_bags[c.name].weight)
                done.append(name)
            elif hasattr(m, "reset_parameters"):
                m.reset_parameters()
                done.append(name)
    return ref


# ---- data ------------------------------------------------------------------------------------

@dataclass
class Batch:
    dense: torch.Tensor
    ids: list
    """Per feature: [samples, ids per sample] long tensor."""
    labels: torch.Tensor

    def slice(self, lo: int, hi: int) -> "Batch":
        return Batch(self.dense[lo:hi], [i[lo:hi] for i in self.ids], self.labels[lo:hi])

    def kjt(self, keys: list[str], device):
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # lazy: optional library

        values = torch.cat([i.reshape(-1) for i in self.ids])
        lengths = torch.cat([torch.full((i.shape[0],), i.shape[1], dtype=torch.int32)
                             for i in self.ids])
        return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values.to(device),
                                                   lengths=lengths.to(device))


def features(plan: Plan) -> list[tuple[str, int, int]]:
    """(feature name, rows of its table, ids per sample) in the plan's table order."""
    out = []
    for t in plan.embeddings["tables"]:
        hot = max(1, round(float(t.get("pooling", 1.0))))
        for f in t.get("feature_names") or [t["name"]]:
            out.append((f, int(t["rows"]), hot))
    return out


def synthetic_batch(plan: Plan, batch: int, dense_in: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, dense_in, generator=g)
    ids = [torch.randint(0, rows, (batch, hot), generator=g) for _, rows, hot in features(plan)]
    labels = torch.randint(0, 2, (batch,), generator=g).float()
    return Batch(dense, ids, labels)


# ---- optimizers ------------------------------------------------------------------------------

def fused_params(plan: Plan, lr: float) -> dict:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType  # lazy: optional library

    name = plan.embeddings.get("table_optimizer", "sgd")
    if name not in FUSED_OPTIMIZERS:
        raise SpecError(f"plan: table optimizer {name!r} is not one of "
                        f"{', '.join(FUSED_OPTIMIZERS)}")
    return {"optimizer": getattr(EmbOptimType, FUSED_OPTIMIZERS[name]), "learning_rate": lr}


def table_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """The unfused form of a table optimizer (data-parallel tables, the reference)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=1e-8)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad  # lazy: optional library

    return RowWiseAdagrad(params, lr=lr, eps=1e-8)


def dense_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    """The dense part's optimizer: SGD with the momentum the dense search prices (its
    costmodels.memory states; planner.runtime.model.SGD_MOMENTUM), AdamW or Adam."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def split_params(plan: Plan, named, ebc_prefix: str) -> tuple[list, list]:
    """(table parameters, dense parameters) among ``named`` ((name, parameter) pairs) that an
    optimizer outside the backward steps: the fused tables' optimizer runs inside it."""
    kinds = {t["name"]: t["sharding_type"] for t in plan.embeddings["tables"]}
    tables, dense = [], []
    for name, p in named:
        head = f"{ebc_prefix}.embedding_bags." if ebc_prefix else "embedding_bags."
        if name.startswith(head):
            if kinds.get(name[len(head):].split(".")[0]) == "data_parallel":
                tables.append(p)
        else:
            dense.append(p)
    return tables, dense


class Optimizers:
    """The step's optimizers that are not fused into the backward."""

    def __init__(self, opts: list):
        self.opts = [o for o in opts if o is not None]

    def step(self) -> None:
        for o in self.opts:
            o.step()

    def zero_grad(self) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=True)


def make_optimizers(plan: Plan, named, ebc_prefix: str, lr: float, *,
                    unsharded: bool = False) -> Optimizers:
    """The table optimizer for the data-parallel tables (every table when ``unsharded``), the
    plan's optimizer for the dense part."""
    if unsharded:
        head = f"{ebc_prefix}." if ebc_prefix else ""
        named = list(named)
        tables = [p for n, p in named if n.startswith(head + "embedding_bags.")]
        dense = [p for n, p in named if not n.startswith(head + "embedding_bags.")]
    else:
        tables, dense = split_params(plan, named, ebc_prefix)
    table_opt = plan.embeddings.get("table_optimizer", "sgd")
    return Optimizers([table_optimizer(table_opt, tables, lr) if tables else None,
                       dense_optimizer(plan.training.get("optimizer", "sgd"), dense, lr)
                       if dense else None])


# ---- one process -----------------------------------------------------------------------------

def loss_of(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(out.reshape(-1), labels)


@dataclass
class Sharded:
    dmp: nn.Module
    optimizers: Optimizers
    keys: list
    path: str


def check_cpu_optimizer(plan: Plan) -> None:
    """Refuse a plan whose sharded tables take an optimizer fbgemm's CPU kernels do not fuse
    into the backward (CPU_FUSED_OPTIMIZERS)."""
    opt_name = plan.embeddings.get("table_optimizer", "sgd")
    fused = [t for t in tables_of(plan) if t["sharding_type"] != "data_parallel"]
    if fused and opt_name not in CPU_FUSED_OPTIMIZERS:
        raise SpecError(f"plan: table optimizer {opt_name}: fbgemm's CPU kernels fuse only "
                        f"{', '.join(CPU_FUSED_OPTIMIZERS)} into the backward; plan with "
                        "--table-optimizer adagrad (or rowwise_adagrad), or run on GPUs")


def shard(plan: Plan, module: nn.Module, opts: RunOptions, device: torch.device) -> tuple:
    """(Sharded, notes): ``module`` wrapped in DistributedModelParallel with the plan's tables."""
    from torchrec.distributed.model_parallel import DistributedModelParallel  # lazy: optional
    from torchrec.distributed.types import ShardingEnv  # lazy: as above

    world = dist.get_world_size()
    if world != int(plan.embeddings["world_size"]):
        raise SpecError(f"nproc: the plan shards its tables over {plan.embeddings['world_size']} "
                        f"ranks, this run has {world} processes")
    notes = []
    if device.type == "cpu":
        check_cpu_optimizer(plan)
    path = ebc_path(module)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    splan = sharding_plan(plan, device_type=device.type, local_world=local, module_path=path)
    moved: dict = {}
    for t in tables_of(plan):
        if kernel_on(t, device.type) != t["compute_kernel"]:
            moved[t["compute_kernel"]] = moved.get(t["compute_kernel"], 0) + 1
    if moved:
        kinds = ", ".join(f"{n} {k} tables" for k, n in sorted(moved.items()))
        notes.append(f"{kinds} run with the fused kernel: the UVM kernels need a GPU (the plan "
                     "priced host memory behind a GPU cache)")
    torch.manual_seed(opts.seed)
    sharder = cpu_sharder(fused_params(plan, opts.lr))
    zero = int(plan.embeddings.get("dense", {}).get("zero", 0))
    dmp = DistributedModelParallel(module, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=device, plan=splan, sharders=[sharder],
                                   data_parallel_wrapper=fsdp_dense_wrapper() if zero == 3
                                   else None)
    optimizers = make_optimizers(plan, list(dmp.named_parameters()), path, opts.lr)
    keys = [f for f, _, _ in features(plan)]
    return Sharded(dmp, optimizers, keys, path), notes


def fsdp_dense_wrapper():
    """TorchRec's data-parallel wrapper for a plan whose dense part runs with FSDP2: each child of
    the model that holds no sharded table gets ``fully_shard`` over all ranks (its weights,
    gradients and optimizer states sharded, gathered per module); what is left (data-parallel
    tables) is replicated with DDP as TorchRec does."""
    from torch.distributed.device_mesh import init_device_mesh  # lazy: FSDP2 plans only
    from torch.distributed.fsdp import fully_shard  # lazy: as above
    from torchrec.distributed.model_parallel import (DefaultDataParallelWrapper,  # lazy: optional
                                                     DistributedModelParallel)
    from torchrec.distributed.types import ShardedModule  # lazy: as above

    class FsdpDenseWrapper(DefaultDataParallelWrapper):
        def wrap(self, dmp, env, device) -> None:
            model = dmp._dmp_wrapped_module
            mesh = init_device_mesh(device.type, (env.world_size,))
            ignore = set()
            for name, child in model.named_children():
                holds = any(isinstance(m, ShardedModule) for m in child.modules())
                if holds or not any(True for _ in child.parameters()):
                    continue
                fully_shard(child, mesh=mesh)
                ignore.update(f"{name}.{n}" for n, _ in child.named_parameters())
            sharded = set(DistributedModelParallel._sharded_parameter_names(model))
            self._ddp_wrap(dmp, env, device, sharded | ignore)

    return FsdpDenseWrapper()


def sharded_step(s: Sharded, batch: Batch, device) -> torch.Tensor:
    out = s.dmp(batch.dense.to(device), batch.kjt(s.keys, device))
    loss = loss_of(out, batch.labels.to(device))
    s.optimizers.zero_grad()
    loss.backward()
    s.optimizers.step()
    return loss.detach()


def load_full(dmp: nn.Module, full: dict) -> None:
    """Copy full (unsharded) tensors into the sharded model's parameters, shard by shard."""
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            if key not in full:
                continue
            if hasattr(value, "local_shards"):
                for sh in value.local_shards():
                    (r, c), (h, w) = sh.metadata.shard_offsets, sh.metadata.shard_sizes
                    sh.tensor.copy_(full[key][r:r + h, c:c + w])
            elif isinstance(value, DTensor):  # FSDP2's shard of a dense parameter
                value.copy_(distribute_tensor(full[key], value.device_mesh, value.placements))
            else:
                value.copy_(full[key])


def gather_full(dmp: nn.Module) -> dict:
    """Every rank's shards put together: the full tensors (all ranks take part)."""
    local = {}
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            local[key] = ("sharded", list(value.size()),
                          [(list(sh.metadata.shard_offsets), sh.tensor.detach().cpu().clone())
                           for sh in value.local_shards()])
        elif isinstance(value, DTensor):
            local[key] = ("full", None, value.full_tensor().detach().cpu().clone())
        elif isinstance(value, torch.Tensor):
            local[key] = ("full", None, value.detach().cpu().clone())
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    out = {}
    for part in parts:
        for key, (kind, size, data) in part.items():
            if kind == "full":
                out.setdefault(key, data)
                continue
            t = out.setdefault(key, torch.zeros(size))
            for (r, c), tensor in data:
                t[r:r + tensor.shape[0], c:c + tensor.shape[1]] = tensor
    return out


def execute(plan: Plan, module: nn.Module, opts: RunOptions, device: torch.device, *,
            reference: bool = False) -> dict:
    """Shard ``module`` (on meta or CPU) as the plan says, run the steps, and (every rank) return
    the run's summary; with ``reference`` also compare with the unsharded model."""
    rank, world = dist.get_rank(), dist.get_world_size()
    emb = plan.embeddings
    local_batch = int(emb["local_batch"])
    total = opts.warmup + opts.steps
    dense_in = dense_width(module)
    batches = [synthetic_batch(plan, local_batch * world, dense_in, opts.seed * 1000 + i)
               for i in range(min(total, 4) if not reference else total)]
    ref = materialize(module, opts.seed) if reference else None
    s, notes = shard(plan, module, opts, device)
    if ref is not None:
        load_full(s.dmp, ref.state_dict())
        start = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    if emb.get("pipeline") == "sparse-dist":
        notes.append("the plan's sparse-dist pipeline (the next batch's input distribution "
                     "overlapped with this step) is not used: steps run one after another")
    if any(float(t.get("skew", 0.0)) for t in emb["tables"]):
        notes.append("ids are uniform over each table's rows (the plan's access skew only "
                     "changes cache hits, which the CPU kernels do not have)")
    mem = measure.Memory(device)
    timer = measure.StepTimer(device)
    losses = []
    for step in range(total):
        if step == opts.warmup:
            mem.reset()
        batch = batches[step % len(batches)].slice(rank * local_batch, (rank + 1) * local_batch)
        dist.barrier()
        timer.start()
        loss = sharded_step(s, batch, device)
        timer.stop()
        losses.append(float(loss))
    measured = timer.times[opts.warmup:]
    per_rank = {r["rank"]: r for r in emb.get("ranks", [])}
    record = {"rank": rank, "step_times_s": timer.times,
              "median_step_time_s": measure.median(measured),
              "predicted_time_s": per_rank.get(rank, {}).get("time_s"),
              "predicted_memory_bytes": per_rank.get(rank, {}).get("hbm_bytes"),
              "rss_peak_bytes": mem.rss_peak(),
              "table_bytes": _local_table_bytes(s.dmp),
              "tables": sorted({t["name"] for t in emb["tables"]
                                if rank in shard_ranks(t, world)}),
              "losses": losses}
    records: list = [None] * world
    dist.all_gather_object(records, record)
    step = max(r["median_step_time_s"] for r in records) if measured else None
    pred = plan.predicted["step_time_s"]
    result = {
        "measured": {"step_time_s": step, "predicted_step_time_s": pred,
                     "step_time_error": pred / step - 1 if step and pred else None,
                     "warmup_steps": opts.warmup,
                     "rss_peak_bytes": max(r["rss_peak_bytes"] for r in records)},
        "loss_per_step": [sum(r["losses"][i] for r in records) / world for i in range(total)],
        "ranks": records, "device": device.type, "backend": dist.get_backend(),
        "engine": "torchrec DistributedModelParallel", "world_size": world,
        "local_batch": local_batch, "sharding": plan.sharding_counts(),
        "dense_engine": ("FSDP2" if any(isinstance(p, DTensor) for p in s.dmp.parameters())
                         else "DDP"),
        "predicted_breakdown": emb.get("breakdown", {}), "notes": notes}
    if ref is not None:
        result["reference"] = compare(plan, s, ref, batches, start, opts, local_batch,
                                      result["loss_per_step"])
    if opts.dump_dir:
        full = gather_full(s.dmp)
        if rank == 0:
            os.makedirs(opts.dump_dir, exist_ok=True)
            torch.save(full, os.path.join(opts.dump_dir, "model.pt"))
    return result


def _local_table_bytes(dmp: nn.Module) -> int:
    total = 0
    for value in dmp.state_dict().values():
        if hasattr(value, "local_shards"):
            total += sum(sh.tensor.numel() * sh.tensor.element_size()
                         for sh in value.local_shards())
    return total


def compare(plan: Plan, s: Sharded, ref: nn.Module, batches: list, start: dict,
            opts: RunOptions, local_batch: int, losses: list) -> dict:
    """Train the unsharded model on the global batches (every rank, one process each, the same
    numbers) and measure how far the sharded run is from it."""
    path = ebc_path(ref)
    opt = make_optimizers(plan, list(ref.named_parameters()), path, opts.lr,
                          unsharded=True)
    keys = [f for f, _, _ in features(plan)]
    ref_losses = []
    for step in range(opts.warmup + opts.steps):
        b = batches[step % len(batches)]
        loss = loss_of(ref(b.dense, b.kjt(keys, "cpu")), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_losses.append(float(loss))
    full = gather_full(s.dmp)
    after = ref.state_dict()
    tables = {t["name"] for t in plan.embeddings["tables"]}
    table_diff, dense_diff, moved = {}, 0.0, 0.0
    for key, value in after.items():
        if key not in full:
            continue
        d = float((full[key] - value).abs().max())
        name = key.split(".")[-2] if key.endswith(".weight") else ""
        if name in tables and ".embedding_bags." in key:
            table_diff[name] = d
            moved = max(moved, float((value - start[key]).abs().max()))
        else:
            dense_diff = max(dense_diff, d)
    return {"losses": ref_losses,
            "loss_max_abs_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
            "table_max_abs_diff": table_diff, "dense_max_abs_diff": dense_diff,
            "table_max_update": moved}


# ---- processes -------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = worker.parser("planner.runtime.recsys")
    p.add_argument("plans", nargs="+", metavar="PLAN")
    p.add_argument("--reference", action="store_true",
                   help="also train the unsharded model and compare (small models only)")
    a = p.parse_args(argv)

    def body(opts, device) -> dict:
        results = []
        for path in a.plans:
            plan = load_plan(path)
            module = resolve_model(plan, opts.model)
            results.append({"plan": path, **execute(plan, module, opts, device,
                                                    reference=a.reference)})
        return {"runs": results}

    return worker.guarded(a, body)


# ---- the launcher (`plan run` on a plan with embeddings) ---------------------------------------

@dataclass(frozen=True, kw_only=True)
class Launch:
    plan_paths: tuple
    nodes: int
    nproc_per_node: int
    device: str


def check(plan_paths, opts: RunOptions, nproc: int | None = None, *,
          dry_run: bool = False) -> Launch:
    """What can be refused before a process starts (SpecError, one line)."""
    paths = (plan_paths,) if isinstance(plan_paths, str) else tuple(plan_paths)
    plans = [load_plan(p) for p in paths]
    worlds = {int(pl.embeddings["world_size"]) for pl in plans if pl.embeddings}
    for pl in plans:
        tables_of(pl)
        if pl.training.get("dtype", "fp32") != "fp32":
            raise SpecError(f"plan: recommendation plans run in fp32 (TorchRec's tables); this "
                            f"one is {pl.training.get('dtype')}")
        resolve_model(pl, opts.model)  # the model and its tables, before any process starts
    if len(worlds) != 1:
        raise SpecError("plans: run plans over the same number of ranks together")
    world = worlds.pop()
    nodes = int(plans[0].cluster.get("nodes", 1))
    per_node = nproc or -(-world // nodes)
    if per_node * nodes != world:
        raise SpecError(f"nproc: {per_node} processes per node x {nodes} nodes != the {world} "
                        f"ranks the plan shards its tables over; pass --nproc {world // nodes}")
    cuda = opts.device == "cuda" or (opts.device == "auto" and (
        not str(plans[0].cluster.get("device", "")).startswith("cpu") if dry_run
        else torch.cuda.is_available()))
    launch = Launch(plan_paths=paths, nodes=nodes, nproc_per_node=per_node,
                    device="cuda" if cuda else "cpu")
    if dry_run:
        return launch
    if nodes > 1:
        raise SpecError(f"cluster.nodes: the plan spans {nodes} nodes x {per_node} processes; this "
                        "host starts the processes of one node. Print the launch command for the "
                        "cluster with `plan run --dry-run`")
    if cuda and per_node > torch.cuda.device_count():
        raise SpecError(f"nproc: the plan needs {per_node} processes but "
                        f"{torch.cuda.device_count()} GPUs are visible")
    if not cuda and per_node > MAX_CPU_PROCESSES:
        raise SpecError(f"nproc: the plan needs {per_node} processes; on CPU the runtime starts "
                        f"at most {MAX_CPU_PROCESSES}")
    if not cuda:  # (before any process starts; shard() checks again where it runs)
        for pl in plans:
            check_cpu_optimizer(pl)
    if not cuda:
        need = max(sum(r.get("hbm_bytes", 0) + r.get("host_bytes", 0)
                       for r in pl.embeddings.get("ranks", [])) for pl in plans)
        have = _available_bytes()
        if have and need > MEMORY_USE_FRACTION * have:
            raise SpecError(f"model: {plans[0].model['name']}'s shards, optimizer states and "
                            f"activations need about {need / 1e9:.1f} GB over {per_node} "
                            f"processes but this machine has {have / 1e9:.1f} GB free; the CPU "
                            "runtime is for small models, run a smaller one")
    warn_device(plans[0], cuda)
    return launch


def worker_argv(launch: Launch, opts: RunOptions, result: str, *, reference: bool = False) -> list:
    out = ["-m", "planner.runtime.recsys", *launch.plan_paths, "--result", result, *opts.argv()]
    return out + (["--reference"] if reference else [])


def cluster_command(launch: Launch, opts: RunOptions, result: str) -> str:
    """The torchrun command every node of the plan's cluster runs (launch.torchrun_command),
    its rendezvous keyed by the first plan's input hash."""
    first = load_plan(launch.plan_paths[0]).provenance.get("input_hash", "recsys")
    return torchrun_command(launch.nodes, launch.nproc_per_node, f"plan-{first}",
                            worker_argv(launch, opts, result))


def run_local(launch: Launch, opts: RunOptions, *, reference: bool = False) -> list[dict]:
    """Start the processes on this machine, wait, and return rank 0's results (one per plan)."""
    with tempfile.TemporaryDirectory(prefix="plan-run-") as tmp:
        result = os.path.join(tmp, "result.json")
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                "--nproc-per-node", str(launch.nproc_per_node), "--master-addr", "127.0.0.1",
                "--master-port", str(_free_port()),
                *worker_argv(launch, opts, result, reference=reference)]
        log.debug("starting %d processes: %s", launch.nproc_per_node, shlex.join(argv))
        return run_processes(argv, tmp, result)["runs"]


if __name__ == "__main__":  # pragma: no cover
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as planner.runtime.worker: skip a teardown that now and then aborts
