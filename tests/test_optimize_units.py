"""tfopt.optimize pieces on small real tf_keras models: checkers, selection, policies, hooks, saving."""

from tfopt.core._keras import keras, tf

import numpy as np
import pytest
import tensorflow_model_optimization as tfmot

from tfopt.compress import cluster as cluster_lib
from tfopt.compress import prune as prune_lib
from tfopt.compress import quantize as quantize_lib
from tfopt.compress.common import OptimizeError, Selection, m_by_n_violations, rebuild, weight_table
from tfopt.optimize.inspect import format_report, inspect_model


def _cnn(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(8, 3, use_bias=False, name="conv0")(inputs)
    x = keras.layers.BatchNormalization(name="bn0")(x)
    x = keras.layers.ReLU(name="relu0")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(16, activation="relu", name="fc")(x)
    return keras.Model(
        inputs, keras.layers.Dense(4, dtype="float32", name="logits")(x), name="small"
    )


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 8, 8, 1), dtype=np.float32), rng.integers(0, 4, n)


def _fit(model, callbacks=(), steps=4):
    model.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    x, y = _data(16 * steps)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=list(callbacks))


def test_m_by_n_checker_uses_the_tflite_layout():
    dense = np.array(
        [[1, 0, 0, 2], [0, 3, 4, 0], [5, 6, 0, 0]], dtype=np.float32
    ).T  # [C_in=4, C_out=3]
    assert m_by_n_violations(dense, 2, 4) == (0, 3)
    dense[0, 0] = dense[1, 0] = 7.0  # output channel 0 now holds 1 zero in its 4 inputs
    assert m_by_n_violations(dense, 2, 4) == (1, 3)
    conv = np.zeros((3, 3, 6, 2), dtype=np.float32)  # C_in=6: groups [0:4] and [4:6]+2 zero pads
    conv[..., 0:2, :] = 1.0
    conv[..., 4, :] = 1.0
    assert m_by_n_violations(conv, 2, 4) == (0, 36)
    conv[0, 0, 2, 1] = 1.0  # one group of 4 with 3 non-zeros
    assert m_by_n_violations(conv, 2, 4) == (1, 36)
    from tensorflow_model_optimization.python.core.sparsity.keras.pruning_utils import (
        is_pruned_m_by_n,
    )

    # tfmot's own checker agrees on the same tensors
    assert not is_pruned_m_by_n(tf.constant(conv), (2, 4))
    conv[0, 0, 2, 1] = 0.0
    assert is_pruned_m_by_n(tf.constant(conv), (2, 4))


@pytest.mark.slow
def test_prune_2of4_every_group_of_4_holds_2_zeros_after_strip():
    model = rebuild(_cnn(), "float32")
    spec = prune_lib.PruneSpec(m_by_n=(2, 4)).validate()
    wrapped = prune_lib.wrap(model, spec, total_steps=4)
    _fit(wrapped, prune_lib.callbacks(None))
    stripped = prune_lib.strip(wrapped)
    report = prune_lib.check_m_by_n(stripped, (2, 4), prune_lib.prunable_names(_cnn(), spec))
    assert report["ok"] and set(report["layers"]) == {"conv0", "fc", "logits"}, report
    from tensorflow_model_optimization.python.core.sparsity.keras.pruning_utils import (
        is_pruned_m_by_n,
    )

    for name in ("fc", "logits"):
        assert is_pruned_m_by_n(stripped.get_layer(name).kernel, (2, 4))
    # the checker is not vacuous: the unpruned model fails it
    assert not prune_lib.check_m_by_n(_cnn(), (2, 4))["ok"]


@pytest.mark.slow
def test_polynomial_schedule_reaches_target_and_table_reads_stripped_weights(tmp_path):
    spec = prune_lib.PruneSpec(
        sparsity=0.75, schedule="polynomial", frequency=1, selection=Selection(types=("Dense",))
    ).validate()
    assert isinstance(spec.make_schedule(6), tfmot.sparsity.keras.PolynomialDecay)
    assert spec.make_schedule(6).get_config()["config"]["end_step"] == 4  # the last third recovers
    wrapped = prune_lib.wrap(rebuild(_cnn(), "float32"), spec, total_steps=6)
    _fit(wrapped, prune_lib.callbacks(str(tmp_path / "tb")), steps=6)
    rows = {r.layer: r for r in weight_table(prune_lib.strip(wrapped))}
    assert rows["fc"].sparsity == pytest.approx(0.75, abs=0.01)
    assert rows["logits"].sparsity == pytest.approx(0.75, abs=0.02)
    assert rows["conv0"].sparsity == 0.0  # not selected
    assert list(tmp_path.glob("tb/**/events.out.tfevents.*")), (
        "PruningSummaries wrote no TensorBoard events"
    )


