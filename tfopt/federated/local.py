"""What a federated client and the server do with the model: build it, train it locally, score it.

The client's training is plain minibatch SGD on its partition, E passes, with FedProx's proximal
term when mu > 0; the server scores the global model on the validation split. The files the
chief writes for them (``spec.json`` and the arrays it names) are read here too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt import config as config_lib
from tfopt.core.fileio import write_bytes

#: The file the chief writes into the run's federated directory; the Flower app finds it there.
SPEC = "spec.json"


def read_spec(path: str) -> dict:
    """The chief's ``spec.json`` at ``path``, with its ``dir`` (the directory it is in) added."""
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    spec["dir"] = os.path.dirname(os.path.abspath(path))
    spec["cfg"] = config_lib.from_dict(spec["config"])
    return spec


def path_of(spec: dict, name: str) -> str:
    """The absolute path of the file ``spec`` names under ``name``."""
    return os.path.join(spec["dir"], spec["files"][name])


def build(spec: dict) -> keras.Model:
    """The run's model (weights to be set), as the chief built it."""
    from tfopt.models import sources

    cfg = spec["cfg"]
    return sources.build(cfg.model, tuple(spec["image_shape"]), spec["num_classes"]).model


def load_arrays(path: str) -> tuple[list[np.ndarray], dict]:
    """The weight arrays saved by :func:`save_arrays`, and the numbers saved with them."""
    with np.load(path) as f:
        arrays = [f[f"w{i}"] for i in range(int(f["count"]))]
        info = {k: f[k].item() for k in f.files if not k.startswith("w") and k != "count"}
    return arrays, info


def save_arrays(path: str, arrays: list[np.ndarray], **info) -> None:
    """Writes weight arrays (and scalar ``info``) to ``path`` atomically."""
    import io

    buffer = io.BytesIO()
    np.savez(buffer, count=len(arrays), **{f"w{i}": a for i, a in enumerate(arrays)}, **info)
    write_bytes(path, buffer.getvalue())


def client_seed(seed: int, round_: int, client: int) -> int:
    """The seed of one client's local training in one round (its shuffle order)."""
    return (seed * 1_000_003 + round_ * 1_009 + client) % (2**31 - 1)


def fit(
    model: keras.Model,
    weights: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    mu: float = 0.0,
    seed: int = 0,
) -> tuple[list[np.ndarray], dict]:
    """Trains ``model`` from ``weights`` on ``(x, y)``: ``epochs`` passes of SGD at ``lr`` in
    shuffled minibatches of ``batch_size``, minimizing the cross-entropy plus, when ``mu`` > 0,
    FedProx's ``mu/2 ||w - weights||^2`` over the trainable weights.

    Returns:
        The trained weights (every weight of the model, in ``get_weights`` order) and the mean
        loss and accuracy of the last pass.
    """
    keras.utils.set_random_seed(seed)
    model.set_weights(weights)
    variables = model.trainable_variables
    anchors = [tf.constant(v.numpy()) for v in variables]
    optimizer = keras.optimizers.SGD(learning_rate=lr)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = loss_fn(yb, logits) + tf.add_n([0.0, *model.losses])
            if mu:
                loss += (
                    mu
                    / 2
                    * tf.add_n(
                        [tf.reduce_sum(tf.square(v - a)) for v, a in zip(variables, anchors)]
                    )
                )
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        hits = tf.reduce_sum(tf.cast(tf.argmax(logits, -1) == tf.cast(yb, tf.int64), tf.float32))
        return loss * tf.cast(tf.shape(yb)[0], tf.float32), hits

    data = tf.data.Dataset.from_tensor_slices((x, y))
    data = data.shuffle(len(y), seed=seed, reshuffle_each_iteration=True).batch(batch_size)
    totals = np.zeros(2)
    for _ in range(epochs):
        totals[:] = 0
        for xb, yb in data:
            totals += [float(t) for t in step(xb, yb)]
    return model.get_weights(), {"loss": totals[0] / len(y), "accuracy": totals[1] / len(y)}


def fit_litert(
    path: str,
    head: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    seed: int = 0,
) -> tuple[list[np.ndarray], dict]:
    """Trains the head of the on-device file at ``path`` (:mod:`tfopt.models.ondevice`) in
    LiteRT, as a phone would: ``restore`` the global ``head``, ``epochs`` shuffled passes of the
    ``train`` signature in batches of ``batch_size`` (SGD at the file's learning rate), then
    ``save``.

    Returns:
        The head's ``[kernel, bias]`` and the mean loss of the last pass.
    """
    from tfopt.models import ondevice

    with open(path, "rb") as f:
        run = ondevice.runners(f.read())
    run["restore"](kernel=head[0].astype(np.float32), bias=head[1].astype(np.float32))
    rng = np.random.default_rng(seed)
    x, y = x.astype(np.float32), y.astype(np.int32)
    loss = 0.0
    for _ in range(epochs):
        order, loss = rng.permutation(len(y)), 0.0
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            loss += float(run["train"](image=x[idx], label=y[idx])["loss"]) * len(idx)
    kept = run["save"]()
    return [kept["kernel"], kept["bias"]], {"loss": loss / len(y)}


def global_model(spec: dict) -> tuple[keras.Model, Callable[[list[np.ndarray]], None]]:
    """The server's model and how a global model's arrays go into it: every weight, or under
    ``--client-runtime litert`` the head's kernel and bias over the round-0 model's frozen
    layers."""
    model = build(spec)
    if spec["cfg"].federated.client_runtime != "litert":
        return model, model.set_weights
    model.set_weights(load_arrays(path_of(spec, "initial"))[0])
    return model, model.get_layer(spec["head"]).set_weights


def start_arrays(spec: dict, model: keras.Model) -> list[np.ndarray]:
    """Round 0's global arrays: the round-0 model's weights, or its head's under
    ``--client-runtime litert`` (``model`` from :func:`global_model`)."""
    if spec["cfg"].federated.client_runtime == "litert":
        return model.get_layer(spec["head"]).get_weights()
    return load_arrays(path_of(spec, "initial"))[0]


def score(model: keras.Model, x: np.ndarray, y: np.ndarray) -> dict:
    """The loss and accuracy of ``model`` on ``(x, y)``."""
    logits = model.predict(x, batch_size=256, verbose=0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    return {"loss": float(loss), "accuracy": float(np.mean(np.argmax(logits, -1) == y))}


def deterministic() -> None:
    """Op determinism for this process: a client's update depends only on its inputs."""
    tf.config.experimental.enable_op_determinism()
