"""Benchmark B5 (TFLite PTQ): float32 / dynamic / float16 / int8 / int8_auto / int16x8 of `cnn` and `mobilenet_tiny`.

What it does, in one run on one machine (BENCHMARKS.md, row B5):

1. Trains (once, then reuses from ``--workdir``) the default ``cnn`` (~220k params) and
   ``mobilenet_tiny`` (~10k params) on real MNIST (50k train) with ``tfopt.train``.
2. Exports each with the library's export stage (``tfopt.export.runner.run``, what
   ``python -m tfopt.export --modes ... --strip-strings`` does): every PTQ mode, 25 calibration
   batches from the run's training pipeline, float I/O, strings stripped. ``int8_auto`` is the
   latency-aware search: each op timed alone in float and int8 (1 thread), the ops whose int8
   kernel is slower kept in float, candidates timed end to end and gated on the validation split.
   Every model is scored on the whole MNIST test split (10k): accuracy, top-1 agreement with Keras.
3. QAT against an equally trained control: from the same trained model, (a) tfmot QAT through
   ``tfopt.compress.quantize.wrap`` fine-tuned 1 epoch, converted to int8; (b) the float model
   fine-tuned the same epoch with the same optimizer and data stream. Loss = (b)'s Keras test
   accuracy - (a)'s .tflite test accuracy; ``--qat-seeds`` seeds (the fine-tuning order).
4. Peers on the same data and machine: TF's "Post-training integer quantization" tutorial
   (``bench/peers/ptq_tutorial.py``: its model, trained and converted as it says) and tfmot's
   "Quantization aware training in Keras example" (``bench/peers/qat_example.py``).
5. Latency at batch 1 (p50 of ``--runs`` invokes after ``--warmup``) with the LiteRT interpreter,
   XNNPACK (LiteRT's default) at 1 and 2 threads: ``--repeats`` rounds, every model of both
   families and the peers interleaved (order rotated) in every round; each round's ratio vs its
   own float32 is taken side by side, the median and range over rounds reported. A quiet gate
   (bench/_common.py) re-runs a round that other tenants disturbed.

Sizes are file bytes with ``--strip-strings`` on both sides (the unstripped sizes are recorded
too). Writes ``bench/results/tflite_ptq.json`` (figures via ``bench/_common.figure``).

    PYTHONPATH=. python bench/tflite_ptq.py [--repeats 5] [--out bench/results/tflite_ptq.json]
    PYTHONPATH=. python bench/tflite_ptq.py --smoke        # MNIST slice, one repeat; used by a test
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a script: make `bench._common` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._common import (  # noqa: E402
    QuietGate,
    figure,
    figures_table,
    interleaved_latency,
    markdown_table,
    median,
    publish,
    result,
    speedups,
)
from bench.peers import ptq_tutorial, qat_example  # noqa: E402
from tfopt import config as config_lib  # noqa: E402
from tfopt import keras  # noqa: E402
from tfopt.export import (  # noqa: E402
    DEFAULT_MODES,
    BenchSettings,
    ConvertOptions,
    ExportSettings,
    TFLiteModel,
    calibration_batches,
    convert,
    evaluate_tflite,
    keras_cost,
    keras_outputs,
    load_split,
)
from tfopt.export import run as export_run  # noqa: E402
from tfopt.runs import load_run  # noqa: E402

MODELS = ("cnn", "mobilenet_tiny")
SETTINGS = (("xnnpack/1t", 1), ("xnnpack/2t", 2))
# B5: int8_auto >= 3x faster than float at 1 thread, >= 3.9x smaller, <= 0.3 pt lost (PTQ), <= 0.1 pt (QAT).
TARGETS = {
    "int8_auto_speedup_1t": (">=", 3.0),
    "int8_auto_size_ratio": (">=", 3.9),
    "int8_auto_accuracy_loss_pt": ("<=", 0.3),
    "qat_accuracy_loss_pt": ("<=", 0.1),
}
ANCHOR_SPEED = "TF docs: int8 '3x+ faster'"
ANCHOR_SIZE = "TF docs: int8 '4x smaller'"
COMMAND = "PYTHONPATH=. python bench/tflite_ptq.py"


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    models: tuple = MODELS
    epochs: int = 2
    limit: int = 0  # MNIST records per split (0 = full 50k/10k/10k)
    batch_size: int = 128
    calibration_steps: int = 25
    eval_limit: int = 0  # test examples scored (0 = all)
    search_limit: int = 2000  # validation examples the int8_auto / selective searches score on
    repeats: int = 5
    runs: int = 300
    warmup: int = 30
    export_runs: int = 100  # the export stage's own timings (int8_auto's search included)
    qat_seeds: int = 3
    qat_epochs: int = 1
    qat_lr: float = 1e-4
    peer_epochs: int = ptq_tutorial.EPOCHS
    peers: bool = True
    smoke: bool = False


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated (default cnn,mobilenet_tiny)"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--qat-seeds", type=int, default=3, help="QAT / control seeds (0: no QAT)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument(
        "--no-gate", action="store_true", help="no quiet-gate (measure whatever the load)"
    )
    ap.add_argument("--workdir", default=os.path.join(config_lib.default_data_dir(), "bench-b5"))
    ap.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "tflite_ptq.json"
        ),
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="MNIST slice, 1 epoch, few runs: checks the script runs",
    )
    a = ap.parse_args(argv)
    models = tuple(m.strip() for m in a.models.split(",") if m.strip())
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        ap.error(
            f"unknown model {', '.join(unknown) or a.models!r}; choose from {', '.join(MODELS)} (--models)"
        )
    p = Params(
        models=models,
        repeats=a.repeats,
        runs=a.runs,
        warmup=a.warmup,
        epochs=a.epochs,
        qat_seeds=a.qat_seeds,
        peers=not a.no_peers,
    )
    if a.smoke:
        p = dataclasses.replace(
            p,
            epochs=1,
            limit=2000,
            batch_size=64,
            calibration_steps=2,
            eval_limit=300,
            search_limit=300,
            repeats=1,
            runs=20,
            warmup=2,
            export_runs=10,
            qat_seeds=min(p.qat_seeds, 1),
            peer_epochs=1,
            smoke=True,
        )
    gate = QuietGate(enabled=not (a.no_gate or a.smoke))
    return p, gate, a.out, a.workdir


def ensure_run(workdir: str, p: Params, model: str) -> str:
    """Trains ``model`` once per (epochs, limit, batch) and reuses the run directory."""
    from tfopt.train import run as train

    run_dir = os.path.join(workdir, f"{model}-e{p.epochs}-l{p.limit}-b{p.batch_size}")
    if os.path.exists(os.path.join(run_dir, "run.json")):
        try:
            load_run(run_dir)
            return run_dir
        except Exception:  # written by an older tfopt: train again
            pass
    cfg = config_lib.from_dict(
        {
            "data": {"dataset": "mnist", "limit": p.limit, "global_batch_size": p.batch_size},
            "model": {"name": model},
            "runtime": {"strategy": "one_device"},
            "train": {
                "epochs": p.epochs,
                "output_dir": run_dir,
                "verbose": 0,
                "tensorboard": False,
            },
        }
    )
    train(cfg)
    return run_dir


def export_family(run_dir: str, workdir: str, name: str, p: Params) -> dict:
    """The export stage on one trained run: every mode, stripped; returns its rows and the plain sizes."""
    settings = ExportSettings(
        modes=DEFAULT_MODES,
        options=ConvertOptions(strip_strings=True),
        calibration_steps=p.calibration_steps,
        eval_limit=p.eval_limit,
        search_limit=p.search_limit,
        selective=False,  # B5 compares the PTQ modes; the fidelity-driven selective int8 is not one
        bench=BenchSettings(
            threads=(1, 2), runs=p.export_runs, warmup=min(p.warmup, 10), keras=False
        ),
        plot=False,
    )
    out = os.path.join(workdir, f"{name}-export{'-smoke' if p.smoke else ''}")
    record = export_run(run_dir, settings, out_dir=out, overwrite=True)
    rows = {r["mode"]: r for r in record.section["modes"]}
    for r in rows.values():
        with open(os.path.join(out, r["file"]), "rb") as f:
            r["content"] = f.read()
    return {
        "rows": rows,
        "export_dir": out,
        "notes": record.section["notes"],
        "keras_test_accuracy": record.metrics["keras_test_accuracy"],
    }


def plain_sizes(model, run) -> dict:
    """float32 and int8 file bytes without --strip-strings (what stripping saved)."""
    calibration = calibration_batches(run.config.data, 2)
    return {m: len(convert(model, m, calibration=calibration).content) for m in ("float32", "int8")}


def qat_vs_control(run, model, p: Params, seed: int, x, y) -> dict:
    """QAT (tfopt.compress.quantize.wrap) and the float control, each fine-tuned the same epoch(s)."""
    from tfopt.compress import QatSpec, quantize_model
    from tfopt.data import make_dataset

    data = dataclasses.replace(run.config.data, seed=seed)
    steps = (
        run.record.data["splits"]["train"] // data.global_batch_size
    )  # one pass of the training stream

    def fine_tune(m) -> float:
        m.compile(
            optimizer=keras.optimizers.Adam(p.qat_lr),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        started = time.perf_counter()
        m.fit(
            make_dataset(data, "train", training=True),
            epochs=p.qat_epochs,
            steps_per_epoch=steps,
            verbose=0,
        )
        return time.perf_counter() - started

    keras.utils.set_random_seed(seed)
    control = keras.models.clone_model(model)
    control.set_weights(model.get_weights())
    control_s = fine_tune(control)
    keras.utils.set_random_seed(seed)
    qat = quantize_model(model, QatSpec())
    qat_s = fine_tune(qat)
    content = convert(qat, "int8", options=ConvertOptions(strip_strings=True)).content
    control_acc = float(np.mean(keras_outputs(control, x).argmax(-1) == y))
    ev = evaluate_tflite(TFLiteModel(content), x, y, keras_outputs(qat, x)).to_dict()
    return {
        "seed": seed,
        "control_keras_accuracy": control_acc,
        "qat_tflite_accuracy": ev["accuracy"],
        "qat_keras_accuracy": ev["keras_accuracy"],
        "qat_agreement": ev["agreement"],
        "loss_pt": round(100 * (control_acc - ev["accuracy"]), 3),
        "size_bytes": len(content),
        "control_seconds": round(control_s, 1),
        "qat_seconds": round(qat_s, 1),
        "content": content,
    }


def run_peers(p: Params, data_cfg) -> dict:
    """Both tutorials' recipes on the benchmark's MNIST splits (test read once, for the figures)."""
    x_train, y_train = load_split(data_cfg, "train")
    x_val, y_val = load_split(data_cfg, "validation")
    x_test, y_test = load_split(data_cfg, "test", p.eval_limit)
    tr, va, te = (
        x_train[..., 0],
        x_val[..., 0],
        x_test[..., 0],
    )  # the tutorials' models take 28x28 images
    out = {}
    started = time.perf_counter()
    model = ptq_tutorial.train(tr, y_train, va, y_val, epochs=p.peer_epochs)
    f32, i8 = ptq_tutorial.convert_float(model), ptq_tutorial.convert_int8(model, tr)
    keras_acc = float(np.mean(model.predict(te, verbose=0).argmax(-1) == y_test))
    out["ptq_tutorial"] = {
        "tutorial": ptq_tutorial.TUTORIAL,
        "url": ptq_tutorial.URL,
        "epochs": p.peer_epochs,
        "params": int(model.count_params()),
        "keras_test_accuracy": keras_acc,
        "float32": {
            "content": f32,
            "accuracy": float(np.mean(ptq_tutorial.predict(f32, te) == y_test)),
        },
        "int8": {"content": i8, "accuracy": float(np.mean(ptq_tutorial.predict(i8, te) == y_test))},
        "seconds": round(time.perf_counter() - started, 1),
    }
    started = time.perf_counter()
    q = qat_example.run(tr, y_train)
    keras_acc = float(np.mean(q["model"].predict(te, verbose=0).argmax(-1) == y_test))
    out["qat_example"] = {
        "tutorial": qat_example.TUTORIAL,
        "url": qat_example.URL,
        "keras_test_accuracy": keras_acc,
        "float32": {
            "content": q["float_tflite"],
            "accuracy": float(np.mean(qat_example.predict(q["float_tflite"], te) == y_test)),
        },
        "int8": {
            "content": q["qat_tflite"],
            "accuracy": float(np.mean(qat_example.predict(q["qat_tflite"], te) == y_test)),
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
    return out


def main(argv=None) -> int:
    p, gate, out, workdir = parse_args(argv)
    t_start = time.perf_counter()
    total = 4 * len(p.models) + (1 if p.peers else 0) + p.repeats * len(SETTINGS)
    families: dict[str, dict] = {}
    timed: dict[str, bytes] = {}
    peers: dict = {}
    with tqdm(total=total, desc="B5", unit="step", disable=None, file=sys.stderr) as bar:
        for name in p.models:
            bar.set_postfix_str(f"{name}: training (once)")
            run = load_run(ensure_run(workdir, p, name))
            from tfopt.models import load_model

            model = load_model(run.model_path)
            bar.update(1)
            bar.set_postfix_str(f"{name}: export (every mode, int8_auto search)")
            fam = export_family(run.path, workdir, name, p)
            fam.update(
                run=run.path,
                model={"name": name, **keras_cost(model)},
                plain_sizes=plain_sizes(model, run),
            )
            bar.update(1)
            x, y = load_split(run.config.data, "test", p.eval_limit)
            fam["qat"] = []
            for seed in range(p.qat_seeds):
                bar.set_postfix_str(f"{name}: QAT vs control, seed {seed}")
                fam["qat"].append(qat_vs_control(run, model, p, seed, x, y))
            bar.update(2)
            families[name] = fam
            for mode, row in fam["rows"].items():
                timed[f"{name}/{mode}"] = row["content"]
            if fam["qat"]:
                timed[f"{name}/qat-int8"] = fam["qat"][0]["content"]
            data_cfg = run.config.data
        if p.peers:
            bar.set_postfix_str("peers: PTQ tutorial, QAT example")
            peers = run_peers(p, data_cfg)
            for peer, r in peers.items():
                for mode in ("float32", "int8"):
                    timed[f"{peer}/{mode}"] = r[mode]["content"]
            bar.update(1)
        per = interleaved_latency(
            timed, SETTINGS, repeats=p.repeats, runs=p.runs, warmup=p.warmup, gate=gate, bar=bar
        )
    return publish(summarize(p, families, peers, per), gate, t_start, report, out, "B5")


def _verdict(key: str, got) -> dict:
    op, bound = TARGETS[key]
    ok = None if got is None or got != got else (got >= bound if op == ">=" else got <= bound)
    return {"op": op, "value": bound, "measured": got, "pass": ok}


def summarize(p: Params, families: dict, peers: dict, per: dict) -> dict:
    out_families, targets, figures = {}, {}, []
    peer_rows = {}
    for peer, r in peers.items():
        base = f"{peer}/float32"
        peer_rows[peer] = {
            **{k: v for k, v in r.items() if k not in ("float32", "int8")},
            **{
                mode: {
                    "size_bytes": len(r[mode]["content"]),
                    "accuracy": r[mode]["accuracy"],
                    "latency": speedups(per, f"{peer}/{mode}", base, SETTINGS),
                }
                for mode in ("float32", "int8")
            },
        }
        row = peer_rows[peer]
        row["int8_size_ratio"] = row["float32"]["size_bytes"] / row["int8"]["size_bytes"]
        row["int8_accuracy_loss_pt"] = round(
            100 * (r["keras_test_accuracy"] - r["int8"]["accuracy"]), 3
        )
    ptq_peer, qat_peer = peer_rows.get("ptq_tutorial"), peer_rows.get("qat_example")

    def peer_text(what: str) -> str | None:
        if ptq_peer is None:
            return None
        if what == "speed":
            return (
                f"{ptq_tutorial.TUTORIAL} (its {ptq_peer['params']:,}-param CNN, uint8 I/O): int8 "
                f"{ptq_peer['int8']['latency']['xnnpack/1t']['speedup_vs_float32']:.2f}x vs its float"
            )
        if what == "size":
            return f"{ptq_tutorial.TUTORIAL}: int8 {ptq_peer['int8_size_ratio']:.2f}x smaller than its float"
        if what == "accuracy":
            return f"{ptq_tutorial.TUTORIAL}: int8 loses {ptq_peer['int8_accuracy_loss_pt']:.2f} pt vs its Keras model"
        return (
            f"{qat_example.TUTORIAL}: QAT .tflite loses {qat_peer['int8_accuracy_loss_pt']:.2f} pt vs its float "
            f"baseline (not equally trained), {qat_peer['int8_size_ratio']:.2f}x smaller"
        )

    for name, fam in families.items():
        rows = {}
        keras_acc = fam["keras_test_accuracy"]
        f32 = fam["rows"]["float32"]
        names = list(fam["rows"]) + (["qat-int8"] if fam["qat"] else [])
        for mode in names:
            if mode == "qat-int8":
                q = fam["qat"][0]
                row = {
                    "size_bytes": q["size_bytes"],
                    "eval": {"accuracy": q["qat_tflite_accuracy"], "agreement": q["qat_agreement"]},
                }
            else:
                row = {k: v for k, v in fam["rows"][mode].items() if k != "content"}
            rows[mode] = {
                **row,
                "size_ratio_vs_float32": f32["size_bytes"] / row["size_bytes"],
                "accuracy_loss_vs_keras_pt": round(100 * (keras_acc - row["eval"]["accuracy"]), 3),
                "latency_interleaved": speedups(per, f"{name}/{mode}", f"{name}/float32", SETTINGS),
            }
        auto_row = rows["int8_auto"]
        lat = auto_row["latency_interleaved"]["xnnpack/1t"]
        qat_losses = [q["loss_pt"] for q in fam["qat"]]
        measured = {
            "int8_auto_speedup_1t": lat["speedup_vs_float32"],
            "int8_auto_size_ratio": auto_row["size_ratio_vs_float32"],
            "int8_auto_accuracy_loss_pt": auto_row["accuracy_loss_vs_keras_pt"],
            "qat_accuracy_loss_pt": median(qat_losses) if qat_losses else None,
        }
        targets[name] = {k: _verdict(k, v) for k, v in measured.items()}
        int8_lat = rows["int8"]["latency_interleaved"]["xnnpack/1t"]
        kept = ", ".join(auto_row["float_nodes"]) or "none"
        figures += [
            figure(
                f"{name}: int8_auto speedup vs float32 (LiteRT XNNPACK, 1 thread, batch 1)",
                lat["speedup_rounds"],
                "x",
                target=TARGETS["int8_auto_speedup_1t"],
                peer=peer_text("speed"),
                anchor=ANCHOR_SPEED,
                detail=f"p50 {1e3 * lat['p50_ms']:.1f} us vs float32 "
                f"{1e3 * rows['float32']['latency_interleaved']['xnnpack/1t']['p50_ms']:.1f} us; "
                f"kept in float: {kept}; plain int8 {int8_lat['speedup_vs_float32']:.2f}x",
            ),
            figure(
                f"{name}: full-integer int8 speedup vs float32 (1 thread)",
                int8_lat["speedup_rounds"],
                "x",
                detail="the plain converter's int8, for comparison with int8_auto",
            ),
            figure(
                f"{name}: int8_auto speedup vs float32 (2 threads)",
                auto_row["latency_interleaved"]["xnnpack/2t"]["speedup_rounds"],
                "x",
            ),
            figure(
                f"{name}: int8_auto size, float32 / int8_auto file bytes (--strip-strings)",
                [auto_row["size_ratio_vs_float32"]],
                "x",
                target=TARGETS["int8_auto_size_ratio"],
                peer=peer_text("size"),
                anchor=ANCHOR_SIZE,
                detail=f"{f32['size_bytes']:,} / {auto_row['size_bytes']:,} bytes; unstripped float32 / int8 "
                f"{fam['plain_sizes']['float32']:,} / {fam['plain_sizes']['int8']:,} bytes",
            ),
            figure(
                f"{name}: int8_auto accuracy loss vs the Keras model (PTQ)",
                [auto_row["accuracy_loss_vs_keras_pt"]],
                "pt",
                target=TARGETS["int8_auto_accuracy_loss_pt"],
                peer=peer_text("accuracy"),
                detail=f"Keras {100 * keras_acc:.2f}% vs int8_auto {100 * auto_row['eval']['accuracy']:.2f}% "
                f"(test n={auto_row['eval']['examples']}); agreement "
                f"{100 * auto_row['eval']['agreement']:.2f}%",
            ),
        ]
        if fam["qat"]:
            figures.append(
                figure(
                    f"{name}: QAT int8 accuracy loss vs the float model fine-tuned the same epoch",
                    qat_losses,
                    "pt",
                    target=TARGETS["qat_accuracy_loss_pt"],
                    peer=peer_text("qat") if qat_peer else None,
                    detail="per seed: "
                    + "; ".join(
                        f"control {100 * q['control_keras_accuracy']:.2f}% vs QAT .tflite "
                        f"{100 * q['qat_tflite_accuracy']:.2f}%"
                        for q in fam["qat"]
                    ),
                )
            )
        out_families[name] = {
            "run": fam["run"],
            "export_dir": fam["export_dir"],
            "model": fam["model"],
            "keras_test_accuracy": keras_acc,
            "plain_sizes": fam["plain_sizes"],
            "notes": fam["notes"],
            "models": rows,
            "qat": [{k: v for k, v in q.items() if k != "content"} for q in fam["qat"]],
        }
    return result(
        "B5",
        "TFLite post-training quantization",
        COMMAND,
        figures,
        benchmark="B5 TFLite PTQ",
        params=dataclasses.asdict(p),
        families=out_families,
        peers=peer_rows,
        targets=targets,
        latency_rounds=per,
    )


def report(res: dict) -> str:
    parts = []
    for name, fam in res["families"].items():
        rows = []
        for mode, r in fam["models"].items():
            lat = r["latency_interleaved"]
            rows.append(
                [
                    mode,
                    f"{r['size_bytes'] / 1024:.1f}",
                    f"{r['size_ratio_vs_float32']:.2f}x",
                    *[
                        f"{lat[k]['p50_ms'] * 1e3:.1f} ({lat[k]['speedup_vs_float32']:.2f}x)"
                        for k, _ in SETTINGS
                    ],
                    f"{100 * r['eval']['accuracy']:.2f}",
                    f"{-r['accuracy_loss_vs_keras_pt']:+.2f}",
                    f"{100 * r['eval']['agreement']:.2f}",
                ]
            )
        parts.append(
            f"## B5 TFLite PTQ: {name} ({fam['model']['params']:,} params), MNIST test, Keras accuracy "
            f"{100 * fam['keras_test_accuracy']:.2f}%; p50 at batch 1, median of "
            f"{res['params']['repeats']} interleaved rounds x {res['params']['runs']} runs; sizes stripped"
        )
        parts.append(
            markdown_table(
                [
                    "model",
                    "size KiB",
                    "smaller",
                    *[f"p50 {k} us (speedup)" for k, _ in SETTINGS],
                    "test acc %",
                    "Δ vs Keras pt",
                    "agreement %",
                ],
                rows,
            )
        )
        auto_info = fam["models"]["int8_auto"]["auto"]
        orows = [
            [
                t["op"],
                t["node"][:60],
                f"{1e3 * t['float_ms']:.1f}" if t["float_ms"] else "-",
                f"{1e3 * t['int8_ms']:.1f}" if t["int8_ms"] else "-",
                "float" if t["slower_in_int8"] else "int8",
            ]
            for t in auto_info["ops"]
        ]
        parts.append(
            f"### {name}: per-op timings (one-op models, 1 thread) and the int8_auto decision"
        )
        parts.append(markdown_table(["op", "node", "float32 us", "int8 us", "kept in"], orows))
    for r in res["peers"].values():
        parts.append(
            f"### Peer: {r['tutorial']}: float {r['float32']['size_bytes']:,} B, int8 "
            f"{r['int8']['size_bytes']:,} B ({r['int8_size_ratio']:.2f}x smaller); int8 1-thread speedup "
            f"{r['int8']['latency']['xnnpack/1t']['speedup_vs_float32']:.2f}x; accuracy Keras "
            f"{100 * r['keras_test_accuracy']:.2f}% -> int8 {100 * r['int8']['accuracy']:.2f}%"
        )
    parts.append(figures_table(res["figures"]))
    return "\n\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
