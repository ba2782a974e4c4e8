"""Attention masks the model's modules declare, put on the attention ops that run under them.

A traced attention core often receives its mask as data (a materialized tensor of meta values),
which says nothing about its shape: Hugging Face hands scaled_dot_product_attention a mask for
every sliding-window layer, and eager attention (gpt-oss, whose sinks SDPA cannot take) always
adds one. The modules say what it is: a Hugging Face attention module sets ``is_causal`` and, in
sliding-window layers (gpt-oss, Qwen2, Gemma 2 and 3; Mistral in its config),
``sliding_window``: query i sees keys i - w + 1 .. i (transformers' ``sliding_window_overlay``).
A fused kernel (FlashAttention,
cuDNN, Transformer Engine) skips the tiles such a mask removes, so the attention of those layers
is priced as the work inside the mask.

Each self-attention op (query and key lengths equal) owned by a module declaring a causal mask
gets ``causal`` and, under a window, ``keep``: the share of a causal call's pairs it keeps (a
causal call of square F does about F / 2; a windowed one ``keep`` x F / 2). Limits: a module
that declares ``is_causal`` but is handed another mask (a prefix-LM's bidirectional prefix, image
tokens seeing each other) is priced causal; under context parallelism a windowed layer's calls
are priced as the rank's share of its windowed calls, without the ring's pairs of chunks (a
window shorter than a chunk meets few of them; costmodels.attention.ring_attention_s)."""

from __future__ import annotations

import torch

from planner.trace.graph import Op


def declared(module: torch.nn.Module) -> tuple[bool, int]:
    """(causal, window) the module declares; window 0 for none. Cross-attention
    (``is_cross_attention``, as GPT-BigCode marks it) is not causal whatever ``is_causal`` says."""
    causal = (getattr(module, "is_causal", None) is True
              and not getattr(module, "is_cross_attention", False))
    window = _window(module)
    ok = isinstance(window, int) and not isinstance(window, bool) and window > 0
    return causal, (window if causal and ok else 0)


def _window(module: torch.nn.Module):
    """The module's ``sliding_window``; without one of its own, its config's (Mistral's
    attention reads it there), unless the config turns windows off (``use_sliding_window``) or
    lists per-layer types and this layer's is not ``sliding_attention`` (Qwen2-MoE sets the
    attribute in its sliding layers only)."""
    if hasattr(module, "sliding_window"):
        return module.sliding_window
    config = getattr(module, "config", None)
    if config is None or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types:
        idx = getattr(module, "layer_idx", None)
        if not isinstance(idx, int) or not 0 <= idx < len(types) or \
                types[idx] != "sliding_attention":
            return None
    return getattr(config, "sliding_window", None)


def signature(module: torch.nn.Module) -> tuple:
    """What of a layer's masks tells its layers apart (layers that differ are traced whole)."""
    return tuple((name, declared(m)) for name, m in module.named_modules()
                 if declared(m) != (False, 0))


def window_keep(length: int, window: int) -> float:
    """The share of a causal call (``length`` queries and keys) that a window of ``window`` keys
    keeps: its query-key pairs over the causal mask's."""
    if window <= 0 or window >= length:
        return 1.0
    pairs = window * (window + 1) / 2 + (length - window) * window
    return pairs / (length * (length + 1) / 2)


def mark(ops: list[Op], model: torch.nn.Module) -> None:
    """Put the declared masks on the self-attention ops of ``ops`` (see the module docstring):
    fused attention ops, and the two GEMMs of eager attention cores (activation x activation
    matmuls of a scores tensor: queries x keys, then probabilities x values)."""
    masks = {name: declared(m) for name, m in model.named_modules()}
    by = {op.name: op for op in ops}
    for op in ops:
        causal, window = masks.get(op.module, (False, 0))
        if not causal:
            continue
        length = _self_attention_length(op, by)
        if not length:
            continue
        op.dims["causal"] = 1
        keep = window_keep(length, window)
        if keep < 1.0:
            op.dims["keep"] = keep
            op.dims["length"] = length


def _self_attention_length(op: Op, by: dict) -> int:
    """The sequence length of a self-attention op (fused, or one GEMM of an eager core), or 0."""
    if op.kind == "attention":
        heads, queries = op.dims.get("heads_q", 0), op.shape[-2] if len(op.shape) >= 2 else 0
        keys = op.dims.get("scores", 0) / (heads * queries) if heads and queries else 0
        return queries if queries and keys == queries else 0
    if op.kind != "matmul" or op.params or op.dims.get("linear") or len(op.shape) < 4:
        return 0
    if op.shape[-1] == op.shape[-2]:  # queries x keys -> scores
        return op.shape[-1]
    scores = by[op.inputs[0]].shape if op.inputs and op.inputs[0] in by else []
    if len(scores) >= 4 and scores[-1] == scores[-2] and scores[-2] == op.shape[-2]:
        return scores[-1]  # probabilities x values
    return 0
