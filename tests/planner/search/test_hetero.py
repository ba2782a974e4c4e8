"""Heterogeneous clusters: loading, device-aware stage sizes, and the CP-SAT placement model."""

import re
import itertools

import pytest

from planner import SearchOptions, TrainingSpec, load_cluster, plan_prepared
from planner.errors import SpecError
from planner.search.costs import ModelArrays
from planner.search.hetero import group_costs, price_hetero
from planner.options import Config, parse_fix
from planner.solve.chain import StageMemory
from planner.solve.stage_groups import solve_hetero

MIXED = {
    "name": "mixed",
    "groups": [
        {"name": "a100", "device": "a100-80g", "nodes": 1, "gpus_per_node": 2,
         "intra_node": {"bandwidth_GBps": 300, "latency_us": 3}},
        {"name": "v100", "device": "v100", "nodes": 1, "gpus_per_node": 2,
         "intra_node": {"bandwidth_GBps": 150, "latency_us": 3}},
    ],
    "inter_node": {"bandwidth_GBps": 12.5, "latency_us": 10},
}


def test_loading_is_strict_and_overrides_are_refused():
    hc = load_cluster(MIXED)
    assert hc.num_gpus == 4 and [g.device.name for g in hc.groups] == ["a100-80g", "v100"]
    bad = {**MIXED, "groups": [{**MIXED["groups"][0], "gpu": 1}, MIXED["groups"][1]]}
    with pytest.raises(SpecError, match=r"cluster\.groups\[0\]\.gpu: unknown key"):
        load_cluster(bad)
    with pytest.raises(SpecError, match="do not apply"):
        load_cluster(MIXED, nodes=2)
    # one group, or none, is named as such before anything else is missing
    for groups in ([], [MIXED["groups"][0]]):
        with pytest.raises(SpecError, match=r"^cluster\.groups: expected a list of at least two "
                                            r"node groups \(one kind of node needs no groups"):
            load_cluster({"name": "x", "groups": groups})
    twice = {**MIXED, "groups": [MIXED["groups"][0], {**MIXED["groups"][1], "name": "a100"}]}
    with pytest.raises(SpecError, match=r"^cluster\.groups\[1\]\.name: 'a100' names an earlier "
                                        r"group too"):
        load_cluster(twice)
    # the link every group shares is named where the file gives it (a new-user check saw
    # groups[0].inter_node for a top-level figure)
    for link, field in (({"bandwidth_GBps": -3, "latency_us": 10}, "bandwidth_GBps"),
                        ({"bandwidth_GBps": 12.5, "latency_us": 10, "per": "rack"}, "per")):
        with pytest.raises(SpecError, match=rf"^cluster\.inter_node\.{field}: "):
            load_cluster({**MIXED, "inter_node": link})


@pytest.fixture(scope="module")
def mid_gpt2(tmp_path_factory):
    """Large enough that compute, not kernel launches, sets the stage times."""
    import json

    from planner.api import prepare

    d = tmp_path_factory.mktemp("mid-gpt2")
    (d / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 8, "n_embd": 1024,
        "n_head": 16, "vocab_size": 8192, "n_positions": 512, "bos_token_id": 0, "eos_token_id": 0}))
    return prepare(str(d / "config.json"), seq_len=512, dtype="fp16")


def _plan(prepared, fix):
    tr = TrainingSpec(global_batch=16, seq_len=prepared.seq_len, dtype="fp16")
    return plan_prepared(prepared, load_cluster(MIXED), tr, SearchOptions(fix=parse_fix(fix), top_k=1))


def test_fast_devices_take_more_layers(mid_gpt2):
    p = _plan(mid_gpt2, "pp=2,tp=1,dp=2,micro_batch=1,recompute=none")
    by_group = {st["group"]: st for st in p.stages}
    assert set(by_group) == {"a100", "v100"}
    assert len(by_group["a100"]["blocks"]) > len(by_group["v100"]["blocks"])
    assert sorted(r for st in p.stages for r in st["ranks"]) == [0, 1, 2, 3]
    assert p.cluster["groups"][1]["device"] == "v100"


