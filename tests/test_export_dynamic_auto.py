"""dynamic_auto: int8 arithmetic only on the ops where it is not slower, measured; the file as
small as dynamic range; a whole-model fallback to weight-only int8 when the mixed model is still
slower than float32, said in a note."""

from tfopt.core._keras import keras

import numpy as np
import pytest

from tfopt.core.errors import ConfigError
from tfopt.export import aeq, auto, dynamic_auto, ops, tflite
from tfopt.export.evaluate import TFLiteModel


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu", name="stem")(inputs)
    # Dynamic range leaves depthwise convolutions to LiteRT's builtin hybrid kernel, off XNNPACK.
    x = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu", name="dw")(x)
    x = keras.layers.Conv2D(256, 1, activation="relu", name="project")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(256, activation="relu", name="hidden")(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(x))


@pytest.fixture(scope="module")
def float32(model):
    return tflite.convert(model, "float32").content


def _arithmetic(content: bytes) -> dict[str, str]:
    """Op output tensor -> int8 or fp32, for every op with weights."""
    names = [node for _, node in ops.model_ops(content)]
    return {names[i]: c.arithmetic for i, c in enumerate(ops.op_costs(content)) if c.macs}


def _timing(node, float_ms, hybrid_ms):
    return auto.OpTiming(
        index=0, op="CONV_2D", node=node, float_rounds=[float_ms], int8_rounds=[hybrid_ms]
    )


def test_the_slow_ops_and_the_fallback_follow_the_timings():
    timings = [_timing("a", 1.0, 2.0), _timing("b", 1.0, 0.5), _timing("c", 1.0, 1.0)]
    assert [t.node for t in dynamic_auto.slow_nodes(timings)] == ["a"]
    recipe = dynamic_auto.mixed_recipe(dynamic_auto.slow_nodes(timings))
    assert recipe[:-1] == aeq.named_recipe("dynamic")
    assert recipe[-1]["regex"] == "^a;$" and recipe[-1]["op_config"] == aeq.weight_only(8)
    assert dynamic_auto.slower_beyond_spread([1.3, 1.2], [1.0, 1.1])
    assert not dynamic_auto.slower_beyond_spread([1.3, 1.05], [1.0, 1.1])  # inside the spread
    assert not dynamic_auto.slower_beyond_spread([0.8], [1.0])


def test_hybrid_ops_slower_than_float_compute_in_float_from_int8_weights(model, float32):
    choice = dynamic_auto.choose(float32, rounds=3, runs=30, warmup=5)
    dynamic = aeq.quantize(float32, aeq.named_recipe("dynamic"))
    # Every op with int8 weights in the dynamic model was timed, and only those.
    assert {t.node for t in choice.ops} == {
        n for n, a in _arithmetic(dynamic).items() if a == "int8"
    }
    slow = {t.node for t in choice.ops if t.int8_ms > t.float_ms}
    assert set(choice.float_nodes) == slow
    assert any(t.op == "DEPTHWISE_CONV_2D" for t in choice.ops if t.node in slow)
    got = _arithmetic(choice.content)
    if not choice.fallback:
        assert {n for n, a in got.items() if a == "fp32"} == slow
    # Every weight is int8 either way: the file is as small as the dynamic one, 3x+ below float32.
    assert len(choice.content) <= 1.02 * len(dynamic) and len(choice.content) * 3 < len(float32)
    want = model.predict(np.random.default_rng(0).random((4, 32, 32, 3), np.float32), verbose=0)
    x = np.random.default_rng(0).random((4, 32, 32, 3), np.float32)
    out = TFLiteModel(choice.content).predict(x)
    assert np.abs(out - want).max() <= 0.05 * np.abs(want).max()


def test_a_mixed_model_still_slower_than_float_falls_back_to_weight_only(float32):
    def time_fn(content, threads):  # float32 always the faster, every round
        return 1.0 if content == float32 else 2.0

    choice = dynamic_auto.choose(float32, rounds=2, runs=5, warmup=1, time_fn=time_fn)
    assert choice.fallback and choice.recipe == aeq.named_recipe("int8_weights")
    assert choice.content == aeq.quantize(float32, aeq.named_recipe("int8_weights"))
    assert set(_arithmetic(choice.content).values()) == {"fp32"}
    assert "every op keeps int8 weights dequantized to float at load" in choice.notes[-1]
    assert (choice.float_rounds, choice.mixed_rounds) == ([1.0, 1.0], [2.0, 2.0])


def test_the_settings_are_checked_in_one_line(float32):
    with pytest.raises(ConfigError, match="dynamic_auto rounds=0 must be >= 1"):
        dynamic_auto.choose(float32, rounds=0)


def test_the_export_mode_records_its_recipe_and_who_made_it(model):
    conv = tflite.convert(model, "dynamic_auto")
    assert conv.quantizer == "litert" and conv.io == "float"
    assert conv.recipe[0] == aeq.named_recipe("dynamic")[0]
    assert any(n.startswith("dynamic_auto: int8 arithmetic slower") for n in conv.notes)
