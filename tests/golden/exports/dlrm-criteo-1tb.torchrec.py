# torchrec 1.8.0 sharding exported by planner from a plan (planner.plan/v1).
# model dlrm-criteo-1tb  fingerprint 57c4e984306e7728  input_hash 3c334196ec439d89  planner 0.1.0
# plan: 26 tables over 8 ranks (3 column_wise, 1 data_parallel, 1 row_wise, 21 table_wise)
# table optimizer sgd, pipeline sparse-dist; predicted step 43.38 ms
# on 8 x a100-40g (dgx-a100-40g: 1 node x 8); global batch 65536 (8192 per rank), fp32, sgd
# Written for torchrec 1.8.0 with fbgemm-gpu 1.8.0.
# Use (model: your module, its EmbeddingBagCollection at MODULE_PATH; one process per rank):
#     spec = importlib.util.spec_from_file_location('sharding', 'THIS_FILE.py')
#     sharding = importlib.util.module_from_spec(spec); spec.loader.exec_module(sharding)
#     model = DistributedModelParallel(model, device=device, plan=sharding.sharding_plan(),
#                                      sharders=[sharding.sharder(learning_rate=0.01)])
# or let TorchRec plan within the plan's choices:
#     planner = EmbeddingShardingPlanner(topology, constraints=sharding.constraints())
#     plan = planner.plan(model, [sharding.sharder(learning_rate=0.01)])
# `python THIS_FILE.py` prints the ShardingPlan.
#
# Notes (each also warned on stderr):
# - ParameterConstraints has no ranks: constraints() lets TorchRec's planner place the shards
#   (RANKS lists the plan's); sharding_plan() pins them exactly
# - pipeline sparse-dist: train with torchrec.distributed.train_pipeline.TrainPipelineSparseDist
#   (the next batch's input distribution overlaps this step), as the plan was priced
# - fused_uvm_caching tables: the plan's cache ratio is CacheParams(load_factor)
# - the dense part: data-parallel (DDP, as DistributedModelParallel wraps it) with sgd; the
#   learning rates are yours
"""TorchRec sharding of dlrm-criteo-1tb written by planner."""

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import (CacheParams, EmbeddingModuleShardingPlan,
                                        EnumerableShardingSpec, ParameterSharding, ShardingPlan,
                                        ShardingType, ShardMetadata)

WORLD_SIZE = 8
LOCAL_WORLD_SIZE = 8
MODULE_PATH = 'sparse'  # the EmbeddingBagCollection's path in the model
TABLE_OPTIMIZER = 'sgd'
FUSED_OPTIMIZER = 'EXACT_SGD'  # fbgemm EmbOptimType member

