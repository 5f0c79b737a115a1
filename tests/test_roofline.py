"""The roofline: one core's peaks from machine code, multiply-adds read from a .tflite, the bound
per kernel class, and where the time goes."""

import json
import os
import shutil
import subprocess

from tfopt.core._keras import keras, tf

import numpy as np
import pytest
from export_fixtures import keras_macs

from tfopt.core import _x86_kernels, cpu
from tfopt.export import ops, roofline

X86 = os.uname().machine == "x86_64"


@pytest.mark.skipif(shutil.which("as") is None, reason="GNU as is not installed")
@pytest.mark.parametrize("name", sorted(_x86_kernels.KERNELS))
def test_kernel_bytes_are_what_the_assembler_makes_of_their_listing(name, tmp_path):
    kernel = _x86_kernels.KERNELS[name]
    source = tmp_path / "k.s"
    source.write_text(".intel_syntax noprefix\n" + "\n".join(_x86_kernels.listing(kernel)) + "\n")
    subprocess.run(["as", str(source), "-o", str(tmp_path / "k.o")], check=True)
    subprocess.run(
        ["objcopy", "-O", "binary", "-j", ".text", str(tmp_path / "k.o"), str(tmp_path / "k.bin")],
        check=True,
    )
    assert (tmp_path / "k.bin").read_bytes() == kernel.code


@pytest.mark.parametrize(
    "flags, machine, expected",
    [
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"}, "x86_64", "avx512_vnni"),
        ({"avx2", "fma", "avx512f", "avx512bw"}, "x86_64", "avx512"),
        ({"avx2", "fma", "avx_vnni"}, "x86_64", "avx_vnni"),
        ({"avx2", "fma"}, "x86_64", "avx2"),
        ({"avx2", "fma", "avx512f", "avx512_vnni", "amx_int8"}, "x86_64", "amx"),
        ({"sse4_2"}, "x86_64", ""),
        ({"asimd", "asimddp"}, "aarch64", "neon_dotprod"),
        ({"asimd"}, "aarch64", "neon"),
    ],
)
def test_isa_is_the_widest_the_flags_list(flags, machine, expected):
    assert cpu.isa(flags, machine) == expected


@pytest.mark.skipif(not X86, reason="the microbenchmark's machine code is x86-64")
def test_peaks_are_measured_once_in_a_child_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = cpu.peaks()
    isa = cpu.isa(cpu.cpu_flags())
    assert first["source"] == "measured", first
    kinds = ("fp32", "int8")
    if isa == "amx":  # AMX's int8 tiles have no microbenchmark: unknown, never a guess
        assert first["int8"] is None and "amx_int8" in first["unknown"], first
        kinds = ("fp32",)
    else:
        assert "unknown" not in first, first
    for kind in kinds:
        p = first[kind]
        # The work per instruction is the ISA's; the rate is what the core issues per cycle.
        assert p["macs_per_instruction"] == cpu.ISA_MACS[isa][kind]
        expected = p["instructions_per_cycle"] * first["clock_ghz"] * p["macs_per_instruction"]
        assert p["gmacs"] == pytest.approx(expected, rel=0.02)
        # 12 independent instructions per loop: a kernel whose instructions waited on each other
        # (latency 4-5 cycles) would issue at most 0.25 per cycle. Measured here 1.8-2.1 per cycle,
        # beside the soak's CPU hog too (the fastest of 21 short runs); the margin is wide on purpose.
        assert 0.3 < p["instructions_per_cycle"] <= 8.0, first
    assert 0.3 < first["clock_ghz"] < 8.0
    cached = list((tmp_path / "tfopt").iterdir())
    assert len(cached) == 1 and json.loads(cached[0].read_text())["fp32"] == first["fp32"]
    again = cpu.peaks()
    assert again["source"] == "cache" and again["fp32"] == first["fp32"]
    # Another CPU model or flag set is another cache key: measured again.
    monkeypatch.setattr(cpu, "_cache_path", lambda: str(tmp_path / "other.json"))
    assert cpu.peaks()["source"] == "measured" and (tmp_path / "other.json").is_file()


