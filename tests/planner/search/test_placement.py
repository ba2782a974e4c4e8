"""Groups placed on nodes: a group whose ranks do not line up with node boundaries is priced by
its worst placed member set, and a pipeline cut crosses nodes if any replica's does."""

import dataclasses
from collections import Counter

import pytest

from costmodels.topology import get_cluster
from planner.options import Config
from planner.runtime.layout import Layout
from planner.search import placement


def _cluster(gpus_per_node: int):
    return dataclasses.replace(get_cluster("dgx-h100"), gpus_per_node=gpus_per_node, nodes=4)


def test_data_parallel_groups_that_straddle_a_node_boundary_are_priced_by_the_worst():
    # tp-dp-pp: each stage occupies a block of tp x dp = 32 ranks; on 72-GPU nodes the stage at
    # ranks 64-95 has 8 GPUs on the first node and 24 on the next
    cfg = Config(dp=8, tp=4, pp=9, micro_batch=1, num_microbatches=9, placement="tp-dp-pp")
    shape = placement.dp_group(cfg, _cluster(72))
    assert shape.size == 8 and shape.per_node == 2  # ranks 64 and 68 share the first node
    aligned = placement.dp_group(cfg, _cluster(8))  # 8-GPU nodes: blocks of 32 line up
    assert aligned.per_node == 2 and aligned.nodes == 4
    whole = placement.dp_group(cfg.with_(dp=18, pp=1), _cluster(72))
    assert whole.per_node == 18  # 72 = 4 x 18: one node holds the whole group


def test_a_pipeline_cut_crosses_nodes_when_any_replica_does():
    cfg = Config(dp=3, tp=8, pp=3, micro_batch=1, num_microbatches=3, placement="tp-pp-dp")
    cluster = _cluster(16)  # stage ranks per replica: 0-7 | 8-15 | 16-23, then 24-31 | 32-39 ...
    # replica 1 has stage 0 at 24-31 (node 1) and stage 1 at 32-39 (node 2): a crossing
    assert placement.link_between(cfg, cluster, 0, 1) is cluster.inter_node
    single = cfg.with_(dp=1, pp=2)
    assert placement.link_between(single, cluster, 0, 1) is cluster.intra_node  # 0-7 | 8-15


@pytest.mark.parametrize("gpn", [8, 72])
@pytest.mark.parametrize("placement_order", ["tp-pp-dp", "tp-dp-pp"])
@pytest.mark.parametrize("pp,dp,cp,tp,ep", [(1, 6, 1, 4, 6), (2, 3, 1, 4, 6), (1, 5, 1, 4, 10),
                                            (2, 6, 3, 1, 6), (4, 32, 1, 1, 4), (3, 8, 1, 4, 8),
                                            (1, 16, 2, 2, 8)])
