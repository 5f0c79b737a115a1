"""What the report says, as a list of blocks that ``render`` turns into markdown and HTML alike.

A block is a dict with a ``type``: ``h1``/``h2``/``h3`` (``text``), ``p`` (``text``; ``**bold**`` and
```code``` inline), ``callout`` (``items``: paragraphs), ``list`` (``items``), ``table`` (``id``,
``header``, ``rows``, optional ``note``, ``row_classes``, ``numeric`` column flags), ``img``
(``key``, ``file``, ``alt``), ``pre`` (``text``, ``summary``: collapsed in HTML) and ``toc`` (HTML:
links to the sections).
"""

from __future__ import annotations

import json
import os

from tfopt.report import debugger as debugger_lib


def _pct(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _signed(v) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _kib(n) -> str:
    return "-" if n is None else f"{n / 1024:,.1f}"


def _us(v) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}")


def _int(v) -> str:
    return "-" if v is None else f"{int(v):,}"


def _mflops(v) -> str:
    return "-" if v is None else f"{v / 1e6:.2f}"


def _secs(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _table(id_: str, header, rows, note: str | None = None, row_classes=None, numeric=None) -> dict:
    return {
        "type": "table",
        "id": id_,
        "header": list(header),
        "rows": [list(r) for r in rows],
        "note": note,
        "row_classes": row_classes or [""] * len(rows),
        "numeric": numeric or [False] * len(header),
    }


def _summary(report: dict) -> list[dict]:
    from tfopt.report.select import tie_rule

    sel, b8 = report["selection"], report["b8"]
    by_name = {v["name"]: v for v in report["variants"]}
    items = []
    chosen = by_name.get(sel["chosen"]) if sel["chosen"] else None
    if chosen:
        items.append(
            f"**Chosen edge model: `{chosen['name']}`** ({chosen['technique']}, {chosen['arch']}): "
            f"{_pct(chosen['accuracy_pct'])}% test accuracy ({_signed(chosen['delta_pt'])} pt vs "
            f"`{report['baseline']}`), {_kib(chosen['size_bytes'])} KiB ({_kib(chosen['gzip_bytes'])} KiB "
            f"gzipped), p50 {_us(chosen['p50_us'])} us at 1 thread."
        )
    if chosen:
        rule = f"`{sel['rule']}`" if sel["rule"] else "no rule"
        items.append(
            f"Chosen by {rule}: {_objective_text(sel)} among the {len(sel['passing'])} .tflite variant(s) "
            f"satisfying it ({tie_rule(sel.get('objective', 'min:gzip_kb'))}; see Selection for why every "
            "other variant lost)."
        )
    else:
        items.append(sel["statement"])
    if chosen and chosen.get("file"):
        items.append(f"File to ship: `{chosen['file']}`.")
    if b8.get("trouble"):
        verdict = f"**Not ready to ship: {'; '.join(b8['trouble'])}.** No target is judged."
    else:
        verdict = {
            True: "**The chosen model meets every target.**",
            False: "**The chosen model misses at least one target.**",
            None: "**Not every figure could be computed.**",
        }[b8["passed"]]
    items.append(f"{verdict} The teacher as a float Keras model against the chosen edge model:")
    blocks = [{"type": "callout", "items": items}]
    rows = [
        [
            r["name"],
            "-" if r["value"] is None else f"{r['value']:.2f} {r['unit']}",
            r["target"],
            r["status"],
            r["detail"],
        ]
        for r in b8["rows"]
    ]
    blocks.append(
        _table(
            "b8",
            ["figure", "measured", "target", "status", "from"],
            rows,
            numeric=[False, True, False, False, False],
        )
    )
    stages = report["stages"]
    done = sum(1 for s in stages if s["status"] == "done")
    wall = report.get("wall_seconds")
    blocks.append(
        {
            "type": "p",
            "text": f"{done} of {len(stages)} stages done"
            + (f" in {_secs(wall)} s of wall time" if wall is not None else "")
            + f"; strategy `{report.get('strategy') or '?'}`; {len(report['variants'])} variants compared.",
        }
    )
    return blocks


def _variants(report: dict) -> list[dict]:
    variants = report["variants"]
    chosen = report["selection"]["chosen"]
    rows, classes = [], []
    for v in variants:
        gate = v.get("gate")
        rows.append(
            [
                v["name"],
                _pct(v["accuracy_pct"]),
                _signed(v["delta_pt"]),
                "(self)" if not v["tflite"] else _pct(v["agreement_pct"]),
                _int(v["params"]),
                _mflops(v["flops"]),
                _kib(v["size_bytes"]) + ("*" if not v["tflite"] else ""),
                _kib(v["gzip_bytes"]),
                _us(v["p50_us"]),
                _us(v["p95_us"]),
                _us(v.get("bound_us")),
                "-"
                if not v.get("bound_us") or not v["p50_us"]
                else f"{v['p50_us'] / v['bound_us']:.2f}x",
                _us(v["p50_us_2t"]),
                _us(v["p95_us_2t"]),
                "-" if not gate else ("pass" if gate.get("passed") else "FAIL"),
            ]
        )
        classes.append("chosen" if v["name"] == chosen else ("keras" if not v["tflite"] else ""))
    examples = sorted({v["examples"] for v in variants if v.get("examples")})
    note = (
        f"Accuracy: on {', '.join(map(str, examples)) or '?'} test examples, the same for every variant of a "
        f"model; Δ in points against `{report['baseline']}`; agreement: top-1 agreement with the variant's own "
        "Keras model. *Keras rows: size is the bytes of the float32 weights (no .tflite, no gzip); latency is "
        "`model(x, training=False)` in a `tf.function` with 1 or 2 TensorFlow intra-op threads. .tflite rows: "
        "LiteRT with the XNNPACK delegate, batch 1. FLOPs per example (multiply-add = 2). gate: the export's "
        "fidelity gate against the variant's Keras model. bound: the compute bound on the machine that measured "
        "the latency (see Roofline)."
    )
    header = [
        "variant",
        "acc %",
        "Δ pt",
        "agree %",
        "params",
        "MFLOPs",
        "size KiB",
        "gzip KiB",
        "p50 1t µs",
        "p95 1t µs",
        "bound 1t µs",
        "p50/bound",
        "p50 2t µs",
        "p95 2t µs",
        "gate",
    ]
    numeric = [False] + [True] * 13 + [False]
    if not any(v["p50_us_2t"] is not None or v["p95_us_2t"] is not None for v in variants):
        keep = [
            i for i, h in enumerate(header) if "2t" not in h
        ]  # one thread measured: no empty columns
        header, numeric = [header[i] for i in keep], [numeric[i] for i in keep]
        rows = [[r[i] for i in keep] for r in rows]
        note += " Latency was measured at 1 thread only."
    notes = [f"`{v['name']}`: {n}" for v in variants for n in v.get("notes", [])]
    out = [
        {"type": "h2", "text": "Variants"},
        _table("variants", header, rows, note, classes, numeric),
    ]
    if notes:
        out.append({"type": "list", "items": notes})
    return out


def _pareto(report: dict) -> list[dict]:
    out = [{"type": "h2", "text": "Pareto frontiers"}]
    if "pareto" in report["paths"]["images"]:
        out.append(
            {
                "type": "img",
                "key": "pareto",
                "file": os.path.basename(report["paths"]["images"]["pareto"]),
                "alt": "accuracy vs gzip size and vs p50 latency, frontier dashed, chosen variant starred",
            }
        )
    fronts = report["pareto"]
    out.append(
        {
            "type": "p",
            "text": "Not beaten on both accuracy and download size: "
            + (", ".join(f"`{n}`" for n in fronts["gzip_bytes"]) or "none")
            + ". On both accuracy and p50 "
            "latency (1 thread): "
            + (", ".join(f"`{n}`" for n in fronts["p50_us"]) or "none")
            + ".",
        }
    )
    return out


def _objective_text(sel: dict) -> str:
    from tfopt.report.select import KEYS

    direction, _, key = sel.get("objective", "min:gzip_kb").partition(":")
    return f"the {'lowest' if direction == 'min' else 'highest'} {KEYS[key][0]}"


def _selection(report: dict) -> list[dict]:
    from tfopt.report.select import tie_rule

    sel = report["selection"]
    rule = f"`{sel['rule']}`" if sel["rule"] else "none"
    out = [
        {"type": "h2", "text": "Selection"},
        {
            "type": "p",
            "text": f"Rule: {rule}. Among the .tflite variants satisfying every constraint, "
            f"{_objective_text(sel)} wins ({tie_rule(sel.get('objective', 'min:gzip_kb'))}).",
        },
        {"type": "p", "text": sel["statement"]},
    ]
    rows, classes = [], []
    if sel["chosen"]:
        rows.append([sel["chosen"], "chosen"])
        classes.append("chosen")
    for name, why in sel["rejected"].items():
        rows.append([name, why])
        classes.append("")
    out.append(_table("selection", ["variant", "verdict"], rows, row_classes=classes))
    return out


def _training(report: dict) -> list[dict]:
    out = [{"type": "h2", "text": "Stages and training"}]
    if "training" in report["paths"]["images"]:
        out.append(
            {
                "type": "img",
                "key": "training",
                "file": os.path.basename(report["paths"]["images"]["training"]),
                "alt": "training and validation loss and accuracy per epoch of every training stage",
            }
        )
    rows = [
        [
            s["name"],
            s["kind"],
            s["status"],
            _secs(s["seconds"]),
            _int(s.get("epochs")),
            _int(s.get("examples_per_sec")),
            "-" if s.get("test_accuracy") is None else _pct(100 * s["test_accuracy"]),
            s.get("strategy") or "-",
        ]
        for s in report["stages"]
    ]
    out.append(
        _table(
            "stages",
            ["stage", "kind", "status", "wall s", "epochs", "examples/s", "test acc %", "strategy"],
            rows,
            "Test accuracy as each training stage measured it on its whole test split (the variants table "
            "scores the exports' test examples).",
            numeric=[False] * 3 + [True] * 4 + [False],
        )
    )
    return out


def _probe(report: dict) -> list[dict]:
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
            f"{_secs(p.get('step_ms_real'))} ms ({p.get('train_examples_per_sec', 0):,.0f} examples/s)",
        ],
        [
            "training step, synthetic input (one cached batch)",
            f"{_secs(p.get('step_ms_synthetic'))} ms",
        ],
        ["input-bound fraction", "-" if frac is None else f"{100 * frac:.1f}%"],
        ["batch, timed steps", f"{p.get('batch', '-')}, {p.get('steps', '-')}"],
    ]
    out.append(
        _table(
            "probe",
            ["measure", "value"],
            rows,
            f"The teacher's training step on {p.get('device', '?')}; input-bound fraction = "
            "max(0, 1 - synthetic / real).",
        )
    )
    return out


