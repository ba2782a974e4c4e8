"""Measuring processes: results gathered, and a worker that dies is an error, not a hang."""

import pytest

from planner.errors import RunError
from planner.profile.workers import gather


def _report(rank: int, fail_rank: int, queue) -> None:
    if rank == fail_rank:
        raise ValueError("measurement broke")
    queue.put((rank, rank * 10))


def _stop_parent(rank: int, queue) -> None:
    """Rank 0 sends the measuring parent SIGTERM, as a stop from outside would; nobody reports."""
    import os
    import signal
    import time

    if rank == 0:
        os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(60)


def _killed(rank: int, queue) -> None:
    if rank == 1:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    queue.put((rank, 0))


def test_results_of_every_worker_are_gathered():
    got = sorted(gather(_report, 2, (-1,), reports=2, what="test", timeout_s=120))
    assert got == [(0, 0), (1, 10)]


def test_a_worker_that_fails_ends_the_wait_with_its_error():
    with pytest.raises(RunError, match=r"test: measuring process 1 failed \(ValueError: "
                                       r"measurement broke\)") as info:
        gather(_report, 2, (1,), reports=2, what="test", timeout_s=120)
    assert "--processes 1" in info.value.hint and info.value.kind == "measurement"


def test_a_killed_worker_is_named_killed():
    with pytest.raises(RunError, match=r"test: measuring process 1 failed \(.*SIGKILL") as info:
        gather(_killed, 2, (), reports=2, what="test", timeout_s=120)
    assert info.value.hint.startswith("it was killed (SIGKILL): out of host memory")


def test_an_unguarded_script_is_told_to_guard_its_main(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "measure.py"
    script.write_text(
        "from planner.errors import RunError\n"
        "from planner.profile.workers import gather\n"
        "from tests.planner.profile.test_profile_workers import _report\n"
        "try:\n"
        "    gather(_report, 2, (-1,), reports=2, what='test', timeout_s=120)\n"
        "except RunError as exc:\n"
        "    print(exc, exc.hint)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": root})
    assert "measuring process" in out.stdout and \
        'under `if __name__ == "__main__":`' in out.stdout, out.stdout + out.stderr[-2000:]


def test_a_sigterm_to_the_parent_stops_its_workers_and_raises_terminated():
    """A new-user check: SIGTERM to plan profile ended it with the interpreter's default death
    and a resource tracker's warning; now the wait raises Terminated (the CLI exits 143), the
    workers are stopped, and the parent's own SIGTERM handler is back."""
    import signal

    from planner.errors import Terminated

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as info:
        gather(_stop_parent, 2, (), reports=2, what="test", timeout_s=120)
    assert info.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
