"""Measuring processes: ``n`` spawned workers that each report one result through a pipe.

The parent reads the pipe while it watches the processes: a worker that dies before reporting (a
crash, a kill, or a script that starts the measurement at import time, so that every spawned
process re-runs it) ends the measurement with a RunError that says so, instead of a parent
waiting forever on a pipe no one will write.
"""

from __future__ import annotations

import importlib
import logging
import time

from planner.errors import RunError, sigterm_raises

log = logging.getLogger(__name__)

POLL_S = 0.5
"""How often the parent looks at its workers while it waits for their results."""
EXIT_GRACE_S = 60.0
"""How long workers that have reported may take to exit before they are killed (their results
are kept)."""


def gather(worker, n: int, args: tuple, *, reports: int, what: str, timeout_s: float) -> list:
    """Start ``worker(rank, *args, queue)`` in ``n`` spawned processes and return the
    ``reports`` objects they put on ``queue`` (in the order they came), then join them. A process
    that fails, or results still missing after ``timeout_s``, raises RunError naming ``what``."""
    import torch.multiprocessing as mp  # lazy: only to start the workers

    failed = _spawn_module().ProcessException
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.start_processes(worker, args=(*args, queue), nprocs=n, join=False,
                               start_method="spawn")
    results: list = []
    deadline = time.monotonic() + timeout_s
    # (a SIGTERM stops the workers in the finally below, as Ctrl-C does)
    with sigterm_raises():
        try:
            while len(results) < reports:
                if not queue.empty():  # read as they come: a full pipe would block a worker
                    results.append(queue.get())
                    continue
                if procs.join(timeout=POLL_S) and queue.empty():
                    raise RunError(f"{what}: the {n} measuring processes exited with "
                                   f"{len(results)} of {reports} results",
                                   "rerun it; a process that ends early is a bug to report",
                                   "measurement")
                if time.monotonic() > deadline:
                    raise RunError(f"{what}: the {n} measuring processes did not finish in "
                                   f"{timeout_s:.0f} s",
                                   "retry on a quieter machine, or pass --processes 1",
                                   "measurement")
            grace = time.monotonic() + EXIT_GRACE_S
            while not procs.join(timeout=POLL_S):
                if time.monotonic() > grace:  # (the finally kills them; the results stand)
                    log.warning("%s: the measuring processes reported but did not exit in "
                                "%.0f s; stopped", what, EXIT_GRACE_S)
                    break
        except failed as exc:
            log.warning("%s: measuring process %d failed:\n%s", what, exc.error_index, exc)
            raise RunError(f"{what}: measuring process {exc.error_index} failed "
                           f"({_last_line(exc)})", _hint(exc), "measurement") from None
        finally:
            for p in procs.processes:
                if p.is_alive():
                    p.kill()
    return results


def _last_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _hint(exc: BaseException) -> str:
    if isinstance(exc, _spawn_module().ProcessRaisedException):  # its traceback was logged
        return "its traceback is logged above; rerun with --processes 1 to measure without workers"
    if getattr(exc, "signal_name", None):  # killed
        return (f"it was killed ({exc.signal_name}): out of host memory, or stopped from "
                "outside; rerun with --processes 1 to measure without workers")
    return ("its own error, if any, is on stderr above; a script that starts the measurement "
            "when it is imported must do so under `if __name__ == \"__main__\":` (each spawned "
            "process imports it again)")


def _spawn_module():
    """torch.multiprocessing.spawn the module (the package's attribute of that name is the
    function), where the exceptions of failed processes live."""
    return importlib.import_module("torch.multiprocessing.spawn")
