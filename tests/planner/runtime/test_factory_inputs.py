"""Factory models plan run cannot cut as they are. A forward that takes one dict of inputs:
its batch and tokens are found inside it (a new-user check: read as batch 1 and 1 token, every
per-sample cost came out 8x too high), and plan run refuses it in one line before any process
starts (it crashed in the processes)."""

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


def test_a_parameter_of_the_top_module_is_named_with_the_fix():
    """timm's ViT keeps its class token on the top module: plan run refused even a plan of one
    stage, naming no fix (a new-user check)."""
    import torch
    from torch import nn

    from planner.runtime.stages import units_of

    class ViTLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.cls = nn.Parameter(torch.zeros(1, 1, 8))
            self.body = nn.Linear(8, 8)

    with pytest.raises(SpecError, match="'cls' belongs to the model's top module itself.*move it"):
        units_of(ViTLike(), [["body"]])
    assert units_of(nn.Sequential(nn.Linear(2, 2)), [["0"]]) == [["0"]]
