"""DLRM training with TorchRec: predicted vs published samples/s.

Rows: benchmarks/data/recsys_runs.csv (a copy of the project's reference data), the training results
of facebookresearch/dlrm torchrec_dlrm/README.MD in three revisions (2022-04, 2022-06, 2025-05):
DLRM on Criteo 1TB (26 tables, dim 128, dense MLP 512-256-128, over-arch 1024-1024-512-256-1,
dot or DCNv2 interaction) on 1 to 80 A100-40GB of AWS p4d.24xlarge nodes, SGD or Adagrad, with
local and global batch and the measured samples/s.

Each row is planned at its published GPU count and batch: the planner shards the tables itself (the
runs used TorchRec's planner, whose sharding was not published) and prices the step. The cluster is
a p4d.24xlarge as AWS describes it: 8 A100 40 GB on NVSwitch (600 GB/s per GPU), 400 Gb/s of EFA
per node (6.25 GB/s per GPU). The dense part runs in fp32 (TorchRec's DLRM example trains in fp32;
TF32 tensor cores are off for matmuls by default since PyTorch 1.12).

Tables per row: the 2022-06 rows use the Criteo 1TB row counts of their notes; the rows capped at
40M rows use MLPerf's capped counts (their published size, 97.36 GiB, is exactly those counts);
'MLPerfx2' (174 GiB) and 'Full Size' (421 GiB) publish only their total size, so the six tables
that MLPerf caps at 40M rows are scaled evenly to reach it (said per row). Optimizers: SGD rows
run SGD on the tables and the dense part; Adagrad rows run FBGEMM's exact (element-wise) Adagrad on
the tables, as the example's ``apply_optimizer_in_backward(torch.optim.Adagrad, ...)`` maps to
``EmbOptimType.EXACT_ADAGRAD`` (one fp32 state per weight), and Adagrad on the dense part (priced
as Adam's update: the dense search's optimizers are SGD and Adam; the dense part is 2-16 M
parameters). The dense part is planned and priced by the dense search (DDP; op by op from its
traced graph: planner.search.dense_part).

Nothing is fitted here: every constant is the cost model's (data sheets, documented
efficiencies; costmodels/embeddings.py, planner/search/tables.py). One of them, the host time per
op of eager PyTorch (EngineSpec.host_op_s, 23.75 us), was fitted once on other data (MoE runs,
under an earlier model of theirs) and is not refitted: these rows are a held-out check of it.

Usage:  python benchmarks/recsys_runs.py [--rows N,M,...] [--markdown] [--time-limit S]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.tables import print_errors, print_table  # noqa: E402
from costmodels.engine import EngineSpec  # noqa: E402
from costmodels.topology import cluster_from_mapping  # noqa: E402
from planner.inputs.zoo import CRITEO_1TB_ROWS, MLPERF_DCNV2_ROWS  # noqa: E402
from planner.recsys_api import prepare_recsys  # noqa: E402
from planner.search.dense_part import dense_options  # noqa: E402
from planner.search.tables import RecOptions, plan_tables  # noqa: E402
from planner.trace.recsys import rec_model  # noqa: E402

DATA = os.path.join(HERE, "data", "recsys_runs.csv")

P4D = {"name": "p4d.24xlarge", "device": "a100-40g", "gpus_per_node": 8,
       # NVSwitch: 600 GB/s per GPU both directions, 300 one way (as dgx-a100-40g)
       "intra_node": {"bandwidth_GBps": 300, "latency_us": 3, "efficiency": 0.77},
       # EFA: 400 Gb/s per node = 50 GB/s, 6.25 GB/s per GPU; latency as InfiniBand's order
       "inter_node": {"bandwidth_GBps": 6.25, "latency_us": 15, "efficiency": 0.9}}


def zoo_name(row: dict) -> str:
    return "dlrm-dcnv2" if row["interaction"].strip().lower() == "dcnv2" else "dlrm-criteo-1tb"


def tables_for(row: dict) -> tuple:
    """(RecModel, note): the row's tables with its optimizer's dense state."""
    base = rec_model(zoo_name(row))
    size_gib = float(row["embedding_size_gib"])
    if "40M" in row["model"] or "'MLPerf'" in row["model"]:
        rows, note = MLPERF_DCNV2_ROWS, "MLPerf rows (40M cap)"
    elif "x2" in row["model"] or "Full Size" in row["model"]:
        capped = [i for i, r in enumerate(MLPERF_DCNV2_ROWS) if r == 40_000_000]
        fixed = sum(r for i, r in enumerate(MLPERF_DCNV2_ROWS) if i not in capped)
        each = int((size_gib * 2**30 / (128 * 4) - fixed) / len(capped))
        rows = tuple(each if i in capped else r for i, r in enumerate(MLPERF_DCNV2_ROWS))
        note = f"6 capped tables scaled to {each / 1e6:.0f}M rows ({size_gib:g} GiB)"
    else:
        rows, note = CRITEO_1TB_ROWS, "Criteo 1TB rows"
    tables = tuple(dataclasses.replace(t, rows=int(r), pooling=1.0)
                   for t, r in zip(base.tables, rows))
    return dataclasses.replace(base, tables=tables), note


DENSE: dict = {}
"""Zoo name -> the dense part traced for the dense search (once per model)."""


def predict(row: dict, time_limit_s: float):
    gpus, nodes = int(row["gpus"]), int(row["nodes"])
    cluster = cluster_from_mapping({**P4D, "nodes": nodes, "gpus_per_node": gpus // nodes})
    rec, note = tables_for(row)
    adagrad = "adagrad" in row["optimizer"].lower()
    opts = RecOptions(optimizer="adagrad" if adagrad else "sgd", time_limit_s=time_limit_s)
    name = zoo_name(row)
    if name not in DENSE:
        DENSE[name] = prepare_recsys(name).dense
    t0 = time.perf_counter()
    dense = dense_options(DENSE[name].blocks, cluster, global_batch=int(row["global_batch"]),
                          dtype="fp32", optimizer="adam" if adagrad else "sgd",
                          engine=EngineSpec())
    tp = plan_tables(rec, cluster, global_batch=int(row["global_batch"]), dtype="fp32",
                     engine=EngineSpec(), opts=opts, dense=dense)
    return tp, note, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", help="comma-separated row numbers (1-based) to run")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--time-limit", type=float, default=10.0,
                    help="seconds of CP-SAT per row (default 10)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with open(DATA, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    pick = {int(x) for x in args.rows.split(",")} if args.rows else None
    table, errors = [], {}
    for i, row in enumerate(rows, 1):
        if pick and i not in pick:
            continue
        tp, note, wall = predict(row, args.time_limit)
        published = float(row["throughput_samples_per_s"])
        predicted = int(row["global_batch"]) / tp.step_s
        err = predicted / published - 1
        rev = row["source"].split("(")[-1].split(",")[0].replace("commit ", "").replace("HEAD ", "")
        errors.setdefault(rev, []).append(err)
        kinds = {}
        for lay in tp.layouts:
            key = lay.sharding.replace("table_wise", "TW").replace("column_wise", "CW") \
                .replace("table_row_wise", "TWRW").replace("row_wise", "RW") \
                .replace("data_parallel", "DP").replace("grid_shard", "GRID")
            key += "" if lay.tier == "hbm" else f"/{lay.tier}"
            kinds[key] = kinds.get(key, 0) + 1
        bd = tp.breakdown
        table.append([str(i), rev, row["interaction"], row["optimizer"].split()[0], row["gpus"],
                      row["local_batch"], f"{published:,.0f}", f"{predicted:,.0f}",
                      f"{100 * err:+.1f}%", f"{1e3 * tp.step_s:.2f}",
                      f"{1e3 * bd['dense_compute_s']:.2f}/{1e3 * bd['lookup_s']:.2f}/"
                      f"{1e3 * bd['embedding_comm_s']:.2f}/{1e3 * bd['host_s']:.2f}",
                      " ".join(f"{k}:{v}" for k, v in sorted(kinds.items())),
                      f"{tp.solver['status']} {wall:.1f}s", note])
    print_table(["row", "rev", "inter", "opt", "gpus", "local", "published/s", "predicted/s",
                 "error", "step ms", "dense/lookup/a2a/host ms", "sharding", "solver", "tables"],
                table, args.markdown)
    print()
    print_errors(errors, args.markdown, label="revision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
