"""Plans for the runtime tests, made by the planner itself on the `cpu` preset (fp32, SGD).

Each model is traced once per session; every plan pins its knobs with ``fix``.
"""

import json
import os

import pytest

import planner
from costmodels.sites import sites_from_mapping
from planner.options import parse_fix
from runtime_models import FINETUNE_SPEC, MASKED_SPEC, MULTITOWER_SPEC, SINKS_SPEC
from runtime_models import SPEC as BRANCHED_SPEC

GLOBAL_BATCH = 8
SEQ_LEN = 16


class PlanMaker:
    """make(model, fix, name) -> path of a saved plan; models: "llama" (tiny Llama from a Hugging
    Face config), "branched" (examples/branched.py's TwoTower, small), "gpt2" (tiny GPT-2,
    tied embeddings), "multitower" (examples/multitower.py, small: a wide DAG), "finetune"
    (examples/finetune.py's tiny: frozen weights, trained adapters), "mixtral" (tiny Mixtral:
    routed experts, grouped-query attention, rotary positions), "vit" (tiny ViT: pixel
    values), "t5" (tiny T5: an encoder-decoder), "whisper" (tiny Whisper: audio features
    and token ids), "masked" (token ids and a boolean mask) and "sinks" (attention with its
    head count in num_heads and a sink per head)."""

    def __init__(self, folder, specs: dict):
        self.folder = folder
        self.specs = specs
        self.prepared = {}

    def __call__(self, model: str, fix: str, name: str | None = None, *, nodes: int = 1,
                 global_batch: int = GLOBAL_BATCH, sites: int = 1) -> str:
        """``sites`` > 1: on that many sites of the ``cpu`` device, one site's plan on each,
        data parallel across them (the pinned dp counts every site's replicas)."""
        if model not in self.prepared:
            self.prepared[model] = planner.prepare(self.specs[model], seq_len=SEQ_LEN,
                                                   dtype="fp32")
        pinned = parse_fix(fix)
        gpus = pinned["dp"] * pinned.get("cp", 1) * pinned["tp"] * pinned["pp"] // nodes
        cluster = planner.load_cluster("cpu", nodes=nodes, gpus_per_node=gpus)
        if sites > 1:
            cluster = sites_from_mapping({"name": "cpu-sites", "default_link": {
                "bandwidth": "1Gbps", "latency": "1ms"}, "sites": [
                    {**{k: v for k, v in cluster.to_mapping().items() if k != "description"},
                     "name": f"site{i}", "gpus_per_node": gpus // sites}
                    for i in range(sites)]})
        training = planner.TrainingSpec(global_batch=global_batch,
                                        seq_len=self.prepared[model].opgraph.seq_len,
                                        dtype="fp32", optimizer="sgd")
        plan = planner.plan_prepared(self.prepared[model], cluster, training,
                                     planner.SearchOptions(fix=pinned, top_k=0, across_sites=(
                                         "replicas" if sites > 1 else "auto")))
        path = os.path.join(self.folder, f"{name or model + '-' + fix.replace(',', '-')}.json")
        plan.save(path)
        return path


TIED_GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 4,
             "n_embd": 32, "n_head": 4, "vocab_size": 512, "n_positions": 64, "resid_pdrop": 0.0,
             "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0}
"""GPT-2 ties lm_head to wte; no dropout, so one step is deterministic."""
TINY_MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 4, "hidden_size": 32,
                "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 256, "max_position_embeddings": 64, "num_local_experts": 4,
                "num_experts_per_tok": 2}
"""Four routed experts per layer (two per token), two key/value heads for four query heads; four
layers, so that the trace finds the repeated layers and a pipeline cuts between them."""
TINY_QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2,
              "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 256,
              "max_position_embeddings": 64, "tie_word_embeddings": False}
"""Qwen3's query and key norms (one RMSNorm over the head dimension, shared by the heads) sit
between the column- and row-parallel Linears of its attention."""
TINY_GPT_OSS = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
                "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 32,
                "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256,
                "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
                "max_position_embeddings": 64, "tie_word_embeddings": False}
"""gpt-oss's attention sinks (one learned logit per head) inside its split attention, a sliding
window on every other layer, routed experts with biases."""
TINY_VIT = {"model_type": "vit", "architectures": ["ViTForImageClassification"],
            "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
            "intermediate_size": 64, "image_size": 32, "patch_size": 8, "num_channels": 3,
            "num_labels": 10, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
"""An image model: pixel values in, 16 patches and a class token per sample (17 tokens, whatever
SEQ_LEN says), whose embeddings' glue reads the patch projection's dtype on every stage."""
TINY_T5 = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 32,
           "d_kv": 8, "d_ff": 64, "num_layers": 3, "num_decoder_layers": 3, "num_heads": 4,
           "vocab_size": 128, "decoder_start_token_id": 0, "pad_token_id": 0, "dropout_rate": 0.0}
"""An encoder-decoder: token ids for the encoder and the decoder (the second stage embeds its own,
sent down the pipeline), one embedding tied across the two stacks and the output layer, the
decoder's cross-attention reading the encoder's output; three layers a stack, so that the trace
finds them repeated and stages may cut inside a stack."""
TINY_WHISPER = {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
                "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
                "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_mel_bins": 8,
                "max_source_positions": 16, "max_target_positions": 32, "vocab_size": 128,
                "decoder_start_token_id": 1, "pad_token_id": 0, "dropout": 0.0,
                "attention_dropout": 0.0, "activation_dropout": 0.0, "init_std": 0.2}
"""A speech encoder-decoder: audio features (32 frames of 8 mel bins) for the encoder, token ids
for the decoder; its attention shapes keys and values by its own head count (num_heads)."""


@pytest.fixture(scope="session")
def make_plan(tmp_path_factory, tiny_llama_config):
    folder = tmp_path_factory.mktemp("runtime-plans")
    gpt2 = folder / "tied-gpt2.json"
    gpt2.write_text(json.dumps(TIED_GPT2))
    specs = {"llama": tiny_llama_config, "branched": BRANCHED_SPEC, "gpt2": str(gpt2),
             "multitower": MULTITOWER_SPEC, "finetune": FINETUNE_SPEC, "masked": MASKED_SPEC,
             "sinks": SINKS_SPEC}
    for name, config in (("mixtral", TINY_MIXTRAL), ("qwen3", TINY_QWEN3),
                         ("gptoss", TINY_GPT_OSS), ("vit", TINY_VIT), ("t5", TINY_T5),
                         ("whisper", TINY_WHISPER)):
        path = folder / f"tiny-{name}.json"
        path.write_text(json.dumps(config))
        specs[name] = str(path)
    return PlanMaker(str(folder), specs)
