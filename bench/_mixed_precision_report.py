"""Benchmark B2's figures, verdicts and markdown report."""

from __future__ import annotations

from _common import (
    figure,
    markdown_table,
    median,
)
from _mixed_precision_params import (
    ACCURACY_POLICIES,
    ANCHOR,
    CONV_HEAVY,
    MIN_SEEDS,
    TARGETS,
    TRAINED,
)


def rotated(items: list, k: int) -> list:
    """``items`` rotated left by ``k``: each repeat starts with another side."""
    k %= len(items)
    return items[k:] + items[:k]


def ratios(runs: list[dict]) -> dict:
    """One throughput repeat of one model: the published ratios from its runs' step times."""
    by = {(r["side"], r["policy"]): r for r in runs}
    t32, tbf, tau = by["tfopt", "float32"], by["tfopt", "mixed_bfloat16"], by["tfopt", "auto"]
    p32, pbf = by["peer", "float32"], by["peer", "mixed_bfloat16"]
    return {
        "tfopt_bf16_speedup": t32["step_ms"] / tbf["step_ms"],
        "peer_bf16_speedup": p32["step_ms"] / pbf["step_ms"],
        "auto_vs_float32": t32["step_ms"] / tau["step_ms"],
        "auto_chose": tau["resolved"],
        "auto_probe_seconds": tau["probe"]["seconds"],
    }


def delta_pt(runs: list[dict]) -> float:
    """One seed of one model: bf16's test accuracy minus float32's, in points (signed)."""
    by = {r["policy"]: r["test_accuracy"] for r in runs}
    return 100 * (by["mixed_bfloat16"] - by["float32"])


def cpu_bf16(flags: list[str]) -> dict:
    """What the CPU offers for bfloat16 (the verdict of the 2x target depends on AMX)."""
    have = set(flags)
    return {
        "avx512_bf16": "avx512_bf16" in have,
        "amx_bf16": "amx_bf16" in have,
        "amx_tile": "amx_tile" in have,
        "avx512f": "avx512f" in have,
    }


def figures(res: dict) -> list[dict]:
    """The published B2 figures: throughput ratios (one value per repeat), accuracy gaps (one per seed)."""
    out = []
    for plan in res["params"]["models"]:
        out += _throughput_figures(
            plan["name"], res["per_model"][plan["name"]]["repeats"], res["cpu_bf16"]["amx_bf16"]
        )
    for plan in res["params"]["accuracy"]:
        out.append(_accuracy_figure(plan, res["accuracy"][plan["name"]]["seeds"]))
    return out


def _throughput_figures(model: str, reps: list[dict], amx: bool) -> list[dict]:
    rs = [x["ratios"] for x in reps]
    peer_speed = median(r["peer_bf16_speedup"] for r in rs)
    target = TARGETS["bf16_speedup_amx"] if model == CONV_HEAVY else None
    speed = dict(
        key=f"bf16_speedup_{model}",
        **figure(
            f"bf16 / float32 training throughput, {model}",
            [r["tfopt_bf16_speedup"] for r in rs],
            "x",
            target=target,
            peer=f"guide recipe: {peer_speed:.2f}x",
            anchor=ANCHOR,
            detail=_detail(reps, "float32", "mixed_bfloat16"),
        ),
    )
    if target is not None and not amx:
        speed["status"] = "n/a without AMX"
    chose = sorted({r["auto_chose"] for r in rs})
    auto = dict(
        key=f"auto_vs_float32_{model}",
        **figure(
            f"auto / float32 training throughput, {model}",
            [r["auto_vs_float32"] for r in rs],
            "x",
            target=TARGETS["auto_vs_float32"],
            digits=3,
            peer=f"guide recipe's bf16 on this CPU: {peer_speed:.2f}x float32",
            detail=f"auto chose {', '.join(chose)}; probe {median(r['auto_probe_seconds'] for r in rs):.1f} s "
            "(not in the throughput); " + _detail(reps, "float32", "auto"),
        ),
    )
    return [speed, auto]


