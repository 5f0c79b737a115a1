"""Benchmark B4 (compression): gzip size and accuracy of pruned / clustered int8 .tflite models vs float.

Row B4 of /work/shared/design/BENCHMARKS.md, in one run on one machine:

1. Base: the default ``cnn`` trained 4 epochs on real MNIST (50k train images) with
   ``tfopt.train`` (once, reused from ``--workdir``), or ``--from RUN``. Converted with
   ``tfopt.export`` to float32 (the baseline every ratio divides) and to int8 PTQ (for reference).
2. Repeats (``--repeats``, default 3), each a tfopt.optimize job with its own seed (data order,
   dropout): the library's fine-tuning (``tfopt.optimize.phases.run_chain``, what ``python -m
   tfopt.optimize`` runs, without its run directory and its test-split evaluation) of
   - the pruning recipe (80% of the selected kernels, PolynomialDecay, Adam cosine-decayed);
   - the float control: the very same job with sparsity 0 (same layers wrapped, optimizer,
     schedule, epochs and data order; no weight is zeroed);
   - ``cluster`` (16 clusters, k-means++, 1 epoch) and ``pcqat`` (the recipe's pruning, then
     1 epoch of sparsity-preserving clustering and 1 of sparsity-and-cluster-preserving QAT),
     with the library's defaults;
   - ``cluster`` again with ``--centroid-init linear``, the clustering tutorial's initialization
     (information: what the centroid initialization alone does to the gzip ratio);
   then, beside them on the same trained model and training images, the two peers
   (``bench/peers/tfmot_pruning.py``, ``bench/peers/tfmot_clustering.py``: the tfmot tutorials).
3. Selection, on the validation split only: the first repeat's job also fine-tunes every
   candidate recipe of ``CANDIDATES`` (block shape, epochs, learning rate, which layers); each is
   converted to int8 and scored on the 10k validation images. Rule (``choose``): among the
   candidates whose gzip ratio reaches ``TARGET_RATIO``, the highest validation accuracy (ties:
   fewer epochs, then the earlier candidate); if none reaches it, the largest ratio. The chosen
   recipe's model of that job is repeat 1's pruned model; repeats 2+ train it afresh. No
   candidate ever sees the test split.
4. Test: each final model (control, pruned, clustered, PCQAT, both peers) is converted
   (``tfopt.export.tflite.convert``: int8 PTQ calibrated on 25 training batches, QAT models from
   their learned ranges, sparse encoding where smaller; the peers as their tutorials convert)
   and scored once on the 10k test images with the LiteRT interpreter
   (``tfopt.export.evaluate``). Sizes are gzip -9 of each ``.tflite``.

Figures (``bench/_common.figure``, medians over repeats with min-max): float/pruned+int8 gzip
ratio (target >= 12x), accuracy loss of pruned+int8 vs the equally fine-tuned float control
(target <= 0.3 pt), the same loss vs the un-fine-tuned float (information), the clustered+int8
and PCQAT ratios; each with the peer's figure from the same run and the tfmot tutorials' anchors.
Every model's row also has the Shannon entropy, in bits per byte, of its largest weight buffer
(the dense kernel): what deflate can do with it.

    PYTHONPATH=. python bench/compression.py [--repeats 3] [--out bench/results/compression.json]
    PYTHONPATH=. python bench/compression.py --smoke --from RUN_DIR     # seconds; used by a test
"""

from __future__ import annotations

import contextlib
import gzip
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

if __package__ in (None, ""):  # run as a script: make `bench` and `tfopt` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import (  # noqa: E402
    figure,
    markdown_table,
    median,
    publish,
    result,
    script_parser,
    write_json_atomic,
)
from tfopt import config as C  # noqa: E402

COMMAND = "PYTHONPATH=. python bench/compression.py"
SPARSITY, CLUSTERS = 0.8, 16
TARGET_RATIO, TARGET_LOSS_PT = 12.0, 0.3
ANCHOR_PRUNED = "tfmot pruning tutorial: 3x pruned, ~10x pruned + quantized"
ANCHOR_CLUSTERED = "tfmot clustering tutorial: ~8x clustered + quantized"
# The first convolution (288 weights, 0.1% of the model) left dense, as tfmot's guides advise.
DENSE_FIRST = ("conv1", "fc", "logits")


