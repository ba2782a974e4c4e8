"""Execute a Plan with torch.distributed: pipelining stages and schedule, DTensor tensor
parallelism, replicate / FSDP2 data parallelism, activation checkpointing (docs/runtime.md)."""

from planner.runtime import report
from planner.runtime.launch import Launch, check, node_commands, run_local, torchrun_argv
from planner.runtime.options import RunOptions

__all__ = ["Launch", "RunOptions", "check", "node_commands", "report", "run_local",
           "torchrun_argv"]
