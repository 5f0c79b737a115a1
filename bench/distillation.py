"""Benchmark B6 (distillation): a small student from scratch vs distilled from one and two teachers.

Protocol (one run, side by side, on real MNIST; BENCHMARKS.md row B6, PITFALLS "Distillation"):

1. Teachers A and B: the main job's recipe (``cnn``, ~220k parameters, 3 epochs on the 50k
   labelled training images, batch 128, Adam 1e-3 cosine, dropout 0.25; seeds 100 and 101).
2. The setting (Hinton et al. 2015 sec. 6: soft targets carry most when labels are scarce): the
   student, ``small_cnn`` (~15k parameters, 15x fewer; the student of the ``mnist_edge``
   pipeline), has a labelled subset of ``labeled`` (1,000) training images, a different random
   subset per seed, and a budget of ``steps`` updates of batch 64, whatever it trains on.
   ``--student tiny_cnn`` (one convolution, ~20k parameters) is capacity-bound here: trained on
   all 50k labels for the same steps it reaches 98.0%, below the teacher.
3. Selection, on the 10k VALIDATION split only, at a selection seed of its own (``selection_seed``:
   its subset and initial weights are used by no reported run). Each arm keeps its best validation
   accuracy; the scratch arm gets more configurations than the distilled one:
   - scratch (labels only): learning rate x augmentation (none / +-2 px shifts), 6 configurations;
   - distilled from A: transfer set x learning rate (3e-3, 1e-2), 4 configurations. Transfer set
     ``labeled``: the labelled subset, loss 0.9 x teacher (T=4) + 0.1 x labels; ``all``: the 50k
     training images with the teacher's soft targets alone (T=2, alpha=1: no label is read,
     "function matching", Beyer et al. 2022). Both shift every image (+-2 px) and the teacher
     labels the very view the student sees.
4. Per reported seed, from the SAME initial weights and labelled subset: scratch (its chosen
   recipe), distilled from A and from A+B (the chosen recipe; teachers mixed as probabilities with
   weights from their validation accuracy; tfopt's library ``Distiller``), and the peer: keras.io's
   "Knowledge Distillation" recipe (``bench/peers/keras_distillation.py``: alpha=0.1 on the labels,
   T=10, Adam 1e-3, batch 32) distilling A on the labelled subset, the same examples seen.
   Accuracies on the 10k TEST split, read once, after all choices were made.
5. Gap closed = (distilled - scratch) / (teacher - scratch) per seed; A+B against the two
   teachers' combined soft target. For reference, the student trained on all 50k labels for the
   same steps shows how much of the gap is capacity that no teacher can transfer.

    PYTHONPATH=. python bench/distillation.py [--seeds 3] [--out bench/results/distillation.json]
    PYTHONPATH=. python bench/distillation.py --smoke     # tiny and fast; used by a test
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench._common import figure, markdown_table, publish, result, script_parser, usable_cores  # noqa: E402
from bench.peers import keras_distillation as peer  # noqa: E402
from tfopt import keras, tf  # noqa: E402
from tfopt.config import DataConfig  # noqa: E402
from tfopt.data import make_dataset, prepare, shift_augment  # noqa: E402
from tfopt.models import (  # noqa: E402
    Distiller,
    accuracy_weights,
    build_model,  # noqa: E402
    teacher_log_probs,
)

SCCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
ANCHOR = "Hinton et al. 2015, MNIST: distillation closed ~0.91 of the gap"
SCRATCH_GRID = tuple(
    {"lr": lr, "augment": aug} for lr in (1e-3, 3e-3, 1e-2) for aug in ("none", "shift")
)
# Transfer set x learning rate; T=4 with labels (the CLI's former default), T=2 for the soft targets alone.
DISTILL_GRID = tuple(
    {
        "transfer": transfer,
        "temperature": 4.0 if transfer == "labeled" else 2.0,
        "alpha": 0.9 if transfer == "labeled" else 1.0,
        "lr": lr,
        "augment": "shift",
    }
    for transfer in ("labeled", "all")
    for lr in (3e-3, 1e-2)
)


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    seeds: int = 3
    labeled: int = 1000  # the student's labelled subset of the training split
    student: str = "small_cnn"
    steps: int = (
        1600  # student updates of batch_size, for every arm (~100 passes over 1,000 images)
    )
    batch_size: int = 64
    teacher: str = "cnn"
    teacher_epochs: int = 3
    teacher_lr: float = 1e-3
    teacher_batch_size: int = 128
    steps_per_execution: int = 16  # per-step Keras overhead dominates a 15k-parameter student
    selection_seed: int = (
        99  # the selection's subset and initial weights (no reported run uses them)
    )
    limit: int = 0  # 0 = full MNIST (50k/10k/10k); smoke runs use a slice
    smoke: bool = False


SMOKE = dict(
    seeds=1, labeled=128, steps=24, teacher="tiny_cnn", teacher_epochs=1, limit=2000, smoke=True
)


def _arrays(cfg: DataConfig, info, split: str):
    xs, ys = zip(*make_dataset(cfg, split, training=False, info=info))
    return np.concatenate(xs), np.concatenate(ys)


def _stream(x, y, seed: int, batch_size: int, augment: str):
    """Endless shuffled batches (reshuffled every pass), shifted by ``pipeline.shift_augment`` if asked."""
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed)
        .repeat()
        .batch(batch_size)
    )
    ds = ds.apply(shift_augment(seed)) if augment == "shift" else ds
    return ds.prefetch(tf.data.AUTOTUNE)


def _adam(lr: float, steps: int):
    return keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(lr, max(1, steps)))


def _acc(model, x, y) -> float:
    return float(np.mean(np.argmax(model.predict(x, batch_size=1000, verbose=0), -1) == y))


def _student(p: Params, init, shape):
    model = build_model(p.student, shape, 10, dropout=0.0)
    model.set_weights(init)
    return model


def _fit_teacher(p: Params, x, y, seed: int):
    keras.utils.set_random_seed(seed)
    model = build_model(p.teacher, x.shape[1:], 10, dropout=0.25)
    steps = -(-len(x) // p.teacher_batch_size) * p.teacher_epochs
    model.compile(_adam(p.teacher_lr, steps), SCCE, steps_per_execution=p.steps_per_execution)
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed)
        .batch(p.teacher_batch_size)
    )
    model.fit(ds.prefetch(tf.data.AUTOTUNE), epochs=p.teacher_epochs, verbose=0)
    return model


def _scratch(p: Params, init, x, y, seed: int, recipe: dict):
    """The student on its labelled subset alone."""
    model = _student(p, init, x.shape[1:])
    model.compile(_adam(recipe["lr"], p.steps), SCCE, steps_per_execution=p.steps_per_execution)
    keras.utils.set_random_seed(seed)
    model.fit(
        _stream(x, y, seed, p.batch_size, recipe["augment"]),
        steps_per_epoch=p.steps,
        epochs=1,
        verbose=0,
    )
    return model


def _distilled(
    p: Params, init, labeled, unlabeled_x, seed: int, recipe: dict, teachers, weights=None
):
    """The student taught by ``teachers`` with tfopt's Distiller, on the recipe's transfer set."""
    if recipe["transfer"] == "all":
        # alpha=1: the loss never reads a label, so the images go in with placeholder labels.
        assert recipe["alpha"] == 1.0, recipe
        x, y = unlabeled_x, np.zeros(len(unlabeled_x), np.int64)
    else:
        x, y = labeled
    student = _student(p, init, x.shape[1:])
    distiller = Distiller(
        student,
        teachers,
        temperature=recipe["temperature"],
        alpha=recipe["alpha"],
        teacher_weights=weights,
    )
    distiller.compile(_adam(recipe["lr"], p.steps), steps_per_execution=p.steps_per_execution)
    keras.utils.set_random_seed(seed)
    distiller.fit(
        _stream(x, y, seed, p.batch_size, recipe["augment"]),
        steps_per_epoch=p.steps,
        epochs=1,
        verbose=0,
    )
    return student


def _peer(p: Params, init, labeled, seed: int, teacher):
    """keras.io's recipe on the labelled subset, for as many examples as the other arms see."""
    x, y = labeled
    epochs = max(1, round(p.steps * p.batch_size / len(x)))
    return peer.distil(_student(p, init, x.shape[1:]), teacher, x, y, epochs=epochs, seed=seed)


