"""The search's lower bounds: the screen's (before a stage split) and a split's (Split.floor_s)
never exceed the step the configuration is priced at, and pruning with them finds the plans that
pricing every configuration finds."""

import dataclasses
import json
from collections import Counter

import pytest

import planner
from costmodels.engine import engine_from_mapping
from costmodels.errors import InfeasibleError
from planner import SearchOptions, TrainingSpec, load_cluster, plan_prepared
from planner.search import loop
from planner.search.costs import ModelArrays
from planner.search.space import Space, enumerate_space
from tests.conftest import TINY_MIXTRAL



@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("bounds-mixtral") / "config.json"
    path.write_text(json.dumps(TINY_MIXTRAL))
    return planner.prepare(str(path), seq_len=256)


def _slow_links(cluster, bandwidth=2e8):
    """``cluster`` with a slow network between nodes: data-parallel traffic then dominates
    many configurations, which is what the data-parallel bound is for."""
    return dataclasses.replace(cluster, inter_node=dataclasses.replace(
        cluster.inter_node, bandwidth_bytes_per_s=bandwidth))


def _every_bound(prepared, cluster, training, options=SearchOptions()):
    """(screen bound, split floor, priced step, config) of every configuration of the search's
    space that fits."""
    ma = ModelArrays.from_blocks(prepared.blocks)
    pricer = loop._Pricer(prepared.blocks, ma, cluster, training, options)
    space = enumerate_space(Space.of(cluster, prepared.blocks, options), training, options,
                            Counter(), mb_fits=loop._MicroBatchWall(pricer, options))
    out = []
    for group in space:
        costs = pricer.costs(group.key)
        for variant, bound in zip(group.variants,
                                  loop._Screen(group, costs, pricer, training).bounds()):
            if bound is None:
                continue
            cfg = loop._config(group, variant, {group.key: costs}, pricer)
            try:
                split = pricer.split(cfg, costs)
            except InfeasibleError:
                continue
            out.append((bound, pricer.floor_s(split), pricer.price(cfg, costs, split).step_time_s,
                        cfg))
    return out


CASES = {
    "dense, 4 nodes": ("tiny_llama", "dgx-h100", 4, "megatron-core", 64),
    "dense, slow links": ("tiny_llama", "slow", 4, "megatron-core", 64),
    "dense, FSDP2": ("tiny_llama", "slow", 2, "torchtitan", 32),
    "experts, slow links": ("tiny_moe", "slow", 2, "megatron-core", 64),
    "experts, DeepSpeed": ("tiny_moe", "dgx-h100", 2, "deepspeed", 64),
}


@pytest.mark.parametrize("case", CASES)
def test_bounds_never_exceed_the_priced_step(case, request):
    name, cluster_name, nodes, engine, gb = CASES[case]
    prepared = request.getfixturevalue(name)
    cluster = load_cluster("dgx-h100", nodes=nodes)
    if cluster_name == "slow":
        cluster = _slow_links(cluster)
    training = TrainingSpec(global_batch=gb, seq_len=prepared.seq_len,
                            engine=engine_from_mapping(engine))
    rows = _every_bound(prepared, cluster, training)
    assert len(rows) >= 50
    for bound, floor, step, cfg in rows:
        assert bound <= step * (1 + 1e-9), (cfg.short(), bound, step)
        assert floor <= step * (1 + 1e-9), (cfg.short(), floor, step)
    # not vacuous: on slow links the floors come close to the step where traffic dominates
    if cluster_name == "slow" and engine == "megatron-core":
        assert max(floor / step for _, floor, step, cfg in rows if cfg.zero == 3) > 0.9
        assert max(bound / step for bound, _, step, cfg in rows if cfg.zero == 3) > 0.5


@pytest.mark.parametrize("case", ["dense, slow links", "experts, slow links", "dense, FSDP2"])
def test_pruning_finds_what_pricing_everything_finds(case, request, monkeypatch):
    """The search with its bounds against the same search whose bounds leave out the
    data-parallel traffic and the stage split (the screen's pipeline and optimizer bounds
    only): the same plans, in the same order, and fewer configurations priced."""
    name, _, nodes, engine, gb = CASES[case]
    prepared = request.getfixturevalue(name)
    cluster = _slow_links(load_cluster("dgx-h100", nodes=nodes))
    training = TrainingSpec(global_batch=gb, seq_len=prepared.seq_len,
                            engine=engine_from_mapping(engine))
    options = SearchOptions(top_k=3)
    tight = plan_prepared(prepared, cluster, training, options)
    monkeypatch.setattr(loop._Screen, "dp_bound_s", lambda self, zero: 0.0)
    monkeypatch.setattr(loop._Pricer, "floor_s", lambda self, split: 0.0)
    loose = plan_prepared(prepared, cluster, training, options)
    def plans(plan):
        return [(plan.parallel, plan.predicted["step_time_s"])] + [
            (alt["parallel"], alt["step_time_s"]) for alt in plan.search["alternatives"]]
    assert plans(tight) == plans(loose)
    assert len(plans(tight)) == 4
    assert tight.search["evaluated"] < loose.search["evaluated"]


@pytest.mark.parametrize("top_k", [0, 2])
def test_ties_go_to_the_first_in_the_enumeration(tiny_llama, monkeypatch, top_k):
    """With one micro-batch GPipe and 1F1B tie exactly (time and memory); the split's bound
    re-queues one of them, so they are priced in another order than enumerated: the one
    enumerated first is kept all the same, as without the bounds; for any target the tie goes
    to 1F1B, which Megatron-LM runs (search.loop.tie_broken), with the bounds as without."""
    from planner.options import parse_fix
    cluster = load_cluster("dgx-h100", nodes=2)
    training = TrainingSpec(global_batch=64, seq_len=tiny_llama.seq_len,
                            engine=engine_from_mapping("deepspeed"))
    options = SearchOptions(fix=parse_fix("dp=8,tp=1,pp=2,micro_batch=8,recompute=none,zero=1"),
                            schedules=("gpipe", "1f1b"), top_k=top_k)

    def plans(plan):
        return [plan.parallel] + [alt["parallel"] for alt in plan.search["alternatives"]]
    tight = plans(plan_prepared(tiny_llama, cluster, training, options))
    monkeypatch.setattr(loop._Screen, "dp_bound_s", lambda self, zero: 0.0)
    monkeypatch.setattr(loop._Pricer, "floor_s", lambda self, split: 0.0)
    assert tight == plans(plan_prepared(tiny_llama, cluster, training, options))
    assert tight[0]["schedule"] == "1f1b" and len(tight) == top_k + 1
