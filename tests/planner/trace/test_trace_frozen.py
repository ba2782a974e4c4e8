"""Frozen parameters (requires_grad=False) in the trace: the backward autograd would skip is not
priced, and the blocks stay those of the model trained whole."""

import pytest
import torch
from torch import nn

from costmodels.compute import block_time
from costmodels.hardware import get_device
from planner import prepare
from planner.trace.models import fingerprint

WIDTH, LAYERS = 64, 5


class Stack(nn.Module):
    def __init__(self, layers=LAYERS):
        super().__init__()
        self.embed = nn.Embedding(256, WIDTH)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                                  nn.Linear(4 * WIDTH, WIDTH))
                                    for _ in range(layers))
        self.head = nn.Linear(WIDTH, 256)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def _prepared(freeze=(), layers=LAYERS):
    model = Stack(layers)
    for name in freeze:
        model.get_submodule(name).requires_grad_(False)
    return prepare(model, example_inputs=(torch.randint(0, 256, (2, 16)),), cache_dir=None)


@pytest.fixture(scope="module")
def whole():
    """Two layers: no stack of layers to copy, so each is traced (as a frozen one is)."""
    return _prepared(layers=2)


def _by_name(prepared):
    return {b.name: b for b in prepared.blocks.blocks}


def test_a_frozen_prefix_runs_forward_only(whole):
    """The embedding and the first layer frozen: they compute no gradient and keep nothing for a
    backward; the first layer that trains computes its weights' gradients but not its input's;
    the head is priced as before. Blocks, order and edges (the dataflow a pipeline follows) are
    unchanged."""
    frozen = _prepared(("embed", "layers.0"), layers=2)
    a, b = _by_name(whole), _by_name(frozen)
    assert list(a) == list(b) and "layers.1.0" in a  # (each Linear and the GELU a block)
    assert [(e.src, e.dst, e.nbytes) for e in whole.blocks.edges] == \
        [(e.src, e.dst, e.nbytes) for e in frozen.blocks.edges]
    for name in [n for n in b if n == "embed" or n.startswith("layers.0.")]:
        w = b[name].work
        assert w.bwd_flops == 0 and w.act_bytes_tp + w.act_bytes_rep == 0 and w.input_bytes == 0
        assert w.fwd_flops == a[name].work.fwd_flops
        # what its forward holds while it runs (an op's input and output), as large as the
        # trained block's backward pair here (a new-user check found it left out: a frozen
        # tower planned at a micro-batch whose forward alone could not fit)
        held = w.bwd_transient_tp + w.bwd_transient_rep
        assert held > 0 and held == a[name].work.bwd_transient_tp + a[name].work.bwd_transient_rep
    assert a["layers.0.0"].work.bwd_flops > 0
    # the input gradient of layers.1's first GEMM is the one product it skips (16 tokens per
    # sample, WIDTH -> 4 x WIDTH)
    skipped = 2 * 16 * WIDTH * 4 * WIDTH
    assert b["layers.1.0"].work.bwd_flops == pytest.approx(a["layers.1.0"].work.bwd_flops - skipped)
    for name in ("layers.1.1", "layers.1.2", "head"):
        assert b[name].work == a[name].work
    # priced forward only: no backward, and nothing recomputed under full recomputation (a
    # review found the memory-bound ops' backward and the recomputation still priced)
    h100 = get_device("h100")
    for name in b:
        runs = not (name == "embed" or name.startswith("layers.0."))
        assert b[name].work.runs_backward == float(runs)
        t = block_time(b[name].work, h100, dtype="bf16", micro_batch=4, tp=1, sp=False,
                       recompute="full")
        assert (t.bwd_s > 0 and t.recompute_s == t.fwd_s) if runs else \
            (t.bwd_s == t.recompute_s == 0 and t.fwd_s > 0)
    model = Stack(2)
    assert frozen.info["frozen_params"] == sum(
        p.numel() for m in (model.embed, model.layers[0]) for p in m.parameters())


def test_a_frozen_weight_skips_only_its_weight_gradient(whole):
    """A frozen head with trained layers before it: the head's GEMM computes its input's
    gradient (the layers need it), not its weight's."""
    frozen = _prepared(("head",))
    rows_a = _by_name(whole)["head"].work.gemms
    rows_b = _by_name(frozen)["head"].work.gemms
    assert [(g.grad_a, g.grad_b) for g in rows_a] == [(True, True)]
    assert [(g.grad_a, g.grad_b) for g in rows_b] == [(True, False)]


def test_what_is_frozen_is_part_of_the_fingerprint_and_of_a_layer_stack():
    """A cached trace of the model trained whole is not reused for a frozen one; layers that
    differ in what is frozen are traced whole rather than copied from the second one."""
    model = Stack()
    before = fingerprint(model)[0]
    model.layers[3].requires_grad_(False)
    assert fingerprint(model)[0] != before
    prepared = _prepared(("layers.3",))
    (repeat,) = prepared.opgraph.repeats
    assert repeat.traced == repeat.count == LAYERS
    b = _by_name(prepared)
    assert b["layers.3"].work.bwd_flops < b["layers.4"].work.bwd_flops
    params = prepared.opgraph.params
    assert not params["layers.3.0.weight"].trainable and params["layers.4.0.weight"].trainable