def test_a_microbenchmark_that_cannot_run_gives_an_unknown_bound_never_a_guess(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def refuse(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "executable memory refused")

    monkeypatch.setattr(cpu.subprocess, "run", refuse)
    peaks = cpu.peaks()
    assert peaks["fp32"] is None and peaks["int8"] is None
    assert "exited 1: executable memory refused" in peaks["unknown"]
    assert not (tmp_path / "tfopt").exists()  # a failure is not cached
    costs = [ops.OpCost(0, "CONV_2D", ops.CONV, 1000, "fp32", "float32")]
    assert roofline.bound_ms(costs, peaks) is None
    result = roofline.analyze(costs, peaks, p50_ms=0.5, op_ms=[0.4])
    assert result["bound_ms"] is None and result["ratio"] is None
    assert "bound unknown" in result["summary"]
    assert "fp32 unknown, int8 unknown (the microbenchmark exited 1" in cpu.peak_summary(peaks)


@pytest.fixture(scope="module")
def small_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.DepthwiseConv2D(3, strides=2, padding="same", activation="relu")(x)
    x = keras.layers.Conv2D(16, 1, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(5, activation="softmax")(x)
    return keras.Model(inputs, outputs)


@pytest.fixture(scope="module")
def converted(small_model):
    converter = tf.lite.TFLiteConverter.from_keras_model(small_model)
    f32 = converter.convert()

    def data():
        rng = np.random.default_rng(0)
        for _ in range(8):
            yield [rng.random((1, 12, 12, 3), dtype=np.float32)]

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = data
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return {"float32": f32, "int8": converter.convert()}


@pytest.mark.parametrize("mode", ["float32", "int8"])
def test_multiply_adds_of_every_op_match_the_keras_layers(small_model, converted, mode):
    costs = ops.op_costs(converted[mode])
    expected = keras_macs(small_model)
    assert expected == {
        ops.CONV: 12 * 12 * 8 * 27 + 6 * 6 * 16 * 8 + 16 * 5,
        ops.DEPTHWISE: 6 * 6 * 8 * 9,
    }
    for kind, macs in expected.items():
        assert sum(c.macs for c in costs if c.kind == kind) == macs, (kind, costs)
    assert [c.op for c in costs if c.kind != ops.OTHER] == [
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "CONV_2D",
        "FULLY_CONNECTED",
    ]
    weighted = {c.arithmetic for c in costs if c.macs}
    assert weighted == ({"int8"} if mode == "int8" else {"fp32"})
    assert all(c.macs == 0 for c in costs if c.kind == ops.OTHER)


def test_every_op_is_timed_alone(converted):
    content = converted["float32"]
    times = ops.time_alone(content, runs=3, warmup=1)
    assert len(times) == len(ops.op_costs(content)) and all(t and t > 0 for t in times)


PEAKS = {
    "fp32": {"gmacs": 10.0, "instruction": "vfmadd231ps zmmN", "instructions_per_cycle": 2.0},
    "int8": {"gmacs": 40.0, "instruction": "vpdpbusd zmmN", "instructions_per_cycle": 2.0},
    "clock_ghz": 3.0,
}


def test_bound_and_classes_from_given_costs_and_times():
    costs = [
        ops.OpCost(0, "CONV_2D", ops.CONV, 4_000_000, "int8", "int8"),
        ops.OpCost(1, "DEPTHWISE_CONV_2D", ops.DEPTHWISE, 500_000, "int8", "int8"),
        ops.OpCost(2, "ADD", ops.OTHER, 0, "fp32", "int8"),
        ops.OpCost(3, "FULLY_CONNECTED", ops.CONV, 1_000_000, "fp32", "float32"),
    ]
    # int8 conv at 40 GMAC/s, depthwise at the fp32 rate (10), the float FC at 10: milliseconds
    bound = 4e6 / 40e9 * 1e3 + 0.5e6 / 10e9 * 1e3 + 1e6 / 10e9 * 1e3
    assert roofline.bound_ms(costs, PEAKS) == pytest.approx(bound)
    if (os.cpu_count() or 1) >= 2:
        assert roofline.bound_ms(costs, PEAKS, threads=2) == pytest.approx(bound / 2)
    result = roofline.analyze(costs, PEAKS, p50_ms=1.0, op_ms=[0.2, 0.3, 0.16, 0.2])  # sum 0.86
    classes = result["classes"]
    assert result["ratio"] == pytest.approx(1.0 / bound) and result["macs"] == 5_500_000
    assert classes[ops.CONV]["ms"] == pytest.approx(0.4 / 0.86)  # scaled to the model's p50
    assert classes[ops.DEPTHWISE]["share"] == pytest.approx(0.3 / 0.86)
    assert classes[ops.DEPTHWISE]["gmacs"] == pytest.approx(0.5e6 / (0.3 / 0.86) / 1e6)
    assert classes[ops.DEPTHWISE]["ratio"] == pytest.approx((0.3 / 0.86) / (0.5e6 / 10e9 * 1e3))
    assert classes[ops.CONV]["arithmetic"] == "fp32+int8"
    assert sum(c["ms"] for c in classes.values()) == pytest.approx(1.0)
    assert result["summary"].startswith("time: conv/FC 47% (2.3x its bound; 11 GMAC/s), ")
    assert (
        "depthwise 35% (7.0x its bound; 1 of 10 GMAC/s fp32" in result["summary"]
        and "runs at the fp32 rate" in result["summary"]
    )
    assert result["summary"].endswith("elementwise/other 19%")
    untimed = roofline.analyze(costs, PEAKS, p50_ms=1.0)
    assert untimed["summary"] == "" and "ms" not in untimed["classes"][ops.CONV]


def test_measure_times_ops_at_the_first_setting_and_bounds_every_one(converted):
    content = converted["int8"]
    latency = {
        "xnnpack/1t": {"p50_ms": 0.05, "threads": 1},
        "xnnpack/2t": {"p50_ms": 0.04, "threads": 2},
        "builtin/1t": {"p50_ms": 0.09, "threads": 1},
    }
    result = roofline.measure(content, latency, peaks=PEAKS, runs=3, warmup=1)
    assert list(result) == ["xnnpack/1t", "xnnpack/2t"]
    one, two = result["xnnpack/1t"], result["xnnpack/2t"]
    assert one["summary"].startswith("time: ") and two["summary"] == ""
    assert one["bound_ms"] == pytest.approx(
        roofline.bound_ms(ops.op_costs(content), PEAKS), rel=1e-9
    )
    assert two["bound_ms"] == pytest.approx(one["bound_ms"] / min(2, os.cpu_count() or 1))
    assert roofline.measure(content, {"builtin/1t": latency["builtin/1t"]}, peaks=PEAKS) == {}
