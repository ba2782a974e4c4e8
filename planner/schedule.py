"""Pipeline schedules as per-rank action lists.

An action is written ``<stage><F|B|W><micro-batch>`` (``0F3``: stage 0 runs the forward of
micro-batch 3), the notation torch.distributed.pipelining reads for custom schedules. A schedule is
one list of actions per pipeline rank, in the order that rank runs them.
"""

from __future__ import annotations

import re

from planner.errors import SpecError

ACTION = re.compile(r"^(\d+)([FBW])(\d+)$")


def gpipe(stages: int, microbatches: int) -> list[list[str]]:
    """GPipe (Huang et al. 2019): every forward, then every backward."""
    return [[f"{s}F{i}" for i in range(microbatches)] + [f"{s}B{i}" for i in range(microbatches)]
            for s in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> list[list[str]]:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): warm up with ``stages - s - 1`` forwards,
    then alternate one forward and one backward, then drain the backwards."""
    ranks = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        acts = [f"{s}F{i}" for i in range(warmup)]
        f, b = warmup, 0
        while f < microbatches:
            acts.append(f"{s}F{f}")
            f += 1
            acts.append(f"{s}B{b}")
            b += 1
        acts.extend(f"{s}B{i}" for i in range(b, microbatches))
        ranks.append(acts)
    return ranks


BUILDERS = {"gpipe": gpipe, "1f1b": one_f_one_b}


def build(schedule: str, stages: int, microbatches: int) -> list[list[str]]:
    if schedule not in BUILDERS:
        raise SpecError(f"schedule: unknown schedule '{schedule}'; choose {', '.join(BUILDERS)}")
    return BUILDERS[schedule](stages, microbatches)


def parse_action(text: str) -> tuple[int, str, int]:
    """``"1B3"`` -> (1, "B", 3)."""
    m = ACTION.match(text.strip())
    if not m:
        raise SpecError(f"schedule: '{text}' is not an action like 0F3, 1B0 or 2W5")
    return int(m.group(1)), m.group(2), int(m.group(3))
