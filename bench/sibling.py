"""Benchmark B11 (structured compression vs the narrower sibling): channel-pruned MobileNetV2 1.0 against MobileNetV2 0.5 / 0.35 trained from scratch, at equal cost.

What it does, in one run on one machine (BENCHMARKS.md, row B11):

1. The dense model: B9's MobileNetV2 1.0 at 96x96, trained with ``tfopt.train`` on Fashion-MNIST
   written as PNG class folders (``folder:`` source), reused from B9's work directory.
2. Siblings: ``keras.applications`` MobileNetV2 with ``alpha`` 0.5 and 0.35, trained from scratch
   with ``tfopt.train`` on the same images for the same total epochs as a pruned arm (the dense
   model's epochs plus the fine-tuning epochs).
3. Pruned arms, two per sibling, each matched to the sibling's cost: ``latency``, channel-pruned
   with ``--target-latency-us`` set to the sibling's float .tflite p50 measured here at 1 thread
   (the clock channel_prune aims with; a width multiplier and channel pruning keep the same
   layer types, so equal float cost is the nearest match to equal int8 cost it can aim at, and
   the int8 p50s are measured beside it); ``macs``, pruned to the sibling's multiply-adds as a
   share of the dense model's (``--channels-flops``). Each: one fine-tuning epoch inside the
   technique, then ``tfopt.distill`` with the dense model as teacher for the rest of the
   fine-tuning epochs (the pruned network is the student).
4. Every model exported by the library (float32 and int8, stripped) and scored on the test split
   (at least 5,000 images; the standard error of every accuracy is reported); the peer's int8 of
   every model: the LiteRT "Post-training quantization" guide's recipe on the same Keras model.
5. Latency at batch 1, 1 thread, every model of both arms interleaved in ``--repeats`` rounds;
   every figure beside its compute bound on this CPU (:mod:`tfopt.export.roofline`).

Targets (BENCHMARKS.md B11): at equal or lower int8 p50 the pruned model is >= 1 pt more accurate
than the sibling (or at equal accuracy >= 1.2x faster); the verdict per pair says which to pick
(``pruned``, ``sibling`` or ``tie``) from the accuracy difference against its standard error and
the int8 speed against the rounds' spread; the dense-float-to-pruned-int8 speedup
within 1.3x of the speedup the compute bounds allow (bound of the dense float model over bound of
the pruned int8 one, depthwise at the fp32 rate as XNNPACK runs it); <= 1 pt below the dense model.

    PYTHONPATH=. python bench/sibling.py [--repeats 3] [--finetune-epochs 4]
    PYTHONPATH=. python bench/sibling.py --smoke     # a small slice at 32x32; used by a test
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench import edge_architecture as b9  # noqa: E402
from bench._common import (  # noqa: E402
    QuietGate,
    figure,
    figures_table,
    interleaved_latency,
    markdown_table,
    median,
    publish,
    result,
    roofline_at,
    script_parser,
)
from bench.peers import litert_ptq_guide as guide  # noqa: E402
from tfopt import config as config_lib  # noqa: E402
from tfopt.core import (  # noqa: E402
    peak_summary,
    peaks,
    write_json,  # noqa: E402
)
from tfopt.export import (  # noqa: E402
    BenchSettings,
    ConvertOptions,  # noqa: E402
    ExportSettings,
    load_split,  # noqa: E402
)
from tfopt.export import run as export_run  # noqa: E402
from tfopt.runs import load_run  # noqa: E402

SETTINGS = (("xnnpack/1t", 1),)
TARGETS = {
    "accuracy_over_sibling_pt": (">=", 1.0),
    "speed_over_sibling": (">=", 1.2),
    "int8_over_bound": ("<=", 1.3),  # the bounds' speedup / the measured speedup
    "loss_vs_dense_pt": ("<=", 1.0),
}
ANCHOR = "AMC: MobileNetV1 1.81x at half the FLOPs, -0.1 pt (phone); NetAdapt up to 1.7x"
COMMAND = "PYTHONPATH=. python bench/sibling.py"


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    alphas: tuple = (0.5, 0.35)  # the siblings' width multipliers
    matches: tuple = ("latency", "macs")  # how each pruned arm is matched to its sibling
    finetune_epochs: int = 4  # after pruning: 1 inside channel_prune, the rest distilled
    learning_rate: float = 1e-3
    round_to: int = 8
    eval_limit: int = 0  # 0 = the whole test split the folder holds
    repeats: int = 3
    runs: int = 100
    warmup: int = 10
    b9: b9.Params = dataclasses.field(default_factory=b9.Params)
    smoke: bool = False


def parse_args(argv=None):
    ap = script_parser(
        __doc__,
        "sibling",
        "a small slice at 32x32, few runs",
        gate=True,
        workdir=os.path.join(config_lib.default_data_dir(), "bench-b11"),
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--finetune-epochs", type=int, default=4)
    ap.add_argument(
        "--b9-workdir",
        default=os.path.join(config_lib.default_data_dir(), "bench-b9"),
        help="where B9 keeps the folder and the dense MobileNetV2 1.0 it trains (reused)",
    )
    a = ap.parse_args(argv)
    p = Params(repeats=a.repeats, runs=a.runs, finetune_epochs=a.finetune_epochs)
    if a.smoke:
        small = dataclasses.replace(
            b9.Params(), image_size=32, limit=200, epochs=1, calibration_steps=2, smoke=True
        )
        p = dataclasses.replace(
            p,
            alphas=(0.5,),
            finetune_epochs=2,
            eval_limit=100,
            repeats=1,
            runs=5,
            warmup=2,
            b9=small,
            smoke=True,
        )
    gate = QuietGate(enabled=not (a.no_gate or a.smoke))
    # The smoke slice trains its own small dense model: never in B9's real work directory.
    return p, gate, a.out, a.workdir, a.workdir if a.smoke else a.b9_workdir


def _cfg(run_dir: str, out_dir: str, epochs: int, p: Params):
    run = load_run(run_dir)
    overrides = ["train.verbose=0", "train.tensorboard=false", f"train.epochs={epochs}"]
    overrides += [f"train.learning_rate={p.learning_rate}", f"train.output_dir={out_dir}"]
    return config_lib.apply_overrides(run.config, overrides)


def match_spec(dense: str, sibling: str, match: str, p: Params):
    """The channel_prune spec that matches the dense model's pruned copy to ``sibling``'s cost:
    its float .tflite p50 at 1 thread (``latency``) or its multiply-adds (``macs``)."""
    from tfopt.compress import ChannelSpec, model_macs, model_us
    from tfopt.models import load_model

    model = load_model(load_run(sibling).model_path)
    if match == "latency":
        return ChannelSpec(latency_us=model_us(model, threads=1), round_to=p.round_to)
    share = sum(model_macs(model).values()) / sum(
        model_macs(load_model(load_run(dense).model_path)).values()
    )
    return ChannelSpec(flops=min(1.0, share), round_to=p.round_to)


def pruned_arm(dense: str, workdir: str, tag: str, spec, p: Params) -> tuple[str, dict]:
    """channel_prune by ``spec`` (1 epoch), then distilled from the dense model.

    Returns the run and what it was aimed at. A target the dense model's widths cannot reach
    (every group at its minimum is still slower) is recorded with channel_prune's reason, and the
    arm is pruned to the nearest reachable target instead: the closest channel pruning gets.
    """
    from tfopt.core import TargetOutOfReach
    from tfopt.distill import run as distill
    from tfopt.optimize import run as optimize

    tag = f"{tag}-e{p.finetune_epochs}{'-smoke' if p.smoke else ''}"
    pruned, out = os.path.join(workdir, f"pruned-{tag}"), os.path.join(workdir, f"distilled-{tag}")
    aim = _target(spec)
    reach = os.path.join(workdir, f"pruned-{tag}.unreachable.json")
    if os.path.exists(reach):
        with open(reach) as f:
            aim = json.load(f)
    elif spec.latency_us and os.path.exists(os.path.join(pruned, "run.json")):
        # pruned in an earlier run: aimed at the sibling's p50 as measured then
        phase = load_run(pruned).record.section["phases"][0]
        aim = aim | {"latency_us": phase["latency"]["target_us"]}
    if not os.path.exists(os.path.join(pruned, "run.json")):
        cfg = _cfg(dense, pruned, 1, p)
        try:
            optimize(dense, cfg, [_prune_settings(spec, p)], [pruned], keep_going=False)
        except TargetOutOfReach as e:
            key = "latency_us" if spec.latency_us else "flops"
            aim = aim | {"unreachable": str(e), f"sibling_{key}": aim[key], key: e.nearest}
            write_json(reach, aim)
            spec = dataclasses.replace(spec, **{key: e.nearest})
            optimize(dense, cfg, [_prune_settings(spec, p)], [pruned], keep_going=False)
    if p.finetune_epochs > 1 and not os.path.exists(os.path.join(out, "run.json")):
        cfg = _cfg(dense, out, p.finetune_epochs - 1, p)
        student = load_run(pruned).model_path  # the pruned network, its weights included
        cfg = config_lib.apply_overrides(cfg, [f"model.name={student}", "model.args="])
        distill(cfg, (dense,))
    return (out if p.finetune_epochs > 1 else pruned), aim


def _prune_settings(spec, p: Params):
    from tfopt.optimize import OptimizeSettings

    return OptimizeSettings(
        technique="channel_prune",
        epochs=1,
        learning_rate=p.learning_rate,
        channels=spec,
        tensorboard=False,
    )


def sibling_arm(workdir: str, alpha: float, p: Params) -> str:
    """MobileNetV2 ``alpha`` from scratch on the same folder for the pruned arms' total epochs."""
    sp = dataclasses.replace(p.b9, epochs=p.b9.epochs + p.finetune_epochs)
    return b9.ensure_run(workdir, b9.ensure_folder(workdir, p.b9), sp, alpha)


