"""DP-SGD in distillation: the student's step clips each example's distillation loss gradient and
adds the noise once (against gradients taken one example at a time), the teachers stay frozen,
and ``tfopt distill`` records what the run spent as ``tfopt train`` does."""

import json

from tfopt.core._keras import keras, tf

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from tfopt.distill.cli import main as distill
from tfopt.models.distiller import Distiller
from tfopt.privacy import make_private


def _pair():
    keras.utils.set_random_seed(11)
    teacher = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    teacher.trainable = False
    student = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(3)]
    )
    return teacher, student


def _one_at_a_time(distiller, x, y, clip):
    """The clipped mean of each example's gradient of the Distiller's own loss, one tape each."""
    variables = distiller.trainable_variables
    total = [np.zeros(v.shape) for v in variables]
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            s, sf, t, tf_ = distiller._run(x[i : i + 1], training=True)
            loss = distiller.loss_terms(y[i : i + 1], s, t, sf, tf_)["total"][0]
        grads = [g.numpy() for g in tape.gradient(loss, variables)]
        norm = np.sqrt(sum(np.sum(g**2) for g in grads))
        total = [a + g * min(1.0, clip / norm) for a, g in zip(total, grads)]
    return [g / len(x) for g in total]


@pytest.mark.parametrize("formulas", [True, False], ids=["ghost", "vectorized"])
def test_the_private_distillation_step_clips_each_examples_loss_gradient(formulas):
    teacher, student = _pair()
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    distiller = Distiller(student, teacher, temperature=3.0, alpha=0.7)
    distiller.compile(optimizer=keras.optimizers.SGD(1.0))
    want = _one_at_a_time(distiller, x, y, 0.05)
    start, frozen = distiller.get_weights(), teacher.get_weights()
    methods = make_private(distiller, 0.05, 0.0, 8, ghost_norms=formulas)
    logs = distiller.train_on_batch(x, y, return_dict=True)
    # only the student's two layers train and are clipped; the teacher's weights are constants
    assert len(methods) == 2 and all(
        m.startswith("ghost" if formulas else "vectorized") for m in methods.values()
    )
    moved = [w0 - w for w, w0 in zip(distiller.get_weights(), start)]
    steps = dict(zip((v.ref() for v in distiller.weights), moved))
    for v, g in zip(distiller.trainable_variables, want):
        np.testing.assert_allclose(steps[v.ref()], g, rtol=1e-4, atol=1e-7)
    for a, b in zip(teacher.get_weights(), frozen):
        np.testing.assert_array_equal(a, b)
    assert {"loss", "distillation_loss", "student_loss", "accuracy"} <= set(logs), logs


@pytest.mark.slow
def test_distill_with_dp_records_what_it_spent_and_refuses_a_wrapped_student(
    tmp_path, mnist_run, capsys
):
    out = tmp_path / "private"
    common = ["--teacher", mnist_run, "--student", "dp_cnn", "--strategy", "one_device"]
    data = ["--limit", "512", "--batch-size", "64", "--epochs", "1", "--quiet"]
    dp = ["--dp-l2-clip", "1.0", "--dp-noise", "1.1", "--dp-delta", "1e-3"]
    assert distill([*common, *data, *dp, "-o", str(out)]) == 0
    run = json.load(open(out / "run.json"))
    section = run["train"]["privacy"]
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(64 / 512, dp_accounting.GaussianDpEvent(1.1)), 8
    )
    accountant = rdp.RdpAccountant()
    accountant.compose(event)
    assert section["steps"] == 8 and section["epsilon_rdp"] == pytest.approx(
        accountant.get_epsilon(1e-3)
    )
    assert sorted(section["per_example_gradients"]["layers"]) == ["conv0", "conv1", "fc", "logits"]
    assert run["config"]["privacy"]["l2_clip"] == 1.0
    capsys.readouterr()
    code = distill([*common, *data, *dp, "--technique", "prune", "-o", str(tmp_path / "wrapped")])
    err = capsys.readouterr().err
    assert code == 2 and "--technique prune wraps it" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "wrapped").exists()
