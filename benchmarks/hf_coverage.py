"""Which Hugging Face architectures the planner traces, and whether it counts their FLOPs right.

For each architecture of the corpus below (tiny dimensions: 3 layers, hidden 64, built from a config
on the meta device, as the planner builds any model), the planner traces the model and prices its
ops; the FLOPs of one training step (forward + backward, per sample) that the plan would count are
compared with ``torch.utils.flop_counter.FlopCounterMode`` counting a real forward and backward of
the same model (same config, random weights, batch 1) on this CPU.

FlopCounterMode counts GEMMs, convolutions and the attention kernels of CUDA; the reference adds
formulas, the same as the planner's, for the kernels it has none for on a CPU: fused attention on
CPUs (``_scaled_dot_product_flash_attention_for_cpu`` and its backward: QK^T and attention x V,
twice that in backward) and the grouped GEMMs of routed experts (``_grouped_mm``: 2 M K N over all
rows). Without them the reference would count CPU attention and experts as free. It also replaces
the formula of a convolution's backward, which counts a grouped (depthwise) convolution's weight
gradient as if it were not grouped (``groups`` times too many): each gradient a grouped
convolution computes costs what its forward does.

Usage:  python benchmarks/hf_coverage.py [--write]    (--write: docs/coverage.md)
The same corpus runs in `make test` (tests/planner/trace/test_coverage.py): every row within 2%.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

TEXT = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
            vocab_size=256, max_position_embeddings=128)
GQA = dict(TEXT, num_key_value_heads=2)
VISION = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
              image_size=32, patch_size=8, num_labels=10)
TOWER_TEXT = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=128, vocab_size=256, max_position_embeddings=64)
TOWER_VISION = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                    intermediate_size=128, image_size=32, patch_size=8)

CORPUS: dict[str, dict] = {
    # decoder-only
    "llama": dict(GQA, model_type="llama"),
    "mistral": dict(GQA, model_type="mistral", sliding_window=16),
    "qwen2": dict(GQA, model_type="qwen2"),
    "qwen3": dict(GQA, model_type="qwen3", head_dim=16),
    "gemma2": dict(GQA, model_type="gemma2", head_dim=16, sliding_window=16,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3": dict(GQA, model_type="gemma3_text", head_dim=16, sliding_window=16),
    "phi3": dict(GQA, model_type="phi3", pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "phi": dict(TEXT, model_type="phi"),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=3, n_head=4, vocab_size=256,
                 n_positions=128),
    "gptj": dict(model_type="gptj", n_embd=64, n_layer=3, n_head=4, vocab_size=256,
                 n_positions=128, rotary_dim=8),
    "gpt_bigcode": dict(model_type="gpt_bigcode", n_embd=64, n_layer=3, n_head=4,
                        vocab_size=256, n_positions=128),
    "gpt_neox": dict(TEXT, model_type="gpt_neox"),
    "falcon": dict(TEXT, model_type="falcon"),
    "bloom": dict(model_type="bloom", hidden_size=64, n_layer=3, n_head=4, vocab_size=256),
    "opt": dict(TEXT, model_type="opt", ffn_dim=128, word_embed_proj_dim=64),
    "mpt": dict(model_type="mpt", d_model=64, n_layers=3, n_heads=4, vocab_size=256,
                max_seq_len=128),
    "stablelm": dict(GQA, model_type="stablelm"),
    "olmo": dict(TEXT, model_type="olmo"),
    "starcoder2": dict(GQA, model_type="starcoder2"),
    "granite": dict(GQA, model_type="granite"),
    # encoder-only
    "bert": dict(TEXT, model_type="bert"),
    "roberta": dict(TEXT, model_type="roberta", pad_token_id=1),
    "deberta-v2": dict(TEXT, model_type="deberta-v2"),
    "electra": dict(TEXT, model_type="electra", embedding_size=64),
    "distilbert": dict(model_type="distilbert", dim=64, n_layers=3, n_heads=4, hidden_dim=128,
                       vocab_size=256, max_position_embeddings=128),
    # encoder-decoder
    "t5": dict(model_type="t5", d_model=64, d_ff=128, d_kv=16, num_layers=3, num_heads=4,
               vocab_size=256, decoder_start_token_id=0, pad_token_id=0),
    "bart": dict(model_type="bart", d_model=64, encoder_layers=3, decoder_layers=3,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                 decoder_ffn_dim=128, vocab_size=256, max_position_embeddings=128),
    "whisper": dict(model_type="whisper", d_model=64, encoder_layers=3, decoder_layers=3,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                    decoder_ffn_dim=128, vocab_size=256, num_mel_bins=16,
                    max_source_positions=32, max_target_positions=64, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
    # vision
    "vit": dict(VISION, model_type="vit"),
    "deit": dict(VISION, model_type="deit"),
    "dinov2": dict(VISION, model_type="dinov2"),
    "swin": dict(model_type="swin", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                 num_heads=[2, 2], window_size=4, num_labels=10),
    "convnext": dict(model_type="convnext", image_size=32, hidden_sizes=[16, 32],
                     depths=[1, 1], num_stages=2, num_labels=10),
    "clip": dict(model_type="clip", text_config=TOWER_TEXT, vision_config=TOWER_VISION,
                 projection_dim=32),
    "siglip": dict(model_type="siglip", text_config=TOWER_TEXT, vision_config=TOWER_VISION),
    # mixture of experts: the routed top-k experts' FLOPs, never all experts
    "mixtral": dict(GQA, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(GQA, model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=64, shared_expert_intermediate_size=64),
    "qwen3_moe": dict(GQA, model_type="qwen3_moe", head_dim=16, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=64),
    "deepseek_v3": dict(TEXT, model_type="deepseek_v3", num_key_value_heads=4, q_lora_rank=32,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                        moe_intermediate_size=64, first_k_dense_replace=1, n_group=1,
                        topk_group=1),
}
"""Architecture -> tiny config.json."""
SEQ = 32
"""Tokens of text per sample."""


@dataclass
class Row:
    name: str
    method: str = ""
    ops: int = 0
    blocks: int = 0
    attention: str = ""
    planned: float = 0.0
    """Training FLOPs per sample the planner counts."""
    measured: float = 0.0
    """FlopCounterMode's count of a real forward + backward."""
    error: str = ""

    @property
    def deviation(self) -> float:
        return self.planned / self.measured - 1 if self.measured else float("inf")


