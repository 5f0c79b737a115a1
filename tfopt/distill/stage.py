"""Knowledge distillation from trained runs, the library entry of ``python -m tfopt.distill``.

One run: the Job (cluster, strategy, precision, data) -> teachers loaded (safe loader) inside
``strategy.scope()`` and scored on the validation split (strategy-free copies) -> the student
built and, for ``--technique prune|cluster|qat``, wrapped by :mod:`tfopt.compress.student` so
that compression keeps learning from the teachers -> ``Distiller.fit`` with the Job's callbacks
-> the chief scores the plain student and the teachers on the test split, saves the student and
commits a NEW run directory (``run.json``'s ``distill`` section: settings, teachers and their
accuracies, the gap to the teachers, the compression measured on the saved weights).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tfopt.compress import student as student_lib
from tfopt.compress.common import compile_for_eval
from tfopt.config import DataConfig, RunConfig, parse_features
from tfopt.core.errors import ConfigError, ModelError
from tfopt.distill.options import DistillOptions, fixed_weights, settings_record
from tfopt.models import inputs, sources
from tfopt.models.distiller import Distiller, accuracy_weights, teacher_log_probs
from tfopt.models.io import save_model
from tfopt.privacy.job import plan_for, private_step
from tfopt.runs import Run, RunRecord, load_input, refuse_input_as_output
from tfopt.runtime.callbacks import PlainValidation
from tfopt.runtime.job import Job, plain_copy, weights_digest

if TYPE_CHECKING:
    from tfopt.core._keras import keras

PROG = "tfopt distill"
log = logging.getLogger(__name__)


def _logits(model: keras.Model, dataset) -> tuple[np.ndarray, np.ndarray]:
    logits = model.predict(dataset, verbose=0)
    labels = np.concatenate([np.asarray(y) for _, y in dataset])
    return np.asarray(logits, np.float32), labels


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def _check_teacher(run: Run, teacher: keras.Model, info, dataset: str) -> None:
    shape, classes = tuple(teacher.input_shape[1:]), teacher.output_shape[-1]
    if shape != tuple(info.image_shape) or classes != info.num_classes:
        raise ModelError(
            f"teacher {run.source!r} takes {shape} -> {classes} classes but {dataset!r} has "
            f"{tuple(info.image_shape)} -> {info.num_classes}; pass the --dataset the teacher was trained on"
        )


def _teachers_data(cfg: RunConfig, teacher_runs: list[Run]) -> DataConfig | None:
    """The input scaling (``data.input_scale`` and ``data.normalize``) the teacher runs were
    trained with, when they all agree (None otherwise, or with model files only). A student
    without preprocessing of its own, and no scaling given, is fed the same."""
    found = {
        (r.config.data.input_scale, r.config.data.normalize)
        for r in teacher_runs
        if not r.model_file
    }
    if len(found) != 1:
        return None
    scale, normalize = found.pop()
    return dataclasses.replace(cfg.data, input_scale=scale, normalize=normalize)


def _teacher_expects(run: Run, teacher, cfg: RunConfig, job: Job) -> DataConfig:
    """The inputs a teacher was trained on: its run's scaling, or for a model file (no record) what
    its graph says, with the user's own ``data.normalize`` for a model that does not scale."""
    if not run.model_file and run.config.data.input_scale != "auto":
        return run.config.data
    data = run.config.data if not run.model_file else cfg.data
    return inputs.settle(data, teacher, job.info.image_shape, run.source, origin="config")[0]


def _student_data(job: Job, student, name: str, teachers: DataConfig | None) -> dict:
    """Settles what the student is fed (its own graph first; else the teachers' scaling, unless
    the user gave one) on the job; returns what decided it."""
    data = job.cfg.data
    side = inputs.measure(student, job.info.image_shape)
    inherit = (
        teachers is not None
        and side.expects is None
        and data.input_scale == "auto"
        and not data.normalize
    )
    data, decided = inputs.resolve(teachers if inherit else data, side, name)
    if inherit:
        decided = dict(decided, decided_by="teachers")
    job.use_data(data, decided)
    if job.chief:
        warning = inputs.probe_dataset(student, job.dataset("validation"))
        if warning:
            log.warning(warning, extra={"prog": PROG})
    return decided


@dataclasses.dataclass
class _Teachers:
    """The teachers of one run, as they are resolved, loaded and scored."""

    sources: tuple[str, ...]  # as given: run directories or model files
    runs: list[Run]
    plain: list = dataclasses.field(default_factory=list)  # strategy-free copies (scoring)
    val_acc: list = dataclasses.field(default_factory=list)
    weights: list = dataclasses.field(default_factory=list)  # normalized to sum 1
    digests: list = dataclasses.field(default_factory=list)