@pytest.mark.slow
def test_block_pruning_zeroes_whole_dense_blocks_and_leaves_convolutions_unstructured():
    spec = prune_lib.PruneSpec(
        sparsity=0.75, schedule="constant", frequency=1, block_size=(4, 1)
    ).validate()
    wrapped = prune_lib.wrap(rebuild(_cnn(), "float32"), spec, total_steps=4)
    _fit(wrapped, prune_lib.callbacks(None), steps=4)
    stripped = prune_lib.strip(wrapped)
    names = prune_lib.prunable_names(_cnn(), spec)
    report = prune_lib.check_blocks(stripped, (4, 1), names)
    assert report["ok"] and set(report["layers"]) == {"fc", "logits"}, report
    fc = stripped.get_layer("fc").kernel.numpy()  # [288, 16]: blocks of 4 consecutive inputs
    assert np.all((fc.reshape(72, 4, 16) == 0).sum(axis=1) % 4 == 0)
    assert (fc == 0).mean() == pytest.approx(0.75, abs=0.01)
    assert (stripped.get_layer("conv0").kernel.numpy() == 0).mean() == pytest.approx(0.75, abs=0.03)
    # The checker fails on an unstructured kernel of the same sparsity.
    assert not prune_lib.check_blocks(_unstructured(stripped), (4, 1), ["fc"])["ok"]
    with pytest.raises(
        OptimizeError, match=r"block_size=\(4, 1\) and m_by_n=\(2, 4\) exclude each other"
    ):
        prune_lib.PruneSpec(block_size=(4, 1), m_by_n=(2, 4)).validate()
    with pytest.raises(OptimizeError, match=r"block_size=\(0, 1\) must be two integers >= 1"):
        prune_lib.PruneSpec(block_size=(0, 1)).validate()


def _unstructured(model):
    layer = model.get_layer("fc")
    kernel, bias = layer.get_weights()
    rng = np.random.default_rng(0)
    layer.set_weights(
        [np.where(rng.random(kernel.shape) < 0.75, 0.0, 1.0).astype(np.float32), bias]
    )
    return model


def test_selection_errors_name_the_valid_choices():
    model = _cnn()
    with pytest.raises(
        OptimizeError, match=r"layer 'conv9' is not in model 'small'; layers: image, conv0"
    ):
        prune_lib.prunable_names(model, prune_lib.PruneSpec(selection=Selection(names=("conv9",))))
    with pytest.raises(OptimizeError, match=r"layer type 'LSTM' is not in model"):
        cluster_lib.clusterable_names(
            model, cluster_lib.ClusterSpec(selection=Selection(types=("LSTM",)))
        )
    with pytest.raises(OptimizeError, match=r"sparsity=1.5 must be in \[0, 1\)"):
        prune_lib.PruneSpec(sparsity=1.5).validate()
    with pytest.raises(
        OptimizeError, match=r"centroid init 'best' is not valid; choose one of kmeans_plus_plus"
    ):
        cluster_lib.ClusterSpec(init="best").validate()


def _xnnpack_net():
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.ZeroPadding2D(1)(inputs)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="valid", name="stem")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(16, 1, name="pw")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(x))


def test_xnnpack_policy_prunes_only_1x1_convs_and_refuses_other_models():
    spec = prune_lib.PruneSpec(policy="xnnpack")
    assert prune_lib.prunable_names(_xnnpack_net(), spec) == ["pw"]
    with pytest.raises(
        OptimizeError,
        match="pruning policy 'xnnpack' does not fit model 'small'.*use --policy none",
    ):
        prune_lib.prunable_names(_cnn(), spec)


