"""Benchmark B10 (compression that buys speed): channel pruning and low-rank factorization in LiteRT.

What it does, in one run on one machine (BENCHMARKS.md, row B10), for two families:

* ``cnn``: the built-in CNN trained on MNIST with ``tfopt.train``;
* ``mobilenetv2_1``: B9's ``keras.applications`` MobileNetV2 (width 1.0, 96x96 RGB, trained on
  Fashion-MNIST PNG class folders through the ``folder:`` source; reused from B9's work directory).

From each trained model, every arm fine-tunes the same ``--epochs`` at the same learning rate:

1. dense control: ``tfopt.train`` continuing the trained model file (the same extra training);
2. ``channel_prune`` to half the multiply-adds (``tfopt.optimize``, global L1 ranking, widths a
   multiple of ``--round-to``);
3. ``low_rank`` to ``--low-rank-flops`` of the multiply-adds (``tfopt.optimize``);
3b. ``channel_prune_latency``: ``channel_prune`` aimed at the dense float .tflite's p50 / 1.7
   (``--target-latency-us``, its latency table timed by the library; a target below the floor
   the table predicts is recorded as refused);
4. peer: tfmot magnitude pruning with as many nonzero weights as the channel-pruned model has
   parameters (``bench/peers/tfmot_xnnpack_guide.py``);
5. peer: tfmot's ``PruneForLatencyOnXNNPack`` recipe, converted with sparse weights for
   XNNPACK's sparse inference (tfmot refuses models without a qualifying subgraph: recorded).

tfopt's arms are converted by the library's export stage (float32 and int8, stripped strings);
the peers by the LiteRT PTQ guide's recipes (the XNNPACK peer's float model by its own guide).
Every .tflite is scored on the same test images and timed at batch 1 with the LiteRT interpreter
(XNNPACK) at 1 and 2 threads, ``--repeats`` interleaved rounds; ratios are against the dense
control's float .tflite, round by round.

    PYTHONPATH=. python bench/structured.py [--repeats 3] [--epochs 3]
    PYTHONPATH=. python bench/structured.py --smoke     # cnn on a small slice; used by a test
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

from bench import edge_architecture as b9  # noqa: E402
from bench._common import (  # noqa: E402
    QuietGate,
    bound_cells,
    figure,
    figures_table,
    interleaved_latency,
    markdown_table,
    publish,
    result,
    roofline_at,
    script_parser,
    speedups,
)
from bench.peers import litert_ptq_guide as guide  # noqa: E402
from bench.peers import tfmot_xnnpack_guide as peers  # noqa: E402
from tfopt import config as config_lib  # noqa: E402
from tfopt.core import peak_summary, peaks  # noqa: E402
from tfopt.export import (  # noqa: E402
    BenchSettings,
    ConvertOptions,  # noqa: E402
    ExportSettings,
    load_split,  # noqa: E402
)
from tfopt.export import run as export_run  # noqa: E402
from tfopt.runs import load_run  # noqa: E402

SETTINGS = (("xnnpack/1t", 1), ("xnnpack/2t", 2))
TARGETS = {
    "cp_float": (">=", 1.7),
    "cp_loss": ("<=", 1.0),
    "cp_int8": (">=", 4.0),
    "lr_float": (">=", 1.5),
    "lr_loss": ("<=", 0.5),
}
ANCHOR = "tfmot has no filter pruning (its tracker's request open since 2021); XNNPACK sparse inference: 1x1 convs"
COMMAND = "PYTHONPATH=. python bench/structured.py"
ARMS = (
    "dense",
    "channel_prune",
    "low_rank",
    "channel_prune_latency",
    "magnitude_peer",
    "xnnpack_peer",
)
LATENCY_SPEEDUP = 1.7  # channel_prune_latency aims at the dense p50 / this


@dataclass(frozen=True)
class Params:
    """Everything that shapes the measurement (recorded in the JSON)."""

    families: tuple = ("cnn", "mobilenetv2_1")
    cnn_epochs: int = 3  # the trained cnn
    cnn_limit: int = 0  # MNIST images per split (0 = all)
    epochs: int = 3  # fine-tuning of every arm
    learning_rate: float = 5e-4
    flops: float = 0.5  # channel pruning
    low_rank_flops: tuple = (("cnn", 0.5), ("mobilenetv2_1", 0.7))
    round_to: int = 8
    peer_limit: int = 0  # training images the peers fine-tune on in memory (0 = the whole split)
    calibration_steps: int = 25
    eval_limit: int = 1000
    repeats: int = 3
    runs: int = 100
    warmup: int = 10
    smoke: bool = False


def parse_args(argv=None):
    ap = script_parser(
        __doc__,
        "structured",
        "cnn on a small slice, few runs: checks the script runs",
        gate=True,
        workdir=os.path.join(config_lib.default_data_dir(), "bench-b10"),
    )
    ap.add_argument("--families", default="cnn,mobilenetv2_1", help="cnn and/or mobilenetv2_1")
    ap.add_argument(
        "--epochs", type=int, default=3, help="fine-tuning epochs of every arm (default 3)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument(
        "--b9-workdir",
        default=os.path.join(config_lib.default_data_dir(), "bench-b9"),
        help="where B9 keeps its image folder and trained MobileNetV2 (made there if missing)",
    )
    a = ap.parse_args(argv)
    families = tuple(f for f in a.families.split(",") if f.strip())
    bad = [f for f in families if f not in ("cnn", "mobilenetv2_1")]
    if bad:
        ap.error(
            f"--families {a.families!r} names {', '.join(bad)}; choose from cnn, mobilenetv2_1"
        )
    p = Params(families=families, epochs=a.epochs, repeats=a.repeats, runs=a.runs)
    if a.smoke:
        p = dataclasses.replace(
            p,
            families=("cnn",),
            cnn_epochs=1,
            cnn_limit=1024,
            epochs=1,
            peer_limit=1024,
            calibration_steps=2,
            eval_limit=200,
            repeats=1,
            runs=5,
            warmup=2,
            smoke=True,
        )
    gate = QuietGate(enabled=not (a.no_gate or a.smoke))
    return p, gate, a.out, a.workdir, a.b9_workdir


def ensure_cnn(workdir: str, p: Params) -> str:
    """The built-in cnn trained on MNIST with tfopt.train (once per setting)."""
    from tfopt.train import run as train

    run_dir = os.path.join(workdir, f"cnn-e{p.cnn_epochs}-l{p.cnn_limit}")
    if not os.path.exists(os.path.join(run_dir, "run.json")):
        train(
            config_lib.from_dict(
                {
                    "data": {"dataset": "mnist", "limit": p.cnn_limit},
                    "model": {"name": "cnn"},
                    "runtime": {"strategy": "one_device"},
                    "train": {
                        "epochs": p.cnn_epochs,
                        "output_dir": run_dir,
                        "verbose": 0,
                        "tensorboard": False,
                    },
                }
            )
        )
    return run_dir


def ensure_base(family: str, workdir: str, b9_workdir: str, p: Params) -> str:
    """The trained model of ``family``: its run directory."""
    if family == "cnn":
        return ensure_cnn(workdir, p)
    b9p = b9.Params()
    return b9.ensure_run(b9_workdir, b9.ensure_folder(b9_workdir, b9p), b9p, 1.0)


def fine_tune_arms(base: str, workdir: str, family: str, p: Params) -> dict:
    """The dense control (tfopt.train) and the two structured arms (tfopt.optimize): run directories."""
    from tfopt.compress import ChannelSpec, LowRankSpec
    from tfopt.optimize import OptimizeSettings
    from tfopt.optimize import run as optimize
    from tfopt.train import run as train

    run = load_run(base)
    tag = f"{family}-e{p.epochs}{'-smoke' if p.smoke else ''}"
    cfg = config_lib.apply_overrides(run.config, ["train.verbose=0", "train.tensorboard=false"])
    out = {name: os.path.join(workdir, f"{tag}-{name}") for name in ARMS[:4]}
    if not os.path.exists(os.path.join(out["dense"], "run.json")):
        control = config_lib.from_dict(
            {
                "model": {"name": run.model_path, "args": ""},  # the file holds the built model
                "train": {
                    "epochs": p.epochs,
                    "learning_rate": p.learning_rate,
                    "output_dir": out["dense"],
                },
            },
            cfg,
        )
        train(control)
    from tfopt.compress import model_us
    from tfopt.models import load_model

    dense_us = model_us(
        load_model(run.model_path)
    )  # the library's own measurement, as the table makes it
    todo = [
        (name, s)
        for name, s in (
            (
                "channel_prune",
                OptimizeSettings(
                    technique="channel_prune",
                    epochs=p.epochs,
                    learning_rate=p.learning_rate,
                    channels=ChannelSpec(flops=p.flops, round_to=p.round_to),
                    tensorboard=False,
                ),
            ),
            (
                "low_rank",
                OptimizeSettings(
                    technique="low_rank",
                    epochs=p.epochs,
                    learning_rate=p.learning_rate,
                    low_rank=LowRankSpec(flops=dict(p.low_rank_flops)[family]),
                    tensorboard=False,
                ),
            ),
            (
                "channel_prune_latency",
                OptimizeSettings(
                    technique="channel_prune",
                    epochs=p.epochs,
                    learning_rate=p.learning_rate,
                    tensorboard=False,
                    channels=ChannelSpec(
                        latency_us=round(dense_us / LATENCY_SPEEDUP, 1), round_to=p.round_to
                    ),
                ),
            ),
        )
        if not os.path.exists(os.path.join(out[name], "run.json"))
    ]
    for name, settings in todo:  # one job each: a refused latency target is a result, not a crash
        (outcome,) = optimize(base, cfg, [settings], [out[name]], keep_going=True)
        if (
            not outcome.ok
            and name == "channel_prune_latency"
            and "out of reach" in str(outcome.error)
        ):
            out[name] = {"refused": str(outcome.error), "dense_us": dense_us}
        elif not outcome.ok:
            raise RuntimeError(f"{family} {name}: {outcome.error}")
    return out


def export_arm(run_dir: str, p: Params) -> dict:
    """The library's export stage (float32, int8; stripped): rows with their .tflite bytes."""
    settings = ExportSettings(
        modes=("float32", "int8"),
        options=ConvertOptions(strip_strings=True),
        calibration_steps=p.calibration_steps,
        eval_limit=p.eval_limit,
        selective=False,
        bench=BenchSettings(threads=(1,), runs=5, warmup=1, keras=False),
        plot=False,
    )
    record = export_run(run_dir, settings, out_dir=run_dir + "-export", overwrite=True)
    rows = {}
    for r in record.section["modes"]:
        with open(os.path.join(run_dir + "-export", r["file"]), "rb") as f:
            rows[r["mode"]] = {
                "content": f.read(),
                "size_bytes": r["size_bytes"],
                "accuracy": r["eval"]["accuracy"],
            }
    return rows


