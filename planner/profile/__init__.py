"""Measure this machine for the cost model (``plan profile``): device speeds by kernel and size,
collectives among local processes, and on CPUs the runtime's DTensor host cost; the result is a
calibration JSON (planner.inputs.calibration reads it)."""

DEVICES = ("cpu", "cuda")
"""What ``plan profile`` measures: CPU processes (a process is a device) or CUDA GPUs."""
