"""Training under any tf.distribute strategy: ``python -m tfopt.train``.

One run: validate TF_CONFIG -> pick the strategy -> prepare the data -> build and compile the
model inside ``strategy.scope()`` -> Keras ``fit`` with progress bar, TensorBoard, per-epoch
metrics and epoch-level backup -> evaluate on the held-out test split -> the chief writes the
model (``.keras`` and SavedModel) and ``run.json``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from tfopt import __version__
from tfopt import cli
from tfopt._keras import keras, tf
from tfopt.callbacks import EpochTimer, MetricsLogger, PlainValidation
from tfopt.config import RunConfig
from tfopt.data import pipeline
from tfopt.data import sources
from tfopt.fileio import write_json
from tfopt.models.io import save_model
from tfopt.models.registry import build_model, check_model_name
from tfopt.runtime import precision, strategy as strategy_lib
from tfopt.runtime.tf_config import ClusterInfo, parse_tf_config, validate_for_strategy
from tfopt.runtime.watchdog import StartupWatchdog

PROG = "tfopt.train"


def versions() -> dict:
    """Versions of tfopt, Python and the TensorFlow stack, for run.json."""
    import numpy

    out = {"tfopt": __version__, "python": platform.python_version(), "tensorflow": tf.__version__,
           "tf_keras": keras.__version__, "numpy": numpy.__version__}
    try:
        from importlib.metadata import version

        out["tensorflow_model_optimization"] = version("tensorflow-model-optimization")
    except Exception:  # not installed: nothing to report
        pass
    return out


def weights_digest(model: "keras.Model") -> str:
    """Returns a sha256 over all of ``model``'s weights (identical models, identical digests)."""
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    return h.hexdigest()


def connect(cfg: RunConfig, cluster: ClusterInfo | None):
    """Creates the strategy; multi-worker start-up is guarded by a watchdog and a first all-reduce."""
    if cluster is None or len(cluster.peers()) == 0:
        return strategy_lib.make_strategy(cfg.runtime, cluster)
    with StartupWatchdog(cfg.runtime.startup_timeout, cluster.peers()):
        strategy = strategy_lib.make_strategy(cfg.runtime, cluster)
        if cfg.runtime.strategy == "multi_worker_mirrored":
            # A first collective proves every peer is up before any data or model work.
            ones = strategy.run(lambda: tf.constant(1.0))
            strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None).numpy()
    return strategy


def lr_schedule(cfg: RunConfig, lr: float, steps_per_epoch: int):
    """The learning rate ``cfg.train.lr_schedule`` asks for: cosine-decayed over the run, or constant."""
    if cfg.train.lr_schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(lr, decay_steps=cfg.train.epochs * steps_per_epoch)
    return lr


def steps_per_execution(cfg: RunConfig, steps_per_epoch: int) -> int:
    """Steps per ``tf.function`` call: the configured value, else up to 32 (never more than an epoch)."""
    if cfg.train.steps_per_execution:
        return cfg.train.steps_per_execution
    # Per-step overhead dominates small models on CPU; a few dozen steps per call removes it.
    return max(1, min(32, steps_per_epoch))


def train_data(cfg: RunConfig, strategy, info):
    """The distributed, repeating training input for ``fit`` under ``strategy``.

    A repeating input with a fixed step count per epoch keeps every worker on the same number
    of steps and reshuffles on every pass; parameter-server training gets a DatasetCreator.
    """
    fn = pipeline.dataset_fn(cfg.data, "train", training=True, info=info)
    if cfg.runtime.strategy == "parameter_server":
        return keras.utils.experimental.DatasetCreator(fn)
    return strategy.distribute_datasets_from_function(fn)


