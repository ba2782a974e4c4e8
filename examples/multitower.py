"""A wide DAG: many parallel towers of different depths read one embedding and are merged.

About 5,200 traced ops; its blocks (one per tower) form a DAG, so the planner assigns them to
pipeline stages with CP-SAT. Used by benchmarks/planning_time.py.

    plan solve examples/multitower.py:build --cluster dgx-a100-80g --nodes 8 --global-batch 256 \
        --fix pp=8 --time-limit 30
"""

import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, width: int, expand: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, expand * width)
        self.down = nn.Linear(expand * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Tower(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        # expansion 1..3 by position: no two consecutive layers alike, so the tracer has to
        # trace every op (no repeated-layer shortcut)
        self.layers = nn.ModuleList(Layer(width, 1 + j % 3) for j in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class MultiTower(nn.Module):
    """embed -> towers (depths 16..40, in parallel) -> concatenate -> merge -> head."""


    def __init__(self, towers: int = 38, width: int = 512, vocab: int = 32000):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.towers = nn.ModuleList(Tower(width, 16 + (7 * i) % 25) for i in range(towers))
        self.merge = nn.Linear(towers * width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        y = torch.cat([tower(x) for tower in self.towers], dim=-1)
        return self.head(torch.relu(self.merge(y)))


def build(seq_len: int = 1024, batch: int = 1):
    return MultiTower(), (torch.randint(0, 32000, (batch, seq_len)),)
