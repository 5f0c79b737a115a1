"""Peer of benchmark B5: the recipe of tfmot's "Quantization aware training in Keras example".

Tutorial: "Quantization aware training in Keras example",
https://www.tensorflow.org/model_optimization/guide/quantization/training_example
(tensorflow/model-optimization, ``g3doc/guide/quantization/training_example.ipynb``).

What a user following it does, step by step as the tutorial says:

1. Scales the MNIST images to [0, 1] (``/ 255``; here: the benchmark's MNIST training split).
2. Builds the same small model as the post-training tutorial (``Reshape`` -> ``Conv2D(12, 3x3,
   relu)`` -> ``MaxPooling2D`` -> ``Flatten`` -> ``Dense(10)``), compiles it with Adam, sparse
   categorical cross-entropy from logits and accuracy, and trains 1 epoch with
   ``validation_split=0.1`` (Keras' default batch of 32).
3. Applies ``tfmot.quantization.keras.quantize_model`` to the whole model and recompiles it the
   same way.
4. Fine-tunes it 1 epoch on the first 1,000 training images, ``batch_size=500``,
   ``validation_split=0.1``.
5. Converts the QAT model with ``optimizations = [Optimize.DEFAULT]`` (int8 weights and
   activations with the learned ranges, float input and output), and the float model with a plain
   ``TFLiteConverter.from_keras_model``.
6. Evaluates both .tflite one test image per ``invoke`` (argmax) and compares the QAT model's
   accuracy with the float baseline's, and the two file sizes (its "4x smaller").
"""

from __future__ import annotations

from tfopt.core._keras import keras, tf

import numpy as np

from bench.peers import ptq_tutorial

TUTORIAL = 'tfmot "Quantization aware training in Keras example"'
URL = "https://www.tensorflow.org/model_optimization/guide/quantization/training_example"
FINE_TUNE_IMAGES = 1000
FINE_TUNE_BATCH = 500


def _compile(model: keras.Model) -> None:
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def run(train_images: np.ndarray, train_labels: np.ndarray, *, seed: int = 0) -> dict:
    """Steps 2-5. Images are ``[N, 28, 28]`` in [0, 1].

    Returns:
        ``{"model": the float baseline, "qat_model": the QAT model, "float_tflite": bytes,
        "qat_tflite": bytes}``.
    """
    import tensorflow_model_optimization as tfmot

    keras.utils.set_random_seed(seed)
    model = ptq_tutorial.build()
    _compile(model)
    model.fit(train_images, train_labels, epochs=1, validation_split=0.1, verbose=0)
    q_aware_model = tfmot.quantization.keras.quantize_model(model)
    _compile(q_aware_model)
    q_aware_model.fit(
        train_images[:FINE_TUNE_IMAGES],
        train_labels[:FINE_TUNE_IMAGES],
        batch_size=FINE_TUNE_BATCH,
        epochs=1,
        validation_split=0.1,
        verbose=0,
    )
    converter = tf.lite.TFLiteConverter.from_keras_model(q_aware_model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    quantized = converter.convert()
    float_tflite = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    return {
        "model": model,
        "qat_model": q_aware_model,
        "float_tflite": float_tflite,
        "qat_tflite": quantized,
    }


def predict(content: bytes, images: np.ndarray) -> np.ndarray:
    """Step 6: the predicted digit of every image, one per ``invoke`` (float input)."""
    return ptq_tutorial.predict(content, images)
