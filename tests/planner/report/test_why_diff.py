"""`plan show` explanations, `plan show --why` (re-plan with knobs pinned, or what does not fit) and
`plan diff`, on a tiny Llama and clusters given as YAML-style mappings (so the plan must carry its
cluster in full for --why to re-plan it)."""

import dataclasses
import logging
import re

import pytest

import planner
from planner.explore.whynot import why_not
from planner.report import compare
from planner.report.why import why
from planner.cli.main import main
from planner.planfile.document import load_plan
from tests.conftest import TINY_GPT_OSS

SMALL = {"name": "small", "device": {"name": "small", "memory_GB": 1.09,
                                     "peak_TFLOPs": {"bf16": 100, "fp32": 10}, "hbm_GBps": 1000},
         "nodes": 2, "gpus_per_node": 4,
         "intra_node": {"bandwidth_GBps": 100, "latency_us": 3},
         "inter_node": {"bandwidth_GBps": 10, "latency_us": 10}}
"""A device with about 36 MB usable after the 5% + 1 GB reserve: the tiny Llama's model states
(about 45 MB under plain data parallelism with Adam) only fit sharded or split."""
ONE_GPU_NODES = {**SMALL, "name": "one-per-node", "nodes": 4, "gpus_per_node": 1,
                 "device": {**SMALL["device"], "memory_GB": 80}}


@pytest.fixture(scope="module")
def small_plan(tiny_llama_config, tmp_path_factory):
    p = planner.plan(tiny_llama_config, cluster=SMALL, global_batch=32, seq_len=128)
    path = tmp_path_factory.mktemp("why") / "small.json"
    p.save(str(path))
    return str(path)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    logging.getLogger("planner").handlers[:] = []  # the CLI's handler wrote to captured stderr
    return code, out, err


def test_why_with_pins_the_rules_refuse_every_configuration_of_says_no_plan(capsys, small_plan,
                                                                          monkeypatch):
    """A new-user check read 'no plan fits' where no configuration had the pins (the batch did
    not split over dp): the rules, not the memory; the README's exit-code table says 'no plan'."""
    from planner.explore import whynot

    monkeypatch.setattr(whynot, "why_not", lambda plan, pins, model=None: whynot.WhyNot(
        pins={"tp": 1}, variant=None, feasible=False, notes=[], over=[],
        message="no configuration has tp=1 (ruled out by the rules: global batch not divisible "
                "by dp: 1)"))
    code, out, err = run(capsys, "show", small_plan, "--why", "tp=1")
    assert code == 3 and err.strip().endswith("plan: no plan: with tp=1 (the explanation above "
                                              "says why)"), err


def test_why_on_an_infeasible_variant_names_the_stage_and_the_memory_it_needs(capsys, small_plan):
    plan = load_plan(small_plan)
    assert plan.parallel["tp"] * plan.parallel["pp"] > 1 or plan.parallel["zero"] > 0
    code, out, err = run(capsys, "show", small_plan, "--why", "tp=1,pp=1,zero=0")
    assert code == 3, err  # no plan fits, after the explanation (as solve's exit code says)
    assert err.strip().endswith("plan: no plan fits: with tp=1,pp=1,zero=0 (the explanation "
                                "above says why)")
    assert "finds no plan with tp=1,pp=1,zero=0" in out and "out of memory" in out
    flat = " ".join(out.split())  # lines are wrapped at 100 columns
    m = re.search(r"stage 0 \(([^)]*)\) would need ([\d.]+) GB per GPU \(.*?\), but each small "
                  r"has ([\d.]+) GB, ([\d.]+) GB usable", flat)
    assert m, out
    need, device, usable = (float(m.group(i)) for i in (2, 3, 4))
    assert "model.embed_tokens" in m.group(1) and "lm_head" in m.group(1)  # pp=1: every block
    assert device == pytest.approx(1.09) and need > usable
    answer = why_not(plan, {"tp": 1, "pp": 1, "zero": 0})
    assert not answer.feasible and answer.over[0][0] == 0
    states = 16 * plan.model["num_params"]  # 2 weights + 2 grads + 12 Adam bytes per parameter
    assert answer.over[0][2] > states  # at least the unsharded model states, plus activations
    assert answer.over[0][2] == pytest.approx(answer.variant.predicted["peak_memory_bytes"],
                                              rel=1e-5)


def test_why_on_a_feasible_variant_says_what_changes(capsys, small_plan):
    plan = load_plan(small_plan)
    other = 1 if plan.parallel["zero"] != 1 else 2
    code, out, err = run(capsys, "show", small_plan, "--why", f"zero={other}")
    assert code == 0, err
    answer = why_not(plan, {"zero": other})
    assert answer.feasible and answer.variant.parallel["zero"] == other
    assert f"With zero={other} the best plan" in out
    assert f"zero {plan.parallel['zero']} -> {other}" in out
    assert "step time" in out and "memory:" in out
    assert "the plan already has" not in out
    code, out, err = run(capsys, "show", small_plan, "--why", f"zero={plan.parallel['zero']}")
    assert code == 0 and f"The plan already has zero={plan.parallel['zero']}; the best" in out
    assert "With zero=" not in out and "- the plan already has" not in out
    code, _, err = run(capsys, "show", small_plan, "--why", "")
    assert code == 2 and "why: name the knobs" in err