def export_arm(run_dir: str, p: Params) -> dict:
    """float32 and int8 by the library (stripped), scored on the test split; the guide's int8."""
    from tfopt.models import load_model

    settings = ExportSettings(
        modes=("float32", "int8"),
        options=ConvertOptions(strip_strings=True),
        calibration_steps=p.b9.calibration_steps,
        eval_limit=p.eval_limit,
        selective=False,
        bench=BenchSettings(threads=(1,), runs=5, warmup=1, keras=False),
        plot=False,
    )
    out = run_dir + "-export"
    record = export_run(run_dir, settings, out_dir=out, overwrite=True)
    rows = {}
    for r in record.section["modes"]:
        with open(os.path.join(out, r["file"]), "rb") as f:
            rows[r["mode"]] = {
                "content": f.read(),
                "size_bytes": r["size_bytes"],
                "accuracy": r["eval"]["accuracy"],
                "examples": r["eval"]["examples"],
            }
    run = load_run(run_dir)
    x_train, _ = load_split(run.config.data, "train", guide.REPRESENTATIVE_SAMPLES)
    x_test, y_test = load_split(run.config.data, "test", p.eval_limit)
    content = guide.convert(load_model(run.model_path), "int8", x_train)
    rows["guide_int8"] = {
        "content": content,
        "size_bytes": len(content),
        "accuracy": float(np.mean(guide.predict(content, x_test) == y_test)),
        "examples": int(len(y_test)),
    }
    return {
        "run": run_dir,
        "params": run.record.model.get("params"),
        "keras_test_accuracy": record.metrics["keras_test_accuracy"],
        "rows": rows,
    }


