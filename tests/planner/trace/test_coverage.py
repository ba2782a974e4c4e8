"""The corpus of Hugging Face architectures (benchmarks/hf_coverage.py): each traces, and the FLOPs of a
training step it is planned with are those FlopCounterMode counts on a real forward and backward of
the same model on the CPU, within 2%."""

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "benchmarks", "hf_coverage.py")
spec = importlib.util.spec_from_file_location("hf_coverage", SCRIPT)
coverage = importlib.util.module_from_spec(spec)
sys.modules["hf_coverage"] = coverage  # dataclasses look their module up there
spec.loader.exec_module(coverage)


def test_the_corpus_is_at_least_thirty_architectures_of_every_family():
    types = {c["model_type"] for c in coverage.CORPUS.values()}
    assert len(types) >= 30
    assert {"t5", "bart", "whisper"} <= types  # encoder-decoder
    assert {"vit", "swin", "convnext", "clip", "siglip"} <= types  # vision, dual towers
    assert {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"} <= types  # mixtures of experts


@pytest.mark.parametrize("name", sorted(coverage.CORPUS))
def test_traced_flops_match_a_real_forward_and_backward(name):
    row = coverage.check(name)
    assert not row.error, row.error
    assert row.measured > 0 and abs(row.deviation) < 0.02, (
        f"{name}: planned {row.planned:.4g} FLOPs, measured {row.measured:.4g}")


@pytest.mark.parametrize("name", ["whisper", "vit", "convnext"])
def test_speech_and_image_models_trace_in_bf16(name, tmp_path):
    """Their made-up features and pixels come in the weights' dtype (a new-user check: Whisper's
    first convolution refused fp32 features under bf16 weights)."""
    import json

    import planner
    config = tmp_path / "config.json"
    config.write_text(json.dumps(coverage.CORPUS[name]))
    prepared = planner.prepare(str(config), dtype="bf16", cache_dir=None)
    assert prepared.info["num_params"] > 0
