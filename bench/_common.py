"""The harness every benchmark script under bench/ runs on.

Benchmarks print a markdown table and write JSON; they are not timed tests. Every figure
they publish is a ratio measured side by side in one run, summarized by the median of
several repeats. A script holds only its protocol: :func:`script_parser` gives it the
arguments every benchmark takes (``--out``, ``--smoke``, ``--no-gate``, ``--workdir``), and
:func:`publish` writes and prints what it measured. Each script starts with the same two lines,
which put the repository root on ``sys.path`` when it runs as ``python bench/<name>.py``::

    if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from tfopt.core import (
    QUIET,
    configure_logging,
    markdown_table,  # noqa: F401  (the benchmarks' tables: one implementation)
)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# The benchmarks are programs: tfopt's lines (precision auto's choice, a resume) show as the
# commands print them.
configure_logging("bench", QUIET)


def median(values: Iterable[float]) -> float:
    """Returns the median of the finite values, or NaN when there are none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else float("nan")


def usable_cores() -> int:
    """Returns how many CPU cores this process may run on (its affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _machine() -> dict[str, Any]:
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "usable_cores": usable_cores(),
        "host_cpu_count": os.cpu_count(),
    }


def environment(tf=None) -> dict[str, Any]:
    """Returns a JSON-serializable description of where the benchmark ran."""
    env = _machine()
    if tf is not None:
        env["tensorflow"] = tf.__version__
    try:
        import tf_keras

        env["tf_keras"] = tf_keras.__version__
    except ImportError:  # pragma: no cover - tfopt requires it
        pass
    return env


def _cpu_model() -> str:
    from tfopt.core import cpu_info

    return cpu_info()["model"]


def write_json_atomic(path: str, payload: Any) -> None:
    """Writes ``payload`` as JSON to ``path`` atomically, readable under the user's umask (tfopt.core.fileio)."""
    from tfopt.core import write_json

    write_json(path, payload)


def status(ok: bool | None) -> str:
    """Returns the pass/miss word for a target check (``n/a`` when it could not be judged)."""
    if ok is None:
        return "n/a"
    return "pass" if ok else "MISS"


class CpuSample:
    """Context manager timing a block and estimating how busy OTHER processes kept the machine.

    On a shared machine a slow sample often means another tenant took a core. Reads the
    machine-wide busy time from /proc/stat (including hypervisor steal) and this process's own
    CPU time; ``foreign`` is (machine busy - own) / (wall x cores), in [0, 1]. NaN when
    /proc/stat is not available.
    """

    def __enter__(self):
        self._stat0 = _proc_stat()
        self._own0 = _own_cpu()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._t0
        self.own_cpu = _own_cpu() - self._own0
        stat1 = _proc_stat()
        if self._stat0 is None or stat1 is None or self.wall <= 0:
            self.foreign = float("nan")
        else:
            busy = (stat1[0] - self._stat0[0]) / _CLK_TCK
            self.foreign = min(1.0, max(0.0, (busy - self.own_cpu) / (self.wall * stat1[1])))
        return False


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _proc_stat():
    """(busy jiffies incl. steal, number of cpus) from /proc/stat, or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = [int(v) for v in lines[0].split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    busy = sum(fields[:3]) + sum(fields[5:8])
    ncpu = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    return busy, max(ncpu, 1)


def foreign_load(seconds: float) -> float:
    """Share of the machine's cores that other processes used over the next ``seconds``."""
    with CpuSample() as s:
        time.sleep(seconds)
    return s.foreign


