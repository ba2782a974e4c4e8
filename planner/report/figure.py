"""The picture files the planner writes: which formats, and one check of a path before any work."""

from __future__ import annotations

from planner.errors import SpecError
from planner.files import atomic_save, check_output

FORMATS = (".png", ".svg")
"""File endings matplotlib's Agg canvas writes for the planner's figures."""


def check_path(path: str, what: str) -> None:
    """SpecError naming ``what`` (the option) unless ``path`` ends in one of FORMATS and can be
    written."""
    if not path.lower().endswith(FORMATS):
        raise SpecError(f"{what}: '{path}' must end in {' or '.join(FORMATS)}")
    check_output(path, what)


def save(fig, path: str, **kw) -> None:
    """Write ``fig`` to ``path`` atomically (never a half-written picture)."""
    atomic_save(path, lambda tmp: fig.savefig(tmp, format=path.rsplit(".", 1)[-1].lower(), **kw))
