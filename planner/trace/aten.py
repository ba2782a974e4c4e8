"""What a traced call computes, priced from the ATen ops it runs.

A traced node (an fx call, a leaf module such as ``nn.MultiheadAttention`` or ``nn.LSTM``, or an
export node such as ``aten.linear``) is run again on meta tensors under a dispatch mode that sees
every ATen op it decomposes into. Each op is priced from its shapes:

- GEMM-like ops (mm, addmm, bmm, baddbmm, convolutions as implicit GEMMs, grouped GEMMs of routed
  experts, ATen's or a library's) become ``AtenGemm`` records, with the FLOPs of ``torch.utils.flop_counter``'s formulas
  (2 m n k; a grouped GEMM runs each row against its own group's matrix, 2 M K N over all rows) and
  which operands carry a gradient, so the backward prices only the gradients autograd computes;
- ``F.scaled_dot_product_attention`` (caught before it decomposes: while a call is priced the
  function is wrapped, since ``torch.nn.functional``'s own modules call it through that name)
  becomes an ``AtenAttention``;
- views and tensor factories are free;
- every other ATen op moves its operands and results through memory once: bytes read + written;
- ops of other namespaces (custom kernels) and the compute-heavy ATen families no formula here
  covers (linear algebra, FFTs, ...) are priced by their bytes too, and listed as *unpriced* with
  their count and bytes, so a plan can say what its costs leave out.

Nothing here knows about blocks or plans: ``price`` returns plain numbers for one call.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

GEMMS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm}
CONVOLUTIONS = {aten.convolution, aten._convolution, aten.cudnn_convolution,
                aten.convolution_overrideable, aten._slow_conv2d_forward}
GROUPED = {getattr(aten, name) for name in ("_grouped_mm", "_scaled_grouped_mm") if hasattr(aten, name)}
GROUPED_NAMES = ("grouped_mm", "grouped_mm_fallback")
"""Grouped GEMMs of other namespaces (transformers' fallback kernel for routed experts), priced
as ``_grouped_mm``: (input rows, input dim) x one (input dim, output dim) matrix per group."""
FUSED_ATTENTION = {getattr(aten, name) for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    if hasattr(aten, name)}
FREE = {aten.empty, aten.empty_like, aten.empty_strided, aten.zeros, aten.zeros_like, aten.ones,
        aten.ones_like, aten.full, aten.full_like, aten.arange, aten.scalar_tensor, aten.randn,
        aten.rand, aten.randint, aten.randn_like, aten.rand_like, aten.detach, aten.lift_fresh,
        aten.lift_fresh_copy, aten._unsafe_view, aten.alias, aten.sym_size, aten.sym_numel,
        aten.sym_stride, aten.sym_storage_offset, aten._assert_async, aten._local_scalar_dense,
        aten.new_empty, aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty_strided,
        aten.uniform_, aten.normal_, aten.bernoulli_, aten.copy_}
"""Ops that create or relabel tensors without reading an operand's data (their bytes are the
output's first touch, which the op consuming it pays)."""
UNPRICED_FAMILIES = ("linalg_", "_linalg_", "fft_", "_fft_", "cholesky", "triangular_solve",
                     "_weight_int", "_cslt_", "cdist", "_cdist")
"""ATen op name prefixes whose arithmetic the formulas here do not cover (``_linalg_``: SVD,
eigh, solve and det decompose to ``_linalg_svd``, ``_linalg_eigh``, ``_linalg_solve_ex`` and
``_linalg_det``)."""


@dataclass(frozen=True)
class AtenGemm:
    """One GEMM-like op over the whole traced batch: ``batch`` independent (m x k) @ (k x n)."""

    batch: float
    m: float
    n: float
    k: float
    weight: bool
    """One operand is a parameter (or a view of one): a Linear or a convolution."""
    grad_a: bool
    """The left (activation) operand needs a gradient: backward runs the input-gradient GEMM."""
    grad_b: bool
    """The right operand (a weight, or a second activation) needs a gradient."""
    experts: int = 0
    """Groups of a grouped GEMM of routed tokens with one matrix per expert (a Mixture-of-Experts
    layer); 0 for every other GEMM."""
    stacked: bool = False
    """A batched GEMM of activations against a stacked weight, one matrix per batch entry
    ([E, C, k] x [E, k, n]): the experts of a capacity-style Mixture-of-Experts layer (GShard's
    expert buffers of C token slots each) when its module routes tokens (planner.trace.records
    decides; anything else keeps it a batched GEMM)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class AtenAttention:
    """One fused attention call over the whole traced batch."""

    batch: int
    heads_q: int
    heads_kv: int
    q_len: int
    kv_len: int
    head_dim: int
    value_dim: int
    causal: bool
    dropout: bool

    @property
    def flops(self) -> float:
        """QK^T and attention x V (torch.utils.flop_counter's sdpa formula)."""
        scores = self.batch * self.heads_q * self.q_len * self.kv_len
        return 2.0 * scores * (self.head_dim + self.value_dim)


@dataclass
class CallWork:
    """What one call computes, over the whole traced batch, forward only."""

    gemms: list[AtenGemm] = field(default_factory=list)
    attention: list[AtenAttention] = field(default_factory=list)
    gemm_out_bytes: float = 0.0
    """Bytes of the results of the call's GEMMs: in a recurrent layer, each timestep's gate
    pre-activations, about what it keeps for its backward (records.RECURRENT)."""
    mem_bytes: float = 0.0
    """Bytes read + written by memory-bound ATen ops (one kernel each)."""
    kernels: int = 0
    """Memory-bound kernels."""
    unpriced: dict = field(default_factory=dict)
    """ATen (or custom) op name -> [calls, bytes] of ops no formula prices (their bytes are in
    mem_bytes)."""

    @property
    def flops(self) -> float:
        return sum(g.flops for g in self.gemms) + sum(a.flops for a in self.attention)


def price(fn, *, weights: set[int] = frozenset()) -> CallWork:
    """Run ``fn()`` (on meta tensors) and price every ATen op it dispatches. ``weights``: ids of
    the parameter tensors it reads (operands derived from them by views mark weight GEMMs)."""
    work = CallWork()
    recorder = _Recorder(work, set(weights))
    # autograd stays on: the operands' requires_grad says which gradients backward computes
    with torch.enable_grad(), _catch_attention(recorder), recorder:
        fn()
    return work


class _Recorder(TorchDispatchMode):
    def __init__(self, work: CallWork, weights: set[int]):
        super().__init__()
        self.work, self.weights = work, weights
        self.alive: list = []  # keeps the tensors whose ids mean something alive
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused:
            self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out) -> None:
        packet = func.overloadpacket
        ins = _tensors(args) + _tensors(kwargs)
        outs = _tensors(out)
        if func.is_view or packet in FREE:
            if any(id(t) in self.weights for t in ins):
                self.weights.update(id(t) for t in outs)
                self.alive.extend(outs)
            return
        if packet in GEMMS:
            self._gemm(packet, args)
            self.work.gemm_out_bytes += sum(t.numel() * t.element_size() for t in outs)
        elif packet in CONVOLUTIONS:
            self._conv(args, outs[0])
        elif packet in GROUPED or packet.__name__.endswith(GROUPED_NAMES):
            self._grouped(args, outs[0])
        elif packet in FUSED_ATTENTION:
            self.work.attention.append(_attention(args[0], args[1], args[2], causal=False,
                                                  dropout=False))
        else:
            nbytes = _bytes(ins, outs)
            self.work.mem_bytes += nbytes
            self.work.kernels += 1
            name = packet.__name__
            if func.namespace not in ("aten", "prims") or name.startswith(UNPRICED_FAMILIES):
                entry = self.work.unpriced.setdefault(f"{func.namespace}.{name}", [0, 0.0])
                entry[0] += 1
                entry[1] += nbytes
        if any(id(t) in self.weights for t in ins) and packet not in GEMMS | CONVOLUTIONS | GROUPED:
            self.weights.update(id(t) for t in outs)  # a weight cast to the compute dtype
            self.alive.extend(outs)

    def _is_weight(self, t) -> bool:
        return id(t) in self.weights

    def _gemm(self, packet, args) -> None:
        a, b = (args[1], args[2]) if packet in (aten.addmm, aten.baddbmm) else (args[0], args[1])
        weight = self._is_weight(a) or self._is_weight(b)
        if a.dim() == 2:
            self.work.gemms.append(AtenGemm(1, a.shape[0], b.shape[1], a.shape[1], weight,
                                            a.requires_grad, b.requires_grad))
        else:
            stacked = (self._is_weight(b) and not self._is_weight(a) and b.dim() == 3
                       and a.shape[0] == b.shape[0] > 1 and b.stride(0) != 0)  # not expanded
            self.work.gemms.append(AtenGemm(a.shape[0], a.shape[1], b.shape[2], a.shape[2], weight,
                                            a.requires_grad, b.requires_grad, stacked=stacked))

    def _conv(self, args, out) -> None:
        """A convolution as ``groups`` implicit GEMMs (flop_counter's conv formula): rows are
        output positions (input positions when transposed), columns the group's output channels
        (times the kernel when transposed), the reduction its input channels x kernel."""
        x, w = args[0], args[1]
        transposed = bool(args[6]) if len(args) > 6 else False
        groups = int(args[8]) if len(args) > 8 else 1
        kernel = math.prod(w.shape[2:])
        if transposed:
            m, n, k = x.shape[0] * math.prod(x.shape[2:]), w.shape[1] * kernel, w.shape[0] / groups
        else:
            m, n, k = x.shape[0] * math.prod(out.shape[2:]), w.shape[0] / groups, w.shape[1] * kernel
        self.work.gemms.append(AtenGemm(groups, m, n, k, True, x.requires_grad, w.requires_grad))

    def _grouped(self, args, out) -> None:
        a, b = args[0], args[1]
        m, k, n = grouped_mm_dims(tuple(a.shape), tuple(b.shape), tuple(out.shape))
        experts = int(b.shape[0]) if a.dim() == 2 and b.dim() == 3 else 0
        self.work.gemms.append(AtenGemm(1, m, n, k, self._is_weight(b),
                                        a.requires_grad, b.requires_grad, experts))


def grouped_mm_dims(a: tuple, b: tuple, out: tuple) -> tuple[float, float, float]:
    """(m, k, n) of a grouped GEMM taken as one GEMM of all its rows: each row (a routed token)
    meets only its own group's (expert's) matrix, so the FLOPs are 2 m k n."""
    if len(a) == 2 and len(b) == 3:  # routed tokens x their experts' matrices
        return a[0], a[1], b[2]
    if len(a) == 2 and len(b) == 2:  # groups along k: the experts' weight gradients
        return a[0], a[1], b[1]
    return math.prod(out[:-1]), a[-1], out[-1]  # groups as a batch


def grouped_mm_flops(a: tuple, b: tuple, out: tuple) -> float:
    """FLOPs of ``_grouped_mm`` with operands of shapes ``a`` and ``b`` and result ``out``."""
    m, k, n = grouped_mm_dims(a, b, out)
    return 2.0 * m * k * n


@contextlib.contextmanager
def _catch_attention(recorder: _Recorder):
    """While pricing, ``F.scaled_dot_product_attention`` records one fused attention call and runs
    unrecorded (on meta tensors it would decompose into two batched GEMMs and a softmax)."""
    original = F.scaled_dot_product_attention

    def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):
        recorder.work.attention.append(_attention(query, key, value, causal=bool(is_causal),
                                                  dropout=float(dropout_p) > 0))
        recorder.paused += 1
        try:
            return original(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)
        finally:
            recorder.paused -= 1

    F.scaled_dot_product_attention = fused
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def _attention(q, k, v, *, causal: bool, dropout: bool) -> AtenAttention:
    """Shapes (batch, heads, length, dim), or (length, dim) per head without a batch."""
    lead = q.shape[:-3] if q.dim() >= 4 else (1,)
    return AtenAttention(batch=math.prod(lead), heads_q=q.shape[-3] if q.dim() >= 3 else 1,
                         heads_kv=k.shape[-3] if k.dim() >= 3 else 1, q_len=q.shape[-2],
                         kv_len=k.shape[-2], head_dim=q.shape[-1], value_dim=v.shape[-1],
                         causal=causal, dropout=dropout)


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def _bytes(ins, outs) -> float:
    seen, total = set(), 0.0
    for t in ins + outs:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total
