"""Channel pruning: removing channels that were already zeroed leaves the outputs as they were.

Each test zeroes, in the original model, every channel the plan removes (its kernel slice and bias,
and the beta and moving mean of the batch norms and the bias of the depthwise convolutions it
flows through), so the original computes exactly what a correct surgery must; the pruned model
is built from the unzeroed weights minus those channels.
"""

from tfopt.core._keras import keras

import numpy as np
import pytest

from tfopt.compress import channel_prune as cp
from tfopt.compress.common import OptimizeError, Selection
from tfopt.compress.flops import model_macs

L = keras.layers


def _randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    values = []
    for w in model.weights:
        v = rng.normal(size=w.shape).astype("float32") * 0.3
        if "moving_variance" in w.name:
            v = np.abs(v) + 0.5
        values.append(v)
    model.set_weights(values)
    return model


def _zeroed(model, plan):
    """A copy of ``model`` whose removed channels output exactly zero."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    ch, removed = plan.channels, plan.removed
    gone = lambda ids: [j for j, i in enumerate(ids) if ch.find(i) in removed]  # noqa: E731
    for name, ids in ch.producers.items():
        layer = copy.get_layer(name)
        weights = layer.get_weights()
        at = 1 if isinstance(layer, L.SeparableConv2D) else 0
        for j in gone(ids):
            weights[at][..., j] = 0
            if layer.use_bias:
                weights[-1][j] = 0
        layer.set_weights(weights)
    for layer in copy.layers:
        if isinstance(layer, L.BatchNormalization):
            names = [w.name.split("/")[-1] for w in layer.weights]
            weights = layer.get_weights()
            for j in gone(ch.out[layer.name]):
                for k, n in enumerate(names):
                    if n.startswith(("beta", "moving_mean")):
                        weights[k][j] = 0
            layer.set_weights(weights)
        elif isinstance(layer, L.DepthwiseConv2D) and layer.use_bias:
            weights = layer.get_weights()
            weights[-1][gone(ch.out[layer.name])] = 0
            layer.set_weights(weights)
    return copy


def _exact(model, spec, x, atol=1e-5):
    plan = cp.plan(model, spec)
    pruned = cp.prune_channels(plan)
    assert plan.removed, "nothing was removed"
    zeroed = _zeroed(model, plan)
    want, got = zeroed(x, training=False), pruned(x, training=False)
    for a, b in zip(
        want if isinstance(want, list) else [want], got if isinstance(got, list) else [got]
    ):
        np.testing.assert_allclose(
            b.numpy(), a.numpy(), atol=atol * max(1.0, float(np.abs(a).max())), rtol=1e-4
        )
    assert cp.check_widths(pruned, spec, plan.to_dict())[
        "ok"
    ]  # widths and multiply-adds read back = the plan's
    assert sum(model_macs(pruned).values()) == plan.macs_after < plan.macs_before
    return plan, pruned


def _image(*shape, seed=1):
    return np.random.default_rng(seed).normal(size=(2, *shape)).astype("float32")


def _chain():
    x = inputs = keras.Input((10, 10, 3))
    x = L.Conv2D(16, 3, padding="same", name="c1")(x)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(6.0, name="relu1")(x)
    x = L.DepthwiseConv2D(3, padding="same", name="dw")(x)  # follows c1's channels
    x = L.BatchNormalization(name="bn_dw")(x)
    x = L.SeparableConv2D(12, 3, padding="same", depth_multiplier=2, name="sep")(x)
    x = L.MaxPooling2D(name="pool")(x)
    x = L.Conv2D(8, 1, name="c2")(x)
    x = L.Flatten(name="flat")(x)  # into a Dense layer: 25 positions x 8 channels
    x = L.Dense(20, activation="relu", name="d1")(x)
    x = L.Dropout(0.1, name="drop")(x)
    return keras.Model(inputs, L.Dense(4, name="out")(x), name="chain")


def _residual():
    x = inputs = keras.Input((8, 8, 4))
    stem = L.Conv2D(12, 3, padding="same", name="stem")(x)
    a = L.Conv2D(12, 3, padding="same", name="a")(L.ReLU(name="r0")(stem))
    a = L.BatchNormalization(name="bn_a")(a)
    x = L.Add(name="add1")([stem, a])  # stem, a and b: one group of tied channels
    b = L.Conv2D(12, 1, name="b")(x)
    x = L.Add(name="add2")([x, b])
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, L.Dense(3, name="out")(x), name="residual")


def _concat_and_se():
    x = inputs = keras.Input((8, 8, 4))
    left = L.Conv2D(6, 3, padding="same", activation="relu", name="left")(x)
    right = L.Conv2D(10, 1, activation="relu", name="right")(x)
    x = L.Concatenate(name="cat")([left, right])
    x = L.Conv2D(16, 3, padding="same", activation="swish", name="body")(x)
    s = L.GlobalAveragePooling2D(name="se_gap")(x)
    s = L.Reshape((1, 1, 16), name="se_reshape")(s)
    s = L.Conv2D(4, 1, activation="swish", name="se_reduce")(s)
    s = L.Conv2D(16, 1, activation="sigmoid", name="se_expand")(s)  # tied to body by the Multiply
    x = L.Multiply(name="se_excite")([x, s])
    x = L.Reshape((-1,), name="to_vector")(x)
    return keras.Model(inputs, L.Dense(3, name="out")(x), name="concat_se")


@pytest.mark.parametrize(
    "build, shape", [(_chain, (10, 10, 3)), (_residual, (8, 8, 4)), (_concat_and_se, (8, 8, 4))]
)
@pytest.mark.slow
@pytest.mark.parametrize("ranking", ["global", "uniform"])
def test_removing_zeroed_channels_changes_no_output(build, shape, ranking):
    model = _randomize(build())
    plan, _ = _exact(model, cp.ChannelSpec(ratio=0.5, ranking=ranking), _image(*shape))
    assert plan.pinned == {"out": "model output"}


@pytest.mark.slow
def test_tied_channels_go_together():
    plan, pruned = _exact(_randomize(_residual()), cp.ChannelSpec(ratio=0.5), _image(8, 8, 4))
    assert plan.widths["stem"] == plan.widths["a"] == plan.widths["b"] == (12, 6)
    plan, pruned = _exact(_randomize(_concat_and_se()), cp.ChannelSpec(ratio=0.5), _image(8, 8, 4))
    assert (
        plan.widths["body"][1]
        == plan.widths["se_expand"][1]
        == pruned.get_layer("se_reshape").target_shape[-1]
    )
    assert pruned.get_layer("out").kernel.shape[0] == 64 * plan.widths["body"][1]


@pytest.mark.slow
def test_a_flops_target_is_met_with_widths_rounded():
    model = _randomize(_chain())
    plan, pruned = _exact(model, cp.ChannelSpec(flops=0.5, round_to=4), _image(10, 10, 3))
    assert plan.macs_after <= 0.5 * plan.macs_before
    assert all(after % 4 == 0 for _, after in plan.widths.values() if after < 4 * 99)
    looser = cp.plan(model, cp.ChannelSpec(flops=0.8, round_to=4))
    assert plan.macs_after < looser.macs_after <= 0.8 * plan.macs_before


def test_a_target_below_the_floor_is_a_one_line_error():
    with pytest.raises(OptimizeError) as err:
        cp.plan(_randomize(_residual()), cp.ChannelSpec(flops=0.001, round_to=4))
    message = str(err.value)
    assert message.startswith(
        "channel-pruning FLOPs target 0.001 of the model is out of reach: every group at its "
        "minimum width (4) leaves "
    )
    assert "give flops >= " in message and "\n" not in message
    assert err.value.nearest == float(message.rsplit(">= ", 1)[1])


@pytest.mark.slow
def test_a_layer_the_tracer_cannot_follow_is_kept_whole_and_named():
    x = inputs = keras.Input((6, 6, 3))
    x = L.Conv2D(8, 3, name="before")(x)
    x = L.LayerNormalization(name="ln")(x)  # mixes the channels: before cannot be pruned
    x = L.Conv2D(8, 1, name="after")(x)
    x = L.Conv2D(6, 1, groups=2, name="grouped")(x)
    x = L.DepthwiseConv2D(1, depth_multiplier=2, name="dw2")(x)
    x = L.Flatten()(x)
    x = L.Dense(6, name="hidden")(x)
    model = _randomize(keras.Model(inputs, L.Dense(2, name="out")(x)))
    plan, _ = _exact(model, cp.ChannelSpec(ratio=0.5), _image(6, 6, 3))
    assert (
        plan.pinned["ln"] == "LayerNormalization is not traced"
        and plan.pinned["grouped"] == "grouped convolution"
    )
    assert plan.pinned["dw2"] == "depth multiplier above 1"
    assert plan.widths["before"] == (8, 8) and plan.widths["after"] == (
        8,
        8,
    )  # after feeds the grouped conv
    assert plan.widths["hidden"] == (6, 3) and "grouped" not in plan.widths
    with pytest.raises(OptimizeError, match="has no channel that can be pruned"):
        cp.plan(model, cp.ChannelSpec(ratio=0.5, selection=Selection(names=("before",))))


def test_importance_orders_the_channels():
    """Global L1: the channels with the smallest kernels go; bn: the smallest |gamma|."""
    model = _randomize(_chain())
    kernel = model.get_layer("c1").get_weights()
    kernel[0][..., :4] *= 1e-3  # four weak filters
    model.get_layer("c1").set_weights(kernel)
    plan = cp.plan(model, cp.ChannelSpec(ratio=0.2, ranking="uniform"))
    ids = plan.channels.producers["c1"]
    gone = {j for j, i in enumerate(ids) if plan.channels.find(i) in plan.removed}
    assert len(gone) == 3 and gone < {0, 1, 2, 3}  # 20% of 16, all among the weak ones
    gamma = model.get_layer("bn1").get_weights()
    gamma[0][:] = 1.0
    gamma[0][[5, 9, 11]] = 1e-3
    model.get_layer("bn1").set_weights(gamma)
    plan = cp.plan(model, cp.ChannelSpec(ratio=0.2, ranking="uniform", importance="bn"))
    assert {j for j, i in enumerate(ids) if plan.channels.find(i) in plan.removed} == {5, 9, 11}


def test_taylor_importance_is_the_hand_computed_first_order_term():
    """(sum over the kernel slice of weight x gradient)^2, averaged over batches, against numpy's gradient."""
    x = inputs = keras.Input((4,))
    model = _randomize(
        keras.Model(
            inputs, L.Dense(3, use_bias=False, name="out")(L.Dense(5, use_bias=False, name="h")(x))
        ),
        5,
    )
    rng = np.random.default_rng(6)
    batches = [(rng.normal(size=(8, 4)).astype("float32"), rng.integers(0, 3, 8)) for _ in range(2)]
    w1, w2 = model.get_layer("h").kernel.numpy(), model.get_layer("out").kernel.numpy()
    want = np.zeros(5)
    for xb, yb in batches:
        logits = xb @ w1 @ w2
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        delta = (p - np.eye(3)[yb]) / len(xb)  # d(mean cross-entropy)/d(logits)
        grad = xb.T @ (delta @ w2.T)  # d loss / d w1
        want += np.sum(w1 * grad, axis=0) ** 2
    want /= len(batches)
    got = cp.importance(model, ["h"], "taylor", batches)["h"]
    np.testing.assert_allclose(got, want / want.mean(), rtol=1e-4)
    plan = cp.plan(model, cp.ChannelSpec(ratio=0.4, importance="taylor"), batches)
    ids = plan.channels.producers["h"]
    assert {j for j, i in enumerate(ids) if plan.channels.find(i) in plan.removed} == set(
        np.argsort(want)[:2]
    )
    with pytest.raises(OptimizeError, match="taylor importance got no batch"):
        cp.plan(model, cp.ChannelSpec(ratio=0.4, importance="taylor"))


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(importance="taylor2"), "importance='taylor2' / ranking='global' is not valid"),
        (dict(flops=0), "flops=0 must be in (0, 1] and ratio=0.0 in [0, 1)"),
        (
            dict(round_to=0),
            "round_to=0, iterations=1, taylor_batches=8 and latency_threads=1 must be >= 1",
        ),
    ],
)
def test_bad_specs_are_named(bad, message):
    with pytest.raises(OptimizeError) as err:
        cp.ChannelSpec(**bad).validate()
    assert message in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MobileNetV2", "ResNet50", "EfficientNetB0"])
def test_keras_applications_prune_exactly_fine_tune_and_convert_to_int8(name):
    from tfopt.core._keras import tf

    from tfopt.export.tflite import convert

    model = getattr(keras.applications, name)(
        input_shape=(32, 32, 3), weights=None, classes=10, classifier_activation=None
    )
    model = _randomize(model, 2)
    x = _image(32, 32, 3)
    plan, pruned = _exact(model, cp.ChannelSpec(flops=0.5, round_to=8), x, atol=1e-4)
    assert plan.macs_after <= 0.5 * plan.macs_before
    pruned.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    pruned.fit(x, np.array([1, 2]), epochs=1, steps_per_epoch=2, verbose=0)  # a plain model trains
    content = convert(pruned, "int8", calibration=[x[:1], x[1:]]).content
    interpreter = tf.lite.Interpreter(model_content=content)
    interpreter.allocate_tensors()
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    interpreter.set_tensor(inp["index"], x[:1])
    interpreter.invoke()
    assert interpreter.get_tensor(out["index"]).shape == (1, 10)
    assert any(d["dtype"] == np.int8 for d in interpreter.get_tensor_details())
