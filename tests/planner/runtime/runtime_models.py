"""Small models for the runtime tests: examples/branched.py's TwoTower at a size two CPU cores
train in milliseconds (the same DAG: embed -> two towers -> merge -> head)."""

import importlib.util
import os

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _branched_module():
    spec = importlib.util.spec_from_file_location(
        "examples_branched", os.path.join(REPO, "examples", "branched.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def small_branched(seq_len: int = 16, batch: int = 4):
    model = _branched_module().TwoTower(vocab=512, width=32, depth=2, classes=10)
    return model, (torch.randint(0, 512, (batch, seq_len)),)


SPEC = os.path.join(REPO, "tests", "planner", "runtime", "runtime_models.py") + ":small_branched"
"""MODEL string of the small branched model."""


def small_multitower(seq_len: int = 16, batch: int = 4):
    spec = importlib.util.spec_from_file_location(
        "examples_multitower", os.path.join(REPO, "examples", "multitower.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.MultiTower(towers=5, width=16, vocab=64)
    return model, (torch.randint(0, 64, (batch, seq_len)),)


MULTITOWER_SPEC = os.path.join(REPO, "tests", "planner", "runtime", "runtime_models.py") + ":small_multitower"
FINETUNE_SPEC = os.path.join(REPO, "examples", "finetune.py") + ":tiny"
"""MODEL string of examples/finetune.py at toy size: a frozen Llama with trained low-rank adapters
on its query and value projections."""
"""MODEL string of a small examples/multitower.py: five towers of different depths read one
embedding and are concatenated (a wide DAG whose stages the planner assigns with CP-SAT)."""


class _Step(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class Masked(torch.nn.Module):
    """Token ids and a boolean mask in; the last stage's glue reads the mask (torch.where), which
    must reach it as booleans (a review saw it clamped to integers)."""

    def __init__(self, vocab: int = 64, width: int = 16, depth: int = 4, classes: int = 8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(_Step(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, tokens, keep):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(torch.where(keep[..., None], x, torch.zeros_like(x)))


def masked(seq_len: int = 16, batch: int = 4):
    g = torch.Generator().manual_seed(0)
    return Masked(), (torch.randint(0, 64, (batch, seq_len), generator=g),
                      torch.rand(batch, seq_len, generator=g) > 0.3)


class _SinkAttention(torch.nn.Module):
    """Attention keeping its head count in ``num_heads`` with one learned sink logit per head:
    tensor parallelism must cut the sinks to a rank's heads before it divides the count."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.num_heads, self.head_dim = heads, width // heads
        self.q, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(3))
        self.k = torch.nn.Linear(width, width, bias=False)  # (a key bias barely moves)
        self.sinks = torch.nn.Parameter(torch.linspace(-0.5, 0.5, heads))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) / self.head_dim ** 0.5
        sink = self.sinks.reshape(1, -1, 1, 1).expand(b, -1, t, 1)
        p = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
        return self.o((p @ v).transpose(1, 2).reshape(b, t, -1))


class Sinks(torch.nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, depth: int = 2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.attn = torch.nn.ModuleList(_SinkAttention(width, heads) for _ in range(depth))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for a in self.attn:
            x = x + a(x)
        return self.head(x)


def sinks(seq_len: int = 16, batch: int = 4):
    return Sinks(), (torch.randint(0, 64, (batch, seq_len)),)


HERE = os.path.join(REPO, "tests", "planner", "runtime", "runtime_models.py")
MASKED_SPEC, SINKS_SPEC = HERE + ":masked", HERE + ":sinks"
