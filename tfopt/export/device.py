"""Timing on the phone the model ships to: LiteRT's ``benchmark_model`` run over ``adb``.

``--device adb`` (or ``adb:SERIAL`` when several devices are connected) with
``--benchmark-binary PATH`` pushes LiteRT's ``benchmark_model`` for the device's ABI (LiteRT
publishes an ``android_aarch64`` build; see docs/export.md) and every distinct ``.tflite`` to
``/data/local/tmp/tfopt/``, runs it at each thread count with XNNPACK and op profiling, and reads
its figures back: the median and mean of the timed runs, and the time per op type. Each figure is
marked with the device it came from (``device: Pixel 9, arm64-v8a``). A device that is missing,
unauthorized or full, and an ``adb`` that is not installed, are one line each naming the fix.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from tfopt.core.errors import ConfigError

REMOTE_DIR = "/data/local/tmp/tfopt"
BINARY_URL = (
    "https://storage.googleapis.com/tensorflow-nightly-public/prod/tensorflow/release/lite/tools/"
    "nightly/latest/android_aarch64_benchmark_model"
)
_TIMEOUT = 600.0


class DeviceError(ConfigError):
    """The device or ``adb`` cannot do what was asked (the message names the fix)."""


def parse(text: str) -> str | None:
    """The serial ``--device`` names: ``adb`` -> None (the only device), ``adb:SERIAL`` -> SERIAL.

    Raises:
        ConfigError: anything else.
    """
    kind, sep, serial = text.partition(":")
    if kind != "adb" or (sep and not serial) or any(c.isspace() for c in serial):
        raise ConfigError(
            f"--device {text[:80]!r} is not valid; give adb (the one connected Android device) or "
            "adb:SERIAL (one of those `adb devices -l` lists)"
        )
    return serial or None


@dataclass
class Adb:
    """One Android device reached through ``adb`` (``serial`` None: the only one connected)."""

    serial: str | None = None
    exe: str = "adb"

    def __post_init__(self):
        found = shutil.which(self.exe)
        if found is None:
            raise DeviceError(
                "--device adb: adb is not installed or not on PATH; install Android's "
                "platform-tools (e.g. apt install adb) and connect the phone with USB debugging on"
            )
        self.exe = found

    def run(self, *args: str, timeout: float = _TIMEOUT) -> str:
        """``adb [-s SERIAL] args``: its stdout.

        Raises:
            DeviceError: adb failed (no device, unauthorized, no space, ...), in one line.
        """
        cmd = [self.exe, *(["-s", self.serial] if self.serial else []), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise DeviceError(
                f"adb {' '.join(args)[:120]} did not finish in {timeout:.0f} s; check the "
                "device's connection (adb devices -l)"
            ) from None
        if proc.returncode != 0:
            raise DeviceError(self._why(proc.stderr + proc.stdout, args))
        return proc.stdout

    def _why(self, text: str, args) -> str:
        """One line for a failed adb call: what went wrong and the fix."""
        device = f"device {self.serial!r}" if self.serial else "the device"
        if "No space left on device" in text:
            return (
                f"{device} has no space left in {REMOTE_DIR} for `adb {' '.join(args)[:120]}`; "
                "free some storage on the phone, then rerun"
            )
        if "unauthorized" in text:
            return (
                f"{device} has not authorized this computer; accept the 'Allow USB debugging' "
                "dialog on the phone, then rerun"
            )
        if "more than one device" in text:
            return (
                "several Android devices are connected; name one with --device adb:SERIAL "
                "(adb devices -l lists their serials)"
            )
        if "not found" in text and self.serial:
            return (
                f"no Android device with serial {self.serial!r} is connected; give one that "
                "adb devices -l lists"
            )
        if "no devices" in text:
            return (
                "no Android device is connected (adb devices -l lists none); connect one with "
                "USB debugging on, or drop --device"
            )
        if "offline" in text:
            return f"{device} is offline; reconnect it (adb reconnect), then rerun"
        last = (text.strip().splitlines() or ["no output"])[-1]
        return f"adb {' '.join(args)[:120]} failed: {last[:200]}"

    def describe(self) -> str:
        """``Pixel 9, arm64-v8a``: the device's model and ABI."""
        model = self.run("shell", "getprop", "ro.product.model").strip() or "unknown model"
        abi = self.run("shell", "getprop", "ro.product.cpu.abi").strip() or "unknown ABI"
        return f"{model}, {abi}"


