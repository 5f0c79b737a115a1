"""Benchmark B2 (mixed precision): float32 vs mixed_bfloat16 vs ``--precision auto``, tfopt and the TF guide.

    PYTHONPATH=. python bench/mixed_precision.py           # cnn + wide_cnn (12 min with AMX; longer without bf16 hardware)
    PYTHONPATH=. python bench/mixed_precision.py --smoke   # tiny, one run of each kind (a test)

Two measurements in one process on one machine, each side by side:

Throughput (short timed windows; for each repeat, its own seed, and each model, the default
``cnn`` and the conv-heavy ``wide_cnn``: five training runs in an order that rotates from repeat to
repeat, each re-run when foreign load disturbed it):

- tfopt: ``tfopt.train.run`` (the library entry of ``python -m tfopt.train``) with
  ``runtime.precision`` = ``float32``, ``mixed_bfloat16`` and ``auto``; ``one_device``, the same
  MNIST slice (tfopt's embedded real MNIST, ``data.limit`` examples of each split), batch, epochs
  and seed on every side. Throughput = run.json's: steps per epoch x batch / the median epoch time
  after the first (tracing) epoch; epochs are timed without validation.
- peer (bench/peers/mixed_precision_guide.py): TensorFlow's "Mixed precision" guide's recipe,
  global policy, float32 softmax output, ``fit`` on NumPy arrays, under ``float32`` and
  ``mixed_bfloat16``, same model, data, batch, epochs and seed; the same per-epoch timing.

Accuracy (models trained until float32 is past :data:`TRAINED`): per model and seed,
``tfopt.train.run`` under ``float32`` and ``mixed_bfloat16`` (order rotating by seed) from the same
seed, hence the same initial weights (their sha256 is recorded and compared), the same data order
(``data.deterministic``, ``data.seed`` = the seed) and the same epochs of a larger training slice;
the test split is read once per run, by the run itself. The recipe of each model (slice, epochs,
learning rate, batch) was chosen on the validation split, see :data:`ACCURACY`. The guide's
recipe is not trained for accuracy: without bf16 hardware its bf16 runs cost as much as tfopt's
(4-5x float32) and the budget holds one set.

Figures: per model, bf16 / float32 training throughput (target >= 2x on the conv-heavy model, but
only on a CPU with AMX: "n/a without AMX" elsewhere), auto / float32 (>= 0.97: auto is never more
than 3% slower), each with the guide recipe's bf16 / float32 of the same run as peer; and the test
accuracy gap |bf16 - float32| in points, median over seeds (<= 0.2 pt, judged only when float32
reaches 95%: before that, numerics alone move it by more). The probe's own seconds are reported
beside auto (they are not in the throughput). Writes ``bench/results/mixed_precision.json`` with
every run's raw numbers and the CPU's flags.
"""

import dataclasses
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._common import (
    CpuSample,
    QuietGate,
    lscpu_info,
    publish,
    result,  # noqa: E402
    script_parser,
)

# The benchmark's parts, by job (each under 600 lines).
from bench._mixed_precision_params import (  # noqa: E402
    ACCURACY,
    ACCURACY_POLICIES,
    CONV_HEAVY,
    PEER_POLICIES,
    TFOPT_POLICIES,
    AccuracyPlan,
    Params,
    Plan,
)
from bench._mixed_precision_report import (  # noqa: E402
    cpu_bf16,
    delta_pt,
    figures,
    ratios,
    report,
    rotated,
    targets,
)


def step_ms(epoch_seconds: list[float], steps_per_epoch: int) -> float:
    """Milliseconds per training step: the median epoch time after the first (tracing) epoch / its steps."""
    steady = epoch_seconds[1:] or epoch_seconds
    return 1e3 * statistics.median(steady) / steps_per_epoch


