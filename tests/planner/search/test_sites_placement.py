"""Plans on sites: the pipeline crosses slow links as little as it can, faster links never price
slower, and the placement comparison ranks the plan's placement ahead of the naive and random."""

import pytest

from tests.conftest import TINY_LLAMA, write_config

from costmodels.sites import sites_from_mapping, with_site_bandwidth
from planner.api import plan_prepared, prepare
from planner.options import SearchOptions, TrainingSpec, parse_fix
from planner.search.hetero import cheapest_chain, restrict


def site(name, nodes=1):
    return {"name": name, "device": "a100-80g", "nodes": nodes, "gpus_per_node": 4,
            "intra_node": {"bandwidth": "300GB/s", "latency": "3us"},
            "inter_node": {"bandwidth": "25GB/s", "latency": "10us"}}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    cfg = {**TINY_LLAMA, "num_hidden_layers": 12}
    return prepare(write_config(tmp_path_factory.mktemp("llama12"), cfg), seq_len=256,
                   dtype="bf16", cache_dir=None)


def regions(links):
    return sites_from_mapping({"name": "r", "sites": [site(n) for n in "abcd"],
                               "links": links,
                               "default_link": {"bandwidth": "1Gbps", "latency": "100ms"}})


def test_cheapest_chain_is_exact():
    cost = [[0, 1, 9, 9], [1, 0, 1, 9], [9, 1, 0, 1], [9, 9, 1, 0]]
    assert cheapest_chain(cost) in ((0, 1, 2, 3), (3, 2, 1, 0))


def test_pipeline_chains_the_fast_links(prepared):
    # a-c and c-b and b-d are fast; the listed order a-b-c-d would cross slow links
    fast = {"bandwidth": "100Gbps", "latency": "5ms"}
    hc = regions([{"between": p, **fast} for p in (["a", "c"], ["c", "b"], ["b", "d"])])
    training = TrainingSpec(global_batch=64, seq_len=256)
    plan = plan_prepared(prepared, hc, training,
                         restrict(SearchOptions(fix=parse_fix("tp=1,dp=2,pp=8"), top_k=0)))
    order = list(dict.fromkeys(st["group"] for st in plan.stages))
    assert order in (["a", "c", "b", "d"], ["d", "b", "c", "a"])
    pl = plan.search["placements"]
    assert pl["planned_s"] < pl["naive_s"] and pl["planned_s"] < pl["random_mean_s"]


def test_more_bandwidth_never_prices_slower(prepared):
    base = regions([])
    training = TrainingSpec(global_batch=64, seq_len=256)
    options = restrict(SearchOptions(fix=parse_fix("tp=1,dp=2,pp=8,micro_batch=1"), top_k=0))
    steps = [plan_prepared(prepared, with_site_bandwidth(base, bw), training, options).step_time_s
             for bw in (0.125e9, 1.25e9, 12.5e9)]
    assert steps[0] >= steps[1] >= steps[2]


def test_each_site_is_also_planned_alone_and_a_faster_one_named(prepared):
    """A new-user check planned an 8B model over two sites joined by 10 Gb/s at 19.5 s a step,
    where one site alone takes 2.7 s, and nothing said so."""
    from planner.report.summary import summary

    def two(bandwidth, latency):
        return sites_from_mapping({"name": "two", "sites": [site("a", nodes=2), site("b", 2)],
                                   "links": [{"between": ["a", "b"], "bandwidth": bandwidth,
                                              "latency": latency}]})

    training = TrainingSpec(global_batch=1024, seq_len=256)
    slow = plan_prepared(prepared, two("100Mbps", "20ms"), training, SearchOptions(top_k=0))
    alone = slow.search["groups_alone"]
    assert [a["group"] for a in alone] == ["a"]  # b is a's twin: searched once
    assert alone[0]["gpus"] == 8 and alone[0]["step_time_s"] < slow.step_time_s
    assert "one site alone is faster: a (8 GPUs)" in summary(slow)
    fast = plan_prepared(prepared, two("3200Gbps", "3us"), training, SearchOptions(top_k=0))
    assert fast.search["groups_alone"][0]["step_time_s"] > fast.step_time_s
    assert "each site alone is slower: a (8 GPUs)" in summary(fast)


