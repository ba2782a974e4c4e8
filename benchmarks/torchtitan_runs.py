"""FSDP as torchtitan runs it: predicted vs published throughput and memory.

Fitted on: pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1
(benchmarks/data/torchtitan_runs.csv, a copy of the project's reference data): Llama 3.1 8B on
8 H100, FSDP, local batch 2 x 8,192 tokens, op-level selective activation checkpointing; eager,
torch.compile, torch.compile + Float8.

Held out (benchmarks/data/torchtitan_more_runs.csv, not in the reference data): the same page's
Table 3 (the three Table 1 settings on 128 GPUs, 16 hosts) and Table 2 (FSDP x context
parallelism over 8 GPUs, full checkpointing, torch.compile + Float8, 32k to 262k tokens per
sequence), and a run on 32 and 64 H200 (Trainy, June 2025:
benchmarks/llama3_8b_h200_2025-06_torchtitan.md; torch.compile + Float8, local batch 2 x 8,192,
torchtitan's llama3_8b.toml: op-level selective checkpointing).

The H100s are as the page describes them: Grand Teton hosts, 8 H100 fully connected with NVLink
(NVLink 4: 450 GB/s per GPU per direction), 96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU, and
"the default 500W power limit, although tuning it up to 700W TDP can potentially provide further
speedups". What tensor-core rate a 700 W part sustains at a 500 W limit is not published (the
page: "between SXM and NVL, and we don't know its exact value"). One constant is fitted: that
rate, stated as the dense bf16 peak of a data sheet (FP8 twice it: the same clock), on the three
Table 1 rows (least squares of the relative throughput error); every efficiency stays the cost
model's (GEMMs 0.70 of the peak; SDPA's FlashAttention-2 kernels 37% forward and 33% backward, as
the FlashAttention-3 paper measures them on H100). For comparison the rows are also priced at
the data-sheet estimate: the clock linear in power between the H100 NVL (400 W: 835 bf16, 1,671
FP8 TFLOP/s, 1.545 GHz) and SXM (700 W: 989, 1,979, 1.83 GHz) data sheets, 886 and 1,774 at
500 W. The fit lands below the NVL data sheet: a sustained rate under a power cap may (data-sheet
peaks are boost-clock figures), but the one constant also takes up whatever else the model misses
in these runs, which is why other tables are held out. The H200 rows need no such constant: they
are priced at the h200 preset's data sheet (the SXM part, up to 700 W; the page states no power
limit).

Software per row (costmodels.engine presets): eager -> ``torchtitan`` (SDPA's flash backend, one
kernel per element-wise op, FSDP2 buffer copies), torch.compile -> ``torchtitan-compile``
(element-wise chains of each block fused), Float8 -> the same with ``--dtype fp8`` and current
(tensor-wise dynamic) scaling, the output layer in bf16 (torchtitan's llama3 configs leave
``output`` out of the Float8 converter: filter_fqns). Recomputation as published: torchtitan's op-level selective checkpointing
(``recompute=op``) or full; ZeRO-3 (FSDP2 resharding after forward) over the data-parallel and
context-parallel ranks; context parallelism with torchtitan's default all-gather of K/V.

Memory: torchtitan logs the allocator's reserved peak; the planner predicts the allocated peak and
budgets ``memory_reserve_fraction`` (5%) of the device for fragmentation, so the comparison is
against allocated / (1 - 0.05). The H200 rows gather Float8 weights in FSDP (half the gather
buffer), which the planner does not model.

Usage:  python benchmarks/torchtitan_runs.py [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
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

DATA = os.path.join(HERE, "data", "torchtitan_runs.csv")
HELD_OUT = os.path.join(HERE, "data", "torchtitan_more_runs.csv")
LLAMA31_8B = {  # meta-llama/Llama-3.1-8B config.json
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
SXM = (700, 989, 1979)
NVL = (400, 835, 1671)
"""(watts, dense bf16, dense FP8 TFLOP/s) of the H100 SXM and H100 NVL data sheets."""
POWER_W = 500
TFLOPS_PER_GHZ = 132 * 4096 / 1e3
"""Dense bf16 TFLOP/s per GHz of an H100 (132 SMs, 4,096 FLOP per SM per clock)."""


def at_power(watts: float) -> tuple[float, float]:
    """(bf16, fp8) peak at ``watts``, linear in power between the NVL and SXM data sheets."""
    w = (watts - NVL[0]) / (SXM[0] - NVL[0])
    return NVL[1] + w * (SXM[1] - NVL[1]), NVL[2] + w * (SXM[2] - NVL[2])


PEAKS = {"500 W": at_power(POWER_W), "SXM bound": SXM[1:], "NVL bound": NVL[1:]}
"""(bf16, fp8) dense TFLOP/s: the data-sheet estimate at 500 W, and the ends of the range the
page gives."""
RESERVE_FRACTION = planner.SearchOptions().memory_reserve_fraction
GIB = 2 ** 30
LINKS = {"intra_node": {"bandwidth_GBps": 450, "latency_us": 3, "efficiency": 0.82},
         "inter_node": {"bandwidth_GBps": 50, "latency_us": 10, "efficiency": 0.9}}
"""NVLink 4 within a host, 400 Gb/s RDMA per GPU between hosts (both pages)."""


def cluster(bf16: float, fp8: float, nodes: int = 1):
    """Grand Teton hosts whose H100s sustain ``bf16`` / ``fp8`` as their dense peaks."""
    return planner.load_cluster({
        "name": "grand-teton", "nodes": nodes, "gpus_per_node": 8,
        "device": {"name": "h100-grand-teton", "memory_GB": 96, "hbm_GBps": 2400,
                   "peak_TFLOPs": {"bf16": bf16, "fp16": bf16, "fp32": 67, "fp8": fp8},
                   "sm_count": 132, **HOPPER_KERNELS,
                   "description": "H100 96 GB HBM2e, 500 W (torchtitan's benchmark hosts)"},
        **LINKS})


def h200_cluster(nodes: int):
    """H200 hosts: the h200 preset's data sheet (the SXM part)."""
    return planner.load_cluster({"name": "h200-hosts", "nodes": nodes, "gpus_per_node": 8,
                                 "device": "h200", **LINKS})


