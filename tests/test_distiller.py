"""The Distiller: its loss against numpy, equivalences that pin it down, frozen teachers, strategies, tfmot."""

from tfopt.core._keras import keras, tf

import numpy as np
import pytest

from tfopt import config as C
from tfopt.core.errors import ConfigError, ModelError
from tfopt.data import pipeline, sources
from tfopt.models.distiller import (
    Distiller,
    FeaturePair,
    accuracy_weights,
    distillation_terms,
    teacher_log_probs,
)
from tfopt.models.io import load_model
from tfopt.models.registry import build_model
from tfopt.runs import load_run
from tfopt.runtime.strategy import make_strategy

SCCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# -- numpy reference ---------------------------------------------------------------------------


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _np_loss(labels, student, teachers, weights, T, alpha, combine="probs"):
    """Per-example alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE, in float64."""
    student, teachers = np.float64(student), [np.float64(t) for t in teachers]
    weights = np.asarray(weights, np.float64) / np.sum(weights)
    if combine == "probs":
        p = sum(w * np.exp(_log_softmax(t / T)) for w, t in zip(weights, teachers))
    else:
        p = np.exp(_log_softmax(sum(w * t for w, t in zip(weights, teachers)) / T))
    kl = np.sum(p * (np.log(p) - _log_softmax(student / T)), axis=-1)
    ce = -_log_softmax(student)[np.arange(len(labels)), labels]
    return alpha * T * T * kl + (1 - alpha) * ce, T * T * kl, ce


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist():
    """3,000 real MNIST training images and labels (the slice the train tests use)."""
    cfg = C.DataConfig(dataset="mnist", limit=3000, num_shards=4, global_batch_size=500)
    xs, ys = zip(*pipeline.make_dataset(cfg, "train", training=False, info=sources.prepare(cfg)))
    return np.concatenate(xs), np.concatenate(ys)


def _student(seed=0, name="tiny_cnn"):
    keras.utils.set_random_seed(seed)
    return build_model(name, (28, 28, 1), 10, dropout=0.0)


def _data(mnist, n=256, batch=64):
    x, y = mnist
    return tf.data.Dataset.from_tensor_slices((x[:n], y[:n])).batch(batch)


def _dense(seed, name):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(10, input_shape=(4,))], name=name)


