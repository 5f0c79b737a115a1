"""The fit loop of a :class:`~tfopt.runtime.job.Job`: the numbers every stage derives the same way
(steps, learning rate, optimizer), the training input, the callbacks, and ``fit`` with backups,
resume, the NaN guard and the evaluator's side of it."""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from tfopt.core._keras import keras, tf

from tfopt.core import _compat
from tfopt.core.errors import PeerLost, TrainingError
from tfopt.data import distributed, pipeline, service
from tfopt.runtime import sharding, sidecar
from tfopt.runtime.backup import Backup, NonFinite
from tfopt.runtime.callbacks import EpochTimer, MetricsLogger, PlainValidation
from tfopt.runtime.rundir import RunDir

log = logging.getLogger(__name__)


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


def plain_copy(model: keras.Model) -> keras.Model:
    """A copy of ``model`` outside any strategy, compiled for evaluation: what gets validated and saved."""
    copy = keras.models.clone_model(model)
    sharding.set_full_weights(copy, sharding.full_weights(model))
    copy.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    _compat.build_step_state(copy)
    return copy


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


class FitLoop:
    """What a Job does around ``model.fit`` (mixed into :class:`~tfopt.runtime.job.Job`, whose
    set-up gives it ``cfg``, ``stage``, ``strategy``, ``spec``, ``cluster``, ``chief``, ``info``,
    ``precision``, ``fingerprint``, ``run_dir`` and ``scratch``)."""

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
        fn = distributed.dataset_fn(
            data, "train", training=True, info=self.info, start_step=start_step, service_job=name
        )
        if self.spec.needs_servers:
            return keras.utils.experimental.DatasetCreator(fn)
        return self.strategy.distribute_datasets_from_function(fn)

    def dataset(self, split: str):
        """The whole ``split`` for a strategy-free model, read deterministically."""
        return pipeline.make_dataset(self.cfg.data, split, training=False, info=self.info)

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
        backup = self._backup(model, slot, steps_per_epoch) if self.run_dir is not None else None
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

    def open_work(self) -> str:
        """Opens the run's work directory, once (the chief says what it writes); returns where
        this process writes. The first fit does it; a stage that writes before any fit calls it."""
        if self._unopened:
            self.run_dir.open()
            self._unopened = False
            self.say(self._start_line + self._input_words())
        return self.write_dir

    def _backup(self, model: keras.Model, slot: int, steps_per_epoch: int) -> Backup:
        """The backups of fit number ``slot`` (opening the run directory on the first fit)."""
        self.open_work()
        return Backup(
            model,
            os.path.join(self.run_dir.work, "backup", str(slot)),
            steps_per_epoch=steps_per_epoch,
            every=self.cfg.train.backup_every,
            chief=self.chief,
            scratch=os.path.join(self.scratch, f"backup-{slot}"),
            strategy=self.strategy,
            lr_scale=self._lr_scale,
        )

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