def test_device_aware_plan_beats_the_homogeneous_assumption(mid_gpt2):
    """Plan as if every GPU were an A100 (equal stages), then price that split on the real mixed
    cluster: the device-aware plan must be faster under the same cost model."""
    fix = "pp=2,tp=1,dp=2,micro_batch=1,recompute=none,zero=0,schedule=1f1b"
    aware = _plan(mid_gpt2, fix)
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    naive = plan_prepared(mid_gpt2, load_cluster("dgx-a100-80g", gpus_per_node=4), tr,
                          SearchOptions(fix=parse_fix(fix), top_k=0))
    bounds = [0]
    for st in naive.stages:
        bounds.append(bounds[-1] + len(st["blocks"]))
    hc = load_cluster(MIXED)
    ma = ModelArrays.from_blocks(mid_gpt2.blocks)
    cfg = Config(**{k: v for k, v in naive.parallel.items()})
    costs = group_costs(ma, hc, tr, tp=cfg.tp, sp=cfg.sequence_parallel, recompute=cfg.recompute,
                        micro_batch=cfg.micro_batch)
    naive_on_mixed = min(price_hetero(cfg, bounds, order, ma, costs, hc, tr).step_time_s
                         for order in ([0, 1], [1, 0]))
    assert aware.step_time_s < 0.9 * naive_on_mixed


def _brute(times, slots, capacities, mem):
    n, stages = len(times[0]), sum(slots)
    best = None
    for order in itertools.permutations(range(len(slots))):
        groups = [g for g in order for _ in range(slots[g])]
        for cuts in itertools.combinations(range(1, n), stages - 1):
            bounds = [0, *cuts, n]
            if any(mem.of(s, a, b) > capacities[groups[s]] for s, (a, b) in enumerate(zip(bounds, bounds[1:]))):
                continue
            value = max(sum(times[groups[s]][a:b]) for s, (a, b) in enumerate(zip(bounds, bounds[1:])))
            best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("seed", range(25))
def test_cpsat_placement_equals_brute_force(seed):
    import random

    rng = random.Random(seed)
    n = rng.randint(3, 7)
    slots = [rng.randint(1, 2), rng.randint(1, 2)]
    if sum(slots) > n:
        slots = [1, 1]
    base = [float(rng.randint(1, 9)) for _ in range(n)]
    times = [base, [2.5 * t for t in base]]  # group 1 is 2.5x slower
    mem = StageMemory(static=[float(rng.randint(0, 6)) for _ in range(n)], act=[0.0] * n,
                      work=[0.0] * n, in_flight=[1] * sum(slots), capacity=0.0)
    caps = [float(rng.randint(8, 30)), float(rng.randint(6, 20))]
    got = solve_hetero(times, slots, [(i, i + 1) for i in range(n - 1)], mem, caps, time_limit_s=20)
    want = _brute(times, slots, caps, mem)
    assert (got is None) == (want is None)
    if got is not None:
        assert got.status == "optimal"
        assert got.bottleneck == pytest.approx(want, abs=n * max(map(sum, times)) / 1e6)


@pytest.mark.parametrize("mixed", [True, False])
def test_a_search_cut_by_its_time_limit_says_feasible_with_an_unknown_gap(mid_gpt2, mixed):
    """One search loop for both kinds of cluster: when the time limit stops the enumeration the
    status is feasible (not optimal) with an unknown gap, and the configurations left out are
    counted; the plan found so far is returned (at least one configuration is always priced)."""
    cluster = load_cluster(MIXED) if mixed else load_cluster("dgx-a100-80g", gpus_per_node=4)
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    cut = plan_prepared(mid_gpt2, cluster, tr, SearchOptions(top_k=1, time_limit_s=1e-9))
    s = cut.search
    assert s["status"] == "feasible" and s["gap"] is None
    assert s["evaluated"] >= 1 and s["rejected"]["not evaluated (time limit)"] >= 1
    assert s["evaluated"] + sum(s["rejected"].values()) >= s["candidates"]
    full = plan_prepared(mid_gpt2, cluster, tr, SearchOptions(top_k=1))
    assert full.search["status"] == "optimal" and full.search["gap"] == 0.0
    assert "not evaluated (time limit)" not in full.search["rejected"]
    assert full.step_time_s <= cut.step_time_s
    # CP-SAT's re-check of the stages' groups, recorded and shown (README: sites and groups)
    if mixed:
        from planner.report.summary import summary
        assert full.search["groups_check"] == {"status": "optimal", "gap": 0.0}
        assert "CP-SAT's check of the stages' groups and sizes: optimal" in summary(full)
    else:
        assert "groups_check" not in full.search