def test_expert_groups_are_priced_where_the_runtime_places_their_ranks(gpn, placement_order,
                                                                       pp, dp, cp, tp, ep):
    """The search's ep and edp groups hold as few members on one node as the fewest of the
    runtime's own groups (planner.runtime.layout), also where a group straddles the tp x cp
    blocks unevenly (ep = 6 over blocks of 4: ranks 4-9 of 8-GPU nodes, 4 and 2 per node) and
    where blocks do not line up with 72-GPU nodes."""
    lay = Layout(pp=pp, dp=dp, cp=cp, tp=tp, ep=ep, placement=placement_order,
                 stage_pp_rank=tuple(range(pp)))
    cfg = Config(dp=dp, tp=tp, cp=cp, pp=pp, ep=ep, micro_batch=1, num_microbatches=1,
                 placement=placement_order)
    cluster = _cluster(gpn)

    def fewest(groups):
        return min(Counter(r // gpn for r in g).most_common()[-1][1] for g in groups)

    shape, groups = placement.edp_group(cfg, cluster), lay.edp_groups()
    assert shape.size == len(groups[0])
    assert shape.per_node == (fewest(groups) if shape.size > 1 else 1)
    # the ep groups pipeline rank by rank (placement.ep_groups): each rank's own fewest
    for p, shape in enumerate(placement.ep_groups(cfg, cluster)):
        mine = [g for g in lay.ep_groups() if lay.coords(g[0])["pp"] == p]
        assert shape.size == len(mine[0])
        assert shape.per_node == (fewest(mine) if shape.size > 1 else 1), p


def test_expert_groups_that_do_not_tile_the_ranks_are_priced_apart_not_refused():
    """A configuration the rules refuse (ep=8 over 4 ranks of a stage) is still priced when the
    search explains why nothing fits: every member on its own node, no error."""
    cfg = Config(dp=2, tp=1, cp=2, pp=16, ep=8, micro_batch=1, num_microbatches=16)
    assert set(placement.ep_groups(cfg, _cluster(8))) == {placement.GroupShape(size=8, per_node=1)}


def test_a_plan_without_a_pipeline_names_its_placement_as_its_target_does(tiny_llama_config):
    """Without a pipeline (or without data parallelism) both orders are the same ranks: a
    torchtitan plan reads tp-dp-pp, the only order its target plans (a new-user check read
    tp-pp-dp in a --target torchtitan plan); another target keeps the default."""
    import planner
    kw = {"cluster": "dgx-h100", "nodes": 1, "global_batch": 16, "seq_len": 64,
          "fix": {"pp": 1}, "cache_dir": None}
    assert planner.plan(tiny_llama_config, target="torchtitan", **kw).parallel["placement"] == \
        "tp-dp-pp"
    assert planner.plan(tiny_llama_config, target="megatron", **kw).parallel["placement"] == \
        "tp-pp-dp"


def test_megatron_pipeline_inner_placement_says_why_for_dense_and_moe_models():
    """tp-pp-dp with a pipeline: Megatron-Core wants the experts' data-parallel ranks to match the
    attention's; a dense model meets it only at cp = 1 (its expert groups take etp = tp), which the
    refusal says in those words rather than in ep and etp."""
    from planner import targets
    from planner.options import PP_INNER_DENSE_CP, PP_INNER_SAME_DP, pp_inner_refused

    mcore = targets.engine("megatron")
    dims = dict(pp=2, dp=2, tp=2, ep=1, etp=1)
    assert pp_inner_refused(mcore, cp=2, experts=False, **dims) == PP_INNER_DENSE_CP
    assert "needs cp = 1" in PP_INNER_DENSE_CP
    assert pp_inner_refused(mcore, cp=1, experts=False, **dims) == ""
    assert pp_inner_refused(mcore, cp=2, experts=True, **dims) == PP_INNER_SAME_DP
    assert pp_inner_refused(mcore, cp=2, experts=True, **{**dims, "ep": 4}) == ""


def test_each_pipeline_rank_prices_its_own_expert_groups_on_racks_stages_straddle():
    """32-GPU stages on 72-GPU racks: stages 0, 1, 3, 5, 7 and 8 sit inside a rack, 2 and 6 put 8
    of their ranks in one rack and 24 in the next, 4 splits 16 + 16. Each pipeline rank's expert
    groups are its own (before, every stage was priced with the worst, 8 to a rack), and their
    least is the worst anywhere (ep_group)."""
    nvl = get_cluster("gb200-nvl72", nodes=4)
    cfg = Config(dp=32, tp=1, pp=9, ep=32, micro_batch=1, num_microbatches=128,
                 placement="tp-dp-pp")
    assert [g.per_node for g in placement.ep_groups(cfg, nvl)] == [32, 32, 8, 32, 16, 32, 8, 32,
                                                                    32]
    # stages spread over the racks (tp-pp-dp): every rank's groups span all four, 8 to a rack
    spread = dataclasses.replace(cfg, placement="tp-pp-dp")
    assert {g.per_node for g in placement.ep_groups(spread, nvl)} == {8}
    # 8-GPU nodes that the stages tile: the same groups on every rank
    h100 = get_cluster("dgx-h100", nodes=36)
    assert len(set(placement.ep_groups(cfg, h100))) == 1
    assert placement.ep_groups(dataclasses.replace(cfg, ep=1), nvl)[0].size == 1
