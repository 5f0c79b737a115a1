"""What users bring, through every stage: models that scale their own pixels.

A keras.io-style `.keras` file (``Rescaling(1/255)`` first, softmax last), one with a
``Normalization`` adapted on the training pixels, and keras.applications MobileNetV3Small and
EfficientNetB0 (which scale inside), on real handwritten digits written as a PNG folder with
train/val/test subfolders. References: plain tf_keras fitted on the same files
(``image_dataset_from_directory``) with the same settings, the teacher's own test accuracy, and
the Keras model run on the raw PNG pixels.
"""

import json
import os
import subprocess
import sys

from tfopt.core._keras import keras

import numpy as np
import pytest
from image_folder import split_digits_folder

from tfopt.export.evaluate import TFLiteModel

L = keras.layers
SIZE = 32
COUNTS = (60, 10, 40)  # per class: train, val, test (3 classes: 180, 30, 120 images)
SETTINGS = ["--epochs", "20", "--batch-size", "32", "--lr", "1e-3"]


def _body(x):
    x = L.Conv2D(16, 3, activation="relu")(x)
    x = L.MaxPooling2D()(x)
    x = L.Conv2D(32, 3, activation="relu")(x)
    x = L.GlobalAveragePooling2D()(x)
    return L.Dense(3, activation="softmax")(x)


def _split(root, split):
    ds = keras.utils.image_dataset_from_directory(
        os.path.join(root, split), image_size=(SIZE, SIZE), batch_size=32, shuffle=False
    )
    x, y = zip(*ds.as_numpy_iterator())
    return np.concatenate(x), np.concatenate(y)  # float32 0-255 pixels, int labels


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    """The image folder, the two model files (saved untrained) and the raw test pixels."""
    root = tmp_path_factory.mktemp("users")
    images = split_digits_folder(str(root / "imgs"), counts=COUNTS, classes=3)
    x_train, _ = _split(images, "train")
    keras.utils.set_random_seed(1)
    i = keras.Input((SIZE, SIZE, 3))
    keras.Model(i, _body(L.Rescaling(1.0 / 255)(i))).save(str(root / "rescaling.keras"))
    norm = L.Normalization()
    norm.adapt(x_train)  # the keras.io way: adapted on the training pixels as loaded (0-255)
    keras.utils.set_random_seed(1)
    i = keras.Input((SIZE, SIZE, 3))
    keras.Model(i, _body(norm(i))).save(str(root / "normalization.keras"))
    return {"root": root, "images": images, "test": _split(images, "test")}


def _plain_accuracy(users, model_file, seed):
    """The keras.io recipe on the same files and settings: fit 20 epochs, batch 32, Adam 1e-3."""
    keras.utils.set_random_seed(seed)
    model = keras.models.load_model(model_file)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", ["accuracy"])
    x, y = _split(users["images"], "train")
    model.fit(x, y, batch_size=32, epochs=20, verbose=0)
    xt, yt = users["test"]
    return float(np.mean(np.argmax(model.predict(xt, verbose=0), axis=-1) == yt))


