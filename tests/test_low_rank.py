"""Low-rank factorization: exact surgery at full rank, ranks as numpy chooses them, FLOPs counted twice."""

from tfopt.core._keras import keras

import numpy as np
import pytest

from tfopt.compress import low_rank as lr
from tfopt.compress.common import OptimizeError, Selection
from tfopt.compress.flops import model_macs
from tfopt.compress.surgery import Graph
from tfopt.export.benchmark import keras_cost

L = keras.layers


def _randomize(model, seed=0):
    """Random weights; batch norms' moving variances positive (a negative one makes every output NaN,
    and NaN == NaN to ``assert_allclose``)."""
    rng = np.random.default_rng(seed)
    values = []
    for w in model.weights:
        v = rng.normal(size=w.shape).astype("float32") * 0.3
        values.append(np.abs(v) + 0.5 if "moving_variance" in w.name else v)
    model.set_weights(values)
    return model


def _graph_model():
    """Every Conv2D / Dense setting the surgery carries over, inside residual and concatenating branches."""
    x = inputs = keras.Input((12, 12, 3))
    x = L.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="strided")(x)
    y = L.Conv2D(16, 3, padding="same", use_bias=False, name="branch")(x)
    y = L.BatchNormalization(name="bn")(y)
    x = L.Add(name="add")([x, y])  # the factorized layer's consumer is a residual join
    z = L.Conv2D(8, 3, dilation_rate=2, padding="valid", name="dilated")(x)
    w = L.Conv2D(8, 1, name="pointwise")(x)
    x = L.Concatenate(name="cat")([L.Cropping2D(2, name="crop")(w), z])
    x = L.Conv2D(6, (3, 2), padding="same", data_format="channels_last", name="rect")(x)
    seq = L.Reshape((-1, 6), name="tokens")(x)
    seq = L.Dense(20, activation="tanh", name="per_token")(seq)  # Dense over a 3-D input
    x = L.Flatten(name="flat")(seq)
    x = L.Dense(24, activation="relu", name="fc")(x)
    return keras.Model(inputs, [L.Dense(5, name="logits")(x), seq], name="graph")


def _full_ranks(model):
    cands, _ = lr.candidates(model, lr.LowRankSpec())
    return {c.name: min(c.matrix.shape) for c in cands}


def test_full_rank_factorization_computes_what_the_model_did():
    model = _randomize(_graph_model())
    x = np.random.default_rng(1).normal(size=(4, 12, 12, 3)).astype("float32")
    ranks = _full_ranks(model)
    assert set(ranks) == {
        "strided",
        "branch",
        "dilated",
        "pointwise",
        "rect",
        "per_token",
        "fc",
        "logits",
    }
    factored = lr.factorize(model, ranks)
    assert {f"{n}_lr" for n in ranks} <= {layer.name for layer in factored.layers}
    assert not any(
        isinstance(layer, keras.Model) for layer in factored.layers
    )  # flat: QAT can take it
    for before, after in zip(model(x, training=False), factored(x, training=False)):
        assert np.isfinite(before.numpy()).all()
        np.testing.assert_allclose(after.numpy(), before.numpy(), atol=1e-5, rtol=1e-5)
    # the first layer of each pair has no bias and no activation; the second keeps the original's
    first, second = factored.get_layer("strided_lr"), factored.get_layer("strided")
    assert not first.use_bias and first.activation.__name__ == "linear" and first.strides == (2, 2)
    assert second.kernel_size == (1, 1) and second.activation.__name__ == "relu" and second.use_bias


def test_spatial_factorization_at_full_rank_computes_what_the_model_did():
    """k x 1 then 1 x k: strides, "same" and "valid" padding and dilation split between the two."""
    model = _randomize(_graph_model())
    x = np.random.default_rng(2).normal(size=(4, 12, 12, 3)).astype("float32")
    cands, _ = lr.candidates(model, lr.LowRankSpec(conv="spatial"))
    ranks = {c.name: min(c.matrix.shape) for c in cands}
    factored = lr.factorize(model, ranks, conv="spatial")
    for before, after in zip(model(x, training=False), factored(x, training=False)):
        assert np.isfinite(before.numpy()).all()
        np.testing.assert_allclose(after.numpy(), before.numpy(), atol=1e-5, rtol=1e-5)
    first, second = factored.get_layer("strided_lr"), factored.get_layer("strided")
    assert first.kernel_size == (3, 1) and first.strides == (2, 1) and second.kernel_size == (1, 3)
    assert second.strides == (1, 2) and factored.get_layer("dilated_lr").dilation_rate == (2, 1)
    assert factored.get_layer("rect").kernel_size == (1, 2)  # (3, 2): a k x 1 then a 1 x k too
    assert factored.get_layer("pointwise").kernel_size == (1, 1)  # a 1 x 1 kernel splits pointwise
    # every candidate's multiply-adds at its rank are what the factorized model counts
    counted = model_macs(factored)
    for c in cands:
        assert counted[c.name + "_lr"] + counted[c.name] == c.macs_at(ranks[c.name]), c.name


