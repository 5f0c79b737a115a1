"""One graph timed once, in interleaved rounds with their spread; whose CPU a figure is from."""

import numpy as np
import pytest

from tfopt.core import cpu
from tfopt.export import metadata, rounds


@pytest.fixture(scope="module")
def graphs():
    """Two flatbuffers of one graph (different names and metadata) and one of another."""
    from tfopt.core._keras import keras, tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.layers.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3)]
    )
    bare = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    contract = {"image_shape": [8, 8, 1], "input_scale": "unit", "mean": [0.0], "std": [1.0]}
    contract["class_names"] = ["a", "b", "c"]
    one = metadata.write(bare, contract, outputs="logits", name="one", version="1")
    two = metadata.write(bare, contract, outputs="logits", name="two (int8_auto)", version="2")
    model.layers[-1].set_weights([w + 1e-3 for w in model.layers[-1].get_weights()])
    other = tf.lite.TFLiteConverter.from_keras_model(model).convert()
    return one, two, other


def test_the_graph_key_ignores_names_and_metadata_but_sees_every_weight(graphs):
    one, two, other = graphs
    assert one != two and rounds.graph_key(one) == rounds.graph_key(two)
    assert rounds.graph_key(one) != rounds.graph_key(other)


def test_identical_graphs_are_timed_once_and_every_graph_in_every_round(graphs, monkeypatch):
    one, two, other = graphs
    order = []
    real = rounds.samples

    def spy(call, n):
        order.append((call, n))
        return real(call, n)

    monkeypatch.setattr(rounds, "samples", spy)
    settings = [("xnnpack/1t", "interpreter", True, 1)]
    figures, same = rounds.time_files(
        {"int8": one, "int8_auto": two, "float32": other}, settings, warmup=2, runs=23, rounds=4
    )
    assert same == {"int8_auto": "int8"}
    assert figures["int8_auto"] == figures["int8"]  # one timing: they cannot disagree
    # 4 rounds, each times the 2 distinct graphs in turn; 23 runs split 6, 6, 6, 5
    calls = [c for c, _ in order]
    assert len(calls) == 8 and calls[0::2] == [calls[0]] * 4 and calls[1::2] == [calls[1]] * 4
    assert calls[0] != calls[1] and [n for _, n in order] == [6, 6, 6, 6, 6, 6, 5, 5]
    for mode in ("int8", "float32"):
        f = figures[mode]["xnnpack/1t"]
        assert len(f["round_p50_ms"]) == 4 and f["runs"] == 23 and f["threads"] == 1
        assert min(f["round_p50_ms"]) <= f["p95_ms"] and f["min_ms"] <= f["p50_ms"]


def test_a_difference_is_measurable_only_beyond_every_round():
    assert rounds.measurable([1.0, 1.1], [1.2, 1.3])
    assert rounds.measurable([1.2, 1.3], [1.0, 1.1])
    assert not rounds.measurable([1.0, 1.25], [1.2, 1.3])  # overlapping rounds
    assert not rounds.measurable([], [1.0])


@pytest.mark.parametrize(
    "flags, machine, label, dot",
    [
        ({"avx2", "fma"}, "x86_64", "x86-64 AVX2, no VNNI", False),
        ({"avx2", "fma", "avx_vnni"}, "x86_64", "x86-64 AVX-VNNI", True),
        ({"avx512f", "avx512bw", "avx512_vnni"}, "x86_64", "x86-64 AVX-512 VNNI", True),
        ({"avx512f", "avx512bw"}, "x86_64", "x86-64 AVX-512, no VNNI", False),
        ({"asimd", "asimddp"}, "aarch64", "arm64 NEON dotprod", True),
        ({"asimd"}, "aarch64", "arm64 NEON, no dotprod", False),
    ],
)
def test_a_figure_names_the_instruction_set_it_was_measured_with(flags, machine, label, dot):
    assert cpu.host_label(flags, machine) == label
    assert cpu.has_int8_dot(flags, machine) is dot


def test_this_machines_words_name_its_cpu_and_threads():
    words = cpu.host_words(threads=2)
    assert words == f"{cpu.cpu_info()['model']}, {cpu.host_label()}, 2 threads"
    assert np.isscalar(cpu.has_int8_dot())