def _train(
    data: dict, model: str, policy: str, train: dict, out: str, callbacks=()
) -> tuple[dict, float]:
    """One ``tfopt.train.run`` on ``one_device`` (the library entry a user calls): its run.json and wall seconds."""
    from tfopt import config as C
    from tfopt.train import run as train_run

    cfg = C.from_dict(
        {
            "data": {"dataset": "mnist", **data},
            "model": {"name": model},
            "runtime": {"strategy": "one_device", "precision": policy},
            "train": {**train, "output_dir": out, "verbose": 0, "tensorboard": False},
        }
    )
    started = time.perf_counter()
    try:
        record = train_run(cfg, callbacks=callbacks).to_dict()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return record, round(time.perf_counter() - started, 2)


def tfopt_run(plan: Plan, policy: str, seed: int, p: Params, workdir: str) -> dict:
    """One throughput run of tfopt; returns its throughput, accuracy and (auto) probe from run.json."""
    record, wall = _train(
        {"limit": plan.limit, "global_batch_size": p.batch},
        plan.name,
        policy,
        {"epochs": plan.epochs, "seed": seed},
        os.path.join(workdir, f"tfopt-{plan.name}-{policy}-{seed}"),
    )
    tr = record["train"]
    return {
        "side": "tfopt",
        "model": plan.name,
        "policy": policy,
        "seed": seed,
        "resolved": record["strategy"]["precision"],
        "epoch_seconds": tr["epoch_seconds"],
        "steps_per_epoch": tr["steps_per_epoch"],
        "step_ms": step_ms(tr["epoch_seconds"], tr["steps_per_epoch"]),
        "examples_per_sec": tr["examples_per_sec"],
        "test_accuracy": record["metrics"]["test_accuracy"],
        "wall_seconds": wall,
        "probe": record["strategy"].get("precision_auto"),
    }


def peer_run(
    plan: Plan, policy: str, seed: int, p: Params, arrays: dict, shape: tuple, classes: int
) -> dict:
    """One throughput run of the guide's recipe."""
    from peers import mixed_precision_guide as guide

    from tfopt.models import build_model

    started = time.perf_counter()
    out = guide.train(
        policy,
        lambda s, n: build_model(plan.name, s, n),
        arrays,
        image_shape=shape,
        num_classes=classes,
        batch_size=p.batch,
        epochs=plan.epochs,
        seed=seed,
    )
    return {
        "side": "peer",
        "model": plan.name,
        "seed": seed,
        **out,
        "step_ms": step_ms(out["epoch_seconds"], out["steps_per_epoch"]),
        "wall_seconds": round(time.perf_counter() - started, 2),
    }


def accuracy_run(plan: AccuracyPlan, policy: str, seed: int, workdir: str) -> dict:
    """One accuracy run of tfopt: the validation accuracy of every epoch, the test accuracy read once
    at the end (by the run), and the sha256 of the weights training started from and ended with."""
    from tfopt import keras
    from tfopt.runtime import weights_digest

    class InitialWeights(keras.callbacks.Callback):
        """The digest of the weights ``fit`` starts from (the same seed must give the same, any policy)."""

        sha256 = ""

        def on_train_begin(self, logs=None):
            self.sha256 = weights_digest(self.model)

    start = InitialWeights()
    record, wall = _train(
        {"limit": plan.limit, "global_batch_size": plan.batch, "seed": seed, "deterministic": True},
        plan.name,
        policy,
        {"epochs": plan.epochs, "seed": seed, "learning_rate": plan.learning_rate},
        os.path.join(workdir, f"accuracy-{plan.name}-{policy}-{seed}"),
        callbacks=[start],
    )
    return {
        "model": plan.name,
        "policy": policy,
        "seed": seed,
        "resolved": record["strategy"]["precision"],
        "initial_weights_sha256": start.sha256,
        "weights_sha256": record["weights_sha256"],
        "val_accuracy": [h["val_accuracy"] for h in record["history"]],
        "test_accuracy": record["metrics"]["test_accuracy"],
        "test_images": record["data"]["splits"]["test"],
        "steps_per_epoch": record["train"]["steps_per_epoch"],
        "epoch_seconds": record["train"]["epoch_seconds"],
        "wall_seconds": wall,
    }


