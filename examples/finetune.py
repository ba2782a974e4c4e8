"""Fine-tuning with low-rank adapters: a factory whose base weights are frozen.

A Llama decoder (Hugging Face ``transformers``, built from its configuration) whose every weight
has ``requires_grad=False``, with a trained low-rank adapter beside the query and value
projections of each layer (LoRA: Hu et al., "LoRA: Low-Rank Adaptation of Large Language
Models", 2021: y = W x + B A x, W frozen, A and B of rank r trained). The planner prices what a
step of it does: the frozen weights are held (no gradients, optimizer states, gradient traffic
or update), their weight gradients are not computed, and nothing before the first adapter runs
a backward.

    plan solve examples/finetune.py:build --cluster dgx-h100 --nodes 1 --global-batch 64
    plan solve examples/finetune.py:build --cluster dgx-h100 --nodes 1 --global-batch 64 \\
        --seq-len 8192
    plan solve examples/finetune.py:whole --cluster dgx-h100 --nodes 1 --global-batch 64

``build`` is a Llama-3-8B-shaped model with rank-16 adapters, ``whole`` the same trained
whole; ``tiny`` the adapted model at toy size (the
runtime's tests run it). The adapters here start random (the paper starts B at zero, which
leaves A without a gradient in the first step: the same work, priced the same way).
"""

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


class LoRALinear(nn.Module):
    """A frozen Linear and a trained low-rank update beside it: base(x) + alpha / rank x
    up(down(x)) (the paper's scaling)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + self.scale * self.up(self.down(x))


def adapted(config: LlamaConfig, rank: int, alpha: float) -> nn.Module:
    """A Llama with every weight frozen and adapters on each layer's query and value
    projections."""
    model = LlamaForCausalLM(config).requires_grad_(False)
    for layer in model.model.layers:
        attention = layer.self_attn
        attention.q_proj = LoRALinear(attention.q_proj, rank, alpha)
        attention.v_proj = LoRALinear(attention.v_proj, rank, alpha)
    return model


def _llama3_8b(seq_len: int) -> LlamaConfig:
    """Llama-3-8B's shape: 32 layers, hidden 4096, 8 key-value heads."""
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                       max_position_embeddings=max(seq_len, 8192), rope_theta=500000.0,
                       use_cache=False)


def build(seq_len: int = 4096, batch: int = 1, rank: int = 16, alpha: float = 32.0):
    """Llama-3-8B's shape with rank-``rank`` adapters."""
    config = _llama3_8b(seq_len)
    return adapted(config, rank, alpha), (torch.randint(0, config.vocab_size, (batch, seq_len)),)


def whole(seq_len: int = 4096, batch: int = 1):
    """The same model trained whole (every weight, no adapters): what the adapters save."""
    config = _llama3_8b(seq_len)
    return LlamaForCausalLM(config), (torch.randint(0, config.vocab_size, (batch, seq_len)),)


def tiny(seq_len: int = 16, batch: int = 2, rank: int = 4, alpha: float = 32.0):
    """The same at toy size: four layers of width 64 (a large alpha / rank, so that one step
    moves every adapter well clear of the runtime tests' tolerance)."""
    config = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                         max_position_embeddings=256, tie_word_embeddings=False, use_cache=False)
    return adapted(config, rank, alpha), (torch.randint(0, config.vocab_size, (batch, seq_len)),)
