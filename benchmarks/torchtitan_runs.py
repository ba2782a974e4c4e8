"""FSDP as torchtitan runs it: predicted vs published throughput and memory
(../shared/data/torchtitan_runs.csv: Llama 3.1 8B on 8 H100, FSDP, local batch 2 x 8,192 tokens,
op-level selective activation checkpointing; eager, torch.compile, torch.compile + Float8).

The hardware is as the source page describes it (pytorch/torchtitan
benchmarks/llama3_h100_202412_torchtitan.md): Grand Teton hosts, 8 H100 fully connected with
NVLink (NVLink 4: 450 GB/s per GPU per direction), 96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU,
a 500 W power limit. Its dense bf16 peak is not published: the page says it lies between the H100
SXM's (989 TFLOP/s) and the H100 NVL's (835 TFLOP/s, half the 1,671 with sparsity of its data
sheet); FP8 likewise between 1,979 and 1,671. Both are the same GH100 die with 132 SMs, rated at
700 W and 400 W: their peaks are 4,096 bf16 FLOP per SM and clock at 1.83 and 1.545 GHz. The
prediction takes the clock a 500 W budget buys on that line, linear in power between the two data
sheets (1.64 GHz: 886 bf16, 1,774 FP8 TFLOP/s); a cubic law (dynamic power ~ f V^2 with V ~ f, plus
a constant) through the same two points gives 1.65 GHz, within 1%. Every row is also predicted at
both ends of the range.

The device is an H100 (132 SMs; SDPA's FlashAttention-2 kernels at 37% of peak forward and 33%
backward, as the FlashAttention-3 paper measures them on H100).

Software per row (costmodels.engine presets): eager -> ``torchtitan`` (SDPA's flash backend, one
kernel per element-wise op, FSDP2 buffer copies), torch.compile -> ``torchtitan-compile`` (element-wise chains fused),
Float8 -> the same with ``--dtype fp8`` and current (tensor-wise dynamic) scaling. Recomputation
is torchtitan's op-level selective checkpointing (``recompute=op``), ZeRO-3 (FSDP2 resharding
after forward) over the 8 GPUs.

Memory: torchtitan logs the allocator's reserved peak; the planner predicts the allocated peak and
budgets ``memory_reserve_fraction`` (5%) of the device for fragmentation, so the comparison is
against allocated / (1 - 0.05).

Usage:  python benchmarks/torchtitan_runs.py [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import planner  # noqa: E402
from tables import print_table  # noqa: E402
from costmodels.engine import engine_from_mapping  # noqa: E402
from costmodels.hardware import HOPPER_KERNELS  # noqa: E402
from planner.options import parse_fix  # noqa: E402

DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "torchtitan_runs.csv")
LLAMA31_8B = {  # meta-llama/Llama-3.1-8B config.json
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
SXM = (700, 989, 1979)
NVL = (400, 835, 1671)
"""(watts, dense bf16, dense FP8 TFLOP/s) of the H100 SXM and H100 NVL data sheets."""
POWER_W = 500


def at_power(watts: float) -> tuple[float, float]:
    """(bf16, fp8) peak at ``watts``, linear in power between the NVL and SXM data sheets."""
    w = (watts - NVL[0]) / (SXM[0] - NVL[0])
    return NVL[1] + w * (SXM[1] - NVL[1]), NVL[2] + w * (SXM[2] - NVL[2])


PEAKS = {"500 W": at_power(POWER_W), "SXM bound": SXM[1:], "NVL bound": NVL[1:]}
"""(bf16, fp8) dense TFLOP/s: the prediction, and the two ends of the range the page gives."""
RESERVE_FRACTION = planner.SearchOptions().memory_reserve_fraction
GIB = 2 ** 30


def cluster(bf16: float, fp8: float, nodes: int = 1):
    return planner.load_cluster({
        "name": "grand-teton", "nodes": nodes, "gpus_per_node": 8,
        "device": {"name": "h100-grand-teton", "memory_GB": 96, "hbm_GBps": 2400,
                   "peak_TFLOPs": {"bf16": bf16, "fp16": bf16, "fp32": 67, "fp8": fp8},
                   "sm_count": 132, **HOPPER_KERNELS,
                   "description": "H100 96 GB HBM2e, 500 W (torchtitan's benchmark hosts)"},
        "intra_node": {"bandwidth_GBps": 450, "latency_us": 3, "efficiency": 0.82},
        "inter_node": {"bandwidth_GBps": 50, "latency_us": 10, "efficiency": 0.9}})


def software(techniques: str) -> tuple[str, str]:
    """(engine preset, dtype) of a row's techniques."""
    if "Float8" in techniques:
        return "torchtitan-compile", "fp8"
    if "compile" in techniques:
        return "torchtitan-compile", "bf16"
    return "torchtitan", "bf16"


def predict(prepared, row: dict, bf16: float, fp8: float):
    engine, dtype = software(row["techniques"])
    gpus, local = int(row["gpus"]), int(row["local_batch"])
    training = planner.TrainingSpec(global_batch=int(row["global_batch"]),
                                    seq_len=int(row["seq_len"]), dtype=dtype, optimizer="adamw",
                                    engine=engine_from_mapping(engine))
    fix = parse_fix(f"dp={gpus},tp=1,pp=1,zero=3,micro_batch={local},recompute=op,"
                    "offload_optimizer=false")
    return planner.plan_prepared(prepared, cluster(bf16, fp8), training,
                                 planner.SearchOptions(fix=fix, top_k=0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    with open(DATA, newline="") as f:
        rows = list(csv.DictReader(f))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(LLAMA31_8B, f)
        prepared = planner.prepare(path, seq_len=8192, dtype="bf16")
    table = []
    for row in rows:
        measured_tps, measured_gib = float(row["tokens_per_s_per_gpu"]), float(row["peak_memory_gib"])
        cells = [row["techniques"], f"{measured_tps:,.0f}", f"{measured_gib:.1f}"]
        for label, (bf16, fp8) in PEAKS.items():
            plan = predict(prepared, row, bf16, fp8)
            tps = plan.predicted["tokens_per_s"] / int(row["gpus"])
            gib = plan.predicted["peak_memory_bytes"] / (1 - RESERVE_FRACTION) / GIB
            cells += [f"{tps:,.0f} ({100 * (tps / measured_tps - 1):+.1f}%)",
                      f"{gib:.1f} ({100 * (gib / measured_gib - 1):+.1f}%)"]
        table.append(cells)
    head = ["techniques", "measured tok/s/GPU", "measured GiB"]
    for label in PEAKS:
        head += [f"predicted tok/s ({label})", f"predicted GiB ({label})"]
    print("Llama 3.1 8B, FSDP on 8 H100 (Grand Teton, 500 W), local batch 2 x 8,192, op-level "
          "selective checkpointing\n")
    print_table(head, table, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
