"""A forward that takes one dict of inputs: its batch and tokens are found inside it (a new-user
check: read as batch 1 and 1 token, every per-sample cost came out 8x too high), and plan run
refuses it in one line before any process starts (it crashed in the processes)."""

import pytest

from planner.errors import SpecError
from planner.runtime.model import check_runnable
from planner.trace.models import resolve

FACTORY = '''
import torch
from torch import nn

class DictIn(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.head = nn.Linear(64, 1000)

    def forward(self, batch):
        return self.head(self.emb(batch["input_ids"]))

def build():
    return DictIn(), ({"input_ids": torch.randint(0, 1000, (8, 32))},)
'''


def test_batch_and_tokens_are_found_inside_a_dict_and_plan_run_refuses_it(tmp_path):
    path = tmp_path / "dictin.py"
    path.write_text(FACTORY)
    meta = resolve(f"{path}:build", seq_len=None, dtype="fp32")
    assert (meta.batch, meta.seq_len) == (8, 32)
    with pytest.raises(SpecError, match="example inputs hold a dict; plan run feeds positional"):
        check_runnable(meta)
