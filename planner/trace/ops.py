"""The op vocabulary: what kind of work an op is and what it keeps for its backward.

Torch-free: the tracer reduces every traced node to a short name (``linear``, ``mul``,
``scaled_dot_product_attention``, a module class such as ``LayerNorm``) and asks here.

Kinds:
- ``matmul``      GEMM-like (linear, mm, addmm, bmm, matmul, einsum, convolution): compute-bound
- ``attention``   fused attention cores (scaled_dot_product_attention and its variants)
- ``fused``       opaque compute-bound modules (nn.MultiheadAttention, RNNs)
- ``embedding``   table lookups
- ``norm``        layer/RMS/group/batch norm
- ``softmax``, ``dropout``, ``loss``, ``elementwise``: memory-bound
- ``view``        no data movement (views, reshapes of contiguous data, getitem on tuples)
- ``constant``    creates tensors from nothing (arange, zeros, full): no inputs to differentiate
- ``input``       graph inputs
- ``other``       anything unknown: memory-bound, keeps its gradient-carrying inputs

What is saved for backward follows PyTorch's autograd formulas (tools/autograd/derivatives.yaml):
a product keeps each factor for the other's gradient, a norm keeps its input, softmax its output,
dropout a one-byte mask, a GEMM the activation operand when the weight needs a gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

MATMUL = {"linear", "mm", "addmm", "bmm", "baddbmm", "matmul", "einsum", "convolution",
          "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
          "Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "Bilinear"}
ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward"}
FUSED = {"MultiheadAttention", "LSTM", "GRU", "RNN", "Transformer", "TransformerEncoderLayer",
         "TransformerDecoderLayer"}
GROUPED_GEMMS = {"_grouped_mm", "_scaled_grouped_mm", "grouped_mm", "grouped_mm_fallback"}
"""Node targets of grouped GEMMs (routed experts' weights, one matrix per expert): kind "other",
but like a Linear their weights' gradient keeps the activation operand (quantized under FP8, as
Transformer Engine's GroupedLinear keeps it)."""
EMBEDDING = {"embedding", "Embedding", "embedding_bag", "EmbeddingBag"}
NORM = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm",
        "native_group_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training", "LayerNorm", "RMSNorm", "GroupNorm",
        "BatchNorm1d", "BatchNorm2d", "BatchNorm3d"}
SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "Softmax", "LogSoftmax"}
DROPOUT = {"dropout", "native_dropout", "_fused_dropout", "feature_dropout", "Dropout",
           "Dropout1d", "Dropout2d", "Dropout3d"}
LOSS = {"cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss_forward", "nll_loss2d",
        "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy",
        "binary_cross_entropy_with_logits", "kl_div", "CrossEntropyLoss", "MSELoss", "NLLLoss"}
VIEW = {"view", "_unsafe_view", "reshape", "transpose", "permute", "unsqueeze", "squeeze",
        "expand", "expand_as", "slice", "select", "alias", "t", "split", "split_with_sizes",
        "unbind", "chunk", "narrow", "getitem", "detach", "as_strided", "view_as", "flatten",
        "unflatten", "movedim", "_assert_tensor_metadata", "size", "dim", "_assert_async",
        "lift_fresh_copy", "Flatten", "Unflatten", "Identity", "sym_size", "type_as",
        "view_as_complex", "view_as_real"}
CONSTANT = {"arange", "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like",
            "empty_like", "rand", "randn", "randint", "scalar_tensor", "tensor", "new_ones",
            "new_zeros", "new_full", "new_empty", "triu", "tril", "eye"}
SAVES_OUTPUT = {"relu", "tanh", "sigmoid", "exp", "rsqrt", "sqrt", "ReLU", "Tanh", "Sigmoid",
                "hardtanh", "relu_", "threshold"}
SAVES_INPUT = {"gelu", "silu", "pow", "sin", "cos", "log", "log1p", "erf", "abs",
               "leaky_relu", "elu", "softplus", "mish", "hardswish", "hardsigmoid", "GELU", "SiLU",
               "Mish", "LeakyReLU", "ELU", "Softplus", "Hardswish", "clamp", "clip", "reciprocal"}