def test_a_time_limit_never_turns_a_model_that_fits_into_no_plan(mid_gpt2, monkeypatch):
    """The deadline stops the screening once something is queued; when everything queued then
    turns out not to fit, the screening goes on until a configuration that fits is priced (it
    said "no plan fits" for DeepSeek-V3 on 256 H100 with a 0.01 s limit)."""
    from costmodels.errors import InfeasibleError
    from planner.search import loop
    cluster = load_cluster("dgx-a100-80g", gpus_per_node=4)
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    split, first = loop._Pricer.split, []

    def split_failing_first_tp(self, cfg, costs):  # the first group screened does not fit
        first.append(first[0] if first else cfg.tp)
        if cfg.tp == first[0]:
            raise InfeasibleError("too big", reason="out of memory")
        return split(self, cfg, costs)
    monkeypatch.setattr(loop._Pricer, "split", split_failing_first_tp)
    cut = plan_prepared(mid_gpt2, cluster, tr, SearchOptions(top_k=1, time_limit_s=1e-9))
    assert cut.parallel["tp"] != first[0] and cut.search["status"] == "feasible"
    assert cut.search["rejected"]["out of memory"] >= 1


def test_a_time_limit_never_ends_without_a_plan_when_the_kept_ones_simulate_over_memory(
        mid_gpt2, monkeypatch):
    """When the simulation puts every kept plan over memory (here: refine keeps none), the next
    ones are simulated past the time limit too until one fits, and nothing is counted twice."""
    from planner.search import loop
    cluster = load_cluster("dgx-a100-80g", gpus_per_node=4)
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    monkeypatch.setattr(loop._Pricer, "refine", lambda self, ranked, deadline: [])
    for limit in (1e-9, None):
        plan = plan_prepared(mid_gpt2, cluster, tr, SearchOptions(top_k=1, time_limit_s=limit))
        s = plan.search
        assert plan.step_time_s > 0 and all(n >= 0 for n in s["rejected"].values())
        assert limit is None or (s["status"] == "feasible" and s["gap"] is None)


@pytest.mark.parametrize("fix,words", [("schedule=interleaved-1f1b", "fix.schedule"),
                                       ("schedule=zb-h1", "fix.schedule"),
                                       ("vpp=2", "fix.vpp"),
                                       ("offload_optimizer=true", "fix.offload_optimizer"),
                                       ("placement=tp-pp-dp", "fix.placement")])
def test_pins_the_group_pricing_cannot_honour_are_refused_before_tracing(fix, words):
    import planner

    with pytest.raises(SpecError, match=words):  # "nope" is never resolved: the pin fails first
        planner.plan("nope", cluster=MIXED, global_batch=16, dtype="fp16", fix=fix)