def software(techniques: str) -> tuple[str, str]:
    """(engine preset, dtype) of a row's techniques."""
    if "Float8" in techniques:
        return "torchtitan-compile", "fp8"
    if "compile" in techniques:
        return "torchtitan-compile", "bf16"
    return "torchtitan", "bf16"


_PREPARED: dict[int, object] = {}


def prepared_for(seq_len: int):
    """Llama 3.1 8B traced at ``seq_len`` tokens (once per length)."""
    if seq_len not in _PREPARED:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "config.json")
            with open(path, "w") as f:
                json.dump(LLAMA31_8B, f)
            _PREPARED[seq_len] = planner.prepare(path, seq_len=seq_len, dtype="bf16")
    return _PREPARED[seq_len]


def plan_row(row: dict, clus, prepared=None):
    """The row's published configuration priced on ``clus``."""
    engine, dtype = software(row["techniques"])
    gpus, local, seq = int(row["gpus"]), int(row["local_batch"]), int(row["seq_len"])
    dp, cp = int(row.get("dp") or gpus), int(row.get("cp") or 1)
    recompute = "full" if row["activation_checkpointing"] == "full" else "op"
    training = planner.TrainingSpec(global_batch=dp * local, seq_len=seq, dtype=dtype,
                                    optimizer="adamw", engine=engine_from_mapping(engine))
    pins = (f"dp={dp},cp={cp},tp=1,pp=1,zero=3,micro_batch={local},recompute={recompute},"
            "offload_optimizer=false" + (",cp_comm=allgather" if cp > 1 else ""))
    return planner.plan_prepared(prepared or prepared_for(seq), clus, training,
                                 planner.SearchOptions(fix=parse_fix(pins), top_k=0))


