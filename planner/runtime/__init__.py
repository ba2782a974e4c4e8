"""Execute a Plan with torch.distributed: pipelining stages and schedule, DTensor tensor
parallelism, replicate / FSDP2 data parallelism, activation checkpointing (docs/runtime.md).
``launch`` checks a plan against this host and starts torchrun; ``worker`` is what each process
runs."""