@dataclass(frozen=True)
class Recipe:
    """A pruning recipe for tfopt.optimize: what the selection chooses among.

    Attributes:
        name: Short label.
        epochs: Fine-tuning epochs of the pruning phase.
        block: Block shape of the Dense kernels ``[in, out]`` (``(4, 1)``: runs of 4 inputs,
            contiguous in TFLite's layout); convolutions are pruned weight by weight.
        lr: Peak learning rate (Adam, cosine-decayed over the phase).
        layers: Layers to prune (``()`` = every layer tfmot can prune).
    """

    name: str
    epochs: int
    block: tuple[int, int] = (1, 1)
    lr: float = 5e-4
    layers: tuple[str, ...] = DENSE_FIRST

    def settings(
        self,
        technique: str = "prune",
        sparsity: float = SPARSITY,
        steps: int = 0,
        init: str = "kmeans_plus_plus",
    ):
        """The ``OptimizeSettings`` of ``technique`` with this recipe's pruning (clustering with centroid
        initialization ``init``; QAT: defaults)."""
        from tfopt.optimize import ClusterSpec, OptimizeSettings, PruneSpec, Selection

        prune = PruneSpec(
            sparsity=sparsity,
            block_size=self.block if sparsity else (1, 1),
            selection=Selection(names=self.layers),
        )
        return OptimizeSettings(
            technique=technique,
            prune=prune,
            cluster=ClusterSpec(clusters=CLUSTERS, init=init),
            epochs=1,
            phase_epochs=(("prune", self.epochs),),
            steps_per_epoch=steps,
            learning_rate=self.lr,
            tensorboard=False,
            saved_model=False,
        )


# Block shape, learning rate and length, one factor at a time from the tfmot tutorial's 2 pruning
# epochs; the layers are fixed beforehand (DENSE_FIRST: the first convolution stays dense).
CANDIDATES = (
    Recipe("unstructured, lr 5e-4", 2),
    Recipe("4x1 blocks, lr 5e-4", 2, (4, 1)),
    Recipe("4x1 blocks, lr 1e-3", 2, (4, 1), 1e-3),
    Recipe("4x1 blocks, lr 5e-4, 8 epochs", 8, (4, 1)),
)
SMOKE_CANDIDATES = (
    Recipe("unstructured", 1, layers=()),
    Recipe("4x1 blocks", 1, (4, 1), layers=()),
)
CLUSTER_ONLY = Recipe("cluster", 1, layers=())  # its lr and epochs: the library's defaults


def choose(rows: list[dict], bar: float = TARGET_RATIO) -> int:
    """Index of the chosen candidate (see the module docstring): validation numbers only.

    Args:
        rows: One per candidate, with ``ratio``, ``val_accuracy`` and ``recipe.epochs``.
        bar: The gzip ratio a candidate must reach.
    """
    passing = [i for i, r in enumerate(rows) if r["ratio"] >= bar]
    if passing:
        return min(
            passing, key=lambda i: (-rows[i]["val_accuracy"], rows[i]["recipe"]["epochs"], i)
        )
    return max(range(len(rows)), key=lambda i: (rows[i]["ratio"], -i))


# --- the base run, the data, conversion and scoring ---------------------------------------------


def _base_run(args) -> str:
    if args.source:
        return args.source
    out = os.path.join(args.workdir, "base")
    if not os.path.isfile(os.path.join(out, "run.json")):
        from tfopt.train import run as train

        cfg = C.from_dict(
            {
                "data": {"dataset": "mnist", "global_batch_size": 128, "num_shards": 8},
                "model": {"name": "cnn"},
                "runtime": {"strategy": "one_device", "precision": "float32"},
                "train": {"epochs": 4, "output_dir": out, "verbose": 0, "tensorboard": False},
            }
        )
        print(f"B4: training the base cnn (4 epochs) into {out}", file=sys.stderr, flush=True)
        train(cfg)
    return out