def test_why_tensor_parallel_across_nodes_prices_the_inter_node_all_reduce(tiny_llama_config):
    plan = planner.plan(tiny_llama_config, cluster=ONE_GPU_NODES, global_batch=32, seq_len=128,
                        fix={"tp": 1})
    answer = why_not(plan, {"tp": 2})  # pinned, tp may span whole nodes: planned, not refused
    assert answer.feasible
    v = answer.variant
    assert v.parallel["tp"] == 2 and v.parallel["dp"] * v.parallel["pp"] == 2
    tp_change = [c for c in compare.part_changes(plan, v) if c.part == "tp_comm_s"]
    assert tp_change and tp_change[0].delta_s > 0
    assert "tensor parallel crosses nodes" in tp_change[0].because
    text = " ".join(why(plan, answer).split())
    assert "tensor parallel crosses nodes: all-reduce on the inter-node link" in text
    # a cluster of groups or sites has a link between nodes per group: named so, not as 0 GB/s
    # (a new-user check read "(inter-node, 0 GB/s per GPU)" on sites)
    import dataclasses
    grouped = dataclasses.replace(v, cluster={k: x for k, x in v.cluster.items()
                                              if k != "inter_node_GBps"})
    moved = [c for c in compare.part_changes(plan, grouped) if c.part == "tp_comm_s"]
    assert "all-reduce on the links between nodes" in moved[0].because


def test_why_rejects_unknown_knobs_with_exit_2(capsys, small_plan):
    code, _, err = run(capsys, "show", small_plan, "--why", "tpp=2")
    assert code == 2 and "unknown knob 'tpp'" in err and "Traceback" not in err


def test_show_breaks_the_step_down_and_says_why_runners_up_lost(capsys, small_plan):
    code, out, _ = run(capsys, "show", small_plan)
    assert code == 0
    plan = load_plan(small_plan)
    shares = [float(x) for x in re.findall(r"^      \S.*?\s([\d.]+)%", out, re.M)]
    assert shares and sum(shares) == pytest.approx(100, abs=1.0)
    assert "runners-up, and why they lost:" in out
    alts = plan.search["alternatives"]
    for i, a in enumerate(alts, 2):
        assert re.search(rf"^    {i}\. [^\n]*:\s+[\d.]+ s \([+-][\d.]+%\)", out, re.M), out
    assert all(len(line) <= 100 for line in out.splitlines() if "runners" in line or
               line.startswith("    "))


def test_diff_shows_what_differs_and_by_how_much(capsys, tiny_llama_config, small_plan, tmp_path):
    a = load_plan(small_plan)
    b = planner.plan(tiny_llama_config, cluster={**SMALL, "nodes": 4}, global_batch=32,
                     seq_len=128)
    b_path = str(tmp_path / "b.json")
    b.save(b_path)
    diffs = {d.label: d for d in compare.compare(a, b)}
    assert diffs["cluster nodes"].differs and (diffs["cluster nodes"].a,
                                               diffs["cluster nodes"].b) == (2, 4)
    assert not diffs["model name"].differs
    code, out, err = run(capsys, "diff", small_plan, b_path)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.strip().startswith("cluster nodes"))
    assert row.split()[2:5] == ["2", "4", "x2"]
    step = next(line for line in out.splitlines() if line.strip().startswith("step time "))
    delta = b.step_time_s - a.step_time_s
    assert f"{delta:+.3g} s" in step and f"{100 * delta / a.step_time_s:+.1f}%" in step
    assert "same in both:" in out and "model name" in out.split("same in both:")[1]
    assert out.splitlines()[2].startswith("B is ")
    ratio = a.step_time_s / b.step_time_s  # the headline: a ratio and the step's change
    assert out.splitlines()[2].startswith(
        f"B is {ratio:.2f}x as fast (a {-100 * delta / a.step_time_s:.1f}% shorter step): "
        if ratio > 1 else f"B is {1 / ratio:.2f}x slower (a {100 * delta / a.step_time_s:.1f}% "
        "longer step): ")
    assert compare.headline(a, a).startswith("as fast")
    assert "num_gpus 8 -> 16" in out.splitlines()[2]  # the inputs that differ come first
    assert "the step does other work" not in out.splitlines()[2]  # same model and batch
    bigger = planner.plan(tiny_llama_config, cluster=SMALL, global_batch=64, seq_len=128)
    assert "global_batch 32 -> 64" in compare.headline(a, bigger)
    rate = bigger.predicted["tokens_per_s"] / a.predicted["tokens_per_s"]
    # leading with the rate (a new-user check read '6.73x slower' first for another model)
    assert compare.headline(a, bigger).startswith(
        f"at {rate:.2f}x the tokens/s (a step {bigger.step_time_s / a.step_time_s:.3g}x as long)")
    assert compare.headline(a, bigger).endswith("the step does other work (model or batch "
                                                "differ): the rate compares them")
    # another model of another length (an image model's patches against one token a sample)
    # compares by samples/s (a new-user check read a ViT against a CNN in tokens/s); the same
    # model at another length by tokens/s
    shorter = planner.plan(tiny_llama_config, cluster=SMALL, global_batch=32, seq_len=64)
    tokens = shorter.predicted["tokens_per_s"] / a.predicted["tokens_per_s"]
    assert compare.headline(a, shorter).startswith(f"at {tokens:.2f}x the tokens/s")
    other = dataclasses.replace(shorter, model={**shorter.model, "name": "another"})
    samples = other.predicted["samples_per_s"] / a.predicted["samples_per_s"]
    assert compare.headline(a, other).startswith(f"at {samples:.2f}x the samples/s")
    code, out, _ = run(capsys, "diff", small_plan, small_plan)
    assert code == 0 and "B takes as long as A" in out
    # the same knobs priced for other software: the settings that differ are named
    eager = planner.plan(tiny_llama_config, cluster=SMALL, global_batch=32, seq_len=128,
                         engine="megatron-core,kernels=eager")
    assert "engine kernels fused -> eager" in compare.headline(a, eager)
    software = [d for d in compare.compare(a, eager) if d.section == "software"]
    assert [(d.label, d.a, d.b) for d in software] == [("kernels", "fused", "eager")]
    # a ZeRO stage is a name, not a count: no "x3" for 1 -> 3
    from planner.report.diff import _change  # noqa: PLC0415
    zero = next(d for d in compare.compare(a, b) if d.label == "zero")
    assert zero.kind == "text" and _change(1, 3, zero.kind) == ""
    # ten times and beyond reads as a factor, not +12528.0% (a new-user check)
    assert _change(0.001, 0.12628, "s") == "+0.125 s (x126)"
    assert _change(2.0, 0.1, "s") == "-1.9 s (/20)" and _change(2.0, 1.0, "s") == "-1 s (-50.0%)"


