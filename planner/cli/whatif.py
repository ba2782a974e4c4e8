"""`plan whatif`: plan one model over a grid of clusters, batches and pinned knobs."""

from __future__ import annotations

import logging
import sys
import time

from planner.cli.args import (Joined, add_layout_flag, add_reserve_flags, positive_float,
                              positive_int)
from planner.cli.progress import Bar, per_plan_lines
from planner.explore.costs import parse_prices
from planner.explore.csv_rows import write_csv
from planner.explore.grid import VARY_KEYS, parse_vary
from planner.options import ACROSS_SITES, DTYPES, OPTIMIZERS, PIPELINES, TABLE_OPTIMIZERS
from planner.files import check_output
from planner.report.figure import check_path
from planner.report.plots import sweep_plots
from planner import recsys_api
from planner.report.sweep import sweep_table
from planner.targets import TARGETS


def register(add) -> None:
    w = add("whatif", help="sweep clusters, batches and knobs: a table, CSV and plots",
            description="Plan MODEL at every point of the grid the --vary options span (their "
                        "cartesian product), tracing the model once. Prints one row per point; "
                        "points where nothing fits are rows with the reason.")
    w.add_argument("model", metavar="MODEL", help="zoo name, config.json path, or file.py:factory")
    w.add_argument("--cluster", help="preset or YAML file (or vary it: --vary cluster=A,B)")
    w.add_argument("--vary", action="append", required=True, metavar="KEY=V1,V2,...",
                   help=f"values to sweep (repeatable); KEY is one of {', '.join(VARY_KEYS)} "
                        "(node bandwidths in GB/s per GPU, or with units: 400Gbps; "
                        "inter_region_bandwidth: every link between two sites, in the scope the "
                        "file gives it (per site by default), or per GPU between device groups, "
                        "with its unit: 10Gbps or 1.25GB/s)")
    w.add_argument("--nodes", type=positive_int, help="nodes at every point (unless varied)")
    w.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node at every point")
    w.add_argument("--global-batch", type=positive_int, help="samples per optimizer step (or vary it)")
    w.add_argument("--seq-len", type=positive_int, help="tokens per sample (default: the model's)")
    w.add_argument("--dtype", choices=DTYPES, help="compute dtype (default bf16; fp32 for "
                   "recommendation models)")
    w.add_argument("--optimizer", choices=OPTIMIZERS, help="default adam (or vary it)")
    w.add_argument("--fix", action=Joined, help="knobs pinned at every point, e.g. recompute=full,zero=1")
    w.add_argument("--engine", action=Joined, help="the software you train with, at every point, as for `plan "
                   "solve --engine` (default: megatron-core), e.g. "
                   "megatron-core,moe_dispatcher=allgather")
    w.add_argument("--price-per-gpu-hour", metavar="GPU=$,...",
                   help="dollars per GPU-hour by device, e.g. h100=4,a100-80g=2 (adds cost)")
    w.add_argument("--tokens", type=positive_float,
                   help="the days to train on this many tokens (with prices, the cost too), e.g. 1e12")
    w.add_argument("--time-limit", type=positive_float, help="seconds of search per point")
    w.add_argument("--tables", metavar="YAML", help="recommendation models: per-table statistics "
                   "(tables: {name: {pooling, skew, features}}), as for `plan solve`")
    w.add_argument("--table-optimizer", choices=TABLE_OPTIMIZERS,
                   help="recommendation models: the tables' fused optimizer at every point (or "
                        "vary it: --vary table_optimizer=sgd,adagrad)")
    w.add_argument("--pipeline", choices=PIPELINES,
                   help="recommendation models: the train pipeline at every point (default "
                        "sparse-dist; or vary it: --vary pipeline=sparse-dist,nested)")
    w.add_argument("--calibration", help="calibration JSON from `plan profile`: every point "
                                         "priced with the measured speeds (one device type)")
    w.add_argument("--target", default="any", choices=TARGETS,
                   help="the engine every point is planned for, as for `plan solve --target` "
                        "(default any)")
    w.add_argument("--across-sites", default="auto", choices=ACROSS_SITES,
                   help="on sites of one kind, at every point: a pipeline over the sites, one "
                        "site's plan on each site with data parallelism across them (replicas), "
                        "or the faster of the two (default auto), as for `plan solve`")
    add_layout_flag(w, every_point=True)
    add_reserve_flags(w)
    w.add_argument("--workers", type=positive_int, help="processes (default: one per core)")
    w.add_argument("--csv", metavar="OUT.csv", help="write every row, every column")
    w.add_argument("--plot", metavar="OUT.png",
                   help="write OUT-scaling.png (tokens/s and MFU against GPUs), OUT-pareto.png "
                        "(step time against memory) and, with prices, OUT-cost.png")
    w.set_defaults(func=run)


def run(args) -> int:
    from planner.explore import sweep  # lazy: tracing imports torch (seconds)

    if args.plot:
        check_path(args.plot, "plot")
    if args.csv is not None:
        check_output(args.csv, "csv", inputs=(args.model, args.cluster, args.calibration))
    t0 = time.perf_counter()
    with per_plan_lines(args.verbose):
        rows = sweep.whatif(args.model, cluster=args.cluster, vary=parse_vary(args.vary),
                            nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                            global_batch=args.global_batch, seq_len=args.seq_len,
                            dtype=args.dtype, optimizer=args.optimizer, fix=args.fix,
                            engine=args.engine,
                            prices=parse_prices(args.price_per_gpu_hour) or None,
                            tokens=args.tokens, time_limit_s=args.time_limit,
                            workers=args.workers, target=args.target,
                            calibration=args.calibration,
                            memory_reserve_fraction=args.memory_reserve_fraction,
                            memory_reserve_gb=args.memory_reserve_gb, layout=args.layout,
                            tables=args.tables, table_optimizer=args.table_optimizer,
                            pipeline=args.pipeline, across_sites=args.across_sites,
                            progress=Bar(args.quiet, label="sweeping", unit=" points"))
    logging.getLogger("planner").info("swept %d points in %.1f s, traces included", len(rows),
                                      time.perf_counter() - t0)
    rec = recsys_api.recsys_model(args.model)
    table = sweep_table(rows, rate="samples/s" if rec else "tokens/s")
    none_fit = bool(rows) and not any(r["feasible"] for r in rows)
    # the files first: a reader closing the pipe early (`| head`) must not cost them
    if args.csv is not None:
        write_csv(rows, args.csv)
    drawn, skipped = sweep_plots(rows, args.plot) if args.plot and not none_fit else ([], [])
    if args.plot and none_fit:
        skipped = ["no feasible point to draw (the table says why each failed)"]
    if args.layout:
        print(f"stages pinned at every point: --layout '{args.layout}'")
    print(table)
    if args.csv is not None:
        print(f"\nwrote {args.csv}")
    for path in drawn:
        print(f"wrote {path}")
    for note in skipped:
        print(f"not drawn: {note}")
    if none_fit:  # as a solve that finds none: exit 3
        print(f"plan: no plan fits: none of the {len(rows)} points (the table says why each "
              "failed)", file=sys.stderr)
        return 3
    return 0