def _tflite(model, mode: str, calibration=None) -> dict:
    """``tfopt.export``'s conversion (sparse encoding where smaller), with its gzip -9 size."""
    from tfopt.export import convert

    done = convert(model, mode, calibration=calibration)
    return _sizes(done.content, sparse=done.sparse)


def _sizes(content: bytes, sparse: bool = False) -> dict:
    """A ``.tflite``'s bytes, gzip -9 bytes and the entropy of its largest weight buffer."""
    return {
        "content": content,
        "bytes": len(content),
        "gzip_bytes": len(gzip.compress(content, 9)),
        "sparse": sparse,
        "largest_buffer_entropy_bits": round(largest_buffer_entropy(content), 3),
    }


def largest_buffer_entropy(content: bytes) -> float:
    """Shannon entropy, in bits per byte, of the largest buffer of a ``.tflite`` flatbuffer.

    For an int8 model that is the biggest kernel's bytes: 16 clusters filled evenly give 4 bits,
    most weights in a few clusters less, and per-channel scales (each channel maps its clusters to
    other int8 values) more.
    """
    import numpy as np
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(content, 0)
    largest = max(
        (model.Buffers(i) for i in range(model.BuffersLength())), key=lambda b: b.DataLength()
    )
    counts = np.bincount(largest.DataAsNumpy().view(np.uint8), minlength=256)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def _accuracy(content: bytes, x, y) -> float:
    from tfopt.export import TFLiteModel, evaluate_tflite

    return evaluate_tflite(TFLiteModel(content, num_threads=2), x, y, batch_size=500).accuracy


def _row(converted: dict, float_gzip: int, **scores) -> dict:
    row = {k: v for k, v in converted.items() if k != "content"}
    return dict(row, ratio=round(float_gzip / row["gzip_bytes"], 3), **scores)


@contextlib.contextmanager
def _optimize_job(run_dir: str, seed: int, smoke: bool):
    """One tfopt.optimize job on ``run_dir``'s model; yields ``tune(settings) -> (model, phase infos)``.

    ``tune`` runs what ``python -m tfopt.optimize`` runs for one technique (the same Job, phase
    chain and mask-update frequency), keeps the model in memory and reads no test data; a phase
    chain already run in the job (e.g. the pruning that pcqat starts with) is reused.
    """
    from tfopt.models import load_model
    from tfopt.optimize import Context, fine_tunes_of, resolved, run_chain
    from tfopt.runs import load_run
    from tfopt.runtime import Job

    run = load_run(run_dir)
    train = {"seed": seed, "verbose": 0, "tensorboard": False}
    if smoke:
        train["steps_per_execution"] = 1
    cfg = C.from_dict(
        {
            "data": {"seed": seed},
            "train": train,
            "runtime": {"strategy": "one_device", "precision": "float32"},
        },
        run.config,
    )
    with Job(cfg, "optimize", out_dir=False) as job:
        ctx = Context(job=job)
        base = load_model(run.model_path)

        def tune(settings):
            settings.validate()
            fine_tunes = fine_tunes_of(ctx, settings)
            model, infos, _ = run_chain(
                ctx, fine_tunes, base, resolved(settings, fine_tunes).chain()
            )
            return model, infos

        yield tune


# --- selection, repeats --------------------------------------------------------------------------


def _select(tune, candidates, steps: int, calibration, val, float_gzip: int) -> dict:
    rows = []
    for recipe in candidates:
        started = time.perf_counter()
        model, infos = tune(recipe.settings(steps=steps))
        converted = _tflite(model, "int8", calibration)
        rows.append(
            _row(
                converted,
                float_gzip,
                val_accuracy=_accuracy(converted["content"], *val),
                recipe=asdict(recipe),
                train_accuracy=infos[-1].get("train_accuracy"),
                seconds=round(time.perf_counter() - started, 1),
            )
        )
    chosen = choose(rows)
    return {
        "rule": f"among candidates with gzip ratio >= {TARGET_RATIO:g}x, the highest validation accuracy "
        "(ties: fewer epochs, then the earlier one); if none, the largest ratio",
        "split": "validation",
        "candidates": rows,
        "chosen": chosen,
        "recipe": rows[chosen]["recipe"],
    }


