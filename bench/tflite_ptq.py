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

import dataclasses
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._common import (  # noqa: E402
    QuietGate,
    interleaved_latency,
    publish,
    script_parser,
)

# The benchmark's parts, by job (each under 600 lines).
from bench._tflite_ptq_params import (  # noqa: E402
    MODELS,
    SETTINGS,
    Params,
)
from bench._tflite_ptq_report import (  # noqa: E402
    report,
    summarize,
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


def parse_args(argv=None):
    ap = script_parser(
        __doc__,
        "tflite_ptq",
        "MNIST slice, 1 epoch, few runs: checks the script runs",
        gate=True,
        workdir=os.path.join(config_lib.default_data_dir(), "bench-b5"),
    )
    ap.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated (default cnn,mobilenet_tiny)"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--qat-seeds", type=int, default=3, help="QAT / control seeds (0: no QAT)")
    ap.add_argument("--no-peers", action="store_true")
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
    return publish(
        summarize(p, families, peers, per), out, "B5", table=report, gate=gate, started=t_start
    )


if __name__ == "__main__":
    sys.exit(main())
