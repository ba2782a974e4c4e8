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
        device._speeds_worker(1, "cpu", 1, ("fp32",), None, logging.INFO, queue)
        assert "gemm fp32" not in capfd.readouterr().err
        device._speeds_worker(0, "cpu", 1, ("fp32",), None, logging.INFO, queue)
        assert "  gemm fp32 64^3: 1 GFLOP/s" in capfd.readouterr().err
        device._speeds_worker(0, "cpu", 1, ("fp32",), None, logging.WARNING, queue)  # -q
        assert "gemm fp32" not in capfd.readouterr().err
        assert queue.items == [(1, {"done": True}), (0, {"done": True}), (0, {"done": True})]
    finally:
        root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


def test_a_noisy_all_reduce_fit_falls_back_on_the_messages_themselves(caplog):
    """A new-user check saw `plan profile` write 0 us of all-reduce latency (a negative intercept
    clamped) into the calibration on a busy machine."""
    from planner.profile.collectives import _least_squares, fitted_link

    steps = 2  # two processes
    points = [(1_000, 20e-6), (1_000_000, 200e-6), (4_000_000, 2.0e-3)]  # the large one slow
    wire = [b / 1 for b, _ in points]  # 2 (n - 1) / n = 1 for two ranks
    slope, intercept = _least_squares(wire, [t for _, t in points])
    assert intercept < 0 < slope
    with caplog.at_level(logging.WARNING, logger="planner"):
        bandwidth, latency = fitted_link(points, slope, intercept, steps)
    assert latency == 20e-6 / steps and bandwidth == 1 / slope
    assert any("taken from the smallest message" in r.getMessage() for r in caplog.records)
    clean = [(1_000, 100e-6), (1_000_000, 600e-6), (4_000_000, 2.1e-3)]
    slope, intercept = _least_squares([b for b, _ in clean], [t for _, t in clean])
    assert fitted_link(clean, slope, intercept, steps)[1] == intercept / steps > 0


def test_an_all_reduce_fit_without_slope_takes_the_largest_message_as_a_bound(caplog):
    """A review: flat timings (no slope) gave a bandwidth of millions of GB/s."""
    from planner.profile.collectives import _least_squares, fitted_link

    points = [(1_000, 500e-6), (1_000_000, 480e-6), (4_000_000, 470e-6)]  # flat, noisy
    slope, intercept = _least_squares([b for b, _ in points], [t for _, t in points])
    assert slope <= 0 < intercept
    with caplog.at_level(logging.WARNING, logger="planner"):
        bandwidth, latency = fitted_link(points, slope, intercept, 2)
    assert bandwidth == 4_000_000 / 470e-6 and latency == intercept / 2  # two ranks: wire = size
    assert any("taken from the largest message" in r.getMessage() for r in caplog.records)


def test_a_small_message_held_up_by_noise_does_not_make_the_latency(caplog):
    """A calibration of 2026-12-06 measured a 64 KB exchange at 3.8 ms (another load ran) between
    a 4 KB one at 0.13 ms and a 1 MB one at 0.70 ms: least squares put the point-to-point
    latency at 1.06 ms. No message can take longer than a larger one; it is fitted at the
    larger one's time, with a warning."""
    from planner.profile.collectives import _least_squares, fitted_link, monotone

    points = [[4096, 1.28e-4], [65536, 3.76e-3], [1048576, 7.03e-4], [4194304, 2.71e-3],
              [16777216, 1.197e-2]]
    raw = fitted_link(points, *_least_squares([b for b, _ in points],
                                              [t for _, t in points]), 1)
    with caplog.at_level("WARNING", logger="planner.profile.collectives"):
        fit = monotone(points, "point-to-point")
    assert "65536 B (3.76 ms) took longer than a larger message" in caplog.text
    assert fit[1] == [65536, 7.03e-4] and points[1] == [65536, 3.76e-3]  # the measured kept
    bandwidth, latency = fitted_link(fit, *_least_squares([b for b, _ in fit],
                                                          [t for _, t in fit]), 1)
    assert raw[1] > 1e-3 and latency < 0.5 * raw[1]
    assert monotone([[1, 1.0], [2, 2.0]], "x") == [[1, 1.0], [2, 2.0]]  # nothing to lower
