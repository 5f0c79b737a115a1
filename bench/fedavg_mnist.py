"""Benchmark B13 (federated averaging): FedAvg on MNIST against McMahan et al. 2017, Table 2.

What it does (protocol: BENCHMARKS.md, row B13). Every run goes through ``tfopt federated``'s
command line in this process (``tfopt.federated.cli.main``) on Flower's simulation engine (one
SuperLink running the clients' ClientApps), with the paper's settings: its MNIST CNN
(``--model fedavg_cnn``, 1,663,370 parameters), 100 clients, C = 0.1 (10 sampled per round), E = 5
local epochs, B = 10, plain SGD on the clients. The 50,000 training images are dealt out IID
(500 per client) or by the paper's pathological non-IID split (sorted by label, 200 shards, 2 per
client: ``--partition shards``); the other 10,000 training images are the validation split the
server scores the global model on after every round.

1. **The clients' learning rate**, chosen on the validation split only: IID FedAvg for
   ``--tune-rounds`` rounds at each rate of ``LRS`` (the paper tuned its rate on a grid too);
   the rate with the best validation accuracy is used by every later run.
2. **Rounds to 99%.** FedAvg, IID and non-IID, for at most ``--iid-rounds`` and
   ``--noniid-rounds`` rounds: the first round whose global model scores 99% on the validation
   split (the paper scored its test set each round; here the test split is read once per run,
   after the last round), and the bytes sent per round (the global model to each sampled client
   and each client's model back).
3. **FedProx** (mu 0.01), IID, the same rounds, and **client-level DP** (DP-FedAvg: each update
   clipped to ``--dp-clip``, Gaussian noise of multiplier ``--dp-noise``), IID, with the epsilon
   the accountant gives for its rounds at delta 1e-5.

Figures: rounds to 99% for IID and non-IID FedAvg (targets: no more than the paper's 20 and
229), bytes per round, FedProx's rounds, the DP variant's test accuracy at its epsilon.

    PYTHONPATH=. python bench/fedavg_mnist.py                    # every run (hours on 2 cores)
    PYTHONPATH=. python bench/fedavg_mnist.py --runs iid,fedprox     # IID only
    PYTHONPATH=. python bench/fedavg_mnist.py --runs noniid --merge  # adds non-IID to it
    PYTHONPATH=. python bench/fedavg_mnist.py --smoke            # 4 clients, 2 rounds (a test)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import figure, markdown_table, publish, result, script_parser  # noqa: E402

COMMAND = "PYTHONPATH=. python bench/fedavg_mnist.py"
#: McMahan et al. 2017, Table 2 (MNIST CNN, C = 0.1, E = 5, B = 10): rounds to 99% test accuracy.
PAPER = {"iid": 20, "shards": 229}
#: The clients' learning rates tried (step 1), on a multiplicative grid as the paper's.
LRS = (0.03, 0.1, 0.3)
TARGET = 0.99
#: The runs of steps 2 and 3: name -> (partition, extra flags).
RUNS = {
    "iid": ("iid", []),
    "noniid": ("shards", ["--shards-per-client", "2"]),
    "fedprox": ("iid", ["--algorithm", "fedprox", "--proximal-mu", "0.01"]),
    "dp": ("iid", []),
}
FULL = {"clients": 100, "fraction": 0.1, "local_epochs": 5, "batch": 10, "limit": 0}
FULL |= {"tune_rounds": 3, "iid_rounds": 40, "noniid_rounds": 300, "lrs": list(LRS)}
SMOKE = {"clients": 4, "fraction": 0.5, "local_epochs": 1, "batch": 10, "limit": 400}
SMOKE |= {"tune_rounds": 1, "iid_rounds": 2, "noniid_rounds": 1, "lrs": [0.1]}


def federated(out: str, *argv: str) -> dict:
    """``tfopt federated ARGV -o OUT`` in this process; its ``run.json``."""
    from tfopt import keras
    from tfopt.federated import main

    keras.backend.clear_session()
    code = main([*argv, "--quiet", "-o", out])
    if code != 0:
        raise RuntimeError(f"tfopt federated {' '.join(argv)} exited {code}")
    with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
        return json.load(f)


def base_argv(p: dict, partition: str, rounds: int, lr: float) -> list[str]:
    """The flags every run shares: the paper's model, clients, C, E and B, on the simulation engine."""
    argv = ["--model", "fedavg_cnn", "--engine", "simulation", "--partition", partition]
    argv += ["--clients", str(p["clients"]), "--fraction", str(p["fraction"])]
    argv += ["--local-epochs", str(p["local_epochs"]), "--batch-size", str(p["batch"])]
    argv += ["--rounds", str(rounds), "--client-lr", str(lr), "--limit", str(p["limit"])]
    return [*argv, "--round-timeout", "3600"]


