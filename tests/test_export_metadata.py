"""TFLite Metadata in an exported file (MediaPipe reads it in tests/test_mediapipe.py)."""

import io
import json
import zipfile

import numpy as np
import pytest

from tfopt.core.errors import DataError
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
    from tfopt.core._keras import keras, tf

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


def test_written_metadata_is_a_tflite_metadata_buffer_and_the_model_computes_the_same(bare):
    from tfopt.core._compat import read_tflite_model
    from tfopt.export.evaluate import TFLiteModel

    files = metadata.files_of(CONTRACT)
    content = metadata.write(
        bare, CONTRACT, outputs="probabilities", name="m (int8)", version="abc", files=files
    )
    model = read_tflite_model(content)
    (entry,) = [m for m in model.metadata if m.name in (b"TFLITE_METADATA", "TFLITE_METADATA")]
    buf = bytes(bytearray(model.buffers[entry.buffer].data))
    assert buf[4:8] == b"M001"  # the metadata schema's file identifier
    for text in (b"m (int8)", b"abc", b"tfopt", b"image", b"probabilities", b"labels.txt"):
        assert text in buf, text
    # the normalization floats: 255 * mean, 255 * std, as little-endian float32
    for value in [255 * m for m in CONTRACT["mean"]] + [255 * s for s in CONTRACT["std"]]:
        assert np.float32(value).tobytes() in buf, value
    # tfopt's reader needs no MediaPipe: the associated files are a zip any reader opens.
    assert metadata.labels(content) == CONTRACT["class_names"]
    assert metadata.contract_of(content) == json.loads(files["input.json"])
    with zipfile.ZipFile(io.BytesIO(content)) as z:
        assert z.testzip() is None
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    x = np.random.default_rng(0).random((5, 8, 8, 3), dtype=np.float32)
    np.testing.assert_array_equal(TFLiteModel(content).predict(x), TFLiteModel(bare).predict(x))
    again = metadata.write(
        bare, CONTRACT, outputs="probabilities", name="m (int8)", version="abc", files=files
    )
    assert again == content  # same inputs, same bytes


def test_a_file_without_packed_files_reads_as_empty_and_a_bomb_is_refused(tmp_path):
    from tfopt.core.errors import ModelError

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


def test_tampered_packed_files_are_one_line(tmp_path):
    from tfopt.core.errors import ModelError

    good = io.BytesIO()
    with zipfile.ZipFile(good, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("input.json", json.dumps({"image_shape": [8, 8, 3]}) * 50)
    raw = bytearray(good.getvalue())
    start = raw.index(b"input.json") + len(b"input.json")  # the local header's name, then data
    raw[start + 5 : start + 25] = b"\xff" * 20  # a corrupt deflate stream
    with pytest.raises(ModelError, match="cannot be read"):
        metadata.read(bytes(raw))
    with zipfile.ZipFile(tmp_path / "bz.tflite", "w", zipfile.ZIP_BZIP2) as z:
        z.writestr("input.json", "{}")
    assert metadata.contract_of(str(tmp_path / "bz.tflite")) == {}  # bzip2 is read, not refused
    with zipfile.ZipFile(tmp_path / "text.tflite", "w") as z:
        z.writestr("input.json", "not json")
    with pytest.raises(ModelError, match="not a JSON object"):
        metadata.contract_of(str(tmp_path / "text.tflite"))


def test_packed_labels_have_exactly_one_line_per_output_whatever_the_class_names(bare):
    """Any three class names: refused in one line, or packed as exactly the model's 3 labels."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    from tfopt.core._compat import read_tflite_model

    graph = read_tflite_model(bare).subgraphs[0]
    outputs = int(graph.tensors[graph.outputs[0]].shape[-1])
    unicode_lines = st.sampled_from(
        ["\n", "\r", "\x0b", "\x1c", "\x85", "\u2028", "\u2029", "\u200c", " "]
    )
    name = st.one_of(
        st.text(max_size=10), st.builds("".join, st.lists(st.text(max_size=3) | unicode_lines))
    )

    @settings(max_examples=60, deadline=None)
    @given(st.lists(name, min_size=outputs, max_size=outputs))
    @example(["a\u2028b", "c", "d"])
    @example(["a\u2029b", "c", "d"])
    @example(["a\x85b", "c", "d"])
    @example(["a\u200cb", "c", "d"])
    def packed(names):
        try:
            content = metadata.write(
                bare, {**CONTRACT, "class_names": names}, outputs="logits", name="m", version="1"
            )
        except DataError:
            return
        raw = metadata.read(content)[metadata.LABELS].decode()
        # as Python (splitlines) and as C++ (getline on '\n') read it: one label per output
        for lines in (metadata.labels(content), raw.splitlines(), raw.split("\n")[:-1]):
            assert lines == names and len(lines) == outputs

    packed()
