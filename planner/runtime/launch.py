"""Start the processes of a plan with torchrun, or say what each node must run.

The launcher never initializes torch.distributed itself: it checks the plan against the model and
this machine (fingerprint, process count, memory), then runs
``python -m torch.distributed.run --nproc-per-node N ... -m planner.runtime.worker PLAN ...``,
torchrun's environment contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) on
localhost, and reads the JSON that rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

from planner.errors import PlannerError, RunError, SpecError, sigterm_raises
from planner.planfile.document import Plan, load_plan
from planner.runtime import model as mdl
from planner.runtime.build import check_knobs, check_model
from planner.runtime.layout import layout_of
from planner.runtime.options import RunOptions
from planner.runtime.stages import units_of
from planner.trace.models import TORCH_DTYPES
from planner.units import gb

log = logging.getLogger(__name__)

ERROR_MARK = "plan run: error: "
"""A worker prints this before a one-line refusal (then exits 2)."""
CRASH_MARK = "plan run: crashed: "
"""A worker prints this before the last line of an unexpected exception."""
MAX_CPU_PROCESSES = 8
"""More CPU processes than this turn a test run into a crawl on any workstation."""
MEMORY_USE_FRACTION = 0.8
"""Share of the available RAM a run may plan to use."""


@dataclass(frozen=True, kw_only=True)
class Launch:
    """A checked plan and how to start it."""

    plan_path: str
    plan: Plan
    nodes: int
    nproc_per_node: int
    device: str
    """cpu or cuda: what the processes will use."""


def check(plan_path: str, opts: RunOptions, nproc: int | None, *, dry_run: bool = False) -> Launch:
    """Everything that can be refused before a process starts (SpecError, one line). A dry run
    (the launch command for the plan's own cluster) skips what only this host must offer."""
    plan = load_plan(plan_path)
    if plan.training.get("dtype") == "fp8":
        raise SpecError("training.dtype: an fp8 plan runs on Transformer Engine (Megatron-Core, "
                        "torchtitan's Float8); plan run executes bf16, fp16 and fp32 plans: "
                        "re-plan with --dtype bf16 to run it here")
    layout = layout_of(plan)
    check_knobs(plan)
    spec = plan.model_spec(opts.model)
    meta = mdl.resolve_meta(plan, spec)
    mdl.check_fingerprint(plan, spec, meta.fingerprint)
    mdl.check_runnable(meta)
    units_of(meta.module, [st["modules"] for st in plan.stages])  # refuses what cannot be cut
    check_model(plan, meta.module, layout)
    nodes = int(plan.cluster["nodes"])
    widths = sorted({int(g["gpus_per_node"]) for g in plan.cluster.get("groups") or []})
    if len(widths) > 1:
        raise SpecError(f"cluster.groups: nodes of {' and '.join(map(str, widths))} GPUs; "
                        "torchrun starts as many processes on every node, so plan run cannot "
                        "launch this plan (plan export turns it into an engine's settings)")
    per_node = nproc or -(-layout.world // nodes)
    if per_node * nodes != layout.world:
        raise SpecError(f"nproc: {per_node} processes per node x {nodes} nodes != dp*cp*tp*pp = "
                        f"{layout.world} that the plan needs; pass --nproc {layout.world // nodes}")
    if dry_run:
        cuda = opts.device == "cuda" or (opts.device == "auto" and
                                         not str(plan.cluster.get("device", "")).startswith("cpu"))
        return Launch(plan_path=plan_path, plan=plan, nodes=nodes, nproc_per_node=per_node,
                      device="cuda" if cuda else "cpu")
    if nodes > 1:
        raise SpecError(f"cluster.nodes: the plan spans {nodes} nodes x {per_node} processes; this "
                        "host starts the processes of one node. Print the launch command for the "
                        "cluster with `plan run --dry-run`")
    cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    if cuda:
        visible = torch.cuda.device_count()
        if visible == 0:
            raise SpecError("device: cuda, but this machine shows no GPU; run with --device cpu "
                            "(or auto)")
        if per_node > visible:
            raise SpecError(f"cluster.gpus_per_node: the plan needs {per_node} processes per "
                            f"node but {visible} GPUs are visible; run it on a machine with "
                            f"{per_node}")
    elif per_node > MAX_CPU_PROCESSES:
        raise SpecError(f"cluster.gpus_per_node: the plan needs {per_node} processes per node; "
                        f"on CPU the runtime starts at most {MAX_CPU_PROCESSES} (plan with "
                        f"dp*cp*tp*pp <= {MAX_CPU_PROCESSES}, or use GPUs)")
    warn_device(plan, cuda)
    _check_memory(plan, per_node, cuda)
    return Launch(plan_path=plan_path, plan=plan, nodes=nodes, nproc_per_node=per_node,
                  device="cuda" if cuda else "cpu")


def host_bytes(plan: Plan, nproc: int, cuda: bool) -> float:
    """Host memory ``nproc`` processes of one node take: each builds the whole model on the CPU
    before keeping its stages (and, on CPU, then trains there: the predicted peak)."""
    weight_bytes = plan.model["num_params"] * TORCH_DTYPES[plan.training["dtype"]].itemsize
    return nproc * (weight_bytes + (0 if cuda else plan.predicted["peak_memory_bytes"]))


def _check_memory(plan: Plan, nproc: int, cuda: bool) -> None:
    """The processes' host memory (host_bytes) must fit this machine; on GPUs the predicted
    peak must also fit each device."""
    peak = plan.predicted["peak_memory_bytes"]
    need = host_bytes(plan, nproc, cuda)
    have = _available_bytes()
    if have and need > MEMORY_USE_FRACTION * have:
        training = 0.0 if cuda else nproc * peak
        weights = need - training
        parts = (f"each builds all {plan.model['num_params']:,} parameters: {weights / 1e9:.1f} GB "
                 "together")
        if training:
            parts += (f"; and trains here at the plan's predicted peak of {gb(peak)} a process: "
                      f"{training / 1e9:.1f} GB together")
        fix = ("re-plan for this machine (--cluster cpu) with a smaller batch or sequence, whose "
               "peak is smaller" if training > weights else
               "the runtime is for small models, run a smaller one")
        raise SpecError(f"model: {plan.model['name']} needs about {need / 1e9:.1f} GB over "
                        f"{nproc} processes ({parts}) but this machine has {have / 1e9:.1f} GB "
                        f"free; {fix}")
    if cuda:
        device_bytes = torch.cuda.get_device_properties(0).total_memory
        if peak > device_bytes:
            raise SpecError(f"model: the plan's predicted peak of {peak / 1e9:.1f} GB per GPU "
                            f"exceeds this machine's {device_bytes / 1e9:.1f} GB GPUs; plan for "
                            "them (--cluster with their device) and run that plan")


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def torchrun_argv(launch: Launch, opts: RunOptions, *, result: str, node_rank: int = 0,
                  master_addr: str = "127.0.0.1", master_port: int = 29500) -> list[str]:
    """The command one node runs (torchrun's static rendezvous on MASTER_ADDR:MASTER_PORT)."""
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(launch.nodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(launch.nproc_per_node),
            "--master-addr", master_addr, "--master-port", str(master_port),
            "-m", "planner.runtime.worker", launch.plan_path, "--result", result, *opts.argv()]


def cluster_command(launch: Launch, opts: RunOptions, result: str) -> str:
    """The one shell command every node of the plan's cluster runs: torchrun with a c10d
    rendezvous at ``$HEAD_NODE:29500`` (the first node's address; torchrun assigns the node ranks),
    keyed by the plan's input hash so that two runs do not meet; on one node, torchrun's
    ``--standalone`` rendezvous. On a cluster of node groups or sites a node's rank decides which
    stages its devices run, so each node is given its own (``$NODE_RANK``: node_groups)."""
    return torchrun_command(launch.nodes, launch.nproc_per_node,
                            f"plan-{launch.plan.provenance.get('input_hash', 'run')}",
                            ["-m", "planner.runtime.worker", launch.plan_path, "--result", result,
                             *opts.argv()], fixed_node_ranks=bool(node_groups(launch.plan)))


def node_groups(plan: Plan) -> list[str]:
    """Which node ranks belong to which group of the plan's cluster (ranks are numbered group by
    group, in the order the cluster lists them), as ``nodes 0-1: a100 (a100-80g)``; empty for
    a cluster of one group."""
    out, first = [], 0
    for g in plan.cluster.get("groups") or []:
        last = first + int(g["nodes"]) - 1
        out.append(f"node{'s' if last > first else ''} {first}"
                   + (f"-{last}" if last > first else "") + f": {g['name']} ({g['device']})")
        first = last + 1
    return out


def torchrun_command(nodes: int, nproc_per_node: int, run_id: str, worker: list[str], *,
                     fixed_node_ranks: bool = False) -> str:
    """torchrun running ``worker`` (its -m module and arguments) on every node: on one node its
    ``--standalone`` rendezvous, else a c10d rendezvous at ``$HEAD_NODE:29500`` keyed by
    ``run_id``, so that two runs do not meet; with ``fixed_node_ranks`` a static rendezvous at
    ``$HEAD_NODE:29500`` where each node passes its own ``$NODE_RANK``."""
    if nodes == 1:
        return shlex.join(["torchrun", "--standalone", "--nproc-per-node", str(nproc_per_node),
                           *worker])
    if fixed_node_ranks:
        argv = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(nproc_per_node),
                "--node-rank", "NODE_RANK", "--master-addr", "HEAD_NODE", "--master-port",
                "29500", *worker]
        return shlex.join(argv).replace("NODE_RANK", "$NODE_RANK", 1).replace(
            "HEAD_NODE", "$HEAD_NODE", 1)
    argv = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "HEAD_NODE:29500", "--rdzv-id", run_id,
            *worker]
    return shlex.join(argv).replace("HEAD_NODE:29500", "$HEAD_NODE:29500")