@pytest.mark.slow
def test_cluster_per_channel_and_sparsity_preserving_verified_from_weights():
    spec = cluster_lib.ClusterSpec(
        clusters=4, per_channel=True, selection=Selection(names=("conv0",))
    ).validate()
    # tfmot would silently skip a bias-less Conv2D here; tfopt says so
    with pytest.raises(
        OptimizeError, match="'conv0': tfmot skips per-channel clustering of a Conv2D without bias"
    ):
        cluster_lib.clusterable_names(_cnn(), spec)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Flatten()(keras.layers.Conv2D(8, 3, name="conv0")(inputs))
    with_bias = keras.Model(inputs, keras.layers.Dense(4, name="logits")(x))
    wrapped = cluster_lib.wrap(rebuild(with_bias, "float32"), spec)
    _fit(wrapped)
    stripped = cluster_lib.strip(wrapped)
    report = cluster_lib.check_clusters(stripped, spec, ["conv0"])
    row = report["layers"]["conv0"]
    assert (
        report["ok"] and row["per_channel"] and row["unique_per_channel_max"] <= 4 < row["unique"]
    ), report
    # sparsity-preserving clustering keeps the zeros of a pruned kernel
    base = _cnn()
    kernel = base.get_layer("fc").kernel.numpy()
    kernel[np.abs(kernel) < np.quantile(np.abs(kernel), 0.5)] = 0.0
    base.get_layer("fc").kernel.assign(kernel)
    spec = cluster_lib.ClusterSpec(
        clusters=8, preserve_sparsity=True, selection=Selection(names=("fc",))
    )
    wrapped = cluster_lib.wrap(rebuild(base, "float32"), spec)
    _fit(wrapped)
    after = cluster_lib.strip(wrapped).get_layer("fc").kernel.numpy()
    assert np.all(after[kernel == 0] == 0) and len(np.unique(after)) <= 8


def test_rebuild_sets_per_layer_precision_and_keeps_outputs_float32():
    model = rebuild(_cnn(), "mixed_bfloat16", float32_layers=("fc",))
    dtypes = {layer.name: layer.dtype_policy.name for layer in model.layers[1:]}
    assert (
        dtypes["conv0"] == "mixed_bfloat16"
        and dtypes["fc"] == "float32"
        and dtypes["logits"] == "float32"
    )
    x, _ = _data(4)
    expected = _cnn().predict(x, verbose=0)
    np.testing.assert_allclose(
        rebuild(_cnn(), "float32").predict(x, verbose=0), expected, atol=1e-6
    )


def test_inspect_reports_reasons_and_one_sentence_for_unsupported_models():
    report = inspect_model(_cnn())
    rows = {r.layer: r for r in report.layers}
    assert rows["conv0"].prune == rows["conv0"].quantize == rows["conv0"].cluster == "yes"
    assert rows["bn0"].quantize == "yes"  # folded into conv0 by tfmot's Conv2D+BN pattern
    assert rows["relu0"].prune == "no weights"
    conv0 = _cnn().get_layer(
        "conv0"
    )  # low-rank: the largest rank whose pair costs less, counted by hand
    rows_, cols = int(np.prod(conv0.kernel.shape[:-1])), int(conv0.kernel.shape[-1])
    assert (
        rows["conv0"].low_rank
        == f"yes: rank <= {(rows_ * cols - 1) // (rows_ + cols)} of {min(rows_, cols)}"
    )
    assert rows["conv0"].macs == int(np.prod(conv0.output_shape[1:])) * rows_
    assert rows["relu0"].low_rank == "-" and rows["relu0"].macs == 0
    assert " low_rank" in format_report(report).splitlines()[1]
    assert (
        rows["conv0"].channels == "yes"
        and rows["relu0"].channels == "-"
        and report.model == _cnn().name
    )
    assert rows[_cnn().layers[-1].name].channels.startswith(
        "no: kept whole, its channels reach "
    )  # the output

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(2)

        def call(self, x):
            return self.d(x)

    text = format_report(inspect_model(Sub()))
    assert text.count("\n") == 0 and "subclassed model" in text and "functional parts" in text
    import keras as keras3  # Keras 3: what `tf.keras` is in TF 2.21

    k3 = keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(2)])
    text = format_report(inspect_model(k3))
    assert text.count("\n") == 0 and "Keras 3" in text and "tf_keras" in text


@keras.utils.register_keras_serializable("tfopt_test")
class Scale(keras.layers.Layer):
    """A custom layer tfmot knows nothing about: y = x * scale (per feature)."""

    def build(self, input_shape):
        self.scale = self.add_weight("scale", shape=(input_shape[-1],), initializer="ones")
        super().build(input_shape)  # marks it built: a .keras reload then builds it once

    def call(self, x):
        return x * self.scale


