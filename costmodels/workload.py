"""What one block of a model asks of the hardware, per training sample.

The tracer measures these quantities on one sample (batch 1) at the traced sequence length; the cost
model multiplies by the micro-batch size. Quantities split by tensor parallelism ("_tp") follow
Megatron-LM's column/row pattern (Shoeybi et al. 2019): the ops between a column-parallel Linear and
the row-parallel Linear that consumes it run on 1/t of the heads or hidden units. Quantities marked
"_rep" are repeated on every tensor-parallel rank unless sequence parallelism splits them along the
sequence (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True)
class BlockWork:
    """Per-sample work and memory of one block (all figures for batch 1)."""

    mm_flops_tp: float = 0.0
    """Forward FLOPs of GEMMs that tensor parallelism splits."""
    mm_flops_rep: float = 0.0
    """Forward FLOPs of GEMMs repeated on every tensor-parallel rank."""
    attn_flops: float = 0.0
    """Forward FLOPs of attention cores (QK^T and attention x V), split over heads by tp."""
    mem_bytes_tp: float = 0.0
    """Bytes read + written by memory-bound ops inside tensor-parallel regions."""
    mem_bytes_rep: float = 0.0
    """Bytes read + written by memory-bound ops outside them (split only by sequence parallel)."""
    act_bytes_tp: float = 0.0
    """Bytes saved for backward, produced inside tensor-parallel regions (not the attention core)."""
    act_bytes_rep: float = 0.0
    """Bytes saved for backward, produced outside tensor-parallel regions."""
    act_bytes_attn: float = 0.0
    """Bytes saved for backward by the attention core's s x s tensors (selective recompute drops them)."""
    input_bytes: float = 0.0
    """Bytes of the gradient-carrying activations entering the block (what full recompute keeps)."""
    params_tp: float = 0.0
    """Parameters (count) split by tensor parallelism."""
    params_rep: float = 0.0
    """Parameters (count) repeated on every tensor-parallel rank."""
    tp_fwd_bytes: float = 0.0
    """Bytes all-reduced across the tensor-parallel group in forward (row-parallel outputs)."""
    tp_bwd_bytes: float = 0.0
    """Bytes all-reduced across the tensor-parallel group in backward (column-parallel input grads)."""
    tp_collectives: int = 0
    """Number of tensor-parallel collectives per forward + backward (for the latency term)."""

    @property
    def params(self) -> float:
        return self.params_tp + self.params_rep

    @property
    def fwd_flops(self) -> float:
        return self.mm_flops_tp + self.mm_flops_rep + self.attn_flops

    def scaled(self, factor: float) -> "BlockWork":
        """All per-sample quantities times ``factor`` (parameters and counts unchanged)."""
        keep = {"params_tp", "params_rep", "tp_collectives"}
        return BlockWork(**{f.name: (getattr(self, f.name) if f.name in keep
                                     else getattr(self, f.name) * factor) for f in fields(self)})

    def plus(self, other: "BlockWork") -> "BlockWork":
        """Field-wise sum (merging two blocks)."""
        return BlockWork(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                            for f in fields(self)})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "BlockWork":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


WORK_FIELDS = tuple(f.name for f in fields(BlockWork))
