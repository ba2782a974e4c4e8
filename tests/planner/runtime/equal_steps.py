"""The check both equivalence tests make: one optimizer step of a plan run by the runtime gives
the loss and the updated parameters of the same step on one process."""

import os

import pytest
import torch

from planner.runtime import model as mdl
from planner.runtime.options import RunOptions
from planner.runtime.reference import single_process

KEY_BIAS = ("k_proj.bias", "key.bias")
"""A key projection's bias adds the same q . b to every score of a query, which the softmax takes
off: its gradient is zero whatever the data (a ViT's), so it does not move."""


def assert_equals_single_process(plan, result: dict, dump: str, *, lr: float, tol: float) -> None:
    """``result`` and the parameters dumped under ``dump`` (job.py) against one process; every
    trained parameter (but a key bias, KEY_BIAS) must also move by more than 10 x ``tol``, or the
    comparison would be blind, and every frozen one (requires_grad=False) must not move at all."""
    ref_losses, ref_params = single_process(plan, RunOptions(steps=1, warmup=0, lr=lr,
                                                             device="cpu"))
    assert result["loss_per_step"] == pytest.approx(ref_losses, abs=tol)
    got = {}
    for f in sorted(os.listdir(dump)):
        got.update(torch.load(os.path.join(dump, f)))
    assert set(got) == set(ref_params)
    spec = plan.model_spec()
    initial = mdl.build_real(plan, spec, mdl.resolve_meta(plan, spec), seed=0).module
    for name, p0 in initial.named_parameters(remove_duplicate=False):
        if not p0.requires_grad:
            assert torch.equal(got[name], p0.detach()), f"{name} is frozen but moved"
            continue
        moved = (ref_params[name] - p0).abs().max().item()
        assert moved > 10 * tol or name.endswith(KEY_BIAS), f"{name} barely moves ({moved:.3g}): the test would be blind"
        diff = (got[name] - ref_params[name]).abs().max().item()
        assert diff <= tol, f"{name}: differs from the single-process step by {diff:.3g}"
