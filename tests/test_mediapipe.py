"""Exported files in the runtime apps use: MediaPipe Tasks' ImageClassifier (the C++ task behind
Android, iOS and the web) loads every mode with no option but the file, names the classes from
the file's metadata, and scores the test split as tfopt's own evaluation of the same file does.
MediaPipe runs in a Python of its own (``mediapipe_env``), with no TensorFlow in it."""

import json
import os
import subprocess
import sys

from tfopt.core._keras import tf

import numpy as np
import pytest
from image_folder import split_digits_folder
from mediapipe_env import mediapipe_python

from tfopt import config as C
from tfopt.export.evaluate import TFLiteModel
from tfopt.export.runner import BenchSettings, ExportSettings
from tfopt.export.runner import run as export_run
from tfopt.export.tflite import ConvertOptions
from tfopt.train import run as train

CLIENT = os.path.join(os.path.dirname(__file__), "mediapipe_client.py")
MODES = ("float32", "dynamic", "dynamic_auto", "float16", "int8", "int8_auto", "int8_weights")
CLASSES = ["digit_0", "digit_1", "digit_2"]
# A Keras 3 model as Colab writes it: it scales its own pixels (Rescaling) and ends in a softmax.
# argv: images root (train/, test/), model path. Prints its test accuracy fed as it was trained.
KERAS3_RESCALING = """
import json, os, sys
import numpy as np
import tensorflow as tf
import keras

def load(folder):
    names = sorted(os.listdir(folder))
    x, y = [], []
    for label, name in enumerate(names):
        for f in sorted(os.listdir(os.path.join(folder, name))):
            x.append(tf.io.decode_png(tf.io.read_file(os.path.join(folder, name, f)), 3).numpy())
            y.append(label)
    return np.stack(x).astype("float32"), np.array(y)

keras.utils.set_random_seed(0)
x, y = load(os.path.join(sys.argv[1], "train"))
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
    keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(3, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=60, batch_size=16, verbose=0)
model.save(sys.argv[2])
xt, yt = load(os.path.join(sys.argv[1], "test"))
print(json.dumps({"accuracy": float(np.mean(np.argmax(model.predict(xt, verbose=0), 1) == yt))}))
"""