def _tfopt(module, *args, data_dir):
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TFOPT_DATA_DIR=str(data_dir)),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _train(users, out, *args):
    _tfopt(
        "tfopt.train",
        "--dataset",
        f"folder:{users['images']}",
        "--strategy",
        "one_device",
        "--set",
        "train.lr_schedule=constant",  # as Keras's fit: a constant rate
        "--deterministic",
        "-o",
        str(out),
        *args,
        data_dir=users["root"] / "data",
    )
    with open(os.path.join(out, "run.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trained(users, tmp_path_factory):
    """``trained(name) -> (run.json, run dir)``: tfopt.train on the user's ``<name>.keras`` with
    SETTINGS, once per module (deterministic: the tests that need it read the same run)."""
    root, made = tmp_path_factory.mktemp("trained"), {}

    def get(name):
        if name not in made:
            model_file = str(users["root"] / f"{name}.keras")
            made[name] = (_train(users, root / name, "--model", model_file, *SETTINGS), root / name)
        return made[name]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rescaling", "normalization"])
def test_a_model_that_scales_its_own_pixels_learns_as_plain_tf_keras_does(users, trained, name):
    """Noise: two seeds of the plain recipe, and the binomial standard error of 120 test images
    (4.2 points at 67%). Before the input side was read, tfopt fed [0, 1] pixels to these models
    and reached 34-40% (chance is 33%), below this bound."""
    model_file = str(users["root"] / f"{name}.keras")
    run, _ = trained(name)
    fed = run["data"]["model_input"]
    assert (fed["input_scale"], fed["decided_by"]) == ("raw", "graph")
    assert run["data"]["input"]["input_scale"] == "raw" and run["warnings"] == []
    plain = [_plain_accuracy(users, model_file, seed) for seed in (0, 1)]
    mean = float(np.mean(plain))
    se = (mean * (1 - mean) / len(users["test"][1])) ** 0.5
    ours = run["metrics"]["test_accuracy"]
    print(f"{name}: tfopt {ours:.3f}, plain tf_keras {plain}")
    assert ours >= min(plain) - 2 * se, (ours, plain)
    assert mean > 0.5  # the reference itself learned (chance is 1/3)


def _tflite_agrees_on_raw_pixels(tflite_file, keras_file, users, least):
    """The .tflite fed what input.json says a camera gives (0-255 pixels, nothing else) answers
    as the Keras model does on the same pixels."""
    xt, _ = users["test"]
    keras_pred = np.argmax(keras.models.load_model(keras_file).predict(xt, verbose=0), axis=-1)
    lite_pred = np.argmax(TFLiteModel(tflite_file).predict(xt), axis=-1)
    assert np.mean(lite_pred == keras_pred) >= least, np.mean(lite_pred == keras_pred)


@pytest.mark.slow
def test_optimize_distill_and_export_keep_the_pixels_the_model_was_built_for(
    users, tmp_path, trained
):
    trained, teacher = trained("rescaling")
    data = ["--dataset", f"folder:{users['images']}", "--strategy", "one_device"]
    where = {"data_dir": users["root"] / "data"}
    _tfopt(
        "tfopt.optimize",
        "--from",
        str(teacher),
        "--technique",
        "prune",
        "--sparsity",
        "0.5",
        "--epochs",
        "2",
        "--strategy",
        "one_device",
        "-o",
        str(tmp_path / "pruned"),
        **where,
    )
    pruned = json.load(open(tmp_path / "pruned" / "run.json"))
    assert pruned["config"]["data"]["input_scale"] == "raw" and pruned["warnings"] == []
    # A student without preprocessing, fed [0, 1] pixels: the teacher gets its own 0-255 back.
    _tfopt(
        "tfopt.distill",
        "--teacher",
        str(teacher),
        "--student",
        "small_cnn",
        "--input-scale",
        "unit",
        *data,
        "--epochs",
        "2",
        "--batch-size",
        "32",
        "-o",
        str(tmp_path / "student"),
        **where,
    )
    student = json.load(open(tmp_path / "student" / "run.json"))
    assert student["config"]["data"]["input_scale"] == "unit"
    seen = student["distill"]["teachers"][0]["test_accuracy"]
    assert seen == pytest.approx(trained["metrics"]["test_accuracy"], abs=1e-6)
    _tfopt(
        "tfopt.export",
        "--from",
        str(tmp_path / "pruned"),
        "--modes",
        "float32,int8",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--no-keras-latency",
        "--no-plot",
        "--no-selective",
        "--min-agreement",  # the gate's defaults ask for 99%: on 120 images, 2 flips fail it
        "0.95",
        "--max-accuracy-drop",
        "3",
        "-o",
        str(tmp_path / "export"),
        **where,
    )
    contract = json.load(open(tmp_path / "export" / "input.json"))
    assert contract["input_scale"] == "raw" and contract["model_input"]["decided_by"] == "config"
    exported = json.load(open(tmp_path / "export" / "run.json"))
    rows = {r["mode"]: r for r in exported["export"]["modes"]}
    assert rows["int8"]["eval"]["agreement"] >= 0.9  # calibrated on the pixels the model expects
    keras_file = str(tmp_path / "pruned" / "model.keras")
    _tflite_agrees_on_raw_pixels(
        str(tmp_path / "export" / rows["float32"]["file"]), keras_file, users, 1.0
    )
    _tflite_agrees_on_raw_pixels(
        str(tmp_path / "export" / rows["int8"]["file"]), keras_file, users, 0.9
    )
    # --evaluate reads the scale from the contract packed into the .tflite
    _tfopt(
        "tfopt.export",
        "--evaluate",
        str(tmp_path / "export" / rows["int8"]["file"]),
        "--dataset",
        f"folder:{users['images']}",
        "-o",
        str(tmp_path / "evaluated"),
        **where,
    )
    evaluated = json.load(open(tmp_path / "evaluated" / "evaluate.json"))
    assert evaluated["eval"]["accuracy"] == rows["int8"]["eval"]["accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MobileNetV3Small", "EfficientNetB0"])
def test_applications_that_scale_inside_get_0_255_pixels_and_export_for_them(users, tmp_path, name):
    run = _train(
        users,
        tmp_path / name,
        "--model",
        f"keras.applications:{name}",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "16",
    )
    fed = run["data"]["model_input"]
    assert (fed["input_scale"], fed["decided_by"]) == ("raw", "graph")
    assert run["config"]["data"]["normalize"] == ""  # nothing scales the pixels before the model
    if name == "EfficientNetB0":
        return  # its conversion is the slowest part; MobileNetV3Small covers the export
    _tfopt(
        "tfopt.export",
        "--from",
        str(tmp_path / name),
        "--modes",
        "float32",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--no-keras-latency",
        "--no-plot",
        "-o",
        str(tmp_path / "export"),
        data_dir=users["root"] / "data",
    )
    contract = json.load(open(tmp_path / "export" / "input.json"))
    assert contract["input_scale"] == "raw"
    exported = json.load(open(tmp_path / "export" / "run.json"))
    row = exported["export"]["modes"][0]
    _tflite_agrees_on_raw_pixels(
        str(tmp_path / "export" / row["file"]), str(tmp_path / name / "model.keras"), users, 1.0
    )
