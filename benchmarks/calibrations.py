"""The calibration a measuring benchmark predicts with: read from --calibration, or taken now."""

from __future__ import annotations

from planner.inputs.calibration import load_calibration


def calibration(path: str | None, processes: int) -> dict:
    """``path``'s calibration, or this machine profiled now with ``processes`` at work (one thread
    each, as the benchmarks run their CPU devices)."""
    if path:
        return load_calibration(path)
    from planner.profile.device import profile  # imports torch and measures for a minute

    return profile("cpu", threads=1, processes=processes)
