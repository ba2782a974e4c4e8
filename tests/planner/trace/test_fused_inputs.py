"""What a fused chain keeps in place of the saved tensors it drops (planner.trace.fusion
fused_kept_inputs): its backward computes those again from the tensors entering the chain, so a
fused stack keeps those where no op keeps them already."""

import json

import torch
from torch import nn

from costmodels import memory
from planner import prepare
from tests.conftest import TINY_GPT_OSS

TOKENS, D, F = 32, 64, 128


class BiasGLU(nn.Module):
    """A gated activation whose bias is added apart from its GEMM, as gpt-oss's experts add theirs
    (in place, after a grouped GEMM): the fused bias-GLU kernel keeps its input, the GEMM's
    output, which eager code never saves (it keeps the biased tensor instead)."""

    def __init__(self, inplace: bool):
        super().__init__()
        self.inplace = inplace
        self.up = nn.Linear(D, 2 * F, bias=False)
        self.bias = nn.Parameter(torch.zeros(2 * F))
        self.down = nn.Linear(F, D, bias=False)

    def forward(self, x):
        h = self.up(x)
        h = h.add_(self.bias) if self.inplace else h + self.bias
        gate, up = h.chunk(2, dim=-1)
        gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
        return x + self.down(gate * torch.sigmoid(1.702 * gate) * (up + 1))


class Stack(nn.Module):
    def __init__(self, inplace: bool):
        super().__init__()
        self.layers = nn.Sequential(*[BiasGLU(inplace) for _ in range(3)])

    def forward(self, x):
        return self.layers(x).sum()


def _layer(inplace: bool):
    prepared = prepare(Stack(inplace), example_inputs=(torch.randn(1, TOKENS, D),),
                       dtype="fp32", cache_dir=None)
    return next(b.work for b in prepared.blocks.blocks if b.name == "layers.1")


def test_a_fused_gated_activation_keeps_its_input_where_the_bias_is_added_apart():
    """A review: gpt-oss's fused activation memory kept only the down projection's input; the
    bias-GLU kernel's own input (the up projection's output, 2F wide) was counted nowhere."""
    word = 4
    for inplace in (False, True):
        w = _layer(inplace)
        fused = w.act_bytes_tp + w.act_bytes_rep - w.act_fused_away_tp - w.act_fused_away_rep
        # the layer's input (the up projection's), the GEMM's output the fused chain keeps, and
        # the down projection's input
        assert fused == TOKENS * (D + 2 * F + F) * word, inplace
        eager = w.act_bytes_tp + w.act_bytes_rep
        assert eager > fused  # eager code keeps the chain's intermediates instead


def test_gpt_oss_experts_keep_their_activations_input_and_not_the_weighted_output(tmp_path):
    """gpt-oss's experts add their biases apart from both grouped GEMMs: a fused stack keeps the
    first GEMM's output (the bias-GLU kernel's input) and, where the routing weights multiply
    the activation before the last GEMM (moe_probs_in_activation, Megatron-Core), not the last
    GEMM's output (a review: keeping the entering tensors had counted it back in)."""
    cfg = dict(TINY_GPT_OSS)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    prepared = prepare(str(tmp_path / "config.json"), seq_len=64, cache_dir=None)
    w = next(b.work for b in prepared.blocks.blocks if b.name == "model.layers.1")
    copies = 64 * cfg["num_experts_per_tok"]
    word = 2
    assert w.act_routed_weighted == copies * cfg["hidden_size"] * word  # the last GEMM's output

    def kept(**kw):
        return memory.activation_bytes(w, micro_batch=1, tp=1, sp=False, recompute="none",
                                       fused=True, **kw)
    assert kept(probs_in_activation=False) - kept(probs_in_activation=True) == \
        w.act_routed_weighted
    # the routed part a fused stack keeps: the first GEMM's input and output (gate and up,
    # 2 x intermediate wide), the last GEMM's input, and without the weights inside the
    # activation the last GEMM's output for the weights' gradient
    routed = w.act_routed_rep - w.act_routed_fused_away_rep
    assert routed >= copies * (cfg["hidden_size"] + 2 * cfg["intermediate_size"]
                               + cfg["intermediate_size"] + cfg["hidden_size"]) * word