def _repeat(
    args, base_dir: str, index: int, data: dict, base_model, float_gzip: int, recipe: Recipe | None
) -> tuple[dict, dict | None, Recipe]:
    """One seed: (repeat 1: the selection, then) the control, pruned, clustered and PCQAT models, and the peers."""
    from bench.peers import tfmot_clustering, tfmot_pruning

    seed = 1000 + index
    steps = 8 if args.smoke else 0
    calibration, test = data["calibration"], data["test"]
    started, cpu = time.perf_counter(), time.process_time()
    selection = None
    with _optimize_job(base_dir, seed, args.smoke) as tune:
        if recipe is None:
            candidates = SMOKE_CANDIDATES if args.smoke else CANDIDATES
            selection = _select(
                tune, candidates, steps, calibration, data["validation"], float_gzip
            )
            recipe = candidates[selection["chosen"]]
        control, _ = tune(recipe.settings(sparsity=0.0, steps=steps))
        pruned, _ = tune(recipe.settings(steps=steps))
        clustered, _ = tune(CLUSTER_ONLY.settings("cluster", steps=steps))
        clustered_linear, _ = tune(CLUSTER_ONLY.settings("cluster", steps=steps, init="linear"))
        pcqat, _ = tune(recipe.settings("pcqat", steps=steps))
    rows = {}
    control_tfl = _tflite(control, "float32")
    rows["control_float"] = _row(
        control_tfl, float_gzip, test_accuracy=_accuracy(control_tfl["content"], *test)
    )
    if (
        selection is not None
    ):  # for the record: how the control scores where the candidates were compared
        selection["control_val_accuracy"] = _accuracy(control_tfl["content"], *data["validation"])
    for name, model, cal in (
        ("pruned_int8", pruned, calibration),
        ("clustered_int8", clustered, calibration),
        ("clustered_linear_int8", clustered_linear, calibration),
        ("pcqat_int8", pcqat, None),
    ):
        converted = _tflite(model, "int8", cal)
        rows[name] = _row(
            converted, float_gzip, test_accuracy=_accuracy(converted["content"], *test)
        )
    x_train, y_train = data["train"]
    smoke_pruning = {"epochs": 1, "frequency": 1} if args.smoke else {}  # to reach 80% in 4 steps
    for name, peer, kwargs in (
        ("peer_pruning", tfmot_pruning, smoke_pruning),
        ("peer_clustering", tfmot_clustering, {}),
    ):
        out = peer.run(
            base_model,
            x_train,
            y_train,
            seed=seed,
            steps_per_epoch=4 if args.smoke else None,
            **kwargs,
        )
        converted = _sizes(out.pop("tflite"))
        rows[name] = _row(
            converted, float_gzip, test_accuracy=_accuracy(converted["content"], *test), **out
        )
    rows["seed"], rows["recipe"] = seed, recipe.name
    rows["seconds"], rows["cpu_seconds"] = (
        round(time.perf_counter() - started, 1),
        round(time.process_time() - cpu, 1),
    )
    return rows, selection, recipe