def _params_and_macs(model) -> dict:
    from tfopt.compress import model_macs

    return {"params": int(model.count_params()), "macs": int(sum(model_macs(model).values()))}


def peer_arms(base: str, cp_params: int, x, y, x_test, y_test, p: Params) -> dict:
    """Both tfmot peers from the same trained model: their models converted and scored."""
    from tfopt.models import load_model

    model = load_model(load_run(base).model_path)
    kernels = sum(w.size for layer in model.layers for w in layer.get_weights() if w.ndim >= 2)
    others = model.count_params() - kernels
    target = float(np.clip(1 - (cp_params - others) / kernels, 0.0, 0.99))
    out = {}
    mag = peers.magnitude_recipe(
        model, x, y, target=target, epochs=p.epochs, learning_rate=p.learning_rate
    )
    xnn = peers.xnnpack_recipe(model, x, y, epochs=p.epochs, learning_rate=p.learning_rate)
    for name, res in (("magnitude_peer", mag), ("xnnpack_peer", xnn)):
        if "refused" in res:
            out[name] = {"refused": res["refused"]}
            continue
        rows = {
            "float32": res.get("tflite") or guide.convert(res["model"], "float32", x),
            "int8": guide.convert(res["model"], "int8", x),
        }
        out[name] = {
            "sparsity": res["sparsity"],
            "fit_seconds": res["fit_seconds"],
            **_params_and_macs(res["model"]),
            "rows": {
                m: {
                    "content": c,
                    "size_bytes": len(c),
                    "accuracy": float(np.mean(guide.predict(c, x_test) == y_test)),
                }
                for m, c in rows.items()
            },
        }
    out["magnitude_peer"]["target_sparsity"] = round(target, 4)
    return out


