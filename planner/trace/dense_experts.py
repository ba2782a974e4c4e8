"""Mixture-of-experts layers whose Hugging Face code computes every expert on every token, built
to route each token to its chosen experts instead, as training engines run them.

transformers' Llama 4 (``Llama4TextMoe``, 5.x) repeats each token once per expert, scales the
copies by the router's scores (zero for the experts not chosen) and runs every expert on all of
them: the top-1 routing of Llama 4 Scout and Maverick costs 16 or 128 experts' work per token
there, while Megatron-Core and torchtitan (its ``llama4`` model) send each token to its top-k
experts only. Priced as written, the plan would charge every expert for every token (a new-user
check priced Llama 4 Scout 6x too slow). The routed form below computes the same thing: a
skipped expert receives a zero input, and an expert without biases maps zero to zero (SiLU(0) x
0), so leaving it out changes no output and no gradient. The router's score multiplies the
expert's input, as in Llama 4 (not its output, as in Mixtral).

The experts run as grouped GEMMs over their stacked ``[experts, in, out]`` weights (transformers'
own grouped-GEMM dispatcher, the one its routed MoE layers use), so the trace finds them as it
finds any routed experts (planner.trace.aten)."""

from __future__ import annotations

import types

import torch

DENSE_MOE_CLASSES = ("Llama4TextMoe",)
"""Class names of MoE layers that compute every expert on every token."""


def route(module: torch.nn.Module) -> int:
    """Give each dense MoE layer of ``module`` (DENSE_MOE_CLASSES) the routed forward; the number
    of layers changed (0 where transformers offers no grouped GEMM to run them with)."""
    try:
        from transformers.integrations.moe import _grouped_mm  # lazy: Hugging Face models only
    except ImportError:  # a transformers without routed-expert kernels: priced as written
        return 0
    changed = 0
    for mod in module.modules():
        if type(mod).__name__ in DENSE_MOE_CLASSES and _has_llama4_parts(mod):
            mod.forward = types.MethodType(_routed_forward, mod)
            mod.planner_grouped_mm = _grouped_mm
            changed += 1
    return changed


def _has_llama4_parts(mod: torch.nn.Module) -> bool:
    experts = getattr(mod, "experts", None)
    return all(hasattr(mod, a) for a in ("router", "shared_expert", "top_k", "hidden_dim")) and \
        getattr(getattr(experts, "gate_up_proj", None), "dim", lambda: 0)() == 3 and \
        getattr(getattr(experts, "down_proj", None), "dim", lambda: 0)() == 3


def _routed_forward(self, hidden_states: torch.Tensor):
    """Llama4TextMoe.forward with each token sent to its top-k experts only: the same output and
    router logits."""
    x = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(x, self.router.weight, self.router.bias)
    top_value, top_index = torch.topk(logits, self.top_k, dim=1)
    scores = torch.sigmoid(top_value.float()).to(x.dtype)
    experts = self.experts
    count = experts.gate_up_proj.shape[0]
    flat = top_index.reshape(-1)
    expert_ids, order = torch.sort(flat, stable=True)
    # (histc, not bincount: a fixed number of bins, as transformers' routed layers count them)
    tokens = torch.histc(expert_ids.float(), bins=count, min=0, max=count - 1)
    offsets = torch.cumsum(tokens, dim=0, dtype=torch.int32)
    copies = x[order // self.top_k] * scores.reshape(-1)[order].unsqueeze(-1)
    gate, up = self.planner_grouped_mm(copies, experts.gate_up_proj, offsets).chunk(2, dim=-1)
    out = self.planner_grouped_mm(up * experts.act_fn(gate), experts.down_proj, offsets)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    routed = out[back].view(x.shape[0], self.top_k, -1).sum(dim=1)
    return self.shared_expert(x) + routed, logits
