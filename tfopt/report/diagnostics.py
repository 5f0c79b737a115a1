"""The report's diagnostic sections: the input-pipeline probe, the quantization debugger, the
chosen model's ops and their roofline, and the environment (blocks, see
:mod:`tfopt.report.content`)."""

from __future__ import annotations

from tfopt.report import debugger as debugger_lib
from tfopt.report.cells import kib, pct, secs, table, us, whole


def probe_blocks(report: dict) -> list[dict]:
    out = [{"type": "h2", "text": "Input pipeline"}]
    p = report.get("probe")
    if not p:
        out.append(
            {
                "type": "p",
                "text": "Input pipeline throughput: not measured (the pipeline ran without its probe).",
            }
        )
        return out
    frac = p.get("input_bound_fraction")
    rows = [
        ["input pipeline alone", f"{p.get('input_examples_per_sec', 0):,.0f} examples/s"],
        [
            "training step, real input",
            f"{secs(p.get('step_ms_real'))} ms ({p.get('train_examples_per_sec', 0):,.0f} examples/s)",
        ],
        [
            "training step, synthetic input (one cached batch)",
            f"{secs(p.get('step_ms_synthetic'))} ms",
        ],
        ["input-bound fraction", "-" if frac is None else f"{100 * frac:.1f}%"],
        ["batch, timed steps", f"{p.get('batch', '-')}, {p.get('steps', '-')}"],
    ]
    out.append(
        table(
            "probe",
            ["measure", "value"],
            rows,
            f"The teacher's training step on {p.get('device', '?')}; input-bound fraction = "
            "max(0, 1 - synthetic / real).",
        )
    )
    return out


def debugger_blocks(report: dict) -> list[dict]:
    out = [{"type": "h2", "text": "Quantization debugger"}]
    found = report["quantization_debugger"]
    if not found:
        out.append(
            {
                "type": "p",
                "text": "The int8 fidelity gate did not fire in any export: no per-layer "
                "quantization error table.",
            }
        )
        return out
    for f in found:
        why = "; ".join((f.get("int8_gate") or {}).get("reasons") or []) or "?"
        out.append({"type": "h3", "text": f"{f['model']}: {f['mode']}"})
        test_gate = f.get("test_gate") or {}
        test = (
            "-"
            if f.get("test_agreement") is None
            else f"agreement {pct(100 * f['test_agreement'])}%, accuracy {pct(100 * f['test_accuracy'])}%, gate "
            f"**{'pass' if test_gate.get('passed') else 'FAIL'}**"
        )
        out.append(
            {
                "type": "p",
                "text": f"int8 failed the gate ({why}). The debugger ranked {f['ranked_tensors']} "
                f"quantized tensors by RMSE / scale (about {debugger_lib.HEALTHY_RMSE_OVER_SCALE} for a healthy "
                f"layer) and the worst were left in float one more at a time, scored on "
                f"{f.get('search_examples') or '?'} {f.get('search_split') or ''} examples: the search "
                f"{'passed' if f['passed'] else 'did not pass'} with "
                f"{', '.join(f['float_layers']) or 'no layer'} in float. The chosen model "
                f"(`{f['model']}/{f['mode']}`) on {f.get('test_examples') or '?'} test examples: {test}.",
            }
        )
        rows = [
            [
                ", ".join(t["float_layers"]),
                kib(t["size_bytes"]),
                "-" if t["accuracy"] is None else pct(100 * t["accuracy"]),
                "-" if t["agreement"] is None else pct(100 * t["agreement"]),
                "-" if not t["gate"] else ("pass" if t["gate"]["passed"] else "FAIL"),
            ]
            for t in f["trials"]
        ]
        split = f.get("search_split") or "search"
        out.append(
            table(
                "debugger-trials",
                ["layers in float", "size KiB", f"acc % ({split})", f"agree % ({split})", "gate"],
                rows,
                row_classes=["chosen" if i == f["chosen_trial"] else "" for i in range(len(rows))],
                numeric=[False, True, True, True, False],
            )
        )
        rows = [
            [
                w["layer"],
                w["op"] or "-",
                "-" if w["rmse_over_scale"] is None else f"{w['rmse_over_scale']:.3f}",
                "-" if w["mse"] is None else f"{w['mse']:.3g}",
                "-" if w["scale"] is None else f"{w['scale']:.3g}",
                "yes" if w["in_float"] else "",
            ]
            for w in f["worst"]
        ]
        out.append(
            table(
                "debugger",
                ["layer", "op", "RMSE / scale", "MSE", "scale", "kept in float"],
                rows,
                f"The {len(rows)} worst of {f['ranked_tensors']} tensors (all in report.json).",
                numeric=[False, False, True, True, True, False],
            )
        )
    return out


