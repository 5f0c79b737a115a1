"""Benchmark B9q (the maintained quantization path): every PTQ mode made by the TFLite converter
and by LiteRT Quantizer (ai-edge-quantizer), side by side on the same trained models.

What it does, in one run on one machine (BENCHMARKS.md, row B9q):

1. Takes B5's ``cnn`` (MNIST) and B9's MobileNetV2 1.0 and 0.35 (Fashion-MNIST PNG folders at
   96x96 RGB), trained once by their own benchmarks' code and reused from the same work
   directories (``bench-b5``, ``bench-b9``).
2. Exports each with the library's export stage twice, ``--strip-strings``, same calibration
   batches: ``--quantizer converter`` (float32, dynamic, float16, int8, int16x8) and
   ``--quantizer litert`` (the same modes from the float32 file with LiteRT Quantizer's recipes,
   plus the modes only it makes: weight-only ``int8_weights`` and the latency-aware
   ``dynamic_auto``). Every file is scored on the same test images: accuracy and top-1
   agreement with the Keras model.
3. Latency at batch 1 with the LiteRT interpreter (XNNPACK) at 1 and 2 threads: ``--repeats``
   rounds, every file of both arms interleaved (order rotated) in every round, each round's
   ratio taken against the same round's float32.
4. Per mode both make: LiteRT Quantizer / converter p50 per round (> 1: LiteRT's slower), size
   and accuracy on the whole test split; the verdict ``litert``, ``converter`` or ``tie`` (more
   accurate beyond the standard error of the difference, else more faithful to the Keras model
   (top-1 agreement) beyond its standard error, else faster beyond the rounds' spread, else more
   than 1% smaller).

Writes ``bench/results/quantizers.json`` (figures via ``bench/_common.figure``).

    PYTHONPATH=. python bench/quantizers.py [--repeats 3] [--families cnn,mobilenetv2_1,mobilenetv2_0.35]
    PYTHONPATH=. python bench/quantizers.py --smoke     # cnn on an MNIST slice; used by a test
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tqdm import tqdm  # noqa: E402

from bench import edge_architecture as b9  # noqa: E402
from bench import tflite_ptq as b5  # noqa: E402
from bench._common import (  # noqa: E402
    QuietGate,
    figure,
    figures_table,
    interleaved_latency,
    markdown_table,
    median,
    publish,
    result,
    script_parser,
    speedups,
)
from tfopt import config as config_lib  # noqa: E402
from tfopt.export import (  # noqa: E402
    BenchSettings,
    ConvertOptions,  # noqa: E402
    ExportSettings,
)
from tfopt.export import run as export_run  # noqa: E402
from tfopt.runs import load_run  # noqa: E402

SETTINGS = (("xnnpack/1t", 1), ("xnnpack/2t", 2))
BOTH = ("dynamic", "float16", "int8", "int16x8")  # the modes both paths make
ARMS = {
    "converter": ("float32", *BOTH),
    "litert": ("float32", *BOTH, "int8_weights", "dynamic_auto"),
}
FAMILIES = ("cnn", "mobilenetv2_1", "mobilenetv2_0.35")
DYNAMIC_FAMILY = ("dynamic", "dynamic_auto", "int8_weights")
# BENCHMARKS.md B9q: every dynamic-family default no slower than float32 at 1 thread, >= 3x smaller.
TARGETS = {"dynamic_speedup_1t": (">=", 1.0), "dynamic_size_ratio": (">=", 3.0)}
COMMAND = "PYTHONPATH=. python bench/quantizers.py"


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    families: tuple = FAMILIES
    calibration_steps: int = 25
    eval_limit: int = 0  # test images every .tflite is scored on (0 = the whole test split)
    repeats: int = 3
    runs: int = 100
    warmup: int = 10
    smoke: bool = False


def parse_args(argv=None):
    ap = script_parser(
        __doc__,
        "quantizers",
        "cnn on an MNIST slice, few runs",
        gate=True,
        workdir=config_lib.default_data_dir(),
    )
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", type=int, default=100)
    a = ap.parse_args(argv)
    families = tuple(f.strip() for f in a.families.split(",") if f.strip())
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        ap.error(
            f"unknown family {', '.join(unknown) or a.families!r}; choose from "
            f"{', '.join(FAMILIES)} (--families)"
        )
    p = Params(families=families, repeats=a.repeats, runs=a.runs)
    if a.smoke:
        p = dataclasses.replace(
            p, families=("cnn",), calibration_steps=2, eval_limit=300, repeats=1, runs=10,
            warmup=2, smoke=True,
        )  # fmt: skip
    return p, QuietGate(enabled=not (a.no_gate or a.smoke)), a.out, a.workdir


def ensure_family(workdir: str, name: str, smoke: bool) -> str:
    """The trained run of one family, trained once by B5's or B9's own code."""
    if name == "cnn":
        p5 = b5.Params()
        if smoke:
            p5 = dataclasses.replace(p5, epochs=1, limit=2000, batch_size=64)
        return b5.ensure_run(os.path.join(workdir, "bench-b5"), p5, "cnn")
    p9 = b9.Params()
    folder = b9.ensure_folder(os.path.join(workdir, "bench-b9"), p9)
    alpha = float(name.removeprefix("mobilenetv2_"))
    return b9.ensure_run(os.path.join(workdir, "bench-b9"), folder, p9, alpha)


def export_arm(run_dir: str, workdir: str, name: str, arm: str, p: Params) -> dict:
    """The export stage on one run with one quantizer: its rows, each with its file's bytes."""
    settings = ExportSettings(
        modes=ARMS[arm],
        options=ConvertOptions(strip_strings=True, quantizer=arm),
        calibration_steps=p.calibration_steps,
        eval_limit=p.eval_limit,
        selective=False,
        bench=BenchSettings(threads=(1,), runs=5, warmup=1, keras=False),  # timed below
        plot=False,
    )
    out = os.path.join(workdir, "bench-b9q", f"{name}-{arm}{'-smoke' if p.smoke else ''}")
    record = export_run(run_dir, settings, out_dir=out, overwrite=True)
    rows = {r["mode"]: r for r in record.section["modes"]}
    for r in rows.values():
        with open(os.path.join(out, r["file"]), "rb") as f:
            r["content"] = f.read()
    return {"rows": rows, "keras_test_accuracy": record.metrics["keras_test_accuracy"]}