# -- the loss ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("combine", ["probs", "logits"])
@pytest.mark.parametrize("n_teachers, weights", [(1, [1.0]), (2, [0.7, 0.3]), (3, [1.0, 2.0, 1.0])])
def test_loss_equals_numpy_hand_computation(combine, n_teachers, weights):
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 10, size=16)
    student = rng.normal(0, 3, size=(16, 10)).astype(np.float32)
    teachers = [rng.normal(0, 5, size=(16, 10)).astype(np.float32) for _ in range(n_teachers)]
    d = Distiller(
        _dense(1, "s"),
        [_dense(i + 2, f"t{i}") for i in range(n_teachers)],
        temperature=3.0,
        alpha=0.8,
        teacher_weights=weights,
        combine=combine,
    )
    terms = d.loss_terms(labels, student, teachers)
    total, dist, ce = _np_loss(labels, student, teachers, weights, 3.0, 0.8, combine)
    np.testing.assert_allclose(terms["total"].numpy(), total, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(terms["distillation"].numpy(), dist, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(terms["student"].numpy(), ce, rtol=1e-5, atol=1e-5)


def test_loss_terms_edge_cases():
    labels = np.array([3, 1])
    z = np.array([[0.0] * 10, [50.0] + [-50.0] * 9], np.float32)
    # A student equal to its teacher has KL 0, and a zero-probability class contributes 0 (not NaN).
    terms = distillation_terms(labels, z, teacher_log_probs([z], [1.0], 1.0), 1.0)
    np.testing.assert_allclose(terms["kl"].numpy(), [0.0, 0.0], atol=1e-6)
    logp = teacher_log_probs([z, -z], [1.0, 0.0], 2.0)  # a zero-weight teacher drops out exactly
    np.testing.assert_array_equal(logp.numpy(), tf.nn.log_softmax(z / 2.0).numpy())
    assert (
        accuracy_weights([0.99, 0.98], 10)[0] > 0.52
        and accuracy_weights([0.99, 0.1], 10)[1] < 1e-12
    )
    with pytest.raises(ConfigError, match="at or below chance"):
        accuracy_weights([0.1, 0.05], 10)


@pytest.mark.slow
def test_fit_reports_the_numpy_loss_averaged_over_the_global_batch(mnist, mnist_run):
    teacher = load_model(load_run(mnist_run).model_path)
    student = _student()
    x, y = mnist[0][:192], mnist[1][:192]
    expected, dist, ce = _np_loss(
        y, student.predict(x, verbose=0), [teacher.predict(x, verbose=0)], [1.0], 4.0, 0.9
    )
    d = Distiller(student, teacher, temperature=4.0, alpha=0.9)
    d.compile(keras.optimizers.SGD(0.0))  # no update: the epoch mean is over fixed logits
    hist = d.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=1, verbose=0).history
    assert hist["loss"][0] == pytest.approx(expected.mean(), rel=1e-4)
    assert hist["distillation_loss"][0] == pytest.approx(dist.mean(), rel=1e-4)
    assert hist["student_loss"][0] == pytest.approx(ce.mean(), rel=1e-4)


# -- equivalences ------------------------------------------------------------------------------


@pytest.mark.slow
def test_alpha_zero_equals_plain_training(mnist, mnist_run):
    teacher = load_model(load_run(mnist_run).model_path)
    plain, student = _student(3), _student(3)
    plain.compile(keras.optimizers.Adam(1e-3), SCCE, metrics=["accuracy"])
    h_plain = plain.fit(_data(mnist), epochs=2, verbose=0).history
    d = Distiller(student, teacher, alpha=0.0)
    d.compile(keras.optimizers.Adam(1e-3))
    h_dist = d.fit(_data(mnist), epochs=2, verbose=0).history
    for a, b in zip(plain.get_weights(), student.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_dist["loss"], h_plain["loss"], rtol=1e-5)
    np.testing.assert_allclose(h_dist["accuracy"], h_plain["accuracy"])


@pytest.mark.slow
def test_a_zero_weight_teacher_changes_nothing(mnist, mnist_run):
    good = load_model(load_run(mnist_run).model_path)
    other = _student(9, "mlp")  # an untrained second teacher, weighted 0
    runs = []
    for teachers, weights in (([good], None), ([good, other], [1.0, 0.0])):
        student = _student(4)
        d = Distiller(student, teachers, teacher_weights=weights)
        d.compile(keras.optimizers.Adam(1e-3))
        runs.append(
            (d.fit(_data(mnist, 128), epochs=1, verbose=0).history["loss"], student.get_weights())
        )
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-6)
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_mirrored_two_replicas_equals_one_device(mnist, mnist_run):
    """SGD is not scale-invariant: a wrong per-replica reduction would double or halve the update."""
    results = []
    for name in ("one_device", "mirrored"):
        strategy = make_strategy(C.RuntimeConfig(strategy=name), None)
        with strategy.scope():
            teacher = load_model(load_run(mnist_run).model_path)
            student = _student(5)
            d = Distiller(student, teacher, temperature=2.0, alpha=0.7)
            d.compile(keras.optimizers.SGD(0.05))
        assert strategy.num_replicas_in_sync == (2 if name == "mirrored" else 1)
        hist = d.fit(_data(mnist, 256, 64), epochs=2, verbose=0).history
        results.append((hist, d.student_weights()))
    (h1, w1), (h2, w2) = results
    np.testing.assert_allclose(h1["loss"], h2["loss"], rtol=1e-4)
    np.testing.assert_allclose(h1["accuracy"], h2["accuracy"])
    for a, b in zip(w1, w2):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not np.allclose(w1[0], _student(5).get_weights()[0])  # it did train


# -- frozen teachers ---------------------------------------------------------------------------


@pytest.mark.slow
def test_teachers_stay_frozen_and_a_change_is_caught(mnist, mnist_run):
    teacher = load_model(load_run(mnist_run).model_path)
    before = [w.copy() for w in teacher.get_weights()]  # includes batch-norm moving statistics
    d = Distiller(_student(), teacher)
    d.compile()
    d.fit(_data(mnist, 128), epochs=1, verbose=0)
    for a, b in zip(before, teacher.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert (
        not teacher.trainable
        and d.teacher_digests() == Distiller(_student(), teacher).teacher_digests()
    )

    class Tamper(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            teacher.get_layer("logits").bias.assign_add(tf.ones(10))

    with pytest.raises(ModelError, match=r"teacher\(s\) \[0\] changed during fit"):
        d.fit(_data(mnist, 64), epochs=1, verbose=0, callbacks=[Tamper()])


# -- student-only evaluation, prediction and saving ---------------------------------------------


@pytest.mark.slow
def test_evaluate_predict_and_save_use_the_student_alone(mnist, mnist_run, tmp_path):
    teacher = load_model(load_run(mnist_run).model_path)
    student = _student(6)
    d = Distiller(student, teacher)
    d.compile()
    d.fit(_data(mnist, 256), epochs=1, verbose=0)
    x, y = mnist[0][2000:2500], mnist[1][2000:2500]
    got = d.evaluate(x, y, batch_size=100, return_dict=True, verbose=0)
    student.compile(loss=SCCE, metrics=["accuracy"])
    want = student.evaluate(x, y, batch_size=100, return_dict=True, verbose=0)
    assert set(got) == {"loss", "accuracy"}
    assert (
        got["loss"] == pytest.approx(want["loss"], rel=1e-5) and got["accuracy"] == want["accuracy"]
    )
    np.testing.assert_allclose(d.predict(x, verbose=0), student.predict(x, verbose=0), rtol=1e-6)
    d.save(str(tmp_path / "student.keras"))
    loaded = load_model(str(tmp_path / "student.keras"))
    assert loaded.name == "tiny_cnn" and loaded.count_params() == student.count_params()
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), student.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )


