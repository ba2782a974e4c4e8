"""Long-sequence training with context parallelism: predicted vs published step time.

Rows: benchmarks/data/long_context_runs.csv (a copy of the project's reference data), NVIDIA NeMo's
long-sequence performance table (docs/source/performance/performance_long_sequence.md): LLAMA2-7B
in FP8 on DGX H100 from 4,096 to 1,048,576 tokens per sequence, LLAMA3-8B in FP8 on DGX B200 from
8,192 to 1,048,576, each with the tp / pp / cp / dp used and the measured TFLOP/s per GPU.

The published step time is implied by NeMo's own FLOP count for Llama models (nemo/utils/
flops_formulas.py, ``llama2``; the Llama 3 formula is the same):
F = gbs s l h^2 (12 + 12 g / a + 18 f / h + 12 s / h + 6 V / (l h)), T = F / (gpus x TFLOP/s).

Each row is priced at its published configuration: tp, pp, cp and dp pinned, micro-batch 1 (the
table gives none; one sequence of up to a million tokens per micro-batch), sequence parallelism
with tp > 1, the distributed optimizer (ZeRO-1), FP8 GEMMs with delayed scaling (Transformer
Engine's default recipe in those NeMo releases); the K/V exchange form and recomputation are the
search's choice (NeMo's default exchange is the p2p ring). The H100 rows ran in the NeMo 24.03.01
container, whose launcher disabled cuDNN's attention (NVTE_FUSED_ATTN=0), so Transformer Engine
ran FlashAttention-2's kernels: they are priced with ``attention=flash2`` (published.software
gives the source); the B200 rows (NeMo 25.04) with cuDNN's. Device memory is not checked (the
time of the published configuration is compared); whether the planner thinks it fits is printed.
Nothing is fitted here: every constant is the cost model's (data sheets, documented efficiencies;
the share of the FP8 peak that FP8 GEMMs sustain was fitted on other runs, benchmarks/
dense_fp8_runs.py, so these rows are held out for it).

Also: the free search (same model, cluster, batch and precision, nothing pinned) against the
published configuration under the planner's own model, with the knobs that changed.

Usage:  python benchmarks/long_context_runs.py [--rows N,M,...] [--no-search] [--markdown]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from costmodels.engine import engine_from_mapping  # noqa: E402
from planner import (InfeasibleError, SearchOptions, TrainingSpec, load_cluster,  # noqa: E402
                     plan_prepared, prepare)
from planner.options import parse_fix  # noqa: E402
from published import BIG, read_rows, software  # noqa: E402
from tables import SEARCH_HEAD, print_errors, print_table, search_cells  # noqa: E402

DATA = os.path.join(HERE, "data", "long_context_runs.csv")
LLAMA2_7B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
             "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32,
             "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
"""Touvron et al. 2023, "Llama 2", Table 1 and the released config.json (7B)."""
DIMS = {"LLAMA2-7B": dict(layers=32, hidden=4096, heads=32, groups=32, ffn=11008, vocab=32000),
        "LLAMA3-8B": dict(layers=32, hidden=4096, heads=32, groups=8, ffn=14336, vocab=128256)}
CLUSTERS = {"H100 (DGX)": "dgx-h100", "B200 (DGX)": "dgx-b200"}


def load_rows() -> list[dict]:
    rows = read_rows(DATA)
    for r in rows:
        d = DIMS[r["model"]]
        b, s = int(r["gbs"]), int(r["seq_len"])
        flops = b * s * d["layers"] * d["hidden"] ** 2 * (
            12 + 12 * d["groups"] / d["heads"] + 18 * d["ffn"] / d["hidden"]
            + 12 * s / d["hidden"] + 6 * d["vocab"] / (d["layers"] * d["hidden"]))
        r["implied_s"] = flops / (int(r["gpus"]) * float(r["tflops_per_gpu"]) * 1e12)
    return rows


def model_of(r: dict, folder: str) -> str:
    if r["model"] == "LLAMA3-8B":
        return "llama3-8b"
    path = os.path.join(folder, "llama2-7b.json")  # RoPE: any length traces; the table sets it
    with open(path, "w") as f:
        json.dump({**LLAMA2_7B, "max_position_embeddings": int(r["seq_len"])}, f)
    return path


def cluster_of(r: dict, memory: float | None = None):
    cluster = load_cluster(CLUSTERS[r["gpu"]], nodes=max(1, int(r["gpus"]) // 8),
                           gpus_per_node=min(8, int(r["gpus"])))
    if memory is not None:
        cluster = dataclasses.replace(cluster, device=dataclasses.replace(
            cluster.device, memory_bytes=memory))
    return cluster


def training_of(r: dict) -> TrainingSpec:
    return TrainingSpec(global_batch=int(r["gbs"]), seq_len=int(r["seq_len"]), dtype="fp8",
                        optimizer="adam",
                        engine=engine_from_mapping("megatron-core,fp8_recipe=delayed"
                                                   f"{software(r['source'])}"))


def published_fix(r: dict) -> str:
    tp, pp, cp, dp = (int(r[k]) for k in ("tp", "pp", "cp", "dp"))
    pins = [f"tp={tp}", f"pp={pp}", f"cp={cp}", f"dp={dp}", "micro_batch=1", "zero=1",
            f"sequence_parallel={'true' if tp > 1 else 'false'}"]
    if pp > 1:
        pins.append("schedule=1f1b")
    return ",".join(pins)


def predict(r: dict, prepared, *, fix: str | None, memory: float | None = BIG):
    options = SearchOptions(fix=parse_fix(fix) if fix else {}, top_k=0)
    return plan_prepared(prepared, cluster_of(r, memory), training_of(r), options)



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated row numbers (default: all)")
    ap.add_argument("--no-search", action="store_true", help="skip the free search per row")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    rows = load_rows()
    if args.rows:
        keep = {int(x) for x in args.rows.split(",")}
        rows = [r for r in rows if r["index"] in keep]
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for r in rows:
            prep = prepare(model_of(r, folder), seq_len=int(r["seq_len"]), dtype="fp8",
                           cache_dir=None)
            p = predict(r, prep, fix=published_fix(r))
            try:
                real = predict(r, prep, fix=published_fix(r), memory=None)
                fits = f"yes ({real.predicted['peak_memory_bytes'] / 1e9:.0f} GB)"
            except InfeasibleError:
                real, fits = None, "no"
            line = {"r": r, "plan": p, "err": p.step_time_s / r["implied_s"] - 1, "fits": fits,
                    "real": real}
            if not args.no_search:
                t1 = time.perf_counter()
                try:
                    line["search"] = predict(r, prep, fix=None, memory=None)
                except InfeasibleError as exc:
                    line["search"] = str(exc).splitlines()[0][:80]
                line["search_s"] = time.perf_counter() - t1
            out.append(line)
    report(out, args.markdown)
    print(f"\n(benchmark took {time.perf_counter() - t0:.0f} s)")
    return 0


def report(out: list[dict], markdown: bool) -> None:
    head = ["#", "model", "gpu", "gpus", "seq", "tp/pp/cp/dp", "gbs", "published s", "predicted s",
            "error", "cp exchange", "fits", "largest part"]
    lines = []
    for o in out:
        r, p = o["r"], o["plan"]
        bd = p.predicted["breakdown"]
        part = max(bd, key=bd.get)
        lines.append([str(r["index"]), r["model"], r["gpu"].split()[0], r["gpus"], r["seq_len"],
                      f"{r['tp']}/{r['pp']}/{r['cp']}/{r['dp']}", r["gbs"],
                      f"{r['implied_s']:.3g}", f"{p.step_time_s:.3g}", f"{100 * o['err']:+.1f}%",
                      p.parallel.get("cp_comm", "") if p.parallel.get("cp", 1) > 1 else "-",
                      o["fits"], f"{part} {100 * bd[part] / p.step_time_s:.0f}%"])
    print_table(head, lines, markdown)
    print()
    by_gen: dict[str, list[float]] = {}
    for o in out:
        by_gen.setdefault(o["r"]["gpu"].split()[0], []).append(o["err"])
    print_errors(by_gen, markdown)
    searched = [o for o in out if "search" in o]
    if not searched:
        return
    print("\nFree search vs the published configuration, both under the planner's cost model and "
          "its memory check\n(the published configuration with the recomputation and exchange "
          "the planner picks for it):\n")
    head = ["#", "model", "seq"] + SEARCH_HEAD
    lines = []
    for o in searched:
        free = o["search"] if not isinstance(o["search"], str) else None
        lines.append([str(o["r"]["index"]), o["r"]["model"], o["r"]["seq_len"]] + search_cells(
            o["real"], free, o["search_s"], o["search"] if free is None else ""))
    print_table(head, lines, markdown)



if __name__ == "__main__":
    sys.exit(main())
