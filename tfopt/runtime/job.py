"""The Job: the one context every stage (train, distill, optimize) runs in.

A stage's own module holds only what is specific to it; everything else is here:

    with Job(cfg, "train", out_dir=..., options=...) as job:   # validated before TensorFlow starts
        with job.strategy.scope():
            model = ...
            model.compile(optimizer=job.optimizer(job.learning_rate(), total_steps), ...)
        job.fit(model, job.callbacks(validation), epochs=..., steps_per_epoch=...)
        job.commit(job.record(...))                            # the chief only, atomically

Entering the job: TF_CONFIG validated for the strategy, a parameter-server ``worker``/``ps``
task serves instead (the launcher or Kubernetes ends it), the strategy created (multi-worker
start-up under a watchdog and a first all-reduce), the precision policy set (and restored on
exit: nothing else touches the global policy), the data prepared once (its ``DatasetInfo`` is
passed down), the work directory opened (see :mod:`tfopt.runtime.rundir`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from tfopt._keras import keras, tf

import numpy as np

from tfopt import _compat
from tfopt._version import __version__
from tfopt.config import DataConfig, RunConfig
from tfopt.data import pipeline, service, sources
from tfopt.errors import PeerLost, TrainingError
from tfopt.log import PROGRESS, RESULT
from tfopt.runs import RunRecord, default_output, fingerprint
from tfopt.runtime import autoprecision, precision, quality, sharding, sidecar
from tfopt.runtime import strategy as strategy_lib
from tfopt.runtime.backup import Backup, NonFinite
from tfopt.runtime.callbacks import EpochTimer, MetricsLogger, PlainValidation
from tfopt.runtime.rundir import RunDir
from tfopt.runtime.tf_config import (
    ClusterInfo,
    exposure_warning,
    parse_tf_config,
    validate_for_strategy,
)
from tfopt.runtime.watchdog import StartupWatchdog
from tfopt.specs import AUTO_PRECISION, PRECISIONS, STRATEGIES

log = logging.getLogger(__name__)

# Settings that change where or how loudly a run writes, not what it computes.
_NOT_FINGERPRINTED = {
    ("train", "output_dir"),
    ("train", "verbose"),
    ("train", "tensorboard"),
    ("data", "data_dir"),
    ("data", "verify"),
    ("runtime", "startup_timeout"),
    ("train", "backup_every"),
    # A checkpoint restores into any sharding (tfopt.runtime.sharding): a resume may change it.
    ("runtime", "variable_partitioner"),
    ("runtime", "min_shard_bytes"),
    ("runtime", "max_shard_bytes"),
    ("runtime", "max_shards"),
    ("runtime", "bytes_per_pack"),  # how the same sums travel, not what they are
}


def versions() -> dict:
    """Versions of tfopt, Python and the TensorFlow stack, for run.json."""
    import numpy

    out = {
        "tfopt": __version__,
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "tf_keras": keras.__version__,
        "numpy": numpy.__version__,
    }
    try:
        out["tensorflow_model_optimization"] = version("tensorflow-model-optimization")
    except PackageNotFoundError:  # not installed: nothing to report
        pass
    return out


def run_record(stage: str, cfg: RunConfig, output_dir: str | None = None, **sections) -> RunRecord:
    """The one builder of every stage's ``run.json`` record.

    Args:
        stage: ``train``, ``distill``, ``optimize`` or ``export``.
        cfg: The config the stage ran with.
        output_dir: The run directory the record is committed to (stored as
            ``config.train.output_dir``); None keeps the config's.
        **sections: The other :class:`~tfopt.runs.RunRecord` fields (``model``, ``metrics``, ...).
    """
    config = cfg.to_dict()
    if output_dir is not None:
        config["train"]["output_dir"] = output_dir
    return RunRecord(stage=stage, config=config, versions=versions(), **sections)


def compress_allreduce(optimizer: keras.optimizers.Optimizer, dtype: str) -> None:
    """Makes ``optimizer`` sum its gradients across replicas as ``dtype`` (e.g. ``bfloat16``).

    Each gradient is cast before the all-reduce and cast back to its variable's dtype after it,
    so every replica applies the same sum while half the bytes cross the network (bfloat16
    keeps float32's range, with 8 bits of mantissa). The optimizer keeps its class: what is
    saved with the model is a plain Adam. It overrides Keras' documented hook,
    ``Optimizer.aggregate_gradients``, on this instance only.

    Args:
        optimizer: A tf_keras optimizer (not a ``LossScaleOptimizer``: wrap after).
        dtype: The dtype the gradients cross the wire as.
    """
    wire = tf.as_dtype(dtype)

    def aggregate_gradients(grads_and_vars):
        pairs = [(g, v) for g, v in grads_and_vars]
        kept = [(g, v) for g, v in pairs if g is not None]
        if not kept:
            return pairs
        summed = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, [tf.cast(g, wire) for g, _ in kept]
        )
        back = iter(tf.cast(s, g.dtype) for s, (g, _) in zip(summed, kept, strict=True))
        return [(None, v) if g is None else (next(back), v) for g, v in pairs]

    optimizer.aggregate_gradients = aggregate_gradients


def weights_digest(model: keras.Model) -> str:
    """Returns a sha256 over all of ``model``'s weights (identical models, identical digests)."""
    h = hashlib.sha256()
    for w in sharding.full_weights(model):
        h.update(w.tobytes())
    return h.hexdigest()


def plain_copy(model: keras.Model) -> keras.Model:
    """A copy of ``model`` outside any strategy, compiled for evaluation: what gets validated and saved."""
    copy = keras.models.clone_model(model)
    sharding.set_full_weights(copy, sharding.full_weights(model))
    copy.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    _compat.build_step_state(copy)
    return copy


def cluster_id(cluster: ClusterInfo | None) -> str | None:
    """What identifies a multi-worker run's cluster (its task addresses), or None for one process."""
    if cluster is None:
        return None
    return hashlib.sha256(json.dumps(cluster.cluster, sort_keys=True).encode()).hexdigest()[:16]


def result_config(cfg: RunConfig) -> dict:
    """The parts of ``cfg`` that determine a run's result (the fingerprint's input)."""
    out = cfg.to_dict()
    for section, key in _NOT_FINGERPRINTED:
        out.get(section, {}).pop(key, None)
    return out


def connect(cfg: RunConfig, cluster: ClusterInfo | None):
    """Creates the strategy; multi-worker start-up is guarded by a watchdog and a first all-reduce."""
    spec = STRATEGIES.get(cfg.runtime.strategy)
    if (
        cluster is not None and cluster.is_evaluator
    ):  # takes no part in the training: no collective, no server
        return tf.distribute.get_strategy()
    if cluster is None or len(cluster.peers()) == 0:
        return strategy_lib.make_strategy(cfg.runtime, cluster)
    with StartupWatchdog(cfg.runtime.startup_timeout, cluster.peers()):
        strategy = strategy_lib.make_strategy(cfg.runtime, cluster)
        if spec.first_collective:
            # A first collective proves every peer is up before any data or model work.
            ones = strategy.run(lambda: tf.constant(1.0))
            strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None).numpy()
    return strategy