def test_a_device_without_flashattention_prices_attention_with_its_scores(mid_gpt2, caplog):
    """V100 (sm70) runs no FlashAttention: a plan on a cluster holding one is priced, and says it
    is priced, with attention scores in memory; an A100-only cluster keeps FlashAttention."""
    import logging

    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    opts = SearchOptions(fix=parse_fix("pp=2,tp=1,dp=2,micro_batch=1,recompute=none"), top_k=0)
    with caplog.at_level(logging.WARNING, logger="planner.api"):
        mixed = plan_prepared(mid_gpt2, load_cluster(MIXED), tr, opts)
    assert mixed.training["engine"]["attention"] == "materialized"
    assert "v100 has no FlashAttention kernel" in caplog.text
    from planner.report.summary import summary
    assert "attention scores in memory" in summary(mixed)
    assert "(v100: no FlashAttention)" in summary(mixed)  # plan show says why
    caplog.clear()
    a100 = load_cluster({**MIXED["groups"][0], "name": "a100-only",
                         "inter_node": MIXED["inter_node"]})
    with caplog.at_level(logging.WARNING, logger="planner.api"):
        plain = plan_prepared(mid_gpt2, a100, tr, SearchOptions(top_k=0))
    assert plain.training["engine"]["attention"] == "flash" and "FlashAttention" not in caplog.text
    assert "no FlashAttention" not in summary(plain)


def test_simulate_refuses_the_schedules_group_clusters_are_not_priced_for(mid_gpt2, tmp_path,
                                                                           capsys):
    """plan simulate on a plan of device groups: interleaving (or zb-h1) would be priced with one
    stage per rank's times, as plan solve refuses it (a new-user check read -17.4%)."""
    from planner.cli.main import main

    path = str(tmp_path / "mixed.json")
    _plan(mid_gpt2, "pp=2,tp=1,dp=2,micro_batch=1,recompute=none").save(path)
    assert main(["simulate", path, "--schedule", "interleaved-1f1b", "--vpp", "2"]) == 2
    assert "plan: error: schedule: interleaved-1f1b with vpp=2 is not priced on clusters of " \
        "device groups or sites" in capsys.readouterr().err
    assert main(["simulate", path, "--schedule", "zb-h1"]) == 2
    assert main(["simulate", path, "--schedule", "gpipe"]) in (0, 3)


FP8_MIXED = {**MIXED, "name": "fp8-mixed",
             "groups": [{**g, "name": d, "device": d} for g, d in zip(MIXED["groups"],
                                                                       ("b200", "h100"))]}
"""MIXED's layout with two kinds of GPU that both run fp8."""


def test_an_fp8_plan_over_groups_says_what_fp8_changed_per_group(mid_gpt2):
    """A new-user check saw an fp8 plan on B200 + H100 lose the fp8 line a plan on one device
    kind has (its rates, and the same plan in bf16)."""
    from costmodels.hardware import get_device
    from planner.report.summary import summary
    from planner.search import hetero
    from planner.search.loop import search

    hc = load_cluster(FP8_MIXED)
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp8")
    options = SearchOptions(fix=parse_fix("pp=2,tp=1,dp=2,micro_batch=1,recompute=none"),
                            top_k=0)
    p = plan_prepared(mid_gpt2, hc, tr, options)
    f = p.predicted["fp8"]
    assert [g["group"] for g in f["groups"]] == ["b200", "h100"]
    assert f["groups"][0]["gemm_peak_tflops"] == get_device("b200").peak("fp8") / 1e12
    assert f["groups"][1]["bf16_peak_tflops"] == get_device("h100").peak("bf16") / 1e12
    assert f["bf16_fits"] and f["bf16_step_time_s"] > 0
    assert "b200: 4,500 TFLOP/s peak" in summary(p) and "in bf16 this plan would take" in summary(p)
    # the re-pricing rebuilds the plan's own stages and groups: in fp8 it gives the plan's time
    best = search(mid_gpt2.blocks, hc, tr, hetero.restrict(options)).best
    again = hetero.repriced(best, ModelArrays.from_blocks(mid_gpt2.blocks), hc, tr)
    assert again.step_time_s == pytest.approx(best.step_time_s, rel=1e-9)
    assert [st.group for st in again.stages] == [st.group for st in best.stages]


