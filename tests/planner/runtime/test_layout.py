"""The runtime's process grid agrees with the planner's placement, and refuses plans that do not."""

import itertools

import pytest

from planner.errors import SpecError
from planner.options import Config
from planner.search.placement import rank_of, stage_ranks
from planner.planfile.document import load_plan
from planner.runtime.layout import Layout, layout_of


@pytest.mark.parametrize("placement", ["tp-pp-dp", "tp-dp-pp"])
@pytest.mark.parametrize("pp,dp,tp", [(2, 1, 1), (1, 2, 2), (2, 2, 1), (2, 3, 2), (4, 2, 2)])
def test_mesh_matches_planner_placement(placement, pp, dp, tp):
    cfg = Config(dp=dp, tp=tp, pp=pp, micro_batch=1, num_microbatches=1, placement=placement)
    lay = Layout(pp=pp, dp=dp, tp=tp, placement=placement, stage_pp_rank=tuple(range(pp)))
    mesh = lay.mesh()
    seen = set()
    for p, d, t in itertools.product(range(pp), range(dp), range(tp)):
        r = rank_of(cfg, pp=p, dp=d, tp=t)
        assert mesh[p][d][0][t] == r == lay.rank_of(pp=p, dp=d, tp=t)
        assert lay.coords(r) == {"pp": p, "dp": d, "cp": 0, "tp": t}
        seen.add(r)
    assert seen == set(range(pp * dp * tp))
    for s in range(pp):
        assert lay.pipeline_ranks(s) == stage_ranks(cfg, s)


def test_interleaved_plan_puts_two_stages_on_each_rank(make_plan):
    plan = load_plan(make_plan("branched", "pp=2,tp=1,dp=1,schedule=interleaved-1f1b,vpp=2,"
                                            "micro_batch=2"))
    lay = layout_of(plan)
    assert lay.stage_pp_rank == (0, 1, 0, 1)
    assert lay.local_stages(0) == [0, 2] and lay.local_stages(1) == [1, 3]


def test_plan_whose_stage_ranks_disagree_with_the_mesh_is_refused(make_plan):
    plan = load_plan(make_plan("branched", "pp=2,tp=1,dp=2,micro_batch=1"))
    plan.stages[1]["ranks"] = [0, 1]  # stage 0's ranks under tp-pp-dp are [0, 2]
    with pytest.raises(SpecError, match=r"stages\[1\]\.ranks"):
        layout_of(plan)


def test_a_pipeline_in_another_order_than_the_mesh_follows_the_plans_pipeline_ranks(make_plan):
    """A plan for node groups may put its first stage on the ranks the placement's mesh counts as
    a later pipeline rank (the planner put gpt2's first stage on the V100 group, ranks 16-31 of
    32): the runtime's pipeline follows the plan's pipeline_rank (a new-user check found `plan
    run --dry-run` refusing such a plan, 'stages[0].pipeline_rank: 0 but its ranks ... are
    pipeline rank 1; re-create the plan', which re-creating could not mend)."""
    from planner.runtime.launch import node_groups, torchrun_command

    plan = load_plan(make_plan("branched", "pp=2,tp=1,dp=2,micro_batch=1,placement=tp-dp-pp"))
    first, second = plan.stages[0]["ranks"], plan.stages[1]["ranks"]
    assert (first, second) == ([0, 1], [2, 3])
    plan.stages[0]["ranks"], plan.stages[1]["ranks"] = second, first
    lay = layout_of(plan)
    assert lay.pp_order == (1, 0) and lay.stage_pp_rank == (0, 1)
    assert [lay.coords(r)["pp"] for r in range(4)] == [1, 1, 0, 0]
    assert lay.pipeline_ranks(0) == [2, 3] and lay.local_stages(2) == [0]
    assert lay.mesh() == [[[[2]], [[3]]], [[[0]], [[1]]]]
    # torch numbers the pp group by global rank: stage 0's ranks are its rank 1
    assert [lay.pp_group_rank(p) for p in range(2)] == [1, 0]
    assert all(lay.rank_of(**lay.coords(r)) == r for r in range(4))
    plan.stages[1]["pipeline_rank"] = 0  # two pipeline ranks 0 on ranks of their own
    with pytest.raises(SpecError, match=r"stages\[1\]\.pipeline_rank: 0 on ranks \[0, 1\], "
                                        r"but another stage puts pipeline rank 0 on \[2, 3\]"):
        layout_of(plan)
    # its launch: each node its own rank, which the groups' order decides
    plan.cluster["groups"] = [{"name": "fast", "device": "h100", "nodes": 2},
                              {"name": "slow", "device": "v100", "nodes": 1}]
    assert node_groups(plan) == ["nodes 0-1: fast (h100)", "node 2: slow (v100)"]
    command = torchrun_command(3, 8, "x", ["-m", "w"], fixed_node_ranks=True)
    assert "--node-rank $NODE_RANK --master-addr $HEAD_NODE --master-port 29500" in command
    assert "rdzv" not in command