class QuietGate:
    """Keeps measurements away from other tenants' bursts on a shared machine.

    ``run(unit)`` waits until other processes use at most ``threshold`` of the cores, runs
    ``unit()`` -> ``(result, foreign_loads)``, and runs it again (at most ``retries`` times) when
    a load exceeds ``threshold``. Waiting and re-runs share one time budget, ``max_wait``
    seconds for the whole benchmark; once it is spent, units run as they come. The last attempt
    is always kept (counted as disturbed if it was), so nothing is silently dropped.
    """

    def __init__(
        self,
        threshold: float = 0.15,
        retries: int = 1,
        max_wait: float = 90.0,
        enabled: bool = True,
    ):
        self.threshold, self.retries, self.max_wait, self.enabled = (
            threshold,
            retries,
            max_wait,
            enabled,
        )
        self.spent = 0.0  # seconds spent waiting and re-running
        self.units = 0
        self.reruns = 0
        self.disturbed = 0
        self.kept_loads: list[float] = []

    def _budget_left(self) -> bool:
        return self.enabled and self.spent < self.max_wait

    def wait(self) -> None:
        while self._budget_left():
            t0 = time.perf_counter()
            load = foreign_load(0.3)
            if not load > self.threshold:  # NaN (no /proc/stat) passes
                return
            time.sleep(0.7)
            self.spent += time.perf_counter() - t0

    def run(self, unit):
        self.units += 1
        attempt = 0
        while True:
            self.wait()
            t0 = time.perf_counter()
            result, loads = unit()
            if attempt:
                self.spent += time.perf_counter() - t0
            worst = max((x for x in loads if x == x), default=0.0)
            if worst <= self.threshold:
                break
            if attempt >= self.retries or not self._budget_left():
                self.disturbed += 1
                break
            attempt += 1
            self.reruns += 1
        self.kept_loads.extend(loads)
        return result

    def summary(self) -> dict:
        return {
            "threshold": self.threshold,
            "enabled": self.enabled,
            "units": self.units,
            "reruns": self.reruns,
            "kept_disturbed_units": self.disturbed,
            "extra_seconds": round(self.spent, 1),
            "max_extra_seconds": self.max_wait,
            "kept_foreign_load_median": median(self.kept_loads),
            "kept_foreign_load_max": max(
                (x for x in self.kept_loads if x == x), default=float("nan")
            ),
        }


def lscpu_info() -> dict[str, Any]:
    """What ``lscpu`` says about this machine's CPU (model, topology, caches, flags), JSON-ready
    (:func:`tfopt.core.cpu.cpu_info`: /proc/cpuinfo where lscpu is missing)."""
    from tfopt.core import cpu_info

    return cpu_info()


def environment_light() -> dict[str, Any]:
    """Like :func:`environment`, without importing TensorFlow (versions from the installed metadata):
    for a benchmark whose measuring processes are children that must start TensorFlow themselves."""
    from importlib.metadata import PackageNotFoundError, version

    env = _machine()
    for key, dist in (("tensorflow", "tensorflow"), ("tf_keras", "tf-keras"), ("numpy", "numpy")):
        try:
            env[key] = version(dist)
        except PackageNotFoundError:
            pass
    return env


# --- The one summary every result file carries (bench/run_all.py builds the README table from it) ---

_OPS = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


