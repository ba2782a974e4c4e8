"""GEMMs of shapes `plan profile` did not measure: predicted from its tables vs measured.

1. Measure this machine's GEMMs as `plan profile` does (one process, operands read from
   memory): the square table (by FLOPs) and the grid of shapes (every m, k, n of
   planner.profile.device.GRID_SIZES).
2. Measure GEMMs of other shapes, drawn log-uniformly between the grid's ends (seeded; none on
   the grid), and a few a small Mixture-of-Experts layer runs (tens to hundreds of routed tokens
   per expert against 256 x 1024 weights), the same way.
3. Print each shape's measured time and the error of two predictions (predicted / measured - 1):
   by FLOPs alone (the square table, as calibrations priced every GEMM before the grid) and by
   shape (costmodels.compute.shaped_rate in the grid), then the median and largest |error|.

Nothing is fitted: both predictions read the tables measured in step 1.

Usage:  python benchmarks/gemm_shapes.py [--shapes 30] [--seed 0] [--threads 1] [--device cpu]
                                         [--markdown]
Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

from costmodels.compute import gemm_time_s  # noqa: E402
from planner import load_cluster  # noqa: E402
from planner.profile import device as prof  # noqa: E402
from planner.profile.timing import Timer  # noqa: E402
from planner.runtime.host_memory import keep_freed_memory  # noqa: E402
from tables import print_table  # noqa: E402

MOE_SHAPES = [(44, 256, 1024), (111, 256, 1024), (1024, 111, 256), (111, 1024, 256),
              (256, 111, 512), (9, 256, 1024)]
"""(m, k, n) of expert GEMMs in the executed Mixtral benchmark's profile (routed tokens per
expert 9 to 111; forward, input gradient and weight gradient)."""


def drawn_shapes(count: int, seed: int, sizes: tuple) -> list[tuple[int, int, int]]:
    """``count`` shapes with m, k, n log-uniform between the grid's ends, none on the grid."""
    rng = random.Random(seed)
    lo, hi = math.log(sizes[0]), math.log(sizes[-1])
    out: list[tuple[int, int, int]] = []
    while len(out) < count:
        shape = tuple(int(round(math.exp(rng.uniform(lo, hi)))) for _ in range(3))
        if not any(d in sizes for d in shape):
            out.append(shape)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=30, help="shapes drawn (default 30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA GPU here; measure on a machine with one, or "
                 "leave --device out (cpu)")
    torch.set_num_threads(args.threads)
    if args.device == "cpu":
        keep_freed_memory()
    timer = Timer(args.device)
    dtype = "fp32"
    print(f"measuring the square table and the grid of shapes ({args.device}, fp32) ...",
          file=sys.stderr)
    square = prof.gemm_table(timer, dtype)
    grid = prof.gemm_grid(timer, dtype)
    sizes = prof.GRID_SIZES[args.device]
    base = load_cluster("cpu" if args.device == "cpu" else "dgx-h100").device
    huge = dataclasses.replace(base, hbm_bytes_per_s=1e18)  # the tables' own rates, unbounded
    by_flops = dataclasses.replace(huge, name="by FLOPs", gemm_table={dtype: tuple(
        tuple(r) for r in square)})
    by_shape = dataclasses.replace(by_flops, name="by shape", gemm_grid={dtype: grid},
                                   gemm_grid_sizes=tuple(sizes))
    shapes = drawn_shapes(args.shapes, args.seed, sizes)
    if args.device == "cpu":
        shapes += MOE_SHAPES
    print(f"measuring {len(shapes)} other shapes ...", file=sys.stderr)
    rows, errors = [], {"by FLOPs": [], "by shape": []}
    for m, k, n in shapes:
        measured = 2.0 * m * k * n / prof.cold_mm_rate(m, k, n, timer, dtype, min_s=0.1)
        cells = [f"{m} x {k} x {n}", f"{measured * 1e3:.3f}"]
        for dev in (by_flops, by_shape):
            err = gemm_time_s(1, m, n, k, dev, dtype) / measured - 1
            errors[dev.name].append(abs(err))
            cells.append(f"{err:+.1%}")
        rows.append(cells)
    print_table(["m x k x n", "measured ms", "error by FLOPs", "error by shape"], rows,
                args.markdown)
    print()
    for name, errs in errors.items():
        print(f"{name}: median |error| {statistics.median(errs):.1%}, max {max(errs):.1%} "
              f"(n={len(errs)})" + ("  " if args.markdown else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