def classify(folder: str, files: list[str]) -> dict:
    """MediaPipe's ImageClassifier on ``files``, in MediaPipe's own environment."""
    proc = subprocess.run(
        [mediapipe_python(), CLIENT, folder, *files], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """Real handwritten digits 0-2 as 32x32 RGB PNGs in train/val/test folders, and a run on them."""
    root = tmp_path_factory.mktemp("mediapipe")
    images = split_digits_folder(str(root / "imgs"), counts=(60, 15, 40), classes=3)
    cfg = C.from_dict(
        {
            "data": {"dataset": f"folder:{images}", "global_batch_size": 16, "num_shards": 1},
            "model": {"name": "cnn"},
            "runtime": {"strategy": "one_device", "deterministic": True},
            "train": {
                "epochs": 6,
                "output_dir": str(root / "run"),
                "verbose": 0,
                "tensorboard": False,
            },
        }
    )
    train(cfg)
    return str(root / "run"), images


def _export(run: str, out: str, modes, io: str = "float") -> dict:
    settings = ExportSettings(
        modes=modes,
        options=ConvertOptions(io=io),
        calibration_steps=4,
        auto_candidates=2,
        auto_rounds=1,
        bench=BenchSettings(threads=(1,), runs=5, warmup=1, keras=False),
        plot=False,
    )
    return export_run(run, settings, out).section


@pytest.mark.slow
def test_mediapipe_image_classifier_runs_every_mode_as_tfopt_scores_it(folder_run, tmp_path):
    run, images = folder_run
    export = _export(run, str(tmp_path / "export"), MODES)
    uint8 = _export(run, str(tmp_path / "uint8"), ("int8",), io="uint8")
    rows = {r["file"]: (r, export["output"]) for r in export["modes"]}
    rows["uint8/" + uint8["modes"][0]["file"]] = (uint8["modes"][0], uint8["output"])
    files = {name: os.path.join(out, row["file"]) for name, (row, out) in rows.items()}
    assert {r["mode"] for r, _ in rows.values()} >= set(MODES)
    got = classify(os.path.join(images, "test"), list(files.values()))
    pixels = _pixels(os.path.join(images, "test"))
    for name, (row, _) in rows.items():
        seen = got[os.path.basename(files[name])]
        assert seen["examples"] == row["eval"]["examples"] == 120, (name, seen)
        assert seen["labels"] == CLASSES, (name, seen)  # the names come from the file
        assert abs(seen["accuracy"] - row["eval"]["accuracy"]) <= 0.01, (name, seen, row["eval"])
        assert row["eval"]["accuracy"] > 0.6, (name, row["eval"])  # chance is 1/3
        # The same file fed the contract's pixels / 255 by the interpreter: the same probabilities
        # (a normalization MediaPipe applied wrongly, or logits out, would show here).
        scores = np.asarray(seen["scores"])
        want = TFLiteModel(files[name]).predict(pixels)
        np.testing.assert_allclose(scores, want, atol=0.02, err_msg=name)
        np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=0.01, err_msg=name)
        # The metadata as MediaPipe's own schema reads it: pixels / 255, RGB, labels, names.
        md = seen["metadata"]
        assert (md["input"], md["output"], md["color_space"]) == ("image", "probabilities", 1)
        assert (md["mean"], md["std"]) == ([0.0], [255.0]), md
        assert md["label_files"] == [["labels.txt", 2]] and md["min_parser_version"] == "1.0.0"
        assert md["files"] == ["input.json"] + (["recipe.json"] if row.get("recipe") else [])
        assert md["name"] == f"cnn ({row['mode']})" and md["author"] == "tfopt"


def _pixels(folder: str) -> np.ndarray:
    """The test images as the input contract gives them to the model (pixels / 255), in sorted order."""
    return np.stack(
        [
            tf.io.decode_png(tf.io.read_file(os.path.join(folder, c, f)), 3).numpy() / 255.0
            for c in sorted(os.listdir(folder))
            for f in sorted(os.listdir(os.path.join(folder, c)))
        ]
    ).astype(np.float32)


@pytest.mark.slow
def test_a_keras3_model_that_scales_its_own_pixels_is_read_and_runs_in_mediapipe(
    folder_run, tmp_path
):
    _, images = folder_run
    k3 = str(tmp_path / "k3.keras")
    proc = subprocess.run(
        [sys.executable, "-c", KERAS3_RESCALING, images, k3],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "0"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = json.loads(proc.stdout.strip().splitlines()[-1])["accuracy"]
    assert trained > 0.8, trained  # chance is 1/3: a model worth reading
    cfg = C.DataConfig(dataset=f"folder:{images}")
    settings = ExportSettings(
        modes=("float32",), bench=BenchSettings(threads=(1,), runs=5, warmup=1, keras=False)
    )
    record = export_run(k3, settings, str(tmp_path / "export"), data=cfg).to_dict()
    decided = record["data"]["input"]["model_input"]
    assert (decided["input_scale"], decided["decided_by"]) == ("raw", "graph"), decided
    assert record["data"]["input"]["input_scale"] == "raw"
    row = record["export"]["modes"][0]
    assert abs(row["eval"]["accuracy"] - trained) <= 0.03, (row["eval"], trained)
    seen = classify(os.path.join(images, "test"), [str(tmp_path / "export" / row["file"])])
    assert abs(seen[row["file"]]["accuracy"] - row["eval"]["accuracy"]) <= 0.01, seen
    # 0-255 pixels straight in: the normalization is the identity
    md = seen[row["file"]]["metadata"]
    assert (md["mean"], md["std"]) == ([0.0], [1.0]), md
