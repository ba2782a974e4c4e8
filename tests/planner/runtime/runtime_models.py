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
