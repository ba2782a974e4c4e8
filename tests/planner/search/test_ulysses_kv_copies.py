"""DeepSpeed's Ulysses copies key/value heads when the sequence-parallel degree exceeds them
(UlyssesSPAttentionHF: kv_replication_factor = sp / kv heads, each head repeated before the
all-to-all), so `--target deepspeed` runs cp = 4 over 2 key/value heads, where Transformer
Engine's all-to-all needs them divisible; the copies cross the all-to-all."""

import dataclasses
import json

import numpy as np
import pytest

import planner
from planner import targets
from planner.errors import SpecError
from planner.export.deepspeed import to_deepspeed
from planner.inputs.clusters import load_cluster
from planner.options import Config, SearchOptions, TrainingSpec
from planner.report.summary import engine_fit, summary
from planner.search import costs as search_costs
from planner.search.costs import ModelArrays, config_costs
from planner.search.feasibility import pin_problem
from planner.search.space import CP_HEADS, Space, cp_comm_reason, kv_heads
from planner.targets import restrict
from tests.conftest import TINY_LLAMA

CFG = Config(dp=2, tp=1, pp=1, cp=4, cp_comm="a2a", micro_batch=1, num_microbatches=1)


def _space(prepared, cluster):
    return Space.of(cluster, prepared.blocks, SearchOptions())


def test_the_a2a_rule_takes_copies_where_the_target_makes_them(tiny_llama):
    cluster = load_cluster("dgx-h100", nodes=1)
    space = _space(tiny_llama, cluster)
    assert space.heads == (4, 2) and kv_heads(tiny_llama.blocks) == 2
    deepspeed = restrict(SearchOptions(), "deepspeed")
    megatron = restrict(SearchOptions(), "megatron")
    assert deepspeed.cp_kv_copies and not megatron.cp_kv_copies
    assert cp_comm_reason("a2a", 1, 4, space, deepspeed) == ""
    assert cp_comm_reason("a2a", 1, 4, space, megatron) == CP_HEADS
    assert cp_comm_reason("a2a", 1, 2, space, megatron) == ""  # (divisible: no copies)
    # copies make whole heads only: cp a multiple of the key/value heads
    odd = dataclasses.replace(space, heads=(12, 4))
    assert cp_comm_reason("a2a", 1, 6, odd, deepspeed) == CP_HEADS
    assert cp_comm_reason("a2a", 1, 4, odd, deepspeed) == ""
    # the query heads are never copied
    assert cp_comm_reason("a2a", 1, 8, space, deepspeed) == CP_HEADS
    # the engines line: who runs the exchange
    parallel = {"dp": 2, "tp": 1, "pp": 1, "cp": 4, "cp_comm": "a2a"}
    assert targets.refusal(parallel, "bf16", "deepspeed", kv_heads=2) is None
    why = targets.refusal(parallel, "bf16", "megatron", kv_heads=2)
    assert why and "2 key-value heads divisible by tp x cp = 4" in why
    assert targets.refusal(parallel, "bf16", "megatron", kv_heads=4) is None
    # DeepSpeed copies whole heads only: cp a multiple of them
    three = {**parallel, "cp": 3}
    assert "or a multiple of them" in targets.refusal(three, "bf16", "deepspeed", kv_heads=2)
    # the query heads are the blocker: no word on copies
    fix = {"cp": 8, "cp_comm": "a2a", "tp": 1}
    why = pin_problem(fix, space, TrainingSpec(global_batch=8, seq_len=128),
                      restrict(SearchOptions(fix=fix), "deepspeed"))
    assert "4 query heads divisible by tp x cp = 8" in why and "copied" not in why
    fix = {"cp": 8, "cp_comm": "a2a", "tp": 1}
    why = pin_problem(fix, dataclasses.replace(space, heads=(24, 3)),
                      TrainingSpec(global_batch=8, seq_len=128),
                      restrict(SearchOptions(fix=fix), "deepspeed"))
    assert "the 3 key-value heads divisible by tp x cp = 8 (tp x cp = 8 may also be a " \
        "multiple" in why