def main(argv=None) -> int:
    p, gate, out, workdir = parse_args(argv)
    started = time.perf_counter()
    total = 3 * len(p.families) + p.repeats * len(SETTINGS)
    arms, timed, runs = {}, {}, {}
    with tqdm(total=total, desc="B9q", unit="step", disable=None, file=sys.stderr) as bar:
        for name in p.families:
            bar.set_postfix_str(f"{name}: training (once)")
            runs[name] = load_run(ensure_family(workdir, name, p.smoke))
            bar.update(1)
            for arm in ARMS:
                bar.set_postfix_str(f"{name}: export, --quantizer {arm}")
                arms[(name, arm)] = export_arm(runs[name].path, workdir, name, arm, p)
                for mode, row in arms[(name, arm)]["rows"].items():
                    timed[f"{name}/{arm}/{mode}"] = row["content"]
                bar.update(1)
        per = interleaved_latency(
            timed, SETTINGS, repeats=p.repeats, runs=p.runs, warmup=p.warmup, gate=gate, bar=bar
        )
    return publish(
        summarize(p, arms, runs, per), out, "B9q", table=report, gate=gate, started=started
    )


def verdict(litert: dict, converter: dict, litert_rounds: list, converter_rounds: list) -> str:
    """``litert``, ``converter`` or ``tie``: more accurate beyond the standard error of the
    difference; else more faithful to the Keras model (top-1 agreement) beyond its standard error;
    else faster beyond the rounds' spread (every round of one faster than every round of the
    other, :func:`tfopt.export.rounds.measurable`); else smaller by more than 1%."""
    from tfopt.export import measurable

    n = litert["eval"]["examples"]
    for key in ("accuracy", "agreement"):
        a, b = litert["eval"][key], converter["eval"][key]
        if abs(a - b) > math.sqrt((a * (1 - a) + b * (1 - b)) / n):
            return "litert" if a > b else "converter"
    if measurable(litert_rounds, converter_rounds):
        return "litert" if max(litert_rounds) < min(converter_rounds) else "converter"
    size = litert["size_bytes"] / converter["size_bytes"]
    if abs(size - 1) > 0.01:
        return "litert" if size < 1 else "converter"
    return "tie"


