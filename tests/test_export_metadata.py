"""TFLite Metadata in an exported file: written with MediaPipe's classes, read back by its displayer."""

import json
import zipfile

import numpy as np
import pytest

from tfopt.errors import DataError
from tfopt.export import metadata

CONTRACT = {
    "image_shape": [8, 8, 3],
    "input_scale": "unit",
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "bgr": False,
    "class_names": ["cat", "dog", "héron"],
}


@pytest.fixture(scope="module")
def bare():
    from tfopt._keras import keras, tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.layers.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    return tf.lite.TFLiteConverter.from_keras_model(model).convert()


def test_normalization_maps_pixels_to_what_the_model_takes():
    pixels = np.array([0.0, 17.0, 255.0])
    for contract in (CONTRACT, {**CONTRACT, "mean": [0.5], "std": [0.25]}):
        mean, std = metadata.normalization(contract)
        m, s = np.resize(contract["mean"], 3), np.resize(contract["std"], 3)
        mean, std = np.resize(mean, 3), np.resize(std, 3)
        for c in range(3):
            want = (pixels / 255 - m[c]) / s[c]
            np.testing.assert_allclose((pixels - mean[c]) / std[c], want, rtol=1e-12)
    assert metadata.normalization({"input_scale": "raw", "mean": [0.0], "std": [1.0]}) == (
        [0.0],
        [1.0],
    )
    assert metadata.normalization({"input_scale": "unit", "mean": [0.0], "std": [1.0]}) == (
        [0.0],
        [255.0],
    )


@pytest.mark.parametrize("name", ["line1\nline2", "tab\there", "", "bell\x07"])
def test_a_class_name_that_is_not_one_label_line_is_refused(name):
    with pytest.raises(DataError, match="class name"):
        metadata.check_labels(["ok", name])


def test_written_metadata_reads_back_with_mediapipe_and_the_model_computes_the_same(bare):
    from tfopt._compat import mediapipe_metadata
    from tfopt.export.evaluate import TFLiteModel

    files = metadata.files_of(CONTRACT)
    content = metadata.write(
        bare, CONTRACT, outputs="probabilities", name="m (int8)", version="abc", files=files
    )
    mp_metadata, _, fb = mediapipe_metadata()
    displayer = mp_metadata.MetadataDisplayer.with_model_buffer(content)
    md = fb.ModelMetadataT.InitFromObj(
        fb.ModelMetadata.GetRootAsModelMetadata(displayer.get_metadata_buffer(), 0)
    )
    assert (md.name, md.version, md.author) == (b"m (int8)", b"abc", b"tfopt")
    assert md.minParserVersion == b"1.0.0"
    image = md.subgraphMetadata[0].inputTensorMetadata[0]
    norm = image.processUnits[0].options
    np.testing.assert_allclose(norm.mean, [255 * m for m in CONTRACT["mean"]], rtol=1e-6)
    np.testing.assert_allclose(norm.std, [255 * s for s in CONTRACT["std"]], rtol=1e-6)
    assert image.content.contentProperties.colorSpace == fb.ColorSpaceType.RGB
    scores = md.subgraphMetadata[0].outputTensorMetadata[0]
    assert scores.name == b"probabilities"
    assert scores.associatedFiles[0].type == fb.AssociatedFileType.TENSOR_AXIS_LABELS
    assert sorted(displayer.get_packed_associated_file_list()) == ["input.json", "labels.txt"]
    assert (
        displayer.get_associated_file_buffer("labels.txt").decode().splitlines()
        == (CONTRACT["class_names"])
    )
    # tfopt's reader needs no MediaPipe: the packed files are a zip any reader opens.
    assert metadata.labels(content) == CONTRACT["class_names"]
    assert metadata.contract_of(content) == json.loads(files["input.json"])
    x = np.random.default_rng(0).random((5, 8, 8, 3), dtype=np.float32)
    np.testing.assert_array_equal(TFLiteModel(content).predict(x), TFLiteModel(bare).predict(x))


def test_one_channel_models_are_described_as_grayscale(bare):
    from tfopt._compat import mediapipe_metadata

    content = metadata.write(
        bare,
        {**CONTRACT, "image_shape": [8, 8, 1]},
        outputs="logits",
        name="m",
        version="1",
    )
    mp_metadata, _, fb = mediapipe_metadata()
    buf = mp_metadata.MetadataDisplayer.with_model_buffer(content).get_metadata_buffer()
    md = fb.ModelMetadataT.InitFromObj(fb.ModelMetadata.GetRootAsModelMetadata(buf, 0))
    image = md.subgraphMetadata[0].inputTensorMetadata[0]
    assert image.content.contentProperties.colorSpace == fb.ColorSpaceType.GRAYSCALE
    assert md.subgraphMetadata[0].outputTensorMetadata[0].name == b"logits"


def test_a_file_without_packed_files_reads_as_empty_and_a_bomb_is_refused(tmp_path):
    from tfopt.errors import ModelError

    assert metadata.read(b"\0" * 64) == {} and metadata.labels(b"\0" * 64) == []
    assert metadata.contract_of(b"\0" * 64) == {}
    path = tmp_path / "bomb.tflite"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("input.json", b"\0" * (metadata.MAX_MEMBER_BYTES + 1))
    assert path.stat().st_size < 100_000
    with pytest.raises(ModelError, match="expands to"):
        metadata.read(str(path))
    with zipfile.ZipFile(tmp_path / "list.tflite", "w") as z:
        z.writestr("input.json", b"[1, 2]")
    with pytest.raises(ModelError, match="not a JSON object"):
        metadata.contract_of(str(tmp_path / "list.tflite"))
