"""``tfopt export --trainable``: a .tflite whose head trains in LiteRT's interpreter.

The file is run as an app runs it: ai-edge-litert's interpreter and its signature runners, on
data the model never saw (Fashion-MNIST through a head trained on MNIST digits). Each step is
held against the same SGD step in numpy on the Keras backbone's features.
"""

import dataclasses
import json
import subprocess
import sys

from tfopt.core._keras import keras

import numpy as np
import pytest

from tfopt import load_run
from tfopt.core.errors import ConfigError, ModelError
from tfopt.export import load_split, metadata, trainable
from tfopt.export.cli import main as export_main
from tfopt.models.io import load_model

LR = 0.01


@pytest.fixture(scope="module")
def exported(mnist_run, tmp_path_factory):
    """The CLI's export of the session's MNIST run: float32 plus the trainable file."""
    out = tmp_path_factory.mktemp("trainable") / "export"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfopt.export",
            "--from",
            mnist_run,
            "--modes",
            "float32",
            "--trainable",
            "--trainable-lr",
            str(LR),
            "--eval-limit",
            "500",
            "--no-keras-latency",
            "--runs",
            "3",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--no-plot",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"wrote {out}/model_trainable.tflite (signatures infer, restore, save, train" in (
        proc.stdout
    )
    return str(out), json.load(open(out / "run.json"))


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.slow
def test_the_train_signature_learns_new_classes_in_litert_as_numpy_does(exported, mnist_run):
    out, record = exported
    section = record["export"]["trainable"]
    assert record["artifacts"]["trainable"] == trainable.FILE == section["file"]
    assert section["signatures"] == {
        "infer": {"inputs": ["image"], "outputs": ["probabilities"]},
        "train": {"inputs": ["image", "label"], "outputs": ["loss"]},
        "save": {"inputs": [], "outputs": ["bias", "kernel"]},
        "restore": {"inputs": ["bias", "kernel"], "outputs": ["bias", "kernel"]},
    }
    assert section["learning_rate"] == LR and section["trainable_params"] == 64 * 10 + 10
    path = f"{out}/{trainable.FILE}"
    content = open(path, "rb").read()
    # The same metadata as every export: labels and the input contract travel in the file.
    float32 = f"{out}/model_float32.tflite"
    assert metadata.contract_of(path) == metadata.contract_of(float32)
    assert metadata.contract_of(path)["image_shape"] == [28, 28, 1]
    assert metadata.labels(path) == metadata.labels(float32)

    data = dataclasses.replace(load_run(mnist_run).config.data, dataset="fashion_mnist", limit=0)
    x_new, y_new = load_split(data, "validation", 1024)
    x_eval, y_eval = load_split(data, "test", 1000)
    run = trainable.runners(content)

    def accuracy():
        return float(np.mean(np.argmax(run["infer"](image=x_eval)["probabilities"], 1) == y_eval))

    before = accuracy()
    part = trainable.split(load_model(f"{mnist_run}/model.keras"))
    features = np.asarray(part.backbone(x_new, training=False), dtype=np.float64)
    kernel = part.head.kernel.numpy().astype(np.float64)
    bias = part.head.bias.numpy().astype(np.float64)
    losses = []
    for _ in range(3):
        for i in range(0, len(x_new), 32):
            xb, yb = x_new[i : i + 32], y_new[i : i + 32]
            losses.append(float(run["train"](image=xb, label=yb.astype(np.int32))["loss"]))
            grad = (_softmax(features[i : i + 32] @ kernel + bias) - np.eye(10)[yb]) / len(yb)
            kernel -= LR * features[i : i + 32].T @ grad
            bias -= LR * grad.sum(axis=0)
    after = accuracy()
    learned = run["save"]()
    np.testing.assert_allclose(learned["kernel"], kernel, atol=2e-4, rtol=1e-3)
    np.testing.assert_allclose(learned["bias"], bias, atol=2e-4, rtol=1e-3)
    print(
        f"\non-device training of the head on Fashion-MNIST (1024 examples, 3 epochs, lr {LR}): "
        f"loss {np.mean(losses[:10]):.2f} -> {np.mean(losses[-10:]):.2f}, accuracy on 1000 "
        f"held-out {before:.3f} -> {after:.3f}"
    )
    assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:10]), losses
    assert after > before + 0.25, (before, after)

    # save / restore across interpreters: a fresh copy of the file takes the learned head back.
    fresh = trainable.runners(content)
    assert accuracy() == after
    fresh["restore"](kernel=learned["kernel"], bias=learned["bias"])
    np.testing.assert_array_equal(
        fresh["infer"](image=x_eval)["probabilities"], run["infer"](image=x_eval)["probabilities"]
    )


