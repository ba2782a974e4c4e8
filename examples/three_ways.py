"""One transformer encoder written three ways, for `plan solve examples/three_ways.py:<way>`.

The same 8 layers (d_model 2048, 16 heads, MLP 4 x d_model, GELU, pre-norm) and the same loss
(mean squared error against a random target):

- ``plain``: Linear layers, a view/permute chain that unpacks q, k and v, and
  ``F.scaled_dot_product_attention``;
- ``mha``: ``nn.MultiheadAttention`` with Linear MLPs;
- ``encoder``: ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer``.

Each factory returns ``(model, example_inputs)`` with a batch of 4 sequences of ``seq_len`` tokens
(1,024 by default); ``dim``, ``layers`` and ``heads`` make smaller copies (tests use them).
"""

import torch
import torch.nn.functional as F
from torch import nn

DIM, HEADS, LAYERS, BATCH, SEQ = 2048, 16, 8, 4, 1024


class PlainBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(
            2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class MhaBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Stack(nn.Module):
    """Blocks (or a TransformerEncoder), and the loss against a target."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x, target):
        return F.mse_loss(self.body(x), target)


def _inputs(dim: int, seq_len: int):
    return (torch.randn(BATCH, seq_len, dim), torch.randn(BATCH, seq_len, dim))


def plain(seq_len: int = SEQ, dim: int = DIM, layers: int = LAYERS, heads: int = HEADS):
    body = nn.Sequential(*[PlainBlock(dim, heads) for _ in range(layers)])
    return Stack(body), _inputs(dim, seq_len)


def mha(seq_len: int = SEQ, dim: int = DIM, layers: int = LAYERS, heads: int = HEADS):
    body = nn.Sequential(*[MhaBlock(dim, heads) for _ in range(layers)])
    return Stack(body), _inputs(dim, seq_len)


def encoder(seq_len: int = SEQ, dim: int = DIM, layers: int = LAYERS, heads: int = HEADS):
    layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
    body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return Stack(body), _inputs(dim, seq_len)