def figure(
    name: str,
    values: Iterable[float | None],
    unit: str,
    *,
    target: tuple[str, float] | None = None,
    peer: str | None = None,
    anchor: str | None = None,
    detail: str | None = None,
    digits: int = 2,
) -> dict[str, Any]:
    """One published figure: the median of its repeats, their range, and its verdict.

    Args:
        name: What is measured, e.g. ``"epoch 1 input throughput, tfopt / naive"``.
        values: The figure of every repeat (None or NaN: a repeat that measured nothing).
        unit: ``"x"`` (a ratio), ``"%"``, ``"pt"``, ``"ms"``, ...
        target: ``(op, bound)`` in ``unit`` (op one of ``>=``, ``<=``, ``>``, ``<``), or None for
            information only.
        peer: What the public recipe gives on the same run (its figure, or what the ratio is against).
        anchor: The published figure the field has shown (BENCHMARKS.md), for context.
        detail: One line: the raw measurements behind the ratio.
        digits: Decimals shown in the README table.

    Returns:
        A JSON-ready dict with ``value`` (median), ``spread`` ([min, max]), ``repeats``,
        ``values``, ``target`` (e.g. ``">= 1.8x"``), ``op``/``bound`` and ``status``
        (``pass``, ``MISS``, ``n/a`` when nothing was measured, ``-`` without a target).
    """
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    value = statistics.median(vals) if vals else None
    out: dict[str, Any] = {
        "name": name,
        "value": value,
        "unit": unit,
        "repeats": len(vals),
        "values": vals,
        "spread": [min(vals), max(vals)] if vals else None,
        "digits": digits,
        "target": None,
        "op": None,
        "bound": None,
        "status": "-",
        "peer": peer,
        "anchor": anchor,
        "detail": detail,
    }
    if target is not None:
        op, bound = target
        if op not in _OPS:
            raise ValueError(f"target op {op!r} is not one of {', '.join(_OPS)}")
        sep = "" if unit in ("x", "%") else " "
        out.update(
            target=f"{op} {bound:g}{sep}{unit}",
            op=op,
            bound=float(bound),
            status="n/a" if value is None else ("pass" if _OPS[op](value, bound) else "MISS"),
        )
    return out


def result(
    bench_id: str, title: str, command: str, figures: Sequence[dict], **payload: Any
) -> dict[str, Any]:
    """The JSON a benchmark commits to ``bench/results/``: who, where, what, and every figure.

    Args:
        bench_id: ``"B1"`` ... ``"B8"`` (BENCHMARKS.md's row).
        title: A few words, e.g. ``"ingestion"``.
        command: The command that produced it, as a user types it.
        figures: :func:`figure` dicts, in the order the README shows them.
        **payload: The benchmark's own details (parameters, every repeat, raw timings).
    """
    return {
        "id": bench_id,
        "title": title,
        "command": command,
        "environment": environment_light(),
        "lscpu": lscpu_info(),
        "figures": list(figures),
        **payload,
    }