def test_a_spatial_flops_budget_is_met_and_counted_again():
    model = _randomize(_graph_model())
    spec = lr.LowRankSpec(flops=0.6, conv="spatial")
    plan = lr.plan(model, spec)
    factored = lr.factorize(model, plan.ranks, conv="spatial")
    assert sum(model_macs(factored).values()) == plan.macs_after <= 0.6 * plan.macs_before
    assert (
        lr.check_flops(factored, spec, plan.to_dict())["ok"] and plan.to_dict()["conv"] == "spatial"
    )
    assert any(
        factored.get_layer(n + "_lr").kernel_size[1] == 1
        for n in plan.ranks
        if isinstance(model.get_layer(n), L.Conv2D) and min(model.get_layer(n).kernel_size) > 1
    )


def test_a_sequential_model_is_factorized_too():
    model = _randomize(
        keras.Sequential([keras.Input((10,)), L.Dense(8, activation="relu"), L.Dense(3)])
    )
    x = np.random.default_rng(2).normal(size=(5, 10)).astype("float32")
    factored = lr.factorize(model, _full_ranks(model))
    np.testing.assert_allclose(factored(x).numpy(), model(x).numpy(), atol=1e-5)


def test_truncation_is_the_best_rank_r_approximation():
    """At rank r the pair's kernel is numpy's rank-r SVD truncation of the original."""
    model = _randomize(_graph_model())
    factored = lr.factorize(model, {"fc": 3, "branch": 4})
    kernel = model.get_layer("fc").kernel.numpy()
    u, s, vt = np.linalg.svd(kernel.astype(np.float64), full_matrices=False)
    product = factored.get_layer("fc_lr").kernel.numpy() @ factored.get_layer("fc").kernel.numpy()
    np.testing.assert_allclose(product, (u[:, :3] * s[:3]) @ vt[:3], atol=1e-5)
    conv = model.get_layer("branch").kernel.numpy().reshape(-1, 16)
    u, s, vt = np.linalg.svd(conv.astype(np.float64), full_matrices=False)
    pair = factored.get_layer("branch_lr").kernel.numpy().reshape(-1, 4) @ factored.get_layer(
        "branch"
    ).kernel.numpy().reshape(4, 16)
    np.testing.assert_allclose(pair, (u[:, :4] * s[:4]) @ vt[:4], atol=1e-5)


def test_macs_agree_with_tensorflows_profiler():
    """Without biases, batch norm or activations the profiler counts exactly 2 FLOPs per multiply-add.

    (It counts nothing for a grouped convolution, so that one is left out.)
    """
    x = inputs = keras.Input((16, 16, 3))
    x = L.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(x)
    x = L.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = L.SeparableConv2D(12, 3, use_bias=False)(x)
    x = L.Flatten()(x)
    model = keras.Model(inputs, L.Dense(7, use_bias=False)(x))
    assert 2 * sum(model_macs(model).values()) == keras_cost(model)["flops"]


def test_macs_count_only_the_models_own_calls():
    """A layer also called elsewhere (a clone's source, a tfmot-stripped model) has other models' calls."""
    model = _graph_model()
    before = model_macs(model)
    fc = model.get_layer("fc")
    fc(keras.Input(fc.input_shape[1:]))  # a second call, outside the model
    assert model_macs(model) == before
    assert lr.plan(model, lr.LowRankSpec()).macs_before == sum(before.values())


@pytest.mark.slow
def test_energy_ranks_are_numpys_and_layers_that_would_not_save_are_named():
    model = _randomize(_graph_model())
    kinds = set()
    for energy in (0.5, 0.8, 0.99):
        plan = lr.plan(model, lr.LowRankSpec(rank_by="energy", energy=energy))
        assert len(plan.ranks) + len(plan.skipped) == 8
        for layer in model.layers:
            if layer.name not in plan.ranks and layer.name not in plan.skipped:
                continue
            kernel = layer.kernel.numpy()
            s = np.linalg.svd(
                kernel.reshape(-1, kernel.shape[-1]).astype(np.float64), compute_uv=False
            )
            rank = int(np.argmax(np.cumsum(s**2) / np.sum(s**2) >= energy)) + 1
            rows, cols = kernel.reshape(-1, kernel.shape[-1]).shape
            if rank * (rows + cols) < rows * cols:
                assert plan.ranks[layer.name] == rank, (energy, layer.name)
                kinds.add("factorized")
            else:
                assert plan.skipped[layer.name].startswith("would not save: "), (energy, layer.name)
                kinds.add("whole")
    assert kinds == {"factorized", "whole"}


def test_a_flops_budget_is_met_and_counted_again_on_the_result():
    model = _randomize(_graph_model())
    plan = lr.plan(model, lr.LowRankSpec(flops=0.6))
    factored = lr.factorize(model, plan.ranks)
    counted = sum(model_macs(factored).values())
    assert counted == plan.macs_after <= 0.6 * plan.macs_before
    assert plan.macs_before == sum(model_macs(model).values())
    check = lr.check_flops(factored, lr.LowRankSpec(flops=0.6), plan.to_dict())
    assert (
        check["ok"] and not lr.check_flops(model, lr.LowRankSpec(flops=0.6), plan.to_dict())["ok"]
    )


