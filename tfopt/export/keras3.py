"""Models saved by Keras 3 (what Colab and ``tf.keras`` in TF >= 2.16 save), for post-training quantization.

tfopt trains with tf_keras because tfmot needs it, and tf_keras cannot read a Keras 3 file. The
converter does not need either Keras: it reads a SavedModel. So a Keras 3 ``.keras``/``.h5`` file
is exported by Keras 3 itself, in a child process (``Model.export``: an inference SavedModel, safe
mode on unless the file is trusted), and that SavedModel is wrapped as a one-layer tf_keras model
whose call is the SavedModel's ``serve`` function. The export stage then converts, evaluates and
times it like any model: the TFLite flatbuffer is the Keras 3 model's graph.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tfopt._keras import keras, tf

from tfopt.errors import ModelError

_EXPORT = """
import sys
import keras
model = keras.saving.load_model(sys.argv[1], safe_mode=sys.argv[3] != "trust")
model.export(sys.argv[2], format="tf_saved_model", verbose=False)
"""


def to_saved_model(path: str, out_dir: str, *, trust_model: bool = False) -> str:
    """Exports the Keras 3 model file ``path`` as an inference SavedModel in ``out_dir`` (with Keras 3).

    Raises:
        ModelError: Keras 3 cannot load or export it (the first line of its error, and the fix).
    """
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", _EXPORT, path, out_dir, "trust" if trust_model else "safe"],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"exit code {proc.returncode}"
        raise ModelError(
            f"Keras 3 could not export {path} as a SavedModel ({reason[:300]}); "
            "pass --trust-model for custom objects and Lambda layers you trust"
        )
    return out_dir


class ServingLayer(keras.layers.Layer):
    """A tf_keras layer that calls an inference SavedModel's ``serve`` function (one image batch in)."""

    def __init__(self, directory: str, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.directory = directory
        self.loaded = tf.saved_model.load(directory)  # tracked: its variables travel with the model

    def call(self, inputs):
        return self.loaded.serve(inputs)


def as_tf_keras(directory: str, name: str) -> keras.Model:
    """The SavedModel in ``directory`` as a tf_keras functional model (one image input, one output).

    Raises:
        ModelError: the SavedModel has no ``serve`` function of one 4-D input.
    """
    loaded = tf.saved_model.load(directory)
    serve = getattr(loaded, "serve", None)
    specs = (
        serve.input_signature if serve is not None and hasattr(serve, "input_signature") else None
    )
    if not specs or len(specs) != 1 or specs[0].shape.rank != 4:
        raise ModelError(
            f"the SavedModel of {name} has no serve(images) function of one [N, H, W, C] input; "
            "export an image classifier with one input"
        )
    inputs = keras.Input(shape=specs[0].shape[1:], dtype=specs[0].dtype, name="image")
    return keras.Model(inputs, ServingLayer(directory, name="keras3_model")(inputs), name=name)
