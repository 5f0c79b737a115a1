"""The pipelined model: its training step runs the stages micro-batch by micro-batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tfopt.core._keras import keras, tf

from tfopt.core.errors import ConfigError
from tfopt.runtime.gpipe.cost import piece_seconds
from tfopt.runtime.gpipe.schedule import microbatch_sizes, one_f_one_b_step
from tfopt.runtime.gpipe.stages import Partition, build_stages, partition, stage_devices

#: The orders a training step can run its passes in.
SCHEDULES = ("gpipe", "1f1b")


class Pipelined(keras.Model):
    """The stages as one Keras model whose training step runs a pipeline schedule.

    ``fit``, ``evaluate`` and ``predict`` work as for any model; a training step splits the batch
    into ``microbatches`` parts, passes each through the stages on their devices and applies the
    gradients summed over the micro-batches once: under ``gpipe`` every forward pass comes first
    and the loss is taken over the whole batch; under ``1f1b``
    (:mod:`tfopt.runtime.gpipe.schedule`) each stage alternates forward and backward passes and
    each micro-batch's loss is weighted by its share of the batch.

    Args:
        stages: The stage models (:func:`build_stages`), in order.
        devices: Each stage's device.
        microbatches: M, the micro-batches per batch (>= 1).
        remat: Recompute each stage's activations in the backward pass instead of keeping them.
        partition: Where the model was cut (recorded by :meth:`describe`).
        schedule: ``gpipe`` or ``1f1b``.
    """

    def __init__(
        self,
        stages: Sequence[keras.Model],
        devices: Sequence[str],
        microbatches: int,
        remat: bool = False,
        partition: Partition | None = None,
        schedule: str = "gpipe",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if microbatches < 1:
            raise ConfigError(f"--microbatches {microbatches} must be >= 1")
        if schedule not in SCHEDULES:
            raise ConfigError(
                f"--pipeline-schedule {schedule!r} is not valid; choose one of {', '.join(SCHEDULES)}"
            )
        self.schedule = schedule
        self.stages = list(stages)
        self.devices = list(devices)
        self.microbatches = microbatches
        self.remat = remat
        self.partition = partition

    def describe(self) -> dict:
        """The split as ``run.json`` records it: each stage's layers, cost and device, M, the
        rematerialization, and GPipe's idle fraction (K-1)/(M+K-1) for this K and M."""
        k, m = len(self.stages), self.microbatches
        part = self.partition
        return {
            "stages": [
                {
                    "layers": len(names),
                    "first": names[0],
                    "last": names[-1],
                    "cost": cost,
                    "device": device,
                }
                for names, cost, device in zip(part.stages, part.costs, self.devices, strict=True)
            ],
            "balanced_by": part.by,
            "microbatches": m,
            "schedule": self.schedule,
            "remat": self.remat,
            "bubble_formula": (k - 1) / (m + k - 1),
        }

    def call(self, inputs, training=None):
        h = inputs
        for stage, device in zip(self.stages, self.devices, strict=True):
            with tf.device(device):
                h = stage(h, training=training)
        return h

    def unsplit_weights(self, model: keras.Model) -> list:
        """The stages' weights in the order of ``model.get_weights()``, ``model`` being the
        unsplit model (or a copy of it): each of its layers takes its namesake's."""
        layers = {
            layer.name: layer
            for stage in self.stages
            for layer in stage.layers
            if not isinstance(layer, keras.layers.InputLayer)
        }
        return [
            w
            for layer in model.layers
            if layer.name in layers
            for w in layers[layer.name].get_weights()
        ]

    def pipelined_forward(self, x):
        """The training forward pass: micro-batch by micro-batch through the stages.

        Raises:
            tf.errors.InvalidArgumentError: a batch of fewer examples than micro-batches (an
                empty micro-batch; give ``fit`` batches of at least M examples).
        """
        n = tf.shape(x)[0]
        tf.debugging.assert_greater_equal(
            n,
            self.microbatches,
            message=f"a batch smaller than the {self.microbatches} micro-batches it is split into",
        )
        sizes = microbatch_sizes(n, self.microbatches)
        parts = tf.split(x, sizes, num=self.microbatches)
        calls = [self._stage_call(stage) for stage in self.stages]
        outputs = []
        for part in parts:
            h = part
            for call, device in zip(calls, self.devices, strict=True):
                with tf.device(device):
                    h = call(h)
            outputs.append(h)
        with tf.device(self.devices[-1]):
            return tf.concat(outputs, 0)

    def _stage_call(self, stage):
        def run(h):
            return stage(h, training=True)

        return tf.recompute_grad(run) if self.remat else run

    def gradients(self, x, y, sample_weight=None) -> tuple:
        """The predictions and the gradients (in ``trainable_variables``' order) of one training
        step under the model's schedule, not applied; the model must be compiled."""
        if self.schedule == "1f1b":
            return one_f_one_b_step(self, x, y, sample_weight)
        scaling = isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer)
        with tf.GradientTape() as tape:
            y_pred = self.pipelined_forward(x)
            loss = self.compute_loss(x, y, y_pred, sample_weight)
            if scaling:
                loss = self.optimizer.get_scaled_loss(loss)
        grads = tape.gradient(loss, self.trainable_variables)
        if scaling:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return y_pred, grads

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred, grads = self.gradients(x, y, sample_weight)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return self.compute_metrics(x, y, y_pred, sample_weight)


def split(
    model: keras.Model,
    runtime: Any,
    macs: Callable | None = None,
    sample: Any = None,
    part: Partition | None = None,
) -> Pipelined:
    """``model`` split as ``runtime`` (a :class:`~tfopt.config.RuntimeConfig`) says: ``stages``,
    ``microbatches`` (0 = 4K), ``balance``, ``cut_after`` (comma-separated), ``remat`` and
    ``schedule``.

    Args:
        model: The model to split.
        runtime: The runtime section.
        macs: The multiply-add counter ``balance="flops"`` uses.
        sample: A batch of inputs at the training batch size, which ``balance="time"`` times
            the pieces on.
        part: Where to cut instead (a resumed run's recorded partition).
    """
    k = runtime.stages
    if part is None:
        cut = [name.strip() for name in runtime.cut_after.split(",") if name.strip()]
        seconds = None
        if runtime.balance == "time" and not cut:
            seconds = piece_seconds(model, sample)
        part = partition(model, k, by=runtime.balance, cut_after=cut, macs=macs, seconds=seconds)
    devices = stage_devices(k)
    stages = build_stages(model, part, devices)
    m = runtime.microbatches or 4 * k
    return Pipelined(stages, devices, m, runtime.remat, part, runtime.schedule)


def copy_weights_back(pipelined: Pipelined, model: keras.Model) -> None:
    """Sets ``model``'s layers to the stages' weights (matched by layer name)."""
    model.set_weights(pipelined.unsplit_weights(model))
