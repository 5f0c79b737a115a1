"""Benchmark B12 (differential privacy): DP-SGD on MNIST against TensorFlow Privacy's tutorial table.

What it does (protocol: BENCHMARKS.md, row B12). Every run goes through ``tfopt.train``'s command
line in this process (``tfopt.train.main``), on MNIST's 50,000 training images (the other
10,000 are the validation split), and reads the run's ``run.json``.

1. **Accuracy at a budget.** For each model (``dp_cnn``, TensorFlow Privacy's tutorial CNN, and
   ``cnn_gn``, tfopt's default CNN with GroupNormalization in place of batch normalization,
   which DP-SGD cannot clip per example) and each epsilon of the tutorial's table (1.20, 2.92,
   9.74 at delta 1e-5), DP-SGD with ``--dp-l2-clip 1.0 --dp-epsilon EPS``: the noise multiplier
   is computed so the planned steps spend EPS (RDP, as the table's accountant), at seeds 1, 2
   and 3 (initial weights and data order). One recipe for every cell, the one docs/privacy.md
   shows (batch 256, learning rate 0.005, ``--epochs`` 15), fixed before any test figure was
   read; nothing is tuned on the test split, which is read once per run, after training.
2. **The cost of privacy.** For each model, the same training with and without DP-SGD
   (``--limit`` images, 2 epochs, the second epoch's seconds: the first traces), interleaved,
   ``--cost-repeats`` times: the private epoch over the non-private one.

Figures: per model and epsilon, the test accuracy (median over the seeds; target: above the
tutorial's, the mean of 10 runs: 95.0%, 96.6%, 97.3%) with the epsilon the run spent; per model,
a private epoch over a non-private one (target <= 2x, the goal BENCHMARKS.md sets for the default
CNN).

    PYTHONPATH=. python bench/dp_mnist.py                     # both models (~2 h on 2 cores)
    PYTHONPATH=. python bench/dp_mnist.py --models dp_cnn     # the tutorial's CNN (~25 min)
    PYTHONPATH=. python bench/dp_mnist.py --smoke             # tiny, one epsilon, one seed (a test)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import figure, markdown_table, median, publish, result, script_parser  # noqa: E402

COMMAND = "PYTHONPATH=. python bench/dp_mnist.py"
#: TensorFlow Privacy's MNIST tutorial: epsilon (delta 1e-5) -> test accuracy, mean of 10 runs.
TABLE = {1.20: 95.0, 2.92: 96.6, 9.74: 97.3}
MODELS = ("dp_cnn", "cnn_gn")
PLAIN = ["--batch-size", "256", "--lr", "0.005"]
PRIVATE = ["--dp-l2-clip", "1.0", "--dp-delta", "1e-5", *PLAIN]
FULL = {"epsilons": list(TABLE), "seeds": [1, 2, 3], "epochs": 15, "limit": 0}
FULL |= {"cost_limit": 12800, "cost_repeats": 3}
SMOKE = {"epsilons": [9.74], "seeds": [1], "epochs": 1, "limit": 768}
SMOKE |= {"cost_limit": 768, "cost_repeats": 1}


def train(out: str, *argv: str) -> dict:
    """``tfopt train ARGV -o OUT`` in this process; its ``run.json``."""
    from tfopt import keras
    from tfopt.train import main

    keras.backend.clear_session()
    code = main([*argv, "--quiet", "--set", "train.tensorboard=false", "-o", out])
    if code != 0:
        raise RuntimeError(f"tfopt train {' '.join(argv)} exited {code}")
    with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
        return json.load(f)


def accuracy_runs(p: dict, root: str) -> list[dict]:
    """Step 1: every (model, epsilon, seed), with what each run spent and scored."""
    runs = []
    for model in p["models"]:
        for eps in p["epsilons"]:
            for seed in p["seeds"]:
                argv = [*PRIVATE, "--model", model, "--dp-epsilon", str(eps)]
                argv += ["--epochs", str(p["epochs"]), "--limit", str(p["limit"])]
                argv += ["--set", f"train.seed={seed}", "--set", f"data.seed={seed}"]
                started = time.perf_counter()
                rec = train(os.path.join(root, f"{model}-{eps}-{seed}"), *argv)
                privacy = rec["train"]["privacy"]
                runs.append(
                    {
                        "model": model,
                        "target_epsilon": eps,
                        "seed": seed,
                        "test_accuracy": rec["metrics"]["test_accuracy"],
                        "val_accuracy": rec["history"][-1]["val_accuracy"],
                        "epsilon": privacy["epsilon"],
                        "epsilon_pld": privacy.get("epsilon_pld"),
                        "noise_multiplier": privacy["noise_multiplier"],
                        "steps": privacy["steps"],
                        "examples": privacy["examples"],
                        "seconds": round(time.perf_counter() - started, 1),
                    }
                )
                print(
                    f"{model} eps {eps} seed {seed}: test {runs[-1]['test_accuracy']:.4f}, "
                    f"spent {privacy['epsilon']:.3f} at noise {privacy['noise_multiplier']:.3f}",
                    flush=True,
                )
    return runs


def cost_runs(p: dict, root: str) -> dict:
    """Step 2: per model, the second epoch's seconds with and without DP-SGD, interleaved."""
    out = {model: {"private": [], "plain": []} for model in p["models"]}
    for r in range(p["cost_repeats"]):
        for model in p["models"]:
            for side in ("private", "plain") if r % 2 == 0 else ("plain", "private"):
                argv = [*PRIVATE, "--dp-noise", "1.1"] if side == "private" else PLAIN
                argv = [*argv, "--model", model, "--epochs", "2", "--limit", str(p["cost_limit"])]
                rec = train(os.path.join(root, f"cost-{model}-{side}-{r}"), *argv)
                out[model][side].append(rec["train"]["epoch_seconds"][-1])
                if side == "private":
                    out[model]["methods"] = rec["train"]["privacy"]["per_example_gradients"][
                        "layers"
                    ]
            print(f"repeat {r + 1}/{p['cost_repeats']}: {model} timed", flush=True)
    return out


