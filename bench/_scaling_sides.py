"""Benchmark B3's orchestrator: how it starts the processes of a side and reads their reports."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

from bench._scaling_params import REPO, SCRIPT, Params

# ============================================================================================
# The orchestrator
# ============================================================================================


class Ctx:
    """Where and how the orchestrator starts processes."""

    def __init__(self, p: Params, cores: list[int], isolate: bool, root: str, timeout: float):
        self.p, self.cores, self.isolate, self.root, self.timeout = p, cores, isolate, root, timeout
        self.n = 0
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env

    def fresh(self, label: str) -> str:
        self.n += 1
        path = os.path.join(self.root, f"{self.n:03d}-{label}")
        os.makedirs(path)
        return path


def _tail(path: str, n: int = 40) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def _stop(procs: list) -> None:
    """Stops our own children that still run, by their process groups: SIGTERM first (a launcher
    passes it on to its tasks, which run in sessions of their own), SIGKILL after a grace period."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while any(p.poll() is None for p in alive) and time.monotonic() < end:
            time.sleep(0.05)


def _run_procs(cmds: list[list[str]], ctx: Ctx, workdir: str) -> None:
    """Starts every command at once and waits for all; a failure or a timeout stops the others."""
    procs, logs = [], []
    try:
        for i, cmd in enumerate(cmds):
            logs.append(os.path.join(workdir, f"proc-{i}.log"))
            with open(logs[-1], "w") as f:
                f.write("$ " + " ".join(cmd) + "\n")
                f.flush()
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=ctx.env,
                        cwd=REPO,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + ctx.timeout + 20  # a launcher's own --timeout fires first
        failed = None
        while (
            failed is None and any(p.poll() is None for p in procs) and time.monotonic() < deadline
        ):
            time.sleep(0.1)
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), failed)
        if failed is None and any(p.poll() is None for p in procs):
            failed = next(i for i, p in enumerate(procs) if p.poll() is None)
            what = f"did not finish within {ctx.timeout:.0f} s"
        elif failed is not None:
            what = f"exited with code {procs[failed].returncode}"
    finally:
        _stop(procs)
    if failed is not None:
        raise RuntimeError(
            f"[B3] a benchmark process {what}; its log ({logs[failed]}) ends with:\n"
            f"{_tail(logs[failed])}"
        )


def _reports(workdir: str) -> list[dict]:
    out = []
    for f in sorted(os.listdir(workdir)):
        if f.endswith(".json"):
            with open(os.path.join(workdir, f), encoding="utf-8") as fh:
                out.append(json.load(fh))
    return out


def _harness(role: str, *opts) -> list[str]:
    return [sys.executable, SCRIPT, role, *[str(o) for o in opts]]


def _launch(ctx: Ctx, workers: int, command: list[str], extra: tuple = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tfopt.launch",
        *extra,
        "--workers",
        str(workers),
        "--timeout",
        str(int(ctx.timeout)),
        "--grace",
        "5",
        "--isolate" if ctx.isolate else "--no-isolate",
        "--",
        *command,
    ]


def _train_flags(
    p: Params,
    strategy: str,
    batch: int,
    total_steps: int,
    out: str,
    backup_every: int = 0,
    spe: int = 0,
    model: str | None = None,
) -> list[str]:
    flags = [
        "--strategy",
        strategy,
        "--model",
        model or p.model,
        "--dataset",
        "mnist",
        "--batch-size",
        str(batch),
        "--limit",
        str(p.limit),
        "--epochs",
        "1",
        "--steps-per-epoch",
        str(total_steps),
        "--quiet",
        "--set",
        "train.tensorboard=false",
        "-o",
        out,
    ]
    if backup_every:
        flags += ["--backup-every", str(backup_every)]
    if spe:
        flags += ["--steps-per-execution", str(spe)]
    return flags


def foreign_load(reports: list[dict]) -> float:
    """Share of the machine's cores that processes other than ours used during the timed windows.

    For each process: (machine busy CPU - its own CPU - its siblings' CPU in the overlapping part
    of their windows, assumed uniform) / (wall x cores). The worst process counts.
    """
    loads = []
    for i, r in enumerate(reports):
        w = r["window"]
        if not w["seconds"] > 0 or math.isnan(w["busy_cpu_s"]):
            continue
        s0, s1 = w["start_mono"], w["start_mono"] + w["seconds"]
        siblings = 0.0
        for j, q in enumerate(reports):
            v = q["window"]
            if j != i and v["seconds"] > 0:
                overlap = max(
                    0.0, min(s1, v["start_mono"] + v["seconds"]) - max(s0, v["start_mono"])
                )
                siblings += v["own_cpu_s"] * overlap / v["seconds"]
        loads.append(
            min(
                1.0,
                max(
                    0.0, (w["busy_cpu_s"] - w["own_cpu_s"] - siblings) / (w["seconds"] * w["ncpu"])
                ),
            )
        )
    return max(loads) if loads else float("nan")


def _window_overlap(reports: list[dict]) -> float:
    """Common part of the processes' timed windows / the longest window (1 = perfectly concurrent)."""
    starts = [r["window"]["start_mono"] for r in reports]
    ends = [r["window"]["start_mono"] + r["window"]["seconds"] for r in reports]
    return max(0.0, min(ends) - max(starts)) / max(r["window"]["seconds"] for r in reports)


