"""The software each published run is priced with (benchmarks/published.py software(),
benchmarks/moe_runs.py release_settings(), layout_of()): read from the source a row names, never
guessed."""

import os
import sys

import pytest

from planner.options import parse_layout

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks")
sys.path.insert(0, BENCH)

import moe_runs  # noqa: E402
from published import read_rows, software  # noqa: E402


def test_sources_name_the_attention_kernel_and_gradient_layout():
    assert software("NeMo performance_summary.md, NeMo24.07, DGX-H100") == ",attention=flash2"
    assert software("... container NeMo24.03.01") == ",attention=flash2"
    assert software("... container NeMo25.04.rc2") == ""  # cuDNN's attention again
    assert software("Megatron-Bridge performance-summary.md, 25.11, DGX-B200") == \
        ",state_layout=megatron-bf16-grads"
    rows = read_rows(os.path.join(BENCH, "data", "long_context_runs.csv"))
    assert {r["gpu"]: software(r["source"]) for r in rows} == {
        "H100 (DGX)": ",attention=flash2", "B200 (DGX)": ""}


def test_moe_rows_take_their_release_configuration():
    rows = moe_runs.load_rows()
    settings = {(r["model"], r["gpu"]): moe_runs.release_settings(r) for r in rows}
    a2a = ",moe_dispatcher=alltoall"  # every 25.09 and 25.11 row
    assert settings["DeepSeekV3 (dropless)", "H100"] == \
        a2a + ",moe_overlap=true,overlap_grad_reduce=false"  # 25.09's run_script
    assert settings["Qwen3_235B_a22B", "H100"] == a2a + ",moe_overlap=true"  # 25.11's configs
    # 25.09 drops tokens and pipelines Qwen3's tp collectives; 25.11 does not on H100
    assert settings["Qwen3_235B_a22B (tokendrop)", "H100"] == a2a + ",tp_overlap=true"
    # DeepSeek-V3's shared expert beside the dispatch wherever the all-to-all overlap is off
    assert settings["DeepSeekV3 (w/o MTP)", "GB200"] == a2a + ",moe_shared_overlap=true"
    assert settings["GPT OSS 120B", "GB200"] == a2a  # no shared expert
    with pytest.raises(ValueError, match="names no release"):
        moe_runs.release_settings({**rows[0], "source": "a table of 2027"})


