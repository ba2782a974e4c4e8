"""Printing a benchmark's table: aligned text for a terminal, or Markdown for the README."""

from __future__ import annotations


def print_table(head: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip())