def test_groups_of_unequal_nodes_are_not_launched(make_plan, tmp_path):
    """torchrun starts as many processes on every node: groups of 8-GPU and 4-GPU nodes cannot
    be launched, said before anything else is checked about the processes."""
    from planner.runtime.launch import check
    from planner.runtime.options import RunOptions

    plan = load_plan(make_plan("branched", "pp=2,tp=1,dp=2,micro_batch=1"))
    plan.cluster["groups"] = [{"name": "a", "device": "h100", "nodes": 1, "gpus_per_node": 8},
                              {"name": "b", "device": "v100", "nodes": 1, "gpus_per_node": 4}]
    path = str(tmp_path / "p.json")
    plan.save(path)
    with pytest.raises(SpecError, match=r"^cluster\.groups: nodes of 4 and 8 GPUs; torchrun "):
        check(path, RunOptions(), None, dry_run=True)


@pytest.mark.parametrize("placement", ["tp-pp-dp", "tp-dp-pp"])
@pytest.mark.parametrize("pp,dp,cp,tp", [(1, 1, 2, 1), (2, 1, 2, 1), (1, 2, 2, 2), (2, 2, 2, 1),
                                         (2, 1, 2, 2), (1, 2, 4, 1)])
def test_mesh_with_context_parallelism_matches_planner_placement(placement, pp, dp, cp, tp):
    cfg = Config(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=1, num_microbatches=1,
                 placement=placement)
    lay = Layout(pp=pp, dp=dp, cp=cp, tp=tp, placement=placement, stage_pp_rank=tuple(range(pp)))
    mesh = lay.mesh()
    seen = set()
    for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
        r = rank_of(cfg, pp=p, dp=d, tp=t, cp=c)
        assert mesh[p][d][c][t] == r == lay.rank_of(pp=p, dp=d, cp=c, tp=t)
        assert lay.coords(r) == {"pp": p, "dp": d, "cp": c, "tp": t}
        seen.add(r)
    assert seen == set(range(pp * dp * cp * tp)) and lay.world == len(seen)
    for s in range(pp):
        assert lay.pipeline_ranks(s) == stage_ranks(cfg, s)


@pytest.mark.parametrize("placement", ["tp-pp-dp", "tp-dp-pp"])
@pytest.mark.parametrize("pp,dp,cp,tp,ep", [(1, 2, 1, 1, 2), (2, 2, 1, 1, 2), (1, 1, 2, 2, 2),
                                            (1, 2, 2, 2, 4), (2, 2, 2, 1, 4), (1, 4, 1, 2, 2)])
def test_expert_groups_fold_over_the_flattened_tp_cp_dp_index(placement, pp, dp, cp, tp, ep):
    """An ep group is ep consecutive positions of the (tp, cp, dp) index of one pipeline rank (etp
    = 1); the edp group holds the same experts, ep positions apart; both in increasing rank order
    (the order of their process groups, which the all-to-all's splits follow)."""
    lay = Layout(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep, placement=placement,
                 stage_pp_rank=tuple(range(pp)))
    flat = {r: c["tp"] + tp * (c["cp"] + cp * c["dp"])
            for r in range(lay.world) for c in [lay.coords(r)]}
    for kind, groups, size, step in (("ep", lay.ep_groups(), ep, 1),
                                     ("edp", lay.edp_groups(), lay.edp, ep)):
        assert sorted(r for g in groups for r in g) == list(range(lay.world)), kind
        for g in groups:
            assert len(g) == size and g == sorted(g), (kind, g)
            assert len({lay.coords(r)["pp"] for r in g}) == 1
            assert [flat[r] - flat[g[0]] for r in g] == [step * i for i in range(size)]
    for g in lay.ep_groups():
        assert [lay.ep_index(r) for r in g] == list(range(ep))
    for g in lay.edp_groups():
        assert len({lay.ep_index(r) for r in g}) == 1
    assert lay.edp == tp * cp * dp // ep


def test_tp_styles_shard_the_linears_and_leave_inner_weights_alone():
    """The pair's Linears get DTensor styles; a per-head norm inside the region (Qwen3's q_norm,
    planner.runtime.inner_weights' part) and a norm before it get none."""
    import torch.nn as nn

    from planner.runtime.parallelize import tp_styles

    modules = {"q_proj": nn.Linear(8, 8), "o_proj": nn.Linear(8, 8), "q_norm": nn.RMSNorm(4),
               "input_norm": nn.RMSNorm(8)}
    roles = {"q_proj": "colwise", "o_proj": "rowwise", "q_norm": "replicate",
             "input_norm": "replicate"}
    feeds = {"o_proj": {"q_proj"}, "input_norm": {"o_proj"}, "q_norm": {"q_proj"}}
    styles, notes = tp_styles(roles, feeds, set(modules), modules, 2)
    assert set(styles) == {"q_proj", "o_proj"} and notes == []


def test_a_16_bit_plan_notes_that_the_runtime_keeps_no_fp32_master_copy():
    """plan run trains a bf16 plan in bf16 throughout, where every state layout the planner
    prices keeps fp32 master weights: a run's model states came out 3x below the prediction."""
    import dataclasses
    import os

    from planner.runtime.build import unrun_notes

    golden = os.path.join(os.path.dirname(__file__), "..", "..", "golden", "plans",
                          "uneven-llama3-8b.json")
    plan = load_plan(golden)
    assert plan.training["dtype"] == "bf16"
    assert any(n.startswith("the model trains in bf16 throughout") and "fp32 master" in n
               for n in unrun_notes(plan, layout_of(plan)))
    fp32 = dataclasses.replace(plan, training={**plan.training, "dtype": "fp32"})
    assert not any("throughout" in n for n in unrun_notes(fp32, layout_of(fp32)))