# -- several teachers, feature distillation ----------------------------------------------------


@pytest.mark.slow
def test_multi_teacher_weights_from_validation_accuracy(mnist, mnist_run):
    strong = load_model(load_run(mnist_run).model_path)
    weak = _student(8)
    weak.compile(keras.optimizers.Adam(1e-3), SCCE, metrics=["accuracy"])
    weak.fit(_data(mnist, 128, 32), epochs=1, verbose=0)  # 4 steps: clearly worse than the CNN
    xv, yv = mnist[0][2500:], mnist[1][2500:]
    accs = [float(np.mean(np.argmax(t.predict(xv, verbose=0), -1) == yv)) for t in (strong, weak)]
    weights = accuracy_weights(accs, 10)
    assert accs[0] > accs[1] and weights[0] > weights[1] and sum(weights) == pytest.approx(1.0)
    student = _student(10)
    d = Distiller(student, [strong, weak], teacher_weights=weights, temperature=4.0, alpha=0.9)
    d.compile(keras.optimizers.Adam(3e-3))
    hist = d.fit(_data(mnist, 2000, 64), epochs=2, verbose=0).history
    assert hist["distillation_loss"][1] < hist["distillation_loss"][0]
    acc = float(np.mean(np.argmax(student.predict(xv, verbose=0), -1) == yv))
    assert acc > 0.6, acc  # chance is 0.1; 64 steps of a 20k-parameter student


@pytest.mark.slow
def test_feature_distillation_with_a_learned_projection(mnist, mnist_run):
    teacher = load_model(load_run(mnist_run).model_path)
    student = _student(11, "mobilenet_tiny")
    # pool0 (14x14x32) <- stem_relu (14x14x16): a learned 1x1 projection; block0_pw_relu is 32 wide already.
    d = Distiller(
        student,
        teacher,
        features=[("pool0", "stem_relu"), FeaturePair("pool0", "block0_pw_relu")],
        feature_weight=2.0,
    )
    assert [p.name for p in d.projections] == ["feature_projection0"]
    assert d.projections[0].kernel.shape == (1, 1, 16, 32)
    d.compile(keras.optimizers.Adam(3e-3))
    hist = d.fit(_data(mnist, 512, 64), epochs=2, verbose=0).history
    assert hist["feature_loss"][1] < hist["feature_loss"][0]
    assert (
        len(d.trainable_weights) == len(student.trainable_weights) + 2
    )  # + projection kernel and bias
    plain = d.plain_student()
    assert plain.count_params() == build_model("mobilenet_tiny", (28, 28, 1), 10).count_params()
    with pytest.raises(ModelError, match="spatial sizes differ"):
        Distiller(_student(), teacher, features=[("pool1", "conv0")])
    with pytest.raises(ModelError, match="has no layer 'nope'; choose one of"):
        Distiller(_student(), teacher, features=[("nope", "conv0")])


# -- a tfmot-wrapped student -------------------------------------------------------------------


def _save_compressed(distiller, out):
    from tfopt.compress.student import plain_copy
    from tfopt.models.io import save_model

    return save_model(plain_copy(distiller.student), str(out))