def reference_flops(config: dict, seq_len: int) -> float:
    """FLOPs of one forward and backward of the model of ``config`` on the CPU."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig

    from planner.trace import hf

    raw = dict(config)
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    built = hf.build(cfg, "", seq_len, torch.float32, "cpu")
    built.module.train()
    with FlopCounterMode(display=False, custom_mapping=_cpu_formulas()) as counter:
        out = built.module(*built.args, **built.kwargs)
        loss = out.loss if getattr(out, "loss", None) is not None else out[0]
        loss.backward()
    return float(counter.get_total_flops())


def _cpu_formulas() -> dict:
    """FLOP formulas for the CPU kernels FlopCounterMode has none for (see the module docstring)."""
    import torch
    from torch.utils.flop_counter import conv_flop_count

    from planner.trace.aten import grouped_mm_flops

    aten = torch.ops.aten

    def attention(q, k, v, *args, out_shape=None, **kwargs) -> int:
        b, h, s_q, d = q
        return 2 * b * h * s_q * k[-2] * (d + v[-1])

    def attention_backward(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
        return 2 * attention(q, k, v)

    def grouped(a, b, *args, out_shape=None, **kwargs) -> int:
        return int(grouped_mm_flops(a, b, out_shape))

    def conv_backward(grad_out, x, w, _bias, _stride, _padding, _dilation, transposed,
                      _out_padding, _groups, output_mask, out_shape=None) -> int:
        forward = conv_flop_count(x, w, grad_out, transposed)
        return forward * (int(output_mask[0]) + int(output_mask[1]))

    out = {aten._scaled_dot_product_flash_attention_for_cpu: attention,
           aten._scaled_dot_product_flash_attention_for_cpu_backward: attention_backward,
           aten.convolution_backward: conv_backward}
    if hasattr(aten, "_grouped_mm"):
        out[aten._grouped_mm] = grouped
    return out


def planned_flops(config: dict, seq_len: int) -> Row:
    """Trace ``config`` as `plan` does; the training FLOPs per sample its blocks count."""
    from planner.api import prepare

    name = config["model_type"]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        prepared = prepare(path, seq_len=seq_len, dtype="fp32")
    flops = sum(b.work.fwd_flops + b.work.bwd_flops for b in prepared.blocks.blocks)
    return Row(name=name, method=prepared.opgraph.method, ops=len(prepared.opgraph.ops),
               blocks=len(prepared.blocks.blocks), attention=prepared.info.get("attention", ""),
               planned=flops)


def check(name: str) -> Row:
    """One corpus row: trace and count, or the one-line error of either side."""
    config = CORPUS[name]
    try:
        row = planned_flops(config, SEQ)
    except Exception as exc:  # noqa: BLE001 - a row reports its failure
        return Row(name=name, error=f"trace: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    row.name = name
    try:
        row.measured = reference_flops(config, SEQ)
    except Exception as exc:  # noqa: BLE001
        row.error = f"reference: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return row


def markdown(rows: list[Row], seconds: float) -> str:
    lines = ["# Coverage: Hugging Face architectures the planner traces", "",
             "Written by `python benchmarks/hf_coverage.py --write`; the same corpus runs in "
             "`make test` (tests/planner/trace/test_coverage.py), which fails on any row off by "
             "2% or more. Tiny configs (3 layers, hidden 64; text of 32 tokens, images of "
             "32 x 32), batch 1, fp32.", "",
             "*planned*: the FLOPs of one training step (forward + backward) that the planner's "
             "trace counts, per sample; *measured*: `torch.utils.flop_counter.FlopCounterMode` "
             "over a real forward and backward of the same model on the CPU, with formulas added "
             "for CPU attention and grouped expert GEMMs, and a grouped convolution's backward "
             "counted as grouped (benchmarks/hf_coverage.py says why).",
             "", "| architecture | traced with | attention | ops | blocks | planned FLOPs | "
             "measured FLOPs | deviation |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.name} | failed: {r.error} | | | | | | |")
            continue
        lines.append(f"| {r.name} | {r.method} | {r.attention} | {r.ops} | {r.blocks} | "
                     f"{r.planned:.4g} | {r.measured:.4g} | {100 * r.deviation:+.2f}% |")
    ok = [r for r in rows if not r.error]
    worst = max((abs(r.deviation) for r in ok), default=float("nan"))
    lines += ["", f"{len(ok)} of {len(rows)} architectures traced and counted; largest deviation "
              f"{100 * worst:.2f}%. ({seconds:.0f} s on this machine.)"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write docs/coverage.md")
    ap.add_argument("names", nargs="*", help="architectures of the corpus (default: all)")
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)
    t0 = time.perf_counter()
    rows = [check(n) for n in (args.names or CORPUS)]
    text = markdown(rows, time.perf_counter() - t0)
    print(text)
    if args.write:
        with open(os.path.join(os.path.dirname(HERE), "docs", "coverage.md"), "w",
                  encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