MATCHED = {"latency": "float p50", "macs": "multiply-adds"}


def verdict(gap_pt: float, gap_se: float, pruned_rounds, sibling_rounds) -> str:
    """Which model to pick: ``pruned`` or ``sibling`` when one is more accurate (beyond the
    standard error of the difference) and not slower (beyond the rounds' spread), or as accurate
    and faster; ``tie`` when neither differs; ``trade-off`` when one is more accurate and the
    other faster."""
    from tfopt.export import measurable

    acc = 0 if abs(gap_pt) <= gap_se else (1 if gap_pt > 0 else -1)
    spd = 0
    if measurable(pruned_rounds, sibling_rounds):
        spd = 1 if max(pruned_rounds) < min(sibling_rounds) else -1
    if acc * spd < 0:
        return "trade-off"
    return {1: "pruned", -1: "sibling", 0: "tie"}[acc or spd]


def _target(spec) -> dict:
    """What a pruned arm was aimed at, as recorded."""
    if spec.latency_us:
        return {"latency_us": spec.latency_us, "threads": spec.latency_threads}
    return {"flops": spec.flops}


def _se_pt(accuracy: float, n: int) -> float:
    """The standard error of an accuracy measured on ``n`` examples, in points."""
    return 100 * math.sqrt(max(accuracy * (1 - accuracy), 0.0) / max(n, 1))


