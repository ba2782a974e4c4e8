"""Plan -> a Python file of TorchRec sharding (a recommendation plan's ``embeddings`` section).

The file needs only TorchRec to load. It holds the plan's tables as data (``TABLES``) and builds:

- ``sharding_plan()``: the exact ``ShardingPlan`` (``EmbeddingModuleShardingPlan`` of one
  ``ParameterSharding`` per table: sharding type, compute kernel, the rank of each shard and an
  ``EnumerableShardingSpec`` of the plan's shards; data-parallel tables: no spec, every rank), to
  pass to ``DistributedModelParallel(model, plan=...)``; it equals what ``plan run`` shards with
  (planner.runtime.table_sharding.sharding_plan);
- ``constraints()``: ``ParameterConstraints`` per table (the sharding type, the compute kernel,
  pooling factors, the column-wise piece width, the cache load factor) for TorchRec's own
  ``EmbeddingShardingPlanner``, which then places the shards itself (ParameterConstraints has no
  ranks: ``RANKS`` lists the plan's);
- ``sharder(learning_rate)``: an ``EmbeddingBagCollectionSharder`` with the plan's table optimizer
  fused (fbgemm's ``EmbOptimType``); for tables in an ``EmbeddingCollection`` (sequence tables,
  no pooling) its ``EmbeddingCollectionSharder``, which DistributedModelParallel matches to that
  module type.

``to_torchrec_json`` is the same data as JSON. A plan without an ``embeddings`` section raises
SpecError (planner.export refuses it before calling here).
"""

from __future__ import annotations

import json
import logging
import textwrap

from planner.errors import SpecError
from planner.export import common
from planner.planfile.document import Plan

TARGET = "torchrec"
VERSIONS = ("1.8.0",)
"""TorchRec releases the export writes for (with fbgemm-gpu 1.8.0); the tests load the file with
the installed one."""
DEFAULT_VERSION = VERSIONS[0]
FUSED_OPTIMIZERS = {"sgd": "EXACT_SGD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
                    "adagrad": "EXACT_ADAGRAD", "adam": "ADAM"}
"""Plan table optimizer -> fbgemm_gpu.split_embedding_configs.EmbOptimType member."""
DEFAULT_MODULE_PATH = "sparse"
"""Where the zoo's RecNet keeps its EmbeddingBagCollection."""


def module_path(plan: Plan) -> str:
    """The path of the EmbeddingBagCollection the plan's tables are in, as the plan records it
    (tables.module), where they share one; else DEFAULT_MODULE_PATH."""
    named = {t.get("module", "") for t in plan.embeddings["tables"]} - {""}
    return named.pop() if len(named) == 1 else DEFAULT_MODULE_PATH

log = logging.getLogger("planner.export")


def engine_version(version: str | None) -> str:
    if version in (None, ""):
        return DEFAULT_VERSION
    aliases = {v: v for v in VERSIONS} | {"v" + v: v for v in VERSIONS} | \
        {v.rsplit(".", 1)[0]: v for v in VERSIONS}
    if version not in aliases:
        raise SpecError(f"--engine-version: planner writes torchrec {' or '.join(VERSIONS)}, not "
                        f"'{version}'")
    return aliases[version]


def ordered_shards(t: dict) -> list[dict]:
    """A table's shards in TorchRec's order (by column, then row offset), as the runtime orders
    them (planner.runtime.table_sharding.ordered_shards)."""
    return sorted(t["shards"], key=lambda s: (s["offsets"][1], s["offsets"][0], s["rank"]))


