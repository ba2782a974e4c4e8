"""A recommendation model's plan as a person reads it: the tables' shardings, each rank's time and
memory (as TorchRec's planner prints its statistics), the imbalance, and the solver's account."""

from __future__ import annotations

from costmodels.engine import engine_from_mapping
from planner.planfile.document import Plan
from planner.report.text import table
from planner.units import GB

SHORT = {"data_parallel": "DP", "table_wise": "TW", "column_wise": "CW", "row_wise": "RW",
         "table_row_wise": "TWRW", "grid_shard": "GRID"}
"""TorchRec's abbreviations of its sharding types."""

WORDS = {"dense_compute_s": "dense forward + backward", "lookup_s": "table lookups + update",
         "embedding_comm_s": "pooled-embedding all-to-all (fwd + bwd)",
         "grad_allreduce_exposed_s": "gradient reduction (exposed)",
         "dense_optimizer_s": "dense optimizer step",
         "input_dist_s": "id distribution (hidden by the pipeline)",
         "host_s": "host: issuing the step's ops"}


def _host_us(p: Plan) -> float:
    """The host time per op the plan was priced with (the engine's)."""
    return 1e6 * engine_from_mapping(p.training.get("engine")).host_op_s


PIPELINE_WORDS = {"sparse-dist": "TorchRec's TrainPipelineSparseDist",
                  "nested": "a nested pipeline (NestPipe-style: the embedding exchange behind the "
                            "dense part; TorchRec's nearest: TrainPipelineSemiSync, on weights a "
                            "step older)",
                  "none": "no train pipeline (each step's parts one after another)"}
"""The train pipeline a plan was priced with, in words (TorchRec has no nested pipeline)."""


def embeddings_summary(p: Plan, max_tables: int = 30) -> list[str]:
    e = p.embeddings
    bd = e.get("breakdown", {})
    step = p.predicted["step_time_s"]
    out = [f"  tables      {len(e['tables'])} tables over {e['world_size']} ranks, local batch "
           f"{e['local_batch']}, {e['table_optimizer']} fused in the backward, pipeline "
           f"{e['pipeline']}",
           f"  software    {p.training['dtype']}; "
           f"{PIPELINE_WORDS.get(e['pipeline'], e['pipeline'] + ' pipeline')}, FBGEMM's "
           f"fused table kernels, {_host_us(p):.3g} us of host time per op",
           f"  step time   {step:.4g} s = max(host {bd.get('host_s', 0):.3g} s, device "
           f"{bd.get('device_s', 0):.3g} s); {p.predicted['samples_per_s']:,.0f} samples/s"]
    rows = [(f"    {WORDS[k]}", f"{bd[k] * 1e3:.3f} ms") for k in WORDS if k in bd]
    out += table(rows, indent="  ") if rows else []
    kinds: dict = {}
    for t in e["tables"]:
        key = SHORT[t["sharding_type"]] + ("" if t["tier"] == "hbm" else
                                          f" ({t['compute_kernel']})")
        kinds[key] = kinds.get(key, 0) + 1
    d = e.get("dense", {})
    if d:
        how = ("FSDP2 (weights, gradients and optimizer states sharded)" if d.get("zero") == 3
               else "DDP (replicated)")
        out += [f"  dense part  data-parallel on every rank, {how}; {d.get('params', 0):,} "
                f"parameters, {d.get('memory_bytes', 0) / GB:.2f} GB per rank; priced by "
                f"{d.get('priced_by', 'FLOP count')}"]
    out += ["", "  shardings   " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())),
            f"  imbalance   slowest rank / mean: time {e['imbalance']['time']:.2f}, memory "
            f"{e['imbalance']['hbm']:.2f}", ""]
    head = ("rank", "time", "lookups", "all-to-all", "HBM", "host", "tables")
    rows = [head] + [(str(r["rank"]), f"{r['time_s'] * 1e3:.2f} ms",
                      f"{r.get('lookup_s', 0) * 1e3:.2f} ms", f"{r.get('comm_s', 0) * 1e3:.2f} ms",
                      f"{r['hbm_bytes'] / GB:.1f} GB", f"{r.get('host_bytes', 0) / GB:.1f} GB",
                      str(r.get("tables", 0))) for r in e["ranks"]]
    out += table(rows, indent="  ")
    out.append("")
    head = ("table", "rows x dim", "ids/sample", "sharding", "kernel", "ranks")
    rows = [head]
    for t in sorted(e["tables"], key=lambda t: -t["rows"] * t["dim"])[:max_tables]:
        ranks = t["ranks"]
        where = ("all" if len(ranks) == e["world_size"] and len(ranks) > 2 else
                 ",".join(map(str, ranks)))
        rows.append((t["name"], f"{t['rows']:,} x {t['dim']}", f"{t.get('pooling', 1) * t.get('features', 1):g}",
                     SHORT[t["sharding_type"]] + (f" x{len(t['shards'])}"
                                                  if t["sharding_type"] == "column_wise" else ""),
                     t["compute_kernel"] + (f" ({t['cache_ratio']:g} cached)"
                                            if "cache_ratio" in t else ""), where))
    out += table(rows, indent="  ")
    if len(e["tables"]) > max_tables:
        out.append(f"  ... and {len(e['tables']) - max_tables} smaller tables")
    s = e["solver"]
    gap = f", gap {100 * s['gap']:.1f}% of the sparse part" if s.get("gap") else ""
    greedy = (f"; greedy start {s['greedy_s'] * 1e3:.3f} ms -> {s['objective_s'] * 1e3:.3f} ms "
              "(the step the placement minimises)" if s.get("greedy_s") and s.get("objective_s")
              else "")
    out += ["", f"  search: CP-SAT table placement, {s['status']}{gap}{greedy}"]
    return out