def _accuracy_figure(plan: dict, seeds: list[dict]) -> dict:
    model = plan["name"]
    acc = {pol: [_policy_run(s, pol)["test_accuracy"] for s in seeds] for pol in ACCURACY_POLICIES}
    f32 = median(acc["float32"])
    images = _policy_run(seeds[0], "float32")["test_images"]
    few = (
        ""
        if len(seeds) >= MIN_SEEDS
        else f" (only {len(seeds)}: bf16 without bf16 hardware is too slow here for more)"
    )
    f = dict(
        key=f"accuracy_pt_{model}",
        **figure(
            f"test accuracy gap |bf16 - float32|, {model}, same initial weights, data order and epochs",
            [abs(s["delta_pt"]) for s in seeds],
            "pt",
            target=TARGETS["accuracy_pt"],
            peer="guide recipe: not trained for accuracy (budget)",
            detail=f"test accuracy float32 {_pct(acc['float32'])}, bf16 {_pct(acc['mixed_bfloat16'])} after "
            f"{plan['epochs']} epochs of {plan['limit']} images (Adam {plan['learning_rate']:g} cosine, batch "
            f"{plan['batch']}; chosen on validation); {images} test images (1 image = {100 / images:.2f} pt); "
            f"{len(seeds)} seeds{few}, signed: "
            + ", ".join(f"{s['delta_pt']:+.2f}" for s in seeds),
        ),
    )
    if f32 < TRAINED:
        f["status"] = f"n/a: float32 at {100 * f32:.0f}% (judged from {100 * TRAINED:.0f}%)"
    return f


def _pct(values: list[float]) -> str:
    """Median (min-max) in percent."""
    return f"{100 * median(values):.2f}% ({100 * min(values):.2f}-{100 * max(values):.2f})"


def _policy_run(seed_entry: dict, policy: str) -> dict:
    return next(x for x in seed_entry["runs"] if x["policy"] == policy)


def _run(rep: dict, side: str, policy: str) -> dict:
    return next(x for x in rep["runs"] if (x["side"], x["policy"]) == (side, policy))


def _detail(reps: list[dict], a: str, b: str) -> str:
    def ms(policy):
        return median(_run(x, "tfopt", policy)["step_ms"] for x in reps)

    return f"{ms(a):.1f} vs {ms(b):.1f} ms/step ({a} vs {b})"


def targets(res: dict) -> dict:
    """Each judged target: its measured median, bar and verdict (the 2x target only with AMX)."""
    out = {}
    for f in res["figures"]:
        if f["op"] is None or f["status"].startswith("n/a"):
            continue
        out[f["key"]] = {
            "measured": f["value"],
            "op": f["op"],
            "value": f["bound"],
            "pass": None if f["value"] is None else f["status"] == "pass",
        }
    return out


def report(res: dict) -> str:
    """The printed table and notes."""
    rows = [
        [
            f["name"],
            "-" if f["value"] is None else f"{f['value']:.{f['digits']}f} {f['unit']}",
            "-"
            if not f["spread"]
            else f"{f['spread'][0]:.{f['digits']}f} to {f['spread'][1]:.{f['digits']}f}",
            f["repeats"],
            f["target"] or "-",
            f["status"],
            f["peer"] or "-",
        ]
        for f in res["figures"]
    ]
    p = res["params"]
    lines = [
        markdown_table(
            [
                "B2 mixed precision",
                "median",
                "range",
                "repeats/seeds",
                "target",
                "status",
                "peer, same run",
            ],
            rows,
        )
    ]
    cpu = res["cpu_bf16"]
    notes = [
        f"{res['lscpu']['model']}: avx512_bf16={cpu['avx512_bf16']}, amx_bf16={cpu['amx_bf16']}; "
        f"{res['environment']['usable_cores']} usable cores, TF {res['environment'].get('tensorflow')}.",
        "Throughput: MNIST slices (examples per split, epochs; the first epoch untimed): "
        + ", ".join(f"{m['name']} {m['limit']}, {m['epochs']}" for m in p["models"])
        + f"; batch {p['batch']}, one_device, seeds {p['seed']}..{p['seed'] + p['repeats'] - 1}; "
        "runs interleaved, order rotating.",
        "Accuracy (float32 vs bf16 from the same seed, initial weights and data order; test read once a run): "
        + "; ".join(
            f"{a['name']} {a['limit']} images x {a['epochs']} epochs, {a['seeds']} seeds"
            for a in p["accuracy"]
        )
        + ".",
    ]
    if p["smoke"]:
        notes.insert(0, "SMOKE MODE: tiny data, one repeat; these figures mean nothing.")
    q = res["quiet_gate"]
    notes.append(
        f"Shared machine: {q['reruns']} re-runs, {q['kept_disturbed_units']} of {q['units']} throughput "
        f"runs kept disturbed; foreign load median {100 * q['kept_foreign_load_median']:.0f}%."
    )
    return "\n".join(lines) + "\n\n" + "\n".join("- " + n for n in notes)
