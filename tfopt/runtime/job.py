"""The Job: the one context every stage (train, distill, optimize) runs in.

A stage's own module holds only what is specific to it; everything else is here, in its fit loop
(:mod:`tfopt.runtime.fitloop`) and in its record (:mod:`tfopt.runtime.record`):

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
import shutil
import sys
import tempfile
from collections.abc import Callable

from tfopt.core._keras import keras, tf

from tfopt.config import DataConfig, RunConfig
from tfopt.core.errors import ConfigError
from tfopt.core.log import PROGRESS
from tfopt.core.specs import AUTO_PRECISION, PRECISIONS, STRATEGIES
from tfopt.data import service, sources
from tfopt.runs import default_output, fingerprint, result_config  # noqa: F401
from tfopt.runtime import autoprecision, precision
from tfopt.runtime import strategy as strategy_lib
from tfopt.runtime.callbacks import EpochTimer, MetricsLogger
from tfopt.runtime.fitloop import (  # noqa: F401  (their old home: stages import them from here)
    FitLoop,
    ScaledSchedule,
    compress_allreduce,
    plain_copy,
)
from tfopt.runtime.record import (  # noqa: F401
    Recording,
    run_record,
    versions,
    weights_digest,
)
from tfopt.runtime.rundir import RunDir
from tfopt.runtime.tf_config import (
    ClusterInfo,
    exposure_warning,
    parse_tf_config,
    validate_for_strategy,
)
from tfopt.runtime.watchdog import StartupWatchdog

log = logging.getLogger(__name__)


def cluster_id(cluster: ClusterInfo | None) -> str | None:
    """What identifies a multi-worker run's cluster (its task addresses), or None for one process."""
    if cluster is None:
        return None
    return hashlib.sha256(json.dumps(cluster.cluster, sort_keys=True).encode()).hexdigest()[:16]


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


class Job(FitLoop, Recording):
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
        if cfg.runtime.strategy == "pipeline" and stage != "train":
            raise ConfigError(
                f"strategy 'pipeline' splits a model for tfopt train; tfopt {stage} does not "
                "split it yet: use --strategy one_device or mirrored"
            )
        sources.check(cfg.data)
        service.check(cfg)
        self.chief = strategy_lib.is_chief(self.cluster)
        self.options = options or {}
        self.fingerprint = fingerprint(stage, result_config(cfg, stage), self.options)
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
                {"config": result_config(cfg, stage), stage: self.options},
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

        # found while the model is wrapped leaves nothing behind


def replace_config(cfg: RunConfig, **sections) -> RunConfig:
    """``cfg`` with some keys of its sections replaced, e.g. ``replace_config(cfg, train={"epochs": 2})``."""
    return dataclasses.replace(
        cfg,
        **{
            name: dataclasses.replace(getattr(cfg, name), **values)
            for name, values in sections.items()
        },
    )