@dataclass
class Device:
    """A connected phone ready to time ``.tflite`` files with ``benchmark_model``."""

    adb: Adb
    label: str
    binary: str

    @classmethod
    def connect(cls, spec: str, binary: str) -> Device:
        """Checks the device and pushes ``benchmark_model`` to it.

        Args:
            spec: ``--device`` (``adb`` or ``adb:SERIAL``).
            binary: A local ``benchmark_model`` built for the device's ABI.

        Raises:
            ConfigError: a bad ``spec``, no binary, or a device that cannot be used (one line).
        """
        serial = parse(spec)
        if not binary or not os.path.isfile(binary):
            raise ConfigError(
                f"--device {spec} needs --benchmark-binary PATH, LiteRT's benchmark_model for the "
                f"phone (for arm64: {BINARY_URL}); {binary!r} is not a file"
                if binary
                else f"--device {spec} needs --benchmark-binary PATH, LiteRT's benchmark_model for "
                f"the phone (for arm64: {BINARY_URL})"
            )
        adb = Adb(serial)
        label = adb.describe()
        adb.run("shell", "mkdir", "-p", REMOTE_DIR)
        remote = f"{REMOTE_DIR}/benchmark_model"
        adb.run("push", binary, remote)
        adb.run("shell", "chmod", "755", remote)
        return cls(adb, label, remote)

    def time(self, path: str, *, threads: int, runs: int, warmup: int) -> dict:
        """``benchmark_model`` on the device: one ``.tflite`` at ``threads`` threads, XNNPACK on.

        Returns:
            :func:`parse_output`'s figures with ``threads``, ``runs``, ``warmup`` and ``device``.

        Raises:
            DeviceError: adb failed, or benchmark_model printed no timings.
        """
        remote = f"{REMOTE_DIR}/{os.path.basename(path)}"
        self.adb.run("push", path, remote)
        flags = [
            f"--graph={remote}",
            f"--num_threads={threads}",
            "--use_xnnpack=true",
            f"--num_runs={runs}",
            f"--warmup_runs={warmup}",
            "--min_secs=0",
            "--warmup_min_secs=0",
            "--enable_op_profiling=true",
        ]
        try:
            out = self.adb.run("shell", shlex.join([self.binary, *flags]))
        finally:
            self.adb.run("shell", "rm", "-f", remote)
        figures = parse_output(out)
        if figures is None:
            last = (out.strip().splitlines() or ["no output"])[-1]
            raise DeviceError(
                f"benchmark_model on {self.label} printed no timings for {os.path.basename(path)} "
                f"({last[:160]}); check that --benchmark-binary is LiteRT's benchmark_model for "
                "this ABI"
            )
        return {**figures, "threads": threads, "runs": runs, "warmup": warmup, "device": self.label}

    def p50(self, content: bytes, threads: int, *, runs: int, warmup: int) -> float:
        """The p50 (ms; the mean from builds that print no median) of a flatbuffer on the phone."""
        with tempfile.TemporaryDirectory(prefix="tfopt-device-") as scratch:
            path = os.path.join(scratch, "candidate.tflite")
            with open(path, "wb") as f:
                f.write(content)
            figures = self.time(path, threads=threads, runs=runs, warmup=warmup)
        return figures["p50_ms"] if figures["p50_ms"] is not None else figures["mean_ms"]


_STAT = re.compile(r"count=(\d+)(.*)")
_FIELD = re.compile(r"\b(first|curr|min|max|avg|std|p5|median|p95)=([0-9.]+)")
_AVG = re.compile(r"Inference \(avg\): ([0-9.eE+-]+)")


def parse_output(text: str) -> dict | None:
    """LiteRT ``benchmark_model``'s figures from what it printed (None when it printed none).

    The timed runs' statistics line (the second ``count=...`` line: the first is the warmup's)
    gives ``p50_ms`` (its ``median``; None from builds that print no percentiles), ``p95_ms``,
    ``min_ms`` and ``mean_ms``; ``ops_ms`` is the average time per node type of the operator-wise
    profile of the timed runs, when profiling printed one.
    """
    stats = []
    for line in text.splitlines():
        line = line.removeprefix("INFO: ").strip()
        m = _STAT.match(line)
        if m and "Timings" not in line:
            fields = {k: float(v) for k, v in _FIELD.findall(m.group(2))}
            stats.append({"count": int(m.group(1)), **fields})
    avg = _AVG.search(text)
    if len(stats) < 2 and not avg:
        return None
    timed = stats[1] if len(stats) >= 2 else {}
    us = 1e-3
    mean = float(avg.group(1)) if avg else timed.get("avg")

    def ms(key):
        return round(timed[key] * us, 5) if key in timed else None

    return {
        "p50_ms": ms("median"),
        "p95_ms": ms("p95"),
        "min_ms": ms("min"),
        "mean_ms": round(mean * us, 5) if mean is not None else None,
        "timed_runs": timed.get("count"),
        "ops_ms": _op_summary(text),
    }


def _op_summary(text: str) -> dict[str, float]:
    """``{node type: avg ms}`` from the "Summary by node type" of the timed runs' profile."""
    start = text.find("Operator-wise Profiling Info for Regular Benchmark Runs")
    if start < 0:
        return {}
    section = text[start:]
    at = section.find("Summary by node type")
    if at < 0:
        return {}
    out = {}
    for line in section[at:].splitlines()[2:]:
        cells = [c.strip() for c in line.split("\t") if c.strip()]
        if len(cells) < 3:
            break
        try:
            out[cells[0]] = float(cells[2])
        except ValueError:
            break
    return out