def test_an_fp8_optimizer_step_over_groups_refreshes_the_fp8_copies(mid_gpt2, monkeypatch):
    """The FP8 copies of the layers' weights are refreshed after the update, on each group's
    memory bandwidth, as on one kind of GPU (left out over groups until a review found it)."""
    from costmodels import precision
    from planner.search import hetero
    from planner.search.loop import search

    hc = load_cluster(FP8_MIXED)
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp8")
    options = hetero.restrict(SearchOptions(
        fix=parse_fix("pp=2,tp=1,dp=2,micro_batch=1,recompute=none"), top_k=0))
    best = search(mid_gpt2.blocks, hc, tr, options).best
    ma = ModelArrays.from_blocks(mid_gpt2.blocks)
    monkeypatch.setattr(precision, "FP8_WEIGHT_REFRESH_BYTES", 0.0)
    without = hetero.repriced(best, ma, hc, tr)
    added = best.breakdown["optimizer_s"] - without.breakdown["optimizer_s"]
    # the slowest rank's refresh: at most its layers' weights x the bytes, over the slower HBM
    layers = max(st.params for st in best.stages)
    slowest = min(g.device.memory_bytes_per_s for g in hc.groups)
    monkeypatch.undo()
    assert 0 < added <= layers * precision.FP8_WEIGHT_REFRESH_BYTES / slowest


def test_a_dtype_one_group_lacks_names_the_group():
    import planner

    with pytest.raises(SpecError, match=r"^dtype: device v100 has no bf16 support .*\(group v100: "
                                        r"every group of mixed runs the one dtype\)$"):
        planner.plan("gpt2", cluster=MIXED, global_batch=8, dtype="bf16")


def test_nothing_fitting_a_cluster_of_groups_says_no_plan_fits(mid_gpt2):
    """Exit 3's line is 'no plan fits: ...' for a cluster of groups too (the fuzz benchmark,
    seed 3100, read 'no plan fits the cluster's groups (...)' against the README's contract)."""
    from planner.errors import InfeasibleError

    tiny = {**MIXED, "groups": [{**g, "device": {"name": f"small-{g['name']}", "memory_GB": 1.4,
                                                  "peak_TFLOPs": {"fp16": 100, "fp32": 10},
                                                  "hbm_GBps": 1000}}
                                for g in MIXED["groups"]]}
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    with pytest.raises(InfeasibleError) as err:
        plan_prepared(mid_gpt2, load_cluster(tiny), tr, SearchOptions(top_k=1))
    assert str(err.value).startswith("no plan fits: no configuration fits the cluster's groups (")
    # what the leanest needs on each group alone against its devices (a new-user check got only
    # the count out of memory), and a group alone that fits named as the way out
    assert re.search(r"; the leanest configuration on each group alone needs per GPU: "
                     r"\w+ \(\d+ x small-\w+\) [\d.]+ GB of [\d.]+ GB usable", str(err.value))
    crumb = {**tiny["groups"][1], "device": {**tiny["groups"][1]["device"], "memory_GB": 0.05}}
    roomy = {**tiny, "groups": [MIXED["groups"][0], crumb]}
    with pytest.raises(InfeasibleError) as err:
        plan_prepared(mid_gpt2, load_cluster(roomy), tr, SearchOptions(top_k=1))
    assert str(err.value).endswith(f"{MIXED['groups'][0]['name']} alone would fit: plan on it "
                                   "alone (a cluster file of that group)")


def test_a_pinned_pp_is_checked_against_the_depths_the_groups_can_take(mid_gpt2):
    """A new-user check pinned pp on two groups of 16 GPUs: pp=3 was answered 'use one of 1, 2,
    4, 8, 16' (pp=1 then failed, pp=32 ran though unlisted). Every stage is tp x dp GPUs of one
    group, of one width in all, so pp is the groups' GPUs over that width."""
    with pytest.raises(SpecError, match=r"fix.pp: 3 stages do not fill the groups .*2 \+ 2 "
                                        r"GPUs\); use one of 2, 4$"):
        _plan(mid_gpt2, "pp=3")
    with pytest.raises(SpecError, match=r"fix.pp: 1 stage does not fill the groups"):
        _plan(mid_gpt2, "pp=1")
    assert _plan(mid_gpt2, "pp=4").parallel["pp"] == 4