def run(args) -> dict:
    """Runs the whole benchmark; returns the result dict (``bench/_common.result``)."""
    from tfopt.export import calibration_batches, load_split
    from tfopt.models import load_model
    from tfopt.runs import load_run

    started, cpu = time.perf_counter(), time.process_time()
    base_dir = _base_run(args)
    cfg = load_run(base_dir).config
    limit = 1000 if args.smoke else 0
    data = {
        "validation": load_split(cfg.data, "validation", limit),
        "test": load_split(cfg.data, "test", limit),
        "train": load_split(cfg.data, "train"),
        "calibration": calibration_batches(cfg.data, 4 if args.smoke else 25),
    }
    base_model = load_model(load_run(base_dir).model_path)
    base = {}
    for name, mode in (("float", "float32"), ("int8", "int8")):
        converted = _tflite(base_model, mode, data["calibration"] if mode == "int8" else None)
        base[name] = {k: v for k, v in converted.items() if k != "content"}
        base[name].update(
            val_accuracy=_accuracy(converted["content"], *data["validation"]),
            test_accuracy=_accuracy(converted["content"], *data["test"]),
        )
    float_gzip = base["float"]["gzip_bytes"]
    base["int8"]["ratio"] = round(float_gzip / base["int8"]["gzip_bytes"], 3)
    repeats, selection, recipe = [], None, None
    for index in range(args.repeats):
        rows, chosen, recipe = _repeat(args, base_dir, index, data, base_model, float_gzip, recipe)
        selection = selection or chosen
        repeats.append(rows)
        # What is done so far, should a later repeat fail (the run takes ~40 min).
        write_json_atomic(
            os.path.join(args.workdir, "partial.json"),
            {"base": base, "selection": selection, "repeats": repeats},
        )
        print(
            f"B4: repeat {index + 1}/{args.repeats} done in {rows['seconds']:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    params = {
        "smoke": args.smoke,
        "repeats": args.repeats,
        "base_run": os.path.abspath(base_dir),
        "sparsity": SPARSITY,
        "clusters": CLUSTERS,
        "validation_examples": int(len(data["validation"][1])),
        "test_examples": int(len(data["test"][1])),
        "train_examples": int(len(data["train"][1])),
    }
    return result(
        "B4",
        "compression",
        COMMAND,
        figures(base, selection, repeats),
        params=params,
        base=base,
        selection=selection,
        repeats=repeats,
        seconds=round(seconds, 1),
        cpu_seconds=round(cpu_seconds, 1),
    )


# --- figures ------------------------------------------------------------------------------------


def _pt(a: float, b: float) -> float:
    return round(100.0 * (a - b), 3)


def figures(base: dict, selection: dict, repeats: list[dict]) -> list[dict]:
    """The published figures, each recomputable from the byte counts and accuracies of ``repeats``."""
    recipe = selection["recipe"]
    fgz, facc = base["float"]["gzip_bytes"], base["float"]["test_accuracy"]

    def ratios(name):
        return [fgz / r[name]["gzip_bytes"] for r in repeats]

    def med(name, key):
        return median(r[name][key] for r in repeats)

    def bits(name):
        return f"{med(name, 'largest_buffer_entropy_bits'):.2f}"

    pruned, peer_p = median(ratios("pruned_int8")), median(ratios("peer_pruning"))
    clustered, peer_c = median(ratios("clustered_int8")), median(ratios("peer_clustering"))
    loss_ctrl = [
        _pt(r["control_float"]["test_accuracy"], r["pruned_int8"]["test_accuracy"]) for r in repeats
    ]
    loss_base = [_pt(facc, r["pruned_int8"]["test_accuracy"]) for r in repeats]
    peer_loss = median(_pt(facc, r["peer_pruning"]["test_accuracy"]) for r in repeats)
    label = f"{recipe['name']} (chosen on validation)"
    return [
        figure(
            f"pruned 80% + int8 PTQ, gzip size: float / pruned, {label}",
            ratios("pruned_int8"),
            "x",
            target=(">=", TARGET_RATIO),
            anchor=ANCHOR_PRUNED,
            peer=f"tfmot pruning tutorial {peer_p:.2f}x (tfopt / peer {pruned / peer_p:.2f}x)",
            detail=f"float .tflite {fgz:,} B gzipped, pruned + int8 {med('pruned_int8', 'gzip_bytes'):,.0f} B",
        ),
        figure(
            f"pruned 80% + int8 PTQ, accuracy loss vs the float control fine-tuned the same "
            f"{recipe['epochs']} epochs",
            loss_ctrl,
            "pt",
            target=("<=", TARGET_LOSS_PT),
            peer=f"tfmot pruning tutorial: test accuracy {100 * med('peer_pruning', 'test_accuracy'):.2f}%",
            detail=f"control {100 * med('control_float', 'test_accuracy'):.2f}%, pruned + int8 "
            f"{100 * med('pruned_int8', 'test_accuracy'):.2f}% (10k test images, LiteRT)",
        ),
        figure(
            "(info) pruned 80% + int8 PTQ, accuracy loss vs the float model not fine-tuned",
            loss_base,
            "pt",
            peer=f"tfmot pruning tutorial {peer_loss:.2f} pt",
            detail=f"float model {100 * facc:.2f}%; the control's fine-tuning gained "
            f"{median(_pt(r['control_float']['test_accuracy'], facc) for r in repeats):+.2f} pt",
        ),
        figure(
            "clustered 16 + int8 PTQ, gzip size: float / clustered",
            ratios("clustered_int8"),
            "x",
            anchor=ANCHOR_CLUSTERED,
            peer=f"tfmot clustering tutorial {peer_c:.2f}x (tfopt / peer {clustered / peer_c:.2f}x)",
            detail=f"accuracy {100 * med('clustered_int8', 'test_accuracy'):.2f}% (peer "
            f"{100 * med('peer_clustering', 'test_accuracy'):.2f}%), float {100 * facc:.2f}%; dense "
            f"kernel {bits('clustered_int8')} bits per byte (peer {bits('peer_clustering')})",
        ),
        figure(
            "(info) clustered 16 with --centroid-init linear (the tutorial's) + int8 PTQ, gzip size: float / "
            "clustered",
            ratios("clustered_linear_int8"),
            "x",
            peer=f"tfmot clustering tutorial {peer_c:.2f}x",
            detail=f"accuracy {100 * med('clustered_linear_int8', 'test_accuracy'):.2f}%; dense kernel "
            f"{bits('clustered_linear_int8')} bits per byte (k-means++ {bits('clustered_int8')})",
        ),
        figure(
            "pruned 80% + clustered 16 + PCQAT int8, gzip size: float / PCQAT",
            ratios("pcqat_int8"),
            "x",
            detail=f"accuracy {100 * med('pcqat_int8', 'test_accuracy'):.2f}%, loss vs the control "
            f"{median(_pt(r['control_float']['test_accuracy'], r['pcqat_int8']['test_accuracy']) for r in repeats):.2f} pt "
            f"(PCQAT fine-tunes 2 epochs more)",
        ),
    ]