def test_a_site_alone_drops_the_pins_the_gpu_count_sizes_and_keeps_the_groups_rules(prepared):
    """A review: a pp pinned for every site (more stages than one site has GPUs) left each site
    alone with nothing that fits, and the report called it slower; and alone it could win by a
    schedule (zb-h1) the search over sites does not price, blaming the links."""
    from planner.report.summary import summary
    from planner.search.hetero import GROUP_SCHEDULES

    plan = plan_prepared(prepared, regions([]), TrainingSpec(global_batch=1024, seq_len=256),
                         SearchOptions(fix=parse_fix("pp=8,tp=1"), top_k=0))
    (alone,) = plan.search["groups_alone"]  # four sites of 4 GPUs alike: searched once
    assert alone["gpus"] == 4 and "step_time_s" in alone
    assert alone["parallel"].split()[1] == "tp=1"  # the pins that fit one site stay
    assert set(alone["parallel"].split()) & set(GROUP_SCHEDULES)  # the sites search's rules
    assert "one site alone is faster: a (4 GPUs)" in summary(plan)


def test_why_not_re_plans_a_plan_over_sites_from_its_file(prepared, tmp_path):
    """plan show --why was refused on every cluster of groups or sites: the plan did not keep
    the cluster in full. It keeps the form its file had, and the why re-plans over the sites."""
    from planner.errors import SpecError
    from planner.explore.whynot import why_not
    from planner.planfile.document import load_plan

    hc = regions([{"between": ["a", "b"], "bandwidth": "10Gbps", "latency": "5ms"}])
    training = TrainingSpec(global_batch=64, seq_len=256)
    plan = plan_prepared(prepared, hc, training, SearchOptions(top_k=0))
    back = sites_from_mapping(plan.cluster["spec"])  # reads back into the same cluster
    assert back.groups == hc.groups and [p for p, _ in back.links] == [p for p, _ in hc.links]
    assert all(a.bandwidth_bytes_per_s == b.bandwidth_bytes_per_s and a.per == b.per and
               a.latency_s == pytest.approx(b.latency_s) for (_, a), (_, b) in
               zip(back.links, hc.links))
    plan.save(tmp_path / "p.json")
    plan = load_plan(tmp_path / "p.json")
    answer = why_not(plan, {"zero": 0 if plan.parallel["zero"] else 1})
    assert answer.feasible and answer.variant.parallel["zero"] != plan.parallel["zero"]
    assert [st["group"] for st in answer.variant.stages]  # planned over the sites again
    same = why_not(plan, {"zero": plan.parallel["zero"]})
    assert same.variant.step_time_s == pytest.approx(plan.step_time_s, rel=1e-5)
    # more than a site holds: bad input, named as --why gave it (exit 2), as plan solve --fix
    # names it (a new-user check: it read "no plan fits", exit 3)
    with pytest.raises(SpecError, match="why.tp: 8 is more than the 4 GPUs a pipeline stage may "
                                        "take in any group"):
        why_not(plan, {"tp": 8})
    # where only the pipeline over the sites can run (--across-sites pipeline, or sites of more
    # than one kind), a knob it does not price is refused before the site alone and across
    # sites are planned (a new-user check waited 7 s for the refusal); alike sites' replicas
    # may run it, so there the why goes on (a review: every why of a cp plan was refused)
    import planner.search.replicas as replicas  # noqa: PLC0415
    piped = plan_prepared(prepared, hc, training, SearchOptions(top_k=0, across_sites="pipeline"))
    called = []
    real, replicas.sites_replicas = replicas.sites_replicas, lambda *a, **k: called.append(1)
    try:
        with pytest.raises(SpecError, match="why.cp: context and expert parallelism are not "
                                            "priced on clusters of device groups or sites"):
            why_not(piped, {"cp": 2})
    finally:
        replicas.sites_replicas = real
    assert not called
    across = why_not(plan, {"cp": 2})
    assert across.pins == {"cp": 2}


