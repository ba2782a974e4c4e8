"""A recommendation plan's tables in TorchRec's terms: its ``ShardingPlan`` and a sharder for CPUs.

One ``ParameterSharding`` per table: its sharding type, compute kernel, the rank of each shard, and
an ``EnumerableShardingSpec`` of the plan's shards (placements ``rank:r/cpu`` or ``rank:r/cuda:l``);
data-parallel tables have no spec and list every rank. Row-wise shards must be TorchRec's even
blocks (ceil(rows / world) rows, block r on rank r). No process group is needed.

On CPU (gloo): the stock ``EmbeddingBagCollectionSharder`` offers the row-wise types only for CUDA,
so ``cpu_sharder`` offers every type (TorchRec's CPU kernels run them); the UVM kernels, which need
a GPU, run as ``fused``.
"""

from __future__ import annotations

from planner.errors import SpecError
from planner.planfile.document import Plan

SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise",
                  "grid_shard")
"""TorchRec ShardingType values a plan may name."""
KERNELS = ("dense", "fused", "fused_uvm_caching", "fused_uvm")
"""TorchRec EmbeddingComputeKernel values a plan may name."""
DEVICE_KERNELS = {"cpu": ("dense", "fused")}
"""Compute kernels a device type runs; others run every kernel of KERNELS."""


def tables_of(plan: Plan) -> list[dict]:
    """The plan's tables, checked (SpecError, one line) for what the runtime relies on."""
    emb = plan.embeddings
    if not emb:
        raise SpecError("plan: it has no embeddings section (not a recommendation-model plan); "
                        "`plan run` runs it with the dense runtime")
    tables = emb.get("tables") or []
    if not tables:
        raise SpecError("plan: its embeddings section lists no tables")
    world = int(emb["world_size"])
    for t in tables:
        if t["sharding_type"] not in SHARDING_TYPES:
            raise SpecError(f"plan: table {t['name']}: sharding type {t['sharding_type']!r} is not "
                            f"one of {', '.join(SHARDING_TYPES)}")
        if t["compute_kernel"] not in KERNELS:
            raise SpecError(f"plan: table {t['name']}: compute kernel {t['compute_kernel']!r} is "
                            f"not one of {', '.join(KERNELS)}")
        for s in t["shards"]:
            if not 0 <= s["rank"] < world:
                raise SpecError(f"plan: table {t['name']}: a shard on rank {s['rank']} outside "
                                f"the {world} ranks")
        if t["sharding_type"] == "row_wise":
            _check_even_rows(t, world)
    return tables


def _check_even_rows(t: dict, world: int) -> None:
    """TorchRec's row-wise input distribution sends id i to rank i // ceil(rows / world): the
    shards must be those blocks, rank r holding block r."""
    block = -(-t["rows"] // world)
    for s in t["shards"]:
        lo = s["rank"] * block
        want = max(0, min(block, t["rows"] - lo))
        if s["offsets"] != [min(lo, t["rows"]), 0] or s["sizes"] != [want, t["dim"]]:
            raise SpecError(f"plan: table {t['name']}: row_wise shard on rank {s['rank']} is rows "
                            f"{s['offsets'][0]}+{s['sizes'][0]}; TorchRec's row-wise sharding "
                            f"needs rows {lo}+{want} (blocks of ceil(rows / world) = {block})")


def ordered_shards(t: dict) -> list[dict]:
    """The table's shards in TorchRec's order (by column, then row offset): column-wise outputs
    are concatenated in this order, row-wise ones follow it."""
    return sorted(t["shards"], key=lambda s: (s["offsets"][1], s["offsets"][0], s["rank"]))


def shard_ranks(t: dict, world: int) -> list[int]:
    """ParameterSharding.ranks: every rank for a data-parallel table, else the rank of each shard
    in order."""
    if t["sharding_type"] == "data_parallel":
        return list(range(world))
    return [s["rank"] for s in ordered_shards(t)]


def kernel_on(t: dict, device_type: str) -> str:
    """The compute kernel that runs the plan's kernel on ``device_type`` (UVM needs a GPU)."""
    kernels = DEVICE_KERNELS.get(device_type, KERNELS)
    return t["compute_kernel"] if t["compute_kernel"] in kernels else "fused"


def placement(rank: int, device_type: str, local_world: int) -> str:
    """TorchRec's placement string of a shard on ``rank``."""
    if device_type == "cpu":
        return f"rank:{rank}/cpu"
    return f"rank:{rank}/{device_type}:{rank % local_world}"


def sharding_plan(plan: Plan, *, device_type: str = "cpu", local_world: int | None = None,
                  module_path: str = "sparse"):
    """The plan's tables as a TorchRec ``ShardingPlan`` for the EmbeddingBagCollection at
    ``module_path`` (the zoo's RecNet keeps it at ``sparse``)."""
    from torchrec.distributed.types import (CacheParams,  # lazy: optional library
                                            EmbeddingModuleShardingPlan, EnumerableShardingSpec,
                                            ParameterSharding, ShardingPlan, ShardMetadata)

    world = int(plan.embeddings["world_size"])
    local = local_world or int(plan.cluster.get("gpus_per_node") or world)
    per_table = {}
    for t in tables_of(plan):
        spec = None
        if t["sharding_type"] != "data_parallel":
            spec = EnumerableShardingSpec([
                ShardMetadata(shard_offsets=list(s["offsets"]), shard_sizes=list(s["sizes"]),
                              placement=placement(s["rank"], device_type, local))
                for s in ordered_shards(t)])
        kernel = kernel_on(t, device_type)
        cache = (CacheParams(load_factor=float(t["cache_ratio"]))
                 if kernel == "fused_uvm_caching" and t.get("cache_ratio") is not None else None)
        per_table[t["name"]] = ParameterSharding(
            sharding_type=t["sharding_type"], compute_kernel=kernel,
            ranks=shard_ranks(t, world), sharding_spec=spec, cache_params=cache)
    return ShardingPlan({module_path: EmbeddingModuleShardingPlan(per_table)})


def cpu_sharder(fused_params: dict | None = None):
    """An EmbeddingBagCollectionSharder that offers every sharding type on CPU too."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # lazy: optional
    from torchrec.distributed.types import ShardingType  # lazy: as above

    class CpuEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
        """The stock sharder offers row_wise, table_row_wise and grid_shard only for CUDA; the
        CPU kernels run them too."""

        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = list(super().sharding_types(compute_device_type))
            if compute_device_type == "cpu":
                types += [s.value for s in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE,
                                            ShardingType.GRID_SHARD) if s.value not in types]
            return types

    return CpuEmbeddingBagCollectionSharder(fused_params=fused_params)
