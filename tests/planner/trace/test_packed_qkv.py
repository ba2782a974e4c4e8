"""A q/k/v projection fused into one Linear and reshaped into (3, heads, head_dim), as timm's ViT
does, is fused for tensor parallelism (a contiguous split of its rows would hand each rank parts
of the wrong pieces); (heads, 3 x head_dim), GPT-NeoX's layout, and separate Linears are not. A
new-user check ran such a model at tp=2 and trained another model, silently."""

import pytest
import torch
from torch import nn

from planner.api import prepare
from planner.runtime.dataflow import probe

D, H = 64, 4


class Attention(nn.Module):
    def __init__(self, layout: str):
        super().__init__()
        self.layout = layout
        if layout == "separate":
            self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        elif layout == "grouped":  # two key/value heads, repeated before the attention
            self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D // 2), nn.Linear(D, D // 2)
        else:
            self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        b, n, _ = x.shape
        hd = D // H
        if self.layout == "separate":
            q, k, v = (m(x).view(b, n, H, hd).transpose(1, 2) for m in (self.q, self.k, self.v))
        elif self.layout == "grouped":  # torchtitan's repeat_kv, then SDPA
            q = self.q(x).view(b, n, H, hd).transpose(1, 2)
            k, v = (m(x).view(b, n, H // 2, hd).transpose(1, 2) for m in (self.k, self.v))
            k, v = (t[:, :, None].expand(b, H // 2, 2, n, hd).reshape(b, H, n, hd)
                    for t in (k, v))
        elif self.layout == "bloom":  # (heads, 3, head_dim), taken apart along the 3
            qkv = self.qkv(x).view(b, n, H, 3, hd)
            q, k, v = (qkv[..., i, :].transpose(1, 2) for i in range(3))
        elif self.layout == "pieces-first":  # timm: (3, heads, head_dim)
            q, k, v = self.qkv(x).reshape(b, n, 3, H, hd).permute(2, 0, 3, 1, 4)
        elif self.layout == "pieces-indexed":
            qkv = self.qkv(x).reshape(b, n, 3, H, hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:  # heads-first, GPT-NeoX: (heads, 3 x head_dim), split along the last dimension
            q, k, v = self.qkv(x).view(b, n, H, 3 * hd).transpose(1, 2).split(hd, dim=-1)
        a = nn.functional.scaled_dot_product_attention(q, k, v)
        return x + self.proj(a.transpose(1, 2).reshape(b, n, D))


class Model(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.attn = Attention(layout)
        self.head = nn.Linear(D, 10)

    def forward(self, x):
        return self.head(self.attn(x))


LAYOUTS = {"separate": False, "pieces-first": True, "pieces-indexed": True, "heads-first": False,
           "grouped": False, "bloom": False}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_trace_marks_pieces_packed_ahead_of_the_heads_as_fused(layout):
    bg = prepare(Model(layout), example_inputs=(torch.randn(2, 8, D),), cache_dir=None).blocks
    assert bg.tp_roles.get("attn.proj") == "rowwise"
    fused = [m for m, text in bg.tp_other_modules.items() if text.endswith("fused")]
    assert fused == (["attn.qkv"] if LAYOUTS[layout] else [])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_runtime_probe_finds_them_too(layout):
    with torch.device("meta"):
        model = Model(layout)
        x = torch.randn(2, 8, D)
    tp = ["attn.q", "attn.k", "attn.v"] if layout in ("separate", "grouped") else ["attn.qkv"]
    flow = probe(model, (x,), {}, ["attn", "head"], tp + ["attn.proj"], lambda out: out)
    assert ("attn.qkv" in flow.cut) == LAYOUTS[layout]


def test_no_zoo_model_with_grouped_or_eager_attention_is_fused():
    """From a review: grouped key/value views repeated before an eager attention (gpt-oss) were
    marked fused by a first version of the rule, refusing tensor parallelism for the torch target."""
    bg = prepare("gpt-oss-120b", seq_len=256, dtype="bf16").blocks
    assert not [m for m, text in bg.tp_other_modules.items() if text.endswith("fused")]