def main(argv=None) -> int:
    p, gate, out, workdir, b9_workdir = parse_args(argv)
    t_start = time.perf_counter()
    total = 4 * len(p.families) + p.repeats * len(SETTINGS)
    families, timed = {}, {}
    with tqdm(total=total, desc="B10", unit="step", disable=None, file=sys.stderr) as bar:
        for family in p.families:
            bar.set_postfix_str(f"{family}: the trained model (once)")
            base = ensure_base(family, workdir, b9_workdir, p)
            bar.update(1)
            bar.set_postfix_str(
                f"{family}: dense control, channel_prune, low_rank ({p.epochs} epochs each)"
            )
            dirs = fine_tune_arms(base, workdir, family, p)
            bar.update(1)
            bar.set_postfix_str(f"{family}: export and score")
            fam = {"base": base, "arms": {}}
            from tfopt.models import load_model

            for name, run_dir in dirs.items():
                if isinstance(run_dir, dict):  # refused
                    fam["arms"][name] = run_dir
                    continue
                record = load_run(run_dir).record
                fam["arms"][name] = {
                    "run": run_dir,
                    **_params_and_macs(load_model(os.path.join(run_dir, "model.keras"))),
                    "keras_test_accuracy": record.metrics.get("test_accuracy"),
                    "section": record.section if name != "dense" else None,
                    "rows": export_arm(run_dir, p),
                }
            bar.update(1)
            bar.set_postfix_str(f"{family}: the tfmot peers")
            cfg = load_run(base).config
            x, y = load_split(cfg.data, "train", p.peer_limit)
            x_test, y_test = load_split(cfg.data, "test", p.eval_limit)
            fam["arms"].update(
                peer_arms(base, fam["arms"]["channel_prune"]["params"], x, y, x_test, y_test, p)
            )
            del x, y
            bar.update(1)
            for name, arm in fam["arms"].items():
                for mode, row in arm.get("rows", {}).items():
                    timed[f"{family}/{name}/{mode}"] = row["content"]
            families[family] = fam
        per = interleaved_latency(
            timed, SETTINGS, repeats=p.repeats, runs=p.runs, warmup=p.warmup, gate=gate, bar=bar
        )
        bar.set_postfix_str("rooflines (every op timed alone)")
        summary = summarize(p, families, per, peaks())
    return publish(summary, out, "B10", table=report, gate=gate, started=t_start)