def test_diff_compares_stages_one_by_one_only_for_the_same_split(tiny_llama_config):
    """Plans with other stage counts have no stage in common: the slowest stage is compared, not
    A's stage 0 against B's (a new-user check read -58.5% for 19 layers against 5)."""
    a = planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=32, seq_len=128,
                     fix={"pp": 2, "tp": 1})
    b = planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=32, seq_len=128,
                     fix={"pp": 1, "tp": 1})
    labels = [d.label for d in compare.compare(a, b) if d.section == "stages"]
    assert labels == ["stages", "slowest stage's time per micro-batch"]
    slowest = next(d for d in compare.compare(a, b) if d.label.startswith("slowest"))
    assert slowest.a == max(s["predicted"]["time_per_microbatch_s"] for s in a.stages)
    same = [d.label for d in compare.compare(a, a) if d.section == "stages"]
    assert same[1:] == ["stage 0 blocks", "stage 0 time per micro-batch", "stage 0 memory",
                        "stage 1 blocks", "stage 1 time per micro-batch", "stage 1 memory"]
    # on device groups, which group runs each stage (a new-user check: stages swapped from the
    # H100 to the A100 group, and the diff did not say)
    import dataclasses
    h, g = (dataclasses.replace(a, stages=[{**st, "group": name} for st, name in
                                           zip(a.stages, names)])
            for names in (("h100s", "a100s"), ("a100s", "h100s")))
    moved = [(d.label, d.a, d.b) for d in compare.compare(h, g)
             if d.section == "stages" and d.label.endswith("group")]
    assert moved == [("stage 0 group", "h100s", "a100s"), ("stage 1 group", "a100s", "h100s")]
    # and each group's nodes, GPUs per node and links (a new-user check shrank a group's nodes
    # from 8 GPUs to 3: the diff said only that the GPU count changed, and the per-node figure,
    # the largest group's, "same in both")
    group = {"name": "v100", "device": "v100", "nodes": 2, "gpus_per_node": 8,
             "intra_node_GBps": 150, "inter_node_GBps": 12.5}
    wide, narrow = (dataclasses.replace(a, cluster={**a.cluster, "groups": [
        {**group, "gpus_per_node": n}]}) for n in (8, 3))
    shapes = [(d.label, d.a, d.b) for d in compare.compare(wide, narrow) if d.differs]
    assert ("group v100", "2 x 8 v100, 150/12.5 GB/s", "2 x 3 v100, 150/12.5 GB/s") in shapes
    assert "group v100 2 x 8 v100, 150/12.5 GB/s -> 2 x 3 v100" in compare.headline(wide, narrow)


def test_why_with_a_knob_the_model_cannot_take_is_bad_input(capsys, small_plan):
    # the tiny Llama has no routed experts: as `plan solve --fix ep=2` says, not a plan at ep 1
    code, out, err = run(capsys, "show", small_plan, "--why", "ep=2")
    assert code == 2 and "plan: error: why.ep: the model has no routed experts" in err
    assert "If it ran" not in out


def test_why_names_a_pin_the_plans_target_refuses_as_why(capsys, small_plan, tmp_path):
    import dataclasses

    plan = load_plan(small_plan)
    path = tmp_path / "titan.json"
    dataclasses.replace(plan, search={**plan.search, "target": "torchtitan"}).save(str(path))
    code, _, err = run(capsys, "show", str(path), "--why", "zero=1")
    assert code == 2 and "plan: error: why.zero: torchtitan does not shard model states as " \
        "ZeRO-1" in err
    # plan show has no --target: another target is a new solve (a new-user check tried
    # `plan show --why ... --target any`, as the refusal said)
    code, _, err = run(capsys, "show", str(path), "--why", "pp=2,schedule=zb-h1")
    assert code == 2 and "why.schedule: torchtitan does not run zb-h1" in err
    assert "(or re-solve with plan solve ... --target any)" in err


def test_diff_leaves_out_expert_settings_for_dense_models(small_plan):
    import dataclasses

    a = load_plan(small_plan)
    engine = {**a.training.get("engine", {}), "moe_etp_replicated": True, "fsdp_experts": True,
              "attention": "flash2"}
    b = dataclasses.replace(a, training={**a.training, "engine": engine})
    changed = [k for k, _, _ in compare.engine_changes(a, b)]
    assert changed == ["engine attention"]
    moe = dataclasses.replace(a, model={**a.model, "routed_experts": 8})
    assert "engine fsdp_experts" in [k for k, _, _ in compare.engine_changes(moe, b)]
    # settings of degrees neither plan has (a new-user check saw cp_ring te -> torch and
    # moe_etp_replicated off -> on listed for two plans at cp = etp = 1)
    assert "engine moe_etp_replicated" not in [k for k, _, _ in compare.engine_changes(moe, b)]
    ring = dataclasses.replace(a, training={**a.training, "engine": {
        **a.training.get("engine", {}), "cp_ring": "torch"}})
    assert a.parallel.get("cp", 1) == 1 and compare.engine_changes(a, ring) == []
    split = dataclasses.replace(ring, parallel={**ring.parallel, "cp": 2})
    assert [k for k, _, _ in compare.engine_changes(a, split)] == ["engine cp_ring"]
    # tp_overlap where neither plan has tp, and FP8 settings where neither runs fp8 (a
    # new-user check saw `engine tp_overlap on -> off` head a diff of two tp=1 plans)
    quiet = dataclasses.replace(a, parallel={**a.parallel, "tp": 1})
    overlap = dataclasses.replace(quiet, training={**quiet.training, "engine": {
        **quiet.training.get("engine", {}), "tp_overlap": True, "fp8_recipe": "block"}})
    assert a.training.get("dtype") != "fp8" and compare.engine_changes(quiet, overlap) == []
    wide = dataclasses.replace(overlap, parallel={**overlap.parallel, "tp": 2})
    assert [k for k, _, _ in compare.engine_changes(quiet, wide)] == ["engine tp_overlap"]


