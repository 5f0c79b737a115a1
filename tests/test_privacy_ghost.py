"""Ghost norms (tfopt.privacy.ghost): each layer's per-example gradient norms from its formula
against the norms of gradients taken one example at a time, and the DP-SGD step through them
against the vectorized step."""

from tfopt.core._keras import keras, tf

import numpy as np
import pytest

from tfopt.models.registry import build_model
from tfopt.privacy import ghost, make_private


def _one_at_a_time(model, layer, x, w):
    """Each example's squared gradient norm over ``layer``'s weights, one tape per example."""
    out = []
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x[i : i + 1], training=True) * w)
        grads = tape.gradient(loss, layer.trainable_weights)
        out.append(sum(float(tf.reduce_sum(tf.square(g))) for g in grads))
    return np.array(out)


CASES = {
    "dense": (lambda: keras.layers.Dense(5, activation="tanh"), (7,), "float"),
    "dense_no_bias": (lambda: keras.layers.Dense(5, use_bias=False), (7,), "float"),
    # [B, T, D] inputs: T^2 (P + C) < T P C takes the Gram form, the other the einsum
    "dense_sequence_gram": (lambda: keras.layers.Dense(40, activation="relu"), (3, 30), "float"),
    "dense_sequence_einsum": (lambda: keras.layers.Dense(2), (12, 3), "float"),
    "conv_same_strided": (
        lambda: keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="tanh"),
        (9, 9, 2),
        "float",
    ),
    "conv_valid_dilated": (
        lambda: keras.layers.Conv2D(3, 2, dilation_rate=2, padding="valid"),
        (8, 7, 3),
        "float",
    ),
    "conv_gram": (lambda: keras.layers.Conv2D(64, 3, padding="same"), (3, 3, 8), "float"),
    "embedding_repeated_ids": (lambda: keras.layers.Embedding(6, 4), (9,), "ids"),
    "layer_norm": (lambda: keras.layers.LayerNormalization(), (7,), "float"),
    "layer_norm_sequence": (lambda: keras.layers.LayerNormalization(center=False), (3, 6), "float"),
    "group_norm": (lambda: keras.layers.GroupNormalization(2), (5, 5, 4), "float"),
    "group_norm_no_scale": (
        lambda: keras.layers.GroupNormalization(4, scale=False),
        (3, 4),
        "float",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_formula_gives_the_norms_of_one_example_at_a_time_gradients(case):
    make, shape, kind = CASES[case]
    rng = np.random.default_rng(0)
    layer = make()
    inputs = keras.Input(shape, dtype="int32" if kind == "ids" else "float32")
    model = keras.Model(inputs, layer(inputs))
    if kind == "ids":  # few ids over many positions: rows repeat within an example
        x = rng.integers(0, 6, size=(5, *shape)).astype(np.int32)
    else:
        x = rng.normal(size=(5, *shape)).astype(np.float32)
    w = tf.constant(rng.normal(size=model.output_shape[1:]), tf.float32)
    want = _one_at_a_time(model, layer, x, w)
    part = ghost.split(model)
    assert part.ghost == (layer,) and part.methods[layer.name].startswith("ghost")
    with tf.GradientTape() as tape:
        with ghost.recording(part.ghost) as records:
            out = model(x, training=True)
        loss = tf.reduce_sum(out * w)
    operands = ghost.operands(records, tape.gradient(loss, [r.z for r in records]))
    got = ghost.squared_norms(operands).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-4)
    np.testing.assert_allclose(model(x).numpy(), out.numpy(), rtol=1e-6)  # call restored


def _dp_cnn_with(extra: bool):
    keras.utils.set_random_seed(3)
    model = build_model("dp_cnn", (28, 28, 1), 10, dropout=0.0)  # no random masks
    if not extra:
        return model
    # a normalization layer with a formula, and a layer with trainable weights and none: its
    # norms come the vectorized way
    x = keras.layers.LayerNormalization(name="norm")(model.get_layer("fc").output)
    x = keras.layers.PReLU(name="prelu")(x)
    return keras.Model(model.inputs, keras.layers.Dense(10, name="head")(x))


@pytest.mark.parametrize("extra", [False, True], ids=["dp_cnn", "dp_cnn+layernorm+prelu"])
def test_the_ghost_step_is_the_vectorized_step(extra):
    rng = np.random.default_rng(4)
    x = rng.random((16, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 16)
    after = {}
    for formulas in (True, False):
        model = _dp_cnn_with(extra)
        start = model.get_weights()
        model.compile(
            keras.optimizers.SGD(1.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        methods = make_private(model, 0.1, 0.5, 16, seed=2, ghost_norms=formulas)
        model.train_on_batch(x, y)
        after[formulas] = ([w - w0 for w, w0 in zip(model.get_weights(), start)], methods)
    (ghosted, methods), (vectorized, plain) = after[True], after[False]
    for u, v in zip(ghosted, vectorized):
        np.testing.assert_allclose(u, v, rtol=1e-3, atol=1e-6)
    assert set(plain.values()) == {"vectorized: " + t for t in ("Conv2D", "Dense")} | (
        {"vectorized: LayerNormalization", "vectorized: PReLU"} if extra else set()
    )
    assert methods["conv0"] == "ghost: input patches x output gradients"
    assert methods["fc"] == "ghost: activations x output gradients"
    assert methods.get("norm") == ("ghost: normalized inputs x output gradients" if extra else None)
    assert methods.get("prelu") == ("vectorized: PReLU" if extra else None)


def test_a_layer_called_twice_is_not_ghosted():
    shared = keras.layers.Dense(4, name="shared")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, shared(shared(inputs)))
    part = ghost.split(model)
    assert part.ghost == () and part.methods == {"shared": "vectorized: Dense"}


def _step_under_policy(policy, formulas, clip):
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(5)
        inputs = keras.Input((8, 8, 2))
        x = keras.layers.Conv2D(4, 3, activation="tanh", name="conv")(inputs)
        x = keras.layers.Flatten()(x)
        logits = keras.layers.Dense(3, dtype="float32", name="logits")(x)
        model = keras.Model(inputs, logits)
        model.compile(
            keras.optimizers.SGD(1.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        scaled = isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
        start = [w.copy() for w in model.get_weights()]
        make_private(model, clip, 0.0, 6, ghost_norms=formulas)
        rng = np.random.default_rng(6)
        model.train_on_batch(rng.normal(size=(6, 8, 8, 2)).astype(np.float32), np.arange(6) % 3)
        return [w - w0 for w, w0 in zip(model.get_weights(), start)], scaled
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("clip", [0.5, 100.0], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_under_mixed_precision_the_ghost_step_is_the_float32_step(policy, clip):
    # mixed_float16 scales the loss (LossScaleOptimizer): the output gradients are unscaled
    # before the norms; float16 and bfloat16 arithmetic bound the agreement.
    reference, _ = _step_under_policy("float32", True, clip)
    mixed, scaled = _step_under_policy(policy, True, clip)
    assert scaled == (policy == "mixed_float16")
    for u, v in zip(mixed, reference):
        np.testing.assert_allclose(u, v, rtol=0.05, atol=2e-3 if "b" in policy else 5e-4)
