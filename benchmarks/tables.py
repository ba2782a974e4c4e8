"""Printing a benchmark's table: aligned text for a terminal, or Markdown for the README."""

from __future__ import annotations

import statistics


def print_table(head: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip())


SEARCH_HEAD = ["published (pred.) s", "search s", "speed-up", "search time", "knobs changed"]
"""The columns of a free search set against a published configuration (search_cells)."""


def search_cells(published, free, seconds: float, why: str = "") -> list[str]:
    """A free search's plan (``free``, a Plan or None when nothing fits: ``why``) against the
    published configuration as the planner fits it (``published``, a Plan or None), both under
    the planner's cost model: step times, speed-up, search time, the knobs that changed."""
    from planner.report.compare import config_changes  # lazy: keeps this a printing module

    pub = f"{published.step_time_s:.3g}" if published is not None else "does not fit"
    if free is None:
        return [pub, "no plan", "", f"{seconds:.1f} s", why]
    if published is None:
        return [pub, f"{free.step_time_s:.3g}", "", f"{seconds:.1f} s", ""]
    knobs = ", ".join(f"{k} {x}->{y}" for k, x, y in config_changes(published, free))
    return [pub, f"{free.step_time_s:.3g}", f"{published.step_time_s / free.step_time_s:.2f}x",
            f"{seconds:.1f} s", knobs or "none"]


def print_errors(errors: dict[str, list[float]], markdown: bool, label: str = "",
                 total: bool = True) -> None:
    """One line per group of relative errors (and, with ``total``, one for all of them): median
    and max |error|."""
    everything = [e for errs in errors.values() for e in errs]
    for group, errs in sorted(errors.items()) + ([("all", everything)] if everything and total
                                                 else []):
        errs = [abs(e) for e in errs]
        print(f"{'- ' if markdown else ''}{label + ' ' if label else ''}{group:>5}: median |error| "
              f"{100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}% (n={len(errs)})")