def run(
    cfg: RunConfig,
    teachers: Sequence[str] | DistillOptions,
    out_dir: str | None = None,
    *,
    overwrite: bool = False,
) -> RunRecord | None:
    """Distils the teachers into ``cfg.model.name`` as ``cfg.distill`` says, under TF_CONFIG.

    Args:
        cfg: The config: ``distill`` (the loss, the teachers' weights, features, compression,
            baseline), data, model (the student; ``model.trust`` loads teacher files that run
            code), runtime and train settings.
        teachers: Run directories of trained teachers, or model files trained on the same data.
            (A :class:`~tfopt.distill.options.DistillOptions` is still taken, deprecated.)
        out_dir: The run directory to write (default ``cfg.train.output_dir``; empty = a new
            ``runs/distill[-N]``).
        overwrite: Replace a finished run at the output directory.

    Returns:
        The committed RunRecord on the chief; None on other workers.

    Raises:
        TfoptError: a bad option, teacher run, TF_CONFIG, data or model choice.
    """
    cfg, t, weights_given, baseline_run = _resolve(cfg, teachers, out_dir)
    d = cfg.distill
    # The teachers' weights (or files) are part of what the student is: a retrained teacher is another run.
    job = Job(
        cfg,
        "distill",
        options={
            **settings_record(d, t.sources),
            "teacher_digests": [r.digest for r in t.runs],
        },
        overwrite=overwrite,
        build_model=sources.build_model,
    )
    with job:  # seeded by the Job: train.seed (initial weights, dropout), data.seed (order, shifts)
        steps = job.steps_per_epoch()
        spe = job.steps_per_execution(steps)
        lr = job.learning_rate()
        private = plan_for(job, cfg, steps)
        built, models = _load(job, cfg, t)
        val_ds, test_ds = job.dataset("validation"), job.dataset("test")
        _weigh(job, d, t, models, weights_given, val_ds)
        compression, distiller = _distiller(job, cfg, built.model, models, t, steps, spe, lr)
        plain = student_lib.plain_copy(compression.model)
        compile_for_eval(plain)
        validation = PlainValidation(
            plain,
            val_ds,
            job.chief,
            weights_fn=lambda: student_lib.plain_weights(compression.model),
        )
        # tfmot's callbacks (UpdatePruningStep) re-mask the weights before validation reads them.
        norms: dict = {}
        extra = private_step(distiller, private, steps, 0, cfg.train.seed, norms)
        callbacks = job.callbacks(validation, [*compression.callbacks, *extra])
        t.digests = distiller.teacher_digests()
        job.fit(
            distiller, callbacks, epochs=cfg.train.epochs, steps_per_epoch=steps
        )  # raises if a teacher changed
        plain.set_weights(
            student_lib.plain_weights(compression.model)
        )  # every worker (a collective)
        digest = weights_digest(plain)
        record = None
        if job.chief:
            section = _score(cfg, plain, t, test_ds, baseline_run)
            if compression.info is not None:
                section["compression"] = dict(
                    compression.info, measured=student_lib.measured(plain, compression.info)
                )
            spent = private.section(cfg.train.epochs * steps, norms) if private else None
            record = _commit(job, cfg, plain, built, t, section, digest, (steps, spe, lr, spent))
        job.done(PROG, record, digest)
        return record


def _resolve(cfg: RunConfig, teachers, out_dir: str | None):
    """Checks the options and reads the inputs (JSON, file digests: no TensorFlow op yet).

    Returns:
        ``(cfg, teachers, fixed weights or None, the baseline run or None)``.
    """
    if isinstance(teachers, DistillOptions):
        cfg, teachers = teachers.apply(cfg)
    if out_dir:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, output_dir=out_dir))
    d = cfg.distill
    sources.check(cfg.model)
    if cfg.model.freeze_epochs:
        raise ConfigError(
            f"model.freeze_epochs={cfg.model.freeze_epochs} applies to tfopt.train (fine-tuning a "
            "pretrained network); a distilled student trains every layer: drop --freeze-epochs"
        )
    if cfg.privacy.enabled and d.technique != "none":
        raise ConfigError(
            f"DP-SGD (--dp-l2-clip) distils into the plain student; --technique {d.technique} "
            "wraps it in layers whose per-example gradients are not clipped: use --technique "
            "none, then compress the private student with tfopt optimize"
        )
    weights_given = fixed_weights(d, teachers)
    t = _Teachers(tuple(teachers), [load_input(p, cfg) for p in teachers])
    baseline_run = load_input(d.baseline, cfg) if d.baseline else None
    if cfg.train.output_dir:
        inputs_ = t.runs + ([baseline_run] if baseline_run else [])
        refuse_input_as_output(cfg.train.output_dir, [r.source for r in inputs_])
    return cfg, t, weights_given, baseline_run


def _load(job: Job, cfg: RunConfig, t: _Teachers):
    """Loads the teachers and builds the student in the strategy's scope, and settles what
    each is fed; returns ``(the built student, the teachers as the Distiller takes them)``."""
    teachers_data = _teachers_data(cfg, t.runs)
    with job.strategy.scope():
        loaded = [
            sources.load_stage_input(r, job.info.image_shape, job.info.num_classes, cfg.model.trust)
            for r in t.runs
        ]
        built = sources.build(cfg.model, job.info.image_shape, job.info.num_classes)
    for r, teacher in zip(t.runs, loaded):
        _check_teacher(r, teacher, job.info, cfg.data.dataset)
    _student_data(job, built.model, cfg.model.name, teachers_data)
    with job.strategy.scope():  # each teacher sees the inputs it was trained on
        models = [
            inputs.adapted(
                m, job.cfg.data, _teacher_expects(r, m, cfg, job), f"teacher {r.source!r}"
            )
            for r, m in zip(t.runs, loaded)
        ]
    return built, models


