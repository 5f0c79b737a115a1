"""The cells of the report's tables: numbers as the report writes them ("-" for a missing one),
and the table block (see :mod:`tfopt.report.content`)."""

from __future__ import annotations


def pct(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def signed(v) -> str:
    return "-" if v is None else f"{v:+.2f}"


def kib(n) -> str:
    return "-" if n is None else f"{n / 1024:,.1f}"


def us(v) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}")


def whole(v) -> str:
    return "-" if v is None else f"{int(v):,}"


def mflops(v) -> str:
    return "-" if v is None else f"{v / 1e6:.2f}"


def secs(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def table(id_: str, header, rows, note: str | None = None, row_classes=None, numeric=None) -> dict:
    return {
        "type": "table",
        "id": id_,
        "header": list(header),
        "rows": [list(r) for r in rows],
        "note": note,
        "row_classes": row_classes or [""] * len(rows),
        "numeric": numeric or [False] * len(header),
    }
