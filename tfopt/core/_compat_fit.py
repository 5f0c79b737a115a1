"""The tf_keras fit-loop entries of :mod:`tfopt.core._compat` (which re-exports them): private
APIs with no public equivalent, each checked by ``tests/test_compat.py``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class _StartAt:
    """What tf_keras' ``fit`` asks ``Model._training_state`` for: the (epoch, step) to start at."""

    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        return self.epoch, self.step


def accept_remote_logs(callback) -> None:
    """Lets ``callback``'s batch hooks run under ParameterServerStrategy.

    tf_keras 2.21 refuses batch-level callbacks under ParameterServerStrategy unless they declare
    ``_supports_tf_logs`` (their batch logs are then unfetched ``RemoteValue``s, which the callback
    must not read). Set it after ``Callback.__init__``, which resets it.
    """
    callback._supports_tf_logs = True


def random_generators(model) -> list:
    """The ``tf.random.Generator`` of every random layer of ``model`` (dropout...), created now.

    tf_keras 2.21: with ``keras.backend.experimental.enable_tf_random_generator()`` a random layer
    draws from a ``tf.random.Generator`` whose state is a variable, but the layer's generator is
    made on first use and is not part of the model's checkpoint (layers without weights are not
    tracked), so a backup would not hold it. Call inside the strategy's scope. Empty under the
    legacy (stateful-op) random generator, whose state cannot be saved at all.
    """
    out = []
    for layer in model.submodules:
        rng = getattr(layer, "_random_generator", None)
        if rng is None or not hasattr(rng, "_maybe_init"):
            continue
        rng._maybe_init()
        if getattr(rng, "_generator", None) is not None:
            out.append(rng._generator)
    return out


def build_step_state(model, predictions=None) -> None:
    """Creates, before the first step, the variables tf_keras would create inside it.

    tf_keras 2.21 creates the optimizer's slot variables and the compiled loss and metric objects
    on the first call of ``train_function`` / ``test_function``. A ``tf.function`` whose first
    call creates variables is traced twice (once creating them, once without), so every ``fit``
    and ``evaluate`` traced its step twice: about a second per compiled model on 2 cores. Created
    here first (slots start at zero either way), the step is traced once. The compiled loss and
    metric containers have no public ``build``.

    Args:
        model: A compiled tf_keras model (its optimizer, if any, is built on its trainable variables).
        predictions: What the metrics are updated with: a ``KerasTensor`` or ``tf.TensorSpec``
            (default: the model's single output; a model without one, e.g. the Distiller, passes
            its student's). Nothing but the optimizer is built when there is no single output.
            Nothing at all is built for a model whose layers are not built yet (a subclassed
            model before its first call): its variables appear in the first step, as in Keras.
    """
    import tensorflow as tf

    layers = list(model._flatten_layers(include_self=False))
    if not model.built and not (layers and all(layer.built for layer in layers)):
        return
    with model.distribute_strategy.scope():
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "build"):
            optimizer.build(model.trainable_variables)
        outputs = getattr(model, "outputs", None)
        if predictions is None and outputs and len(outputs) == 1:
            predictions = outputs[0]
        if predictions is None:
            return
        y_pred = tf.zeros((1, *predictions.shape[1:]), predictions.dtype)
        y_true = tf.zeros((1,), tf.int64)  # tfopt's labels: a batch of class ids
        if getattr(model, "loss", None) is not None and model.compiled_loss is not None:
            model.compiled_loss.build(y_pred)
        if model.compiled_metrics is not None:
            model.compiled_metrics.build(y_pred, y_true)


@contextmanager
def fit_resumes_at(model, epoch: int, step: int) -> Iterator[None]:
    """Makes ``model.fit`` inside the block start at ``step`` of ``epoch`` instead of epoch 0.

    tf_keras 2.21: ``fit`` has only ``initial_epoch``; a mid-epoch start exists solely for its
    own ``BackupAndRestore``, through ``Model._training_state`` (consulted after the callbacks'
    ``on_train_begin``). The input must already begin at that step.
    """
    previous = model._training_state
    model._training_state = _StartAt(epoch, step)
    try:
        yield
    finally:
        model._training_state = previous
