"""Models saved by Keras 3 (what Colab and ``tf.keras`` in TF >= 2.16 save), for post-training quantization.

tfopt trains with tf_keras because tfmot needs it, and tf_keras cannot read a Keras 3 file. The
converter does not need either Keras: it reads a SavedModel. So a Keras 3 ``.keras``/``.h5`` file
is exported by Keras 3 itself, in a child process (``Model.export``: an inference SavedModel, safe
mode on unless the file is trusted), and that SavedModel is wrapped as a one-layer tf_keras model
whose call is the SavedModel's ``serve`` function. The export stage then converts, evaluates and
times it like any model: the TFLite flatbuffer is the Keras 3 model's graph. The SavedModel hides
the layers, so the pixels the model expects are read from the file by Keras 3 too
(:func:`input_side`), exactly as a tf_keras model's are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from tfopt.core._keras import keras, tf

import numpy as np

from tfopt.core.errors import ModelError
from tfopt.models import inputs
from tfopt.models.inputs import InputSide

_EXPORT = """
import sys
import keras
model = keras.saving.load_model(sys.argv[1], safe_mode=sys.argv[3] != "trust")
model.export(sys.argv[2], format="tf_saved_model", verbose=False)
"""


# Keras 3 reads the input side as tfopt.models.inputs reads a tf_keras model's: the graph is cut at
# the first layer with trainable weights (inside nested models too) and the part before it runs
# on the probe images. argv: model, probes.npy, out.npy, safe|trust.
_INPUT_SIDE = """
import json, sys
import numpy as np
import keras

def weighted(layer):
    return any(getattr(v, "trainable", False) for v in layer.weights)

def label(layer):
    return f"{layer.name} ({type(layer).__name__})"

def head(model, layer):
    for node in layer._inbound_nodes:
        tensors = node.input_tensors
        try:
            return keras.Model(model.inputs, tensors[0] if len(tensors) == 1 else tensors)
        except Exception:
            continue
    raise ValueError("no input of " + layer.name + " is reachable from the model's input")

def cut(model):
    passed = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if not weighted(layer):
            passed.append(label(layer))
            continue
        step = head(model, layer)
        if isinstance(layer, keras.Model) and len(layer.inputs) == 1:
            inner, inner_passed, first = cut(layer)
            return [step, *inner], passed + inner_passed, first
        return [step], passed, label(layer)
    return [], passed, ""

model = keras.saving.load_model(sys.argv[1], safe_mode=sys.argv[4] != "trust")
steps, passed, first = cut(model)
x = np.load(sys.argv[2])
for step in steps:
    x = step(x, training=False)
np.save(sys.argv[3], np.asarray(x, np.float64))
print(json.dumps({"passed": passed, "first": first, "cut": bool(steps)}))
"""


def _keras3(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env
    )


def _reason(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else f"exit code {proc.returncode}")[:300]


def input_side(path: str, image_shape, *, trust_model: bool = False) -> InputSide:
    """The Keras 3 model file ``path``'s input side, read by Keras 3 itself (in a child process).

    The same reading as :func:`tfopt.models.inputs.measure` gives a tf_keras model: what the
    layers before the first weighted one do to probe images of known pixels.

    Raises:
        ModelError: Keras 3 cannot load the file, or cannot cut its graph (then the input side
            cannot be read: the message asks for ``--input-scale``).
    """
    with tempfile.TemporaryDirectory(prefix="tfopt-keras3-") as tmp:
        probes, out = os.path.join(tmp, "probes.npy"), os.path.join(tmp, "side.npy")
        np.save(probes, inputs.probe_images(image_shape))
        proc = _keras3(_INPUT_SIDE, path, probes, out, "trust" if trust_model else "safe")
        if proc.returncode != 0:
            raise ModelError(
                f"Keras 3 could not read the input side of {path} ({_reason(proc)}); say what it "
                "expects with --input-scale unit (pixels / 255) or --input-scale raw (0-255 pixels)"
            )
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        if not found["cut"]:
            return inputs.InputSide(tuple(found["passed"]), found["first"], (), ())
        return inputs.fit(np.load(out), found["passed"], found["first"], image_shape)


def to_saved_model(path: str, out_dir: str, *, trust_model: bool = False) -> str:
    """Exports the Keras 3 model file ``path`` as an inference SavedModel in ``out_dir`` (with Keras 3).

    Raises:
        ModelError: Keras 3 cannot load or export it (the first line of its error, and the fix).
    """
    proc = _keras3(_EXPORT, path, out_dir, "trust" if trust_model else "safe")
    if proc.returncode != 0:
        raise ModelError(
            f"Keras 3 could not export {path} as a SavedModel ({_reason(proc)}); "
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
