"""Model registry: small, real architectures built by name with tf_keras.

Every model ends in a float32 softmax-free logits layer (``dtype="float32"``) so it stays
numerically safe under the mixed_float16 / mixed_bfloat16 policies.
"""

from __future__ import annotations

from collections.abc import Callable

from tfopt.core._keras import keras

from tfopt.core.errors import ConfigError

Builder = Callable[..., "keras.Model"]
_REGISTRY: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a model builder ``fn(input_shape, num_classes, dropout)`` to the registry."""

    def wrap(fn: Builder) -> Builder:
        _REGISTRY[name] = fn
        return fn

    return wrap


def model_names() -> list[str]:
    """Returns the registered model names, sorted."""
    return sorted(_REGISTRY)


def _logits(x, num_classes: int):
    return keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)


@register("cnn")
def cnn(input_shape, num_classes: int, dropout: float = 0.25) -> keras.Model:
    """The default CNN: two 3x3 conv blocks with batch norm (momentum 0.9, so short runs get usable statistics), then a dense head (~0.2M params)."""
    return _cnn(input_shape, num_classes, dropout, "cnn")


@register("cnn_gn")
def cnn_gn(input_shape, num_classes: int, dropout: float = 0.25) -> keras.Model:
    """The default CNN with GroupNormalization (8 groups) in place of batch norm: each example is
    normalized by its own statistics, so DP-SGD can clip its gradient alone."""
    return _cnn(input_shape, num_classes, dropout, "cnn_gn")


def _cnn(input_shape, num_classes: int, dropout: float, name: str) -> keras.Model:
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    for i, filters in enumerate((32, 64)):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        if name == "cnn":
            x = keras.layers.BatchNormalization(momentum=0.9, name=f"bn{i}")(x)
        else:
            x = keras.layers.GroupNormalization(8, name=f"gn{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
        x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dropout(dropout, name="dropout")(x)
    x = keras.layers.Dense(64, activation="relu", name="fc")(x)
    return keras.Model(inputs, _logits(x, num_classes), name=name)


@register("tiny_cnn")
def tiny_cnn(input_shape, num_classes: int, dropout: float = 0.0) -> keras.Model:
    """A ~20k-parameter CNN: one 12-filter conv, pooling and a linear head."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(12, 3, activation="relu", name="conv0")(inputs)
    x = keras.layers.MaxPooling2D(name="pool0")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="tiny_cnn")


@register("small_cnn")
def small_cnn(input_shape, num_classes: int, dropout: float = 0.0) -> keras.Model:
    """An edge student (~15k params, ~0.6M multiply-adds): two 3x3 conv blocks (12, 24 filters), a linear head.

    The student of the ``mnist_edge`` pipeline: in int8 about 50x smaller than ``cnn`` in float.
    """
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    for i, filters in enumerate((12, 24)):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i}")(x)
        x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="small_cnn")


@register("wide_cnn")
def wide_cnn(input_shape, num_classes: int, dropout: float = 0.25) -> keras.Model:
    """A conv-heavy CNN (~0.24M params, ~22M multiply-adds per 28x28 image, almost all in convolutions).

    Three 3x3 conv blocks of 64, 128 and 128 filters with batch norm (momentum 0.9, like ``cnn``),
    the first two pooled, then global average pooling: the kind of model where bf16 matrix
    hardware (AMX) pays, where the default ``cnn`` (~4M multiply-adds) is dominated by per-step
    overheads. Benchmark B2 trains both.
    """
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    for i, filters in enumerate((64, 128, 128)):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"bn{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
        if i < 2:
            x = keras.layers.MaxPooling2D(name=f"pool{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="wide_cnn")


@register("mlp")
def mlp(input_shape, num_classes: int, dropout: float = 0.25) -> keras.Model:
    """A two-hidden-layer perceptron on flattened pixels."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Flatten(name="flatten")(inputs)
    for i, units in enumerate((256, 128)):
        x = keras.layers.Dense(units, activation="relu", name=f"fc{i}")(x)
        if dropout:
            x = keras.layers.Dropout(dropout, name=f"dropout{i}")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="mlp")


@register("wide_mlp")
def wide_mlp(input_shape, num_classes: int, dropout: float = 0.25) -> keras.Model:
    """A perceptron with one 2048-wide hidden layer (~1.6M params): its first kernel holds 98% of
    the weights (6.4 MB for 28x28 images), the variable ``--shard-variables`` splits over ps tasks."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Flatten(name="flatten")(inputs)
    x = keras.layers.Dense(2048, activation="relu", name="wide")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="wide_mlp")


