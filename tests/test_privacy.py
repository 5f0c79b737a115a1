"""DP-SGD (tfopt.privacy): the accountant against dp-accounting called directly, clipping and noise
against numpy, noise added once under mirrored (its weights equal one_device's), the record, and
the one-line refusals."""

import json

from tfopt.core._keras import keras, tf

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp

from tfopt import config as C
from tfopt.core.errors import ConfigError, ModelError
from tfopt.privacy import accountant, clipped_noisy_mean, make_plan, make_private
from tfopt.train import run as train


def _direct(noise, q, steps, delta):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise)), steps
    )
    out = {}
    for name, acc in (("rdp", rdp.RdpAccountant()), ("pld", pld.PLDAccountant())):
        acc.compose(event)
        out[name] = acc.get_epsilon(delta)
    return out


@pytest.mark.parametrize("noise, q, steps", [(1.1, 256 / 60000, 14062), (0.7, 0.01, 500)])
def test_the_accountant_is_dp_accountings_for_the_same_sampling_noise_and_steps(noise, q, steps):
    ours = accountant.epsilon(noise, q, steps, 1e-5)
    assert ours == pytest.approx(_direct(noise, q, steps, 1e-5), rel=1e-12)
    assert ours["pld"] <= ours["rdp"]  # PLD is the tighter bound


def test_the_noise_for_a_target_spends_at_most_it_and_a_little_less_noise_spends_more():
    q, steps, delta = 256 / 60000, 2000, 1e-5
    for target in (1.2, 3.0, 10.0):
        noise = accountant.noise_for(target, q, steps, delta)
        assert _direct(noise, q, steps, delta)["rdp"] <= target
        assert _direct(noise * 0.99, q, steps, delta)["rdp"] > target
    assert accountant.default_delta(60000) == 1e-5 and accountant.default_delta(100000) == 1e-6


def _numpy_dp_mean(per_example, clip, batch):
    flat = np.concatenate([g.reshape(len(g), -1) for g in per_example], axis=1)
    factor = np.minimum(1.0, clip / np.linalg.norm(flat, axis=1))
    return [np.tensordot(factor, g, axes=1) / batch for g in per_example]


def test_every_example_is_clipped_to_the_norm_and_summed_as_numpy_does():
    rng = np.random.default_rng(0)
    per_example = [rng.normal(size=(8, 3, 4)) * 5, rng.normal(size=(8, 4)) * 0.01]
    per_example[0][2] *= 1e-3  # one example already inside the norm: kept as it is
    got = clipped_noisy_mean(
        [tf.constant(g, tf.float32) for g in per_example],
        1.0,
        0.0,
        8,
        noise_seed=tf.constant([0, 0], tf.int64),
    )
    for g, want in zip(got, _numpy_dp_mean(per_example, 1.0, 8)):
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-7)
    # each example's contribution has norm <= C: the sum of 8 has norm <= 8 C
    total = np.sqrt(sum(np.sum((g.numpy() * 8) ** 2) for g in got))
    assert total <= 8 * 1.0 + 1e-5


def test_the_noise_has_std_sigma_times_clip_over_the_batch_and_only_where_added():
    zeros = [tf.zeros((1, 200, 500))]
    seed = tf.constant([3, 7], tf.int64)
    (noisy,) = clipped_noisy_mean(zeros, 2.0, 1.5, 10, noise_seed=seed)
    std = float(np.std(noisy.numpy()))
    assert std == pytest.approx(1.5 * 2.0 / 10, rel=0.01)  # 100,000 draws: 1% is ~4 sigma
    (again,) = clipped_noisy_mean(zeros, 2.0, 1.5, 10, noise_seed=seed)
    np.testing.assert_array_equal(noisy.numpy(), again.numpy())  # keyed by (seed, step)
    (silent,) = clipped_noisy_mean(zeros, 2.0, 1.5, 10, noise_seed=seed, add_noise=False)
    assert not np.any(silent.numpy())


def _cfg(out, strategy, **privacy):
    return C.from_dict(
        {
            "data": {"dataset": "mnist", "limit": 512, "global_batch_size": 64, "num_shards": 4},
            "model": {"name": "dp_cnn"},
            "runtime": {"strategy": strategy},
            "train": {
                "epochs": 2,
                "learning_rate": 0.05,
                "lr_schedule": "constant",
                "output_dir": str(out),
                "verbose": 0,
                "tensorboard": False,
            },
            "privacy": {"l2_clip": 1.0, **(privacy or {"noise": 1.1})},
        }
    )


