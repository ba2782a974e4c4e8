"""How many ATen ops one TorchRec training step issues: the measurement behind
planner.search.tables.HOST_OPS_COMMON, HOST_OPS_SHARDED and HOST_OPS_DATA_PARALLEL.

A DLRM with N one-feature tables (1,000 rows, dim 16, table-wise, FBGEMM's fused SGD) under
DistributedModelParallel on 2 gloo processes; after three warm-up steps, one step (forward, loss,
backward, dense optimizer; the batch is made before) is run under a dispatch mode that counts every ATen op. The dense part's
forward ops are counted the same way (planner.trace.recsys), so the sparse path's count is the
step's minus three times the dense forward's (forward plus a backward of about twice as many ops).
The count does not depend on the batch (64 here) nor on the rows.

Usage:  python benchmarks/torchrec_host_ops.py [--tables 8,26,64]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

BATCH = 64


def entry(n: int):
    from planner.inputs.zoo import RecEntry

    return RecEntry("count", tuple([1000] * n), 16, bottom=(64, 16), top=(64, 32, 1))


def _worker(rank: int, world: int, n: int, port: int, out, kinds=("table_wise",)) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from planner.trace.recsys import RecNet

    torch.manual_seed(0)
    model = RecNet(entry(n), device="meta")
    constraints = {f"t_cat_{i}": ParameterConstraints(sharding_types=[kinds[i % len(kinds)]])
                   for i in range(n)}
    sharders = [EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1})]
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"),
                                       constraints=constraints)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                   sharders=sharders)
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    opt = KeyedOptimizerWrapper(dense, lambda p: torch.optim.SGD(p, lr=0.1))
    keys = [f"cat_{i}" for i in range(n)]

    def batch():
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.randint(0, 1000, (n * BATCH,)),
            lengths=torch.ones(n * BATCH, dtype=torch.int32))
        return torch.randn(BATCH, 13), kjt, torch.rand(BATCH)

    def step(dense_x, kjt, labels):
        out = dmp(dense_x, kjt)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(-1), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(3):
        step(*batch())
    counter = Count()
    inputs = batch()  # the data loader's work, not the step's
    with counter:
        step(*inputs)
    if rank == 0:
        out.put(counter.n)
    dist.destroy_process_group()


class Count(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", default="8,26,64")
    ap.add_argument("--kinds", default="table_wise",
                    help="sharding types dealt round-robin over the tables (those TorchRec's stock "
                         "sharder offers on CPU: table_wise, column_wise, data_parallel)")
    args = ap.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    from planner.trace.recsys import RecNet, rec_model

    ctx = mp.get_context("spawn")
    rows = []
    for i, n in enumerate(int(x) for x in args.tables.split(",")):
        q = ctx.SimpleQueue()
        mp.start_processes(_worker, args=(2, n, 29610 + i, q, kinds), nprocs=2,
                           start_method="spawn")
        step_ops = q.get()
        dense = rec_model(RecNet(entry(n)), batch=BATCH).dense_ops
        rows.append((n, step_ops, dense, step_ops - 3 * dense))
        print(f"{n:3d} tables ({'+'.join(kinds)}): {step_ops} ops per step; dense forward {dense}; "
              f"sparse path {step_ops - 3 * dense}")
    if len(rows) >= 2:
        (n0, _, _, s0), (n1, _, _, s1) = rows[0], rows[-1]
        per = (s1 - s0) / (n1 - n0)
        print(f"sparse path = {s0 - per * n0:.0f} + {per:.1f} per feature")
    return 0


if __name__ == "__main__":
    sys.exit(main())
