"""The model's input side read from its graph (tfopt.models.inputs): what each kind of
preprocessing a user's model carries expects, checked against numpy; the decisions, the
contradictions and the unreadable input sides as one-line errors; the first-batch probe; the
adapter a distillation teacher gets; and the pipeline feeding 0-255 pixels."""

from tfopt.core._keras import keras, tf

import numpy as np
import pytest

from tfopt.config import DataConfig, RunConfig, from_dict
from tfopt.core.errors import ConfigError, ModelError
from tfopt.data.augment import normalize_batches
from tfopt.data.sources import input_contract
from tfopt.models import inputs

L = keras.layers
SHAPE = (16, 16, 3)


def _net(*pre, shape=SHAPE):
    """A keras.io-style classifier: the preprocessing layers ``pre``, then a small CNN (softmax)."""
    i = keras.Input(shape)
    x = i
    for layer in pre:
        x = layer(x)
    x = L.Conv2D(4, 3, activation="relu", name="first_conv")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(i, L.Dense(3, activation="softmax")(x))


def _adapted(low, high, seed=0):
    data = np.random.default_rng(seed).uniform(low, high, (64, *SHAPE)).astype(np.float32)
    norm = L.Normalization()
    norm.adapt(data)
    return norm, data.reshape(-1, 3).mean(0), data.reshape(-1, 3).std(0)


def test_rescaling_as_keras_io_writes_it_expects_0_255_pixels():
    side = inputs.measure(_net(L.Rescaling(1.0 / 255)), SHAPE)
    np.testing.assert_allclose(side.scale, [1 / 255] * 3, rtol=1e-6)
    np.testing.assert_allclose(side.offset, [0.0] * 3, atol=1e-6)
    assert side.expects == "raw" and side.first == "first_conv (Conv2D)"
    assert side.layers == ("rescaling (Rescaling)",) or side.layers[0].endswith("(Rescaling)")


@pytest.mark.parametrize("low,high,expects", [(0, 255, "raw"), (0, 1, "unit")])
def test_an_adapted_normalization_expects_the_range_it_was_adapted_on(low, high, expects):
    norm, mean, std = _adapted(low, high)
    side = inputs.measure(_net(norm), SHAPE)
    # y = (x - mean) / std: the map of whatever x is fed, pixels included
    np.testing.assert_allclose(side.scale, 1 / std, rtol=1e-3)
    np.testing.assert_allclose(side.offset, -mean / std, rtol=1e-3, atol=1e-4)
    assert side.expects == expects


def test_augmentation_resizing_and_crop_are_seen_through():
    aug = keras.Sequential([L.RandomFlip("horizontal"), L.RandomRotation(0.1)], name="augment")
    model = _net(
        aug,
        L.Resizing(12, 12),
        L.CenterCrop(10, 10),
        L.Rescaling(1 / 127.5, offset=-1),
        shape=(None, None, 3),
    )
    side = inputs.measure(model, SHAPE)
    np.testing.assert_allclose(side.scale, [1 / 127.5] * 3, rtol=1e-5)
    np.testing.assert_allclose(side.offset, [-1.0] * 3, atol=1e-5)
    assert side.expects == "raw" and side.size == (10, 10)
    assert [name.split(" ")[1] for name in side.layers] == [
        "(Sequential)",
        "(Resizing)",
        "(CenterCrop)",
        "(Rescaling)",
    ]


def test_a_division_written_as_a_tensor_operation_is_read_too():
    i = keras.Input(SHAPE)
    x = L.Conv2D(2, 3)(i / 255.0)
    side = inputs.measure(keras.Model(i, L.Dense(2)(L.Flatten()(x))), SHAPE)
    assert side.expects == "raw" and "TFOpLambda" in side.layers[0]


def test_a_model_without_preprocessing_expects_nothing_in_particular():
    side = inputs.measure(_net(), SHAPE)
    assert side.readable and not side.scales and side.expects is None
    i = keras.Input(SHAPE)  # an MLP: Flatten before the first Dense
    mlp = keras.Model(i, L.Dense(2)(L.Flatten()(L.Rescaling(1 / 255)(i))))
    assert inputs.measure(mlp, SHAPE).expects == "raw"
    assert inputs.measure(keras.Model(i, L.Dense(2)(L.Flatten()(i))), SHAPE).expects is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,expects",
    [("EfficientNetB0", "raw"), ("MobileNetV3Small", "raw"), ("MobileNetV2", None)],
)
def test_keras_applications_that_scale_inside_are_read_from_their_graph(name, expects):
    base = getattr(keras.applications, name)(
        include_top=False, weights=None, input_shape=(32, 32, 3)
    )
    i = keras.Input((32, 32, 3))  # nested, as a transfer-learning model holds it
    model = keras.Model(i, L.Dense(3)(L.GlobalAveragePooling2D()(base(i))))
    assert inputs.measure(model, (32, 32, 3)).expects == expects
    assert inputs.measure(base, (32, 32, 3)).expects == expects


@pytest.mark.slow
def test_include_preprocessing_false_is_seen():
    base = keras.applications.MobileNetV3Small(
        include_top=False, weights=None, input_shape=(32, 32, 3), include_preprocessing=False
    )
    assert inputs.measure(base, (32, 32, 3)).expects is None


