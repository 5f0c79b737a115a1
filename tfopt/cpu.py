"""What this machine's CPU is: its model and feature flags, read from ``/proc/cpuinfo`` or ``lscpu``.

The one home of CPU-flag parsing: the precision policy's bf16 check, the report's environment
section and the benchmarks' ``lscpu`` records all read them here. No TensorFlow import.
"""

from __future__ import annotations

import json
import platform
import subprocess


def parse_cpuinfo(text: str) -> dict:
    """The model and flags of the first processor in ``/proc/cpuinfo`` text (x86 and arm64 names).

    Returns:
        ``{"model": str, "flags": set[str]}``.
    """
    model, flags = "", set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if model or flags:  # the first processor's block is enough
                break
            continue
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features"):
            flags.update(value.split())
    return {"model": model, "flags": flags}


def _read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:  # not Linux
        return ""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags listed in ``/proc/cpuinfo`` text.

    Args:
        cpuinfo: The text to parse; None reads ``/proc/cpuinfo`` (no flags where it cannot be read).
    """
    return parse_cpuinfo(_read_cpuinfo() if cpuinfo is None else cpuinfo)["flags"]


def lscpu_fields() -> dict[str, str]:
    """Every field ``lscpu --json`` prints (vulnerability lines dropped); empty without lscpu."""
    try:
        out = subprocess.run(
            ["lscpu", "--json"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
        rows = json.loads(out).get("lscpu", [])
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    fields = {}
    for row in rows:
        key = str(row.get("field", "")).rstrip(":").strip()
        if key and row.get("data") is not None and not key.startswith("Vulnerability"):
            fields[key] = str(row["data"])
    return fields


def cpu_info() -> dict:
    """The CPU's model, its flags (sorted) and every other ``lscpu`` field, JSON-ready.

    Returns:
        ``{"model", "flags", "fields", "source"}``: ``source`` is ``lscpu`` when it answered,
        else ``/proc/cpuinfo``.
    """
    fields = lscpu_fields()
    parsed = parse_cpuinfo(_read_cpuinfo())
    flags = fields.pop("Flags", "").split() or sorted(parsed["flags"])
    return {
        "model": fields.get("Model name") or parsed["model"] or platform.processor() or "unknown",
        "flags": sorted(flags),
        "fields": fields,
        "source": "lscpu" if fields else "/proc/cpuinfo",
    }