TABLES = {
    't_cat_0': {
        'sharding_type': 'column_wise',
        'compute_kernel': 'fused_uvm_caching',
        'ranks': [0, 4, 4, 6],
        'rows': 45833188,
        'dim': 128,
        'feature_names': ['cat_0'],
        'pooling_factor': 1.0,
        'min_partition': 32,
        'cache_load_factor': 0.5,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (45833188, 32), 0),
            ((0, 32), (45833188, 32), 4),
            ((0, 64), (45833188, 32), 4),
            ((0, 96), (45833188, 32), 6),
        ],
    },
    't_cat_1': {
        'sharding_type': 'row_wise',
        'compute_kernel': 'fused',
        'ranks': [0, 1, 2, 3, 4, 5, 6, 7],
        'rows': 36746,
        'dim': 128,
        'feature_names': ['cat_1'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (4594, 128), 0),
            ((4594, 0), (4594, 128), 1),
            ((9188, 0), (4594, 128), 2),
            ((13782, 0), (4594, 128), 3),
            ((18376, 0), (4594, 128), 4),
            ((22970, 0), (4594, 128), 5),
            ((27564, 0), (4594, 128), 6),
            ((32158, 0), (4588, 128), 7),
        ],
    },
    't_cat_2': {
        'sharding_type': 'data_parallel',
        'compute_kernel': 'dense',
        'ranks': [0, 1, 2, 3, 4, 5, 6, 7],
        'rows': 17245,
        'dim': 128,
        'feature_names': ['cat_2'],
        'pooling_factor': 1.0,
        'shards': [],  # data-parallel: a full copy on every rank
    },
    't_cat_3': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [1],
        'rows': 7413,
        'dim': 128,
        'feature_names': ['cat_3'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (7413, 128), 1),
        ],
    },
    't_cat_4': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 20243,
        'dim': 128,
        'feature_names': ['cat_4'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (20243, 128), 4),
        ],
    },
    't_cat_5': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 3,
        'dim': 128,
        'feature_names': ['cat_5'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (3, 128), 4),
        ],
    },
    't_cat_6': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 7114,
        'dim': 128,
        'feature_names': ['cat_6'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (7114, 128), 4),
        ],
    },
    't_cat_7': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 1441,
        'dim': 128,
        'feature_names': ['cat_7'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (1441, 128), 4),
        ],
    },
    't_cat_8': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [3],
        'rows': 62,
        'dim': 128,
        'feature_names': ['cat_8'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (62, 128), 3),
        ],
    },
    't_cat_9': {
        'sharding_type': 'column_wise',
        'compute_kernel': 'fused',
        'ranks': [4, 4],
        'rows': 29275261,
        'dim': 128,
        'feature_names': ['cat_9'],
        'pooling_factor': 1.0,
        'min_partition': 64,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (29275261, 64), 4),
            ((0, 64), (29275261, 64), 4),
        ],
    },
    't_cat_10': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 1572176,
        'dim': 128,
        'feature_names': ['cat_10'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (1572176, 128), 4),
        ],
    },
    't_cat_11': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 345138,
        'dim': 128,
        'feature_names': ['cat_11'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (345138, 128), 4),
        ],
    },
    't_cat_12': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 10,
        'dim': 128,
        'feature_names': ['cat_12'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (10, 128), 4),
        ],
    },
    't_cat_13': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 2209,
        'dim': 128,
        'feature_names': ['cat_13'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (2209, 128), 4),
        ],
    },
    't_cat_14': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 11267,
        'dim': 128,
        'feature_names': ['cat_14'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (11267, 128), 4),
        ],
    },
    't_cat_15': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 128,
        'dim': 128,
        'feature_names': ['cat_15'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (128, 128), 4),
        ],
    },
    't_cat_16': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 4,
        'dim': 128,
        'feature_names': ['cat_16'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (4, 128), 4),
        ],
    },
    't_cat_17': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 974,
        'dim': 128,
        'feature_names': ['cat_17'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (974, 128), 4),
        ],
    },
    't_cat_18': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 14,
        'dim': 128,
        'feature_names': ['cat_18'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (14, 128), 4),
        ],
    },
    't_cat_19': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [3],
        'rows': 48937457,
        'dim': 128,
        'feature_names': ['cat_19'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (48937457, 128), 3),
        ],
    },
    't_cat_20': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused_uvm_caching',
        'ranks': [7],
        'rows': 11316796,
        'dim': 128,
        'feature_names': ['cat_20'],
        'pooling_factor': 1.0,
        'cache_load_factor': 0.5,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (11316796, 128), 7),
        ],
    },
    't_cat_21': {
        'sharding_type': 'column_wise',
        'compute_kernel': 'fused',
        'ranks': [6, 4],
        'rows': 40094537,
        'dim': 128,
        'feature_names': ['cat_21'],
        'pooling_factor': 1.0,
        'min_partition': 64,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (40094537, 64), 6),
            ((0, 64), (40094537, 64), 4),
        ],
    },
    't_cat_22': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 452104,
        'dim': 128,
        'feature_names': ['cat_22'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (452104, 128), 4),
        ],
    },
    't_cat_23': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [2],
        'rows': 12606,
        'dim': 128,
        'feature_names': ['cat_23'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (12606, 128), 2),
        ],
    },
    't_cat_24': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 104,
        'dim': 128,
        'feature_names': ['cat_24'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (104, 128), 4),
        ],
    },
    't_cat_25': {
        'sharding_type': 'table_wise',
        'compute_kernel': 'fused',
        'ranks': [4],
        'rows': 35,
        'dim': 128,
        'feature_names': ['cat_25'],
        'pooling_factor': 1.0,
        'shards': [  # (row, col) offsets, (rows, cols) sizes, rank
            ((0, 0), (35, 128), 4),
        ],
    },
}
RANKS = {name: t['ranks'] for name, t in TABLES.items()}
"""The rank of each shard (every rank for a data-parallel table)."""

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
