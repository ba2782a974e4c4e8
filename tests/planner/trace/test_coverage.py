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


@pytest.mark.parametrize("config,said", [
    ({"model_type": "wav2vec2", "architectures": ["Wav2Vec2ForCTC"], "hidden_size": 32,
      "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
      "conv_dim": [32, 32], "conv_stride": [5, 2], "conv_kernel": [10, 3], "vocab_size": 32,
      "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2},
     r"wav2vec2 takes raw audio \(input_values\)"),
    ({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
      "image_token_index": 31,
      "text_config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 64},
      "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32,
                        "intermediate_size": 64, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "image_size": 32, "patch_size": 8}},
     "llava takes images placed among its text tokens")])
def test_configs_whose_inputs_are_not_token_ids_are_refused_with_the_way(config, said, tmp_path):
    """A new-user check: wav2vec2's and LLaVA's configs failed deep in their forward ('NoneType'
    object is not subscriptable) with advice that did not apply: the planner builds token ids,
    images and log-mel frames, not raw audio nor images placed among the text."""
    import json

    import planner
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(planner.SpecError, match=said + r".*give it as file.py:factory"):
        planner.prepare(str(path), cache_dir=None)