def test_diff_names_a_changed_intra_node_link(tiny_llama_config, small_plan):
    """Two clusters that differ only in their NVLink-class bandwidth: the diff shows it."""
    a = load_plan(small_plan)
    slow = {**SMALL, "intra_node": {"bandwidth_GBps": 25, "latency_us": 3}}
    b = planner.plan(tiny_llama_config, cluster=slow, global_batch=32, seq_len=128)
    diffs = {d.label: d for d in compare.compare(a, b)}
    link = diffs["cluster intra node GBps"]
    assert link.differs and (link.a, link.b) == (100, 25)


def test_diff_names_a_changed_device_memory_in_its_inputs_and_headline(tiny_llama_config,
                                                                       small_plan):
    """A new-user check: two cluster files differing only in the device's memory_GB (48 and 24)
    gave other plans, and the diff's inputs were empty, the memory 'same in both'."""
    from planner.report.diff import diff

    a = load_plan(small_plan)
    roomy = {**SMALL, "device": {**SMALL["device"], "memory_GB": 2.18}}
    b = planner.plan(tiny_llama_config, cluster=roomy, global_batch=32, seq_len=128)
    memory = {d.label: d for d in compare.compare(a, b)}["device memory GB"]
    assert memory.differs and (memory.a, memory.b) == (1.09, 2.18)
    assert "device memory 1.09 GB -> 2.18 GB" in compare.headline(a, b)
    inputs = diff(a, b).split("inputs\n", 1)[1].split("\n")[0]
    assert re.search(r"^  device memory GB +1\.09 +2\.18 +\+100\.0%$", inputs)


def test_diff_names_a_changed_link_latency_and_efficiency(tiny_llama_config, small_plan):
    """A new-user check: inter-node latency 5 us against 5000 us moved the step, and the diff
    said 'same configuration' with the latency nowhere; the plan's cluster spec records each
    link's latency and efficiency, and the diff lists those that differ."""
    from planner.report.diff import diff

    a = load_plan(small_plan)
    far = {**SMALL, "inter_node": {"bandwidth_GBps": 10, "latency_us": 10000},
           "intra_node": {**SMALL["intra_node"], "efficiency": 0.5}}
    b = planner.plan(tiny_llama_config, cluster=far, global_batch=32, seq_len=128)
    diffs = {d.label: d for d in compare.compare(a, b)}
    latency, eff = diffs["inter-node link latency us"], diffs["intra-node link efficiency"]
    assert latency.differs and (latency.a, latency.b) == (10, 10000)
    assert eff.differs and (eff.a, eff.b) == (0.8, 0.5) and eff.kind == "frac"
    assert not diffs["intra-node link latency us"].differs
    head = compare.headline(a, b)
    assert "inter-node link latency 10 us -> 10,000 us" in head
    assert "intra-node link efficiency 80% -> 50%" in head
    text = diff(a, b)
    assert "inter-node link latency us" in text.split("same in both")[0]
    assert "-30.0 points" in text


def test_each_groups_link_details_and_memory_are_compared():
    """A cluster of device groups: each group's latency and efficiency and its device memory,
    and the link between the groups, by label (its spec has no tiers of one kind of node)."""
    from types import SimpleNamespace

    link = {"bandwidth_GBps": 25, "latency_us": 10, "efficiency": 0.9}
    group = {"name": "old", "device": "v100",
             "spec": {"device": "v100", "intra_node": link, "inter_node": link}}
    plan = SimpleNamespace(cluster={"groups": [group], "inter_group_GBps": 1,
                                    "spec": {"inter_node": link, "inter_group": link}})
    assert compare.link_details(plan) == {
        "group old intra-node link latency us": (10, "rate"),
        "group old intra-node link efficiency": (0.9, "frac"),
        "group old intra-node link all-to-all efficiency": (0.9, "frac"),
        "group old inter-node link latency us": (10, "rate"),
        "group old inter-node link efficiency": (0.9, "frac"),
        "group old inter-node link all-to-all efficiency": (0.9, "frac"),
        "inter-group link latency us": (10, "rate"), "inter-group link efficiency": (0.9, "frac")}
    assert compare.group_memory(plan) == {"group old device memory GB": 32}
    # a link's own all-to-all efficiency is a figure of its own
    nvlink = {**link, "alltoall_efficiency": 0.63}
    plan = SimpleNamespace(cluster={"spec": {"intra_node": nvlink, "inter_node": link}})
    details = compare.link_details(plan)
    assert details["intra-node link all-to-all efficiency"] == (0.63, "frac")
    # a link without its own runs all-to-alls at the collectives' figure, and is compared so
    assert details["inter-node link all-to-all efficiency"] == (0.9, "frac")


def test_diff_names_the_frozen_parameters_of_either_plan(small_plan):
    """A plan of the model with frozen parameters against one of it trained whole: the inputs
    say how many are frozen (none where neither plan has any)."""
    a = load_plan(small_plan)
    same = {d.label: d for d in compare.compare(a, a)}["model frozen params"]
    assert same.a is None and not same.differs
    b = dataclasses.replace(a, model={**a.model, "frozen_params": 1000})
    frozen = {d.label: d for d in compare.compare(a, b)}["model frozen params"]
    assert frozen.differs and (frozen.a, frozen.b) == (None, 1000)