def run_local(launch: Launch, opts: RunOptions) -> dict:
    """Start every process on this machine, wait, and return rank 0's results."""
    with tempfile.TemporaryDirectory(prefix="plan-run-") as tmp:
        result = os.path.join(tmp, "result.json")
        argv = torchrun_argv(launch, opts, result=result, master_port=_free_port())
        log.debug("starting %d processes: %s", launch.nproc_per_node, shlex.join(argv))
        return run_processes(argv, tmp, result)


def run_processes(argv: list[str], tmp: str, result: str) -> dict:
    """Run torchrun's ``argv`` (its output in ``tmp``) and return the JSON rank 0 wrote to
    ``result``; a failure raises the first process's reason, its output kept in a log file."""
    logfile = os.path.join(tmp, "processes.log")
    with open(logfile, "w") as out:
        code = run_group(argv, out)
    with open(logfile) as f:
        text = f.read()
    log.debug("%s", text)
    if code != 0 or not os.path.exists(result):
        fd, kept = tempfile.mkstemp(prefix="plan-run-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        raise _failure(code, text, kept)
    with open(result) as f:
        return json.load(f)


def warn_device(plan: Plan, cuda: bool) -> None:
    """Warn when a plan made for GPUs runs on CPU processes: its predictions are not this
    host's."""
    made_for = str(plan.cluster.get("device", "cpu"))
    if not cuda and not made_for.startswith("cpu"):
        log.warning("plan: made for %s GPUs, run here on CPU processes: it runs the same "
                    "parallelism, but its predicted times and memory are %s's, not this host's "
                    "(plan with --cluster cpu to compare)", made_for, made_for)


STOP_WAIT_S = 10.0
"""Seconds the processes of an interrupted run get to stop after SIGTERM, before SIGKILL."""


def run_group(argv: list[str], out) -> int:
    """Run ``argv`` (torchrun) in a process group of its own and return its exit code; when this
    process is interrupted (Ctrl-C, or SIGTERM to it alone) the whole group stops, torchrun and
    the workers it started, not torchrun alone (its workers would go on under init)."""
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with sigterm_raises():
            return proc.wait()
    except BaseException:
        _stop_group(proc)
        raise


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to ``proc``'s process group, then SIGKILL to what is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_WAIT_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:  # (workers that outlive torchrun are still in its group)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


NATIVE_CRASHES = ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL")
"""Signals a process dies of when native code fails (not sent from outside the run)."""


def _failure(code: int, text: str, log_path: str = "") -> PlannerError:
    """The first process's one-line reason: a refusal (SpecError), else its crash."""
    lines = text.splitlines()
    where = (f"their output is in {log_path}" if log_path else
             "rerun with -v to see their output")
    # torchrun's failure summary: the root cause (first failed rank) with its exit code and signal
    root = next((i for i, ln in enumerate(lines) if "Root Cause" in ln), 0)
    summary = [ln.strip() for ln in lines[root:]
               if ln.strip().startswith(("exitcode", "traceback", "rank"))][:3]
    tail = summary or [ln.strip() for ln in lines if ln.strip() and set(ln.strip()) != {"="}][-1:]
    reason = ", ".join(tail) or "no output"
    signals = re.findall(r"Signal \d+ \((SIG\w+)\)", text)
    native = next((s for s in signals if s in NATIVE_CRASHES), None)
    for marker in (ERROR_MARK, CRASH_MARK):
        for line in lines:
            if marker in line and not (marker == CRASH_MARK and native):
                reason = line.split(marker, 1)[1].strip()
                if marker == ERROR_MARK:
                    return SpecError(reason)
                return RunError(f"run: a process crashed: {reason[:300]}; {where}",
                                "in the planner's runtime or in the model's own code, as the "
                                "traceback shows; please report the former with the command line")
    if native:  # (the others' errors, a peer's connection reset, follow from it)
        return RunError(f"run: a process died of {native} (exit {code}): {reason[:300]}; {where}",
                        "a crash in native code (torch's or a library's), which Python cannot "
                        "catch; the other processes' errors follow from it. With a pipeline, "
                        "torch's split backward (schedule zb-h1) is one known cause: `--fix "
                        "schedule=1f1b` re-plans without it")
    signal_name = re.search(r"Signal \d+ \((SIG\w+)\)", text)
    if signal_name and signal_name.group(1) == "SIGKILL":
        hint = ("a process was killed (SIGKILL): most often the kernel's out-of-memory killer "
                "when the processes need more host memory than the machine has (`dmesg` says); "
                "fewer processes or a smaller model fit it")
    elif signal_name:
        hint = f"a process was stopped by {signal_name.group(1)} from outside the run"
    else:
        hint = "the processes' output says why"
    return RunError(f"run: the processes failed (exit {code}): {reason[:300]}; {where}", hint)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
