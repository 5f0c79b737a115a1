"""Peer of benchmark B6: the recipe of keras.io's example "Knowledge Distillation".

Tutorial: "Knowledge Distillation" (Kenneth Borup, keras.io code example),
https://keras.io/examples/vision/knowledge_distillation/
(keras-team/keras-io, ``examples/vision/knowledge_distillation.py``).

What a user following it does, step by step as the example says (its first steps, building and
training the teacher, are the benchmark's: every side distils the same trained teacher into the
same student architecture from the same initial weights, on the same images):

1. A ``Distiller(student, teacher)`` model whose training step runs the teacher in inference mode
   and the student in training mode, and minimizes
   ``alpha * CE(labels, student) + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(student / T))``
   with the example's values ``alpha = 0.1`` (the weight of the LABELS, not of the teacher) and
   ``T = 10``. Both terms are Keras loss objects with their default reduction (mean over the batch):
   ``SparseCategoricalCrossentropy(from_logits=True)`` and ``KLDivergence()``. Only the student's
   weights are updated.
2. ``compile`` with ``keras.optimizers.Adam()`` (learning rate 1e-3, constant) and sparse
   categorical accuracy.
3. ``fit(x_train, y_train, epochs=...)`` with Keras' default batch size (32) and shuffling. The
   example distils 3 epochs; the benchmark gives the peer the same number of student updates
   over the same transfer set as the tfopt side (``epochs`` and ``batch_size`` arguments), so that
   the recipes differ in their loss and hyperparameters, not in their budget.
4. ``evaluate`` the student on the test split (done by the benchmark, with the other students).

Single-device only, like the example (it has no strategy support: its Keras-default reductions
average per replica).
"""

from __future__ import annotations

from tfopt.core._keras import keras, tf

import numpy as np

TUTORIAL = 'keras.io "Knowledge Distillation" example'
URL = "https://keras.io/examples/vision/knowledge_distillation/"
ALPHA = 0.1  # the example's weight of the student (label) loss; the teacher term gets 1 - alpha
TEMPERATURE = 10.0
LEARNING_RATE = 1e-3  # keras.optimizers.Adam()'s default
BATCH_SIZE = 32  # Model.fit's default; the example passes none


class KerasIoDistiller(keras.Model):
    """The example's Distiller: a teacher forward pass in inference mode, the weighted two-term loss."""

    def __init__(
        self,
        student: keras.Model,
        teacher: keras.Model,
        *,
        alpha: float = ALPHA,
        temperature: float = TEMPERATURE,
    ):
        super().__init__()
        self.student, self.teacher = student, teacher
        self.alpha, self.temperature = alpha, temperature
        self.student_loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.distillation_loss_fn = keras.losses.KLDivergence()

    def call(self, x, training=None):
        return self.student(x, training=training)

    def train_step(self, data):
        x, y = data
        teacher_logits = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            student_logits = self.student(x, training=True)
            student_loss = self.student_loss_fn(y, student_logits)
            # The example scales the soft term by T^2 (Hinton et al.: its gradients shrink as 1/T^2).
            distillation_loss = (
                self.distillation_loss_fn(
                    tf.nn.softmax(teacher_logits / self.temperature, axis=1),
                    tf.nn.softmax(student_logits / self.temperature, axis=1),
                )
                * self.temperature**2
            )
            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
        variables = self.student.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        self.compiled_metrics.update_state(y, student_logits)
        return {
            "student_loss": student_loss,
            "distillation_loss": distillation_loss,
            **{m.name: m.result() for m in self.metrics},
        }


def distil(
    student: keras.Model,
    teacher: keras.Model,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int = BATCH_SIZE,
    seed: int = 0,
) -> keras.Model:
    """Distils ``teacher`` into ``student`` (trained in place) with the example's recipe; returns the student.

    Args:
        student: The student to train (its initial weights are the caller's).
        teacher: The trained teacher (left unchanged: the example never updates it).
        x: Transfer-set images; y: their labels (the example's ``fit(x_train, y_train)``).
        epochs: Passes over ``x``.
        batch_size: Examples per step (the example uses ``fit``'s default, 32).
        seed: Seeds ``fit``'s shuffling.
    """
    keras.utils.set_random_seed(seed)
    distiller = KerasIoDistiller(student, teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    distiller.fit(x, y, epochs=epochs, batch_size=batch_size, shuffle=True, verbose=0)
    return student
