"""Channel pruning to a measured LiteRT latency: the NetAdapt-style table and the plan it drives."""

import math

from tfopt.core._keras import keras

import numpy as np
import pytest

from tfopt.compress import channel_prune as cp
from tfopt.compress import latency
from tfopt.compress.channels import trace
from tfopt.compress.common import OptimizeError
from tfopt.compress.flops import model_macs
from tfopt.models.registry import cnn

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
@pytest.mark.parametrize("scale", [2.0, 0.5])
def test_the_table_is_calibrated_by_measuring_the_whole_pruned_model(scale):
    """Layers timed alone rarely sum to the model: here the whole model saves ``scale`` times what
    the table's layers save (the stand-in: the model costs 50 + scale x its multiply-adds / 1000 us,
    each layer entry 1 + its multiply-adds / 1000). The plan measures the pruned model, scales the
    table and lands on the target: at most half the multiply-adds' cost, and no smaller share
    meets it. Uncalibrated, a scale of 2 is out of the table's reach and 0.5 misses the target."""
    model = cnn((28, 28, 1), 10)
    total = sum(model_macs(model).values())

    def measure(m, todo):
        out = [50 + scale * sum(model_macs(m).values()) / 1000]
        return np.array(
            out + [1 + cp._macs(m.get_layer(e.layer), e.cin, e.cout) / 1000 for e in todo]
        )

    target = 50 + scale * total / 2000
    decided = cp.plan(model, cp.ChannelSpec(latency_us=target, round_to=4), measure=measure)
    lat = decided.latency
    assert decided.macs_after <= total / 2 and lat["predicted_us"] <= target
    last = lat["calibration"][-1]
    assert (
        last["scale"] == pytest.approx(scale, rel=1e-3)
        and len(lat["calibration"]) <= cp.CALIBRATIONS
    )
    assert measure(cp.prune_channels(decided), [])[0] <= target  # the model, measured, meets it
    fewer = cp.plan(model, cp.ChannelSpec(ratio=max(decided.share - 0.01, 0.0), round_to=4))
    assert fewer.macs_after > total / 2 or fewer.removed == decided.removed


@pytest.mark.slow
def test_a_latency_target_below_the_floor_is_a_one_line_error_naming_it():
    model = cnn((28, 28, 1), 10)
    with pytest.raises(OptimizeError) as e:
        cp.plan(model, cp.ChannelSpec(latency_us=5.0, round_to=8), measure=_macs_measure)
    text = str(e.value)
    assert "\n" not in text and "out of reach" in text
    floor = float(text.rsplit(">= ", 1)[1])
    assert e.value.nearest == floor  # what a caller aims at instead
    assert (
        cp.plan(model, cp.ChannelSpec(latency_us=floor, round_to=8), measure=_macs_measure).latency[
            "predicted_us"
        ]
        <= floor
    )
    with pytest.raises(OptimizeError, match="one target"):
        cp.ChannelSpec(latency_us=100.0, ratio=0.3).validate()


def _tagged_invokers(monkeypatch):
    """Replaces LiteRT timing by each signature's own tag: every invoker ``time_signatures`` makes is
    tagged with the element count of its signature's output (a layer's output size tells its widths
    apart), and the timer returns that tag as the p50. Returns the list of invokers made."""
    made = []

    def invoker(runner):
        (out,) = runner.get_output_details().values()

        def invoke():
            raise AssertionError("the fake timer never invokes")

        invoke.tag = float(np.prod(out["shape"]))
        invoke.timed = 0
        made.append(invoke)
        return invoke

    def timer(call, *, warmup, runs):
        call.timed += 1
        return {"p50_ms": call.tag / 1e3}

    monkeypatch.setattr(latency, "signature_invoker", invoker)
    monkeypatch.setattr(latency, "time_calls", timer)
    return made


@pytest.mark.slow
def test_layers_alike_but_for_their_names_are_timed_once_and_each_entry_is_its_layer(monkeypatch):
    # No clock: each signature's "time" is its output's element count (see _tagged_invokers), so
    # the result shows which signature every entry was read from, whatever the machine's load.
    inputs = keras.Input((16, 16, 8))
    x = L.Conv2D(8, 3, padding="same", name="a")(inputs)
    x = L.Conv2D(8, 3, padding="same", name="b")(x)
    x = L.Conv2D(64, 3, padding="same", name="c")(x)
    model = keras.Model(inputs, L.GlobalAveragePooling2D()(x))
    made = _tagged_invokers(monkeypatch)
    todo = [latency.Entry("a", 8, 8), latency.Entry("b", 8, 8), latency.Entry("c", 8, 64)]
    times = latency.time_signatures(model, todo, passes=2, runs=10)
    # three signatures for four rows: the model, one for the alike a and b, one for c
    assert sorted(i.tag for i in made) == [64.0, 16 * 16 * 8.0, 16 * 16 * 64.0]
    assert [i.timed for i in made] == [2, 2, 2]  # every signature timed once per pass
    assert times[0] == pytest.approx(64.0)  # the whole model's row is the model's signature
    assert times[1] == times[2] == pytest.approx(16 * 16 * 8.0)  # a and b: one measurement
    assert times[3] == pytest.approx(16 * 16 * 64.0)  # c's row is c's own signature


