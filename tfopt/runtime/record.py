"""The record of a :class:`~tfopt.runtime.job.Job`: ``run.json``'s common sections, the fingerprint's
input, the quality verdict, the chief's commit and the line every process ends with."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
from importlib.metadata import PackageNotFoundError, version

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt._version import __version__
from tfopt.config import RunConfig
from tfopt.core.log import RESULT
from tfopt.data import sources
from tfopt.runs import RunRecord
from tfopt.runtime import quality, sharding

log = logging.getLogger(__name__)


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
    config = cfg.to_dict(stage)
    if output_dir is not None:
        config["train"]["output_dir"] = output_dir
    return RunRecord(stage=stage, config=config, versions=versions(), **sections)


def weights_digest(model: keras.Model) -> str:
    """Returns a sha256 over all of ``model``'s weights (identical models, identical digests)."""
    h = hashlib.sha256()
    for w in sharding.full_weights(model):
        h.update(w.tobytes())
    return h.hexdigest()


class Recording:
    """What a Job records of its run (mixed into :class:`~tfopt.runtime.job.Job`, after its
    :class:`~tfopt.runtime.fitloop.FitLoop` has run)."""

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
