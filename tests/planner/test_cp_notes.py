"""What plan solve says of context parallelism after its search (planner.settings: note_cp_limit,
warn_ring_unused)."""

import logging
from types import SimpleNamespace

from planner.options import SearchOptions, TrainingSpec
from planner.settings import note_cp_limit


def _notes(caplog, cp, seq_len=131072, gpus=128, tp=2, pp=1, **options):
    caplog.clear()
    cfg = SimpleNamespace(cp=cp, tp=tp, pp=pp)
    training = TrainingSpec(global_batch=64, seq_len=seq_len)
    with caplog.at_level(logging.INFO, logger="planner.api"):
        note_cp_limit(cfg, training, SearchOptions(**options), gpus)
    # (a warning: said under plan solve -q too, as the other advice after the search)
    return [r.getMessage() for r in caplog.records
            if "widest" in r.getMessage() and r.levelno == logging.WARNING]


def test_a_cp_the_search_could_not_double_is_said(caplog):
    """A new-user check found cp=64 faster than the chosen cp=32 at 131k tokens on 128 H100s,
    with nothing saying that the search stops at 4,096 tokens per cp rank."""
    assert _notes(caplog, 32) == [
        "cp=32 is the widest context parallelism the search tries at 131,072 tokens (each rank "
        "keeps at least 4,096: SearchOptions.cp_min_tokens); --fix cp=64 prices a wider one"]
    assert _notes(caplog, 16) == []  # cp=32 was tried
    assert _notes(caplog, 32, gpus=64) != []  # cp=64 fits 64 GPUs (tp re-chosen: the pin's)
    assert _notes(caplog, 32, gpus=32) == []  # no room for cp=64
    assert _notes(caplog, 8, seq_len=32768, gpus=24) == []  # cp=16 does not divide 24 GPUs
    assert _notes(caplog, 32, fix={"cp": 32}) == []  # pinned
    assert _notes(caplog, 32, cp_min_tokens=1024) == []  # the limit lowered: cp=64 was tried
    assert _notes(caplog, 1) == []


def test_a_ring_setting_the_plan_does_not_use_is_said(caplog):
    """A new-user check gave --engine cp_ring=torch and got the same numbers under cp=1 or
    all-to-all, with no word."""
    from costmodels.engine import EngineSpec
    from planner.settings import warn_ring_unused

    def said(cp, cp_comm, ring="torch"):
        caplog.clear()
        training = TrainingSpec(global_batch=8, seq_len=8192, engine=EngineSpec(cp_ring=ring))
        with caplog.at_level(logging.WARNING, logger="planner.api"):
            warn_ring_unused(SimpleNamespace(cp=cp, cp_comm=cp_comm), training)
        return [r.getMessage() for r in caplog.records]

    assert said(1, "p2p") == ["engine.cp_ring: says whose ring runs context parallelism's "
                              "exchange, and the chosen plan has no context parallelism (cp=1); "
                              "cp_ring=torch changes nothing in it"]
    assert "all-to-all over heads (cp_comm=a2a)" in said(2, "a2a")[0]
    assert said(2, "p2p") == [] == said(2, "allgather") == said(4, "a2a+p2p")
    assert said(1, "p2p", ring="te") == []  # the default, not given
