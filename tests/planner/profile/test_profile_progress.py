"""`plan profile`'s progress where its device speeds are measured in several processes at once:
spawned processes start without the command's logging, so the first sets it up again."""

import logging

from planner.profile import device


class _Queue:
    def __init__(self):
        self.items = []

    def put(self, item):
        self.items.append(item)


def test_the_first_concurrent_measurer_reports_progress_the_others_do_not(monkeypatch, capfd):
    def measured(timer, threads, dtypes):
        logging.getLogger("planner.profile.device").info("  gemm fp32 64^3: 1 GFLOP/s")
        return {"done": True}

    monkeypatch.setattr(device, "device_speeds", measured)
    monkeypatch.setattr(device, "Timer", lambda dev, barrier=None: None)
    root = logging.getLogger("planner")
    saved = root.handlers[:], root.level, root.propagate
    try:
        root.handlers[:] = []  # as in a freshly spawned process
        queue = _Queue()
        device._speeds_worker(1, "cpu", 1, ("fp32",), queue, None, logging.INFO)
        assert "gemm fp32" not in capfd.readouterr().err
        device._speeds_worker(0, "cpu", 1, ("fp32",), queue, None, logging.INFO)
        assert "  gemm fp32 64^3: 1 GFLOP/s" in capfd.readouterr().err
        device._speeds_worker(0, "cpu", 1, ("fp32",), queue, None, logging.WARNING)  # -q
        assert "gemm fp32" not in capfd.readouterr().err
        assert queue.items == [(1, {"done": True}), (0, {"done": True}), (0, {"done": True})]
    finally:
        root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]
