"""Small nn.Module models for fuzzing the planner (benchmarks/fuzz.py and
tests/planner/test_api_fuzz.py).

``build(kind, seq_len=..., **dims)`` returns ``(model, example_inputs)`` as a MODEL factory does;
the planner calls factories on the meta device, so nothing here allocates weights there. The kinds
cover the shapes of graph the planner coarsens differently:

- ``mlp``: embedding, a chain of residual MLP layers (a ModuleList), a head: a chain of blocks;
- ``towers``: one embedding read by two towers that merge: a DAG of blocks;
- ``encoder``: ``nn.TransformerEncoder`` (a leaf-heavy module priced from its ATen ops);
- ``conv``: a convolutional image classifier (no sequence dimension);
- ``raises``: a factory that raises (user code failing: a one-line error is expected);
- ``bad_return``: a factory that returns something other than (module, inputs).
"""

from __future__ import annotations

import torch
from torch import nn

KINDS = ("mlp", "towers", "encoder", "conv")
"""Kinds that build a model."""
BROKEN_KINDS = ("raises", "bad_return")
"""Kinds whose factory fails (the planner must answer with one line)."""


class MLPStack(nn.Module):
    """embed -> depth x (x + W2 relu(W1 norm(x))) -> norm -> head."""

    def __init__(self, vocab: int, width: int, depth: int, ffn: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.ups = nn.ModuleList(nn.Linear(width, ffn) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(ffn, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = x + down(torch.relu(up(norm(x))))
        return self.head(self.norm(x)).float().logsumexp(-1).mean()


class Tower(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width),
                                                  nn.GELU(), nn.Linear(2 * width, width))
                                    for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


class TwoTower(nn.Module):
    """embed -> (tower_a, tower_b) -> concat -> merge -> head: blocks form a DAG."""

    def __init__(self, vocab: int, width: int, depth: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.tower_a = Tower(width, depth)
        self.tower_b = Tower(width, max(1, depth - 1))
        self.merge = nn.Linear(2 * width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        y = self.merge(torch.cat([self.tower_a(x), self.tower_b(x)], dim=-1))
        return self.head(torch.relu(y)).float().mean()


class Encoder(nn.Module):
    """embed -> nn.TransformerEncoder -> head."""

    def __init__(self, vocab: int, width: int, heads: int, depth: int, ffn: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, ffn, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens))).float().mean()


class ConvNet(nn.Module):
    """depth x (conv 3x3 + relu) -> pool -> linear."""

    def __init__(self, channels: int, depth: int, classes: int):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1)
                                   for _ in range(depth))
        self.head = nn.Linear(channels, classes)

    def forward(self, images):
        x = torch.relu(self.stem(images))
        for conv in self.convs:
            x = x + torch.relu(conv(x))
        return self.head(x.mean(dim=(2, 3))).float().mean()


def build(kind: str, *, seq_len: int = 16, batch: int = 2, vocab: int = 64, width: int = 16,
          depth: int = 2, ffn: int = 32, heads: int = 2, image: int = 8, frozen: str = ""):
    """``(model, example_inputs)`` of ``kind`` (see the module docstring); ``frozen``: "lower"
    freezes the first half of its parameter tensors, "most" all but the last (fine-tuning)."""
    model, inputs = _build(kind, seq_len=seq_len, batch=batch, vocab=vocab, width=width,
                           depth=depth, ffn=ffn, heads=heads, image=image)
    params = list(model.parameters())
    for p in params[:len(params) // 2 if frozen == "lower" else -1] if frozen else ():
        p.requires_grad_(False)
    return model, inputs


def _build(kind: str, *, seq_len: int, batch: int, vocab: int, width: int, depth: int, ffn: int,
           heads: int, image: int):
    tokens = torch.zeros(batch, seq_len, dtype=torch.long)
    if kind == "mlp":
        return MLPStack(vocab, width, depth, ffn), (tokens,)
    if kind == "towers":
        return TwoTower(vocab, width, depth, classes=vocab), (tokens,)
    if kind == "encoder":
        return Encoder(vocab, width, heads, depth, ffn), (tokens,)
    if kind == "conv":
        return ConvNet(width, depth, classes=vocab), (torch.zeros(batch, 3, image, image),)
    if kind == "raises":
        raise ValueError(f"fuzz factory refuses width={width}")
    if kind == "bad_return":
        return MLPStack(vocab, width, depth, ffn)
    raise ValueError(f"unknown kind {kind!r}")


FACTORY_TEMPLATE = '''"""A fuzz model factory (benchmarks/fuzz.py): {kind} {dims}."""
import importlib.util

_spec = importlib.util.spec_from_file_location("fuzz_models", {models!r})
_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models)


def build(seq_len={seq_len}):
    return _models.build({kind!r}, seq_len=seq_len, **{dims!r})
'''
"""A ``file.py:build`` factory for one model of this file (MODEL form ``path/to/file.py:build``)."""


def factory_source(kind: str, seq_len: int, dims: dict) -> str:
    """The text of a factory file that builds ``kind`` with ``dims``."""
    return FACTORY_TEMPLATE.format(kind=kind, dims=dict(sorted(dims.items())), seq_len=seq_len,
                                   models=__file__)
