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

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (
    CpuSample,
    QuietGate,
    figure,
    lscpu_info,
    markdown_table,
    median,
    result,  # noqa: E402
    write_json_atomic,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONV_HEAVY = "wide_cnn"
TFOPT_POLICIES = ("float32", "mixed_bfloat16", "auto")
PEER_POLICIES = ("float32", "mixed_bfloat16")
ACCURACY_POLICIES = ("float32", "mixed_bfloat16")
TARGETS = {
    "bf16_speedup_amx": (">=", 2.0),
    "auto_vs_float32": (">=", 0.97),
    "accuracy_pt": ("<=", 0.2),
}
ANCHOR = "TF guide: >2x on recent Intel CPUs; AVX512_BF16 without AMX: ~1.5-1.9x on conv nets"
# The 0.2 pt accuracy bar means something only for a trained model: two runs that differ in their
# numerics alone drift apart by more than that while the accuracy still climbs (and at chance level
# both score alike, a meaningless "pass"). It is judged when float32 reaches this test accuracy.
TRAINED = 0.95
MIN_SEEDS = 3  # fewer seeds than this: the accuracy figure says so


@dataclasses.dataclass(frozen=True)
class Plan:
    """One model's throughput runs: its MNIST slice and epochs (the same on every side)."""

    name: str
    limit: int  # examples of each split (train, validation, test)
    epochs: int  # epoch 1 traces; epochs 2.. are timed


@dataclasses.dataclass(frozen=True)
class AccuracyPlan:
    """One model's accuracy runs: a recipe that trains float32 past :data:`TRAINED`, the same for bf16."""

    name: str
    limit: int  # examples of each split: the training slice, and as many validation and test images
    epochs: int
    learning_rate: float  # Adam, cosine-decayed to 0 over the run (tfopt's default schedule)
    batch: int
    seeds: int


# Timed windows of 32 steps (2 timed epochs a run): shorter ones are noise on a shared machine.
PLANS = {"cnn": Plan("cnn", 4096, 3), CONV_HEAVY: Plan(CONV_HEAVY, 4096, 3)}
# Chosen on the validation split (float32, seed 1, Adam 1e-3 cosine, batch 64; bench scratch runs,
# test never read), float32 past 96% validation accuracy with some margin: cnn 4096 x 2 reached
# 92.7%, 8192 x 2 96.7%; wide_cnn 8192 x 2 95.7%, 8192 x 3 96.7% (46 s), 16384 x 2 97.5% (49 s).
# Each run's wall seconds are recorded in the result (``wall_seconds`` of every accuracy run).
ACCURACY = {
    "cnn": AccuracyPlan("cnn", 8192, 2, 1e-3, 64, 3),
    CONV_HEAVY: AccuracyPlan(CONV_HEAVY, 16384, 2, 1e-3, 64, 3),
}


@dataclasses.dataclass(frozen=True)
class Params:
    """What one benchmark run trains."""

    models: tuple[Plan, ...] = tuple(PLANS.values())
    accuracy: tuple[AccuracyPlan, ...] = tuple(ACCURACY.values())
    batch: int = 128  # throughput runs
    repeats: int = 3  # throughput repeats
    seed: int = 1  # repeat r (accuracy: seed index r) trains with seed + r on every side
    smoke: bool = False

    @classmethod
    def smoke_params(cls) -> Params:
        """The fewest, tiniest runs that exercise every code path: throughput of the conv-heavy model
        (whose target depends on AMX), accuracy of the default one; one repeat, one seed."""
        return cls(
            models=(Plan(CONV_HEAVY, 64, 2),),
            accuracy=(AccuracyPlan("cnn", 64, 1, 3e-3, 32, 1),),
            batch=32,
            repeats=1,
            smoke=True,
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


def rotated(items: list, k: int) -> list:
    """``items`` rotated left by ``k``: each repeat starts with another side."""
    k %= len(items)
    return items[k:] + items[:k]


def ratios(runs: list[dict]) -> dict:
    """One throughput repeat of one model: the published ratios from its runs' step times."""
    by = {(r["side"], r["policy"]): r for r in runs}
    t32, tbf, tau = by["tfopt", "float32"], by["tfopt", "mixed_bfloat16"], by["tfopt", "auto"]
    p32, pbf = by["peer", "float32"], by["peer", "mixed_bfloat16"]
    return {
        "tfopt_bf16_speedup": t32["step_ms"] / tbf["step_ms"],
        "peer_bf16_speedup": p32["step_ms"] / pbf["step_ms"],
        "auto_vs_float32": t32["step_ms"] / tau["step_ms"],
        "auto_chose": tau["resolved"],
        "auto_probe_seconds": tau["probe"]["seconds"],
    }


def delta_pt(runs: list[dict]) -> float:
    """One seed of one model: bf16's test accuracy minus float32's, in points (signed)."""
    by = {r["policy"]: r["test_accuracy"] for r in runs}
    return 100 * (by["mixed_bfloat16"] - by["float32"])


def cpu_bf16(flags: list[str]) -> dict:
    """What the CPU offers for bfloat16 (the verdict of the 2x target depends on AMX)."""
    have = set(flags)
    return {
        "avx512_bf16": "avx512_bf16" in have,
        "amx_bf16": "amx_bf16" in have,
        "amx_tile": "amx_tile" in have,
        "avx512f": "avx512f" in have,
    }


def figures(res: dict) -> list[dict]:
    """The published B2 figures: throughput ratios (one value per repeat), accuracy gaps (one per seed)."""
    out = []
    for plan in res["params"]["models"]:
        out += _throughput_figures(
            plan["name"], res["per_model"][plan["name"]]["repeats"], res["cpu_bf16"]["amx_bf16"]
        )
    for plan in res["params"]["accuracy"]:
        out.append(_accuracy_figure(plan, res["accuracy"][plan["name"]]["seeds"]))
    return out


def _throughput_figures(model: str, reps: list[dict], amx: bool) -> list[dict]:
    rs = [x["ratios"] for x in reps]
    peer_speed = median(r["peer_bf16_speedup"] for r in rs)
    target = TARGETS["bf16_speedup_amx"] if model == CONV_HEAVY else None
    speed = dict(
        key=f"bf16_speedup_{model}",
        **figure(
            f"bf16 / float32 training throughput, {model}",
            [r["tfopt_bf16_speedup"] for r in rs],
            "x",
            target=target,
            peer=f"guide recipe: {peer_speed:.2f}x",
            anchor=ANCHOR,
            detail=_detail(reps, "float32", "mixed_bfloat16"),
        ),
    )
    if target is not None and not amx:
        speed["status"] = "n/a without AMX"
    chose = sorted({r["auto_chose"] for r in rs})
    auto = dict(
        key=f"auto_vs_float32_{model}",
        **figure(
            f"auto / float32 training throughput, {model}",
            [r["auto_vs_float32"] for r in rs],
            "x",
            target=TARGETS["auto_vs_float32"],
            digits=3,
            peer=f"guide recipe's bf16 on this CPU: {peer_speed:.2f}x float32",
            detail=f"auto chose {', '.join(chose)}; probe {median(r['auto_probe_seconds'] for r in rs):.1f} s "
            "(not in the throughput); " + _detail(reps, "float32", "auto"),
        ),
    )
    return [speed, auto]


def _accuracy_figure(plan: dict, seeds: list[dict]) -> dict:
    model = plan["name"]
    acc = {pol: [_policy_run(s, pol)["test_accuracy"] for s in seeds] for pol in ACCURACY_POLICIES}
    f32 = median(acc["float32"])
    images = _policy_run(seeds[0], "float32")["test_images"]
    few = (
        ""
        if len(seeds) >= MIN_SEEDS
        else f" (only {len(seeds)}: bf16 without bf16 hardware is too slow here for more)"
    )
    f = dict(
        key=f"accuracy_pt_{model}",
        **figure(
            f"test accuracy gap |bf16 - float32|, {model}, same initial weights, data order and epochs",
            [abs(s["delta_pt"]) for s in seeds],
            "pt",
            target=TARGETS["accuracy_pt"],
            peer="guide recipe: not trained for accuracy (budget)",
            detail=f"test accuracy float32 {_pct(acc['float32'])}, bf16 {_pct(acc['mixed_bfloat16'])} after "
            f"{plan['epochs']} epochs of {plan['limit']} images (Adam {plan['learning_rate']:g} cosine, batch "
            f"{plan['batch']}; chosen on validation); {images} test images (1 image = {100 / images:.2f} pt); "
            f"{len(seeds)} seeds{few}, signed: "
            + ", ".join(f"{s['delta_pt']:+.2f}" for s in seeds),
        ),
    )
    if f32 < TRAINED:
        f["status"] = f"n/a: float32 at {100 * f32:.0f}% (judged from {100 * TRAINED:.0f}%)"
    return f


def _pct(values: list[float]) -> str:
    """Median (min-max) in percent."""
    return f"{100 * median(values):.2f}% ({100 * min(values):.2f}-{100 * max(values):.2f})"


def _policy_run(seed_entry: dict, policy: str) -> dict:
    return next(x for x in seed_entry["runs"] if x["policy"] == policy)


def _run(rep: dict, side: str, policy: str) -> dict:
    return next(x for x in rep["runs"] if (x["side"], x["policy"]) == (side, policy))


def _detail(reps: list[dict], a: str, b: str) -> str:
    def ms(policy):
        return median(_run(x, "tfopt", policy)["step_ms"] for x in reps)

    return f"{ms(a):.1f} vs {ms(b):.1f} ms/step ({a} vs {b})"


def targets(res: dict) -> dict:
    """Each judged target: its measured median, bar and verdict (the 2x target only with AMX)."""
    out = {}
    for f in res["figures"]:
        if f["op"] is None or f["status"].startswith("n/a"):
            continue
        out[f["key"]] = {
            "measured": f["value"],
            "op": f["op"],
            "value": f["bound"],
            "pass": None if f["value"] is None else f["status"] == "pass",
        }
    return out


def report(res: dict) -> str:
    """The printed table and notes."""
    rows = [
        [
            f["name"],
            "-" if f["value"] is None else f"{f['value']:.{f['digits']}f} {f['unit']}",
            "-"
            if not f["spread"]
            else f"{f['spread'][0]:.{f['digits']}f} to {f['spread'][1]:.{f['digits']}f}",
            f["repeats"],
            f["target"] or "-",
            f["status"],
            f["peer"] or "-",
        ]
        for f in res["figures"]
    ]
    p = res["params"]
    lines = [
        markdown_table(
            [
                "B2 mixed precision",
                "median",
                "range",
                "repeats/seeds",
                "target",
                "status",
                "peer, same run",
            ],
            rows,
        )
    ]
    cpu = res["cpu_bf16"]
    notes = [
        f"{res['lscpu']['model']}: avx512_bf16={cpu['avx512_bf16']}, amx_bf16={cpu['amx_bf16']}; "
        f"{res['environment']['usable_cores']} usable cores, TF {res['environment'].get('tensorflow')}.",
        "Throughput: MNIST slices (examples per split, epochs; the first epoch untimed): "
        + ", ".join(f"{m['name']} {m['limit']}, {m['epochs']}" for m in p["models"])
        + f"; batch {p['batch']}, one_device, seeds {p['seed']}..{p['seed'] + p['repeats'] - 1}; "
        "runs interleaved, order rotating.",
        "Accuracy (float32 vs bf16 from the same seed, initial weights and data order; test read once a run): "
        + "; ".join(
            f"{a['name']} {a['limit']} images x {a['epochs']} epochs, {a['seeds']} seeds"
            for a in p["accuracy"]
        )
        + ".",
    ]
    if p["smoke"]:
        notes.insert(0, "SMOKE MODE: tiny data, one repeat; these figures mean nothing.")
    q = res["quiet_gate"]
    notes.append(
        f"Shared machine: {q['reruns']} re-runs, {q['kept_disturbed_units']} of {q['units']} throughput "
        f"runs kept disturbed; foreign load median {100 * q['kept_foreign_load_median']:.0f}%."
    )
    return "\n".join(lines) + "\n\n" + "\n".join("- " + n for n in notes)


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


def run(p: Params, out: str, gate: QuietGate, workdir: str) -> dict:
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
    write_json_atomic(out, res)
    return res


def refigure(path: str, out: str) -> dict:
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
    write_json_atomic(out, res)
    return res


def main(argv: list[str] | None = None) -> int:
    """Runs B2, prints its table and writes the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke", action="store_true", help="tiny data, one repeat (checks the script runs)"
    )
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
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "mixed_precision.json"))
    ap.add_argument(
        "--figures-from",
        metavar="JSON",
        help="recompute the figures and verdicts of a finished "
        "result from its raw runs (after a change of the figures' code; trains nothing)",
    )
    args = ap.parse_args(argv)
    if args.figures_from:
        print(report(refigure(args.figures_from, args.out)))
        print(f"wrote {args.out}")
        return 0
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
        res = run(p, args.out, gate, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(res))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