def _step_under(strategy, noise, x, y, weights):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(3)]
        )
        model.set_weights(weights)
        model.compile(
            keras.optimizers.SGD(1.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
    make_private(model, 0.5, noise, len(x), seed=7)
    model.train_on_batch(x, y)
    return [w - w0 for w, w0 in zip(model.get_weights(), weights)]


def test_mirrored_adds_the_noise_once_its_step_is_one_devices():
    # The same global batch split over 2 replicas: each clips and sums its half, replica 0 alone
    # adds the noise, the all-reduce adds the halves: one_device's update, noise draw included.
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    weights = [rng.normal(size=s).astype(np.float32) * 0.5 for s in ((6, 5), (5,), (5, 3), (3,))]
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert two.num_replicas_in_sync == 2
    for noise in (0.0, 4.0):  # noise 4: the update is mostly noise, which must be drawn once
        a, b = _step_under(one, noise, x, y, weights), _step_under(two, noise, x, y, weights)
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-6)
    quiet = _step_under(one, 0.0, x, y, weights)
    assert max(np.abs(u - v).max() for u, v in zip(a, quiet)) > 0.05  # the noise is there


@pytest.mark.slow
def test_a_private_run_records_and_shows_what_it_spent(tmp_path):
    run = train(_cfg(tmp_path / "one", "one_device"))
    section = json.load(open(tmp_path / "one" / "run.json"))["train"]["privacy"]
    want = _direct(1.1, 64 / 512, 16, 1e-3)
    assert section["steps"] == 16 and section["delta"] == 1e-3  # below 1/512
    assert (section["epsilon_rdp"], section["epsilon_pld"]) == pytest.approx(
        (want["rdp"], want["pld"])
    )
    assert "Poisson" in section["sampling"] and run.to_dict()["train"]["privacy"] == section
    layers = section["per_example_gradients"]["layers"]
    assert sorted(layers) == ["conv0", "conv1", "fc", "logits"], layers
    assert all(how.startswith("ghost: ") for how in layers.values()), layers
    epsilons = [row["epsilon"] for row in json.load(open(tmp_path / "one" / "metrics.json"))]
    assert epsilons == pytest.approx([_direct(1.1, 0.125, s, 1e-3)["rdp"] for s in (8, 16)])
    # Pruning it fine-tunes on the same data without DP-SGD: said and recorded, never silent.
    from tfopt import load_run
    from tfopt.optimize import OptimizeSettings, PruneSpec, optimize

    settings = OptimizeSettings(
        technique="prune", prune=PruneSpec(sparsity=0.5), epochs=1, steps_per_epoch=2
    )
    cfg = load_run(str(tmp_path / "one")).config
    pruned = optimize(str(tmp_path / "one"), cfg, settings, out_dir=str(tmp_path / "pruned"))
    warning = f"was trained with DP-SGD (epsilon {section['epsilon']:.2f} at delta 0.001)"
    assert [w for w in pruned.warnings if warning in w and "does not cover" in w], pruned.warnings


@pytest.mark.slow
def test_without_noise_the_private_step_is_clipped_sgd_as_numpy_computes_it(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
    model.compile(
        keras.optimizers.SGD(1.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    before = [w.copy() for w in model.get_weights()]
    x = np.array([[1.0, 2, 3], [0.1, 0, 0], [-3, 4, 1]], np.float32)
    y = np.array([0, 1, 1])
    make_private(model, 0.5, 0.0, 3)
    model.train_on_batch(x, y)
    per_example = [[], []]
    for xi, yi in zip(x, y):  # numpy: softmax cross-entropy gradients of Dense(2)
        logits = xi @ before[0] + before[1]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        d = p - np.eye(2)[yi]
        per_example[0].append(np.outer(xi, d))
        per_example[1].append(d)
    mean = _numpy_dp_mean([np.array(g) for g in per_example], 0.5, 3)
    for w, b, g in zip(model.get_weights(), before, mean):
        np.testing.assert_allclose(w, b - g, rtol=1e-5, atol=1e-6)


def test_a_model_with_batch_normalization_is_refused_in_one_line():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(2)]
    )
    with pytest.raises(ModelError, match=r"BatchNormalization layer 'bn'.*--model dp_cnn"):
        make_private(model, 1.0, 1.0, 8)


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"l2_clip": 1.0, "noise": -1.0}, r"privacy.noise=-1.0 must be >= 0"),
        ({"noise": 1.0}, r"give --dp-l2-clip C too"),
        ({"l2_clip": 1.0}, r"without --dp-noise or --dp-epsilon"),
    ],
)
def test_bad_privacy_settings_are_one_line(settings, needle):
    with pytest.raises(ConfigError, match=needle):
        C.from_dict({"privacy": settings})


def _plan(**kw):
    settings = C.from_dict({"privacy": {"l2_clip": 1.0, **kw}}).privacy
    return make_plan(
        settings, examples=1000, batch=100, steps_per_epoch=10, epochs=5, strategy="one_device"
    )


def test_a_budget_the_planned_steps_exceed_and_a_delta_at_1_over_n_refuse_to_start():
    with pytest.raises(ConfigError, match=r"would spend .*; the budget allows \d+ epochs"):
        _plan(noise=0.8, epsilon=0.5)
    with pytest.raises(ConfigError, match=r"--dp-delta 0.001 is not below 1/N = 0.001"):
        _plan(noise=1.0, delta=1e-3)
    with pytest.raises(ConfigError, match=r"asynchronous steps"):
        make_plan(
            C.from_dict({"privacy": {"l2_clip": 1.0, "noise": 1.0}}).privacy,
            examples=1000,
            batch=100,
            steps_per_epoch=10,
            epochs=1,
            strategy="parameter_server",
        )
    plan = _plan(epsilon=3.0)  # the noise computed for the budget: the run spends at most it
    assert plan.spent(plan.steps)["rdp"] <= 3.0 and plan.noise_multiplier > 0
