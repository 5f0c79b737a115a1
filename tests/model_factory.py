"""A user's model factory, named on the command line as ``model_factory:small_net``."""

from tfopt.core._keras import keras


def small_net(input_shape, num_classes, width=8):
    """A conv net ending in a softmax, as user code often does."""
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(width, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(
        inputs, keras.layers.Dense(num_classes, activation="softmax", name="probs")(x)
    )


def not_a_model(input_shape, num_classes):
    """Returns something that is not a model."""
    return [input_shape, num_classes]