def test_one_configuration_line_everywhere_with_context_and_expert_parallelism():
    from planner.options import Config, parallel_text

    row = {"dp": 2, "tp": 2, "sequence_parallel": True, "pp": 2, "vpp": 2, "cp": 2,
           "cp_comm": "a2a", "ep": 2, "etp": 1, "micro_batch": 1, "num_microbatches": 8,
           "schedule": "1f1b", "recompute": "none", "zero": 1, "offload_optimizer": False}
    line = "dp=2 tp=2+sp pp=2x2 cp=2(a2a) ep=2 mb=1x8 1f1b rc=none zero=1"
    assert parallel_text(row) == line
    assert Config(**row).short() == line  # the search's messages say it the same way
    # a what-if row keeps None where a knob does not apply
    plain = {**row, "vpp": None, "cp": 1, "ep": None, "cp_comm": None}
    assert parallel_text(plain) == "dp=2 tp=2+sp pp=2 mb=1x8 1f1b rc=none zero=1"
    # experts' matrices split without spreading the experts: etp shows on its own
    assert parallel_text({**plain, "etp": 2, "offload_optimizer": True}) == \
        "dp=2 tp=2+sp pp=2 etp=2 mb=1x8 1f1b rc=none zero=1+offload"


def test_whatif_prices_every_point_for_the_software_given(capsys, tiny_llama_config, tmp_path):
    import csv

    def step(*engine):
        out_csv = tmp_path / f"{len(engine)}.csv"
        code, _, err = run(capsys, "-q", "whatif", tiny_llama_config, "--cluster", "dgx-h100",
                           "--vary", "nodes=1", "--global-batch", "8", "--seq-len", "128",
                           "--fix", "dp=8,tp=1,pp=1,micro_batch=1", "--workers", "1",
                           "--csv", str(out_csv), *engine)
        assert code == 0, err
        with open(out_csv) as f:
            return float(next(csv.DictReader(f))["step_time_s"])
    assert step("--engine", "megatron-core,kernels=eager") > step()
    code, _, err = run(capsys, "whatif", tiny_llama_config, "--cluster", "dgx-h100", "--vary",
                       "nodes=1", "--global-batch", "8", "--engine", "kernels=nonsense")
    assert code == 2 and "engine.kernels" in err


def test_why_says_when_the_search_did_not_try_a_faster_context_parallelism(tiny_llama_config):
    """One 2,048-token sequence on 8 GPUs: cp=2 leaves 1,024 tokens per rank, below the search's
    cp_min_tokens, so the plan has none; where --why cp=2 finds it faster it says why the search
    did not try it (priced as faster still, to see the note whichever way the tiny model goes)."""
    import dataclasses

    from planner.explore import whynot
    plan = planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=1, seq_len=2048)
    assert plan.parallel["cp"] == 1
    answer = why_not(plan, {"cp": 2})
    assert answer.feasible and answer.variant.parallel["cp"] == 2
    assert bool(answer.notes) == (answer.variant.step_time_s < plan.step_time_s)
    faster = dataclasses.replace(answer.variant, predicted={
        **answer.variant.predicted, "step_time_s": plan.step_time_s / 2})
    notes = whynot._untried(plan, faster, planner.SearchOptions())
    text = " ".join(why(plan, dataclasses.replace(answer, variant=faster, notes=notes)).split())
    assert "the search does not try context parallelism below 4,096 tokens per cp rank (1,024 " \
           "here at cp=2)" in text


def test_diff_shows_no_exchange_for_a_plan_without_context_parallelism(small_plan):
    """cp_comm means nothing at cp = 1: the diff shows '-' there and does not list it as a change
    (the change of cp says it)."""
    import dataclasses

    from planner.report.diff import diff
    a = load_plan(small_plan)
    assert a.parallel.get("cp", 1) == 1
    b = dataclasses.replace(a, parallel={**a.parallel, "cp": 2, "cp_comm": "a2a"})
    rows = [line.split() for line in diff(a, b).splitlines()]
    assert ["cp_comm", "-", "a2a"] in rows
    assert [k for k, _, _ in compare.config_changes(a, b)] == ["cp"]
    same = diff(a, dataclasses.replace(a, parallel={**a.parallel, "cp_comm": "a2a"}))
    assert "cp_comm" not in same  # at cp = 1 both have none, whatever the field says


def test_stage_table_has_exchange_columns_only_where_the_plan_has_them(small_plan):
    from planner.report.summary import stage_table

    plain = load_plan(small_plan)
    assert "ep comm" not in stage_table(plain)[0] and "cp comm" not in stage_table(plain)[0]
    moe = load_plan("tests/planner/export/data/plans/mixtral-8x7b-ep4-etp2-megatron.json")
    head, first = stage_table(moe)[:2]
    assert "ep comm" in head and "cp comm" not in head
    cols = re.split(r"\s{2,}", head.strip())
    cells = re.split(r"\s{2,}", first.strip())
    ep_ms = 1e3 * moe.stages[0]["predicted"]["ep_comm_s"]
    assert cells[cols.index("ep comm")] == f"{ep_ms:.1f} ms"


def test_diff_counts_the_fp8_weight_copies_in_memory(tiny_llama_config):
    """An fp8 plan keeps FP8 copies of the layers' weights: a kind of memory diff lists (before,
    the rows of the fullest GPU did not add up to its total)."""
    kw = {"cluster": "dgx-h100", "nodes": 1, "global_batch": 32, "seq_len": 128,
          "fix": "tp=1,pp=1,zero=0"}
    bf16, fp8 = (planner.plan(tiny_llama_config, dtype=d, **kw) for d in ("bf16", "fp8"))
    rows = {d.label: d for d in compare.compare(bf16, fp8) if d.section.startswith("memory")}
    copies = rows["fp8 weight copies"]
    assert copies.a == 0 and copies.b > 0
    peak = compare.peak_stage(fp8)["predicted"]["memory_bytes"]
    assert sum(d.b for d in rows.values()) == pytest.approx(peak["total"], rel=1e-4)  # 6 digits
    # MFU counts against each plan's own peak, twice as high in fp8: the row says so
    labels = [d.label for d in compare.compare(bf16, fp8) if d.section == "predicted"]
    assert "MFU (each against its own peak)" in labels
    assert "MFU" in [d.label for d in compare.compare(bf16, bf16) if d.section == "predicted"]


