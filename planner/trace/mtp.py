"""Multi-token-prediction (MTP) layers, built onto the Hugging Face models whose config declares
them, so that the plan prices the model that training engines run.

DeepSeek-V3's config.json declares one MTP depth (``num_nextn_predict_layers: 1``), GLM-4.5's
too. transformers builds the main model only (5.x keeps the MTP weights for speculative decoding,
never run in training), while Megatron-Bridge maps the key to ``--mtp-num-layers`` and trains
them (its DeepSeek-V3 and GLM-4.5 bridges; its DeepSeek-V3 recipes default to one depth). Depth
k (DeepSeek-V3 technical report, arXiv 2412.19437, section 2.2) normalizes the hidden states of
depth k-1 and the embeddings of the tokens k ahead (RMSNorm each), projects their concatenation
from two hidden widths to one, runs one more decoder layer (an MoE layer of the model's own
kind) and the shared output head after a norm of its own, and adds its cross entropy, scaled, to
the loss. The embedding and the output head are the main model's (shared weights, as in
Megatron-Core).

The depths run after the main model in the same forward, and their decoder layer takes the
keyword inputs the model's last decoder layer took (the causal mask and rotary embeddings),
captured by a pre-hook. The depths are one block (with the main model's final norm before them,
which Megatron-Core runs with the last layer instead: a norm's cost), between the last layer and
the head's block, which runs the head for the main model and for every depth with the losses:
Megatron-Core's order (``--pipeline-model-parallel-layout``'s ``m`` before ``L``, all of them on
one stage), so the depths share the last stage with the head (``tmL``, its default) or take a
stage of their own (``m|L``). Three or more depths read as a layer stack of their own (the trace
finds a repeated list), which layouts and the Megatron export refuse.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from planner.trace.graph import MTP_MODULE

MTP_MODEL_TYPES = ("deepseek_v3", "glm4_moe")
"""Model types whose MTP depth is built here (the DeepSeek-V3 form: two norms, a projection, a
decoder layer of the model's class, a norm before the shared head). Other declared MTP layers
(Qwen3-Next's ``mtp_num_hidden_layers``) stay left out, and said so."""

LOSS_SCALE = 0.1
"""Weight of the MTP losses (their mean over depths) in the training loss: Megatron-Core's
``--mtp-loss-scaling-factor`` default; DeepSeek-V3 trained with 0.3, then 0.1 (its report,
section 4.2). It changes no cost."""


class MTPDepth(torch.nn.Module):
    """One MTP depth: enorm, hnorm, eh_proj, a decoder layer and the norm before the head."""

    def __init__(self, model: torch.nn.Module, index: int):
        super().__init__()
        cfg = model.config
        hidden = int(cfg.hidden_size)
        norm = type(model.model.norm)
        eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.enorm = norm(hidden, eps=eps)
        self.hnorm = norm(hidden, eps=eps)
        self.eh_proj = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = type(model.model.layers[0])(cfg, layer_idx=int(cfg.num_hidden_layers) + index)
        self.norm = norm(hidden, eps=eps)

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor, embedding: torch.Tensor,
                layer_kwargs: dict) -> torch.Tensor:
        tokens = F.embedding(ids, embedding)  # the main model's embedding (a shared weight)
        x = self.eh_proj(torch.cat([self.enorm(tokens), self.hnorm(hidden)], dim=-1))
        return self.layer(x, **layer_kwargs)


def build(module: torch.nn.Module, depths: int) -> int:
    """Give ``module`` (a causal language model of MTP_MODEL_TYPES) ``depths`` MTP depths run in
    its forward; the depths built (0 for other models, or none declared)."""
    cfg = getattr(module, "config", None)
    if depths <= 0 or getattr(cfg, "model_type", "") not in MTP_MODEL_TYPES or not all(
            hasattr(module, a) for a in ("model", "lm_head", "loss_function")):
        return 0
    weight = module.lm_head.weight  # built where and as the model's weights are
    with torch.device(weight.device):
        setattr(module, MTP_MODULE,
                torch.nn.ModuleList(MTPDepth(module, k) for k in range(depths)))
    module.mtp.to(weight.dtype)
    init = getattr(module, "_init_weights", None)  # (the experts' weights start empty)
    if weight.device.type != "meta" and callable(init):
        module.mtp.apply(init)
    store: dict = {}  # (not an attribute: torch.export warns of tensors set on modules)
    for layer in module.model.layers:
        layer.register_forward_pre_hook(_capture(store), with_kwargs=True)

    def forward(input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs):
        return _forward(module, store, input_ids, labels, **kwargs)

    module.forward = forward
    module.planner_mtp = True
    return depths


def has_mtp(module: torch.nn.Module) -> bool:
    """Whether ``module`` runs MTP depths built here."""
    return isinstance(getattr(module, "mtp", None), torch.nn.ModuleList) and \
        getattr(module, "planner_mtp", False) is True


def _capture(store: dict):
    def hook(layer, args, kwargs):
        store.clear()
        store.update({k: v for k, v in kwargs.items() if k not in ("cache", "past_key_values",
                                                                    "use_cache")})
    return hook


def _forward(self, store: dict, input_ids: torch.Tensor, labels: torch.Tensor | None, **kwargs):
    """The causal LM's forward (main model, head, loss), then each MTP depth on the tokens k
    ahead, its loss added with LOSS_SCALE / depths."""
    kwargs.pop("use_cache", None)
    out = self.model(input_ids=input_ids, use_cache=False, **kwargs)
    hidden = out.last_hidden_state
    logits = self.lm_head(hidden)
    loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size) \
        if labels is not None else None
    layer_kwargs = dict(store)
    for k, depth in enumerate(self.mtp, start=1):
        # the tokens k ahead (the last k positions wrap around here; training masks them out)
        ahead = torch.roll(input_ids, -k, dims=1)
        hidden = depth(hidden, ahead, self.model.embed_tokens.weight, layer_kwargs)
        if labels is not None:
            mtp_logits = self.lm_head(depth.norm(hidden))
            mtp_loss = self.loss_function(logits=mtp_logits, labels=torch.roll(labels, -k, dims=1),
                                          vocab_size=self.config.vocab_size)
            loss = loss + LOSS_SCALE / len(self.mtp) * mtp_loss
    from transformers.modeling_outputs import CausalLMOutput  # lazy: Hugging Face models only

    return CausalLMOutput(loss=loss, logits=logits)
