"""What a DP-SGD step minimizes: each example's loss, and what the step reports after it.

A classifier's per-example loss is its cross-entropy; a :class:`~tfopt.models.distiller.Distiller`'s
is its own total (distillation, student and feature terms, ``Distiller.loss_terms``), with the
teachers frozen constants: only the student (and its projections) train, so only they are
clipped and noised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tfopt.core._keras import keras, tf

from tfopt.models.distiller import Distiller


@dataclass(frozen=True)
class Objective:
    """The three things DP-SGD asks of a model.

    Attributes:
        losses: ``(x, y) -> (per-example losses [B] float32, logits, extras)``, a training
            forward pass; ``extras`` maps names to per-example values the report reads.
        report: ``(x, y, logits, sample_weight, extras) -> logs`` after the step.
        penalties: ``() -> [tensors]``: the data-independent regularization losses.
    """

    losses: Callable
    report: Callable
    penalties: Callable


def objective_of(model: keras.Model) -> Objective:
    """The model's DP-SGD objective: a Distiller's own loss, else cross-entropy on logits."""
    if isinstance(model, Distiller):
        return _distiller(model)

    def losses(x, y):
        logits = model(x, training=True)
        loss = keras.losses.sparse_categorical_crossentropy(
            y, tf.cast(logits, tf.float32), from_logits=True
        )
        return loss, logits, {}

    def report(x, y, logits, sample_weight, extras):
        model.compute_loss(x, y, logits, sample_weight)
        return model.compute_metrics(x, y, logits, sample_weight)

    return Objective(losses, report, lambda: list(model.losses))


def _distiller(model: Distiller) -> Objective:
    def losses(x, y):
        s_logits, s_feats, t_logits, t_feats = model._run(x, training=True)
        terms = model.loss_terms(y, s_logits, t_logits, s_feats, t_feats)
        return terms["total"], s_logits, terms

    def report(x, y, logits, sample_weight, terms):
        return model.report_step(y, logits, terms, sample_weight)

    def penalties():
        return list(model.student.losses) + [l for p in model.projections for l in p.losses]

    return Objective(losses, report, penalties)
