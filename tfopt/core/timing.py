"""The one timing loop: warm up, then time single calls one by one and report percentiles."""

from __future__ import annotations

import time

import numpy as np


def time_calls(call, *, warmup: int, runs: int) -> dict:
    """Calls ``call`` ``warmup`` times untimed, then ``runs`` times timed one by one.

    Args:
        call: A function of no arguments that returns once its work is done.
        warmup: Untimed calls first (caches, lazy packing of weights, tracing).
        runs: Timed calls.

    Returns:
        ``{"p50_ms", "p95_ms", "mean_ms", "min_ms", "runs", "warmup"}``.
    """
    for _ in range(warmup):
        call()
    return {**percentiles(samples(call, runs)), "runs": runs, "warmup": warmup}


def samples(call, runs: int) -> np.ndarray:
    """Seconds each of ``runs`` calls of ``call`` took, one by one."""
    times = np.empty(runs)
    clock = time.perf_counter
    for i in range(runs):
        t0 = clock()
        call()
        times[i] = clock() - t0
    return times


def percentiles(seconds: np.ndarray) -> dict:
    """``{"p50_ms", "p95_ms", "mean_ms", "min_ms"}`` of call times given in seconds."""
    ms = np.asarray(seconds) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "mean_ms": float(ms.mean()),
        "min_ms": float(ms.min()),
    }
