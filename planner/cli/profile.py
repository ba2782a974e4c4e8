"""`plan profile`: measure this machine and write a calibration for the cost model."""

from __future__ import annotations

import json
import logging

from planner.cli.args import positive_int
from planner.errors import SpecError
from planner.files import atomic_write, check_output
from planner.inputs.calibration import noisy_calibration
from planner.machine import usable_cores
from planner.options import DTYPES
from planner.profile import DEVICES


def register(add) -> None:
    p = add("profile", help="measure this machine (GEMMs, bandwidth, collectives) for "
            "--calibration; it takes minutes, its progress said as it goes")
    p.add_argument("--device", default="cpu", choices=DEVICES,
                   help="what to measure: this host's CPU (default) or its CUDA GPU")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="CPU threads per process (a CPU 'device' is one process; default 1)")
    p.add_argument("--processes", type=positive_int, default=2,
                   help="processes working at once (default 2): on CPUs the device speeds are "
                   "measured in that many processes together (they share caches and memory "
                   "bandwidth), so use the processes per node the plan runs; also the processes "
                   "(GPUs) of the collectives, which 1 skips")
    p.add_argument("-o", "--output", required=True, help="calibration JSON to write")
    p.set_defaults(func=run)


def run(args) -> int:
    from planner.profile.device import profile  # lazy: imports torch and measures for minutes
    from planner.runtime.launch import MAX_CPU_PROCESSES  # lazy: imports torch

    check_output(args.output, "output")  # before minutes of measuring
    if args.device == "cpu" and args.processes > MAX_CPU_PROCESSES:
        raise SpecError(f"processes: {args.processes} CPU processes, but plan run starts at most "
                        f"{MAX_CPU_PROCESSES} on a CPU machine (more make the measurement crawl); "
                        f"use --processes {MAX_CPU_PROCESSES} or fewer")
    cores = usable_cores()
    if args.device == "cpu" and args.processes * args.threads > cores:  # (a new-user check's
        # --threads 2 beside 2 processes on 2 cores measured every speed 10-25x too slow)
        fewer = f"--threads {cores // args.processes}" if args.processes <= cores else \
            f"--processes {cores}"
        raise SpecError(f"threads: {args.processes} processes x {args.threads} threads want "
                        f"{args.processes * args.threads} cores, and this machine gives {cores}: "
                        f"they would take turns and every speed measured would be too slow; give "
                        f"{fewer}")
    calib = profile(args.device, threads=args.threads, processes=args.processes)
    atomic_write(args.output, json.dumps(calib, indent=1) + "\n")
    dev = calib["device"]
    peaks = ", ".join(f"{k} {v * 1e3:.3g} GFLOP/s" for k, v in dev["peak_TFLOPs"].items())
    print(f"device {calib['device_name']} ({args.device}, {args.threads} thread(s)): GEMM peak "
          f"{peaks}; memory {dev['hbm_GBps']:.3g} GB/s; per-op overhead "
          f"{dev['kernel_overhead_us']:.3g} us (rates sustained, not data-sheet peaks: a cluster "
          "file's peak_TFLOPs and hbm_GBps would get a preset's efficiencies on top; pass the "
          "file with --calibration instead)")
    spread = dev.get("repeat_spread")
    if spread:
        print(f"repeats of a measurement spread by {100 * spread['median']:.0f}% (interquartile "
              f"range over the median; {100 * spread['max']:.0f}% at the noisiest): how noisy "
              "this machine was while measuring; the rates are the repeats' medians, and a "
              "busier machine moves them further")
        noisy = noisy_calibration(calib)
        if noisy:
            logging.getLogger("planner").warning("%s", noisy)
    link = calib.get("intra_node")
    if link:
        print(f"all-reduce among {link['processes']} {link['backend']} processes: "
              f"{link['bandwidth_GBps']:.3g} GB/s, {link['latency_us']:.3g} us latency")
    # the dtype the planner defaults to (bf16) where it was measured, else one that was
    measured = [k for k in dev["peak_TFLOPs"] if k in DTYPES]
    dtype = "" if "bf16" in measured or not measured else f" --dtype {measured[0]}"
    print(f"wrote {args.output}; use it with `plan solve ... --calibration {args.output}{dtype}` "
          "(or `plan whatif ... --calibration`; plan jobs prices the data sheet's figures)")
    return 0
