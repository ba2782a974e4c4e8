"""Free search vs the published configuration, for every run of Megatron-LM's Table 1.

For each row the planner searches the whole space (same cluster, global batch, sequence length,
precision and software behaviour as the published run) and the chosen plan is compared with the
published configuration priced by the same cost model (benchmarks/megatron_table1.py). The chosen
plan must never be slower; the output says by how much it is faster, and why.

Usage:  python benchmarks/megatron_search.py [--markdown] [--time-limit S]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from megatron_table1 import SCRIPT, load_rows, predict  # noqa: E402

from costmodels.engine import EngineSpec  # noqa: E402
from planner import SearchOptions, TrainingSpec, load_cluster, plan_prepared, prepare  # noqa: E402
from planner.report.compare import headline  # noqa: E402


def free_search(r: dict, prepared, time_limit: float | None):
    cluster = load_cluster("dgx-a100-80g", nodes=int(r["gpus"]) // 8)
    engine = EngineSpec(attention="materialized", kernels="fused", tp_grad_overlap=False,
                        overlap_grad_reduce=SCRIPT[r["name"]][2] == "torch")
    training = TrainingSpec(global_batch=int(r["global_batch"]), seq_len=int(r["seq_len"]),
                            dtype="fp16", optimizer="adam", engine=engine)
    return plan_prepared(prepared, cluster, training,
                         SearchOptions(top_k=0, time_limit_s=time_limit), record_timing=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--time-limit", type=float, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    rows = load_rows()
    out, worse = [], 0
    for r in rows:
        prepared = prepare(r["name"], seq_len=int(r["seq_len"]), dtype="fp16")
        published = predict(r, prepared, None)
        best = free_search(r, prepared, args.time_limit)
        gain = 1 - best.step_time_s / published.step_time_s
        worse += gain < -1e-9
        out.append((r["name"], published, best, gain, headline(published, best)))
    head = ["model", "published config s", "searched s", "better by", "search s", "why"]
    lines = [[n, f"{p.step_time_s:.2f}", f"{b.step_time_s:.2f}", f"{100 * g:.1f}%",
              f"{b.search['time_s']:.1f}", why] for n, p, b, g, why in out]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
    else:
        for ln in lines:
            print(f"{ln[0]:>9}  published {ln[1]:>7} s  searched {ln[2]:>7} s  better by {ln[3]:>6}"
                  f"  (search {ln[4]} s)\n           {ln[5]}")
    print(f"\n{len(rows) - worse} of {len(rows)} searched plans are at least as fast as the "
          f"published configuration under the same cost model "
          f"(benchmark took {time.perf_counter() - t0:.0f} s)")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
