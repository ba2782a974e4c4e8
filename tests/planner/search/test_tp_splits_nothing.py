"""A model tensor parallelism splits nothing of (convolutions, recurrent layers) is planned with
tp = 1: a new-user check got tp=2 for an LSTM, exported to torchtitan, every module replicated, by a
step time 1e-6 s shorter."""

import torch
from torch import nn

from planner.api import plan_prepared, prepare
from planner.inputs.clusters import load_cluster
from planner.options import SearchOptions, TrainingSpec, parse_fix
from planner.search.space import TP_NOTHING, Space, tp_reasons


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.lstm = nn.LSTM(32, 32, batch_first=True)
        self.conv = nn.Conv1d(32, 32, 3, padding=1)

    def forward(self, ids):
        h, _ = self.lstm(self.embed(ids))
        return self.conv(h.transpose(1, 2)).mean()


def test_tp_is_searched_only_where_pinned():
    prepared = prepare(Recurrent(), example_inputs=(torch.randint(0, 100, (4, 16)),), dtype="fp32",
                       cache_dir=None)
    assert not {"colwise", "rowwise", "vocab"} & set(prepared.blocks.tp_roles.values())
    cluster = load_cluster("dgx-a100-80g", nodes=1)
    space = Space.of(cluster, prepared.blocks)
    assert space.tp_nothing and TP_NOTHING in tp_reasons(2, space)
    assert TP_NOTHING not in tp_reasons(2, space, pinned=True)  # --why tp=2 still prices it
    training = TrainingSpec(global_batch=64, seq_len=16, dtype="fp32")
    assert plan_prepared(prepared, cluster, training, SearchOptions(top_k=0)).parallel["tp"] == 1
    pinned = plan_prepared(prepared, cluster, training, SearchOptions(fix=parse_fix("tp=2")))
    assert pinned.parallel["tp"] == 2


def test_a_pinned_expert_tensor_parallelism_pins_its_tp():
    """From a review: etp is 1 or tp, so a pin of etp=2 asks for tp=2 as a tp pin does (the rule
    above must not drop it)."""
    from planner.search.space import tp_pinned

    assert tp_pinned(2, {"etp": 2}) and tp_pinned(4, {"tp": 4})
    assert not tp_pinned(2, {}) and not tp_pinned(2, {"etp": 1}) and not tp_pinned(4, {"etp": 2})
