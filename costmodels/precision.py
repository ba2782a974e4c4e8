"""What the training precision changes in a step's cost.

``bf16`` / ``fp16``: mixed precision (Micikevicius et al., ICLR'18): 16-bit weights, activations
and gradients, fp32 master weights and optimizer states. ``fp32``: everything in fp32.

``fp8``: FP8 training as NVIDIA Transformer Engine runs it (Micikevicius et al., "FP8 Formats for
Deep Learning", 2022; Transformer Engine user guide, "Using FP8 with Transformer Engine"):

- the GEMMs of weights (a Linear's forward, input gradient and weight gradient) of the repeated
  layers run on FP8 operands at the device's dense FP8 peak; attention cores, norms, softmax and
  element-wise ops stay in bf16, and so do the stored weights, activations and gradients. The
  blocks outside the layers (embedding, final norm, output projection) stay in bf16 altogether:
  Megatron-Core's output layer is a plain tensor-parallel Linear, not a Transformer Engine module
  that fp8_autocast converts, and torchtitan's configs leave ``output`` out of its Float8
  converter (``filter_fqns``, whose default is empty: the torchtitan export writes it); a model without repeated layers runs all of its GEMMs in FP8;
- every FP8 GEMM input is quantized. Transformer Engine fuses the cast into the kernel that makes
  the tensor (LayerNormLinear, the activation before the second MLP Linear), so what is counted is
  the FP8 write and the scaling work: ``delayed`` scaling takes the scale from an amax history (one
  1-byte write per element); ``current`` scaling first finds the tensor's absolute maximum (a
  2-byte read more); ``block`` scaling (MXFP8, 32-element blocks, Blackwell) computes scales in the
  same pass but writes a row-wise and a column-wise copy, since the weight-gradient GEMM reads the
  transpose (2 x 1 byte). In backward the output gradient is quantized the same way;
- each layer weight has an FP8 copy, row- and column-wise (2 bytes per parameter), kept for the
  whole step ("FP8 weight caching") and refreshed from the bf16 weights after the optimizer step
  (read 2, write 2 bytes per parameter);
- a Linear saves its input for the weight gradient in FP8 (1 byte instead of 2);
- under sequence parallelism the all-gathers of a layer's GEMM inputs (a column-parallel
  Linear's input, forward, and again for its weight gradient; a row-parallel Linear's output
  gradient, backward) carry the FP8 tensor, quantized before it is gathered (under MXFP8 the
  output gradient row- and column-wise, with block scales); the reduce-scatters stay bf16
  (sp_gather_shares).

torchao's float8 and MX training (``fp8_linear=torchao``: torchtitan's Float8 and MX converters,
its Float8Linear's autograd function ``matmul_with_hp_or_float8_args``) runs the same FP8 GEMMs
with less kept: the function saves the 16-bit input and weight, not FP8 ones, and casts both
again in backward; it keeps no FP8 copies of the weights, so it casts every weight in each
forward and again in each backward (its recipe_name configurations gather 16-bit weights: no
``enable_fsdp_float8_all_gather``); the output gradient is cast once for each gradient GEMM.
Each cast makes the one orientation its GEMM reads (torchao_cast_bytes); one of a tensor no
kernel has just made reads its 16 bits too (HIGH_PRECISION_READ_BYTES), and so does every cast
in eager mode, where no kernel fuses it into the one making the tensor. torchtitan 0.2.2's
tensor parallelism gathers 16-bit (sp_gather_shares). Its memory then matches bf16 training's, as
torchtitan's published Float8 runs show (pytorch/torchtitan benchmarks/
llama3_h100_202412_torchtitan.md, Tables 1 and 3: 76.8 against 77.0 GiB, 61.8 against 62.0).
"""

from __future__ import annotations

from typing import Literal, get_args

from costmodels.errors import SpecError

Fp8Recipe = Literal["delayed", "current", "block"]
FP8_RECIPES: tuple[str, ...] = get_args(Fp8Recipe)
FP8_RECIPE_ALIASES = {"tensorwise": "current", "mxfp8": "block"}
"""Megatron-LM's --fp8-recipe names (and torchao's) for the recipes: per-tensor current scaling,
MXFP8 blocks."""