def _subset(p: Params, n: int, seed: int):
    return np.random.default_rng(seed).choice(n, min(p.labeled, n), replace=False)


def run(p: Params) -> dict:
    """Runs the whole protocol; returns the result payload (without the figures)."""
    cfg = DataConfig(
        dataset="mnist",
        limit=p.limit,
        global_batch_size=1000,
        num_shards=4 if p.limit else DataConfig.num_shards,
    )
    info = prepare(cfg)
    (xtr, ytr), (xva, yva), (xte, yte) = (
        _arrays(cfg, info, s) for s in ("train", "validation", "test")
    )
    scratch_grid, distill_grid = (
        (SCRATCH_GRID[::3], DISTILL_GRID[::3]) if p.smoke else (SCRATCH_GRID, DISTILL_GRID)
    )
    units = 2 + len(scratch_grid) + len(distill_grid) + 1 + 4 * p.seeds
    bar = tqdm(total=units, desc="B6 distillation", unit="fit", file=sys.stdout, disable=None)
    started = time.perf_counter()
    seconds: dict[str, list[float]] = {}

    def timed(key, fn):
        t0 = time.perf_counter()
        out = fn()
        seconds.setdefault(key, []).append(round(time.perf_counter() - t0, 2))
        bar.update(1)
        return out

    def init_weights(seed):
        keras.utils.set_random_seed(seed)
        return build_model(p.student, xtr.shape[1:], 10, dropout=0.0).get_weights()

    teachers = [timed("teacher", lambda s=s: _fit_teacher(p, xtr, ytr, 100 + s)) for s in range(2)]
    t_val_acc = [_acc(t, xva, yva) for t in teachers]
    multi_w = accuracy_weights(t_val_acc, 10)

    # Selection: validation split only, the selection seed's subset and initial weights.
    s = p.selection_seed
    idx, init = _subset(p, len(xtr), s), init_weights(s)
    labeled = (xtr[idx], ytr[idx])
    trials = []
    for recipe in scratch_grid:
        acc = _acc(timed("selection", lambda: _scratch(p, init, *labeled, s, recipe)), xva, yva)
        trials.append({"arm": "scratch", "recipe": recipe, "val_accuracy": acc})
    for recipe in distill_grid:
        acc = _acc(
            timed("selection", lambda: _distilled(p, init, labeled, xtr, s, recipe, teachers[:1])),
            xva,
            yva,
        )
        trials.append({"arm": "distilled", "recipe": recipe, "val_accuracy": acc})
    chosen = {
        arm: max((t for t in trials if t["arm"] == arm), key=lambda t: t["val_accuracy"])["recipe"]
        for arm in ("scratch", "distilled")
    }

    # Reported runs: test split read once per model, after every choice above.
    t_test = [teachers[i].predict(xte, batch_size=1000, verbose=0) for i in range(2)]
    t_acc = [float(np.mean(np.argmax(z, -1) == yte)) for z in t_test]
    ens_acc = float(np.mean(np.argmax(teacher_log_probs(t_test, multi_w, 1.0).numpy(), -1) == yte))
    ceiling = timed("ceiling", lambda: _scratch(p, init_weights(7), xtr, ytr, 7, chosen["scratch"]))
    ceiling_acc = _acc(ceiling, xte, yte)
    rows = []
    for seed in range(p.seeds):
        idx, init = _subset(p, len(xtr), seed), init_weights(seed)
        labeled = (xtr[idx], ytr[idx])
        models = {
            "scratch": timed(
                "scratch", lambda: _scratch(p, init, *labeled, seed, chosen["scratch"])
            ),
            "single": timed(
                "single",
                lambda: _distilled(p, init, labeled, xtr, seed, chosen["distilled"], teachers[:1]),
            ),
            "multi": timed(
                "multi",
                lambda: _distilled(
                    p, init, labeled, xtr, seed, chosen["distilled"], teachers, multi_w
                ),
            ),
            "peer": timed("peer", lambda: _peer(p, init, labeled, seed, teachers[0])),
        }
        a = {k: _acc(m, xte, yte) for k, m in models.items()}

        def closed(acc, ref):
            return (acc - a["scratch"]) / (ref - a["scratch"]) if ref > a["scratch"] else None

        rows.append(
            {
                "seed": seed,
                **{f"{k}_acc": v for k, v in a.items()},
                "gap_closed_single": closed(a["single"], t_acc[0]),
                "gap_closed_multi": closed(a["multi"], ens_acc),
                "gap_closed_peer": closed(a["peer"], t_acc[0]),
                "multi_minus_single_pt": 100 * (a["multi"] - a["single"]),
            }
        )
    bar.close()
    student_params = build_model(p.student, xtr.shape[1:], 10, dropout=0.0).count_params()
    return {
        "params": dataclasses.asdict(p),
        "data": {
            "train": len(xtr),
            "validation": len(xva),
            "test": len(xte),
            "labeled_subset": min(p.labeled, len(xtr)),
        },
        "models": {
            "teacher": p.teacher,
            "teacher_params": int(teachers[0].count_params()),
            "student": p.student,
            "student_params": int(student_params),
        },
        "teachers": {
            "test_accuracy": t_acc,
            "val_accuracy": t_val_acc,
            "multi_weights": multi_w,
            "combined_test_accuracy": ens_acc,
        },
        "selection": {"split": "validation", "seed": s, "trials": trials, "chosen": chosen},
        "peer": {
            "tutorial": peer.TUTORIAL,
            "url": peer.URL,
            "alpha_labels": peer.ALPHA,
            "temperature": peer.TEMPERATURE,
            "learning_rate": peer.LEARNING_RATE,
            "batch_size": peer.BATCH_SIZE,
        },
        "student_all_labels_test_accuracy": ceiling_acc,
        "per_seed": rows,
        "seconds": {"total": round(time.perf_counter() - started, 1), **seconds},
    }


