"""The host-side cost of the runtime's DTensor engine, measured on CPUs.

``plan run`` shards Linears with DTensor and wraps data-parallel modules with FSDP2, whose
parameters are DTensors; every op on them goes through DTensor's Python dispatch (sharding
propagation, wrapping), which on a CPU runs on the same core as the math. Measured on tiny tensors
in a one-rank tensor-parallel mesh, against the same work on plain tensors:
- per column/row-parallel Linear, the extra seconds of its forward and of its backward;
- per parameter tensor, the extra seconds of one AdamW step.
On GPUs this host work overlaps the asynchronous kernels and is left at 0. Runs inside a process
group (planner.profile.collectives starts it).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

from planner.profile.timing import Timer
from planner.runtime.parallelize import SharedInput, SharedInputColwise


def dtensor_overheads(world: int) -> dict:
    """Extra host seconds of the runtime's DTensor path (see the module docstring)."""
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))["tp"]
    torch.manual_seed(0)

    def pair():
        return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16))

    plain, sharded = pair(), pair()
    parallelize_module(sharded, mesh, {"0": SharedInputColwise(SharedInput()),
                                       "1": RowwiseParallel()})
    x = torch.randn(4, 16, requires_grad=True)
    reps = 50

    def forward(m):
        def run():
            for _ in range(reps):
                m(x)
        return run

    def both(m):
        def run():
            for _ in range(reps):
                m(x).sum().backward()
        return run

    timer = Timer("cpu")
    fwd = timer.median_s(forward(sharded), min_s=0.2) - timer.median_s(forward(plain), min_s=0.2)
    total = timer.median_s(both(sharded), min_s=0.2) - timer.median_s(both(plain), min_s=0.2)
    per_linear_fwd = max(0.0, fwd / reps / 2)
    per_linear_bwd = max(0.0, (total - fwd) / reps / 2)

    tensors = 64
    plain_p = [nn.Parameter(torch.randn(64)) for _ in range(tensors)]
    dt_p = [nn.Parameter(distribute_tensor(torch.randn(64), mesh, [Replicate()]))
            for _ in range(tensors)]
    for p in plain_p:
        p.grad = torch.randn_like(p)
    for p in dt_p:
        p.grad = distribute_tensor(torch.randn(64), mesh, [Replicate()])
    opt_plain = torch.optim.AdamW(plain_p, lr=1e-4)
    opt_dt = torch.optim.AdamW(dt_p, lr=1e-4)
    per_param = max(0.0, (timer.median_s(opt_dt.step, min_s=0.2)
                          - timer.median_s(opt_plain.step, min_s=0.2)) / tensors)
    return {"linear_fwd_us": per_linear_fwd * 1e6, "linear_bwd_us": per_linear_bwd * 1e6,
            "param_step_us": per_param * 1e6}
