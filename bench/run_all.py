"""Runs the benchmarks and regenerates docs/benchmarks.md and the README's summary from bench/results/*.json.

    PYTHONPATH=. python bench/run_all.py                   # every benchmark (hours on 2 cores), then the tables
    PYTHONPATH=. python bench/run_all.py --only B2,B7      # those two, then the tables
    PYTHONPATH=. python bench/run_all.py --table-only      # only the tables, from the committed results

Each benchmark runs as its own process with its defaults (one at a time: they measure the
machine) and writes ``bench/results/<name>.json``; every such file carries ``figures`` (see
``bench/_common.figure``): median, range over repeats, target and verdict, the peer's figure from
the same run and the published anchor. docs/benchmarks.md is written whole: the machine, every
figure's table and the cause of each miss (``bench/causes.py``). README.md gets a one-row-per-benchmark
summary between the ``<!-- bench:start -->`` and ``<!-- bench:end -->`` markers; nothing else in it
changes.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.causes import cause  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
# The CPU features that decide the precision and int8 figures (PITFALLS: record them with every figure).
KEY_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Bench:
    """One benchmark: its BENCHMARKS.md id, its script under bench/ and its result file."""

    id: str
    script: str
    title: str

    @property
    def result(self) -> str:
        return os.path.join(HERE, "results", self.script.replace(".py", ".json"))

    @property
    def command(self) -> str:
        return f"PYTHONPATH=. python bench/{self.script}"


BENCHES = (
    Bench("B1", "ingestion.py", "ingestion"),
    Bench("B2", "mixed_precision.py", "mixed precision"),
    Bench("B3", "scaling.py", "multi-worker scaling"),
    Bench("B4", "compression.py", "compression"),
    Bench("B5", "tflite_ptq.py", "TFLite post-training quantization"),
    Bench("B6", "distillation.py", "distillation"),
    Bench("B7", "overhead.py", "framework overhead"),
    Bench("B8", "end_to_end.py", "end to end"),
    Bench("B9", "edge_architecture.py", "a real edge architecture"),
    Bench("B9q", "quantizers.py", "the maintained quantization path"),
    Bench("B10", "structured.py", "compression that buys speed"),
    Bench("B11", "sibling.py", "structured compression vs the narrower sibling"),
    Bench("B12", "dp_mnist.py", "differential privacy"),
    Bench("B13", "fedavg_mnist.py", "federated averaging"),
    Bench("B14", "pipeline_parallel.py", "pipeline parallelism"),
    Bench("S1", "soak.py", "soak: 10,000 steps with backups"),
)


def select(only: str | None) -> list[Bench]:
    """The benchmarks named by ``--only`` (``"B2,B7"``), or all of them.

    Raises:
        SystemExit: an unknown id (one line naming the valid ones).
    """
    if not only:
        return list(BENCHES)
    by_id = {b.id: b for b in BENCHES}
    wanted = [s.strip().upper() for s in only.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in by_id]
    if unknown or not wanted:
        raise SystemExit(
            f"run_all: unknown benchmark {', '.join(unknown) or only!r}; "
            f"choose from {', '.join(by_id)} (--only B2,B7)"
        )
    return [by_id[w] for w in wanted]


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _measured(f: dict) -> tuple[str, str]:
    unit = f["unit"]
    sep = "" if unit in ("x", "%") else " "
    measured = "-" if f["value"] is None else f"{_num(f['value'], f['digits'])}{sep}{unit}"
    spread = "-"
    if f["spread"] and f["repeats"] > 1:
        lo, hi = f["spread"]
        spread = f"{_num(lo, f['digits'])} to {_num(hi, f['digits'])} ({f['repeats']})"
    elif f["repeats"] == 1:
        spread = "(1)"
    return measured, spread


def _cell(text) -> str:
    return "-" if text in (None, "") else str(text).replace("|", "\\|").replace("\n", " ")


def _machine(res: dict) -> str:
    env, cpu = res.get("environment", {}), res.get("lscpu", {})
    flags = set(cpu.get("flags", ()))
    have = [f for f in KEY_FLAGS if f in flags]
    date = str(env.get("date_utc", "?"))[:10]
    cores = env.get("usable_cores", "?")
    return (
        f"{date}, {cpu.get('model') or env.get('processor', '?')}, {cores} cores, "
        f"flags {' '.join(have) or 'none of ' + '/'.join(KEY_FLAGS)}, TF {env.get('tensorflow', '?')}"
    )


def _load(bench: Bench) -> dict | None:
    if not os.path.exists(bench.result):
        return None
    with open(bench.result, encoding="utf-8") as f:
        res = json.load(f)
    if not res.get("figures"):
        raise SystemExit(f"run_all: {bench.result} has no 'figures'; re-run {bench.command}")
    return res


def section(bench: Bench) -> str:
    """One benchmark's block of docs/benchmarks.md: its machine, its figures' table, its misses' causes."""
    head = f"## {bench.id}: {bench.title}\n\n`{bench.command}`"
    res = _load(bench)
    if res is None:
        return f"{head}: not run yet (no `bench/results/{os.path.basename(bench.result)}`)."
    rows = [
        "| figure | measured | range (repeats) | target | status | peer, same run | anchor |",
        "|---|---|---|---|---|---|---|",
    ]
    misses: dict[str, list[str]] = {}
    for f in res["figures"]:
        measured, spread = _measured(f)
        status = f["status"] if f["status"] != "MISS" else "**MISS**"
        rows.append(
            "| "
            + " | ".join(
                _cell(c)
                for c in (f["name"], measured, spread, f["target"], status, f["peer"], f["anchor"])
            )
            + " |"
        )
        if f["status"] == "MISS":  # figures with one cause share its line
            misses.setdefault(cause(bench.id, f["name"]) or UNKNOWN, []).append(f["name"])
    block = f"{head} on {_machine(res)}\n\n" + "\n".join(rows)
    if misses:
        block += "\n\nWhy the misses:\n\n" + "\n".join(
            f"- {'; '.join(names)}: {text}" for text, names in misses.items()
        )
    return block


