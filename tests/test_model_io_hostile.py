"""Hostile model files: every way a stored config can carry code is refused before anything loads.

Each file holds a function that writes a marker file when it runs; a refused load leaves no
marker. The family: a Lambda layer at the top and inside a nested model, in ``.keras``, ``.h5``
and SavedModel, plain and with ``\\u`` escapes in the stored JSON; a lambda activation; a config
naming a foreign module; metadata that cannot be parsed.
"""

import os
import zipfile

from tfopt.core._keras import keras

import h5py
import numpy as np
import pytest

from tfopt.core.errors import ModelError
from tfopt.models.io import load_model

ESCAPED = '"class_name": "\\u004cambda"'  # JSON for "Lambda", invisible to a byte search


def _model(marker: str, nested: bool) -> "keras.Model":
    def touch(
        t, path=marker
    ):  # runs whenever the layer is called, e.g. while a load rebuilds the model
        open(path, "a").close()
        return t * 2.0

    inp = keras.Input((4,))
    x = keras.layers.Lambda(touch, name="payload")(inp)
    if nested:
        inner = keras.Model(inp, x, name="inner")
        outer_in = keras.Input((4,))
        return keras.Model(
            outer_in, keras.layers.Dense(2, name="head")(inner(outer_in)), name="outer"
        )
    return keras.Model(inp, keras.layers.Dense(2, name="head")(x))


def _escape(text: str) -> str:
    assert '"class_name": "Lambda"' in text
    return text.replace('"class_name": "Lambda"', ESCAPED)


def _save(model, tmp_path, fmt: str, escaped: bool) -> str:
    if fmt == "keras":
        path = str(tmp_path / "m.keras")
        model.save(path)
        if escaped:
            with zipfile.ZipFile(path) as z:
                members = {n: z.read(n) for n in z.namelist()}
            members["config.json"] = _escape(members["config.json"].decode()).encode()
            with zipfile.ZipFile(path, "w") as z:
                for name, data in members.items():
                    z.writestr(name, data)
    elif fmt == "h5":
        path = str(tmp_path / "m.h5")
        model.save(path)
        if escaped:
            with h5py.File(path, "r+") as f:
                raw = f.attrs["model_config"]
                f.attrs["model_config"] = _escape(raw if isinstance(raw, str) else raw.decode())
    else:
        path = str(tmp_path / "saved")
        model.save(path, save_format="tf")
        if escaped:
            from tf_keras.protobuf import saved_metadata_pb2

            proto = saved_metadata_pb2.SavedMetadata()
            meta = os.path.join(path, "keras_metadata.pb")
            proto.ParseFromString(open(meta, "rb").read())
            for node in proto.nodes:
                node.metadata = node.metadata.replace('"class_name": "Lambda"', ESCAPED)
            open(meta, "wb").write(proto.SerializeToString())
            assert b'"class_name": "Lambda"' not in open(meta, "rb").read()
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["keras", "h5", "savedmodel"])
@pytest.mark.parametrize("nested", [False, True], ids=["top", "nested"])
@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "escaped"])
def test_a_stored_lambda_is_refused_and_never_runs(tmp_path, fmt, nested, escaped):
    marker = str(tmp_path / "ran")
    path = _save(_model(marker, nested), tmp_path, fmt, escaped)
    if os.path.exists(marker):
        os.remove(marker)  # saving traced the layer; only a load may create it from here on
    with pytest.raises(ModelError, match="stored Python code.*--trust-model") as err:
        load_model(path)
    assert "\n" not in str(err.value) and not os.path.exists(marker)
    if (
        not escaped and fmt == "h5"
    ):  # what the refusal protects against: trusted, the stored code runs on load
        model = load_model(path, trust_model=True)
        assert os.path.exists(marker) and model(np.ones((1, 4), "float32")).shape == (1, 2)


def test_a_lambda_activation_is_refused(tmp_path):
    inp = keras.Input((4,))
    path = str(tmp_path / "act.keras")
    keras.Model(inp, keras.layers.Dense(2, activation=lambda x: x * 3)(inp)).save(path)
    with pytest.raises(ModelError, match="serialized Python function.*--trust-model"):
        load_model(path)


def test_unparsable_or_non_object_metadata_is_refused(tmp_path):
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(2)(inp))
    saved = str(tmp_path / "saved")
    model.save(saved, save_format="tf")
    with open(os.path.join(saved, "keras_metadata.pb"), "wb") as f:
        f.write(b"\xff\xfe not a protobuf")
    with pytest.raises(ModelError, match="cannot be read .*cannot be checked"):
        load_model(saved)
    path = str(tmp_path / "list.keras")
    model.save(path)
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["config.json"] = b"[1, 2]"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(ModelError, match="model config is a list, not an object"):
        load_model(path)


def test_a_clean_model_loads_in_every_format(tmp_path):
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(2, activation="relu")(inp))
    x = np.ones((1, 4), "float32")
    for path, kwargs in (
        (str(tmp_path / "m.keras"), {}),
        (str(tmp_path / "m.h5"), {}),
        (str(tmp_path / "saved"), {"save_format": "tf"}),
    ):
        model.save(path, **kwargs)
        np.testing.assert_allclose(load_model(path)(x), model(x), atol=1e-6)


@pytest.mark.parametrize("trust", [False, True])
def test_a_corrupt_h5_is_one_line_trusted_or_not(tmp_path, trust):
    path = tmp_path / "m.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 200)
    with pytest.raises(ModelError) as err:
        load_model(str(path), trust_model=trust)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
