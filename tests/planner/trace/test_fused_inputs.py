"""What a fused chain keeps in place of the saved tensors it drops (planner.trace.fusion
fused_kept_inputs): its backward computes those again from the tensors entering the chain, so a
fused stack keeps those where no op keeps them already."""

import torch
from torch import nn

from planner import prepare

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
