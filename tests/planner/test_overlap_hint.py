"""A plan whose exposed expert all-to-alls take much of its step, and whose configuration could
overlap them, says how to price that (a new-user check priced NVIDIA's DeepSeek-V3 layout 31% slower
than published with nothing said)."""

import logging
from types import SimpleNamespace

from costmodels.engine import engine_from_mapping
from planner.options import SearchOptions, TrainingSpec, parse_fix
from planner.settings import hint_overlap


def best(ep=8, pp=4, vpp=2, recompute="none", a2a=5.0, step=10.0):
    cfg = SimpleNamespace(ep=ep, pp=pp, vpp=vpp, recompute=recompute)
    return SimpleNamespace(config=cfg, breakdown={"ep_comm_s": a2a}, step_time_s=step)


def hinted(caplog, plan, engine="megatron-core", target="any", fix="") -> bool:
    caplog.clear()
    training = TrainingSpec(global_batch=64, seq_len=256, engine=engine_from_mapping(engine))
    with caplog.at_level(logging.WARNING):
        hint_overlap(plan, training, SearchOptions(target=target, fix=parse_fix(fix)))
    return any("moe_overlap=true" in r.getMessage() for r in caplog.records)


def test_the_hint_names_overlap_only_where_it_runs_and_matters(caplog):
    assert hinted(caplog, best())
    assert not hinted(caplog, best(a2a=0.5))  # 5% of the step: not worth a line
    assert not hinted(caplog, best(ep=1))
    # a pipeline without virtual stages or full recomputation cannot run it: where pinned (the
    # search may choose others with the overlap on: a review saw a 4.3% faster plan so)
    assert not hinted(caplog, best(vpp=1), fix="vpp=1")
    assert not hinted(caplog, best(recompute="full"), fix="recompute=full")
    assert hinted(caplog, best(vpp=1)) and hinted(caplog, best(recompute="full"))
    assert not hinted(caplog, best(), engine="megatron-core,moe_overlap=true")  # already on
    assert not hinted(caplog, best(), target="torchtitan")  # no such schedule there
    assert not hinted(caplog, best(), engine="torchtitan")  # nor in that software
    # the user's other settings kept in the command it gives
    caplog.clear()
    assert hinted(caplog, best(), engine="megatron-core,moe_dispatcher=deepep")
    assert "--engine megatron-core,moe_dispatcher=deepep,moe_overlap=true" in caplog.text


def test_the_hint_gives_a_command_that_runs_and_says_what_the_plan_lacks(caplog):
    """A new-user check ran the command a hint gave with the shared expert's overlap kept (which
    excludes this one: refused), and got an unchanged plan from a hint on a configuration with
    full recomputation."""
    assert hinted(caplog, best(), engine="megatron-core,moe_shared_overlap=true")
    assert "--engine megatron-core,moe_overlap=true to price that" in caplog.text
    command = caplog.text.split("plan with")[1].split(" to price that")[0]
    assert "moe_shared_overlap" not in command and "cannot run it" not in caplog.text
    assert "(without moe_shared_overlap, which Megatron-Core runs only without this overlap)" \
        in caplog.text
    assert hinted(caplog, best(recompute="full"))
    assert "this configuration cannot run it, as the overlap needs no full recomputation" in \
        caplog.text
    # (a second check followed that hint and got this plan back: the hint names the pin that
    # makes the search try a configuration running the overlap)
    assert "else gives this plan again: add --fix recompute=selective to see whether one fits" \
        in caplog.text
    assert hinted(caplog, best()) and "cannot run it" not in caplog.text
