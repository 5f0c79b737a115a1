"""The export table (printed and stored as markdown) and the size / latency / accuracy plot."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

from tfopt.core.fileio import write_bytes
from tfopt.core.tables import markdown_table


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f} KiB"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def latency_keys(rows: Sequence[dict]) -> list[str]:
    """The latency settings measured (e.g. ``xnnpack/1t``), in first-seen order."""
    keys: list[str] = []
    for row in rows:
        for key in row.get("latency", {}):
            if key not in keys:
                keys.append(key)
    return keys


def _roofline_key(rows: Sequence[dict]) -> str | None:
    """The first latency setting that has a roofline (e.g. ``xnnpack/1t``)."""
    return next((k for row in rows for k in (row.get("roofline") or {})), None)


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _bound_cells(row: dict, key: str) -> list[str]:
    r = (row.get("roofline") or {}).get(key) or {}
    return [_ms(r.get("bound_ms")), _ratio(r.get("ratio"))]


def roofline_table(rows: Sequence[dict]) -> str:
    """Per model and kernel class: multiply-adds, time, GMAC/s achieved, compute bound, measured/bound.

    The class times come from each op timed alone, scaled to the model's p50
    (:mod:`tfopt.export.roofline`); the last column is the one line saying where the time goes.
    """
    key = _roofline_key(rows)
    if key is None:
        return ""
    header = ["mode", "class", "ops", "MMACs", "arithmetic", f"{key} ms", "share", "GMAC/s"]
    header += ["bound ms", "measured/bound"]
    body = []
    for row in rows:
        r = (row.get("roofline") or {}).get(key)
        if not r:
            continue
        body.append(
            [
                row["mode"],
                "whole model",
                sum(c["ops"] for c in r["classes"].values()),
                f"{r['macs'] / 1e6:.2f}",
                "",
                _ms(r["p50_ms"]),
                "100%",
                "-" if r.get("gmacs") is None else f"{r['gmacs']:.1f}",
                _ms(r["bound_ms"]),
                _ratio(r["ratio"]),
            ]
        )
        for kind, c in r["classes"].items():
            body.append(
                [
                    "",
                    kind,
                    c["ops"],
                    f"{c['macs'] / 1e6:.2f}",
                    c["arithmetic"],
                    _ms(c.get("ms")),
                    "-" if c.get("share") is None else f"{c['share']:.0%}",
                    "-" if c.get("gmacs") is None else f"{c['gmacs']:.1f}",
                    _ms(c["bound_ms"]),
                    _ratio(c.get("ratio")),
                ]
            )
    lines = [
        f"- {row['mode']}: {row['roofline'][key]['summary']}"
        for row in rows
        if (row.get("roofline") or {}).get(key, {}).get("summary")
    ]
    return markdown_table(header, body) + ("\n\n" + "\n".join(lines) if lines else "")


# The faster choice to name when a mode times slower than float32.
_INSTEAD = {
    "dynamic": "dynamic_auto",
    "dynamic_selective": "dynamic_auto",
    "int16x8": "int8",
    "int4_weights": "int8_weights",
}
# Measured ratio over float32 above which a mode is called slower (beyond timing noise).
SLOWER = 1.10


def slower_than_float(
    rows: Sequence[dict], host: str = "this CPU", int8_dot: bool = True
) -> list[str]:
    """One line per mode that times slower than float32 at the same setting, beyond the noise.

    A mode is called slower when its p50 is over :data:`SLOWER` times float32's and every timing
    round of it was slower than every round of float32 (:func:`rounds.measurable`); a ratio inside
    the rounds' spread is said as "no measurable difference". Each line names the ratio, the
    setting and the CPU it was measured on, and the faster alternative (its ratio too when it was
    exported; float32 when the usual alternative measured no faster), e.g. ``dynamic is 2.70x
    slower than float32 (p50 xnnpack/1t on x86-64 AVX2, no VNNI); use dynamic_auto (0.61x)
    ...``. On a CPU without integer dot-product instructions, a quantized mode's line says that
    its speed on the target may differ instead of advising float32.

    Args:
        rows: The export's rows.
        host: The CPU the figures were measured on (``cpu.host_words``).
        int8_dot: Whether that CPU has integer dot-product instructions (``cpu.has_int8_dot``).
    """
    from tfopt.export.rounds import measurable

    by_mode = {r["mode"]: r for r in rows}
    base = by_mode.get("float32")
    if base is None:
        return []
    key = next((k for k in base.get("latency", {}) if k.startswith("xnnpack/")), None)
    reference = ((base.get("latency") or {}).get(key) or {}).get("p50_ms")
    if not reference:
        return []

    def figure(mode: str) -> dict:
        return ((by_mode.get(mode, {}).get("latency") or {}).get(key)) or {}

    def ratio(mode: str) -> float | None:
        p50 = figure(mode).get("p50_ms")
        return p50 / reference if p50 else None

    lines = []
    for row in rows:
        r = ratio(row["mode"])
        if row["mode"] == "float32" or r is None or r <= SLOWER:
            continue
        where = f"p50 {key} on {host}"
        spread = figure(row["mode"]).get("round_p50_ms"), figure("float32").get("round_p50_ms")
        if all(spread) and not measurable(*spread):
            lines.append(
                f"{row['mode']} vs float32: no measurable difference ({where}: {r:.2f}x, inside "
                "the spread of the timing rounds)"
            )
            continue
        instead = _INSTEAD.get(row["mode"], "float32")
        if (ratio(instead) or 0.0) >= r:  # measured, and no faster: float32 is the faster choice
            instead = "float32"
        builtin = [
            op for op in (row.get("kernels") or {}).get("builtin_kernel_ops", []) if op != "SOFTMAX"
        ]
        why = (
            f"{', '.join(builtin[:4])}{' ...' if len(builtin) > 4 else ''} run on LiteRT's builtin "
            "kernels, not XNNPACK"
            if builtin
            else "its kernels are slower on this CPU"
        )
        alt = ratio(instead)
        alt_text = f" ({alt:.2f}x)" if alt and instead != "float32" else ""
        advice = f"use {instead}{alt_text} for speed"
        if not int8_dot and row["mode"] not in ("float16",) and not builtin:
            advice = (
                "this CPU lacks integer dot-product instructions: on a phone with them (ARM "
                "dotprod) int8 speed may differ; time it there (--device adb)"
            )
        lines.append(f"{row['mode']} is {r:.2f}x slower than float32 ({where}): {why}; {advice}")
    return lines


def fastest_runtime(row: dict) -> str:
    """Which runtime setting gave the lowest p50 at each thread count, when several were timed.

    E.g. ``fastest runtime: 1t compiled 0.769 ms (xnnpack 0.774, latest 0.741)``; empty when
    one runtime was timed.
    """
    by_threads: dict[str, dict[str, float]] = {}
    for key, value in (row.get("latency") or {}).items():
        name, _, threads = key.partition("/")
        if name in ("builtin", "litert-benchmark", "device") or not value.get("p50_ms"):
            continue
        by_threads.setdefault(threads, {})[name] = value["p50_ms"]
    parts = []
    for threads, p50s in by_threads.items():
        if len(p50s) < 2:
            continue
        best = min(p50s, key=p50s.get)
        others = ", ".join(f"{k} {v:.3f}" for k, v in p50s.items() if k != best)
        parts.append(f"{threads} {best} {p50s[best]:.3f} ms ({others})")
    return "fastest runtime: " + "; ".join(parts) if parts else ""


def export_table(rows: Sequence[dict]) -> str:
    """One line per exported model: mode, size, gzip size, p50/p95 per setting, accuracy, delta, agreement."""
    keys = latency_keys(rows)
    first = _roofline_key(rows)
    header = [
        "mode",
        "io",
        "size",
        "gzip",
        *[f"{p} {k} ms" for k in keys for p in ("p50", "p95")],
        *([f"bound {first} ms", "p50/bound"] if first else []),
        "accuracy",
        "Δ vs Keras (pt)",
        "agreement",
        "max |Δ|",
        "gate",
    ]
    body = []
    for row in rows:
        ev = row.get("eval") or {}
        lat = row.get("latency", {})
        gate = row.get("gate")
        body.append(
            [
                row["mode"],
                row.get("io", "float"),
                _kib(row.get("size_bytes")),
                _kib(row.get("gzip_bytes")),
                *[_ms((lat.get(k) or {}).get(p)) for k in keys for p in ("p50_ms", "p95_ms")],
                *(_bound_cells(row, first) if first else []),
                _pct(ev.get("accuracy")),
                _signed(ev.get("accuracy_delta_pt")),
                _pct(ev.get("agreement")),
                "-" if ev.get("max_abs_error") is None else f"{ev['max_abs_error']:.4f}",
                "-" if gate is None else ("pass" if gate["passed"] else "FAIL"),
            ]
        )
    return markdown_table(header, body)


def compact_table(rows: Sequence[dict]) -> str:
    """The table ``tfopt export`` prints: one short line per model, within 100 columns.

    Mode, I/O, size, p50 at the first latency setting (and on the phone, when ``--device`` timed
    there) and its bound ratio, accuracy, its change
    against Keras, top-1 agreement and the gate; :func:`export_table` (``export.md``,
    ``--wide``) has every setting, p95, gzip size and the largest output difference.
    """
    keys = latency_keys(rows)
    first = keys[0] if keys else None
    phone = "device/1t" if "device/1t" in keys else None  # timed on the phone too (--device)
    roof = _roofline_key(rows)
    header = ["mode", "io", "size", *([f"p50 {first} ms"] if first else [])]
    header += [f"p50 {phone} ms"] if phone else []
    header += [*(["p50/bound"] if roof else []), "accuracy", "Δ pt", "agree", "gate"]
    body = []
    for row in rows:
        ev = row.get("eval") or {}
        gate = row.get("gate")
        p50 = ((row.get("latency") or {}).get(first) or {}).get("p50_ms") if first else None
        body.append(
            [
                row["mode"],
                row.get("io", "float"),
                _kib(row.get("size_bytes")),
                *([_ms(p50)] if first else []),
                *(
                    [_ms(((row.get("latency") or {}).get(phone) or {}).get("p50_ms"))]
                    if phone
                    else []
                ),
                *([_bound_cells(row, roof)[1]] if roof else []),
                _pct(ev.get("accuracy")),
                _signed(ev.get("accuracy_delta_pt")),
                _pct(ev.get("agreement")),
                "-" if gate is None else ("pass" if gate["passed"] else "FAIL"),
            ]
        )
    return markdown_table(header, body)


def plot(rows: Sequence[dict], path: str, title: str = "") -> str | None:
    """Saves a PNG with size, p50 latency and accuracy per mode side by side; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    keys = latency_keys(rows)
    names = [r["mode"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].bar(names, [r["size_bytes"] / 1024 for r in rows], color="tab:blue", label="file")
    axes[0].bar(
        names, [r["gzip_bytes"] / 1024 for r in rows], color="tab:cyan", width=0.4, label="gzip"
    )
    axes[0].set_ylabel("KiB")
    axes[0].set_title("size")
    axes[0].legend()
    width = 0.8 / max(1, len(keys))
    for i, key in enumerate(keys):
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(rows))]
        axes[1].bar(
            xs,
            [((r.get("latency", {}).get(key) or {}).get("p50_ms") or 0) for r in rows],
            width=width,
            label=key,
        )
    axes[1].set_xticks(range(len(rows)), names)
    axes[1].set_ylabel("ms (batch 1)")
    axes[1].set_yscale("log")
    axes[1].set_title("p50 latency")
    if keys:
        axes[1].legend(fontsize=8)
    accs = [100 * ((r.get("eval") or {}).get("accuracy") or 0) for r in rows]
    axes[2].bar(names, accs, color="tab:green")
    keras_acc = next(
        (
            (r.get("eval") or {}).get("keras_accuracy")
            for r in rows
            if (r.get("eval") or {}).get("keras_accuracy") is not None
        ),
        None,
    )
    if keras_acc is not None:
        axes[2].axhline(100 * keras_acc, color="k", ls="--", lw=1, label="Keras")
        axes[2].legend()
    low = min(accs + ([100 * keras_acc] if keras_acc is not None else [])) if accs else 0
    axes[2].set_ylim(max(0, low - 2), 100)
    axes[2].set_ylabel("%")
    axes[2].set_title("test accuracy")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_bytes(path, buf.getvalue())
    return os.path.basename(path)