FP8_LINEARS = ("te", "torchao")
"""How a Linear trains in FP8 (module docstring): ``te`` (Transformer Engine: FP8 weight copies
kept, inputs saved in FP8, casts fused into the kernels making them; Megatron-Core, DeepSpeed) or
``torchao`` (16-bit input and weight saved, both cast again in backward; torchtitan)."""
SCALE_BYTES = {"delayed": 0.0, "current": 0.0, "block": 1.0 / 32}
"""Scale bytes per element an FP8 tensor carries besides its 1-byte values: MXFP8's one 8-bit
scale per 32-element block; one scale per tensor otherwise."""
HIGH_PRECISION_READ_BYTES = 2.0
"""Bytes per element a cast reads when it is a kernel of its own (a torchao cast of a weight or
of a saved input, or any cast in eager mode): the 16-bit tensor."""


def check_recipe(device, dtype: str, recipe: str) -> None:
    """Refuse the ``block`` recipe (MXFP8) on a device without block-scaled FP8 GEMMs
    (DeviceSpec.fp8_block_scaling: Blackwell and newer)."""
    if dtype == "fp8" and recipe == "block" and not device.fp8_block_scaling:
        raise SpecError(f"engine.fp8_recipe: block (MXFP8) needs block-scaled FP8 tensor cores "
                        f"(Blackwell, sm100+), which {device.name} has not; use fp8_recipe=current "
                        "or delayed (or a cluster file's device with fp8_block_scaling: true). "
                        "Hopper's software block scaling (Transformer Engine's "
                        "Float8BlockScaling, Megatron's --fp8-recipe blockwise) is not modelled; "
                        "current scaling is the nearest priced")


CAST_BYTES = {"delayed": 1.0, "current": 3.0, "block": 2.0}
"""Bytes moved per element to quantize one FP8 GEMM input, beyond the bf16 kernel that makes it:
the FP8 write(s), and for current scaling the amax read (see the module docstring)."""
FP8_WEIGHT_COPY_BYTES = 2.0
"""FP8 bytes kept per parameter: row-wise and column-wise copies."""
FP8_WEIGHT_REFRESH_BYTES = 4.0
"""Bytes moved per parameter to refresh the FP8 copies after the optimizer step."""
FP8_SAVED_INPUT_SHARE = 0.5
"""A Linear input saved for backward in FP8 keeps 1 of its 2 bf16 bytes."""


def core_dtype(dtype: str) -> str:
    """The dtype of everything but the weight GEMMs (attention, norms, element-wise, storage)."""
    return "bf16" if dtype == "fp8" else dtype


def gemm_dtype(dtype: str, weight_gemm: bool) -> str:
    """The dtype a GEMM runs in: FP8 for the GEMMs of weights when training in fp8."""
    return "fp8" if dtype == "fp8" and weight_gemm else core_dtype(dtype)


def operand_bytes(gemm_dtype_: str) -> float:
    """Bytes of one GEMM operand element."""
    return {"fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}[gemm_dtype_]


def cast_bytes(recipe: str) -> float:
    """Bytes moved per element to quantize an FP8 GEMM input under ``recipe``."""
    if recipe not in CAST_BYTES:
        raise SpecError(f"engine.fp8_recipe: expected one of {', '.join(FP8_RECIPES)}, got "
                        f"{recipe!r}")
    return CAST_BYTES[recipe]


def quantized_bytes(recipe: str) -> float:
    """Bytes per element of one FP8 orientation of a tensor: the values and their scales."""
    return operand_bytes("fp8") + SCALE_BYTES[recipe]


def torchao_cast_bytes(recipe: str) -> float:
    """Bytes per element, beyond the kernel making the tensor, of one torchao cast: tensorwise
    from the current amax (a 2-byte read and the 1-byte write; torchao has no delayed scaling,
    and the torchtitan export writes tensorwise for it), or an MX cast of the one orientation its
    GEMM reads (the values and their block scales, in one pass)."""
    return quantized_bytes("block") if recipe == "block" else CAST_BYTES["current"]


def sp_gather_shares(linear: str, recipe: str) -> tuple[float, float]:
    """(inputs, gradients): the shares of their 16-bit bytes that sequence parallelism's
    all-gathers of a layer's FP8 GEMM operands carry: a column-parallel Linear's input (forward,
    and again for its weight gradient), a row-parallel Linear's output gradient (backward).
    Transformer Engine quantizes before it gathers (its Linear and LayerNormLinear gather FP8
    tensors with their scales; under MXFP8 the output gradient both row- and column-wise, for
    the two GEMMs it feeds). torchtitan 0.2.2 gathers 16-bit: its float8 tensor parallelism
    (Float8ColwiseParallel) is switched on by a converter named "float8", and the converter the
    export writes is "quantize.linear.float8" (models' parallelize.py, enable_float8_linear)."""
    if linear == "torchao":
        return 1.0, 1.0
    values = quantized_bytes(recipe) / operand_bytes("bf16")
    return values, (2.0 if recipe == "block" else 1.0) * values