def _debugger(report: dict) -> list[dict]:
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
            else f"agreement {_pct(100 * f['test_agreement'])}%, accuracy {_pct(100 * f['test_accuracy'])}%, gate "
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
                _kib(t["size_bytes"]),
                "-" if t["accuracy"] is None else _pct(100 * t["accuracy"]),
                "-" if t["agreement"] is None else _pct(100 * t["agreement"]),
                "-" if not t["gate"] else ("pass" if t["gate"]["passed"] else "FAIL"),
            ]
            for t in f["trials"]
        ]
        split = f.get("search_split") or "search"
        out.append(
            _table(
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
            _table(
                "debugger",
                ["layer", "op", "RMSE / scale", "MSE", "scale", "kept in float"],
                rows,
                f"The {len(rows)} worst of {f['ranked_tensors']} tensors (all in report.json).",
                numeric=[False, False, True, True, True, False],
            )
        )
    return out


def _ops(report: dict) -> list[dict]:
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
            f"{_int(a['model_bytes'])} bytes: {counts}.",
        }
    )
    rows = [
        [str(o["index"]), o["op"], o["output"], o["shape"], o["type"], ", ".join(o["input_types"])]
        for o in a["ops"]
    ]
    out.append(_table("ops", ["#", "op", "output tensor", "shape", "type", "input types"], rows))
    out.append({"type": "pre", "summary": "the analyzer's full output", "text": a["text"]})
    return out