def throughput(p: Params, gate: QuietGate, workdir: str) -> dict:
    """Every throughput repeat: ``{model: {"repeats": [...]}}``."""
    from peers import mixed_precision_guide as guide

    from tfopt import keras
    from tfopt.config import DataConfig

    arrays = {
        plan.limit: guide.load_arrays(
            DataConfig(dataset="mnist", limit=plan.limit, global_batch_size=p.batch)
        )
        for plan in p.models
    }
    sides = [("tfopt", pol) for pol in TFOPT_POLICIES] + [("peer", pol) for pol in PEER_POLICIES]
    per_model = {plan.name: {"repeats": []} for plan in p.models}
    for r in range(p.repeats):
        seed = p.seed + r
        for plan in p.models:
            runs = []
            for side, policy in rotated(sides, r):

                def unit(side=side, policy=policy):
                    with CpuSample() as s:
                        row = (
                            tfopt_run(plan, policy, seed, p, workdir)
                            if side == "tfopt"
                            else peer_run(plan, policy, seed, p, *arrays[plan.limit])
                        )
                    row["foreign_load"] = s.foreign
                    return row, [s.foreign]

                row = gate.run(unit)
                assert keras.mixed_precision.global_policy().name == "float32", (
                    "a side leaked its policy"
                )
                runs.append(row)
                print(
                    f"throughput {r + 1}/{p.repeats} {plan.name:9s} {side:5s} {policy:15s} -> "
                    f"{row.get('resolved', policy):14s} {row['step_ms']:8.1f} ms/step  ({row['wall_seconds']:.0f} s)",
                    flush=True,
                )
            per_model[plan.name]["repeats"].append(
                {
                    "seed": seed,
                    "order": [f"{s}:{q}" for s, q in rotated(sides, r)],
                    "runs": runs,
                    "ratios": ratios(runs),
                }
            )
    return per_model


def accuracy(p: Params, workdir: str) -> dict:
    """Every accuracy run: ``{model: {"seeds": [...]}}``, seeds interleaved over the models.

    Not gated on foreign load: load changes how long a run takes, not what it computes.
    """
    from tfopt import keras

    out = {plan.name: {"seeds": []} for plan in p.accuracy}
    for i in range(max((plan.seeds for plan in p.accuracy), default=0)):
        seed = p.seed + i
        for plan in (x for x in p.accuracy if i < x.seeds):
            order = rotated(list(ACCURACY_POLICIES), i)
            runs = []
            for policy in order:
                row = accuracy_run(plan, policy, seed, workdir)
                assert keras.mixed_precision.global_policy().name == "float32", (
                    "a run leaked its policy"
                )
                runs.append(row)
                print(
                    f"accuracy seed {seed} {plan.name:9s} {policy:15s} val {row['val_accuracy'][-1]:.4f}  "
                    f"({row['wall_seconds']:.0f} s)",
                    flush=True,
                )
            out[plan.name]["seeds"].append(
                {"seed": seed, "order": order, "runs": runs, "delta_pt": delta_pt(runs)}
            )
    return out


def run(p: Params, gate: QuietGate, workdir: str) -> dict:
    """Runs both measurements, writes the JSON, returns it."""
    started = time.perf_counter()
    cpu = lscpu_info()
    per_model = throughput(p, gate, workdir)
    throughput_seconds = time.perf_counter() - started
    acc = accuracy(p, workdir)
    res = {
        "params": dataclasses.asdict(p),
        "cpu_bf16": cpu_bf16(cpu["flags"]),
        "per_model": per_model,
        "accuracy": acc,
    }
    res = result(
        "B2", "mixed precision", "PYTHONPATH=. python bench/mixed_precision.py", figures(res), **res
    )
    res["targets"] = targets(res)
    res["quiet_gate"] = gate.summary()
    res["wall_seconds"] = {
        "throughput": round(throughput_seconds, 1),
        "accuracy": round(time.perf_counter() - started - throughput_seconds, 1),
    }
    return res