class Job:
    """The context of one stage run: cluster, strategy, precision, data, work directory, callbacks.

    Args:
        cfg: The resolved run configuration.
        stage: ``train``, ``distill`` or ``optimize``.
        out_dir: The run directory to make; None = the stage's fresh default (``runs/<stage>``,
            ``runs/<stage>-2``, ...); ``False`` = the stage commits its own directories.
        options: The stage's own settings (plain data): part of the fingerprint and run.json.
        overwrite: Replace a finished run at ``out_dir``, or a work directory of another config.
        build_model: ``build(model_cfg, image_shape, num_classes) -> keras.Model``: what
            ``--precision auto`` times each candidate policy on (the stage's model builder).

    Raises:
        TfoptError: bad TF_CONFIG for the strategy, data source, or output directory; all of
            it before TensorFlow starts a device or a server.
    """

    def __init__(
        self,
        cfg: RunConfig,
        stage: str,
        *,
        out_dir: str | None | bool = None,
        options: dict | None = None,
        overwrite: bool = False,
        build_model: Callable | None = None,
    ):
        self.cfg = cfg
        self.build_model = build_model
        self.stage = stage
        self.spec = STRATEGIES.get(cfg.runtime.strategy)
        self.precision = PRECISIONS.get(cfg.runtime.precision)
        self.cluster = parse_tf_config(os.environ.get("TF_CONFIG"))
        validate_for_strategy(self.cluster, cfg.runtime.strategy)
        sources.check(cfg.data)
        service.check(cfg)
        self.chief = strategy_lib.is_chief(self.cluster)
        self.options = options or {}
        self.fingerprint = fingerprint(stage, result_config(cfg), self.options)
        exposed = exposure_warning(self.cluster)
        if exposed and self.chief:  # once per job
            log.warning(exposed, extra={"prog": f"tfopt {stage}"})
        self.run_dir: RunDir | None = None
        if out_dir is not False:
            cluster = cluster_id(self.cluster)
            explicit = out_dir or cfg.train.output_dir
            self.run_dir = RunDir(
                explicit or default_output(stage, cluster=cluster),
                self.fingerprint,
                {"config": result_config(cfg), stage: self.options},
                overwrite=overwrite,
                chief=self.chief,
                cluster=cluster,
                pick=None if explicit else lambda: default_output(stage, cluster=cluster),
            )
            self.run_dir.check()
        self.strategy = None
        self.info = None
        self.scratch = ""
        self.timer: EpochTimer | None = None
        self.logger: MetricsLogger | None = None
        self.train_seconds = 0.0
        self._resumed = False  # a work directory of this config was there when the Job started
        self.resumed_from_step = 0  # the global step the last fit resumed at (0: from the start)
        self.rollbacks = 0
        self.optimizer_steps = (
            0  # steps the optimizer applied in the last fit (all of them, resumed or not)
        )
        self._fits = 0
        self._fitted: keras.Model | None = None  # the model of the last fit (its shard table)
        self._unopened = False  # an attached run directory not opened yet
        self._lr_scale = None
        self._previous_policy: str | None = None
        self.precision_probe: autoprecision.Probe | None = None  # what `auto` measured and chose
        self.model_input: dict | None = None  # what settled data.input_scale (use_data)

    @property
    def serves(self) -> bool:
        """True for a parameter-server ``worker``/``ps`` task, which only runs a TensorFlow server."""
        return (
            self.spec.needs_servers
            and self.cluster is not None
            and self.cluster.task_type in ("worker", "ps")
        )

    def __enter__(self) -> Job:
        if self.serves:
            strategy_lib.run_server(
                self.cluster
            )  # serves until the launcher (or Kubernetes) ends the process
        self._previous_policy = precision.policy_name()
        self.scratch = tempfile.mkdtemp(prefix=f"tfopt-{self.stage}-")
        try:
            self.strategy = connect(
                self.cfg, self.cluster
            )  # the first TensorFlow work (MultiWorkerMirrored)
            requested = self.cfg.runtime.precision
            precision.set_policy("float32" if requested == AUTO_PRECISION else requested)
            # The same initial weights on every worker and in every run of this config.
            keras.utils.set_random_seed(self.cfg.train.seed)
            if self.cfg.runtime.deterministic:
                tf.config.experimental.enable_op_determinism()
                # Dropout draws from tf.random.Generator variables, which backups save and restore.
                keras.backend.experimental.enable_tf_random_generator()
            service.resolve(self.cfg.data)  # a dead dispatcher fails now, not at the first batch
            self.info = sources.prepare(self.cfg.data)
            prog = {"prog": f"tfopt {self.stage}"}
            log.debug(
                f"{self.cfg.runtime.strategy}: {self.strategy.num_replicas_in_sync} replica(s), "
                f"global batch {self.cfg.data.global_batch_size}, seed {self.cfg.train.seed}",
                extra=prog,
            )
            for split, info in self.info.splits.items():
                log.debug(
                    f"{self.info.name} {split}: {info.num_records} records in {len(info.files)} "
                    f"{info.encoding} shard(s) under {os.path.dirname(info.files[0]) if info.files else '-'}",
                    extra=prog,
                )
            self._resolve_precision()
            splits = ", ".join(
                f"{self.info.splits[k].num_records} {k}"
                for k in ("train", "validation", "test")
                if k in self.info.splits
            )
            # Said when the first fit opens the run directory: a refused model or input before
            # it stays one error line.
            self._start_line = (
                f"writing {self.run_dir.path if self.run_dir else '(no run directory)'}: "
                f"{self.info.name} ({splits}; {self.info.num_classes} classes, "
                f"{'x'.join(map(str, self.info.image_shape))}), {self.cfg.runtime.strategy} on "
                f"{self.strategy.num_replicas_in_sync} replica(s), global batch "
                f"{self.cfg.data.global_batch_size}, {self.cfg.runtime.precision}"
            )
            if self.run_dir is not None:
                self._resumed = self.run_dir.resuming  # before open() stamps the work directory
                # Opened by the first fit: a model that cannot be built or does not fit the data leaves
                # nothing behind (and a crashed run of other settings is not discarded for it).
                self._unopened = True
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def say(self, message: str) -> None:
        """One progress line on the chief (shown unless ``--quiet``), named after the stage."""
        if self.chief:
            log.log(PROGRESS, message, extra={"prog": f"tfopt {self.stage}"})

    def _resolve_precision(self) -> None:
        """``auto``: probe the candidate policies, then run under the faster (``self.cfg`` names it
        from now on); an explicit ``mixed_bfloat16`` without bf16 hardware: a warning."""
        prog = f"tfopt {self.stage}"
        if self.cfg.runtime.precision != AUTO_PRECISION:
            if self.chief:
                precision.warn_without_bf16_hardware(self.cfg.runtime.precision, prog)
            return
        if self.evaluator:
            self.precision_probe = autoprecision.Probe("float32", "the evaluator trains nothing")
        elif self.build_model is None:
            raise TypeError(f"Job({self.stage!r}) needs build_model= for --precision auto")
        else:
            local = self.spec.needs_servers  # parameter servers: the chief probes on its own CPU
            multi = self.cluster and self.spec.multi_process and not local
            self.precision_probe = autoprecision.resolve(
                self.cfg,
                build=self.build_model,
                strategy=self.strategy,
                info=self.info,
                learning_rate=self.learning_rate(),
                local=local,
                workers=self.cluster.num_workers if multi else 1,
            )
        chosen = self.precision_probe.policy
        self.cfg = replace_config(self.cfg, runtime={"precision": chosen})
        self.precision = PRECISIONS.get(chosen)
        precision.set_policy(chosen)
        keras.utils.set_random_seed(
            self.cfg.train.seed
        )  # the probe drew from the generators: same start as without it
        # Every process says what it runs under (multi-worker: the same averaged numbers, the same choice).
        log.info(self.precision_probe.log_line(), extra={"prog": prog})

    def __exit__(self, *exc) -> None:
        if self.run_dir is not None:
            self.run_dir.release()  # committed or not, this process no longer writes it
        if self._previous_policy is not None:
            precision.set_policy(self._previous_policy)
            self._previous_policy = None
        shutil.rmtree(self.scratch, ignore_errors=True)

    # -- numbers every stage derives the same way -------------------------------------------

    @property
    def replicas(self) -> int:
        """Replicas each global batch is split over."""
        return strategy_lib.num_replicas(self.strategy)

    @property
    def resuming(self) -> bool:
        """True when this run continues a crashed run of the same settings."""
        return self._resumed

    def steps_per_epoch(self, override: int = 0) -> int:
        """``override``, else ``train.steps_per_epoch``, else one pass over the training split."""
        n_train = self.info.splits["train"].num_records
        return (
            override
            or self.cfg.train.steps_per_epoch
            or max(1, n_train // self.cfg.data.global_batch_size)
        )

    def steps_per_execution(self, steps_per_epoch: int) -> int:
        """Steps per ``tf.function`` call: the configured value, else up to 32 (never more than an
        epoch) and, with ``train.backup_every``, a divisor of it so that backups land on their steps."""
        # Per-step overhead dominates small models on CPU; a few dozen steps per call removes it.
        if self.cfg.train.steps_per_execution:
            return self.cfg.train.steps_per_execution
        most = max(1, min(32, steps_per_epoch))
        every = self.cfg.train.backup_every
        return max(d for d in range(1, most + 1) if every % d == 0) if every else most

    def learning_rate(self, lr: float | None = None) -> float:
        """``lr`` (default ``train.learning_rate``), times the replica count under ``train.scale_lr``."""
        lr = self.cfg.train.learning_rate if lr is None else lr
        return lr * (self.replicas if self.cfg.train.scale_lr else 1)

    def optimizer(self, lr: float, total_steps: int) -> keras.optimizers.Optimizer:
        """Adam with the configured schedule (cosine-decayed to 0 over ``total_steps``, or constant).

        Under ``mixed_float16`` the optimizer scales the loss (compile() only does it for
        models whose own policy is mixed_float16; tfmot-wrapped models may not be).
        """
        schedule = lr
        if self.cfg.train.lr_schedule == "cosine":
            schedule = keras.optimizers.schedules.CosineDecay(lr, decay_steps=max(1, total_steps))
        # The NaN guard lowers the rate through this variable (saved with every backup).
        self._lr_scale = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="lr_scale")
        opt = keras.optimizers.Adam(ScaledSchedule(schedule, self._lr_scale))
        if self.cfg.runtime.allreduce_dtype != "float32":
            compress_allreduce(opt, self.cfg.runtime.allreduce_dtype)
        if self.precision.loss_scaling:
            opt = keras.mixed_precision.LossScaleOptimizer(opt)
        return opt

    # -- data ---------------------------------------------------------------------------------

    def use_data(self, data: DataConfig, model_input: dict | None = None) -> None:
        """Runs on with ``data`` as the data section (``data.input_scale`` settled for the model):
        every dataset made afterwards, and the record, follow it. ``model_input`` (what decided
        the scale) goes into the record's ``data.model_input``."""
        self.cfg = dataclasses.replace(self.cfg, data=data)
        self.model_input = model_input

    def _input_words(self) -> str:
        """``; the model gets pixels / 255 (input scale unit, decided by default)``, once settled."""
        if not getattr(self, "model_input", None):
            return ""
        data = self.cfg.data
        fed = "0-255 pixels" if data.input_scale == "raw" else "pixels / 255"
        norm = f", normalized {data.normalize}" if data.normalize else ""
        return (
            f"; the model gets {fed}{norm} (input scale {data.input_scale}, decided by "
            f"{self.model_input.get('decided_by', '?')})"
        )

    def train_input(self, start_step: int = 0):
        """The distributed, endless training input for ``fit``, from global step ``start_step`` on.

        An endless stream with a fixed step count per epoch keeps every worker on the same number
        of steps and reshuffles on every pass; parameter-server training gets a DatasetCreator
        (whose workers each read their own stream, so a resume starts each at its share of the steps).
        """
        data = self.cfg.data
        if self.cfg.runtime.deterministic:
            data = dataclasses.replace(data, deterministic=True)
        if self.spec.needs_servers:
            start_step //= max(1, self.cluster.num_workers if self.cluster else 1)
        name = service.job_name(self.stage, "train", self.fingerprint, data) if data.service else ""
        fn = pipeline.dataset_fn(
            data, "train", training=True, info=self.info, start_step=start_step, service_job=name
        )
        if self.spec.needs_servers:
            return keras.utils.experimental.DatasetCreator(fn)
        return self.strategy.distribute_datasets_from_function(fn)

    def dataset(self, split: str):
        """The whole ``split`` for a strategy-free model, read deterministically."""
        return pipeline.make_dataset(self.cfg.data, split, training=False, info=self.info)

    # -- fit ----------------------------------------------------------------------------------

    @property
    def write_dir(self) -> str:
        """Where this process writes: the work directory on the chief, a scratch directory elsewhere."""
        return self.run_dir.work if (self.chief and self.run_dir is not None) else self.scratch

    @property
    def verbose(self) -> int:
        """Keras verbosity: progress on the chief only; per epoch under parameter servers (Keras refuses a bar)."""
        if not self.chief or not self.cfg.train.verbose:
            return 0
        return 2 if self.spec.needs_servers else self.cfg.train.verbose

    def callbacks(
        self, validation: keras.callbacks.Callback, extra: list | tuple = (), first_epoch: int = 0
    ) -> list:
        """The callbacks every training stage uses, in order: ``extra`` (e.g. tfmot's), epoch timer,
        validation, progress, metrics.csv/json and TensorBoard (optional); ``fit`` adds the backup.

        ``first_epoch``: epochs of this run fitted before (a later phase, e.g. after frozen base
        layers): the history goes on from there, with the epoch times of every phase.
        """
        if not first_epoch or self.timer is None:
            self.timer = EpochTimer()
        self.logger = MetricsLogger(
            self.write_dir,
            enabled=self.chief and self.run_dir is not None,
            timer=self.timer,
            first_epoch=first_epoch,
        )
        # Order matters: validation adds val_* to the logs before the progress bar and loggers read them.
        cbs: list = [
            *extra,
            self.timer,
            validation,
            keras.callbacks.ProgbarLogger(count_mode="steps"),
            self.logger,
        ]
        if self.cfg.train.tensorboard:
            cbs.append(keras.callbacks.TensorBoard(os.path.join(self.write_dir, "tensorboard")))
        return cbs

    def fit(self, model: keras.Model, callbacks: list, *, epochs: int, steps_per_epoch: int):
        """``model.fit`` on the training input with backups, resume and the NaN guard; returns the History.

        Each ``fit`` of a job has its own backups (``backup/<n>`` in the work directory, n counting
        the job's fits), so a job of several phases resumes in the phase it stopped in, finished
        phases costing no step. A non-finite loss rolls back to the last backup with the learning
        rate times ``train.nan_lr_factor``, at most ``train.nan_retries`` times.

        Raises:
            TrainingError: the loss is still not finite after every roll-back.
            Preempted: SIGTERM arrived; a backup was written at the next step boundary.
        """
        slot, self._fits = self._fits, self._fits + 1
        self._fitted = model
        if self.evaluator:
            return self._evaluate_backups(model, callbacks, slot, epochs * steps_per_epoch)
        backup = None
        if self.run_dir is not None:
            if self._unopened:
                self.run_dir.open()
                self._unopened = False
                self.say(self._start_line + self._input_words())
            backup = Backup(
                model,
                os.path.join(self.run_dir.work, "backup", str(slot)),
                steps_per_epoch=steps_per_epoch,
                every=self.cfg.train.backup_every,
                chief=self.chief,
                scratch=os.path.join(self.scratch, f"backup-{slot}"),
                strategy=self.strategy,
                lr_scale=self._lr_scale,
            )
        # The optimizer's slots and the compiled metrics exist before the first step: traced once.
        _compat.build_step_state(model, predictions=getattr(model, "step_predictions", None))
        # A step returns its metrics' results, which every replica has already all-reduced (metric
        # variables are sync-on-read). tf_keras 2.21's default reduction ("auto": "sum" off TPU)
        # then sums them again over the workers under MultiWorkerMirroredStrategy, so the progress
        # bar's per-step figures came out times the replica count (accuracy 1.97 on 2 workers);
        # only the epoch-end figures, read from the metrics, were right. Take one replica's copy.
        if model.distribute_reduction_method != "first":
            model.distribute_reduction_method = "first"
            model.train_function = None  # traced under the old reduction: trace it again
        started = time.perf_counter()
        lowered = 1.0  # learning-rate factor of a roll-back, applied on top of the restored scale
        try:
            while True:
                start = backup.restore() if backup else 0
                if lowered != 1.0 and self._lr_scale is not None:
                    self._lr_scale.assign(self._lr_scale * lowered)
                self.resumed_from_step = start
                if start and self.chief:
                    epoch, step = divmod(start, steps_per_epoch)
                    log.info(
                        f"resuming at step {start} (epoch {epoch + 1}, step {step}) "
                        f"from {backup.directory}",
                        extra={"prog": f"tfopt {self.stage}"},
                    )
                try:
                    with _compat.fit_resumes_at(model, *divmod(start, steps_per_epoch)):
                        history = model.fit(
                            self.train_input(start),
                            epochs=epochs,
                            steps_per_epoch=steps_per_epoch,
                            callbacks=[*callbacks, *([backup] if backup else [])],
                            verbose=self.verbose,
                        )
                    self.optimizer_steps = int(model.optimizer.iterations.numpy())
                    return history
                except NonFinite as e:
                    lowered = self._roll_back(e, backup)
                except (
                    tf.errors.UnavailableError,
                    tf.errors.DeadlineExceededError,
                    tf.errors.AbortedError,
                ) as e:
                    if not self.spec.multi_process:
                        raise
                    first = (e.message or type(e).__name__).strip().splitlines()[0][:200]
                    raise PeerLost(
                        f"lost a peer task during training ({type(e).__name__}: {first}); restart the "
                        "job (the launcher's --max-restarts or Kubernetes does) to resume from the "
                        "last backup"
                    ) from None
        finally:
            if backup is not None:  # fit skips on_train_end when it raises
                backup.release()
            self.train_seconds += time.perf_counter() - started

    def attach(self, run_dir: RunDir) -> None:
        """Makes ``run_dir`` the run this job writes from now on, for a stage that writes several runs
        in turn (``tfopt.optimize --technique a,b``): its work directory holds the backups of the
        fits that follow, counted from 0, so a killed job resumes in the run and phase it stopped in.
        """
        self._resumed = run_dir.resuming
        self.run_dir, self._fits, self._unopened = (
            run_dir,
            0,
            True,
        )  # opened by the first fit: a mistake
        # found while the model is wrapped leaves nothing behind

    @property
    def evaluator(self) -> bool:
        """True for the ``evaluator`` task: its ``fit`` evaluates the chief's backups instead."""
        return self.cluster is not None and self.cluster.is_evaluator

    def _evaluate_backups(self, model: keras.Model, callbacks: list, slot: int, final_step: int):
        """The evaluator's ``fit``: evaluates each backup of fit number ``slot`` as the chief writes it,
        the way the stage's validation callback does (a plain copy, e.g. a Distiller's student)."""
        if self.run_dir is None:
            return keras.callbacks.History()
        validation = next((c for c in callbacks if isinstance(c, PlainValidation)), None)
        validation = validation or PlainValidation(plain_copy(model), self.dataset("validation"))
        work, record = self.run_dir.work, os.path.join(self.run_dir.path, "run.json")
        started = time.time()

        def committed() -> (
            bool
        ):  # by the chief, after this evaluator started (not an older run's record)
            return (
                not os.path.isdir(work)
                and os.path.isfile(record)
                and os.path.getmtime(record) >= started - 1
            )

        rows = sidecar.evaluate_backups(
            model,
            os.path.join(work, "backup", str(slot)),
            lambda: validation.evaluate(model),
            final_step=final_step,
            out_dirs=(work, self.run_dir.path),
            finished=committed,
            prog=f"tfopt {self.stage}",
        )
        history = keras.callbacks.History()
        history.history = {
            f"evaluation_{k}": [r[k] for r in rows]
            for k in (rows[0] if rows else {})
            if k != "step"
        }
        return history

    def _roll_back(self, error: NonFinite, backup: Backup | None) -> float:
        """Counts a roll-back (or gives up); returns the learning-rate factor to apply after the restore."""
        retries = self.cfg.train.nan_retries
        if backup is None or self.rollbacks >= retries:
            raise TrainingError(
                f"{error.what} is not finite at step {error.step} after {self.rollbacks} roll-back(s) "
                f"(train.nan_retries={retries}); lower --lr, or raise train.nan_retries"
            ) from None
        self.rollbacks += 1
        factor = self.cfg.train.nan_lr_factor
        if self.chief:
            log.warning(
                f"{error.what} is not finite at step {error.step}; rolling back to the last "
                f"backup with the learning rate x{factor} ({self.rollbacks}/{retries})",
                extra={"prog": f"tfopt {self.stage}"},
            )
        return factor

    # -- the record -----------------------------------------------------------------------------

    def strategy_section(self) -> dict:
        """Strategy name, class, replicas and workers."""
        return {
            "name": self.cfg.runtime.strategy,
            "class": type(self.strategy).__name__,
            "num_replicas": self.replicas,
            "num_workers": self.cluster.num_workers if self.cluster else 1,
            "precision": self.cfg.runtime.precision,
            **({"precision_auto": self.precision_probe.to_dict()} if self.precision_probe else {}),
            **(
                {"variables": sharding.shard_table(self._fitted)}
                if self._fitted is not None and self.cfg.runtime.strategy == "parameter_server"
                else {}
            ),
        }

    def data_section(self) -> dict:
        """Dataset name, image shape, classes, records per split, and the input contract: how pixels
        reach the model (resized to ``image_shape``, scaled to [0, 1], then ``data.normalize``)."""
        info = self.info
        out = {
            "name": info.name,
            "image_shape": list(info.image_shape),
            "num_classes": info.num_classes,
            "splits": {k: v.num_records for k, v in info.splits.items()},
            "input": {
                k: v
                for k, v in sources.input_contract(self.cfg.data, info).items()
                if k != "class_names"
            },
        }
        if self.model_input:
            out["model_input"] = self.model_input
        if info.stored_shape:
            out["stored_shape"] = list(info.stored_shape)
        if info.class_names:
            out["class_names"] = list(info.class_names)
        return out

    def train_section(self, steps_per_epoch: int, steps_per_execution: int, lr: float) -> dict:
        """Timings and throughput over the whole run's history (epochs before a resume included)."""
        rows = self.logger.rows if self.logger else []
        seconds = [r["epoch_seconds"] for r in rows if "epoch_seconds" in r]
        steady = seconds[1:] or seconds  # the first epoch includes tracing
        batch = self.cfg.data.global_batch_size
        return {
            "epochs": len(rows),
            "steps_per_epoch": steps_per_epoch,
            "steps_per_execution": steps_per_execution,
            "global_batch_size": batch,
            "per_replica_batch_size": batch // self.replicas,
            "learning_rate": lr,
            "seconds": round(self.train_seconds, 3),
            "epoch_seconds": seconds,
            "examples_per_sec": round(steps_per_epoch * batch / statistics.median(steady), 1)
            if steady
            else None,
            "resumed": self.resuming,
            "resumed_from_step": self.resumed_from_step,
            "nan_rollbacks": self.rollbacks,
            "optimizer_steps": self.optimizer_steps,
        }

    def record(self, **fields) -> RunRecord:
        """A RunRecord of this job (:func:`run_record`): the common sections filled in, ``fields`` on top."""
        base = {
            "strategy": self.strategy_section(),
            "data": self.data_section(),
            "history": list(self.logger.rows) if self.logger else [],
            "fingerprint": self.fingerprint,
        }
        return run_record(
            self.stage,
            self.cfg,
            self.run_dir.path if self.run_dir is not None else None,
            **{**base, **fields},
        )

    def judge(self, model: keras.Model, test_accuracy: float, test_examples: int = 0) -> list[str]:
        """Whether the model this job trained is worth having (:mod:`tfopt.runtime.quality`): the
        chief logs a warning line when not. Returns the lines for the record's ``warnings``."""
        rows = self.logger.rows if self.logger else []
        last = rows[-1] if rows else {}
        momenta = [
            float(m.momentum)
            for m in model.submodules
            if isinstance(m, keras.layers.BatchNormalization)
        ]
        sizes = [int(np.prod(w.shape)) for w in model.weights]
        trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        line = quality.verdict(
            quality.Evidence(
                test_accuracy=float(test_accuracy),
                num_classes=self.info.num_classes,
                test_examples=test_examples or self.info.splits["test"].num_records,
                train_accuracy=last.get("accuracy"),
                val_accuracy=last.get("val_accuracy"),
                steps=self.optimizer_steps,
                bn_momentum=max(momenta) if momenta else None,
                trainable_share=trainable / max(sum(sizes), 1),
                learning_rate=self.cfg.train.learning_rate,
            )
        )
        if line and self.chief:
            log.warning(line, extra={"prog": f"tfopt {self.stage}"})
        return [line] if line else []

    def relative(self, artifacts: dict[str, str]) -> dict[str, str]:
        """Artifact paths relative to the run directory (where they will be once committed)."""
        return {k: os.path.relpath(v, self.write_dir) for k, v in artifacts.items()}

    def commit(self, record: RunRecord) -> str | None:
        """The chief writes ``run.json`` and moves the run into place; other workers write nothing."""
        if not self.chief or self.run_dir is None:
            return None
        if self._unopened:  # nothing was fitted
            self.run_dir.open()
            self._unopened = False
        return self.run_dir.commit(record)

    def done(self, prog: str, record: RunRecord | None, digest: str, **extra) -> None:
        """Logs the one-line summary every process ends with on ``tfopt.result`` (launchers read it)."""
        task = f"{self.cluster.task_type}:{self.cluster.task_index}" if self.cluster else "local"
        summary = {"task": task, "weights_sha256": digest, **extra}
        if record is not None:
            summary.update(record.metrics, output=self.run_dir.path if self.run_dir else None)
            if record.train.get("examples_per_sec") is not None:
                summary["examples_per_sec"] = record.train["examples_per_sec"]
        logging.getLogger(RESULT).info(f"done {json.dumps(summary)}", extra={"prog": prog})


@keras.saving.register_keras_serializable(package="tfopt")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning rate (constant or schedule) times a scale variable (lowered by the NaN guard)."""

    def __init__(self, base, scale):
        self.base, self.scale = base, scale

    def __call__(self, step):
        rate = self.base(step) if callable(self.base) else tf.constant(self.base, tf.float32)
        return rate * tf.cast(self.scale, rate.dtype)

    def get_config(self) -> dict:
        base = keras.optimizers.schedules.serialize(self.base) if callable(self.base) else self.base
        return {
            "base": base,
            "scale": float(self.scale.numpy()) if hasattr(self.scale, "numpy") else self.scale,
        }

    @classmethod
    def from_config(cls, config):
        base = config["base"]
        return cls(
            keras.optimizers.schedules.deserialize(base) if isinstance(base, dict) else base,
            config["scale"],
        )


def replace_config(cfg: RunConfig, **sections) -> RunConfig:
    """``cfg`` with some keys of its sections replaced, e.g. ``replace_config(cfg, train={"epochs": 2})``."""
    return dataclasses.replace(
        cfg,
        **{
            name: dataclasses.replace(getattr(cfg, name), **values)
            for name, values in sections.items()
        },
    )
