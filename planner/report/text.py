"""Plain-text building blocks of every report: aligned tables, wrapped lines, compressed module
names, and knob values as people write them."""

from __future__ import annotations

import os
import re
import textwrap


def table(rows, indent: str = "") -> list[str]:
    """Rows of cells as lines, each column left-aligned to its widest cell."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def listing(rows: list[tuple[str, ...]]) -> str:
    """``table`` joined into one string."""
    return "\n".join(table(rows))


def wrap(text: str, width: int = 100, indent: str = "  ") -> list[str]:
    """``text`` wrapped at ``width``, keeping its leading spaces on the first line and starting
    the others with ``indent``."""
    lead = text[:len(text) - len(text.lstrip())]
    return textwrap.wrap(text.strip(), width=width, initial_indent=lead, subsequent_indent=indent,
                         break_on_hyphens=False)


def knob(v) -> str:
    """A knob's value as people write it: booleans as on/off, numbers as short as they go."""
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"{v:g}" if isinstance(v, float) else str(v)


def compress_names(names: list[str]) -> str:
    """``['h.0', 'h.1', 'h.2', 'ln_f..lm_head']`` -> ``'h.0-2, ln_f..lm_head'``; past NAMES_WIDTH
    characters, the first and last groups whole with a count of those between (a name cut in
    the middle hid what a stage holds: a new-user check)."""
    out: list[str] = []
    run_prefix, run_start, run_end = None, None, None

    def flush():
        if run_prefix is not None:
            out.append(f"{run_prefix}{run_start}" + (f"-{run_end}" if run_end != run_start else ""))

    for name in names:
        m = re.match(r"^(.*\.)(\d+)$", name)
        if m and run_prefix == m.group(1) and int(m.group(2)) == run_end + 1:
            run_end = int(m.group(2))
            continue
        flush()
        if m:
            run_prefix, run_start, run_end = m.group(1), int(m.group(2)), int(m.group(2))
        else:
            run_prefix = None
            out.append(name)
    flush()
    text = ", ".join(out)
    if len(text) <= NAMES_WIDTH or len(out) <= 2:
        return text
    # the layer stacks first (an encoder-decoder's stage read 'embed_tokens..layernorm, +3 more,
    # lm_head', its 24 layers among the 3: a new-user check), the rest counted
    stacks = [g for g in out if re.search(r"\.\d+(-\d+)?$", g)]
    if stacks and len(stacks) < len(out):
        kept = ", ".join(stacks) + f", +{len(out) - len(stacks)} more"
        if len(kept) <= NAMES_WIDTH:
            return kept
    return f"{out[0]}, +{len(out) - 2} more, {out[-1]}"


NAMES_WIDTH = 100
"""compress_names' longest list before it elides the groups between the first and the last."""


def pins_text(pins: dict) -> str:
    """Pinned knobs as --fix takes them: ``tp=16,zero=off``."""
    return ",".join(f"{k}={knob(v)}" for k, v in pins.items())


def runs(ids: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ids: [0,1,2,5] -> [(0, 2), (5, 5)]."""
    out: list[list[int]] = []
    for i in sorted(ids):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return [tuple(r) for r in out]


def model_name(model: str) -> str:
    """A short name for a MODEL: the zoo name, the folder of a Hugging Face ``config.json``, the
    name of any other config file (``gpt3_xl_config.json``), or the factory."""
    if os.path.basename(model) == "config.json":
        return os.path.basename(os.path.dirname(os.path.abspath(model))) or model
    return os.path.basename(model)
