"""Channel pruning to a measured LiteRT latency: the NetAdapt-style table and the plan it drives."""

from tfopt._keras import keras

import numpy as np
import pytest

from tfopt.models.registry import cnn
from tfopt.optimize import channel_prune as cp
from tfopt.optimize import latency
from tfopt.optimize.channels import trace
from tfopt.optimize.common import OptimizeError
from tfopt.optimize.flops import model_macs

L = keras.layers


def test_table_interpolates_bilinearly_between_grid_points():
    t = np.array([[10.0, 30.0], [20.0, 60.0]])  # rows: cin 8, 16; columns: cout 4, 12
    table = latency.Table(
        100.0,
        {"a": (16, 12), "b": (5, 5)},
        {"a": ([8, 16], [4, 12], t), "b": ([5], [5], np.array([[7.0]]))},
        threads=1,
    )
    # independent: bilinear weights at cin 12 (half way), cout 6 (a quarter of the way)
    expected = 0.5 * (0.75 * 10 + 0.25 * 30) + 0.5 * (0.75 * 20 + 0.25 * 60)
    assert table.layer_us("a", 12, 6) == pytest.approx(expected)
    assert (
        table.layer_us("a", 4, 2) == 10.0 and table.layer_us("a", 32, 40) == 60.0
    )  # held at the edges
    assert table.predict({"a": (16, 12), "b": (5, 5)}) == 100.0
    assert table.predict({"a": (8, 4), "b": (5, 5)}) == pytest.approx(100.0 - 60.0 + 10.0)


def _macs_measure(model, entries):
    """A deterministic stand-in for LiteRT: each entry costs 1 + its multiply-adds / 1000 us, the model
    50 + its multiply-adds / 1000."""
    out = [50 + sum(model_macs(model).values()) / 1000]
    for e in entries:
        layer = model.get_layer(e.layer)
        out.append(1 + cp._macs(layer, e.cin, e.cout) / 1000)
    return np.array(out)


@pytest.mark.slow
def test_plan_takes_the_smallest_share_whose_predicted_latency_meets_the_target():
    model = cnn((28, 28, 1), 10)
    base = 50 + sum(model_macs(model).values()) / 1000
    target = 0.6 * base
    decided = cp.plan(model, cp.ChannelSpec(latency_us=target, round_to=4), measure=_macs_measure)
    lat = decided.latency
    assert lat["before_us"] == pytest.approx(base, abs=0.01) and lat["predicted_us"] <= target
    # independently: predict each share's widths from the same costs, by brute force
    ch = decided.channels

    def table_of(removed):
        return base + sum(
            (cp._macs(model.get_layer(n), *io) - cp._macs(model.get_layer(n), *now)) / 1000
            for (n, io), now in zip(
                cp._counts(decided.model, ch, removed).items(),
                cp._counts(decided.model, ch, set()).values(),
            )
        )

    assert lat["predicted_us"] == pytest.approx(table_of(decided.removed), abs=0.01)
    fewer = cp.plan(model, cp.ChannelSpec(ratio=max(decided.share - 0.01, 0.0), round_to=4))
    assert (
        table_of(fewer.removed) > target or fewer.removed == decided.removed
    )  # no smaller share meets it


@pytest.mark.slow
def test_a_latency_target_below_the_floor_is_a_one_line_error_naming_it():
    model = cnn((28, 28, 1), 10)
    with pytest.raises(OptimizeError) as e:
        cp.plan(model, cp.ChannelSpec(latency_us=5.0, round_to=8), measure=_macs_measure)
    text = str(e.value)
    assert "\n" not in text and "out of reach" in text
    floor = float(text.rsplit(">= ", 1)[1])
    assert (
        cp.plan(model, cp.ChannelSpec(latency_us=floor, round_to=8), measure=_macs_measure).latency[
            "predicted_us"
        ]
        <= floor
    )
    with pytest.raises(OptimizeError, match="one target"):
        cp.ChannelSpec(latency_us=100.0, ratio=0.3).validate()


@pytest.mark.slow
def test_layers_alike_but_for_their_names_are_timed_once_and_each_entry_is_its_layer():
    inputs = keras.Input((16, 16, 8))
    x = L.Conv2D(8, 3, padding="same", name="a")(inputs)
    x = L.Conv2D(8, 3, padding="same", name="b")(x)
    x = L.Conv2D(64, 3, padding="same", name="c")(x)
    model = keras.Model(inputs, L.GlobalAveragePooling2D()(x))
    todo = [latency.Entry("a", 8, 8), latency.Entry("b", 8, 8), latency.Entry("c", 8, 64)]
    times = latency.time_signatures(model, todo, passes=1, runs=10)
    assert times[1] == times[2]  # one measurement for two alike layers
    assert (
        times[3] > 3 * times[1]
    )  # 8x the multiply-adds: not the alike layers' time (mis-mapped entries)


@pytest.mark.slow
def test_pruning_to_a_latency_target_makes_the_float_tflite_faster():
    model = cnn((28, 28, 1), 10)
    before = latency.model_us(model)
    decided = cp.plan(model, cp.ChannelSpec(latency_us=0.5 * before, round_to=8))
    table = decided.latency
    assert table["predicted_us"] <= 0.5 * before
    assert set(table["table"]["layers"]) == {"conv0", "conv1", "fc", "logits"}
    smaller = cp.prune_channels(decided)
    both = [latency.model_us(m) for m in (model, smaller) * 3]  # interleaved; min: the least noise
    assert min(both[1::2]) < 0.8 * min(both[0::2]), both
    check = cp.check_widths(smaller, cp.ChannelSpec(latency_us=0.5 * before), decided.to_dict())
    assert check["ok"] and check["predicted_us"] == table["predicted_us"]
    assert trace(cp.fresh(smaller)).producers  # a plain model again
