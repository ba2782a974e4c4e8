"""One model on 64 V100 under three networks: predicted vs measured iteration time.

Rows: benchmarks/data/cross_site_runs.csv (a copy of the project's reference data), the experiment
log of Yuan et al., "Decentralized Training of Foundation Models in Heterogeneous Environments"
(NeurIPS 2022; DS3Lab/Decentralized_FM_alpha results/NeurIPS2022_submission.md): GPT-3-XL-style
models (hidden 2048, 16 heads, 24/32/40 layers, sequence 2048, micro-batch 1, fp16) at global batch
1,024/2,048/4,096 under Megatron-LM configurations and under the paper's own system.

The networks, as the log and its traffic-shaping generator (scheduler/generate_sim_com_matrices.py)
set them:
- case 1, one data center: 8 instances of 8 V100 (NVLink inside, which NCCL uses), 25 Gb/s per
  instance between instances (3.125 Gb/s per GPU pair in the generator);
- case 2, spot instances: 8 instances of 4 V100 (NVLink inside) and 32 of 1 V100; 10 Gb/s per
  instance, as the log states it (its traffic shaper's matrix, 1.25 Gb/s per GPU pair, is for the
  paper's own runs; whether Megatron's runs were shaped is not said);
- case 3, two universities: 2 sites of 32 single-GPU machines; 5 Gb/s and 1 ms between machines of
  a site, 1.2 Gb/s (1.12 in the generator) and 11 ms between the sites, per machine.

Megatron-LM ran with ``--checkpoint-activations --DDP-impl local --fp16 --optimizer sgd``, a BERT
vocabulary (30,522, padded to 30,592), micro-batch 1 (scripts/local_scripts/
megatron_gpt3_xl_mp8_dp8.sh): here full recomputation, gradients reduced after the backward
(``--engine megatron-2021``), SGD. Each Megatron row is priced at its configuration (tp, pp, dp
pinned) with Megatron's rank order (tp fastest, then dp, then pp: a pipeline stage occupies
consecutive ranks, so in case 3 stages 0-3 are on the first site); the random placements of case 3
are priced by planner.search.sites over 20 random permutations of the ranks (the mean and range).
The paper's own system (DT-FM rows) runs its own runtime; the planner's plan for the same inputs is
printed next to it, not scored.

Nothing is fitted: the constants are the cost model's (V100 GEMM efficiency from Megatron-LM's
published V100 runs; hardware.py).

Usage:  python benchmarks/cross_site_runs.py [--markdown] [--cases 1,2,3]
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.tables import print_table  # noqa: E402
from costmodels.engine import engine_from_mapping  # noqa: E402
from planner.api import plan_prepared, prepare  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.inputs.clusters import load_cluster  # noqa: E402
from planner.options import SearchOptions, TrainingSpec, parse_fix  # noqa: E402

DATA = os.path.join(HERE, "data", "cross_site_runs.csv")

NVLINK_V100 = {"bandwidth_GBps": 150, "latency_us": 3, "efficiency": 0.8}
"""Inside a p3 instance NCCL runs over NVLink (V100 SXM2, the hybrid cube mesh of a DGX-1; the
dgx1-v100 preset's figures): the log's "100 Gbps intra-instance" is the traffic shaper's figure for
the paper's own system, which Megatron-LM's NCCL traffic inside an instance does not cross."""
V100_INSTANCE = {"device": "v100", "intra_node": NVLINK_V100}

CLUSTERS = {
    "1": {"name": "case1-datacenter", "device": "v100", "nodes": 8, "gpus_per_node": 8,
          "intra_node": NVLINK_V100,
          "inter_node": {"bandwidth_GBps": 25 / 8 / 8, "latency_us": 50}},
    # 10 Gb/s per instance: a quarter of it per GPU on the 4-GPU instances, all of it on the
    # 1-GPU ones; between the two kinds the slower end decides (a quarter of 10 Gb/s)
    "2": {"name": "case2-spot", "inter_node": {"bandwidth_GBps": 10 / 8 / 4, "latency_us": 50},
          "inter_group": {"bandwidth_GBps": 10 / 8 / 4, "latency_us": 50},
          "groups": [{"name": "p3.8xlarge", "nodes": 8, "gpus_per_node": 4, **V100_INSTANCE},
                     {"name": "p3.2xlarge", "nodes": 32, "gpus_per_node": 1, **V100_INSTANCE,
                      "inter_node": {"bandwidth_GBps": 10 / 8, "latency_us": 50}}]},
    "3": {"name": "case3-universities",
          "sites": [{"name": name, "device": "v100", "nodes": 32, "gpus_per_node": 1,
                     "intra_node": {"bandwidth": "100Gbps", "latency": "5us"},
                     "inter_node": {"bandwidth": "5Gbps", "latency": "1ms"}}
                    for name in ("ohio", "virginia")],
          "links": [{"between": ["ohio", "virginia"], "bandwidth": "1.2Gbps", "latency": "11ms",
                     "per": "gpu"}]},
}


def model_config(layers: int) -> dict:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 2048,
            "n_layer": layers, "n_head": 16, "n_positions": 2048, "vocab_size": 30592}


def megatron_fix(parallelism: str) -> str | None:
    p = parallelism.replace(",", " ").split()
    if not p or p[0] != "Megatron":
        return None
    tp = pp = 1
    for tok in p[1:]:
        for part in filter(None, tok.replace("PP", " P").replace("TP", " T").split()):
            if part.startswith("P") and part[1:].isdigit():
                pp = int(part[1:])
            elif part.startswith("T") and part[1:].isdigit():
                tp = int(part[1:])
    return f"tp={tp},pp={pp},dp={64 // (tp * pp)},micro_batch=1,schedule=1f1b,recompute=full,zero=0,sequence_parallel=false,placement=tp-dp-pp"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--cases", default="1,2,3")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with open(DATA, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["scenario"].split()[1] in args.cases.split(",")]
    engine = engine_from_mapping("megatron-2021")
    tmp = tempfile.mkdtemp()
    prepared = {}
    table, errs, by_case, ratios = [], {}, {}, []
    t0 = time.perf_counter()
    for r in rows:
        case = r["scenario"].split()[1]
        layers, batch = int(r["layers"]), int(r["global_batch"])
        if layers not in prepared:
            path = os.path.join(tmp, f"gpt-xl-{layers}.json")
            with open(path, "w") as f:
                json.dump(model_config(layers), f)
            prepared[layers] = prepare(path, seq_len=2048, dtype="fp16", cache_dir=None)
        cluster = load_cluster(CLUSTERS[case])
        training = TrainingSpec(global_batch=batch, seq_len=2048, dtype="fp16", optimizer="sgd",
                                engine=engine)
        fix = megatron_fix(r["parallelism"])
        measured = float(r["iter_time_s"])
        name = r["parallelism"]
        if fix is None:
            table.append([case, name, str(layers), str(batch), f"{measured:.2f}", "-", "-",
                          "the paper's own runtime"])
            continue
        try:
            plan = plan_prepared(prepared[layers], cluster, training,  # (a measured layout:
                                 SearchOptions(fix=parse_fix(fix), top_k=0),  # no site alone)
                                 compare_groups=False)
        except PlannerError as exc:
            table.append([case, name, str(layers), str(batch), f"{measured:.2f}", "-", "-",
                          f"not priced: {str(exc).splitlines()[0][:70]}"])
            continue
        pl = plan.search.get("placements") or {}
        if "random" in name:  # the slot model's mean over random placements of the ranks
            pred = pl["random_mean_s"]
            ratios.append((measured, pl["naive_s"], pred, layers, batch))
        else:
            pred = plan.step_time_s
        err = pred / measured - 1
        errs.setdefault(case + (" random" if "random" in name else ""), []).append(err)
        if "random" not in name:
            by_case.setdefault((case, layers, batch), []).append((name, measured, pred))
        how = ("slot model, mean of random placements" if "random" in name else
               plan.parallel_summary)
        table.append([case, name, str(layers), str(batch), f"{measured:.2f}", f"{pred:.2f}",
                      f"{100 * err:+.1f}%", how])
    print_table(["case", "configuration", "layers", "batch", "measured s", "predicted s",
                 "error", "plan"], table, args.markdown)
    print()
    for case, e in sorted(errs.items()):
        a = [abs(x) for x in e]
        print(f"{'- ' if args.markdown else ''}case {case}: median |error| "
              f"{100 * statistics.median(a):.1f}%, max {100 * max(a):.1f}% (n={len(a)})")
    measured_default = {(r["layers"], r["global_batch"]): float(r["iter_time_s"]) for r in rows
                        if "default placement" in r["parallelism"]}
    for measured, naive_s, random_s, layers, batch in ratios:
        base = measured_default.get((str(layers), str(batch)))
        if base:
            print(f"{'- ' if args.markdown else ''}case 3, {layers} layers, batch {batch}: random "
                  f"/ default placement measured {measured / base:.2f}x, slot model "
                  f"{random_s / naive_s:.2f}x")
    same = sum(1 for measured, naive_s, random_s, layers, batch in ratios
               if measured_default.get((str(layers), str(batch))) is not None and
               (measured > measured_default[(str(layers), str(batch))]) == (random_s > naive_s))
    if ratios:
        print(f"{'- ' if args.markdown else ''}case 3: the slot model orders default and random "
              f"placement as measured in {same} of {len(ratios)} settings")
    agree = sum(1 for v in by_case.values() if len(v) > 1 and
                min(v, key=lambda x: x[1])[0] == min(v, key=lambda x: x[2])[0])
    multi = sum(1 for v in by_case.values() if len(v) > 1)
    print(f"{'- ' if args.markdown else ''}the predicted fastest of the measured Megatron "
          f"configurations is the measured fastest in {agree} of {multi} settings")
    print(f"(benchmark took {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
