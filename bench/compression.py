"""Benchmark B4 (compression): float .tflite vs pruned+int8 and clustered+int8, gzip sizes and accuracy.

What it does, in one run on one machine (row B4 of /work/shared/design/BENCHMARKS.md):

1. Trains (once, then reuses from ``--workdir``) the default ``cnn`` on real MNIST (50k train
   images) with ``tfopt.train``, or starts from ``--from RUN``.
2. Per repeat (a different data order / dropout seed), fine-tunes it with ``tfopt.optimize`` in
   one job (Adam 5e-4, cosine-decayed over each phase): ``prune`` (8 epochs, PolynomialDecay
   0 -> 0.8 over the first two thirds, every kernel but the first convolution's 288 weights:
   79.9% of all kernel weights), the same with 4x1 blocks in the Dense kernels (runs of 4
   inputs, contiguous in TFLite's layout, so they compress better), ``cluster`` (1 epoch, 16
   clusters, k-means++), ``pqat`` (each pruning, then 1 epoch of prune-preserving QAT) and
   ``pcqat`` (the unstructured pruning, 1 epoch of sparsity-preserving clustering, 1 epoch of
   sparsity-and-cluster-preserving QAT). pqat and pcqat reuse the pruning phase of the same job.
3. Converts with ``tfopt.export`` (the code behind ``python -m tfopt.export``): the float model
   without optimizations (the baseline), the float model as full-integer int8 PTQ (for
   reference), the pruned and the clustered models as full-integer int8 PTQ (calibrated on 25
   batches of the run's training pipeline, the export default), and the PQAT / PCQAT models as
   int8 from their learned ranges. Sparse tensor encoding is used where it is smaller.
4. Measures each ``.tflite``: bytes, gzip -9 bytes, the ratio float-gzip / variant-gzip, and its
   accuracy on the 10k test images with the LiteRT interpreter; accuracy deltas are against the
   float ``.tflite``.

Sizes are deterministic for a given model; accuracies vary with the fine-tuning seed, so the
table reports the median over ``--repeats`` (and the JSON every repeat).

    PYTHONPATH=. python bench/compression.py [--repeats 2] [--out bench/results/compression.json]
    PYTHONPATH=. python bench/compression.py --smoke --from RUN_DIR     # seconds; used by a test
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `bench._common` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._common import environment, markdown_table, median, status, write_json_atomic  # noqa: E402
from tfopt import config as C  # noqa: E402
from tfopt._keras import keras, tf  # noqa: E402

ANCHORS = {"pruned_int8": "tfmot: ~10x pruned+quantized", "clustered_int8": "tfmot: ~8x clustered+quantized"}
VARIANTS = ("float", "int8", "pruned_int8", "pqat_int8", "block_pruned_int8", "block_pqat_int8", "clustered_int8",
            "pcqat_int8")
LABELS = {"float": "float32 (baseline)", "int8": "int8 PTQ only", "pruned_int8": "pruned 80% + int8 PTQ",
          "pqat_int8": "pruned 80% + PQAT int8", "block_pruned_int8": "pruned 80% (4x1 blocks) + int8 PTQ",
          "block_pqat_int8": "pruned 80% (4x1 blocks) + PQAT int8", "clustered_int8": "clustered 16 + int8 PTQ",
          "pcqat_int8": "pruned 80% + clustered 16 + PCQAT int8"}
# (variant, technique, Dense block size): 4x1 blocks are runs of 4 inputs, contiguous in TFLite.
FINE_TUNED = (("pruned_int8", "prune", (1, 1)), ("pqat_int8", "pqat", (1, 1)), ("block_pruned_int8", "prune", (4, 1)),
              ("block_pqat_int8", "pqat", (4, 1)), ("clustered_int8", "cluster", (1, 1)),
              ("pcqat_int8", "pcqat", (1, 1)))
# The first convolution (288 weights, 0.1% of the model) is left dense, as the tfmot guides
# advise: 80% of its 9 weights per filter would cost accuracy and save nothing.
PRUNED_LAYERS = ("conv1", "fc", "logits")


def _base_config(workdir: str, smoke: bool) -> C.RunConfig:
    data = {"dataset": "mnist", "global_batch_size": 128, "num_shards": 8}
    train = {"epochs": 4, "output_dir": os.path.join(workdir, "base"), "verbose": 0, "tensorboard": False}
    if smoke:
        data.update(limit=2000, global_batch_size=64, num_shards=4)
        train.update(epochs=1)
    return C.from_dict({"data": data, "model": {"name": "tiny_cnn" if smoke else "cnn"},
                        "runtime": {"strategy": "one_device"}, "train": train})


def _base_run(args) -> str:
    if args.source:
        return args.source
    cfg = _base_config(args.workdir, args.smoke)
    path = cfg.train.output_dir
    if not os.path.isfile(os.path.join(path, "run.json")):
        from tfopt.train import run as train

        print(f"B4: training the base {cfg.model.name} ({cfg.train.epochs} epochs) into {path}", file=sys.stderr)
        train(cfg)
    return path


def _fine_tune(run_dir: str, out_dir: str, repeat: int, smoke: bool) -> dict:
    """Runs prune, cluster, pqat and pcqat in one tfopt.optimize job; returns {technique: output dir}."""
    from dataclasses import replace

    from tfopt.optimize.common import Selection
    from tfopt.optimize.cli import build_parser, resolve_config, settings_for
    from tfopt.optimize.runner import run as run_optimize
    from tfopt.runs import load_run

    run = load_run(run_dir)
    names = sorted({technique for _, technique, _ in FINE_TUNED})
    argv = ["--from", run_dir, "--technique", ",".join(names), "--strategy", "one_device", "--precision", "float32",
            "--quiet", "--no-saved-model", "--no-tensorboard", "--sparsity", "0.8", "--schedule", "polynomial",
            "--clusters", "16", "--lr", "5e-4", "--epochs", "1", "--phase-epochs", "prune=1" if smoke else "prune=8",
            "--set", f"data.seed={1000 + repeat}"]
    if smoke:
        argv += ["--steps-per-epoch", "8", "--set", "train.steps_per_execution=1"]
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args, run.config)
    keras.utils.set_random_seed(1000 + repeat)
    settings = []
    for _, technique, block in FINE_TUNED:
        s = settings_for(args, technique)
        prune = replace(s.prune, block_size=block)
        settings.append(replace(s, prune=prune if smoke else replace(prune, selection=Selection(names=PRUNED_LAYERS))))
    outs = [os.path.join(out_dir, f"r{repeat}-{variant}") for variant, _, _ in FINE_TUNED]
    results = run_optimize(run_dir, cfg, settings, outs, keep_going=False)
    return {variant: r["output"] for (variant, _, _), r in zip(FINE_TUNED, results)}


def _convert(model, mode: str, calibration=None) -> bytes:
    """The ``tfopt.export`` conversion (sparse encoding when it is smaller, as ``python -m tfopt.export`` does)."""
    from tfopt.export.tflite import convert

    return convert(model, mode, calibration=calibration).content


def _accuracy(tflite: bytes, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=tflite, num_threads=2)
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    correct = 0
    for start in range(0, len(x), batch):
        xb = x[start:start + batch]
        interpreter.resize_tensor_input(inp["index"], list(xb.shape))
        interpreter.allocate_tensors()
        interpreter.set_tensor(inp["index"], xb.astype(np.float32))
        interpreter.invoke()
        correct += int((interpreter.get_tensor(out["index"]).argmax(-1) == y[start:start + batch]).sum())
    return correct / len(x)


def _arrays(cfg: C.RunConfig, split: str, limit: int | None = None):
    from tfopt.data import pipeline

    xs, ys = [], []
    for xb, yb in pipeline.make_dataset(cfg.data, split, training=False):
        xs.append(xb.numpy())
        ys.append(yb.numpy())
    x, y = np.concatenate(xs), np.concatenate(ys)
    return (x[:limit], y[:limit]) if limit else (x, y)


def _measure(tflite: bytes, x, y) -> dict:
    return {"bytes": len(tflite), "gzip_bytes": len(gzip.compress(tflite, 9)), "accuracy": _accuracy(tflite, x, y)}


def run(args) -> dict:
    from tfopt.optimize.quantize import load_quantized_model
    from tfopt.runs import load_run

    started = time.perf_counter()
    base_dir = _base_run(args)
    base = load_run(base_dir)
    cfg = base.config
    x_test, y_test = _arrays(cfg, "test", 1000 if args.smoke else None)
    from tfopt.export.tflite import calibration_batches

    calibration = calibration_batches(cfg.data, 4 if args.smoke else 25)
    from tfopt.models.io import load_model

    model = load_model(base.model_path)
    units = 2 + len(FINE_TUNED) * args.repeats
    per_repeat = []
    with tqdm(total=units, desc="B4", unit="model", disable=None, file=sys.stderr) as bar:
        float_row = _measure(_convert(model, "float32"), x_test, y_test)
        bar.update()
        int8_row = _measure(_convert(model, "int8", calibration), x_test, y_test)
        bar.update()
        for repeat in range(args.repeats):
            outs = _fine_tune(base_dir, os.path.join(args.workdir, "optimized"), repeat, args.smoke)
            rows = {}
            for variant, technique, _ in FINE_TUNED:
                opt = load_quantized_model(os.path.join(outs[variant], "model.keras"))
                qat = technique.endswith("qat")
                rows[variant] = _measure(_convert(opt, "int8", None if qat else calibration), x_test, y_test)
                rows[variant]["keras_run"] = outs[variant]
                bar.update()
            per_repeat.append(rows)
    return _summarize(args, base_dir, float_row, int8_row, per_repeat, time.perf_counter() - started)


def _summarize(args, base_dir, float_row, int8_row, per_repeat, seconds) -> dict:
    fgz = float_row["gzip_bytes"]
    variants = {"float": dict(float_row, ratio=1.0, delta_pt=0.0), "int8": dict(int8_row)}
    variants["int8"].update(ratio=round(fgz / int8_row["gzip_bytes"], 2),
                            delta_pt=round(100 * (int8_row["accuracy"] - float_row["accuracy"]), 3))
    for name, _, _ in FINE_TUNED:
        rows = [r[name] for r in per_repeat]
        variants[name] = {
            "bytes": int(median(r["bytes"] for r in rows)), "gzip_bytes": int(median(r["gzip_bytes"] for r in rows)),
            "ratio": round(median(fgz / r["gzip_bytes"] for r in rows), 2),
            "accuracy": median(r["accuracy"] for r in rows),
            "delta_pt": round(median(100 * (r["accuracy"] - float_row["accuracy"]) for r in rows), 3),
            "repeats": rows}
    targets = {}
    for name in ("pruned_int8", "pqat_int8", "block_pruned_int8", "block_pqat_int8"):  # all "pruned (80%) + int8"
        ratio, loss = variants[name]["ratio"], -variants[name]["delta_pt"]
        targets[f"{name}_ratio"] = {"measured": ratio, "target": ">= 12", "pass": ratio >= 12.0}
        targets[f"{name}_loss_pt"] = {"measured": round(loss, 3), "target": "<= 0.3", "pass": loss <= 0.3}
    return {"benchmark": "B4 compression", "params": {"smoke": args.smoke, "repeats": args.repeats,
                                                    "base_run": os.path.abspath(base_dir)},
            "environment": environment(tf), "variants": variants, "targets": targets,
            "seconds": round(seconds, 1)}


def _table(res: dict) -> str:
    rows = []
    t = res["targets"]
    for name in VARIANTS:
        v = res["variants"][name]
        target, verdict = "", ""
        if f"{name}_ratio" in t:
            target = ">= 12x, loss <= 0.3 pt"
            verdict = f"size {status(t[f'{name}_ratio']['pass'])}, loss {status(t[f'{name}_loss_pt']['pass'])}"
        rows.append([f"B4 {LABELS[name]}", f"{v['bytes']:,}", f"{v['gzip_bytes']:,}", f"{v['ratio']:.2f}x",
                     f"{100 * v['accuracy']:.2f}%", f"{v['delta_pt']:+.2f}", ANCHORS.get(name, ""), target, verdict])
    header = ["variant", ".tflite bytes", "gzip bytes", "smaller (gzip)", "test acc", "delta pt", "anchor",
              "target", "pass/miss"]
    return markdown_table(header, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2, help="fine-tunings per variant (default 2; median reported)")
    ap.add_argument("--from", dest="source", help="start from this run instead of training the base CNN")
    ap.add_argument("--workdir", default=None, help="where the base run and the optimized runs go "
                    "(default: $TMPDIR/tfopt-bench-compression)")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/compression.json)")
    ap.add_argument("--smoke", action="store_true", help="tiny model and data, 1 repeat: runs in seconds (for tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats = 1
    args.workdir = args.workdir or os.path.join(tempfile.gettempdir(), "tfopt-bench-compression" +
                                                ("-smoke" if args.smoke else ""))
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compression.json")
    res = run(args)
    print(_table(res))
    print(f"\nB4: {res['params']['repeats']} repeat(s), medians; accuracy on "
          f"{'1,000' if args.smoke else 'the 10,000'} real MNIST test images with LiteRT; {res['seconds']:.0f} s")
    write_json_atomic(out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
