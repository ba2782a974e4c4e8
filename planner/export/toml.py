"""A small TOML writer for the torchtitan export: tables of scalars and lists, comments above keys.

Only what the export needs (str, int, bool, float, lists of those, lists of lists), written the same
way every time so golden files can be compared byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Entry:
    """One ``key = value`` line and the comment lines written above it."""

    key: str
    value: object
    comments: list[str] = field(default_factory=list)


def value(v) -> str:
    """One TOML value on one line (nested lists inline)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def entry(e: Entry) -> list[str]:
    lines = [f"# {c}".rstrip() for c in e.comments]
    v = e.value
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (list, tuple)) for x in v):
        lines.append(f"{e.key} = [")
        lines += [f"  {value(x)}," for x in v]
        lines.append("]")
    else:
        lines.append(f"{e.key} = {value(v)}")
    return lines


def table(name: str, entries: list[Entry]) -> list[str]:
    """``[name]`` and its entries; an empty list gives no lines."""
    if not entries:
        return []
    lines = [f"[{name}]"]
    for e in entries:
        lines += entry(e)
    return lines + [""]
