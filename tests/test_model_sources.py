"""Model sources: every form of --model builds the model a user expects, ending in logits, scaled as
its family expects, and every bad source is one line naming the forms or the fix."""

import os
import subprocess
import sys

from tfopt.core._keras import keras, tf

import numpy as np
import pytest

from tfopt.config import DataConfig, ModelConfig, RunConfig, from_dict
from tfopt.core.errors import ConfigError, ModelError
from tfopt.core.fileio import tree_digest
from tfopt.core.specs import parse_model_args, parse_model_source
from tfopt.data.augment import normalize_batches
from tfopt.models import sources
from tfopt.models.registry import build_model

sys.path.insert(0, os.path.dirname(__file__))  # model_factory, for the factory form


@pytest.mark.parametrize(
    "text, form, target",
    [
        ("cnn", "builtin", "cnn"),
        ("keras.applications:MobileNetV2", "applications", "MobileNetV2"),
        ("models/mine.keras", "file", os.path.abspath("models/mine.keras")),
        ("mine.h5", "file", os.path.abspath("mine.h5")),
        ("model_factory:small_net", "factory", "model_factory:small_net"),
    ],
)
def test_every_form_is_recognized(text, form, target):
    source = parse_model_source(text)
    assert (source.form, source.target) == (form, target)


def test_a_string_of_no_form_lists_every_form():
    with pytest.raises(
        ConfigError,
        match=r"model.name='two words' is not a model source; give a built-in model "
        r"name .*; a model file: .*; keras.applications:NAME.*; a Python factory",
    ):
        parse_model_source("two words")
    with pytest.raises(ConfigError, match="unknown model 'resnet9000'; choose one of cnn"):
        sources.check(ModelConfig(name="resnet9000"))
    with pytest.raises(ModelError, match="model file '/nope/m.keras' does not exist"):
        sources.check(ModelConfig(name="/nope/m.keras"))


def test_model_args_are_literals_or_strings():
    assert parse_model_args(
        "alpha=0.35, weights=None,input_shape=(96, 96, 3),weights2=imagenet,x=/a/b.h5"
    ) == {
        "alpha": 0.35,
        "weights": None,
        "input_shape": (96, 96, 3),
        "weights2": "imagenet",
        "x": "/a/b.h5",
    }
    for bad, match in (
        ("alpha", "is not KEY=VALUE"),
        ("1x=2", "is not KEY=VALUE"),
        ("a=1,a=2", "given twice"),
    ):
        with pytest.raises(ConfigError, match=match):
            parse_model_args(bad)
    with pytest.raises(ConfigError, match="the model 'cnn' takes no arguments"):
        from_dict({"model": {"name": "cnn", "args": "alpha=1"}})


@pytest.mark.parametrize("name", ["MobileNetV2", "DenseNet121", "ResNet50", "EfficientNetB0"])
def test_preprocessing_is_the_family_preprocess_input(name):
    """tf, torch, caffe (BGR) and in-model scaling: data.normalize on [0, 1] pixels gives what the
    family's own preprocess_input gives on 0-255 pixels."""
    normalize = sources.preprocessing(name)
    pixels = np.random.default_rng(0).integers(0, 256, (2, 5, 4, 3)).astype(np.float32)
    module = sys.modules[sources.application(name).__module__]
    expected = module.preprocess_input(pixels.copy())
    ds = tf.data.Dataset.from_tensors((pixels / 255.0, np.zeros(2, np.int64)))
    ours = next(iter(ds.apply(normalize_batches(DataConfig(normalize=normalize)))))[0].numpy()
    np.testing.assert_allclose(ours, expected, atol=2e-4 * max(1.0, np.abs(expected).max()))
    cfg = sources.resolve_config(RunConfig(model=ModelConfig(name=f"keras.applications:{name}")))
    # A family that scales inside the model is left to its graph (tfopt.models.inputs).
    assert cfg.data.normalize == ("" if name == "EfficientNetB0" else normalize)
    mine = RunConfig(
        model=ModelConfig(name=f"keras.applications:{name}"), data=DataConfig(normalize="imagenet")
    )
    assert sources.resolve_config(mine).data.normalize == "imagenet"  # the user's own choice wins


