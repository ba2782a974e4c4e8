"""The same training steps in one process, without any parallelism: what a plan's run must equal.

Same weights (seed), same synthetic batch and targets, same loss and optimizer as the runtime; the
whole global batch in one forward, so the loss is the mean over every position, which is what the
runtime's mean over micro-batches and data-parallel replicas equals when they are all the same size.
"""

from __future__ import annotations

import torch

from planner.planfile.document import Plan
from planner.runtime import model as mdl
from planner.runtime.options import RunOptions


def single_process(plan: Plan, opts: RunOptions) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Loss of every step and the parameters after the last one, under every name the model
    gives them (a tied parameter appears under each)."""
    spec = plan.model_spec(opts.model)
    meta = mdl.resolve_meta(plan, spec)
    real = mdl.build_real(plan, spec, meta, seed=opts.seed)
    batch = plan.training["global_batch"]
    inputs = mdl.synthetic_batch(real, batch, seed=opts.seed)
    optimizer = mdl.make_optimizer(plan, real.module.parameters(), opts.lr)
    losses, targets = [], None
    for _ in range(opts.warmup + opts.steps):
        logits = mdl.output_logits(real.module(*inputs, **real.kwargs))
        if targets is None:
            targets = mdl.synthetic_targets(tuple(logits.shape), batch, seed=opts.seed)
        loss = mdl.loss_fn(logits, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    params = {n: p.detach().clone()
              for n, p in real.module.named_parameters(remove_duplicate=False)}
    return losses, params