def ops_blocks(report: dict) -> list[dict]:
    a = report.get("analyzer")
    chosen = report["selection"]["chosen"]
    out = [{"type": "h2", "text": "Chosen model's ops (TFLite analyzer)"}]
    if not a:
        out.append(
            {
                "type": "p",
                "text": "No model was chosen: no op list."
                if not chosen
                else f"The file of `{chosen}` was not found: no op list.",
            }
        )
        return out
    counts = ", ".join(f"{op} x{n}" for op, n in a["op_counts"].items())
    out.append(
        {
            "type": "p",
            "text": f"`{chosen}`: {len(a['ops'])} ops in {a['subgraphs']} subgraph(s), "
            f"{whole(a['model_bytes'])} bytes: {counts}.",
        }
    )
    rows = [
        [str(o["index"]), o["op"], o["output"], o["shape"], o["type"], ", ".join(o["input_types"])]
        for o in a["ops"]
    ]
    out.append(table("ops", ["#", "op", "output tensor", "shape", "type", "input types"], rows))
    out.append({"type": "pre", "summary": "the analyzer's full output", "text": a["text"]})
    return out


def roofline_blocks(report: dict) -> list[dict]:
    """Per .tflite variant and kernel class: time, GMAC/s, compute bound, and where the time goes."""
    variants = [v for v in report["variants"] if v.get("roofline")]
    if not variants:
        return []
    from tfopt.core.cpu import peak_summary

    rows, lines = [], []
    for v in variants:
        r = v["roofline"]
        for kind, c in r["classes"].items():
            rows.append(
                [
                    v["name"],
                    kind,
                    str(c["ops"]),
                    f"{c['macs'] / 1e6:.2f}",
                    c["arithmetic"],
                    us(c["ms"] * 1e3 if c.get("ms") is not None else None),
                    "-" if c.get("gmacs") is None else f"{c['gmacs']:.1f}",
                    us(c["bound_ms"] * 1e3 if c.get("bound_ms") else None),
                    "-" if c.get("ratio") is None else f"{c['ratio']:.2f}x",
                ]
            )
        if r.get("summary"):
            lines.append(f"`{v['name']}`: {r['summary']}")
    peaks = report.get("cpu_peaks")
    note = (
        (peak_summary(peaks) + ". " if peaks else "")
        + "The bound: each op's multiply-adds over that peak (int8 dot product for integer weights, "
        "fp32 FMA otherwise and for depthwise); class times: every op timed alone, scaled to the p50."
    )
    header = [
        "variant",
        "class",
        "ops",
        "MMACs",
        "arithmetic",
        "1t µs",
        "GMAC/s",
        "bound µs",
        "×bound",
    ]
    numeric = [False, False, True, True, False, True, True, True, True]
    return [
        {"type": "h2", "text": "Roofline"},
        table("roofline", header, rows, note, None, numeric),
        {"type": "list", "items": lines},
    ]


def environment_blocks(report: dict) -> list[dict]:
    env = report["environment"]
    cpu = env["cpu"]
    rows = [[k, v] for k, v in env["versions"].items()]
    strategy = env.get("strategy") or {}
    rows += [
        ["strategy", f"{strategy.get('name', '?')} ({strategy.get('num_replicas', '?')} replicas)"],
        ["platform", env["platform"]],
        ["CPU", cpu.get("model") or "?"],
        ["cores (usable / logical)", f"{cpu.get('usable_cores')} / {cpu.get('logical_cores')}"],
        ["SIMD flags", " ".join(cpu.get("simd", [])) or "-"],
    ]
    note = (
        "Versions from the stages' records"
        + (
            f"; differ between stages: {', '.join(env['versions_differ'])}"
            if env["versions_differ"]
            else ""
        )
        + f"; CPU from {cpu.get('source') or '?'} where the report was built."
    )
    return [
        {"type": "h2", "text": "Environment"},
        table("environment", ["what", "value"], rows, note),
        {
            "type": "pre",
            "summary": f"all {len(cpu.get('flags', []))} CPU flags",
            "text": " ".join(cpu.get("flags", [])),
        },
    ]
