"""Benchmark B5 (TFLite PTQ): float32 / dynamic / float16 / int8 / int16x8 .tflite of one model, side by side.

What it does, in one run on one machine (BENCHMARKS.md, row B5):

1. Trains (once, then reuses from ``--workdir``) the default ``cnn`` (~220k params, ~8 MFLOPs per
   image) on real MNIST (50k train) with ``tfopt.train``, and exports it with ``tfopt.export`` in
   every PTQ mode (25 calibration batches from the run's own training pipeline; float I/O).
2. Scores every .tflite on the full MNIST test split (10k) with the LiteRT interpreter: accuracy,
   loss vs the Keras model, top-1 agreement.
3. Latency at batch 1 (p50 of ``--runs`` invokes after ``--warmup``) with the LiteRT interpreter:
   XNNPACK delegate (LiteRT's default) at 1 and 2 threads, and builtin kernels only at 1 thread;
   ``--repeats`` rounds, models interleaved in every round, each round's ratio vs float32 taken
   side by side, and the median over rounds reported. A quiet-gate (bench/_common.py) re-runs a
   round when other tenants kept the shared machine busy.
4. Which kernels run: per-layer micro-models (each conv/dense layer alone, float32 vs int8,
   XNNPACK, 1 thread) locate where int8 gains or loses; plus one extra int8 variant with the
   slowest int8 layer kept in float (``--float-layers``), reported separately from the PTQ int8.
5. Optional QAT (``--qat``, on by default): tfmot ``quantize_model`` on the trained cnn, 1 epoch of
   fine-tuning, converted to int8; accuracy loss vs the float Keras model.
6. Cross-check with the ``litert-benchmark`` command (CompiledModel API) for float32 and int8.

    PYTHONPATH=. python bench/tflite_ptq.py [--repeats 5] [--out bench/results/tflite_ptq.json]
    PYTHONPATH=. python bench/tflite_ptq.py --smoke        # ~1 min, MNIST slice; used by a test
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
    CpuSample, QuietGate, environment, markdown_table, median, status, write_json_atomic)
from tfopt import config as config_lib  # noqa: E402
from tfopt._keras import keras, tf  # noqa: E402
from tfopt.export import benchmark as bench  # noqa: E402
from tfopt.export import fidelity, tflite  # noqa: E402
from tfopt.export.evaluate import TFLiteModel, evaluate, keras_outputs, load_split  # noqa: E402
from tfopt.runs import load_run  # noqa: E402

TARGETS = {  # B5: int8 >= 4x faster than float, >= 3.9x smaller, accuracy loss <= 0.3 pt (PTQ), <= 0.1 pt (QAT)
    "int8_speedup_xnnpack_1t": (">=", 4.0),
    "int8_size_ratio": (">=", 3.9),
    "int8_accuracy_loss_pt": ("<=", 0.3),
    "qat_int8_accuracy_loss_pt": ("<=", 0.1),
}
SETTINGS = (("xnnpack/1t", True, 1), ("xnnpack/2t", True, 2), ("builtin/1t", False, 1))


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    model: str = "cnn"
    epochs: int = 2
    limit: int = 0  # MNIST records per split (0 = full 50k/10k/10k)
    batch_size: int = 128
    calibration_steps: int = 25
    eval_limit: int = 0  # test examples scored (0 = all)
    repeats: int = 5
    runs: int = 300
    warmup: int = 30
    float_layers: tuple = ("conv0",)  # the extra int8 variant keeps these in float
    qat: bool = True
    qat_epochs: int = 1
    qat_lr: float = 1e-4
    litert: bool = True
    smoke: bool = False


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--no-qat", action="store_true")
    ap.add_argument("--no-litert", action="store_true")
    ap.add_argument("--no-gate", action="store_true", help="no quiet-gate (measure whatever the load)")
    ap.add_argument("--workdir", default=os.path.join(config_lib.default_data_dir(), "bench-b5"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                   "tflite_ptq.json"))
    ap.add_argument("--smoke", action="store_true", help="MNIST slice, 1 epoch, few runs: checks the script runs")
    a = ap.parse_args(argv)
    p = Params(repeats=a.repeats, runs=a.runs, warmup=a.warmup, epochs=a.epochs, qat=not a.no_qat,
               litert=not a.no_litert)
    if a.smoke:
        p = dataclasses.replace(p, epochs=1, limit=2000, batch_size=64, calibration_steps=2, eval_limit=300,
                                repeats=1, runs=20, warmup=2, smoke=True)
    gate = QuietGate(enabled=not (a.no_gate or a.smoke))
    return p, gate, a.out, a.workdir


def ensure_run(workdir: str, p: Params) -> str:
    """Trains the model once per (model, epochs, limit, batch) and reuses the run directory."""
    from tfopt.train import run as train

    run_dir = os.path.join(workdir, f"{p.model}-e{p.epochs}-l{p.limit}-b{p.batch_size}")
    if os.path.exists(os.path.join(run_dir, "run.json")):
        try:
            load_run(run_dir)
            return run_dir
        except Exception:  # written by an older tfopt: train again
            pass
    cfg = config_lib.from_dict({
        "data": {"dataset": "mnist", "limit": p.limit, "global_batch_size": p.batch_size},
        "model": {"name": p.model}, "runtime": {"strategy": "one_device"},
        "train": {"epochs": p.epochs, "output_dir": run_dir, "verbose": 0, "tensorboard": False}})
    train(cfg)
    return run_dir


def layer_microbench(model, p: Params) -> list[dict]:
    """Each Conv2D / Dense layer alone (same shapes and weights), float32 vs int8, XNNPACK, 1 thread."""
    rng = np.random.default_rng(0)
    rows = []
    for layer in model.layers:
        if not isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
            continue
        inputs = keras.Input(layer.input_shape[1:])
        clone = type(layer).from_config({**layer.get_config(), "dtype": "float32"})
        micro = keras.Model(inputs, clone(inputs))
        clone.set_weights(layer.get_weights())
        calib = [rng.random((8, *layer.input_shape[1:]), dtype=np.float32) for _ in range(4)]
        f32 = tflite.convert(micro, "float32").content
        i8 = tflite.convert(micro, "int8", calibration=calib).content
        t_f, t_i = [], []
        for _ in range(max(1, p.repeats)):
            t_f.append(bench.latency(f32, threads=1, runs=p.runs, warmup=p.warmup)["p50_ms"])
            t_i.append(bench.latency(i8, threads=1, runs=p.runs, warmup=p.warmup)["p50_ms"])
        shape = "x".join(str(d) for d in layer.input_shape[1:])
        rows.append({"layer": layer.name, "type": type(layer).__name__, "input": shape,
                     "float32_us": 1e3 * median(t_f), "int8_us": 1e3 * median(t_i),
                     "int8_speedup": median(f / i for f, i in zip(t_f, t_i))})
    return rows


def build_models(run, model, p: Params, bar) -> tuple[dict, list]:
    """All .tflite flatbuffers to compare: the five PTQ modes, the partial-float int8, and QAT int8."""
    calibration = tflite.calibration_batches(run.config.data, p.calibration_steps)
    models = {}
    for mode in tflite.MODES:
        bar.set_postfix_str(f"convert {mode}")
        models[mode] = {"content": tflite.convert(model, mode, calibration=calibration).content, "kind": "PTQ"}
        bar.update(1)
    bar.set_postfix_str("convert int8 partial")
    debugger = fidelity.quantization_debugger(model, calibration, calibration[:1])
    nodes = fidelity.nodes_for_layers(fidelity.rank_layers(debugger), list(p.float_layers))
    models[f"int8+float:{','.join(p.float_layers)}"] = {"content": fidelity.requantize(debugger, nodes),
                                                        "kind": "PTQ, selective"}
    bar.update(1)
    return models, calibration


def qat_model(run, model, p: Params):
    """tfmot QAT on the trained model: quantize_model + fine-tuning, then int8 conversion."""
    import tensorflow_model_optimization as tfmot

    from tfopt.data.pipeline import make_dataset

    qat = tfmot.quantization.keras.quantize_model(model)
    qat.compile(optimizer=keras.optimizers.Adam(p.qat_lr),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    started = time.perf_counter()
    data = run.config.data
    steps = run.data["splits"]["train"] // data.global_batch_size  # one pass of the training stream per epoch
    qat.fit(make_dataset(data, "train", training=True), epochs=p.qat_epochs, steps_per_epoch=steps, verbose=0)
    seconds = time.perf_counter() - started
    return qat, tflite.convert(qat, "int8").content, seconds


def measure(models: dict, p: Params, gate: QuietGate, bar) -> dict:
    """p50 per (model, setting) per round; models interleaved (order rotated) within every round."""
    names = list(models)
    per = {name: {key: [] for key, _, _ in SETTINGS} for name in names}
    for r in range(p.repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for key, xnnpack, threads in SETTINGS:
            def unit():
                with CpuSample() as s:
                    out = {n: bench.latency(models[n]["content"], threads=threads, warmup=p.warmup, runs=p.runs,
                                            xnnpack=xnnpack)["p50_ms"] for n in order}
                return out, [s.foreign]

            result = gate.run(unit)
            for n, v in result.items():
                per[n][key].append(v)
            bar.set_postfix_str(f"latency round {r + 1}/{p.repeats} {key}")
            bar.update(1)
    return per


def main(argv=None) -> int:
    p, gate, out, workdir = parse_args(argv)
    t_start = time.perf_counter()
    total = len(tflite.MODES) + 1 + p.repeats * len(SETTINGS) + 3
    with tqdm(total=total, desc="B5", unit="step", disable=None, file=sys.stderr) as bar:
        bar.set_postfix_str("training (once)")
        run = load_run(ensure_run(workdir, p))
        from tfopt.models.io import load_model

        model = load_model(run.model_path)
        models, _ = build_models(run, model, p, bar)
        qat_info = None
        if p.qat:
            bar.set_postfix_str("QAT fine-tune")
            qat, qat_content, qat_seconds = qat_model(run, model, p)
            models["qat-int8"] = {"content": qat_content, "kind": "QAT"}
            qat_info = {"epochs": p.qat_epochs, "lr": p.qat_lr, "fine_tune_seconds": round(qat_seconds, 1)}
        bar.update(1)
        bar.set_postfix_str("evaluating on the test split")
        x, y = load_split(run.config.data, "test", p.eval_limit)
        reference = keras_outputs(model, x)
        keras_acc = float(np.mean(reference.argmax(-1) == y))
        for name, m in models.items():
            ref = keras_outputs(qat, x) if name == "qat-int8" else reference
            m["eval"] = evaluate(TFLiteModel(m["content"]), x, y, ref).to_dict()
            m["loss_vs_float_keras_pt"] = round(100 * (keras_acc - m["eval"]["accuracy"]), 3)
            m.update(bench.file_sizes(m["content"]))
            m["kernels"] = bench.latency(m["content"], threads=1, runs=1, warmup=0)["kernels"]
        if qat_info is not None:
            qat_info["keras_qat_accuracy"] = models["qat-int8"]["eval"]["keras_accuracy"]
        bar.update(1)
        per = measure(models, p, gate, bar)
        bar.set_postfix_str("per-layer kernels")
        layers = layer_microbench(model, p)
        litert = {}
        if p.litert:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                for name in ("float32", "int8"):
                    path = os.path.join(tmp, f"{name}.tflite")
                    with open(path, "wb") as f:
                        f.write(models[name]["content"])
                    litert[name] = bench.litert_benchmark(path, threads=1, runs=p.runs, warmup=p.warmup)
        bar.update(1)
    res = summarize(run, model, p, models, per, keras_acc, layers, litert, qat_info)
    res["quiet_gate"] = gate.summary()
    res["environment"] = environment(tf)
    res["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    text = report(res)
    res["table_markdown"] = text
    write_json_atomic(out, res)
    print(text)
    print(f"\n[B5] {res['wall_seconds']:.0f} s wall; JSON written to {out}")
    return 0


def summarize(run, model, p, models, per, keras_acc, layers, litert, qat_info) -> dict:
    base = per["float32"]
    rows = {}
    for name, m in models.items():
        lat = {}
        for key, _, _ in SETTINGS:
            lat[key] = {"p50_ms": median(per[name][key]), "rounds": per[name][key],
                        "speedup_vs_float32": median(f / v for f, v in zip(base[key], per[name][key]))}
        rows[name] = {"kind": m["kind"], "size_bytes": m["size_bytes"], "gzip_bytes": m["gzip_bytes"],
                      "size_ratio_vs_float32": models["float32"]["size_bytes"] / m["size_bytes"],
                      "eval": m["eval"], "accuracy_loss_vs_float_keras_pt": m["loss_vs_float_keras_pt"],
                      "latency": lat, "kernels": m["kernels"]}
    measured = {
        "int8_speedup_xnnpack_1t": rows["int8"]["latency"]["xnnpack/1t"]["speedup_vs_float32"],
        "int8_size_ratio": rows["int8"]["size_ratio_vs_float32"],
        "int8_accuracy_loss_pt": rows["int8"]["accuracy_loss_vs_float_keras_pt"],
        "qat_int8_accuracy_loss_pt": rows["qat-int8"]["accuracy_loss_vs_float_keras_pt"] if "qat-int8" in rows else None,
    }
    targets = {}
    for k, (op, v) in TARGETS.items():
        got = measured[k]
        ok = None if got is None or got != got else (got >= v if op == ">=" else got <= v)
        targets[k] = {"op": op, "value": v, "measured": got, "pass": ok}
    return {"benchmark": "B5 TFLite PTQ", "params": dataclasses.asdict(p), "run": run.path,
            "model": {"name": p.model, **bench.keras_cost(model)}, "keras_test_accuracy": keras_acc,
            "test_examples": int(models["float32"]["eval"]["examples"]), "models": rows, "targets": targets,
            "layer_kernels": layers, "litert_benchmark_1t": litert, "qat": qat_info}


def report(res: dict) -> str:
    rows = []
    for name, r in res["models"].items():
        lat = r["latency"]
        rows.append([name, f"{r['size_bytes'] / 1024:.1f}", f"{r['gzip_bytes'] / 1024:.1f}",
                     f"{r['size_ratio_vs_float32']:.2f}x",
                     *[f"{lat[k]['p50_ms'] * 1e3:.1f} ({lat[k]['speedup_vs_float32']:.2f}x)" for k, _, _ in SETTINGS],
                     f"{100 * r['eval']['accuracy']:.2f}", f"{-r['accuracy_loss_vs_float_keras_pt']:+.2f}",
                     f"{100 * r['eval']['agreement']:.2f}"])
    head = (f"## B5 TFLite PTQ: {res['model']['name']} ({res['model']['params']:,} params, "
            f"{res['model']['flops'] / 1e6:.1f} MFLOPs/image), MNIST test n={res['test_examples']}, "
            f"Keras accuracy {100 * res['keras_test_accuracy']:.2f}%; p50 at batch 1, median of "
            f"{res['params']['repeats']} interleaved rounds x {res['params']['runs']} runs")
    main = markdown_table(["model", "size KiB", "gzip KiB", "smaller", *[f"p50 {k} us (speedup)" for k, _, _ in SETTINGS],
                           "test acc %", "Δ vs Keras pt", "agreement %"], rows)
    trows = [[k, f"{t['op']} {t['value']}", "-" if t["measured"] is None else f"{t['measured']:.3g}",
              status(t["pass"])] for k, t in res["targets"].items()]
    targets = markdown_table(["target", "bar", "measured", "status"], trows)
    lrows = [[r["layer"], r["type"], r["input"], f"{r['float32_us']:.1f}", f"{r['int8_us']:.1f}",
              f"{r['int8_speedup']:.2f}x"] for r in res["layer_kernels"]]
    layers = markdown_table(["layer", "type", "input", "float32 us", "int8 us", "int8 speedup"], lrows)
    lit = ", ".join(f"{k}: p50 {v['p50_ms']} ms" for k, v in res["litert_benchmark_1t"].items() if v) or "not run"
    kern = res["models"]["int8"]["kernels"]
    return "\n\n".join([head, main, "### Targets", targets,
                        f"### Which kernels run (XNNPACK, 1 thread; int8 model: {kern['delegated_ops']}/"
                        f"{kern['total_ops']} ops delegated in {kern['delegate_partitions']} partition(s))", layers,
                        f"litert-benchmark cross-check (1 thread): {lit}"])


if __name__ == "__main__":
    sys.exit(main())