def test_clusters_read_with_their_node_counts_and_groups():
    from planner.units import cluster_text

    one = {"name": "dgx-h100", "device": "h100", "nodes": 1, "gpus_per_node": 8, "num_gpus": 8}
    assert cluster_text(one) == "8 x h100 (dgx-h100: 1 node x 8)"  # not '1 nodes'
    sites = {"name": "two", "device": "v100+v100", "num_gpus": 64, "groups": [
        {"name": "east", "device": "v100", "nodes": 4, "gpus_per_node": 8},
        {"name": "west", "device": "v100", "nodes": 4, "gpus_per_node": 8}]}
    assert cluster_text(sites) == ("64 GPUs (two: east 4 nodes x 8 v100, west 4 nodes x 8 v100)")


def test_why_says_when_it_lifts_a_pin_the_plan_was_made_with(tiny_llama_config):
    plan = planner.plan(tiny_llama_config, cluster=SMALL, global_batch=32, seq_len=128,
                        fix={"zero": 1})
    answer = why_not(plan, {"zero": 2})
    assert answer.feasible and "the plan was made with --fix zero=1, so its search did not try " \
        "zero=2" in answer.notes
    assert not [n for n in why_not(plan, {"pp": 2}).notes if "was made with" in n]


def test_a_gpu_factor_the_batch_lacks_is_named_with_batches_that_free_it(tiny_llama_config):
    """6 GPUs = 2 x 3 and a batch of 32: data parallelism divides the batch, so the 3 goes to tp
    or pp; the plan says so and names multiples of 6 near 32, with which dp takes it."""
    from planner.report.summary import summary

    six = {**ONE_GPU_NODES, "name": "six", "nodes": 6}
    p = planner.plan(tiny_llama_config, cluster=six, global_batch=32, seq_len=128)
    assert p.parallel["dp"] % 3
    text = " ".join(summary(p).split())
    assert ("batch 6 GPUs = 2 x 3, and the global batch 32 shares no factor with 3: data "
            "parallelism, which divides the batch, cannot take it, so ") in text
    assert "a global batch of 30 or 36 (a multiple of the GPUs) frees it" in text
    freed = planner.plan(tiny_llama_config, cluster=six, global_batch=36, seq_len=128)
    assert "shares no factor" not in summary(freed)
    assert "shares no factor" not in summary(planner.plan(
        tiny_llama_config, cluster=ONE_GPU_NODES, global_batch=32, seq_len=128))
    # a prime count (the note's words only): no "1 x 7"
    import copy
    from planner.report.summary import _batch_factors

    seven = copy.copy(p)
    seven.cluster = {**p.cluster, "num_gpus": 7}
    assert "batch 7 GPUs, and the global batch 32 shares no factor with 7" in " ".join(
        " ".join(_batch_factors(seven)).split())


def test_a_plan_for_any_target_says_which_engines_run_it_as_planned(small_plan):
    """A plan made with --target any may take what one engine does not run (a new-user check
    exported the default plan and got three refusals): plan show names the engines whose rules
    its knobs keep to, the knob each other one refuses, and how to plan for one."""
    import dataclasses

    from planner.report.summary import summary

    plan = load_plan(small_plan)  # (ZeRO-2: plan run has no ZeRO-1)
    zb = dataclasses.replace(plan, parallel={**plan.parallel, "pp": 2, "schedule": "zb-h1",
                                             "zero": 2, "offload_optimizer": False,
                                             "sequence_parallel": False})
    text = " ".join(summary(zb).split())
    assert "its knobs and dtype keep to the rules of torch (plan run), not megatron (schedule), " \
        "torchtitan (schedule), deepspeed (schedule) (an export checks the model's own); " \
        "`plan solve --target NAME`" in text
    # fp8: not what plan run trains in (a new-user check: the line named torch (plan run))
    fp8 = dataclasses.replace(zb, training={**zb.training, "dtype": "fp8"})
    assert "not megatron (schedule), torchtitan (schedule), deepspeed (schedule), torch " \
        "(training.dtype)" in " ".join(summary(fp8).split())
    # nothing to say where every engine runs it, or where the plan was made for one
    ddp = dataclasses.replace(plan, parallel={**plan.parallel, "pp": 1, "schedule": "1f1b",
                                              "zero": 0, "tp": 1, "offload_optimizer": False})
    assert "engines:" not in summary(ddp)
    mega = dataclasses.replace(zb, search={**zb.search, "target": "megatron"})
    assert "engines:" not in summary(mega)


def test_the_engines_line_keeps_megatrons_placement_rule():
    """Pipeline neighbours on adjacent ranks (tp-pp-dp) with a pipeline: Megatron-Core asserts
    that the experts' data parallelism equals the attention's, so a dense model with cp > 1 is
    refused there (a new-user check: the engines line named megatron, its export fell back to
    tp-dp-pp); a model with experts at ep x etp = tp x cp is not."""
    from planner import targets

    par = dict(dp=2, tp=2, pp=2, cp=2, ep=1, etp=1, placement="tp-pp-dp", zero=1,
               micro_batch=1, schedule="1f1b", recompute="full", vpp=1,
               sequence_parallel=True, cp_comm="p2p")
    assert targets.refusal(par, "bf16", "megatron").startswith(
        "fix.placement: placement tp-pp-dp with a pipeline needs cp = 1 in Megatron-Core")
    assert targets.refusal({**par, "placement": "tp-dp-pp"}, "bf16", "megatron") is None
    assert targets.refusal({**par, "cp": 1}, "bf16", "megatron") is None
    moe = {**par, "ep": 4}
    assert targets.refusal(moe, "bf16", "megatron", experts=True) is None
    assert "(ep x etp = tp x cp)" in targets.refusal({**moe, "ep": 2}, "bf16", "megatron",
                                                     experts=True)


