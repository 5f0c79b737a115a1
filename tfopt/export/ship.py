"""Which exported file to ship: the fastest one that passed the fidelity gate.

Every export ends by naming one file (``ship: ...``) and copying it to ``<out>/model.tflite``, so a
user never has to read the table to know what goes into the app. The rule: among the files whose
fidelity gate passed, the lowest p50 latency at one thread (the setting an app's single inference
thread sees; timed on the phone when ``--device`` gave one), the smaller file on a tie. No file is chosen when every gate failed.
"""

from __future__ import annotations

from collections.abc import Sequence

FILE = "model.tflite"


def _p50(row: dict) -> float | None:
    return _timed(row)[0]


def _timed(row: dict) -> tuple[float | None, str]:
    """The p50 a choice is made on and the setting it was measured at."""
    latency = row.get("latency") or {}
    keys = [k for k in ("device/1t",) if k in latency]  # the phone's own figure first
    keys += sorted(k for k in latency if k.endswith("/1t") and not k.startswith("builtin"))
    keys += sorted(k for k in latency if k not in keys)
    for key in keys:
        value = (latency.get(key) or {}).get("p50_ms")
        if isinstance(value, (int, float)) and value > 0:
            return float(value), key
    return None, ""


def choose(rows: Sequence[dict]) -> dict | None:
    """The row of the file to ship, or None when no written file passed its gate.

    Args:
        rows: The export's rows (``mode``, ``file``, ``gate``, ``latency``, ``size_bytes``).
    """
    passed = [
        r for r in rows if r.get("file") and (r.get("gate") is None or r["gate"].get("passed"))
    ]
    if not passed:
        return None
    inf = float("inf")
    return min(passed, key=lambda r: (_p50(r) or inf, r.get("size_bytes") or inf))


def describe(row: dict, cpu: str) -> dict:
    """What the ``ship:`` line and the report say of the chosen row.

    Args:
        row: The chosen row.
        cpu: Where the host figures were measured (``cpu.host_words``); a figure timed on the
            phone names the phone instead.
    """
    p50, key = _timed(row)
    if key.startswith("device/"):
        cpu = f"{row['latency'][key].get('device') or 'the phone'}, 1 thread"
    return {
        "file": FILE,
        "from": row["file"],
        "mode": row["mode"],
        "io": row.get("io", "float"),
        "kib": round((row.get("size_bytes", 0) + row.get("metadata_bytes", 0)) / 1024, 1),
        "accuracy": (row.get("eval") or {}).get("accuracy"),
        "p50_ms": p50,
        "cpu": cpu,
    }


def line(ship: dict, out_dir: str) -> str:
    """``ship: <path> (<mode>, <KiB>, <accuracy>, p50 on <CPU>)``."""
    import os

    acc = ship.get("accuracy")
    p50 = ship.get("p50_ms")
    io = f", {ship['io']} I/O" if ship.get("io") not in (None, "float") else ""
    return (
        f"ship: {os.path.join(out_dir, ship['file'])} ({ship['mode']}{io}, {ship['kib']:g} KiB, "
        f"{'accuracy ' + format(acc, '.1%') if acc is not None else 'accuracy not measured'}, "
        f"{'p50 ' + format(p50, '.3f') + ' ms' if p50 else 'p50 not measured'} on {ship['cpu']}; "
        f"a copy of {ship['from']})"
    )
