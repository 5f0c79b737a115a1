"""The per-file durations table of the last test run, written into docs/development.md.

Every pytest run writes ``build/pytest-junit.xml`` (``setup.cfg``'s ``addopts``). This reads it
and replaces the table between the ``durations`` markers of docs/development.md with one row per
test file: tests, seconds of set-up + call + tear-down summed over its tests, the CPU seconds they
spent (with the processes they started: the ``cpu_seconds`` property tests/conftest.py records),
and its longest test. Under pytest-xdist the files run on two workers, so the wall time is about
half the sum; on 2 cores the CPU seconds are what a file costs whatever ran beside it.

    python .ci/durations.py [build/pytest-junit.xml] [--check]

``--check`` prints the table without writing it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "development.md")
BEGIN, END = "<!-- durations: begin -->", "<!-- durations: end -->"


def per_file(junit_path: str) -> tuple[list[dict], dict]:
    """One row per test file, longest first, and the run's totals, from a junit XML file."""
    root = ET.parse(junit_path).getroot()
    files: dict[str, dict] = defaultdict(
        lambda: {"tests": 0, "seconds": 0.0, "cpu": 0.0, "longest": ("", 0.0)}
    )
    totals = {"tests": 0, "seconds": 0.0, "cpu": 0.0, "failed": 0, "skipped": 0, "wall": 0.0}
    for suite in root.iter("testsuite"):
        totals["wall"] += float(suite.get("time", 0))
    for case in root.iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x[.TestClass]
        path = "tests/" + next((p for p in parts if p.startswith("test_")), parts[-1]) + ".py"
        seconds = float(case.get("time", 0))
        cpu_properties = [p for p in case.iter("property") if p.get("name") == "cpu_seconds"]
        cpu = sum(float(p.get("value", 0)) for p in cpu_properties)
        totals["cpu_measured"] = bool(totals.get("cpu_measured") or cpu_properties)
        row = files[path]
        row["tests"] += 1
        row["seconds"] += seconds
        row["cpu"] += cpu
        totals["cpu"] += cpu
        if seconds > row["longest"][1]:
            row["longest"] = (case.get("name", ""), seconds)
        totals["tests"] += 1
        totals["seconds"] += seconds
        totals["failed"] += any(c.tag in ("failure", "error") for c in case)
        totals["skipped"] += any(c.tag == "skipped" for c in case)
    rows = [{"file": f, **r} for f, r in files.items()]
    rows.sort(key=lambda r: -r["seconds"])
    return rows, totals


def table(rows: list[dict], totals: dict) -> str:
    """The markdown table and its one-line summary (CPU seconds "-" for a junit file written
    without the ``cpu_seconds`` property)."""
    measured = totals.get("cpu_measured", False)
    cpu_min = f"{totals['cpu'] / 60:.1f} CPU min, " if measured else ""
    lines = [
        f"{totals['tests']} tests ({totals['failed']} failed, {totals['skipped']} skipped), "
        f"{totals['seconds'] / 60:.1f} min of test time summed over both workers, "
        f"{cpu_min}{totals['wall'] / 60:.1f} min of wall time:",
        "",
        "| file | tests | seconds | CPU seconds | longest test (s) |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        name, seconds = r["longest"]
        cpu = f"{r['cpu']:.0f}" if measured else "-"
        lines.append(
            f"| `{r['file']}` | {r['tests']} | {r['seconds']:.0f} | {cpu} | "
            f"`{name[:60]}` ({seconds:.0f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", nargs="?", default=os.path.join(ROOT, "build", "pytest-junit.xml"))
    parser.add_argument("--check", action="store_true", help="print the table, write nothing")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.junit):
        print(f"durations: {args.junit} does not exist; run the test suite first", file=sys.stderr)
        return 2
    text = table(*per_file(args.junit))
    if args.check:
        print(text)
        return 0
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        print(f"durations: {DOC} has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    doc = re.sub(
        re.escape(BEGIN) + ".*?" + re.escape(END),
        lambda _: f"{BEGIN}\n{text}\n{END}",
        doc,
        flags=re.S,
    )
    tmp = DOC + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(doc)
    os.replace(tmp, DOC)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