def summarize(p: Params, families: dict, per: dict, peaks: dict) -> dict:
    figures, out = [], {}
    for family, fam in families.items():
        base = f"{family}/dense/float32"
        dense = fam["arms"]["dense"]
        arms = {}
        for name, arm in fam["arms"].items():
            arms[name] = {k: v for k, v in arm.items() if k != "rows"}
            arms[name]["modes"] = {
                mode: {
                    "size_bytes": r["size_bytes"],
                    "accuracy": r["accuracy"],
                    "accuracy_loss_pt": round(
                        100 * (dense["rows"]["float32"]["accuracy"] - r["accuracy"]), 3
                    ),
                    "latency_interleaved": speedups(per, f"{family}/{name}/{mode}", base, SETTINGS),
                    "roofline": roofline_at(
                        r["content"], per[f"{family}/{name}/{mode}"], SETTINGS, peaks
                    ),
                }
                for mode, r in arm.get("rows", {}).items()
            }
        out[family] = arms

        def lat(name, mode, key="xnnpack/1t"):
            return arms[name]["modes"][mode]["latency_interleaved"][key]

        def detail(name, mode):
            a = arms[name]
            return (
                f"p50 {1e3 * lat(name, mode)['p50_ms']:.0f} us vs dense float "
                f"{1e3 * lat('dense', 'float32')['p50_ms']:.0f} us; 2 threads "
                f"{lat(name, mode, 'xnnpack/2t')['speedup_vs_float32']:.2f}x; multiply-adds "
                f"{a['macs'] / arms['dense']['macs']:.2f} of dense; params {a['params']:,} vs "
                f"{arms['dense']['params']:,}"
            )

        def loss(name, mode="float32"):
            return [arms[name]["modes"][mode]["accuracy_loss_pt"]]

        peer_text = "; ".join(
            f"{name}: "
            + (
                f"refused ({arms[name]['refused'][:90]})"
                if "refused" in arms[name]
                else f"{lat(name, 'float32')['speedup_vs_float32']:.2f}x float at "
                f"{arms[name]['sparsity']:.0%} zeros, "
                f"{arms[name]['modes']['float32']['accuracy_loss_pt']:.1f} pt below dense"
            )
            for name in ("magnitude_peer", "xnnpack_peer")
        )
        low_target = family == "cnn"
        aimed = arms["channel_prune_latency"]
        if "refused" in aimed:
            latency_figures = [
                figure(
                    f"{family}: channel_prune to the dense p50 / {LATENCY_SPEEDUP} "
                    "(--target-latency-us), float speedup vs dense float (1 thread)",
                    [None],
                    "x",
                    detail="refused: " + aimed["refused"][:200],
                )
            ]
        else:
            plan = aimed["section"]["phases"][0]["latency"]
            latency_figures = [
                figure(
                    f"{family}: channel_prune to the dense p50 / {LATENCY_SPEEDUP} (--target-latency-us), float "
                    "speedup vs dense float (1 thread)",
                    lat("channel_prune_latency", "float32")["speedup_rounds"],
                    "x",
                    target=(">=", LATENCY_SPEEDUP),
                    detail=f"target {plan['target_us']:g} us from {plan['before_us']:g} us as the table measured "
                    f"it; predicted {plan['predicted_us']:g} us, measured after fine-tuning "
                    f"{plan['measured_us']:g} us; " + detail("channel_prune_latency", "float32"),
                ),
                figure(
                    f"{family}: channel_prune to a latency target: accuracy loss vs the equally trained dense model",
                    loss("channel_prune_latency"),
                    "pt",
                    target=TARGETS["cp_loss"],
                ),
            ]
        figures += [
            figure(
                f"{family}: channel_prune to half the FLOPs, float .tflite speedup vs dense float (1 thread)",
                lat("channel_prune", "float32")["speedup_rounds"],
                "x",
                target=TARGETS["cp_float"],
                anchor=ANCHOR,
                peer=peer_text,
                detail=detail("channel_prune", "float32"),
            ),
            figure(
                f"{family}: channel_prune accuracy loss vs the equally trained dense model",
                loss("channel_prune"),
                "pt",
                target=TARGETS["cp_loss"],
                detail=f"dense {100 * dense['rows']['float32']['accuracy']:.2f}% vs channel_prune "
                f"{100 * fam['arms']['channel_prune']['rows']['float32']['accuracy']:.2f}% (float .tflite, "
                f"n={p.eval_limit})",
            ),
            figure(
                f"{family}: channel_prune + int8 speedup vs dense float (1 thread)",
                lat("channel_prune", "int8")["speedup_rounds"],
                "x",
                target=TARGETS["cp_int8"],
                detail=detail("channel_prune", "int8"),
            ),
            figure(
                f"{family}: low_rank float .tflite speedup vs dense float (1 thread)",
                lat("low_rank", "float32")["speedup_rounds"],
                "x",
                target=TARGETS["lr_float"] if low_target else None,
                detail=detail("low_rank", "float32"),
            ),
            figure(
                f"{family}: low_rank accuracy loss vs the equally trained dense model",
                loss("low_rank"),
                "pt",
                target=TARGETS["lr_loss"] if low_target else None,
            ),
            *latency_figures,
        ]
    return result(
        "B10",
        "compression that buys speed",
        COMMAND,
        figures,
        benchmark="B10 channel pruning and low-rank factorization in LiteRT",
        params=dataclasses.asdict(p),
        families=out,
        latency_rounds=per,
        cpu_peaks=peaks,
        peers={
            "xnnpack": {"guide": peers.XNNPACK_GUIDE, "url": peers.XNNPACK_URL},
            "magnitude": {"guide": peers.MAGNITUDE_GUIDE},
            "conversion": guide.GUIDE,
        },
    )


