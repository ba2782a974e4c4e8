"""How long planning takes, and how much memory it needs.

Cases (issue goals in brackets, on a 2-core machine):
1. GPT-3 175B on 128 x 8 A100-80GB, global batch 1536, full search space
   [search <= 2 s, the whole `plan solve` command <= 10 s cold and <= 3 s warm];
2. Llama-3 405B on 2048 x 8 H100 (16,384 GPUs), global batch 2048, seq 8192 [search <= 30 s];
3. examples/multitower.py, a DAG of ~5,200 traced ops, pp=8 with 1F1B on 64 A100s, with a 30 s
   time limit [<= 60 s, time limit honoured within 10%];
4. DeepSeek-V3 (671B, 256 routed experts) on 256 x 8 H100 (2,048 GPUs), global batch 8192, seq
   4096, expert parallelism in the search [search < 5 s];
5. Llama-3 405B at 131,072 tokens per sequence on 16,384 H100, global batch 128 (16.8 M tokens),
   context parallelism in the search [search < 5 s].

And one what-if sweep: `plan whatif` of Llama-3 8B over 50 points (nodes 1-16 x tp 1-16 x two
recomputations on DGX H100) [the whole command < 60 s cold], the model traced once.

Each case runs the real CLI in a fresh process (so imports, tracing and output are included), twice:
cold (an empty trace cache: the model is traced) and warm (the trace read back from the cache, as
when re-planning a model the planner has seen). It reports both wall times, the peak resident
memory of the cold run, and the search time the planner records.

Usage:  python benchmarks/planning_time.py [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(HERE)

from tables import print_table  # noqa: E402

CASES = [
    ("GPT-3 175B, 1,024 A100", ["gpt3-175b", "--cluster", "dgx-a100-80g", "--nodes", "128",
                                "--global-batch", "1536", "--seq-len", "2048"], None),
    ("Llama-3 405B, 16,384 H100", ["llama3-405b", "--cluster", "dgx-h100", "--nodes", "2048",
                                   "--global-batch", "2048", "--seq-len", "8192"], None),
    ("multitower DAG, 64 A100, pp=8", ["examples/multitower.py:build", "--cluster", "dgx-a100-80g",
                                       "--nodes", "8", "--global-batch", "256",
                                       "--fix", "pp=8,schedule=1f1b"], 30.0),
    ("DeepSeek-V3, 2,048 H100", ["deepseek-v3", "--cluster", "dgx-h100", "--nodes", "256",
                                 "--global-batch", "8192", "--seq-len", "4096"], None),
    ("Llama-3 405B at 128k, 16,384 H100", ["llama3-405b", "--cluster", "dgx-h100", "--nodes",
                                           "2048", "--global-batch", "128",
                                           "--seq-len", "131072"], None),
]


def timed(cmd: list[str], cache_home: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd`` from the repository with its trace cache under ``cache_home``: the finished
    process and its wall seconds (a failure stops the benchmark with its error)."""
    env = {**os.environ, "XDG_CACHE_HOME": cache_home}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    return proc, wall


def run_case(argv: list[str], time_limit: float | None, cache_home: str) -> dict:
    """One run of ``plan solve`` with its trace cache under ``cache_home``."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "plan.json")
        cli = ["-q", "solve", *argv, "--record-timing", "-o", out]
        if time_limit:
            cli += ["--time-limit", str(time_limit)]
        proc, wall = timed([sys.executable, "-c", WRAPPER, json.dumps(cli)], cache_home)
        peak_kb = int(proc.stderr.strip().splitlines()[-1].split()[-1])
        with open(out) as f:
            plan = json.load(f)
    return {"wall_s": wall, "peak_mb": peak_kb / 1024, "plan": plan}


# Runs the CLI in this process and reports the process's peak resident memory on its last line.
WRAPPER = """
import json, resource, sys
from planner.cli.main import main
code = main(json.loads(sys.argv[1]))
print("peak_rss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


SWEEP = ["llama3-8b", "--cluster", "dgx-h100", "--global-batch", "512", "--seq-len", "8192",
         "--vary", "nodes=1,2,4,8,16", "--vary", "tp=1,2,4,8,16", "--vary", "recompute=none,full"]
"""The what-if sweep timed after the cases: 5 x 5 x 2 = 50 points."""


def run_sweep(cache_home: str) -> dict:
    """One run of ``plan whatif SWEEP`` with its trace cache under ``cache_home``: wall seconds
    and the rows of its CSV."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "sweep.csv")
        _, wall = timed([sys.executable, "-m", "planner.cli", "-q", "whatif", *SWEEP,
                         "--csv", out], cache_home)
        with open(out) as f:
            points = sum(1 for _ in f) - 1
    return {"wall_s": wall, "points": points}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    head = ["case", "GPUs", "configurations", "search s", "time limit s", "CLI cold s",
            "CLI warm s", "peak RSS MB", "status", "chosen"]
    rows = []
    for name, argv, limit in CASES:
        with tempfile.TemporaryDirectory() as cache_home:
            r = run_case(argv, limit, cache_home)
            warm = run_case(argv, limit, cache_home)
        p = r["plan"]
        par = p["parallel"]
        extra = "".join(f" {k}={par[k]}" for k in ("cp", "ep") if par.get(k, 1) > 1)
        chosen = (f"dp={par['dp']} tp={par['tp']} pp={par['pp']}x{par['vpp']}{extra} "
                  f"{par['schedule']} rc={par['recompute']} zero={par['zero']}")
        rows.append([name, str(p["cluster"]["num_gpus"]), str(p["search"]["candidates"]),
                     f"{p['search']['time_s']:.2f}", f"{limit:g}" if limit else "-",
                     f"{r['wall_s']:.1f}", f"{warm['wall_s']:.1f}", f"{r['peak_mb']:.0f}",
                     p["search"]["status"], chosen])
    print_table(head, rows, args.markdown)
    with tempfile.TemporaryDirectory() as cache_home:
        cold, warm = run_sweep(cache_home), run_sweep(cache_home)
    print(f"\nwhat-if sweep (`plan whatif {' '.join(SWEEP)}`): {cold['points']} points in "
          f"{cold['wall_s']:.1f} s cold (the model traced once), {warm['wall_s']:.1f} s warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