def figures(res: dict) -> list[dict]:
    """The published figures, each from the per-seed rows."""
    rows, t = res["per_seed"], res["teachers"]

    def col(key):
        return [r[key] for r in rows]

    def pct(key):
        return ", ".join(f"{100 * v:.2f}" for v in col(key))

    med = figure("", col("gap_closed_peer"), "of gap")["value"]
    peer_text = (
        f"keras.io recipe on the same run: {'n/a' if med is None else f'{med:.2f}'} of the gap"
    )
    return [
        figure(
            "gap closed, teacher A: (distilled - scratch) / (teacher - scratch)",
            col("gap_closed_single"),
            "of gap",
            target=(">=", 0.9),
            peer=peer_text,
            anchor=ANCHOR,
            detail=f"teacher A {100 * t['test_accuracy'][0]:.2f}%; distilled {pct('single_acc')}; "
            f"scratch {pct('scratch_acc')} (test %, per seed)",
        ),
        figure(
            "multi (A+B) - single (A) teacher, student test accuracy",
            col("multi_minus_single_pt"),
            "pt",
            target=(">=", 0.0),
            detail=f"A+B {pct('multi_acc')}; A {pct('single_acc')}",
        ),
        figure(
            "gap closed, teachers A+B (vs their combined soft target)",
            col("gap_closed_multi"),
            "of gap",
            detail=f"combined target {100 * t['combined_test_accuracy']:.2f}%",
        ),
        figure(
            "student distilled from A, test accuracy", [100 * v for v in col("single_acc")], "%"
        ),
        figure(
            "student from scratch (recipe tuned on validation), test accuracy",
            [100 * v for v in col("scratch_acc")],
            "%",
        ),
        figure(
            "peer: keras.io recipe, gap closed",
            col("gap_closed_peer"),
            "of gap",
            detail=f"peer student {pct('peer_acc')}",
        ),
    ]


