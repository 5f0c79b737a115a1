"""Peer of benchmark B9: the recipes of the LiteRT "Post-training quantization" guide.

Guide: "Post-training quantization", https://ai.google.dev/edge/litert/models/post_training_quantization
(tensorflow/tensorflow, ``tensorflow/lite/g3doc/performance/post_training_quantization.md``).

What a user following it does with a trained Keras model, one recipe per mode, as the guide
writes them:

- float32: ``TFLiteConverter.from_keras_model(model).convert()``.
- dynamic range: ``converter.optimizations = [tf.lite.Optimize.DEFAULT]``.
- float16: ``Optimize.DEFAULT`` and ``target_spec.supported_types = [tf.float16]``.
- int8 ("integer only"): ``Optimize.DEFAULT``, a ``representative_dataset`` of 100 input samples
  one at a time, ``supported_ops = [TFLITE_BUILTINS_INT8]``, ``inference_input_type`` and
  ``inference_output_type`` ``tf.int8``.
- int16x8: ``Optimize.DEFAULT``, the representative dataset, ``supported_ops =
  [EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]``.

The representative samples are the first 100 training images, given exactly as the model takes
them (resized and scaled the way the benchmark's pipeline feeds the Keras model).
"""

from __future__ import annotations

from tfopt.core._keras import keras, tf

import numpy as np

GUIDE = 'LiteRT "Post-training quantization" guide'
URL = "https://ai.google.dev/edge/litert/models/post_training_quantization"
MODES = ("float32", "dynamic", "float16", "int8", "int16x8")
REPRESENTATIVE_SAMPLES = 100


def convert(model: keras.Model, mode: str, samples: np.ndarray) -> bytes:
    """One of the guide's recipes on ``model``; ``samples`` are model inputs for the representative dataset."""

    def representative_dataset():
        for x in samples[:REPRESENTATIVE_SAMPLES]:
            yield [x[None].astype(np.float32)]

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if mode != "float32":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif mode == "int8":
        converter.representative_dataset = representative_dataset
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    elif mode == "int16x8":
        converter.representative_dataset = representative_dataset
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
        ]
    return converter.convert()


def predict(content: bytes, images: np.ndarray) -> np.ndarray:
    """Class predictions, one image per ``invoke``; int8 inputs quantized with the input's scale and zero point."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    predictions = np.zeros((len(images),), dtype=int)
    for i, image in enumerate(images):
        if inp["dtype"] == np.int8:
            scale, zero_point = inp["quantization"]
            image = np.clip(np.round(image / scale + zero_point), -128, 127)
        interpreter.set_tensor(inp["index"], np.expand_dims(image, axis=0).astype(inp["dtype"]))
        interpreter.invoke()
        predictions[i] = interpreter.get_tensor(out["index"])[0].argmax()
    return predictions