def summarize(p: Params, arms: dict, runs: dict, per: dict) -> dict:
    figures, families = [], {}
    for name in p.families:
        base = f"{name}/converter/float32"
        f32 = arms[(name, "converter")]["rows"]["float32"]["size_bytes"]
        rows = {}
        for arm in ARMS:
            for mode, r in arms[(name, arm)]["rows"].items():
                rows[f"{arm}/{mode}"] = {
                    "arm": arm,
                    "mode": mode,
                    "quantizer": r.get("quantizer"),
                    "size_bytes": r["size_bytes"],
                    "size_ratio_vs_float32": f32 / r["size_bytes"],
                    "eval": r["eval"],
                    "notes": r.get("notes", []),
                    "latency_interleaved": speedups(per, f"{name}/{arm}/{mode}", base, SETTINGS),
                }
        compare = {}
        for mode in BOTH:
            lit, conv = rows[f"litert/{mode}"], rows[f"converter/{mode}"]
            ratios = {
                key: [
                    a / b
                    for a, b in zip(
                        per[f"{name}/litert/{mode}"][key], per[f"{name}/converter/{mode}"][key]
                    )
                ]
                for key, _ in SETTINGS
            }
            compare[mode] = {
                "litert_over_converter_p50": ratios,
                "accuracy_pt": 100 * (lit["eval"]["accuracy"] - conv["eval"]["accuracy"]),
                "size_ratio": lit["size_bytes"] / conv["size_bytes"],
                "better": verdict(
                    lit,
                    conv,
                    per[f"{name}/litert/{mode}"]["xnnpack/1t"],
                    per[f"{name}/converter/{mode}"]["xnnpack/1t"],
                ),
            }
            figures.append(
                figure(
                    f"{name}: {mode}, LiteRT Quantizer / converter p50 (1 thread; < 1 = LiteRT faster)",
                    ratios["xnnpack/1t"],
                    "x",
                    digits=3,
                    detail=f"2 threads {median(ratios['xnnpack/2t']):.3f}; accuracy "
                    f"{100 * lit['eval']['accuracy']:.2f}% vs {100 * conv['eval']['accuracy']:.2f}%; agreement "
                    f"{lit['eval']['agreement']:.4f} vs {conv['eval']['agreement']:.4f}; "
                    f"size {lit['size_bytes']:,} vs {conv['size_bytes']:,} bytes; better: "
                    f"{compare[mode]['better']}",
                )
            )
        best = max(
            (rows[k] for k in ("converter/dynamic", "litert/dynamic", "litert/dynamic_auto")),
            key=lambda r: r["latency_interleaved"]["xnnpack/1t"]["speedup_vs_float32"],
        )
        auto = rows["litert/dynamic_auto"]
        figures += [
            figure(
                f"{name}: dynamic_auto speedup vs float32 (1 thread)",
                auto["latency_interleaved"]["xnnpack/1t"]["speedup_rounds"],
                "x",
                target=TARGETS["dynamic_speedup_1t"],
                peer=f"the converter's dynamic: "
                f"{rows['converter/dynamic']['latency_interleaved']['xnnpack/1t']['speedup_vs_float32']:.2f}x",
                detail=f"best dynamic-family file: {best['arm']} {best['mode']} "
                f"{best['latency_interleaved']['xnnpack/1t']['speedup_vs_float32']:.2f}x; "
                + ("; ".join(n for n in auto["notes"] if n.startswith("dynamic_auto:")) or "-"),
            ),
            figure(
                f"{name}: dynamic_auto size, float32 / dynamic_auto file bytes",
                [auto["size_ratio_vs_float32"]],
                "x",
                target=TARGETS["dynamic_size_ratio"],
                detail=f"{f32:,} / {auto['size_bytes']:,} bytes (--strip-strings)",
            ),
        ]
        run = runs[name]
        families[name] = {
            "run": run.path,
            "model": {"name": run.record.model.get("name"), "params": run.record.model["params"]},
            "data": run.record.data,
            "keras_test_accuracy": arms[(name, "converter")]["keras_test_accuracy"],
            "rows": rows,
            "compare": compare,
        }
    return result(
        "B9q",
        "the maintained quantization path",
        COMMAND,
        figures,
        benchmark="B9q the TFLite converter vs LiteRT Quantizer, same models",
        params=dataclasses.asdict(p),
        families=families,
        latency_rounds=per,
    )


def report(res: dict) -> str:
    parts = []
    for name, fam in res["families"].items():
        table = []
        for key, r in fam["rows"].items():
            lat = r["latency_interleaved"]
            table.append(
                [
                    key,
                    f"{r['size_bytes'] / 1024:.0f}",
                    f"{r['size_ratio_vs_float32']:.2f}x",
                    *[
                        f"{lat[k]['p50_ms'] * 1e3:.0f} ({lat[k]['speedup_vs_float32']:.2f}x)"
                        for k, _ in SETTINGS
                    ],
                    f"{100 * r['eval']['accuracy']:.2f}",
                    f"{r['eval']['agreement']:.3f}",
                ]
            )
        parts.append(
            f"## B9q: {name} ({fam['model']['params']:,} params); Keras test accuracy "
            f"{100 * fam['keras_test_accuracy']:.2f}%; p50 at batch 1, median of "
            f"{res['params']['repeats']} interleaved rounds x {res['params']['runs']} runs"
        )
        parts.append(
            markdown_table(
                [
                    "quantizer/mode",
                    "size KiB",
                    "smaller",
                    *[f"p50 {k} us (speedup)" for k, _ in SETTINGS],
                    "test acc %",
                    "agreement",
                ],
                table,
            )  # fmt: skip
        )
        parts.append(
            markdown_table(
                ["mode", "LiteRT / converter p50 1t", "2t", "accuracy pt", "size ratio", "better"],
                [
                    [
                        mode,
                        f"{median(c['litert_over_converter_p50']['xnnpack/1t']):.3f}",
                        f"{median(c['litert_over_converter_p50']['xnnpack/2t']):.3f}",
                        f"{c['accuracy_pt']:+.2f}",
                        f"{c['size_ratio']:.3f}",
                        c["better"],
                    ]
                    for mode, c in fam["compare"].items()
                ],
            )
        )
    parts.append(figures_table(res["figures"]))
    return "\n\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
