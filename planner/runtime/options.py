"""Options of one runtime run (what `plan run` passes to every process)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import SpecError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How to execute a plan."""

    steps: int = 5
    """Measured optimizer steps (after the warm-up steps)."""
    warmup: int = 2
    """Optimizer steps run first and left out of the timing (the first one also infers the
    pipeline's tensor shapes)."""
    model: str | None = None
    """MODEL to build instead of the plan's ``model.spec`` (same fingerprint required)."""
    seed: int = 0
    """Seed of the weights and of the synthetic batch (identical on every rank)."""
    lr: float = 1e-3
    """Learning rate of the plan's optimizer."""
    device: str = "auto"
    """auto (CUDA when visible, else CPU), cpu or cuda."""
    threads: int | None = None
    """CPU threads per process; default: the cores shared evenly among this node's processes
    (``plan profile`` calibrates one thread per process, so pass 1 to compare with it)."""
    dump_dir: str | None = None
    """Write each stage's full parameters after the last step here (``stage<k>.pt``), to compare
    with a single-process run."""

    def __post_init__(self):
        for name in ("steps", "warmup", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(f"{name}: expected an integer >= 0, got {v!r}")
        if self.steps + self.warmup < 1:
            raise SpecError("steps: run at least one step (--steps 1 or --warmup 1)")
        if not self.lr > 0:
            raise SpecError(f"lr: expected a positive number, got {self.lr!r}")
        if self.threads is not None and (isinstance(self.threads, bool)
                                         or not isinstance(self.threads, int) or self.threads < 1):
            raise SpecError(f"threads: expected a positive integer, got {self.threads!r}")
        if self.device not in DEVICES:
            raise SpecError(f"device: expected one of {', '.join(DEVICES)}, got {self.device!r}")

    def argv(self) -> list[str]:
        """The same options as worker command-line flags."""
        out = ["--steps", str(self.steps), "--warmup", str(self.warmup), "--seed", str(self.seed),
               "--lr", repr(self.lr), "--device", self.device]
        if self.model:
            out += ["--model", self.model]
        if self.threads:
            out += ["--threads", str(self.threads)]
        if self.dump_dir:
            out += ["--dump", self.dump_dir]
        return out