def test_with_three_sites_or_more_some_of_them_are_named_as_a_way_too():
    """A new-user check of three sites was told to plan on the fastest alone, while two of them
    together were 16% faster still: with three or more, some of the sites are named too (that
    search is not run)."""
    from planner.search import alone

    rows = [{"group": "a", "gpus": 16, "step_time_s": 5.0}, {"group": "c", "gpus": 16,
                                                            "step_time_s": 9.0}]
    _, three = alone.verdict(rows, 13.6, sites=True, kinds=2, groups=3)
    _, two = alone.verdict(rows, 13.6, sites=True, kinds=2, groups=2)
    assert "plan on a alone" in three and "or on some of the sites" in three
    assert "plan on a alone" in two and "some of the sites" not in two


def test_a_wrong_tp_pin_is_offered_only_degrees_the_rules_take(mid_gpt2):
    """A new-user check pinned tp=3 on groups of two 8-GPU nodes and was offered tp=16, which
    the rule keeping tensor parallelism inside a node then refused: the degrees offered are
    those every rule takes."""
    two = {**MIXED, "groups": [{**g, "nodes": 2} for g in MIXED["groups"]]}
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    with pytest.raises(SpecError, match=r"^fix.tp: 3 does not divide the 4 GPUs a pipeline stage "
                                        r"may take in any group or site .*; use one of 1, 2$"):
        plan_prepared(mid_gpt2, load_cluster(two), tr, SearchOptions(fix={"tp": 3}, top_k=1))


def test_a_pp_that_fills_the_groups_but_exceeds_the_blocks_says_so(mid_gpt2):
    """The depths offered for a pp that does not fill the groups are those the model's blocks
    allow; a pp that fills them but exceeds the blocks is refused for the blocks (a review: the
    filtered list made it read 'does not fill the groups')."""
    wide = {**MIXED, "groups": [{**g, "nodes": 32} for g in MIXED["groups"]]}
    tr = TrainingSpec(global_batch=128, seq_len=mid_gpt2.seq_len, dtype="fp16")
    blocks = len(mid_gpt2.blocks.blocks)
    too_deep = next(d for d in (2 ** k for k in range(1, 8)) if d > blocks)
    with pytest.raises(SpecError, match=rf"^fix: pp={too_deep} stages for a model of {blocks} "
                                        r"blocks"):
        plan_prepared(mid_gpt2, load_cluster(wide), tr,
                      SearchOptions(fix={"pp": too_deep}, top_k=1))
    with pytest.raises(SpecError, match=r"^fix.pp: 3 stages do not fill the groups") as err:
        plan_prepared(mid_gpt2, load_cluster(wide), tr, SearchOptions(fix={"pp": 3}, top_k=1))
    offered = [int(d) for d in str(err.value).rsplit("use one of ", 1)[1].split(", ")]
    assert offered and max(offered) <= blocks


def test_groups_alike_are_told_that_one_cluster_plans_them_as_well(mid_gpt2, caplog):
    """Two groups of one device, node width and links: the groups form runs no data parallelism
    across them, so the plan says a one-kind cluster does as well or better; groups that differ
    get no such line."""
    import logging

    a100 = MIXED["groups"][0]
    alike = {**MIXED, "groups": [a100, {**a100, "name": "a100b"}]}
    tr = TrainingSpec(global_batch=16, seq_len=mid_gpt2.seq_len, dtype="fp16")
    opts = SearchOptions(fix=parse_fix("pp=2,tp=1,micro_batch=1,recompute=none"), top_k=0)
    for cluster, said in ((alike, True), (MIXED, False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="planner.api"):
            plan_prepared(mid_gpt2, load_cluster(cluster), tr, opts)
        assert ("cluster: its groups are alike (a100-80g x 2 GPUs per node, the same links)"
                in caplog.text) is said
        assert ("one cluster of 2 nodes" in caplog.text) is said