@pytest.mark.slow
def test_the_trainable_file_infers_as_the_float32_file_and_checks_itself(exported, mnist_run):
    out, record = exported
    from tfopt.export.evaluate import TFLiteModel

    x, _ = load_split(load_run(mnist_run).config.data, "test", 200)
    float32 = TFLiteModel(f"{out}/model_float32.tflite").predict(x)
    infer = trainable.runners(open(f"{out}/{trainable.FILE}", "rb").read())["infer"]
    np.testing.assert_allclose(infer(image=x)["probabilities"], float32, atol=1e-5)
    checks = record["export"]["trainable"]["checks"]
    assert checks["examples"] == 64 and checks["restore"] == 0.0
    assert max(checks["infer_vs_keras"], checks["train_step_vs_numpy"]) < 1e-4, checks


def _classifier(head):
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inp)
    return keras.Model(inp, head(x))


def test_a_softmax_head_trains_and_its_file_checks_against_numpy():
    def head(x):
        return keras.layers.Dense(3, activation="softmax", name="scores")(
            keras.layers.GlobalAveragePooling2D()(x)
        )

    model = _classifier(head)
    x = np.random.default_rng(0).random((16, 8, 8, 3), dtype=np.float32)
    y = np.arange(16) % 3
    content, section = trainable.make(model, {"image_shape": [8, 8, 3]}, x, y, 0.1, "logits")
    assert section["head"] == "scores" and section["trainable_params"] == 4 * 3 + 3
    assert section["signatures"]["infer"]["outputs"] == ["logits"]
    logits = trainable.runners(content)["infer"](image=x)["logits"]
    assert not np.allclose(logits.sum(axis=1), 1.0)  # the softmax went: logits out, as asked


@pytest.mark.parametrize(
    "head, needle",
    [
        (lambda x: keras.layers.GlobalAveragePooling2D(name="gap")(x), "ends in 'gap'"),
        (lambda x: keras.layers.Dense(3, name="dense3d")(x), "reads a 4-d tensor"),
        (
            lambda x: keras.layers.Dense(3, activation="relu", name="relu_head")(
                keras.layers.Flatten()(x)
            ),
            "ends in 'relu_head'",
        ),
    ],
)
def test_a_model_without_a_flat_dense_head_is_refused_in_one_line(head, needle):
    with pytest.raises(ModelError, match=needle) as e:
        trainable.split(_classifier(head))
    assert "\n" not in str(e.value)


def test_a_qat_model_is_refused_naming_what_to_export_instead():
    import tensorflow_model_optimization as tfmot

    def head(x):
        return keras.layers.Dense(3)(keras.layers.Flatten()(x))

    qat = tfmot.quantization.keras.quantize_model(_classifier(head))
    with pytest.raises(ModelError, match="quantization-aware .* export the run it was fine-tuned"):
        trainable.refuse_qat(qat)


def test_trainable_lr_without_trainable_is_refused_before_tensorflow(tmp_path, capsys):
    code = export_main(
        ["--from", str(tmp_path), "--modes", "float32", "--trainable-lr", "0.1", "-o", "x"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--trainable-lr is read by --trainable" in err, err
    with pytest.raises(ConfigError, match="trainable_lr=0.0 must be > 0"):
        from tfopt import config as C

        C.from_dict({"export": {"trainable_lr": 0.0}})
