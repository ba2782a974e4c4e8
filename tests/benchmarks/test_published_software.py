"""The software each published run is priced with (benchmarks/published.py software(),
benchmarks/moe_runs.py release_settings()): read from the source a row names, never guessed."""

import os
import sys

import pytest

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
    assert settings["DeepSeekV3 (dropless)", "H100"] == \
        ",moe_overlap=true,overlap_grad_reduce=false"  # 25.09's run_script
    assert settings["Qwen3_235B_a22B", "H100"] == ",moe_overlap=true"  # 25.11's configs
    assert settings["Qwen3_235B_a22B (tokendrop)", "H100"] == ""  # 25.09 drops tokens
    # DeepSeek-V3's shared expert beside the dispatch wherever the all-to-all overlap is off
    assert settings["DeepSeekV3 (w/o MTP)", "GB200"] == ",moe_shared_overlap=true"
    assert settings["GPT OSS 120B", "GB200"] == ""  # no shared expert
    with pytest.raises(ValueError, match="names no release"):
        moe_runs.release_settings({**rows[0], "source": "a table of 2027"})


def test_rows_outside_the_reference_data_are_numbered_apart_and_never_fitted():
    more = moe_runs.load_rows(moe_runs.MORE, moe_runs.MORE_INDEX)
    assert more and min(r["index"] for r in more) == moe_runs.MORE_INDEX
    assert all("tokendrop" in r["variant"] for r in more)  # the 25.09 token-drop runs
    assert {moe_runs.release_settings(r) for r in more if "DeepSeek" not in r["model"]} == {""}
    assert {moe_runs.release_settings(r) for r in more if "DeepSeek" in r["model"]} == \
        {",moe_shared_overlap=true"}  # GB200 / B200: no all-to-all overlap
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