UNKNOWN = "cause not yet worked out."
PAGE_HEAD = """# Benchmarks

<!-- Generated by `PYTHONPATH=. python bench/run_all.py --table-only` from bench/results/*.json. -->

Every figure is a ratio measured side by side in one run, on the machine named with it, against
the public recipe a user would follow instead (`bench/peers/`). "Range" is min to max over the
repeats; "peer" is the public recipe run in the same process on the same data; "n/a" marks a
figure measured where its target does not apply (the bf16 target without AMX). Each result file
(`bench/results/<name>.json`) also holds the date, the CPU model and its `lscpu` flags, the core
count, the library versions and every repeat.

`PYTHONPATH=. python bench/run_all.py` runs them all, one at a time (hours on 2 cores;
`--only B2,B7` picks some), then rewrites this page and the README's summary;
`--table-only` only rewrites them. The targets and the rules are in the project's design notes."""


def page(benches=BENCHES) -> str:
    """The whole of docs/benchmarks.md."""
    return PAGE_HEAD + "\n\n" + "\n\n".join(section(b) for b in benches) + "\n"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def summary(benches=BENCHES) -> str:
    """The README's table: one row per benchmark, its machine and how many of its targets it met."""
    rows = ["| benchmark | targets met | measured on |", "|---|---|---|"]
    for b in benches:
        res = _load(b)
        name = f"[{b.id} {b.title}](docs/benchmarks.md#{slug(f'{b.id}: {b.title}')})"
        if res is None:
            rows.append(f"| {name} | not run yet | - |")
            continue
        judged = [f for f in res["figures"] if f["status"] in ("pass", "MISS")]
        met = sum(f["status"] == "pass" for f in judged)
        rows.append(f"| {name} | {met} of {len(judged)} | {_machine(res)} |")
    return "\n".join(rows)


def write_page(path: str, text: str) -> bool:
    """Writes ``text`` to ``path`` unless it already holds it; returns whether anything changed."""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    from tfopt.core import write_text

    write_text(path, text)
    return True


def update_readme(path: str, text: str) -> bool:
    """Replaces what stands between the markers in ``path``; returns whether anything changed.

    Raises:
        SystemExit: the markers are missing or out of order.
    """
    with open(path, encoding="utf-8") as f:
        readme = f.read()
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"run_all: {path} lacks the {START} ... {END} markers")
    new = readme[: start + len(START)] + "\n" + text + "\n" + readme[end:]
    if new == readme:
        return False
    from tfopt.core import write_text

    write_text(path, new)
    return True


def run(bench: Bench, extra: list[str]) -> int:
    """Runs one benchmark script with its defaults (plus ``extra`` flags); returns its exit code."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"== {bench.id} {bench.title}: {bench.command} {' '.join(extra)}".rstrip(), flush=True)
    t0 = time.perf_counter()
    code = subprocess.call(
        [sys.executable, os.path.join(HERE, bench.script), *extra], cwd=REPO, env=env
    )
    print(f"== {bench.id} exit {code} after {time.perf_counter() - t0:.0f} s", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Runs the selected benchmarks one after another, then rewrites docs/benchmarks.md and the README summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated ids, e.g. B2,B7 (default: all)")
    p.add_argument(
        "--table-only", action="store_true", help="do not run anything; rebuild the tables"
    )
    p.add_argument("--readme", default=os.path.join(REPO, "README.md"))
    p.add_argument("--page", default=os.path.join(REPO, "docs", "benchmarks.md"))
    p.add_argument(
        "--print", action="store_true", help="print the page instead of writing the files"
    )
    args, extra = p.parse_known_args(argv)
    benches = select(args.only)
    failed = []
    if not args.table_only:
        failed = [b.id for b in benches if run(b, extra) != 0]
    if args.print:
        print(page())
    else:
        for path, changed in (
            (args.page, write_page(args.page, page())),
            (args.readme, update_readme(args.readme, summary())),
        ):
            print(f"{path}: {'rewritten' if changed else 'already current'}")
    if failed:
        print(f"run_all: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
