"""Benchmark B7's numbers (pure functions of a process report), figures and report."""

from __future__ import annotations

from bench._common import (
    figure,
    markdown_table,
    median,
)
from bench._overhead_params import TARGET_PCT, Params

# ============================================================================================
# Numbers (pure functions of a process report; the test recomputes them independently)
# ============================================================================================


def step_ms(r: dict) -> float:
    """Per-step time after the warm-up epoch: each later epoch from its begin to its last step, summed,
    over their steps (ms)."""
    spans = [end - begin for begin, end in zip(r["epoch_begin_s"][1:], r["last_step_end_s"][1:])]
    return 1e3 * sum(spans) / sum(r["steps"][1:])


def cycle_ms(r: dict) -> float:
    """Epoch cycle per step after the warm-up epoch: from the second epoch's begin to the end of
    training (steps and every epoch-end task), over the same steps (ms)."""
    return 1e3 * (r["train_end_s"] - r["epoch_begin_s"][1]) / sum(r["steps"][1:])


def examples_per_sec(r: dict) -> float:
    """Training examples per second over the per-step window."""
    return 1e3 * r["global_batch_size"] / step_ms(r)


def pct(a: float, b: float) -> float:
    """How much slower ``a`` is than ``b``, in % (negative: faster)."""
    return 100.0 * (a / b - 1.0)


def _cells(runs: list[dict], prec: str, strat: str) -> list[dict]:
    return sorted(
        (x for x in runs if x["precision"] == prec and x["strategy"] == strat),
        key=lambda x: x["repeat"],
    )


def figures(runs: list[dict], p: Params) -> list[dict]:
    """The published figures, each from its repeats' raw per-step times."""
    out = []
    for prec, strat, sides in p.cells:
        cell = _cells(runs, prec, strat)
        ms = {s: [x[s]["step_ms"] for x in cell] for s in sides}
        eps = {s: median(x[s]["examples_per_sec"] for x in cell) for s in sides}
        t, bt = ms["tfopt"], ms["bare_tuned"]
        spe = cell[0]["bare_tuned"]["steps_per_execution"]
        out.append(
            figure(
                f"tfopt vs tuned bare fit, per-step time, {strat}, {prec} (% slower)",
                [pct(a, b) for a, b in zip(t, bt)],
                "%",
                target=("<=", TARGET_PCT),
                peer=f"bare fit, steps_per_execution {spe}: {eps['bare_tuned']:,.0f} ex/s",
                detail=f"tfopt {median(t):.2f} vs {median(bt):.2f} ms/step ({eps['tfopt']:,.0f} ex/s)",
            )
        )
        if "bare_default" in sides:
            bd = ms["bare_default"]
            out.append(
                figure(
                    f"(info) tfopt vs bare fit with Keras defaults, per-step time, {strat}, {prec} (% slower)",
                    [pct(a, b) for a, b in zip(t, bd)],
                    "%",
                    peer=f"bare fit, defaults: {eps['bare_default']:,.0f} ex/s",
                    detail=f"tfopt {median(t):.2f} vs {median(bd):.2f} ms/step",
                )
            )
        ct, cb = ([x[s]["cycle_ms"] for x in cell] for s in ("tfopt", "bare_tuned"))
        out.append(
            figure(
                f"(info) tfopt vs tuned bare fit, epoch cycle incl. validation and epoch-end work, {strat}, {prec} "
                "(% slower)",
                [pct(a, b) for a, b in zip(ct, cb)],
                "%",
                detail=f"tfopt {median(ct):.2f} vs {median(cb):.2f} ms/step",
            )
        )
    for prec in dict.fromkeys(c[0] for c in p.cells):
        one, mir = _cells(runs, prec, "one_device"), _cells(runs, prec, "mirrored")
        if one and mir:
            ratios = [
                b["tfopt"]["examples_per_sec"] / a["tfopt"]["examples_per_sec"]
                for a, b in zip(one, mir)
            ]
            out.append(
                figure(
                    f"(info) tfopt mirrored (2 logical CPU devices) / one_device throughput, {prec}",
                    ratios,
                    "x",
                    detail=f"{median(x['tfopt']['examples_per_sec'] for x in mir):,.0f} vs "
                    f"{median(x['tfopt']['examples_per_sec'] for x in one):,.0f} ex/s",
                    digits=3,
                )
            )
    return out


def report_text(res: dict, p: Params) -> str:
    rows = []
    for f in res["figures"]:
        spread = (
            f"{f['spread'][0]:.{f['digits']}f} to {f['spread'][1]:.{f['digits']}f}"
            if f["spread"]
            else "-"
        )
        value = "-" if f["value"] is None else f"{f['value']:.{f['digits']}f}{f['unit']}"
        rows.append(
            [
                f["name"],
                value,
                spread,
                f["target"] or "-",
                f["status"],
                "; ".join(x for x in (f["peer"], f["detail"]) if x),
            ]
        )
    table = markdown_table(
        ["B7 framework overhead", f"median of {p.repeats}", "range", "target", "status", "detail"],
        rows,
    )
    env, q = res["environment"], res["quiet_gate"]
    notes = []
    if p.smoke:
        notes.append("SMOKE MODE: tiny data, one repeat; these figures mean nothing.")
    notes.append(
        f"{env['processor']}, {env['usable_cores']} usable cores, TF {env.get('tensorflow')}; "
        f"`{p.model}`, MNIST ({p.limit or '50,000'} train images), global batch {p.batch}, "
        f"{p.epochs} epochs (the first is warm-up); sides interleaved, each in its own process."
    )
    notes.append(
        f"Shared machine: {q['reruns']} re-runs, {q['kept_disturbed_units']} of {q['units']} repeats kept "
        f"disturbed; foreign load in kept windows: median {100 * q['kept_foreign_load_median']:.0f}%."
    )
    return table + "\n\n" + "\n".join("- " + n for n in notes)
