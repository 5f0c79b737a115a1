"""How far a .tflite's latency is from what the CPU could do: its roofline, per kernel class.

The bound of an op is its multiply-adds divided by one core's measured peak rate for the
arithmetic its kernel uses (:func:`tfopt.core.cpu.peaks`), times the cores it may use: fp32 FMA for
float ops, the int8 dot product for ops with integer weights, and the fp32 rate for depthwise
convolutions in every precision, because XNNPACK's x86 int8 depthwise kernels multiply in 32-bit
lanes (``qs8_qc8w_dwconv_*_mul32``: as many lanes per instruction as fp32 FMA). Elementwise and
other ops carry no multiply-adds: their time is all overhead above the compute bound. The bound is
a floor no kernel can beat; measured / bound says how much is left. Where a peak could not be
measured the bound is None, never invented.

Per class, the time comes from every op timed alone (:mod:`tfopt.export.ops`), scaled so the
classes add up to the whole model's p50.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tfopt.export.ops import CLASSES, CONV, DEPTHWISE, OTHER, OpCost


def _rate(cost: OpCost, peaks: dict) -> float | None:
    """Multiply-adds per second one core can do for this op (None: unknown)."""
    if cost.kind == OTHER:
        return None
    kind = "int8" if cost.kind == CONV and cost.arithmetic == "int8" else "fp32"
    peak = peaks.get(kind)
    return peak["gmacs"] * 1e9 if peak else None


def _cores(threads: int) -> int:
    return max(1, min(threads, os.cpu_count() or 1))


def bound_ms(costs: Sequence[OpCost], peaks: dict, threads: int = 1) -> float | None:
    """The compute bound of the whole model in ms: no kernel can run it faster on this CPU.

    Args:
        costs: The model's ops (:func:`tfopt.export.ops.op_costs`).
        peaks: One core's peak rates (:func:`tfopt.core.cpu.peaks`).
        threads: Threads the model runs on; the bound assumes each on its own core.

    Returns:
        The bound, or None when a peak the model needs is unknown.
    """
    total = 0.0
    for cost in costs:
        if cost.macs == 0:
            continue
        rate = _rate(cost, peaks)
        if rate is None:
            return None
        total += cost.macs / rate
    return total * 1e3 / _cores(threads)


def analyze(
    costs: Sequence[OpCost],
    peaks: dict,
    *,
    p50_ms: float | None,
    op_ms: Sequence[float | None] | None = None,
    threads: int = 1,
) -> dict:
    """The roofline of one model at one thread count, whole and per kernel class.

    Args:
        costs: The model's ops (:func:`tfopt.export.ops.op_costs`).
        peaks: One core's peak rates (:func:`tfopt.core.cpu.peaks`).
        p50_ms: The whole model's measured p50 at ``threads``.
        op_ms: Each op's p50 timed alone (:func:`tfopt.export.ops.time_alone`), in the order of
            ``costs``; None skips the per-class times.
        threads: The thread count of ``p50_ms`` and ``op_ms``.

    Returns:
        ``{"threads", "macs", "bound_ms", "p50_ms", "ratio", "gmacs", "classes", "summary"}``:
        ``ratio`` is measured / bound; ``classes`` maps each class to ``{"ops", "macs",
        "arithmetic", "bound_ms", "ms", "share", "gmacs", "ratio"}``; ``summary`` is one line
        saying where the time goes.
    """
    cores = _cores(threads)
    classes = {}
    for kind in CLASSES:
        mine = [c for c in costs if c.kind == kind]
        if not mine:
            continue
        arithmetic = sorted({c.arithmetic for c in mine if c.macs})
        classes[kind] = {
            "ops": len(mine),
            "macs": sum(c.macs for c in mine),
            "arithmetic": "+".join(arithmetic) or "-",
            "bound_ms": bound_ms(mine, peaks, threads) if kind != OTHER else 0.0,
        }
    timed = op_ms is not None and any(t is not None for t in op_ms)
    if timed:
        alone = {k: sum(t or 0.0 for c, t in zip(costs, op_ms) if c.kind == k) for k in classes}
        total_alone = sum(alone.values())
        for kind, row in classes.items():
            share = alone[kind] / total_alone if total_alone else None
            row["share"] = share
            row["ms"] = share * p50_ms if share is not None and p50_ms else None
            row["gmacs"] = row["macs"] / row["ms"] / 1e6 if row["ms"] and row["macs"] else None
            row["ratio"] = row["ms"] / row["bound_ms"] if row["ms"] and row["bound_ms"] else None
    bound = bound_ms(costs, peaks, threads)
    macs = sum(c.macs for c in costs)
    return {
        "threads": threads,
        "cores": cores,
        "macs": macs,
        "bound_ms": bound,
        "p50_ms": p50_ms,
        "ratio": p50_ms / bound if p50_ms and bound else None,
        "gmacs": macs / p50_ms / 1e6 if p50_ms else None,
        "classes": classes,
        "summary": summary(classes, peaks) if timed else "",
    }


def summary(classes: dict, peaks: dict) -> str:
    """One line saying where the time goes: each class's share, its ratio to its bound and rate.

    E.g. ``time: conv/FC 56% (3.3x its bound; 114 of 373 GMAC/s int8), depthwise 41% (7.6x; 12 of
    89 GMAC/s: XNNPACK's x86 int8 depthwise runs at the fp32 rate), elementwise/other 3%``.
    """
    rows = sorted(
        ((k, r) for k, r in classes.items() if r.get("share") is not None),
        key=lambda kr: -kr[1]["share"],
    )
    parts = []
    for kind, row in rows:
        text = f"{kind} {row['share']:.0%}"
        if kind != OTHER:
            rate = "int8" if kind == CONV and row["arithmetic"] == "int8" else "fp32"
            peak = (peaks.get(rate) or {}).get("gmacs")
            ratio = f"{row['ratio']:.1f}x its bound" if row.get("ratio") else "bound unknown"
            gmacs = ""
            if row.get("gmacs") and "+" in row["arithmetic"]:  # mixed: no one peak to compare with
                gmacs = f"{row['gmacs']:.0f} GMAC/s"
            elif row.get("gmacs") and peak:
                gmacs = f"{row['gmacs']:.0f} of {peak:.0f} GMAC/s {rate}"
            why = ""
            if kind == DEPTHWISE and row["arithmetic"] == "int8":
                why = ": XNNPACK's x86 int8 depthwise runs at the fp32 rate"
            text += f" ({'; '.join(p for p in (ratio, gmacs) if p)}{why})"
        parts.append(text)
    return "time: " + ", ".join(parts) if parts else ""


def measure(
    content: bytes, latency: dict, *, peaks: dict | None = None, runs: int = 30, warmup: int = 5
) -> dict:
    """The roofline of every XNNPACK latency figure of one .tflite.

    Args:
        content: The .tflite flatbuffer.
        latency: Its latency figures by setting (``{"xnnpack/1t": {"p50_ms", "threads"}, ...}``).
        peaks: One core's peak rates (default :func:`tfopt.core.cpu.peaks`, measured once per machine).
        runs: Timed invokes of each op alone, at the first setting's thread count only.
        warmup: Untimed invokes of each op first.

    Returns:
        ``{setting: analyze(...)}`` for the ``xnnpack/*`` settings; the first one has per-class
        times. Empty when nothing was timed with XNNPACK.
    """
    from tfopt.core.cpu import peaks as measured_peaks
    from tfopt.export.ops import op_costs, time_alone

    keys = [k for k, v in latency.items() if k.startswith("xnnpack/") and v.get("p50_ms")]
    if not keys:
        return {}
    peaks = measured_peaks() if peaks is None else peaks
    costs = op_costs(content)
    out = {}
    for i, key in enumerate(keys):
        threads = int(latency[key].get("threads", 1))
        op_ms = time_alone(content, threads=threads, runs=runs, warmup=warmup) if i == 0 else None
        out[key] = analyze(
            costs, peaks, p50_ms=latency[key]["p50_ms"], op_ms=op_ms, threads=threads
        )
    return out
