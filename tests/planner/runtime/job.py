"""A torchrun job for the runtime tests: run several plans (same process count) one after the
other in one process group, so the slow start of processes is paid once.

    torchrun --nproc-per-node N tests/planner/runtime/job.py RESULT.json DUMP_ROOT LR PLAN.json ...

One optimizer step per plan (no warm-up), parameters dumped per stage under DUMP_ROOT/<plan name>.
The tests start it with ``run_cases(...)`` (one job per process count) or ``torchrun(...)`` below.
"""

import datetime
import json
import os
import socket
import subprocess
import sys

import torch.distributed as dist

from planner.planfile.document import atomic_write, load_plan
from planner.runtime.options import RunOptions
from planner.runtime.worker import execute, pick_device


def main(result: str, dump_root: str, lr: float, plans: list[str]) -> None:
    device = pick_device("cpu")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    out = {}
    for path in plans:
        name = os.path.basename(path).removesuffix(".json")
        opts = RunOptions(steps=1, warmup=0, lr=lr, device="cpu",
                          dump_dir=os.path.join(dump_root, name))
        out[name] = execute(load_plan(path), opts, device)
    if dist.get_rank() == 0:
        atomic_write(result, json.dumps(out, indent=1))
    dist.destroy_process_group()


TEARDOWN_ABORT = "terminate called without an active exception"
"""What a gloo process on this CPU prints, now and then, when it aborts as it shuts down (a C++
thread still joinable at exit; the job skips the interpreter's teardown to avoid it); the job is
run once more when that is how it failed all the same."""


def torchrun(nproc: int, result: str, dump: str, plans: list[str], *, lr: float) -> None:
    """Run this job on ``nproc`` local gloo processes (raises with their output if it fails;
    one more try when a process aborted as gloo shut down, TEARDOWN_ABORT)."""
    for attempt in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-addr", "127.0.0.1", "--master-port", str(port),
                os.path.abspath(__file__), result, dump, repr(lr), *plans]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        output = proc.stdout + proc.stderr
        if proc.returncode == 0:
            return
        if attempt == 2 or TEARDOWN_ABORT not in output:
            raise AssertionError(f"torchrun job failed:\n{output[-6000:]}")


def run_cases(root, jobs: list[tuple[int, dict[str, str]]], *, lr: float) -> dict:
    """One torchrun job per (process count, {case name: plan path}) under the folder ``root``;
    -> {case name: (plan path, result dict, dump folder)}."""
    out = {}
    for nproc, paths in jobs:
        result = os.path.join(str(root), f"result{nproc}.json")
        dump = os.path.join(str(root), "dump")
        torchrun(nproc, result, dump, list(paths.values()), lr=lr)
        with open(result) as f:
            res = json.load(f)
        for name, path in paths.items():
            key = os.path.basename(path).removesuffix(".json")
            out[name] = (path, res[key], os.path.join(dump, key))
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:])
    sys.stdout.flush()
    sys.stderr.flush()
    # done (rank 0 wrote the result, the process group is destroyed): skip the interpreter's
    # teardown, where gloo now and then aborts (TEARDOWN_ABORT), as planner.runtime.worker does
    os._exit(0)
