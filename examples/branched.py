"""A user-defined model with a branch: two towers read the same embedding and merge.

Plan it with:  plan solve examples/branched.py:build --cluster dgx-a100-80g --global-batch 64

``build`` returns ``(model, example_inputs)``; the planner calls it on the meta device, so the
weights are never allocated.
"""

import torch
from torch import nn


class Tower(nn.Module):
    """A residual MLP stack."""

    def __init__(self, width: int, depth: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(depth))
        self.down = nn.ModuleList(nn.Linear(4 * width, width) for _ in range(depth))

    def forward(self, x):
        for up, down in zip(self.up, self.down):
            x = x + down(torch.relu(up(self.norm(x))))
        return x


class TwoTower(nn.Module):
    """embed -> (tower_a, tower_b) -> merge -> head."""

    def __init__(self, vocab: int = 32000, width: int = 2048, depth: int = 4, classes: int = 1000):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.tower_a = Tower(width, depth)
        self.tower_b = Tower(width, depth)
        self.merge = nn.Linear(2 * width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        a = self.tower_a(x)
        b = self.tower_b(x)
        y = self.merge(torch.cat([a, b], dim=-1))
        return self.head(torch.relu(y)).mean(dim=1)


def build(seq_len: int = 512, batch: int = 8):
    model = TwoTower()
    tokens = torch.randint(0, 32000, (batch, seq_len))
    return model, (tokens,)
