"""Timing an export's files together: identical graphs once, interleaved rounds, the
``litert-benchmark`` cross-check and a connected phone; each row's latency, kernels and roofline."""

from __future__ import annotations

import os

from tfopt.export import benchmark as bench
from tfopt.export import (
    device,
    roofline,
    summary,
)
from tfopt.export import rounds as rounds_lib
from tfopt.export.evaluate import read_tflite
from tfopt.export.settings import BenchSettings


def litert_benchmark(settings: BenchSettings, path: str) -> dict:
    """The ``litert-benchmark`` cross-check figures of one file, when asked and installed."""
    out = {}
    if settings.litert_benchmark:
        for t in settings.threads:
            res = bench.litert_benchmark(
                path, threads=t, runs=settings.runs, warmup=settings.warmup
            )
            if res is not None:
                out[f"litert-benchmark/{t}t"] = res
    return out


def time_files(
    files: dict[str, str], settings: BenchSettings, say=None, phone: device.Device | None = None
) -> tuple[dict, dict]:
    """Every file timed (identical graphs once, interleaved rounds; see :mod:`rounds`), and on
    the phone when one is connected (``device/<N>t``).

    Args:
        files: Name -> .tflite path.
        phone: A connected device (``--device``).

    Returns:
        ``(latency, same)``: per name, ``{setting key: figures (with kernels)}``; per name of a
        file whose graph an earlier one has, that file's name.
    """
    contents = {}
    for name, path in files.items():
        with open(path, "rb") as f:
            contents[name] = f.read()
    figures, same = rounds_lib.time_files(
        contents,
        settings.settings(),
        warmup=settings.warmup,
        runs=settings.runs,
        rounds=settings.rounds,
        say=say,
    )
    for name, path in files.items():
        figures[name] = {**figures[name], **litert_benchmark(settings, path)}
    if phone is not None:
        for name, path in files.items():
            if name in same:
                continue
            for t in settings.threads:
                if say:
                    say(f"timing {os.path.basename(path)} on {phone.label} at {t} thread(s)")
                figures[name][f"device/{t}t"] = phone.time(
                    path, threads=t, runs=settings.runs, warmup=settings.warmup
                )
        for name, twin in same.items():
            figures[name] = figures[twin]
    return figures, same


def measured(
    row: dict, content: bytes, latency: dict, same_as: str | None = None, roof: dict | None = None
) -> dict:
    """``row`` with its latency, kernels, roofline (``roof``: its twin's) and fastest runtime."""
    row["kernels"] = next(
        (v["kernels"] for v in latency.values() if "kernels" in v and v["kernels"]["xnnpack"]), None
    )
    row["latency"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "kernels"} for k, v in latency.items()
    }
    row["roofline"] = roof if roof is not None else roofline.measure(content, latency)
    row["fastest_runtime"] = summary.fastest_runtime(row)
    if same_as:
        row["same_graph_as"] = same_as
    return row


def time_all(rows: list[dict], out_dir: str, bench_settings, say, phone) -> None:
    """Times every written file together and fills each row's latency and roofline."""
    files = {r["mode"]: os.path.join(out_dir, r["file"]) for r in rows if r.get("file")}
    latency, same = time_files(files, bench_settings, say, phone)
    rooflines: dict[str, dict] = {}
    for row in rows:
        name = row["mode"]
        if name in files:
            twin = same.get(name)
            measured(row, read_tflite(files[name]), latency[name], twin, rooflines.get(twin))
            rooflines[name] = row["roofline"]