def test_plan_diff_names_a_change_of_the_links_between_sites(prepared):
    """A new-user check: two plans over sites joined at 10 and at 100 Gb/s, and plan diff
    blamed the knobs; the link is the input that changed."""
    from planner.report.compare import compare, headline

    training = TrainingSpec(global_batch=64, seq_len=256)
    plans = [plan_prepared(prepared, regions([{"between": ["a", "b"], "bandwidth": bw,
                                                "latency": "5ms"}]), training,
                           SearchOptions(top_k=0)) for bw in ("10Gbps", "100Gbps")]
    changed = [d for d in compare(*plans) if d.section == "inputs" and d.differs]
    assert [d.label for d in changed] == ["link a - b GB/s (site)"]
    assert (changed[0].a, changed[0].b) == (1.25, 12.5)
    assert "link a - b 1.25 GB/s -> 12.5 GB/s" in headline(*plans)
    # and the other ways to use the sites, each planned beside the plan: each site alone, and
    # data parallelism across the alike sites, whose ring's slowest link (the 1 Gb/s default
    # between the other pairs) did not change
    ways = {d.label: (d.a, d.b) for d in compare(*plans)
            if d.section.startswith("other ways to use the cluster")}
    assert set(ways) == {"a alone", "data parallel across a, b, c, d"}
    assert all(0 < x == y for x, y in ways.values())


def test_a_dp_pin_wider_than_a_site_names_the_sites_gpus(prepared):
    """A new-user check: --fix dp=128 over two sites of 64 GPUs was told the cluster has 64."""
    from planner.errors import PlannerError

    hc = regions([{"between": ["a", "b"], "bandwidth": "10Gbps", "latency": "5ms"}])
    training = TrainingSpec(global_batch=64, seq_len=256)
    with pytest.raises(PlannerError, match=r"dp: 8 is more than the 4 GPUs a pipeline stage may "
                                           r"take in any group or site \(the most dividing "
                                           r"every one's GPU count\)"):
        plan_prepared(prepared, hc, training,
                      SearchOptions(fix=parse_fix("dp=8"), top_k=0, across_sites="pipeline"))
    # by default the pin is the replicas over every site, which data parallelism across the
    # sites takes where the pipeline over them cannot (a review: refused before it was tried)
    plan = plan_prepared(prepared, hc, training, SearchOptions(fix=parse_fix("dp=8"), top_k=0))
    assert plan.parallel["dp"] == 8 and plan.parallel["dp_replicate"] == 4


def test_random_placements_faster_than_the_plan_are_explained(prepared):
    """A new-user check forced a pipeline over two sites on a slow link and saw every random
    placement beat the plan, with nothing saying why: random draws spread a stage's replicas over
    both sites, which the search never does. Said only where they are faster on average."""
    from planner.report.summary import RANDOM_FASTER, summary

    def two(bandwidth, latency):
        return sites_from_mapping({"name": "two", "sites": [site("a", nodes=2), site("b", 2)],
                                   "links": [{"between": ["a", "b"], "bandwidth": bandwidth,
                                              "latency": latency, "per": "site"}]})

    training = TrainingSpec(global_batch=1024, seq_len=256)
    options = SearchOptions(top_k=0, across_sites="pipeline")
    slow = plan_prepared(prepared, two("1Gbps", "1ms"), training, options)
    placed = slow.search["placements"]
    assert placed["random_mean_s"] < placed["planned_s"]
    words = " ".join(summary(slow).split())
    assert RANDOM_FASTER in words
    fast = plan_prepared(prepared, two("3200Gbps", "3us"), training, options)
    assert fast.search["placements"]["random_mean_s"] > fast.search["placements"]["planned_s"]
    assert "random placements faster" not in summary(fast)