def interleaved_latency(
    models: dict, settings, *, repeats: int, runs: int, warmup: int, gate, bar
) -> dict:
    """LiteRT p50 per (model, setting) per round; every model interleaved (order rotated) within every round.

    Args:
        models: ``{name: .tflite bytes}``.
        settings: ``((key, threads), ...)``, e.g. ``(("xnnpack/1t", 1), ("xnnpack/2t", 2))``.
        repeats, runs, warmup: Rounds, timed invokes per model and round, untimed invokes first.
        gate: A :class:`QuietGate` (re-runs a round other tenants disturbed).
        bar: A tqdm bar, advanced once per round and setting.

    Returns:
        ``{name: {key: [p50 ms of each round]}}``.
    """
    from tfopt.export import latency as tflite_latency

    names = list(models)
    per = {name: {key: [] for key, _ in settings} for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for key, threads in settings:

            def unit():
                with CpuSample() as s:
                    out = {
                        n: tflite_latency(models[n], threads=threads, warmup=warmup, runs=runs)[
                            "p50_ms"
                        ]
                        for n in order
                    }
                return out, [s.foreign]

            for n, v in gate.run(unit).items():
                per[n][key].append(v)
            bar.set_postfix_str(f"latency round {r + 1}/{repeats} {key}")
            bar.update(1)
    return per


def bound_cells(roof: dict) -> tuple[str, str]:
    """A roofline's bound in microseconds and measured / bound, as table cells (``-`` where a
    class of the model's ops has no measured peak on this CPU: no bound, never a guess)."""
    bound, ratio = roof["bound_ms"], roof["ratio"]
    return (
        "-" if bound is None else f"{1e3 * bound:.0f}",
        "-" if ratio is None else f"{ratio:.2f}x",
    )


def roofline_at(content: bytes, per_model: dict, settings, peaks: dict) -> dict:
    """One model's roofline at its interleaved medians (:func:`tfopt.export.roofline.measure`):
    the bound and measured / bound per setting, per kernel class at the first."""
    from tfopt.export import measure_roofline

    latency = {k: {"p50_ms": median(per_model[k]), "threads": t} for k, t in settings}
    return measure_roofline(content, latency, peaks=peaks)


def speedups(per: dict, name: str, base: str, settings) -> dict:
    """Per setting: ``name``'s p50 median and rounds, and its per-round speedup over ``base`` (same round)."""
    out = {}
    for key, _ in settings:
        ratios = [f / v for f, v in zip(per[base][key], per[name][key])]
        out[key] = {
            "p50_ms": median(per[name][key]),
            "rounds": per[name][key],
            "speedup_vs_float32": median(ratios),
            "speedup_rounds": ratios,
        }
    return out


def script_parser(
    doc: str,
    name: str,
    smoke: str | None,
    *,
    gate: bool = False,
    workdir: str | None | bool = False,
    workdir_help: str = "",
) -> argparse.ArgumentParser:
    """The argument parser a benchmark script starts from; the script adds its own options.

    Args:
        doc: The script's docstring; its first paragraph is the description.
        name: The result's name: ``--out`` defaults to ``bench/results/<name>.json``.
        smoke: Help of ``--smoke``: what the small run the tests start does (None: the script
            has no smoke run).
        gate: Adds ``--no-gate`` (measure whatever the load, instead of waiting for a quiet
            machine).
        workdir: Adds ``--workdir`` with this default, unless False.
        workdir_help: Help of ``--workdir``.

    Returns:
        The parser, for the script to extend and call.
    """
    ap = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out",
        default=os.path.join(RESULTS, f"{name}.json"),
        help=f"JSON output (default bench/results/{name}.json)",
    )
    if smoke is not None:
        ap.add_argument("--smoke", action="store_true", help=smoke)
    if gate:
        ap.add_argument(
            "--no-gate", action="store_true", help="no quiet-gate (measure whatever the load)"
        )
    if workdir is not False:
        ap.add_argument("--workdir", default=workdir, help=workdir_help or None)
    return ap


def publish(
    res: dict,
    out: str,
    bench_id: str,
    *,
    table=None,
    gate=None,
    started: float | None = None,
    code: int = 0,
) -> int:
    """Completes a benchmark's result, writes it to ``out`` atomically and prints its table.

    Args:
        res: The result (:func:`result`, or the script's own dict).
        out: Where the JSON goes.
        bench_id: ``"B1"`` ...: the tag of the last line printed.
        table: The result's markdown table, or a function making it from the completed result
            (stored as ``table_markdown`` and printed).
        gate: The run's :class:`QuietGate`: its summary is stored as ``quiet_gate``.
        started: ``time.perf_counter()`` at the start: the wall time is stored.
        code: The script's exit code, returned.

    Returns:
        ``code``.
    """
    if gate is not None:
        res["quiet_gate"] = gate.summary()
    if started is not None:
        res["wall_seconds"] = round(time.perf_counter() - started, 1)
    if callable(table):
        table = table(res)
    if table is not None:
        res["table_markdown"] = table
        print(table)
    write_json_atomic(out, res)
    seconds = res.get("wall_seconds")
    wall = f"{seconds:.0f} s wall; " if isinstance(seconds, (int, float)) else ""
    print(f"\n[{bench_id}] {wall}JSON written to {out}")
    return code


def figures_table(figures: list[dict]) -> str:
    """The ``### Figures`` block a benchmark prints: name, median, range, target, status."""
    rows = [
        [
            f["name"],
            "-" if f["value"] is None else f"{f['value']:.3g} {f['unit']}",
            "-" if f["spread"] is None else f"{f['spread'][0]:.3g}-{f['spread'][1]:.3g}",
            f["target"] or "-",
            f["status"],
        ]
        for f in figures
    ]
    return "### Figures\n\n" + markdown_table(
        ["figure", "median", "range", "target", "status"], rows
    )
