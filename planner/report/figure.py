"""The picture files the planner writes: which formats, and one check of a path before any work."""

from __future__ import annotations

from planner.errors import SpecError

FORMATS = (".png", ".svg")
"""File endings matplotlib's Agg canvas writes for the planner's figures."""


def check_path(path: str, what: str) -> None:
    """SpecError naming ``what`` (the option) unless ``path`` ends in one of FORMATS."""
    if not path.lower().endswith(FORMATS):
        raise SpecError(f"{what}: '{path}' must end in {' or '.join(FORMATS)}")