def _check_rows(t: dict, world: int) -> None:
    """TorchRec's row-wise sharding cuts blocks of ceil(rows / world) rows, block r on rank r."""
    block = -(-t["rows"] // world)
    for s in t["shards"]:
        lo = min(s["rank"] * block, t["rows"])
        if s["offsets"] != [lo, 0] or s["sizes"] != [min(block, t["rows"] - lo), t["dim"]]:
            raise SpecError(f"export torchrec: table {t['name']}: its row_wise shard on rank "
                            f"{s['rank']} is not TorchRec's block of ceil(rows / world) = {block} "
                            "rows; TorchRec's row-wise input distribution cannot express it")


def tables(plan: Plan) -> dict:
    """Table name -> what TorchRec needs: sharding type, compute kernel, ranks (one per shard),
    shards [(row, col), (rows, cols), rank], and the constraints' extras."""
    emb = plan.embeddings
    if not emb or not emb.get("tables"):
        raise SpecError(f"export torchrec: the plan of {plan.model['name']} has no embedding "
                        "tables (no embeddings section); TorchRec shards recommendation models: "
                        "use --to torchtitan, megatron or deepspeed")
    world = int(emb["world_size"])
    out = {}
    for t in emb["tables"]:
        kind = t["sharding_type"]
        if kind == "row_wise":
            _check_rows(t, world)
        shards = [] if kind == "data_parallel" else ordered_shards(t)
        entry = {
            "sharding_type": kind, "compute_kernel": t["compute_kernel"],
            "ranks": list(range(world)) if kind == "data_parallel" else [s["rank"] for s in shards],
            "shards": [[list(s["offsets"]), list(s["sizes"]), s["rank"]] for s in shards],
            "rows": int(t["rows"]), "dim": int(t["dim"]),
            "feature_names": list(t.get("feature_names") or [t["name"]]),
            "pooling_factor": float(t.get("pooling", 1.0)),
        }
        if kind in ("column_wise", "grid_shard") and shards:
            entry["min_partition"] = min(s["sizes"][1] for s in shards)
        if t.get("cache_ratio") is not None and t["compute_kernel"] == "fused_uvm_caching":
            entry["cache_load_factor"] = float(t["cache_ratio"])
        out[t["name"]] = entry
    return out


def _notes(plan: Plan, tabs: dict) -> list[str]:
    emb = plan.embeddings
    notes = ["ParameterConstraints has no ranks: constraints() lets TorchRec's planner place the "
             "shards (RANKS lists the plan's); sharding_plan() pins them exactly"]
    if emb.get("pipeline") == "sparse-dist":
        notes.append("pipeline sparse-dist: train with torchrec.distributed.train_pipeline."
                     "TrainPipelineSparseDist (the next batch's input distribution overlaps this "
                     "step), as the plan was priced")
    elif emb.get("pipeline") == "nested":
        notes.append("pipeline nested: the plan was priced with each batch's embedding exchange "
                     "behind the dense part; TorchRec has no such pipeline, its nearest is "
                     "torchrec.distributed.train_pipeline.train_pipelines.TrainPipelineSemiSync "
                     "(a batch's embedding all-to-all behind the previous batch's forward, its "
                     "lookups on weights a step older than planned)")
    elif emb.get("pipeline"):
        notes.append(f"pipeline {emb['pipeline']}: the plan was priced with this train pipeline; "
                     "choose TorchRec's matching one in your loop")
    cached = {n for n, t in tabs.items() if "cache_load_factor" in t}
    if any(float(t.get("skew", 0.0)) for t in emb["tables"] if t.get("name") in cached):
        notes.append("access skew: the plan priced cache hits from each cached table's skew; "
                     "TorchRec takes no skew (CacheParams.stats can carry measured statistics)")
    if any("cache_load_factor" in t for t in tabs.values()):
        notes.append("fused_uvm_caching tables: the plan's cache ratio is CacheParams(load_factor)")
    paths = sorted({t.get("module", "") for t in emb["tables"]} - {""})
    apart = [t["name"] for t in emb["tables"] if not t.get("module")]
    if paths and apart:  # (some tables in a collection, some modules of their own)
        notes.append(f"{len(apart)} table(s) ({', '.join(apart[:3])}"
                     f"{', ...' if len(apart) > 3 else ''}) are modules of their own, not in "
                     f"{' or '.join(paths)}: TorchRec shards EmbeddingBagCollections; put them "
                     "into one before DistributedModelParallel")
    if len(paths) > 1:
        notes.append(f"the tables are in {len(paths)} collections ({', '.join(paths)}): "
                     f"MODULE_PATH is {DEFAULT_MODULE_PATH!r}; shard each with its own tables "
                     "(sharding_plan(module_path=...) per collection)")
    pooled = {bool(t.get("pooled", True)) for t in emb["tables"]}
    if pooled == {True, False}:
        sequence = [t["name"] for t in emb["tables"] if not t.get("pooled", True)]
        notes.append(f"{len(sequence)} table(s) ({', '.join(sequence[:3])}"
                     f"{', ...' if len(sequence) > 3 else ''}) are an EmbeddingCollection's "
                     "(sequence tables): sharder() is the EmbeddingBagCollection's; pass "
                     "torchrec.distributed.embedding.EmbeddingCollectionSharder(fused_params=...) "
                     "beside it for those")
    elif plan.model.get("source", "zoo") != "zoo" and not paths:
        notes.append(f"MODULE_PATH is {DEFAULT_MODULE_PATH!r}, where the zoo's models keep their "
                     "tables: set it to your model's EmbeddingBagCollection (TorchRec shards "
                     "EmbeddingBagCollections; plain nn.EmbeddingBag tables go into one first)")
    optimizer = plan.training.get("optimizer", "adam")
    if plan.training.get("dtype", "fp32") != "fp32":  # (a review: said nowhere)
        notes.append(f"dtype {plan.training['dtype']}: the plan priced the dense part in "
                     f"{plan.training['dtype']}; DistributedModelParallel runs the model's own "
                     "dtype, so cast the dense part or run it under torch.autocast with "
                     "that dtype")
    if (emb.get("dense") or {}).get("zero") == 3:
        notes.append("the dense part: the plan shards it with FSDP2 (fully_shard: weights, "
                     "gradients and optimizer states, ZeRO-3), which DistributedModelParallel "
                     "does not do (it wraps the dense part in DDP): apply fully_shard to the "
                     f"dense modules yourself, with {optimizer}, or re-plan with --fix zero=0 "
                     "for DDP; the learning rates are yours")
    else:
        notes.append(f"the dense part: data-parallel (DDP, as DistributedModelParallel wraps it) "
                     f"with {optimizer}; the learning rates are yours")
    return notes


def _header(plan: Plan, version: str, tabs: dict) -> list[str]:
    m, c, prov, emb = plan.model, plan.cluster, plan.provenance, plan.embeddings
    counts = ", ".join(f"{n} {k}" for k, n in sorted(plan.sharding_counts().items()))
    return [
        f"{TARGET} {version} sharding exported by planner from a plan ({plan.schema}).",
        f"model {m['name']}  fingerprint {m['fingerprint']}  input_hash {prov['input_hash']}  "
        f"planner {prov.get('planner', 'unknown')}",
        f"plan: {len(tabs)} tables over {emb['world_size']} ranks ({counts})",
        f"table optimizer {emb.get('table_optimizer', 'sgd')}, pipeline "
        f"{emb.get('pipeline', '-')}; predicted step {plan.predicted['step_time_s'] * 1e3:.2f} ms",
        f"on {c['num_gpus']} x {c['device']} ({c['name']}: {c['nodes']} "
        f"node{'s' if c['nodes'] != 1 else ''} x "
        f"{c['gpus_per_node']}); global batch {plan.training['global_batch']} "
        f"({emb['local_batch']} per rank), {plan.training['dtype']}, "
        f"{plan.training['optimizer']}",
        f"Written for torchrec {version} with fbgemm-gpu {version}.",
    ]


USE = [
    "Use (model: your module, its EmbeddingBagCollection at MODULE_PATH; one process per rank):",
    "    spec = importlib.util.spec_from_file_location('sharding', 'THIS_FILE.py')",
    "    sharding = importlib.util.module_from_spec(spec); spec.loader.exec_module(sharding)",
    "    model = DistributedModelParallel(model, device=device, plan=sharding.sharding_plan(),",
    "                                     sharders=[sharding.sharder(learning_rate=0.01)])",
    "or let TorchRec plan within the plan's choices:",
    "    planner = EmbeddingShardingPlanner(topology, constraints=sharding.constraints())",
    "    plan = planner.plan(model, [sharding.sharder(learning_rate=0.01)])",
    "`python THIS_FILE.py` prints the ShardingPlan.",
]

IMPORTS = '''
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import (CacheParams, EmbeddingModuleShardingPlan,
                                        EnumerableShardingSpec, ParameterSharding, ShardingPlan,
                                        ShardingType, ShardMetadata)
'''

BODY = '''
CPU_KERNELS = ("dense", "fused")
"""Compute kernels TorchRec runs on CPU (the UVM kernels need a GPU: they run as fused there)."""


def placement(rank, device="cuda", local_world_size=LOCAL_WORLD_SIZE):
    """TorchRec's placement of a shard on ``rank``."""
    if device == "cpu":
        return f"rank:{rank}/cpu"
    return f"rank:{rank}/{device}:{rank % local_world_size}"


def kernel(table, device="cuda"):
    k = TABLES[table]["compute_kernel"]
    return k if device != "cpu" or k in CPU_KERNELS else "fused"


def sharding_plan(device="cuda", local_world_size=LOCAL_WORLD_SIZE, module_path=MODULE_PATH):
    """The plan's ShardingPlan for DistributedModelParallel."""
    per_table = {}
    for name, t in TABLES.items():
        spec = None
        if t["sharding_type"] != "data_parallel":
            spec = EnumerableShardingSpec([
                ShardMetadata(shard_offsets=list(offsets), shard_sizes=list(sizes),
                              placement=placement(rank, device, local_world_size))
                for offsets, sizes, rank in t["shards"]])
        cache = None
        if "cache_load_factor" in t and kernel(name, device) == "fused_uvm_caching":
            cache = CacheParams(load_factor=t["cache_load_factor"])
        per_table[name] = ParameterSharding(
            sharding_type=t["sharding_type"], compute_kernel=kernel(name, device),
            ranks=list(t["ranks"]), sharding_spec=spec, cache_params=cache)
    return ShardingPlan({module_path: EmbeddingModuleShardingPlan(per_table)})


def constraints(device="cuda"):
    """ParameterConstraints per table for TorchRec's EmbeddingShardingPlanner."""
    out = {}
    for name, t in TABLES.items():
        extra = {}
        if "min_partition" in t:
            extra["min_partition"] = t["min_partition"]
        if "cache_load_factor" in t and kernel(name, device) == "fused_uvm_caching":
            extra["cache_params"] = CacheParams(load_factor=t["cache_load_factor"])
        out[name] = ParameterConstraints(
            sharding_types=[t["sharding_type"]], compute_kernels=[kernel(name, device)],
            pooling_factors=[t["pooling_factor"]] * len(t["feature_names"]),
            feature_names=list(t["feature_names"]), **extra)
    return out


class _EveryTypeSharder(EmbeddingBagCollectionSharder):
    """TorchRec's sharder offers row_wise, table_row_wise and grid_shard for CUDA only; its CPU
    kernels run them too."""

    def sharding_types(self, compute_device_type):
        types = list(super().sharding_types(compute_device_type))
        extra = [s.value for s in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE,
                                   ShardingType.GRID_SHARD)]
        return types + [s for s in extra if s not in types]


def sharder(learning_rate, **fused_params):
    """An EmbeddingBagCollectionSharder with the plan's table optimizer fused into the backward."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    params = {"optimizer": getattr(EmbOptimType, FUSED_OPTIMIZER),
              "learning_rate": learning_rate, **fused_params}
    return _EveryTypeSharder(fused_params=params)


if __name__ == "__main__":
    print(sharding_plan())
'''


def _literal(tabs: dict) -> list[str]:
    """``TABLES = {...}``: one table per block, one shard per line (deterministic)."""
    lines = ["TABLES = {"]
    for name, t in tabs.items():
        head = {k: v for k, v in t.items() if k != "shards"}
        lines.append(f"    {name!r}: {{")
        for k, v in head.items():
            lines.append(f"        {k!r}: {v!r},")
        if t["shards"]:
            lines.append("        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank")
            lines += [f"            ({o!r}, {z!r}, {r}),".replace("[", "(").replace("]", ")")
                      for o, z, r in t["shards"]]
            lines.append("        ],")
        else:
            lines.append("        'shards': [],  # data-parallel: a full copy on every rank")
        lines.append("    },")
    lines.append("}")
    return lines


def to_torchrec(plan: Plan, version: str | None = None) -> str:
    """The plan's table sharding as a Python file for TorchRec ``version`` (default 1.8.0)."""
    version = engine_version(version)
    tabs = tables(plan)
    emb = plan.embeddings
    notes = _notes(plan, tabs)
    for note in notes:
        log.warning("export %s %s: %s", TARGET, version, note)
    opt = emb.get("table_optimizer", "sgd")
    if opt not in FUSED_OPTIMIZERS:
        raise SpecError(f"export torchrec: table optimizer {opt!r} is not one of "
                        f"{', '.join(FUSED_OPTIMIZERS)}")
    wrapped = [line for n in notes for line in textwrap.wrap(
        n, common.NOTE_WIDTH, initial_indent="- ", subsequent_indent="  ",
        break_on_hyphens=False)]
    lines = common.comment_block(_header(plan, version, tabs) + USE + [""] + [
        "Notes (each also warned on stderr):"] + wrapped)
    imports, body, collection = IMPORTS, BODY, "EmbeddingBagCollection"
    if not any(t.get("pooled", True) for t in emb["tables"]):  # an EmbeddingCollection's
        collection = "EmbeddingCollection"
        imports = imports.replace(
            "torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder",
            "torchrec.distributed.embedding import EmbeddingCollectionSharder")
        body = body.replace("EmbeddingBagCollectionSharder", "EmbeddingCollectionSharder")
    lines += ['"""TorchRec sharding of ' + plan.model["name"] + ' written by planner."""',
              imports, f"WORLD_SIZE = {int(emb['world_size'])}",
              f"LOCAL_WORLD_SIZE = {int(plan.cluster.get('gpus_per_node') or emb['world_size'])}",
              f"MODULE_PATH = {module_path(plan)!r}  # the {collection}'s path in the model",
              f"TABLE_OPTIMIZER = {opt!r}",
              f"FUSED_OPTIMIZER = {FUSED_OPTIMIZERS[opt]!r}  # fbgemm EmbOptimType member",
              ""]
    lines += _literal(tabs)
    lines += ["RANKS = {name: t['ranks'] for name, t in TABLES.items()}",
              '"""The rank of each shard (every rank for a data-parallel table)."""']
    return "\n".join(lines) + "\n" + body


def to_torchrec_json(plan: Plan, version: str | None = None) -> str:
    """The same sharding as JSON: world size, module path, fused optimizer and, per table, the
    sharding type, compute kernel, ranks and shards (placements for CUDA)."""
    version = engine_version(version)
    tabs = tables(plan)
    emb = plan.embeddings
    local = int(plan.cluster.get("gpus_per_node") or emb["world_size"])
    out = {"torchrec": version, "header": _header(plan, version, tabs),
           "world_size": int(emb["world_size"]), "local_world_size": local,
           "module_path": module_path(plan),
           "table_optimizer": emb.get("table_optimizer", "sgd"),
           "fused_optimizer": FUSED_OPTIMIZERS.get(emb.get("table_optimizer", "sgd")),
           "tables": {n: {**{k: v for k, v in t.items() if k != "shards"},
                          "shards": [{"offsets": o, "sizes": z, "rank": r,
                                      "placement": f"rank:{r}/cuda:{r % local}"}
                                     for o, z, r in t["shards"]]}
                      for n, t in tabs.items()}}
    return json.dumps(out, indent=1) + "\n"
