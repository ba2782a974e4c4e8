"""The configuration a `plan show --why` pin asks about (planner.explore.whynot.pinned_config)."""

from types import SimpleNamespace

from planner.explore.whynot import pinned_config


def _plan(**parallel):
    base = dict(dp=2, tp=1, pp=1, cp=4, micro_batch=1, num_microbatches=8, schedule="1f1b",
                vpp=1, recompute="full", zero=3, sequence_parallel=False, offload_optimizer=False)
    return SimpleNamespace(parallel={**base, **parallel}, cluster={"num_gpus": 8},
                           training={"global_batch": 16})


def test_a_pin_keeps_context_parallel_ranks_in_the_gpu_count():
    """dp x cp x tp x pp = GPUs: pinning tp=2 on a cp=4 plan of 8 GPUs halves dp and keeps cp
    (it used to leave cp out, take dp to 4 and call micro_batch=8 not dividing the batch)."""
    cfg, problem = pinned_config(_plan(), {"tp": 2, "micro_batch": 8})
    assert problem == ""
    assert (cfg.dp, cfg.cp, cfg.tp, cfg.pp) == (1, 4, 2, 1)
    assert cfg.num_microbatches == 2
    cfg, problem = pinned_config(_plan(), {"tp": 3})
    assert cfg is None and "dp x cp x tp x pp" in problem


def test_a_form_asked_about_keeps_the_plans_own_degree():
    """A new-user check asked a cp=2 plan `--why cp_comm=a2a` and was answered with cp=1 (the
    best with a2a pinned alone) and 'changes nothing: the plan has no context parallelism': the
    form is asked about at the plan's own cp (the schedule at its own pp), and said so."""
    from planner.explore.whynot import _carried

    carried, notes = _carried(_plan(cp=2, pp=4), {"cp_comm": "a2a", "schedule": "zb-h1"})
    assert carried == {"cp": 2, "pp": 4}
    assert notes[0] == ("the plan's own cp=2 kept (cp_comm is the form of its context "
                        "parallelism); give cp too to try another")
    assert _carried(_plan(cp=2), {"cp_comm": "a2a", "cp": 4}) == ({}, [])  # asked for: its own
    assert _carried(_plan(cp=1), {"cp_comm": "a2a"}) == ({}, [])  # none to keep
    # not where the other pins leave it no room (8 GPUs: dp=8 x cp=2 = 16; a code review)
    assert _carried(_plan(cp=2, dp=4), {"cp_comm": "a2a", "dp": 8}) == ({}, [])