def _weigh(job: Job, d, t: _Teachers, models, weights_given, val_ds) -> None:
    """Scores the teachers on the validation split (strategy-free copies, identical on every
    worker: deterministic data) and sets their weights in the soft target."""
    t.plain = [plain_copy(m) for m in models]
    t.val_acc = [_accuracy(*_logits(m, val_ds)) for m in t.plain]
    weights = (
        accuracy_weights(t.val_acc, job.info.num_classes)
        if d.teacher_weights == "accuracy"
        else weights_given or [1.0] * len(models)
    )
    t.weights = [w / sum(weights) for w in weights]


def _distiller(job: Job, cfg: RunConfig, student, models, t: _Teachers, steps, spe, lr):
    """The student wrapped for ``distill.technique`` and the compiled Distiller that trains it,
    made in the strategy's scope; returns ``(compression, distiller)``."""
    d = cfg.distill
    with job.strategy.scope():
        compression = student_lib.wrap(
            student, d.technique, cfg.train.epochs * steps, sparsity=d.sparsity, clusters=d.clusters
        )
        distiller = Distiller(
            compression.model,
            models,
            temperature=d.temperature,
            alpha=d.alpha,
            teacher_weights=t.weights,
            combine=d.combine,
            features=parse_features(d.features),
            feature_weight=d.feature_weight,
        )
        distiller.compile(
            optimizer=job.optimizer(lr, cfg.train.epochs * steps), steps_per_execution=spe
        )
    return compression, distiller


def _commit(job: Job, cfg: RunConfig, plain, built, t: _Teachers, section, digest, schedule):
    """The chief saves the student and commits the run; returns its record."""
    steps, spe, lr, private = schedule
    artifacts = save_model(plain, job.write_dir)
    teacher_params = max(int(m.count_params()) for m in t.plain)
    metrics = section.pop("metrics")
    record = job.record(
        model={
            "name": cfg.model.name,
            "role": "student",
            "params": int(plain.count_params()),
            **built.description,
            "teacher_to_student_params": round(teacher_params / max(1, plain.count_params()), 2),
        },
        train={
            **job.train_section(steps, spe, lr),
            **({"privacy": private} if private else {}),
        },
        metrics=metrics,
        weights_sha256=digest,
        artifacts=job.relative(artifacts),
        section=section,
        warnings=job.judge(plain, metrics["test_accuracy"]),
    )
    job.commit(record)
    return record


def _score(cfg, plain, t: _Teachers, test_ds, baseline_run) -> dict:
    """The distill section: the student, the teachers and the baseline on the test split.

    Runs on the chief alone, so it touches only strategy-free models: reading a strategy
    variable here would be a collective that the other workers never join.
    """
    metrics = plain.evaluate(test_ds, return_dict=True, verbose=0)
    student_acc = float(metrics["accuracy"])
    test_logits = [_logits(m, test_ds) for m in t.plain]
    labels = test_logits[0][1]
    teacher_acc = [_accuracy(*x) for x in test_logits]
    combined = teacher_log_probs(
        [x[0] for x in test_logits], t.weights, cfg.distill.temperature, cfg.distill.combine
    )
    target_acc = _accuracy(combined.numpy(), labels)  # the combined soft target's own accuracy
    gap = {
        "teacher_test_accuracy": target_acc,
        "student_test_accuracy": student_acc,
        "teacher_minus_student_pt": round(100 * (target_acc - student_acc), 3),
    }
    if baseline_run is not None:
        base = plain_copy(
            sources.load_stage_input(
                baseline_run, plain.input_shape[1:], plain.output_shape[-1], cfg.model.trust
            )
        )
        base_acc = float(base.evaluate(test_ds, return_dict=True, verbose=0)["accuracy"])
        gap.update(
            baseline_run=baseline_run.source,
            baseline_test_accuracy=base_acc,
            gap_closed=(student_acc - base_acc) / (target_acc - base_acc)
            if target_acc > base_acc
            else None,
        )
    return {
        "settings": settings_record(cfg.distill, t.sources),
        "teachers": [
            {
                "run": r.source,
                "model": r.config.model.name,
                "params": int(m.count_params()),
                "weight": w,
                "val_accuracy": va,
                "test_accuracy": ta,
                "weights_sha256": d,
                "unchanged": True,
            }
            for r, m, w, va, ta, d in zip(
                t.runs, t.plain, t.weights, t.val_acc, teacher_acc, t.digests
            )
        ],
        "gap": gap,
        "metrics": {f"test_{k}": float(v) for k, v in metrics.items()},
    }
