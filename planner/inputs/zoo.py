"""Built-in model configurations (architectures only; nothing is downloaded).

Sources:
- gpt2, gpt2-xl: Radford et al. 2019 (the Hugging Face ``gpt2`` / ``gpt2-xl`` configs).
- gpt3-175b: Brown et al. 2020, Table 2.1 (96 layers, d_model 12288, 96 heads, context 2048); the
  vocabulary padded to 51,200 as in Megatron-LM.
- gpt-1.7b ... gpt-1t: the ten GPT models of Narayanan et al., SC'21, Table 1 (vocabulary 51,200,
  sequence 2,048); their published runs are in shared/data/megatron_table1.csv.
- llama3-*: Llama 3 Herd of Models (Dubey et al. 2024), Table 3.
- bert-large: Devlin et al. 2019 (24 layers, hidden 1024, 16 heads).
- mixtral-8x7b: Jiang et al. 2024, "Mixtral of Experts", Table 1 (32 layers, dim 4096, 32 heads,
  8 key/value heads, expert hidden 14336, 8 experts, 2 per token, vocabulary 32,000).

Mixtures of experts (README.md, "MODEL", tabulates them; each builds to its published total
within 0.3%):
- mixtral-8x22b: the Hugging Face ``Mixtral-8x22B-v0.1`` config.json, as Cerebras modelzoo's
  params_mixtral_8x22b.yaml transcribes it (56 layers, hidden 6144, 48 heads, 8 key/value heads,
  expert hidden 16384, 8 experts, 2 per token, context 65,536, RoPE theta 1e6); the
  vocabulary is the 32,768 of Mixtral-8x22B-Instruct-v0.1 and v0.3 (mistralai/mistral-inference
  README: v0.3 "is the same as Mixtral-8x22B-v0.1, but has an extended vocabulary of 32768
  tokens"; the base v0.1 has 32,000). 141B total (mistral.ai, "Cheaper, Better, Faster, Stronger").
- qwen3-30b-a3b, qwen3-235b-a22b: Qwen3 technical report 2025 (arXiv 2505.09388), Table 2 (48 / 94
  layers, 32/4 / 64/4 query/key-value heads, 128 experts, 8 per token, no shared expert) and the
  ``Qwen/Qwen3-30B-A3B`` / ``Qwen/Qwen3-235B-A22B`` config.json (hidden 2048 / 4096, expert hidden
  768 / 1536, head dim 128, vocabulary 151,936, untied embeddings). 30.5B / 235B total.
- deepseek-v3: deepseek-ai/DeepSeek-V3 config.json and inference/configs/config_671B.json (61 layers,
  hidden 7168, 128 heads, multi-head latent attention with q_lora_rank 1536, kv_lora_rank 512,
  qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; the first 3 layers dense with FFN 18432,
  then 256 routed experts of 2048, 8 per token in 8 groups of which 4, plus 1 shared expert of 2048;
  vocabulary 129,280); DeepSeek-V3 technical report (arXiv 2412.19437), section 4.2. Multi-token
  prediction is OFF (``num_nextn_predict_layers: 0``): the entry is the 671B main model that the
  repository's README counts, not the 685B checkpoint that adds the 14B MTP module;
  deepseek-v3-mtp is that checkpoint's model (one MTP depth, planner.trace.mtp), as
  Megatron-Bridge's DeepSeek-V3 recipes train it (``mtp_num_layers`` 1 by default).
- gpt-oss-120b: the ``openai/gpt-oss-120b`` config.json and the reference ``ModelConfig`` of
  openai/gpt-oss (gpt_oss/torch/model.py): 36 layers, hidden 2880, 64 heads of 64, 8 key/value
  heads, attention biases and sinks, 128 experts of 2880 (biased, clamped SwiGLU), 4 per token,
  vocabulary 201,088; layers alternate a 128-token sliding window (even layers) and full attention.
  117B total, 5.1B active (openai/gpt-oss README).
RoPE context-extension scaling (YaRN) of DeepSeek-V3 and gpt-oss is left out: it changes no shape
and no FLOP count.

Recommendation models (``RECSYS``; built by planner.trace.recsys with TorchRec's
EmbeddingBagCollection): dlrm-criteo-1tb, dlrm-dcnv2 and two-tower, sources beside each entry.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from costmodels.errors import suggest


def unknown_model(model: str) -> str:
    """What to say of a MODEL string that is no zoo name, config.json path or factory: the
    nearest zoo names and the other forms; a Python file given without its factory, the
    functions it defines."""
    if model.endswith(".py") and os.path.isfile(model):
        try:
            with open(model, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        except (OSError, SyntaxError, ValueError):
            defined = []
        return (f"'{model}' is a Python file: name the function in it that builds the model, "
                f"{model}:FUNCTION" + (f" (it defines {', '.join(defined)})" if defined else ""))
    return (f"unknown model '{model}'{suggest(model.lower(), [*ZOO, *RECSYS])} (or give a "
            "config.json path or file.py:factory)")


PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
                        "roberta-prelayernorm", "xmod", "ibert", "longformer", "luke", "markuplm",
                        "mpnet", "layoutlmv3", "lilt", "esm", "altclip_text_model",
                        "clap_text_model", "bridgetower_text_model")
"""Hugging Face model types whose learned positions start after the padding token's row
(transformers' ``create_position_ids_from_input_ids``: position ``pad_token_id + 1`` for the first
token), so that a sequence takes ``max_position_embeddings - pad_token_id - 1`` of them: RoBERTa's
514 rows hold 512 tokens (a new-user check planned 514, and ``plan run`` failed on the lookup)."""

LEARNED_POSITION_TYPES = ("bert", "gpt2", "opt", "bart", "whisper", *PADDING_OFFSET_TYPES,
                          "clip_text_model", "siglip_text_model",
                          "siglip2_text_model", "owlvit_text_model", "owlv2_text_model",
                          "groupvit_text_model", "xclip_text_model", "chinese_clip_text_model",
                          "align_text_model", "blip_text_model", "trocr")
"""Hugging Face model types whose max_position_embeddings (or max_target_positions) are learned
absolute positions, a hard limit on the sequence: whole models, and the text towers that a
config nests (CLIP's text_config; learned_positions looks there). TrOCR's are learned unless its
config turns them off (``use_learned_position_embeddings``: sinusoidal then)."""

NESTED_TEXT = ("text_config", "encoder", "decoder")
"""Where a composite config keeps the models that read the text: a dual tower's or a
vision-language model's text_config, an encoder-decoder's encoder and decoder (both read the
planned length in a text encoder-decoder; a vision encoder reads none)."""


def learned_positions(cfg) -> int | None:
    """The longest text a model with learned absolute positions takes, where it has them, its
    nested text model's (NESTED_TEXT) where the config has none of its own; ``cfg``: a
    transformers config, or a mapping with its model_type. A model with relative position
    buckets (T5 and its kin) has none, whatever ``n_positions`` its config carries (t5-large's
    says 512: the length it was pre-trained at); one whose positions start after the padding
    token's (PADDING_OFFSET_TYPES) has that many fewer than its table's rows."""
    def get(key, of=cfg):
        return of.get(key) if isinstance(of, Mapping) else getattr(of, key, None)

    kind = get("model_type")
    learned = kind in LEARNED_POSITION_TYPES and \
        get("position_embedding_type") in (None, "absolute") and \
        get("use_learned_position_embeddings") is not False  # (ESM-2's are rotary)
    if get("relative_attention_num_buckets") and not learned:
        return None  # (MPNet has both: relative buckets on top of learned positions)
    limit = get("n_positions")
    if limit is None and learned:
        limit = get("max_position_embeddings") or get("max_target_positions")
    if limit:
        return max(int(limit) - position_offset(cfg), 0)
    nested = [learned_positions(c) for c in (get(key) for key in NESTED_TEXT)
              if c is not None and get("model_type", c)]
    return min((n for n in nested if n is not None), default=None)


def position_offset(cfg) -> int:
    """The rows of a learned position table before the first token's: ``pad_token_id + 1`` for
    PADDING_OFFSET_TYPES (with RoBERTa's default id, 1, where the config gives none), else 0;
    0 too for ESM with rotary positions (ESM-2), which has no such table."""
    def get(key):
        return cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)

    if get("model_type") not in PADDING_OFFSET_TYPES or \
            get("position_embedding_type") not in (None, "absolute"):
        return 0
    pad = get("pad_token_id")
    return (pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 1) + 1


ROUTED_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
"""Hugging Face config keys of the routed-expert count (Mixtral and gpt-oss, Qwen3-MoE,
DeepSeek-V3)."""


@dataclass(frozen=True)
class ZooEntry:
    name: str
    model_type: str
    """transformers model type."""
    architecture: str
    """transformers class to build."""
    config: dict = field(default_factory=dict)
    seq_len: int = 2048
    """Default sequence length."""
    description: str = ""

    @property
    def learned_positions(self) -> int | None:
        """The longest sequence its learned absolute positions take (None: no such limit)."""
        return learned_positions({**self.config, "model_type": self.model_type})

    @property
    def routed_experts(self) -> int:
        """Routed experts per MoE layer (0: a dense model)."""
        return next((int(self.config[k]) for k in ROUTED_KEYS if self.config.get(k)), 0)

    @property
    def head_counts(self) -> tuple[int, ...]:
        """Query and key/value heads per attention layer, as given (none: not given), which every
        tensor-parallel degree divides."""
        counts = (self.config.get("num_attention_heads") or self.config.get("n_head"),
                  self.config.get("num_key_value_heads"))
        return tuple(sorted({int(c) for c in counts if c}, reverse=True))

    @property
    def experts_per_token(self) -> int:
        """Routed experts each token goes to (top-k; 0: a dense model)."""
        return int(self.config.get("num_experts_per_tok", 0)) if self.routed_experts else 0


def zoo_heads(model) -> tuple[int, ...]:
    """ZooEntry.head_counts of ``model`` where it names a zoo model (else none)."""
    entry = ZOO.get(model.lower()) if isinstance(model, str) else None
    return entry.head_counts if entry else ()


def _gpt(name: str, layers: int, hidden: int, heads: int, desc: str, vocab: int = 51200,
         positions: int = 2048) -> ZooEntry:
    return ZooEntry(name, "gpt2", "GPT2LMHeadModel",
                    {"n_layer": layers, "n_embd": hidden, "n_head": heads, "vocab_size": vocab,
                     "n_positions": positions, "bos_token_id": 0, "eos_token_id": 0},
                    seq_len=min(positions, 2048), description=desc)


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int,
           desc: str) -> ZooEntry:
    return ZooEntry(name, "llama", "LlamaForCausalLM",
                    {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": ffn,
                     "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                     "vocab_size": 128256, "max_position_embeddings": 131072,
                     "rope_theta": 500000.0, "tie_word_embeddings": False},
                    seq_len=8192, description=desc)


def _qwen3_moe(name: str, layers: int, hidden: int, ffn: int, expert_ffn: int, heads: int,
               desc: str) -> ZooEntry:
    """Qwen3 mixture of experts: every layer routes 8 of 128 experts, 4 key/value heads of 128."""
    return ZooEntry(name, "qwen3_moe", "Qwen3MoeForCausalLM",
                    {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": ffn,
                     "moe_intermediate_size": expert_ffn, "num_attention_heads": heads,
                     "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                     "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 151936,
                     "max_position_embeddings": 40960, "rope_theta": 1e6,
                     "tie_word_embeddings": False},
                    seq_len=4096, description=desc)


def _deepseek_v3(name: str, mtp: int, desc: str) -> ZooEntry:
    """DeepSeek-V3 with ``mtp`` multi-token-prediction depths (planner.trace.mtp)."""
    return ZooEntry(name, "deepseek_v3", "DeepseekV3ForCausalLM",
                    {"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
                     "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
                     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                     "first_k_dense_replace": 3, "intermediate_size": 18432,
                     "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8,
                     "topk_group": 4, "moe_intermediate_size": 2048, "n_shared_experts": 1,
                     "routed_scaling_factor": 2.5, "norm_topk_prob": True, "vocab_size": 129280,
                     "max_position_embeddings": 163840, "rope_theta": 10000.0,
                     "tie_word_embeddings": False, "num_nextn_predict_layers": mtp},
                    seq_len=4096, description=desc)


# The ten GPT models of Narayanan et al. (SC'21), Table 1: (name, heads, hidden, layers).
MEGATRON_GPT = [
    ("gpt-1.7b", 24, 2304, 24), ("gpt-3.6b", 32, 3072, 30), ("gpt-7.5b", 32, 4096, 36),
    ("gpt-18b", 48, 6144, 40), ("gpt-39b", 64, 8192, 48), ("gpt-76b", 80, 10240, 60),
    ("gpt-145b", 96, 12288, 80), ("gpt-310b", 128, 16384, 96), ("gpt-530b", 128, 20480, 105),
    ("gpt-1t", 160, 25600, 128),
]

ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        _gpt("gpt2", 12, 768, 12, "GPT-2 small, 124M", vocab=50257, positions=1024),
        _gpt("gpt2-xl", 48, 1600, 25, "GPT-2 XL, 1.5B", vocab=50257, positions=1024),
        _gpt("gpt3-175b", 96, 12288, 96, "GPT-3 175B (Brown et al. 2020)"),
        *[_gpt(n, layers, hidden, heads, f"Megatron-LM weak-scaling GPT, {n[4:].upper()} "
               "(Narayanan et al. 2021, Table 1)") for n, heads, hidden, layers in MEGATRON_GPT],
        _llama("llama3-8b", 32, 4096, 14336, 32, 8, "Llama 3 8B"),
        _llama("llama3-70b", 80, 8192, 28672, 64, 8, "Llama 3 70B"),
        _llama("llama3-405b", 126, 16384, 53248, 128, 8, "Llama 3.1 405B"),
        ZooEntry("mixtral-8x7b", "mixtral", "MixtralForCausalLM",
                 {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                  "num_local_experts": 8, "num_experts_per_tok": 2,
                  "max_position_embeddings": 32768, "rope_theta": 1e6, "tie_word_embeddings": False},
                 seq_len=4096, description="Mixtral 8x7B (mixture of experts, 2 of 8 per token)"),
        ZooEntry("mixtral-8x22b", "mixtral", "MixtralForCausalLM",
                 {"num_hidden_layers": 56, "hidden_size": 6144, "intermediate_size": 16384,
                  "num_attention_heads": 48, "num_key_value_heads": 8, "vocab_size": 32768,
                  "num_local_experts": 8, "num_experts_per_tok": 2,
                  "max_position_embeddings": 65536, "rope_theta": 1e6, "tie_word_embeddings": False},
                 seq_len=4096, description="Mixtral 8x22B, 141B (2 of 8 experts per token)"),
        _qwen3_moe("qwen3-30b-a3b", 48, 2048, 6144, 768, 32, "Qwen3-30B-A3B, 30.5B (8 of 128 "
                   "experts per token, 3.3B active)"),
        _qwen3_moe("qwen3-235b-a22b", 94, 4096, 12288, 1536, 64, "Qwen3-235B-A22B, 235B (8 of 128 "
                   "experts per token, 22B active)"),
        _deepseek_v3("deepseek-v3", 0, "DeepSeek-V3, 671B, no multi-token prediction (8 of 256 "
                     "experts + 1 shared per token, 37B active)"),
        _deepseek_v3("deepseek-v3-mtp", 1, "DeepSeek-V3 with its multi-token-prediction depth, "
                     "683B (its embedding and head shared), as Megatron-Bridge trains it"),
        ZooEntry("gpt-oss-120b", "gpt_oss", "GptOssForCausalLM",
                 {"num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "head_dim": 64, "attention_bias": True,
                  "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
                  "swiglu_limit": 7.0, "vocab_size": 201088, "sliding_window": 128,
                  "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                                  for i in range(36)],
                  "max_position_embeddings": 131072, "rope_theta": 150000.0,
                  "tie_word_embeddings": False},
                 seq_len=4096, description="gpt-oss-120b, 117B (4 of 128 experts per token, 5.1B "
                 "active)"),
        ZooEntry("bert-large", "bert", "BertForMaskedLM",
                 {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                  "intermediate_size": 4096}, seq_len=512, description="BERT-large, 340M"),
    ]
}


@dataclass(frozen=True)
class RecEntry:
    """A recommendation model: embedding tables (one per sparse feature) and its dense part."""

    name: str
    rows: tuple
    """Rows per table, one table per sparse feature."""
    dim: int
    pooling: tuple = ()
    """Ids per sample per feature (empty: one-hot)."""
    dense_in: int = 13
    bottom: tuple = ()
    """Bottom (dense-feature) MLP widths."""
    top: tuple = ()
    """Over-arch MLP widths (ending in 1 for a click logit)."""
    interaction: str = "dot"
    """dot (DLRM's pairwise dot products), dcn (DCNv2 low-rank cross layers), two_tower."""
    dcn_layers: int = 0
    dcn_rank: int = 0
    towers: tuple = ()
    """two_tower: how many tables feed the query tower (the rest feed the candidate tower)."""
    optimizer: str = "sgd"
    description: str = ""


CRITEO_1TB_ROWS = (45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138,
                   10, 2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606,
                   104, 35)
"""Criteo 1TB, rows per categorical feature after preprocessing: facebookresearch/dlrm
torchrec_dlrm/README.MD, ``--num_embeddings_per_feature`` of its training results (commit df137d8;
also the ``notes`` of shared/data/recsys_runs.csv)."""

MLPERF_DCNV2_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956,
                     405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152,
                     12973, 108, 36)
MLPERF_DCNV2_HOTS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
"""MLPerf Training's DLRM-DCNv2 (v3.0 onwards; facebookresearch/dlrm torchrec_dlrm README, "MLPerf
DLRM-DCNv2"): tables capped at 40M rows, synthetic multi-hot sizes per feature, dim 128, 3 low-rank
(512) cross layers, Adagrad."""

RECSYS: dict[str, RecEntry] = {
    e.name: e
    for e in [
        RecEntry("dlrm-criteo-1tb", CRITEO_1TB_ROWS, 128, bottom=(512, 256, 128),
                 top=(1024, 1024, 512, 256, 1), interaction="dot",
                 description="DLRM on Criteo 1TB: 26 tables (178M rows, 91 GB fp32), dim 128, "
                 "dot interaction"),
        RecEntry("dlrm-dcnv2", MLPERF_DCNV2_ROWS, 128, pooling=MLPERF_DCNV2_HOTS,
                 bottom=(512, 256, 128), top=(1024, 1024, 512, 256, 1), interaction="dcn",
                 dcn_layers=3, dcn_rank=512, optimizer="rowwise_adagrad",
                 description="MLPerf DLRM-DCNv2: 26 multi-hot tables capped at 40M rows, 3 cross "
                 "layers"),
        # pytorch/torchrec examples/retrieval/two_tower_train.py defaults: two features (user id,
        # item id), 1024 x 1024 rows each, dim 64, towers of 128 and 64
        RecEntry("two-tower", (1048576, 1048576), 64, dense_in=0, top=(128, 64),
                 interaction="two_tower", towers=(1,),
                 description="two-tower retrieval (TorchRec's example): user and item tables of "
                 "1M x 64, towers 128-64"),
    ]
}