def report(res: dict) -> str:
    parts = []
    for family, arms in res["families"].items():
        rows = []
        for name, arm in arms.items():
            if "refused" in arm:
                rows.append(
                    [name, "-", "-", "refused: " + arm["refused"][:60], "", "", "", "", "", ""]
                )
                continue
            for mode, r in arm["modes"].items():
                lat = r["latency_interleaved"]
                rows.append(
                    [
                        f"{name} {mode}",
                        f"{arm['params']:,}",
                        f"{arm['macs'] / 1e6:.1f}",
                        f"{r['size_bytes'] / 1024:.0f}",
                        *[
                            f"{lat[k]['p50_ms'] * 1e3:.0f} ({lat[k]['speedup_vs_float32']:.2f}x)"
                            for k, _ in SETTINGS
                        ],
                        *bound_cells(r["roofline"]["xnnpack/1t"]),
                        f"{100 * r['accuracy']:.2f}",
                    ]
                )
        parts.append(
            f"## B10: {family}; every arm fine-tuned {res['params']['epochs']} more epochs; p50 at batch 1, "
            f"median of {res['params']['repeats']} interleaved rounds x {res['params']['runs']} runs, "
            "speedups vs the dense float .tflite"
        )
        parts.append(
            markdown_table(
                [
                    "model",
                    "params",
                    "MMACs",
                    "size KiB",
                    *[f"p50 {k} us (speedup)" for k, _ in SETTINGS],
                    "bound 1t us",
                    "p50/bound 1t",
                    "test acc %",
                ],
                rows,
            )
        )
    parts.append(f"Bounds: {peak_summary(res['cpu_peaks'])}.")
    parts.append(figures_table(res["figures"]))
    return "\n\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
