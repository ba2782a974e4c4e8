"""What-if rows as a CSV file and back: every column, empty cells for None, numbers and booleans
restored on reading, so rows survive the round trip unchanged."""

from __future__ import annotations

import csv

from planner.errors import SpecError
from planner.files import atomic_save


def write_csv(rows: list[dict], path: str) -> None:
    """Write ``rows`` as CSV (columns in the rows' order; empty cells for None)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)

    try:
        atomic_save(path, write)
    except OSError as exc:
        raise SpecError(f"csv: cannot write '{path}' ({exc.strerror})") from None


def read_csv(path: str) -> list[dict]:
    """Rows written by ``write_csv``, with numbers, booleans and empty cells (None) restored."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return [{k: _cell(v) for k, v in r.items()} for r in csv.DictReader(f)]
    except UnicodeDecodeError:
        raise SpecError(f"csv: '{path}' is not text (binary content)") from None
    except OSError as exc:
        raise SpecError(f"csv: cannot read '{path}' ({exc.strerror})") from None


def _cell(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
