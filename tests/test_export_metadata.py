"""The labels and input contract packed into a .tflite: an appended zip that readers open and interpreters ignore."""

import json
import shutil
import subprocess
import zipfile

import numpy as np
import pytest

from tfopt.export import metadata

CONTRACT = {"shape": [96, 96, 3], "dtype": "float32", "class_names": ["cat", "dog", "héron"]}


def test_packed_files_read_back_and_the_flatbuffer_is_unchanged(tmp_path):
    flatbuffer = bytes(range(256)) * 7
    packed = metadata.pack(flatbuffer, metadata.files_of(CONTRACT))
    assert packed[: len(flatbuffer)] == flatbuffer
    path = tmp_path / "m.tflite"
    path.write_bytes(packed)
    assert metadata.labels(str(path)) == ["cat", "dog", "héron"]
    assert json.loads(metadata.read(packed)["input.json"]) == CONTRACT
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None and sorted(archive.namelist()) == [
            "input.json",
            "labels.txt",
        ]
    assert (
        metadata.pack(flatbuffer, metadata.files_of(CONTRACT)) == packed
    )  # same content, same bytes
    if shutil.which("unzip"):
        listing = subprocess.run(["unzip", "-l", str(path)], capture_output=True, text=True)
        assert listing.returncode == 0 and "warning" not in listing.stderr.lower(), listing.stderr


def test_no_class_names_packs_only_the_contract_and_a_bare_model_has_nothing():
    packed = metadata.pack(b"\0" * 64, metadata.files_of({"shape": [28, 28, 1]}))
    assert list(metadata.read(packed)) == ["input.json"] and metadata.labels(packed) == []
    assert metadata.read(b"\0" * 64) == {} and metadata.labels(b"\0" * 64) == []


@pytest.mark.slow
def test_an_interpreter_runs_the_packed_file_as_the_bare_one(tmp_path):
    from tfopt._keras import keras, tf

    from tfopt.export.evaluate import TFLiteModel

    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(3)])
    bare = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    path = tmp_path / "m.tflite"
    path.write_bytes(metadata.pack(bare, metadata.files_of(CONTRACT)))
    x = np.random.default_rng(0).random((5, 4), dtype=np.float32)
    np.testing.assert_array_equal(TFLiteModel(str(path)).predict(x), TFLiteModel(bare).predict(x))