def _tables(res: dict) -> str:
    figs = [
        [
            f["name"],
            f"{f['value']:.2f} {f['unit']}",
            "-"
            if not f["spread"]
            else f"{f['spread'][0]:.2f} to {f['spread'][1]:.2f} ({f['repeats']})",
            f["target"] or "-",
            f["status"],
            f["peer"] or "-",
        ]
        for f in res["figures"]
    ]
    sel = res["selection"]
    cands = [
        [
            ("-> " if i == sel["chosen"] else "") + c["recipe"]["name"],
            f"{c['gzip_bytes']:,}",
            f"{c['ratio']:.2f}x",
            f"{100 * c['val_accuracy']:.2f}%",
        ]
        for i, c in enumerate(sel["candidates"])
    ]
    return (
        markdown_table(
            ["figure", "median", "range (repeats)", "target", "status", "peer, same run"], figs
        )
        + "\n\nSelection (validation split):\n"
        + markdown_table(["candidate", "gzip bytes", "float / candidate", "val acc"], cands)
    )


def main(argv=None) -> int:
    """Runs the benchmark, prints its tables and writes the JSON result."""
    ap = script_parser(
        __doc__,
        "compression",
        "tiny data and fine-tunings, 1 repeat (for tests)",
        workdir=None,
        workdir_help="where the base run goes (default: $TMPDIR/tfopt-bench-compression)",
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="fine-tuning repeats, one seed each (default 3)"
    )
    ap.add_argument(
        "--from", dest="source", help="start from this run instead of training the base CNN"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats = 1
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats} must be >= 1")
    args.workdir = args.workdir or os.path.join(
        tempfile.gettempdir(), "tfopt-bench-compression" + ("-smoke" if args.smoke else "")
    )
    res = run(args)
    print(
        f"B4: {args.repeats} repeat(s), medians; {res['seconds']:.0f} s wall, {res['cpu_seconds']:.0f} s CPU\n"
    )
    return publish(res, args.out, "B4", table=_tables(res))


if __name__ == "__main__":
    sys.exit(main())