def _softmax_models():
    inputs = keras.Input((6, 6, 1))
    x = keras.layers.Flatten()(inputs)
    dense = keras.Model(inputs, keras.layers.Dense(4, activation="softmax", name="probs")(x))
    layer = keras.Model(
        inputs, keras.layers.Softmax(name="sm")(keras.layers.Dense(4, name="fc")(x))
    )
    act = keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
            keras.layers.Activation("softmax"),
        ]
    )
    return [dense, layer, act]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_final_softmax_is_removed_and_the_probabilities_are_unchanged(index):
    model = _softmax_models()[index]
    logits, what = sources.to_logits(model)
    assert what.startswith("logits (softmax")
    x = np.random.default_rng(1).random((3, 6, 6, 1)).astype(np.float32)
    np.testing.assert_allclose(tf.nn.softmax(logits(x)).numpy(), model(x).numpy(), atol=1e-6)
    assert not np.allclose(logits(x).numpy(), model(x).numpy(), atol=1e-3)
    assert sources.to_logits(logits) == (logits, "logits")


def test_heads_are_replaced_added_or_kept_as_asked():
    model, _ = sources.to_logits(_softmax_models()[0])
    same, what = sources.fit_head(model, 4, "auto", "m")
    assert same is model and what == "kept"
    replaced, what = sources.fit_head(model, 7, "auto", "m")
    assert what == "replaced 'probs'" and replaced.output_shape == (None, 7)
    # the body is shared: the same features reach the new layer
    np.testing.assert_array_equal(
        replaced.layers[-2].get_weights()[0] if replaced.layers[-2].weights else 0,
        model.layers[-2].get_weights()[0] if model.layers[-2].weights else 0,
    )
    with pytest.raises(
        ModelError,
        match=r"has 4 outputs but the data has 7 classes; give the data it was trained on, or .* --head new",
    ):
        sources.fit_head(model, 7, "keep", "m")
    inputs = keras.Input((6, 6, 2))
    features = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(inputs))
    added, what = sources.fit_head(features, 3, "new", "f")
    assert what == "added" and added.output_shape == (None, 3)


@pytest.mark.slow
def test_an_input_that_does_not_fit_names_both_shapes_and_the_fix():
    model = build_model("tiny_cnn", (16, 16, 3), 10)
    with pytest.raises(
        ModelError,
        match=r"takes 16x16x3 images but the data gives 8x8x1; resize them with "
        r"--image-size 16x16 and --channels 3",
    ):
        sources.check_input(model, (8, 8, 1), "mine.keras")
    sources.check_input(
        keras.applications.MobileNetV2(
            input_shape=(None, None, 3), weights=None, include_top=False
        ),
        (40, 50, 3),
        "m",
    )


@pytest.mark.slow
def test_applications_are_built_with_a_logits_head_and_take_local_weights(tmp_path):
    cfg = ModelConfig(name="keras.applications:MobileNetV2", args="alpha=0.35")
    built = sources.build(cfg, (32, 32, 3), 5)
    assert built.model.output_shape == (None, 5) and built.model.layers[-1].name == "logits"
    assert built.description["head"] == "new" and built.description["args"] == {"alpha": 0.35}
    assert built.model.layers[-1].activation is keras.activations.linear
    top = sources.build(
        ModelConfig(name="keras.applications:MobileNetV2", args="alpha=0.35,include_top=True"),
        (32, 32, 3),
        5,
    )
    assert top.model.output_shape == (None, 5) and top.description["outputs"] == "logits"
    # weights=PATH: a local weights file (what a user downloaded once) is loaded, not downloaded
    path = str(tmp_path / "backbone.h5")
    keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, include_top=False, weights=None, pooling="avg"
    ).save_weights(path)
    reference = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, include_top=False, weights=path, pooling="avg"
    )
    loaded = sources.build(
        ModelConfig(name=cfg.name, args=f"alpha=0.35,weights={path}"), (32, 32, 3), 5
    )
    for a, b in zip(reference.get_weights(), loaded.model.get_weights()):
        np.testing.assert_array_equal(a, b)

    # Batch-norm statistics: Keras's 0.999 for pretrained weights, 0.9 from random ones (short runs)
    def momenta(m):
        return {l.momentum for l in m.layers if isinstance(l, keras.layers.BatchNormalization)}

    assert momenta(loaded.model) == {0.999} and loaded.description["notes"] == []
    assert momenta(built.model) == {0.9} and "0.999 -> 0.9" in built.description["notes"][0]