def predict(prepared, row: dict, bf16: float, fp8: float):
    """A Grand Teton row priced with the H100 sustaining ``bf16`` / ``fp8`` TFLOP/s."""
    return plan_row(row, cluster(bf16, fp8, nodes=max(1, int(row["gpus"]) // 8)), prepared)


def predicted(plan, row: dict) -> tuple[float, float]:
    """(tokens/s per GPU, reserved GiB) the plan predicts for the row."""
    return (plan.predicted["tokens_per_s"] / int(row["gpus"]),
            plan.predicted["peak_memory_bytes"] / (1 - RESERVE_FRACTION) / GIB)


def tput_error(row: dict, bf16: float) -> float:
    return predicted(predict(None, row, bf16, 2 * bf16), row)[0] / \
        float(row["tokens_per_s_per_gpu"]) - 1


def fit_rate(rows: list[dict]) -> float:
    """The dense bf16 TFLOP/s (FP8 twice it) minimizing the squared relative throughput errors
    of ``rows``: 5 TFLOP/s steps from three quarters of the NVL data sheet up to the SXM one,
    then 0.5 around the best."""
    def cost(bf16: float) -> float:
        return sum(tput_error(r, bf16) ** 2 for r in rows)

    grid = [0.75 * NVL[1] + 5 * i for i in range(int((SXM[1] - 0.75 * NVL[1]) / 5) + 1)]
    best = min(grid, key=cost)
    return min((best + 0.5 * i for i in range(-10, 11)), key=cost)


def cells(row: dict, plan) -> tuple[list[str], float, float]:
    tps, gib = predicted(plan, row)
    m_tps, m_gib = float(row["tokens_per_s_per_gpu"]), float(row["peak_memory_gib"])
    e_tps, e_gib = tps / m_tps - 1, gib / m_gib - 1
    return ([f"{m_tps:,.0f}", f"{tps:,.0f} ({100 * e_tps:+.1f}%)",
             f"{m_gib:.1f}", f"{gib:.1f} ({100 * e_gib:+.1f}%)"], e_tps, e_gib)


def label(row: dict) -> list[str]:
    cp = int(row.get("cp") or 1)
    return [row.get("table", "Table 1"), row["gpu"].split(" (")[0], row["gpus"],
            f"{row['dp']}x{cp}" if cp > 1 else row.get("dp") or row["gpus"],
            f"{row['local_batch']} x {int(row['seq_len']):,}", row["activation_checkpointing"],
            row["techniques"]]


SUMMARIES = {
    "fit (Table 1)": "the three rows the rate is fitted on",
    "held out, Table 3": "Table 1's three settings on 128 GPUs",
    "held out, Table 2": "context parallelism, 32k-262k tokens",
    "held out, H100": "Tables 2 and 3 together",
    "H200": "priced at the H200 data sheet: the fitted rate takes no part",
}
"""The groups whose errors are summarized apart, with what each is."""


def summary_of(group: str, r: dict) -> str:
    """The summary (SUMMARIES) a row of ``group`` (fit or held out) counts in."""
    if r["gpu"] == "H200":
        return "H200"
    return "fit (Table 1)" if group == "fit" else f"held out, {r['table']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    with open(DATA, newline="") as f:
        fit_rows = list(csv.DictReader(f))
    with open(HELD_OUT, newline="") as f:
        held = list(csv.DictReader(f))
    rate = fit_rate(fit_rows)
    sheet = PEAKS["500 W"]
    print(f"500 W H100 sustained rate, fitted on Table 1: {rate:.1f} dense bf16 TFLOP/s "
          f"({rate / TFLOPS_PER_GHZ:.2f} GHz; FP8 {2 * rate:.0f}); the data-sheet estimate at "
          f"500 W is {sheet[0]:.0f} ({sheet[0] / TFLOPS_PER_GHZ:.2f} GHz)\n")
    head = ["set", "table", "GPU", "GPUs", "dp x cp", "local batch", "checkpointing",
            "techniques", "measured tok/s/GPU", "predicted", "measured GiB", "predicted GiB",
            "data-sheet 500 W tok/s"]
    table = []
    errors = {name: [] for name in SUMMARIES}
    for group, rows in (("fit", fit_rows), ("held out", held)):
        for r in rows:
            r.setdefault("dp", r["gpus"])
            if r["gpu"] == "H200":
                plan = plan_row(r, h200_cluster(int(r["gpus"]) // 8))
                base = "(H200 data sheet)"
            else:
                plan = predict(None, r, rate, 2 * rate)
                ds, _ = predicted(predict(None, r, *sheet), r)
                base = f"{ds:,.0f} ({100 * (ds / float(r['tokens_per_s_per_gpu']) - 1):+.1f}%)"
            row_cells, e_tps, e_gib = cells(r, plan)
            errors[summary_of(group, r)].append((e_tps, e_gib))
            if group == "held out" and r["gpu"] != "H200":
                errors["held out, H100"].append((e_tps, e_gib))
            table.append(["data sheet" if r["gpu"] == "H200" else group, *label(r),
                          *row_cells, base])
    print_table(head, table, args.markdown)
    print()
    for group, errs in errors.items():
        tps = [abs(e) for e, _ in errs]
        gib = [abs(e) for _, e in errs]
        print(f"{'- ' if args.markdown else ''}{group} ({SUMMARIES[group]}): throughput median |error| "
              f"{100 * statistics.median(tps):.1f}%, max {100 * max(tps):.1f}%; memory median "
              f"{100 * statistics.median(gib):.1f}%, max {100 * max(gib):.1f}% (n={len(errs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