def main(argv=None) -> int:
    p, gate, out, workdir, b9_workdir = parse_args(argv)
    t_start = time.perf_counter()
    total = 2 + (1 + len(p.matches)) * len(p.alphas) + p.repeats * len(SETTINGS)
    arms, timed = {}, {}
    with tqdm(total=total, desc="B11", unit="step", disable=None, file=sys.stderr) as bar:
        bar.set_postfix_str("the dense MobileNetV2 1.0 (B9's, trained once)")
        folder = b9.ensure_folder(b9_workdir, p.b9)
        dense = b9.ensure_run(b9_workdir, folder, p.b9, 1.0)
        arms["dense"] = export_arm(dense, p)
        bar.update(1)
        for alpha in p.alphas:
            bar.set_postfix_str(f"MobileNetV2 alpha {alpha:g} from scratch")
            sibling = sibling_arm(b9_workdir, alpha, p)
            arms[f"sibling_{alpha:g}"] = export_arm(sibling, p)
            bar.update(1)
            for match in p.matches:
                bar.set_postfix_str(f"channel_prune to alpha {alpha:g}'s {match}, distilled")
                spec = match_spec(dense, sibling, match, p)
                run_dir, aim = pruned_arm(dense, workdir, f"{match}-a{alpha:g}", spec, p)
                arms[f"pruned_{match}_{alpha:g}"] = export_arm(run_dir, p) | {
                    "matched": {"to": f"sibling_{alpha:g}", "by": match, **aim}
                }
                bar.update(1)
        for name, arm in arms.items():
            for mode, row in arm["rows"].items():
                timed[f"{name}/{mode}"] = row["content"]
        per = interleaved_latency(
            timed, SETTINGS, repeats=p.repeats, runs=p.runs, warmup=p.warmup, gate=gate, bar=bar
        )
        bar.set_postfix_str("rooflines (every op timed alone)")
        summary = summarize(p, arms, per, peaks())
        bar.update(1)
    return publish(summary, out, "B11", table=report, gate=gate, started=t_start)