def stage_callbacks(cfg: RunConfig, out_dir: str, chief: bool, scratch: str,
                    validation: PlainValidation) -> tuple[list, EpochTimer, MetricsLogger]:
    """The callbacks every training stage uses: epoch timer, validation, progress bar, metrics.csv/json,
    TensorBoard (optional) and, under a multi-device strategy, epoch-level BackupAndRestore.

    Returns:
        ``(callbacks, timer, logger)``.
    """
    timer = EpochTimer()
    logger = MetricsLogger(out_dir, enabled=chief, timer=timer)
    # Order matters: validation adds val_* to the logs before the progress bar and loggers read them.
    cbs: list = [timer, validation, keras.callbacks.ProgbarLogger(count_mode="steps"), logger]
    if cfg.train.tensorboard:
        cbs.append(keras.callbacks.TensorBoard(os.path.join(out_dir if chief else scratch, "tensorboard")))
    if cfg.runtime.strategy != "one_device":
        # Epoch-level backups resume bit-identically; BackupAndRestore refuses OneDeviceStrategy.
        cbs.append(keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup"), save_freq="epoch"))
    return cbs, timer, logger


def plain_copy(model: "keras.Model") -> "keras.Model":
    """A copy of ``model`` outside any strategy, compiled for evaluation: what gets validated and saved."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    copy.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return copy


def remove_if_empty(path: str) -> None:
    """Removes directory ``path`` if it is empty (BackupAndRestore leaves its directory behind)."""
    if os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)


def train(cfg: RunConfig) -> dict | None:
    """Runs one training job as described by ``cfg`` and the TF_CONFIG environment variable.

    Args:
        cfg: The resolved run configuration.

    Returns:
        The ``run.json`` content, or None in a parameter-server worker/ps process (which
        serves until it is stopped).

    Raises:
        TfoptError: bad TF_CONFIG, data or model choice.
    """
    # Validate every user choice before TensorFlow starts devices or servers.
    cluster = parse_tf_config(os.environ.get("TF_CONFIG"))
    validate_for_strategy(cluster, cfg.runtime.strategy)
    check_model_name(cfg.model.name)
    sources.check(cfg.data)
    if cfg.runtime.strategy == "parameter_server" and cluster.task_type in ("worker", "ps"):
        strategy_lib.run_server(cluster)
        return None
    chief = strategy_lib.is_chief(cluster)
    previous_policy = precision.policy_name()
    scratch = tempfile.mkdtemp(prefix="tfopt-worker-")
    out_dir = os.path.abspath(cfg.train.output_dir)
    try:
        strategy = connect(cfg, cluster)
        precision.set_policy(cfg.runtime.precision)
        replicas = strategy_lib.num_replicas(strategy)
        info = sources.prepare(cfg.data)
        n_train = info.splits["train"].num_records
        steps_per_epoch = cfg.train.steps_per_epoch or max(1, n_train // cfg.data.global_batch_size)
        lr = cfg.train.learning_rate * (replicas if cfg.train.scale_lr else 1)
        spe = steps_per_execution(cfg, steps_per_epoch)
        with strategy.scope():
            model = build_model(cfg.model.name, info.image_shape, info.num_classes, cfg.model.dropout)
            model.compile(
                optimizer=keras.optimizers.Adam(lr_schedule(cfg, lr, steps_per_epoch)),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"], steps_per_execution=spe)
        copy = plain_copy(model)
        val = PlainValidation(copy, pipeline.make_dataset(cfg.data, "validation", training=False, info=info), chief)
        cbs, timer, logger = stage_callbacks(cfg, out_dir, chief, scratch, val)
        started = time.perf_counter()
        model.fit(train_data(cfg, strategy, info), epochs=cfg.train.epochs,
                  steps_per_epoch=steps_per_epoch, callbacks=cbs, verbose=cfg.train.verbose if chief else 0)
        train_seconds = time.perf_counter() - started
        # Every worker reads the weights (a collective for sync-on-read variables); the chief writes.
        copy.set_weights(model.get_weights())
        digest = weights_digest(copy)
        result = None
        if chief:
            final = copy
            test = pipeline.make_dataset(cfg.data, "test", training=False, info=info)
            metrics = final.evaluate(test, return_dict=True, verbose=0)
            artifacts = save_model(final, out_dir)
            epoch_s = timer.seconds[1:] or timer.seconds
            examples = steps_per_epoch * cfg.data.global_batch_size
            result = {
                "tfopt_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "config": cfg.to_dict(),
                "versions": versions(),
                "strategy": {"name": cfg.runtime.strategy, "class": type(strategy).__name__,
                             "num_replicas": replicas,
                             "num_workers": cluster.num_workers if cluster else 1},
                "precision": cfg.runtime.precision,
                "data": {"name": info.name, "image_shape": list(info.image_shape),
                         "num_classes": info.num_classes,
                         "splits": {k: v.num_records for k, v in info.splits.items()}},
                "model": {"name": cfg.model.name, "params": int(final.count_params())},
                "train": {"epochs": len(timer.seconds), "steps_per_epoch": steps_per_epoch,
                          "steps_per_execution": spe, "global_batch_size": cfg.data.global_batch_size,
                          "per_replica_batch_size": cfg.data.global_batch_size // replicas,
                          "learning_rate": lr, "seconds": round(train_seconds, 3),
                          "epoch_seconds": [round(s, 3) for s in timer.seconds],
                          "examples_per_sec": round(examples / statistics.median(epoch_s), 1) if epoch_s else None},
                "history": logger.rows,
                "metrics": {f"test_{k}": float(v) for k, v in metrics.items()},
                "weights_sha256": digest,
                "artifacts": {k: os.path.relpath(v, out_dir) for k, v in artifacts.items()},
            }
            write_json(os.path.join(out_dir, "run.json"), result)
            remove_if_empty(os.path.join(out_dir, "backup"))
        task = f"{cluster.task_type}:{cluster.task_index}" if cluster else "local"
        summary = {"task": task, "weights_sha256": digest}
        if result:
            summary.update(result["metrics"], examples_per_sec=result["train"]["examples_per_sec"], output=out_dir)
        print(f"{PROG}: done {json.dumps(summary)}", flush=True)
        return result
    finally:
        precision.set_policy(previous_policy)
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point of ``python -m tfopt.train``; returns the exit code."""
    parser = cli.ArgumentParser(prog="python -m tfopt.train", description=__doc__.splitlines()[0])
    cli.add_config_args(parser)
    args = parser.parse_args(argv)

    def body() -> int:
        cfg = cli.config_from_args(args)
        if args.print_config:
            print(json.dumps(cfg.to_dict(), indent=2))
            return 0
        train(cfg)
        return 0

    return cli.run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
