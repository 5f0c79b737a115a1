"""A user's own model and image folder through every stage: a .keras file ending in softmax and a
keras.applications MobileNetV2, trained under one_device, mirrored and 2-worker MultiWorkerMirrored
on real handwritten digits written as PNG class folders, then optimized and exported. Their
distillation runs in the folder_edge pipeline of notebook 05 (a MobileNetV2 teacher) and in
``test_users_models.py`` (models that scale their own pixels)."""

import json
import os
import subprocess
import sys

from tfopt.core._keras import keras

import numpy as np
import pytest
from image_folder import digits_folder
from isolation import ISOLATED

from tfopt import config as C
from tfopt.export import metadata
from tfopt.models.registry import build_model
from tfopt.train import run as train

MOBILENET = ["--model", "keras.applications:MobileNetV2", "--model-arg", "alpha=0.35"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """300 real digits (30 per class) as 32x32 RGB PNGs, and a user's model files for them."""
    root = tmp_path_factory.mktemp("photos")
    images = digits_folder(str(root / "digits"), per_class=30)
    keras.utils.set_random_seed(7)
    logits = build_model("small_cnn", (32, 32, 3), 10, dropout=0.0)
    # the same network as users often write it: probabilities out
    probs = keras.models.clone_model(
        logits,
        clone_function=lambda layer: layer.__class__.from_config(
            {**layer.get_config(), **({"activation": "softmax"} if layer.name == "logits" else {})}
        ),
    )
    probs.set_weights(logits.get_weights())
    logits.save(str(root / "logits.keras"))
    probs.save(str(root / "mine.keras"))
    return {
        "images": images,
        "root": root,
        "logits": str(root / "logits.keras"),
        "mine": str(root / "mine.keras"),
    }


def _cfg(folder, out, model, strategy="one_device", **kw):
    return C.from_dict(
        {
            "data": {
                "dataset": f"folder:{folder['images']}",
                "global_batch_size": 16,
                "num_shards": 2,
            },
            "model": {"name": model, **kw},
            "runtime": {"strategy": strategy, "deterministic": strategy == "one_device"},
            "train": {
                "epochs": 3,
                "output_dir": str(out),
                "verbose": 0,
                "tensorboard": False,
                "learning_rate": 3e-3,
            },
        }
    )


@pytest.fixture(scope="module")
def one_device(folder, tmp_path_factory):
    """``one_device(name, model, **kw) -> (record dict, run dir)``: a one_device run of ``_cfg``,
    trained once per module (deterministic: every test that needs it reads the same run)."""
    root, made = tmp_path_factory.mktemp("one_device"), {}

    def get(name, model, **kw):
        if name not in made:
            made[name] = (train(_cfg(folder, root / name, model, **kw)).to_dict(), str(root / name))
        return made[name]

    return get


@pytest.mark.slow
def test_a_softmax_file_trains_exactly_as_the_same_network_with_logits(
    folder, tmp_path, one_device
):
    reference = train(_cfg(folder, tmp_path / "logits", folder["logits"])).to_dict()
    mine, _ = one_device("mine", folder["mine"])
    assert mine["model"]["outputs"] == "logits (softmax activation of 'logits' removed)"
    assert reference["model"]["outputs"] == "logits" and mine["model"]["head"] == "kept"
    assert mine["weights_sha256"] == reference["weights_sha256"]
    assert mine["metrics"] == reference["metrics"]
    assert mine["metrics"]["test_accuracy"] > 0.5  # real digits: it learns (10% is chance)
    assert mine["data"]["class_names"] == [f"digit_{k}" for k in range(10)]
    assert mine["model"]["sha256"] and mine["model"]["form"] == "file"


@pytest.mark.slow
def test_mirrored_matches_one_device_for_a_file_and_an_application(folder, tmp_path, one_device):
    for name, model, kw in (
        ("mine", folder["mine"], {}),
        ("mobilenet", "keras.applications:MobileNetV2", {"args": "alpha=0.35"}),
    ):
        one, _ = one_device(name, model, **kw)
        two = train(
            _cfg(folder, tmp_path / f"{name}-two", model, strategy="mirrored", **kw)
        ).to_dict()
        assert two["strategy"]["num_replicas"] == 2
        # The same examples and steps; only the all-reduce's summation order differs.
        assert abs(two["metrics"]["test_accuracy"] - one["metrics"]["test_accuracy"]) <= 0.1, (
            name,
            one,
            two,
        )
        assert two["config"]["data"]["normalize"] == one["config"]["data"]["normalize"]
    assert (
        one["config"]["data"]["normalize"] == "0.5/0.5"
    )  # MobileNetV2's preprocess_input: [-1, 1]


def _launch(out, *args):
    cmd = [
        *ISOLATED,
        sys.executable,
        "-m",
        "tfopt.launch",
        "--workers",
        "2",
        "--timeout",
        "240",
        "--",
        sys.executable,
        "-m",
        "tfopt.train",
        "--strategy",
        "multi_worker_mirrored",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--quiet",
        "-o",
        str(out),
        "--set",
        "data.num_shards=2",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = [
        json.loads(line.split("tfopt train: done ", 1)[1])
        for line in (proc.stdout + proc.stderr).splitlines()
        if "tfopt train: done " in line
    ]
    assert sorted(d["task"] for d in done) == ["worker:0", "worker:1"]
    assert done[0]["weights_sha256"] == done[1]["weights_sha256"]  # the replicas stayed in sync
    return json.load(open(os.path.join(out, "run.json")))


@pytest.mark.slow
def test_two_worker_multi_worker_mirrored_trains_a_file_and_an_application(folder, tmp_path):
    dataset = ["--dataset", f"folder:{folder['images']}"]
    run = _launch(tmp_path / "mobilenet", *dataset, *MOBILENET)
    assert run["strategy"]["num_workers"] == 2 and run["model"]["head"] == "new"
    assert run["config"]["data"]["normalize"] == "0.5/0.5"
    run = _launch(tmp_path / "file", *dataset, "--model", folder["mine"])
    assert (
        run["model"]["outputs"].startswith("logits (softmax")
        and run["strategy"]["num_workers"] == 2
    )


def _stage(module, *args):
    proc = subprocess.run(
        [sys.executable, "-m", module, *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_optimize_and_export_take_the_user_model_and_data(folder, tmp_path):
    # MobileNetV2's prune + QAT and its export run in notebook 05 (through the library); here
    # the command lines: an application's run exported as it is, and the user's file through
    # prune + QAT and the int8 export of the result.
    data = ["--dataset", f"folder:{folder['images']}"]
    fast = ["--runs", "5", "--warmup", "1", "--threads", "1", "--no-keras-latency", "--no-plot"]
    # One epoch leaves a network near chance with near-tied outputs, where int8 flips many top-1
    # answers: the fidelity gate is tested on trained models (test_export), loosened here.
    loose = ["--min-agreement", "0", "--max-accuracy-drop", "100", "--no-selective"]
    app = tmp_path / "mobilenet"
    _stage(
        "tfopt.train",
        *data,
        *MOBILENET,
        "--image-size",
        "36x36",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--strategy",
        "one_device",
        "-o",
        str(app),
    )
    _stage(
        "tfopt.export",
        "--from",
        str(app),
        "--modes",
        "int8",
        "--calibration-steps",
        "2",
        *fast,
        *loose,
        "-o",
        str(tmp_path / "mobilenet-export"),
    )
    exported = json.load(open(tmp_path / "mobilenet-export" / "run.json"))
    row = exported["export"]["modes"][0]
    assert row["mode"] == "int8" and not row["qat"] and row["eval"]["examples"] == 30
    # the exported model is read back with its labels and its input contract
    labels = open(tmp_path / "mobilenet-export" / "labels.txt").read().split()
    assert labels == [f"digit_{k}" for k in range(10)]
    assert (
        metadata.labels(str(tmp_path / "mobilenet-export" / row["file"])) == labels
    )  # packed into the .tflite too
    contract = json.load(open(tmp_path / "mobilenet-export" / "input.json"))
    assert contract["image_shape"] == [36, 36, 3] and contract["normalize"] == "0.5/0.5"
    # a model file straight into optimize and export, with the data named on the command line
    _stage(
        "tfopt.optimize",
        "--from",
        folder["mine"],
        *data,
        "--technique",
        "pqat",
        "--phase-epochs",
        "prune=1,qat=1",
        "--steps-per-epoch",
        "3",
        "--strategy",
        "one_device",
        "-o",
        str(tmp_path / "file-pqat"),
    )
    pqat = json.load(open(tmp_path / "file-pqat" / "run.json"))
    assert pqat["optimize"]["source"] == {
        **pqat["optimize"]["source"],
        "run": folder["mine"],
        "form": "file",
    }
    assert pqat["data"]["image_shape"] == [32, 32, 3]
    _stage(
        "tfopt.export",
        "--from",
        str(tmp_path / "file-pqat"),
        "--modes",
        "int8",
        *fast,
        *loose,
        "-o",
        str(tmp_path / "file-pqat-export"),
    )
    row = json.load(open(tmp_path / "file-pqat-export" / "run.json"))["export"]["modes"][0]
    assert row["mode"] == "int8" and row["qat"]
    assert metadata.labels(str(tmp_path / "file-pqat-export" / row["file"])) == labels
    _stage("tfopt.export", "--from", folder["mine"], *data, "--modes", "float32", *fast)
    exported = json.load(open(str(folder["root"] / "mine-export" / "run.json")))
    assert exported["export"]["source"] == folder["mine"]
    assert exported["export"]["modes"][0]["eval"]["agreement"] == 1.0


def _refused(capsys, command: str, argv: list[str], out) -> str:
    """Runs ``python -m tfopt.<command> argv`` in this process; returns its one error line.

    In-process (the stage's own ``main``): the same parsing, checks and one-line printing as the
    command line, without starting TensorFlow again for every bad input.
    """
    import importlib

    main = importlib.import_module(f"tfopt.{command}.cli").main
    capsys.readouterr()
    code = main([*argv, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith(f"tfopt {command}")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not os.path.exists(out), f"tfopt {command} wrote {out} for a refused input"
    return lines[0]


@pytest.mark.slow
def test_bad_model_sources_are_one_line_and_write_nothing(folder, tmp_path, capsys):
    data = ["--dataset", f"folder:{folder['images']}", "--strategy", "one_device"]
    for args, needle in (
        (
            ["--model", "keras.applications:MobilenetV2"],
            "keras.applications:MobilenetV2 does not exist; did you mean MobileNetV2",
        ),
        (
            [*MOBILENET, "--model-arg", "depth=3"],
            "takes no argument 'depth'; --model-arg takes: input_shape, alpha",
        ),
        (["--model", "cnn", "--model-arg", "alpha=1"], "the model 'cnn' takes no arguments"),
        (["--model", "/nope/mine.keras"], "model file '/nope/mine.keras' does not exist"),
        (["--model", "x y"], "is not a model source; give a built-in model name"),
        (["--image-size", "big"], "data.image_size='big' is not valid; give HEIGHTxWIDTH"),
        (
            ["--model", folder["mine"], "--image-size", "40x40", "--channels", "1"],
            "takes 32x32x3 images but the data gives 40x40x1; resize them with --image-size "
            "32x32 and --channels 3",
        ),
    ):
        assert needle in _refused(capsys, "train", [*data, *args], tmp_path / "run"), args


@pytest.mark.slow
def test_a_file_that_is_not_a_model_and_a_keras3_file_are_one_line(folder, tmp_path, capsys):
    garbage = tmp_path / "notes.keras"
    garbage.write_bytes(b"these are my notes, not a model")
    k3 = tmp_path / "k3.keras"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import keras\nm = keras.Sequential([keras.Input((32, 32, 3)), "
            f"keras.layers.Flatten(), keras.layers.Dense(10)])\nm.save({str(k3)!r})",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "0"},
    )
    data = ["--dataset", f"folder:{folder['images']}", "--strategy", "one_device"]
    for command, args, needle in (
        ("train", ["--model", str(garbage)], "is not a valid .keras file"),
        ("optimize", ["--from", str(k3), "--technique", "prune"], "was saved by Keras 3"),
        ("distill", ["--teacher", str(k3)], "was saved by Keras 3"),
    ):
        assert needle in _refused(capsys, command, [*args, *data], tmp_path / "out"), command


@pytest.mark.slow
def test_freeze_epochs_train_the_classification_layer_alone_first(folder, tmp_path):
    from tfopt.models.io import load_model

    original = load_model(folder["logits"])

    def moved(run_dir):
        saved = load_model(str(run_dir))
        assert all(
            layer.trainable for layer in saved.layers
        )  # saved as a whole, ready to fine-tune on
        return {
            l.name
            for l, o in zip(saved.layers, original.layers)
            if any(not np.array_equal(a, b) for a, b in zip(l.get_weights(), o.get_weights()))
        }

    head_only = train(_cfg(folder, tmp_path / "head", folder["logits"], freeze_epochs=3)).to_dict()
    assert moved(tmp_path / "head") == {"logits"}  # the base is exactly as the file had it
    assert [r["epoch"] for r in head_only["history"]] == [1, 2, 3] and head_only["train"][
        "freeze_epochs"
    ] == 3
    then_all = train(
        _cfg(folder, tmp_path / "then_all", folder["logits"], freeze_epochs=1)
    ).to_dict()
    assert {"conv0", "conv1", "logits"} <= moved(tmp_path / "then_all")
    assert [r["epoch"] for r in then_all["history"]] == [1, 2, 3] and len(
        then_all["train"]["epoch_seconds"]
    ) == 3
    with pytest.raises(Exception, match=r"model.freeze_epochs=4 must be in \[0, train.epochs=3\]"):
        _cfg(folder, tmp_path / "x", folder["logits"], freeze_epochs=4)


KERAS3_MODEL = """
import sys
import numpy as np
import keras
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")])
model.save(sys.argv[1])
x = np.load(sys.argv[2])
np.save(sys.argv[3], model.predict(x, verbose=0))
"""


@pytest.mark.slow
def test_a_keras3_file_is_exported_through_a_saved_model(folder, tmp_path):
    """What Colab saves: Keras 3 itself exports it, the .tflite computes what Keras 3 computes."""
    from tfopt.config import DataConfig
    from tfopt.export.evaluate import TFLiteModel, load_split

    x, _ = load_split(DataConfig(dataset=f"folder:{folder['images']}"), "test")
    np.save(tmp_path / "x.npy", x)
    subprocess.run(
        [
            sys.executable,
            "-c",
            KERAS3_MODEL,
            str(tmp_path / "k3.keras"),
            str(tmp_path / "x.npy"),
            str(tmp_path / "k3.npy"),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "0"},
    )
    _stage(
        "tfopt.export",
        "--from",
        str(tmp_path / "k3.keras"),
        "--dataset",
        f"folder:{folder['images']}",
        "--modes",
        "float32,int8",
        "--runs",
        "5",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--no-plot",
        "--min-agreement",
        "0.5",
    )  # an untrained model: near-tied outputs, int8 flips some
    record = json.load(open(tmp_path / "k3-export" / "run.json"))
    rows = {r["mode"]: r for r in record["export"]["modes"]}
    assert set(rows) == {"float32", "int8"} and rows["float32"]["eval"]["agreement"] == 1.0
    probabilities = TFLiteModel(str(tmp_path / "k3-export" / "model_float32.tflite")).predict(x)
    np.testing.assert_allclose(
        probabilities, np.load(tmp_path / "k3.npy"), atol=1e-5
    )  # Keras 3's own outputs


@pytest.mark.slow
def test_pretrained_weights_from_a_file_fine_tune_with_freeze_epochs(folder, tmp_path, one_device):
    """``--model-arg weights=PATH.h5``: the base starts from the file (made here from a trained
    run), and head-only epochs keep it exactly as the file has it."""
    from tfopt.models.io import load_model

    _, first = one_device("mobilenet", "keras.applications:MobileNetV2", args="alpha=0.35")
    trained = load_model(first)
    base = keras.applications.MobileNetV2(
        alpha=0.35, include_top=False, weights=None, input_shape=(32, 32, 3), pooling="avg"
    )
    for layer in base.layers:
        if layer.weights:
            layer.set_weights(trained.get_layer(layer.name).get_weights())
    weights = str(tmp_path / "base.weights.h5")
    base.save_weights(weights)
    args = f"alpha=0.35,weights={weights}"
    cfg = _cfg(
        folder, tmp_path / "tuned", "keras.applications:MobileNetV2", args=args, freeze_epochs=3
    )
    assert train(cfg).to_dict()["train"]["freeze_epochs"] == 3  # every epoch trains the head
    tuned = load_model(str(tmp_path / "tuned"))
    moved = {
        layer.name
        for layer in base.layers
        if layer.weights
        and any(
            not np.array_equal(a, b)
            for a, b in zip(layer.get_weights(), tuned.get_layer(layer.name).get_weights())
        )
    }
    assert moved == set(), moved  # the base is the file's, untouched by the head-only epoch
    head = tuned.get_layer("logits").get_weights()[0]
    assert not np.array_equal(head, trained.get_layer("logits").get_weights()[0])


def test_imagenet_weights_without_a_network_are_one_line(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))  # nothing cached
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # no network: refused at once
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    data = ["--dataset", f"folder:{folder['images']}", "--strategy", "one_device"]
    line = _refused(
        capsys, "train", [*MOBILENET, "--model-arg", "weights=imagenet", *data], tmp_path / "out"
    )
    assert "could not download weights='imagenet'" in line and "--model-arg weights=PATH.h5" in line