def _slim(r: dict) -> dict:
    """A process report for the JSON (the window's raw counters kept: foreign load is recomputable)."""
    keep = (
        "task",
        "core",
        "affinity",
        "env",
        "threads",
        "tf_threading",
        "strategy",
        "global_batch_size",
        "backup_every",
        "first_step",
        "compiled_steps_per_execution",
        "window_steps",
        "step_ms",
        "steps_per_execution",
        "executions",
        "barrier_wait_s",
        "window",
        "backup_steps_kept",
        "trainable_values",
        "runtime",
        "status",
    )
    return {k: r[k] for k in keep if k in r}


def _check_reports(reports: list[dict], expected: int, what: str) -> None:
    if len(reports) != expected:
        raise RuntimeError(f"[B3] {what}: {len(reports)} process report(s), expected {expected}")
    for r in reports:
        spe = r.get("compiled_steps_per_execution") or max(r["steps_per_execution"] or [1])
        if r["first_step"] > spe:  # a run that resumed from an old backup would skip steps
            raise RuntimeError(
                f"[B3] {what}: {r['task']} started at step {r['first_step']}: it resumed a run"
            )


# -- phase 1: scaling ---------------------------------------------------------------------------

SIDES = {
    "a": "1 one_device process pinned to 1 core, batch B",
    "b": "2 multi_worker_mirrored workers (tfopt.launch), 1 core each, global batch 2B",
    "c": "control: 2 independent one_device processes, 1 core each, batch B each, concurrent",
}


def run_side(side: str, ctx: Ctx, launch_flags: tuple = (), train_flags: tuple = ()) -> dict:
    """Runs one side of the scaling comparison; returns its throughput and process reports.

    ``launch_flags`` go to side b's launcher (e.g. ``--hosts 2``), ``train_flags`` to its workers.
    """
    p = ctx.p
    total = p.warmup_steps + p.steps
    wd = ctx.fresh(f"scaling-{side}")
    pin = [
        "--intra",
        p.intra_threads,
        "--inter",
        p.inter_threads,
        "--warmup",
        p.warmup_steps,
        "--report-dir",
        wd,
    ]
    c0, c1 = ctx.cores[0], ctx.cores[1]
    if side == "a":
        cmds = [
            _harness(
                "_train",
                "--cores",
                c0,
                *pin,
                "--",
                *_train_flags(
                    p,
                    "one_device",
                    p.batch,
                    total,
                    os.path.join(wd, "run"),
                    spe=p.steps_per_execution,
                ),
            )
        ]
        n, combine = 1, "sum"
    elif side == "b":
        cmds = [
            _launch(
                ctx,
                2,
                _harness(
                    "_train",
                    "--cores",
                    f"{c0},{c1}",
                    *pin,
                    "--",
                    *_train_flags(
                        p,
                        "multi_worker_mirrored",
                        2 * p.batch,
                        total,
                        os.path.join(wd, "run"),
                        spe=p.steps_per_execution,
                    ),
                    *train_flags,
                ),
                launch_flags,
            )
        ]
        n, combine = 2, "sync"
    else:
        cmds = [
            _harness(
                "_train",
                "--cores",
                core,
                *pin,
                "--barrier",
                2,
                "--barrier-timeout",
                ctx.timeout / 2,
                "--",
                *_train_flags(
                    p,
                    "one_device",
                    p.batch,
                    total,
                    os.path.join(wd, f"run{k}"),
                    spe=p.steps_per_execution,
                ),
            )
            for k, core in enumerate((c0, c1))
        ]
        n, combine = 2, "sum"
    t0 = time.perf_counter()
    _run_procs(cmds, ctx, wd)
    wall = time.perf_counter() - t0
    reports = _reports(wd)
    _check_reports(reports, n, f"side {side}")
    pinned = sorted(tuple(r["affinity"]) for r in reports)
    if pinned != sorted((c,) for c in ctx.cores[:n]):
        raise RuntimeError(
            f"[B3] side {side}: processes ran on cores {pinned}, expected one each of {ctx.cores[:n]}"
        )
    step_ms = [r["step_ms"] for r in reports]
    out = {
        "step_ms": step_ms,
        "batch_per_process": p.batch,
        "combine": combine,
        "examples_per_sec": side_throughput(step_ms, p.batch, combine),
        "foreign_load": foreign_load(reports),
        "wall_s": round(wall, 1),
        "processes": [_slim(r) for r in reports],
    }
    if n > 1:
        out["window_overlap"] = _window_overlap(reports)
    shutil.rmtree(wd, ignore_errors=True)
    return out


def side_throughput(step_ms: list[float], batch: int, combine: str) -> float:
    """Examples/s of a side: ``sum`` of independent processes' rates, or ``sync``: synchronous
    workers, one global step (batch x workers) per step of the slowest."""
    if combine == "sync":
        return len(step_ms) * batch / (max(step_ms) / 1e3)
    return sum(batch / (ms / 1e3) for ms in step_ms)


def _spread(values) -> list[float]:
    vals = [v for v in values if not math.isnan(v)]
    return [min(vals), max(vals)] if vals else []
