"""`plan solve MODEL --cluster C --global-batch N`: the fastest plan that fits, explained and
written as JSON."""

from __future__ import annotations

import logging
import os
import sys

from costmodels.engine import PRESETS
from planner.cli.args import (Joined, add_layout_flag, add_reserve_flags, count, positive_float,
                              positive_int)
from planner.cli.progress import Bar
from planner.files import STDOUT, check_output
from planner.options import (ACROSS_SITES, DTYPES, OPTIMIZERS, PIPELINES, TABLE_OPTIMIZERS,
                             TRACE_METHODS)
from planner.report.summary import summary
from planner.targets import TARGETS


def register(add) -> None:
    s = add("solve", help="find the fastest plan that fits and write it as JSON")
    s.add_argument("model", metavar="MODEL", help="zoo name (see `plan models`), config.json "
                   "path, or file.py:factory")
    s.add_argument("--cluster", required=True, help="preset (see `plan clusters`) or YAML file")
    s.add_argument("--nodes", type=positive_int, help="override the number of nodes")
    s.add_argument("--gpus-per-node", type=positive_int, help="override GPUs per node")
    s.add_argument("--global-batch", type=positive_int, required=True, help="samples per optimizer step")
    s.add_argument("--seq-len", type=positive_int, help="tokens per sample (default: the model's)")
    s.add_argument("--dtype", choices=DTYPES, help="compute dtype (default bf16; fp32 for "
                   "recommendation models, as TorchRec trains them)")
    s.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    s.add_argument("--fix", action=Joined, help="pin knobs, e.g. tp=8,pp=4,schedule=1f1b,recompute=full,zero=1 "
                   "(recommendation models: sharding=row_wise|table_wise|...)")
    s.add_argument("--tables", metavar="YAML", help="recommendation models: per-table ids per "
                   "sample and access skew (tables: {name: {pooling, skew}}); default: "
                   "MODEL.tables.yaml beside a file.py:factory")
    s.add_argument("--table-optimizer", choices=TABLE_OPTIMIZERS,
                   help="recommendation models: the fused optimizer of the tables (default: the "
                        "zoo entry's, else sgd with --optimizer sgd and adam otherwise)")
    s.add_argument("--pipeline", default="sparse-dist", choices=PIPELINES,
                   help="recommendation models: sparse-dist (TorchRec's train pipeline, "
                        "default), nested (embedding exchange behind dense compute) or none")
    s.add_argument("--calibration", help="calibration JSON from `plan profile` (measured speeds "
                   "replace data-sheet numbers)")
    presets = ", ".join(f"{n} (default)" if n == "megatron-core" else n for n in PRESETS)
    s.add_argument("--engine", action=Joined, help=f"the software you train with: a preset ({presets}) and/or "
                   "attention=flash|flash2|materialized, kernels=fused|eager, "
                   "fused_scope=model|layers, overlap_grad_reduce=true|false, "
                   "overlap_param_gather=true|false, overlap_scope=all|sharded, "
                   "fsdp_copies=true|false, fsdp_experts=true|false, "
                   "pipelined_accumulation=true|false, ddp_accumulates=true|false, "
                   "selective=attention|matmuls, cp_ring=te|torch|runtime, "
                   "tp_overlap=true|false, tp_grad_overlap=true|false, "
                   "state_layout=megatron|megatron-bf16-grads|zero|"
                   "fsdp2|native, fp8_recipe=delayed|current|block, and for MoE "
                   "moe_dispatcher=alltoall|allgather|deepep, "
                   "moe_imbalance, moe_capacity_factor, moe_pad_to_capacity, moe_grouped_gemm, "
                   "moe_overlap, moe_shared_overlap, moe_etp_replicated, "
                   "moe_probs_in_activation, moe_bias_loop, fp8_experts=true|false, "
                   "moe_host_op_s (seconds; README: MoE engine settings), and for "
                   "recommendation models host_op_s (seconds per op the host issues)")
    s.add_argument("--top-k", type=count, default=3, help="runners-up to keep (default 3)")
    s.add_argument("--time-limit", type=positive_float,
                   help="seconds; return the best plan found so far (on groups or sites, each "
                   "comparison after the search, one group alone and data parallel across "
                   "sites, takes at least a second more)")
    s.add_argument("--trace", default="auto", choices=TRACE_METHODS,
                   help="tracer (default: torch.export, the ATen graph; then torch.fx)")
    s.add_argument("--no-cache", action="store_true",
                   help="trace the model again instead of reading the trace cache "
                        "(~/.cache/planner/traces)")
    s.add_argument("--record-timing", action="store_true",
                   help="store the search time in the plan (plan files then differ run to run)")
    s.add_argument("--target", default="any", choices=TARGETS,
                   help="the engine the plan is for: the search keeps to the schedules, ZeRO "
                        "stages, offload and sequence parallelism it runs, priced with its "
                        "--engine preset unless --engine is given (default any: every "
                        "configuration the cost model prices)")
    s.add_argument("--across-sites", default="auto", choices=ACROSS_SITES,
                   help="on sites of one kind: a pipeline over the sites, one site's plan on "
                        "each site with data parallelism across them (replicas), or the faster "
                        "of the two (default auto)")
    add_layout_flag(s)
    add_reserve_flags(s)
    s.add_argument("-o", "--output", help="write the plan JSON here (- : to stdout, the report "
                                          "then goes to stderr)")
    s.set_defaults(func=run)


def run(args) -> int:
    from planner import api  # lazy: imports torch (seconds); `plan --help` and `show` need not

    if args.output is not None:
        check_output(args.output, "output", inputs=(args.model, args.cluster, args.calibration,
                                                    args.tables))
        given = os.path.splitext(args.output)[1]
        if args.output != STDOUT and given.lower() not in ("", ".json"):  # (said before the
            # search: a new user's CSV was replaced by the plan without a word)
            logging.getLogger("planner").warning(
                "output: the plan is JSON, written to '%s' as asked, whose name ends in %s",
                args.output, given)
    logging.getLogger("planner").info("planning %s on %s ...", args.model, args.cluster)
    p = api.plan(args.model, cluster=args.cluster, nodes=args.nodes,
                 gpus_per_node=args.gpus_per_node, global_batch=args.global_batch,
                 seq_len=args.seq_len, dtype=args.dtype, optimizer=args.optimizer,
                 fix=args.fix, top_k=args.top_k, time_limit_s=args.time_limit,
                 engine=args.engine, calibration=args.calibration,
                 trace_method=args.trace, record_timing=args.record_timing,
                 # the bar counts the configurations whose memory bound fits, in pricing
                 # order; the summary line after it counts every one enumerated
                 progress=Bar(args.quiet, label="pricing", unit=" that may fit"),
                 cache_dir=None if args.no_cache else "auto",
                 target=args.target, tables=args.tables,
                 table_optimizer=args.table_optimizer, pipeline=args.pipeline,
                 across_sites=args.across_sites,
                 memory_reserve_fraction=args.memory_reserve_fraction,
                 memory_reserve_gb=args.memory_reserve_gb, layout=args.layout)
    if args.output == STDOUT:  # the plan JSON on stdout for scripts, the report on stderr
        print(summary(p), file=sys.stderr)
        p.save(STDOUT)
        return 0
    if args.output is not None:  # written before the report: a reader closing the pipe early
        p.save(args.output)     # (`| head`) must not cost the plan
    print(summary(p))
    if args.output is not None:
        print(f"\nwrote {args.output}")
    else:  # (a new-user check looked for the plan file afterwards)
        print("\n(no plan file written: give -o PLAN.json to keep the plan for show, export, run)")
    return 0