def summary(rec: dict) -> dict:
    """What a run's record says: the validation accuracy of every round, rounds to the target,
    bytes per round, the test accuracy and (client-level DP) the epsilon."""
    accuracies = [row["val_accuracy"] for row in rec["history"]]
    reached = next((i + 1 for i, a in enumerate(accuracies) if a >= TARGET), None)
    fed = rec["federated"]
    return {
        "val_accuracy": accuracies,
        "rounds": len(accuracies),
        "rounds_to_target": reached,
        "bytes_per_round": fed["bytes_per_round"],
        "payload_bytes": fed["payload_bytes"],
        "sampled_per_round": fed["sampled_per_round"],
        "test_accuracy": rec["metrics"]["test_accuracy"],
        "seconds": fed["seconds"],
        **({"privacy": fed["privacy"]} if "privacy" in fed else {}),
    }


def tune(p: dict, root: str) -> dict:
    """Step 1: IID FedAvg at each learning rate; the best validation accuracy wins."""
    scores = {}
    for lr in p["lrs"]:
        rec = federated(
            os.path.join(root, f"tune-{lr}"), *base_argv(p, "iid", p["tune_rounds"], lr)
        )
        scores[lr] = rec["history"][-1]["val_accuracy"]
        print(f"lr {lr}: validation accuracy {scores[lr]:.4f} after {p['tune_rounds']} rounds")
    return {"scores": {str(k): v for k, v in scores.items()}, "chosen": max(scores, key=scores.get)}


def runs(p: dict, root: str, lr: float, names: list[str]) -> dict:
    """Steps 2 and 3: every named run at the chosen learning rate."""
    out = {}
    for name in names:
        partition, extra = RUNS[name]
        rounds = p["noniid_rounds"] if partition == "shards" else p["iid_rounds"]
        if name == "dp":
            extra = ["--fed-dp-clip", str(p["dp_clip"]), "--fed-dp-noise", str(p["dp_noise"])]
        started = time.perf_counter()
        rec = federated(os.path.join(root, name), *base_argv(p, partition, rounds, lr), *extra)
        out[name] = {**summary(rec), "wall_seconds": round(time.perf_counter() - started, 1)}
        print(
            f"{name}: rounds to {TARGET:.0%} {out[name]['rounds_to_target']}, test accuracy "
            f"{out[name]['test_accuracy']:.4f} after {out[name]['rounds']} rounds",
            flush=True,
        )
    return out


def _rounds_figure(name: str, run: dict, anchor: int | None) -> dict:
    best = max(run["val_accuracy"])
    detail = (
        f"{run['rounds_to_target']} of {run['rounds']} rounds run"
        if run["rounds_to_target"]
        else f"not reached in the {run['rounds']} rounds run (best {best:.2%})"
    )
    out = figure(
        name,
        [run["rounds_to_target"]],
        "rounds",
        target=("<=", anchor) if anchor else None,
        anchor=f"McMahan et al. 2017, Table 2: {anchor} rounds" if anchor else None,
        detail=f"{detail}; test accuracy after the last round {run['test_accuracy']:.2%}",
        digits=0,
    )
    if anchor and run["rounds_to_target"] is None and run["rounds"] >= anchor:
        out["status"] = "MISS"  # not reached in more rounds than the paper needed
    return out


