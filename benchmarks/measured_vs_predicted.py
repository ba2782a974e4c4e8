"""Predicted vs measured step time of plans executed by the runtime (`plan run`) on this machine.

1. Plan each configuration of a small Llama (Hugging Face config, fp32, AdamW) on the `cpu` cluster
   preset with 1 or 2 processes, pinning it with `fix`, on the preset as this machine's
   calibration corrects it: `plan profile --processes N` run first for N = 1 and 2 (a plan with N
   processes uses the calibration of N processes at work: they share caches and memory
   bandwidth), or --calibration FILE for all.
2. Run each plan with the runtime exactly as `plan run` does (torchrun, gloo, torch.distributed
   pipelining / DTensor / replicate / FSDP2), one thread per process by default (a CPU "device"
   is one process on one core, as `plan profile` measures it).
   Rounds (--repeats, default 5): each profiles the machine, plans every configuration with that
   calibration and launches each once; this VM's speed drifts over minutes, so a calibration is
   compared with runs taken right after it.
3. Print predicted vs measured step time (per launch the slowest rank's median timed step; medians
   over the rounds, the spread of the launches), the error (median over rounds of predicted /
   measured - 1), peak tensor memory predicted vs measured, and whether the predicted order of
   the configurations matches the measured one.

``--model mixtral`` runs a small Mixtral instead (8 experts, top-2) with expert parallelism
(EP=2 folded over DP=2) and context parallelism (CP=2, the runtime's p2p ring), next to plain
data parallelism and one process. Its untrained router spreads tokens unevenly, and the
expert-parallel ranks wait for the busiest: the plans are priced with the routing imbalance of
the model's own first forward on the benchmark's batch (the busiest expert's token copies over
the mean, per layer, averaged; one forward in this process before planning, like a calibration
of the workload rather than of the machine), and the run's own routing is printed next to it.

Usage:  python benchmarks/measured_vs_predicted.py [--model llama|mixtral]
                  [--calibration calib.json | --uncalibrated]
                  [--steps 6] [--repeats 5] [--threads 1] [--markdown] [--only NAME ...]
Run it on an otherwise idle machine: other processes on the cores distort the measured times.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import planner  # noqa: E402
from tables import print_table  # noqa: E402
from costmodels.engine import EngineSpec  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.options import parse_fix  # noqa: E402
from planner.runtime import experts as moe  # noqa: E402
from planner.runtime import model as mdl  # noqa: E402
from planner.runtime.launch import check, run_local  # noqa: E402
from planner.runtime.options import RunOptions  # noqa: E402

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
          "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4,
          "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 512,
          "tie_word_embeddings": False}
SEQ = 128
GLOBAL_BATCH = 8
# PyTorch on a CPU: one kernel per op, and no overlap of gloo's all-reduce with backward (the
# reduction runs on the same core); without dropout, attention runs as one fused kernel; data
# parallelism is FSDP2-based (replicate / fully_shard), which copies through flat buffers; the
# runtime runs every plan's micro-batches under torch.distributed.pipelining's schedules, and
# context parallelism with its own ring.
ENGINE = EngineSpec(attention="flash", kernels="eager", overlap_grad_reduce=False,
                    fsdp_copies=True, pipelined_accumulation=True, cp_ring="runtime",
                    tp_grad_overlap=False)
MIXTRAL = {"model_type": "mixtral", "num_hidden_layers": 4, "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
           "vocab_size": 8192, "max_position_embeddings": 512, "num_local_experts": 8,
           "num_experts_per_tok": 2}
MOE_RUNS = {
    "1 proc, mb 4 x 2": "dp=1,tp=1,pp=1,ep=1,micro_batch=4,recompute=none,zero=0",
    "2 procs dp": "dp=2,tp=1,pp=1,ep=1,micro_batch=4,recompute=none,zero=0",
    "2 procs ep (over dp)": "dp=2,tp=1,pp=1,ep=2,micro_batch=4,recompute=none,zero=0",
    "2 procs cp (ring), mb 4 x 2": "dp=1,tp=1,pp=1,cp=2,ep=1,micro_batch=4,recompute=none,zero=0",
}
RUNS = {
    "1 proc, mb 8": "dp=1,tp=1,pp=1,micro_batch=8,recompute=none,zero=0",
    "1 proc, mb 2 x 4": "dp=1,tp=1,pp=1,micro_batch=2,recompute=none,zero=0",
    "1 proc, mb 8, full recompute": "dp=1,tp=1,pp=1,micro_batch=8,recompute=full,zero=0",
    "2 procs dp, replicate": "dp=2,tp=1,pp=1,micro_batch=4,recompute=none,zero=0",
    "2 procs dp, fsdp (zero-1)": "dp=2,tp=1,pp=1,micro_batch=4,recompute=none,zero=1",
    "2 procs tp": "dp=1,tp=2,pp=1,micro_batch=8,recompute=none,zero=0,sequence_parallel=false",
    "2 procs pp, gpipe 2 x 4": "dp=1,tp=1,pp=2,micro_batch=2,schedule=gpipe,recompute=none,zero=0",
    "2 procs pp, 1f1b 2 x 4": "dp=1,tp=1,pp=2,micro_batch=2,schedule=1f1b,recompute=none,zero=0",
}
MODELS = {"llama": (CONFIG, RUNS), "mixtral": (MIXTRAL, MOE_RUNS)}


def make_plan(prepared, fix: str, calibration, folder: str, name: str,
              engine: EngineSpec = ENGINE) -> str:
    pinned = {"offload_optimizer": False, **parse_fix(fix)}  # the runtime does not offload
    procs = pinned["dp"] * pinned["tp"] * pinned["pp"] * pinned.get("cp", 1)
    if isinstance(calibration, dict) and "schema" not in calibration:  # one per process count
        calibration = calibration[procs]
    training = planner.TrainingSpec(global_batch=GLOBAL_BATCH, seq_len=SEQ, dtype="fp32",
                                    optimizer="adamw", engine=engine)
    cluster = planner.load_cluster("cpu", nodes=1, gpus_per_node=procs)
    if calibration is not None:
        from planner.inputs.calibration import apply_calibration

        cluster = apply_calibration(cluster, calibration)
    plan = planner.plan_prepared(prepared, cluster, training,
                                 planner.SearchOptions(fix=pinned, top_k=0))
    path = os.path.join(folder, f"{name.replace(' ', '_').replace(',', '')}.json")
    plan.save(path)
    return path


def run_all(model: str, names, calibrate, steps: int, threads: int, repeats: int) -> list[dict]:
    """``repeats`` rounds; each takes its calibration (``calibrate()``: profiled at that moment
    by default, since this VM's speed drifts over minutes), plans every configuration with it and
    launches each once, round-robin. A launch's time is its slowest rank's median step; a
    configuration's error is the median over rounds of predicted / measured - 1."""
    log = logging.getLogger("benchmark")
    pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    launches: dict[str, list[dict]] = {name: [] for name in names}
    opts = RunOptions(steps=steps, warmup=2, lr=1e-4, device="cpu", threads=threads)
    with tempfile.TemporaryDirectory() as d:
        config = os.path.join(d, "config.json")
        with open(config, "w") as f:
            json.dump(MODELS[model][0], f)
        prepared = planner.prepare(config, seq_len=SEQ, dtype="fp32")
        engine = ENGINE
        if model == "mixtral":
            engine = dataclasses.replace(ENGINE, moe_imbalance=routing_imbalance(prepared, d))
            log.warning("routing of the untrained router on the benchmark's batch: the busiest "
                        "expert gets %.2f x the mean token copies (moe_imbalance of the plans)",
                        engine.moe_imbalance)
        for rep in range(repeats):
            calibration = calibrate()
            folder = os.path.join(d, f"round{rep}")
            os.makedirs(folder)
            for name in names:
                fix = MODELS[model][1][name]
                res = _launch(make_plan(prepared, fix, calibration, folder, name, engine), opts,
                              name)
                m = res["measured"]
                if m.get("routing"):
                    log.warning("%s: the run's routing: busiest expert %.2f x the mean, busiest "
                                "rank %.2f x", name, m["routing"]["busiest_expert"],
                                m["routing"]["busiest_rank"])
                launches[name].append(res)
                pairs[name].append((m["predicted_step_time_s"], m["step_time_s"]))
                log.warning("%s (round %d/%d): measured %.4f s, predicted %.4f s", name, rep + 1,
                            repeats, m["step_time_s"], m["predicted_step_time_s"])
    rows = []
    for name in names:
        runs = launches[name]
        preds = [p for p, _ in pairs[name]]
        times = [t for _, t in pairs[name]]
        peaks = [r["measured"]["peak_memory_bytes"] for r in runs
                 if r["measured"]["peak_memory_bytes"] is not None]
        rows.append({"name": name, "predicted_s": statistics.median(preds),
                     "measured_s": statistics.median(times), "spread": (min(times), max(times)),
                     "error": statistics.median(p / t - 1 for p, t in pairs[name]),
                     "predicted_mem": runs[0]["measured"]["predicted_peak_memory_bytes"],
                     "measured_mem": max(peaks) if peaks else None,
                     "notes": _notes(runs)})
    return rows


def _notes(runs: list[dict]) -> list[str]:
    """The launches' notes, one line per kind (the text before its parenthesis), with how many
    distinct notes of that kind the ranks of all launches reported."""
    kinds: dict[str, int] = {}
    for r in runs:
        for note in dict.fromkeys(r["notes"]):
            key = note.split(" (")[0]
            kinds[key] = kinds.get(key, 0) + 1
    return [f"{k} ({n} times over {len(runs)} launches)" for k, n in kinds.items()]


def _launch(path: str, opts: RunOptions, name: str) -> dict:
    """One `plan run`; a launch whose processes fail is retried once (and reported)."""
    try:
        return run_local(check(path, opts, None), opts)
    except PlannerError as exc:
        logging.getLogger("benchmark").warning("%s: launch failed (%s); retrying once", name, exc)
        res = run_local(check(path, opts, None), opts)
        res["notes"] = res["notes"] + [f"one launch failed and was retried: {exc}"]
        return res


def routing_imbalance(prepared, folder: str) -> float:
    """The busiest expert's token copies over the mean, per MoE layer, averaged over the layers,
    in one forward of the model the runtime builds (seed 0) on the whole global batch: the tokens
    one call of the expert-parallel group routes in MOE_RUNS' ep plan (dp=2 ranks of one
    micro-batch each)."""
    plan = planner.load_plan(make_plan(prepared, MOE_RUNS["1 proc, mb 4 x 2"], None, folder,
                                       "routing probe"))
    spec = plan.model_spec()
    real = mdl.build_real(plan, spec, mdl.resolve_meta(plan, spec), seed=0)
    calls = moe.routed_experts(real.module, *mdl.synthetic_batch(real, GLOBAL_BATCH, seed=0),
                               **real.kwargs)
    experts = MIXTRAL["num_local_experts"]
    return statistics.mean(moe.load_ratios(idx, experts, ep=1)[0] for idx in calls)


def concordance(rows: list[dict]) -> float:
    """Share of configuration pairs that the prediction orders as the measurement does."""
    pairs = list(itertools.combinations(rows, 2))
    same = sum((a["predicted_s"] - b["predicted_s"]) * (a["measured_s"] - b["measured_s"]) > 0
               for a, b in pairs)
    return same / len(pairs) if pairs else 1.0


def report(rows: list[dict], markdown: bool) -> None:
    head = ["configuration", "predicted s", "measured s", "launches min-max", "error",
            "pred. peak MB", "meas. peak MB"]
    lines = [[r["name"], f"{r['predicted_s']:.4f}", f"{r['measured_s']:.4f}",
              f"{r['spread'][0]:.3f}-{r['spread'][1]:.3f}",
              f"{100 * r['error']:+.1f}%",
              f"{r['predicted_mem'] / 1e6:.1f}",
              "-" if r["measured_mem"] is None else f"{r['measured_mem'] / 1e6:.1f}"]
             for r in rows]
    print_table(head, lines, markdown)
    errs = [abs(r["error"]) for r in rows]
    by_pred = [r["name"] for r in sorted(rows, key=lambda r: r["predicted_s"])]
    by_meas = [r["name"] for r in sorted(rows, key=lambda r: r["measured_s"])]
    print(f"\nmedian |error| {100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}%; "
          f"predicted order {'matches' if by_pred == by_meas else 'differs from'} the measured "
          f"order ({100 * concordance(rows):.0f}% of pairs ordered alike)")
    print("measured fastest to slowest: " + "; ".join(by_meas))
    for r in rows:
        for note in r["notes"]:
            print(f"note ({r['name']}): {note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", help="calibration JSON from `plan profile` (default: "
                    "profile this machine now)")
    ap.add_argument("--uncalibrated", action="store_true",
                    help="predict from the `cpu` preset's data-sheet numbers instead")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per configuration")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per process (default 1)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="rounds (calibration, then one launch per configuration); default 5")
    ap.add_argument("--model", choices=list(MODELS), default="llama",
                    help="llama (default) or mixtral (expert and context parallelism)")
    ap.add_argument("--only", nargs="*", choices=[*RUNS, *MOE_RUNS], help="run only these")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.calibration:
        from planner.inputs.calibration import load_calibration

        fixed = load_calibration(args.calibration)
        calibrate = lambda: fixed  # noqa: E731
    elif args.uncalibrated:
        calibrate = lambda: None  # noqa: E731
    else:
        from planner.profile.device import profile

        # one calibration per number of processes at work: on a CPU the "devices" share caches
        # and memory bandwidth, so one process alone runs faster than each of two together
        def calibrate():
            return {n: profile("cpu", threads=1, processes=n) for n in (1, 2)}
    runs = MODELS[args.model][1]
    unknown = [n for n in args.only or [] if n not in runs]
    if unknown:
        ap.error(f"--only: {unknown[0]!r} is not a run of --model {args.model}; choose from "
                 + "; ".join(runs))
    rows = run_all(args.model, args.only or list(runs), calibrate, args.steps, args.threads,
                   args.repeats)
    report(rows, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