@pytest.mark.slow
def test_ranks_rounded_to_a_multiple():
    model = _randomize(_graph_model())
    plan = lr.plan(model, lr.LowRankSpec(flops=0.7, round_to=4))
    assert plan.ranks and all(r % 4 == 0 for r in plan.ranks.values())
    assert (
        sum(model_macs(lr.factorize(model, plan.ranks)).values())
        == plan.macs_after
        <= 0.7 * plan.macs_before
    )
    energy = lr.plan(model, lr.LowRankSpec(rank_by="energy", energy=0.5, round_to=4))
    exact = lr.plan(model, lr.LowRankSpec(rank_by="energy", energy=0.5))
    for name, rank in energy.ranks.items():
        assert rank == -(-exact.ranks[name] // 4) * 4
    coarse = lr.plan(model, lr.LowRankSpec(rank_by="energy", energy=0.5, round_to=5))
    for name in (
        "logits",
        "per_token",
    ):  # 24x5 and 6x20 kernels: a rank-5 pair costs more than the layer
        assert coarse.skipped[name] == "no rank that is a multiple of 5 costs less than the layer"


def test_a_budget_below_the_floor_is_a_one_line_error():
    model = _randomize(_graph_model())
    with pytest.raises(OptimizeError) as err:
        lr.plan(model, lr.LowRankSpec(flops=0.01))
    message = str(err.value)
    assert (
        "low-rank FLOPs budget 0.01 of the model is out of reach: rank 1 everywhere gives"
        in message
    )
    assert "give flops >= " in message and "\n" not in message


def test_what_cannot_be_factorized_is_left_whole_and_named():
    x = inputs = keras.Input((8, 8, 4))
    x = L.DepthwiseConv2D(3, name="dw")(x)
    x = L.Conv2D(8, 3, groups=2, name="grouped")(x)
    shared = L.Dense(16, name="shared")
    x = L.Flatten()(x)
    x = shared(L.Dense(16, name="to16")(x))
    x = shared(x)
    model = _randomize(keras.Model(inputs, L.Dense(1, name="tiny")(x)))
    cands, skipped = lr.candidates(model, lr.LowRankSpec())
    assert [c.name for c in cands] == ["to16"]
    assert skipped["dw"].startswith("depthwise") and skipped["grouped"] == "grouped convolution"
    assert skipped["shared"] == "shared layer (called more than once)"
    assert skipped["tiny"].startswith(
        "too small to gain: 16x1 kernel costs 16 multiply-adds, a rank-1 pair 17"
    )
    cands, _ = lr.candidates(model, lr.LowRankSpec(selection=Selection(types=("Conv2D",))))
    assert cands == []


def test_graph_edits_refuse_a_subclassed_model_and_a_taken_name():
    class Sub(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(OptimizeError, match="subclassed keras.Model"):
        Graph(Sub())
    graph = Graph(_graph_model())
    with pytest.raises(OptimizeError, match="layer name 'fc' is taken"):
        graph.insert_before("logits", "fc", "Dense", {"units": 3}, [])


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(rank_by="svd"), "rank_by='svd' is not valid; choose one of flops, energy"),
        (dict(flops=0), "energy=0.9 and flops=0 must be in (0, 1]"),
        (dict(energy=1.5), "energy=1.5 and flops=0.5 must be in (0, 1]"),
    ],
)
def test_bad_specs_are_named(bad, message):
    with pytest.raises(OptimizeError) as err:
        lr.LowRankSpec(**bad).validate()
    assert message in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MobileNetV2", "EfficientNetB0"])
def test_keras_applications_factorize_exactly_and_convert_to_int8(name):
    """A keras.applications graph (residual adds, squeeze-and-excitation, batch norm) at full rank, then at
    a FLOPs budget, converted to int8 and run by the LiteRT interpreter."""
    from tfopt.core._keras import tf

    from tfopt.export.tflite import convert

    build = getattr(keras.applications, name)
    model = _randomize(
        build(input_shape=(32, 32, 3), weights=None, classes=10, classifier_activation=None), 3
    )
    x = np.random.default_rng(4).normal(size=(2, 32, 32, 3)).astype("float32")
    factored = lr.factorize(model, _full_ranks(model))
    np.testing.assert_allclose(
        factored(x, training=False).numpy(),
        model(x, training=False).numpy(),
        rtol=1e-3,
        atol=1e-3 * float(np.abs(model(x, training=False)).max()),
    )
    plan = lr.plan(model, lr.LowRankSpec(flops=0.8))
    smaller = lr.factorize(model, plan.ranks)
    assert sum(model_macs(smaller).values()) == plan.macs_after <= 0.8 * plan.macs_before
    content = convert(smaller, "int8", calibration=[x[:1], x[1:]]).content
    interpreter = tf.lite.Interpreter(model_content=content)
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    assert inp["dtype"] == np.float32  # float I/O around an int8 body
    interpreter.set_tensor(inp["index"], x[:1])
    interpreter.invoke()
    assert interpreter.get_tensor(out["index"]).shape == (1, 10)
    assert any(d["dtype"] == np.int8 for d in interpreter.get_tensor_details())