def report(res: dict) -> str:
    """The markdown table printed at the end."""
    rows = []
    for f in res["figures"]:
        lo, hi = f["spread"] or (None, None)
        fmt = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        rows.append(
            [
                f["name"],
                f"{fmt(f['value'])} {f['unit']}",
                f"{fmt(lo)} to {fmt(hi)} ({f['repeats']})",
                f["target"] or "",
                f["status"],
            ]
        )
    head = ["B6 distillation", "median", "range (seeds)", "target", "status"]
    d, p = res["selection"]["chosen"], res["params"]
    note = (
        f"teachers {res['models']['teacher']} x2: {100 * res['teachers']['test_accuracy'][0]:.2f}% / "
        f"{100 * res['teachers']['test_accuracy'][1]:.2f}%; student {p['student']} "
        f"({res['models']['student_params']:,} params), {p['labeled']} labels, {p['steps']} steps; chosen on "
        f"validation: scratch {d['scratch']}, distilled {d['distilled']}; student on all labels "
        f"{100 * res['student_all_labels_test_accuracy']:.2f}%; {res['seconds']['total']:.0f} s"
    )
    return markdown_table(head, rows) + "\n" + note


def main(argv=None) -> int:
    parser = script_parser(__doc__, "distillation", "tiny data and budgets: checks the script runs")
    defaults = Params()
    for f in dataclasses.fields(Params):
        if f.name == "smoke":
            continue
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(getattr(defaults, f.name)),
            default=getattr(defaults, f.name),
        )
    args = parser.parse_args(argv)
    tf.get_logger().setLevel(
        "ERROR"
    )  # one fresh model per fit: tf.function retracing notices are expected
    values = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(Params) if f.name != "smoke"
    }
    if args.smoke:
        values.update(SMOKE)
    p = Params(**values)
    print(
        f"B6: 2 teachers, selection on validation, then {p.seeds} seeds x (scratch, distilled A, distilled A+B, "
        f"keras.io peer) on {usable_cores()} cores",
        flush=True,
    )
    res = run(p)
    command = "PYTHONPATH=. python bench/distillation.py" + (" --smoke" if p.smoke else "")
    payload = result("B6", "distillation", command, figures(res), **res)
    return publish(payload, args.out, "B6", table=report(payload))


if __name__ == "__main__":
    sys.exit(main())
