"""Does the planner order configurations as measurements do? Kendall's tau between predicted and
published throughput, per published sweep (the same model, hardware and batch; configurations
pinned as published).

Sweeps (each row's numbers as published):

- torchtitan, Llama 3.1 8B FSDP on 8 H100 (pytorch/torchtitan
  benchmarks/llama3_h100_202412_torchtitan.md, Table 1; benchmarks/data/torchtitan_runs.csv): eager,
  torch.compile, torch.compile + Float8 — the software a configuration runs with.
- torchtitan, Llama 3.1 405B on 512 H100, FSDP 8 x TP 8 x PP 8, local batch 32, global batch
  256, full activation checkpointing, torch.compile + Float8 (same page, Table 5): 1F1B (100
  tokens/s per GPU) against interleaved 1F1B (128). The page gives neither the interleaved
  schedule's stages per rank nor the micro-batch count; 2 stages per rank and torchtitan's
  default of as many micro-batches as pipeline ranks (8 of 4 sequences) are assumed.

The Megatron-LM SC'21 paper's sweeps of tensor x pipeline splits and micro-batch sizes (Narayanan
et al. 2021, Figures 13-16) are published as bar charts without the numbers; they are not used.

Usage:  python benchmarks/ranking.py
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import planner  # noqa: E402
import torchtitan_runs as titan  # noqa: E402
from costmodels.engine import engine_from_mapping  # noqa: E402
from planner.options import parse_fix  # noqa: E402

LLAMA31_405B = {  # meta-llama/Llama-3.1-405B config.json
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 16384,
    "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
SCHEDULES_405B = [("1F1B", "schedule=1f1b", 100.0),
                  ("interleaved 1F1B (2 stages per rank, assumed)",
                   "schedule=interleaved-1f1b,vpp=2", 128.0)]


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a of two equally long sequences (ties count as neither)."""
    pairs = list(itertools.combinations(range(len(a)), 2))
    score = sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs) - \
        sum((a[i] - a[j]) * (b[i] - b[j]) < 0 for i, j in pairs)
    return score / len(pairs)


def prepare(config: dict, seq_len: int):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        return planner.prepare(path, seq_len=seq_len, dtype="bf16")


def sweep_torchtitan_8b(peaks) -> list[tuple[str, float, float]]:
    import csv

    with open(titan.DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    prepared = prepare(titan.LLAMA31_8B, 8192)
    return [(r["techniques"], float(r["tokens_per_s_per_gpu"]),
             titan.predict(prepared, r, *peaks).predicted["tokens_per_s"] / int(r["gpus"]))
            for r in rows]


def sweep_torchtitan_405b(peaks) -> list[tuple[str, float, float]]:
    prepared = prepare(LLAMA31_405B, 8192)
    cluster = titan.cluster(*peaks, nodes=64)
    training = planner.TrainingSpec(global_batch=256, seq_len=8192, dtype="fp8", optimizer="adamw",
                                    engine=engine_from_mapping("torchtitan-compile"))
    out = []
    for name, pins, measured in SCHEDULES_405B:
        fix = parse_fix(f"dp=8,tp=8,pp=8,zero=3,micro_batch=4,recompute=full,{pins},"
                        "offload_optimizer=false")
        plan = planner.plan_prepared(prepared, cluster, training,
                                     planner.SearchOptions(fix=fix, top_k=0))
        out.append((name, measured, plan.predicted["tokens_per_s"] / 512))
    return out


def main() -> int:
    sweeps = {"torchtitan Llama 3.1 8B, FSDP on 8 H100: software": sweep_torchtitan_8b,
              "torchtitan Llama 3.1 405B, 512 H100 (8 x 8 x 8): pipeline schedule":
                  sweep_torchtitan_405b}
    for title, run in sweeps.items():
        for label, peaks in titan.PEAKS.items():
            rows = run(peaks)
            tau = kendall_tau([m for _, m, _ in rows], [p for _, _, p in rows])
            print(f"{title} (peak: {label}): Kendall tau {tau:+.2f} over {len(rows)} configurations")
            for name, measured, predicted in rows:
                print(f"    {name:48s} measured {measured:8,.0f}  predicted {predicted:8,.0f} "
                      "tokens/s per GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
