"""A quantization-sensitive run shared by the export tests."""

from tfopt.core._keras import keras

from tfopt.core.fileio import write_json
from tfopt.export.evaluate import load_split
from tfopt.models.io import save_model


def sensitive_run(cfg, tmp_path, epochs: int = 1):
    """A real MNIST MLP made quantization-sensitive with outlier weights on an always-black pixel.

    Pixel (0, 0) is 0 in every MNIST image, so weights of 1000 on it change nothing in float; but
    with per-channel int8 weights every other weight of each unit rounds to 0.

    Returns:
        ``(run directory, the Keras model)``.
    """
    x, y = load_split(cfg.data, "train")
    for split in ("train", "validation", "test"):
        assert load_split(cfg.data, split)[0][:, 0, 0, :].max() == 0.0
    keras.utils.set_random_seed(0)
    inputs = keras.Input((28, 28, 1), name="image")
    h = keras.layers.Dense(64, activation="relu", name="fc0")(
        keras.layers.Flatten(name="flatten")(inputs)
    )
    mlp = keras.Model(inputs, keras.layers.Dense(10, name="logits")(h))
    mlp.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), ["accuracy"])
    mlp.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    kernel, bias = mlp.get_layer("fc0").get_weights()
    kernel[0, :] = 1000.0
    mlp.get_layer("fc0").set_weights([kernel, bias])
    out = tmp_path / "sensitive_run"
    save_model(mlp, str(out))
    write_json(str(out / "run.json"), {"config": cfg.to_dict()})
    return str(out), mlp


def keras_macs(model) -> dict:
    """Multiply-adds per example from the Keras layers' own shapes (independent of the .tflite)."""
    from tfopt.core._keras import keras

    import numpy as np

    from tfopt.export import ops

    by_kind = {ops.CONV: 0, ops.DEPTHWISE: 0}
    for layer in model.layers:
        out = layer.output.shape[1:]
        if isinstance(layer, keras.layers.DepthwiseConv2D):
            kh, kw = layer.kernel_size
            by_kind[ops.DEPTHWISE] += int(np.prod(out)) * kh * kw
        elif isinstance(layer, keras.layers.Conv2D):
            kh, kw = layer.kernel_size
            by_kind[ops.CONV] += int(np.prod(out)) * kh * kw * layer.input.shape[-1]
        elif isinstance(layer, keras.layers.Dense):
            by_kind[ops.CONV] += int(np.prod(out)) * layer.input.shape[-1]
    return by_kind