def test_the_copies_cross_the_all_to_all(tiny_llama, tmp_path, monkeypatch):
    """Two key/value heads copied twice move what four heads move: the same model with four
    key/value heads exchanges the same bytes at cp = 4."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, "num_key_value_heads": 4}))
    four = planner.prepare(str(path), seq_len=tiny_llama.seq_len)
    cluster = load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch=2, seq_len=tiny_llama.seq_len)
    copied = config_costs(ModelArrays.from_blocks(tiny_llama.blocks), cluster, training, CFG)
    whole = config_costs(ModelArrays.from_blocks(four.blocks), cluster, training, CFG)
    attention = copied.cp_comm_s > 0
    assert attention.any()
    assert np.allclose(copied.cp_comm_s[attention], whole.cp_comm_s[attention], rtol=1e-12)
    # the copies cross the all-to-all and sit in its buffers: without them, less of both
    monkeypatch.setattr(search_costs, "a2a_kv_copies",
                        lambda heads, div, cp: np.ones_like(heads, dtype=float))
    alone = config_costs(ModelArrays.from_blocks(tiny_llama.blocks), cluster, training, CFG)
    assert np.all(alone.cp_comm_s[attention] < copied.cp_comm_s[attention])
    assert np.all(alone.work_bytes[attention] < copied.work_bytes[attention])
    # at cp = 2 the two heads split without copies: half the K/V bytes of the four
    two = dataclasses.replace(CFG, cp=2, dp=4)
    assert np.all(config_costs(ModelArrays.from_blocks(tiny_llama.blocks), cluster, training,
                               two).cp_comm_s[attention] <
                  config_costs(ModelArrays.from_blocks(four.blocks), cluster, training,
                               two).cp_comm_s[attention])


def test_a_deepspeed_plan_copies_heads_and_megatron_refuses_them(tiny_llama):
    cluster = load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch=2, seq_len=tiny_llama.seq_len)
    fix = "dp=2,tp=1,pp=1,cp=4,cp_comm=a2a"
    plan = planner.plan_prepared(tiny_llama, cluster, training,
                                 SearchOptions(fix=planner.options.parse_fix(fix), top_k=0,
                                               target="deepspeed"))
    assert plan.parallel["cp"] == 4 and plan.parallel["cp_comm"] == "a2a"
    assert plan.model["kv_heads"] == 2
    how = json.loads(to_deepspeed(plan))["planner"]["sequence_parallel"]["how"]
    assert "UlyssesSPAttentionHF copies each 2 times" in how
    with pytest.raises(SpecError, match="key-value heads divisible by tp x cp = 4"):
        planner.plan_prepared(tiny_llama, cluster, training,
                              SearchOptions(fix=planner.options.parse_fix(fix), top_k=0,
                                            target="megatron"))


def test_target_any_plans_copies_and_says_who_runs_them(tiny_llama):
    """A plan for any engine may copy key/value heads; `plan show` says so, and its engines line
    that Megatron-LM and torchtitan do not run that exchange."""
    cluster = load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch=2, seq_len=tiny_llama.seq_len)
    plan = planner.plan_prepared(tiny_llama, cluster, training, SearchOptions(
        fix=planner.options.parse_fix("dp=2,tp=1,pp=1,cp=4,cp_comm=a2a,recompute=none,zero=1"),
        top_k=0))
    text = " ".join(summary(plan).split())
    assert "cp=4 (heads by all-to-all of q, k, v and output; key/value heads copied 2x)" in text
    runs, refused = engine_fit(plan)
    assert "deepspeed" in runs and "megatron (fix.cp_comm)" not in refused
    assert any(r.startswith("megatron (") for r in refused)
    assert any(r.startswith("torchtitan (") for r in refused)


def test_a_checked_schedule_is_simulated_for_its_own_counts_only():
    """simulate takes a built schedule unchecked only for the micro-batches it was built for; for
    others it checks it (and refuses it) as it would any other actions."""
    from planner.schedule.simulator import built, simulate  # lazy: the schedule phase's own
    actions = built("1f1b", 4, 8)
    assert built("1f1b", 4, 8) is actions  # built once
    ok = simulate(actions, microbatches=8, fwd_s=1.0, bwd_s=2.0, timeline=False)
    assert ok.step_time_s == pytest.approx(33.0)
    with pytest.raises(SpecError):
        simulate(actions, microbatches=4, fwd_s=1.0, bwd_s=2.0, timeline=False)
