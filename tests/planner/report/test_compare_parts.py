"""Every part of the step has the knobs behind it (planner.report.compare.PART_KNOBS)."""

import pytest

from planner.planfile.breakdown import BREAKDOWN_WORDS
from planner.report.compare import COMPARED, PART_KNOBS


def test_every_part_of_the_step_names_known_knobs():
    assert set(PART_KNOBS) == set(BREAKDOWN_WORDS)
    assert all(k in COMPARED for knobs in PART_KNOBS.values() for k in knobs)


def test_recommendation_plans_compare_by_their_tables_and_parts():
    """Two DLRM plans that differ in one table's sharding: the headline and the diff name the
    table, the embedding parts of the step are compared, and the rate is samples/s."""
    import dataclasses
    import os

    from planner.planfile.document import load_plan
    from planner.report import compare
    from planner.report.diff import diff

    here = os.path.dirname(os.path.abspath(__file__))
    a = load_plan(os.path.join(here, "..", "..", "golden", "plans", "dlrm-criteo-1tb.json"))
    tables = [dict(t) for t in a.embeddings["tables"]]
    tables[0]["sharding_type"] = "row_wise"
    breakdown = {**a.predicted["breakdown"],
                 "embedding_comm_s": 2 * a.predicted["breakdown"]["embedding_comm_s"]}
    b = dataclasses.replace(a, embeddings={**a.embeddings, "tables": tables},
                            predicted={**a.predicted, "breakdown": breakdown,
                                       "step_time_s": 1.1 * a.predicted["step_time_s"]})
    name, old = a.embeddings["tables"][0]["name"], a.embeddings["tables"][0]["sharding_type"]
    assert f"table {name} {old} -> row_wise" in compare.headline(a, b)  # the pooling is the same
    tables[0]["pooling"] = 3.0
    c = dataclasses.replace(b, embeddings={**a.embeddings, "tables": tables})
    assert f"table {name} {old}, pooling 1 -> row_wise, pooling 3" in compare.headline(a, c)
    text = diff(a, b)
    assert "embedding tables" in text and "embedding all-to-all" in text
    # plans without files are named by their model and configuration (not 'A = A')
    assert text.startswith(f"A = {a.model['name']}: {a.parallel_summary}\n")
    # parts neither plan has (no pipeline: no bubble) are left out
    assert "pipeline bubble" not in text and "tensor-parallel all-reduce" not in text
    assert "samples/s" in text and "tokens/s" not in text


def test_plans_on_devices_of_one_name_with_other_figures_differ_in_the_diff():
    """Two calibrations of the same machine give devices of one name: the diff names their
    measured peak and memory rate (it listed the device under 'same in both')."""
    import copy
    import dataclasses
    import os

    from planner.planfile.document import load_plan
    from planner.report.compare import device_figure
    from planner.report.diff import diff

    here = os.path.dirname(os.path.abspath(__file__))
    golden = os.path.join(here, "..", "..", "golden", "plans")
    a = load_plan(os.path.join(golden, sorted(f for f in os.listdir(golden)
                                                if f.endswith(".json") and "dlrm" not in f)[0]))
    spec = copy.deepcopy(a.cluster.get("spec") or {})
    device = spec.get("device") or a.cluster["device"]
    assert device is not None and device_figure(a, "hbm_GBps") > 0
    from costmodels.hardware import device_mapping, get_device
    mapping = device if isinstance(device, dict) else device_mapping(get_device(device))
    measured = {**mapping, "hbm_GBps": mapping["hbm_GBps"] / 2}
    b = dataclasses.replace(a, cluster={**a.cluster, "spec": {**spec, "device": measured}})
    text = diff(a, b)
    assert "device memory GB/s" in text and "-50.0%" in text
    same = text.split("same in both:", 1)[1]
    assert "device peak TFLOP/s" in " ".join(same.split()) and text.count("device peak") == 1


def test_the_memory_kinds_named_add_up_to_the_peaks_change():
    """A new-user check read '73.1 GB -> 69 GB (activations -12.9 GB, optimizer +4.32 GB)': the
    kinds below the share shown (weights +1.5, grads +3) are summed as other kinds."""
    from types import SimpleNamespace

    from planner.report.compare import memory_change

    def plan(**kinds):
        total = sum(kinds.values())
        return SimpleNamespace(predicted={"peak_memory_bytes": total}, stages=[
            {"predicted": {"memory_bytes": {**kinds, "total": total}}}])

    a = plan(weights=10e9, grads=20e9, optimizer=13.1e9, activations=30e9)
    b = plan(weights=11.5e9, grads=23e9, optimizer=17.42e9, activations=17.1e9)
    pa, pb, moved = memory_change(a, b)
    assert dict(moved) == pytest.approx({"activations": -12.9e9, "optimizer": 4.32e9,
                                         "other kinds": 4.5e9})
    assert sum(d for _, d in moved) == pytest.approx(pb - pa)
    small = plan(weights=10e9, grads=20e9, optimizer=13.1e9, activations=31e9)
    assert [k for k, _ in memory_change(a, small)[2]] == []  # nothing moved by 5% or more
    # a second new-user check read '74.5 GB -> 62.1 GB (activations -15.4, grads +13.3, weights
    # -8.49)': the 1.8 GB of working buffers (2.4% of the peak) went unsaid
    a = plan(weights=20e9, grads=10e9, activations=40e9, working=4.5e9)
    b = plan(weights=11.51e9, grads=23.3e9, activations=24.6e9, working=2.7e9)
    moved = memory_change(a, b)[2]
    assert dict(moved)["other kinds"] == pytest.approx(-1.8e9)
    assert sum(d for _, d in moved) == pytest.approx(b.predicted["peak_memory_bytes"]
                                                    - a.predicted["peak_memory_bytes"])


def test_stage_block_lists_keep_whole_names():
    """Runs of numbered blocks compress; a long list keeps its layer stacks whole with a count
    of the other groups (a new-user check saw T5's first stage cut to 'encoder.block...', and
    then BART's 24 layers hidden in '+3 more'), else its first and last groups."""
    from planner.report.text import compress_names
    assert compress_names(["h.0", "h.1", "h.2", "ln_f..lm_head"]) == "h.0-2, ln_f..lm_head"
    t5 = ["decoder.embed_tokens..encoder.embed_tokens", "encoder.block.0", "encoder.block.1",
          "encoder.final_layer_norm", "decoder.block.0", "decoder.block.1"]
    assert compress_names(t5) == "encoder.block.0-1, decoder.block.0-1, +2 more"
    many = [f"tower{i}.head" for i in range(30)]  # no stacks: the first and last groups
    assert compress_names(many) == "tower0.head, +28 more, tower29.head"


def test_recommendation_plans_differ_in_their_tables_optimizer_and_pipeline():
    """A new user's two plans (SGD and the sparse-dist pipeline against Adam and none) read
    'same configuration' in plan diff."""
    import copy

    from planner.planfile.document import load_plan
    from planner.report.compare import compare, headline

    a = load_plan("tests/golden/plans/dlrm-criteo-1tb.json")
    b = copy.deepcopy(a)
    b.embeddings.update(table_optimizer="adam", pipeline="none")
    assert "table optimizer sgd -> adam, pipeline sparse-dist -> none" in headline(a, b)
    rows = {(d.section, d.label): (d.a, d.b) for d in compare(a, b)}
    assert rows["configuration", "table optimizer"] == ("sgd", "adam")
    assert rows["configuration", "pipeline"] == ("sparse-dist", "none")
    assert "same configuration" in headline(a, copy.deepcopy(a))