class ScaleQuantizeConfig(tfmot.quantization.keras.QuantizeConfig):
    def get_weights_and_quantizers(self, layer):
        return [
            (
                layer.scale,
                tfmot.quantization.keras.quantizers.LastValueQuantizer(
                    num_bits=8, symmetric=True, narrow_range=False, per_axis=False
                ),
            )
        ]

    def get_activations_and_quantizers(self, layer):
        return []

    def set_quantize_weights(self, layer, quantize_weights):
        layer.scale = quantize_weights[0]

    def set_quantize_activations(self, layer, quantize_activations):
        pass

    def get_output_quantizers(self, layer):
        return [
            tfmot.quantization.keras.quantizers.MovingAverageQuantizer(
                num_bits=8, per_axis=False, symmetric=False, narrow_range=False
            )
        ]

    def get_config(self):
        return {}


def _custom_model():
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(16, name="fc")(x)
    x = Scale(name="scale")(x)
    return keras.Model(inputs, keras.layers.Dense(4, name="logits")(x))


@pytest.mark.slow
def test_custom_layer_gets_a_quantize_config_through_the_hook(tmp_path):
    model = _custom_model()
    assert (
        inspect_model(model)
        .layers[2]
        .quantize.startswith(
            "no: the default 8-bit scheme has no QuantizeConfig for Scale; give it one with"
        )
    )
    with pytest.raises(OptimizeError, match="layer 'scale': the default 8-bit scheme"):
        quantize_lib.quantizable_names(
            model, quantize_lib.QatSpec(selection=Selection(names=("scale",)))
        )
    quantize_lib.register_quantize_config(Scale, ScaleQuantizeConfig)
    try:
        assert inspect_model(model).layers[2].quantize == "yes"
        names = quantize_lib.quantizable_names(model, quantize_lib.QatSpec())
        qat = quantize_lib.wrap(rebuild(model, "float32"), quantize_lib.QatSpec(), names)
        wrapped = qat.get_layer("quant_scale")
        assert isinstance(wrapped.quantize_config, ScaleQuantizeConfig)
        _fit(qat)
        copy = quantize_lib.savable_copy(qat, rebuild(model, "float32"), names)
        x, _ = _data(8)
        np.testing.assert_allclose(copy.predict(x, verbose=0), qat.predict(x, verbose=0), atol=1e-5)
        copy.save(tmp_path / "m.keras")
        with quantize_lib.quantize_scope():
            again = keras.models.load_model(tmp_path / "m.keras")
        np.testing.assert_allclose(
            again.predict(x, verbose=0), qat.predict(x, verbose=0), atol=1e-5
        )
    finally:
        quantize_lib.unregister_quantize_config(Scale)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["default", "prune_preserve", "cluster_preserve"])
def test_qat_copies_reload_from_keras_format(tmp_path, scheme):
    base = rebuild(_cnn(), "float32")
    if scheme == "prune_preserve":
        wrapped = prune_lib.wrap(
            base, prune_lib.PruneSpec(sparsity=0.5, frequency=1), total_steps=2
        )
        _fit(wrapped, prune_lib.callbacks(None), steps=2)
        base = rebuild(prune_lib.strip(wrapped), "float32")
    elif scheme == "cluster_preserve":
        wrapped = cluster_lib.wrap(base, cluster_lib.ClusterSpec(clusters=8))
        _fit(wrapped, steps=2)
        base = rebuild(cluster_lib.strip(wrapped), "float32")
    spec = quantize_lib.QatSpec(scheme)
    names = quantize_lib.quantizable_names(base, spec)
    qat = quantize_lib.wrap(rebuild(base, "float32"), spec, names)
    _fit(qat, steps=2)
    copy = quantize_lib.savable_copy(qat, rebuild(base, "float32"), names)
    x, _ = _data(8)
    expected = qat.predict(x, verbose=0)
    np.testing.assert_allclose(copy.predict(x, verbose=0), expected, atol=1e-5)
    path = str(tmp_path / "qat.keras")
    copy.save(path)
    again = quantize_lib.load_quantized_model(path)
    np.testing.assert_allclose(again.predict(x, verbose=0), expected, atol=1e-5)
    after = quantize_lib.inner_float_model(again, rebuild(base, "float32"))
    if scheme == "prune_preserve":  # zeros survive QAT
        assert (after.get_layer("fc").kernel.numpy() == 0).mean() >= 0.5
    if scheme == "cluster_preserve":  # values survive QAT (per tensor for Dense)
        assert len(np.unique(after.get_layer("fc").kernel.numpy())) <= 8
