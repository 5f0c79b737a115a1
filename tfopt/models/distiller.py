"""Knowledge distillation as a tf_keras Model: frozen teachers teach a student in one ``fit``.

Per example (Hinton et al., 2015), with temperature ``T`` and the teachers' combined softened
distribution ``p_t``::

    loss = alpha * T^2 * KL(p_t || softmax(student / T)) + (1 - alpha) * CE(label, student)
           + feature_weight * sum over feature pairs of MSE(projection(student_feature), teacher_feature)

The per-example losses are averaged over the GLOBAL batch with ``tf.nn.compute_average_loss``:
every replica divides by the global batch size and the optimizer sums the replicas' gradients,
so the update is the same under one_device, mirrored, multi_worker_mirrored and
parameter_server (a default-reduction Keras loss object inside ``train_step`` is not).

Several teachers are combined with fixed weights (normalized to sum 1), or weights from their
validation accuracies (``accuracy_weights``). ``combine="probs"`` (the default) mixes the
softened probability distributions: ``p_t = sum_i w_i softmax(z_i / T)``, a proper mixture
that keeps each teacher's uncertainty (two confident teachers that disagree give a bimodal
target). ``combine="logits"`` averages logits first, ``p_t = softmax(sum_i w_i z_i / T)``, a
normalized geometric mean that is sharper wherever the teachers agree.

Build the student, load the teachers and create the Distiller inside ``strategy.scope()``.
Teachers are frozen (``trainable = False``, called with ``training=False`` so their batch-norm
statistics never move) and ``fit`` verifies that their weights are unchanged afterwards.
``evaluate`` and ``predict`` use the student alone; ``save`` saves the student alone;
``export_student`` writes the student. The Distiller trains whatever student it is given; to
compress while distilling, wrap the student with :func:`tfopt.compress.student.wrap` first.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tfopt.core._keras import ensure_tf_keras, keras, tf

from tfopt.config import COMBINE_MODES, DistillConfig
from tfopt.core._compat import is_graph_network
from tfopt.core.errors import ConfigError, ModelError
from tfopt.models.io import save_model
from tfopt.runtime import sharding

_DEFAULTS = DistillConfig()


@dataclass(frozen=True)
class FeaturePair:
    """Distil the output of ``teacher_layer`` (of teacher number ``teacher``) into ``student_layer``."""

    teacher_layer: str
    student_layer: str
    teacher: int = 0


def accuracy_weights(accuracies: Sequence[float], num_classes: int) -> list[float]:
    """Teacher weights from validation accuracies: the multi-class AdaBoost (SAMME) weight.

    ``w_i ∝ max(0, log(acc_i / (1 - acc_i)) + log(K - 1))``: zero for a teacher at chance
    level, growing with the log-odds of being right, so at 99% vs 98% the better teacher gets
    about 53% rather than the 50.3% that weights proportional to accuracy would give.

    Args:
        accuracies: One validation accuracy in [0, 1] per teacher.
        num_classes: Number of classes ``K`` (>= 2).

    Returns:
        Weights that sum to 1.

    Raises:
        ConfigError: no teacher is better than chance.
    """
    raw = []
    for acc in accuracies:
        acc = min(float(acc), 1 - 1e-6)  # a perfect teacher gets a large, finite weight
        chance = acc <= 1.0 / max(num_classes, 2)
        raw.append(0.0 if chance else math.log(acc / (1 - acc)) + math.log(max(num_classes - 1, 1)))
    if not sum(raw) > 0:
        raise ConfigError(
            f"teacher accuracies {list(accuracies)} are all at or below chance (1/{num_classes}); "
            "train the teachers first or give fixed weights"
        )
    return [r / sum(raw) for r in raw]


def teacher_log_probs(
    teacher_logits: Sequence[tf.Tensor],
    weights: Sequence[float],
    temperature: float,
    combine: str = "probs",
) -> tf.Tensor:
    """The teachers' combined softened distribution, as log-probabilities ``[B, K]``.

    Args:
        teacher_logits: One ``[B, K]`` logits tensor per teacher.
        weights: One non-negative weight per teacher, summing to 1.
        temperature: The softmax temperature ``T``.
        combine: ``probs`` (mixture of distributions) or ``logits`` (weighted mean of logits).
    """
    logits = [tf.cast(z, tf.float32) for z in teacher_logits]
    if len(logits) == 1:
        return tf.nn.log_softmax(logits[0] / temperature)
    w = tf.constant(weights, tf.float32)
    if combine == "logits":
        return tf.nn.log_softmax(tf.tensordot(w, tf.stack(logits), axes=1) / temperature)
    # log sum_i w_i p_i computed in log space; a zero weight gives log 0 = -inf, which logsumexp handles.
    log_p = tf.stack([tf.nn.log_softmax(z / temperature) for z in logits])
    return tf.reduce_logsumexp(log_p + tf.math.log(w)[:, None, None], axis=0)


def distillation_terms(
    labels, student_logits, teacher_logp, temperature: float
) -> dict[str, tf.Tensor]:
    """Per-example loss terms (each ``[B]``).

    Returns:
        ``kl``: KL(p_t || softmax(student / T)); ``distillation``: T^2 * kl (the T^2 keeps the
        soft-target gradients on the same scale for every T); ``student``: cross-entropy of the
        student with the labels.
    """
    s = tf.cast(student_logits, tf.float32)
    p_t = tf.exp(teacher_logp)
    # multiply_no_nan: a zero-probability class contributes 0, even where log p_t = -inf.
    kl = tf.reduce_sum(
        tf.math.multiply_no_nan(teacher_logp - tf.nn.log_softmax(s / temperature), p_t), axis=-1
    )
    labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=s)
    return {"kl": kl, "distillation": temperature**2 * kl, "student": ce}


def _find_layer(model: keras.Model, name: str, role: str) -> keras.layers.Layer:
    for layer in model.layers:
        # A tfmot wrapper (prune_low_magnitude_conv0) stands for the layer it wraps.
        if layer.name == name or getattr(getattr(layer, "layer", None), "name", None) == name:
            return layer
    raise ModelError(
        f"the {role} {model.name!r} has no layer {name!r}; choose one of "
        f"{', '.join(layer.name for layer in model.layers)}"
    )


def _functional(model: keras.Model, role: str) -> None:
    if not is_graph_network(model) or len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ModelError(
            f"the {role} {model.name!r} must be a functional or Sequential tf_keras model with one "
            "input and one output (logits) for feature distillation; rebuild it functionally"
        )


class Distiller(keras.Model):
    """A student learning from frozen teachers; trains with ``fit`` under any tf.distribute strategy.

    Args:
        student: The tf_keras model to train (outputs logits); may be tfmot-wrapped.
        teachers: One model or a list; each outputs logits over the same classes.
        temperature: Softmax temperature ``T`` (> 0). Defaults (here and below) are
            :class:`tfopt.config.DistillConfig`'s, the ones ``tfopt.distill`` uses.
        alpha: Weight of the distillation term in [0, 1]; ``0`` is plain training on labels.
        teacher_weights: One weight per teacher (normalized to sum 1); None = equal weights.
        combine: ``probs`` or ``logits``: how several teachers are combined (see module doc).
        features: ``FeaturePair``s or ``(teacher_layer, student_layer)`` tuples for feature
            distillation; a learned 1x1 conv (images) or dense (vectors) projection maps the
            student's width to the teacher's when they differ. Spatial sizes must match.
        feature_weight: Weight of the feature term.
        verify_teachers: ``fit`` checks that the teachers' weights did not change.
    """

    def __init__(
        self,
        student: keras.Model,
        teachers: keras.Model | Sequence[keras.Model],
        *,
        temperature: float = _DEFAULTS.temperature,
        alpha: float = _DEFAULTS.alpha,
        teacher_weights: Sequence[float] | None = None,
        combine: str = _DEFAULTS.combine,
        features: Sequence = (),
        feature_weight: float = _DEFAULTS.feature_weight,
        verify_teachers: bool = True,
        name: str = "distiller",
    ):
        super().__init__(name=name)
        teachers = [teachers] if isinstance(teachers, keras.Model) else list(teachers)
        for i, model in enumerate([student, *teachers]):
            if not isinstance(
                ensure_tf_keras(model, "student" if i == 0 else "teacher"), keras.Model
            ):
                raise ModelError(
                    f"{type(model).__name__} is not a tf_keras Model; give built tf_keras models"
                )
        if not teachers:
            raise ConfigError("no teacher given; give at least one teacher model")
        if not temperature > 0:
            raise ConfigError(f"temperature={temperature} must be > 0 (Hinton et al. use 2-20)")
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(
                f"alpha={alpha} must be in [0, 1] (0 = labels only, 1 = teacher only)"
            )
        if combine not in COMBINE_MODES:
            raise ConfigError(
                f"combine={combine!r} is not valid; choose one of {', '.join(COMBINE_MODES)}"
            )
        weights = (
            [1.0] * len(teachers)
            if teacher_weights is None
            else [float(w) for w in teacher_weights]
        )
        if len(weights) != len(teachers) or min(weights) < 0 or not sum(weights) > 0:
            raise ConfigError(
                f"teacher_weights={list(teacher_weights or [])} must be {len(teachers)} non-negative "
                "numbers with a positive sum, one per teacher"
            )
        classes = {
            m.name: m.outputs[0].shape[-1]
            for m in [student, *teachers]
            if getattr(m, "outputs", None)
        }
        if len(set(classes.values())) > 1:
            raise ModelError(
                f"student and teachers disagree on the number of classes {classes}; "
                "distil between models with the same output classes"
            )
        for teacher in teachers:
            teacher.trainable = False
        self.student = student
        self.teachers = teachers
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.teacher_weights = [w / sum(weights) for w in weights]
        self.combine = combine
        self.features = [p if isinstance(p, FeaturePair) else FeaturePair(*p) for p in features]
        self.feature_weight = float(feature_weight)
        self.verify_teachers = verify_teachers
        self._build_feature_nets()
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.distillation_tracker = keras.metrics.Mean(name="distillation_loss")
        self.student_tracker = keras.metrics.Mean(name="student_loss")
        self.feature_tracker = keras.metrics.Mean(name="feature_loss") if self.features else None
        if getattr(student, "inputs", None):
            # Built like its student: BackupAndRestore and summary() want a built model.
            self.build(student.inputs[0].shape)

    # -- the graph ---------------------------------------------------------------------------

    def _build_feature_nets(self) -> None:
        """Sub-models that also output the paired layers' features, and the projections."""
        self.projections = []
        self._projection_index: list[int] = []
        if not self.features:
            self._student_net, self._teacher_nets, self._teacher_feature_slots = (
                self.student,
                list(self.teachers),
                [],
            )
            return
        _functional(self.student, "student")
        s_outs, slots = [], []
        per_teacher: dict[int, list] = {}
        for k, pair in enumerate(self.features):
            if not 0 <= pair.teacher < len(self.teachers):
                raise ConfigError(
                    f"feature pair {pair} names teacher {pair.teacher}; there are {len(self.teachers)}"
                )
            teacher = self.teachers[pair.teacher]
            _functional(teacher, "teacher")
            s_out = _find_layer(self.student, pair.student_layer, "student").output
            t_out = _find_layer(teacher, pair.teacher_layer, "teacher").output
            s_shape, t_shape = tuple(s_out.shape), tuple(t_out.shape)
            if len(s_shape) != len(t_shape) or s_shape[1:-1] != t_shape[1:-1]:
                raise ModelError(
                    f"feature pair {pair.teacher_layer!r} {t_shape} / {pair.student_layer!r} {s_shape}: "
                    "ranks or spatial sizes differ; pair layers with the same spatial size"
                )
            s_outs.append(s_out)
            slots.append((pair.teacher, len(per_teacher.setdefault(pair.teacher, []))))
            per_teacher[pair.teacher].append(t_out)
            if s_shape[-1] != t_shape[-1]:
                # A learned projection maps the student's width to the teacher's (FitNets' regressor).
                make = keras.layers.Conv2D if len(s_shape) == 4 else keras.layers.Dense
                kwargs = {"kernel_size": 1} if len(s_shape) == 4 else {}
                proj = make(t_shape[-1], name=f"feature_projection{k}", dtype="float32", **kwargs)
                with keras.backend.name_scope(proj.name):
                    proj.build(s_shape)
                self._projection_index.append(len(self.projections))
                self.projections.append(proj)
            else:
                self._projection_index.append(-1)
        self._student_net = keras.Model(
            self.student.inputs,
            [self.student.outputs[0], *s_outs],
            name=f"{self.student.name}_features",
        )
        self._teacher_nets = [
            keras.Model(t.inputs, [t.outputs[0], *per_teacher[i]], name=f"{t.name}_features")
            if i in per_teacher
            else t
            for i, t in enumerate(self.teachers)
        ]
        self._teacher_feature_slots = slots

    def call(self, inputs, training=None):
        """The student's logits: predict and serve the student alone."""
        return self.student(inputs, training=training)

    def _run(self, x, training: bool):
        t_logits, t_feats = [], []
        for net in self._teacher_nets:
            out = net(x, training=False)  # inference mode: frozen batch-norm statistics, no dropout
            out = out if isinstance(out, (list, tuple)) else [out]
            t_logits.append(tf.stop_gradient(out[0]))
            t_feats.append([tf.stop_gradient(f) for f in out[1:]])
        out = self._student_net(x, training=training)
        out = out if isinstance(out, (list, tuple)) else [out]
        return out[0], list(out[1:]), t_logits, t_feats

    def loss_terms(
        self, y, student_logits, teacher_logits, student_features=(), teacher_features=()
    ) -> dict:
        """Per-example loss terms ``[B]``: distillation, student, feature (if any) and total."""
        logp = teacher_log_probs(
            teacher_logits, self.teacher_weights, self.temperature, self.combine
        )
        terms = distillation_terms(y, student_logits, logp, self.temperature)
        total = self.alpha * terms["distillation"] + (1.0 - self.alpha) * terms["student"]
        if self.features:
            feats = []
            for k, s in enumerate(student_features):
                teacher, slot = self._teacher_feature_slots[k]
                s = tf.cast(s, tf.float32)
                if self._projection_index[k] >= 0:
                    s = self.projections[self._projection_index[k]](s)
                diff = s - tf.cast(teacher_features[teacher][slot], tf.float32)
                feats.append(
                    tf.reduce_mean(tf.reshape(tf.square(diff), [tf.shape(diff)[0], -1]), axis=1)
                )
            terms["feature"] = tf.add_n(feats)
            total = total + self.feature_weight * terms["feature"]
        terms["total"] = total
        return terms

    # -- Keras hooks ---------------------------------------------------------------------------

    def compile(self, optimizer="adam", metrics=None, **kwargs):
        """Like ``Model.compile`` without a loss (the Distiller has its own); metrics default to accuracy."""
        if kwargs.get("loss") is not None:
            raise ConfigError(
                "Distiller.compile takes no loss: it computes the distillation loss itself; "
                "set temperature/alpha on the Distiller instead"
            )
        kwargs.pop("loss", None)
        super().compile(
            optimizer=optimizer, metrics=["accuracy"] if metrics is None else metrics, **kwargs
        )

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            s_logits, s_feats, t_logits, t_feats = self._run(x, training=True)
            terms = self.loss_terms(y, s_logits, t_logits, s_feats, t_feats)
            # Divide by the GLOBAL batch: the optimizer sums the replicas' gradients.
            loss = tf.nn.compute_average_loss(terms["total"], sample_weight=sample_weight)
            reg = list(self.student.losses) + [l for p in self.projections for l in p.losses]
            if reg:
                loss += tf.nn.scale_regularization_loss(tf.add_n(reg))
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return self.report_step(y, s_logits, terms, sample_weight)

    def report_step(self, y, student_logits, terms: dict, sample_weight=None) -> dict:
        """Updates the loss trackers and metrics with one step's per-example ``terms``
        (:meth:`loss_terms`) and returns the logs (a DP-SGD step reports through it too)."""
        self.loss_tracker.update_state(terms["total"], sample_weight)
        self.distillation_tracker.update_state(terms["distillation"], sample_weight)
        self.student_tracker.update_state(terms["student"], sample_weight)
        if self.feature_tracker is not None:
            self.feature_tracker.update_state(terms["feature"], sample_weight)
        self.compiled_metrics.update_state(y, student_logits, sample_weight)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        """Evaluates the student alone: ``loss`` is its cross-entropy with the labels."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        s_logits = self.student(x, training=False)
        labels = tf.reshape(tf.cast(y, tf.int64), [-1])
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.cast(s_logits, tf.float32)
        )
        self.loss_tracker.update_state(ce, sample_weight)
        self.compiled_metrics.update_state(y, s_logits, sample_weight)
        return {
            "loss": self.loss_tracker.result(),
            **{m.name: m.result() for m in self.compiled_metrics.metrics},
        }

    def fit(self, *args, **kwargs):
        """``Model.fit``, then a check that the teachers' weights are bit-identical to before.

        Raises:
            ModelError: a teacher's weights changed (something trained or assigned them).
        """
        before = self.teacher_digests() if self.verify_teachers else None
        history = super().fit(*args, **kwargs)
        if before is not None:
            after = self.teacher_digests()
            changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
            if changed:
                raise ModelError(
                    f"teacher(s) {changed} changed during fit; teachers must stay frozen: do not "
                    "set teacher.trainable = True or assign their weights in callbacks"
                )
        return history

    # -- weights and export --------------------------------------------------------------------

    def teacher_digests(self) -> list[str]:
        """sha256 of each teacher's weights (under MultiWorkerMirrored every worker must call it)."""
        out = []
        for teacher in self.teachers:
            h = hashlib.sha256()
            for w in teacher.get_weights():
                h.update(w.tobytes())
            out.append(h.hexdigest())
        return out

    @property
    def step_predictions(self):
        """What the compiled metrics read each step (the student's logits), for building them before the first."""
        outputs = self.student.outputs
        return outputs[0] if outputs and len(outputs) == 1 else None

    def student_weights(self) -> list:
        """The student's weights, in ``plain_student()``'s order.

        Reading weights under MultiWorkerMirroredStrategy is a collective: every worker calls it.
        """
        return sharding.full_weights(self.student)

    def plain_student(self) -> keras.Model:
        """A strategy-free copy of the student, for evaluation and saving.

        Every worker must call it under MultiWorkerMirroredStrategy (it reads the weights). A
        student wrapped by tfmot is copied by :func:`tfopt.compress.student.plain_copy` instead.
        """
        weights = sharding.full_weights(self.student)

        def copy():
            # A helper thread has no strategy scope (scopes are thread-local): the copy is plain.
            model = keras.models.clone_model(self.student)
            model.set_weights(weights)
            return model

        with ThreadPoolExecutor(1) as pool:
            return pool.submit(copy).result()

    def export_student(self, out_dir: str) -> dict[str, str]:
        """Saves the plain student as ``out_dir/model.keras`` and ``out_dir/saved_model`` (atomically)."""
        return save_model(self.plain_student(), out_dir)

    def save(self, filepath, *args, **kwargs):
        """Saves the student alone (teachers and projections are training aids, not the model)."""
        return self.student.save(filepath, *args, **kwargs)
