"""First-pipeline-stage memory against the closed forms of Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models" (MLSys'23), at the four configurations of their Table 3.

Each GPT (Hugging Face GPT-2 architecture at the paper's sizes, sequence 2,048, vocabulary
51,200, bf16, Adam) is traced on the meta device and planned at the paper's configuration (tensor
parallel 8 with sequence parallelism, the pipeline size, micro-batch, no data parallelism) with
selective and with full recomputation. Printed per component for the first stage, predicted vs
closed form:

- activations (their section 4): every transformer layer keeps ``s b h (34 + 5 a s / h) / t``
  bytes under sequence parallelism, ``34 s b h / t`` with selective recomputation and the layer
  input ``2 s b h / t`` with full recomputation; the first stage holds ``L / p`` layers of ``p``
  micro-batches (1F1B), ``p (1 + (p - 1) / (p v))`` with the interleaved schedule of ``v`` chunks
  per rank; the embedding's dropout mask adds ``s b h p / t``; without a pipeline the final norm,
  the output layer and the fp32 logits add ``4 s b h / t (1 + V / h)``. The paper's ``p`` for the
  mask is the first stage's in-flight count under 1F1B; under the interleaved schedule the first
  chunk (which holds the embedding) has ``2p - 1`` micro-batches in flight at the first backward
  (Megatron-LM's warm-up runs ``(v + 1) p - 1`` chunk forwards in groups of p per chunk, 2p - 1
  of them on chunk 0), and that count is used here.
- model states: 18 bytes per parameter as Megatron-Core keeps them without the distributed
  optimizer (bf16 weights, fp32 main gradients, fp32 master weights and Adam moments: its
  docs/user-guide/features/dist_optimizer.md) for the first stage's ``L / p`` layers, of which
  the ``12 h^2``
  weights and ``7 h`` biases of the column-parallel Linears are split t ways and the ``6 h`` of the
  norms and row-parallel biases are not, the vocabulary-parallel word embedding ``V h / t`` and the
  position embedding ``s h``, which Megatron-LM keeps whole on every rank.

Usage:  python benchmarks/memory.py [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import planner  # noqa: E402
from tables import print_table  # noqa: E402
from planner.options import parse_fix  # noqa: E402

SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Config:
    """A row of Korthikanti et al., Table 3."""

    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    micro_batch: int
    global_batch: int
    vpp: int = 1
    """Chunks per rank of the interleaved schedule (1: plain 1F1B)."""


TABLE3 = [
    Config("22b", 64, 6144, 48, 8, 1, 4, 4),
    Config("175b", 96, 12288, 96, 8, 8, 1, 64),
    Config("530b", 128, 20480, 105, 8, 35, 1, 280, vpp=3),
    Config("1t", 160, 25600, 128, 8, 64, 1, 512),
]
MODES = ("selective", "full")


def closed_form(c: Config, recompute: str) -> dict:
    """First-stage activation and state bytes per GPU from the paper's formulas."""
    s, b, h, t, p, L = SEQ, c.micro_batch, c.hidden, c.tp, c.pp, c.layers
    per_layer = 2 * s * b * h / t if recompute == "full" else 34 * s * b * h / t
    in_flight = p * (1 + (p - 1) / (p * c.vpp)) if c.vpp > 1 else p
    acts = per_layer * (L / p) * min(in_flight, c.global_batch // b)
    first_chunk = min(2 * p - 1, c.global_batch // b) if c.vpp > 1 else p
    acts += s * b * h * first_chunk / t  # the embedding's dropout mask, per micro-batch in flight
    if p == 1:
        acts += 4 * s * b * h / t * (1 + VOCAB / h)  # final norm, output layer, fp32 logits
    params = ((12 * h * h + 7 * h) / t + 6 * h) * L / p + VOCAB * h / t + s * h
    return {"activations": acts, "states": 18 * params}


def predicted(prepared, c: Config, recompute: str) -> tuple[dict, object]:
    """First-stage activation and state bytes the planner predicts at the paper's configuration."""
    cluster = planner.load_cluster("dgx-a100-80g", nodes=c.tp * c.pp // 8, gpus_per_node=8)
    schedule = "interleaved-1f1b" if c.vpp > 1 else "1f1b"
    fix = parse_fix(f"tp={c.tp},pp={c.pp},dp=1,vpp={c.vpp},micro_batch={c.micro_batch},"
                    f"schedule={schedule},recompute={recompute},sequence_parallel=true,zero=0,"
                    "offload_optimizer=false")
    training = planner.TrainingSpec(global_batch=c.global_batch, seq_len=SEQ, dtype="bf16",
                                    optimizer="adam")
    opts = planner.SearchOptions(fix=fix, top_k=0, memory_reserve_fraction=0.0,
                                 memory_reserve_bytes=0.0)
    try:
        plan = planner.plan_prepared(prepared, cluster, training, opts)
    except planner.InfeasibleError as exc:
        return {}, exc
    mem = plan.stages[0]["predicted"]["memory_bytes"]
    states = mem["weights"] + mem["grads"] + mem["optimizer"]
    return {"activations": mem["activations"], "states": states}, plan


def prepare(c: Config):
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": c.hidden,
           "n_head": c.heads, "n_layer": c.layers, "vocab_size": VOCAB, "n_positions": SEQ}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return planner.prepare(path, seq_len=SEQ, dtype="bf16", cache_dir=None)


def rows() -> list[dict]:
    out = []
    for c in TABLE3:
        prepared = prepare(c)
        for mode in MODES:
            ref = closed_form(c, mode)
            got, plan = predicted(prepared, c, mode)
            out.append({"config": c, "mode": mode, "closed": ref, "predicted": got,
                        "error": None if got else str(plan)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    table, worst = [], 0.0
    for r in rows():
        c = r["config"]
        what = (f"{c.name} (t={c.tp}, p={c.pp}{f', v={c.vpp}' if c.vpp > 1 else ''}, "
                f"b={c.micro_batch})")
        if r["error"]:
            table.append([what, r["mode"], "does not fit: " + r["error"][:80], "", "", "", "", ""])
            worst = float("inf")
            continue
        cells = [what, r["mode"]]
        for part in ("activations", "states"):
            p, q = r["predicted"][part], r["closed"][part]
            worst = max(worst, abs(p / q - 1))
            cells += [f"{p / 2**30:.2f}", f"{q / 2**30:.2f}", f"{100 * (p / q - 1):+.1f}%"]
        table.append(cells)
    head = ["configuration", "recompute", "activations GiB", "closed form", "error",
            "states GiB", "closed form", "error"]
    print_table(head, table, args.markdown)
    print(f"\nlargest deviation {100 * worst:.1f}% (first pipeline stage; benchmark took "
          f"{time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
