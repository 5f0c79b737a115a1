"""Benchmark B6 (distillation): a small student from scratch vs distilled from one and two teachers.

Protocol (one run, side by side, on real MNIST; see BENCHMARKS.md row B6 and PITFALLS "Distillation"):

1. Teachers: two default ``cnn`` models (~220k parameters, dropout 0.25, seeds 100 and 101)
   trained 3 epochs on the full 50k training split (no augmentation; ``--teacher-augment shift``
   trains them on shifted images instead). They must be clearly better than the student, or a
   gap-closed figure means nothing: their test accuracies are printed beside it.
2. Regime (where soft targets are known to help, Hinton et al. 2015 sec. 3 and 6): the student,
   ``tiny_cnn`` (~20k parameters, 11x fewer than a teacher), sees only a small labelled subset
   (default 1,000 images, 2% of the split, a different random subset per seed) for a long,
   fixed budget (150 epochs: distillation gains grow with the schedule, Beyer et al. 2022), with
   the same shift augmentation: the teacher labels every shifted view the student sees.
3. Per seed, from the SAME initial weights, subset, batch order, shifts and schedule:
   scratch (labels only) / distilled from teacher A / distilled from teachers A+B (probabilities
   mixed with weights from their validation accuracy). Accuracies on the full 10k test split.
4. Gap closed = (distilled - scratch) / (teacher - scratch), per seed, then mean and spread; the
   multi-teacher reference is the two teachers' combined soft target. For reference, the
   student architecture trained on all 50k labels (``ceiling_epochs``) shows how much of the
   gap is capacity that no teacher can transfer into 20k parameters.

    PYTHONPATH=. python bench/distillation.py [--seeds 3] [--out bench/results/distillation.json]
    PYTHONPATH=. python bench/distillation.py --smoke     # tiny and fast; used by a test
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a script: make `bench._common` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._common import environment, markdown_table, status, usable_cores, write_json_atomic  # noqa: E402
from tfopt._keras import keras, tf  # noqa: E402
from tfopt.config import DataConfig  # noqa: E402
from tfopt.data import pipeline, sources  # noqa: E402
from tfopt.models.distiller import Distiller, accuracy_weights, teacher_log_probs  # noqa: E402
from tfopt.models.registry import build_model  # noqa: E402

TARGETS = {"gap_closed_mean": (">=", 0.9), "multi_minus_single_pt": (">=", 0.0)}
SCCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    seeds: int = 3
    labeled: int = 1000  # student's labelled subset of the training split
    student: str = "tiny_cnn"
    student_epochs: int = 150  # long schedules favour distillation ("patient" teachers, Beyer et al. 2022)
    student_lr: float = 3e-3
    teacher: str = "cnn"
    teacher_epochs: int = 3
    teacher_lr: float = 1e-3
    ceiling_epochs: int = 5  # the student on all 50k labels: a reference for what its capacity allows
    temperature: float = 8.0
    alpha: float = 0.9
    batch_size: int = 64
    teacher_batch_size: int = 128
    steps_per_execution: int = 16  # per-step Keras overhead dominates a 20k-parameter student
    augment: str = "shift"  # students' augmentation: none | shift (+-2 px)
    teacher_augment: str = "none"  # teachers' augmentation: none | shift
    limit: int = 0  # 0 = full MNIST (50k/10k/10k); smoke runs use a slice
    smoke: bool = False


SMOKE = dict(seeds=1, labeled=128, student_epochs=2, teacher="tiny_cnn", teacher_epochs=1, ceiling_epochs=1, limit=3000,
             smoke=True)


def _arrays(cfg: DataConfig, info, split: str):
    xs, ys = zip(*pipeline.make_dataset(cfg, split, training=False, info=info))
    return np.concatenate(xs), np.concatenate(ys)


def _dataset(x, y, seed: int, batch_size: int, augment: str):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(batch_size)
    return ds.apply(pipeline.shift_augment(seed)) if augment == "shift" else ds


def _adam(lr: float, steps: int):
    return keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(lr, max(1, steps)))


def _logits(model, x):
    return model.predict(x, batch_size=1000, verbose=0)


def _acc(logits, y) -> float:
    return float(np.mean(np.argmax(logits, -1) == y))


def _fit_plain(name: str, x, y, p: Params, seed: int, epochs: int, lr: float, batch_size: int, weights=None,
               dropout: float = 0.0, augment: str | None = None):
    keras.utils.set_random_seed(seed)
    model = build_model(name, x.shape[1:], 10, dropout=dropout)
    if weights is not None:
        model.set_weights(weights)
    model.compile(_adam(lr, -(-len(x) // batch_size) * epochs), SCCE, steps_per_execution=p.steps_per_execution)
    model.fit(_dataset(x, y, seed, batch_size, p.augment if augment is None else augment), epochs=epochs, verbose=0)
    return model


def _fit_distilled(x, y, p: Params, seed: int, init, teachers, weights):
    student = build_model(p.student, x.shape[1:], 10, dropout=0.0)
    student.set_weights(init)
    distiller = Distiller(student, teachers, temperature=p.temperature, alpha=p.alpha, teacher_weights=weights)
    distiller.compile(_adam(p.student_lr, -(-len(x) // p.batch_size) * p.student_epochs),
                      steps_per_execution=p.steps_per_execution)
    keras.utils.set_random_seed(seed)  # the same batch order and shifts as the scratch run
    distiller.fit(_dataset(x, y, seed, p.batch_size, p.augment), epochs=p.student_epochs, verbose=0)
    return student


def _stats(values):
    vals = [v for v in values if v is not None]
    return {"mean": statistics.mean(vals) if vals else None,
            "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals) if vals else None, "max": max(vals) if vals else None, "values": list(values)}


def run(p: Params) -> dict:
    """Runs the whole protocol; returns the JSON payload."""
    cfg = DataConfig(dataset="mnist", limit=p.limit, global_batch_size=1000,
                     num_shards=4 if p.limit else DataConfig.num_shards)
    info = sources.prepare(cfg)
    (xtr, ytr), (xva, yva), (xte, yte) = (_arrays(cfg, info, s) for s in ("train", "validation", "test"))
    units = 2 + 1 + 3 * p.seeds
    bar = tqdm(total=units, desc="B6 distillation", unit="fit", file=sys.stdout, disable=None)
    started = time.perf_counter()
    seconds: dict[str, list[float]] = {}

    def timed(key, fn):
        t0 = time.perf_counter()
        out = fn()
        seconds.setdefault(key, []).append(round(time.perf_counter() - t0, 2))
        bar.update(1)
        return out

    teachers = [timed("teacher", lambda s=s: _fit_plain(p.teacher, xtr, ytr, p, 100 + s, p.teacher_epochs,
                                                         p.teacher_lr, p.teacher_batch_size, dropout=0.25,
                                                         augment=p.teacher_augment))
                for s in range(2)]
    t_test = [_logits(t, xte) for t in teachers]
    t_acc = [_acc(z, yte) for z in t_test]
    t_val_acc = [_acc(_logits(t, xva), yva) for t in teachers]
    multi_w = accuracy_weights(t_val_acc, 10)
    ens_acc = _acc(teacher_log_probs(t_test, multi_w, p.temperature).numpy(), yte)
    ceiling = timed("ceiling", lambda: _fit_plain(p.student, xtr, ytr, p, 7, p.ceiling_epochs, p.student_lr,
                                                  p.batch_size))
    ceiling_acc = _acc(_logits(ceiling, xte), yte)

    rows = []
    for seed in range(p.seeds):
        idx = np.random.default_rng(seed).choice(len(xtr), min(p.labeled, len(xtr)), replace=False)
        x, y = xtr[idx], ytr[idx]
        keras.utils.set_random_seed(seed)
        init = build_model(p.student, x.shape[1:], 10, dropout=0.0).get_weights()
        scratch = timed("scratch", lambda: _fit_plain(p.student, x, y, p, seed, p.student_epochs, p.student_lr,
                                                      p.batch_size, init))
        single = timed("single", lambda: _fit_distilled(x, y, p, seed, init, teachers[:1], None))
        multi = timed("multi", lambda: _fit_distilled(x, y, p, seed, init, teachers, multi_w))
        a = {k: _acc(_logits(m, xte), yte) for k, m in (("scratch", scratch), ("single", single), ("multi", multi))}

        def closed(acc, ref):
            return (acc - a["scratch"]) / (ref - a["scratch"]) if ref > a["scratch"] else None

        rows.append({"seed": seed, **{f"{k}_acc": v for k, v in a.items()},
                     "gap_closed_single": closed(a["single"], t_acc[0]),
                     "gap_closed_multi": closed(a["multi"], ens_acc),
                     "gap_closed_multi_vs_teacher_a": closed(a["multi"], t_acc[0]),
                     "ceiling_gap": closed(ceiling_acc, t_acc[0]),
                     "multi_minus_single_pt": 100 * (a["multi"] - a["single"])})
    bar.close()
    summary = {k: _stats([r[k] for r in rows]) for k in rows[0] if k != "seed"}
    measured = {"gap_closed_mean": summary["gap_closed_single"]["mean"],
                "multi_minus_single_pt": summary["multi_minus_single_pt"]["mean"]}
    targets = {}
    for key, (op, bar_value) in TARGETS.items():
        value = measured[key]
        ok = None if value is None else (value >= bar_value if op == ">=" else value <= bar_value)
        targets[key] = {"measured": value, "op": op, "target": bar_value, "pass": ok}
    student_params = build_model(p.student, xtr.shape[1:], 10, dropout=0.0).count_params()
    return {
        "benchmark": "B6 distillation",
        "params": dataclasses.asdict(p),
        "environment": environment(tf),
        "data": {"train": len(xtr), "validation": len(xva), "test": len(xte),
                 "labeled_subset": min(p.labeled, len(xtr))},
        "models": {"teacher": p.teacher, "teacher_params": int(teachers[0].count_params()),
                   "student": p.student, "student_params": int(student_params)},
        "teachers": {"test_accuracy": t_acc, "val_accuracy": t_val_acc, "multi_weights": multi_w,
                     "combined_test_accuracy": ens_acc},
        "student_ceiling_test_accuracy": ceiling_acc,
        "per_seed": rows,
        "summary": summary,
        "targets": targets,
        "seconds": {"total": round(time.perf_counter() - started, 1), **seconds},
    }


def _pct(x):
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _ms(s, scale=1.0, digits=2):
    if s["mean"] is None:
        return "n/a"
    return f"{scale * s['mean']:.{digits}f} ± {scale * s['stdev']:.{digits}f}"


def report(res: dict) -> str:
    """The markdown tables printed at the end (and pasted into the README)."""
    s, t, p = res["summary"], res["teachers"], res["params"]
    n = len(res["per_seed"])
    seeds = lambda k, f: ", ".join(f(v) for v in s[k]["values"])  # noqa: E731
    fmt2 = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    head = ["B6 distillation", f"measured (mean ± sd over {n} seeds)", "per seed", "target", "status"]
    rows = [
        ["teacher A / B test accuracy", f"{_pct(t['test_accuracy'][0])} / {_pct(t['test_accuracy'][1])}", "", "", ""],
        ["A+B combined target accuracy", _pct(t["combined_test_accuracy"]), "", "", ""],
        [f"student from scratch ({p['labeled']} labels)", _ms(s["scratch_acc"], 100) + " %",
         seeds("scratch_acc", _pct), "", ""],
        ["student distilled from A", _ms(s["single_acc"], 100) + " %", seeds("single_acc", _pct), "", ""],
        ["student distilled from A+B", _ms(s["multi_acc"], 100) + " %", seeds("multi_acc", _pct), "", ""],
        ["gap closed, A (distilled-scratch)/(teacher-scratch)", _ms(s["gap_closed_single"]),
         seeds("gap_closed_single", fmt2), ">= 0.9", status(res["targets"]["gap_closed_mean"]["pass"])],
        ["gap closed, A+B (vs combined target)", _ms(s["gap_closed_multi"]), seeds("gap_closed_multi", fmt2), "", ""],
        ["multi - single teacher (pt)", _ms(s["multi_minus_single_pt"]), seeds("multi_minus_single_pt", fmt2),
         ">= 0", status(res["targets"]["multi_minus_single_pt"]["pass"])],
        [f"reference: student on all labels ({p['ceiling_epochs']} ep) / its gap",
         f"{_pct(res['student_ceiling_test_accuracy'])} / {_ms(s['ceiling_gap'])}", "", "", ""],
    ]
    m = res["models"]
    note = (f"teacher {m['teacher']} ({m['teacher_params']:,} params) x2, student {m['student']} "
            f"({m['student_params']:,} params); {p['labeled']} labelled images, {p['student_epochs']} epochs, "
            f"T={p['temperature']}, alpha={p['alpha']}, student augment={p['augment']}, teacher augment="
            f"{p['teacher_augment']}; {res['seconds']['total']:.0f} s on "
            f"{res['environment']['usable_cores']} cores")
    return markdown_table(head, rows) + "\n" + note


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Params()
    for f in dataclasses.fields(Params):
        if f.name == "smoke":
            continue
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(defaults, f.name)),
                            default=getattr(defaults, f.name))
    parser.add_argument("--smoke", action="store_true", help="tiny data and budgets: checks the script runs")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                      "distillation.json"))
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")  # one fresh model per fit: tf.function retracing notices are expected
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Params) if f.name != "smoke"}
    if args.smoke:
        values.update(SMOKE)
    p = Params(**values)
    print(f"B6: {p.seeds} seeds x (scratch, distilled A, distilled A+B) + 2 teachers + ceiling "
          f"on {usable_cores()} cores", flush=True)
    res = run(p)
    print(report(res))
    write_json_atomic(args.out, res)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