def test_seconds_read_without_exponents():
    """A step of a thousand seconds and more reads whole (a what-if row read '1.23e+03 s')."""
    from planner.units import seconds
    assert [seconds(1234.5, 3), seconds(12.345, 3), seconds(0.00959, 3), seconds(98765.4)] == [
        "1,234 s", "12.3 s", "0.00959 s", "98,765 s"]


def test_plan_show_says_what_each_context_parallel_form_exchanges():
    """Ulysses exchanges heads (q, k, v and the output) by all-to-all, not K/V alone (a new-user
    check read 'K/V by a2a')."""
    import os

    from planner.planfile.document import load_plan
    from planner.report.summary import summary

    here = os.path.dirname(os.path.dirname(__file__))
    plan = load_plan(os.path.join(here, "export", "data", "plans",
                                  "llama3-8b-cp8-a2a-deepspeed.json"))
    assert "cp=8 (heads by all-to-all of q, k, v and output)" in summary(plan)
    ring = dataclasses.replace(plan, parallel={**plan.parallel, "cp_comm": "p2p"})
    assert "cp=8 (K/V by p2p ring)" in summary(ring)


def test_a_part_moved_by_the_stage_split_says_so():
    """A pin that changes no knob of a part can still move the split, and with it the slowest
    stage's compute: the reason is named (a new-user check read 'compute +2.21 s' with none)."""
    import os

    from planner.planfile.document import load_plan
    from planner.report import compare

    here = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    a = load_plan(os.path.join(here, "golden", "plans", "uneven-llama3-8b.json"))
    assert compare.split_note(a, a) == ""
    stages = [dict(st) for st in a.stages]
    stages[1] = {**stages[1], "blocks": stages[1]["blocks"] + stages[2]["blocks"][:1]}
    stages[2] = {**stages[2], "blocks": stages[2]["blocks"][1:],
                 "predicted": {**stages[2]["predicted"], "time_per_microbatch_s": 0.01}}
    b = dataclasses.replace(a, stages=stages, predicted={
        **a.predicted, "breakdown": {**a.predicted["breakdown"],
                                     "compute_s": 1.1 * a.predicted["breakdown"]["compute_s"]}})
    note = "the stage split moved (the slowest, stage 1: 9 -> 10 blocks)"
    assert compare.split_note(a, b) == note
    (change,) = [c for c in compare.part_changes(a, b) if c.part == "compute_s"]
    assert change.because == note


def test_an_moe_plan_says_how_far_its_step_time_can_be_trusted(small_plan):
    """The MoE runs' held-out error is stated under the step time of a plan with routed experts,
    and only there."""
    from planner.report.summary import breakdown

    plan = load_plan("tests/planner/export/data/plans/mixtral-8x7b-ep4-etp2-megatron.json")
    waits = {**plan.predicted, "moe_host_wait_s": 0.1 * plan.predicted["step_time_s"]}
    waits = dataclasses.replace(plan, predicted=waits)
    none = dataclasses.replace(plan, predicted={k: v for k, v in plan.predicted.items()
                                                if k != "moe_host_wait_s"})
    moe = " ".join("\n".join(breakdown(waits)).split())
    assert "accuracy: step times of mixtures of experts" in moe and "median error" in moe
    # (and, where its layers wait for the host, that precision and GPU what-ifs understate the
    # gain; a new-user check read it as a general claim under every MoE plan)
    caveat = "where MoE layers wait for the host, as here, a faster precision or GPU gains less"
    assert caveat in moe
    alone = " ".join("\n".join(breakdown(none)).split())
    assert "accuracy: step times of mixtures of experts" in alone and caveat not in alone
    assert "accuracy:" not in "\n".join(breakdown(load_plan(small_plan)))


def test_a_plan_no_exported_engine_runs_names_the_best_within_megatrons_rules(
        tiny_llama_config, monkeypatch):
    """A new-user check's first MoE plan (ZeRO-3 with a pipeline, moe_act) was refused by every
    export, with no word of what a runnable plan costs."""
    from planner import targets
    from planner.report.summary import summary

    kw = dict(cluster=SMALL, global_batch=32, seq_len=128)
    runnable = planner.plan(tiny_llama_config, **kw)
    assert targets.refusal(runnable.parallel, "bf16", "megatron") is None
    assert "nearest_engine" not in runnable.search  # an exported engine runs it: no search
    real = targets.refusal
    monkeypatch.setattr(targets, "refusal", lambda parallel, dtype, target, forms=(), **kw:
                        "fix.zero: refused" if target in targets.EXPORTED
                        else real(parallel, dtype, target, forms, **kw))
    p = planner.plan(tiny_llama_config, **kw)
    near = p.search["nearest_engine"]
    megatron = planner.plan(tiny_llama_config, target="megatron", **kw)
    assert near["target"] == "megatron" and near["parallel"] == megatron.parallel_summary
    assert near["step_time_s"] == pytest.approx(megatron.step_time_s, rel=1e-6)
    assert "within megatron's rules the search's best is " + megatron.parallel_summary in \
        " ".join(summary(p).split())


