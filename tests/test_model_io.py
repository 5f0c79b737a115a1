import json
import os
import zipfile

from tfopt.core._keras import ensure_tf_keras, keras, tf

import numpy as np
import pytest

from tfopt.core.errors import ModelError
from tfopt.models.io import load_model, save_model
from tfopt.models.registry import build_model, model_names


def _small():
    return build_model("tiny_cnn", (8, 8, 1), 10)


def test_registry_builds_every_model_with_float32_logits():
    for name in model_names():
        m = build_model(name, (28, 28, 1), 10)
        assert m.output_shape == (None, 10)
        assert m.layers[-1].dtype == "float32"
    with pytest.raises(
        Exception,
        match="unknown model 'resnet9000'; choose one of cnn, cnn_gn, dp_cnn, fedavg_cnn, mlp, mobilenet_tiny, small_cnn, tiny_cnn, wide_cnn",
    ):
        build_model("resnet9000", (28, 28, 1), 10)


def test_save_then_load_roundtrip(tmp_path):
    m = _small()
    paths = save_model(m, str(tmp_path))
    x = np.random.RandomState(0).rand(2, 8, 8, 1).astype("float32")
    for p in (paths["keras"], str(tmp_path)):
        np.testing.assert_allclose(load_model(p)(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    served = tf.saved_model.load(paths["saved_model"])
    np.testing.assert_allclose(served.serve(x).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6)
    signature = served.signatures["serving_default"]
    np.testing.assert_allclose(
        next(iter(signature(tf.constant(x)).values())).numpy(), m(x).numpy(), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(
        ModelError, match="inference SavedModel without Keras metadata.*model.keras"
    ):
        load_model(paths["saved_model"])
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def _lambda_model():
    inp = keras.Input((4,))
    out = keras.layers.Lambda(lambda t: t * 2.0, name="double")(inp)
    return keras.Model(inp, out)


def test_h5_with_lambda_refused_unless_trusted(tmp_path):
    path = str(tmp_path / "m.h5")
    _lambda_model().save(path)
    with pytest.raises(
        ModelError, match="Lambda layer .double. holding stored Python code.*--trust-model"
    ):
        load_model(path)
    m = load_model(path, trust_model=True)
    assert float(m(np.ones((1, 4), "float32"))[0, 0]) == 2.0


def test_keras_config_naming_foreign_module_refused(tmp_path):
    good = str(tmp_path / "good.keras")
    _small().save(good)
    evil = str(tmp_path / "evil.keras")
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(evil, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "config.json":
                cfg = json.loads(data)
                cfg["config"]["layers"][1]["module"] = "os"
                data = json.dumps(cfg).encode()
            zout.writestr(item, data)
    with pytest.raises(ModelError, match="names the module 'os'"):
        load_model(evil)


def test_missing_and_non_model_paths(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(str(tmp_path / "nope.keras"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ModelError, match="not a model file"):
        load_model(str(tmp_path / "x.txt"))


def test_keras3_object_gets_one_sentence():
    import keras as keras3  # Keras 3, as `tf.keras` is in TF >= 2.16

    k3 = keras3.Sequential([keras3.layers.Dense(1)])
    with pytest.raises(ModelError, match="is a Keras 3 object.*import tf_keras as keras"):
        ensure_tf_keras(k3)
    assert ensure_tf_keras(_small()) is not None
