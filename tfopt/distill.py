"""Knowledge distillation from trained runs: ``python -m tfopt.distill``.

    python -m tfopt.distill --teacher runs/mnist_cnn --student tiny_cnn --temperature 4 --alpha 0.9 --strategy mirrored
    python -m tfopt.distill --teacher runs/cnn_a --teacher runs/cnn_b --student tiny_cnn --teacher-weights accuracy
    python -m tfopt.distill --teacher runs/mnist_cnn --student tiny_cnn --technique prune --sparsity 0.75
    python -m tfopt.distill --teacher runs/mnist_cnn --student tiny_cnn --technique qat

One run: validate every choice -> strategy -> data -> teachers loaded (safe loader) inside
``strategy.scope()`` and scored on the validation and test splits (strategy-free copies) ->
student built (optionally wrapped by tfmot, so that compression keeps learning from the
teachers: ``prune`` with a polynomial schedule, ``cluster`` with trainable centroids, ``qat``
with fake quantization) -> ``Distiller.fit`` -> the chief scores the plain student on the test
split and writes a NEW run directory: the plain student (``model.keras`` + ``saved_model``;
pruning and clustering wrappers stripped, a QAT student saved so that it reloads with
``tfopt.optimize.load_quantized_model`` and converts to int8 with ``python -m tfopt.export``),
``run.json`` (config, teachers and their accuracies, student size, test accuracy, gaps, the
sparsity / clusters measured on the saved weights), ``metrics.csv/json`` and TensorBoard logs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

from tfopt import __version__, cli
from tfopt import train as train_lib
from tfopt._keras import keras
from tfopt.callbacks import PlainValidation
from tfopt.config import RunConfig, TrainConfig
from tfopt.data import pipeline, sources
from tfopt.errors import ConfigError, ModelError
from tfopt.fileio import write_json
from tfopt.models.distiller import COMBINE_MODES, Distiller, FeaturePair, accuracy_weights, teacher_log_probs
from tfopt.models.io import save_model
from tfopt.models.registry import build_model, check_model_name
from tfopt.runs import Run, load_run
from tfopt.runtime import precision, strategy as strategy_lib
from tfopt.runtime.tf_config import parse_tf_config, validate_for_strategy

PROG = "tfopt.distill"
TECHNIQUES = ("none", "prune", "cluster", "qat")
DEFAULT_OUTPUT = "runs/distilled"


@dataclasses.dataclass(frozen=True)
class DistillOptions:
    """What to distil from, and how (the data/runtime/train settings live in the RunConfig)."""

    teachers: tuple[str, ...]
    temperature: float = 4.0
    alpha: float = 0.9
    teacher_weights: str = "equal"  # equal | accuracy | comma-separated numbers
    combine: str = "probs"
    features: tuple[FeaturePair, ...] = ()
    feature_weight: float = 1.0
    technique: str = "none"
    sparsity: float = 0.75
    clusters: int = 16
    baseline: str | None = None  # run dir of the same student trained without a teacher
    seed: int | None = None
    trust_model: bool = False


def parse_feature(text: str) -> FeaturePair:
    """Parses ``[TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER`` (e.g. ``pool0:stem_relu``, ``1/fc:flatten``)."""
    index, sep, rest = text.partition("/")
    if not sep:
        index, rest = "0", text
    teacher_layer, colon, student_layer = rest.partition(":")
    if not colon or not teacher_layer or not student_layer or not index.isdigit():
        raise ConfigError(f"--feature {text!r} is not [TEACHER_INDEX/]TEACHER_LAYER:STUDENT_LAYER; "
                          "e.g. --feature pool0:stem_relu")
    return FeaturePair(teacher_layer, student_layer, int(index))


def _check(opts: DistillOptions, cfg: RunConfig) -> list[float] | None:
    """Validates the options before TensorFlow starts; returns fixed teacher weights if given."""
    if not opts.teachers:
        raise ConfigError("no --teacher given; give the run directory of a trained model (repeatable)")
    if not opts.temperature > 0:
        raise ConfigError(f"--temperature {opts.temperature} must be > 0 (Hinton et al. use 2-20)")
    if not 0.0 <= opts.alpha <= 1.0:
        raise ConfigError(f"--alpha {opts.alpha} must be in [0, 1] (0 = labels only, 1 = teacher only)")
    if opts.combine not in COMBINE_MODES:
        raise ConfigError(f"--combine {opts.combine!r} is not valid; choose one of {', '.join(COMBINE_MODES)}")
    if opts.technique not in TECHNIQUES:
        raise ConfigError(f"--technique {opts.technique!r} is not valid; choose one of {', '.join(TECHNIQUES)}")
    if opts.technique == "prune":
        if not 0.0 < opts.sparsity < 1.0:
            raise ConfigError(f"--sparsity {opts.sparsity} must be in (0, 1), e.g. 0.75")
    if opts.technique == "cluster" and not 2 <= opts.clusters <= 256:
        raise ConfigError(f"--clusters {opts.clusters} must be in [2, 256], e.g. 16")
    for pair in opts.features:
        if pair.teacher >= len(opts.teachers):
            raise ConfigError(f"--feature names teacher {pair.teacher}; there are {len(opts.teachers)} (0-based)")
    if opts.teacher_weights in ("equal", "accuracy"):
        return None
    try:
        weights = [float(w) for w in opts.teacher_weights.split(",")]
    except ValueError:
        weights = []
    if len(weights) != len(opts.teachers) or min(weights) < 0 or not sum(weights) > 0:
        raise ConfigError(f"--teacher-weights {opts.teacher_weights!r} must be equal, accuracy or "
                          f"{len(opts.teachers)} comma-separated non-negative numbers (one per --teacher)")
    return weights


def _check_paths(out_dir: str, runs: list[Run]) -> None:
    for run in runs:
        if os.path.realpath(out_dir) == os.path.realpath(run.path):
            raise ConfigError(f"-o {out_dir!r} is an input run; a stage writes a NEW run directory: give another -o")


def _logits(model: "keras.Model", dataset) -> tuple[np.ndarray, np.ndarray]:
    logits = model.predict(dataset, verbose=0)
    labels = np.concatenate([np.asarray(y) for _, y in dataset])
    return np.asarray(logits, np.float32), labels


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def _compress(student: "keras.Model", opts: DistillOptions, total_steps: int):
    """Wraps the student for ``opts.technique`` (inside the strategy scope).

    Returns:
        ``(student, callbacks, info)``: the wrapped student, the callbacks its wrappers need and
        what run.json records of the technique (None for ``none``).
    """
    if opts.technique == "none":
        return student, [], None
    from tfopt.optimize import cluster as cluster_lib
    from tfopt.optimize import prune as prune_lib
    from tfopt.optimize import quantize as quantize_lib
    from tfopt.optimize.common import rebuild

    policy = precision.policy_name()

    def float32_for(names):
        # Under a mixed policy the wrapped layers compute in float32 (see tfopt.optimize.techniques).
        return student if policy == "float32" else rebuild(student, policy, float32_layers=names)

    wrapper_dtype = None if policy == "float32" else "float32"
    if opts.technique == "prune":
        # Gradual pruning (Zhu & Gupta): 0 -> target over the first 70% of the steps, masks updated
        # every `frequency` steps; end_step is a multiple of it so the last update reaches the target.
        frequency = max(1, total_steps // 50)
        end_step = max(frequency, int(0.7 * total_steps) // frequency * frequency)
        spec = prune_lib.PruneSpec(sparsity=opts.sparsity, schedule="polynomial", end_step=end_step,
                                   frequency=frequency).validate()
        names = prune_lib.prunable_names(student, spec)
        wrapped = prune_lib.wrap(float32_for(names), spec, total_steps, names, wrapper_dtype=wrapper_dtype)
        return wrapped, prune_lib.callbacks(None), {"technique": "prune", **spec.to_dict(), "layers": names}
    if opts.technique == "cluster":
        spec = cluster_lib.ClusterSpec(clusters=opts.clusters).validate()
        names = cluster_lib.clusterable_names(student, spec)
        wrapped = cluster_lib.wrap(float32_for(names), spec, names, wrapper_dtype=wrapper_dtype)
        return wrapped, [], {"technique": "cluster", **spec.to_dict(), "layers": names}
    spec = quantize_lib.QatSpec().validate()
    names = quantize_lib.quantizable_names(student, spec)
    return quantize_lib.wrap(float32_for(names), spec, names), [], {"technique": "qat", **spec.to_dict(), "layers": names}


def _measured(plain: "keras.Model", compression: dict) -> dict:
    """Sparsity or cluster counts read back from the plain student's kernels."""
    from tfopt.optimize.common import total_sparsity, weight_table

    rows = [r for r in weight_table(plain) if r.layer in compression["layers"]]
    if compression["technique"] == "prune":
        return {"overall": total_sparsity(rows), "layers": {r.layer: r.sparsity for r in rows}}
    if compression["technique"] == "cluster":
        return {"unique_max": max(r.unique for r in rows), "layers": {r.layer: r.unique for r in rows}}
    return {"quantized_layers": len(compression["layers"])}


def distill(cfg: RunConfig, opts: DistillOptions) -> dict | None:
    """Distils the teachers' runs into ``cfg.model.name`` as described by ``cfg``, ``opts`` and TF_CONFIG.

    Returns:
        The ``run.json`` content (on the chief; None on other workers' and PS servers' processes
        that return, which parameter-server worker/ps tasks never do).

    Raises:
        TfoptError: a bad option, teacher run, TF_CONFIG, data or model choice.
    """
    cluster = parse_tf_config(os.environ.get("TF_CONFIG"))
    validate_for_strategy(cluster, cfg.runtime.strategy)
    check_model_name(cfg.model.name)
    sources.check(cfg.data)
    fixed_weights = _check(opts, cfg)
    teacher_runs = [load_run(p) for p in opts.teachers]
    baseline_run = load_run(opts.baseline) if opts.baseline else None
    out_dir = os.path.abspath(cfg.train.output_dir)
    _check_paths(out_dir, teacher_runs + ([baseline_run] if baseline_run else []))
    if cfg.runtime.strategy == "parameter_server" and cluster.task_type in ("worker", "ps"):
        strategy_lib.run_server(cluster)
    chief = strategy_lib.is_chief(cluster)
    previous_policy = precision.policy_name()
    scratch = tempfile.mkdtemp(prefix="tfopt-worker-")
    try:
        strategy = train_lib.connect(cfg, cluster)  # first TF work of the process (MultiWorkerMirrored)
        precision.set_policy(cfg.runtime.precision)
        if opts.seed is not None:
            keras.utils.set_random_seed(opts.seed)
        replicas = strategy_lib.num_replicas(strategy)
        info = sources.prepare(cfg.data)
        n_train = info.splits["train"].num_records
        steps_per_epoch = cfg.train.steps_per_epoch or max(1, n_train // cfg.data.global_batch_size)
        lr = cfg.train.learning_rate * (replicas if cfg.train.scale_lr else 1)
        spe = train_lib.steps_per_execution(cfg, steps_per_epoch)
        val_ds = pipeline.make_dataset(cfg.data, "validation", training=False, info=info)
        test_ds = pipeline.make_dataset(cfg.data, "test", training=False, info=info)

        with strategy.scope():
            teachers = [run.load_model(trust_model=opts.trust_model) for run in teacher_runs]
        for run, teacher in zip(teacher_runs, teachers):
            shape, classes = tuple(teacher.input_shape[1:]), teacher.output_shape[-1]
            if shape != tuple(info.image_shape) or classes != info.num_classes:
                raise ModelError(f"teacher {run.path!r} takes {shape} -> {classes} classes but {cfg.data.dataset!r} "
                                 f"has {tuple(info.image_shape)} -> {info.num_classes}; pass the --dataset the "
                                 "teacher was trained on")
        # Score the teachers on strategy-free copies (identical on every worker: deterministic data).
        plain_teachers = [train_lib.plain_copy(t) for t in teachers]
        val_logits = [_logits(t, val_ds) for t in plain_teachers]
        val_acc = [_accuracy(*v) for v in val_logits]
        if opts.teacher_weights == "accuracy":
            weights = accuracy_weights(val_acc, info.num_classes)
        else:
            weights = fixed_weights or [1.0] * len(teachers)
        weights = [w / sum(weights) for w in weights]

        with strategy.scope():
            student = build_model(cfg.model.name, info.image_shape, info.num_classes, cfg.model.dropout)
            student, extra_callbacks, compression = _compress(student, opts, cfg.train.epochs * steps_per_epoch)
            distiller = Distiller(student, teachers, temperature=opts.temperature, alpha=opts.alpha,
                                  teacher_weights=weights, combine=opts.combine, features=opts.features,
                                  feature_weight=opts.feature_weight)
            distiller.compile(optimizer=keras.optimizers.Adam(train_lib.lr_schedule(cfg, lr, steps_per_epoch)),
                              steps_per_execution=spe)
        plain = distiller.plain_student()
        plain.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        validation = PlainValidation(plain, val_ds, chief, weights_fn=distiller.student_weights)
        cbs, timer, logger = train_lib.stage_callbacks(cfg, out_dir, chief, scratch, validation)
        cbs = extra_callbacks + cbs  # UpdatePruningStep re-masks the weights before validation reads them
        digests_before = distiller.teacher_digests()
        started = time.perf_counter()
        distiller.fit(train_lib.train_data(cfg, strategy, info), epochs=cfg.train.epochs,
                      steps_per_epoch=steps_per_epoch, callbacks=cbs, verbose=cfg.train.verbose if chief else 0)
        train_seconds = time.perf_counter() - started  # fit raised ModelError if a teacher had changed
        plain.set_weights(distiller.student_weights())  # every worker (collective); the chief writes
        digest = train_lib.weights_digest(plain)
        result = None
        if chief:
            result = _record(cfg, opts, strategy, cluster, info, teacher_runs, plain_teachers, plain, weights, val_acc,
                             digests_before, test_ds, baseline_run, compression, timer, logger,
                             steps_per_epoch, spe, lr, train_seconds, digest, out_dir)
        task = f"{cluster.task_type}:{cluster.task_index}" if cluster else "local"
        summary = {"task": task, "weights_sha256": digest}
        if result:
            summary.update(result["metrics"], output=out_dir)
        print(f"{PROG}: done {json.dumps(summary)}", flush=True)
        return result
    finally:
        precision.set_policy(previous_policy)
        shutil.rmtree(scratch, ignore_errors=True)


def _record(cfg, opts, strategy, cluster, info, teacher_runs, teachers, plain, weights, val_acc, digests,
            test_ds, baseline_run, compression, timer, logger, steps_per_epoch, spe, lr,
            train_seconds, digest, out_dir) -> dict:
    """Scores the student and teachers on the test split, saves the student and writes run.json.

    Runs on the chief alone, so it touches only strategy-free models: reading a strategy
    variable here would be a collective that the other workers never join.
    """
    metrics = plain.evaluate(test_ds, return_dict=True, verbose=0)
    student_acc = float(metrics["accuracy"])
    test_logits = [_logits(t, test_ds) for t in teachers]
    labels = test_logits[0][1]
    teacher_acc = [_accuracy(*t) for t in test_logits]
    combined = teacher_log_probs([t[0] for t in test_logits], weights, opts.temperature, opts.combine)
    target_acc = _accuracy(combined.numpy(), labels)  # the combined soft target's own accuracy
    gap = {"teacher_test_accuracy": target_acc, "student_test_accuracy": student_acc,
           "teacher_minus_student_pt": round(100 * (target_acc - student_acc), 3)}
    if baseline_run is not None:
        base = train_lib.plain_copy(baseline_run.load_model(trust_model=opts.trust_model))
        base_acc = float(base.evaluate(test_ds, return_dict=True, verbose=0)["accuracy"])
        gap.update(baseline_run=baseline_run.path, baseline_test_accuracy=base_acc,
                   gap_closed=(student_acc - base_acc) / (target_acc - base_acc) if target_acc > base_acc else None)
    artifacts = save_model(plain, out_dir)
    replicas = strategy_lib.num_replicas(strategy)
    epoch_s = timer.seconds[1:] or timer.seconds
    teacher_params = [int(t.count_params()) for t in teachers]
    result = {
        "tfopt_version": __version__,
        "stage": "distill",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": cfg.to_dict(),
        "versions": train_lib.versions(),
        "strategy": {"name": cfg.runtime.strategy, "class": type(strategy).__name__, "num_replicas": replicas,
                     "num_workers": cluster.num_workers if cluster else 1},
        "precision": cfg.runtime.precision,
        "data": {"name": info.name, "image_shape": list(info.image_shape), "num_classes": info.num_classes,
                 "splits": {k: v.num_records for k, v in info.splits.items()}},
        "distill": {"temperature": opts.temperature, "alpha": opts.alpha, "combine": opts.combine,
                    "teacher_weights": opts.teacher_weights, "features": [dataclasses.asdict(p) for p in opts.features],
                    "feature_weight": opts.feature_weight, "technique": opts.technique, "seed": opts.seed},
        "teachers": [{"run": run.path, "model": run.config.model.name, "params": p, "weight": w,
                      "val_accuracy": va, "test_accuracy": ta, "weights_sha256": d, "unchanged": True}
                     for run, p, w, va, ta, d in zip(teacher_runs, teacher_params, weights, val_acc, teacher_acc,
                                                     digests)],
        "model": {"name": cfg.model.name, "role": "student", "params": int(plain.count_params()),
                  "teacher_to_student_params": round(max(teacher_params) / max(1, plain.count_params()), 2)},
        "train": {"epochs": len(timer.seconds), "steps_per_epoch": steps_per_epoch, "steps_per_execution": spe,
                  "global_batch_size": cfg.data.global_batch_size,
                  "per_replica_batch_size": cfg.data.global_batch_size // replicas, "learning_rate": lr,
                  "seconds": round(train_seconds, 3), "epoch_seconds": [round(s, 3) for s in timer.seconds],
                  "examples_per_sec": round(steps_per_epoch * cfg.data.global_batch_size / statistics.median(epoch_s),
                                            1) if epoch_s else None},
        "history": logger.rows,
        "metrics": {f"test_{k}": float(v) for k, v in metrics.items()},
        "gap": gap,
        "weights_sha256": digest,
        "artifacts": {k: os.path.relpath(v, out_dir) for k, v in artifacts.items()},
    }
    if compression is not None:
        result["compression"] = dict(compression, measured=_measured(plain, compression))
    write_json(os.path.join(out_dir, "run.json"), result)
    train_lib.remove_if_empty(os.path.join(out_dir, "backup"))
    return result


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.distill``; returns the exit code."""
    parser = cli.ArgumentParser(prog="python -m tfopt.distill", description=__doc__.splitlines()[0])
    g = parser.add_argument_group("distillation")
    g.add_argument("--teacher", action="append", default=[], metavar="RUN",
                   help="run directory of a trained teacher (repeat for several teachers)")
    g.add_argument("--student", help="registered student model: tiny_cnn (default), mlp, mobilenet_tiny, cnn")
    g.add_argument("--temperature", type=float, default=4.0, help="softmax temperature T (default 4)")
    g.add_argument("--alpha", type=float, default=0.9, help="weight of the teacher term in [0, 1] (default 0.9)")
    g.add_argument("--teacher-weights", default="equal",
                   help="equal (default), accuracy (from validation accuracy) or W1,W2,... (one per --teacher)")
    g.add_argument("--combine", default="probs", help=f"combine teachers' {' or '.join(COMBINE_MODES)} (default probs)")
    g.add_argument("--feature", action="append", default=[], metavar="[I/]TEACHER_LAYER:STUDENT_LAYER",
                   help="feature distillation between two named layers (repeatable)")
    g.add_argument("--feature-weight", type=float, default=1.0, help="weight of the feature term (default 1)")
    g.add_argument("--technique", default="none", help=f"compress while distilling: {', '.join(TECHNIQUES)}")
    g.add_argument("--sparsity", type=float, default=0.75, help="target sparsity for --technique prune")
    g.add_argument("--clusters", type=int, default=16, help="centroids per kernel for --technique cluster")
    g.add_argument("--baseline", metavar="RUN", help="run of the same student trained without a teacher (gap closed)")
    g.add_argument("--seed", type=int, help="seed for the student's initial weights")
    g.add_argument("--trust-model", action="store_true", help="load teacher files that can run code (see models.io)")
    cli.add_config_args(parser)
    args = parser.parse_args(argv)

    def body() -> int:
        if args.student and args.model and args.student != args.model:
            raise ConfigError(f"--student {args.student!r} and --model {args.model!r} disagree; give only --student")
        args.model = args.student or args.model or "tiny_cnn"
        cfg = cli.config_from_args(args)
        if args.output is None and cfg.train.output_dir == TrainConfig.output_dir:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, output_dir=DEFAULT_OUTPUT))
        opts = DistillOptions(
            teachers=tuple(args.teacher), temperature=args.temperature, alpha=args.alpha,
            teacher_weights=args.teacher_weights, combine=args.combine,
            features=tuple(parse_feature(f) for f in args.feature), feature_weight=args.feature_weight,
            technique=args.technique, sparsity=args.sparsity, clusters=args.clusters, baseline=args.baseline, seed=args.seed,
            trust_model=args.trust_model)
        _check(opts, cfg)
        if args.print_config:
            print(json.dumps({"config": cfg.to_dict(), "distill": dataclasses.asdict(opts)}, indent=2))
            return 0
        distill(cfg, opts)
        return 0

    return cli.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