def summarize(p: Params, arms: dict, per: dict, peaks: dict) -> dict:
    out_arms = {}
    for name, arm in arms.items():
        out_arms[name] = {k: v for k, v in arm.items() if k != "rows"}
        out_arms[name]["modes"] = {
            mode: {
                "size_bytes": r["size_bytes"],
                "accuracy": r["accuracy"],
                "examples": r["examples"],
                "se_pt": _se_pt(r["accuracy"], r["examples"]),
                "p50_ms": median(per[f"{name}/{mode}"]["xnnpack/1t"]),
                "rounds": per[f"{name}/{mode}"]["xnnpack/1t"],
                "roofline": roofline_at(r["content"], per[f"{name}/{mode}"], SETTINGS, peaks),
            }
            for mode, r in arm["rows"].items()
        }
    figures, verdicts = [], {}
    dense = out_arms["dense"]["modes"]
    for alpha in p.alphas:
        sib = out_arms[f"sibling_{alpha:g}"]["modes"]
        for match in p.matches:
            name = f"pruned_{match}_{alpha:g}"
            pr = out_arms[name]["modes"]
            pair = f"pruned to alpha {alpha:g}'s {MATCHED[match]} vs the sibling"
            gap = 100 * (pr["int8"]["accuracy"] - sib["int8"]["accuracy"])
            gap_se = math.hypot(pr["int8"]["se_pt"], sib["int8"]["se_pt"])
            faster = [s / q for s, q in zip(sib["int8"]["rounds"], pr["int8"]["rounds"])]
            verdicts[name] = verdict(gap, gap_se, pr["int8"]["rounds"], sib["int8"]["rounds"])
            roof = pr["int8"]["roofline"]["xnnpack/1t"]
            dense_roof = dense["float32"]["roofline"]["xnnpack/1t"]
            speedup = dense["float32"]["p50_ms"] / pr["int8"]["p50_ms"]
            bound_speedup = (
                dense_roof["bound_ms"] / roof["bound_ms"]
                if dense_roof["bound_ms"] and roof["bound_ms"]
                else None
            )
            figures += [
                figure(
                    f"{pair}: int8 accuracy difference",
                    [gap],
                    "pt",
                    target=TARGETS["accuracy_over_sibling_pt"] if median(faster) >= 1.0 else None,
                    anchor=ANCHOR,
                    detail=f"{100 * pr['int8']['accuracy']:.2f}% vs {100 * sib['int8']['accuracy']:.2f}% "
                    f"(n={pr['int8']['examples']}, standard error of the difference {gap_se:.2f} pt); "
                    f"the target applies at equal or lower int8 p50 (sibling / pruned "
                    f"{median(faster):.2f}x); pick: {verdicts[name]}"
                    + _unreachable(out_arms[name]["matched"]),
                ),
                figure(
                    f"{pair}: int8 speed (sibling p50 / pruned p50)",
                    faster,
                    "x",
                    target=TARGETS["speed_over_sibling"] if abs(gap) <= gap_se else None,
                    detail=f"{1e3 * pr['int8']['p50_ms']:.0f} us vs {1e3 * sib['int8']['p50_ms']:.0f} us "
                    f"(float32 {1e3 * pr['float32']['p50_ms']:.0f} vs {1e3 * sib['float32']['p50_ms']:.0f} "
                    f"us); {roof['macs'] / 1e6:.1f}M vs "
                    f"{sib['int8']['roofline']['xnnpack/1t']['macs'] / 1e6:.1f}M MACs; the target "
                    "applies at equal accuracy (within one standard error)",
                ),
                figure(
                    f"{pair} + int8: the bound's dense-to-pruned+int8 speedup / the measured one",
                    [bound_speedup / speedup] if bound_speedup else [],
                    "x",
                    target=TARGETS["int8_over_bound"],
                    detail=f"measured {speedup:.2f}x ({1e3 * dense['float32']['p50_ms']:.0f} -> "
                    f"{1e3 * pr['int8']['p50_ms']:.0f} us); the compute bounds allow "
                    f"{bound_speedup or float('nan'):.2f}x ({1e3 * (dense_roof['bound_ms'] or 0):.0f} -> "
                    f"{1e3 * (roof['bound_ms'] or 0):.0f} us, {roof['macs'] / 1e6:.1f}M MACs); "
                    f"pruned int8 at {roof['ratio'] or float('nan'):.2f}x its bound; {roof['summary']}",
                ),
                figure(
                    f"{pair}: accuracy loss vs the dense model (float32)",
                    [100 * (dense["float32"]["accuracy"] - pr["float32"]["accuracy"])],
                    "pt",
                    target=TARGETS["loss_vs_dense_pt"],
                    detail=f"dense {100 * dense['float32']['accuracy']:.2f}% vs pruned "
                    f"{100 * pr['float32']['accuracy']:.2f}% (standard error "
                    f"{math.hypot(dense['float32']['se_pt'], pr['float32']['se_pt']):.2f} pt)",
                ),
            ]
    return result(
        "B11",
        "structured compression vs the narrower sibling",
        COMMAND,
        figures,
        benchmark="B11 channel-pruned MobileNetV2 1.0 vs MobileNetV2 0.5 / 0.35",
        params=dataclasses.asdict(p),
        arms=out_arms,
        verdicts=verdicts,
        latency_rounds=per,
        cpu_peaks=peaks,
        peer={"guide": guide.GUIDE, "url": guide.URL},
    )