def _resolve(model, **data):
    return inputs.settle(DataConfig(**data), model, SHAPE, "mine.keras")


def test_auto_takes_the_graph_and_records_why():
    data, decided = _resolve(_net(L.Rescaling(1 / 255)))
    assert data.input_scale == "raw" and decided["decided_by"] == "graph"
    assert decided["first_weighted_layer"] == "first_conv (Conv2D)"
    data, decided = _resolve(_net())
    assert data.input_scale == "unit" and decided["decided_by"] == "default"
    # the old spelling of "0-255 pixels" becomes raw
    data, _ = _resolve(_net(L.Rescaling(1 / 255)), normalize="0/0.00392156862745098")
    assert (data.input_scale, data.normalize) == ("raw", "")


def test_a_flag_that_contradicts_the_graph_is_one_line():
    with pytest.raises(ConfigError) as e:
        _resolve(_net(L.Rescaling(1 / 255)), input_scale="unit")
    msg = str(e.value)
    assert "--input-scale unit contradicts model 'mine.keras'" in msg and "\n" not in msg
    assert "rescaling" in msg and "expects 0-255 pixels; give --input-scale raw" in msg
    norm, _, _ = _adapted(0, 1)
    with pytest.raises(ConfigError, match="expects pixels / 255; give --input-scale unit"):
        _resolve(_net(norm), input_scale="raw")
    # no preprocessing in the graph: the user may know better
    assert _resolve(_net(), input_scale="raw")[0].input_scale == "raw"
    with pytest.raises(ConfigError, match="scales its own input .* drop data.normalize"):
        _resolve(_net(L.Rescaling(1 / 255)), normalize="imagenet")


def test_an_input_side_tfopt_cannot_read_is_named_with_the_way_out():
    model = _net(L.Lambda(lambda t: tf.sqrt(t), name="gamma"))
    with pytest.raises(ModelError) as e:
        _resolve(model)
    msg = str(e.value)
    assert "gamma (Lambda)" in msg and "--input-scale unit" in msg and "\n" not in msg
    assert _resolve(model, input_scale="unit")[0].input_scale == "unit"  # the way out works


def test_the_probe_warns_on_pixels_scaled_twice_or_not_at_all():
    pixels = np.random.default_rng(1).integers(0, 256, (4, *SHAPE)).astype(np.float32)
    scaling = _net(L.Rescaling(1 / 255))
    assert inputs.probe(scaling, pixels) is None
    twice = inputs.probe(scaling, pixels / 255)
    assert "first_conv" in twice and "scaled twice" in twice and "--input-scale raw" in twice
    plain = _net()
    assert inputs.probe(plain, pixels / 255) is None
    unscaled = inputs.probe(plain, pixels)
    assert "far outside [-5, 5]" in unscaled and "--input-scale unit" in unscaled


def test_raw_feeds_the_stored_pixels_and_the_contract_says_so(tmp_path):
    pixels = np.random.default_rng(2).integers(0, 256, (2, 4, 4, 3)).astype(np.uint8)
    ds = tf.data.Dataset.from_tensors((pixels.astype(np.float32) / 255.0, np.zeros(2, np.int64)))
    fed = next(iter(ds.apply(normalize_batches(DataConfig(input_scale="raw")))))[0].numpy()
    np.testing.assert_allclose(fed, pixels, atol=1e-4)

    class Info:
        image_shape, stored_shape, class_names = (4, 4, 3), None, ("a", "b")

    contract = input_contract(DataConfig(input_scale="raw"), Info())
    assert contract["input_scale"] == "raw" and contract["scale"].startswith("pixels (0-255")
    assert input_contract(DataConfig(input_scale="unit"), Info())["scale"] == "pixels / 255"


def test_config_refuses_raw_with_a_normalize_and_unknown_scales():
    with pytest.raises(ConfigError, match="data.input_scale=raw gives the model 0-255 pixels"):
        from_dict({"data": {"input_scale": "raw", "normalize": "imagenet"}})
    with pytest.raises(
        ConfigError, match="data.input_scale='pixels' is not valid; choose one of auto, unit, raw"
    ):
        from_dict({"data": {"input_scale": "pixels"}})
    assert RunConfig().data.input_scale == "auto"


def test_a_teacher_trained_on_other_inputs_sees_its_own():
    teacher = _net()  # trained on (pixels / 255 - 0.5) / 0.5
    expects = DataConfig(input_scale="unit", normalize="0.5/0.5")
    fed = DataConfig(input_scale="raw")  # the student scales inside: the data gives pixels
    wrapped = inputs.adapted(teacher, fed, expects, "teacher 'runs/t'")
    pixels = np.random.default_rng(3).integers(0, 256, (3, *SHAPE)).astype(np.float32)
    np.testing.assert_allclose(
        wrapped(pixels).numpy(), teacher((pixels / 255 - 0.5) / 0.5).numpy(), rtol=1e-5
    )
    assert inputs.adapted(teacher, expects, expects, "t") is teacher
    with pytest.raises(ConfigError, match="takes BGR inputs but the data gives RGB"):
        inputs.adapted(teacher, fed, DataConfig(normalize="bgr:0.4/0.004"), "teacher 't'")