def figures(res: dict) -> list[dict]:
    """The published figures (module docstring)."""
    out, done = [], res["runs"]
    for name, label in (("iid", "IID"), ("noniid", "pathological non-IID")):
        if name in done:
            anchor = PAPER[RUNS[name][0]]
            out.append(_rounds_figure(f"FedAvg {label}: rounds to 99%", done[name], anchor))
    for name, run in done.items():
        out.append(
            figure(
                f"{name}: bytes sent per round",
                [run["bytes_per_round"] / 1e6],
                "MB",
                detail=f"{run['sampled_per_round']} clients x 2 x {run['payload_bytes']:,} bytes",
            )
        )
    if "fedprox" in done:
        out.append(_rounds_figure("FedProx IID (mu 0.01): rounds to 99%", done["fedprox"], None))
    if "dp" in done:
        privacy = done["dp"]["privacy"]
        out.append(
            figure(
                f"DP-FedAvg IID: test accuracy at epsilon {privacy['epsilon']['rdp']:.3g}",
                [100 * done["dp"]["test_accuracy"]],
                "%",
                detail=f"clip {privacy['clip']:g}, noise {privacy['noise_multiplier']:g}, "
                f"delta {privacy['delta']:g}, {done['dp']['rounds']} rounds",
            )
        )
    return out


def table(res: dict) -> str:
    """Per run: rounds run, rounds to 99%, the paper's, bytes per round, test accuracy."""
    rows = []
    for name, run in res["runs"].items():
        paper = PAPER.get(RUNS[name][0]) if name in ("iid", "noniid") else None
        rows.append(
            [
                name,
                str(run["rounds"]),
                str(run["rounds_to_target"] or "-"),
                str(paper or "-"),
                f"{run['bytes_per_round'] / 1e6:.1f}",
                f"{100 * run['test_accuracy']:.2f}",
                f"{run['privacy']['epsilon']['rdp']:.3g}" if "privacy" in run else "-",
            ]
        )
    head = ["run", "rounds", "rounds to 99% (validation)", "paper", "MB per round"]
    lr = f"clients' learning rate {res['tuning']['chosen']:g} (chosen on validation)"
    return f"## B13: federated averaging\n\n{lr}\n\n" + markdown_table(
        [*head, "test accuracy %", "epsilon"], rows
    )


def _kept(out: str, p: dict) -> dict:
    """``--merge``: the tuning and runs of the result at ``out`` (measured with the same
    parameters), which this invocation adds to; nothing when there is none."""
    if not os.path.exists(out):
        return {}
    with open(out, encoding="utf-8") as f:
        old = json.load(f)
    same = ("clients", "fraction", "local_epochs", "batch", "limit", "lrs", "smoke")
    if any(old["params"].get(k) != p[k] for k in same):
        raise SystemExit(f"--merge: {out} was measured with other parameters; drop --merge")
    return {"tuning": old["tuning"], "runs": old["runs"]}


def main(argv: list[str] | None = None) -> int:
    """Tunes the learning rate, runs FedAvg, FedProx and DP-FedAvg, prints the B13 table and
    writes the JSON result."""
    ap = script_parser(__doc__, "fedavg_mnist", "4 clients, 1-2 rounds on 400 images")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--dp-clip", type=float, default=1.0, help="DP-FedAvg's update clip")
    ap.add_argument("--dp-noise", type=float, default=1.0, help="DP-FedAvg's noise multiplier")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the runs (and the chosen learning rate) of the result at --out, adding these",
    )
    args = ap.parse_args(argv)
    names = [n for n in args.runs.split(",") if n]
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        ap.error(f"unknown run {', '.join(unknown)}; choose from {', '.join(RUNS)}")
    started = time.perf_counter()
    p = {**(SMOKE if args.smoke else FULL), "smoke": args.smoke, "runs": names}
    p |= {"dp_clip": args.dp_clip, "dp_noise": args.dp_noise}
    kept = _kept(args.out, p) if args.merge else {}
    with tempfile.TemporaryDirectory(prefix="b13-") as root:
        tuning = kept.get("tuning") or tune(p, root)
        done = runs(p, root, tuning["chosen"], names)
    done = {
        name: done.get(name) or kept["runs"][name]
        for name in RUNS
        if name in {*done, *kept.get("runs", {})}
    }
    p["runs"] = list(done)
    res = result("B13", "federated averaging", COMMAND, [], params=p, tuning=tuning, runs=done)
    res["figures"] = figures(res)
    return publish(res, args.out, "B13", table=table, started=started)


if __name__ == "__main__":
    sys.exit(main())