PRODUCTS = {"mul", "div", "truediv", "matmul_elementwise", "addcmul", "addcdiv", "floordiv"}
NO_SAVE = {"add", "sub", "rsub", "neg", "cat", "concat", "stack", "to", "_to_copy", "clone", "copy",
           "copy_", "contiguous", "mean", "sum", "index", "gather", "where", "pad",
           "constant_pad_nd", "masked_fill", "index_select", "repeat", "repeat_interleave", "roll",
           "float", "half", "bfloat16", "type", "cumsum", "ne", "eq", "le", "lt", "ge", "gt",
           "__and__", "__or__", "logical_and", "logical_or", "logical_not", "bitwise_and", "diff",
           "fill", "fill_", "iadd", "add_", "mul_", "scatter", "index_put", "masked_scatter",
           "amax", "max", "min", "argmax", "argmin", "any", "all", "cumprod", "flip", "sort",
           "topk", "isinf", "isnan", "mean_dim", "var_mean", "scatter_add"}


def kind_of(name: str) -> str:
    """The kind of an op from its short name (aten overload packet, function or module class)."""
    for kind, names in (("matmul", MATMUL), ("attention", ATTENTION), ("fused", FUSED),
                        ("embedding", EMBEDDING), ("norm", NORM), ("softmax", SOFTMAX),
                        ("dropout", DROPOUT), ("loss", LOSS), ("view", VIEW),
                        ("constant", CONSTANT)):
        if name in names:
            return kind
    if name in SAVES_OUTPUT or name in SAVES_INPUT or name in PRODUCTS or name in NO_SAVE:
        return "elementwise"
    return "other"


COMPUTE_BOUND = frozenset({"matmul", "attention", "fused"})
FREE = ("view", "constant", "input")
"""Op kinds that do no work of their own (views, constants, the block's inputs)."""
MEMORY_BOUND = frozenset({"embedding", "norm", "softmax", "dropout", "loss", "elementwise", "other"})


@dataclass(frozen=True)
class TensorRef:
    """One tensor operand as the save rules see it."""

    key: str
    """Identity for de-duplication: the name of the op that owns the storage (views resolved)."""
    nbytes: float
    """Size in bytes."""
    requires_grad: bool
    """Whether a gradient flows through it."""
    is_param: bool = False
    """Parameters are model state, never activation memory."""


def saved_tensors(name: str, kind: str, inputs: list[TensorRef], output: TensorRef,
                  out_numel: float, op_key: str) -> list[tuple[str, float]]:
    """(key, bytes) of the activations this op keeps alive until its backward."""
    if not output.requires_grad:
        return []
    acts = [x for x in inputs if not x.is_param]

    def others_need_grad(x: TensorRef) -> bool:
        return any(o.requires_grad for o in inputs if o is not x)

    if kind in ("matmul", "fused"):
        kept = [x for x in acts if others_need_grad(x)]
        if kind == "fused":
            kept.append(output)
        return _pairs(kept)
    if kind == "attention":
        return _pairs(acts[:3] + [output])
    if kind in ("norm", "loss"):
        return _pairs(acts[:1])
    if kind == "softmax":
        return _pairs([output])
    if kind == "dropout":
        return [(f"{op_key}:mask", out_numel * 1.0)]
    if kind in ("view", "constant", "embedding", "input"):
        return []
    if name in SAVES_OUTPUT:
        return _pairs([output])
    if name in PRODUCTS:
        return _pairs([x for x in acts if others_need_grad(x)])
    if name in SAVES_INPUT:
        return _pairs(acts[:1])
    if name in NO_SAVE:
        return []
    return _pairs([x for x in acts if x.requires_grad])


def _pairs(refs: list[TensorRef]) -> list[tuple[str, float]]:
    seen, out = set(), []
    for r in refs:
        if r.key not in seen and not r.is_param:
            seen.add(r.key)
            out.append((r.key, r.nbytes))
    return out
