"""Predicted vs measured step time of small training configurations on this machine's CPU.

1. Profile the machine (`plan profile`: GEMM speed by size, memory bandwidth, per-op cost, gloo
   all-reduce among two processes), or read a calibration given with --calibration.
2. Plan each configuration of a small GPT (Hugging Face GPT-2 architecture, fp32) on the `cpu`
   cluster preset with that calibration, pinning the configuration with `fix`.
3. Run the same work with plain torch: one process per device, one thread each (a CPU "device" is
   one process on one core), AdamW, DistributedDataParallel over gloo for two processes, freed
   memory kept for reuse (planner.runtime.host_memory, as `plan run` does); the median of the timed steps
   after warm-up is the measured step time.
4. Print predicted vs measured, the error, and whether the predicted order matches the measured one.

One configuration fine-tunes the upper half: the embeddings and the first two of the four blocks
frozen (requires_grad=False), planned from the model so frozen (weights held, no gradients,
optimizer states or weight-gradient GEMMs for them, no backward below the first trained block).

Usage:  python benchmarks/cpu_measured.py [--calibration calib.json] [--steps 8] [--markdown]
Run it on an otherwise idle machine: other processes on the two cores distort both steps.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import planner  # noqa: E402
import calibrations  # noqa: E402
from tables import print_table  # noqa: E402
from costmodels.engine import EngineSpec  # noqa: E402
from planner.inputs.calibration import apply_calibration  # noqa: E402
from planner.options import parse_fix  # noqa: E402

CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 4, "n_embd": 256,
          "n_head": 4, "vocab_size": 8192, "n_positions": 256, "bos_token_id": 0, "eos_token_id": 0}
SEQ = 256
# PyTorch on a CPU: one kernel per op; the attention scores materialized (with dropout in
# training, scaled_dot_product_attention takes its math path: matmul, softmax, dropout, matmul);
# and no overlap of the gradient all-reduce with backward, since gloo reduces on the same core.
ENGINE = EngineSpec(attention="materialized", kernels="eager",
                                    overlap_grad_reduce=False, tp_grad_overlap=False)
# name: (processes, micro-batch, micro-batches per step, recompute, lower half frozen)
RUNS = {
    "1 proc, mb 2": (1, 2, 1, "none", False),
    "1 proc, mb 4": (1, 4, 1, "none", False),
    "1 proc, mb 4, full recompute": (1, 4, 1, "full", False),
    "1 proc, mb 4 x 2 accumulated": (1, 4, 2, "none", False),
    "2 procs DP, mb 6 each": (2, 6, 1, "none", False),
    "1 proc, mb 4, lower half frozen": (1, 4, 1, "none", True),
}
FROZEN = ("transformer.wte", "transformer.wpe", "transformer.h.0", "transformer.h.1")
"""Modules the fine-tuning configuration freezes."""


def gpt2(frozen: bool):
    """The GPT-2 of CONFIG (on the current device), its lower half frozen if ``frozen``."""
    from transformers import AutoConfig, GPT2LMHeadModel

    cfg = dict(CONFIG)
    model_type = cfg.pop("model_type")
    cfg.pop("architectures")
    model = GPT2LMHeadModel(AutoConfig.for_model(model_type, **cfg)).train()
    for name in FROZEN if frozen else ():
        model.get_submodule(name).requires_grad_(False)
    return model


def predict(prepared, calibration, procs, mb, m, rc) -> float:
    cluster = apply_calibration(
        planner.load_cluster("cpu", nodes=1, gpus_per_node=procs), calibration)
    training = planner.TrainingSpec(
        global_batch=procs * mb * m, seq_len=SEQ, dtype="fp32", optimizer="adamw",
        engine=ENGINE)
    fix = parse_fix(f"dp={procs},tp=1,pp=1,micro_batch={mb},recompute={rc},zero=0")
    plan = planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(fix=fix, top_k=0))
    return plan.step_time_s


def _worker(rank, world, port, mb, m, rc, frozen, steps, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from planner.runtime.host_memory import keep_freed_memory

    keep_freed_memory()  # as `plan run` and `plan profile` do (no page faults per large tensor)
    import torch.distributed as dist

    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = gpt2(frozen)
    if rc == "full":
        model.gradient_checkpointing_enable()
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, CONFIG["vocab_size"], (mb, SEQ))
    times = []
    for step in range(steps + 2):
        t0 = time.perf_counter()
        for i in range(m):
            sync = world == 1 or i == m - 1
            ctx = net.no_sync() if not sync else _null()
            with ctx:
                net(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= 2:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(times, f)
    if world > 1:
        dist.destroy_process_group()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def measure(procs, mb, m, rc, frozen, steps) -> float:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    ctx = mp.start_processes(_worker, args=(procs, port, mb, m, rc, frozen, steps, out),
                             nprocs=procs, join=False, start_method="spawn")
    deadline = time.monotonic() + 600
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise SystemExit(f"measurement of {procs} process(es) did not finish in 600 s")
    with open(out) as f:
        times = json.load(f)
    os.unlink(out)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", help="calibration JSON (default: profile now)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per configuration")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    calibration = calibrations.calibration(args.calibration, processes=2)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(CONFIG, f)
        prepared = {False: planner.prepare(path, seq_len=SEQ, dtype="fp32")}
    with torch.device("meta"):
        ids = torch.randint(0, CONFIG["vocab_size"], (1, SEQ))
        prepared[True] = planner.prepare(gpt2(frozen=True), dtype="fp32",
                                         example_inputs={"input_ids": ids, "labels": ids})
    rows = []
    for name, (procs, mb, m, rc, frozen) in RUNS.items():
        pred = predict(prepared[frozen], calibration, procs, mb, m, rc)
        meas = measure(procs, mb, m, rc, frozen, args.steps)
        rows.append((name, pred, meas))
    report(rows, args.markdown)
    return 0


def report(rows, markdown: bool) -> None:
    head = ["configuration", "predicted s", "measured s", "error"]
    lines = [[n, f"{p:.3f}", f"{m:.3f}", f"{100 * (p / m - 1):+.1f}%"] for n, p, m in rows]
    print_table(head, lines, markdown)
    errs = [abs(p / m - 1) for _, p, m in rows]
    same = ([n for n, _, _ in sorted(rows, key=lambda r: r[1])] ==
            [n for n, _, _ in sorted(rows, key=lambda r: r[2])])
    print(f"\nmedian |error| {100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}%; "
          f"predicted order {'matches' if same else 'differs from'} the measured order")


if __name__ == "__main__":
    sys.exit(main())