def figures(runs: list[dict], cost: dict, models) -> list[dict]:
    """The published figures (module docstring)."""
    out = []
    for model in models:
        for eps, anchor in TABLE.items():
            cell = [r for r in runs if r["model"] == model and r["target_epsilon"] == eps]
            if not cell:
                continue
            out.append(
                figure(
                    f"{model}, epsilon {eps:g}: test accuracy",
                    [100 * r["test_accuracy"] for r in cell],
                    "%",
                    target=(">", anchor),
                    anchor=f"TF Privacy tutorial: {anchor}% at epsilon {eps:g}",
                    detail=f"spent epsilon {max(r['epsilon'] for r in cell):.3f} (RDP), "
                    f"noise {cell[0]['noise_multiplier']:.3f}, {cell[0]['steps']} steps",
                )
            )
        private, plain = cost[model]["private"], cost[model]["plain"]
        out.append(
            figure(
                f"{model}: a private epoch over a non-private one",
                [a / b for a, b in zip(private, plain, strict=True)],
                "x",
                target=("<=", 2.0),
                detail=f"private {median(private):.2f} s, non-private {median(plain):.2f} s",
            )
        )
    return out


def table(res: dict) -> str:
    """Per model and epsilon: the seeds' test accuracies and what they spent."""
    rows = [
        [
            r["model"],
            f"{r['target_epsilon']:g}",
            str(r["seed"]),
            f"{100 * r['test_accuracy']:.2f}",
            f"{r['epsilon']:.3f}",
            "-" if r["epsilon_pld"] is None else f"{r['epsilon_pld']:.3f}",
            f"{r['noise_multiplier']:.3f}",
        ]
        for r in res["runs"]
    ]
    head = ["model", "target epsilon", "seed", "test accuracy %", "epsilon (RDP)", "epsilon (PLD)"]
    return "## B12: differential privacy\n\n" + markdown_table([*head, "noise"], rows)


def main(argv: list[str] | None = None) -> int:
    """Runs the accuracy and cost steps, prints the B12 table and writes the JSON result."""
    ap = script_parser(__doc__, "dp_mnist", "1 epoch on 768 images, one epsilon and seed")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated built-in models")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    models = [m for m in args.models.split(",") if m]
    p = {**(SMOKE if args.smoke else FULL), "smoke": args.smoke, "models": models}
    with tempfile.TemporaryDirectory(prefix="b12-") as root:
        runs = accuracy_runs(p, root)
        cost = cost_runs(p, root)
    figs = figures(runs, cost, models)
    res = result("B12", "differential privacy", COMMAND, figs, params=p, runs=runs, cost=cost)
    return publish(res, args.out, "B12", table=table, started=started)


if __name__ == "__main__":
    sys.exit(main())