def test_the_engines_line_keeps_to_the_exchanges_an_engine_runs_over_the_models_attention(
        tmp_path):
    """A new-user check's gpt-oss plan at 64k tokens (cp over a p2p ring) said Megatron-LM and
    plan run kept to its rules; both refuse a ring over sliding windows and sinks."""
    import json

    from planner import targets
    from planner.report.summary import summary

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_GPT_OSS))
    p = planner.plan(str(config), cluster="dgx-h100", global_batch=8, seq_len=128,
                     fix="cp=2,cp_comm=p2p,dp=4,tp=1,pp=1")
    assert p.model["attention_forms"] == ["sinks", "sliding_window"]
    why = targets.refusal(p.parallel, "bf16", "megatron", p.model["attention_forms"])
    assert why == ("fix.cp_comm: megatron does not run the p2p exchange over attention with "
                   "sinks; it offers a2a there")
    assert targets.refusal(p.parallel, "bf16", "megatron") is None  # the knobs alone: runs
    text = " ".join(summary(p).split())
    assert "keep to the rules of no engine, not megatron (cp_comm)" in text, text
    # the pins break Megatron-LM's rules themselves: no search within them
    assert "nearest_engine" not in p.search
    # cp pinned, the exchange left to the search: Megatron-LM's best exchanges by all-to-all
    free = planner.plan(str(config), cluster="dgx-h100", global_batch=8, seq_len=128, fix="cp=2")
    assert free.parallel["cp_comm"] == "p2p", free.parallel_summary  # (the cost model's best)
    near = free.search["nearest_engine"]
    assert near["target"] == "megatron" and "cp=2(a2a)" in near["parallel"], near
    # cp=4 pinned: the 2 key-value heads leave Megatron-LM no exchange over sinks at cp=4 (a2a
    # splits heads): the pins break its rules, not its memory; no search within them
    four = planner.plan(str(config), cluster="dgx-h100", global_batch=8, seq_len=128, fix="cp=4")
    assert "nearest_engine" not in four.search, four.search.get("nearest_engine")
    unpinned = planner.plan(str(config), cluster="dgx-h100", global_batch=8, seq_len=128)
    assert "attention_forms" in unpinned.model
    assert planner.plan("gpt2", cluster="dgx-h100", global_batch=8).model.get(
        "attention_forms") is None


def test_a_small_rate_ratio_keeps_its_digits():
    """Plans of very different models compare at a tiny ratio: three significant digits, not
    '0.00x' nor 1e-05x (a new-user check diffed Qwen3-30B at 4k tokens against Llama 3 8B at
    128k)."""
    assert compare._ratio(0.00087) == "0.000870" and compare._ratio(0.0912) == "0.0912"
    assert compare._ratio(0.3) == "0.30" and compare._ratio(6.734) == "6.73"
    assert compare._ratio(1.234e-5) == "0.0000123"


def test_a_refusal_of_the_plans_own_pin_that_the_why_pins_cause_is_named_as_why():
    """--why etp=2 on a plan made with --fix ep=16: the product ep x etp is refused; named as
    --why's, with the plan's ep kept (a new-user check read 'fix.ep', which nobody gave)."""
    from planner.explore.whynot import _as_why  # noqa: PLC0415
    message = ("fix.ep: ep x etp = 32 does not divide the cluster's 16 GPUs; use one of 1, 2, 4, "
               "8")
    said = _as_why(message, {"etp": 2}, {"ep": 16})
    assert said.startswith("why: ep x etp = 32 does not divide the cluster's 16 GPUs") and \
        said.endswith("(with the plan's own ep=16 kept; give ep in --why too to change it)"), said
    assert _as_why(message, {"ep": 32}, {"ep": 16}).startswith("why.ep: ep x etp = 32")
    other = "fix.pp: 3 does not divide the cluster's 16 GPUs"  # names no --why pin: as it was
    assert _as_why(other, {"etp": 2}, {"pp": 3}) == other


def test_diff_says_what_the_search_was_asked_for(tiny_llama_config):
    """A new-user check diffed a plan over two sites with the one --across-sites replicas forced
    and read '3.06x slower' with nothing saying why B was chosen so."""
    from planner.report.diff import diff

    a = planner.plan(tiny_llama_config, cluster=SMALL, global_batch=32, seq_len=128, top_k=0)
    b = dataclasses.replace(a, search={**a.search, "options": {
        **a.search["options"], "across_sites": "replicas", "layout": "Et*2|t*2L"}})
    text = diff(a, b)
    assert re.search(r"search across sites +- +replicas", text)
    assert re.search(r"search layout +- +Et\*2\|t\*2L", text)
    assert "search across sites" not in diff(a, a)


def test_a_split_that_moved_elsewhere_than_the_slowest_stage_is_named_where():
    """A new-user check read 'the stage split moved (the slowest, stage 3: 2 -> 2 blocks)'."""
    from types import SimpleNamespace as P

    from planner.report.compare import split_note

    def plan(*blocks, slow=0):
        return P(stages=[{"blocks": list(b), "predicted": {"time_per_microbatch_s":
                                                           2.0 if i == slow else 1.0}}
                         for i, b in enumerate(blocks)])

    a = plan("ab", "cd", "e", slow=1)
    b = plan("a", "cd", "be", slow=1)
    assert split_note(a, b) == ("the stage split moved (stage 0: 2 -> 1 blocks; the slowest, "
                                "stage 1, has 2 either way)")
    assert split_note(a, plan("ab", "cd", "f", slow=1)) == (
        "the stage split moved (stage 2 holds other blocks; the slowest, stage 1, has 2 either "
        "way)")
    assert split_note(a, plan("a", "bcd", "e", slow=1)) == (
        "the stage split moved (the slowest, stage 1: 2 -> 3 blocks)")


def test_why_says_when_the_pinned_plan_leaves_an_engines_rules(small_plan):
    """A new-user check asked `--why cp=2` of a gpt-oss plan made with --target any and was
    offered the ring exchange over attention sinks, which Megatron-LM does not run: the answer
    now says which engines' rules the pinned plan leaves."""
    import dataclasses

    from planner.report.summary import engine_fit
    from planner.report.why import _engines_lost

    a = load_plan(small_plan)
    assert a.search.get("target", "any") == "any" and "megatron" in engine_fit(a)[0]
    assert _engines_lost(a, a) == []
    sinks = dataclasses.replace(a, model={**a.model, "attention_forms": ["sinks"]},
                                parallel={**a.parallel, "cp": 2, "cp_comm": "p2p"})
    runs, refused = engine_fit(sinks)
    assert "megatron" not in runs and any(r.startswith("megatron (") for r in refused)
    said = " ".join(line.strip() for line in _engines_lost(a, sinks))
    assert said.startswith("engines: unlike the plan, it keeps to") and "megatron (" in said
