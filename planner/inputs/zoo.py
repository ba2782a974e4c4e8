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
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
        ZooEntry("bert-large", "bert", "BertForMaskedLM",
                 {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                  "intermediate_size": 4096}, seq_len=512, description="BERT-large, 340M"),
    ]
}