def test_bad_applications_are_one_line():
    with pytest.raises(
        ModelError, match="keras.applications:MobilenetV2 does not exist; did you mean MobileNetV2"
    ):
        sources.build(ModelConfig(name="keras.applications:MobilenetV2"), (32, 32, 3), 5)
    with pytest.raises(
        ConfigError,
        match=r"keras.applications:MobileNetV2 takes no argument 'depth'; "
        r"--model-arg takes: input_shape, alpha, include_top",
    ):
        sources.build(
            ModelConfig(name="keras.applications:MobileNetV2", args="depth=3"), (32, 32, 3), 5
        )
    with pytest.raises(
        ModelError, match="keras.applications:MobileNetV2 refuses its arguments: Input size must be"
    ):
        sources.build(ModelConfig(name="keras.applications:MobileNetV2"), (8, 8, 3), 5)


def test_a_factory_is_called_with_the_data_shape_and_its_arguments():
    built = sources.build(
        ModelConfig(name="model_factory:small_net", args="width=5"), (12, 12, 1), 3
    )
    assert (
        built.model.get_layer(
            "conv2d"
            if "conv2d" in [l.name for l in built.model.layers]
            else built.model.layers[1].name
        ).filters
        == 5
    )
    assert built.description["outputs"] == "logits (softmax activation of 'probs' removed)"
    returned = r"returned list \('\[\(12, 12, 1\), 3\]'\), not a tf_keras Model"
    with pytest.raises(ModelError, match=returned):
        sources.build(ModelConfig(name="model_factory:not_a_model"), (12, 12, 1), 3)
    with pytest.raises(ModelError, match="model factory 'no_such_module:f' cannot be imported"):
        sources.build(ModelConfig(name="no_such_module:f"), (12, 12, 1), 3)


def test_model_files_load_safely_and_train_under_the_configured_policy(tmp_path):
    model = _softmax_models()[0]
    for name in ("m.keras", "m.h5"):
        path = str(tmp_path / name)
        model.save(path)
        built = sources.build(ModelConfig(name=path), (6, 6, 1), 4)
        assert (
            built.description["sha256"] == tree_digest(path) and built.description["head"] == "kept"
        )
        x = np.random.default_rng(2).random((2, 6, 6, 1)).astype(np.float32)
        np.testing.assert_allclose(
            tf.nn.softmax(built.model(x)).numpy(), model(x).numpy(), atol=1e-6
        )
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        bf16 = sources.build(ModelConfig(name=str(tmp_path / "m.keras")), (6, 6, 1), 4).model
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert bf16.layers[-1].dtype_policy.name == "float32"  # the logits stay float32
    assert [l.dtype_policy.name for l in bf16.layers[1:-1]] == ["mixed_bfloat16"]
    lam = keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Lambda(lambda t: t * 2),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )
    lam.save(str(tmp_path / "lambda.h5"))
    with pytest.raises(ModelError, match="has a Lambda layer .* pass --trust-model"):
        sources.build(ModelConfig(name=str(tmp_path / "lambda.h5")), (6, 6, 1), 4)
    assert sources.build(
        ModelConfig(name=str(tmp_path / "lambda.h5"), trust=True), (6, 6, 1), 4
    ).model


@pytest.mark.slow
def test_a_keras3_file_is_refused_in_one_line(tmp_path):
    path = str(tmp_path / "k3.keras")
    code = (
        "import keras\nm = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Flatten(), keras.layers.Dense(4)])\n"
        f"m.save({path!r})\n"
    )
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "0"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True)
    with pytest.raises(
        ModelError,
        match=r"saved by Keras 3 \(3\.[0-9.]+\); .*which tfmot needs: build the model with `import tf_keras as keras`",
    ):
        sources.build(ModelConfig(name=path), (6, 6, 1), 4)