def _roofline(report: dict) -> list[dict]:
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
                    _us(c["ms"] * 1e3 if c.get("ms") is not None else None),
                    "-" if c.get("gmacs") is None else f"{c['gmacs']:.1f}",
                    _us(c["bound_ms"] * 1e3 if c.get("bound_ms") else None),
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
        _table("roofline", header, rows, note, None, numeric),
        {"type": "list", "items": lines},
    ]


def _environment(report: dict) -> list[dict]:
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
        _table("environment", ["what", "value"], rows, note),
        {
            "type": "pre",
            "summary": f"all {len(cpu.get('flags', []))} CPU flags",
            "text": " ".join(cpu.get("flags", [])),
        },
    ]


def blocks(report: dict) -> list[dict]:
    """The report's content, top to bottom: summary, variants, Pareto, selection, training, input
    pipeline, quantization debugger, ops of the chosen model, environment, config, warnings."""
    title = f"{report.get('pipeline') or 'pipeline'}: pipeline report"
    out = [
        {"type": "h1", "text": title},
        {
            "type": "p",
            "text": f"Variant `{report.get('variant')}` of `{report.get('pipeline_file') or '?'}`; run "
            f"`{report['run_dir']}`; report built {report['generated']}.",
        },
    ]
    out += _summary(report)
    out.append({"type": "toc"})  # HTML: links to every section (markdown viewers make their own)
    out += _variants(report)
    out += _pareto(report)
    out += _selection(report)
    out += _training(report)
    out += _probe(report)
    out += _debugger(report)
    out += _ops(report)
    out += _roofline(report)
    out += _environment(report)
    out += [
        {"type": "h2", "text": "Resolved config"},
        {
            "type": "pre",
            "summary": "the pipeline's config as the runner resolved it",
            "text": json.dumps(report.get("config"), indent=2),
        },
    ]
    if report["warnings"]:
        out += [{"type": "h2", "text": "Warnings"}, {"type": "list", "items": report["warnings"]}]
    out.append(
        {
            "type": "p",
            "text": f"Machine-readable: `report.json`. Compare the variants in TensorBoard's HParams "
            f"dashboard: `tensorboard --logdir {report['hparams']['dir']}`.",
        }
    )
    return out