@register("dp_cnn")
def dp_cnn(input_shape, num_classes: int, dropout: float = 0.0) -> keras.Model:
    """The small CNN of TensorFlow Privacy's MNIST DP-SGD tutorial (~26k params, tanh, no batch
    normalization, which DP-SGD cannot clip per example): the model its epsilon/accuracy table
    was measured with (docs/privacy.md)."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="tanh", name="conv0")(
        inputs
    )
    x = keras.layers.MaxPool2D(2, 1, name="pool0")(x)
    x = keras.layers.Conv2D(32, 4, strides=2, activation="tanh", name="conv1")(x)
    x = keras.layers.MaxPool2D(2, 1, name="pool1")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(32, activation="tanh", name="fc")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="dp_cnn")


@register("fedavg_cnn")
def fedavg_cnn(input_shape, num_classes: int, dropout: float = 0.0) -> keras.Model:
    """The MNIST CNN of McMahan et al. 2017, the paper that introduced FedAvg (~1.66M params): two
    5x5 convolutions (32 and 64 channels, ReLU), each followed by 2x2 max pooling, a 512-unit ReLU
    layer and the logits; its rounds-to-99% table is benchmark B13's anchor (docs/federated.md)."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    for i, filters in enumerate((32, 64)):
        x = keras.layers.Conv2D(filters, 5, padding="same", activation="relu", name=f"conv{i}")(x)
        x = keras.layers.MaxPool2D(2, name=f"pool{i}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(512, activation="relu", name="fc")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="fedavg_cnn")


def check_model_name(name: str) -> None:
    """Raises ConfigError naming the valid choices when ``name`` is not a registered model."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")


def build_model(name: str, input_shape, num_classes: int, dropout: float = 0.25) -> keras.Model:
    """Builds a registered model; call it inside ``strategy.scope()``.

    Args:
        name: A registered model name (see ``model_names()``).
        input_shape: ``(H, W, C)`` of one example.
        num_classes: Number of output logits.
        dropout: Dropout rate for models that use it.

    Returns:
        An uncompiled tf_keras functional model that outputs float32 logits.

    Raises:
        ConfigError: ``name`` is not registered.
    """
    check_model_name(name)
    return _REGISTRY[name](tuple(input_shape), num_classes, dropout)


@register("mobilenet_tiny")
def mobilenet_tiny(input_shape, num_classes: int, dropout: float = 0.0) -> keras.Model:
    """A MobileNet-style block net (~10k params): a strided 3x3 stem, then depthwise-separable blocks.

    Each block is a 3x3 depthwise conv and a 1x1 pointwise conv, each followed by batch norm
    (momentum 0.9, like ``cnn``) and ReLU6, as in MobileNet v1; global average pooling feeds the
    logits. Layer names (``stem_relu``, ``block{i}_pw_relu``) are stable for feature distillation.
    """
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", use_bias=False, name="stem")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, name="stem_bn")(x)
    x = keras.layers.ReLU(6.0, name="stem_relu")(x)
    for i, (filters, stride) in enumerate(((32, 1), (64, 2), (64, 1))):
        x = keras.layers.DepthwiseConv2D(
            3, strides=stride, padding="same", use_bias=False, name=f"block{i}_dw"
        )(x)
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"block{i}_dw_bn")(x)
        x = keras.layers.ReLU(6.0, name=f"block{i}_dw_relu")(x)
        x = keras.layers.Conv2D(filters, 1, use_bias=False, name=f"block{i}_pw")(x)
        x = keras.layers.BatchNormalization(momentum=0.9, name=f"block{i}_pw_bn")(x)
        x = keras.layers.ReLU(6.0, name=f"block{i}_pw_relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _logits(x, num_classes), name="mobilenet_tiny")
