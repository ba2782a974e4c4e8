"""Shared fixtures: tiny Hugging Face configs and traced models (traced once per session)."""

import json
import logging
import os

import pytest


@pytest.fixture(autouse=True)
def _planner_logging():
    """Undo what a test running the CLI does to the ``planner`` logger (its own handler, no
    propagation), so that later tests see the planner's log records."""
    log = logging.getLogger("planner")
    saved = (log.handlers[:], log.propagate, log.level)
    yield
    log.handlers[:], log.propagate, log.level = saved[0], saved[1], saved[2]


@pytest.fixture(autouse=True, scope="session")
def _trace_cache(tmp_path_factory):
    """The trace cache of the tests' own (tests never touch the user's ~/.cache)."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))

TINY_GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 4,
             "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128,
             "bos_token_id": 0, "eos_token_id": 0}
FP32_LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
              "intermediate_size": 172, "num_attention_heads": 4, "num_key_value_heads": 4,
              "vocab_size": 512, "max_position_embeddings": 64}
"""Two small layers in fp32 at sequence 32: plans on the calibrated `cpu` preset."""
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 176,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 20000,
              "max_position_embeddings": 256, "tie_word_embeddings": False}


TINY_MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 4, "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
                "vocab_size": 256, "max_position_embeddings": 512, "num_local_experts": 8,
                "num_experts_per_tok": 2}
"""A Mixtral of 4 layers, 8 routed experts of which 2 per token (a copy for other sizes:
{**TINY_MIXTRAL, "num_hidden_layers": 3})."""


TINY_GPT_OSS = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
                "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
                "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 20000,
                "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 2,
                "max_position_embeddings": 256, "tie_word_embeddings": False}
"""A gpt-oss of 4 layers: attention sinks, a sliding window on every other layer, 2 key-value
heads, routed experts with biases."""


TINY_DEEPSEEK_V3 = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 64,
                    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "v_head_dim": 16, "first_k_dense_replace": 1, "intermediate_size": 128,
                    "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "vocab_size": 256,
                    "max_position_embeddings": 256}


@pytest.fixture
def tiny_deepseek_v3():
    """A DeepSeek-V3 of 4 layers (the first dense) with latent attention, 8 routed experts of
    which 2 per token, 1 shared; a copy, for a test to change."""
    return dict(TINY_DEEPSEEK_V3)


@pytest.fixture
def tiny_deepseek_v3_prepared(tmp_path, tiny_deepseek_v3):
    """TINY_DEEPSEEK_V3 traced at 64 tokens (not cached), with its config."""
    import planner  # noqa: PLC0415  (the planner's import, for the tests that trace)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_deepseek_v3))
    return planner.prepare(str(path), seq_len=64, cache_dir=None), tiny_deepseek_v3


def write_config(path, cfg: dict) -> str:
    path.mkdir(parents=True, exist_ok=True)
    file = path / "config.json"
    file.write_text(json.dumps(cfg))
    return str(file)


@pytest.fixture(scope="session")
def tiny_gpt2_config(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tiny-gpt2"), TINY_GPT2)


@pytest.fixture(scope="session")
def tiny_llama_config(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tiny-llama"), TINY_LLAMA)


@pytest.fixture(scope="session")
def tiny_gpt2(tiny_gpt2_config):
    from planner.api import prepare

    return prepare(tiny_gpt2_config, seq_len=128)


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_config):
    from planner.api import prepare

    return prepare(tiny_llama_config, seq_len=128)


@pytest.fixture(scope="session")
def branched():
    from planner.api import prepare

    return prepare("examples/branched.py:build")


@pytest.fixture(scope="session")
def fp32_llama(tmp_path_factory):
    from planner.api import prepare

    return prepare(write_config(tmp_path_factory.mktemp("fp32-llama"), FP32_LLAMA), seq_len=32,
                   dtype="fp32")
