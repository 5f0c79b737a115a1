"""What the report says, as a list of blocks that ``render`` turns into markdown and HTML alike.

A block is a dict with a ``type``: ``h1``/``h2``/``h3`` (``text``), ``p`` (``text``; ``**bold**`` and
```code``` inline), ``callout`` (``items``: paragraphs), ``list`` (``items``), ``table`` (``id``,
``header``, ``rows``, optional ``note``, ``row_classes``, ``numeric`` column flags), ``img``
(``key``, ``file``, ``alt``), ``pre`` (``text``, ``summary``: collapsed in HTML) and ``toc`` (HTML:
links to the sections). The diagnostic sections are :mod:`tfopt.report.diagnostics`; the cells'
formats and the table block, :mod:`tfopt.report.cells`.
"""

from __future__ import annotations

import json
import os

from tfopt.report.cells import kib, mflops, pct, secs, signed, table, us, whole
from tfopt.report.diagnostics import (
    debugger_blocks,
    environment_blocks,
    ops_blocks,
    probe_blocks,
    roofline_blocks,
)


def _summary(report: dict) -> list[dict]:
    from tfopt.report.select import tie_rule

    sel, b8 = report["selection"], report["b8"]
    by_name = {v["name"]: v for v in report["variants"]}
    items = []
    chosen = by_name.get(sel["chosen"]) if sel["chosen"] else None
    if chosen:
        items.append(
            f"**Chosen edge model: `{chosen['name']}`** ({chosen['technique']}, {chosen['arch']}): "
            f"{pct(chosen['accuracy_pct'])}% test accuracy ({signed(chosen['delta_pt'])} pt vs "
            f"`{report['baseline']}`), {kib(chosen['size_bytes'])} KiB ({kib(chosen['gzip_bytes'])} KiB "
            f"gzipped), p50 {us(chosen['p50_us'])} us at 1 thread."
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
        table(
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
            + (f" in {secs(wall)} s of wall time" if wall is not None else "")
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
                pct(v["accuracy_pct"]),
                signed(v["delta_pt"]),
                "(self)" if not v["tflite"] else pct(v["agreement_pct"]),
                whole(v["params"]),
                mflops(v["flops"]),
                kib(v["size_bytes"]) + ("*" if not v["tflite"] else ""),
                kib(v["gzip_bytes"]),
                us(v["p50_us"]),
                us(v["p95_us"]),
                us(v.get("bound_us")),
                "-"
                if not v.get("bound_us") or not v["p50_us"]
                else f"{v['p50_us'] / v['bound_us']:.2f}x",
                us(v["p50_us_2t"]),
                us(v["p95_us_2t"]),
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
        table("variants", header, rows, note, classes, numeric),
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
    out.append(table("selection", ["variant", "verdict"], rows, row_classes=classes))
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
            secs(s["seconds"]),
            whole(s.get("epochs")),
            whole(s.get("examples_per_sec")),
            "-" if s.get("test_accuracy") is None else pct(100 * s["test_accuracy"]),
            s.get("strategy") or "-",
        ]
        for s in report["stages"]
    ]
    out.append(
        table(
            "stages",
            ["stage", "kind", "status", "wall s", "epochs", "examples/s", "test acc %", "strategy"],
            rows,
            "Test accuracy as each training stage measured it on its whole test split (the variants table "
            "scores the exports' test examples).",
            numeric=[False] * 3 + [True] * 4 + [False],
        )
    )
    return out + _privacy(report) + _split(report)


def _privacy(report: dict) -> list[dict]:
    rows = [
        [
            s["name"],
            f"{p['epsilon_rdp']:.2f}",
            f"{p['epsilon_pld']:.2f}",
            f"{p['delta']:.1e}",
            f"{p['noise_multiplier']:.3f}",
            f"{p['l2_clip']:g}",
            whole(p["steps"]),
        ]
        for s in report["stages"]
        if (p := s.get("privacy"))
    ]
    if not rows:
        return []
    return [
        {"type": "h3", "text": "Differential privacy"},
        table(
            "privacy",
            [
                "stage",
                "epsilon (RDP)",
                "epsilon (PLD)",
                "delta",
                "noise multiplier",
                "clip",
                "steps",
            ],
            rows,
            "The budget each private stage spent, as dp-accounting computes it (RDP and PLD) for "
            "the stage's steps, noise and sampling (run.json: train.privacy).",
            numeric=[False] + [True] * 6,
        ),
    ]


def _split(report: dict) -> list[dict]:
    rows = []
    for s in report["stages"]:
        if not (split := s.get("pipeline")):
            continue
        measured = split.get("measured") or {}
        peaks = measured.get("stage_peak_bytes") or []
        rows.append(
            [
                s["name"],
                whole(len(split["stages"])),
                whole(split["microbatches"]),
                split["schedule"] + (" + remat" if split.get("remat") else ""),
                split["balanced_by"],
                " | ".join(f"{st['first']}..{st['last']}" for st in split["stages"]),
                "-" if "bubble_measured" not in measured else f"{measured['bubble_measured']:.2f}",
                f"{split['bubble_formula']:.2f}",
                "-" if not peaks else " / ".join(f"{b / 2**20:.1f}" for b in peaks),
                "-"
                if "unsplit_peak_bytes" not in measured
                else f"{measured['unsplit_peak_bytes'] / 2**20:.1f}",
            ]
        )
    if not rows:
        return []
    header = ["stage", "K", "M", "schedule", "balanced by", "layers per stage", "idle measured"]
    header += ["idle (K-1)/(M+K-1)", "peak MiB per stage", "unsplit peak MiB"]
    return [
        {"type": "h3", "text": "Pipeline parallelism"},
        table(
            "pipeline_split",
            header,
            rows,
            "Each pipelined stage's split and what it measured on a validation batch after training.",
            numeric=[False] + [True] * 2 + [False] * 3 + [True] * 4,
        ),
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
    out += probe_blocks(report)
    out += debugger_blocks(report)
    out += ops_blocks(report)
    out += roofline_blocks(report)
    out += environment_blocks(report)
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
