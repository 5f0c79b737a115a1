"""Training, the library entry of ``python -m tfopt.train``.

One run: the Job (cluster, strategy, precision, data; see :mod:`tfopt.runtime.job`) -> build and
compile the model inside ``strategy.scope()`` (with ``model.freeze_epochs``, first the
classification layer alone, then every layer: two fits, each with its own backups) -> ``fit`` with the Job's callbacks
(validation on a strategy-free copy, progress, metrics, TensorBoard, backups) -> the chief
evaluates on the held-out test split, saves the model (``.keras`` and SavedModel) and commits
the run directory with its ``run.json``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence

from tfopt.core._keras import keras

from tfopt.config import RunConfig
from tfopt.core.fileio import write_json
from tfopt.models import inputs, sources
from tfopt.models.io import save_model
from tfopt.privacy.job import plan_for, private_step
from tfopt.runs import RunRecord
from tfopt.runtime import gpipe, sharding
from tfopt.runtime.callbacks import PlainValidation
from tfopt.runtime.job import Job, plain_copy, weights_digest

log = logging.getLogger(__name__)

PROG = "tfopt train"
SPLIT_FILE = "pipeline_split.json"  # beside the backups: where a resumed pipeline run cuts


def run(cfg: RunConfig, *, overwrite: bool = False, callbacks: Sequence = ()) -> RunRecord | None:
    """Trains the model ``cfg.model`` names as described by ``cfg`` and the TF_CONFIG environment variable.

    The model is a built-in one, a model file (trained on: fine-tuning), ``keras.applications:NAME``
    or a factory (see :mod:`tfopt.models.sources`); an application's own input scaling becomes
    ``data.normalize`` (recorded in the run's config, so every later stage scales the same way).

    Args:
        cfg: The resolved run configuration (``train.output_dir`` empty = ``runs/train``, or the
            next free ``runs/train-N``).
        overwrite: Replace a finished run at ``train.output_dir``, or an unfinished run of other settings.
        callbacks: Extra Keras callbacks, run before tfopt's own.

    Returns:
        The committed RunRecord on the chief; None on other workers (they write nothing). A
        parameter-server worker/ps task serves until the launcher ends it.

    Raises:
        TfoptError: bad TF_CONFIG, data, model choice or output directory.
    """
    cfg = sources.resolve_config(cfg)
    source = sources.describe(cfg.model)  # a model file's sha256: a changed file is another run
    with Job(
        cfg,
        "train",
        overwrite=overwrite,
        options={"model": source} if source["form"] == "file" else None,
        build_model=sources.build_model,
    ) as job:
        steps = job.steps_per_epoch()
        spe = job.steps_per_execution(steps)
        lr = job.learning_rate()
        private = plan_for(job, cfg, steps)
        with job.strategy.scope():
            built = sources.build(cfg.model, job.info.image_shape, job.info.num_classes)
            model = built.model
        inputs.adopt(job, model, cfg.model.name)
        _warn_if_all_frozen(job, cfg)
        copy = plain_copy(
            model
        )  # before any freezing: what is validated and saved trains as a whole
        model, validation = _placed(job, cfg, model, copy)
        done, norms = 0, {}
        for epochs, head_only in phases(cfg):
            with job.strategy.scope():
                frozen = freeze_base(model) if head_only else []
                # A new optimizer per phase: its schedule spans the phase (Keras's transfer-learning recipe).
                model.compile(
                    optimizer=job.optimizer(lr, epochs * steps),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"],
                    steps_per_execution=spe,
                )
            extra = [*callbacks, *private_step(model, private, steps, done, cfg.train.seed, norms)]
            if head_only and job.chief:
                log.info(
                    f"epochs {done + 1}-{done + epochs}: {len(frozen)} base layers frozen, only "
                    f"{_head(model).name!r} trains",
                    extra={"prog": PROG},
                )
            job.fit(
                model,
                job.callbacks(validation, extra, first_epoch=done),
                epochs=epochs,
                steps_per_epoch=steps,
            )
            for layer in frozen:  # as the model came: layers the user froze stay frozen
                layer.trainable = True
            done += epochs
        # Every worker reads the weights (a collective for sync-on-read variables); the chief writes.
        _trained_weights(model, copy)
        digest = weights_digest(copy)
        privacy = private.section(done * steps, norms) if private else None
        split = _measured_split(job, model) if isinstance(model, gpipe.Pipelined) else None
        schedule = (steps, spe, lr, privacy, split)
        record = _commit(job, cfg, copy, built, digest, schedule) if job.chief else None
        job.done(PROG, record, digest)
        return record


def _placed(job: Job, cfg: RunConfig, model, copy) -> tuple:
    """The model that trains (split into GPipe stages under ``--strategy pipeline``) and the
    validation that reads its weights into ``copy``."""
    if cfg.runtime.strategy != "pipeline":
        return model, PlainValidation(copy, job.dataset("validation"), job.chief)
    from tfopt.compress.flops import layer_macs

    # A resumed run cuts where the interrupted one did: its backups hold the stages' variables,
    # and a measured balance can come out differently the second time.
    saved = os.path.join(job.run_dir.work, "backup", SPLIT_FILE) if job.run_dir else ""
    part = None
    if saved and job.resuming and os.path.isfile(saved):
        with open(saved, encoding="utf-8") as f:
            part = gpipe.Partition.from_dict(json.load(f))
        log.info(
            f"pipeline: cut where the interrupted run cut (balanced by {part.by})",
            extra={"prog": PROG},
        )
    sample = None
    if part is None and cfg.runtime.balance == "time" and not cfg.runtime.cut_after:
        sample = next(iter(job.dataset("validation")))[0]
    split = gpipe.split(model, cfg.runtime, layer_macs, sample, part)
    if saved and part is None:
        job.open_work()  # a fresh run's work directory is emptied when it opens
        os.makedirs(os.path.dirname(saved), exist_ok=True)
        write_json(saved, split.partition.to_dict())
    part = split.partition
    job.say(
        f"pipeline: {len(part.stages)} stages balanced by {part.by}: "
        + " | ".join(n[0] if len(n) == 1 else f"{n[0]}..{n[-1]}" for n in part.stages)
    )
    if cfg.runtime.device_memory_mib:
        from tfopt.runtime.gpipe.measure import check_budget

        batch = next(iter(job.dataset("validation")))[0]
        peaks = check_budget(split, batch, cfg.runtime.device_memory_mib)
        job.say(
            f"pipeline: peak MiB per stage {', '.join(f'{b / 2**20:.1f}' for b in peaks)}, "
            f"within --device-memory-mib {cfg.runtime.device_memory_mib:g}"
        )
    keras.utils.set_random_seed(cfg.train.seed)  # the split built layers: same start either way
    weights = lambda: split.unsplit_weights(copy)  # noqa: E731
    return split, PlainValidation(copy, job.dataset("validation"), job.chief, weights)


def _measured_split(job: Job, model: gpipe.Pipelined) -> dict:
    """The split as ``run.json`` records it, with its stage times, idle fraction and peak memory
    measured on a validation batch (after the weights were read: the measurement moves
    BatchNormalization statistics)."""
    from tfopt.runtime.gpipe.measure import measure

    x, y = next(iter(job.dataset("validation")))
    measured = measure(model, x, y)
    mib = [f"{b / 2**20:.1f}" for b in measured["stage_peak_bytes"]]
    job.say(
        f"pipeline: {len(model.stages)} stages, {model.microbatches} micro-batches; idle "
        f"{measured['bubble_measured']:.2f} of the step measured, "
        f"{measured['bubble_formula']:.2f} by GPipe's formula; peak MiB per stage "
        f"{', '.join(mib)} (unsplit {measured['unsplit_peak_bytes'] / 2**20:.1f})"
    )
    budget = job.cfg.runtime.device_memory_mib
    return {
        **model.describe(),
        "measured": measured,
        **({"device_memory_mib": budget} if budget else {}),
    }


def _trained_weights(model, copy) -> None:
    """The trained weights into the plain ``copy`` that is saved."""
    if isinstance(model, gpipe.Pipelined):
        gpipe.copy_weights_back(model, copy)
    else:
        sharding.set_full_weights(copy, sharding.full_weights(model))


def _warn_if_all_frozen(job: Job, cfg: RunConfig) -> None:
    """Warns (on the chief) when the head-only phase covers every epoch of a randomly initialized
    model: only its last layer would train, on random features."""
    if job.chief and cfg.model.freeze_epochs >= cfg.train.epochs and not pretrained(cfg):
        log.warning(
            f"--freeze-epochs {cfg.model.freeze_epochs} covers every epoch of "
            f"{cfg.model.name!r}, which starts from random weights: only its last layer "
            "trains, on random features; give it pretrained weights (--model-arg "
            "weights=imagenet or weights=PATH.h5) or fewer --freeze-epochs",
            extra={"prog": PROG},
        )


def _commit(job: Job, cfg: RunConfig, copy, built, digest: str, schedule: tuple) -> RunRecord:
    """The chief's end of a run: scores the trained ``copy`` on the test split, saves it and
    commits its record (``schedule``: steps per epoch, steps per execution, learning rate, and
    the DP-SGD record or None)."""
    job.say(f"evaluating on the test split ({job.info.splits['test'].num_records} examples)")
    metrics = copy.evaluate(job.dataset("test"), return_dict=True, verbose=0)
    warnings = job.judge(copy, metrics["accuracy"])
    job.say("saving the model (.keras and SavedModel)")
    artifacts = save_model(copy, job.write_dir)
    record = job.record(
        model={"name": cfg.model.name, "params": int(copy.count_params()), **built.description},
        train={
            **job.train_section(*schedule[:3]),
            "freeze_epochs": cfg.model.freeze_epochs,
            **({"pipeline": schedule[4]} if schedule[4] else {}),
            **({"privacy": schedule[3]} if schedule[3] else {}),
        },
        metrics={f"test_{k}": float(v) for k, v in metrics.items()},
        weights_sha256=digest,
        artifacts=job.relative(artifacts),
        warnings=warnings,
    )
    out = job.commit(record)
    job.say(
        f"test accuracy {metrics['accuracy']:.1%}; wrote {out} (model.keras, saved_model/, "
        f"run.json); next: python -m tfopt.export --from {out}"
    )
    return record


def pretrained(cfg: RunConfig) -> bool:
    """Whether the model starts from weights someone trained: a model file, or an application
    given ``weights``. A built-in model, or an application without weights, starts at random."""
    from tfopt.core.specs import parse_model

    source, kwargs = parse_model(cfg.model.name, cfg.model.args)
    if source.form == "builtin":
        return False
    if source.form == "applications":
        return kwargs.get("weights") is not None
    return True  # a file is trained; a factory's weights are its own business


def phases(cfg: RunConfig) -> list[tuple[int, bool]]:
    """``[(epochs, head only), ...]``: ``model.freeze_epochs`` with the base frozen, then the rest with every layer."""
    freeze, total = cfg.model.freeze_epochs, cfg.train.epochs
    return [(n, head_only) for n, head_only in ((freeze, True), (total - freeze, False)) if n > 0]


def _head(model: keras.Model):
    return model.get_layer(model.output_names[0])


def freeze_base(model: keras.Model) -> list:
    """Makes every trainable layer but the classification layer (the model's output layer)
    non-trainable; returns them. Frozen batch-norm layers run in inference mode (their statistics
    stay as they are), as Keras's transfer-learning guide expects."""
    head = _head(model)
    frozen = [layer for layer in model.layers if layer is not head and layer.trainable]
    for layer in frozen:
        layer.trainable = False
    return frozen