def refigure(path: str) -> dict:
    """Recomputes the figures and verdicts of a finished result from its raw runs (no training)."""
    with open(path, encoding="utf-8") as f:
        res = json.load(f)
    for model in res["accuracy"].values():
        for entry in model["seeds"]:
            entry["delta_pt"] = delta_pt(entry["runs"])
    for model in res["per_model"].values():
        for rep in model["repeats"]:
            rep["ratios"] = ratios(rep["runs"])
    res["figures"] = figures(res)
    res["targets"] = targets(res)
    res["figures_recomputed"] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"PYTHONPATH=. python bench/mixed_precision.py --figures-from {path}",
    }
    return res


def main(argv: list[str] | None = None) -> int:
    """Runs B2, prints its table and writes the JSON result."""
    ap = script_parser(__doc__, "mixed_precision", "tiny data, one repeat (checks the script runs)")
    ap.add_argument("--repeats", type=int, help="throughput repeats (default 3)")
    ap.add_argument(
        "--seeds",
        type=int,
        help="accuracy seeds of every model (default: cnn 3, "
        f"{CONV_HEAVY} {ACCURACY[CONV_HEAVY].seeds}; 0 = no accuracy runs)",
    )
    ap.add_argument(
        "--limit",
        type=int,
        help="MNIST examples per split of the throughput runs, every model "
        f"(default: cnn 1024, {CONV_HEAVY} 768)",
    )
    ap.add_argument(
        "--epochs",
        type=int,
        help=f"epochs per throughput run, the first untimed (default: cnn 3, {CONV_HEAVY} 2)",
    )
    ap.add_argument(
        "--models",
        help=f"comma-separated registered models (default cnn,{CONV_HEAVY}); the accuracy "
        f"runs only for those with a recipe chosen on validation ({', '.join(ACCURACY)})",
    )
    ap.add_argument(
        "--figures-from",
        metavar="JSON",
        help="recompute the figures and verdicts of a finished "
        "result from its raw runs (after a change of the figures' code; trains nothing)",
    )
    args = ap.parse_args(argv)
    if args.figures_from:
        return publish(refigure(args.figures_from), args.out, "B2", table=report)
    p = Params.smoke_params() if args.smoke else Params()
    plans = {plan.name: plan for plan in p.models}
    recipes = {plan.name: plan for plan in p.accuracy}
    if args.models:
        names = [m for m in (x.strip() for x in args.models.split(",")) if m]
        plans = {m: plans.get(m, Plan(m, 1024, 3)) for m in names}
        recipes = {
            m: recipes.get(m, ACCURACY.get(m)) for m in names if recipes.get(m, ACCURACY.get(m))
        }
    plans = {
        m: dataclasses.replace(
            plan, limit=args.limit or plan.limit, epochs=args.epochs or plan.epochs
        )
        for m, plan in plans.items()
    }
    if args.seeds is not None:
        recipes = {
            m: dataclasses.replace(r, seeds=args.seeds)
            for m, r in recipes.items()
            if args.seeds > 0
        }
    p = dataclasses.replace(
        p,
        models=tuple(plans.values()),
        accuracy=tuple(recipes.values()),
        repeats=args.repeats or p.repeats,
    )
    if any(plan.epochs < 2 for plan in p.models):
        ap.error("--epochs must be >= 2: the first epoch traces and is not timed")
    gate = QuietGate(max_wait=0.0 if p.smoke else 90.0, enabled=not p.smoke)
    workdir = tempfile.mkdtemp(prefix="b2-")
    try:
        res = run(p, gate, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return publish(res, args.out, "B2", table=report)


if __name__ == "__main__":
    sys.exit(main())