@pytest.mark.slow
def test_prune_wrapped_student_distils_then_strips_and_saves(mnist, mnist_run, tmp_path):
    import tensorflow_model_optimization as tfmot

    teacher = load_model(load_run(mnist_run).model_path)
    schedule = tfmot.sparsity.keras.ConstantSparsity(0.75, begin_step=0, frequency=1)
    wrapped = tfmot.sparsity.keras.prune_low_magnitude(_student(12), pruning_schedule=schedule)
    d = Distiller(wrapped, teacher)
    d.compile(keras.optimizers.Adam(1e-3))
    d.fit(
        _data(mnist, 256), epochs=1, verbose=0, callbacks=[tfmot.sparsity.keras.UpdatePruningStep()]
    )
    _save_compressed(
        d, tmp_path / "out"
    )  # compression-specific stripping and saving: tfopt.optimize
    loaded = load_model(str(tmp_path / "out"))  # safe mode: a leftover tfmot class would be refused
    assert not [l for l in loaded.layers if "tensorflow_model_optimization" in type(l).__module__]
    assert [l.name for l in loaded.layers] == [l.name for l in _student().layers]
    for name in ("conv0", "logits"):
        assert np.mean(loaded.get_layer(name).kernel.numpy() == 0) == pytest.approx(
            0.75, abs=0.01
        ), name
    x = mnist[0][:200]
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), wrapped.predict(x, verbose=0), rtol=1e-5, atol=1e-5
    )
    assert (tmp_path / "out" / "saved_model").is_dir()


# -- argument checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({"temperature": 0.0}, ConfigError, "temperature=0.0 must be > 0"),
        ({"alpha": 1.5}, ConfigError, "alpha=1.5 must be in [0, 1]"),
        ({"combine": "mean"}, ConfigError, "choose one of probs, logits"),
        ({"teacher_weights": [1.0, 1.0]}, ConfigError, "must be 1 non-negative numbers"),
        ({"features": [("a", "b", 3)]}, ConfigError, "names teacher 3"),
    ],
)
def test_bad_arguments_say_what_to_do(kwargs, error, needle):
    with pytest.raises(error) as e:
        Distiller(_dense(0, "s"), _dense(1, "t"), **kwargs)
    assert needle in str(e.value)


def test_class_mismatch_and_compile_loss_are_refused():
    other = keras.Sequential([keras.layers.Dense(5, input_shape=(4,))], name="five")
    with pytest.raises(ModelError, match="disagree on the number of classes"):
        Distiller(_dense(0, "s"), other)
    d = Distiller(_dense(0, "s"), _dense(1, "t"))
    with pytest.raises(ConfigError, match="takes no loss"):
        d.compile("adam", loss="mse")


@pytest.mark.slow
def test_cluster_wrapped_student_distils_then_strips(mnist, mnist_run, tmp_path):
    import tensorflow_model_optimization as tfmot

    teacher = load_model(load_run(mnist_run).model_path)
    clustered = tfmot.clustering.keras.cluster_weights(
        _student(13),
        number_of_clusters=8,
        cluster_centroids_init=tfmot.clustering.keras.CentroidInitialization.KMEANS_PLUS_PLUS,
    )
    d = Distiller(clustered, teacher)
    d.compile(keras.optimizers.Adam(1e-3))
    d.fit(_data(mnist, 256), epochs=1, verbose=0)
    _save_compressed(
        d, tmp_path / "out"
    )  # compression-specific stripping and saving: tfopt.optimize
    loaded = load_model(str(tmp_path / "out"))
    assert [l.name for l in loaded.layers] == [l.name for l in _student().layers]
    for name in ("conv0", "logits"):
        assert len(np.unique(loaded.get_layer(name).kernel.numpy())) <= 8, name


@pytest.mark.slow
def test_qat_wrapped_student_distils_saves_reloads_and_converts_to_int8(mnist, mnist_run, tmp_path):
    from tfopt.compress.quantize import QatSpec, load_quantized_model, wrap
    from tfopt.export.evaluate import TFLiteModel
    from tfopt.export.tflite import convert

    teacher = load_model(load_run(mnist_run).model_path)
    qat = wrap(_student(14), QatSpec())
    d = Distiller(qat, teacher)
    d.compile(keras.optimizers.Adam(1e-3))
    d.fit(_data(mnist, 512), epochs=1, verbose=0)
    _save_compressed(
        d, tmp_path / "out"
    )  # compression-specific stripping and saving: tfopt.optimize
    loaded = load_quantized_model(
        str(tmp_path / "out" / "model.keras")
    )  # the reload tfmot 0.8.1 alone fails
    x = mnist[0][:200]
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), qat.predict(x, verbose=0), rtol=1e-5, atol=1e-5
    )
    converted = convert(loaded, "int8")  # QAT: int8 from the learned ranges, no calibration data
    assert converted.qat
    lite = TFLiteModel(converted.content)
    agree = np.mean(lite.predict(x).argmax(-1) == loaded.predict(x, verbose=0).argmax(-1))
    assert agree >= 0.97, agree