def _unreachable(matched: dict) -> str:
    """A sentence saying the sibling's cost is out of channel pruning's reach, or nothing."""
    if not matched.get("unreachable"):
        return ""
    return f"; the sibling's cost is out of reach ({matched['unreachable']}), so the arm is pruned to the nearest"


def _aim(matched: dict) -> str:
    if "latency_us" in matched:
        aim = f"float p50 {matched['latency_us']:.0f} us, {matched['threads']} thread(s)"
    else:
        aim = f"{matched['flops']:.3f} of the dense multiply-adds"
    if matched.get("unreachable"):
        aim += " (the sibling's is out of reach: the nearest channel pruning gets)"
    return aim


def report(res: dict) -> str:
    rows = []
    for name, arm in res["arms"].items():
        for mode, r in arm["modes"].items():
            roof = r["roofline"]["xnnpack/1t"]
            rows.append(
                [
                    f"{name} {mode}",
                    f"{arm['params']:,}" if arm.get("params") else "-",
                    f"{roof['macs'] / 1e6:.1f}",
                    f"{r['size_bytes'] / 1024:.0f}",
                    f"{1e3 * r['p50_ms']:.0f}",
                    "-" if roof["bound_ms"] is None else f"{1e3 * roof['bound_ms']:.0f}",
                    "-" if roof["ratio"] is None else f"{roof['ratio']:.2f}x",
                    f"{100 * r['accuracy']:.2f} ± {r['se_pt']:.2f}",
                ]
            )
    params = res["params"]
    return "\n\n".join(
        [
            f"## B11: channel-pruned MobileNetV2 1.0 vs the narrower sibling at "
            f"{params['b9']['image_size']}x{params['b9']['image_size']}; p50 at batch 1, 1 thread, "
            f"median of {params['repeats']} interleaved rounds x {params['runs']} runs",
            markdown_table(
                [
                    "model",
                    "params",
                    "MMACs",
                    "size KiB",
                    "p50 us",
                    "bound us",
                    "p50/bound",
                    "test acc % ± SE",
                ],
                rows,
            ),  # fmt: skip
            f"Bounds: {peak_summary(res['cpu_peaks'])}.",
            markdown_table(
                ["pruned arm", "matched to", "aimed at", "int8 acc pt vs sibling", "pick"],
                [
                    [
                        name,
                        res["arms"][name]["matched"]["to"],
                        _aim(res["arms"][name]["matched"]),
                        f"{100 * (arm['int8']['accuracy'] - sib['int8']['accuracy']):+.2f}",
                        pick,
                    ]
                    for name, pick in res["verdicts"].items()
                    for arm, sib in [
                        (
                            res["arms"][name]["modes"],
                            res["arms"][res["arms"][name]["matched"]["to"]]["modes"],
                        )
                    ]
                ],
            ),
            figures_table(res["figures"]),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