@pytest.mark.slow
def test_pruning_to_a_latency_target_meets_it_in_the_table_and_removes_multiply_adds(monkeypatch):
    """The plan against a real LiteRT table, with a target read off that same table, so that no
    second measurement races the first: the table's prediction at the widths of a 50% channel cut
    (rounded up a step), which that cut meets by construction. Whether the pruned .tflite is
    faster is a benchmark's question (bench/structured.py, B10), not a test's."""
    model = cnn((28, 28, 1), 10)
    timed, tables = [], []
    real_measured = latency.Table.measured.__func__

    def measured(cls, *args, **kwargs):
        tables.append(real_measured(cls, *args, **kwargs))
        return tables[-1]

    made, real_prune = {}, cp.prune_channels

    def prune(decided):
        made[id(smaller := real_prune(decided))] = decided
        return smaller

    def measure(m, todo):  # LiteRT, timed once: every plan below reads the same times
        if not todo:  # the calibrating whole-model measurement: the table's own prediction
            d = made[id(m)]
            return [tables[-1].predict(cp._counts(d.model, d.channels, d.removed))]
        if not timed:
            timed.append((todo, latency.time_signatures(m, todo)))
        assert todo == timed[0][0]
        return timed[0][1]

    monkeypatch.setattr(latency.Table, "measured", classmethod(measured))
    monkeypatch.setattr(cp, "prune_channels", prune)
    first = cp.plan(model, cp.ChannelSpec(latency_us=1e9, round_to=8), measure=measure)
    table = tables[0]
    assert set(table.grid) == {"conv0", "conv1", "fc", "logits"}
    assert np.isfinite(table.base_us) and table.base_us > 0  # the real measurement: sane
    assert all(np.isfinite(t).all() and (t > 0).all() for _, _, t in table.grid.values())
    assert first.share == 0.0 and first.latency["predicted_us"] == round(table.base_us, 2)
    half = cp.plan(model, cp.ChannelSpec(ratio=0.5, round_to=8))
    half_counts = cp._counts(half.model, half.channels, half.removed)
    at_half = table.predict(half_counts)
    target = math.ceil(at_half * 100 + 1) / 100  # on the record's 0.01 us grid, above at_half

    spec = cp.ChannelSpec(latency_us=target, round_to=8)
    decided = cp.plan(model, spec, measure=measure)
    lat = decided.latency
    assert len(timed) == 1 and lat["target_us"] == target and lat["predicted_us"] <= target
    # the smallest share that meets the target in this table: the 50% cut does, so no more is cut
    # (a measured table need not fall with every channel removed: the stand-in below checks that
    # no smaller share meets a target, where the cost falls with the multiply-adds)
    assert decided.share <= 0.5 and decided.macs_after >= half.macs_after
    # below the table's whole-model time, the target cannot be met without cutting channels
    assert decided.macs_after < decided.macs_before or target >= table.base_us
    assert len(tables) == 2 and tables[1].predict(half_counts) == at_half  # the same table
    smaller = cp.prune_channels(decided)
    check = cp.check_widths(smaller, spec, decided.to_dict())
    assert check["ok"] and check["predicted_us"] == lat["predicted_us"]
    assert check["macs"] == decided.macs_after == sum(model_macs(smaller).values())
    assert trace(cp.fresh(smaller)).producers  # a plain model again

    # Multiply-adds, exactly: under the stand-in whose every time is 1 + multiply-adds / 1000 (the
    # model 50 + its multiply-adds / 1000), a target of half the model's variable cost must leave
    # at most half its multiply-adds, counted again on the pruned model.
    total = sum(model_macs(model).values())
    by_macs = cp.plan(
        model, cp.ChannelSpec(latency_us=50 + total / 2000, round_to=8), measure=_macs_measure
    )
    counted = sum(model_macs(cp.prune_channels(by_macs)).values())
    assert counted == by_macs.macs_after <= total / 2 < by_macs.macs_before == total
    fewer = cp.plan(model, cp.ChannelSpec(ratio=max(by_macs.share - 0.01, 0.0), round_to=8))
    assert fewer.macs_after > total / 2 or fewer.removed == by_macs.removed
