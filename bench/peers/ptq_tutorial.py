"""Peer of benchmark B5: the recipe of TensorFlow's tutorial "Post-training integer quantization".

Tutorial: "Post-training integer quantization",
https://www.tensorflow.org/lite/performance/post_training_integer_quant
(tensorflow/tensorflow, ``tensorflow/lite/g3doc/performance/post_training_integer_quant.ipynb``).

What a user following it does, step by step as the tutorial says:

1. Scales the MNIST images to [0, 1] (float32, ``/ 255``; here: the benchmark's own MNIST split,
   which holds the same values).
2. Builds its model: ``InputLayer((28, 28))`` -> ``Reshape((28, 28, 1))`` -> ``Conv2D(12, 3x3,
   relu)`` -> ``MaxPooling2D(2x2)`` -> ``Flatten`` -> ``Dense(10)`` (logits).
3. Compiles with ``optimizer='adam'``, sparse categorical cross-entropy from logits, accuracy,
   and trains 5 epochs (Keras' default batch of 32). The tutorial passes the test images as
   ``validation_data``, which only prints a score; here the validation split takes that place, so
   that the test split is read once, for the published figure.
4. Converts the float model: ``TFLiteConverter.from_keras_model(model).convert()``.
5. Converts the integer-only model: ``optimizations = [Optimize.DEFAULT]``, a representative
   dataset of the first 100 training images one at a time (``batch(1).take(100)``),
   ``supported_ops = [TFLITE_BUILTINS_INT8]``, ``inference_input_type`` and
   ``inference_output_type`` ``tf.uint8``.
6. Evaluates as its ``run_tflite_model`` does: one image per ``invoke``; for the uint8 model each
   image becomes ``image / input_scale + input_zero_point`` cast to uint8 (numpy's cast truncates),
   and the prediction is the argmax of the output.
"""

from __future__ import annotations

from tfopt.core._keras import keras, tf

import numpy as np

TUTORIAL = 'TF "Post-training integer quantization" tutorial'
URL = "https://www.tensorflow.org/lite/performance/post_training_integer_quant"
EPOCHS = 5
REPRESENTATIVE_IMAGES = 100


def build() -> keras.Model:
    """The tutorial's model (step 2)."""
    return keras.Sequential(
        [
            keras.layers.InputLayer(input_shape=(28, 28)),
            keras.layers.Reshape(target_shape=(28, 28, 1)),
            keras.layers.Conv2D(filters=12, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )


def train(
    train_images: np.ndarray,
    train_labels: np.ndarray,
    val_images: np.ndarray,
    val_labels: np.ndarray,
    *,
    epochs: int = EPOCHS,
    seed: int = 0,
) -> keras.Model:
    """Steps 2-3: the tutorial's model trained as it says. Images are ``[N, 28, 28]`` in [0, 1]."""
    keras.utils.set_random_seed(seed)
    model = build()
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        train_images,
        train_labels,
        epochs=epochs,
        validation_data=(val_images, val_labels),
        verbose=0,
    )
    return model


def convert_float(model: keras.Model) -> bytes:
    """Step 4: the float .tflite."""
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def convert_int8(model: keras.Model, train_images: np.ndarray) -> bytes:
    """Step 5: the integer-only .tflite with uint8 input and output."""

    def representative_data_gen():
        for input_value in (
            tf.data.Dataset.from_tensor_slices(train_images).batch(1).take(REPRESENTATIVE_IMAGES)
        ):
            yield [input_value]

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative_data_gen
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.uint8
    converter.inference_output_type = tf.uint8
    return converter.convert()


def predict(content: bytes, images: np.ndarray) -> np.ndarray:
    """Step 6: the predicted digit of every image, fed one at a time as the tutorial does."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=content)
    interpreter.allocate_tensors()
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    predictions = np.zeros((len(images),), dtype=int)
    for i, image in enumerate(images):
        if inp["dtype"] == np.uint8:
            scale, zero_point = inp["quantization"]
            image = image / scale + zero_point
        interpreter.set_tensor(inp["index"], np.expand_dims(image, axis=0).astype(inp["dtype"]))
        interpreter.invoke()
        predictions[i] = interpreter.get_tensor(out["index"])[0].argmax()
    return predictions
