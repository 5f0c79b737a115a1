"""Plain-text tables the stages, the report and the benchmarks print."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A padded GitHub-flavoured markdown table.

    Args:
        header: The column names.
        rows: One sequence of cells per row (each cell printed with ``str``).

    Returns:
        The table, lines joined by newlines, every column padded to its widest cell.
    """
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join(
        [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        + [line(r) for r in cells[1:]]
    )
