"""One transformer written three ways (examples/three_ways.py), predicted vs measured on this CPU.

1. Profile the machine in one process (`plan profile --processes 1`), or read a calibration given
   with --calibration.
2. Plan each way (plain Linear + scaled_dot_product_attention, nn.MultiheadAttention,
   nn.TransformerEncoder) as one CPU device (one process, one thread, fp32) with that calibration.
   The three are traced from the module, so each is priced from the ATen ops it runs.
3. Train the same module with plain torch (AdamW, one thread, freed memory kept for reuse as
   `plan run` does); the median of the timed steps after warm-up is the measured step time.
4. Print predicted vs measured and the error of each way; then, for scale, the plans of the
   full-size example (d 2048, 8 layers, batch 4 x 1,024, bf16) on one DGX A100 (8 GPUs): step
   time, MFU, and the spread of the three step times.

Usage:  python benchmarks/three_ways_measured.py [--calibration calib.json] [--steps 6] [--markdown]
Run it on an otherwise idle machine: other processes on the cores distort both steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import planner  # noqa: E402
import calibrations  # noqa: E402
from tables import print_table  # noqa: E402
from planner.inputs.calibration import apply_calibration  # noqa: E402
from costmodels.engine import EngineSpec  # noqa: E402
from planner.options import parse_fix  # noqa: E402

# Small enough for a CPU core (about a second a step), large enough that GEMMs dominate as on GPUs.
SIZE = {"dim": 256, "layers": 4, "heads": 4, "seq_len": 256}
WAYS = ("plain", "mha", "encoder")
# Plain PyTorch on a CPU: one kernel per op (no fusion); attention without dropout takes the fused
# CPU kernel of scaled_dot_product_attention, which keeps no s x s scores.
ENGINE = EngineSpec(attention="flash", kernels="eager", tp_grad_overlap=False)


def _examples():
    spec = importlib.util.spec_from_file_location("three_ways",
                                                  os.path.join(ROOT, "examples", "three_ways.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def predict(factory, calibration) -> float:
    with torch.device("meta"):
        model, inputs = factory(**SIZE)
    prepared = planner.prepare(model, example_inputs=inputs, dtype="fp32", cache_dir=None)
    cluster = apply_calibration(planner.load_cluster("cpu", nodes=1, gpus_per_node=1), calibration)
    batch = inputs[0].shape[0]
    training = planner.TrainingSpec(global_batch=batch, seq_len=SIZE["seq_len"], dtype="fp32",
                                    optimizer="adamw", engine=ENGINE)
    fix = parse_fix(f"dp=1,tp=1,pp=1,micro_batch={batch},recompute=none,zero=0")
    plan = planner.plan_prepared(prepared, cluster, training,
                                 planner.SearchOptions(fix=fix, top_k=0))
    return plan.step_time_s


def plan_a100(factory) -> tuple[float, float, str]:
    """(step s, MFU, configuration) of the full-size example planned freely on one DGX A100."""
    with torch.device("meta"):
        model, inputs = factory()
    plan = planner.plan(model, example_inputs=inputs, cluster="dgx-a100-80g", nodes=1,
                        global_batch=inputs[0].shape[0], dtype="bf16")
    return plan.step_time_s, plan.predicted["mfu"], plan.parallel_summary


def measure(factory, steps: int) -> float:
    torch.manual_seed(0)
    model, inputs = factory(**SIZE)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for step in range(steps + 2):
        t0 = time.perf_counter()
        model(*inputs).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= 2:  # the first steps allocate the optimizer state and warm the allocator
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", help="calibration JSON from `plan profile --processes 1` "
                                          "(default: profile now)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per way")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    calibration = calibrations.calibration(args.calibration, processes=1)
    if calibration.get("processes", 1) != 1:
        raise SystemExit("--calibration: measured with several processes at once; profile with "
                         "`plan profile --processes 1` for a one-process run")
    from planner.runtime.host_memory import keep_freed_memory

    keep_freed_memory()  # as `plan run` and `plan profile` do (no page faults per large tensor)
    torch.set_num_threads(1)
    examples = _examples()
    rows = []
    for way in WAYS:
        factory = getattr(examples, way)
        rows.append((way, predict(factory, calibration), measure(factory, args.steps)))
    head = ["way", "predicted s", "measured s", "error"]
    lines = [[n, f"{p:.3f}", f"{m:.3f}", f"{100 * (p / m - 1):+.1f}%"] for n, p, m in rows]
    print(f"On this CPU: d_model {SIZE['dim']}, {SIZE['layers']} layers, {SIZE['heads']} heads, "
          f"batch 4 x {SIZE['seq_len']} tokens, fp32, one thread\n")
    print_table(head, lines, args.markdown)
    errs = [abs(p / m - 1) for _, p, m in rows]
    print(f"\nmax |error| {100 * max(errs):.1f}%\n")
    a100 = [(way, *plan_a100(getattr(examples, way))) for way in WAYS]
    print("On one DGX A100 (8 GPUs): d_model 2048, 8 layers, 16 heads, batch 4 x 1,024 tokens, "
          "bf16\n")
    print_table(["way", "step s", "MFU", "plan"],
                [[w, f"{t:.4f}", f"{100 * u:.1f}%", c] for w, t, u, c in a100], args.markdown)
    steps = [t for _, t, _, _ in a100]
    print(f"\nslowest / fastest step {max(steps) / min(steps):.3f}; highest MFU "
          f"{100 * max(u for _, _, u, _ in a100):.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