def test_rows_outside_the_reference_data_are_numbered_apart_and_never_fitted():
    more = moe_runs.load_rows(moe_runs.MORE, moe_runs.MORE_INDEX)
    assert more and min(r["index"] for r in more) == moe_runs.MORE_INDEX
    assert all("tokendrop" in r["variant"] for r in more)  # the 25.09 token-drop runs
    a2a = ",moe_dispatcher=alltoall"
    assert {moe_runs.release_settings(r) for r in more if "DeepSeek" not in r["model"]
            and int(r["tp"]) == 1} == {a2a}
    assert {moe_runs.release_settings(r) for r in more if int(r["tp"]) > 1} == \
        {a2a + ",tp_overlap=true"}  # Qwen3-235B at tp 2
    assert {moe_runs.release_settings(r) for r in more if "DeepSeek" in r["model"]} == \
        {a2a + ",moe_shared_overlap=true"}  # GB200 / B200: no all-to-all overlap
    rows = moe_runs.load_rows()
    for mode in ("split", "all"):
        fitted = moe_runs.fit_rows(rows + more, mode)
        assert fitted and all(r["index"] < moe_runs.MORE_INDEX for r in fitted)
    # near twins (same model, GPU, layout, micro-batch) on one side: DeepSeek-V3 on GB300 in
    # BF16 and FP8, Qwen3 on H100 in 25.11 and 25.09 (token drop)
    half = {r["index"] for r in moe_runs.fit_rows(rows + more, "split")}
    assert {0, 1} <= half and {15, 18} <= half and not {16, 19} & half
    assert len(half) in (len(rows) // 2, len(rows) // 2 + 1)
    assert moe_runs.fit_rows(rows + more, "none") == []
    for r in more:  # every row's published layout holds together: ep within tp x dp
        pp, ep = int(r["pp"]), int(r["ep"])
        assert (int(r["gpus"]) // pp) % ep == 0, r["index"]


def test_newer_releases_take_their_configuration_and_are_never_fitted():
    newer = moe_runs.load_rows(moe_runs.NEWER, moe_runs.NEWER_INDEX)
    assert newer and min(r["index"] for r in newer) == moe_runs.NEWER_INDEX
    by = {(moe_runs._release(r), r["model"], r["gpu"]): r for r in newer}
    assert {release for release, _, _ in by} == {"26.04.01", "26.06", "26.08"}
    # 26.08: every row one full-iteration CUDA graph, HybridEP, the all-to-all overlapped
    for (release, model, gpu), r in by.items():
        graph = moe_runs.host_op_s(r, 50e-6) == 0.0
        assert graph == (release == "26.08" or (release, model, gpu) ==
                         ("26.06", "Qwen3_30B_a3B", "B300")), (release, model, gpu)
    assert moe_runs.release_settings(by["26.08", "Qwen3_30B_a3B", "GB200"]) == \
        ",moe_dispatcher=deepep,moe_overlap=true"
    # 26.04.01: Qwen3-235B on B200 and H100 still on the alltoall dispatcher, H100 overlapped;
    # DeepSeek-V3 on the flex dispatcher, so no shared-expert overlap (Megatron-Bridge clears it)
    assert moe_runs.release_settings(by["26.04.01", "Qwen3_235B_a22B", "B200"]) == \
        ",moe_dispatcher=alltoall"
    assert moe_runs.release_settings(by["26.04.01", "Qwen3_235B_a22B", "H100"]) == \
        ",moe_dispatcher=alltoall,moe_overlap=true"
    assert moe_runs.release_settings(by["26.04.01", "DeepSeekV3", "GB200"]) == \
        ",moe_dispatcher=deepep"
    assert "recompute=mla_up_proj" in moe_runs.published_fix(by["26.08", "DeepSeekV3", "GB200"])
    assert "recompute=moe_act" in moe_runs.published_fix(by["26.04.01", "GPT OSS 120B", "H100"])
    rows = moe_runs.load_rows()
    for mode in ("split", "all"):
        assert all(r["index"] < moe_runs.MORE_INDEX for r in moe_runs.fit_rows(rows + newer, mode))
    for r in newer:  # every published layout holds together: ep within the GPUs of a stage
        assert (int(r["gpus"]) // int(r["pp"])) % int(r["ep"]) == 0, r["index"]


def test_the_reports_runs_take_its_appendix_settings_and_are_never_fitted():
    """arXiv 2603.07685's Table 11, configured by its Table 20 and Appendix B.2."""
    report = moe_runs.load_rows(moe_runs.REPORT, moe_runs.REPORT_INDEX)
    assert len(report) == 9 and min(r["index"] for r in report) == moe_runs.REPORT_INDEX
    by = {(r["model"], r["gpu"], r["precision"], r["seq_len"]): r for r in report}
    assert {moe_runs._release(r) for r in report} == {moe_runs.REPORT_RELEASE}
    dsv3 = ("DeepSeekV3", "GB300", "MXFP8", "4096")
    # HybridEP (or DeepEP on H100) everywhere; the 1F1B overlap where B.2 turns it on
    assert moe_runs.release_settings(by[dsv3]) == ",moe_dispatcher=deepep,moe_overlap=true"
    assert moe_runs.release_settings(by["DeepSeekV3", "GB200", "MXFP8", "4096"]) == \
        ",moe_dispatcher=deepep"
    assert moe_runs.release_settings(by["Qwen3_235B_a22B", "GB300", "MXFP8", "4096"]) == \
        ",moe_dispatcher=deepep"
    assert moe_runs.release_settings(by["Qwen3_235B_a22B", "H100", "BF16", "4096"]) == \
        ",moe_dispatcher=deepep,moe_overlap=true"
    # partial CUDA graphs only: the fitted host time; the MTP depth (the FLOPs per token the
    # report's TFLOP/s imply) on the recipe's 16-stage layout
    assert all(moe_runs.host_op_s(r, 50e-6) == 50e-6 for r in report)
    assert by[dsv3]["zoo"] == "deepseek-v3-mtp"
    assert moe_runs.layout_of(by[dsv3]) == "Et*4|(t*4|)*14tmL"
    assert moe_runs.layout_of(by["DeepSeekV3", "GB200", "BF16", "4096"]) is None  # pp 8 x vp 4
    h100 = by["DeepSeekV3", "H100", "FP8-BLK", "4096"]  # Table 17's pp 8, the MTP depth alone
    assert moe_runs.layout_of(h100) == "Et*3|(tt|)*29m|L" and "pp=8" in moe_runs.published_fix(h100)
    assert "recompute=mla_up_proj+moe_act" in moe_runs.published_fix(h100)
    fix = moe_runs.published_fix(by["DeepSeekV3", "GB200", "MXFP8", "4096"])
    assert "offload_optimizer=true" in fix and "recompute=none" in fix
    assert "offload_optimizer=false" in moe_runs.published_fix(by[dsv3])
    assert "recompute=moe_act" in moe_runs.published_fix(by["Qwen3_235B_a22B", "GB200", "BF16",
                                                            "4096"])
    long = by["Qwen3_235B_a22B", "GB300", "MXFP8", "131072"]
    assert "cp=4" in moe_runs.published_fix(long) and "tp=4" in moe_runs.published_fix(long)
    rows = moe_runs.load_rows()
    for mode in ("split", "all"):
        assert all(r["index"] < moe_runs.MORE_INDEX for r in moe_runs.fit_rows(rows + report, mode))
    for r in report:
        assert (int(r["gpus"]) // int(r["pp"])) % int(r["ep"]) == 0, r["index"]


def test_moe_rows_split_their_pipelines_as_their_recipes_do():
    """A review: GPT-OSS-120B on 4 H100 stages was priced on the search's balanced split; its
    recipe pins no layout and leaves the embedding and loss accounting off, so Megatron-Core
    splits its 36 layers 9 per stage with the 201k-word head on the last."""
    rows = {r["index"]: r for r in moe_runs.load_rows()}
    assert moe_runs.layout_of(rows[14]) == "Et*9|(t*9|)*2t*9L"  # GPT-OSS, pp 4
    assert moe_runs.layout_of(rows[5]) == "Et*4|(t*4|)*14tL"  # DeepSeek-V3 w/o MTP, pp 4 x vp 4
    assert moe_runs.layout_of(rows[10]) == "Et*4|(t*4|)*14tmL"  # with MTP, pp 16
    assert moe_runs.layout_of(rows[6]) is None  # pp 8 x vp 4: outside the recipe's map
    assert moe_runs.layout_of(rows[9]) == "Et*3|(t*4|)*22t*3L"  # Qwen3-235B: accounted
    for r in rows.values():
        pp, vp, layout = int(r["pp"] or 1), int(r["vp"] or 1), moe_runs.layout_of(r)
        if layout:  # every pinned layout makes the row's stages and places every layer
            stages = parse_layout(layout)
            assert len(stages) == pp * vp, r["index"]
            model = moe_runs._model_gpu(r)[0]
            assert sum(s.count("t") for s in stages) == moe_runs.LAYERS[model], r["index"]
    assert moe_runs.even_layout(36, 4) == "Et*9|(t*9|)*2t*9L"
    assert moe_runs.even_layout(48, 2) == "Et*24|t*24L"
    assert moe_runs.even_layout(61, 8) is None and moe_runs.even_layout(36, 1) is None
