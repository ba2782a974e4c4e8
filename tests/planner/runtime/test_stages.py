"""Stages cut by module, chained in one process, compute exactly what the whole model computes.

No torch.distributed here: each stage's StageModule runs on what the previous one returned, and
the gradients are handed back by hand, as pipelining does between processes.
"""

import copy

import pytest
import torch

from planner.planfile.document import load_plan
from planner.runtime import model as mdl
from planner.runtime.build import cut_model
from planner.runtime.stages import StageModule


def _setup(plan_path):
    plan = load_plan(plan_path)
    spec = plan.model_spec()
    real = mdl.build_real(plan, spec, mdl.resolve_meta(plan, spec), seed=0)
    inputs = mdl.synthetic_batch(real, plan.training["global_batch"], seed=0)
    units, flow, cuts = cut_model(plan, real, inputs)
    return plan, real, inputs, units, flow, cuts


def _chain(real, units, flow, cuts, inputs, targets):
    """Forward through every stage, then backward stage by stage; returns loss and grads."""
    mods = [StageModule(copy.deepcopy(real.module), c, flow, units, real.kwargs,
                        mdl.output_logits) for c in cuts]
    for m in mods:
        m.attach_hooks()
    carry, saved = tuple(inputs), []
    for m in mods:
        recv = tuple(x.detach().requires_grad_(x.is_floating_point()) for x in carry)
        carry = m(*recv)
        saved.append((recv, carry))
    loss = mdl.loss_fn(carry, targets)
    grads_out = None
    for recv, out in reversed(saved):
        if grads_out is None:
            loss.backward()
        else:
            pairs = [(o, g) for o, g in zip(out, grads_out) if o.requires_grad and g is not None]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads_out = [x.grad for x in recv]
    grads = {}
    for m in mods:
        for n, p in m.named_parameters():
            grads[n.removeprefix("model.")] = p.grad
    return loss, grads


@pytest.mark.parametrize("model,fix,carried", [
    # (two stages: unpinned, the search finds interleaving's four chunks faster since it keeps
    # TIE_POOL estimates, as with runners-up asked for)
    ("branched", "pp=2,tp=1,dp=1,schedule=1f1b,micro_batch=2", {("embed", 0), ("tower_a", 0)}),
    ("branched", "pp=2,tp=1,dp=1,schedule=interleaved-1f1b,vpp=2,micro_batch=2", None),
    ("llama", "pp=2,tp=1,dp=1,micro_batch=2", None),
    ("gpt2", "pp=2,tp=1,dp=1,micro_batch=2", None),
    ("multitower", "pp=4,tp=1,dp=1,micro_batch=2", None),
])
def test_chained_stages_equal_the_whole_model(make_plan, model, fix, carried):
    plan, real, inputs, units, flow, cuts = _setup(make_plan(model, fix))
    assert [c.units for c in cuts] == [tuple(u) for u in units]
    if carried is not None:  # the DAG: stage 1 reads the embedding past tower_a
        assert set(cuts[0].carry_out) == carried == set(cuts[1].carry_in)
    mb = tuple(x[:2] for x in inputs)
    ref_logits = mdl.output_logits(real.module(*mb, **real.kwargs))
    targets = mdl.synthetic_targets(tuple(ref_logits.shape), 2, seed=0)
    ref_loss = mdl.loss_fn(ref_logits, targets)
    ref_loss.backward()
    loss, grads = _chain(real, units, flow, cuts, mb, targets)
    assert loss.item() == pytest.approx(ref_loss.item(), abs=1e-6)
    ref = dict(real.module.named_parameters(remove_duplicate=False))
    assert set(grads) == set(ref)
    summed = {}  # a tied parameter's copies (one per stage) add up to its gradient
    for name, g in grads.items():
        assert g is not None, name
        summed[id(ref[name])] = summed.get(id(ref[name]), 0) + g
    for name, p in real.module.named_parameters():
        torch.testing.assert_close(summed[id(p)], p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_every_stage_of_an_interleaved_dag_passes_what_later_stages_read(make_plan):
    """branched at pp=2 x vpp=2: embed+tower_a | tower_b | merge | head. tower_b (stage 1) reads
    the embedding, so stage 0 must pass it on with tower_a's output; merge (stage 2) reads both
    towers, so stage 1 passes tower_a's on beside its own."""
    _, _, _, units, _, cuts = _setup(make_plan(
        "branched", "pp=2,tp=1,dp=1,schedule=interleaved-1f1b,vpp=2,micro_batch=2"))
    assert [c.units for c in cuts] == [("embed", "tower_a"), ("tower_b",), ("merge",), ("head",)]
    assert set(cuts[0].carry_out) == {("embed", 0), ("tower_a", 0)}
    assert set(cuts[1].carry_out) == {("tower_a", 0), ("tower_b", 0)}
    assert cuts[2].carry_out == (("merge", 0),) and cuts[3].carry_out == ()


def test_a_model_returning_its_loss_is_told_the_runtime_wants_logits():
    """plan run trains on logits with its own loss: a factory whose forward returns a loss is
    told so in one line (a new-user check got an IndexError)."""
    from planner.errors import SpecError

    with pytest.raises(SpecError, match=r"returns a tensor of shape \[\], but plan run trains on "
                                        r"logits"):
        mdl.synthetic_targets((), 4, seed=0)
    assert mdl.synthetic_targets((4, 16, 10), 4, seed=0).shape == (4, 16)


def test_a_later_stage_receiving_a_model_input_runs_w_inside_b():
    """torch's split weight pass crashed (SIGSEGV) on a later stage whose cross-attention reads
    a float model input it receives (a diffusion UNet's text context, a review): such a stage,
    like one receiving token ids, computes its weight gradients in B; the first stage, which
    reads the model's inputs anyway, and a later stage receiving activations only do not."""
    from types import SimpleNamespace

    from planner.runtime.build import _whole_backward

    def stage(index, carry_in):
        cut = SimpleNamespace(units=["up"], carry_in=carry_in, index=index)
        return SimpleNamespace(cut=cut, id_ranges={1: (0, 999)}, model=None)

    flow = SimpleNamespace(reused=[], feeds={})
    plan = SimpleNamespace(parallel={"recompute": "none"})
    context = [("input", 2), ("activation", "mid")]
    out = SimpleNamespace(notes=[])
    assert _whole_backward(stage(1, context), flow, True, plan, out) is not None
    assert out.notes == ["stage 1: W runs inside B (it reads model input 2 beside the activations "
                         "it receives; torch's split backward cannot handle that)"]
    for module in (stage(0, [("input", 0)]), stage(1, [("activation", "mid")])):
        assert _whole_backward(module, flow, True, plan, SimpleNamespace(notes=[])) is None
    assert _whole_backward(stage(1, context), flow, False, plan, out) is None  # no split at all
